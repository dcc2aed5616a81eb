import CofferCrypto
import CofferModel
import CofferProtocol
import CofferServerCore
import CofferServerHTTP
import Foundation
import HTTPTypes
import Hummingbird
import HummingbirdTesting
import Synchronization
import Testing

/// Remembers which accounts' nonces were recorded.
final class RecordingNonceStore: NonceStore {
    let inner = MemoryNonceStore()
    let accounts: Mutex<[Data]> = Mutex([])
    func insert(account: Data, nonce: String, expiresAt: Int64) throws -> Bool {
        accounts.withLock { $0.append(account) }
        return try inner.insert(account: account, nonce: nonce, expiresAt: expiresAt)
    }
    func purge(expiredBefore: Int64) throws { try inner.purge(expiredBefore: expiredBefore) }
}

/// A metadata store whose every call fails with text that must stay on the server.
struct FailingStorage: MetadataStorage {
    static let secret = "disk full at /srv/coffer/secret-path"
    func read<T>(_ body: (any MetadataReader) throws -> T) throws -> T { throw StorageError(Self.secret) }
    func write<T>(_ body: (any MetadataWriter) throws -> T) throws -> T { throw StorageError(Self.secret) }
}

final class Flag: Sendable {
    let state = Mutex(false)
    func set() { state.withLock { $0 = true } }
    var isSet: Bool { state.withLock { $0 } }
}

/// Polls `condition` until it holds or about `seconds` pass; for waiting on another thread,
/// never as a timing assertion (the bound only keeps a broken build from hanging).
func eventually(seconds: Int = 60, _ condition: () -> Bool) async -> Bool {
    for _ in 0..<(seconds * 20) {
        if condition() { return true }
        try? await Task.sleep(for: .milliseconds(50))
    }
    return condition()
}

@Suite struct HostileInputTests {
    static let fixedNow: Int64 = 1_790_000_000_000

    // MARK: 1. No trap on hostile numbers

    @Test func extremeTimestampsAreRefusedNotACrash() async throws {
        let (server, _) = try makeServer(clock: { HostileInputTests.fixedNow })
        let alice = TestUser()
        _ = try server.createAccount(caller: alice.key, alice.createRequest)
        let (app, _) = try makeApp(server: server)
        let now = Self.fixedNow
        // Int64.min + now made `abs(now - ts)` trap: now - ts overflows to exactly Int64.min.
        let hostile: [Int64] = [Int64.min + now, Int64.min, Int64.min + 1, Int64.max, now - Int64.max, -1, 0]
        try await app.test(.router) { client in
            for ts in hostile {
                let r = try await client.signed(alice, .get, "/v1/usage", timestamp: ts)
                #expect(r.status == .unauthorized && r.errorCode == ErrorResponse.unauthorized, "timestamp \(ts)")
            }
            for text in [
                "-9223372036854775808", "9223372036854775808", "99999999999999999999999", "+1", " 1", "1e3", "",
            ] {
                let r = try await client.signed(alice, .get, "/v1/usage", timestamp: now) {
                    $0[HTTPField.Name(RequestSigning.timestampHeader)!] = text
                }
                #expect(r.status == .unauthorized, "timestamp header \(text)")
            }
            let fine = try await client.signed(alice, .get, "/v1/usage", timestamp: now)
            #expect(fine.status == .ok)
        }
        // And through the core entry point.
        expectRefusal(401, ErrorResponse.unauthorized) {
            let headers = Dictionary(
                uniqueKeysWithValues: RequestSigning.headers(
                    keys: alice.keys, server: server.identity, method: "GET", path: "/v1/usage", body: [],
                    timestamp: Int64.min + now))
            _ = try server.authenticate(
                method: "GET", path: "/v1/usage", body: [], account: headers[RequestSigning.accountHeader],
                timestamp: headers[RequestSigning.timestampHeader], nonce: headers[RequestSigning.nonceHeader],
                signature: headers[RequestSigning.signatureHeader])
        }
    }

    // MARK: 2. Limits, and no account waits for another's write

    @Test func batchesPastTheLimitsAreRefused() throws {
        let (server, _) = try makeServer()
        let alice = TestUser()
        let device = try Device(server, alice)
        let root = rootRecord(alice)
        try device.push([root])
        // Too many records: refused before any is decoded.
        let tooMany = UpsertRequest(
            updates: Array(
                repeating: FileUpdate(record: Data([1]), expectedParent: nil, expectedNameMAC: nil),
                count: TreeLimits.maxRecordsPerBatch + 1))
        expectRefusal(413, ErrorResponse.tooLarge) { _ = try server.upsert(caller: alice.key, tooMany) }
        // Too deep: a chain one level past the limit.
        var chain: [FileMetadata] = []
        var parent = root.id
        for i in 0...TreeLimits.maxDepth {
            let f = record(alice, .folder, in: parent, named: "d\(i)")
            chain.append(f)
            parent = f.id
        }
        expectRefusal(409, ErrorResponse.invalidTree) { try device.push(chain) }
        // At the limit it is accepted.
        try device.push(Array(chain.dropLast()))
        #expect(try device.all().count == TreeLimits.maxDepth + 1)
    }

