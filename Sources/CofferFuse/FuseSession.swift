import CFuse
import CFuseReader
import Synchronization

#if canImport(Glibc)
    import Glibc
#endif

/// Why a session could not run.
public enum FuseSessionError: Error, Sendable, Equatable {
    /// `run()` may be called once per session object.
    case alreadyStarted
    /// libfuse rejected the options (it prints the reason to stderr).
    case invalidOptions([String])
    case mountFailed(mountPoint: String)
    case resourceFailure(errno: Int32)
    /// The request loop stopped on an error rather than an unmount.
    case loopFailed(errno: Int32)
}

/// One FUSE mount served by a `FileSystemOperations` implementation.
///
/// ```swift
/// let session = FuseSession(mountPoint: "/mnt/coffer", operations: fs,
///                           configuration: .init(mountOptions: ["default_permissions", "fsname=coffer"]))
/// try session.run()          // blocks until unmounted, exit(), or SIGTERM/SIGINT/SIGHUP
/// ```
///
/// `run()` owns the whole lifecycle on the calling thread: create, mount,
/// serve on libfuse's worker threads, then unmount, `destroy()`, release.
/// Everything else (`exit`, invalidation, `connection`) may be called from
/// any thread.
public final class FuseSession: Sendable {
    public enum ReaddirPlusMode: Sendable, Equatable {
        /// Every listing uses readdirplus (attributes and lookups with the
        /// names): one round trip for `ls -l`, at the price of a lookup
        /// reference per listed entry.
        case always
        /// The kernel decides per directory (libfuse's default heuristic).
        case auto
        /// Plain readdir only; attributes come through separate lookups.
        case never
    }

    public struct Configuration: Sendable {
        /// Passed to libfuse as one `-o` list, e.g. `default_permissions`,
        /// `allow_other`, `fsname=coffer`, `subtype=coffer`, `ro`.
        public var mountOptions: [String]
        /// Seconds the kernel may cache a name → inode mapping.
        public var entryTimeout: Double
        /// Seconds the kernel may cache attributes.
        public var attributeTimeout: Double
        /// Seconds the kernel may cache "no such name" answers; 0 disables
        /// (missing names then always reach `lookup`). Names created through
        /// the mount drop the negative entry themselves; names appearing from
        /// elsewhere (a sync) need `invalidateEntry` when this is non-zero.
        public var negativeTimeout: Double
        /// Largest write request to negotiate, bytes (libfuse caps it at
        /// its buffer size, 1 MiB on 4 KiB pages).
        public var maxWrite: UInt32
        /// Upper bound on libfuse worker threads serving requests.
        public var maxThreads: UInt32
        /// Idle workers kept before extra ones exit; -1 keeps them all
        /// (libfuse's recommendation: thread churn costs more than memory). The spinning reader
        /// needs -1: a worker libfuse ends after a short request would leave holding the reading
        /// token, so any other value keeps libfuse's own reader.
        public var maxIdleThreads: Int32
        public var readdirPlus: ReaddirPlusMode
        /// Route SIGTERM/SIGINT/SIGHUP to `exit()` while running. Only one
        /// session per process can own them; later ones run without.
        public var handleSignals: Bool
        /// libfuse's request trace on stderr (`-d`).
        public var debug: Bool
        /// How long the reader polls /dev/fuse before it sleeps, microseconds
        /// (`CFuseReader/fuse_reader.c`); 0 keeps libfuse's own reader, every idle worker
        /// blocked in read(2).
        public var spinMicroseconds: Int
        /// How long one short request may keep the reader before a waiting
        /// worker takes over reading, microseconds (a blocked request must not
        /// hold up the others). Checked this often while requests flow, once
        /// a second when the mount is idle.
        public var stallMicroseconds: Int

