import CofferContent
import CofferCrypto
import CofferModel
import CofferProtocol
import CofferStore
import Foundation

/// One fuzz target per decoder family that reads bytes from the network or the disk. Each takes
/// any bytes; a decoder may refuse them (a thrown error or nil), but must not trap, and what it
/// accepts must survive the round trip named beside it. A broken property traps through
/// `violated`, which libFuzzer reports as a crash and the corpus replay as a failure.
enum FuzzTarget: String, CaseIterable, Sendable {
    /// `FileMetadata(decoding:)`: what decodes re-encodes to the same bytes.
    case metadata
    /// `SignedMetadata(decoding:)`: same bytes again; the signature check takes any key.
    case signedMetadata = "signed-metadata"
    /// `PosixAttributes(decoding:)`: a current-version record re-encodes to the same bytes; an
    /// older one to a record that decodes to the same value.
    case posixAttributes = "posix-attributes"
    /// `Manifest(decoding:)`: same bytes again.
    case manifest
    /// `ChunkBundle.decode`: same bytes again.
    case chunkBundle = "chunk-bundle"
    /// The JSON bodies (first byte picks the message), then what the server or client decodes
    /// from their fields; re-encoding what decoded reaches a fixed point.
    case messages
    /// The signing headers: hex (`unhex`), the timestamp (`Int64` and `isFresh`), signature checks.
    case requestHeaders = "request-headers"
    /// `PackLocator(decoding:)` (a chunk row's pointer into a pack file): same bytes again.
    case packLocator = "pack-locator"
    /// The recovery phrase and `coffer1:` base64 import: what imports exports back to itself.
    case accountSecret = "account-secret"
    /// `SealedAccountSecret.open` (`account.secret` under a passphrase): refused or opened, never a
    /// trap; what opens seals again to a record that opens to the same secret.
    case sealedSecret = "sealed-secret"

    func run(_ bytes: [UInt8]) {
        switch self {
        case .metadata: Self.metadata(bytes)
        case .signedMetadata: Self.signedMetadata(bytes)
        case .posixAttributes: Self.posixAttributes(bytes)
        case .manifest: Self.manifest(bytes)
        case .chunkBundle: Self.chunkBundle(bytes)
        case .messages: Self.messages(bytes)
        case .requestHeaders: Self.requestHeaders(bytes)
        case .packLocator: Self.packLocator(bytes)
        case .accountSecret: Self.accountSecret(bytes)
        case .sealedSecret: Self.sealedSecret(bytes)
        }
    }

    // MARK: - Binary records

    static func metadata(_ bytes: [UInt8]) {
        guard let m = try? FileMetadata(decoding: bytes) else { return }
        check(m.encoded() == bytes, "FileMetadata re-encodes to other bytes")
        check(m.isRoot == (m.parent == m.id), "FileMetadata.isRoot")
    }

    static func signedMetadata(_ bytes: [UInt8]) {
        guard let s = try? SignedMetadata(decoding: bytes) else { return }
        check(s.encoded() == bytes, "SignedMetadata re-encodes to other bytes")
        // What a device does next with a pulled record: check the signature by the writer's key.
        if let key = try? PublicSigningKey(bytes: s.metadata.lastModifiedBy.bytes) {
            _ = key.verify(signature: s.signature, message: s.message)
        }
    }

    static func posixAttributes(_ bytes: [UInt8]) {
        guard let a = try? PosixAttributes(decoding: bytes) else { return }
        check(a.encoded() == bytes, "PosixAttributes re-encodes to other bytes")
        _ = a.liveXattrs
        check(PosixAttributes.merge(a, a) == a, "PosixAttributes.merge is not idempotent")
    }

    static func manifest(_ bytes: [UInt8]) {
        guard let m = try? Manifest(decoding: bytes) else { return }
        check(m.encoded() == bytes, "Manifest re-encodes to other bytes")
        _ = m.size
    }

    /// The binary bundles: `ChunkBundle` (chunks from a server), `ContentBundle` (content to a
    /// server) and `ManifestBundle` (manifests from a server), each decoding to what encodes to
    /// the same bytes again.
    static func chunkBundle(_ bytes: [UInt8]) {
        if let chunks = ChunkBundle.decode(bytes) {
            check(chunks.allSatisfy { $0.id.count == 32 }, "ChunkBundle gave a chunk id that is not 32 bytes")
            check(ChunkBundle.encode(chunks) == bytes, "ChunkBundle re-encodes to other bytes")
        }
        if let bundle = ContentBundle(decoding: bytes) {
            check(bundle.chunks.allSatisfy { $0.id.count == 32 }, "ContentBundle gave a chunk id that is not 32 bytes")
            check(
                bundle.manifests.allSatisfy { $0.fileID.count == 16 && $0.digest.count == 32 },
                "ContentBundle gave a malformed manifest")
            // Chunks are encoded before manifests, so only a bundle in that order comes back whole.
            let ordered = bytes.count >= 8 && bundle.encoded() == bytes
            check(ordered || ContentBundle(decoding: bundle.encoded()) == bundle, "ContentBundle does not round-trip")
            check(bundle.encoded().count == bundle.encodedSize, "ContentBundle's size estimate is off")
        }
        if let entries = ManifestBundle.decode(bytes) {
            check(ManifestBundle.encode(entries) == bytes, "ManifestBundle re-encodes to other bytes")
        }
    }

