import CofferContent
import CofferCrypto
import CofferModel
import CofferStore
import Dispatch
import Synchronization

/// The shared state of one open document: every handle on the same file (two `open`s, the CLI's
/// writer) goes through one `OpenDocument`, so a write through one is seen by a read through
/// another.
///
/// Writes land in plaintext chunk buffers; past `Vault.writeBufferLimit` the buffered chunks are
/// sealed and stored (content before metadata) and only their ids stay in memory, so memory is
/// bounded whatever the file size. `flush` seals what is left, stores a new manifest and commits
/// the metadata that names it in one transaction: readers see the old or the new version, never
/// a mix. Chunks not touched since the last flush are never re-sealed.
///
/// Lock order: a document's lock may be held while taking the vault's, never the reverse; the
/// vault reads `currentSize`/`pendingMtime` through atomics for that reason.
public final class OpenDocument: Sendable {
    public let id: FileID
    let vault: Vault
    let state: Mutex<DocumentState>
    let sizeAtomic: Atomic<UInt64>
    let mtimeAtomic: Atomic<Int64>  // nanoseconds since the epoch of an unflushed write; 0 if none
    /// When the unflushed changes were last made (a write, a truncate, or a time, mode or owner
    /// set to ride along): the ctime the commit records, whatever mtime says (a `touch -d` into
    /// the future moves mtime, not ctime). 0 if none.
    let ctimeAtomic = Atomic<Int64>(0)
    /// An access time set while writes are unflushed (cp -a and tar set both times on the
    /// open file before closing it): it rides along with the content commit. 0 if none.
    let atimeAtomic = Atomic<Int64>(0)
    /// The last write or truncate through any handle, kept across commits (0 if none): what a
    /// file unlinked while open shows as its mtime, since no record takes it any more.
    let lastContentChangeAtomic = Atomic<Int64>(0)
    /// chmod/chown made while writes are unflushed: they ride along with the content commit
    /// (tar creates a file 0600, writes it, then sets its mode). -1 if none.
    let pendingModeAtomic = Atomic<Int64>(-1)
    let pendingUIDAtomic = Atomic<Int64>(-1)
    let pendingGIDAtomic = Atomic<Int64>(-1)
    /// Handles open on this document. Atomic so the vault's table of open documents never has
    /// to take the document's lock (which is held across commits).
    let openCount = Atomic<Int>(0)
    /// Entered while a background spill runs; `flush` waits on it before committing.
    let spills = DispatchGroup()
    /// Tests only: while set, a background spill waits on it after sealing and storing, before
    /// its refs replace the buffered chunks, so a test knows its writes and truncates land
    /// while the spill is running rather than hoping the timing works out.
    let spillHold = Mutex<DispatchSemaphore?>(nil)

    struct DocumentState {
        /// The key the chunks in `refs` are sealed with. It changes only while nothing is
        /// buffered: when a commit found the file's key rotated (`Vault.commitContent` sealed the
        /// content again under the new one) or another process's content under a new key is
        /// adopted; readers take it together with the refs they read.
        var cipher: ContentCipher
        var chunkSize: Int
        /// Stored chunks by index; nil means "all zeros" (a gap, or not yet written).
        var refs: [ChunkRef?]
        /// Plaintext of chunks changed since they were last stored; each has its expected length.
        var dirty: [Int: [UInt8]] = [:]
        var dirtyBytes = 0
        var size: UInt64
        var modified = false
        /// Recently opened chunks by chunk id. Ids name content, so an entry never goes stale;
        /// a few entries let the kernel's parallel read-ahead requests share their chunks.
        var cache = ChunkCache()
        var digest: [UInt8]?
        /// Set when a failed group commit took chunks this handle's buffers refer to: every
        /// later read, write or flush fails (EIO) instead of committing a manifest with holes.
        /// Full chunks a background spill is sealing and storing, by index. Until it swaps in
        /// their refs they are still the file's content (reads look here after `dirty`); a write
        /// or truncate that touches one takes it back into `dirty`, and the spill then drops
        /// its result for that index (the generation no longer matches).
        var sealing: [Int: (generation: UInt64, plain: [UInt8])] = [:]
        var spillGeneration: UInt64 = 0
        var spillInFlight = false
        /// A background spill's failure, reported by the next write or flush (its chunks went
        /// back to `dirty`, so nothing is lost).
        var spillError: (any Error)?
        /// Where the last read ended, and the chunks up to which a sequential run of reads has
        /// asked the store to prefetch (`readPieces`).
        var lastReadEnd: UInt64 = 0
        /// Whether the last read that loaded chunks followed the one before (`noteRead`).
        var readingInOrder = false
        var prefetchedThrough = 0
        /// Gaps the last commit built and hashed a zero chunk for: one per chunk length, however
        /// long the gap (the tests check that a sparse file is not hashed chunk by chunk).
        var holesHashed = 0

        /// How far ahead of a sequential reader the store is asked to prefetch chunks from disk.
        static let prefetchBytes: UInt64 = 8 << 20

