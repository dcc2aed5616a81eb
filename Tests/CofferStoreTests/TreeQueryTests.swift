import CofferModel
import Foundation
import GRDB
import Testing

@testable import CofferStore

/// The tree as the vault reads it from the store (local over base, by index), and the format
/// migration that made it possible.
@Suite("The committed tree")
struct TreeQueryTests {
    /// A record of kind `folder` unless it names content.
    func put(_ w: StoreWriter, _ f: StoredFile, _ side: TreeSide) throws { try w.put(f, side) }

    @Test func aLocalRecordHidesItsBaseRecordEverywhere() throws {
        try withStore { store, _ throws in
            try store.write { w in
                try put(w, record(1, parent: 1, name: "root"), .base)
                try put(w, record(2, parent: 1, name: "a"), .base)
                try put(w, record(3, parent: 1, name: "b", digest: digest(1)), .base)
                try put(w, record(4, parent: 2, name: "c"), .base)
                // Locally: 4 moved from 2 to 1, 3 deleted, 5 created under 2.
                try put(w, record(4, parent: 1, name: "c"), .local)
                try put(w, record(3, parent: 1, name: "b", digest: digest(1), deleted: true), .local)
                try put(w, record(5, parent: 2, name: "d"), .local)
            }
            #expect(try store.committedRecord(fid(4))?.metadata.parent == fid(1))
            #expect(try store.committedRecord(fid(2))?.metadata.parent == fid(1))
            #expect(try store.committedRecord(fid(9)) == nil)
            #expect(Set(try store.committedChildren(of: fid(1)).map(\.metadata.id)) == [fid(2), fid(3), fid(4)])
            #expect(Set(try store.committedChildren(of: fid(2)).map(\.metadata.id)) == [fid(5)])
            #expect(try store.committedChildren(of: fid(1), nameMAC: Array("c".utf8)).map(\.metadata.id) == [fid(4)])
            #expect(try store.committedChildren(of: fid(2), nameMAC: Array("c".utf8)).isEmpty)
            // Live folders under the root: 2 and 4 (3 is a deleted document).
            #expect(try store.committedSubfolderCount(of: fid(1)) == 2)
            #expect(try store.committedSubfolderCount(of: fid(2)) == 1)
            #expect(try store.committedRoots() == [fid(1)])
            #expect(try store.committedCount() == 5)
        }
    }

    /// The counts the triggers keep (records, and local changes by kind) match a count of the
    /// rows after every kind of change.
    @Test func theRecordCountFollowsInsertsAndDeletesOnBothSides() throws {
        try withStore { store, _ throws in
            func expected() throws -> Int {
                try store.read { r in
                    try r.count(
                        """
                        SELECT (SELECT count(*) FROM base_files) + (SELECT count(*) FROM local_files l
                          WHERE NOT EXISTS (SELECT 1 FROM base_files b WHERE b.id = l.id))
                        """)
                }
            }
            let inBase = "EXISTS (SELECT 1 FROM base_files b WHERE b.id = l.id)"
            func expectedPending() throws -> [Int] {
                try store.read { r in
                    [
                        try r.count("SELECT count(*) FROM local_files l WHERE kind < 2 AND NOT \(inBase)"),
                        try r.count("SELECT count(*) FROM local_files l WHERE kind < 2 AND \(inBase)"),
                        try r.count("SELECT count(*) FROM local_files WHERE kind >= 2"),
                    ]
                }
            }
            let steps: [(StoreWriter) throws -> Void] = [
                { try $0.put(record(1, parent: 1), .base) },
                { try $0.put(record(2, parent: 1), .local) },
                { try $0.put(record(2, parent: 1), .base) },  // both sides: counted once
                { try $0.put(record(2, parent: 1, name: "x"), .local) },  // an update is no insert
                { try $0.put(record(2, parent: 1, name: "x", deleted: true), .local) },  // now a deletion
                { try $0.put(record(2, parent: 1, name: "x"), .local) },  // and back
                { try $0.remove(fid(2), .local) },
                { try $0.put(record(3, parent: 1), .local) },
                { try $0.remove(fid(2), .base) },
                { try $0.remove(fid(3), .local) },
                { try $0.remove(fid(9), .base) },  // nothing to remove
            ]
            for step in steps {
                try store.write { try step($0) }
                #expect(try store.committedCount() == expected())
                let p = try store.pendingCounts()
                #expect([p.created, p.modified, p.deleted] == (try expectedPending()))
            }
            #expect(try store.committedCount() == 1)
        }
    }

