import CZstd
import Synchronization

/// zstd before sealing. A chunk whose compressed form is not smaller is stored raw, so random or
/// already-compressed data costs one flag byte instead of a failed compression's overhead, and a
/// large chunk whose samples do not compress is not even tried (`worthCompressing`).
enum Compression {
    static let raw: UInt8 = 0
    static let zstd: UInt8 = 1
    static let level: Int32 = 1

    /// Inputs at least this long are sampled before zstd sees all of them.
    static let sampledFrom = 64 * 1024
    static let sampleLength = 4096

    /// Whether compressing all of `plaintext` is worth trying: three 4 KiB samples (start,
    /// middle, end) compressed together must shrink by 3% or more. Media, archives and
    /// encrypted files (most large files) then cost 12 KiB of zstd per 256 KiB chunk instead of
    /// a whole failed pass (zstd is 3% of the daemon's CPU writing 256 MiB of random data). A
    /// chunk whose samples all miss its compressible parts is stored raw: bigger, never wrong.
    static func worthCompressing(_ plaintext: UnsafeRawBufferPointer) -> Bool {
        guard plaintext.count >= sampledFrom, let src = plaintext.baseAddress else { return true }
        let n = sampleLength
        let starts = [0, plaintext.count / 2 - n / 2, plaintext.count - n]
        let sample = [UInt8](unsafeUninitializedCapacity: 3 * n) { b, initialized in
            guard let base = b.baseAddress else {
                initialized = 0
                return
            }
            for (i, start) in starts.enumerated() {
                UnsafeMutableRawPointer(base + i * n).copyMemory(from: src + start, byteCount: n)
            }
            initialized = 3 * n
        }
        let bound = ZSTD_compressBound(sample.count)
        var out = [UInt8](repeating: 0, count: bound)
        let packed = sample.withUnsafeBytes { i in
            out.withUnsafeMutableBytes { o in
                ContextPool.compression.with {
                    ZSTD_compressCCtx($0, o.baseAddress, bound, i.baseAddress, i.count, level)
                }
            }
        }
        return ZSTD_isError(packed) == 0 && packed < sample.count * 97 / 100
    }

    static func pack(_ plaintext: UnsafeRawBufferPointer) -> [UInt8] {
        if !worthCompressing(plaintext) { return stored(plaintext) }
        let bound = ZSTD_compressBound(plaintext.count)
        // One uninitialized buffer serves both outcomes (the bound is at least the input size):
        // no zero fill, and a raw chunk is one copy instead of two.
        return [UInt8](unsafeUninitializedCapacity: bound + 1) { o, initialized in
            guard let base = o.baseAddress else {
                initialized = 0
                return
            }
            let n = ContextPool.compression.with {
                ZSTD_compressCCtx($0, base + 1, bound, plaintext.baseAddress, plaintext.count, level)
            }
            if ZSTD_isError(n) == 0 && n > 0 && n < plaintext.count {
                base[0] = zstd
                initialized = n + 1
                return
            }
            initialized = storeRaw(plaintext, at: base)
        }
    }

    /// The raw form: the flag byte, then the plaintext.
    static func stored(_ plaintext: UnsafeRawBufferPointer) -> [UInt8] {
        [UInt8](unsafeUninitializedCapacity: plaintext.count + 1) { o, initialized in
            guard let base = o.baseAddress else {
                initialized = 0
                return
            }
            initialized = storeRaw(plaintext, at: base)
        }
    }

    /// Writes the raw form at `base` (room for `plaintext.count + 1` bytes); returns its length.
    private static func storeRaw(_ plaintext: UnsafeRawBufferPointer, at base: UnsafeMutablePointer<UInt8>) -> Int {
        base[0] = raw
        if let src = plaintext.baseAddress {
            UnsafeMutableRawPointer(base + 1).copyMemory(from: src, byteCount: plaintext.count)
        }
        return plaintext.count + 1
    }

    static func unpack(_ packed: [UInt8], expectedLength: Int) throws -> [UInt8] {
        switch try flag(of: packed[...], expectedLength: expectedLength) {
        case raw: return Array(packed[1...])
        default: return try decompress(packed[...], expectedLength: expectedLength)
        }
    }

    /// `unpack` of a slice, returning a raw chunk's plaintext as a slice of it (no copy).
    static func unpack(_ packed: ArraySlice<UInt8>, expectedLength: Int) throws -> ArraySlice<UInt8> {
        switch try flag(of: packed, expectedLength: expectedLength) {
        case raw: return packed[(packed.startIndex + 1)...]
        default: return try decompress(packed, expectedLength: expectedLength)[...]
        }
    }

    /// The encoding flag, checked: a raw chunk must have exactly the expected length.
    private static func flag(of packed: ArraySlice<UInt8>, expectedLength: Int) throws -> UInt8 {
        guard let flag = packed.first else { throw ContentError.corrupt("empty chunk") }
        switch flag {
        case raw:
            guard packed.count - 1 == expectedLength else { throw ContentError.corrupt("chunk length mismatch") }
        case zstd:
            break
        default:
            throw ContentError.corrupt("unknown chunk encoding \(flag)")
        }
        return flag
    }

    private static func decompress(_ packed: ArraySlice<UInt8>, expectedLength: Int) throws -> [UInt8] {
        var out = [UInt8](repeating: 0, count: expectedLength)
        let n = packed.withUnsafeBytes { p in
            out.withUnsafeMutableBytes { o in
                ContextPool.decompression.with {
                    ZSTD_decompressDCtx(
                        $0, o.baseAddress, expectedLength, p.baseAddress?.advanced(by: 1), packed.count - 1)
                }
            }
        }
        guard ZSTD_isError(n) == 0, n == expectedLength else { throw ContentError.corrupt("chunk does not decompress") }
        return out
    }
}

/// Reusable zstd contexts. `ZSTD_compress` and `ZSTD_decompress` build and free a context on
/// every call, which costs more than compressing a small file; a few kept contexts (one per
/// thread working at once) avoid that.
final class ContextPool: Sendable {
    private let free = Mutex<[UInt]>([])
    private let make: @Sendable () -> OpaquePointer?
    private let release: @Sendable (OpaquePointer) -> Void

    init(make: @escaping @Sendable () -> OpaquePointer?, release: @escaping @Sendable (OpaquePointer) -> Void) {
        self.make = make
        self.release = release
    }

    static let compression = ContextPool(make: { ZSTD_createCCtx() }, release: { ZSTD_freeCCtx($0) })
    static let decompression = ContextPool(make: { ZSTD_createDCtx() }, release: { ZSTD_freeDCtx($0) })

    /// Runs `body` with a context of its own; a failed allocation reports a zstd error value.
    func with(_ body: (OpaquePointer) -> Int) -> Int {
        let taken = free.withLock { $0.popLast() }.flatMap { OpaquePointer(bitPattern: $0) } ?? make()
        guard let context = taken else { return -1 }
        let result = body(context)
        let kept = free.withLock { f -> Bool in
            guard f.count < 16 else { return false }
            f.append(UInt(bitPattern: context))
            return true
        }
        if !kept { release(context) }
        return result
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
