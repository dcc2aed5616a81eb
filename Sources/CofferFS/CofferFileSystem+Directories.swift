import CofferFuse
import CofferModel
import CofferVault
import Foundation

/// Directory listing and filesystem statistics.
extension CofferFileSystem {
    /// Lists are snapshotted at opendir, so readdir offsets stay stable while the folder changes
    /// (POSIX allows entries added or removed meanwhile to be shown or not).
    public func opendir(inode: InodeNumber, flags: Int32) throws -> OpenReply {
        try op {
            let folder = try folderID(inode)
            let self_ = try vault.node(folder)
            let parentNode = self_.isRoot ? self_ : try vault.node(self_.parent)
            var entries = [
                DirectorySnapshotEntry(name: ".", node: self_), DirectorySnapshotEntry(name: "..", node: parentNode),
            ]
            for child in try vault.children(of: folder) {
                entries.append(DirectorySnapshotEntry(name: child.name, node: child))
            }
            let fh = handles.withLock { t -> UInt64 in
                let fh = t.allocate()
                t.directories[fh] = entries
                return fh
            }
            return OpenReply(handle: fh)
        }
    }

    public func readdir(
        inode: InodeNumber, handle fh: UInt64, offset: Int64, maxEntries: Int, withAttributes: Bool
    ) throws -> [DirectoryEntry] {
        try op {
            guard let entries = handles.withLock({ $0.directories[fh] }) else { throw FSError.badHandle }
            guard offset >= 0 else { throw FSError.invalid }
            var out: [DirectoryEntry] = []
            var index = Int(offset)
            while index < entries.count && out.count < maxEntries {
                let e = entries[index]
                let ino: InodeNumber
                if e.name == ".." && e.node.isRoot && e.node.id == vault.rootID && index == 1 {
                    ino = 1
                } else {
                    ino = try inodes.inode(for: e.node.id)
                }
                if withAttributes && e.name != "." && e.name != ".." {
                    inodes.addLookup(ino)
                    inodes.remember(ino, parent: e.node.parent, name: e.name)
                }
                out.append(
                    DirectoryEntry(
                        name: e.name, inode: ino, attributes: attributes(e.node), nextOffset: Int64(index + 1)))
                index += 1
            }
            return out
        }
    }

    public func releasedir(inode: InodeNumber, handle fh: UInt64) throws {
        _ = handles.withLock { $0.directories.removeValue(forKey: fh) }
    }

    public func fsyncdir(inode: InodeNumber, handle: UInt64, dataOnly: Bool) throws {
        try op {
            try vault.flushFolderTimes()
            try vault.makeDurable()
        }
    }

    /// Space figures come from the filesystem holding the store, which is where the encrypted
    /// data really goes; editors and package managers check them before writing.
    public func statfs(inode: InodeNumber) throws -> FileSystemStatistics {
        var s = statvfs()
        guard statvfs(vault.dataDirectory, &s) == 0 else { throw FSError.io }
        let files = UInt64(vault.fileCount)
        return FileSystemStatistics(
            blockSize: UInt64(s.f_bsize), fragmentSize: UInt64(s.f_frsize),
            totalBlocks: UInt64(s.f_blocks), freeBlocks: UInt64(s.f_bfree),
            availableBlocks: UInt64(s.f_bavail), totalFiles: files + 1_000_000_000,
            freeFiles: 1_000_000_000, availableFiles: 1_000_000_000,
            maximumNameLength: UInt64(FileName.maxBytes))
    }
}
