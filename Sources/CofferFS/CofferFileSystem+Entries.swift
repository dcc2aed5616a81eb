import CofferFuse
import CofferModel
import CofferVault
import Foundation

/// Name operations: lookup, attributes, create/remove names, rename, links.
extension CofferFileSystem {
    public func lookup(parent: InodeNumber, name: String) throws -> Entry {
        try op {
            if name.utf8.count > FileName.maxBytes { throw FSError.nameTooLong }
            let folder = try folderID(parent)
            guard let node = try vault.lookup(folder, name) else { throw FSError.notFound }
            return try entry(node, parent: parent)
        }
    }

    public func forget(inode: InodeNumber, lookups: UInt64) {
        guard let id = inodes.forget(inode, lookups) else { return }
        let zombie = handles.withLock { t -> OpenDocument? in
            if t.unlinkedNodes[id]?.type == .folder { t.unlinkedNodes[id] = nil }
            guard let doc = t.zombies.removeValue(forKey: inode) else { return nil }
            if !t.files.values.contains(where: { $0.document.id == doc.id }) { t.unlinkedNodes[doc.id] = nil }
            return doc
        }
        if let zombie { try? vault.release(zombie) }
    }

    public func getattr(inode: InodeNumber, handle: UInt64?) throws -> Attributes {
        try op {
            let (n, unlinked) = try node(inode)
            return attributes(n, unlinked: unlinked)
        }
    }

    /// Only asked on a mount without `default_permissions`, which `MountService` chooses only
    /// when root mounts without allow_other: then only root's processes reach the mount, and
    /// for them (CAP_DAC_OVERRIDE) everything is granted except execute on a file with no
    /// execute bit at all, as on any Linux filesystem. Any other caller gets the mode bits of
    /// owner, group (its primary group) or others.
    public func access(inode: InodeNumber, mask: Int32, context: RequestContext) throws {
        try op {
            let (n, unlinked) = try node(inode)
            let a = attributes(n, unlinked: unlinked)
            let wanted = UInt32(mask) & 0o7
            guard wanted != 0 else { return }  // F_OK: it exists
            let isFolder = a.mode & UInt32(S_IFMT) == UInt32(S_IFDIR)
            if context.uid == 0 {
                guard wanted & UInt32(X_OK) == 0 || isFolder || a.mode & 0o111 != 0 else {
                    throw FSError.permissionDenied
                }
                return
            }
            let granted =
                context.uid == a.uid ? (a.mode >> 6) & 0o7 : context.gid == a.gid ? (a.mode >> 3) & 0o7 : a.mode & 0o7
            guard wanted & ~granted == 0 else { throw FSError.permissionDenied }
        }
    }

    public func setattr(
        inode: InodeNumber, changes: CofferFuse.AttributeChanges, handle: UInt64?, context: RequestContext
    ) throws -> Attributes {
        try op {
            let (n, unlinked) = try node(inode)
            if !unlinked, vault.isReadOnlyShare(n.id) { throw FSError.permissionDenied }
            if let size = changes.size {
                guard n.type == .document else { throw n.type == .folder ? FSError.isDirectory : FSError.invalid }
                // truncate(2) to the size the file has still marks mtime and ctime on Linux.
                if let handle, let h = handles.withLock({ $0.files[handle] }) {
                    try h.document.truncate(to: size, touchingTimes: true)
                    try h.document.flush()
                } else {
                    let doc = try vault.openDocument(n.id)
                    defer { try? vault.release(doc) }
                    try doc.truncate(to: size, touchingTimes: true)
                    try doc.flush()
                }
            }
            if unlinked { return try setUnlinkedAttributes(n, changes) }
            var vc = CofferVault.AttributeChanges()
            // Changes that change nothing (tar and cp re-set the owner and mode they just created
            // with) cost no commit and no new clock stamp that could win a later merge.
            let current = n.attributes
            vc.mode = changes.mode.map { $0 & 0o7777 }.flatMap { $0 == current.mode.value ? nil : $0 }
            vc.uid = changes.uid.flatMap { $0 == current.uid.value ? nil : $0 }
            vc.gid = changes.gid.flatMap { $0 == current.gid.value ? nil : $0 }
            // One reading for both, so `touch` (UTIME_NOW twice) gives equal atime and mtime.
            let now = FileTime.now()
            if let at = changes.accessTime {
                let ts = Timespec(at.resolved(now: now))
                vc.atime = ts == current.atime.value ? nil : ts
            }
            let mtime = changes.modificationTime.map { Timespec($0.resolved(now: now)) }
            if mtime != nil || vc.atime != nil {
                // utimens on a document with unflushed writes (cp -a and tar set both times
                // before closing): the times ride along with the content commit at close (later
                // writes move mtime again, as POSIX wants), instead of a commit of their own for
                // every file copied in.
                let doc = openDocumentHandle(for: n.id)
                if let doc, doc.setPendingTimes(modification: mtime, access: vc.atime) {
                    vc.atime = nil
                } else {
                    // Unflushed writes that cannot carry these times (the epoch, or outside
                    // 1677-2262) are committed first: committed at close, they would move mtime
                    // to the time of the write, which came before this call, and a time set
                    // earlier to ride along with them would overwrite this one.
                    if let doc, doc.isModified { try doc.flush() }
                    vc.mtime = mtime
                }
            }
            // chmod/chown of a document with unflushed writes (tar: create 0600, write, chmod)
            // rides along with the content commit at close, like the mtime above; the kernel
            // sees the new values at once (the vault reports pending ones).
            if vc.atime == nil, vc.mtime == nil, vc.mode != nil || vc.uid != nil || vc.gid != nil,
                let doc = openDocumentHandle(for: n.id),
                doc.setPendingOwnership(mode: vc.mode, uid: vc.uid, gid: vc.gid)
            {
                vc.mode = nil
                vc.uid = nil
                vc.gid = nil
            }
            if !vc.isEmpty {
                try vault.setAttributes(n.id, vc)
            }
            return attributes(try vault.node(n.id))
        }
    }