        public init(
            mountOptions: [String] = [],
            entryTimeout: Double = 1.0,
            attributeTimeout: Double = 1.0,
            negativeTimeout: Double = 0,
            maxWrite: UInt32 = 1 << 20,
            maxThreads: UInt32 = 10,
            maxIdleThreads: Int32 = -1,
            readdirPlus: ReaddirPlusMode = .always,
            handleSignals: Bool = true,
            debug: Bool = false,
            spinMicroseconds: Int = 50,
            stallMicroseconds: Int = 10_000
        ) {
            self.mountOptions = mountOptions
            self.entryTimeout = entryTimeout
            self.attributeTimeout = attributeTimeout
            self.negativeTimeout = negativeTimeout
            self.maxWrite = maxWrite
            self.maxThreads = maxThreads
            self.maxIdleThreads = maxIdleThreads
            self.readdirPlus = readdirPlus
            self.handleSignals = handleSignals
            self.debug = debug
            self.spinMicroseconds = spinMicroseconds
            self.stallMicroseconds = stallMicroseconds
        }
    }

    public let mountPoint: String
    public let configuration: Configuration
    private let bridge: FuseBridge

    /// How many times a waiting worker took reading over from one stuck in a short request
    /// (0 without the spinning reader); after the session ended, the count it ended with.
    /// Callable from any thread: the lock keeps the reader from being freed while it is asked.
    public var readerTakeovers: Int {
        takeoversLock.withLock { final in
            let reader = bridge.reader.load(ordering: .acquiring)
            return reader == 0 ? final : Int(coffer_fuse_reader_takeovers(OpaquePointer(bitPattern: reader)))
        }
    }
    private let takeoversLock = Mutex(0)

    private let state = Mutex(State())

    /// `struct fuse_session *` is only touched under `state`'s lock or by
    /// the thread inside `run()`, which owns its lifetime.
    private struct SessionPointer: @unchecked Sendable {
        let raw: OpaquePointer
    }

    private enum Phase: Sendable { case idle, running, finished }

    private struct State: Sendable {
        var phase: Phase = .idle
        var exitRequested = false
        /// Non-nil while notifications may use the session.
        var session: SessionPointer?
        var notificationsInFlight = 0
        /// The thread blocked in fuse_session_loop_mt, once it is there.
        var loopThread: pthread_t?
        var loopFinished = false
        var watcherWriteFD: Int32 = -1
    }

    public init(mountPoint: String, operations: any FileSystemOperations, configuration: Configuration = .init()) {
        self.mountPoint = mountPoint
        self.configuration = configuration
        self.bridge = FuseBridge(operations: operations, configuration: configuration)
    }

    /// What FUSE_INIT negotiated; nil until the kernel connected.
    public var connection: ConnectionInfo? {
        bridge.connection.withLock { $0 }
    }

    /// Mounts and serves until the filesystem is unmounted (`fusermount3
    /// -u`, `umount`), `exit()` is called, or a termination signal arrives.
    /// Returns after `destroy()` ran and the mount is gone.
    public func run() throws(FuseSessionError) {
        let proceed = state.withLock { state -> Bool in
            guard state.phase == .idle else { return false }
            state.phase = .running
            return true
        }
        guard proceed else { throw .alreadyStarted }
        defer { state.withLock { $0.phase = .finished } }
        if state.withLock({ $0.exitRequested }) { return }

        let se = try createSession()
        defer { fuse_session_destroy(se) }  // runs the destroy hook if init happened

        var pipeFDs: [Int32] = [-1, -1]
        guard pipe(&pipeFDs) == 0 else { throw .resourceFailure(errno: errno) }
        let (readFD, writeFD) = (pipeFDs[0], pipeFDs[1])
        _ = fcntl(readFD, F_SETFD, FD_CLOEXEC)
        _ = fcntl(writeFD, F_SETFD, FD_CLOEXEC)
        // A full pipe must never block a signal handler.
        _ = fcntl(writeFD, F_SETFL, fcntl(writeFD, F_GETFL) | O_NONBLOCK)
        defer {
            close(readFD)
            close(writeFD)
        }

        let watcher = try startWatcher(readFD: readFD)
        state.withLock { $0.watcherWriteFD = writeFD }

        let savedSignals = configuration.handleSignals ? installTerminationHandlers(writeFD: writeFD) : nil
        installLoopWakeHandler()
        unblockLoopWakeSignal()

        let mounted = fuse_session_mount(se, mountPoint) == 0
        var loopResult: Int32 = 0
        if mounted {
            let exitEarly = state.withLock { state -> Bool in
                state.session = SessionPointer(raw: se)
                state.loopThread = pthread_self()
                return state.exitRequested
            }
            if exitEarly { fuse_session_exit(se) }
            // Falls back to libfuse's reader if it cannot be installed.
            var reader: OpaquePointer?
            if configuration.spinMicroseconds > 0, configuration.maxIdleThreads == -1,
                coffer_fuse_reader_install(
                    se, configuration.spinMicroseconds * 1000, configuration.stallMicroseconds * 1000, &reader) == 0
            {
                bridge.reader.store(Int(bitPattern: reader), ordering: .releasing)
            }
            loopResult = coffer_fuse_session_loop_mt(
                se, configuration.maxThreads, configuration.maxIdleThreads, 0)
            takeoversLock.withLock { final in
                if let reader { final = Int(coffer_fuse_reader_takeovers(reader)) }
                bridge.reader.store(0, ordering: .releasing)
            }
            coffer_fuse_reader_free(reader)
        }

        // From here on no wake signal may hit this thread (it would
        // interrupt the unmount below), and no notification may start.
        state.withLock { state in
            state.loopFinished = true
            state.session = nil
            state.watcherWriteFD = -1
        }
        while state.withLock({ $0.notificationsInFlight }) > 0 {
            usleep(1000)
        }

        var quit = WatcherMessage.quit.rawValue
        while write(writeFD, &quit, 1) < 0 && errno == EINTR {}
        pthread_join(watcher, nil)
        if let savedSignals { restoreTerminationHandlers(savedSignals) }

        if mounted {
            fuse_session_unmount(se)
        }
        guard mounted else { throw .mountFailed(mountPoint: mountPoint) }
        // A signal-number result cannot happen (libfuse's own handlers are
        // not installed); negative values are -errno from the device.
        if loopResult < 0 && !state.withLock({ $0.exitRequested }) {
            throw .loopFailed(errno: -loopResult)
        }
    }

