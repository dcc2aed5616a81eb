/// Limits every tree and every batch obeys. The model's validator enforces the depth (so a
/// device and the server refuse the same trees); the server refuses larger batches and devices
/// push in smaller ones. Both are far beyond what a person builds: they exist so that a hostile
/// client cannot make any walk or any one request arbitrarily expensive.
public enum TreeLimits {
    /// Deepest a record may sit: the root is at depth 0, its children at 1.
    public static let maxDepth = 1000
    /// Most records one upsert batch may carry.
    public static let maxRecordsPerBatch = 10_000

    /// The error for a record placed deeper than `maxDepth`. `TreeError` has no case of its own
    /// for it (every layer maps the existing cases exhaustively); `invalidName` is the closest:
    /// a path that is too long.
    public static func tooDeep(_ what: String) -> TreeError {
        .invalidName("folders nest at most \(maxDepth) levels below the root: \(what)")
    }
}

/// Memoised walks up a tree view: each record's depth and the nearest record on its way to the
/// root (itself included) whose own flag says deleted. Every record is walked at most once per
/// `Ancestry`, so asking about all records of a batch costs O(records + their distinct
/// ancestors), not depth × records.
public struct Ancestry<T: TreeView> {
    public struct Facts: Sendable, Equatable {
        /// Steps from the root (the root is 0).
        public var depth: Int
        /// The nearest record, itself included, whose `isDeleted` flag is set; nil when live.
        public var deletedAt: FileID?
    }

    public let tree: T
    private var known: [FileID: Facts] = [:]
    static var shortWalk: Int { 32 }

    public init(_ tree: T) { self.tree = tree }

    /// Facts about `id`. Throws `.notFound` if `id` itself is missing, `.orphan` naming the
    /// record whose parent is missing, and `.cycle` naming `id` when the walk comes back on itself.
    public mutating func facts(
        of id: FileID, describe: Validator.Describe = { $0.description }
    ) throws(TreeError) -> Facts {
        if let f = known[id] { return f }
        var path: [(id: FileID, link: FileLink)] = []
        // Most walks are short (every create and chmod on a mount runs one), so a set of where
        // the walk has been is only kept past `shortWalk` steps; before that a cycle through
        // `id` is caught by meeting `id`, and one above it a few steps later by the set.
        var onPath: Set<FileID>?
        var current = id
        var above: Facts?  // facts of the parent of the last record on `path`; nil past the root
        while true {
            if let f = known[current] {
                above = f
                break
            }
            guard let link = tree.link(current) else {
                guard let child = path.last else { throw .notFound(describe(id)) }
                throw .orphan(describe(child.id))
            }
            if !path.isEmpty, current == id { throw .cycle(describe(id)) }
            if path.count >= Self.shortWalk {
                if onPath == nil { onPath = Set(path.map(\.id)) }
                if onPath?.insert(current).inserted == false { throw .cycle(describe(id)) }
            }
            path.append((current, link))
            if link.parent == current { break }  // the root is its own parent
            current = link.parent
        }
        for step in path.reversed() {
            let f = Facts(
                depth: above.map { $0.depth + 1 } ?? 0, deletedAt: step.link.isDeleted ? step.id : above?.deletedAt)
            known[step.id] = f
            above = f
        }
        guard let result = above else { throw .notFound(describe(id)) }
        return result
    }

    /// `TreeView.deletionState`, memoised; a record that does not reach the root counts as
    /// implicitly deleted, as there.
    public mutating func deletionState(of id: FileID) -> DeletionState? {
        guard let link = tree.link(id) else { return nil }
        if link.isDeleted { return .explicitlyDeleted }
        guard let f = try? facts(of: id) else { return .implicitlyDeleted }
        return f.deletedAt == nil ? .live : .implicitlyDeleted
    }
}
