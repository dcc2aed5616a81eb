import Testing

@testable import CofferCrypto

@Suite("Passphrase-sealed account secret")
struct PassphraseTests {
    /// Argon2id at libsodium's minimum passes and 1 MiB, so the suite stays fast; the format and
    /// the checks are the same at every cost.
    static let cheap = SealedAccountSecret.Cost(opsLimit: 1, memLimit: 1 << 20)

    func passphrase(_ s: String) throws -> Passphrase { try Passphrase(Array(s.utf8)) }

    @Test func roundTrip() throws {
        let secret = AccountSecret.generate()
        let sealed = try SealedAccountSecret.seal(secret, passphrase: passphrase("correct horse"), cost: Self.cheap)
        #expect(sealed.count == SealedAccountSecret.sealedBytes)
        #expect(SealedAccountSecret.isSealed(sealed))
        #expect(Array(sealed[0..<5]) == [0x43, 0x46, 0x50, 0x57, 1])
        // Neither the seed nor its export is in the file.
        #expect(!(0...(sealed.count - 8)).contains { Array(sealed[$0..<($0 + 8)]) == Array(secret.seed[0..<8]) })
        #expect(try SealedAccountSecret.open(sealed, passphrase: passphrase("correct horse")) == secret)
        // A fresh salt and nonce each time.
        #expect(
            try SealedAccountSecret.seal(secret, passphrase: passphrase("correct horse"), cost: Self.cheap) != sealed)
        // A plain file is not mistaken for a sealed one.
        #expect(!SealedAccountSecret.isSealed(Array(secret.base64.utf8)))
    }

    /// A file written by format version 1 (seed 00 01 … 1f, passphrase "coffer vector", 2
    /// passes over 64 KiB) opens forever: pins the layout, Argon2id13, the associated data.
    @Test func versionOneVectorStillOpens() throws {
        let sealed = unhex(
            "434650570100000000000000020000000000010000381aee9629c44dcef6af7d33a9f05090dbe57cf8f8c61c17beaa084668"
                + "fdd86d73cbd7761726b842efa8e13e74b09979918aaca2c2d9e970efee03c0f06eb69ad6a4fe2ef1eaee"
                + "25968e468b4142907c44941dfd2f772953"
        )
        #expect(sealed.count == SealedAccountSecret.sealedBytes)
        #expect(try SealedAccountSecret.open(sealed, passphrase: passphrase("coffer vector")).seed == Array(0..<32))
    }

    @Test func wrongPassphraseIsRefusedClearly() throws {
        let sealed = try SealedAccountSecret.seal(.generate(), passphrase: passphrase("right"), cost: Self.cheap)
        #expect(throws: PassphraseError.wrongPassphrase) {
            try SealedAccountSecret.open(sealed, passphrase: passphrase("wrong"))
        }
        #expect(throws: PassphraseError.wrongPassphrase) {
            try SealedAccountSecret.open(sealed, passphrase: passphrase("right "))
        }
        #expect(PassphraseError.wrongPassphrase.description.contains("wrong passphrase"))
    }

    /// Every byte is covered: the header is the associated data (and feeds the derivation), the
    /// rest is nonce, ciphertext and tag. A flipped bit is refused, never opened to another key.
    @Test func everyTamperedByteIsRefused() throws {
        let p = try passphrase("tamper")
        let sealed = try SealedAccountSecret.seal(.generate(), passphrase: p, cost: Self.cheap)
        let saltStart = SealedAccountSecret.headerBytes - SealedAccountSecret.saltBytes
        for i in 0..<sealed.count {
            var bad = sealed
            bad[i] ^= 0x01
            #expect(throws: PassphraseError.self, "byte \(i)") { try SealedAccountSecret.open(bad, passphrase: p) }
            if i >= saltStart {
                #expect(throws: PassphraseError.wrongPassphrase, "byte \(i)") {
                    try SealedAccountSecret.open(bad, passphrase: p)
                }
            }
        }
        // A changed limit still in range is caught by the tag too (the header is authenticated).
        var memChanged = sealed
        memChanged[SealedAccountSecret.magic.count + 1 + 8 + 5] ^= 0x01  // memlimit 1 MiB -> 1.0625 MiB, in range
        #expect(throws: PassphraseError.wrongPassphrase) { try SealedAccountSecret.open(memChanged, passphrase: p) }
        #expect(throws: PassphraseError.self) { try SealedAccountSecret.open(Array(sealed.dropLast()), passphrase: p) }
        #expect(throws: PassphraseError.self) { try SealedAccountSecret.open(sealed + [0], passphrase: p) }
        #expect(throws: PassphraseError.self) { try SealedAccountSecret.open(Array(sealed.prefix(4)), passphrase: p) }
        var newer = sealed
        newer[4] = 2
        #expect(throws: PassphraseError.unsupportedVersion(2)) { try SealedAccountSecret.open(newer, passphrase: p) }
    }

    /// A header asking for 100 GB or 2^63 passes is refused before any derivation (this returns
    /// at once instead of allocating; with the check gone, libsodium would try to allocate).
    @Test func absurdLimitsAreRefusedUnread() throws {
        let p = try passphrase("limits")
        let sealed = try SealedAccountSecret.seal(.generate(), passphrase: p, cost: Self.cheap)
        func with(ops: UInt64? = nil, mem: UInt64? = nil) -> [UInt8] {
            var b = sealed
            func put(_ v: UInt64, at o: Int) {
                for k in 0..<8 { b[o + k] = UInt8(truncatingIfNeeded: v >> (56 - 8 * UInt64(k))) }
            }
            if let ops { put(ops, at: 5) }
            if let mem { put(mem, at: 13) }
            return b
        }
        for bad in [
            with(mem: 100_000_000_000), with(mem: UInt64.max), with(mem: (1 << 30) + 1), with(mem: 0), with(mem: 1024),
            with(ops: 0), with(ops: 17), with(ops: UInt64.max), with(ops: 1 << 63),
        ] {
            do {
                _ = try SealedAccountSecret.open(bad, passphrase: p)
                Issue.record("absurd limits were accepted")
            } catch let e as PassphraseError {
                guard case .damaged(let why) = e else {
                    Issue.record("expected damaged, got \(e)")
                    continue
                }
                #expect(why.contains("limit"))
                #expect(!e.description.contains("\n"))
            }
        }
        #expect(throws: PassphraseError.self) {
            try SealedAccountSecret.seal(
                .generate(), passphrase: p, cost: .init(opsLimit: 3, memLimit: 100_000_000_000))
        }
        // The default cost is within what opening accepts.
        let standard = SealedAccountSecret.Cost.standard
        #expect(
            standard.opsLimit <= SealedAccountSecret.maxOpsLimit && standard.memLimit <= SealedAccountSecret.maxMemLimit
        )
        #expect(standard.memLimit == 256 << 20 && standard.opsLimit == 3)
    }

    @Test func passphraseBounds() throws {
        #expect(throws: PassphraseError.empty) { try Passphrase([]) }
        #expect(throws: PassphraseError.tooLong) {
            try Passphrase([UInt8](repeating: 0x61, count: Passphrase.maxBytes + 1))
        }
        let longest = try Passphrase([UInt8](repeating: 0x61, count: Passphrase.maxBytes))
        #expect(longest.count == Passphrase.maxBytes)
        #expect(try passphrase("a").matches(passphrase("a")))
        #expect(try !passphrase("a").matches(passphrase("b")))
        #expect(try !passphrase("a").matches(passphrase("ab")))
    }
}
