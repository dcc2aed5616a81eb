import Foundation
import GRDBSQLite

/// Copies the write-ahead log back into the database from a background thread, for a store in
/// group-commit mode (the mount daemon).
///
/// SQLite's automatic checkpoint runs inside the commit that crosses 1,000 log pages, so one
/// unlucky FUSE operation in every few dozen paid for copying and syncing everyone's pages:
/// a tenth of `flush`, `create` and `unlink` CPU in untar and rm of 12,000 files. A PASSIVE
/// checkpoint on its own connection runs beside the writer and readers without blocking them.
/// The writer keeps a high automatic threshold as a backstop if this thread falls behind.
///
/// In a burst the log does not restart (that needs a moment with everything copied before the
/// next write transaction begins, and the next group begins right after each commit), so it
/// grows for as long as the burst lasts: 76 MB during one untar of 12,000 files. At 16,384
/// pages (64 MiB) the backstop fired in the last commits of that untar and ran SQLite's own
/// checkpoint inside them, holding every write up for 120-190 ms once; at 65,536 pages no
/// commit did, and the longest took 33 ms. This thread copies the log once a second either way.
final class Checkpointer {
    static let backstopPages = 65_536
    private var db: OpaquePointer?

    init?(path: String) {
        var handle: OpaquePointer?
        // A connection learns that the database is in WAL mode when it first reads it; until then
        // a checkpoint is a silent no-op (it reports -1 frames). Hence one read right away.
        guard sqlite3_open_v2(path, &handle, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX, nil) == SQLITE_OK,
            sqlite3_exec(handle, "PRAGMA schema_version", nil, nil, nil) == SQLITE_OK
        else {
            sqlite3_close_v2(handle)
            return nil
        }
        db = handle
    }

    deinit { sqlite3_close_v2(db) }

    /// Copies every committed frame no reader still needs. If it cannot run now (another
    /// checkpoint in progress, an error), the next call simply tries again.
    func run() {
        sqlite3_wal_checkpoint_v2(db, "main", SQLITE_CHECKPOINT_PASSIVE, nil, nil)
    }

    /// Copies the whole log and truncates it to nothing, if that can be done at once: this
    /// connection has no busy handler, so a writer in a transaction or a reader still on the
    /// log makes it give up (SQLITE_BUSY) instead of waiting, and nobody waits for it either
    /// beyond the copy itself. Returns whether the log was truncated.
    @discardableResult
    func truncate() -> Bool {
        sqlite3_wal_checkpoint_v2(db, "main", SQLITE_CHECKPOINT_TRUNCATE, nil, nil) == SQLITE_OK
    }
}
