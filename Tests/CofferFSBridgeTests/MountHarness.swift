import CFuse
import CofferFS
import CofferFuse
import Foundation
import Synchronization

#if canImport(Glibc)
    import Glibc
#endif

/// Runs a `FuseSession` on its own thread (never the test's) over a fresh
/// temporary directory, the way the daemon will run it on its main thread.
final class MountHarness: Sendable {
    let mountPoint: String
    let filesystem: MemoryFileSystem
    let session: FuseSession
    private let outcome = Mutex<Result<Void, FuseSessionError>?>(nil)

    init(configuration: FuseSession.Configuration) throws {
        var template = Array("/tmp/coffer-fuse-bridge-XXXXXX".utf8CString)
        let dir = template.withUnsafeMutableBufferPointer { buffer -> String? in
            guard let base = buffer.baseAddress, let made = mkdtemp(base) else { return nil }
            return String(cString: made)
        }
        guard let dir else { throw POSIXFailure(call: "mkdtemp", errno: errno) }
        mountPoint = dir
        filesystem = MemoryFileSystem()
        session = FuseSession(mountPoint: mountPoint, operations: filesystem, configuration: configuration)
    }

    func start() throws {
        let thread = Thread { [self] in
            let result: Result<Void, FuseSessionError>
            do throws(FuseSessionError) {
                try session.run()
                result = .success(())
            } catch {
                result = .failure(error)
            }
            outcome.withLock { $0 = result }
        }
        thread.start()
        // INIT is answered by the first worker once the mount exists.
        guard waitUntil(seconds: 10, { self.session.connection != nil || self.finished }) else {
            throw POSIXFailure(call: "mount (timed out)", errno: ETIMEDOUT)
        }
        if case .failure(let error)? = outcome.withLock({ $0 }) { throw error }
    }

    var finished: Bool { outcome.withLock { $0 != nil } }

    /// Waits for `run()` to return; the mount must be gone by then.
    func join(seconds: Double = 10) throws -> Result<Void, FuseSessionError> {
        guard waitUntil(seconds: seconds, { self.finished }) else {
            throw POSIXFailure(call: "run() did not return", errno: ETIMEDOUT)
        }
        return outcome.withLock { $0! }
    }

    var isMounted: Bool {
        guard let table = try? String(contentsOfFile: "/proc/self/mountinfo", encoding: .utf8) else { return false }
        return table.split(separator: "\n").contains {
            $0.split(separator: " ").dropFirst(4).first == Substring(mountPoint)
        }
    }

    func path(_ relative: String) -> String { mountPoint + "/" + relative }

    func cleanUp() {
        if isMounted { _ = try? runCommand("/usr/bin/fusermount3", ["-u", "-z", mountPoint]) }
        rmdir(mountPoint)
    }
}

struct POSIXFailure: Error, CustomStringConvertible {
    let call: String
    let errno: Int32
    var description: String { "\(call): \(String(cString: strerror(errno))) (\(errno))" }
}

func waitUntil(seconds: Double, _ condition: () -> Bool) -> Bool {
    let deadline = Date().addingTimeInterval(seconds)
    while Date() < deadline {
        if condition() { return true }
        usleep(5_000)
    }
    return condition()
}

@discardableResult
func runCommand(_ path: String, _ arguments: [String]) throws -> Int32 {
    let process = Process()
    process.executableURL = URL(fileURLWithPath: path)
    process.arguments = arguments
    try process.run()
    process.waitUntilExit()
    return process.terminationStatus
}

/// Calls a POSIX function returning -1/errno, turning failures into errors.
@discardableResult
func posix<T: BinaryInteger>(_ call: String, _ body: () -> T) throws -> T {
    let result = body()
    if result < 0 { throw POSIXFailure(call: call, errno: errno) }
    return result
}

/// The errno a failing POSIX call leaves, or 0 if it succeeded.
func posixErrno<T: BinaryInteger>(_ body: () -> T) -> Int32 {
    errno = 0
    return body() < 0 ? errno : 0
}

func writeFile(_ path: String, _ bytes: [UInt8], flags: Int32 = O_WRONLY | O_CREAT | O_TRUNC) throws {
    let fd = try posix("open \(path)") { open(path, flags | O_CLOEXEC, 0o644) }
    defer { close(fd) }
    var written = 0
    while written < bytes.count {
        let n = try posix("write \(path)") {
            bytes[written...].withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
        }
        written += n
    }
}

func readFile(_ path: String) throws -> [UInt8] {
    let fd = try posix("open \(path)") { open(path, O_RDONLY | O_CLOEXEC) }
    defer { close(fd) }
    var result: [UInt8] = []
    var chunk = [UInt8](repeating: 0, count: 1 << 16)
    while true {
        let n = try posix("read \(path)") { chunk.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) } }
        if n == 0 { return result }
        result += chunk[..<n]
    }
}

func statPath(_ path: String) throws -> stat {
    var st = stat()
    try posix("stat \(path)") { lstat(path, &st) }
    return st
}

/// Names from readdir(3), excluding nothing: the caller sees exactly what the
/// filesystem listed.
func listDirectory(_ path: String) throws -> [String] {
    guard let dir = opendir(path) else { throw POSIXFailure(call: "opendir \(path)", errno: errno) }
    defer { closedir(dir) }
    var names: [String] = []
    while let entry = readdir(dir) {
        let name = withUnsafeBytes(of: entry.pointee.d_name) { raw in
            String(decoding: raw.prefix { $0 != 0 }, as: UTF8.self)
        }
        names.append(name)
    }
    return names
}
