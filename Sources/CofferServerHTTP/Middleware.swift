import CofferProtocol
import CofferServerCore
import Foundation
import HTTPTypes
import Hummingbird
import Logging
import NIOCore
import Synchronization

/// Outermost: turns every error into an `ErrorResponse` with a 4xx status (500 only for the
/// server's own failures) and logs one line per request: method, path, status, duration and the
/// first 8 hex digits of the signing account. Nothing else from the request is logged.
struct ErrorAndLogMiddleware: RouterMiddleware {
    typealias Context = CofferRequestContext
    let logger: Logger

    func handle(
        _ request: Request, context: Context, next: (Request, Context) async throws -> Response
    ) async throws -> Response {
        let start = ContinuousClock.now
        let response: Response
        do {
            response = try await next(request, context)
        } catch {
            let refusal: ServerError
            switch error {
            case let e as ServerError: refusal = e
            case let e as HTTPError: refusal = Self.map(e)
            case let e as any HTTPResponseError:
                refusal = ServerError(Int(e.status.code), Self.code(for: Int(e.status.code)), "request refused")
            default: refusal = .internal(detail: "\(error)")
            }
            // The detail of the server's own failures goes to the log, never into the answer.
            if let detail = refusal.detail {
                logger.error(
                    "internal failure",
                    metadata: ["path": .string(Self.loggablePath(request.uri.path)), "detail": .string(detail)])
            }
            response = CofferHTTP.errorResponse(refusal)
        }
        let elapsed = ContinuousClock.now - start
        let ms = Double(elapsed.components.seconds) * 1000 + Double(elapsed.components.attoseconds) / 1e15
        var account = "-"
        if let h = request.headers[CofferHTTP.accountField], h.utf8.count == 64, RequestSigning.unhex(h) != nil {
            account = String(h.prefix(8)).lowercased()
        }
        let path = request.uri.path
        let level: Logger.Level = response.status.code >= 500 ? .error : .info
        logger.log(
            level: level, "request",
            metadata: [
                "method": .string(request.method.rawValue),
                "path": .string(Self.loggablePath(path)),
                "status": .stringConvertible(response.status.code),
                "ms": .string(String(format: "%.1f", ms)),
                "account": .string(account),
            ])
        return response
    }

    /// Paths are logged without the username of a lookup (a name, which is not the server's to log).
    static func loggablePath(_ path: String) -> String {
        if path.hasPrefix("/v1/accounts/") { return "/v1/accounts/:username" }
        if path.hasPrefix("/v1/chunks/"), path != "/v1/chunks/missing", path != "/v1/chunks/get" {
            return "/v1/chunks/:id"
        }
        return String(path.prefix(64))
    }

    static func code(for status: Int) -> String {
        switch status {
        case 401: return ErrorResponse.unauthorized
        case 403: return ErrorResponse.forbidden
        case 404: return ErrorResponse.notFound
        case 409: return ErrorResponse.conflict
        case 413: return ErrorResponse.tooLarge
        case 429: return ErrorResponse.rateLimited
        default: return status >= 500 ? "internal" : ErrorResponse.badRequest
        }
    }

    static func map(_ e: HTTPError) -> ServerError {
        let status = Int(e.status.code)
        let message: String
        switch status {
        case 404: message = "no such endpoint"
        case 405: message = "method not allowed"
        case 413: message = "request body is larger than \(API.maxBodyBytes) bytes"
        default: message = e.body ?? e.status.reasonPhrase
        }
        return ServerError(status, code(for: status), message)
    }
}

/// Authenticates every request but `GET /health`, in two steps around reading the body:
/// 1. before any of the body is read, `CofferServer.preauthenticate` checks the signing headers'
///    presence and form, the timestamp window, and that the key has an account (except for
///    `POST /v1/accounts`); a request failing that is refused with 401 and its body is never
///    collected (Hummingbird discards whatever the client still sends);
/// 2. then the body is collected within `API.maxBodyBytes` (413 `too_large` beyond), the
///    signature verified over it and the nonce recorded in the server's nonce store.
///
/// Bodies being collected at once, over all connections, are bounded by a `BodyBudget`: a
/// request whose body would exceed it gets 503 `busy` at once (a key's account is public, so the
/// checks before the body cannot keep a stranger from announcing large bodies).
struct AuthenticationMiddleware: RouterMiddleware {
    typealias Context = CofferRequestContext
    let server: CofferServer
    let budget: BodyBudget

