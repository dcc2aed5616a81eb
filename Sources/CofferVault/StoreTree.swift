import CofferModel
import CofferStore
import Synchronization

/// A record as the vault's tree holds it: the metadata as the tree sees it (deleted if the
/// server said so), and the server's versions the device keeps beside it.
struct TreeEntry: Sendable {
    var metadata: FileMetadata
    var version: Int64
    var contentVersion: Int64
}

extension TreeEntry {
    init(_ stored: StoredFile) {
        self.init(metadata: stored.effectiveMetadata, version: stored.version, contentVersion: stored.contentVersion)
    }
}

/// The vault's tree (local over base), read from the store as operations need it: a record by
/// id, a folder's children, a child by name MAC, a folder's live subfolders. Memory holds a
/// bounded cache of records and subfolder counts, and what this process wrote that the store's
/// readers cannot see yet (`pending`), so it does not grow with the tree.
///
/// Reads go to the store's read connections, which see what the last commit left. In the mount
/// daemon a write joins an open group transaction that commits up to half a second later
/// (`Store.enableGroupCommit`); until then its records live in `pending`, tagged with their
/// group, and every read lays them over what the store answers. Once `Store.committedGroup`
/// reaches their group they move to the cache. Without group commit a write is committed when
/// it returns, and its records go straight to the cache.
///
/// The methods of `TreeView` cannot throw: a failed store read answers "absent" and is kept
/// (`takeFailure`), and `Vault.commit` refuses a batch validated with a failed read.
final class StoreTree: TreeView, Sendable {
    let store: Store
    private let state: Mutex<State>

    init(store: Store, capacity: Int = Vault.defaultCacheEntries) {
        self.store = store
        state = Mutex(State(capacity: capacity))
    }

    /// Where a pending file stands in what the store's readers see, for subfolder counts.
    private struct Placement: Sendable {
        var parent: FileID
        var isLiveFolder: Bool

        init?(_ m: FileMetadata?) {
            guard let m, !m.isRoot else { return nil }
            parent = m.parent
            isLiveFolder = m.type == .folder && !m.isDeleted
        }
    }

    /// A place in a folder: a parent and a name MAC.
    private struct NameKey: Hashable, Sendable {
        var parent: FileID
        var mac: [UInt8]
    }

    /// A file written in groups not committed yet.
    private struct Pending: Sendable {
        /// Where the store's readers see it now (nil: absent there).
        var committed: Placement?
        /// Its writes in order, each with its group; nil entry: removed.
        var writes: [(generation: UInt64, entry: TreeEntry?)]
        /// Every parent it is filed under in `pendingUnder` (and, if it was ever a folder, in
        /// `pendingFoldersUnder`).
        var parents: Set<FileID>
        /// Every name it is filed under in `pendingNamed`.
        var names: Set<NameKey>
        /// Whether any of its states is a folder (it counts in its parents' subfolders).
        var isFolder: Bool
        var current: TreeEntry? { writes.last?.entry ?? nil }
    }

    private struct State: Sendable {
        var records: BoundedCache<FileID, TreeEntry>
        var subfolders: BoundedCache<FileID, Int>
        var pending: [FileID: Pending] = [:]
        /// Pending files by each parent they had or have: what a folder's children must lay
        /// over the store's answer.
        var pendingUnder: [FileID: Set<FileID>] = [:]
        /// The same for pending folders only, for subfolder counts: copying in a folder of
        /// files checks its parent's count once per file, over none of them.
        var pendingFoldersUnder: [FileID: Set<FileID>] = [:]
        /// Pending files by each place they had or have: a lookup by name, which every create
        /// and rename asks (twice), lays over the store's answer only these, not the folder's
        /// whole overlay (up to a group's worth of files while a folder is copied in).
        var pendingNamed: [NameKey: Set<FileID>] = [:]
        /// The group fates the last sweep saw (`Store.groupFates`).
        var swept: (committed: UInt64, lost: UInt64) = (0, 0)
        var root: FileID?
        var failure: String?
        /// Ids just drawn at random for files being created (`isNew`): the store cannot hold
        /// them, so asking it (a probe of a random page of the id index) is skipped.
        var new: Set<FileID> = []

        init(capacity: Int) {
            records = BoundedCache(capacity: capacity)
            subfolders = BoundedCache(capacity: capacity)
        }
    }

    // MARK: Reading

    /// The entry of `id`, or nil if the tree has none.
    func entry(_ id: FileID) -> TreeEntry? {
        state.withLock { s in
            sweep(&s)
            if let p = s.pending[id] { return p.current }
            if let e = s.records[id] { return e }
            if s.new.contains(id) { return nil }
            guard let found = read(&s, { try store.committedRecord(id) }) ?? nil else { return nil }
            let e = TreeEntry(found)
            s.records[id] = e
            return e
        }
    }

