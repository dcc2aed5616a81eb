import CofferTestSupport
import CofferVault
import Foundation
import Testing

/// Two devices, one server: changes on one appear on the other.
@Suite(.serialized) struct BasicSyncTests {
    @Test func fileCreatedOnAAppearsOnB() async throws {
        let w = try await SyncWorld()
        try w.a.write("/hello.txt", "hello\n")
        try await w.sync(w.a, w.b)
        #expect(try w.b.read("/hello.txt") == "hello\n")
        try await w.expectConverged()
    }

    @Test func editOnBAppearsOnA() async throws {
        let w = try await SyncWorld()
        try w.a.write("/n.txt", "one\n")
        try await w.sync(w.a, w.b)
        try w.b.write("/n.txt", "two\n")
        try await w.sync(w.b, w.a)
        #expect(try w.a.read("/n.txt") == "two\n")
        try await w.expectConverged()
    }

    @Test func nestedFoldersAndEmptyFile() async throws {
        let w = try await SyncWorld()
        try w.a.mkdir("/a/b/c/d/e")
        try w.a.write("/a/b/c/d/e/deep.txt", "deep")
        try w.a.write("/a/empty", "")
        try await w.sync(w.a, w.b)
        #expect(try w.b.read("/a/b/c/d/e/deep.txt") == "deep")
        #expect(try w.b.read("/a/empty") == "")
        try await w.expectConverged()
    }

    @Test func deleteRenameAndMovePropagate() async throws {
        let w = try await SyncWorld()
        try w.a.mkdir("/x")
        try w.a.mkdir("/y")
        try w.a.write("/x/1.txt", "1")
        try w.a.write("/x/2.txt", "2")
        try w.a.write("/x/3.txt", "3")
        try await w.sync(w.a, w.b)
        try w.b.rm("/x/1.txt")
        try w.b.mv("/x/2.txt", "/x/two.txt")
        try w.b.mv("/x/3.txt", "/y/3.txt")
        try await w.sync(w.b, w.a)
        #expect(try w.a.ls("/x") == ["two.txt"])
        #expect(try w.a.ls("/y") == ["3.txt"])
        try await w.expectConverged()
    }

    @Test func multiChunkBinaryAndSymlinkAndAttributes() async throws {
        let w = try await SyncWorld()
        try w.a.write("/big.bin", pseudoRandomBytes(count: 1_300_000, seed: 3))
        try w.a.symlink("/link", "big.bin")
        try w.a.chmod("/big.bin", 0o600)
        try w.a.touch("/big.bin", 1_000_000)
        try w.a.setXattr("/big.bin", "user.tag", "blue")
        try await w.sync(w.a, w.b)
        #expect(try w.b.vault.readAll(w.b.vault.resolve("/big.bin").id) == pseudoRandomBytes(count: 1_300_000, seed: 3))
        #expect(try w.b.mode("/big.bin") == 0o600)
        #expect(try w.b.mtime("/big.bin") == 1_000_000)
        #expect(try w.b.xattrs("/big.bin") == ["user.tag": "blue"])
        #expect(try w.b.vault.resolve("/link").attributes.symlinkTarget == "big.bin")
        try await w.expectConverged()
    }

    @Test func deletedFolderIsPrunedEverywhere() async throws {
        let w = try await SyncWorld()
        try w.a.mkdir("/gone/inner")
        try w.a.write("/gone/inner/f.txt", "f")
        try await w.sync(w.a, w.b)
        try w.a.rm("/gone")
        try await w.sync(w.a, w.b, w.a, w.b)
        #expect(!w.b.exists("/gone"))
        // Pruned: only the root remains in each store.
        #expect(w.a.vault.fileCount == 1)
        #expect(w.b.vault.fileCount == 1)
        try await w.expectConverged()
    }

    @Test func createAndDeleteBeforeSyncSendsNothing() async throws {
        let w = try await SyncWorld()
        try w.a.write("/tmp.txt", "x")
        try w.a.rm("/tmp.txt")
        // Only the root's attributes (its mtime) are pending; the file was pruned outright.
        #expect(try w.a.vault.pendingRecords().allSatisfy { $0.stored.metadata.type == .folder })
        try await w.sync(w.a, w.b)
        #expect(try w.b.ls() == [])
        try await w.expectConverged()
    }

