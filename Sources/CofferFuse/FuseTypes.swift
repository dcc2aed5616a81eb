import CFuse

#if canImport(Glibc)
    import Glibc
#endif

/// A FUSE inode number. 1 is always the root directory (`FuseRootInode`).
public typealias InodeNumber = UInt64

/// The inode number the kernel uses for the mount's root directory.
public let FuseRootInode: InodeNumber = 1

/// The error a filesystem operation reports to the kernel.
///
/// Any other error thrown by an implementation reaches the caller as `EIO`,
/// so implementations should translate their own failures deliberately.
public struct FSError: Error, Sendable, Equatable, CustomStringConvertible {
    public let errno: Int32

    public init(_ errno: Int32) {
        self.errno = errno
    }

    public init(errno: Int32) {
        self.errno = errno
    }

    public static let notFound = FSError(ENOENT)
    public static let exists = FSError(EEXIST)
    public static let notDirectory = FSError(ENOTDIR)
    public static let isDirectory = FSError(EISDIR)
    public static let notEmpty = FSError(ENOTEMPTY)
    public static let permissionDenied = FSError(EACCES)
    public static let notPermitted = FSError(EPERM)
    public static let invalid = FSError(EINVAL)
    public static let io = FSError(EIO)
    public static let notSupported = FSError(EOPNOTSUPP)
    public static let noAttribute = FSError(ENODATA)
    public static let range = FSError(ERANGE)
    public static let noSpace = FSError(ENOSPC)
    public static let readOnly = FSError(EROFS)
    public static let badHandle = FSError(EBADF)
    public static let nameTooLong = FSError(ENAMETOOLONG)
    public static let crossDevice = FSError(EXDEV)

    public var description: String {
        "FSError(\(errno): \(String(cString: strerror(errno))))"
    }
}

/// Who is asking. Only meaningful for requests that create things; for other
/// requests the kernel's `default_permissions` check has already run.
public struct RequestContext: Sendable, Equatable {
    public var uid: UInt32
    public var gid: UInt32
    public var pid: Int32
    /// The caller's umask. The kernel has already applied it to `mode`
    /// arguments (FUSE_CAP_DONT_MASK is not requested); it is here for
    /// implementations that apply it to something else, such as default ACLs.
    public var umask: UInt32

    public init(uid: UInt32, gid: UInt32, pid: Int32, umask: UInt32) {
        self.uid = uid
        self.gid = gid
        self.pid = pid
        self.umask = umask
    }
}

/// A point in time with nanosecond resolution, as `struct timespec` carries it.
public struct FileTime: Sendable, Hashable, Comparable {
    public var seconds: Int64
    public var nanoseconds: Int64

    public init(seconds: Int64, nanoseconds: Int64 = 0) {
        self.seconds = seconds
        self.nanoseconds = nanoseconds
    }

    /// The current wall-clock time. Offered because `UTIME_NOW` in setattr
    /// must be resolved by the filesystem.
    public static func now() -> FileTime {
        var ts = timespec()
        clock_gettime(CLOCK_REALTIME, &ts)
        return FileTime(seconds: Int64(ts.tv_sec), nanoseconds: Int64(ts.tv_nsec))
    }

    public static func < (lhs: FileTime, rhs: FileTime) -> Bool {
        (lhs.seconds, lhs.nanoseconds) < (rhs.seconds, rhs.nanoseconds)
    }
}

/// The part of `struct stat` a FUSE filesystem reports. The inode number is
/// not here: the bridge always fills `st_ino` with the inode the request or
/// entry is about, so the two can never disagree.
public struct Attributes: Sendable, Equatable {
    /// Full `st_mode`: file type bits (`S_IFREG`, `S_IFDIR`, `S_IFLNK`...)
    /// together with the permission bits.
    public var mode: UInt32
    public var linkCount: UInt32
    public var uid: UInt32
    public var gid: UInt32
    public var size: UInt64
    /// Allocated size in 512-byte units; nil derives it from `size`.
    public var blocks: UInt64?
    /// The preferred I/O size reported in `st_blksize`.
    public var blockSize: UInt32
    public var rdev: UInt64
    public var accessTime: FileTime
    public var modificationTime: FileTime
    public var changeTime: FileTime

