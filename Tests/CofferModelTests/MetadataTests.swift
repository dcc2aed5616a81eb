import Testing

@testable import CofferModel

@Suite("File metadata encoding")
struct MetadataTests {
    static func fixedRecord() throws -> FileMetadata {
        FileMetadata(
            id: try FileID(bytes: Array(0x00...0x0F)), type: .document, parent: try FileID(bytes: Array(0x10...0x1F)),
            name: SealedName(ciphertext: [0xCA, 0xFE], mac: [0xBE, 0xEF, 0x01]),
            owner: try AccountID(bytes: [UInt8](repeating: 0xAA, count: 32)), isDeleted: false,
            wrappedKey: [1, 2, 3, 4],
            access: [
                AccessEntry(
                    account: try AccountID(bytes: [UInt8](repeating: 0xBB, count: 32)), mode: .write, sealedKey: [9],
                    isDeleted: true)
            ],
            sealedAttributes: [], contentDigest: [0xDD, 0xEE],
            lastModifiedBy: try AccountID(bytes: [UInt8](repeating: 0xCC, count: 32)))
    }

    /// The signed byte format of a metadata record. Written out field by field from the format
    /// description; if this changes, every stored signature breaks.
    static let fixedHex =
        "43464d44" + "01"  // "CFMD", version 1
        + "000102030405060708090a0b0c0d0e0f"  // id
        + "02"  // type: document
        + "101112131415161718191a1b1c1d1e1f"  // parent
        + "00000002" + "cafe"  // name ciphertext
        + "00000003" + "beef01"  // name MAC
        + String(repeating: "aa", count: 32)  // owner
        + "00"  // not deleted
        + "00000004" + "01020304"  // wrapped key
        + "00000001"  // one access entry
        + String(repeating: "bb", count: 32) + "02" + "00000001" + "09" + "01"
        + "00000000"  // sealed attributes (empty)
        + "01" + "00000002" + "ddee"  // content digest
        + String(repeating: "cc", count: 32)  // last modified by

    @Test func fixedByteVector() throws {
        let m = try Self.fixedRecord()
        #expect(hex(m.encoded()) == Self.fixedHex)
        #expect(try FileMetadata(decoding: unhex(Self.fixedHex)) == m)
    }

    /// Version 2: the same record with its grant signed and a link target. Each access entry
    /// gains its signature after the deleted flag; the link target (optional) comes last.
    static let fixedHexV2 =
        "43464d44" + "02"  // "CFMD", version 2
        + "000102030405060708090a0b0c0d0e0f"  // id
        + "04"  // type: link
        + "101112131415161718191a1b1c1d1e1f"  // parent
        + "00000002" + "cafe"  // name ciphertext
        + "00000003" + "beef01"  // name MAC
        + String(repeating: "aa", count: 32)  // owner
        + "00"  // not deleted
        + "00000004" + "01020304"  // wrapped key
        + "00000001"  // one access entry
        + String(repeating: "bb", count: 32) + "02" + "00000001" + "09" + "01"
        + "00000040" + String(repeating: "5a", count: 64)  // the grant's signature
        + "00000000"  // sealed attributes (empty)
        + "00"  // no content digest
        + String(repeating: "cc", count: 32)  // last modified by
        + "01" + "00000010" + "202122232425262728292a2b2c2d2e2f"  // link target

