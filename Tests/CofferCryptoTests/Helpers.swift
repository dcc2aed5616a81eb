@testable import CofferCrypto

/// Lowercase hex of bytes (the crypto module has no hex helper of its own).
func hex(_ bytes: [UInt8]) -> String {
    let digits = Array("0123456789abcdef")
    var s = ""
    for b in bytes {
        s.append(digits[Int(b >> 4)])
        s.append(digits[Int(b & 0xf)])
    }
    return s
}

/// Bytes from lowercase/uppercase hex; traps on malformed input (tests only pass literals).
func unhex(_ s: String) -> [UInt8] {
    let chars = Array(s.utf8)
    precondition(chars.count % 2 == 0)
    func v(_ c: UInt8) -> UInt8 {
        switch c {
        case 48...57: return c - 48
        case 97...102: return c - 87
        case 65...70: return c - 55
        default: preconditionFailure("bad hex")
        }
    }
    return stride(from: 0, to: chars.count, by: 2).map { v(chars[$0]) << 4 | v(chars[$0 + 1]) }
}

/// Every single-bit-flip (xor 0x01) and full-byte-flip (xor 0xff) variant of `bytes`, by position.
func flippedVariants(_ bytes: [UInt8]) -> [(position: Int, mask: UInt8, bytes: [UInt8])] {
    var out: [(Int, UInt8, [UInt8])] = []
    for i in bytes.indices {
        for mask: UInt8 in [0x01, 0x80, 0xff] {
            var b = bytes
            b[i] ^= mask
            out.append((i, mask, b))
        }
    }
    return out
}

let seed0to31: [UInt8] = Array(0..<32)
let key32to63 = try! SymmetricKey(bytes: Array(32..<64))
let fileA: [UInt8] = Array(repeating: 0xA1, count: 16)
let fileB: [UInt8] = Array(repeating: 0xB2, count: 16)
