import CofferCrypto
import CofferModel
import CofferProtocol
import CofferSync
import CofferTestSupport
import CofferVault
import Foundation
import Testing

/// What a device takes from a server about files shared with it, or written into its own tree
/// by a grantee: only what a key holder with the right access signed (docs/SHARING.md, "What
/// devices verify"). The records are crafted and correctly signed; the server is real.
@Suite(.serialized) struct SharedPullTests {
    struct World {
        let base: AliceAndBob
        var tmp: TemporaryDirectory { base.tmp }
        var server: ServerProcess { base.server }
        var alice: String { base.alice }
        var bob: String { base.bob }

        /// Alice shares `projects` (a folder holding `notes.txt`) with bob; both synced.
        init(write: Bool) throws {
            base = try AliceAndBob("coffer-shared-pull")
            _ = coffer(base.alice, ["mkdir", "projects"])
            _ = coffer(base.alice, ["write", "projects/notes.txt"], stdin: Array("plan".utf8))
            _ = coffer(base.alice, ["share", "add", "projects", "bob"] + (write ? ["--write"] : []))
            for dir in [base.alice, base.bob] {
                let r = coffer(dir, ["sync"])
                guard r.status == 0 else { throw TestFailure("sync: \(r.err)") }
            }
        }
    }

    func remote(_ f: ServerFile) throws -> RemoteFile {
        RemoteFile(
            signed: try SignedMetadata(decoding: Array(f.record)), version: f.version,
            contentVersion: f.contentVersion, serverDeleted: f.serverDeleted)
    }

    func signed(_ m: FileMetadata, by keys: SigningKeyPair, revision: UInt64) -> RemoteFile {
        let message = SignedMetadata.message(metadata: m, revision: revision)
        return RemoteFile(
            signed: SignedMetadata(metadata: m, revision: revision, signature: keys.sign(message)), version: 99,
            contentVersion: 0, serverDeleted: false)
    }

    @Test func aGranteeDeviceRefusesSharedRecordsNoKeyHolderCouldWrite() async throws {
        let w = try World(write: false)
        let bob = try Vault.open(dataDirectory: w.bob)
        let aliceKeys = try Vault.open(dataDirectory: w.alice).exportedSecret.signingKeys
        let bobKeys = bob.exportedSecret.signingKeys
        let engine = try SyncEngine.forStore(bob)
        let page = try await engine.client.updates(since: 0, feedOnly: true)
        let records = try page.files.map(remote)
        #expect(records.count == 2)
        let folder = try #require(records.first { $0.signed.metadata.type == .folder })
        let notes = try #require(records.first { $0.signed.metadata.type == .document })
        let next = notes.signed.revision + 1

        // An account nobody granted anything writes a shared file.
        let mallory = AccountSecret.generate().signingKeys
        var m = notes.signed.metadata
        m.lastModifiedBy = try AccountID(bytes: mallory.publicKey.bytes)
        var refused = try bob.checkFeed([signed(m, by: mallory, revision: next)])
        #expect(refused.accepted.isEmpty && refused.refused.first?.reason.contains("without write access") == true)
        // The read-only grantee itself writes, or raises its own grant to write.
        m.lastModifiedBy = bob.accountID
        refused = try bob.checkFeed([signed(m, by: bobKeys, revision: next)])
        #expect(refused.accepted.isEmpty && refused.refused.count == 1)
        var f = folder.signed.metadata
        let i = try #require(f.access.firstIndex { $0.account == bob.accountID })
        f.access[i].mode = .write
        f.access[i].signature = bobKeys.sign(f.access[i].grantMessage(fileID: f.id))
        f.lastModifiedBy = bob.accountID
        refused = try bob.checkFeed([signed(f, by: bobKeys, revision: folder.signed.revision + 1)])
        #expect(refused.accepted.isEmpty && refused.refused.first?.reason.contains("only the owner") == true)
        // The owner's own older record (a rollback), and a file of another tree not shared with bob.
        refused = try bob.checkFeed([signed(notes.signed.metadata, by: aliceKeys, revision: notes.signed.revision - 1)])
        #expect(refused.refused.first?.reason.contains("rollback") == true)
        var stranger = notes.signed.metadata
        stranger.parent = try FileID(random: randomBytes(16))
        stranger.id = try FileID(random: randomBytes(16))
        refused = try bob.checkFeed([signed(stranger, by: aliceKeys, revision: next)])
        #expect(refused.refused.first?.reason == "not shared with this account")
        // A bad signature, or bob's own file sent as shared, stops the pull.
        var forged = signed(notes.signed.metadata, by: aliceKeys, revision: next)
        forged = RemoteFile(
            signed: SignedMetadata(
                metadata: forged.signed.metadata, revision: next + 1, signature: forged.signed.signature),
            version: 99, contentVersion: 0, serverDeleted: false)
        #expect(throws: VaultError.self) { try bob.checkFeed([forged]) }
        var own = notes.signed.metadata
        own.owner = bob.accountID
        own.lastModifiedBy = bob.accountID
        #expect(throws: VaultError.self) { try bob.checkFeed([signed(own, by: bobKeys, revision: next)]) }
        // What the owner signs goes through.
        let fine = try bob.checkFeed([signed(notes.signed.metadata, by: aliceKeys, revision: next)])
        #expect(fine.accepted.count == 1 && fine.refused.isEmpty)
        // Nothing refused reached bob's store.
        let share = try #require(try bob.incomingShares().first?.id)
        #expect(coffer(w.bob, ["cat", "--share", "\(share)", "notes.txt"]).out == "plan")
    }

