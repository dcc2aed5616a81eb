import Testing

@testable import CofferModel

@Suite("File tree and deletion states")
struct FileTreeTests {
    @Test func childIndexFollowsInsertsMovesAndRenames() {
        var t = sampleTree()
        #expect(t.count == 6)
        #expect(t.rootID == rootID)
        #expect(Set(t.childIDs(of: rootID)) == [fid(2), fid(3)])
        #expect(Set(t.childIDs(of: fid(2))) == [fid(4), fid(5)])
        #expect(t.childIDs(of: fid(2), nameMAC: Array("d".utf8)) == [fid(4)])
        // Move d from a to b and rename it.
        t.insert(meta(4, parent: 3, "d2"))
        #expect(Set(t.childIDs(of: fid(2))) == [fid(5)])
        #expect(t.childIDs(of: fid(3)) == [fid(4)])
        #expect(t.childIDs(of: fid(2), nameMAC: Array("d".utf8)).isEmpty)
        #expect(t.childIDs(of: fid(3), nameMAC: Array("d".utf8)).isEmpty)
        #expect(t.childIDs(of: fid(3), nameMAC: Array("d2".utf8)) == [fid(4)])
        // Rename in place.
        t.insert(meta(4, parent: 3, "d3"))
        #expect(t.childIDs(of: fid(3), nameMAC: Array("d2".utf8)).isEmpty)
        #expect(t.childIDs(of: fid(3), nameMAC: Array("d3".utf8)) == [fid(4)])
        // Remove (prune).
        t.remove(fid(4))
        #expect(t.file(fid(4)) == nil)
        #expect(t.childIDs(of: fid(3)).isEmpty)
        #expect(t.childIDs(of: fid(3), nameMAC: Array("d3".utf8)).isEmpty)
        #expect(t.count == 5)
        t.remove(rootID)
        #expect(t.rootID == nil)
    }

    @Test func nameIndexKeepsDuplicatesAndDeletedFiles() {
        var t = sampleTree()
        t.insert(meta(10, parent: 3, "x", deleted: true))
        t.insert(meta(11, parent: 3, "x"))
        #expect(Set(t.childIDs(of: fid(3), nameMAC: Array("x".utf8))) == [fid(10), fid(11)])
        #expect(t.liveChild(of: fid(3), nameMAC: Array("x".utf8))?.id == fid(11))
        #expect(t.liveChildren(of: fid(3)).map(\.id) == [fid(11)])
    }

    @Test func ancestorsAndDescendants() {
        let t = sampleTree()
        #expect(t.ancestors(of: fid(6)) == [fid(5), fid(2), rootID])
        #expect(t.ancestors(of: rootID) == [])
        #expect(Set(t.descendants(of: fid(2))) == [fid(4), fid(5), fid(6)])
        #expect(Set(t.descendants(of: rootID)) == [fid(2), fid(3), fid(4), fid(5), fid(6)])
        #expect(t.descendants(of: fid(4)) == [])
    }

    @Test func ancestorsStopOnACycle() {
        var t = sampleTree()
        t.insert(folder(20, parent: 21, "x"))
        t.insert(folder(21, parent: 20, "y"))
        #expect(t.ancestors(of: fid(20)) == [fid(21)])
    }

    @Test func deletionStates() {
        var t = sampleTree()
        #expect(t.deletionState(of: fid(6)) == .live)
        #expect(t.deletionState(of: rootID) == .live)
        t.insert(folder(2, parent: 1, "a", deleted: true))
        #expect(t.deletionState(of: fid(2)) == .explicitlyDeleted)
        #expect(t.deletionState(of: fid(4)) == .implicitlyDeleted)
        #expect(t.deletionState(of: fid(5)) == .implicitlyDeleted)
        #expect(t.deletionState(of: fid(6)) == .implicitlyDeleted, "deep descendants too")
        #expect(t.deletionState(of: fid(3)) == .live)
        t.insert(folder(6, parent: 5, "e", deleted: true))
        #expect(t.deletionState(of: fid(6)) == .explicitlyDeleted, "its own flag comes first")
        t.remove(fid(6))
        #expect(t.deletionState(of: fid(6)) == nil, "pruned")
        #expect(t.deletionState(of: fid(999)) == nil)
        #expect(!t.isLive(fid(4)))
        #expect(t.isLive(fid(3)))
        // An orphan (parent pruned) is not live.
        t.insert(meta(30, parent: 31, "orphan"))
        #expect(t.deletionState(of: fid(30)) == .implicitlyDeleted)
    }

