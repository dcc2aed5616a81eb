import CofferModel

/// A file as the user sees it: decrypted name and attributes.
public struct Node: Sendable, Equatable {
    public let id: FileID
    public let type: FileType
    public let parent: FileID
    public let name: String
    public let attributes: PosixAttributes
    /// Live folders directly inside this one (0 for anything else).
    public let subfolders: Int

    public init(
        id: FileID, type: FileType, parent: FileID, name: String, attributes: PosixAttributes, subfolders: Int = 0
    ) {
        self.id = id
        self.type = type
        self.parent = parent
        self.name = name
        self.attributes = attributes
        self.subfolders = subfolders
    }

    public var isRoot: Bool { id == parent }

    /// st_nlink while the file has a name: a folder is linked from its parent, from its own
    /// "." and from each subfolder's "..", as on ext4; tools such as find rely on it.
    public var linkCount: UInt32 {
        type == .folder ? UInt32(clamping: 2 + subfolders) : type == .link ? 2 : 1
    }

    /// Bytes st_size reports: content length for documents, target length for symlinks.
    public var size: UInt64 {
        switch type {
        case .document: return attributes.size
        case .symlink: return UInt64(attributes.symlinkTarget?.utf8.count ?? 0)
        case .folder, .link: return 4096
        }
    }

    /// st_mode: the type bits plus permission bits.
    public var mode: UInt32 {
        let perm = attributes.mode.value & 0o7777
        switch type {
        case .folder: return 0o040000 | perm
        // An accepted share: a folder at the link's place, empty and read-only until the mount
        // shows shared trees (docs/SHARING.md, "Where it stands").
        case .link: return 0o040000 | (perm & ~0o222)
        case .document: return 0o100000 | perm
        case .symlink: return 0o120000 | perm
        }
    }
}
