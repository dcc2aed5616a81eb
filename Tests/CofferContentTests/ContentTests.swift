import CofferCrypto
import CofferModel
import Testing

@testable import CofferContent

let fileA = try! FileID(bytes: [UInt8](repeating: 0xA1, count: 16))
let fileB = try! FileID(bytes: [UInt8](repeating: 0xB2, count: 16))
let fixedKey = try! SymmetricKey(bytes: Array(32..<64))

/// Deterministic pseudo-random bytes (incompressible), so tests are reproducible.
func noise(_ count: Int, seed: UInt64 = 1) -> [UInt8] {
    var s = seed &* 0x9E37_79B9_7F4A_7C15 | 1
    var out = [UInt8](repeating: 0, count: count)
    for i in 0..<count {
        s ^= s << 13
        s ^= s >> 7
        s ^= s << 17
        out[i] = UInt8(truncatingIfNeeded: s >> 24)
    }
    return out
}

func containsBytes(_ haystack: [UInt8], _ needle: [UInt8]) -> Bool {
    guard haystack.count >= needle.count, !needle.isEmpty else { return false }
    for i in 0...(haystack.count - needle.count) where haystack[i] == needle[0] {
        if haystack[i..<(i + needle.count)].elementsEqual(needle) { return true }
    }
    return false
}

@Suite("Content chunks")
struct ChunkTests {
    let cipher = ContentCipher(fileID: fileA, key: .random())

    @Test func roundTrip() throws {
        for n in [0, 1, 100, 4096, 256 * 1024] {
            let plain = noise(n, seed: UInt64(n))
            let (ref, sealed) = cipher.sealChunk(plain)
            #expect(ref.length == UInt32(n))
            #expect(ref.id.count == 32)
            #expect(try cipher.openChunk(sealed, ref: ref) == plain)
        }
        let text = Array(String(repeating: "compressible text line\n", count: 5000).utf8)
        let (ref, sealed) = cipher.sealChunk(text)
        #expect(try cipher.openChunk(sealed, ref: ref) == text)
    }

    /// The read path's open: in the sealed buffer itself, a raw chunk's plaintext a slice of it
    /// (its indices are the buffer's, not zero-based), a compressed one decompressed; the same
    /// refusals as `openChunk`.
    @Test func openInPlaceMatchesOpen() throws {
        let text = Array(String(repeating: "compressible text line\n", count: 5000).utf8)
        for plain in [[], noise(1), noise(1000), noise(4096), noise(256 * 1024), text] {
            let (ref, sealed) = cipher.sealChunk(plain)
            let opened = try cipher.openChunkInPlace(sealed, ref: ref)
            #expect(opened.elementsEqual(plain), "length \(plain.count)")
            #expect(opened.count == plain.count)
            // A slice's pieces are read by offset from startIndex (`OpenDocument.piece`).
            if plain.count > 10 { #expect(opened[opened.startIndex + 10] == plain[10]) }
            var bad = sealed
            bad[bad.count / 2] ^= 0x20
            #expect(throws: (any Error).self, "length \(plain.count)") { try cipher.openChunkInPlace(bad, ref: ref) }
            #expect(throws: (any Error).self) {
                try ContentCipher(fileID: fileB, key: .random()).openChunkInPlace(sealed, ref: ref)
            }
            #expect(throws: (any Error).self) { try cipher.openChunkInPlace(Array(sealed.prefix(39)), ref: ref) }
        }
    }

    @Test func sealedChunkHidesItsPlaintext() {
        let marker = Array("PLAINTEXT-MARKER-7f3a".utf8)
        let (_, sealed) = cipher.sealChunk(marker + noise(100))
        #expect(!containsBytes(sealed, marker))
    }

    @Test func chunkIDIsStableAndKeyed() throws {
        let plain = Array("the same chunk".utf8)
        let (r1, s1) = cipher.sealChunk(plain)
        let (r2, s2) = cipher.sealChunk(plain)
        #expect(r1 == r2, "equal plaintext in one file: equal id (dedup)")
        #expect(s1 != s2, "but a fresh nonce")
        let other = ContentCipher(fileID: fileA, key: .random())
        #expect(other.sealChunk(plain).0.id != r1.id, "another file key gives another id")
        #expect(cipher.sealChunk(plain + [0]).0.id != r1.id)
        // The id is not a plain hash of the content.
        #expect(r1.id != blake2b(plain))
    }