    /// The same tree seen through records only: the default `link` reads `file`, so deletion
    /// states come from walking records instead of `FileTree`'s link table.
    struct RecordsOnly: TreeView {
        let tree: FileTree
        func file(_ id: FileID) -> FileMetadata? { tree.file(id) }
        func childIDs(of id: FileID) -> [FileID] { tree.childIDs(of: id) }
        func childIDs(of id: FileID, nameMAC: [UInt8]) -> [FileID] { tree.childIDs(of: id, nameMAC: nameMAC) }
        var rootID: FileID? { tree.rootID }
    }
    static func walked(_ t: FileTree, _ id: FileID) -> DeletionState? { RecordsOnly(tree: t).deletionState(of: id) }

    @Test func linkTableAgreesWithTheRecordWalk() {
        var t = sampleTree()
        let ids = (1...6).map { fid($0) } + [fid(20), fid(21), fid(30), fid(999)]
        func agree(_ step: String) {
            for id in ids { #expect(t.deletionState(of: id) == Self.walked(t, id), "\(step): \(id)") }
        }
        agree("sample")
        t.insert(folder(2, parent: 1, "a", deleted: true))
        agree("folder deleted")
        t.insert(folder(5, parent: 3, "c"))
        agree("moved out of the deleted folder")
        t.insert(folder(2, parent: 1, "a"))
        agree("revived")
        t.remove(fid(3))
        agree("parent pruned")
        t.insert(folder(20, parent: 21, "x"))
        t.insert(folder(21, parent: 20, "y"))
        agree("cycle")
        t.insert(meta(30, parent: 5, "doc", deleted: true))
        agree("deleted document")
    }

    /// What `subfolderCount` must equal: a scan of the children.
    static func scannedSubfolders(_ t: FileTree, _ id: FileID) -> Int {
        t.childIDs(of: id).compactMap { t.file($0) }.filter { $0.type == .folder && !$0.isDeleted && !$0.isRoot }.count
    }

    @Test func subfolderCountFollowsInsertsMovesDeletionsAndPruning() {
        var t = sampleTree()
        #expect(t.subfolderCount(of: rootID) == 2, "a and b; the root is not its own subfolder")
        #expect(t.subfolderCount(of: fid(2)) == 1, "c, not the document d")
        #expect(t.subfolderCount(of: fid(5)) == 1)
        #expect(t.subfolderCount(of: fid(6)) == 0)
        #expect(t.subfolderCount(of: fid(4)) == 0, "a document")
        #expect(t.subfolderCount(of: fid(999)) == 0, "unknown")
        // Move c from a to b, then rename it in place.
        t.insert(folder(5, parent: 3, "c"))
        #expect(t.subfolderCount(of: fid(2)) == 0 && t.subfolderCount(of: fid(3)) == 1)
        t.insert(folder(5, parent: 3, "c2"))
        #expect(t.subfolderCount(of: fid(3)) == 1)
        // Deleted, then revived, then pruned.
        t.insert(folder(5, parent: 3, "c2", deleted: true))
        #expect(t.subfolderCount(of: fid(3)) == 0)
        t.insert(folder(5, parent: 3, "c2"))
        #expect(t.subfolderCount(of: fid(3)) == 1)
        t.remove(fid(5))
        #expect(t.subfolderCount(of: fid(3)) == 0)
        t.remove(fid(5))
        #expect(t.subfolderCount(of: fid(3)) == 0, "removing twice changes nothing")
        // A deleted folder arriving (a pull) and moving while deleted never counts.
        t.insert(folder(20, parent: 2, "gone", deleted: true))
        t.insert(folder(20, parent: 3, "gone", deleted: true))
        #expect(t.subfolderCount(of: fid(2)) == 0 && t.subfolderCount(of: fid(3)) == 0)
        // Reinserting the same record does not count it twice; documents never count.
        t.insert(folder(3, parent: 1, "b"))
        t.insert(meta(21, parent: 3, "doc"))
        #expect(t.subfolderCount(of: rootID) == 2 && t.subfolderCount(of: fid(3)) == 0)
        // The root replaced or removed does not disturb anything.
        t.insert(root)
        #expect(t.subfolderCount(of: rootID) == 2)
    }

    @Test func subfolderCountOfALiveFolderIgnoresImplicitlyDeletedGrandchildren() {
        var t = sampleTree()
        // Deleting a/ makes c/ implicitly deleted: a/ no longer counts for the root, and c/ is
        // still counted under a/, which no stat will ask about (a/ is not live).
        t.insert(folder(2, parent: 1, "a", deleted: true))
        #expect(t.subfolderCount(of: rootID) == 1)
        #expect(t.isLive(fid(3)) && t.subfolderCount(of: fid(3)) == 0)
    }

    @Test func subfolderCountMatchesAScanAfterRandomEdits() {
        var rng = SplitMix64(seed: 77)
        var t = FileTree([root])
        let ids = Array(2...40)
        for _ in 0..<3_000 {
            let id = ids[Int.random(in: 0..<ids.count, using: &rng)]
            if Int.random(in: 0..<10, using: &rng) == 0 {
                t.remove(fid(id))
                continue
            }
            // Parents may be anything, even missing or a document: the index must not care.
            let parent = Bool.random(using: &rng) ? 1 : ids[Int.random(in: 0..<ids.count, using: &rng)]
            let type: FileType = Int.random(in: 0..<3, using: &rng) == 0 ? .document : .folder
            t.insert(
                meta(
                    id, parent: parent == id ? 1 : parent, "n\(id)", type,
                    deleted: Int.random(in: 0..<4, using: &rng) == 0))
            for p in [1] + ids {
                #expect(t.subfolderCount(of: fid(p)) == Self.scannedSubfolders(t, fid(p)))
            }
        }
    }
}

@Suite("Validator")
struct ValidatorTests {
    func validate(_ tree: FileTree, _ build: (inout Batch<FileTree>) throws -> Void) throws -> [FileMetadata] {
        var b = Batch(base: tree)
        try build(&b)
        return try b.validate()
    }

