import CofferContent
import CofferCrypto
import CofferModel
import CofferStore

/// Key rotation on revocation (docs/SHARING.md, "Revocation"): when a grant is revoked, the
/// shared file and every live file below it get new keys, so that nothing written afterwards can
/// be opened with what the removed account held.
extension Vault {
    /// The accounts whose grants on `id` or below it stay live after `revoked` loses its grant
    /// on `id`: a rotation seals the new keys for each of them, so the caller must bring their
    /// box keys (`unshare(_:from:name:boxKeys:)`).
    public func granteesKeeping(_ id: FileID, without revoked: AccountID) throws -> Set<AccountID> {
        var out: Set<AccountID> = []
        try visitLiveSubtree(id) { m in
            for e in m.access where !e.isDeleted && e.account != m.owner && !(m.id == id && e.account == revoked) {
                out.insert(e.account)
            }
        }
        return out
    }

    /// Calls `body` with `id`'s record and each live record below it, parents before children.
    private func visitLiveSubtree(_ id: FileID, _ body: (FileMetadata) throws -> Void) throws {
        try state.withLock { s in
            var queue = [id]
            var next = 0
            while next < queue.count {
                let current = queue[next]
                next += 1
                guard let m = s.view.tree.file(current), !m.isDeleted else { continue }
                try body(m)
                if m.type == .folder { queue += s.view.tree.liveChildren(of: current).map(\.id) }
            }
            if let failure = s.view.tree.takeFailure() { throw VaultError.io(failure) }
        }
    }

    /// Gives `root` and every file below it in `tree` new keys, and returns their ids: inside a
    /// commit that has just revoked a grant on `root`, or in a merge that found a file another
    /// device made below a rotated folder with the folder's old key (`PullMerge.settleKeys`).
    ///
    /// Each live file gets a fresh key and a new `keyGeneration`: its attributes, share name and
    /// content are sealed again under it, its remaining grants sealed again for their grantees
    /// and signed, and its key wrapped under its parent's new key, under which its name is
    /// sealed again. `root`'s key is `rootKey` and its parent's key, which stays, `parentKey`.
    /// Grants are sealed with `boxKeys`; without them (a merge, which has none) the file is
    /// noted in `staleGrants` for the sync to seal before it pushes.
    ///
    /// Content is re-encrypted now rather than at each document's next write (KBFS and Peergos
    /// wait): it costs one pass over the share's content on the owner's device and one upload,
    /// and in exchange no device has to know that a key is spent, no write path has to swap keys
    /// under an open file, and what a removed account can read is exactly what existed when it
    /// was removed. A deleted file below keeps its key, wrapped again under its parent's new one
    /// (its name too), and nothing below it changes.
    func rotateKeys<T: StagingTree>(
        from root: FileID, key rootKey: SymmetricKey, parentKey: SymmetricKey, in tree: inout T,
        boxKeys: [AccountID: PublicBoxKey]?, staleGrants: inout Set<FileID>,
        opener: RotationOpener = RotationOpener(), _ w: StoreWriter
    ) throws -> [FileID] {
        guard let first = tree.file(root) else { throw VaultError.tree(.notFound(root.description)) }
        // (record, its old key, the old and new keys of its parent if the parent's changed)
        var queue: [(FileMetadata, SymmetricKey, (old: SymmetricKey, new: SymmetricKey)?)] = [(first, rootKey, nil)]
        var changed: [FileID] = []
        var seen: Set<FileID> = []  // a tree is acyclic here; a merge's may not be yet
        var next = 0
        while next < queue.count {
            var (m, oldKey, parentKeys) = queue[next]
            next += 1
            guard seen.insert(m.id).inserted else { continue }
            var newKey = oldKey
            if let parentKeys {
                let name = try opener.name(m, parentKeys.old)
                m.name = SealedName(sealing: String(decoding: name, as: UTF8.self), parentKey: parentKeys.new, of: m.id)
            }
            if !m.isDeleted {
                newKey = SymmetricKey.random()
                if try !reseal(&m, from: oldKey, to: newKey, boxKeys: boxKeys, w) { staleGrants.insert(m.id) }
                if m.type == .folder {
                    for c in tree.childIDs(of: m.id).sorted().compactMap({ tree.file($0) }) {
                        queue.append((c, try opener.key(c, oldKey), (oldKey, newKey)))
                    }
                }
            }
            m.wrappedKey = KeyWrap.wrap(newKey, with: parentKeys?.new ?? parentKey, fileID: m.id.bytes)
            m.lastModifiedBy = accountID
            tree.upsert(m)
            changed.append(m.id)
        }
        return changed
    }