        /// Notes a read of `[offset, end)` and returns the ids of the stored chunks to ask the
        /// store to start fetching from disk, if the read must load chunks from the store: in a
        /// sequential run of reads (from the file's start, or within `prefetchBytes` of where
        /// the last read ended, since the kernel's read-ahead requests may arrive out of order),
        /// this read's own chunks and the next `prefetchBytes`, each once per run; none for a
        /// random read. Only chunks large enough to live in pack files are worth asking for.
        mutating func noteRead(offset: UInt64, end: UInt64, loadsFromStore: Bool) -> [[UInt8]] {
            defer { lastReadEnd = end }
            guard loadsFromStore else { return [] }
            let chunk = UInt64(chunkSize)
            let sequential =
                offset == 0
                || (offset <= lastReadEnd + Self.prefetchBytes && offset + Self.prefetchBytes >= lastReadEnd)
            readingInOrder = sequential
            guard sequential else {
                prefetchedThrough = Int((end + chunk - 1) / chunk)
                return []
            }
            if offset == 0 { prefetchedThrough = 0 }  // reading from the start again
            // `end` is within the document, so far below overflow.
            let from = max(Int(offset / chunk), prefetchedThrough)
            let through = min(refs.count, Int((end + Self.prefetchBytes + chunk - 1) / chunk))
            guard from < through else { return [] }
            prefetchedThrough = through
            return (from..<through).compactMap { index in
                guard let ref = refToLoad(index), Int(ref.length) > OpenDocument.deferredSealingLimit else {
                    return nil
                }
                return ref.id
            }
        }

        /// Chunk `index`'s buffered plaintext, if any: a write's, else one being spilled.
        func buffered(_ index: Int) -> [UInt8]? { dirty[index] ?? sealing[index]?.plain }

        /// The committed chunk whose plaintext must be loaded from the store before chunk
        /// `index` can be read or patched: nil if it is buffered, cached, or was never stored.
        func refToLoad(_ index: Int) -> ChunkRef? {
            guard buffered(index) == nil, index < refs.count, let ref = refs[index], cache[ref.id] == nil else {
                return nil
            }
            return ref
        }

        /// The length chunk `index` has in a file of `size` bytes.
        func expectedLength(_ index: Int, size: UInt64) -> Int {
            let start = UInt64(index) * UInt64(chunkSize)
            guard size > start else { return 0 }
            return Int(min(UInt64(chunkSize), size - start))
        }

        /// Buffers `plain` as chunk `index`'s new content.
        mutating func setDirty(_ index: Int, _ plain: [UInt8]?) {
            dirtyBytes += (plain?.count ?? 0) - (dirty[index]?.count ?? 0)
            dirty[index] = plain
            sealing[index] = nil
        }
    }

    /// A small most-recently-used set of opened chunks.
    struct ChunkCache {
        static let capacity = 4  // 1 MiB of 256 KiB chunks per open document
        /// A plaintext may be a slice of the buffer its chunk was read and decrypted in.
        private var entries: [(id: [UInt8], plaintext: ArraySlice<UInt8>)] = []

        subscript(id: [UInt8]) -> ArraySlice<UInt8>? {
            entries.first(where: { $0.id == id })?.plaintext
        }

        mutating func insert(_ id: [UInt8], _ plaintext: ArraySlice<UInt8>) {
            entries.removeAll { $0.id == id }
            entries.append((id, plaintext))
            if entries.count > Self.capacity { entries.removeFirst(entries.count - Self.capacity) }
        }
    }

    static let readOnly = VaultError.denied(
        "permission denied: writing this file needs write access; it is shared read-only")
    static let lostWrites = VaultError.io("the store lost this file's unsaved writes (a commit failed); reopen it")

    /// Set when a failed group commit took this document's writes with it. An atomic of its own:
    /// a vault commit made inside this document's flush (under its lock) may poison it.
    private let poisonedAtomic = Atomic<Bool>(false)
    func poison() { poisonedAtomic.store(true, ordering: .relaxed) }
    var isPoisoned: Bool { poisonedAtomic.load(ordering: .relaxed) }

    /// Another account's document read through a read share: every write is refused (EACCES).
    public let isReadOnly: Bool
    /// Another account's document: its flush commits to the mirror's local layer.
    let isShared: Bool
    /// Where a shared document was when opened (the share's name, the folders below it, its
    /// name): where what it flushes is saved if its share goes while it is open.
    let sharedPlace: [String]

    init(
        id: FileID, vault: Vault, cipher: ContentCipher, manifest: Manifest, digest: [UInt8]?, readOnly: Bool = false,
        shared: Bool = false, sharedPlace: [String] = []
    ) {
        self.id = id
        self.isReadOnly = readOnly
        self.isShared = shared
        self.sharedPlace = sharedPlace
        self.vault = vault
        let size = manifest.size
        state = Mutex(
            DocumentState(
                cipher: cipher, chunkSize: Int(manifest.chunkSize), refs: manifest.chunks.map { Optional($0) },
                size: size, digest: digest))
        sizeAtomic = Atomic(size)
        mtimeAtomic = Atomic(0)
    }

