import CFuse
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// The per-session state every C callback reaches through
/// `fuse_req_userdata` (or the init/destroy `userdata`). It is immutable
/// apart from the negotiated connection, so worker threads share it freely.
final class FuseBridge: Sendable {
    let operations: any FileSystemOperations
    let configuration: FuseSession.Configuration
    let connection = Mutex<ConnectionInfo?>(nil)
    /// Set once `destroy` ran, so teardown paths cannot run it twice.
    let destroyed = Atomic<Bool>(false)
    /// The spinning reader's state (`coffer_reader_state *` as an address), 0 while the session
    /// uses libfuse's reader or is not running.
    let reader = Atomic<Int>(0)

    init(operations: any FileSystemOperations, configuration: FuseSession.Configuration) {
        self.operations = operations
        self.configuration = configuration
    }

    /// Recovers the bridge from a request. Requests always carry the
    /// userdata given to `fuse_session_new`; nil only guards against misuse.
    static func from(_ req: fuse_req_t) -> FuseBridge? {
        guard let raw = fuse_req_userdata(req) else { return nil }
        return Unmanaged<FuseBridge>.fromOpaque(raw).takeUnretainedValue()
    }

    static func from(userdata: UnsafeMutableRawPointer?) -> FuseBridge? {
        guard let userdata else { return nil }
        return Unmanaged<FuseBridge>.fromOpaque(userdata).takeUnretainedValue()
    }

    /// Before a request the reader counts as short but whose handler may block (a flush or
    /// release: `closeMayTakeLong`; a read or write of up to 128 KiB: `readMayTakeLong`,
    /// `writeMayTakeLong`, see `coffer_fuse_request_may_take_long`): if the filesystem says this
    /// one may take long, another worker reads requests meanwhile. Does nothing for a worker
    /// that no longer holds the reader's token (a long request hands it on as it is read).
    func handOnReading(if mayTakeLong: Bool) {
        guard mayTakeLong else { return }
        coffer_fuse_reader_hand_on(UnsafeMutablePointer(bitPattern: reader.load(ordering: .acquiring)))
    }

    // MARK: Setuid and setgid (FUSE_HANDLE_KILLPRIV_V2)

    /// Whether the request this worker is handling asks for setuid and setgid to be dropped
    /// (see `FuseSession.Configuration.handleKillPrivV2`).
    var requestKillsSetIDBits: Bool {
        coffer_fuse_request_kills_suidgid(UnsafeMutablePointer(bitPattern: reader.load(ordering: .acquiring))) != 0
    }

    /// Whether the kernel granted FUSE_HANDLE_KILLPRIV_V2 (then clearing the bits is ours).
    var handlesKillPrivV2: Bool {
        coffer_fuse_killpriv_v2_granted(UnsafeMutablePointer(bitPattern: reader.load(ordering: .acquiring))) != 0
    }

    /// The mode `inode` has once setuid and setgid are dropped for the caller
    /// (`modeDroppingSetIDBits`), or nil if that changes nothing or `onlyIf` (asked only when
    /// a bit would go, so /proc is read only then) says the caller may not.
    func modeWithoutSetIDBits(inode: InodeNumber, handle: UInt64?, context: RequestContext,
                              onlyIf allowed: (Attributes) -> Bool = { _ in true }) throws -> UInt32? {
        let attributes = try operations.getattr(inode: inode, handle: handle)
        guard let mode = modeDroppingSetIDBits(attributes.mode, callerMayKeepSetGID: { context.mayKeepSetGID(ofGroup: attributes.gid) }),
              allowed(attributes) else { return nil }
        return mode
    }

    /// Drops setuid and setgid before a data change: the filesystem's own setattr, as a chmod
    /// would. Before a write when the kernel asks (its flag); before a fallocate when the
    /// caller lacks CAP_FSETID, which the daemon checks itself, since FALLOCATE carries no flag
    /// (the VFS's `file_modified` on a local filesystem). A truncating setattr folds the change
    /// into itself, and an O_TRUNC open leaves it to the filesystem, which alone knows whether
    /// the file existed (`RequestContext.dropsSetIDBits`).
    func dropSetIDBits(before request: DataChange, inode: InodeNumber, handle: UInt64, context: RequestContext) throws {
        if request == .write && !requestKillsSetIDBits { return }
        guard let mode = try modeWithoutSetIDBits(inode: inode, handle: handle, context: context, onlyIf: { _ in
            request == .write || !context.hasCapability(RequestContext.capabilityFSetID)
        }) else { return }
        _ = try operations.setattr(inode: inode, changes: AttributeChanges(mode: mode), handle: handle, context: context)
    }

    enum DataChange { case write, fallocate }

    /// The request's context; for open and create, with the kernel's "drop setuid and setgid"
    /// flag (only those and setattr and write have it: on any other request the worker's note
    /// is a previous request's).
    func openContext(_ req: fuse_req_t) -> RequestContext {
        var context = RequestContext(req)
        context.dropsSetIDBits = requestKillsSetIDBits
        return context
    }

    // MARK: Reply helpers

    func entryParam(_ entry: Entry) -> fuse_entry_param {
        var e = fuse_entry_param()
        e.ino = entry.inode
        e.generation = entry.generation
        e.attr = entry.attributes.statValue(inode: entry.inode)
        e.attr_timeout = entry.attributeTimeout ?? configuration.attributeTimeout
        e.entry_timeout = entry.entryTimeout ?? configuration.entryTimeout
        return e
    }