    /// Ends `run()`: the loop stops taking requests, in-flight requests
    /// finish, then the mount is removed. Safe from any thread, including
    /// from inside a request handler (it never waits); calling it before
    /// `run()` makes `run()` return at once. Not async-signal-safe: signals
    /// reach it through `Configuration.handleSignals`.
    public func exit() {
        let writeFD = state.withLock { state -> Int32 in
            state.exitRequested = true
            if let session = state.session { fuse_session_exit(session.raw) }
            return state.watcherWriteFD
        }
        if writeFD >= 0 {
            var byte = WatcherMessage.exit.rawValue
            while write(writeFD, &byte, 1) < 0 && errno == EINTR {}
        }
    }

    // MARK: Kernel cache invalidation

    /// Drops the kernel's cached data for `inode` in `[offset, offset+length)`
    /// (length 0: to the end) and its cached attributes, e.g. after a sync
    /// changed the file behind the kernel's back.
    ///
    /// Call from a background thread, never synchronously from a request
    /// handler: the kernel may be holding the inode's locks while it waits
    /// for that handler, and this call needs them. Unknown inodes (nothing
    /// cached) are not an error. Throws `ENOTCONN` when not mounted.
    public func invalidateInode(_ inode: InodeNumber, offset: Int64 = 0, length: Int64 = 0) throws(FSError) {
        try notify { se in fuse_lowlevel_notify_inval_inode(se, inode, off_t(offset), off_t(length)) }
    }

    /// Drops only the cached attributes of `inode` (keeps cached pages).
    public func invalidateAttributes(_ inode: InodeNumber) throws(FSError) {
        try notify { se in fuse_lowlevel_notify_inval_inode(se, inode, -1, 0) }
    }

    /// Drops the kernel's cached `parent/name` lookup (positive or negative)
    /// and `parent`'s attributes, e.g. after a sync added, removed or renamed
    /// a name. Same threading rule as `invalidateInode`: it deadlocks if
    /// called from a handler of a lookup/create/unlink/rename/readdir in
    /// `parent` or on the named inode.
    public func invalidateEntry(parent: InodeNumber, name: String) throws(FSError) {
        guard isValidComponent(name) else { throw FSError(EINVAL) }
        try notify { se in
            name.withCString { fuse_lowlevel_notify_inval_entry(se, parent, $0, strlen($0)) }
        }
    }

