import Testing

@testable import CofferModel

@Suite("Batch operations")
struct BatchTests {
    let tree = sampleTree()

    // MARK: Create

    @Test func createIntoFolder() throws {
        var b = Batch(base: tree)
        try b.create(meta(10, parent: 3, "new"))
        try b.create(folder(11, parent: 3, "sub"))
        try b.create(meta(12, parent: 11, "inner"))  // into a folder created in the same batch
        let changed = try b.validate()
        #expect(changed.map(\.id) == [fid(10), fid(11), fid(12)])
        #expect(b.file(fid(12))?.parent == fid(11))
        #expect(Set(b.childIDs(of: fid(3))) == [fid(10), fid(11)])
        #expect(tree.file(fid(10)) == nil, "the base is untouched")
    }

    @Test func createRequiresAnExistingLiveFolder() {
        var b = Batch(base: tree)
        #expect(throws: TreeError.notFound(fid(99).description)) { try b.create(meta(10, parent: 99, "x")) }
        #expect(throws: TreeError.parentNotFolder(fid(4).description)) { try b.create(meta(10, parent: 4, "x")) }
        var t = tree
        t.insert(folder(3, parent: 1, "b", deleted: true))
        var d = Batch(base: t)
        #expect(throws: TreeError.deleted(fid(3).description)) { try d.create(meta(10, parent: 3, "x")) }
        var t2 = tree
        t2.insert(folder(2, parent: 1, "a", deleted: true))
        var d2 = Batch(base: t2)
        // c(5) is implicitly deleted, with its parent.
        #expect(throws: TreeError.deleted(fid(5).description)) { try d2.create(meta(10, parent: 5, "x")) }
        #expect(b.changes.isEmpty, "refused operations change nothing")
    }

    @Test func createRefusesASiblingOfTheSameName() throws {
        var b = Batch(base: tree)
        #expect(throws: TreeError.pathConflict(fid(4).description)) { try b.create(meta(10, parent: 2, "d")) }
        #expect(throws: TreeError.pathConflict(fid(5).description)) { try b.create(meta(10, parent: 2, "c")) }
        try b.create(meta(10, parent: 3, "x"))
        #expect(throws: TreeError.pathConflict(fid(10).description)) { try b.create(meta(11, parent: 3, "x")) }
        // An existing id cannot be created again.
        #expect(throws: TreeError.pathConflict(fid(4).description)) { try b.create(meta(4, parent: 3, "y")) }
    }

    @Test func createNextToADeletedSiblingIsFine() throws {
        var b = Batch(base: tree)
        try b.delete(fid(4))
        try b.create(meta(10, parent: 2, "d"))
        #expect(try b.validate().map(\.id) == [fid(4), fid(10)])
        #expect(b.liveChild(of: fid(2), nameMAC: Array("d".utf8))?.id == fid(10))
    }

    // MARK: Rename

    @Test func rename() throws {
        var b = Batch(base: tree)
        try b.rename(fid(4), to: sname("d2"))
        #expect(b.file(fid(4))?.name == sname("d2"))
        #expect(b.childIDs(of: fid(2), nameMAC: Array("d".utf8)).isEmpty)
        #expect(b.childIDs(of: fid(2), nameMAC: Array("d2".utf8)) == [fid(4)])
        try b.rename(fid(4), to: sname("d2"))  // to its own name
        #expect(try b.validate().map(\.id) == [fid(4)])
    }

    @Test func renameRefusals() {
        var b = Batch(base: tree)
        #expect(throws: TreeError.rootModified) { try b.rename(rootID, to: sname("x")) }
        #expect(throws: TreeError.pathConflict(fid(5).description)) { try b.rename(fid(4), to: sname("c")) }
        #expect(throws: TreeError.notFound(fid(99).description)) { try b.rename(fid(99), to: sname("x")) }
        var t = tree
        t.insert(meta(4, parent: 2, "d", deleted: true))
        var d = Batch(base: t)
        #expect(throws: TreeError.deleted(fid(4).description)) { try d.rename(fid(4), to: sname("x")) }
    }

