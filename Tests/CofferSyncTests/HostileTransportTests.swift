import CofferCrypto
import CofferModel
import CofferSync
import CofferTestSupport
import CofferVault
import Foundation
import Synchronization
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// A fake server on a loopback port, speaking just enough HTTP/1.1 to answer each request with
/// what the test says, in the hostile ways a real server must never get away with.
final class FakeServer: @unchecked Sendable {
    enum Reply: Sendable {
        /// A whole reply, closed after.
        case full(status: Int, body: [UInt8], contentLength: Bool = true)
        /// The head (declaring `declaredLength` body bytes), then one body byte every `interval` seconds.
        case trickle(declaredLength: Int, interval: Double)
    }

    let port: Int
    private let listener: Int32
    private let stopped = Atomic<Bool>(false)
    private let handler: @Sendable (_ method: String, _ path: String) -> Reply
    let requests = Mutex<[String]>([])

    var url: String { "http://127.0.0.1:\(port)" }

    init(_ handler: @escaping @Sendable (_ method: String, _ path: String) -> Reply) throws {
        signal(SIGPIPE, SIG_IGN)
        self.handler = handler
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw TestFailure("socket: \(errno)") }
        var one: Int32 = 1
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
        var addr = sockaddr_in()
        addr.sin_family = sa_family_t(AF_INET)
        addr.sin_addr.s_addr = inet_addr("127.0.0.1")
        addr.sin_port = 0
        var len = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafePointer(to: &addr) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, len) }
        }
        guard bound == 0, listen(fd, 64) == 0 else {
            close(fd)
            throw TestFailure("bind/listen: \(errno)")
        }
        _ = withUnsafeMutablePointer(to: &addr) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &len) }
        }
        listener = fd
        port = Int(UInt16(bigEndian: addr.sin_port))
        Thread.detachNewThread { [self] in acceptLoop() }
    }

    private func acceptLoop() {
        while !stopped.load(ordering: .relaxed) {
            let c = accept(listener, nil, nil)
            if c < 0 { if errno == EINTR { continue } else { return } }
            _ = fcntl(c, F_SETFD, FD_CLOEXEC)
            Thread.detachNewThread { [self] in serve(c) }
        }
    }

    private func serve(_ fd: Int32) {
        defer { close(fd) }
        var buffer: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 65536)
        // The head, then the body by Content-Length (requests here are small).
        var headEnd: Int?
        while headEnd == nil {
            let n = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress, 65536, 0) }
            if n <= 0 { return }
            buffer += chunk[0..<n]
            if let r = findHeadEnd(buffer) { headEnd = r }
        }
        guard let end = headEnd else { return }
        let head = String(decoding: buffer[0..<end], as: UTF8.self)
        let lines = head.components(separatedBy: "\r\n")
        let parts = (lines.first ?? "").split(separator: " ")
        guard parts.count >= 2 else { return }
        let length =
            lines.compactMap { line -> Int? in
                let kv = line.split(separator: ":", maxSplits: 1)
                guard kv.count == 2, kv[0].lowercased() == "content-length" else { return nil }
                return Int(kv[1].trimmingCharacters(in: .whitespaces))
            }.first ?? 0
        while buffer.count - (end + 4) < length {
            let n = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress, 65536, 0) }
            if n <= 0 { return }
            buffer += chunk[0..<n]
        }
        let (method, path) = (String(parts[0]), String(parts[1]))
        requests.withLock { $0.append("\(method) \(path)") }
        // Its id, as every server tells it before a client signs anything.
        let reply: Reply =
            method == "GET" && path == "/v1/server"
            ? .full(status: 200, body: Array(#"{"id":"ZmFrZS1zZXJ2ZXItaWQxNg=="}"#.utf8)) : handler(method, path)
        switch reply {
        case .full(let status, let body, let contentLength):
            var out = "HTTP/1.1 \(status) X\r\nContent-Type: application/json\r\nConnection: close\r\n"
            if contentLength { out += "Content-Length: \(body.count)\r\n" }
            _ = sendAll(fd, Array((out + "\r\n").utf8) + body)
        case .trickle(let declared, let interval):
            let out =
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: "
                + "\(declared)\r\n\r\n"
            guard sendAll(fd, Array(out.utf8)) else { return }
            for _ in 0..<declared {
                if stopped.load(ordering: .relaxed) { return }
                usleep(UInt32(interval * 1_000_000))
                guard sendAll(fd, [0x20]) else { return }  // the client gave up and closed
            }
        }
    }

    private func findHeadEnd(_ b: [UInt8]) -> Int? {
        guard b.count >= 4 else { return nil }
        for i in 0...(b.count - 4) where b[i] == 13 && b[i + 1] == 10 && b[i + 2] == 13 && b[i + 3] == 10 { return i }
        return nil
    }

    private func sendAll(_ fd: Int32, _ bytes: [UInt8]) -> Bool {
        var off = 0
        while off < bytes.count {
            let n = bytes.withUnsafeBytes { send(fd, $0.baseAddress! + off, bytes.count - off, Int32(MSG_NOSIGNAL)) }
            if n <= 0 { return false }
            off += n
        }
        return true
    }

    func stop() {
        stopped.store(true, ordering: .relaxed)
        shutdown(listener, Int32(SHUT_RDWR))
        close(listener)
    }

    deinit { if !stopped.load(ordering: .relaxed) { stop() } }
}

