import CofferModel
import CofferProtocol
import CofferStore
import CofferVault
import Foundation
import Synchronization

/// How far one step of a sync has come: `done` of `total` (chunks, records or documents), and
/// the bytes moved so far.
public struct SyncProgress: Sendable {
    public var step: String
    public var done: Int
    public var total: Int
    public var bytes: Int
}

/// What one sync did.
public struct SyncReport: Sendable {
    public var pulled = 0
    public var pushedRecords = 0
    public var pushedChunks = 0
    public var fetchedChunks = 0
    public var pruned = 0
    /// Files sent again because the server had lost them (restored from an older backup), or nil
    /// when the server was not found behind this device.
    public var resentToServer: Int?
    /// Ids whose view changed on this device (the daemon tells the kernel).
    public var changed: Set<FileID> = []
    /// Records of shared files refused by the sharing rules (the ones held were kept).
    public var refusedShared: [FeedRefusal] = []
    /// Links removed because the share they placed is gone (revoked, given up or deleted).
    public var removedLinks = 0
    /// Why work saved from shares could not be put in the account's tree yet (it stays queued).
    public var recoveryFailure: String?
    /// Changes to another account's tree its server refused by the sharing rules this time (403:
    /// say a move that would leave a third account's files where it cannot write, until the
    /// owner's device has synced). They stay pending, `coffer status` counts them, and the next
    /// sync tries again; the other owners' changes went on.
    public var refusedSharedPush: [String] = []
    /// Names another device of the account pinned with other keys than this one did (neither
    /// verified over the other): kept as pinned here, for the user to settle.
    public var contactClashes: [String] = []
    /// Why the contact book could not be shared with the account's other devices this time.
    public var contactsFailure: String?
    /// Seconds each step took, in order (`coffer sync --stats`, the sync benchmark).
    public var steps: [(step: String, seconds: Double)] = []

    /// Times `body` as step `name`.
    mutating func time<T>(_ name: String, _ body: (inout SyncReport) async throws -> T) async rethrows -> T {
        let start = ContinuousClock.now
        defer {
            let d = ContinuousClock.now - start
            steps.append((name, Double(d.components.seconds) + Double(d.components.attoseconds) / 1e18))
        }
        return try await body(&self)
    }
}

/// The sync routine (the Lockbook Sync v3 shape): pull, push content, push metadata, pull, prune.
///
/// Content goes up before the metadata that names it (the server refuses a record naming content
/// it does not hold), so "push content" comes before "push metadata" here. A push refused as
/// stale (`get_updates_required`) is followed by a pull, which merges, and a retry. Every step is
/// idempotent: pulled content is stored before the metadata naming it, metadata before the
/// cursor, so a crash anywhere just repeats work on the next sync.
public final class SyncEngine: Sendable {
    public let vault: Vault
    public let client: ServerClient
    let transport: any ServerTransport
    /// Seconds between checks, at the start of a sync, that the server still holds what this
    /// device last read (one small `updates` request); the first sync of an engine always checks.
    let serverCheckInterval: Double
    let lastServerCheck = Mutex<Date?>(nil)
    /// Whether this engine has made sure the server holds the account's key card.
    let cardChecked = Mutex<Bool>(false)
    /// Told how a long step goes (`coffer sync` draws a progress bar on a terminal).
    let progress = Mutex<(@Sendable (SyncProgress) -> Void)?>(nil)

    /// Hands each step's progress to `report` (content and records pushed, content fetched).
    public func onProgress(_ report: @escaping @Sendable (SyncProgress) -> Void) {
        progress.withLock { $0 = report }
    }

    func tell(_ step: String, done: Int, of total: Int, bytes: Int = 0) {
        progress.withLock { $0 }?(SyncProgress(step: step, done: done, total: total, bytes: bytes))
    }

    /// An engine over `transport`; the server's id is pinned in the vault at first contact.
    public init(vault: Vault, transport: any ServerTransport, serverCheckInterval: Double = 300) {
        self.vault = vault
        self.transport = transport
        let identity = ServerClient.ServerIdentity(pinned: { [vault] in vault.serverSettings?.pinnedID }) {
            [vault] id in try vault.pinServerID(id)
        }
        self.client = ServerClient(transport: transport, keys: vault.signing, identity: identity)
        self.serverCheckInterval = serverCheckInterval
    }

