import CofferCrypto
import CofferModel
import CofferProtocol
import Foundation

/// An owner's batch refused for leaving records of these writers uncovered (`checkNoOrphanedWrites`).
struct OrphanedWrites: Error {
    let writers: Set<Data>
    let message: String
}

extension CofferServer {
    struct Decoded {
        var update: FileUpdate
        var signed: SignedMetadata
    }

    /// What one batch does to the stored state, worked out against the stored tree.
    struct Plan {
        /// Changed records in their effective form.
        var changed: [FileMetadata] = []
        var rawRecords: [FileID: Data] = [:]
        /// Files newly marked `serverDeleted` (changed or not).
        var marked: Set<FileID> = []
        var superseded: [ManifestKey] = []
        /// Which grantees to tell about which files (their feed rows move to the batch's version).
        var feed: [Data: Set<FileID>] = [:]
        /// Which of those files each grantee is granted again (`CofferServer.feedPlan`).
        var regranted: [Data: Set<FileID>] = [:]
        /// The grantees whose write the batch may end (every writer with records in the tree
        /// when it moves a folder), all of whose records it left covered.
        var endedWriters: Set<Data> = []
    }

    /// Applies a batch of signed records atomically. See docs/PROTOCOL.md, "What the server
    /// checks on upsert".
    public func upsert(caller: Data, _ request: UpsertRequest) throws(ServerError) -> UpsertResponse {
        guard let callerID = try? AccountID(bytes: Array(caller)),
            let callerKey = try? PublicSigningKey(bytes: Array(caller))
        else {
            throw .unauthorized("malformed account key")
        }
        guard request.updates.count <= TreeLimits.maxRecordsPerBatch else {
            throw .tooLarge("a batch has at most \(TreeLimits.maxRecordsPerBatch) records; send it in parts")
        }
        // Decode and authenticate every record before touching storage.
        var decoded: [Decoded] = []
        decoded.reserveCapacity(request.updates.count)
        var ids: Set<FileID> = []
        // The tree the batch writes to: the caller's own, or another account's that shares a
        // folder with it (the access rules decide what it may change there).
        var ownerID: AccountID?
        for (i, u) in request.updates.enumerated() {
            let bytes = Array(u.record)
            guard let s = try? SignedMetadata(decoding: bytes) else { throw .badRequest("record \(i) is malformed") }
            guard s.encoded() == bytes else { throw .badRequest("record \(i) is not canonically encoded") }
            let m = s.metadata
            guard ids.insert(m.id).inserted else { throw .badRequest("file \(m.id) appears twice in the batch") }
            guard ownerID == nil || ownerID == m.owner else {
                throw .badRequest("a batch writes to one account's tree; send each tree's records apart")
            }
            ownerID = m.owner
            guard m.lastModifiedBy == callerID else {
                throw .forbidden("record \(i) (file \(m.id)) was not written by the caller")
            }
            // Revisions carry the writer's clock (`SignedMetadata.revision(after:now:)`); one far
            // ahead of the server's would leave no newer revision for anyone to write, the file's
            // owner included.
            guard s.revision <= UInt64(max(0, now + API.maxClockSkewMillis)) else {
                throw .badRequest("record \(i) (file \(m.id)) has a revision ahead of the server's clock")
            }
            guard callerKey.verify(signature: s.signature, message: s.message) else {
                throw .forbidden("record \(i) (file \(m.id)): signature does not verify")
            }
            if m.type != .document, m.contentDigest != nil {
                throw .badRequest("file \(m.id) is not a document but names content")
            }
            switch (u.expectedParent, u.expectedNameMAC) {
            case (nil, nil): break
            case (let p?, _?):
                guard p.count == 16 else { throw .badRequest("record \(i): expectedParent is not a file id") }
            default: throw .badRequest("record \(i): expectedParent and expectedNameMAC are both set or both absent")
            }
            decoded.append(Decoded(update: u, signed: s))
        }

        let owner = ownerID.map { Data($0.bytes) } ?? caller
        var released: [ChunkKey] = []
        var told: Set<Data> = []
        let outcome: Result<Int64, OrphanedWrites> = try guarded {
            do {
                return .success(
                    try upsertBatch(owner: owner, caller: caller, decoded, released: &released, told: &told))
            } catch let o as OrphanedWrites {
                return .failure(o)
            }
        }
        switch outcome {
        case .success(let version):
            // The owner's devices and every grantee whose feed moved learn of it at once.
            notifier.notify(told.union([owner]))
            // Content after metadata: chunks no manifest lists any more go once the batch is in.
            try? releaseChunks(released)
            return UpsertResponse(version: version)
        case .failure(let held):
            // The owner's device must sign those records as its own: their writers' changes are
            // held back meanwhile, so a busy (or hostile) grantee cannot keep the owner from ever
            // ending its access. The refusal wrote nothing; the hold is its own small write.
            let until = now + Self.writePauseMillis
            try guarded {
                try metadata.write { tx in
                    for w in held.writers { try tx.pauseWrites(account: owner, writer: w, until: until) }
                }
            }
            throw .getUpdatesRequired(held.message)
        }
    }