    /// A file unlinked while open has no record to change, but its descriptors still see
    /// fchmod, fchown and futimens, as on a local filesystem: the snapshot they read changes.
    func setUnlinkedAttributes(_ n: Node, _ changes: CofferFuse.AttributeChanges) throws -> Attributes {
        let now = FileTime.now()
        let node = try changeUnlinked(n.id) { a in
            if let mode = changes.mode { a.mode.value = mode & 0o7777 }
            if let uid = changes.uid { a.uid.value = uid }
            if let gid = changes.gid { a.gid.value = gid }
            if let at = changes.accessTime { a.atime.value = Timespec(at.resolved(now: now)) }
            if let mt = changes.modificationTime { a.mtime.value = Timespec(mt.resolved(now: now)) }
        }
        return attributes(node ?? n, unlinked: true)
    }

    /// From the vault, not the handle table: after the last close the document is still
    /// registered until its commit is done, and a time or mode set meanwhile must ride with it
    /// rather than be overwritten by it.
    func openDocumentHandle(for id: FileID) -> OpenDocument? {
        vault.registeredDocument(id)
    }

    public func readlink(inode: InodeNumber) throws -> String {
        try op {
            let (n, _) = try node(inode)
            guard n.type == .symlink, let target = n.attributes.symlinkTarget else { throw FSError.invalid }
            return target
        }
    }

    /// Regular files may be made with mknod; device nodes, FIFOs and sockets cannot be synced to
    /// another machine meaningfully, so they are refused with EPERM (see docs/FILESYSTEM.md).
    public func mknod(
        parent: InodeNumber, name: String, mode: UInt32, device: UInt64, context: RequestContext
    ) throws -> Entry {
        try op {
            guard mode & UInt32(S_IFMT) == UInt32(S_IFREG) else { throw FSError.notPermitted }
            let folder = try writableFolderID(parent)
            let node = try vault.create(
                in: folder, name: name, type: .document, mode: mode & 0o7777, uid: context.uid,
                gid: groupFor(folder, context))
            return try entry(node, parent: parent)
        }
    }

    public func mkdir(parent: InodeNumber, name: String, mode: UInt32, context: RequestContext) throws -> Entry {
        try op {
            let folder = try writableFolderID(parent)
            // In a set-group-ID folder a new folder is set-group-ID too, so the rule carries on
            // down the tree (`inode_init_owner`, which a FUSE filesystem must do itself).
            let inherits = setGroupIDFolder(folder) != nil
            let node = try vault.create(
                in: folder, name: name, type: .folder, mode: mode & 0o7777 | (inherits ? 0o2000 : 0),
                uid: context.uid, gid: groupFor(folder, context))
            return try entry(node, parent: parent)
        }
    }

    /// BSD group semantics for set-group-ID folders, as ext4 does: what is created in one
    /// takes the folder's group.
    func groupFor(_ folder: FileID, _ context: RequestContext) -> UInt32 {
        setGroupIDFolder(folder) ?? context.gid
    }

    /// The folder's group if the folder is set-group-ID.
    func setGroupIDFolder(_ folder: FileID) -> UInt32? {
        guard let p = try? vault.node(folder), p.attributes.mode.value & 0o2000 != 0 else { return nil }
        return p.attributes.gid.value
    }