    /// Fixed vector: HMAC-SHA-256(key = derive(fileKey, 3, "cfchunk"), plaintext), cross-checked
    /// with Python's hmac and hashlib (the key derivation as BLAKE2b with salt and personal).
    /// Changing it would stop new writes from deduplicating against stored chunks.
    @Test func chunkIDFixedVector() {
        let c = ContentCipher(fileID: fileA, key: fixedKey)
        let id = Array("hello".utf8).withUnsafeBytes { c.chunkID($0) }
        #expect(hexString(id) == "611e5e196d4d68e67d036c8b8a9279f8e0d89e369348a7cbf3f4280292429e25")
        // The file id does not enter the chunk id; only the key does.
        let d = ContentCipher(fileID: fileB, key: fixedKey)
        #expect(Array("hello".utf8).withUnsafeBytes { d.chunkID($0) } == id)
    }

    /// The id check (what sync and fsck run) accepts only the HMAC-SHA-256 id: a chunk named by
    /// any other id, such as the keyed BLAKE2b one of pre-release stores, is refused.
    @Test func onlyTheCurrentChunkIDVerifies() throws {
        for plain in [Array("hello".utf8), (0..<300_000).map { UInt8(truncatingIfNeeded: $0 &* 7) }] {
            let current = plain.withUnsafeBytes { cipher.chunkID($0) }
            let (ref, sealed) = plain.withUnsafeBytes { cipher.sealChunk($0, id: current) }
            #expect(try cipher.openChunk(sealed, ref: ref, verifyingID: true) == plain)
            let blake2bKey = cipher.key.derive(subkeyID: 2, context: "cfchunk").bytes
            var wrong = current
            wrong[0] ^= 1
            for other in [blake2b(plain, key: blake2bKey), wrong] {
                let (badRef, badSealed) = plain.withUnsafeBytes { cipher.sealChunk($0, id: other) }
                #expect(throws: ContentError.self) { try cipher.openChunk(badSealed, ref: badRef, verifyingID: true) }
                // Without the check (this device's own chunks) the AEAD alone decides.
                #expect(try cipher.openChunk(badSealed, ref: badRef, verifyingID: false) == plain)
            }
        }
    }

    @Test func everyTamperedByteIsDetected() {
        let plain = Array("short chunk".utf8)
        let (ref, sealed) = cipher.sealChunk(plain)
        for i in sealed.indices {
            var t = sealed
            t[i] ^= 0x01
            #expect(throws: (any Error).self, "byte \(i)") { try cipher.openChunk(t, ref: ref) }
        }
        #expect(throws: (any Error).self) { try cipher.openChunk(Array(sealed.dropLast()), ref: ref) }
    }

    @Test func chunkFromAnotherFileIsRefused() {
        let key = SymmetricKey.random()
        let a = ContentCipher(fileID: fileA, key: key)
        let b = ContentCipher(fileID: fileB, key: key)  // even with the same key
        let (ref, sealed) = a.sealChunk(Array("secret".utf8))
        #expect(throws: CryptoError.self) { try b.openChunk(sealed, ref: ref) }
        let c = ContentCipher(fileID: fileA, key: .random())
        #expect(throws: CryptoError.self) { try c.openChunk(sealed, ref: ref) }
    }

    @Test func chunkUnderAnotherIDOrLengthIsRefused() {
        let (r1, s1) = cipher.sealChunk(Array("one".utf8))
        let (r2, _) = cipher.sealChunk(Array("two".utf8))
        // Swapping positions in a manifest (another chunk's id) fails the AEAD.
        #expect(throws: CryptoError.self) { try cipher.openChunk(s1, ref: r2) }
        // A wrong length fails too.
        #expect(throws: ContentError.self) { try cipher.openChunk(s1, ref: ChunkRef(id: r1.id, length: 4)) }
    }

    @Test func contentSealedAsAnotherPurposeIsRefused() {
        let key = SymmetricKey.random()
        let c = ContentCipher(fileID: fileA, key: key)
        let plain = Array("x".utf8)
        let id = plain.withUnsafeBytes { c.chunkID($0) }
        let asName = AEAD.seal([0] + plain, key: key, purpose: .name, fileID: fileA.bytes, extra: id)
        #expect(throws: CryptoError.self) { try c.openChunk(asName, ref: ChunkRef(id: id, length: 1)) }
    }
}

