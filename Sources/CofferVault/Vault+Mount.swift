import CofferModel
import CofferStore

/// What the mount daemon (the filesystem and the sync scheduler beside it) needs of the store,
/// and no more: the store stays behind the vault.
extension Vault {
    // MARK: Inodes

    // Inode numbers are the store's, stable per device across remounts; the daemon asks for
    // the ones it needs as the kernel meets them, never for the whole tree.

    /// The file an inode names, or nil if none does.
    public func fileID(ofInode inode: UInt64) throws -> FileID? {
        try store.readOne { try $0.fileID(ofInode: inode) }
    }

    /// The inode of `id`, assigned now if the file has none yet (it arrived by sync). One that
    /// exists is read without opening a write.
    public func inode(of id: FileID) throws -> UInt64 {
        try store.readOne { try $0.inode(of: id) } ?? store.write { try $0.inode(for: id) }
    }

    /// `inode(of:)` for many files, in order: one read for those that have one, one write for
    /// those that do not (a listing's next entries). The read is of committed rows on a
    /// prepared statement: through GRDB's read transaction it was a sixth of the daemon's CPU
    /// in a cold `find`; an inode assigned in the open group is found by the write.
    public func inodes(of ids: [FileID]) throws -> [UInt64] {
        var found = try store.committedInodes(of: ids)
        let missing = found.indices.filter { found[$0] == nil }
        if !missing.isEmpty {
            let assigned = try store.write { w in try missing.map { try w.inode(for: ids[$0]) } }
            for (i, ino) in zip(missing, assigned) { found[i] = ino }
        }
        return found.compactMap { $0 }
    }

    // MARK: Commits

    /// Many small operations (untar, git) share one SQLite commit, committed within `window`
    /// seconds of its first write (`longest` while writes keep coming); `makeDurable` and
    /// `disableGroupCommit` still make everything durable first (`Store.enableGroupCommit`).
    public func enableGroupCommit(window: Double = 0.05, longest: Double = 0.5) {
        store.enableGroupCommit(window: window, longest: longest)
    }

    /// Commits the open group and goes back to one commit per operation.
    public func disableGroupCommit() throws {
        try store.disableGroupCommit()
    }

    /// Takes notice of a group transaction that failed to commit since the last commit through
    /// this vault (which would notice it itself): counts it in `lostGroups` and starts over
    /// from the store.
    public func noticeLostGroup() throws {
        try state.withLock { s in
            guard store.takeLostGroup() else { return }
            lostGroups.add(1, ordering: .relaxed)
            try reloadAll(&s, lost: true)
        }
    }

    /// Waits until everything committed so far is on the device's disk (fsync).
    public func makeDurable() throws {
        try store.makeDurable()
    }

    // MARK: Changes

    /// The newest entry of the store's change log (0 for none): it moves whenever any process
    /// commits a change.
    public func lastChange() throws -> Int64 {
        try store.read { try $0.lastChange() }
    }

    /// Whether local changes wait to be pushed.
    public func hasPendingLocalChanges() throws -> Bool {
        try store.hasLocalChanges()
    }
}
