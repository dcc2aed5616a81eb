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
        self.signed = signed; self.version = version; self.contentVersion = contentVersion; self.serverDeleted = serverDeleted
    }

    var stored: StoredFile { StoredFile(signed: signed, version: version, contentVersion: contentVersion, serverDeleted: serverDeleted) }
}

/// A document version to fetch before the pull that names it can be applied.
public struct ContentNeed: Sendable {
    public let fileID: FileID
    public let digest: [UInt8]
    let cipher: ContentCipher
}

extension Vault {
    /// Refuses the whole pull if any record is not signed by this account or not owned by it,
    /// or goes against what this device has already seen (`checkHistory`): nothing from a server
    /// is applied without checking who wrote it and that it is not older than what is here.
    public func verifyRemote(_ files: [RemoteFile]) throws {
        for f in files {
            let m = f.signed.metadata
            guard m.lastModifiedBy == accountID, m.owner == accountID else {
                throw VaultError.corrupt("the server sent file \(m.id) written by another account; nothing was applied")
            }
            guard let pk = try? PublicSigningKey(bytes: m.lastModifiedBy.bytes), pk.verify(signature: f.signed.signature, message: f.signed.message) else {
                throw VaultError.corrupt("the server sent file \(m.id) with a bad signature; nothing was applied")
            }
        }
        try checkHistory(files)
    }

    /// What a server cannot make a device accept, though every record it sends is validly signed:
    /// - a record older than the one this device holds as base (a rollback), or a different record
    ///   with the same revision (two histories);
    /// - a live record of a file whose deletion synced and was pruned here (a resurrection; the
    ///   tombstone remembers the id);
    /// - a deletion nobody signed: the server may mark a file deleted (`serverDeleted`) only when
    ///   a signed record of one of its ancestors, as this device knows them, is deleted.
    func checkHistory(_ files: [RemoteFile]) throws {
        let remote = Dictionary(files.map { ($0.signed.metadata.id, $0.signed) }, uniquingKeysWith: { a, b in a.revision >= b.revision ? a : b })
        try store.read { r in
            var base: [FileID: SignedMetadata?] = [:]
            func baseRecord(_ id: FileID) throws -> SignedMetadata? {
                if let known = base[id] { return known }
                let found = try r.file(id, .base)?.signed
                base[id] = found
                return found
            }
            func newest(_ id: FileID) throws -> FileMetadata? { try remote[id]?.metadata ?? baseRecord(id)?.metadata }

            for f in files {
                let m = f.signed.metadata
                if let seen = try baseRecord(m.id) {
                    if f.signed.revision < seen.revision {
                        throw VaultError.corrupt(
                            "the server sent an older record of file \(m.id) (revision \(f.signed.revision)) than this device has seen (revision \(seen.revision)): it was rolled back or is not honest; nothing was applied")
                    }
                    if f.signed.revision == seen.revision, f.signed != seen {
                        throw VaultError.corrupt(
                            "the server sent a record of file \(m.id) that differs from the one this device has with the same revision \(seen.revision); nothing was applied")
                    }
                }
                if !m.isDeleted, !f.serverDeleted, try r.isTombstoned(m.id) {
                    throw VaultError.corrupt("the server sent file \(m.id) back to life after its deletion synced here; nothing was applied")
                }
                guard f.serverDeleted, !m.isDeleted else { continue }
                var cursor = m
                var steps = 0
                var signedDeletion = false
                while !cursor.isRoot, steps <= 100_000 {
                    steps += 1
                    if try r.isTombstoned(cursor.parent) { signedDeletion = true; break }
                    guard let parent = try newest(cursor.parent) else { break }
                    if parent.isDeleted { signedDeletion = true; break }
                    cursor = parent
                }
                guard signedDeletion else {
                    throw VaultError.corrupt("the server marked file \(m.id) deleted, but no deletion of it or of a folder above it is signed; nothing was applied")
                }
            }
        }
    }

