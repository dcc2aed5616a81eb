import CofferCrypto
import CofferModel
import CofferStore
import Foundation
import Testing

@testable import CofferVault

@Suite("Vault persistence, sharing a store, integrity")
struct VaultStoreTests {
    @Test func reopeningSeesEverything() throws {
        let f = try VaultFixture()
        let a = try f.vault.makeFolders("a/b")
        let doc = try f.document("doc.txt", in: a.id, contents: Array("hello".utf8))
        let link = try f.vault.create(in: f.root, name: "ln", type: .symlink, mode: 0o777, symlinkTarget: "a/b/doc.txt")
        try f.vault.setAttributes(doc.id, AttributeChanges(mode: 0o640))
        try f.vault.setXattr(doc.id, name: "user.k", value: [9])
        let numbering = try f.vault.inodeNumbering()

        let v = try Vault.open(dataDirectory: f.dataDir)
        #expect(v.rootID == f.root)
        #expect(v.accountID == f.vault.accountID)
        #expect(v.username == "alice")
        let n = try v.resolve("/a/b/doc.txt")
        #expect(n.id == doc.id)
        #expect(n.attributes.mode.value == 0o640)
        #expect(try v.xattrs(doc.id) == ["user.k": [9]])
        #expect(try v.readAll(doc.id) == Array("hello".utf8))
        #expect(try v.node(link.id).attributes.symlinkTarget == "a/b/doc.txt")
        let again = try v.inodeNumbering()
        #expect(
            [a.id, doc.id, link.id].map(again.hash) == [a.id, doc.id, link.id].map(numbering.hash), "inode numbers")
        #expect(v.fileCount == f.vault.fileCount)
        // And it can keep working on the same tree.
        try v.writeAll(doc.id, Array("changed".utf8))
        try v.rename(doc.id, to: f.root, name: "moved.txt")
        let v2 = try Vault.open(dataDirectory: f.dataDir)
        #expect(try v2.readAll(try v2.resolve("moved.txt").id) == Array("changed".utf8))
        #expect(try v2.check().isClean)
    }

    /// In group mode a vault skips the "did anyone else write" query while its group stays
    /// open; another process can only write once the group commits, and the next commit must
    /// then look again (here: it must refuse a name the other vault took meanwhile).
    @Test func groupCommitStillSeesWhatAnotherWriterCommittedBetweenGroups() throws {
        let f = try VaultFixture()
        let a = f.vault
        a.store.enableGroupCommit(window: 0.05)
        defer { try? a.store.disableGroupCommit() }
        let b = try Vault.open(dataDirectory: f.dataDir)
        for round in 0..<5 {
            _ = try a.create(in: a.rootID, name: "a-\(round)", type: .document, mode: 0o644)
            _ = try a.create(in: a.rootID, name: "a-\(round)-again", type: .document, mode: 0o644)
            // B waits (busy timeout) until A's group commits, then writes.
            _ = try b.create(in: b.rootID, name: "b-\(round)", type: .document, mode: 0o644)
            expectErrno(EEXIST, "round \(round)") {
                _ = try a.create(in: a.rootID, name: "b-\(round)", type: .document, mode: 0o644)
            }
            #expect(try a.lookup(a.rootID, "b-\(round)") != nil)
        }
        #expect(try a.check().isClean)
    }

    @Test func twoVaultsOnOneStoreSeeEachOthersChanges() throws {
        let f = try VaultFixture()
        let a = f.vault
        let b = try Vault.open(dataDirectory: f.dataDir)
        // A creates; B sees it after refresh.
        let doc = try a.create(in: a.rootID, name: "from-a", type: .document, mode: 0o644)
        try a.writeAll(doc.id, Array("A wrote this".utf8))
        let changed = try b.refresh()
        #expect(changed.contains(doc.id))
        #expect(try b.lookup(b.rootID, "from-a")?.id == doc.id)
        #expect(try b.readAll(doc.id) == Array("A wrote this".utf8))
        // B renames and writes; A sees it.
        try b.rename(doc.id, to: b.rootID, name: "renamed-by-b")
        try b.writeAll(doc.id, Array("B wrote this".utf8))
        _ = try a.refresh()
        #expect(try a.lookup(a.rootID, "from-a") == nil)
        #expect(try a.resolve("renamed-by-b").id == doc.id)
        #expect(try a.readAll(doc.id) == Array("B wrote this".utf8))
        // Nothing new: refresh reports nothing.
        #expect(try a.refresh().isEmpty)
        // B deletes; A sees it gone.
        try b.remove(doc.id)
        _ = try a.refresh()
        #expect(try a.lookup(a.rootID, "renamed-by-b") == nil)
        #expect(!a.isLive(doc.id))
    }

    @Test func aStaleVaultStillValidatesAgainstTheLatestTree() throws {
        let f = try VaultFixture()
        let b = try Vault.open(dataDirectory: f.dataDir)
        try f.document("same-name")
        // B has not refreshed, but its commit catches up first and sees the conflict.
        let e = expectErrno(17) { _ = try b.create(in: b.rootID, name: "same-name", type: .document, mode: 0o644) }
        #expect(treeError(e) != nil)
        // Moving a folder into a folder the other vault just moved under it is a cycle.
        let x = try f.folder("x")
        let y = try f.folder("y")
        _ = try b.refresh()
        try f.vault.rename(y.id, to: x.id, name: "y")
        expectErrno(22) { try b.rename(x.id, to: y.id, name: "x") }
        #expect(try f.vault.check().isClean)
        #expect(try b.check().isClean)
    }

    @Test func openDocumentAdoptsContentCommittedElsewhere() throws {
        let f = try VaultFixture()
        let doc = try f.document("d", contents: Array("one".utf8))
        let b = try Vault.open(dataDirectory: f.dataDir)
        let h = try b.openDocument(doc.id)
        #expect(try h.read(offset: 0, count: 10) == Array("one".utf8))
        try f.vault.writeAll(doc.id, Array("two!".utf8))
        _ = try b.refreshAll()
        #expect(h.currentSize == 4)
        #expect(try h.read(offset: 0, count: 10) == Array("two!".utf8))
        try b.release(h)
    }

    @Test func checkIsCleanForAGoodStore() throws {
        let f = try VaultFixture()
        let dir = try f.vault.makeFolders("x/y")
        try f.document("a", in: dir.id, contents: noise(600_000, seed: 1))
        try f.document("b", contents: [])
        try f.vault.create(in: f.root, name: "l", type: .symlink, mode: 0o777, symlinkTarget: "x")
        let r = try f.vault.check()
        #expect(r.isClean, "\(r.problems)")
        #expect(r.files == 6)
        #expect(r.documents == 2)
        #expect(r.chunksVerified == 3)
        #expect(r.bytesVerified == 600_000)
        #expect(r.unreferencedChunks == 0 && r.unreferencedManifests == 0)
    }

    /// fsck reads the records from the store, but decrypts through its vault's tree, which may
    /// be older: a file another process (the mount) committed after the vault was opened is
    /// checked, not reported missing.
    @Test func checkSeesFilesCommittedAfterTheVaultWasOpened() throws {
        let f = try VaultFixture()
        let fsck = try Vault.open(dataDirectory: f.dataDir)
        let mount = try Vault.open(dataDirectory: f.dataDir)
        let doc = try mount.create(in: mount.rootID, name: "late", type: .document, mode: 0o644)
        try mount.writeAll(doc.id, Array("written after fsck opened".utf8))
        let r = try fsck.check()
        #expect(r.isClean, "\(r.problems)")
        #expect(r.documents == 1)
        #expect(r.chunksVerified == 1)
    }

    @Test func checkReportsACorruptChunk() throws {
        let f = try VaultFixture()
        let doc = try f.document("a", contents: noise(600_000, seed: 2))
        #expect(try f.vault.check().isClean)
        // Damage one stored chunk behind the vault's back. The three large chunks, stored
        // together, share one pack file; zeroing its start damages the first one only.
        let files = chunkFiles(f.dataDir)
        #expect(files.count == 1, "\(files)")
        let victim = try #require(files.first)
        let handle = try #require(FileHandle(forWritingAtPath: victim))
        try handle.write(contentsOf: Data(count: 1000))
        try handle.close()
        let r = try f.vault.check()
        #expect(!r.isClean)
        #expect(r.problems.count == 1, "\(r.problems)")
        #expect(r.chunksVerified == 2)
        // Reading the damaged file fails loudly instead of returning garbage.
        let fresh = try Vault.open(dataDirectory: f.dataDir)
        #expect(throws: (any Error).self) { _ = try fresh.readAll(doc.id) }
    }

    @Test func checkReportsAMissingChunkFile() throws {
        let f = try VaultFixture()
        let doc = try f.document("a", contents: noise(300_000, seed: 4))
        // The full first chunk is in a pack of its own; the 37 KB tail is appended to the
        // store's current pack. The check reports the document once, at its first missing chunk.
        let files = chunkFiles(f.dataDir)
        #expect(files.count == 2)
        for p in files { unlink(p) }
        let r = try f.vault.check()
        #expect(r.problems.count == 1 && r.problems.allSatisfy { $0.contains("missing") }, "\(r.problems)")
        let fresh = try Vault.open(dataDirectory: f.dataDir)
        #expect(throws: (any Error).self) { _ = try fresh.readAll(doc.id) }
    }

    /// Converting a flock drops the shared lock first: a collection refused because another
    /// vault has the store open must leave this vault's shared lock held, or a collection in a
    /// third process could run under it (and delete the pack it appends to).
    @Test func aRefusedCollectionKeepsTheSharedLock() throws {
        let dir = NSTemporaryDirectory() + "coffer-locks-" + UUID().uuidString
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let mine = try StoreLocks(directory: dir)
        var other: StoreLocks? = try StoreLocks(directory: dir)
        #expect(try mine.exclusively { true } == nil, "another holder: refused")
        #expect(other != nil)
        other = nil  // its descriptor closes: only `mine` is left
        let third = try StoreLocks(directory: dir)
        #expect(try third.exclusively { true } == nil, "the refused vault still holds its shared lock")
    }

    @Test func garbageCollectionRemovesChunkFilesNothingNames() throws {
        let f = try VaultFixture()
        let doc = try f.document("a", contents: noise(600_000, seed: 5))
        #expect(chunkFiles(f.dataDir).count == 1, "three chunks in one pack")
        try f.vault.writeAll(doc.id, noise(600_000, seed: 6))  // three new chunks, three unreferenced
        #expect(chunkFiles(f.dataDir).count == 2)
        // A pack whose rows never committed (a rolled-back transaction) is swept too.
        let stray = f.dataDir + "/chunks/packs/" + String(repeating: "ab", count: 16)
        try Data([1, 2, 3]).write(to: URL(fileURLWithPath: stray))
        let gc = try #require(try f.vault.collectGarbage())
        #expect(gc.chunks == 3)
        #expect(chunkFiles(f.dataDir).count == 1, "the old version's pack is gone")
        #expect(!FileManager.default.fileExists(atPath: stray))
        #expect(try f.vault.readAll(doc.id) == noise(600_000, seed: 6))
        #expect(try f.vault.check().isClean)
    }

    @Test func checkReportsAFlippedByteInAChunk() throws {
        let f = try VaultFixture()
        try f.document("a", contents: Array(repeating: 0x41, count: 1000))
        // Flip one byte in the middle of the sealed chunk.
        _ = try f.sqlite(
            """
            UPDATE chunks SET sealed = CAST(substr(sealed, 1, 30)
              || (CASE WHEN substr(sealed, 31, 1) = x'00' THEN x'01' ELSE x'00' END)
              || substr(sealed, 32) AS BLOB);
            """)
        let r = try f.vault.check()
        #expect(!r.isClean)
    }

    @Test func checkReportsAMissingChunkAndManifest() throws {
        let f = try VaultFixture()
        try f.document("a", contents: noise(300_000, seed: 3))
        _ = try f.sqlite("DELETE FROM chunks WHERE rowid = (SELECT MIN(rowid) FROM chunks);")
        var r = try f.vault.check()
        #expect(!r.isClean)
        #expect(r.problems.contains { $0.contains("missing") }, "\(r.problems)")
        _ = try f.sqlite("DELETE FROM manifests;")
        r = try f.vault.check()
        #expect(r.problems.contains { $0.contains("missing manifest") }, "\(r.problems)")
    }

    /// Each push signs a record with a revision above its base's, and names that base revision
    /// as its precondition, so the server and other devices can order one file's records.
    @Test func pushedRecordsCarryRevisionsAboveTheirBase() throws {
        let f = try VaultFixture()
        try f.document("a", contents: [1])
        let first = try f.vault.pendingRecords()
        #expect(first.allSatisfy { $0.stored.signed.revision > 0 && $0.expectedRevision == nil })
        try f.vault.markPushed(first, version: 1)
        let doc = try #require(first.first { $0.stored.metadata.type == .document })
        try f.vault.writeAll(doc.stored.metadata.id, [2])
        let second = try f.vault.pendingRecords()
        let again = try #require(second.first { $0.stored.metadata.id == doc.stored.metadata.id })
        #expect(again.expectedRevision == doc.stored.signed.revision)
        #expect(again.stored.signed.revision > doc.stored.signed.revision)
    }

    @Test func checkReportsATamperedRecord() throws {
        let f = try VaultFixture()
        try f.document("a", contents: [1])
        // Local edits are stored unsigned and signed on their way out; push them (as a sync
        // would) so they become signed base records.
        #expect(try f.sqlite("SELECT COUNT(*) FROM local_files WHERE length(record) > 0;").hasPrefix("2"))
        let pending = try f.vault.pendingRecords()
        #expect(pending.count == 2 && pending.allSatisfy { $0.stored.signed.signature.count == 64 })
        try f.vault.markPushed(pending, version: 1)
        #expect(try f.vault.check().isClean, "signed on push, verified by fsck")
        // Change one byte of a signed record (its sealed name), keeping the encoding valid.
        let hex = try f.sqlite("SELECT hex(id) FROM base_files WHERE id != parent LIMIT 1;").trimmingCharacters(
            in: .whitespacesAndNewlines)
        _ = try f.sqlite(
            """
            UPDATE base_files SET record = CAST(substr(record, 1, 60)
              || (CASE WHEN substr(record, 61, 1) = x'00' THEN x'01' ELSE x'00' END)
              || substr(record, 62) AS BLOB) WHERE id = x'\(hex)';
            """)
        let r = try f.vault.check()
        #expect(!r.isClean, "a modified record must not pass its signature check")
        #expect(r.problems.contains { $0.contains("signature") }, "\(r.problems)")
        #expect(try f.sqlite("SELECT typeof(record) FROM base_files WHERE id = x'\(hex)';").hasPrefix("blob"))
    }

    /// fsck on a store with an undecodable record reports it rather than giving up.
    @Test func checkReportsAnUndecodableRecord() throws {
        let f = try VaultFixture()
        try f.document("a", contents: [1])
        _ = try f.sqlite("UPDATE local_files SET record = substr(record, 1, 10) WHERE id != parent;")
        let r = try f.vault.check()
        #expect(!r.isClean)
    }

    @Test func noPlaintextAtRest() throws {
        let f = try VaultFixture()
        let marker = "ZQXMARKER7731"
        let folder = try f.folder("folder-\(marker)")
        let doc = try f.document("file-\(marker).txt", in: folder.id)
        var text: [UInt8] = []
        for i in 0..<2000 { text += Array("line \(i) \(marker) secret content\n".utf8) }
        try f.vault.writeAll(doc.id, text)
        try f.vault.create(in: folder.id, name: "link", type: .symlink, mode: 0o777, symlinkTarget: "/target/\(marker)")
        try f.vault.setXattr(doc.id, name: "user.\(marker)", value: Array(marker.utf8))
        let small = try f.document("small", contents: Array(marker.utf8))  // raw (incompressible-size) chunk
        try f.vault.rename(small.id, to: folder.id, name: "renamed-\(marker)")
        let h = try f.vault.openDocument(doc.id)
        try h.write(offset: 5, bytes: Array(marker.utf8))
        try h.flush(durable: true)
        try f.vault.release(h)
        try f.vault.store.makeDurable()

        // Every byte of every file under the data directory (database, -wal, -shm, locks, secret).
        let needles = [
            Array(marker.utf8), Array(marker.lowercased().utf8),
            Array(marker.utf16).flatMap { [UInt8($0 & 0xff), UInt8($0 >> 8)] },
        ]
        var scanned = 0
        var files: [String] = []
        let enumerator = FileManager.default.enumerator(atPath: f.dataDir)!
        while let rel = enumerator.nextObject() as? String {
            let path = f.dataDir + "/" + rel
            var isDir: ObjCBool = false
            guard FileManager.default.fileExists(atPath: path, isDirectory: &isDir), !isDir.boolValue else { continue }
            let bytes = [UInt8](try Data(contentsOf: URL(fileURLWithPath: path)))
            scanned += bytes.count
            files.append(rel)
            for n in needles { #expect(!containsBytes(bytes, n), "plaintext found in \(rel)") }
        }
        #expect(files.contains("coffer.sqlite"))
        #expect(files.contains { $0.hasSuffix("-wal") }, "the WAL is scanned too: \(files)")
        #expect(scanned > 10_000)
        #expect(try f.vault.readAll(doc.id).count == text.count, "and the content is really there")
    }
}

/// Chunk files under a store's data directory, sorted.
func chunkFiles(_ dataDir: String) -> [String] {
    let root = dataDir + "/chunks"
    var out: [String] = []
    for folder in (try? FileManager.default.contentsOfDirectory(atPath: root)) ?? [] {
        for name in (try? FileManager.default.contentsOfDirectory(atPath: root + "/" + folder)) ?? [] {
            out.append(root + "/" + folder + "/" + name)
        }
    }
    return out.sorted()
}
