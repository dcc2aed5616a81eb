import COpenSSL
import CSodium

/// The same primitives as the rest of this module, computed by OpenSSL's libcrypto where its
/// speed matters: XChaCha20-Poly1305 of `threshold` bytes and more, and HMAC-SHA-256 at every
/// size. libcrypto runs ChaCha20 and Poly1305 on the CPU's widest vector unit and SHA-256 on
/// its SHA extensions; libsodium's code for both is slower on chunk-sized inputs (figures in
/// docs/CRYPTOGRAPHY.md), and its smaller per-call cost wins below `threshold`.
///
/// The constructions do not change: XChaCha20-Poly1305 IETF is the HChaCha20 subkey (computed
/// by libsodium) followed by RFC 8439's ChaCha20-Poly1305, and HMAC-SHA-256 is RFC 2104 in both
/// libraries. `BulkCryptoTests` checks that byte for byte against libsodium.
enum Bulk {
    /// AEAD inputs at least this long go to libcrypto. Its per-call setup costs more than its
    /// speed saves below about 2.5 KiB on an AVX-512 CPU (docs/CRYPTOGRAPHY.md), and its lead
    /// is smaller on CPUs without AVX-512; one page is on the safe side of both.
    static let threshold = 4096

    /// Fetched once: fetching walks libcrypto's provider tables. Immutable and reference
    /// counted by libcrypto, so sharing it between threads is safe.
    nonisolated(unsafe) static let sha256: OpaquePointer? = EVP_MD_fetch(nil, "SHA256", nil)

    /// HMAC-SHA-256, or nil if libcrypto could not do it (the caller falls back to libsodium).
    static func hmacSHA256(_ data: UnsafeRawBufferPointer, key: [UInt8]) -> [UInt8]? {
        guard let sha256 else { return nil }
        var out = [UInt8](repeating: 0, count: 32)
        let ok = out.withUnsafeMutableBufferPointer { o in
            key.withUnsafeBufferPointer { k in
                coffer_hmac_sha256(
                    sha256, k.baseAddress, k.count, data.baseAddress?.assumingMemoryBound(to: UInt8.self), data.count,
                    o.baseAddress)
            }
        }
        return ok == 1 ? out : nil
    }

    /// What an opening by libcrypto came to.
    enum Opened {
        /// The tag verified; the output holds the plaintext.
        case opened
        /// The tag did not verify. Final: the construction is libsodium's, so libsodium would
        /// refuse it too. An in-place output may hold garbage.
        case refused
        /// libcrypto could not run (a failed allocation); nothing was read or written, so the
        /// caller can have libsodium do the work on the same buffers.
        case unavailable
    }

    /// XChaCha20-Poly1305 IETF: the ciphertext of `plaintext` followed by the tag, written to
    /// `out` (plaintext.count + 16 bytes). False if libcrypto failed (nothing useful written;
    /// the caller falls back to libsodium).
    static func sealXChaCha(
        _ plaintext: UnsafeRawBufferPointer, ad: [UInt8], nonce: [UInt8], key: [UInt8],
        into out: UnsafeMutablePointer<UInt8>
    ) -> Bool {
        guard plaintext.count < Int(Int32.max) - 64, ad.count < Int(Int32.max) else { return false }
        return withSubkey(nonce: nonce, key: key) { subkey, nonce12 in
            coffer_chacha20poly1305_seal(
                subkey, nonce12, ad, ad.count, plaintext.baseAddress?.assumingMemoryBound(to: UInt8.self),
                plaintext.count, out, out + plaintext.count) == 1
        } ?? false
    }

    /// Opens what `sealXChaCha` (or libsodium's xchacha20poly1305_ietf) sealed: `sealed` is
    /// ciphertext then tag, its plaintext goes to `out`, which may be `sealed`'s own memory.
    static func openXChaCha(
        _ sealed: UnsafeRawBufferPointer, ad: [UInt8], nonce: [UInt8], key: [UInt8],
        into out: UnsafeMutablePointer<UInt8>
    ) -> Opened {
        guard sealed.count >= AEAD.tagBytes else { return .refused }
        guard sealed.count < Int(Int32.max), ad.count < Int(Int32.max),
            let base = sealed.baseAddress?.assumingMemoryBound(to: UInt8.self)
        else { return .unavailable }
        let length = sealed.count - AEAD.tagBytes
        let rc = withSubkey(nonce: nonce, key: key) { subkey, nonce12 in
            coffer_chacha20poly1305_open(subkey, nonce12, ad, ad.count, base, length, base + length, out)
        }
        switch rc {
        case 1: return .opened
        case 0: return .refused
        default: return .unavailable
        }
    }

    /// Runs `body` with the HChaCha20 subkey of (key, first 16 nonce bytes) and the IETF nonce
    /// (four zero bytes, then the last 8 nonce bytes): what libsodium's XChaCha20 derives before
    /// running ChaCha20. Nil if the lengths are wrong or the derivation failed.
    private static func withSubkey<T>(
        nonce: [UInt8], key: [UInt8], _ body: (UnsafePointer<UInt8>, UnsafePointer<UInt8>) -> T
    ) -> T? {
        guard nonce.count == AEAD.nonceBytes, key.count == 32 else { return nil }
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
        guard derived == 0 else { return nil }
        return subkey.withUnsafeBufferPointer { s -> T? in
            nonce12.withUnsafeBufferPointer { n -> T? in
                guard let sb = s.baseAddress, let nb = n.baseAddress else { return nil }
                return body(sb, nb)
            }
        }
    }
}

/// HMAC-SHA-256 (RFC 2104) of `data`, as libsodium's `crypto_auth_hmacsha256` computes it.
/// libcrypto does the work at every size: it runs SHA-256 on the CPU's SHA extensions, and its
/// per-call setup costs no more than libsodium's on a 64-byte input.
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
