import CofferContent
import CofferCrypto
import CofferModel
import CofferStore

/// Merging across a key rotation (docs/SHARING.md, "Revocation"). A rotation gives a shared
/// file and every live file below it new keys: names sealed again under their parents' new
/// keys, attributes, share names and content under the files' own. Another of the owner's
/// devices may meanwhile have written below with the old keys, or rotated too. Records carry
/// their `keyGeneration`, so the merge knows which side replaced a key without opening
/// anything: a side that replaced it wins it (this device's if both did, as the other side's
/// new key went to grantees this device may have revoked), then everything sealed under a key
/// that lost is opened with it and sealed again under the one that won.
extension PullMerge {
    /// Takes the key of the side that replaced it (this device's if both did), with everything
    /// sealed under it; the other side's attributes are merged in by `settleKeys`.
    mutating func takeKey(_ m: inout FileMetadata, base b: FileMetadata, local l: FileMetadata, remote r: FileMetadata)
    {
        let localRekeyed = l.keyGeneration != b.keyGeneration
        let winner = localRekeyed ? l : r
        m.wrappedKey = winner.wrappedKey
        m.sealedAttributes = winner.sealedAttributes
        m.shareName = winner.shareName
        m.keyGeneration = winner.keyGeneration
        if localRekeyed && r.keyGeneration != b.keyGeneration {
            // Past both, so the devices that took the remote's key see it change again.
            let (next, overflow) = max(l.keyGeneration, r.keyGeneration).addingReportingOverflow(1)
            m.keyGeneration = overflow ? .max : next
        }
        // Grants the winner holds are sealed under its key; one the other side made meanwhile
        // holds the replaced key, and is sealed again before the next push (`staleGrants`).
        // A mode the other side changed meanwhile stays the merge's, and is sealed again too.
        // A generation past both sides' is one no grant was sealed at: all are sealed again,
        // so each grant names the generation of the record it is in (`AccessEntry.generation`).
        if m.keyGeneration != winner.keyGeneration { staleGrants.insert(m.id) }
        for i in m.access.indices where !m.access[i].isDeleted {
            if let e = winner.access.first(where: { $0.account == m.access[i].account && !$0.isDeleted }),
                e.mode == m.access[i].mode
            {
                m.access[i] = e
            } else {
                staleGrants.insert(m.id)
            }
        }
        deferred[m.id] = (l, r)
        freshKeys.insert(m.id)
    }

    /// Every key `id` had in a tree this merge sees (the old base, this device's unpushed
    /// records, the pulled ones, the merge's), each unwrapped under every such key of its
    /// parent. What was sealed under a key that lost a rotation opens with one of these.
    mutating func knownKeys(_ id: FileID) throws -> [SymmetricKey] {
        var memo = knownKeyMemo
        defer { knownKeyMemo = memo }
        return try view.access.keysEver(id, memo: &memo, versions: versions)
    }

    /// The records of `id` this merge sees: old base, unpushed local, pulled, merged.
    func versions(_ id: FileID) throws -> [FileMetadata] {
        var out: [FileMetadata] = []
        let base: FileMetadata? = try w.reader.file(id, .base)?.metadata
        let local: FileMetadata? = try w.reader.file(id, .local)?.metadata
        let candidates: [FileMetadata?] = [base, local, newBase[id]?.metadata, view.tree.file(id)]
        for m in candidates {
            if let m, !out.contains(m) { out.append(m) }
        }
        return out
    }

