import CofferCrypto
import CofferModel
import CofferProtocol
import Foundation

/// An account's tree as of `version`, decoded once and kept between requests. Records are held
/// in their effective form: a file the server marked `serverDeleted` has `isDeleted` set, so the
/// validator sees what the clients must see.
struct CachedTree: Sendable {
    var version: Int64 = 0
    var tree = FileTree()
    var contentVersion: [FileID: Int64] = [:]
    /// Each file's stored signed revision: a changed record must come with a greater one.
    var revision: [FileID: UInt64] = [:]
    var serverDeleted: Set<FileID> = []

    mutating func apply(_ f: StoredFile) throws {
        let signed = try SignedMetadata(decoding: Array(f.record))
        var m = signed.metadata
        if f.deleted { m.isDeleted = true }
        tree.insert(m)
        contentVersion[m.id] = f.contentVersion
        revision[m.id] = signed.revision
        if f.serverDeleted { serverDeleted.insert(m.id) } else { serverDeleted.remove(m.id) }
        version = max(version, f.version)
    }
}

extension CofferServer {
    /// Takes the account's cached tree out of the cache (so it can be mutated without a copy) and
    /// brings it up to `version` by reading only the records changed since it was cached.
    func takeTree(account: Data, version: Int64, reader: any MetadataReader) throws -> CachedTree {
        var entry = trees.withLock { $0.removeValue(forKey: account) } ?? CachedTree()
        if entry.version > version { entry = CachedTree() }
        if entry.version < version {
            for f in try reader.files(account: account, since: entry.version) {
                try entry.apply(f)
            }
            entry.version = version
        }
        return entry
    }

    func putBack(account: Data, _ entry: CachedTree) {
        trees.withLock { cache in
            if let existing = cache[account], existing.version >= entry.version { return }
            if cache.count >= Self.maxCachedTrees, cache[account] == nil, let victim = cache.keys.randomElement() {
                cache.removeValue(forKey: victim)
            }
            cache[account] = entry
        }
    }

    struct Decoded {
        var update: FileUpdate
        var signed: SignedMetadata
    }

