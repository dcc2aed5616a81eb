/// A file's identity: 16 random bytes chosen by the device that creates it (a UUIDv4).
/// The model never generates one (no randomness in the pure core); callers pass them in.
public struct FileID: Hashable, Comparable, Sendable, CustomStringConvertible {
    public let bytes: [UInt8]

    public init(bytes: [UInt8]) throws {
        guard bytes.count == 16 else { throw DecodingError("a file id has 16 bytes, got \(bytes.count)") }
        self.bytes = bytes
    }

    /// Builds a v4 UUID from 16 random bytes (sets the version and variant bits).
    public init(random: [UInt8]) throws {
        guard random.count == 16 else { throw DecodingError("a file id needs 16 random bytes") }
        var b = random
        b[6] = (b[6] & 0x0f) | 0x40
        b[8] = (b[8] & 0x3f) | 0x80
        self.bytes = b
    }

    public init?(uuidString: String) {
        guard let b = bytesFromHex(uuidString.replacingDashes()), b.count == 16 else { return nil }
        self.bytes = b
    }

    /// All zeros: never a real file (real ids are random v4 UUIDs).
    public static let none = FileID(uncheckedBytes: [UInt8](repeating: 0, count: 16))

    init(uncheckedBytes: [UInt8]) { self.bytes = uncheckedBytes }

    public static func < (a: FileID, b: FileID) -> Bool { a.bytes.lexicographicallyPrecedes(b.bytes) }

    // Every id is 16 bytes, so hashing feeds them as one buffer: the synthesized version
    // combined them one byte at a time, and the tree hashes ids on every lookup (a few percent
    // of the daemon's CPU while untarring, measured with perf).
    public func hash(into hasher: inout Hasher) {
        bytes.withUnsafeBytes { hasher.combine(bytes: $0) }
    }

    public var description: String {
        let h = hexString(bytes)
        let c = Array(h)
        return String(c[0..<8]) + "-" + String(c[8..<12]) + "-" + String(c[12..<16]) + "-" + String(c[16..<20]) + "-" + String(c[20..<32])
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
