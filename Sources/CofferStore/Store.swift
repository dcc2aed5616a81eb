import CofferModel
import Foundation
import GRDB
import Synchronization

/// Which copy of the tree a record belongs to: `base` is what the device and server last agreed
/// on; `local` holds only records changed on this device since (copy-on-write over base).
public enum TreeSide: Int, Sendable {
    case base = 0
    case local = 1
    var table: String { self == .base ? "base_files" : "local_files" }
}

/// How the mirror of shared files is read: as the server last sent it, or with this account's
/// unpushed changes laid over (format `v7`).
public enum MirrorLayer: Sendable {
    case pulled
    case current
}

/// A metadata record as kept on the device.
public struct StoredFile: Sendable, Equatable {
    public var signed: SignedMetadata
    /// Server-assigned versions; 0 until the server has seen the record.
    public var version: Int64
    public var contentVersion: Int64
    /// The server made this file's implicit deletion (a deleted ancestor) explicit. Kept beside
    /// the signed record, which the server cannot re-sign.
    public var serverDeleted: Bool
    public init(signed: SignedMetadata, version: Int64 = 0, contentVersion: Int64 = 0, serverDeleted: Bool = false) {
        self.signed = signed
        self.version = version
        self.contentVersion = contentVersion
        self.serverDeleted = serverDeleted
    }
    public var metadata: FileMetadata { signed.metadata }
    /// The metadata as the tree should see it: deleted if either the writer or the server said so.
    public var effectiveMetadata: FileMetadata {
        var m = signed.metadata
        if serverDeleted { m.isDeleted = true }
        return m
    }
}

/// What the `kind` column of a tree row says: bit 0 a folder, bit 1 deleted (by its writer or,
/// `serverDeleted`, by the server). A live folder is 1: what a folder's link count counts.
enum TreeKind {
    static let folder: Int64 = 1
    static let deleted: Int64 = 2

    static func of(_ m: FileMetadata, _ serverDeleted: Bool) -> Int64 {
        (m.type == .folder ? folder : 0) | (m.isDeleted || serverDeleted ? deleted : 0)
    }
}

public struct StoreError: Error, CustomStringConvertible {
    public let message: String
    public init(_ message: String) { self.message = message }
    public var description: String { message }
}

/// The device's store: one SQLite database (WAL) under the data directory holding both trees,
/// sealed manifests and chunks, settings and a change log. Nothing in it is plaintext.
///
/// Several processes may open it at once (the mount daemon and CLI commands): writes are
/// serialised by SQLite, and each writer appends the ids it touched to `change_log`, which the
/// others read to refresh their in-memory trees.
public final class Store: Sendable {
    /// The size the write-ahead log is cut back to after it restarts (`journal_size_limit`).
    public static let logSizeLimit = 4 << 20

    public let directory: String
    public let databasePath: String
    let pool: DatabasePool
    let group = GroupCommit()
    /// Held by a write in group-commit mode while its body runs, and by whoever commits the
    /// group (always before the connection): a group never closes in the middle of a write.
    let gate = WriteGate()
    let counters = GroupCounters()
    let processLog = ProcessLog()
    let files: ChunkFiles
    let fast: FastReads
    /// Chunks whose prefetch waits on `prefetcher` (see `prefetch`).
    private let prefetchPending = Atomic<Int>(0)
    /// The prefetch's serial queue: its own thread (a queue made this way does not wait for the
    /// global pool's threads, which are busy opening chunks while this one waits for the disk).
    private let prefetcher = DispatchQueue(label: "coffer.pack-prefetch", qos: .utility)

    public init(directory: String) throws {
        self.directory = directory
        try FileManager.default.createDirectory(
            atPath: directory, withIntermediateDirectories: true,
            attributes: [.posixPermissions: 0o700])
        databasePath = directory + "/coffer.sqlite"
        var config = Configuration()
        config.busyMode = .timeout(30)
        // Two readers at most: the hot reads go through `FastReads`, and each reader keeps a page
        // cache of its own (see below) that a large store would fill.
        config.maximumReaderCount = 2
        // Group commit (see `GroupCommit`) leaves the writer's transaction open between calls.
        config.allowsUnsafeTransactions = true
        config.prepareDatabase { db in
            // Commits are atomic either way; NORMAL skips the fsync per commit, and `makeDurable`
            // syncs explicitly when a caller (fsync, the CLI) needs durability.
            try db.execute(sql: "PRAGMA synchronous = NORMAL")
            // The writer's page cache is 16 MiB (SQLite's default is 2 MiB): a write touches
            // the pages of several indexes, and every miss is a pread (untar of 12,000 files
            // spent 10% more CPU per operation with the default). Readers get 4 MiB: the tree's
            // hot reads go through `FastReads`, and a miss is a pread from the kernel's page
            // cache, while a larger cache per connection would grow the daemon's memory with
            // the tree (a million-file store is several hundred MB; docs/STORE.md).
            try db.execute(sql: "PRAGMA cache_size = \(db.configuration.readonly ? -4096 : -16384)")
            // Savepoints (every write inside a group transaction is one) copy each page they
            // first touch to a statement journal; a few pages each, so memory, not a temp file.
            // (An A/B run on untar showed no difference beyond noise; kept for the syscalls.)
            try db.execute(sql: "PRAGMA temp_store = MEMORY")
            // A log that grew (untar) is cut back to this when it restarts. Reused in place, each
            // 4120-byte frame straddles two pages, and a page the kernel dropped from its cache is
            // read from disk before the write: 40-70 MB of reads in rm -rf after drop_caches.
            try db.execute(sql: "PRAGMA journal_size_limit = \(Store.logSizeLimit)")
        }
        do {
            pool = try DatabasePool(path: databasePath, configuration: config)
        } catch {
            throw StoreError("cannot open the store at \(directory): \(error)")
        }
        do {
            try pool.read { db in
                if try Self.migrator.hasBeenSuperseded(db) {
                    throw StoreError(
                        "the store at \(directory) has a format this build does not know (made by a newer or a "
                            + "pre-release coffer); open it with the build that made it, or create the store anew")
                }
            }
            try Self.migrator.migrate(pool)
        } catch let error as StoreError {
            throw error
        } catch {
            throw StoreError("cannot prepare the store at \(directory): \(error)")
        }
        // SQLite creates the log and shared-memory files with the database's mode, which is
        // 0644 (umask 022) until this: those two are made private here too, or the first
        // session's stay 0644. (Creating the database file 0600 before SQLite opens it instead
        // made a pool reader fail with "no such table" after another process changed the
        // schema: not understood, so not done.)
        for suffix in ["", "-wal", "-shm"] { chmod(databasePath + suffix, 0o600) }
        files = try ChunkFiles(directory: directory + "/chunks")
        fast = FastReads(path: databasePath)
    }

