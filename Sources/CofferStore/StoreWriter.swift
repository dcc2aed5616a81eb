import CofferModel
import Foundation
import GRDB
import Synchronization

/// Write access inside a transaction.
///
/// Outside group commit (the CLI) every call runs its statements at once, inside the write's
/// immediate transaction. In group-commit mode (the mount daemon) a write runs without the
/// connection: its statements are queued and run later, in order, inside the same open group
/// transaction, by the group-commit thread (or by whoever reads through the writer first). So a
/// FUSE request pays for validating and sealing, not for SQLite's B-tree work, which a second
/// core does meanwhile (`docs/STORE.md`, "Deferred statements"). What a write must know now
/// (the change log's sequence) is numbered in memory (`GroupCounters`), and
/// what it must read first (`reader`) runs the queue up to that point before the query.
public struct StoreWriter {
    let session: WriteSession
    let files: ChunkFiles
    private let logged = LoggedSequence()
    private let processLog: ProcessLog
    /// Numbers for the change log in group-commit mode; nil outside it, where SQLite's
    /// AUTOINCREMENT assigns them as each insert runs.
    private var counters: GroupCounters? { session.counters }
    /// The group transaction this write is part of (see `Store.enableGroupCommit`), nil if none.
    /// While one group stays open no other process can write, so a caller that saw the change
    /// log's end inside the same group, and sees `lastLoggedInProcess` unchanged since, knows
    /// the log has not moved without asking.
    public var groupGeneration: UInt64? { session.generation }

    init(session: WriteSession, files: ChunkFiles, processLog: ProcessLog) {
        self.session = session
        self.files = files
        self.processLog = processLog
    }

    /// The sequence number of the last change any writer of this store logged in this process
    /// (possibly since rolled back), nil before the first.
    public var lastLoggedInProcess: Int64? { processLog.value }
    public var reader: StoreReader { StoreReader(session: session, files: files) }

    /// The change-log sequence number of the last change this writer logged, if any: what
    /// `StoreReader.lastChange` would now answer, without the query.
    public var lastLogged: Int64? { logged.value }

    /// The connection itself, with everything this write queued before run first (for tests
    /// that damage a store on purpose).
    func withDatabase<T>(_ body: (Database) throws -> T) throws -> T { try session.access(body) }

    /// Stores a record. `previousDigest`, when the caller knows it (the vault's tree mirrors
    /// the row), spares the lookup of the content the row named before; a wrong guess can only
    /// leave a manifest for garbage collection, since `releaseManifest` checks every record.
    public func put(_ f: StoredFile, _ side: TreeSide, previousDigest: [UInt8]?? = .none) throws {
        let m = f.metadata
        let table = side.table
        let (version, contentVersion, serverDeleted) = (f.version, f.contentVersion, f.serverDeleted)
        // Only a document ever names content (the type of an id never changes), so only its
        // row can hold a manifest this write releases; a folder's update (every entry added
        // to or removed from it) skips the lookup.
        let lookUpPrevious: Bool
        let known: Data?
        if m.type != .document {
            lookUpPrevious = false
            known = nil
        } else if case .some(let given) = previousDigest {
            lookUpPrevious = false
            known = given.map { Data($0) }
        } else {
            lookUpPrevious = true
            known = nil
        }
        let id = Data(m.id.bytes)
        let digest = m.contentDigest.map { Data($0) }
        // The record is encoded where the statement runs: in the mount daemon that is the
        // group thread, not the request (a few microseconds per create, close or chmod).
        let write: @Sendable (Database, RowPut.Merged) throws -> Void = { db, merged in
            let parent = Data(m.parent.bytes)
            let record = Data(f.signed.encoded())
            let mac = Data(m.name.mac)
            let kind = TreeKind.of(m, serverDeleted)
            try db.cachedStatement(
                sql: """
                    INSERT INTO \(table) (id, parent, record, content_digest, version, content_version, server_deleted,
                      name_mac, kind)
                    VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
                    ON CONFLICT(id) DO UPDATE SET parent = excluded.parent, record = excluded.record,
                      content_digest = excluded.content_digest, version = excluded.version,
                      content_version = excluded.content_version, server_deleted = excluded.server_deleted,
                      name_mac = excluded.name_mac, kind = excluded.kind
                    """
            ).execute(arguments: [id, parent, record, digest, version, contentVersion, serverDeleted, mac, kind])
            for previous in merged.releases where previous != digest { try Self.releaseManifest(previous, db) }
            if merged.garbage > 0 {
                try db.cachedStatement(sql: "UPDATE garbage_count SET n = n + ?").execute(arguments: [merged.garbage])
            }
        }
        if lookUpPrevious {
            try session.run(touching: id) { db in
                let previous = try Data.fetchOne(
                    db.cachedStatement(sql: "SELECT content_digest FROM \(table) WHERE id = ?"), arguments: [id])
                try write(db, RowPut.Merged(releases: previous.map { [$0] } ?? []))
            }
        } else {
            try session.run(RowPut(table: table, id: id, before: known, digest: digest, write: write))
        }
        try logChange(m.id)
    }

