import CofferContent
import CofferCrypto
import CofferModel
import CofferStore
import Foundation
import Synchronization

/// The grantee's side of sharing (docs/SHARING.md, "On the grantee's device"): other accounts'
/// files shared with this one, pulled from the share feed, verified, and kept in the store's
/// mirror (`shared_files`), apart from the account's own tree.

/// Other accounts' files as this device holds them, read through one store transaction, with
/// records of a pull staged over them. Like the server's `StorageTreeView` it cannot throw
/// through the model: a failed read answers "no such file" and is kept in `failure`.
final class MirrorTree: TreeView {
    private let reader: StoreReader
    /// Pulled records being judged, over what the store holds.
    var staged: [FileID: FileMetadata] = [:]
    private var read: [FileID: FileMetadata?] = [:]
    /// Records read by earlier views (`Vault.sharedRecords`), for views that judge nothing.
    private let shared: SharedRecordCache?
    private(set) var failure: (any Error)?
    /// As the server sent it (judging a pull) or with this account's unpushed changes over it.
    let layer: MirrorLayer

    init(reader: StoreReader, cache: SharedRecordCache? = nil, layer: MirrorLayer = .current) {
        self.reader = reader
        self.shared = layer == .current ? cache : nil
        self.layer = layer
    }

    func throwIfFailed() throws { if let failure { throw VaultError.io("\(failure)") } }

    func file(_ id: FileID) -> FileMetadata? {
        if let m = staged[id] { return m }
        if let hit = read[id] { return hit }
        if let hit = shared?.record(id) { return hit }
        do {
            let generation = shared?.generation ?? 0
            let m = try reader.sharedFile(id, layer)?.effectiveMetadata
            read[id] = m
            if let m { shared?.keep(m, readIn: generation) }
            return m
        } catch {
            if failure == nil { failure = error }
            return nil
        }
    }

    func childIDs(of id: FileID) -> [FileID] {
        var ids: [FileID]
        do { ids = try reader.sharedChildIDs(of: id, layer) } catch {
            if failure == nil { failure = error }
            ids = []
        }
        // A staged record decides where it is: one moved away is no longer listed here.
        ids = ids.filter { staged[$0].map { $0.parent == id } ?? true }
        for (sid, m) in staged where m.parent == id && sid != id && !ids.contains(sid) { ids.append(sid) }
        return ids
    }

    func childIDs(of id: FileID, nameMAC: [UInt8]) -> [FileID] {
        var ids: [FileID]
        do { ids = try reader.sharedChildIDs(of: id, nameMAC: nameMAC, layer) } catch {
            if failure == nil { failure = error }
            ids = []
        }
        // Staged records decide where they are and what they are called.
        ids = ids.filter { staged[$0].map { $0.parent == id && $0.name.mac == nameMAC } ?? true }
        for (sid, m) in staged where m.parent == id && m.name.mac == nameMAC && sid != id && !ids.contains(sid) {
            ids.append(sid)
        }
        return ids
    }

    var rootID: FileID? { nil }
}

/// Records of shared files read so far, shared by a vault's views (`Vault.sharedRecords`),
/// forgotten whenever the store changed behind the vault. A record read while that happens is
/// not kept: each forgetting moves the generation, and a read keeps its record only if the
/// generation it started in is still the current one.
final class SharedRecordCache: Sendable {
    private let state = Mutex<(records: BoundedCache<FileID, FileMetadata>, generation: UInt64)>(
        (BoundedCache(capacity: 16_384), 0))

    func record(_ id: FileID) -> FileMetadata? { state.withLock { $0.records[id] } }
    var generation: UInt64 { state.withLock { $0.generation } }

    func keep(_ m: FileMetadata, readIn generation: UInt64) {
        state.withLock { s in if s.generation == generation { s.records[m.id] = m } }
    }

    func forgetAll() {
        state.withLock { s in
            s.records.removeAll()
            s.generation &+= 1
        }
    }

    /// Forgets these records only (a read that started before stays unkept all the same).
    func forget(_ ids: some Sequence<FileID>) {
        state.withLock { s in
            for id in ids { s.records[id] = nil }
            s.generation &+= 1
        }
    }
}

/// Keys of shared files opened so far (`Vault.sharedKeys`), forgotten with the records
/// (`Vault.forgetSharedReads`): an owner's revocation gives the files new keys.
final class SharedKeyCache: Sendable {
    let keys = Mutex<BoundedCache<FileID, SymmetricKey>>(BoundedCache(capacity: 16_384))
}

