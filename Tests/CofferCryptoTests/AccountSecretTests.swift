import Testing

@testable import CofferCrypto

@Suite("Account secret")
struct AccountSecretTests {
    // MARK: Fixed vectors (BIP-39 English, 256-bit entropy)

    static let bip39Vectors: [(entropy: [UInt8], phrase: String)] = [
        (
            Array(repeating: 0x00, count: 32),
            Array(repeating: "abandon", count: 23).joined(separator: " ") + " art"
        ),
        (
            Array(repeating: 0x7f, count: 32),
            "legal winner thank year wave sausage worth useful legal winner thank year wave sausage worth useful"
                + " legal winner thank year wave sausage worth title"
        ),
        (
            Array(repeating: 0xff, count: 32),
            Array(repeating: "zoo", count: 23).joined(separator: " ") + " vote"
        ),
        // Computed once with the code, cross-checked with an independent Python BIP-39 encoder.
        (
            Array(0..<32),
            "abandon amount liar amount expire adjust cage candy arch gather drum bullet absurd math era live bid"
                + " rhythm alien crouch range attend journey unaware"
        ),
    ]

    @Test func phraseMatchesBIP39StandardVectors() throws {
        for v in Self.bip39Vectors {
            let secret = try AccountSecret(seed: v.entropy)
            #expect(secret.phrase.joined(separator: " ") == v.phrase)
            #expect(secret.phrase.count == 24)
            let back = try AccountSecret(phrase: v.phrase)
            #expect(back.seed == v.entropy)
        }
    }

    @Test func wordListIsTheStandardBIP39EnglishList() {
        #expect(bip39EnglishWords.count == 2048)
        #expect(bip39EnglishWords.first == "abandon")
        #expect(bip39EnglishWords.last == "zoo")
        #expect(bip39EnglishWords == bip39EnglishWords.sorted(), "binary search needs a sorted list")
        #expect(Set(bip39EnglishWords).count == 2048)
        // SHA-256 of the official english.txt (words joined by newlines, trailing newline).
        let text = bip39EnglishWords.joined(separator: "\n") + "\n"
        #expect(hex(sha256(Array(text.utf8))) == "2f5eed53a4727b4bf8880d8f3f199efc90e58503646d9ff8eff3a2ed3b24dbda")
        // First four letters identify a word.
        #expect(Set(bip39EnglishWords.map { $0.prefix(4) }).count == 2048)
    }

    @Test func base64FixedVector() throws {
        let secret = try AccountSecret(seed: seed0to31)
        #expect(secret.base64 == "coffer1:AQABAgMEBQYHCAkKCwwNDg8QERITFBUWFxgZGhscHR4fSRF2sA==")
        #expect(try AccountSecret(base64: secret.base64).seed == seed0to31)
    }

