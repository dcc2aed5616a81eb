import Testing

@testable import CofferCrypto

@Suite("AEAD")
struct AEADTests {
    @Test func roundTripVariousLengths() throws {
        let key = SymmetricKey.random()
        for n in [0, 1, 15, 16, 17, 64, 1000, 70_000] {
            let plain = randomBytes(n)
            let sealed = AEAD.seal(plain, key: key, purpose: .chunk, fileID: fileA, extra: [9, 9])
            #expect(sealed.count == n + AEAD.overhead)
            let opened = try AEAD.open(sealed, key: key, purpose: .chunk, fileID: fileA, extra: [9, 9], what: "t")
            #expect(opened == plain)
        }
    }

    @Test func sealingTwiceGivesDifferentCiphertexts() {
        let key = SymmetricKey.random()
        let a = AEAD.seal([1, 2, 3], key: key, purpose: .name, fileID: fileA)
        let b = AEAD.seal([1, 2, 3], key: key, purpose: .name, fileID: fileA)
        #expect(a != b, "a fresh random nonce per seal")
        #expect(Array(a.prefix(AEAD.nonceBytes)) != Array(b.prefix(AEAD.nonceBytes)))
    }

    @Test func ciphertextDoesNotContainPlaintext() {
        let plain = Array("a very recognisable plaintext marker".utf8)
        let sealed = AEAD.seal(plain, key: .random(), purpose: .chunk, fileID: fileA)
        #expect(!contains(sealed, plain))
    }