    /// Seals again, under its parent's key in the merged tree, every name and wrapped key that
    /// one side sealed under a key the other side's rotation replaced; then merges the attributes
    /// of files whose key one side replaced, and seals their names for grantees again. Parents
    /// first, so each parent's key is final when its children are sealed under it. Runs only
    /// when some key changed (`keysChanged`).
    mutating func settleKeys() throws {
        guard keysChanged else { return }
        knownKeyMemo = [:]  // records changed since the last pass
        var ids = touched
        for l in try w.reader.files(.local) { ids.insert(l.metadata.id) }
        for (id, entry) in local where entry != nil { ids.insert(id) }
        // The children of every folder whose key changed, this pull's records or not: one this
        // device holds only in its base may have been pushed under the folder's old key while
        // another device rotated it.
        for id in Array(ids) {
            guard let m = view.tree.file(id), m.type == .folder,
                try versions(id).contains(where: {
                    $0.keyGeneration != m.keyGeneration
                })
            else { continue }
            ids.formUnion(view.tree.childIDs(of: id))
        }
        let byDepth: [(Int, FileID)] = ids.map { (depth($0), $0) }
        let ordered = byDepth.sorted { $0.0 < $1.0 || ($0.0 == $1.0 && $0.1 < $1.1) }
        for (_, id) in ordered {
            guard var m = view.tree.file(id), !m.isRoot, let parentKey = try? view.key(m.parent) else { continue }
            var others: [SymmetricKey] = []
            for v in try versions(id) {
                for k in try knownKeys(v.parent) where k != parentKey && !others.contains(k) { others.append(k) }
            }
            var changed = false
            if (try? AEAD.open(m.name.ciphertext, key: parentKey, purpose: .name, fileID: id.bytes, what: "")) == nil {
                for k in others {
                    guard
                        let raw = try? AEAD.open(m.name.ciphertext, key: k, purpose: .name, fileID: id.bytes, what: "")
                    else { continue }
                    m.name = SealedName(sealing: String(decoding: raw, as: UTF8.self), parentKey: parentKey, of: id)
                    changed = true
                    break
                }
            }
            var exposedKey: SymmetricKey?
            if (try? KeyWrap.unwrap(m.wrappedKey, with: parentKey, fileID: id.bytes)) == nil {
                for k in others {
                    guard let key = try? KeyWrap.unwrap(m.wrappedKey, with: k, fileID: id.bytes) else { continue }
                    m.wrappedKey = KeyWrap.wrap(key, with: parentKey, fileID: id.bytes)
                    exposedKey = key
                    changed = true
                    break
                }
            }
            if changed {
                local[id] = m
                view.put(m)
                touched.insert(id)
            }
            // Its key was wrapped under a key a rotation replaced, so whoever the rotation
            // removed may hold it: it gets a new one too, and so does everything below it.
            // What lies below may come from either side, so each file's key and name are found
            // first among every key the merge knows (`anyKey`, `anyName`).
            // A key a rotation in this merge gave it (`takeKey`) was only ever wrapped under the
            // new keys of its side: moved under another parent, it is wrapped again, no more.
            if let exposedKey, !m.isDeleted, !freshKeys.contains(id) {
                var keys: [FileID: SymmetricKey] = [id: exposedKey]
                var names: [FileID: [UInt8]] = [:]
                var queue = [id]
                while let next = queue.popLast() {
                    for c in view.tree.childIDs(of: next) where keys[c] == nil {
                        guard let cm = view.tree.file(c) else { continue }
                        keys[c] = try anyKey(cm)
                        names[c] = Array(try anyName(cm).utf8)
                        if cm.type == .folder && !cm.isDeleted { queue.append(c) }
                    }
                }
                let missing = VaultError.corrupt("\(id) changed under a key rotation")
                let opener = RotationOpener(
                    key: { c, _ in
                        guard let k = keys[c.id] else { throw missing }
                        return k
                    },
                    name: { c, _ in
                        guard let n = names[c.id] else { throw missing }
                        return n
                    })
                for r in try vault.rotateKeys(
                    from: id, key: exposedKey, parentKey: parentKey, in: &view.tree, boxKeys: nil,
                    staleGrants: &staleGrants, opener: opener, w)
                {
                    guard let rotated = view.tree.file(r) else { continue }
                    local[r] = rotated
                    view.cache.keys[r] = nil  // the tree took the new record behind the cache's back
                    view.cache.forget(r)
                    touched.insert(r)
                }
            }
        }
        for (id, (l, r)) in deferred.sorted(by: { $0.key < $1.key }) {
            guard var m = local[id] ?? nil else { continue }
            // Each side's attributes opened with the key they were sealed under, merged as for
            // any record (the size goes with the content, which may be either side's).
            let la = try? anyAttributes(l)
            let ra = try? anyAttributes(r)
            if let la, let ra {
                var merged = PosixAttributes.merge(la, ra)
                merged.size = m.contentDigest == r.contentDigest ? ra.size : la.size
                m.sealedAttributes = try view.sealAttributes(merged, of: id)
            } else if let one = la ?? ra {
                m.sealedAttributes = try view.sealAttributes(one, of: id)
            }
            if m.shareName != nil || l.shareName != nil || r.shareName != nil || m.isShared {
                m.shareName = try view.sealShareName(try view.openName(m), of: id)
            }
            // Content one side wrote under the key the other replaced (the other side changed
            // none, so no conflict resolves it) is sealed again under the winning key.
            if m.type == .document, let digest = m.contentDigest {
                m.contentDigest = try underCurrentKey(digest, from: try cipher(id, opening: digest)).0
            }
            local[id] = m
            view.put(m)
        }
        deferred = [:]
    }