    func file(_ id: FileID) -> FileMetadata? { entry(id)?.metadata }

    func link(_ id: FileID) -> FileLink? {
        entry(id).map { FileLink(parent: $0.metadata.parent, isDeleted: $0.metadata.isDeleted) }
    }

    var rootID: FileID? {
        state.withLock { s in
            sweep(&s)
            if let r = s.root { return r }
            if let p = s.pending.first(where: { $0.value.current?.metadata.isRoot == true }) { return p.key }
            // The root never changes once there is one: ask the store until it has it.
            s.root = read(&s, { try store.committedRoots().sorted().first }) ?? nil
            return s.root
        }
    }

    func childIDs(of id: FileID) -> [FileID] { children(of: id, nameMAC: nil).map(\.id) }

    func childIDs(of id: FileID, nameMAC: [UInt8]) -> [FileID] { children(of: id, nameMAC: nameMAC).map(\.id) }

    /// The live children of a folder, in one query (the records come with it).
    func liveChildren(of id: FileID) -> [FileMetadata] { children(of: id, nameMAC: nil).filter { !$0.isDeleted } }

    /// The records under `id` (with name MAC `nameMAC`, if given): the store's, with what this
    /// process wrote since laid over them.
    func children(of id: FileID, nameMAC: [UInt8]?) -> [FileMetadata] {
        state.withLock { s in
            sweep(&s)
            let rows = read(&s, { try store.committedChildren(of: id, nameMAC: nameMAC) }) ?? []
            var out: [FileMetadata] = []
            out.reserveCapacity(rows.count)
            // A row named `nameMAC` that a pending write moved or renamed is filed under that
            // name too (every place a pending file had is), so the narrower set still covers it.
            let overlay =
                if let nameMAC { s.pendingNamed[NameKey(parent: id, mac: nameMAC)] ?? [] } else {
                    s.pendingUnder[id] ?? []
                }
            for row in rows {
                let e = TreeEntry(row)
                if overlay.contains(e.metadata.id) { continue }  // laid over below
                // Listing a folder caches what `stat` of each entry asks next, unless the folder
                // is larger than the cache, which it would only churn.
                if rows.count <= s.records.capacity / 4 { s.records[e.metadata.id] = e }
                out.append(e.metadata)
            }
            for pid in overlay {
                guard let m = s.pending[pid]?.current?.metadata, m.parent == id, !m.isRoot else { continue }
                if let nameMAC, m.name.mac != nameMAC { continue }
                out.append(m)
            }
            return out
        }
    }

    /// How many live folders `id` holds: a folder's link count is 2 more.
    func subfolderCount(of id: FileID) -> Int {
        state.withLock { s in
            sweep(&s)
            let stored: Int
            if let n = s.subfolders[id] {
                stored = n
            } else {
                stored = read(&s, { try store.committedSubfolderCount(of: id) }) ?? 0
                s.subfolders[id] = stored
            }
            var n = stored
            for pid in s.pending.isEmpty ? [] : s.pendingFoldersUnder[id] ?? [] {
                guard let p = s.pending[pid] else { continue }
                if let c = p.committed, c.parent == id, c.isLiveFolder { n -= 1 }
                if let now = Placement(p.current?.metadata), now.parent == id, now.isLiveFolder { n += 1 }
            }
            return max(n, 0)
        }
    }

    /// How many records the tree holds (a scan of the store; not for requests).
    var count: Int {
        state.withLock { s in
            sweep(&s)
            let stored = read(&s, { try store.committedCount() }) ?? 0
            // A pending file adds one if the store lacks it and takes one if it is now removed.
            return s.pending.values.reduce(stored) { n, p in
                n + (p.committed == nil ? 1 : 0) - (p.current == nil ? 1 : 0)
            }
        }
    }

    /// The first store read that failed since the last call, if any (see the type's comment).
    func takeFailure() -> String? {
        state.withLock { s in
            defer { s.failure = nil }
            return s.failure
        }
    }

    private func read<T>(_ s: inout State, _ body: () throws -> T) -> T? {
        do { return try body() } catch {
            if s.failure == nil { s.failure = "cannot read the tree from the store: \(error)" }
            return nil
        }
    }

    // MARK: Writing

    /// Notes that `id` was just drawn at random (128 bits) for a file about to be created: until
    /// it is written, reads of it answer "absent" without asking the store. A create that fails
    /// leaves its id here, still absent; the set is emptied if many pile up.
    func isNew(_ id: FileID) {
        state.withLock { s in
            if s.new.count >= 1024 { s.new.removeAll() }
            s.new.insert(id)
        }
    }