    /// The store's format: one migration per format version, each run once, in order; an
    /// applied migration this build does not know makes `init` refuse the store.
    static var migrator: DatabaseMigrator {
        var m = DatabaseMigrator()
        m.registerMigration("v1") { db in
            try db.execute(
                sql: """
                    CREATE TABLE base_files (
                        id BLOB PRIMARY KEY NOT NULL,
                        parent BLOB NOT NULL,
                        record BLOB NOT NULL,
                        content_digest BLOB,
                        version INTEGER NOT NULL DEFAULT 0,
                        content_version INTEGER NOT NULL DEFAULT 0,
                        server_deleted INTEGER NOT NULL DEFAULT 0
                    ) WITHOUT ROWID;
                    CREATE INDEX base_files_digest ON base_files(content_digest);
                    CREATE TABLE local_files (
                        id BLOB PRIMARY KEY NOT NULL,
                        parent BLOB NOT NULL,
                        record BLOB NOT NULL,
                        content_digest BLOB,
                        version INTEGER NOT NULL DEFAULT 0,
                        content_version INTEGER NOT NULL DEFAULT 0,
                        server_deleted INTEGER NOT NULL DEFAULT 0
                    ) WITHOUT ROWID;
                    CREATE INDEX local_files_digest ON local_files(content_digest);
                    CREATE TABLE manifests (digest BLOB PRIMARY KEY NOT NULL, sealed BLOB NOT NULL) WITHOUT ROWID;
                    CREATE TABLE manifest_chunks (
                        digest BLOB NOT NULL,
                        chunk_id BLOB NOT NULL,
                        PRIMARY KEY (digest, chunk_id)
                    ) WITHOUT ROWID;
                    CREATE INDEX manifest_chunks_chunk ON manifest_chunks(chunk_id);
                    -- place: where the chunk's bytes are (ChunkFiles.Place).
                    CREATE TABLE chunks (
                        id BLOB PRIMARY KEY NOT NULL,
                        sealed BLOB NOT NULL,
                        place INTEGER NOT NULL DEFAULT 0
                    );
                    CREATE TABLE inodes (ino INTEGER PRIMARY KEY AUTOINCREMENT, file_id BLOB UNIQUE NOT NULL);
                    CREATE TABLE settings (key TEXT PRIMARY KEY NOT NULL, value BLOB NOT NULL);
                    CREATE TABLE change_log (seq INTEGER PRIMARY KEY AUTOINCREMENT, file_id BLOB NOT NULL);
                    -- Ids of files whose deletion synced and whose records were pruned: a live record
                    -- for one of them, served again, is a resurrection the device refuses (docs/SYNC.md).
                    CREATE TABLE tombstones (id BLOB PRIMARY KEY NOT NULL) WITHOUT ROWID;
                    """)
            // (Through format 5.) Inode 1 is the root's (FUSE_ROOT_ID) on every device, including
            // one whose root arrives by sync after other files: numbering for everything else
            // starts at 2.
            try db.execute(sql: "INSERT INTO inodes(ino, file_id) VALUES (1, x'00')")
            try db.execute(sql: "DELETE FROM inodes WHERE ino = 1 AND file_id = x'00'")
        }
        // The tree is read from the store, not held in memory (docs/STORE.md, "The tree in the
        // store"): each record's name MAC and kind sit beside it, indexed under its parent, so a
        // folder's children, a child by name and a folder's live subfolders are index lookups.
        m.registerMigration("v2") { db in
            for side in [TreeSide.base, .local] { try indexTree(side.table, db) }
            try createTreeCounters(db)
            try db.execute(sql: treeTriggers)
        }
        // Rows clustered under their parent (docs/STORE.md, "The tree in the store"): keyed by
        // id, a folder's children sat on as many pages as it has children, anywhere in the
        // table, and listing every folder of 100,000 files read the whole table at random (1.0 s
        // cold or warm through a 2 MiB cache, against 0.15 s cold and 0.06 s warm clustered).
        m.registerMigration("v3") { db in
            let triggers = try String.fetchAll(
                db, sql: "SELECT name FROM sqlite_master WHERE type = 'trigger' AND tbl_name IN (?, ?)",
                arguments: [TreeSide.base.table, TreeSide.local.table])
            for t in triggers { try db.execute(sql: "DROP TRIGGER \(t)") }
            for side in [TreeSide.base, .local] { try clusterTree(side.table, db) }
            try db.execute(sql: treeTriggers)
        }
        // A folder's link count counts its live subfolders: an index of live folder rows alone
        // answers it without reading the folder's other children (a cold `find` of 100,000
        // files spent a fifth of its listing CPU counting over 100 rows per subfolder).
        m.registerMigration("v4") { db in
            // The predicate is part of the format: `liveFolder` must keep this text.
            for side in [TreeSide.base, .local] {
                try db.execute(
                    sql: "CREATE INDEX \(side.table)_folders ON \(side.table)(parent) WHERE kind = 1 AND id != parent")
            }
        }
        // Other accounts' files shared with this one, as the server's share feed sent them and
        // the vault verified them (docs/SHARING.md, "On the grantee's device"): a mirror kept
        // apart from the account's own tree, whose invariants (one root, no orphans) it does
        // not share: a shared folder's parent is a folder this account never sees.
        m.registerMigration("v5") { db in
            try db.execute(
                sql: """
                    CREATE TABLE shared_files (
                        id BLOB PRIMARY KEY NOT NULL,
                        parent BLOB NOT NULL,
                        name_mac BLOB NOT NULL,
                        record BLOB NOT NULL,
                        content_digest BLOB,
                        version INTEGER NOT NULL,
                        content_version INTEGER NOT NULL,
                        server_deleted INTEGER NOT NULL
                    ) WITHOUT ROWID;
                    CREATE INDEX shared_files_parent ON shared_files(parent, name_mac);
                    CREATE INDEX shared_files_digest ON shared_files(content_digest);
                    """)
        }
        // Inode numbers are a keyed hash of the file id, made by the mount (docs/FILESYSTEM.md,
        // "Inode numbers"): a row per file cost every create an insert into an index on random
        // ids, and every listing a lookup per entry (7 of 30 s of CPU in a cold `find` of a
        // million files). Only a file whose hash was taken when it needed a number has a row,
        // in practice none. The old table stays, emptied, for a daemon of the previous version
        // still running on this store until it is mounted again.
        m.registerMigration("v6") { db in
            try db.execute(
                sql: """
                    CREATE TABLE inode_exceptions (
                        file_id BLOB PRIMARY KEY NOT NULL,
                        ino INTEGER UNIQUE NOT NULL
                    ) WITHOUT ROWID;
                    DELETE FROM inodes;
                    """)
        }
        // A write grantee's own changes to shared files, not pushed yet (docs/SHARING.md,
        // "Writing in a share"): laid over the mirror as `local_files` is over `base_files`,
        // so what the feed sends stays what the server holds, the ground a merge starts from.
        // And the queue of work saved from shares this account can no longer write to, sealed,
        // kept until it is in the account's own tree.
        m.registerMigration("v7") { db in
            try db.execute(
                sql: """
                    CREATE TABLE shared_local (
                        id BLOB PRIMARY KEY NOT NULL,
                        parent BLOB NOT NULL,
                        name_mac BLOB NOT NULL,
                        record BLOB NOT NULL,
                        content_digest BLOB
                    ) WITHOUT ROWID;
                    CREATE INDEX shared_local_parent ON shared_local(parent, name_mac);
                    CREATE INDEX shared_local_digest ON shared_local(content_digest);
                    CREATE TABLE recovery_queue (
                        seq INTEGER PRIMARY KEY AUTOINCREMENT,
                        file_id BLOB NOT NULL,
                        item BLOB NOT NULL,
                        content_digest BLOB
                    );
                    """)
        }
        return m
    }

