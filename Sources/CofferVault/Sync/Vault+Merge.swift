import CofferContent
import CofferCrypto
import CofferModel
import CofferStore
import Foundation

/// Applying a pull: the 3-way merge of base, local and remote, then conflict resolution in an
/// order the Sync v3 design allows (cycles, then keys a rotation replaced, then content
/// conflicts, then path conflicts: both of the first two can move or create files, so they
/// come before path conflicts; cycles come first so that every key can be derived down the
/// tree), all in one transaction together with the new cursor. Nothing a user wrote is dropped: an edit to
/// a document deleted elsewhere is saved again as a new file, a binary conflict keeps the local
/// bytes in a copy, a text conflict keeps both sides between markers.
extension Vault {
    /// Applies pulled records and advances the cursor. Returns every id whose view changed.
    @discardableResult
    public func applyPull(_ files: [RemoteFile], cursor: Int64) throws -> Set<FileID> {
        do {
            return try state.withLock { s in
                let changed = try store.write { w -> Set<FileID> in
                    // A cache of its own, unbounded: it holds the keys of every file the pull
                    // touches, which a cycle the merge has yet to undo could not derive again.
                    var merge = PullMerge(vault: self, writer: w, view: s.view.staged(capacity: .max))
                    let changed = try merge.run(files, &s)
                    if let failure = s.view.tree.takeFailure() { throw VaultError.io(failure) }
                    s.clock = max(s.clock, merge.view.cache.latestStamp)
                    try renewClockLease(&s, w)
                    try w.setSetting("cursor", Self.bytes(cursor))
                    return changed
                }
                try settle(changed, &s)
                return changed
            }
        } catch { throw VaultError.wrap(error) }
    }
}

/// The working state of one pull application.
struct PullMerge {
    let vault: Vault
    let w: StoreWriter
    /// The tree as it will be (new base under merged local), seen with keys: the vault's tree
    /// with the merge's records staged over it, and `put` forgets what a pulled record changes.
    var view: KeyedTree<Batch<StoreTree>>
    var newBase: [FileID: StoredFile] = [:]
    /// Final local records (to sign and store) by id; nil value = no local record.
    var local: [FileID: FileMetadata?] = [:]
    var touched: Set<FileID> = []
    /// Files this merge made (copies of conflicting or orphaned edits).
    var created: Set<FileID> = []
    /// Files whose attributes (and name for grantees) are merged once keys are settled
    /// (`settleKeys`), with the local and remote records: one side replaced the file's key (a
    /// rotation, docs/SHARING.md "Revocation"), or some key changed in this pull.
    var deferred: [FileID: (local: FileMetadata, remote: FileMetadata)] = [:]
    /// `knownKeys`, memoised.
    var knownKeyMemo: [FileID: [SymmetricKey]] = [:]
    /// Files whose key a rotation in this pull's records replaced (`takeKey`): never exposed.
    var freshKeys: Set<FileID> = []
    /// Files with a live grant sealed under a key this merge replaced (`Vault.noteStaleGrants`).
    var staleGrants: Set<FileID> = []
    /// Files a grantee gave its grant up on, which this device adopts: their keys are rotated
    /// as for a revocation (`rotateGivenUp`).
    var gaveUp: Set<FileID> = []
    /// Whether a record of this pull, or an unpushed one, has a new key generation: only then
    /// does anything sealed need sealing again (`settleKeys`).
    var keysChanged = false

    init(vault: Vault, writer: StoreWriter, view: KeyedTree<Batch<StoreTree>>) {
        self.vault = vault
        self.w = writer
        self.view = view
    }

