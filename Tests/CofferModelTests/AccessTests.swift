import Testing

@testable import CofferModel

/// Three accounts: `alice` owns the tree, `bob` and `carol` get grants.
let alice = owner
let bob = try! AccountID(bytes: [UInt8](repeating: 0xB0, count: 32))
let carol = try! AccountID(bytes: [UInt8](repeating: 0xC0, count: 32))

/// A stand-in for Ed25519 that the model's tests can compute: the signer's first 8 bytes, then
/// an FNV-1a digest of the message, padded to 64 bytes. Only `fakeVerify` accepts it.
func fakeSign(_ signer: AccountID, _ message: [UInt8]) -> [UInt8] {
    var h: UInt64 = 0xcbf2_9ce4_8422_2325
    for b in message { h = (h ^ UInt64(b)) &* 0x100_0000_01b3 }
    let digest = (0..<8).map { UInt8(truncatingIfNeeded: h >> (8 * $0)) }
    return Array(signer.bytes.prefix(8)) + digest + [UInt8](repeating: 0, count: 48)
}

func fakeVerify(_ signer: AccountID, _ message: [UInt8], _ signature: [UInt8]) -> Bool {
    fakeSign(signer, message) == signature
}

/// A grant on `file` to `account`, signed by `signer` (the owner unless said otherwise). A
/// tombstone its grantee signs (a give-up) keeps the owner's signature of the live grant unless
/// `ownerSigned` is false (a give-up of a grant the owner never made).
func grant(
    _ file: Int, to account: AccountID, _ mode: AccessMode, deleted: Bool = false, by signer: AccountID = alice,
    ownerSigned: Bool = true
) -> AccessEntry {
    var e = AccessEntry(account: account, mode: mode, sealedKey: [UInt8(file), 0x5E], isDeleted: deleted)
    if deleted, signer == account, ownerSigned {
        e.ownerSignature = fakeSign(alice, e.liveGrant.grantMessage(fileID: fid(file)))
    }
    e.signature = fakeSign(signer, e.grantMessage(fileID: fid(file)))
    return e
}

/// `m` as written by `writer`.
func by(_ writer: AccountID, _ m: FileMetadata) -> FileMetadata {
    var m = m
    m.lastModifiedBy = writer
    return m
}

/// root(1)
/// ├── shared(2)/         granted to bob (write) and carol (read)
/// │   ├── doc(3)
/// │   └── inner(4)/
/// │       └── deep(5)
/// └── private(6)/
///     └── secret(7)
func sharedTree() -> FileTree {
    var shared = folder(2, parent: 1, "shared")
    shared.access = [grant(2, to: bob, .write), grant(2, to: carol, .read)]
    return FileTree([
        root, shared, meta(3, parent: 2, "doc"), folder(4, parent: 2, "inner"), meta(5, parent: 4, "deep"),
        folder(6, parent: 1, "private"), meta(7, parent: 6, "secret"),
    ])
}

/// Applies `changes` to `tree` as one batch and runs the access rules over it.
func authorize(
    _ changes: [FileMetadata], in tree: FileTree = sharedTree(), linkTarget: (FileID) -> LinkTargetFacts? = { _ in nil }
) throws(AccessError) {
    var batch = Batch(base: tree)
    for m in changes { batch.upsertUnchecked(m) }
    try Authorization.check(
        changed: changes.map(\.id), before: tree, after: batch, verify: fakeVerify, linkTarget: linkTarget)
}

func refusal(_ body: () throws(AccessError) -> Void) -> AccessError? {
    do {
        try body()
        return nil
    } catch { return error }
}

/// Which rule a refusal names (its message aside), for tests that check the kind.
func kind(_ e: AccessError?) -> String? {
    switch e {
    case .denied?: "denied"
    case .invalidGrant?: "invalidGrant"
    case .invalidLink?: "invalidLink"
    case .crossOwner?: "crossOwner"
    case nil: nil
    }
}

@Suite("Access modes and the rules every change is held to")
struct AccessTests {
    @Test func modesAreTheHighestGrantOnTheFileOrAnAncestor() {
        var tree = sharedTree()
        #expect(tree.accessMode(of: alice, on: fid(5)) == .owner)
        #expect(tree.accessMode(of: bob, on: fid(5)) == .write)
        #expect(tree.accessMode(of: carol, on: fid(3)) == .read)
        #expect(tree.accessMode(of: bob, on: fid(7)) == nil)
        #expect(tree.accessMode(of: bob, on: fid(2)) == .write)
        #expect(tree.accessMode(of: bob, on: rootID) == nil)
        // Nested grants combine as the highest: read above, write below gives write below only.
        var inner = tree.file(fid(4))!
        inner.access = [grant(4, to: carol, .write)]
        tree.insert(inner)
        #expect(tree.accessMode(of: carol, on: fid(5)) == .write)
        #expect(tree.accessMode(of: carol, on: fid(3)) == .read)
        // A revoked grant gives nothing.
        var shared = tree.file(fid(2))!
        shared.access = [grant(2, to: bob, .write, deleted: true)]
        tree.insert(shared)
        #expect(tree.accessMode(of: bob, on: fid(3)) == nil)
        #expect(tree.sharedAncestor(ofOrAt: fid(5)) == fid(4))
        #expect(tree.sharedAncestor(ofOrAt: fid(3)) == nil)
    }

