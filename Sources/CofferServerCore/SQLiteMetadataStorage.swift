import CofferModel
import Foundation
import GRDB

/// The embedded metadata store: one SQLite database (GRDB `DatabasePool`, WAL), shareable by
/// several server processes on one machine (write transactions are IMMEDIATE and wait up to
/// `busyTimeout` for each other). `synchronous = FULL`: every commit is fsynced before it
/// returns, so a batch the server acknowledged survives a power loss (with `NORMAL`, WAL commits
/// since the last checkpoint may vanish; docs/PROTOCOL.md, "Durability").
public final class SQLiteMetadataStorage: MetadataStorage {
    let pool: DatabasePool

    public init(path: String, busyTimeout: TimeInterval = 10) throws {
        pool = try PrivateFiles.openPool(
            path: path, busyTimeout: busyTimeout, synchronous: .full, migrator: Self.migrator)
    }

    /// `Username.key` of a username; a name outside the rule (none is stored) keys as itself.
    static func usernameKey(_ name: String) -> String { Username.key(name) ?? name }

    /// The database's format: one migration per format version (see `PrivateFiles.openPool`).
    static var migrator: DatabaseMigrator {
        var m = DatabaseMigrator()
        m.registerMigration("v1") { db in
            // username_key: usernames are unique by `Username.key` (case and normalisation
            // insensitive). Nonces have their own database (`SQLiteNonceStore`).
            try db.execute(
                sql: """
                    CREATE TABLE account (
                        key BLOB PRIMARY KEY NOT NULL,
                        username TEXT NOT NULL UNIQUE,
                        username_key TEXT NOT NULL,
                        box_key BLOB NOT NULL,
                        version INTEGER NOT NULL DEFAULT 0,
                        bytes_used INTEGER NOT NULL DEFAULT 0
                    ) WITHOUT ROWID;
                    CREATE UNIQUE INDEX account_by_username_key ON account (username_key);
                    CREATE TABLE counter (name TEXT PRIMARY KEY NOT NULL, value INTEGER NOT NULL) WITHOUT ROWID;
                    INSERT INTO counter (name, value) VALUES ('version', 0);
                    CREATE TABLE file (
                        id BLOB PRIMARY KEY NOT NULL,
                        account BLOB NOT NULL,
                        record BLOB NOT NULL,
                        version INTEGER NOT NULL,
                        content_version INTEGER NOT NULL,
                        server_deleted INTEGER NOT NULL,
                        deleted INTEGER NOT NULL,
                        digest BLOB
                    ) WITHOUT ROWID;
                    CREATE INDEX file_by_version ON file (account, version, id);
                    CREATE TABLE manifest (
                        account BLOB NOT NULL,
                        file_id BLOB NOT NULL,
                        digest BLOB NOT NULL,
                        sealed BLOB NOT NULL,
                        created_at INTEGER NOT NULL,
                        PRIMARY KEY (account, file_id, digest)
                    ) WITHOUT ROWID;
                    CREATE TABLE manifest_chunk (
                        account BLOB NOT NULL,
                        file_id BLOB NOT NULL,
                        digest BLOB NOT NULL,
                        chunk_id BLOB NOT NULL,
                        PRIMARY KEY (account, file_id, digest, chunk_id)
                    ) WITHOUT ROWID;
                    CREATE INDEX manifest_chunk_by_chunk ON manifest_chunk (account, chunk_id);
                    CREATE TABLE chunk (
                        account BLOB NOT NULL,
                        id BLOB NOT NULL,
                        size INTEGER NOT NULL,
                        created_at INTEGER NOT NULL,
                        PRIMARY KEY (account, id)
                    ) WITHOUT ROWID;
                    CREATE TABLE invite (hash BLOB PRIMARY KEY NOT NULL, created_at INTEGER NOT NULL) WITHOUT ROWID;
                    """)
        }
        m.registerMigration("v2") { db in
            // The tree as an index, so an upsert reads only the records it touches instead of
            // the whole account: each file's parent (NULL for the root, so the root is one
            // lookup and nobody's child) and name MAC beside its record, and an index on
            // (account, parent, deleted, name_mac) that answers a folder's children, its live
            // children, and its live children of one name. `live_files` keeps the count
            // `GET /v1/usage` answers, which was a count over the account's records.
            try db.execute(
                sql: """
                    ALTER TABLE file ADD COLUMN parent BLOB;
                    ALTER TABLE file ADD COLUMN name_mac BLOB NOT NULL DEFAULT X'';
                    ALTER TABLE account ADD COLUMN live_files INTEGER NOT NULL DEFAULT 0;
                    """)
            try SQLiteMetadataStorage.backfillPlacement(db)
            try db.execute(
                sql: """
                    CREATE INDEX file_by_parent ON file (account, parent, deleted, name_mac);
                    UPDATE account SET live_files =
                        (SELECT COUNT(*) FROM file WHERE file.account = account.key AND file.deleted = 0);
                    """)
        }
        m.registerMigration("v3") { db in
            // Sharing (docs/SHARING.md): a link's target beside its record, indexed for the
            // one-live-link-per-target rule; and each grantee's feed, one row per file of
            // another account's tree the grantee was told about, at the version it last
            // changed in the grantee's view, walked by pulls as `file_by_version` is. Before
            // this version the server refused links and stored no grant to another account,
            // so there is nothing to fill in.
            try db.execute(
                sql: """
                    ALTER TABLE file ADD COLUMN link_target BLOB;
                    CREATE INDEX file_by_link ON file (account, link_target, deleted) WHERE link_target IS NOT NULL;
                    CREATE TABLE feed (
                        account BLOB NOT NULL,
                        file_id BLOB NOT NULL,
                        version INTEGER NOT NULL,
                        PRIMARY KEY (account, file_id)
                    ) WITHOUT ROWID;
                    CREATE INDEX feed_by_version ON feed (account, version, file_id);
                    """)
        }
        m.registerMigration("v4") { db in
            // Key cards (docs/SHARING.md): each account's signature over its username and keys,
            // served with them; NULL until the account publishes one.
            try db.execute(sql: "ALTER TABLE account ADD COLUMN card BLOB")
        }
        m.registerMigration("v5") { db in
            // Who wrote a record when it is not the tree's owner, indexed: an upsert that ends a
            // grantee's write (a revocation, a mode lowered, a folder moved away) finds the
            // records that grantee left in the tree without reading the tree (docs/SHARING.md).
            // And, per feed row, the version at which the account was last granted the file
            // again (a share revoked or given up, then granted anew), so a device that slept
            // through the gap drops what it holds below before taking the file's subtree again.
            try db.execute(
                sql: """
                    ALTER TABLE file ADD COLUMN writer BLOB;
                    CREATE INDEX file_by_writer ON file (account, writer) WHERE writer IS NOT NULL;
                    ALTER TABLE feed ADD COLUMN regranted_at INTEGER;
                    ALTER TABLE account ADD COLUMN contact_book BLOB;
                    ALTER TABLE account ADD COLUMN contact_book_revision INTEGER NOT NULL DEFAULT 0;
                    CREATE TABLE write_pause (
                        account BLOB NOT NULL,
                        writer BLOB NOT NULL,
                        until INTEGER NOT NULL,
                        PRIMARY KEY (account, writer)
                    ) WITHOUT ROWID;
                    """)
            try SQLiteMetadataStorage.backfillWriters(db)
        }
        m.registerMigration("v6") { db in
            // Small chunks kept inline (docs/SERVER.md, "Content"): a bundle of many small files
            // is one transaction, not a file and an fsync per chunk. NULL: in the content store.
            try db.execute(sql: "ALTER TABLE chunk ADD COLUMN data BLOB")
        }
        return m
    }

