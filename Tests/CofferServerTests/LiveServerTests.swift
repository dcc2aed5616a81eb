import CofferCrypto
import CofferProtocol
import CofferServerCore
import CofferServerHTTP
import Foundation
import Hummingbird
import Logging
import Synchronization
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// A raw TCP connection to 127.0.0.1, for what an HTTP client will not do: stay idle, send half
/// a request head, announce a body and never send it.
final class RawConnection: @unchecked Sendable {
    let fd: Int32

    /// Connects; reads give up after `receiveTimeout` seconds (a bound against hanging, not a
    /// timing assertion).
    init?(port: Int, receiveTimeout: Int = 120) {
        let s = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard s >= 0 else { return nil }
        var tv = timeval(tv_sec: receiveTimeout, tv_usec: 0)
        setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
        var addr = sockaddr_in()
        addr.sin_family = sa_family_t(AF_INET)
        addr.sin_port = in_port_t(UInt16(port).bigEndian)
        addr.sin_addr.s_addr = inet_addr("127.0.0.1")
        let ok = withUnsafePointer(to: &addr) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                connect(s, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
            }
        }
        guard ok == 0 else {
            Glibc.close(s)
            return nil
        }
        fd = s
    }

    deinit { Glibc.close(fd) }

    @discardableResult
    func send(_ text: String) -> Bool { send(bytes: Array(text.utf8)) }

    @discardableResult
    func send(bytes: [UInt8]) -> Bool {
        var sent = 0
        while sent < bytes.count {
            let n = bytes.withUnsafeBytes {
                Glibc.send(fd, $0.baseAddress! + sent, $0.count - sent, Int32(MSG_NOSIGNAL))
            }
            guard n > 0 else { return false }
            sent += n
        }
        return true
    }

    func shutdown() { _ = Glibc.shutdown(fd, Int32(SHUT_RDWR)) }

    enum ReadOutcome: Equatable, Sendable {
        /// Bytes arrived (up to the end of a response head, or whatever came before the close).
        case data(String)
        /// The server closed the connection without sending anything (more).
        case closed
        /// Nothing within the receive timeout.
        case timedOut
    }

    /// Reads until a response head (and `minBody` more bytes) arrived, the peer closed, or the
    /// receive timeout passed.
    func read(minBody: Int = 0) -> ReadOutcome {
        var got: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 4096)
        while true {
            let n = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if n > 0 {
                got += buffer[0..<n]
                let text = String(decoding: got, as: UTF8.self)
                if let end = text.range(of: "\r\n\r\n"), text[end.upperBound...].utf8.count >= minBody {
                    return .data(text)
                }
                continue
            }
            if n == 0 || errno == ECONNRESET {
                return got.isEmpty ? .closed : .data(String(decoding: got, as: UTF8.self))
            }
            if errno == EINTR { continue }
            return got.isEmpty ? .timedOut : .data(String(decoding: got, as: UTF8.self))
        }
    }

    /// `GET /health`, answered 200 on this connection.
    func health() -> Bool {
        guard send("GET /health HTTP/1.1\r\nHost: coffer\r\n\r\n") else { return false }
        if case .data(let text) = read(minBody: 2) { return text.hasPrefix("HTTP/1.1 200") }
        return false
    }
}

/// Runs the real application (`CofferHTTP.application`, as `coffer-server` does) on a loopback
/// port for the duration of `body`.
func withLiveServer(
    _ server: CofferServer, options: CofferHTTP.Options,
    _ body: @Sendable (Int) async throws -> Void
) async throws {
    var logger = Logger(label: "coffer-server-live-test")
    logger.logLevel = .critical
    let port = Mutex<Int?>(nil)
    let app = try CofferHTTP.application(
        server: server, host: "127.0.0.1", port: 0, options: options, logger: logger,
        onRunning: { p in port.withLock { $0 = p } })
    let running = Task { try await app.runService(gracefulShutdownSignals: []) }
    defer { running.cancel() }
    guard await eventually(seconds: 30, { port.withLock { $0 } != nil }), let p = port.withLock({ $0 }) else {
        Issue.record("the server did not start")
        return
    }
    try await body(p)
}

