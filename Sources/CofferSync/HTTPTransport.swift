import AsyncHTTPClient
import CofferProtocol
import Foundation
import NIOCore
import NIOHTTP1
import NIOSSL
import Synchronization

/// The production transport: AsyncHTTPClient's shared client (connection pooling, robust in a
/// long-running daemon).
///
/// A server may be hostile: every request has an overall deadline covering the request, the
/// reply's head and its whole body (AsyncHTTPClient's own deadline ends with the head, so a body
/// trickled a byte at a time would otherwise hold a sync for ever), and a reply body is read only
/// up to `maxResponseBytes`.
public struct HTTPTransport: ServerTransport {
    public let baseURL: String
    /// Time allowed for one request with small bodies, from sending it to the last byte of the reply.
    public let timeout: TimeAmount
    /// Large bodies get more time, one second per `minimumBytesPerSecond` moved (sent or received
    /// so far), so a slow link still finishes a big chunk bundle while a trickle still times out.
    public let minimumBytesPerSecond: Int
    /// Largest reply body read; reading stops as soon as a reply goes past it.
    public let maxResponseBytes: Int
    /// The shared client, or one that also trusts a server's own certificate.
    let client: HTTPClient

    public init(
        baseURL: String, timeout: TimeAmount = .seconds(60), minimumBytesPerSecond: Int = 64 * 1024,
        maxResponseBytes: Int = 256 * 1024 * 1024
    ) {
        self.init(
            baseURL: baseURL, timeout: timeout, minimumBytesPerSecond: minimumBytesPerSecond,
            maxResponseBytes: maxResponseBytes,
            client: HTTPTransport.client(for: [], trusting: []))
    }

    /// A transport that trusts `trustedCertificatePEM` (a self-signed server certificate or a
    /// private CA) besides the system's roots.
    public init(baseURL: String, trustedCertificatePEM: [UInt8]?, timeout: TimeAmount = .seconds(60)) throws {
        self.init(
            baseURL: baseURL, timeout: timeout, minimumBytesPerSecond: 64 * 1024, maxResponseBytes: 256 * 1024 * 1024,
            client: try trustedCertificatePEM.map { try Self.client(trusting: $0) }
                ?? Self.client(for: [], trusting: []))
    }

    init(baseURL: String, timeout: TimeAmount, minimumBytesPerSecond: Int, maxResponseBytes: Int, client: HTTPClient) {
        var url = baseURL
        while url.hasSuffix("/") { url.removeLast() }
        self.baseURL = url
        self.timeout = timeout
        self.minimumBytesPerSecond = max(1, minimumBytesPerSecond)
        self.maxResponseBytes = max(0, maxResponseBytes)
        self.client = client
    }

    /// One client per trusted certificate for the life of the process (a client must be shut
    /// down before it is released; these never are).
    private static let clients = Mutex<[[UInt8]: HTTPClient]>([:])

    static func client(trusting pem: [UInt8]) throws -> HTTPClient {
        let certificates: [NIOSSLCertificate]
        do { certificates = try NIOSSLCertificate.fromPEMBytes(pem) } catch {
            throw SyncError.protocolError("the server certificate to trust is not PEM: \(error)")
        }
        guard !certificates.isEmpty else {
            throw SyncError.protocolError("the server certificate to trust holds no certificate")
        }
        return client(for: pem, trusting: certificates)
    }

    /// The client for a trust configuration (`key` empty: the system's roots alone), made once.
    /// Connection attempts end after `connectTimeout`, so a refused handshake (an untrusted
    /// certificate) is reported as what it is instead of being retried until the request's
    /// deadline and reported as "no reply in time".
    static func client(for key: [UInt8], trusting certificates: [NIOSSLCertificate]) -> HTTPClient {
        clients.withLock { cache in
            if let c = cache[key] { return c }
            var tls = TLSConfiguration.makeClientConfiguration()
            if !certificates.isEmpty { tls.additionalTrustRoots = [.certificates(certificates)] }
            var configuration = HTTPClient.Configuration(tlsConfiguration: tls)
            configuration.timeout.connect = connectTimeout
            let c = HTTPClient(eventLoopGroupProvider: .singleton, configuration: configuration)
            cache[key] = c
            return c
        }
    }

    static let connectTimeout: TimeAmount = .seconds(10)

