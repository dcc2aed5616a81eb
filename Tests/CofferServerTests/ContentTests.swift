import CofferCrypto
import CofferModel
import CofferProtocol
import CofferServerCore
import Foundation
import Testing

@Suite struct ContentTests {
    @Test func chunksAndManifests() throws {
        let (server, _) = try makeServer()
        let a = try Device(server, TestUser())
        let c1 = randomBytes(1000)
        let c2 = randomBytes(2000)
        let id1 = Data(blake2b(c1))
        let id2 = Data(blake2b(c2))
        #expect(try server.missingChunks(caller: a.user.key, ids: [id1, id2, id1]).missing == [id1, id2])
        try server.putChunk(caller: a.user.key, id: id1, bytes: c1)
        try server.putChunk(caller: a.user.key, id: id1, bytes: c1)  // idempotent
        #expect(try server.missingChunks(caller: a.user.key, ids: [id1, id2]).missing == [id2])
        // Counted by QuotaRule: a chunk at least minimumChunkBytes, a manifest at least minimumRowBytes.
        #expect(try server.usage(caller: a.user.key).bytes == 4096)
        let file = newFileID()
        let sealed = randomBytes(80)
        let digest = Data(blake2b(sealed))
        let put = PutManifestRequest(
            fileID: Data(file.bytes), digest: digest, sealed: Data(sealed), chunkIDs: [id1, id2])
        // Every listed chunk must be there first.
        expectRefusal(409, ErrorResponse.conflict) { try server.putManifest(caller: a.user.key, put) }
        try server.putChunk(caller: a.user.key, id: id2, bytes: c2)
        try server.putManifest(caller: a.user.key, put)
        try server.putManifest(caller: a.user.key, put)  // idempotent
        #expect(
            try server.getManifest(caller: a.user.key, GetManifestRequest(fileID: Data(file.bytes), digest: digest))
                == Data(sealed))
        #expect(try server.usage(caller: a.user.key).bytes == 4096 + 4096 + 256)
        let bundle = try #require(ChunkBundle.decode(try server.getChunks(caller: a.user.key, ids: [id2, id1])))
        #expect(bundle.map(\.id) == [Array(id2), Array(id1)])
        #expect(bundle.map(\.sealed) == [c2, c1])
        expectRefusal(404, ErrorResponse.notFound) {
            _ = try server.getChunks(caller: a.user.key, ids: [id1, Data(randomBytes(32))])
        }
        expectRefusal(404, ErrorResponse.notFound) {
            _ = try server.getManifest(
                caller: a.user.key, GetManifestRequest(fileID: Data(file.bytes), digest: Data(randomBytes(32))))
        }
        // Malformed input.
        expectRefusal(400, ErrorResponse.badRequest) {
            try server.putChunk(caller: a.user.key, id: Data([1, 2]), bytes: [1])
        }
        expectRefusal(400, ErrorResponse.badRequest) { _ = try server.missingChunks(caller: a.user.key, ids: [Data()]) }
        var wrongDigest = put
        wrongDigest.digest = Data(randomBytes(32))
        expectRefusal(400, ErrorResponse.badRequest) { try server.putManifest(caller: a.user.key, wrongDigest) }
        var badFile = put
        badFile.fileID = Data([1])
        expectRefusal(400, ErrorResponse.badRequest) { try server.putManifest(caller: a.user.key, badFile) }
    }

    @Test func supersededContentIsRemoved() throws {
        let (server, _) = try makeServer()
        let a = try Device(server, TestUser())
        let root = rootRecord(a.user)
        let shared = randomBytes(500)
        var doc = record(a.user, .document, in: root.id, named: "d")
        doc.contentDigest = try a.putContent(doc.id, chunks: [shared, randomBytes(300)])
        let firstDigest = doc.contentDigest ?? []
        try a.push([root, doc])
        // New content reuses one chunk; the other old chunk and the old manifest go.
        doc.contentDigest = try a.putContent(doc.id, chunks: [shared, randomBytes(200)])
        try a.push([doc])
        expectRefusal(404) {
            _ = try server.getManifest(
                caller: a.user.key, GetManifestRequest(fileID: Data(doc.id.bytes), digest: Data(firstDigest)))
        }
        #expect(try server.missingChunks(caller: a.user.key, ids: [Data(blake2b(shared))]).missing.isEmpty)
        #expect(try server.usage(caller: a.user.key).bytes == 4096 + 4096 + 256 + countedRows(a.user, [root, doc]))
        #expect(try server.audit(account: a.user.key).isEmpty)
    }

    @Test func quota() throws {
        let (server, _) = try makeServer(quota: 15_000)
        let a = try Device(server, TestUser())
        try server.putChunk(caller: a.user.key, id: Data(randomBytes(32)), bytes: randomBytes(10_000))
        expectRefusal(413, ErrorResponse.quotaExceeded) {
            try server.putChunk(caller: a.user.key, id: Data(randomBytes(32)), bytes: randomBytes(6000))
        }
        try server.putChunk(caller: a.user.key, id: Data(randomBytes(32)), bytes: randomBytes(4800))
        let usage = try server.usage(caller: a.user.key)
        #expect(usage.files == 0 && usage.bytes == 14_800 && usage.quotaBytes == 15_000)
        // Manifests count too.
        let sealed = randomBytes(200)
        expectRefusal(413, ErrorResponse.quotaExceeded) {
            try server.putManifest(
                caller: a.user.key,
                PutManifestRequest(
                    fileID: Data(newFileID().bytes), digest: Data(blake2b(sealed)), sealed: Data(sealed), chunkIDs: []))
        }
        // Another account has its own quota.
        let b = try Device(server, TestUser())
        try server.putChunk(caller: b.user.key, id: Data(randomBytes(32)), bytes: randomBytes(10_000))
    }

    @Test func cleanupRemovesUnreferencedContent() throws {
        let (server, dir) = try makeServer()
        let a = try Device(server, TestUser())
        let root = rootRecord(a.user)
        var doc = record(a.user, .document, in: root.id, named: "d")
        doc.contentDigest = try a.putContent(doc.id, chunks: [randomBytes(100)])
        try a.push([root, doc])
        // An interrupted upload: chunks and a manifest never named by a record, and a stray chunk
        // file the metadata never recorded.
        _ = try a.putContent(newFileID(), chunks: [randomBytes(70), randomBytes(80)])
        try server.putChunk(caller: a.user.key, id: Data(randomBytes(32)), bytes: randomBytes(90))
        let strayDir = dir.appendingPathComponent("chunks/\(RequestSigning.hex(Array(a.user.key)))/00")
        try FileManager.default.createDirectory(at: strayDir, withIntermediateDirectories: true)
        try Data([1, 2, 3]).write(to: strayDir.appendingPathComponent("00" + String(repeating: "ab", count: 31)))
        let records = countedRows(a.user, [root, doc])
        #expect(try server.usage(caller: a.user.key).bytes == records + 4 * 4096 + 2 * 256)
        // With a grace period, young leftovers stay.
        #expect(try server.cleanup(graceMillis: 3_600_000) == .init())
        let report = try server.cleanup(graceMillis: 0)
        #expect(report.manifests == 1 && report.chunks == 3 && report.strayFiles == 1)
        #expect(try server.usage(caller: a.user.key).bytes == records + 4096 + 256)
        #expect(try server.cleanup(graceMillis: 0) == .init())
        let bundle = try server.getChunks(caller: a.user.key, ids: [])
        #expect(ChunkBundle.decode(bundle)?.isEmpty == true)
        #expect(try server.audit(account: a.user.key).isEmpty)
        #expect(
            try server.getManifest(
                caller: a.user.key,
                GetManifestRequest(fileID: Data(doc.id.bytes), digest: Data(doc.contentDigest ?? []))
            ).count == 64)
    }
}