extension Vault {
    /// Forgets the shared records and keys read so far: the mirror changed (a pull of the feed,
    /// or another process's), and a record may carry a new key (docs/SHARING.md, "Revocation").
    func forgetSharedReads() {
        sharedRecords.forgetAll()
        sharedKeys.keys.withLock { $0.removeAll() }
    }
}

/// Keys granted to this account: a live grant on the file, sealed to the account's box key
/// together with file, grantee, mode and owner (checked on open); below it, keys come down the
/// parent chain as in the account's own tree.
struct GrantKeyAccess: KeyAccess {
    let account: AccountID
    let box: BoxKeyPair
    /// Keys opened by earlier views, taken as known.
    var known: SharedKeyCache?

    func directKey(of file: FileMetadata) throws -> SymmetricKey? {
        if let k = known?.keys.withLock({ $0[file.id] }) { return k }
        guard file.owner != account, let e = file.grant(to: account) else { return nil }
        return try box.open(sealedKey: e.sealedKey, binding: e.keyBinding(fileID: file.id, owner: file.owner))
    }
}

/// A file another account shares with this one directly (a grant on it, not on a folder above).
public struct IncomingShare: Sendable, Equatable {
    public let id: FileID
    public let owner: AccountID
    public let mode: AccessMode
    public let type: FileType
    /// The owner's name for it (`FileMetadata.shareName`), nil if it carries none that opens.
    public let name: String?
    /// A document's size, or the total size of the documents in a folder, as far as this device
    /// holds them.
    public let size: UInt64
    /// This account's link to it, if it accepted the share; nil while it is pending.
    public let link: FileID?
}

/// What a pull of the share feed refused: records that broke a rule (named by id and reason).
public struct FeedRefusal: Sendable, Equatable {
    public let id: FileID
    public let reason: String
}

extension Vault {
    var grantKeys: GrantKeyAccess { GrantKeyAccess(account: accountID, box: box, known: nil) }

    /// How far this device has read its share feed (a cursor of its own: the feed can be read
    /// from the start without reading the account's own tree again).
    public var feedCursor: Int64 {
        (try? store.read { r in try r.setting("feedCursor").map(Self.int64) } ?? 0) ?? 0
    }

    /// Checks pulled records of other accounts' files: each must be signed by its writer, owned
    /// by another account, shared with this one, not older than the record held (a rollback),
    /// and written by the owner or an account with write access, with every grant in it signed
    /// by the owner (`Authorization.checkPulled`). A record from this account's own tree here
    /// fails the whole pull (the server mixed the streams); a record that breaks a rule is
    /// refused alone and the one held is kept, so one bad record cannot stop a share from
    /// syncing.
    public func checkFeed(_ files: [RemoteFile]) throws -> (accepted: [RemoteFile], refused: [FeedRefusal]) {
        try verifyFeedSignatures(files.map(\.signed))
        let me = accountID
        return try store.read { r in
            let mirror = MirrorTree(reader: r, layer: .pulled)
            for f in files { mirror.staged[f.signed.metadata.id] = f.stored.effectiveMetadata }
            var pending = files.sorted { $0.signed.metadata.id < $1.signed.metadata.id }
            var refused: [FeedRefusal] = []
            // A record is judged with the others of the pull staged around it; one refused takes
            // back what it staged, which may take away what another leaned on (a forged grant
            // above it): the others are judged again, until no more are refused.
            while true {
                var next: [RemoteFile] = []
                var refusedNow = false
                for f in pending {
                    let m = f.signed.metadata
                    let held = try r.sharedFile(m.id, .pulled)
                    var reason: String?
                    if let held, f.signed.revision < held.signed.revision {
                        reason = "older than the record this device holds (a rollback)"
                    } else if let held, f.signed.revision == held.signed.revision, f.signed != held.signed {
                        reason = "differs from the record this device holds with the same revision"
                    } else if mirror.accessMode(of: me, on: m.id) == nil {
                        reason = "not shared with this account"
                    } else {
                        do {
                            try Authorization.checkPulled(
                                m, old: held?.signed.metadata, in: mirror,
                                verify: { PublicSigningKey.isValid($0.bytes, $1, $2) })
                        } catch { reason = "\(error)" }
                    }
                    if let reason {
                        refused.append(FeedRefusal(id: m.id, reason: reason))
                        mirror.staged[m.id] = held?.effectiveMetadata
                        refusedNow = true
                    } else {
                        next.append(f)
                    }
                }
                pending = next
                if !refusedNow { break }
            }
            try mirror.throwIfFailed()
            return (pending, refused)
        }
    }

