#include "coffer_boring_aead.h"

#include <CNIOBoringSSL_aead.h>
#include <CNIOBoringSSL_mem.h>

// The context holds the key in the clear: it lives on the stack and is wiped after each call.
// Setting one up is cheap for ChaCha20-Poly1305 (a key copy), so nothing is cached.
static int with_context(const uint8_t *key, EVP_AEAD_CTX *ctx) {
    const EVP_AEAD *aead = EVP_aead_xchacha20_poly1305();
    EVP_AEAD_CTX_zero(ctx);
    return aead != NULL && EVP_AEAD_CTX_init(ctx, aead, key, 32, 16, NULL) == 1;
}

static void wipe(EVP_AEAD_CTX *ctx) {
    EVP_AEAD_CTX_cleanup(ctx);
    OPENSSL_cleanse(ctx, sizeof(*ctx));
}

int coffer_boring_xchacha_seal(const uint8_t *key, const uint8_t *nonce, const uint8_t *ad, size_t adlen,
                               const uint8_t *in, size_t inlen, uint8_t *out) {
    EVP_AEAD_CTX ctx;
    size_t written = 0;
    int ok = with_context(key, &ctx)
        && EVP_AEAD_CTX_seal(&ctx, out, &written, inlen + 16, nonce, 24, in, inlen, ad, adlen) == 1
        && written == inlen + 16;
    wipe(&ctx);
    return ok;
}

int coffer_boring_xchacha_open(const uint8_t *key, const uint8_t *nonce, const uint8_t *ad, size_t adlen,
                               const uint8_t *in, size_t inlen, uint8_t *out) {
    if (inlen < 16) return 0;
    EVP_AEAD_CTX ctx;
    size_t written = 0;
    int ok = with_context(key, &ctx)
        && EVP_AEAD_CTX_open(&ctx, out, &written, inlen - 16, nonce, 24, in, inlen, ad, adlen) == 1
        && written == inlen - 16;
    wipe(&ctx);
    return ok;
}
