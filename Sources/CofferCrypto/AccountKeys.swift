import CSodium

/// The one secret an account has: 32 random bytes. Everything else is derived from it with
/// domain separation, so exporting this seed (as a phrase or base64) moves the whole account.
public struct AccountSecret: Sendable, Equatable {
    public static let byteCount = 32
    public let seed: [UInt8]

    public init(seed: [UInt8]) throws {
        guard seed.count == Self.byteCount else {
            throw CryptoError.invalidLength("an account secret has 32 bytes, got \(seed.count)")
        }
        self.seed = seed
    }

    public static func generate() -> AccountSecret {
        AccountSecret(unchecked: randomBytes(byteCount))
    }

    init(unchecked: [UInt8]) { self.seed = unchecked }

    private func subseed(_ id: UInt64, _ context: String) -> [UInt8] {
        (try? SymmetricKey(bytes: seed))?.derive(subkeyID: id, context: context).bytes ?? []
    }

    /// Ed25519 keys for signing metadata and requests.
    public var signingKeys: SigningKeyPair {
        ensureSodium()
        var pk = [UInt8](repeating: 0, count: Int(crypto_sign_publickeybytes()))
        var sk = [UInt8](repeating: 0, count: Int(crypto_sign_secretkeybytes()))
        _ = crypto_sign_seed_keypair(&pk, &sk, subseed(1, "cfsign"))
        return SigningKeyPair(publicKey: PublicSigningKey(unchecked: pk), secret: sk)
    }

    /// X25519 keys for receiving wrapped file keys (sealed boxes).
    public var boxKeys: BoxKeyPair {
        ensureSodium()
        var pk = [UInt8](repeating: 0, count: Int(crypto_box_publickeybytes()))
        var sk = [UInt8](repeating: 0, count: Int(crypto_box_secretkeybytes()))
        _ = crypto_box_seed_keypair(&pk, &sk, subseed(2, "cfbox"))
        return BoxKeyPair(publicKey: PublicBoxKey(unchecked: pk), secret: sk)
    }
}

/// An account's public identity: its Ed25519 key. Owners and access entries name accounts by it.
public struct PublicSigningKey: Sendable, Hashable {
    public let bytes: [UInt8]
    public init(bytes: [UInt8]) throws {
        guard bytes.count == 32 else {
            throw CryptoError.invalidLength("a public signing key has 32 bytes, got \(bytes.count)")
        }
        self.bytes = bytes
    }
    init(unchecked: [UInt8]) { self.bytes = unchecked }

    /// Whether `signature` is `signer`'s (an account's key, as records name it) over `message`;
    /// false for a malformed key, as for a wrong signature.
    public static func isValid(_ signer: [UInt8], _ message: [UInt8], _ signature: [UInt8]) -> Bool {
        (try? PublicSigningKey(bytes: signer))?.verify(signature: signature, message: message) ?? false
    }

    public func verify(signature: [UInt8], message: [UInt8]) -> Bool {
        ensureSodium()
        guard signature.count == Int(crypto_sign_bytes()) else { return false }
        return crypto_sign_verify_detached(signature, message, UInt64(message.count), bytes) == 0
    }
}

public struct PublicBoxKey: Sendable, Hashable {
    public let bytes: [UInt8]
    public init(bytes: [UInt8]) throws {
        guard bytes.count == 32 else {
            throw CryptoError.invalidLength("a public box key has 32 bytes, got \(bytes.count)")
        }
        self.bytes = bytes
    }
    init(unchecked: [UInt8]) { self.bytes = unchecked }

    /// Seals a file key for this account. The file id travels inside the box and is checked on
    /// open, because sealed boxes take no associated data.
    public func seal(key: SymmetricKey, fileID: [UInt8]) -> [UInt8] { seal([1] + fileID + key.bytes) }

    /// Seals a file key granted to this account by another (a share). Sealed boxes take no
    /// associated data, so `binding` (the file, the grantee, the mode and the grantor:
    /// `AccessEntry.keyBinding`) travels inside the box and must match on open: a grant's key
    /// cannot be presented as another file's, another mode's or another grantor's.
    public func seal(key: SymmetricKey, binding: [UInt8]) -> [UInt8] { seal([2] + binding + key.bytes) }