    mutating func run(_ files: [RemoteFile], _ s: inout VaultState) throws -> Set<FileID> {
        // The tree before this pull: what the store's readers see (this write is not
        // committed) under what this process wrote that they cannot see yet.
        let before = view.tree.base
        var remote: [FileID: RemoteFile] = [:]
        for f in files { remote[f.signed.metadata.id] = f }
        let remoteMeta = remote.mapValues { $0.signed.metadata }

        // Orphans: an update whose parent this device cannot know (it was pruned after its
        // deletion synced) belongs to a deleted subtree; it is dropped.
        var known: [FileID: Bool] = [:]
        func isKnown(_ id: FileID, _ depth: Int = 0) -> Bool {
            if let k = known[id] { return k }
            guard depth < 10_000, let m = remoteMeta[id] ?? before.file(id) else { return false }
            let k =
                m.isRoot || before.file(m.parent) != nil
                || (remoteMeta[m.parent] != nil && isKnown(m.parent, depth + 1))
            known[id] = k
            return k
        }
        var applicable: [RemoteFile] = []
        for r in remote.values {
            let id = r.signed.metadata.id
            if isKnown(id) {
                applicable.append(r)
                continue
            }
            // A deletion that moved a file into a folder this device already pruned still
            // deletes the file here: kept at its last known place, marked deleted by the server.
            if r.signed.metadata.isDeleted || r.serverDeleted, let old = try w.reader.file(id, .base) {
                applicable.append(
                    RemoteFile(
                        signed: old.signed, version: r.version, contentVersion: r.contentVersion, serverDeleted: true))
            }
        }
        applicable.sort { $0.signed.metadata.id < $1.signed.metadata.id }
        // Keys of files this device knows come from its own tree, before pulled records can
        // place them anywhere (even in a cycle that is undone below).
        // So do the keys of this device's unpushed records, which the merge opens and may move.
        let localRecords = try w.reader.files(.local)
        for r in applicable where before.file(r.signed.metadata.id) != nil { _ = try? view.key(r.signed.metadata.id) }
        for l in localRecords where before.file(l.metadata.id) != nil { _ = try? view.key(l.metadata.id) }

        var conflicts: [FileID: (base: FileMetadata, local: FileMetadata, remote: FileMetadata)] = [:]
        // Local documents with unsynced content edits that are live before this pull.
        var editedLocally: [(FileMetadata, oldBaseDigest: [UInt8]?)] = []
        for l in localRecords where l.metadata.type == .document && before.isLive(l.metadata.id) {
            let oldBase = try w.reader.file(l.metadata.id, .base)
            if oldBase == nil || oldBase?.metadata.contentDigest != l.metadata.contentDigest {
                editedLocally.append((l.metadata, oldBase?.metadata.contentDigest))
            }
        }
        for l in localRecords where !keysChanged {
            if let base = try w.reader.file(l.metadata.id, .base),
                base.metadata.keyGeneration != l.metadata.keyGeneration
            {
                keysChanged = true
            }
        }
        // Every pulled record is known as the new base from the start: the keys a rotation
        // replaced are found through any of them (`knownKeys`). Whether any key changed is known
        // before the first record is merged.
        var oldBases: [FileID: StoredFile] = [:]
        for r in applicable {
            let id = r.signed.metadata.id
            newBase[id] = r.stored
            guard let oldBase = try w.reader.file(id, .base) else { continue }
            oldBases[id] = oldBase
            if oldBase.metadata.keyGeneration != r.signed.metadata.keyGeneration { keysChanged = true }
        }
        // A file another device placed in a folder while this one rotated it, pushed in between:
        // it comes wrapped under the folder's old key, with no generation of its own changed.
        // Only records placed under a folder that was ever rotated are checked (one unwrap each).
        for r in applicable where !keysChanged {
            let m = r.signed.metadata
            guard !m.isRoot, oldBases[m.id]?.metadata.parent != m.parent,
                let parent = newBase[m.parent]?.metadata ?? before.file(m.parent), parent.keyGeneration > 0,
                let parentKey = try? view.key(m.parent)
            else { continue }
            if (try? KeyWrap.unwrap(m.wrappedKey, with: parentKey, fileID: m.id.bytes)) == nil { keysChanged = true }
        }
        for r in applicable {
            let id = r.signed.metadata.id
            let oldBase = oldBases[id]
            let stored = r.stored
            newBase[id] = stored  // written at the end: the old base content is still needed for merges
            touched.insert(id)
            let rEff = stored.effectiveMetadata
            if let l = try w.reader.file(id, .local)?.metadata {
                let b = oldBase?.effectiveMetadata ?? rEff
                let (m, conflict) = try mergeRecord(base: b, local: l, remote: rEff, &s)
                let merged = vault.adopted(m)
                if Self.adoptsGiveUp(merged, from: m) { gaveUp.insert(id) }
                local[id] = merged
                view.put(merged)
                if conflict { conflicts[id] = (b, l, rEff) }
            } else if rEff.lastModifiedBy != vault.accountID {
                // A grantee wrote it (checked against the sharing rules on the way in): this
                // device signs it again as the owner's (`Vault.adopted`), deleted ones too, so
                // the tree keeps nothing a grantee wrote once the grant that let it is revoked.
                let m = vault.adopted(rEff)
                if Self.adoptsGiveUp(m, from: rEff) { gaveUp.insert(id) }
                local[id] = m
                view.put(m)
            } else {
                view.put(rEff)
            }
        }

        // 1. Cycles: local moves that close a loop with pulled moves are undone first, so that
        // every key can be derived down the tree for what follows.
        try resolveCycles()
        // What one side sealed under keys the other side's rotation replaced, sealed again.
        try settleKeys()
        try rotateGivenUp()
        // 2. Content conflicts (they can create files, so they come before path conflicts).
        for (id, c) in conflicts.sorted(by: { $0.key < $1.key }) {
            try resolveContentConflict(id, c.base, c.local, c.remote, &s)
        }
        // Edits to documents deleted elsewhere survive as new files at their old path.
        for (l, _) in editedLocally where !view.tree.isLive(l.id) {
            let parent = view.tree.isLive(l.parent) ? l.parent : (view.tree.rootID ?? l.parent)
            try recreate(from: l, name: try anyName(l), in: parent, &s)
        }
        // Local records that a pulled deletion made unreachable: the server will not take a live
        // record under a deleted folder, so they become deletions (or vanish, if the server never
        // knew them). Their content edits were saved above.
        try settleImplicitDeletions()
        // 3. Path conflicts: the locally changed file is renamed name-1.ext, name-2.ext, …
        try resolvePathConflicts()
        // Deletions put back at base places, sealed under the base's keys.
        try settleKeys()

        try vault.noteStaleGrants(staleGrants, w)
        // Check, then write: base first (the pulled records), then the local side.
        for stored in newBase.values { try w.put(stored, .base) }
        let ids = Array(touched)
        try Validator.validate(changed: ids, before: { before.file($0) }, in: view.tree)
        for id in ids {
            guard let entry = local[id] else { continue }
            let stored = try newBase[id] ?? w.reader.file(id, .base)
            // Equal to the base but for the writer: nothing to push, unless the base is another
            // account's record this device adopts.
            if let m = entry, let base = stored, Self.sameContent(m, base.effectiveMetadata),
                base.metadata.lastModifiedBy == vault.accountID
            {
                try w.remove(id, .local)
            } else if var m = entry {
                m.lastModifiedBy = vault.accountID
                let base = stored
                try w.put(
                    StoredFile(
                        signed: vault.unsigned(m), version: base?.version ?? 0,
                        contentVersion: base?.contentVersion ?? 0), .local)
            } else {
                try w.remove(id, .local)
                if newBase[id] == nil, try w.reader.file(id, .base) == nil { try w.forgetInode(of: id) }
            }
        }
        return touched
    }

