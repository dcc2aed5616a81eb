import CofferContent
import CofferCrypto
import CofferModel
import CofferStore
import Foundation
import Synchronization

/// The decrypted file tree one account works with on this device.
///
/// A vault is the thin layer between the pure model and everything with I/O: it holds the
/// account keys, reads the current tree (local over base) from the store as operations need it
/// (`StoreTree`, with bounded record, key, name and attribute caches, so memory does not grow
/// with the tree), turns user operations into signed metadata batches validated by the model,
/// and commits each batch as one store transaction. The CLI and the FUSE daemon both drive one.
///
/// Several vaults (processes) can share a store: every commit first catches up with the store's
/// change log inside its write transaction, so validation always sees the latest tree.
public final class Vault: Sendable {
    public let dataDirectory: String
    let store: Store
    package let secret: AccountSecret
    package let signing: SigningKeyPair
    package let box: BoxKeyPair
    public let accountID: AccountID
    let storedUsername: String
    /// The account's name: the root folder's name once there is a root (a device that joined from
    /// a server learns it with the first pull), else what the store was created with.
    public var username: String {
        state.withLock { s in
            guard let root = s.view.tree.rootID else { return storedUsername }
            return (try? s.view.name(root)) ?? storedUsername
        }
    }
    /// The tie-break of this vault's stamps (`HybridTimestamp.device`): random per opened vault,
    /// so no two processes on one store issue equal stamps.
    let deviceID: UInt32
    /// How many records, keys, names and attributes each of the tree's caches holds at most.
    let cacheEntries: Int
    let locks: StoreLocks
    package let now: @Sendable () -> Timespec

    package let state: Mutex<VaultState>
    let openDocuments = Mutex<[FileID: OpenDocument]>([:])
    /// Keys of shared files opened so far (a file keeps its key for life), so the mount does not
    /// unwrap a share's key chain again for every request.
    let sharedKeys = SharedKeyCache()
    /// Records of shared files read so far, dropped when a pull (here or in another process,
    /// through the change log) changes them.
    let sharedRecords = SharedRecordCache()
    /// Held while saved work from shares is drained into the own tree (`drainRecovery`).
    let draining = Mutex<Void>(())
    /// This vault's name for the store's drain lease (`drainRecovery`): random per instance.
    let drainToken = randomBytes(16)
    /// The links shown so far as the shared file each places (`presented(link:)`), by target: a
    /// change to the shared file is a change to what the mount shows at the link.
    let shownLinks = Mutex<[FileID: FileID]>([:])
    /// Where content this device keeps on demand is fetched from (`setRemoteContent`).
    let remoteContent = Mutex<(any RemoteContentSource)?>(nil)
    /// When this process last read each document's content (ms), for trimming the cache of a
    /// store on demand (`trimContent`); nil unless the mount trims (`trackContentReads`). In
    /// memory: bounded by the documents read.
    let contentReads = Mutex<[FileID: Int64]?>(nil)
    /// Content fetched by this process so far (pulls and reads), and at the last trim: a trim
    /// with nothing fetched since the last one has nothing to do.
    let contentFetched = Atomic<Int>(0)
    let lastTrimAt = Atomic<Int>(-1)
    /// See `coalesceFolderTimes`.
    let coalescing = Atomic<Bool>(false)
    /// Group transactions found lost (their writes gone) by this vault: a batch tool such as
    /// `coffer import` compares it before and after, as no single call reports the loss.
    public let lostGroups = Atomic<Int>(0)

    /// Entries each of the tree's caches holds at most by default (records, keys, names,
    /// attributes): about 2 KB per entry in all (measured: a mount's memory after `ls -lR` of
    /// 20,000 files grew 37 MB more with room for all of them than with 1,000), so about 30 MB
    /// whatever the tree's size.
    public static let defaultCacheEntries = 16_384

    /// How many plaintext bytes an open document may buffer before it seals them into chunks.
    public static let writeBufferLimit = 16 * 1024 * 1024

    /// The largest document: 64 GiB. A manifest lists every chunk (256 Ki of them at this size,
    /// about 9 MB sealed), and a sync moves the whole manifest with every version, so the limit
    /// keeps one file's bookkeeping bounded. Larger writes and truncates fail with EFBIG.
    public static let maxDocumentSize: UInt64 = 64 << 30

