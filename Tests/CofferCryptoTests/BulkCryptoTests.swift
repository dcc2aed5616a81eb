import CSodium
import Testing

@testable import CofferCrypto

/// libcrypto computes what `Bulk` routes to it, libsodium the rest. These check that libcrypto
/// agrees with libsodium byte for byte, in both directions, at every length (also below the
/// threshold, where `AEAD` does not use it), and refuses what libsodium refuses.
@Suite("Bulk crypto (libcrypto) against libsodium")
struct BulkCryptoTests {
    static let lengths = [
        0, 1, 63, 64, 127, 128, 129, Bulk.threshold - 1, Bulk.threshold, Bulk.threshold + 1, 1024, 65_537, 262_144,
    ]

    func sodiumSeal(_ plain: [UInt8], ad: [UInt8], nonce: [UInt8], key: [UInt8]) -> [UInt8] {
        var out = [UInt8](repeating: 0, count: plain.count + AEAD.tagBytes)
        var clen: UInt64 = 0
        let rc = crypto_aead_xchacha20poly1305_ietf_encrypt(
            &out, &clen, plain, UInt64(plain.count), ad, UInt64(ad.count), nil, nonce, key)
        #expect(rc == 0)
        return out
    }

    func sodiumOpen(_ sealed: [UInt8], ad: [UInt8], nonce: [UInt8], key: [UInt8]) -> [UInt8]? {
        var out = [UInt8](repeating: 0, count: max(sealed.count - AEAD.tagBytes, 0))
        var mlen: UInt64 = 0
        let rc = crypto_aead_xchacha20poly1305_ietf_decrypt(
            &out, &mlen, nil, sealed, UInt64(sealed.count), ad, UInt64(ad.count), nonce, key)
        return rc == 0 ? out : nil
    }

    func bulkSeal(_ plain: [UInt8], ad: [UInt8], nonce: [UInt8], key: [UInt8]) -> [UInt8]? {
        var out = [UInt8](repeating: 0, count: plain.count + AEAD.tagBytes)
        let ok = out.withUnsafeMutableBufferPointer { o in
            plain.withUnsafeBytes { Bulk.sealXChaCha($0, ad: ad, nonce: nonce, key: key, into: o.baseAddress!) }
        }
        return ok ? out : nil
    }

    func bulkOpen(_ sealed: [UInt8], ad: [UInt8], nonce: [UInt8], key: [UInt8]) -> [UInt8]? {
        var out = [UInt8](repeating: 0, count: max(sealed.count - AEAD.tagBytes, 1))
        let result = out.withUnsafeMutableBufferPointer { o in
            sealed.withUnsafeBytes { Bulk.openXChaCha($0, ad: ad, nonce: nonce, key: key, into: o.baseAddress!) }
        }
        #expect(result != .unavailable)
        return result == .opened ? Array(out.prefix(max(sealed.count - AEAD.tagBytes, 0))) : nil
    }

    @Test func hmacSHA256MatchesLibsodium() throws {
        for n in Self.lengths {
            let data = randomBytes(n)
            for keyLength in [32, 16, 64, 100] {
                let key = randomBytes(keyLength)
                var state = crypto_auth_hmacsha256_state()
                var expected = [UInt8](repeating: 0, count: 32)
                _ = crypto_auth_hmacsha256_init(&state, key, key.count)
                _ = crypto_auth_hmacsha256_update(&state, data, UInt64(data.count))
                _ = crypto_auth_hmacsha256_final(&state, &expected)
                let viaAPI = data.withUnsafeBytes { hmacSHA256($0, key: key) }
                let direct = try #require(data.withUnsafeBytes { Bulk.hmacSHA256($0, key: key) })
                let same = viaAPI == expected && direct == expected
                #expect(same, "length \(n), key \(keyLength)")
            }
        }
        // The empty key and the empty message (RFC 2104 pads a missing key with zeros).
        var expected = [UInt8](repeating: 0, count: 32)
        var state = crypto_auth_hmacsha256_state()
        let noKey: [UInt8] = [0]
        _ = crypto_auth_hmacsha256_init(&state, noKey, 0)
        _ = crypto_auth_hmacsha256_final(&state, &expected)
        #expect(try #require([UInt8]().withUnsafeBytes { Bulk.hmacSHA256($0, key: []) }) == expected)
        // RFC 4231, test case 2.
        let rfc = Array("what do ya want for nothing?".utf8).withUnsafeBytes { hmacSHA256($0, key: Array("Jefe".utf8)) }
        #expect(hex(rfc) == "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843")
    }

    @Test func xchachaMatchesLibsodiumBothWays() throws {
        for n in Self.lengths {
            let key = randomBytes(32)
            let nonce = randomBytes(AEAD.nonceBytes)
            let plain = randomBytes(n)
            for ad in [[], randomBytes(1), randomBytes(45)] {
                let bySodium = sodiumSeal(plain, ad: ad, nonce: nonce, key: key)
                let byBulk = try #require(bulkSeal(plain, ad: ad, nonce: nonce, key: key))
                // Compared as Bools: a failing #expect on two 256 KiB arrays prints them whole.
                let sameBytes = byBulk == bySodium
                let bulkOpensSodium = bulkOpen(bySodium, ad: ad, nonce: nonce, key: key) == plain
                let sodiumOpensBulk = sodiumOpen(byBulk, ad: ad, nonce: nonce, key: key) == plain
                #expect(sameBytes, "length \(n), ad \(ad.count)")
                #expect(bulkOpensSodium, "length \(n), ad \(ad.count)")
                #expect(sodiumOpensBulk, "length \(n), ad \(ad.count)")
            }
        }
    }

