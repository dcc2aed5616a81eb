import CofferCrypto
import CofferModel
import Foundation

/// Request authentication: every request carries the account's public key, a timestamp, a random
/// nonce and an Ed25519 signature over the canonical string below. The server refuses a bad
/// signature, a timestamp more than `API.maxClockSkewMillis` away, and a nonce it has seen.
///
///     COFFER-REQUEST-2\n<hex server id>\n<METHOD>\n<path with query>\n
///     <hex sha256 of body>\n<timestamp ms>\n<hex nonce>
///
/// (one string; broken here for width)
///
/// The server id (`GET /v1/server`, 16 random bytes the server made once) binds a request to the
/// one server it was meant for: captured on its way, it cannot be replayed against another
/// server, which checks signatures against its own id.
public enum RequestSigning {
    public static let accountHeader = "coffer-account"
    public static let timestampHeader = "coffer-timestamp"
    public static let nonceHeader = "coffer-nonce"
    public static let signatureHeader = "coffer-signature"
    /// Bytes in a server id.
    public static let serverIDBytes = 16

    public static func canonical(
        server: [UInt8], method: String, path: String, body: [UInt8], timestamp: Int64, nonce: String
    ) -> [UInt8] {
        let lines = [
            "COFFER-REQUEST-2", hex(server), method.uppercased(), path, hex(sha256(body)), String(timestamp), nonce,
        ]
        return Array(lines.joined(separator: "\n").utf8)
    }

    /// The four headers for a request to the server whose id is `server`.
    public static func headers(
        keys: SigningKeyPair, server: [UInt8], method: String, path: String, body: [UInt8],
        timestamp: Int64, nonce: [UInt8] = randomBytes(16)
    ) -> [(String, String)] {
        let n = hex(nonce)
        let sig = keys.sign(
            canonical(server: server, method: method, path: path, body: body, timestamp: timestamp, nonce: n))
        return [
            (accountHeader, hex(keys.publicKey.bytes)), (timestampHeader, String(timestamp)),
            (nonceHeader, n), (signatureHeader, hex(sig)),
        ]
    }

    public static func verify(
        account: PublicSigningKey, server: [UInt8], method: String, path: String, body: [UInt8],
        timestamp: Int64, nonce: String, signature: [UInt8]
    ) -> Bool {
        account.verify(
            signature: signature,
            message: canonical(
                server: server, method: method, path: path, body: body, timestamp: timestamp, nonce: nonce))
    }

    public static func hex(_ bytes: [UInt8]) -> String { hexString(bytes) }

    public static func unhex(_ s: String) -> [UInt8]? { bytesFromHex(s) }
}
