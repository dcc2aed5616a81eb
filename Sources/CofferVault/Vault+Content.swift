import CofferContent
import CofferCrypto
import CofferModel
import CofferStore
import Foundation

extension Vault {
    /// Opens a document for reading and writing. Every `openDocument` must be matched by one
    /// `release`; the last release flushes.
    public func openDocument(_ id: FileID) throws -> OpenDocument {
        do {
            if let doc = openDocuments.withLock({ docs -> OpenDocument? in
                guard let d = docs[id] else { return nil }
                d.openCount.add(1, ordering: .relaxed)
                return d
            }) {
                return doc
            }
            // With `catchingUp`, after taking in what other processes committed (kept for
            // `refresh`, so the kernel still hears of it).
            func record(catchingUp: Bool) throws -> (ContentCipher, [UInt8]?)? {
                try state.withLock { s -> (ContentCipher, [UInt8]?)? in
                    if catchingUp { s.externalChanges.formUnion(try catchUp(&s)) }
                    guard let m = s.view.tree.file(id) else { return nil }
                    if m.type == .link { return nil }
                    if m.type == .folder { throw TreeError.isAFolder(s.view.path(id)) }
                    guard m.type == .document else { throw TreeError.notADocument(s.view.path(id)) }
                    return (ContentCipher(fileID: id, key: try s.view.key(id)), m.contentDigest)
                }
            }
            // Another process committed since this vault last caught up (the daemon between its
            // ticks, after a CLI write): its version of the file, not the one held here, is what
            // a write through this handle must build on. Only the committed log is asked (one
            // prepared statement); this process's own writes have moved `lastSeq` already.
            let behind = try store.committedLastChange() > state.withLock { $0.lastSeq }
            // Not of this account's tree: a document of a share it reaches, read-only.
            guard var (cipher, digest) = try record(catchingUp: behind) else {
                return try openSharedDocument(linkTarget(of: id) ?? id)
            }
            let manifest: Manifest
            if let found = try storedManifest(digest, cipher: cipher) {
                manifest = found
            } else {
                // Another process replaced the content (dropping the old manifest) since this
                // vault last caught up: the daemon between its polls, after a CLI write.
                guard let again = try record(catchingUp: true) else { throw TreeError.notFound(id.description) }
                (cipher, digest) = again
                manifest = try loadManifest(digest, cipher: cipher)
            }
            noteContentRead(id)
            let fresh = OpenDocument(id: id, vault: self, cipher: cipher, manifest: manifest, digest: digest)
            return openDocuments.withLock { docs in
                let doc = docs[id] ?? fresh  // another thread may have opened it meanwhile
                docs[id] = doc
                doc.openCount.add(1, ordering: .relaxed)
                return doc
            }
        } catch { throw VaultError.wrap(error) }
    }

    /// The manifest `digest` of a document, from the store, or (a store on demand) fetched
    /// from the server and stored.
    func loadManifest(_ digest: [UInt8]?, cipher: ContentCipher) throws -> Manifest {
        if let manifest = try storedManifest(digest, cipher: cipher) { return manifest }
        if let digest, let fetched = try fetchManifest(cipher.fileID, digest: digest, cipher: cipher) {
            return fetched
        }
        throw VaultError.corrupt("the content manifest of \(cipher.fileID) is missing")
    }

    /// `loadManifest`, nil if the store holds no manifest with that digest.
    func storedManifest(_ digest: [UInt8]?, cipher: ContentCipher) throws -> Manifest? {
        guard let digest else { return Manifest() }
        guard let sealed = try store.manifest(digest) else { return nil }
        guard ContentCipher.digest(ofSealedManifest: sealed) == digest else {
            throw VaultError.corrupt("the content manifest of \(cipher.fileID) does not match its digest")
        }
        return try cipher.openManifest(sealed)
    }

    /// The open document of `id`, if anyone has it open or its last release is still
    /// committing it: where unflushed writes, and the times and ownership riding with them, are.
    public func registeredDocument(_ id: FileID) -> OpenDocument? {
        openDocuments.withLock { $0[id] }
    }

    /// Drops one reference; the last one flushes unflushed writes and forgets the document.
    ///
    /// The document stays registered until its flush has committed, so whoever opens the file
    /// or asks its size meanwhile gets this document (what was written), never the store's
    /// older version. Someone who opens it during the flush keeps it registered.
    public func release(_ doc: OpenDocument) throws {
        let last = openDocuments.withLock { docs -> Bool in
            doc.openCount.subtract(1, ordering: .relaxed).newValue <= 0 && docs[doc.id] === doc
        }
        guard last else { return }
        defer {
            openDocuments.withLock { docs in
                if doc.openCount.load(ordering: .relaxed) <= 0, docs[doc.id] === doc { docs[doc.id] = nil }
            }
        }
        try doc.flush()
    }

