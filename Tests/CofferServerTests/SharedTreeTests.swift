import CofferCrypto
import CofferModel
import CofferProtocol
import CofferServerCore
import Foundation
import Testing

extension Device {
    /// Takes over what `other` last pushed of these files, as a device that pulled them would.
    func adopt(_ ids: [FileID], from other: Device) {
        for id in ids {
            seen[id] = other.seen[id]
            sent[id] = other.sent[id]
        }
    }

    /// Everything after `since` as the server pages it: records by id (newest wins), gone ids,
    /// and the cursor reached.
    func pull(since: Int64 = 0) throws -> (files: [FileID: FileMetadata], gone: Set<FileID>, latest: Int64) {
        var files: [FileID: FileMetadata] = [:]
        var gone: Set<FileID> = []
        var cursor: (Int64, Data?) = (since, nil)
        while true {
            let page = try server.updates(caller: user.key, since: cursor.0, afterID: cursor.1, shared: true)
            for f in page.files { files[try decodeRecord(f).id] = try decodeRecord(f) }
            for id in page.gone ?? [] { gone.insert(try FileID(bytes: Array(id))) }
            cursor = (page.latest, page.nextAfterID)
            if !page.more { return (files, gone, page.latest) }
        }
    }
}

/// `m` written by `writer` (a sharee writing into the owner's tree).
func written(by writer: TestUser, _ m: FileMetadata) -> FileMetadata {
    var m = m
    m.lastModifiedBy = writer.id
    return m
}

/// Alice's tree, with `shared` granted to bob at `mode`:
/// root ── shared/ ── doc, inner/ ── deep
///      └─ private/ ── secret
struct SharedFixture {
    let server: CofferServer
    let alice: Device
    let bob: Device
    let carol: Device
    let root: FileMetadata
    var shared: FileMetadata
    let doc: FileMetadata
    let inner: FileMetadata
    let deep: FileMetadata
    let privateFolder: FileMetadata
    let secret: FileMetadata

    init(mode: AccessMode) throws {
        (server, _) = try makeServer()
        alice = try Device(server, TestUser("alice"))
        bob = try Device(server, TestUser("bob"))
        carol = try Device(server, TestUser("carol"))
        let a = alice.user
        root = rootRecord(a)
        shared = record(a, .folder, in: root.id, named: "shared")
        doc = record(a, .document, in: shared.id, named: "doc")
        inner = record(a, .folder, in: shared.id, named: "inner")
        deep = record(a, .document, in: inner.id, named: "deep")
        privateFolder = record(a, .folder, in: root.id, named: "private")
        secret = record(a, .document, in: privateFolder.id, named: "secret")
        try alice.push([root, shared, doc, inner, deep, privateFolder, secret])
        shared.access = [try signedGrant(shared.id, owner: a, to: bob.user, mode)]
        try alice.push([shared])
    }

    var sharedIDs: Set<FileID> { [shared.id, doc.id, inner.id, deep.id] }
}

@Suite("Shared trees at the server: who is sent what, who may write where")
struct SharedTreeTests {
    @Test func aShareeIsSentTheSharedSubtreeAndNothingElse() throws {
        var f = try SharedFixture(mode: .read)
        let first = try f.bob.pull()
        #expect(Set(first.files.keys) == f.sharedIDs)
        #expect(first.files[f.shared.id] == f.shared)
        #expect(first.gone.isEmpty)
        #expect(try f.carol.pull().files.isEmpty)
        // A device that does not ask for shared trees is sent its own tree only.
        #expect(try f.server.updates(caller: f.bob.user.key, since: 0).files.isEmpty)
        // Later changes inside reach bob; changes outside do not.
        let added = record(f.alice.user, .document, in: f.inner.id, named: "added")
        var secret = f.secret
        secret.sealedAttributes = randomBytes(24)
        try f.alice.push([added, secret])
        let next = try f.bob.pull(since: first.latest)
        #expect(Set(next.files.keys) == [added.id])
        // A folder moved into the share brings its subtree along.
        var moved = f.privateFolder
        moved.parent = f.shared.id
        try f.alice.push([moved])
        let third = try f.bob.pull(since: next.latest)
        #expect(Set(third.files.keys) == [f.privateFolder.id, f.secret.id])
        f.shared.name = sealedName("renamed-by-owner")
        try f.alice.push([f.shared])
        #expect(try f.bob.pull(since: third.latest).files[f.shared.id]?.name == f.shared.name)
        #expect(try f.server.audit(account: f.alice.user.key).isEmpty)
    }