    /// A record's name, opened with its parent's key in the merged tree or, when a rotation
    /// replaced that, with any key the parent had.
    mutating func anyName(_ m: FileMetadata) throws -> String {
        if let n = try? view.openName(m) { return n }
        for k in keysChanged ? try knownKeys(m.parent) : [] {
            if let raw = try? AEAD.open(m.name.ciphertext, key: k, purpose: .name, fileID: m.id.bytes, what: "") {
                return String(decoding: raw, as: UTF8.self)
            }
        }
        return try view.openName(m)
    }

    /// The key a record's attributes are sealed under: the file's in the merged tree, or any key
    /// it had (a record from the side whose key lost).
    mutating func anyKey(_ m: FileMetadata) throws -> SymmetricKey {
        func opens(_ k: SymmetricKey) -> Bool {
            (try? AEAD.open(m.sealedAttributes, key: k, purpose: .attributes, fileID: m.id.bytes, what: "")) != nil
        }
        if let k = try? view.key(m.id), opens(k) { return k }
        for k in keysChanged ? try knownKeys(m.id) : [] where opens(k) { return k }
        return try view.key(m.id)
    }

    /// A record's attributes, opened as `anyKey` finds (a stamp seen counts for the clock).
    mutating func anyAttributes(_ m: FileMetadata) throws -> PosixAttributes {
        let a = try PosixAttributes(
            decoding: AEAD.open(
                m.sealedAttributes, key: try anyKey(m), purpose: .attributes, fileID: m.id.bytes,
                what: "file attributes"))
        view.cache.latestStamp = max(
            view.cache.latestStamp, a.mtime.stamp, a.atime.stamp, a.mode.stamp, a.uid.stamp, a.gid.stamp)
        return a
    }

    /// The wrapped key `m` needs placed back under `parent` (an undone move or a deletion put at
    /// its base place): `base`'s own when the file kept that key, else its current key wrapped
    /// under the parent's (a rotation gave it a new one since).
    mutating func wrappedKey(of m: FileMetadata, under parent: FileID, base: FileMetadata) throws -> [UInt8] {
        guard m.keyGeneration != base.keyGeneration else { return base.wrappedKey }
        return try view.wrap(try anyKey(m), of: m.id, in: parent)
    }

    /// Whether two records of one file have the same parent and name; a rotation of the parent
    /// changes the name's MAC, not the name.
    mutating func samePlace(_ a: FileMetadata, _ b: FileMetadata) -> Bool {
        guard a.parent == b.parent else { return false }
        if a.name.mac == b.name.mac { return true }
        guard keysChanged, let x = try? anyName(a), let y = try? anyName(b) else { return false }
        return x == y
    }

