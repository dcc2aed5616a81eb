import CofferContent
import Dispatch
import Synchronization

/// Seals chunks on every core. Sealing (BLAKE2b id, zstd, XChaCha20-Poly1305) is the CPU cost
/// of writing; a spill of 64 chunks on one thread would leave the other cores idle while the
/// writer waits for its reply.
enum ParallelSealing {
    /// `(id, ref, sealed)` for each plaintext, in order. Small batches stay on the calling thread.
    static func seal(_ plaintexts: [[UInt8]], with cipher: ContentCipher) -> [([UInt8], ChunkRef, [UInt8])] {
        @Sendable func one(_ p: [UInt8]) -> ([UInt8], ChunkRef, [UInt8]) {
            p.withUnsafeBytes { b in
                let id = cipher.chunkID(b)
                let (ref, sealed) = cipher.sealChunk(b, id: id)
                return (id, ref, sealed)
            }
        }
        guard plaintexts.count > 1 else { return plaintexts.map(one) }
        let results = Mutex<[([UInt8], ChunkRef, [UInt8])?]>(Array(repeating: nil, count: plaintexts.count))
        DispatchQueue.concurrentPerform(iterations: plaintexts.count) { i in
            let r = one(plaintexts[i])
            results.withLock { $0[i] = r }
        }
        return results.withLock { $0 }.compactMap { $0 }
    }
}
