import CofferCrypto
import CofferModel
import Foundation

/// An account's public keys under its own signature: what the server serves for a username, so
/// that a device sharing with that username need not take the server's word for its keys
/// (docs/SHARING.md, "Accounts, keys and contacts").
///
/// The signature binds the username (by `Username.key`, so every spelling of one account agrees),
/// the signing key and the box key: a server cannot pair a real account's signing key with a box
/// key of its own, nor move a card to another name. What it could still do is invent an account
/// of its own under a name nobody has yet checked; that is what pinning and fingerprints are for.
///
/// ```swift
/// let card = KeyCard(username: "bob", signing: bobKeys, boxKey: bobBox)
/// card.isValid            // true
/// card.fingerprint        // "3f9a 0c1e …" (ten groups of four hex digits)
/// ```
public struct KeyCard: Sendable, Equatable {
    public var username: String
    public var signingKey: [UInt8]
    public var boxKey: [UInt8]
    public var signature: [UInt8]

    public init(username: String, signingKey: [UInt8], boxKey: [UInt8], signature: [UInt8]) {
        self.username = username
        self.signingKey = signingKey
        self.boxKey = boxKey
        self.signature = signature
    }

    /// A card signed by its own account.
    public init(username: String, signing keys: SigningKeyPair, boxKey: [UInt8]) {
        self.username = username
        self.signingKey = keys.publicKey.bytes
        self.boxKey = boxKey
        self.signature = keys.sign(Self.message(username: username, signingKey: keys.publicKey.bytes, boxKey: boxKey))
    }

    static let tag: [UInt8] = Array("CFKC".utf8)

    /// The signed bytes: a tag of their own, a version, the username's key, both public keys.
    public static func message(username: String, signingKey: [UInt8], boxKey: [UInt8]) -> [UInt8] {
        let name = Array((Username.key(username) ?? username).utf8)
        var out = tag + [1]
        out += withUnsafeBytes(of: UInt32(name.count).bigEndian, Array.init)
        return out + name + signingKey + boxKey
    }

    /// Whether the keys are well formed and the signature is the signing key's over them.
    public var isValid: Bool {
        guard signingKey.count == 32, boxKey.count == 32, let key = try? PublicSigningKey(bytes: signingKey) else {
            return false
        }
        return key.verify(
            signature: signature, message: Self.message(username: username, signingKey: signingKey, boxKey: boxKey))
    }

    /// What people compare out of band (`KeyFingerprint`).
    public var fingerprint: String { KeyFingerprint.of(signingKey) }
}
