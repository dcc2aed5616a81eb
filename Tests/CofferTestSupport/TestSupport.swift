import Foundation

#if canImport(Glibc)
    import Glibc
#endif

/// A directory under /tmp removed when the value goes away.
public final class TemporaryDirectory: @unchecked Sendable {
    public let path: String

    public init(_ label: String = "coffer-test") {
        var template = Array("/tmp/\(label)-XXXXXX".utf8CString)
        if let p = mkdtemp(&template) {
            path = String(cString: p)
        } else {
            path = "/tmp/\(label)-\(UUID().uuidString)"
            try? FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
        }
    }

    public func sub(_ name: String) -> String {
        let p = path + "/" + name
        try? FileManager.default.createDirectory(atPath: p, withIntermediateDirectories: true)
        return p
    }

    deinit { try? FileManager.default.removeItem(atPath: path) }
}

/// What a finished child process left behind.
public struct ProcessResult: Sendable {
    public let status: Int32
    public let stdout: [UInt8]
    public let stderr: [UInt8]
    /// Peak resident set size of the child in KiB (wait4 rusage). Note: a posix_spawn child is
    /// charged its parent's memory until exec, so measure programs through /usr/bin/time instead.
    public let maxRSSKiB: Int
    public var out: String { String(decoding: stdout, as: UTF8.self) }
    public var err: String { String(decoding: stderr, as: UTF8.self) }
}

/// The directory holding the built products (`coffer`, `coffer-server`): beside the test bundle,
/// or $COFFER_BIN_DIR.
public let productsDirectory: String = {
    if let d = ProcessInfo.processInfo.environment["COFFER_BIN_DIR"], !d.isEmpty { return d }
    var dir = URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent()
    for _ in 0..<4 {
        if FileManager.default.isExecutableFile(atPath: dir.path + "/coffer") { return dir.path }
        dir = dir.deletingLastPathComponent()
    }
    return FileManager.default.currentDirectoryPath + "/.build/debug"
}()

public var cofferBinary: String { productsDirectory + "/coffer" }

/// Runs a program to completion with optional stdin, capturing output and peak memory.
/// Uses posix_spawn and wait4 directly so the rusage is this child's alone.
@discardableResult
public func run(
    _ executable: String, _ arguments: [String], environment: [String: String] = [:],
    stdin: [UInt8]? = nil, stdinSource: ((Int32) -> Void)? = nil, cwd: String? = nil
) -> ProcessResult {
    let child = spawn(executable, arguments, environment: environment, cwd: cwd)
    if let stdin {
        var offset = 0
        while offset < stdin.count {
            let n = stdin.withUnsafeBytes {
                Glibc.write(child.stdinFD, $0.baseAddress! + offset, min(1 << 20, stdin.count - offset))
            }
            if n <= 0 { break }
            offset += n
        }
    } else if let stdinSource {
        stdinSource(child.stdinFD)
    }
    close(child.stdinFD)
    return child.wait()
}

/// A running child with pipes. Output is drained on background threads so it never blocks.
public final class Child: @unchecked Sendable {
    public let pid: pid_t
    public let stdinFD: Int32
    let outFD: Int32
    let errFD: Int32
    private var outData: [UInt8] = []
    private var errData: [UInt8] = []
    private let group = DispatchGroup()

    init(pid: pid_t, stdinFD: Int32, outFD: Int32, errFD: Int32) {
        self.pid = pid
        self.stdinFD = stdinFD
        self.outFD = outFD
        self.errFD = errFD
        drain(outFD) { self.outData = $0 }
        drain(errFD) { self.errData = $0 }
    }

    private func drain(_ fd: Int32, _ done: @escaping @Sendable ([UInt8]) -> Void) {
        group.enter()
        Thread.detachNewThread { [group] in
            var all: [UInt8] = []
            var buf = [UInt8](repeating: 0, count: 65536)
            while true {
                let n = buf.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress, 65536) }
                if n < 0 && errno == EINTR { continue }
                if n <= 0 { break }
                all += buf[0..<n]
            }
            close(fd)
            done(all)
            group.leave()
        }
    }

    public func kill(_ signal: Int32) { Glibc.kill(pid, signal) }

    public func wait() -> ProcessResult {
        var status: Int32 = 0
        var usage = rusage()
        while wait4(pid, &status, 0, &usage) < 0 && errno == EINTR {}
        group.wait()
        let code: Int32 = (status & 0x7f) == 0 ? (status >> 8) & 0xff : 128 + (status & 0x7f)
        return ProcessResult(status: code, stdout: outData, stderr: errData, maxRSSKiB: usage.ru_maxrss)
    }
}

