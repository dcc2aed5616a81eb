import CofferProtocol
import Foundation

/// An account as the server stores it. `version` is the highest metadata version of any of the
/// account's files (0 before its first upsert); it doubles as the key of the in-memory tree cache.
public struct AccountRecord: Sendable, Equatable {
    public var key: Data
    public var username: String
    public var boxKey: Data
    public var version: Int64
    public var bytesUsed: Int64
    public init(key: Data, username: String, boxKey: Data, version: Int64 = 0, bytesUsed: Int64 = 0) {
        self.key = key; self.username = username; self.boxKey = boxKey; self.version = version; self.bytesUsed = bytesUsed
    }
}

/// A file record as the server stores it: the client's signed bytes untouched, plus what the
/// server derives from them. `deleted` is the effective state (the record's own flag or
/// `serverDeleted`); `digest` is the record's content digest (documents only).
public struct StoredFile: Sendable, Equatable {
    public var id: Data
    public var account: Data
    public var record: Data
    public var version: Int64
    public var contentVersion: Int64
    public var serverDeleted: Bool
    public var deleted: Bool
    public var digest: Data?
    public init(id: Data, account: Data, record: Data, version: Int64, contentVersion: Int64,
                serverDeleted: Bool, deleted: Bool, digest: Data?) {
        self.id = id; self.account = account; self.record = record; self.version = version
        self.contentVersion = contentVersion; self.serverDeleted = serverDeleted; self.deleted = deleted; self.digest = digest
    }

    public var wire: ServerFile {
        ServerFile(record: record, version: version, contentVersion: contentVersion, serverDeleted: serverDeleted)
    }
}

/// Names one stored manifest.
public struct ManifestKey: Sendable, Hashable {
    public var account: Data
    public var fileID: Data
    public var digest: Data
    public init(account: Data, fileID: Data, digest: Data) { self.account = account; self.fileID = fileID; self.digest = digest }
}

/// Names one stored chunk. Chunks live in a per-account namespace: ids are chosen by clients
/// (keyed hashes the server cannot check), so accounts never share, see or delete each other's.
public struct ChunkKey: Sendable, Hashable {
    public var account: Data
    public var id: Data
    public init(account: Data, id: Data) { self.account = account; self.id = id }
}

/// Failures of a storage backend itself (I/O, corruption). The logic maps them to 500s; client
/// mistakes never reach a backend as errors.
public struct StorageError: Error, CustomStringConvertible, Sendable {
    public var description: String
    public init(_ description: String) { self.description = description }
}

/// The metadata store: accounts, file records, the global version counter, manifests with the
/// chunks they list, and per-account usage. (Request nonces live in a `NonceStore` of their own.)
///
/// Everything goes through `read`/`write` transactions, so the logic can make one upsert batch
/// atomic (preconditions read, invariants checked, records and manifests written, all or
/// nothing). Implementations:
/// - `SQLiteMetadataStorage` (the embedded default): GRDB `DatabasePool` in WAL mode; SQLite
///   serialises write transactions, so `lockAccount` needs no extra locking.
/// - A PostgreSQL implementation would open a transaction per `write` (SERIALIZABLE, or READ
///   COMMITTED with `SELECT … FOR UPDATE` on the account row in `lockAccount`, which is what
///   serialises concurrent batches of one account across server processes), take the global
///   version from a sequence in `nextVersion`. The closures are
///   synchronous; an async driver would run them on its own thread or block on a connection.
/// Nothing outside the storage implementations knows SQL.
public protocol MetadataStorage: Sendable {
    func read<T>(_ body: (any MetadataReader) throws -> T) throws -> T
    func write<T>(_ body: (any MetadataWriter) throws -> T) throws -> T
}

public protocol MetadataReader {
    /// Every account's key (for the audit).
    func accountKeys() throws -> [Data]
    func account(key: Data) throws -> AccountRecord?
    /// The account whose username has the same `Username.key` as `username`.
    func account(username: String) throws -> AccountRecord?
    /// Files of `account` with version > `since`, ordered by (version, id), at most `limit`.
    func files(account: Data, since: Int64, limit: Int) throws -> [StoredFile]
    func file(id: Data) throws -> StoredFile?
    func fileCount(account: Data, liveOnly: Bool) throws -> Int64
    func manifest(_ key: ManifestKey) throws -> Data?
    func hasManifest(_ key: ManifestKey) throws -> Bool
    /// Which of these chunks the metadata store knows (and so the content store holds).
    func presentChunks(account: Data, ids: [Data]) throws -> Set<Data>
    /// Manifests that no current (not deleted) document record names, created before `before`
    /// (ms since the epoch).
    func unreferencedManifests(createdBefore before: Int64) throws -> [ManifestKey]
    /// Chunks that no stored manifest lists, created before `before`.
    func unreferencedChunks(createdBefore before: Int64) throws -> [ChunkKey]
    func allChunkKeys() throws -> Set<ChunkKey>
}

public protocol MetadataWriter: MetadataReader {
    /// Returns false when the key, or a username with the same `Username.key`, is taken.
    func insertAccount(_ account: AccountRecord) throws -> Bool
    /// Locks the account against concurrent writers for the rest of the transaction and returns
    /// its current state.
    func lockAccount(key: Data) throws -> AccountRecord?
    func setAccountVersion(key: Data, version: Int64) throws
    /// Increments and returns the server-wide metadata version counter.
    func nextVersion() throws -> Int64
    func putFile(_ file: StoredFile) throws
    /// Stores a manifest and the chunk ids it lists; returns false if it was already stored.
    func putManifest(_ key: ManifestKey, sealed: Data, chunkIDs: [Data], createdAt: Int64) throws -> Bool
    /// Removes a manifest; returns the chunk ids it listed (empty if it was not stored).
    func deleteManifest(_ key: ManifestKey) throws -> [Data]
    /// Records a chunk; returns false if it was already recorded.
    func insertChunk(_ key: ChunkKey, size: Int64, createdAt: Int64) throws -> Bool
    /// Forgets a chunk if no stored manifest of its account lists it; returns whether it did.
    func deleteChunkIfUnreferenced(_ key: ChunkKey) throws -> Bool
    /// Adds to (or, negative, subtracts from) an account's stored bytes. The manifest and chunk
    /// calls above keep usage themselves (sealed manifest bytes plus chunk bytes).
    func addUsage(account: Data, bytes: Int64) throws
}

/// The content store: sealed chunk bytes by (account, chunk id). Writes are atomic (a reader
/// sees all of a chunk or none). Implementations: `DirectoryContentStorage` (the embedded
/// default); an S3-compatible store would map a key to `chunks/<account hex>/<id hex>`, `put` to
/// PutObject (atomic by nature), `list` to ListObjectsV2 with LastModified.
public protocol ContentStorage: Sendable {
    func put(_ key: ChunkKey, bytes: [UInt8]) throws
    func get(_ key: ChunkKey) throws -> [UInt8]?
    func has(_ key: ChunkKey) throws -> Bool
    func delete(_ key: ChunkKey) throws
    /// Every stored chunk with its modification time (ms since the epoch), for cleanup.
    func list(_ each: (ChunkKey, Int64) throws -> Void) throws
}
