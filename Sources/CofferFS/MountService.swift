import CFuse
import CofferFuse
import CofferModel
import CofferVault
import Foundation
import Synchronization

/// Appends timestamped lines to the daemon's log file in the data directory.
public final class FileLogger: Sendable {
    let fd: Int32
    let lock = Mutex(())

    public init(path: String) {
        fd = Foundation.open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0o600)
    }

    deinit { if fd >= 0 { close(fd) } }

    public func log(_ message: String) {
        guard fd >= 0 else { return }
        let stamp = ISO8601DateFormatter().string(from: Date())
        let line = Array("\(stamp) [\(getpid())] \(message)\n".utf8)
        lock.withLock { _ in _ = line.withUnsafeBytes { Foundation.write(fd, $0.baseAddress, $0.count) } }
    }
}

/// Background work the mount runs beside the filesystem (the sync scheduler): told whenever the
/// store changed, stopped at unmount.
public struct MountServices: Sendable {
    public var storeChanged: @Sendable () -> Void
    public var stop: @Sendable () -> Void
    public init(storeChanged: @escaping @Sendable () -> Void, stop: @escaping @Sendable () -> Void) {
        self.storeChanged = storeChanged
        self.stop = stop
    }
}

public struct MountError: Error, CustomStringConvertible {
    public let description: String
    public init(_ d: String) { description = d }
}

/// Everything around the FUSE session: checking the mount point, cleaning a stale mount,
/// running the session with the change watcher, and flushing on the way out.
public enum MountService {
    /// The mount point must be an existing, empty folder. A mount left behind by a killed daemon
    /// ("Transport endpoint is not connected") is lazily unmounted first.
    /// `leftByThisStore`: the store's own record says its last daemon served `path` (and that
    /// daemon is gone, since the caller holds the mount lock), so a mount there is stale even if
    /// the kernel still answers stat from its cache.
    public static func prepareMountPoint(_ path: String, leftByThisStore: Bool = false, log: (String) -> Void) throws {
        var st = stat()
        if leftByThisStore && isMounted(path) {
            log("cleaning up a stale mount at \(path) (left by this store's previous daemon)")
            _ = runQuietly("/bin/fusermount3", ["-u", "-z", path])
        }
        if stat(path, &st) != 0 {
            if errno == ENOTCONN || isMounted(path) {
                log("cleaning up a stale mount at \(path)")
                _ = runQuietly("/bin/fusermount3", ["-u", "-z", path])
                guard stat(path, &st) == 0 else { throw MountError("cannot clean up the stale mount at \(path)") }
            } else {
                throw MountError("mount point \(path) does not exist")
            }
        } else if isMounted(path) {
            throw MountError("\(path) is already a mount point")
        }
        guard st.st_mode & S_IFMT == S_IFDIR else { throw MountError("mount point \(path) is not a folder") }
        let entries = (try? FileManager.default.contentsOfDirectory(atPath: path)) ?? []
        guard entries.isEmpty else { throw MountError("mount point \(path) is not empty") }
    }

    /// Whether `path` is a mount point now (per /proc/self/mountinfo).
    public static func isMounted(_ path: String) -> Bool {
        guard let text = try? String(contentsOfFile: "/proc/self/mountinfo", encoding: .utf8) else { return false }
        let target = (path as NSString).standardizingPath
        for line in text.split(separator: "\n") {
            let fields = line.split(separator: " ")
            if fields.count > 4, unescapeMountPath(String(fields[4])) == target { return true }
        }
        return false
    }

    static func unescapeMountPath(_ s: String) -> String {
        s.replacingOccurrences(of: "\\040", with: " ").replacingOccurrences(of: "\\011", with: "\t")
            .replacingOccurrences(of: "\\012", with: "\n").replacingOccurrences(of: "\\134", with: "\\")
    }

    @discardableResult
    public static func runQuietly(_ tool: String, _ args: [String]) -> Int32 {
        let p = Process()
        p.executableURL = URL(fileURLWithPath: tool)
        p.arguments = args
        p.standardOutput = FileHandle.nullDevice
        p.standardError = FileHandle.nullDevice
        do { try p.run() } catch { return 127 }
        p.waitUntilExit()
        return p.terminationStatus
    }