    public var currentSize: UInt64 { sizeAtomic.load(ordering: .relaxed) }

    /// Mode, uid and gid set while writes are unflushed (nil each if none).
    public var pendingOwnership: (mode: UInt32?, uid: UInt32?, gid: UInt32?) {
        func read(_ a: borrowing Atomic<Int64>) -> UInt32? {
            let v = a.load(ordering: .relaxed)
            return v < 0 ? nil : UInt32(truncatingIfNeeded: v)
        }
        return (read(pendingModeAtomic), read(pendingUIDAtomic), read(pendingGIDAtomic))
    }

    var pendingMtime: Timespec? { Self.timespec(mtimeAtomic.load(ordering: .relaxed)) }

    /// The access time the next commit records, if one was set while writes were unflushed.
    var pendingAtime: Timespec? { Self.timespec(atimeAtomic.load(ordering: .relaxed)) }

    /// When content last changed through this document (see `lastContentChangeAtomic`).
    public var lastContentChange: Timespec? { Self.timespec(lastContentChangeAtomic.load(ordering: .relaxed)) }

    /// The change time of the unflushed changes, if any (see `ctimeAtomic`).
    var pendingCtime: Timespec? { Self.timespec(ctimeAtomic.load(ordering: .relaxed)) }

    /// The inverse of `nanoseconds`: before the epoch too, nanoseconds stay in 0..<10⁹.
    private static func timespec(_ n: Int64) -> Timespec? {
        guard n != 0 else { return nil }
        let (seconds, rest) = n.quotientAndRemainder(dividingBy: 1_000_000_000)
        return rest < 0
            ? Timespec(seconds: seconds - 1, nanoseconds: rest + 1_000_000_000)
            : Timespec(seconds: seconds, nanoseconds: rest)
    }

    /// Nanoseconds since the epoch, or nil if `t` does not fit (a time from the kernel can be
    /// any 64-bit second) or is the epoch itself, which the atomics use for "none".
    private static func nanoseconds(_ t: Timespec) -> Int64? {
        let (scaled, overflow) = t.seconds.multipliedReportingOverflow(by: 1_000_000_000)
        guard !overflow else { return nil }
        let (n, overflow2) = scaled.addingReportingOverflow(t.nanoseconds)
        return overflow2 || n == 0 ? nil : n
    }

    /// `nanoseconds` of the clock, which is always in range.
    private func nowNanoseconds() -> Int64 { Self.nanoseconds(vault.now()) ?? 0 }

    /// Under the lock, after a write, truncate or allocation: the content is unflushed, and its
    /// mtime and ctime are now.
    private func contentChanged(_ s: inout DocumentState) {
        s.modified = true
        sizeAtomic.store(s.size, ordering: .relaxed)
        let t = nowNanoseconds()
        mtimeAtomic.store(t, ordering: .relaxed)
        ctimeAtomic.store(t, ordering: .relaxed)
        lastContentChangeAtomic.store(t, ordering: .relaxed)
    }

    /// Records that an unflushed change was made now.
    private func changedNow() {
        ctimeAtomic.store(nowNanoseconds(), ordering: .relaxed)
    }

    // MARK: Reading

    /// Reads up to `count` bytes at `offset`; fewer at the end of the file.
    public func read(offset: UInt64, count: Int) throws -> [UInt8] {
        let pieces = try readPieces(offset: offset, count: count)
        if pieces.count == 1 { return Array(pieces[0]) }
        var out: [UInt8] = []
        out.reserveCapacity(pieces.reduce(0) { $0 + $1.count })
        for piece in pieces { out.append(contentsOf: piece) }
        return out
    }

