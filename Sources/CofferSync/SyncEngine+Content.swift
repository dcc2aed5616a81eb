import CofferContent
import CofferModel
import CofferProtocol
import CofferVault
import Foundation
import Synchronization

/// Content in bundles (docs/SYNC.md, "Content in bundles"): pushing or pulling a tree costs
/// requests in proportion to its bytes, not its files.
extension SyncEngine {
    /// Bytes of chunks and manifests one upload bundle carries at most (the server takes up to
    /// `API.maxBodyBytes`); a few are in flight at once.
    static let bundleBytes = 8 * 1024 * 1024
    /// Bundles (or chunk downloads) in flight at once.
    static let bundleWidth = 3
    /// Chunk bytes one download asks for at most, and documents per manifest request.
    static let fetchBytes = 16 * 1024 * 1024
    static let manifestsPerRequest = 2000

    /// Chunks the server lacks, then the manifests: content before the metadata naming it, in
    /// bundles (`POST /v1/content`) filled in order and sent a few at a time, each chunk read
    /// once, as its bundle is filled. A document's manifest rides in the bundle that carries
    /// its last chunk when all its chunks are in that bundle (or already on the server); any
    /// other manifest (a document larger than a bundle, or sharing chunks with another) goes
    /// in a last bundle, once every chunk is stored. A bundle the server stored stays stored,
    /// so an interrupted push sends only the rest the next time. With `via`, into the
    /// namespace of the owner of that shared file.
    func upload(_ uploads: [PendingUpload], _ report: inout SyncReport, via: FileID? = nil) async throws {
        guard !uploads.isEmpty else { return }
        var all: [[UInt8]] = []
        var seen: Set<[UInt8]> = []
        for u in uploads { for id in u.chunkIDs where seen.insert(id).inserted { all.append(id) } }
        var missing: Set<[UInt8]> = []
        for batch in all.batches(of: 4096) { missing.formUnion(try await client.missingChunks(batch, via: via)) }
        let vault = self.vault
        let sent = try await withThrowingTaskGroup(of: Int.self) { group in
            var inFlight = 0
            var total = 0
            var bundle = ContentBundle()
            // `bundle.encodedSize`, kept as items are added (computing it walks the bundle).
            var size = ContentBundle.headerSize
            var later: [ContentBundle.Manifest] = []
            var taken: Set<[UInt8]> = []
            var bytesSent = 0
            let toSend = missing.count
            func dispatch(_ b: ContentBundle) async throws {
                if inFlight >= Self.bundleWidth, let n = try await group.next() {
                    total += n
                    inFlight -= 1
                    tell("pushing content", done: total, of: toSend, bytes: bytesSent)
                }
                bytesSent += size
                group.addTask { [self] in try await send(b, via: via) }
                inFlight += 1
            }
            for u in uploads {
                let manifest = ContentBundle.Manifest(
                    fileID: u.fileID.bytes, digest: u.digest, sealed: u.sealedManifest, chunkIDs: u.chunkIDs)
                var whole = true
                for id in Set(u.chunkIDs) where missing.contains(id) {
                    guard taken.insert(id).inserted else {
                        whole = false
                        continue
                    }
                    guard let sealed = try vault.sealedChunk(id) else {
                        throw SyncError.protocolError("a local chunk vanished during sync")
                    }
                    let chunk = ContentBundle.Chunk(id: id, sealed: sealed)
                    if !bundle.isEmpty, size + chunk.encodedSize > Self.bundleBytes {
                        try await dispatch(bundle)
                        bundle = ContentBundle()
                        size = ContentBundle.headerSize
                        whole = false
                    }
                    bundle.chunks.append(chunk)
                    size += chunk.encodedSize
                }
                if whole, bundle.chunks.count + bundle.manifests.count < ContentBundle.maxItems {
                    bundle.manifests.append(manifest)
                    size += manifest.encodedSize
                } else {
                    later.append(manifest)
                }
                if bundle.chunks.count + bundle.manifests.count >= ContentBundle.maxItems - 1 {
                    try await dispatch(bundle)
                    bundle = ContentBundle()
                    size = ContentBundle.headerSize
                }
            }
            if !bundle.isEmpty { try await dispatch(bundle) }
            while let n = try await group.next() {
                total += n
                tell("pushing content", done: total, of: toSend, bytes: bytesSent)
            }
            // Manifests whose chunks other bundles carried, now that those are all stored.
            var tail = ContentBundle()
            var tailSize = ContentBundle.headerSize
            for m in later {
                if !tail.isEmpty,
                    tailSize + m.encodedSize > Self.bundleBytes || tail.manifests.count + 1 >= ContentBundle.maxItems
                {
                    total += try await send(tail, via: via)
                    tail = ContentBundle()
                    tailSize = ContentBundle.headerSize
                }
                tail.manifests.append(m)
                tailSize += m.encodedSize
            }
            if !tail.isEmpty { total += try await send(tail, via: via) }
            return total
        }
        report.pushedChunks += sent
    }

