import ArgumentParser
import CofferCrypto
import CofferFS
import CofferModel
import CofferSync
import CofferVault
import Foundation

struct Mount: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Mount the tree with FUSE (runs in the background unless --foreground).",
        discussion:
            "Unmount with `coffer unmount DIR` or `fusermount3 -u DIR`. The daemon logs to coffer.log in the data "
            + "directory."
    )
    @OptionGroup var store: StoreOptions
    @Flag(name: .long, help: "Stay attached to the terminal instead of running in the background.") var foreground =
        false
    @Option(name: .short, help: "FUSE mount options, e.g. -o allow_other (may repeat).") var o: [String] = []
    @Option(
        help: ArgumentHelp(
            "Seconds between syncs while the live channel to the server is down (it pulls changes as they happen "
                + "while it is up)."))
    var syncInterval: Double = 30
    @Option(
        help: ArgumentHelp(
            "Seconds of quiet after a local change before it is pushed (a file's writes reach the store when it "
                + "is closed or fsynced); during a burst, changes go up at least every second."))
    var syncQuiet: Double = 0.1
    @Option(
        help: ArgumentHelp(
            "Most records, keys, names and attributes each of the tree's caches holds (about 2 KB per entry in "
                + "all); the rest is read from the store as needed.", valueName: "n"))
    var cacheEntries: Int = Vault.defaultCacheEntries
    @Option(
        help: ArgumentHelp(
            "For a store on demand: content held on this device at most (e.g. 500M, 20G); the least recently read "
                + "content the server has is dropped past it, never a pinned file's or anything not yet pushed.",
            valueName: "size"))
    var cacheSize: String?
    @Argument(help: "An existing, empty folder.") var mountPoint: String

    /// Where the daemon finds the pipe it reports readiness on (`COFFER_READY_FD`).
    static let readyDescriptor: Int32 = 3
    /// Where the daemon reads the passphrase `coffer mount` asked for (`COFFER_PASSPHRASE_FD`).
    static let passphraseDescriptor: Int32 = 4

    func run() throws {
        try guarded {
            let dataDir = store.resolvedDataDir
            let point = (absolute(mountPoint) as NSString).standardizingPath
            guard FileManager.default.fileExists(atPath: dataDir + "/account.secret") else {
                throw VaultError.noAccount(dataDir)
            }
            if let cacheSize { _ = try Self.parseSize(cacheSize) }
            let readyFD = ProcessInfo.processInfo.environment["COFFER_READY_FD"].flatMap { Int32($0) }
            if !foreground && readyFD == nil {
                try daemonize(dataDir: dataDir, mountPoint: point)
                return
            }
            try serve(dataDir: dataDir, mountPoint: point, readyFD: readyFD)
        }
    }

    func serve(dataDir: String, mountPoint: String, readyFD: Int32?) throws {
        // A parent may have left termination signals blocked (libdispatch worker threads block
        // them, and posix_spawn passes the mask on); then SIGTERM would never unmount.
        var termination = sigset_t()
        sigemptyset(&termination)
        for sig in [SIGTERM, SIGINT, SIGHUP] { sigaddset(&termination, sig) }
        pthread_sigmask(SIG_UNBLOCK, &termination, nil)
        let logger = FileLogger(path: dataDir + "/coffer.log")
        let lock = try MountLock(directory: dataDir)
        let previous = MountLock.recorded(in: dataDir)
        try MountService.prepareMountPoint(mountPoint, leftByThisStore: previous?.mountPoint == mountPoint) {
            logger.log($0)
        }
        guard cacheEntries >= 16 else { throw CLIError("--cache-entries must be at least 16") }
        let vault = try Vault.open(
            dataDirectory: dataDir, passphrase: CLIPassphraseSource(), cacheEntries: cacheEntries)
        // Reclaim what interrupted writes left, while no other process has the store open, when
        // that pays (`garbageWorthCollectingAtMount`): a collection reads the whole store.
        if (try? vault.garbageWorthCollectingAtMount()) ?? true, let gc = try? vault.collectGarbage() {
            logger.log(
                "garbage collection: \(gc.chunks) chunks, \(gc.manifests) manifests, \(gc.compactedPacks) packs "
                    + "rewritten"
            )
        }
        try vault.mark(.daemon, running: true)
        lock.record(mountPoint: mountPoint, pid: getpid())
        if readyFD == nil {
            print("Coffer mounted at \(mountPoint); press Ctrl-C or run `coffer unmount \(mountPoint)` to unmount.")
        }
        var services: (@Sendable (@escaping @Sendable (Set<FileID>) -> Void) -> MountServices)? = nil
        if vault.syncStatus.server != nil {
            let engine = try SyncEngine.forStore(vault)
            // A store on demand fetches what is read (docs/SYNC.md, "Content on demand"); the
            // source is there whatever the setting, which `coffer on-demand` may change while
            // the mount runs, and is asked only for content this device lacks.
            vault.setRemoteContent(engine.contentSource)
            if cacheSize != nil { vault.trackContentReads() }
            let (interval, quiet) = (syncInterval, syncQuiet)
            let limit = try cacheSize.map(Self.parseSize)
            let trim: @Sendable () -> Void = {
                guard let limit else { return }
                do {
                    let dropped = try vault.trimContent(to: limit)
                    if dropped > 0 { logger.log("cache: dropped \(dropped) bytes of content the server has") }
                } catch {
                    logger.log("cache: trimming failed: \(error)")
                }
            }
            trim()
            services = { changed in
                let scheduler = SyncScheduler(
                    engine: engine, quietPeriod: quiet, interval: interval, onChange: changed,
                    log: { logger.log($0) }, afterSync: trim)
                scheduler.start()
                return MountServices(storeChanged: { scheduler.storeChanged() }, stop: { scheduler.stop() })
            }
        }
        try MountService.serve(vault: vault, mountPoint: mountPoint, options: o, logger: logger, services: services) {
            if let fd = readyFD {
                var one: UInt8 = 1
                _ = Glibc.write(fd, &one, 1)
                close(fd)
            }
        }
        try? vault.mark(.daemon, running: false)
        logger.log("daemon exiting")
        withExtendedLifetime(lock) {}
    }

    /// Bytes from "123", "500K", "500M", "20G" or "1T" (powers of 1024).
    static func parseSize(_ text: String) throws -> Int {
        let units: [Character: Int] = ["K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40]
        var digits = text.uppercased()
        var scale = 1
        if let last = digits.last, let u = units[last] {
            scale = u
            digits.removeLast()
        }
        guard let n = Int(digits), n >= 0 else {
            throw CLIError("--cache-size: \(text) is not a size like 500M or 20G")
        }
        let (bytes, overflow) = n.multipliedReportingOverflow(by: scale)
        guard !overflow else { throw CLIError("--cache-size: \(text) is too large") }
        return bytes
    }

    /// Starts this command again in its own session, detached, and waits until it reports the
    /// mount is up (or fails), so `coffer mount` returns only when the mount is usable.
    func daemonize(dataDir: String, mountPoint: String) throws {
        // The daemon has no terminal: a passphrase is asked here, once, and handed over a pipe.
        let passphraseFD =
            try Vault.accountKeyIsProtected(dataDirectory: dataDir)
            ? try passphrasePipe(CLIPassphraseSource().existingPassphrase()) : nil
        defer { if let passphraseFD { close(passphraseFD) } }
        var fds: [Int32] = [0, 0]
        guard pipe(&fds) == 0 else { throw CLIError("cannot create a pipe") }
        let logPath = dataDir + "/coffer.log"
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        posix_spawn_file_actions_addopen(&actions, 1, logPath, O_WRONLY | O_CREAT | O_APPEND, 0o600)
        posix_spawn_file_actions_addopen(&actions, 2, logPath, O_WRONLY | O_CREAT | O_APPEND, 0o600)
        posix_spawn_file_actions_addclose(&actions, fds[0])
        // The daemon outlives this command: it keeps only stdio and the ready pipe (moved to 3),
        // never descriptors its caller left open (a script's lock file, a pipe someone waits
        // to see closed, a file on another mount that could then not be unmounted).
        posix_spawn_file_actions_adddup2(&actions, fds[1], Self.readyDescriptor)
        if let passphraseFD { posix_spawn_file_actions_adddup2(&actions, passphraseFD, Self.passphraseDescriptor) }
        closeDescriptors(
            from: (passphraseFD == nil ? Self.readyDescriptor : Self.passphraseDescriptor) + 1, in: &actions)
        var attr = posix_spawnattr_t()
        posix_spawnattr_init(&attr)
        posix_spawnattr_setflags(&attr, 0x80)  // POSIX_SPAWN_SETSID (glibc), not imported into Swift
        var args = ["coffer", "mount", "--foreground", "--data-dir", dataDir]
        for opt in o { args += ["-o", opt] }
        args += ["--sync-interval", String(syncInterval), "--sync-quiet", String(syncQuiet)]
        args += ["--cache-entries", String(cacheEntries)]
        if let cacheSize { args += ["--cache-size", cacheSize] }
        args.append(mountPoint)
        var env = ProcessInfo.processInfo.environment
        env["COFFER_READY_FD"] = String(Self.readyDescriptor)
        // Read by glibc as the daemon starts, before any thread takes an arena of its own.
        if env["MALLOC_ARENA_MAX"] == nil { env["MALLOC_ARENA_MAX"] = String(MountService.arenas) }
        env[CLIPassphraseSource.descriptorVariable] = passphraseFD == nil ? nil : String(Self.passphraseDescriptor)
        let argv = args.map { strdup($0) } + [nil]
        let envp = env.map { strdup("\($0.key)=\($0.value)") } + [nil]
        var pid: pid_t = 0
        let rc = posix_spawn(&pid, "/proc/self/exe", &actions, &attr, argv, envp)
        for p in argv { free(p) }
        for p in envp { free(p) }
        posix_spawn_file_actions_destroy(&actions)
        posix_spawnattr_destroy(&attr)
        close(fds[1])
        guard rc == 0 else { throw CLIError("cannot start the mount daemon: \(String(cString: strerror(rc)))") }
        var byte: UInt8 = 0
        let n = Glibc.read(fds[0], &byte, 1)
        close(fds[0])
        if n == 1 {
            print("Coffer mounted at \(mountPoint) (daemon pid \(pid)); unmount with `coffer unmount \(mountPoint)`.")
            return
        }
        var status: Int32 = 0
        waitpid(pid, &status, 0)
        let lastLine =
            (try? String(contentsOfFile: logPath, encoding: .utf8))?.split(separator: "\n").last.map(String.init) ?? ""
        let reason = lastLine.components(separatedBy: "coffer: ").last ?? "see \(logPath)"
        throw CLIError(reason.isEmpty ? "the mount daemon failed; see \(logPath)" : reason)
    }

    /// A pipe already holding `passphrase` and a line break, its write end closed; returns the
    /// read end, numbered above the descriptors the daemon's are moved to so no dup2 clobbers it.
    /// A passphrase (at most 1 KiB) fits in any pipe buffer, so writing cannot block.
    private func passphrasePipe(_ passphrase: Passphrase) throws -> Int32 {
        var fds: [Int32] = [0, 0]
        guard pipe(&fds) == 0 else { throw CLIError("cannot create a pipe") }
        defer {
            close(fds[0])
            close(fds[1])
        }
        let written = passphrase.withUnsafeBytes { Glibc.write(fds[1], $0.baseAddress, $0.count) }
        let newline: [UInt8] = [0x0a]
        guard written == passphrase.count, Glibc.write(fds[1], newline, 1) == 1 else {
            throw CLIError("cannot hand the passphrase to the mount daemon")
        }
        let high = fcntl(fds[0], F_DUPFD_CLOEXEC, 10)
        guard high >= 0 else { throw CLIError("cannot hand the passphrase to the mount daemon") }
        return high
    }
}

