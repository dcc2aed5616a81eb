import CofferModel
import Foundation
import GRDBSQLite
import Synchronization

/// Read-only SQLite connections with the two hottest lookups prepared once: a manifest by digest
/// and a chunk by id, which every `open` and every uncached `read` of a document runs.
///
/// Why not GRDB: a `DatabasePool` read of one row cost ~90 µs here (reader checkout, a schema
/// version query, key paths, transaction statements), the query itself ~15 µs; for a small file
/// that was 80% of `open` and half of `read` (measured with perf on md5 of 12,000 files).
///
/// Each statement runs in autocommit mode, so it reads one committed snapshot by itself (a
/// listing's inodes, several statements, share one read transaction). The
/// connections never see the writer's open group transaction: `Store.manifest`/`chunk` route to
/// the writer while a group is open.
final class FastReads: Sendable {
    private let path: String
    /// Idle connections; a thread takes one for a lookup and puts it back (at most `keep`).
    private let idle = Mutex<[Reader]>([])
    private let keep = 4

    init(path: String) {
        self.path = path
    }

    deinit {
        idle.withLock { readers in
            for r in readers { r.close() }
            readers.removeAll()
        }
    }

    func manifest(_ digest: [UInt8]) throws -> [UInt8]? {
        try withReader { try $0.row(.manifest, key: digest).map { $0.bytes } }
    }

    /// The sealed chunk, from its row or (for a large one) its file.
    func chunk(_ id: [UInt8], files: ChunkFiles) throws -> [UInt8]? {
        guard let (bytes, place) = try withReader({ try $0.row(.chunk, key: id) }) else { return nil }
        return try files.resolve(id, row: bytes, place: place)
    }

    /// A chunk's row as stored: its `sealed` column (for a packed chunk, the locator) and place.
    func chunkRow(_ id: [UInt8]) throws -> (bytes: [UInt8], flag: Int64)? {
        try withReader { try $0.row(.chunk, key: id) }
    }

    /// Tree records (local over base) a tree query finds, decoded; rows that do not decode are
    /// left out, as when the vault loaded the whole tree (fsck reports them).
    func records(_ query: Reader.Query, _ keys: [UInt8]...) throws -> [StoredFile] {
        try withReader { r in
            var out: [StoredFile] = []
            try r.rows(query, keys: keys) { record, version, contentVersion, serverDeleted in
                guard let signed = try? SignedMetadata(decoding: record) else { return }
                out.append(
                    StoredFile(
                        signed: signed, version: version, contentVersion: contentVersion,
                        serverDeleted: serverDeleted != 0))
            }
            return out
        }
    }

    /// The first integer column of a tree query's first row.
    func integer(_ query: Reader.Query, _ keys: [UInt8]...) throws -> Int64 {
        try withReader { r in
            var value: Int64 = 0
            try r.rows(query, keys: keys) { _, first, _, _ in value = first }
            return value
        }
    }

    /// The first blob column of each row a tree query finds.
    func blobs(_ query: Reader.Query) throws -> [[UInt8]] {
        try withReader { r in
            var out: [[UInt8]] = []
            try r.rows(query, keys: []) { bytes, _, _, _ in out.append(bytes) }
            return out
        }
    }

    private func withReader<T>(_ body: (Reader) throws -> T) throws -> T {
        let reader = try idle.withLock { $0.popLast() } ?? Reader(path: path)
        defer {
            let extra = idle.withLock { readers -> Reader? in
                if readers.count >= keep || !reader.isIdle { return reader }
                readers.append(reader)
                return nil
            }
            extra?.close()
        }
        return try body(reader)
    }
}

/// One read-only connection and its prepared statements. Used by one thread at a time.
/// `@unchecked`: the handles are only touched by the thread that took the reader from `idle`.
final class Reader: @unchecked Sendable {
    /// The prepared lookups. The tree's read the current tree (a local record over the base
    /// one); each is one statement, so one committed snapshot.
    enum Query: CaseIterable {
        case manifest, chunk
        /// A record by id.
        case record
        /// A folder's children (the root, its own parent, is not its child).
        case children
        /// A folder's children with a name MAC.
        case named
        /// How many live folders a folder holds (its link count less two).
        case subfolders
        /// Root ids (one in a sound tree).
        case roots
        /// How many records the tree holds.
        case count
        /// Whether the base tree holds a file (1 or 0).
        case inBase
        /// The newest change-log sequence number committed (0 if none).
        case lastChange

