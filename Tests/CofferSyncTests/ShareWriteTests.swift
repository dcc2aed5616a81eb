import CofferCrypto
import CofferModel
import CofferProtocol
import CofferSync
import CofferTestSupport
import Foundation
import Testing

@testable import CofferVault

/// A write grantee's own changes in a share, from the command line through a real server
/// (docs/SHARING.md, "Writing in a share"): made offline in the mirror's local layer, pushed
/// into the owner's tree, merged with the owner's changes, and never dropped when access goes.
@Suite(.serialized) struct ShareWriteTests {
    /// Alice shares `projects` (notes.txt, old.txt) with bob at `mode`; bob accepts it at
    /// `/shared`. Both synced.
    static func world(_ label: String, write: Bool = true) throws -> AliceAndBob {
        let w = try AliceAndBob(label)
        for args in [["mkdir", "projects"], ["mkdir", "mine"]] { _ = coffer(w.alice, args) }
        _ = coffer(w.alice, ["write", "projects/notes.txt"], stdin: Array("plan".utf8))
        _ = coffer(w.alice, ["write", "projects/old.txt"], stdin: Array("old".utf8))
        let added = coffer(w.alice, ["share", "add", "projects", "bob"] + (write ? ["--write"] : []))
        guard added.status == 0 else { throw TestFailure("share add: \(added.err)") }
        for dir in [w.alice, w.bob] where coffer(dir, ["sync"]).status != 0 { throw TestFailure("sync") }
        let pending = coffer(w.bob, ["share", "pending"]).out
        guard let id = pending.split(separator: "\t").first.map(String.init) else { throw TestFailure("no share") }
        let accepted = coffer(w.bob, ["share", "accept", id, "/", "--name", "shared"])
        guard accepted.status == 0 else { throw TestFailure("accept: \(accepted.err)") }
        return w
    }

    func expectOneLineError(
        _ r: ProcessResult, containing text: String, sourceLocation: SourceLocation = #_sourceLocation
    ) {
        #expect(r.status == 1, sourceLocation: sourceLocation)
        #expect(r.err.hasPrefix("coffer: ") && r.err.split(separator: "\n").count == 1, sourceLocation: sourceLocation)
        #expect(r.err.contains(text), "\(r.err)", sourceLocation: sourceLocation)
    }

    @Test func aWriteGranteeEditsCreatesMovesAndDeletesInTheOwnersTree() async throws {
        let w = try Self.world("coffer-share-write")
        let (alice, bob) = (w.alice, w.bob)
        // Offline: nothing reaches the server until bob syncs.
        #expect(coffer(bob, ["write", "shared/notes.txt"], stdin: Array("plan v2".utf8)).status == 0)
        #expect(coffer(bob, ["mkdir", "shared/docs"]).status == 0)
        #expect(coffer(bob, ["write", "shared/docs/a.txt"], stdin: Array("alpha".utf8)).status == 0)
        #expect(coffer(bob, ["mv", "shared/old.txt", "shared/docs/older.txt"]).status == 0)
        #expect(coffer(bob, ["write", "shared/tmp.txt"], stdin: Array("tmp".utf8)).status == 0)
        #expect(coffer(bob, ["rm", "shared/tmp.txt"]).status == 0)
        #expect(coffer(bob, ["ls", "shared"]).out == "docs/\nnotes.txt\n")
        #expect(coffer(bob, ["cat", "shared/docs/older.txt"]).out == "old")
        // notes.txt, the share's folder (its times), docs/, a.txt, old.txt; tmp.txt never left.
        #expect(coffer(bob, ["status"]).out.contains("shared:   5 changes in shares"))
        #expect(coffer(alice, ["sync"]).status == 0)
        #expect(coffer(alice, ["cat", "projects/notes.txt"]).out == "plan")

        // Moves across owners are refused: files keep their owner (the mount answers EXDEV).
        expectOneLineError(coffer(bob, ["mv", "shared/notes.txt", "/mine.txt"]), containing: "copy instead")
        #expect(coffer(bob, ["write", "own.txt"], stdin: Array("own".utf8)).status == 0)
        expectOneLineError(coffer(bob, ["mv", "own.txt", "shared/own.txt"]), containing: "copy instead")

        let synced = coffer(bob, ["sync"])
        #expect(synced.status == 0, "\(synced.err)")
        #expect(!coffer(bob, ["status"]).out.contains("shared:"))
        #expect(coffer(alice, ["sync"]).status == 0)
        #expect(coffer(alice, ["cat", "projects/notes.txt"]).out == "plan v2")
        #expect(coffer(alice, ["cat", "projects/docs/a.txt"]).out == "alpha")
        #expect(coffer(alice, ["cat", "projects/docs/older.txt"]).out == "old")
        #expect(coffer(alice, ["ls", "projects"]).out == "docs/\nnotes.txt\n")
        #expect(coffer(alice, ["fsck"]).status == 0)
        // The owner holds and pays for what bob made: alice's device adopted it as her own.
        #expect(coffer(alice, ["sync"]).status == 0)
        #expect(coffer(bob, ["sync"]).status == 0)
        #expect(coffer(bob, ["cat", "shared/docs/a.txt"]).out == "alpha")
        #expect(w.server.audit().status == 0)
    }