    @Test func revokedAndMovedOutFilesAreReportedGone() throws {
        let f = try SharedFixture(mode: .write)
        let start = try f.bob.pull().latest
        var out = f.inner
        out.parent = f.privateFolder.id
        try f.alice.push([out])
        let afterMove = try f.bob.pull(since: start)
        #expect(afterMove.gone == [f.inner.id])
        #expect(afterMove.files.isEmpty)
        // Revoked: the shared folder is gone for bob, and nothing written after reaches him.
        var revoked = f.shared
        revoked.access = [try signedGrant(f.shared.id, owner: f.alice.user, to: f.bob.user, .write, deleted: true)]
        try f.alice.push([revoked])
        let afterRevoke = try f.bob.pull(since: afterMove.latest)
        #expect(afterRevoke.gone == [f.shared.id])
        #expect(afterRevoke.files.isEmpty)
        try f.alice.push([record(f.alice.user, .document, in: f.shared.id, named: "later")])
        #expect(try f.bob.pull(since: afterRevoke.latest).files.isEmpty)
        // A device of bob's joining afresh is sent none of it as a record.
        let fresh = try f.bob.pull()
        #expect(fresh.files.isEmpty)
        #expect(fresh.gone.isSuperset(of: [f.shared.id, f.inner.id]))
    }

    @Test func aWriteShareeWritesInsideAndOnlyInside() throws {
        let f = try SharedFixture(mode: .write)
        let bob = f.bob
        bob.adopt([f.shared.id, f.doc.id, f.inner.id, f.deep.id, f.privateFolder.id], from: f.alice)
        let aliceUsage = try f.server.usage(caller: f.alice.user.key).bytes
        let bobUsage = try f.server.usage(caller: bob.user.key).bytes
        // Bob creates (owned by alice: her folder, her bill), renames and edits attributes.
        let made = written(by: bob.user, record(f.alice.user, .folder, in: f.shared.id, named: "made-by-bob"))
        var renamed = written(by: bob.user, f.doc)
        renamed.name = sealedName("renamed-by-bob")
        try bob.push([made, renamed])
        #expect(try f.server.usage(caller: f.alice.user.key).bytes > aliceUsage)
        #expect(try f.server.usage(caller: bob.user.key).bytes == bobUsage)
        let seenByAlice = try f.alice.pull().files
        #expect(seenByAlice[made.id]?.lastModifiedBy == bob.user.id)
        #expect(seenByAlice[f.doc.id]?.name == renamed.name)
        let before = try f.alice.all()

        func refused(_ status: Int, _ records: [FileMetadata], _ what: String) throws {
            expectRefusal(status) { try bob.push(records) }
            #expect(try f.alice.all() == before, "\(what) changed alice's tree")
        }
        // Outside the share, on the share itself, at owner level, or as his own file.
        let outside = written(by: bob.user, record(f.alice.user, .document, in: f.privateFolder.id, named: "x"))
        try refused(403, [outside], "a write outside")
        var movedOut = written(by: bob.user, f.deep)
        movedOut.parent = f.privateFolder.id
        try refused(403, [movedOut], "a move out")
        var renamedShare = written(by: bob.user, f.shared)
        renamedShare.name = sealedName("bob-renames-the-share")
        try refused(403, [renamedShare], "renaming the share")
        var regrant = written(by: bob.user, f.shared)
        regrant.access.append(try signedGrant(f.shared.id, owner: f.alice.user, to: f.carol.user, .read))
        try refused(403, [regrant], "a re-share")
        // A file of bob's own in alice's folder: in bob's tree, whose folder is missing.
        try refused(409, [record(bob.user, .document, in: f.shared.id, named: "bobs-own")], "a file owned by bob")
        // One tree per batch.
        let bobRoot = rootRecord(bob.user)
        expectRefusal(400) {
            try bob.push([bobRoot, written(by: bob.user, record(f.alice.user, .folder, in: f.shared.id, named: "m"))])
        }
        #expect(try f.server.audit(account: f.alice.user.key).isEmpty)
    }

