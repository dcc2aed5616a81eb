import CZstd

/// zstd before sealing. A chunk whose compressed form is not smaller is stored raw, so random or
/// already-compressed data costs one flag byte instead of a failed compression's overhead.
enum Compression {
    static let raw: UInt8 = 0
    static let zstd: UInt8 = 1
    static let level: Int32 = 1

    static func pack(_ plaintext: UnsafeRawBufferPointer) -> [UInt8] {
        let bound = ZSTD_compressBound(plaintext.count)
        var out = [UInt8](repeating: 0, count: bound + 1)
        let written = out.withUnsafeMutableBytes { o -> Int in
            guard let dst = o.baseAddress?.advanced(by: 1) else { return 0 }
            let n = ZSTD_compress(dst, bound, plaintext.baseAddress, plaintext.count, level)
            return ZSTD_isError(n) != 0 ? 0 : n
        }
        if written > 0 && written < plaintext.count {
            out[0] = zstd
            out.removeLast(out.count - 1 - written)
            return out
        }
        return [raw] + Array(plaintext)
    }

    static func unpack(_ packed: [UInt8], expectedLength: Int) throws -> [UInt8] {
        guard let flag = packed.first else { throw ContentError.corrupt("empty chunk") }
        switch flag {
        case raw:
            guard packed.count - 1 == expectedLength else { throw ContentError.corrupt("chunk length mismatch") }
            return Array(packed[1...])
        case zstd:
            var out = [UInt8](repeating: 0, count: expectedLength)
            let n = packed.withUnsafeBytes { p in
                out.withUnsafeMutableBytes { o in
                    ZSTD_decompress(o.baseAddress, expectedLength, p.baseAddress?.advanced(by: 1), packed.count - 1)
                }
            }
            guard ZSTD_isError(n) == 0, n == expectedLength else { throw ContentError.corrupt("chunk does not decompress") }
            return out
        default:
            throw ContentError.corrupt("unknown chunk encoding \(flag)")
        }
    }
}

public enum ContentError: Error, Equatable, CustomStringConvertible {
    case corrupt(String)
    case missingChunk(String)
    case tooLarge(String)

    public var description: String {
        switch self {
        case .corrupt(let w): return "content is corrupt: \(w)"
        case .missingChunk(let id): return "content chunk \(id) is missing from the store"
        case .tooLarge(let w): return "content too large: \(w)"
        }
    }
}
