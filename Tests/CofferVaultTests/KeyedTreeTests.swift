import CofferCrypto
import CofferModel
import Testing

@testable import CofferVault

/// A key handed over directly for some files, as a share will be.
private struct GrantedKeys: KeyAccess {
    var grants: [FileID: SymmetricKey]
    func directKey(of file: FileMetadata) throws -> SymmetricKey? { grants[file.id] }
}

/// root ─ a (folder) ─ d (document), sealed by hand.
private struct HandMadeTree {
    let owner: AccountID
    let rootID: FileID
    let folderID: FileID
    let docID: FileID
    let rootKey = SymmetricKey.random()
    let folderKey = SymmetricKey.random()
    let docKey = SymmetricKey.random()

    init() throws {
        owner = try AccountID(bytes: AccountSecret.generate().signingKeys.publicKey.bytes)
        rootID = try FileID(random: randomBytes(16))
        folderID = try FileID(random: randomBytes(16))
        docID = try FileID(random: randomBytes(16))
    }

    func record(
        _ id: FileID, _ type: FileType, parent: FileID, parentKey: SymmetricKey, key: SymmetricKey, name: String,
        mode: UInt32 = 0o644
    ) -> FileMetadata {
        let attrs = PosixAttributes(
            mode: mode, uid: 0, gid: 0, mtime: Timespec(seconds: 1, nanoseconds: 0), stamp: .zero)
        return FileMetadata(
            id: id, type: type, parent: parent, name: SealedName(sealing: name, parentKey: parentKey, of: id),
            owner: owner, wrappedKey: id == parent ? [] : KeyWrap.wrap(key, with: parentKey, fileID: id.bytes),
            sealedAttributes: attrs.sealed(key: key, of: id), lastModifiedBy: owner)
    }

    var records: [FileMetadata] {
        [
            record(rootID, .folder, parent: rootID, parentKey: rootKey, key: rootKey, name: "alice"),
            record(folderID, .folder, parent: rootID, parentKey: rootKey, key: folderKey, name: "a"),
            record(docID, .document, parent: folderID, parentKey: folderKey, key: docKey, name: "d"),
        ]
    }

    func view(granting grants: [FileID: SymmetricKey]) -> KeyedTree<FileTree> {
        KeyedTree(tree: FileTree(records), access: GrantedKeys(grants: grants))
    }
}

@Suite struct KeyedTreeTests {
    @Test func aKeyGrantedBelowTheRootOpensItsSubtreeAndNothingAbove() throws {
        let t = try HandMadeTree()
        var view = t.view(granting: [t.folderID: t.folderKey])
        #expect(try view.name(t.docID) == "d")
        #expect(try view.attributes(t.docID).mode.value == 0o644)
        #expect(view.describe(t.docID).hasSuffix("/d"))
        // The folder's own name is sealed under the root's key, which was not granted.
        #expect(throws: VaultError.self) { try view.name(t.folderID) }
    }

    @Test func theRootKeyOpensEverythingAndPathsReadInFull() throws {
        let t = try HandMadeTree()
        var view = t.view(granting: [t.rootID: t.rootKey])
        #expect(try view.name(t.docID) == "d")
        #expect(view.path(t.docID) == "/a/d")
        #expect(view.describe(t.docID) == "/a/d")
        // A root that grants this device nothing: no key anywhere below it.
        var locked = t.view(granting: [:])
        #expect(throws: VaultError.self) { try locked.name(t.docID) }
    }

    @Test func theAccountOpensOnlyItsOwnRootEntry() throws {
        let t = try HandMadeTree()
        let mine = AccountSecret.generate()
        let account = try AccountID(bytes: mine.signingKeys.publicKey.bytes)
        var root = t.records[0]
        root.access = [
            AccessEntry(
                account: account, mode: .owner,
                sealedKey: mine.boxKeys.publicKey.seal(key: t.rootKey, fileID: t.rootID.bytes))
        ]
        var view = KeyedTree(
            tree: FileTree([root] + t.records.dropFirst()),
            access: AccountKeyAccess(account: account, box: mine.boxKeys))
        #expect(view.path(t.docID) == "/a/d")
        let other = AccountSecret.generate()
        var foreign = KeyedTree(
            tree: view.tree,
            access: AccountKeyAccess(
                account: try AccountID(bytes: other.signingKeys.publicKey.bytes), box: other.boxKeys))
        #expect(throws: VaultError.self) { try foreign.key(t.docID) }
    }

    @Test func puttingARecordForgetsWhatTheOldOneDecryptedTo() throws {
        let t = try HandMadeTree()
        var view = t.view(granting: [t.rootID: t.rootKey])
        #expect(try view.name(t.docID) == "d")
        #expect(try view.attributes(t.docID).mode.value == 0o644)
        view.put(
            t.record(
                t.docID, .document, parent: t.folderID, parentKey: t.folderKey, key: t.docKey, name: "e", mode: 0o600))
        #expect(try view.name(t.docID) == "e")
        #expect(try view.attributes(t.docID).mode.value == 0o600)
        // Moved to the root: the same key, wrapped again, under a new name.
        view.put(t.record(t.docID, .document, parent: t.rootID, parentKey: t.rootKey, key: t.docKey, name: "f"))
        #expect(view.path(t.docID) == "/f")
        view.remove(t.docID)
        #expect(throws: TreeError.self) { try view.name(t.docID) }
    }

    /// A pull's merged tree can hold a cycle until the merge undoes it; keys known before must
    /// still open what the records in it seal.
    @Test func keysOutliveMovesEvenThroughACycle() throws {
        let t = try HandMadeTree()
        var view = t.view(granting: [t.rootID: t.rootKey])
        #expect(try view.attributes(t.docID).mode.value == 0o644)
        view.put(t.record(t.folderID, .folder, parent: t.docID, parentKey: t.docKey, key: t.folderKey, name: "a"))
        view.put(t.record(t.docID, .folder, parent: t.folderID, parentKey: t.folderKey, key: t.docKey, name: "d"))
        #expect(try view.name(t.docID) == "d")
        #expect(try view.name(t.folderID) == "a")
        #expect(try view.openAttributes(#require(view.tree.file(t.docID))).mode.value == 0o644)
    }

    @Test func aStagedBatchSeesItsRecordsAndLeavesTheBaseViewAlone() throws {
        let t = try HandMadeTree()
        var view = t.view(granting: [t.rootID: t.rootKey])
        #expect(try view.name(t.docID) == "d")
        var staged = view.staged()
        staged.put(t.record(t.docID, .document, parent: t.folderID, parentKey: t.folderKey, key: t.docKey, name: "g"))
        let newID = try FileID(random: randomBytes(16))
        staged.put(t.record(newID, .document, parent: t.folderID, parentKey: t.folderKey, key: .random(), name: "h"))
        #expect(try staged.name(t.docID) == "g")
        #expect(staged.path(newID) == "/a/h")
        #expect(try view.name(t.docID) == "d")
        #expect(view.tree.file(newID) == nil)
    }
}
