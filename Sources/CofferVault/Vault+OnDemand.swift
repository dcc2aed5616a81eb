import CofferContent
import CofferCrypto
import CofferModel
import CofferStore
import Foundation
import Synchronization

/// Where a device that keeps content on demand gets what it does not hold: the server, through
/// the sync engine's client (docs/SYNC.md, "Content on demand"). Blocking calls with deadlines:
/// they run on FUSE's and the CLI's threads.
public protocol RemoteContentSource: Sendable {
    /// Sealed manifests in the order asked; nil for one the server does not hold.
    func manifests(_ items: [(fileID: FileID, digest: [UInt8])]) throws -> [[UInt8]?]
    /// Sealed chunks by id; with `via`, from the namespace of the owner of that shared document.
    func chunks(_ ids: [[UInt8]], via: FileID?) throws -> [[UInt8]: [UInt8]]
}

extension Vault {
    // MARK: The setting

    /// Whether this device keeps only the content it has opened or pinned (docs/SYNC.md,
    /// "Content on demand"): pulls bring records, and content comes when it is read. A setting
    /// of this device, never synced.
    public var isOnDemand: Bool { (try? store.readOne { try $0.setting("onDemand") }) == [1] }

    public func setOnDemand(_ on: Bool) throws {
        try store.write { w in try w.setSetting("onDemand", on ? [1] : []) }
    }

    /// Gives the vault a way to fetch content it lacks (the mount daemon and the CLI do, for a
    /// store on demand with a server); nil takes it away.
    public func setRemoteContent(_ source: (any RemoteContentSource)?) {
        remoteContent.withLock { $0 = source }
    }

    // MARK: Pins

    /// Files and folders pinned on this device: their content is kept here (fetched by every
    /// sync, never evicted), for use offline.
    public var pinnedIDs: [FileID] { fileSettings(Self.pinPrefix).map(\.id) }

    public func pin(_ id: FileID) throws {
        try store.write { w in try w.setSetting(Self.pinPrefix + hexString(id.bytes), [1]) }
    }

    public func unpin(_ id: FileID) throws {
        try store.write { w in try w.removeSetting(Self.pinPrefix + hexString(id.bytes)) }
    }

    static let pinPrefix = "pin."
    static let unfetchedPrefix = "unfetched."

    /// The settings named `prefix` + a file id in hex, by file (a malformed name is skipped).
    func fileSettings(_ prefix: String) -> [(id: FileID, value: [UInt8])] {
        ((try? store.read { try $0.settings(withPrefix: prefix) }) ?? []).compactMap { entry in
            guard let id = bytesFromHex(String(entry.key.dropFirst(prefix.count))).flatMap({ try? FileID(bytes: $0) })
            else { return nil }
            return (id, entry.value)
        }
    }

    /// Whether `id` or a folder above it is pinned.
    public func isPinned(_ id: FileID) -> Bool { isPinned(id, Set(pinnedIDs)) }

    func isPinned(_ id: FileID, _ pins: Set<FileID>) -> Bool {
        guard !pins.isEmpty else { return false }
        return state.withLock { s in
            var current = id
            for _ in 0...TreeLimits.maxDepth {
                if pins.contains(current) { return true }
                guard let m = s.view.tree.file(current), !m.isRoot else { return false }
                current = m.parent
            }
            return false
        }
    }

    /// Of the content a pull needs, what a store on demand fetches with it: the content of
    /// pinned documents, and of documents changed here too (the merge reads both sides). The
    /// rest comes when it is read. A store that is not on demand fetches it all.
    public func onDemandFilter(_ needs: [ContentNeed]) throws -> [ContentNeed] {
        guard isOnDemand else { return needs }
        let pins = Set(pinnedIDs)
        return try needs.filter { need in
            try store.read({ try $0.file(need.fileID, .local) }) != nil
                || (!pins.isEmpty && isPinned(need.fileID, pins))
        }
    }

