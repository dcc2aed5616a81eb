import CBoringAEAD
import COpenSSL
import CSodium

/// The same primitives as the rest of this module, computed where their speed matters by
/// OpenSSL's libcrypto (keyed BLAKE2b of 1 KiB and more, HMAC-SHA-256, and XChaCha20-Poly1305 of
/// 1 KiB and more on AVX-512 machines) or by BoringSSL (`CBoringAEAD`: XChaCha20-Poly1305
/// everywhere else, at every size).
///
/// The constructions do not change: keyed BLAKE2b is RFC 7693 in every library, and
/// XChaCha20-Poly1305 IETF is the HChaCha20 subkey followed by RFC 8439's ChaCha20-Poly1305
/// (BoringSSL derives the subkey itself; for libcrypto, libsodium does). Whichever library
/// produced a value, the others verify it; `BulkCryptoTests` checks that byte for byte for each
/// engine. A call that returns false or nil leaves the work to libsodium.
enum Bulk {
    /// Inputs at least this long go to libcrypto (the hashes, and the AEAD on AVX-512 machines).
    static let threshold = 1024

    /// Fetched once: fetching walks libcrypto's provider tables. Immutable and reference
    /// counted by libcrypto, so sharing it between threads is safe.
    nonisolated(unsafe) static let blake2bMAC: OpaquePointer? = EVP_MAC_fetch(nil, "BLAKE2BMAC", nil)

    nonisolated(unsafe) static let sha256: OpaquePointer? = EVP_MD_fetch(nil, "SHA256", nil)

    /// HMAC-SHA-256, or nil if libcrypto could not do it (the caller falls back to libsodium).
    static func hmacSHA256(_ data: UnsafeRawBufferPointer, key: [UInt8]) -> [UInt8]? {
        guard let sha256 else { return nil }
        return digest(of: data, key: key, length: 32) { coffer_hmac_sha256(sha256, $0, $1, $2, $3, $4) }
    }

    /// Keyed BLAKE2b, or nil if libcrypto could not do it (the caller falls back to libsodium).
    static func keyedBlake2b(_ data: UnsafeRawBufferPointer, key: [UInt8], outputLength: Int) -> [UInt8]? {
        guard let mac = blake2bMAC, !key.isEmpty, key.count <= 64, (1...64).contains(outputLength) else { return nil }
        return digest(of: data, key: key, length: outputLength) {
            coffer_blake2b_keyed(mac, $0, $1, $2, $3, $4, outputLength)
        }
    }

    /// Runs one of the shim's MAC calls (key, key length, input, input length, output) into a
    /// fresh `length`-byte array; nil unless it returned 1.
    private static func digest(of data: UnsafeRawBufferPointer, key: [UInt8], length: Int,
                               _ call: (UnsafePointer<UInt8>?, Int, UnsafePointer<UInt8>?, Int, UnsafeMutablePointer<UInt8>?) -> Int32) -> [UInt8]? {
        var out = [UInt8](repeating: 0, count: length)
        let ok = out.withUnsafeMutableBufferPointer { o in
            key.withUnsafeBufferPointer { k in
                call(k.baseAddress, k.count, data.baseAddress?.assumingMemoryBound(to: UInt8.self), data.count, o.baseAddress)
            }
        }
        return ok == 1 ? out : nil
    }

    /// Which library runs XChaCha20-Poly1305. Both give libsodium's bytes.
    enum Engine: CaseIterable, Sendable {
        /// BoringSSL (`CBoringAEAD`): one stitched AVX2 pass over the data where the others make
        /// two. On this project's 2-core AMD EPYC (Zen 1, AVX2, no AVX-512) it measured
        /// 1.18-1.26 GB/s against 0.73-0.80 GB/s for libcrypto and libsodium on 256 KiB inputs,
        /// and 0.6 against 0.7 µs on 64-byte ones; the cipher had been more than half of the
        /// daemon's CPU reading a large file.
        case boringSSL
        /// Two passes, but AVX-512 ones where the CPU has them: about 4.8 GB/s on such a machine
        /// (2026-11-24), where BoringSSL stays on AVX2. Its per-call setup costs more than it
        /// saves below `threshold`.
        case libcrypto
    }

    /// Decided once from the CPU.
    static let hasAVX512 = coffer_cpu_has_avx512f() == 1

    /// The engine for a plaintext of `length` bytes (sealing it, or opening it).
    static func engine(for length: Int) -> Engine {
        hasAVX512 && length >= threshold ? .libcrypto : .boringSSL
    }

    /// XChaCha20-Poly1305 IETF: the ciphertext of `plaintext` followed by the tag, written to
    /// `out` (plaintext.count + 16 bytes). False if the engine failed (nothing useful written;
    /// the caller falls back to libsodium).
    static func sealXChaCha(_ plaintext: UnsafeRawBufferPointer, ad: [UInt8], nonce: [UInt8], key: [UInt8],
                            into out: UnsafeMutablePointer<UInt8>, engine: Engine? = nil) -> Bool {
        switch engine ?? Self.engine(for: plaintext.count) {
        case .boringSSL:
            guard nonce.count == AEAD.nonceBytes, key.count == 32 else { return false }
            return coffer_boring_xchacha_seal(key, nonce, ad, ad.count,
                                              plaintext.baseAddress?.assumingMemoryBound(to: UInt8.self), plaintext.count, out) == 1
        case .libcrypto: return libcryptoSealXChaCha(plaintext, ad: ad, nonce: nonce, key: key, into: out)
        }
    }

