import CofferCrypto
import CofferModel
import CofferProtocol
import CofferServerCore
import Foundation
import Synchronization
import Testing

/// What `records` count against the quota, signed as `u` signs them.
func countedRows(_ u: TestUser, _ records: [FileMetadata]) -> Int64 {
    records.reduce(0) { $0 + QuotaRule.counted(row: Int64(u.sign($1).count)) }
}

/// A content store that counts what is read from it and checks, when a chunk is published, that
/// the metadata store has not recorded it yet (bytes durable before the record).
final class WatchedContentStorage: ContentStorage {
    let inner: DirectoryContentStorage
    let opens = Atomic<Int>(0)
    let gets = Atomic<Int>(0)
    let largestRead = Atomic<Int>(0)
    let publishedBeforeRecorded = Atomic<Int>(0)
    let publishedAfterRecorded = Atomic<Int>(0)
    let metadata: Mutex<(any MetadataStorage)?> = Mutex(nil)

    init(_ dir: URL) throws {
        inner = try DirectoryContentStorage(
            root: dir.appendingPathComponent("chunks"), tmp: dir.appendingPathComponent("tmp"))
    }

    func stage(_ key: ChunkKey, bytes: [UInt8]) throws -> StagedChunk { try inner.stage(key, bytes: bytes) }

    func publish(_ staged: StagedChunk) throws {
        if let meta = metadata.withLock({ $0 }) {
            // A read sees only committed state: the transaction recording this chunk is still open.
            let recorded = try meta.read { try $0.presentChunks(account: staged.key.account, ids: [staged.key.id]) }
            if recorded.isEmpty {
                publishedBeforeRecorded.add(1, ordering: .relaxed)
            } else {
                publishedAfterRecorded.add(1, ordering: .relaxed)
            }
        }
        try inner.publish(staged)
    }

    func discard(_ staged: StagedChunk) { inner.discard(staged) }

    func get(_ key: ChunkKey) throws -> [UInt8]? {
        gets.add(1, ordering: .relaxed)
        return try inner.get(key)
    }

    func open(_ key: ChunkKey) throws -> (any ChunkReading)? {
        opens.add(1, ordering: .relaxed)
        return try inner.open(key).map { Reader(inner: $0, owner: self) }
    }

    func has(_ key: ChunkKey) throws -> Bool { try inner.has(key) }
    func delete(_ key: ChunkKey) throws { try inner.delete(key) }
    func list(_ each: (ChunkKey, Int64) throws -> Void) throws { try inner.list(each) }

    struct Reader: ChunkReading {
        let inner: any ChunkReading
        let owner: WatchedContentStorage
        func read(upTo count: Int) throws -> [UInt8] {
            owner.largestRead.max(count, ordering: .relaxed)
            return try inner.read(upTo: count)
        }
    }
}

/// A server over a `WatchedContentStorage`.
func makeWatchedServer(
    quota: Int64 = CofferServer.defaultQuotaBytes, maxChunkResponse: Int = CofferServer.defaultMaxChunkResponseBytes
)
    throws -> (CofferServer, WatchedContentStorage, URL)
{
    let dir = tempDirectory()
    let content = try WatchedContentStorage(dir)
    let meta = try SQLiteMetadataStorage(path: dir.appendingPathComponent("metadata.sqlite").path)
    content.metadata.withLock { $0 = meta }
    return (
        CofferServer(metadata: meta, content: content, quotaBytes: quota, maxChunkResponseBytes: maxChunkResponse),
        content, dir
    )
}