    @Test func aSharedFolderSeenWithoutItsParentStillGivesItsMode() {
        // A sharee's tree holds the shared folder without the owner's folders above it.
        var shared = folder(2, parent: 1, "shared")
        shared.access = [grant(2, to: bob, .read)]
        let view = FileTree([shared, meta(3, parent: 2, "doc")])
        #expect(view.accessMode(of: bob, on: fid(3)) == .read)
        #expect(view.accessMode(of: carol, on: fid(3)) == nil)
    }

    @Test func theOwnerMayDoAnything() throws {
        var doc = meta(3, parent: 2, "renamed")
        doc.sealedAttributes = [7]
        try authorize([doc, meta(20, parent: 6, "new"), folder(4, parent: 6, "inner-moved")])
        var shared = sharedTree().file(fid(2))!
        shared.access = [grant(2, to: bob, .read), grant(2, to: carol, .read, deleted: true)]
        try authorize([shared])
    }

    @Test func aWriteShareeEditsCreatesRenamesAndDeletesInside() throws {
        var doc = by(bob, meta(3, parent: 2, "doc"))
        doc.sealedAttributes = [9, 9]
        doc.contentDigest = [1, 2]
        try authorize([doc])
        try authorize([by(bob, meta(20, parent: 4, "new"))])
        // A new folder, and a file in it, are judged by the shared folder above them.
        try authorize([by(bob, folder(21, parent: 2, "sub")), by(bob, meta(22, parent: 21, "in-sub"))])
        try authorize([by(bob, meta(3, parent: 2, "renamed"))])
        try authorize([by(bob, meta(5, parent: 2, "deep"))])  // moved within the share
        try authorize([by(bob, meta(3, parent: 2, "doc", deleted: true))])
    }

    @Test func aReadShareeChangesNothing() {
        var doc = by(carol, meta(3, parent: 2, "doc"))
        doc.contentDigest = [1, 2]
        for change in [
            doc, by(carol, meta(20, parent: 2, "new")), by(carol, meta(3, parent: 2, "renamed")),
            by(carol, meta(3, parent: 2, "doc", deleted: true)), by(carol, meta(5, parent: 2, "deep")),
        ] {
            guard case .denied = refusal({ () throws(AccessError) in try authorize([change]) }) else {
                Issue.record("read sharee's change to \(change.id) was not denied")
                continue
            }
        }
    }

    @Test func aShareeCannotMoveRenameOrDeleteTheSharedFolderItself() {
        for change in [
            by(bob, folder(2, parent: 1, "renamed")), by(bob, folder(2, parent: 6, "shared")),
            by(bob, folder(2, parent: 1, "shared", deleted: true)),
        ] {
            var m = change
            m.access = sharedTree().file(fid(2))!.access
            guard case .denied = refusal({ () throws(AccessError) in try authorize([m]) }) else {
                Issue.record("sharee changed the shared root: \(m.name.mac)")
                continue
            }
        }
    }

    @Test func nothingMovesInOrOutOfASharedFolderWithoutWriteOnBothSides() {
        // Bob cannot move a shared file into Alice's private folder, nor bring one in from there.
        guard case .denied = refusal({ () throws(AccessError) in try authorize([by(bob, meta(3, parent: 6, "doc"))]) })
        else {
            Issue.record("move out of the share was not denied")
            return
        }
        guard case .denied = refusal({ () throws(AccessError) in try authorize([by(bob, meta(7, parent: 2, "s"))]) })
        else {
            Issue.record("move into the share was not denied")
            return
        }
    }

    @Test func accessIsJudgedBeforeTheBatch() throws {
        // One batch (as a device pulls it): alice gives carol write, and carol writes. Judged on
        // the batch's own tree carol would hold write; judged before it, she holds read.
        var upgraded = folder(2, parent: 1, "shared")
        upgraded.access = [grant(2, to: bob, .write), grant(2, to: carol, .write)]
        var doc = by(carol, meta(3, parent: 2, "doc"))
        doc.contentDigest = [5]
        guard case .denied = refusal({ () throws(AccessError) in try authorize([upgraded, doc]) }) else {
            Issue.record("a write judged on the batch's own grants was accepted")
            return
        }
        // The grant alone is fine, and once it is in the tree, so is carol's write.
        try authorize([upgraded])
        var tree = sharedTree()
        tree.insert(upgraded)
        try authorize([doc], in: tree)
    }