    /// The daemon's allocator settings. First, freed chunk buffers stay in the allocator
    /// instead of handing their pages back.
    ///
    /// A large write fills 256 KiB plaintext buffers, seals them into as many sealed buffers and
    /// frees all of them every 16 MiB. glibc served each from a fresh mmap (or trimmed the heap
    /// they came from), so every cycle faulted in and zeroed new pages: about 8% of the daemon's
    /// CPU writing 256 MiB (perf: page faults, `clear_page`, cgroup charging). Below 32 MiB
    /// allocations now come from the heap, which keeps up to 64 MiB free before trimming.
    /// Resident memory stays bounded by the peak in use (the write buffers' limits), plus that.
    /// Measured A/B, 256 MiB write, 8 pairs: daemon CPU 79-84 -> 71-76 ticks, wall 0.56-0.61 ->
    /// 0.52-0.57 s; peak resident memory writing 2 GiB of random data 132 -> 160 MB.
    /// (`mallopt` comes through CFuse's shim: the Glibc module does not include malloc.h.)
    ///
    /// Second, `arenas` arenas at most (see there), for the threads started from here on.
    static func configureAllocator() {
        _ = mallopt(M_MMAP_THRESHOLD, 32 << 20)
        _ = mallopt(M_TRIM_THRESHOLD, 64 << 20)
        _ = mallopt(M_ARENA_MAX, Int32(clamping: arenas))
    }

    /// How many allocator arenas the daemon uses: one per core, not glibc's eight per core.
    /// Each arena keeps what was freed in it for its own threads, and with FUSE workers, the
    /// group-commit thread and GRDB's queues allocating and freeing each other's blocks, free
    /// memory piled up in many arenas. Daemon RSS right after `ls -lR` of a million files:
    /// 183 MiB, 141 MiB with two arenas (121 with one); copying in and reading a 512 MiB file
    /// took the same time within noise (2 cores). The mount command starts the daemon with
    /// `MALLOC_ARENA_MAX` set to this, since threads that start before `serve` (the runtime's,
    /// GRDB's) take arenas of their own that a later `mallopt` cannot take back (158 MiB).
    public static var arenas: Int { max(2, ProcessInfo.processInfo.activeProcessorCount) }

    /// Hands the allocator's free pages back to the system (`malloc_trim`: the heaps' tops and
    /// every free page inside them, in every thread's arena). What `configureAllocator`
    /// keeps for the next write, and what churning caches leave free between live blocks, was
    /// 37 MiB of the daemon's 187 MiB after `ls -lR` of a million files. Run every few seconds
    /// by the `ChangeWatcher`'s thread, the daemon's only periodic one: a few milliseconds, and
    /// a large write faults its buffers in again once per call at most.
    static func returnFreedMemory() { _ = malloc_trim(0) }

    /// Whether the mount asks the kernel to check modes, uid and gid (`default_permissions`).
    ///
    /// Always, except when root mounts without allow_other (or allow_root): then the kernel lets
    /// only root's processes in, and for them every check `default_permissions` makes passes
    /// (CAP_DAC_OVERRIDE, CAP_FOWNER, CAP_CHOWN), except execute on a file without any execute
    /// bit, which the kernel refuses either way. The checks themselves are not what costs:
    /// with them, every create or unlink makes the kernel drop the folder's cached attributes
    /// and fetch them again (one more request) before its next permission check in that folder,
    /// an extra round trip per file for untar and rm -rf (12,000 GETATTRs for the 12,000-file
    /// tree; rm -rf 1.57 -> 1.17 s in an A/B). A root process that dropped those capabilities
    /// is the one caller held to less than on a local filesystem; `-o default_permissions`
    /// restores the kernel's checks for it.
    static func kernelChecksPermissions(uid: uid_t, options: [String]) -> Bool {
        uid != 0 || options.contains { ["allow_other", "allow_root", "default_permissions"].contains($0) }
    }

    /// `coffer mount -o stats`: log, at unmount, the CPU time spent in each FUSE operation.
    public static let statsOption = "stats"

