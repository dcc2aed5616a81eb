import Foundation
import Synchronization

@testable import CofferServerCore

/// A metadata storage that counts the file rows (records and index entries) its reads return,
/// so a test can show what one request reads. Forwards everything to an SQLite storage.
final class CountingStorage: MetadataStorage {
    let inner: SQLiteMetadataStorage
    let rows = Mutex(0)

    init(path: String) throws { inner = try SQLiteMetadataStorage(path: path) }

    /// The rows read by `body`.
    func count(_ body: () throws -> Void) rethrows -> Int {
        rows.withLock { $0 = 0 }
        try body()
        return rows.withLock { $0 }
    }

    func read<T>(_ body: (any MetadataReader) throws -> T) throws -> T {
        try inner.read { try body(CountingTransaction(reader: $0, writer: nil, storage: self)) }
    }

    func write<T>(_ body: (any MetadataWriter) throws -> T) throws -> T {
        try inner.write { try body(CountingTransaction(reader: $0, writer: $0, storage: self)) }
    }
}

struct CountingTransaction: MetadataWriter {
    let reader: any MetadataReader
    let writer: (any MetadataWriter)?
    let storage: CountingStorage

    private func counted<T>(_ n: Int, _ value: T) -> T {
        storage.rows.withLock { $0 += n }
        return value
    }

    private func w() throws -> any MetadataWriter {
        guard let writer else { throw StorageError("a write inside a read transaction") }
        return writer
    }

    func accountKeys() throws -> [Data] { try reader.accountKeys() }
    func account(key: Data) throws -> AccountRecord? { try reader.account(key: key) }
    func account(username: String) throws -> AccountRecord? { try reader.account(username: username) }
    func visitFiles(account: Data, since: Int64, afterID: Data?, _ body: (StoredFile) throws -> Bool) throws {
        try reader.visitFiles(account: account, since: since, afterID: afterID) { f in
            storage.rows.withLock { $0 += 1 }
            return try body(f)
        }
    }
    func file(id: Data) throws -> StoredFile? {
        let f = try reader.file(id: id)
        return counted(f == nil ? 0 : 1, f)
    }
    func rootID(account: Data) throws -> Data? {
        let r = try reader.rootID(account: account)
        return counted(r == nil ? 0 : 1, r)
    }
    func children(account: Data, parent: Data, liveOnly: Bool) throws -> [StoredChild] {
        let c = try reader.children(account: account, parent: parent, liveOnly: liveOnly)
        return counted(c.count, c)
    }
    func liveChildIDs(account: Data, parent: Data, nameMAC: Data) throws -> [Data] {
        let c = try reader.liveChildIDs(account: account, parent: parent, nameMAC: nameMAC)
        return counted(c.count, c)
    }
    func liveLinks(account: Data, target: Data) throws -> [Data] {
        let l = try reader.liveLinks(account: account, target: target)
        return counted(l.count, l)
    }
    func contactBook(account: Data) throws -> (sealed: Data?, revision: Int64) {
        try reader.contactBook(account: account)
    }
    func setContactBook(account: Data, sealed: Data, revision: Int64) throws {
        try w().setContactBook(account: account, sealed: sealed, revision: revision)
    }
    func feedLatest(account: Data) throws -> Int64 { try reader.feedLatest(account: account) }
    func hasFeedRow(account: Data, fileID: Data) throws -> Bool {
        try reader.hasFeedRow(account: account, fileID: fileID)
    }
    func writePause(account: Data, writer: Data) throws -> Int64? {
        try reader.writePause(account: account, writer: writer)
    }
    func pauseWrites(account: Data, writer: Data, until: Int64) throws {
        try w().pauseWrites(account: account, writer: writer, until: until)
    }
    func resumeWrites(account: Data, writer: Data) throws {
        try w().resumeWrites(account: account, writer: writer)
    }
    func writtenByOthers(account: Data) throws -> [(id: Data, writer: Data)] {
        let l = try reader.writtenByOthers(account: account)
        return counted(l.count, l)
    }
    func visitFeed(account: Data, since: Int64, afterID: Data?, _ body: (Data, Int64, Int64?) throws -> Bool) throws {
        try reader.visitFeed(account: account, since: since, afterID: afterID) { id, version, regrantedAt in
            storage.rows.withLock { $0 += 1 }
            return try body(id, version, regrantedAt)
        }
    }
    func fileCount(account: Data, liveOnly: Bool) throws -> Int64 {
        // A count walks every row it counts.
        let n = try reader.fileCount(account: account, liveOnly: liveOnly)
        return counted(Int(n), n)
    }
    func manifest(_ key: ManifestKey) throws -> Data? { try reader.manifest(key) }
    func hasManifest(_ key: ManifestKey) throws -> Bool { try reader.hasManifest(key) }
    func presentChunks(account: Data, ids: [Data]) throws -> Set<Data> {
        try reader.presentChunks(account: account, ids: ids)
    }
    func recountedUsage(account: Data) throws -> Int64 { try reader.recountedUsage(account: account) }
    func unreferencedManifests(createdBefore before: Int64) throws -> [ManifestKey] {
        try reader.unreferencedManifests(createdBefore: before)
    }
    func unreferencedChunks(createdBefore before: Int64) throws -> [ChunkKey] {
        try reader.unreferencedChunks(createdBefore: before)
    }
    func allChunkKeys() throws -> Set<ChunkKey> { try reader.allChunkKeys() }
    func inlineChunk(_ key: ChunkKey) throws -> Data? { try reader.inlineChunk(key) }
    func chunkPlacement(account: Data, ids: [Data]) throws -> [Data: (size: Int64, inline: Bool)] {
        try reader.chunkPlacement(account: account, ids: ids)
    }

    func insertAccount(_ account: AccountRecord) throws -> Bool { try w().insertAccount(account) }
    func lockAccount(key: Data) throws -> AccountRecord? { try w().lockAccount(key: key) }
    func setAccountVersion(key: Data, version: Int64) throws { try w().setAccountVersion(key: key, version: version) }
    func setCard(key: Data, card: Data) throws { try w().setCard(key: key, card: card) }
    func nextVersion() throws -> Int64 { try w().nextVersion() }
    func putFile(_ file: StoredFile) throws { try w().putFile(file) }
    func putFeed(account: Data, fileID: Data, version: Int64, regranted: Bool) throws {
        try w().putFeed(account: account, fileID: fileID, version: version, regranted: regranted)
    }
    func markServerDeleted(id: Data, account: Data, version: Int64) throws -> Data? {
        try w().markServerDeleted(id: id, account: account, version: version)
    }
    func putManifest(_ key: ManifestKey, sealed: Data, chunkIDs: [Data], createdAt: Int64) throws -> Bool {
        try w().putManifest(key, sealed: sealed, chunkIDs: chunkIDs, createdAt: createdAt)
    }
    func deleteManifest(_ key: ManifestKey) throws -> [Data] { try w().deleteManifest(key) }
    func insertChunk(_ key: ChunkKey, size: Int64, createdAt: Int64, inline: Data?) throws -> Bool {
        try w().insertChunk(key, size: size, createdAt: createdAt, inline: inline)
    }
    func deleteChunkIfUnreferenced(_ key: ChunkKey) throws -> Bool { try w().deleteChunkIfUnreferenced(key) }
    func addUsage(account: Data, bytes: Int64) throws { try w().addUsage(account: account, bytes: bytes) }
    func insertInvite(hash: Data, createdAt: Int64) throws { try w().insertInvite(hash: hash, createdAt: createdAt) }
    func consumeInvite(hash: Data) throws -> Bool { try w().consumeInvite(hash: hash) }
}
