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

func nowMillis() -> Int64 { Int64(Date().timeIntervalSince1970 * 1000) }

extension TestClientProtocol {
    /// A request signed by `u` as a client would sign it.
    /// The server's id, as a client asks it before signing.
    func serverID() async throws -> [UInt8] {
        let r = try await execute(uri: "/v1/server", method: .get)
        return Array(try r.json(ServerInfoResponse.self).id)
    }

    /// A request signed by `u` as a client would sign it (for the server's own id unless `server` says otherwise).
    func signed(
        _ u: TestUser, _ method: HTTPRequest.Method, _ path: String, body: [UInt8] = [],
        timestamp: Int64 = nowMillis(), nonce: [UInt8] = randomBytes(16), server: [UInt8]? = nil,
        edit: (inout HTTPFields) -> Void = { _ in }
    ) async throws -> TestResponse {
        var fields = HTTPFields()
        var id = server ?? []
        if server == nil { id = try await serverID() }
        for (name, value) in RequestSigning.headers(
            keys: u.keys, server: id, method: method.rawValue, path: path, body: body, timestamp: timestamp,
            nonce: nonce)
        {
            fields[HTTPField.Name(name)!] = value
        }
        edit(&fields)
        return try await execute(uri: path, method: method, headers: fields, body: ByteBuffer(bytes: body))
    }

    func signedJSON<T: Encodable>(
        _ u: TestUser, _ method: HTTPRequest.Method, _ path: String, _ value: T
    ) async throws -> TestResponse {
        try await signed(u, method, path, body: Array(try JSONEncoder().encode(value)))
    }
}

extension TestResponse {
    func json<T: Decodable>(_ type: T.Type) throws -> T { try JSONDecoder().decode(T.self, from: Data(buffer: body)) }
    var errorCode: String? { (try? json(ErrorResponse.self))?.code }
    var bytes: [UInt8] { Array(body.readableBytesView) }
}

func makeApp(
    quota: Int64 = CofferServer.defaultQuotaBytes, accountsPerMinute: Int = 0,
    server given: CofferServer? = nil
) throws -> (some ApplicationProtocol, CofferServer) {
    let server = try given ?? makeServer(quota: quota).0
    var logger = Logger(label: "coffer-server-test")
    logger.logLevel = .warning
    var options = CofferHTTP.Options(accountCreationsPerMinute: accountsPerMinute)
    // The limit's clock stands still, so a slow run cannot refill a token mid-test.
    let start = ContinuousClock.now
    options.rateLimitClock = { start }
    let router = CofferHTTP.router(server: server, options: options, logger: logger)
    return (Application(router: router, logger: logger), server)
}

@Suite struct HTTPTests {
    @Test func sharedFoldersOverHTTP() async throws {
        let (app, server) = try makeApp(server: try makeServer().0)
        let alice = try Device(server, TestUser("alice"))
        let bob = TestUser("bob")
        let carol = TestUser("carol")
        try await app.test(.router) { client in
            for u in [bob, carol] {
                #expect(try await client.signedJSON(u, .post, "/v1/accounts", u.createRequest).status == .ok)
            }
            let root = rootRecord(alice.user)
            var shared = record(alice.user, .folder, in: root.id, named: "shared")
            shared.access = [try signedGrant(shared.id, owner: alice.user, to: bob, .write)]
            try alice.push([root, shared])
            // Bob asks for shared trees and is sent the folder; without asking, nothing.
            let own = try await client.signedJSON(bob, .post, "/v1/updates", UpdatesRequest(since: 0))
            #expect(try own.json(UpdatesResponse.self).files.isEmpty)
            let withShared = try await client.signedJSON(
                bob, .post, "/v1/updates", UpdatesRequest(since: 0, shared: true))
            #expect(try withShared.json(UpdatesResponse.self).files.map(decodeRecord) == [shared])
            // A chunk for the share goes to alice's namespace through `?via=`, signed with it.
            let chunk = randomBytes(2000)
            let path = "/v1/chunks/\(RequestSigning.hex(blake2b(chunk)))?via=\(RequestSigning.hex(shared.id.bytes))"
            #expect(try await client.signed(bob, .put, path, body: chunk).status == .noContent)
            #expect(try server.missingChunks(caller: alice.user.key, ids: [Data(blake2b(chunk))]).missing.isEmpty)
            #expect(try await client.signed(carol, .put, path, body: chunk).status == .forbidden)
            let malformed = "/v1/chunks/\(RequestSigning.hex(blake2b(chunk)))?via=zz"
            #expect(try await client.signed(bob, .put, malformed, body: chunk).status == .badRequest)
            let got = try await client.signedJSON(
                bob, .post, "/v1/chunks/get", ChunkIDsRequest(ids: [Data(blake2b(chunk))], via: Data(shared.id.bytes)))
            #expect(got.status == .ok && ChunkBundle.decode(got.bytes)?.first?.sealed == chunk)
        }
    }

