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
    /// Request nonces, apart from `metadata` so authentication never waits for an upsert.
    public let nonces: any NonceStore
    public let quotaBytes: Int64
    /// Milliseconds since the epoch; injectable for tests.
    let clock: @Sendable () -> Int64
    let trees: Mutex<[Data: CachedTree]> = Mutex([:])
    let lastNoncePurge: Mutex<Int64> = Mutex(0)
    static let maxCachedTrees = 256
    /// Largest `chunks/get` response.
    public static let maxChunkResponseBytes = 256 * 1024 * 1024

    public static let defaultQuotaBytes: Int64 = 10 * 1024 * 1024 * 1024

    public init(metadata: any MetadataStorage, content: any ContentStorage, quotaBytes: Int64 = CofferServer.defaultQuotaBytes,
                nonces: any NonceStore = MemoryNonceStore(),
                clock: @escaping @Sendable () -> Int64 = { Int64(Date().timeIntervalSince1970 * 1000) }) {
        self.metadata = metadata
        self.content = content
        self.nonces = nonces
        self.quotaBytes = quotaBytes
        self.clock = clock
    }

    /// The embedded defaults under `directory` (made 0700): `metadata.sqlite`, `nonces.sqlite`
    /// (both 0600) and `chunks/`.
    public static func open(directory: URL, quotaBytes: Int64 = CofferServer.defaultQuotaBytes,
                            clock: @escaping @Sendable () -> Int64 = { Int64(Date().timeIntervalSince1970 * 1000) }) throws -> CofferServer {
        try PrivateFiles.prepareDirectory(directory)
        let meta = try SQLiteMetadataStorage(path: directory.appendingPathComponent("metadata.sqlite").path)
        let nonces = try SQLiteNonceStore(path: directory.appendingPathComponent("nonces.sqlite").path)
        let chunks = try DirectoryContentStorage(root: directory.appendingPathComponent("chunks", isDirectory: true),
                                                 tmp: directory.appendingPathComponent("tmp", isDirectory: true))
        return CofferServer(metadata: meta, content: chunks, quotaBytes: quotaBytes, nonces: nonces, clock: clock)
    }

    public var now: Int64 { clock() }

    // MARK: - Error plumbing

    /// Storage failures become a 500 whose text stays in the server's log (`ServerError.detail`).
    func guarded<T>(_ body: () throws -> T) throws(ServerError) -> T {
        do { return try body() } catch let e as ServerError { throw e } catch { throw .internal(detail: "storage failure: \(error)") }
    }

    // MARK: - Authentication

    /// A request whose signing headers are present and well formed, whose timestamp is within
    /// the window and (unless it may create an account) whose key has an account: everything
    /// that can be checked before the body is read. See `preauthenticate`.
    public struct Preauthenticated: Sendable {
        public let key: Data
        let publicKey: PublicSigningKey
        let timestamp: Int64
        let nonce: String
        let signature: [UInt8]
    }

    /// Checks what a request's headers alone can show, cheapest first, before its body is read:
    /// the four signing headers are present and well formed, the timestamp is within
    /// `API.maxClockSkewMillis` of the server's clock, and the key has an account (unless
    /// `mayCreateAccount`, for `POST /v1/accounts`). A request failing any of these is refused
    /// (401) without its body ever being collected.
    public func preauthenticate(account: String?, timestamp: String?, nonce: String?, signature: String?,
                                mayCreateAccount: Bool) throws(ServerError) -> Preauthenticated {
        guard let account, let timestamp, let nonce, let signature else {
            throw .unauthorized("missing signing headers (\(RequestSigning.accountHeader), \(RequestSigning.timestampHeader), \(RequestSigning.nonceHeader), \(RequestSigning.signatureHeader))")
        }
        guard account.utf8.count == 64, let keyBytes = RequestSigning.unhex(account), let key = try? PublicSigningKey(bytes: keyBytes) else {
            throw .unauthorized("\(RequestSigning.accountHeader) is not a hex public key")
        }
        guard timestamp.utf8.count <= 20, let ts = Int64(timestamp) else { throw .unauthorized("\(RequestSigning.timestampHeader) is not a number") }
        guard Self.withinClockWindow(ts, now: now) else {
            throw .unauthorized("request timestamp is more than 5 minutes from the server's clock")
        }
        guard nonce.utf8.count >= 16, nonce.utf8.count <= 128, let nonceBytes = RequestSigning.unhex(nonce), !nonceBytes.isEmpty else {
            throw .unauthorized("\(RequestSigning.nonceHeader) must be 8 to 64 bytes of hex")
        }
        guard signature.utf8.count == 128, let sig = RequestSigning.unhex(signature), sig.count == 64 else {
            throw .unauthorized("\(RequestSigning.signatureHeader) is not a hex signature")
        }
        let keyData = Data(keyBytes)
        let exists = try guarded { try metadata.read { try $0.account(key: keyData) } } != nil
        guard exists || mayCreateAccount else { throw .unauthorized("no account has this key") }
        return Preauthenticated(key: keyData, publicKey: key, timestamp: ts, nonce: nonce, signature: sig)
    }

    /// Whether `ts` (ms) is within `API.maxClockSkewMillis` of `now`, without arithmetic that
    /// can overflow on a hostile value (`abs(now - ts)` traps for `ts == Int64.min + now`).
    static func withinClockWindow(_ ts: Int64, now: Int64) -> Bool {
        guard ts > 0, now > 0 else { return false }
        let (difference, overflow) = now.subtractingReportingOverflow(ts)
        return !overflow && difference.magnitude <= API.maxClockSkewMillis.magnitude
    }

    /// Verifies the signature over the body and records the nonce (in `nonces`, never in the
    /// metadata store). Returns the caller's key.
    public func authenticate(_ pre: Preauthenticated, method: String, path: String, body: [UInt8]) throws(ServerError) -> Data {
        guard RequestSigning.verify(account: pre.publicKey, method: method, path: path, body: body, timestamp: pre.timestamp,
                                    nonce: pre.nonce, signature: pre.signature) else {
            throw .unauthorized("request signature does not verify")
        }
        let current = now
        let purge = lastNoncePurge.withLock { last -> Bool in
            if current.subtractingReportingOverflow(last).partialValue > 60_000 { last = current; return true }
            return false
        }
        // The timestamp is within the window, so these sums cannot overflow.
        let fresh = try guarded {
            if purge { try nonces.purge(expiredBefore: current - 1000) }
            return try nonces.insert(account: pre.key, nonce: pre.nonce.lowercased(), expiresAt: pre.timestamp + API.maxClockSkewMillis + 1000)
        }
        guard fresh else { throw .unauthorized("request nonce was already used (replay)") }
        return pre.key
    }

    /// Both steps at once, for callers that have the body already (tests, tools).
    public func authenticate(method: String, path: String, body: [UInt8], account: String?, timestamp: String?,
                             nonce: String?, signature: String?, mayCreateAccount: Bool = false) throws(ServerError) -> Data {
        let pre = try preauthenticate(account: account, timestamp: timestamp, nonce: nonce, signature: signature,
                                      mayCreateAccount: mayCreateAccount)
        return try authenticate(pre, method: method, path: path, body: body)
    }

    /// The caller's account; 401 if the key has no account.
    public func requireAccount(_ caller: Data) throws(ServerError) -> AccountRecord {
        guard let a = try guarded({ try metadata.read { try $0.account(key: caller) } }) else {
            throw .unauthorized("no account has this key")
        }
        return a
    }

    // MARK: - Accounts

    /// `Username`'s rule (the model's, shared with devices).
    public static func isValidUsername(_ name: String) -> Bool { Username.normalized(name) != nil }

    /// Checks an account-creation request without touching storage; the HTTP layer runs this
    /// before it takes a token from the creation rate limit, so malformed requests cost none.
    /// Returns the record to store (username normalised).
    public func checkCreateAccount(caller: Data, _ req: CreateAccountRequest) throws(ServerError) -> AccountRecord {
        guard req.signingKey.count == 32, req.boxKey.count == 32 else { throw .badRequest("signingKey and boxKey must be 32 bytes each") }
        guard req.signingKey == caller else { throw .forbidden("an account is created by a request signed with its own key") }
        guard let username = Username.normalized(req.username) else { throw .badRequest(Username.rule) }
        return AccountRecord(key: req.signingKey, username: username, boxKey: req.boxKey)
    }

    public func createAccount(caller: Data, _ req: CreateAccountRequest) throws(ServerError) -> AccountResponse {
        let record = try checkCreateAccount(caller: caller, req)
        let inserted = try guarded { try metadata.write { try $0.insertAccount(record) } }
        guard inserted else { throw .conflict("that username or key already has an account") }
        return AccountResponse(username: record.username, signingKey: record.key, boxKey: record.boxKey)
    }

    /// Looks an account up by username, case- and normalisation-insensitively (`Username.key`).
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
                    throw ServerError.forbidden(Self.unusableFileID(req.fileID))
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

    /// The one refusal for a file id another account holds. It says no more than that this
    /// account cannot use the id: ids are global, so a refusal is unavoidable, but its text is
    /// the same wherever it is given (see docs/PROTOCOL.md).
    static func unusableFileID(_ id: Data) -> String {
        "file id \(RequestSigning.hex(Array(id))) cannot be used by this account"
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
            }
            try nonces.purge(expiredBefore: current)
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