@Suite struct SecurityCoreTests {
    @Test func tamperedRecordsRefusedAndNothingStored() throws {
        let (server, _) = try makeServer()
        let a = try Device(server, TestUser())
        let root = rootRecord(a.user)
        try a.push([root])
        let before = try a.all()
        let doc = record(a.user, .document, in: root.id, named: "d")
        let good = Array(a.user.sign(doc))
        // Flip a byte of the signature (the last 64 bytes) and of the metadata.
        for index in [good.count - 1, good.count - 40, 10, 30, 60, good.count - 100] {
            var bad = good
            bad[index] ^= 0x01
            do {
                _ = try server.upsert(
                    caller: a.user.key,
                    UpsertRequest(updates: [FileUpdate(record: Data(bad), expectedParent: nil, expectedNameMAC: nil)]))
                Issue.record("tampered record at byte \(index) accepted")
            } catch {
                #expect([400, 403].contains(error.status), "\(error)")
            }
        }
        // Garbage and truncation.
        expectRefusal(400) {
            _ = try server.upsert(
                caller: a.user.key,
                UpsertRequest(updates: [FileUpdate(record: Data([1, 2, 3]), expectedParent: nil, expectedNameMAC: nil)])
            )
        }
        expectRefusal(400) {
            _ = try server.upsert(
                caller: a.user.key,
                UpsertRequest(updates: [
                    FileUpdate(record: Data(good.dropLast()), expectedParent: nil, expectedNameMAC: nil)
                ]))
        }
        // One bad record sinks the whole batch.
        var bad = good
        bad[bad.count - 1] ^= 0x80
        let fine = record(a.user, .folder, in: root.id, named: "fine")
        expectRefusal(403) {
            _ = try server.upsert(
                caller: a.user.key,
                UpsertRequest(updates: [
                    a.update(for: fine), FileUpdate(record: Data(bad), expectedParent: nil, expectedNameMAC: nil),
                ]))
        }
        // Signed by someone else, or claiming another owner.
        let mallory = try Device(server, TestUser())
        expectRefusal(403, ErrorResponse.forbidden) {
            _ = try server.upsert(caller: mallory.user.key, UpsertRequest(updates: [a.update(for: doc)]))
        }
        var forged = doc
        forged.lastModifiedBy = mallory.user.id
        expectRefusal(403, ErrorResponse.forbidden) {
            _ = try server.upsert(
                caller: mallory.user.key,
                UpsertRequest(updates: [
                    FileUpdate(record: mallory.user.sign(forged), expectedParent: nil, expectedNameMAC: nil)
                ]))
        }
        #expect(try a.all() == before)
        #expect(try mallory.all().isEmpty)
    }

