import CofferContent
import CofferCrypto
import CofferModel
import CofferStore
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
    let cipher: ContentCipher
    let state: Mutex<DocumentState>
    let sizeAtomic: Atomic<UInt64>
    let mtimeAtomic: Atomic<Int64> // nanoseconds since the epoch of an unflushed write; 0 if none
    /// Handles open on this document. Atomic so the vault's table of open documents never has
    /// to take the document's lock (which is held across commits).
    let openCount = Atomic<Int>(0)

    struct DocumentState {
        var chunkSize: Int
        /// Stored chunks by index; nil means "all zeros" (a gap, or not yet written).
        var refs: [ChunkRef?]
        /// Plaintext of chunks changed since they were last stored; each has its expected length.
        var dirty: [Int: [UInt8]] = [:]
        var dirtyBytes = 0
        var size: UInt64
        var modified = false
        var cache: (index: Int, plaintext: [UInt8])?
        var digest: [UInt8]?
        /// Set when a failed group commit took chunks this handle's buffers refer to: every
        /// later read, write or flush fails (EIO) instead of committing a manifest with holes.
        var poisoned = false
    }

    func poison() { state.withLock { $0.poisoned = true } }

    init(id: FileID, vault: Vault, cipher: ContentCipher, manifest: Manifest, digest: [UInt8]?) {
        self.id = id
        self.vault = vault
        self.cipher = cipher
        let size = manifest.size
        state = Mutex(DocumentState(chunkSize: Int(manifest.chunkSize), refs: manifest.chunks.map { Optional($0) }, size: size, digest: digest))
        sizeAtomic = Atomic(size)
        mtimeAtomic = Atomic(0)
    }

    public var currentSize: UInt64 { sizeAtomic.load(ordering: .relaxed) }

    var pendingMtime: Timespec? {
        let n = mtimeAtomic.load(ordering: .relaxed)
        return n == 0 ? nil : Timespec(seconds: n / 1_000_000_000, nanoseconds: n % 1_000_000_000)
    }

    // MARK: Reading

    /// Reads up to `count` bytes at `offset`; fewer at the end of the file.
    public func read(offset: UInt64, count: Int) throws -> [UInt8] {
        try state.withLock { s in
            if s.poisoned { throw VaultError.io("the store lost this file's unsaved writes (a commit failed); reopen it") }
            guard offset < s.size, count > 0 else { return [] }
            let end = min(s.size, offset + UInt64(count))
            var out: [UInt8] = []
            out.reserveCapacity(Int(end - offset))
            var pos = offset
            while pos < end {
                let index = Int(pos / UInt64(s.chunkSize))
                let chunk = try plaintext(index, &s)
                let within = Int(pos - UInt64(index) * UInt64(s.chunkSize))
                let take = min(chunk.count - within, Int(end - pos))
                guard take > 0 else { break }
                out.append(contentsOf: chunk[within..<(within + take)])
                pos += UInt64(take)
            }
            return out
        }
    }

    func expectedLength(_ index: Int, _ s: DocumentState) -> Int {
        let start = UInt64(index) * UInt64(s.chunkSize)
        guard s.size > start else { return 0 }
        return Int(min(UInt64(s.chunkSize), s.size - start))
    }

    /// The current plaintext of chunk `index`, sized for the current file size (zero-padded
    /// after a truncate up or a write past the end).
    func plaintext(_ index: Int, _ s: inout DocumentState) throws -> [UInt8] {
        let expected = expectedLength(index, s)
        if let d = s.dirty[index] { return fitted(d, expected) }
        if let c = s.cache, c.index == index { return fitted(c.plaintext, expected) }
        guard index < s.refs.count, let ref = s.refs[index] else { return [UInt8](repeating: 0, count: expected) }
        guard let sealed = try vault.store.read({ try $0.chunk(ref.id) }) else {
            throw ContentError.missingChunk(hexString(Array(ref.id.prefix(8))))
        }
        let plain = try cipher.openChunk(sealed, ref: ref, verifyingID: false)
        s.cache = (index, plain)
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
        guard bytes.count > 0 else { return }
        try state.withLock { s in
            if s.poisoned { throw VaultError.io("the store lost this file's unsaved writes (a commit failed); reopen it") }
            let end = offset + UInt64(bytes.count)
            if end > s.size { s.size = end }
            var pos = offset
            var consumed = 0
            while pos < end {
                let index = Int(pos / UInt64(s.chunkSize))
                let within = Int(pos - UInt64(index) * UInt64(s.chunkSize))
                let take = min(s.chunkSize - within, Int(end - pos))
                var chunk: [UInt8]
                if within == 0 && take == expectedLength(index, s) {
                    chunk = [UInt8](repeating: 0, count: take) // fully overwritten: no need to read it
                } else {
                    chunk = try plaintext(index, &s)
                }
                chunk.withUnsafeMutableBytes { dst in
                    guard let d = dst.baseAddress, let src = bytes.baseAddress else { return }
                    (d + within).copyMemory(from: src + consumed, byteCount: take)
                }
                if let old = s.dirty[index] { s.dirtyBytes -= old.count }
                s.dirty[index] = chunk
                s.dirtyBytes += chunk.count
                if s.cache?.index == index { s.cache = nil }
                pos += UInt64(take)
                consumed += take
            }
            s.modified = true
            sizeAtomic.store(s.size, ordering: .relaxed)
            let t = vault.now()
            mtimeAtomic.store(t.seconds * 1_000_000_000 + t.nanoseconds, ordering: .relaxed)
            if s.dirtyBytes > Vault.writeBufferLimit { try spill(&s) }
        }
    }

    public func write(offset: UInt64, bytes: [UInt8]) throws {
        try bytes.withUnsafeBytes { try write(offset: offset, bytes: $0) }
    }

    /// Sets the size (truncate up or down).
    public func truncate(to newSize: UInt64) throws {
        try state.withLock { s in
            if s.poisoned { throw VaultError.io("the store lost this file's unsaved writes (a commit failed); reopen it") }
            guard newSize != s.size else { return }
            if newSize < s.size {
                let keep = Int((newSize + UInt64(s.chunkSize) - 1) / UInt64(s.chunkSize))
                let lastIndex = keep - 1
                var lastPlain: [UInt8]? = nil
                if lastIndex >= 0 && newSize % UInt64(s.chunkSize) != 0 {
                    lastPlain = try plaintext(lastIndex, &s)
                }
                if s.refs.count > keep { s.refs.removeLast(s.refs.count - keep) }
                for k in s.dirty.keys where k >= keep {
                    s.dirtyBytes -= s.dirty[k]?.count ?? 0
                    s.dirty[k] = nil
                }
                s.cache = nil
                s.size = newSize
                if let lastPlain {
                    let cut = fitted(lastPlain, expectedLength(lastIndex, s))
                    s.dirtyBytes += cut.count - (s.dirty[lastIndex]?.count ?? 0)
                    s.dirty[lastIndex] = cut
                }
            } else {
                s.size = newSize
            }
            s.modified = true
            sizeAtomic.store(s.size, ordering: .relaxed)
            let t = vault.now()
            mtimeAtomic.store(t.seconds * 1_000_000_000 + t.nanoseconds, ordering: .relaxed)
        }
    }

    /// Seals and stores buffered chunks (all but a partly filled last one), keeping only ids.
    func spill(_ s: inout DocumentState) throws {
        let last = s.size == 0 ? -1 : Int((s.size - 1) / UInt64(s.chunkSize))
        var batch: [(Int, ChunkRef, [UInt8])] = []
        for (index, plain) in s.dirty where !(index == last && plain.count < s.chunkSize) {
            let (ref, sealed) = cipher.sealChunk(fitted(plain, expectedLength(index, s)))
            batch.append((index, ref, sealed))
        }
        guard !batch.isEmpty else { return }
        try vault.store.write { w in
            for (_, ref, sealed) in batch { try w.putChunk(id: ref.id, sealed: sealed) }
        }
        for (index, ref, _) in batch {
            while s.refs.count <= index { s.refs.append(nil) }
            s.refs[index] = ref
            s.dirtyBytes -= s.dirty[index]?.count ?? 0
            s.dirty[index] = nil
        }
    }

    /// Makes the current content the file's committed version. With `durable`, also waits until
    /// it is on the device's disk (fsync).
    public func flush(durable: Bool = false) throws {
        try state.withLock { s in
            if s.poisoned { throw VaultError.io("the store lost this file's unsaved writes (a commit failed); reopen it") }
            if s.modified {
                try commit(&s)
            }
        }
        if durable { try vault.store.makeDurable() }
    }

    private func commit(_ s: inout DocumentState) throws {
        let count = s.size == 0 ? 0 : Int((s.size - 1) / UInt64(s.chunkSize)) + 1
        if s.refs.count > count { s.refs.removeLast(s.refs.count - count) }
        var refs: [ChunkRef] = []
        refs.reserveCapacity(count)
        var pending: [[UInt8]: [UInt8]] = [:]
        var pendingBytes = 0
        var sealedByID: [[UInt8]: ChunkRef] = [:]
        func store() throws {
            guard !pending.isEmpty else { return }
            let items = pending
            try vault.store.write { w in for (id, sealed) in items { try w.putChunk(id: id, sealed: sealed) } }
            pending = [:]
            pendingBytes = 0
        }
        for index in 0..<count {
            let expected = expectedLength(index, s)
            if s.dirty[index] == nil, index < s.refs.count, let r = s.refs[index], Int(r.length) == expected {
                refs.append(r)
                continue
            }
            let plain = try plaintext(index, &s)
            let id = plain.withUnsafeBytes { cipher.chunkID($0) }
            if let known = sealedByID[id] { refs.append(known); continue } // e.g. zero-filled gaps
            let (ref, sealed) = plain.withUnsafeBytes { cipher.sealChunk($0, id: id) }
            sealedByID[id] = ref
            pending[ref.id] = sealed
            pendingBytes += sealed.count
            refs.append(ref)
            if pendingBytes > 16 << 20 { try store() }
        }
        // What is left (all of a small file) goes in the same commit as the manifest.
        let manifest = Manifest(chunkSize: UInt32(s.chunkSize), chunks: refs)
        let mtime = pendingMtime ?? vault.now()
        let digest = try vault.commitContent(id: id, cipher: cipher, manifest: manifest, mtime: mtime, chunks: pending)
        s.refs = refs.map { Optional($0) }
        s.dirty = [:]
        s.dirtyBytes = 0
        s.modified = false
        s.digest = digest ?? s.digest
        mtimeAtomic.store(0, ordering: .relaxed)
    }

    /// Another process committed new content: adopt it unless this handle has unflushed writes
    /// (then this handle's flush will win, as the later writer).
    func adopt(manifest: Manifest, digest: [UInt8]) {
        state.withLock { s in
            guard !s.modified, s.digest != digest else { return }
            s.refs = manifest.chunks.map { Optional($0) }
            s.size = manifest.size
            s.cache = nil
            s.digest = digest
            sizeAtomic.store(s.size, ordering: .relaxed)
        }
    }

    var isModified: Bool { state.withLock { $0.modified } }

    /// Sets the modification time the next commit records, if there are unflushed writes to
    /// carry it; returns false (and changes nothing) otherwise.
    public func setPendingModificationTime(_ t: Timespec) -> Bool {
        state.withLock { s in
            guard s.modified else { return false }
            mtimeAtomic.store(t.seconds * 1_000_000_000 + t.nanoseconds, ordering: .relaxed)
            return true
        }
    }
}