    @Test func aGranteeChangesNothingItMayNotWriteNorReplacesTheSharedKey() throws {
        // A record changed in nothing but its writer (re-signed): write on the file needed.
        guard
            case .denied = refusal({ () throws(AccessError) in try authorize([by(carol, meta(3, parent: 2, "doc"))]) })
        else {
            Issue.record("a reader re-signed a record")
            return
        }
        try authorize([by(bob, meta(3, parent: 2, "doc"))])
        // The shared folder's key is wrapped under its parent's: bob (write on the share, not
        // above it) cannot replace it; alice can.
        var rewrapped = sharedTree().file(fid(2))!
        rewrapped.wrappedKey = [0xEE]
        guard case .denied = refusal({ () throws(AccessError) in try authorize([by(bob, rewrapped)]) }) else {
            Issue.record("a grantee replaced the shared folder's key")
            return
        }
        try authorize([rewrapped])
    }

    @Test func onlyTheOwnerGrants() {
        // Bob (write) re-shares with carol at write, or grants himself more: denied, whoever
        // signed the grant, because he writes the record.
        for signer in [bob, alice] {
            var shared = by(bob, folder(2, parent: 1, "shared"))
            shared.access = [grant(2, to: bob, .write), grant(2, to: carol, .write, by: signer)]
            guard case .denied = refusal({ () throws(AccessError) in try authorize([shared]) }) else {
                Issue.record("a sharee changed a grant (signed by \(signer == bob ? "bob" : "alice"))")
                continue
            }
        }
        var upgraded = by(carol, folder(2, parent: 1, "shared"))
        upgraded.access = [grant(2, to: bob, .write), grant(2, to: carol, .write, by: carol)]
        #expect(kind(refusal({ () throws(AccessError) in try authorize([upgraded]) })) == "denied")
        // Bob cannot revoke carol either.
        var revoked = by(bob, folder(2, parent: 1, "shared"))
        revoked.access = [grant(2, to: bob, .write), grant(2, to: carol, .read, deleted: true, by: bob)]
        #expect(kind(refusal({ () throws(AccessError) in try authorize([revoked]) })) == "denied")
    }

    @Test func aShareeMayGiveUpItsOwnGrantAndNothingElse() throws {
        var left = by(carol, folder(2, parent: 1, "shared"))
        left.access = [grant(2, to: bob, .write), grant(2, to: carol, .read, deleted: true, by: carol)]
        try authorize([left])
        // Giving up while changing the mode is not giving up.
        var sneaky = left
        sneaky.access[1] = grant(2, to: carol, .write, deleted: true, by: carol)
        #expect(kind(refusal({ () throws(AccessError) in try authorize([sneaky]) })) == "denied")
        // A give-up that does not keep the owner's signature of the grant it ends.
        var bare = left
        bare.access[1] = grant(2, to: carol, .read, deleted: true, by: carol, ownerSigned: false)
        #expect(kind(refusal({ () throws(AccessError) in try authorize([bare]) })) == "denied")
        // A tombstone signed by someone else is no tombstone of hers.
        var forged = left
        forged.access[1] = grant(2, to: carol, .read, deleted: true, by: bob)
        #expect(kind(refusal({ () throws(AccessError) in try authorize([forged]) })) == "denied")
    }

    @Test func grantsAreSignedOneEachNeverRemovedAndNeverOnTheRoot() {
        var unsigned = folder(2, parent: 1, "shared")
        unsigned.access = [grant(2, to: bob, .write), AccessEntry(account: carol, mode: .write, sealedKey: [1])]
        var badSignature = folder(2, parent: 1, "shared")
        badSignature.access = [grant(2, to: bob, .write), grant(3, to: carol, .read)]  // signed for file 3
        badSignature.access[1].sealedKey = [2, 0x5E]
        var twice = folder(2, parent: 1, "shared")
        twice.access = [grant(2, to: bob, .write), grant(2, to: carol, .read), grant(2, to: carol, .write)]
        var dropped = folder(2, parent: 1, "shared")
        dropped.access = [grant(2, to: bob, .write)]
        var toOwner = folder(6, parent: 1, "private")
        toOwner.access = [grant(6, to: alice, .write)]
        var ownerMode = folder(6, parent: 1, "private")
        ownerMode.access = [grant(6, to: bob, .owner)]
        var sharedRoot = root
        sharedRoot.access = [grant(1, to: bob, .read)]
        for m in [unsigned, badSignature, twice, dropped, toOwner, ownerMode, sharedRoot] {
            guard case .invalidGrant = refusal({ () throws(AccessError) in try authorize([m]) }) else {
                Issue.record("grant change on \(m.id) was not refused as invalid")
                continue
            }
        }
    }

