/// The per-operation checks from the Sync v3 design (create, rename, move, delete, write),
/// applied to a batch under construction. A batch collects changed metadata and is validated as
/// a whole by `commit`, so intermediate states (rename A; create B with A's old name; move B;
/// rename A back) never need to be valid on their own.
public struct Batch<Base: TreeView>: TreeView {
    public let base: Base
    public private(set) var changes: [FileID: FileMetadata] = [:]
    public private(set) var order: [FileID] = []
    /// Records this batch removes from the tree altogether (a merge dropping a file the server
    /// never knew): gone from every query, and left out of what `validate` returns.
    public private(set) var removed: Set<FileID> = []
    /// Children gained through this batch, by parent and by name MAC; kept incrementally so
    /// large batches (an import of thousands of files) stay linear.
    private var added: [FileID: Set<FileID>] = [:]
    private var addedByName: [FileID: [[UInt8]: Set<FileID>]] = [:]

    public init(base: Base) { self.base = base }

    /// The tree as it would be after the batch.
    public var view: Batch<Base> { self }

    public var rootID: FileID? { base.rootID ?? changes.values.first(where: { $0.isRoot })?.id }

    public func file(_ id: FileID) -> FileMetadata? {
        if let c = changes[id] { return c }
        return removed.isEmpty || !removed.contains(id) ? base.file(id) : nil
    }

    /// Changed records' own fields, else the base's links (no record copies from a `FileTree`).
    public func link(_ id: FileID) -> FileLink? {
        if let c = changes[id] { return FileLink(parent: c.parent, isDeleted: c.isDeleted) }
        return removed.isEmpty || !removed.contains(id) ? base.link(id) : nil
    }

    public func childIDs(of id: FileID) -> [FileID] {
        var out = base.childIDs(of: id).filter { c in changes[c].map { $0.parent == id } ?? !removed.contains(c) }
        if let extra = added[id] {
            for e in extra where base.file(e)?.parent != id && changes[e]?.parent == id { out.append(e) }
        }
        return out
    }

    public func childIDs(of id: FileID, nameMAC: [UInt8]) -> [FileID] {
        var out = base.childIDs(of: id, nameMAC: nameMAC).filter { c in
            changes[c].map { $0.parent == id && $0.name.mac == nameMAC } ?? !removed.contains(c)
        }
        if let extra = addedByName[id]?[nameMAC] {
            // A set, not `out.contains`: a batch may hold thousands of deleted same-name siblings.
            var present = Set(out)
            for e in extra
            where changes[e]?.parent == id && changes[e]?.name.mac == nameMAC && present.insert(e).inserted {
                out.append(e)
            }
        }
        return out
    }

    private mutating func put(_ m: FileMetadata) {
        removed.remove(m.id)
        if let previous = changes[m.id] {
            if previous.parent != m.parent { added[previous.parent]?.remove(m.id) }
            if previous.parent != m.parent || previous.name.mac != m.name.mac {
                addedByName[previous.parent]?[previous.name.mac]?.remove(m.id)
            }
        } else {
            order.append(m.id)
        }
        changes[m.id] = m
        if !m.isRoot {
            added[m.parent, default: []].insert(m.id)
            addedByName[m.parent, default: [:]][m.name.mac, default: []].insert(m.id)
        }
    }

    private func live(_ id: FileID, _ describe: Validator.Describe) throws(TreeError) -> FileMetadata {
        guard let m = file(id) else { throw .notFound(describe(id)) }
        if view.deletionState(of: id) != .live { throw .deleted(describe(id)) }
        return m
    }

    private func requireFolder(_ id: FileID, _ describe: Validator.Describe) throws(TreeError) {
        let p = try live(id, describe)
        guard p.type == .folder else { throw .parentNotFolder(describe(id)) }
    }

