import CSodium

/// libsodium must be initialised once before use; `sodium_init` is itself thread-safe and
/// idempotent, so every entry point calls this instead of relying on a global initialiser.
@inline(__always)
func ensureSodium() {
    _ = sodiumReady
}

private let sodiumReady: Bool = {
    sodium_init() >= 0
}()

/// Errors from the cryptographic layer. Messages are meant for the person at the keyboard.
public enum CryptoError: Error, Equatable, CustomStringConvertible {
    case authenticationFailed(String)
    case invalidLength(String)
    case invalidSignature
    case invalidPhrase(String)
    case invalidEncoding(String)
    case internalFailure(String)

    public var description: String {
        switch self {
        case .authenticationFailed(let what):
            return "decryption failed: \(what) is corrupt or was sealed with another key"
        case .invalidLength(let what): return "invalid length: \(what)"
        case .invalidSignature: return "signature does not verify"
        case .invalidPhrase(let why): return "invalid recovery phrase: \(why)"
        case .invalidEncoding(let why): return "invalid key encoding: \(why)"
        case .internalFailure(let why): return "cryptography failure: \(why)"
        }
    }
}

/// Fills a new buffer with `count` random bytes from the OS CSPRNG.
public func randomBytes(_ count: Int) -> [UInt8] {
    ensureSodium()
    var out = [UInt8](repeating: 0, count: count)
    out.withUnsafeMutableBytes { if let b = $0.baseAddress { randombytes_buf(b, count) } }
    return out
}

/// Plain (unkeyed) BLAKE2b-256, used for content addressing of ciphertexts.
public func blake2b(_ data: [UInt8], key: [UInt8]? = nil, outputLength: Int = 32) -> [UInt8] {
    ensureSodium()
    var out = [UInt8](repeating: 0, count: outputLength)
    data.withUnsafeBufferPointer { d in
        if let key {
            key.withUnsafeBufferPointer { k in
                _ = crypto_generichash(&out, outputLength, d.baseAddress, UInt64(d.count), k.baseAddress, k.count)
            }
        } else {
            _ = crypto_generichash(&out, outputLength, d.baseAddress, UInt64(d.count), nil, 0)
        }
    }
    return out
}

/// Bytes of a `shortHash` key.
public let shortHashKeyBytes = 16

/// SipHash-2-4 of `data` under a 16-byte key: a 64-bit hash that whoever does not hold the key
/// cannot steer, so ids chosen elsewhere (another device, another account's share) cannot be
/// picked to collide. Inode numbers are made with it (docs/FILESYSTEM.md, "Inode numbers").
public func shortHash(_ data: [UInt8], key: [UInt8]) throws -> UInt64 {
    guard key.count == shortHashKeyBytes else {
        throw CryptoError.invalidLength("a short-hash key has \(shortHashKeyBytes) bytes, got \(key.count)")
    }
    ensureSodium()
    var out: UInt64 = 0
    withUnsafeMutableBytes(of: &out) { o in
        guard let p = o.baseAddress?.assumingMemoryBound(to: UInt8.self) else { return }
        data.withUnsafeBufferPointer { d in
            key.withUnsafeBufferPointer { k in
                guard let kp = k.baseAddress else { return }
                _ = crypto_shorthash_siphash24(p, d.baseAddress, UInt64(d.count), kp)
            }
        }
    }
    return UInt64(littleEndian: out)
}

/// SHA-256, used only where a standard demands it (the recovery phrase checksum).
public func sha256(_ data: [UInt8]) -> [UInt8] {
    ensureSodium()
    var out = [UInt8](repeating: 0, count: 32)
    _ = data.withUnsafeBufferPointer { crypto_hash_sha256(&out, $0.baseAddress, UInt64($0.count)) }
    return out
}

/// Constant-time comparison for MACs and digests.
public func constantTimeEqual(_ a: [UInt8], _ b: [UInt8]) -> Bool {
    guard a.count == b.count else { return false }
    ensureSodium()
    return a.withUnsafeBufferPointer { x in
        b.withUnsafeBufferPointer { y in sodium_memcmp(x.baseAddress, y.baseAddress, a.count) == 0 }
    }
}
