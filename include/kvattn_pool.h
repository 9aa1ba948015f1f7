/*
 * kvattn_pool.h - the block pool with prefix caching (host-side, device-agnostic).
 * Included by kvattn.h; may be included on its own.
 */
#ifndef KVATTN_POOL_H
#define KVATTN_POOL_H

#include "kvattn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Block pool with prefix caching (host-side, device-agnostic)              */
/* ------------------------------------------------------------------------ */

/*
 * The pool hands out the NB blocks of a paged cache to requests and caches
 * full blocks by content so that a later prompt with the same prefix reuses
 * them (vLLM's automatic prefix caching). It never touches K/V memory: it
 * produces the block-table rows (kva_plan_desc.block_table) and the slot
 * mappings (kva_cache_write) that the engine passes to the rest of the API.
 *
 * Block 0 is the null block: it pads block-table rows and replaces blocks
 * that fell out of a sliding window; it is never handed out or freed.
 * A request's tokens are the positions whose KV has been computed; an engine
 * step is: kva_pool_request_add (prefix lookup) -> kva_pool_request_allocate
 * -> kva_pool_request_block_table / kva_pool_request_slots -> run the model ->
 * kva_pool_request_append_tokens (records the computed tokens and caches the
 * blocks that became full) -> ... -> kva_pool_request_free. docs/pool.md has
 * the invariants, the eviction policy and the hash chain.
 *
 * Request ids are small non-negative integers; the id of a freed request may
 * be reused by a later kva_pool_request_add or kva_pool_request_fork.
 * A pool may be used from one thread at a time. Outputs follow kvattn.h's
 * Aliasing rule: kva_pool_request_add's out_request_id and
 * out_num_cached_tokens, kva_pool_request_fork's out_request_id and
 * out_copy, and kva_pool_request_block_table's row and out_num_blocks
 * overlapping each other (or add's outputs overlapping prompt_tokens or
 * extra_key) get KVA_STATUS_INVALID_ARGUMENT, and the pool is unchanged.
 */

/* Each hash needs its library at build time (CMake KVA_WITH_OPENSSL,
 * KVA_WITH_XXHASH, both ON by default): kva_pool_create with prefix caching
 * on and a hash the build left out fails with KVA_STATUS_UNSUPPORTED; a
 * pool without prefix caching hashes nothing and works in every build. */
typedef enum kva_pool_hash {
    KVA_POOL_HASH_SHA256 = 0,   /* default: SHA-256 (libcrypto), 32-byte hashes,
                                   collision-resistant across tenants */
    KVA_POOL_HASH_XXH3_128 = 1, /* XXH3-128 (libxxhash), 16-byte hashes: faster,
                                   not safe against adversarial prompts */
    KVA_POOL_HASH_COUNT_
} kva_pool_hash;

typedef struct kva_pool_desc {
    int32_t num_blocks;            /* NB, 2 .. 2^30, including the null block 0 */
    int32_t block_size;            /* B, 1 .. 65536 tokens per block */
    kva_pool_hash hash;            /* block hash function (0 = SHA-256) */
    int32_t enable_prefix_caching; /* 1 to cache full blocks by content, 0 not to */
} kva_pool_desc;

typedef struct kva_pool_stats {
    int32_t num_blocks;         /* NB - 1: blocks that can be handed out */
    int32_t num_used_blocks;    /* blocks held by at least one request */
    int32_t num_free_blocks;    /* blocks in the free queue (cached or empty) */
    int32_t num_cached_blocks;  /* blocks holding a cached hash (used or free) */
    int32_t num_requests;       /* live requests */
    double usage;               /* num_used_blocks / num_blocks */
    int64_t query_tokens;       /* prompt tokens looked up (prefix caching on) */
    int64_t hit_tokens;         /* of those, tokens served from the cache */
    double hit_rate;            /* hit_tokens / query_tokens, 0 when none */
    int64_t num_evicted_blocks; /* cached blocks whose hash was dropped for reuse */
} kva_pool_stats;

typedef struct kva_pool_request_info {
    int32_t num_tokens;        /* computed tokens (KV written) */
    int32_t num_blocks;        /* length of the block-table row (null blocks included) */
    int32_t num_cached_tokens; /* tokens served from the cache by kva_pool_request_add */
} kva_pool_request_info;

typedef struct kva_pool kva_pool;

/* Creates a pool of desc->num_blocks blocks, all free; block 0 is the null block. */
KVA_API kva_status kva_pool_create(const kva_pool_desc *desc, kva_pool **out);
/* Frees the pool and every live request. NULL is a no-op. */
KVA_API void kva_pool_destroy(kva_pool *pool);

