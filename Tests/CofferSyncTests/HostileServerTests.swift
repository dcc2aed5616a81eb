import CofferModel
import CofferStore
import CofferSync
import CofferTestSupport
import Foundation
import Testing

@testable import CofferVault

/// A server whose database was edited between syncs: every record it serves is still validly
/// signed, but old (rollback), back from the dead (resurrection) or deleted by the server's own
/// say-so. Each must end in a clear refusal, recorded for `coffer status`, with nothing lost on
/// the device.
@Suite(.serialized) struct HostileServerTests {
    /// Runs `sql` on the stopped server's database, then starts it again (its cache is gone).
    func editServer(_ world: SyncWorld, _ sql: String) throws {
        world.server.stop()
        let r = run("/usr/bin/sqlite3", [world.server.dataDirectory + "/metadata.sqlite", sql])
        #expect(r.status == 0, "sqlite3: \(r.err)")
        try world.server.start()
    }

    /// SQL giving `id`'s row the next version, so devices pull it as news.
    func bump(_ id: FileID, set: String) -> String {
        """
        UPDATE counter SET value = value + 1 WHERE name = 'version';
        UPDATE file SET \(set), version = (SELECT value FROM counter WHERE name = 'version')
          WHERE id = X'\(hexString(id.bytes))';
        UPDATE account SET version = (SELECT value FROM counter WHERE name = 'version');
        """
    }

    /// One column of `id`'s row on the server, in hex.
    func column(_ name: String, of id: FileID, in world: SyncWorld) -> String {
        let query = "SELECT hex(\(name)) FROM file WHERE id = X'\(hexString(id.bytes))'"
        return run("/usr/bin/sqlite3", [world.server.dataDirectory + "/metadata.sqlite", query]).out
            .trimmingCharacters(in: .whitespacesAndNewlines)
    }

    func expectRefused(_ d: Device, containing text: String, sourceLocation: SourceLocation = #_sourceLocation) async {
        do {
            try await d.sync()
            Issue.record("the sync was expected to be refused", sourceLocation: sourceLocation)
        } catch {
            #expect("\(error)".contains(text), "\(error)", sourceLocation: sourceLocation)
        }
        #expect(
            d.vault.syncStatus.lastError?.contains(text) == true, "status: \(d.vault.syncStatus.lastError ?? "-")",
            sourceLocation: sourceLocation)
    }

    @Test func anOlderRecordServedAgainIsRefused() async throws {
        let world = try await SyncWorld()
        try world.a.write("/notes.txt", "first")
        try await world.sync(world.a, world.b)
        let id = try world.a.vault.resolve("/notes.txt").id
        let old = column("record", of: id, in: world)
        let oldDigest = column("digest", of: id, in: world)
        try world.a.write("/notes.txt", "second")
        try await world.sync(world.a, world.b)
        #expect(try world.b.read("/notes.txt") == "second")

        try editServer(
            world, bump(id, set: "record = X'\(old)', digest = X'\(oldDigest)', content_version = version + 1"))
        await expectRefused(world.b, containing: "older record")
        #expect(try world.b.read("/notes.txt") == "second")
        await expectRefused(world.a, containing: "older record")
        #expect(try world.a.read("/notes.txt") == "second")
    }

    /// A rollback needs no content from the server: an old name, served again, would silently
    /// undo a rename on every device.
    @Test func anOlderNameServedAgainIsRefused() async throws {
        let world = try await SyncWorld()
        try world.a.write("/draft.txt", "text")
        try await world.sync(world.a, world.b)
        let id = try world.a.vault.resolve("/draft.txt").id
        let old = column("record", of: id, in: world)
        try world.a.mv("/draft.txt", "/final.txt")
        try await world.sync(world.a, world.b)
        #expect(world.b.exists("/final.txt"))

        try editServer(world, bump(id, set: "record = X'\(old)'"))
        await expectRefused(world.b, containing: "older record")
        #expect(world.b.exists("/final.txt") && !world.b.exists("/draft.txt"))
    }

    @Test func aPrunedFileServedAliveAgainIsRefused() async throws {
        let world = try await SyncWorld()
        try world.a.write("/gone.txt", "soon deleted")
        try await world.sync(world.a, world.b)
        let id = try world.a.vault.resolve("/gone.txt").id
        let live = column("record", of: id, in: world)
        try world.a.rm("/gone.txt")
        try await world.sync(world.a, world.b, world.a)
        #expect(!world.b.exists("/gone.txt"))
        // Both devices pruned it; only the tombstone remembers the id.
        #expect(try world.b.vault.store.read { try $0.file(id, .base) } == nil)

        try editServer(world, bump(id, set: "record = X'\(live)', deleted = 0, server_deleted = 0"))
        await expectRefused(world.b, containing: "back to life")
        #expect(!world.b.exists("/gone.txt"))
    }

    @Test func aDeletionNobodySignedIsRefused() async throws {
        let world = try await SyncWorld()
        try world.a.mkdir("/keep")
        try world.a.write("/keep/precious.txt", "do not lose me")
        try await world.sync(world.a, world.b)
        let id = try world.a.vault.resolve("/keep/precious.txt").id

        try editServer(world, bump(id, set: "deleted = 1, server_deleted = 1"))
        await expectRefused(world.b, containing: "no deletion of it or of a folder above it is signed")
        #expect(try world.b.read("/keep/precious.txt") == "do not lose me")
        await expectRefused(world.a, containing: "no deletion of it or of a folder above it is signed")
        #expect(try world.a.read("/keep/precious.txt") == "do not lose me")
    }

    /// The honest counterpart: a signed deletion of a folder deletes what is inside it everywhere.
    @Test func aSignedFolderDeletionStillDeletesItsContents() async throws {
        let world = try await SyncWorld()
        try world.a.mkdir("/old")
        try world.a.write("/old/a.txt", "a")
        try await world.sync(world.a, world.b)
        try world.b.write("/old/b.txt", "b")
        try world.a.rm("/old")
        try await world.sync(world.a, world.b, world.a)
        #expect(!world.a.exists("/old/a.txt"))
        try await world.expectConverged()
    }
}
