import CFuse

#if canImport(Glibc)
    import Glibc
#endif

// Translations between the Swift value types and the C structures libfuse
// reads. Integer widths of `struct stat` differ between architectures
// (nlink_t, blksize_t), hence the generic conversions instead of fixed casts.

extension FileTime {
    init(_ ts: timespec) {
        self.init(seconds: Int64(ts.tv_sec), nanoseconds: Int64(ts.tv_nsec))
    }

    var timespecValue: timespec {
        timespec(tv_sec: .init(truncatingIfNeeded: seconds), tv_nsec: .init(truncatingIfNeeded: nanoseconds))
    }
}

extension Attributes {
    func statValue(inode: InodeNumber) -> stat {
        var st = stat()
        st.st_ino = .init(truncatingIfNeeded: inode)
        st.st_mode = .init(truncatingIfNeeded: mode)
        st.st_nlink = .init(truncatingIfNeeded: linkCount)
        st.st_uid = .init(truncatingIfNeeded: uid)
        st.st_gid = .init(truncatingIfNeeded: gid)
        st.st_size = .init(clamping: size)
        st.st_blocks = .init(clamping: blocks ?? (size / 512 + (size % 512 == 0 ? 0 : 1)))
        st.st_blksize = .init(truncatingIfNeeded: blockSize)
        st.st_rdev = .init(truncatingIfNeeded: rdev)
        st.st_atim = accessTime.timespecValue
        st.st_mtim = modificationTime.timespecValue
        st.st_ctim = changeTime.timespecValue
        return st
    }
}

extension FileSystemStatistics {
    var statvfsValue: statvfs {
        var sv = statvfs()
        sv.f_bsize = .init(truncatingIfNeeded: blockSize)
        sv.f_frsize = .init(truncatingIfNeeded: fragmentSize)
        sv.f_blocks = .init(truncatingIfNeeded: totalBlocks)
        sv.f_bfree = .init(truncatingIfNeeded: freeBlocks)
        sv.f_bavail = .init(truncatingIfNeeded: availableBlocks)
        sv.f_files = .init(truncatingIfNeeded: totalFiles)
        sv.f_ffree = .init(truncatingIfNeeded: freeFiles)
        sv.f_favail = .init(truncatingIfNeeded: availableFiles)
        sv.f_namemax = .init(truncatingIfNeeded: maximumNameLength)
        return sv
    }
}

extension RequestContext {
    /// The kernel always supplies a context; the fallback only exists so a
    /// missing one cannot crash the daemon.
    init(_ req: fuse_req_t) {
        if let ctx = fuse_req_ctx(req) {
            self.init(
                uid: UInt32(truncatingIfNeeded: ctx.pointee.uid),
                gid: UInt32(truncatingIfNeeded: ctx.pointee.gid),
                pid: Int32(truncatingIfNeeded: ctx.pointee.pid),
                umask: UInt32(truncatingIfNeeded: ctx.pointee.umask))
        } else {
            self.init(uid: UInt32.max, gid: UInt32.max, pid: 0, umask: 0o022)
        }
    }
}

extension AttributeChanges {
    init(_ attr: UnsafePointer<stat>, toSet: Int32) {
        self.init()
        let st = attr.pointee
        if toSet & FUSE_SET_ATTR_MODE != 0 { mode = UInt32(truncatingIfNeeded: st.st_mode) }
        if toSet & FUSE_SET_ATTR_UID != 0 { uid = UInt32(truncatingIfNeeded: st.st_uid) }
        if toSet & FUSE_SET_ATTR_GID != 0 { gid = UInt32(truncatingIfNeeded: st.st_gid) }
        if toSet & FUSE_SET_ATTR_SIZE != 0 { size = UInt64(clamping: st.st_size) }
        // The kernel sends *_NOW together with the plain bit; without *_NOW
        // the timespec holds the value (UTIME_OMIT never reaches us: the bit
        // is simply absent).
        if toSet & (FUSE_SET_ATTR_ATIME | FUSE_SET_ATTR_ATIME_NOW) != 0 {
            accessTime = toSet & FUSE_SET_ATTR_ATIME_NOW != 0 ? .now : .set(FileTime(st.st_atim))
        }
        if toSet & (FUSE_SET_ATTR_MTIME | FUSE_SET_ATTR_MTIME_NOW) != 0 {
            modificationTime = toSet & FUSE_SET_ATTR_MTIME_NOW != 0 ? .now : .set(FileTime(st.st_mtim))
        }
        if toSet & FUSE_SET_ATTR_CTIME != 0 { changeTime = FileTime(st.st_ctim) }
    }
}

extension OpenReply {
    func apply(to fi: UnsafeMutablePointer<fuse_file_info>) {
        coffer_fi_set_fh(fi, handle)
        coffer_fi_set_keep_cache(fi, keepCache ? 1 : 0)
        coffer_fi_set_direct_io(fi, directIO ? 1 : 0)
        coffer_fi_set_nonseekable(fi, nonSeekable ? 1 : 0)
        coffer_fi_set_cache_readdir(fi, cacheDirectory ? 1 : 0)
        coffer_fi_set_noflush(fi, noFlush ? 1 : 0)
    }
}

extension ConnectionInfo {
    init(_ conn: UnsafePointer<fuse_conn_info>) {
        let c = conn.pointee
        self.init(
            protocolMajor: UInt32(c.proto_major), protocolMinor: UInt32(c.proto_minor),
            maxWrite: UInt32(c.max_write), maxRead: UInt32(c.max_read),
            maxReadahead: UInt32(c.max_readahead), capable: UInt32(c.capable),
            want: UInt32(c.want), timeGranularity: UInt32(c.time_gran))
    }
}

/// Decodes a name the kernel sent. File and attribute names on Linux are
/// arbitrary bytes, but the vault stores names as Unicode strings, so
/// undecodable names are refused (`EILSEQ`) rather than silently mangled
/// into something that would not round-trip.
func decodeName(_ name: UnsafePointer<CChar>?) throws(FSError) -> String {
    guard let name else { throw FSError(EINVAL) }
    guard let string = String(validatingCString: name) else { throw FSError(EILSEQ) }
    return string
}

/// Whether a name the implementation produced can be sent as one path
/// component.
func isValidComponent(_ name: String) -> Bool {
    !name.isEmpty && !name.utf8.contains(0) && !name.utf8.contains(UInt8(ascii: "/"))
}