    // MARK: Root

    @Test func firstRootIsAccepted() throws {
        let changed = try validate(FileTree()) { $0.upsertUnchecked(root) }
        #expect(changed == [root])
    }

    @Test func rootCannotBeModified() {
        let t = sampleTree()
        var r = root
        r.parent = fid(2)
        #expect(throws: TreeError.rootModified) { try validate(t) { $0.upsertUnchecked(r) } }
        r = root
        r.name = sname("renamed")
        #expect(throws: TreeError.rootModified) { try validate(t) { $0.upsertUnchecked(r) } }
        r = root
        r.isDeleted = true
        #expect(throws: TreeError.rootModified) { try validate(t) { $0.upsertUnchecked(r) } }
        r = root
        r.wrappedKey = [1]
        #expect(throws: TreeError.rootModified) { try validate(t) { $0.upsertUnchecked(r) } }
        r = root
        r.access = [AccessEntry(account: owner, mode: .owner, sealedKey: [1])]
        #expect(throws: TreeError.rootModified) { try validate(t) { $0.upsertUnchecked(r) } }
    }

    @Test func rootAttributesMayChange() throws {
        var r = root
        r.sealedAttributes = [4, 5, 6]
        let changed = try validate(sampleTree()) { $0.upsertUnchecked(r) }
        #expect(changed == [r])
    }