    /// Deletes a record. Its manifest, like its chunks, stays until garbage collection (at
    /// mount and `coffer gc`): checking whether another record still names it and deleting the
    /// manifest and its chunk list was 8% of the daemon's CPU in `rm -rf` (perf), for rows of a
    /// few hundred bytes that collection removes anyway. A replaced version's manifest (`put`)
    /// is still dropped at once.
    public func remove(_ id: FileID, _ side: TreeSide) throws {
        let table = side.table
        let key = Data(id.bytes)
        try session.run(touching: key) { db in
            try db.cachedStatement(sql: "DELETE FROM \(table) WHERE id = ?").execute(arguments: [key])
        }
        try logChange(id)
    }

    /// Remembers that `id` was deleted and pruned, so it can never come back to life here.
    public func addTombstone(_ id: FileID) throws {
        let key = Data(id.bytes)
        try session.run { db in
            try db.cachedStatement(sql: "INSERT OR IGNORE INTO tombstones(id) VALUES (?)").execute(arguments: [key])
        }
    }

    /// Drops a manifest no record names any more. Its chunks stay until garbage collection,
    /// which alone can know that no writer is about to reference them again.
    static func releaseManifest(_ digest: Data, _ db: Database) throws {
        let used =
            try Bool.fetchOne(
                db.cachedStatement(
                    sql: """
                        SELECT EXISTS (SELECT 1 FROM base_files WHERE content_digest = ?1)
                            OR EXISTS (SELECT 1 FROM local_files WHERE content_digest = ?1)
                            OR EXISTS (SELECT 1 FROM shared_files WHERE content_digest = ?1)
                            OR EXISTS (SELECT 1 FROM shared_local WHERE content_digest = ?1)
                            OR EXISTS (SELECT 1 FROM recovery_queue WHERE content_digest = ?1)
                        """), arguments: [digest]) ?? true
        guard !used else { return }
        try db.cachedStatement(sql: "DELETE FROM manifests WHERE digest = ?").execute(arguments: [digest])
        try db.cachedStatement(sql: "DELETE FROM manifest_chunks WHERE digest = ?").execute(arguments: [digest])
    }

    public func logChange(_ id: FileID) throws {
        let seq: Int64
        if let counters {
            seq = counters.nextSequence()
            try session.run { db in
                try db.cachedStatement(sql: "INSERT INTO change_log(seq, file_id) VALUES (?, ?)")
                    .execute(arguments: [seq, Data(id.bytes)])
            }
        } else {
            let key = Data(id.bytes)
            seq = try session.access { db in
                try db.cachedStatement(sql: "INSERT INTO change_log(file_id) VALUES (?)").execute(arguments: [key])
                return db.lastInsertedRowID
            }
        }
        logged.value = seq
        processLog.value = seq
    }

    /// Stores a sealed manifest and the chunk ids it lists (the latter for garbage collection).
    public func putManifest(digest: [UInt8], sealed: [UInt8], chunkIDs: [[UInt8]]) throws {
        let key = Data(digest)
        let bytes = Data(sealed)
        let chunks = Array(Set(chunkIDs.map { Data($0) }))
        try session.run { db in
            try db.cachedStatement(sql: "INSERT OR IGNORE INTO manifests(digest, sealed) VALUES (?, ?)").execute(
                arguments: [key, bytes])
            for c in chunks {
                try db.cachedStatement(sql: "INSERT OR IGNORE INTO manifest_chunks(digest, chunk_id) VALUES (?, ?)")
                    .execute(arguments: [key, c])
            }
        }
    }