    public func unlink(parent: InodeNumber, name: String) throws {
        try op {
            let folder = try writableFolderID(parent)
            guard let node = try vault.lookup(folder, name) else { throw FSError.notFound }
            if node.type == .folder { throw FSError.isDirectory }
            keepIfOpen(node, racingOpens: false)
            try vault.remove(node.id, expectFolder: false)
        }
    }

    /// A document that loses its name stays readable and writable through its open handles, and
    /// stays openable through an inode the kernel still holds (until `forget`).
    ///
    /// `racingOpens`: an atomic replace must also serve an open already on its way for the old
    /// inode (it may not fail, and the old content is a correct answer), so the document is kept
    /// open even without handles. An unlink need not: an open that loses that race gets ESTALE,
    /// the kernel looks the name up again and reports ENOENT, as for any open after an unlink.
    /// Skipping it spares rm -rf loading every manifest it deletes (a tenth of unlink's CPU).
    func keepIfOpen(_ node: Node, racingOpens: Bool = true) {
        guard node.type == .document else { return }
        let ino = inodes.referencedInode(for: node.id)
        let keep =
            ino != nil
            && (racingOpens || handles.withLock { t in t.files.values.contains(where: { $0.document.id == node.id }) })
        let zombie = keep ? try? vault.openDocument(node.id) : nil
        let unused = handles.withLock { t -> OpenDocument? in
            let open = t.files.values.contains(where: { $0.document.id == node.id })
            if open || zombie != nil { t.unlinkedNodes[node.id] = Self.changed(node) }  // its ctime moves
            guard let zombie, let ino else { return nil }
            if t.zombies[ino] != nil { return zombie }
            t.zombies[ino] = zombie
            return nil
        }
        if let unused { try? vault.release(unused) }
    }

    /// A removed folder the kernel still holds (a process's working directory, an open
    /// descriptor) still answers fstat, with no links, as on ext4, until the kernel forgets it.
    func keepIfReferenced(folder node: Node) {
        guard inodes.referencedInode(for: node.id) != nil else { return }
        // Losing its name changes it: its ctime moves.
        handles.withLock { t in t.unlinkedNodes[node.id] = Self.changed(node) }
    }

    public func rmdir(parent: InodeNumber, name: String) throws {
        try op {
            let folder = try writableFolderID(parent)
            guard let node = try vault.lookup(folder, name) else { throw FSError.notFound }
            guard node.type == .folder else { throw FSError.notDirectory }
            try vault.remove(node.id, recursive: false, expectFolder: true)
            keepIfReferenced(folder: node)
        }
    }

    public func symlink(target: String, parent: InodeNumber, name: String, context: RequestContext) throws -> Entry {
        try op {
            let folder = try writableFolderID(parent)
            let node = try vault.create(
                in: folder, name: name, type: .symlink, mode: 0o777, uid: context.uid, gid: groupFor(folder, context),
                symlinkTarget: target)
            return try entry(node, parent: parent)
        }
    }

    public func rename(
        parent: InodeNumber, name: String, newParent: InodeNumber, newName: String, flags: RenameFlags
    ) throws {
        try op {
            if newName.utf8.count > FileName.maxBytes { throw FSError.nameTooLong }
            let from = try writableFolderID(parent)
            let to = try writableFolderID(newParent)
            guard let source = try vault.lookup(from, name) else { throw FSError.notFound }
            let target = try vault.lookup(to, newName)
            if flags.contains(.exchange) {
                guard let target else { throw FSError.notFound }
                try vault.exchange(source.id, target.id)
                inodes.moved(source.id, to: newParent, name: newName)
                inodes.moved(target.id, to: parent, name: name)
                return
            }
            if let target, target.id != source.id {
                if flags.contains(.noReplace) { throw FSError.exists }
                if source.type == .folder && target.type != .folder { throw FSError.notDirectory }
                if source.type != .folder && target.type == .folder { throw FSError.isDirectory }
                keepIfOpen(target)
            }
            try vault.rename(source.id, to: to, name: newName, mode: flags.contains(.noReplace) ? .noReplace : .replace)
            // The kernel moved its dentry along: a later change from elsewhere must invalidate
            // the new name, not the old.
            inodes.moved(source.id, to: newParent, name: newName)
            if let target, target.id != source.id, target.type == .folder { keepIfReferenced(folder: target) }
        }
    }

    /// Hard links would give one document two parents, which a synced tree (and its key chain)
    /// cannot express; EPERM, as filesystems without hard links return (tools fall back to copies).
    public func link(inode: InodeNumber, newParent: InodeNumber, newName: String) throws -> Entry {
        throw FSError.notPermitted
    }
}