    static func packLocator(_ bytes: [UInt8]) {
        guard let l = try? PackLocator(decoding: bytes) else { return }
        check(l.encoded == bytes, "PackLocator re-encodes to other bytes")
        check(l.pack.count == PackLocator.packIDBytes, "PackLocator pack id length")
        check(l.offset.addingReportingOverflow(l.length).overflow == false, "PackLocator end overflows")
    }

    // MARK: - JSON messages

    /// Every body either side decodes. The server decodes requests, the client responses.
    static let messageTypes: [(name: String, run: @Sendable (Data) -> Void)] = [
        ("CreateAccountRequest", { json($0, as: CreateAccountRequest.self) { _ in } }),
        ("AccountResponse", { json($0, as: AccountResponse.self) { _ in } }),
        (
            "UpsertRequest",
            {
                json($0, as: UpsertRequest.self) { r in
                    for u in r.updates {
                        record(u.record)
                        if let p = u.expectedParent { _ = try? FileID(bytes: [UInt8](p)) }
                    }
                }
            }
        ),
        ("UpsertResponse", { json($0, as: UpsertResponse.self) { _ in } }),
        (
            "UpdatesRequest",
            { json($0, as: UpdatesRequest.self) { r in if let a = r.afterID { _ = try? FileID(bytes: [UInt8](a)) } } }
        ),
        (
            "UpdatesResponse",
            {
                json($0, as: UpdatesResponse.self) { r in for f in r.files { record(f.record) } }
            }
        ),
        ("ChunkIDsRequest", { json($0, as: ChunkIDsRequest.self) { _ in } }),
        ("MissingChunksResponse", { json($0, as: MissingChunksResponse.self) { _ in } }),
        (
            "PutManifestRequest",
            {
                json($0, as: PutManifestRequest.self) { r in
                    _ = try? FileID(bytes: [UInt8](r.fileID))
                    _ = ContentCipher.digest(ofSealedManifest: [UInt8](r.sealed)) == [UInt8](r.digest)
                }
            }
        ),
        (
            "GetManifestRequest",
            { json($0, as: GetManifestRequest.self) { r in _ = try? FileID(bytes: [UInt8](r.fileID)) } }
        ),
        ("UsageResponse", { json($0, as: UsageResponse.self) { _ in } }),
        ("ErrorResponse", { json($0, as: ErrorResponse.self) { _ in } }),
        // New messages go last, so the first byte of the corpus inputs keeps its meaning.
        ("ServerInfoResponse", { json($0, as: ServerInfoResponse.self) { _ in } }),
        ("WatchRequest", { json($0, as: WatchRequest.self) { _ in } }),
        ("WatchResponse", { json($0, as: WatchResponse.self) { _ in } }),
        ("ManyManifestsRequest", { json($0, as: ManyManifestsRequest.self) { _ in } }),
    ]

    static func messages(_ bytes: [UInt8]) {
        guard let selector = bytes.first else { return }
        messageTypes[Int(selector) % messageTypes.count].run(Data(bytes.dropFirst()))
    }

    /// Decodes `T`, runs `then` on it, and checks that encoding and decoding again is stable.
    static func json<T: Codable>(_ data: Data, as: T.Type, then: (T) -> Void) {
        guard let value = try? JSONDecoder().decode(T.self, from: data) else { return }
        then(value)
        let encoder = JSONEncoder()
        encoder.outputFormatting = .sortedKeys
        guard let once = try? encoder.encode(value) else { violated("\(T.self) decoded but does not encode") }
        guard let back = try? JSONDecoder().decode(T.self, from: once) else {
            violated("\(T.self) re-encoded does not decode")
        }
        check((try? encoder.encode(back)) == once, "\(T.self) does not re-encode to the same JSON")
    }

    /// A record field as a device or the server reads it.
    static func record(_ data: Data) {
        signedMetadata([UInt8](data))
    }

    // MARK: - Request headers

    /// The server id the `request-headers` seeds are signed for.
    static let serverID = [UInt8](repeating: 0x5a, count: RequestSigning.serverIDBytes)

