import Testing

@testable import CofferCrypto

@Suite("Key wrapping")
struct KeyWrapTests {
    @Test func roundTrip() throws {
        let parent = SymmetricKey.random()
        let child = SymmetricKey.random()
        let wrapped = KeyWrap.wrap(child, with: parent, fileID: fileA)
        #expect(wrapped.count == 32 + AEAD.overhead)
        #expect(!contains(wrapped, child.bytes))
        #expect(try KeyWrap.unwrap(wrapped, with: parent, fileID: fileA) == child)
    }

    @Test func everyFlippedByteIsDetected() {
        let parent = SymmetricKey.random()
        let child = SymmetricKey.random()
        let wrapped = KeyWrap.wrap(child, with: parent, fileID: fileA)
        for v in flippedVariants(wrapped) {
            #expect(throws: CryptoError.self, "byte \(v.position)") {
                try KeyWrap.unwrap(v.bytes, with: parent, fileID: fileA)
            }
        }
    }

    @Test func wrongParentKeyOrFileIsDetected() {
        let parent = SymmetricKey.random()
        let child = SymmetricKey.random()
        let wrapped = KeyWrap.wrap(child, with: parent, fileID: fileA)
        #expect(throws: CryptoError.self) { try KeyWrap.unwrap(wrapped, with: .random(), fileID: fileA) }
        #expect(throws: CryptoError.self) { try KeyWrap.unwrap(wrapped, with: parent, fileID: fileB) }
    }

    @Test func otherPurposesCannotBeUnwrapped() {
        let parent = SymmetricKey.random()
        let child = SymmetricKey.random()
        // The same bytes sealed as a name, chunk, or attribute record are not a wrapped key.
        for p in [SealPurpose.name, .attributes, .chunk, .manifest, .accountKey] {
            let sealed = AEAD.seal(child.bytes, key: parent, purpose: p, fileID: fileA)
            #expect(throws: CryptoError.self) { try KeyWrap.unwrap(sealed, with: parent, fileID: fileA) }
        }
        // And a wrapped key does not open as a name.
        let wrapped = KeyWrap.wrap(child, with: parent, fileID: fileA)
        #expect(throws: CryptoError.self) {
            try AEAD.open(wrapped, key: parent, purpose: .name, fileID: fileA, what: "n")
        }
    }

    @Test func wrappedPayloadOfWrongLengthIsRefused() {
        let parent = SymmetricKey.random()
        let sealed = AEAD.seal(Array(repeating: 1, count: 31), key: parent, purpose: .keyWrap, fileID: fileA)
        #expect(throws: CryptoError.self) { try KeyWrap.unwrap(sealed, with: parent, fileID: fileA) }
    }
}

@Suite("Sealed boxes for accounts")
struct SealedBoxTests {
    let alice = AccountSecret.generate()
    let bob = AccountSecret.generate()

    @Test func roundTrip() throws {
        let key = SymmetricKey.random()
        let sealed = alice.boxKeys.publicKey.seal(key: key, fileID: fileA)
        #expect(sealed.count == 48 + 1 + 16 + 32)
        #expect(!contains(sealed, key.bytes))
        #expect(try alice.boxKeys.open(sealedKey: sealed, fileID: fileA) == key)
        // Sealing is randomised (ephemeral key).
        #expect(sealed != alice.boxKeys.publicKey.seal(key: key, fileID: fileA))
    }

    @Test func everyFlippedByteIsDetected() {
        let key = SymmetricKey.random()
        let box = alice.boxKeys
        let sealed = box.publicKey.seal(key: key, fileID: fileA)
        for v in flippedVariants(sealed) {
            #expect(throws: CryptoError.self, "byte \(v.position)") { try box.open(sealedKey: v.bytes, fileID: fileA) }
        }
    }

    @Test func otherAccountCannotOpen() {
        let sealed = alice.boxKeys.publicKey.seal(key: .random(), fileID: fileA)
        #expect(throws: CryptoError.self) { try bob.boxKeys.open(sealedKey: sealed, fileID: fileA) }
    }

