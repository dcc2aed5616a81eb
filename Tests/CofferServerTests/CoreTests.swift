import CofferCrypto
import CofferModel
import CofferProtocol
import CofferServerCore
import Foundation
import Testing

@Suite struct AccountTests {
    @Test func createAndLookUp() throws {
        let (server, _) = try makeServer()
        let alice = TestUser("alice")
        let r = try server.createAccount(caller: alice.key, alice.createRequest)
        #expect(r.signingKey == alice.key)
        let found = try server.lookup(username: "alice")
        #expect(found.signingKey == alice.key && found.boxKey == alice.boxKey)
        expectRefusal(404, ErrorResponse.notFound) { _ = try server.lookup(username: "bob") }
        // Username and key are unique.
        expectRefusal(409, ErrorResponse.conflict) {
            _ = try server.createAccount(caller: alice.key, alice.createRequest)
        }
        let other = TestUser("alice")
        expectRefusal(409, ErrorResponse.conflict) {
            _ = try server.createAccount(caller: other.key, other.createRequest)
        }
        var sameKey = alice.createRequest
        sameKey.username = "alice2"
        expectRefusal(409, ErrorResponse.conflict) { _ = try server.createAccount(caller: alice.key, sameKey) }
        // Signed by someone else, malformed keys, bad usernames.
        let bob = TestUser("bob")
        expectRefusal(403, ErrorResponse.forbidden) {
            _ = try server.createAccount(caller: alice.key, bob.createRequest)
        }
        var short = bob.createRequest
        short.boxKey = Data([1, 2, 3])
        expectRefusal(400, ErrorResponse.badRequest) { _ = try server.createAccount(caller: bob.key, short) }
        for bad in ["", "a b", "a/b", String(repeating: "x", count: 65), "bell\u{7}", "emoji😀"] {
            var req = bob.createRequest
            req.username = bad
            expectRefusal(400, ErrorResponse.badRequest) { _ = try server.createAccount(caller: bob.key, req) }
        }
        let usage = try server.usage(caller: alice.key)
        #expect(usage.files == 0 && usage.bytes == 0)
    }
}

@Suite struct UpsertTests {
    @Test func roundTripAndVersions() throws {
        let (server, _) = try makeServer()
        let a = try Device(server, TestUser())
        let root = rootRecord(a.user)
        let folder = record(a.user, .folder, in: root.id, named: "docs")
        let v1 = try a.push([root, folder])
        #expect(v1 > 0)
        let all = try a.all()
        #expect(all.count == 2)
        #expect(all.allSatisfy { $0.version == v1 && $0.contentVersion == v1 && !$0.serverDeleted })
        #expect(Set(try all.map { try decodeRecord($0) }) == [root, folder])
        // Stored bytes are exactly what was signed.
        #expect(all.contains { (try? SignedMetadata(decoding: Array($0.record)))?.metadata == root })

        var doc = record(a.user, .document, in: folder.id, named: "a.txt")
        doc.contentDigest = try a.putContent(doc.id, chunks: [Array("hello".utf8)])
        let v2 = try a.push([doc])
        #expect(v2 > v1)
        let since = try server.updates(caller: a.user.key, since: v1)
        #expect(since.files.count == 1 && since.latest == v2 && !since.more)
        #expect(try server.updates(caller: a.user.key, since: v2).files.isEmpty)
        #expect(try server.updates(caller: a.user.key, since: v2).latest == v2)

        // A rename keeps the content version; new content moves it.
        var renamed = doc
        renamed.name = sealedName("b.txt")
        let v3 = try a.push([renamed])
        var f = try #require(try server.updates(caller: a.user.key, since: v2).files.first)
        #expect(f.version == v3 && f.contentVersion == v2)
        var edited = renamed
        edited.contentDigest = try a.putContent(doc.id, chunks: [Array("hello world".utf8)])
        let v4 = try a.push([edited])
        f = try #require(try server.updates(caller: a.user.key, since: v3).files.first)
        #expect(f.version == v4 && f.contentVersion == v4)
        // Re-sending an unchanged record changes nothing.
        #expect(try a.push([edited]) == v4)
        #expect(try server.usage(caller: a.user.key).files == 3)
        #expect(try server.audit(account: a.user.key).isEmpty)
    }