    /// What `read` returns, as consecutive pieces of the chunks' own plaintext (and zeros for
    /// gaps), without copying them into one buffer: the FUSE bridge replies with the pieces as
    /// they are. A 1 MiB read-ahead request spans four chunks, and building one zero-filled
    /// buffer and copying each chunk into it cost a memset and a memcpy of every byte read.
    ///
    /// The lock is held only to plan the read: chunks still to be loaded are fetched, opened
    /// and decompressed outside it, so parallel reads (the kernel's read-ahead) proceed side by
    /// side instead of queueing behind one another's decryption.
    public func readPieces(offset: UInt64, count: Int) throws -> [ArraySlice<UInt8>] {
        var pieces: [ArraySlice<UInt8>] = []
        var loads: [(ref: ChunkRef, piece: Int, within: Int, take: Int)] = []
        var prefetch: [[UInt8]] = []
        var cipher: ContentCipher?
        try state.withLock { s in
            cipher = s.cipher
            if isPoisoned { throw Self.lostWrites }
            guard offset < s.size, count > 0 else { return }
            let end = min(s.size, offset + UInt64(count))
            for (index, within, take) in ChunkSpans(from: offset, to: end, chunkSize: s.chunkSize) {
                if let d = s.buffered(index) {
                    pieces.append(Self.piece(of: d, within, take))
                } else if index < s.refs.count, let ref = s.refs[index] {
                    if let plain = s.cache[ref.id] {
                        pieces.append(Self.piece(of: plain, within, take))
                    } else {
                        loads.append((ref, pieces.count, within, take))
                        pieces.append([])
                    }
                } else {
                    pieces.append(ArraySlice(repeating: 0, count: take))  // a gap
                }
            }
            prefetch = s.noteRead(offset: offset, end: end, loadsFromStore: !loads.isEmpty)
        }
        guard !loads.isEmpty, let cipher else { return pieces }
        try fetchIfLacking(loads.map(\.ref), cipher: cipher)
        vault.store.prefetch(prefetch)
        var unique: [ChunkRef] = []
        var seen: Set<[UInt8]> = []
        for load in loads where seen.insert(load.ref.id).inserted { unique.append(load.ref) }
        let opened = try ParallelChunks.open(unique, with: cipher) { try vault.store.chunk($0) }
        state.withLock { s in for (id, plain) in opened { s.cache.insert(id, plain) } }
        for load in loads {
            // An opened chunk has its ref's length; a missing one cannot happen (open throws).
            pieces[load.piece] = Self.piece(of: opened[load.ref.id] ?? [], load.within, load.take)
        }
        return pieces
    }

    /// Chunks a read needs that this device does not hold (a store on demand): fetched before
    /// the read goes on, with the chunks after them when the reader goes through the file in
    /// order (`onDemandAhead` of them), so a sequential reader waits once per few megabytes,
    /// not once per chunk. Without a server to ask, nothing happens and the read fails as a
    /// missing chunk always has.
    func fetchIfLacking(_ refs: [ChunkRef], cipher: ContentCipher) throws {
        let lacking = try vault.store.read { r in try refs.filter { try !r.hasChunk($0.id) } }
        guard !lacking.isEmpty, vault.remoteContent.withLock({ $0 != nil }) else { return }
        var wanted = lacking
        let ahead = state.withLock { s -> [ChunkRef] in
            guard s.readingInOrder, let last = lacking.last, let index = s.refs.lastIndex(where: { $0?.id == last.id })
            else { return [] }
            return s.refs[(index + 1)..<min(s.refs.count, index + 1 + Self.onDemandAhead)].compactMap { $0 }
        }
        if !ahead.isEmpty {
            wanted += try vault.store.read { r in try ahead.filter { try !r.hasChunk($0.id) } }
        }
        try vault.fetchChunks(wanted, of: id, cipher: cipher, via: isShared ? id : nil)
    }

    /// Chunks fetched past what a sequential read asked for, on demand.
    static let onDemandAhead = 8

    /// `take` bytes of a chunk's plaintext from `within`, without a copy; past the plaintext's
    /// end (a chunk stored before a truncate up) the bytes read as zeros.
    static func piece<C: RandomAccessCollection<UInt8>>(of plain: C, _ within: Int, _ take: Int) -> ArraySlice<UInt8>
    where C.Index == Int, C.SubSequence == ArraySlice<UInt8> {
        let start = plain.startIndex
        if within + take <= plain.count { return plain[(start + within)..<(start + within + take)] }
        var padded = Array(plain[(start + min(within, plain.count))...])
        padded.append(contentsOf: repeatElement(0, count: take - padded.count))
        return padded[...]
    }

    static func checkSize(_ offset: UInt64, plus count: UInt64) throws {
        guard offset <= Vault.maxDocumentSize, count <= Vault.maxDocumentSize - offset else {
            throw VaultError.tooLarge("a document can hold at most \(Vault.maxDocumentSize >> 30) GiB")
        }
    }

    func expectedLength(_ index: Int, _ s: DocumentState) -> Int {
        s.expectedLength(index, size: s.size)
    }

    /// The current plaintext of chunk `index`, sized for the current file size (zero-padded
    /// after a truncate up or a write past the end).
    func plaintext(_ index: Int, _ s: inout DocumentState) throws -> [UInt8] {
        let expected = expectedLength(index, s)
        if let d = s.buffered(index) { return fitted(d, expected) }
        if let ref = index < s.refs.count ? s.refs[index] : nil, let c = s.cache[ref.id] {
            return fitted(Array(c), expected)
        }
        guard index < s.refs.count, let ref = s.refs[index] else { return [UInt8](repeating: 0, count: expected) }
        if try !vault.store.readOne({ try $0.hasChunk(ref.id) }) {
            try vault.fetchChunks([ref], of: id, cipher: s.cipher, via: isShared ? id : nil)
        }
        guard let sealed = try vault.store.chunk(ref.id) else {
            throw ContentError.missingChunk(hexString(Array(ref.id.prefix(8))))
        }
        let plain = try s.cipher.openChunk(sealed, ref: ref, verifyingID: false)
        s.cache.insert(ref.id, plain[...])
        return fitted(plain, expected)
    }