    /// Sends one bundle; returns how many chunks it carried. An older server without bundles is
    /// sent the same content a request per chunk and manifest.
    func send(_ bundle: ContentBundle, via: FileID?) async throws -> Int {
        do {
            try await client.putContent(bundle, via: via)
        } catch let e as SyncError where e.isUnknownEndpoint {
            for c in bundle.chunks { try await client.putChunk(id: c.id, sealed: c.sealed, via: via) }
            for m in bundle.manifests {
                try await client.putManifest(
                    PutManifestRequest(
                        fileID: Data(m.fileID), digest: Data(m.digest), sealed: Data(m.sealed),
                        chunkIDs: m.chunkIDs.map { Data($0) }, via: via.map { Data($0.bytes) }))
            }
        }
        return bundle.chunks.count
    }

    /// Fetches and stores the content `needs` name: manifests many to a request, then the
    /// chunks this device lacks, many to a request and a few requests in flight, then each
    /// wave of documents stored in one transaction. With `shared`, through each document itself
    /// (`via`), as another account's content is kept in its owner's namespace. Returns the
    /// number of chunks fetched. Memory holds the manifests of `manifestsPerRequest` documents
    /// and the content of one wave of them, about `waveBytes`.
    func fetch(_ needs: [ContentNeed], shared: Bool) async throws -> Int {
        var fetched = 0
        var done = 0
        for wave in needs.batches(of: Self.manifestsPerRequest) {
            tell("fetching content", done: done, of: needs.count)
            done += wave.count
            let entries = try await client.getManifests(
                wave.map { GetManifestRequest(fileID: Data($0.fileID.bytes), digest: Data($0.digest)) })
            var all: [(need: ContentNeed, manifest: Manifest, sealed: [UInt8])] = []
            for (need, entry) in zip(wave, entries) {
                guard let sealed = entry.sealed else {
                    throw SyncError.protocolError("the server does not hold the content of \(need.fileID)")
                }
                all.append((need, try vault.openRemoteManifest(need, sealed: sealed), sealed))
            }
            // Stored in parts of about `waveBytes` of content, so memory holds one part however
            // large the documents are.
            var from = 0
            while from < all.count {
                var to = from
                var bytes = 0
                while to < all.count, to == from || bytes + Int(all[to].manifest.size) <= Self.waveBytes {
                    bytes += Int(all[to].manifest.size)
                    to += 1
                }
                fetched += try await fetchWave(Array(all[from..<to]), shared: shared)
                from = to
            }
        }
        if !needs.isEmpty { tell("fetching content", done: needs.count, of: needs.count) }
        return fetched
    }

    /// Content held in memory at most while a pull fetches it (one document larger than this
    /// is fetched alone).
    static let waveBytes = 64 * 1024 * 1024