    /// The derived public keys are the account's identity: they must never change for a seed.
    /// Cross-checked with Python: Ed25519 from derive(seed,1,"cfsign"); X25519 from
    /// SHA-512(derive(seed,2,"cfbox"))[0..<32] (what crypto_box_seed_keypair does).
    @Test func derivedPublicKeysAreFixed() throws {
        let secret = try AccountSecret(seed: seed0to31)
        #expect(
            hex(secret.signingKeys.publicKey.bytes)
                == "133301dea776864053295b22e6b4b5a634ba02d657778067a7e49a84b46ccca3")
        #expect(
            hex(secret.boxKeys.publicKey.bytes) == "095a779d210d668c9935930769bf826ac4e7cbbc1454e292062eb0836233b769")
    }

    @Test func keysAreDomainSeparated() throws {
        let secret = try AccountSecret(seed: seed0to31)
        #expect(secret.signingKeys.publicKey.bytes != secret.boxKeys.publicKey.bytes)
        #expect(secret.signingKeys.publicKey.bytes != secret.seed)
        let other = try AccountSecret(seed: seed0to31.map { $0 ^ 1 })
        #expect(other.signingKeys.publicKey != secret.signingKeys.publicKey)
        #expect(other.boxKeys.publicKey != secret.boxKeys.publicKey)
    }

    // MARK: Round trips

    @Test func phraseRoundTripGivesTheSameAccount() throws {
        for _ in 0..<50 {
            let secret = AccountSecret.generate()
            let phrase = secret.phrase.joined(separator: " ")
            let imported = try AccountSecret(phrase: phrase)
            #expect(imported == secret)
            #expect(imported.signingKeys.publicKey == secret.signingKeys.publicKey)
            #expect(imported.boxKeys.publicKey == secret.boxKeys.publicKey)
            // A key sealed for the original opens with the imported one.
            let k = SymmetricKey.random()
            #expect(
                try imported.boxKeys.open(
                    sealedKey: secret.boxKeys.publicKey.seal(key: k, fileID: fileA), fileID: fileA) == k)
        }
    }

    @Test func base64RoundTrip() throws {
        for _ in 0..<50 {
            let secret = AccountSecret.generate()
            #expect(secret.base64.hasPrefix("coffer1:"))
            #expect(try AccountSecret(base64: secret.base64) == secret)
        }
    }

    @Test func exportedAcceptsBothForms() throws {
        let secret = AccountSecret.generate()
        #expect(try AccountSecret(exported: secret.base64) == secret)
        #expect(try AccountSecret(exported: "  \n" + secret.base64 + "\n") == secret)
        #expect(try AccountSecret(exported: secret.phrase.joined(separator: " ")) == secret)
        #expect(try AccountSecret(exported: "\n" + secret.phrase.joined(separator: "\n") + "\n") == secret)
    }

    @Test func phraseIsLenientAboutCaseAndSeparators() throws {
        let secret = try AccountSecret(seed: seed0to31)
        let words = secret.phrase
        #expect(try AccountSecret(phrase: words.joined(separator: " ").uppercased()) == secret)
        #expect(try AccountSecret(phrase: words.joined(separator: ",  \t")) == secret)
        #expect(try AccountSecret(phrase: "  " + words.joined(separator: "   ") + "\n") == secret)
    }

    // MARK: Refusals

    @Test func oneWrongWordFailsTheChecksum() throws {
        let words = try AccountSecret(seed: seed0to31).phrase
        // For this seed, replacing any single word by the next word in the list fails the
        // checksum (checked independently for all 24 positions).
        for i in 0..<24 {
            var w = words
            let index = bip39EnglishWords.firstIndex(of: Substring(w[i]))!
            w[i] = String(bip39EnglishWords[(index + 1) % 2048])
            #expect(throws: CryptoError.self, "word \(i + 1)") { try AccountSecret(phrase: w.joined(separator: " ")) }
            do {
                _ = try AccountSecret(phrase: w.joined(separator: " "))
            } catch let CryptoError.invalidPhrase(why) {
                #expect(why.contains("checksum"))
            }
        }
        // Swapping two different words (an ordering mistake) is caught too.
        var swapped = words
        swapped.swapAt(0, 1)
        #expect(throws: CryptoError.self) { try AccountSecret(phrase: swapped.joined(separator: " ")) }
    }

    @Test func wordNotInTheListIsRefused() throws {
        var words = try AccountSecret(seed: seed0to31).phrase
        words[5] = "bitcoinz"
        #expect(throws: CryptoError.invalidPhrase("word 6 (\"bitcoinz\") is not in the word list")) {
            try AccountSecret(phrase: words.joined(separator: " "))
        }
        words[5] = "abando"  // a prefix is not a word
        #expect(throws: CryptoError.self) { try AccountSecret(phrase: words.joined(separator: " ")) }
    }

    @Test func wrongWordCountIsRefused() throws {
        let words = try AccountSecret(seed: seed0to31).phrase
        #expect(throws: CryptoError.invalidPhrase("expected 24 words, got 23")) {
            try AccountSecret(phrase: words.dropLast().joined(separator: " "))
        }
        #expect(throws: CryptoError.invalidPhrase("expected 24 words, got 25")) {
            try AccountSecret(phrase: (words + ["abandon"]).joined(separator: " "))
        }
        // A valid 12-word BIP-39 phrase is still the wrong length for an account.
        #expect(throws: CryptoError.self) {
            try AccountSecret(phrase: Array(repeating: "abandon", count: 11).joined(separator: " ") + " about")
        }
        #expect(throws: CryptoError.self) { try AccountSecret(phrase: "") }
        #expect(throws: CryptoError.self) { try AccountSecret(exported: "") }
    }

    @Test func damagedBase64IsRefused() throws {
        let good = try AccountSecret(seed: seed0to31).base64
        let chars = Array(good)
        let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/")
        // Change every character of the payload (except padding) to another base64 character.
        // (+16 changes the character's top bits, which always carry data.)
        for i in 8..<(chars.count - 2) {
            var c = chars
            let j = alphabet.firstIndex(of: c[i])!
            c[i] = alphabet[(j + 16) % 64]
            #expect(throws: CryptoError.self, "char \(i)") { try AccountSecret(base64: String(c)) }
        }
        #expect(throws: CryptoError.self) { try AccountSecret(base64: String(good.dropLast(4))) }  // too short
        #expect(throws: CryptoError.self) { try AccountSecret(base64: String(good.dropFirst(8))) }  // no prefix
        #expect(throws: CryptoError.self) { try AccountSecret(base64: "coffer2:" + good.dropFirst(8)) }
        #expect(throws: CryptoError.self) { try AccountSecret(base64: String(good.map { $0 == "A" ? "*" : $0 })) }
        #expect(throws: CryptoError.self) { try AccountSecret(base64: "coffer1:") }
        #expect(throws: CryptoError.self) { try AccountSecret(exported: "coffer1:!!!!") }
    }

    @Test func unknownVersionIsRefused() throws {
        let body: [UInt8] = [2] + seed0to31
        let text = "coffer1:" + Base64.encode(body + Array(sha256(body).prefix(4)))
        #expect(throws: CryptoError.invalidEncoding("unknown version 2")) { try AccountSecret(base64: text) }
    }

    @Test func seedLengthIsChecked() {
        #expect(throws: CryptoError.self) { try AccountSecret(seed: Array(repeating: 0, count: 31)) }
        #expect(throws: CryptoError.self) { try AccountSecret(seed: Array(repeating: 0, count: 33)) }
        #expect(AccountSecret.generate() != AccountSecret.generate())
        #expect(AccountSecret.generate().seed.count == 32)
    }
}

@Suite("Base64")
struct Base64Tests {
    /// RFC 4648 section 10.
    @Test func rfc4648Vectors() {
        let vectors = [
            ("", ""), ("f", "Zg=="), ("fo", "Zm8="), ("foo", "Zm9v"), ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="), ("foobar", "Zm9vYmFy"),
        ]
        for (plain, encoded) in vectors {
            #expect(Base64.encode(Array(plain.utf8)) == encoded)
            #expect(Base64.decode(encoded) == Array(plain.utf8))
        }
    }

    @Test func roundTripAllLengths() {
        for n in 0..<70 {
            let b = randomBytes(n)
            #expect(Base64.decode(Base64.encode(b)) == b)
        }
        let all = (0...255).map { UInt8($0) }
        #expect(Base64.decode(Base64.encode(all)) == all)
    }

    @Test func malformedInputIsRefused() {
        #expect(Base64.decode("Zm9v!") == nil)
        #expect(Base64.decode("Zm9") == nil, "missing padding")
        #expect(Base64.decode("Zg=a") == nil, "data after padding")
        #expect(Base64.decode("Z===") == nil, "too much padding")
        #expect(Base64.decode("Zm 9v") == nil)
    }
}
