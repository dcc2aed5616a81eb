// XChaCha20-Poly1305 through BoringSSL, which the binaries already carry for TLS (swift-nio-ssl
// vendors it as CNIOBoringSSL). BoringSSL computes ChaCha20 and Poly1305 in one stitched AVX2
// pass, where libcrypto and libsodium make two passes over the data (see CofferCrypto's
// `Bulk`). A C target of its own with a header free of OpenSSL types: BoringSSL's headers and
// OpenSSL's (COpenSSL) define the same C types differently, and Swift cannot load both into one
// module.
#ifndef COFFER_BORING_AEAD_H
#define COFFER_BORING_AEAD_H

#include <stddef.h>
#include <stdint.h>

/// Seals `in` (`inlen` bytes) under a 32-byte key and 24-byte nonce with `ad`, writing the
/// ciphertext then the 16-byte tag to `out` (`inlen + 16` bytes): libsodium's
/// crypto_aead_xchacha20poly1305_ietf_encrypt, byte for byte. Returns 1 on success.
int coffer_boring_xchacha_seal(const uint8_t *key, const uint8_t *nonce, const uint8_t *ad, size_t adlen,
                               const uint8_t *in, size_t inlen, uint8_t *out);

/// Opens `in` (ciphertext then tag, `inlen` >= 16 bytes) into `out` (`inlen - 16` bytes).
/// Returns 1 only if the tag verified.
int coffer_boring_xchacha_open(const uint8_t *key, const uint8_t *nonce, const uint8_t *ad, size_t adlen,
                               const uint8_t *in, size_t inlen, uint8_t *out);

#endif