    @Test func anotherAccountsFilesAreOutOfReach() throws {
        let (server, _) = try makeServer()
        let b = try Device(server, TestUser("bob"))
        let bRoot = rootRecord(b.user)
        var bDoc = record(b.user, .document, in: bRoot.id, named: "secret")
        let chunk = randomBytes(100)
        bDoc.contentDigest = try b.putContent(bDoc.id, chunks: [chunk])
        try b.push([bRoot, bDoc])
        let bBefore = try b.all()

        let a = try Device(server, TestUser("alice"))
        let aRoot = rootRecord(a.user)
        try a.push([aRoot])
        // A's updates never include B's files.
        #expect(try a.all().count == 1)
        // Writing B's file ids: as new files of A's, or moved under A's root.
        var steal = bDoc
        steal.owner = a.user.id
        steal.lastModifiedBy = a.user.id
        steal.parent = aRoot.id
        steal.contentDigest = nil
        expectRefusal(403, ErrorResponse.forbidden) { try a.push([steal]) }
        // With a precondition, the answer is the one for an id the server does not know.
        expectRefusal(409, ErrorResponse.getUpdatesRequired) {
            _ = try server.upsert(
                caller: a.user.key,
                UpsertRequest(updates: [
                    FileUpdate(
                        record: a.user.sign(steal), expectedParent: Data(bRoot.id.bytes),
                        expectedNameMAC: Data(bDoc.name.mac))
                ]))
        }
        // A file of A's under B's folder is an orphan in A's tree.
        expectRefusal(409, ErrorResponse.invalidTree) {
            try a.push([record(a.user, .document, in: bRoot.id, named: "x")])
        }
        // B's content: manifests and chunks are in B's namespace only.
        let digest = Data(bDoc.contentDigest ?? [])
        expectRefusal(404) {
            _ = try server.getManifest(
                caller: a.user.key, GetManifestRequest(fileID: Data(bDoc.id.bytes), digest: digest))
        }
        expectRefusal(404) { _ = try server.getChunks(caller: a.user.key, ids: [Data(blake2b(chunk))]) }
        #expect(try server.missingChunks(caller: a.user.key, ids: [Data(blake2b(chunk))]).missing.count == 1)
        let sealed = randomBytes(30)
        expectRefusal(403, ErrorResponse.forbidden) {
            try server.putManifest(
                caller: a.user.key,
                PutManifestRequest(
                    fileID: Data(bDoc.id.bytes), digest: Data(blake2b(sealed)), sealed: Data(sealed), chunkIDs: []))
        }
        // A putting a chunk with B's chunk id lands in A's namespace; B's is untouched.
        try server.putChunk(caller: a.user.key, id: Data(blake2b(chunk)), bytes: [9, 9, 9])
        let bBundle = try #require(
            ChunkBundle.decode(try server.getChunks(caller: b.user.key, ids: [Data(blake2b(chunk))])))
        #expect(bBundle.first?.sealed == chunk)
        _ = try server.cleanup(graceMillis: 0)
        #expect(try b.all() == bBefore)
        #expect(
            try server.getManifest(caller: b.user.key, GetManifestRequest(fileID: Data(bDoc.id.bytes), digest: digest))
                .count == 64)
        #expect(try server.audit(account: b.user.key).isEmpty)
    }
}

