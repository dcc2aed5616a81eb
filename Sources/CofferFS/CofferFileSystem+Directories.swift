import CofferFuse
import CofferModel
import CofferVault
import Foundation

/// Directory listing and filesystem statistics.
extension CofferFileSystem {
    /// Lists are snapshotted at opendir, so readdir offsets stay stable while the folder changes
    /// (POSIX allows entries added or removed meanwhile to be shown or not). The snapshot is the
    /// handle's alone, read in place by each readdir, and dropped at releasedir.
    public func opendir(inode: InodeNumber, flags: Int32) throws -> OpenReply {
        try op {
            let folder = try folderID(inode)
            let self_ = try vault.node(folder)
            let parentNode = self_.isRoot ? self_ : try vault.node(self_.parent)
            let snapshot = DirectorySnapshot(
                folder: self_, parent: parentNode, children: try vault.children(of: folder))
            let fh = handles.withLock { t -> UInt64 in
                let fh = t.allocate()
                t.directories[fh] = snapshot
                return fh
            }
            return OpenReply(handle: fh)
        }
    }

    public func readdir(
        inode: InodeNumber, handle fh: UInt64, offset: Int64, maxEntries: Int, withAttributes: Bool
    ) throws -> [DirectoryEntry] {
        try op {
            guard let snapshot = handles.withLock({ $0.directories[fh] }) else { throw FSError.badHandle }
            guard offset >= 0 else { throw FSError.invalid }
            // The offset is any cookie a caller seeked to: clamped before any arithmetic.
            let start = Int(min(offset, Int64(snapshot.count)))
            let range = start..<start + min(max(0, maxEntries), snapshot.count - start)
            // This reply's inodes under one lock. "." and ".." are never counted: the bridge
            // does not hand the kernel their inodes.
            let numbers = inodes.listing(
                range.map { (snapshot.node(at: $0).id, withAttributes && $0 >= 2 ? snapshot.name(at: $0) : nil) },
                parent: inode)
            var out: [DirectoryEntry] = []
            out.reserveCapacity(range.count)
            for (index, ino) in zip(range, numbers) {
                let node = snapshot.node(at: index)
                let name = snapshot.name(at: index)
                out.append(
                    DirectoryEntry(name: name, inode: ino, attributes: attributes(node), nextOffset: Int64(index + 1)))
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
