import CofferModel
import Foundation

/// `POST /v1/content`: many sealed chunks and manifests in one request (docs/PROTOCOL.md,
/// "Content in bundles"), so pushing a tree costs requests in proportion to its bytes, not its
/// files. The server stores the whole bundle at once or nothing of it: its chunks, then its
/// manifests, each of which must list only chunks stored (in this bundle or before).
///
/// ```
/// "CBU1"  count u32  item*
/// item:   1  id[32]  length u32  sealed chunk bytes
///       | 2  fileID[16]  digest[32]  length u32  sealed manifest  n u32  chunk id[32] × n
/// ```
public struct ContentBundle: Sendable, Equatable {
    public struct Chunk: Sendable, Equatable {
        public var id: [UInt8]
        public var sealed: [UInt8]
        public init(id: [UInt8], sealed: [UInt8]) {
            self.id = id
            self.sealed = sealed
        }
        /// Bytes this item takes in an encoded bundle: tag, id, length, bytes.
        public var encodedSize: Int { 37 + sealed.count }
    }

    public struct Manifest: Sendable, Equatable {
        public var fileID: [UInt8]
        public var digest: [UInt8]
        public var sealed: [UInt8]
        public var chunkIDs: [[UInt8]]
        public init(fileID: [UInt8], digest: [UInt8], sealed: [UInt8], chunkIDs: [[UInt8]]) {
            self.fileID = fileID
            self.digest = digest
            self.sealed = sealed
            self.chunkIDs = chunkIDs
        }
        /// Bytes this item takes in an encoded bundle: tag, file id, digest, length, bytes,
        /// count, chunk ids.
        public var encodedSize: Int { 57 + sealed.count + 32 * chunkIDs.count }
    }

    public var chunks: [Chunk] = []
    public var manifests: [Manifest] = []

    public init(chunks: [Chunk] = [], manifests: [Manifest] = []) {
        self.chunks = chunks
        self.manifests = manifests
    }

    static let magic: [UInt8] = Array("CBU1".utf8)
    /// Most items one bundle carries (its bytes are bounded by the request body limit).
    public static let maxItems = 20_000
    /// Most chunk ids one manifest in a bundle lists (a 32 MiB bundle holds fewer anyway).
    public static let maxManifestChunks = 1 << 20

    /// Bytes the encoded bundle's head takes (magic and count).
    public static let headerSize = 8

    /// Bytes the encoded bundle takes (what a client fills a request with): computed by walking
    /// it, so a client filling one keeps its own running sum of the items' sizes.
    public var encodedSize: Int {
        Self.headerSize + chunks.reduce(0) { $0 + $1.encodedSize } + manifests.reduce(0) { $0 + $1.encodedSize }
    }

    public var isEmpty: Bool { chunks.isEmpty && manifests.isEmpty }

    public func encoded() -> [UInt8] {
        var w = ByteWriter(capacity: encodedSize)
        w.raw(Self.magic)
        w.u32(UInt32(chunks.count + manifests.count))
        for c in chunks {
            w.u8(1)
            w.raw(c.id)
            w.data(c.sealed)
        }
        for m in manifests {
            w.u8(2)
            w.raw(m.fileID)
            w.raw(m.digest)
            w.data(m.sealed)
            w.u32(UInt32(m.chunkIDs.count))
            for id in m.chunkIDs { w.raw(id) }
        }
        return w.bytes
    }

    /// Decodes a bundle from a client: nil for anything malformed (a bad tag, a length past the
    /// end, too many items, trailing bytes).
    public init?(decoding bytes: [UInt8]) {
        var r = ByteReader(bytes)
        do {
            guard try r.raw(4) == Self.magic else { return nil }
            let count = Int(try r.u32())
            guard count <= Self.maxItems else { return nil }
            for _ in 0..<count {
                switch try r.u8() {
                case 1:
                    let id = try r.raw(32)
                    chunks.append(Chunk(id: id, sealed: try r.data(max: bytes.count)))
                case 2:
                    let fileID = try r.raw(16)
                    let digest = try r.raw(32)
                    let sealed = try r.data(max: bytes.count)
                    let n = Int(try r.u32())
                    // Each id takes 32 bytes of what is left: a count past that is a lie.
                    guard n <= Self.maxManifestChunks, n <= (bytes.count - r.offset) / 32 else { return nil }
                    var ids: [[UInt8]] = []
                    ids.reserveCapacity(n)
                    for _ in 0..<n { ids.append(try r.raw(32)) }
                    manifests.append(Manifest(fileID: fileID, digest: digest, sealed: sealed, chunkIDs: ids))
                default:
                    return nil
                }
            }
            try r.expectEnd()
        } catch {
            return nil
        }
    }
}

/// `POST /v1/manifests/many`: the sealed manifests of many documents in one request.
public struct ManyManifestsRequest: Codable, Sendable {
    public var items: [GetManifestRequest]
    public init(items: [GetManifestRequest]) { self.items = items }
    /// Most manifests one request asks for.
    public static let maxItems = 10_000
}

/// The answer to `POST /v1/manifests/many`, in the order asked: each manifest's file id, digest
/// and sealed bytes, or no bytes for one the server does not hold (or the caller cannot read).
///
/// ```
/// "CBM1"  count u32  (fileID[16]  digest len u8  digest  found u8  [length u32  sealed])*
/// ```
public enum ManifestBundle {
    public struct Entry: Sendable, Equatable {
        public var fileID: [UInt8]
        public var digest: [UInt8]
        public var sealed: [UInt8]?
        public init(fileID: [UInt8], digest: [UInt8], sealed: [UInt8]?) {
            self.fileID = fileID
            self.digest = digest
            self.sealed = sealed
        }
    }

    static let magic: [UInt8] = Array("CBM1".utf8)

    public static func encode(_ entries: [Entry]) -> [UInt8] {
        var w = ByteWriter(capacity: 8 + entries.reduce(0) { $0 + 60 + ($1.sealed?.count ?? 0) })
        w.raw(magic)
        w.u32(UInt32(entries.count))
        for e in entries {
            w.raw(e.fileID)
            w.u8(UInt8(clamping: e.digest.count))
            w.raw(Array(e.digest.prefix(255)))
            w.optionalData(e.sealed)
        }
        return w.bytes
    }

    /// Decodes a server's answer: nil for anything malformed.
    public static func decode(_ bytes: [UInt8]) -> [Entry]? {
        var r = ByteReader(bytes)
        do {
            guard try r.raw(4) == magic else { return nil }
            let count = Int(try r.u32())
            guard count <= ManyManifestsRequest.maxItems else { return nil }
            var out: [Entry] = []
            for _ in 0..<count {
                let fileID = try r.raw(16)
                let digest = try r.raw(Int(try r.u8()))
                out.append(Entry(fileID: fileID, digest: digest, sealed: try r.optionalData(max: bytes.count)))
            }
            try r.expectEnd()
            return out
        } catch {
            return nil
        }
    }
}
