import CofferModel
import Foundation
import Synchronization

/// Sealed chunks live in pack files under `DATA/chunks/packs/`, not in SQLite.
///
/// A chunk stored as a SQLite blob is written three times (WAL, then the database at checkpoint,
/// read back in between) and read back page by page; a pack's bytes are written once and read
/// with one `pread`. The `chunks` table lists every chunk with its `Place`, so the store's
/// bookkeeping and garbage collection see one set of ids; a packed chunk's row holds a
/// `PackLocator` instead of the bytes. Large chunks stored together (a spill of buffered writes,
/// a flush, a download) share a pack of their own; small ones (most of a source tree's files)
/// are appended to the store's current pack (`append`). Stores written before that kept small
/// chunks in their rows (`place = 0`), which are still read. A pack is deleted when garbage
/// collection finds no row naming it; one mostly dead is rewritten with only its live chunks
/// (`Store.compactPacks`).
///
/// Crash safety: a file is written before the rows naming it, in the same transaction; a file
/// without a row (its transaction rolled back) is swept by garbage collection. Files written
/// since the last sync are synced before any commit, so a committed row never names a file a
/// power loss could take.
final class ChunkFiles: Sendable {
    /// Sealed chunks at least this large stored together get a pack of their own; smaller ones
    /// are appended to the current pack (a quarter of a full 256 KiB chunk).
    static let threshold = 64 * 1024

    /// Where a chunk's bytes are: the `place` column of its row.
    enum Place: Int64 {
        /// In the row's `sealed` column.
        case row = 0
        /// In a pack file, which the row's `sealed` column locates (`PackLocator`).
        case pack = 1
    }

    static let packFolder = "packs"

    let directory: String
    private let unsynced = Mutex<Set<String>>([])

    init(directory: String) throws {
        self.directory = directory
        try FileManager.default.createDirectory(
            atPath: directory, withIntermediateDirectories: true,
            attributes: [.posixPermissions: 0o700])
    }

    /// Writes all of `bytes` at `offset`, retrying short writes and EINTR.
    private static func write(_ bytes: [UInt8], to fd: Int32, at offset: Int, path: String) throws {
        var done = 0
        while done < bytes.count {
            let n = bytes.withUnsafeBytes { b -> Int in
                guard let base = b.baseAddress else { return -1 }
                return pwrite(fd, base + done, b.count - done, off_t(offset + done))
            }
            if n < 0 && errno == EINTR { continue }
            guard n > 0 else { throw StoreError("cannot write chunk file \(path): \(errorText())") }
            done += n
        }
    }

    /// Reads exactly `size` bytes at `offset`; a short file is an error, not a short chunk.
    private static func read(_ size: Int, from fd: Int32, at offset: Int, path: String) throws -> [UInt8] {
        var failure: Int32 = 0
        // Filled by pread, not zeroed first (a full chunk read is 256 KiB of memset saved).
        let out = [UInt8](unsafeUninitializedCapacity: size) { buffer, count in
            var done = 0
            while done < size, let base = buffer.baseAddress {
                let n = pread(fd, base + done, size - done, off_t(offset + done))
                if n < 0 && errno == EINTR { continue }
                guard n > 0 else {
                    failure = n == 0 ? EIO : errno
                    break
                }
                done += n
            }
            count = done
        }
        guard out.count == size else {
            throw StoreError("cannot read chunk file \(path): \(String(cString: strerror(failure)))")
        }
        return out
    }

