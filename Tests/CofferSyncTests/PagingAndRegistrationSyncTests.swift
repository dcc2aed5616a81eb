import CofferCrypto
import CofferModel
import CofferProtocol
import CofferSync
import CofferTestSupport
import CofferVault
import Foundation
import Synchronization
import Testing

/// A real transport that notes the size of every updates page it carries.
final class PageRecordingTransport: ServerTransport {
    let inner: HTTPTransport
    let pages = Mutex<[Int]>([])

    init(inner: HTTPTransport) { self.inner = inner }

    func send(
        method: String, path: String, headers: [(String, String)], body: [UInt8], contentType: String
    ) async throws -> (status: Int, body: [UInt8]) {
        let reply = try await inner.send(
            method: method, path: path, headers: headers, body: body, contentType: contentType)
        if path.hasSuffix("/updates"),
            let page = try? JSONDecoder().decode(UpdatesResponse.self, from: Data(reply.body))
        {
            pages.withLock { $0.append(page.files.count) }
        }
        return reply
    }

    func reachable(timeout: Double) -> Bool { inner.reachable(timeout: timeout) }
}

/// A hostile server whose updates always say "more" without moving the cursor.
final class StuckCursorTransport: ServerTransport {
    let requests = Atomic<Int>(0)

    func send(
        method: String, path: String, headers: [(String, String)], body: [UInt8], contentType: String
    ) async throws -> (status: Int, body: [UInt8]) {
        if path == API.prefix + "/server" {
            return (200, Array(try JSONEncoder().encode(ServerInfoResponse(id: Data(repeating: 7, count: 16)))))
        }
        // Bounded, so a client that loops fails this test instead of hanging it.
        guard requests.add(1, ordering: .relaxed).newValue <= 50 else { return (503, []) }
        guard path.hasSuffix("/updates") else { return (404, []) }
        let request = try JSONDecoder().decode(UpdatesRequest.self, from: Data(body))
        let reply = UpdatesResponse(files: [], latest: request.since, more: true, nextAfterID: request.afterID)
        return (200, Array(try JSONEncoder().encode(reply)))
    }

    func reachable(timeout: Double) -> Bool { true }
}

@Suite(.serialized) struct PagingAndRegistrationSyncTests {
    /// Deleting a folder of 12,000 files gives all of them one version on the server; a second
    /// device still syncs it, in pages no larger than the limit.
    @Test func aDeletedFolderLargerThanAPageSyncsInBoundedPages() async throws {
        let w = try await SyncWorld()
        let folder = try w.a.vault.makeFolders("/big")
        for i in 0..<12_000 { try w.a.vault.create(in: folder.id, name: "f\(i)", type: .document, mode: 0o644) }
        try await w.sync(w.a, w.b)
        #expect(try w.b.ls("/big").count == 12_000)
        try w.a.rm("/big")
        try await w.a.sync()
        let transport = PageRecordingTransport(inner: HTTPTransport(baseURL: w.server.url))
        let engine = SyncEngine(vault: w.b.vault, transport: transport)
        let report = try await engine.sync()
        let pages = transport.pages.withLock { $0 }
        #expect(report.pulled >= 12_001)
        #expect(pages.allSatisfy { $0 <= API.updatesPageSize }, "pages: \(pages)")
        #expect(pages.count >= 3)
        #expect(!w.b.exists("/big"))
        try await w.expectConverged()
    }

    /// `more` with a cursor that does not move ends the sync with an error, not a loop.
    @Test func aServerWhoseCursorDoesNotAdvanceIsRefused() async throws {
        let tmp = TemporaryDirectory("coffer-sync-stuck")
        let vault = try Vault.create(
            dataDirectory: tmp.sub("device"), username: "stuck", secret: AccountSecret.generate(), createRoot: false)
        let transport = StuckCursorTransport()
        let engine = SyncEngine(vault: vault, transport: transport)
        do {
            try await engine.sync()
            Issue.record("a sync against a stuck cursor finished")
        } catch let e as SyncError {
            #expect("\(e)".contains("did not advance"), "\(e)")
        }
        #expect(transport.requests.load(ordering: .relaxed) <= 2)
    }

