import Foundation

#if canImport(Glibc)
    import Glibc
#endif

/// A real `coffer-server` on loopback, on a free port, with its own data directory. Stopped
/// (SIGTERM, then SIGKILL) when released.
public final class ServerProcess: @unchecked Sendable {
    public let dataDirectory: String
    public private(set) var port: Int = 0
    public private(set) var pid: pid_t = -1
    private var outFD: Int32 = -1
    private let lock = NSLock()
    private var output: [String] = []

    public private(set) var scheme = "http"
    /// The arguments given at creation, used again by `restart` and a bare `start`.
    private var arguments: [String] = []

    public var url: String { "\(scheme)://127.0.0.1:\(port)" }
    public var binary: String { productsDirectory + "/coffer-server" }

    /// Starts the server; `port` 0 picks a free one (and a restart reuses the last one).
    public init(dataDirectory: String, extraArguments: [String] = []) throws {
        self.dataDirectory = dataDirectory
        self.arguments = extraArguments
        try start()
    }

    public func start(extraArguments: [String]? = nil) throws {
        let extraArguments = extraArguments ?? arguments
        signal(SIGPIPE, SIG_IGN)
        var outPipe: [Int32] = [0, 0]
        spawnLock.lock()  // until the child exists: see spawn(), no leaks into other tests' children
        makeCloseOnExecPipe(&outPipe)
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        posix_spawn_file_actions_adddup2(&actions, outPipe[1], 1)
        posix_spawn_file_actions_addopen(
            &actions, 2, dataDirectory + "/../server-\(UInt32.random(in: 0...UInt32.max)).log",
            O_WRONLY | O_CREAT | O_APPEND, 0o600)
        posix_spawn_file_actions_addclose(&actions, outPipe[0])
        posix_spawn_file_actions_addclose(&actions, outPipe[1])
        closeInheritedDescriptors(&actions)
        // Tests create many accounts; the per-address creation limit would refuse them.
        let args =
            [
                binary, "--data", dataDirectory, "--host", "127.0.0.1", "--port", String(port), "--accounts-per-minute",
                "0",
            ] + extraArguments
        let argv = args.map { strdup($0) } + [nil]
        let envp = ProcessInfo.processInfo.environment.map { strdup("\($0.key)=\($0.value)") } + [nil]
        var child: pid_t = 0
        let rc = posix_spawn(&child, binary, &actions, nil, argv, envp)
        posix_spawn_file_actions_destroy(&actions)
        for p in argv { free(p) }
        for p in envp { free(p) }
        close(outPipe[1])
        spawnLock.unlock()
        guard rc == 0 else {
            close(outPipe[0])
            throw TestFailure("cannot start \(binary): \(rc)")
        }
        pid = child
        outFD = outPipe[0]
        // Read lines until the listening line shows the port.
        var buffer: [UInt8] = []
        let deadline = Date().addingTimeInterval(30)
        var found = false
        while Date() < deadline && !found {
            var byte: UInt8 = 0
            let n = read(outFD, &byte, 1)
            if n <= 0 { break }
            if byte == 0x0a {
                let line = String(decoding: buffer, as: UTF8.self)
                buffer = []
                lock.lock()
                output.append(line)
                lock.unlock()
                if let r = line.range(of: "listening on "), let sep = line[r.upperBound...].range(of: "://") {
                    scheme = String(line[r.upperBound..<sep.lowerBound])
                    let rest = line[sep.upperBound...]
                    if let colon = rest.lastIndex(of: ":"),
                        let p = Int(rest[rest.index(after: colon)...].prefix(while: { $0.isNumber }))
                    {
                        port = p
                        found = true
                    }
                }
            } else {
                buffer.append(byte)
            }
        }
        guard found else {
            stop()
            throw TestFailure("coffer-server did not report its port: \(output)")
        }
        // Keep draining stdout so the server never blocks on a full pipe.
        let fd = outFD
        Thread.detachNewThread {
            var buf = [UInt8](repeating: 0, count: 4096)
            while buf.withUnsafeMutableBytes({ read(fd, $0.baseAddress, 4096) }) > 0 {}
            close(fd)
        }
    }

    /// Stops gracefully (SIGTERM); kills if it does not exit in time.
    public func stop(signal sig: Int32 = SIGTERM) {
        guard pid > 0 else { return }
        kill(pid, sig)
        var status: Int32 = 0
        let deadline = Date().addingTimeInterval(10)
        while waitpid(pid, &status, WNOHANG) == 0 {
            if Date() > deadline {
                kill(pid, SIGKILL)
                waitpid(pid, &status, 0)
                break
            }
            usleep(10_000)
        }
        pid = -1
    }

    /// The server's own audit of every account (`coffer-server --audit`), run beside it.
    public func audit() -> ProcessResult {
        run(binary, ["--audit", "--data", dataDirectory])
    }

    /// `coffer-server --cleanup` with no grace period.
    public func cleanup() -> ProcessResult {
        run(binary, ["--cleanup", "--grace-seconds", "0", "--data", dataDirectory])
    }

    public func restart() throws {
        stop()
        try start()
    }

    deinit { stop() }
}

public struct TestFailure: Error, CustomStringConvertible {
    public let description: String
    public init(_ d: String) { description = d }
}
