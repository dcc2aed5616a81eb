import CZstd
import Synchronization

/// zstd before sealing. A chunk whose compressed form is not smaller is stored raw, so random or
/// already-compressed data costs one flag byte instead of a failed compression's overhead.
enum Compression {
    static let raw: UInt8 = 0
    static let zstd: UInt8 = 1
    static let level: Int32 = 1

    static func pack(_ plaintext: UnsafeRawBufferPointer) -> [UInt8] {
        let bound = ZSTD_compressBound(plaintext.count)
        // One uninitialized buffer serves both outcomes (the bound is at least the input size):
        // no zero fill, and a raw chunk is one copy instead of two.
        return [UInt8](unsafeUninitializedCapacity: bound + 1) { o, initialized in
            guard let base = o.baseAddress else { initialized = 0; return }
            let n = ContextPool.compression.with { ZSTD_compressCCtx($0, base + 1, bound, plaintext.baseAddress, plaintext.count, level) }
            if ZSTD_isError(n) == 0 && n > 0 && n < plaintext.count {
                base[0] = zstd
                initialized = n + 1
                return
            }
            base[0] = raw
            if let src = plaintext.baseAddress {
                UnsafeMutableRawPointer(base + 1).copyMemory(from: src, byteCount: plaintext.count)
            }
            initialized = plaintext.count + 1
        }
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
                    ContextPool.decompression.with {
                        ZSTD_decompressDCtx($0, o.baseAddress, expectedLength, p.baseAddress?.advanced(by: 1), packed.count - 1)
                    }
                }
            }
            guard ZSTD_isError(n) == 0, n == expectedLength else { throw ContentError.corrupt("chunk does not decompress") }
            return out
        default:
            throw ContentError.corrupt("unknown chunk encoding \(flag)")
        }
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