    /// The rows `<table>_folders` indexes (format `v4`): live folders other than the root. A
    /// query names the index (the planner prefers the primary key's range otherwise), and SQLite
    /// uses a partial index only for a query that implies its predicate, so this is the text of
    /// the v4 migration's predicate and never changes (a new predicate is a new index).
    static let liveFolder = "WHERE kind = 1 AND id != parent"

    /// Rebuilds a tree table keyed by (parent, name MAC, id) (format `v3`), so a folder's
    /// children, and a child by name, are one range of the table; the id stays unique through
    /// an index, which lookups by id and the writer's upsert use. The caller drops the table's
    /// triggers first and creates them again after.
    private static func clusterTree(_ table: String, _ db: Database) throws {
        let columns = "id, parent, record, content_digest, version, content_version, server_deleted, name_mac, kind"
        try db.execute(
            sql: """
                CREATE TABLE \(table)_clustered (
                    id BLOB NOT NULL,
                    parent BLOB NOT NULL,
                    record BLOB NOT NULL,
                    content_digest BLOB,
                    version INTEGER NOT NULL DEFAULT 0,
                    content_version INTEGER NOT NULL DEFAULT 0,
                    server_deleted INTEGER NOT NULL DEFAULT 0,
                    name_mac BLOB NOT NULL DEFAULT x'',
                    kind INTEGER NOT NULL DEFAULT 0,
                    PRIMARY KEY (parent, name_mac, id)
                ) WITHOUT ROWID;
                INSERT INTO \(table)_clustered (\(columns))
                  SELECT \(columns) FROM \(table) ORDER BY parent, name_mac, id;
                DROP TABLE \(table);
                ALTER TABLE \(table)_clustered RENAME TO \(table);
                CREATE UNIQUE INDEX \(table)_id ON \(table)(id);
                CREATE INDEX \(table)_digest ON \(table)(content_digest);
                CREATE INDEX \(table)_root ON \(table)(id) WHERE parent = id;
                CREATE INDEX \(table)_deleted ON \(table)(id) WHERE kind >= 2;
                """)
    }

