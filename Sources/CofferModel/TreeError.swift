/// Why an operation or a batch was refused. The `path`/`name` strings are filled in by the layer
/// that knows plaintext names; the model itself only sees ids and MACs.
public enum TreeError: Error, Equatable, Sendable, CustomStringConvertible {
    case notFound(String)
    case rootModified
    case multipleRoots
    case noRoot
    case pathConflict(String)
    case cycle(String)
    case orphan(String)
    case parentNotFolder(String)
    case notAFolder(String)
    case notADocument(String)
    case isAFolder(String)
    case folderNotEmpty(String)
    case invalidName(String)
    case deleted(String)
    case typeChanged(String)

    public var description: String {
        switch self {
        case .notFound(let p): return "no such file or folder: \(p)"
        case .rootModified: return "the root folder cannot be renamed, moved or deleted"
        case .multipleRoots: return "a second root folder cannot be created"
        case .noRoot: return "the tree has no root folder"
        case .pathConflict(let p): return "a file with that name already exists: \(p)"
        case .cycle(let p): return "cannot move a folder into itself or one of its subfolders: \(p)"
        case .orphan(let p): return "parent folder does not exist: \(p)"
        case .parentNotFolder(let p): return "not a folder: \(p)"
        case .notAFolder(let p): return "not a folder: \(p)"
        case .notADocument(let p): return "not a document: \(p)"
        case .isAFolder(let p): return "is a folder: \(p)"
        case .folderNotEmpty(let p): return "folder is not empty: \(p)"
        case .invalidName(let why): return "invalid name: \(why)"
        case .deleted(let p): return "file was deleted: \(p)"
        case .typeChanged(let p): return "a file's type cannot change: \(p)"
        }
    }
}

/// Rules every name obeys: these are checked on plaintext before sealing.
public enum FileName {
    public static let maxBytes = 255

    public static func validate(_ name: String) throws(TreeError) {
        let utf8 = Array(name.utf8)
        if utf8.isEmpty { throw .invalidName("a name cannot be empty") }
        if utf8.count > maxBytes { throw .invalidName("\"\(name.prefix(40))…\" is longer than \(maxBytes) bytes") }
        if name == "." || name == ".." { throw .invalidName("\"\(name)\" is reserved") }
        if utf8.contains(0x2f) { throw .invalidName("\"\(name)\" contains a slash") }
        if utf8.contains(0) { throw .invalidName("a name cannot contain a NUL byte") }
    }
}