@Suite struct ScaleTests {
    @Test func updatesArePagedWithACompositeCursor() throws {
        let (server, _) = try makeServer()
        let a = try Device(server, TestUser())
        let root = rootRecord(a.user)
        try a.push([root])
        var versions: [Int64] = []
        for batch in 0..<3 {
            versions.append(
                try a.push((0..<2000).map { record(a.user, .document, in: root.id, named: "f\(batch)-\($0)") }))
        }
        // 6001 records: a full first page ends inside the third batch and says where.
        let p1 = try server.updates(caller: a.user.key, since: 0)
        #expect(p1.files.count == 5000 && p1.more && p1.latest == versions[2] && p1.nextAfterID != nil)
        let p2 = try server.updates(caller: a.user.key, since: p1.latest, afterID: p1.nextAfterID)
        #expect(p2.files.count == 1001 && !p2.more && p2.latest == versions[2] && p2.nextAfterID == nil)
        // A page ending exactly on a version boundary needs no file id.
        let p1b = try server.updates(caller: a.user.key, since: versions[0])
        #expect(p1b.files.count == 4000 && !p1b.more && p1b.nextAfterID == nil)
        // One batch bigger than a page is split, with a file id to go on from.
        let big = try a.push((0..<5500).map { record(a.user, .document, in: root.id, named: "big-\($0)") })
        let p3 = try server.updates(caller: a.user.key, since: versions[2])
        #expect(p3.files.count == 5000 && p3.more && p3.latest == big && p3.nextAfterID != nil)
        let p4 = try server.updates(caller: a.user.key, since: p3.latest, afterID: p3.nextAfterID)
        #expect(p4.files.count == 500 && !p4.more && p4.latest == big && p4.nextAfterID == nil)
        let ids = (p3.files + p4.files).compactMap { try? decodeRecord($0).id }
        #expect(Set(ids).count == 5500)
        #expect(try server.audit(account: a.user.key).isEmpty)
    }

    @Test func serversSharingStorageStayConsistent() throws {
        // Two logic instances over one database and chunk directory, as two processes would be.
        let dir = tempDirectory()
        let s1 = try CofferServer.open(directory: dir)
        let s2 = try CofferServer.open(directory: dir)
        let user = TestUser()
        let d1 = try Device(s1, user)
        let root = rootRecord(user)
        let f = record(user, .folder, in: root.id, named: "f")
        try d1.push([root, f])
        let d2 = try Device(s2, user, register: false)
        d2.seen = d1.seen
        d2.sent = d1.sent
        var renamed = f
        renamed.name = sealedName("g")
        try d2.push([renamed])
        // s1's cached tree is behind; it must catch up, not accept a stale precondition.
        var moved = f
        moved.isDeleted = true
        expectRefusal(409, ErrorResponse.getUpdatesRequired) { try d1.push([moved]) }
        d1.seen[f.id] = renamed
        d1.sent[f.id] = d2.sent[f.id]
        // And a name conflict with what s2 wrote is seen by s1.
        expectRefusal(409, ErrorResponse.invalidTree) { try d1.push([record(user, .folder, in: root.id, named: "g")]) }
        try d1.push([record(user, .folder, in: root.id, named: "f")])
        #expect(try s2.updates(caller: user.key, since: 0).files.count == 3)
        #expect(try s1.audit(account: user.key).isEmpty)
    }
}