    /// In the mount daemon's mode (an open group transaction), a deletion is pruned at once
    /// only for a file the server never saw: whether the server knows it is read from the base
    /// rows the read connections see, which a pull commits before it returns.
    @Test func deletionsInAGroupPruneOnlyWhatTheServerNeverSaw() async throws {
        let w = try await SyncWorld()
        try w.a.write("/synced.txt", "s")
        try await w.sync(w.a, w.b)
        w.a.vault.enableGroupCommit(window: 60, longest: 120)
        try w.a.write("/local.txt", "l")
        try w.a.rm("/local.txt")
        try w.a.rm("/synced.txt")
        try w.a.vault.disableGroupCommit()
        let pending = try w.a.vault.pendingRecords().map(\.stored.metadata)
        #expect(pending.contains { $0.type == .document && $0.isDeleted })  // synced.txt, to push
        #expect(pending.filter { $0.type == .document }.count == 1)  // local.txt pruned outright
        try await w.sync(w.a, w.b, w.a)
        #expect(try w.b.ls() == [])
        #expect(w.a.vault.fileCount == 1)
        try await w.expectConverged()
    }

    @Test func oneByteEditOfALargeFilePushesOneChunk() async throws {
        let w = try await SyncWorld()
        var bytes = pseudoRandomBytes(count: 4 << 20, seed: 9)
        try w.a.write("/large.bin", bytes)
        try await w.sync(w.a, w.b)
        bytes[2_000_000] ^= 0xff
        let doc = try w.a.vault.openDocument(w.a.vault.resolve("/large.bin").id)
        try doc.write(offset: 2_000_000, bytes: [bytes[2_000_000]])
        try w.a.vault.release(doc)
        let report = try await w.a.engine.sync()
        #expect(report.pushedChunks == 1)
        let pulled = try await w.b.engine.sync()
        #expect(pulled.fetchedChunks == 1)
        #expect(try w.b.vault.readAll(w.b.vault.resolve("/large.bin").id) == bytes)
        try await w.expectConverged()
    }

    @Test func unicodeAndCaseDistinctNames() async throws {
        let w = try await SyncWorld()
        try w.a.write("/Résumé ✓.txt", "u")
        try w.a.write("/A.txt", "upper")
        try w.a.write("/a.txt", "lower")
        try await w.sync(w.a, w.b)
        #expect(try w.b.read("/Résumé ✓.txt") == "u")
        #expect(try w.b.read("/A.txt") == "upper" && w.b.read("/a.txt") == "lower")
        try await w.expectConverged()
    }

    @Test func renameBackAndForthIsNoChange() async throws {
        let w = try await SyncWorld()
        try w.a.write("/x.txt", "x")
        try await w.sync(w.a, w.b)
        try w.b.mv("/x.txt", "/y.txt")
        try w.b.mv("/y.txt", "/x.txt")
        try w.a.mv("/x.txt", "/z.txt")
        try await w.sync(w.a, w.b, w.a, w.b)
        #expect(try w.b.ls() == ["z.txt"])
        try await w.expectConverged()
    }

    @Test func offlineDeviceCatchesUpOnAThousandChanges() async throws {
        let w = try await SyncWorld()
        try w.a.mkdir("/bulk")
        for i in 0..<600 { try w.a.write("/bulk/f\(i).txt", "v1 \(i)\n") }
        try await w.a.sync()
        for i in 0..<200 { try w.a.write("/bulk/f\(i).txt", "v2 \(i)\n") }
        for i in 200..<300 { try w.a.rm("/bulk/f\(i).txt") }
        for i in 300..<400 { try w.a.mv("/bulk/f\(i).txt", "/bulk/g\(i).txt") }
        try await w.a.sync()
        // B was offline for all of it: 600 + 200 + 100 + 100 = 1000 remote changes.
        try w.b.write("/mine.txt", "offline edit")
        try await w.sync(w.b, w.a)
        #expect(try w.b.ls("/bulk").count == 500)
        #expect(try w.b.read("/bulk/f7.txt") == "v2 7\n")
        #expect(try w.b.read("/bulk/g350.txt") == "v1 350\n")
        #expect(try w.a.read("/mine.txt") == "offline edit")
        try await w.expectConverged()
    }

    @Test func threeDevicesConverge() async throws {
        let w = try await SyncWorld(devices: 3)
        try w.a.write("/a.txt", "a")
        try w.b.write("/b.txt", "b")
        try w.c.write("/c.txt", "c")
        try await w.sync(w.a, w.b, w.c)
        try await w.expectConverged()
        #expect(try w.a.ls() == ["a.txt", "b.txt", "c.txt"])
    }
}