    /// Fills `parent` and `name_mac` of every stored file from its record, a page of rows at a
    /// time so the migration holds one page, not the table. A record that does not decode
    /// (storage damage; the audit reports it) gets an empty parent, which no file has: it is
    /// then nobody's child and not a root, and reading it still fails as it did before.
    static func backfillPlacement(_ db: Database) throws {
        let update = try db.makeStatement(
            sql: "UPDATE file SET parent = ?, name_mac = COALESCE(?, X'') WHERE id = ?")
        let damaged = try db.makeStatement(sql: "UPDATE file SET parent = X'', name_mac = X'' WHERE id = ?")
        var after: Data?
        while true {
            let rows =
                if let after {
                    try Row.fetchAll(
                        db, sql: "SELECT id, record FROM file WHERE id > ? ORDER BY id LIMIT 1000", arguments: [after])
                } else {
                    try Row.fetchAll(db, sql: "SELECT id, record FROM file ORDER BY id LIMIT 1000")
                }
            guard let last = rows.last else { return }
            for row in rows {
                let id: Data = row["id"]
                let record: Data = row["record"]
                if let signed = try? SignedMetadata(decoding: Array(record)) {
                    let placement = StoredFile.placement(of: signed.metadata)
                    try update.execute(arguments: [placement.parent, placement.nameMAC, id])
                } else {
                    try damaged.execute(arguments: [id])
                }
            }
            after = last["id"]
        }
    }

