import CofferFuse
import CofferModel
import CofferVault
import Synchronization

/// Inode numbers and the kernel's references to them: the one place for reference counting.
///
/// A file's inode number is a keyed hash of its id (docs/FILESYSTEM.md, "Inode numbers"), so
/// numbering asks the store nothing and writes nothing: not at a create, not for each entry of
/// a listing. The key is this store's (`Vault.inodeNumbering`), so numbers stay the same across
/// remounts and no id chosen elsewhere can be picked to collide. Should a file's hash be a
/// number the kernel holds for another file, the file is given a number of its own for good
/// (an exception, kept in the store).
///
/// Memory grows with what the kernel holds, never with the tree: nothing is loaded at mount
/// but the exceptions (in practice none). After `ls -lR` the kernel may hold every inode of
/// the tree (it keeps them until memory is short), so an inode it holds costs only what
/// `ReferenceTable` keeps: its file id and lookup count, found by number or by id, 45-60 bytes
/// (docs/FILESYSTEM.md, "Memory per file"). Names the kernel learned live in a bounded cache.
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
        var names: BoundedCache<InodeNumber, KnownName>
        /// Files numbered other than by their hash.
        var exceptions: [FileID: InodeNumber] = [:]
        var nextException: InodeNumber
        /// The root's id; `.none` until a root arrives (a device whose first pull is pending).
        var root: FileID
    }

    /// Entries the names cache keeps at most: a few MB, enough for a working set of folders.
    static let cacheCapacity = 1 << 14
    /// Hashes are numbers in [2, 2^62); exceptions are numbered from 2^62 up, so the two never
    /// meet. Every number is below 2^63, which a tool keeping st_ino in a signed 64-bit integer
    /// still reads right.
    static let firstException: InodeNumber = 1 << 62

    private let state: Mutex<State>
    private let hash: @Sendable (FileID) -> UInt64
    let vault: Vault

    /// `hash` stands in for the keyed hash (tests make files collide with it).
    init(
        vault: Vault, cacheCapacity: Int = InodeTable.cacheCapacity, hash: (@Sendable (FileID) -> UInt64)? = nil
    ) throws {
        self.vault = vault
        let numbering = try vault.inodeNumbering()
        self.hash = hash ?? numbering.hash
        var s = State(
            names: BoundedCache(capacity: cacheCapacity), nextException: Self.firstException, root: vault.rootID)
        for (id, ino) in numbering.exceptions where ino >= Self.firstException && ino < InodeNumber(Int64.max) {
            s.exceptions[id] = ino
            s.nextException = max(s.nextException, ino + 1)
        }
        state = Mutex(s)
    }

    /// The root's id, looked for again while there is none.
    private func root(_ s: inout State) -> FileID {
        if s.root == .none { s.root = vault.rootID }
        return s.root
    }

    /// The file behind an inode the kernel holds (the root always); nil for any other number,
    /// which the kernel never sends (it holds every inode it asks about, and export support,
    /// which would let it ask about others, is off).
    func fileID(_ ino: InodeNumber) -> FileID? {
        state.withLock { s in
            if ino == FuseRootInode {
                let r = root(&s)
                return r == .none ? nil : r
            }
            return s.referenced.fileID(ino)
        }
    }

    /// The inode of `id`, chosen under the lock: the root's 1, else the number the kernel holds
    /// for it, its exception, or its hash. A hash below 2, or one the kernel holds for another
    /// file, makes an exception, in memory at once (`given`, for the caller to store once the
    /// lock is released: a store write may wait on another process, and every request would
    /// wait behind the lock meanwhile).
    private func number(_ id: FileID, _ s: inout State, given: inout [(FileID, InodeNumber)]) -> InodeNumber {
        if id == root(&s) { return FuseRootInode }
        if let held = s.referenced.inode(of: id) { return held }
        if let exception = s.exceptions[id] { return exception }
        let hashed = hash(id) & (Self.firstException - 1)
        if hashed >= 2 && s.referenced.fileID(hashed) == nil { return hashed }
        let exception = s.nextException
        s.exceptions[id] = exception
        s.nextException = exception + 1
        given.append((id, exception))
        return exception
    }

    /// Keeps the exceptions just given for later mounts. In this mount they hold already (in
    /// memory), so a failed write costs only their numbers at the next mount, when the kernel
    /// holds nothing: it is not an error of the request that made them.
    private func store(_ given: [(FileID, InodeNumber)]) {
        for (id, ino) in given { try? vault.addInodeException(id, ino) }
    }

    /// One more kernel reference to `id`'s inode, which the kernel will know as `name` in the
    /// folder `parent`: an entry reply (lookup, create, readdirplus) is about to be sent. The
    /// number is chosen and counted in one step, so two files can never be handed the same
    /// one, and before the reply, so a forget crossing it can never take the count below what
    /// the kernel holds.
    func reference(_ id: FileID, parent: InodeNumber, name: String) -> InodeNumber {
        var given: [(FileID, InodeNumber)] = []
        let ino = state.withLock { s in
            let ino = number(id, &s, given: &given)
            count(ino, id, as: name, in: parent, &s)
            return ino
        }
        store(given)
        return ino
    }

    /// One kernel reference more to `ino` (not the root's, which the kernel never counts),
    /// known as `name` in `parent`.
    private func count(_ ino: InodeNumber, _ id: FileID, as name: String, in parent: InodeNumber, _ s: inout State) {
        guard ino != FuseRootInode else { return }
        s.referenced.add(ino, id: id)
        s.names[ino] = KnownName(parent: parent, name: name)
    }

    /// The inodes of a listing's entries, in order, under one lock. An entry with a name gains
    /// a reference as `reference` gives one (readdirplus); "." and ".." (no name) never do.
    /// Nothing here can fail, so every reference counted is one the reply carries.
    func listing(_ entries: [(id: FileID, name: String?)], parent: InodeNumber) -> [InodeNumber] {
        var given: [(FileID, InodeNumber)] = []
        let numbers = state.withLock { s in
            entries.map { e in
                let ino = number(e.id, &s, given: &given)
                if let name = e.name { count(ino, e.id, as: name, in: parent, &s) }
                return ino
            }
        }
        store(given)
        return numbers
    }

    /// The inode of a file if the kernel holds it (the root always).
    func referencedInode(for id: FileID) -> InodeNumber? {
        state.withLock { s in id == root(&s) ? FuseRootInode : s.referenced.inode(of: id) }
    }

    /// Drops `n` kernel references. When none are left the entry goes, and its file is
    /// returned (the caller releases what it kept for the kernel).
    func forget(_ ino: InodeNumber, _ n: UInt64) -> FileID? {
        state.withLock { s in
            guard let id = s.referenced.remove(n, from: ino) else { return nil }
            s.names[ino] = nil
            return id
        }
    }

    /// The kernel moved its dentry for `id` (a rename through the mount), if the name is known.
    func moved(_ id: FileID, to parent: InodeNumber, name: String) {
        state.withLock { s in
            guard let ino = s.referenced.inode(of: id), s.names[ino] != nil else { return }
            s.names[ino] = KnownName(parent: parent, name: name)
        }
    }

    /// The name the kernel last learned for `ino`, kept.
    func knownName(_ ino: InodeNumber) -> KnownName? {
        state.withLock { $0.names[ino] }
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

    /// Entries held: the kernel's references, and the names cache (bounded).
    var counts: (referenced: Int, names: Int) {
        state.withLock { ($0.referenced.count, $0.names.count) }
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
        /// 0: never used (no file has inode 0); `removed`: used before (every inode is below
        /// 2^63, `InodeTable.firstException`).
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