    @Test func secondRootIsRefused() {
        let other = FileMetadata(
            id: fid(50), type: .folder, parent: fid(50), name: sname("r2"), owner: owner,
            wrappedKey: [], sealedAttributes: [], lastModifiedBy: owner)
        #expect(throws: TreeError.multipleRoots) { try validate(sampleTree()) { $0.upsertUnchecked(other) } }
        #expect(throws: TreeError.multipleRoots) {
            try validate(FileTree()) {
                $0.upsertUnchecked(root)
                $0.upsertUnchecked(other)
            }
        }
        #expect(throws: TreeError.multipleRoots) { try validate(sampleTree()) { try $0.create(other) } }
        // A folder made its own parent becomes a second root.
        #expect(throws: TreeError.multipleRoots) {
            try validate(sampleTree()) { $0.upsertUnchecked(folder(2, parent: 2, "a")) }
        }
    }

    // MARK: Path conflicts

    @Test func sameNameInOneFolderIsRefused() {
        #expect(throws: TreeError.pathConflict(fid(10).description)) {
            try validate(sampleTree()) { $0.upsertUnchecked(meta(10, parent: 2, "d")) }
        }
        // Different type, same name: still a conflict.
        #expect(throws: TreeError.pathConflict(fid(10).description)) {
            try validate(sampleTree()) { $0.upsertUnchecked(folder(10, parent: 2, "c")) }
        }
    }

    @Test func sameNameIsAllowedInOtherFoldersOrWhenDeleted() throws {
        #expect(try validate(sampleTree()) { $0.upsertUnchecked(meta(10, parent: 3, "d")) }.map(\.id) == [fid(10)])
        #expect(
            try validate(sampleTree()) { $0.upsertUnchecked(meta(10, parent: 2, "d", deleted: true)) }.map(\.id) == [
                fid(10)
            ])
        var t = sampleTree()
        t.insert(meta(4, parent: 2, "d", deleted: true))
        #expect(try validate(t) { $0.upsertUnchecked(meta(10, parent: 2, "d")) }.map(\.id) == [fid(10)])
    }

    @Test func sameNameIsAllowedInsideADeletedFolder() throws {
        var t = sampleTree()
        t.insert(folder(2, parent: 1, "a", deleted: true))
        // d(4) is implicitly deleted; a new live-flagged sibling with its name is not a conflict.
        #expect(try validate(t) { $0.upsertUnchecked(meta(10, parent: 2, "d")) }.map(\.id) == [fid(10)])
        // deeper: c(5) is implicitly deleted
        #expect(try validate(t) { $0.upsertUnchecked(meta(10, parent: 5, "e")) }.map(\.id) == [fid(10)])
    }

    @Test func revivingAFolderRechecksItsSubtree() {
        var t = sampleTree()
        t.insert(folder(2, parent: 1, "a", deleted: true))
        t.insert(meta(10, parent: 5, "dup"))
        t.insert(meta(11, parent: 5, "dup"))  // allowed while a/ is deleted
        // Either duplicate may be named: siblings are checked in the order of a dictionary.
        let duplicates: [TreeError] = [.pathConflict(fid(10).description), .pathConflict(fid(11).description)]
        let revived = #expect(throws: TreeError.self) {
            try validate(t) { $0.upsertUnchecked(folder(2, parent: 1, "a")) }
        }
        #expect(revived.map(duplicates.contains) == true, "\(String(describing: revived))")
        // Moving c/ out of the deleted folder revives its children too.
        let moved = #expect(throws: TreeError.self) {
            try validate(t) { $0.upsertUnchecked(folder(5, parent: 3, "c")) }
        }
        #expect(moved.map(duplicates.contains) == true, "\(String(describing: moved))")
        // Without the duplicate, reviving is fine.
        t.remove(fid(11))
        #expect(throws: Never.self) { try validate(t) { $0.upsertUnchecked(folder(2, parent: 1, "a")) } }
    }

    // MARK: Cycles

    @Test func moveIntoSelfOrDescendantIsRefused() {
        let t = sampleTree()
        #expect(throws: TreeError.cycle(fid(2).description)) {
            try validate(t) { $0.upsertUnchecked(folder(2, parent: 5, "a")) }
        }
        #expect(throws: TreeError.cycle(fid(2).description)) {
            try validate(t) { $0.upsertUnchecked(folder(2, parent: 6, "a")) }
        }
    }

    /// Walks up are memoised and remember where they have been: a chain a few dozen levels deep
    /// is accepted, and a cycle above the changed record (which cannot contain the record
    /// itself) is still a cycle, short or long.
    @Test func deepChainsAndCyclesAboveTheChangedRecord() {
        var t = sampleTree()
        let depth = 32 * 2 + 5
        for i in 0..<depth { t.insert(folder(100 + i, parent: i == 0 ? 1 : 99 + i, "f\(i)")) }
        #expect(throws: Never.self) { try validate(t) { $0.upsertUnchecked(meta(400, parent: 99 + depth, "leaf")) } }
        for ring in [2, 32 + 7] {
            var broken = sampleTree()
            // folders 200 ... 200+ring-1 point at each other in a ring, detached from the root
            for i in 0..<ring { broken.insert(folder(200 + i, parent: 200 + (i + 1) % ring, "r\(i)")) }
            #expect(throws: TreeError.cycle(fid(400).description)) {
                try validate(broken) { $0.upsertUnchecked(meta(400, parent: 200, "under")) }
            }
        }
        // An orphan is still named by the first ancestor whose parent is missing.
        var orphaned = sampleTree()
        for i in 0..<(32 + 3) { orphaned.insert(folder(300 + i, parent: i == 0 ? 999 : 299 + i, "o\(i)")) }
        #expect(throws: TreeError.orphan(fid(300).description)) {
            try validate(orphaned) { $0.upsertUnchecked(meta(400, parent: 300 + 32 + 2, "deep")) }
        }
    }

    @Test func twoAndThreeFolderCyclesAreRefused() {
        let t = sampleTree()
        // a ↔ b
        #expect(throws: TreeError.cycle(fid(2).description)) {
            try validate(t) {
                $0.upsertUnchecked(folder(2, parent: 3, "a"))
                $0.upsertUnchecked(folder(3, parent: 2, "b"))
            }
        }
        // new folders x → y → z → x, detached from the root
        #expect(throws: TreeError.cycle(fid(20).description)) {
            try validate(t) {
                $0.upsertUnchecked(folder(20, parent: 21, "x"))
                $0.upsertUnchecked(folder(21, parent: 22, "y"))
                $0.upsertUnchecked(folder(22, parent: 20, "z"))
            }
        }
        // a → b → e, with e under a: a three-folder cycle among existing folders.
        #expect(throws: TreeError.cycle(fid(2).description)) {
            try validate(t) {
                $0.upsertUnchecked(folder(2, parent: 3, "a"))
                $0.upsertUnchecked(folder(3, parent: 6, "b"))
            }
        }
        // Each half alone is a valid move.
        #expect(throws: Never.self) { try validate(t) { $0.upsertUnchecked(folder(2, parent: 3, "a")) } }
        #expect(throws: Never.self) { try validate(t) { $0.upsertUnchecked(folder(3, parent: 6, "b")) } }
    }

    // MARK: Orphans and types

    @Test func missingParentIsRefused() {
        #expect(throws: TreeError.orphan(fid(10).description)) {
            try validate(sampleTree()) { $0.upsertUnchecked(meta(10, parent: 99, "x")) }
        }
    }

    @Test func documentParentIsRefused() {
        #expect(throws: TreeError.parentNotFolder(fid(4).description)) {
            try validate(sampleTree()) { $0.upsertUnchecked(meta(10, parent: 4, "x")) }
        }
    }

    @Test func typeChangeIsRefused() {
        #expect(throws: TreeError.typeChanged(fid(4).description)) {
            try validate(sampleTree()) { $0.upsertUnchecked(meta(4, parent: 2, "d", .symlink)) }
        }
    }

    @Test func validateReturnsChangesInFirstChangeOrder() throws {
        let changed = try validate(sampleTree()) {
            $0.upsertUnchecked(meta(12, parent: 3, "n2"))
            $0.upsertUnchecked(meta(10, parent: 3, "n0"))
            $0.upsertUnchecked(meta(12, parent: 3, "n2b"))
        }
        #expect(changed.map(\.id) == [fid(12), fid(10)])
        #expect(changed[0].name == sname("n2b"))
    }

    // MARK: Whole trees

    @Test func validateAllAcceptsAGoodTree() {
        var t = sampleTree()
        #expect(throws: Never.self) { try Validator.validateAll(t) }
        #expect(throws: Never.self) { try Validator.validateAll(FileTree()) }
        // Duplicates inside a deleted folder are fine.
        t.insert(folder(2, parent: 1, "a", deleted: true))
        t.insert(meta(10, parent: 2, "d"))
        t.insert(meta(11, parent: 5, "e"))
        #expect(throws: Never.self) { try Validator.validateAll(t) }
    }

    @Test func validateAllFindsEveryKindOfDamage() {
        var t = sampleTree()
        t.insert(meta(10, parent: 3, "x"))
        t.insert(meta(11, parent: 3, "x"))
        // Which of the two is named depends on the order of a dictionary.
        let duplicate = #expect(throws: TreeError.self) { try Validator.validateAll(t) }
        #expect(duplicate == .pathConflict(fid(10).description) || duplicate == .pathConflict(fid(11).description))

        t = sampleTree()
        t.insert(meta(10, parent: 99, "x"))
        #expect(throws: TreeError.orphan(fid(10).description)) { try Validator.validateAll(t) }

        t = sampleTree()
        t.insert(meta(10, parent: 4, "x"))
        #expect(throws: TreeError.parentNotFolder(fid(4).description)) { try Validator.validateAll(t) }

        t = sampleTree()
        t.insert(folder(20, parent: 21, "x"))
        t.insert(folder(21, parent: 20, "y"))
        let cycle = #expect(throws: TreeError.self) { try Validator.validateAll(t) }
        #expect(cycle == .cycle(fid(20).description) || cycle == .cycle(fid(21).description))

        t = sampleTree()
        t.remove(rootID)
        #expect(throws: TreeError.noRoot) { try Validator.validateAll(t) }  // no root (and orphans)
        t = FileTree([folder(2, parent: 3, "a"), folder(3, parent: 2, "b")])
        #expect(throws: TreeError.noRoot) { try Validator.validateAll(t) }

        t = sampleTree()
        t.insert(
            FileMetadata(
                id: fid(50), type: .folder, parent: fid(50), name: sname("r2"), owner: owner,
                wrappedKey: [], sealedAttributes: [], lastModifiedBy: owner))
        #expect(throws: TreeError.multipleRoots) { try Validator.validateAll(t) }
    }
}