    /// Fills `writer` of every stored file another account wrote, from its record, a page of
    /// rows at a time. A record that does not decode keeps none (the audit reports it).
    static func backfillWriters(_ db: Database) throws {
        let update = try db.makeStatement(sql: "UPDATE file SET writer = ? WHERE id = ?")
        var after = Data()
        while true {
            let rows = try Row.fetchAll(
                db, sql: "SELECT id, record FROM file WHERE id > ? ORDER BY id LIMIT 1000", arguments: [after])
            guard let last = rows.last else { return }
            for row in rows {
                let record: Data = row["record"]
                if let m = try? SignedMetadata(decoding: Array(record)).metadata, let writer = StoredFile.writer(of: m)
                {
                    let id: Data = row["id"]
                    try update.execute(arguments: [writer, id])
                }
            }
            after = last["id"]
        }
    }

    /// A setting as the reader and the writer connections have it (for the durability checks).
    func pragma(_ name: String) throws -> (reader: String?, writer: String?) {
        (
            try pool.read { try String.fetchOne($0, sql: "PRAGMA \(name)") },
            try pool.write { try String.fetchOne($0, sql: "PRAGMA \(name)") }
        )
    }

    /// Usage by `QuotaRule`, counted from the tables for the account named by `account` (an SQL
    /// expression).
    static func usageSQL(_ account: String) -> String {
        """
        COALESCE((SELECT SUM(MAX(length(record), \(QuotaRule.minimumRowBytes)))
                  FROM file WHERE file.account = \(account)), 0)
          + COALESCE((SELECT SUM(MAX(length(sealed), \(QuotaRule.minimumRowBytes)))
                      FROM manifest WHERE manifest.account = \(account)), 0)
          + COALESCE((SELECT SUM(MAX(size, \(QuotaRule.minimumChunkBytes)))
                      FROM chunk WHERE chunk.account = \(account)), 0)
        """
    }

    public func read<T>(_ body: (any MetadataReader) throws -> T) throws -> T {
        try pool.read { db in try body(SQLiteTransaction(db: db)) }
    }

    public func write<T>(_ body: (any MetadataWriter) throws -> T) throws -> T {
        try pool.writeWithoutTransaction { db in
            var result: T?
            try db.inTransaction(.immediate) {
                result = try body(SQLiteTransaction(db: db))
                return .commit
            }
            guard let result else { throw StorageError("transaction produced no result") }
            return result
        }
    }
}

struct SQLiteTransaction: MetadataWriter {
    let db: Database