    /// The documents at or below the pinned files whose content this device lacks, with what is
    /// needed to fetch it: what a sync fetches for a store on demand.
    public func pinnedContentNeeds() throws -> [ContentNeed] {
        try contentNeeds(under: pinnedIDs)
    }

    /// The documents at or below `roots` whose content this device lacks (the whole tree's, from
    /// its root, when a store stops keeping content on demand).
    public func contentNeeds(under roots: [FileID]) throws -> [ContentNeed] {
        guard !roots.isEmpty else { return [] }
        return try state.withLock { s in
            var out: [ContentNeed] = []
            var queue = roots
            var seen: Set<FileID> = []
            while let id = queue.popLast() {
                guard seen.insert(id).inserted, let m = s.view.tree.file(id), !m.isDeleted else { continue }
                switch m.type {
                case .folder: queue += try s.view.tree.childIDs(of: id)
                case .document:
                    guard let digest = m.contentDigest, try !hasWholeContent(digest) else { continue }
                    out.append(ContentNeed(fileID: id, digest: digest, key: try s.view.key(id)))
                default: continue
                }
            }
            return out
        }
    }

    /// Whether the manifest with `digest` and every chunk it lists are on this device.
    func hasWholeContent(_ digest: [UInt8]) throws -> Bool {
        try store.read { r in
            guard try r.manifest(digest) != nil else { return false }
            return try r.chunkIDs(ofManifest: digest).allSatisfy { try r.hasChunk($0) }
        }
    }

    // MARK: Fetching

    /// The server's sealed manifest `digest` of `id`, checked and stored, for a store on demand;
    /// nil when this device does not fetch content (not on demand, or no server to ask).
    func fetchManifest(_ id: FileID, digest: [UInt8], cipher: ContentCipher) throws -> Manifest? {
        guard let source = remoteContent.withLock({ $0 }) else { return nil }
        let sealed: [UInt8]
        do {
            guard let got = try source.manifests([(id, digest)]).first ?? nil else {
                throw VaultError.corrupt("the server does not hold the content of \(id)")
            }
            sealed = got
        } catch {
            noteUnfetched(id, error)
            throw unavailable(id, error)
        }
        let manifest = try Self.openFetchedManifest(sealed, digest: digest, cipher: cipher)
        try store.write { w in try w.putManifest(digest: digest, sealed: sealed, chunkIDs: manifest.chunks.map(\.id)) }
        contentFetched.add(1, ordering: .relaxed)
        clearUnfetched(id)
        return manifest
    }

    /// Fetches the chunks `refs` of document `id` this device lacks (with `via`, a shared
    /// document's), each verified against its ref before it is stored. Nothing when no server
    /// can be asked.
    func fetchChunks(_ refs: [ChunkRef], of id: FileID, cipher: ContentCipher, via: FileID?) throws {
        guard let source = remoteContent.withLock({ $0 }) else { return }
        let lacking = try store.read { r in try refs.filter { try !r.hasChunk($0.id) } }
        guard !lacking.isEmpty else { return }
        let got: [[UInt8]: [UInt8]]
        do {
            got = try source.chunks(lacking.map(\.id), via: via)
        } catch {
            noteUnfetched(id, error)
            throw unavailable(id, error)
        }
        let verified = try Self.verifiedChunks(lacking, from: got, cipher: cipher)
        try store.write { w in try w.putChunks(verified) }
        contentFetched.add(1, ordering: .relaxed)
        clearUnfetched(id)
    }

    /// Fetches all the content at or below `roots` this device lacks, for an operation that
    /// reads every byte of it (a revocation seals it all again). Nothing for a store that holds
    /// all its content, or has no server to ask.
    public func fetchWholeContent(under roots: [FileID]) throws {
        guard isOnDemand, remoteContent.withLock({ $0 != nil }) else { return }
        for need in try contentNeeds(under: roots) {
            let manifest = try loadManifest(need.digest, cipher: need.cipher)
            try fetchChunks(manifest.chunks, of: need.fileID, cipher: need.cipher, via: nil)
        }
    }

