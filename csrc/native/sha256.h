/* sha256.h — SHA-256 (FIPS 180-4), for the weights check of a compiled model (runtime.c).
 * Streaming: init, update any number of times, final. Not part of the public ABI. */
#ifndef IGNIS_NATIVE_SHA256_H
#define IGNIS_NATIVE_SHA256_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    uint32_t h[8];
    uint64_t n_bytes;        /* bytes hashed so far */
    uint8_t  buf[64];        /* a block being filled */
    int      buf_len;
} ig_sha256_ctx;

void ig_sha256_init(ig_sha256_ctx *c);
void ig_sha256_update(ig_sha256_ctx *c, const void *data, size_t n);
void ig_sha256_final(ig_sha256_ctx *c, uint8_t digest[32]);
/* digest of one buffer, and as 64 lowercase hex characters plus NUL */
void ig_sha256(uint8_t digest[32], const void *data, size_t n);
void ig_sha256_hex(char out[65], const uint8_t digest[32]);

#endif
