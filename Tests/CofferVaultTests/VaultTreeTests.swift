import CofferCrypto
import CofferModel
import CofferStore
import Foundation
import Testing

@testable import CofferVault

@Suite("Vault tree operations")
struct VaultTreeTests {
    @Test func freshVaultHasAnEmptyRoot() throws {
        let f = try VaultFixture()
        let root = try f.vault.resolve("/")
        #expect(root.isRoot)
        #expect(root.type == .folder)
        #expect(root.id == f.root)
        #expect(try f.vault.resolve("").id == f.root)
        #expect(try f.vault.children(of: f.root).isEmpty)
        #expect(f.vault.username == "alice")
        #expect(f.vault.path(of: f.root) == "/")
        #expect(f.vault.accountID.bytes == f.vault.exportedSecret.signingKeys.publicKey.bytes)
    }

    @Test func createLookupResolveChildren() throws {
        let f = try VaultFixture()
        let docs = try f.folder("docs")
        let note = try f.document("note.txt", in: docs.id)
        let link = try f.vault.create(in: docs.id, name: "link", type: .symlink, mode: 0o777, symlinkTarget: "note.txt")
        try f.document("b", in: docs.id)
        try f.document("A", in: docs.id)

        #expect(try f.vault.lookup(f.root, "docs")?.id == docs.id)
        #expect(try f.vault.lookup(f.root, "nope") == nil)
        #expect(try f.vault.lookup(docs.id, "note.txt")?.id == note.id)
        #expect(try f.vault.resolve("/docs/note.txt").id == note.id)
        #expect(try f.vault.resolve("docs//note.txt/").id == note.id)
        #expect(try f.vault.resolve("/./docs/./note.txt").id == note.id)
        #expect(try f.names(docs.id) == ["A", "b", "link", "note.txt"], "sorted by bytes")
        #expect(f.vault.path(of: note.id) == "/docs/note.txt")

        let n = try f.vault.node(note.id)
        #expect(n.type == .document && n.name == "note.txt" && n.parent == docs.id)
        #expect(n.attributes.mode.value == 0o644)
        #expect(n.mode == 0o100644)
        #expect(n.size == 0)
        #expect(n.attributes.uid == Stamped(getuid(), at: n.attributes.uid.stamp))
        #expect(try f.vault.node(docs.id).mode == 0o040755)
        let l = try f.vault.node(link.id)
        #expect(l.type == .symlink && l.attributes.symlinkTarget == "note.txt" && l.size == 8)
        #expect(l.mode & 0o170000 == 0o120000)
    }

    @Test func creationErrors() throws {
        let f = try VaultFixture()
        let docs = try f.folder("docs")
        let note = try f.document("note", in: docs.id)
        var e = expectErrno(17) { try f.folder("docs") }
        #expect(treeError(e) == .pathConflict("/docs"))
        expectErrno(17) { try f.document("docs") }
        expectErrno(17) { try f.document("note", in: docs.id) }
        e = expectErrno(20) { try f.document("x", in: note.id) }  // parent is a document
        expectErrno(2) { try f.document("x", in: try FileID(random: randomBytes(16))) }
        expectErrno(22) { try f.document("") }
        expectErrno(22) { try f.document("a/b") }
        expectErrno(22) { try f.document(".") }
        expectErrno(22) { try f.document("..") }
        expectErrno(22) { try f.document("nul\0") }
        expectErrno(36) { try f.document(String(repeating: "n", count: 256)) }
        try f.document(String(repeating: "n", count: 255))
        expectErrno(22) { try f.vault.create(in: f.root, name: "s", type: .symlink, mode: 0o777, symlinkTarget: "") }
        expectErrno(22) { try f.vault.create(in: f.root, name: "l", type: .link, mode: 0o644) }
        // Lookups through a document.
        expectErrno(20) { _ = try f.vault.lookup(note.id, "x") }
        expectErrno(20) { _ = try f.vault.resolve("/docs/note/x") }
        expectErrno(2) { _ = try f.vault.resolve("/docs/missing") }
        expectErrno(20) { _ = try f.vault.children(of: note.id) }
        // Nothing half-created.
        #expect(try f.names() == ["docs", String(repeating: "n", count: 255)])
    }