    @Test func aReadOnlyShareRefusesEveryChangeWithOneLine() async throws {
        let w = try Self.world("coffer-share-write-ro", write: false)
        let bob = w.bob
        expectOneLineError(
            coffer(bob, ["write", "shared/notes.txt"], stdin: Array("x".utf8)), containing: "write access")
        expectOneLineError(
            coffer(bob, ["write", "shared/new.txt"], stdin: Array("x".utf8)), containing: "write access")
        expectOneLineError(coffer(bob, ["mkdir", "shared/d"]), containing: "write access")
        expectOneLineError(coffer(bob, ["rm", "shared/notes.txt"]), containing: "write access")
        expectOneLineError(coffer(bob, ["mv", "shared/notes.txt", "shared/n.txt"]), containing: "write access")
        #expect(coffer(bob, ["ls", "shared"]).out == "notes.txt\nold.txt\n")
        #expect(!coffer(bob, ["status"]).out.contains("shared:"))
    }

    /// Both edit one document while apart: the owner's version stays, the grantee's is saved
    /// beside it; a rename by one and an edit by the other both stand.
    @Test func concurrentEditsInAShareMergeAndKeepBothVersions() async throws {
        let w = try Self.world("coffer-share-write-merge")
        let (alice, bob) = (w.alice, w.bob)
        #expect(coffer(alice, ["write", "projects/notes.txt"], stdin: Array("alice's".utf8)).status == 0)
        #expect(coffer(alice, ["write", "projects/old.txt"], stdin: Array("old, edited".utf8)).status == 0)
        #expect(coffer(alice, ["sync"]).status == 0)
        #expect(coffer(bob, ["write", "shared/notes.txt"], stdin: Array("bob's".utf8)).status == 0)
        #expect(coffer(bob, ["mv", "shared/old.txt", "shared/renamed.txt"]).status == 0)
        let synced = coffer(bob, ["sync"])
        #expect(synced.status == 0, "\(synced.err)")
        #expect(coffer(alice, ["sync"]).status == 0)
        #expect(coffer(alice, ["ls", "projects"]).out == "notes (conflict from bob).txt\nnotes.txt\nrenamed.txt\n")
        #expect(coffer(alice, ["cat", "projects/notes.txt"]).out == "alice's")
        #expect(coffer(alice, ["cat", "projects/notes (conflict from bob).txt"]).out == "bob's")
        #expect(coffer(alice, ["cat", "projects/renamed.txt"]).out == "old, edited")
        #expect(coffer(bob, ["sync"]).status == 0)
        #expect(coffer(bob, ["ls", "shared"]).out == "notes (conflict from bob).txt\nnotes.txt\nrenamed.txt\n")
        #expect(coffer(alice, ["fsck"]).status == 0 && coffer(bob, ["fsck"]).status == 0)
        #expect(w.server.audit().status == 0)
    }

