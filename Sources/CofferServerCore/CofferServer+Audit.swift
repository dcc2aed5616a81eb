import CofferCrypto
import CofferModel
import CofferProtocol
import Foundation

extension CofferServer {
    /// Audits every account; returns problems prefixed with the account's key.
    public func auditAll() throws(ServerError) -> [String] {
        let keys = try guarded { try metadata.read { try $0.accountKeys() } }
        var problems: [String] = []
        for k in keys {
            let prefix = RequestSigning.hex(Array(k.prefix(8)))
            problems += try audit(account: k).map { "account \(prefix): \($0)" }
        }
        return problems
    }

    /// The server's own check of one account, read afresh from storage: every record decodes,
    /// is owned by the account and signed by its writer, and agrees with the columns stored beside it; a
    /// record another account wrote lies where that account holds write (a live grant, or one it
    /// gave up itself); the
    /// effective tree satisfies every invariant (one root, every file reaches it, parents are
    /// folders, live siblings have distinct names); every file under a deleted folder is marked
    /// deleted; every live document's content has its manifest; every chunk a manifest lists is
    /// in the content store; and the account's usage and live file count are what its stored
    /// rows count (`QuotaRule`). Returns the problems found (empty when clean).
    ///
    /// The account's records are streamed, one decoded at a time, and the tree is then walked
    /// down from the root through the children index (ids, flags and name MACs, no records), so
    /// the audit never holds the account's decoded tree; it holds the ids of the files it has
    /// still to visit, and one folder's children at a time.
    public func audit(account: Data) throws(ServerError) -> [String] {
        try guarded {
            guard let accountID = try? AccountID(bytes: Array(account)) else { return ["malformed account key"] }
            // One read transaction, so every check of the tree sees the same state.
            var problems = try metadata.read { tx in
                try auditTree(account: account, owner: accountID, tx: tx)
            }
            let (stored, recounted) = try metadata.read { tx in
                (try tx.account(key: account)?.bytesUsed, try tx.recountedUsage(account: account))
            }
            if let stored, stored != recounted {
                problems.append("usage is \(stored) bytes but what is stored counts \(recounted)")
            }
            let known = try metadata.read { try $0.allChunkKeys() }
            for k in known where k.account == account {
                if try !content.has(k) {
                    problems.append("chunk \(RequestSigning.hex(Array(k.id))) recorded but not stored")
                }
            }
            return problems
        }
    }

