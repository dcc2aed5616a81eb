/// Seconds and nanoseconds since the epoch, as `struct timespec` has them.
public struct Timespec: Hashable, Sendable, Comparable {
    public var seconds: Int64
    public var nanoseconds: Int64
    public init(seconds: Int64, nanoseconds: Int64 = 0) {
        self.seconds = seconds
        self.nanoseconds = nanoseconds
    }
    public static func < (a: Self, b: Self) -> Bool { (a.seconds, a.nanoseconds) < (b.seconds, b.nanoseconds) }
    public static let zero = Timespec(seconds: 0)
}

/// The POSIX side of a file, sealed inside its metadata. Each attribute carries the hybrid clock
/// reading of its last write so two devices' changes merge attribute by attribute (Muse's
/// atomic attributes) instead of one device's chmod erasing the other's touch.
public struct PosixAttributes: Hashable, Sendable {
    /// Permission bits only (the 0o7777 part); the file type lives in `FileType`.
    public var mode: Stamped<UInt32>
    public var uid: Stamped<UInt32>
    public var gid: Stamped<UInt32>
    public var mtime: Stamped<Timespec>
    /// Set at creation and by explicit utimensat only; reads never move it (as with `noatime`),
    /// since a stamped, synced write per read would cost far more than the value is worth.
    public var atime: Stamped<Timespec>
    /// The last change of any attribute or content; after a merge, the later of the two.
    public var ctime: Timespec
    /// Plaintext size of a document's content, kept beside the manifest so stat needs no unsealing.
    public var size: UInt64
    /// Set once at creation for symlinks.
    public var symlinkTarget: String?
    /// User xattrs; a nil value is a removal, kept so the removal can win a merge.
    public var xattrs: [String: Stamped<[UInt8]?>]

    public init(
        mode: UInt32, uid: UInt32, gid: UInt32, mtime: Timespec, stamp: HybridTimestamp,
        size: UInt64 = 0, symlinkTarget: String? = nil
    ) {
        self.mode = Stamped(mode & 0o7777, at: stamp)
        self.uid = Stamped(uid, at: stamp)
        self.gid = Stamped(gid, at: stamp)
        self.mtime = Stamped(mtime, at: stamp)
        self.atime = Stamped(mtime, at: stamp)
        self.ctime = mtime
        self.size = size
        self.symlinkTarget = symlinkTarget
        self.xattrs = [:]
    }

    public var liveXattrs: [String: [UInt8]] {
        var out: [String: [UInt8]] = [:]
        for (k, v) in xattrs { if let value = v.value { out[k] = value } }
        return out
    }

    /// Per-attribute last-writer-wins. Commutative, associative and idempotent, so devices that
    /// merge in different orders agree.
    public static func merge(_ a: Self, _ b: Self) -> Self {
        var out = a
        out.mode = .lastWriterWins(a.mode, b.mode)
        out.uid = .lastWriterWins(a.uid, b.uid)
        out.gid = .lastWriterWins(a.gid, b.gid)
        out.mtime = .lastWriterWins(a.mtime, b.mtime)
        out.atime = .lastWriterWins(a.atime, b.atime)
        out.ctime = max(a.ctime, b.ctime)
        // The size is written together with mtime by a content write: it follows the mtime winner
        // (was: always `a.size`, which made the merge depend on argument order).
        out.size = a.mtime.stamp >= b.mtime.stamp ? a.size : b.size
        out.symlinkTarget = a.symlinkTarget ?? b.symlinkTarget
        for (k, v) in b.xattrs {
            if let mine = out.xattrs[k] { out.xattrs[k] = .lastWriterWins(mine, v) } else { out.xattrs[k] = v }
        }
        return out
    }

    static let tag: [UInt8] = Array("CFPA".utf8)
    /// 2: the format settled while pre-release version 1 (which had no atime) was still
    /// changing; only this version is read.
    static let formatVersion: UInt8 = 2

    public func encoded() -> [UInt8] {
        var w = ByteWriter(capacity: 160)
        w.raw(Self.tag)
        w.u8(Self.formatVersion)
        w.u32(mode.value)
        mode.stamp.encode(into: &w)
        w.u32(uid.value)
        uid.stamp.encode(into: &w)
        w.u32(gid.value)
        gid.stamp.encode(into: &w)
        Self.encode(mtime, into: &w)
        Self.encode(atime, into: &w)
        w.i64(ctime.seconds)
        w.i64(ctime.nanoseconds)
        w.u64(size)
        w.optionalData(symlinkTarget.map { Array($0.utf8) })
        let keys = xattrs.keys.sorted { Array($0.utf8).lexicographicallyPrecedes(Array($1.utf8)) }
        w.u32(UInt32(keys.count))
        for k in keys {
            guard let v = xattrs[k] else { continue }
            w.string(k)
            w.optionalData(v.value)
            v.stamp.encode(into: &w)
        }
        return w.bytes
    }

    private static func encode(_ t: Stamped<Timespec>, into w: inout ByteWriter) {
        w.i64(t.value.seconds)
        w.i64(t.value.nanoseconds)
        t.stamp.encode(into: &w)
    }

    private static func decodeStampedTime(from r: inout ByteReader) throws -> Stamped<Timespec> {
        let t = Timespec(seconds: try r.i64(), nanoseconds: try r.i64())
        return Stamped(t, at: try .decode(from: &r))
    }

    public init(decoding bytes: [UInt8]) throws {
        var r = ByteReader(bytes)
        guard try r.raw(4) == Self.tag else { throw DecodingError("not an attribute record") }
        let v = try r.u8()
        guard v == Self.formatVersion else { throw DecodingError("unsupported attribute version \(v)") }
        mode = Stamped(try r.u32(), at: try .decode(from: &r))
        uid = Stamped(try r.u32(), at: try .decode(from: &r))
        gid = Stamped(try r.u32(), at: try .decode(from: &r))
        mtime = try Self.decodeStampedTime(from: &r)
        atime = try Self.decodeStampedTime(from: &r)
        ctime = Timespec(seconds: try r.i64(), nanoseconds: try r.i64())
        size = try r.u64()
        if let t = try r.optionalData(max: 4096) {
            guard let s = String(validating: t, as: UTF8.self) else {
                throw DecodingError("symlink target is not UTF-8")
            }
            symlinkTarget = s
        } else {
            symlinkTarget = nil
        }
        let n = try r.u32()
        guard n <= 10_000 else { throw DecodingError("too many xattrs") }
        xattrs = [:]
        // Writers emit each name once, in byte order; anything else (a repeat, names out of order,
        // or two spellings of one name that Swift's String equality makes one key) would be a
        // second encoding of a value, where one record must have one encoding.
        var previous: [UInt8] = []
        for i in 0..<n {
            let k = try r.string(max: 255)
            let name = Array(k.utf8)
            guard i == 0 || previous.lexicographicallyPrecedes(name) else {
                throw DecodingError("xattr names out of order")
            }
            previous = name
            let value = try r.optionalData(max: 64 * 1024)
            guard xattrs.updateValue(Stamped(value, at: try .decode(from: &r)), forKey: k) == nil else {
                throw DecodingError("xattr name repeated")
            }
        }
        try r.expectEnd()
    }
}