    func fitted(_ b: [UInt8], _ length: Int) -> [UInt8] {
        if b.count == length { return b }
        if b.count > length { return Array(b[0..<length]) }
        return b + [UInt8](repeating: 0, count: length - b.count)
    }

    // MARK: Writing

    /// Writes `bytes` at `offset`, extending the file (a gap reads as zeros).
    public func write(offset: UInt64, bytes: UnsafeRawBufferPointer) throws {
        if isReadOnly { throw Self.readOnly }
        guard bytes.count > 0 else { return }
        try Self.checkSize(offset, plus: UInt64(bytes.count))
        try state.withLock { s in
            if isPoisoned { throw Self.lostWrites }
            if let e = s.spillError {
                s.spillError = nil
                throw e
            }
            let end = offset + UInt64(bytes.count)
            if end > s.size { s.size = end }
            var consumed = 0
            for (index, within, take) in ChunkSpans(from: offset, to: end, chunkSize: s.chunkSize) {
                var chunk: [UInt8]
                if within == 0 && take == expectedLength(index, s) {
                    // Fully overwritten: built from the written bytes alone (no read, no zero fill).
                    chunk = [UInt8](UnsafeRawBufferPointer(rebasing: bytes[consumed..<(consumed + take)]))
                } else {
                    chunk = try plaintext(index, &s)
                    chunk.withUnsafeMutableBytes { dst in
                        guard let d = dst.baseAddress, let src = bytes.baseAddress else { return }
                        (d + within).copyMemory(from: src + consumed, byteCount: take)
                    }
                }
                s.setDirty(index, chunk)
                consumed += take
            }
            contentChanged(&s)
            if s.dirtyBytes > Vault.writeBufferLimit {
                // One spill runs behind the writer at a time; past that, the writer seals
                // itself, which bounds buffered memory at about two limits.
                if s.spillInFlight { try spill(&s) } else { startSpill(&s) }
            }
        }
    }

    public func write(offset: UInt64, bytes: [UInt8]) throws {
        try bytes.withUnsafeBytes { try write(offset: offset, bytes: $0) }
    }

    /// Sets the size (truncate up or down). A truncate to the size the file has changes
    /// nothing, unless `touchingTimes` (open's O_TRUNC, which POSIX says marks mtime and ctime
    /// whatever the size was).
    public func truncate(to newSize: UInt64, touchingTimes: Bool = false) throws {
        if isReadOnly { throw Self.readOnly }
        try Self.checkSize(newSize, plus: 0)
        try state.withLock { s in
            if isPoisoned { throw Self.lostWrites }
            guard newSize != s.size || touchingTimes else { return }
            if newSize < s.size {
                let keep = Int((newSize + UInt64(s.chunkSize) - 1) / UInt64(s.chunkSize))
                let lastIndex = keep - 1
                var lastPlain: [UInt8]? = nil
                if lastIndex >= 0 && newSize % UInt64(s.chunkSize) != 0 {
                    lastPlain = try plaintext(lastIndex, &s)
                }
                if s.refs.count > keep { s.refs.removeLast(s.refs.count - keep) }
                for k in Set(s.dirty.keys).union(s.sealing.keys) where k >= keep { s.setDirty(k, nil) }
                s.size = newSize
                if let lastPlain {
                    let cut = fitted(lastPlain, expectedLength(lastIndex, s))
                    s.setDirty(lastIndex, cut)
                }
            } else {
                s.size = newSize
            }
            contentChanged(&s)
        }
    }

    /// fallocate mode 0: the file grows to `end` if it is shorter (the new range reads as zeros),
    /// and either way mtime and ctime are marked, as ext4's fallocate does. Decided under the
    /// lock, so a write that extends the file meanwhile is never cut back.
    public func allocate(upTo end: UInt64) throws {
        if isReadOnly { throw Self.readOnly }
        try Self.checkSize(end, plus: 0)
        try state.withLock { s in
            if isPoisoned { throw Self.lostWrites }
            s.size = max(s.size, end)
            contentChanged(&s)
        }
    }

    /// Buffered chunks worth spilling: all but a partly filled last one.
    private func fullChunks(_ s: DocumentState) -> [(key: Int, value: [UInt8])] {
        let last = s.size == 0 ? -1 : Int((s.size - 1) / UInt64(s.chunkSize))
        return s.dirty.filter { !($0.key == last && $0.value.count < s.chunkSize) }.sorted { $0.key < $1.key }
    }

    /// Seals plaintext chunks on every core and stores them (content before any manifest
    /// names it); what a spill does, inline or in the background.
    private func sealAndStore(_ plaintexts: [[UInt8]], with cipher: ContentCipher) throws -> [ChunkRef] {
        let sealed = ParallelChunks.seal(plaintexts, with: cipher)
        try vault.store.write { w in try w.putChunks(sealed.map { ($0.ref.id, $0.sealed) }) }
        return sealed.map(\.ref)
    }

