import CofferServerCore
import Foundation
import Hummingbird
import NIOCore

/// Per-request state: the client address (for the account-creation rate limit) and, once the
/// authentication middleware has run, the verified caller and the collected body.
public struct CofferRequestContext: RequestContext, RemoteAddressRequestContext {
    public var coreContext: CoreRequestContextStorage
    public let remoteAddress: SocketAddress?
    /// The verified caller's public key (set by `AuthenticationMiddleware`).
    public var caller: Data?
    /// The whole request body (collected, within `API.maxBodyBytes`, by `AuthenticationMiddleware`).
    public var body: [UInt8] = []

    public init(source: ApplicationRequestContextSource) {
        coreContext = .init(source: source)
        remoteAddress = source.channel.remoteAddress
    }

    public var maxUploadSize: Int { CofferHTTP.maxBodyBytes }

    /// The caller, or 401.
    func requireCaller() throws(ServerError) -> Data {
        guard let caller else { throw .unauthorized("request is not signed") }
        return caller
    }
}
