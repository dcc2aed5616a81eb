import CofferModel

/// One chunk of a document: its keyed id and plaintext length.
public struct ChunkRef: Hashable, Sendable {
    public var id: [UInt8]
    public var length: UInt32
    public init(id: [UInt8], length: UInt32) {
        self.id = id
        self.length = length
    }
}

/// A document version: the ordered chunk list. Every chunk but the last holds exactly
/// `chunkSize` bytes, so an offset maps to a chunk by division and a write touches only the
/// chunks under it.
public struct Manifest: Hashable, Sendable {
    public static let defaultChunkSize: UInt32 = 256 * 1024
    public var chunkSize: UInt32
    public var chunks: [ChunkRef]

    public init(chunkSize: UInt32 = Manifest.defaultChunkSize, chunks: [ChunkRef] = []) {
        self.chunkSize = chunkSize
        self.chunks = chunks
    }

    public var size: UInt64 { chunks.reduce(0) { $0 + UInt64($1.length) } }

    static let tag: [UInt8] = Array("CFMF".utf8)

    public func encoded() -> [UInt8] {
        var w = ByteWriter(capacity: 16 + chunks.count * 40)
        w.raw(Self.tag)
        w.u8(1)
        w.u32(chunkSize)
        w.u32(UInt32(chunks.count))
        for c in chunks {
            w.raw(c.id)
            w.u32(c.length)
        }
        return w.bytes
    }

    public init(decoding bytes: [UInt8]) throws {
        var r = ByteReader(bytes)
        guard try r.raw(4) == Self.tag else { throw ContentError.corrupt("not a manifest") }
        guard try r.u8() == 1 else { throw ContentError.corrupt("unsupported manifest version") }
        chunkSize = try r.u32()
        guard chunkSize > 0, chunkSize <= 64 << 20 else { throw ContentError.corrupt("bad chunk size") }
        let n = try r.u32()
        guard n <= 1 << 24 else { throw ContentError.corrupt("too many chunks") }
        // Each chunk takes 36 bytes. Checked before reserving room for `n`, which a 13-byte
        // record could otherwise make a 256 MiB allocation.
        guard UInt64(n) * 36 <= UInt64(bytes.count - r.offset) else {
            throw ContentError.corrupt("chunk count exceeds the record")
        }
        chunks = []
        chunks.reserveCapacity(Int(n))
        for i in 0..<n {
            let c = ChunkRef(id: try r.raw(32), length: try r.u32())
            if i + 1 < n, c.length != chunkSize { throw ContentError.corrupt("short chunk before the end") }
            if c.length > chunkSize { throw ContentError.corrupt("chunk longer than chunk size") }
            chunks.append(c)
        }
        try r.expectEnd()
    }
}