    mutating func settleImplicitDeletions() throws {
        var ids: [FileID] = []
        for (id, entry) in local where entry != nil { ids.append(id) }
        for l in try w.reader.files(.local) where local[l.metadata.id] == nil { ids.append(l.metadata.id) }
        for id in ids.sorted() {
            guard let m = view.tree.file(id), !m.isRoot, !m.isDeleted, !view.tree.isLive(id) else { continue }
            let base = try newBase[id] ?? w.reader.file(id, .base)
            if base == nil {
                // Never on the server: drop it (children first are handled by the same rule, as
                // they are unreachable too; none is left without a parent since the whole
                // subtree is unreachable).
                local[id] = .some(nil)
                view.remove(id)
            } else if let base {
                // Deleted where the server last had it: its local placement may be a folder that
                // is being dropped here.
                var deleted = m
                deleted.isDeleted = true
                deleted.parent = base.metadata.parent
                deleted.name = base.metadata.name
                deleted.wrappedKey = try wrappedKey(of: m, under: base.metadata.parent, base: base.metadata)
                local[id] = deleted
                view.put(deleted)
            }
            touched.insert(id)
        }
    }

    static func sameContent(_ a: FileMetadata, _ b: FileMetadata) -> Bool {
        var x = a
        x.lastModifiedBy = b.lastModifiedBy
        return x == b
    }

