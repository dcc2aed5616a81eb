import CofferProtocol
import Foundation

/// An account as the server stores it. `version` is the highest metadata version of any of the
/// account's files (0 before its first upsert). `bytesUsed` and `liveFiles` are kept by the
/// storage as records come and go, so answering `GET /v1/usage` counts nothing.
public struct AccountRecord: Sendable, Equatable {
    public var key: Data
    public var username: String
    public var boxKey: Data
    public var version: Int64
    public var bytesUsed: Int64
    /// Files whose `deleted` is false.
    public var liveFiles: Int64
    /// The account's `KeyCard` signature, verified when it was stored.
    public var card: Data?
    public init(
        key: Data, username: String, boxKey: Data, version: Int64 = 0, bytesUsed: Int64 = 0, liveFiles: Int64 = 0,
        card: Data? = nil
    ) {
        self.key = key
        self.username = username
        self.boxKey = boxKey
        self.version = version
        self.bytesUsed = bytesUsed
        self.liveFiles = liveFiles
        self.card = card
    }
}

/// A file record as the server stores it: the client's signed bytes untouched, plus what the
/// server derives from them. `deleted` is the effective state (the record's own flag or
/// `serverDeleted`); `digest` is the record's content digest (documents only); `parent` (nil for
/// the root, which is its own parent) and `nameMAC` are the record's, kept apart so the tree can
/// be read through an index without decoding records (`children`, `liveChildIDs`).
public struct StoredFile: Sendable, Equatable {
    public var id: Data
    public var account: Data
    public var record: Data
    public var version: Int64
    public var contentVersion: Int64
    public var serverDeleted: Bool
    public var deleted: Bool
    public var digest: Data?
    public var parent: Data?
    public var nameMAC: Data
    /// A link's target (the record's `linkTarget`), kept apart so an account's links to one
    /// target are found through an index (`liveLinks`).
    public var linkTarget: Data?
    /// The account that wrote the record when it is not the tree's owner (a grantee), kept apart
    /// so the records grantees wrote in one tree are found through an index
    /// (`writtenByOthers`); nil for the owner's own records.
    public var writer: Data?
    public init(
        id: Data, account: Data, record: Data, version: Int64, contentVersion: Int64,
        serverDeleted: Bool, deleted: Bool, digest: Data?, parent: Data?, nameMAC: Data, linkTarget: Data? = nil,
        writer: Data? = nil
    ) {
        self.id = id
        self.account = account
        self.record = record
        self.version = version
        self.contentVersion = contentVersion
        self.serverDeleted = serverDeleted
        self.deleted = deleted
        self.digest = digest
        self.parent = parent
        self.nameMAC = nameMAC
        self.linkTarget = linkTarget
        self.writer = writer
    }

    public var wire: ServerFile {
        ServerFile(record: record, version: version, contentVersion: contentVersion, serverDeleted: serverDeleted)
    }
}

/// A child of a folder as the storage's index on (account, parent, deleted, name MAC) holds it:
/// what walks of the tree need, read without the record.
public struct StoredChild: Sendable, Equatable {
    public var id: Data
    public var deleted: Bool
    public var nameMAC: Data
    public init(id: Data, deleted: Bool, nameMAC: Data) {
        self.id = id
        self.deleted = deleted
        self.nameMAC = nameMAC
    }
}

/// Names one stored manifest.
public struct ManifestKey: Sendable, Hashable {
    public var account: Data
    public var fileID: Data
    public var digest: Data
    public init(account: Data, fileID: Data, digest: Data) {
        self.account = account
        self.fileID = fileID
        self.digest = digest
    }
}

/// Names one stored chunk. Chunks live in a per-account namespace: ids are chosen by clients
/// (keyed hashes the server cannot check), so accounts never share, see or delete each other's.
public struct ChunkKey: Sendable, Hashable {
    public var account: Data
    public var id: Data
    public init(account: Data, id: Data) {
        self.account = account
        self.id = id
    }
}

/// How stored bytes count against an account's quota (docs/PROTOCOL.md, "Quota"). Every stored
/// object counts once, at the size it is stored at now, and never less than a fixed overhead, so
/// empty or tiny objects are not free: a metadata row (a file record or a sealed manifest) counts
/// at least `minimumRowBytes`; a chunk, one file of the content store (which takes at least one
/// filesystem block whatever its length), at least `minimumChunkBytes`.
public enum QuotaRule {
    public static let minimumRowBytes: Int64 = 256
    public static let minimumChunkBytes: Int64 = 4096