        /// Tree columns: record, version, content version, server-deleted flag.
        var sql: String {
            let columns = "record, version, content_version, server_deleted"
            let notLocal = "NOT EXISTS (SELECT 1 FROM local_files l WHERE l.id = b.id)"
            switch self {
            case .manifest: return "SELECT sealed, 0 FROM manifests WHERE digest = ?"
            case .chunk: return "SELECT sealed, place FROM chunks WHERE id = ?"
            case .record:
                return """
                    SELECT \(columns), 0 AS side FROM local_files WHERE id = ?1
                    UNION ALL SELECT \(columns), 1 AS side FROM base_files WHERE id = ?1 ORDER BY side LIMIT 1
                    """
            case .children:
                return """
                    SELECT \(columns) FROM local_files WHERE parent = ?1 AND id != parent
                    UNION ALL SELECT \(columns) FROM base_files b WHERE parent = ?1 AND id != parent AND \(notLocal)
                    """
            case .named:
                return """
                    SELECT \(columns) FROM local_files WHERE parent = ?1 AND name_mac = ?2 AND id != parent
                    UNION ALL SELECT \(columns) FROM base_files b
                      WHERE parent = ?1 AND name_mac = ?2 AND id != parent AND \(notLocal)
                    """
            case .subfolders:
                return """
                    SELECT (SELECT count(*) FROM local_files INDEXED BY local_files_folders
                              \(Store.liveFolder) AND parent = ?1)
                      + (SELECT count(*) FROM base_files b INDEXED BY base_files_folders
                         \(Store.liveFolder) AND parent = ?1 AND \(notLocal))
                    """
            case .roots:
                return """
                    SELECT id FROM local_files WHERE parent = id
                    UNION SELECT id FROM base_files b WHERE parent = id AND \(notLocal)
                    """
            case .count:
                return "SELECT n FROM tree_count"
            case .inBase:
                return "SELECT count(*) FROM base_files WHERE id = ?1"
            case .lastChange:
                return "SELECT COALESCE(MAX(seq), 0) FROM change_log"
            }
        }
    }
    private var db: OpaquePointer?
    private var statements: [Query: OpaquePointer] = [:]

    init(path: String) throws {
        var handle: OpaquePointer?
        let rc = sqlite3_open_v2(path, &handle, SQLITE_OPEN_READONLY | SQLITE_OPEN_NOMUTEX, nil)
        db = handle
        guard rc == SQLITE_OK, let handle else {
            let message = handle.map { String(cString: sqlite3_errmsg($0)) } ?? "out of memory"
            close()
            throw StoreError("cannot open a read connection to \(path): \(message)")
        }
        sqlite3_busy_timeout(handle, 30_000)
        // 2 MiB each, at most `keep` of them: the tree's lookups and content's rows all come
        // through here, and the rest of a large store is read from the kernel's page cache
        // (see the page cache sizes in Store.init).
        sqlite3_exec(handle, "PRAGMA cache_size = -2048", nil, nil, nil)
        for q in Query.allCases { statements[q] = try prepare(q.sql) }
    }

    private func prepare(_ sql: String) throws -> OpaquePointer {
        var statement: OpaquePointer?
        guard sqlite3_prepare_v3(db, sql, -1, UInt32(SQLITE_PREPARE_PERSISTENT), &statement, nil) == SQLITE_OK,
            let statement
        else {
            let message = String(cString: sqlite3_errmsg(db))
            close()
            throw StoreError("cannot prepare \(sql): \(message)")
        }
        return statement
    }