    static let secretFile = "account.secret"

    init(
        dataDirectory: String, store: Store, secret: AccountSecret, username: String, deviceID: UInt32,
        locks: StoreLocks, now: @escaping @Sendable () -> Timespec, cacheEntries: Int
    ) throws {
        self.dataDirectory = dataDirectory
        self.store = store
        self.secret = secret
        let account = try AccountID(bytes: secret.signingKeys.publicKey.bytes)
        self.signing = secret.signingKeys
        self.box = secret.boxKeys
        self.accountID = account
        self.storedUsername = username
        self.deviceID = deviceID
        self.locks = locks
        self.now = now
        let access = AccountKeyAccess(account: account, box: secret.boxKeys)
        self.cacheEntries = cacheEntries
        let view = KeyedTree(
            tree: StoreTree(store: store, capacity: cacheEntries), cache: KeyCache(capacity: cacheEntries),
            access: access)
        self.state = Mutex(VaultState(view: view))
        try state.withLock { s in try reloadAll(&s) }
    }

    public static func systemNow() -> Timespec {
        var ts = timespec()
        clock_gettime(CLOCK_REALTIME, &ts)
        return Timespec(seconds: Int64(ts.tv_sec), nanoseconds: Int64(ts.tv_nsec))
    }

    // MARK: Creating and opening

    /// Creates a new account and an empty tree in `dataDirectory`.
    /// With `createRoot: false` the tree starts empty and arrives with the first pull (a new
    /// device joining an account that already has a tree on a server).
    /// With `passphrase`, the secret is sealed at rest under the new passphrase it gives (asked
    /// before anything is written, so a refused prompt leaves no half-made store).
    public static func create(
        dataDirectory: String, username: String, secret: AccountSecret = .generate(),
        passphrase: (any PassphraseSource)? = nil, createRoot: Bool = true,
        now: @escaping @Sendable () -> Timespec = Vault.systemNow, cacheEntries: Int = Vault.defaultCacheEntries
    ) throws -> Vault {
        // The model's one rule, which the server applies too: a name this device accepts is one
        // the server accepts, stored in the same normalised form.
        guard let name = Username.normalized(username.trimmingCharacters(in: .whitespaces)) else {
            throw VaultError.invalidArgument("invalid username \"\(username.prefix(80))\": \(Username.rule)")
        }
        if FileManager.default.fileExists(atPath: dataDirectory + "/" + secretFile) {
            throw VaultError.accountExists(dataDirectory)
        }
        let sealing = try passphrase?.newPassphrase()
        let store = try Store(directory: dataDirectory)
        let locks = try StoreLocks(directory: dataDirectory)
        let device = UInt32.random(in: 1...UInt32.max)
        guard try !store.read({ try $0.hasFiles() }) else { throw VaultError.accountExists(dataDirectory) }
        try store.write { w in
            try w.setSetting("username", Array(name.utf8))
            try w.setSetting("device", withUnsafeBytes(of: device.bigEndian) { Array($0) })
        }
        // The secret is written last: its presence is what marks the store as initialised.
        try writeSecret(secret, to: dataDirectory, passphrase: sealing)
        let vault = try Vault(
            dataDirectory: dataDirectory, store: store, secret: secret, username: name,
            deviceID: device, locks: locks, now: now, cacheEntries: cacheEntries)
        if createRoot { try vault.createRoot() }
        return vault
    }

    /// Opens the account stored in `dataDirectory`. `passphrase` is asked (once) only if the
    /// account key is sealed under one. `cacheEntries` bounds each of the tree's caches (records,
    /// keys, names, attributes; about 2 KB per entry in all).
    public static func open(
        dataDirectory: String, passphrase: (any PassphraseSource)? = nil,
        now: @escaping @Sendable () -> Timespec = Vault.systemNow, cacheEntries: Int = Vault.defaultCacheEntries
    ) throws -> Vault {
        let secret = try readSecret(in: dataDirectory, passphrase: passphrase)
        let store = try Store(directory: dataDirectory)
        let locks = try StoreLocks(directory: dataDirectory)
        let username = try store.read { r in
            try r.setting("username").map { String(decoding: $0, as: UTF8.self) } ?? "coffer"
        }
        // The stamps' tie-break is drawn afresh for each opened vault, not kept per store: a
        // daemon and a command on one store, each with its own clock, must never issue equal
        // stamps (two different changes at one stamp would merge differently on each device).
        let device = UInt32.random(in: 1...UInt32.max)
        return try Vault(
            dataDirectory: dataDirectory, store: store, secret: secret, username: username,
            deviceID: device, locks: locks, now: now, cacheEntries: cacheEntries)
    }