/*
 * Adds a request with prompt_tokens [n] (n >= 1) and an optional extra key
 * (extra_len bytes, at most 65536, e.g. an adapter id or a per-tenant cache
 * salt; NULL when extra_len is 0) that separates its cache entries from other
 * keys'. Looks up
 * the prefix cache block by block and takes the hit blocks; the hit is capped
 * so that at least one prompt token is recomputed. *out_num_cached_tokens
 * (may be NULL) receives the hit in tokens, a multiple of B, which is also the
 * request's number of computed tokens.
 */
KVA_API kva_status kva_pool_request_add(kva_pool *pool, const int32_t *prompt_tokens, int32_t n,
                                        const void *extra_key, size_t extra_len,
                                        int32_t *out_request_id, int32_t *out_num_cached_tokens);

/*
 * Makes the request's blocks cover num_tokens + num_new_tokens +
 * num_lookahead_tokens positions (lookahead = speculative tokens), taking
 * blocks from the head of the free queue. Fails with KVA_STATUS_POOL_EXHAUSTED
 * and changes nothing when too few blocks are free.
 */
KVA_API kva_status kva_pool_request_allocate(kva_pool *pool, int32_t request_id,
                                             int32_t num_new_tokens, int32_t num_lookahead_tokens);

/*
 * Records tokens [n] as computed at positions num_tokens .. num_tokens + n - 1
 * (their KV has been written) and, with prefix caching on, caches every block
 * that became full. The positions must be allocated.
 */
KVA_API kva_status kva_pool_request_append_tokens(kva_pool *pool, int32_t request_id,
                                                  const int32_t *tokens, int32_t n);

/*
 * Creates a request that shares src's computed prefix (parallel sampling):
 * the full blocks are shared (reference counts incremented); a partial last
 * block is copied into a fresh block, and out_copy [2] receives the (src, dst)
 * block ids to pass to kva_cache_copy_blocks, or {-1, -1} when there is none.
 * Fails with KVA_STATUS_POOL_EXHAUSTED, changing nothing, if the copy has no block.
 */
KVA_API kva_status kva_pool_request_fork(kva_pool *pool, int32_t src_request_id,
                                         int32_t *out_request_id, int32_t *out_copy);

/* Releases the request's blocks, last block first (so tail blocks are evicted
 * first), and forgets the request. */
KVA_API kva_status kva_pool_request_free(kva_pool *pool, int32_t request_id);

/*
 * Sliding window: releases the blocks whose positions all lie before
 * num_tokens - window_tokens (the next token at position num_tokens attends
 * to keys >= num_tokens - window_tokens) and puts the null block 0 in their
 * place in the block table. window_tokens >= 0.
 */
KVA_API kva_status kva_pool_request_drop_window(kva_pool *pool, int32_t request_id,
                                                int32_t window_tokens);

/*
 * Chunked local attention (kva_plan_desc.attention_chunk = chunk_tokens):
 * releases the blocks whose positions all lie before the start of the chunk
 * of the next token, num_tokens - num_tokens % chunk_tokens (that token and
 * every later one attend to keys from there on; vLLM's chunked-local
 * manager), and puts the null block 0 in their place in the block table. A
 * block that straddles the chunk start is kept. chunk_tokens >= 1.
 */
KVA_API kva_status kva_pool_request_drop_chunk(kva_pool *pool, int32_t request_id,
                                               int32_t chunk_tokens);

/* Writes the request's block-table row: row [row_len] int32 receives its
 * num_blocks block ids then 0 (the null block) up to row_len. row may be NULL
 * when row_len is 0 to query *out_num_blocks (may be NULL) only. */
KVA_API kva_status kva_pool_request_block_table(const kva_pool *pool, int32_t request_id,
                                                int32_t *row, int32_t row_len,
                                                int32_t *out_num_blocks);

/* Writes slots [count] int64 for positions first_pos .. first_pos + count - 1:
 * slot = block * B + position % B. Every position must be allocated and not
 * dropped by kva_pool_request_drop_window or kva_pool_request_drop_chunk. */
KVA_API kva_status kva_pool_request_slots(const kva_pool *pool, int32_t request_id,
                                          int32_t first_pos, int32_t count, int64_t *slots);

/* Token and block counts of a live request. */
KVA_API kva_status kva_pool_request_get_info(const kva_pool *pool, int32_t request_id,
                                             kva_pool_request_info *out);

/* Block counts and prefix-cache hit statistics. */
KVA_API kva_status kva_pool_get_stats(const kva_pool *pool, kva_pool_stats *out);

/* Drops every cached hash (e.g. after new weights are loaded). Refused with
 * KVA_STATUS_INVALID_ARGUMENT, changing nothing, while any block is in use. */
KVA_API kva_status kva_pool_reset_prefix_cache(kva_pool *pool);

/* Checks every pool invariant (docs/pool.md); KVA_STATUS_INTERNAL with a
 * message naming the first violation, KVA_STATUS_OK if all hold. */
KVA_API kva_status kva_pool_check(const kva_pool *pool);

#ifdef __cplusplus
}
#endif

#endif /* KVATTN_POOL_H */
