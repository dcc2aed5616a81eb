import CofferProtocol
import CofferServerCore
import Foundation
import HTTPTypes
import Hummingbird
import HummingbirdCore
import HummingbirdTLS
import Logging
import NIOCore
import NIOSSL
import ServiceLifecycle

/// The HTTP face of `CofferServer`: the routes of docs/PROTOCOL.md, request authentication, body
/// limits, the account-creation rate limit, error mapping and request logs.
public enum CofferHTTP {
    public static let maxBodyBytes = API.maxBodyBytes
    /// What a request holds of the shared body budget while its body is read: the length it
    /// announces, or for a chunked body (no length) the most it may be; a request with neither
    /// has no body and holds nothing (a GET must not take 32 MiB of the budget).
    package static func bodyReservation(announced: Int?, chunked: Bool, limit: Int) -> Int {
        if let announced { return max(0, announced) }
        return chunked ? limit : 0
    }

    /// Largest `POST /v1/accounts` body (a username, two keys and an invite code fit many times).
    public static let maxAccountRequestBytes = 16 * 1024
    /// What anyone may ask without signing: liveness, and the id every signature covers.
    static let unauthenticatedPaths: Set<String> = ["/health", API.prefix + "/server"]
    static let accountField = HTTPField.Name(RequestSigning.accountHeader)!
    static let timestampField = HTTPField.Name(RequestSigning.timestampHeader)!
    static let nonceField = HTTPField.Name(RequestSigning.nonceHeader)!
    static let signatureField = HTTPField.Name(RequestSigning.signatureHeader)!

    public struct Options: Sendable {
        /// Account creations allowed per client address per minute (a token bucket); 0 = no limit.
        public var accountCreationsPerMinute: Int
        /// Serve HTTPS with this configuration (certificate chain and key); nil = plain HTTP.
        public var tls: TLSConfiguration?
        /// The clock the account-creation limit refills by (tests stop it).
        public var rateLimitClock: @Sendable () -> ContinuousClock.Instant = { .now }
        /// A connection that sends nothing (not even the rest of a request head) for this long is
        /// closed; nil = never.
        public var idleTimeoutSeconds: Int?
        /// Open connections at most; more are closed on arrival.
        public var maxConnections: Int
        /// Request body bytes held at once over all connections; past it, 503 `busy`.
        public var maxBufferedBodyBytes: Int
        public static let defaultIdleTimeoutSeconds = 60
        public static let defaultMaxConnections = 512
        public static let defaultMaxBufferedBodyBytes = 512 * 1024 * 1024
        public init(
            accountCreationsPerMinute: Int = 10, idleTimeoutSeconds: Int? = Options.defaultIdleTimeoutSeconds,
            maxConnections: Int = Options.defaultMaxConnections,
            maxBufferedBodyBytes: Int = Options.defaultMaxBufferedBodyBytes, tls: TLSConfiguration? = nil
        ) {
            self.accountCreationsPerMinute = accountCreationsPerMinute
            self.idleTimeoutSeconds = idleTimeoutSeconds
            self.maxConnections = maxConnections
            self.maxBufferedBodyBytes = maxBufferedBodyBytes
            self.tls = tls
        }
    }