    /// An engine for the server recorded in the store, over HTTPS (or plain HTTP to loopback, or
    /// where the user allowed it), trusting the certificate recorded with it if any.
    public static func forStore(_ vault: Vault) throws -> SyncEngine {
        guard let server = vault.serverSettings else {
            throw SyncError.protocolError(
                "no server configured; create the account with `coffer init NAME --server URL`")
        }
        let url = try HTTPTransport.checkedURL(server.url, allowInsecureHTTP: server.insecureHTTP)
        return SyncEngine(
            vault: vault,
            transport: try HTTPTransport(baseURL: url, trustedCertificatePEM: server.trustedCertificatePEM))
    }

    /// Registers this account with the server (with an invite code when the server asks for one).
    public func register(invite: String? = nil) async throws {
        guard transport.reachable(timeout: 3) else { throw SyncError.offline("no connection to the server") }
        let keys = vault.exportedSecret
        let card = ownKeyCard()
        let created = try await client.createAccount(
            CreateAccountRequest(
                username: vault.username,
                signingKey: Data(keys.signingKeys.publicKey.bytes),
                boxKey: Data(keys.boxKeys.publicKey.bytes), invite: invite, card: Data(card.signature)))
        // A server that did not keep the card (one older than key cards) gets it at a sync.
        if created.keyCard?.isValid == true { try? vault.setKeyCardPublished() }
    }

    @discardableResult
    public func sync() async throws -> SyncReport {
        var report = SyncReport()
        do {
            guard transport.reachable(timeout: 3) else { throw SyncError.offline("no connection to the server") }
            client.recheckServerID()
            if serverCheckDue() { try await report.time("server check") { try await catchUpIfServerBehind(&$0) } }
            // Read before the pull: a share accepted while this sync runs keeps its own note.
            let linkNote = try vault.linkAcceptedNote()
            try await report.time("pull") { try await pull(&$0) }
            // Shares before the push, so links whose share went away, or that another device of
            // the account already made, are removed with it.
            try await report.time("pull shares") { try await pullFeed(&$0) }
            // Links an earlier pull of the feed noted but did not get to remove (it stopped).
            report.removedLinks += try vault.removeNotedLinks()
            // Work saved from shares that an earlier sync could not save yet. A failure here
            // keeps it queued (`coffer status` counts it) and stops nothing else.
            do { try vault.drainRecovery() } catch {
                report.recoveryFailure = ServerText.sanitized("\(error)", limit: 300)
            }
            if linkNote != nil { report.removedLinks += try vault.removeBrokenLinks() }
            var attempts = 0
            while true {
                try await resealStaleGrants()
                try await report.time("push content") { try await pushContent(&$0) }
                do {
                    try await report.time("push records") { try await pushMetadata(&$0) }
                    break
                } catch let e as SyncError where e.isGetUpdatesRequired && attempts < 8 {
                    attempts += 1
                    try await report.time("pull") { try await pull(&$0) }
                }
            }
            try await report.time("push shares") { try await pushShared(&$0) }
            try await report.time("pull again") { try await pull(&$0) }
            // Everything is pushed: a link accepted before this sync began is on the server now.
            try vault.clearLinkAcceptedNote(linkNote)
            report.pruned = try vault.pruneSyncedDeletions()
            // Best effort: an account made before key cards signs its keys once; a failure
            // here is tried again by the next engine and never fails a sync.
            try? await publishKeyCardIfNeeded()
            // The contact book, merged with the account's other devices'; a failure (a server
            // that serves an older book, say) is reported and fails nothing else.
            do { report.contactClashes = try await syncContacts() } catch {
                report.contactsFailure = ServerText.sanitized("\(error)", limit: 300)
            }
            vault.recordSyncOutcome(error: nil)
            return report
        } catch {
            // Kept for `coffer status`: never a control character, whatever the error carries.
            vault.recordSyncOutcome(error: ServerText.sanitized("\(error)", limit: 1000))
            throw error
        }
    }

    // MARK: Pull

    /// Every record after version `since`, newest per file, read page by page, and the version
    /// read up to. A hostile server can neither loop it (each page must move the cursor on and
    /// bring a signed record not seen yet) nor leave it inside a version.
    func updates(since cursor: Int64) async throws -> (files: [FileID: RemoteFile], latest: Int64) {
        let read = try await updates(since: cursor, feed: false)
        return (read.files, read.latest)
    }