    /// What one batch does to the stored state, worked out against the cached tree.
    struct Plan {
        /// Changed records in their effective form.
        var changed: [FileMetadata] = []
        var rawRecords: [FileID: Data] = [:]
        var revisions: [FileID: UInt64] = [:]
        /// Files newly marked `serverDeleted` (changed or not).
        var marked: Set<FileID> = []
        var superseded: [ManifestKey] = []
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
        for (i, u) in request.updates.enumerated() {
            let bytes = Array(u.record)
            guard let s = try? SignedMetadata(decoding: bytes) else { throw .badRequest("record \(i) is malformed") }
            guard s.encoded() == bytes else { throw .badRequest("record \(i) is not canonically encoded") }
            let m = s.metadata
            guard ids.insert(m.id).inserted else { throw .badRequest("file \(m.id) appears twice in the batch") }
            guard m.owner == callerID else { throw .forbidden("record \(i) (file \(m.id)) is not owned by the caller") }
            guard m.lastModifiedBy == callerID else {
                throw .forbidden("record \(i) (file \(m.id)) was not written by the caller")
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

        var released: [ChunkKey] = []
        var cleanEntry: CachedTree?  // committed state, safe to cache even if the batch fails
        var newEntry: CachedTree?  // the state after this batch, cached only once it committed
        let version: Int64
        do {
            version = try guarded {
                try metadata.write { tx -> Int64 in
                    guard let account = try tx.lockAccount(key: caller) else {
                        throw ServerError.unauthorized("no account has this key")
                    }
                    var entry = try takeTree(account: caller, version: account.version, reader: tx)
                    cleanEntry = entry
                    let plan = try makePlan(caller: caller, decoded: decoded, entry: entry, reader: tx)
                    if plan.changed.isEmpty && plan.marked.isEmpty { return account.version }
                    cleanEntry = nil  // release the copy so the tree below is mutated in place
                    let v = try apply(
                        plan, caller: caller, to: &entry, released: &released, tx: tx, newEntry: &newEntry)
                    // Records count against the quota (`QuotaRule`): a batch that leaves usage
                    // above the quota is refused unless it lowers usage (as deleting content does).
                    if let after = try tx.account(key: caller), after.bytesUsed > account.bytesUsed,
                        after.bytesUsed > quotaBytes
                    {
                        throw ServerError.quotaExceeded(
                            "storing these records would exceed the account's quota of \(quotaBytes) bytes")
                    }
                    return v
                }
            }
        } catch {
            if let e = cleanEntry { putBack(account: caller, e) }
            throw error
        }
        if let e = newEntry ?? cleanEntry { putBack(account: caller, e) }
        // Content after metadata: chunks no manifest lists any more go once the batch is in.
        try? releaseChunks(released)
        return UpsertResponse(version: version)
    }

    /// Writes a plan in the open transaction and updates the cached tree to match.
    func apply(
        _ plan: Plan, caller: Data, to entry: inout CachedTree, released: inout [ChunkKey], tx: any MetadataWriter,
        newEntry: inout CachedTree?
    ) throws -> Int64 {
        let v = try tx.nextVersion()
        let newlyChanged = Set(plan.changed.map(\.id))
        for m in plan.changed {
            let old = entry.tree.file(m.id)
            let contentChanged = old == nil || old?.contentDigest != m.contentDigest
            let serverDeleted = entry.serverDeleted.contains(m.id) || plan.marked.contains(m.id)
            guard let raw = plan.rawRecords[m.id] else { throw StorageError("record bytes missing") }
            let cv = contentChanged ? v : (entry.contentVersion[m.id] ?? v)
            try tx.putFile(
                StoredFile(
                    id: Data(m.id.bytes), account: caller, record: raw, version: v, contentVersion: cv,
                    serverDeleted: serverDeleted, deleted: m.isDeleted || serverDeleted,
                    digest: m.contentDigest.map { Data($0) }))
            var effective = m
            if serverDeleted {
                effective.isDeleted = true
                entry.serverDeleted.insert(m.id)
            }
            entry.tree.insert(effective)
            entry.contentVersion[m.id] = cv
            if let r = plan.revisions[m.id] { entry.revision[m.id] = r }
        }
        for id in plan.marked where !newlyChanged.contains(id) {
            guard var stored = try tx.file(id: Data(id.bytes)), var m = entry.tree.file(id) else { continue }
            stored.version = v
            stored.serverDeleted = true
            stored.deleted = true
            try tx.putFile(stored)
            m.isDeleted = true
            entry.tree.insert(m)
            entry.serverDeleted.insert(id)
        }
        for k in plan.superseded {
            released += try tx.deleteManifest(k).map { ChunkKey(account: caller, id: $0) }
        }
        try tx.setAccountVersion(key: caller, version: v)
        entry.version = v
        newEntry = entry
        return v
    }

    /// Checks preconditions and invariants and works out the changes. Throws a `ServerError`
    /// (409 `get_updates_required`, 409 `invalid_tree`, 409 `conflict`, 403) without writing.
    func makePlan(caller: Data, decoded: [Decoded], entry: CachedTree, reader: any MetadataReader) throws -> Plan {
        let tree = entry.tree
        var plan = Plan()
        var batch = Batch(base: tree)
        for d in decoded {
            var m = d.signed.metadata
            let id = m.id
            if let current = tree.file(id) {
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
                if entry.serverDeleted.contains(id) { m.isDeleted = true }
                let stored = entry.revision[id] ?? 0
                if let expected = d.update.expectedRevision, expected != stored {
                    throw ServerError.getUpdatesRequired(
                        "file \(id) changed on the server since the device last saw it")
                }
                if m == current && d.signed.revision == stored { continue }  // nothing changes
                // Revisions only go up: a record based on an older one is stale (the device must
                // merge first), and devices refuse an older record served again. An unchanged
                // record re-signed with a newer revision (a retried push) is stored, so the server
                // always holds the newest record a device has as base.
                guard d.signed.revision > stored else {
                    throw ServerError.getUpdatesRequired(
                        "file \(id) has a newer revision on the server than the one sent")
                }
            } else {
                // Not in the caller's tree: missing, or another account's. The precondition is
                // checked first so both give the same answer.
                guard d.update.expectedParent == nil, d.update.expectedNameMAC == nil else {
                    throw ServerError.getUpdatesRequired("file \(id) is not on the server")
                }
                if let other = try reader.file(id: Data(id.bytes)), other.account != caller {
                    throw ServerError.forbidden(Self.unusableFileID(Data(id.bytes)))
                }
            }
            batch.upsertUnchecked(m)
            plan.rawRecords[id] = d.update.record
            plan.revisions[id] = d.signed.revision
        }
        let changed: [FileMetadata]
        do { changed = try batch.validate() } catch { throw ServerError.invalidTree(error.description) }

        // Implicit deletions made explicit: a changed file under a deleted folder, and the
        // subtree of a folder that became deleted.
        // Both walks are memoised over the batch (validation has shown every record reaches the
        // root): ancestry walks up each record once, and a subtree under several newly deleted
        // folders is walked once, so the cost follows the batch, not depth × records.
        var marked: Set<FileID> = []
        var ancestry = Ancestry(batch)
        var walked: Set<FileID> = []
        for m in changed {
            let wasDeleted = tree.file(m.id)?.isDeleted ?? false
            let above: Ancestry<Batch<FileTree>>.Facts
            do { above = try ancestry.facts(of: m.parent) } catch { throw ServerError.invalidTree(error.description) }
            if !m.isDeleted, let deletedAncestor = above.deletedAt {
                // A live record placed under a folder that was already deleted on the server
                // means the device has not seen that deletion: it must merge first, or its
                // new file or edit would vanish.
                if tree.file(deletedAncestor)?.isDeleted ?? false {
                    throw ServerError.getUpdatesRequired(
                        "file \(m.id) is inside a folder that was deleted on the server")
                }
                marked.insert(m.id)
            }
            let nowDeleted = m.isDeleted || marked.contains(m.id)
            if nowDeleted, !wasDeleted, m.type == .folder, walked.insert(m.id).inserted {
                var queue = [m.id]
                while let next = queue.popLast() {
                    for d in batch.childIDs(of: next) where d != next && walked.insert(d).inserted {
                        queue.append(d)
                        if !(batch.file(d)?.isDeleted ?? true) && !entry.serverDeleted.contains(d) { marked.insert(d) }
                    }
                }
            }
        }

        // Content before metadata: a live document's new digest must name a stored manifest.
        for m in changed where m.type == .document && !m.isDeleted && !marked.contains(m.id) {
            guard let digest = m.contentDigest, digest != tree.file(m.id)?.contentDigest else { continue }
            guard try reader.hasManifest(ManifestKey(account: caller, fileID: Data(m.id.bytes), digest: Data(digest)))
            else {
                throw ServerError.conflict(
                    "file \(m.id) names content the server does not have; upload its manifest first")
            }
        }

        // Superseded content: a document's previous manifest when its digest changed, and every
        // manifest it names when it became deleted.
        for m in changed where m.type == .document {
            let old = tree.file(m.id)
            let deletedNow = m.isDeleted || marked.contains(m.id)
            if let od = old?.contentDigest, od != m.contentDigest || deletedNow {
                plan.superseded.append(ManifestKey(account: caller, fileID: Data(m.id.bytes), digest: Data(od)))
            }
            if deletedNow, let nd = m.contentDigest, nd != old?.contentDigest {
                plan.superseded.append(ManifestKey(account: caller, fileID: Data(m.id.bytes), digest: Data(nd)))
            }
        }
        let changedIDs = Set(changed.map(\.id))
        for id in marked where !changedIDs.contains(id) {
            if let m = tree.file(id), m.type == .document, let d = m.contentDigest {
                plan.superseded.append(ManifestKey(account: caller, fileID: Data(id.bytes), digest: Data(d)))
            }
        }
        plan.changed = changed
        plan.marked = marked
        return plan
    }
}
