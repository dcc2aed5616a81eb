import Foundation

#if canImport(Glibc)
    import Glibc
#endif

public struct FixtureError: Error, CustomStringConvertible {
    public let description: String
    public init(_ d: String) { description = d }
}

/// A store in a temporary directory, mounted with `coffer mount`. Everything is undone when the
/// value goes away, even after a failed test: `coffer unmount`, then a lazy `fusermount3 -u -z`,
/// then the daemon is killed, so no mount or daemon is ever left behind.
public final class MountFixture: @unchecked Sendable {
    public let tmp: TemporaryDirectory
    public let dataDir: String
    public let mountPoint: String
    public let mountOptions: [String]
    public let mountArguments: [String]

    /// Inits a store and mounts it. `options` are passed as `-o` options. `initArguments` and
    /// `initInput` replace the default `coffer init tester` (e.g. to join an account from a
    /// server); `mountArguments` are added to `coffer mount`.
    public init(
        _ label: String = "coffer-fs", options: [String] = [], mount: Bool = true,
        initArguments: [String] = ["init", "tester"], initInput: [UInt8]? = nil, mountArguments: [String] = []
    ) throws {
        tmp = TemporaryDirectory(label)
        // Other users (the permission tests) must be able to reach the mount point.
        chmod(tmp.path, 0o755)
        dataDir = tmp.path + "/data"
        mountPoint = tmp.sub("mnt")
        mountOptions = options
        self.mountArguments = mountArguments
        let r = coffer(dataDir, initArguments, stdin: initInput)
        guard r.status == 0 else { throw FixtureError("coffer \(initArguments.first ?? "") failed: \(r.err)") }
        if mount { try self.mount() }
    }

    /// A path inside the mount.
    public func path(_ relative: String) -> String {
        relative.isEmpty
            ? mountPoint : mountPoint + "/" + (relative.hasPrefix("/") ? String(relative.dropFirst()) : relative)
    }

    /// `coffer mount` (daemonized); throws with its stderr if it fails.
    public func mount() throws {
        let r = mountResult()
        guard r.status == 0 else { throw FixtureError("coffer mount failed (\(r.status)): \(r.err)\nlog:\n\(log)") }
        guard isMounted else { throw FixtureError("coffer mount returned but \(mountPoint) is not mounted") }
    }

    /// `coffer mount` of this store at `point` (default: the fixture's mount point), as a result.
    public func mountResult(at point: String? = nil) -> ProcessResult {
        var args = ["mount"] + mountArguments
        for o in mountOptions { args += ["-o", o] }
        args.append(point ?? mountPoint)
        return coffer(dataDir, args)
    }

    /// `coffer unmount`; throws with its stderr if it fails.
    public func unmount() throws {
        let r = coffer(dataDir, ["unmount", mountPoint])
        guard r.status == 0 else { throw FixtureError("coffer unmount failed (\(r.status)): \(r.err)") }
    }

    public var isMounted: Bool { MountFixture.isMounted(mountPoint) }

    /// The pid of the daemon serving the store (first line of mount.lock), if it is alive.
    public var daemonPID: pid_t? {
        guard let text = try? String(contentsOfFile: dataDir + "/mount.lock", encoding: .utf8),
            let first = text.split(separator: "\n").first, let pid = pid_t(first), pid > 0
        else { return nil }
        return Glibc.kill(pid, 0) == 0 ? pid : nil
    }

    /// The daemon's log.
    public var log: String { (try? String(contentsOfFile: dataDir + "/coffer.log", encoding: .utf8)) ?? "" }

    /// Waits until `pid` is gone (it is not our child, so poll /proc).
    @discardableResult
    public static func waitForExit(_ pid: pid_t, timeout: Double) -> Bool {
        eventually(timeout: timeout, interval: 0.02) {
            // A zombie counts as gone.
            guard let s = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8) else { return true }
            return s.split(separator: ")").last?.trimmingCharacters(in: .whitespaces).hasPrefix("Z") ?? true
        }
    }

    /// Whether `path` is a mount point now (per /proc/self/mountinfo).
    public static func isMounted(_ path: String) -> Bool {
        guard let text = try? String(contentsOfFile: "/proc/self/mountinfo", encoding: .utf8) else { return false }
        for line in text.split(separator: "\n") {
            let fields = line.split(separator: " ")
            if fields.count > 4, fields[4].replacingOccurrences(of: "\\040", with: " ") == path { return true }
        }
        return false
    }

    /// Undoes everything, whatever state the test left.
    public func tearDown() {
        let pid = daemonPID
        if isMounted {
            let r = coffer(dataDir, ["unmount", mountPoint])
            if r.status != 0 || isMounted {
                run("/bin/fusermount3", ["-u", "-z", mountPoint])
            }
        }
        if isMounted { run("/bin/umount", ["-l", mountPoint]) }
        if let pid {
            if !MountFixture.waitForExit(pid, timeout: 10) {
                Glibc.kill(pid, SIGKILL)
                MountFixture.waitForExit(pid, timeout: 5)
            }
        }
    }

    deinit { tearDown() }
}

// MARK: POSIX helpers

/// The errno left by a call returning a negative value, or 0 if it succeeded.
public func errnoOf(_ body: () -> Int) -> Int32 {
    errno = 0
    return body() < 0 ? errno : 0
}

public func errnoOf(_ body: () -> Int32) -> Int32 {
    errno = 0
    return body() < 0 ? errno : 0
}