    /// Seals and stores buffered chunks now, keeping only ids.
    func spill(_ s: inout DocumentState) throws {
        let full = fullChunks(s)
        guard !full.isEmpty else { return }
        let refs = try sealAndStore(full.map { fitted($0.value, expectedLength($0.key, s)) }, with: s.cipher)
        for (chunk, ref) in zip(full, refs) {
            while s.refs.count <= chunk.key { s.refs.append(nil) }
            s.refs[chunk.key] = ref
            s.setDirty(chunk.key, nil)
        }
    }

    /// Hands the buffered full chunks to a background spill and returns at once, so a long
    /// write's next requests arrive while these are sealed (sealing is most of a write's CPU,
    /// and the writer used to wait for all of it every 16 MiB). Content is stored before any
    /// manifest names it, as with `spill`; `flush` waits for the spill before committing.
    func startSpill(_ s: inout DocumentState) {
        let full = fullChunks(s)
        guard !full.isEmpty else { return }
        s.spillGeneration &+= 1
        let generation = s.spillGeneration
        let items = full.map { (index: $0.key, plain: fitted($0.value, expectedLength($0.key, s))) }
        for item in items {
            s.setDirty(item.index, nil)
            s.sealing[item.index] = (generation, item.plain)
        }
        s.spillInFlight = true
        let cipher = s.cipher
        spills.enter()
        DispatchQueue.global().async { [self] in
            defer { spills.leave() }
            do {
                let refs = try sealAndStore(items.map(\.plain), with: cipher)
                spillHold.withLock { $0 }?.wait()
                state.withLock { s in
                    for (item, ref) in zip(items, refs) where s.sealing[item.index]?.generation == generation {
                        while s.refs.count <= item.index { s.refs.append(nil) }
                        s.refs[item.index] = ref
                        s.sealing[item.index] = nil
                    }
                    s.spillInFlight = false
                }
            } catch {
                state.withLock { s in
                    for item in items where s.sealing[item.index]?.generation == generation {
                        s.setDirty(item.index, item.plain)
                    }
                    s.spillError = error
                    s.spillInFlight = false
                }
            }
        }
    }

    /// Waits until no background spill is running (tests use it to observe stored chunks).
    func waitForSpills() { spills.wait() }

    /// What a caller is about to do with the document, for `mayTakeLong`.
    public enum Access: Sendable, Equatable {
        /// `flush`: commit what is buffered.
        case commit
        case read(offset: UInt64, count: Int)
        /// `write`, at the end of the file with `appending`.
        case write(offset: UInt64, count: Int, appending: Bool)
    }

    /// Whether `access` may block for long. A guess that never blocks, for the FUSE reader
    /// (`FileSystemOperations.mayTakeLong`): closing, reading or writing a small file answers
    /// false. Any access waiting for another thread holding this document answers true.
    /// - commit: a megabyte or more to seal, a large manifest to assemble, or a spill to wait for;
    /// - write: it would start or wait for a spill, or read a committed chunk back from the store
    ///   to patch it (untar's writes, new files a record of tar's buffer at a time, do not);
    /// - read: a chunk it must load may live in a pack file (a read from disk of up to 256 KiB),
    ///   or the store's reads wait for its writer (a group is open); a chunk small enough to live
    ///   in a store row (md5sum of a source tree: nearly every file) is one query.
    public func mayTakeLong(_ access: Access) -> Bool {
        switch access {
        case .read(_, let count), .write(_, let count, _): if count <= 0 { return false }
        case .commit: break
        }
        return state.withLockIfAvailable { s in
            switch access {
            case .commit:
                return s.modified
                    && (s.dirtyBytes >= 1 << 20 || s.spillInFlight || !s.sealing.isEmpty || s.refs.count >= 256)
            case .write(let offset, let count, let appending):
                if s.spillInFlight || s.dirtyBytes + count > Vault.writeBufferLimit { return true }
                let start = appending ? s.size : offset
                let (end, overflow) = start.addingReportingOverflow(UInt64(count))
                if overflow { return true }
                let sizeAfter = max(s.size, end)
                // As `write` decides: a chunk it overwrites whole is built from the new bytes; any
                // other needs its current plaintext, from a buffer, the cache or the store.
                return ChunkSpans(from: start, to: end, chunkSize: s.chunkSize).contains { index, within, take in
                    !(within == 0 && take == s.expectedLength(index, size: sizeAfter)) && s.refToLoad(index) != nil
                }
            case .read(let offset, let count):
                guard offset < s.size else { return false }
                let loads = ChunkSpans(from: offset, to: min(s.size, offset &+ UInt64(count)), chunkSize: s.chunkSize)
                    .compactMap { index, _, _ in s.refToLoad(index) }
                return loads.contains { Int($0.length) > Self.deferredSealingLimit }
                    || (!loads.isEmpty && vault.store.readsGoThroughWriter)
            }
        } ?? true
    }

    /// Whether a background spill holds chunks of this document right now (for tests).
    var isSpilling: Bool { state.withLock { $0.spillInFlight } }