    // MARK: Field merge

    /// Remote wins name and parent, deletion wins, content from whichever side changed it,
    /// POSIX attributes per attribute by hybrid clock. Reports a content conflict if both sides
    /// changed the content differently.
    mutating func mergeRecord(
        base b: FileMetadata, local l: FileMetadata, remote r: FileMetadata, _ s: inout VaultState
    ) throws -> (FileMetadata, Bool) {
        var m = l
        let remoteMoved = !samePlace(r, b)
        if remoteMoved {
            m.parent = r.parent
            m.name = r.name
            m.wrappedKey = r.wrappedKey
        }
        m.isDeleted = l.isDeleted || r.isDeleted
        m.access = AccessEntry.merged(base: b.access, local: l.access, remote: r.access)
        m.owner = r.owner
        let localContent = l.contentDigest != b.contentDigest
        let remoteContent = r.contentDigest != b.contentDigest
        if remoteContent && !localContent { m.contentDigest = r.contentDigest }
        let conflict =
            l.type == .document && localContent && remoteContent && l.contentDigest != r.contentDigest && !m.isDeleted
        if keysChanged {
            // Some key changed in this pull: what is sealed may not open under the keys derivable
            // until every record is in, so attributes and the name for grantees are merged once
            // keys are settled (`settleKeys`).
            if l.keyGeneration != b.keyGeneration || r.keyGeneration != b.keyGeneration {
                takeKey(&m, base: b, local: l, remote: r)
            }
            deferred[l.id] = (l, r)
        } else if l.sealedAttributes != r.sealedAttributes {
            let la = try view.openAttributes(l)
            let ra = try view.openAttributes(r)
            var ma = PosixAttributes.merge(la, ra)
            ma.size = m.contentDigest == r.contentDigest ? ra.size : la.size
            for stamp in [ra.mode.stamp, ra.uid.stamp, ra.gid.stamp, ra.mtime.stamp, ra.atime.stamp]
            where stamp > s.clock { s.clock = stamp }
            if ma == ra {
                m.sealedAttributes = r.sealedAttributes
            } else if ma == la {
                m.sealedAttributes = l.sealedAttributes
            } else {
                m.sealedAttributes = try view.sealAttributes(ma, of: l.id)
            }
        }
        // The name for grantees follows the merged name: the remote's with the remote's name,
        // sealed afresh for any other (a local rename over a share made elsewhere, or the reverse).
        // With a new key it is sealed again once keys are settled (`settleKeys`).
        if deferred[l.id] == nil {
            if m.name == r.name, r.shareName != nil || !m.isShared {
                m.shareName = r.shareName
            } else if m.name == l.name, l.shareName != nil {
                m.shareName = l.shareName
            } else if m.isShared || l.shareName != nil || r.shareName != nil {
                m.shareName = try view.sealShareName(try view.openName(m), of: m.id)
            }
        }
        // The writer is settled when the merged record is stored: dropped as the base if only
        // the writer differs, else signed as this device's own.
        return (m, conflict)
    }

    // MARK: Content

    mutating func cipher(_ id: FileID) throws -> ContentCipher {
        ContentCipher(fileID: id, key: try view.key(id))
    }

    func manifest(_ digest: [UInt8]?, _ cipher: ContentCipher) throws -> Manifest {
        try w.manifest(digest, cipher)
    }

    func plaintext(_ digest: [UInt8]?, _ cipher: ContentCipher) throws -> [UInt8] {
        var out: [UInt8] = []
        for ref in try manifest(digest, cipher).chunks {
            guard let sealed = try w.reader.chunk(ref.id) else {
                throw ContentError.missingChunk(hexString(Array(ref.id.prefix(8))))
            }
            out += try cipher.openChunk(sealed, ref: ref)
        }
        return out
    }