    /// Makes every chunk file written since the last call durable (data and directory entry).
    /// A few files are synced one by one; many at once with one `syncfs` of the filesystem.
    func syncPending() throws {
        var files = unsynced.withLock { s -> Set<String> in
            defer { s.removeAll() }
            return s
        }
        guard !files.isEmpty else { return }
        do {
            if let path = appending.withLock({ $0?.path }), files.contains(path) {
                try syncAppending()
                files.remove(path)
                guard !files.isEmpty else { return }
            }
            if files.count > 8 {
                let fd = open(directory, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
                guard fd >= 0 else { throw StoreError("cannot open \(directory): \(Self.errorText())") }
                defer { close(fd) }
                guard Self.syncfs(fd) == 0 else { throw StoreError("cannot sync chunk files: \(Self.errorText())") }
                return
            }
            var folders: Set<String> = []
            for p in files {
                let fd = open(p, O_RDONLY | O_CLOEXEC)
                if fd < 0 && errno == ENOENT { continue }  // removed since (garbage collection)
                guard fd >= 0 else { throw StoreError("cannot sync \(p): \(Self.errorText())") }
                defer { close(fd) }
                guard fdatasync(fd) == 0 else { throw StoreError("cannot sync \(p): \(Self.errorText())") }
                folders.insert(String(p[..<(p.lastIndex(of: "/") ?? p.endIndex)]))
            }
            for f in folders {
                let fd = open(f, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
                guard fd >= 0 else { continue }
                _ = fsync(fd)
                close(fd)
            }
        } catch {
            unsynced.withLock { $0.formUnion(files) }  // try again at the next commit
            throw error
        }
    }

    /// A chunk's sealed bytes, given its row's `sealed` and `place` columns.
    func resolve(_ id: [UInt8], row: [UInt8], place: Int64) throws -> [UInt8] {
        switch Place(rawValue: place) {
        case .row: return row
        case .pack: return try readPacked(PackLocator(decoding: row))
        case nil: throw StoreError("chunk \(hexString(Array(id.prefix(8)))) has an unknown place \(place)")
        }
    }

    func packPath(_ pack: [UInt8]) -> String {
        directory + "/" + Self.packFolder + "/" + hexString(pack)
    }

    /// A new, empty pack file: its id, path and a descriptor open for writing.
    private func createPack() throws -> (pack: [UInt8], path: String, fd: Int32) {
        var rng = SystemRandomNumberGenerator()
        let pack = (0..<PackLocator.packIDBytes).map { _ in UInt8.random(in: 0...255, using: &rng) }
        let folder = directory + "/" + Self.packFolder
        if mkdir(folder, 0o700) != 0 && errno != EEXIST {
            throw StoreError("cannot create \(folder): \(Self.errorText())")
        }
        let p = packPath(pack)
        let fd = open(p, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw StoreError("cannot write chunk pack \(p): \(Self.errorText())") }
        return (pack, p, fd)
    }

    /// The pack small chunks are appended to, open across commits until it reaches
    /// `appendLimit`. This process holds an exclusive `flock` on it while it appends, so two
    /// processes on one store never append to the same pack.
    private struct OpenPack {
        let pack: [UInt8]
        let path: String
        let fd: Int32
        var size: Int
        /// Whether its directory entry is durable (a pack made since the last sync's is not).
        var entrySynced: Bool
    }

    /// How large the pack small chunks are appended to grows before the next one is begun.
    static let appendLimit = 64 << 20

    /// Appends after a sync start on a new block, so a later write never rewrites a block
    /// holding committed chunks (a torn write there could damage them).
    static let appendAlignment = 4096

    private let appending = Mutex<OpenPack?>(nil)

    /// Stops appending to `current` (the next small chunk goes to another pack).
    private static func retire(_ current: inout OpenPack?) {
        if let open = current { close(open.fd) }
        current = nil
    }

    /// Appends a small sealed chunk to the store's current pack and returns where it is. As a
    /// SQLite blob, each small file's chunk was a leaf of its own among random keys: at a
    /// million files those leaves were 2 GB that every copied-in file dirtied a page of, and the
    /// tree's rows were scattered between them, so a cold listing read them page by page.
    /// Appended, a batch's chunks are one sequential write (synced before the commit naming
    /// them, as every pack is) and its files' contents sit side by side for reading back.
    ///
    /// A process's first append resumes `lastPack` (the pack the store last began, which the
    /// caller keeps in the store) if no other process is appending to it and it has room, so
    /// many short-lived writers (a `coffer put` each) do not leave a tiny pack each. A pack
    /// begun here is handed to `began`, in the transaction that names its first chunk.
    func append(
        _ sealed: [UInt8], lastPack: () throws -> [UInt8]?, began: ([UInt8]) throws -> Void
    ) throws -> PackLocator {
        try appending.withLock { current in
            if let open = current, open.size + sealed.count > Self.appendLimit { Self.retire(&current) }
            if current == nil, let last = try lastPack() {
                current = resume(last, room: sealed.count)
            }
            if current == nil {
                let made = try createPack()
                guard flock(made.fd, LOCK_EX | LOCK_NB) == 0 else {
                    close(made.fd)
                    throw StoreError("cannot lock the new chunk pack \(made.path): \(Self.errorText())")
                }
                current = OpenPack(pack: made.pack, path: made.path, fd: made.fd, size: 0, entrySynced: false)
                try began(made.pack)
            }
            guard var open = current else { throw StoreError("no chunk pack to append to") }
            // A failed write leaves `size` where it was: the next chunk is written over the
            // partial one, which no row names.
            try Self.write(sealed, to: open.fd, at: open.size, path: open.path)
            let locator = PackLocator(pack: open.pack, offset: UInt64(open.size), length: UInt64(sealed.count))
            open.size += sealed.count
            current = open
            unsynced.withLock { _ = $0.insert(open.path) }
            return locator
        }
    }

    /// `pack` opened for appending, if it exists, no other process appends to it (its lock)
    /// and `room` more bytes fit; appends go after what it holds, on a new block.
    private func resume(_ pack: [UInt8], room: Int) -> OpenPack? {
        guard pack.count == PackLocator.packIDBytes else { return nil }
        let p = packPath(pack)
        let fd = open(p, O_WRONLY | O_CLOEXEC)
        guard fd >= 0 else { return nil }
        var st = stat()
        guard flock(fd, LOCK_EX | LOCK_NB) == 0, fstat(fd, &st) == 0, st.st_nlink > 0,
            let size = Self.aligned(Int(st.st_size)), size + room <= Self.appendLimit
        else {
            close(fd)
            return nil
        }
        return OpenPack(pack: pack, path: p, fd: fd, size: size, entrySynced: true)
    }

    private static func aligned(_ n: Int) -> Int? {
        let (sum, overflow) = n.addingReportingOverflow(appendAlignment - 1)
        return overflow || n < 0 ? nil : sum / appendAlignment * appendAlignment
    }

    /// Makes the current pack's appends durable through its own descriptor. A pack another
    /// process deleted (garbage collection, which the content lock should have kept out) is an
    /// error: committing would name bytes that are gone, so the group fails instead.
    private func syncAppending() throws {
        try appending.withLock { current in
            guard var open = current else { return }
            var st = stat()
            guard fstat(open.fd, &st) == 0, st.st_nlink > 0 else {
                Self.retire(&current)
                throw StoreError("chunk pack \(open.path) was deleted while chunks were appended to it")
            }
            guard fdatasync(open.fd) == 0 else { throw StoreError("cannot sync \(open.path): \(Self.errorText())") }
            if !open.entrySynced {
                let folder = directory + "/" + Self.packFolder
                let dir = Foundation.open(folder, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
                guard dir >= 0 else { throw StoreError("cannot open \(folder): \(Self.errorText())") }
                defer { close(dir) }
                guard fsync(dir) == 0 else { throw StoreError("cannot sync \(folder): \(Self.errorText())") }
                open.entrySynced = true
            }
            open.size = Self.aligned(open.size) ?? open.size
            current = open
        }
    }

    deinit { appending.withLock { Self.retire(&$0) } }

    /// Writes the sealed chunks into one new pack file, in order; returns each one's locator.
    func writePack(_ chunks: [[UInt8]]) throws -> [PackLocator] {
        let (pack, p, fd) = try createPack()
        defer { close(fd) }
        var locators: [PackLocator] = []
        var offset = 0
        for sealed in chunks {
            try Self.write(sealed, to: fd, at: offset, path: p)
            locators.append(PackLocator(pack: pack, offset: UInt64(offset), length: UInt64(sealed.count)))
            offset += sealed.count
        }
        // The commit that names these chunks must first make them durable (`syncPending`).
        // Starting their writeback now lets the disk work while the next chunks are sealed,
        // so that sync finds little left to do instead of stalling the write that triggers it.
        Self.startWriteback(fd)
        unsynced.withLock { _ = $0.insert(p) }
        return locators
    }

    func readPacked(_ locator: PackLocator) throws -> [UInt8] {
        let p = packPath(locator.pack)
        let fd = open(p, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { throw StoreError("chunk pack \(p) is missing: \(Self.errorText())") }
        defer { close(fd) }
        return try Self.read(Int(locator.length), from: fd, at: Int(locator.offset), path: p)
    }

    /// Reads these packed chunks into the kernel's page cache, waiting for the disk (the store
    /// calls this on its prefetch thread, see `Store.prefetch`). Neighbouring ranges of one pack
    /// are read as one, each as a `sendfile` to /dev/null: that goes through the kernel's
    /// ordinary read-ahead (large folios) and copies nothing, about a fifth of the CPU of
    /// `POSIX_FADV_WILLNEED` (0.007 against 0.04 s for 256 MiB here), which stays the fallback
    /// for a filesystem that cannot splice. A pack that is gone is skipped.
    func readIntoPageCache(_ locators: [PackLocator]) {
        var order: [[UInt8]] = []
        var byPack: [[UInt8]: [(offset: UInt64, end: UInt64)]] = [:]
        for l in locators {
            if byPack[l.pack] == nil { order.append(l.pack) }
            byPack[l.pack, default: []].append((l.offset, l.offset + l.length))
        }
        guard !order.isEmpty else { return }
        let sink = open("/dev/null", O_WRONLY | O_CLOEXEC)
        guard sink >= 0 else { return }
        defer { close(sink) }
        for pack in order {
            let fd = open(packPath(pack), O_RDONLY | O_CLOEXEC)
            guard fd >= 0 else { continue }
            defer { close(fd) }
            for span in Self.merged(byPack[pack] ?? []) {
                var offset = off_t(span.offset)
                let end = off_t(span.end)
                while offset < end {
                    let n = sendfile(sink, fd, &offset, Int(end - offset))
                    if n < 0 && errno == EINTR { continue }
                    if n < 0 { _ = posix_fadvise(fd, offset, end - offset, Int32(POSIX_FADV_WILLNEED)) }
                    if n <= 0 { break }  // handed to fadvise, or past the end of the pack
                }
            }
        }
    }

    /// Ranges sorted, with those less than 64 KiB apart joined.
    private static func merged(_ ranges: [(offset: UInt64, end: UInt64)]) -> [(offset: UInt64, end: UInt64)] {
        var out: [(offset: UInt64, end: UInt64)] = []
        for r in ranges.sorted(by: { $0.offset < $1.offset }) {
            if let last = out.last, r.offset <= last.end + 64 * 1024 {
                out[out.count - 1].end = max(last.end, r.end)
            } else {
                out.append(r)
            }
        }
        return out
    }

    /// A pack file's size in bytes, nil if it is missing.
    func packSize(_ pack: [UInt8]) -> Int? {
        var st = stat()
        return stat(packPath(pack), &st) == 0 ? Int(st.st_size) : nil
    }

    func removePack(_ pack: [UInt8]) {
        let p = packPath(pack)
        // Never appended to once gone: a row would name a chunk in a file no longer there.
        appending.withLock { current in
            if current?.pack == pack { Self.retire(&current) }
        }
        unlink(p)
        unsynced.withLock { _ = $0.remove(p) }
    }

    /// Every pack file's id, for sweeping packs no row names.
    func allPackIDs() -> [[UInt8]] {
        let names = (try? FileManager.default.contentsOfDirectory(atPath: directory + "/" + Self.packFolder)) ?? []
        return names.compactMap { bytes(fromHex: $0) }.filter { $0.count == PackLocator.packIDBytes }
    }

    private static func errorText() -> String { String(cString: strerror(errno)) }

    /// `sync_file_range(fd, 0, 0, SYNC_FILE_RANGE_WRITE)`: queues the file's dirty pages for
    /// writeback without waiting for them (hidden behind _GNU_SOURCE like `syncfs`). Only a hint:
    /// durability still comes from `syncPending`.
    private static func startWriteback(_ fd: Int32) {
        typealias SyncFileRange = @convention(c) (Int32, Int64, Int64, UInt32) -> Int32
        guard let handle = dlopen(nil, RTLD_NOW), let sym = dlsym(handle, "sync_file_range") else { return }
        _ = unsafeBitCast(sym, to: SyncFileRange.self)(fd, 0, 0, 2)  // SYNC_FILE_RANGE_WRITE
    }

    /// `syncfs(2)`, which Glibc's module map hides behind _GNU_SOURCE; without it (never on
    /// glibc), `sync(2)` does the same and more.
    private static func syncfs(_ fd: Int32) -> Int32 {
        typealias SyncFS = @convention(c) (Int32) -> Int32
        guard let handle = dlopen(nil, RTLD_NOW), let sym = dlsym(handle, "syncfs") else {
            sync()
            return 0
        }
        return unsafeBitCast(sym, to: SyncFS.self)(fd)
    }
}

func bytes(fromHex s: String) -> [UInt8]? {
    let u = Array(s.utf8)
    guard u.count % 2 == 0, !u.isEmpty else { return nil }
    func v(_ c: UInt8) -> UInt8? {
        switch c {
        case 48...57: return c - 48
        case 97...102: return c - 87
        default: return nil
        }
    }
    var out = [UInt8]()
    out.reserveCapacity(u.count / 2)
    var i = 0
    while i < u.count {
        guard let hi = v(u[i]), let lo = v(u[i + 1]) else { return nil }
        out.append(hi << 4 | lo)
        i += 2
    }
    return out
}

/// Where a packed chunk is: what its row's `sealed` column holds instead of the bytes. Its
/// first 16 bytes are the pack id, so garbage collection finds the packs in use with `substr`.
/// Package-visible so `CofferFuzz` can fuzz its decoder, which reads bytes from disk.
package struct PackLocator: Equatable {
    package static let packIDBytes = 16

    package let pack: [UInt8]
    package let offset: UInt64
    package let length: UInt64

    package init(pack: [UInt8], offset: UInt64, length: UInt64) {
        self.pack = pack
        self.offset = offset
        self.length = length
    }

    package init(decoding bytes: [UInt8]) throws {
        var r = ByteReader(bytes)
        do {
            pack = try r.raw(Self.packIDBytes)
            offset = try r.u64()
            length = try r.u64()
        } catch { throw StoreError("a chunk's pack locator is malformed: \(error)") }
        guard r.isAtEnd, length <= UInt64(Int32.max), offset <= UInt64(Int64.max) - length else {
            throw StoreError("a chunk's pack locator is malformed or out of range")
        }
    }

    package var encoded: [UInt8] {
        var w = ByteWriter(capacity: Self.packIDBytes + 16)
        w.raw(pack)
        w.u64(offset)
        w.u64(length)
        return w.bytes
    }
}