    /// A write grantee's record in the owner's tree (here crafted with the grantee's real keys,
    /// as its device would write it) reaches the owner's device, which checks it against the
    /// grants it holds, and comes back to the grantee through its feed.
    @Test func aWriteGranteesRecordReachesTheOwnersDevice() async throws {
        let w = try World(write: true)
        let bob = try Vault.open(dataDirectory: w.bob)
        let engine = try SyncEngine.forStore(bob)
        let records = try await engine.client.updates(since: 0, feedOnly: true).files.map(remote)
        let folder = try #require(records.first { $0.signed.metadata.type == .folder }).signed.metadata
        let grant = try #require(folder.grant(to: bob.accountID))
        let folderKey = try bob.exportedSecret.boxKeys.open(
            sealedKey: grant.sealedKey, binding: grant.keyBinding(fileID: folder.id, owner: folder.owner))

        let id = try FileID(random: randomBytes(16))
        let key = SymmetricKey.random()
        let now = UInt64(Date().timeIntervalSince1970 * 1000)
        let attrs = PosixAttributes(
            mode: 0o755, uid: 0, gid: 0, mtime: Timespec(seconds: Int64(now / 1000)),
            stamp: HybridTimestamp(wallMillis: now, counter: 0, device: 7))
        let made = FileMetadata(
            id: id, type: .folder, parent: folder.id,
            name: SealedName(
                ciphertext: AEAD.seal(Array("from-bob".utf8), key: folderKey, purpose: .name, fileID: id.bytes),
                mac: NameMAC.mac(name: "from-bob", parentKey: folderKey)),
            owner: folder.owner, wrappedKey: KeyWrap.wrap(key, with: folderKey, fileID: id.bytes),
            sealedAttributes: AEAD.seal(attrs.encoded(), key: key, purpose: .attributes, fileID: id.bytes),
            lastModifiedBy: bob.accountID)
        let record = signed(made, by: bob.exportedSecret.signingKeys, revision: now).signed
        _ = try await engine.client.upsert(
            UpsertRequest(updates: [
                FileUpdate(record: Data(record.encoded()), expectedParent: nil, expectedNameMAC: nil)
            ]))

        let synced = coffer(w.alice, ["sync"])
        #expect(synced.status == 0, "\(synced.err)")
        #expect(coffer(w.alice, ["ls", "projects"]).out == "from-bob/\nnotes.txt\n")
        #expect(coffer(w.alice, ["fsck"]).status == 0)
        // Alice's device took it over: the server now holds it signed by alice, so a new device
        // of hers has nothing it must take on bob's word.
        let after = try await engine.client.updates(since: 0, feedOnly: true).files.map(remote)
        let adopted = try #require(after.first { $0.signed.metadata.id == id })
        #expect(adopted.signed.metadata.lastModifiedBy == folder.owner)
        let alice2 = w.tmp.sub("alice2")
        let exported = coffer(w.alice, ["account", "export"]).out
        let joined = coffer(alice2, ["account", "import", "--server", w.server.url], stdin: Array(exported.utf8))
        #expect(joined.status == 0, "\(joined.err)")
        #expect(coffer(alice2, ["ls", "projects"]).out == "from-bob/\nnotes.txt\n")
        // Alice's next change to it is hers again, and bob's device takes both.
        #expect(coffer(w.alice, ["mv", "projects/from-bob", "projects/by-bob"]).status == 0)
        let again = coffer(w.alice, ["sync"])
        #expect(again.status == 0, "\(again.err)")
        #expect(coffer(w.bob, ["sync"]).status == 0)
        let share = try #require(try bob.incomingShares().first?.id)
        #expect(coffer(w.bob, ["ls", "--share", "\(share)"]).out == "by-bob/\nnotes.txt\n")
        // A write share shows its write bits (a read share shows none: ShareCLITests).
        #expect(coffer(w.bob, ["ls", "-l", "--share", "\(share)", "notes.txt"]).out.hasPrefix("-rw-r--r-- "))
    }

