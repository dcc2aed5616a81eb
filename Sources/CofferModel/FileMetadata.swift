/// What kind of file a metadata record describes.
public enum FileType: UInt8, Sendable, CaseIterable {
    case folder = 1
    case document = 2
    case symlink = 3
    /// Another account's shared file placed in this account's tree (`FileMetadata.linkTarget`;
    /// docs/SHARING.md, "Links").
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

/// What an account may do with a file; ordered, so the highest of several is `max`.
public enum AccessMode: UInt8, Sendable, Comparable {
    case read = 1
    case write = 2
    case owner = 3

    public static func < (a: AccessMode, b: AccessMode) -> Bool { a.rawValue < b.rawValue }
}

/// A file key sealed for an account: the root's key for its owner, or a grant of a shared file
/// to another account (docs/SHARING.md).
///
/// A grant carries its own signature, by the file's owner (or, for a grant its holder gave up,
/// by the holder: `isDeleted` set), over `grantMessage(fileID:)`. The record around it may be
/// signed by any account with write access, so the record's signature alone would let a writer
/// hand out access; the grant's own signature does not. The owner's entry on its own root is
/// the one entry without a signature: only the owner ever signs a root record.
///
/// A grant its holder gave up also keeps the owner's signature of the live grant it ends
/// (`ownerSignature`), so any device, one new to the file included, can tell a give-up from a
/// grant never made, and what the holder wrote while it held the grant stays checkable.
public struct AccessEntry: Hashable, Sendable {
    public var account: AccountID
    public var mode: AccessMode
    public var sealedKey: [UInt8]
    /// A revoked or given-up grant: kept as a tombstone (entries are never removed, so a removal
    /// is a signed change like any other and cannot be made by dropping bytes).
    public var isDeleted: Bool
    /// Ed25519 over `grantMessage(fileID:)`; empty for the owner's entry on its root.
    public var signature: [UInt8]
    /// On a grant its grantee gave up: the owner's signature of the same grant live
    /// (`liveGrant`), which the give-up ends. Nil on every other entry.
    public var ownerSignature: [UInt8]?
    /// The file's key generation when the grant was sealed (`FileMetadata.keyGeneration`), under
    /// its signature: a give-up must end a grant of the record's current generation, so a grant
    /// the owner revoked, whose key it then replaced, cannot be passed off as given up.
    public var generation: UInt32

    public init(
        account: AccountID, mode: AccessMode, sealedKey: [UInt8], isDeleted: Bool = false, signature: [UInt8] = [],
        ownerSignature: [UInt8]? = nil, generation: UInt32 = 0
    ) {
        self.account = account
        self.mode = mode
        self.sealedKey = sealedKey
        self.isDeleted = isDeleted
        self.signature = signature
        self.ownerSignature = ownerSignature
        self.generation = generation
    }

    /// The live grant a give-up ends: the same grant, not deleted, as its owner signed it.
    public var liveGrant: AccessEntry {
        AccessEntry(
            account: account, mode: mode, sealedKey: sealedKey, signature: ownerSignature ?? [], generation: generation)
    }

    static let grantTag: [UInt8] = Array("CFGR".utf8)
    static let keyBindingTag: [UInt8] = Array("CFGK".utf8)

    /// What a granted key is sealed together with (`PublicBoxKey.seal(key:binding:)`): the file,
    /// the grantee, the mode and the granting owner, checked when the grantee opens it.
    public func keyBinding(fileID: FileID, owner: AccountID) -> [UInt8] {
        var w = ByteWriter(capacity: 85)
        w.raw(Self.keyBindingTag)
        w.raw(fileID.bytes)
        w.raw(account.bytes)
        w.u8(mode.rawValue)
        w.raw(owner.bytes)
        return w.bytes
    }

