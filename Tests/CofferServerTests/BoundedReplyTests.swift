import CofferCrypto
import CofferModel
import CofferProtocol
import CofferServerCore
import CofferServerHTTP
import Foundation
import HTTPTypes
import Hummingbird
import HummingbirdTesting
import Logging
import Testing

/// Reads every page after `since` as a client does, checking each page's bounds and that the
/// cursor always moves on. Returns the pages.
func readAllPages(
    _ server: CofferServer, _ u: TestUser, since: Int64 = 0,
    sourceLocation: SourceLocation = #_sourceLocation
) throws -> [UpdatesResponse] {
    var pages: [UpdatesResponse] = []
    var cursor: (Int64, Data?) = (since, nil)
    while true {
        let page = try server.updates(caller: u.key, since: cursor.0, afterID: cursor.1)
        pages.append(page)
        #expect(page.files.count <= API.updatesPageSize, sourceLocation: sourceLocation)
        let json = try JSONEncoder().encode(page).count
        #expect(json <= API.updatesPageBytes + 4096, "page of \(json) bytes", sourceLocation: sourceLocation)
        if !page.more {
            #expect(page.nextAfterID == nil, sourceLocation: sourceLocation)
            return pages
        }
        let next = (page.latest, page.nextAfterID)
        let advanced = UpdatesCursor.isAfter(next, cursor)
        #expect(advanced, "cursor \(cursor) → \(next)", sourceLocation: sourceLocation)
        guard advanced, pages.count < 1000 else { return pages }
        cursor = next
    }
}

@Suite struct BoundedReplyTests {
    /// Deleting a folder marks all its descendants with one version; that version is split across
    /// pages, and reading the pages gives every record exactly once.
    @Test func aFolderDeletionLargerThanAPageIsSplit() throws {
        let (server, _) = try makeServer()
        let a = try Device(server, TestUser())
        let root = rootRecord(a.user)
        let folder = record(a.user, .folder, in: root.id, named: "big")
        try a.push([root, folder])
        let count = 12_000
        var children: [FileMetadata] = []
        for start in stride(from: 0, to: count, by: 4000) {
            let batch = (start..<min(count, start + 4000)).map {
                record(a.user, .document, in: folder.id, named: "f\($0)")
            }
            try a.push(batch)
            children += batch
        }
        let before = try server.updates(caller: a.user.key, since: 0)
        var deleted = folder
        deleted.isDeleted = true
        let version = try a.push([deleted])
        // Everything from the start, and just the deletion's version.
        for since in [Int64(0), version - 1] {
            let pages = try readAllPages(server, a.user, since: since)
            let files = pages.flatMap(\.files)
            let ids = files.compactMap { try? decodeRecord($0).id }
            #expect(Set(ids).count == ids.count, "a record came twice")
            #expect(Set(ids) == Set(([root, folder] + children).map(\.id)).subtracting(since == 0 ? [] : [root.id]))
            #expect(files.filter { $0.version == version }.count == count + 1)
            #expect(pages.count >= 3)
            #expect(pages.last?.latest == version)
        }
        #expect(before.more)
        #expect(try server.audit(account: a.user.key).isEmpty)
    }

    @Test func pagesAreBoundedInBytes() throws {
        let (server, _) = try makeServer()
        let a = try Device(server, TestUser())
        let root = rootRecord(a.user)
        let big = (0..<24).map { i -> FileMetadata in
            var m = record(a.user, .document, in: root.id, named: "big\(i)")
            m.sealedAttributes = randomBytes(1 << 20)
            return m
        }
        let v = try a.push([root] + big)
        let pages = try readAllPages(server, a.user)
        #expect(pages.count >= 2)
        #expect(pages.flatMap(\.files).count == 25)
        #expect(pages.dropLast().allSatisfy { $0.nextAfterID != nil && $0.latest == v })
        // A cursor that is not a file id is refused.
        expectRefusal(400, ErrorResponse.badRequest) {
            _ = try server.updates(caller: a.user.key, since: 0, afterID: Data([1, 2]))
        }
    }

    @Test func duplicateChunkIDsAreAnsweredOnce() throws {
        let (server, _, _) = try makeWatchedServer(maxChunkResponse: 100_000)
        let a = try Device(server, TestUser())
        let chunk = randomBytes(60_000)
        let id = Data(blake2b(chunk))
        try server.putChunk(caller: a.user.key, id: id, bytes: chunk)
        // Seven times the same id: one answer, within a limit that seven copies would exceed.
        let bundle = try #require(
            ChunkBundle.decode(try server.getChunks(caller: a.user.key, ids: Array(repeating: id, count: 7))))
        #expect(bundle.count == 1 && bundle.first?.sealed == chunk)
    }

    @Test func anOversizedRequestIsRefusedBeforeAnythingIsRead() throws {
        let (server, content, _) = try makeWatchedServer(maxChunkResponse: 100_000)
        let a = try Device(server, TestUser())
        let ids = try (0..<2).map { _ -> Data in
            let c = randomBytes(60_000)
            try server.putChunk(caller: a.user.key, id: Data(blake2b(c)), bytes: c)
            return Data(blake2b(c))
        }
        expectRefusal(413, ErrorResponse.tooLarge) { _ = try server.getChunks(caller: a.user.key, ids: ids) }
        expectRefusal(404, ErrorResponse.notFound) {
            _ = try server.getChunks(caller: a.user.key, ids: [ids[0], Data(randomBytes(32))])
        }
        #expect(content.opens.load(ordering: .relaxed) == 0 && content.gets.load(ordering: .relaxed) == 0)
        #expect(ChunkBundle.decode(try server.getChunks(caller: a.user.key, ids: [ids[1]]))?.count == 1)
    }

    /// Over HTTP, `chunks/get` streams the bundle: chunks are read a piece at a time (never a whole
    /// large chunk at once), and the answer is exact.
    @Test func chunksAreStreamedInPieces() async throws {
        let (server, content, _) = try makeWatchedServer()
        var logger = Logger(label: "coffer-server-test")
        logger.logLevel = .warning
        let router = CofferHTTP.router(server: server, options: .init(accountCreationsPerMinute: 0), logger: logger)
        let app = Application(router: router, logger: logger)
        let u = TestUser()
        _ = try server.createAccount(caller: u.key, u.createRequest)
        let chunks = [randomBytes(3 * CofferServer.chunkPieceBytes + 17), [], randomBytes(100)]
        let ids = chunks.map { _ in Data(randomBytes(32)) }
        for (id, c) in zip(ids, chunks) { try server.putChunk(caller: u.key, id: id, bytes: c) }
        try await app.test(.router) { client in
            let response = try await client.signedJSON(u, .post, "/v1/chunks/get", ChunkIDsRequest(ids: ids + ids))
            #expect(response.status == .ok)
            let bundle = try #require(ChunkBundle.decode(response.bytes))
            #expect(bundle.map(\.id) == ids.map { Array($0) })
            #expect(bundle.map(\.sealed) == chunks)
        }
        #expect(content.largestRead.load(ordering: .relaxed) <= CofferServer.chunkPieceBytes)
        #expect(content.largestRead.load(ordering: .relaxed) > 0)
    }
}