    /// How far `id` is below the root in the merged tree (bounded: it may still hold a cycle).
    func depth(_ id: FileID) -> Int {
        var d = 0
        var cursor = id
        while let m = view.tree.file(cursor), !m.isRoot, d <= TreeLimits.maxDepth + 1 {
            d += 1
            cursor = m.parent
        }
        return d
    }

    /// The cipher a version of `id`'s content (`digest`) is sealed under: the file's key in the
    /// merged tree, or, when a rotation replaced it, whichever earlier key opens its manifest.
    mutating func cipher(_ id: FileID, opening digest: [UInt8]?) throws -> ContentCipher {
        let current = try cipher(id)
        guard keysChanged, let digest, let sealed = try w.reader.manifest(digest),
            (try? current.openManifest(sealed)) == nil
        else { return current }
        for k in try knownKeys(id) where k != current.key {
            let c = ContentCipher(fileID: id, key: k)
            if (try? c.openManifest(sealed)) != nil { return c }
        }
        return current
    }

    /// Whether two versions hold the same bytes, chunk by chunk (a rotation seals a document's
    /// chunks again as they were, so they line up).
    func samePlaintext(_ a: [UInt8]?, _ ca: ContentCipher, _ b: [UInt8]?, _ cb: ContentCipher) throws -> Bool {
        let ma = try manifest(a, ca)
        let mb = try manifest(b, cb)
        guard ma.size == mb.size, ma.chunkSize == mb.chunkSize, ma.chunks.count == mb.chunks.count else { return false }
        for (x, y) in zip(ma.chunks, mb.chunks) {
            guard x.length == y.length else { return false }
            if x.id == y.id && ca.key == cb.key { continue }
            guard let sx = try w.reader.chunk(x.id), let sy = try w.reader.chunk(y.id) else { return false }
            guard try ca.openChunk(sx, ref: x) == cb.openChunk(sy, ref: y) else { return false }
        }
        return true
    }

    /// `digest`'s content under the merged key of its file: as it is if `from` is that key,
    /// else sealed again. Returns the digest and the size.
    mutating func underCurrentKey(_ digest: [UInt8]?, from: ContentCipher) throws -> ([UInt8]?, UInt64) {
        let current = try cipher(from.fileID)
        if current.key == from.key || digest == nil { return (digest, try manifest(digest, from).size) }
        let (d, size) = try w.resealContent(digest, from: from, to: current)
        return (d, size)
    }

    /// Whether adopting `m` turned a grantee's give-up in `original` into an owner's revocation.
    static func adoptsGiveUp(_ m: FileMetadata, from original: FileMetadata) -> Bool {
        zip(m.access, original.access).contains { $0.isDeleted && $0.signature != $1.signature }
    }

    /// A grantee that gave a share up (`share reject`) held its keys as a removed member does, so
    /// the owner's device that adopts the give-up rotates them as a revocation would: the file
    /// and everything below it get new keys, and the remaining grants are sealed again before
    /// the next push (`staleGrants`). The other devices of the owner take the adopted record,
    /// signed by the owner, and do not rotate again.
    mutating func rotateGivenUp() throws {
        for id in gaveUp.sorted() where view.tree.isLive(id) {
            guard let m = view.tree.file(id), !m.isRoot else { continue }
            let rotated = try vault.rotateKeys(
                from: id, key: anyKey(m), parentKey: view.key(m.parent), in: &view.tree, boxKeys: nil,
                staleGrants: &staleGrants, w)
            for r in rotated {
                guard let record = view.tree.file(r) else { continue }
                local[r] = record
                view.cache.keys[r] = nil  // the tree took the new record behind the cache's back
                view.cache.forget(r)
                touched.insert(r)
            }
            keysChanged = true
        }
        gaveUp = []
    }
}
