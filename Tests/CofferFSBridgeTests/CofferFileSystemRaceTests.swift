import CofferFS
import CofferVault
import Foundation
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// Orders of requests the kernel can produce but a test through a mount cannot time: the
/// kernel looks a name up, another process replaces or removes that name, and then the open
/// for the inode it found arrives. `CofferFileSystem`'s operations are called directly here, in
/// that order, on a real vault.
@Suite struct CofferFileSystemRaceTests {
    let context = RequestContext(uid: 0, gid: 0, pid: 1, umask: 0o022)

    final class Fixture {
        let dir = NSTemporaryDirectory() + "coffer-fs-race-" + UUID().uuidString
        let fs: CofferFileSystem
        init() throws {
            let vault = try Vault.create(dataDirectory: dir + "/data", username: "rita")
            fs = try CofferFileSystem(vault: vault)
        }
        deinit {
            fs.destroy()
            try? FileManager.default.removeItem(atPath: dir)
        }
    }

    /// Creates, writes and closes a file, and lets the kernel forget it, as `echo > name` would.
    func file(_ fs: CofferFileSystem, _ name: String, _ bytes: [UInt8]) throws {
        let (entry, reply) = try fs.create(parent: FuseRootInode, name: name, mode: UInt32(S_IFREG) | 0o644,
                                           flags: O_WRONLY | O_CREAT, context: context)
        #expect(try fs.write(inode: entry.inode, handle: reply.handle, offset: 0, data: bytes) == bytes.count)
        try fs.flush(inode: entry.inode, handle: reply.handle, lockOwner: 0)
        try fs.release(inode: entry.inode, handle: reply.handle, flags: O_WRONLY)
        fs.forget(inode: entry.inode, lookups: 1)
    }

    func isStale(_ body: () throws -> Void) -> Bool {
        do { try body(); return false } catch let e as FSError { return e.errno == ESTALE } catch { return false }
    }

    /// An editor's save renames a new file over the one another process is opening: the open
    /// that lost the race must still succeed, with the old content (what it would have got a
    /// moment earlier), never fail.
    @Test func anOpenRacingARenameOverGetsTheOldContent() throws {
        let f = try Fixture()
        let fs = f.fs
        try file(fs, "notes.txt", Array("old".utf8))
        try file(fs, "notes.txt.tmp", Array("new".utf8))
        let looked = try fs.lookup(parent: FuseRootInode, name: "notes.txt")
        try fs.rename(parent: FuseRootInode, name: "notes.txt.tmp", newParent: FuseRootInode, newName: "notes.txt", flags: [])
        let reply = try fs.open(inode: looked.inode, flags: O_RDONLY, context: context)
        #expect(try fs.read(inode: looked.inode, handle: reply.handle, offset: 0, size: 100) == Array("old".utf8))
        try fs.release(inode: looked.inode, handle: reply.handle, flags: O_RDONLY)
        // The name leads to the new file; the old inode stays openable until the kernel forgets it.
        let now = try fs.lookup(parent: FuseRootInode, name: "notes.txt")
        #expect(now.inode != looked.inode)
        let again = try fs.open(inode: now.inode, flags: O_RDONLY, context: context)
        #expect(try fs.read(inode: now.inode, handle: again.handle, offset: 0, size: 100) == Array("new".utf8))
        try fs.release(inode: now.inode, handle: again.handle, flags: O_RDONLY)
        fs.forget(inode: now.inode, lookups: 1)
        fs.forget(inode: looked.inode, lookups: 1)
        #expect(isStale { _ = try fs.open(inode: looked.inode, flags: O_RDONLY, context: self.context) },
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
        try file(fs, "db", Array("old".utf8))
        try file(fs, "db.new", Array("new".utf8))
        let looked = try fs.lookup(parent: FuseRootInode, name: "db")
        let held = try fs.open(inode: looked.inode, flags: O_RDWR, context: context)
        try fs.rename(parent: FuseRootInode, name: "db.new", newParent: FuseRootInode, newName: "db", flags: [])
        #expect(try fs.write(inode: looked.inode, handle: held.handle, offset: 3, data: Array("er".utf8)) == 2)
        #expect(try fs.read(inode: looked.inode, handle: held.handle, offset: 0, size: 100) == Array("older".utf8))
        try fs.flush(inode: looked.inode, handle: held.handle, lockOwner: 0)
        try fs.release(inode: looked.inode, handle: held.handle, flags: O_RDWR)
        fs.forget(inode: looked.inode, lookups: 1)
        let now = try fs.lookup(parent: FuseRootInode, name: "db")
        let reply = try fs.open(inode: now.inode, flags: O_RDONLY, context: context)
        #expect(try fs.read(inode: now.inode, handle: reply.handle, offset: 0, size: 100) == Array("new".utf8))
        try fs.release(inode: now.inode, handle: reply.handle, flags: O_RDONLY)
        fs.forget(inode: now.inode, lookups: 1)
    }
}