    /// Opens what `sealXChaCha` (or libsodium's xchacha20poly1305_ietf) sealed: `sealed` is
    /// ciphertext then tag. True only if the tag verified and `out` holds the plaintext.
    static func openXChaCha(_ sealed: UnsafeRawBufferPointer, ad: [UInt8], nonce: [UInt8], key: [UInt8],
                            into out: UnsafeMutablePointer<UInt8>, engine: Engine? = nil) -> Bool {
        switch engine ?? Self.engine(for: sealed.count - AEAD.tagBytes) {
        case .boringSSL:
            guard nonce.count == AEAD.nonceBytes, key.count == 32, sealed.count >= AEAD.tagBytes else { return false }
            return coffer_boring_xchacha_open(key, nonce, ad, ad.count,
                                              sealed.baseAddress?.assumingMemoryBound(to: UInt8.self), sealed.count, out) == 1
        case .libcrypto: return libcryptoOpenXChaCha(sealed, ad: ad, nonce: nonce, key: key, into: out)
        }
    }

    private static func libcryptoSealXChaCha(_ plaintext: UnsafeRawBufferPointer, ad: [UInt8], nonce: [UInt8], key: [UInt8],
                                             into out: UnsafeMutablePointer<UInt8>) -> Bool {
        guard plaintext.count < Int(Int32.max) - 64, ad.count < Int(Int32.max) else { return false }
        return withSubkey(nonce: nonce, key: key) { subkey, nonce12 in
            coffer_chacha20poly1305_seal(subkey, nonce12, ad, ad.count,
                                         plaintext.baseAddress?.assumingMemoryBound(to: UInt8.self), plaintext.count,
                                         out, out + plaintext.count) == 1
        }
    }

    private static func libcryptoOpenXChaCha(_ sealed: UnsafeRawBufferPointer, ad: [UInt8], nonce: [UInt8], key: [UInt8],
                                             into out: UnsafeMutablePointer<UInt8>) -> Bool {
        guard sealed.count >= AEAD.tagBytes, sealed.count < Int(Int32.max), ad.count < Int(Int32.max),
              let base = sealed.baseAddress?.assumingMemoryBound(to: UInt8.self) else { return false }
        let length = sealed.count - AEAD.tagBytes
        return withSubkey(nonce: nonce, key: key) { subkey, nonce12 in
            coffer_chacha20poly1305_open(subkey, nonce12, ad, ad.count, base, length, base + length, out) == 1
        }
    }

    /// The HChaCha20 subkey of (key, first 16 nonce bytes) and the IETF nonce (four zero bytes,
    /// then the last 8 nonce bytes): what libsodium's XChaCha20 derives before running ChaCha20.
    private static func withSubkey(nonce: [UInt8], key: [UInt8],
                                   _ body: (UnsafePointer<UInt8>, UnsafePointer<UInt8>) -> Bool) -> Bool {
        guard nonce.count == AEAD.nonceBytes, key.count == 32 else { return false }
        ensureSodium()
        var subkey = [UInt8](repeating: 0, count: 32)
        defer { subkey.withUnsafeMutableBytes { sodium_memzero($0.baseAddress, $0.count) } }
        var nonce12 = [UInt8](repeating: 0, count: 12)
        for i in 0..<8 { nonce12[4 + i] = nonce[16 + i] }
        let derived = subkey.withUnsafeMutableBufferPointer { s in
            nonce.withUnsafeBufferPointer { n in
                key.withUnsafeBufferPointer { k -> Int32 in
                    guard let sb = s.baseAddress, let nb = n.baseAddress, let kb = k.baseAddress else { return -1 }
                    return crypto_core_hchacha20(sb, nb, kb, nil)
                }
            }
        }
        guard derived == 0 else { return false }
        return subkey.withUnsafeBufferPointer { s in
            nonce12.withUnsafeBufferPointer { n in
                guard let sb = s.baseAddress, let nb = n.baseAddress else { return false }
                return body(sb, nb)
            }
        }
    }
}

/// Keyed BLAKE2b of `data`, identical to libsodium's `crypto_generichash` with the same key
/// and length; large inputs are hashed by libcrypto (see `Bulk`).
public func keyedBlake2b(_ data: UnsafeRawBufferPointer, key: [UInt8], outputLength: Int = 32) -> [UInt8] {
    if data.count >= Bulk.threshold, let out = Bulk.keyedBlake2b(data, key: key, outputLength: outputLength) { return out }
    let h = Blake2bHasher(key: key, outputLength: outputLength)
    h.update(data)
    return h.finalize()
}

/// HMAC-SHA-256 (RFC 2104) of `data`, as libsodium's `crypto_auth_hmacsha256` computes it.
/// libcrypto does the work at every size: it uses the CPU's SHA extensions, about 1.5 GB/s on a
/// 256 KiB input against 0.3 GB/s for libsodium's portable SHA-256 (and 0.8 GB/s for keyed
/// BLAKE2b), and its per-call setup costs about as much as libsodium's on a 100-byte input.
public func hmacSHA256(_ data: UnsafeRawBufferPointer, key: [UInt8]) -> [UInt8] {
    if let out = Bulk.hmacSHA256(data, key: key) { return out }
    ensureSodium()
    var state = crypto_auth_hmacsha256_state()
    var out = [UInt8](repeating: 0, count: 32)
    _ = crypto_auth_hmacsha256_init(&state, key, key.count)
    if let base = data.baseAddress?.assumingMemoryBound(to: UInt8.self) {
        _ = crypto_auth_hmacsha256_update(&state, base, UInt64(data.count))
    }
    _ = crypto_auth_hmacsha256_final(&state, &out)
    return out
}
