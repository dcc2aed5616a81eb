import Foundation
import Testing
@testable import CofferStore

/// Large chunks stored together share one pack file (see `ChunkFiles`).
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
                try w.putChunks([(chunkID(1), sealed(1)), (chunkID(2), [2, 2]), (chunkID(3), sealed(3, 70_000)),
                                 (chunkID(1), sealed(1)), (chunkID(4), sealed(4))])
            }
            #expect(packFiles(dir).count == 1, "three large chunks, one file")
            #expect(try store.read { try $0.count("SELECT COUNT(*) FROM chunks WHERE in_file = 2") } == 3)
            #expect(try store.read { try $0.count("SELECT COUNT(*) FROM chunks WHERE in_file = 0") } == 1)
            for (n, size) in [(UInt8(1), 100_000), (3, 70_000), (4, 100_000)] {
                #expect(try store.chunk(chunkID(n)) == sealed(n, size), "fast path, chunk \(n)")
                #expect(try store.read { try $0.chunk(chunkID(n)) } == sealed(n, size), "transaction path, chunk \(n)")
            }
            #expect(try store.chunk(chunkID(2)) == [2, 2])
            // Storing a chunk that is already there (in a pack) writes nothing new.
            try store.write { w throws in try w.putChunks([(chunkID(1), sealed(1)), (chunkID(3), sealed(3, 70_000))]) }
            #expect(packFiles(dir).count == 1)
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
            #expect(FileManager.default.createFile(atPath: dir + "/chunks/packs/" + String(repeating: "ab", count: 16), contents: Data([1])))
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

    @Test func aDamagedLocatorOrMissingPackIsAnErrorNotACrash() throws {
        try withStore { store, dir throws in
            try store.write { w throws in try w.putChunks([(chunkID(1), sealed(1)), (chunkID(2), sealed(2))]) }
            for name in packFiles(dir) { try FileManager.default.removeItem(atPath: dir + "/chunks/packs/" + name) }
            #expect(throws: StoreError.self) { _ = try store.chunk(chunkID(1)) }
            try store.write { w throws in
                try w.db.execute(sql: "UPDATE chunks SET sealed = x'0102' WHERE in_file = 2")
            }
            #expect(throws: StoreError.self) { _ = try store.read { try $0.chunk(chunkID(2)) } }
        }
    }

    @Test func aChunkFileFromBeforePacksIsStillReadAndCollected() throws {
        try withStore { store, dir throws in
            // The layout stores had before packs: one file per chunk, its row empty.
            let id = chunkID(7)
            let hex = id.map { String(format: "%02x", $0) }.joined()
            try FileManager.default.createDirectory(atPath: dir + "/chunks/" + hex.prefix(2), withIntermediateDirectories: true)
            try Data(sealed(7)).write(to: URL(fileURLWithPath: dir + "/chunks/" + hex.prefix(2) + "/" + hex))
            try store.write { w throws in
                try w.db.execute(sql: "INSERT INTO chunks(id, sealed, in_file) VALUES (?, x'', 1)", arguments: [Data(id)])
            }
            #expect(try store.chunk(id) == sealed(7))
            #expect(try store.read { try $0.chunk(id) } == sealed(7))
            #expect(try store.collectGarbage().chunks == 1, "no manifest names it")
            #expect(!FileManager.default.fileExists(atPath: dir + "/chunks/" + hex.prefix(2) + "/" + hex))
        }
    }
}
