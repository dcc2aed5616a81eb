#if canImport(Glibc)
    import Glibc
#endif

/// A filesystem served through the libfuse low-level (inode) API.
///
/// Every method is called on one of libfuse's worker threads, possibly
/// several at once (also for the same inode or directory: the session asks
/// for FUSE_CAP_PARALLEL_DIROPS), so implementations guard their own state.
/// Methods must not call `FuseSession.invalidateInode/invalidateEntry`
/// synchronously: the kernel may hold the very locks those notifications
/// need while it waits for the reply.
///
/// Errors: throw `FSError(errno)`; anything else is reported as `EIO`.
/// A handful of errors are remembered by the kernel for the life of the
/// mount: `ENOSYS` from setxattr/getxattr/listxattr/removexattr switches
/// extended attributes off entirely (callers then see `EOPNOTSUPP`), from
/// flush/fsync/fsyncdir/create/fallocate it makes the kernel stop sending
/// that request (treating flush/fsync as successful, create as mknod+open).
///
/// Reference counting: every successful reply carrying an `Entry` (lookup,
/// mknod, mkdir, symlink, link, create) and every entry returned by
/// readdirplus except "." and ".." adds one kernel reference to that inode.
/// The kernel gives them back through `forget`; the inode number (and the
/// node behind it, even if unlinked) must stay valid until the count drops
/// to zero. If a reply cannot be delivered (the request was interrupted) the
/// bridge calls `forget` on the implementation's behalf, so counting in the
/// method that produced the entry is always right.
///
/// Permissions: with `default_permissions` the kernel checks modes itself
/// and never sends ACCESS. Without it, the kernel checks nothing but the
/// execute bit of regular files, and asks `access` for access(2) and chdir.
///
/// Locks: `getlk`/`setlk`/`flock` are deliberately not part of the bridge.
/// Without them libfuse does not request FUSE_CAP_POSIX_LOCKS or
/// FUSE_CAP_FLOCK_LOCKS, and the kernel implements both kinds of lock
/// locally. That is exact for a single-host mount, which is all a device's
/// private decrypted view ever is; locks are not meant to reach other
/// devices through synchronisation.
public protocol FileSystemOperations: AnyObject, Sendable {
    // MARK: Lifecycle

    /// FUSE_INIT finished; `connection` is what was negotiated. Called once,
    /// before any other request.
    func initialize(connection: ConnectionInfo)

    /// The filesystem is going away: called exactly once if `initialize`
    /// was, after the last request has completed (no other method runs
    /// concurrently or later) and after the kernel mount is gone, by
    /// `FuseSession.run()` before it returns, whether the mount ended by
    /// `exit()`, a signal, or an external `fusermount3 -u`. The place to
    /// persist state. Outstanding lookup counts are implicitly forgotten.
    func destroy()

    // MARK: Names and attributes

    /// Resolve `name` in directory `parent`. Counts as one lookup on success.
    /// Throw `ENOENT` for a missing name (the session can cache negative
    /// answers: see `FuseSession.Configuration.negativeTimeout`).
    func lookup(parent: InodeNumber, name: String) throws -> Entry

    /// The kernel dropped `lookups` references to `inode` (FORGET and
    /// BATCH_FORGET both arrive here). Cannot fail and gets no reply.
    func forget(inode: InodeNumber, lookups: UInt64)

    /// `handle` is the open file's handle when the request came through one
    /// (fstat), nil otherwise.
    func getattr(inode: InodeNumber, handle: UInt64?) throws -> Attributes

    /// Apply `changes` and return the resulting attributes. A size change is
    /// truncate/ftruncate; `.now` times must be taken from the
    /// filesystem's clock. The kernel has already checked permissions and
    /// cleared set-user-ID/set-group-ID bits where POSIX requires it
    /// (FUSE_CAP_HANDLE_KILLPRIV is off), so `mode` may arrive on its own for
    /// that reason.
    func setattr(
        inode: InodeNumber, changes: AttributeChanges, handle: UInt64?, context: RequestContext
    ) throws -> Attributes

    func readlink(inode: InodeNumber) throws -> String

    /// Create a non-directory node. `mode` includes the type bits; `S_IFREG`
    /// arrives here only when `create` threw `ENOSYS`. Implementations that
    /// refuse device nodes, FIFOs or sockets throw `EPERM` (or `EOPNOTSUPP`).
    func mknod(
        parent: InodeNumber, name: String, mode: UInt32, device: UInt64, context: RequestContext
    ) throws -> Entry

    /// `mode` carries permission bits only (the kernel already applied umask).
    func mkdir(parent: InodeNumber, name: String, mode: UInt32, context: RequestContext) throws -> Entry

    /// Remove a non-directory name. The inode may still be open and still be
    /// referenced by the kernel: keep it until the last `forget`/`release`.
    func unlink(parent: InodeNumber, name: String) throws