    public init(
        mode: UInt32,
        linkCount: UInt32 = 1,
        uid: UInt32 = 0,
        gid: UInt32 = 0,
        size: UInt64 = 0,
        blocks: UInt64? = nil,
        blockSize: UInt32 = 4096,
        rdev: UInt64 = 0,
        accessTime: FileTime = FileTime(seconds: 0),
        modificationTime: FileTime = FileTime(seconds: 0),
        changeTime: FileTime = FileTime(seconds: 0)
    ) {
        self.mode = mode
        self.linkCount = linkCount
        self.uid = uid
        self.gid = gid
        self.size = size
        self.blocks = blocks
        self.blockSize = blockSize
        self.rdev = rdev
        self.accessTime = accessTime
        self.modificationTime = modificationTime
        self.changeTime = changeTime
    }

    /// Only the `S_IFMT` bits of `mode`.
    public var fileType: UInt32 { mode & UInt32(Glibc.S_IFMT) }
    public var isDirectory: Bool { fileType == UInt32(Glibc.S_IFDIR) }
    public var isRegularFile: Bool { fileType == UInt32(Glibc.S_IFREG) }
    public var isSymbolicLink: Bool { fileType == UInt32(Glibc.S_IFLNK) }
}

/// The answer to a name lookup (and to everything that creates a name).
///
/// Replying with an `Entry` makes the kernel hold one more reference to
/// `inode`; the filesystem must keep the inode number valid until matching
/// `forget` calls bring that count back to zero.
public struct Entry: Sendable, Equatable {
    public var inode: InodeNumber
    /// Distinguishes reuses of the same inode number over the life of the
    /// mount. Only matters if inode numbers are ever recycled.
    public var generation: UInt64
    public var attributes: Attributes
    /// Overrides of the session's default cache timeouts, in seconds.
    public var entryTimeout: Double?
    public var attributeTimeout: Double?

    public init(
        inode: InodeNumber,
        generation: UInt64 = 0,
        attributes: Attributes,
        entryTimeout: Double? = nil,
        attributeTimeout: Double? = nil
    ) {
        self.inode = inode
        self.generation = generation
        self.attributes = attributes
        self.entryTimeout = entryTimeout
        self.attributeTimeout = attributeTimeout
    }
}

/// A timestamp change requested through setattr.
public enum TimeChange: Sendable, Equatable {
    /// `UTIME_NOW` (or a plain `utimes(path, NULL)`): the filesystem's clock.
    case now
    case set(FileTime)

    /// Resolves `.now` with the given clock reading.
    public func resolved(now: FileTime) -> FileTime {
        switch self {
        case .now: return now
        case .set(let time): return time
        }
    }
}

/// What a setattr request wants changed; nil means "leave alone"
/// (`UTIME_OMIT` arrives as nil).
public struct AttributeChanges: Sendable, Equatable {
    /// The new full `st_mode`. The kernel sends the type bits of the existing
    /// inode along with the new permission bits; only `mode & 0o7777` is new.
    public var mode: UInt32?
    public var uid: UInt32?
    public var gid: UInt32?
    /// truncate/ftruncate, and `open(O_TRUNC)` of an existing file (the session does not ask
    /// for FUSE_CAP_ATOMIC_O_TRUNC: see `FileSystemOperations.open`).
    public var size: UInt64?
    public var accessTime: TimeChange?
    public var modificationTime: TimeChange?
    public var changeTime: FileTime?