    /// The bytes a grant's signature covers: its own tag, then the file, the grantee, the mode,
    /// the tombstone flag and the sealed key, so a grant cannot be moved to another file, another
    /// account or another mode, or revived, without a new signature; and, from key generation 1
    /// on (message version 2), the generation it was sealed at.
    public func grantMessage(fileID: FileID) -> [UInt8] {
        var w = ByteWriter(capacity: 100 + sealedKey.count)
        w.raw(Self.grantTag)
        w.u8(generation == 0 ? 1 : 2)
        w.raw(fileID.bytes)
        w.raw(account.bytes)
        w.u8(mode.rawValue)
        w.bool(isDeleted)
        w.data(sealedKey)
        if generation != 0 { w.u32(generation) }
        return w.bytes
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
    /// For a link (`FileType.link`), the shared file it places here; nil for every other type.
    /// In the clear, like parents, so the server can hold links to their rules.
    public var linkTarget: FileID?
    /// The file's name sealed with its own key (`SealPurpose.shareName`), for the accounts it is
    /// shared with: they hold the file's key but not its parent's, under which `name` is sealed,
    /// so this is how a pending share shows its name. Set by the owner when sharing, kept
    /// current when the file is renamed; nil on files never shared.
    public var shareName: [UInt8]?
    /// How many times the file's key was replaced (0: the key it was made with). The owner's
    /// device gives a shared folder and everything below it new keys when it revokes a grant
    /// (docs/SHARING.md, "Revocation"); the count tells a merge which side's key, and the
    /// names, attributes and content sealed under it, is the newer, without opening anything.
    public var keyGeneration: UInt32 = 0

    public init(
        id: FileID, type: FileType, parent: FileID, name: SealedName, owner: AccountID,
        isDeleted: Bool = false, wrappedKey: [UInt8], access: [AccessEntry] = [],
        sealedAttributes: [UInt8], contentDigest: [UInt8]? = nil, lastModifiedBy: AccountID,
        linkTarget: FileID? = nil, shareName: [UInt8]? = nil
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
        self.linkTarget = linkTarget
        self.shareName = shareName
    }

    public var isRoot: Bool { parent == id }

    static let tag: [UInt8] = Array("CFMD".utf8)

    /// Version 2 adds a signature to each access entry and the link target. A record that needs
    /// neither (no signed grant, not a link: every record before sharing, and most after) is
    /// written as version 1, byte for byte as before, so stored signatures stay valid and the
    /// same value always has one encoding; a version 2 record that could have been version 1 is
    /// refused as not canonical. Version 3 adds the share name, and is written only with one.
    /// Version 4 adds the key generation, and is written only when it is not 0. Version 5 adds
    /// each grant's `ownerSignature` and `generation`, and is written only when a grant carries
    /// either.
    var formatVersion: UInt8 {
        if access.contains(where: { $0.ownerSignature != nil || $0.generation != 0 }) { return 5 }
        if keyGeneration != 0 { return 4 }
        if shareName != nil { return 3 }
        return linkTarget != nil || access.contains(where: { !$0.signature.isEmpty }) ? 2 : 1
    }

    /// The canonical bytes that are signed.
    public func encoded() -> [UInt8] {
        let version = formatVersion
        var w = ByteWriter(capacity: 256 + sealedAttributes.count)
        w.raw(Self.tag)
        w.u8(version)
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
            if version >= 2 { w.data(a.signature) }
            if version >= 5 {
                w.optionalData(a.ownerSignature)
                w.u32(a.generation)
            }
        }
        w.data(sealedAttributes)
        w.optionalData(contentDigest)
        w.raw(lastModifiedBy.bytes)
        if version >= 2 { w.optionalData(linkTarget?.bytes) }
        if version >= 3 { w.optionalData(shareName) }
        if version >= 4 { w.u32(keyGeneration) }
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
        guard (1...5).contains(v) else { throw DecodingError("unsupported metadata version \(v)") }
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
            let sealedKey = try r.data(max: 256)
            let deleted = try r.bool()
            let signature = v >= 2 ? try r.data(max: 64) : []
            let ownerSignature = v >= 5 ? try r.optionalData(max: 64) : nil
            let generation = v >= 5 ? try r.u32() : 0
            access.append(
                AccessEntry(
                    account: account, mode: mode, sealedKey: sealedKey, isDeleted: deleted, signature: signature,
                    ownerSignature: ownerSignature, generation: generation))
        }
        sealedAttributes = try r.data(max: 1 << 20)
        contentDigest = try r.optionalData(max: 64)
        lastModifiedBy = try AccountID(bytes: r.raw(32))
        linkTarget = v >= 2 ? try r.optionalData(max: 16).map { try FileID(bytes: $0) } : nil
        shareName = v >= 3 ? try r.optionalData(max: 4096) : nil
        keyGeneration = v >= 4 ? try r.u32() : 0
        guard formatVersion == v else {
            throw DecodingError("metadata version \(v) is not this record's canonical form")
        }
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
