/// The four tree invariants (root, path conflict, cycle, orphan), checked once per batch.
///
/// `validate(changed:in:)` checks only what a batch can have broken: the changed files, their
/// ancestor chains, and their sibling sets, so its cost follows the batch, not the tree.
/// `validateAll(_:)` checks everything (fsck, and the server's own audit).
public enum Validator {
    /// Identifies a file in an error. The model knows no plaintext; callers that do can map ids
    /// back to paths (see `TreeError`).
    public typealias Describe = (FileID) -> String

    public static func validate<T: TreeView>(changed ids: some Sequence<FileID>, before: (FileID) -> FileMetadata?,
                                             in tree: T, describe: Describe = { $0.description }) throws(TreeError) {
        var foldersToDeepCheck: [FileID] = []
        var namesToCheck: [FileMetadata] = []
        for id in ids {
            guard let m = tree.file(id) else { continue } // pruned in this batch
            let old = before(id)
            // Root invariant: the root never changes, and no second root appears.
            if let old, old.isRoot {
                // The root's identity, place, name, keys and deletion state never change; its
                // POSIX attributes may (a chmod or an entry added at the top bumps its mtime).
                if !sameStructure(old, m) { throw .rootModified }
                continue
            }
            if m.isRoot {
                if old == nil, tree.rootID == id, !hasOtherRoot(tree, besides: id) { continue } // the first root
                throw .multipleRoots
            }
            if let old, old.type != m.type { throw .typeChanged(describe(id)) }
            // Orphan invariant.
            guard let parent = tree.file(m.parent) else { throw .orphan(describe(id)) }
            guard parent.type == .folder else { throw .parentNotFolder(describe(m.parent)) }
            // Cycle invariant: walking up must reach the root.
            try reachesRoot(from: id, parent: parent.id, in: tree, describe: describe)
            if !m.isDeleted { namesToCheck.append(m) }
            if m.type == .folder, let old, old.isDeleted != m.isDeleted || old.parent != m.parent {
                foldersToDeepCheck.append(id)
            }
        }
        // Path conflict invariant: a changed live file has no live sibling of the same name.
        // (Files inside deleted folders may share names; they are not live.)
        for m in namesToCheck where tree.isLive(m.parent) {
            for other in tree.childIDs(of: m.parent, nameMAC: m.name.mac) where other != m.id {
                if let o = tree.file(other), !o.isDeleted { throw .pathConflict(describe(m.id)) }
            }
        }
        // A folder that came back to life (moved out of a deleted folder) revives its subtree.
        for f in foldersToDeepCheck where tree.isLive(f) {
            for d in [f] + tree.descendants(of: f) where tree.file(d)?.type == .folder {
                try checkSiblings(of: d, in: tree, describe: describe)
            }
        }
    }

    /// Walks up from `id` (whose parent is `parent`) and throws unless it reaches the root.
    ///
    /// Runs for every changed record of every batch (each create, close and chmod on a mount),
    /// so it reads only links (no record copies), and only a walk longer than `shortWalk` steps
    /// keeps a set of where it has been; before that it checks for `id` alone. A cycle among
    /// the ancestors is then found a few steps later than with a set from the start, with the
    /// same error: nothing inside a cycle can be missing, so no other error can come first.
    static func reachesRoot<T: TreeView>(from id: FileID, parent: FileID, in tree: T,
                                         describe: Describe) throws(TreeError) {
        var current = parent
        guard var link = tree.link(current) else { throw .orphan(describe(id)) }
        var visited: Set<FileID>?
        var steps = 0
        while link.parent != current { // the root is its own parent
            steps += 1
            if steps > shortWalk, visited == nil { visited = [id] }
            if current == id || visited?.insert(current).inserted == false { throw .cycle(describe(id)) }
            guard let next = tree.link(link.parent) else { throw .orphan(describe(current)) }
            current = link.parent
            link = next
        }
    }

    /// Steps walked up before the walk keeps a set (deeper trees are rare).
    static let shortWalk = 32

    static func sameStructure(_ a: FileMetadata, _ b: FileMetadata) -> Bool {
        var x = a, y = b
        x.sealedAttributes = []; y.sealedAttributes = []
        x.lastModifiedBy = y.lastModifiedBy
        return x == y
    }

    private static func hasOtherRoot<T: TreeView>(_ tree: T, besides id: FileID) -> Bool {
        if let r = tree.rootID, r != id { return true }
        return false
    }

    static func checkSiblings<T: TreeView>(of folder: FileID, in tree: T, describe: Describe) throws(TreeError) {
        var names: [[UInt8]: FileID] = [:]
        for child in tree.liveChildren(of: folder) where child.id != folder {
            if let other = names[child.name.mac], other != child.id {
                throw .pathConflict(describe(child.id))
            }
            names[child.name.mac] = child.id
        }
    }

    /// Checks every invariant over a whole tree.
    public static func validateAll(_ tree: FileTree, describe: Describe = { $0.description }) throws(TreeError) {
        let roots = tree.files.values.filter { $0.isRoot }
        if roots.isEmpty { if tree.count == 0 { return }; throw .noRoot }
        if roots.count > 1 { throw .multipleRoots }
        for m in tree.files.values where !m.isRoot {
            guard let parent = tree.file(m.parent) else { throw .orphan(describe(m.id)) }
            guard parent.type == .folder else { throw .parentNotFolder(describe(parent.id)) }
        }
        // Cycles: everything must reach the root. Memoised so the walk is linear.
        var reaches: Set<FileID> = []
        if let r = tree.rootID { reaches.insert(r) }
        for start in tree.files.keys where !reaches.contains(start) {
            var path: [FileID] = []
            var onPath: Set<FileID> = []
            var cursor = start
            while !reaches.contains(cursor) {
                if !onPath.insert(cursor).inserted { throw .cycle(describe(start)) }
                path.append(cursor)
                guard let m = tree.file(cursor) else { throw .orphan(describe(cursor)) }
                cursor = m.parent
            }
            reaches.formUnion(path)
        }
        for m in tree.files.values where m.type == .folder && tree.isLive(m.id) {
            try checkSiblings(of: m.id, in: tree, describe: describe)
        }
    }
}