    /// Seals plaintext as a new version under `cipher`; returns digest and size.
    func storeContent(_ bytes: [UInt8], _ cipher: ContentCipher) throws -> ([UInt8], UInt64) {
        var refs: [ChunkRef] = []
        var offset = 0
        let size = Int(Manifest.defaultChunkSize)
        while offset < bytes.count {
            let end = min(bytes.count, offset + size)
            let (ref, sealed) = bytes[offset..<end].withUnsafeBytes { cipher.sealChunk($0) }
            try w.putChunk(id: ref.id, sealed: sealed)
            refs.append(ref)
            offset = end
        }
        let m = Manifest(chunks: refs)
        let sealed = cipher.sealManifest(m)
        let digest = ContentCipher.digest(ofSealedManifest: sealed)
        try w.putManifest(digest: digest, sealed: sealed, chunkIDs: refs.map(\.id))
        return (digest, m.size)
    }

    /// Text: merged line by line, overlaps between markers. Anything else: remote content under
    /// the name, local content in a new file next to it.
    mutating func resolveContentConflict(
        _ id: FileID, _ b: FileMetadata, _ l: FileMetadata, _ r: FileMetadata, _ s: inout VaultState
    ) throws {
        guard var m = local[id] ?? nil else { return }
        let c = try cipher(id)
        // Each version under the key it was sealed with: a rotation on either side replaced it.
        let cb = try cipher(id, opening: b.contentDigest)
        let cl = try cipher(id, opening: l.contentDigest)
        let cr = try cipher(id, opening: r.contentDigest)
        if keysChanged {
            // A side that only sealed the same bytes again under a new key changed nothing:
            // the other side's content stands, under the merged key.
            let kept: ([UInt8]?, ContentCipher)? =
                try samePlaintext(b.contentDigest, cb, r.contentDigest, cr)
                ? (l.contentDigest, cl)
                : try samePlaintext(b.contentDigest, cb, l.contentDigest, cl) ? (r.contentDigest, cr) : nil
            if let (digest, from) = kept {
                let (d, size) = try underCurrentKey(digest, from: from)
                m.contentDigest = d
                try view.changeAttributes(&m) { a in a.size = size }
                local[id] = m
                view.put(m)
                return
            }
        }
        let sizes = (
            try manifest(b.contentDigest, cb).size, try manifest(l.contentDigest, cl).size,
            try manifest(r.contentDigest, cr).size
        )
        let limit = UInt64(TextMerge.maxBytes)
        if sizes.0 <= limit && sizes.1 <= limit && sizes.2 <= limit {
            let bt = try plaintext(b.contentDigest, cb)
            let lt = try plaintext(l.contentDigest, cl)
            let rt = try plaintext(r.contentDigest, cr)
            if TextMerge.isText(bt) && TextMerge.isText(lt) && TextMerge.isText(rt) {
                let result = TextMerge.merge(base: bt, local: lt, remote: rt)
                let (digest, size) = try storeContent(result.merged, c)
                m.contentDigest = digest
                let stamp = vault.nextStamp(&s)
                let t = vault.now()
                try view.changeAttributes(&m) { a in
                    a.size = size
                    a.mtime = Stamped(t, at: stamp)
                    a.ctime = t
                }
                local[id] = m
                view.put(m)
                return
            }
        }
        // Binary: the name keeps the remote bytes; the local bytes move to a copy.
        m.contentDigest = try underCurrentKey(r.contentDigest, from: cr).0
        try view.changeAttributes(&m) { a in a.size = sizes.2 }
        local[id] = m
        view.put(m)
        let parent = view.tree.isLive(m.parent) ? m.parent : (view.tree.rootID ?? m.parent)
        try recreate(from: l, name: try view.openName(m), in: parent, &s)
    }