    /// The largest `account.secret` read: both formats are far smaller (a plain key is one
    /// 53-character line, a sealed one 109 bytes), and a huge file is damage, not a key.
    static let secretFileLimit = 4096

    /// The bytes of `account.secret`, read as hostile input (bounded, never trusted to be small).
    static func secretFileBytes(in directory: String) throws -> [UInt8] {
        let path = directory + "/" + secretFile
        let fd = Foundation.open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else {
            if errno == ENOENT { throw VaultError.noAccount(directory) }
            throw VaultError.io("cannot read \(path): \(String(cString: strerror(errno)))")
        }
        defer { close(fd) }
        var buffer = [UInt8](repeating: 0, count: secretFileLimit + 1)
        var filled = 0
        while filled < buffer.count {
            let n = buffer.withUnsafeMutableBytes { b in
                b.baseAddress.map { Foundation.read(fd, $0 + filled, b.count - filled) } ?? 0
            }
            if n < 0 && errno == EINTR { continue }
            guard n >= 0 else { throw VaultError.io("cannot read \(path): \(String(cString: strerror(errno)))") }
            if n == 0 { break }
            filled += n
        }
        guard filled <= secretFileLimit else { throw VaultError.corrupt("\(path) is larger than any account key") }
        return Array(buffer[0..<filled])
    }

    static func readSecret(in directory: String, passphrase: (any PassphraseSource)?) throws -> AccountSecret {
        let bytes = try secretFileBytes(in: directory)
        guard SealedAccountSecret.isSealed(bytes) else {
            guard let text = String(validating: bytes, as: UTF8.self) else {
                throw VaultError.corrupt("\(directory)/\(secretFile) is neither a sealed nor a plain account key")
            }
            return try AccountSecret(base64: text)
        }
        guard let passphrase else {
            throw VaultError.invalidArgument(
                "the account key in \(directory) is protected by a passphrase, and none was given")
        }
        return try SealedAccountSecret.open(bytes, passphrase: try passphrase.existingPassphrase())
    }

    /// Whether the account key in `dataDirectory` is sealed under a passphrase (a mount asks for
    /// it before it detaches from the terminal).
    public static func accountKeyIsProtected(dataDirectory: String) throws -> Bool {
        SealedAccountSecret.isSealed(try secretFileBytes(in: dataDirectory))
    }

    /// Seals the account key at rest under `passphrase` from now on, or stores it plain with `nil`.
    public func protectAccountKey(with passphrase: Passphrase?) throws {
        try Self.writeSecret(secret, to: dataDirectory, passphrase: passphrase)
    }

    /// Replaces `account.secret` atomically: a temporary file (mode 0600, fsynced) renamed over
    /// it, then the directory fsynced, so a crash leaves the old key or the new one, never neither.
    static func writeSecret(_ secret: AccountSecret, to directory: String, passphrase: Passphrase? = nil) throws {
        let path = directory + "/" + secretFile
        let tmp = path + ".tmp"
        var bytes =
            try passphrase.map { try SealedAccountSecret.seal(secret, passphrase: $0) }
            ?? Array((secret.base64 + "\n").utf8)
        defer { bytes.withUnsafeMutableBytes { _ = $0.initializeMemory(as: UInt8.self, repeating: 0) } }
        // A leftover temporary (an interrupted write) or a planted link is removed, not followed.
        unlink(tmp)
        let fd = Foundation.open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw VaultError.io("cannot write \(tmp): \(String(cString: strerror(errno)))") }
        let written = bytes.withUnsafeBytes { Foundation.write(fd, $0.baseAddress, $0.count) }
        fchmod(fd, 0o600)
        let synced = fsync(fd)
        close(fd)
        guard written == bytes.count, synced == 0, Glibc.rename(tmp, path) == 0 else {
            unlink(tmp)
            throw VaultError.io("cannot write the account secret to \(path)")
        }
        let dirFD = Foundation.open(directory, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard dirFD >= 0 else { throw VaultError.io("cannot open \(directory) to make the new account secret durable") }
        defer { close(dirFD) }
        guard fsync(dirFD) == 0 else { throw VaultError.io("cannot make the new account secret in \(path) durable") }
    }