    /// Gives a tree table the columns and indexes the tree is read by (format `v2`), filled from
    /// each record; one that does not decode keeps empty columns, for fsck to report.
    private static func indexTree(_ table: String, _ db: Database) throws {
        try db.execute(
            sql: """
                ALTER TABLE \(table) ADD COLUMN name_mac BLOB NOT NULL DEFAULT x'';
                ALTER TABLE \(table) ADD COLUMN kind INTEGER NOT NULL DEFAULT 0;
                """)
        var columns: [(id: Data, mac: Data, kind: Int64)] = []
        let rows = try Row.fetchCursor(db, sql: "SELECT id, record, server_deleted FROM \(table)")
        while let row = try rows.next() {
            let record: Data = row["record"]
            guard let signed = try? SignedMetadata(decoding: [UInt8](record)) else { continue }
            let serverDeleted: Bool = row["server_deleted"]
            columns.append((row["id"], Data(signed.metadata.name.mac), TreeKind.of(signed.metadata, serverDeleted)))
        }
        let update = try db.makeStatement(sql: "UPDATE \(table) SET name_mac = ?, kind = ? WHERE id = ?")
        for c in columns { try update.execute(arguments: [c.mac, c.kind, c.id]) }
        try db.execute(
            sql: """
                CREATE INDEX \(table)_children ON \(table)(parent, name_mac, kind);
                CREATE INDEX \(table)_root ON \(table)(id) WHERE parent = id;
                CREATE INDEX \(table)_deleted ON \(table)(id) WHERE kind >= 2;
                """)
    }

    /// SQL that is true when `row` (a tree row: an alias, or a trigger's `new` or `old`) has a row
    /// with its id in `table`.
    private static func has(_ row: String, in table: String) -> String {
        "EXISTS (SELECT 1 FROM \(table) WHERE id = \(row).id)"
    }

    /// Counters the triggers keep exact as rows come and go (format `v2`), so `coffer status`,
    /// statfs and a mount deciding whether to collect garbage read one row, not a million:
    /// - `tree_count`: records in the current tree (an id in either table);
    /// - `pending_count`: local rows by what they push: a deletion if the row says deleted, else
    ///   a creation if no base row has its id, else a modification; each trigger moves one row
    ///   between these as its category changes;
    /// - `garbage_count`: document versions rows stopped naming since the last collection.
    private static func createTreeCounters(_ db: Database) throws {
        let (base, local) = (TreeSide.base.table, TreeSide.local.table)
        let sql = """
            CREATE TABLE tree_count (one INTEGER PRIMARY KEY CHECK (one = 1), n INTEGER NOT NULL);
            INSERT INTO tree_count SELECT 1,
              (SELECT count(*) FROM \(base)) + (SELECT count(*) FROM \(local) l WHERE NOT \(has("l", in: base)));
            CREATE TABLE pending_count (
                one INTEGER PRIMARY KEY CHECK (one = 1),
                created INTEGER NOT NULL, modified INTEGER NOT NULL, deleted INTEGER NOT NULL);
            INSERT INTO pending_count SELECT 1,
              (SELECT count(*) FROM \(local) l WHERE kind < 2 AND NOT \(has("l", in: base))),
              (SELECT count(*) FROM \(local) l WHERE kind < 2 AND \(has("l", in: base))),
              (SELECT count(*) FROM \(local) WHERE kind >= 2);
            CREATE TABLE garbage_count (one INTEGER PRIMARY KEY CHECK (one = 1), n INTEGER NOT NULL);
            INSERT INTO garbage_count VALUES (1, 0);
            """
        try db.execute(sql: sql)
    }

    /// The triggers that keep the counters of `createTreeCounters` exact.
    private static var treeTriggers: String {
        let (base, local) = (TreeSide.base.table, TreeSide.local.table)
        var sql = ""
        for (table, other) in [(base, local), (local, base)] {
            for (event, row, sign) in [("insert", "new", "+"), ("delete", "old", "-")] {
                sql += """
                    CREATE TRIGGER \(table)_counted_\(event) AFTER \(event) ON \(table)
                      WHEN NOT \(has(row, in: other)) BEGIN UPDATE tree_count SET n = n \(sign) 1; END;

                    """
            }
            sql += """
                CREATE TRIGGER \(table)_garbage_out AFTER DELETE ON \(table) WHEN old.content_digest IS NOT NULL
                  BEGIN UPDATE garbage_count SET n = n + 1; END;
                CREATE TRIGGER \(table)_garbage_replaced AFTER UPDATE OF content_digest ON \(table)
                  WHEN old.content_digest IS NOT NULL AND old.content_digest IS NOT new.content_digest
                  BEGIN UPDATE garbage_count SET n = n + 1; END;

                """
        }
        func category(_ row: String, _ sign: String) -> String {
            """
            deleted = deleted \(sign) (\(row).kind >= 2),
            created = created \(sign) (\(row).kind < 2 AND NOT \(has(row, in: base))),
            modified = modified \(sign) (\(row).kind < 2 AND \(has(row, in: base)))
            """
        }
        let liveLocal = { (row: String) in "EXISTS (SELECT 1 FROM \(local) WHERE id = \(row).id AND kind < 2)" }
        sql += """
            CREATE TRIGGER \(local)_pending_in AFTER INSERT ON \(local)
              BEGIN UPDATE pending_count SET \(category("new", "+")); END;
            CREATE TRIGGER \(local)_pending_out AFTER DELETE ON \(local)
              BEGIN UPDATE pending_count SET \(category("old", "-")); END;
            CREATE TRIGGER \(local)_pending_kind AFTER UPDATE OF kind ON \(local)
              BEGIN
                UPDATE pending_count SET \(category("old", "-"));
                UPDATE pending_count SET \(category("new", "+"));
              END;
            CREATE TRIGGER \(base)_pending_in AFTER INSERT ON \(base) WHEN \(liveLocal("new"))
              BEGIN UPDATE pending_count SET created = created - 1, modified = modified + 1; END;
            CREATE TRIGGER \(base)_pending_out AFTER DELETE ON \(base) WHEN \(liveLocal("old"))
              BEGIN UPDATE pending_count SET created = created + 1, modified = modified - 1; END;
            """
        return sql
    }