    @Test func stalePreconditionRefusedAndNothingChanges() throws {
        let (server, _) = try makeServer()
        let a = try Device(server, TestUser())
        let root = rootRecord(a.user)
        let x = record(a.user, .folder, in: root.id, named: "x")
        let y = record(a.user, .folder, in: root.id, named: "y")
        let v = try a.push([root, x, y])
        // Another device renames x; this device still believes the old name.
        let other = Device(sharing: a)
        var renamed = x
        renamed.name = sealedName("x2")
        try other.push([renamed])
        let before = try a.all()
        var moved = x
        moved.parent = y.id
        let newFile = record(a.user, .document, in: root.id, named: "n")
        expectRefusal(409, ErrorResponse.getUpdatesRequired) { try a.push([newFile, moved]) }
        #expect(try a.all() == before)
        // A new file must come with no precondition; an existing one must come with one.
        expectRefusal(409, ErrorResponse.getUpdatesRequired) {
            _ = try server.upsert(
                caller: a.user.key,
                UpsertRequest(updates: [FileUpdate(record: a.user.sign(y), expectedParent: nil, expectedNameMAC: nil)]))
        }
        expectRefusal(409, ErrorResponse.getUpdatesRequired) {
            _ = try server.upsert(
                caller: a.user.key,
                UpsertRequest(updates: [
                    FileUpdate(
                        record: a.user.sign(newFile), expectedParent: Data(root.id.bytes),
                        expectedNameMAC: Data(newFile.name.mac))
                ]))
        }
        expectRefusal(400, ErrorResponse.badRequest) {
            _ = try server.upsert(
                caller: a.user.key,
                UpsertRequest(updates: [
                    FileUpdate(record: a.user.sign(y), expectedParent: Data(root.id.bytes), expectedNameMAC: nil)
                ]))
        }
        #expect(try a.all() == before)
        #expect(try server.updates(caller: a.user.key, since: v).files.count == 1)
    }

    @Test func invariantViolationsRefused() throws {
        let (server, _) = try makeServer()
        let a = try Device(server, TestUser())
        let root = rootRecord(a.user)
        let p = record(a.user, .folder, in: root.id, named: "p")
        let q = record(a.user, .folder, in: p.id, named: "q")
        let doc = record(a.user, .document, in: root.id, named: "d")
        try a.push([root, p, q, doc])
        let before = try a.all()

        // Path conflict: equal name MACs among live siblings.
        expectRefusal(409, ErrorResponse.invalidTree) { try a.push([record(a.user, .folder, in: root.id, named: "p")]) }
        expectRefusal(409, ErrorResponse.invalidTree) {
            try a.push([
                record(a.user, .document, in: root.id, named: "twin"),
                record(a.user, .document, in: root.id, named: "twin"),
            ])
        }
        // Cycle: p into its own child.
        var cyc = p
        cyc.parent = q.id
        expectRefusal(409, ErrorResponse.invalidTree) { try a.push([cyc]) }
        // Two-folder cycle within one batch.
        var p2 = p
        var q2 = q
        p2.parent = q.id
        q2.parent = root.id
        q2.name = sealedName("q-top")
        var q3 = q2
        q3.parent = p.id
        expectRefusal(409, ErrorResponse.invalidTree) { try a.push([p2, q3]) }
        // Orphan: parent unknown.
        expectRefusal(409, ErrorResponse.invalidTree) {
            try a.push([record(a.user, .document, in: newFileID(), named: "o")])
        }
        // Parent is a document.
        expectRefusal(409, ErrorResponse.invalidTree) {
            try a.push([record(a.user, .document, in: doc.id, named: "o")])
        }
        // Root modification and a second root.
        var r2 = root
        r2.name = sealedName("renamed-root")
        expectRefusal(409, ErrorResponse.invalidTree) { try a.push([r2]) }
        var r3 = root
        r3.isDeleted = true
        expectRefusal(409, ErrorResponse.invalidTree) { try a.push([r3]) }
        expectRefusal(409, ErrorResponse.invalidTree) { try a.push([rootRecord(a.user)]) }
        // Type never changes.
        var t = doc
        t.type = .symlink
        expectRefusal(409, ErrorResponse.invalidTree) { try a.push([t]) }
        // A deleted file stays deleted.
        var del = doc
        del.isDeleted = true
        try a.push([del])
        let afterDelete = try a.all()
        var back = del
        back.isDeleted = false
        expectRefusal(409, ErrorResponse.getUpdatesRequired) { try a.push([back]) }
        #expect(try a.all() == afterDelete)
        #expect(afterDelete.count == before.count)
        #expect(try server.audit(account: a.user.key).isEmpty)
    }

