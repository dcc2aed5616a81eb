import CofferCrypto
import CofferModel
import CofferProtocol
import Foundation
import Synchronization

/// The server's semantics, independent of HTTP: every endpoint of docs/PROTOCOL.md as a method
/// taking the authenticated caller (its public key) and the decoded body. Stateless apart from
/// caches, so several processes can share one `MetadataStorage` and `ContentStorage`.
///
/// Every public method throws only `ServerError` (4xx for client mistakes, 500 for storage
/// failures).
public final class CofferServer: Sendable {
    public let metadata: any MetadataStorage
    public let content: any ContentStorage
    public let quotaBytes: Int64
    /// This server's id (`RequestSigning`): signatures made for another server do not verify here.
    public let identity: [UInt8]
    /// Milliseconds since the epoch; injectable for tests.
    let clock: @Sendable () -> Int64
    let trees: Mutex<[Data: CachedTree]> = Mutex([:])
    let lastNoncePurge: Mutex<Int64> = Mutex(0)
    static let maxCachedTrees = 256
    /// Largest `chunks/get` response.
    public static let maxChunkResponseBytes = 256 * 1024 * 1024

    public static let defaultQuotaBytes: Int64 = 10 * 1024 * 1024 * 1024

    public init(metadata: any MetadataStorage, content: any ContentStorage, quotaBytes: Int64 = CofferServer.defaultQuotaBytes,
                identity: [UInt8] = randomBytes(RequestSigning.serverIDBytes),
                clock: @escaping @Sendable () -> Int64 = { Int64(Date().timeIntervalSince1970 * 1000) }) {
        self.metadata = metadata
        self.content = content
        self.quotaBytes = quotaBytes
        self.identity = identity
        self.clock = clock
    }

    /// The embedded defaults under `directory`: `metadata.sqlite` and `chunks/`.
    public static func open(directory: URL, quotaBytes: Int64 = CofferServer.defaultQuotaBytes) throws -> CofferServer {
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let meta = try SQLiteMetadataStorage(path: directory.appendingPathComponent("metadata.sqlite").path)
        let chunks = try DirectoryContentStorage(root: directory.appendingPathComponent("chunks", isDirectory: true),
                                                 tmp: directory.appendingPathComponent("tmp", isDirectory: true))
        return CofferServer(metadata: meta, content: chunks, quotaBytes: quotaBytes,
                            identity: try identity(in: directory))
    }

    /// The server's id, kept in `DIR/server.id` (made once, mode 0600, written whole then renamed),
    /// so it survives restarts and travels with backups of the data directory; several processes
    /// serving one storage share the directory, and so the id.
    static func identity(in directory: URL) throws -> [UInt8] {
        let path = directory.appendingPathComponent("server.id").path
        if let data = FileManager.default.contents(atPath: path) {
            guard let id = RequestSigning.unhex(String(decoding: data, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)),
                  id.count == RequestSigning.serverIDBytes else {
                throw StorageError("\(path) does not hold a server id (\(RequestSigning.serverIDBytes * 2) hex digits)")
            }
            return id
        }
        let id = randomBytes(RequestSigning.serverIDBytes)
        let tmp = path + ".tmp-\(getpid())"
        guard FileManager.default.createFile(atPath: tmp, contents: Data((RequestSigning.hex(id) + "\n").utf8),
                                             attributes: [.posixPermissions: 0o600]) else {
            throw StorageError("cannot write \(tmp)")
        }
        // Two processes starting at once: link refuses to replace, so the first id stays and both read it.
        if link(tmp, path) != 0 && errno != EEXIST { unlink(tmp); throw StorageError("cannot create \(path)") }
        unlink(tmp)
        return try identity(in: directory)
    }

    public var now: Int64 { clock() }

    // MARK: - Error plumbing

    func guarded<T>(_ body: () throws -> T) throws(ServerError) -> T {
        do { return try body() } catch let e as ServerError { throw e } catch { throw .internal("storage failure: \(error)") }
    }

    // MARK: - Authentication

