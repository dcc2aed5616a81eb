import CofferFuse
import CofferModel
import CofferVault
import Synchronization

/// Inode numbers and the kernel's references to them: the one place for reference counting.
///
/// Memory grows with what the kernel holds, never with the tree: nothing is loaded at mount,
/// and the store (one indexed query) answers whatever the table does not hold. After `ls -lR`
/// the kernel may hold every inode of the tree (it keeps them until memory is short), so an
/// inode it holds costs only what `ReferenceTable` keeps: its file id and lookup count, found
/// by number or by id, 45-60 bytes (docs/FILESYSTEM.md, "Memory per file"). Names the
/// kernel learned, and recent files' inodes, live in bounded caches (`BoundedCache`).
///
/// Inode numbers are the store's (`StoreWriter.inode(for:)`): never reused, never changed for
/// a file, and a file loses its row only when it is pruned for good. So a cached pair can only
/// be missing, never wrong, and an inode the kernel holds is never handed out for another file.
final class InodeTable: Sendable {
    /// The (parent inode, name) the kernel last learned for an inode, to invalidate its dentry
    /// when the file changes behind the kernel's back.
    struct KnownName {
        let parent: InodeNumber
        let name: String
    }

    private struct State {
        /// Inodes the kernel holds. The root is not here: the kernel holds it for the life of
        /// the mount without ever looking it up.
        var referenced = ReferenceTable()
        /// Recent files' inodes, so what was just listed or created asks the store nothing
        /// when the kernel looks it up.
        var inodes: BoundedCache<FileID, InodeNumber>
        var names: BoundedCache<InodeNumber, KnownName>
    }

    /// Entries each cache keeps at most: a few MB, enough for a working set of folders.
    static let cacheCapacity = 1 << 14

    private let state: Mutex<State>
    let vault: Vault
    let rootID: FileID

    init(vault: Vault, cacheCapacity: Int = InodeTable.cacheCapacity) {
        self.vault = vault
        self.rootID = vault.rootID
        state = Mutex(
            State(inodes: BoundedCache(capacity: cacheCapacity), names: BoundedCache(capacity: cacheCapacity)))
    }

    /// The file behind an inode: the kernel's references, then the store (for a number the
    /// table does not hold, which the kernel should not send, but which still names the same
    /// file if it does). Nil if no file has that number (any more).
    func fileID(_ ino: InodeNumber) -> FileID? {
        // A vault whose root had not arrived yet at mount finds it in the store (inode 1).
        if ino == FuseRootInode && rootID != .none { return rootID }
        if let id = state.withLock({ $0.referenced.fileID(ino) }) { return id }
        guard let id = try? vault.fileID(ofInode: ino) else { return nil }
        learn(ino, for: id)
        return id
    }

    /// In memory: the root, an inode the kernel holds, or a recent one.
    private func known(_ id: FileID, _ s: inout State) -> InodeNumber? {
        if id == rootID { return FuseRootInode }
        return s.referenced.inode(of: id) ?? s.inodes[id]
    }

    /// The inode of a file, assigned now if it has none yet (it arrived by sync). Files created
    /// through the mount are learned at their create (`createNode`); one another process
    /// created already has its row, read without opening a write.
    func inode(for id: FileID) throws -> InodeNumber {
        if let ino = state.withLock({ known(id, &$0) }) { return ino }
        let ino = try vault.inode(of: id)
        learn(ino, for: id)
        return ino
    }

    /// `inode(for:)` of many files (a listing's next entries), with one store transaction for
    /// those not in memory rather than one each.
    func inodes(for ids: [FileID]) throws -> [InodeNumber] {
        var out: [InodeNumber?] = state.withLock { s in ids.map { known($0, &s) } }
        let missing = out.indices.filter { out[$0] == nil }
        if !missing.isEmpty {
            let found = try vault.inodes(of: missing.map { ids[$0] })
            state.withLock { s in
                for (i, ino) in zip(missing, found) {
                    out[i] = ino
                    s.inodes[ids[i]] = ino
                }
            }
        }
        let all = out.compactMap { $0 }
        guard all.count == ids.count else { throw FSError.io }
        return all
    }

