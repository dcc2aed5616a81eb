import CofferCrypto
import CofferModel
import CofferProtocol
import CofferServerCore
import CofferServerHTTP
import Foundation
import Hummingbird
import HummingbirdTesting
import Testing

/// `POST /v1/content` and `POST /v1/manifests/many` (docs/PROTOCOL.md, "Content in bundles"), and
/// small chunks kept inline (docs/SERVER.md, "Content").
@Suite struct ContentBundleTests {
    func chunk(_ bytes: [UInt8]) -> ContentBundle.Chunk { ContentBundle.Chunk(id: blake2b(bytes), sealed: bytes) }

    func manifest(_ file: FileID, _ chunks: [ContentBundle.Chunk]) -> ContentBundle.Manifest {
        let sealed = randomBytes(80)
        return ContentBundle.Manifest(
            fileID: file.bytes, digest: blake2b(sealed), sealed: sealed, chunkIDs: chunks.map(\.id))
    }

    func chunkFiles(_ dir: URL) -> [String] {
        let root = dir.appendingPathComponent("chunks").path
        return (FileManager.default.enumerator(atPath: root)?.allObjects as? [String] ?? []).filter {
            !$0.contains("/") ? false : $0.split(separator: "/").count == 3
        }
    }

    @Test func aBundleStoresSmallChunksInlineLargeOnesAsFilesAndManifestsAtOnce() throws {
        let (server, dir) = try makeServer()
        let a = try Device(server, TestUser())
        let root = rootRecord(a.user)
        try a.push([root])
        let small = (0..<50).map { _ in chunk(randomBytes(Int.random(in: 1...4000))) }
        let large = chunk(randomBytes(CofferServer.inlineChunkBytes + 10))
        var docs: [FileMetadata] = []
        var bundle = ContentBundle(chunks: small + [large])
        for (i, c) in small.enumerated() {
            var doc = record(a.user, .document, in: root.id, named: "f\(i)")
            let m = manifest(doc.id, [c] + (i == 0 ? [large] : []))
            doc.contentDigest = m.digest
            bundle.manifests.append(m)
            docs.append(doc)
        }
        try server.putContent(caller: a.user.key, bundle)
        try a.push(docs)
        // One file in the content store: the large chunk; the small ones are rows.
        #expect(chunkFiles(dir).count == 1)
        let got = try #require(
            ChunkBundle.decode(try server.getChunks(caller: a.user.key, ids: (small + [large]).map { Data($0.id) })))
        #expect(got.map(\.sealed) == (small + [large]).map(\.sealed))
        #expect(try server.audit(account: a.user.key).isEmpty)
        // Sending it again changes nothing (an interrupted push resumes this way).
        let used = try server.usage(caller: a.user.key).bytes
        try server.putContent(caller: a.user.key, bundle)
        #expect(try server.usage(caller: a.user.key).bytes == used)