    /// Runs `body` in one read transaction (a consistent snapshot). While a group transaction
    /// of this process is open, the read runs on the writer's connection, after the statements
    /// finished writes left queued (`StoreWriter`), so it sees everything this process has written.
    public func read<T>(_ body: (StoreReader) throws -> T) throws -> T {
        if group.isOpen { return try readThroughWriter(body) }
        return try pool.read { db in try body(StoreReader(db: db, files: files)) }
    }

    /// Like `read`, for a body that runs a single statement (the last change, a record by id):
    /// SQLite makes one statement atomic by itself, so no transaction is opened. GRDB's read
    /// transaction (BEGIN, a schema check, a savepoint, COMMIT) cost more than the query: 80% of
    /// `open` and half of `read` for a small file. Two statements that must agree need `read`.
    public func readOne<T>(_ body: (StoreReader) throws -> T) throws -> T {
        if group.isOpen { return try readThroughWriter(body) }
        return try pool.unsafeRead { db in try body(StoreReader(db: db, files: files)) }
    }

    /// Whether this device holds changes not yet pushed (see `StoreReader.hasLocalChanges`). One
    /// statement, so no transaction: the sync scheduler asks whenever the store changed.
    public func hasLocalChanges() throws -> Bool { try readOne { try $0.hasLocalChanges() } }

    /// Whether a read of the store now waits for the writer's connection (a group is open, see
    /// `readOne`): a guess for callers deciding whether a read may take long, never blocking.
    public var readsGoThroughWriter: Bool { group.isOpen }

    /// A read while this process's group is open: on the writer's connection, the only one that
    /// sees the group, after the statements finished writes queued.
    private func readThroughWriter<T>(_ body: (StoreReader) throws -> T) throws -> T {
        try pool.writeWithoutTransaction { db in
            try runQueued(db)
            return try body(StoreReader(db: db, files: files))
        }
    }

    // MARK: The committed tree

    // What the last commit left of the tree (local over base), read on the fast read connections
    // (`FastReads`): never this process's open group nor an open write. The vault reads its tree
    // this way and keeps what it wrote since in memory until that commits (`committedGroup`).

    /// The current record of `id`.
    public func committedRecord(_ id: FileID) throws -> StoredFile? {
        try fast.records(.record, id.bytes).first
    }

    /// The current records under `parent`, all of them or those whose name has MAC `nameMAC`.
    public func committedChildren(of parent: FileID, nameMAC: [UInt8]? = nil) throws -> [StoredFile] {
        guard let nameMAC else { return try fast.records(.children, parent.bytes) }
        return try fast.records(.named, parent.bytes, nameMAC)
    }

    /// Whether the base tree (what the server acknowledged) holds `id`. Base rows are written
    /// only outside group transactions (a pull, a push's bookkeeping) and committed before
    /// those writes return, so the read connections see every one of them, even while a group
    /// is open: asking here spares a write the queue run that reading through the writer costs.
    public func committedInBase(_ id: FileID) throws -> Bool {
        try fast.integer(.inBase, id.bytes) != 0
    }

    /// The newest committed change-log sequence number, on a prepared statement (an `open` asks
    /// it to learn whether another process committed since this one last caught up).
    public func committedLastChange() throws -> Int64 {
        try fast.integer(.lastChange)
    }

    /// How many live folders `parent` holds.
    public func committedSubfolderCount(of parent: FileID) throws -> Int {
        Int(clamping: try fast.integer(.subfolders, parent.bytes))
    }

    /// Every record that is its own parent (a sound tree has one root, or none yet).
    public func committedRoots() throws -> [FileID] {
        try fast.blobs(.roots).compactMap { try? FileID(bytes: $0) }
    }

    /// How many document versions records stopped naming since the last `collectGarbage`: an
    /// upper bound on the manifests it would remove (kept by triggers, see the `v2` migration).
    public func garbageSinceCollection() throws -> Int {
        try readOne { r in try r.count("SELECT n FROM garbage_count") }
    }

    /// What waits to be pushed: local records that create, change or delete a file (kept by
    /// triggers, see the `v2` migration).
    public func pendingCounts() throws -> (created: Int, modified: Int, deleted: Int) {
        try readOne { r in try r.pendingCounts() }
    }

    /// How many records the tree holds (kept by triggers, see the `v2` migration).
    public func committedCount() throws -> Int { Int(clamping: try fast.integer(.count)) }

    /// The newest group transaction whose commit finished (see `enableGroupCommit`): a write made
    /// in a group up to this one is what the committed reads above see. 0 before any group.
    public var committedGroup: UInt64 { group.committedGeneration }

    /// `committedGroup`, and the most recent groups that failed to commit (their writes gone).
    public var groupFates: (committed: UInt64, lost: [UInt64]) { group.fates }

    /// A sealed manifest by digest, on the fast path (see `FastReads`).
    public func manifest(_ digest: [UInt8]) throws -> [UInt8]? {
        if group.isOpen { return try readOne { try $0.manifest(digest) } }
        return try fast.manifest(digest)
    }

    /// A sealed chunk by id, on the fast path (see `FastReads`).
    public func chunk(_ id: [UInt8]) throws -> [UInt8]? {
        if group.isOpen { return try readOne { try $0.chunk(id) } }
        return try fast.chunk(id, files: files)
    }