    /// The account secret, for the user's own export.
    public var exportedSecret: AccountSecret { secret }

    private func createRoot() throws {
        try state.withLock { s in
            guard s.view.tree.rootID == nil else { return }
            let id = try FileID(random: randomBytes(16))
            let key = SymmetricKey.random()
            let stamp = nextStamp(&s)
            let t = now()
            let attrs = PosixAttributes(mode: 0o755, uid: getuid(), gid: getgid(), mtime: t, stamp: stamp)
            let sealedName = SealedName(sealing: storedUsername, parentKey: key, of: id)
            let access = AccessEntry(
                account: accountID, mode: .owner, sealedKey: box.publicKey.seal(key: key, fileID: id.bytes))
            let m = FileMetadata(
                id: id, type: .folder, parent: id, name: sealedName, owner: accountID,
                wrappedKey: [], access: [access],
                sealedAttributes: attrs.sealed(key: key, of: id),
                lastModifiedBy: accountID)
            var batch = Batch(base: s.view.tree)
            batch.upsertUnchecked(m)
            _ = try batch.validate()
            try store.write { w in try w.put(StoredFile(signed: unsigned(m)), .local) }
            s.view.cache.keys[id] = key
            try catchUp(&s)
        }
    }

    // MARK: Helpers used under the state lock

    /// `m` signed by this account, which it names as its writer: a local change to a record
    /// another account wrote last (a grantee, in a shared folder) is this account's from now on.
    func sign(_ m: FileMetadata, revision: UInt64) -> SignedMetadata {
        var m = m
        m.lastModifiedBy = accountID
        return SignedMetadata(
            metadata: m, revision: revision,
            signature: signing.sign(SignedMetadata.message(metadata: m, revision: revision)))
    }

    /// Wall-clock milliseconds, for record revisions.
    var nowMillis: UInt64 {
        let t = now()
        return UInt64(max(0, t.seconds)) &* 1000 &+ UInt64(max(0, t.nanoseconds)) / 1_000_000
    }

    /// Wall-clock milliseconds since the epoch, for what `coffer status` shows.
    var epochMillis: Int64 { Int64(clamping: nowMillis) }

    /// A note kept in a setting: a time (ms) and some lines of text, one per field.
    static func stampedNote(_ millis: Int64, _ fields: [String]) -> [UInt8] {
        Array(([String(millis)] + fields).joined(separator: "\n").utf8)
    }

    /// `stampedNote` read back: nil unless it starts with a time. A field holds no line break
    /// (the last one may: it takes the rest).
    static func stampedNote(_ bytes: [UInt8], fields: Int = 1) -> (millis: Int64, fields: [String])? {
        let parts = String(decoding: bytes, as: UTF8.self).split(
            separator: "\n", maxSplits: fields, omittingEmptySubsequences: false)
        guard let first = parts.first, let ms = Int64(first) else { return nil }
        return (ms, parts.dropFirst().map(String.init))
    }

    /// A local edit as stored until it is pushed. Signatures are for what leaves the device:
    /// `pendingRecords` signs each record on its way to the server. Signing every local commit
    /// instead (a sixth of a small commit's cost) would protect nothing: anyone who can rewrite
    /// the store can also read the account key beside it.
    func unsigned(_ m: FileMetadata) -> SignedMetadata {
        SignedMetadata(metadata: m, signature: [])
    }

    /// A new stamp, later than every one this vault issued (across restarts: `clockLease`) or
    /// opened (`KeyCache.latestStamp`): a change made after seeing another device's wins over it.
    func nextStamp(_ s: inout VaultState) -> HybridTimestamp {
        s.clock = HybridTimestamp.next(after: max(s.clock, s.view.cache.latestStamp), now: nowMillis, device: deviceID)
        return s.clock
    }

    /// How far ahead of the clock the stored lease is set (`clockLease`).
    static let clockLeaseMillis: UInt64 = 10_000