    /// Fetches the chunks these opened documents lack and stores them in one transaction; a
    /// lone document larger than `waveBytes` is stored a part at a time, its manifest last.
    private func fetchWave(
        _ opened: [(need: ContentNeed, manifest: Manifest, sealed: [UInt8])], shared: Bool
    ) async throws -> Int {
        if opened.count == 1, let o = opened.first, Int(o.manifest.size) > Self.waveBytes {
            let lacking = Set(try vault.missingChunks(o.manifest.chunks.map(\.id)))
            var part: [ChunkRef] = []
            var partBytes = 0
            var count = 0
            func flush() async throws {
                guard !part.isEmpty else { return }
                let got = try await client.getChunks(part.map(\.id), via: shared ? o.need.fileID : nil)
                try vault.storeRemoteChunks(o.need, refs: part, chunks: got)
                count += part.count
                part = []
                partBytes = 0
            }
            var seen: Set<[UInt8]> = []
            for ref in o.manifest.chunks where lacking.contains(ref.id) && seen.insert(ref.id).inserted {
                if partBytes + Int(ref.length) > Self.fetchBytes { try await flush() }
                part.append(ref)
                partBytes += Int(ref.length)
            }
            try await flush()
            try vault.storeRemoteContents([
                FetchedContent(need: o.need, manifest: o.manifest, sealedManifest: o.sealed, chunks: [:])
            ])
            return count
        }
        // The chunks to ask for, by document (a shared one's through itself), in requests
        // of about `fetchBytes`.
        var requests: [(ids: [[UInt8]], via: FileID?)] = []
        var current: [[UInt8]] = []
        var currentBytes = 0
        var asked: Set<[UInt8]> = []
        for o in opened {
            let lacking = Set(try vault.missingChunks(o.manifest.chunks.map(\.id)))
            var mine: [[UInt8]] = []
            for ref in o.manifest.chunks where lacking.contains(ref.id) && asked.insert(ref.id).inserted {
                mine.append(ref.id)
                if !shared {
                    let bytes = Int(ref.length) + 64
                    if currentBytes + bytes > Self.fetchBytes, !current.isEmpty {
                        requests.append((current, nil))
                        current = []
                        currentBytes = 0
                    }
                    current.append(ref.id)
                    currentBytes += bytes
                }
            }
            if shared {
                for batch in mine.batches(of: Self.chunksPerSharedRequest) { requests.append((batch, o.need.fileID)) }
            }
        }
        if !current.isEmpty { requests.append((current, nil)) }
        let got = try await forEachConcurrently(requests, width: Self.bundleWidth) { [client] r in
            let chunks = try await client.getChunks(r.ids, via: r.via)
            for id in r.ids where chunks[id] == nil {
                throw SyncError.protocolError("the server did not send a requested chunk")
            }
            return chunks
        }
        var chunks: [[UInt8]: [UInt8]] = [:]
        for part in got { chunks.merge(part) { a, _ in a } }
        try vault.storeRemoteContents(
            opened.map { o in
                var mine: [[UInt8]: [UInt8]] = [:]
                for ref in o.manifest.chunks { if let c = chunks[ref.id] { mine[ref.id] = c } }
                return FetchedContent(need: o.need, manifest: o.manifest, sealedManifest: o.sealed, chunks: mine)
            })
        return chunks.count
    }

    /// Chunks one request asks for through a shared document (`via`), or on demand: about
    /// 64 MiB at 1 MiB chunks, well inside a reply's limit.
    static let chunksPerSharedRequest = 64
}

extension Array {
    /// The array in consecutive slices of at most `size` elements (the last may be shorter).
    func batches(of size: Int) -> [[Element]] {
        stride(from: 0, to: count, by: Swift.max(1, size)).map { Array(self[$0..<Swift.min(count, $0 + size)]) }
    }
}

extension SyncError {
    /// The server does not know the endpoint (an older server): the caller falls back.
    var isUnknownEndpoint: Bool {
        // A server answers an endpoint it does not have with 404 "no such endpoint" (405 for a
        // method), and a missing file's content with 404 too: told apart by the message.
        if case .server(let status, _, let message) = self {
            return status == 405 || (status == 404 && message == "no such endpoint")
        }
        return false
    }

    var isNotFound: Bool {
        if case .server(404, _, _) = self { return true }
        return false
    }
}

extension SyncEngine {
    /// Fetches the content of everything at or below `roots` this device lacks (`coffer pin`,
    /// and a store that stops keeping content on demand); returns the chunks fetched.
    public func fetchContent(under roots: [FileID]) async throws -> Int {
        try await fetch(try vault.contentNeeds(under: roots), shared: false)
    }

    /// What a store on demand fetches content through (`Vault.setRemoteContent`): this engine's
    /// client, blocking without Swift concurrency (`ServerTransport.sendBlocking`), so a FUSE
    /// thread, the CLI or a sync's own task can wait on it.
    public var contentSource: any RemoteContentSource { EngineContentSource(client: client) }
}

struct EngineContentSource: RemoteContentSource {
    let client: ServerClient

    func manifests(_ items: [(fileID: FileID, digest: [UInt8])]) throws -> [[UInt8]?] {
        try client.getManifestsBlocking(
            items.map { GetManifestRequest(fileID: Data($0.fileID.bytes), digest: Data($0.digest)) }
        ).map(\.sealed)
    }

    func chunks(_ ids: [[UInt8]], via: FileID?) throws -> [[UInt8]: [UInt8]] {
        var out: [[UInt8]: [UInt8]] = [:]
        for batch in ids.batches(of: SyncEngine.chunksPerSharedRequest) {
            out.merge(try client.getChunksBlocking(batch, via: via)) { a, _ in a }
        }
        return out
    }
}
