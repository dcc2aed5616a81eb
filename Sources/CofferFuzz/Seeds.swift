#if !COFFER_FUZZING
    import CofferContent
    import CofferCrypto
    import CofferModel
    import CofferProtocol
    import CofferStore
    import Foundation

    /// The seed corpus (`Fuzz/corpus/<target>/seed-*`): valid encodings of each format, made from
    /// fixed keys and values so a rerun writes the same bytes, plus a few edge cases. Inputs the
    /// fuzzer found worth keeping sit beside them under other names.
    enum Seeds {
        static func write(into root: String) -> Int {
            var written = 0
            for (target, seeds) in all() {
                let dir = URL(fileURLWithPath: root).appendingPathComponent(target.rawValue)
                try? FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
                for (name, bytes) in seeds {
                    let file = dir.appendingPathComponent("seed-" + name)
                    guard FileManager.default.createFile(atPath: file.path, contents: Data(bytes)) else {
                        FileHandle.standardError.write(Data("coffer-fuzz: cannot write \(file.path)\n".utf8))
                        exit(1)
                    }
                    written += 1
                }
            }
            return written
        }

        static func all() -> [(FuzzTarget, [(String, [UInt8])])] {
            let secret = try! AccountSecret(seed: [UInt8](repeating: 7, count: 32))
            let keys = secret.signingKeys
            let owner = try! AccountID(bytes: keys.publicKey.bytes)
            let rootID = try! FileID(bytes: (0..<16).map { UInt8($0) })
            let docID = try! FileID(bytes: (0..<16).map { UInt8(0x40 + $0) })
            let stamp = HybridTimestamp(wallMillis: 1_764_000_000_000, counter: 3, device: 9)

            var attributes = PosixAttributes(
                mode: 0o644, uid: 1000, gid: 1000, mtime: Timespec(seconds: 1_764_000_000, nanoseconds: 5),
                stamp: stamp, size: 12)
            attributes.xattrs["user.color"] = Stamped([0x72, 0x65, 0x64], at: stamp)
            attributes.xattrs["user.gone"] = Stamped(nil, at: stamp)
            let link = PosixAttributes(
                mode: 0o777, uid: 0, gid: 0, mtime: .zero, stamp: .zero, symlinkTarget: "../target")

            let root = FileMetadata(
                id: rootID, type: .folder, parent: rootID, name: SealedName(ciphertext: [1, 2, 3], mac: [4, 5]),
                owner: owner, wrappedKey: [],
                access: [AccessEntry(account: owner, mode: .owner, sealedKey: [UInt8](repeating: 9, count: 80))],
                sealedAttributes: [UInt8](repeating: 0xaa, count: 40), lastModifiedBy: owner)
            let doc = FileMetadata(
                id: docID, type: .document, parent: rootID,
                name: SealedName(
                    ciphertext: [UInt8](repeating: 0x33, count: 40),
                    mac: [UInt8](repeating: 0x44, count: 32)),
                owner: owner, isDeleted: true, wrappedKey: [UInt8](repeating: 0x55, count: 72),
                sealedAttributes: [UInt8](repeating: 0x66, count: 60),
                contentDigest: [UInt8](repeating: 0x77, count: 32),
                lastModifiedBy: owner)
            // A shared folder (format version 3): a signed grant and the name for its grantees.
            var shared = doc
            shared.type = .folder
            shared.isDeleted = false
            shared.contentDigest = nil
            var grant = AccessEntry(account: owner, mode: .write, sealedKey: [UInt8](repeating: 0x88, count: 80))
            grant.signature = keys.sign(grant.grantMessage(fileID: docID))
            shared.access = [grant]
            shared.shareName = [UInt8](repeating: 0x99, count: 72)
            // A link (format version 2).
            var placed = doc
            placed.type = .link
            placed.isDeleted = false
            placed.contentDigest = nil
            placed.linkTarget = rootID
            func signed(_ m: FileMetadata, revision: UInt64 = 1_764_000_000_000) -> [UInt8] {
                let message = SignedMetadata.message(metadata: m, revision: revision)
                return SignedMetadata(metadata: m, revision: revision, signature: keys.sign(message)).encoded()
            }

            let manifest = Manifest(
                chunkSize: 4,
                chunks: [
                    ChunkRef(id: [UInt8](repeating: 1, count: 32), length: 4),
                    ChunkRef(id: [UInt8](repeating: 2, count: 32), length: 1),
                ])
            let pack = PackLocator(pack: (0..<16).map { UInt8($0) }, offset: 4096, length: 65536)

            // A signed header set, and the timestamp that made `abs(now - ts)` trap (issue 19, item 1).
            let now: Int64 = 1_764_000_000_000
            let body = Array("{\"since\":0}".utf8)
            let headers = RequestSigning.headers(
                keys: keys, server: FuzzTarget.serverID, method: "POST", path: "/v1/updates", body: body,
                timestamp: now, nonce: [UInt8](repeating: 0xab, count: 16))
            func headerInput(timestamp: String) -> [UInt8] {
                let h = Dictionary(uniqueKeysWithValues: headers)
                let fields = [
                    h[RequestSigning.accountHeader] ?? "", timestamp, h[RequestSigning.nonceHeader] ?? "",
                    h[RequestSigning.signatureHeader] ?? "", "POST", "/v1/updates",
                ]
                return Array(fields.joined(separator: "\n").utf8) + [0x0a] + body
            }

            let d = Data([1, 2, 3])
            let record = Data(signed(doc))
            let encoder = JSONEncoder()
            encoder.outputFormatting = .sortedKeys
            let messages: [(String, any Encodable)] = [
                (
                    "CreateAccountRequest",
                    CreateAccountRequest(username: "val", signingKey: Data(keys.publicKey.bytes), boxKey: d)
                ),
                ("AccountResponse", AccountResponse(username: "val", signingKey: d, boxKey: d)),
                (
                    "UpsertRequest",
                    UpsertRequest(updates: [
                        FileUpdate(
                            record: record, expectedParent: Data(rootID.bytes), expectedNameMAC: d,
                            expectedRevision: 5),
                        FileUpdate(record: Data(signed(root)), expectedParent: nil, expectedNameMAC: nil),
                    ])
                ),
                ("UpsertResponse", UpsertResponse(version: 42)),
                ("UpdatesRequest", UpdatesRequest(since: 7, afterID: Data(docID.bytes))),
                (
                    "UpdatesResponse",
                    UpdatesResponse(
                        files: [ServerFile(record: record, version: 3, contentVersion: 2, serverDeleted: false)],
                        latest: 3, more: true)
                ),
                (
                    "ChunkIDsRequest",
                    ChunkIDsRequest(ids: [Data(repeating: 1, count: 32), Data(repeating: 2, count: 32)])
                ),
                ("MissingChunksResponse", MissingChunksResponse(missing: [Data(repeating: 1, count: 32)])),
                (
                    "PutManifestRequest",
                    PutManifestRequest(
                        fileID: Data(docID.bytes), digest: Data(repeating: 5, count: 32), sealed: d,
                        chunkIDs: [Data(repeating: 1, count: 32)])
                ),
                (
                    "GetManifestRequest",
                    GetManifestRequest(fileID: Data(docID.bytes), digest: Data(repeating: 5, count: 32))
                ),
                ("UsageResponse", UsageResponse(files: 10, bytes: 1 << 20, quotaBytes: 1 << 30)),
                ("ErrorResponse", ErrorResponse(code: ErrorResponse.badRequest, message: "no")),
                ("ServerInfoResponse", ServerInfoResponse(id: Data(FuzzTarget.serverID))),
            ]
            var messageSeeds: [(String, [UInt8])] = []
            for (name, message) in messages {
                guard let selector = FuzzTarget.messageTypes.firstIndex(where: { $0.name == name }),
                    let json = try? encoder.encode(message)
                else { fatalError("seed for \(name)") }
                messageSeeds.append((name, [UInt8(selector)] + [UInt8](json)))
            }
            messageSeeds.append(("UpdatesRequest-huge-number", [4] + Array("{\"since\":1e400}".utf8)))

            return [
                (
                    .metadata,
                    [
                        ("root", root.encoded()), ("document", doc.encoded()), ("empty", []),
                        ("shared", shared.encoded()), ("link", placed.encoded()),
                        ("truncated", Array(doc.encoded().dropLast())),
                    ]
                ),
                (
                    .signedMetadata,
                    [
                        ("root", signed(root)), ("document", signed(doc)), ("shared", signed(shared)),
                        ("unsigned", SignedMetadata(metadata: doc, signature: []).encoded()),
                    ]
                ),
                (
                    .posixAttributes,
                    [("file", attributes.encoded()), ("symlink", link.encoded())]
                ),
                (
                    .manifest,
                    [
                        ("two-chunks", manifest.encoded()), ("empty", Manifest().encoded()),
                        // Claims 2^24 chunks in 13 bytes.
                        ("many-chunks-claimed", Array("CFMF".utf8) + [1, 0, 4, 0, 0, 1, 0, 0, 0]),
                    ]
                ),
                (
                    .chunkBundle,
                    [
                        (
                            "two",
                            ChunkBundle.encode([
                                (id: [UInt8](repeating: 1, count: 32), sealed: [1, 2, 3]),
                                (id: [UInt8](repeating: 2, count: 32), sealed: []),
                            ])
                        ),
                        ("none", ChunkBundle.encode([])),
                        (
                            "content-bundle",
                            ContentBundle(
                                chunks: [ContentBundle.Chunk(id: [UInt8](repeating: 3, count: 32), sealed: [9, 9])],
                                manifests: [
                                    ContentBundle.Manifest(
                                        fileID: [UInt8](repeating: 4, count: 16),
                                        digest: [UInt8](repeating: 5, count: 32),
                                        sealed: [1, 2, 3], chunkIDs: [[UInt8](repeating: 3, count: 32)])
                                ]
                            ).encoded()
                        ),
                        (
                            "manifest-bundle",
                            ManifestBundle.encode([
                                ManifestBundle.Entry(
                                    fileID: [UInt8](repeating: 6, count: 16), digest: [UInt8](repeating: 7, count: 32),
                                    sealed: [4, 5]),
                                ManifestBundle.Entry(fileID: [UInt8](repeating: 8, count: 16), digest: [], sealed: nil),
                            ])
                        ),
                    ]
                ),
                (.messages, messageSeeds),
                (
                    .requestHeaders,
                    [
                        ("signed", headerInput(timestamp: String(now))),
                        ("timestamp-min-plus-now", headerInput(timestamp: String(Int64.min + now))),
                        ("timestamp-max", headerInput(timestamp: String(Int64.max))),
                    ]
                ),
                (
                    .packLocator,
                    [
                        ("pack", pack.encoded),
                        (
                            "largest",
                            PackLocator(
                                pack: pack.pack, offset: UInt64(Int64.max) - UInt64(Int32.max),
                                length: UInt64(Int32.max)
                            ).encoded
                        ),
                    ]
                ),
                (
                    .accountSecret,
                    [
                        ("phrase", Array(secret.phrase.joined(separator: " ").utf8)),
                        ("base64", Array(("  " + secret.base64 + "\n").utf8)),
                        (
                            "phrase-bad-checksum",
                            Array((["zoo"] + secret.phrase.dropFirst()).joined(separator: ",").utf8)
                        ),
                    ]
                ),
                // Sealing draws a random salt and nonce, so this seed differs on every run.
                (
                    .sealedSecret,
                    [
                        ("cheapest", sealedCheapest(secret)),
                        (
                            "costly",
                            Array(sealedCheapest(secret).prefix(5)) + [
                                0, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0, 0, 0x40, 0, 0, 0,
                            ]
                                + Array(sealedCheapest(secret).dropFirst(21))
                        ),
                    ]
                ),
            ]
        }

        static func sealedCheapest(_ secret: AccountSecret) -> [UInt8] {
            guard let pw = try? Passphrase(FuzzTarget.passphrase),
                let sealed = try? SealedAccountSecret.seal(
                    secret, passphrase: pw, cost: .init(opsLimit: 1, memLimit: 8192))
            else { fatalError("sealing the seed secret") }
            return sealed
        }
    }
#endif