    /// Checks a request's four signing headers and records its nonce. Returns the caller's key.
    /// Does not require the account to exist (account creation is signed by the new key).
    public func authenticate(method: String, path: String, body: [UInt8], account: String?, timestamp: String?,
                             nonce: String?, signature: String?) throws(ServerError) -> Data {
        guard let account, let timestamp, let nonce, let signature else {
            throw .unauthorized("missing signing headers (\(RequestSigning.accountHeader), \(RequestSigning.timestampHeader), \(RequestSigning.nonceHeader), \(RequestSigning.signatureHeader))")
        }
        guard let keyBytes = RequestSigning.unhex(account), let key = try? PublicSigningKey(bytes: keyBytes) else {
            throw .unauthorized("\(RequestSigning.accountHeader) is not a hex public key")
        }
        guard let ts = Int64(timestamp) else { throw .unauthorized("\(RequestSigning.timestampHeader) is not a number") }
        let current = now
        guard abs(current.subtractingReportingOverflow(ts).partialValue) <= API.maxClockSkewMillis, ts > 0 else {
            throw .unauthorized("request timestamp is more than 5 minutes from the server's clock")
        }
        guard nonce.utf8.count >= 16, nonce.utf8.count <= 128, let nonceBytes = RequestSigning.unhex(nonce), !nonceBytes.isEmpty else {
            throw .unauthorized("\(RequestSigning.nonceHeader) must be 8 to 64 bytes of hex")
        }
        guard let sig = RequestSigning.unhex(signature), sig.count == 64 else {
            throw .unauthorized("\(RequestSigning.signatureHeader) is not a hex signature")
        }
        guard RequestSigning.verify(account: key, server: identity, method: method, path: path, body: body, timestamp: ts, nonce: nonce,
                                    signature: sig) else {
            throw .unauthorized("request signature does not verify")
        }
        let keyData = Data(keyBytes)
        let purge = lastNoncePurge.withLock { last -> Bool in
            if current - last > 60_000 { last = current; return true }
            return false
        }
        let fresh = try guarded {
            try metadata.write { tx in
                if purge { try tx.purgeNonces(expiredBefore: current - 1000) }
                return try tx.insertNonce(account: keyData, nonce: nonce.lowercased(), expiresAt: ts + API.maxClockSkewMillis + 1000)
            }
        }
        guard fresh else { throw .unauthorized("request nonce was already used (replay)") }
        return keyData
    }

    /// The caller's account; 401 if the key has no account.
    public func requireAccount(_ caller: Data) throws(ServerError) -> AccountRecord {
        guard let a = try guarded({ try metadata.read { try $0.account(key: caller) } }) else {
            throw .unauthorized("no account has this key")
        }
        return a
    }

    // MARK: - Accounts

    public static func isValidUsername(_ name: String) -> Bool {
        let allowed = Set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-@+".utf8)
        let u = Array(name.utf8)
        return !u.isEmpty && u.count <= 64 && u.allSatisfy { allowed.contains($0) }
    }

    public func createAccount(caller: Data, _ req: CreateAccountRequest) throws(ServerError) -> AccountResponse {
        guard req.signingKey.count == 32, req.boxKey.count == 32 else { throw .badRequest("signingKey and boxKey must be 32 bytes each") }
        guard req.signingKey == caller else { throw .forbidden("an account is created by a request signed with its own key") }
        guard Self.isValidUsername(req.username) else {
            throw .badRequest("a username has 1 to 64 characters from A–Z, a–z, 0–9 and . _ - @ +")
        }
        let record = AccountRecord(key: req.signingKey, username: req.username, boxKey: req.boxKey)
        let inserted = try guarded { try metadata.write { try $0.insertAccount(record) } }
        guard inserted else { throw .conflict("that username or key already has an account") }
        return AccountResponse(username: req.username, signingKey: req.signingKey, boxKey: req.boxKey)
    }

    public func lookup(username: String) throws(ServerError) -> AccountResponse {
        guard Self.isValidUsername(username),
              let a = try guarded({ try metadata.read { try $0.account(username: username) } }) else {
            throw .notFound("no such account")
        }
        return AccountResponse(username: a.username, signingKey: a.key, boxKey: a.boxKey)
    }

    // MARK: - Usage

    public func usage(caller: Data) throws(ServerError) -> UsageResponse {
        let (account, files) = try guarded {
            try metadata.read { tx in (try tx.account(key: caller), try tx.fileCount(account: caller, liveOnly: true)) }
        }
        guard let account else { throw .unauthorized("no account has this key") }
        return UsageResponse(files: files, bytes: account.bytesUsed, quotaBytes: quotaBytes)
    }

    // MARK: - Updates