@Suite struct QuotaTests {
    @Test func emptyAndTinyChunksAreNotFree() throws {
        let (server, _) = try makeServer()
        let a = try Device(server, TestUser())
        try server.putChunk(caller: a.user.key, id: Data(randomBytes(32)), bytes: [])
        #expect(try server.usage(caller: a.user.key).bytes == QuotaRule.minimumChunkBytes)
        try server.putChunk(caller: a.user.key, id: Data(randomBytes(32)), bytes: [7])
        #expect(try server.usage(caller: a.user.key).bytes == 2 * QuotaRule.minimumChunkBytes)
        // So a quota bounds how many of them an account can store.
        let (small, _) = try makeServer(quota: 3 * QuotaRule.minimumChunkBytes)
        let b = try Device(small, TestUser())
        for _ in 0..<3 { try small.putChunk(caller: b.user.key, id: Data(randomBytes(32)), bytes: []) }
        expectRefusal(413, ErrorResponse.quotaExceeded) {
            try small.putChunk(caller: b.user.key, id: Data(randomBytes(32)), bytes: [])
        }
        // A tiny manifest counts a row's minimum.
        let sealed = randomBytes(1)
        try server.putManifest(
            caller: a.user.key,
            PutManifestRequest(
                fileID: Data(newFileID().bytes), digest: Data(blake2b(sealed)),
                sealed: Data(sealed), chunkIDs: []))
        #expect(
            try server.usage(caller: a.user.key).bytes == 2 * QuotaRule.minimumChunkBytes + QuotaRule.minimumRowBytes)
    }

    @Test func recordsCountAtTheirCurrentSize() throws {
        let (server, _) = try makeServer()
        let a = try Device(server, TestUser())
        let root = rootRecord(a.user)
        var doc = record(a.user, .document, in: root.id, named: "d")
        doc.sealedAttributes = randomBytes(100_000)
        try a.push([root, doc])
        #expect(try server.usage(caller: a.user.key).bytes == countedRows(a.user, [root, doc]))
        // A newer version replaces the old one's count: smaller, then larger.
        doc.sealedAttributes = randomBytes(10)
        try a.push([doc])
        #expect(try server.usage(caller: a.user.key).bytes == countedRows(a.user, [root, doc]))
        doc.sealedAttributes = randomBytes(300_000)
        try a.push([doc])
        #expect(try server.usage(caller: a.user.key).bytes == countedRows(a.user, [root, doc]))
        // Files the server marks deleted keep their (unchanged) record and count.
        let folder = record(a.user, .folder, in: root.id, named: "f")
        let inner = record(a.user, .document, in: folder.id, named: "i")
        try a.push([folder, inner])
        var gone = folder
        gone.isDeleted = true
        try a.push([gone])
        #expect(try server.usage(caller: a.user.key).bytes == countedRows(a.user, [root, doc, gone, inner]))
        #expect(try server.audit(account: a.user.key).isEmpty)
    }

    @Test func recordsAreRefusedPastTheQuota() throws {
        let (server, _) = try makeServer(quota: 200_000)
        let a = try Device(server, TestUser())
        let root = rootRecord(a.user)
        var big = record(a.user, .document, in: root.id, named: "big")
        big.sealedAttributes = randomBytes(150_000)
        try a.push([root, big])
        let before = try server.usage(caller: a.user.key).bytes
        var more = record(a.user, .document, in: root.id, named: "more")
        more.sealedAttributes = randomBytes(60_000)
        expectRefusal(413, ErrorResponse.quotaExceeded) { try a.push([more]) }
        #expect(try server.usage(caller: a.user.key).bytes == before)
        #expect(try a.all().count == 2)
        // Shrinking a record is always accepted; then the new file fits.
        big.sealedAttributes = randomBytes(10)
        try a.push([big])
        try a.push([more])
        #expect(try server.usage(caller: a.user.key).bytes == countedRows(a.user, [root, big, more]))
    }

    @Test func manifestsAndChunksAreReleasedWhenSuperseded() throws {
        let (server, _) = try makeServer()
        let a = try Device(server, TestUser())
        let root = rootRecord(a.user)
        var doc = record(a.user, .document, in: root.id, named: "d")
        doc.contentDigest = try a.putContent(doc.id, chunks: [randomBytes(10_000)])
        try a.push([root, doc])
        #expect(try server.usage(caller: a.user.key).bytes == countedRows(a.user, [root, doc]) + 10_000 + 256)
        doc.contentDigest = try a.putContent(doc.id, chunks: [randomBytes(5000)])
        try a.push([doc])
        #expect(try server.usage(caller: a.user.key).bytes == countedRows(a.user, [root, doc]) + 5000 + 256)
        doc.isDeleted = true
        try a.push([doc])
        #expect(try server.usage(caller: a.user.key).bytes == countedRows(a.user, [root, doc]))
    }

    /// The audit recounts usage from what is stored, so accounting that drifts is caught.
    @Test func theAuditRecountsUsage() throws {
        let (server, _) = try makeServer()
        let a = try Device(server, TestUser())
        let root = rootRecord(a.user)
        var doc = record(a.user, .document, in: root.id, named: "d")
        doc.contentDigest = try a.putContent(doc.id, chunks: [randomBytes(10), randomBytes(9000)])
        try a.push([root, doc])
        #expect(try server.audit(account: a.user.key).isEmpty)
        try server.metadata.write { try $0.addUsage(account: a.user.key, bytes: 1) }
        #expect(try server.audit(account: a.user.key).contains { $0.contains("usage") })
    }

    /// Several uploads of one chunk id at once, each with different bytes (the server cannot tell
    /// which are right: ids are keyed hashes), store exactly one of them, and count exactly that:
    /// small chunks (kept inline) and large ones (files of the content store) alike.
    @Test func racingUploadsOfOneChunkStoreItOnce() throws {
        let (server, dir) = try makeServer()
        let a = try Device(server, TestUser())
        for round in 0..<12 {
            let id = Data(randomBytes(32))
            let before = try server.usage(caller: a.user.key).bytes
            let base = round % 2 == 0 ? 20_000 : CofferServer.inlineChunkBytes + 1
            let uploads = (0..<8).map { randomBytes(base + 1000 * $0) }
            let failures = Atomic<Int>(0)
            DispatchQueue.concurrentPerform(iterations: uploads.count) { i in
                do { try server.putChunk(caller: a.user.key, id: id, bytes: uploads[i]) } catch {
                    failures.add(1, ordering: .relaxed)
                }
            }
            #expect(failures.load(ordering: .relaxed) == 0)
            let stored = try #require(
                ChunkBundle.decode(try server.getChunks(caller: a.user.key, ids: [id]))?.first?.sealed)
            let isOneOfTheUploads = uploads.contains(stored)  // not printed on failure: megabytes of numbers
            #expect(isOneOfTheUploads, "the stored chunk (\(stored.count) bytes) is none of the uploads")
            let idHex = RequestSigning.hex(Array(id))
            let file = dir.appendingPathComponent(
                "chunks/\(RequestSigning.hex(Array(a.user.key)))/\(idHex.prefix(2))/\(idHex)")
            // The file in place (for a large chunk) is the upload that was counted.
            if base > CofferServer.inlineChunkBytes {
                #expect(try Data(contentsOf: file) == Data(stored))
            } else {
                #expect(!FileManager.default.fileExists(atPath: file.path))
            }
            #expect(try server.usage(caller: a.user.key).bytes - before == Int64(stored.count))
        }
        // The losers left nothing behind.
        #expect(try FileManager.default.contentsOfDirectory(atPath: dir.appendingPathComponent("tmp").path).isEmpty)
        #expect(try server.audit(account: a.user.key).isEmpty)
    }

    @Test func aChunkIsDurableBeforeItIsRecordedAndARefusedOneLeavesNothing() throws {
        let (server, content, dir) = try makeWatchedServer(quota: 250_000)
        let a = try Device(server, TestUser())
        // Large enough for the content store (a small one is kept inline, with its row).
        try server.putChunk(caller: a.user.key, id: Data(randomBytes(32)), bytes: randomBytes(150_000))
        #expect(content.publishedBeforeRecorded.load(ordering: .relaxed) == 1)
        #expect(content.publishedAfterRecorded.load(ordering: .relaxed) == 0)
        expectRefusal(413, ErrorResponse.quotaExceeded) {
            try server.putChunk(caller: a.user.key, id: Data(randomBytes(32)), bytes: randomBytes(150_000))
        }
        #expect(content.publishedBeforeRecorded.load(ordering: .relaxed) == 1)
        #expect(try FileManager.default.contentsOfDirectory(atPath: dir.appendingPathComponent("tmp").path).isEmpty)
    }
}

