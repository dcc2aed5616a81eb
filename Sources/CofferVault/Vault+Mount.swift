import CofferCrypto
import CofferModel
import CofferStore

/// What the mount daemon (the filesystem and the sync scheduler beside it) needs of the store,
/// and no more: the store stays behind the vault.
extension Vault {
    // MARK: Inodes

    /// The settings row holding the key inode numbers are hashed under.
    static let inodeKeySetting = "inode-key"

    /// What the mount numbers inodes with (docs/FILESYSTEM.md, "Inode numbers"): this store's
    /// key, made the first time, and the files given another number because their hash was
    /// taken (in practice none). The key never leaves the store, so no id chosen elsewhere can
    /// be picked to collide, and numbers stay the same across remounts. A damaged key is
    /// replaced (numbers are this device's alone, and change once, as at the first mount).
    public func inodeNumbering() throws -> (key: [UInt8], exceptions: [(id: FileID, inode: UInt64)]) {
        let (stored, exceptions) = try store.read { r in
            (try r.setting(Self.inodeKeySetting), try r.inodeExceptions())
        }
        if let stored, stored.count == shortHashKeyBytes { return (stored, exceptions) }
        let key = try store.write { w in
            // Another process may have made it meanwhile: the first one stays.
            if let made = try w.reader.setting(Self.inodeKeySetting), made.count == shortHashKeyBytes { return made }
            let fresh = randomBytes(shortHashKeyBytes)
            try w.setSetting(Self.inodeKeySetting, fresh)
            return fresh
        }
        return (key, exceptions)
    }

    /// Gives `id` the inode number `inode` in place of its hash, for good.
    public func addInodeException(_ id: FileID, _ inode: UInt64) throws {
        try store.write { try $0.addInodeException(id, inode) }
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