    /// The router with every route and middleware.
    public static func router(
        server: CofferServer, options: Options = Options(), logger: Logger
    ) -> Router<CofferRequestContext> {
        let router = Router(context: CofferRequestContext.self)
        router.add(middleware: ErrorAndLogMiddleware(logger: logger))
        router.add(
            middleware: AuthenticationMiddleware(
                server: server, budget: BodyBudget(limit: options.maxBufferedBodyBytes)))
        let limiter = RateLimiter(perMinute: options.accountCreationsPerMinute, clock: options.rateLimitClock)

        router.get("/health") { _, _ in
            Response(
                status: .ok, headers: [.contentType: "text/plain"], body: .init(byteBuffer: ByteBuffer(string: "ok")))
        }

        router.get("/v1/server") { _, _ -> Response in
            try json(ServerInfoResponse(id: Data(server.identity)))
        }

        router.post("/v1/accounts") { _, context -> Response in
            let caller = try context.requireCaller()
            // A malformed request costs no token: the rate limit is for accounts that could exist.
            let req = try decode(CreateAccountRequest.self, context.body)
            _ = try server.checkCreateAccount(caller: caller, req)
            let address = context.remoteAddress?.ipAddress ?? "unknown"
            guard limiter.allow(address) else {
                throw ServerError.rateLimited("too many accounts created from this address; try again later")
            }
            return try json(
                try await offload { () throws(ServerError) in try server.createAccount(caller: caller, req) })
        }

        // The middleware authenticated every request below and found an account for its key
        // (account creation aside); routes do not read the account again.
        router.get("/v1/accounts/:username") { _, context -> Response in
            _ = try context.requireCaller()
            let raw = context.parameters.get("username") ?? ""
            let username = raw.removingPercentEncoding ?? raw
            return try json(try await offload { () throws(ServerError) in try server.lookup(username: username) })
        }

        router.get("/v1/accounts/key/:key") { _, context -> Response in
            _ = try context.requireCaller()
            guard let key = RequestSigning.unhex(context.parameters.get("key") ?? "") else {
                throw ServerError.badRequest("an account key is 64 hex digits")
            }
            return try json(try await offload { () throws(ServerError) in try server.lookup(key: Data(key)) })
        }

        router.post("/v1/accounts/card") { _, context -> Response in
            let caller = try context.requireCaller()
            let req = try decode(KeyCardRequest.self, context.body)
            try await offload { () throws(ServerError) in try server.publishCard(caller: caller, req) }
            return Response(status: .noContent)
        }

        router.post("/v1/files/upsert") { _, context -> Response in
            let caller = try context.requireCaller()
            let req = try decode(UpsertRequest.self, context.body)
            return try json(
                try await offload { () throws(ServerError) in
                    return try server.upsert(caller: caller, req)
                })
        }

        router.get("/v1/contacts") { _, context -> Response in
            let caller = try context.requireCaller()
            return try json(try await offload { () throws(ServerError) in try server.contactBook(caller: caller) })
        }

        router.put("/v1/contacts") { _, context -> Response in
            let caller = try context.requireCaller()
            let req = try decode(ContactBookMessage.self, context.body)
            try await offload { () throws(ServerError) in try server.putContactBook(caller: caller, req) }
            return Response(status: .noContent)
        }

        router.post("/v1/updates") { _, context -> Response in
            let caller = try context.requireCaller()
            let req = try decode(UpdatesRequest.self, context.body)
            return try json(
                try await offload { () throws(ServerError) in
                    return try server.updates(
                        caller: caller, since: req.since, afterID: req.afterID, shared: req.shared ?? false,
                        feedOnly: req.feedOnly ?? false, origin: req.origin)
                })
        }

        // A long poll (docs/SYNC.md, "Live"): registered before the state is read, so a change
        // committed in between still wakes it; answered at once if the caller's view already
        // moved, else when it moves, after the wait, or when the server shuts down.
        router.post("/v1/watch") { _, context -> Response in
            let caller = try context.requireCaller()
            let req = try decode(WatchRequest.self, context.body)
            guard let ticket = server.notifier.register(caller) else {
                throw ServerError.rateLimited("too many watches for this account at once; try again later")
            }
            let first: WatchResponse
            do {
                first = try await offload { () throws(ServerError) in try server.watchState(caller: caller, req) }
            } catch {
                server.notifier.forget(ticket)
                throw error
            }
            if first.changed {
                server.notifier.forget(ticket)
                return try json(first)
            }
            let seconds = min(max(req.wait ?? API.maxWatchSeconds, 1), API.maxWatchSeconds)
            await withGracefulShutdownHandler {
                await server.notifier.wait(ticket, timeout: .seconds(seconds))
            } onGracefulShutdown: {
                server.notifier.wake(ticket)
            }
            return try json(try await offload { () throws(ServerError) in try server.watchState(caller: caller, req) })
        }

        router.post("/v1/chunks/missing") { _, context -> Response in
            let caller = try context.requireCaller()
            let req = try decode(ChunkIDsRequest.self, context.body)
            return try json(
                try await offload { () throws(ServerError) in
                    return try server.missingChunks(caller: caller, ids: req.ids, via: req.via)
                })
        }

        router.post("/v1/chunks/get") { _, context -> Response in
            let caller = try context.requireCaller()
            let req = try decode(ChunkIDsRequest.self, context.body)
            // Planned from the recorded sizes (404, 413) before anything is read, then streamed a
            // piece at a time: memory is bounded by a piece, not by the answer.
            let reader = try await offload { () throws(ServerError) in
                return server.bundleReader(try server.planChunks(caller: caller, ids: req.ids, via: req.via))
            }
            let body = ResponseBody(contentLength: reader.byteCount) { writer in
                while let piece = try await offload({ () throws(ServerError) in try reader.next() }) {
                    try await writer.write(ByteBuffer(bytes: piece))
                }
                try await writer.finish(nil)
            }
            return Response(status: .ok, headers: [.contentType: "application/octet-stream"], body: body)
        }

        router.put("/v1/chunks/:id") { request, context -> Response in
            let caller = try context.requireCaller()
            guard let hex = context.parameters.get("id"), let id = RequestSigning.unhex(hex), id.count == 32 else {
                throw ServerError.badRequest("the path names a chunk by its 32-byte id in hex")
            }
            let via = try viaParameter(request)
            let body = context.body
            try await offload { [via] () throws(ServerError) in
                try server.putChunk(caller: caller, id: Data(id), bytes: body, via: via)
            }
            return Response(status: .noContent)
        }

        router.post("/v1/content") { request, context -> Response in
            let caller = try context.requireCaller()
            let via = try viaParameter(request)
            guard let bundle = ContentBundle(decoding: context.body) else {
                throw ServerError.badRequest("malformed content bundle")
            }
            try await offload { () throws(ServerError) in try server.putContent(caller: caller, bundle, via: via) }
            return Response(status: .noContent)
        }

        router.post("/v1/manifests/many") { _, context -> Response in
            let caller = try context.requireCaller()
            let req = try decode(ManyManifestsRequest.self, context.body)
            return octets(try await offload { () throws(ServerError) in try server.getManifests(caller: caller, req) })
        }

        router.post("/v1/manifests") { _, context -> Response in
            let caller = try context.requireCaller()
            let req = try decode(PutManifestRequest.self, context.body)
            try await offload { () throws(ServerError) in
                try server.putManifest(caller: caller, req)
            }
            return Response(status: .noContent)
        }

        router.post("/v1/manifests/get") { _, context -> Response in
            let caller = try context.requireCaller()
            let req = try decode(GetManifestRequest.self, context.body)
            let sealed = try await offload { () throws(ServerError) in
                return try server.getManifest(caller: caller, req)
            }
            return octets(Array(sealed))
        }

        router.get("/v1/usage") { _, context -> Response in
            let caller = try context.requireCaller()
            return try json(try await offload { () throws(ServerError) in try server.usage(caller: caller) })
        }
        return router
    }