    /// Puts `record` in the stopped server's database as the newest change of the owner's tree
    /// (a server, or whoever edits its database, serving what it likes), then starts it again.
    func plant(_ record: SignedMetadata, writer: AccountID, in w: World) throws {
        w.server.stop()
        let sql = """
            UPDATE counter SET value = value + 1 WHERE name = 'version';
            UPDATE file SET record = X'\(hexString(record.encoded()))', writer = X'\(hexString(writer.bytes))',
              version = (SELECT value FROM counter WHERE name = 'version')
              WHERE id = X'\(hexString(record.metadata.id.bytes))';
            UPDATE account SET version = (SELECT value FROM counter WHERE name = 'version')
              WHERE key = X'\(hexString(record.metadata.owner.bytes))';
            """
        let r = run("/usr/bin/sqlite3", [w.server.dataDirectory + "/metadata.sqlite", sql])
        #expect(r.status == 0, "sqlite3: \(r.err)")
        try w.server.start()
    }

    /// Bob wrote in alice's shared folder, then alice revoked him. A record bob signs after
    /// that, which a server takes against the rules, is refused by alice's device and by a new
    /// one of hers: the revocation signed all bob wrote as alice's own, so no device has to
    /// take a revoked writer's record on trust (before, a revoked write grant still counted,
    /// and alice's device would have taken it and signed it as hers).
    @Test func aRevokedWritersLaterRecordIsRefusedByEveryDevice() async throws {
        let w = try World(write: true)
        let bob = try Vault.open(dataDirectory: w.bob)
        let engine = try SyncEngine.forStore(bob)
        let before = try await engine.client.updates(since: 0, feedOnly: true).files.map(remote)
        let notes = try #require(before.first { $0.signed.metadata.type == .document })
        // Bob's change while he may: alice's device takes it and signs it as hers.
        var edit = notes.signed.metadata
        edit.lastModifiedBy = bob.accountID
        edit.sealedAttributes = notes.signed.metadata.sealedAttributes
        let bobs = signed(edit, by: bob.exportedSecret.signingKeys, revision: notes.signed.revision + 1).signed
        _ = try await engine.client.upsert(
            UpsertRequest(updates: [
                FileUpdate(
                    record: Data(bobs.encoded()), expectedParent: Data(edit.parent.bytes),
                    expectedNameMAC: Data(edit.name.mac), expectedRevision: notes.signed.revision)
            ]))
        #expect(coffer(w.alice, ["sync"]).status == 0)
        #expect(coffer(w.alice, ["share", "remove", "projects", "bob"]).status == 0)
        let synced = coffer(w.alice, ["sync"])
        #expect(synced.status == 0, "\(synced.err)")
        let exported = coffer(w.alice, ["account", "export"]).out

        // What the server holds now is alice's; bob signs a newer one anyway.
        let aliceEngine = try SyncEngine.forStore(try Vault.open(dataDirectory: w.alice))
        let own = try await aliceEngine.client.updates(since: 0).files.map(remote)
        let current = try #require(own.first { $0.signed.metadata.id == notes.signed.metadata.id })
        #expect(current.signed.metadata.lastModifiedBy == current.signed.metadata.owner)
        var late = current.signed.metadata
        late.lastModifiedBy = bob.accountID
        late.contentDigest = nil
        try plant(
            signed(late, by: bob.exportedSecret.signingKeys, revision: current.signed.revision + 1).signed,
            writer: bob.accountID, in: w)
        let refused = coffer(w.alice, ["sync"])
        #expect(refused.status != 0 && refused.err.contains("against the sharing rules"), "\(refused.err)")
        #expect(coffer(w.alice, ["cat", "projects/notes.txt"]).out == "plan")
        let alice2 = w.tmp.sub("alice2")
        let joined = coffer(alice2, ["account", "import", "--server", w.server.url], stdin: Array(exported.utf8))
        #expect(joined.status != 0 && joined.err.contains("against the sharing rules"), "\(joined.err)")
    }

