/*
 * pool_hash.c - block hashes of the prefix cache.
 *
 * A full block's hash names its parent block's hash, its B token ids and the
 * request's extra key, so equal hashes mean equal prefixes (up to the hash's
 * collision resistance). The bytes hashed are, in order: the parent hash
 * (hash_len zero bytes for a request's first block), the B token ids as
 * 4-byte little-endian integers, the extra key's length as an 8-byte
 * little-endian integer, then the extra key. Every field has a fixed size or
 * a length prefix, so two different inputs never serialize to the same bytes.
 *
 * Each hash library is optional at build time (CMake KVA_WITH_OPENSSL,
 * KVA_WITH_XXHASH, which define KVA_HAVE_OPENSSL / KVA_HAVE_XXHASH): a pool
 * whose hash was not built in works without prefix caching, and
 * kva_pool_create refuses prefix caching with KVA_STATUS_UNSUPPORTED.
 */
#include "pool_internal.h"

#include <stdlib.h>
#include <string.h>
#ifdef KVA_HAVE_OPENSSL
#include <openssl/evp.h>
#endif
#ifdef KVA_HAVE_XXHASH
#include <xxhash.h>
#endif

#ifdef KVA_HAVE_OPENSSL
/* OpenSSL 3 looks the digest up by name on every EVP_DigestInit_ex(EVP_sha256())
 * call; fetching it once per pool avoids that cost for every block. */
#if OPENSSL_VERSION_NUMBER >= 0x30000000L
#define KVA_POOL_FETCH_MD 1
#endif

static const EVP_MD *pool_md(const kva_pool *pool)
{
    return pool->md != NULL ? (const EVP_MD *)pool->md : EVP_sha256();
}
#endif

/* 1 if the hash library of `hash` was built in. */
static int hash_built(kva_pool_hash hash)
{
#ifdef KVA_HAVE_OPENSSL
    if (hash == KVA_POOL_HASH_SHA256)
        return 1;
#endif
#ifdef KVA_HAVE_XXHASH
    if (hash == KVA_POOL_HASH_XXH3_128)
        return 1;
#endif
    return 0;
}

kva_status kva__pool_hash_init(kva_pool *pool)
{
    size_t b = (size_t)pool->desc.block_size;
    pool->hash_len = pool->desc.hash == KVA_POOL_HASH_SHA256 ? 32 : 16;
    if (!hash_built(pool->desc.hash)) {
        /* Without prefix caching no block is ever hashed. */
        if (pool->desc.enable_prefix_caching)
            return kva__fail(KVA_STATUS_UNSUPPORTED,
                             "kva_pool_create: prefix caching with hash %s needs %s, which this "
                             "build of kvattn left out (CMake %s=OFF); use the other hash or "
                             "enable_prefix_caching = 0",
                             pool->desc.hash == KVA_POOL_HASH_SHA256 ? "SHA-256" : "XXH3-128",
                             pool->desc.hash == KVA_POOL_HASH_SHA256 ? "OpenSSL" : "xxHash",
                             pool->desc.hash == KVA_POOL_HASH_SHA256 ? "KVA_WITH_OPENSSL"
                                                                     : "KVA_WITH_XXHASH");
        return KVA_STATUS_OK;
    }
#ifdef KVA_HAVE_OPENSSL
    if (pool->desc.hash == KVA_POOL_HASH_SHA256) {
#ifdef KVA_POOL_FETCH_MD
        pool->md = EVP_MD_fetch(NULL, "SHA256", NULL);
#endif
        pool->md_ctx = EVP_MD_CTX_new();
        if (pool->md_ctx == NULL)
            return kva__fail(KVA_STATUS_OUT_OF_MEMORY, "kva_pool_create: EVP_MD_CTX_new failed");
    }
#endif
#ifdef KVA_HAVE_XXHASH
    if (pool->desc.hash == KVA_POOL_HASH_XXH3_128) {
        pool->xxh_state = XXH3_createState();
        if (pool->xxh_state == NULL)
            return kva__fail(KVA_STATUS_OUT_OF_MEMORY, "kva_pool_create: XXH3_createState failed");
    }
#endif
    pool->scratch = malloc(pool->hash_len + 4 * b + 8);
    if (pool->scratch == NULL)
        return kva__fail(KVA_STATUS_OUT_OF_MEMORY, "kva_pool_create: out of memory (%zu bytes)",
                         pool->hash_len + 4 * b + 8);
    return KVA_STATUS_OK;
}