    // Columns are named, never `SELECT *`: a connection opened before a migration expands `*`
    // to the old columns and, when SQLite re-prepares the statement for the new schema, GRDB
    // still names the old ones, so a row would lack a column a migration added. A named column
    // missing from a stale schema makes SQLite reload the schema and prepare again instead.
    static let fileColumns =
        "id, account, record, version, content_version, server_deleted, deleted, digest, parent, name_mac, "
        + "link_target, writer"
    static let accountColumns = "key, username, box_key, version, bytes_used, live_files, card"

    private func accountRow(_ row: Row?) -> AccountRecord? {
        guard let row else { return nil }
        return AccountRecord(
            key: row["key"], username: row["username"], boxKey: row["box_key"],
            version: row["version"], bytesUsed: row["bytes_used"], liveFiles: row["live_files"], card: row["card"])
    }

    private func fileRow(_ row: Row) -> StoredFile {
        // An empty blob may come back as NULL; the name MAC column is never NULL as stored.
        let nameMAC: Data? = row["name_mac"]
        return StoredFile(
            id: row["id"], account: row["account"], record: row["record"], version: row["version"],
            contentVersion: row["content_version"], serverDeleted: row["server_deleted"],
            deleted: row["deleted"], digest: row["digest"], parent: row["parent"], nameMAC: nameMAC ?? Data(),
            linkTarget: row["link_target"], writer: row["writer"])
    }

    func accountKeys() throws -> [Data] {
        try Data.fetchAll(db, sql: "SELECT key FROM account ORDER BY key")
    }

    func account(key: Data) throws -> AccountRecord? {
        accountRow(
            try Row.fetchOne(db, sql: "SELECT \(Self.accountColumns) FROM account WHERE key = ?", arguments: [key]))
    }

    func account(username: String) throws -> AccountRecord? {
        accountRow(
            try Row.fetchOne(
                db, sql: "SELECT \(Self.accountColumns) FROM account WHERE username_key = ?",
                arguments: [SQLiteMetadataStorage.usernameKey(username)]))
    }

    func visitFiles(account: Data, since: Int64, afterID: Data?, _ body: (StoredFile) throws -> Bool) throws {
        // Both forms walk the index file_by_version (account, version, id) in order.
        let rows: RowCursor
        if let afterID {
            rows = try Row.fetchCursor(
                db,
                sql: "SELECT \(Self.fileColumns) FROM file WHERE account = ? AND (version, id) > (?, ?) "
                    + "ORDER BY version, id",
                arguments: [account, since, afterID])
        } else {
            rows = try Row.fetchCursor(
                db, sql: "SELECT \(Self.fileColumns) FROM file WHERE account = ? AND version > ? ORDER BY version, id",
                arguments: [account, since])
        }
        while let row = try rows.next() {
            if try !body(fileRow(row)) { return }
        }
    }

    func file(id: Data) throws -> StoredFile? {
        try Row.fetchOne(db, sql: "SELECT \(Self.fileColumns) FROM file WHERE id = ?", arguments: [id]).map(fileRow)
    }

    func rootID(account: Data) throws -> Data? {
        try Data.fetchOne(
            db, sql: "SELECT id FROM file WHERE account = ? AND parent IS NULL LIMIT 1", arguments: [account])
    }

    func children(account: Data, parent: Data, liveOnly: Bool) throws -> [StoredChild] {
        // Both forms read the index file_by_parent alone (id is in every index of the table).
        let statement = try db.cachedStatement(
            sql: liveOnly
                ? "SELECT id, deleted, name_mac FROM file WHERE account = ? AND parent = ? AND deleted = 0"
                : "SELECT id, deleted, name_mac FROM file WHERE account = ? AND parent = ?")
        var out: [StoredChild] = []
        let rows = try Row.fetchCursor(statement, arguments: [account, parent])
        while let row = try rows.next() {
            let mac: Data? = row["name_mac"]
            out.append(StoredChild(id: row["id"], deleted: row["deleted"], nameMAC: mac ?? Data()))
        }
        return out
    }

