import Testing

@testable import CofferModel

/// A view that counts every lookup the validator makes: the cost of a validation, measured in
/// steps rather than time.
final class LookupCounter: @unchecked Sendable { var count = 0 }

struct CountingView<Base: TreeView>: TreeView {
    let base: Base
    let counter: LookupCounter
    func file(_ id: FileID) -> FileMetadata? {
        counter.count += 1
        return base.file(id)
    }
    func childIDs(of id: FileID) -> [FileID] {
        counter.count += 1
        return base.childIDs(of: id)
    }
    func childIDs(of id: FileID, nameMAC: [UInt8]) -> [FileID] {
        counter.count += 1
        return base.childIDs(of: id, nameMAC: nameMAC)
    }
    var rootID: FileID? { base.rootID }
    func link(_ id: FileID) -> FileLink? {
        counter.count += 1
        return base.link(id)
    }
}

@Suite("Tree limits and validation cost")
struct LimitsTests {
    /// Validates `batch` through a counting view; returns the lookups made and the outcome.
    func countedValidation(_ batch: Batch<FileTree>) -> (lookups: Int, error: TreeError?) {
        let counter = LookupCounter()
        let view = CountingView(base: batch, counter: counter)
        do {
            try Validator.validate(changed: batch.order, before: { batch.base.file($0) }, in: view)
            return (counter.count, nil)
        } catch {
            return (counter.count, error)
        }
    }

    /// A chain of nested folders `first`, `first+1`, … under `parent`, added deepest first (the
    /// order that made every record walk the whole chain).
    func chain(_ batch: inout Batch<FileTree>, from first: Int, length: Int, under parent: Int) {
        for i in stride(from: length - 1, through: 0, by: -1) {
            batch.upsertUnchecked(folder(first + i, parent: i == 0 ? parent : first + i - 1, "f\(first + i)"))
        }
    }

    @Test func eightThousandNestedFoldersValidateInLinearSteps() {
        // Eight chains of 1,000 (the depth limit), 8,000 records: depth × records would be
        // about 4 million lookups; linear is a small multiple of 8,000.
        var batch = Batch(base: FileTree([root]))
        for k in 0..<8 { chain(&batch, from: 100 + k * 1000, length: TreeLimits.maxDepth, under: 1) }
        let (lookups, error) = countedValidation(batch)
        #expect(error == nil, "\(String(describing: error))")
        #expect(lookups <= 10 * 8000, "validation made \(lookups) lookups for 8,000 records")
    }

    @Test func aChainDeeperThanTheLimitIsRefusedCheaply() {
        var batch = Batch(base: FileTree([root]))
        chain(&batch, from: 100, length: 8000, under: 1)
        let (lookups, error) = countedValidation(batch)
        guard case .invalidName(let why)? = error else {
            Issue.record("expected the depth limit, got \(String(describing: error))")
            return
        }
        #expect(why.contains("\(TreeLimits.maxDepth) levels"))
        #expect(lookups <= 10 * 8000, "validation made \(lookups) lookups for 8,000 records")
        // Exactly at the limit is fine, one deeper is not.
        var ok = Batch(base: FileTree([root]))
        chain(&ok, from: 100, length: TreeLimits.maxDepth, under: 1)
        #expect(countedValidation(ok).error == nil)
        ok.upsertUnchecked(meta(5000, parent: 99 + TreeLimits.maxDepth, "too deep"))
        #expect(countedValidation(ok).error != nil)
    }

    @Test func movingAFolderCountsTheSubtreeItCarries() {
        // base: root → a(2) → 600-deep chain from 100; root → b(3) → 600-deep chain from 1000
        var base = FileTree([root, folder(2, parent: 1, "a"), folder(3, parent: 1, "b")])
        for i in 0..<600 { base.insert(folder(100 + i, parent: i == 0 ? 2 : 99 + i, "x")) }
        for i in 0..<600 { base.insert(folder(1000 + i, parent: i == 0 ? 3 : 999 + i, "y")) }
        // Moving a/ (600 levels of subtree) under the end of b's chain (depth 601) goes past 1,000.
        var deep = Batch(base: base)
        deep.upsertUnchecked(folder(2, parent: 1599, "a"))
        guard case .invalidName(let why)? = countedValidation(deep).error, why.contains("levels") else {
            Issue.record(
                "a move past the depth limit was accepted: \(String(describing: countedValidation(deep).error))")
            return
        }
        // Under depth 301 of b's chain it fits (a at 302, its deepest record 600 further).
        var fits = Batch(base: base)
        fits.upsertUnchecked(folder(2, parent: 1299, "a"))
        #expect(countedValidation(fits).error == nil)
    }