    /// How long a grantee's changes are held back after its owner's change was refused for
    /// leaving that grantee's records uncovered: long enough for the owner's device to pull,
    /// sign them and push again, short enough that a grantee whose access stays is barely held.
    static let writePauseMillis: Int64 = 30_000

    /// The one write transaction of an upsert (see `upsert`).
    private func upsertBatch(
        owner: Data, caller: Data, _ decoded: [Decoded], released: inout [ChunkKey], told: inout Set<Data>
    ) throws -> Int64 {
        try metadata.write { tx -> Int64 in
            if owner != caller, try tx.account(key: caller) == nil {
                throw ServerError.unauthorized("no account has this key")
            }
            if owner != caller, let until = try tx.writePause(account: owner, writer: caller), until > now {
                throw ServerError.writesPaused(
                    "the owner of these files is changing who may write them; try again shortly")
            }
            // The owner's account is locked: its tree, version and quota are what change.
            guard let account = try tx.lockAccount(key: owner) else {
                if owner == caller { throw ServerError.unauthorized("no account has this key") }
                throw ServerError.forbidden("the records' owner has no account on this server")
            }
            // The tree is read inside the transaction that writes the batch, so it is the
            // committed state of this moment, whichever server process wrote it last.
            let view = StorageTreeView(account: owner, reader: tx)
            let links = LinkLookup(reader: tx)
            let plan: Plan
            do {
                plan = try makePlan(owner: owner, decoded: decoded, view: view, links: links)
                try view.throwIfFailed()
                try links.throwIfFailed()
            } catch {
                // A refusal reached through a read that failed is the storage's failure.
                try view.throwIfFailed()
                try links.throwIfFailed()
                throw error
            }
            if plan.changed.isEmpty && plan.marked.isEmpty { return account.version }
            let v = try apply(plan, owner: owner, view: view, released: &released, tx: tx)
            told.formUnion(plan.feed.keys)
            // Records count against the quota of the tree's owner (`QuotaRule`): a batch
            // that leaves usage above the quota is refused unless it lowers usage (as
            // deleting content does).
            if let after = try tx.account(key: owner), after.bytesUsed > account.bytesUsed,
                after.bytesUsed > quotaBytes
            {
                throw ServerError.quotaExceeded(
                    "storing these records would exceed the account's quota of \(quotaBytes) bytes")
            }
            // The owner's change went in: the grantees whose write it ended, all of whose
            // records it left covered, are held back no longer.
            if owner == caller {
                for w in plan.endedWriters { try tx.resumeWrites(account: owner, writer: w) }
            }
            return v
        }
    }

