import CofferModel
import Foundation
import GRDB

/// Read access inside a transaction: a `Store.read`, or a write's own reads (`StoreWriter.reader`).
///
/// A write in group-commit mode runs without the connection (`WriteSession`); each of its reads
/// borrows the connection for that one query, after the statements queued before it have run,
/// so a write always reads what it and every earlier write wrote.
public struct StoreReader {
    private enum Source {
        case database(Database)
        case session(WriteSession)
    }
    private let source: Source
    let files: ChunkFiles

    init(db: Database, files: ChunkFiles) {
        source = .database(db)
        self.files = files
    }

    init(session: WriteSession, files: ChunkFiles) {
        source = .session(session)
        self.files = files
    }

    private func with<T>(_ body: (Database) throws -> T) throws -> T {
        switch source {
        case .database(let db): return try body(db)
        case .session(let session): return try session.access(body)
        }
    }

    public func files(_ side: TreeSide) throws -> [StoredFile] {
        try with { db in
            try Row.fetchAll(
                db.cachedStatement(sql: "SELECT record, version, content_version, server_deleted FROM \(side.table)")
            ).map(Self.decode)
        }
    }

    /// Visits the records of one side a row at a time (so a walk of a large tree holds one
    /// record, not the table); `body` returns false to stop.
    public func visitFiles(_ side: TreeSide, _ body: (StoredFile) throws -> Bool) throws {
        try with { db in
            let rows = try Row.fetchCursor(
                db.cachedStatement(sql: "SELECT record, version, content_version, server_deleted FROM \(side.table)"))
            while let row = try rows.next() {
                if try !body(Self.decode(row)) { return }
            }
        }
    }

    /// Every record that decodes, plus a description of each that does not (for fsck).
    public func filesLeniently(_ side: TreeSide) throws -> (files: [StoredFile], problems: [String]) {
        let rows = try with { db in
            try Row.fetchAll(
                db.cachedStatement(
                    sql: "SELECT id, record, version, content_version, server_deleted FROM \(side.table)"))
        }
        var files: [StoredFile] = []
        var problems: [String] = []
        for row in rows {
            do { files.append(try Self.decode(row)) } catch {
                let id: Data = row["id"]
                problems.append(
                    "\(side == .base ? "base" : "local") record \(hexString([UInt8](id))) does not decode: \(error)")
            }
        }
        return (files, problems)
    }

    public func file(_ id: FileID, _ side: TreeSide) throws -> StoredFile? {
        try with { db in
            try Row.fetchOne(
                db.cachedStatement(
                    sql: "SELECT record, version, content_version, server_deleted FROM \(side.table) WHERE id = ?"),
                arguments: [Data(id.bytes)]
            ).map(Self.decode)
        }
    }

    /// Base records marked deleted (by their writer or the server) with no local record: where
    /// pruning synced deletions starts (`Vault.pruneSyncedDeletions`). An index holds only these.
    public func deletedBaseIDs() throws -> [FileID] {
        try with { db in
            try Data.fetchAll(
                db.cachedStatement(
                    sql: """
                        SELECT id FROM base_files b WHERE kind >= 2
                          AND NOT EXISTS (SELECT 1 FROM local_files l WHERE l.id = b.id)
                        """)
            ).compactMap { try? FileID(bytes: [UInt8]($0)) }
        }
    }

    /// The ids of `side`'s records under `parent`, with their kind (`TreeKind`) and whether a
    /// local record exists for each.
    public func children(
        of parent: FileID, _ side: TreeSide
    ) throws -> [(id: FileID, isDeleted: Bool, hasLocal: Bool)] {
        try with { db in
            try Row.fetchAll(
                db.cachedStatement(
                    sql: """
                        SELECT id, kind, EXISTS (SELECT 1 FROM local_files l WHERE l.id = t.id) AS has_local
                        FROM \(side.table) t WHERE parent = ? AND id != parent
                        """), arguments: [Data(parent.bytes)]
            ).compactMap { row in
                let id: Data = row["id"]
                let kind: Int64 = row["kind"]
                guard let f = try? FileID(bytes: [UInt8](id)) else { return nil }
                return (f, kind & TreeKind.deleted != 0, row["has_local"])
            }
        }
    }

