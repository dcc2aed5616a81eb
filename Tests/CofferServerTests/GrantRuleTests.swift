import CofferCrypto
import CofferModel
import CofferProtocol
import CofferServerCore
import Foundation
import Testing

/// A grant on `file` to `grantee`, its key sealed for the grantee's box key with its binding and
/// signed by `signer` (the owner, unless a test forges it).
func signedGrant(
    _ file: FileID, owner: TestUser, to grantee: TestUser, _ mode: AccessMode, deleted: Bool = false,
    signer: SigningKeyPair? = nil
) throws -> AccessEntry {
    var e = AccessEntry(account: grantee.id, mode: mode, sealedKey: [], isDeleted: deleted)
    let box = try PublicBoxKey(bytes: Array(grantee.boxKey))
    e.sealedKey = box.seal(key: .random(), binding: e.keyBinding(fileID: file, owner: owner.id))
    e.signature = (signer ?? owner.keys).sign(e.grantMessage(fileID: file))
    return e
}

/// The access rules at the server, attacked with crafted records signed by the caller: what a
/// client that skips its own checks could send. Each refusal leaves the stored tree unchanged.
@Suite("Grants and links at the server")
struct GrantRuleTests {
    @Test func anOwnerSignedGrantIsStoredAndServedByteForByte() throws {
        let (server, _) = try makeServer()
        let a = try Device(server, TestUser())
        let bob = TestUser()
        let root = rootRecord(a.user)
        var shared = record(a.user, .folder, in: root.id, named: "shared")
        shared.access = [try signedGrant(shared.id, owner: a.user, to: bob, .write)]
        try a.push([root, shared])
        let stored = try a.all().map(decodeRecord).first { $0.id == shared.id }
        #expect(stored == shared)
        // Revoking is a signed tombstone, and the revoked grant stays in the record.
        var revoked = shared
        revoked.access = [try signedGrant(shared.id, owner: a.user, to: bob, .write, deleted: true)]
        try a.push([revoked])
        #expect(try a.all().map(decodeRecord).first { $0.id == shared.id }?.access.first?.isDeleted == true)
        #expect(try server.audit(account: a.user.key).isEmpty)
    }

    @Test func forgedMalformedOrMisplacedGrantsAreRefused() throws {
        let (server, _) = try makeServer()
        let a = try Device(server, TestUser())
        let bob = TestUser()
        let mallory = TestUser()
        let root = rootRecord(a.user)
        var shared = record(a.user, .folder, in: root.id, named: "shared")
        shared.access = [try signedGrant(shared.id, owner: a.user, to: bob, .read)]
        try a.push([root, shared])
        let before = try a.all()

        func attempt(_ m: FileMetadata, _ what: String) throws {
            expectRefusal(403, ErrorResponse.forbidden) { try a.push([m]) }
            #expect(try a.all() == before, "\(what) changed the stored tree")
        }
        // Signed by someone other than the owner.
        var forged = shared
        forged.access = [try signedGrant(shared.id, owner: a.user, to: bob, .write, signer: mallory.keys)]
        try attempt(forged, "a forged upgrade")
        // A grant signed for another file, moved here.
        var moved = shared
        let other = newFileID()
        var elsewhere = try signedGrant(other, owner: a.user, to: mallory, .write)
        elsewhere.signature = a.user.keys.sign(elsewhere.grantMessage(fileID: other))
        moved.access.append(elsewhere)
        try attempt(moved, "a grant signed for another file")
        // Removed outright instead of revoked.
        var dropped = shared
        dropped.access = []
        try attempt(dropped, "a dropped grant")
        // Two grants to one account.
        var twice = shared
        twice.access.append(try signedGrant(shared.id, owner: a.user, to: bob, .write))
        try attempt(twice, "a second grant to one account")
        // Owner mode to someone else.
        var ownerMode = shared
        ownerMode.access = [try signedGrant(shared.id, owner: a.user, to: bob, .owner)]
        try attempt(ownerMode, "an owner-mode grant")
        // The root is never shared, not even at creation.
        let (server2, _) = try makeServer()
        let c = try Device(server2, TestUser())
        var sharedRoot = rootRecord(c.user)
        sharedRoot.access.append(try signedGrant(sharedRoot.id, owner: c.user, to: bob, .read))
        expectRefusal(403, ErrorResponse.forbidden) { try c.push([sharedRoot]) }
        #expect(try c.all().isEmpty)
    }

    @Test func linksToNothingAndTargetsOnOtherTypesAreRefused() throws {
        let (server, _) = try makeServer()
        let a = try Device(server, TestUser())
        let root = rootRecord(a.user)
        try a.push([root])
        var link = record(a.user, .link, in: root.id, named: "link")
        link.linkTarget = newFileID()
        expectRefusal(403, ErrorResponse.forbidden) { try a.push([link]) }
        var notLink = record(a.user, .document, in: root.id, named: "doc")
        notLink.linkTarget = newFileID()
        expectRefusal(403, ErrorResponse.forbidden) { try a.push([notLink]) }
        #expect(try a.all().count == 1)
    }
}