    @Test func aGranteeCannotReSignRecordsOrReplaceTheShareKey() throws {
        let f = try SharedFixture(mode: .read)
        f.bob.adopt([f.doc.id], from: f.alice)
        // A record changed in nothing but its writer: a reader may not leave it behind.
        expectRefusal(403) { try f.bob.push([written(by: f.bob.user, f.doc)]) }
        // Far-future revisions would leave no newer one for anyone: refused, whoever sends them.
        let update = FileUpdate(
            record: f.alice.user.sign(f.doc, revision: UInt64.max), expectedParent: Data(f.shared.id.bytes),
            expectedNameMAC: Data(f.doc.name.mac), expectedRevision: f.alice.sent[f.doc.id]?.revision)
        expectRefusal(400) { _ = try f.server.upsert(caller: f.alice.user.key, UpsertRequest(updates: [update])) }
        // A write grantee cannot re-wrap the shared folder's own key (that is its parent's).
        let w = try SharedFixture(mode: .write)
        w.bob.adopt([w.shared.id], from: w.alice)
        var rewrapped = written(by: w.bob.user, w.shared)
        rewrapped.wrappedKey = randomBytes(72)
        expectRefusal(403) { try w.bob.push([rewrapped]) }
        #expect(try w.server.audit(account: w.alice.user.key).isEmpty)
    }

    @Test func aReadShareeWritesNothing() throws {
        let f = try SharedFixture(mode: .read)
        f.bob.adopt([f.doc.id], from: f.alice)
        var renamed = written(by: f.bob.user, f.doc)
        renamed.name = sealedName("nope")
        expectRefusal(403) { try f.bob.push([renamed]) }
        expectRefusal(403) {
            try f.bob.push([written(by: f.bob.user, record(f.alice.user, .document, in: f.shared.id, named: "n"))])
        }
        // Giving the grant up is the one change a sharee makes to it.
        f.bob.adopt([f.shared.id], from: f.alice)
        var left = written(by: f.bob.user, f.shared)
        left.access = [
            try signedGrant(
                f.shared.id, owner: f.alice.user, to: f.bob.user, .read, deleted: true, signer: f.bob.user.keys)
        ]
        left.access[0].sealedKey = f.shared.access[0].sealedKey
        left.access[0].signature = f.bob.user.keys.sign(left.access[0].grantMessage(fileID: f.shared.id))
        // Without the owner's signature of the grant it ends, it proves no grant was given up.
        expectRefusal(403) { try f.bob.push([left]) }
        left.access[0].ownerSignature = f.shared.access[0].signature
        try f.bob.push([left])
        #expect(try f.bob.pull().files.isEmpty)
    }

