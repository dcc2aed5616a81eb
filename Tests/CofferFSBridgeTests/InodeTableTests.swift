import CofferFuse
import CofferModel
import CofferStore
import Foundation
import Testing

@testable import CofferFS
@testable import CofferVault

#if canImport(Glibc)
    import Glibc
#endif

/// The daemon's per-inode memory follows what the kernel holds, not the size of the tree
/// (issue 21): nothing is loaded at mount, an entry goes when the kernel forgets its inode, the
/// names cache stays bounded, and numbers (a keyed hash of file ids) are the same in every
/// mount without a row per file.
@Suite struct InodeTableTests {
    let context = RequestContext(uid: 0, gid: 0, pid: 1, umask: 0o022)

    final class Fixture {
        let store: TemporaryVault
        var vault: Vault { store.vault }
        init() throws { store = try TemporaryVault("fs-inodes") }

        /// A filesystem over the vault, as a fresh mount would start.
        func mount(
            cacheCapacity: Int = InodeTable.cacheCapacity, hash: (@Sendable (FileID) -> UInt64)? = nil
        ) throws -> CofferFileSystem {
            try CofferFileSystem(
                vault: vault, measuringOperations: false, inodeCacheCapacity: cacheCapacity, inodeHash: hash,
                log: { _ in })
        }
    }

    /// A folder `d` holding `count` documents, made behind the filesystem's back (as the CLI or
    /// a sync would); their names in order.
    func tree(_ f: Fixture, _ count: Int) throws -> [String] {
        let folder = try f.vault.create(in: f.vault.rootID, name: "d", type: .folder, mode: 0o755)
        let names = (0..<count).map { String(format: "file-%04d", $0) }
        for name in names { _ = try f.vault.create(in: folder.id, name: name, type: .document, mode: 0o644) }
        return names
    }

    /// Looks up `d` and every name in it, as `stat d/*` does: one kernel reference each.
    func lookUpAll(_ fs: CofferFileSystem, _ names: [String]) throws -> (folder: InodeNumber, files: [InodeNumber]) {
        let folder = try fs.lookup(parent: FuseRootInode, name: "d").inode
        return (folder, try names.map { try fs.lookup(parent: folder, name: $0).inode })
    }

    /// Before issue 21 the table loaded every inode of the store at mount and kept four
    /// dictionaries' entries for every inode the kernel had seen; now it holds nothing at
    /// mount, one entry per inode the kernel holds, and none once the kernel forgets them.
    @Test func entriesFollowTheKernelsReferences() throws {
        let f = try Fixture()
        let names = try tree(f, 300)
        let fs = try f.mount()
        #expect(fs.inodes.counts == (0, 0), "nothing is loaded at mount")

        let (folder, files) = try lookUpAll(fs, names)
        #expect(Set(files).count == names.count)
        #expect(fs.inodes.counts.referenced == names.count + 1)
        // Each looked up twice more (a dentry revalidated after its timeout): still one entry.
        for (name, ino) in zip(names, files) {
            #expect(try fs.lookup(parent: folder, name: name).inode == ino)
            #expect(try fs.lookup(parent: folder, name: name).inode == ino)
        }
        #expect(fs.inodes.counts.referenced == names.count + 1)
        // Counts are exact: two of three references given back keep the entry.
        for ino in files { fs.forget(inode: ino, lookups: 2) }
        #expect(fs.inodes.counts.referenced == names.count + 1)
        for ino in files { fs.forget(inode: ino, lookups: 1) }
        fs.forget(inode: folder, lookups: 1)
        #expect(fs.inodes.counts.referenced == 0)
        #expect(fs.inodes.counts.names == 0, "a forgotten inode's name goes with it")
        // The root is never dropped, whatever the kernel sends.
        fs.forget(inode: FuseRootInode, lookups: 1)
        #expect(try fs.getattr(inode: FuseRootInode, handle: nil).mode & UInt32(S_IFMT) == UInt32(S_IFDIR))
    }