    @Test func namesAreCaseAndUnicodeExact() throws {
        let f = try VaultFixture()
        try f.document("Readme")
        try f.document("readme")
        try f.document("café")  // precomposed
        try f.document("cafe\u{301}")  // decomposed: another byte sequence, another name
        try f.document("read")
        try f.document("Z")
        // Listed in the byte order of the names' UTF-8: a prefix first, upper case before
        // lower, "e" + U+0301 before "é" (0x65 < 0xc3).
        #expect(
            try f.vault.children(of: f.root).map(\.name) == ["Readme", "Z", "cafe\u{301}", "café", "read", "readme"])
        #expect(try f.vault.lookup(f.root, "Readme") != nil)
        var rng = SystemRandomNumberGenerator()
        for _ in 0..<20 {
            let names = (0..<Int.random(in: 0...60, using: &rng)).map { _ in
                String(
                    decoding: (0..<Int.random(in: 0...4, using: &rng)).map { _ in UInt8.random(in: 0x20...0x7e) },
                    as: UTF8.self)
                    + (Bool.random(using: &rng) ? "é" : "")
            }
            let sorted = Vault.byteOrder(names).map { names[$0] }
            #expect(sorted == names.sorted { Array($0.utf8).lexicographicallyPrecedes(Array($1.utf8)) })
        }
    }

    @Test func makeFolders() throws {
        let f = try VaultFixture()
        let c = try f.vault.makeFolders("a/b/c")
        #expect(try f.vault.resolve("/a/b/c").id == c.id)
        #expect(try f.vault.makeFolders("/a/b/c/").id == c.id, "idempotent")
        let d = try f.vault.makeFolders("a/b/d")
        #expect(try f.names(try f.vault.resolve("a/b").id) == ["c", "d"])
        #expect(d.parent == c.parent)
        #expect(try f.vault.makeFolders("").id == f.root)
        try f.document("file", in: c.id)
        expectErrno(20) { try f.vault.makeFolders("a/b/c/file/deeper") }
    }

    @Test func renameAndMove() throws {
        let f = try VaultFixture()
        let a = try f.folder("a")
        let b = try f.folder("b")
        let doc = try f.document("doc", in: a.id, contents: Array("content".utf8))
        // Rename in place.
        #expect(try f.vault.rename(doc.id, to: a.id, name: "doc2") == nil)
        #expect(try f.names(a.id) == ["doc2"])
        #expect(try f.vault.node(doc.id).name == "doc2")
        // Move to another folder.
        try f.vault.rename(doc.id, to: b.id, name: "moved")
        #expect(try f.names(a.id) == [])
        #expect(try f.vault.resolve("/b/moved").id == doc.id)
        #expect(try f.vault.readAll(doc.id) == Array("content".utf8), "content follows the file")
        // Move a folder with contents; the subtree stays readable (key chain rewrapped).
        let sub = try f.folder("sub", in: b.id)
        let inner = try f.document("inner", in: sub.id, contents: [1, 2, 3])
        try f.vault.rename(b.id, to: a.id, name: "b-in-a")
        #expect(try f.vault.resolve("/a/b-in-a/sub/inner").id == inner.id)
        #expect(try f.vault.readAll(inner.id) == [1, 2, 3])
        #expect(f.vault.path(of: inner.id) == "/a/b-in-a/sub/inner")
        // Renaming onto itself is a no-op.
        #expect(try f.vault.rename(inner.id, to: sub.id, name: "inner") == nil)
        #expect(try f.names(sub.id) == ["inner"])
        try f.vault.rename(inner.id, to: f.root, name: "top")
        // Survives a reopen.
        let reopened = try Vault.open(dataDirectory: f.dataDir)
        #expect(try reopened.resolve("/top").id == inner.id)
        #expect(try reopened.readAll(inner.id) == [1, 2, 3])
        #expect(try reopened.readAll(try reopened.resolve("/a/b-in-a/moved").id) == Array("content".utf8))
    }

    @Test func renameReplaceAndNoReplace() throws {
        let f = try VaultFixture()
        let src = try f.document("src", contents: Array("new".utf8))
        let dst = try f.document("dst", contents: Array("old".utf8))
        // noReplace: EEXIST, nothing changes.
        let e = expectErrno(17) { try f.vault.rename(src.id, to: f.root, name: "dst", mode: .noReplace) }
        #expect(treeError(e) != nil)
        #expect(try f.names() == ["dst", "src"])
        // replace: atomic, the old target goes away.
        let replaced = try f.vault.rename(src.id, to: f.root, name: "dst", mode: .replace)
        #expect(replaced == dst.id)
        #expect(try f.names() == ["dst"])
        #expect(try f.vault.resolve("dst").id == src.id)
        #expect(try f.vault.readAll(src.id) == Array("new".utf8))
        #expect(!f.vault.isLive(dst.id))
        // The daemon's one-lock question (live, and which node): nil for the replaced file.
        #expect(try f.vault.liveNode(dst.id) == nil)
        #expect(try f.vault.liveNode(src.id)?.name == "dst")
        #expect(try f.vault.check().isClean)
    }

    @Test func replaceRules() throws {
        let f = try VaultFixture()
        let doc = try f.document("doc")
        let empty = try f.folder("empty")
        let full = try f.folder("full")
        try f.document("x", in: full.id)
        let dir = try f.folder("dir")
        expectErrno(21) { try f.vault.rename(doc.id, to: f.root, name: "empty") }  // file over folder: EISDIR
        expectErrno(20) { try f.vault.rename(dir.id, to: f.root, name: "doc") }  // folder over file: ENOTDIR
        expectErrno(39) { try f.vault.rename(dir.id, to: f.root, name: "full") }  // over a non-empty folder
        #expect(try f.vault.rename(dir.id, to: f.root, name: "empty") == empty.id)  // over an empty folder: fine
        #expect(try f.names() == ["doc", "empty", "full"])
        #expect(try f.vault.resolve("empty").id == dir.id)
    }

    @Test func moveErrors() throws {
        let f = try VaultFixture()
        let a = try f.folder("a")
        let c = try f.folder("c", in: a.id)
        let e = try f.folder("e", in: c.id)
        let doc = try f.document("doc")
        var err = expectErrno(22) { try f.vault.rename(a.id, to: a.id, name: "a") }  // into itself
        #expect(
            {
                if case .cycle? = treeError(err) { return true }
                return false
            }())
        err = expectErrno(22) { try f.vault.rename(a.id, to: c.id, name: "a") }  // into its subfolder
        #expect(
            {
                if case .cycle? = treeError(err) { return true }
                return false
            }())
        expectErrno(22) { try f.vault.rename(a.id, to: e.id, name: "a") }  // deeper
        expectErrno(20) { try f.vault.rename(a.id, to: doc.id, name: "a") }  // into a document
        expectErrno(16) { try f.vault.rename(f.root, to: a.id, name: "root") }  // the root
        expectErrno(22) { try f.vault.rename(doc.id, to: f.root, name: "bad/name") }
        expectErrno(2) { try f.vault.rename(try FileID(random: randomBytes(16)), to: f.root, name: "x") }
        #expect(try f.vault.resolve("/a/c/e").id == e.id, "nothing moved")
        #expect(try f.vault.check().isClean)
    }

    @Test func exchange() throws {
        let f = try VaultFixture()
        let a = try f.folder("a")
        let b = try f.folder("b")
        let x = try f.document("x", in: a.id, contents: Array("X".utf8))
        let y = try f.folder("y", in: b.id)
        try f.document("inside-y", in: y.id, contents: Array("Y".utf8))
        // Across folders, different types.
        try f.vault.exchange(x.id, y.id)
        #expect(try f.vault.resolve("/a/x").id == y.id)
        #expect(try f.vault.resolve("/b/y").id == x.id)
        #expect(try f.vault.readAll(try f.vault.resolve("/a/x/inside-y").id) == Array("Y".utf8))
        #expect(try f.vault.readAll(try f.vault.resolve("/b/y").id) == Array("X".utf8))
        // Same folder.
        let p = try f.document("p", contents: Array("P".utf8))
        let q = try f.document("q", contents: Array("Q".utf8))
        try f.vault.exchange(p.id, q.id)
        #expect(try f.vault.resolve("p").id == q.id)
        #expect(try f.vault.resolve("q").id == p.id)
        #expect(try f.vault.readAll(try f.vault.resolve("p").id) == Array("Q".utf8))
        // Persisted.
        let reopened = try Vault.open(dataDirectory: f.dataDir)
        #expect(try reopened.resolve("p").id == q.id)
        #expect(try reopened.resolve("/a/x/inside-y").id != f.root)
        #expect(try f.vault.check().isClean)
        // A folder cannot be exchanged with something inside it; the root cannot be exchanged.
        let inner = try f.vault.resolve("/a/x/inside-y")
        expectErrno(22) { try f.vault.exchange(y.id, inner.id) }
        expectErrno(16) { try f.vault.exchange(f.root, p.id) }
    }

    @Test func removeFilesAndFolders() throws {
        let f = try VaultFixture()
        let a = try f.folder("a")
        let doc = try f.document("doc", in: a.id, contents: [1])
        let sub = try f.folder("sub", in: a.id)
        let deep = try f.document("deep", in: sub.id, contents: [2])
        // Not empty: ENOTEMPTY, both as rmdir and as a plain remove.
        let e = expectErrno(39) { try f.vault.remove(a.id) }
        #expect(treeError(e) == .folderNotEmpty("/a"))
        expectErrno(39) { try f.vault.remove(a.id, expectFolder: true) }
        // rmdir on a file, unlink on a folder.
        expectErrno(20) { try f.vault.remove(doc.id, expectFolder: true) }
        expectErrno(21) { try f.vault.remove(sub.id, expectFolder: false) }
        expectErrno(16) { try f.vault.remove(f.root, recursive: true) }
        // Remove a document.
        try f.vault.remove(doc.id, expectFolder: false)
        #expect(try f.names(a.id) == ["sub"])
        #expect(!f.vault.isLive(doc.id))
        expectErrno(2) { try f.vault.remove(doc.id) }  // already gone
        // Recursive removal takes the subtree (and the inode number a file was given in place
        // of its hash).
        try f.vault.addInodeException(deep.id, 1 << 62)
        #expect(try f.vault.inodeNumbering().exceptions.map(\.id) == [deep.id])
        try f.vault.remove(a.id, recursive: true)
        #expect(try f.names() == [])
        #expect(!f.vault.isLive(sub.id) && !f.vault.isLive(deep.id))
        expectErrno(2) { _ = try f.vault.resolve("/a/sub/deep") }
        // The names are free again.
        try f.folder("a")
        // Local-only records are pruned outright, inodes forgotten.
        #expect(try f.vault.store.read { try $0.file(deep.id, .local) } == nil)
        #expect(try f.vault.inodeNumbering().exceptions.isEmpty, "its inode exception went with it")
        #expect(try f.vault.check().isClean)
        // An empty folder goes without `recursive`.
        let empty = try f.folder("empty")
        try f.vault.remove(empty.id, expectFolder: true)
        #expect(try f.names() == ["a"])
    }

    @Test func attributesAndXattrs() throws {
        let f = try VaultFixture()
        let doc = try f.document("doc")
        let before = try f.vault.node(doc.id)
        let n = try f.vault.setAttributes(
            doc.id,
            AttributeChanges(mode: 0o100600, uid: 1234, gid: 5678, mtime: Timespec(seconds: 1_000, nanoseconds: 7)))
        #expect(n.attributes.mode.value == 0o600)
        #expect(n.attributes.uid.value == 1234 && n.attributes.gid.value == 5678)
        #expect(n.attributes.mtime.value == Timespec(seconds: 1_000, nanoseconds: 7))
        #expect(n.attributes.mode.stamp > before.attributes.mode.stamp)
        try f.vault.setXattr(doc.id, name: "user.tag", value: [1, 2])
        #expect(try f.vault.xattrs(doc.id) == ["user.tag": [1, 2]])
        #expect(throws: XattrError.self) { try f.vault.setXattr(doc.id, name: "user.tag", value: [3], create: true) }
        #expect(throws: XattrError.self) { try f.vault.setXattr(doc.id, name: "user.none", value: [3], replace: true) }
        #expect(throws: XattrError.self) { try f.vault.setXattr(doc.id, name: "user.none", value: nil) }
        try f.vault.setXattr(doc.id, name: "user.tag", value: [3], replace: true)
        try f.vault.setXattr(doc.id, name: "user.tag", value: nil)
        #expect(try f.vault.xattrs(doc.id).isEmpty)
        let reopened = try Vault.open(dataDirectory: f.dataDir)
        #expect(try reopened.node(doc.id).attributes.mode.value == 0o600)
        #expect(try reopened.node(doc.id).attributes.uid.value == 1234)
    }

    @Test func atimeIsSetOnlyWhenAskedAndSurvivesContentWrites() throws {
        let f = try VaultFixture()
        let doc = try f.document("doc", contents: Array("x".utf8))
        let created = try f.vault.node(doc.id).attributes
        let t = Timespec(seconds: 2_147_483_648, nanoseconds: 100_000_000)
        let n = try f.vault.setAttributes(doc.id, AttributeChanges(atime: t))
        #expect(n.attributes.atime.value == t)
        #expect(n.attributes.atime.stamp > created.atime.stamp)
        #expect(n.attributes.mtime == created.mtime, "mtime untouched, stamp included")
        // Reads leave it alone; a content write moves mtime only.
        _ = try f.vault.readAll(doc.id)
        try f.vault.writeAll(doc.id, Array("yy".utf8))
        let after = try f.vault.node(doc.id).attributes
        #expect(after.atime.value == t && after.mtime.stamp > n.attributes.mtime.stamp)
        // Created with an explicit atime (import): kept beside the mtime.
        let imported = try f.vault.create(
            in: f.root, name: "imp", type: .symlink, mode: 0o777, symlinkTarget: "doc",
            mtime: Timespec(seconds: 1_000), atime: Timespec(seconds: 2_000, nanoseconds: 3))
        #expect(imported.attributes.atime.value == Timespec(seconds: 2_000, nanoseconds: 3))
        #expect(imported.attributes.mtime.value == Timespec(seconds: 1_000))
        let reopened = try Vault.open(dataDirectory: f.dataDir)
        #expect(try reopened.node(doc.id).attributes.atime.value == t)
        #expect(try reopened.node(imported.id).attributes.atime.value == Timespec(seconds: 2_000, nanoseconds: 3))
    }

    @Test func folderLinkCountIsTwoPlusLiveSubfolders() throws {
        let f = try VaultFixture()
        let a = try f.folder("a")
        let b = try f.folder("b")
        let c = try f.folder("c", in: a.id)
        try f.document("d", in: a.id)
        try f.vault.create(in: a.id, name: "l", type: .symlink, mode: 0o777, symlinkTarget: "d")
        #expect(a.linkCount == 2 && c.linkCount == 2, "a new folder")
        #expect(try f.vault.node(f.root).linkCount == 4)
        #expect(try f.vault.node(a.id).linkCount == 3, "documents and symlinks do not count")
        #expect(try f.vault.resolve("a/d").linkCount == 1)
        try f.vault.rename(c.id, to: b.id, name: "c")
        #expect(try f.vault.node(a.id).linkCount == 2 && f.vault.node(b.id).linkCount == 3)
        // Listings carry the same counts.
        #expect(try f.vault.children(of: f.root).map(\.linkCount) == [2, 3])
        try f.vault.remove(c.id, expectFolder: true)
        #expect(try f.vault.node(b.id).linkCount == 2)
        // A recursive delete takes the folder and what it held out of the count.
        try f.folder("x", in: b.id)
        try f.vault.remove(b.id, recursive: true)
        #expect(try f.vault.node(f.root).linkCount == 3)
        let reopened = try Vault.open(dataDirectory: f.dataDir)
        #expect(try reopened.node(f.root).linkCount == 3 && reopened.node(a.id).linkCount == 2)
    }

    @Test func foldersTimesChangeWhenEntriesChange() throws {
        let clock = ManualClock(start: 1_000)
        let dir = NSTemporaryDirectory() + "coffer-vault-clock-" + UUID().uuidString
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let v = try Vault.create(dataDirectory: dir, username: "bob", now: { clock.now() })
        let a = try v.create(in: v.rootID, name: "a", type: .folder, mode: 0o755)
        #expect(try v.node(v.rootID).attributes.mtime.value == Timespec(seconds: 1_000))
        clock.set(2_000)
        try v.create(in: a.id, name: "x", type: .document, mode: 0o644)
        #expect(try v.node(a.id).attributes.mtime.value == Timespec(seconds: 2_000))
        #expect(try v.node(v.rootID).attributes.mtime.value == Timespec(seconds: 1_000))
        clock.set(3_000)
        try v.remove(try v.resolve("a/x").id)
        #expect(try v.node(a.id).attributes.mtime.value == Timespec(seconds: 3_000))
    }

    @Test func accountsAndUsernames() throws {
        let f = try VaultFixture()
        #expect(throws: VaultError.self) { try Vault.create(dataDirectory: f.dataDir, username: "again") }
        let empty = f.dir + "/empty"
        #expect(throws: VaultError.self) { try Vault.open(dataDirectory: empty) }
        do { _ = try Vault.open(dataDirectory: empty) } catch let e as VaultError {
            if case .noAccount = e {} else { Issue.record("expected noAccount, got \(e)") }
        }
        for bad in ["", "   ", "has space", "slash/", String(repeating: "u", count: 65), "tab\tname", "esc\u{1b}[2J"] {
            expectErrno(22, "\(bad)") {
                _ = try Vault.create(dataDirectory: f.dir + "/u-\(UUID().uuidString)", username: bad)
            }
        }
        // The model's rule, as the server applies it: stored NFKC-normalised, `@` and `+` allowed.
        #expect(try Vault.create(dataDirectory: f.dir + "/wide", username: "ｖａｌ").username == "val")
        #expect(try Vault.create(dataDirectory: f.dir + "/mail", username: "val+work@home").username == "val+work@home")
        // Importing the same secret elsewhere gives the same account.
        let other = try Vault.create(
            dataDirectory: f.dir + "/other", username: "alice2", secret: f.vault.exportedSecret)
        #expect(other.accountID == f.vault.accountID)
    }

    @Test func accountSecretFileIsPrivate() throws {
        let f = try VaultFixture()
        var st = stat()
        #expect(stat(f.dataDir + "/account.secret", &st) == 0)
        #expect(st.st_mode & 0o777 == 0o600)
        #expect(stat(f.dataDir, &st) == 0)
        #expect(st.st_mode & 0o077 == 0, "data directory not readable by others")
        let text = try String(contentsOfFile: f.dataDir + "/account.secret", encoding: .utf8)
        #expect(try AccountSecret(exported: text) == f.vault.exportedSecret)
    }

    @Test func pendingChangesCountsLocalEdits() throws {
        let f = try VaultFixture()
        try f.document("a")
        try f.document("b")
        let p = try f.vault.pendingChanges()
        #expect(p.created == 3)  // the root and two documents: nothing is synced yet
        #expect(p.deleted == 0)
        #expect(f.vault.fileCount == 3)
    }
}

/// A settable clock for tests (seconds).
final class ManualClock: @unchecked Sendable {
    private var seconds: Int64
    private let lock = NSLock()
    init(start: Int64) { seconds = start }
    func set(_ s: Int64) {
        lock.lock()
        seconds = s
        lock.unlock()
    }
    func now() -> Timespec {
        lock.lock()
        defer { lock.unlock() }
        return Timespec(seconds: seconds)
    }
}