    /// `--registration invite`: accounts need a code from `coffer-server invite`, each code works
    /// once; `closed` refuses everyone.
    @Test func inviteAndClosedRegistration() async throws {
        let tmp = TemporaryDirectory("coffer-sync-invite")
        let server = try ServerProcess(dataDirectory: tmp.sub("server"), extraArguments: ["--registration", "invite"])
        let made = run(server.binary, ["invite", "--data", server.dataDirectory, "--count", "3"])
        #expect(made.status == 0, "\(made.err)")
        let codes = made.out.split(separator: "\n").map(String.init)
        #expect(codes.count == 3)
        func engine(_ name: String) throws -> SyncEngine {
            let vault = try Vault.create(dataDirectory: tmp.sub(name), username: name, secret: AccountSecret.generate())
            try vault.setServer(server.url)
            return SyncEngine(vault: vault, transport: HTTPTransport(baseURL: server.url))
        }
        func refusal(_ body: () async throws -> Void) async -> Int? {
            do {
                try await body()
                return nil
            } catch let SyncError.server(status, _, _) { return status } catch { return -1 }
        }
        let first = try engine("first")
        #expect(await refusal { try await first.register() } == 403)
        #expect(await refusal { try await first.register(invite: "0123456789abcdef0123456789abcdef") } == 403)
        try await first.register(invite: codes[0])
        try await first.sync()
        let second = try engine("second")
        #expect(await refusal { try await second.register(invite: codes[0]) } == 403)
        try await second.register(invite: codes[1])
        // The CLI sends a code with `coffer init --invite`.
        let cli = ["init", "third", "--server", server.url, "--data-dir"]
        #expect(run(cofferBinary, cli + [tmp.path + "/cli-without"]).status != 0)
        let joined = run(cofferBinary, cli + [tmp.path + "/cli", "--invite", codes[2]])
        #expect(joined.status == 0, "\(joined.err)")

        // The same data, served closed: nobody new, existing accounts still sync.
        server.stop()
        let closed = try ServerProcess(
            dataDirectory: server.dataDirectory, extraArguments: ["--registration", "closed"])
        let more = run(closed.binary, ["invite", "--data", closed.dataDirectory])
        let third = try engine("third")
        let thirdEngine = SyncEngine(vault: third.vault, transport: HTTPTransport(baseURL: closed.url))
        #expect(
            await refusal {
                try await thirdEngine.register(invite: more.out.trimmingCharacters(in: .whitespacesAndNewlines))
            } == 403)
        try await SyncEngine(vault: first.vault, transport: HTTPTransport(baseURL: closed.url)).sync()
        // A bad policy is refused at start.
        let bad = run(server.binary, ["--data", tmp.sub("other"), "--registration", "sometimes"])
        #expect(bad.status != 0)
    }
}

/// A hostile server whose watches always answer "changed", at once, with a newer version each
/// time, though nothing changed.
final class AlwaysChangedTransport: ServerTransport {
    let watches = Atomic<Int>(0)
    let version = Atomic<Int64>(0)

    func send(
        method: String, path: String, headers: [(String, String)], body: [UInt8], contentType: String
    ) async throws -> (status: Int, body: [UInt8]) {
        if path == API.prefix + "/server" {
            return (200, Array(try JSONEncoder().encode(ServerInfoResponse(id: Data(repeating: 7, count: 16)))))
        }
        guard path == API.prefix + "/watch" else { return (404, []) }
        watches.add(1, ordering: .relaxed)
        let v = version.add(1, ordering: .relaxed).newValue
        let reply = WatchResponse(changed: true, latest: v, feedLatest: 0, contactsRevision: 0)
        return (200, Array(try JSONEncoder().encode(reply)))
    }

    func reachable(timeout: Double) -> Bool { true }
}

@Suite struct LiveChannelTests {
    /// Its answers start a sync each (`onChange`), but the device's own cursors do not move, so
    /// the channel waits longer and longer before asking again: a few watches in three seconds,
    /// not thousands.
    @Test func aServerThatAlwaysSaysChangedCannotKeepTheDeviceBusy() async throws {
        let tmp = TemporaryDirectory("coffer-live-hostile")
        let vault = try Vault.create(dataDirectory: tmp.sub("device"), username: "hostile", secret: .generate())
        let transport = AlwaysChangedTransport()
        let told = Atomic<Int>(0)
        let channel = LiveChannel(
            engine: SyncEngine(vault: vault, transport: transport), onChange: { _ in told.add(1, ordering: .relaxed) })
        channel.start()
        try await Task.sleep(for: .seconds(3))
        channel.stop()
        let watches = transport.watches.load(ordering: .relaxed)
        #expect(watches >= 2 && watches <= 6, "\(watches) watches in 3 s")
        #expect(told.load(ordering: .relaxed) >= 2)
    }
}
