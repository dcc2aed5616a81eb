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
        self.signed = signed; self.version = version; self.contentVersion = contentVersion; self.serverDeleted = serverDeleted
    }
    public var metadata: FileMetadata { signed.metadata }
    /// The metadata as the tree should see it: deleted if either the writer or the server said so.
    public var effectiveMetadata: FileMetadata {
        var m = signed.metadata
        if serverDeleted { m.isDeleted = true }
        return m
    }
}

public struct StoreError: Error, CustomStringConvertible {
    public let message: String
    public init(_ message: String) { self.message = message }
    public var description: String { message }
}

/// The device's store: one SQLite database (WAL) under the data directory holding both trees,
/// sealed manifests and chunks, the inode table and a change log. Nothing in it is plaintext.
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
    let processLog = ProcessLog()
    let files: ChunkFiles
    let fast: FastReads

    public init(directory: String) throws {
        self.directory = directory
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true,
                                                attributes: [.posixPermissions: 0o700])
        databasePath = directory + "/coffer.sqlite"
        var config = Configuration()
        config.busyMode = .timeout(30)
        // Group commit (see `GroupCommit`) leaves the writer's transaction open between calls.
        config.allowsUnsafeTransactions = true
        config.prepareDatabase { db in
            // Commits are atomic either way; NORMAL skips the fsync per commit, and `makeDurable`
            // syncs explicitly when a caller (fsync, the CLI) needs durability.
            try db.execute(sql: "PRAGMA synchronous = NORMAL")
            // 32 MiB of page cache per connection (SQLite's default is 2 MiB): a tree of tens of
            // thousands of records outgrows the default, and every miss is a pread. Measured on
            // untar of 12,000 files: 10% less daemon CPU per operation.
            try db.execute(sql: "PRAGMA cache_size = -32768")
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
        try Self.migrator.migrate(pool)
        chmod(databasePath, 0o600)
        files = try ChunkFiles(directory: directory + "/chunks")
        fast = FastReads(path: databasePath)
    }

    static var migrator: DatabaseMigrator {
        var m = DatabaseMigrator()
        m.registerMigration("v1") { db in
            for table in ["base_files", "local_files"] {
                try db.execute(sql: """
                    CREATE TABLE \(table) (
                        id BLOB PRIMARY KEY NOT NULL,
                        parent BLOB NOT NULL,
                        record BLOB NOT NULL,
                        content_digest BLOB,
                        version INTEGER NOT NULL DEFAULT 0,
                        content_version INTEGER NOT NULL DEFAULT 0
                    ) WITHOUT ROWID
                    """)
                try db.execute(sql: "CREATE INDEX \(table)_digest ON \(table)(content_digest)")
            }
            try db.execute(sql: "CREATE TABLE manifests (digest BLOB PRIMARY KEY NOT NULL, sealed BLOB NOT NULL) WITHOUT ROWID")
            try db.execute(sql: "CREATE TABLE manifest_chunks (digest BLOB NOT NULL, chunk_id BLOB NOT NULL, PRIMARY KEY (digest, chunk_id)) WITHOUT ROWID")
            try db.execute(sql: "CREATE INDEX manifest_chunks_chunk ON manifest_chunks(chunk_id)")
            try db.execute(sql: "CREATE TABLE chunks (id BLOB PRIMARY KEY NOT NULL, sealed BLOB NOT NULL)")
            try db.execute(sql: "CREATE TABLE inodes (ino INTEGER PRIMARY KEY AUTOINCREMENT, file_id BLOB UNIQUE NOT NULL)")
            try db.execute(sql: "CREATE TABLE settings (key TEXT PRIMARY KEY NOT NULL, value BLOB NOT NULL)")
            try db.execute(sql: "CREATE TABLE change_log (seq INTEGER PRIMARY KEY AUTOINCREMENT, file_id BLOB NOT NULL)")
        }
        m.registerMigration("v1-root-inode") { db in
            // Inode 1 is the root's (FUSE_ROOT_ID) on every device, including one whose root
            // arrives by sync after other files: numbering for everything else starts at 2.
            try db.execute(sql: "INSERT INTO inodes(ino, file_id) VALUES (1, x'00')")
            try db.execute(sql: "DELETE FROM inodes WHERE ino = 1 AND file_id = x'00'")
        }
        m.registerMigration("v2-sync") { db in
            try db.execute(sql: "ALTER TABLE base_files ADD COLUMN server_deleted INTEGER NOT NULL DEFAULT 0")
            try db.execute(sql: "ALTER TABLE local_files ADD COLUMN server_deleted INTEGER NOT NULL DEFAULT 0")
        }
        m.registerMigration("v3-chunk-files") { db in
            // Large chunks live in files (see ChunkFiles); their rows keep an empty blob.
            try db.execute(sql: "ALTER TABLE chunks ADD COLUMN in_file INTEGER NOT NULL DEFAULT 0")
        }
        return m
    }

    /// Runs `body` in one read transaction (a consistent snapshot). While a group transaction
    /// of this process is open, the read runs on the writer's connection, so it sees everything
    /// this process has written.
    public func read<T>(_ body: (StoreReader) throws -> T) throws -> T {
        if group.isOpen {
            return try pool.writeWithoutTransaction { db in try body(StoreReader(db: db, files: files)) }
        }
        return try pool.read { db in try body(StoreReader(db: db, files: files)) }
    }

    /// Like `read`, for a body that runs a single statement (the last change, an inode's file id):
    /// SQLite makes one statement atomic by itself, so no transaction is opened. GRDB's read
    /// transaction (BEGIN, a schema check, a savepoint, COMMIT) cost more than the query: 80% of
    /// `open` and half of `read` for a small file. Two statements that must agree need `read`.
    public func readOne<T>(_ body: (StoreReader) throws -> T) throws -> T {
        if group.isOpen {
            return try pool.writeWithoutTransaction { db in try body(StoreReader(db: db, files: files)) }
        }
        return try pool.unsafeRead { db in try body(StoreReader(db: db, files: files)) }
    }

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

    /// Runs `body` atomically: all of it lands, or none of it. Without group commit that is one
    /// immediate transaction. With group commit, it is a savepoint inside the open group
    /// transaction, committed together with its neighbours by the group-commit thread about
    /// `window` later (at most 1.25 `window` while that thread keeps up).
    public func write<T>(_ body: (StoreWriter) throws -> T) throws -> T {
        try pool.writeWithoutTransaction { db in
            guard let window = group.window else {
                var result: T?
                try db.inTransaction(.immediate) {
                    result = try body(StoreWriter(db: db, files: files, processLog: processLog, groupGeneration: nil))
                    try files.syncPending() // chunk files before the rows naming them
                    return .commit
                }
                guard let result else { throw StoreError("a write transaction produced no result") }
                return result
            }
            if !db.isInsideTransaction {
                try db.beginTransaction(.immediate)
                group.opened()
            }
            // A savepoint makes this call atomic within the group. Its statements are prepared
            // once (GRDB's inSavepoint parses them on every call, a quarter of a small write).
            try db.cachedStatement(sql: "SAVEPOINT coffer_write").execute()
            let result: T
            do {
                result = try body(StoreWriter(db: db, files: files, processLog: processLog, groupGeneration: group.openGeneration))
            } catch {
                try? db.cachedStatement(sql: "ROLLBACK TO SAVEPOINT coffer_write").execute()
                try? db.cachedStatement(sql: "RELEASE SAVEPOINT coffer_write").execute()
                throw error
            }
            try db.cachedStatement(sql: "RELEASE SAVEPOINT coffer_write").execute()
            // The group-commit thread closes the group, so the commit's log write is not paid
            // inside a caller's write (it was 6% of the daemon's CPU during untar, all of it in
            // a FUSE request). Only if that thread falls far behind does a write commit itself.
            if group.age >= window * 4 { try commitGroup(db) }
            return result
        }
    }

    /// Commits the open group transaction, if any. On failure everything since the group began
    /// is rolled back, and `takeLostGroup` tells the owner to reload what it holds in memory.
    private func commitGroup(_ db: Database) throws {
        guard db.isInsideTransaction else { group.closed(); return }
        do {
            try files.syncPending() // chunk files before the rows naming them
            try db.commit()
            group.closed()
        } catch {
            try? db.rollback()
            group.closed(lost: true)
            throw error
        }
    }

    /// Turns group commit on: write transactions stay open for about `window` seconds (closed by
    /// a thread of their own, `window` / 4 late at most) and every write in that time shares
    /// one commit. For a long-running writer with many small
    /// operations (the mount daemon); others keep one commit per `write`. Durability is
    /// unchanged: `makeDurable` commits the group first. A crash loses at most the last
    /// 1.25 `window` of writes nobody asked to be durable (4 `window` if the thread is
    /// starved of CPU, when writes commit the group themselves), and never part of one `write`.
    /// While a group is open, other processes wait (SQLite's busy timeout) to write.
    public func enableGroupCommit(window: Double = 0.05) {
        guard group.window == nil else { return }
        group.enable(window: window)
        // Checkpoints move to the thread below (see `Checkpointer`).
        try? pool.writeWithoutTransaction { db in try db.execute(sql: "PRAGMA wal_autocheckpoint = \(Checkpointer.backstopPages)") }
        let path = databasePath
        let thread = Thread { [self] in
            let checkpointer = Checkpointer(path: path)
            var lastCheckpoint = GroupCommit.now()
            // Closes each group once it has been open for `window`; writes leave that to this
            // thread, so the commit never runs inside a caller's request.
            while let w = group.window {
                Thread.sleep(forTimeInterval: w / 4)
                // Once a second: often enough to keep the log to about a second of writes, rare
                // enough that its two syncs (log, then database) stay cheap.
                if GroupCommit.now() - lastCheckpoint >= 1.0 {
                    checkpointer?.run()
                    lastCheckpoint = GroupCommit.now()
                }
                guard group.isOpen, group.age >= w else { continue }
                try? pool.writeWithoutTransaction { db in if group.age >= w { try commitGroup(db) } }
            }
        }
        thread.name = "coffer-group-commit"
        thread.start()
    }

    /// Commits the open group and returns to one commit per `write`.
    public func disableGroupCommit() throws {
        guard group.window != nil else { return }
        try pool.writeWithoutTransaction { db in
            group.disable()
            try commitGroup(db)
            try db.execute(sql: "PRAGMA wal_autocheckpoint = 1000")
        }
    }

    /// Commits the open group transaction now (so other processes see it).
    public func commitPendingWrites() throws {
        guard group.isOpen else { return }
        try pool.writeWithoutTransaction { db in try commitGroup(db) }
    }

    /// True once after a group transaction failed to commit (its writes are gone); the owner
    /// must then reload its in-memory view from the store.
    public func takeLostGroup() -> Bool { group.takeLost() }

    /// Makes every committed transaction durable on the device (what fsync promises), after
    /// committing the open group.
    public func makeDurable() throws {
        try pool.writeWithoutTransaction { db in
            try commitGroup(db)
            try db.execute(sql: "PRAGMA synchronous = FULL")
            defer { try? db.execute(sql: "PRAGMA synchronous = NORMAL") }
            try db.inTransaction {
                try db.execute(sql: "INSERT INTO settings(key, value) VALUES ('durable', x'01') ON CONFLICT(key) DO UPDATE SET value = x'01'")
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
        try pool.writeWithoutTransaction { db in
            try commitGroup(db)
            var result = (manifests: 0, chunks: 0, compactedPacks: 0)
            var doomedFiles: [[UInt8]] = []
            try db.inTransaction(.immediate) {
                try db.execute(sql: """
                    DELETE FROM manifests WHERE digest NOT IN (
                        SELECT content_digest FROM base_files WHERE content_digest IS NOT NULL
                        UNION SELECT content_digest FROM local_files WHERE content_digest IS NOT NULL)
                    """)
                result.manifests = db.changesCount
                try db.execute(sql: "DELETE FROM manifest_chunks WHERE digest NOT IN (SELECT digest FROM manifests)")
                doomedFiles = try Data.fetchAll(db, sql: "SELECT id FROM chunks WHERE in_file = 1 AND id NOT IN (SELECT chunk_id FROM manifest_chunks)").map { [UInt8]($0) }
                try db.execute(sql: "DELETE FROM chunks WHERE id NOT IN (SELECT chunk_id FROM manifest_chunks)")
                result.chunks = db.changesCount
                return .commit
            }
            // Files go after the commit (a crash before leaves files no row names, swept next
            // time), together with files whose transaction never committed. A pack goes once
            // no row names any of its chunks; one still partly in use is kept, or rewritten if
            // it is mostly dead (`compactPacks`).
            for id in doomedFiles { files.remove(id) }
            let listed = Set(try Data.fetchAll(db, sql: "SELECT id FROM chunks WHERE in_file = 1").map { [UInt8]($0) })
            for id in files.allIDs() where !listed.contains(id) { files.remove(id) }
            // One pass over the packed chunks' rows serves both the sweep and the rewrite. A
            // row's pack id is its locator's first bytes, readable even if the rest is damaged.
            let packRows = try Row.fetchAll(db, sql: "SELECT id, sealed FROM chunks WHERE in_file = \(ChunkFiles.Place.pack.rawValue)")
            let named = Set(packRows.map { row -> [UInt8] in let sealed: Data = row[1]; return [UInt8](sealed.prefix(PackLocator.packIDBytes)) })
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
                    try db.execute(sql: "UPDATE chunks SET sealed = ? WHERE id = ? AND in_file = \(ChunkFiles.Place.pack.rawValue) AND sealed = ?",
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
            guard let read = try? chunks.map({ c in (id: c.id, old: c.locator, sealed: try files.readPacked(c.locator)) }) else { continue }
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
        try pool.writeWithoutTransaction { db in
            try commitGroup(db)
            try db.execute(sql: "PRAGMA wal_checkpoint(TRUNCATE)")
        }
    }
}

/// The state of group commit: whether it is on, and since when the writer's transaction is open.
/// Shared by the writer queue and the thread that closes idle groups.
final class GroupCommit: Sendable {
    private struct State {
        var window: Double?
        var openedAt: Double?
        var lost = false
        var generation: UInt64 = 0
    }
    private let state = Mutex(State())

    var window: Double? { state.withLock { $0.window } }
    var isOpen: Bool { state.withLock { $0.openedAt != nil } }
    /// Seconds since the open group began (0 if none).
    var age: Double { state.withLock { s in s.openedAt.map { Self.now() - $0 } ?? 0 } }

    func enable(window: Double) { state.withLock { $0.window = window } }
    func disable() { state.withLock { $0.window = nil } }
    func opened() { state.withLock { $0.openedAt = Self.now(); $0.generation &+= 1 } }
    /// Which group transaction is open (each one gets a new number), nil if none.
    var openGeneration: UInt64? { state.withLock { $0.openedAt == nil ? nil : $0.generation } }
    func closed(lost: Bool = false) {
        state.withLock { s in
            s.openedAt = nil
            if lost { s.lost = true }
        }
    }
    func takeLost() -> Bool {
        state.withLock { s in
            defer { s.lost = false }
            return s.lost
        }
    }

    static func now() -> Double {
        var ts = timespec()
        clock_gettime(CLOCK_MONOTONIC, &ts)
        return Double(ts.tv_sec) + Double(ts.tv_nsec) / 1e9
    }
}

/// Read access inside a transaction.
public struct StoreReader {
    let db: Database
    let files: ChunkFiles

    public func files(_ side: TreeSide) throws -> [StoredFile] {
        try Row.fetchAll(db.cachedStatement(sql: "SELECT record, version, content_version, server_deleted FROM \(side.table)")).map(Self.decode)
    }

    /// Every record that decodes, plus a description of each that does not (for fsck).
    public func filesLeniently(_ side: TreeSide) throws -> (files: [StoredFile], problems: [String]) {
        var files: [StoredFile] = []
        var problems: [String] = []
        for row in try Row.fetchAll(db.cachedStatement(sql: "SELECT id, record, version, content_version, server_deleted FROM \(side.table)")) {
            do { files.append(try Self.decode(row)) } catch {
                let id: Data = row["id"]
                problems.append("\(side == .base ? "base" : "local") record \(hexString([UInt8](id))) does not decode: \(error)")
            }
        }
        return (files, problems)
    }

    public func file(_ id: FileID, _ side: TreeSide) throws -> StoredFile? {
        try Row.fetchOne(db.cachedStatement(sql: "SELECT record, version, content_version, server_deleted FROM \(side.table) WHERE id = ?"), arguments: [Data(id.bytes)]).map(Self.decode)
    }

    /// Whether `side` has a record for `id`, without decoding it.
    public func exists(_ id: FileID, _ side: TreeSide) throws -> Bool {
        try Bool.fetchOne(db.cachedStatement(sql: "SELECT 1 FROM \(side.table) WHERE id = ?"), arguments: [Data(id.bytes)]) ?? false
    }

    /// The current view of one file: the local record if there is one, else base.
    public func current(_ id: FileID) throws -> StoredFile? {
        try file(id, .local) ?? file(id, .base)
    }

    static func decode(_ row: Row) throws -> StoredFile {
        let record: Data = row["record"]
        return StoredFile(signed: try SignedMetadata(decoding: [UInt8](record)), version: row["version"],
                          contentVersion: row["content_version"], serverDeleted: row["server_deleted"])
    }

    public func manifest(_ digest: [UInt8]) throws -> [UInt8]? {
        try Data.fetchOne(db.cachedStatement(sql: "SELECT sealed FROM manifests WHERE digest = ?"), arguments: [Data(digest)]).map { [UInt8]($0) }
    }

    public func chunk(_ id: [UInt8]) throws -> [UInt8]? {
        guard let row = try Row.fetchOne(db.cachedStatement(sql: "SELECT sealed, in_file FROM chunks WHERE id = ?"), arguments: [Data(id)]) else {
            return nil
        }
        let sealed: Data = row["sealed"]
        return try files.resolve(id, row: [UInt8](sealed), place: row["in_file"])
    }

    public func hasChunk(_ id: [UInt8]) throws -> Bool {
        try Bool.fetchOne(db.cachedStatement(sql: "SELECT 1 FROM chunks WHERE id = ?"), arguments: [Data(id)]) ?? false
    }

    public func setting(_ key: String) throws -> [UInt8]? {
        try Data.fetchOne(db.cachedStatement(sql: "SELECT value FROM settings WHERE key = ?"), arguments: [key]).map { [UInt8]($0) }
    }

    public func inode(of id: FileID) throws -> UInt64? {
        try Int64.fetchOne(db.cachedStatement(sql: "SELECT ino FROM inodes WHERE file_id = ?"), arguments: [Data(id.bytes)]).map { UInt64($0) }
    }

    public func fileID(ofInode ino: UInt64) throws -> FileID? {
        try Data.fetchOne(db.cachedStatement(sql: "SELECT file_id FROM inodes WHERE ino = ?"), arguments: [Int64(ino)])
            .flatMap { try? FileID(bytes: [UInt8]($0)) }
    }

    public func allInodes() throws -> [(UInt64, FileID)] {
        try Row.fetchAll(db.cachedStatement(sql: "SELECT ino, file_id FROM inodes")).compactMap { row in
            let ino: Int64 = row["ino"]
            let id: Data = row["file_id"]
            guard let f = try? FileID(bytes: [UInt8](id)) else { return nil }
            return (UInt64(ino), f)
        }
    }

    /// Ids changed by any writer after `seq`, and the newest sequence number.
    public func changes(after seq: Int64) throws -> (ids: Set<FileID>, last: Int64) {
        let rows = try Row.fetchAll(db.cachedStatement(sql: "SELECT seq, file_id FROM change_log WHERE seq > ? ORDER BY seq"), arguments: [seq])
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
        try Int64.fetchOne(db.cachedStatement(sql: "SELECT COALESCE(MAX(seq), 0) FROM change_log")) ?? 0
    }

    public func count(_ sql: String) throws -> Int { try Int.fetchOne(db, sql: sql) ?? 0 }

    /// Chunk ids listed by a manifest row (for integrity checks).
    public func chunkIDs(ofManifest digest: [UInt8]) throws -> [[UInt8]] {
        try Data.fetchAll(db.cachedStatement(sql: "SELECT chunk_id FROM manifest_chunks WHERE digest = ?"), arguments: [Data(digest)]).map { [UInt8]($0) }
    }

    public func allChunkIDs() throws -> [[UInt8]] {
        try Data.fetchAll(db.cachedStatement(sql: "SELECT id FROM chunks")).map { [UInt8]($0) }
    }

    public func allManifestDigests() throws -> [[UInt8]] {
        try Data.fetchAll(db.cachedStatement(sql: "SELECT digest FROM manifests")).map { [UInt8]($0) }
    }
}

/// Write access inside a transaction.
public struct StoreWriter {
    let db: Database
    let files: ChunkFiles
    private let logged = LoggedSequence()
    private let processLog: ProcessLog
    /// The group transaction this write is part of (see `Store.enableGroupCommit`), nil if none.
    /// While one group stays open no other process can write, so a caller that saw the change
    /// log's end inside the same group, and sees `lastLoggedInProcess` unchanged since, knows
    /// the log has not moved without asking.
    public let groupGeneration: UInt64?

    init(db: Database, files: ChunkFiles, processLog: ProcessLog, groupGeneration: UInt64?) {
        self.db = db
        self.files = files
        self.processLog = processLog
        self.groupGeneration = groupGeneration
    }

    /// The sequence number of the last change any writer of this store logged in this process
    /// (possibly since rolled back), nil before the first.
    public var lastLoggedInProcess: Int64? { processLog.value }
    public var reader: StoreReader { StoreReader(db: db, files: files) }

    /// The change-log sequence number of the last change this writer logged, if any: what
    /// `StoreReader.lastChange` would now answer, without the query.
    public var lastLogged: Int64? { logged.value }

    /// Stores a record. `previousDigest`, when the caller knows it (the vault's tree mirrors
    /// the row), spares the lookup of the content the row named before; a wrong guess can only
    /// leave a manifest for garbage collection, since `releaseManifest` checks every record.
    public func put(_ f: StoredFile, _ side: TreeSide, previousDigest: [UInt8]?? = .none) throws {
        let m = f.metadata
        // Only a document ever names content (the type of an id never changes), so only its
        // row can hold a manifest this write releases; a folder's update (every entry added
        // to or removed from it) skips the lookup.
        let previous: Data?
        if m.type != .document {
            previous = nil
        } else if case .some(let known) = previousDigest {
            previous = known.map { Data($0) }
        } else {
            previous = try Data.fetchOne(db.cachedStatement(sql: "SELECT content_digest FROM \(side.table) WHERE id = ?"), arguments: [Data(m.id.bytes)])
        }
        try db.cachedStatement(sql: """
            INSERT INTO \(side.table) (id, parent, record, content_digest, version, content_version, server_deleted) VALUES (?, ?, ?, ?, ?, ?, ?)
            ON CONFLICT(id) DO UPDATE SET parent = excluded.parent, record = excluded.record,
              content_digest = excluded.content_digest, version = excluded.version, content_version = excluded.content_version,
              server_deleted = excluded.server_deleted
            """).execute(arguments: [Data(m.id.bytes), Data(m.parent.bytes), Data(f.signed.encoded()),
                             m.contentDigest.map { Data($0) }, f.version, f.contentVersion, f.serverDeleted])
        if let previous, previous != m.contentDigest.map({ Data($0) }) { try releaseManifest(previous) }
        try logChange(m.id)
    }

    /// Deletes a record. Its manifest, like its chunks, stays until garbage collection (at
    /// mount and `coffer gc`): checking whether another record still names it and deleting the
    /// manifest and its chunk list was 8% of the daemon's CPU in `rm -rf` (perf), for rows of a
    /// few hundred bytes that collection removes anyway. A replaced version's manifest (`put`)
    /// is still dropped at once.
    public func remove(_ id: FileID, _ side: TreeSide) throws {
        try db.cachedStatement(sql: "DELETE FROM \(side.table) WHERE id = ?").execute(arguments: [Data(id.bytes)])
        try logChange(id)
    }

    /// Drops a manifest no record names any more. Its chunks stay until garbage collection,
    /// which alone can know that no writer is about to reference them again.
    func releaseManifest(_ digest: Data) throws {
        let used = try Bool.fetchOne(db.cachedStatement(sql: """
            SELECT EXISTS (SELECT 1 FROM base_files WHERE content_digest = ?1)
                OR EXISTS (SELECT 1 FROM local_files WHERE content_digest = ?1)
            """), arguments: [digest]) ?? true
        guard !used else { return }
        try db.cachedStatement(sql: "DELETE FROM manifests WHERE digest = ?").execute(arguments: [digest])
        try db.cachedStatement(sql: "DELETE FROM manifest_chunks WHERE digest = ?").execute(arguments: [digest])
    }

    public func logChange(_ id: FileID) throws {
        try db.cachedStatement(sql: "INSERT INTO change_log(file_id) VALUES (?)").execute(arguments: [Data(id.bytes)])
        logged.value = db.lastInsertedRowID
        processLog.value = db.lastInsertedRowID
    }

    /// Stores a sealed manifest and the chunk ids it lists (the latter for garbage collection).
    public func putManifest(digest: [UInt8], sealed: [UInt8], chunkIDs: [[UInt8]]) throws {
        try db.cachedStatement(sql: "INSERT OR IGNORE INTO manifests(digest, sealed) VALUES (?, ?)").execute(arguments: [Data(digest), Data(sealed)])
        for c in Set(chunkIDs.map { Data($0) }) {
            try db.cachedStatement(sql: "INSERT OR IGNORE INTO manifest_chunks(digest, chunk_id) VALUES (?, ?)").execute(arguments: [Data(digest), c])
        }
    }

    /// Stores a sealed chunk once (a chunk already there is kept). Large ones go to a file,
    /// written before its row (see `ChunkFiles`).
    public func putChunk(id: [UInt8], sealed: [UInt8]) throws {
        try putChunks([(id, sealed)])
    }

    /// Stores sealed chunks once each. Large ones stored in one call share one pack file:
    /// creating a file per 256 KiB chunk cost more CPU than sealing it on a filesystem that had
    /// just deleted many files (ext4 skips recently freed inodes one by one; 1.1 ms per create
    /// measured). Rows of small ones hold the bytes.
    public func putChunks(_ items: [([UInt8], [UInt8])]) throws {
        var large: [(id: [UInt8], sealed: [UInt8])] = []
        var seen: Set<[UInt8]> = []
        for (id, sealed) in items where seen.insert(id).inserted {
            if sealed.count < ChunkFiles.threshold {
                try db.cachedStatement(sql: "INSERT OR IGNORE INTO chunks(id, sealed) VALUES (?, ?)").execute(arguments: [Data(id), Data(sealed)])
            } else if try !reader.hasChunk(id) {
                large.append((id, sealed))
            }
        }
        guard !large.isEmpty else { return }
        let locators = try files.writePack(large.map(\.sealed))
        for (chunk, locator) in zip(large, locators) {
            try db.cachedStatement(sql: "INSERT INTO chunks(id, sealed, in_file) VALUES (?, ?, \(ChunkFiles.Place.pack.rawValue))")
                .execute(arguments: [Data(chunk.id), Data(locator.encoded)])
        }
    }

    public func setSetting(_ key: String, _ value: [UInt8]) throws {
        try db.execute(sql: "INSERT INTO settings(key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                       arguments: [key, Data(value)])
    }

    /// The inode for a file id, assigning the next number the first time. Stable for the life
    /// of the store, so the kernel and tools like rsync see the same numbers across remounts.
    public func inode(for id: FileID, fixed: UInt64? = nil) throws -> UInt64 {
        if let existing = try reader.inode(of: id) { return existing }
        if let fixed {
            try db.cachedStatement(sql: "INSERT INTO inodes(ino, file_id) VALUES (?, ?)").execute(arguments: [Int64(fixed), Data(id.bytes)])
            return fixed
        }
        return try newInode(for: id)
    }

    /// The inode for a file id this transaction just made up (a fresh random id has none yet, so
    /// the lookup `inode(for:)` starts with is skipped).
    public func newInode(for id: FileID) throws -> UInt64 {
        try db.cachedStatement(sql: "INSERT INTO inodes(file_id) VALUES (?)").execute(arguments: [Data(id.bytes)])
        return UInt64(db.lastInsertedRowID)
    }

    public func forgetInode(of id: FileID) throws {
        try db.cachedStatement(sql: "DELETE FROM inodes WHERE file_id = ?").execute(arguments: [Data(id.bytes)])
    }

    /// Drops old change-log entries; readers that fell further behind reload everything.
    public func trimChangeLog(keeping n: Int64) throws {
        try db.cachedStatement(sql: "DELETE FROM change_log WHERE seq <= (SELECT MAX(seq) FROM change_log) - ?").execute(arguments: [n])
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