    /// Records what a write stored: `after` replaced `before` (nil: absent) as the record of
    /// `id`. `generation` is the write's group (`StoreWriter.groupGeneration`), nil when the
    /// write was committed before this call.
    func wrote(_ id: FileID, before: FileMetadata?, after: TreeEntry?, generation: UInt64?) {
        state.withLock { s in
            if !s.new.isEmpty { s.new.remove(id) }
            // A group that committed before this call is as good as no group.
            guard let generation, generation > store.committedGroup else {
                // Committed already, so every earlier group has too: nothing pending is newer.
                sweep(&s)
                unfile(&s, id)
                if let after { s.records[id] = after } else { s.records[id] = nil }
                forgetCounts(&s, before, after?.metadata)
                return
            }
            var p =
                s.pending[id]
                ?? Pending(committed: Placement(before), writes: [], parents: [], names: [], isFolder: false)
            p.writes.append((generation, after))
            let states = [before, after?.metadata].compactMap { $0 }
            if !p.isFolder, states.contains(where: { $0.type == .folder }) {
                p.isFolder = true
                for parent in p.parents { s.pendingFoldersUnder[parent, default: []].insert(id) }
            }
            for m in states {
                if p.parents.insert(m.parent).inserted {
                    s.pendingUnder[m.parent, default: []].insert(id)
                    if p.isFolder { s.pendingFoldersUnder[m.parent, default: []].insert(id) }
                }
                let key = NameKey(parent: m.parent, mac: m.name.mac)
                if p.names.insert(key).inserted { s.pendingNamed[key, default: []].insert(id) }
            }
            s.pending[id] = p
        }
    }

    /// Forgets what is cached of these files (other processes changed them).
    func invalidate(_ ids: some Sequence<FileID>) {
        state.withLock { s in
            // Another process wrote after this one's groups committed: fold them first, so an
            // older write of ours never lands in the cache over theirs.
            sweep(&s)
            for id in ids { s.records[id] = nil }
            s.subfolders.removeAll()
        }
    }

    /// Forgets everything cached; with `pending`, also what this process wrote and the store
    /// lost (a group that failed to commit).
    func reset(pending: Bool) {
        state.withLock { s in
            s.records.removeAll()
            s.subfolders.removeAll()
            if pending {
                s.pending = [:]
                s.pendingUnder = [:]
                s.pendingFoldersUnder = [:]
                s.pendingNamed = [:]
            }
            s.root = nil
        }
    }

    /// Moves the writes of groups that have committed from `pending` to the cache, and drops
    /// those of groups that failed to commit (the store never took them).
    private func sweep(_ s: inout State) {
        guard !s.pending.isEmpty else { return }
        let (committed, lost) = store.groupFates
        // Both only grow: a sweep is due when either moved.
        let mark = (committed: committed, lost: lost.last ?? 0)
        guard mark != s.swept else { return }
        s.swept = mark
        for (id, var p) in s.pending {
            var folded = 0
            for w in p.writes {
                if lost.contains(w.generation) {
                    folded += 1  // gone with its group: what the store's readers see is unchanged
                    continue
                }
                guard w.generation <= committed else { break }
                let was = p.committed
                p.committed = Placement(w.entry?.metadata)
                if let e = w.entry { s.records[id] = e } else { s.records[id] = nil }
                if was?.isLiveFolder == true || p.committed?.isLiveFolder == true {
                    if let parent = was?.parent { s.subfolders[parent] = nil }
                    if let parent = p.committed?.parent { s.subfolders[parent] = nil }
                }
                folded += 1
            }
            guard folded > 0 else { continue }
            p.writes.removeFirst(min(folded, p.writes.count))
            if p.writes.isEmpty {
                unfile(&s, id)
            } else {
                s.pending[id] = p
            }
        }
    }

    /// Drops `id` from `pending` and from every index that files it.
    private func unfile(_ s: inout State, _ id: FileID) {
        guard let p = s.pending.removeValue(forKey: id) else { return }
        for parent in p.parents {
            Self.remove(id, at: parent, from: &s.pendingUnder)
            if p.isFolder { Self.remove(id, at: parent, from: &s.pendingFoldersUnder) }
        }
        for key in p.names { Self.remove(id, at: key, from: &s.pendingNamed) }
    }

    private static func remove<K: Hashable>(_ id: FileID, at key: K, from index: inout [K: Set<FileID>]) {
        guard index[key]?.remove(id) != nil, index[key]?.isEmpty == true else { return }
        index[key] = nil
    }

    private func forgetCounts(_ s: inout State, _ before: FileMetadata?, _ after: FileMetadata?) {
        for m in [before, after].compactMap({ $0 }) where m.type == .folder && !m.isRoot {
            s.subfolders[m.parent] = nil
        }
    }
}
