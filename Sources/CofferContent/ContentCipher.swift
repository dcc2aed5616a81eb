import CofferCrypto
import CofferModel

/// Seals and opens one document's chunks and manifests with that document's key.
///
/// Chunk ids are HMAC-SHA-256 of the plaintext keyed by a subkey of the file key: equal chunks
/// in one file share an id (zero-filled gaps cost one chunk), but ids reveal nothing to anyone
/// without the key. Each chunk's AEAD binds file id and chunk id, and the manifest binds the file
/// id, so neither can be moved to another file or position. HMAC-SHA-256 rather than keyed
/// BLAKE2b because hashing is most of a large write's CPU and SHA-256 runs on the CPU's SHA
/// extensions (see docs/CRYPTOGRAPHY.md).
public struct ContentCipher: Sendable {
    public let fileID: FileID
    package let key: SymmetricKey
    let idKey: SymmetricKey

    public init(fileID: FileID, key: SymmetricKey) {
        self.fileID = fileID
        self.key = key
        self.idKey = key.derive(subkeyID: 3, context: "cfchunk")
    }

    public func chunkID(_ plaintext: UnsafeRawBufferPointer) -> [UInt8] {
        hmacSHA256(plaintext, key: idKey.bytes)
    }

    /// Compresses, then seals. Returns the reference for the manifest and the sealed bytes.
    public func sealChunk(_ plaintext: UnsafeRawBufferPointer) -> (ChunkRef, [UInt8]) {
        sealChunk(plaintext, id: chunkID(plaintext))
    }

    /// Seals a chunk whose id the caller already computed with `chunkID`.
    public func sealChunk(_ plaintext: UnsafeRawBufferPointer, id: [UInt8]) -> (ChunkRef, [UInt8]) {
        let packed = Compression.pack(plaintext)
        let sealed = AEAD.seal(packed, key: key, purpose: .chunk, fileID: fileID.bytes, extra: id)
        return (ChunkRef(id: id, length: UInt32(plaintext.count)), sealed)
    }

    public func sealChunk(_ plaintext: [UInt8]) -> (ChunkRef, [UInt8]) {
        plaintext.withUnsafeBytes { sealChunk($0) }
    }

    public func sealChunk(_ plaintext: [UInt8], id: [UInt8]) -> (ChunkRef, [UInt8]) {
        plaintext.withUnsafeBytes { sealChunk($0, id: id) }
    }

    /// Opens and verifies a chunk: authenticity by the AEAD (which binds file id and chunk id),
    /// and, with `verifyingID`, identity by recomputing the id from the plaintext.
    ///
    /// Only a holder of the file key can produce a chunk that opens, so the id check guards
    /// against a key holder who lies about a chunk's content (what arrives by sync, and `fsck`),
    /// not against the server or the disk. Reads of chunks this device stored or already checked
    /// skip it: it is a full hash pass over every byte read.
    public func openChunk(_ sealed: [UInt8], ref: ChunkRef, verifyingID: Bool = true) throws -> [UInt8] {
        let packed = try AEAD.open(
            sealed, key: key, purpose: .chunk, fileID: fileID.bytes, extra: ref.id, what: "content chunk")
        let plain = try Compression.unpack(packed, expectedLength: Int(ref.length))
        guard verifyingID else { return plain }
        guard plain.withUnsafeBytes({ chunkID($0) }) == ref.id else {
            throw ContentError.corrupt("chunk id does not match its content")
        }
        return plain
    }

    /// `openChunk` for reading, without copies: decrypts in `sealed`'s own buffer and returns a
    /// raw chunk's plaintext as a slice of it (a compressed one is decompressed into a new
    /// buffer). The chunk id is not checked, as `openChunk(verifyingID: false)`: the AEAD binds
    /// the ciphertext to the id already. perf of a cold 256 MiB read had the copy out of the
    /// decrypted buffer at 6.5% of the daemon's samples.
    public func openChunkInPlace(_ sealed: consuming [UInt8], ref: ChunkRef) throws -> ArraySlice<UInt8> {
        var buffer = sealed
        let range = try AEAD.openInPlace(
            &buffer, key: key, purpose: .chunk, fileID: fileID.bytes, extra: ref.id, what: "content chunk")
        return try Compression.unpack(buffer[range], expectedLength: Int(ref.length))
    }

    public func sealManifest(_ m: Manifest) -> [UInt8] {
        AEAD.seal(m.encoded(), key: key, purpose: .manifest, fileID: fileID.bytes)
    }

    public func openManifest(_ sealed: [UInt8]) throws -> Manifest {
        try Manifest(
            decoding: AEAD.open(sealed, key: key, purpose: .manifest, fileID: fileID.bytes, what: "content manifest"))
    }

    /// The digest a metadata record names its content by: an unkeyed hash of ciphertext.
    public static func digest(ofSealedManifest sealed: [UInt8]) -> [UInt8] { blake2b(sealed) }
}
