import CofferFS
import CofferFuse
import Foundation
import Testing

@testable import CofferVault

#if canImport(Glibc)
    import Glibc
#endif

/// `CofferFileSystem`'s operations called directly on a real vault, for what a test through a
/// mount cannot time or see: orders of requests the kernel can produce (it looks a name up,
/// another process replaces or removes that name, then the open for the inode it found
/// arrives), and the answers the FUSE reader asks for before a close.
@Suite struct CofferFileSystemDirectTests {
    let context = RequestContext(uid: 0, gid: 0, pid: 1, umask: 0o022)

    final class Fixture {
        let store: TemporaryVault
        let fs: CofferFileSystem
        init() throws {
            store = try TemporaryVault("fs-race")
            fs = try CofferFileSystem(vault: store.vault)
        }
        deinit { fs.destroy() }  // before `store` goes, and its folder with it
    }

    /// Creates, writes and closes a file, and lets the kernel forget it, as `echo > name` would.
    func file(_ fs: CofferFileSystem, _ name: String, _ bytes: [UInt8]) throws {
        let (entry, reply) = try fs.create(
            parent: FuseRootInode, name: name, mode: UInt32(S_IFREG) | 0o644,
            flags: O_WRONLY | O_CREAT, context: context)
        #expect(try fs.write(inode: entry.inode, handle: reply.handle, offset: 0, data: bytes) == bytes.count)
        try fs.flush(inode: entry.inode, handle: reply.handle, lockOwner: 0)
        try fs.release(inode: entry.inode, handle: reply.handle, flags: O_WRONLY)
        fs.forget(inode: entry.inode, lookups: 1)
    }

    /// `name` holding "old" and `name.new` holding "new", and the kernel's lookup of `name`
    /// (the one an open for it starts with).
    func oldAndNew(_ fs: CofferFileSystem, _ name: String) throws -> Entry {
        try file(fs, name, Array("old".utf8))
        try file(fs, name + ".new", Array("new".utf8))
        return try fs.lookup(parent: FuseRootInode, name: name)
    }

    /// `file`, then the kernel's lookup of it: the inode, for tests that open it themselves.
    func created(_ fs: CofferFileSystem, _ name: String, _ bytes: [UInt8]) throws -> InodeNumber {
        try file(fs, name, bytes)
        return try fs.lookup(parent: FuseRootInode, name: name).inode
    }

    /// Opens the inode, reads up to `size` bytes and closes it again.
    func contents(_ fs: CofferFileSystem, _ inode: InodeNumber, size: Int = 100) throws -> [UInt8] {
        let reply = try fs.open(inode: inode, flags: O_RDONLY, context: context)
        defer { try? fs.release(inode: inode, handle: reply.handle, flags: O_RDONLY) }
        return try fs.read(inode: inode, handle: reply.handle, offset: 0, size: size)
    }

    func isStale(_ body: () throws -> Void) -> Bool {
        do {
            try body()
            return false
        } catch let e as FSError { return e.errno == ESTALE } catch { return false }
    }

