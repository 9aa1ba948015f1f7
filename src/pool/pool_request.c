/*
 * pool_request.c - the block pool's requests: prefix lookup on add, block
 * allocation, recording computed tokens (which caches full blocks), forking,
 * sliding-window drops, freeing, and the block-table and slot outputs.
 *
 * Every entry point validates all arguments and reserves all memory it may
 * need before it changes anything, so a failing call leaves the pool as it was.
 */
#include "pool_internal.h"

#include <stdlib.h>
#include <string.h>

void kva__pool_request_delete(kva__pool_request *r)
{
    if (r == NULL)
        return;
    free(r->blocks);
    free(r->tokens);
    free(r->hashes);
    free(r->extra);
    free(r);
}

/* Grows *arr (elements of elem bytes) to hold at least need elements. Returns
 * 0 if memory ran out; *arr and *cap are then unchanged. */
static int grow(void **arr, int32_t *cap, int64_t need, size_t elem)
{
    if (need <= *cap)
        return 1;
    int64_t c = *cap > 0 ? *cap : 4;
    while (c < need)
        c *= 2;
    if (c > INT32_MAX)
        c = need;
    void *p = realloc(*arr, (size_t)c * elem);
    if (p == NULL)
        return 0;
    *arr = p;
    *cap = (int32_t)c;
    return 1;
}

#define GROW(arr, cap, need, elem) grow((void **)&(arr), &(cap), (need), (elem))

/* Makes sure an unused request id is available (free_ids non-empty). */
static kva_status reserve_id(kva_pool *pool, const char *func)
{
    if (pool->num_free_ids > 0)
        return KVA_STATUS_OK;
    int32_t old = pool->cap_reqs, cap = old > 0 ? 2 * old : 16;
    if (old >= INT32_MAX / 2)
        return kva__fail(KVA_STATUS_OUT_OF_RANGE, "%s: too many live requests (%d)", func,
                         (int)old);
    kva__pool_request **reqs = realloc(pool->reqs, (size_t)cap * sizeof *reqs);
    if (reqs == NULL)
        return kva__fail(KVA_STATUS_OUT_OF_MEMORY, "%s: out of memory for request ids", func);
    pool->reqs = reqs;
    int32_t *ids = realloc(pool->free_ids, (size_t)cap * sizeof *ids);
    if (ids == NULL)
        return kva__fail(KVA_STATUS_OUT_OF_MEMORY, "%s: out of memory for request ids", func);
    pool->free_ids = ids;
    for (int32_t i = old; i < cap; i++)
        reqs[i] = NULL;
    /* Pushed in descending order so the lowest id is handed out first. */
    for (int32_t i = cap - 1; i >= old; i--)
        ids[pool->num_free_ids++] = i;
    pool->cap_reqs = cap;
    return KVA_STATUS_OK;
}

/* Registers r under the id reserve_id made available. */
static int32_t install_request(kva_pool *pool, kva__pool_request *r)
{
    int32_t id = pool->free_ids[--pool->num_free_ids];
    pool->reqs[id] = r;
    pool->num_reqs++;
    return id;
}

/* A new request with room for the given counts and a copy of the extra key. */
static kva__pool_request *new_request(const kva_pool *pool, int32_t cap_blocks, int32_t cap_tokens,
                                      int32_t cap_hashes, const void *extra, size_t extra_len)
{
    kva__pool_request *r = calloc(1, sizeof *r);
    if (r == NULL)
        return NULL;
    int ok = GROW(r->blocks, r->cap_blocks, cap_blocks > 0 ? cap_blocks : 1, sizeof(int32_t)) &&
             GROW(r->tokens, r->cap_tokens, cap_tokens > 0 ? cap_tokens : 1, sizeof(int32_t)) &&
             GROW(r->hashes, r->cap_hashes, cap_hashes > 0 ? cap_hashes : 1, pool->hash_len);
    if (ok && extra_len > 0) {
        r->extra = malloc(extra_len);
        ok = r->extra != NULL;
        if (ok)
            memcpy(r->extra, extra, extra_len);
        r->extra_len = extra_len;
    }
    if (!ok) {
        kva__pool_request_delete(r);
        return NULL;
    }
    return r;
}