    /// `updates(since:)` over the account's own tree, or (`feed`) over its share feed alone,
    /// which also names files the account no longer sees (`gone`) and files granted to it again
    /// since `cursor` (`regranted`). A file the feed sends again after naming it gone, or names
    /// gone after sending it, counts as the later of the two.
    func updates(
        since cursor: Int64, feed: Bool
    ) async throws -> (files: [FileID: RemoteFile], gone: Set<FileID>, regranted: Set<FileID>, latest: Int64) {
        var since = cursor
        // Set while a version larger than a page is being read: the last file id of it seen.
        var afterID: Data?
        var byID: [FileID: RemoteFile] = [:]
        var gone: Set<FileID> = []
        var regranted: Set<FileID> = []
        var progress = PageProgress()
        let writers = vault.otherWriterCheck()
        while true {
            let page = try await client.updates(
                since: since, afterID: afterID, feedOnly: feed, origin: feed ? cursor : nil)
            var pageGone: [FileID] = []
            for raw in page.gone ?? [] {
                guard feed, let id = try? FileID(bytes: [UInt8](raw)) else {
                    throw SyncError.protocolError("the server sent a malformed list of files no longer shared")
                }
                pageGone.append(id)
            }
            // Named only beside an entry of the same page (at most a page of them, so a server
            // cannot pile them up).
            let pageRegranted = page.regranted ?? []
            guard pageRegranted.count <= page.files.count + (page.gone?.count ?? 0) else {
                throw SyncError.protocolError("the server sent a malformed list of files granted again")
            }
            for raw in pageRegranted {
                guard feed, let id = try? FileID(bytes: [UInt8](raw)) else {
                    throw SyncError.protocolError("the server sent a malformed list of files granted again")
                }
                regranted.insert(id)
            }
            var records: [RemoteFile] = []
            records.reserveCapacity(page.files.count)
            for f in page.files {
                guard let signed = try? SignedMetadata(decoding: [UInt8](f.record)) else {
                    throw SyncError.protocolError("the server sent a malformed record")
                }
                records.append(
                    RemoteFile(
                        signed: signed, version: f.version, contentVersion: f.contentVersion,
                        serverDeleted: f.serverDeleted))
            }
            // Every record is checked as its page arrives, so nothing unsigned piles up while a
            // server keeps paging (and the catch-up never builds on a record nobody signed).
            if feed {
                try vault.verifyFeedSignatures(records.map(\.signed))
            } else {
                // What this device holds byte for byte (its own push read back) was checked when
                // it was stored.
                let fresh = try vault.unseen(records)
                try vault.verifySignatures(fresh.map(\.signed))
                try writers.admit(fresh)
            }
            for r in records {
                if let prior = byID[r.signed.metadata.id], prior.version > r.version { continue }
                byID[r.signed.metadata.id] = r
                gone.remove(r.signed.metadata.id)
            }
            for id in pageGone {
                byID[id] = nil
                gone.insert(id)
            }
            guard page.latest >= since else { throw SyncError.protocolError("the server's version went backwards") }
            // A page that says "more" must move the cursor on, or the loop would never end; and
            // the last page must end on a whole version, the only cursor worth keeping.
            if page.more, !UpdatesCursor.isAfter((page.latest, page.nextAfterID), (since, afterID)) {
                throw SyncError.protocolError("the server's update cursor did not advance")
            }
            if !page.more, page.nextAfterID != nil {
                throw SyncError.protocolError("the server's updates ended inside a version")
            }
            if let next = page.nextAfterID, next.count != 16 {
                throw SyncError.protocolError("the server sent a malformed update cursor")
            }
            try progress.admit(records, gone: pageGone, more: page.more)
            since = page.latest
            afterID = page.nextAfterID
            if !page.more { break }
        }
        return (byID, gone, regranted, since)
    }

    func pull(_ report: inout SyncReport) async throws {
        let cursor = vault.syncStatus.cursor
        let (byID, since) = try await updates(since: cursor)
        guard !byID.isEmpty || since != cursor else { return }
        // Its own push read back changes nothing but the cursor.
        let files = try vault.unseen(Array(byID.values))
        try vault.verifyRemote(files)
        // Content before the metadata that names it.
        report.fetchedChunks += try await fetch(try vault.onDemandFilter(try vault.contentNeeds(files)), shared: false)
        let changed = try vault.applyPull(files, cursor: since)
        report.pulled += files.count
        report.changed.formUnion(changed)
        // A store on demand keeps its pinned folders' content: what the pull brought into them.
        if vault.isOnDemand { report.fetchedChunks += try await fetch(try vault.pinnedContentNeeds(), shared: false) }
    }

    /// Body bytes sent and received by this engine so far.
    public var traffic: (sent: Int, received: Int, requests: Int) {
        (client.traffic.bytesSent, client.traffic.bytesReceived, client.traffic.requestCount)
    }

    // MARK: Push

    func pushContent(_ report: inout SyncReport) async throws {
        try await upload(try vault.pendingContent(), &report)
    }