    /// Refuses the whole pull if a record of the feed is this account's own or its signature
    /// does not verify; cheap enough for every page as it arrives.
    public func verifyFeedSignatures(_ records: [SignedMetadata]) throws {
        for s in records {
            let m = s.metadata
            guard m.owner != accountID else {
                throw VaultError.corrupt(
                    "the server sent this account's own file \(m.id) as shared by another; nothing was applied")
            }
            guard PublicSigningKey.isValid(m.lastModifiedBy.bytes, s.message, s.signature) else {
                throw VaultError.corrupt(
                    "the server sent shared file \(m.id) with a bad signature; nothing was applied")
            }
        }
    }

    /// Shared documents whose pulled version names content this device does not have yet.
    public func feedContentNeeds(_ files: [RemoteFile]) throws -> [ContentNeed] {
        try store.read { r in
            let mirror = MirrorTree(reader: r)
            for f in files { mirror.staged[f.signed.metadata.id] = f.stored.effectiveMetadata }
            var view = KeyedTree(tree: mirror, cache: KeyCache(capacity: 4096), access: grantKeys)
            var out: [ContentNeed] = []
            for f in files where f.signed.metadata.type == .document && !f.stored.effectiveMetadata.isDeleted {
                guard let digest = f.signed.metadata.contentDigest, try r.manifest(digest) == nil else { continue }
                guard let k = try? view.key(f.signed.metadata.id) else { continue }
                out.append(ContentNeed(fileID: f.signed.metadata.id, digest: digest, key: k))
            }
            return out
        }
    }

    /// Stores verified records in the mirror, drops what the server says this account no longer
    /// sees (`gone`: the file and what the mirror holds below it, but for folders shared with
    /// this account on their own) and what it holds below a file granted to this account again
    /// (`regranted`: this read brings the live subtree again, and this device may have slept
    /// through the gap, when files below were deleted or moved away unseen), notes the links of
    /// this account's tree whose share went away with it, and moves the feed cursor on, in one
    /// transaction; then removes the links noted (`removeNotedLinks`), as Lockbook's sync does in
    /// its merge. A device that stops in between removes them at its next sync: no link is left
    /// placing nothing. (The links go in a commit of their own so the feed's transaction, which
    /// may bring a whole new share, never holds the account's tree from the mount.) Returns the
    /// ids whose view changed and how many links went.
    @discardableResult
    public func applyFeed(
        _ files: [RemoteFile], gone: [FileID], regranted: Set<FileID> = [], cursor: Int64
    ) throws -> (changed: Set<FileID>, removedLinks: Int) {
        var changed: Set<FileID> = []
        let user = username
        let key = try recoveryKey()
        let me = accountID
        // Only a pull that names files gone or brings deletions can take a share out of reach;
        // finding the links reads the account's whole tree, which most pulls need not.
        let shrinks = !gone.isEmpty || files.contains { $0.stored.effectiveMetadata.isDeleted }
        let links = shrinks ? try liveLinks() : []
        try store.write { w in
            // The shares the links place that the mirror held before this pull.
            var heldBefore: Set<FileID> = []
            for (_, target) in links where try w.reader.sharedFile(target) != nil { heldBefore.insert(target) }
            // This account's unpushed changes, read before the pull changes what they stand on.
            let intents = try captureSharedIntents(w)
            // Everything below, folders shared with this account on their own included (their
            // grants may have gone and come back in the gap too): the new grant sends the whole
            // live subtree again.
            for id in regranted.sorted() {
                for c in try w.reader.sharedChildIDs(of: id) where c != id {
                    changed.formUnion(try dropFromMirror(c, keepingSharesExcept: nil, w))
                }
            }
            for f in files {
                // Another process may have stored a newer one meanwhile.
                if let held = try w.reader.sharedFile(f.signed.metadata.id, .pulled),
                    held.signed.revision > f.signed.revision
                {
                    continue
                }
                try w.putShared(f.stored)
                changed.insert(f.signed.metadata.id)
            }
            for id in changed { try w.logChange(id) }
            let goneSet = Set(gone)
            for id in gone { changed.formUnion(try dropFromMirror(id, keepingSharesExcept: goneSet, w)) }
            try enqueueRecovered(try replaySharedIntents(intents, touched: changed, user: user, w), under: key, w)
            try w.setSetting("feedCursor", Self.bytes(cursor))
            // A link goes when its share is out of this account's reach now, and was there to
            // lose: held before or now, or named gone (one never held may just not be sent yet).
            let mirror = MirrorTree(reader: w.reader)
            var noted = try Self.fileIDs(w.reader.setting(Self.linksToRemoveSetting), note: Self.linksToRemoveNote)
            for (link, target) in links.sorted(by: { $0.link < $1.link }) {
                let now = mirror.file(target)
                if let now, Self.isReachable(now, by: me, in: mirror) { continue }
                if now != nil || heldBefore.contains(target) || goneSet.contains(target), !noted.contains(link) {
                    noted.append(link)
                }
            }
            try mirror.throwIfFailed()
            if !noted.isEmpty { try w.setSetting(Self.linksToRemoveSetting, noted.flatMap(\.bytes)) }
        }
        forgetSharedReads()
        let removed = try removeNotedLinks()
        // What it queued stays queued if it cannot be saved now: the pull itself is done.
        try? drainRecovery()
        return (changed, removed)
    }

