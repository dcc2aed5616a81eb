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