    /// Makes the current content the file's committed version. With `durable`, also waits until
    /// it is on the device's disk (fsync).
    public func flush(durable: Bool = false) throws {
        // A spill that finishes first leaves refs to reuse; one started after this wait (another
        // handle writing) is taken back by `commit`, which seals its chunks itself.
        spills.wait()
        try state.withLock { s in
            if isPoisoned { throw Self.lostWrites }
            if let e = s.spillError {
                s.spillError = nil
                throw e
            }
            if s.modified {
                try commit(&s)
            }
        }
        if durable { try vault.store.makeDurable() }
    }

    /// The largest changed chunk a commit leaves to the store to seal (its sealed form stays
    /// under the store's 64 KiB threshold, so it is appended to the current pack).
    static let deferredSealingLimit = 48 * 1024

    private func commit(_ s: inout DocumentState) throws {
        let cipher = s.cipher
        for (index, w) in s.sealing { s.setDirty(index, w.plain) }
        let count = s.size == 0 ? 0 : Int((s.size - 1) / UInt64(s.chunkSize)) + 1
        if s.refs.count > count { s.refs.removeLast(s.refs.count - count) }
        var refs: [ChunkRef] = []
        refs.reserveCapacity(count)
        var pending: [[UInt8]: [UInt8]] = [:]
        var pendingBytes = 0
        // Small chunks whose sealing the store runs with the commit's statements (id → plaintext).
        var unsealed: [[UInt8]: [UInt8]] = [:]
        var sealedByID: [[UInt8]: ChunkRef] = [:]
        var zeroRefs: [Int: ChunkRef] = [:]  // by length: holes share one sealed zero chunk
        s.holesHashed = 0
        func store() throws {
            for (chunkID, plain) in unsealed { pending[chunkID] = cipher.sealChunk(plain, id: chunkID).1 }
            unsealed = [:]
            guard !pending.isEmpty else { return }
            let items = pending
            try vault.store.write { w in try w.putChunks(items.map { ($0.key, $0.value) }) }
            pending = [:]
            pendingBytes = 0
        }
        // Changed chunks are sealed up front, on every core; the loop below only assembles. A
        // single small one (all of a small file, usually) only gets its id here: the store seals
        // it later, off this request (`Vault.commitContent`'s `unsealed`).
        let changed = s.dirty.keys.filter { $0 < count }.sorted()
        let changedPlain = changed.map { fitted(s.dirty[$0] ?? [], expectedLength($0, s)) }
        var presealed: [Int: (ref: ChunkRef, sealed: [UInt8])] = [:]
        var deferred: (index: Int, ref: ChunkRef, plain: [UInt8])?
        if changed.count == 1, changedPlain[0].count <= Self.deferredSealingLimit {
            let plain = changedPlain[0]
            deferred = (
                changed[0], ChunkRef(id: plain.withUnsafeBytes { cipher.chunkID($0) }, length: UInt32(plain.count)),
                plain
            )
        } else {
            presealed = Dictionary(uniqueKeysWithValues: zip(changed, ParallelChunks.seal(changedPlain, with: cipher)))
        }
        for index in 0..<count {
            let expected = expectedLength(index, s)
            if s.dirty[index] == nil, index < s.refs.count, let r = s.refs[index], Int(r.length) == expected {
                refs.append(r)
                continue
            }
            if let d = deferred, d.index == index {
                if let known = sealedByID[d.ref.id] {
                    refs.append(known)
                    continue
                }  // equal to a hole sealed above
                sealedByID[d.ref.id] = d.ref
                unsealed[d.ref.id] = d.plain
                refs.append(d.ref)
                continue
            }
            let isHole = s.dirty[index] == nil && (index >= s.refs.count || s.refs[index] == nil)
            if isHole, let zero = zeroRefs[expected] {
                refs.append(zero)
                continue
            }  // a sparse file's gap
            // A changed chunk was sealed above; a hole or a chunk cut by a truncate is sealed
            // here, only if no equal chunk was sealed already.
            let id: [UInt8]
            let seal: () -> (ChunkRef, [UInt8])
            if let (ref, sealed) = presealed[index] {
                id = ref.id
                seal = { (ref, sealed) }
            } else {
                let plain = try plaintext(index, &s)
                if isHole { s.holesHashed += 1 }
                id = plain.withUnsafeBytes { cipher.chunkID($0) }
                seal = { [cipher] in cipher.sealChunk(plain, id: id) }
            }
            if let known = sealedByID[id] {
                if isHole { zeroRefs[expected] = known }
                refs.append(known)
                continue
            }
            let (ref, sealed) = seal()
            sealedByID[id] = ref
            if isHole { zeroRefs[expected] = ref }
            pending[ref.id] = sealed
            pendingBytes += sealed.count
            refs.append(ref)
            if pendingBytes > 16 << 20 { try store() }
        }
        // What is left (all of a small file) goes in the same commit as the manifest.
        let manifest = Manifest(chunkSize: UInt32(s.chunkSize), chunks: refs)
        let now = vault.now()
        let mtime = pendingMtime ?? now
        let committed =
            isShared
            ? try vault.commitSharedContent(
                id: id, cipher: cipher, manifest: manifest, mtime: mtime, ctime: pendingCtime ?? now,
                chunks: pending, unsealed: unsealed, ownership: pendingOwnership, atime: pendingAtime,
                place: sharedPlace)
            : try vault.commitContent(
                id: id, cipher: cipher, manifest: manifest, mtime: mtime, ctime: pendingCtime ?? now,
                chunks: pending, unsealed: unsealed,
                ownership: pendingOwnership, atime: pendingAtime)
        let digest = committed?.digest
        // Not committed (the file was unlinked while open): the chunks must still be stored,
        // since this handle's chunk list now names them.
        if digest == nil { try store() }
        s.refs = refs.map { Optional($0) }
        if let (rotated, resealed) = committed?.resealed {
            // The file's key was rotated while it was open: what was committed is under the
            // new key, and so is everything this document writes from now on.
            s.cipher = rotated
            s.refs = resealed.chunks.map { Optional($0) }
        }
        s.dirty = [:]
        s.dirtyBytes = 0
        s.modified = false
        s.digest = digest ?? s.digest
        mtimeAtomic.store(0, ordering: .relaxed)
        ctimeAtomic.store(0, ordering: .relaxed)
        atimeAtomic.store(0, ordering: .relaxed)
        pendingModeAtomic.store(-1, ordering: .relaxed)
        pendingUIDAtomic.store(-1, ordering: .relaxed)
        pendingGIDAtomic.store(-1, ordering: .relaxed)
    }

