// OpenSSL's libcrypto, for bulk work only: its BLAKE2b and ChaCha20-Poly1305 use the CPU's
// vector units (AVX2/AVX-512) and run two to three times faster than libsodium's on chunk-sized
// inputs. The constructions stay libsodium's (keyed BLAKE2b, XChaCha20-Poly1305 IETF), so the
// bytes are the same whichever library produced them. The wrappers keep OpenSSL's parameter
// arrays and control macros out of Swift.
#ifndef COFFER_OPENSSL_SHIM_H
#define COFFER_OPENSSL_SHIM_H

#include <openssl/core_names.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <openssl/crypto.h>

/// One MAC over `in` under `key`, `outlen` bytes to `out`: a context from `mac` (fetched once by
/// the caller), set up with `params`. Returns 1 on success.
static inline int coffer_mac(EVP_MAC *mac, const OSSL_PARAM *params, const uint8_t *key, size_t keylen,
                             const uint8_t *in, size_t inlen, uint8_t *out, size_t outlen) {
    EVP_MAC_CTX *ctx = EVP_MAC_CTX_new(mac);
    if (ctx == NULL) return 0;
    size_t written = 0;
    int ok = EVP_MAC_init(ctx, key, keylen, params)
        && EVP_MAC_update(ctx, in, inlen)
        && EVP_MAC_final(ctx, out, &written, outlen)
        && written == outlen;
    EVP_MAC_CTX_free(ctx);
    return ok;
}

/// Keyed BLAKE2b (RFC 7693) with an `outlen`-byte digest, as libsodium's crypto_generichash.
/// `mac` comes from EVP_MAC_fetch(NULL, "BLAKE2BMAC", NULL). Returns 1 on success.
static inline int coffer_blake2b_keyed(EVP_MAC *mac, const uint8_t *key, size_t keylen,
                                       const uint8_t *in, size_t inlen, uint8_t *out, size_t outlen) {
    OSSL_PARAM params[] = { OSSL_PARAM_construct_size_t(OSSL_MAC_PARAM_SIZE, &outlen), OSSL_PARAM_END };
    return coffer_mac(mac, params, key, keylen, in, inlen, out, outlen);
}

/// HMAC-SHA-256 (RFC 2104) of `in` under `key`, written out over SHA-256: 32 bytes to `out`.
/// `sha256` comes from EVP_MD_fetch(NULL, "SHA256", NULL). Returns 1 on success. Setting up
/// libcrypto's HMAC instead (a MAC context, the digest fetched by name on every init) was about
/// two thirds of the cost of a small file's chunk id; here it is one digest context, reused
/// for both passes.
static inline int coffer_hmac_sha256(EVP_MD *sha256, const uint8_t *key, size_t keylen,
                                     const uint8_t *in, size_t inlen, uint8_t out[32]) {
    unsigned char block[64] = { 0 }, pad[64], inner[32];
    unsigned int n = 0;
    EVP_MD_CTX *c = EVP_MD_CTX_new();
    if (c == NULL) return 0;
    int ok = 1;
    if (keylen > 64) {
        ok = EVP_DigestInit_ex2(c, sha256, NULL) && EVP_DigestUpdate(c, key, keylen) && EVP_DigestFinal_ex(c, block, &n);
    } else if (keylen > 0) {
        memcpy(block, key, keylen);
    }
    for (int i = 0; i < 64; i++) pad[i] = block[i] ^ 0x36;
    ok = ok && EVP_DigestInit_ex2(c, sha256, NULL) && EVP_DigestUpdate(c, pad, 64)
        && EVP_DigestUpdate(c, in, inlen) && EVP_DigestFinal_ex(c, inner, &n) && n == 32;
    for (int i = 0; i < 64; i++) pad[i] = block[i] ^ 0x5c;
    ok = ok && EVP_DigestInit_ex2(c, sha256, NULL) && EVP_DigestUpdate(c, pad, 64)
        && EVP_DigestUpdate(c, inner, 32) && EVP_DigestFinal_ex(c, out, &n) && n == 32;
    EVP_MD_CTX_free(c);
    OPENSSL_cleanse(block, sizeof(block));
    OPENSSL_cleanse(pad, sizeof(pad));
    OPENSSL_cleanse(inner, sizeof(inner));
    return ok;
}

/// ChaCha20-Poly1305 IETF (RFC 8439): `in` -> `out` (same length), then the 16-byte `tag`.
/// Returns 1 on success.
static inline int coffer_chacha20poly1305_seal(const uint8_t key[32], const uint8_t nonce[12],
                                               const uint8_t *ad, size_t adlen,
                                               const uint8_t *in, size_t inlen, uint8_t *out, uint8_t tag[16]) {
    EVP_CIPHER_CTX *ctx = EVP_CIPHER_CTX_new();
    if (ctx == NULL) return 0;
    int len = 0, ok = 1;
    ok = ok && EVP_EncryptInit_ex(ctx, EVP_chacha20_poly1305(), NULL, key, nonce);
    ok = ok && (adlen == 0 || EVP_EncryptUpdate(ctx, NULL, &len, ad, (int)adlen));
    ok = ok && (inlen == 0 || EVP_EncryptUpdate(ctx, out, &len, in, (int)inlen));
    ok = ok && EVP_EncryptFinal_ex(ctx, out + (inlen == 0 ? 0 : len), &len);
    ok = ok && EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_AEAD_GET_TAG, 16, tag);
    EVP_CIPHER_CTX_free(ctx);
    return ok;
}

/// The inverse of `coffer_chacha20poly1305_seal`. Returns 1 only if the tag verifies; `out`
/// must then be used, and otherwise ignored.
static inline int coffer_chacha20poly1305_open(const uint8_t key[32], const uint8_t nonce[12],
                                               const uint8_t *ad, size_t adlen,
                                               const uint8_t *in, size_t inlen, const uint8_t tag[16], uint8_t *out) {
    EVP_CIPHER_CTX *ctx = EVP_CIPHER_CTX_new();
    if (ctx == NULL) return 0;
    int len = 0, ok = 1;
    ok = ok && EVP_DecryptInit_ex(ctx, EVP_chacha20_poly1305(), NULL, key, nonce);
    ok = ok && (adlen == 0 || EVP_DecryptUpdate(ctx, NULL, &len, ad, (int)adlen));
    ok = ok && (inlen == 0 || EVP_DecryptUpdate(ctx, out, &len, in, (int)inlen));
    ok = ok && EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_AEAD_SET_TAG, 16, (void *)tag);
    ok = ok && EVP_DecryptFinal_ex(ctx, out + (inlen == 0 ? 0 : len), &len) > 0;
    EVP_CIPHER_CTX_free(ctx);
    return ok;
}

/// 1 if the CPU has AVX-512F: libcrypto's ChaCha20 and Poly1305 then run on 512-bit vectors and
/// beat BoringSSL's stitched AVX2 pass, which wins everywhere else (`Bulk.engine(for:)`).
static inline int coffer_cpu_has_avx512f(void) {
#if defined(__x86_64__)
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") ? 1 : 0;
#else
    return 0;
#endif
}

#endif