    /// `url` if it is one to send an account's requests to: HTTPS, or plain HTTP only to a
    /// loopback address (where nothing crosses a network) unless `allowInsecureHTTP`, since
    /// plain HTTP shows every request's metadata to the network and lets anyone on the path
    /// answer in the server's place.
    public static func checkedURL(_ url: String, allowInsecureHTTP: Bool) throws -> String {
        guard let comps = URLComponents(string: url), let scheme = comps.scheme?.lowercased(), let host = comps.host,
            !host.isEmpty
        else {
            throw SyncError.protocolError("\(url) is not a server URL (like https://host:port)")
        }
        switch scheme {
        case "https": return url
        case "http":
            if allowInsecureHTTP || API.isLoopback(host) { return url }
            throw SyncError.protocolError(
                "refusing plain http:// to \(host), which is not this machine: use https://, or --insecure-http to "
                    + "allow it"
            )
        default:
            throw SyncError.protocolError(
                "\(url): the server URL must start with https:// (or http:// for this machine)")
        }
    }

    /// Whether the server accepts a TCP connection within `timeout` seconds. AsyncHTTPClient
    /// retries refused connections until a request's deadline, so an unreachable server would
    /// otherwise hold every sync for the whole timeout; this makes "offline" quick to tell.
    public func reachable(timeout: Double = 3) -> Bool {
        guard let comps = URLComponents(string: baseURL), let host = comps.host else { return false }
        let port = comps.port ?? (comps.scheme == "https" ? 443 : 80)
        var hints = addrinfo()
        hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
        var result: UnsafeMutablePointer<addrinfo>?
        guard getaddrinfo(host, String(port), &hints, &result) == 0, let first = result else { return false }
        defer { freeaddrinfo(result) }
        var cursor: UnsafeMutablePointer<addrinfo>? = first
        while let ai = cursor {
            let fd = socket(
                ai.pointee.ai_family,
                ai.pointee.ai_socktype | Int32(SOCK_NONBLOCK.rawValue) | Int32(SOCK_CLOEXEC.rawValue),
                ai.pointee.ai_protocol)
            if fd >= 0 {
                defer { close(fd) }
                if connect(fd, ai.pointee.ai_addr, ai.pointee.ai_addrlen) == 0 { return true }
                if errno == EINPROGRESS {
                    var p = pollfd(fd: fd, events: Int16(POLLOUT), revents: 0)
                    if poll(&p, 1, Int32(timeout * 1000)) == 1 {
                        var err: Int32 = 0
                        var len = socklen_t(MemoryLayout<Int32>.size)
                        getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len)
                        if err == 0 { return true }
                    }
                }
            }
            cursor = ai.pointee.ai_next
        }
        return false
    }

    /// `send`, waiting on the request's future: the reply is handled on NIO's event loop, so
    /// this needs none of Swift's cooperative threads (it may run on one, in a sync).
    public func sendBlocking(
        method: String, path: String, headers: [(String, String)], body: [UInt8], contentType: String
    ) throws -> (status: Int, body: [UInt8]) {
        let (task, _) = try start(method: method, path: path, headers: headers, body: body, contentType: contentType)
        do {
            let r = try task.futureResult.wait()
            return (r.status, r.body)
        } catch let e as NIOSSLError {
            throw SyncError.protocolError("the TLS handshake with \(baseURL) failed (\(e))")
        }
    }

    /// Starts a request with its deadline and size limit.
    private func start(
        method: String, path: String, headers: [(String, String)], body: [UInt8], contentType: String
    ) throws -> (HTTPClient.Task<BoundedReply.Reply>, BoundedReply) {
        var fields = HTTPHeaders()
        for (name, value) in headers { fields.add(name: name, value: value) }
        var payload: HTTPClient.Body?
        if !body.isEmpty || method == "POST" || method == "PUT" {
            fields.add(name: "content-type", value: contentType)
            payload = .bytes(body)
        }
        let request = try HTTPClient.Request(
            url: baseURL + path, method: HTTPMethod(rawValue: method), headers: fields, body: payload)
        let reply = BoundedReply(
            what: "\(method) \(path)", timeout: timeout, minimumBytesPerSecond: minimumBytesPerSecond,
            maxBytes: maxResponseBytes, sent: body.count)
        let task = client.execute(request: request, delegate: reply)
        reply.watch(task)
        return (task, reply)
    }

    public func send(
        method: String, path: String, headers: [(String, String)], body: [UInt8], contentType: String
    ) async throws -> (status: Int, body: [UInt8]) {
        let (task, _) = try start(method: method, path: path, headers: headers, body: body, contentType: contentType)
        let r = try await withTaskCancellationHandler {
            do { return try await task.futureResult.get() } catch let e as NIOSSLError {
                // Not "offline": retrying will not help until the certificate is trusted.
                throw SyncError.protocolError(
                    "the TLS handshake with \(baseURL) failed (\(e)); if the server's certificate is self-signed, "
                        + "give it with --server-ca")
            }
        } onCancel: {
            task.cancel()
        }
        return (r.status, r.body)
    }
}