    /// See `Store.pendingCounts`.
    public func pendingCounts() throws -> (created: Int, modified: Int, deleted: Int) {
        try with { db in
            let row = try Row.fetchOne(
                db.cachedStatement(sql: "SELECT created, modified, deleted FROM pending_count"))
            guard let row else { throw StoreError("the store has no pending count (damaged?)") }
            return (row["created"], row["modified"], row["deleted"])
        }
    }

    /// Whether `side` has a record for `id`, without decoding it.
    public func exists(_ id: FileID, _ side: TreeSide) throws -> Bool {
        try with { db in
            try Bool.fetchOne(
                db.cachedStatement(sql: "SELECT 1 FROM \(side.table) WHERE id = ?"), arguments: [Data(id.bytes)])
                ?? false
        }
    }

    /// The current view of one file: the local record if there is one, else base.
    public func current(_ id: FileID) throws -> StoredFile? {
        try file(id, .local) ?? file(id, .base)
    }

    static func decode(_ row: Row) throws -> StoredFile {
        let record: Data = row["record"]
        return StoredFile(
            signed: try SignedMetadata(decoding: [UInt8](record)), version: row["version"],
            contentVersion: row["content_version"], serverDeleted: row["server_deleted"])
    }

    // MARK: The mirror of shared files (format v5)

    private static let sharedColumns = "record, version, content_version, server_deleted"

    /// Another account's file shared with this one: as last pulled and verified (`.pulled`), or
    /// with this account's unpushed change to it laid over (`.current`, format `v7`; the
    /// change keeps the pulled row's versions, 0 for a file this account created).
    public func sharedFile(_ id: FileID, _ layer: MirrorLayer = .current) throws -> StoredFile? {
        try with { db in
            let pulled = try Row.fetchOne(
                db.cachedStatement(sql: "SELECT \(Self.sharedColumns) FROM shared_files WHERE id = ?"),
                arguments: [Data(id.bytes)]
            ).map(Self.decode)
            guard layer == .current,
                let record = try Data.fetchOne(
                    db.cachedStatement(sql: "SELECT record FROM shared_local WHERE id = ?"), arguments: [Data(id.bytes)]
                )
            else { return pulled }
            return StoredFile(
                signed: try SignedMetadata(decoding: [UInt8](record)), version: pulled?.version ?? 0,
                contentVersion: pulled?.contentVersion ?? 0, serverDeleted: false)
        }
    }

    /// This account's unpushed change to a shared file, if any.
    public func sharedLocalFile(_ id: FileID) throws -> SignedMetadata? {
        try with { db in
            try Data.fetchOne(
                db.cachedStatement(sql: "SELECT record FROM shared_local WHERE id = ?"), arguments: [Data(id.bytes)]
            ).map { try SignedMetadata(decoding: [UInt8]($0)) }
        }
    }

    /// Every unpushed change to shared files, by id.
    public func sharedLocalFiles() throws -> [SignedMetadata] {
        try with { db in
            try Data.fetchAll(db.cachedStatement(sql: "SELECT record FROM shared_local ORDER BY id")).map {
                try SignedMetadata(decoding: [UInt8]($0))
            }
        }
    }

    /// How many items wait in the recovery queue.
    public func recoveryQueueCount() throws -> Int {
        try with { db in try Int.fetchOne(db.cachedStatement(sql: "SELECT COUNT(*) FROM recovery_queue")) ?? 0 }
    }

    /// The recovery queue, oldest first: (seq, sealed item).
    public func recoveryQueue() throws -> [(seq: Int64, item: [UInt8])] {
        try with { db in
            try Row.fetchAll(db.cachedStatement(sql: "SELECT seq, item FROM recovery_queue ORDER BY seq")).map {
                (($0["seq"] as Int64), [UInt8]($0["item"] as Data))
            }
        }
    }

    /// Whether any change to shared files waits to be pushed.
    public func hasSharedLocal() throws -> Bool {
        try with { db in
            try Bool.fetchOne(db.cachedStatement(sql: "SELECT EXISTS (SELECT 1 FROM shared_local)")) ?? false
        }
    }

