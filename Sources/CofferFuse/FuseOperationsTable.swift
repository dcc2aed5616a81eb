import CFuse
import CFuseReader

#if canImport(Glibc)
    import Glibc
#endif

/// The one `fuse_lowlevel_ops` table, in the style of libfuse's
/// passthrough_ll: every slot is a capture-free closure (so it converts to a
/// C function pointer) that finds the session's `FuseBridge` through the
/// request's userdata and hands the decoded request to the implementation.
///
/// Deliberately absent: `getlk`,
/// `setlk` and `flock` (the kernel keeps locks locally), `bmap`, `ioctl`,
/// `poll`, `write_buf`, `retrieve_reply`, `copy_file_range` and `lseek`
/// (libfuse answers ENOSYS and the kernel falls back to generic code).
func makeOperationsTable() -> fuse_lowlevel_ops {
    var ops = fuse_lowlevel_ops()

    ops.`init` = { userdata, conn in
        guard let conn, let bridge = FuseBridge.from(userdata: userdata) else { return }
        bridge.initialize(conn)
    }
    ops.destroy = { userdata in
        FuseBridge.from(userdata: userdata)?.destroy()
    }

    ops.lookup = { req, parent, name in
        FuseBridge.serve(req) { bridge, req in
            let name = try decodeName(name)
            do {
                let entry = try bridge.operations.lookup(parent: parent, name: name)
                bridge.replyEntry(req, entry)
            } catch let error as FSError where error.errno == ENOENT && bridge.configuration.negativeTimeout > 0 {
                // Inode 0 is the protocol's cacheable "no such name".
                var e = fuse_entry_param()
                e.ino = 0
                e.entry_timeout = bridge.configuration.negativeTimeout
                fuse_reply_entry(req, &e)
            }
        }
    }

    ops.forget = { req, ino, nlookup in
        guard let req else { return }
        FuseBridge.from(req)?.operations.forget(inode: ino, lookups: nlookup)
        fuse_reply_none(req)
    }
    ops.forget_multi = { req, count, forgets in
        guard let req else { return }
        if let bridge = FuseBridge.from(req), let forgets {
            for item in UnsafeBufferPointer(start: forgets, count: count) {
                bridge.operations.forget(inode: item.ino, lookups: item.nlookup)
            }
        }
        fuse_reply_none(req)
    }

    ops.getattr = { req, ino, fi in
        FuseBridge.serve(req) { bridge, req in
            let attributes = try bridge.operations.getattr(inode: ino, handle: fi.map { coffer_fi_get_fh($0) })
            bridge.replyAttributes(req, attributes, inode: ino)
        }
    }

    ops.setattr = { req, ino, attr, toSet, fi in
        FuseBridge.serve(req) { bridge, req in
            guard let attr else { throw FSError(EINVAL) }
            let changes = AttributeChanges(attr, toSet: toSet)
            let context = RequestContext(req)
            let attributes = try bridge.operations.setattr(
                inode: ino, changes: changes, handle: fi.map { coffer_fi_get_fh($0) },
                context: context)
            bridge.replyAttributes(req, attributes, inode: ino)
        }
    }

    ops.readlink = { req, ino in
        FuseBridge.serve(req) { bridge, req in
            let target = try bridge.operations.readlink(inode: ino)
            guard !target.utf8.contains(0) else { throw FSError(EIO) }
            fuse_reply_readlink(req, target)
        }
    }

    ops.mknod = { req, parent, name, mode, rdev in
        FuseBridge.serve(req) { bridge, req in
            let entry = try bridge.operations.mknod(
                parent: parent, name: try decodeName(name), mode: UInt32(mode), device: UInt64(rdev),
                context: RequestContext(req))
            bridge.replyEntry(req, entry)
        }
    }

    ops.mkdir = { req, parent, name, mode in
        FuseBridge.serve(req) { bridge, req in
            let entry = try bridge.operations.mkdir(
                parent: parent, name: try decodeName(name), mode: UInt32(mode), context: RequestContext(req))
            bridge.replyEntry(req, entry)
        }
    }

    ops.unlink = { req, parent, name in
        FuseBridge.serve(req) { bridge, req in
            try bridge.operations.unlink(parent: parent, name: try decodeName(name))
            fuse_reply_err(req, 0)
        }
    }

    ops.rmdir = { req, parent, name in
        FuseBridge.serve(req) { bridge, req in
            try bridge.operations.rmdir(parent: parent, name: try decodeName(name))
            fuse_reply_err(req, 0)
        }
    }

    ops.symlink = { req, link, parent, name in
        FuseBridge.serve(req) { bridge, req in
            let entry = try bridge.operations.symlink(
                target: try decodeName(link), parent: parent, name: try decodeName(name),
                context: RequestContext(req))
            bridge.replyEntry(req, entry)
        }
    }

    ops.rename = { req, parent, name, newParent, newName, flags in
        FuseBridge.serve(req) { bridge, req in
            let renameFlags = RenameFlags(rawValue: flags)
            guard RenameFlags.supported.isSuperset(of: renameFlags),
                renameFlags != [.noReplace, .exchange]
            else { throw FSError(EINVAL) }
            try bridge.operations.rename(
                parent: parent, name: try decodeName(name), newParent: newParent,
                newName: try decodeName(newName), flags: renameFlags)
            fuse_reply_err(req, 0)
        }
    }

    ops.link = { req, ino, newParent, newName in
        FuseBridge.serve(req) { bridge, req in
            let entry = try bridge.operations.link(inode: ino, newParent: newParent, newName: try decodeName(newName))
            bridge.replyEntry(req, entry)
        }
    }

    ops.open = { req, ino, fi in
        FuseBridge.serve(req) { bridge, req in
            guard let fi else { throw FSError(EINVAL) }
            let reply = try bridge.operations.open(
                inode: ino, flags: coffer_fi_get_flags(fi), context: RequestContext(req))
            reply.apply(to: fi)
            if fuse_reply_open(req, fi) != 0 {
                // The opener is gone; nobody will ever close this handle.
                try? bridge.operations.release(inode: ino, handle: reply.handle, flags: coffer_fi_get_flags(fi))
            }
        }
    }

    ops.read = { req, ino, size, offset, fi in
        FuseBridge.serve(req) { bridge, req in
            guard let fi else { throw FSError(EBADF) }
            if size <= COFFER_FUSE_SHORT_IO {
                bridge.handOnReading(
                    before: .read(offset: Int64(offset), size: size), inode: ino, handle: coffer_fi_get_fh(fi))
            }
            let pieces = try bridge.operations.readPieces(
                inode: ino, handle: coffer_fi_get_fh(fi), offset: Int64(offset), size: size)
            bridge.replyData(req, pieces, limit: size)
        }
    }

    ops.write = { req, ino, buf, size, offset, fi in
        FuseBridge.serve(req) { bridge, req in
            guard let fi else { throw FSError(EBADF) }
            let data = UnsafeRawBufferPointer(start: buf, count: buf == nil ? 0 : size)
            if data.count <= COFFER_FUSE_SHORT_IO {
                bridge.handOnReading(
                    before: .write(offset: Int64(offset), count: data.count), inode: ino, handle: coffer_fi_get_fh(fi))
            }
            let written = try bridge.operations.write(
                inode: ino, handle: coffer_fi_get_fh(fi), offset: Int64(offset), data: data)
            guard written >= 0, written <= size else { throw FSError(EIO) }
            fuse_reply_write(req, written)
        }
    }

    ops.flush = { req, ino, fi in
        FuseBridge.serve(req) { bridge, req in
            guard let fi else { throw FSError(EBADF) }
            bridge.handOnReading(before: .flush, inode: ino, handle: coffer_fi_get_fh(fi))
            try bridge.operations.flush(
                inode: ino, handle: coffer_fi_get_fh(fi), lockOwner: coffer_fi_get_lock_owner(fi))
            fuse_reply_err(req, 0)
        }
    }

    ops.release = { req, ino, fi in
        FuseBridge.serve(req) { bridge, req in
            guard let fi else { throw FSError(EBADF) }
            bridge.handOnReading(before: .release, inode: ino, handle: coffer_fi_get_fh(fi))
            try bridge.operations.release(inode: ino, handle: coffer_fi_get_fh(fi), flags: coffer_fi_get_flags(fi))
            fuse_reply_err(req, 0)
        }
    }

    ops.fsync = { req, ino, datasync, fi in
        FuseBridge.serve(req) { bridge, req in
            guard let fi else { throw FSError(EBADF) }
            try bridge.operations.fsync(inode: ino, handle: coffer_fi_get_fh(fi), dataOnly: datasync != 0)
            fuse_reply_err(req, 0)
        }
    }

    ops.create = { req, parent, name, mode, fi in
        FuseBridge.serve(req) { bridge, req in
            guard let fi else { throw FSError(EINVAL) }
            let flags = coffer_fi_get_flags(fi)
            let (entry, reply) = try bridge.operations.create(
                parent: parent, name: try decodeName(name), mode: UInt32(mode), flags: flags,
                context: RequestContext(req))
            guard entry.inode != 0 else {
                try? bridge.operations.release(inode: entry.inode, handle: reply.handle, flags: flags)
                throw FSError(EIO)
            }
            reply.apply(to: fi)
            var e = bridge.entryParam(entry)
            if fuse_reply_create(req, &e, fi) != 0 {
                try? bridge.operations.release(inode: entry.inode, handle: reply.handle, flags: flags)
                bridge.operations.forget(inode: entry.inode, lookups: 1)
            }
        }
    }

    ops.fallocate = { req, ino, mode, offset, length, fi in
        FuseBridge.serve(req) { bridge, req in
            guard let fi else { throw FSError(EBADF) }
            try bridge.operations.fallocate(
                inode: ino, handle: coffer_fi_get_fh(fi), mode: mode, offset: Int64(offset), length: Int64(length))
            fuse_reply_err(req, 0)
        }
    }

    ops.opendir = { req, ino, fi in
        FuseBridge.serve(req) { bridge, req in
            guard let fi else { throw FSError(EINVAL) }
            let reply = try bridge.operations.opendir(inode: ino, flags: coffer_fi_get_flags(fi))
            reply.apply(to: fi)
            if fuse_reply_open(req, fi) != 0 {
                try? bridge.operations.releasedir(inode: ino, handle: reply.handle)
            }
        }
    }

    ops.readdir = { req, ino, size, offset, fi in
        FuseBridge.serve(req) { bridge, req in
            try replyDirectory(bridge, req, ino, size: size, offset: offset, fi: fi, plus: false)
        }
    }

    ops.readdirplus = { req, ino, size, offset, fi in
        FuseBridge.serve(req) { bridge, req in
            try replyDirectory(bridge, req, ino, size: size, offset: offset, fi: fi, plus: true)
        }
    }

    ops.releasedir = { req, ino, fi in
        FuseBridge.serve(req) { bridge, req in
            guard let fi else { throw FSError(EBADF) }
            try bridge.operations.releasedir(inode: ino, handle: coffer_fi_get_fh(fi))
            fuse_reply_err(req, 0)
        }
    }

    ops.fsyncdir = { req, ino, datasync, fi in
        FuseBridge.serve(req) { bridge, req in
            guard let fi else { throw FSError(EBADF) }
            try bridge.operations.fsyncdir(inode: ino, handle: coffer_fi_get_fh(fi), dataOnly: datasync != 0)
            fuse_reply_err(req, 0)
        }
    }

    ops.access = { req, ino, mask in
        FuseBridge.serve(req) { bridge, req in
            try bridge.operations.access(inode: ino, mask: mask, context: RequestContext(req))
            fuse_reply_err(req, 0)
        }
    }

    ops.statfs = { req, ino in
        FuseBridge.serve(req) { bridge, req in
            var sv = try bridge.operations.statfs(inode: ino).statvfsValue
            fuse_reply_statfs(req, &sv)
        }
    }

    ops.setxattr = { req, ino, name, value, size, flags in
        FuseBridge.serve(req) { bridge, req in
            let bytes = size == 0 || value == nil ? [] : [UInt8](UnsafeRawBufferPointer(start: value, count: size))
            try bridge.operations.setxattr(
                inode: ino, name: try decodeName(name), value: bytes, flags: XattrFlags(rawValue: flags))
            fuse_reply_err(req, 0)
        }
    }

    ops.getxattr = { req, ino, name, size in
        FuseBridge.serve(req) { bridge, req in
            let value = try bridge.operations.getxattr(inode: ino, name: try decodeName(name))
            replySized(req, value, requested: size)
        }
    }

    ops.listxattr = { req, ino, size in
        FuseBridge.serve(req) { bridge, req in
            let names = try bridge.operations.listxattr(inode: ino)
            var list: [UInt8] = []
            for name in names {
                guard !name.isEmpty, !name.utf8.contains(0) else { throw FSError(EIO) }
                list.append(contentsOf: name.utf8)
                list.append(0)
            }
            replySized(req, list, requested: size)
        }
    }

    ops.removexattr = { req, ino, name in
        FuseBridge.serve(req) { bridge, req in
            try bridge.operations.removexattr(inode: ino, name: try decodeName(name))
            fuse_reply_err(req, 0)
        }
    }

    return ops
}

