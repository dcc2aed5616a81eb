import CofferCrypto
import CofferModel
import Foundation
import Testing

@testable import CofferVault

@Suite("The owner's side of sharing: grants made, changed and revoked in the vault")
struct VaultSharingTests {
    func contact(_ name: String) -> (Contact, AccountSecret) {
        let secret = AccountSecret.generate()
        return (
            Contact(
                username: name, signingKey: secret.signingKeys.publicKey.bytes,
                boxKey: secret.boxKeys.publicKey.bytes), secret
        )
    }

    @Test func aGrantSealsTheFilesKeyForTheGranteeAndIsSignedByTheOwner() throws {
        let f = try VaultFixture()
        let folder = try f.folder("shared")
        try f.document("a.txt", in: folder.id, contents: Array("hello".utf8))
        let (bob, bobSecret) = contact("bob")
        try f.vault.share(folder.id, with: bob, mode: .read)
        let grants = try f.vault.grants(reaching: folder.id)
        #expect(grants.count == 1)
        let g = try #require(grants.first?.grant)
        #expect(g.mode == .read && !g.isDeleted && g.account.bytes == bob.signingKey)
        let owner = try PublicSigningKey(bytes: f.vault.accountID.bytes)
        #expect(owner.verify(signature: g.signature, message: g.grantMessage(fileID: folder.id)))
        // Bob's box key opens it, bound to this file, mode and owner; the key is the folder's own
        // (it unwraps the document's key wrapped under it).
        let key = try bobSecret.boxKeys.open(
            sealedKey: g.sealedKey, binding: g.keyBinding(fileID: folder.id, owner: f.vault.accountID))
        let doc = try #require(try f.vault.lookup(folder.id, "a.txt"))
        let record = try #require(try f.vault.store.readOne { try $0.current(doc.id) }).signed.metadata
        #expect(throws: Never.self) { try KeyWrap.unwrap(record.wrappedKey, with: key, fileID: doc.id.bytes) }
        var wrongMode = g
        wrongMode.mode = .write
        #expect(throws: CryptoError.self) {
            try bobSecret.boxKeys.open(
                sealedKey: g.sealedKey, binding: wrongMode.keyBinding(fileID: folder.id, owner: f.vault.accountID))
        }
        // Inside the folder, the grant reaches the document through it.
        #expect(try f.vault.grants(reaching: doc.id).map(\.file) == [folder.id])
        #expect(try f.vault.sharedFiles().map(\.file) == [folder.id])
    }

    @Test func modesChangeGrantsAreRevokedAndMistakesAreRefused() throws {
        let f = try VaultFixture()
        let folder = try f.folder("shared")
        let (bob, _) = contact("bob")
        let bobID = try AccountID(bytes: bob.signingKey)
        try f.vault.share(folder.id, with: bob, mode: .read)
        #expect(throws: VaultError.self) { try f.vault.share(folder.id, with: bob, mode: .read) }
        try f.vault.share(folder.id, with: bob, mode: .write)
        var grants = try f.vault.grants(reaching: folder.id).map(\.grant)
        #expect(grants.count == 1 && grants[0].mode == .write)
        try f.vault.unshare(folder.id, from: bobID, name: "bob", boxKeys: [:])
        grants = try f.vault.grants(reaching: folder.id).map(\.grant)
        #expect(grants.count == 1 && grants[0].isDeleted)
        let owner = try PublicSigningKey(bytes: f.vault.accountID.bytes)
        #expect(owner.verify(signature: grants[0].signature, message: grants[0].grantMessage(fileID: folder.id)))
        #expect(throws: VaultError.self) { try f.vault.unshare(folder.id, from: bobID, name: "bob", boxKeys: [:]) }
        #expect(try f.vault.sharedFiles().first?.grants.allSatisfy(\.isDeleted) == true)
        // The root, oneself, and a removed file cannot be shared.
        #expect(throws: VaultError.self) { try f.vault.share(f.root, with: bob, mode: .read) }
        let me = Contact(
            username: "alice", signingKey: f.vault.accountID.bytes,
            boxKey: f.vault.exportedSecret.boxKeys.publicKey.bytes)
        #expect(throws: VaultError.self) { try f.vault.share(folder.id, with: me, mode: .read) }
        let gone = try f.folder("gone")
        try f.vault.remove(gone.id, recursive: true)
        #expect(throws: (any Error).self) { try f.vault.share(gone.id, with: bob, mode: .read) }
    }

    @Test func grantsMergeEntryByEntryAndARevocationWins() throws {
        func e(_ n: UInt8, _ mode: AccessMode, deleted: Bool = false) -> AccessEntry {
            AccessEntry(
                account: try! AccountID(bytes: [UInt8](repeating: n, count: 32)), mode: mode, sealedKey: [n, 1],
                isDeleted: deleted, signature: [UInt8](repeating: n, count: 64))
        }
        let base = [e(1, .read)]
        // Each side added someone: both kept.
        #expect(AccessEntry.merged(base: base, local: base + [e(2, .read)], remote: base + [e(3, .write)]).count == 3)
        // Local changed a grant the remote left alone: local's.
        #expect(AccessEntry.merged(base: base, local: [e(1, .write)], remote: base) == [e(1, .write)])
        // Both changed one grant: a revocation wins on either side; else the remote's.
        #expect(
            AccessEntry.merged(base: base, local: [e(1, .read, deleted: true)], remote: [e(1, .write)])
                == [e(1, .read, deleted: true)])
        #expect(
            AccessEntry.merged(base: base, local: [e(1, .write)], remote: [e(1, .read, deleted: true)])
                == [e(1, .read, deleted: true)])
        var other = e(1, .write)
        other.sealedKey = [9]
        #expect(AccessEntry.merged(base: base, local: [e(1, .write)], remote: [other]) == [other])
    }
}