    /// Starts reading the pack files that hold these chunks from the disk and returns at once:
    /// a sequential reader's next chunks are then on their way while the current ones are
    /// opened. Why: a chunk read is a `pread` on a freshly opened pack descriptor, so the
    /// kernel's own read-ahead starts small at every chunk, and a cold 256 MiB read kept the
    /// disk idle a third of the time. The lookups and the reading run on `prefetcher`'s thread,
    /// off the caller's request; the lookups use the read connections, so a chunk only the open
    /// group names is skipped, as are chunks kept in rows and unknown ids. Best effort: at most
    /// `prefetchLimit` chunks wait at once, the rest are dropped.
    public func prefetch(_ ids: [[UInt8]]) {
        guard !ids.isEmpty else { return }
        guard prefetchPending.add(ids.count, ordering: .relaxed).newValue <= Self.prefetchLimit else {
            prefetchPending.subtract(ids.count, ordering: .relaxed)
            return
        }
        prefetcher.async { [self] in
            let locators = ids.compactMap { id -> PackLocator? in
                guard let row = try? fast.chunkRow(id), row.flag == ChunkFiles.Place.pack.rawValue else { return nil }
                return try? PackLocator(decoding: row.bytes)
            }
            files.readIntoPageCache(locators)
            prefetchPending.subtract(ids.count, ordering: .relaxed)
        }
    }

    /// The most chunks whose prefetch may wait at once: 64 MiB of full chunks (a sequential
    /// reader keeps 8 MiB ahead; several readers at once share this).
    static let prefetchLimit = 256

    /// Runs `body` atomically: all of it lands, or none of it. Without group commit that is one
    /// immediate transaction. With group commit, it joins the open group transaction (opening
    /// one if none is), committed together with its neighbours by the group-commit thread (see
    /// `enableGroupCommit`); its statements are queued and run after it returns
    /// (`StoreWriter`), and dropped if it throws.
    public func write<T>(_ body: (StoreWriter) throws -> T) throws -> T {
        guard group.window != nil else {
            return try pool.writeWithoutTransaction { db in
                var result: T?
                try db.inTransaction(.immediate) {
                    let writer = StoreWriter(session: WriteSession(direct: db), files: files, processLog: processLog)
                    result = try body(writer)
                    try files.syncPending()  // chunk files before the rows naming them
                    return .commit
                }
                guard let result else { throw StoreError("a write transaction produced no result") }
                return result
            }
        }
        // The gate keeps the group from closing (or another write from starting) while this
        // one decides what to write; the connection stays free for the thread running the queue.
        return try gate.withLock {
            let generation = try openGroup()
            let session = WriteSession(deferredIn: self, generation: generation)
            let result: T
            do {
                result = try body(StoreWriter(session: session, files: files, processLog: processLog))
            } catch {
                session.abandon()
                throw error
            }
            session.finish()
            // The group-commit thread closes the group, so the commit's log write is not paid
            // inside a caller's write (it was 6% of the daemon's CPU during untar, all of it in
            // a FUSE request). Only if that thread falls far behind does a write commit itself.
            if group.age >= group.longest * 2 { try pool.writeWithoutTransaction { db in try commitGroup(db) } }
            return result
        }
    }

    /// The open group's number, beginning its transaction first if none is open. Caller holds
    /// the gate.
    private func openGroup() throws -> UInt64 {
        if let generation = group.openGeneration { return generation }
        return try pool.writeWithoutTransaction { db in
            if !db.isInsideTransaction {
                try db.beginTransaction(.immediate)
                do {
                    try counters.load(db)
                } catch {
                    try? db.rollback()
                    throw error
                }
                group.opened()
            }
            guard let generation = group.openGeneration else {
                throw StoreError("the store's group transaction is in an unknown state")
            }
            return generation
        }
    }

    /// Runs the statements finished writes queued, in order. Caller holds the connection. If
    /// one fails, the whole group is rolled back and reported lost (`takeLostGroup`), as when
    /// its commit fails: the writes that queued them have already returned. With `generation`,
    /// also checks that this group is still the open one (a write about to run its own
    /// statements must not run them outside its transaction). `yielding` offers the CPU to
    /// whatever else is runnable after each statement (see `enableGroupCommit`).
    func runQueued(_ db: Database, generation: UInt64? = nil, limit: Int = .max, yielding: Bool = false) throws {
        if let generation, group.openGeneration != generation || !db.isInsideTransaction {
            throw StoreError("the store lost this process's recent writes (a commit failed)")
        }
        let statements = group.takeQueued(limit: limit)
        guard !statements.isEmpty else { return }
        do {
            for s in statements {
                try s.run(db)
                if yielding { sched_yield() }
            }
        } catch {
            try? db.rollback()
            group.closed(lost: true)
            throw error
        }
    }

    /// Commits the open group transaction, if any, after running what is queued. On failure
    /// everything since the group began is rolled back, and `takeLostGroup` tells the owner to
    /// reload what it holds in memory. Caller holds the gate and the connection.
    private func commitGroup(_ db: Database) throws {
        guard db.isInsideTransaction else {
            // An open group whose transaction is gone was rolled back by SQLite itself (a full
            // disk, an I/O error in a statement): its writes are lost, not committed.
            group.closed(lost: group.isOpen)
            return
        }
        do {
            try runQueued(db)
            try files.syncPending()  // chunk files before the rows naming them
            try db.commit()
            group.closed()
        } catch {
            if db.isInsideTransaction { try? db.rollback() }
            group.closed(lost: true)
            throw error
        }
    }

    /// How many queued statements the group-commit thread runs per hold of the connection (about
    /// ten small files' worth: a millisecond or two).
    static let queueSlice = 64

    /// Holds the gate, then the connection: the order every path that commits the group takes.
    private func withGateAndConnection<T>(_ body: (Database) throws -> T) throws -> T {
        try gate.withLock { try pool.writeWithoutTransaction { db in try body(db) } }
    }

