import CofferModel
import Foundation
import Synchronization

/// Large sealed chunks live in files under `DATA/chunks/`, not in SQLite.
///
/// A chunk stored as a SQLite blob is written three times (WAL, then the database at checkpoint,
/// read back in between) and read back page by page; a file is written once and read with one
/// `pread`. Small chunks (most of a source tree's files) stay in SQLite, where a row is cheaper
/// than a file. The `chunks` table lists every chunk either way (`in_file = 1` for files), so
/// the store's bookkeeping and garbage collection see one set of ids.
///
/// Crash safety: a file is written before the row naming it, in the same transaction; a file
/// without a row (its transaction rolled back) is swept by garbage collection. Files written
/// since the last sync are synced before any commit, so a committed row never names a file a
/// power loss could take.
final class ChunkFiles: Sendable {
    /// Sealed chunks at least this large go to files (a quarter of a full 256 KiB chunk).
    static let threshold = 64 * 1024

    let directory: String
    private let unsynced = Mutex<Set<String>>([])

    init(directory: String) throws {
        self.directory = directory
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true,
                                                attributes: [.posixPermissions: 0o700])
    }

    func path(_ id: [UInt8]) -> String {
        let hex = hexString(id)
        return directory + "/" + String(hex.prefix(2)) + "/" + hex
    }

    func write(_ id: [UInt8], _ sealed: [UInt8]) throws {
        let p = path(id)
        let folder = String(p[..<(p.lastIndex(of: "/") ?? p.endIndex)])
        if mkdir(folder, 0o700) != 0 && errno != EEXIST { throw StoreError("cannot create \(folder): \(Self.errorText())") }
        let fd = open(p, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw StoreError("cannot write chunk file \(p): \(Self.errorText())") }
        defer { close(fd) }
        var done = 0
        while done < sealed.count {
            let n = sealed.withUnsafeBytes { b -> Int in
                guard let base = b.baseAddress else { return -1 }
                return Glibc.write(fd, base + done, b.count - done)
            }
            if n < 0 && errno == EINTR { continue }
            guard n > 0 else { throw StoreError("cannot write chunk file \(p): \(Self.errorText())") }
            done += n
        }
        unsynced.withLock { _ = $0.insert(p) }
    }

    func read(_ id: [UInt8]) throws -> [UInt8] {
        let p = path(id)
        let fd = open(p, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { throw StoreError("chunk file \(p) is missing: \(Self.errorText())") }
        defer { close(fd) }
        var st = stat()
        guard fstat(fd, &st) == 0 else { throw StoreError("cannot read chunk file \(p): \(Self.errorText())") }
        let size = Int(st.st_size)
        var failure: Int32 = 0
        // Filled by pread, not zeroed first (a full chunk read is 256 KiB of memset saved).
        let out = [UInt8](unsafeUninitializedCapacity: size) { buffer, count in
            var done = 0
            while done < size, let base = buffer.baseAddress {
                let n = pread(fd, base + done, size - done, off_t(done))
                if n < 0 && errno == EINTR { continue }
                guard n > 0 else { failure = n == 0 ? EIO : errno; break }
                done += n
            }
            count = done
        }
        guard out.count == size else {
            throw StoreError("cannot read chunk file \(p): \(String(cString: strerror(failure)))")
        }
        return out
    }

    /// Makes every chunk file written since the last call durable (data and directory entry).
    /// A few files are synced one by one; many at once with one `syncfs` of the filesystem.
    func syncPending() throws {
        let files = unsynced.withLock { s -> Set<String> in defer { s.removeAll() }; return s }
        guard !files.isEmpty else { return }
        do {
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
                if fd < 0 && errno == ENOENT { continue } // removed since (garbage collection)
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
            unsynced.withLock { $0.formUnion(files) } // try again at the next commit
            throw error
        }
    }

    func remove(_ id: [UInt8]) {
        let p = path(id)
        unlink(p)
        unsynced.withLock { _ = $0.remove(p) }
    }

    /// Every chunk id that has a file, for sweeping files no row names.
    func allIDs() -> [[UInt8]] {
        var out: [[UInt8]] = []
        for folder in (try? FileManager.default.contentsOfDirectory(atPath: directory)) ?? [] {
            for name in (try? FileManager.default.contentsOfDirectory(atPath: directory + "/" + folder)) ?? [] {
                if let id = bytes(fromHex: name) { out.append(id) }
            }
        }
        return out
    }

    private static func errorText() -> String { String(cString: strerror(errno)) }

    /// `syncfs(2)`, which Glibc's module map hides behind _GNU_SOURCE; without it (never on
    /// glibc), `sync(2)` does the same and more.
    private static func syncfs(_ fd: Int32) -> Int32 {
        typealias SyncFS = @convention(c) (Int32) -> Int32
        guard let handle = dlopen(nil, RTLD_NOW), let sym = dlsym(handle, "syncfs") else { sync(); return 0 }
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