    /// Account A's write transaction is held open (the closure blocks on a semaphore); account
    /// B must still authenticate and read its usage. Before the nonce store was separate, B's
    /// authentication queued behind A's transaction.
    @Test func anotherAccountsWriteDoesNotBlockAuthentication() async throws {
        let (server, _) = try makeServer()
        let alice = TestUser()
        let bob = TestUser()
        _ = try server.createAccount(caller: alice.key, alice.createRequest)
        _ = try server.createAccount(caller: bob.key, bob.createRequest)
        let (app, _) = try makeApp(server: server)
        let entered = DispatchSemaphore(value: 0)
        let release = DispatchSemaphore(value: 0)
        let writer = Thread {
            _ = try? server.metadata.write { tx -> Bool in
                _ = try tx.lockAccount(key: alice.key)
                entered.signal()
                release.wait()
                return true
            }
        }
        writer.start()
        entered.wait()
        let done = Flag()
        try await app.test(.router) { client in
            let usage = Task {
                defer { done.set() }
                return try await client.signed(bob, .get, "/v1/usage")
            }
            let finishedWhileHeld = await eventually { done.isSet }
            #expect(finishedWhileHeld, "bob's request waited for alice's write transaction")
            release.signal()
            let r1 = try await usage.value
            #expect(r1.status == .ok)
        }
    }

    // MARK: 11. Smaller holes

    @Test func keysWithoutAnAccountRecordNoNonces() async throws {
        let dir = tempDirectory()
        let nonces = RecordingNonceStore()
        let server = CofferServer(
            metadata: try SQLiteMetadataStorage(path: dir.appendingPathComponent("m.sqlite").path),
            content: try DirectoryContentStorage(
                root: dir.appendingPathComponent("chunks"), tmp: dir.appendingPathComponent("tmp")),
            nonces: nonces)
        let (app, _) = try makeApp(server: server)
        let stranger = TestUser()
        let alice = TestUser()
        try await app.test(.router) { client in
            for path in ["/v1/usage", "/v1/accounts/alice"] {
                let r2 = try await client.signed(stranger, .get, path)
                #expect(r2.status == .unauthorized)
            }
            let r3 = try await client.signedJSON(stranger, .post, "/v1/updates", UpdatesRequest(since: 0))
            #expect(r3.status == .unauthorized)
            #expect(nonces.accounts.withLock { $0.isEmpty }, "a key without an account left nonce rows")
            // Account creation is the one request a new key may sign; then the key has an account.
            let r4 = try await client.signedJSON(alice, .post, "/v1/accounts", alice.createRequest)
            #expect(r4.status == .ok)
            let r5 = try await client.signed(alice, .get, "/v1/usage")
            #expect(r5.status == .ok)
            #expect(nonces.accounts.withLock { $0 } == [alice.key, alice.key])
        }
    }

    @Test func malformedAccountRequestsCostNoRateLimitToken() async throws {
        let (app, _) = try makeApp(accountsPerMinute: 2)
        try await app.test(.router) { client in
            let u = TestUser()
            let malformed: [CreateAccountRequest] = [
                CreateAccountRequest(username: "has space", signingKey: u.key, boxKey: u.boxKey),
                CreateAccountRequest(username: "", signingKey: u.key, boxKey: u.boxKey),
                CreateAccountRequest(username: String(repeating: "x", count: 65), signingKey: u.key, boxKey: u.boxKey),
                CreateAccountRequest(username: "ok", signingKey: u.key, boxKey: Data([1, 2])),
                CreateAccountRequest(username: "ok", signingKey: TestUser().key, boxKey: u.boxKey),
            ]
            for req in malformed {
                let r = try await client.signedJSON(u, .post, "/v1/accounts", req)
                #expect(r.status == .badRequest || r.status == .forbidden, "\(req.username)")
            }
            let r6 = try await client.signed(u, .post, "/v1/accounts", body: Array("{".utf8))
            #expect(r6.status == .badRequest)
            var statuses: [HTTPResponse.Status] = []
            for _ in 0..<3 {
                let v = TestUser()
                statuses.append(try await client.signedJSON(v, .post, "/v1/accounts", v.createRequest).status)
            }
            #expect(statuses == [.ok, .ok, .tooManyRequests])
        }
    }