    /// Mounts `vault` at `mountPoint` and serves until unmounted or signalled. `ready` runs once
    /// the kernel has the mount.
    /// `services`, if given, starts background work (the sync scheduler) once serving; it gets a
    /// function that tells the kernel about changed files.
    public static func serve(
        vault: Vault, mountPoint: String, options: [String], logger: FileLogger,
        services: (@Sendable (_ changed: @escaping @Sendable (Set<FileID>) -> Void) -> MountServices)? = nil,
        ready: @escaping @Sendable () -> Void
    ) throws {
        let log: @Sendable (String) -> Void = { logger.log($0) }
        configureAllocator()
        let requested = options.flatMap { $0.split(separator: ",").map(String.init) }
        // Coffer's own option, not libfuse's.
        let fs = try CofferFileSystem(vault: vault, measuringOperations: requested.contains(Self.statsOption), log: log)
        var mountOptions = ["fsname=coffer", "subtype=coffer"]
        if Self.kernelChecksPermissions(uid: getuid(), options: requested) {
            mountOptions.append("default_permissions")
        }
        mountOptions += requested.filter { $0 != "default_permissions" && $0 != Self.statsOption }
        let configuration = FuseSession.Configuration(mountOptions: mountOptions)
        let session = FuseSession(mountPoint: mountPoint, operations: fs, configuration: configuration)
        fs.onReady = {
            ready()
            // Off the FUSE thread: finding the mount's device asks this very filesystem.
            let t = Thread { ReadAhead.raise(at: mountPoint, log: log) }
            t.name = "coffer-readahead"
            t.start()
        }
        // The watcher tells the kernel what the services changed, and the services what the
        // store's watcher saw: each needs the other, so the second link is made after both exist.
        let started = Mutex<MountServices?>(nil)
        let watcher = ChangeWatcher(fs: fs, session: session) { started.withLock { $0 }?.storeChanged() }
        let running = services?({ ids in
            vault.adoptExternalContent(ids)
            watcher.invalidate(ids)
        })
        started.withLock { $0 = running }
        fs.beforeDestroy = {
            running?.stop()
            watcher.stop()
        }
        watcher.start()
        // Many small operations (untar, git) share SQLite commits; fsync and unmount still make
        // everything durable first (see Vault.enableGroupCommit).
        vault.enableGroupCommit()
        defer { try? vault.disableGroupCommit() }
        // A folder's record is rewritten once per burst, not for every entry added or removed
        // (the watcher writes what is pending every tick; unmount writes the rest).
        vault.coalesceFolderTimes(true)
        defer { vault.coalesceFolderTimes(false) }
        log("serving \(vault.dataDirectory) at \(mountPoint) with options \(mountOptions.joined(separator: ","))")
        defer { watcher.stop() }
        do {
            try session.run()
        } catch {
            throw MountError("cannot mount at \(mountPoint): \(error)")
        }
        // A request that blocked for 10 ms or more while holding the reader (see
        // CFuseReader/fuse_reader.c): worth knowing when looking into a slow mount.
        let takeovers = session.readerTakeovers
        if takeovers > 0 { log("reading was taken over from a worker stuck in a request \(takeovers) times") }
    }
}

/// The kernel reads ahead at most `read_ahead_kb` of a FUSE file per window (128 KiB by default,
/// and FUSE cannot ask for more at INIT). Each window is one round trip and one chunk's worth of
/// decryption at a time; larger windows keep more 1 MiB requests in flight, so the daemon's
/// threads decrypt on both cores while the reader copies. Measured on a 256 MiB sequential read
/// after dropping caches: 1.29 s at 128 KiB, 0.88 s at 1 MiB (2026-11-23, alternating, two runs
/// each); on 2026-11-25, with chunks opened in place, 0.40-0.43 s at 1 MiB against 0.36-0.39 s
/// at 2, 4 and 8 MiB (three runs each). The kernel grows a window only for sequential reads, so
/// random access still reads ahead little. Only root may change it; others keep the default.
enum ReadAhead {
    static let kilobytes = 4096

    static func raise(at mountPoint: String, log: @Sendable (String) -> Void) {
        var st = stat()
        guard stat(mountPoint, &st) == 0 else { return }
        let dev = UInt64(st.st_dev)
        let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & ~UInt64(0xfff))
        let minor = (dev & 0xff) | ((dev >> 12) & ~UInt64(0xff))
        let path = "/sys/class/bdi/\(major):\(minor)/read_ahead_kb"
        guard
            let current = (try? String(contentsOfFile: path, encoding: .utf8)).flatMap({
                Int($0.trimmingCharacters(in: .whitespacesAndNewlines))
            })
        else {
            return
        }
        guard current < kilobytes else { return }  // never lower what someone chose
        do {
            try "\(kilobytes)".write(toFile: path, atomically: false, encoding: .utf8)
            log("read-ahead raised from \(current) to \(kilobytes) KiB (\(path))")
        } catch {
            log("read-ahead stays at \(current) KiB: cannot write \(path) (needs root)")
        }
    }
}