    @Test func healthAndAccounts() async throws {
        let (app, _) = try makeApp()
        try await app.test(.router) { client in
            let health = try await client.execute(uri: "/health", method: .get)
            #expect(health.status == .ok && String(buffer: health.body) == "ok")
            let alice = TestUser("alice")
            let created = try await client.signedJSON(alice, .post, "/v1/accounts", alice.createRequest)
            #expect(created.status == .ok)
            #expect(try created.json(AccountResponse.self).signingKey == alice.key)
            let again = try await client.signedJSON(alice, .post, "/v1/accounts", alice.createRequest)
            #expect(again.status == .conflict && again.errorCode == ErrorResponse.conflict)
            let found = try await client.signed(alice, .get, "/v1/accounts/alice")
            #expect(found.status == .ok)
            #expect(try found.json(AccountResponse.self).boxKey == alice.boxKey)
            let missing = try await client.signed(alice, .get, "/v1/accounts/nobody")
            #expect(missing.status == .notFound && missing.errorCode == ErrorResponse.notFound)
            // Only registered accounts may use the API.
            let stranger = TestUser()
            let usage = try await client.signed(stranger, .get, "/v1/usage")
            #expect(usage.status == .unauthorized)
            let mine = try await client.signed(alice, .get, "/v1/usage")
            #expect(mine.status == .ok)
            #expect(try mine.json(UsageResponse.self).files == 0)
            // Unknown routes and malformed bodies are 4xx with an ErrorResponse.
            let nowhere = try await client.signed(alice, .get, "/v1/nowhere")
            #expect(nowhere.status == .notFound && nowhere.errorCode == ErrorResponse.notFound)
            let garbage = try await client.signed(alice, .post, "/v1/files/upsert", body: Array("{not json".utf8))
            #expect(garbage.status == .badRequest && garbage.errorCode == ErrorResponse.badRequest)
            let badID = try await client.signed(alice, .put, "/v1/chunks/zz", body: [1])
            #expect(badID.status == .badRequest)
            let wrongType = try await client.signedJSON(alice, .post, "/v1/updates", ["since": "yesterday"])
            #expect(wrongType.status == .badRequest)
        }
    }

    @Test func accountCreationIsRateLimited() async throws {
        let (app, _) = try makeApp(accountsPerMinute: 3)
        try await app.test(.router) { client in
            var statuses: [HTTPResponse.Status] = []
            for _ in 0..<5 {
                let u = TestUser()
                statuses.append(try await client.signedJSON(u, .post, "/v1/accounts", u.createRequest).status)
            }
            #expect(statuses == [.ok, .ok, .ok, .tooManyRequests, .tooManyRequests])
        }
    }

