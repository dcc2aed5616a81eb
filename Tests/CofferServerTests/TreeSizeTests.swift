import CofferCrypto
import CofferModel
import CofferProtocol
import Foundation
import Testing

@testable import CofferServerCore

/// An upsert or a pull of one change reads what it touches, not the account's tree: the rows a
/// request reads (`CountingStorage`) are the same in a tree of 10 files and one of 5,000.
@Suite struct TreeSizeTests {
    /// An account with a root, a folder `big` holding `n` documents `f0`…, a folder `small`
    /// holding two, and an empty folder `dest`: the same shape around the files each operation
    /// touches, whatever `n`.
    struct Account {
        let dir: URL
        let device: Device
        let root: FileMetadata
        let big: FileMetadata
        let small: FileMetadata
        let dest: FileMetadata
        let docs: [FileMetadata]
    }

    static func makeAccount(files n: Int) throws -> Account {
        let (server, dir) = try makeServer()
        let a = try Device(server, TestUser())
        let root = rootRecord(a.user)
        let big = record(a.user, .folder, in: root.id, named: "big")
        let small = record(a.user, .folder, in: root.id, named: "small")
        let dest = record(a.user, .folder, in: root.id, named: "dest")
        try a.push([root, big, small, dest])
        try a.push([
            record(a.user, .document, in: small.id, named: "s0"), record(a.user, .document, in: small.id, named: "s1"),
        ])
        let docs = (0..<n).map { record(a.user, .document, in: big.id, named: "f\($0)") }
        for start in stride(from: 0, to: n, by: TreeLimits.maxRecordsPerBatch) {
            try a.push(Array(docs[start..<min(n, start + TreeLimits.maxRecordsPerBatch)]))
        }
        return Account(dir: dir, device: a, root: root, big: big, small: small, dest: dest, docs: docs)
    }

    /// A server over the account's storage that has served nothing yet (as after a restart),
    /// counting what its metadata reads return.
    static func coldServer(_ dir: URL) throws -> (CofferServer, CountingStorage) {
        let storage = try CountingStorage(path: dir.appendingPathComponent("metadata.sqlite").path)
        let content = try DirectoryContentStorage(
            root: dir.appendingPathComponent("chunks", isDirectory: true),
            tmp: dir.appendingPathComponent("tmp", isDirectory: true))
        return (CofferServer(metadata: storage, content: content), storage)
    }

    /// Rows read by each operation, in order, on a cold server over an account of `n` files.
    static func rowsRead(files n: Int) throws -> [String: Int] {
        let account = try makeAccount(files: n)
        let (server, storage) = try coldServer(account.dir)
        let a = try Device(server, account.device.user, register: false)
        a.seen = account.device.seen
        a.sent = account.device.sent
        var rows: [String: Int] = [:]
        let docs = account.docs
        rows["create"] = try storage.count {
            try a.push([record(a.user, .document, in: account.big.id, named: "new")])
        }
        rows["rename"] = try storage.count {
            var m = docs[0]
            m.name = sealedName("renamed")
            try a.push([m])
        }
        rows["move"] = try storage.count {
            var m = docs[1]
            m.parent = account.dest.id
            try a.push([m])
        }
        rows["delete"] = try storage.count {
            var m = docs[2]
            m.isDeleted = true
            try a.push([m])
        }
        var v: Int64 = 0
        rows["delete folder"] = try storage.count {
            var m = account.small
            m.isDeleted = true
            v = try a.push([m])
        }
        rows["pull"] = try storage.count {
            let page = try server.updates(caller: a.user.key, since: v - 1)
            #expect(page.files.count == 3 && page.files.filter(\.serverDeleted).count == 2)
        }
        rows["refused conflict"] = storage.count {
            expectRefusal(409, ErrorResponse.invalidTree) {
                try a.push([record(a.user, .document, in: account.big.id, named: "f3")])
            }
        }
        rows["refused cycle"] = storage.count {
            var m = account.dest
            m.parent = account.dest.id
            expectRefusal(409, ErrorResponse.invalidTree) { try a.push([m]) }
        }
        rows["usage"] = try storage.count {
            let usage = try server.usage(caller: a.user.key)
            #expect(usage.files == Int64(n + 3))
        }
        return rows
    }