    public init(
        mode: UInt32? = nil,
        uid: UInt32? = nil,
        gid: UInt32? = nil,
        size: UInt64? = nil,
        accessTime: TimeChange? = nil,
        modificationTime: TimeChange? = nil,
        changeTime: FileTime? = nil
    ) {
        self.mode = mode
        self.uid = uid
        self.gid = gid
        self.size = size
        self.accessTime = accessTime
        self.modificationTime = modificationTime
        self.changeTime = changeTime
    }

    public var isEmpty: Bool {
        mode == nil && uid == nil && gid == nil && size == nil
            && accessTime == nil && modificationTime == nil && changeTime == nil
    }
}

/// `renameat2(2)` flags. The bridge refuses any other bit with `EINVAL`
/// before the implementation sees the request (`RENAME_WHITEOUT` only makes
/// sense for overlay filesystems).
public struct RenameFlags: OptionSet, Sendable, Hashable {
    public let rawValue: UInt32
    public init(rawValue: UInt32) { self.rawValue = rawValue }

    /// Fail with `EEXIST` instead of replacing an existing target.
    public static let noReplace = RenameFlags(rawValue: 1 << 0)
    /// Atomically swap source and target; both must exist (`ENOENT` otherwise).
    public static let exchange = RenameFlags(rawValue: 1 << 1)

    public static let supported: RenameFlags = [.noReplace, .exchange]
}

/// `setxattr(2)` flags.
public struct XattrFlags: OptionSet, Sendable, Hashable {
    public let rawValue: Int32
    public init(rawValue: Int32) { self.rawValue = rawValue }

    /// Fail with `EEXIST` if the attribute exists.
    public static let create = XattrFlags(rawValue: Int32(XATTR_CREATE))
    /// Fail with `ENODATA` if the attribute does not exist.
    public static let replace = XattrFlags(rawValue: Int32(XATTR_REPLACE))
}

/// The answer to open, opendir and create.
public struct OpenReply: Sendable, Equatable {
    /// Opaque to the kernel; handed back in every request on this open file.
    public var handle: UInt64
    /// Keep the page cache from a previous open (only safe if the content
    /// cannot have changed behind the kernel's back since).
    public var keepCache: Bool
    /// Bypass the page cache for this open file: every read and write
    /// reaches the filesystem with the caller's offsets and sizes.
    public var directIO: Bool
    /// The file has no meaningful offsets (pipes, sockets-like content).
    public var nonSeekable: Bool
    /// opendir only: let the kernel cache this directory's listing.
    public var cacheDirectory: Bool
    /// The kernel sends no FLUSH when this open file is closed (FOPEN_NOFLUSH); the
    /// filesystem learns of the last close from RELEASE, which the caller does not wait for.
    public var noFlush: Bool

    public init(
        handle: UInt64 = 0,
        keepCache: Bool = false,
        directIO: Bool = false,
        nonSeekable: Bool = false,
        cacheDirectory: Bool = false,
        noFlush: Bool = false
    ) {
        self.handle = handle
        self.keepCache = keepCache
        self.directIO = directIO
        self.nonSeekable = nonSeekable
        self.cacheDirectory = cacheDirectory
        self.noFlush = noFlush
    }
}

/// One name in a directory listing.
public struct DirectoryEntry: Sendable, Equatable {
    public var name: String
    public var inode: InodeNumber
    public var generation: UInt64
    /// Used in full by readdirplus; plain readdir only sends the type bits.
    public var attributes: Attributes
    /// The cookie that resumes the listing *after* this entry. It is what the
    /// kernel passes back as `offset` in the next readdir call, so it must be
    /// non-zero (0 means "from the start") and stable for the open handle.
    public var nextOffset: Int64
    public var entryTimeout: Double?
    public var attributeTimeout: Double?

    public init(
        name: String,
        inode: InodeNumber,
        generation: UInt64 = 0,
        attributes: Attributes,
        nextOffset: Int64,
        entryTimeout: Double? = nil,
        attributeTimeout: Double? = nil
    ) {
        self.name = name
        self.inode = inode
        self.generation = generation
        self.attributes = attributes
        self.nextOffset = nextOffset
        self.entryTimeout = entryTimeout
        self.attributeTimeout = attributeTimeout
    }

