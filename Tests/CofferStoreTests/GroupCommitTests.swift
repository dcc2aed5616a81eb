import CofferModel
import CofferTestSupport
import Foundation
import Synchronization
import Testing

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

    @Test func aLaterPutOfARowTakesTheQueuedOnesPlace() throws {
        try withGroupStore(window: 30) { store, dir throws in
            // A document whose row already names content D0, committed.
            try store.write { w in
                try w.put(record(1, parent: 1, name: "root"), .local)
                try w.putManifest(digest: digest(0), sealed: [0], chunkIDs: [])
                try w.put(record(2, parent: 1, name: "a", digest: digest(0)), .local, previousDigest: .some(nil))
            }
            try store.commitPendingWrites()
            // In one group: a new document created empty and given content (a file copied in),
            // and the first one given content twice (D0 -> D1 -> D2).
            try store.write { w in try w.put(record(3, parent: 1, name: "b"), .local, previousDigest: .some(nil)) }
            for (n, before) in [(UInt8(1), UInt8(0)), (2, 1)] {
                try store.write { w in
                    try w.putManifest(digest: digest(n), sealed: [n], chunkIDs: [])
                    try w.put(
                        record(2, parent: 1, name: "a", digest: digest(n)), .local,
                        previousDigest: .some(digest(before)))
                }
            }
            try store.write { w in
                try w.putManifest(digest: digest(3), sealed: [3], chunkIDs: [])
                try w.put(record(3, parent: 1, name: "b", digest: digest(3)), .local, previousDigest: .some(nil))
            }
            // One put per row is left in the queue.
            #expect(store.group.queuedPuts == 2)
            try store.commitPendingWrites()
            let other = try Store(directory: dir)
            #expect(try other.read { try $0.file(fid(2), .local)?.metadata.contentDigest } == digest(2))
            #expect(try other.read { try $0.file(fid(3), .local)?.metadata.contentDigest } == digest(3))
            // The manifests no row names any more went with the merged puts: D0 (named before
            // the group) and D1 (named only by the dropped put), as without merging.
            #expect(try other.read { try $0.manifest(digest(0)) } == nil)
            #expect(try other.read { try $0.manifest(digest(1)) } == nil)
            #expect(try other.read { try $0.manifest(digest(2)) } == [2])
            #expect(try other.read { try $0.manifest(digest(3)) } == [3])
            #expect(try other.committedCount() == 3)
            #expect(try other.pendingCounts().created == 3)
            // D0 and D1 were each replaced once, as if both puts had run (the counter tells a
            // mount when garbage collection pays).
            #expect(try other.garbageSinceCollection() == 2)
        }
    }

    @Test func putsOfARowAreNotMergedAcrossAnotherChangeOfIt() throws {
        try withGroupStore(window: 30) { store, dir throws in
            try store.write { w in try w.put(record(1, parent: 1, name: "root"), .local) }
            try store.write { w in try w.put(record(2, parent: 1, name: "a"), .local) }
            try store.write { w in try w.remove(fid(2), .local) }
            try store.write { w in try w.put(record(2, parent: 1, name: "b"), .local) }
            // The other side's row of the same file is another row.
            try store.write { w in try w.put(record(1, parent: 1, name: "root"), .base) }
            try store.write { w in try w.put(record(1, parent: 1, name: "root"), .local) }
            #expect(store.group.queuedPuts == 5)
            // Once the first put has run, a later one cannot take its place.
            _ = try store.read { try $0.file(fid(2), .local) }
            try store.write { w in try w.put(record(2, parent: 1, name: "c"), .local) }
            #expect(store.group.queuedPuts == 1)
            try store.commitPendingWrites()
            let other = try Store(directory: dir)
            #expect(try other.read { try $0.file(fid(2), .local)?.metadata.name.mac } == Array("c".utf8))
            #expect(try other.committedCount() == 2)
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

    @Test func aWritesStatementsWaitInTheQueueUntilSomeoneReads() throws {
        try withGroupStore(window: 30) { store, _ throws in
            try store.write { w in try w.putChunk(id: chunkID(1), sealed: [1]) }
            // The write returned without running its insert: it waits for the group's thread...
            #expect(store.group.hasQueued)
            // ...or for the first read through the writer, which runs the queue first.
            #expect(try store.read { try $0.hasChunk(chunkID(1)) })
            #expect(!store.group.hasQueued)
        }
    }

    @Test func aWriteReadsItsOwnEarlierStatementsAndStillRollsBackWhole() throws {
        struct Refused: Error {}
        try withGroupStore(window: 30) { store, dir throws in
            #expect(throws: Refused.self) {
                try store.write { w in
                    try w.putChunk(id: chunkID(2), sealed: [2])
                    // Its own queued insert runs (inside a savepoint) before the query.
                    #expect(try w.reader.hasChunk(chunkID(2)))
                    try w.putChunk(id: chunkID(3), sealed: [3])
                    throw Refused()
                }
            }
            #expect(try !store.read { try $0.hasChunk(chunkID(2)) || $0.hasChunk(chunkID(3)) })
            try store.write { w in
                try w.putChunk(id: chunkID(4), sealed: [4])
                #expect(try w.reader.hasChunk(chunkID(4)))
                try w.putChunk(id: chunkID(5), sealed: [5])
            }
            try store.commitPendingWrites()
            let other = try Store(directory: dir)
            #expect(try other.read { try $0.hasChunk(chunkID(4)) && $0.hasChunk(chunkID(5)) })
            #expect(try !other.read { try $0.hasChunk(chunkID(2)) || $0.hasChunk(chunkID(3)) })
        }
    }

    @Test func numbersHandedOutInMemoryContinueSQLitesOwn() throws {
        try withGroupStore(window: 30) { store, dir throws in
            // Another process logs two changes and trims the log (AUTOINCREMENT remembers them).
            let other = try Store(directory: dir)
            try other.write { try $0.logChange(fid(10)) }
            try other.write { try $0.logChange(fid(11)) }
            let logged = try other.read { try $0.lastChange() }
            try other.write { try $0.trimChangeLog(keeping: 0) }
            // The group hands out what AUTOINCREMENT would have: never a number used before.
            let seq = try store.write { w -> Int64? in
                try w.logChange(fid(12))
                return w.lastLogged
            }
            #expect(seq == logged + 1)
            try store.commitPendingWrites()
            #expect(try other.read { try $0.lastChange() } == logged + 1)
            #expect(try other.read { try $0.changes(after: logged) }.ids == [fid(12)])
            // And SQLite's own numbering carries on after the group's.
            try other.write { try $0.logChange(fid(13)) }
            #expect(try other.read { try $0.lastChange() } == logged + 2)
        }
    }

    @Test func aQueuedStatementThatFailsLosesTheWholeGroup() throws {
        try withGroupStore(window: 30) { store, dir throws in
            try store.write { w in try w.putChunk(id: chunkID(6), sealed: [6]) }
            try store.write { try $0.addInodeException(fid(20), 1 << 62) }
            // A second file with the same number breaks a UNIQUE constraint, but only when its
            // insert runs: the write itself returned.
            try store.write { try $0.addInodeException(fid(21), 1 << 62) }
            #expect(throws: (any Error).self) { try store.commitPendingWrites() }
            #expect(store.takeLostGroup(), "the owner must learn that its recent writes are gone")
            let other = try Store(directory: dir)
            #expect(try other.read { try $0.inodeExceptions() }.isEmpty)
            #expect(try !other.read { try $0.hasChunk(chunkID(6)) })
            // The store goes on with a new group.
            try store.write { w in try w.putChunk(id: chunkID(7), sealed: [7]) }
            try store.commitPendingWrites()
            #expect(try other.read { try $0.hasChunk(chunkID(7)) })
        }
    }

    @Test func aSmallChunkIsSealedWhenItsStatementRuns() throws {
        try withGroupStore(window: 30) { store, dir throws in
            let sealings = Mutex(0)
            try store.write { w in
                try w.putChunk(
                    id: chunkID(8),
                    sealing: {
                        sealings.withLock { $0 += 1 }
                        return [8, 8]
                    })
            }
            #expect(sealings.withLock { $0 } == 0, "sealing waits for the queue")
            try store.commitPendingWrites()
            #expect(sealings.withLock { $0 } == 1)
            #expect(try Store(directory: dir).chunk(chunkID(8)) == [8, 8])
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

    @Test func aBurstSharesOneGroupAndALoneChangeCommitsSoon() throws {
        try withStore { store, dir throws in
            store.enableGroupCommit(window: 1, longest: 30)
            defer { try? store.disableGroupCommit() }
            // Writes 10 ms apart for 2.5 s, well past the window (so a group closing at its window
            // would show) but never the half window (0.5 s) of quiet a commit waits for, even on
            // a busy machine: all of them share one group.
            try store.write { w in try w.setSetting("burst", [0]) }
            let generation = store.group.openGeneration
            for i in 1...250 {
                try store.write { w in try w.setSetting("burst", [UInt8(i)]) }
                Thread.sleep(forTimeInterval: 0.01)
            }
            #expect(store.group.openGeneration == generation, "a commit cut the burst")
            // Once writes stop, the group commits about a window later, long before `longest`.
            let other = try Store(directory: dir)
            #expect(eventually(timeout: 10) { (try? other.read { try $0.setting("burst") }) == [250] })
            #expect(!store.group.isOpen)
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

    @Test func fastLookupsSeeTheGroupAndOtherProcessesCommits() throws {
        try withGroupStore(window: 30) { store, dir throws in
            let big = [UInt8](repeating: 9, count: 100_000)  // a chunk file, not a row
            try store.write { w in
                try w.putChunk(id: chunkID(1), sealed: [1, 2, 3])
                try w.putChunk(id: chunkID(2), sealed: big)
                try w.putManifest(digest: chunkID(3), sealed: [4, 5], chunkIDs: [chunkID(1)])
            }
            // Uncommitted: visible to this store (through the group), not to another one.
            #expect(try store.chunk(chunkID(1)) == [1, 2, 3])
            #expect(try store.manifest(chunkID(3)) == [4, 5])
            let other = try Store(directory: dir)
            #expect(try other.chunk(chunkID(1)) == nil)
            #expect(try other.manifest(chunkID(3)) == nil)
            try store.commitPendingWrites()
            // The other store's fast connections read each lookup's own committed snapshot.
            #expect(try other.chunk(chunkID(1)) == [1, 2, 3])
            #expect(try other.chunk(chunkID(2)) == big)
            #expect(try other.manifest(chunkID(3)) == [4, 5])
            #expect(try other.chunk(chunkID(4)) == nil)
        }
    }

    @Test func theLogIsCheckpointedInTheBackground() throws {
        try withGroupStore(window: 0.05) { store, dir throws in
            let database = dir + "/coffer.sqlite"
            let before = fileSize(database)
            // About 2 MB of rows: far below the writer's own checkpoint threshold (64 MB), so only
            // the background checkpoint can move them from the log into the database file.
            for i in 0..<200 {
                try store.write { w in
                    try w.putManifest(
                        digest: chunkID(UInt8(i % 250)) + [UInt8(i / 250)],
                        sealed: [UInt8](repeating: UInt8(i % 251), count: 10_000), chunkIDs: [])
                }
            }
            try store.commitPendingWrites()
            let deadline = Date().addingTimeInterval(10)
            while fileSize(database) < before + 1_500_000 && Date() < deadline { Thread.sleep(forTimeInterval: 0.05) }
            #expect(
                fileSize(database) >= before + 1_500_000,
                "the database file grew by \(fileSize(database) - before) bytes")
        }
    }

    /// A log that grew large (untar) is cut back to `journal_size_limit` once checkpointed and
    /// restarted. Kept large, every later write would land in its old blocks, and after the page
    /// cache dropped them (memory pressure, drop_caches) each 4120-byte frame written there
    /// straddles two uncached pages the kernel first reads from disk: rm -rf of 12,000 files
    /// read 40-70 MB that way.
    @Test func aLargeLogShrinksOnceCheckpointed() throws {
        try withGroupStore(window: 0.05) { store, dir throws in
            let log = dir + "/coffer.sqlite-wal"
            // About 12 MB of rows, committed in groups: the log grows past the limit.
            for i in 0..<1200 {
                try store.write { w in
                    try w.putManifest(
                        digest: chunkID(UInt8(i % 250)) + [UInt8(i / 250)],
                        sealed: [UInt8](repeating: UInt8(i % 251), count: 10_000), chunkIDs: [])
                }
            }
            try store.commitPendingWrites()
            let grown = fileSize(log)
            #expect(grown > Store.logSizeLimit + 4_000_000, "the log grew to \(grown) bytes")
            // Once the background checkpoint has copied it all, the next commit restarts the log
            // from its start and truncates the file.
            let deadline = Date().addingTimeInterval(15)
            var size = grown
            var tick: UInt8 = 0
            while size > Store.logSizeLimit && Date() < deadline {
                Thread.sleep(forTimeInterval: 0.2)
                tick &+= 1  // a changed value: rewriting the same bytes writes no page
                try store.write { w in try w.setSetting("tick", [tick]) }
                try store.commitPendingWrites()
                size = fileSize(log)
            }
            #expect(size <= Store.logSizeLimit, "the log is still \(size) bytes")
        }
    }
    /// The idle trim of a grown log must never wait for a reader: a reader that keeps its
    /// snapshot for seconds (a CLI export, a sync reading) would otherwise hold every write of
    /// the mount up for as long (SQLite's busy timeout is 30 s). The reader here keeps its
    /// snapshot until the write has committed; a write queued behind the trim could only commit
    /// once the reader gave up waiting, which it reports.
    @Test func aLongReaderNeverHoldsUpWritesWhileTheLogIsTrimmed() throws {
        try withGroupStore(window: 0.05) { store, dir throws in
            for i in 0..<1200 {
                try store.write { w in
                    try w.putManifest(
                        digest: chunkID(UInt8(i % 250)) + [UInt8(i / 250)],
                        sealed: [UInt8](repeating: UInt8(i % 251), count: 10_000), chunkIDs: [])
                }
            }
            try store.commitPendingWrites()
            #expect(fileSize(dir + "/coffer.sqlite-wal") > Store.logSizeLimit)
            let other = try Store(directory: dir)
            let reading = DispatchSemaphore(value: 0)
            let written = DispatchSemaphore(value: 0)
            let done = DispatchSemaphore(value: 0)
            let readerGaveUp = Atomic<Bool>(false)
            Thread {
                _ = try? other.read { r in
                    _ = try r.lastChange()  // takes the snapshot
                    reading.signal()
                    // Long past the busy timeout's reach of a test run; only a deadlock ends here.
                    if written.wait(timeout: .now() + 20) == .timedOut { readerGaveUp.store(true, ordering: .relaxed) }
                }
                done.signal()
            }.start()
            reading.wait()
            Thread.sleep(forTimeInterval: 1.5)  // idle: the group thread tries to trim meanwhile
            try store.write { w in try w.setSetting("after", [1]) }
            try store.commitPendingWrites()
            written.signal()
            done.wait()
            let gaveUp = readerGaveUp.load(ordering: .relaxed)
            #expect(!gaveUp, "the write waited behind the trim for the reader")
            #expect(try store.read { try $0.setting("after") } == [1])
        }
    }
}

private func fileSize(_ path: String) -> Int {
    var st = stat()
    return stat(path, &st) == 0 ? Int(st.st_size) : 0
}

/// A store with group commit on, turned off (and its group committed) afterwards.
private func withGroupStore(window: Double, _ body: (Store, String) throws -> Void) throws {
    try withStore { store, dir throws in
        store.enableGroupCommit(window: window)
        defer { try? store.disableGroupCommit() }
        try body(store, dir)
    }
}