    /// Alice revokes bob while bob holds unsynced work in the share: nothing of it is lost, it
    /// is saved in bob's own tree, and `coffer status` says where.
    @Test func aRevocationSavesTheGranteesUnsyncedWorkInItsOwnTree() async throws {
        let w = try Self.world("coffer-share-write-revoke")
        let (alice, bob) = (w.alice, w.bob)
        #expect(coffer(bob, ["write", "shared/notes.txt"], stdin: Array("bob's unsynced".utf8)).status == 0)
        #expect(coffer(bob, ["mkdir", "shared/drafts"]).status == 0)
        #expect(coffer(bob, ["write", "shared/drafts/new.txt"], stdin: Array("new".utf8)).status == 0)
        #expect(coffer(alice, ["share", "remove", "projects", "bob"]).status == 0)
        #expect(coffer(alice, ["sync"]).status == 0)
        let synced = coffer(bob, ["sync"])
        #expect(synced.status == 0, "\(synced.err)")
        #expect(coffer(bob, ["cat", "Recovered from projects/notes.txt"]).out == "bob's unsynced")
        #expect(coffer(bob, ["cat", "Recovered from projects/drafts/new.txt"]).out == "new")
        let status = coffer(bob, ["status"]).out
        #expect(status.contains("recovered: /Recovered from projects/notes.txt"), "\(status)")
        #expect(!status.contains("shared:"))
        // None of it reached alice's tree.
        #expect(coffer(alice, ["sync"]).status == 0)
        #expect(coffer(alice, ["cat", "projects/notes.txt"]).out == "plan")
        #expect(coffer(alice, ["ls", "projects"]).out == "notes.txt\nold.txt\n")
        #expect(coffer(bob, ["fsck"]).status == 0)
    }