/// Runs `body`, failing (instead of hanging the test run) if it has not finished after `seconds`.
/// Not a timing assertion: the bound is many times what the client's own deadline allows, and
/// is reached only when the client hangs.
func failingIfHung<T: Sendable>(
    after seconds: UInt64, _ body: @escaping @Sendable () async throws -> T
) async throws -> T {
    try await withThrowingTaskGroup(of: T?.self) { group in
        group.addTask { try await body() }
        group.addTask {
            try await Task.sleep(nanoseconds: seconds * 1_000_000_000)
            return nil
        }
        defer { group.cancelAll() }
        guard let first = try await group.next(), let result = first else {
            throw TestFailure("still running after \(seconds) s: the client hangs")
        }
        return result
    }
}

/// A device of a new account whose server is `url`, with a transport whose deadline is short.
func hostileDevice(
    _ tmp: TemporaryDirectory, _ url: String, maxResponseBytes: Int = 256 * 1024 * 1024
) throws -> (Vault, SyncEngine) {
    let vault = try Vault.create(dataDirectory: tmp.sub("device"), username: "victim", secret: AccountSecret.generate())
    try vault.setServer(url)
    let transport = HTTPTransport(baseURL: url, timeout: .seconds(2), maxResponseBytes: maxResponseBytes)
    return (vault, SyncEngine(vault: vault, transport: transport))
}

func hasControlCharacters(_ s: String) -> Bool {
    s.unicodeScalars.contains { $0.value < 0x20 || (0x7F...0x9F).contains($0.value) }
}