    /// The inode of a file if the kernel holds it (the root always); never asks the store,
    /// since every inode the kernel holds is in the table.
    func referencedInode(for id: FileID) -> InodeNumber? {
        if id == rootID { return FuseRootInode }
        return state.withLock { $0.referenced.inode(of: id) }
    }

    /// Records which inode a file has (assigned by the store, never changed).
    func learn(_ ino: InodeNumber, for id: FileID) {
        state.withLock { $0.inodes[id] = ino }
    }

    /// One more kernel reference: an entry reply for `ino` (lookup, create, readdirplus) is
    /// about to be sent, and the kernel will know it as `name` in the folder `parent`. Counted
    /// before the reply, so a forget crossing it can never take the count below what the
    /// kernel holds.
    func addLookup(_ ino: InodeNumber, id: FileID, parent: InodeNumber, name: String) {
        guard ino != FuseRootInode else { return }
        state.withLock { s in
            s.referenced.add(ino, id: id)
            s.names[ino] = KnownName(parent: parent, name: name)
        }
    }

    /// Drops `n` kernel references. When none are left the entry goes, and its file is
    /// returned (the caller releases what it kept for the kernel).
    func forget(_ ino: InodeNumber, _ n: UInt64) -> FileID? {
        state.withLock { s in
            guard let id = s.referenced.remove(n, from: ino) else { return nil }
            s.names[ino] = nil
            // Recent: the kernel may well look it up again soon.
            s.inodes[id] = ino
            return id
        }
    }

    func isReferenced(_ ino: InodeNumber) -> Bool {
        ino == FuseRootInode || state.withLock { $0.referenced.fileID(ino) != nil }
    }

    /// The kernel moved its dentry for `id` (a rename through the mount), if the name is known.
    func moved(_ id: FileID, to parent: InodeNumber, name: String) {
        state.withLock { s in
            guard let ino = known(id, &s), s.names[ino] != nil else { return }
            s.names[ino] = KnownName(parent: parent, name: name)
        }
    }

    /// The name the kernel last learned for `ino`, forgotten: its dentry is being invalidated,
    /// and the kernel's next lookup teaches it again.
    func takeKnownName(_ ino: InodeNumber) -> KnownName? {
        state.withLock { s in
            guard let known = s.names[ino] else { return nil }
            s.names[ino] = nil
            return known
        }
    }

    /// Entries held: the kernel's references, and the two caches (bounded).
    var counts: (referenced: Int, cachedInodes: Int, names: Int) {
        state.withLock { ($0.referenced.count, $0.inodes.count, $0.names.count) }
    }
}

/// The inodes the kernel holds and their exact lookup counts (each entry reply adds one,
/// `forget` takes back what the kernel says; `FileSystemOperations`), found by number (every
/// request) and by file id (entry replies, the change watcher), each file id stored once.
///
/// Two open-addressing tables of the same size, with linear probing: `entries` placed by inode
/// number holds each inode's 32 bytes, and `byID` placed by file id holds 4-byte positions in
/// `entries`. Between 0.6 and 0.8 of the slots are used, so an inode costs 45-60 bytes. Swift
/// dictionaries would cost more: their slots are a power of two, a quarter to three quarters
/// used, so 43-85 bytes for the inode-keyed one alone and as much again for one keyed by id.
/// Both tables shrink again when the kernel forgets most of what it held.
struct ReferenceTable {
    private struct Entry {
        /// 0: never used (no file has inode 0); `removed`: used before (a store inode is at
        /// most Int64.max).
        var ino: InodeNumber
        var id: FileID
        var lookups: UInt64
    }

    private static let removed = InodeNumber.max
    /// `byID`'s marks; any other value is a position in `entries` plus one.
    private static let emptyPosition: UInt32 = 0
    private static let removedPosition = UInt32.max
    private static let smallest = 64

    private var entries: [Entry] = []
    private var byID: [UInt32] = []
    private(set) var count = 0
    /// Slots not empty (held and removed), in each table: a probe ends only at an empty one.
    private var usedEntries = 0
    private var usedByID = 0

