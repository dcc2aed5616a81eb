import CofferContent
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

    /// The record of `id` as the store holds it now.
    func record(_ f: VaultFixture, _ id: FileID) throws -> FileMetadata {
        try #require(try f.vault.store.readOne { try $0.current(id) }).signed.metadata
    }

    /// Revoking carol gives the shared folder and everything below it new keys: what carol held
    /// opens no name, key or content written since, bob (who stays) opens all of it with the
    /// grant sealed again for him, and the owner reads everything as before.
    @Test func revokingRotatesTheKeysOfTheWholeSubtree() throws {
        let f = try VaultFixture()
        let folder = try f.folder("shared")
        let sub = try f.folder("sub", in: folder.id)
        let a = try f.document("a.txt", in: folder.id, contents: Array("alpha".utf8))
        let b = try f.document("b.bin", in: sub.id, contents: (0..<300_000).map { UInt8(truncatingIfNeeded: $0 &* 7) })
        let (bob, bobSecret) = contact("bob")
        let (carol, carolSecret) = contact("carol")
        try f.vault.share(folder.id, with: bob, mode: .read)
        try f.vault.share(folder.id, with: carol, mode: .write)
        let carolID = try AccountID(bytes: carol.signingKey)
        let bobID = try AccountID(bytes: bob.signingKey)

        // What carol holds before: the folder's key, and through it every key below.
        func grantKey(_ secret: AccountSecret, _ account: AccountID) throws -> SymmetricKey {
            let m = try record(f, folder.id)
            let g = try #require(m.grant(to: account))
            return try secret.boxKeys.open(
                sealedKey: g.sealedKey, binding: g.keyBinding(fileID: folder.id, owner: m.owner))
        }
        let carolFolderKey = try grantKey(carolSecret, carolID)
        let carolSubKey = try KeyWrap.unwrap(record(f, sub.id).wrappedKey, with: carolFolderKey, fileID: sub.id.bytes)
        let carolAKey = try KeyWrap.unwrap(record(f, a.id).wrappedKey, with: carolFolderKey, fileID: a.id.bytes)

        // Refused, nothing changed, without the key of a grantee who stays.
        #expect(throws: VaultError.self) { try f.vault.unshare(folder.id, from: carolID, name: "carol", boxKeys: [:]) }
        #expect(try record(f, folder.id).grant(to: carolID)?.isDeleted == false)
        #expect(try f.vault.granteesKeeping(folder.id, without: carolID) == [bobID])

        try f.vault.unshare(
            folder.id, from: carolID, name: "carol", boxKeys: [bobID: PublicBoxKey(bytes: bob.boxKey)])

        // Every live file below has a new key generation.
        for id in [folder.id, sub.id, a.id, b.id] { #expect(try record(f, id).keyGeneration == 1) }
        // Carol's keys open nothing of it now.
        let folderNow = try record(f, folder.id)
        #expect(folderNow.access.first { $0.account == carolID }?.isDeleted == true)
        #expect(throws: (any Error).self) {
            try KeyWrap.unwrap(record(f, sub.id).wrappedKey, with: carolFolderKey, fileID: sub.id.bytes)
        }
        #expect(throws: (any Error).self) {
            try AEAD.open(
                record(f, a.id).name.ciphertext, key: carolFolderKey, purpose: .name, fileID: a.id.bytes, what: "")
        }
        #expect(throws: (any Error).self) {
            try AEAD.open(
                record(f, b.id).name.ciphertext, key: carolSubKey, purpose: .name, fileID: b.id.bytes, what: "")
        }
        let aNow = try record(f, a.id)
        let digest = try #require(aNow.contentDigest)
        let sealedManifest = try #require(try f.vault.store.manifest(digest))
        #expect(throws: (any Error).self) {
            try ContentCipher(fileID: a.id, key: carolAKey).openManifest(sealedManifest)
        }
        // Bob's grant was sealed again: his key opens the new names and content.
        let bobKey = try grantKey(bobSecret, bobID)
        #expect(bobKey != carolFolderKey)
        let bobAKey = try KeyWrap.unwrap(aNow.wrappedKey, with: bobKey, fileID: a.id.bytes)
        let name = try AEAD.open(aNow.name.ciphertext, key: bobKey, purpose: .name, fileID: a.id.bytes, what: "")
        #expect(String(decoding: name, as: UTF8.self) == "a.txt")
        let cipher = ContentCipher(fileID: a.id, key: bobAKey)
        let manifest = try cipher.openManifest(sealedManifest)
        let first = try #require(manifest.chunks.first)
        let chunk = try #require(try f.vault.store.chunk(first.id))
        #expect(try cipher.openChunk(chunk, ref: manifest.chunks[0]) == Array("alpha".utf8))
        let shareName = try #require(folderNow.shareName)
        #expect(
            try AEAD.open(shareName, key: bobKey, purpose: .shareName, fileID: folder.id.bytes, what: "")
                == Array("shared".utf8))
        // The owner reads everything as before, and the store checks clean.
        #expect(try f.vault.readAll(a.id) == Array("alpha".utf8))
        #expect(try f.vault.readAll(b.id) == (0..<300_000).map { UInt8(truncatingIfNeeded: $0 &* 7) })
        #expect(try f.names(folder.id) == ["a.txt", "sub"])
        #expect(try f.vault.check().isClean)
    }

    /// A document open in one process (the mount) while another (`coffer share remove`) rotates
    /// its key: what the open document writes afterwards is sealed under the new key, not lost
    /// under the old one. Before, the commit sealed the manifest with the key the document was
    /// opened with, and the file no longer opened.
    @Test func writesOfADocumentOpenDuringARotationLandUnderTheNewKey() throws {
        let f = try VaultFixture()
        let folder = try f.folder("shared")
        let doc = try f.document("a.txt", in: folder.id, contents: Array(repeating: 0x61, count: 300_000))
        let (bob, _) = contact("bob")
        let (carol, _) = contact("carol")
        try f.vault.share(folder.id, with: bob, mode: .read)
        try f.vault.share(folder.id, with: carol, mode: .read)
        let bobID = try AccountID(bytes: bob.signingKey)
        let mount = try Vault.open(dataDirectory: f.dataDir)
        let open = try mount.openDocument(doc.id)
        try open.write(offset: 299_990, bytes: Array("written".utf8))
        try f.vault.unshare(
            folder.id, from: try AccountID(bytes: carol.signingKey), name: "carol",
            boxKeys: [bobID: PublicBoxKey(bytes: bob.boxKey)])
        try open.write(offset: 0, bytes: Array("start".utf8))
        // Committed while still open, then read back and written again through the same handle.
        try open.flush()
        #expect(try open.read(offset: 299_990, count: 7) == Array("written".utf8))
        try open.write(offset: 100, bytes: Array("more".utf8))
        try mount.release(open)
        var expected = Array(repeating: UInt8(0x61), count: 300_000)
        expected.replaceSubrange(0..<5, with: Array("start".utf8))
        expected.replaceSubrange(100..<104, with: Array("more".utf8))
        expected.replaceSubrange(299_990..<299_997, with: Array("written".utf8))
        let fresh = try Vault.open(dataDirectory: f.dataDir)
        #expect(try fresh.readAll(doc.id) == expected)
        #expect(try record(f, doc.id).keyGeneration == 1)
        #expect(try fresh.check().isClean)
    }

    /// A document open in the mount across a rotation made by another process still takes that
    /// process's later edit of the file (sealed under the new key), and a write through it then
    /// lands on top of the edit. Before, the open document kept the old key: the edit's manifest
    /// did not open with it, so reads showed the old content and the next commit wrote the old
    /// content back over the edit.
    @Test func aDocumentOpenAcrossARotationTakesLaterEdits() throws {
        let f = try VaultFixture()
        let folder = try f.folder("shared")
        let doc = try f.document("a.txt", in: folder.id, contents: Array("old content\n".utf8))
        let (carol, _) = contact("carol")
        try f.vault.share(folder.id, with: carol, mode: .read)
        let mount = try Vault.open(dataDirectory: f.dataDir)
        let open = try mount.openDocument(doc.id)
        #expect(try open.read(offset: 0, count: 100) == Array("old content\n".utf8))
        try f.vault.unshare(folder.id, from: try AccountID(bytes: carol.signingKey), name: "carol", boxKeys: [:])
        try f.vault.writeAll(doc.id, Array("edited elsewhere\n".utf8))
        _ = try mount.refreshAll()
        #expect(try open.read(offset: 0, count: 100) == Array("edited elsewhere\n".utf8))
        try open.write(offset: 0, bytes: Array("E".utf8))
        try mount.release(open)
        let fresh = try Vault.open(dataDirectory: f.dataDir)
        #expect(try fresh.readAll(doc.id) == Array("Edited elsewhere\n".utf8))
        #expect(try fresh.check().isClean)
    }
}