    /// "." and ".." never create kernel references, even in readdirplus.
    public var isDotOrDotDot: Bool { name == "." || name == ".." }
}

/// `statvfs` as reported by statfs(2) / df.
public struct FileSystemStatistics: Sendable, Equatable {
    public var blockSize: UInt64
    public var fragmentSize: UInt64
    public var totalBlocks: UInt64
    public var freeBlocks: UInt64
    public var availableBlocks: UInt64
    public var totalFiles: UInt64
    public var freeFiles: UInt64
    public var availableFiles: UInt64
    public var maximumNameLength: UInt64

    public init(
        blockSize: UInt64 = 4096,
        fragmentSize: UInt64 = 4096,
        totalBlocks: UInt64 = 0,
        freeBlocks: UInt64 = 0,
        availableBlocks: UInt64 = 0,
        totalFiles: UInt64 = 0,
        freeFiles: UInt64 = 0,
        availableFiles: UInt64 = 0,
        maximumNameLength: UInt64 = 255
    ) {
        self.blockSize = blockSize
        self.fragmentSize = fragmentSize
        self.totalBlocks = totalBlocks
        self.freeBlocks = freeBlocks
        self.availableBlocks = availableBlocks
        self.totalFiles = totalFiles
        self.freeFiles = freeFiles
        self.availableFiles = availableFiles
        self.maximumNameLength = maximumNameLength
    }
}

/// What the kernel and libfuse agreed on during FUSE_INIT.
public struct ConnectionInfo: Sendable, Equatable {
    public var protocolMajor: UInt32
    public var protocolMinor: UInt32
    /// Largest write request the kernel will send, in bytes.
    public var maxWrite: UInt32
    /// Largest read request (0: limited only by the kernel's page count).
    public var maxRead: UInt32
    public var maxReadahead: UInt32
    /// Raw FUSE_CAP_* bits: what the kernel offered and what we asked for.
    public var capable: UInt32
    public var want: UInt32
    public var timeGranularity: UInt32

    public var asyncRead: Bool { want & UInt32(FUSE_CAP_ASYNC_READ) != 0 }
    public var atomicOpenTruncate: Bool { want & UInt32(FUSE_CAP_ATOMIC_O_TRUNC) != 0 }
    public var readdirPlus: Bool { want & UInt32(FUSE_CAP_READDIRPLUS) != 0 }
    public var readdirPlusAuto: Bool { want & UInt32(FUSE_CAP_READDIRPLUS_AUTO) != 0 }
    public var writebackCache: Bool { want & UInt32(FUSE_CAP_WRITEBACK_CACHE) != 0 }
    public var posixLocks: Bool { want & UInt32(FUSE_CAP_POSIX_LOCKS) != 0 }
    public var flockLocks: Bool { want & UInt32(FUSE_CAP_FLOCK_LOCKS) != 0 }
    public var cacheSymlinks: Bool { want & UInt32(FUSE_CAP_CACHE_SYMLINKS) != 0 }
    public var parallelDirectoryOperations: Bool { want & UInt32(FUSE_CAP_PARALLEL_DIROPS) != 0 }
    public var autoInvalidateData: Bool { want & UInt32(FUSE_CAP_AUTO_INVAL_DATA) != 0 }

    public init(
        protocolMajor: UInt32, protocolMinor: UInt32, maxWrite: UInt32, maxRead: UInt32,
        maxReadahead: UInt32, capable: UInt32, want: UInt32, timeGranularity: UInt32
    ) {
        self.protocolMajor = protocolMajor
        self.protocolMinor = protocolMinor
        self.maxWrite = maxWrite
        self.maxRead = maxRead
        self.maxReadahead = maxReadahead
        self.capable = capable
        self.want = want
        self.timeGranularity = timeGranularity
    }
}
