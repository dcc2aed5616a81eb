import CSodium

/// A passphrase in locked memory (`sodium_malloc`: never swapped out, wiped when freed), so it is
/// never written anywhere and does not linger after use. Whoever reads it from a file or a
/// terminal copies it in from a buffer of its own and wipes that buffer.
public final class Passphrase: @unchecked Sendable {
    /// The longest passphrase accepted, in bytes: anything longer is a file given by mistake.
    public static let maxBytes = 1024

    // Written once in `init`, then only read (and wiped in `deinit`): safe to share.
    private let storage: UnsafeMutableRawPointer
    public let count: Int

    /// Copies `bytes` (the passphrase as typed, UTF-8, without the line break).
    public convenience init(copying bytes: UnsafeRawBufferPointer) throws {
        let copy = try Passphrase.allocate(copying: bytes)
        self.init(storage: copy.storage, count: copy.count)
    }

    public convenience init(_ bytes: [UInt8]) throws {
        let copy = try bytes.withUnsafeBytes { try Passphrase.allocate(copying: $0) }
        self.init(storage: copy.storage, count: copy.count)
    }

    private init(storage: UnsafeMutableRawPointer, count: Int) {
        self.storage = storage
        self.count = count
    }

    private static func allocate(
        copying bytes: UnsafeRawBufferPointer
    ) throws -> (storage: UnsafeMutableRawPointer, count: Int) {
        ensureSodium()
        guard bytes.count > 0 else { throw PassphraseError.empty }
        guard bytes.count <= Self.maxBytes else { throw PassphraseError.tooLong }
        guard let p = sodium_malloc(bytes.count) else { throw PassphraseError.derivationFailed("out of memory") }
        if let source = bytes.baseAddress { p.copyMemory(from: source, byteCount: bytes.count) }
        return (p, bytes.count)
    }

    deinit { sodium_free(storage) }  // sodium_free wipes before it frees

    /// Whether two passphrases are the same bytes (compared in constant time for equal lengths).
    public func matches(_ other: Passphrase) -> Bool {
        count == other.count && sodium_memcmp(storage, other.storage, count) == 0
    }

    /// Lends the bytes, e.g. to hand them to a mount daemon through a pipe. They must not be
    /// copied anywhere that is not wiped.
    public func withUnsafeBytes<R>(_ body: (UnsafeRawBufferPointer) throws -> R) rethrows -> R {
        try body(UnsafeRawBufferPointer(start: storage, count: count))
    }

    func withBytes<R>(_ body: (UnsafePointer<CChar>, Int) throws -> R) rethrows -> R {
        try body(UnsafePointer(storage.assumingMemoryBound(to: CChar.self)), count)
    }
}

/// Where a vault gets the passphrase of a protected account key. Libraries take it as a parameter;
/// the CLI's answers from `COFFER_PASSPHRASE_FILE` or a terminal prompt.
public protocol PassphraseSource: Sendable {
    /// The passphrase an existing key is sealed with. A vault asks for it once per opening, and
    /// only when the key is protected.
    func existingPassphrase() throws -> Passphrase
    /// A passphrase to seal the key with from now on (confirmed, when a person types it).
    func newPassphrase() throws -> Passphrase
}

public enum PassphraseError: Error, Equatable, CustomStringConvertible {
    case empty
    case tooLong
    /// The tag does not verify: a wrong passphrase, or a damaged header or ciphertext (the two
    /// cannot be told apart, by design).
    case wrongPassphrase
    case damaged(String)
    case unsupportedVersion(UInt8)
    case derivationFailed(String)

    public var description: String {
        switch self {
        case .empty: return "the passphrase is empty"
        case .tooLong: return "the passphrase is longer than \(Passphrase.maxBytes) bytes"
        case .wrongPassphrase: return "wrong passphrase for the account key (or account.secret is damaged)"
        case .damaged(let why): return "account.secret is damaged: \(why)"
        case .unsupportedVersion(let v):
            return "account.secret is sealed in format version \(v), which this coffer cannot read (upgrade coffer)"
        case .derivationFailed(let why): return "cannot derive a key from the passphrase: \(why)"
        }
    }
}

/// The account secret sealed under a passphrase, as `account.secret` holds it when protected.
///
/// Layout (109 bytes): `CFPW`, version 1, Argon2id opslimit (u64 BE), memlimit in bytes (u64 BE),
/// 16-byte salt — the 37-byte header — then `AEAD.seal(seed, purpose: .accountKey, extra: header)`
/// (24-byte nonce, 32-byte ciphertext, 16-byte tag) under the key Argon2id13 derives from the
/// passphrase, the salt and the two limits. The header is associated data, so a changed limit or
/// salt fails like a wrong passphrase. The file is hostile input: its limits are checked against
/// `maxOpsLimit` and `maxMemLimit` before any derivation, so a damaged file cannot make a command
/// allocate or compute without bound.
public enum SealedAccountSecret {
    public static let magic: [UInt8] = [0x43, 0x46, 0x50, 0x57]  // "CFPW"
    public static let version: UInt8 = 1
    public static let saltBytes = 16
    public static let headerBytes = magic.count + 1 + 8 + 8 + saltBytes
    public static let sealedBytes = headerBytes + AEAD.overhead + AccountSecret.byteCount