    /// The records and the tree's invariants (see `audit`).
    func auditTree(account: Data, owner: AccountID, tx: any MetadataReader) throws -> [String] {
        var problems: [String] = []
        var count: Int64 = 0
        var live: Int64 = 0
        var roots = 0
        // What each record shows on its own, one row at a time.
        try tx.visitFiles(account: account, since: 0, afterID: nil) { f in
            count += 1
            if !f.deleted { live += 1 }
            guard let s = try? SignedMetadata(decoding: Array(f.record)) else {
                problems.append("undecodable record")
                return true
            }
            let m = s.metadata
            if Data(m.id.bytes) != f.id { problems.append("file \(m.id) is stored under another id") }
            if m.owner != owner { problems.append("file \(m.id) not owned by the account") }
            // Signed by its writer: the owner, or an account it shared a folder with (whose
            // access was checked when it wrote; it may have been revoked since).
            if !PublicSigningKey.isValid(m.lastModifiedBy.bytes, s.message, s.signature) {
                problems.append("bad signature on file \(m.id)")
            }
            if m.lastModifiedBy != owner, try tx.account(key: Data(m.lastModifiedBy.bytes)) == nil {
                problems.append("file \(m.id) was written by an account the server does not know")
            }
            if f.linkTarget != m.linkTarget.map({ Data($0.bytes) }) {
                problems.append("file \(m.id): stored link target differs from its record")
            }
            if f.writer != StoredFile.writer(of: m) {
                problems.append("file \(m.id): stored writer differs from its record")
            }
            if f.deleted != (m.isDeleted || f.serverDeleted) {
                problems.append("file \(m.id): deleted flag inconsistent")
            }
            let placement = StoredFile.placement(of: m)
            let digest = m.contentDigest.map { Data($0) }
            if f.parent != placement.parent || f.nameMAC != placement.nameMAC || f.digest != digest {
                problems.append("file \(m.id): stored parent, name MAC or digest differs from its record")
            }
            if m.isRoot { roots += 1 }
            if m.type == .document, !f.deleted, let d = m.contentDigest,
                try !tx.hasManifest(ManifestKey(account: account, fileID: f.id, digest: Data(d)))
            {
                problems.append("document \(m.id) has no manifest for its content")
            }
            return true
        }
        if let stored = try tx.account(key: account)?.liveFiles, stored != live {
            problems.append("the account counts \(stored) live files but \(live) are stored")
        }
        if roots > 1 { problems.append("invariant: \(TreeError.multipleRoots)") }
        guard let root = try tx.rootID(account: account), let rootFile = try tx.file(id: root) else {
            if count > 0 { problems.append("invariant: \(TreeError.noRoot)") }
            return problems
        }
        // Down from the root through the children index. Each file has one parent, so this
        // visits every file that reaches the root exactly once and never enters a cycle (no
        // cycle holds the root, whose parent is none): what it does not reach is orphaned or in
        // a cycle.
        var reached: Int64 = 1
        var pending: [(id: Data, live: Bool)] = [(root, !rootFile.deleted)]
        while let folder = pending.popLast() {
            let children = try tx.children(account: account, parent: folder.id, liveOnly: false)
            if children.isEmpty { continue }
            if let f = try tx.file(id: folder.id), let s = try? SignedMetadata(decoding: Array(f.record)),
                s.metadata.type != .folder
            {
                problems.append("invariant: \(TreeError.parentNotFolder(s.metadata.id.description))")
            }
            var names: Set<Data> = []
            for c in children where c.id != folder.id {
                reached += 1
                let name = RequestSigning.hex(Array(c.id))
                if !folder.live && !c.deleted {
                    problems.append("file \(name) is under a deleted folder but not marked deleted")
                }
                if folder.live && !c.deleted && !names.insert(c.nameMAC).inserted {
                    problems.append("invariant: \(TreeError.pathConflict(name))")
                }
                pending.append((c.id, folder.live && !c.deleted))
            }
        }
        if reached < count {
            let named = try unrooted(account: account, root: root, tx: tx, limit: 10)
            problems.append(
                "invariant: \(count - reached) file(s) do not reach the root (orphaned, or in a cycle): "
                    + named.joined(separator: ", "))
        }
        // What grantees wrote lies where they may write (`checkNoOrphanedWrites`).
        let view = StorageTreeView(account: account, reader: tx)
        for (raw, _) in try tx.writtenByOthers(account: account) {
            guard let id = view.fileID(raw), let m = view.file(id) else { continue }
            if !view.heldWrite(
                by: m.lastModifiedBy, atOrAbove: id, verify: { PublicSigningKey.isValid($0.bytes, $1, $2) })
            {
                problems.append("file \(id) was written by an account that holds no write on it")
            }
        }
        try view.throwIfFailed()
        return problems
    }

    /// Up to `limit` files that do not reach `root` by their stored parents, each with why: run
    /// only when the walk down found some, to name them for the operator.
    func unrooted(account: Data, root: Data, tx: any MetadataReader, limit: Int) throws -> [String] {
        var found: [String] = []
        try tx.visitFiles(account: account, since: 0, afterID: nil) { f in
            var cursor = f
            var steps = 0
            while cursor.id != root {
                guard let parent = cursor.parent, let next = try tx.file(id: parent), next.account == account else {
                    found.append("\(RequestSigning.hex(Array(f.id))) (orphaned)")
                    break
                }
                steps += 1
                if steps > TreeLimits.maxDepth + 1 {
                    found.append("\(RequestSigning.hex(Array(f.id))) (in a cycle)")
                    break
                }
                cursor = next
            }
            return found.count < limit
        }
        return found
    }
}