    /// Called by a document's flush: stores the sealed manifest and commits the metadata naming
    /// it, with new size and mtime, in one transaction. A document that was deleted meanwhile
    /// (unlinked while open) is not resurrected: its content is simply dropped. Returns the new
    /// digest, or nil if nothing was committed, and, if the file's key was rotated since the
    /// document was opened, the new key and the content as sealed under it.
    /// `chunks` (id → sealed) are stored in the same transaction, before the manifest; `unsealed`
    /// (id → plaintext, small chunks only) too, sealed when the store runs the statement
    /// (`StoreWriter.putChunk(id:sealing:)`).
    func commitContent(
        id: FileID, cipher: ContentCipher, manifest: Manifest, mtime: Timespec, ctime: Timespec,
        chunks: [[UInt8]: [UInt8]] = [:], unsealed: [[UInt8]: [UInt8]] = [:],
        ownership: (mode: UInt32?, uid: UInt32?, gid: UInt32?) = (nil, nil, nil), atime: Timespec? = nil
    ) throws -> (digest: [UInt8], resealed: (ContentCipher, Manifest)?)? {
        guard isLive(id) else { return nil }
        let sealed = cipher.sealManifest(manifest)
        var digest = ContentCipher.digest(ofSealedManifest: sealed)
        var resealed: (ContentCipher, Manifest)?
        var committed = false
        do {
            try commit { batch, s, w in
                // Deleted meanwhile (another process's deletion, caught up inside this write).
                guard s.view.tree.isLive(id) else { return }
                committed = true
                (digest, resealed) = try w.storeFlush(
                    manifest, sealed: sealed, digest: digest, cipher: cipher, current: try s.view.key(id),
                    chunks: chunks,
                    unsealed: unsealed)
                var a = try attributes(id, &s)
                Self.applyFlush(
                    to: &a, size: manifest.size, mtime: mtime, ctime: ctime, ownership: ownership, atime: atime,
                    at: nextStamp(&s))
                let sealedAttrs = try s.view.sealAttributes(a, of: id)
                try batch.update(id, describe: s.view.describe) {
                    $0.contentDigest = digest
                    $0.sealedAttributes = sealedAttrs
                }
                s.view.cache.attributes[id] = a
            }
        } catch let e as VaultError {
            if case .tree(.notFound) = e { return nil }
            if case .tree(.deleted) = e { return nil }
            throw e
        }
        // Nothing committed: the caller stores the chunks its buffers name itself.
        guard committed else { return nil }
        return (digest, resealed)
    }

    /// Tells open documents about content other processes committed (the daemon's refresh).
    public func adoptExternalContent(_ ids: Set<FileID>) {
        for id in ids {
            guard let doc = openDocuments.withLock({ $0[id] }) else { continue }
            let seen = doc.committedDigest
            // Under the file's current key, which a rotation elsewhere may have replaced; a
            // shared document's from the mirror (an owner's change the feed brought).
            let current =
                doc.isShared
                ? try? withSharedView { view, _ -> ([UInt8], ContentCipher)? in
                    guard let digest = view.tree.file(id)?.contentDigest else { return nil }
                    return (digest, ContentCipher(fileID: id, key: try view.key(id)))
                }
                : try? state.withLock({ s -> ([UInt8], ContentCipher)? in
                    guard let digest = s.view.tree.file(id)?.contentDigest else { return nil }
                    return (digest, ContentCipher(fileID: id, key: try s.view.key(id)))
                })
            guard let (digest, cipher) = current ?? nil else { continue }
            // Held content only: this runs on the watcher's and the sync's threads, which must
            // not wait on the network (a store on demand fetches the rest when it is read).
            if let manifest = try? storedManifest(digest, cipher: cipher) {
                doc.adopt(manifest: manifest, digest: digest, cipher: cipher, seen: seen)
            }
        }
    }

    /// Refresh plus adopting external content; what the daemon polls.
    public func refreshAll() throws -> Set<FileID> {
        let ids = try refresh()
        if !ids.isEmpty { adoptExternalContent(ids) }
        return ids
    }

    // MARK: Whole-document helpers for the CLI

    /// Streams a document's plaintext to `sink` in chunk-sized pieces.
    public func readContents(_ id: FileID, into sink: ([UInt8]) throws -> Void) throws {
        let doc = try openDocument(id)
        defer { try? release(doc) }
        var offset: UInt64 = 0
        let size = doc.currentSize
        while offset < size {
            let piece = try doc.read(offset: offset, count: Int(Manifest.defaultChunkSize))
            if piece.isEmpty { break }
            try sink(piece)
            offset += UInt64(piece.count)
        }
    }

    public func readAll(_ id: FileID) throws -> [UInt8] {
        var out: [UInt8] = []
        try readContents(id) { out += $0 }
        return out
    }

    /// Replaces a document's content with what `source` yields (nil ends it), committing once at
    /// the end: a crash at any point leaves the old content or the new, never a mix.
    public func writeContents(
        _ id: FileID, mtime: Timespec? = nil, durable: Bool = true, from source: () throws -> [UInt8]?
    ) throws {
        let doc = try openDocument(id)
        var released = false
        defer { if !released { try? release(doc) } }
        try doc.truncate(to: 0)
        var offset: UInt64 = 0
        while let piece = try source() {
            if piece.isEmpty { continue }
            try doc.write(offset: offset, bytes: piece)
            offset += UInt64(piece.count)
        }
        // The mtime rides with the content commit, unless it is one the open document cannot
        // hold (the epoch itself, or outside 1677-2262: an imported file's time can be any): then
        // it is set by a commit of its own after the content's.
        let carried = mtime.map { doc.setPendingTimes(modification: $0, access: nil) } ?? true
        try doc.flush(durable: durable)
        released = true
        try release(doc)
        if !carried, let mtime { try setAttributes(id, AttributeChanges(mtime: mtime)) }
    }