kva_status kva_pool_request_add(kva_pool *pool, const int32_t *prompt_tokens, int32_t n,
                                const void *extra_key, size_t extra_len, int32_t *out_request_id,
                                int32_t *out_num_cached_tokens)
{
    kva__clear_error();
    KVA_CHECK_PTR(pool);
    KVA_CHECK_PTR(prompt_tokens);
    KVA_CHECK_PTR(out_request_id);
    if (n < 1)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT, "%s: n %d must be >= 1", __func__, (int)n);
    if (extra_len > 0 && extra_key == NULL)
        return kva__fail(KVA_STATUS_NULL_POINTER,
                         "%s: argument 'extra_key' is NULL but extra_len is %zu", __func__,
                         extra_len);
    if (extra_len > KVA_POOL_MAX_EXTRA)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT, "%s: extra_len %zu exceeds %zu", __func__,
                         extra_len, KVA_POOL_MAX_EXTRA);
    const kva__span outs[2] = {
        {"out_request_id", out_request_id, sizeof(int32_t), 0, 0},
        {"out_num_cached_tokens", out_num_cached_tokens, sizeof(int32_t), 0, 0}};
    const kva__span ins[2] = {{"prompt_tokens", prompt_tokens, (size_t)n * sizeof(int32_t), 0, 0},
                              {"extra_key", extra_key, extra_len, 0, 0}};
    KVA_TRY(kva__check_disjoint(__func__, outs, 2, ins, 2));
    KVA_TRY(reserve_id(pool, __func__));

    int32_t bs = pool->desc.block_size, caching = pool->desc.enable_prefix_caching;
    int32_t max_hit = caching ? (n - 1) / bs : 0;
    kva__pool_request *r =
        new_request(pool, (int32_t)(((int64_t)n + bs - 1) / bs), n, max_hit, extra_key, extra_len);
    if (r == NULL)
        return kva__fail(KVA_STATUS_OUT_OF_MEMORY,
                         "%s: out of memory for a request of %d "
                         "tokens",
                         __func__, (int)n);

    /* Lookup, read-only: block i hits if its chained hash is in the map. The
     * cap (n - 1) / B keeps at least one prompt token to compute. */
    int32_t hits = 0;
    size_t hl = pool->hash_len;
    for (int32_t i = 0; i < max_hit; i++) {
        uint8_t *h = r->hashes + (size_t)i * hl;
        kva_status st = kva__pool_hash_block(
            pool, i > 0 ? h - hl : NULL, prompt_tokens + (size_t)i * bs, r->extra, r->extra_len, h);
        if (st != KVA_STATUS_OK) {
            kva__pool_request_delete(r);
            return st;
        }
        int32_t b = kva__pool_map_find(pool, h);
        if (b < 0)
            break;
        r->blocks[hits++] = b;
    }

    /* Commit: take the hit blocks, reviving free ones out of the queue. */
    for (int32_t i = 0; i < hits; i++)
        kva__pool_ref(pool, r->blocks[i]);
    r->num_blocks = hits;
    r->num_hashes = hits;
    r->num_tokens = hits * bs;
    r->num_cached_tokens = hits * bs;
    memcpy(r->tokens, prompt_tokens, (size_t)r->num_tokens * sizeof(int32_t));
    if (caching) {
        pool->query_tokens += n;
        pool->hit_tokens += r->num_cached_tokens;
    }
    *out_request_id = install_request(pool, r);
    if (out_num_cached_tokens != NULL)
        *out_num_cached_tokens = r->num_cached_tokens;
    return KVA_STATUS_OK;
}