    @Test func filesBelongToTheirFoldersOwner() {
        // Bob creates a file in the shared folder under his own name: refused; under Alice's: fine.
        var his = by(bob, meta(20, parent: 2, "his"))
        his.owner = bob
        guard case .crossOwner = refusal({ () throws(AccessError) in try authorize([his]) }) else {
            Issue.record("a file owned by bob in alice's folder was accepted")
            return
        }
        var changed = meta(3, parent: 2, "doc")
        changed.owner = bob
        #expect(
            refusal({ () throws(AccessError) in try authorize([changed]) }) == .crossOwner("\(fid(3)) changes owner"))
    }

    @Test func linksPointAtAnotherAccountsLiveSharedFileOnceAndStayOutOfShares() {
        let target = fid(900)
        func link(_ id: Int, parent: Int, to t: FileID = target) -> FileMetadata {
            var m = meta(id, parent: parent, "link-\(id)", .link)
            m.contentDigest = nil
            m.linkTarget = t
            return m
        }
        let shared = LinkTargetFacts(owner: bob, isLive: true, mode: .read, liveLinks: [])
        let facts: (FileID) -> LinkTargetFacts? = { $0 == target ? shared : nil }
        #expect(refusal({ () throws(AccessError) in try authorize([link(30, parent: 6)], linkTarget: facts) }) == nil)
        let cases: [(FileMetadata, (FileID) -> LinkTargetFacts?, String)] = [
            (link(30, parent: 2), facts, "in a shared folder"),
            (link(30, parent: 6, to: fid(901)), facts, "to nothing"),
            (
                link(30, parent: 6), { _ in LinkTargetFacts(owner: alice, isLive: true, mode: .owner, liveLinks: []) },
                "own"
            ),
            (
                link(30, parent: 6), { _ in LinkTargetFacts(owner: bob, isLive: true, mode: nil, liveLinks: []) },
                "unshared"
            ),
            (
                link(30, parent: 6), { _ in LinkTargetFacts(owner: bob, isLive: false, mode: .read, liveLinks: []) },
                "gone"
            ),
            (
                link(30, parent: 6),
                { _ in LinkTargetFacts(owner: bob, isLive: true, mode: .read, liveLinks: [fid(31)]) },
                "second"
            ),
        ]
        for (m, f, what) in cases {
            guard case .invalidLink = refusal({ () throws(AccessError) in try authorize([m], linkTarget: f) }) else {
                Issue.record("link \(what) was not refused")
                continue
            }
        }
        var noTarget = link(30, parent: 6)
        noTarget.linkTarget = nil
        var notALink = meta(30, parent: 6, "doc")
        notALink.linkTarget = target
        for m in [noTarget, notALink] {
            guard case .invalidLink = refusal({ () throws(AccessError) in try authorize([m], linkTarget: facts) })
            else {
                Issue.record("malformed link \(m.type) was not refused")
                continue
            }
        }
        // A folder holding a link cannot be shared, nor moved into a shared folder.
        var tree = sharedTree()
        tree.insert(link(30, parent: 6))
        var sharedPrivate = folder(6, parent: 1, "private")
        sharedPrivate.access = [grant(6, to: carol, .read)]
        guard case .invalidLink = refusal({ () throws(AccessError) in try authorize([sharedPrivate], in: tree) }) else {
            Issue.record("a folder holding a link was shared")
            return
        }
        guard
            case .invalidLink = refusal({ () throws(AccessError) in
                try authorize([folder(6, parent: 2, "private")], in: tree)
            })
        else {
            Issue.record("a folder holding a link moved into a shared folder")
            return
        }
        // A link cannot itself be shared.
        var sharedLink = link(30, parent: 6)
        sharedLink.access = [grant(30, to: carol, .read)]
        #expect(
            kind(refusal({ () throws(AccessError) in try authorize([sharedLink], in: tree, linkTarget: facts) }))
                == "invalidGrant")
        // A standing link renamed keeps standing even if its target is gone.
        var renamed = link(30, parent: 6)
        renamed.name = sname("renamed-link")
        #expect(refusal({ () throws(AccessError) in try authorize([renamed], in: tree) }) == nil)
    }

    @Test func aNewTreeIsItsOwnersToFill() {
        let firstPush = [root, folder(2, parent: 1, "a"), meta(3, parent: 2, "d")]
        #expect(refusal({ () throws(AccessError) in try authorize(firstPush, in: FileTree()) }) == nil)
        let intruder = [root, by(bob, folder(2, parent: 1, "a"))]
        guard case .denied = refusal({ () throws(AccessError) in try authorize(intruder, in: FileTree()) }) else {
            Issue.record("bob filled alice's new tree")
            return
        }
    }

    @Test func theRootIsOnlyItsOwners() {
        let bobsRoot = FileMetadata(
            id: fid(100), type: .folder, parent: fid(100), name: sname("bob"), owner: alice,
            wrappedKey: [], sealedAttributes: [0], lastModifiedBy: bob)
        #expect(kind(refusal({ () throws(AccessError) in try authorize([bobsRoot], in: FileTree()) })) == "denied")
        var chmod = by(bob, root)
        chmod.sealedAttributes = [1]
        #expect(kind(refusal({ () throws(AccessError) in try authorize([chmod]) })) == "denied")
        var own = root
        own.sealedAttributes = [1]
        #expect(refusal({ () throws(AccessError) in try authorize([own]) }) == nil)
    }
}