    public func updates(caller: Data, since: Int64) throws(ServerError) -> UpdatesResponse {
        guard since >= 0 else { throw .badRequest("since must not be negative") }
        let pageSize = API.updatesPageSize
        return try guarded {
            try metadata.read { tx in
                var files = try tx.files(account: caller, since: since, limit: pageSize + 1)
                guard files.count > pageSize else {
                    return UpdatesResponse(files: files.map(\.wire), latest: files.last?.version ?? since, more: false)
                }
                // Pages end on a version boundary (the cursor is a version), so a page never splits a batch.
                let firstLeftOut = files[pageSize].version
                files.removeLast()
                if files.last?.version == firstLeftOut {
                    let trimmed = files.filter { $0.version < firstLeftOut }
                    if trimmed.isEmpty {
                        // One batch larger than a page travels whole.
                        files = try tx.files(account: caller, since: since, limit: Int(Int32.max)).filter { $0.version == firstLeftOut }
                    } else {
                        files = trimmed
                    }
                }
                let latest = files.last?.version ?? since
                let more = try !tx.files(account: caller, since: latest, limit: 1).isEmpty
                return UpdatesResponse(files: files.map(\.wire), latest: latest, more: more)
            }
        }
    }

    // MARK: - Chunks

    static func checkChunkID(_ id: Data) throws(ServerError) {
        guard id.count == 32 else { throw .badRequest("a chunk id has 32 bytes") }
    }

    public func missingChunks(caller: Data, ids: [Data]) throws(ServerError) -> MissingChunksResponse {
        guard ids.count <= 100_000 else { throw .tooLarge("ask about at most 100000 chunks at once") }
        for id in ids { try Self.checkChunkID(id) }
        let present = try guarded { try metadata.read { try $0.presentChunks(account: caller, ids: ids) } }
        var seen: Set<Data> = []
        return MissingChunksResponse(missing: ids.filter { !present.contains($0) && seen.insert($0).inserted })
    }

    /// Stores a sealed chunk (idempotent). The bytes reach the content store before the metadata
    /// store records them, and a chunk is only ever listed by a manifest once recorded.
    public func putChunk(caller: Data, id: Data, bytes: [UInt8]) throws(ServerError) {
        try Self.checkChunkID(id)
        guard bytes.count <= API.maxBodyBytes else { throw .tooLarge("a chunk is at most \(API.maxBodyBytes) bytes") }
        let key = ChunkKey(account: caller, id: id)
        let size = Int64(bytes.count)
        let (account, present) = try guarded {
            try metadata.read { tx in (try tx.account(key: caller), try tx.presentChunks(account: caller, ids: [id])) }
        }
        guard let account else { throw .unauthorized("no account has this key") }
        if !present.isEmpty { return }
        guard account.bytesUsed + size <= quotaBytes else { throw .quotaExceeded("storing this chunk would exceed the account's quota of \(quotaBytes) bytes") }
        try guarded { try content.put(key, bytes: bytes) }
        let stored: Bool = try guarded {
            try metadata.write { tx in
                guard let a = try tx.lockAccount(key: caller) else { return false }
                if try !tx.presentChunks(account: caller, ids: [id]).isEmpty { return true }
                guard a.bytesUsed + size <= quotaBytes else { return false }
                _ = try tx.insertChunk(key, size: size, createdAt: now)
                // A concurrent cleanup may have removed the file between our write and this
                // transaction; write it again while holding the lock.
                if try !content.has(key) { try content.put(key, bytes: bytes) }
                return true
            }
        }
        if !stored {
            try? content.delete(key)
            throw .quotaExceeded("storing this chunk would exceed the account's quota of \(quotaBytes) bytes")
        }
    }

    /// The requested chunks as a `ChunkBundle`; 404 if any is missing.
    public func getChunks(caller: Data, ids: [Data]) throws(ServerError) -> [UInt8] {
        guard ids.count <= 100_000 else { throw .tooLarge("ask for at most 100000 chunks at once") }
        for id in ids { try Self.checkChunkID(id) }
        let present = try guarded { try metadata.read { try $0.presentChunks(account: caller, ids: ids) } }
        var chunks: [(id: [UInt8], sealed: [UInt8])] = []
        var total = 0
        for id in ids {
            guard present.contains(id), let bytes = try guarded({ try content.get(ChunkKey(account: caller, id: id)) }) else {
                throw .notFound("chunk \(RequestSigning.hex(Array(id))) is not on the server")
            }
            total += bytes.count + 36
            guard total <= Self.maxChunkResponseBytes else {
                throw .tooLarge("the chunks asked for exceed \(Self.maxChunkResponseBytes) bytes; ask for fewer at once")
            }
            chunks.append((Array(id), bytes))
        }
        return ChunkBundle.encode(chunks)
    }

    // MARK: - Manifests

