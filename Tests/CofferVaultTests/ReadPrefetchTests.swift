import Testing
import CofferContent
@testable import CofferVault

/// Which stored chunks a read asks the store to start fetching from disk
/// (`OpenDocument.planPrefetch`): a sequential reader's next chunks, once per run; nothing for
/// a random reader.
@Suite("Read prefetch")
struct ReadPrefetchTests {
    static let chunk = 256 * 1024
    static let mib: UInt64 = 1 << 20

    /// A 16 MiB document of 64 stored 256 KiB chunks, chunk `n`'s id being `[n]`; chunk 1 holds
    /// only 1,000 bytes of plaintext (it lives in a store row, not worth asking for).
    func document() -> OpenDocument.DocumentState {
        let refs = (0..<64).map { n in ChunkRef(id: [UInt8(n)], length: n == 1 ? 1_000 : UInt32(Self.chunk)) }
        return OpenDocument.DocumentState(chunkSize: Self.chunk, refs: refs, size: 64 * UInt64(Self.chunk), digest: nil)
    }

    func plan(_ s: inout OpenDocument.DocumentState, _ offset: UInt64, _ count: UInt64) -> [Int] {
        let ids = OpenDocument.planPrefetch(&s, offset: offset, end: offset + count)
        s.lastReadEnd = offset + count
        return ids.map { Int($0[0]) }
    }

    @Test func aSequentialRunAsksForEachChunkAheadOnce() {
        var s = document()
        let ahead = Int(OpenDocument.prefetchBytes) / Self.chunk
        // From the start: this read's four chunks and the next 8 MiB, less the small chunk 1.
        #expect(plan(&s, 0, Self.mib) == [0] + Array(2..<(4 + ahead)))
        // The next read only extends the window by what it moved.
        #expect(plan(&s, Self.mib, Self.mib) == Array((4 + ahead)..<(8 + ahead)))
        // The kernel's read-ahead may deliver a later request first: still the same run, and
        // nothing is asked for twice.
        #expect(plan(&s, 3 * Self.mib, Self.mib) == Array((8 + ahead)..<(16 + ahead)))
        #expect(plan(&s, 2 * Self.mib, Self.mib) == [])
        // Near the end, the window stops at the last chunk.
        #expect(plan(&s, 9 * Self.mib, Self.mib) == Array((16 + ahead)..<64))
        #expect(plan(&s, 10 * Self.mib, Self.mib) == [])
    }

    @Test func aRandomReadAsksForNothingAndARestartAsksAgain() {
        var s = document()
        _ = plan(&s, 0, Self.mib)
        // Far from where the last read ended: a random read.
        #expect(plan(&s, 14 * Self.mib, 4096) == [])
        #expect(plan(&s, 5 * Self.mib, 4096) == [])
        // Reading from the start again starts a new run.
        let ahead = Int(OpenDocument.prefetchBytes) / Self.chunk
        #expect(plan(&s, 0, Self.mib) == [0] + Array(2..<(4 + ahead)))
    }

    @Test func chunksAlreadyCachedAreNotAskedFor() {
        var s = document()
        s.cache.insert([5], [1, 2, 3][...])
        #expect(!plan(&s, 0, Self.mib).contains(5))
    }
}
