/// The one deterministic byte format for everything that is signed, MACed or sealed.
///
/// Integers are fixed-width big-endian, byte strings and strings are length-prefixed (u32), and
/// every top-level record starts with a format tag and version byte so a future layout can be
/// told apart rather than misread. There is no map type: writers emit fields in a fixed order,
/// so the same value always encodes to the same bytes.
public struct ByteWriter: Sendable {
    public private(set) var bytes: [UInt8] = []

    public init(capacity: Int = 64) { bytes.reserveCapacity(capacity) }

    public mutating func u8(_ v: UInt8) { bytes.append(v) }
    public mutating func bool(_ v: Bool) { bytes.append(v ? 1 : 0) }
    public mutating func u32(_ v: UInt32) {
        for s in stride(from: 24, through: 0, by: -8) { bytes.append(UInt8((v >> UInt32(s)) & 0xff)) }
    }
    public mutating func u64(_ v: UInt64) {
        for s in stride(from: 56, through: 0, by: -8) { bytes.append(UInt8((v >> UInt64(s)) & 0xff)) }
    }
    public mutating func i64(_ v: Int64) { u64(UInt64(bitPattern: v)) }
    public mutating func raw(_ v: [UInt8]) { bytes += v }
    public mutating func data(_ v: [UInt8]) {
        u32(UInt32(v.count))
        bytes += v
    }
    public mutating func string(_ v: String) { data(Array(v.utf8)) }
    public mutating func optionalData(_ v: [UInt8]?) {
        if let v {
            u8(1)
            data(v)
        } else {
            u8(0)
        }
    }
}

public struct DecodingError: Error, Equatable, CustomStringConvertible {
    public let reason: String
    public init(_ reason: String) { self.reason = reason }
    public var description: String { "malformed record: \(reason)" }
}

public struct ByteReader: Sendable {
    private let bytes: [UInt8]
    public private(set) var offset = 0

    public init(_ bytes: [UInt8]) { self.bytes = bytes }

    public var isAtEnd: Bool { offset == bytes.count }

    private mutating func take(_ n: Int) throws -> ArraySlice<UInt8> {
        guard n >= 0, bytes.count - offset >= n else { throw DecodingError("truncated at byte \(offset)") }
        defer { offset += n }
        return bytes[offset..<(offset + n)]
    }

    public mutating func u8() throws -> UInt8 { try take(1).first ?? 0 }
    public mutating func bool() throws -> Bool {
        switch try u8() {
        case 0: return false
        case 1: return true
        case let v: throw DecodingError("invalid boolean \(v)")
        }
    }
    public mutating func u32() throws -> UInt32 { try take(4).reduce(0) { ($0 << 8) | UInt32($1) } }
    public mutating func u64() throws -> UInt64 { try take(8).reduce(0) { ($0 << 8) | UInt64($1) } }
    public mutating func i64() throws -> Int64 { Int64(bitPattern: try u64()) }
    public mutating func raw(_ n: Int) throws -> [UInt8] { Array(try take(n)) }
    public mutating func data(max: Int = 1 << 30) throws -> [UInt8] {
        let n = Int(try u32())
        guard n <= max else { throw DecodingError("field of \(n) bytes exceeds limit \(max)") }
        return Array(try take(n))
    }
    public mutating func string(max: Int = 1 << 20) throws -> String {
        let b = try data(max: max)
        guard let s = String(validating: b, as: UTF8.self) else { throw DecodingError("invalid UTF-8") }
        return s
    }
    public mutating func optionalData(max: Int = 1 << 30) throws -> [UInt8]? {
        try bool() ? try data(max: max) : nil
    }
    public func expectEnd() throws {
        guard isAtEnd else { throw DecodingError("\(bytes.count - offset) trailing bytes") }
    }
}

/// Lowercase hex, for ids in logs, paths and the CLI.
public func hexString(_ bytes: [UInt8]) -> String {
    let digits = Array("0123456789abcdef".utf8)
    var out: [UInt8] = []
    out.reserveCapacity(bytes.count * 2)
    for b in bytes {
        out.append(digits[Int(b >> 4)])
        out.append(digits[Int(b & 0xf)])
    }
    return String(decoding: out, as: UTF8.self)
}

public func bytesFromHex(_ s: String) -> [UInt8]? {
    var out: [UInt8] = []
    var hi: UInt8?
    for c in s.utf8 {
        let v: UInt8
        switch c {
        case 48...57: v = c - 48
        case 97...102: v = c - 87
        case 65...70: v = c - 55
        default: return nil
        }
        if let h = hi {
            out.append(h << 4 | v)
            hi = nil
        } else {
            hi = v
        }
    }
    return hi == nil ? out : nil
}
