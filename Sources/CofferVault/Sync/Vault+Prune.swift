import CofferModel
import CofferStore
import Foundation

extension Vault {
    /// Forgets files whose deletion the server has recorded: explicitly deleted (or made explicit
    /// by the server) in base, nothing pending locally, and the same for every descendant, so no
    /// record is ever left without its parent. Storage then scales with live files, not history.
    /// Costs what the pruned subtrees hold: the base's deleted records are found by an index.
    @discardableResult
    public func pruneSyncedDeletions() throws -> Int {
        try state.withLock { s in
            let pruned = try store.write { w -> [FileID] in
                var removable: Set<FileID> = []
                var order: [FileID] = []
                for id in try w.reader.deletedBaseIDs() where !removable.contains(id) {
                    // The subtree must be all base records marked deleted, none changed locally.
                    var subtree = [id]
                    var queue = [id]
                    var allGone = true
                    while allGone, let next = queue.popLast() {
                        for c in try w.reader.children(of: next, .base) where !removable.contains(c.id) {
                            guard c.isDeleted, !c.hasLocal else {
                                allGone = false
                                break
                            }
                            subtree.append(c.id)
                            queue.append(c.id)
                        }
                    }
                    // A child record only the local side has (created there) keeps its parent.
                    if allGone, try subtree.allSatisfy({ try w.reader.children(of: $0, .local).isEmpty }) {
                        removable.formUnion(subtree)
                        order.append(contentsOf: subtree)
                    }
                }
                // One transaction: no reader ever sees a record without its parent.
                for id in order {
                    try w.remove(id, .base)
                    try w.addTombstone(id)
                    try w.forgetInode(of: id)
                }
                return order
            }
            if !pruned.isEmpty { try settle(pruned, &s) }
            return pruned.count
        }
    }
}