    @Test func oneChangeReadsTheSameInASmallAndALargeTree() throws {
        let small = try Self.rowsRead(files: 10)
        let large = try Self.rowsRead(files: 5000)
        #expect(small == large)
        // And a handful each: the records changed, their ancestors, their same-name siblings.
        for (operation, rows) in large { #expect(rows <= 12, "\(operation) read \(rows) rows") }
    }

    /// A name saved over many times (an editor's write-and-rename) leaves a deleted sibling per
    /// save: the path-conflict lookup reads live siblings only, and still finds a live one.
    @Test func deletedSiblingsOfANameAreNotRead() throws {
        func rows(saves: Int) throws -> Int {
            let (server, dir) = try makeServer()
            let a = try Device(server, TestUser())
            let root = rootRecord(a.user)
            try a.push([root])
            for _ in 0..<saves {
                let doc = record(a.user, .document, in: root.id, named: "notes")
                try a.push([doc])
                var gone = doc
                gone.isDeleted = true
                try a.push([gone])
            }
            let live = record(a.user, .document, in: root.id, named: "notes")
            try a.push([live])
            let (cold, storage) = try Self.coldServer(dir)
            let b = try Device(cold, a.user, register: false)
            b.seen = a.seen
            b.sent = a.sent
            let n = storage.count {
                expectRefusal(409, ErrorResponse.invalidTree) {
                    try b.push([record(a.user, .document, in: root.id, named: "notes")])
                }
            }
            var renamed = live
            renamed.name = sealedName("notes-old")
            try b.push([renamed])
            try b.push([record(a.user, .document, in: root.id, named: "notes")])
            #expect(try cold.audit(account: a.user.key).isEmpty)
            return n
        }
        #expect(try rows(saves: 3) == rows(saves: 200))
    }

    /// Deleting a folder reads and marks its live files, not the deleted ones it holds.
    @Test func deletingAFolderReadsItsLiveFilesOnly() throws {
        func rows(deleted: Int) throws -> Int {
            let (server, dir) = try makeServer()
            let a = try Device(server, TestUser())
            let root = rootRecord(a.user)
            let folder = record(a.user, .folder, in: root.id, named: "folder")
            let sub = record(a.user, .folder, in: folder.id, named: "sub")
            let live = [
                record(a.user, .document, in: folder.id, named: "a"), record(a.user, .document, in: sub.id, named: "b"),
            ]
            try a.push([root, folder, sub] + live)
            var old = (0..<deleted).map { record(a.user, .document, in: folder.id, named: "old\($0)") }
            try a.push(old)
            for i in old.indices { old[i].isDeleted = true }
            try a.push(old)
            let (cold, storage) = try Self.coldServer(dir)
            let b = try Device(cold, a.user, register: false)
            b.seen = a.seen
            b.sent = a.sent
            var gone = folder
            gone.isDeleted = true
            var v: Int64 = 0
            let n = try storage.count { v = try b.push([gone]) }
            let marked = try cold.updates(caller: a.user.key, since: v - 1).files
            #expect(marked.count == 4 && marked.filter(\.serverDeleted).count == 3)
            #expect(try cold.usage(caller: a.user.key).files == 1)
            #expect(try cold.audit(account: a.user.key).isEmpty)
            return n
        }
        #expect(try rows(deleted: 5) == rows(deleted: 500))
    }

    /// The server keeps nothing per account between requests (it once cached every account's
    /// whole decoded tree): its stored properties are its configuration and its storages, and
    /// the watches open now (`notifier`, capped per account and in all). A property added here
    /// should be as bounded as these.
    @Test func theServerHoldsNoStatePerAccount() throws {
        let (server, _) = try makeServer()
        let stored = Set(Mirror(reflecting: server).children.compactMap(\.label))
        #expect(
            stored == [
                "metadata", "content", "nonces", "quotaBytes", "identity", "registration", "clock", "lastNoncePurge",
                "maxChunkResponseBytes", "notifier",
            ])
    }