        // Many manifests at once, in the order asked; one the server lacks comes back empty.
        let asked =
            bundle.manifests.prefix(3).map { GetManifestRequest(fileID: Data($0.fileID), digest: Data($0.digest)) }
            + [GetManifestRequest(fileID: Data(newFileID().bytes), digest: Data(randomBytes(32)))]
        let entries = try #require(
            ManifestBundle.decode(try server.getManifests(caller: a.user.key, .init(items: asked))))
        #expect(entries.prefix(3).map(\.sealed) == bundle.manifests.prefix(3).map(\.sealed))
        #expect(entries.last?.sealed == nil)
        // Another account reads none of them.
        let b = try Device(server, TestUser())
        let theirs = try #require(
            ManifestBundle.decode(try server.getManifests(caller: b.user.key, .init(items: asked))))
        #expect(theirs.allSatisfy { $0.sealed == nil })

        // Deleting the documents releases their chunks, inline or not.
        try a.push(
            docs.map {
                var d = $0
                d.isDeleted = true
                return d
            })
        #expect(chunkFiles(dir).isEmpty)
        #expect(
            try server.missingChunks(caller: a.user.key, ids: [Data(small[0].id), Data(large.id)]).missing.count == 2)
        #expect(try server.audit(account: a.user.key).isEmpty)
    }

    @Test func aBundleIsStoredWholeOrNotAtAll() throws {
        let (server, dir) = try makeServer(quota: 400_000)
        let a = try Device(server, TestUser())
        let c = chunk(randomBytes(1000))
        let big = chunk(randomBytes(CofferServer.inlineChunkBytes * 2))
        // A manifest listing a chunk neither carried nor stored: nothing is stored.
        let orphan = manifest(newFileID(), [c, chunk(randomBytes(10))])
        expectRefusal(409, ErrorResponse.conflict) {
            try server.putContent(caller: a.user.key, ContentBundle(chunks: [c, big], manifests: [orphan]))
        }
        #expect(try server.missingChunks(caller: a.user.key, ids: [Data(c.id), Data(big.id)]).missing.count == 2)
        #expect(chunkFiles(dir).isEmpty)
        // A digest that is not the manifest's.
        var lying = manifest(newFileID(), [c])
        lying.digest = randomBytes(32)
        expectRefusal(400) { try server.putContent(caller: a.user.key, ContentBundle(chunks: [c], manifests: [lying])) }
        // Past the quota: nothing stored either.
        let many = (0..<5).map { _ in chunk(randomBytes(100_000)) }
        expectRefusal(413, ErrorResponse.quotaExceeded) {
            try server.putContent(caller: a.user.key, ContentBundle(chunks: many))
        }
        #expect(try server.usage(caller: a.user.key).bytes < 2000)
        #expect(chunkFiles(dir).isEmpty)
        #expect(try server.audit(account: a.user.key).isEmpty)
    }

    /// A grantee writes content into its owner's namespace only for files it may write: a
    /// manifest for another of the owner's files, sent through the share, is refused and stores
    /// nothing (the owner's quota included).
    @Test func aGranteeCannotStoreManifestsForFilesOutsideItsShare() throws {
        let (server, _) = try makeServer()
        let alice = try Device(server, TestUser("alice"))
        let bob = try Device(server, TestUser("bob"))
        let root = rootRecord(alice.user)
        var shared = record(alice.user, .folder, in: root.id, named: "shared")
        shared.access = [try signedGrant(shared.id, owner: alice.user, to: bob.user, .write)]
        let inside = record(alice.user, .document, in: shared.id, named: "inside")
        let outside = record(alice.user, .document, in: root.id, named: "outside")
        try alice.push([root, shared, inside, outside])
        let used = try server.usage(caller: alice.user.key).bytes
        let c = chunk(randomBytes(500))
        let via = Data(shared.id.bytes)
        expectRefusal(403) {
            try server.putContent(
                caller: bob.user.key, ContentBundle(chunks: [c], manifests: [manifest(outside.id, [c])]), via: via)
        }
        #expect(try server.usage(caller: alice.user.key).bytes == used)
        // Through the share, for a file in it: stored in alice's namespace.
        try server.putContent(
            caller: bob.user.key, ContentBundle(chunks: [c], manifests: [manifest(inside.id, [c])]), via: via)
        #expect(try server.missingChunks(caller: alice.user.key, ids: [Data(c.id)]).missing.isEmpty)
    }

    @Test func hostileBundlesAreRefusedOverHTTP() async throws {
        let (app, _) = try makeApp()
        let alice = TestUser("alice")
        try await app.test(.router) { client in
            #expect(try await client.signedJSON(alice, .post, "/v1/accounts", alice.createRequest).status == .ok)
            let good = ContentBundle(chunks: [chunk(randomBytes(100))]).encoded()
            #expect(try await client.signed(alice, .post, "/v1/content", body: good).status == .noContent)
            // Truncated, a count that lies, an unknown tag, trailing bytes, a manifest claiming
            // more chunk ids than bytes: each a 400, none a crash.
            var lyingCount = good
            lyingCount[7] = 200
            var unknownTag = good
            unknownTag[8] = 9
            let claims =
                Array("CBU1".utf8) + [0, 0, 0, 1, 2] + [UInt8](repeating: 0, count: 48) + [0, 0, 0, 0]
                + [0xff, 0xff, 0xff, 0xff]
            for body in [Array(good.dropLast()), lyingCount, unknownTag, good + [0], claims, [], Array("CBU1".utf8)] {
                let r = try await client.signed(alice, .post, "/v1/content", body: body)
                #expect(r.status == .badRequest, "\(body.prefix(16))")
            }
            let badVia = try await client.signed(alice, .post, "/v1/content?via=zz", body: good)
            #expect(badVia.status == .badRequest)
            let tooMany = ManyManifestsRequest(
                items: Array(repeating: GetManifestRequest(fileID: Data(count: 16), digest: Data()), count: 10_001))
            #expect(try await client.signedJSON(alice, .post, "/v1/manifests/many", tooMany).status == .contentTooLarge)
        }
    }
}
