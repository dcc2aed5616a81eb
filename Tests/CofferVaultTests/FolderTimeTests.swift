import CofferModel
import Foundation
import Synchronization
import Testing

@testable import CofferVault

/// The mount daemon's coalescing of folder time updates (`Vault.coalesceFolderTimes`).
@Suite struct FolderTimeCoalescingTests {
    /// A clock the test moves by hand, so "due" is decided by the test, not by the machine.
    final class Clock: Sendable {
        private let t = Mutex(Timespec(seconds: 1_800_000_000, nanoseconds: 0))
        func now() -> Timespec { t.withLock { $0 } }
        func advance(milliseconds: Int64) {
            t.withLock { v in
                let n = v.nanoseconds + milliseconds * 1_000_000
                v = Timespec(seconds: v.seconds + n / 1_000_000_000, nanoseconds: n % 1_000_000_000)
            }
        }
    }

    final class Fixture: @unchecked Sendable {
        let dir = NSTemporaryDirectory() + "coffer-folder-times-" + UUID().uuidString
        let clock = Clock()
        let vault: Vault
        init() throws {
            let clock = self.clock
            vault = try Vault.create(dataDirectory: dir, username: "alice", now: { clock.now() })
        }
        deinit { try? FileManager.default.removeItem(atPath: dir) }
        /// The folder's mtime as its stored record has it (what another process would see).
        func storedMtime(_ id: FileID) throws -> Timespec {
            try Vault.open(dataDirectory: dir).node(id).attributes.mtime.value
        }
        /// Runs SQL on the store with the sqlite3 tool (the store exposes no raw writes).
        func sqlite(_ sql: String) throws {
            let p = Process()
            p.executableURL = URL(fileURLWithPath: "/usr/bin/sqlite3")
            p.arguments = [dir + "/coffer.sqlite", sql]
            try p.run()
            p.waitUntilExit()
            guard p.terminationStatus == 0 else { throw VaultError.io("sqlite3 failed on \(sql)") }
        }
        func doc(_ name: String, in parent: FileID) throws -> Node {
            try vault.create(in: parent, name: name, type: .document, mode: 0o644)
        }
    }

    @Test func bumpsShowAtOnceAndReachTheRecordOnceDue() throws {
        let f = try Fixture()
        let v = f.vault
        let folder = try v.create(in: v.rootID, name: "f", type: .folder, mode: 0o755)
        let original = folder.attributes.mtime.value
        v.coalesceFolderTimes(true)

        f.clock.advance(milliseconds: 1000)
        _ = try f.doc("a", in: folder.id)
        let first = f.clock.now()
        #expect(try v.node(folder.id).attributes.mtime.value == first, "stat sees the bump at once")
        #expect(try f.storedMtime(folder.id) == original, "the record waits")

        f.clock.advance(milliseconds: 10)
        _ = try f.doc("b", in: folder.id)
        let second = f.clock.now()
        #expect(try f.storedMtime(folder.id) == original, "10 ms later: not due yet")

        // 60 ms after the first bump, any commit writes what is pending.
        f.clock.advance(milliseconds: 60)
        _ = try f.doc("c", in: v.rootID)
        #expect(try f.storedMtime(folder.id) == second)
        #expect(try v.node(folder.id).attributes.mtime.value == second)

        // A refused operation bumps nothing, in memory or later in the record.
        f.clock.advance(milliseconds: 5)
        expectErrno(EEXIST) { _ = try f.doc("a", in: folder.id) }
        #expect(try v.node(folder.id).attributes.mtime.value == second)
        // A batch that fails after the bump (here the store refuses the record) drops it too.
        try f.sqlite(
            "CREATE TRIGGER refuse BEFORE INSERT ON local_files BEGIN SELECT RAISE(ABORT, 'refused by the test'); END;")
        f.clock.advance(milliseconds: 100)
        #expect(throws: (any Error).self) { _ = try f.doc("refused", in: folder.id) }
        #expect(try v.node(folder.id).attributes.mtime.value == second)
        try f.sqlite("DROP TRIGGER refuse;")
        try v.flushFolderTimes()
        #expect(try f.storedMtime(folder.id) == second)
        #expect(try v.check().isClean)
    }

    @Test func explicitTimesDeletionsAndFlushSettleWhatIsPending() throws {
        let f = try Fixture()
        let v = f.vault
        v.coalesceFolderTimes(true)
        let a = try v.create(in: v.rootID, name: "a", type: .folder, mode: 0o755)
        let b = try v.create(in: v.rootID, name: "b", type: .folder, mode: 0o755)
        f.clock.advance(milliseconds: 1000)
        _ = try f.doc("x", in: a.id)
        _ = try f.doc("y", in: b.id)
        let bumped = f.clock.now()
        // touch -d on a folder with a pending bump: the explicit time wins and is written now.
        let explicit = Timespec(seconds: 1_700_000_000, nanoseconds: 0)
        try v.setAttributes(a.id, AttributeChanges(mtime: explicit))
        #expect(try f.storedMtime(a.id) == explicit)
        // A folder deleted with a bump pending: nothing to write, and no error.
        let c = try v.create(in: v.rootID, name: "c", type: .folder, mode: 0o755)
        let inC = try f.doc("z", in: c.id)
        try v.remove(inC.id)
        try v.remove(c.id, expectFolder: true)
        try v.flushFolderTimes()
        #expect(try f.storedMtime(a.id) == explicit, "the explicit time is not overwritten by the older bump")
        #expect(try f.storedMtime(b.id) == bumped)
        #expect(try f.storedMtime(v.rootID) == f.clock.now(), "the root's last bump (removing c)")
        // Turning coalescing off writes anything still pending first.
        f.clock.advance(milliseconds: 1)
        _ = try f.doc("w", in: b.id)
        v.coalesceFolderTimes(false)
        #expect(try f.storedMtime(b.id) == f.clock.now())
        #expect(try v.check().isClean)
    }
}
