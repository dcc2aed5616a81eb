import CofferContent
import CofferCrypto
import CofferModel
import CofferStore
import Foundation

/// A record pulled from the server.
public struct RemoteFile: Sendable {
    public let signed: SignedMetadata
    public let version: Int64
    public let contentVersion: Int64
    public let serverDeleted: Bool

    public init(signed: SignedMetadata, version: Int64, contentVersion: Int64, serverDeleted: Bool) {
        self.signed = signed
        self.version = version
        self.contentVersion = contentVersion
        self.serverDeleted = serverDeleted
    }

    var stored: StoredFile {
        StoredFile(signed: signed, version: version, contentVersion: contentVersion, serverDeleted: serverDeleted)
    }
}

/// A document version to fetch before the pull that names it can be applied.
/// A document's content as fetched, before it is verified and stored.
public struct FetchedContent: Sendable {
    public let need: ContentNeed
    public let manifest: Manifest
    public let sealedManifest: [UInt8]
    public let chunks: [[UInt8]: [UInt8]]
    public init(need: ContentNeed, manifest: Manifest, sealedManifest: [UInt8], chunks: [[UInt8]: [UInt8]]) {
        self.need = need
        self.manifest = manifest
        self.sealedManifest = sealedManifest
        self.chunks = chunks
    }
}

public struct ContentNeed: Sendable {
    public let fileID: FileID
    public let digest: [UInt8]
    let cipher: ContentCipher

    init(fileID: FileID, digest: [UInt8], key: SymmetricKey) {
        self.fileID = fileID
        self.digest = digest
        self.cipher = ContentCipher(fileID: fileID, key: key)
    }
}

extension Vault {
    /// Drops the pulled records this device already holds as they are (its own push, read back
    /// by the pull after it: the same signed bytes at the version the upsert answered): they
    /// carry nothing to verify or merge. Everything else is kept.
    public func unseen(_ files: [RemoteFile]) throws -> [RemoteFile] {
        try store.read { r in
            try files.filter { f in
                guard let base = try r.file(f.signed.metadata.id, .base) else { return true }
                return
                    !(base.version == f.version && base.contentVersion == f.contentVersion
                    && base.serverDeleted == f.serverDeleted && base.signed == f.signed)
            }
        }
    }

    /// Refuses the whole pull if any record is not signed by this account or not owned by it,
    /// or goes against what this device has already seen (`checkHistory`): nothing from a server
    /// is applied without checking who wrote it and that it is not older than what is here.
    public func verifyRemote(_ files: [RemoteFile]) throws {
        try verifySignatures(files.map(\.signed))
        try checkHistory(files)
        try checkOtherWriters(files)
    }

    /// Refuses records not owned by this account or whose signature does not verify. Cheap
    /// enough to run on every page as it arrives, so a server cannot make a device hold
    /// unverified records while it keeps paging. Records another account wrote (a grantee
    /// writing in a shared folder) are judged by the sharing rules once the pull is whole
    /// (`checkOtherWriters`).
    public func verifySignatures(_ records: [SignedMetadata]) throws {
        for s in records {
            let m = s.metadata
            guard m.owner == accountID else {
                throw VaultError.corrupt("the server sent file \(m.id) owned by another account; nothing was applied")
            }
            guard let pk = try? PublicSigningKey(bytes: m.lastModifiedBy.bytes),
                pk.verify(signature: s.signature, message: s.message)
            else {
                throw VaultError.corrupt("the server sent file \(m.id) with a bad signature; nothing was applied")
            }
        }
    }