    func liveChildIDs(account: Data, parent: Data, nameMAC: Data) throws -> [Data] {
        try Data.fetchAll(
            db.cachedStatement(
                // An empty MAC may be bound as NULL: compared as the empty blob the column holds.
                sql: "SELECT id FROM file WHERE account = ? AND parent = ? AND deleted = 0 "
                    + "AND name_mac = COALESCE(?, X'')"
            ), arguments: [account, parent, nameMAC])
    }

    func liveLinks(account: Data, target: Data) throws -> [Data] {
        try Data.fetchAll(
            db.cachedStatement(sql: "SELECT id FROM file WHERE account = ? AND link_target = ? AND deleted = 0"),
            arguments: [account, target])
    }

    func writtenByOthers(account: Data) throws -> [(id: Data, writer: Data)] {
        try Row.fetchAll(
            db.cachedStatement(sql: "SELECT id, writer FROM file WHERE account = ? AND writer IS NOT NULL"),
            arguments: [account]
        ).map { ($0["id"], $0["writer"]) }
    }

    func contactBook(account: Data) throws -> (sealed: Data?, revision: Int64) {
        guard
            let row = try Row.fetchOne(
                db.cachedStatement(sql: "SELECT contact_book, contact_book_revision FROM account WHERE key = ?"),
                arguments: [account])
        else { return (nil, 0) }
        return (row["contact_book"], row["contact_book_revision"])
    }

    func setContactBook(account: Data, sealed: Data, revision: Int64) throws {
        try db.execute(
            sql: "UPDATE account SET contact_book = ?, contact_book_revision = ? WHERE key = ?",
            arguments: [sealed, revision, account])
    }

    func feedLatest(account: Data) throws -> Int64 {
        // The last entry of feed_by_version for the account.
        try Int64.fetchOne(
            db.cachedStatement(sql: "SELECT MAX(version) FROM feed WHERE account = ?"), arguments: [account]) ?? 0
    }

    func hasFeedRow(account: Data, fileID: Data) throws -> Bool {
        try Bool.fetchOne(
            db.cachedStatement(sql: "SELECT 1 FROM feed WHERE account = ? AND file_id = ?"),
            arguments: [account, fileID]) ?? false
    }

    func writePause(account: Data, writer: Data) throws -> Int64? {
        try Int64.fetchOne(
            db.cachedStatement(sql: "SELECT until FROM write_pause WHERE account = ? AND writer = ?"),
            arguments: [account, writer])
    }

    func visitFeed(
        account: Data, since: Int64, afterID: Data?, _ body: (Data, Int64, Int64?) throws -> Bool
    ) throws {
        // Both forms walk the index feed_by_version (account, version, file_id) in order.
        let rows: RowCursor
        if let afterID {
            rows = try Row.fetchCursor(
                db,
                sql:
                    "SELECT file_id, version, regranted_at FROM feed WHERE account = ? AND (version, file_id) > (?, ?) "
                    + "ORDER BY version, file_id",
                arguments: [account, since, afterID])
        } else {
            rows = try Row.fetchCursor(
                db,
                sql: "SELECT file_id, version, regranted_at FROM feed WHERE account = ? AND version > ? "
                    + "ORDER BY version, file_id",
                arguments: [account, since])
        }
        while let row = try rows.next() {
            if try !body(row["file_id"], row["version"], row["regranted_at"]) { return }
        }
    }

    func fileCount(account: Data, liveOnly: Bool) throws -> Int64 {
        let sql =
            liveOnly
            ? "SELECT COUNT(*) FROM file WHERE account = ? AND deleted = 0"
            : "SELECT COUNT(*) FROM file WHERE account = ?"
        return try Int64.fetchOne(db, sql: sql, arguments: [account]) ?? 0
    }

    func manifest(_ key: ManifestKey) throws -> Data? {
        try Data.fetchOne(
            db, sql: "SELECT sealed FROM manifest WHERE account = ? AND file_id = ? AND digest = ?",
            arguments: [key.account, key.fileID, key.digest])
    }