    /// Remove an empty directory (`ENOTEMPTY` otherwise).
    func rmdir(parent: InodeNumber, name: String) throws

    func symlink(
        target: String, parent: InodeNumber, name: String, context: RequestContext
    ) throws -> Entry

    /// Rename with `renameat2` semantics. Without flags an existing target is
    /// replaced atomically (a directory only by an empty directory;
    /// `EISDIR`/`ENOTDIR` on type mismatch). `.noReplace`: `EEXIST` if the
    /// target exists. `.exchange`: swap both names, both must exist. The
    /// kernel has already rejected renaming a directory into itself for
    /// cached paths, but an implementation should still refuse it (`EINVAL`).
    func rename(
        parent: InodeNumber, name: String, newParent: InodeNumber, newName: String, flags: RenameFlags
    ) throws

    /// Hard link `inode` as `newParent/newName`; return its entry with the
    /// new link count. Counts as one lookup.
    func link(inode: InodeNumber, newParent: InodeNumber, newName: String) throws -> Entry

    // MARK: Files

    /// Open an existing file. `flags` are the `open(2)` flags without
    /// `O_CREAT`/`O_EXCL`/`O_NOCTTY`, and without `O_TRUNC`: the session does not ask for
    /// FUSE_CAP_ATOMIC_O_TRUNC, so the kernel truncates with a setattr after the open, which
    /// also drops setuid and setgid where the caller may not keep them.
    func open(inode: InodeNumber, flags: Int32, context: RequestContext) throws -> OpenReply

    /// Return up to `size` bytes from `offset`. Fewer bytes mean end of
    /// file (for page-cached files the kernel relies on the attribute size,
    /// so short reads in the middle of a file read as zeros).
    func read(inode: InodeNumber, handle: UInt64, offset: Int64, size: Int) throws -> [UInt8]

    /// `read`'s bytes as consecutive pieces, which the bridge replies with as they are (one
    /// iovec each) instead of a copy into one buffer. The default returns `read`'s array.
    func readPieces(inode: InodeNumber, handle: UInt64, offset: Int64, size: Int) throws -> [ArraySlice<UInt8>]

    /// Write `data` at `offset` and return how many bytes were written
    /// (anything but `data.count` is reported to the writer as a short
    /// write). For `O_APPEND` opens without direct I/O the kernel already
    /// turned the offset into the current end of file.
    ///
    /// `data` points into the request's buffer and is valid only during the
    /// call: a 256 MiB `dd` used to copy every byte into a fresh array first
    /// (and fault in that array's pages) before the filesystem copied it again.
    func write(inode: InodeNumber, handle: UInt64, offset: Int64, data: UnsafeRawBufferPointer) throws -> Int

    /// Called on every close(2) of a descriptor for this open file (there
    /// can be several per open, after dup/fork). The place to report
    /// deferred write errors to the closing process.
    func flush(inode: InodeNumber, handle: UInt64, lockOwner: UInt64) throws

    /// The last descriptor for this open file went away. Errors are not
    /// seen by anyone; release cannot fail from the caller's point of view.
    func release(inode: InodeNumber, handle: UInt64, flags: Int32) throws

    /// Asked before a request the /dev/fuse reader counts as short (`ShortRequest`): whether
    /// this one may block for long, say to write out a large buffer, to read a large chunk from
    /// disk or to wait for a lock. The worker that reads requests keeps reading right after a
    /// short one; when this answers true another worker reads meanwhile. Must be quick and must
    /// not block. The default, true, is always safe.
    func mayTakeLong(_ request: ShortRequest, inode: InodeNumber, handle: UInt64) -> Bool

    /// `dataOnly` is fdatasync.
    func fsync(inode: InodeNumber, handle: UInt64, dataOnly: Bool) throws

    /// Create and open a regular file in one step (`open(O_CREAT)`).
    /// Counts as one lookup. `mode` includes `S_IFREG`. With `O_EXCL` the
    /// kernel has already verified the name was absent, but a concurrent
    /// creator can still win: throw `EEXIST` then.
    func create(
        parent: InodeNumber, name: String, mode: UInt32, flags: Int32, context: RequestContext
    ) throws -> (Entry, OpenReply)

    /// fallocate(2). `mode` holds the `FALLOC_FL_*` bits.
    func fallocate(inode: InodeNumber, handle: UInt64, mode: Int32, offset: Int64, length: Int64) throws

    // MARK: Directories

    func opendir(inode: InodeNumber, flags: Int32) throws -> OpenReply