    static let linksToRemoveSetting = "linksToRemove"
    static let linksToRemoveNote = "the note of links to remove"

    /// Removes the links a pull of the feed noted (`applyFeed`) whose share is still out of
    /// reach, and forgets the note, in one commit (judged inside it, against the store as the
    /// commit sees it). Returns how many went.
    @discardableResult
    public func removeNotedLinks() throws -> Int {
        guard try store.readOne({ try $0.setting(Self.linksToRemoveSetting) }) != nil else { return 0 }
        let me = accountID
        return try commit { batch, s, w -> Int in
            let note = try w.reader.setting(Self.linksToRemoveSetting)
            let mirror = MirrorTree(reader: w.reader)
            var removed = 0
            for id in try Self.fileIDs(note, note: Self.linksToRemoveNote).sorted() {
                guard let m = batch.file(id), !m.isDeleted, m.type == .link, let target = m.linkTarget else { continue }
                if let now = mirror.file(target), Self.isReachable(now, by: me, in: mirror) { continue }
                try batch.delete(id, describe: s.view.describe)
                try touchParent(m.parent, &batch, &s)
                s.pruneCandidates.insert(id)
                removed += 1
            }
            try mirror.throwIfFailed()
            try w.removeSetting(Self.linksToRemoveSetting)
            return removed
        }
    }

    /// Runs `body` over the mirror seen with this account's granted keys. Keys opened are kept
    /// for the next call (`sharedKeys`), and records read until a pull changes them
    /// (`sharedRecords`). Each record is read by a statement of its own, outside a transaction,
    /// as the account's own tree is (GRDB's read transaction was half of the mount's CPU
    /// reading a share): a read racing a pull may see records on both sides of it, which a
    /// view that only reads tolerates.
    func withSharedView<R>(_ body: (inout KeyedTree<MirrorTree>, StoreReader) throws -> R) throws -> R {
        try store.readOne { r in
            var access = grantKeys
            access.known = sharedKeys
            var view = KeyedTree(
                tree: MirrorTree(reader: r, cache: sharedRecords), cache: KeyCache(capacity: 4096), access: access)
            let result = try body(&view, r)
            try view.tree.throwIfFailed()
            // What this view unwrapped joins the keys known (a few per call).
            let learned = view.cache.keys
            sharedKeys.keys.withLock { known in learned.visitEntries { known[$0] = $1 } }
            return result
        }
    }

    /// Every file shared with this account directly, pending or accepted, by owner then name.
    public func incomingShares() throws -> [IncomingShare] {
        let me = accountID
        var links: [FileID: FileID] = [:]
        for (link, target) in try liveLinks() { links[target] = link }
        return try withSharedView { view, r in
            var roots: [FileMetadata] = []
            try r.visitSharedFiles { f in
                let m = f.effectiveMetadata
                if !m.isDeleted, m.grant(to: me) != nil { roots.append(m) }
                return true
            }
            var out: [IncomingShare] = []
            for m in roots {
                // Nested in another share to this account: reached through that one, unless it
                // was accepted before the share above it came (its link stays, and is listed).
                if links[m.id] == nil,
                    view.tree.file(m.parent).map({ view.tree.accessMode(of: me, on: $0.id) != nil }) == true
                {
                    continue
                }
                guard let grant = m.grant(to: me) else { continue }
                out.append(
                    IncomingShare(
                        id: m.id, owner: m.owner, mode: view.tree.accessMode(of: me, on: m.id) ?? grant.mode,
                        type: m.type, name: try? shareName(m, &view), size: liveSize(of: m, &view), link: links[m.id]))
            }
            return out.sorted {
                ($0.owner.description, $0.name ?? "", $0.id) < ($1.owner.description, $1.name ?? "", $1.id)
            }
        }
    }

