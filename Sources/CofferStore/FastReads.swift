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
/// Each statement runs in autocommit mode, so it reads one committed snapshot by itself. The
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

    private func withReader<T>(_ body: (Reader) throws -> T) throws -> T {
        let reader = try idle.withLock { $0.popLast() } ?? Reader(path: path)
        defer {
            let extra = idle.withLock { readers -> Reader? in
                if readers.count >= keep { return reader }
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
private final class Reader: @unchecked Sendable {
    enum Query { case manifest, chunk }
    private var db: OpaquePointer?
    private var manifest: OpaquePointer?
    private var chunk: OpaquePointer?

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
        // The same page cache the pool's connections get (see Store.init).
        sqlite3_exec(handle, "PRAGMA cache_size = -32768", nil, nil, nil)
        manifest = try prepare("SELECT sealed, 0 FROM manifests WHERE digest = ?")
        chunk = try prepare("SELECT sealed, place FROM chunks WHERE id = ?")
    }

    private func prepare(_ sql: String) throws -> OpaquePointer? {
        var statement: OpaquePointer?
        guard sqlite3_prepare_v3(db, sql, -1, UInt32(SQLITE_PREPARE_PERSISTENT), &statement, nil) == SQLITE_OK else {
            let message = String(cString: sqlite3_errmsg(db))
            close()
            throw StoreError("cannot prepare \(sql): \(message)")
        }
        return statement
    }

    /// The first column of the row with `key` as a blob, and the second as an integer.
    func row(_ query: Query, key: [UInt8]) throws -> (bytes: [UInt8], flag: Int64)? {
        guard let statement = query == .manifest ? manifest : chunk else {
            throw StoreError("read connection is closed")
        }
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

    func close() {
        sqlite3_finalize(manifest)
        manifest = nil
        sqlite3_finalize(chunk)
        chunk = nil
        sqlite3_close_v2(db)
        db = nil
    }
}

/// SQLite's "copy this buffer now" destructor, which Swift cannot import as a macro.
private let SQLITE_TRANSIENT = unsafeBitCast(-1, to: sqlite3_destructor_type.self)