    /// Stores a new clock lease in this write if the clock has come near the stored one: a stamp
    /// is never issued past the stored lease, so a reopened vault starting from the lease issues
    /// only later stamps, without reading every record's attributes to find the latest.
    ///
    /// A vault that started from a lease still ahead of the wall clock (a command run within
    /// seconds of another's write) issues stamps at the lease, counting up, until the wall clock
    /// passes it: its lease then needs to lie only just past them. Set 10 s ahead each time
    /// instead, every short-lived process would start 10 s further ahead than the one before,
    /// and a burst of commands on one device would win every later merge against devices whose
    /// changes really came after (`ShareWriteTests` found it).
    func renewClockLease(_ s: inout VaultState, _ w: StoreWriter) throws {
        guard s.clock.wallMillis &+ 1000 >= s.clockLease else { return }
        let ahead = s.clock.wallMillis > nowMillis
        let lease = s.clock.wallMillis &+ (ahead ? 1 : Self.clockLeaseMillis)
        guard lease > s.clockLease else { return }
        try w.setSetting("clock", Self.bytes(Int64(clamping: lease)))
        s.clockLease = lease
    }

    /// A file's attributes as stat shows them: a folder time not yet written wins over an older
    /// record (the record may have been replaced meanwhile, by a pull or another process, and
    /// the cache dropped).
    func attributes(_ id: FileID, _ s: inout VaultState) throws -> PosixAttributes {
        // Every stat asks: a hit spares looking the pending times up.
        if let a = s.view.cache.attributes[id] { return a }
        let pending = s.pendingFolderTimes[id]
        return try s.view.attributes(id) { Self.apply(pending, to: &$0) }
    }

    /// A folder's modification time not yet written (`pendingFolderTimes`), if it is the later.
    static func apply(_ pending: PendingFolderTime?, to a: inout PosixAttributes) {
        guard let p = pending, p.stamp > a.mtime.stamp else { return }
        a.mtime = Stamped(p.time, at: p.stamp)
        a.ctime = max(a.ctime, p.time)
    }

    func node(_ id: FileID, _ s: inout VaultState) throws -> Node {
        guard let m = s.view.tree.file(id) else { throw TreeError.notFound(id.description) }
        return try node(m, &s)
    }

    /// The node of a record already read (a folder's listing reads its children in one query).
    func node(_ m: FileMetadata, _ s: inout VaultState) throws -> Node {
        let open = m.type == .document ? openDocuments.withLock({ $0[m.id] }) : nil
        return node(m, name: try s.view.name(m.id), attributes: try attributes(m.id, &s), open: open, &s)
    }

    /// The node of a record whose name and attributes are open, with what `open` has not
    /// written yet laid over them.
    func node(
        _ m: FileMetadata, name: String, attributes: PosixAttributes, open: OpenDocument?, _ s: inout VaultState
    ) -> Node {
        let id = m.id
        var attrs = attributes
        if let open {
            attrs.size = open.currentSize
            if let mt = open.pendingMtime { attrs.mtime.value = mt }
            if let at = open.pendingAtime { attrs.atime.value = at }
            if let ct = open.pendingCtime { attrs.ctime = max(attrs.ctime, ct) }
            let own = open.pendingOwnership
            if let mode = own.mode { attrs.mode.value = mode }
            if let uid = own.uid { attrs.uid.value = uid }
            if let gid = own.gid { attrs.gid.value = gid }
        }
        return Node(
            id: id, type: m.type, parent: m.parent, name: name, attributes: attrs,
            subfolders: m.type == .folder ? s.view.tree.subfolderCount(of: id) : 0)
    }

    // MARK: Loading and catching up

    /// Starts over from the store: every cache dropped, the change log's end and the clock's
    /// lease read again. With `lost`, also what this process wrote that a failed group commit
    /// took with it. Nothing here reads the tree: opening costs the same at any size.
    func reloadAll(_ s: inout VaultState, lost: Bool = false) throws {
        let (last, lease) = try store.read { r in
            (try r.lastChange(), try r.setting("clock").map { Self.int64($0) } ?? 0)
        }
        if s.lastSeq > 0, let (ids, _) = try? store.read({ try $0.changes(after: s.lastSeq) }) {
            s.externalChanges.formUnion(ids)
        }
        s.view.tree.reset(pending: lost)
        s.view.cache = KeyCache(capacity: cacheEntries)
        forgetSharedReads()
        s.pendingFolderTimes = lost ? [:] : s.pendingFolderTimes
        s.lastSeq = last
        s.clockLease = UInt64(clamping: max(lease, 0))
        if s.clockLease > s.clock.wallMillis {
            s.clock = HybridTimestamp(wallMillis: s.clockLease, counter: 0, device: deviceID)
        }
    }