    @Test func everyFlippedByteIsDetected() throws {
        let key = SymmetricKey.random()
        let plain: [UInt8] = Array("hello".utf8)
        let sealed = AEAD.seal(plain, key: key, purpose: .name, fileID: fileA)
        #expect(sealed.count == 32 + 40)  // padded to the name bucket
        var checked = 0
        for v in flippedVariants(sealed) {
            #expect(throws: CryptoError.self, "flip \(v.mask) at byte \(v.position)") {
                try AEAD.open(v.bytes, key: key, purpose: .name, fileID: fileA, what: "name")
            }
            checked += 1
        }
        #expect(checked == sealed.count * 3)
        // The untouched ciphertext still opens.
        #expect(try AEAD.open(sealed, key: key, purpose: .name, fileID: fileA, what: "name") == plain)
    }

    @Test func truncatedOrExtendedCiphertextIsDetected() {
        let key = SymmetricKey.random()
        let sealed = AEAD.seal(Array("hello".utf8), key: key, purpose: .name, fileID: fileA)
        for n in 0..<sealed.count {
            #expect(throws: CryptoError.self) {
                try AEAD.open(Array(sealed.prefix(n)), key: key, purpose: .name, fileID: fileA, what: "x")
            }
        }
        #expect(throws: CryptoError.self) {
            try AEAD.open(sealed + [0], key: key, purpose: .name, fileID: fileA, what: "x")
        }
    }

    @Test func wrongKeyIsDetected() {
        let sealed = AEAD.seal([1, 2, 3], key: .random(), purpose: .chunk, fileID: fileA)
        #expect(throws: CryptoError.authenticationFailed("content")) {
            try AEAD.open(sealed, key: .random(), purpose: .chunk, fileID: fileA, what: "content")
        }
    }

    @Test(arguments: [SealPurpose.name, .keyWrap, .attributes, .manifest, .accountKey])
    func wrongPurposeIsDetected(other: SealPurpose) {
        let key = SymmetricKey.random()
        let sealed = AEAD.seal([1, 2, 3], key: key, purpose: .chunk, fileID: fileA)
        #expect(throws: CryptoError.self) { try AEAD.open(sealed, key: key, purpose: other, fileID: fileA, what: "x") }
    }

    @Test func wrongFileIDIsDetected() {
        let key = SymmetricKey.random()
        let sealed = AEAD.seal([1, 2, 3], key: key, purpose: .attributes, fileID: fileA)
        #expect(throws: CryptoError.self) {
            try AEAD.open(sealed, key: key, purpose: .attributes, fileID: fileB, what: "x")
        }
        #expect(throws: CryptoError.self) {
            try AEAD.open(sealed, key: key, purpose: .attributes, fileID: Array(fileA.prefix(15)), what: "x")
        }
        #expect(throws: CryptoError.self) {
            try AEAD.open(sealed, key: key, purpose: .attributes, fileID: [], what: "x")
        }
    }

    @Test func wrongExtraIsDetected() {
        let key = SymmetricKey.random()
        let sealed = AEAD.seal([1, 2, 3], key: key, purpose: .chunk, fileID: fileA, extra: [1, 2])
        #expect(throws: CryptoError.self) {
            try AEAD.open(sealed, key: key, purpose: .chunk, fileID: fileA, extra: [1, 3], what: "x")
        }
        #expect(throws: CryptoError.self) { try AEAD.open(sealed, key: key, purpose: .chunk, fileID: fileA, what: "x") }
    }

    /// The associated data layout is part of the on-disk and on-wire format: it changes only with
    /// a format version (2 for the padded purposes, names and attributes).
    @Test func associatedDataBytesAreFixed() {
        #expect(
            AEAD.associatedData(purpose: .name, fileID: [0xAA, 0xBB], extra: [0x01])
                == [0x43, 0x46, 0x02, 0x01, 0x02, 0xAA, 0xBB, 0x01])
        #expect(AEAD.associatedData(purpose: .attributes, fileID: [0xAA]) == [0x43, 0x46, 0x02, 0x03, 0x01, 0xAA])
        #expect(
            AEAD.associatedData(purpose: .chunk, fileID: fileA)
                == [0x43, 0x46, 0x01, 0x04, 0x10] + fileA)
        #expect(AEAD.associatedData(purpose: .accountKey, fileID: []) == [0x43, 0x46, 0x01, 0x06, 0x00])
        // The length prefix keeps (fileID, extra) splits apart.
        #expect(
            AEAD.associatedData(purpose: .chunk, fileID: [1, 2], extra: [3])
                != AEAD.associatedData(purpose: .chunk, fileID: [1], extra: [2, 3]))
    }

    @Test func purposeRawValuesAreFixed() {
        #expect(SealPurpose.name.rawValue == 1)
        #expect(SealPurpose.keyWrap.rawValue == 2)
        #expect(SealPurpose.attributes.rawValue == 3)
        #expect(SealPurpose.chunk.rawValue == 4)
        #expect(SealPurpose.manifest.rawValue == 5)
        #expect(SealPurpose.accountKey.rawValue == 6)
    }

    @Test func symmetricKeyLengthIsChecked() throws {
        #expect(throws: CryptoError.self) { try SymmetricKey(bytes: Array(repeating: 0, count: 31)) }
        #expect(throws: CryptoError.self) { try SymmetricKey(bytes: Array(repeating: 0, count: 33)) }
        let k = try SymmetricKey(bytes: Array(repeating: 7, count: 32))
        #expect(k.bytes == Array(repeating: 7, count: 32))
        #expect(SymmetricKey.random() != SymmetricKey.random())
        #expect(SymmetricKey.random().bytes.count == 32)
    }

    /// crypto_kdf (BLAKE2b with salt = subkey id, personal = context): fixed vectors, cross-checked
    /// against Python's hashlib.blake2b(key=, salt=le64(id)||0^8, person=ctx padded with '_'||0^8).
    @Test func derivedSubkeysAreFixed() {
        #expect(
            hex(key32to63.derive(subkeyID: 7, context: "test").bytes)
                == "38827b7b264b93a5661c7d412eb96438a70014cc070f7499d0a5ec17039ab1a4")
        #expect(
            hex(key32to63.derive(subkeyID: 1, context: "cfname").bytes)
                == "f2b926cb68efed82da101503d5b3c00c51ecb58ce72c044cf7fff2a61e8d2834")
        #expect(
            hex(key32to63.derive(subkeyID: 2, context: "cfchunk").bytes)
                == "47688b68977b74532ec0333ea506214ab4942dae7bea3a1e31afbbde7820b4cd")
        #expect(
            hex(key32to63.derive(subkeyID: 3, context: "cfchunk").bytes)
                == "4c996bd72299d886acfe4ae6c5d573808d59546256f87ef59c5dad81db684e6a")
        let seedKey = try! SymmetricKey(bytes: seed0to31)
        #expect(
            hex(seedKey.derive(subkeyID: 1, context: "cfsign").bytes)
                == "243f38cfe8adf10415fbbbafe167da265e0e39a49f788b392684f6bb66ed8232")
        #expect(
            hex(seedKey.derive(subkeyID: 2, context: "cfbox").bytes)
                == "b954ab8b69346e6cf1719a09feffd8a436d201ab4dccd4ab7518ac7b5bd7aaef")
    }

    @Test func derivedSubkeysAreSeparated() {
        let k = SymmetricKey.random()
        let a = k.derive(subkeyID: 1, context: "ctx")
        #expect(a == k.derive(subkeyID: 1, context: "ctx"), "deterministic")
        #expect(a != k.derive(subkeyID: 2, context: "ctx"))
        #expect(a != k.derive(subkeyID: 1, context: "ctx2"))
        #expect(a != SymmetricKey.random().derive(subkeyID: 1, context: "ctx"))
        #expect(a != k)
        // Contexts are padded with '_' to 8 bytes and cut at 8.
        #expect(k.derive(subkeyID: 1, context: "ab") == k.derive(subkeyID: 1, context: "ab______"))
        #expect(k.derive(subkeyID: 1, context: "abcdefgh") == k.derive(subkeyID: 1, context: "abcdefghXYZ"))
    }
}

