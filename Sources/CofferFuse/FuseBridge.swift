import CFuse
import CFuseReader
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
    /// The spinning reader (`struct coffer_fuse_reader *` as an address), 0 while the session
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

    /// Before a request the reader counts as short but whose handler may block (FLUSH, RELEASE,
    /// a READ or WRITE of up to `COFFER_FUSE_SHORT_IO` bytes): if the filesystem says this one
    /// may take long, another worker reads requests meanwhile. Does nothing for a worker that no
    /// longer holds the reader's token, or with libfuse's own reader (then nothing is asked).
    func handOnReading(before request: ShortRequest, inode: InodeNumber, handle: UInt64) {
        let address = reader.load(ordering: .acquiring)
        guard address != 0, operations.mayTakeLong(request, inode: inode, handle: handle) else { return }
        coffer_fuse_reader_hand_on(OpaquePointer(bitPattern: address))
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
        // O_TRUNC comes as a SETATTR after the OPEN, not inside it: only there does the kernel
        // clear setuid and setgid for a caller without CAP_FSETID (with atomic O_TRUNC it would
        // leave that to the filesystem, without saying whether the caller may keep them).
        want(FUSE_CAP_ATOMIC_O_TRUNC, false)
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
        // The kernel clears setuid and setgid itself (a SETATTR before the write, truncate or
        // chown that must drop them). Version 1 would leave it to the filesystem without telling
        // it whether the caller holds CAP_FSETID; version 2, which does, libfuse 3.14 cannot
        // negotiate.
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