    /// The input is newline-separated: account, timestamp, nonce, signature, method, path, then
    /// the body (the rest, newlines and all).
    static func requestHeaders(_ bytes: [UInt8]) {
        let parts = bytes.split(separator: 0x0a, maxSplits: 6, omittingEmptySubsequences: false)
        func field(_ i: Int) -> String { i < parts.count ? String(decoding: parts[i], as: UTF8.self) : "" }
        let body = parts.count > 6 ? [UInt8](parts[6]) : []

        for text in [field(0), field(2), field(3)] {
            guard let raw = RequestSigning.unhex(text) else { continue }
            check(raw.count * 2 == text.utf8.count, "unhex length")
            check(RequestSigning.hex(raw) == text.lowercased(), "hex(unhex(s)) is not s in lowercase")
        }

        let timestampText = field(1)
        if let ts = Int64(timestampText) {
            let server: Int64 = 1_764_000_000_000
            for now in [
                server, ts, ts &+ API.maxClockSkewMillis, ts &- API.maxClockSkewMillis &- 1, Int64.max, Int64.min, 0,
                ts &+ Int64.min,
            ] {
                let expected =
                    ts > 0 && now > 0 && (Int128(now) - Int128(ts)).magnitude <= UInt128(API.maxClockSkewMillis)
                check(RequestSigning.isFresh(timestamp: ts, now: now) == expected, "isFresh(\(ts), now: \(now))")
            }
            let message = RequestSigning.canonical(
                server: serverID, method: field(4), path: field(5), body: body, timestamp: ts,
                nonce: field(2))
            if let key = RequestSigning.unhex(field(0)).flatMap({ try? PublicSigningKey(bytes: $0) }),
                let signature = RequestSigning.unhex(field(3))
            {
                _ = key.verify(signature: signature, message: message)
                _ = RequestSigning.verify(
                    account: key, server: serverID, method: field(4), path: field(5), body: body,
                    timestamp: ts, nonce: field(2), signature: signature)
            }
        }

        // Path parameters (chunk ids) go through the same hex decoder.
        if let id = FileID(uuidString: field(5)) {
            check(FileID(uuidString: id.description) == id, "FileID uuid string round trip")
        }
    }

    // MARK: - Account secret

    static func accountSecret(_ bytes: [UInt8]) {
        let text = String(decoding: bytes, as: UTF8.self)
        if let raw = Base64.decode(text) {
            check(Base64.decode(Base64.encode(raw)) == raw, "Base64 round trip")
        }
        guard let secret = try? AccountSecret(exported: text) else { return }
        check(secret.seed.count == AccountSecret.byteCount, "secret length")
        check((try? AccountSecret(phrase: secret.phrase.joined(separator: " "))) == secret, "phrase round trip")
        check((try? AccountSecret(base64: secret.base64)) == secret, "base64 round trip")
    }
}

extension FuzzTarget {
    /// The passphrase the `sealed-secret` seeds are sealed under.
    static let passphrase = Array("correct horse".utf8)

    static func sealedSecret(_ bytes: [UInt8]) {
        // Argon2id at a file's own cost may take a second and 1 GiB for one input: the header
        // checks run at any cost, the derivation only at the cheapest ones.
        let costAt = SealedAccountSecret.magic.count + 1
        if bytes.count >= SealedAccountSecret.headerBytes {
            let ops = bytes[costAt..<(costAt + 8)].reduce(UInt64(0)) { $0 << 8 | UInt64($1) }
            let mem = bytes[(costAt + 8)..<(costAt + 16)].reduce(UInt64(0)) { $0 << 8 | UInt64($1) }
            let allowed = ops <= SealedAccountSecret.maxOpsLimit && mem <= SealedAccountSecret.maxMemLimit
            if allowed && (ops > 1 || mem > 64 * 1024) { return }
        }
        guard let pw = try? Passphrase(passphrase), let secret = try? SealedAccountSecret.open(bytes, passphrase: pw)
        else { return }
        let cheapest = SealedAccountSecret.Cost(opsLimit: 1, memLimit: 8192)
        guard let again = try? SealedAccountSecret.seal(secret, passphrase: pw, cost: cheapest) else {
            violated("an opened secret does not seal")
        }
        check((try? SealedAccountSecret.open(again, passphrase: pw)) == secret, "sealed secret round trip")
    }
}

/// The input being run, named in a failure so the replay says which file broke.
nonisolated(unsafe) var currentInput = "(libFuzzer input)"

func check(_ condition: @autoclosure () -> Bool, _ what: @autoclosure () -> String) {
    if !condition() { violated(what()) }
}

func violated(_ what: String) -> Never {
    FileHandle.standardError.write(Data("coffer-fuzz: property broken on \(currentInput): \(what)\n".utf8))
    fatalError(what)
}