    /// Alice's `folder`, made by `make` in her data folder, shared with bob at write and with
    /// carol at read; all three synced, and bob's link to it placed at `/link`.
    static func sharedWithBobAndCarol(
        _ label: String, folder: String, link: String, make: (String) -> Void
    ) throws -> AliceAndBob {
        let w = try AliceAndBob(label, others: ["carol"])
        make(w.alice)
        #expect(coffer(w.alice, ["share", "add", folder, "bob", "--write"]).status == 0)
        #expect(coffer(w.alice, ["share", "add", folder, "carol"]).status == 0)
        for dir in [w.alice, w.bob, w.others["carol"] ?? ""] { #expect(coffer(dir, ["sync"]).status == 0) }
        let id = coffer(w.bob, ["share", "pending"]).out.split(separator: "\t").first.map(String.init) ?? ""
        #expect(coffer(w.bob, ["share", "accept", id, "/", "--name", link]).status == 0)
        return w
    }

    /// Bob changes the top of the share (a new file there bumps the shared folder's times) while
    /// alice removes carol, which gives the folder a new key: bob's change is made again under
    /// it, and both see everything.
    @Test func aGranteesChangeAtTheTopOfTheShareOutlivesTheOwnersRotation() async throws {
        let w = try Self.sharedWithBobAndCarol("coffer-share-write-top", folder: "projects", link: "shared") {
            _ = coffer($0, ["mkdir", "projects"])
            _ = coffer($0, ["write", "projects/notes.txt"], stdin: Array("plan".utf8))
        }
        let (alice, bob) = (w.alice, w.bob)
        #expect(coffer(bob, ["write", "shared/top.txt"], stdin: Array("bob's".utf8)).status == 0)
        #expect(coffer(alice, ["share", "remove", "projects", "carol"]).status == 0)
        #expect(coffer(alice, ["sync"]).status == 0)
        let synced = coffer(bob, ["sync"])
        #expect(synced.status == 0, "\(synced.err)")
        #expect(coffer(alice, ["sync"]).status == 0)
        #expect(coffer(alice, ["cat", "projects/top.txt"]).out == "bob's")
        #expect(coffer(bob, ["sync"]).status == 0)
        #expect(coffer(bob, ["cat", "shared/notes.txt"]).out == "plan")
        #expect(coffer(bob, ["ls", "shared"]).out == "notes.txt\ntop.txt\n")
        #expect(coffer(alice, ["fsck"]).status == 0 && coffer(bob, ["fsck"]).status == 0)
    }

    /// Alice's device rotates the share's keys (removing carol) while bob, who has not heard of
    /// it, writes a new document below: alice's next sync fetches bob's content under the key
    /// bob wrote it with, seals it again under the new one, and loses nothing.
    @Test func anOwnerRotatingWhileAGranteeWritesBelowKeepsTheGranteesContent() async throws {
        let w = try Self.sharedWithBobAndCarol("coffer-share-write-rotate", folder: "g", link: "g") {
            _ = coffer($0, ["mkdir", "-p", "g/p"])
            _ = coffer($0, ["write", "g/p/x.txt"], stdin: Array("x".utf8))
        }
        let (alice, bob) = (w.alice, w.bob)
        #expect(coffer(alice, ["share", "remove", "g", "carol"]).status == 0)  // not synced yet
        #expect(coffer(bob, ["write", "g/p/new.txt"], stdin: Array("from bob".utf8)).status == 0)
        #expect(coffer(bob, ["sync"]).status == 0)
        let synced = coffer(alice, ["sync"])
        #expect(synced.status == 0, "\(synced.err)")
        #expect(coffer(alice, ["cat", "g/p/new.txt"]).out == "from bob")
        #expect(coffer(bob, ["sync"]).status == 0)
        #expect(coffer(bob, ["cat", "g/p/new.txt"]).out == "from bob")
        #expect(coffer(alice, ["fsck"]).status == 0 && coffer(bob, ["fsck"]).status == 0)
        #expect(w.server.audit().status == 0)
    }

    /// Bob's laptop gives the share up; alice deletes a file, moves another out of the folder
    /// and shares the folder again, all while bob's desktop is away. A give-up changes no file
    /// below the folder, so nothing but the share's second coming can tell the desktop: its
    /// feed row says the folder was granted again (`regranted`), and the desktop drops what it
    /// held below before taking the live subtree sent with it. (Before, the deleted files were
    /// sent again, and a file moved out stayed on the desktop.)
    @Test func aShareGrantedAgainTellsADeviceThatWasAwayOfFilesDeletedOrMovedMeanwhile() async throws {
        let w = try Self.world("coffer-share-write-again", write: false)
        let (alice, bob) = (w.alice, w.bob)
        let desktop = w.tmp.sub("bob-desktop")
        let export = coffer(bob, ["account", "export"]).out
        #expect(
            coffer(desktop, ["account", "import", "--server", w.server.url], stdin: Array(export.utf8)).status == 0)
        #expect(coffer(alice, ["write", "projects/away.txt"], stdin: Array("away".utf8)).status == 0)
        #expect(coffer(alice, ["mkdir", "private"]).status == 0)
        #expect(coffer(alice, ["sync"]).status == 0)
        #expect(coffer(bob, ["sync"]).status == 0)
        #expect(coffer(desktop, ["sync"]).status == 0)
        #expect(coffer(desktop, ["ls", "shared"]).out == "away.txt\nnotes.txt\nold.txt\n")
        let ids = try Vault.open(dataDirectory: bob).incomingShares().map(\.id)
        #expect(ids.count == 1)
        #expect(coffer(bob, ["share", "reject", ids.first?.description ?? ""]).status == 0)
        #expect(coffer(alice, ["sync"]).status == 0)
        #expect(coffer(alice, ["rm", "projects/old.txt"]).status == 0)
        #expect(coffer(alice, ["mv", "projects/away.txt", "private/away.txt"]).status == 0)
        #expect(coffer(alice, ["sync"]).status == 0)
        #expect(coffer(alice, ["share", "add", "projects", "bob"]).status == 0)
        #expect(coffer(alice, ["sync"]).status == 0)
        let synced = coffer(desktop, ["sync"])
        #expect(synced.status == 0, "\(synced.err)")
        #expect(coffer(desktop, ["ls", "shared"]).out == "notes.txt\n")
        #expect(coffer(desktop, ["cat", "shared/notes.txt"]).out == "plan")
    }

    /// A folder made in a share and removed with what was made in it, before any push, leaves
    /// nothing behind that could block the next sync.
    @Test func aFolderMadeAndRemovedInAShareLeavesNothingBehind() async throws {
        let w = try Self.world("coffer-share-write-rmr")
        let bob = w.bob
        #expect(coffer(bob, ["mkdir", "-p", "shared/n/m"]).status == 0)
        #expect(coffer(bob, ["write", "shared/n/m/a.txt"], stdin: Array("a".utf8)).status == 0)
        #expect(coffer(bob, ["rm", "-r", "shared/n"]).status == 0)
        let synced = coffer(bob, ["sync"])
        #expect(synced.status == 0, "\(synced.err)")
        #expect(!coffer(bob, ["status"]).out.contains("shared:"))
        #expect(coffer(w.alice, ["sync"]).status == 0)
        #expect(coffer(w.alice, ["ls", "projects"]).out == "notes.txt\nold.txt\n")
    }

