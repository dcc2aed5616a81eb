import CofferCrypto
import CofferModel
import CofferProtocol
import Foundation
import Synchronization

/// The server's semantics, independent of HTTP: every endpoint of docs/PROTOCOL.md as a method
/// taking the authenticated caller (its public key) and the decoded body. Stateless: nothing is
/// kept per account between requests (an upsert reads the part of the tree it touches from
/// storage, inside its transaction), so memory does not grow with accounts or their trees, and
/// several processes can share one `MetadataStorage` and `ContentStorage`.
///
/// Every public method throws only `ServerError` (4xx for client mistakes, 500 for storage
/// failures).
public final class CofferServer: Sendable {
    public let metadata: any MetadataStorage
    public let content: any ContentStorage
    /// Request nonces, apart from `metadata` so authentication never waits for an upsert.
    public let nonces: any NonceStore
    public let quotaBytes: Int64
    /// This server's id (`RequestSigning`): signatures made for another server do not verify here.
    public let identity: [UInt8]
    public let registration: RegistrationPolicy
    /// Milliseconds since the epoch; injectable for tests.
    let clock: @Sendable () -> Int64
    let lastNoncePurge: Mutex<Int64> = Mutex(0)
    /// Wakes the watches of accounts whose view a request changed.
    public let notifier = ChangeNotifier()
    /// Largest `chunks/get` response (the bundle is streamed, so this bounds what the client must
    /// hold, not the server's memory).
    public let maxChunkResponseBytes: Int
    public static let defaultMaxChunkResponseBytes = 256 * 1024 * 1024
    /// Most bytes one `chunks/get` answer reads from the content store at a time.
    public static let chunkPieceBytes = 256 * 1024

    public static let defaultQuotaBytes: Int64 = 10 * 1024 * 1024 * 1024

    /// Who may create an account (`coffer-server --registration`).
    public enum RegistrationPolicy: String, Sendable, CaseIterable {
        /// Anyone (subject to the per-address rate limit).
        case open
        /// Only with a single-use invite code made by `coffer-server invite`.
        case invite
        /// Nobody.
        case closed
    }

    public init(
        metadata: any MetadataStorage, content: any ContentStorage, quotaBytes: Int64 = CofferServer.defaultQuotaBytes,
        identity: [UInt8] = randomBytes(RequestSigning.serverIDBytes),
        registration: RegistrationPolicy = .open,
        maxChunkResponseBytes: Int = CofferServer.defaultMaxChunkResponseBytes,
        nonces: any NonceStore = MemoryNonceStore(),
        clock: @escaping @Sendable () -> Int64 = { Int64(Date().timeIntervalSince1970 * 1000) }
    ) {
        self.metadata = metadata
        self.content = content
        self.nonces = nonces
        self.quotaBytes = quotaBytes
        self.identity = identity
        self.registration = registration
        self.maxChunkResponseBytes = maxChunkResponseBytes
        self.clock = clock
    }

    /// The embedded defaults under `directory` (made 0700): `metadata.sqlite`, `nonces.sqlite`
    /// (both 0600), `server.id` and `chunks/`.
    public static func open(
        directory: URL, quotaBytes: Int64 = CofferServer.defaultQuotaBytes,
        registration: RegistrationPolicy = .open,
        clock: @escaping @Sendable () -> Int64 = { Int64(Date().timeIntervalSince1970 * 1000) }
    ) throws -> CofferServer {
        try PrivateFiles.prepareDirectory(directory)
        let meta = try SQLiteMetadataStorage(path: directory.appendingPathComponent("metadata.sqlite").path)
        let nonces = try SQLiteNonceStore(path: directory.appendingPathComponent("nonces.sqlite").path)
        let chunks = try DirectoryContentStorage(
            root: directory.appendingPathComponent("chunks", isDirectory: true),
            tmp: directory.appendingPathComponent("tmp", isDirectory: true))
        return CofferServer(
            metadata: meta, content: chunks, quotaBytes: quotaBytes, identity: try identity(in: directory),
            registration: registration, nonces: nonces, clock: clock)
    }

    /// The server's id, kept in `DIR/server.id` (made once, mode 0600, written whole then renamed),
    /// so it survives restarts and travels with backups of the data directory; several processes
    /// serving one storage share the directory, and so the id.
    static func identity(in directory: URL) throws -> [UInt8] {
        let path = directory.appendingPathComponent("server.id").path
        if let data = FileManager.default.contents(atPath: path) {
            guard
                let id = RequestSigning.unhex(
                    String(decoding: data, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)),
                id.count == RequestSigning.serverIDBytes
            else {
                throw StorageError("\(path) does not hold a server id (\(RequestSigning.serverIDBytes * 2) hex digits)")
            }
            return id
        }
        let id = randomBytes(RequestSigning.serverIDBytes)
        let tmp = path + ".tmp-\(getpid())"
        guard
            FileManager.default.createFile(
                atPath: tmp, contents: Data((RequestSigning.hex(id) + "\n").utf8),
                attributes: [.posixPermissions: 0o600])
        else {
            throw StorageError("cannot write \(tmp)")
        }
        // Two processes starting at once: link refuses to replace, so the first id stays and both read it.
        if link(tmp, path) != 0 && errno != EEXIST {
            unlink(tmp)
            throw StorageError("cannot create \(path)")
        }
        unlink(tmp)
        return try identity(in: directory)
    }