/// The largest xattr value or list the VFS will ever ask for.
private let xattrSizeMax = 65536

/// getxattr/listxattr protocol: a zero `requested` size is a probe for the
/// length; otherwise the whole value must fit or the caller gets ERANGE.
private func replySized(_ req: fuse_req_t, _ bytes: [UInt8], requested: Int) {
    if bytes.count > xattrSizeMax {
        fuse_reply_err(req, E2BIG)
    } else if requested == 0 {
        fuse_reply_xattr(req, bytes.count)
    } else if bytes.count > requested {
        fuse_reply_err(req, ERANGE)
    } else {
        bytes.withUnsafeBytes { raw in
            _ = fuse_reply_buf(req, raw.baseAddress?.assumingMemoryBound(to: CChar.self), raw.count)
        }
    }
}

/// Smallest possible encoded entries (one-byte name, padded to 8 bytes):
/// `struct fuse_dirent` is 24 bytes, `struct fuse_direntplus` adds the
/// 128-byte `fuse_entry_out`. Dividing the buffer by these gives an upper
/// bound on what can fit, which limits how many lookups readdirplus takes
/// only to give them back.
private let minimumDirentSize = 24 + 8
private let minimumDirentPlusSize = 128 + 24 + 8

/// Shared by readdir and readdirplus: fetch entries from the cookie, pack as
/// many as fit into the kernel's buffer, and return the lookups of any
/// readdirplus entry the kernel will not see.
private func replyDirectory(
    _ bridge: FuseBridge, _ req: fuse_req_t, _ ino: InodeNumber,
    size: Int, offset: off_t, fi: UnsafeMutablePointer<fuse_file_info>?, plus: Bool
) throws {
    let ops = bridge.operations
    let maxEntries = max(1, size / (plus ? minimumDirentPlusSize : minimumDirentSize))
    let entries = try ops.readdir(
        inode: ino, handle: fi.map { coffer_fi_get_fh($0) } ?? 0, offset: Int64(offset),
        maxEntries: maxEntries, withAttributes: plus)

    func counted(_ entry: DirectoryEntry) -> Bool { plus && !entry.isDotOrDotDot && entry.inode != 0 }
    func forgetAll<S: Sequence>(_ entries: S) where S.Element == DirectoryEntry {
        for entry in entries where counted(entry) { ops.forget(inode: entry.inode, lookups: 1) }
    }

    // A zero cookie would make the kernel restart the listing forever, and a
    // bad name would corrupt the reply: both are implementation bugs.
    guard entries.allSatisfy({ $0.nextOffset != 0 && isValidComponent($0.name) }) else {
        forgetAll(entries)
        throw FSError(EIO)
    }

    let buffer = UnsafeMutablePointer<CChar>.allocate(capacity: max(size, 1))
    defer { buffer.deallocate() }
    var used = 0
    var sentCount = 0
    for entry in entries {
        let remaining = size - used
        let needed: Int = entry.name.withCString { name in
            if plus {
                var e: fuse_entry_param
                if counted(entry) {
                    e = bridge.entryParam(
                        Entry(
                            inode: entry.inode, generation: entry.generation, attributes: entry.attributes,
                            entryTimeout: entry.entryTimeout, attributeTimeout: entry.attributeTimeout))
                } else {
                    // ino 0 tells the kernel not to instantiate (and count)
                    // the entry; only the dirent part is used.
                    e = fuse_entry_param()
                    e.attr.st_ino = .init(truncatingIfNeeded: entry.inode)
                    e.attr.st_mode = .init(truncatingIfNeeded: entry.attributes.fileType)
                }
                return fuse_add_direntry_plus(req, buffer + used, remaining, name, &e, off_t(entry.nextOffset))
            } else {
                var st = stat()
                st.st_ino = .init(truncatingIfNeeded: entry.inode)
                st.st_mode = .init(truncatingIfNeeded: entry.attributes.fileType)
                return fuse_add_direntry(req, buffer + used, remaining, name, &st, off_t(entry.nextOffset))
            }
        }
        // fuse_add_direntry* only writes when the entry fits; otherwise it
        // just reports the size it would have needed.
        if needed > remaining { break }
        used += needed
        sentCount += 1
    }
    forgetAll(entries.dropFirst(sentCount))
    if sentCount == 0 && !entries.isEmpty {
        // An empty reply means end of directory, which would silently hide
        // the rest; getdents reports a too-small buffer as EINVAL.
        throw FSError(EINVAL)
    }
    if fuse_reply_buf(req, buffer, used) != 0 {
        forgetAll(entries.prefix(sentCount))
    }
}
