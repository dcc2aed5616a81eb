import CofferCrypto
import CofferModel

/// Where a file's key comes from when it does not come through its parent's key: the account's
/// access entry on the root today; with sharing, an access entry on whatever file was shared.
protocol KeyAccess: Sendable {
    /// The key `file` grants this device directly, or nil if it must be unwrapped with the parent's.
    func directKey(of file: FileMetadata) throws -> SymmetricKey?
}

extension KeyAccess {
    /// Every key `id` had in any of its records `versions` gives (held, unpushed, pulled...),
    /// each unwrapped under every such key of its parent, found the same way: what was sealed
    /// under a key a rotation has since replaced opens with one of these. `memo` keeps what was
    /// found per file (a cycle finds nothing more).
    func keysEver(
        _ id: FileID, depth: Int = 0, memo: inout [FileID: [SymmetricKey]],
        versions: (FileID) throws -> [FileMetadata]
    ) throws -> [SymmetricKey] {
        if let k = memo[id] { return k }
        memo[id] = []
        var out: [SymmetricKey] = []
        for v in try versions(id) {
            if let k = try? directKey(of: v) {
                if !out.contains(k) { out.append(k) }
                continue
            }
            guard !v.isRoot, depth <= TreeLimits.maxDepth else { continue }
            for parentKey in try keysEver(v.parent, depth: depth + 1, memo: &memo, versions: versions) {
                if let k = try? KeyWrap.unwrap(v.wrappedKey, with: parentKey, fileID: id.bytes), !out.contains(k) {
                    out.append(k)
                }
            }
        }
        memo[id] = out
        return out
    }
}

/// The account's own access: its entry on the root, sealed to its box key.
struct AccountKeyAccess: KeyAccess {
    let account: AccountID
    let box: BoxKeyPair

    func directKey(of file: FileMetadata) throws -> SymmetricKey? {
        guard file.isRoot, let entry = file.access.first(where: { $0.account == account && !$0.isDeleted }) else {
            return nil
        }
        return try box.open(sealedKey: entry.sealedKey, fileID: file.id.bytes)
    }
}

/// A tree a keyed view can put records in: the vault's and the merge's whole trees, or a batch
/// staged on top of one.
protocol StagingTree: TreeView {
    mutating func upsert(_ m: FileMetadata)
    /// Takes a record out of the tree altogether.
    mutating func drop(_ id: FileID)
}

extension FileTree: StagingTree {
    mutating func upsert(_ m: FileMetadata) { insert(m) }
    mutating func drop(_ id: FileID) { remove(id) }
}

extension Batch: StagingTree {
    mutating func upsert(_ m: FileMetadata) { upsertUnchecked(m) }
    mutating func drop(_ id: FileID) { removeUnchecked(id) }
}

/// What a keyed view has decrypted, by file id, each map bounded (`capacity` entries), so
/// memory does not grow with the tree.
struct KeyCache: Sendable {
    var keys: BoundedCache<FileID, SymmetricKey>
    var names: BoundedCache<FileID, String>
    var attributes: BoundedCache<FileID, PosixAttributes>
    /// The latest stamp of any attributes this view opened: a stamp issued after seeing them
    /// must be later (`Vault.nextStamp`).
    var latestStamp = HybridTimestamp.zero

    init(capacity: Int = Vault.defaultCacheEntries) {
        keys = BoundedCache(capacity: capacity)
        names = BoundedCache(capacity: capacity)
        attributes = BoundedCache(capacity: capacity)
    }

    /// Forgets what `old` sealed that `new` seals differently. Keys stay while a file keeps its
    /// key (a move wraps the same key under the new parent's), as a merged tree may hold a cycle
    /// until the merge undoes it, where no key could be derived again (the merge's view has an
    /// unbounded cache for that reason). A record wrapping some other key at the same
    /// generation gains nothing: whatever it seals fails to open under the file's key. A new
    /// key generation drops the file's key (a rotation gives every file below a new
    /// generation too, so each drops its own); a changed access list (a key granted directly,
    /// `KeyAccess`) drops every cached key.
    mutating func forget(from old: FileMetadata, to new: FileMetadata) {
        if old.access != new.access { keys.removeAll() }
        if old.keyGeneration != new.keyGeneration { keys[new.id] = nil }
        if old.name != new.name || old.parent != new.parent { names[new.id] = nil }
        if old.sealedAttributes != new.sealedAttributes { attributes[new.id] = nil }
    }

    /// Forgets the names and attributes of `id` (its record changed in ways not known here).
    mutating func forget(_ id: FileID) {
        names[id] = nil
        attributes[id] = nil
    }
}

/// One tree seen with keys: file keys unwrapped along the parent chain (or granted directly,
/// `KeyAccess`), names and attributes opened and sealed, paths described for errors, and what
/// was decrypted cached. It reads the tree only through `TreeView`, so the same view serves the
/// vault's tree, the base, a pull's merged tree, or a batch staged on one (`staged`), and a tree
/// kept in the store later.
///
/// The caches belong to the view. `put` and `remove` keep them right for the records they
/// replace; a record new to the tree keeps what its creator cached for it (its key, name and
/// attributes are exactly what it sealed), as nothing else can have cached an unknown id.
struct KeyedTree<Tree: TreeView> {
    var tree: Tree
    var cache = KeyCache()
    let access: any KeyAccess