    @Test func signingIsEnforced() async throws {
        let (app, server) = try makeApp()
        let alice = TestUser()
        _ = try server.createAccount(caller: alice.key, alice.createRequest)
        try await app.test(.router) { client in
            // Missing headers.
            let bare = try await client.execute(uri: "/v1/usage", method: .get)
            #expect(bare.status == .unauthorized && bare.errorCode == ErrorResponse.unauthorized)
            // Signed for another server: a request captured there cannot be replayed here.
            #expect(try await client.serverID() == server.identity)
            let elsewhere = try await client.signed(
                alice, .get, "/v1/usage", server: randomBytes(RequestSigning.serverIDBytes))
            #expect(elsewhere.status == .unauthorized)
            #expect(try await client.signed(alice, .get, "/v1/usage").status == .ok)
            // A bad signature, a signature by another key, a tampered path or body.
            let badSig = try await client.signed(alice, .get, "/v1/usage") { f in
                let sig = f[HTTPField.Name(RequestSigning.signatureHeader)!] ?? ""
                f[HTTPField.Name(RequestSigning.signatureHeader)!] = String(sig.reversed())
            }
            #expect(badSig.status == .unauthorized)
            let mallory = TestUser()
            let otherKey = try await client.signed(mallory, .get, "/v1/usage") { f in
                f[HTTPField.Name(RequestSigning.accountHeader)!] = RequestSigning.hex(Array(alice.key))
            }
            #expect(otherKey.status == .unauthorized)
            let body = Array(try JSONEncoder().encode(UpdatesRequest(since: 0)))
            var fields = HTTPFields()
            for (n, v) in RequestSigning.headers(
                keys: alice.keys, server: try await client.serverID(), method: "POST", path: "/v1/updates", body: body,
                timestamp: nowMillis())
            {
                fields[HTTPField.Name(n)!] = v
            }
            let tamperedBody = try await client.execute(
                uri: "/v1/updates", method: .post, headers: fields,
                body: ByteBuffer(bytes: Array(try JSONEncoder().encode(UpdatesRequest(since: 5)))))
            #expect(tamperedBody.status == .unauthorized)
            let tamperedPath = try await client.execute(
                uri: "/v1/updates?x=1", method: .post, headers: fields, body: ByteBuffer(bytes: body))
            #expect(tamperedPath.status == .unauthorized)
            let wrongMethod = try await client.execute(
                uri: "/v1/updates", method: .put, headers: fields, body: ByteBuffer(bytes: body))
            #expect(wrongMethod.status == .unauthorized)
            // The original goes through once; its replay is refused.
            let first = try await client.execute(
                uri: "/v1/updates", method: .post, headers: fields, body: ByteBuffer(bytes: body))
            #expect(first.status == .ok)
            let replay = try await client.execute(
                uri: "/v1/updates", method: .post, headers: fields, body: ByteBuffer(bytes: body))
            #expect(replay.status == .unauthorized && replay.errorCode == ErrorResponse.unauthorized)
            // Stale and future timestamps.
            let stale = try await client.signed(
                alice, .get, "/v1/usage", timestamp: nowMillis() - API.maxClockSkewMillis - 60_000)
            #expect(stale.status == .unauthorized)
            let future = try await client.signed(
                alice, .get, "/v1/usage", timestamp: nowMillis() + API.maxClockSkewMillis + 60_000)
            #expect(future.status == .unauthorized)
            let nearby = try await client.signed(alice, .get, "/v1/usage", timestamp: nowMillis() - 60_000)
            #expect(nearby.status == .ok)
            // Malformed header values.
            for (header, value) in [
                (RequestSigning.timestampHeader, "soon"), (RequestSigning.nonceHeader, "xyz"),
                (RequestSigning.accountHeader, "abcd"), (RequestSigning.signatureHeader, "00"),
            ] {
                let r = try await client.signed(alice, .get, "/v1/usage") { $0[HTTPField.Name(header)!] = value }
                #expect(r.status == .unauthorized, "\(header)")
            }
            // Account creation must be signed by the key it registers.
            let bob = TestUser()
            let forged = try await client.signedJSON(mallory, .post, "/v1/accounts", bob.createRequest)
            #expect(forged.status == .forbidden)
        }
    }