@Suite("Compression")
struct CompressionTests {
    @Test func compressibleDataShrinks() throws {
        let text = Array(String(repeating: "all work and no play makes jack a dull boy. ", count: 6000).utf8)
        let packed = text.withUnsafeBytes { Compression.pack($0) }
        #expect(packed[0] == Compression.zstd)
        #expect(packed.count < text.count / 10)
        #expect(try Compression.unpack(packed, expectedLength: text.count) == text)
        // And the sealed chunk is correspondingly small.
        let (_, sealed) = ContentCipher(fileID: fileA, key: .random()).sealChunk(text)
        #expect(sealed.count < text.count / 10)
        let zeros = [UInt8](repeating: 0, count: 256 * 1024)
        let (_, sealedZeros) = ContentCipher(fileID: fileA, key: .random()).sealChunk(zeros)
        #expect(sealedZeros.count < 1024)
    }

    @Test func randomDataIsStoredRaw() throws {
        let data = noise(100_000)
        let packed = data.withUnsafeBytes { Compression.pack($0) }
        #expect(packed[0] == Compression.raw)
        #expect(packed.count == data.count + 1)
        #expect(Array(packed[1...]) == data)
        #expect(try Compression.unpack(packed, expectedLength: data.count) == data)
        let (_, sealed) = ContentCipher(fileID: fileA, key: .random()).sealChunk(data)
        #expect(sealed.count == data.count + 1 + AEAD.overhead)
        // An empty input packs to the flag byte alone.
        let empty = [UInt8]().withUnsafeBytes { Compression.pack($0) }
        #expect(empty == [Compression.raw])
        #expect(try Compression.unpack(empty, expectedLength: 0) == [])
    }

    @Test func largeChunksAreSampledFirst() throws {
        let chunk = 256 * 1024
        let text = Array(
            String(repeating: "all work and no play makes jack a dull boy. ", count: 6000).utf8.prefix(chunk))
        let random = noise(chunk)
        #expect(text.withUnsafeBytes { Compression.worthCompressing($0) })
        #expect(!random.withUnsafeBytes { Compression.worthCompressing($0) })
        // Below the sampling size everything is tried (small files are mostly text).
        let smallRandom = noise(Compression.sampledFrom - 1)
        #expect(smallRandom.withUnsafeBytes { Compression.worthCompressing($0) })

        // One incompressible sample (a binary header) does not stop the rest from compressing.
        let headed = Array(random.prefix(Compression.sampleLength)) + Array(text.dropFirst(Compression.sampleLength))
        let packedHeaded = headed.withUnsafeBytes { Compression.pack($0) }
        #expect(packedHeaded[0] == Compression.zstd)
        #expect(packedHeaded.count < chunk / 4)
        let headedBack = try Compression.unpack(packedHeaded, expectedLength: chunk) == headed
        #expect(headedBack)

        // The price of sampling: compressible bytes only between the samples are stored raw,
        // and still come back intact.
        let n = Compression.sampleLength
        var hidden = [UInt8](repeating: 0, count: chunk)
        for (i, start) in [0, chunk / 2 - n / 2, chunk - n].enumerated() {
            hidden.replaceSubrange(start..<(start + n), with: random[(i * n)..<((i + 1) * n)])
        }
        let packedHidden = hidden.withUnsafeBytes { Compression.pack($0) }
        #expect(packedHidden[0] == Compression.raw)
        let hiddenBack = try Compression.unpack(packedHidden, expectedLength: chunk) == hidden
        #expect(hiddenBack)
    }

    @Test func emptyAndTinyInputs() throws {
        for n in [0, 1, 5] {
            let d = noise(n)
            let packed = d.withUnsafeBytes { Compression.pack($0) }
            #expect(packed.first == Compression.raw)
            #expect(try Compression.unpack(packed, expectedLength: n) == d)
        }
    }

    @Test func malformedPackedDataIsRefused() {
        #expect(throws: ContentError.corrupt("empty chunk")) { try Compression.unpack([], expectedLength: 0) }
        #expect(throws: ContentError.self) { try Compression.unpack([Compression.raw, 1, 2], expectedLength: 3) }
        #expect(throws: ContentError.self) { try Compression.unpack([7, 1, 2], expectedLength: 2) }
        #expect(throws: ContentError.self) {
            try Compression.unpack([Compression.zstd, 1, 2, 3, 4], expectedLength: 10)
        }
        let text = Array(String(repeating: "abc", count: 1000).utf8)
        let packed = text.withUnsafeBytes { Compression.pack($0) }
        #expect(throws: ContentError.self) { try Compression.unpack(packed, expectedLength: text.count - 1) }
        #expect(throws: ContentError.self) { try Compression.unpack(packed, expectedLength: text.count + 1) }
    }
}

