import CofferContent
import CofferCrypto
import CofferModel
import CofferStore
import CofferSync
import CofferTestSupport
import Foundation
import Testing

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
}
