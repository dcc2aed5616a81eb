import CofferModel
import CofferProtocol
import Foundation

/// What the access rules ask about a link's target, which lives in another account's tree, read
/// inside the upsert's transaction. Like `StorageTreeView` it cannot throw through the model: a
/// failed read answers "no such file" and is kept in `failure`, which the caller checks
/// (`throwIfFailed`) before trusting a refusal.
final class LinkLookup {
    let reader: any MetadataReader
    private var views: [Data: StorageTreeView] = [:]
    /// The batch's own live links by target, built on first use.
    private var batchLinks: [FileID: [FileID]]?
    private(set) var failure: (any Error)?

    init(reader: any MetadataReader) { self.reader = reader }

    func throwIfFailed() throws {
        if let failure { throw failure }
        for view in views.values { try view.throwIfFailed() }
    }

    /// The target's owner, whether it is live, the mode `owner` (whose tree holds the link)
    /// holds on it, and `owner`'s live links to it as the batch leaves them.
    func facts<B: TreeView>(of target: FileID, forLinksOf owner: Data, batch: Batch<B>) -> LinkTargetFacts? {
        do {
            guard let stored = try reader.file(id: Data(target.bytes)) else { return nil }
            let targetOwner = try AccountID(bytes: Array(stored.account))
            let linkOwner = try AccountID(bytes: Array(owner))
            let view = views[stored.account] ?? StorageTreeView(account: stored.account, reader: reader)
            views[stored.account] = view
            if batchLinks == nil {
                var byTarget: [FileID: [FileID]] = [:]
                for m in batch.changes.values where m.type == .link && !m.isDeleted {
                    if let t = m.linkTarget { byTarget[t, default: []].append(m.id) }
                }
                batchLinks = byTarget
            }
            var live = try reader.liveLinks(account: owner, target: Data(target.bytes)).compactMap {
                try? FileID(bytes: Array($0))
            }.filter { batch.changes[$0] == nil }
            live += batchLinks?[target] ?? []
            return LinkTargetFacts(
                owner: targetOwner, isLive: view.isLive(target), mode: view.accessMode(of: linkOwner, on: target),
                liveLinks: live)
        } catch {
            if failure == nil { failure = error }
            return nil
        }
    }
}

/// The live grantees of a folder and its ancestors, memoised over one request: every changed
/// record asks about its parent, and siblings share theirs.
struct GranteeMemo {
    private var memo: [FileID: Set<AccountID>] = [:]

    /// Accounts other than the owner holding a live grant on `id` or an ancestor of it.
    mutating func grantees<T: TreeView>(atOrAbove id: FileID, in tree: T) -> Set<AccountID> {
        var path: [FileMetadata] = []
        var cursor = id
        var known: Set<AccountID> = []
        while path.count <= TreeLimits.maxDepth + 1 {
            if let hit = memo[cursor] {
                known = hit
                break
            }
            guard let m = tree.file(cursor) else { break }
            path.append(m)
            if m.isRoot { break }
            cursor = m.parent
        }
        for m in path.reversed() {
            for e in m.access where !e.isDeleted && e.account != m.owner { known.insert(e.account) }
            memo[m.id] = known
        }
        return known
    }
}