    /// Another process committed new content: adopt it unless this handle has unflushed writes
    /// (then this handle's flush will win, as the later writer).
    ///
    /// `seen` is the digest this document had when the caller read the file's record: if the
    /// document committed since, its own commit is newer than what the caller read.
    func adopt(manifest: Manifest, digest: [UInt8], cipher: ContentCipher, seen: [UInt8]?) {
        state.withLock { s in
            guard !s.modified, s.digest != digest, s.digest == seen else { return }
            s.cipher = cipher
            // The other writer's chunk size (any the format allows; a device of another build
            // may have chosen another): the refs map offsets to chunks by it.
            s.chunkSize = Int(manifest.chunkSize)
            s.refs = manifest.chunks.map { Optional($0) }
            s.lastReadEnd = 0
            s.prefetchedThrough = 0
            s.size = manifest.size
            s.digest = digest
            sizeAtomic.store(s.size, ordering: .relaxed)
        }
    }

    /// Whether there are unflushed writes.
    public var isModified: Bool { state.withLock { $0.modified } }

    /// The digest of the version this document last committed or adopted.
    var committedDigest: [UInt8]? { state.withLock { $0.digest } }

    /// Sets the mode, uid and gid the next commit records, if there are unflushed writes to
    /// carry them; returns false (and changes nothing) otherwise.
    public func setPendingOwnership(mode: UInt32?, uid: UInt32?, gid: UInt32?) -> Bool {
        state.withLock { s in
            guard s.modified, !isPoisoned else { return false }
            if let mode { pendingModeAtomic.store(Int64(mode & 0o7777), ordering: .relaxed) }
            if let uid { pendingUIDAtomic.store(Int64(uid), ordering: .relaxed) }
            if let gid { pendingGIDAtomic.store(Int64(gid), ordering: .relaxed) }
            changedNow()
            return true
        }
    }

    /// Sets the modification and access times given that the next commit records, if there are
    /// unflushed writes to carry them; returns false (and changes nothing) otherwise, or if a
    /// time is one this cannot hold (the epoch itself, or outside about 1677 to 2262).
    public func setPendingTimes(modification mtime: Timespec?, access atime: Timespec?) -> Bool {
        var m: Int64?
        var a: Int64?
        if let mtime {
            guard let n = Self.nanoseconds(mtime) else { return false }
            m = n
        }
        if let atime {
            guard let n = Self.nanoseconds(atime) else { return false }
            a = n
        }
        return state.withLock { s in
            guard s.modified, !isPoisoned else { return false }
            if let m { mtimeAtomic.store(m, ordering: .relaxed) }
            if let a { atimeAtomic.store(a, ordering: .relaxed) }
            changedNow()
            return true
        }
    }
}

/// The chunks a byte range `[start, end)` of a document touches, in order: each chunk's index,
/// where in the chunk the range begins, and how many of its bytes the range covers. The walk
/// reading, writing and the FUSE reader's guesses share.
struct ChunkSpans: Sequence, IteratorProtocol {
    private let chunkSize: UInt64
    private var position: UInt64
    private let end: UInt64

    init(from start: UInt64, to end: UInt64, chunkSize: Int) {
        self.chunkSize = UInt64(chunkSize)
        self.position = start
        self.end = end
    }

    mutating func next() -> (index: Int, within: Int, take: Int)? {
        guard position < end else { return nil }
        let index = position / chunkSize
        let within = position - index * chunkSize
        let take = Swift.min(chunkSize - within, end - position)
        position += take
        return (Int(index), Int(within), Int(take))
    }
}