    /// An application serving `server` on host:port, with the idle timeout and connection cap of
    /// `options`. `onRunning` gets the bound port (useful with port 0).
    public static func application(
        server: CofferServer, host: String, port: Int, options: Options = Options(), logger: Logger,
        onRunning: @escaping @Sendable (Int) async -> Void = { _ in }
    ) throws -> some ApplicationProtocol {
        let gate = ConnectionGate(max: options.maxConnections)
        let http1 = HTTP1Channel.Configuration(
            additionalChannelHandlers: [ConnectionCounter(gate: gate)],
            idleTimeout: options.idleTimeoutSeconds.map { .seconds(Int64(min(max($0, 1), 86_400))) })
        let builder: HTTPServerBuilder
        if let tls = options.tls {
            builder = try .tls(.http1(configuration: http1), tlsConfiguration: tls)
        } else {
            builder = .http1(configuration: http1)
        }
        return Application(
            router: router(server: server, options: options, logger: logger), server: builder,
            configuration: .init(address: .hostname(host, port: port), serverName: "coffer-server"),
            onServerRunning: { channel in await onRunning(channel.localAddress?.port ?? port) },
            logger: logger)
    }

    /// A server TLS configuration from PEM files: the certificate chain (leaf first) and its key.
    public static func tlsConfiguration(certificateFile: String, keyFile: String) throws -> TLSConfiguration {
        let chain = try NIOSSLCertificate.fromPEMFile(certificateFile).map { NIOSSLCertificateSource.certificate($0) }
        guard !chain.isEmpty else { throw ServerError.badRequest("\(certificateFile) holds no certificate") }
        return TLSConfiguration.makeServerConfiguration(
            certificateChain: chain, privateKey: .privateKey(try NIOSSLPrivateKey(file: keyFile, format: .pem)))
    }

    // MARK: - Helpers

    /// `?via=FILE` (hex): content for a share another account owns (docs/SHARING.md).
    static func viaParameter(_ request: Request) throws(ServerError) -> Data? {
        guard let hex = request.uri.queryParameters["via"].map(String.init) else { return nil }
        guard let bytes = RequestSigning.unhex(hex), bytes.count == 16 else {
            throw .badRequest("via names a file by its 16-byte id in hex")
        }
        return Data(bytes)
    }

    static func decode<T: Decodable>(_ type: T.Type, _ body: [UInt8]) throws(ServerError) -> T {
        do { return try JSONDecoder().decode(T.self, from: Data(body)) } catch {
            throw .badRequest("malformed \(T.self) body")
        }
    }

    static func json<T: Encodable>(_ value: T) throws(ServerError) -> Response {
        let data: Data
        do { data = try JSONEncoder().encode(value) } catch { throw .internal("cannot encode response") }
        return Response(
            status: .ok, headers: [.contentType: "application/json"], body: .init(byteBuffer: ByteBuffer(bytes: data)))
    }

    static func octets(_ bytes: [UInt8]) -> Response {
        Response(
            status: .ok, headers: [.contentType: "application/octet-stream"],
            body: .init(byteBuffer: ByteBuffer(bytes: bytes)))
    }

    static func errorResponse(_ e: ServerError) -> Response {
        let data = (try? JSONEncoder().encode(e.response)) ?? Data()
        return Response(
            status: HTTPResponse.Status(code: e.status), headers: [.contentType: "application/json"],
            body: .init(byteBuffer: ByteBuffer(bytes: data)))
    }

    /// Runs blocking storage work off the async executors.
    static func offload<T: Sendable>(
        _ work: @escaping @Sendable () throws(ServerError) -> T
    ) async throws(ServerError) -> T {
        let result: Result<T, ServerError> = await withCheckedContinuation { continuation in
            DispatchQueue.global().async {
                do throws(ServerError) { continuation.resume(returning: .success(try work())) } catch {
                    continuation.resume(returning: .failure(error))
                }
            }
        }
        return try result.get()
    }
}