    /// The ids of the mirror's files under `parent`, in any deletion state, as `layer` places them.
    public func sharedChildIDs(of parent: FileID, _ layer: MirrorLayer = .current) throws -> [FileID] {
        try with { db in
            let sql =
                layer == .pulled
                ? "SELECT id FROM shared_files WHERE parent = ?1 AND id != parent"
                : """
                SELECT id FROM shared_local WHERE parent = ?1 AND id != parent
                UNION ALL SELECT id FROM shared_files f WHERE parent = ?1 AND id != parent
                    AND NOT EXISTS (SELECT 1 FROM shared_local l WHERE l.id = f.id)
                """
            return try Data.fetchAll(db.cachedStatement(sql: sql), arguments: [Data(parent.bytes)]).map {
                try FileID(bytes: [UInt8]($0))
            }
        }
    }

    /// The ids of the mirror's files under `parent` whose name has this MAC (a lookup by name).
    public func sharedChildIDs(
        of parent: FileID, nameMAC: [UInt8], _ layer: MirrorLayer = .current
    ) throws -> [FileID] {
        try with { db in
            let sql =
                layer == .pulled
                ? "SELECT id FROM shared_files WHERE parent = ?1 AND name_mac = ?2 AND id != parent"
                : """
                SELECT id FROM shared_local WHERE parent = ?1 AND name_mac = ?2 AND id != parent
                UNION ALL SELECT id FROM shared_files f WHERE parent = ?1 AND name_mac = ?2 AND id != parent
                    AND NOT EXISTS (SELECT 1 FROM shared_local l WHERE l.id = f.id)
                """
            return try Data.fetchAll(db.cachedStatement(sql: sql), arguments: [Data(parent.bytes), Data(nameMAC)])
                .map { try FileID(bytes: [UInt8]($0)) }
        }
    }

    /// Visits every record of the mirror as `.current` shows it; `body` returns false to stop.
    public func visitSharedFiles(_ body: (StoredFile) throws -> Bool) throws {
        try with { db in
            let rows = try Row.fetchCursor(
                db.cachedStatement(
                    sql: """
                        SELECT f.version, f.content_version, f.server_deleted, l.record AS local, f.record
                        FROM shared_files f LEFT JOIN shared_local l ON l.id = f.id
                        """))
            while let row = try rows.next() {
                let local: Data? = row["local"]
                let pulled = try Self.decode(row)
                let f =
                    try local.map {
                        StoredFile(
                            signed: try SignedMetadata(decoding: [UInt8]($0)), version: pulled.version,
                            contentVersion: pulled.contentVersion, serverDeleted: false)
                    } ?? pulled
                if try !body(f) { return }
            }
            // Files this account made in shares, not pushed yet.
            let made = try Data.fetchCursor(
                db.cachedStatement(
                    sql: """
                        SELECT record FROM shared_local l
                        WHERE NOT EXISTS (SELECT 1 FROM shared_files f WHERE f.id = l.id)
                        """))
            while let record = try made.next() {
                let f = StoredFile(
                    signed: try SignedMetadata(decoding: [UInt8](record)), version: 0, contentVersion: 0,
                    serverDeleted: false)
                if try !body(f) { return }
            }
        }
    }

    public func manifest(_ digest: [UInt8]) throws -> [UInt8]? {
        try with { db in
            try Data.fetchOne(
                db.cachedStatement(sql: "SELECT sealed FROM manifests WHERE digest = ?"), arguments: [Data(digest)]
            ).map { [UInt8]($0) }
        }
    }

    public func chunk(_ id: [UInt8]) throws -> [UInt8]? {
        let found = try with { db -> (sealed: Data, place: Int64)? in
            guard
                let row = try Row.fetchOne(
                    db.cachedStatement(sql: "SELECT sealed, place FROM chunks WHERE id = ?"), arguments: [Data(id)])
            else {
                return nil
            }
            return (row["sealed"], row["place"])
        }
        guard let found else { return nil }
        return try files.resolve(id, row: [UInt8](found.sealed), place: found.place)
    }

