import CofferProtocol
import Foundation

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// The embedded content store: one file per chunk under
/// `<root>/<account hex>/<first byte of id, hex>/<id hex>` (the full account key, never a
/// prefix: a prefix could be ground by another account to share a directory). A chunk is
/// written to a unique `<tmp>/….part`, fsynced, and renamed into place (then its directory
/// fsynced), so a reader never sees half of one and a recorded chunk survives a power loss.
public final class DirectoryContentStorage: ContentStorage {
    public let root: URL
    let tmp: URL

    public init(root: URL, tmp: URL) throws {
        self.root = root
        self.tmp = tmp
        try FileManager.default.createDirectory(at: root, withIntermediateDirectories: true)
        try FileManager.default.createDirectory(at: tmp, withIntermediateDirectories: true)
    }

    func directory(_ key: ChunkKey) -> URL {
        let idHex = RequestSigning.hex(Array(key.id))
        return root.appendingPathComponent(RequestSigning.hex(Array(key.account)), isDirectory: true)
            .appendingPathComponent(String(idHex.prefix(2)), isDirectory: true)
    }

    func path(_ key: ChunkKey) -> URL {
        directory(key).appendingPathComponent(RequestSigning.hex(Array(key.id)), isDirectory: false)
    }

    /// Writes the bytes to a unique temporary file and fsyncs it. Two uploads of one id stage
    /// two temporaries; only the one the metadata transaction records is published.
    public func stage(_ key: ChunkKey, bytes: [UInt8]) throws -> StagedChunk {
        let temp = tmp.appendingPathComponent(RequestSigning.hex(randomNonce()) + ".part")
        let fd = openFile(temp.path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw StorageError("cannot create a temporary chunk file: errno \(errno)") }
        var ok = false
        defer {
            close(fd)
            if !ok { unlink(temp.path) }
        }
        var written = 0
        while written < bytes.count {
            let n = bytes.withUnsafeBytes { buf in
                write(fd, buf.baseAddress.map { $0 + written }, bytes.count - written)
            }
            if n < 0 {
                if errno == EINTR { continue }
                throw StorageError("cannot write a temporary chunk file: errno \(errno)")
            }
            written += n
        }
        guard fsync(fd) == 0 else { throw StorageError("cannot fsync a temporary chunk file: errno \(errno)") }
        ok = true
        return StagedChunk(key: key, location: temp.path)
    }

    /// Renames the staged file into place and fsyncs its directory, so the chunk survives a power
    /// loss before the metadata store records it (docs/PROTOCOL.md, "Durability"). Directories it
    /// had to create are made durable in their parents too.
    public func publish(_ staged: StagedChunk) throws {
        let dir = directory(staged.key)
        try makeDurableDirectory(dir, depth: 2)
        guard rename(staged.location, path(staged.key).path) == 0 else {
            throw StorageError("cannot rename a chunk into place: errno \(errno)")
        }
        try syncDirectory(dir.path)
    }

    public func discard(_ staged: StagedChunk) {
        unlink(staged.location)
    }

    /// Creates `dir` (and up to `depth` missing ancestors below the root), fsyncing the parent of
    /// each directory it creates.
    private func makeDurableDirectory(_ dir: URL, depth: Int) throws {
        if access(dir.path, F_OK) == 0 { return }
        let parent = dir.deletingLastPathComponent()
        if depth > 1 { try makeDurableDirectory(parent, depth: depth - 1) }
        if mkdir(dir.path, 0o700) != 0, errno != EEXIST {
            throw StorageError("cannot create a chunk directory: errno \(errno)")
        }
        try syncDirectory(parent.path)
    }