    /// Stores a sealed chunk once (a chunk already there is kept). Large ones go to a file,
    /// written before its row (see `ChunkFiles`).
    public func putChunk(id: [UInt8], sealed: [UInt8]) throws {
        try putChunks([(id, sealed)])
    }

    /// Stores a small chunk (one whose row holds its bytes) that `seal` produces. In group-commit
    /// mode `seal` runs later with the write's other statements, on whichever thread runs the
    /// queue: sealing a small file's chunk (zstd, then the AEAD) was about a third of its close,
    /// and nothing a write decides depends on the sealed bytes (a manifest names a chunk by id).
    public func putChunk(id: [UInt8], sealing seal: @escaping @Sendable () -> [UInt8]) throws {
        let key = Data(id)
        let files = files
        try session.run { db in try Self.appendChunk(key, seal, files, db) }
    }

    /// The settings row naming the pack the store last began appending small chunks to.
    static let appendPackSetting = "append_pack"

    /// Appends a small chunk to the current pack and names it in a row, unless a row names it
    /// already (asked first: a chunk stored twice would be dead bytes in the pack).
    private static func appendChunk(
        _ id: Data, _ seal: () -> [UInt8], _ files: ChunkFiles, _ db: Database
    ) throws {
        let reader = StoreReader(db: db, files: files)
        guard try !reader.hasChunk([UInt8](id)) else { return }
        let locator = try files.append(
            seal(), lastPack: { try reader.setting(Self.appendPackSetting) },
            began: { try Self.writeSetting(Self.appendPackSetting, Data($0), db) })
        try db.cachedStatement(
            sql: "INSERT INTO chunks(id, sealed, place) VALUES (?, ?, \(ChunkFiles.Place.pack.rawValue))"
        )
        .execute(arguments: [id, Data(locator.encoded)])
    }

    /// Stores sealed chunks once each. Large ones stored in one call share one pack file:
    /// creating a file per 256 KiB chunk cost more CPU than sealing it on a filesystem that had
    /// just deleted many files (ext4 skips recently freed inodes one by one; 1.1 ms per create
    /// measured). Small ones are appended to the store's current pack (`ChunkFiles.append`).
    public func putChunks(_ items: [([UInt8], [UInt8])]) throws {
        var small: [(Data, [UInt8])] = []
        var large: [(id: [UInt8], sealed: [UInt8])] = []
        var seen: Set<[UInt8]> = []
        for (id, sealed) in items where seen.insert(id).inserted {
            if sealed.count < ChunkFiles.threshold {
                small.append((Data(id), sealed))
            } else if try !reader.hasChunk(id) {
                large.append((id, sealed))
            }
        }
        if !small.isEmpty {
            let rows = small
            let files = files
            try session.run { db in
                for (id, sealed) in rows { try Self.appendChunk(id, { sealed }, files, db) }
            }
        }
        guard !large.isEmpty else { return }
        let locators = try files.writePack(large.map(\.sealed))
        let rows = zip(large, locators).map { (Data($0.id), Data($1.encoded)) }
        try session.run { db in
            for (id, locator) in rows {
                try db.cachedStatement(
                    sql: "INSERT INTO chunks(id, sealed, place) VALUES (?, ?, \(ChunkFiles.Place.pack.rawValue))"
                )
                .execute(arguments: [id, locator])
            }
        }
    }

    public func setSetting(_ key: String, _ value: [UInt8]) throws {
        let bytes = Data(value)
        try session.run { db in try Self.writeSetting(key, bytes, db) }
    }