kva_status kva_pool_request_allocate(kva_pool *pool, int32_t request_id, int32_t num_new_tokens,
                                     int32_t num_lookahead_tokens)
{
    kva__clear_error();
    KVA_CHECK_PTR(pool);
    kva__pool_request *r = kva__pool_find_request(pool, request_id, __func__);
    if (r == NULL)
        return KVA_STATUS_OUT_OF_RANGE;
    if (num_new_tokens < 0 || num_lookahead_tokens < 0)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "%s: num_new_tokens %d and num_lookahead_tokens %d must be >= 0", __func__,
                         (int)num_new_tokens, (int)num_lookahead_tokens);
    int64_t bs = pool->desc.block_size;
    int64_t total = (int64_t)r->num_tokens + num_new_tokens + num_lookahead_tokens;
    if (total > INT32_MAX)
        return kva__fail(KVA_STATUS_OUT_OF_RANGE,
                         "%s: request %d would hold %lld tokens (more than INT32_MAX)", __func__,
                         (int)request_id, (long long)total);
    int64_t need_blocks = (total + bs - 1) / bs;
    int64_t need = need_blocks - r->num_blocks;
    if (need <= 0)
        return KVA_STATUS_OK;
    if (need > pool->num_free)
        return kva__fail(KVA_STATUS_POOL_EXHAUSTED,
                         "%s: request %d needs %lld more blocks for %lld tokens but %d are "
                         "free",
                         __func__, (int)request_id, (long long)need, (long long)total,
                         (int)pool->num_free);
    if (!GROW(r->blocks, r->cap_blocks, need_blocks, sizeof(int32_t)))
        return kva__fail(KVA_STATUS_OUT_OF_MEMORY, "%s: out of memory for %lld blocks", __func__,
                         (long long)need_blocks);
    while (r->num_blocks < need_blocks)
        r->blocks[r->num_blocks++] = kva__pool_take_free(pool);
    return KVA_STATUS_OK;
}

kva_status kva_pool_request_append_tokens(kva_pool *pool, int32_t request_id, const int32_t *tokens,
                                          int32_t n)
{
    kva__clear_error();
    KVA_CHECK_PTR(pool);
    kva__pool_request *r = kva__pool_find_request(pool, request_id, __func__);
    if (r == NULL)
        return KVA_STATUS_OUT_OF_RANGE;
    if (n < 0)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT, "%s: n %d must be >= 0", __func__, (int)n);
    if (n == 0)
        return KVA_STATUS_OK;
    KVA_CHECK_PTR(tokens);
    int64_t bs = pool->desc.block_size;
    int64_t end = (int64_t)r->num_tokens + n;
    if (end > (int64_t)r->num_blocks * bs)
        return kva__fail(KVA_STATUS_OUT_OF_RANGE,
                         "%s: positions %d..%lld of request %d are not allocated (it has %lld "
                         "slots; call kva_pool_request_allocate first)",
                         __func__, (int)r->num_tokens, (long long)end - 1, (int)request_id,
                         (long long)r->num_blocks * bs);
    int32_t caching = pool->desc.enable_prefix_caching;
    int32_t old_full = r->num_hashes, new_full = caching ? (int32_t)(end / bs) : 0;
    if (!GROW(r->tokens, r->cap_tokens, end, sizeof(int32_t)) ||
        !GROW(r->hashes, r->cap_hashes, new_full, pool->hash_len))
        return kva__fail(KVA_STATUS_OUT_OF_MEMORY, "%s: out of memory for %lld tokens", __func__,
                         (long long)end);

    /* Stage the tokens and the new blocks' hashes past the committed counts,
     * so that a hashing failure changes nothing visible. */
    memcpy(r->tokens + r->num_tokens, tokens, (size_t)n * sizeof(int32_t));
    size_t hl = pool->hash_len;
    for (int32_t i = old_full; i < new_full; i++) {
        uint8_t *h = r->hashes + (size_t)i * hl;
        KVA_TRY(kva__pool_hash_block(pool, i > 0 ? h - hl : NULL, r->tokens + (size_t)i * bs,
                                     r->extra, r->extra_len, h));
    }

    r->num_tokens = (int32_t)end;
    for (int32_t i = old_full; i < new_full; i++) {
        int32_t b = r->blocks[i];
        if (b != 0 && !pool->blocks[b].has_hash)
            kva__pool_cache_insert(pool, b, r->hashes + (size_t)i * hl);
    }
    r->num_hashes = new_full;
    return KVA_STATUS_OK;
}