    /// The sealed length of a stored chunk (from its row, or its pack locator), without reading
    /// a pack; nil if it is not stored.
    public func sealedChunkLength(_ id: [UInt8]) throws -> Int? {
        let found = try with { db -> (length: Int, row: Data, place: Int64)? in
            guard
                let row = try Row.fetchOne(
                    db.cachedStatement(
                        sql: "SELECT length(sealed) AS length, CASE WHEN place = 0 THEN X'' ELSE sealed END AS row, "
                            + "place FROM chunks WHERE id = ?"), arguments: [Data(id)])
            else { return nil }
            return (row["length"], row["row"], row["place"])
        }
        guard let found else { return nil }
        if found.place == 0 { return found.length }
        return Int(try PackLocator(decoding: [UInt8](found.row)).length)
    }

    /// Sealed bytes of every chunk this device holds (rows and packs): what content on demand
    /// bounds by its cache size. A scan of the chunks' rows, run when a cache is trimmed.
    public func heldContentBytes() throws -> Int {
        try with { db in
            var total =
                try Int.fetchOne(db, sql: "SELECT COALESCE(SUM(length(sealed)), 0) FROM chunks WHERE place = 0") ?? 0
            let packed = try Data.fetchCursor(db, sql: "SELECT sealed FROM chunks WHERE place <> 0")
            while let locator = try packed.next() {
                total += Int((try? PackLocator(decoding: [UInt8](locator)))?.length ?? 0)
            }
            return total
        }
    }

    /// Sealed bytes of the content of local records whose content differs from their base's (or
    /// that have no base): what waits to be pushed, each chunk counted once. One query, read
    /// through a cursor, so `coffer status` stays small however much is pending.
    public func pendingContentBytes() throws -> Int {
        try with { db in
            let pending = """
                SELECT mc.chunk_id FROM local_files l JOIN manifest_chunks mc ON mc.digest = l.content_digest
                LEFT JOIN base_files b ON b.id = l.id
                WHERE l.content_digest IS NOT NULL
                    AND (b.content_digest IS NULL OR b.content_digest <> l.content_digest)
                """
            var total =
                try Int.fetchOne(
                    db,
                    sql: "SELECT COALESCE(SUM(length(sealed)), 0) FROM chunks WHERE place = 0 AND id IN (\(pending))")
                ?? 0
            let packed = try Data.fetchCursor(
                db, sql: "SELECT sealed FROM chunks WHERE place <> 0 AND id IN (\(pending))")
            while let locator = try packed.next() {
                total += Int((try? PackLocator(decoding: [UInt8](locator)))?.length ?? 0)
            }
            return total
        }
    }

    /// Documents whose content this device holds and has pushed (no unpushed change of their
    /// own, in its tree or in a share): content the server has, which a cache may drop. With the
    /// digest of that content.
    public func evictableContent() throws -> [(id: FileID, digest: [UInt8])] {
        try with { db in
            let rows = try Row.fetchAll(
                db,
                sql: """
                    SELECT b.id, b.content_digest FROM base_files b JOIN manifests m ON m.digest = b.content_digest
                    WHERE NOT EXISTS (SELECT 1 FROM local_files l WHERE l.id = b.id)
                    UNION ALL
                    SELECT f.id, f.content_digest FROM shared_files f JOIN manifests m ON m.digest = f.content_digest
                    WHERE NOT EXISTS (SELECT 1 FROM shared_local l WHERE l.id = f.id)
                    """)
            return rows.compactMap { row in
                guard let id = try? FileID(bytes: [UInt8](row[0] as Data)) else { return nil }
                return (id, [UInt8](row[1] as Data))
            }
        }
    }

    public func hasChunk(_ id: [UInt8]) throws -> Bool {
        try with { db in
            try Bool.fetchOne(db.cachedStatement(sql: "SELECT 1 FROM chunks WHERE id = ?"), arguments: [Data(id)])
                ?? false
        }
    }

    /// Whether `id` was deleted and pruned on this device (`StoreWriter.addTombstone`).
    public func isTombstoned(_ id: FileID) throws -> Bool {
        try with { db in
            try Bool.fetchOne(
                db.cachedStatement(sql: "SELECT 1 FROM tombstones WHERE id = ?"), arguments: [Data(id.bytes)]) ?? false
        }
    }