public func spawn(
    _ executable: String, _ arguments: [String], environment: [String: String] = [:], cwd: String? = nil
) -> Child {
    // A child killed mid-test closes its stdin; writing to it must fail with EPIPE, not kill us.
    signal(SIGPIPE, SIG_IGN)
    if let cwd {
        return spawn(
            "/bin/sh", ["-c", "cd \"$0\" && exec \"$@\"", cwd, executable] + arguments, environment: environment)
    }
    var inPipe: [Int32] = [0, 0]
    var outPipe: [Int32] = [0, 0]
    var errPipe: [Int32] = [0, 0]
    // Close-on-exec: tests spawn in parallel, and a pipe end leaked into another test's child
    // (a mount daemon lives on) would keep this child's output open forever.
    spawnLock.lock()
    defer { spawnLock.unlock() }
    makeCloseOnExecPipe(&inPipe)
    makeCloseOnExecPipe(&outPipe)
    makeCloseOnExecPipe(&errPipe)
    var actions = posix_spawn_file_actions_t()
    posix_spawn_file_actions_init(&actions)
    posix_spawn_file_actions_adddup2(&actions, inPipe[0], 0)
    posix_spawn_file_actions_adddup2(&actions, outPipe[1], 1)
    posix_spawn_file_actions_adddup2(&actions, errPipe[1], 2)
    for fd in inPipe + outPipe + errPipe { posix_spawn_file_actions_addclose(&actions, fd) }
    closeInheritedDescriptors(&actions)
    var env = ProcessInfo.processInfo.environment
    for (k, v) in environment { env[k] = v }
    let argv = ([executable] + arguments).map { strdup($0) } + [nil]
    let envp = env.map { strdup("\($0.key)=\($0.value)") } + [nil]
    var pid: pid_t = 0
    let rc = posix_spawn(&pid, executable, &actions, nil, argv, envp)
    posix_spawn_file_actions_destroy(&actions)
    for p in argv { free(p) }
    for p in envp { free(p) }
    close(inPipe[0])
    close(outPipe[1])
    close(errPipe[1])
    if rc != 0 { pid = -1 }
    return Child(pid: pid, stdinFD: inPipe[1], outFD: outPipe[0], errFD: errPipe[0])
}

/// Held from creating a child's pipes until it is spawned, so no other test's spawn in between
/// can inherit them (pipe2 with O_CLOEXEC is not importable from Swift here).
public let spawnLock = NSLock()

/// Has the child close every descriptor above stderr. Close-on-exec pipes are not enough: tests
/// run in parallel in one process, and a file another test holds open on a mount (opened without
/// O_CLOEXEC) would live on in a long-lived child, so that mount's unmount fails with EBUSY.
/// `posix_spawn_file_actions_addclosefrom_np` (glibc 2.34) is not imported into Swift; looked up.
public func closeInheritedDescriptors(_ actions: inout posix_spawn_file_actions_t) {
    typealias F = @convention(c) (UnsafeMutablePointer<posix_spawn_file_actions_t>, Int32) -> Int32
    guard let p = dlsym(dlopen(nil, RTLD_NOW), "posix_spawn_file_actions_addclosefrom_np") else { return }
    _ = unsafeBitCast(p, to: F.self)(&actions, 3)
}

public func makeCloseOnExecPipe(_ fds: inout [Int32]) {
    pipe(&fds)
    for fd in fds { _ = fcntl(fd, F_SETFD, FD_CLOEXEC) }
}

/// Runs `coffer` against a data directory.
@discardableResult
public func coffer(
    _ dataDir: String, _ arguments: [String], stdin: [UInt8]? = nil, environment: [String: String] = [:]
) -> ProcessResult {
    run(
        cofferBinary, arguments, environment: environment.merging(["COFFER_DATA_DIR": dataDir]) { a, _ in a },
        stdin: stdin)
}

/// Runs a shell command line.
@discardableResult
public func sh(_ command: String, cwd: String? = nil, environment: [String: String] = [:]) -> ProcessResult {
    run("/bin/sh", ["-c", command], environment: environment, cwd: cwd)
}

/// Deterministic pseudo-random bytes (xorshift), for content that neither compresses nor dedups.
public func pseudoRandomBytes(count: Int, seed: UInt64) -> [UInt8] {
    var out = [UInt8](repeating: 0, count: count)
    var x = seed | 1
    out.withUnsafeMutableBytes { buf in
        let words = count / 8
        let p = buf.baseAddress!.assumingMemoryBound(to: UInt64.self)
        for i in 0..<words {
            x ^= x << 13
            x ^= x >> 7
            x ^= x << 17
            p[i] = x
        }
        for i in (words * 8)..<count {
            x ^= x << 13
            x ^= x >> 7
            x ^= x << 17
            buf[i] = UInt8(truncatingIfNeeded: x)
        }
    }
    return out
}

/// Every file under `directory` whose bytes contain `marker`.
public func filesContaining(_ marker: String, under directory: String) -> [String] {
    let needle = Array(marker.utf8)
    var hits: [String] = []
    guard let e = FileManager.default.enumerator(atPath: directory) else { return [] }
    while let rel = e.nextObject() as? String {
        let path = directory + "/" + rel
        var isDir: ObjCBool = false
        guard FileManager.default.fileExists(atPath: path, isDirectory: &isDir), !isDir.boolValue,
            let data = FileManager.default.contents(atPath: path)
        else { continue }
        if rel.contains(marker) {
            hits.append(path)
            continue
        }
        if data.range(of: Data(needle)) != nil { hits.append(path) }
    }
    return hits
}

/// Polls `condition` until it holds or `timeout` seconds pass.
public func eventually(timeout: Double = 5, interval: Double = 0.05, _ condition: () -> Bool) -> Bool {
    let deadline = Date().addingTimeInterval(timeout)
    while Date() < deadline {
        if condition() { return true }
        usleep(UInt32(interval * 1_000_000))
    }
    return condition()
}

/// SplitMix64: a small, fast, seedable generator, so every randomized test is reproducible.
public struct SplitMix: Sendable {
    public var state: UInt64
    public init(seed: UInt64) { state = seed }
    public mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
    public mutating func int(_ n: Int) -> Int { Int(next() % UInt64(n)) }
    public mutating func pick<T>(_ xs: [T]) -> T { xs[int(xs.count)] }
}
