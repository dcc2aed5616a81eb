import CofferCrypto
import CofferModel
import Foundation
import Testing

@testable import CofferStore
@testable import CofferVault

/// The vault's tree as it lives in the store: what an open group wrote is seen by the vault
/// before the store's readers see it, and after; caches stay within their bound.
@Suite struct StoreTreeTests {
    /// Creates, a move between folders and a deletion inside one open group: the vault answers
    /// from its overlay while the store's read connections still see the tree before the group,
    /// and the same once the group commits.
    @Test func writesOfAnOpenGroupAreSeenBeforeAndAfterItCommits() throws {
        let f = try VaultFixture()
        let a = try f.folder("a")
        let b = try f.folder("b")
        let keep = try f.document("keep.txt", in: a.id, contents: Array("k".utf8))
        f.vault.enableGroupCommit(window: 60, longest: 120)
        defer { try? f.vault.disableGroupCommit() }

        let sub = try f.folder("sub", in: a.id)
        let moved = try f.document("moved.txt", in: a.id)
        try f.vault.rename(moved.id, to: b.id, name: "moved.txt")
        try f.vault.rename(sub.id, to: b.id, name: "sub")
        try f.vault.remove(keep.id)
        let fresh = try f.folder("fresh", in: b.id)

        func check(_ when: Comment) throws {
            #expect(try f.names(a.id) == [], when)
            #expect(try f.names(b.id) == ["fresh", "moved.txt", "sub"], when)
            #expect(try f.vault.node(a.id).subfolders == 0, when)
            #expect(try f.vault.node(b.id).subfolders == 2, when)
            #expect(try f.vault.lookup(b.id, "sub")?.id == sub.id, when)
            #expect(try f.vault.lookup(a.id, "keep.txt") == nil, when)
            #expect(try f.vault.resolve("/b/fresh").id == fresh.id, when)
            // The root, a, b, sub, moved.txt and fresh: keep.txt never reached a server, so its
            // deletion removed it.
            #expect(f.vault.fileCount == 6, when)
        }
        // The store's readers do not see the group yet; the vault does.
        #expect(try f.vault.store.committedChildren(of: b.id).isEmpty)
        try check("while the group is open")
        try f.vault.store.commitPendingWrites()
        #expect(try Set(f.vault.store.committedChildren(of: b.id).map(\.metadata.id)) == [sub.id, moved.id, fresh.id])
        try check("after it committed")
        // A new vault on the same store (another process) sees the same tree.
        let other = try Vault.open(dataDirectory: f.dataDir)
        #expect(try other.children(of: b.id).map(\.name) == ["fresh", "moved.txt", "sub"])
        #expect(try other.node(b.id).subfolders == 2)
        #expect(try f.vault.check().isClean)
    }

    /// Lookups by name inside an open group read only the pending files filed under that name
    /// (every name a pending file had or has), so renames back and forth, names reused and a
    /// committed file renamed away are all answered as the tree stands, and a name taken in the
    /// group is refused to a new file.
    @Test func namesChangedInAnOpenGroupAreLookedUpRight() throws {
        let f = try VaultFixture()
        let a = try f.folder("a")
        let old = try f.document("p.txt", in: a.id)
        let sub = try f.folder("sub", in: a.id)
        f.vault.enableGroupCommit(window: 60, longest: 120)
        defer { try? f.vault.disableGroupCommit() }

        let x = try f.document("x.txt", in: a.id)
        try f.vault.rename(x.id, to: a.id, name: "y.txt")
        let x2 = try f.document("x.txt", in: a.id)
        try f.vault.rename(old.id, to: a.id, name: "q.txt")
        let p2 = try f.document("p.txt", in: a.id)
        #expect(throws: (any Error).self) { try f.vault.create(in: a.id, name: "q.txt", type: .document, mode: 0o644) }
        #expect(throws: (any Error).self) { try f.vault.create(in: a.id, name: "y.txt", type: .document, mode: 0o644) }
        // A folder moved out and back counts once.
        try f.vault.rename(sub.id, to: f.vault.rootID, name: "sub")
        #expect(try f.vault.node(a.id).subfolders == 0)
        try f.vault.rename(sub.id, to: a.id, name: "sub2")

        func check(_ when: Comment) throws {
            #expect(try f.vault.lookup(a.id, "x.txt")?.id == x2.id, when)
            #expect(try f.vault.lookup(a.id, "y.txt")?.id == x.id, when)
            #expect(try f.vault.lookup(a.id, "p.txt")?.id == p2.id, when)
            #expect(try f.vault.lookup(a.id, "q.txt")?.id == old.id, when)
            #expect(try f.vault.lookup(a.id, "sub") == nil, when)
            #expect(try f.vault.lookup(a.id, "sub2")?.id == sub.id, when)
            #expect(try f.vault.lookup(f.vault.rootID, "sub") == nil, when)
            #expect(try f.vault.node(a.id).subfolders == 1, when)
            #expect(try f.names(a.id) == ["p.txt", "q.txt", "sub2", "x.txt", "y.txt"], when)
        }
        try check("while the group is open")
        try f.vault.store.commitPendingWrites()
        try check("after it committed")
        #expect(try f.vault.check().isClean)
    }