@Suite("Manifests")
struct ManifestTests {
    static func sample() -> Manifest {
        Manifest(
            chunkSize: 4,
            chunks: [
                ChunkRef(id: Array(repeating: 1, count: 32), length: 4),
                ChunkRef(id: Array(repeating: 2, count: 32), length: 4),
                ChunkRef(id: Array(repeating: 3, count: 32), length: 1),
            ])
    }

    @Test func encodingIsFixed() throws {
        let m = Self.sample()
        let expected =
            "43464d46" + "01" + "00000004" + "00000003"
            + String(repeating: "01", count: 32) + "00000004"
            + String(repeating: "02", count: 32) + "00000004"
            + String(repeating: "03", count: 32) + "00000001"
        #expect(hexString(m.encoded()) == expected)
        #expect(try Manifest(decoding: bytesFromHex(expected)!) == m)
        #expect(m.size == 9)
        #expect(Manifest().size == 0)
        #expect(Manifest().chunkSize == 256 * 1024)
        #expect(try Manifest(decoding: Manifest().encoded()) == Manifest())
    }

    @Test func sealAndOpen() throws {
        let c = ContentCipher(fileID: fileA, key: .random())
        let m = Self.sample()
        let sealed = c.sealManifest(m)
        #expect(try c.openManifest(sealed) == m)
        #expect(ContentCipher.digest(ofSealedManifest: sealed) == blake2b(sealed))
        #expect(
            ContentCipher.digest(ofSealedManifest: sealed) != ContentCipher.digest(ofSealedManifest: c.sealManifest(m)))
        // Other file, other key, tampering: refused.
        #expect(throws: CryptoError.self) { try ContentCipher(fileID: fileB, key: c.key).openManifest(sealed) }
        #expect(throws: CryptoError.self) { try ContentCipher(fileID: fileA, key: .random()).openManifest(sealed) }
        for i in sealed.indices {
            var t = sealed
            t[i] ^= 0x80
            #expect(throws: CryptoError.self) { try c.openManifest(t) }
        }
        // A chunk is not a manifest.
        let (_, chunk) = c.sealChunk(m.encoded())
        #expect(throws: CryptoError.self) { try c.openManifest(chunk) }
    }

    @Test func malformedManifestsAreRefused() {
        let good = Self.sample().encoded()
        for n in 0..<good.count {
            #expect(throws: (any Error).self, "prefix \(n)") { try Manifest(decoding: Array(good.prefix(n))) }
        }
        #expect(throws: (any Error).self) { try Manifest(decoding: good + [0]) }
        var b = good
        b[0] = 0
        #expect(throws: ContentError.corrupt("not a manifest")) { try Manifest(decoding: b) }
        b = good
        b[4] = 2
        #expect(throws: ContentError.corrupt("unsupported manifest version")) { try Manifest(decoding: b) }
        // chunk size 0 and > 64 MiB
        b = good
        b[5...8] = [0, 0, 0, 0]
        #expect(throws: ContentError.corrupt("bad chunk size")) { try Manifest(decoding: b) }
        b = good
        b[5...8] = [0x04, 0, 0, 1]
        #expect(throws: ContentError.corrupt("bad chunk size")) { try Manifest(decoding: b) }
        // A short chunk before the end.
        var m = Self.sample()
        m.chunks[0].length = 3
        #expect(throws: ContentError.corrupt("short chunk before the end")) { try Manifest(decoding: m.encoded()) }
        // A last chunk longer than the chunk size.
        m = Self.sample()
        m.chunks[2].length = 5
        #expect(throws: ContentError.corrupt("chunk longer than chunk size")) { try Manifest(decoding: m.encoded()) }
        // An absurd chunk count.
        b = good
        b[9...12] = [0xFF, 0xFF, 0xFF, 0xFF]
        #expect(throws: ContentError.corrupt("too many chunks")) { try Manifest(decoding: b) }
        // A count larger than the bytes present.
        b = good
        b[9...12] = [0, 0, 0, 4]
        #expect(throws: (any Error).self) { try Manifest(decoding: b) }
        // 2^24 chunks claimed in 13 bytes: refused before room for them is reserved (it used
        // to reserve 256 MiB and then fail on the missing bytes).
        #expect(throws: ContentError.corrupt("chunk count exceeds the record")) {
            try Manifest(decoding: Array(good.prefix(9)) + [1, 0, 0, 0])
        }
        #expect(throws: ContentError.corrupt("chunk count exceeds the record")) { try Manifest(decoding: b) }
    }
}
