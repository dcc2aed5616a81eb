/// What kind of file a metadata record describes.
public enum FileType: UInt8, Sendable, CaseIterable {
    case folder = 1
    case document = 2
    case symlink = 3
    /// A link to a file shared by another account (sharing comes later; the model has it now).
    case link = 4
}

/// A name as the server sees it: sealed with the parent folder's key, plus a keyed MAC (by the
/// parent's key) so siblings can be compared for equality without reading them.
public struct SealedName: Hashable, Sendable {
    public var ciphertext: [UInt8]
    public var mac: [UInt8]
    public init(ciphertext: [UInt8], mac: [UInt8]) {
        self.ciphertext = ciphertext
        self.mac = mac
    }
}

public enum AccessMode: UInt8, Sendable {
    case read = 1
    case write = 2
    case owner = 3
}

/// A file key sealed for an account (the root's key for its owner; shared files' keys for others).
public struct AccessEntry: Hashable, Sendable {
    public var account: AccountID
    public var mode: AccessMode
    public var sealedKey: [UInt8]
    public var isDeleted: Bool
    public init(account: AccountID, mode: AccessMode, sealedKey: [UInt8], isDeleted: Bool = false) {
        self.account = account
        self.mode = mode
        self.sealedKey = sealedKey
        self.isDeleted = isDeleted
    }
}

/// One file's metadata: everything the server stores about it, none of it readable without keys.
///
/// Plaintext never appears here: the name is sealed, the POSIX attributes (which include symlink
/// targets and xattrs) are one sealed blob, and content is referenced by the digest of its sealed
/// manifest. This is what gets signed.
public struct FileMetadata: Hashable, Sendable {
    public var id: FileID
    public var type: FileType
    public var parent: FileID
    public var name: SealedName
    public var owner: AccountID
    public var isDeleted: Bool
    /// The file's key sealed with the parent's key; empty for the root, whose key is in `access`.
    public var wrappedKey: [UInt8]
    public var access: [AccessEntry]
    /// `PosixAttributes`, sealed with the file's key.
    public var sealedAttributes: [UInt8]
    /// BLAKE2b of the sealed manifest of the current content; nil for non-documents.
    public var contentDigest: [UInt8]?
    /// Who wrote this version (verifies the signature).
    public var lastModifiedBy: AccountID

    public init(
        id: FileID, type: FileType, parent: FileID, name: SealedName, owner: AccountID,
        isDeleted: Bool = false, wrappedKey: [UInt8], access: [AccessEntry] = [],
        sealedAttributes: [UInt8], contentDigest: [UInt8]? = nil, lastModifiedBy: AccountID
    ) {
        self.id = id
        self.type = type
        self.parent = parent
        self.name = name
        self.owner = owner
        self.isDeleted = isDeleted
        self.wrappedKey = wrappedKey
        self.access = access
        self.sealedAttributes = sealedAttributes
        self.contentDigest = contentDigest
        self.lastModifiedBy = lastModifiedBy
    }

    public var isRoot: Bool { parent == id }

    static let tag: [UInt8] = Array("CFMD".utf8)
    static let formatVersion: UInt8 = 1

    /// The canonical bytes that are signed.
    public func encoded() -> [UInt8] {
        var w = ByteWriter(capacity: 256 + sealedAttributes.count)
        w.raw(Self.tag)
        w.u8(Self.formatVersion)
        w.raw(id.bytes)
        w.u8(type.rawValue)
        w.raw(parent.bytes)
        w.data(name.ciphertext)
        w.data(name.mac)
        w.raw(owner.bytes)
        w.bool(isDeleted)
        w.data(wrappedKey)
        w.u32(UInt32(access.count))
        for a in access {
            w.raw(a.account.bytes)
            w.u8(a.mode.rawValue)
            w.data(a.sealedKey)
            w.bool(a.isDeleted)
        }
        w.data(sealedAttributes)
        w.optionalData(contentDigest)
        w.raw(lastModifiedBy.bytes)
        return w.bytes
    }