    /// A shared file's name as its owner shares it.
    func shareName(_ m: FileMetadata, _ view: inout KeyedTree<MirrorTree>) throws -> String {
        guard let sealed = m.shareName else { throw VaultError.corrupt("\(m.id) carries no name for its grantees") }
        let raw = try AEAD.open(sealed, key: try view.key(m.id), purpose: .shareName, fileID: m.id.bytes, what: "name")
        guard let name = String(validating: raw, as: UTF8.self), (try? FileName.validate(name)) != nil else {
            throw VaultError.corrupt("\(m.id) carries a malformed name")
        }
        return name
    }

    /// The size of a document, or of the live documents below a folder, as the mirror holds them.
    func liveSize(of m: FileMetadata, _ view: inout KeyedTree<MirrorTree>) -> UInt64 {
        var total: UInt64 = 0
        var queue = [m]
        var seen: Set<FileID> = [m.id]
        while let next = queue.popLast() {
            if next.type == .document, let a = try? view.openAttributes(next) {
                total = total.addingReportingOverflow(a.size).partialValue
            }
            guard next.type == .folder else { continue }
            for c in view.tree.childIDs(of: next.id) where seen.insert(c).inserted {
                if let cm = view.tree.file(c), !cm.isDeleted { queue.append(cm) }
            }
        }
        return total
    }

    /// The live links of this account's tree and their targets. Reads every record once (links
    /// are not indexed yet; docs/SHARING.md).
    func liveLinks() throws -> [(link: FileID, target: FileID)] {
        var found: [FileID: FileID] = [:]
        try visitCurrentRecords { m in
            if m.type == .link, let t = m.linkTarget { found[m.id] = t }
        }
        return found.filter { isLive($0.key) }.map { ($0.key, $0.value) }
    }

    /// The file `path` names below the share `share` ("" for the share itself), as a node.
    public func sharedNode(_ share: FileID, path: String) throws -> Node {
        let me = accountID
        return try withSharedView { view, _ in
            guard let root = view.tree.file(share), !root.isDeleted, root.grant(to: me) != nil else {
                throw VaultError.tree(.notFound("no share with id \(share)"))
            }
            var current = root
            var name = (try? shareName(root, &view)) ?? root.id.description
            var walked = name
            for part in Self.components(path) {
                walked += "/" + part
                guard current.type == .folder else { throw VaultError.tree(.notAFolder(walked)) }
                let mac = try view.nameMAC(part, in: current.id)
                guard
                    let next = view.tree.childIDs(of: current.id, nameMAC: mac).compactMap(view.tree.file)
                        .first(where: { !$0.isDeleted })
                else { throw VaultError.tree(.notFound(walked)) }
                current = next
                name = part
            }
            return try sharedNode(current, name: name, &view)
        }
    }

    /// The live children of a shared folder, by name.
    public func sharedChildren(of id: FileID) throws -> [Node] {
        try withSharedView { view, _ in
            guard let m = view.tree.file(id), !m.isDeleted else { throw VaultError.tree(.notFound(id.description)) }
            guard m.type == .folder else { throw VaultError.tree(.notAFolder(id.description)) }
            var nodes: [Node] = []
            for c in view.tree.childIDs(of: id) {
                guard let cm = view.tree.file(c), !cm.isDeleted else { continue }
                nodes.append(try sharedNode(cm, name: try view.openName(cm), &view))
            }
            return Self.byteOrder(nodes.map(\.name)).map { nodes[$0] }
        }
    }

    private func sharedNode(_ m: FileMetadata, name: String, _ view: inout KeyedTree<MirrorTree>) throws -> Node {
        var a = try view.openAttributes(m)
        // What this account may not write shows no write bits (docs/SHARING.md).
        if view.tree.accessMode(of: accountID, on: m.id) != .write { a.mode.value &= ~0o222 }
        let subfolders =
            m.type == .folder
            ? view.tree.childIDs(of: m.id).filter {
                view.tree.file($0).map { $0.type == .folder && !$0.isDeleted } ?? false
            }
            .count : 0
        return Node(id: m.id, type: m.type, parent: m.parent, name: name, attributes: a, subfolders: subfolders)
    }

}