    @Test func keyBoundToAnotherFileIsRefused() {
        let sealed = alice.boxKeys.publicKey.seal(key: .random(), fileID: fileA)
        #expect(throws: CryptoError.authenticationFailed("sealed key (bound to another file)")) {
            try alice.boxKeys.open(sealedKey: sealed, fileID: fileB)
        }
        // A file id of another length is refused too.
        #expect(throws: CryptoError.self) { try alice.boxKeys.open(sealedKey: sealed, fileID: Array(fileA.prefix(8))) }
    }

    @Test func grantedKeysOpenOnlyWithTheirBinding() throws {
        let key = SymmetricKey.random()
        let binding = Array("CFGK".utf8) + fileA + [UInt8](repeating: 0xB0, count: 32) + [1]
        let sealed = bob.boxKeys.publicKey.seal(key: key, binding: binding)
        #expect(sealed.count == 48 + 1 + binding.count + 32)
        #expect(try bob.boxKeys.open(sealedKey: sealed, binding: binding) == key)
        // Another mode, another file, or a share key presented as a root key: refused.
        var otherMode = binding
        otherMode[otherMode.count - 1] = 2
        #expect(throws: CryptoError.authenticationFailed("granted key (bound to another file, account or mode)")) {
            try bob.boxKeys.open(sealedKey: sealed, binding: otherMode)
        }
        #expect(throws: CryptoError.self) { try bob.boxKeys.open(sealedKey: sealed, binding: fileB) }
        #expect(throws: CryptoError.self) { try alice.boxKeys.open(sealedKey: sealed, binding: binding) }
        let rootKey = bob.boxKeys.publicKey.seal(key: key, fileID: fileA)
        #expect(throws: CryptoError.self) {
            try bob.boxKeys.open(sealedKey: rootKey, binding: Array(binding.prefix(16)))
        }
        for v in flippedVariants(sealed) {
            #expect(throws: CryptoError.self, "byte \(v.position)") {
                try bob.boxKeys.open(sealedKey: v.bytes, binding: binding)
            }
        }
    }

    @Test func truncatedOrExtendedBoxIsRefused() {
        let sealed = alice.boxKeys.publicKey.seal(key: .random(), fileID: fileA)
        #expect(throws: CryptoError.self) { try alice.boxKeys.open(sealedKey: Array(sealed.dropLast()), fileID: fileA) }
        #expect(throws: CryptoError.self) { try alice.boxKeys.open(sealedKey: sealed + [0], fileID: fileA) }
        #expect(throws: CryptoError.self) { try alice.boxKeys.open(sealedKey: [], fileID: fileA) }
    }

    @Test func publicKeyLengthIsChecked() throws {
        #expect(throws: CryptoError.self) { try PublicBoxKey(bytes: Array(repeating: 1, count: 31)) }
        let pk = try PublicBoxKey(bytes: alice.boxKeys.publicKey.bytes)
        #expect(pk == alice.boxKeys.publicKey)
    }
}

@Suite("Signatures")
struct SignatureTests {
    let keys = AccountSecret.generate().signingKeys

    @Test func signAndVerify() {
        let message = Array("metadata record".utf8)
        let sig = keys.sign(message)
        #expect(sig.count == 64)
        #expect(keys.publicKey.verify(signature: sig, message: message))
        #expect(keys.publicKey.verify(signature: keys.sign([]), message: []))
    }

    @Test func everyFlippedSignatureByteIsDetected() {
        let message = Array("metadata".utf8)
        let sig = keys.sign(message)
        for v in flippedVariants(sig) {
            #expect(!keys.publicKey.verify(signature: v.bytes, message: message), "byte \(v.position)")
        }
    }

    @Test func everyFlippedMessageByteIsDetected() {
        let message = Array("a signed metadata record".utf8)
        let sig = keys.sign(message)
        for v in flippedVariants(message) {
            #expect(!keys.publicKey.verify(signature: sig, message: v.bytes), "byte \(v.position)")
        }
        #expect(!keys.publicKey.verify(signature: sig, message: message + [0]))
        #expect(!keys.publicKey.verify(signature: sig, message: Array(message.dropLast())))
    }

