import AsyncHTTPClient
import Foundation
import NIOCore
import NIOHTTP1

/// The production transport: AsyncHTTPClient's shared client (connection pooling, robust in a
/// long-running daemon).
public struct HTTPTransport: ServerTransport {
    public let baseURL: String
    public let timeout: TimeAmount

    public init(baseURL: String, timeout: TimeAmount = .seconds(60)) {
        var url = baseURL
        while url.hasSuffix("/") { url.removeLast() }
        self.baseURL = url
        self.timeout = timeout
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
            let fd = socket(ai.pointee.ai_family, ai.pointee.ai_socktype | Int32(SOCK_NONBLOCK.rawValue) | Int32(SOCK_CLOEXEC.rawValue), ai.pointee.ai_protocol)
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

    public func send(method: String, path: String, headers: [(String, String)], body: [UInt8], contentType: String) async throws -> (status: Int, body: [UInt8]) {
        var request = HTTPClientRequest(url: baseURL + path)
        request.method = HTTPMethod(rawValue: method)
        for (name, value) in headers { request.headers.add(name: name, value: value) }
        if !body.isEmpty || method == "POST" || method == "PUT" {
            request.headers.add(name: "content-type", value: contentType)
            request.body = .bytes(ByteBuffer(bytes: body))
        }
        let response = try await HTTPClient.shared.execute(request, timeout: timeout)
        let data = try await response.body.collect(upTo: 256 * 1024 * 1024)
        return (Int(response.status.code), Array(data.readableBytesView))
    }
}