    // MARK: The cache

    /// Notes that `id`'s content was read, for the cache's least-recently-used order.
    func noteContentRead(_ id: FileID) {
        let ms = epochMillis
        contentReads.withLock { reads in reads?[id] = ms }
    }

    /// Keeps the read times `trimContent` orders by (the mount does, with a cache size).
    public func trackContentReads() { contentReads.withLock { $0 = $0 ?? [:] } }

    /// Trims the content this device holds to at most `limit` sealed bytes, for a store on
    /// demand: drops the content least recently read first (what this process has not seen read
    /// counts as oldest), never a pinned file's, an open one's, or any not yet pushed. Returns
    /// the bytes dropped. Dropped content is fetched again when read.
    @discardableResult
    public func trimContent(to limit: Int) throws -> Int {
        guard isOnDemand else { return 0 }
        // Nothing fetched since the last look: nothing grew (a scan of every chunk's row).
        let fetched = contentFetched.load(ordering: .relaxed)
        guard lastTrimAt.exchange(fetched, ordering: .relaxed) != fetched else { return 0 }
        // Only while no other process has the store open: one could be storing chunks its
        // manifest does not list yet, which the drop below must not take away.
        return try locks.exclusively { try trimLocked(to: limit) } ?? 0
    }

    private func trimLocked(to limit: Int) throws -> Int {
        var held = try store.read { try $0.heldContentBytes() }
        guard held > limit else { return 0 }
        let reads = contentReads.withLock { $0 } ?? [:]
        let candidates = try store.read { try $0.evictableContent() }.sorted { a, b in
            let (ta, tb) = (reads[a.id] ?? 0, reads[b.id] ?? 0)
            return ta != tb ? ta < tb : a.id.bytes.lexicographicallyPrecedes(b.id.bytes)
        }
        let pins = Set(pinnedIDs)
        var dropped = 0
        for c in candidates where held > limit {
            if openDocuments.withLock({ $0[c.id] != nil }) { continue }
            if isPinned(c.id, pins) { continue }
            let size = try store.read { r in
                try r.chunkIDs(ofManifest: c.digest).reduce(0) { $0 + (try r.sealedChunkLength($1) ?? 0) }
            }
            try store.write { w in try w.dropContent(digest: c.digest) }
            held -= size
            dropped += size
        }
        // Bytes in pack files come back once the packs are rewritten: with the collection's own
        // guard, which skips it while documents are open (their spilled chunks are listed by no
        // manifest yet).
        if dropped > 0, openDocuments.withLock({ $0.isEmpty }) { _ = try? store.collectGarbage() }
        return dropped
    }

    // MARK: What could not be fetched

    func unavailable(_ id: FileID, _ error: any Error) -> VaultError {
        .unavailable("\(path(of: id)): its content is not on this device and cannot be fetched now (\(error))")
    }

    /// Documents whose content a read wanted and could not fetch (offline, say), with when and
    /// why, for `coffer status`; cleared when a later fetch succeeds.
    public var unfetched: [(id: FileID, millis: Int64, why: String)] {
        fileSettings(Self.unfetchedPrefix).compactMap { entry in
            guard let note = Self.stampedNote(entry.value) else { return nil }
            return (entry.id, note.millis, note.fields.first ?? "")
        }
    }

    func noteUnfetched(_ id: FileID, _ error: any Error) {
        let value = Self.stampedNote(epochMillis, [String("\(error)".prefix(300))])
        try? store.write { w in try w.setSetting(Self.unfetchedKey(id), value) }
    }

    static func unfetchedKey(_ id: FileID) -> String { unfetchedPrefix + hexString(id.bytes) }

    func clearUnfetched(_ id: FileID) {
        let key = Self.unfetchedKey(id)
        guard (try? store.readOne({ try $0.setting(key) })) != nil else { return }
        try? store.write { w in try w.removeSetting(key) }
    }
}