    /// A request without a body holds none of the shared body budget; a chunked one (no length)
    /// holds the most it may send; one with a length holds that.
    @Test func bodyReservationHoldsOnlyWhatABodyMayBe() {
        #expect(CofferHTTP.bodyReservation(announced: nil, chunked: false, limit: 1000) == 0)
        #expect(CofferHTTP.bodyReservation(announced: nil, chunked: true, limit: 1000) == 1000)
        #expect(CofferHTTP.bodyReservation(announced: 12, chunked: false, limit: 1000) == 12)
        #expect(CofferHTTP.bodyReservation(announced: -5, chunked: false, limit: 1000) == 0)
    }

    @Test func oversizedBodiesRefused() async throws {
        let (app, server) = try makeApp()
        let alice = TestUser()
        _ = try server.createAccount(caller: alice.key, alice.createRequest)
        try await app.test(.router) { client in
            let big = [UInt8](repeating: 7, count: API.maxBodyBytes + 1)
            let id = RequestSigning.hex(randomBytes(32))
            let r = try await client.signed(alice, .put, "/v1/chunks/\(id)", body: big)
            #expect(r.status == .contentTooLarge && r.errorCode == ErrorResponse.tooLarge)
            let usage = try await client.signed(alice, .get, "/v1/usage")
            #expect(try usage.json(UsageResponse.self).bytes == 0)
            // Just under the limit is fine.
            let ok = try await client.signed(alice, .put, "/v1/chunks/\(id)", body: Array(big.dropLast(1024)))
            #expect(ok.status == .noContent)
            // Any fresh key may ask to create an account, so that body is kept small: strangers
            // cannot hold the shared body budget with 32 MiB announcements.
            let stranger = TestUser()
            let padded =
                Array(try JSONEncoder().encode(stranger.createRequest))
                + [UInt8](repeating: 0x20, count: CofferHTTP.maxAccountRequestBytes)
            let refused = try await client.signed(stranger, .post, "/v1/accounts", body: padded)
            #expect(refused.status == .contentTooLarge)
            let created = try await client.signedJSON(stranger, .post, "/v1/accounts", stranger.createRequest)
            #expect(created.status == .ok)
        }
    }