    /// readdirplus counts every entry but "." and "..", like lookup; the listing's snapshot goes
    /// at releasedir; a cookie far past the end (seekdir) ends the listing without a trap.
    @Test func aListingsReferencesAndSnapshotAreGivenBack() throws {
        let f = try Fixture()
        let names = try tree(f, 200)
        let fs = try f.mount()
        let folder = try fs.lookup(parent: FuseRootInode, name: "d").inode
        let handle = try fs.opendir(inode: folder, flags: O_RDONLY).handle
        var listed: [DirectoryEntry] = []
        while true {
            let next = try fs.readdir(
                inode: folder, handle: handle, offset: listed.last?.nextOffset ?? 0, maxEntries: 37,
                withAttributes: true)
            if next.isEmpty { break }
            listed += next
        }
        #expect(listed.map(\.name) == [".", ".."] + names)
        #expect(listed[0].inode == folder && listed[1].inode == FuseRootInode)
        #expect(fs.inodes.counts.referenced == names.count + 1)
        #expect(
            try fs.readdir(inode: folder, handle: handle, offset: .max, maxEntries: 10, withAttributes: true).isEmpty)
        try fs.releasedir(inode: folder, handle: handle)
        #expect(fs.handles.withLock { $0.directories.isEmpty })
        for e in listed.dropFirst(2) { fs.forget(inode: e.inode, lookups: 1) }
        fs.forget(inode: folder, lookups: 1)
        #expect(fs.inodes.counts.referenced == 0)
        // The inodes a listing gave are the ones lookup gives.
        let (_, looked) = try lookUpAll(fs, names)
        #expect(looked == listed.dropFirst(2).map(\.inode))
    }

    /// With a names cache far smaller than what the kernel holds, every inode still resolves
    /// (the kernel's references hold their files) and the cache stays within its bound. Numbers
    /// are the same in every mount of the store, new files' too, and owe nothing to the order
    /// files are met in; a number the kernel does not hold names nothing.
    @Test func numbersAreTheSameInEveryMount() throws {
        let f = try Fixture()
        let names = try tree(f, 100)
        let fs = try f.mount(cacheCapacity: 8)
        let (folder, files) = try lookUpAll(fs, names)
        let counts = fs.inodes.counts
        #expect(counts.referenced == names.count + 1)
        #expect(counts.names <= 8)
        #expect(Set(files).count == files.count && !files.contains(FuseRootInode) && !files.contains(folder))
        #expect(files.allSatisfy { $0 >= 2 && $0 < InodeTable.firstException })
        for ino in files { #expect(try fs.getattr(inode: ino, handle: nil).mode & 0o777 == 0o644) }
        let (entry, reply) = try fs.create(
            parent: folder, name: "written", mode: UInt32(S_IFREG) | 0o644, flags: O_WRONLY | O_CREAT,
            context: context)
        _ = try fs.write(inode: entry.inode, handle: reply.handle, offset: 0, data: Array("kept".utf8))
        try fs.flush(inode: entry.inode, handle: reply.handle, lockOwner: 0)
        try fs.release(inode: entry.inode, handle: reply.handle, flags: O_WRONLY)
        for ino in files { fs.forget(inode: ino, lookups: 1) }
        fs.forget(inode: entry.inode, lookups: 1)
        fs.forget(inode: folder, lookups: 1)
        #expect(fs.inodes.counts.referenced == 0)
        #expect(throws: FSError.self, "a number the kernel let go names nothing") {
            try fs.getattr(inode: files[42], handle: nil)
        }
        fs.destroy()

        // Another mount, meeting the files in the opposite order.
        let other = try f.mount()
        #expect(other.inodes.counts == (0, 0))
        let again = try other.lookup(parent: FuseRootInode, name: "d").inode
        #expect(again == folder)
        #expect(try names.reversed().map { try other.lookup(parent: again, name: $0).inode } == files.reversed())
        let written = try other.lookup(parent: again, name: "written")
        #expect(written.inode == entry.inode)
        let h = try other.open(inode: written.inode, flags: O_RDONLY, context: context)
        #expect(try other.read(inode: written.inode, handle: h.handle, offset: 0, size: 10) == Array("kept".utf8))
        try other.release(inode: written.inode, handle: h.handle, flags: O_RDONLY)
        #expect(throws: FSError.self) { try other.getattr(inode: 1 << 40, handle: nil) }
        other.destroy()

        // Each number is the store's keyed hash of the file's id, and another store numbers the
        // same ids otherwise (its own key).
        let numbering = try f.vault.inodeNumbering()
        let folderNode = try #require(try f.vault.lookup(f.vault.rootID, "d"))
        let ids = try names.map { try #require(try f.vault.lookup(folderNode.id, $0)).id }
        #expect(files == ids.map { numbering.hash($0) & (InodeTable.firstException - 1) })
        let elsewhere = try Fixture().vault.inodeNumbering()
        #expect(ids.filter { elsewhere.hash($0) == numbering.hash($0) }.isEmpty)
    }

    /// Two files whose hashes meet while the kernel holds the first: the second is given a
    /// number of its own, kept in the store, so it has it in every later mount, whoever is
    /// met first; a file whose hash is below 2 (the root's number, or none) is given one too.
    @Test func aFileWhoseHashIsTakenIsGivenANumberForGood() throws {
        let f = try Fixture()
        let names = try tree(f, 3)
        let folderID = try #require(try f.vault.lookup(f.vault.rootID, "d")).id
        let ids = try names.map { try #require(try f.vault.lookup(folderID, $0)).id }
        // Every document hashes to 77, the folder to 1.
        let docs = Set(ids)
        let hash: @Sendable (FileID) -> UInt64 = { docs.contains($0) ? 77 : 1 }
        let fs = try f.mount(hash: hash)
        let (folder, files) = try lookUpAll(fs, names)
        #expect(folder == InodeTable.firstException, "a hash of 1 is no number")
        #expect(files == [77, InodeTable.firstException + 1, InodeTable.firstException + 2])
        #expect(Set(try f.vault.inodeNumbering().exceptions.map(\.id)) == Set([folderID, ids[1], ids[2]]))
        // A listing gives the same numbers, with each entry's attributes.
        let handle = try fs.opendir(inode: folder, flags: O_RDONLY).handle
        let listed = try fs.readdir(inode: folder, handle: handle, offset: 0, maxEntries: 10, withAttributes: true)
        #expect(listed.dropFirst(2).map(\.inode) == files)
        try fs.releasedir(inode: folder, handle: handle)
        fs.destroy()

        // Met the other way round in a new mount: the exceptions keep their numbers, and the
        // first file keeps its hash although the kernel met it last.
        let other = try f.mount(hash: hash)
        let d = try other.lookup(parent: FuseRootInode, name: "d").inode
        #expect(d == folder)
        #expect(try names.reversed().map { try other.lookup(parent: d, name: $0).inode } == files.reversed())
        other.destroy()
    }

    /// A damaged key is replaced (numbers change once, as at a first mount), not a mount that
    /// fails for good; the exceptions stand.
    @Test func aDamagedNumberingIsReplacedNotFatal() throws {
        let f = try Fixture()
        let names = try tree(f, 5)
        let folderID = try #require(try f.vault.lookup(f.vault.rootID, "d")).id
        let first = try f.vault.inodeNumbering().hash(folderID)
        try f.vault.store.write { w in
            try w.setSetting(Vault.inodeKeySetting, [1, 2, 3])
            try w.addInodeException(folderID, 1 << 62)
        }
        let replaced = try f.vault.inodeNumbering().hash(folderID)
        #expect(replaced != first)
        #expect(try f.vault.inodeNumbering().hash(folderID) == replaced, "made once")
        let fs = try f.mount()
        let (folder, files) = try lookUpAll(fs, names)
        #expect(folder == InodeTable.firstException && Set(files).count == names.count)
        fs.destroy()
    }

    /// The kernel's references found by number and by file id through any order of lookups and
    /// forgets, growing and shrinking, against a plain dictionary.
    @Test func referenceTableAgreesWithADictionary() throws {
        var table = ReferenceTable()
        var model: [InodeNumber: (id: FileID, lookups: UInt64)] = [:]
        var rng = SystemRandomNumberGenerator()
        func id(_ ino: InodeNumber) throws -> FileID {
            try FileID(bytes: (0..<16).map { UInt8(truncatingIfNeeded: ino >> (8 * ($0 % 8))) ^ UInt8($0) })
        }
        for round in 0..<3 {
            // Grows to a few thousand, then the kernel forgets nearly everything.
            for _ in 0..<6000 {
                let ino = InodeNumber.random(in: 2...4000, using: &rng)
                let fid = try id(ino)
                table.add(ino, id: fid)
                model[ino, default: (fid, 0)].lookups += 1
            }
            #expect(table.count == model.count, "round \(round)")
            for ino in model.keys.shuffled(using: &rng) where ino % 50 != 0 {
                let lookups = model[ino]?.lookups ?? 0
                if lookups > 1 { #expect(table.remove(lookups - 1, from: ino) == nil) }
                #expect(table.remove(1, from: ino) == (try id(ino)))
                model[ino] = nil
            }
            #expect(table.count == model.count)
            for ino: InodeNumber in 2...4000 {
                let held = model[ino] != nil
                #expect(table.inode(of: try id(ino)) == (held ? ino : nil))
                #expect(table.fileID(ino) == (held ? try id(ino) : nil))
            }
        }
        #expect(table.remove(1, from: 99_999) == nil, "an inode the kernel does not hold")
    }
}