    /// Writes a plan in the open transaction. Every record it needs was read while planning.
    func apply(
        _ plan: Plan, owner: Data, view: StorageTreeView, released: inout [ChunkKey], tx: any MetadataWriter
    ) throws -> Int64 {
        let v = try tx.nextVersion()
        let newlyChanged = Set(plan.changed.map(\.id))
        var superseded = plan.superseded
        for m in plan.changed {
            let old = view.entry(m.id)
            let contentChanged = old == nil || old?.metadata.contentDigest != m.contentDigest
            let serverDeleted = (old?.serverDeleted ?? false) || plan.marked.contains(m.id)
            guard let raw = plan.rawRecords[m.id] else { throw StorageError("record bytes missing") }
            let cv = contentChanged ? v : (old?.contentVersion ?? v)
            let placement = StoredFile.placement(of: m)
            try tx.putFile(
                StoredFile(
                    id: Data(m.id.bytes), account: owner, record: raw, version: v, contentVersion: cv,
                    serverDeleted: serverDeleted, deleted: m.isDeleted || serverDeleted,
                    digest: m.contentDigest.map { Data($0) }, parent: placement.parent, nameMAC: placement.nameMAC,
                    linkTarget: m.linkTarget.map { Data($0.bytes) }, writer: StoredFile.writer(of: m)))
        }
        for (grantee, files) in plan.feed {
            let again = plan.regranted[grantee] ?? []
            for id in files {
                try tx.putFeed(account: grantee, fileID: Data(id.bytes), version: v, regranted: again.contains(id))
            }
        }
        // A marked file the batch did not change keeps its record; its content goes with it.
        for id in plan.marked where !newlyChanged.contains(id) {
            if let digest = try tx.markServerDeleted(id: Data(id.bytes), account: owner, version: v) {
                superseded.append(ManifestKey(account: owner, fileID: Data(id.bytes), digest: digest))
            }
        }
        for k in superseded {
            released += try tx.deleteManifest(k).map { ChunkKey(account: owner, id: $0) }
        }
        try tx.setAccountVersion(key: owner, version: v)
        return v
    }

