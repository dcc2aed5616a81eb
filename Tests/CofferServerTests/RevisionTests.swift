import CofferCrypto
import CofferModel
import CofferProtocol
import CofferServerCore
import Foundation
import Testing

/// Signed revisions: the server keeps each file's records in revision order, so what it serves
/// can be checked by devices against what they have seen (docs/PROTOCOL.md, "Revisions").
@Suite struct RevisionTests {
    func upsert(_ a: Device, _ m: FileMetadata, revision: UInt64, expected: UInt64? = nil) throws -> Int64 {
        let prev = a.seen[m.id]
        let update = FileUpdate(
            record: a.user.sign(m, revision: revision), expectedParent: prev.map { Data($0.parent.bytes) },
            expectedNameMAC: prev.map { Data($0.name.mac) }, expectedRevision: expected)
        let v = try a.server.upsert(caller: a.user.key, UpsertRequest(updates: [update])).version
        a.seen[m.id] = m
        return v
    }

    func storedRevision(_ a: Device, _ id: FileID) throws -> UInt64? {
        try a.all().map { try SignedMetadata(decoding: Array($0.record)) }.first { $0.id == id }?.revision
    }

    @Test func aChangedRecordNeedsAGreaterRevision() throws {
        let (server, _) = try makeServer()
        let a = try Device(server, TestUser())
        let root = rootRecord(a.user)
        _ = try upsert(a, root, revision: 10)
        var changed = root
        changed.sealedAttributes = randomBytes(20)
        // Equal or lower: stale, whatever the parent and name say.
        for r: UInt64 in [10, 9, 0] {
            expectRefusal(409, ErrorResponse.getUpdatesRequired) { _ = try upsert(a, changed, revision: r) }
        }
        #expect(try storedRevision(a, root.id) == 10)
        _ = try upsert(a, changed, revision: 11)
        #expect(try storedRevision(a, root.id) == 11)
    }

    @Test func theExpectedRevisionMustBeTheStoredOne() throws {
        let (server, _) = try makeServer()
        let a = try Device(server, TestUser())
        let root = rootRecord(a.user)
        _ = try upsert(a, root, revision: 5)
        var changed = root
        changed.sealedAttributes = randomBytes(20)
        // A device that last saw revision 4 wrote over it: refused even with a higher revision,
        // so one device's write never silently replaces another's it has not merged.
        expectRefusal(409, ErrorResponse.getUpdatesRequired) { _ = try upsert(a, changed, revision: 100, expected: 4) }
        _ = try upsert(a, changed, revision: 6, expected: 5)
        #expect(try storedRevision(a, root.id) == 6)
    }

    @Test func anUnchangedRecordWithANewRevisionIsStored() throws {
        let (server, _) = try makeServer()
        let a = try Device(server, TestUser())
        let root = rootRecord(a.user)
        let v1 = try upsert(a, root, revision: 1)
        // The same record again: nothing changes.
        #expect(try upsert(a, root, revision: 1) == v1)
        // Re-signed (a retried push whose first reply was lost): stored, so the server holds the
        // record the device keeps as base and never serves it an older one.
        let v2 = try upsert(a, root, revision: 2)
        #expect(v2 > v1)
        #expect(try storedRevision(a, root.id) == 2)
    }
}