kva_status kva_pool_request_fork(kva_pool *pool, int32_t src_request_id, int32_t *out_request_id,
                                 int32_t *out_copy)
{
    kva__clear_error();
    KVA_CHECK_PTR(pool);
    KVA_CHECK_PTR(out_request_id);
    KVA_CHECK_PTR(out_copy);
    const kva__span outs[2] = {{"out_copy", out_copy, 2 * sizeof(int32_t), 0, 0},
                               {"out_request_id", out_request_id, sizeof(int32_t), 0, 0}};
    KVA_TRY(kva__check_disjoint(__func__, outs, 2, NULL, 0));
    kva__pool_request *s = kva__pool_find_request(pool, src_request_id, __func__);
    if (s == NULL)
        return KVA_STATUS_OUT_OF_RANGE;
    int32_t bs = pool->desc.block_size;
    int32_t full = s->num_tokens / bs, tail = s->num_tokens % bs != 0;
    if (tail && pool->num_free == 0)
        return kva__fail(KVA_STATUS_POOL_EXHAUSTED,
                         "%s: request %d's partial last block needs a copy but no block is "
                         "free",
                         __func__, (int)src_request_id);
    KVA_TRY(reserve_id(pool, __func__));
    kva__pool_request *r =
        new_request(pool, full + tail, s->num_tokens, s->num_hashes, s->extra, s->extra_len);
    if (r == NULL)
        return kva__fail(KVA_STATUS_OUT_OF_MEMORY, "%s: out of memory forking request %d", __func__,
                         (int)src_request_id);

    memcpy(r->tokens, s->tokens, (size_t)s->num_tokens * sizeof(int32_t));
    memcpy(r->hashes, s->hashes, (size_t)s->num_hashes * pool->hash_len);
    r->num_tokens = s->num_tokens;
    r->num_hashes = s->num_hashes;
    r->num_cached_tokens = s->num_cached_tokens;
    for (int32_t i = 0; i < full; i++) {
        r->blocks[i] = s->blocks[i];
        kva__pool_ref(pool, s->blocks[i]);
    }
    r->num_blocks = full;
    out_copy[0] = out_copy[1] = -1;
    if (tail) {
        int32_t b = kva__pool_take_free(pool);
        r->blocks[r->num_blocks++] = b;
        out_copy[0] = s->blocks[full];
        out_copy[1] = b;
    }
    *out_request_id = install_request(pool, r);
    return KVA_STATUS_OK;
}

kva_status kva_pool_request_free(kva_pool *pool, int32_t request_id)
{
    kva__clear_error();
    KVA_CHECK_PTR(pool);
    kva__pool_request *r = kva__pool_find_request(pool, request_id, __func__);
    if (r == NULL)
        return KVA_STATUS_OUT_OF_RANGE;
    /* Last block first: the tail of a sequence is the least likely to be
     * shared by a later prompt, so it should be evicted first. */
    for (int32_t i = r->num_blocks - 1; i >= 0; i--)
        kva__pool_release(pool, r->blocks[i]);
    kva__pool_request_delete(r);
    pool->reqs[request_id] = NULL;
    pool->free_ids[pool->num_free_ids++] = request_id;
    pool->num_reqs--;
    return KVA_STATUS_OK;
}

/* Releases request r's blocks that end at or before position first_needed
 * (blocks 0 .. first_needed / B - 1) and puts the null block 0 in their place,
 * last first, as kva_pool_request_free does; an earlier drop already nulled
 * everything before the first null block found. */
static void drop_before(kva_pool *pool, kva__pool_request *r, int32_t first_needed)
{
    for (int32_t i = first_needed / pool->desc.block_size - 1; i >= 0; i--) {
        if (r->blocks[i] == 0)
            break;
        kva__pool_release(pool, r->blocks[i]);
        r->blocks[i] = 0;
    }
}

kva_status kva_pool_request_drop_window(kva_pool *pool, int32_t request_id, int32_t window_tokens)
{
    kva__clear_error();
    KVA_CHECK_PTR(pool);
    kva__pool_request *r = kva__pool_find_request(pool, request_id, __func__);
    if (r == NULL)
        return KVA_STATUS_OUT_OF_RANGE;
    if (window_tokens < 0)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT, "%s: window_tokens %d must be >= 0", __func__,
                         (int)window_tokens);
    const int32_t first_needed = r->num_tokens - window_tokens;
    if (first_needed > 0)
        drop_before(pool, r, first_needed);
    return KVA_STATUS_OK;
}