    public func putManifest(caller: Data, _ req: PutManifestRequest) throws(ServerError) {
        guard req.fileID.count == 16 else { throw .badRequest("a file id has 16 bytes") }
        guard req.digest.count == 32, blake2b(Array(req.sealed)) == Array(req.digest) else {
            throw .badRequest("digest is not the BLAKE2b-256 of the sealed manifest")
        }
        guard req.chunkIDs.count <= 1_000_000 else { throw .tooLarge("too many chunks in one manifest") }
        for id in req.chunkIDs { try Self.checkChunkID(id) }
        let key = ManifestKey(account: caller, fileID: req.fileID, digest: req.digest)
        try guarded {
            try metadata.write { tx in
                guard let account = try tx.lockAccount(key: caller) else { throw ServerError.unauthorized("no account has this key") }
                if let f = try tx.file(id: req.fileID), f.account != caller {
                    throw ServerError.forbidden("that file belongs to another account")
                }
                if try tx.hasManifest(key) { return }
                let present = try tx.presentChunks(account: caller, ids: req.chunkIDs)
                let missing = Set(req.chunkIDs).subtracting(present)
                guard missing.isEmpty else {
                    throw ServerError.conflict("\(missing.count) chunk(s) listed by the manifest are not on the server; upload them first")
                }
                guard account.bytesUsed + Int64(req.sealed.count) <= quotaBytes else {
                    throw ServerError.quotaExceeded("storing this manifest would exceed the account's quota of \(quotaBytes) bytes")
                }
                _ = try tx.putManifest(key, sealed: req.sealed, chunkIDs: Array(Set(req.chunkIDs)), createdAt: now)
            }
        }
    }

    public func getManifest(caller: Data, _ req: GetManifestRequest) throws(ServerError) -> Data {
        guard req.fileID.count == 16, req.digest.count <= 64 else { throw .badRequest("malformed file id or digest") }
        let key = ManifestKey(account: caller, fileID: req.fileID, digest: req.digest)
        guard let sealed = try guarded({ try metadata.read { try $0.manifest(key) } }) else {
            throw .notFound("no such manifest")
        }
        return sealed
    }

    // MARK: - Chunk garbage

    /// Forgets and deletes chunks of these that no stored manifest lists. Runs in one write
    /// transaction so a concurrent manifest upload (which checks chunk presence in its own
    /// transaction) never ends up listing a deleted chunk.
    func releaseChunks(_ keys: [ChunkKey]) throws {
        guard !keys.isEmpty else { return }
        try metadata.write { tx in
            for k in Set(keys) where try tx.deleteChunkIfUnreferenced(k) {
                try content.delete(k)
            }
        }
    }

    public struct CleanupReport: Sendable, Equatable {
        public var manifests = 0
        public var chunks = 0
        public var strayFiles = 0
        public init(manifests: Int = 0, chunks: Int = 0, strayFiles: Int = 0) {
            self.manifests = manifests; self.chunks = chunks; self.strayFiles = strayFiles
        }
    }

    /// Removes manifests no current record names, chunks no stored manifest lists, and chunk
    /// files the metadata store never recorded (interrupted uploads), when older than
    /// `graceMillis`. Also purges expired nonces.
    @discardableResult
    public func cleanup(graceMillis: Int64) throws(ServerError) -> CleanupReport {
        let current = now
        let before = current - graceMillis + (graceMillis == 0 ? 1 : 0)
        var report = CleanupReport()
        try guarded {
            var released: [ChunkKey] = []
            try metadata.write { tx in
                for m in try tx.unreferencedManifests(createdBefore: before) {
                    released += try tx.deleteManifest(m).map { ChunkKey(account: m.account, id: $0) }
                    report.manifests += 1
                }
            }
            try metadata.write { tx in
                let candidates = try tx.unreferencedChunks(createdBefore: before)
                for k in Set(candidates + released) where try tx.deleteChunkIfUnreferenced(k) {
                    try content.delete(k)
                    report.chunks += 1
                }
                try tx.purgeNonces(expiredBefore: current)
            }
            let known = try metadata.read { try $0.allChunkKeys() }
            var stray: [ChunkKey] = []
            try content.list { key, mtime in
                if mtime < before, !known.contains(key) { stray.append(key) }
            }
            for k in stray {
                // Re-check under the write lock: an upload may have recorded it meanwhile.
                try metadata.write { tx in
                    if try tx.presentChunks(account: k.account, ids: [k.id]).isEmpty {
                        try content.delete(k)
                        report.strayFiles += 1
                    }
                }
            }
            (content as? DirectoryContentStorage)?.removeStaleTemporaries(before: before)
        }
        return report
    }
}