    private func notify(_ body: (OpaquePointer) -> Int32) throws(FSError) {
        // Counting in-flight notifications lets teardown wait for them
        // before the session memory goes away.
        guard
            let se = state.withLock({ state -> SessionPointer? in
                guard let session = state.session else { return nil }
                state.notificationsInFlight += 1
                return session
            })
        else { throw FSError(ENOTCONN) }
        let result = body(se.raw)
        state.withLock { $0.notificationsInFlight -= 1 }
        if result == 0 || result == -ENOENT { return }
        throw FSError(result < 0 ? -result : EIO)
    }

    // MARK: Lifecycle internals

    private func createSession() throws(FuseSessionError) -> OpaquePointer {
        var arguments = ["coffer"]
        if configuration.debug { arguments.append("-d") }
        if !configuration.mountOptions.isEmpty {
            arguments += ["-o", configuration.mountOptions.joined(separator: ",")]
        }
        var argv: [UnsafeMutablePointer<CChar>?] = arguments.map { strdup($0) }
        defer { for p in argv { free(p) } }
        guard !argv.contains(where: { $0 == nil }) else { throw .resourceFailure(errno: ENOMEM) }
        argv.append(nil)

        var ops = makeOperationsTable()
        let userdata = Unmanaged.passUnretained(bridge).toOpaque()
        let session = argv.withUnsafeMutableBufferPointer { buffer -> OpaquePointer? in
            var args = coffer_fuse_args_init(Int32(arguments.count), buffer.baseAddress)
            // libfuse may replace argv with its own allocation while parsing.
            defer { fuse_opt_free_args(&args) }
            return fuse_session_new(&args, &ops, MemoryLayout<fuse_lowlevel_ops>.size, userdata)
        }
        guard let session else { throw .invalidOptions(configuration.mountOptions) }
        return session
    }

    /// The bridge between termination signals / `exit()` and the loop
    /// thread (see FuseSignals.swift). It lives exactly as long as `run()`.
    private func startWatcher(readFD: Int32) throws(FuseSessionError) -> pthread_t {
        let context = Unmanaged.passRetained(WatcherContext(session: self, readFD: readFD)).toOpaque()
        var thread = pthread_t()
        let rc = pthread_create(
            &thread, nil,
            { raw in
                guard let raw else { return nil }
                let context = Unmanaged<WatcherContext>.fromOpaque(raw).takeRetainedValue()
                context.session.watch(readFD: context.readFD)
                return nil
            }, context)
        guard rc == 0 else {
            Unmanaged<WatcherContext>.fromOpaque(context).release()
            throw .resourceFailure(errno: rc)
        }
        return thread
    }

    private final class WatcherContext: Sendable {
        let session: FuseSession
        let readFD: Int32
        init(session: FuseSession, readFD: Int32) {
            self.session = session
            self.readFD = readFD
        }
    }

    private func watch(readFD: Int32) {
        // The watcher never takes part in signal delivery, so a process
        // signal cannot interrupt it mid-kick; only the pipe wakes it.
        var blocked = sigset_t()
        sigemptyset(&blocked)
        for signo in terminationSignals { sigaddset(&blocked, signo) }
        sigaddset(&blocked, loopWakeSignal)
        pthread_sigmask(SIG_BLOCK, &blocked, nil)

        while true {
            var byte: UInt8 = 0
            let n = read(readFD, &byte, 1)
            if n < 0 && errno == EINTR { continue }
            guard n == 1, let message = WatcherMessage(rawValue: byte) else { return }
            switch message {
            case .quit:
                return
            case .exit, .signal:
                if message == .signal { exit() }
                kickLoopUntilFinished()
            }
        }
    }

    /// Interrupts the loop thread's sem_wait until the loop has returned.
    /// Repeating closes the window where the signal lands just before
    /// sem_wait starts sleeping (libfuse checks the flag, then waits).
    private func kickLoopUntilFinished() {
        while true {
            let finished = state.withLock { state -> Bool in
                if state.loopFinished { return true }
                // Sent under the lock so it cannot arrive after run() marked
                // the loop finished and moved on to unmounting.
                if let thread = state.loopThread { pthread_kill(thread, loopWakeSignal) }
                return false
            }
            if finished { return }
            usleep(10_000)
        }
    }
}
