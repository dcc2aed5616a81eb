import CofferModel
import CofferStore

/// What the mount daemon (the filesystem and the sync scheduler beside it) needs of the store,
/// and no more: the store stays behind the vault.
extension Vault {
    // MARK: Inodes

    /// Every file's inode, as the store assigned them (stable per device, across remounts).
    public func allInodes() throws -> [(inode: UInt64, id: FileID)] {
        try store.read { try $0.allInodes() }.map { (inode: $0.0, id: $0.1) }
    }

    /// The file an inode names, or nil if none does.
    public func fileID(ofInode inode: UInt64) throws -> FileID? {
        try store.readOne { try $0.fileID(ofInode: inode) }
    }

    /// The inode of `id`, assigned now if the file has none yet (it arrived by sync). One that
    /// exists is read without opening a write.
    public func inode(of id: FileID) throws -> UInt64 {
        try store.readOne { try $0.inode(of: id) } ?? store.write { try $0.inode(for: id) }
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