/// open(2) that closes what it opened; the errno, or 0.
public func openErrno(_ path: String, _ flags: Int32, _ mode: mode_t = 0o644) -> Int32 {
    errno = 0
    let fd = open(path, flags | O_CLOEXEC, mode)
    if fd < 0 { return errno }
    close(fd)
    return 0
}

private func symbol<T>(_ name: String, as: T.Type) -> T {
    // dlopen(NULL) is the program itself, with libc's symbols; the handle needs no closing.
    guard let p = dlsym(dlopen(nil, RTLD_NOW), name) else { fatalError("libc has no \(name)") }
    return unsafeBitCast(p, to: T.self)
}

public let RENAME_NOREPLACE_FLAG: UInt32 = 1
public let RENAME_EXCHANGE_FLAG: UInt32 = 2

/// renameat2(2) through glibc (exported since 2.28, not imported into Swift).
public func renameat2(_ from: String, _ to: String, flags: UInt32) -> Int32 {
    typealias F = @convention(c) (Int32, UnsafePointer<CChar>, Int32, UnsafePointer<CChar>, UInt32) -> Int32
    let f = symbol("renameat2", as: F.self)
    return f(AT_FDCWD, from, AT_FDCWD, to, flags)
}

public func setXattr(_ path: String, _ name: String, _ value: [UInt8], flags: Int32 = 0) -> Int32 {
    typealias F = @convention(c) (UnsafePointer<CChar>, UnsafePointer<CChar>, UnsafeRawPointer?, Int, Int32) -> Int32
    let f = symbol("setxattr", as: F.self)
    return value.withUnsafeBytes { f(path, name, $0.baseAddress, $0.count, flags) }
}

/// getxattr(2): the value, or the errno.
public func getXattr(_ path: String, _ name: String) -> Result<[UInt8], POSIXErrorBox> {
    typealias F = @convention(c) (UnsafePointer<CChar>, UnsafePointer<CChar>, UnsafeMutableRawPointer?, Int) -> Int
    let f = symbol("getxattr", as: F.self)
    var buf = [UInt8](repeating: 0, count: 65536)
    let n = buf.withUnsafeMutableBytes { f(path, name, $0.baseAddress, $0.count) }
    if n < 0 { return .failure(POSIXErrorBox(code: errno)) }
    return .success(Array(buf[0..<n]))
}

/// listxattr(2): the names, or the errno.
public func listXattr(_ path: String) -> Result<[String], POSIXErrorBox> {
    typealias F = @convention(c) (UnsafePointer<CChar>, UnsafeMutableRawPointer?, Int) -> Int
    let f = symbol("listxattr", as: F.self)
    var buf = [UInt8](repeating: 0, count: 65536)
    let n = buf.withUnsafeMutableBytes { f(path, $0.baseAddress, $0.count) }
    if n < 0 { return .failure(POSIXErrorBox(code: errno)) }
    return .success(buf[0..<n].split(separator: 0).map { String(decoding: $0, as: UTF8.self) })
}

public func removeXattr(_ path: String, _ name: String) -> Int32 {
    typealias F = @convention(c) (UnsafePointer<CChar>, UnsafePointer<CChar>) -> Int32
    let f = symbol("removexattr", as: F.self)
    return f(path, name)
}

public struct POSIXErrorBox: Error, Equatable, Sendable {
    public let code: Int32
    public init(code: Int32) { self.code = code }
}

/// Reads a whole file with open/read, or nil with errno set.
public func readFile(_ path: String) -> [UInt8]? {
    let fd = open(path, O_RDONLY | O_CLOEXEC)
    guard fd >= 0 else { return nil }
    defer { close(fd) }
    return readAll(fd: fd)
}

/// Reads from `fd` at offset 0 to its end with pread.
public func readAll(fd: Int32) -> [UInt8]? {
    var out: [UInt8] = []
    var buf = [UInt8](repeating: 0, count: 1 << 16)
    var offset: off_t = 0
    while true {
        let n = buf.withUnsafeMutableBytes { pread(fd, $0.baseAddress, $0.count, offset) }
        if n < 0 {
            if errno == EINTR { continue }
            return nil
        }
        if n == 0 { return out }
        out += buf[0..<n]
        offset += off_t(n)
    }
}

/// Creates or replaces a file with open/write/close; returns the errno, or 0.
@discardableResult
public func writeFile(_ path: String, _ bytes: [UInt8], mode: mode_t = 0o644, fsync doSync: Bool = false) -> Int32 {
    let fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode)
    guard fd >= 0 else { return errno }
    var off = 0
    while off < bytes.count {
        let n = bytes.withUnsafeBytes { write(fd, $0.baseAddress! + off, $0.count - off) }
        if n < 0 {
            let e = errno
            close(fd)
            return e
        }
        off += n
    }
    if doSync && fsync(fd) != 0 {
        let e = errno
        close(fd)
        return e
    }
    return close(fd) == 0 ? 0 : errno
}

@discardableResult
public func writeFile(_ path: String, _ text: String, mode: mode_t = 0o644) -> Int32 {
    writeFile(path, Array(text.utf8), mode: mode)
}

public func lstatOf(_ path: String) -> stat? {
    var st = stat()
    return lstat(path, &st) == 0 ? st : nil
}

public func statOf(_ path: String) -> stat? {
    var st = stat()
    return stat(path, &st) == 0 ? st : nil
}