/// Issue 19, defect 9: a hostile server can make the client stop with an error, never hang it
/// or write to its terminal.
@Suite struct HostileTransportTests {
    @Test func updatesThatAlwaysSayMoreWithTheSameCursorEndInAnError() async throws {
        let tmp = TemporaryDirectory("coffer-hostile")
        let server = try FakeServer { _, path in
            path.hasSuffix("/updates")
                ? .full(status: 200, body: Array(#"{"files":[],"latest":5,"more":true}"#.utf8))
                : .full(status: 404, body: [])
        }
        defer { server.stop() }
        let (vault, engine) = try hostileDevice(tmp, server.url)
        let outcome: Result<SyncReport, any Error> = try await failingIfHung(after: 60) {
            do { return .success(try await engine.sync()) } catch { return .failure(error) }
        }
        guard case .failure(let error) = outcome else {
            Issue.record("the sync succeeded against a looping server")
            return
        }
        #expect("\(error)".contains("keeps saying there are more updates without sending any new record"), "\(error)")
        // It stopped after a handful of requests, not thousands.
        #expect(server.requests.withLock { $0.count } < 10)
        #expect(vault.syncStatus.lastError != nil)
    }

    @Test func updatesThatKeepSendingUnsignedRecordsEndInAnError() async throws {
        let tmp = TemporaryDirectory("coffer-hostile")
        let pages = Atomic<Int>(0)
        let stranger = try AccountID(bytes: [UInt8](repeating: 7, count: 32))
        // Every page a new record and a cursor that moves on, but no record the account signed.
        let server = try FakeServer { _, path in
            guard path.hasSuffix("/updates") else { return .full(status: 404, body: []) }
            let n = pages.add(1, ordering: .relaxed).newValue
            let id = (try? FileID(random: (0..<16).map { _ in UInt8.random(in: 0...255) })) ?? FileID.none
            let forged = SignedMetadata(
                metadata: FileMetadata(
                    id: id, type: .folder, parent: id, name: SealedName(ciphertext: [1], mac: [2]),
                    owner: stranger,
                    wrappedKey: [], sealedAttributes: [3],
                    lastModifiedBy: stranger),
                signature: [UInt8](repeating: 9, count: 64))
            let record = Data(forged.encoded()).base64EncodedString()
            let file = #"{"record":"\#(record)","version":\#(n),"contentVersion":\#(n),"serverDeleted":false}"#
            let json = #"{"files":[\#(file)],"latest":\#(n),"more":true}"#
            return .full(status: 200, body: Array(json.utf8))
        }
        defer { server.stop() }
        let (_, engine) = try hostileDevice(tmp, server.url)
        let outcome: Result<SyncReport, any Error> = try await failingIfHung(after: 60) {
            do { return .success(try await engine.sync()) } catch { return .failure(error) }
        }
        guard case .failure(let error) = outcome else {
            Issue.record("the sync succeeded against a looping server")
            return
        }
        // Every page is verified as it arrives: the first forged record ends the pull.
        #expect("\(error)".contains("owned by another account"), "\(error)")
        #expect(pages.load(ordering: .relaxed) == 1)
    }

    /// Records of the device's own tree, each validly signed by an account the server made up,
    /// in folders the device never saw: they may wait for a later page (a folder made in the
    /// same change), but no more than one change's worth, so the pull ends early.
    @Test func recordsByMadeUpWritersDoNotPileUp() async throws {
        let tmp = TemporaryDirectory("coffer-hostile")
        let pages = Atomic<Int>(0)
        let victim = Mutex<AccountID?>(nil)
        let stranger = AccountSecret.generate().signingKeys
        let strangerID = try AccountID(bytes: stranger.publicKey.bytes)
        let server = try FakeServer { _, path in
            guard path.hasSuffix("/updates"), let owner = victim.withLock({ $0 }) else {
                return .full(status: 404, body: [])
            }
            let n = pages.add(1, ordering: .relaxed).newValue
            var files: [String] = []
            for _ in 0..<1000 {
                let id = (try? FileID(random: (0..<16).map { _ in UInt8.random(in: 0...255) })) ?? FileID.none
                let parent = (try? FileID(random: (0..<16).map { _ in UInt8.random(in: 0...255) })) ?? FileID.none
                let m = FileMetadata(
                    id: id, type: .folder, parent: parent, name: SealedName(ciphertext: [1], mac: [2]), owner: owner,
                    wrappedKey: [4], sealedAttributes: [3], lastModifiedBy: strangerID)
                let forged = SignedMetadata(
                    metadata: m, revision: 1, signature: stranger.sign(SignedMetadata.message(metadata: m, revision: 1))
                )
                let record = Data(forged.encoded()).base64EncodedString()
                files.append(#"{"record":"\#(record)","version":\#(n),"contentVersion":\#(n),"serverDeleted":false}"#)
            }
            let json = #"{"files":[\#(files.joined(separator: ","))],"latest":\#(n),"more":true}"#
            return .full(status: 200, body: Array(json.utf8))
        }
        defer { server.stop() }
        let (vault, engine) = try hostileDevice(tmp, server.url)
        victim.withLock { $0 = vault.accountID }
        let outcome: Result<SyncReport, any Error> = try await failingIfHung(after: 120) {
            do { return .success(try await engine.sync()) } catch { return .failure(error) }
        }
        guard case .failure(let error) = outcome else {
            Issue.record("the sync succeeded against a server of made-up writers")
            return
        }
        #expect("\(error)".contains("more records written by other accounts than one change can hold"), "\(error)")
        #expect(pages.load(ordering: .relaxed) == TreeLimits.maxRecordsPerBatch / 1000 + 1)
    }

    @Test func aTrickledBodyEndsInATimeout() async throws {
        let tmp = TemporaryDirectory("coffer-hostile")
        let server = try FakeServer { _, _ in .trickle(declaredLength: 1000, interval: 1) }
        defer { server.stop() }
        let (_, engine) = try hostileDevice(tmp, server.url)
        let outcome: Result<SyncReport, any Error> = try await failingIfHung(after: 60) {
            do { return .success(try await engine.sync()) } catch { return .failure(error) }
        }
        guard case .failure(let error) = outcome else {
            Issue.record("the sync succeeded against a trickling server")
            return
        }
        #expect("\(error)".contains("no complete reply"), "\(error)")
    }

    @Test func aReplyLargerThanTheLimitIsNotReadToTheEnd() async throws {
        let tmp = TemporaryDirectory("coffer-hostile")
        // No Content-Length: the limit must hold while the body streams.
        let big = [UInt8](repeating: 0x20, count: 8 * 1024 * 1024)
        let server = try FakeServer { _, _ in .full(status: 200, body: big, contentLength: false) }
        defer { server.stop() }
        let (_, engine) = try hostileDevice(tmp, server.url, maxResponseBytes: 64 * 1024)
        let outcome: Result<SyncReport, any Error> = try await failingIfHung(after: 60) {
            do { return .success(try await engine.sync()) } catch { return .failure(error) }
        }
        guard case .failure(let error) = outcome else {
            Issue.record("the sync accepted an oversized reply")
            return
        }
        #expect("\(error)".contains("larger than 65536 bytes"), "\(error)")
    }

    static let escapes =
        "\u{1b}[2J\u{1b}]0;pwned\u{07}server says hi\u{9b}31m!\u{1b}P1;2|secret\u{1b}\\\r\nsecond line\u{7f}\u{202e}"

    @Test(arguments: [true, false])
    func escapeSequencesInServerErrorsNeverReachTheTerminalOrStatus(asJSON: Bool) async throws {
        let tmp = TemporaryDirectory("coffer-hostile")
        let body: [UInt8]
        if asJSON {
            // JSON escapes decode to the raw control characters.
            let encoded = try JSONEncoder().encode([
                "code": "bad\u{1b}[31mcode", "message": Self.escapes + String(repeating: "A", count: 5000),
            ])
            body = [UInt8](encoded)
        } else {
            body = Array(Self.escapes.utf8)
        }
        let server = try FakeServer { _, _ in .full(status: 400, body: body) }
        defer { server.stop() }
        let (vault, engine) = try hostileDevice(tmp, server.url)
        let outcome: Result<SyncReport, any Error> = try await failingIfHung(after: 60) {
            do { return .success(try await engine.sync()) } catch { return .failure(error) }
        }
        guard case .failure(let error) = outcome else {
            Issue.record("the sync succeeded against a refusing server")
            return
        }
        let message = "\(error)"
        #expect(!hasControlCharacters(message), "\(message.debugDescription)")
        #expect(message.contains("server says hi!"), "\(message.debugDescription)")
        #expect(!message.contains("pwned") && !message.contains("secret"))
        #expect(message.count < 500, "\(message.count) characters")
        let recorded = try #require(vault.syncStatus.lastError)
        #expect(!hasControlCharacters(recorded), "\(recorded.debugDescription)")

        // The real binary: what `coffer sync` prints and what `coffer status` shows.
        let sync = coffer(vault.dataDirectory, ["sync"])
        #expect(sync.status == 1)
        #expect(sync.err.contains("server says hi!"), "\(sync.err.debugDescription)")
        #expect(!sync.stderr.dropLast().contains { $0 < 0x20 || $0 == 0x7F }, "\(sync.err.debugDescription)")
        let status = coffer(vault.dataDirectory, ["status"])
        #expect(status.out.contains("last attempt failed"), "\(status.out)")
        #expect(!status.stdout.contains { ($0 < 0x20 && $0 != 0x0A) || $0 == 0x7F }, "\(status.out.debugDescription)")
        #expect(!hasControlCharacters(status.out.replacingOccurrences(of: "\n", with: " ")))
    }

    @Test func sanitizedServerTextKeepsPlainTextAndCapsLength() {
        #expect(ServerText.sanitized("file not found: ü ✓") == "file not found: ü ✓")
        #expect(ServerText.sanitized("a\tb\nc") == "a b c")
        #expect(ServerText.sanitized("\u{1b}[1;31mred\u{1b}[0m") == "red")
        #expect(ServerText.sanitized("\u{1b}]8;;http://evil\u{1b}\\link\u{1b}]8;;\u{1b}\\") == "link")
        #expect(ServerText.sanitized("x\u{1b}") == "x")
        #expect(ServerText.sanitized(String(repeating: "z", count: 1000)).count == 301)
    }
}