    /// Alice turns bob's write share into a read share while bob holds unsynced work two levels
    /// down: the next sync saves it in bob's own tree rather than failing for ever.
    @Test func writeTakenAwayAboveUnsyncedWorkSavesIt() async throws {
        let w = try Self.world("coffer-share-write-downgrade")
        let (alice, bob) = (w.alice, w.bob)
        #expect(coffer(alice, ["mkdir", "-p", "projects/a/b"]).status == 0)
        #expect(coffer(alice, ["sync"]).status == 0)
        #expect(coffer(bob, ["sync"]).status == 0)
        #expect(coffer(bob, ["write", "shared/a/b/deep.txt"], stdin: Array("deep".utf8)).status == 0)
        #expect(coffer(alice, ["share", "add", "projects", "bob"]).status == 0)  // read now
        #expect(coffer(alice, ["sync"]).status == 0)
        let synced = coffer(bob, ["sync"])
        #expect(synced.status == 0, "\(synced.err)")
        #expect(coffer(bob, ["cat", "Recovered from projects/a/b/deep.txt"]).out == "deep")
        #expect(!coffer(bob, ["status"]).out.contains("shared:"))
        #expect(coffer(bob, ["sync"]).status == 0)
        #expect(coffer(alice, ["sync"]).status == 0)
        #expect(coffer(alice, ["ls", "projects/a/b"]).out.isEmpty)
    }

    /// A new grantee is sent a shared folder's live files only, never what was deleted in it
    /// before it was invited.
    @Test func aNewGranteeIsNotSentWhatWasDeletedBeforeItsInvitation() async throws {
        let w = try AliceAndBob("coffer-share-write-newcomer")
        let (alice, bob) = (w.alice, w.bob)
        _ = coffer(alice, ["mkdir", "projects"])
        _ = coffer(alice, ["write", "projects/kept.txt"], stdin: Array("k".utf8))
        _ = coffer(alice, ["write", "projects/secret-draft.txt"], stdin: Array("s".utf8))
        let draft = try Vault.open(dataDirectory: alice).resolve("projects/secret-draft.txt").id
        #expect(coffer(alice, ["sync"]).status == 0)
        #expect(coffer(alice, ["rm", "projects/secret-draft.txt"]).status == 0)
        #expect(coffer(alice, ["sync"]).status == 0)
        #expect(coffer(alice, ["share", "add", "projects", "bob"]).status == 0)
        #expect(coffer(alice, ["sync"]).status == 0)
        let engine = try SyncEngine.forStore(try Vault.open(dataDirectory: bob))
        let page = try await engine.client.updates(since: 0, feedOnly: true)
        let ids = try page.files.map { try SignedMetadata(decoding: Array($0.record)).metadata.id }
        #expect(ids.count == 2)
        #expect(!ids.contains(draft))
    }

    /// The mount daemon's vault writes in a share after the command line rewrote one of the
    /// account's own files: the write takes the other process's commit in first, so the next
    /// open reads the command line's version (before, it read the one before).
    @Test func aShareWriteTakesInWhatAnotherProcessCommittedFirst() async throws {
        let w = try Self.world("coffer-share-write-catchup")
        #expect(coffer(w.bob, ["write", "mine.txt"], stdin: Array("v1".utf8)).status == 0)
        let daemon = try Vault.open(dataDirectory: w.bob)
        let mine = try daemon.resolve("mine.txt").id
        #expect(try daemon.readAll(mine) == Array("v1".utf8))
        #expect(coffer(w.bob, ["write", "mine.txt"], stdin: Array("v2".utf8)).status == 0)
        _ = try daemon.setAttributes(
            try daemon.resolveAcrossShares("shared/notes.txt").id, AttributeChanges(mode: 0o600))
        #expect(try daemon.readAll(mine) == Array("v2".utf8))
    }