    @Test func bulkOpenRefusesAnyChange() throws {
        let key = randomBytes(32)
        let nonce = randomBytes(AEAD.nonceBytes)
        let ad = randomBytes(20)
        let plain = randomBytes(10_000)
        let sealed = sodiumSeal(plain, ad: ad, nonce: nonce, key: key)
        let opens = bulkOpen(sealed, ad: ad, nonce: nonce, key: key) == plain
        #expect(opens)
        for i in [0, 5_000, plain.count - 1, plain.count, sealed.count - 1] {  // ciphertext and tag bytes
            var bad = sealed
            bad[i] ^= 0x01
            #expect(bulkOpen(bad, ad: ad, nonce: nonce, key: key) == nil, "flipped byte \(i)")
        }
        var badNonce = nonce
        badNonce[3] ^= 0x80  // part of the HChaCha20 input
        #expect(bulkOpen(sealed, ad: ad, nonce: badNonce, key: key) == nil)
        badNonce = nonce
        badNonce[20] ^= 0x80  // part of the IETF nonce
        #expect(bulkOpen(sealed, ad: ad, nonce: badNonce, key: key) == nil)
        var badAD = ad
        badAD[0] ^= 0x01
        #expect(bulkOpen(sealed, ad: badAD, nonce: nonce, key: key) == nil)
        #expect(bulkOpen(sealed, ad: ad, nonce: nonce, key: randomBytes(32)) == nil)
        #expect(bulkOpen(Array(sealed.prefix(AEAD.tagBytes - 1)), ad: ad, nonce: nonce, key: key) == nil)
    }

    /// The read path's open decrypts where the ciphertext lies, on both sides of the threshold
    /// (the plaintext is then at `nonceBytes` in the same buffer, not in a new one), and refuses
    /// what `open` refuses.
    @Test func openInPlaceDecryptsInTheSameBuffer() throws {
        let key = SymmetricKey.random()
        for n in [0, 1, Bulk.threshold - 1, Bulk.threshold, 262_144] {
            let plain = randomBytes(n)
            let sealed = AEAD.seal(plain, key: key, purpose: .chunk, fileID: fileA, extra: [7])
            var buffer = sealed
            let range = try AEAD.openInPlace(&buffer, key: key, purpose: .chunk, fileID: fileA, extra: [7], what: "t")
            let opened = buffer[range].elementsEqual(plain)
            #expect(opened, "length \(n)")
            #expect(range == AEAD.nonceBytes..<(AEAD.nonceBytes + n), "length \(n)")
            #expect(buffer.count == sealed.count, "length \(n): opened into a new buffer")
            var bad = sealed
            bad[bad.count - 1] ^= 0x01
            #expect(throws: CryptoError.self) {
                try AEAD.openInPlace(&bad, key: key, purpose: .chunk, fileID: fileA, extra: [7], what: "t")
            }
            // libcrypto decrypts before it checks the tag: a refusal must not leave the
            // unauthenticated plaintext in the buffer.
            let leftover = bad[AEAD.nonceBytes..<(AEAD.nonceBytes + n)]
            #expect(n == 0 || !leftover.elementsEqual(plain), "length \(n): plaintext left after a refusal")
            var other = sealed
            #expect(throws: CryptoError.self) {
                try AEAD.openInPlace(&other, key: key, purpose: .chunk, fileID: fileA, extra: [8], what: "t")
            }
        }
    }

    /// Through the public API: large sealed values (libcrypto) open with libsodium's layout
    /// (nonce || ciphertext || tag), and a damaged one is refused.
    @Test func aeadOnBothSidesOfTheThreshold() throws {
        let key = SymmetricKey.random()
        for n in Self.lengths {
            let plain = randomBytes(n)
            let sealed = AEAD.seal(plain, key: key, purpose: .chunk, fileID: fileA, extra: [7])
            let ad = AEAD.associatedData(purpose: .chunk, fileID: fileA, extra: [7])
            let sodiumOpens =
                sodiumOpen(
                    Array(sealed.dropFirst(AEAD.nonceBytes)), ad: ad, nonce: Array(sealed.prefix(AEAD.nonceBytes)),
                    key: key.bytes) == plain
            let aeadOpens =
                try AEAD.open(sealed, key: key, purpose: .chunk, fileID: fileA, extra: [7], what: "t") == plain
            #expect(sodiumOpens, "length \(n)")
            #expect(aeadOpens, "length \(n)")
            var bad = sealed
            bad[bad.count / 2] ^= 0x40
            #expect(throws: CryptoError.self) {
                try AEAD.open(bad, key: key, purpose: .chunk, fileID: fileA, extra: [7], what: "t")
            }
            #expect(throws: CryptoError.self) {
                try AEAD.open(sealed, key: key, purpose: .chunk, fileID: fileA, extra: [8], what: "t")
            }
        }
    }
}
