import CofferCrypto
import CofferModel
import CofferProtocol
import Foundation
import Synchronization

/// Moves one request to the server and back. Production uses `HTTPTransport`.
public protocol ServerTransport: Sendable {
    func send(
        method: String, path: String, headers: [(String, String)], body: [UInt8], contentType: String
    ) async throws -> (status: Int, body: [UInt8])
    /// A quick check that the server can be reached at all.
    func reachable(timeout: Double) -> Bool
    /// `send` for a thread that must not await (a FUSE request fetching content on demand), and
    /// may be inside a Swift task: it waits without needing another of the runtime's threads.
    func sendBlocking(
        method: String, path: String, headers: [(String, String)], body: [UInt8], contentType: String
    ) throws -> (status: Int, body: [UInt8])
}

extension ServerTransport {
    /// For transports without a blocking path of their own (tests): waits for `send`.
    public func sendBlocking(
        method: String, path: String, headers: [(String, String)], body: [UInt8], contentType: String
    ) throws -> (status: Int, body: [UInt8]) {
        try runBlocking { [self] in
            try await send(method: method, path: path, headers: headers, body: body, contentType: contentType)
        }
    }
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

/// Text that came from a server, made fit for a terminal and a log line: escape sequences
/// (CSI, OSC, DCS and the like, in their ESC and C1 forms) removed with their parameters, every
/// other control character (C0, DEL, C1) and bidirectional override removed, line breaks and tabs
/// made spaces, and the length capped. A hostile server then cannot clear a screen, set a window
/// title, hide text or flood a log through an error message.
public enum ServerText {
    public static func sanitized(_ text: String, limit: Int = 300) -> String {
        var out = ""
        var kept = 0
        var truncated = false
        var scalars = text.unicodeScalars.makeIterator()
        // Skips an escape sequence's remainder; `kind` is the byte after ESC (or the C1 form's 7-bit equivalent).
        func skipSequence(_ kind: UInt32) {
            switch kind {
            case 0x5B:  // CSI: parameters and intermediates, then one final byte 0x40-0x7E
                while let c = scalars.next() { if (0x40...0x7E).contains(c.value) || c.value < 0x20 { return } }
            case 0x5D, 0x50, 0x58, 0x5E, 0x5F:  // OSC, DCS, SOS, PM, APC: up to BEL or ST (ESC \ or 0x9C)
                while let c = scalars.next() {
                    if c.value == 0x07 || c.value == 0x9C { return }
                    if c.value == 0x1B {
                        _ = scalars.next()
                        return
                    }
                }
            default:  // two-character sequences (ESC c, ESC 7, ...), the one byte is already gone
                return
            }
        }
        while let c = scalars.next() {
            let v = c.value
            if v == 0x1B {
                guard let kind = scalars.next() else { break }
                skipSequence(kind.value)
                continue
            }
            if (0x80...0x9F).contains(v) {
                if [0x9B, 0x9D, 0x90, 0x98, 0x9E, 0x9F].contains(v) { skipSequence(v - 0x40) }
                continue
            }
            var scalar = c
            if v == 0x09 || v == 0x0A || v == 0x0D { scalar = " " } else if v < 0x20 || v == 0x7F { continue }
            if (0x202A...0x202E).contains(v) || (0x2066...0x2069).contains(v) || v == 0x200E || v == 0x200F
                || v == 0x061C
            {
                continue
            }
            guard kept < limit else {
                truncated = true
                break
            }
            out.unicodeScalars.append(scalar)
            kept += 1
        }
        return truncated ? out + "…" : out
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

    /// The server's id, which every signature covers: asked once (`GET /v1/server`), checked
    /// against the one pinned at first contact, and handed to `learned` when there was none.
    public final class ServerIdentity: Sendable {
        let pinned: @Sendable () -> [UInt8]?
        let learned: @Sendable ([UInt8]) throws -> Void
        let known = Mutex<[UInt8]?>(nil)
        /// `pinned` reads the id pinned so far (nil before the first contact), `learned` pins one.
        public init(
            pinned: @escaping @Sendable () -> [UInt8]? = { nil },
            learned: @escaping @Sendable ([UInt8]) throws -> Void = { _ in }
        ) {
            self.pinned = pinned
            self.learned = learned
        }
    }
    let identity: ServerIdentity

    public init(
        transport: any ServerTransport, keys: SigningKeyPair, identity: ServerIdentity = ServerIdentity(),
        now: @escaping @Sendable () -> Int64 = { Int64(Date().timeIntervalSince1970 * 1000) }
    ) {
        self.transport = transport
        self.keys = keys
        self.identity = identity
        self.now = now
    }

    /// The id requests are signed for. A server whose id differs from the pinned one is another
    /// server (replaced, restored without its data directory, or an impostor): nothing is sent.
    func serverID() async throws -> [UInt8] {
        if let id = identity.known.withLock({ $0 }) { return id }
        let (status, body): (Int, [UInt8])
        do {
            (status, body) = try await transport.send(
                method: "GET", path: API.prefix + "/server", headers: [], body: [], contentType: "application/json")
        } catch let e as SyncError {
            throw e
        } catch {
            throw SyncError.offline("\(error)")
        }
        guard status == 200, let info = try? JSONDecoder().decode(ServerInfoResponse.self, from: Data(body)),
            info.id.count == RequestSigning.serverIDBytes
        else {
            if status >= 500 || status == 0 { throw SyncError.offline("status \(status)") }
            throw SyncError.protocolError(
                "the server did not tell its id (GET \(API.prefix)/server answered \(status))")
        }
        let id = [UInt8](info.id)
        let pinned = identity.pinned()
        if let pinned, pinned != id {
            throw SyncError.protocolError(
                "the server at this address is not the one this device synced with (its id changed from "
                    + "\(RequestSigning.hex(pinned)) to \(RequestSigning.hex(id))); nothing was sent"
            )
        }
        if pinned == nil { try identity.learned(id) }
        identity.known.withLock { $0 = id }
        return id
    }

    /// Asks the server's id again before the next request: once per sync, so a server replaced
    /// under a long-running mount is noticed rather than answering every request with 401.
    public func recheckServerID() { identity.known.withLock { $0 = nil } }

    func raw(
        _ method: String, _ path: String, body: [UInt8] = [], contentType: String = "application/json"
    ) async throws -> [UInt8] {
        let server = try await serverID()
        let headers = RequestSigning.headers(
            keys: keys, server: server, method: method, path: path, body: body, timestamp: now())
        let (status, response): (Int, [UInt8])
        do {
            (status, response) = try await transport.send(
                method: method, path: path, headers: headers, body: body, contentType: contentType)
        } catch { throw Self.transportFailure(error) }
        return try checked(status, response, sent: body.count)
    }

    /// `raw` without awaiting (`ServerTransport.sendBlocking`), for content on demand. The
    /// server's id must be known already (a sync has run); until then, nothing is fetched.
    func rawBlocking(
        _ method: String, _ path: String, body: [UInt8] = [], contentType: String = "application/json"
    ) throws -> [UInt8] {
        guard let server = identity.known.withLock({ $0 }) ?? identity.pinned() else {
            throw SyncError.offline("this device has not reached its server yet")
        }
        let headers = RequestSigning.headers(
            keys: keys, server: server, method: method, path: path, body: body, timestamp: now())
        let (status, response): (Int, [UInt8])
        do {
            (status, response) = try transport.sendBlocking(
                method: method, path: path, headers: headers, body: body, contentType: contentType)
        } catch { throw Self.transportFailure(error) }
        return try checked(status, response, sent: body.count)
    }

    /// A transport's failure as a sync error: its own, or "offline" (a connection refused or
    /// reset, a deadline passed), with its text made safe for a terminal.
    static func transportFailure(_ error: any Error) -> SyncError {
        (error as? SyncError) ?? .offline(ServerText.sanitized("\(error)"))
    }

    /// Counts a reply and turns a refusal into a `SyncError`.
    private func checked(_ status: Int, _ response: [UInt8], sent: Int) throws -> [UInt8] {
        traffic.sent.add(sent, ordering: .relaxed)
        traffic.received.add(response.count, ordering: .relaxed)
        traffic.requests.add(1, ordering: .relaxed)
        guard (200..<300).contains(status) else {
            // The one place where server text becomes an error message (shown by `coffer`, kept in
            // `coffer status`, logged by the daemon): made safe for a terminal first.
            if let e = try? JSONDecoder().decode(ErrorResponse.self, from: Data(response)) {
                throw SyncError.server(
                    status: status, code: ServerText.sanitized(e.code, limit: 64),
                    message: ServerText.sanitized(e.message))
            }
            if status >= 500 || status == 0 { throw SyncError.offline("status \(status)") }
            let text = String(decoding: response.prefix(1024), as: UTF8.self)
            throw SyncError.server(status: status, code: "http_\(status)", message: ServerText.sanitized(text))
        }
        return response
    }

    func json<Response: Decodable>(
        _ method: String, _ path: String, _ request: (some Encodable)?
    ) async throws -> Response {
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

    /// The account whose signing key is `key`.
    public func lookup(key: [UInt8]) async throws -> AccountResponse {
        try await json("GET", API.prefix + "/accounts/key/" + RequestSigning.hex(key), Optional<Empty>.none)
    }

    /// This account's contact book as the server holds it (docs/SHARING.md, "Contacts across
    /// devices").
    public func contactBook() async throws -> ContactBookMessage {
        try await json("GET", API.prefix + "/contacts", Optional<Empty>.none)
    }

    public func putContactBook(_ book: ContactBookMessage) async throws {
        try await send("PUT", API.prefix + "/contacts", book)
    }

    public func publishCard(_ request: KeyCardRequest) async throws {
        try await send("POST", API.prefix + "/accounts/card", request)
    }

    public func upsert(_ request: UpsertRequest) async throws -> UpsertResponse {
        try await json("POST", API.prefix + "/files/upsert", request)
    }

    /// With `shared`, the account's share feed too (docs/SHARING.md, "The feed"); `origin`, the
    /// cursor the read began from, asks which files were granted again since.
    public func updates(
        since: Int64, afterID: Data? = nil, shared: Bool = false, feedOnly: Bool = false, origin: Int64? = nil
    ) async throws -> UpdatesResponse {
        try await json(
            "POST", API.prefix + "/updates",
            UpdatesRequest(
                since: since, afterID: afterID, shared: shared ? true : nil, feedOnly: feedOnly ? true : nil,
                origin: origin))
    }

    /// Waits until the account's view moves past `request`'s cursors (or the server's wait ends):
    /// the live channel's long poll (docs/SYNC.md, "Live").
    public func watch(_ request: WatchRequest) async throws -> WatchResponse {
        try await json("POST", API.prefix + "/watch", request)
    }

    /// With `via`, about the namespace of the owner of that shared file (docs/SHARING.md, "Content").
    public func missingChunks(_ ids: [[UInt8]], via: FileID? = nil) async throws -> [[UInt8]] {
        let r: MissingChunksResponse = try await json(
            "POST", API.prefix + "/chunks/missing",
            ChunkIDsRequest(ids: ids.map { Data($0) }, via: via.map { Data($0.bytes) }))
        return r.missing.map { [UInt8]($0) }
    }

    public func putChunk(id: [UInt8], sealed: [UInt8], via: FileID? = nil) async throws {
        let query = via.map { "?via=" + RequestSigning.hex($0.bytes) } ?? ""
        _ = try await raw(
            "PUT", API.prefix + "/chunks/" + RequestSigning.hex(id) + query, body: sealed,
            contentType: "application/octet-stream")
    }

    /// With `via`, chunks of another account's document shared with this one (docs/SHARING.md,
    /// "Content").
    public func getChunks(_ ids: [[UInt8]], via: FileID? = nil) async throws -> [[UInt8]: [UInt8]] {
        let body = try [UInt8](
            JSONEncoder().encode(ChunkIDsRequest(ids: ids.map { Data($0) }, via: via.map { Data($0.bytes) })))
        return try Self.chunks(try await raw("POST", API.prefix + "/chunks/get", body: body))
    }

    /// Many chunks and manifests in one request (`POST /v1/content`), stored all at once or
    /// not at all; with `via`, into the namespace of the owner of that shared file.
    public func putContent(_ bundle: ContentBundle, via: FileID? = nil) async throws {
        let query = via.map { "?via=" + RequestSigning.hex($0.bytes) } ?? ""
        _ = try await raw(
            "POST", API.prefix + "/content" + query, body: bundle.encoded(), contentType: "application/octet-stream")
    }

    /// The sealed manifests of many documents in one request, in the order asked; one the
    /// server does not hold comes back without bytes.
    public func getManifests(_ items: [GetManifestRequest]) async throws -> [ManifestBundle.Entry] {
        do { return try await manyManifests(items) } catch let e as SyncError where e.isUnknownEndpoint {
            // An older server: one request per manifest.
            var out: [ManifestBundle.Entry] = []
            for item in items {
                let sealed: [UInt8]?
                do {
                    sealed = try await getManifest(
                        fileID: try FileID(bytes: [UInt8](item.fileID)), digest: [UInt8](item.digest))
                } catch let e as SyncError where e.isNotFound {
                    sealed = nil
                }
                out.append(
                    ManifestBundle.Entry(fileID: [UInt8](item.fileID), digest: [UInt8](item.digest), sealed: sealed))
            }
            return out
        }
    }

    private func manyManifests(_ items: [GetManifestRequest]) async throws -> [ManifestBundle.Entry] {
        let body = try [UInt8](JSONEncoder().encode(ManyManifestsRequest(items: items)))
        return try Self.manifestEntries(try await raw("POST", API.prefix + "/manifests/many", body: body), items)
    }

    public func putManifest(_ request: PutManifestRequest) async throws {
        try await send("POST", API.prefix + "/manifests", request)
    }

    /// `getManifests` without awaiting (content on demand).
    public func getManifestsBlocking(_ items: [GetManifestRequest]) throws -> [ManifestBundle.Entry] {
        let body = try [UInt8](JSONEncoder().encode(ManyManifestsRequest(items: items)))
        return try Self.manifestEntries(try rawBlocking("POST", API.prefix + "/manifests/many", body: body), items)
    }

    /// `getChunks` without awaiting (content on demand).
    public func getChunksBlocking(_ ids: [[UInt8]], via: FileID? = nil) throws -> [[UInt8]: [UInt8]] {
        let body = try [UInt8](
            JSONEncoder().encode(ChunkIDsRequest(ids: ids.map { Data($0) }, via: via.map { Data($0.bytes) })))
        return try Self.chunks(try rawBlocking("POST", API.prefix + "/chunks/get", body: body))
    }

    static func chunks(_ data: [UInt8]) throws -> [[UInt8]: [UInt8]] {
        guard let chunks = ChunkBundle.decode(data) else { throw SyncError.protocolError("malformed chunk bundle") }
        var out: [[UInt8]: [UInt8]] = [:]
        for c in chunks { out[c.id] = c.sealed }
        return out
    }

    static func manifestEntries(_ data: [UInt8], _ items: [GetManifestRequest]) throws -> [ManifestBundle.Entry] {
        guard let entries = ManifestBundle.decode(data), entries.count == items.count else {
            throw SyncError.protocolError("malformed manifest bundle")
        }
        for (e, asked) in zip(entries, items) where e.fileID != Array(asked.fileID) || e.digest != Array(asked.digest) {
            throw SyncError.protocolError("the server answered for other manifests than were asked")
        }
        return entries
    }

    public func getManifest(fileID: FileID, digest: [UInt8]) async throws -> [UInt8] {
        let body = try [UInt8](
            JSONEncoder().encode(GetManifestRequest(fileID: Data(fileID.bytes), digest: Data(digest))))
        return try await raw("POST", API.prefix + "/manifests/get", body: body)
    }

    public func usage() async throws -> UsageResponse {
        try await json("GET", API.prefix + "/usage", Optional<Empty>.none)
    }
}
