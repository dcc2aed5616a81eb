import CofferModel

/// A file as the user sees it: decrypted name and attributes.
public struct Node: Sendable, Equatable {
    public let id: FileID
    public let type: FileType
    public let parent: FileID
    public let name: String
    public let attributes: PosixAttributes

    public var isRoot: Bool { id == parent }

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
        case .document, .link: return 0o100000 | perm
        case .symlink: return 0o120000 | perm
        }
    }
}