    public init(decoding bytes: [UInt8]) throws {
        var r = ByteReader(bytes)
        try self.init(reading: &r)
        try r.expectEnd()
    }

    init(reading r: inout ByteReader) throws {
        guard try r.raw(4) == Self.tag else { throw DecodingError("not a metadata record") }
        let v = try r.u8()
        guard v == Self.formatVersion else { throw DecodingError("unsupported metadata version \(v)") }
        id = try FileID(bytes: r.raw(16))
        guard let t = FileType(rawValue: try r.u8()) else { throw DecodingError("unknown file type") }
        type = t
        parent = try FileID(bytes: r.raw(16))
        name = SealedName(ciphertext: try r.data(max: 4096), mac: try r.data(max: 64))
        owner = try AccountID(bytes: r.raw(32))
        isDeleted = try r.bool()
        wrappedKey = try r.data(max: 256)
        let n = try r.u32()
        guard n <= 10_000 else { throw DecodingError("too many access entries") }
        access = []
        for _ in 0..<n {
            let account = try AccountID(bytes: r.raw(32))
            guard let mode = AccessMode(rawValue: try r.u8()) else { throw DecodingError("unknown access mode") }
            access.append(
                AccessEntry(account: account, mode: mode, sealedKey: try r.data(max: 256), isDeleted: try r.bool()))
        }
        sealedAttributes = try r.data(max: 1 << 20)
        contentDigest = try r.optionalData(max: 64)
        lastModifiedBy = try AccountID(bytes: r.raw(32))
    }
}

/// Metadata plus the signature of the account that wrote it, over the metadata and the record's
/// revision.
///
/// The revision orders one file's signed records: every record a device pushes has a revision
/// greater than the one it was based on (`SignedMetadata.revision(after:now:)`), the server
/// refuses a changed record whose revision is not greater than the stored one, and a device
/// refuses a pulled record older than the newest it has seen. So a server that serves an old but
/// validly signed record (a rollback) is caught: the signature binds the revision.
public struct SignedMetadata: Hashable, Sendable {
    public var metadata: FileMetadata
    public var revision: UInt64
    public var signature: [UInt8]
    public init(metadata: FileMetadata, revision: UInt64 = 0, signature: [UInt8]) {
        self.metadata = metadata
        self.revision = revision
        self.signature = signature
    }

    public var id: FileID { metadata.id }

    static let messageTag: [UInt8] = Array("CFSR".utf8)

    /// The bytes the signature covers: a tag of their own (so no other signed message of the
    /// account can be taken for a record), the revision, then the canonical metadata.
    public static func message(metadata: FileMetadata, revision: UInt64) -> [UInt8] {
        var w = ByteWriter(capacity: 300 + metadata.sealedAttributes.count)
        w.raw(messageTag)
        w.u64(revision)
        w.raw(metadata.encoded())
        return w.bytes
    }

    public var message: [UInt8] { Self.message(metadata: metadata, revision: revision) }

    /// The revision for a record written on top of `base` (nil for a file's first record) at wall
    /// time `now` (milliseconds): above the base, and at least the clock, so records written
    /// concurrently on two devices still tend to order by time. Saturates instead of trapping on
    /// a hostile base of `UInt64.max` (the server then refuses the push as not newer).
    public static func revision(after base: UInt64?, now: UInt64) -> UInt64 {
        let next = (base ?? 0).addingReportingOverflow(1)
        return max(next.overflow ? UInt64.max : next.partialValue, now)
    }

    public func encoded() -> [UInt8] {
        var w = ByteWriter()
        w.data(metadata.encoded())
        w.u64(revision)
        w.data(signature)
        return w.bytes
    }

    public init(decoding bytes: [UInt8]) throws {
        var r = ByteReader(bytes)
        metadata = try FileMetadata(decoding: r.data(max: 2 << 20))
        revision = try r.u64()
        signature = try r.data(max: 128)
        try r.expectEnd()
    }
}