    /// Saves a local document version as a brand-new file (new id, new key) in `parent`.
    mutating func recreate(from l: FileMetadata, name: String, in parent: FileID, _ s: inout VaultState) throws {
        let id = try FileID(random: randomBytes(16))
        let key = SymmetricKey.random()
        let (digest, _) = try w.resealContent(
            l.contentDigest, from: try cipher(l.id, opening: l.contentDigest), to: ContentCipher(fileID: id, key: key))
        var attrs = try anyAttributes(l)
        let stamp = vault.nextStamp(&s)
        attrs.mode.stamp = stamp
        attrs.uid.stamp = stamp
        attrs.gid.stamp = stamp
        attrs.mtime.stamp = stamp
        attrs.atime.stamp = stamp
        let m = FileMetadata(
            id: id, type: .document, parent: parent, name: try view.sealName(name, in: parent, of: id),
            owner: vault.accountID, wrappedKey: try view.wrap(key, of: id, in: parent),
            sealedAttributes: attrs.sealed(key: key, of: id),
            contentDigest: digest, lastModifiedBy: vault.accountID)
        view.cache.keys[id] = key
        local[id] = m
        view.put(m)
        touched.insert(id)
        created.insert(id)
    }

    // MARK: Cycles and path conflicts

    /// Any locally moved file that is part of a cycle goes back to its (new) base parent.
    mutating func resolveCycles() throws {
        for _ in 0..<100 {
            var fixed = false
            for (id, entry) in local {
                guard let m = entry, m.parent != (try newBase[id] ?? w.reader.file(id, .base))?.metadata.parent,
                    inCycle(id),
                    let base = try (newBase[id] ?? w.reader.file(id, .base))?.effectiveMetadata
                else { continue }
                var undone = m
                undone.parent = base.parent
                undone.name = base.name
                undone.wrappedKey = try wrappedKey(of: m, under: base.parent, base: base)
                local[id] = undone
                view.put(undone)
                touched.insert(id)
                fixed = true
            }
            if !fixed { return }
        }
    }

    func inCycle(_ id: FileID) -> Bool {
        var seen: Set<FileID> = [id]
        var cursor = view.tree.file(id)
        while let c = cursor, !c.isRoot {
            if !seen.insert(c.parent).inserted { return true }
            cursor = view.tree.file(c.parent)
        }
        return false
    }

    /// Files whose name or place comes from this device (created here, or renamed/moved here).
    mutating func isLocallyPlaced(_ id: FileID) throws -> Bool {
        let entry: FileMetadata?? = try local[id] ?? w.reader.file(id, .local).map { Optional($0.metadata) }
        guard let found = entry, let m = found else { return false }
        if created.contains(id) { return true }
        guard let base = try newBase[id] ?? w.reader.file(id, .base) else { return true }
        return !samePlace(base.metadata, m)
    }

    mutating func resolvePathConflicts() throws {
        var candidates: [FileID] = []
        for (id, entry) in local where entry != nil { candidates.append(id) }
        for l in try w.reader.files(.local) where local[l.metadata.id] == nil { candidates.append(l.metadata.id) }
        for id in candidates.sorted() {
            guard let m = view.tree.file(id), !m.isRoot, view.tree.isLive(id) else { continue }
            let others = view.tree.childIDs(of: m.parent, nameMAC: m.name.mac).filter {
                $0 != id && view.tree.file($0).map { !$0.isDeleted } == true
            }
            guard let other = others.first else { continue }
            // Rename the one placed by this device; if both were, the newer copy.
            let renameMe = try isLocallyPlaced(id) || !(try isLocallyPlaced(other))
            let target = renameMe ? id : other
            guard var t = view.tree.file(target) else { continue }
            let name = try view.openName(t)
            var n = 1
            var candidate = Self.numbered(name, n)
            while view.tree.liveChild(of: t.parent, nameMAC: try view.nameMAC(candidate, in: t.parent)) != nil {
                n += 1
                candidate = Self.numbered(name, n)
            }
            t.name = try view.sealName(candidate, in: t.parent, of: target)
            if t.shareName != nil { t.shareName = try view.sealShareName(candidate, of: target) }
            local[target] = t
            view.put(t)
            touched.insert(target)
        }
    }

    /// `notes.txt` → `notes-1.txt`; `archive.tar.gz` → `archive.tar-1.gz`; `.bashrc` → `.bashrc-1`.
    static func numbered(_ name: String, _ n: Int) -> String {
        if let dot = name.lastIndex(of: "."), dot != name.startIndex {
            return String(name[..<dot]) + "-\(n)" + String(name[dot...])
        }
        return name + "-\(n)"
    }
}