    public func setting(_ key: String) throws -> [UInt8]? {
        try with { db in
            try Data.fetchOne(db.cachedStatement(sql: "SELECT value FROM settings WHERE key = ?"), arguments: [key]).map
            { [UInt8]($0) }
        }
    }

    /// Every setting whose key starts with `prefix`, in key order.
    public func settings(withPrefix prefix: String) throws -> [(key: String, value: [UInt8])] {
        try with { db in
            // The range [prefix, prefix + U+10FFFF) holds exactly the keys with that prefix.
            try Row.fetchAll(
                db.cachedStatement(sql: "SELECT key, value FROM settings WHERE key >= ? AND key < ? ORDER BY key"),
                arguments: [prefix, prefix + "\u{10FFFF}"]
            ).map { row in (row["key"], [UInt8](row["value"] as Data)) }
        }
    }

    /// The files whose inode number is not their hash (`inode_exceptions`, format `v6`). A
    /// damaged row is left out: its file goes back to its hash, the worst that can follow.
    public func inodeExceptions() throws -> [(id: FileID, inode: UInt64)] {
        try with { db in
            try Row.fetchAll(db.cachedStatement(sql: "SELECT file_id, ino FROM inode_exceptions")).compactMap { row in
                guard let id = row["file_id"] as Data?, let ino = row["ino"] as Int64?,
                    let f = try? FileID(bytes: [UInt8](id)), let n = UInt64(exactly: ino)
                else { return nil }
                return (f, n)
            }
        }
    }

    /// Ids changed by any writer after `seq`, and the newest sequence number.
    public func changes(after seq: Int64) throws -> (ids: Set<FileID>, last: Int64) {
        let rows = try with { db in
            try Row.fetchAll(
                db.cachedStatement(sql: "SELECT seq, file_id FROM change_log WHERE seq > ? ORDER BY seq"),
                arguments: [seq])
        }
        var ids: Set<FileID> = []
        var last = seq
        for r in rows {
            let d: Data = r["file_id"]
            if let id = try? FileID(bytes: [UInt8](d)) { ids.insert(id) }
            last = r["seq"]
        }
        return (ids, last)
    }

    public func lastChange() throws -> Int64 {
        try with { db in
            try Int64.fetchOne(db.cachedStatement(sql: "SELECT COALESCE(MAX(seq), 0) FROM change_log")) ?? 0
        }
    }

    /// Whether this device holds changes not yet pushed: any record in the local tree.
    public func hasLocalChanges() throws -> Bool {
        try with { db in
            try Bool.fetchOne(db.cachedStatement(sql: "SELECT EXISTS (SELECT 1 FROM local_files)")) ?? false
        }
    }

    /// Whether the store holds any record at all, in either tree (an account lives here).
    public func hasFiles() throws -> Bool {
        try with { db in
            try Bool.fetchOne(
                db.cachedStatement(
                    sql: "SELECT EXISTS (SELECT 1 FROM local_files) OR EXISTS (SELECT 1 FROM base_files)")) ?? false
        }
    }

    /// A count by a query of this module's own (and tests'): outside it SQL stays unspoken.
    func count(_ sql: String) throws -> Int { try with { db in try Int.fetchOne(db, sql: sql) ?? 0 } }

    /// Chunk ids listed by a manifest row (for integrity checks).
    public func chunkIDs(ofManifest digest: [UInt8]) throws -> [[UInt8]] {
        try with { db in
            try Data.fetchAll(
                db.cachedStatement(sql: "SELECT chunk_id FROM manifest_chunks WHERE digest = ?"),
                arguments: [Data(digest)]
            ).map { [UInt8]($0) }
        }
    }

    public func allChunkIDs() throws -> [[UInt8]] {
        try with { db in try Data.fetchAll(db.cachedStatement(sql: "SELECT id FROM chunks")).map { [UInt8]($0) } }
    }

    public func allManifestDigests() throws -> [[UInt8]] {
        try with { db in try Data.fetchAll(db.cachedStatement(sql: "SELECT digest FROM manifests")).map { [UInt8]($0) }
        }
    }
}