    /// Applies other writers' commits since the last one this vault saw. Returns the changed ids.
    @discardableResult
    func catchUp(_ s: inout VaultState) throws -> Set<FileID> {
        let (ids, last) = try store.read { r in try r.changes(after: s.lastSeq) }
        s.view.invalidate(ids)
        if !ids.isEmpty { forgetSharedReads() }
        s.lastSeq = last
        return ids
    }

    /// After a write outside `commit` (a pull, a push's bookkeeping, pruning): makes the store's
    /// readers see it (commits an open group) and forgets what is cached of `ids`, and of every
    /// file another process changed since this vault last looked (kept for `refresh`, so the
    /// kernel hears of them too).
    func settle(_ ids: some Collection<FileID>, _ s: inout VaultState) throws {
        try store.commitPendingWrites()
        s.view.invalidate(ids)
        let theirs = try catchUp(&s).subtracting(ids)
        s.externalChanges.formUnion(theirs)
    }

    /// Picks up commits made by other processes (the daemon calls this periodically). Returns the
    /// ids that changed, so the caller can tell the kernel.
    public func refresh() throws -> Set<FileID> {
        let latest = try store.readOne { try $0.lastChange() }
        return try state.withLock { s in
            var ids = s.externalChanges
            s.externalChanges = []
            if latest != s.lastSeq { ids.formUnion(try catchUp(&s)) }
            return ids
        }
    }

    // MARK: Committing

    /// A group commit failed and took this vault's recent writes with it: what is in memory is
    /// ahead of the store. Start over from the store.
    func recoverLostGroup(_ s: inout VaultState) throws {
        guard store.takeLostGroup() else { return }
        lostGroups.add(1, ordering: .relaxed)
        try reloadAll(&s, lost: true)
        for doc in openDocuments.withLock({ Array($0.values) }) { doc.poison() }
    }

    /// Catches up with other writers inside a write transaction (nobody can commit in between):
    /// what they changed is forgotten here and kept for `refresh`. Returns the last change
    /// logged before this transaction's own.
    func catchUp(_ s: inout VaultState, in w: StoreWriter) throws -> Int64 {
        // Usually nobody did, and the cheap check spares reading the log. Inside the group
        // transaction this vault last committed in, with no change logged in this process
        // since, the log cannot have moved: skip the query.
        let unmoved =
            w.groupGeneration != nil && w.groupGeneration == s.checkedGroup && w.lastLoggedInProcess == s.lastSeq
        let latest = unmoved ? s.lastSeq : try w.reader.lastChange()
        let (ids, last) = latest == s.lastSeq ? ([], latest) : try w.reader.changes(after: s.lastSeq)
        if !ids.isEmpty {
            s.view.invalidate(ids)
            s.externalChanges.formUnion(ids)
            forgetSharedReads()
        }
        s.lastSeq = last
        return latest
    }

