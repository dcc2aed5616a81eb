import CofferCrypto
import CofferModel
import CofferStore

/// What the mount daemon (the filesystem and the sync scheduler beside it) needs of the store,
/// and no more: the store stays behind the vault.
extension Vault {
    // MARK: Inodes

    /// The settings row holding the key inode numbers are hashed under.
    static let inodeKeySetting = "inode-key"

    /// What the mount numbers inodes with (docs/FILESYSTEM.md, "Inode numbers"): SipHash-2-4
    /// of a file's id under this store's key, made the first time, and the files given another
    /// number because their hash was taken (in practice none). The key never leaves the vault,
    /// so no id chosen elsewhere can be picked to collide, and numbers stay the same across
    /// remounts. A damaged key is replaced (numbers are this device's alone, and change once,
    /// as at the first mount).
    public func inodeNumbering() throws -> InodeNumbering {
        let (stored, exceptions) = try store.read { r in
            (try r.setting(Self.inodeKeySetting), try r.inodeExceptions())
        }
        let key: [UInt8]
        if let stored, stored.count == shortHashKeyBytes {
            key = stored
        } else {
            key = try store.write { w in
                // Another process may have made it meanwhile: the first one stays.
                if let made = try w.reader.setting(Self.inodeKeySetting), made.count == shortHashKeyBytes {
                    return made
                }
                let fresh = randomBytes(shortHashKeyBytes)
                try w.setSetting(Self.inodeKeySetting, fresh)
                return fresh
            }
        }
        // The key's length, the one thing that could fail, is checked above.
        return InodeNumbering(hash: { id in (try? shortHash(id.bytes, key: key)) ?? 0 }, exceptions: exceptions)
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

    /// The store's database file: every commit of every process writes its log (the same path
    /// with `-wal`), which is how the mount notices changes made by others without polling.
    public var storeDatabasePath: String { store.databasePath }

    /// Whether local changes wait to be pushed.
    public func hasPendingLocalChanges() throws -> Bool {
        try store.hasLocalChanges() || store.readOne { try $0.hasSharedLocal() }
    }
}

/// A store's inode numbering (`Vault.inodeNumbering`).
public struct InodeNumbering: Sendable {
    /// The keyed hash of a file id, all 64 bits (the mount keeps the range it uses).
    public let hash: @Sendable (FileID) -> UInt64
    /// Files numbered other than by their hash.
    public let exceptions: [(id: FileID, inode: UInt64)]
}