/// How a device judges a record another account wrote, as pulled (`Authorization.checkPulled`).
@Suite struct PulledRecordTests {
    func check(_ m: FileMetadata, in tree: FileTree = sharedTree()) throws(AccessError) {
        var staged = tree
        staged.insert(m)
        try Authorization.checkPulled(m, old: tree.file(m.id), in: staged, verify: fakeVerify)
    }

    @Test func theOwnerAndWriteGranteesWrite() throws {
        try check(by(alice, meta(3, parent: 2, "doc-renamed")))
        try check(by(bob, meta(3, parent: 2, "doc-by-bob")))
        try check(by(bob, meta(8, parent: 4, "new-by-bob")))
        // Moved within the share.
        try check(by(bob, meta(5, parent: 2, "deep")))
    }

    @Test func readersStrangersAndForgedGrantsAreRefused() throws {
        #expect(throws: AccessError.self) { try check(by(carol, meta(3, parent: 2, "doc-by-carol"))) }
        let dave = try AccountID(bytes: [UInt8](repeating: 0xD0, count: 32))
        #expect(throws: AccessError.self) { try check(by(dave, meta(8, parent: 2, "x"))) }
        // Outside the share, and out of it: bob holds nothing above the shared folder.
        #expect(throws: AccessError.self) { try check(by(bob, meta(7, parent: 6, "secret2"))) }
        #expect(throws: AccessError.self) { try check(by(bob, meta(5, parent: 6, "deep"))) }
        // Carol raising her own grant, bob granting dave, bob's forged owner signature.
        var shared = sharedTree().file(fid(2))!
        shared.access[1] = grant(2, to: carol, .write, by: carol)
        #expect(throws: AccessError.self) { try check(by(carol, shared)) }
        shared = sharedTree().file(fid(2))!
        shared.access.append(grant(2, to: dave, .read, by: bob))
        #expect(throws: AccessError.self) { try check(by(bob, shared)) }
        // The root is its owner's alone.
        #expect(throws: AccessError.self) { try check(by(bob, root)) }
        // A record that changes owner.
        var moved = meta(3, parent: 2, "doc")
        moved.owner = bob
        #expect(throws: AccessError.self) { try check(by(bob, moved)) }
    }

    /// A writer the owner revoked: a device pulling from scratch sees only the tombstone, and
    /// takes nothing the writer signed (the owner's revocation signs what it wrote as the
    /// owner's own, so a record of its left in the tree was written after). One that gave its
    /// grant up itself still counts for what it wrote.
    @Test func aRevokedWritersRecordsAreRefusedAndAGivenUpWritersStand() throws {
        var tree = sharedTree()
        var shared = tree.file(fid(2))!
        shared.access[0] = grant(2, to: bob, .write, deleted: true)
        tree.insert(shared)
        #expect(throws: AccessError.self) { try check(by(bob, meta(3, parent: 2, "doc-by-bob")), in: tree) }
        shared.access[0] = grant(2, to: bob, .write, deleted: true, by: bob)
        tree.insert(shared)
        try check(by(bob, meta(3, parent: 2, "doc-by-bob")), in: tree)
        // A read grant, live or revoked, never made a writer.
        shared.access[1] = grant(2, to: carol, .read, deleted: true)
        tree.insert(shared)
        #expect(throws: AccessError.self) { try check(by(carol, meta(3, parent: 2, "doc")), in: tree) }
    }

    @Test func aGranteeGivesUpItsOwnGrant() throws {
        var shared = sharedTree().file(fid(2))!
        shared.access[1] = grant(2, to: carol, .read, deleted: true, by: carol)
        try check(by(carol, shared))
        // Giving up someone else's is not giving up.
        shared = sharedTree().file(fid(2))!
        shared.access[0] = grant(2, to: bob, .write, deleted: true, by: carol)
        #expect(throws: AccessError.self) { try check(by(carol, shared)) }
    }