    /// The first column of the row with `key` as a blob, and the second as an integer.
    func row(_ query: Query, key: [UInt8]) throws -> (bytes: [UInt8], flag: Int64)? {
        guard let statement = statements[query] else { throw StoreError("read connection is closed") }
        defer {
            sqlite3_reset(statement)
            sqlite3_clear_bindings(statement)
        }
        // SQLITE_TRANSIENT: SQLite copies the key, so the array may go away after binding.
        let bound = key.withUnsafeBytes {
            sqlite3_bind_blob(statement, 1, $0.baseAddress, Int32($0.count), SQLITE_TRANSIENT)
        }
        guard bound == SQLITE_OK else { throw StoreError("cannot bind a key: \(String(cString: sqlite3_errmsg(db)))") }
        switch sqlite3_step(statement) {
        case SQLITE_ROW:
            let count = Int(sqlite3_column_bytes(statement, 0))
            let bytes: [UInt8]
            if count > 0, let p = sqlite3_column_blob(statement, 0) {
                bytes = [UInt8](UnsafeRawBufferPointer(start: p, count: count))
            } else {
                bytes = []
            }
            return (bytes, sqlite3_column_int64(statement, 1))
        case SQLITE_DONE:
            return nil
        default:
            throw StoreError("read failed: \(String(cString: sqlite3_errmsg(db)))")
        }
    }

    /// Runs `query` with `keys` bound to its parameters in order, and hands each row's first
    /// four columns (a blob and three integers; absent ones read as zero) to `body`.
    func rows(
        _ query: Query, keys: [[UInt8]], _ body: (_ blob: [UInt8], Int64, Int64, Int64) throws -> Void
    ) throws {
        guard let statement = statements[query] else { throw StoreError("read connection is closed") }
        defer {
            sqlite3_reset(statement)
            sqlite3_clear_bindings(statement)
        }
        for (i, key) in keys.enumerated() {
            let bound = key.withUnsafeBytes {
                sqlite3_bind_blob(
                    statement, Int32(i + 1), $0.baseAddress ?? UnsafeRawPointer(bitPattern: 1), Int32($0.count),
                    SQLITE_TRANSIENT)
            }
            guard bound == SQLITE_OK else {
                throw StoreError("cannot bind a key: \(String(cString: sqlite3_errmsg(db)))")
            }
        }
        let columns = sqlite3_column_count(statement)
        while true {
            switch sqlite3_step(statement) {
            case SQLITE_ROW:
                var blob: [UInt8] = []
                if sqlite3_column_type(statement, 0) == SQLITE_BLOB {
                    let count = Int(sqlite3_column_bytes(statement, 0))
                    if count > 0, let p = sqlite3_column_blob(statement, 0) {
                        blob = [UInt8](UnsafeRawBufferPointer(start: p, count: count))
                    }
                }
                let first = sqlite3_column_type(statement, 0) == SQLITE_INTEGER ? sqlite3_column_int64(statement, 0) : 0
                try body(
                    blob, columns > 1 ? sqlite3_column_int64(statement, 1) : first,
                    columns > 2 ? sqlite3_column_int64(statement, 2) : 0,
                    columns > 3 ? sqlite3_column_int64(statement, 3) : 0)
            case SQLITE_DONE:
                return
            default:
                throw StoreError("read failed: \(String(cString: sqlite3_errmsg(db)))")
            }
        }
    }

    /// Runs `body` in one read transaction: every statement in it reads the same snapshot.
    func inReadTransaction<T>(_ body: () throws -> T) throws -> T {
        guard sqlite3_exec(db, "BEGIN", nil, nil, nil) == SQLITE_OK else {
            throw StoreError("cannot begin a read: \(String(cString: sqlite3_errmsg(db)))")
        }
        defer {
            // A connection left inside the transaction would read this snapshot for ever after.
            if sqlite3_exec(db, "COMMIT", nil, nil, nil) != SQLITE_OK { sqlite3_exec(db, "ROLLBACK", nil, nil, nil) }
        }
        return try body()
    }

    /// Not inside a transaction: fit to go back to the idle connections.
    var isIdle: Bool { db != nil && sqlite3_get_autocommit(db) != 0 }

    func close() {
        for (_, statement) in statements { sqlite3_finalize(statement) }
        statements = [:]
        sqlite3_close_v2(db)
        db = nil
    }
}

/// SQLite's "copy this buffer now" destructor, which Swift cannot import as a macro.
private let SQLITE_TRANSIENT = unsafeBitCast(-1, to: sqlite3_destructor_type.self)