    /// Records per upsert request. One batch is validated as a whole on the server; a larger
    /// push (a first sync of a big tree) goes parents first in batches, each valid on its own.
    static let batchSize = 4000

    func pushMetadata(_ report: inout SyncReport) async throws {
        try await upsert(try vault.pendingRecords(), &report) { [vault] in try vault.markPushed($0, version: $1) }
    }

    /// Sends signed records with their preconditions, parents first in batches, and makes each
    /// accepted batch this device's base.
    func upsert(
        _ all: [PendingRecord], _ report: inout SyncReport,
        markPushed: ([PendingRecord], Int64) throws -> Set<FileID>
    ) async throws {
        guard !all.isEmpty else { return }
        var done = 0
        for records in Self.parentsFirst(all) {
            let request = UpsertRequest(
                updates: records.map {
                    FileUpdate(
                        record: Data($0.stored.signed.encoded()),
                        expectedParent: $0.expectedParent.map { Data($0.bytes) },
                        expectedNameMAC: $0.expectedNameMAC.map { Data($0) }, expectedRevision: $0.expectedRevision)
                })
            let response = try await client.upsert(request)
            let changed = try markPushed(records, response.version)
            report.pushedRecords += records.count
            done += records.count
            tell("pushing records", done: done, of: all.count)
            report.changed.formUnion(changed)
        }
    }

    /// Upsert batches of at most `batchSize` records, parents before children when there is more
    /// than one batch, so each batch is valid on its own; grant changes to files the server has
    /// go last, after what the same change re-signed below them (a revocation is refused while
    /// the revoked account's records are left under it).
    static func parentsFirst(_ all: [PendingRecord]) -> [[PendingRecord]] {
        let batches: [[PendingRecord]]
        if all.count <= Self.batchSize {
            batches = [all]
        } else {
            let byID = Dictionary(all.map { ($0.stored.metadata.id, $0) }, uniquingKeysWith: { a, _ in a })
            var depth: [FileID: Int] = [:]
            func depthOf(_ id: FileID, _ guardCount: Int = 0) -> Int {
                if let d = depth[id] { return d }
                guard guardCount < 10_000, let r = byID[id], !r.stored.metadata.isRoot else { return 0 }
                let d = depthOf(r.stored.metadata.parent, guardCount + 1) + 1
                depth[id] = d
                return d
            }
            // Grant changes deepest first: a revocation on a folder comes after the records
            // below it that the same change re-sealed.
            func key(_ r: PendingRecord) -> (Int, Int) {
                let depth = depthOf(r.stored.metadata.id)
                return r.changesGrants ? (1, -depth) : (0, depth)
            }
            let sorted = all.sorted { key($0) < key($1) }
            batches = stride(from: 0, to: sorted.count, by: Self.batchSize).map {
                Array(sorted[$0..<min(sorted.count, $0 + Self.batchSize)])
            }
        }
        return batches
    }
}

/// Runs `body` over `items` with at most `width` calls in flight; results in no particular order.
/// Requests to the server are mostly waiting, so a few at once hide the round trips.
func forEachConcurrently<T: Sendable, R: Sendable>(
    _ items: [T], width: Int = 8,
    _ body: @escaping @Sendable (T) async throws -> R
) async throws -> [R] {
    try await withThrowingTaskGroup(of: R.self) { group in
        var results: [R] = []
        var next = 0
        while next < items.count && next < width {
            let item = items[next]
            group.addTask { try await body(item) }
            next += 1
        }
        while let r = try await group.next() {
            results.append(r)
            if next < items.count {
                let item = items[next]
                group.addTask { try await body(item) }
                next += 1
            }
        }
        return results
    }
}

/// Runs async work to completion from synchronous code (the CLI, the daemon's scheduler thread).
/// Never call it from inside a Swift concurrency task.
@discardableResult
public func runBlocking<T: Sendable>(_ body: @escaping @Sendable () async throws -> T) throws -> T {
    let box = ResultBox<T>()
    let done = DispatchSemaphore(value: 0)
    Task.detached {
        do { box.set(.success(try await body())) } catch { box.set(.failure(error)) }
        done.signal()
    }
    done.wait()
    return try box.get()
}

final class ResultBox<T: Sendable>: @unchecked Sendable {
    private var result: Result<T, any Error>?
    private let lock = NSLock()
    func set(_ r: Result<T, any Error>) {
        lock.lock()
        result = r
        lock.unlock()
    }
    func get() throws -> T {
        lock.lock()
        defer { lock.unlock() }
        guard let result else { throw SyncError.protocolError("no result") }
        return try result.get()
    }
}