    /// Turns group commit on: write transactions stay open for about `window` seconds after a
    /// lone change, and up to `longest` while writes keep coming (`GroupCommit.isDue`), closed by
    /// a thread of their own (`window` / 4 late at most), and every write in that time shares one
    /// commit. For a long-running writer with many small operations (the mount daemon); others
    /// keep one commit per `write`. Durability is unchanged: `makeDurable` commits the group
    /// first. A crash loses at most the writes of the open group that nobody asked to be
    /// durable (about `window` of them after a lone change, up to `longest` in a burst, 2
    /// `longest` if the thread is starved of CPU, when writes commit the group themselves), and
    /// never part of one `write`. While a group is open, other processes wait (SQLite's busy
    /// timeout) to write.
    public func enableGroupCommit(window: Double = 0.05, longest: Double = 0.5) {
        guard group.window == nil else { return }
        group.enable(window: window, longest: longest)
        // Checkpoints move to the thread below (see `Checkpointer`). The log is not cut back
        // inside a commit, which holds every write up meanwhile (50-240 ms each time on this
        // machine's ext4, once a second during untar), but by the thread below once the store
        // is idle.
        try? pool.writeWithoutTransaction { db in
            try db.execute(sql: "PRAGMA wal_autocheckpoint = \(Checkpointer.backstopPages)")
            try db.execute(sql: "PRAGMA journal_size_limit = -1")
        }
        let path = databasePath
        let thread = Thread { [self] in
            let checkpointer = Checkpointer(path: path)
            var lastCheckpoint = GroupCommit.now()
            var lastTrim = GroupCommit.now()
            // Runs what writes queued, and closes each group when it is due; writes leave both
            // to this thread, so neither runs inside a caller's request.
            while let w = group.window {
                // Idle once the last group's writes are checkpointed and the log was looked at
                // for trimming: then only the next write wakes this thread.
                if group.sleepIfIdle(done: min(lastCheckpoint, lastTrim)) { continue }
                Thread.sleep(forTimeInterval: w / 4)
                // Once a second: often enough to keep the log to about a second of writes, rare
                // enough that its two syncs (log, then database) stay cheap.
                if GroupCommit.now() - lastCheckpoint >= 1.0 {
                    checkpointer?.run()
                    lastCheckpoint = GroupCommit.now()
                }
                guard group.isOpen else {
                    // Idle for a moment: cut a grown log back (see `trimLog`).
                    if let idle = group.idleFor, idle >= 0.1, GroupCommit.now() - lastTrim >= 1.0 {
                        lastTrim = GroupCommit.now()
                        if let checkpointer { trimLog(checkpointer) }
                    }
                    continue
                }
                // Without the gate first: writes go on meanwhile, and the commit below, which
                // holds them up, finds little left to run.
                // In slices, so a read waiting for the connection (a FUSE read of a file just
                // written) waits for one slice, not for everything queued since the last pass.
                // Yielding after each statement: this pass is background work, and without it
                // a caller's request waited behind it for the rest of its time slice whenever
                // the scheduler woke the caller or the FUSE worker on this thread's CPU (two
                // cores: tar, the worker and this thread share them). Untar of 12,000 files,
                // three A/B pairs: 5.75-5.86 s against 5.93-6.28 s (docs/PERFORMANCE.md).
                while group.hasQueued {
                    do {
                        try pool.writeWithoutTransaction { db in
                            try runQueued(db, limit: Self.queueSlice, yielding: true)
                        }
                    } catch { break }
                }
                guard group.isDue else { continue }
                try? withGateAndConnection { db in if group.isDue { try commitGroup(db) } }
            }
        }
        thread.name = "coffer-group-commit"
        thread.start()
    }

    /// Copies the whole log into the database and truncates it, if it grew past `logSizeLimit`.
    /// A log left large is rewritten in place, and its 4120-byte frames straddle pages, so a page
    /// the kernel dropped from its cache is read from disk before each frame is written: rm -rf
    /// after drop_caches read 40-70 MB that way. On the checkpoint connection, which gives up at
    /// once if a group opened meanwhile or a reader is still on the log (it tries again a
    /// second later), so neither the gate nor a long reader is ever waited for.
    func trimLog(_ checkpointer: Checkpointer) {
        var st = stat()
        guard stat(databasePath + "-wal", &st) == 0, Int(st.st_size) > Self.logSizeLimit, !group.isOpen else { return }
        checkpointer.truncate()
    }

    /// Commits the open group and returns to one commit per `write`.
    public func disableGroupCommit() throws {
        guard group.window != nil else { return }
        try withGateAndConnection { db in
            group.disable()
            try commitGroup(db)
            try db.execute(sql: "PRAGMA wal_autocheckpoint = 1000")
            try db.execute(sql: "PRAGMA journal_size_limit = \(Store.logSizeLimit)")
        }
    }

    /// Commits the open group transaction now (so other processes see it).
    public func commitPendingWrites() throws {
        guard group.isOpen else { return }
        try withGateAndConnection { db in try commitGroup(db) }
    }

    /// True once after a group transaction failed to commit (its writes are gone); the owner
    /// must then reload its in-memory view from the store.
    public func takeLostGroup() -> Bool { group.takeLost() }

    /// Makes every committed transaction durable on the device (what fsync promises), after
    /// committing the open group.
    public func makeDurable() throws {
        try withGateAndConnection { db in
            try commitGroup(db)
            try db.execute(sql: "PRAGMA synchronous = FULL")
            defer { try? db.execute(sql: "PRAGMA synchronous = NORMAL") }
            try db.inTransaction {
                try db.execute(
                    sql:
                        "INSERT INTO settings(key, value) VALUES ('durable', x'01') ON CONFLICT(key) DO UPDATE SET "
                        + "value = x'01'"
                )
                return .commit
            }
        }
    }