    /// A live folder moved no deeper carries its subtree as it was: the move costs no walk of
    /// that subtree, however large (before, every such move listed and checked it all, inside
    /// the server's write lock). A folder coming back to life is still checked in full.
    @Test func movingABigFolderNoDeeperDoesNotWalkItsSubtree() {
        // root → b(3) → a(2) → 5,000 folders; root → c(4); root → c(4) → d(5)
        var base = FileTree([
            root, folder(3, parent: 1, "b"), folder(4, parent: 1, "c"), folder(5, parent: 4, "d"),
            folder(2, parent: 3, "a"),
        ])
        for i in 0..<5000 { base.insert(folder(100 + i, parent: 2, "x\(i)")) }
        func moved(to parent: Int, in tree: FileTree = base) -> (lookups: Int, error: TreeError?) {
            var batch = Batch(base: tree)
            batch.upsertUnchecked(folder(2, parent: parent, "a"))
            return countedValidation(batch)
        }
        // Across at the same depth (b → c), or up to the root: no walk of the 5,000.
        let across = moved(to: 4)
        let up = moved(to: 1)
        #expect(across.error == nil && up.error == nil)
        #expect(across.lookups < 100, "a move of a 5,000-folder subtree across made \(across.lookups) lookups")
        #expect(up.lookups < 100, "a move of a 5,000-folder subtree up made \(up.lookups) lookups")
        // One level deeper (under d): the subtree's height is checked.
        let down = moved(to: 5)
        #expect(down.error == nil && down.lookups >= 5000)
        // Revived from a deleted folder: every folder inside is checked again.
        var dead = base
        dead.insert(folder(4, parent: 1, "c", deleted: true))
        dead.insert(folder(2, parent: 4, "a"))
        let revived = moved(to: 3, in: dead)
        #expect(revived.error == nil && revived.lookups >= 5000)
    }

    @Test func sameNameSiblingsAddedInOneBatchAreListedOnceEach() {
        // A live file next to thousands of deleted same-name siblings added in the same batch
        // (the lookup that lists them keeps a set, not a quadratic scan).
        var batch = Batch(base: FileTree([root]))
        for i in 0..<5000 { batch.upsertUnchecked(meta(100 + i, parent: 1, "same", deleted: true)) }
        batch.upsertUnchecked(meta(6000, parent: 1, "same"))
        #expect(batch.childIDs(of: rootID, nameMAC: Array("same".utf8)).count == 5001)
        let (lookups, error) = countedValidation(batch)
        #expect(error == nil)
        #expect(lookups <= 10 * 5001)
    }

    @Test func aChangeThatLeavesARecordInPlaceLooksUpNoSiblingsOrAncestors() throws {
        // Content and attribute changes (most of what a mount commits) keep parent, name and
        // deletion state: nothing they do can newly conflict, orphan or loop.
        let tree = sampleTree()
        var update = Batch(base: tree)
        try update.update(fid(4)) { $0.contentDigest = [7] }
        let (lookups, error) = countedValidation(update)
        #expect(error == nil)
        #expect(lookups <= 2, "a content change made \(lookups) lookups")
        // A rename of the same record still checks its new siblings and its ancestry.
        var rename = Batch(base: tree)
        try rename.rename(fid(4), to: sname("x"))
        let renamed = countedValidation(rename)
        #expect(renamed.error == nil)
        #expect(renamed.lookups > lookups)
        // And a record that stays put is still refused over a parent the batch removed.
        var orphaned = Batch(base: tree)
        try orphaned.update(fid(6)) { $0.contentDigest = [7] }
        orphaned.removeUnchecked(fid(5))
        #expect(countedValidation(orphaned).error == .orphan(fid(6).description))
    }

    @Test func aRecordLeftInPlaceIsCheckedThroughWhatElseTheBatchChanged() throws {
        // The shortcut trusts the other changes to be checked on their own: a sibling renamed
        // onto a record that only changed content is still a conflict, and so is a folder moved
        // under a file's parent's descendant.
        let tree = sampleTree()
        var b = Batch(base: tree)
        try b.update(fid(4)) { $0.contentDigest = [7] }
        b.upsertUnchecked(folder(5, parent: 2, "d"))  // c renamed to d beside document d
        #expect(countedValidation(b).error == .pathConflict(fid(5).description))
        var cycle = Batch(base: tree)
        try cycle.update(fid(6)) { $0.contentDigest = nil }
        cycle.upsertUnchecked(folder(2, parent: 6, "a"))  // a moved under its own grandchild e
        #expect(countedValidation(cycle).error != nil)
    }
}
