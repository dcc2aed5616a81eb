import Foundation
import Testing
import CofferModel
@testable import CofferStore

/// Group commit (the mount daemon's mode): writes share one SQLite transaction for up to a
/// window, each write stays atomic, and durability requests commit first. A second `Store` on
/// the same directory stands in for another process (its own connections).
@Suite("Group commit")
struct GroupCommitTests {
    @Test func writesShareATransactionUntilTheWindowCloses() throws {
        // A long window: nothing closes the group by itself in this test.
        try withGroupStore(window: 30) { store, dir throws in
            try store.write { w in try w.put(record(1, parent: 1, name: "root"), .local) }
            try store.write { w in try w.putChunk(id: chunkID(1), sealed: [1, 2, 3]) }
            // This process sees its own writes (reads go through the open transaction)...
            #expect(try store.read { try $0.file(fid(1), .local) } != nil)
            #expect(try store.read { try $0.chunk(chunkID(1)) } == [1, 2, 3])
            // ...another process does not, until the group commits.
            let other = try Store(directory: dir)
            #expect(try other.read { try $0.file(fid(1), .local) } == nil)
            try store.commitPendingWrites()
            #expect(try other.read { try $0.file(fid(1), .local) } != nil)
            #expect(try other.read { try $0.chunk(chunkID(1)) } == [1, 2, 3])
        }
    }

    @Test func aFailedWriteRollsBackOnlyItself() throws {
        struct Refused: Error {}
        try withGroupStore(window: 30) { store, dir throws in
            try store.write { w in try w.putChunk(id: chunkID(1), sealed: [1]) }
            #expect(throws: Refused.self) {
                try store.write { w in
                    try w.putChunk(id: chunkID(2), sealed: [2])
                    throw Refused()
                }
            }
            try store.write { w in try w.putChunk(id: chunkID(3), sealed: [3]) }
            try store.commitPendingWrites()
            let other = try Store(directory: dir)
            #expect(try other.read { try $0.hasChunk(chunkID(1)) })
            #expect(try !other.read { try $0.hasChunk(chunkID(2)) })
            #expect(try other.read { try $0.hasChunk(chunkID(3)) })
        }
    }

    @Test func anIdleGroupCommitsByItself() throws {
        try withGroupStore(window: 0.05) { store, dir throws in
            try store.write { w in try w.putChunk(id: chunkID(7), sealed: [7]) }
            let other = try Store(directory: dir)
            // The closing thread runs every half window; allow a generous margin on a busy machine.
            let deadline = Date().addingTimeInterval(5)
            var seen = false
            while !seen && Date() < deadline {
                seen = try other.read { try $0.hasChunk(chunkID(7)) }
                if !seen { Thread.sleep(forTimeInterval: 0.01) }
            }
            #expect(seen, "a write nobody follows must become visible without another write")
        }
    }

    @Test func durabilityAndGarbageCollectionCommitTheGroupFirst() throws {
        try withGroupStore(window: 30) { store, dir throws in
            try store.write { w in try w.putChunk(id: chunkID(1), sealed: [1]) }
            try store.makeDurable()
            let other = try Store(directory: dir)
            #expect(try other.read { try $0.hasChunk(chunkID(1)) })
            // GC runs its own transaction after committing the group (no nested BEGIN).
            try store.write { w in try w.putChunk(id: chunkID(2), sealed: [2]) }
            let collected = try store.collectGarbage()
            #expect(collected.chunks == 2, "neither chunk is listed by a manifest")
            #expect(try !other.read { try $0.hasChunk(chunkID(2)) })
        }
    }

    @Test func anotherProcessWaitsForTheGroupInsteadOfFailing() throws {
        try withGroupStore(window: 0.2) { store, dir throws in
            try store.write { w in try w.putChunk(id: chunkID(1), sealed: [1]) }
            // The group holds SQLite's write lock; the other writer waits (busy timeout) until
            // the group closes, then commits.
            let other = try Store(directory: dir)
            try other.write { w in try w.putChunk(id: chunkID(2), sealed: [2]) }
            #expect(try other.read { try $0.hasChunk(chunkID(1)) && $0.hasChunk(chunkID(2)) })
        }
    }
}

/// A store with group commit on, turned off (and its group committed) afterwards.
private func withGroupStore(window: Double, _ body: (Store, String) throws -> Void) throws {
    try withStore { store, dir throws in
        store.enableGroupCommit(window: window)
        defer { try? store.disableGroupCommit() }
        try body(store, dir)
    }
}