    /// Seals what `m` carries under its key (`old`) under `new` instead, content included, and
    /// counts the generation up. Returns false if grants were left for want of `boxKeys`.
    private func reseal(
        _ m: inout FileMetadata, from old: SymmetricKey, to new: SymmetricKey, boxKeys: [AccountID: PublicBoxKey]?,
        _ w: StoreWriter
    ) throws -> Bool {
        var sealedAll = true
        let (generation, overflow) = m.keyGeneration.addingReportingOverflow(1)
        guard !overflow else { throw VaultError.corrupt("\(m.id) has had its key replaced too often") }
        m.keyGeneration = generation
        let attributes = try AEAD.open(
            m.sealedAttributes, key: old, purpose: .attributes, fileID: m.id.bytes, what: "file attributes")
        m.sealedAttributes = AEAD.seal(attributes, key: new, purpose: .attributes, fileID: m.id.bytes)
        if let sealed = m.shareName {
            let name = try AEAD.open(sealed, key: old, purpose: .shareName, fileID: m.id.bytes, what: "shared name")
            m.shareName = AEAD.seal(name, key: new, purpose: .shareName, fileID: m.id.bytes)
        }
        if let boxKeys {
            try sealGrants(of: &m, key: new, boxKeys: boxKeys)
        } else {
            sealedAll = !m.access.contains { !$0.isDeleted && $0.account != m.owner }
        }
        if m.type == .document, let digest = m.contentDigest {
            m.contentDigest = try w.resealContent(
                digest, from: ContentCipher(fileID: m.id, key: old), to: ContentCipher(fileID: m.id, key: new)
            ).digest
        }
        return sealedAll
    }
}

/// How a rotation opens what a file below the rotated one carries under its parent's old key:
/// its key and its name. Within one commit both are simply under it; a merge that rotates a file
/// another device wrote below finds some under keys of either side (`PullMerge.settleKeys`).
struct RotationOpener {
    var key: (FileMetadata, SymmetricKey) throws -> SymmetricKey = { c, parentKey in
        try KeyWrap.unwrap(c.wrappedKey, with: parentKey, fileID: c.id.bytes)
    }
    var name: (FileMetadata, SymmetricKey) throws -> [UInt8] = { c, parentKey in
        try AEAD.open(c.name.ciphertext, key: parentKey, purpose: .name, fileID: c.id.bytes, what: "file name")
    }
}

extension StoreWriter {
    /// One version's content sealed again under another cipher (another key, or another file's),
    /// chunk by chunk, in this transaction. Returns the new manifest's digest and the size.
    func resealContent(
        _ digest: [UInt8]?, from: ContentCipher, to: ContentCipher
    ) throws -> (
        digest: [UInt8], size: UInt64
    ) {
        let (d, m) = try reseal(try manifest(digest, from), from: from, to: to)
        return (d, m.size)
    }