    /// The view with `tree` as the base of a new batch, keeping what was decrypted; with
    /// `capacity`, with a cache of its own that large instead.
    func staged(capacity: Int? = nil) -> KeyedTree<Batch<Tree>> {
        KeyedTree<Batch<Tree>>(
            tree: Batch(base: tree), cache: capacity.map { KeyCache(capacity: $0) } ?? cache, access: access)
    }

    /// A file's key: from the cache, else unwrapped downwards from the nearest ancestor whose key
    /// is known or granted directly (a loop, not recursion: trees may be deep).
    mutating func key(_ id: FileID) throws -> SymmetricKey {
        if let k = cache.keys[id] { return k }
        var chain: [FileMetadata] = []
        var cursor = id
        var key: SymmetricKey
        while true {
            guard let m = tree.file(cursor) else {
                throw chain.isEmpty ? TreeError.notFound(id.description) : TreeError.orphan(id.description)
            }
            if let k = try access.directKey(of: m) {
                key = k
                cache.keys[cursor] = k
                break
            }
            if m.isRoot { throw VaultError.corrupt("the root folder has no key for this account") }
            chain.append(m)
            if let k = cache.keys[m.parent] {
                key = k
                break
            }
            // Deeper than any valid tree: a cycle, which validation refuses later.
            if chain.count > 10_000 { throw TreeError.cycle(id.description) }
            cursor = m.parent
        }
        for m in chain.reversed() {
            key = try KeyWrap.unwrap(m.wrappedKey, with: key, fileID: m.id.bytes)
            cache.keys[m.id] = key
        }
        return key
    }

    mutating func name(_ id: FileID) throws -> String {
        if let n = cache.names[id] { return n }
        guard let m = tree.file(id) else { throw TreeError.notFound(id.description) }
        let n = try openName(m)
        cache.names[id] = n
        return n
    }

    /// The attributes of a file in the tree; `adjust` changes them once, before they are cached.
    mutating func attributes(
        _ id: FileID, adjust: (inout PosixAttributes) -> Void = { _ in }
    ) throws
        -> PosixAttributes
    {
        if let a = cache.attributes[id] { return a }
        guard let m = tree.file(id) else { throw TreeError.notFound(id.description) }
        var a = try openAttributes(m)
        adjust(&a)
        cache.attributes[id] = a
        return a
    }

    /// The names and attributes of `children`, records whose parent is `parent`, in order (a
    /// folder's listing). The parent's key is found once and each child's key unwrapped from
    /// the record in hand: `name` and `attributes` would look each child up in the tree three
    /// more times, a sixth of a cold `find`'s CPU. Cached as those cache them; `adjust` as in
    /// `attributes`.
    mutating func open(
        children: [FileMetadata], of parent: FileID, adjust: (FileID, inout PosixAttributes) -> Void
    ) throws -> [(name: String, attributes: PosixAttributes)] {
        // Only if something is not cached: a listing served from the caches unwraps nothing.
        var parentKeyFound: SymmetricKey?
        func parentKey() throws -> SymmetricKey {
            if let k = parentKeyFound { return k }
            let k = try key(parent)
            parentKeyFound = k
            return k
        }
        var out: [(name: String, attributes: PosixAttributes)] = []
        out.reserveCapacity(children.count)
        for m in children {
            guard m.parent == parent, !m.isRoot else {
                out.append((try name(m.id), try attributes(m.id) { adjust(m.id, &$0) }))
                continue
            }
            let name: String
            if let n = cache.names[m.id] {
                name = n
            } else {
                name = try openName(m, parentKey: parentKey())
                cache.names[m.id] = name
            }
            if let a = cache.attributes[m.id] {
                out.append((name, a))
                continue
            }
            let key: SymmetricKey
            if let k = cache.keys[m.id] {
                key = k
            } else {
                key = try access.directKey(of: m) ?? KeyWrap.unwrap(m.wrappedKey, with: parentKey(), fileID: m.id.bytes)
                cache.keys[m.id] = key
            }
            var a = try openAttributes(m, key: key)
            adjust(m.id, &a)
            cache.attributes[m.id] = a
            out.append((name, a))
        }
        return out
    }

    /// The name a record carries, which need not be the tree's record of that file (a pulled or
    /// local version of it), sealed under its parent's key in this tree. Not cached.
    mutating func openName(_ m: FileMetadata) throws -> String {
        try openName(m, parentKey: key(m.parent))
    }

    private func openName(_ m: FileMetadata, parentKey: SymmetricKey) throws -> String {
        let raw = try AEAD.open(
            m.name.ciphertext, key: parentKey, purpose: .name, fileID: m.id.bytes, what: "file name")
        return String(decoding: raw, as: UTF8.self)
    }

