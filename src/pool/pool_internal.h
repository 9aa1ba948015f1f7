/*
 * pool_internal.h - the block pool's data structures, shared by the files of
 * src/pool/ (pool.c: free queue, hash map, stats, checker; pool_hash.c: block
 * hashes; pool_request.c: the request API). Never installed.
 */
#ifndef KVA_POOL_INTERNAL_H
#define KVA_POOL_INTERNAL_H

#include "internal.h"

#include <stddef.h>
#include <stdint.h>

/* Bytes of the largest block hash (SHA-256). */
#define KVA_POOL_MAX_HASH 32
/* Largest extra key in bytes. */
#define KVA_POOL_MAX_EXTRA ((size_t)1 << 16)
/* Largest block size and number of blocks a pool accepts. */
#define KVA_POOL_MAX_BLOCK_SIZE 65536
#define KVA_POOL_MAX_BLOCKS (1 << 30)

/* Per-block bookkeeping. A non-null block is in exactly one of three states:
 * in use (ref > 0, not queued), free and cached (ref 0, queued, has_hash) or
 * free and empty (ref 0, queued, no hash). In-use blocks may hold a hash too. */
typedef struct kva__pool_block {
    int32_t ref;  /* requests whose block table holds this block */
    int32_t prev; /* free-queue neighbours, -1 at the ends */
    int32_t next;
    int32_t dup_prev; /* other cached blocks with the same hash; the map points */
    int32_t dup_next; /* at the one whose dup_prev is -1 */
    uint8_t in_queue; /* 1 while in the free queue */
    uint8_t has_hash; /* 1 while the block's hash is in the map */
} kva__pool_block;

typedef struct kva__pool_request {
    int32_t *blocks; /* [num_blocks] block-table row, 0 for dropped blocks */
    int32_t num_blocks;
    int32_t cap_blocks;
    int32_t *tokens; /* [num_tokens] computed token ids */
    int32_t num_tokens;
    int32_t cap_tokens;
    uint8_t *hashes; /* [num_hashes, hash_len] hash of each full block (caching on) */
    int32_t num_hashes;
    int32_t cap_hashes;
    uint8_t *extra; /* [extra_len] copy of the extra key, or NULL */
    size_t extra_len;
    int32_t num_cached_tokens;
} kva__pool_request;

struct kva_pool {
    kva_pool_desc desc;
    size_t hash_len;         /* 32 (SHA-256) or 16 (XXH3-128) */
    kva__pool_block *blocks; /* [NB] */
    uint8_t *block_hashes;   /* [NB, hash_len], valid where has_hash */
    int32_t free_head;       /* least recently freed block, -1 if none */
    int32_t free_tail;       /* most recently freed block, -1 if none */
    int32_t num_free;
    int32_t num_cached; /* blocks with has_hash */
    int32_t *map;       /* [map_mask + 1] open addressing, linear probing:
                           block id of a hash's first block, -1 empty */
    uint32_t map_mask;
    int32_t map_count;        /* distinct hashes in the map */
    void *md_ctx;             /* EVP_MD_CTX for SHA-256 */
    void *md;                 /* EVP_MD fetched once (OpenSSL 3), or NULL */
    void *xxh_state;          /* XXH3_state_t for XXH3-128 */
    uint8_t *scratch;         /* [hash_len + 4 * B + 8] serialized block */
    kva__pool_request **reqs; /* [cap_reqs], NULL where no live request */
    int32_t cap_reqs;
    int32_t num_reqs;
    int32_t *free_ids; /* [cap_reqs] stack of unused ids below cap_reqs */
    int32_t num_free_ids;
    int64_t query_tokens;
    int64_t hit_tokens;
    int64_t num_evicted;
};

/* ---- pool.c ---- */

/* Removes block b from the free queue (O(1), from anywhere in it). */
void kva__pool_queue_remove(kva_pool *pool, int32_t b);
/* Appends block b at the tail (most recently freed end) of the free queue. */
void kva__pool_queue_push_tail(kva_pool *pool, int32_t b);
/* First cached block whose hash equals hash [hash_len], or -1. */
int32_t kva__pool_map_find(const kva_pool *pool, const uint8_t *hash);
/* Records hash [hash_len] as block b's and adds it to the map (b must have none). */
void kva__pool_cache_insert(kva_pool *pool, int32_t b, const uint8_t *hash);
/* Takes the least recently freed block: out of the queue, its hash evicted,
 * ref 1. The caller has checked that num_free > 0. */
int32_t kva__pool_take_free(kva_pool *pool);
/* Adds a reference to block b (a prefix hit or a shared block), reviving it
 * from the free queue if it was free. */
void kva__pool_ref(kva_pool *pool, int32_t b);
/* Drops a reference to block b; at 0 it goes to the free queue tail. The null
 * block is ignored. */
void kva__pool_release(kva_pool *pool, int32_t b);
/* The live request with this id, or NULL after setting a message naming it. */
kva__pool_request *kva__pool_find_request(const kva_pool *pool, int32_t request_id,
                                          const char *func);

/* ---- pool_request.c ---- */

/* Frees a request's arrays and the request itself (NULL is a no-op); it does
 * not release its blocks. */
void kva__pool_request_delete(kva__pool_request *r);

/* ---- pool_hash.c ---- */

/* Sets up the pool's hasher for desc.hash; fills hash_len. */
kva_status kva__pool_hash_init(kva_pool *pool);
void kva__pool_hash_release(kva_pool *pool);
/* Hash of one full block: parent [hash_len] (NULL for the first block),
 * tokens [B], extra [extra_len]; out [hash_len]. */
kva_status kva__pool_hash_block(kva_pool *pool, const uint8_t *parent, const int32_t *tokens,
                                const uint8_t *extra, size_t extra_len, uint8_t *out);
/* One-shot digest of bytes with the given function (out: 32 or 16 bytes);
 * used by the tests to compare against published vectors. */
kva_status kva__pool_digest(kva_pool_hash hash, const void *data, size_t len, uint8_t *out);

#endif /* KVA_POOL_INTERNAL_H */