    /// Checks preconditions and invariants and works out the changes. Throws a `ServerError`
    /// (409 `get_updates_required`, 409 `invalid_tree`, 409 `conflict`, 403) without writing.
    ///
    /// Reads only what the batch touches, so its cost follows the batch, not the account: each
    /// changed record, its ancestors up to the root and its live same-name siblings (the
    /// validator, memoised per batch by `Ancestry`), and the live part of the subtree of each
    /// folder the batch deletes (the files it deletes with it). A folder moved deeper also has
    /// its subtree's height measured, and a folder brought back to life its subtree's names
    /// checked (`Validator.validate`): walks of what the batch moves, never of the tree.
    func makePlan(owner: Data, decoded: [Decoded], view: StorageTreeView, links: LinkLookup) throws -> Plan {
        var plan = Plan()
        var batch = Batch(base: view)
        for d in decoded {
            var m = d.signed.metadata
            let id = m.id
            if let stored = view.entry(id) {
                let current = stored.metadata
                guard let ep = d.update.expectedParent, let en = d.update.expectedNameMAC,
                    Array(ep) == current.parent.bytes, Array(en) == current.name.mac
                else {
                    throw ServerError.getUpdatesRequired(
                        "file \(id) changed on the server since the device last saw it")
                }
                if current.type != m.type {
                    throw ServerError.invalidTree(TreeError.typeChanged(id.description).description)
                }
                if current.isDeleted && !m.isDeleted {
                    throw ServerError.getUpdatesRequired(
                        "file \(id) was deleted on the server; a deleted file stays deleted")
                }
                if stored.serverDeleted { m.isDeleted = true }
                if let expected = d.update.expectedRevision, expected != stored.revision {
                    throw ServerError.getUpdatesRequired(
                        "file \(id) changed on the server since the device last saw it")
                }
                if m == current && d.signed.revision == stored.revision { continue }  // nothing changes
                // Revisions only go up: a record based on an older one is stale (the device must
                // merge first), and devices refuse an older record served again. An unchanged
                // record re-signed with a newer revision (a retried push) is stored, so the server
                // always holds the newest record a device has as base.
                guard d.signed.revision > stored.revision else {
                    throw ServerError.getUpdatesRequired(
                        "file \(id) has a newer revision on the server than the one sent")
                }
            } else {
                // Not in the owner's tree: missing, or another account's. The precondition is
                // checked first so both give the same answer.
                guard d.update.expectedParent == nil, d.update.expectedNameMAC == nil else {
                    throw ServerError.getUpdatesRequired("file \(id) is not on the server")
                }
                if view.isForeign(id) { throw ServerError.forbidden(Self.unusableFileID(Data(id.bytes))) }
            }
            batch.upsertUnchecked(m)
            plan.rawRecords[id] = d.update.record
        }
        let changed: [FileMetadata]
        do { changed = try batch.validate() } catch { throw ServerError.invalidTree(error.description) }
        // The access rules, against the stored tree as it was: the writer's access, grants
        // signed by the owner, never on the root or a link, links to their rules
        // (docs/SHARING.md).
        do {
            try Authorization.check(
                changed: changed.map(\.id), before: view, after: batch,
                verify: { PublicSigningKey.isValid($0.bytes, $1, $2) },
                linkTarget: { links.facts(of: $0, forLinksOf: owner, batch: batch) })
        } catch { throw ServerError.forbidden(error.description) }
        // Whose write the batch may end: the accounts whose grants it changes, or anyone's when
        // it moves a folder (nil).
        var ending: Set<AccountID>? = []
        for m in changed {
            guard let old = view.file(m.id) else { continue }
            if m.type == .folder, old.parent != m.parent {
                ending = nil
                break
            }
            for e in m.access where old.access.first(where: { $0.account == e.account }) != e {
                ending?.insert(e.account)
            }
        }
        if ending?.isEmpty != true {
            // Every record of a batch is its caller's (checked on decoding).
            let byOwner = decoded.allSatisfy { Data($0.signed.metadata.lastModifiedBy.bytes) == owner }
            plan.endedWriters = try checkNoOrphanedWrites(
                owner: owner, of: ending, byOwner: byOwner, view: view, batch: batch)
        }

        // Implicit deletions made explicit: a changed file under a deleted folder, and the
        // subtree of a folder that became deleted.
        // Ancestry walks up each record once (memoised over the batch; validation has shown
        // every record reaches the root), and a subtree under several newly deleted folders is
        // walked once, so the cost follows the batch and what it deletes, not depth × records.
        var marked: Set<FileID> = []
        var ancestry = Ancestry(batch)
        var walked: Set<FileID> = []
        // The batch's records by parent, built once: each folder a walk visits asks for them.
        var changedUnder: [FileID: [FileID]] = [:]
        for m in changed where !m.isRoot { changedUnder[m.parent, default: []].append(m.id) }
        for m in changed {
            let wasDeleted = view.file(m.id)?.isDeleted ?? false
            let above: Ancestry<Batch<StorageTreeView>>.Facts
            do { above = try ancestry.facts(of: m.parent) } catch { throw ServerError.invalidTree(error.description) }
            if !m.isDeleted, let deletedAncestor = above.deletedAt {
                // A live record placed under a folder that was already deleted on the server
                // means the device has not seen that deletion: it must merge first, or its
                // new file or edit would vanish.
                if view.file(deletedAncestor)?.isDeleted ?? false {
                    throw ServerError.getUpdatesRequired(
                        "file \(m.id) is inside a folder that was deleted on the server")
                }
                marked.insert(m.id)
            }
            let nowDeleted = m.isDeleted || marked.contains(m.id)
            if nowDeleted, !wasDeleted, m.type == .folder, walked.insert(m.id).inserted {
                markSubtree(of: m.id, batch: batch, changedUnder: changedUnder, walked: &walked, marked: &marked)
            }
        }

        // Content before metadata: a live document's new digest must name a stored manifest.
        for m in changed where m.type == .document && !m.isDeleted && !marked.contains(m.id) {
            guard let digest = m.contentDigest, digest != view.file(m.id)?.contentDigest else { continue }
            guard
                try view.reader.hasManifest(
                    ManifestKey(account: owner, fileID: Data(m.id.bytes), digest: Data(digest)))
            else {
                throw ServerError.conflict(
                    "file \(m.id) names content the server does not have; upload its manifest first")
            }
        }

        // Superseded content: a document's previous manifest when its digest changed, and every
        // manifest it names when it became deleted. (Files marked without being changed give
        // theirs up when they are marked, in `apply`.)
        for m in changed where m.type == .document {
            let old = view.file(m.id)
            let deletedNow = m.isDeleted || marked.contains(m.id)
            if let od = old?.contentDigest, od != m.contentDigest || deletedNow {
                plan.superseded.append(ManifestKey(account: owner, fileID: Data(m.id.bytes), digest: Data(od)))
            }
            if deletedNow, let nd = m.contentDigest, nd != old?.contentDigest {
                plan.superseded.append(ManifestKey(account: owner, fileID: Data(m.id.bytes), digest: Data(nd)))
            }
        }
        plan.changed = changed
        plan.marked = marked
        (plan.feed, plan.regranted) = try Self.feedPlan(
            changed: changed, marked: marked, batch: batch,
            toldBefore: { try view.reader.hasFeedRow(account: $0, fileID: Data($1.bytes)) })
        return plan
    }

