@testable import CofferModel

/// A file id whose last byte is `n` (readable in failures).
func fid(_ n: Int) -> FileID {
    try! FileID(bytes: [UInt8](repeating: 0, count: 14) + [UInt8(n >> 8), UInt8(n & 0xff)])
}

let owner = try! AccountID(bytes: [UInt8](repeating: 7, count: 32))
let rootID = fid(1)

/// A fake sealed name: the "MAC" is the name's bytes (names are equal iff MACs are).
func sname(_ name: String) -> SealedName {
    SealedName(ciphertext: [0xEE] + Array(name.utf8), mac: Array(name.utf8))
}

func meta(_ id: Int, parent: Int, _ name: String, _ type: FileType = .document, deleted: Bool = false) -> FileMetadata {
    FileMetadata(
        id: fid(id), type: type, parent: fid(parent), name: sname(name), owner: owner,
        isDeleted: deleted, wrappedKey: [UInt8(id & 0xff)], sealedAttributes: [1, 2, 3],
        contentDigest: type == .document ? [9] : nil, lastModifiedBy: owner)
}

func folder(_ id: Int, parent: Int, _ name: String, deleted: Bool = false) -> FileMetadata {
    meta(id, parent: parent, name, .folder, deleted: deleted)
}

let root = FileMetadata(
    id: rootID, type: .folder, parent: rootID, name: sname("root"), owner: owner,
    wrappedKey: [], sealedAttributes: [0], lastModifiedBy: owner)

/// root(1)
/// ├── a(2)/            folder
/// │   ├── d(4)         document
/// │   └── c(5)/        folder
/// │       └── e(6)/    folder
/// └── b(3)/            folder
func sampleTree() -> FileTree {
    FileTree([
        root, folder(2, parent: 1, "a"), folder(3, parent: 1, "b"), meta(4, parent: 2, "d"),
        folder(5, parent: 2, "c"), folder(6, parent: 5, "e"),
    ])
}

func hex(_ b: [UInt8]) -> String { hexString(b) }
func unhex(_ s: String) -> [UInt8] { bytesFromHex(s)! }

/// Deterministic PRNG (SplitMix64) so randomized tests are reproducible.
struct SplitMix64: RandomNumberGenerator {
    var state: UInt64
    init(seed: UInt64) { state = seed }
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}