    /// The group's writes stay invisible to the committed reads until the group commits, and
    /// `committedGroup` says when they are visible.
    @Test func committedReadsSeeAGroupOnlyOnceItCommits() throws {
        try withStore { store, _ throws in
            try store.write { try $0.put(record(1, parent: 1), .base) }
            store.enableGroupCommit(window: 30, longest: 60)
            defer { try? store.disableGroupCommit() }
            let generation = try store.write { w -> UInt64? in
                try w.put(record(2, parent: 1, name: "new"), .local)
                return w.groupGeneration
            }
            let g = try #require(generation)
            #expect(store.committedGroup < g)
            #expect(try store.committedRecord(fid(2)) == nil)
            #expect(try store.read { try $0.current(fid(2)) } != nil)  // the writer's own view has it
            try store.commitPendingWrites()
            #expect(store.committedGroup >= g)
            #expect(try store.committedRecord(fid(2))?.metadata.name.mac == Array("new".utf8))
        }
    }

    /// A store made before the tree lived in the store (format v1) gains the columns, indexes
    /// and count, filled from its records, when it is opened.
    @Test func aVersionOneStoreIsMigrated() throws {
        let dir = makeTempDir()
        defer { cleanup(dir) }
        try makeStore(
            at: dir, format: "v1",
            rows: [
                (record(1, parent: 1, name: "root"), .base), (record(2, parent: 1, name: "a"), .base),
                (record(3, parent: 1, name: "b", deleted: true), .local), (record(2, parent: 1, name: "a2"), .local),
            ]
        ) { db in
            // Damage: a record that does not decode keeps empty columns, and the rest migrate.
            try db.execute(
                sql: "INSERT INTO base_files (id, parent, record) VALUES (?, ?, x'00')",
                arguments: [Data(fid(7).bytes), Data(fid(1).bytes)])
        }
        let store = try Store(directory: dir)
        #expect(try store.committedChildren(of: fid(1), nameMAC: Array("a2".utf8)).map(\.metadata.id) == [fid(2)])
        #expect(try store.committedChildren(of: fid(1), nameMAC: Array("a".utf8)).isEmpty)
        #expect(try store.committedSubfolderCount(of: fid(1)) == 1)  // 2 is live, 3 deleted
        #expect(try store.committedCount() == 4)
        #expect(try store.read { try $0.deletedBaseIDs() }.isEmpty)  // 3 is deleted only locally
    }

    /// A store of format v2 (rows keyed by id) is rebuilt with its rows clustered under their
    /// parent: every row, count and trigger survives, and the writer's upsert still finds a row
    /// by id when its parent or name changes (which moves it in the table).
    @Test func aVersionTwoStoreIsClusteredByParent() throws {
        let dir = makeTempDir()
        defer { cleanup(dir) }
        try makeStore(
            at: dir, format: "v2",
            rows: [
                (record(1, parent: 1, name: "root"), .base), (record(2, parent: 1, name: "a"), .base),
                (record(4, parent: 2, name: "c", digest: digest(1)), .base),
                (record(3, parent: 1, name: "b", deleted: true), .local), (record(2, parent: 1, name: "a2"), .local),
            ])
        let store = try Store(directory: dir)
        let clustered = try store.read { r in
            try r.count(
                """
                SELECT count(*) FROM sqlite_master WHERE name IN ('base_files', 'local_files')
                  AND sql LIKE '%PRIMARY KEY (parent, name_mac, id)%'
                """)
        }
        #expect(clustered == 2)
        #expect(try store.committedChildren(of: fid(1), nameMAC: Array("a2".utf8)).map(\.metadata.id) == [fid(2)])
        #expect(Set(try store.committedChildren(of: fid(1)).map(\.metadata.id)) == [fid(2), fid(3)])
        #expect(try store.committedRecord(fid(4))?.metadata.parent == fid(2))
        #expect(try store.committedCount() == 4)
        #expect(try store.pendingCounts() == (created: 0, modified: 1, deleted: 1))

        // The triggers are back: a move (a new parent and name for 4), a creation, a removal.
        try store.write { w in
            try w.put(record(4, parent: 1, name: "moved", digest: digest(2)), .local)
            try w.put(record(5, parent: 4, name: "new"), .local)
            try w.remove(fid(3), .local)
        }
        #expect(try store.committedChildren(of: fid(2)).isEmpty)
        #expect(try store.committedChildren(of: fid(1), nameMAC: Array("moved".utf8)).map(\.metadata.id) == [fid(4)])
        #expect(try store.committedRecord(fid(4))?.metadata.contentDigest == digest(2))
        #expect(try store.committedCount() == 4)  // 3 was only local: gone; 5 is new
        #expect(try store.pendingCounts() == (created: 1, modified: 2, deleted: 0))
        // Another put of the same row in place (same parent and name) updates it, no duplicate.
        try store.write { w in try w.put(record(4, parent: 1, name: "moved", digest: digest(3)), .local) }
        #expect(try store.garbageSinceCollection() == 1)  // the local row's content before it
        #expect(try store.read { try $0.count("SELECT count(*) FROM local_files WHERE id = x'\(hex(fid(4)))'") } == 1)
    }