/// Runs blocking socket work on a thread of its own. The in-process server answers on Swift's
/// cooperative threads, which a test blocked in `recv` must not hold: in a full parallel run they
/// are few and busy, and a test holding one could starve the very server it waits for.
func offPool<T: Sendable>(_ work: @escaping @Sendable () -> T) async -> T {
    await withCheckedContinuation { c in Thread.detachNewThread { c.resume(returning: work()) } }
}

/// `eventually`, with the condition run off the cooperative threads (`offPool`).
func eventuallyOffPool(seconds: Int, _ condition: @escaping @Sendable () -> Bool) async -> Bool {
    for _ in 0..<(seconds * 20) {
        if await offPool(condition) { return true }
        try? await Task.sleep(for: .milliseconds(50))
    }
    return await offPool(condition)
}

@Suite(.serialized) struct LiveServerTests {
    @Test func connectionsPastTheCapAreClosed() async throws {
        let (server, _) = try makeServer()
        try await withLiveServer(server, options: .init(maxConnections: 3)) { port in
            // Three connections, each shown to be open and counted by a request on it.
            var open: [RawConnection] = []
            for _ in 0..<3 {
                guard let c = RawConnection(port: port) else {
                    Issue.record("cannot connect")
                    return
                }
                let healthy = await offPool { c.health() }
                #expect(healthy)
                open.append(c)
            }
            // The fourth is accepted by the kernel and closed by the server at once.
            guard let fourth = RawConnection(port: port) else {
                Issue.record("cannot connect")
                return
            }
            fourth.send("GET /health HTTP/1.1\r\nHost: coffer\r\n\r\n")
            let fourthRead = await offPool { fourth.read() }
            #expect(fourthRead == .closed)
            // Once one closes, a new connection is served again (the count follows closes).
            open.removeFirst()
            let served = await eventuallyOffPool(seconds: 120) {
                RawConnection(port: port, receiveTimeout: 20)?.health() ?? false
            }
            #expect(served)
            let stillOpen = await offPool { [open] in open.allSatisfy { $0.health() } }
            #expect(stillOpen, "connections within the cap keep working")
        }
    }

    @Test func idleConnectionsAreClosedWhileTheServerStillAnswers() async throws {
        let (server, _) = try makeServer()
        try await withLiveServer(server, options: .init(idleTimeoutSeconds: 1)) { port in
            guard let idle = RawConnection(port: port), let half = RawConnection(port: port) else {
                Issue.record("cannot connect")
                return
            }
            // Half a request head, never finished (a slow-loris client).
            half.send("GET /health HTTP/1.1\r\nHost: coffer\r\n")
            guard let other = RawConnection(port: port) else {
                Issue.record("cannot connect")
                return
            }
            let otherHealthy = await offPool { other.health() }
            #expect(otherHealthy)
            let idleRead = await offPool { idle.read() }
            #expect(idleRead == .closed, "an idle connection stayed open")
            let halfRead = await offPool { half.read() }
            #expect(halfRead != .timedOut, "a half-sent request head kept its connection open")
            let fresh = await offPool { RawConnection(port: port)?.health() == true }
            #expect(fresh)
        }
    }