    /// `manifest`'s chunks opened with `from` and sealed with `to`, stored with the manifest
    /// naming them; returns its digest and the manifest. A chunk's plaintext comes from
    /// `buffered` if it has it (what a caller holds that the store does not yet), else from the
    /// store.
    func reseal(
        _ manifest: Manifest, from: ContentCipher, to: ContentCipher,
        buffered: (ChunkRef) throws -> [UInt8]? = { _ in nil }
    ) throws -> ([UInt8], Manifest) {
        var refs: [ChunkRef] = []
        for ref in manifest.chunks {
            let plain: [UInt8]
            if let p = try buffered(ref) {
                plain = p
            } else if let sealed = try reader.chunk(ref.id) {
                plain = try from.openChunk(sealed, ref: ref)
            } else {
                throw ContentError.missingChunk(hexString(Array(ref.id.prefix(8))))
            }
            let (newRef, newSealed) = to.sealChunk(plain)
            try putChunk(id: newRef.id, sealed: newSealed)
            refs.append(newRef)
        }
        let resealed = Manifest(chunkSize: manifest.chunkSize, chunks: refs)
        let sealed = to.sealManifest(resealed)
        let digest = ContentCipher.digest(ofSealedManifest: sealed)
        try putManifest(digest: digest, sealed: sealed, chunkIDs: refs.map(\.id))
        return (digest, resealed)
    }

    /// The manifest a document's record names (empty for none), opened with its cipher.
    func manifest(_ digest: [UInt8]?, _ cipher: ContentCipher) throws -> Manifest {
        guard let digest else { return Manifest() }
        guard let sealed = try reader.manifest(digest) else {
            throw VaultError.corrupt("manifest missing for \(cipher.fileID)")
        }
        return try cipher.openManifest(sealed)
    }
}

/// Grants a merge could not seal under a file's new key: one of the owner's devices rotated the
/// file's key while another granted it to someone with the old key. The merge has no box keys
/// (they come from the server), so it notes the file, and the sync seals every live grant on it
/// again before it pushes (`SyncEngine.resealStaleGrants`).
extension Vault {
    static let staleGrantsSetting = "staleGrants"

    func noteStaleGrants(_ ids: Set<FileID>, _ w: StoreWriter) throws {
        guard !ids.isEmpty else { return }
        let held = Set(try Self.fileIDs(w.reader.setting(Self.staleGrantsSetting)))
        try w.setSetting(Self.staleGrantsSetting, held.union(ids).sorted().flatMap(\.bytes))
    }

    /// The file ids of a note this vault keeps in the store's settings (ids end to end).
    static func fileIDs(_ bytes: [UInt8]?, note: String = "the note of grants to seal again") throws -> [FileID] {
        guard let bytes else { return [] }
        // Written here only; anything else is a damaged store, not a note to drop quietly.
        guard bytes.count % 16 == 0 else { throw VaultError.corrupt("\(note) is damaged") }
        return try stride(from: 0, to: bytes.count, by: 16).map { try FileID(bytes: Array(bytes[$0..<$0 + 16])) }
    }

    /// The grantees whose grants wait to be sealed again (`resealStaleGrants`); empty as a rule.
    public func staleGrantees() throws -> Set<AccountID> {
        let ids = try Self.fileIDs(store.readOne { try $0.setting(Self.staleGrantsSetting) })
        guard !ids.isEmpty else { return [] }
        return try state.withLock { s in
            var out: Set<AccountID> = []
            for id in ids {
                guard let m = s.view.tree.file(id) else { continue }
                for e in m.access where !e.isDeleted && e.account != m.owner { out.insert(e.account) }
            }
            if let failure = s.view.tree.takeFailure() { throw VaultError.io(failure) }
            return out
        }
    }

    /// Seals every live grant on the noted files again under the file's current key, for its
    /// grantee (`boxKeys`), signed by this account; then forgets the note.
    public func resealStaleGrants(boxKeys: [AccountID: PublicBoxKey]) throws {
        try commit { batch, s, w in
            for id in try Self.fileIDs(w.reader.setting(Self.staleGrantsSetting)) {
                guard var m = batch.file(id), m.owner == accountID else { continue }
                try sealGrants(of: &m, key: try s.view.key(id), boxKeys: boxKeys)
                m.lastModifiedBy = accountID
                batch.upsertUnchecked(m)
            }
            try w.removeSetting(Self.staleGrantsSetting)
        }
    }
}