    /// The attributes a record carries (as `openName`, under the file's key). Not cached.
    mutating func openAttributes(_ m: FileMetadata) throws -> PosixAttributes {
        try openAttributes(m, key: key(m.id))
    }

    private mutating func openAttributes(_ m: FileMetadata, key: SymmetricKey) throws -> PosixAttributes {
        let a = try PosixAttributes(
            decoding: AEAD.open(
                m.sealedAttributes, key: key, purpose: .attributes, fileID: m.id.bytes, what: "file attributes"))
        cache.latestStamp = max(cache.latestStamp, a.mtime.stamp, a.atime.stamp, a.mode.stamp, a.uid.stamp, a.gid.stamp)
        return a
    }

    mutating func sealAttributes(_ a: PosixAttributes, of id: FileID) throws -> [UInt8] {
        a.sealed(key: try key(id), of: id)
    }

    /// Opens a record's attributes, changes them and seals them back into it.
    mutating func changeAttributes(_ m: inout FileMetadata, _ change: (inout PosixAttributes) -> Void) throws {
        var a = try openAttributes(m)
        change(&a)
        m.sealedAttributes = try sealAttributes(a, of: m.id)
    }

    /// `name` sealed under the file's own key, for its grantees (`FileMetadata.shareName`).
    mutating func sealShareName(_ name: String, of id: FileID) throws -> [UInt8] {
        AEAD.seal(Array(name.utf8), key: try key(id), purpose: .shareName, fileID: id.bytes)
    }

    mutating func sealName(_ name: String, in parent: FileID, of id: FileID) throws -> SealedName {
        SealedName(sealing: name, parentKey: try key(parent), of: id)
    }

    /// What a child of `parent` called `name` is found by.
    mutating func nameMAC(_ name: String, in parent: FileID) throws -> [UInt8] {
        NameMAC.mac(name: name, parentKey: try key(parent))
    }

    /// `key` wrapped for `id` under `parent`'s key.
    mutating func wrap(_ key: SymmetricKey, of id: FileID, in parent: FileID) throws -> [UInt8] {
        KeyWrap.wrap(key, with: try self.key(parent), fileID: id.bytes)
    }

    /// A path for messages; best effort (a name that does not open shows as the file's id).
    mutating func path(_ id: FileID) -> String {
        var parts: [String] = []
        var cursor = id
        while let m = tree.file(cursor), !m.isRoot, parts.count < 4096 {
            parts.append((try? name(cursor)) ?? cursor.description)
            cursor = m.parent
        }
        return "/" + parts.reversed().joined(separator: "/")
    }

    /// `path` for a validator's error messages, over the tree as it is now. Without the caches:
    /// a closure holding them would make the next write to them copy them whole.
    var describe: Validator.Describe {
        let tree = tree
        let access = access
        return { id in
            var view = KeyedTree(tree: tree, access: access)
            return view.path(id)
        }
    }
}

extension KeyedTree: Sendable where Tree: Sendable {}

extension KeyedTree where Tree: StagingTree {
    /// Puts a record in the tree, forgetting what the record it replaces decrypted to.
    mutating func put(_ m: FileMetadata) {
        if let old = tree.file(m.id) { cache.forget(from: old, to: m) }
        tree.upsert(m)
    }
}

extension KeyedTree where Tree: StagingTree {
    mutating func remove(_ id: FileID) {
        tree.drop(id)
        cache.keys[id] = nil
        cache.forget(id)
    }
}

extension KeyedTree where Tree == StoreTree {
    /// Records what a committed write stored (see `StoreTree.wrote`), forgetting what the record
    /// it replaced decrypted to.
    mutating func wrote(_ id: FileID, before: FileMetadata?, after: TreeEntry?, generation: UInt64?) {
        if let before, let after { cache.forget(from: before, to: after.metadata) }
        if after == nil {
            cache.keys[id] = nil
            cache.forget(id)
        }
        tree.wrote(id, before: before, after: after, generation: generation)
    }

    /// Forgets what is cached of files other writers changed, their keys too (another process
    /// may have rotated them: docs/SHARING.md, "Revocation").
    mutating func invalidate(_ ids: some Collection<FileID>) {
        tree.invalidate(ids)
        for id in ids {
            cache.forget(id)
            cache.keys[id] = nil
        }
    }
}

extension SealedName {
    /// `name` sealed under the parent's key, with the MAC the parent's children are found by.
    init(sealing name: String, parentKey: SymmetricKey, of id: FileID) {
        self.init(
            ciphertext: AEAD.seal(Array(name.utf8), key: parentKey, purpose: .name, fileID: id.bytes),
            mac: NameMAC.mac(name: name, parentKey: parentKey))
    }
}

extension PosixAttributes {
    func sealed(key: SymmetricKey, of id: FileID) -> [UInt8] {
        AEAD.seal(encoded(), key: key, purpose: .attributes, fileID: id.bytes)
    }
}