    @Test func namesMadeUpForCopiesFitAFileName() {
        let long = String(repeating: "é", count: 127)  // 254 bytes
        let copy = Vault.conflictName(long + ".txt", by: "bob")
        #expect(copy.utf8.count <= 255 && copy.hasSuffix(" (conflict from bob).txt"))
        #expect(Vault.conflictName("notes.txt", by: "bob") == "notes (conflict from bob).txt")
        #expect(Vault.fitted(long, suffix: " (2)").utf8.count <= 255)
        #expect(Vault.fitted("short", suffix: " (2)") == "short (2)")
    }

    /// Alice rewrites a document; bob, not having heard of it, sets its mtime later: bob's mtime
    /// wins the merge, but the size stays the content's (alice's), so nobody's fsck finds a
    /// document whose size says something else. Found by `ShareWriteTrials`.
    @Test func aGranteesTouchAgainstAnOwnersRewriteKeepsTheContentsSize() async throws {
        let w = try Self.world("coffer-share-write-touch")
        let (alice, bob) = (w.alice, w.bob)
        #expect(coffer(alice, ["write", "projects/notes.txt"], stdin: Array("a longer plan".utf8)).status == 0)
        #expect(coffer(alice, ["sync"]).status == 0)
        // Bob's clock runs a minute ahead, so his change is the later one whatever the leases.
        let ahead: @Sendable () -> Timespec = {
            let t = Vault.systemNow()
            return Timespec(seconds: t.seconds + 60, nanoseconds: t.nanoseconds)
        }
        let vault = try Vault.open(dataDirectory: bob, now: ahead)
        let notes = try vault.resolveAcrossShares("shared/notes.txt").id
        let later = Timespec(seconds: Int64(Date().timeIntervalSince1970) + 60)
        _ = try vault.setAttributes(notes, AttributeChanges(mtime: later))
        let synced = coffer(bob, ["sync"])
        #expect(synced.status == 0, "\(synced.err)")
        #expect(coffer(alice, ["sync"]).status == 0)
        #expect(coffer(alice, ["cat", "projects/notes.txt"]).out == "a longer plan")
        let fsck = coffer(alice, ["fsck"])
        #expect(fsck.status == 0, "\(fsck.out)")
        #expect(coffer(bob, ["sync"]).status == 0)
        #expect(coffer(bob, ["fsck"]).status == 0)
        _ = try vault.refresh()
        let merged = try vault.resolveAcrossShares("shared/notes.txt").attributes
        #expect(merged.size == 13 && merged.mtime.value == later)
    }

    /// A document of a write share open in the mount when its share goes: what it flushes then
    /// is saved in the account's own tree. One deleted while open (here, or by the owner) is
    /// dropped, as for the account's own files, and saves nothing.
    @Test func anOpenSharedDocumentKeepsWhatItWritesWhenAccessGoesButNotWhenDeleted() async throws {
        let w = try Self.world("coffer-share-write-open")
        let (alice, bob) = (w.alice, w.bob)
        let vault = try Vault.open(dataDirectory: bob)
        // Deleted while open: nothing saved.
        let old = try vault.resolveAcrossShares("shared/old.txt").id
        let gone = try vault.openDocument(old)
        try gone.write(offset: 0, bytes: Array("scratch".utf8))
        try vault.remove(old)
        try vault.release(gone)
        #expect(vault.recoveryWaiting == 0)
        #expect(try vault.lookup(vault.rootID, "Recovered from projects") == nil)
        // Access gone while open: what it flushes is saved.
        let notes = try vault.resolveAcrossShares("shared/notes.txt").id
        let open = try vault.openDocument(notes)
        try open.write(offset: 0, bytes: Array("written while open".utf8))
        #expect(coffer(alice, ["share", "remove", "projects", "bob"]).status == 0)
        #expect(coffer(alice, ["sync"]).status == 0)
        try await SyncEngine.forStore(vault).sync()
        try vault.release(open)
        #expect(vault.recoveryWaiting == 0)
        let saved = try vault.resolve("Recovered from projects/notes.txt")
        #expect(try vault.readAll(saved.id) == Array("written while open".utf8))
        #expect(coffer(bob, ["fsck"]).status == 0)
    }
}