    /// Stores a verified record of another account's file shared with this one (the mirror,
    /// format `v5`), replacing the one held.
    public func putShared(_ f: StoredFile) throws {
        let m = f.signed.metadata
        let args: StatementArguments = [
            Data(m.id.bytes), Data(m.parent.bytes), Data(m.name.mac), Data(f.signed.encoded()),
            m.contentDigest.map { Data($0) }, f.version, f.contentVersion, f.serverDeleted,
        ]
        try session.run { db in
            try db.cachedStatement(
                sql: """
                    INSERT OR REPLACE INTO shared_files
                        (id, parent, name_mac, record, content_digest, version, content_version, server_deleted)
                    VALUES (?, ?, ?, ?, ?, ?, ?, ?)
                    """
            ).execute(arguments: args)
        }
    }

    /// Drops a file from the mirror (its manifest stays until garbage collection).
    public func removeShared(_ id: FileID) throws {
        let key = Data(id.bytes)
        try session.run { db in
            try db.cachedStatement(sql: "DELETE FROM shared_files WHERE id = ?").execute(arguments: [key])
        }
    }

    /// Stores this account's own change to a shared file, not pushed yet (format `v7`),
    /// replacing the one held. The record is unsigned until it is pushed, as `local_files`'.
    public func putSharedLocal(_ signed: SignedMetadata) throws {
        let m = signed.metadata
        let args: StatementArguments = [
            Data(m.id.bytes), Data(m.parent.bytes), Data(m.name.mac), Data(signed.encoded()),
            m.contentDigest.map { Data($0) },
        ]
        try session.run { db in
            try db.cachedStatement(
                sql: """
                    INSERT OR REPLACE INTO shared_local (id, parent, name_mac, record, content_digest)
                    VALUES (?, ?, ?, ?, ?)
                    """
            ).execute(arguments: args)
        }
    }

    /// Queues a sealed item of work saved from a share (its content's manifest, if any, is kept
    /// until the item is taken off), replacing one queued for the same file (a document flushed
    /// again after its share went: the later content holds the earlier).
    public func enqueueRecovery(_ item: [UInt8], file: FileID, contentDigest: [UInt8]?) throws {
        let id = Data(file.bytes)
        let args: StatementArguments = [id, Data(item), contentDigest.map { Data($0) }]
        try session.run { db in
            try db.cachedStatement(sql: "DELETE FROM recovery_queue WHERE file_id = ?").execute(arguments: [id])
            try db.cachedStatement(sql: "INSERT INTO recovery_queue (file_id, item, content_digest) VALUES (?, ?, ?)")
                .execute(arguments: args)
        }
    }

    /// Takes an item off the recovery queue (saved, or found damaged).
    public func removeRecovery(_ seq: Int64) throws {
        try session.run { db in
            try db.cachedStatement(sql: "DELETE FROM recovery_queue WHERE seq = ?").execute(arguments: [seq])
        }
    }

    /// Drops this account's unpushed change to a shared file (pushed, or merged away).
    public func removeSharedLocal(_ id: FileID) throws {
        let key = Data(id.bytes)
        try session.run { db in
            try db.cachedStatement(sql: "DELETE FROM shared_local WHERE id = ?").execute(arguments: [key])
        }
    }

    /// Drops a manifest this device holds and the chunks no other manifest lists (content on
    /// demand trimming its cache: the server keeps it, and a read fetches it again). Chunk rows
    /// go at once; bytes in packs stay until garbage collection rewrites the pack.
    public func dropContent(digest: [UInt8]) throws {
        let key = Data(digest)
        try session.run { db in
            let chunks = try Data.fetchAll(
                db.cachedStatement(sql: "SELECT chunk_id FROM manifest_chunks WHERE digest = ?"), arguments: [key])
            try db.cachedStatement(sql: "DELETE FROM manifest_chunks WHERE digest = ?").execute(arguments: [key])
            try db.cachedStatement(sql: "DELETE FROM manifests WHERE digest = ?").execute(arguments: [key])
            let drop = try db.cachedStatement(
                sql: "DELETE FROM chunks WHERE id = ? AND NOT EXISTS (SELECT 1 FROM manifest_chunks WHERE chunk_id = ?)"
            )
            for c in chunks { try drop.execute(arguments: [c, c]) }
        }
    }

    public func removeSetting(_ key: String) throws {
        try session.run { db in
            try db.cachedStatement(sql: "DELETE FROM settings WHERE key = ?").execute(arguments: [key])
        }
    }

