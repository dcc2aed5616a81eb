/// The four tree invariants (root, path conflict, cycle, orphan), checked once per batch.
///
/// `validate(changed:in:)` checks only what a batch can have broken: the changed files that
/// moved, were renamed, created or deleted or came back, with their ancestor chains (memoised,
/// see `Ancestry`), their sibling sets, and the depth limit of `TreeLimits`; a changed file that
/// stayed in place under its name (content, attributes) only has its parent checked. Its cost
/// follows the batch, not the tree or its depth.
/// `validateAll(_:)` checks everything (fsck, and the server's own audit).
public enum Validator {
    /// Identifies a file in an error. The model knows no plaintext; callers that do can map ids
    /// back to paths (see `TreeError`).
    public typealias Describe = (FileID) -> String

    public static func validate<T: TreeView>(
        changed ids: some Sequence<FileID>, before: (FileID) -> FileMetadata?,
        in tree: T, describe: Describe = { $0.description }
    ) throws(TreeError) {
        // One memo for every walk up the tree in this batch: each record is walked once, so a
        // batch costs O(records changed + their distinct ancestors) whatever the depth.
        var ancestry = Ancestry(tree)
        var formerPlacement = FormerPlacement()
        var foldersToDeepCheck: [FileID] = []
        var movedFolders: [(id: FileID, depth: Int)] = []
        var namesToCheck: [FileMetadata] = []
        for id in ids {
            guard let m = tree.file(id) else { continue }  // pruned in this batch
            let old = before(id)
            // Root invariant: the root never changes, and no second root appears.
            if let old, old.isRoot {
                // The root's identity, place, name, keys and deletion state never change; its
                // POSIX attributes may (a chmod or an entry added at the top bumps its mtime).
                if !sameStructure(old, m) { throw .rootModified }
                continue
            }
            if m.isRoot {
                if old == nil, tree.rootID == id, !hasOtherRoot(tree, besides: id) { continue }  // the first root
                throw .multipleRoots
            }
            if let old, old.type != m.type { throw .typeChanged(describe(id)) }
            // Orphan invariant.
            guard let parent = tree.file(m.parent) else { throw .orphan(describe(id)) }
            guard parent.type == .folder else { throw .parentNotFolder(describe(m.parent)) }
            // A record that stays where it was, under the same name, live or deleted as before
            // (a content or attribute change: most of what a mount commits) can break no other
            // invariant: the tree before the batch was valid, and whatever else moved around it
            // in this batch is checked as a change of its own (a sibling taking its name, an
            // ancestor moving, coming back to life or going deeper).
            if let old, old.parent == m.parent, old.name.mac == m.name.mac, old.isDeleted == m.isDeleted { continue }
            // Cycle invariant (walking up must reach the root) and the depth limit.
            let facts = try ancestry.facts(of: id, describe: describe)
            if facts.depth > TreeLimits.maxDepth { throw TreeLimits.tooDeep(describe(id)) }
            if !m.isDeleted { namesToCheck.append(m) }
            if m.type == .folder, let old, old.isDeleted != m.isDeleted || old.parent != m.parent {
                // A folder that stays live and no deeper carries its subtree as it was: nothing
                // inside it can newly conflict or nest too deep, so it costs no walk of that
                // subtree (a move back and forth of a huge folder stays cheap).
                let was = formerPlacement.of(id, before)
                if was?.live != true { foldersToDeepCheck.append(id) }
                if old.parent != m.parent, facts.depth > (was?.depth ?? -1) { movedFolders.append((id, facts.depth)) }
            }
        }
        // A moved folder takes its subtree along: the deepest record under it must stay within
        // the limit too. Heights are memoised across the batch, so nested moves cost one walk.
        var heights: [FileID: Int] = [:]
        for f in movedFolders {
            try checkHeight(
                of: f.id, budget: TreeLimits.maxDepth - f.depth, in: tree, heights: &heights, describe: describe)
        }
        // Path conflict invariant: a changed live file has no live sibling of the same name.
        // (Files inside deleted folders may share names; they are not live.)
        for m in namesToCheck where try ancestry.facts(of: m.parent, describe: describe).deletedAt == nil {
            for other in tree.childIDs(of: m.parent, nameMAC: m.name.mac) where other != m.id {
                if let o = tree.file(other), !o.isDeleted { throw .pathConflict(describe(m.id)) }
            }
        }
        // A folder that came back to life (moved out of a deleted folder) revives its subtree.
        // Each folder is checked once, however many of its ancestors the batch moved.
        var checked: Set<FileID> = []
        for f in foldersToDeepCheck where try ancestry.facts(of: f, describe: describe).deletedAt == nil {
            var queue = [f]
            while let d = queue.popLast() {
                guard checked.insert(d).inserted else { continue }
                try checkSiblings(of: d, in: tree, describe: describe)
                for c in tree.childIDs(of: d) where c != d && !checked.contains(c) && tree.file(c)?.type == .folder {
                    queue.append(c)
                }
            }
        }
    }