extension CofferServer {
    /// Which grantees a batch must tell about which files (docs/SHARING.md, "The feed"):
    /// - every changed or server-deleted file, to the accounts that see it after the batch
    ///   (grants on it or above it), that saw it before (so a file moved out of a share is
    ///   reported gone), and whose own grant on it the batch changed (so a revoked grantee
    ///   learns of its revocation);
    /// - a folder that comes into an account's view (a new grant, a move into a shared folder):
    ///   its whole live subtree; and, for an account granted there before (a share revoked or
    ///   given up, then granted again), the folder is also noted as granted again (`regranted`):
    ///   a device of it that slept through the gap may still hold files deleted or moved away
    ///   meanwhile, of which nothing else would tell it, and drops what it holds below.
    ///
    /// `toldBefore` says whether an account's feed already has a row for a file (it was shown the
    /// file before: moved out of its view and back, or granted on its own after being seen
    /// through a folder above, counts as coming back too).
    static func feedPlan(
        changed: [FileMetadata], marked: Set<FileID>, batch: Batch<StorageTreeView>,
        toldBefore: (Data, FileID) throws -> Bool = { _, _ in false }
    ) throws -> (feed: [Data: Set<FileID>], regranted: [Data: Set<FileID>]) {
        let view = batch.base
        var feed: [Data: Set<FileID>] = [:]
        var regranted: [Data: Set<FileID>] = [:]
        var after = GranteeMemo()
        var before = GranteeMemo()
        func tell(_ accounts: Set<AccountID>, _ ids: some Sequence<FileID>) {
            let ids = Array(ids)
            for a in accounts { feed[Data(a.bytes), default: []].formUnion(ids) }
        }
        for m in changed {
            let old = view.file(m.id)
            // An account named on the record hears of it when its own grant changed (a revoked
            // grantee learns of its revocation), not of every later change.
            var told = Set(m.access.filter { e in old?.access.first { $0.account == e.account } != e }.map(\.account))
            var sees = Set(m.access.filter { !$0.isDeleted }.map(\.account))
            if !m.isRoot { sees.formUnion(after.grantees(atOrAbove: m.parent, in: batch)) }
            var saw: Set<AccountID> = []
            if let old, !old.isDeleted {
                saw = Set(old.access.filter { !$0.isDeleted }.map(\.account))
                if !old.isRoot { saw.formUnion(before.grantees(atOrAbove: old.parent, in: view)) }
            }
            told.formUnion(sees)
            told.formUnion(saw)
            told.remove(m.owner)
            tell(told, [m.id])
            sees.remove(m.owner)
            let newcomers = sees.subtracting(saw)
            if m.type == .folder, !m.isDeleted, !newcomers.isEmpty {
                let below = descendants(of: m.id, in: batch)
                tell(newcomers, below.live)
                // An account granted here before comes back: one of its devices may have slept
                // through the gap and still hold what was deleted or moved away meanwhile, of
                // which no row tells it (a give-up changes no file below). Its row of the folder
                // says so (`regranted`), and such a device drops what it holds below before
                // taking the live subtree sent here. A new grantee is never sent anything
                // deleted before it was invited.
                for a in newcomers {
                    let account = Data(a.bytes)
                    let returning =
                        try below.granted.contains(a) || heldGrant(a, atOrAbove: m.id, in: view)
                        || toldBefore(account, m.id)
                    if returning {
                        regranted[account, default: []].insert(m.id)
                    }
                }
            }
        }
        for id in marked where batch.changes[id] == nil {
            guard let m = batch.file(id), !m.isRoot else { continue }
            var told = after.grantees(atOrAbove: m.parent, in: batch).union(
                m.access.filter { !$0.isDeleted }.map(\.account))
            told.remove(m.owner)
            tell(told, [id])
        }
        return (feed, regranted)
    }

    /// The live files below `id` (not `id` itself), and the accounts holding any grant below it
    /// (live or not).
    static func descendants<T: TreeView>(
        of id: FileID, in tree: T
    ) -> (live: [FileID], granted: Set<AccountID>) {
        var live: [FileID] = []
        // Accounts granted (live or revoked) on a folder below: granted there before.
        var granted: Set<AccountID> = []
        var queue = [(id, false)]
        var seen: Set<FileID> = [id]
        while let (next, gone) = queue.popLast() {
            for c in tree.childIDs(of: next) where seen.insert(c).inserted {
                guard let m = tree.file(c) else { continue }
                for e in m.access { granted.insert(e.account) }
                let isGone = gone || m.isDeleted
                if !isGone { live.append(c) }
                if m.type == .folder { queue.append((c, isGone)) }
            }
        }
        return (live, granted)
    }

    /// Whether `account` held a grant, live or revoked, on `id` or a folder above it.
    static func heldGrant<T: TreeView>(_ account: AccountID, atOrAbove id: FileID, in tree: T) -> Bool {
        var cursor = id
        for _ in 0...TreeLimits.maxDepth + 1 {
            guard let m = tree.file(cursor) else { return false }
            if m.access.contains(where: { $0.account == account }) { return true }
            if m.isRoot { return false }
            cursor = m.parent
        }
        return false
    }
}

/// One entry of an updates page: a record to send, or (no `file`) an id the caller no longer sees.
struct UpdatesEntry {
    var version: Int64
    var id: Data
    var file: StoredFile?
    /// A feed entry granted to the caller again since the read's origin.
    var regranted = false

    static func precedes(_ a: UpdatesEntry, _ b: UpdatesEntry) -> Bool {
        a.version != b.version ? a.version < b.version : a.id.lexicographicallyPrecedes(b.id)
    }

    /// Its share of the response as JSON.
    var wireBytes: Int { (file.map(CofferServer.wireBytes) ?? 40) + (regranted ? 40 : 0) }
}

/// Entries taken in order up to a page (`API.updatesPageSize` entries, about
/// `API.updatesPageBytes`, and always at least one, so a page advances); `next` is the version
/// of the first entry refused.
struct UpdatesStream {
    private(set) var entries: [UpdatesEntry] = []
    private(set) var bytes = 0
    private(set) var next: Int64?

    /// Whether the stream still takes entries (checked before an entry is worth reading whole).
    mutating func hasRoom(_ version: Int64) -> Bool {
        if next == nil, entries.count >= API.updatesPageSize { next = version }
        return next == nil
    }

    /// Takes `e`, or refuses it (and everything after) when the page is full.
    @discardableResult
    mutating func admit(_ e: UpdatesEntry) -> Bool {
        guard next == nil else { return false }
        let cost = e.wireBytes
        if !entries.isEmpty, entries.count >= API.updatesPageSize || bytes + cost > API.updatesPageBytes {
            next = e.version
            return false
        }
        entries.append(e)
        bytes += cost
        return true
    }
}
