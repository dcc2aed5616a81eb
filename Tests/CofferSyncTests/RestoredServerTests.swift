import CofferSync
import CofferTestSupport
import CofferVault
import Foundation
import Testing

/// Issue 19, defect 7 (the device's half): a server restored from an older backup must not split
/// the devices for ever. The device that finds the server behind what it already had sends its
/// base again (content first, parents first), reads the tree again, and says so.
extension SyncWorld {
    /// The operator's backup of the server's data directory, taken while the server is stopped.
    func backUpServer() throws -> String {
        let backup = tmp.path + "/server-backup-\(UInt32.random(in: 0...UInt32.max))"
        server.stop()
        let copied = sh("cp -a '\(server.dataDirectory)' '\(backup)'")
        try server.start()
        guard copied.status == 0 else { throw TestFailure("backup failed: \(copied.err)") }
        return backup
    }

    /// Puts `backup` back in place of the server's data directory and starts the server on it.
    func restoreServer(from backup: String) throws {
        server.stop()
        let restored = sh("rm -rf '\(server.dataDirectory)' && cp -a '\(backup)' '\(server.dataDirectory)'")
        guard restored.status == 0 else { throw TestFailure("restore failed: \(restored.err)") }
        try server.start()
    }
}

@Suite(.serialized) struct RestoredServerTests {
    @Test func aDeviceSendsWhatARestoredServerLostAndOtherDevicesReceiveIt() async throws {
        let w = try await SyncWorld()
        try w.a.mkdir("/docs")
        try w.a.write("/docs/one.txt", "one")
        try await w.sync(w.a, w.b)

        // The operator's backup, taken while the server is stopped.
        let backup = try w.backUpServer()

        // A keeps working and syncs: new files (one several chunks long), an edit, a new folder.
        let blob = pseudoRandomBytes(count: 3 * 1024 * 1024 + 17, seed: 19)
        try w.a.write("/docs/two.txt", "two")
        try w.a.write("/docs/one.txt", "one, edited")
        try w.a.mkdir("/pics/2026")
        try w.a.write("/pics/2026/big.bin", blob)
        try await w.a.sync()
        #expect(w.a.pending == 0)

        // The server is restored from the backup: everything A pushed since is gone from it.
        try w.restoreServer(from: backup)

        // The next `coffer sync` on A notices and sends its files again.
        let engine = SyncEngine(vault: w.a.vault, transport: HTTPTransport(baseURL: w.server.url))
        let report = try await engine.sync()
        let resent = try #require(report.resentToServer, "A did not notice that the server was behind")
        // docs/one.txt (edited), docs/two.txt, pics, pics/2026, pics/2026/big.bin, and the root
        // and docs folders, whose times changed.
        #expect(resent >= 5, "re-sent \(resent)")
        let notice = try #require(w.a.vault.serverCatchUpNotice)
        #expect(notice.contains("the server was behind this device (restored from a backup?); re-sent \(resent) file"))
        let status = coffer(w.a.vault.dataDirectory, ["status"])
        #expect(status.out.contains("restored from a backup?"), "\(status.out)")
        #expect(w.a.pending == 0)

        // B, which never saw A's later work, now receives all of it, content included.
        try await w.b.sync()
        #expect(try w.b.read("/docs/one.txt") == "one, edited")
        #expect(try w.b.read("/docs/two.txt") == "two")
        #expect(try w.b.vault.readAll(w.b.vault.resolve("/pics/2026/big.bin").id) == blob)
        try await w.expectConverged()

        // Once caught up, a further check finds nothing to send.
        let again = try await SyncEngine(vault: w.a.vault, transport: HTTPTransport(baseURL: w.server.url)).sync()
        #expect(again.resentToServer == nil)
    }