    /// Refuses a batch that would leave a record another account wrote where that account holds
    /// no write a device can check (`TreeView.heldWrite`: a live grant, or one it gave up
    /// itself): a revocation, a mode lowered, a folder moved out of a share, while the
    /// grantee's records are still below. The owner's device signs what grantees write as its
    /// own as it pulls it, so its answer is to sync and try again (409); another writer moving
    /// such a folder is refused (403) until the owner's device has. So the tree never holds a
    /// grantee's record that no grant covers, and devices need no history of grants to judge
    /// one: a record a revoked grantee signed after its revocation is refused by every device
    /// (docs/SHARING.md, "What devices verify").
    ///
    /// Runs only for batches that change grants (for the records of the accounts whose grants
    /// change, `writers`) or move folders (for all, `writers` nil), and reads the records
    /// grantees wrote that the owner's devices have not signed yet (an index), each walked up
    /// to the root. Only what the batch itself leaves uncovered is refused: a record no grant
    /// covered before (stored by an older server) does not stop every later change.
    /// Returns the writers it looked at (`writers`, or every writer with records in the tree).
    func checkNoOrphanedWrites(
        owner: Data, of writers: Set<AccountID>?, byOwner: Bool, view: StorageTreeView,
        batch: Batch<StorageTreeView>
    ) throws -> Set<Data> {
        let verify: Authorization.Verify = { PublicSigningKey.isValid($0.bytes, $1, $2) }
        let wanted = writers.map { Set($0.map { Data($0.bytes) }) }
        var uncovered: Set<Data> = []
        var looked = wanted ?? []
        var first: FileID?
        for (raw, writer) in try view.reader.writtenByOthers(account: owner) where wanted?.contains(writer) != false {
            looked.insert(writer)
            guard let id = view.fileID(raw), let m = batch.file(id), m.lastModifiedBy != m.owner else { continue }
            if batch.heldWrite(by: m.lastModifiedBy, atOrAbove: id, verify: verify) { continue }
            guard view.heldWrite(by: m.lastModifiedBy, atOrAbove: id, verify: verify) else { continue }
            uncovered.insert(writer)
            first = first ?? id
        }
        guard let first else { return looked }
        let why = "file \(first), written by another account, would be left where that account cannot write"
        if byOwner {
            throw OrphanedWrites(writers: uncovered, message: "\(why); sync first, so this device signs it as its own")
        }
        throw ServerError.forbidden("\(why); its owner's device must sync first")
    }

    /// Marks what a newly deleted folder deletes with it: every file below it that is live in the
    /// batch's tree. Stored children come from the index (live ones only, no records read); the
    /// batch's own records under a folder from `changedUnder`. A file already deleted on the
    /// server is not entered: the server marked everything below it when it was deleted (the
    /// invariant the audit checks), and a live record the batch puts there was refused above.
    /// So the walk costs the live files the deletion takes, whatever else the tree holds.
    func markSubtree(
        of folder: FileID, batch: Batch<StorageTreeView>, changedUnder: [FileID: [FileID]],
        walked: inout Set<FileID>, marked: inout Set<FileID>
    ) {
        let view = batch.base
        var queue = [folder]
        while let next = queue.popLast() {
            for child in view.children(of: next, liveOnly: true) {
                guard let id = view.fileID(child.id), id != next else { continue }
                // A stored child the batch changed is taken where the batch puts it (below).
                if batch.changes[id] != nil { continue }
                if walked.insert(id).inserted {
                    marked.insert(id)
                    queue.append(id)
                }
            }
            for id in changedUnder[next] ?? [] where id != next {
                guard let m = batch.changes[id], !(view.file(id)?.isDeleted ?? false), walked.insert(id).inserted
                else { continue }
                if !m.isDeleted { marked.insert(id) }
                queue.append(id)
            }
        }
    }
}