    private func requireNoSibling(
        named mac: [UInt8], in parent: FileID, except id: FileID, _ describe: Validator.Describe
    ) throws(TreeError) {
        for c in childIDs(of: parent, nameMAC: mac) where c != id {
            if let m = file(c), !m.isDeleted { throw .pathConflict(describe(c)) }
        }
    }

    /// Create: not its own parent, parent exists and is a live folder, no sibling of that name.
    /// (Name rules are checked on plaintext by the caller via `FileName.validate`.)
    public mutating func create(_ m: FileMetadata, describe: Validator.Describe = { $0.description }) throws(TreeError)
    {
        if file(m.id) != nil { throw .pathConflict(describe(m.id)) }
        if m.isRoot { throw .multipleRoots }
        try requireFolder(m.parent, describe)
        try requireNoSibling(named: m.name.mac, in: m.parent, except: m.id, describe)
        put(m)
    }

    /// Rename: not the root, no sibling of that name.
    public mutating func rename(
        _ id: FileID, to name: SealedName, describe: Validator.Describe = { $0.description }
    ) throws(TreeError) {
        var m = try live(id, describe)
        if m.isRoot { throw .rootModified }
        try requireNoSibling(named: name.mac, in: m.parent, except: id, describe)
        m.name = name
        put(m)
    }

    /// Move (optionally with a new name, since names are sealed with the parent's key and must be
    /// re-sealed on a move, as must the wrapped key): not into itself or a descendant, the new
    /// parent is a live folder, no sibling of that name there.
    public mutating func move(
        _ id: FileID, to parent: FileID, name: SealedName, wrappedKey: [UInt8],
        describe: Validator.Describe = { $0.description }
    ) throws(TreeError) {
        var m = try live(id, describe)
        if m.isRoot { throw .rootModified }
        if parent == id { throw .cycle(describe(id)) }
        try requireFolder(parent, describe)
        if view.ancestors(of: parent).contains(id) { throw .cycle(describe(id)) }
        try requireNoSibling(named: name.mac, in: parent, except: id, describe)
        m.parent = parent
        m.name = name
        m.wrappedKey = wrappedKey
        put(m)
    }

    /// Delete: not the root. Descendants become implicitly deleted.
    public mutating func delete(_ id: FileID, describe: Validator.Describe = { $0.description }) throws(TreeError) {
        guard var m = file(id) else { throw .notFound(describe(id)) }
        if m.isRoot { throw .rootModified }
        if m.isDeleted { return }
        m.isDeleted = true
        put(m)
    }

    /// Content or attribute change: the file exists and is live.
    public mutating func update(
        _ id: FileID, describe: Validator.Describe = { $0.description }, _ change: (inout FileMetadata) -> Void
    ) throws(TreeError) {
        var m = try live(id, describe)
        let type = m.type
        let parent = m.parent
        let name = m.name
        let deleted = m.isDeleted
        change(&m)
        // Updates may not smuggle in structural changes; those have their own checks.
        if m.type != type { throw .typeChanged(describe(id)) }
        if m.parent != parent || m.name != name || m.isDeleted != deleted {
            throw .invalidName("use rename, move or delete for structural changes")
        }
        put(m)
    }

    /// Adds a record as-is (for the first root and for merges), leaving the checks to `validate`.
    public mutating func upsertUnchecked(_ m: FileMetadata) { put(m) }

    /// Takes a record out of the tree as-is (a merge dropping what the server never knew).
    public mutating func removeUnchecked(_ id: FileID) {
        if let previous = changes.removeValue(forKey: id) {
            added[previous.parent]?.remove(id)
            addedByName[previous.parent]?[previous.name.mac]?.remove(id)
        }
        removed.insert(id)
    }

    /// Checks the invariants over the whole batch; returns the changed records in first-change order.
    public func validate(describe: Validator.Describe = { $0.description }) throws(TreeError) -> [FileMetadata] {
        try Validator.validate(changed: order, before: { base.file($0) }, in: self, describe: describe)
        return order.compactMap { changes[$0] }
    }
}
