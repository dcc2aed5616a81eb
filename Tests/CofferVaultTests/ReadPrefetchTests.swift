import CofferContent
import CofferCrypto
import CofferModel
import CofferTestSupport
import Foundation
import Testing

@testable import CofferVault

/// Which stored chunks a read asks the store to start fetching from disk
/// (`OpenDocument.DocumentState.noteRead`): a sequential reader's next chunks, once per run;
/// nothing for a random reader.
@Suite("Read prefetch")
struct ReadPrefetchTests {
    static let chunk = 256 * 1024
    static let mib: UInt64 = 1 << 20
    static let ahead = Int(OpenDocument.DocumentState.prefetchBytes) / chunk

    /// A 16 MiB document of 64 stored 256 KiB chunks, chunk `n`'s id being `[n]`; chunk 1 holds
    /// only 1,000 bytes of plaintext (it lives in a store row, not worth asking for).
    func document() -> OpenDocument.DocumentState {
        let refs = (0..<64).map { n in ChunkRef(id: [UInt8(n)], length: n == 1 ? 1_000 : UInt32(Self.chunk)) }
        let cipher = ContentCipher(fileID: try! FileID(bytes: [UInt8](repeating: 7, count: 16)), key: .random())
        return OpenDocument.DocumentState(
            cipher: cipher, chunkSize: Self.chunk, refs: refs, size: 64 * UInt64(Self.chunk), digest: nil)
    }

    /// A read of `count` bytes at `offset` that loads chunks from the store: the chunk numbers
    /// it asks to prefetch.
    func plan(_ s: inout OpenDocument.DocumentState, _ offset: UInt64, _ count: UInt64) -> [Int] {
        s.noteRead(offset: offset, end: offset + count, loadsFromStore: true).map { Int($0[0]) }
    }

    @Test func aSequentialRunAsksForEachChunkAheadOnce() {
        var s = document()
        let ahead = Self.ahead
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
        #expect(plan(&s, 0, Self.mib) == [0] + Array(2..<(4 + Self.ahead)))
    }

    @Test func readsServedFromMemoryAskForNothingButKeepTheRun() {
        var s = document()
        _ = plan(&s, 0, Self.mib)
        // Reads served from buffers or the cache move the reader along without asking.
        for n in 1..<12 {
            #expect(
                s.noteRead(offset: UInt64(n) * Self.mib, end: UInt64(n + 1) * Self.mib, loadsFromStore: false) == [])
        }
        // 12 MiB is far from the first read, but near where the reader now is: the same run,
        // from this read's first chunk to the end of the document.
        #expect(plan(&s, 12 * Self.mib, Self.mib) == Array(48..<64))
    }

    @Test func chunksAlreadyCachedAreNotAskedFor() {
        var s = document()
        s.cache.insert([5], [1, 2, 3][...])
        #expect(!plan(&s, 0, Self.mib).contains(5))
    }

    /// End to end through a vault: the first read of a cold document brings the packs' later
    /// chunks into the page cache, beyond what the kernel's own read-ahead of that read reaches
    /// (about 1 MiB).
    @Test func aColdReadPrefetchesTheRestOfTheDocument() throws {
        let f = try VaultFixture()
        let content = noise(6 << 20, seed: 7)
        let doc = try f.document("big", contents: content)
        let packsDir = f.dataDir + "/chunks/packs"
        let packs = try FileManager.default.contentsOfDirectory(atPath: packsDir).map { packsDir + "/" + $0 }
        try #require(!packs.isEmpty)
        for p in packs { try #require(try PageCache.evict(p) < 8, "\(p) left the page cache") }
        let handle = try f.vault.openDocument(doc.id)
        defer { try? f.vault.release(handle) }
        let first = try handle.readPieces(offset: 0, count: Self.chunk).reduce(into: [UInt8]()) { $0 += $1 }
        #expect(first == Array(content[0..<Self.chunk]))
        // All of every pack (6 MiB is inside the 8 MiB window), in particular its second half.
        for p in packs {
            let pages = try PageCache.residentPages(p).count
            #expect(try PageCache.waitUntilResident(p, pages: (pages / 2)..<pages), "the rest of \(p) was prefetched")
        }
    }
}