func contains(_ haystack: [UInt8], _ needle: [UInt8]) -> Bool {
    guard !needle.isEmpty, haystack.count >= needle.count else { return needle.isEmpty }
    for i in 0...(haystack.count - needle.count) where haystack[i] == needle[0] {
        if Array(haystack[i..<(i + needle.count)]) == needle { return true }
    }
    return false
}

/// Names and attributes are padded before sealing, so their sealed size tells the server only a
/// bucket, not the length.
@Suite struct PaddingTests {
    let key = SymmetricKey.random()
    let id = randomBytes(16)

    @Test func namesOfSimilarLengthSealToOneSize() throws {
        let sizes = Set(
            (1...31).map { AEAD.seal(Array(repeating: 0x61, count: $0), key: key, purpose: .name, fileID: id).count })
        #expect(sizes == [32 + AEAD.overhead])
        #expect(
            AEAD.seal(Array(repeating: 0x61, count: 32), key: key, purpose: .name, fileID: id).count == 64
                + AEAD.overhead)
        #expect(
            AEAD.seal(Array(repeating: 0x61, count: 255), key: key, purpose: .name, fileID: id).count == 256
                + AEAD.overhead)
        // Content is not padded (its sizes are the file's, and chunks are already fixed-size).
        #expect(AEAD.seal([1, 2, 3], key: key, purpose: .chunk, fileID: id).count == 3 + AEAD.overhead)
    }

    @Test func paddedValuesRoundTripWhateverTheyEndWith() throws {
        for value: [UInt8] in [
            [], [0], [0x80], [0x80, 0], [1, 0, 0, 0x80], Array(repeating: 0, count: 31),
            Array(repeating: 0x80, count: 64),
        ] {
            for purpose: SealPurpose in [.name, .attributes] {
                let sealed = AEAD.seal(value, key: key, purpose: purpose, fileID: id)
                #expect(try AEAD.open(sealed, key: key, purpose: purpose, fileID: id, what: "v") == value)
            }
        }
    }

    @Test func attributeBucketsGrowWithTheValue() {
        #expect(Padding.paddedLength(0, purpose: .attributes) == 64)
        #expect(Padding.paddedLength(63, purpose: .attributes) == 64)
        #expect(Padding.paddedLength(64, purpose: .attributes) == 128)
        for n in [100, 1_000, 5_000, 70_000, 500_000] {
            let p = Padding.paddedLength(n, purpose: .attributes)
            #expect(p > n && p <= n + n / 8 + 64, "\(n) -> \(p)")
        }
        // Near the record limit the padding stops at the ceiling.
        #expect(Padding.paddedLength(1_040_000, purpose: .attributes) == (1 << 20) - AEAD.overhead)
    }

    /// A key holder's value without valid padding (sealed unpadded under the padded format) is
    /// refused, not truncated at a guess.
    @Test func malformedPaddingIsRefused() {
        let ad = AEAD.associatedData(purpose: .name, fileID: id)
        #expect(ad[2] == 2)
        let unpadded = [UInt8]("abc".utf8).withUnsafeBytes {
            AEAD.sealExactly($0, key: key, purpose: .name, fileID: id, extra: [])
        }
        #expect(throws: CryptoError.self) {
            try AEAD.open(unpadded, key: key, purpose: .name, fileID: id, what: "name")
        }
    }
}