    func handle(
        _ request: Request, context: Context, next: (Request, Context) async throws -> Response
    ) async throws -> Response {
        if CofferHTTP.unauthenticatedPaths.contains(request.uri.path) { return try await next(request, context) }
        let headers = request.headers
        let mayCreateAccount = request.method == .post && request.uri.path == "/v1/accounts"
        let pre = try await CofferHTTP.offload { [server] () throws(ServerError) -> CofferServer.Preauthenticated in
            try server.preauthenticate(
                account: headers[CofferHTTP.accountField], timestamp: headers[CofferHTTP.timestampField],
                nonce: headers[CofferHTTP.nonceField], signature: headers[CofferHTTP.signatureField],
                mayCreateAccount: mayCreateAccount)
        }
        // Account creation is the one request any fresh key may make, so its body is kept small:
        // strangers must not be able to hold the shared body budget with large announced bodies.
        let limit = mayCreateAccount ? CofferHTTP.maxAccountRequestBytes : CofferHTTP.maxBodyBytes
        let announced = headers[.contentLength].flatMap { Int($0) }
        if let length = announced, length > limit {
            throw ServerError.tooLarge("request body is larger than \(limit) bytes")
        }
        let reserved = CofferHTTP.bodyReservation(
            announced: announced, chunked: headers[.transferEncoding] != nil, limit: limit)
        guard budget.reserve(reserved) else {
            throw ServerError(503, "busy", "the server is receiving too many request bodies at once; try again shortly")
        }
        defer { budget.release(reserved) }
        var request = request
        let buffer: ByteBuffer
        do {
            buffer = try await request.collectBody(upTo: limit)
        } catch {
            throw ServerError.tooLarge("request body is larger than \(limit) bytes")
        }
        var context = context
        context.body = Array(buffer.readableBytesView)
        let body = context.body
        let method = request.method.rawValue
        let path = request.head.path ?? ""
        let caller = try await CofferHTTP.offload { [server] () throws(ServerError) -> Data in
            try server.authenticate(pre, method: method, path: path, body: body)
        }
        context.caller = caller
        return try await next(request, context)
    }
}

/// Bytes of request bodies held at once (from the start of their collection until their request
/// is answered), over all connections.
final class BodyBudget: Sendable {
    let limit: Int
    let inUse = Atomic<Int>(0)
    init(limit: Int) { self.limit = limit }

    func reserve(_ bytes: Int) -> Bool {
        var current = inUse.load(ordering: .relaxed)
        while true {
            guard bytes <= limit - current else { return false }
            let (exchanged, original) = inUse.compareExchange(
                expected: current, desired: current + bytes, ordering: .relaxed)
            if exchanged { return true }
            current = original
        }
    }

    func release(_ bytes: Int) { inUse.wrappingSubtract(bytes, ordering: .relaxed) }
}

/// Caps the open connections of one server: a connection past `max` is closed as soon as it is
/// accepted, so idle or slow clients cannot take every socket and starve the rest.
final class ConnectionGate: Sendable {
    let max: Int
    let open = Atomic<Int>(0)
    init(max: Int) { self.max = max }
}

/// Counts one connection in its `ConnectionGate` while it is open; closes it if the gate is full.
final class ConnectionCounter: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = Any
    let gate: ConnectionGate
    var counted = false

    init(gate: ConnectionGate) { self.gate = gate }

    func handlerAdded(context: ChannelHandlerContext) {
        if context.channel.isActive { admit(context) }
    }

    func channelActive(context: ChannelHandlerContext) {
        admit(context)
        context.fireChannelActive()
    }

    func channelInactive(context: ChannelHandlerContext) {
        release()
        context.fireChannelInactive()
    }

    func handlerRemoved(context: ChannelHandlerContext) { release() }

    private func admit(_ context: ChannelHandlerContext) {
        guard !counted else { return }
        counted = true
        if gate.open.wrappingAdd(1, ordering: .relaxed).newValue > gate.max {
            context.close(promise: nil)
        }
    }

    private func release() {
        guard counted else { return }
        counted = false
        gate.open.wrappingSubtract(1, ordering: .relaxed)
    }
}

/// A token bucket per client address for account creation.
final class RateLimiter: Sendable {
    let perMinute: Int
    let clock: @Sendable () -> ContinuousClock.Instant
    let state: Mutex<[String: (tokens: Double, at: ContinuousClock.Instant)]> = Mutex([:])

    init(perMinute: Int, clock: @escaping @Sendable () -> ContinuousClock.Instant = { .now }) {
        self.perMinute = perMinute
        self.clock = clock
    }

    /// Takes one token for `key`; false when none is left.
    func allow(_ key: String) -> Bool {
        guard perMinute > 0 else { return true }
        let now = clock()
        let capacity = Double(perMinute)
        return state.withLock { buckets in
            if buckets.count > 100_000 { buckets.removeAll() }
            var b = buckets[key] ?? (capacity, now)
            let elapsed = now - b.at
            let seconds = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
            b.tokens = min(capacity, b.tokens + seconds * capacity / 60)
            b.at = now
            guard b.tokens >= 1 else {
                buckets[key] = b
                return false
            }
            b.tokens -= 1
            buckets[key] = b
            return true
        }
    }
}