kva_status kva_pool_request_drop_chunk(kva_pool *pool, int32_t request_id, int32_t chunk_tokens)
{
    kva__clear_error();
    KVA_CHECK_PTR(pool);
    kva__pool_request *r = kva__pool_find_request(pool, request_id, __func__);
    if (r == NULL)
        return KVA_STATUS_OUT_OF_RANGE;
    if (chunk_tokens < 1)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT, "%s: chunk_tokens %d must be >= 1", __func__,
                         (int)chunk_tokens);
    /* The next token, at position num_tokens, sees keys from its chunk's start on. */
    drop_before(pool, r, r->num_tokens - r->num_tokens % chunk_tokens);
    return KVA_STATUS_OK;
}

kva_status kva_pool_request_block_table(const kva_pool *pool, int32_t request_id, int32_t *row,
                                        int32_t row_len, int32_t *out_num_blocks)
{
    kva__clear_error();
    KVA_CHECK_PTR(pool);
    const kva__pool_request *r = kva__pool_find_request(pool, request_id, __func__);
    if (r == NULL)
        return KVA_STATUS_OUT_OF_RANGE;
    if (row_len < 0)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT, "%s: row_len %d must be >= 0", __func__,
                         (int)row_len);
    if (row_len > 0) {
        KVA_CHECK_PTR(row);
        const kva__span outs[2] = {{"row", row, (size_t)row_len * sizeof(int32_t), 0, 0},
                                   {"out_num_blocks", out_num_blocks, sizeof(int32_t), 0, 0}};
        KVA_TRY(kva__check_disjoint(__func__, outs, 2, NULL, 0));
        if (row_len < r->num_blocks)
            return kva__fail(KVA_STATUS_OUT_OF_RANGE,
                             "%s: row_len %d is shorter than request %d's %d blocks", __func__,
                             (int)row_len, (int)request_id, (int)r->num_blocks);
        memcpy(row, r->blocks, (size_t)r->num_blocks * sizeof(int32_t));
        for (int32_t i = r->num_blocks; i < row_len; i++)
            row[i] = 0;
    }
    if (out_num_blocks != NULL)
        *out_num_blocks = r->num_blocks;
    return KVA_STATUS_OK;
}

kva_status kva_pool_request_slots(const kva_pool *pool, int32_t request_id, int32_t first_pos,
                                  int32_t count, int64_t *slots)
{
    kva__clear_error();
    KVA_CHECK_PTR(pool);
    const kva__pool_request *r = kva__pool_find_request(pool, request_id, __func__);
    if (r == NULL)
        return KVA_STATUS_OUT_OF_RANGE;
    if (first_pos < 0 || count < 0)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT, "%s: first_pos %d and count %d must be >= 0",
                         __func__, (int)first_pos, (int)count);
    if (count == 0)
        return KVA_STATUS_OK;
    KVA_CHECK_PTR(slots);
    int64_t bs = pool->desc.block_size, end = (int64_t)first_pos + count;
    if (end > (int64_t)r->num_blocks * bs)
        return kva__fail(KVA_STATUS_OUT_OF_RANGE,
                         "%s: positions %d..%lld of request %d are not allocated (it has %lld "
                         "slots)",
                         __func__, (int)first_pos, (long long)end - 1, (int)request_id,
                         (long long)r->num_blocks * bs);
    for (int64_t i = first_pos / bs; i <= (end - 1) / bs; i++)
        if (r->blocks[i] == 0)
            return kva__fail(KVA_STATUS_OUT_OF_RANGE,
                             "%s: request %d's block %lld (positions %lld..%lld) was dropped "
                             "by the sliding window",
                             __func__, (int)request_id, (long long)i, (long long)(i * bs),
                             (long long)(i * bs + bs - 1));
    for (int64_t p = first_pos; p < end; p++)
        slots[p - first_pos] = (int64_t)r->blocks[p / bs] * bs + p % bs;
    return KVA_STATUS_OK;
}

kva_status kva_pool_request_get_info(const kva_pool *pool, int32_t request_id,
                                     kva_pool_request_info *out)
{
    kva__clear_error();
    KVA_CHECK_PTR(pool);
    KVA_CHECK_PTR(out);
    const kva__pool_request *r = kva__pool_find_request(pool, request_id, __func__);
    if (r == NULL)
        return KVA_STATUS_OUT_OF_RANGE;
    out->num_tokens = r->num_tokens;
    out->num_blocks = r->num_blocks;
    out->num_cached_tokens = r->num_cached_tokens;
    return KVA_STATUS_OK;
}