    /// What a server cannot make a device accept, though every record it sends is validly signed:
    /// - a record older than the one this device holds as base (a rollback), or a different record
    ///   with the same revision (two histories), unless it deletes the file: a deletion, signed or
    ///   following from a signed deletion of a folder above, stays a deletion however old (a
    ///   deleted file never comes back, and a restored server may hold an old record of a file
    ///   whose folder's deletion a device sent it again);
    /// - a live record of a file whose deletion synced and was pruned here (a resurrection; the
    ///   tombstone remembers the id);
    /// - a deletion nobody signed: the server may mark a file deleted (`serverDeleted`) only when
    ///   the newest signed record this device knows of one of its folders is deleted, or the
    ///   folder is tombstoned. The walk follows the newest known records (by revision), so an old
    ///   record placing the file under a deleted folder it has since left proves nothing.
    func checkHistory(_ files: [RemoteFile]) throws {
        let remote = Dictionary(
            files.map { ($0.signed.metadata.id, $0.signed) },
            uniquingKeysWith: { a, b in a.revision >= b.revision ? a : b })
        try store.read { r in
            var base: [FileID: SignedMetadata?] = [:]
            func baseRecord(_ id: FileID) throws -> SignedMetadata? {
                if let known = base[id] { return known }
                let found = try r.file(id, .base)?.signed
                base[id] = found
                return found
            }
            /// The newest signed record this device knows of `id`, from this pull or its base.
            func newest(_ id: FileID) throws -> FileMetadata? {
                let b = try baseRecord(id)
                guard let p = remote[id] else { return b?.metadata }
                guard let b, b.revision > p.revision else { return p.metadata }
                return b.metadata
            }
            // Whether `id` is deleted by a signed record of its own or of a folder above it, as
            // the newest known records place it; memoised for the whole pull, and bounded (a
            // cycle or a chain deeper than the tree may be proves nothing).
            var deletedAbove: [FileID: Bool] = [:]
            func signedDeleted(_ start: FileID) throws -> Bool {
                var path: [FileID] = []
                var seen: Set<FileID> = []
                var cursor = start
                var verdict = false
                while true {
                    if let known = deletedAbove[cursor] {
                        verdict = known
                        break
                    }
                    guard seen.insert(cursor).inserted, path.count <= TreeLimits.maxDepth + 1 else { break }
                    path.append(cursor)
                    if try r.isTombstoned(cursor) {
                        verdict = true
                        break
                    }
                    guard let m = try newest(cursor) else { break }
                    if m.isDeleted {
                        verdict = true
                        break
                    }
                    if m.isRoot { break }
                    cursor = m.parent
                }
                for id in path { deletedAbove[id] = verdict }
                return verdict
            }

            for f in files {
                let m = f.signed.metadata
                // Deleted as this record says, justified by a signed deletion where the server says so.
                var deletes = m.isDeleted
                if !deletes, f.serverDeleted, let current = try newest(m.id) {
                    deletes = try current.isDeleted || (!current.isRoot && signedDeleted(current.parent))
                }
                if f.serverDeleted, !m.isDeleted, !deletes {
                    throw VaultError.corrupt(
                        "the server marked file \(m.id) deleted, but no deletion of it or of a folder above it is "
                            + "signed; nothing was applied"
                    )
                }
                if let seen = try baseRecord(m.id), !deletes {
                    if f.signed.revision < seen.revision {
                        throw VaultError.corrupt(
                            "the server sent an older record of file \(m.id) (revision \(f.signed.revision)) than "
                                + "this device has seen (revision \(seen.revision)): it was rolled back or is not "
                                + "honest; nothing was applied"
                        )
                    }
                    if f.signed.revision == seen.revision, f.signed != seen {
                        throw VaultError.corrupt(
                            "the server sent a record of file \(m.id) that differs from the one this device has with "
                                + "the same revision \(seen.revision); nothing was applied"
                        )
                    }
                }
                if !deletes, try r.isTombstoned(m.id) {
                    throw VaultError.corrupt(
                        "the server sent file \(m.id) back to life after its deletion synced here; nothing was applied")
                }
            }
        }
    }

    /// Whether a record's key unwraps down this account's own tree as `tree` holds it (the pull
    /// staged over the base): what `checkPulled` asks of a rotation a writer's change carries.
    func keyOpens(in tree: LookupTree) -> (FileMetadata) -> Bool {
        let access = AccountKeyAccess(account: accountID, box: box)
        return { m in
            var view = KeyedTree(tree: tree, access: access)
            return (try? view.key(m.id)) != nil
        }
    }