    private static func writeSetting(_ key: String, _ value: Data, _ db: Database) throws {
        try db.cachedStatement(
            sql:
                "INSERT INTO settings(key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = "
                + "excluded.value"
        )
        .execute(arguments: [key, value])
    }

    /// Gives `id` the inode number `ino` in place of its hash, which another file held when it
    /// needed one (docs/FILESYSTEM.md, "Inode numbers").
    public func addInodeException(_ id: FileID, _ ino: UInt64) throws {
        guard let n = Int64(exactly: ino) else { throw StoreError("inode \(ino) is out of range") }
        let key = Data(id.bytes)
        try session.run { db in
            // Replaces the file's own row only: another file's number is a constraint error (OR
            // REPLACE would delete that file's row instead).
            try db.cachedStatement(
                sql: "INSERT INTO inode_exceptions(file_id, ino) VALUES (?, ?) "
                    + "ON CONFLICT(file_id) DO UPDATE SET ino = excluded.ino"
            )
            .execute(arguments: [key, n])
        }
    }

    /// Drops the inode number a file was given in place of its hash, if any (the file is gone).
    public func forgetInode(of id: FileID) throws {
        let key = Data(id.bytes)
        try session.run { db in
            try db.cachedStatement(sql: "DELETE FROM inode_exceptions WHERE file_id = ?").execute(arguments: [key])
        }
    }

    /// Drops old change-log entries; readers that fell further behind reload everything.
    public func trimChangeLog(keeping n: Int64) throws {
        try session.run { db in
            try db.cachedStatement(sql: "DELETE FROM change_log WHERE seq <= (SELECT MAX(seq) FROM change_log) - ?")
                .execute(arguments: [n])
        }
    }
}

/// One write's access to the connection. Direct: the write holds the connection and each
/// statement runs at once. Deferred (group commit): the write holds only the store's write gate;
/// its statements collect here and join the group's queue when it succeeds, or are dropped when
/// it fails. A read in between (`access`) runs the queue and this write's statements so far,
/// the latter inside a savepoint so that a failure later can still undo them.
final class WriteSession {
    private enum Mode {
        case direct(Database)
        case deferred(Store, generation: UInt64)
    }
    private let mode: Mode
    private var statements: [QueuedStatement] = []
    /// Some of this write's statements already ran, inside `SAVEPOINT coffer_write`.
    private var savepoint = false

    init(direct db: Database) { mode = .direct(db) }
    init(deferredIn store: Store, generation: UInt64) { mode = .deferred(store, generation: generation) }

    /// The group this write is part of; nil for a direct write.
    var generation: UInt64? {
        if case .deferred(_, let generation) = mode { return generation }
        return nil
    }

    /// The store's in-memory numbering, which a deferred write must use; nil for a direct one.
    var counters: GroupCounters? {
        if case .deferred(let store, _) = mode { return store.counters }
        return nil
    }

    func run(_ statement: @escaping DeferredStatement) throws {
        try run(.statement(statement))
    }

    /// Runs or queues a statement that changes the tree row of file `id` in some other way
    /// than a `RowPut` (see `QueuedStatement.touch`).
    func run(touching id: Data, _ statement: @escaping DeferredStatement) throws {
        try run(.touch(id: id, statement))
    }

    func run(_ put: RowPut) throws {
        try run(.put(put))
    }

    private func run(_ statement: QueuedStatement) throws {
        switch mode {
        case .direct(let db): try statement.run(db)
        case .deferred: statements.append(statement)
        }
    }

    func access<T>(_ body: (Database) throws -> T) throws -> T {
        switch mode {
        case .direct(let db):
            return try body(db)
        case .deferred(let store, let generation):
            return try store.pool.writeWithoutTransaction { db in
                try store.runQueued(db, generation: generation)
                if !statements.isEmpty {
                    if !savepoint {
                        try db.cachedStatement(sql: "SAVEPOINT coffer_write").execute()
                        savepoint = true
                    }
                    let mine = statements
                    statements = []
                    for s in mine { try s.run(db) }
                }
                return try body(db)
            }
        }
    }