/// Collects one reply within a size limit and fails the request once it has taken longer than
/// its deadline: `timeout`, plus a second per `minimumBytesPerSecond` moved so far, so a slow
/// link still finishes a big transfer while a trickled body does not hold a sync for ever.
///
/// Everything here runs on the request's NIO event loop (the delegate's callbacks and the timer
/// alike), not on Swift's cooperative threads: a process whose tasks keep those threads busy
/// must not see a reply that arrived in time as late, and a hostile server must not be able to
/// outlast the deadline whatever the rest of the process is doing.
final class BoundedReply: HTTPClientResponseDelegate, @unchecked Sendable {
    struct Reply: Sendable {
        var status: Int
        var body: [UInt8]
    }
    typealias Response = Reply

    let what: String
    let start = NIODeadline.now()
    let timeout: TimeAmount
    let rate: Int
    let maxBytes: Int
    let sent: Int
    // Touched only on the request's event loop.
    private var status = 0
    private var body: [UInt8] = []
    private var finished = false
    private var timer: Scheduled<Void>?

    init(what: String, timeout: TimeAmount, minimumBytesPerSecond: Int, maxBytes: Int, sent: Int) {
        self.what = what
        self.timeout = timeout
        self.rate = max(1, minimumBytesPerSecond)
        self.maxBytes = maxBytes
        self.sent = sent
    }

    var deadline: NIODeadline {
        let moved = sent.addingReportingOverflow(body.count)
        let extra = moved.overflow ? Int64(1 << 30) : Int64(moved.partialValue / rate)
        return start + timeout + .seconds(min(extra, 1 << 30))
    }

    /// Starts the clock on `task`'s event loop: one timer at the deadline, set again further on
    /// when bytes moved meanwhile, so a reply held open (the live channel's long poll) costs no
    /// wakeups while it waits.
    func watch(_ task: HTTPClient.Task<Reply>) {
        task.eventLoop.execute { [self] in
            guard !finished else { return }
            arm(task)
        }
    }

    private func arm(_ task: HTTPClient.Task<Reply>) {
        timer = task.eventLoop.scheduleTask(deadline: deadline) { [self] in
            guard !finished else { return }
            guard NIODeadline.now() >= deadline else { return arm(task) }
            finished = true
            task.fail(
                reason: SyncError.offline(
                    "no complete reply to \(what) in time (\(timeout.nanoseconds / 1_000_000_000) s)"))
        }
    }

    private func tooLarge() -> SyncError {
        SyncError.protocolError("the reply to \(what) is larger than \(maxBytes) bytes")
    }

    func didReceiveHead(task: HTTPClient.Task<Reply>, _ head: HTTPResponseHead) -> EventLoopFuture<Void> {
        status = Int(head.status.code)
        if let declared = head.headers.first(name: "content-length").flatMap({ Int($0) }), declared > maxBytes {
            return task.eventLoop.makeFailedFuture(tooLarge())
        }
        return task.eventLoop.makeSucceededVoidFuture()
    }

    func didReceiveBodyPart(task: HTTPClient.Task<Reply>, _ buffer: ByteBuffer) -> EventLoopFuture<Void> {
        guard body.count + buffer.readableBytes <= maxBytes else { return task.eventLoop.makeFailedFuture(tooLarge()) }
        body += buffer.readableBytesView
        return task.eventLoop.makeSucceededVoidFuture()
    }

    func didReceiveError(task: HTTPClient.Task<Reply>, _ error: any Error) {
        finished = true
        timer?.cancel()
    }

    func didFinishRequest(task: HTTPClient.Task<Reply>) throws -> Reply {
        finished = true
        timer?.cancel()
        return Reply(status: status, body: body)
    }
}