    @Test func syncRoundTripOverHTTP() async throws {
        let (app, server) = try makeApp(quota: 100_000)
        let alice = TestUser("alice")
        let bob = TestUser("bob")
        try await app.test(.router) { client in
            #expect(try await client.signedJSON(alice, .post, "/v1/accounts", alice.createRequest).status == .ok)
            #expect(try await client.signedJSON(bob, .post, "/v1/accounts", bob.createRequest).status == .ok)
            // Content first: chunks the server lacks, then the manifest.
            let chunk = randomBytes(3000)
            let chunkID = Data(blake2b(chunk))
            let missing = try await client.signedJSON(
                alice, .post, "/v1/chunks/missing", ChunkIDsRequest(ids: [chunkID]))
            #expect(try missing.json(MissingChunksResponse.self).missing == [chunkID])
            #expect(
                try await client.signed(alice, .put, "/v1/chunks/\(RequestSigning.hex(Array(chunkID)))", body: chunk)
                    .status == .noContent)
            let root = rootRecord(alice)
            var doc = record(alice, .document, in: root.id, named: "notes.txt")
            let sealed = randomBytes(100)
            doc.contentDigest = blake2b(sealed)
            let manifest = PutManifestRequest(
                fileID: Data(doc.id.bytes), digest: Data(blake2b(sealed)), sealed: Data(sealed), chunkIDs: [chunkID])
            #expect(try await client.signedJSON(alice, .post, "/v1/manifests", manifest).status == .noContent)
            // Then metadata.
            let upsert = UpsertRequest(
                updates: [root, doc].map {
                    FileUpdate(record: alice.sign($0), expectedParent: nil, expectedNameMAC: nil)
                })
            let up = try await client.signedJSON(alice, .post, "/v1/files/upsert", upsert)
            #expect(up.status == .ok)
            let version = try up.json(UpsertResponse.self).version
            let updates = try await client.signedJSON(alice, .post, "/v1/updates", UpdatesRequest(since: 0))
            let page = try updates.json(UpdatesResponse.self)
            #expect(page.files.count == 2 && page.latest == version && !page.more)
            #expect(Set(page.files.map(\.record)) == Set(upsert.updates.map(\.record)))
            // The same upsert again is now stale (the files exist).
            let stale = try await client.signedJSON(alice, .post, "/v1/files/upsert", upsert)
            #expect(stale.status == .conflict && stale.errorCode == ErrorResponse.getUpdatesRequired)
            // Fetch content back.
            let m = try await client.signedJSON(
                alice, .post, "/v1/manifests/get",
                GetManifestRequest(fileID: Data(doc.id.bytes), digest: Data(blake2b(sealed))))
            #expect(m.status == .ok && m.bytes == sealed)
            let chunks = try await client.signedJSON(alice, .post, "/v1/chunks/get", ChunkIDsRequest(ids: [chunkID]))
            #expect(chunks.status == .ok && ChunkBundle.decode(chunks.bytes)?.first?.sealed == chunk)
            let usage = try await client.signed(alice, .get, "/v1/usage")
            let u = try usage.json(UsageResponse.self)
            #expect(u.files == 2 && u.bytes == 4096 + 256 + countedRows(alice, [root, doc]) && u.quotaBytes == 100_000)
            // Over quota.
            let huge = randomBytes(100_000)
            let over = try await client.signed(
                alice, .put, "/v1/chunks/\(RequestSigning.hex(blake2b(huge)))", body: huge)
            #expect(over.status == .contentTooLarge && over.errorCode == ErrorResponse.quotaExceeded)
            // Invariant violation over HTTP.
            let twin = record(alice, .folder, in: root.id, named: "notes.txt")
            let conflict = try await client.signedJSON(
                alice, .post, "/v1/files/upsert",
                UpsertRequest(updates: [FileUpdate(record: alice.sign(twin), expectedParent: nil, expectedNameMAC: nil)]
                ))
            #expect(conflict.status == .conflict && conflict.errorCode == ErrorResponse.invalidTree)

            // Bob sees none of it and can touch none of it.
            let bobUpdates = try await client.signedJSON(bob, .post, "/v1/updates", UpdatesRequest(since: 0))
            #expect(try bobUpdates.json(UpdatesResponse.self).files.isEmpty)
            let bobManifest = try await client.signedJSON(
                bob, .post, "/v1/manifests/get",
                GetManifestRequest(fileID: Data(doc.id.bytes), digest: Data(blake2b(sealed))))
            #expect(bobManifest.status == .notFound)
            let bobChunks = try await client.signedJSON(bob, .post, "/v1/chunks/get", ChunkIDsRequest(ids: [chunkID]))
            #expect(bobChunks.status == .notFound)
            let bobPut = try await client.signedJSON(
                bob, .post, "/v1/manifests",
                PutManifestRequest(
                    fileID: Data(doc.id.bytes), digest: Data(blake2b(sealed)), sealed: Data(sealed), chunkIDs: []))
            #expect(bobPut.status == .forbidden)
            var stolen = doc
            stolen.owner = bob.id
            stolen.lastModifiedBy = bob.id
            stolen.contentDigest = nil
            let bobRoot = rootRecord(bob)
            stolen.parent = bobRoot.id
            let bobUpsert = try await client.signedJSON(
                bob, .post, "/v1/files/upsert",
                UpsertRequest(
                    updates: [bobRoot, stolen].map {
                        FileUpdate(record: bob.sign($0), expectedParent: nil, expectedNameMAC: nil)
                    }))
            #expect(bobUpsert.status == .forbidden)
            // Alice's records signed by Alice but sent by Bob.
            let replayed = try await client.signedJSON(bob, .post, "/v1/files/upsert", upsert)
            #expect(replayed.status == .forbidden)
            let after = try await client.signedJSON(alice, .post, "/v1/updates", UpdatesRequest(since: 0))
            #expect(try after.json(UpdatesResponse.self).files == page.files)
        }
        #expect(try server.audit(account: alice.key).isEmpty)
    }
}