    /// List the directory from cookie `offset` (0 = from the beginning; any
    /// other value is a `nextOffset` this method returned earlier for the
    /// same handle). Include "." and ".." if they should be listed (the
    /// kernel does not invent them). Return at most `maxEntries` entries:
    /// that is an upper bound of what can fit in the kernel's buffer; the
    /// bridge sends as many as fit and the kernel asks again from the last
    /// one's `nextOffset`. An empty array means end of directory.
    ///
    /// When `withAttributes` is true (readdirplus) every returned entry
    /// except "." and ".." counts as one lookup from the moment it is
    /// returned, exactly like `lookup`: the bridge calls `forget` for the
    /// ones that did not fit. When false, only `name`, `inode`, the type bits
    /// of `attributes.mode` and `nextOffset` are used, and nothing is counted.
    ///
    /// Cookies must survive concurrent changes to the directory: an entry
    /// present for the whole listing must appear exactly once. Snapshotting
    /// the listing in `opendir` (keyed by the handle) is the simple way.
    func readdir(
        inode: InodeNumber, handle: UInt64, offset: Int64, maxEntries: Int, withAttributes: Bool
    ) throws -> [DirectoryEntry]

    func releasedir(inode: InodeNumber, handle: UInt64) throws

    func fsyncdir(inode: InodeNumber, handle: UInt64, dataOnly: Bool) throws

    // MARK: Filesystem

    func statfs(inode: InodeNumber) throws -> FileSystemStatistics

    /// access(2), faccessat(2) and chdir on a mount without
    /// `default_permissions`: `mask` is F_OK or a combination of R_OK, W_OK
    /// and X_OK. Return to grant; throw `EACCES` to refuse.
    func access(inode: InodeNumber, mask: Int32, context: RequestContext) throws

    // MARK: Extended attributes

    func setxattr(inode: InodeNumber, name: String, value: [UInt8], flags: XattrFlags) throws

    /// The full value; the bridge answers the kernel's size probes and
    /// raises `ERANGE` when the caller's buffer is too small. Throw
    /// `ENODATA` for a missing attribute.
    func getxattr(inode: InodeNumber, name: String) throws -> [UInt8]

    /// All attribute names; the bridge encodes, size-probes and range-checks.
    func listxattr(inode: InodeNumber) throws -> [String]

    func removexattr(inode: InodeNumber, name: String) throws
}

/// A request on an open file that the /dev/fuse reader counts as short, so the worker that read
/// it keeps reading after it unless `FileSystemOperations.mayTakeLong` says otherwise: closing,
/// reading or writing a small file is usually done within microseconds, and each hand-on wakes
/// another worker and sends this one to sleep waiting to read again (untar writes each small
/// file in one to four records and closes it; md5sum of a tree reads each file in one request).
public enum ShortRequest: Sendable, Equatable {
    /// A close(2) of a descriptor.
    case flush
    /// The last descriptor went away: may commit what other handles wrote.
    case release
    /// A read of at most `COFFER_FUSE_SHORT_IO` bytes.
    case read(offset: Int64, size: Int)
    /// A write of at most `COFFER_FUSE_SHORT_IO` bytes.
    case write(offset: Int64, count: Int)
}

/// Defaults only for bookkeeping calls whose absence the kernel treats the same way (no
/// state to set up, nothing buffered to flush, no per-handle directory state). Every operation
/// that reads or changes the tree or data is a requirement: a filesystem decides its own answer
/// (including "not offered") instead of inheriting ENOSYS by accident.
extension FileSystemOperations {
    /// `write` from an array (tests, callers outside FUSE).
    public func write(inode: InodeNumber, handle: UInt64, offset: Int64, data: [UInt8]) throws -> Int {
        try data.withUnsafeBytes { try write(inode: inode, handle: handle, offset: offset, data: $0) }
    }

    public func readPieces(inode: InodeNumber, handle: UInt64, offset: Int64, size: Int) throws -> [ArraySlice<UInt8>] {
        [try read(inode: inode, handle: handle, offset: offset, size: size)[...]]
    }

    public func initialize(connection: ConnectionInfo) {}
    public func destroy() {}
    public func forget(inode: InodeNumber, lookups: UInt64) {}
    public func flush(inode: InodeNumber, handle: UInt64, lockOwner: UInt64) throws {}
    public func release(inode: InodeNumber, handle: UInt64, flags: Int32) throws {}
    public func mayTakeLong(_ request: ShortRequest, inode: InodeNumber, handle: UInt64) -> Bool { true }
    public func fsync(inode: InodeNumber, handle: UInt64, dataOnly: Bool) throws {}
    public func opendir(inode: InodeNumber, flags: Int32) throws -> OpenReply { OpenReply() }
    public func releasedir(inode: InodeNumber, handle: UInt64) throws {}
    public func fsyncdir(inode: InodeNumber, handle: UInt64, dataOnly: Bool) throws {}
    /// ENOSYS, as libfuse answers when the slot is empty: the kernel then grants every later
    /// access(2) on the mount without asking.
    public func access(inode: InodeNumber, mask: Int32, context: RequestContext) throws { throw FSError(ENOSYS) }
}
