import CofferContent
import CofferCrypto
import CofferModel
import CofferStore

/// What `coffer fsck` found.
public struct CheckReport: Sendable {
    public var files = 0
    public var documents = 0
    public var chunksVerified = 0
    public var bytesVerified: UInt64 = 0
    /// Chunks and manifests no record refers to (left by an interrupted write). Harmless; `coffer
    /// gc` reclaims them.
    public var unreferencedChunks = 0
    public var unreferencedManifests = 0
    public var problems: [String] = []
    public var isClean: Bool { problems.isEmpty }
}

extension Vault {
    /// Checks the invariants on both trees, every signature, the key chain, every name and
    /// attribute record, and every chunk of every live document (authenticity and chunk id).
    public func check() throws -> CheckReport {
        var report = CheckReport()
        let (baseRead, localRead) = try store.read { r in (try r.filesLeniently(.base), try r.filesLeniently(.local)) }
        let (base, local) = (baseRead.files, localRead.files)
        report.problems += baseRead.problems + localRead.problems
        var merged: [FileID: StoredFile] = [:]
        for f in base { merged[f.metadata.id] = f }
        for f in local { merged[f.metadata.id] = f }
        report.files = merged.count
        // Names and keys are decrypted through this vault's tree, which may be older than the
        // records just read (another process, such as the mount's group commit, committed since
        // the vault was opened): catch it up to at least that snapshot, keeping what changed
        // for whoever asks `refresh` next.
        try state.withLock { s in s.externalChanges.formUnion(try catchUp(&s)) }

        // Signatures: every record must be signed by the account it names as writer, except this
        // device's unpushed edits, which are signed when they are pushed.
        let toVerify = base + local.filter { !($0.signed.signature.isEmpty && $0.metadata.lastModifiedBy == accountID) }
        for f in toVerify {
            let m = f.metadata
            guard let pk = try? PublicSigningKey(bytes: m.lastModifiedBy.bytes),
                pk.verify(signature: f.signed.signature, message: f.signed.message)
            else {
                report.problems.append("bad signature on file \(m.id)")
                continue
            }
        }
        // Invariants on base alone and on the current view.
        let baseTree = FileTree(base.map(\.effectiveMetadata))
        do { try Validator.validateAll(baseTree) } catch { report.problems.append("base tree: \(error)") }
        let tree = FileTree(merged.values.map(\.effectiveMetadata))
        do { try Validator.validateAll(tree) } catch { report.problems.append("local tree: \(error)") }

        // Keys, names, attributes; then content.
        for m in tree.files.values.sorted(by: { $0.id < $1.id }) {
            guard tree.isLive(m.id) else { continue }
            do {
                let n = try node(m.id)
                if m.type == .document {
                    report.documents += 1
                    var found = CheckReport()
                    try checkContent(m, size: n.attributes.size, &found)
                    // A writer (the mount) may replace the content while fsck reads it: only
                    // what is still the current version counts.
                    if !found.problems.isEmpty, try !isCurrentContent(m) { continue }
                    report.chunksVerified += found.chunksVerified
                    report.bytesVerified += found.bytesVerified
                    report.problems += found.problems
                }
            } catch {
                if try !isCurrentContent(m) { continue }
                report.problems.append("\(m.id): \(VaultError.wrap(error).description)")
            }
        }
        // Content nothing refers to, all from one snapshot: records read earlier may name content
        // a later commit replaced, and a manifest's chunk list read later may be gone.
        let (chunkIDs, manifests, referenced, reachableChunks) = try store.read { r in
            let records = try r.filesLeniently(.base).files + r.filesLeniently(.local).files
            let referenced = Set(records.compactMap { $0.metadata.contentDigest })
            var reachable: Set<[UInt8]> = []
            for d in referenced { reachable.formUnion(try r.chunkIDs(ofManifest: d)) }
            return (Set(try r.allChunkIDs()), Set(try r.allManifestDigests()), referenced, reachable)
        }
        report.unreferencedChunks = chunkIDs.subtracting(reachableChunks).count
        report.unreferencedManifests = manifests.subtracting(referenced).count
        for d in referenced where !manifests.contains(d) && !isOnDemand {
            report.problems.append("missing manifest \(hexString(Array(d.prefix(8))))")
        }
        return report
    }

    /// Whether the store still names the content `m` names (false if it changed meanwhile).
    private func isCurrentContent(_ m: FileMetadata) throws -> Bool {
        try store.read { try $0.current(m.id)?.metadata.contentDigest } == m.contentDigest
    }

    private func checkContent(_ m: FileMetadata, size: UInt64, _ report: inout CheckReport) throws {
        let cipher = try state.withLock { s in ContentCipher(fileID: m.id, key: try s.view.key(m.id)) }
        // A store on demand checks what it holds and fetches nothing.
        let onDemand = isOnDemand
        guard
            let manifest = onDemand
                ? try storedManifest(m.contentDigest, cipher: cipher)
                : try loadManifest(m.contentDigest, cipher: cipher)
        else { return }
        if manifest.size != size {
            report.problems.append("\(path(of: m.id)): size \(size) in attributes but \(manifest.size) in content")
        }
        for ref in manifest.chunks {
            guard let sealed = try store.read({ try $0.chunk(ref.id) }) else {
                if onDemand { continue }
                report.problems.append("\(path(of: m.id)): chunk \(hexString(Array(ref.id.prefix(8)))) is missing")
                continue
            }
            do {
                _ = try cipher.openChunk(sealed, ref: ref)
                report.chunksVerified += 1
                report.bytesVerified += UInt64(ref.length)
            } catch {
                report.problems.append("\(path(of: m.id)): chunk \(hexString(Array(ref.id.prefix(8)))): \(error)")
            }
        }
    }

    /// Counts of records with unsynced local changes, for `coffer status`: counters the store
    /// keeps as records change, so the answer costs the same however many there are. A local
    /// record is a deletion if it says deleted, a creation if the server has never seen the file,
    /// else a modification.
    public func pendingChanges() throws -> (created: Int, modified: Int, deleted: Int) {
        try store.pendingCounts()
    }

    /// How many records the tree holds (a counter the store keeps, not a scan).
    public var fileCount: Int { state.withLock { $0.view.tree.count } }
}