    /// A tree far larger than the caches: every file is still found, listed and renamed, and
    /// no cache holds more than its bound.
    @Test func aTreeLargerThanTheCachesIsReadFromTheStore() throws {
        let dir = NSTemporaryDirectory() + "coffer-storetree-" + UUID().uuidString
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let vault = try Vault.create(dataDirectory: dir, username: "alice", cacheEntries: 16)
        var folders: [FileID] = []
        for i in 0..<10 {
            folders.append(try vault.create(in: vault.rootID, name: "d\(i)", type: .folder, mode: 0o755).id)
        }
        var created: [FileID] = []
        for (i, folder) in folders.enumerated() {
            for j in 0..<20 {
                created.append(try vault.create(in: folder, name: "f\(i)-\(j)", type: .document, mode: 0o644).id)
            }
        }
        // The creating vault finds its files after its caches dropped them: a new file's id is
        // answered "absent" without asking the store only until the create is written.
        for id in created { #expect(try vault.node(id).type == .document) }
        let reopened = try Vault.open(dataDirectory: dir, cacheEntries: 16)
        for (i, folder) in folders.enumerated() {
            #expect(try reopened.children(of: folder).map(\.name).sorted() == (0..<20).map { "f\(i)-\($0)" }.sorted())
        }
        for (i, folder) in folders.enumerated() {
            let n = try #require(try reopened.lookup(folder, "f\(i)-7"))
            try reopened.rename(n.id, to: folders[(i + 1) % folders.count], name: "moved\(i)")
        }
        #expect(try reopened.node(reopened.rootID).subfolders == 10)
        for (i, folder) in folders.enumerated() {
            #expect(try reopened.lookup(folder, "moved\((i + folders.count - 1) % folders.count)") != nil)
        }
        let sizes = reopened.state.withLock { s in
            (s.view.cache.keys.count, s.view.cache.names.count, s.view.cache.attributes.count)
        }
        #expect(sizes.0 <= 16 && sizes.1 <= 16 && sizes.2 <= 16, "caches \(sizes)")
        #expect(reopened.fileCount == 211)
        #expect(try reopened.check().isClean)
    }

    /// Another process's change made just before a pull is not lost behind it: the pull's write
    /// catches up with every change, not only its own (a move by the CLI while the mount pulled
    /// was undone by the mount's next write to the file).
    @Test func aPullStillSeesWhatAnotherProcessChangedBeforeIt() throws {
        let f = try VaultFixture()
        let x = try f.folder("x")
        let d = try f.document("d", contents: Array("d".utf8))
        let other = try Vault.open(dataDirectory: f.dataDir)
        #expect(try other.lookup(other.rootID, "d")?.id == d.id)  // cached there
        try f.vault.rename(d.id, to: x.id, name: "d")
        try other.applyPull([], cursor: 0)
        #expect(try other.lookup(other.rootID, "d") == nil)
        #expect(try other.refresh().contains(d.id), "the kernel must hear of it")
        try other.setAttributes(d.id, AttributeChanges(mode: 0o600))
        #expect(try f.vault.resolve("/x/d").attributes.mode.value == 0o600)
        #expect(try f.vault.lookup(f.root, "d") == nil)
    }

    /// A later process's stamps win: the clock a reopened vault starts from is ahead of every
    /// stamp it issued before, without reading every record. The stamp compared is another
    /// file's, which the reopened vault never opens, and its wall clock has gone back, so only
    /// the stored lease can put the new stamp ahead.
    @Test func aReopenedVaultStampsLaterThanEverBefore() throws {
        let f = try VaultFixture()
        let untouched = try f.document("old.txt")
        let changed = try f.document("d.txt")
        try f.vault.setAttributes(changed.id, AttributeChanges(mode: 0o640))
        let latest = try f.vault.node(changed.id).attributes.mode.stamp
        let reopened = try Vault.open(dataDirectory: f.dataDir, now: { Timespec(seconds: 1) })
        try reopened.setAttributes(untouched.id, AttributeChanges(mode: 0o600))
        #expect(try reopened.node(untouched.id).attributes.mode.stamp > latest)
    }

    /// Short-lived processes one after another (commands within seconds of each other) keep
    /// their stamps ordered without running ahead of the wall clock: each starts from the lease
    /// the last one left, which lies just past its stamps, not 10 s further. Before, ten
    /// commands in a row stamped 100 s into the future, and their device won every merge
    /// against devices that really wrote later.
    @Test func commandsInARowDoNotRunTheClockAhead() throws {
        let f = try VaultFixture()
        let d = try f.document("d.txt")
        var last = try f.vault.node(d.id).attributes.mode.stamp
        for mode in UInt32(0o600)..<0o612 {
            let process = try Vault.open(dataDirectory: f.dataDir)
            try process.setAttributes(d.id, AttributeChanges(mode: mode))
            let stamp = try process.node(d.id).attributes.mode.stamp
            #expect(stamp > last)
            last = stamp
        }
        let now = Vault.systemNow()
        let wall = UInt64(now.seconds) * 1000 + UInt64(now.nanoseconds) / 1_000_000
        #expect(last.wallMillis <= wall + Vault.clockLeaseMillis + 1000, "\(last.wallMillis - wall) ms ahead")
    }
}
