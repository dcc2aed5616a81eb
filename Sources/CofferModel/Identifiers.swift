/// A file's identity: 16 random bytes chosen by the device that creates it (a UUIDv4).
/// The model never generates one (no randomness in the pure core); callers pass them in.
public struct FileID: Hashable, Comparable, Sendable, CustomStringConvertible {
    // The 16 bytes as two big-endian words, inline: ids are hashed and compared on every tree
    // lookup, and a stored [UInt8] made each of those a heap buffer to retain, release, hash
    // through a pointer and compare with memcmp (about 5% of the mount daemon's CPU while
    // untarring, measured with perf).
    private let high: UInt64
    private let low: UInt64

    /// The id's 16 bytes (a fresh array each time).
    public var bytes: [UInt8] {
        [UInt8](unsafeUninitializedCapacity: 16) { buffer, count in
            let raw = UnsafeMutableRawBufferPointer(buffer)
            raw.storeBytes(of: high.bigEndian, toByteOffset: 0, as: UInt64.self)
            raw.storeBytes(of: low.bigEndian, toByteOffset: 8, as: UInt64.self)
            count = 16
        }
    }

    public init(bytes: [UInt8]) throws {
        guard bytes.count == 16 else { throw DecodingError("a file id has 16 bytes, got \(bytes.count)") }
        self.init(uncheckedBytes: bytes)
    }

    /// Builds a v4 UUID from 16 random bytes (sets the version and variant bits).
    public init(random: [UInt8]) throws {
        guard random.count == 16 else { throw DecodingError("a file id needs 16 random bytes") }
        var b = random
        b[6] = (b[6] & 0x0f) | 0x40
        b[8] = (b[8] & 0x3f) | 0x80
        self.init(uncheckedBytes: b)
    }

    public init?(uuidString: String) {
        guard let b = bytesFromHex(uuidString.replacingDashes()), b.count == 16 else { return nil }
        self.init(uncheckedBytes: b)
    }

    /// All zeros: never a real file (real ids are random v4 UUIDs).
    public static let none = FileID(high: 0, low: 0)

    private init(high: UInt64, low: UInt64) {
        self.high = high
        self.low = low
    }

    /// `bytes` must hold exactly 16.
    init(uncheckedBytes bytes: [UInt8]) {
        var high: UInt64 = 0
        var low: UInt64 = 0
        for i in 0..<8 { high = high << 8 | UInt64(bytes[i]) }
        for i in 8..<16 { low = low << 8 | UInt64(bytes[i]) }
        self.init(high: high, low: low)
    }

    /// Byte order (the words are big-endian).
    public static func < (a: FileID, b: FileID) -> Bool { (a.high, a.low) < (b.high, b.low) }

    public func hash(into hasher: inout Hasher) {
        hasher.combine(high)
        hasher.combine(low)
    }

    public var description: String {
        let h = hexString(bytes)
        let c = Array(h)
        return String(c[0..<8]) + "-" + String(c[8..<12]) + "-" + String(c[12..<16]) + "-" + String(c[16..<20]) + "-"
            + String(c[20..<32])
    }
}

extension String {
    func replacingDashes() -> String { String(self.filter { $0 != "-" }) }
}

/// An account, named by its Ed25519 public key.
public struct AccountID: Hashable, Sendable, CustomStringConvertible {
    public let bytes: [UInt8]
    public init(bytes: [UInt8]) throws {
        guard bytes.count == 32 else { throw DecodingError("an account id has 32 bytes, got \(bytes.count)") }
        self.bytes = bytes
    }
    public var description: String { hexString(Array(bytes.prefix(8))) }
}
