import CofferProtocol

/// An endpoint's refusal: an HTTP status, a stable `code` from `ErrorResponse`, and a message
/// for people. Client mistakes are always 4xx; only storage failures become 500.
public struct ServerError: Error, Sendable, Equatable, CustomStringConvertible {
    public var status: Int
    public var code: String
    public var message: String
    /// What went wrong inside the server (storage errors): for its log, never for the client.
    public var detail: String?

    public init(_ status: Int, _ code: String, _ message: String, detail: String? = nil) {
        self.status = status
        self.code = code
        self.message = message
        self.detail = detail
    }

    public var description: String { "\(status) \(code): \(message)" + (detail.map { " (\($0))" } ?? "") }
    public var response: ErrorResponse { ErrorResponse(code: code, message: message) }

    public static func badRequest(_ m: String) -> ServerError { .init(400, ErrorResponse.badRequest, m) }
    public static func unauthorized(_ m: String) -> ServerError { .init(401, ErrorResponse.unauthorized, m) }
    public static func forbidden(_ m: String) -> ServerError { .init(403, ErrorResponse.forbidden, m) }
    public static func notFound(_ m: String) -> ServerError { .init(404, ErrorResponse.notFound, m) }
    public static func conflict(_ m: String) -> ServerError { .init(409, ErrorResponse.conflict, m) }
    public static func getUpdatesRequired(_ m: String) -> ServerError {
        .init(409, ErrorResponse.getUpdatesRequired, m)
    }
    public static func invalidTree(_ m: String) -> ServerError { .init(409, ErrorResponse.invalidTree, m) }
    public static func writesPaused(_ m: String) -> ServerError { .init(409, ErrorResponse.writesPaused, m) }
    public static func tooLarge(_ m: String) -> ServerError { .init(413, ErrorResponse.tooLarge, m) }
    public static func quotaExceeded(_ m: String) -> ServerError { .init(413, ErrorResponse.quotaExceeded, m) }
    public static func rateLimited(_ m: String) -> ServerError { .init(429, ErrorResponse.rateLimited, m) }
    public static func `internal`(_ m: String) -> ServerError { .init(500, "internal", m) }
    /// A 500 that tells the client nothing about the server's insides; `detail` is logged.
    public static func `internal`(detail: String) -> ServerError {
        .init(500, "internal", "internal server error; the server's log has the details", detail: detail)
    }
}