/// A tree read one record at a time through `lookup`, for the walks up a file's ancestors that
/// the sharing rules make (no listings). A failed read answers "no such file" and is kept.
final class LookupTree: TreeView {
    private let lookup: (FileID) throws -> FileMetadata?
    private var memo: [FileID: FileMetadata?] = [:]
    private(set) var failure: (any Error)?

    init(_ lookup: @escaping (FileID) throws -> FileMetadata?) { self.lookup = lookup }

    func throwIfFailed() throws { if let failure { throw VaultError.io("\(failure)") } }

    func file(_ id: FileID) -> FileMetadata? {
        if let hit = memo[id] { return hit }
        do {
            let m = try lookup(id)
            memo[id] = m
            return m
        } catch {
            if failure == nil { failure = error }
            return nil
        }
    }

    func childIDs(of id: FileID) -> [FileID] { [] }
    func childIDs(of id: FileID, nameMAC: [UInt8]) -> [FileID] { [] }
    var rootID: FileID? { nil }
}

extension Vault {
    /// Accepts the share `id`: a link to it in this account's tree, in `parent`, named `name`
    /// (the owner's name for it by default). Renaming or moving the link later changes this
    /// account's tree only. The link reaches the server at the next sync, which holds it to the
    /// same rules checked here (a live file shared with this account, one link per target, not
    /// inside a shared folder).
    @discardableResult
    public func acceptShare(_ id: FileID, in parent: FileID, name: String?) throws -> Node {
        guard let share = try incomingShares().first(where: { $0.id == id }) else {
            throw VaultError.tree(.notFound("no share with id \(id) (see `coffer share pending`)"))
        }
        if let link = share.link {
            throw VaultError.invalidArgument("share \(id) is already accepted, at \(path(of: link))")
        }
        guard let name = name ?? share.name else {
            throw VaultError.invalidArgument("share \(id) carries no readable name; give one with --name")
        }
        let facts = LinkTargetFacts(owner: share.owner, isLive: true, mode: share.mode, liveLinks: [])
        let link = try createFile(
            in: parent, name: name, type: .link, mode: 0o755, linkTarget: id, linkFacts: facts)
        try store.write { w in try w.setSetting(Self.linkAcceptedSetting, randomBytes(8)) }
        return link
    }

    /// The record that gives up this account's grant on the share `id` (reject, or leave): the
    /// owner's record with the grant tombstoned and signed by this account, one revision above
    /// the one held, with the preconditions the server checks. Nothing changes here until the
    /// server has taken it (`forgetShare`).
    public func shareRejection(_ id: FileID) throws -> PendingRecord {
        let me = accountID
        let held = try store.read { r in try r.sharedFile(id) }
        guard let held, !held.effectiveMetadata.isDeleted,
            let i = held.signed.metadata.access.firstIndex(where: { $0.account == me && !$0.isDeleted })
        else { throw VaultError.tree(.notFound("no share with id \(id) (see `coffer share pending`)")) }
        var m = held.signed.metadata
        // The owner's signature of the grant goes along: any device can then tell the give-up
        // from a grant never made, and what this account wrote under it stays checkable.
        m.access[i].ownerSignature = m.access[i].signature
        m.access[i].isDeleted = true
        m.access[i].signature = signing.sign(m.access[i].grantMessage(fileID: id))
        m.lastModifiedBy = me
        let signed = sign(m, revision: SignedMetadata.revision(after: held.signed.revision, now: nowMillis))
        return PendingRecord(
            stored: StoredFile(signed: signed), expectedParent: held.signed.metadata.parent,
            expectedNameMAC: held.signed.metadata.name.mac, expectedRevision: held.signed.revision)
    }

    /// After a share was accepted here: removes a link this device made but has not pushed when
    /// another link to the same share already stands (two devices of the account accepted it
    /// while apart: the server keeps one live link per share per account, and would refuse the
    /// push for ever), and any link whose share the device holds deleted or out of reach (a pull
    /// of the feed removes those as it takes the share away, `applyFeed`; one made meanwhile
    /// elsewhere may arrive after). One it never held (refused by the rules, or not sent yet),
    /// or cannot read now, stays. The removal is a local change like any other, pushed with the
    /// sync. Returns how many went.
    public func removeBrokenLinks() throws -> Int {
        var removed = 0
        var byTarget: [FileID: [FileID]] = [:]
        for (link, target) in try liveLinks() {
            let type: FileType?
            let held: Bool
            do {
                held = try store.readOne { try $0.sharedFile(target) } != nil
                type = try sharedLiveType(target)
            } catch { continue }
            if type == nil && held {
                try remove(link)
                removed += 1
            } else {
                byTarget[target, default: []].append(link)
            }
        }
        for links in byTarget.values where links.count > 1 {
            let synced = try store.read { r in try links.filter { try r.file($0, .base) != nil } }
            let keep = synced.min() ?? links.min()
            for link in links where link != keep && !synced.contains(link) {
                try remove(link)
                removed += 1
            }
        }
        return removed
    }

