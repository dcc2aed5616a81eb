import CofferFuse
import CofferModel
import CofferVault
import Foundation

/// Extended attributes: the `user.` namespace is stored (sealed, synced); other namespaces
/// (security, trusted, system ACLs) are not offered, which tools treat as "none present".
extension CofferFileSystem {
    static func isUserNamespace(_ name: String) -> Bool { name.hasPrefix("user.") && name.utf8.count > 5 }

    public func setxattr(inode: InodeNumber, name: String, value: [UInt8], flags: XattrFlags) throws {
        try op {
            guard Self.isUserNamespace(name) else { throw FSError.notSupported }
            if name.utf8.count > 255 { throw FSError(ERANGE) }
            if value.count > 64 * 1024 { throw FSError(E2BIG) }
            let (n, unlinked) = try node(inode)
            if !unlinked, vault.isReadOnlyShare(n.id) { throw FSError.permissionDenied }
            if unlinked {
                return try setUnlinkedXattr(
                    n, name, value, create: flags.contains(.create), replace: flags.contains(.replace))
            }
            try vault.setXattr(
                n.id, name: name, value: value, create: flags.contains(.create), replace: flags.contains(.replace))
        }
    }

    public func getxattr(inode: InodeNumber, name: String) throws -> [UInt8] {
        try op {
            guard Self.isUserNamespace(name) else { throw FSError.noAttribute }
            let (n, _) = try node(inode)
            guard let v = n.attributes.liveXattrs[name] else { throw FSError.noAttribute }
            return v
        }
    }

    public func listxattr(inode: InodeNumber) throws -> [String] {
        try op {
            let (n, _) = try node(inode)
            return n.attributes.liveXattrs.keys.sorted()
        }
    }

    public func removexattr(inode: InodeNumber, name: String) throws {
        try op {
            guard Self.isUserNamespace(name) else { throw FSError.noAttribute }
            let (n, unlinked) = try node(inode)
            if !unlinked, vault.isReadOnlyShare(n.id) { throw FSError.permissionDenied }
            if unlinked { return try setUnlinkedXattr(n, name, nil, create: false, replace: false) }
            try vault.setXattr(n.id, name: name, value: nil)
        }
    }

    /// A file unlinked while open keeps taking xattr changes through its descriptors, in
    /// memory (it has no record any more), with the errnos of a live file.
    func setUnlinkedXattr(_ n: Node, _ name: String, _ value: [UInt8]?, create: Bool, replace: Bool) throws {
        let changed = try changeUnlinked(n.id) { a in
            let exists = a.xattrs[name]?.value != nil
            if create && exists { throw FSError.exists }
            if (replace || value == nil) && !exists { throw FSError.noAttribute }
            // The snapshot never reaches a store or a merge, so the stamp decides nothing.
            a.xattrs[name] = Stamped(value, at: .zero)
        }
        if changed == nil { throw FSError.notFound }
    }
}