    public static func counted(row bytes: Int64) -> Int64 { max(bytes, minimumRowBytes) }
    public static func counted(chunk bytes: Int64) -> Int64 { max(bytes, minimumChunkBytes) }
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

/// Reads are indexed lookups sized by what they return, never a walk of an account (but for
/// the audit's and cleanup's, which say so): an upsert reads the records its batch touches, their
/// ancestors and their same-name siblings (`file`, `liveChildIDs`), and a pull one page of
/// records by version (`visitFiles`), whatever the size of the account's tree. Each query is one
/// plain indexed SQL statement, so a PostgreSQL implementation keeps the same costs.
public protocol MetadataReader {
    /// Every account's key (for the audit).
    func accountKeys() throws -> [Data]
    func account(key: Data) throws -> AccountRecord?
    /// The account whose username has the same `Username.key` as `username`.
    func account(username: String) throws -> AccountRecord?
    /// Visits the files of `account` after the cursor in (version, id) order: with `afterID`,
    /// those with (version, id) > (since, afterID); without, those with version > since. Rows are
    /// read one at a time (records may be megabytes each); `body` returns false to stop.
    func visitFiles(account: Data, since: Int64, afterID: Data?, _ body: (StoredFile) throws -> Bool) throws
    func file(id: Data) throws -> StoredFile?
    /// The id of `account`'s root: the file stored with no parent.
    func rootID(account: Data) throws -> Data?
    /// The files of `account` whose parent is `parent` (the root is nobody's child); with
    /// `liveOnly`, those not `deleted`. Read from the index alone.
    func children(account: Data, parent: Data, liveOnly: Bool) throws -> [StoredChild]
    /// The ids of the files of `account` under `parent` with this name MAC that are not
    /// `deleted`: the path-conflict lookup. Deleted ones are left out, since on the server a
    /// deleted file never comes back and a name saved over many times leaves many of them.
    func liveChildIDs(account: Data, parent: Data, nameMAC: Data) throws -> [Data]
    /// The live links of `account` whose target is `target` (read from the index alone).
    func liveLinks(account: Data, target: Data) throws -> [Data]
    /// The files of `account`'s tree whose record another account wrote, with that account
    /// (read from the index alone): few, as the owner's devices sign what grantees write as
    /// their own once they pull it.
    func writtenByOthers(account: Data) throws -> [(id: Data, writer: Data)]
    /// The account's contact book as its devices sealed it, and its revision (0 and nil before
    /// the first).
    func contactBook(account: Data) throws -> (sealed: Data?, revision: Int64)
    /// The newest version in `account`'s share feed (0 when it has none).
    func feedLatest(account: Data) throws -> Int64
    /// Whether `account`'s feed has a row for `fileID`: it was told of that file before.
    func hasFeedRow(account: Data, fileID: Data) throws -> Bool
    /// Until when (ms) `writer`'s changes to `account`'s tree are held back while its owner ends
    /// the writer's access (`CofferServer.checkNoOrphanedWrites`); nil if they are not.
    func writePause(account: Data, writer: Data) throws -> Int64?
    /// Visits the rows of `account`'s share feed after the cursor, in (version, file id) order,
    /// as `visitFiles` does its own files: each row names a file of another account's tree that
    /// changed, or came into or went out of view, at that version, and the version at which the
    /// account was last granted it again (`regrantedAt`, nil if never). `body` returns false to
    /// stop.
    func visitFeed(
        account: Data, since: Int64, afterID: Data?,
        _ body: (_ fileID: Data, _ version: Int64, _ regrantedAt: Int64?) throws -> Bool
    ) throws
    /// Counts the account's files afresh (the audit; `AccountRecord.liveFiles` keeps the count).
    func fileCount(account: Data, liveOnly: Bool) throws -> Int64
    func manifest(_ key: ManifestKey) throws -> Data?
    func hasManifest(_ key: ManifestKey) throws -> Bool
    /// Which of these chunks the metadata store knows (and so the content store holds).
    func presentChunks(account: Data, ids: [Data]) throws -> Set<Data>
    /// The account's usage counted afresh from what is stored (`QuotaRule`), for the audit.
    func recountedUsage(account: Data) throws -> Int64
    /// Manifests that no current (not deleted) document record names, created before `before`
    /// (ms since the epoch).
    func unreferencedManifests(createdBefore before: Int64) throws -> [ManifestKey]
    /// Chunks that no stored manifest lists, created before `before`.
    func unreferencedChunks(createdBefore before: Int64) throws -> [ChunkKey]
    /// Every chunk whose bytes are in the content store (not inline, see `insertChunk`): what
    /// the audit checks is stored and cleanup keeps.
    func allChunkKeys() throws -> Set<ChunkKey>
    /// The bytes of a chunk kept inline in the metadata store; nil when it is not stored or is
    /// in the content store.
    func inlineChunk(_ key: ChunkKey) throws -> Data?
    /// The stored length of each of these chunks the metadata store knows, and whether it is
    /// kept inline.
    func chunkPlacement(account: Data, ids: [Data]) throws -> [Data: (size: Int64, inline: Bool)]
}

public protocol MetadataWriter: MetadataReader {
    /// Returns false when the key, or a username with the same `Username.key`, is taken.
    func insertAccount(_ account: AccountRecord) throws -> Bool
    /// Locks the account against concurrent writers for the rest of the transaction and returns
    /// its current state.
    func lockAccount(key: Data) throws -> AccountRecord?
    func setAccountVersion(key: Data, version: Int64) throws
    /// Stores the account's key card signature (verified by the caller).
    func setCard(key: Data, card: Data) throws
    /// Increments and returns the server-wide metadata version counter.
    func nextVersion() throws -> Int64
    /// Stores a record (replacing the file's previous one); keeps usage: the file counts once,
    /// at its current record's size (`QuotaRule`), and `liveFiles`.
    func putFile(_ file: StoredFile) throws
    /// Tells `account` (a grantee) that a file of another account's tree changed at `version`:
    /// its feed row for the file, one per file, moves to that version.
    /// Moves `account`'s feed row of `fileID` to `version`; with `regranted`, also notes that the
    /// account was granted the file again at that version (kept until the next time).
    func putFeed(account: Data, fileID: Data, version: Int64, regranted: Bool) throws
    func setContactBook(account: Data, sealed: Data, revision: Int64) throws
    /// Holds `writer`'s changes to `account`'s tree back until `until` (ms).
    func pauseWrites(account: Data, writer: Data, until: Int64) throws
    /// Ends the hold on `writer`'s changes to `account`'s tree, if any.
    func resumeWrites(account: Data, writer: Data) throws
    /// Marks a file of `account` deleted by the server (`serverDeleted` and `deleted` set,
    /// `version` given, the record untouched) and returns its content digest, whose manifest it
    /// no longer needs; nil when it names none or `account` has no such file (then nothing changes).
    func markServerDeleted(id: Data, account: Data, version: Int64) throws -> Data?
    /// Stores a manifest and the chunk ids it lists; returns false if it was already stored.
    func putManifest(_ key: ManifestKey, sealed: Data, chunkIDs: [Data], createdAt: Int64) throws -> Bool
    /// Removes a manifest; returns the chunk ids it listed (empty if it was not stored).
    func deleteManifest(_ key: ManifestKey) throws -> [Data]
    /// Records a chunk; returns false if it was already recorded. With `inline`, its bytes are
    /// kept in the metadata store itself (small chunks: written with the transaction, no file
    /// and no fsync of their own, docs/SERVER.md); without, they are in the content store.
    func insertChunk(_ key: ChunkKey, size: Int64, createdAt: Int64, inline: Data?) throws -> Bool
    /// Forgets a chunk if no stored manifest of its account lists it; returns whether it did.
    func deleteChunkIfUnreferenced(_ key: ChunkKey) throws -> Bool
    /// Adds to (or, negative, subtracts from) an account's stored bytes. The record, manifest and
    /// chunk calls above keep usage themselves, by `QuotaRule`.
    func addUsage(account: Data, bytes: Int64) throws
    /// Stores the hash of a new single-use invite code.
    func insertInvite(hash: Data, createdAt: Int64) throws
    /// Removes an invite by its hash; returns whether it existed (false: unknown or already used).
    func consumeInvite(hash: Data) throws -> Bool
}

/// A chunk written durably under a name of its own, not yet visible under its key. `location`
/// belongs to the storage that staged it.
public struct StagedChunk: Sendable {
    public let key: ChunkKey
    public let location: String
    public init(key: ChunkKey, location: String) {
        self.key = key
        self.location = location
    }
}

/// Reads one stored chunk piece by piece (so answering never holds more than a piece).
public protocol ChunkReading {
    /// Up to `count` next bytes; empty at the end.
    func read(upTo count: Int) throws -> [UInt8]
}

/// The content store: sealed chunk bytes by (account, chunk id). A chunk is written in two steps
/// so that two uploads of one id never store it twice and the metadata store only ever records
/// a chunk whose bytes are durable: `stage` writes and syncs the bytes under a unique temporary
/// name; the server then, inside the metadata transaction that records the chunk, `publish`es
/// it (atomically into place, durable when it returns); a staged chunk that loses a race or is
/// refused is `discard`ed, which touches nothing but its own temporary. Readers see all of a
/// chunk or none. Implementations: `DirectoryContentStorage` (the embedded default); an
/// S3-compatible store would stage to a unique temporary key, publish with CopyObject (atomic,
/// durable on success) and delete the temporary, and `list` with ListObjectsV2.
public protocol ContentStorage: Sendable {
    func stage(_ key: ChunkKey, bytes: [UInt8]) throws -> StagedChunk
    func publish(_ staged: StagedChunk) throws
    func discard(_ staged: StagedChunk)
    func get(_ key: ChunkKey) throws -> [UInt8]?
    /// A reader of the chunk, or nil if it is not stored.
    func open(_ key: ChunkKey) throws -> (any ChunkReading)?
    func has(_ key: ChunkKey) throws -> Bool
    func delete(_ key: ChunkKey) throws
    /// Every stored chunk with its modification time (ms since the epoch), for cleanup.
    func list(_ each: (ChunkKey, Int64) throws -> Void) throws
}

extension ContentStorage {
    /// Stages and publishes at once (tools and tests; the server publishes inside a transaction).
    public func put(_ key: ChunkKey, bytes: [UInt8]) throws {
        let staged = try stage(key, bytes: bytes)
        do { try publish(staged) } catch {
            discard(staged)
            throw error
        }
    }
}