    /// Where files were before the batch: depth below the root, and whether they were live (no
    /// deleted record on the way up). Memoised over the batch like `Ancestry`; nil where the old
    /// tree gives no answer within the depth limit (a hostile or broken old tree), which callers
    /// treat as "check everything".
    struct FormerPlacement {
        var memo: [FileID: (depth: Int, live: Bool)?] = [:]

        mutating func of(_ start: FileID, _ before: (FileID) -> FileMetadata?) -> (depth: Int, live: Bool)? {
            // Up from `start` to a record whose placement is known (memoised, or the root),
            // then down again, each record one deeper than its parent and live only if it is.
            var path: [FileID] = []
            var onPath: Set<FileID> = []
            var cursor = start
            var anchor: (depth: Int, live: Bool)?
            while true {
                if let known = memo[cursor] {
                    anchor = known
                    break
                }
                guard path.count <= TreeLimits.maxDepth + 1, !onPath.contains(cursor), let m = before(cursor) else {
                    anchor = nil
                    break
                }
                if m.isRoot {
                    anchor = (0, !m.isDeleted)
                    memo[cursor] = anchor
                    break
                }
                path.append(cursor)
                onPath.insert(cursor)
                cursor = m.parent
            }
            var result = anchor
            for id in path.reversed() {
                if let r = result, let m = before(id) {
                    result = (r.depth + 1, r.live && !m.isDeleted)
                } else {
                    result = nil
                }
                memo[id] = result
            }
            return result
        }
    }

    /// Throws `tooDeep` when the subtree under `folder` is more than `budget` levels high.
    /// Iterative (no recursion on hostile depths); stops as soon as the budget is exceeded.
    static func checkHeight<T: TreeView>(
        of folder: FileID, budget: Int, in tree: T, heights: inout [FileID: Int],
        describe: Describe
    ) throws(TreeError) {
        if let h = heights[folder] {
            if h > budget { throw TreeLimits.tooDeep(describe(folder)) }
            return
        }
        // A frame per folder on the current path; the path is never longer than the budget.
        var stack: [(id: FileID, children: [FileID], next: Int, height: Int)] = [
            (folder, tree.childIDs(of: folder), 0, 0)
        ]
        var onStack: Set<FileID> = [folder]
        while var top = stack.popLast() {
            if top.next < top.children.count {
                let c = top.children[top.next]
                top.next += 1
                stack.append(top)
                if c == top.id || onStack.contains(c) { continue }  // validated trees have no cycles; never loop on one
                if let h = heights[c] {
                    // c sits stack.count levels below `folder`, its deepest record h further.
                    if stack.count + h > budget { throw TreeLimits.tooDeep(describe(c)) }
                    stack[stack.count - 1].height = max(stack[stack.count - 1].height, h + 1)
                    continue
                }
                if stack.count > budget { throw TreeLimits.tooDeep(describe(c)) }
                onStack.insert(c)
                stack.append((c, tree.childIDs(of: c), 0, 0))
            } else {
                heights[top.id] = top.height
                onStack.remove(top.id)
                if !stack.isEmpty { stack[stack.count - 1].height = max(stack[stack.count - 1].height, top.height + 1) }
            }
        }
    }

    static func sameStructure(_ a: FileMetadata, _ b: FileMetadata) -> Bool {
        var x = a
        var y = b
        x.sealedAttributes = []
        y.sealedAttributes = []
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
        if roots.isEmpty {
            if tree.count == 0 { return }
            throw .noRoot
        }
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
