import CofferContent
import CofferCrypto
import CofferModel
import CofferStore
import CofferTestSupport
import Foundation
import Testing

@testable import CofferSync
@testable import CofferVault

/// Key rotation on revocation across devices and accounts, on a real server (docs/SHARING.md,
/// "Revocation"): alice's device A revokes carol while her device B, offline, writes in the
/// shared folder with the old keys and shares it with dave; everything converges, nothing B wrote
/// is lost, bob and dave read all of it, and what carol held opens nothing written since.
@Suite(.serialized) struct RotationSyncTests {
    @Test func aRevocationRotatesKeysAndAConcurrentDeviceLosesNothing() async throws {
        let alice = try await SyncWorld(devices: 2, username: "alice")
        var others: [String: SyncWorld] = [:]
        for name in ["bob", "carol", "dave"] {
            others[name] = try await SyncWorld(devices: 1, server: alice.server, username: name)
        }
        let bob = try #require(others["bob"]).a
        let carol = try #require(others["carol"]).a
        let dave = try #require(others["dave"]).a
        let (a, b) = (alice.a, alice.b)
        try a.mkdir("/shared/sub")
        try a.write("/shared/notes.txt", "one\n")
        try a.write("/shared/sub/photo.bin", (0..<200_000).map { UInt8(truncatingIfNeeded: $0 &* 13) })
        let shared = try a.vault.resolve("/shared").id
        for name in ["bob", "carol"] {
            try a.vault.share(shared, with: try await a.engine.contact(name).contact, mode: .read)
        }
        try await alice.sync(a, b)
        for d in [bob, carol] { try await d.sync() }
        #expect(try carol.vault.incomingShares().map(\.id) == [shared])
        // What carol holds: the folder's key, from her grant.
        let record = { (d: Device, id: FileID) throws -> FileMetadata in
            try #require(try d.vault.store.readOne { try $0.current(id) }).signed.metadata
        }
        let grant = try #require(try record(a, shared).grant(to: carol.vault.accountID))
        let carolKey = try carol.vault.exportedSecret.boxKeys.open(
            sealedKey: grant.sealedKey, binding: grant.keyBinding(fileID: shared, owner: a.vault.accountID))

        // B, offline: a new file, an edit, and a share with dave, all under the old keys.
        try b.write("/shared/new.txt", "from b\n")
        try b.write("/shared/notes.txt", "one\ntwo\n")
        try b.vault.share(shared, with: try await b.engine.contact("dave").contact, mode: .read)
        // A revokes carol: new keys for the folder and everything below it.
        let keeping = try a.vault.granteesKeeping(shared, without: carol.vault.accountID)
        try a.vault.unshare(
            shared, from: carol.vault.accountID, name: "carol", boxKeys: try await a.engine.boxKeys(for: keeping))
        try await alice.sync(a, b, a)
        try await alice.expectConverged()

        // Nothing B wrote was lost, and everything is under keys of the new generation.
        #expect(try a.read("/shared/notes.txt") == "one\ntwo\n")
        #expect(try a.read("/shared/new.txt") == "from b\n")
        for path in ["/shared", "/shared/sub", "/shared/notes.txt", "/shared/new.txt", "/shared/sub/photo.bin"] {
            #expect(try record(a, try a.vault.resolve(path).id).keyGeneration >= 1, "\(path)")
        }
        // Bob, who stayed, and dave, added meanwhile, read all of it; carol sees the share gone.
        for d in [bob, carol, dave] { try await d.sync() }
        for d in [bob, dave] {
            #expect(try d.vault.incomingShares().map(\.id) == [shared])
            let names = try d.vault.children(of: shared).map(\.name)
            #expect(names == ["new.txt", "notes.txt", "sub"], "\(d.name)")
            let notes = try #require(try d.vault.children(of: shared).first { $0.name == "notes.txt" })
            #expect(try d.vault.readAll(notes.id) == Array("one\ntwo\n".utf8))
        }
        #expect(try carol.vault.incomingShares().isEmpty)

        // What the server holds now opens with nothing carol had: no name, no key below.
        let page = try await a.engine.client.updates(since: 0)
        let records = try page.files.map { try SignedMetadata(decoding: Array($0.record)).metadata }
        let below = records.filter { $0.parent == shared && $0.id != shared }
        #expect(below.count == 3)
        for m in below {
            #expect(throws: (any Error).self) { try KeyWrap.unwrap(m.wrappedKey, with: carolKey, fileID: m.id.bytes) }
            #expect(throws: (any Error).self) {
                try AEAD.open(m.name.ciphertext, key: carolKey, purpose: .name, fileID: m.id.bytes, what: "")
            }
        }
        withExtendedLifetime(others) {}
    }

    /// Alice's two devices and bob (who stays) and carol (who goes), `/shared` shared with both.
    struct World {
        let alice: SyncWorld
        let others: [SyncWorld]
        var a: Device { alice.a }
        var b: Device { alice.b }
        var bob: Device { others[0].a }
        var shared: FileID

        init(files: [String: String]) async throws {
            alice = try await SyncWorld(devices: 2, username: "alice")
            others = [
                try await SyncWorld(devices: 1, server: alice.server, username: "bob"),
                try await SyncWorld(devices: 1, server: alice.server, username: "carol"),
            ]
            try alice.a.mkdir("/shared")
            for (name, text) in files {
                if text.isEmpty {
                    _ = try alice.a.vault.create(
                        in: alice.a.vault.resolve("/shared").id, name: name, type: .document, mode: 0o644)
                } else {
                    if let slash = name.lastIndex(of: "/") { try alice.a.mkdir("/shared/" + name[..<slash]) }
                    try alice.a.write("/shared/" + name, text)
                }
            }
            shared = try alice.a.vault.resolve("/shared").id
            for name in ["bob", "carol"] {
                try alice.a.vault.share(shared, with: try await alice.a.engine.contact(name).contact, mode: .read)
            }
            try await alice.sync(alice.a, alice.b)
        }

        /// The shared folder's key as carol holds it, from her grant (after her sync).
        func carolsKey() async throws -> SymmetricKey {
            let carol = others[1].a
            try await carol.sync()
            let folder = try #require(try a.vault.store.readOne { try $0.current(shared) }).signed.metadata
            let grant = try #require(folder.grant(to: carol.vault.accountID))
            return try carol.vault.exportedSecret.boxKeys.open(
                sealedKey: grant.sealedKey, binding: grant.keyBinding(fileID: shared, owner: folder.owner))
        }

        func revokeCarol(on d: Device) async throws {
            let carol = others[1].a.vault.accountID
            let keys = try await d.engine.boxKeys(for: d.vault.granteesKeeping(shared, without: carol))
            try d.vault.unshare(shared, from: carol, name: "carol", boxKeys: keys)
        }

        /// What bob reads of the share, by name.
        func bobReads() async throws -> [String: String] {
            try await bob.sync()
            var out: [String: String] = [:]
            func walk(_ id: FileID, _ path: String) throws {
                for c in try bob.vault.children(of: id) {
                    if c.type == .folder {
                        try walk(c.id, path + c.name + "/")
                    } else {
                        out[path + c.name] = String(decoding: try bob.vault.readAll(c.id), as: UTF8.self)
                    }
                }
            }
            try walk(shared, "")
            return out
        }
    }

    /// B, offline while A deletes a file and revokes carol: B's edit of the deleted file, its
    /// first content for a file that had none, and its rename all survive the merge, sealed under
    /// the new keys (before: B's pull failed for ever opening the deleted file's name, the
    /// rename was undone, and the new content stayed under the old key).
    @Test func offlineEditsRenamesAndFirstContentSurviveARotation() async throws {
        let w = try await World(files: ["d.txt": "d\n", "x.txt": "x\n", "empty.txt": ""])
        try w.b.write("/shared/d.txt", "d edited\n")
        try w.b.write("/shared/empty.txt", "first\n")
        try w.b.mv("/shared/x.txt", "/shared/y.txt")
        try w.a.rm("/shared/d.txt")
        try await w.revokeCarol(on: w.a)
        try await w.alice.sync(w.a, w.b, w.a)
        try await w.alice.expectConverged()
        #expect(try w.a.ls("/shared") == ["d.txt", "empty.txt", "y.txt"])
        #expect(try w.a.read("/shared/d.txt") == "d edited\n")
        #expect(try w.a.read("/shared/empty.txt") == "first\n")
        #expect(try await w.bobReads() == ["d.txt": "d edited\n", "empty.txt": "first\n", "y.txt": "x\n"])
        withExtendedLifetime(w) {}
    }

    /// B makes a folder in the share and moves a file into it, and pushes; A, which has not seen
    /// that, revokes carol. A's pull finds the new folder under the old key (so it gets a new key
    /// too) holding a file A gave a new key already (before: the pull failed for ever).
    @Test func aFolderMadeElsewhereBeforeTheRotationIsRotatedToo() async throws {
        let w = try await World(files: ["c.txt": "c\n"])
        try w.b.mkdir("/shared/n")
        try w.b.mv("/shared/c.txt", "/shared/n/c.txt")
        try await w.b.sync()
        try await w.revokeCarol(on: w.a)
        try await w.alice.sync(w.a, w.b)
        try await w.alice.expectConverged()
        let n = try w.a.vault.resolve("/shared/n").id
        let record = try #require(try w.a.vault.store.readOne { try $0.current(n) }).signed.metadata
        #expect(record.keyGeneration >= 1)
        #expect(try await w.bobReads() == ["n/c.txt": "c\n"])
        withExtendedLifetime(w) {}
    }

    /// Carol gives the share up herself: the owner's device that adopts her give-up rotates the
    /// keys as a revocation would, seals bob's grant again, and the other device takes that
    /// without rotating a second time.
    @Test func aGiveUpIsFollowedByARotation() async throws {
        let w = try await World(files: ["c.txt": "c\n"])
        let carol = w.others[1].a
        let carolKey = try await w.carolsKey()
        try await carol.engine.rejectShare(w.shared)
        try await w.alice.sync(w.a, w.b)
        try await w.alice.expectConverged()
        let generation = { (d: Device, id: FileID) throws -> UInt32 in
            try #require(try d.vault.store.readOne { try $0.current(id) }).signed.metadata.keyGeneration
        }
        let c = try w.a.vault.resolve("/shared/c.txt").id
        #expect(try generation(w.a, w.shared) == 1 && generation(w.a, c) == 1)
        #expect(try generation(w.b, w.shared) == 1)
        let record = try #require(try w.a.vault.store.readOne { try $0.current(c) }).signed.metadata
        #expect(throws: (any Error).self) { try KeyWrap.unwrap(record.wrappedKey, with: carolKey, fileID: c.bytes) }
        #expect(try await w.bobReads() == ["c.txt": "c\n"])
        withExtendedLifetime(w) {}
    }

    /// B, offline, moves a folder of the share into another and edits a document in it while A
    /// revokes carol; B's pull takes A's new keys for files it placed elsewhere, wrapped under
    /// their new parents, without rotating them again (before: the second rotation opened B's
    /// edit with the wrong key and the pull failed for ever).
    @Test func aMoveAndAnEditElsewhereMergeWithARotation() async throws {
        let w = try await World(files: ["f/d.txt": "d\n", "g/keep.txt": "k\n"])
        try w.b.mv("/shared/f", "/shared/g/f")
        try w.b.write("/shared/g/f/d.txt", "d\nmore\n")
        try await w.revokeCarol(on: w.a)
        try await w.alice.sync(w.a, w.b, w.a)
        try await w.alice.expectConverged()
        #expect(try w.a.read("/shared/g/f/d.txt") == "d\nmore\n")
        let d = try w.a.vault.resolve("/shared/g/f/d.txt").id
        #expect(try #require(try w.a.vault.store.readOne { try $0.current(d) }).signed.metadata.keyGeneration == 1)
        #expect(try await w.bobReads() == ["g/f/d.txt": "d\nmore\n", "g/keep.txt": "k\n"])
        withExtendedLifetime(w) {}
    }

    /// B writes in the share and pushes between A's pull and A's push of a rotation. B's
    /// creation changed the folder's times, so its push carried the folder's record, and the
    /// server refuses A's push of the rotated folder, based on the version before; A pulls,
    /// finds B's file wrapped under the replaced key, rotates it too, and pushes. Carol's key
    /// opens nothing of it; bob reads it.
    @Test func aFileWrittenBetweenTheRotatingDevicesPullAndPushIsRotatedToo() async throws {
        let w = try await World(files: ["c.txt": "c\n"])
        let carolKey = try await w.carolsKey()
        try await w.revokeCarol(on: w.a)
        var report = SyncReport()
        try await w.a.engine.pull(&report)
        try w.b.write("/shared/late.txt", "late\n")
        try await w.b.sync()
        try await w.a.engine.pushContent(&report)
        await #expect(throws: SyncError.self, "the folder's record moved on") {
            try await w.a.engine.pushMetadata(&report)
        }
        try await w.alice.sync(w.a, w.b)
        try await w.alice.expectConverged()
        let late = try w.a.vault.resolve("/shared/late.txt").id
        let record = try #require(try w.a.vault.store.readOne { try $0.current(late) }).signed.metadata
        #expect(record.keyGeneration >= 1)
        #expect(throws: (any Error).self) { try KeyWrap.unwrap(record.wrappedKey, with: carolKey, fileID: late.bytes) }
        #expect(try await w.bobReads() == ["c.txt": "c\n", "late.txt": "late\n"])
        withExtendedLifetime(w) {}
    }
}