    // MARK: Move

    @Test func move() throws {
        var b = Batch(base: tree)
        try b.move(fid(5), to: fid(3), name: sname("c"), wrappedKey: [42])
        #expect(b.file(fid(5))?.parent == fid(3))
        #expect(b.file(fid(5))?.wrappedKey == [42])
        #expect(b.childIDs(of: fid(2)) == [fid(4)])
        #expect(b.childIDs(of: fid(3)) == [fid(5)])
        #expect(b.ancestors(of: fid(6)) == [fid(5), fid(3), rootID])
        // Back again under another name.
        try b.move(fid(5), to: fid(2), name: sname("c-again"), wrappedKey: [43])
        #expect(b.childIDs(of: fid(3)).isEmpty)
        #expect(b.childIDs(of: fid(2), nameMAC: Array("c-again".utf8)) == [fid(5)])
        #expect(try b.validate().map(\.id) == [fid(5)])
    }

    @Test func moveRefusals() {
        var b = Batch(base: tree)
        #expect(throws: TreeError.rootModified) { try b.move(rootID, to: fid(2), name: sname("r"), wrappedKey: []) }
        #expect(throws: TreeError.cycle(fid(2).description)) {
            try b.move(fid(2), to: fid(2), name: sname("a"), wrappedKey: [])
        }
        #expect(throws: TreeError.cycle(fid(2).description)) {
            try b.move(fid(2), to: fid(5), name: sname("a"), wrappedKey: [])
        }
        #expect(throws: TreeError.cycle(fid(2).description)) {
            try b.move(fid(2), to: fid(6), name: sname("a"), wrappedKey: [])
        }
        #expect(throws: TreeError.notFound(fid(99).description)) {
            try b.move(fid(4), to: fid(99), name: sname("d"), wrappedKey: [])
        }
        #expect(throws: TreeError.parentNotFolder(fid(4).description)) {
            try b.move(fid(5), to: fid(4), name: sname("c"), wrappedKey: [])
        }
        #expect(throws: TreeError.pathConflict(fid(3).description)) {
            try b.move(fid(5), to: rootID, name: sname("b"), wrappedKey: [])
        }
        #expect(throws: TreeError.notFound(fid(99).description)) {
            try b.move(fid(99), to: rootID, name: sname("z"), wrappedKey: [])
        }
        var t = tree
        t.insert(folder(3, parent: 1, "b", deleted: true))
        var d = Batch(base: t)
        #expect(throws: TreeError.deleted(fid(3).description)) {
            try d.move(fid(4), to: fid(3), name: sname("d"), wrappedKey: [])
        }
        #expect(b.changes.isEmpty)
    }

    @Test func moveIntoAFolderMovedInTheSameBatchIsCheckedAgainstTheBatch() throws {
        var b = Batch(base: tree)
        // b/ moves under a/c/e; then a/ may no longer move into b/ (b is now its descendant).
        try b.move(fid(3), to: fid(6), name: sname("b"), wrappedKey: [])
        #expect(throws: TreeError.cycle(fid(2).description)) {
            try b.move(fid(2), to: fid(3), name: sname("a"), wrappedKey: [])
        }
        #expect(try b.validate().map(\.id) == [fid(3)])
    }

    // MARK: Delete

    @Test func delete() throws {
        var b = Batch(base: tree)
        try b.delete(fid(2))
        #expect(b.deletionState(of: fid(2)) == .explicitlyDeleted)
        #expect(b.deletionState(of: fid(6)) == .implicitlyDeleted)
        #expect(tree.deletionState(of: fid(2)) == .live)
        try b.delete(fid(2))  // deleting again is a no-op
        #expect(try b.validate().map(\.id) == [fid(2)])
    }

    @Test func deleteRefusals() {
        var b = Batch(base: tree)
        #expect(throws: TreeError.rootModified) { try b.delete(rootID) }
        #expect(throws: TreeError.notFound(fid(99).description)) { try b.delete(fid(99)) }
    }

    @Test func operationsOnDeletedFilesAreRefused() throws {
        var b = Batch(base: tree)
        try b.delete(fid(2))
        #expect(throws: TreeError.deleted(fid(4).description)) { try b.rename(fid(4), to: sname("z")) }
        #expect(throws: TreeError.deleted(fid(5).description)) {
            try b.move(fid(5), to: fid(3), name: sname("c"), wrappedKey: [])
        }
        #expect(throws: TreeError.deleted(fid(2).description)) { try b.create(meta(10, parent: 2, "x")) }
        #expect(throws: TreeError.deleted(fid(4).description)) { try b.update(fid(4)) { $0.contentDigest = [1] } }
    }

    // MARK: Update

    @Test func updateContentAndAttributes() throws {
        var b = Batch(base: tree)
        try b.update(fid(4)) {
            $0.contentDigest = [7, 7]
            $0.sealedAttributes = [8]
        }
        #expect(b.file(fid(4))?.contentDigest == [7, 7])
        #expect(try b.validate().map(\.id) == [fid(4)])
    }

    @Test func updateRefusesStructuralChanges() {
        var b = Batch(base: tree)
        #expect(throws: TreeError.typeChanged(fid(4).description)) { try b.update(fid(4)) { $0.type = .folder } }
        let structural = TreeError.invalidName("use rename, move or delete for structural changes")
        #expect(throws: structural) { try b.update(fid(4)) { $0.parent = fid(3) } }
        #expect(throws: structural) { try b.update(fid(4)) { $0.name = sname("other") } }
        #expect(throws: structural) { try b.update(fid(4)) { $0.isDeleted = true } }
        #expect(throws: TreeError.notFound(fid(99).description)) { try b.update(fid(99)) { _ in } }
        #expect(b.changes.isEmpty)
    }

    // MARK: Whole-batch validation

    /// The Sync v3 example: each step alone would conflict if checked against the final state,
    /// but the batch as a whole is valid.
    @Test func orderMattersBatchValidates() throws {
        var b = Batch(base: tree)
        try b.rename(fid(2), to: sname("a2"))  // rename A
        try b.create(meta(10, parent: 1, "a"))  // create B with A's old name
        try b.move(fid(10), to: fid(3), name: sname("a"), wrappedKey: [1])  // move B to another folder
        try b.rename(fid(2), to: sname("a"))  // rename A back
        let changed = try b.validate()
        #expect(changed.map(\.id) == [fid(2), fid(10)])
        #expect(changed[0].name == sname("a") && changed[0].parent == rootID)
        #expect(changed[1].parent == fid(3))
        #expect(b.liveChild(of: rootID, nameMAC: Array("a".utf8))?.id == fid(2))
        #expect(b.liveChild(of: fid(3), nameMAC: Array("a".utf8))?.id == fid(10))
        // Applying it to the tree gives a valid tree.
        var t = tree
        t.apply(changed)
        try Validator.validateAll(t)
    }

    @Test func withoutTheMoveRenamingBackIsRefused() throws {
        var b = Batch(base: tree)
        try b.rename(fid(2), to: sname("a2"))
        try b.create(meta(10, parent: 1, "a"))
        #expect(throws: TreeError.pathConflict(fid(10).description)) { try b.rename(fid(2), to: sname("a")) }
    }

    @Test func batchThatEndsInvalidIsRefusedEvenIfEachStepWasFine() throws {
        var b = Batch(base: tree)
        try b.rename(fid(2), to: sname("a2"))
        try b.create(meta(10, parent: 1, "a"))
        b.upsertUnchecked(folder(2, parent: 1, "a"))  // unchecked: rename A back while B holds the name
        // A is back where it was before the batch, so the conflict is found from B's side.
        #expect(throws: TreeError.pathConflict(fid(10).description)) { try b.validate() }

        // Two creations, each valid alone against the base, that collide with each other.
        var c = Batch(base: tree)
        c.upsertUnchecked(meta(10, parent: 3, "same"))
        c.upsertUnchecked(meta(11, parent: 3, "same"))
        #expect(throws: TreeError.pathConflict(fid(10).description)) { try c.validate() }
        var c1 = Batch(base: tree)
        c1.upsertUnchecked(meta(10, parent: 3, "same"))
        #expect(try c1.validate().map(\.id) == [fid(10)])
    }

    @Test func upsertUncheckedDefersEveryCheckToValidate() {
        var b = Batch(base: tree)
        b.upsertUnchecked(meta(10, parent: 99, "orphan"))
        #expect(b.file(fid(10)) != nil)
        #expect(throws: TreeError.orphan(fid(10).description)) { try b.validate() }
    }

    @Test func describeNamesFilesInErrors() {
        var b = Batch(base: tree)
        #expect(throws: TreeError.pathConflict("/a/d")) {
            try b.create(meta(10, parent: 2, "d"), describe: { $0 == fid(4) ? "/a/d" : "?" })
        }
    }

    @Test func largeBatchStaysCorrect() throws {
        var b = Batch(base: tree)
        for i in 100..<1100 { try b.create(meta(i, parent: 3, "f\(i)")) }
        for i in 100..<1100 where i % 2 == 0 { try b.move(fid(i), to: fid(2), name: sname("g\(i)"), wrappedKey: []) }
        for i in 100..<1100 where i % 3 == 0 { try b.delete(fid(i)) }
        let changed = try b.validate()
        #expect(changed.count == 1000)
        #expect(b.childIDs(of: fid(3)).count == 500)
        #expect(b.childIDs(of: fid(2)).count == 502)
        #expect(b.liveChildren(of: fid(3)).count == 500 - (100..<1100).filter { $0 % 2 == 1 && $0 % 3 == 0 }.count)
    }
}