    @Test func contentOfASharedDocumentIsItsOwnersAndServedToGrantees() throws {
        let f = try SharedFixture(mode: .write)
        let (alice, bob, carol, server) = (f.alice, f.bob, f.carol, f.server)
        let via = Data(f.shared.id.bytes)
        // Bob writes a new document into the share: chunk and manifest go to alice's namespace.
        let chunk = randomBytes(5000)
        let chunkID = Data(blake2b(chunk))
        #expect(try server.missingChunks(caller: bob.user.key, ids: [chunkID], via: via).missing == [chunkID])
        try server.putChunk(caller: bob.user.key, id: chunkID, bytes: chunk, via: via)
        #expect(try server.missingChunks(caller: bob.user.key, ids: [chunkID], via: via).missing.isEmpty)
        #expect(try server.missingChunks(caller: bob.user.key, ids: [chunkID]).missing == [chunkID])
        let fresh = record(alice.user, .document, in: f.shared.id, named: "bobs-doc")
        let sealed = randomBytes(64)
        let digest = blake2b(sealed)
        let manifest = GetManifestRequest(fileID: Data(fresh.id.bytes), digest: Data(digest))
        try server.putManifest(
            caller: bob.user.key,
            PutManifestRequest(
                fileID: manifest.fileID, digest: manifest.digest, sealed: Data(sealed), chunkIDs: [chunkID], via: via))
        var bobs = written(by: bob.user, fresh)
        bobs.contentDigest = digest
        try bob.push([bobs])
        #expect(try server.usage(caller: bob.user.key).bytes == 0)
        // Alice reads it as her own; so does bob, through the file.
        #expect(try server.getManifest(caller: alice.user.key, manifest) == Data(sealed))
        #expect(try server.getChunks(caller: alice.user.key, ids: [chunkID]).count > chunk.count)
        #expect(try server.getManifest(caller: bob.user.key, manifest) == Data(sealed))
        #expect(try server.getChunks(caller: bob.user.key, ids: [chunkID], via: manifest.fileID).count > chunk.count)
        // Carol holds no grant: refused everything, reading or writing.
        expectRefusal(404) { _ = try server.getManifest(caller: carol.user.key, manifest) }
        expectRefusal(403) { _ = try server.getChunks(caller: carol.user.key, ids: [chunkID], via: via) }
        expectRefusal(403) { try server.putChunk(caller: carol.user.key, id: chunkID, bytes: chunk, via: via) }
        expectRefusal(403) { _ = try server.missingChunks(caller: carol.user.key, ids: [chunkID], via: via) }
        // Through a file of alice's that is not shared, bob is refused too.
        let secret = Data(f.secret.id.bytes)
        expectRefusal(403) { _ = try server.getChunks(caller: bob.user.key, ids: [chunkID], via: secret) }
        // Revoked: refused while bob's record is left below, signed by bob alone (no device could
        // tell it from one bob wrote after); taken with alice's own record of it. Bob reads
        // nothing more.
        var revoked = f.shared
        revoked.access = [try signedGrant(f.shared.id, owner: alice.user, to: bob.user, .write, deleted: true)]
        expectRefusal(409, ErrorResponse.getUpdatesRequired) { try alice.push([revoked]) }
        alice.adopt([fresh.id], from: bob)
        try alice.push([revoked, written(by: alice.user, bobs)])
        expectRefusal(404) { _ = try server.getManifest(caller: bob.user.key, manifest) }
        expectRefusal(403) { _ = try server.getChunks(caller: bob.user.key, ids: [chunkID], via: via) }
        #expect(try server.audit(account: alice.user.key).isEmpty)
    }