    /// Bob, a writer, wrote in alice's folder and then left the share himself, before any device
    /// of alice's synced. A new device of alice's pulls both: the give-up keeps alice's
    /// signature of the grant it ends, so bob's records are checkable and the pull succeeds
    /// (before, a give-up seen by a device new to it could not be told from a grant never made,
    /// and the new device's pull failed until an older one had signed them as alice's).
    @Test func aNewDeviceOfTheOwnerTakesAWritersWorkBesideItsGiveUp() async throws {
        let w = try World(write: true)
        let share = try #require(try Vault.open(dataDirectory: w.bob).incomingShares().first?.id)
        #expect(coffer(w.bob, ["share", "accept", "\(share)", "/"]).status == 0)
        #expect(coffer(w.bob, ["write", "projects/from-bob.txt"], stdin: Array("bob".utf8)).status == 0)
        #expect(coffer(w.bob, ["sync"]).status == 0)
        let left = coffer(w.bob, ["share", "reject", "\(share)"])
        #expect(left.status == 0, "\(left.err)")
        let exported = coffer(w.alice, ["account", "export"]).out
        let alice2 = w.tmp.sub("alice2")
        let joined = coffer(alice2, ["account", "import", "--server", w.server.url], stdin: Array(exported.utf8))
        #expect(joined.status == 0, "\(joined.err)")
        #expect(coffer(alice2, ["cat", "projects/from-bob.txt"]).out == "bob")
        #expect(coffer(alice2, ["fsck"]).status == 0)
        // Alice's devices take bob's work as hers and rotate the keys he held.
        #expect(coffer(w.alice, ["sync"]).status == 0)
        #expect(coffer(alice2, ["sync"]).status == 0)
        #expect(coffer(alice2, ["cat", "projects/from-bob.txt"]).out == "bob")
    }

    /// Alice revokes bob's share: the feed's own transaction notes bob's link to it with the
    /// share gone, and the link is removed right after, or at the next sync if the device
    /// stopped in between, so no link is left placing nothing (before, a later step of the sync
    /// removed it, and a crash in between left it for good: the next pull no longer names the
    /// share gone).
    @Test func theFeedsMergeRemovesALinkWithItsShare() async throws {
        let w = try World(write: false)
        let bob = try Vault.open(dataDirectory: w.bob)
        let share = try #require(try bob.incomingShares().first?.id)
        #expect(coffer(w.bob, ["share", "accept", "\(share)", "/"]).status == 0)
        #expect(coffer(w.bob, ["sync"]).status == 0)
        #expect(coffer(w.bob, ["ls"]).out == "projects/\n")
        #expect(coffer(w.alice, ["share", "remove", "projects", "bob"]).status == 0)
        #expect(coffer(w.alice, ["sync"]).status == 0)

        let engine = try SyncEngine.forStore(bob)
        let page = try await engine.client.updates(since: bob.feedCursor, feedOnly: true)
        #expect(page.nextAfterID == nil && !page.more)
        let gone = try (page.gone ?? []).map { try FileID(bytes: Array($0)) }
        #expect(gone.contains(share))
        let (accepted, _) = try bob.checkFeed(try page.files.map(remote))
        let applied = try bob.applyFeed(accepted, gone: gone, cursor: page.latest)
        #expect(applied.removedLinks == 1)
        #expect(coffer(w.bob, ["ls"]).out == "")
        #expect(coffer(w.bob, ["fsck"]).status == 0)
        // The removal is pushed like any change; nothing is left to remove.
        let synced = coffer(w.bob, ["sync"])
        #expect(synced.status == 0, "\(synced.err)")
        #expect(try bob.removeBrokenLinks() == 0)
        #expect(coffer(w.bob, ["ls"]).out == "")
    }
}
