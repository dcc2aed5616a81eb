import CofferContent
import CofferModel
import Dispatch
import Synchronization

/// Seals and opens chunks on every core. Sealing (BLAKE2b id, zstd, XChaCha20-Poly1305) is the CPU cost
/// of writing; a spill of 64 chunks on one thread would leave the other cores idle while the
/// writer waits for its reply.
enum ParallelChunks {
    /// `(ref, sealed)` for each plaintext, in order. Small batches stay on the calling thread.
    static func seal(_ plaintexts: [[UInt8]], with cipher: ContentCipher) -> [(ref: ChunkRef, sealed: [UInt8])] {
        @Sendable func one(_ p: [UInt8]) -> (ref: ChunkRef, sealed: [UInt8]) {
            p.withUnsafeBytes { cipher.sealChunk($0) }
        }
        guard plaintexts.count > 1 else { return plaintexts.map(one) }
        let results = Mutex<[(ref: ChunkRef, sealed: [UInt8])?]>(Array(repeating: nil, count: plaintexts.count))
        DispatchQueue.concurrentPerform(iterations: plaintexts.count) { i in
            let r = one(plaintexts[i])
            results.withLock { $0[i] = r }
        }
        return results.withLock { $0 }.compactMap { $0 }
    }

    /// Fetches and opens chunks (id → plaintext), on every core when there are several: a
    /// read-ahead request of 1 MiB spans four chunks, and decrypting them one after another
    /// left the second core idle while the reader waited (measured: 1.1 cores busy reading a
    /// 256 MiB file). Each is opened in the buffer it was read into; a raw chunk's plaintext is
    /// a slice of that buffer.
    static func open(
        _ refs: [ChunkRef], with cipher: ContentCipher,
        fetch: @Sendable ([UInt8]) throws -> [UInt8]?
    ) throws -> [[UInt8]: ArraySlice<UInt8>] {
        @Sendable func one(_ ref: ChunkRef) throws -> ArraySlice<UInt8> {
            guard let sealed = try fetch(ref.id) else {
                throw ContentError.missingChunk(hexString(Array(ref.id.prefix(8))))
            }
            return try cipher.openChunkInPlace(sealed, ref: ref)
        }
        var opened: [[UInt8]: ArraySlice<UInt8>] = [:]
        guard refs.count > 1 else {
            for ref in refs { opened[ref.id] = try one(ref) }
            return opened
        }
        let results = Mutex<[Int: Result<ArraySlice<UInt8>, any Error>]>([:])
        DispatchQueue.concurrentPerform(iterations: refs.count) { i in
            let r = Result { try one(refs[i]) }
            results.withLock { $0[i] = r }
        }
        // concurrentPerform returns once every iteration ran, so every index has a result.
        for (i, r) in results.withLock({ $0 }) { opened[refs[i].id] = try r.get() }
        return opened
    }
}