@Suite struct RegistrationTests {
    func server(_ policy: CofferServer.RegistrationPolicy) throws -> CofferServer {
        try CofferServer.open(directory: tempDirectory(), registration: policy)
    }

    @Test func openAcceptsAnyone() throws {
        let s = try server(.open)
        let u = TestUser()
        _ = try s.createAccount(caller: u.key, u.createRequest)
        #expect(try s.requireAccount(u.key).username == u.username)
    }

    @Test func closedAcceptsNobody() throws {
        let s = try server(.closed)
        let u = TestUser()
        let code = try s.makeInvites(count: 1)[0]
        var req = u.createRequest
        req.invite = code
        expectRefusal(403, ErrorResponse.forbidden) { _ = try s.createAccount(caller: u.key, req) }
        expectRefusal(401) { _ = try s.requireAccount(u.key) }
    }

    @Test func inviteCodesAreSingleUseAndStoredHashed() throws {
        let dir = tempDirectory()
        let s = try CofferServer.open(directory: dir, registration: .invite)
        let codes = try s.makeInvites(count: 3)
        #expect(Set(codes).count == 3 && codes.allSatisfy { $0.count == 32 && RequestSigning.unhex($0) != nil })
        let u1 = TestUser("one")
        let u2 = TestUser("two")
        let u3 = TestUser("one")
        // No code, a malformed one, an unknown one.
        expectRefusal(403, ErrorResponse.forbidden) { _ = try s.createAccount(caller: u1.key, u1.createRequest) }
        for bad in ["", "nonsense", String(repeating: "0", count: 32)] {
            var req = u1.createRequest
            req.invite = bad
            expectRefusal(403, ErrorResponse.forbidden) { _ = try s.createAccount(caller: u1.key, req) }
        }
        var req1 = u1.createRequest
        req1.invite = codes[0].uppercased()  // copied by hand: case does not matter
        _ = try s.createAccount(caller: u1.key, req1)
        // Used once: gone.
        var req2 = u2.createRequest
        req2.invite = codes[0]
        expectRefusal(403, ErrorResponse.forbidden) { _ = try s.createAccount(caller: u2.key, req2) }
        // A refused creation (the name is taken) does not use the code up.
        var req3 = u3.createRequest
        req3.invite = codes[1]
        expectRefusal(409, ErrorResponse.conflict) { _ = try s.createAccount(caller: u3.key, req3) }
        req2.invite = codes[1]
        _ = try s.createAccount(caller: u2.key, req2)
        // Only hashes are stored: neither the code's text nor its bytes are in the database files.
        var db = try Data(contentsOf: dir.appendingPathComponent("metadata.sqlite"))
        db += (try? Data(contentsOf: dir.appendingPathComponent("metadata.sqlite-wal"))) ?? Data()
        #expect(db.range(of: Data(codes[2].utf8)) == nil)
        #expect(db.range(of: Data(RequestSigning.unhex(codes[2]) ?? [])) == nil)
        #expect(db.range(of: Data(blake2b(RequestSigning.unhex(codes[2]) ?? []))) != nil)
    }
}
