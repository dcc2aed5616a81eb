import CofferContent
import CofferCrypto
import CofferModel
import CofferStore

/// Errors from vault operations, each with a one-line message for the CLI and an errno for the
/// filesystem.
public enum VaultError: Error, CustomStringConvertible {
    case tree(TreeError)
    case noAccount(String)
    case accountExists(String)
    case corrupt(String)
    case notSupported(String)
    case invalidArgument(String)
    case busy(String)
    case io(String)
    /// Past `Vault.maxDocumentSize` (EFBIG).
    case tooLarge(String)
    /// A change this account may not make (EACCES): in a share it cannot write.
    case denied(String)
    /// A move between two owners' trees (EXDEV: tools copy instead), docs/SHARING.md.
    case crossOwner(String)
    /// Content this device keeps on demand and cannot fetch now (offline): EIO, never a wait
    /// without end (docs/SYNC.md, "Content on demand").
    case unavailable(String)

    public var description: String {
        switch self {
        case .tree(let e): return e.description
        case .noAccount(let dir):
            return "no Coffer account in \(dir); run `coffer init USERNAME` or `coffer account import` first"
        case .accountExists(let dir): return "an account already exists in \(dir)"
        case .corrupt(let w): return "store is damaged: \(w)"
        case .notSupported(let w): return "not supported: \(w)"
        case .invalidArgument(let w): return w
        case .busy(let w): return w
        case .io(let w): return w
        case .tooLarge(let w): return w
        case .denied(let w): return w
        case .crossOwner(let w): return "\(w) is refused: files keep their owner; copy instead"
        case .unavailable(let w): return w
        }
    }

    /// The errno a Linux filesystem returns for this error.
    public var errno: Int32 {
        switch self {
        case .tree(let e):
            switch e {
            case .notFound, .orphan, .deleted: return 2  // ENOENT
            case .pathConflict: return 17  // EEXIST
            case .cycle: return 22  // EINVAL
            case .parentNotFolder, .notAFolder: return 20  // ENOTDIR
            case .isAFolder: return 21  // EISDIR
            case .folderNotEmpty: return 39  // ENOTEMPTY
            case .invalidName(let why): return why.contains("longer than") ? 36 : 22  // ENAMETOOLONG / EINVAL
            case .rootModified, .multipleRoots: return 16  // EBUSY
            case .notADocument: return 22
            case .noRoot, .typeChanged: return 5  // EIO
            }
        case .notSupported: return 1  // EPERM
        case .invalidArgument: return 22
        case .busy: return 16
        case .tooLarge: return 27  // EFBIG
        case .denied: return 13  // EACCES
        case .crossOwner: return 18  // EXDEV
        case .noAccount, .accountExists, .corrupt, .io, .unavailable: return 5
        }
    }

    static func wrap(_ error: any Error) -> VaultError {
        switch error {
        case let e as VaultError: return e
        case let e as TreeError: return .tree(e)
        case let e as CryptoError: return .corrupt(e.description)
        case let e as ContentError: return .corrupt(e.description)
        case let e as DecodingError: return .corrupt(e.description)
        case let e as StoreError: return .io(e.description)
        default: return .io("\(error)")
        }
    }
}