struct Unmount: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Unmount a mounted tree and wait until the daemon has flushed everything.")
    @OptionGroup var store: StoreOptions
    @Argument var mountPoint: String

    func run() throws {
        try guarded {
            let point = (absolute(mountPoint) as NSString).standardizingPath
            guard MountService.isMounted(point) else { throw CLIError("\(point) is not mounted") }
            let status = MountService.runQuietly("/bin/fusermount3", ["-u", point])
            guard status == 0 else {
                throw CLIError("cannot unmount \(point): it is busy (a program has files open there)")
            }
            // Wait for the daemon serving this store to finish flushing and exit.
            let dir = store.resolvedDataDir
            if let rec = MountLock.recorded(in: dir), rec.mountPoint == point {
                let deadline = Date().addingTimeInterval(30)
                while MountLock.isHeld(in: dir) && Date() < deadline { usleep(20_000) }
            }
        }
    }
}

/// Has a spawned child close every descriptor from `first` up. glibc 2.34's
/// `posix_spawn_file_actions_addclosefrom_np` is not imported into Swift, so it is looked up;
/// on an older libc the child keeps them, as before.
private func closeDescriptors(from first: Int32, in actions: inout posix_spawn_file_actions_t) {
    typealias AddCloseFrom = @convention(c) (UnsafeMutablePointer<posix_spawn_file_actions_t>, Int32) -> Int32
    guard let symbol = dlsym(dlopen(nil, RTLD_NOW), "posix_spawn_file_actions_addclosefrom_np") else { return }
    _ = unsafeBitCast(symbol, to: AddCloseFrom.self)(&actions, first)
}
