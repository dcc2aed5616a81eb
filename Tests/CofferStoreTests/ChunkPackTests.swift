import CofferModel
import CofferTestSupport
import Foundation
import Testing

@testable import CofferStore

/// Large chunks stored together share one pack file, small ones are appended to the store's
/// current pack (see `ChunkFiles`).
@Suite("Chunk packs")
struct ChunkPackTests {
    func sealed(_ n: UInt8, _ size: Int = 100_000) -> [UInt8] {
        (0..<size).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ Int(n)) }
    }

    func packFiles(_ dir: String) -> [String] {
        ((try? FileManager.default.contentsOfDirectory(atPath: dir + "/chunks/packs")) ?? []).sorted()
    }

    @Test func chunksStoredTogetherShareOnePackAndReadBack() throws {
        try withStore { store, dir throws in
            try store.write { w throws in
                try w.putChunks([
                    (chunkID(1), sealed(1)), (chunkID(2), [2, 2]), (chunkID(3), sealed(3, 70_000)),
                    (chunkID(1), sealed(1)), (chunkID(4), sealed(4)),
                ])
            }
            #expect(packFiles(dir).count == 2, "three large chunks in one pack, the small one appended to another")
            #expect(try store.read { try $0.count("SELECT COUNT(*) FROM chunks WHERE place = 1") } == 4)
            #expect(try store.read { try $0.count("SELECT COUNT(*) FROM chunks WHERE place = 0") } == 0)
            for (n, size) in [(UInt8(1), 100_000), (3, 70_000), (4, 100_000)] {
                #expect(try store.chunk(chunkID(n)) == sealed(n, size), "fast path, chunk \(n)")
                #expect(try store.read { try $0.chunk(chunkID(n)) } == sealed(n, size), "transaction path, chunk \(n)")
            }
            #expect(try store.chunk(chunkID(2)) == [2, 2])
            // Storing a chunk that is already there (in a pack) writes nothing new.
            try store.write { w throws in try w.putChunks([(chunkID(1), sealed(1)), (chunkID(3), sealed(3, 70_000))]) }
            #expect(packFiles(dir).count == 2)
        }
    }

    /// Small chunks, stored one write after another, go into one pack, which stays open across
    /// commits; a chunk already stored is not appended again.
    @Test func smallChunksAreAppendedToOnePackAcrossWrites() throws {
        try withStore { store, dir throws in
            try store.write { w throws in try w.putChunks([(chunkID(1), sealed(1, 3000)), (chunkID(2), [2])]) }
            try store.write { w throws in try w.putChunk(id: chunkID(3), sealing: { [3, 3, 3] }) }
            try store.write { w throws in
                try w.putChunk(
                    id: chunkID(1),
                    sealing: {
                        Issue.record("an existing chunk is not sealed again")
                        return []
                    })
                try w.putChunks([(chunkID(2), [2]), (chunkID(4), sealed(4, 60_000))])
            }
            let packs = packFiles(dir)
            try #require(packs.count == 1)
            let size =
                try FileManager.default.attributesOfItem(atPath: dir + "/chunks/packs/" + packs[0])[.size] as? Int
            #expect(size == 2 * 4096 + 60_000, "each chunk once; each commit's on a block after the last one's")
            #expect(try store.read { try $0.count("SELECT COUNT(*) FROM chunks WHERE place = 1") } == 4)
            #expect(try store.chunk(chunkID(1)) == sealed(1, 3000))
            #expect(try store.chunk(chunkID(2)) == [2])
            #expect(try store.read { try $0.chunk(chunkID(3)) } == [3, 3, 3])
            #expect(try store.chunk(chunkID(4)) == sealed(4, 60_000))
        }
    }

    /// The pack small chunks are appended to can lose its last named chunk to garbage
    /// collection, which deletes it: the next small chunk goes to a new pack, not into the
    /// deleted file (where a committed row would name bytes that are gone).
    @Test func aCollectedAppendPackIsNotWrittenToAgain() throws {
        try withStore { store, dir throws in
            try store.write { w throws in try w.putChunks([(chunkID(1), [1, 1])]) }
            let first = packFiles(dir)
            try #require(first.count == 1)
            #expect(try store.collectGarbage().chunks == 1)
            #expect(packFiles(dir).isEmpty, "nothing names the pack any more")
            try store.write { w throws in try w.putChunks([(chunkID(2), [2, 2])]) }
            let second = packFiles(dir)
            #expect(second.count == 1 && second != first)
            #expect(try store.chunk(chunkID(2)) == [2, 2])
        }
    }

    /// A mostly dead pack that is still being appended to is rewritten like any other; the
    /// next small chunk begins a new pack instead of going into the deleted one.
    @Test func aCompactedAppendPackIsNotWrittenToAgain() throws {
        try withStore { store, dir throws in
            try store.write { w throws in try w.putChunks((0..<20).map { (chunkID($0), sealed($0, 60_000)) }) }
            try store.write { w throws in
                try w.putManifest(digest: digest(1), sealed: [1], chunkIDs: [chunkID(3), chunkID(11)])
                try w.put(record(1, parent: 1), .local)
                try w.put(record(10, parent: 1, digest: digest(1)), .local)
            }
            let before = packFiles(dir)
            try #require(before.count == 1)
            #expect(try store.collectGarbage().compactedPacks == 1)
            let after = packFiles(dir)
            #expect(after.count == 1 && after != before)
            try store.write { w throws in try w.putChunks([(chunkID(50), [5, 0])]) }
            #expect(packFiles(dir).count == 2, "a new pack: the rewritten one is not appended to")
            #expect(try store.chunk(chunkID(50)) == [5, 0])
            #expect(try store.chunk(chunkID(3)) == sealed(3, 60_000))
            #expect(try store.chunk(chunkID(11)) == sealed(11, 60_000))
        }
    }

    /// A store opened again goes on appending to the pack it last began, after what it holds
    /// and on a new block, so short-lived writers (a `coffer put` each) share packs; a second
    /// store open at the same time (another process) does not append to a pack the first holds.
    @Test func theNextWriterResumesTheLastPackUnlessItIsInUse() throws {
        let root = makeTempDir()
        defer { cleanup(root) }
        let dir = root + "/data"
        do {
            let first = try Store(directory: dir)
            try first.write { w throws in try w.putChunks([(chunkID(1), [1, 1, 1])]) }
        }
        let second = try Store(directory: dir)
        try second.write { w throws in try w.putChunks([(chunkID(2), [2, 2])]) }
        let packs = packFiles(dir)
        try #require(packs.count == 1, "the second writer resumed the first one's pack")
        let path = dir + "/chunks/packs/" + packs[0]
        #expect((try FileManager.default.attributesOfItem(atPath: path)[.size] as? Int) == 4096 + 2)
        // A third store while the second still appends there begins a pack of its own.
        let third = try Store(directory: dir)
        try third.write { w throws in try w.putChunks([(chunkID(3), [3])]) }
        #expect(packFiles(dir).count == 2)
        for (n, bytes) in [(UInt8(1), [UInt8]([1, 1, 1])), (2, [2, 2]), (3, [3])] {
            #expect(try third.chunk(chunkID(n)) == bytes)
            #expect(try second.chunk(chunkID(n)) == bytes)
        }
    }

    /// Appends after a commit start on a new block: a later write never rewrites a block that
    /// holds committed chunks.
    @Test func appendsAfterACommitStartOnANewBlock() throws {
        try withStore { store, dir throws in
            try store.write { w throws in try w.putChunks([(chunkID(1), [1]), (chunkID(2), [2, 2])]) }
            try store.write { w throws in try w.putChunks([(chunkID(3), [3, 3, 3])]) }
            let packs = packFiles(dir)
            try #require(packs.count == 1)
            let size =
                try FileManager.default.attributesOfItem(atPath: dir + "/chunks/packs/" + packs[0])[.size] as? Int
            #expect(size == 4096 + 3, "the first commit's 3 bytes, then the second's on the next block")
            #expect(try store.chunk(chunkID(3)) == [3, 3, 3])
        }
    }

    /// If the pack being appended to disappears (another process collected it without the
    /// content lock), the write that would name its chunks fails instead of committing rows
    /// that name nothing.
    @Test func aWriteIntoADeletedAppendPackFails() throws {
        try withStore { store, dir throws in
            try store.write { w throws in try w.putChunks([(chunkID(1), [1])]) }
            for name in packFiles(dir) { try FileManager.default.removeItem(atPath: dir + "/chunks/packs/" + name) }
            #expect(throws: StoreError.self) { try store.write { w throws in try w.putChunks([(chunkID(2), [2])]) } }
            #expect(
                try store.read { try $0.count("SELECT COUNT(*) FROM chunks WHERE id = x'\(hexString(chunkID(2)))'") }
                    == 0)
            // And the next write begins a new pack.
            try store.write { w throws in try w.putChunks([(chunkID(3), [3])]) }
            #expect(try store.chunk(chunkID(3)) == [3])
        }
    }

    /// Stores written before small chunks went to packs hold them in their rows, still read.
    @Test func aChunkKeptInItsRowIsStillRead() throws {
        try withStore { store, _ throws in
            try store.write { w throws in
                try w.withDatabase { db in
                    try db.execute(
                        sql: "INSERT INTO chunks(id, sealed, place) VALUES (?, x'0a0b0c', 0)",
                        arguments: [Data(chunkID(5))])
                }
            }
            #expect(try store.chunk(chunkID(5)) == [10, 11, 12])
            #expect(try store.read { try $0.chunk(chunkID(5)) } == [10, 11, 12])
        }
    }

    @Test func aPackGoesOnlyWhenNoneOfItsChunksIsNamed() throws {
        try withStore { store, dir throws in
            try store.write { w throws in
                try w.putChunks([(chunkID(1), sealed(1)), (chunkID(2), sealed(2))])
                try w.putManifest(digest: digest(1), sealed: [1], chunkIDs: [chunkID(1), chunkID(2)])
                try w.putManifest(digest: digest(2), sealed: [2], chunkIDs: [chunkID(2)])
                try w.put(record(1, parent: 1), .local)
                try w.put(record(10, parent: 1, digest: digest(1)), .local)
                try w.put(record(11, parent: 1, digest: digest(2)), .local)
            }
            let pack = packFiles(dir)
            #expect(pack.count == 1)
            // A pack nothing names (its transaction never committed) is swept.
            #expect(
                FileManager.default.createFile(
                    atPath: dir + "/chunks/packs/" + String(repeating: "ab", count: 16), contents: Data([1])))
            // Chunk 1 becomes garbage; chunk 2 is still named, so the pack stays whole.
            try store.write { w throws in try w.put(record(10, parent: 1), .local) }
            #expect(try store.collectGarbage().chunks == 1)
            #expect(packFiles(dir) == pack)
            #expect(try store.chunk(chunkID(2)) == sealed(2))
            // Once nothing names chunk 2 either, the pack goes.
            try store.write { w throws in try w.put(record(11, parent: 1), .local) }
            #expect(try store.collectGarbage().chunks == 1)
            #expect(packFiles(dir).isEmpty)
        }
    }

    /// A pack mostly dead but still named by a few chunks is rewritten by garbage collection:
    /// the live chunks move, byte for byte, to a new pack, and the old one goes.
    @Test func aMostlyDeadPackIsRewritten() throws {
        try withStore { store, dir throws in
            // Two packs of 20 chunks each (2 MB); records name 3 chunks of the first and 15 of
            // the second.
            for base in [UInt8(0), 100] {
                try store.write { w throws in
                    try w.putChunks((0..<20).map { (chunkID(base + $0), sealed(base + $0)) })
                }
            }
            let before = packFiles(dir)
            #expect(before.count == 2)
            let kept: [UInt8] = [3, 9, 17] + (100..<115).map { $0 }
            try store.write { w throws in
                try w.putManifest(digest: digest(1), sealed: [1], chunkIDs: kept.map { chunkID($0) })
                try w.put(record(1, parent: 1), .local)
                try w.put(record(10, parent: 1, digest: digest(1)), .local)
            }
            let gc = try store.collectGarbage()
            #expect(gc.chunks == 22)
            #expect(gc.compactedPacks == 1, "only the pack with 17 of 20 chunks dead")
            let after = packFiles(dir)
            #expect(after.count == 2)
            #expect(Set(after).intersection(before).count == 1, "the three-quarters-live pack stays")
            for n in kept {
                let same = try store.chunk(chunkID(n)) == sealed(n)
                #expect(same, "chunk \(n) after the rewrite")
            }
            for n in [UInt8(0), 4, 19, 115, 119] { #expect(try store.chunk(chunkID(n)) == nil) }
            let sizes = after.map {
                (try? FileManager.default.attributesOfItem(atPath: dir + "/chunks/packs/" + $0)[.size] as? Int) ?? 0
            }.sorted()
            #expect(sizes == [300_000, 2_000_000], "the new pack holds just the three live chunks")
            // Nothing left to rewrite: a second collection changes nothing.
            let again = try store.collectGarbage()
            #expect(again.chunks == 0 && again.compactedPacks == 0)
            #expect(packFiles(dir) == after)
        }
    }

    /// A pack that cannot be read is left alone by the rewrite (its chunks still report errors
    /// when read, as before); collection itself does not fail.
    @Test func aDamagedPackIsNotRewritten() throws {
        try withStore { store, dir throws in
            try store.write { w throws in try w.putChunks((0..<20).map { (chunkID($0), sealed($0)) }) }
            try store.write { w throws in
                try w.putManifest(digest: digest(1), sealed: [1], chunkIDs: [chunkID(5), chunkID(19)])
                try w.put(record(1, parent: 1), .local)
                try w.put(record(10, parent: 1, digest: digest(1)), .local)
            }
            let pack = packFiles(dir)
            #expect(pack.count == 1)
            // Cut the pack inside chunk 19 (at 1,900,000): still mostly dead, so a candidate,
            // but one of its live chunks cannot be read.
            #expect(truncate(dir + "/chunks/packs/" + pack[0], 1_950_000) == 0)
            let gc = try store.collectGarbage()
            #expect(gc.chunks == 18)
            #expect(gc.compactedPacks == 0)
            #expect(packFiles(dir) == pack)
            #expect(try store.chunk(chunkID(5)) == sealed(5))
            #expect(throws: StoreError.self) { _ = try store.chunk(chunkID(19)) }
        }
    }

    @Test func aDamagedLocatorOrMissingPackIsAnErrorNotACrash() throws {
        try withStore { store, dir throws in
            try store.write { w throws in try w.putChunks([(chunkID(1), sealed(1)), (chunkID(2), sealed(2))]) }
            for name in packFiles(dir) { try FileManager.default.removeItem(atPath: dir + "/chunks/packs/" + name) }
            #expect(throws: StoreError.self) { _ = try store.chunk(chunkID(1)) }
            try store.write { w throws in
                try w.withDatabase { db in try db.execute(sql: "UPDATE chunks SET sealed = x'0102' WHERE place = 1") }
            }
            #expect(throws: StoreError.self) { _ = try store.read { try $0.chunk(chunkID(2)) } }
        }
    }

    /// A row whose place this build does not know (a damaged or foreign store) is an error on
    /// both read paths, not a crash or an empty chunk.
    @Test func anUnknownPlaceIsAnError() throws {
        try withStore { store, _ throws in
            let id = chunkID(7)
            try store.write { w throws in
                try w.withDatabase { db in
                    try db.execute(
                        sql: "INSERT INTO chunks(id, sealed, place) VALUES (?, x'', 2)", arguments: [Data(id)])
                }
            }
            #expect(throws: StoreError.self) { _ = try store.chunk(id) }
            #expect(throws: StoreError.self) { _ = try store.read { try $0.chunk(id) } }
        }
    }

    /// Prefetching packed chunks starts reading them from disk into the page cache, without
    /// waiting; a chunk kept in a row, an unknown id or a pack that is gone is skipped quietly.
    @Test func prefetchBringsPackedChunksIntoThePageCache() throws {
        try withStore { store, dir throws in
            let chunks = (1...8).map { (chunkID(UInt8($0)), sealed(UInt8($0), 200_000)) }
            try store.write { w throws in try w.putChunks(chunks + [(chunkID(9), [9, 9])]) }
            // The large chunks' pack (chunk 9 is appended to another).
            let packs = packFiles(dir).map { dir + "/chunks/packs/" + $0 }
            try #require(packs.count == 2)
            let path = try #require(
                packs.max {
                    let size = { (p: String) in
                        (try? FileManager.default.attributesOfItem(atPath: p)[.size] as? Int) ?? 0
                    }
                    return size($0) < size($1)
                })
            // Out of the page cache, as after a reboot.
            try #require(try PageCache.evict(path) < 8, "the pack left the page cache")

            // Chunks 3 to 6 (bytes 400,000 to 1,200,000 of the pack), plus ones to skip.
            store.prefetch([chunkID(3), chunkID(4), chunkID(9), chunkID(77), chunkID(5), chunkID(6)])
            let page = PageCache.pageSize
            // The reads are asynchronous: give the disk up to 2 s.
            #expect(
                try PageCache.waitUntilResident(path, pages: (400_000 / page)..<(1_200_000 / page)),
                "chunks 3-6 are in the page cache")
            // And what was prefetched reads back as stored.
            #expect(try store.chunk(chunkID(4)) == sealed(4, 200_000))

            // A pack that is gone is skipped, not an error.
            #expect(unlink(path) == 0)
            store.prefetch([chunkID(1)])
        }
    }
}