    @Test func versionTwoCarriesGrantSignaturesAndLinkTargets() throws {
        var m = try Self.fixedRecord()
        m.type = .link
        m.contentDigest = nil
        m.access[0].signature = [UInt8](repeating: 0x5A, count: 64)
        m.linkTarget = try FileID(bytes: Array(0x20...0x2F))
        #expect(hex(m.encoded()) == Self.fixedHexV2)
        #expect(try FileMetadata(decoding: unhex(Self.fixedHexV2)) == m)
        // A record that needs neither is written as version 1, byte for byte as before...
        m.access[0].signature = []
        m.linkTarget = nil
        m.type = .document
        m.contentDigest = [0xDD, 0xEE]
        #expect(hex(m.encoded()) == Self.fixedHex)
        // ...and the same record dressed as version 2 is not its canonical form.
        var w = ByteWriter()
        w.raw(Array(unhex(Self.fixedHex)[0..<4]))
        w.u8(2)
        let body = Array(unhex(Self.fixedHex)[5...])
        let entryEnd = 5 + 16 + 1 + 16 + 6 + 7 + 32 + 1 + 8 + 4 + 32 + 1 + 5 + 1 - 5
        w.raw(Array(body[0..<entryEnd]))
        w.data([])  // an empty signature
        w.raw(Array(body[entryEnd...]))
        w.optionalData(nil)
        #expect(throws: DecodingError("metadata version 2 is not this record's canonical form")) {
            try FileMetadata(decoding: w.bytes)
        }
    }

    /// The fixed record as a link with a signed grant and a share name: every field of
    /// version 3.
    static func namedLink() throws -> FileMetadata {
        var m = try fixedRecord()
        m.type = .link
        m.contentDigest = nil
        m.access[0].signature = [UInt8](repeating: 0x5A, count: 64)
        m.linkTarget = try FileID(bytes: Array(0x20...0x2F))
        m.shareName = [0x51, 0x52, 0x53]
        return m
    }

    /// Version 3 is version 2 with the share name after the link target; written only with one.
    @Test func versionThreeCarriesTheShareName() throws {
        var m = try Self.namedLink()
        let v3 = "43464d4403" + String(Self.fixedHexV2.dropFirst(10)) + "01" + "00000003" + "515253"
        #expect(hex(m.encoded()) == v3)
        #expect(try FileMetadata(decoding: unhex(v3)) == m)
        // A share name alone makes a version 3 record; without one, version 3 is not canonical.
        m.access[0].signature = []
        m.linkTarget = nil
        #expect(m.encoded()[4] == 3)
        #expect(try FileMetadata(decoding: m.encoded()) == m)
        let noName = Array(unhex("43464d4403" + String(Self.fixedHexV2.dropFirst(10)) + "00"))
        #expect(throws: DecodingError("metadata version 3 is not this record's canonical form")) {
            try FileMetadata(decoding: noName)
        }
        #expect(throws: DecodingError.self) { try FileMetadata(decoding: Array(unhex(v3).dropLast())) }
    }

    /// Version 4 is version 3 with the key generation (u32) at the end; written only when it is
    /// not 0, so every record whose key was never replaced keeps its encoding and signature.
    @Test func versionFourCarriesTheKeyGeneration() throws {
        var m = try Self.namedLink()
        m.keyGeneration = 0x0102_0304
        let v4 = "43464d4404" + String(Self.fixedHexV2.dropFirst(10)) + "01" + "00000003" + "515253" + "01020304"
        #expect(hex(m.encoded()) == v4)
        #expect(try FileMetadata(decoding: unhex(v4)) == m)
        // A generation alone makes a version 4 record (no share name: the optional is absent).
        m.shareName = nil
        #expect(m.encoded()[4] == 4)
        #expect(try FileMetadata(decoding: m.encoded()) == m)
        // Generation 0 in a version 4 record is not canonical; a record cut short is refused.
        m.keyGeneration = 0
        let zero = Array(unhex("43464d4404" + hex(Array(m.encoded().dropFirst(5))) + "00" + "00000000"))
        #expect(throws: DecodingError("metadata version 4 is not this record's canonical form")) {
            try FileMetadata(decoding: zero)
        }
        #expect(throws: DecodingError.self) { try FileMetadata(decoding: Array(unhex(v4).dropLast())) }
    }

    @Test func roundTripVariants() throws {
        var records = sampleTree().files.values.map { $0 }
        var m = try Self.fixedRecord()
        m.contentDigest = nil
        m.isDeleted = true
        m.access = []
        m.type = .folder
        records.append(m)
        m.type = .symlink
        m.sealedAttributes = Array(repeating: 0x5A, count: 5000)
        records.append(m)
        m.type = .link
        m.access = [
            AccessEntry(account: owner, mode: .owner, sealedKey: Array(repeating: 1, count: 97)),
            AccessEntry(account: owner, mode: .read, sealedKey: []),
        ]
        records.append(m)
        for r in records {
            let bytes = r.encoded()
            #expect(try FileMetadata(decoding: bytes) == r)
            #expect(r.encoded() == bytes, "deterministic")
        }
    }

    @Test func encodingDistinguishesEveryField() throws {
        let m = try Self.fixedRecord()
        var variants: [FileMetadata] = []
        var v = m
        v.id = fid(99)
        variants.append(v)
        v = m
        v.type = .folder
        variants.append(v)
        v = m
        v.parent = fid(98)
        variants.append(v)
        v = m
        v.name.ciphertext = [0xCA]
        variants.append(v)
        v = m
        v.name.mac = [0xBE]
        variants.append(v)
        v = m
        v.owner = owner
        variants.append(v)
        v = m
        v.isDeleted = true
        variants.append(v)
        v = m
        v.wrappedKey = [1, 2, 3]
        variants.append(v)
        v = m
        v.access = []
        variants.append(v)
        v = m
        v.access[0].mode = .read
        variants.append(v)
        v = m
        v.access[0].isDeleted = false
        variants.append(v)
        v = m
        v.sealedAttributes = [0]
        variants.append(v)
        v = m
        v.contentDigest = nil
        variants.append(v)
        v = m
        v.contentDigest = []
        variants.append(v)
        v = m
        v.lastModifiedBy = owner
        variants.append(v)
        let encodings = Set(([m] + variants).map { $0.encoded() })
        #expect(encodings.count == variants.count + 1)
    }

    @Test func everyTruncationIsRefused() throws {
        let bytes = try Self.fixedRecord().encoded()
        for n in 0..<bytes.count {
            #expect(throws: DecodingError.self, "prefix \(n)") { try FileMetadata(decoding: Array(bytes.prefix(n))) }
        }
        #expect(throws: DecodingError.self) { try FileMetadata(decoding: bytes + [0]) }
    }

    @Test func malformedRecordsAreRefused() throws {
        let good = unhex(Self.fixedHex)
        var b = good
        b[0] = 0x58
        #expect(throws: DecodingError("not a metadata record")) { try FileMetadata(decoding: b) }
        b = good
        b[4] = 6
        #expect(throws: DecodingError("unsupported metadata version 6")) { try FileMetadata(decoding: b) }
        b = good
        b[21] = 9  // type byte
        #expect(throws: DecodingError("unknown file type")) { try FileMetadata(decoding: b) }
        b = good
        b[21] = 0
        #expect(throws: DecodingError.self) { try FileMetadata(decoding: b) }
        // Deleted flag must be 0 or 1.
        let deletedOffset = 5 + 16 + 1 + 16 + 6 + 7 + 32
        #expect(good[deletedOffset] == 0)
        b = good
        b[deletedOffset] = 2
        #expect(throws: DecodingError("invalid boolean 2")) { try FileMetadata(decoding: b) }
        // Unknown access mode.
        let modeOffset = deletedOffset + 1 + 8 + 4 + 32
        #expect(good[modeOffset] == 2)
        b = good
        b[modeOffset] = 7
        #expect(throws: DecodingError("unknown access mode")) { try FileMetadata(decoding: b) }
    }

    @Test func oversizedFieldsAreRefused() throws {
        var m = try Self.fixedRecord()
        m.wrappedKey = Array(repeating: 1, count: 257)
        #expect(throws: DecodingError.self) { try FileMetadata(decoding: m.encoded()) }
        m = try Self.fixedRecord()
        m.name.mac = Array(repeating: 1, count: 65)
        #expect(throws: DecodingError.self) { try FileMetadata(decoding: m.encoded()) }
        m = try Self.fixedRecord()
        m.contentDigest = Array(repeating: 1, count: 65)
        #expect(throws: DecodingError.self) { try FileMetadata(decoding: m.encoded()) }
    }

    @Test func signedMetadataRoundTrip() throws {
        let m = try Self.fixedRecord()
        let s = SignedMetadata(
            metadata: m, revision: 0x0102_0304_0506_0708, signature: Array(repeating: 0x51, count: 64))
        let bytes = s.encoded()
        #expect(
            hex(bytes) == String(format8(Self.fixedHex.count / 2)) + Self.fixedHex + "0102030405060708" + "00000040"
                + String(repeating: "51", count: 64))
        let back = try SignedMetadata(decoding: bytes)
        #expect(back == s)
        #expect(back.id == m.id)
        #expect(throws: DecodingError.self) { try SignedMetadata(decoding: bytes + [1]) }
        #expect(throws: DecodingError.self) { try SignedMetadata(decoding: Array(bytes.dropLast())) }
        var longSig = s
        longSig.signature = Array(repeating: 1, count: 129)
        #expect(throws: DecodingError.self) { try SignedMetadata(decoding: longSig.encoded()) }
    }

    /// The signature covers the revision: a record cannot be served again under another one.
    @Test func signedMessageBindsTheRevision() throws {
        let m = try Self.fixedRecord()
        let message = SignedMetadata.message(metadata: m, revision: 7)
        #expect(hex(message) == hexString(Array("CFSR".utf8)) + "0000000000000007" + Self.fixedHex)
        #expect(SignedMetadata(metadata: m, revision: 7, signature: []).message == message)
        #expect(SignedMetadata.message(metadata: m, revision: 8) != message)
    }

    @Test func revisionsGoUpAndSaturate() {
        #expect(SignedMetadata.revision(after: nil, now: 0) == 1)
        #expect(SignedMetadata.revision(after: 5, now: 3) == 6)
        #expect(SignedMetadata.revision(after: 5, now: 1_000) == 1_000)
        // A hostile base at the top: no trap, and no revision above it exists, so a push of it is
        // refused as stale rather than wrapping to 0.
        #expect(SignedMetadata.revision(after: .max, now: 9) == .max)
    }

    @Test func isRootMeansOwnParent() {
        #expect(root.isRoot)
        #expect(!folder(2, parent: 1, "a").isRoot)
    }

    @Test func enumRawValuesAreFixed() {
        #expect(FileType.folder.rawValue == 1 && FileType.document.rawValue == 2)
        #expect(FileType.symlink.rawValue == 3 && FileType.link.rawValue == 4)
        #expect(AccessMode.read.rawValue == 1 && AccessMode.write.rawValue == 2 && AccessMode.owner.rawValue == 3)
    }
}

/// A u32 big-endian length as 8 hex digits.
func format8(_ n: Int) -> String {
    let h = hexString([UInt8((n >> 24) & 0xff), UInt8((n >> 16) & 0xff), UInt8((n >> 8) & 0xff), UInt8(n & 0xff)])
    return h
}
