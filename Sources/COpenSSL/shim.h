// OpenSSL's libcrypto, for bulk work only (CofferCrypto's `Bulk`): its ChaCha20-Poly1305 runs
// on the CPU's widest vector unit and its SHA-256 on the SHA extensions, faster than libsodium's
// on chunk-sized inputs. The constructions stay libsodium's (XChaCha20-Poly1305 IETF,
// HMAC-SHA-256), so the bytes are the same whichever library produced them. The wrappers keep
// OpenSSL's contexts and control macros out of Swift.
#ifndef COFFER_OPENSSL_SHIM_H
#define COFFER_OPENSSL_SHIM_H

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

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
        ok = EVP_DigestInit_ex2(c, sha256, NULL) && EVP_DigestUpdate(c, key, keylen)
             && EVP_DigestFinal_ex(c, block, &n);
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
/// Returns 1 on success. The caller keeps `inlen` and `adlen` below INT_MAX.
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

/// The inverse of `coffer_chacha20poly1305_seal`; `out` may be `in` (decryption in place).
/// Returns 1 if the tag verified (`out` holds the plaintext), 0 if it did not (`out` is zeroed:
/// libcrypto decrypts before it checks the tag, and unauthenticated bytes must not linger),
/// and -1 if libcrypto could not start, before anything was read or written: only then may
/// the caller retry on the same buffers with another library.
static inline int coffer_chacha20poly1305_open(const uint8_t key[32], const uint8_t nonce[12],
                                               const uint8_t *ad, size_t adlen,
                                               const uint8_t *in, size_t inlen, const uint8_t tag[16], uint8_t *out) {
    EVP_CIPHER_CTX *ctx = EVP_CIPHER_CTX_new();
    if (ctx == NULL) return -1;
    int len = 0;
    if (!EVP_DecryptInit_ex(ctx, EVP_chacha20_poly1305(), NULL, key, nonce)
        || !EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_AEAD_SET_TAG, 16, (void *)tag)
        || (adlen > 0 && !EVP_DecryptUpdate(ctx, NULL, &len, ad, (int)adlen))) {
        EVP_CIPHER_CTX_free(ctx);
        return -1;
    }
    int ok = inlen == 0 || EVP_DecryptUpdate(ctx, out, &len, in, (int)inlen);
    ok = ok && EVP_DecryptFinal_ex(ctx, out + (inlen == 0 ? 0 : len), &len) > 0;
    EVP_CIPHER_CTX_free(ctx);
    if (!ok && inlen > 0) memset(out, 0, inlen);
    return ok ? 1 : 0;
}

#endif