    /// An editor's save renames a new file over the one another process is opening: the open
    /// that lost the race must still succeed, with the old content (what it would have got a
    /// moment earlier), never fail.
    @Test func anOpenRacingARenameOverGetsTheOldContent() throws {
        let f = try Fixture()
        let fs = f.fs
        let looked = try oldAndNew(fs, "notes.txt")
        try fs.rename(
            parent: FuseRootInode, name: "notes.txt.new", newParent: FuseRootInode, newName: "notes.txt", flags: [])
        #expect(try contents(fs, looked.inode) == Array("old".utf8))
        // The name leads to the new file; the old inode stays openable until the kernel forgets it.
        let now = try fs.lookup(parent: FuseRootInode, name: "notes.txt")
        #expect(now.inode != looked.inode)
        #expect(try contents(fs, now.inode) == Array("new".utf8))
        fs.forget(inode: now.inode, lookups: 1)
        fs.forget(inode: looked.inode, lookups: 1)
        #expect(
            isStale { _ = try fs.open(inode: looked.inode, flags: O_RDONLY, context: self.context) },
            "an inode the kernel forgot after its file was replaced")
    }

    /// An open racing an unlink answers ESTALE, so the kernel looks the name up again and
    /// reports ENOENT, as for any open after an unlink.
    @Test func anOpenRacingAnUnlinkIsStale() throws {
        let f = try Fixture()
        let fs = f.fs
        try file(fs, "gone.txt", Array("bytes".utf8))
        let looked = try fs.lookup(parent: FuseRootInode, name: "gone.txt")
        try fs.unlink(parent: FuseRootInode, name: "gone.txt")
        #expect(isStale { _ = try fs.open(inode: looked.inode, flags: O_RDONLY, context: self.context) })
        #expect(throws: FSError.self) { _ = try fs.lookup(parent: FuseRootInode, name: "gone.txt") }
        fs.forget(inode: looked.inode, lookups: 1)
    }

    /// A rename over a file that is open keeps the open descriptor on the old content, for
    /// reading and writing, until its last close; the new name is not disturbed by those writes.
    @Test func aReplacedOpenFileKeepsItsContentUntilClosed() throws {
        let f = try Fixture()
        let fs = f.fs
        let looked = try oldAndNew(fs, "db")
        let held = try fs.open(inode: looked.inode, flags: O_RDWR, context: context)
        try fs.rename(parent: FuseRootInode, name: "db.new", newParent: FuseRootInode, newName: "db", flags: [])
        #expect(try fs.write(inode: looked.inode, handle: held.handle, offset: 3, data: Array("er".utf8)) == 2)
        #expect(try fs.read(inode: looked.inode, handle: held.handle, offset: 0, size: 100) == Array("older".utf8))
        try fs.flush(inode: looked.inode, handle: held.handle, lockOwner: 0)
        try fs.release(inode: looked.inode, handle: held.handle, flags: O_RDWR)
        fs.forget(inode: looked.inode, lookups: 1)
        let now = try fs.lookup(parent: FuseRootInode, name: "db")
        #expect(try contents(fs, now.inode) == Array("new".utf8))
        fs.forget(inode: now.inode, lookups: 1)
    }

    /// What the bridge asks before a small write: one into the buffer (a new file, a chunk the
    /// write covers whole, one already buffered) does not take long; one that patches committed
    /// content it must read back from the store does, and so does one that fills the buffer.
    @Test func aWriteMayTakeLongAsTheWriteWillDo() throws {
        let f = try Fixture()
        let fs = f.fs
        let inode = try created(fs, "f", [])
        var writer = try fs.open(inode: inode, flags: O_WRONLY, context: context)
        #expect(!fs.mayTakeLong(.write(offset: 0, count: 4096), inode: inode, handle: writer.handle), "a new file")
        _ = try fs.write(inode: inode, handle: writer.handle, offset: 0, data: [UInt8](repeating: 1, count: 10_000))
        #expect(
            !fs.mayTakeLong(.write(offset: 100, count: 50), inode: inode, handle: writer.handle), "a buffered chunk")
        #expect(
            fs.mayTakeLong(.write(offset: 0, count: Vault.writeBufferLimit), inode: inode, handle: writer.handle),
            "a full buffer")
        #expect(!fs.mayTakeLong(.write(offset: 0, count: 10), inode: inode, handle: 987_654), "an unknown handle")
        try fs.flush(inode: inode, handle: writer.handle, lockOwner: 0)
        try fs.release(inode: inode, handle: writer.handle, flags: O_WRONLY)

        // Reopened with nothing buffered or cached: patching the committed chunk reads it back.
        writer = try fs.open(inode: inode, flags: O_WRONLY, context: context)
        #expect(
            fs.mayTakeLong(.write(offset: 100, count: 50), inode: inode, handle: writer.handle),
            "a patch of committed content")
        #expect(
            !fs.mayTakeLong(.write(offset: 0, count: 10_000), inode: inode, handle: writer.handle),
            "the whole chunk overwritten")
        #expect(
            !fs.mayTakeLong(.write(offset: 1 << 20, count: 10), inode: inode, handle: writer.handle),
            "past the end, a gap of zeros")
        let reader = try fs.open(inode: inode, flags: O_RDONLY, context: context)
        #expect(
            !fs.mayTakeLong(.write(offset: 100, count: 50), inode: inode, handle: reader.handle),
            "a read-only handle is refused at once")
        _ = try fs.write(inode: inode, handle: writer.handle, offset: 100, data: [UInt8](repeating: 2, count: 50))
        #expect(
            !fs.mayTakeLong(.write(offset: 200, count: 50), inode: inode, handle: writer.handle),
            "the chunk is buffered now")
        try fs.flush(inode: inode, handle: writer.handle, lockOwner: 0)
        try fs.release(inode: inode, handle: writer.handle, flags: O_WRONLY)
        try fs.release(inode: inode, handle: reader.handle, flags: O_RDONLY)
        var expected = [UInt8](repeating: 1, count: 10_000)
        expected.replaceSubrange(100..<150, with: [UInt8](repeating: 2, count: 50))
        #expect(try contents(fs, inode, size: 20_000) == expected)
    }

    /// What the bridge asks before a small read: a chunk small enough for a store row is one
    /// query and does not take long, unless the store's reads wait for its writer (a group
    /// transaction is open); a large chunk, which lives in a pack file, may.
    @Test func aReadMayTakeLongAsWhereItsChunksLive() throws {
        let f = try Fixture()
        let fs = f.fs
        let small = try created(fs, "small", [UInt8](repeating: 4, count: 5000))
        // Random bytes do not compress: a 200 KiB chunk goes to a pack file.
        let large = try created(fs, "large", (0..<200_000).map { _ in UInt8.random(in: 0...255) })
        let s = try fs.open(inode: small, flags: O_RDONLY, context: context)
        let l = try fs.open(inode: large, flags: O_RDWR, context: context)
        #expect(!fs.mayTakeLong(.read(offset: 0, size: 8192), inode: small, handle: s.handle), "a row-sized chunk")
        #expect(fs.mayTakeLong(.read(offset: 0, size: 8192), inode: large, handle: l.handle), "a chunk in a pack file")
        #expect(!fs.mayTakeLong(.read(offset: 300_000, size: 8192), inode: large, handle: l.handle), "past the end")
        #expect(!fs.mayTakeLong(.read(offset: 0, size: 10), inode: small, handle: 987_654), "an unknown handle")
        #expect(
            try fs.read(inode: small, handle: s.handle, offset: 0, size: 8192) == [UInt8](repeating: 4, count: 5000))
        _ = try fs.read(inode: large, handle: l.handle, offset: 0, size: 8192)
        #expect(
            !fs.mayTakeLong(.read(offset: 8192, size: 8192), inode: large, handle: l.handle), "the chunk is cached now")
        try fs.release(inode: small, handle: s.handle, flags: O_RDONLY)
        try fs.release(inode: large, handle: l.handle, flags: O_RDWR)

        // With a group open (a write since, in the daemon's group-commit mode), reads of the
        // store go through the writer's connection, behind whatever it is running.
        fs.vault.enableGroupCommit(window: 60, longest: 60)
        defer { try? fs.vault.disableGroupCommit() }
        _ = try created(fs, "other", [9])
        #expect(fs.vault.store.readsGoThroughWriter)
        let again = try fs.open(inode: small, flags: O_RDONLY, context: context)
        #expect(
            fs.mayTakeLong(.read(offset: 0, size: 8192), inode: small, handle: again.handle),
            "a row-sized chunk, through the writer")
        try fs.release(inode: small, handle: again.handle, flags: O_RDONLY)
    }

    /// What the bridge asks before a flush or release: a close with a megabyte buffered may
    /// take long, one with a few bytes or none does not, and a read-only handle's flush never
    /// does (it commits nothing), while its release may be the last and commit others' writes.
    @Test func aCloseMayTakeLongAsWhatItWillCommit() throws {
        let f = try Fixture()
        let fs = f.fs
        try file(fs, "big", [])
        let inode = try fs.lookup(parent: FuseRootInode, name: "big").inode
        let writer = try fs.open(inode: inode, flags: O_WRONLY, context: context)
        let reader = try fs.open(inode: inode, flags: O_RDONLY, context: context)
        #expect(!fs.mayTakeLong(.flush, inode: inode, handle: writer.handle), "nothing written")
        _ = try fs.write(inode: inode, handle: writer.handle, offset: 0, data: Array("small".utf8))
        #expect(!fs.mayTakeLong(.flush, inode: inode, handle: writer.handle), "a few bytes")
        _ = try fs.write(inode: inode, handle: writer.handle, offset: 5, data: [UInt8](repeating: 7, count: 1 << 20))
        #expect(fs.mayTakeLong(.flush, inode: inode, handle: writer.handle), "a megabyte buffered")
        #expect(!fs.mayTakeLong(.flush, inode: inode, handle: reader.handle), "a read-only flush")
        #expect(fs.mayTakeLong(.release, inode: inode, handle: reader.handle), "a release that may commit")
        #expect(!fs.mayTakeLong(.release, inode: inode, handle: 987_654), "an unknown handle")
        try fs.flush(inode: inode, handle: writer.handle, lockOwner: 0)
        #expect(!fs.mayTakeLong(.release, inode: inode, handle: writer.handle), "flushed")
        try fs.release(inode: inode, handle: writer.handle, flags: O_WRONLY)
        try fs.release(inode: inode, handle: reader.handle, flags: O_RDONLY)
        #expect(try contents(fs, inode).prefix(5) == Array("small".utf8)[...])
        fs.forget(inode: inode, lookups: 1)
    }

    /// Only read-only handles skip the kernel's FLUSH: a writable handle's close commits there.
    /// What the last release of a read-only handle commits (another handle's writes, if that
    /// handle is gone) still reaches the store.
    @Test func readOnlyHandlesAskForNoFlush() throws {
        let f = try Fixture()
        let fs = f.fs
        let (entry, created) = try fs.create(
            parent: FuseRootInode, name: "f", mode: UInt32(S_IFREG) | 0o644,
            flags: O_WRONLY | O_CREAT, context: context)
        #expect(!created.noFlush)
        let inode = entry.inode
        let reader = try fs.open(inode: inode, flags: O_RDONLY, context: context)
        #expect(reader.noFlush)
        for flags in [O_WRONLY, O_RDWR, O_RDWR | O_APPEND] {
            let h = try fs.open(inode: inode, flags: flags, context: context)
            #expect(!h.noFlush, "flags \(flags)")
            try fs.release(inode: inode, handle: h.handle, flags: flags)
        }
        _ = try fs.write(inode: inode, handle: created.handle, offset: 0, data: Array("written".utf8))
        // The writer goes without a flush (as after a crash of its process); the reader's
        // release is the last one and commits.
        try fs.release(inode: inode, handle: created.handle, flags: O_WRONLY)
        try fs.release(inode: inode, handle: reader.handle, flags: O_RDONLY)
        // No handle is left, so the vault reads the store, not a document in memory.
        #expect(fs.vault.registeredDocument(try #require(try fs.vault.lookup(fs.vault.rootID, "f")).id) == nil)
        let node = try #require(try fs.vault.lookup(fs.vault.rootID, "f"))
        var stored: [UInt8] = []
        try fs.vault.readContents(node.id) { stored += $0 }
        #expect(stored == Array("written".utf8))
        fs.forget(inode: inode, lookups: 1)
    }
}