    /// The key of a file, following the key chain through pulled records where they are newer.
    func remoteKey(_ id: FileID, _ remote: [FileID: FileMetadata], _ s: inout VaultState, _ memo: inout [FileID: SymmetricKey]) throws -> SymmetricKey {
        if let k = memo[id] { return k }
        if s.tree.file(id) != nil, let k = try? key(id, &s) { memo[id] = k; return k }
        var chain: [FileMetadata] = []
        var cursor = id
        while memo[cursor] == nil {
            guard let m = remote[cursor] ?? s.tree.file(cursor) else { throw TreeError.orphan(cursor.description) }
            chain.append(m)
            if m.isRoot { break }
            if chain.count > 100_000 { throw TreeError.cycle(id.description) }
            cursor = m.parent
            if s.tree.file(cursor) != nil, remote[cursor] == nil, let k = try? key(cursor, &s) { memo[cursor] = k }
        }
        for m in chain.reversed() where memo[m.id] == nil {
            if m.isRoot {
                guard let entry = m.access.first(where: { $0.account == accountID && !$0.isDeleted }) else {
                    throw VaultError.corrupt("the root folder has no key for this account")
                }
                memo[m.id] = try box.open(sealedKey: entry.sealedKey, fileID: m.id.bytes)
            } else {
                guard let pk = memo[m.parent] else { throw TreeError.orphan(m.id.description) }
                memo[m.id] = try KeyWrap.unwrap(m.wrappedKey, with: pk, fileID: m.id.bytes)
            }
        }
        guard let k = memo[id] else { throw VaultError.corrupt("cannot unwrap the key of \(id)") }
        return k
    }

    /// Documents whose pulled version names content this device does not have yet.
    public func contentNeeds(_ files: [RemoteFile]) throws -> [ContentNeed] {
        let remote = Dictionary(files.map { ($0.signed.metadata.id, $0.signed.metadata) }, uniquingKeysWith: { _, b in b })
        return try state.withLock { s in
            var memo: [FileID: SymmetricKey] = [:]
            var out: [ContentNeed] = []
            for f in files where f.signed.metadata.type == .document && !f.serverDeleted && !f.signed.metadata.isDeleted {
                guard let digest = f.signed.metadata.contentDigest else { continue }
                if try store.read({ try $0.manifest(digest) }) != nil { continue }
                guard let k = try? remoteKey(f.signed.metadata.id, remote, &s, &memo) else { continue } // orphan: dropped at apply
                out.append(ContentNeed(fileID: f.signed.metadata.id, digest: digest, cipher: ContentCipher(fileID: f.signed.metadata.id, key: k)))
            }
            return out
        }
    }

    /// Checks a fetched manifest (digest, then authenticity) and returns it.
    public func openRemoteManifest(_ need: ContentNeed, sealed: [UInt8]) throws -> Manifest {
        guard ContentCipher.digest(ofSealedManifest: sealed) == need.digest else {
            throw VaultError.corrupt("the server sent a manifest for \(need.fileID) that does not match its digest")
        }
        return try need.cipher.openManifest(sealed)
    }

    public func missingChunks(_ ids: [[UInt8]]) throws -> [[UInt8]] {
        try store.read { r in try Array(Set(ids)).filter { try !r.hasChunk($0) } }
    }

    /// Verifies every fetched chunk against the manifest, stores them, then the manifest.
    public func storeRemoteContent(_ need: ContentNeed, manifest: Manifest, sealedManifest: [UInt8], chunks: [[UInt8]: [UInt8]]) throws {
        var refs: [[UInt8]: ChunkRef] = [:]
        for r in manifest.chunks { refs[r.id] = r }
        for (id, sealed) in chunks {
            guard let ref = refs[id] else { continue }
            _ = try need.cipher.openChunk(sealed, ref: ref)
        }
        try store.write { w in
            try w.putChunks(chunks.filter { refs[$0.key] != nil }.map { ($0.key, $0.value) })
            for r in manifest.chunks where try !w.reader.hasChunk(r.id) {
                throw VaultError.corrupt("chunk missing for \(need.fileID) after download")
            }
            try w.putManifest(digest: need.digest, sealed: sealedManifest, chunkIDs: manifest.chunks.map(\.id))
        }
    }
}