    func hasManifest(_ key: ManifestKey) throws -> Bool {
        try Bool.fetchOne(
            db, sql: "SELECT EXISTS (SELECT 1 FROM manifest WHERE account = ? AND file_id = ? AND digest = ?)",
            arguments: [key.account, key.fileID, key.digest]) ?? false
    }

    func presentChunks(account: Data, ids: [Data]) throws -> Set<Data> {
        var out: Set<Data> = []
        let statement = try db.cachedStatement(sql: "SELECT EXISTS (SELECT 1 FROM chunk WHERE account = ? AND id = ?)")
        for id in ids where try Bool.fetchOne(statement, arguments: [account, id]) == true { out.insert(id) }
        return out
    }

    func recountedUsage(account: Data) throws -> Int64 {
        try Int64.fetchOne(db, sql: "SELECT " + SQLiteMetadataStorage.usageSQL("?1"), arguments: [account]) ?? 0
    }

    func unreferencedManifests(createdBefore before: Int64) throws -> [ManifestKey] {
        try Row.fetchAll(
            db,
            sql: """
                SELECT m.account, m.file_id, m.digest FROM manifest m
                WHERE m.created_at < ? AND NOT EXISTS (
                    SELECT 1 FROM file f
                    WHERE f.id = m.file_id AND f.account = m.account AND f.deleted = 0 AND f.digest = m.digest)
                """, arguments: [before]
        ).map { ManifestKey(account: $0["account"], fileID: $0["file_id"], digest: $0["digest"]) }
    }

    func unreferencedChunks(createdBefore before: Int64) throws -> [ChunkKey] {
        try Row.fetchAll(
            db,
            sql: """
                SELECT c.account, c.id FROM chunk c
                WHERE c.created_at < ? AND NOT EXISTS (
                    SELECT 1 FROM manifest_chunk mc WHERE mc.account = c.account AND mc.chunk_id = c.id)
                """, arguments: [before]
        ).map { ChunkKey(account: $0["account"], id: $0["id"]) }
    }

    func inlineChunk(_ key: ChunkKey) throws -> Data? {
        try Data.fetchOne(
            db.cachedStatement(sql: "SELECT data FROM chunk WHERE account = ? AND id = ?"),
            arguments: [key.account, key.id])
    }

    func chunkPlacement(account: Data, ids: [Data]) throws -> [Data: (size: Int64, inline: Bool)] {
        var out: [Data: (size: Int64, inline: Bool)] = [:]
        let statement = try db.cachedStatement(
            sql: "SELECT size, data IS NOT NULL AS inline FROM chunk WHERE account = ? AND id = ?")
        for id in ids {
            if let row = try Row.fetchOne(statement, arguments: [account, id]) {
                out[id] = (row["size"], row["inline"])
            }
        }
        return out
    }

    func allChunkKeys() throws -> Set<ChunkKey> {
        var out: Set<ChunkKey> = []
        let rows = try Row.fetchCursor(db, sql: "SELECT account, id FROM chunk WHERE data IS NULL")
        while let row = try rows.next() { out.insert(ChunkKey(account: row["account"], id: row["id"])) }
        return out
    }

    func insertAccount(_ a: AccountRecord) throws -> Bool {
        let usernameKey = SQLiteMetadataStorage.usernameKey(a.username)
        let exists =
            try Bool.fetchOne(
                db, sql: "SELECT EXISTS (SELECT 1 FROM account WHERE key = ? OR username_key = ?)",
                arguments: [a.key, usernameKey]) ?? false
        if exists { return false }
        try db.execute(
            sql:
                "INSERT INTO account (key, username, username_key, box_key, version, bytes_used, card) "
                + "VALUES (?, ?, ?, ?, ?, ?, ?)",
            arguments: [a.key, a.username, usernameKey, a.boxKey, a.version, a.bytesUsed, a.card])
        return true
    }

    func lockAccount(key: Data) throws -> AccountRecord? { try account(key: key) }

