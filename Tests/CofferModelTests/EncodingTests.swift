import Testing

@testable import CofferModel

@Suite("Deterministic encoding")
struct EncodingTests {
    @Test func writerProducesFixedBytes() {
        var w = ByteWriter()
        w.u8(0xAB)
        w.bool(true)
        w.bool(false)
        w.u32(0x0102_0304)
        w.u64(0x0102_0304_0506_0708)
        w.i64(-2)
        w.raw([0xFE, 0xED])
        w.data([0x11, 0x22])
        w.string("hé")
        w.optionalData(nil)
        w.optionalData([0x33])
        #expect(
            hex(w.bytes) == "ab" + "01" + "00" + "01020304" + "0102030405060708" + "fffffffffffffffe" + "feed"
                + "00000002" + "1122" + "00000003" + "68c3a9" + "00" + "01" + "00000001" + "33")
    }

    @Test func readerRoundTrip() throws {
        var w = ByteWriter()
        w.u8(200)
        w.bool(true)
        w.u32(.max)
        w.u64(.max)
        w.i64(.min)
        w.raw([1, 2, 3])
        w.data([])
        w.string("naïve/名前")
        w.optionalData(nil)
        w.optionalData([4, 5])
        var r = ByteReader(w.bytes)
        #expect(try r.u8() == 200)
        #expect(try r.bool() == true)
        #expect(try r.u32() == .max)
        #expect(try r.u64() == .max)
        #expect(try r.i64() == .min)
        #expect(try r.raw(3) == [1, 2, 3])
        #expect(try r.data() == [])
        #expect(try r.string() == "naïve/名前")
        #expect(try r.optionalData() == nil)
        #expect(try r.optionalData() == [4, 5])
        #expect(r.isAtEnd)
        try r.expectEnd()
    }

    @Test func everyTruncationIsAnError() throws {
        var w = ByteWriter()
        w.u8(1)
        w.bool(true)
        w.u32(7)
        w.u64(8)
        w.i64(-9)
        w.data([1, 2, 3])
        w.string("xyz")
        w.optionalData([4])
        let full = w.bytes
        func readAll(_ b: [UInt8]) throws {
            var r = ByteReader(b)
            _ = try r.u8()
            _ = try r.bool()
            _ = try r.u32()
            _ = try r.u64()
            _ = try r.i64()
            _ = try r.data()
            _ = try r.string()
            _ = try r.optionalData()
            try r.expectEnd()
        }
        try readAll(full)
        for n in 0..<full.count {
            #expect(throws: DecodingError.self, "prefix of \(n) bytes") { try readAll(Array(full.prefix(n))) }
        }
        #expect(throws: DecodingError.self) { try readAll(full + [0]) }
    }

    @Test func truncationMessageNamesTheOffset() {
        var r = ByteReader([1, 2])
        #expect(throws: DecodingError("truncated at byte 0")) { try r.u32() }
        _ = try? r.u8()
        #expect(throws: DecodingError("truncated at byte 1")) { try r.raw(2) }
    }

    @Test func malformedValuesAreRefused() {
        var r = ByteReader([2])
        #expect(throws: DecodingError("invalid boolean 2")) { try r.bool() }
        var big = ByteReader([0, 0, 0, 5, 1, 2, 3, 4, 5])
        #expect(throws: DecodingError.self) { try big.data(max: 4) }
        var utf = ByteReader([0, 0, 0, 2, 0xC3, 0x28])
        #expect(throws: DecodingError("invalid UTF-8")) { try utf.string() }
        // A huge length prefix must not allocate or crash, just fail.
        var huge = ByteReader([0xFF, 0xFF, 0xFF, 0xFF, 1])
        #expect(throws: DecodingError.self) { try huge.data() }
        var trailing = ByteReader([1, 2])
        _ = try? trailing.u8()
        #expect(throws: DecodingError("1 trailing bytes")) { try trailing.expectEnd() }
        var neg = ByteReader([1])
        #expect(throws: DecodingError.self) { try neg.raw(-1) }
    }

    @Test func hexHelpers() {
        #expect(hexString([0x00, 0x0F, 0xA0, 0xFF]) == "000fa0ff")
        #expect(bytesFromHex("000fa0ff") == [0x00, 0x0F, 0xA0, 0xFF])
        #expect(bytesFromHex("000FA0FF") == [0x00, 0x0F, 0xA0, 0xFF])
        #expect(bytesFromHex("") == [])
        #expect(bytesFromHex("abc") == nil)
        #expect(bytesFromHex("zz") == nil)
    }
}

@Suite("Identifiers")
struct IdentifierTests {
    @Test func fileIDLengthAndUUIDFormat() throws {
        #expect(throws: DecodingError.self) { try FileID(bytes: [1, 2, 3]) }
        let id = try FileID(bytes: Array(0..<16))
        #expect(id.description == "00010203-0405-0607-0809-0a0b0c0d0e0f")
        #expect(FileID(uuidString: "00010203-0405-0607-0809-0a0b0c0d0e0f") == id)
        #expect(FileID(uuidString: "000102030405060708090A0B0C0D0E0F") == id)
        #expect(FileID(uuidString: "0001") == nil)
        #expect(FileID(uuidString: "not a uuid") == nil)
    }

    @Test func randomFileIDIsUUIDv4() throws {
        let id = try FileID(random: [UInt8](repeating: 0xFF, count: 16))
        #expect(id.bytes[6] == 0x4F)
        #expect(id.bytes[8] == 0xBF)
        let z = try FileID(random: [UInt8](repeating: 0, count: 16))
        #expect(z.bytes[6] == 0x40 && z.bytes[8] == 0x80)
        #expect(throws: DecodingError.self) { try FileID(random: [0]) }
    }

    @Test func fileIDOrderIsLexicographic() {
        #expect(fid(1) < fid(2))
        #expect(fid(255) < fid(256))
        #expect(!(fid(3) < fid(3)))
    }

    @Test func accountIDLength() throws {
        #expect(throws: DecodingError.self) { try AccountID(bytes: [1]) }
        let a = try AccountID(bytes: Array(0..<32))
        #expect(a.description == "0001020304050607")
    }
}