    /// A store of format v3 gets an index of live folders per tree table, which a folder's
    /// subfolder count reads: base folders hidden by a local row, deleted ones and the root
    /// are not counted, before and after later changes.
    @Test func aVersionThreeStoreCountsSubfoldersFromAFolderIndex() throws {
        let dir = makeTempDir()
        defer { cleanup(dir) }
        try makeStore(
            at: dir, format: "v3",
            rows: [
                (record(1, parent: 1, name: "root"), .base), (record(2, parent: 1, name: "a"), .base),
                (record(3, parent: 1, name: "b"), .base), (record(4, parent: 1, name: "c", deleted: true), .base),
                (record(5, parent: 1, name: "d", digest: digest(1)), .base),
                (record(3, parent: 2, name: "b"), .local), (record(6, parent: 1, name: "e"), .local),
            ])
        let store = try Store(directory: dir)
        let indexes = try store.read { r in
            try r.count("SELECT count(*) FROM sqlite_master WHERE type = 'index' AND name LIKE '%_files_folders'")
        }
        #expect(indexes == 2)
        // Under the root: a (base) and e (local); b moved under a locally; c is deleted, d a document.
        #expect(try store.committedSubfolderCount(of: fid(1)) == 2)
        #expect(try store.committedSubfolderCount(of: fid(2)) == 1)
        try store.write { w in
            try w.put(record(3, parent: 1, name: "b"), .local)  // back under the root
            try w.put(record(6, parent: 1, name: "e", deleted: true), .local)
            try w.put(record(7, parent: 2, name: "f"), .local)
        }
        #expect(try store.committedSubfolderCount(of: fid(1)) == 2)
        #expect(try store.committedSubfolderCount(of: fid(2)) == 1)
    }

    /// Format `v6` numbers inodes by hash (docs/FILESYSTEM.md, "Inode numbers"): a store of
    /// `v5` keeps its old table, emptied (a daemon of the older build still running needs it
    /// to exist), and gains the table of exceptions, empty.
    @Test func aVersionFiveStoreLosesItsInodeRows() throws {
        let dir = makeTempDir()
        defer { cleanup(dir) }
        try makeStore(
            at: dir, format: "v5", rows: [(record(1, parent: 1, name: "root"), .base)],
            more: { db in
                for i in 2..<50 {
                    try db.execute(
                        sql: "INSERT INTO inodes(ino, file_id) VALUES (?, ?)", arguments: [i, Data(fid(i).bytes)])
                }
            })
        let store = try Store(directory: dir)
        #expect(try store.read { try $0.count("SELECT count(*) FROM inodes") } == 0)
        #expect(try store.read { try $0.inodeExceptions() }.isEmpty)
        try store.write { try $0.addInodeException(fid(7), 1 << 62) }
        #expect(try store.read { try $0.inodeExceptions() }.map(\.inode) == [1 << 62])
    }

    /// A store of an older `format`, holding `rows` as that format's build wrote them (from
    /// `v2` on, with their name MAC and kind), and whatever `more` writes; closed again.
    private func makeStore(
        at dir: String, format: String, rows: [(StoredFile, TreeSide)], more: (Database) throws -> Void = { _ in }
    ) throws {
        let pool = try DatabasePool(path: dir + "/coffer.sqlite")
        try Store.migrator.migrate(pool, upTo: format)
        try pool.write { db in
            for (f, side) in rows {
                let m = f.metadata
                var columns: [String: (any DatabaseValueConvertible)?] = [
                    "id": Data(m.id.bytes), "parent": Data(m.parent.bytes), "record": Data(f.signed.encoded()),
                ]
                if format != "v1" {
                    columns["content_digest"] = m.contentDigest.map { Data($0) }
                    columns["name_mac"] = Data(m.name.mac)
                    columns["kind"] = TreeKind.of(m, false)
                }
                let names = columns.keys.sorted()
                try db.execute(
                    sql: """
                        INSERT INTO \(side.table) (\(names.joined(separator: ", ")))
                          VALUES (\(names.map { _ in "?" }.joined(separator: ", ")))
                        """,
                    arguments: StatementArguments(names.map { columns[$0] ?? nil }))
            }
            try more(db)
        }
    }

    private func hex(_ id: FileID) -> String { id.bytes.map { String(format: "%02x", $0) }.joined() }
}