@Suite("File names")
struct FileNameTests {
    @Test func validNames() throws {
        for n in [
            "a", "...", ".a", "a.", "名前.txt", "with space", String(repeating: "x", count: 255),
            String(repeating: "é", count: 127),  // 254 bytes
            "-", "\\",
        ] {
            #expect(throws: Never.self, "\(n)") { try FileName.validate(n) }
        }
    }

    @Test func invalidNames() {
        #expect(throws: TreeError.invalidName("a name cannot be empty")) { try FileName.validate("") }
        #expect(throws: TreeError.invalidName("\"/\" contains a slash")) { try FileName.validate("/") }
        #expect(throws: TreeError.invalidName("\"a/b\" contains a slash")) { try FileName.validate("a/b") }
        #expect(throws: TreeError.invalidName("\".\" is reserved")) { try FileName.validate(".") }
        #expect(throws: TreeError.invalidName("\"..\" is reserved")) { try FileName.validate("..") }
        #expect(throws: TreeError.invalidName("a name cannot contain a NUL byte")) { try FileName.validate("a\0b") }
        #expect(throws: TreeError.invalidName("a name cannot contain a NUL byte")) { try FileName.validate("\0") }
        let x40 = String(repeating: "x", count: 40)
        let e40 = String(repeating: "é", count: 40)
        #expect(throws: TreeError.invalidName("\"\(x40)…\" is longer than 255 bytes")) {
            try FileName.validate(String(repeating: "x", count: 256))
        }
        #expect(throws: TreeError.invalidName("\"\(e40)…\" is longer than 255 bytes")) {
            try FileName.validate(String(repeating: "é", count: 128))  // 256 bytes
        }
    }

    @Test func tooLongNameMessageMentionsTheLimit() {
        let error = #expect(throws: TreeError.self) { try FileName.validate(String(repeating: "x", count: 300)) }
        #expect(error?.description.contains("longer than 255 bytes") == true, "\(String(describing: error))")
    }
}