    func fileID(_ ino: InodeNumber) -> FileID? { position(of: ino).map { entries[$0].id } }

    func inode(of id: FileID) -> InodeNumber? { slot(of: id).map { entries[Int(byID[$0]) - 1].ino } }

    /// One more reference to `ino`, which names `id`.
    mutating func add(_ ino: InodeNumber, id: FileID) {
        if let p = position(of: ino) {
            entries[p].lookups += 1
            return
        }
        // At most 0.8 of the slots used (4 in 5), so a probe ends soon.
        if (max(usedEntries, usedByID) + 1) * 5 > entries.count * 4 { rebuild(holding: count + 1) }
        insert(Entry(ino: ino, id: id, lookups: 1))
    }

    /// Takes `n` references from `ino`; when none are left it goes, and its file is returned.
    mutating func remove(_ n: UInt64, from ino: InodeNumber) -> FileID? {
        guard let p = position(of: ino) else { return nil }
        let e = entries[p]
        guard e.lookups <= n else {
            entries[p].lookups = e.lookups - n
            return nil
        }
        // The id's slot is the one holding this position.
        var i = home(e.id.hashValue)
        while byID[i] != Self.emptyPosition {
            if Int(byID[i]) == p + 1 {
                byID[i] = Self.removedPosition
                break
            }
            i = next(i)
        }
        entries[p].ino = Self.removed
        count -= 1
        if entries.count > Self.smallest && count * 8 < entries.count { rebuild(holding: count) }
        return e.id
    }

    private func position(of ino: InodeNumber) -> Int? {
        guard !entries.isEmpty else { return nil }
        var i = home(ino.hashValue)
        while entries[i].ino != 0 {
            if entries[i].ino == ino { return i }
            i = next(i)
        }
        return nil
    }

    /// The `byID` slot holding the position of `id`'s entry.
    private func slot(of id: FileID) -> Int? {
        guard !byID.isEmpty else { return nil }
        var i = home(id.hashValue)
        while byID[i] != Self.emptyPosition {
            if byID[i] != Self.removedPosition {
                let e = entries[Int(byID[i]) - 1]
                if e.id == id && e.ino != Self.removed { return i }
            }
            i = next(i)
        }
        return nil
    }

    /// Where a probe starts. Hashes are seeded per process, so ids chosen elsewhere (a sync
    /// brings any) cannot be made to collide.
    private func home(_ hash: Int) -> Int { Int(UInt(bitPattern: hash) % UInt(entries.count)) }

    private func next(_ i: Int) -> Int { i + 1 == entries.count ? 0 : i + 1 }

    private mutating func insert(_ e: Entry) {
        var i = home(e.ino.hashValue)
        while entries[i].ino != 0 && entries[i].ino != Self.removed { i = next(i) }
        if entries[i].ino == 0 { usedEntries += 1 }
        entries[i] = e
        var j = home(e.id.hashValue)
        while byID[j] != Self.emptyPosition && byID[j] != Self.removedPosition { j = next(j) }
        if byID[j] == Self.emptyPosition { usedByID += 1 }
        // Positions fit: 2^32 entries would take 128 GiB.
        byID[j] = UInt32(truncatingIfNeeded: i + 1)
        count += 1
    }

    /// Both tables anew with `n` inodes using 0.6 of the slots, removed slots cleared: growing
    /// by a third at 0.8, each entry is moved a few times in all.
    ///
    /// The entries move straight from the old table (a filtered copy first was a third table
    /// at once: the daemon's peak after `ls -lR` of a million files was 248 MiB against 184
    /// after); the old position index goes before the new one is made. What the old tables
    /// leave free goes back to the system with the rest (`MountService.returnFreedMemory`).
    private mutating func rebuild(holding n: Int) {
        let old = entries
        let size = max(Self.smallest, n * 5 / 3)
        byID = []
        entries = [Entry](repeating: Entry(ino: 0, id: .none, lookups: 0), count: size)
        byID = [UInt32](repeating: Self.emptyPosition, count: size)
        count = 0
        usedEntries = 0
        usedByID = 0
        for e in old where e.ino != 0 && e.ino != Self.removed { insert(e) }
    }
}
