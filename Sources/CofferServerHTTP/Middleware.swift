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

    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        let start = ContinuousClock.now
        let response: Response
        do {
            response = try await next(request, context)
        } catch let e as ServerError {
            response = CofferHTTP.errorResponse(e)
        } catch let e as HTTPError {
            response = CofferHTTP.errorResponse(Self.map(e))
        } catch let e as any HTTPResponseError {
            response = CofferHTTP.errorResponse(ServerError(Int(e.status.code), Self.code(for: Int(e.status.code)), "request refused"))
        } catch {
            response = CofferHTTP.errorResponse(.internal("internal error"))
        }
        let elapsed = ContinuousClock.now - start
        let ms = Double(elapsed.components.seconds) * 1000 + Double(elapsed.components.attoseconds) / 1e15
        var account = "-"
        if let h = request.headers[CofferHTTP.accountField], h.utf8.count == 64, RequestSigning.unhex(h) != nil {
            account = String(h.prefix(8)).lowercased()
        }
        let path = request.uri.path
        let level: Logger.Level = response.status.code >= 500 ? .error : .info
        logger.log(level: level, "request", metadata: [
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
        if path.hasPrefix("/v1/chunks/"), path != "/v1/chunks/missing", path != "/v1/chunks/get" { return "/v1/chunks/:id" }
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

/// Verifies the four signing headers of every request but `GET /health` (signature over method,
/// path with query, body hash, timestamp and nonce; timestamp within 5 minutes; nonce never seen
/// before from that account, remembered in the shared metadata store), after collecting the body
/// within `API.maxBodyBytes` (413 `too_large` beyond).
struct AuthenticationMiddleware: RouterMiddleware {
    typealias Context = CofferRequestContext
    let server: CofferServer

    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        if CofferHTTP.unauthenticatedPaths.contains(request.uri.path) { return try await next(request, context) }
        if let length = request.headers[.contentLength].flatMap({ Int($0) }), length > CofferHTTP.maxBodyBytes {
            throw ServerError.tooLarge("request body is larger than \(CofferHTTP.maxBodyBytes) bytes")
        }
        var request = request
        let buffer: ByteBuffer
        do {
            buffer = try await request.collectBody(upTo: CofferHTTP.maxBodyBytes)
        } catch {
            throw ServerError.tooLarge("request body is larger than \(CofferHTTP.maxBodyBytes) bytes")
        }
        var context = context
        context.body = Array(buffer.readableBytesView)
        let headers = request.headers
        let body = context.body
        let method = request.method.rawValue
        let path = request.head.path ?? ""
        let caller = try await CofferHTTP.offload { [server] () throws(ServerError) -> Data in
            try server.authenticate(method: method, path: path, body: body,
                                    account: headers[CofferHTTP.accountField], timestamp: headers[CofferHTTP.timestampField],
                                    nonce: headers[CofferHTTP.nonceField], signature: headers[CofferHTTP.signatureField])
        }
        context.caller = caller
        return try await next(request, context)
    }
}

/// A token bucket per client address for account creation.
final class RateLimiter: Sendable {
    let perMinute: Int
    let state: Mutex<[String: (tokens: Double, at: ContinuousClock.Instant)]> = Mutex([:])

    init(perMinute: Int) { self.perMinute = perMinute }

    /// Takes one token for `key`; false when none is left.
    func allow(_ key: String) -> Bool {
        guard perMinute > 0 else { return true }
        let now = ContinuousClock.now
        let capacity = Double(perMinute)
        return state.withLock { buckets in
            if buckets.count > 100_000 { buckets.removeAll() }
            var b = buckets[key] ?? (capacity, now)
            let elapsed = now - b.at
            let seconds = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
            b.tokens = min(capacity, b.tokens + seconds * capacity / 60)
            b.at = now
            guard b.tokens >= 1 else { buckets[key] = b; return false }
            b.tokens -= 1
            buckets[key] = b
            return true
        }
    }
}