    private func seal(_ message: [UInt8]) -> [UInt8] {
        ensureSodium()
        var out = [UInt8](repeating: 0, count: message.count + Int(crypto_box_sealbytes()))
        _ = crypto_box_seal(&out, message, UInt64(message.count), bytes)
        return out
    }
}

public struct SigningKeyPair: Sendable {
    public let publicKey: PublicSigningKey
    let secret: [UInt8]

    public func sign(_ message: [UInt8]) -> [UInt8] {
        ensureSodium()
        var sig = [UInt8](repeating: 0, count: Int(crypto_sign_bytes()))
        _ = crypto_sign_detached(&sig, nil, message, UInt64(message.count), secret)
        return sig
    }
}

public struct BoxKeyPair: Sendable {
    public let publicKey: PublicBoxKey
    let secret: [UInt8]

    public func open(sealedKey: [UInt8], fileID: [UInt8]) throws -> SymmetricKey {
        try open(sealedKey, version: 1, context: fileID, what: "sealed key", bound: "bound to another file")
    }

    /// Opens a key sealed with `PublicBoxKey.seal(key:binding:)`; fails unless it was sealed for
    /// this account with exactly this binding.
    public func open(sealedKey: [UInt8], binding: [UInt8]) throws -> SymmetricKey {
        try open(
            sealedKey, version: 2, context: binding, what: "granted key",
            bound: "bound to another file, account or mode")
    }

    /// Opens `version ‖ context ‖ key` sealed to this account, checking version and context.
    private func open(
        _ sealedKey: [UInt8], version: UInt8, context: [UInt8], what: String, bound: String
    ) throws -> SymmetricKey {
        ensureSodium()
        let overhead = Int(crypto_box_sealbytes())
        guard sealedKey.count == overhead + 1 + context.count + SymmetricKey.byteCount else {
            throw CryptoError.authenticationFailed(what)
        }
        var message = [UInt8](repeating: 0, count: sealedKey.count - overhead)
        guard crypto_box_seal_open(&message, sealedKey, UInt64(sealedKey.count), publicKey.bytes, secret) == 0 else {
            throw CryptoError.authenticationFailed(what)
        }
        guard message[0] == version, Array(message[1..<(1 + context.count)]) == context else {
            throw CryptoError.authenticationFailed("\(what) (\(bound))")
        }
        return SymmetricKey(unchecked: Array(message[(1 + context.count)...]))
    }
}

/// Wrapping a file's key with its parent's key (the key chain).
public enum KeyWrap {
    public static func wrap(_ key: SymmetricKey, with parentKey: SymmetricKey, fileID: [UInt8]) -> [UInt8] {
        AEAD.seal(key.bytes, key: parentKey, purpose: .keyWrap, fileID: fileID)
    }

    public static func unwrap(_ wrapped: [UInt8], with parentKey: SymmetricKey, fileID: [UInt8]) throws -> SymmetricKey
    {
        let raw = try AEAD.open(wrapped, key: parentKey, purpose: .keyWrap, fileID: fileID, what: "wrapped file key")
        return try SymmetricKey(bytes: raw)
    }
}

/// What people compare out of band to know they hold the right account key: the first 20 bytes
/// of SHA-256 of an account's signing key, as ten groups of four hex digits.
public enum KeyFingerprint {
    public static func of(_ signingKey: [UInt8]) -> String {
        let digits = Array("0123456789abcdef")
        let hex = String(sha256(signingKey).prefix(20).flatMap { [digits[Int($0 >> 4)], digits[Int($0 & 15)]] })
        var groups: [Substring] = []
        var rest = Substring(hex)
        while !rest.isEmpty {
            groups.append(rest.prefix(4))
            rest = rest.dropFirst(4)
        }
        return groups.joined(separator: " ")
    }

    /// A fingerprint as typed (any case, with spaces, colons or dashes), in one comparable form.
    public static func normalized(_ typed: String) -> String {
        String(typed.lowercased().filter { $0.isHexDigit })
    }
}