    /// Removes content nothing refers to: manifests no record names, chunks no manifest lists;
    /// then rewrites packs that are mostly dead (`compactPacks`). Only safe while no writer is
    /// between storing chunks and committing their manifest, which callers guarantee with the
    /// store's exclusive lock.
    @discardableResult
    public func collectGarbage() throws -> (manifests: Int, chunks: Int, compactedPacks: Int) {
        try withGateAndConnection { db in
            try commitGroup(db)
            var result = (manifests: 0, chunks: 0, compactedPacks: 0)
            try db.inTransaction(.immediate) {
                try db.execute(
                    sql: """
                        DELETE FROM manifests WHERE digest NOT IN (
                            SELECT content_digest FROM base_files WHERE content_digest IS NOT NULL
                            UNION SELECT content_digest FROM local_files WHERE content_digest IS NOT NULL
                            UNION SELECT content_digest FROM shared_files WHERE content_digest IS NOT NULL
                            UNION SELECT content_digest FROM shared_local WHERE content_digest IS NOT NULL
                            UNION SELECT content_digest FROM recovery_queue WHERE content_digest IS NOT NULL)
                        """)
                result.manifests = db.changesCount
                try db.execute(sql: "DELETE FROM manifest_chunks WHERE digest NOT IN (SELECT digest FROM manifests)")
                try db.execute(sql: "DELETE FROM chunks WHERE id NOT IN (SELECT chunk_id FROM manifest_chunks)")
                result.chunks = db.changesCount
                try db.execute(sql: "UPDATE garbage_count SET n = 0")
                return .commit
            }
            // Packs go after the commit (a crash before leaves packs no row names, swept next
            // time), together with packs whose transaction never committed: a pack goes once no
            // row names any of its chunks; one still partly in use is kept, or rewritten if it
            // is mostly dead (`compactPacks`).
            // One pass over the packed chunks' rows serves both the sweep and the rewrite. A
            // row's pack id is its locator's first bytes, readable even if the rest is damaged.
            let packRows = try Row.fetchAll(
                db, sql: "SELECT id, sealed FROM chunks WHERE place = \(ChunkFiles.Place.pack.rawValue)")
            let named = Set(
                packRows.map { row -> [UInt8] in
                    let sealed: Data = row[1]
                    return [UInt8](sealed.prefix(PackLocator.packIDBytes))
                })
            for pack in files.allPackIDs() where !named.contains(pack) { files.removePack(pack) }
            result.compactedPacks = try compactPacks(db, packRows)
            return result
        }
    }

    /// Packs at least this much of which is dead, and more than half, are rewritten.
    static let compactionMinimumDeadBytes = 1 << 20

    /// Rewrites packs whose chunks are mostly garbage: their live chunks are copied, still
    /// sealed, into new packs, their rows pointed there, and the old packs deleted. Without
    /// this a pack one live chunk still names keeps all of its dead ones on disk forever (a
    /// large file partly rewritten, again and again). Returns how many packs were rewritten.
    ///
    /// Crash safety: the new pack is synced before the transaction that names it commits; a
    /// crash before that commit leaves a pack no row names, one after it leaves the old pack
    /// unnamed, and the next collection sweeps either. A pack that cannot be read stays as it is.
    /// `packRows` are the rows (id, sealed locator) of every packed chunk.
    private func compactPacks(_ db: Database, _ packRows: [Row]) throws -> Int {
        var byPack: [[UInt8]: [(id: Data, locator: PackLocator)]] = [:]
        for row in packRows {
            let id: Data = row[0]
            let sealed: Data = row[1]
            guard let locator = try? PackLocator(decoding: [UInt8](sealed)) else { continue }
            byPack[locator.pack, default: []].append((id, locator))
        }
        var compacted = 0
        var batch: [(id: Data, old: PackLocator, sealed: [UInt8])] = []
        var batchPacks: [[UInt8]] = []
        var batchBytes = 0
        func rewrite() throws {
            guard !batch.isEmpty else { return }
            let locators = try files.writePack(batch.map(\.sealed))
            try files.syncPending()
            try db.inTransaction(.immediate) {
                for (item, locator) in zip(batch, locators) {
                    try db.execute(
                        sql:
                            "UPDATE chunks SET sealed = ? WHERE id = ? AND place = "
                            + "\(ChunkFiles.Place.pack.rawValue) AND sealed = ?",
                        arguments: [Data(locator.encoded), item.id, Data(item.old.encoded)])
                }
                return .commit
            }
            for pack in batchPacks { files.removePack(pack) }
            compacted += batchPacks.count
            batch = []
            batchPacks = []
            batchBytes = 0
        }
        // Sorted so a run rewrites packs in a stable order (and tests see the same packs).
        for (pack, chunks) in byPack.sorted(by: { $0.key.lexicographicallyPrecedes($1.key) }) {
            guard let size = files.packSize(pack) else { continue }
            let live = chunks.reduce(0) { $0 + Int($1.locator.length) }
            guard size - live >= Self.compactionMinimumDeadBytes, live * 2 < size else { continue }
            guard
                let read = try? chunks.map({ c in (id: c.id, old: c.locator, sealed: try files.readPacked(c.locator)) })
            else { continue }
            batch += read
            batchPacks.append(pack)
            batchBytes += live
            // New packs of up to 64 MiB: the batch is held in memory until it is written.
            if batchBytes >= 64 << 20 { try rewrite() }
        }
        try rewrite()
        return compacted
    }

    public func vacuum() throws {
        try withGateAndConnection { db in
            try commitGroup(db)
            try db.execute(sql: "PRAGMA wal_checkpoint(TRUNCATE)")
        }
    }
}