    private func syncDirectory(_ path: String) throws {
        let dfd = openFile(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard dfd >= 0 else { throw StorageError("cannot open a chunk directory: errno \(errno)") }
        defer { close(dfd) }
        guard fsync(dfd) == 0 else { throw StorageError("cannot fsync a chunk directory: errno \(errno)") }
    }

    public func open(_ key: ChunkKey) throws -> (any ChunkReading)? {
        let fd = openFile(path(key).path, O_RDONLY | O_CLOEXEC)
        if fd < 0 {
            if errno == ENOENT { return nil }
            throw StorageError("cannot open chunk: errno \(errno)")
        }
        return FileChunkReader(fd: fd)
    }

    public func get(_ key: ChunkKey) throws -> [UInt8]? {
        let p = path(key).path
        let fd = openFile(p, O_RDONLY | O_CLOEXEC)
        if fd < 0 {
            if errno == ENOENT { return nil }
            throw StorageError("cannot open chunk: errno \(errno)")
        }
        defer { close(fd) }
        var out: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 256 * 1024)
        while true {
            let n = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
            if n < 0 {
                if errno == EINTR { continue }
                throw StorageError("cannot read chunk: errno \(errno)")
            }
            if n == 0 { break }
            out += buffer[0..<n]
        }
        return out
    }

    public func has(_ key: ChunkKey) throws -> Bool {
        access(path(key).path, F_OK) == 0
    }

    public func delete(_ key: ChunkKey) throws {
        if unlink(path(key).path) != 0, errno != ENOENT {
            throw StorageError("cannot delete chunk: errno \(errno)")
        }
    }

    public func list(_ each: (ChunkKey, Int64) throws -> Void) throws {
        let fm = FileManager.default
        for accountHex in (try? fm.contentsOfDirectory(atPath: root.path)) ?? [] {
            guard let account = RequestSigning.unhex(accountHex), account.count == 32 else { continue }
            let accountDir = root.appendingPathComponent(accountHex, isDirectory: true)
            for prefix in (try? fm.contentsOfDirectory(atPath: accountDir.path)) ?? [] {
                let prefixDir = accountDir.appendingPathComponent(prefix, isDirectory: true)
                for name in (try? fm.contentsOfDirectory(atPath: prefixDir.path)) ?? [] {
                    guard let id = RequestSigning.unhex(name), !id.isEmpty else { continue }
                    var st = stat()
                    guard stat(prefixDir.appendingPathComponent(name).path, &st) == 0 else { continue }
                    let mtime = Int64(st.st_mtim.tv_sec) * 1000 + Int64(st.st_mtim.tv_nsec) / 1_000_000
                    try each(ChunkKey(account: Data(account), id: Data(id)), mtime)
                }
            }
        }
    }

    /// Removes temporary files older than `before` (ms) left by interrupted writes.
    public func removeStaleTemporaries(before: Int64) {
        let fm = FileManager.default
        for name in (try? fm.contentsOfDirectory(atPath: tmp.path)) ?? [] {
            let p = tmp.appendingPathComponent(name).path
            var st = stat()
            guard stat(p, &st) == 0 else { continue }
            let mtime = Int64(st.st_mtim.tv_sec) * 1000 + Int64(st.st_mtim.tv_nsec) / 1_000_000
            if mtime < before { unlink(p) }
        }
    }

    private func randomNonce() -> [UInt8] {
        var g = SystemRandomNumberGenerator()
        return (0..<16).map { _ in UInt8.random(in: 0...255, using: &g) }
    }
}

/// An open chunk file, read piece by piece; closed when released.
final class FileChunkReader: ChunkReading {
    let fd: Int32
    init(fd: Int32) { self.fd = fd }
    deinit { close(fd) }

    func read(upTo count: Int) throws -> [UInt8] {
        guard count > 0 else { return [] }
        var out = [UInt8](repeating: 0, count: count)
        while true {
            let n = out.withUnsafeMutableBytes { readFile(fd, $0.baseAddress, $0.count) }
            if n < 0 {
                if errno == EINTR { continue }
                throw StorageError("cannot read chunk: errno \(errno)")
            }
            out.removeLast(count - n)
            return out
        }
    }
}

// The storage's own `open` and the reader's `read` shadow the C calls inside their types.
private func openFile(_ path: String, _ flags: Int32, _ mode: mode_t = 0) -> Int32 { open(path, flags, mode) }
private func readFile(_ fd: Int32, _ buffer: UnsafeMutableRawPointer?, _ count: Int) -> Int { read(fd, buffer, count) }