    /// Bodies held at once are bounded: while one request of alice's holds most of the budget
    /// (it announced 800 kB and sends nothing), another gets 503 `busy` at once; when the first
    /// goes away, uploads go through again.
    @Test func bodiesHeldAtOnceAreBounded() async throws {
        let (server, _) = try makeServer()
        let alice = TestUser()
        _ = try server.createAccount(caller: alice.key, alice.createRequest)
        let size = 800_000
        @Sendable func put(_ body: [UInt8]?) -> String {
            let bytes = body ?? []
            let path = "/v1/chunks/\(RequestSigning.hex(randomBytes(32)))"
            var lines = ["PUT \(path) HTTP/1.1", "Host: coffer", "Content-Length: \(size)"]
            for (n, v) in RequestSigning.headers(
                keys: alice.keys, server: server.identity, method: "PUT", path: path, body: bytes,
                timestamp: nowMillis())
            {
                lines.append("\(n): \(v)")
            }
            return lines.joined(separator: "\r\n") + "\r\n\r\n"
        }
        @Sendable func upload(_ port: Int) -> String? {
            guard let c = RawConnection(port: port) else { return nil }
            let body = randomBytes(size)
            guard c.send(put(body)), c.send(bytes: body) else { return nil }
            if case .data(let text) = c.read() { return String(text.prefix(12)) }
            return nil
        }
        // The holder must outlive the waits below even on a loaded machine: no idle timeout here.
        try await withLiveServer(server, options: .init(idleTimeoutSeconds: nil, maxBufferedBodyBytes: 1_000_000)) {
            port in
            let first = await offPool { upload(port) }
            #expect(first == "HTTP/1.1 204", "an upload within the budget")
            // A holder announces a body and sends none. Its reservation and a probe's race: a probe
            // that gets through either came first (the holder is then answered 503 itself, and a
            // new holder is started) or the holder has not reserved yet (probe again).
            var holder: RawConnection?
            var refused = false
            for _ in 0..<60 where !refused {
                if holder == nil {
                    guard let h = RawConnection(port: port, receiveTimeout: 2) else { continue }
                    h.send(put(nil))
                    holder = h
                }
                refused = await offPool { upload(port) } == "HTTP/1.1 503"
                if !refused, let h = holder, case .data(let text) = await offPool({ h.read() }),
                    text.hasPrefix("HTTP/1.1 503")
                {
                    holder = nil
                }
            }
            #expect(refused, "a second large body was accepted while the first held the budget")
            holder?.shutdown()
            let accepted = await eventuallyOffPool(seconds: 120) { upload(port) == "HTTP/1.1 204" }
            #expect(accepted, "the budget was not given back")
        }
    }

    /// Headers are checked before the body is read: each request announces a 20 MB body and
    /// sends none, so an answer proves the server did not wait to collect it.
    @Test func refusedRequestsAreAnsweredWithoutReadingTheirBody() async throws {
        let (server, _) = try makeServer()
        let alice = TestUser()
        let stranger = TestUser()
        _ = try server.createAccount(caller: alice.key, alice.createRequest)
        func head(_ user: TestUser?, timestamp: Int64) -> String {
            var lines = [
                "POST /v1/files/upsert HTTP/1.1", "Host: coffer", "Content-Type: application/json",
                "Content-Length: 20000000",
            ]
            if let user {
                for (n, v) in RequestSigning.headers(
                    keys: user.keys, server: server.identity, method: "POST", path: "/v1/files/upsert", body: [],
                    timestamp: timestamp)
                {
                    lines.append("\(n): \(v)")
                }
            }
            return lines.joined(separator: "\r\n") + "\r\n\r\n"
        }
        let now = nowMillis()
        let cases: [(String, String)] = [
            ("unsigned", head(nil, timestamp: now)),
            ("stale timestamp", head(alice, timestamp: now - API.maxClockSkewMillis - 60_000)),
            ("extreme timestamp", head(alice, timestamp: Int64.min + now)),
            ("no account", head(stranger, timestamp: now)),
        ]
        try await withLiveServer(server, options: .init()) { port in
            for (name, request) in cases {
                guard let c = RawConnection(port: port) else {
                    Issue.record("cannot connect")
                    return
                }
                c.send(request)
                let outcome = await offPool { c.read() }
                guard case .data(let text) = outcome else {
                    Issue.record("\(name): no answer before the body (\(outcome))")
                    continue
                }
                #expect(text.hasPrefix("HTTP/1.1 401"), "\(name): \(text.prefix(40))")
            }
            // The server is still fine.
            let stillFine = await offPool { RawConnection(port: port)?.health() == true }
            #expect(stillFine)
        }
    }
}