    /// A file of an account the server made up, placed in a shared folder, is refused however it
    /// is signed (one owner per subtree).
    @Test func aStrangersFileInAShareIsRefused() throws {
        let dave = try AccountID(bytes: [UInt8](repeating: 0xD0, count: 32))
        var planted = meta(8, parent: 2, "planted")
        planted.owner = dave
        planted.lastModifiedBy = dave
        #expect(throws: AccessError.crossOwner("\(fid(8)) would sit in a folder another account owns")) {
            try check(planted)
        }
    }

    /// A write grantee renames, moves, deletes or re-keys the shared folder itself: it holds no
    /// write on the folder above, which all of these need.
    @Test func aWriteGranteeCannotPlaceTheSharedFolder() throws {
        var shared = sharedTree().file(fid(2))!
        shared.lastModifiedBy = bob
        var renamed = shared
        renamed.name = SealedName(ciphertext: [9], mac: [9])
        var deleted = shared
        deleted.isDeleted = true
        var rekeyed = shared
        rekeyed.wrappedKey = [7, 7, 7]
        var moved = shared
        moved.parent = fid(6)
        for m in [renamed, deleted, rekeyed, moved] {
            #expect(throws: AccessError.self) { try check(m) }
        }
        // Inside it, the same changes are bob's to make.
        var inner = sharedTree().file(fid(4))!
        inner.lastModifiedBy = bob
        inner.name = SealedName(ciphertext: [9], mac: [9])
        try check(inner)
    }

    /// A device new to a record (none held before) judges what it can: grants by their own
    /// signatures whoever carried them, and write at or above the file by a grant the owner
    /// signed. A give-up is told from a grant never held by the owner's signature it keeps.
    @Test func aDeviceNewToARecordJudgesWhatItCan() throws {
        let tree = sharedTree()
        func fresh(_ m: FileMetadata) throws(AccessError) {
            var staged = tree
            staged.insert(m)
            try Authorization.checkPulled(m, old: nil, in: staged, verify: fakeVerify)
        }
        // Carol's give-up, carried on the shared folder's record she re-signed: a reader's record
        // cannot be told from a change she may not make, so it waits for the owner's re-signed
        // record. Bob's, a writer's, stands with the owner's signature of his grant, and not
        // without.
        var givenUp = tree.file(fid(2))!
        givenUp.access[1] = grant(2, to: carol, .read, deleted: true, by: carol)
        givenUp.lastModifiedBy = carol
        #expect(throws: AccessError.self) { try fresh(givenUp) }
        givenUp = tree.file(fid(2))!
        givenUp.access[0] = grant(2, to: bob, .write, deleted: true, by: bob)
        givenUp.lastModifiedBy = bob
        try fresh(givenUp)
        givenUp.access[0] = grant(2, to: bob, .write, deleted: true, by: bob, ownerSigned: false)
        #expect(throws: AccessError.self) { try fresh(givenUp) }
        // Bob's later change of the folder's attributes, carrying alice's grants as they were.
        var changed = tree.file(fid(2))!
        changed.sealedAttributes = [1, 2, 3]
        changed.lastModifiedBy = bob
        try fresh(changed)
        // But carol, a reader, writing anything else; or a grant nobody signed.
        var byCarol = tree.file(fid(3))!
        byCarol.lastModifiedBy = carol
        byCarol.contentDigest = [0xEE]
        #expect(throws: AccessError.self) { try fresh(byCarol) }
        var forged = tree.file(fid(2))!
        forged.access.append(grant(2, to: try AccountID(bytes: [UInt8](repeating: 0xD0, count: 32)), .write, by: bob))
        forged.lastModifiedBy = bob
        #expect(throws: AccessError.self) { try fresh(forged) }
    }

    /// A tombstone an account signs for itself proves no grant: a made-up account adding one,
    /// with write mode, to a file it then changes gains nothing, on a device that held the
    /// record and on one new to it; and a give-up of a grant never held is refused.
    @Test func aSelfSignedTombstoneGivesNoWrite() throws {
        let dave = try AccountID(bytes: [UInt8](repeating: 0xD0, count: 32))
        let tree = sharedTree()
        var doc = tree.file(fid(3))!
        doc.access.append(grant(3, to: dave, .write, deleted: true, by: dave, ownerSigned: false))
        doc.contentDigest = [0xEE]
        doc.lastModifiedBy = dave
        #expect(throws: AccessError.self) { try check(doc) }
        var staged = tree
        staged.insert(doc)
        #expect(throws: AccessError.self) {
            try Authorization.checkPulled(doc, old: nil, in: staged, verify: fakeVerify)
        }
        // Only the tombstone: a give-up of a grant dave never had.
        var only = tree.file(fid(3))!
        only.access.append(grant(3, to: dave, .write, deleted: true, by: dave, ownerSigned: false))
        only.lastModifiedBy = dave
        #expect(throws: AccessError.self) { try check(only) }
    }

    /// The shared tree with bob's grant on the shared folder replaced by `entry` (that record
    /// written by `sharedBy`, the owner unless said), and bob's content edit of the document in
    /// it, staged: the shared folder's and the document's records.
    func bobsEdit(
        under entry: AccessEntry, sharedBy: AccountID = alice
    ) -> (staged: FileTree, shared: FileMetadata, doc: FileMetadata) {
        var staged = sharedTree()
        var shared = staged.file(fid(2))!
        shared.access[0] = entry
        shared.lastModifiedBy = sharedBy
        staged.insert(shared)
        var doc = staged.file(fid(3))!
        doc.contentDigest = [0xAB]
        doc.lastModifiedBy = bob
        staged.insert(doc)
        return (staged, shared, doc)
    }

    /// A write grantee's change that a pull brings with its own give-up: the give-up keeps the
    /// owner's signature of the grant it ends, so the record stands on a device that held the
    /// record and on one new to it. A give-up without it proves nothing, on any device.
    @Test func aWritersRecordStandsBesideItsGiveUp() throws {
        let held = sharedTree()
        for ownerSigned in [true, false] {
            let (staged, shared, doc) = bobsEdit(
                under: grant(2, to: bob, .write, deleted: true, by: bob, ownerSigned: ownerSigned), sharedBy: bob)
            for old in [held.file(fid(3)), nil] {
                if ownerSigned {
                    try Authorization.checkPulled(
                        shared, old: old == nil ? nil : held.file(fid(2)), in: staged, verify: fakeVerify)
                    try Authorization.checkPulled(doc, old: old, in: staged, verify: fakeVerify)
                } else {
                    #expect(throws: AccessError.self) {
                        try Authorization.checkPulled(
                            shared, old: old == nil ? nil : held.file(fid(2)), in: staged, verify: fakeVerify)
                    }
                    #expect(throws: AccessError.self) {
                        try Authorization.checkPulled(doc, old: old, in: staged, verify: fakeVerify)
                    }
                }
            }
        }
    }

    /// A grant the device holds revoked (or given up) is not brought back by replaying the
    /// owner's signature of it live, whoever carries it; a new grant (sealed afresh) is taken.
    @Test func aRevokedGrantIsNotBroughtBackByItsOldSignature() throws {
        var held = sharedTree()
        var revoked = held.file(fid(2))!
        let live = revoked.access[0]
        revoked.access[0] = grant(2, to: bob, .write, deleted: true)
        held.insert(revoked)
        for ended in [
            revoked,
            {
                var g = revoked
                g.access[0] = grant(2, to: bob, .write, deleted: true, by: bob)
                return g
            }(),
        ] {
            var staged = held
            staged.insert(ended)
            var revived = ended
            revived.access[0] = live
            revived.lastModifiedBy = alice
            staged.insert(revived)
            #expect(throws: AccessError.self) {
                try Authorization.checkPulled(revived, old: ended, in: staged, verify: fakeVerify)
            }
        }
        var regranted = revoked
        regranted.access[0] = AccessEntry(account: bob, mode: .write, sealedKey: [9, 9])
        regranted.access[0].signature = fakeSign(alice, regranted.access[0].grantMessage(fileID: fid(2)))
        var staged = held
        staged.insert(regranted)
        try Authorization.checkPulled(regranted, old: revoked, in: staged, verify: fakeVerify)
    }

    /// A revoked grantee holds the owner's signature of its old grant; after the revocation the
    /// owner replaced the folder's key. Passing that grant off as given up, on the folder's
    /// current record, is refused by a device new to the record (the grant is of an older key
    /// generation) and by one that held the revocation (the grant was not live there); a real
    /// give-up, of a grant of the current generation, stands.
    @Test func aRevokedGrantIsNotPassedOffAsGivenUp() throws {
        var tree = sharedTree()
        var rotated = tree.file(fid(2))!
        rotated.keyGeneration = 1
        rotated.access[0] = grant(2, to: bob, .write, deleted: true)  // alice's revocation, at generation 0
        tree.insert(rotated)
        var forged = rotated
        forged.access[0] = grant(2, to: bob, .write, deleted: true, by: bob)  // keeps alice's generation-0 signature
        forged.lastModifiedBy = bob
        var staged = tree
        staged.insert(forged)
        var doc = tree.file(fid(3))!
        doc.contentDigest = [0xBB]
        doc.lastModifiedBy = bob
        staged.insert(doc)
        for old in [rotated, nil] {
            #expect(throws: AccessError.self) {
                try Authorization.checkPulled(forged, old: old, in: staged, verify: fakeVerify)
            }
        }
        #expect(throws: AccessError.self) {
            try Authorization.checkPulled(doc, old: nil, in: staged, verify: fakeVerify)
        }
        // Bob's real give-up of a generation-1 grant stands, on a device new to it too.
        var live = grant(2, to: bob, .write)
        live.generation = 1
        live.signature = fakeSign(alice, live.grantMessage(fileID: fid(2)))
        var real = rotated
        real.access[0] = live
        real.access[0].ownerSignature = live.signature
        real.access[0].isDeleted = true
        real.access[0].signature = fakeSign(bob, real.access[0].grantMessage(fileID: fid(2)))
        real.lastModifiedBy = bob
        var staged2 = tree
        staged2.insert(real)
        staged2.insert(doc)
        try Authorization.checkPulled(real, old: nil, in: staged2, verify: fakeVerify)
        try Authorization.checkPulled(doc, old: nil, in: staged2, verify: fakeVerify)
    }

    /// The key generation is the owner's to move, and only with a new key: a grantee's record
    /// that changes it alone is refused (give-ups are judged by it), and no grant may name a
    /// generation the record has not reached. A give-up of a grant newer than the one a device
    /// holds (the owner resealed it at a rotation the device has not seen) stands.
    @Test func theKeyGenerationIsTheOwnersToMove() throws {
        let tree = sharedTree()
        var bumped = tree.file(fid(3))!
        bumped.keyGeneration = 1
        bumped.lastModifiedBy = bob
        var staged = tree
        staged.insert(bumped)
        #expect(throws: AccessError.self) {
            try Authorization.checkPulled(bumped, old: tree.file(fid(3)), in: staged, verify: fakeVerify)
        }
        var ahead = tree.file(fid(2))!
        var future = grant(2, to: carol, .read)
        future.generation = 3
        future.signature = fakeSign(alice, future.grantMessage(fileID: fid(2)))
        ahead.access[1] = future
        #expect(throws: AccessError.self) { try check(ahead) }
        staged = tree
        staged.insert(ahead)
        #expect(throws: AccessError.self) {
            try Authorization.checkPulled(ahead, old: nil, in: staged, verify: fakeVerify)
        }
        // Carol's give-up of a generation-1 grant, on a device that held her generation-0 one.
        var resealed = grant(2, to: carol, .read)
        resealed.generation = 1
        var gaveUp = tree.file(fid(2))!
        gaveUp.keyGeneration = 1
        gaveUp.access[1] = resealed
        gaveUp.access[1].ownerSignature = fakeSign(alice, resealed.grantMessage(fileID: fid(2)))
        gaveUp.access[1].isDeleted = true
        gaveUp.access[1].signature = fakeSign(carol, gaveUp.access[1].grantMessage(fileID: fid(2)))
        try Authorization.checkPulledGrants(gaveUp, old: tree.file(fid(2)), verify: fakeVerify, name: "shared")
    }

    /// What a grantee wrote counts only under a grant that is live or that it gave up itself:
    /// once the owner revoked or lowered the grant, a record the grantee signed is refused by
    /// every device, the ones that saw the grant live included (the owner's change signs all
    /// the grantee wrote as the owner's, so such a record can only be one written after it).
    @Test func aRevokedOrLoweredWritersRecordIsRefused() throws {
        let held = sharedTree()
        for ended in [grant(2, to: bob, .write, deleted: true), grant(2, to: bob, .read)] {
            var (staged, _, doc) = bobsEdit(under: ended)
            for old in [held.file(fid(3)), nil] {
                #expect(throws: AccessError.self) {
                    try Authorization.checkPulled(doc, old: old, in: staged, verify: fakeVerify)
                }
            }
            // The owner's own record of it stands.
            doc.lastModifiedBy = alice
            staged.insert(doc)
            try Authorization.checkPulled(doc, old: held.file(fid(3)), in: staged, verify: fakeVerify)
        }
    }

    /// The owner rotated the shared folder's key, then a write grantee changed the folder's
    /// attributes on top: a device that held the version before the rotation sees the grantee
    /// change the key wrapping, which it may not do itself, but with a new key generation under
    /// the same folder it is the owner's rotation carried along. The same wrapping change
    /// without a new generation is still refused.
    @Test func aGranteesChangeMayCarryTheOwnersRotationOfTheSharedFolder() throws {
        var shared = sharedTree().file(fid(2))!
        shared.wrappedKey = [7, 7, 7]
        shared.keyGeneration = 1
        shared.sealedAttributes = [4, 5, 6]
        shared.lastModifiedBy = bob
        try check(shared)
        shared.keyGeneration = 0
        #expect(throws: AccessError.self) { try check(shared) }
        // A device that holds the keys above (the owner's) refuses a wrapping that does not open.
        shared.keyGeneration = 1
        var staged = sharedTree()
        staged.insert(shared)
        #expect(throws: AccessError.self) {
            try Authorization.checkPulled(
                shared, old: sharedTree().file(fid(2)), in: staged, keyOpens: { _ in false }, verify: fakeVerify)
        }
        try Authorization.checkPulled(
            shared, old: sharedTree().file(fid(2)), in: staged, keyOpens: { _ in true }, verify: fakeVerify)
        // Nor does a new generation excuse a move.
        shared.keyGeneration = 1
        shared.parent = fid(6)
        #expect(throws: AccessError.self) { try check(shared) }
    }
}