    /// The note `acceptShare` leaves (a random value per acceptance), nil when no share was
    /// accepted since the last complete sync: while it stands, this device may hold a link
    /// another device of the account also made (one `removeBrokenLinks` drops). A note in the
    /// store, not a read of the local changes: a sync asks it every time, and a first push of a
    /// large import holds a great many local records.
    public func linkAcceptedNote() throws -> [UInt8]? {
        try store.readOne { try $0.setting(Self.linkAcceptedSetting) }
    }

    /// Forgets the note once a sync that began with it (`note`, read before its pull) has pushed
    /// everything; a share accepted during that sync left another note, which stays.
    public func clearLinkAcceptedNote(_ note: [UInt8]?) throws {
        guard let note else { return }
        try store.write { w in
            if try w.reader.setting(Self.linkAcceptedSetting) == note { try w.removeSetting(Self.linkAcceptedSetting) }
        }
    }

    static let linkAcceptedSetting = "linkAccepted"

    /// Drops a share this account gave up from the mirror (what it holds below it too), and
    /// removes this account's link to it, if any.
    public func forgetShare(_ id: FileID) throws {
        if let link = try liveLinks().first(where: { $0.target == id })?.link { try remove(link) }
        let user = username
        let key = try recoveryKey()
        try store.write { w in
            let intents = try captureSharedIntents(w)
            let dropped = try dropFromMirror(id, keepingSharesExcept: [], w)
            try enqueueRecovered(try replaySharedIntents(intents, touched: dropped, user: user, w), under: key, w)
        }
        forgetSharedReads()
        try? drainRecovery()
    }

    /// Removes `id` and what the mirror holds below it, logging each id, and returns them. A
    /// folder inside shared with this account on its own stays (nothing changed in what it may
    /// see there), unless it is in `exceptions` (gone itself); with no `exceptions` at all,
    /// nothing stays.
    private func dropFromMirror(
        _ id: FileID, keepingSharesExcept exceptions: Set<FileID>?, _ w: StoreWriter
    ) throws -> Set<FileID> {
        let me = accountID
        var dropped: Set<FileID> = []
        var queue = [id]
        var seen: Set<FileID> = [id]
        while let next = queue.popLast() {
            try w.removeShared(next)
            try w.removeSharedLocal(next)
            try w.logChange(next)
            dropped.insert(next)
            for c in try w.reader.sharedChildIDs(of: next) where seen.insert(c).inserted {
                if let exceptions, !exceptions.contains(c),
                    try w.reader.sharedFile(c)?.signed.metadata.grant(to: me) != nil
                {
                    continue
                }
                queue.append(c)
            }
        }
        return dropped
    }
}

extension Vault {
    /// The shared file a link places in this account's tree, nil for anything but a link.
    public func linkTarget(of id: FileID) -> FileID? {
        state.withLock { $0.view.tree.file(id)?.linkTarget }
    }

    /// Resolves `path` from the root as `resolve` does, going on through links into the shares
    /// they place (`lookup` follows them).
    public func resolveAcrossShares(_ path: String) throws -> Node {
        var current = try resolve("/")
        var walked = ""
        for part in Self.components(path) {
            walked += "/" + part
            guard current.type == .folder else { throw VaultError.tree(.notAFolder(walked)) }
            guard let next = try lookup(current.id, part) else { throw VaultError.tree(.notFound(walked)) }
            current = next
        }
        return current
    }
}

/// The mount's view of shares (docs/SHARING.md, "In the mount"): a link shows as the shared
/// file it places, and the share's files are reached by id, like the account's own.
extension Vault {
    /// A link as the mount and the command line show it: the shared file's type and attributes
    /// under the link's name and place; an empty read-only folder when the share is gone.
    func presented(link: Node) -> Node {
        guard let target = linkTarget(of: link.id), let t = try? sharedLiveNode(target) else { return link }
        shownLinks.withLock { $0[target] = link.id }
        return Node(
            id: link.id, type: t.type, parent: link.parent, name: link.name, attributes: t.attributes,
            subfolders: t.subfolders)
    }