    /// Records of this account's tree written by another account must be what the sharing rules
    /// let that account write (`Authorization.checkPulled`), judged against this device's base
    /// with the pull staged over it: a server cannot place a record signed by an account it
    /// made up, or by a grantee outside its share, in this account's tree.
    func checkOtherWriters(_ files: [RemoteFile]) throws {
        let others = files.filter { $0.signed.metadata.lastModifiedBy != accountID }
        guard !others.isEmpty else { return }
        try store.read { r in
            var staged: [FileID: FileMetadata] = [:]
            for f in files { staged[f.signed.metadata.id] = f.stored.effectiveMetadata }
            let base = LookupTree { id in try staged[id] ?? r.file(id, .base)?.effectiveMetadata }
            for f in others {
                let m = f.signed.metadata
                do {
                    try Authorization.checkPulled(
                        m, old: try r.file(m.id, .base)?.signed.metadata, in: base, keyOpens: keyOpens(in: base),
                        verify: { PublicSigningKey.isValid($0.bytes, $1, $2) })
                } catch {
                    throw VaultError.corrupt(
                        "the server sent file \(m.id) written by another account against the sharing rules "
                            + "(\(error)); nothing was applied")
                }
            }
            try base.throwIfFailed()
        }
    }

    /// Checks, page by page, the records of this account's tree that other accounts wrote, so
    /// a server cannot make a device hold records signed by accounts it made up while it keeps
    /// paging (valid signatures cost the server nothing: it can make keys). A record whose walk
    /// up its folders reaches one this pull has not brought yet (a folder created in the same
    /// version, on a later page) waits for the pages after; no more than one upsert's records
    /// (`TreeLimits.maxRecordsPerBatch`) ever wait, since pages come in version order.
    /// `verifyRemote` judges the whole pull again at the end.
    public final class OtherWriterCheck {
        let vault: Vault
        private var staged: [FileID: FileMetadata] = [:]
        private var waiting: [RemoteFile] = []

        init(vault: Vault) { self.vault = vault }

        public func admit(_ page: [RemoteFile]) throws {
            for f in page { staged[f.signed.metadata.id] = f.stored.effectiveMetadata }
            let candidates = waiting + page.filter { $0.signed.metadata.lastModifiedBy != vault.accountID }
            guard !candidates.isEmpty else { return }
            var stillWaiting: [RemoteFile] = []
            try vault.store.read { r in
                for f in candidates {
                    var missed = false
                    let tree = LookupTree { [staged] id in
                        if let m = staged[id] { return m }
                        let m = try r.file(id, .base)?.effectiveMetadata
                        if m == nil { missed = true }
                        return m
                    }
                    do {
                        try Authorization.checkPulled(
                            f.signed.metadata, old: try r.file(f.signed.metadata.id, .base)?.signed.metadata, in: tree,
                            keyOpens: vault.keyOpens(in: tree),
                            verify: { PublicSigningKey.isValid($0.bytes, $1, $2) })
                    } catch {
                        try tree.throwIfFailed()
                        guard missed else {
                            throw VaultError.corrupt(
                                "the server sent file \(f.signed.metadata.id) written by another account against the "
                                    + "sharing rules (\(error)); nothing was applied")
                        }
                        stillWaiting.append(f)
                    }
                }
            }
            guard stillWaiting.count <= TreeLimits.maxRecordsPerBatch else {
                throw VaultError.corrupt(
                    "the server sent more records written by other accounts than one change can hold, in folders "
                        + "this device does not know; nothing was applied")
            }
            waiting = stillWaiting
        }
    }

    public func otherWriterCheck() -> OtherWriterCheck { OtherWriterCheck(vault: self) }

    /// Documents whose pulled version names content this device does not have yet.
    public func contentNeeds(_ files: [RemoteFile]) throws -> [ContentNeed] {
        try state.withLock { s in
            // Keys follow the key chain through the pulled records, staged over this device's tree.
            var view = s.view.staged()
            for f in files { view.put(f.signed.metadata) }
            var out: [ContentNeed] = []
            for f in files where f.signed.metadata.type == .document && !f.serverDeleted && !f.signed.metadata.isDeleted
            {
                guard let digest = f.signed.metadata.contentDigest else { continue }
                if try store.read({ try $0.manifest(digest) }) != nil { continue }
                // Under a key of its folder that a rotation on this device replaced (pushed by
                // another writer before it learned of the rotation): the merge seals it again
                // (`settleKeys`), opening its content with the key it was written under, which
                // must therefore be fetched. An orphan has no key at all: dropped at apply.
                let id = f.signed.metadata.id
                let current = try? view.key(id)
                guard let k = try current ?? keyUnderEarlierKeys(id, pulled: files, view.access) else { continue }
                out.append(ContentNeed(fileID: id, digest: digest, key: k))
            }
            return out
        }
    }

