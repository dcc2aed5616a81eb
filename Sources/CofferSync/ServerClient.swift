import CofferCrypto
import CofferModel
import CofferProtocol
import Foundation
import Synchronization

/// Moves one request to the server and back. Production uses `HTTPTransport`.
public protocol ServerTransport: Sendable {
    func send(method: String, path: String, headers: [(String, String)], body: [UInt8], contentType: String) async throws -> (status: Int, body: [UInt8])
    /// A quick check that the server can be reached at all.
    func reachable(timeout: Double) -> Bool
}

/// Why a sync step failed.
public enum SyncError: Error, CustomStringConvertible, Sendable {
    /// The server could not be reached; the device keeps working and retries later.
    case offline(String)
    /// The server refused the request.
    case server(status: Int, code: String, message: String)
    /// The server answered something this client cannot use.
    case protocolError(String)

    public var description: String {
        switch self {
        case .offline(let why): return "server unreachable: \(why)"
        case .server(let status, let code, let message): return "server refused (\(status) \(code)): \(message)"
        case .protocolError(let why): return "unexpected server response: \(why)"
        }
    }

    public var isGetUpdatesRequired: Bool {
        if case .server(_, let code, _) = self { return code == ErrorResponse.getUpdatesRequired }
        return false
    }
}

/// Typed, signed calls to the server's endpoints (docs/PROTOCOL.md).
public struct ServerClient: Sendable {
    let transport: any ServerTransport
    let keys: SigningKeyPair
    let now: @Sendable () -> Int64
    /// Bytes of request and response bodies moved so far (for `coffer sync --stats` and the
    /// sync benchmark).
    public let traffic = Traffic()

    public final class Traffic: Sendable {
        let sent = Atomic<Int>(0)
        let received = Atomic<Int>(0)
        let requests = Atomic<Int>(0)
        public var bytesSent: Int { sent.load(ordering: .relaxed) }
        public var bytesReceived: Int { received.load(ordering: .relaxed) }
        public var requestCount: Int { requests.load(ordering: .relaxed) }
    }

    public init(transport: any ServerTransport, keys: SigningKeyPair,
                now: @escaping @Sendable () -> Int64 = { Int64(Date().timeIntervalSince1970 * 1000) }) {
        self.transport = transport
        self.keys = keys
        self.now = now
    }

    func raw(_ method: String, _ path: String, body: [UInt8] = [], contentType: String = "application/json") async throws -> [UInt8] {
        let headers = RequestSigning.headers(keys: keys, method: method, path: path, body: body, timestamp: now())
        let (status, response): (Int, [UInt8])
        do {
            (status, response) = try await transport.send(method: method, path: path, headers: headers, body: body, contentType: contentType)
        } catch let e as SyncError {
            throw e
        } catch {
            throw SyncError.offline("\(error)")
        }
        traffic.sent.add(body.count, ordering: .relaxed)
        traffic.received.add(response.count, ordering: .relaxed)
        traffic.requests.add(1, ordering: .relaxed)
        guard (200..<300).contains(status) else {
            if let e = try? JSONDecoder().decode(ErrorResponse.self, from: Data(response)) {
                throw SyncError.server(status: status, code: e.code, message: e.message)
            }
            if status >= 500 || status == 0 { throw SyncError.offline("status \(status)") }
            throw SyncError.server(status: status, code: "http_\(status)", message: String(decoding: response.prefix(200), as: UTF8.self))
        }
        return response
    }

    func json<Response: Decodable>(_ method: String, _ path: String, _ request: (some Encodable)?) async throws -> Response {
        let body = try request.map { try [UInt8](JSONEncoder().encode($0)) } ?? []
        let data = try await raw(method, path, body: body)
        do { return try JSONDecoder().decode(Response.self, from: Data(data)) } catch {
            throw SyncError.protocolError("cannot decode \(Response.self) from \(path)")
        }
    }

    func send(_ method: String, _ path: String, _ request: some Encodable) async throws {
        _ = try await raw(method, path, body: [UInt8](JSONEncoder().encode(request)))
    }

    private struct Empty: Codable {}

    public func createAccount(_ request: CreateAccountRequest) async throws -> AccountResponse {
        try await json("POST", API.prefix + "/accounts", request)
    }

    public func lookup(username: String) async throws -> AccountResponse {
        let escaped = username.addingPercentEncoding(withAllowedCharacters: .alphanumerics) ?? username
        return try await json("GET", API.prefix + "/accounts/" + escaped, Optional<Empty>.none)
    }

    public func upsert(_ request: UpsertRequest) async throws -> UpsertResponse {
        try await json("POST", API.prefix + "/files/upsert", request)
    }

    public func updates(since: Int64, afterID: Data? = nil) async throws -> UpdatesResponse {
        try await json("POST", API.prefix + "/updates", UpdatesRequest(since: since, afterID: afterID))
    }

    public func missingChunks(_ ids: [[UInt8]]) async throws -> [[UInt8]] {
        let r: MissingChunksResponse = try await json("POST", API.prefix + "/chunks/missing", ChunkIDsRequest(ids: ids.map { Data($0) }))
        return r.missing.map { [UInt8]($0) }
    }

    public func putChunk(id: [UInt8], sealed: [UInt8]) async throws {
        _ = try await raw("PUT", API.prefix + "/chunks/" + RequestSigning.hex(id), body: sealed, contentType: "application/octet-stream")
    }

    public func getChunks(_ ids: [[UInt8]]) async throws -> [[UInt8]: [UInt8]] {
        let body = try [UInt8](JSONEncoder().encode(ChunkIDsRequest(ids: ids.map { Data($0) })))
        let data = try await raw("POST", API.prefix + "/chunks/get", body: body)
        guard let chunks = ChunkBundle.decode(data) else { throw SyncError.protocolError("malformed chunk bundle") }
        var out: [[UInt8]: [UInt8]] = [:]
        for c in chunks { out[c.id] = c.sealed }
        return out
    }

    public func putManifest(_ request: PutManifestRequest) async throws {
        try await send("POST", API.prefix + "/manifests", request)
    }

    public func getManifest(fileID: FileID, digest: [UInt8]) async throws -> [UInt8] {
        let body = try [UInt8](JSONEncoder().encode(GetManifestRequest(fileID: Data(fileID.bytes), digest: Data(digest))))
        return try await raw("POST", API.prefix + "/manifests/get", body: body)
    }

    public func usage() async throws -> UsageResponse {
        try await json("GET", API.prefix + "/usage", Optional<Empty>.none)
    }
}