    /// Argon2id work factors.
    public struct Cost: Sendable, Equatable {
        public let opsLimit: UInt64
        /// Bytes of memory.
        public let memLimit: UInt64
        public init(opsLimit: UInt64, memLimit: UInt64) {
            self.opsLimit = opsLimit
            self.memLimit = memLimit
        }

        /// libsodium's "moderate": 3 passes over 256 MiB, under a second on a laptop. The key at
        /// rest is worth more than an online login (where "interactive", 64 MiB, is advised), and
        /// a mount asks only once.
        public static var standard: Cost {
            Cost(
                opsLimit: UInt64(crypto_pwhash_opslimit_moderate()), memLimit: UInt64(crypto_pwhash_memlimit_moderate())
            )
        }
    }

    /// Past these a file is refused unread: libsodium's "sensitive" memory (1 GiB) and about four
    /// times its passes. No coffer writes more; a corrupted or planted header asking for 100 GB
    /// must fail with a message, not exhaust the machine.
    public static let maxOpsLimit: UInt64 = 16
    public static let maxMemLimit: UInt64 = 1 << 30

    /// Whether `bytes` (the start of `account.secret`) is a sealed secret rather than a plain one.
    /// A plain file starts with `coffer1:`, so the two never overlap.
    public static func isSealed(_ bytes: [UInt8]) -> Bool {
        bytes.starts(with: magic)
    }

    public static func seal(_ secret: AccountSecret, passphrase: Passphrase, cost: Cost = .standard) throws -> [UInt8] {
        try checkCost(cost)
        var header = magic + [version]
        header += bigEndian(cost.opsLimit) + bigEndian(cost.memLimit)
        header += randomBytes(saltBytes)
        return try withDerivedKey(passphrase: passphrase, header: header, cost: cost) { key in
            header + AEAD.seal(secret.seed, key: key, purpose: .accountKey, fileID: [], extra: header)
        }
    }

    public static func open(_ sealed: [UInt8], passphrase: Passphrase) throws -> AccountSecret {
        guard isSealed(sealed) else { throw PassphraseError.damaged("it does not start with CFPW") }
        guard sealed.count > magic.count else { throw PassphraseError.damaged("it ends after the magic") }
        let v = sealed[magic.count]
        guard v == version else { throw PassphraseError.unsupportedVersion(v) }
        guard sealed.count == sealedBytes else {
            throw PassphraseError.damaged("a sealed key has \(sealedBytes) bytes, this one \(sealed.count)")
        }
        let header = Array(sealed[0..<headerBytes])
        let cost = Cost(
            opsLimit: readBigEndian(header, at: magic.count + 1), memLimit: readBigEndian(header, at: magic.count + 9))
        try checkCost(cost)
        let seed = try withDerivedKey(passphrase: passphrase, header: header, cost: cost) { key -> [UInt8]? in
            try? AEAD.open(
                Array(sealed[headerBytes...]), key: key, purpose: .accountKey, fileID: [], extra: header,
                what: "the account key")
        }
        guard let seed else { throw PassphraseError.wrongPassphrase }
        return try AccountSecret(seed: seed)
    }

    static func checkCost(_ cost: Cost) throws {
        guard cost.opsLimit >= UInt64(crypto_pwhash_opslimit_min()), cost.opsLimit <= maxOpsLimit else {
            throw PassphraseError.damaged(
                "Argon2id opslimit \(cost.opsLimit) is outside \(crypto_pwhash_opslimit_min())...\(maxOpsLimit)")
        }
        guard cost.memLimit >= UInt64(crypto_pwhash_memlimit_min()), cost.memLimit <= maxMemLimit else {
            throw PassphraseError.damaged(
                "Argon2id memlimit \(cost.memLimit) bytes is outside \(crypto_pwhash_memlimit_min())...\(maxMemLimit)")
        }
    }

    /// Derives the key into a buffer that is wiped once `body` returns. The key is lent to `body`
    /// as a `SymmetricKey` sharing that buffer; it must not escape, or the wipe would copy instead.
    private static func withDerivedKey<R>(
        passphrase: Passphrase, header: [UInt8], cost: Cost,
        _ body: (SymmetricKey) throws -> R
    ) throws -> R {
        ensureSodium()
        let salt = Array(header[(headerBytes - saltBytes)..<headerBytes])
        guard let memLimit = Int(exactly: cost.memLimit) else {
            throw PassphraseError.damaged("memlimit does not fit this machine")
        }
        var keyBytes = [UInt8](repeating: 0, count: SymmetricKey.byteCount)
        defer { keyBytes.withUnsafeMutableBytes { sodium_memzero($0.baseAddress, $0.count) } }
        let rc = passphrase.withBytes { pw, n in
            crypto_pwhash(
                &keyBytes, UInt64(keyBytes.count), pw, UInt64(n), salt, cost.opsLimit, memLimit,
                crypto_pwhash_alg_argon2id13())
        }
        guard rc == 0 else { throw PassphraseError.derivationFailed("Argon2id failed (out of memory?)") }
        return try body(SymmetricKey(unchecked: keyBytes))
    }

    private static func bigEndian(_ v: UInt64) -> [UInt8] {
        (0..<8).map { UInt8(truncatingIfNeeded: v >> (56 - 8 * UInt64($0))) }
    }

    private static func readBigEndian(_ bytes: [UInt8], at offset: Int) -> UInt64 {
        bytes[offset..<(offset + 8)].reduce(UInt64(0)) { ($0 << 8) | UInt64($1) }
    }
}