    /// A pulled file's key through any version of its ancestors this device holds or pulls
    /// (base, unpushed local, pulled), for a file written under a key since replaced. Nil if
    /// none opens it.
    func keyUnderEarlierKeys(
        _ id: FileID, pulled files: [RemoteFile], _ access: any KeyAccess
    ) throws -> SymmetricKey? {
        let pulled = Dictionary(
            files.map { ($0.signed.metadata.id, $0.signed.metadata) }, uniquingKeysWith: { a, _ in a })
        return try store.read { r in
            var memo: [FileID: [SymmetricKey]] = [:]
            return try access.keysEver(id, memo: &memo) { id in
                [pulled[id], try r.file(id, .local)?.metadata, try r.file(id, .base)?.metadata].compactMap { $0 }
            }.first
        }
    }

    /// Checks a fetched manifest (digest, then authenticity) and returns it.
    public func openRemoteManifest(_ need: ContentNeed, sealed: [UInt8]) throws -> Manifest {
        try Self.openFetchedManifest(sealed, digest: need.digest, cipher: need.cipher)
    }

    /// A manifest from the server, checked against the digest its record names and opened
    /// (authenticated) with the document's key: what a pull and a read on demand both store.
    static func openFetchedManifest(_ sealed: [UInt8], digest: [UInt8], cipher: ContentCipher) throws -> Manifest {
        guard ContentCipher.digest(ofSealedManifest: sealed) == digest else {
            throw VaultError.corrupt("the server sent a manifest for \(cipher.fileID) that does not match its digest")
        }
        return try cipher.openManifest(sealed)
    }

    /// The chunks `refs` from what the server sent, each opened (authenticated against its ref)
    /// before it is kept; a ref the server left out is an error.
    static func verifiedChunks(
        _ refs: [ChunkRef], from got: [[UInt8]: [UInt8]], cipher: ContentCipher
    ) throws -> [([UInt8], [UInt8])] {
        try refs.map { ref in
            guard let sealed = got[ref.id] else {
                throw VaultError.corrupt("the server did not send a chunk of \(cipher.fileID)")
            }
            _ = try cipher.openChunk(sealed, ref: ref)
            return (ref.id, sealed)
        }
    }

    public func missingChunks(_ ids: [[UInt8]]) throws -> [[UInt8]] {
        try store.read { r in try Array(Set(ids)).filter { try !r.hasChunk($0) } }
    }

    /// Part of a large document's fetched chunks, each verified against its ref, stored before
    /// the rest (its manifest comes last, through `storeRemoteContents`, once all are here).
    public func storeRemoteChunks(_ need: ContentNeed, refs: [ChunkRef], chunks: [[UInt8]: [UInt8]]) throws {
        let verified = try Self.verifiedChunks(refs, from: chunks, cipher: need.cipher)
        try store.write { w in try w.putChunks(verified) }
    }

    /// `storeRemoteContent` for many documents in one transaction (a first sync brings
    /// thousands): every chunk is verified against its manifest before anything is written.
    public func storeRemoteContents(_ items: [FetchedContent]) throws {
        guard !items.isEmpty else { return }
        var kept: [[([UInt8], [UInt8])]] = []
        for item in items {
            var refs: [[UInt8]: ChunkRef] = [:]
            for r in item.manifest.chunks { refs[r.id] = r }
            var chunks: [([UInt8], [UInt8])] = []
            for (id, sealed) in item.chunks {
                guard let ref = refs[id] else { continue }
                _ = try item.need.cipher.openChunk(sealed, ref: ref)
                chunks.append((id, sealed))
            }
            kept.append(chunks)
        }
        contentFetched.add(1, ordering: .relaxed)
        // A read that could not fetch one of these (offline) is answered now.
        let unfetched = Set(self.unfetched.map(\.id))
        try store.write { w in
            for item in items where unfetched.contains(item.need.fileID) {
                try w.removeSetting(Self.unfetchedKey(item.need.fileID))
            }
            for (item, chunks) in zip(items, kept) {
                try w.putChunks(chunks)
                for r in item.manifest.chunks where try !w.reader.hasChunk(r.id) {
                    throw VaultError.corrupt("chunk missing for \(item.need.fileID) after download")
                }
                try w.putManifest(
                    digest: item.need.digest, sealed: item.sealedManifest, chunkIDs: item.manifest.chunks.map(\.id))
            }
        }
    }
}