    /// A share revoked and granted again: a read of the feed that began before the new grant
    /// is told the folder was granted again (its device may hold what was deleted or moved away
    /// in the gap, and drops what it holds below); one that began after is not, even when the
    /// folder changes again later. The folder's live subtree comes with the new grant.
    @Test func aShareGrantedAgainIsNamedToReadsThatBeganBeforeIt() throws {
        let f = try SharedFixture(mode: .read)
        let (alice, bob, server) = (f.alice, f.bob, f.server)
        let before = try server.updates(caller: bob.user.key, since: 0, feedOnly: true).latest
        var revoked = f.shared
        revoked.access = [try signedGrant(f.shared.id, owner: alice.user, to: bob.user, .read, deleted: true)]
        try alice.push([revoked])
        var again = revoked
        again.access = [try signedGrant(f.shared.id, owner: alice.user, to: bob.user, .read)]
        let regrantedAt = try alice.push([again])
        let slept = try server.updates(caller: bob.user.key, since: before, feedOnly: true, origin: before)
        #expect(slept.regranted == [Data(f.shared.id.bytes)])
        let sent = try Set(slept.files.map { try decodeRecord($0).id })
        #expect(sent == [f.shared.id, f.doc.id, f.inner.id, f.deep.id])
        // Without an origin (an older device), nothing is named.
        #expect(try server.updates(caller: bob.user.key, since: before, feedOnly: true).regranted == nil)
        // Later, the folder changes again: a read from before the new grant is still told, one
        // from after it is not.
        var renamed = again
        renamed.name = sealedName("renamed")
        try alice.push([renamed])
        #expect(
            try server.updates(caller: bob.user.key, since: before, feedOnly: true, origin: before).regranted
                == [Data(f.shared.id.bytes)])
        let later = try server.updates(
            caller: bob.user.key, since: regrantedAt, feedOnly: true, origin: regrantedAt)
        #expect(later.regranted == nil && later.files.count == 1)
        // A new grantee is never told (nothing of it was held before).
        var carolToo = renamed
        carolToo.access.append(try signedGrant(f.shared.id, owner: alice.user, to: f.carol.user, .read))
        try alice.push([carolToo])
        #expect(try server.updates(caller: f.carol.user.key, since: 0, feedOnly: true, origin: 0).regranted == nil)
        // A folder moved out of bob's view and back comes back to him: reads from before are told.
        let beforeMove = try server.updates(caller: bob.user.key, since: 0, feedOnly: true).latest
        var out = f.inner
        out.parent = f.privateFolder.id
        try alice.push([out])
        var back = out
        back.parent = f.shared.id
        try alice.push([back])
        let moved = try server.updates(caller: bob.user.key, since: beforeMove, feedOnly: true, origin: beforeMove)
        #expect(moved.regranted == [Data(f.inner.id.bytes)])
    }

    /// Alice revokes bob while a record bob wrote is still his alone on the server: refused
    /// (409), and bob's changes to her tree are held back meanwhile, so a grantee writing all
    /// the time cannot keep her from ever ending its access. Her change with bob's record signed
    /// as hers goes in, the hold ends with it, and bob is then refused as a revoked account.
    @Test func aRefusedRevocationHoldsTheGranteesWritesBackUntilTheOwnersChangeGoesIn() throws {
        let f = try SharedFixture(mode: .write)
        let (alice, bob) = (f.alice, f.bob)
        let bobs = written(by: bob.user, record(alice.user, .folder, in: f.shared.id, named: "by-bob"))
        try bob.push([bobs])
        var revoked = f.shared
        revoked.access = [try signedGrant(f.shared.id, owner: alice.user, to: bob.user, .write, deleted: true)]
        expectRefusal(409, ErrorResponse.getUpdatesRequired) { try alice.push([revoked]) }
        // Held back: another write of bob's is refused as "try again", not taken.
        let more = written(by: bob.user, record(alice.user, .folder, in: f.shared.id, named: "more"))
        expectRefusal(409, ErrorResponse.writesPaused) { try bob.push([more]) }
        // Alice's device signs bob's record as hers and pushes again: taken, and the hold ends.
        alice.adopt([bobs.id], from: bob)
        try alice.push([revoked, written(by: alice.user, bobs)])
        expectRefusal(403) { try bob.push([more]) }
        #expect(try f.server.audit(account: alice.user.key).isEmpty)
    }

    /// A deleted file is its owner's alone to sign again: a write grantee re-signing one (which
    /// could leave its record below folders the owner's devices have pruned, which they could
    /// then never judge) is refused; a live one it may still change.
    @Test func aGranteeDoesNotSignADeletedFileAgain() throws {
        let f = try SharedFixture(mode: .write)
        let (alice, bob) = (f.alice, f.bob)
        var deleted = f.doc
        deleted.isDeleted = true
        try alice.push([deleted])
        bob.adopt([f.doc.id], from: alice)
        expectRefusal(403) { try bob.push([written(by: bob.user, deleted)]) }
        bob.adopt([f.deep.id], from: alice)
        var edited = written(by: bob.user, f.deep)
        edited.sealedAttributes = [1, 2, 3]
        try bob.push([edited])
    }

    /// Only the owner moves a file's key generation (give-ups are judged by it): a write
    /// grantee's change that moves it, or a new file of its that names one, is refused.
    @Test func onlyTheOwnerMovesAKeyGeneration() throws {
        let f = try SharedFixture(mode: .write)
        f.bob.adopt([f.doc.id], from: f.alice)
        var bumped = written(by: f.bob.user, f.doc)
        bumped.keyGeneration = 1
        expectRefusal(403) { try f.bob.push([bumped]) }
        var fresh = written(by: f.bob.user, record(f.alice.user, .document, in: f.shared.id, named: "g"))
        fresh.keyGeneration = 2
        expectRefusal(403) { try f.bob.push([fresh]) }
        fresh.keyGeneration = 0
        try f.bob.push([fresh])
    }

    @Test func aReadShareeUploadsNoContent() throws {
        let f = try SharedFixture(mode: .read)
        let chunk = randomBytes(100)
        let via = Data(f.shared.id.bytes)
        expectRefusal(403) {
            try f.server.putChunk(caller: f.bob.user.key, id: Data(blake2b(chunk)), bytes: chunk, via: via)
        }
        let sealed = randomBytes(64)
        expectRefusal(403) {
            try f.server.putManifest(
                caller: f.bob.user.key,
                PutManifestRequest(
                    fileID: Data(f.doc.id.bytes), digest: Data(blake2b(sealed)), sealed: Data(sealed), chunkIDs: []))
        }
        #expect(try f.server.audit(account: f.alice.user.key).isEmpty)
    }

    @Test func linksPointAtLiveSharesOnceFromOutsideShares() throws {
        let f = try SharedFixture(mode: .read)
        let bob = f.bob
        let bobRoot = rootRecord(bob.user)
        let bobFolder = record(bob.user, .folder, in: bobRoot.id, named: "mine")
        var bobShared = record(bob.user, .folder, in: bobRoot.id, named: "bob-shares-this")
        bobShared.access = [try signedGrant(bobShared.id, owner: bob.user, to: f.carol.user, .read)]
        try bob.push([bobRoot, bobFolder, bobShared])
        func link(_ name: String, to target: FileID, in parent: FileID? = nil) -> FileMetadata {
            var m = record(bob.user, .link, in: parent ?? bobRoot.id, named: name)
            m.linkTarget = target
            return m
        }
        let accepted = link("shared-from-alice", to: f.shared.id)
        try bob.push([accepted])
        expectRefusal(403) { try bob.push([link("again", to: f.shared.id)]) }
        expectRefusal(403) { try bob.push([link("two", to: f.doc.id), link("twice", to: f.doc.id)]) }
        expectRefusal(403) { try bob.push([link("own", to: bobFolder.id)]) }
        expectRefusal(403) { try bob.push([link("not-shared", to: f.privateFolder.id)]) }
        expectRefusal(403) { try bob.push([link("nothing", to: newFileID())]) }
        // Not inside a folder bob shares: carol would be shown a file nobody shared with her.
        expectRefusal(403) { try bob.push([link("in-a-share", to: f.doc.id, in: bobShared.id)]) }
        // Deleting the link makes the share pending again; a new link may then be made.
        var deleted = accepted
        deleted.isDeleted = true
        try bob.push([deleted])
        try bob.push([link("accepted-again", to: f.shared.id)])
        #expect(try f.server.audit(account: bob.user.key).isEmpty)
    }

    @Test func ownAndSharedRecordsPageTogetherInVersionOrder() throws {
        let f = try SharedFixture(mode: .read)
        let bobRoot = rootRecord(f.bob.user)
        try f.bob.push([bobRoot])
        // Interleave: bob's own batches and alice's batches inside the share.
        var expected: Set<FileID> = f.sharedIDs.union([bobRoot.id])
        for i in 0..<3 {
            let mine = (0..<2000).map { record(f.bob.user, .document, in: bobRoot.id, named: "b\(i)-\($0)") }
            try f.bob.push(mine)
            let hers = (0..<1500).map { record(f.alice.user, .document, in: f.inner.id, named: "a\(i)-\($0)") }
            try f.alice.push(hers)
            expected.formUnion(mine.map(\.id))
            expected.formUnion(hers.map(\.id))
        }
        var seen: [FileID] = []
        var cursor: (Int64, Data?) = (0, nil)
        var last: (Int64, Data) = (0, Data())
        var pages = 0
        while true {
            let page = try f.server.updates(caller: f.bob.user.key, since: cursor.0, afterID: cursor.1, shared: true)
            pages += 1
            for file in page.files {
                let id = Data(try decodeRecord(file).id.bytes)
                let key = (file.version, id)
                #expect(key.0 > last.0 || (key.0 == last.0 && last.1.lexicographicallyPrecedes(key.1)))
                last = key
                seen.append(try decodeRecord(file).id)
            }
            cursor = (page.latest, page.nextAfterID)
            if !page.more { break }
        }
        #expect(pages >= 3)
        #expect(seen.count == expected.count)
        #expect(Set(seen) == expected)
    }
}