    func setCard(key: Data, card: Data) throws {
        try db.execute(sql: "UPDATE account SET card = ? WHERE key = ?", arguments: [card, key])
    }

    func setAccountVersion(key: Data, version: Int64) throws {
        try db.execute(sql: "UPDATE account SET version = ? WHERE key = ?", arguments: [version, key])
    }

    func nextVersion() throws -> Int64 {
        try db.execute(sql: "UPDATE counter SET value = value + 1 WHERE name = 'version'")
        guard let v = try Int64.fetchOne(db, sql: "SELECT value FROM counter WHERE name = 'version'") else {
            throw StorageError("version counter missing")
        }
        return v
    }

    func putFile(_ f: StoredFile) throws {
        let old = try Row.fetchOne(
            db.cachedStatement(sql: "SELECT account, length(record) AS n, deleted FROM file WHERE id = ?"),
            arguments: [f.id])
        // COALESCE: an empty name MAC may be bound as NULL; stored and looked up as an empty blob.
        try db.cachedStatement(
            sql: """
                INSERT INTO file (id, account, record, version, content_version, server_deleted, deleted, digest,
                    parent, name_mac, link_target, writer)
                VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, COALESCE(?, X''), ?, ?)
                ON CONFLICT (id) DO UPDATE SET account = excluded.account, record = excluded.record,
                    version = excluded.version, content_version = excluded.content_version,
                    server_deleted = excluded.server_deleted, deleted = excluded.deleted, digest = excluded.digest,
                    parent = excluded.parent, name_mac = excluded.name_mac, link_target = excluded.link_target,
                    writer = excluded.writer
                """
        ).execute(arguments: [
            f.id, f.account, f.record, f.version, f.contentVersion, f.serverDeleted, f.deleted, f.digest,
            f.parent, f.nameMAC, f.linkTarget, f.writer,
        ])
        if let old {
            let account: Data = old["account"]
            try addUsage(account: account, bytes: -QuotaRule.counted(row: old["n"]))
            if !old["deleted"] { try addLiveFiles(account: account, -1) }
        }
        try addUsage(account: f.account, bytes: QuotaRule.counted(row: Int64(f.record.count)))
        if !f.deleted { try addLiveFiles(account: f.account, 1) }
    }

    func pauseWrites(account: Data, writer: Data, until: Int64) throws {
        try db.cachedStatement(
            sql: "INSERT INTO write_pause (account, writer, until) VALUES (?, ?, ?) "
                + "ON CONFLICT (account, writer) DO UPDATE SET until = excluded.until"
        ).execute(arguments: [account, writer, until])
    }

    func resumeWrites(account: Data, writer: Data) throws {
        try db.cachedStatement(sql: "DELETE FROM write_pause WHERE account = ? AND writer = ?").execute(
            arguments: [account, writer])
    }

    func putFeed(account: Data, fileID: Data, version: Int64, regranted: Bool) throws {
        try db.cachedStatement(
            sql: "INSERT INTO feed (account, file_id, version, regranted_at) VALUES (?, ?, ?, ?) "
                + "ON CONFLICT (account, file_id) DO UPDATE SET version = excluded.version, "
                + "regranted_at = COALESCE(excluded.regranted_at, regranted_at)"
        ).execute(arguments: [account, fileID, version, regranted ? version : nil])
    }

    func markServerDeleted(id: Data, account: Data, version: Int64) throws -> Data? {
        guard
            let old = try Row.fetchOne(
                db, sql: "SELECT deleted, digest FROM file WHERE id = ? AND account = ?", arguments: [id, account])
        else { return nil }
        try db.execute(
            sql: "UPDATE file SET version = ?, server_deleted = 1, deleted = 1 WHERE id = ?", arguments: [version, id])
        if !old["deleted"] { try addLiveFiles(account: account, -1) }
        return old["digest"]
    }

    private func addLiveFiles(account: Data, _ delta: Int64) throws {
        try db.cachedStatement(sql: "UPDATE account SET live_files = MAX(0, live_files + ?) WHERE key = ?")
            .execute(arguments: [delta, account])
    }