    /// A live file of a share this account reaches, nil if the mirror does not hold it, it or a
    /// folder above it is deleted, or no grant to this account is above it.
    func sharedLiveNode(_ id: FileID) throws -> Node? {
        let me = accountID
        return try withSharedView { view, _ -> Node? in
            guard let m = view.tree.file(id), Self.isReachable(m, by: me, in: view.tree) else { return nil }
            // A share root whose name does not open (made before shared names, or damaged) is
            // still shown, by id (at a link's place, under the link's name).
            let name =
                m.grant(to: me) != nil ? (try? shareName(m, &view)) ?? m.id.description : try view.openName(m)
            return try sharedNode(m, name: name, &view)
        }
    }

    /// The type of a live file of a share this account reaches (nil if none): what a lookup's
    /// check of its folder needs, without opening names and attributes or counting subfolders.
    func sharedLiveType(_ id: FileID) throws -> FileType? {
        let me = accountID
        return try store.readOne { r -> FileType? in
            let tree = MirrorTree(reader: r, cache: sharedRecords)
            let reachable = tree.file(id).flatMap { Self.isReachable($0, by: me, in: tree) ? $0 : nil }
            try tree.throwIfFailed()
            return reachable?.type
        }
    }

    /// The live child called `name` of a shared folder, found by name MAC.
    func sharedChild(of folder: FileID, named name: String) throws -> Node? {
        let me = accountID
        return try withSharedView { view, _ -> Node? in
            guard let f = view.tree.file(folder), Self.isReachable(f, by: me, in: view.tree) else {
                throw VaultError.tree(.notFound(folder.description))
            }
            guard f.type == .folder else { throw VaultError.tree(.notAFolder(name)) }
            let mac = try view.nameMAC(name, in: folder)
            guard
                let child = view.tree.childIDs(of: folder, nameMAC: mac).compactMap(view.tree.file).first(where: {
                    !$0.isDeleted
                })
            else { return nil }
            return try sharedNode(child, name: name, &view)
        }
    }

    /// The link shown at the place of the shared file `target`, if the mount has shown one.
    public func shownLink(placing target: FileID) -> FileID? {
        shownLinks.withLock { $0[target] }
    }

    /// Whether `m` is live and under a live grant to `account`: nothing deleted on the way up to
    /// the nearest such grant.
    static func isReachable(_ m: FileMetadata, by account: AccountID, in tree: MirrorTree) -> Bool {
        var cursor = m
        for _ in 0...TreeLimits.maxDepth + 1 {
            if cursor.isDeleted { return false }
            if cursor.grant(to: account) != nil { return true }
            guard !cursor.isRoot, let parent = tree.file(cursor.parent) else { return false }
            cursor = parent
        }
        return false
    }

    /// A shared document, opened for writing if this account may write it. A writable one
    /// joins the vault's table of open documents, as the account's own do (its handles share
    /// one buffer, and the last release flushes it into the mirror's local layer).
    func openSharedDocument(_ id: FileID) throws -> OpenDocument {
        if let doc = openDocuments.withLock({ docs -> OpenDocument? in
            guard let d = docs[id] else { return nil }
            d.openCount.add(1, ordering: .relaxed)
            return d
        }) {
            return doc
        }
        let me = accountID
        let (cipher, digest, writable, place) = try withSharedView {
            view, _ -> (ContentCipher, [UInt8]?, Bool, [String]) in
            guard let m = view.tree.file(id), Self.isReachable(m, by: me, in: view.tree) else {
                throw VaultError.tree(.notFound(id.description))
            }
            if m.type == .folder { throw VaultError.tree(.isAFolder(id.description)) }
            guard m.type == .document else { throw VaultError.tree(.notADocument(id.description)) }
            let writable = view.tree.accessMode(of: me, on: id) == .write
            return (
                ContentCipher(fileID: id, key: try view.key(id)), m.contentDigest, writable,
                writable ? sharedDescribe(view.tree)(id).split(separator: "/").map(String.init) : []
            )
        }
        let fresh = OpenDocument(
            id: id, vault: self, cipher: cipher, manifest: try loadManifest(digest, cipher: cipher), digest: digest,
            readOnly: !writable, shared: true, sharedPlace: place)
        guard writable else { return fresh }
        return openDocuments.withLock { docs in
            let doc = docs[id] ?? fresh
            docs[id] = doc
            doc.openCount.add(1, ordering: .relaxed)
            return doc
        }
    }
}