    /// The write succeeded: its statements join the group's queue (behind every earlier write's).
    func finish() {
        guard case .deferred(let store, let generation) = mode else { return }
        if savepoint {
            statements.append(
                .statement { db in try db.cachedStatement(sql: "RELEASE SAVEPOINT coffer_write").execute() })
        }
        store.group.enqueue(statements, generation: generation)
        statements = []
    }

    /// The write failed: nothing of it may land.
    func abandon() {
        statements = []
        guard case .deferred(let store, let generation) = mode, savepoint else { return }
        store.pool.writeWithoutTransaction { db in
            guard db.isInsideTransaction, store.group.openGeneration == generation else { return }
            try? db.cachedStatement(sql: "ROLLBACK TO SAVEPOINT coffer_write").execute()
            try? db.cachedStatement(sql: "RELEASE SAVEPOINT coffer_write").execute()
        }
    }
}

/// A statement a write left for later (see `WriteSession`).
typealias DeferredStatement = @Sendable (Database) throws -> Void

/// The upsert of a tree row, queued so that a later upsert of the same row in the same group
/// can take its place (`GroupCommit.enqueue`): a file copied in is created and then given its
/// content, two writes of one row a fraction of a second apart, and only the last one needs to
/// reach the B-trees (under a million files their pages are mostly not cached, so each write
/// costs reads and log frames of its own).
struct RowPut: Sendable {
    /// What a put does beside its row: the digests the row named before it (its own previous
    /// one and those of the puts it replaced), released after it if no record names them any
    /// more; and the content replacements of the puts it replaced, which the row's
    /// `garbage_replaced` trigger no longer sees one by one (the garbage counter tells a mount
    /// when collecting pays, `Vault.garbageWorthCollectingAtMount`).
    struct Merged: Sendable {
        var releases: [Data] = []
        var garbage = 0
    }

    var table: String
    var id: Data
    /// The content digest the row named before the first put of this chain (as the caller
    /// knew it), and the one this put writes.
    var before: Data?
    var digest: Data?
    var merged: Merged
    var write: @Sendable (Database, Merged) throws -> Void

    init(
        table: String, id: Data, before: Data?, digest: Data?,
        write: @escaping @Sendable (Database, Merged) throws -> Void
    ) {
        self.table = table
        self.id = id
        self.before = before
        self.digest = digest
        self.merged = Merged(releases: before.map { [$0] } ?? [])
        self.write = write
    }

    /// This put taking `earlier`'s place (see `GroupCommit.enqueue`): the row goes from
    /// `earlier.before` straight to this put's digest, and the trigger, which counts each
    /// replaced non-nil digest once, would count one step where there were two.
    mutating func replace(_ earlier: RowPut) {
        func replaced(_ old: Data?, _ new: Data?) -> Int { old != nil && old != new ? 1 : 0 }
        merged.releases = earlier.merged.releases + merged.releases.filter { !earlier.merged.releases.contains($0) }
        merged.garbage =
            earlier.merged.garbage + replaced(earlier.before, earlier.digest) + replaced(earlier.digest, digest)
            - replaced(earlier.before, digest)
        before = earlier.before
    }
}

/// What a write queued, with what `GroupCommit` needs to know to merge row writes.
enum QueuedStatement: Sendable {
    case statement(DeferredStatement)
    /// Changes the tree row of `id` otherwise than a `RowPut` (a delete, an upsert that reads
    /// the row first): no put before it may be merged with one after it.
    case touch(id: Data, DeferredStatement)
    case put(RowPut)

    func run(_ db: Database) throws {
        switch self {
        case .statement(let s), .touch(_, let s): try s(db)
        case .put(let p): try p.write(db, p.merged)
        }
    }
}

/// A writer's last logged change; a class so the writer, a value passed to closures, shares it.
private final class LoggedSequence {
    var value: Int64?
}

/// The last change logged by any writer of one store in this process. Only touched by the
/// writer connection's one thread at a time, but read by whoever holds a writer.
final class ProcessLog: Sendable {
    private let last = Mutex<Int64?>(nil)
    var value: Int64? {
        get { last.withLock { $0 } }
        set { last.withLock { $0 = newValue } }
    }
}