    /// Whether `bytes` more fit in the quota of an account that uses `used`.
    func fitsQuota(used: Int64, adding bytes: Int64) -> Bool {
        let (total, overflow) = used.addingReportingOverflow(bytes)
        return !overflow && total <= quotaBytes
    }

    public var now: Int64 { clock() }

    // MARK: - Error plumbing

    /// Storage failures become a 500 whose text stays in the server's log (`ServerError.detail`).
    func guarded<T>(_ body: () throws -> T) throws(ServerError) -> T {
        do { return try body() } catch let e as ServerError { throw e } catch {
            throw .internal(detail: "storage failure: \(error)")
        }
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
    public func preauthenticate(
        account: String?, timestamp: String?, nonce: String?, signature: String?,
        mayCreateAccount: Bool
    ) throws(ServerError) -> Preauthenticated {
        guard let account, let timestamp, let nonce, let signature else {
            throw .unauthorized(
                "missing signing headers (\(RequestSigning.accountHeader), \(RequestSigning.timestampHeader), "
                    + "\(RequestSigning.nonceHeader), \(RequestSigning.signatureHeader))"
            )
        }
        guard account.utf8.count == 64, let keyBytes = RequestSigning.unhex(account),
            let key = try? PublicSigningKey(bytes: keyBytes)
        else {
            throw .unauthorized("\(RequestSigning.accountHeader) is not a hex public key")
        }
        guard timestamp.utf8.count <= 20, let ts = Int64(timestamp) else {
            throw .unauthorized("\(RequestSigning.timestampHeader) is not a number")
        }
        guard RequestSigning.isFresh(timestamp: ts, now: now) else {
            throw .unauthorized("request timestamp is more than 5 minutes from the server's clock")
        }
        guard nonce.utf8.count >= 16, nonce.utf8.count <= 128, let nonceBytes = RequestSigning.unhex(nonce),
            !nonceBytes.isEmpty
        else {
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

    /// Verifies the signature over the body and records the nonce (in `nonces`, never in the
    /// metadata store). Returns the caller's key.
    public func authenticate(
        _ pre: Preauthenticated, method: String, path: String, body: [UInt8]
    ) throws(ServerError) -> Data {
        guard
            RequestSigning.verify(
                account: pre.publicKey, server: identity, method: method, path: path, body: body,
                timestamp: pre.timestamp, nonce: pre.nonce, signature: pre.signature)
        else {
            throw .unauthorized("request signature does not verify")
        }
        let current = now
        let purge = lastNoncePurge.withLock { last -> Bool in
            if current.subtractingReportingOverflow(last).partialValue > 60_000 {
                last = current
                return true
            }
            return false
        }
        // The timestamp is within the window, so these sums cannot overflow.
        let fresh = try guarded {
            if purge { try nonces.purge(expiredBefore: current - 1000) }
            return try nonces.insert(
                account: pre.key, nonce: pre.nonce.lowercased(),
                expiresAt: pre.timestamp + API.maxClockSkewMillis + 1000)
        }
        guard fresh else { throw .unauthorized("request nonce was already used (replay)") }
        return pre.key
    }

    /// Both steps at once, for callers that have the body already (tests, tools).
    public func authenticate(
        method: String, path: String, body: [UInt8], account: String?, timestamp: String?,
        nonce: String?, signature: String?, mayCreateAccount: Bool = false
    ) throws(ServerError) -> Data {
        let pre = try preauthenticate(
            account: account, timestamp: timestamp, nonce: nonce, signature: signature,
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
        guard req.signingKey.count == 32, req.boxKey.count == 32 else {
            throw .badRequest("signingKey and boxKey must be 32 bytes each")
        }
        guard req.signingKey == caller else {
            throw .forbidden("an account is created by a request signed with its own key")
        }
        guard let username = Username.normalized(req.username) else { throw .badRequest(Username.rule) }
        if let card = req.card {
            let keyCard = KeyCard(
                username: username, signingKey: Array(req.signingKey), boxKey: Array(req.boxKey), signature: Array(card)
            )
            guard keyCard.isValid else { throw .badRequest("the key card's signature does not verify") }
        }
        return AccountRecord(key: req.signingKey, username: username, boxKey: req.boxKey, card: req.card)
    }

    /// Stores the caller's key card (an account made before cards publishes its own), after
    /// checking it signs the username and keys the server holds.
    public func publishCard(caller: Data, _ req: KeyCardRequest) throws(ServerError) {
        try guarded {
            try metadata.write { tx in
                guard let account = try tx.lockAccount(key: caller) else {
                    throw ServerError.unauthorized("no account has this key")
                }
                let card = KeyCard(
                    username: account.username, signingKey: Array(account.key), boxKey: Array(account.boxKey),
                    signature: Array(req.card))
                guard card.isValid else { throw ServerError.badRequest("the key card's signature does not verify") }
                try tx.setCard(key: caller, card: req.card)
            }
        }
    }

    // MARK: - Contact book

    /// A contact book is at most this large (sealed): some thousands of contacts.
    public static let maxContactBookBytes = 1 << 20

    /// The caller's contact book (docs/SHARING.md, "Contacts across devices").
    public func contactBook(caller: Data) throws(ServerError) -> ContactBookMessage {
        try guarded {
            try metadata.read { tx in
                guard try tx.account(key: caller) != nil else {
                    throw ServerError.unauthorized("no account has this key")
                }
                let (sealed, revision) = try tx.contactBook(account: caller)
                return ContactBookMessage(sealed: sealed, revision: revision)
            }
        }
    }

    /// Replaces the caller's contact book if `revision` is the stored one plus one (409
    /// `conflict` otherwise: another device wrote first, merge and try again). The server checks
    /// nothing else of it: it cannot open it, and devices refuse what they did not seal.
    public func putContactBook(caller: Data, _ req: ContactBookMessage) throws(ServerError) {
        guard let sealed = req.sealed, !sealed.isEmpty else { throw .badRequest("a contact book has content") }
        guard sealed.count <= Self.maxContactBookBytes else {
            throw .tooLarge("a contact book holds at most \(Self.maxContactBookBytes) bytes")
        }
        try guarded {
            try metadata.write { tx in
                guard try tx.lockAccount(key: caller) != nil else {
                    throw ServerError.unauthorized("no account has this key")
                }
                let stored = try tx.contactBook(account: caller).revision
                guard stored < Int64.max, req.revision == stored + 1 else {
                    throw ServerError.conflict(
                        "the contact book is at revision \(stored); merge with it and send revision \(stored &+ 1)")
                }
                try tx.setContactBook(account: caller, sealed: sealed, revision: req.revision)
            }
        }
        notifier.notify([caller])
    }

    /// Where the caller's view stands against what a watching device has seen (`WatchRequest`):
    /// `changed` when its tree, its feed or its contact book moved past that.
    public func watchState(caller: Data, _ req: WatchRequest) throws(ServerError) -> WatchResponse {
        guard req.since >= 0, (req.feedSince ?? 0) >= 0, (req.contactsRevision ?? 0) >= 0 else {
            throw .badRequest("a watch's cursors are not negative")
        }
        return try guarded {
            try metadata.read { tx in
                guard let account = try tx.account(key: caller) else {
                    throw ServerError.unauthorized("no account has this key")
                }
                let feedLatest = try tx.feedLatest(account: caller)
                let contacts = try tx.contactBook(account: caller).revision
                let changed =
                    account.version > req.since || req.feedSince.map { feedLatest > $0 } == true
                    || req.contactsRevision.map { contacts > $0 } == true
                return WatchResponse(
                    changed: changed, latest: account.version, feedLatest: feedLatest, contactsRevision: contacts)
            }
        }
    }

    public func createAccount(caller: Data, _ req: CreateAccountRequest) throws(ServerError) -> AccountResponse {
        let record = try checkCreateAccount(caller: caller, req)
        let inviteHash: Data?
        switch registration {
        case .open: inviteHash = nil
        case .closed: throw .forbidden("this server does not accept new accounts")
        case .invite:
            guard let code = req.invite, let hash = Self.inviteHash(code) else {
                throw .forbidden("this server accepts new accounts by invite only; ask its operator for an invite code")
            }
            inviteHash = hash
        }
        // The invite is used up in the transaction that creates the account, so a refused
        // creation (a taken name) leaves it valid.
        try guarded {
            try metadata.write { tx in
                if let inviteHash, try !tx.consumeInvite(hash: inviteHash) {
                    throw ServerError.forbidden("that invite code is unknown or already used")
                }
                guard try tx.insertAccount(record) else {
                    throw ServerError.conflict("that username or key already has an account")
                }
            }
        }
        return AccountResponse(
            username: record.username, signingKey: record.key, boxKey: record.boxKey, card: record.card)
    }

    /// Makes `count` single-use invite codes (32 hex digits, 128 random bits each) and stores
    /// only their hashes.
    public func makeInvites(count: Int) throws(ServerError) -> [String] {
        guard count > 0, count <= 10_000 else { throw .badRequest("make 1 to 10000 invites at once") }
        let codes = (0..<count).map { _ in RequestSigning.hex(randomBytes(16)) }
        let created = now
        try guarded {
            try metadata.write { tx in
                for code in codes {
                    if let h = Self.inviteHash(code) { try tx.insertInvite(hash: h, createdAt: created) }
                }
            }
        }
        return codes
    }

    /// The stored form of an invite code: BLAKE2b-256 of its 16 bytes (nil if not a code).
    /// Dashes and spaces are ignored and case does not matter, so a code survives being copied.
    static func inviteHash(_ code: String) -> Data? {
        let hex = code.filter { $0 != "-" && $0 != " " }
        guard hex.utf8.count == 32, let bytes = RequestSigning.unhex(hex), bytes.count == 16 else { return nil }
        return Data(blake2b(bytes))
    }

    /// Looks an account up by username, case- and normalisation-insensitively (`Username.key`).
    public func lookup(username: String) throws(ServerError) -> AccountResponse {
        guard Self.isValidUsername(username),
            let a = try guarded({ try metadata.read { try $0.account(username: username) } })
        else {
            throw .notFound("no such account")
        }
        return AccountResponse(username: a.username, signingKey: a.key, boxKey: a.boxKey, card: a.card)
    }

    /// The account whose signing key is `key` (a share's owner, as a grantee's device sees it):
    /// its username and key card, which the device checks against the key it asked about.
    public func lookup(key: Data) throws(ServerError) -> AccountResponse {
        guard key.count == 32 else { throw .badRequest("an account key has 32 bytes") }
        guard let a = try guarded({ try metadata.read { try $0.account(key: key) } }) else {
            throw .notFound("no such account")
        }
        return AccountResponse(username: a.username, signingKey: a.key, boxKey: a.boxKey, card: a.card)
    }

    // MARK: - Usage

    public func usage(caller: Data) throws(ServerError) -> UsageResponse {
        // Both figures are kept on the account row as records change: nothing is counted here.
        guard let account = try guarded({ try metadata.read { try $0.account(key: caller) } }) else {
            throw .unauthorized("no account has this key")
        }
        return UsageResponse(files: account.liveFiles, bytes: account.bytesUsed, quotaBytes: quotaBytes)
    }

    // MARK: - Updates

    /// One page of what the caller sees after the cursor (see `UpdatesRequest`): its own
    /// records and, when it asks (`shared`), its share feed (docs/SHARING.md, "The feed"), merged in (version, file id)
    /// order; at most `API.updatesPageSize` entries and about `API.updatesPageBytes` of JSON,
    /// whatever the tree; a version larger than a page is split, and `nextAfterID` says where to
    /// go on. A feed entry is served as the file's current record if the caller can still see
    /// it (its access is checked now, through the owner's tree), else as its id in `gone`.
    /// With `feedOnly`, the feed alone. With `origin`, files of the page granted to the caller
    /// again after it are named in `regranted`.
    public func updates(
        caller: Data, since: Int64, afterID: Data? = nil, shared: Bool = false, feedOnly: Bool = false,
        origin: Int64? = nil
    ) throws(ServerError) -> UpdatesResponse {
        guard since >= 0 else { throw .badRequest("since must not be negative") }
        if let afterID, afterID.count != 16 { throw .badRequest("afterID is not a file id") }
        guard let callerID = try? AccountID(bytes: Array(caller)) else { throw .unauthorized("malformed account key") }
        // Each stream is read up to a page; `next` is the version of the entry it stopped at.
        var own = UpdatesStream()
        var feed = UpdatesStream()
        let withFeed = shared || feedOnly
        try guarded {
            try metadata.read { tx in
                if !feedOnly {
                    try tx.visitFiles(account: caller, since: since, afterID: afterID) { f in
                        own.admit(UpdatesEntry(version: f.version, id: f.id, file: f))
                    }
                }
                guard withFeed else { return }
                var views: [Data: StorageTreeView] = [:]
                try tx.visitFeed(account: caller, since: since, afterID: afterID) { id, version, regrantedAt in
                    guard feed.hasRoom(version) else { return false }
                    var entry = UpdatesEntry(version: version, id: id, file: nil)
                    if let origin, let regrantedAt, regrantedAt > origin { entry.regranted = true }
                    if var f = try tx.file(id: id), let fileID = try? FileID(bytes: Array(id)) {
                        let view = views[f.account] ?? StorageTreeView(account: f.account, reader: tx)
                        views[f.account] = view
                        if view.accessMode(of: callerID, on: fileID) != nil {
                            // Served at the feed's version: the cursor the caller keeps.
                            f.version = version
                            entry.file = f
                        }
                        try view.throwIfFailed()
                    }
                    return feed.admit(entry)
                }
            }
        }
        // Where a stream stopped short, nothing past its last entry can be placed yet: the
        // other stream's later entries wait for the next page.
        let bounds = [own, feed].filter { $0.next != nil }.compactMap(\.entries.last)
        let bound = bounds.min(by: UpdatesEntry.precedes)
        let merged = (own.entries + feed.entries).sorted(by: UpdatesEntry.precedes)
        var page = UpdatesStream()
        for e in merged {
            if let bound, UpdatesEntry.precedes(bound, e) { break }
            if !page.admit(e) { break }
        }
        guard let last = page.entries.last else { return UpdatesResponse(files: [], latest: since, more: false) }
        let next = ([merged.dropFirst(page.entries.count).first?.version, own.next, feed.next]).compactMap { $0 }.min()
        let gone = page.entries.filter { $0.file == nil }.map(\.id)
        let regranted = page.entries.filter(\.regranted).map(\.id)
        return UpdatesResponse(
            files: page.entries.compactMap { $0.file?.wire }, latest: last.version, more: next != nil,
            nextAfterID: next == last.version ? last.id : nil, gone: gone.isEmpty ? nil : gone,
            regranted: regranted.isEmpty ? nil : regranted)
    }

    /// A record's share of an updates response as JSON: its base64 and the fields around it.
    static func wireBytes(_ f: StoredFile) -> Int { (f.record.count + 2) / 3 * 4 + 160 }

    // MARK: - Chunks

    static func checkChunkID(_ id: Data) throws(ServerError) {
        guard id.count == 32 else { throw .badRequest("a chunk id has 32 bytes") }
    }

    public func missingChunks(caller: Data, ids: [Data], via: Data? = nil) throws(ServerError) -> MissingChunksResponse
    {
        guard ids.count <= 100_000 else { throw .tooLarge("ask about at most 100000 chunks at once") }
        for id in ids { try Self.checkChunkID(id) }
        let present = try guarded {
            try metadata.read { tx in
                try tx.presentChunks(account: contentOwner(caller: caller, via: via, needs: .write, tx: tx), ids: ids)
            }
        }
        var seen: Set<Data> = []
        return MissingChunksResponse(missing: ids.filter { !present.contains($0) && seen.insert($0).inserted })
    }

    /// Stores a sealed chunk (idempotent). The bytes are staged (written and fsynced under a
    /// name of their own) first; the metadata transaction that records the chunk publishes them
    /// (renamed into place, directory fsynced) and counts them, so of two racing uploads of one
    /// id exactly one is published and counted, the other discards only its own temporary, and
    /// a recorded chunk is always durable.
    public func putChunk(caller: Data, id: Data, bytes: [UInt8], via: Data? = nil) throws(ServerError) {
        try Self.checkChunkID(id)
        guard bytes.count <= API.maxBodyBytes else { throw .tooLarge("a chunk is at most \(API.maxBodyBytes) bytes") }
        // The chunk is the content owner's: stored in its namespace, counted in its quota.
        let (owner, account, present) = try guarded {
            try metadata.read { tx in
                guard try tx.account(key: caller) != nil else {
                    throw ServerError.unauthorized("no account has this key")
                }
                let owner = try contentOwner(caller: caller, via: via, needs: .write, tx: tx)
                return (owner, try tx.account(key: owner), try tx.presentChunks(account: owner, ids: [id]))
            }
        }
        let key = ChunkKey(account: owner, id: id)
        let counted = QuotaRule.counted(chunk: Int64(bytes.count))
        guard let account else { throw .unauthorized("no account has this key") }
        if !present.isEmpty { return }
        let quotaError = ServerError.quotaExceeded(
            "storing this chunk would exceed the account's quota of \(quotaBytes) bytes")
        guard fitsQuota(used: account.bytesUsed, adding: counted) else { throw quotaError }
        let inline = bytes.count <= Self.inlineChunkBytes
        let staged = inline ? nil : try guarded { try content.stage(key, bytes: bytes) }
        var published = false
        defer { if !published, let staged { content.discard(staged) } }
        let stored: Bool = try guarded {
            try metadata.write { tx in
                guard let a = try tx.lockAccount(key: owner) else {
                    throw ServerError.unauthorized("no account has this key")
                }
                if try !tx.presentChunks(account: owner, ids: [id]).isEmpty { return true }  // another upload won
                guard fitsQuota(used: a.bytesUsed, adding: counted) else { return false }
                if let staged {
                    try content.publish(staged)
                    published = true
                }
                _ = try tx.insertChunk(
                    key, size: Int64(bytes.count), createdAt: now, inline: inline ? Data(bytes) : nil)
                return true
            }
        }
        if !stored { throw quotaError }
    }

    /// Chunks up to this size (sealed) are kept inline in the metadata store: written with the
    /// transaction that records them, with no file and no fsync of their own. A small file's
    /// whole content is one such chunk, so a bundle of thousands of them is one commit.
    /// Larger chunks go to the content store, where a file and its fsync are small next to the
    /// bytes.
    public static let inlineChunkBytes = 64 * 1024

    /// Stores a bundle of chunks and manifests (`POST /v1/content`, docs/PROTOCOL.md): all of
    /// it, in one metadata transaction, or nothing. Chunks already stored are skipped; each
    /// manifest must list only chunks stored (in this bundle or before) and belong to the
    /// namespace the bundle writes to (the caller's, or `via`'s owner's). Idempotent, so a
    /// client interrupted mid-push sends again only what the server still lacks.
    public func putContent(caller: Data, _ bundle: ContentBundle, via: Data? = nil) throws(ServerError) {
        for c in bundle.chunks {
            guard c.id.count == 32 else { throw .badRequest("a chunk id has 32 bytes") }
        }
        for m in bundle.manifests {
            guard m.fileID.count == 16 else { throw .badRequest("a file id has 16 bytes") }
            guard m.digest.count == 32, blake2b(m.sealed) == m.digest else {
                throw .badRequest("digest is not the BLAKE2b-256 of the sealed manifest")
            }
        }
        let (owner, present) = try guarded {
            try metadata.read { tx in
                guard try tx.account(key: caller) != nil else {
                    throw ServerError.unauthorized("no account has this key")
                }
                let owner = try contentOwner(caller: caller, via: via, needs: .write, tx: tx)
                return (owner, try tx.presentChunks(account: owner, ids: bundle.chunks.map { Data($0.id) }))
            }
        }
        // New chunks, each once; the large ones staged (written and synced) before the
        // transaction, as a lone chunk upload does.
        var seen: Set<[UInt8]> = []
        let fresh = bundle.chunks.filter { !present.contains(Data($0.id)) && seen.insert($0.id).inserted }
        var staged: [[UInt8]: StagedChunk] = [:]
        var published: Set<[UInt8]> = []
        defer { for (id, s) in staged where !published.contains(id) { content.discard(s) } }
        for c in fresh where c.sealed.count > Self.inlineChunkBytes {
            staged[c.id] = try guarded { try content.stage(ChunkKey(account: owner, id: Data(c.id)), bytes: c.sealed) }
        }
        do {
            try guarded {
                try storeBundle(
                    bundle, caller: caller, fresh: fresh, staged: staged, owner: owner, published: &published)
            }
        } catch {
            // Published, then rolled back: the files go too (cleanup would remove them later).
            for id in published { try? content.delete(ChunkKey(account: owner, id: Data(id))) }
            throw error
        }
    }

    /// The transaction of `putContent`: everything is checked before any chunk is published.
    private func storeBundle(
        _ bundle: ContentBundle, caller: Data, fresh: [ContentBundle.Chunk], staged: [[UInt8]: StagedChunk],
        owner: Data, published: inout Set<[UInt8]>
    ) throws {
        try metadata.write { tx in
            guard let account = try tx.lockAccount(key: owner) else {
                throw ServerError.unauthorized("no account has this key")
            }
            // Every manifest is one the caller may write to the bundle's namespace, and lists
            // chunks stored or carried, before anything is written.
            let carried = Set(bundle.chunks.map { Data($0.id) })
            var newManifests: [ContentBundle.Manifest] = []
            for m in bundle.manifests {
                // A stored document's content is its owner's, for a caller that may write it
                // (as `putManifest` checks); a new one's, the bundle's.
                if try tx.file(id: Data(m.fileID)) != nil {
                    let fileOwner = try contentOwner(caller: caller, via: Data(m.fileID), needs: .write, tx: tx)
                    guard fileOwner == owner else { throw ServerError.forbidden(Self.unusableFileID(Data(m.fileID))) }
                }
                // Filtered, not `Set.subtracting`: that walked the whole bundle's set per manifest.
                let ids = Set(m.chunkIDs.map { Data($0) }).filter { !carried.contains($0) }
                guard try tx.presentChunks(account: owner, ids: Array(ids)).count == ids.count else {
                    throw ServerError.conflict(
                        "a manifest lists chunks that are not on the server; send them first")
                }
                if try !tx.hasManifest(ManifestKey(account: owner, fileID: Data(m.fileID), digest: Data(m.digest))) {
                    newManifests.append(m)
                }
            }
            // Carried chunks counted present before this transaction: one released meanwhile is
            // stored again from the bundle (a small one), or the bundle is sent again (a large one,
            // whose file was not staged).
            var missingAgain: [ContentBundle.Chunk] = []
            let freshIDs = Set(fresh.map(\.id))
            for c in bundle.chunks where !freshIDs.contains(c.id) {
                guard try tx.presentChunks(account: owner, ids: [Data(c.id)]).isEmpty else { continue }
                guard c.sealed.count <= Self.inlineChunkBytes else {
                    throw ServerError.conflict("a chunk of the bundle went meanwhile; send the bundle again")
                }
                if !missingAgain.contains(where: { $0.id == c.id }) { missingAgain.append(c) }
            }
            var adding: Int64 = 0
            for c in fresh + missingAgain { adding &+= QuotaRule.counted(chunk: Int64(c.sealed.count)) }
            for m in newManifests { adding &+= QuotaRule.counted(row: Int64(m.sealed.count)) }
            guard adding >= 0, fitsQuota(used: account.bytesUsed, adding: adding) else {
                throw ServerError.quotaExceeded(
                    "storing this content would exceed the account's quota of \(quotaBytes) bytes")
            }
            for c in missingAgain {
                _ = try tx.insertChunk(
                    ChunkKey(account: owner, id: Data(c.id)), size: Int64(c.sealed.count), createdAt: now,
                    inline: Data(c.sealed))
            }
            for c in fresh {
                let key = ChunkKey(account: owner, id: Data(c.id))
                if let s = staged[c.id] {
                    if try !tx.presentChunks(account: owner, ids: [key.id]).isEmpty { continue }
                    try content.publish(s)
                    published.insert(c.id)
                    _ = try tx.insertChunk(key, size: Int64(c.sealed.count), createdAt: now, inline: nil)
                } else {
                    _ = try tx.insertChunk(key, size: Int64(c.sealed.count), createdAt: now, inline: Data(c.sealed))
                }
            }
            for m in newManifests {
                let key = ManifestKey(account: owner, fileID: Data(m.fileID), digest: Data(m.digest))
                let ids = Array(Set(m.chunkIDs.map { Data($0) }))
                _ = try tx.putManifest(key, sealed: Data(m.sealed), chunkIDs: ids, createdAt: now)
            }
        }
    }

    /// What a `chunks/get` answer will hold, worked out from the sizes the metadata store
    /// recorded, before any chunk is read: each distinct id once, in the order first asked.
    public struct ChunkBundlePlan: Sendable {
        public let account: Data
        /// Each chunk, its size, and whether its bytes are inline in the metadata store.
        public let entries: [(id: Data, size: Int, inline: Bool)]
        /// The whole `ChunkBundle`'s length.
        public let byteCount: Int
    }

    /// Plans the answer to `chunks/get`: 404 if any chunk is missing, 413 if the bundle would
    /// exceed `maxChunkResponseBytes`; duplicates are answered once.
    public func planChunks(caller: Data, ids: [Data], via: Data? = nil) throws(ServerError) -> ChunkBundlePlan {
        guard ids.count <= 100_000 else { throw .tooLarge("ask for at most 100000 chunks at once") }
        for id in ids { try Self.checkChunkID(id) }
        var seen: Set<Data> = []
        let unique = ids.filter { seen.insert($0).inserted }
        let (owner, sizes) = try guarded {
            try metadata.read { tx in
                let owner = try contentOwner(caller: caller, via: via, needs: .read, tx: tx)
                return (owner, try tx.chunkPlacement(account: owner, ids: unique))
            }
        }
        var entries: [(id: Data, size: Int, inline: Bool)] = []
        var total = 4
        for id in unique {
            guard let stored = sizes[id]?.size, let size = Int(exactly: stored), size >= 0 else {
                throw .notFound("chunk \(RequestSigning.hex(Array(id))) is not on the server")
            }
            // total <= maxChunkResponseBytes here, so with size bounded first the sum cannot overflow.
            guard size <= maxChunkResponseBytes, total + 36 + size <= maxChunkResponseBytes else {
                throw .tooLarge("the chunks asked for exceed \(maxChunkResponseBytes) bytes; ask for fewer at once")
            }
            total += 36 + size
            entries.append((id, size, sizes[id]?.inline ?? false))
        }
        return ChunkBundlePlan(account: owner, entries: entries, byteCount: total)
    }

    /// Reads a planned bundle piece by piece (at most `chunkPieceBytes` of chunk bytes at a time),
    /// so answering holds one piece, not the bundle.
    public func bundleReader(_ plan: ChunkBundlePlan) -> ChunkBundleReader {
        ChunkBundleReader(server: self, plan: plan)
    }

    /// The requested chunks as one `ChunkBundle` in memory (tests and tools; the HTTP route
    /// streams `bundleReader`).
    public func getChunks(caller: Data, ids: [Data], via: Data? = nil) throws(ServerError) -> [UInt8] {
        let reader = bundleReader(try planChunks(caller: caller, ids: ids, via: via))
        var out: [UInt8] = []
        while let piece = try reader.next() { out += piece }
        return out
    }

    // MARK: - Manifests

    public func putManifest(caller: Data, _ req: PutManifestRequest) throws(ServerError) {
        guard req.fileID.count == 16 else { throw .badRequest("a file id has 16 bytes") }
        guard req.digest.count == 32, blake2b(Array(req.sealed)) == Array(req.digest) else {
            throw .badRequest("digest is not the BLAKE2b-256 of the sealed manifest")
        }
        guard req.chunkIDs.count <= 1_000_000 else { throw .tooLarge("too many chunks in one manifest") }
        for id in req.chunkIDs { try Self.checkChunkID(id) }
        try guarded {
            try metadata.write { tx in
                guard try tx.account(key: caller) != nil else {
                    throw ServerError.unauthorized("no account has this key")
                }
                // A stored document's content is its owner's; a new one's, the owner's of `via`.
                let stored = try tx.file(id: req.fileID)
                let owner = try contentOwner(
                    caller: caller, via: stored != nil ? req.fileID : req.via, needs: .write, tx: tx)
                if let stored, stored.account != owner { throw ServerError.forbidden(Self.unusableFileID(req.fileID)) }
                guard let account = try tx.lockAccount(key: owner) else {
                    throw ServerError.unauthorized("no account has this key")
                }
                let key = ManifestKey(account: owner, fileID: req.fileID, digest: req.digest)
                if try tx.hasManifest(key) { return }
                let present = try tx.presentChunks(account: owner, ids: req.chunkIDs)
                let missing = Set(req.chunkIDs).subtracting(present)
                guard missing.isEmpty else {
                    throw ServerError.conflict(
                        "\(missing.count) chunk(s) listed by the manifest are not on the server; upload them first")
                }
                guard fitsQuota(used: account.bytesUsed, adding: QuotaRule.counted(row: Int64(req.sealed.count))) else {
                    throw ServerError.quotaExceeded(
                        "storing this manifest would exceed the account's quota of \(quotaBytes) bytes")
                }
                _ = try tx.putManifest(key, sealed: req.sealed, chunkIDs: Array(Set(req.chunkIDs)), createdAt: now)
            }
        }
    }

    /// Many manifests at once (`POST /v1/manifests/many`), each as `getManifest` reads it; one
    /// the server lacks, or the caller may not read, is answered without bytes.
    public func getManifests(caller: Data, _ req: ManyManifestsRequest) throws(ServerError) -> [UInt8] {
        guard req.items.count <= ManyManifestsRequest.maxItems else {
            throw .tooLarge("ask for at most \(ManyManifestsRequest.maxItems) manifests at once")
        }
        for item in req.items {
            guard item.fileID.count == 16, item.digest.count <= 64 else {
                throw .badRequest("malformed file id or digest")
            }
        }
        let entries = try guarded {
            try metadata.read { tx in
                var owners: [Data: Data] = [:]
                return try req.items.map { item -> ManifestBundle.Entry in
                    let owner =
                        try owners[item.fileID]
                        ?? grantedOwner(caller: caller, file: item.fileID, needs: .read, tx: tx) ?? caller
                    owners[item.fileID] = owner
                    let sealed = try tx.manifest(ManifestKey(account: owner, fileID: item.fileID, digest: item.digest))
                    return ManifestBundle.Entry(
                        fileID: Array(item.fileID), digest: Array(item.digest), sealed: sealed.map { Array($0) })
                }
            }
        }
        return ManifestBundle.encode(entries)
    }

    public func getManifest(caller: Data, _ req: GetManifestRequest) throws(ServerError) -> Data {
        guard req.fileID.count == 16, req.digest.count <= 64 else { throw .badRequest("malformed file id or digest") }
        let sealed = try guarded {
            try metadata.read { tx in
                // Another account's document is read by a grantee, in its owner's namespace; for
                // anyone else the answer is the one for a manifest that does not exist.
                let owner = try grantedOwner(caller: caller, file: req.fileID, needs: .read, tx: tx) ?? caller
                return try tx.manifest(ManifestKey(account: owner, fileID: req.fileID, digest: req.digest))
            }
        }
        guard let sealed else { throw .notFound("no such manifest") }
        return sealed
    }

    /// Whose content a request touches: the caller's own, or, with `via` (a file of another
    /// account's tree), that account's, if the caller holds at least `mode` on `via` now
    /// (docs/SHARING.md, "Content"). Anything else is refused as an unusable file id.
    func contentOwner(caller: Data, via: Data?, needs mode: AccessMode, tx: any MetadataReader) throws -> Data {
        guard let via else { return caller }
        guard via.count == 16 else { throw ServerError.badRequest("via is not a file id") }
        guard let owner = try grantedOwner(caller: caller, file: via, needs: mode, tx: tx) else {
            throw ServerError.forbidden(Self.unusableFileID(via))
        }
        return owner
    }

    /// The owner of `file` if the caller holds at least `mode` on it (its own files included);
    /// nil if it is not stored or the caller holds less. Throws only when storage fails.
    func grantedOwner(caller: Data, file: Data, needs mode: AccessMode, tx: any MetadataReader) throws -> Data? {
        guard let id = try? FileID(bytes: Array(file)), let f = try tx.file(id: file) else { return nil }
        if f.account == caller { return caller }
        guard let callerID = try? AccountID(bytes: Array(caller)) else { return nil }
        let view = StorageTreeView(account: f.account, reader: tx)
        let held = view.accessMode(of: callerID, on: id)
        try view.throwIfFailed()
        guard let held, held >= mode else { return nil }
        return f.account
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
            self.manifests = manifests
            self.chunks = chunks
            self.strayFiles = strayFiles
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

/// The bytes of one planned `ChunkBundle`, in pieces. One caller at a time (the HTTP route reads
/// it from one task); the lock only makes handing it between threads safe.
public final class ChunkBundleReader: Sendable {
    struct State {
        var headerSent = false
        var index = 0
        var reader: (any ChunkReading)?
        var remaining = 0
    }

    let server: CofferServer
    let plan: CofferServer.ChunkBundlePlan
    let state = Mutex(State())

    init(server: CofferServer, plan: CofferServer.ChunkBundlePlan) {
        self.server = server
        self.plan = plan
    }

    public var byteCount: Int { plan.byteCount }

    /// The next piece of the bundle, or nil at its end. A chunk that vanished or shrank since it
    /// was planned is an error (the answer cannot be completed; the client asks again).
    public func next() throws(ServerError) -> [UInt8]? {
        try server.guarded {
            try state.withLock { s throws -> [UInt8]? in
                if !s.headerSent {
                    s.headerSent = true
                    return ChunkBundle.header(count: plan.entries.count)
                }
                if s.reader != nil, s.remaining > 0 {
                    let piece = try s.reader?.read(upTo: min(s.remaining, CofferServer.chunkPieceBytes)) ?? []
                    guard !piece.isEmpty else { throw StorageError("a chunk is shorter than recorded") }
                    s.remaining -= piece.count
                    if s.remaining == 0 { s.reader = nil }
                    return piece
                }
                guard s.index < plan.entries.count else { return nil }
                let entry = plan.entries[s.index]
                s.index += 1
                let key = ChunkKey(account: plan.account, id: entry.id)
                if entry.inline {
                    // Small: read whole, with its header.
                    guard let data = try server.metadata.read({ try $0.inlineChunk(key) }), data.count == entry.size
                    else {
                        throw StorageError("a chunk vanished or changed while being sent")
                    }
                    return ChunkBundle.entryHeader(id: Array(entry.id), size: entry.size) + Array(data)
                }
                guard let reader = try server.content.open(key) else {
                    throw StorageError("a chunk vanished while being sent")
                }
                s.reader = entry.size > 0 ? reader : nil
                s.remaining = entry.size
                return ChunkBundle.entryHeader(id: Array(entry.id), size: entry.size)
            }
        }
    }
}