    /// Names are compared as stored bytes, the empty MAC (which a hostile client may send)
    /// included: two live siblings with it conflict.
    @Test func emptyNameMACsConflict() throws {
        let (server, _) = try makeServer()
        let a = try Device(server, TestUser())
        let root = rootRecord(a.user)
        var first = record(a.user, .document, in: root.id, named: "x")
        first.name = SealedName(ciphertext: randomBytes(40), mac: [])
        try a.push([root, first])
        var second = record(a.user, .document, in: root.id, named: "y")
        second.name = SealedName(ciphertext: randomBytes(40), mac: [])
        expectRefusal(409, ErrorResponse.invalidTree) { try a.push([second]) }
        #expect(try server.audit(account: a.user.key).isEmpty)
    }
}

/// A database made before the tree's columns existed (format v1) is brought up to date when
/// the server opens it: every row gets its parent and name MAC from its record, the account its
/// live file count, and the server then works on it as on a new one.
@Suite struct MigrationTests {
    @Test func aV1DatabaseGetsItsTreeColumns() throws {
        let (server, dir) = try makeServer()
        let a = try Device(server, TestUser())
        let root = rootRecord(a.user)
        let top = record(a.user, .folder, in: root.id, named: "top")
        let inner = record(a.user, .folder, in: top.id, named: "inner")
        var doc = record(a.user, .document, in: inner.id, named: "doc")
        doc.contentDigest = try a.putContent(doc.id, chunks: [randomBytes(100)])
        let gone = record(a.user, .folder, in: root.id, named: "gone")
        let lost = record(a.user, .document, in: gone.id, named: "lost")
        try a.push([root, top, inner, doc, gone, lost])
        var deleted = gone
        deleted.isDeleted = true
        try a.push([deleted])
        #expect(try server.usage(caller: a.user.key).files == 4)

        // Back to the v1 format: the columns and index v2 added dropped, v2 forgotten.
        let path = dir.appendingPathComponent("metadata.sqlite").path
        do {
            let storage = try SQLiteMetadataStorage(path: path)
            try storage.pool.write { db in
                try db.execute(
                    sql: """
                        DROP INDEX file_by_parent;
                        ALTER TABLE file DROP COLUMN parent;
                        ALTER TABLE file DROP COLUMN name_mac;
                        ALTER TABLE account DROP COLUMN live_files;
                        DELETE FROM grdb_migrations WHERE identifier = 'v2';
                        """)
            }
        }
        let reopened = try CofferServer.open(directory: dir)
        let b = try Device(reopened, a.user, register: false)
        b.seen = a.seen
        b.sent = a.sent
        let migrated = try reopened.audit(account: a.user.key)
        #expect(migrated.isEmpty, "\(migrated)")
        #expect(try reopened.usage(caller: a.user.key).files == 4)
        // The tree is read through the new index: a conflict, a cycle, a deleted folder.
        expectRefusal(409, ErrorResponse.invalidTree) {
            try b.push([record(a.user, .folder, in: root.id, named: "top")])
        }
        var cycle = top
        cycle.parent = inner.id
        expectRefusal(409, ErrorResponse.invalidTree) { try b.push([cycle]) }
        expectRefusal(409, ErrorResponse.getUpdatesRequired) {
            try b.push([record(a.user, .document, in: gone.id, named: "new")])
        }
        var topGone = top
        topGone.isDeleted = true
        let v = try b.push([topGone])
        #expect(try reopened.updates(caller: a.user.key, since: v - 1).files.filter(\.serverDeleted).count == 2)
        #expect(try reopened.usage(caller: a.user.key).files == 1)
        let problems = try reopened.audit(account: a.user.key)
        #expect(problems.isEmpty, "\(problems)")
    }
}