    /// Replies with an entry; if the kernel no longer waits for it (the
    /// request was interrupted) the lookup it would have counted is undone.
    func replyEntry(_ req: fuse_req_t, _ entry: Entry) {
        guard entry.inode != 0 else {
            // Inode 0 would read as a negative entry and never be forgotten.
            fuse_reply_err(req, EIO)
            return
        }
        var e = entryParam(entry)
        if fuse_reply_entry(req, &e) != 0 {
            operations.forget(inode: entry.inode, lookups: 1)
        }
    }

    /// Replies to a read with `pieces` as they are, one iovec each (at most `limit` bytes).
    func replyData(_ req: fuse_req_t, _ pieces: [ArraySlice<UInt8>], limit: Int) {
        if pieces.count <= 1 {
            (pieces.first ?? []).withUnsafeBytes { raw in
                _ = fuse_reply_buf(req, raw.baseAddress?.assumingMemoryBound(to: CChar.self), min(raw.count, limit))
            }
            return
        }
        var vectors = [iovec](repeating: iovec(), count: pieces.count)
        var left = limit
        // Each piece's storage is pinned only inside its closure, so the closures nest.
        func pin(_ i: Int) {
            guard i < pieces.count else {
                _ = fuse_reply_iov(req, vectors, Int32(vectors.count))
                return
            }
            pieces[i].withUnsafeBytes { raw in
                let length = min(raw.count, left)
                left -= length
                vectors[i] = iovec(iov_base: UnsafeMutableRawPointer(mutating: raw.baseAddress), iov_len: length)
                pin(i + 1)
            }
        }
        pin(0)
    }

    func replyAttributes(_ req: fuse_req_t, _ attributes: Attributes, inode: InodeNumber) {
        var st = attributes.statValue(inode: inode)
        fuse_reply_attr(req, &st, configuration.attributeTimeout)
    }

    /// Runs one request: `body` must end by replying; an error thrown before
    /// that becomes the reply instead. Every C callback funnels through here
    /// so no failure path can leave a request unanswered (which would hang
    /// the calling process).
    static func serve(_ req: fuse_req_t?, _ body: (FuseBridge, fuse_req_t) throws -> Void) {
        guard let req else { return }
        guard let bridge = from(req) else {
            fuse_reply_err(req, EIO)
            return
        }
        do {
            try body(bridge, req)
        } catch let error as FSError {
            fuse_reply_err(req, error.errno > 0 ? error.errno : EIO)
        } catch {
            fuse_reply_err(req, EIO)
        }
    }

    // MARK: init

    func initialize(_ conn: UnsafeMutablePointer<fuse_conn_info>) {
        var c = conn.pointee
        func want(_ cap: Int32, _ on: Bool) {
            let bit = UInt32(bitPattern: cap)
            if on {
                if c.capable & bit != 0 { c.want |= bit }
            } else {
                c.want &= ~bit
            }
        }
        want(FUSE_CAP_ASYNC_READ, true)
        // O_TRUNC travels inside open, so truncation and open are one step
        // for the implementation (no window with a half-open file).
        want(FUSE_CAP_ATOMIC_O_TRUNC, true)
        want(FUSE_CAP_READDIRPLUS, configuration.readdirPlus != .never)
        want(FUSE_CAP_READDIRPLUS_AUTO, configuration.readdirPlus == .auto)
        want(FUSE_CAP_CACHE_SYMLINKS, true)
        want(FUSE_CAP_PARALLEL_DIROPS, true)
        // When attributes show a changed mtime/size (e.g. after a sync merged
        // remote edits) the kernel drops stale cached pages by itself.
        want(FUSE_CAP_AUTO_INVAL_DATA, true)
        // Write-back caching would let the kernel own mtime and size between
        // flushes; the vault must be the single source of truth for both.
        want(FUSE_CAP_WRITEBACK_CACHE, false)
        // Version 1 of "the filesystem clears suid/sgid" gains nothing on this
        // kernel (it still refreshes attributes before each chown); version 2
        // is granted by the spinning reader itself, which libfuse 3.14 cannot
        // negotiate (see `Configuration.handleKillPrivV2`).
        want(FUSE_CAP_HANDLE_KILLPRIV, false)
        want(FUSE_CAP_EXPORT_SUPPORT, false)
        // Locks stay in the kernel (see FileSystemOperations).
        want(FUSE_CAP_POSIX_LOCKS, false)
        want(FUSE_CAP_FLOCK_LOCKS, false)
        // Splicing would hand us pipe buffers instead of memory; the bridge
        // copies data into Swift arrays anyway.
        want(FUSE_CAP_SPLICE_READ, false)
        want(FUSE_CAP_SPLICE_WRITE, false)
        want(FUSE_CAP_SPLICE_MOVE, false)
        if configuration.maxWrite > 0 {
            // libfuse lowers this further if it exceeds its receive buffer.
            c.max_write = configuration.maxWrite
        }
        c.time_gran = 1
        conn.pointee = c

        let info = ConnectionInfo(conn)
        connection.withLock { $0 = info }
        operations.initialize(connection: info)
    }

    func destroy() {
        if destroyed.exchange(true, ordering: .acquiringAndReleasing) { return }
        operations.destroy()
    }
}