    @Test func usernamesAreOneAccountWhateverTheirCaseOrForm() async throws {
        #expect(Username.key("val") == Username.key("Val") && Username.key("val") == Username.key("VAL"))
        #expect(Username.key("ｖａｌ") == Username.key("val"), "full-width letters are the same name")
        #expect(Username.key("straße") == Username.key("STRASSE"))
        #expect(Username.normalized("Ａｌｉｃｅ") == "Alice")
        #expect(Username.normalized("e\u{301}lodie") == "\u{e9}lodie")
        for bad in [
            "", "a b", "tab\t", "new\nline", "\u{301}accent-first", "slash/", String(repeating: "é", count: 33),
        ] {
            #expect(Username.normalized(bad) == nil, "\(bad.debugDescription)")
        }
        let (server, _) = try makeServer()
        let val = TestUser("val")
        _ = try server.createAccount(caller: val.key, val.createRequest)
        for other in ["Val", "VAL", "ｖａｌ"] {
            let u = TestUser(other)
            expectRefusal(409, ErrorResponse.conflict) { _ = try server.createAccount(caller: u.key, u.createRequest) }
            #expect(try server.lookup(username: other).signingKey == val.key)
        }
        let elodie = TestUser("E\u{301}lodie")
        #expect(try server.createAccount(caller: elodie.key, elodie.createRequest).username == "\u{c9}lodie")
        #expect(try server.lookup(username: "\u{e9}LODIE").signingKey == elodie.key)
    }

    @Test func theServersFilesArePrivate() throws {
        let (server, dir) = try makeServer()
        let alice = TestUser()
        _ = try server.createAccount(caller: alice.key, alice.createRequest)
        func mode(_ path: String) -> Int? {
            (try? FileManager.default.attributesOfItem(atPath: path))?[.posixPermissions] as? Int
        }
        #expect(mode(dir.path) == 0o700)
        var checked = 0
        for name in ["metadata.sqlite", "nonces.sqlite"] {
            for suffix in ["", "-wal", "-shm"] {
                let path = dir.appendingPathComponent(name + suffix).path
                guard let m = mode(path) else { continue }
                #expect(m == 0o600, "\(name + suffix) is \(String(m, radix: 8))")
                checked += 1
            }
        }
        #expect(checked >= 2)
    }

    @Test func errorsDoNotTellWhetherAnotherAccountHasAFileID() throws {
        let (server, _) = try makeServer()
        let alice = try Device(server, TestUser())
        let bob = try Device(server, TestUser())
        let aliceRoot = rootRecord(alice.user)
        let bobRoot = rootRecord(bob.user)
        try alice.push([aliceRoot])
        try bob.push([bobRoot])
        let secret = record(alice.user, .folder, in: aliceRoot.id, named: "private")
        try alice.push([secret])
        // With a precondition, alice's id and an id nobody has get the same answer.
        func refusal(_ body: () throws -> Void) -> ServerError? {
            do {
                try body()
                return nil
            } catch let e as ServerError { return e } catch { return nil }
        }
        let missingID = newFileID()
        func attempt(_ id: FileID) -> ServerError? {
            let m = record(bob.user, .folder, in: bobRoot.id, named: "x", id: id)
            let u = FileUpdate(
                record: bob.user.sign(m), expectedParent: Data(bobRoot.id.bytes),
                expectedNameMAC: Data(sealedName("x").mac))
            return refusal { _ = try server.upsert(caller: bob.user.key, UpsertRequest(updates: [u])) }
        }
        let foreign = attempt(secret.id)
        let missing = attempt(missingID)
        #expect(foreign?.status == missing?.status && foreign?.code == missing?.code)
        #expect(
            foreign?.message.replacingOccurrences(of: secret.id.description, with: "ID")
                == missing?.message.replacingOccurrences(of: missingID.description, with: "ID"))
        // Without one, the id cannot be used, and the text says no more than that.
        let taken = refusal { try bob.push([record(bob.user, .folder, in: bobRoot.id, named: "y", id: secret.id)]) }
        let manifest = refusal {
            _ = try bob.putContent(secret.id, chunks: [[1, 2, 3]])
        }
        for e in [taken, manifest] {
            #expect(e?.status == 403)
            #expect(
                e.map { !$0.message.contains("another account") && !$0.message.contains("belongs") } ?? false,
                "\(String(describing: e))")
        }
        #expect(taken?.message == manifest?.message)
    }

    @Test func internalErrorsKeepStorageTextOnTheServer() async throws {
        let dir = tempDirectory()
        let server = CofferServer(
            metadata: FailingStorage(),
            content: try DirectoryContentStorage(
                root: dir.appendingPathComponent("chunks"), tmp: dir.appendingPathComponent("tmp")))
        let (app, _) = try makeApp(server: server)
        let alice = TestUser()
        try await app.test(.router) { client in
            for r in [
                try await client.signed(alice, .get, "/v1/usage"),
                try await client.signedJSON(alice, .post, "/v1/accounts", alice.createRequest),
            ] {
                #expect(r.status == .internalServerError)
                let text = String(buffer: r.body)
                #expect(!text.contains("secret-path") && !text.contains("disk full"), "\(text)")
            }
        }
        expectRefusal(500) { _ = try server.usage(caller: alice.key) }
        do { _ = try server.usage(caller: alice.key) } catch {
            #expect(!error.message.contains("secret-path"))
            #expect(error.detail?.contains("secret-path") == true, "the detail is kept for the log")
        }
    }
}
