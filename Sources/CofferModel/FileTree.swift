/// A tree as the validator and the keyed view read it: a record by id, a folder's children, its
/// children of one name, the root. `FileTree` holds a whole tree in memory; the server reads its
/// stored tree through indexes (`StorageTreeView`); `Batch` overlays changes on either, so a batch
/// is checked without copying the tree. Every walk the model makes through a view starts from
/// the records a batch changed, so a view that reads lazily reads what the batch touches.
public protocol TreeView {
    func file(_ id: FileID) -> FileMetadata?
    /// Children in any deletion state.
    func childIDs(of id: FileID) -> [FileID]
    /// Children whose sealed name has this MAC: the path-conflict lookup. Every live one (by its
    /// own flag); deleted ones may be listed too (`FileTree` lists them, the server's view does
    /// not), and no caller may rely on them. Over such a base `Batch` still lists every child
    /// live in the batch's tree: a record it changed is listed from the batch itself.
    func childIDs(of id: FileID, nameMAC: [UInt8]) -> [FileID]
    var rootID: FileID? { get }
    /// A record's parent and deletion flag, all a deletion-state walk reads. The default reads
    /// them out of `file`; `FileTree` keeps them apart so the walk copies no records.
    func link(_ id: FileID) -> FileLink?
}

/// The two fields of a record that decide liveness.
public struct FileLink: Sendable {
    public var parent: FileID
    public var isDeleted: Bool

    public init(parent: FileID, isDeleted: Bool) {
        self.parent = parent
        self.isDeleted = isDeleted
    }
}

/// Whether a file is live, deleted itself, or deleted because an ancestor is. A file that is
/// gone altogether is pruned: `deletionState` then returns nil.
public enum DeletionState: Sendable, Equatable {
    case live
    case explicitlyDeleted
    case implicitlyDeleted
}

extension TreeView {
    public func link(_ id: FileID) -> FileLink? {
        file(id).map { FileLink(parent: $0.parent, isDeleted: $0.isDeleted) }
    }

    public func deletionState(of id: FileID) -> DeletionState? {
        guard let f = link(id) else { return nil }
        if f.isDeleted { return .explicitlyDeleted }
        var current = (id: id, link: f)
        var steps = 0
        while current.link.parent != current.id, steps < 100_000 {  // the root is its own parent
            guard let p = link(current.link.parent) else { return .implicitlyDeleted }  // orphaned: treat as gone
            if p.isDeleted { return .implicitlyDeleted }
            current = (current.link.parent, p)
            steps += 1
        }
        return .live
    }

    public func isLive(_ id: FileID) -> Bool { deletionState(of: id) == .live }

    /// Live children only.
    /// The live child with this name MAC, if any.
    public func liveChild(of id: FileID, nameMAC: [UInt8]) -> FileMetadata? {
        for c in childIDs(of: id, nameMAC: nameMAC) {
            if let m = file(c), !m.isDeleted, c != id { return m }
        }
        return nil
    }

    public func liveChildren(of id: FileID) -> [FileMetadata] {
        childIDs(of: id).compactMap { file($0) }.filter { !$0.isDeleted }
    }

    /// Ancestors from the parent up to the root. Stops (returns what it has) on a cycle.
    public func ancestors(of id: FileID) -> [FileID] {
        var out: [FileID] = []
        var seen: Set<FileID> = [id]
        var current = file(id)
        while let c = current, !c.isRoot {
            if !seen.insert(c.parent).inserted { break }
            out.append(c.parent)
            current = file(c.parent)
        }
        return out
    }

    /// Every descendant (any deletion state), breadth first.
    public func descendants(of id: FileID) -> [FileID] {
        var out: [FileID] = []
        var queue = [id]
        var seen: Set<FileID> = [id]
        while let next = queue.popLast() {
            for c in childIDs(of: next) where c != next && seen.insert(c).inserted {
                out.append(c)
                queue.append(c)
            }
        }
        return out
    }
}

public struct FileTree: TreeView, Sendable {
    public private(set) var files: [FileID: FileMetadata] = [:]
    private var children: [FileID: Set<FileID>] = [:]
    private var byName: [FileID: [[UInt8]: Set<FileID>]] = [:]
    /// Folders whose record is not deleted, by parent: a folder's link count (2 + this) is asked
    /// on every stat, so it is kept up to date here rather than counted over the children.
    /// Flags, not deletion states: a live folder's children can only be deleted explicitly.
    private var subfolders: [FileID: Int] = [:]
    /// Each record's parent and deletion flag, apart from the record: every stat and open asks
    /// whether a file is live, walking up to the root, and reading those two fields out of
    /// `files` copied whole records (a dozen reference-counted fields) at every step.
    private var links: [FileID: FileLink] = [:]
    public private(set) var rootID: FileID?

    public init() {}

    public init<S: Sequence>(_ metadata: S) where S.Element == FileMetadata {
        for m in metadata { insert(m) }
    }

    public var count: Int { files.count }

    public func file(_ id: FileID) -> FileMetadata? { files[id] }

    public func childIDs(of id: FileID) -> [FileID] {
        guard let c = children[id] else { return [] }
        return Array(c)
    }

    /// Inserts or replaces one record, keeping the child index right.
    public func childIDs(of id: FileID, nameMAC: [UInt8]) -> [FileID] {
        guard let c = byName[id]?[nameMAC] else { return [] }
        return Array(c)
    }

    /// Folders among the children of `id` that are not deleted. For a live folder these are
    /// exactly its live subfolders. O(1).
    public func subfolderCount(of id: FileID) -> Int { subfolders[id] ?? 0 }

    public mutating func insert(_ m: FileMetadata) {
        if let old = files[m.id] {
            countSubfolder(old, -1)
            if !old.isRoot {
                if old.parent != m.parent { children[old.parent]?.remove(m.id) }
                if old.parent != m.parent || old.name.mac != m.name.mac { unindex(old) }
            }
        }
        files[m.id] = m
        links[m.id] = FileLink(parent: m.parent, isDeleted: m.isDeleted)
        countSubfolder(m, +1)
        if m.isRoot {
            rootID = m.id
        } else {
            children[m.parent, default: []].insert(m.id)
            byName[m.parent, default: [:]][m.name.mac, default: []].insert(m.id)
        }
    }

    private mutating func countSubfolder(_ m: FileMetadata, _ delta: Int) {
        guard m.type == .folder, !m.isDeleted, !m.isRoot else { return }
        let n = (subfolders[m.parent] ?? 0) + delta
        subfolders[m.parent] = n == 0 ? nil : n
    }

    private mutating func unindex(_ old: FileMetadata) {
        byName[old.parent]?[old.name.mac]?.remove(old.id)
        if byName[old.parent]?[old.name.mac]?.isEmpty == true { byName[old.parent]?[old.name.mac] = nil }
    }

    /// Removes a record entirely (pruning).
    public mutating func remove(_ id: FileID) {
        guard let old = files.removeValue(forKey: id) else { return }
        links[id] = nil
        countSubfolder(old, -1)
        if old.isRoot {
            rootID = nil
        } else {
            children[old.parent]?.remove(id)
            unindex(old)
        }
    }

    public func link(_ id: FileID) -> FileLink? { links[id] }

    public mutating func apply(_ batch: [FileMetadata]) {
        for m in batch { insert(m) }
    }
}