void kva__pool_hash_release(kva_pool *pool)
{
#ifdef KVA_HAVE_OPENSSL
    EVP_MD_CTX_free(pool->md_ctx);
#ifdef KVA_POOL_FETCH_MD
    EVP_MD_free(pool->md);
#endif
#endif
#ifdef KVA_HAVE_XXHASH
    if (pool->xxh_state != NULL)
        XXH3_freeState(pool->xxh_state);
#endif
    free(pool->scratch);
    pool->md_ctx = NULL;
    pool->md = NULL;
    pool->xxh_state = NULL;
    pool->scratch = NULL;
}

static void put_le32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put_le64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

#ifdef KVA_HAVE_XXHASH
/* Writes the 16 bytes of an XXH3-128 result in its canonical (big-endian) form. */
static void xxh128_bytes(XXH128_hash_t h, uint8_t *out)
{
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, h);
    memcpy(out, c.digest, 16);
}
#endif

kva_status kva__pool_hash_block(kva_pool *pool, const uint8_t *parent, const int32_t *tokens,
                                const uint8_t *extra, size_t extra_len, uint8_t *out)
{
    size_t hl = pool->hash_len, b = (size_t)pool->desc.block_size;
    uint8_t *s = pool->scratch;
    if (parent != NULL)
        memcpy(s, parent, hl);
    else
        memset(s, 0, hl);
    for (size_t i = 0; i < b; i++)
        put_le32(s + hl + 4 * i, (uint32_t)tokens[i]);
    put_le64(s + hl + 4 * b, (uint64_t)extra_len);
    size_t len = hl + 4 * b + 8;

#ifdef KVA_HAVE_OPENSSL
    if (pool->desc.hash == KVA_POOL_HASH_SHA256) {
        EVP_MD_CTX *ctx = pool->md_ctx;
        unsigned int got = 0;
        if (EVP_DigestInit_ex(ctx, pool_md(pool), NULL) != 1 ||
            EVP_DigestUpdate(ctx, s, len) != 1 ||
            (extra_len > 0 && EVP_DigestUpdate(ctx, extra, extra_len) != 1) ||
            EVP_DigestFinal_ex(ctx, out, &got) != 1 || got != 32)
            return kva__fail(KVA_STATUS_INTERNAL, "block hash: libcrypto SHA-256 failed");
        return KVA_STATUS_OK;
    }
#endif
#ifdef KVA_HAVE_XXHASH
    if (pool->desc.hash == KVA_POOL_HASH_XXH3_128) {
        XXH3_state_t *st = pool->xxh_state;
        if (XXH3_128bits_reset(st) != XXH_OK || XXH3_128bits_update(st, s, len) != XXH_OK ||
            (extra_len > 0 && XXH3_128bits_update(st, extra, extra_len) != XXH_OK))
            return kva__fail(KVA_STATUS_INTERNAL, "block hash: XXH3-128 failed");
        xxh128_bytes(XXH3_128bits_digest(st), out);
        return KVA_STATUS_OK;
    }
#endif
    (void)len;
    return kva__fail(KVA_STATUS_INTERNAL, "block hash: hash %d is not built in",
                     (int)pool->desc.hash);
}

kva_status kva__pool_digest(kva_pool_hash hash, const void *data, size_t len, uint8_t *out)
{
#ifdef KVA_HAVE_OPENSSL
    if (hash == KVA_POOL_HASH_SHA256) {
        unsigned int got = 0;
        if (EVP_Digest(data, len, out, &got, EVP_sha256(), NULL) != 1 || got != 32)
            return kva__fail(KVA_STATUS_INTERNAL, "digest: libcrypto SHA-256 failed");
        return KVA_STATUS_OK;
    }
#endif
#ifdef KVA_HAVE_XXHASH
    if (hash == KVA_POOL_HASH_XXH3_128) {
        xxh128_bytes(XXH3_128bits(data, len), out);
        return KVA_STATUS_OK;
    }
#endif
    if (hash == KVA_POOL_HASH_SHA256 || hash == KVA_POOL_HASH_XXH3_128)
        return kva__fail(KVA_STATUS_UNSUPPORTED, "digest: hash %d is not built into this kvattn",
                         (int)hash);
    return kva__fail(KVA_STATUS_INVALID_ARGUMENT, "digest: hash %d is not a kva_pool_hash",
                     (int)hash);
}