    @Test func wrongKeyOrMalformedSignatureIsRejected() {
        let message = Array("m".utf8)
        let sig = keys.sign(message)
        #expect(!AccountSecret.generate().signingKeys.publicKey.verify(signature: sig, message: message))
        #expect(!keys.publicKey.verify(signature: Array(sig.dropLast()), message: message))
        #expect(!keys.publicKey.verify(signature: sig + [0], message: message))
        #expect(!keys.publicKey.verify(signature: [], message: message))
        #expect(!keys.publicKey.verify(signature: Array(repeating: 0, count: 64), message: message))
    }

    @Test func publicKeyLengthIsChecked() {
        #expect(throws: CryptoError.self) { try PublicSigningKey(bytes: Array(repeating: 1, count: 33)) }
        #expect(throws: CryptoError.self) { try PublicSigningKey(bytes: []) }
    }

    /// Ed25519 is deterministic: a fixed seed and message give a fixed signature (cross-checked
    /// with Python's `cryptography` Ed25519 from the derived signing sub-seed).
    @Test func fixedSignatureVector() throws {
        let keys = try AccountSecret(seed: seed0to31).signingKeys
        let sig = keys.sign(Array("hello coffer".utf8))
        #expect(
            hex(sig)
                == "84a45f407883af6b7ae8278493e62f6f6965b673b953ed89b1ea99412d2d0eaf"
                + "c3e476fbc5bcdc2d7b3eaf12bf7e8366b9c338025eec760822ad534c8e4fd803"
        )
    }
}

@Suite("Name MACs")
struct NameMACTests {
    @Test func deterministicAndKeyed() {
        let k = SymmetricKey.random()
        let a = NameMAC.mac(name: "notes.txt", parentKey: k)
        #expect(a.count == 32)
        #expect(a == NameMAC.mac(name: "notes.txt", parentKey: k))
        #expect(a != NameMAC.mac(name: "notes.txt ", parentKey: k))
        #expect(a != NameMAC.mac(name: "Notes.txt", parentKey: k))
        #expect(a != NameMAC.mac(name: "notes.txt", parentKey: .random()))
        #expect(NameMAC.mac(name: "", parentKey: k) != NameMAC.mac(name: "\0", parentKey: k))
    }

    /// Fixed vector: BLAKE2b-256("coffer-name-v1" || 0x00 || name, key = derive(parentKey, 1, "cfname")),
    /// cross-checked with Python hashlib.
    @Test func fixedVector() {
        #expect(
            hex(NameMAC.mac(name: "notes.txt", parentKey: key32to63))
                == "5aca92869d2695680a5192493c0a30e469cff3f30a71f10975e8a0dc8b5051d1")
    }

    /// The MAC key is a subkey, not the parent key itself (one key, one primitive).
    @Test func macIsNotKeyedWithTheRawParentKey() {
        let raw = blake2b(Array("coffer-name-v1".utf8) + [0] + Array("a".utf8), key: key32to63.bytes)
        #expect(raw != NameMAC.mac(name: "a", parentKey: key32to63))
    }
}

@Suite("Hashes and helpers")
struct HashTests {
    @Test func standardVectors() {
        #expect(hex(sha256(Array("abc".utf8))) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")
        #expect(hex(blake2b([])) == "0e5751c026e543b2e8ab2eb06099daa1d1e5df47778f7787faab45cdf12fe3a8")
        #expect(
            hex(blake2b(Array("abc".utf8), key: seed0to31))
                == "d63a32d3e44738d7907f964316c241adaba0abfeabc32349677578a15a203f7f")
        #expect(blake2b([1], outputLength: 16).count == 16)
    }

    @Test func constantTimeEqualCompares() {
        #expect(constantTimeEqual([1, 2, 3], [1, 2, 3]))
        #expect(!constantTimeEqual([1, 2, 3], [1, 2, 4]))
        #expect(!constantTimeEqual([1, 2, 3], [1, 2]))
        #expect(constantTimeEqual([], []))
    }

    @Test func randomBytesHaveTheRightLengthAndDiffer() {
        #expect(randomBytes(0).isEmpty)
        #expect(randomBytes(33).count == 33)
        #expect(randomBytes(32) != randomBytes(32))
    }
}