    public func writeAll(_ id: FileID, _ bytes: [UInt8], mtime: Timespec? = nil) throws {
        var sent = false
        try writeContents(id, mtime: mtime) {
            if sent { return nil }
            sent = true
            return bytes
        }
    }

    /// The long writers whose interruption can leave chunks in packs no row names (a spill, or
    /// a group that never committed): each marks itself running while it works.
    public enum LongWriter: String, Sendable, CaseIterable {
        case daemon, `import`
    }

    /// Whether the mount daemon should collect garbage as it starts. A collection reads every
    /// row (seconds at a million files), so a mount collects only when it pays: after a long
    /// writer that did not finish cleanly (`LongWriter`), or once the versions records stopped
    /// naming since the last collection reach 2% of the tree (at least 1,024). `coffer gc`
    /// collects whenever asked.
    public func garbageWorthCollectingAtMount() throws -> Bool {
        let unclean = try LongWriter.allCases.contains { w in
            try store.readOne { try $0.setting("running." + w.rawValue) } == [1]
        }
        let garbage = try store.garbageSinceCollection()
        return unclean || garbage >= max(1024, fileCount / 50)
    }

    /// Marks a long writer running (`true`, as it starts) or finished cleanly (`false`): a mark
    /// left set tells the next mount to collect garbage.
    public func mark(_ writer: LongWriter, running: Bool) throws {
        try store.write { w in try w.setSetting("running." + writer.rawValue, [running ? 1 : 0]) }
        try store.makeDurable()
    }

    /// Runs garbage collection if no other process has the store open; returns nil if it is busy.
    public func collectGarbage() throws -> (manifests: Int, chunks: Int, compactedPacks: Int)? {
        // Open documents may hold chunks no manifest names yet (spilled writes, unlinked files).
        guard openDocuments.withLock({ $0.isEmpty }) else { return nil }
        return try locks.exclusively { try store.collectGarbage() }
    }
}

extension Vault {
    /// What a document's flush changes in its attributes: size and mtime, the ownership and
    /// atime set while it was open, stamped `stamp`; ctime is when the content changed (not
    /// the commit's time nor mtime, which may be set anywhere), never before one recorded.
    static func applyFlush(
        to a: inout PosixAttributes, size: UInt64, mtime: Timespec, ctime: Timespec,
        ownership: (mode: UInt32?, uid: UInt32?, gid: UInt32?), atime: Timespec?, at stamp: HybridTimestamp
    ) {
        a.size = size
        a.mtime = Stamped(mtime, at: stamp)
        if let mode = ownership.mode { a.mode = Stamped(mode & 0o7777, at: stamp) }
        if let uid = ownership.uid { a.uid = Stamped(uid, at: stamp) }
        if let gid = ownership.gid { a.gid = Stamped(gid, at: stamp) }
        if let atime { a.atime = Stamped(atime, at: stamp) }
        a.ctime = max(a.ctime, ctime)
    }
}

extension StoreWriter {
    /// Stores what a document's flush hands over, in this transaction: its chunks as it sealed
    /// them (it reads them back by these ids; small ones still plain, sealed as the statement
    /// runs), then the manifest. If the file's key is no longer the one it was opened with
    /// (`current`: another process rotated it, a revocation, docs/SHARING.md), what was written
    /// goes under the new key too and the document takes it: returned with the new digest. The
    /// chunks under the old key stay local (no manifest names them; GC takes them).
    func storeFlush(
        _ manifest: Manifest, sealed: [UInt8], digest: [UInt8], cipher: ContentCipher, current: SymmetricKey,
        chunks: [[UInt8]: [UInt8]], unsealed: [[UInt8]: [UInt8]]
    ) throws -> (digest: [UInt8], resealed: (ContentCipher, Manifest)?) {
        try putChunks(chunks.map { ($0.key, $0.value) })
        for (chunkID, plain) in unsealed {
            try putChunk(id: chunkID, sealing: { cipher.sealChunk(plain, id: chunkID).1 })
        }
        if current == cipher.key {
            try putManifest(digest: digest, sealed: sealed, chunkIDs: manifest.chunks.map(\.id))
            return (digest, nil)
        }
        let rotated = ContentCipher(fileID: cipher.fileID, key: current)
        // Its new chunks, sealed or still plain, are read from the buffers it handed over.
        let (d, m) = try reseal(manifest, from: cipher, to: rotated) { ref in
            if let plain = unsealed[ref.id] { return plain }
            return try chunks[ref.id].map { try cipher.openChunk($0, ref: ref) }
        }
        return (d, (rotated, m))
    }
}