    /// Builds a batch under the state lock inside one store write transaction, validates it as a
    /// whole, signs and stores every changed record, and only then updates memory.
    @discardableResult
    func commit<R: Sendable>(_ body: (inout Batch<StoreTree>, inout VaultState, StoreWriter) throws -> R) throws -> R {
        do {
            return try state.withLock { s in
                let pendingBefore = s.pendingFolderTimes
                let leaseBefore = s.clockLease
                do {
                    try recoverLostGroup(&s)
                    let (result, written, lastSeq, group) = try store.write {
                        w -> (R, [(id: FileID, before: FileMetadata?, after: TreeEntry?)], Int64, UInt64?) in
                        let latest = try catchUp(&s, in: w)
                        var batch = Batch(base: s.view.tree)
                        let result = try body(&batch, &s, w)
                        try writeDueFolderTimes(&batch, &s, force: false)
                        let changed = try batch.validate(describe: s.view.describe)
                        // A batch checked against a tree the store could not read is not written.
                        if let failure = s.view.tree.takeFailure() { throw VaultError.io(failure) }
                        try renewClockLease(&s, w)
                        // Each record as the tree held it and as written, read before this write
                        // commits: what the caches must forget.
                        var written: [(id: FileID, before: FileMetadata?, after: TreeEntry?)] = []
                        written.reserveCapacity(changed.count)
                        for var m in changed {
                            // A change made here is this account's, whoever wrote the record
                            // last (a grantee, in a shared folder).
                            m.lastModifiedBy = accountID
                            // One read gives the record as it was and the server's versions of it.
                            let old = s.view.tree.entry(m.id)
                            let before = old?.metadata
                            // A deletion the server never saw is pruned right here, in the same
                            // transaction: nothing will ever need to push it.
                            // Asked of the read connections, not through the writer: in the
                            // mount daemon that would run the group's whole queue inside this
                            // request (every unlink of rm -rf; `Store.committedInBase`).
                            if s.pruneCandidates.contains(m.id), m.isDeleted, try !store.committedInBase(m.id),
                                batch.childIDs(of: m.id).allSatisfy({ s.pruneCandidates.contains($0) })
                            {
                                try w.remove(m.id, .local)  // a no-op if it never reached the store
                                try w.forgetInode(of: m.id)
                                written.append((m.id, before, nil))
                                continue
                            }
                            // The tree still holds the record as it was (the batch lands below),
                            // so it knows what the row named.
                            let entry = TreeEntry(
                                metadata: m, version: old?.version ?? 0, contentVersion: old?.contentVersion ?? 0)
                            try w.put(
                                StoredFile(
                                    signed: unsigned(m), version: entry.version, contentVersion: entry.contentVersion),
                                .local, previousDigest: .some(before?.contentDigest))
                            written.append((m.id, before, entry))
                        }
                        // The reads above (records as they were, versions) must have worked too.
                        if let failure = s.view.tree.takeFailure() { throw VaultError.io(failure) }
                        // Nobody else can log while this transaction is open: the last entry is ours,
                        // or the one read on the way in.
                        return (result, written, w.lastLogged ?? latest, w.groupGeneration)
                    }
                    s.checkedGroup = group
                    s.pruneCandidates = []
                    for x in written { s.view.wrote(x.id, before: x.before, after: x.after, generation: group) }
                    s.lastSeq = lastSeq
                    return result
                } catch {
                    s.pruneCandidates = []
                    s.checkedGroup = nil
                    // A refused batch changed no folder: the bumps it made are forgotten, and the
                    // ones it would have written are pending again.
                    s.pendingFolderTimes = pendingBefore
                    s.clockLease = leaseBefore  // the write that stored a new one did not land
                    // Operations fill the name and attribute caches as they go; a refused batch may
                    // have left entries for changes that never happened, so start those caches over.
                    s.view.cache.names.removeAll()
                    s.view.cache.attributes.removeAll()
                    _ = s.view.tree.takeFailure()
                    throw error
                }
            }
        } catch let e as XattrError {
            throw e  // keeps its own errno (EEXIST, ENODATA)
        } catch {
            throw VaultError.wrap(error)
        }
    }
}

/// A folder's mtime/ctime change kept in memory until its record is written.
struct PendingFolderTime: Sendable {
    var time: Timespec
    var stamp: HybridTimestamp
    /// When the folder's first unwritten bump happened: what decides that a write is due.
    var since: Timespec
}

/// Everything a vault caches about the tree, guarded by one lock.
package struct VaultState: Sendable {
    init(view: KeyedTree<StoreTree>) { self.view = view }

    /// The current tree (local over base) and what was decrypted of it.
    var view: KeyedTree<StoreTree>
    var clock = HybridTimestamp.zero
    /// The clock's lease as stored (`Vault.renewClockLease`), in wall-clock milliseconds.
    var clockLease: UInt64 = 0
    var lastSeq: Int64 = 0
    /// Ids other processes changed, noticed while committing; `refresh` hands them out.
    var externalChanges: Set<FileID> = []
    /// Folder mtime/ctime bumps not yet written to the folder's record (`coalesceFolderTimes`).
    /// A batch that writes one removes it here; `commit` restores them if the batch fails.
    var pendingFolderTimes: [FileID: PendingFolderTime] = [:]
    /// The group transaction (`StoreWriter.groupGeneration`) of this vault's last commit.
    var checkedGroup: UInt64?
    /// Files a `remove` may prune within its own commit (itself and its subtree).
    var pruneCandidates: Set<FileID> = []
}