    @Test func implicitDeletionsBecomeExplicit() throws {
        let (server, dir) = try makeServer()
        let a = try Device(server, TestUser())
        let root = rootRecord(a.user)
        let top = record(a.user, .folder, in: root.id, named: "top")
        let mid = record(a.user, .folder, in: top.id, named: "mid")
        let keep = record(a.user, .folder, in: root.id, named: "keep")
        var doc = record(a.user, .document, in: mid.id, named: "doc")
        doc.contentDigest = try a.putContent(doc.id, chunks: [randomBytes(100), randomBytes(50)])
        try a.push([root, top, mid, keep, doc])
        #expect(try server.usage(caller: a.user.key).bytes > 150)

        var gone = top
        gone.isDeleted = true
        let v = try a.push([gone])
        let files = try server.updates(caller: a.user.key, since: v - 1).files
        let byID = Dictionary(uniqueKeysWithValues: try files.map { (try decodeRecord($0).id, $0) })
        #expect(byID.count == 3)
        #expect(byID[top.id]?.serverDeleted == false)
        #expect(byID[mid.id]?.serverDeleted == true && byID[doc.id]?.serverDeleted == true)
        #expect(files.allSatisfy { $0.version == v })
        // The signed records are untouched (still verify, still say not deleted).
        #expect(byID[mid.id]?.record == a.sent[mid.id]?.bytes)
        // The deleted document's content is released.
        expectRefusal(404, ErrorResponse.notFound) {
            _ = try server.getManifest(
                caller: a.user.key,
                GetManifestRequest(fileID: Data(doc.id.bytes), digest: Data(doc.contentDigest ?? [])))
        }
        // What stays counted is the records (the server keeps them, deleted or not).
        #expect(try server.usage(caller: a.user.key).bytes == countedRows(a.user, [root, gone, mid, keep, doc]))
        let chunkDir = dir.appendingPathComponent("chunks").appendingPathComponent(
            RequestSigning.hex(Array(a.user.key)))
        let left =
            FileManager.default.enumerator(atPath: chunkDir.path)?.allObjects.compactMap { $0 as? String }.filter {
                $0.count == 64 + 3
            } ?? []
        #expect(left.isEmpty)
        // A serverDeleted file cannot come back by moving it out.
        var escape = mid
        escape.parent = keep.id
        expectRefusal(409, ErrorResponse.getUpdatesRequired) { try a.push([escape]) }
        // A deleted file's name is free again.
        try a.push([record(a.user, .folder, in: root.id, named: "top")])
        #expect(try server.audit(account: a.user.key).isEmpty)

        // Moving a file into a folder deleted earlier, or creating one there, means the device
        // has not seen the deletion: refused, nothing lost.
        let mover = record(a.user, .folder, in: root.id, named: "mover")
        let inner = record(a.user, .document, in: mover.id, named: "inner")
        try a.push([mover, inner])
        var moved = mover
        moved.parent = gone.id
        expectRefusal(409, ErrorResponse.getUpdatesRequired) { try a.push([moved]) }
        expectRefusal(409, ErrorResponse.getUpdatesRequired) {
            try a.push([record(a.user, .document, in: mid.id, named: "new")])
        }
        // Within one batch (delete a folder, move another into it) the moved subtree is marked.
        let bin = record(a.user, .folder, in: root.id, named: "bin")
        try a.push([bin])
        var binGone = bin
        binGone.isDeleted = true
        let v2 = try a.push([
            binGone,
            {
                var m = mover
                m.parent = bin.id
                return m
            }(),
        ])
        let marked = try server.updates(caller: a.user.key, since: v2 - 1).files
        #expect(marked.count == 3 && marked.allSatisfy { $0.version == v2 })
        #expect(marked.filter(\.serverDeleted).count == 2)
        #expect(try server.audit(account: a.user.key).isEmpty)
    }

    @Test func contentBeforeMetadata() throws {
        let (server, _) = try makeServer()
        let a = try Device(server, TestUser())
        let root = rootRecord(a.user)
        try a.push([root])
        var doc = record(a.user, .document, in: root.id, named: "d")
        doc.contentDigest = blake2b(randomBytes(10))
        expectRefusal(409, ErrorResponse.conflict) { try a.push([doc]) }
        // Digest stored for a different file does not count.
        let other = newFileID()
        let digest = try a.putContent(other, chunks: [randomBytes(10)])
        doc.contentDigest = digest
        expectRefusal(409, ErrorResponse.conflict) { try a.push([doc]) }
        // A non-document naming content is malformed.
        var folder = record(a.user, .folder, in: root.id, named: "f")
        folder.contentDigest = digest
        expectRefusal(400, ErrorResponse.badRequest) { try a.push([folder]) }
        doc.contentDigest = try a.putContent(doc.id, chunks: [randomBytes(10)])
        try a.push([doc])
        #expect(try a.all().count == 2)
    }
}

extension Device {
    /// A second device of the same account (its own view of what it saw).
    convenience init(sharing d: Device) {
        try! self.init(d.server, d.user, register: false)
        seen = d.seen
        sent = d.sent
    }
}
