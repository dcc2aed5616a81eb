import CofferModel
import CofferStore
import Foundation

extension Vault {
    /// Forgets files whose deletion the server has recorded: explicitly deleted (or made explicit
    /// by the server) in base, nothing pending locally, and the same for every descendant, so no
    /// record is ever left without its parent. Storage then scales with live files, not history.
    @discardableResult
    public func pruneSyncedDeletions() throws -> Int {
        try state.withLock { s in
            let pruned = try store.write { w -> Int in
                let base = try w.reader.files(.base)
                let localIDs = Set(try w.reader.files(.local).map(\.metadata.id))
                var tree = FileTree(base.map(\.effectiveMetadata))
                var removable: Set<FileID> = []
                for f in base where f.effectiveMetadata.isDeleted && !localIDs.contains(f.metadata.id) {
                    let subtree = [f.metadata.id] + tree.descendants(of: f.metadata.id)
                    let allGone = subtree.allSatisfy { id in
                        !localIDs.contains(id) && (tree.file(id)?.isDeleted ?? true)
                    }
                    if allGone { removable.formUnion(subtree) }
                }
                // Children before parents.
                var count = 0
                while !removable.isEmpty {
                    let leaves = removable.filter { id in
                        tree.childIDs(of: id).allSatisfy { !removable.contains($0) || $0 == id }
                    }
                    if leaves.isEmpty { break }
                    for id in leaves {
                        try w.remove(id, .base)
                        try w.addTombstone(id)
                        try w.forgetInode(of: id)
                        tree.remove(id)
                        removable.remove(id)
                        count += 1
                    }
                }
                return count
            }
            if pruned > 0 { try reloadAll(&s) }
            return pruned
        }
    }
}