    func putManifest(_ key: ManifestKey, sealed: Data, chunkIDs: [Data], createdAt: Int64) throws -> Bool {
        try db.cachedStatement(
            sql: "INSERT OR IGNORE INTO manifest (account, file_id, digest, sealed, created_at) VALUES (?, ?, ?, ?, ?)"
        ).execute(arguments: [key.account, key.fileID, key.digest, sealed, createdAt])
        guard db.changesCount == 1 else { return false }
        try addUsage(account: key.account, bytes: QuotaRule.counted(row: Int64(sealed.count)))
        let statement = try db.cachedStatement(
            sql: "INSERT OR IGNORE INTO manifest_chunk (account, file_id, digest, chunk_id) VALUES (?, ?, ?, ?)")
        for c in chunkIDs { try statement.execute(arguments: [key.account, key.fileID, key.digest, c]) }
        return true
    }

    func deleteManifest(_ key: ManifestKey) throws -> [Data] {
        guard
            let size = try Int64.fetchOne(
                db, sql: "SELECT length(sealed) FROM manifest WHERE account = ? AND file_id = ? AND digest = ?",
                arguments: [key.account, key.fileID, key.digest])
        else { return [] }
        try db.execute(
            sql: "DELETE FROM manifest WHERE account = ? AND file_id = ? AND digest = ?",
            arguments: [key.account, key.fileID, key.digest])
        try addUsage(account: key.account, bytes: -QuotaRule.counted(row: size))
        let chunks = try Data.fetchAll(
            db, sql: "SELECT chunk_id FROM manifest_chunk WHERE account = ? AND file_id = ? AND digest = ?",
            arguments: [key.account, key.fileID, key.digest])
        try db.execute(
            sql: "DELETE FROM manifest_chunk WHERE account = ? AND file_id = ? AND digest = ?",
            arguments: [key.account, key.fileID, key.digest])
        return chunks
    }

    func insertChunk(_ key: ChunkKey, size: Int64, createdAt: Int64, inline: Data?) throws -> Bool {
        try db.cachedStatement(
            sql: "INSERT OR IGNORE INTO chunk (account, id, size, created_at, data) VALUES (?, ?, ?, ?, ?)"
        ).execute(arguments: [key.account, key.id, size, createdAt, inline])
        guard db.changesCount == 1 else { return false }
        try addUsage(account: key.account, bytes: QuotaRule.counted(chunk: size))
        return true
    }

    func deleteChunkIfUnreferenced(_ key: ChunkKey) throws -> Bool {
        let referenced =
            try Bool.fetchOne(
                db, sql: "SELECT EXISTS (SELECT 1 FROM manifest_chunk WHERE account = ? AND chunk_id = ?)",
                arguments: [key.account, key.id]) ?? true
        if referenced { return false }
        guard
            let size = try Int64.fetchOne(
                db, sql: "SELECT size FROM chunk WHERE account = ? AND id = ?", arguments: [key.account, key.id])
        else {
            return false
        }
        try db.execute(sql: "DELETE FROM chunk WHERE account = ? AND id = ?", arguments: [key.account, key.id])
        try addUsage(account: key.account, bytes: -QuotaRule.counted(chunk: size))
        return true
    }

    func addUsage(account: Data, bytes: Int64) throws {
        try db.cachedStatement(sql: "UPDATE account SET bytes_used = MAX(0, bytes_used + ?) WHERE key = ?")
            .execute(arguments: [bytes, account])
    }

    func insertInvite(hash: Data, createdAt: Int64) throws {
        try db.execute(sql: "INSERT INTO invite (hash, created_at) VALUES (?, ?)", arguments: [hash, createdAt])
    }

    func consumeInvite(hash: Data) throws -> Bool {
        try db.execute(sql: "DELETE FROM invite WHERE hash = ?", arguments: [hash])
        return db.changesCount == 1
    }
}