    /// A deletion the restore lost stays a deletion: the device pruned the file (keeping only its
    /// tombstone), so it signs a new deletion of the record the restored server serves again.
    @Test func aDeletionARestoredServerLostIsSentAgain() async throws {
        let w = try await SyncWorld()
        try w.a.write("/keep.txt", "keep")
        try w.a.write("/gone.txt", "deleted before the restore")
        try await w.sync(w.a, w.b)
        let backup = try w.backUpServer()
        try w.a.rm("/gone.txt")
        try await w.sync(w.a, w.b, w.a)
        #expect(!w.b.exists("/gone.txt"))
        try w.restoreServer(from: backup)

        let report = try await SyncEngine(vault: w.a.vault, transport: HTTPTransport(baseURL: w.server.url)).sync()
        #expect(report.resentToServer != nil)
        #expect(!w.a.exists("/gone.txt"))
        try await w.b.sync()
        #expect(!w.b.exists("/gone.txt") && w.b.exists("/keep.txt"))
        // A device that joins now never sees the file either.
        let c = try Vault.create(
            dataDirectory: w.tmp.sub("late"), username: w.a.vault.username, secret: w.a.vault.exportedSecret,
            createRoot: false)
        try c.setServer(w.server.url)
        try await SyncEngine(vault: c, transport: HTTPTransport(baseURL: w.server.url)).sync()
        #expect((try? c.resolve("/gone.txt")) == nil)
        #expect((try? c.resolve("/keep.txt")) != nil)
    }

    /// A file edited and then deleted with its folder, all after the backup: the restored server
    /// holds the file's older record, which the re-sent folder deletion marks deleted; the device
    /// takes that as the deletion it is (it never comes back), not as a rollback, and sync goes on.
    @Test func aFolderDeletedAfterAnEditInsideItIsRestoredWithoutADeadEnd() async throws {
        let w = try await SyncWorld()
        try w.a.mkdir("/f")
        try w.a.write("/f/x.txt", "first")
        try await w.sync(w.a, w.b)
        let backup = try w.backUpServer()
        try w.a.write("/f/x.txt", "second")
        try await w.a.sync()
        try w.a.rm("/f")
        try await w.a.sync()
        try w.restoreServer(from: backup)

        let report = try await SyncEngine(vault: w.a.vault, transport: HTTPTransport(baseURL: w.server.url)).sync()
        #expect(report.resentToServer != nil)
        try await w.a.sync()
        try await w.b.sync()
        #expect(!w.a.exists("/f") && !w.b.exists("/f"))
        try await w.expectConverged()
    }

    @Test func bothDevicesKeepWorkingAfterARestoreAndNothingIsMissed() async throws {
        let w = try await SyncWorld()
        try w.a.write("/before.txt", "before")
        try await w.sync(w.a, w.b)
        let backup = try w.backUpServer()
        try w.a.write("/lost.txt", "A's work the restore loses")
        try await w.a.sync()
        try w.restoreServer(from: backup)

        // B, whose cursor is older than the backup, keeps working through the restored server: its
        // batches take version numbers A has already read past, then go beyond A's cursor.
        for i in 0..<6 {
            try w.b.write("/b\(i).txt", "b\(i)")
            try await w.b.sync()
        }
        let report = try await SyncEngine(vault: w.a.vault, transport: HTTPTransport(baseURL: w.server.url)).sync()
        #expect(report.resentToServer != nil, "A did not notice that the server was behind")
        // A reads what B pushed at the reused versions, and B gets A's lost file.
        for i in 0..<6 { #expect(try w.a.read("/b\(i).txt") == "b\(i)") }
        try await w.b.sync()
        #expect(try w.b.read("/lost.txt") == "A's work the restore loses")
        try await w.expectConverged()
    }

    @Test func aServerThatIsNotBehindIsLeftAlone() async throws {
        let w = try await SyncWorld()
        try w.a.write("/a.txt", "a")
        try await w.sync(w.a, w.b)
        try w.b.write("/b.txt", "b")
        try await w.sync(w.b)
        // A fresh engine checks on its first sync; B's newer batch is above A's cursor.
        let report = try await SyncEngine(vault: w.a.vault, transport: HTTPTransport(baseURL: w.server.url)).sync()
        #expect(report.resentToServer == nil)
        let idle = try await SyncEngine(vault: w.a.vault, transport: HTTPTransport(baseURL: w.server.url)).sync()
        #expect(idle.resentToServer == nil && idle.pushedRecords == 0)
        #expect(w.a.vault.serverCatchUpNotice == nil)
        try await w.expectConverged()
    }
}
