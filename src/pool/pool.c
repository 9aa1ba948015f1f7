/*
 * pool.c - the block pool: creation, the free queue, the prefix-cache hash
 * map, statistics, reset and the invariant checker. The request API lives in
 * pool_request.c, the block hashes in pool_hash.c.
 *
 * Free queue: an intrusive doubly-linked list over block ids (prev/next in
 * kva__pool_block) in eviction order, least recently freed at the head. New
 * blocks are taken from the head; released blocks join at the tail; a prefix
 * hit on a free cached block unlinks it from wherever it is in O(1).
 *
 * Hash map: open addressing with linear probing and backward-shift deletion
 * (no tombstones). A slot holds the id of the first cached block with a given
 * hash; the key is read from that block's hash, so slots are 4 bytes. Blocks
 * with the same hash (two requests computed the same prefix concurrently)
 * hang off the first one in a doubly-linked duplicate list, so every cached
 * block stays reachable and evicting one of them keeps the others findable.
 * The table has at least twice as many slots as blocks, so the load factor
 * stays below one half.
 */
#include "pool_internal.h"

#include <stdlib.h>
#include <string.h>

/* ---- free queue ---- */

void kva__pool_queue_remove(kva_pool *pool, int32_t b)
{
    kva__pool_block *k = &pool->blocks[b];
    if (k->prev >= 0)
        pool->blocks[k->prev].next = k->next;
    else
        pool->free_head = k->next;
    if (k->next >= 0)
        pool->blocks[k->next].prev = k->prev;
    else
        pool->free_tail = k->prev;
    k->prev = k->next = -1;
    k->in_queue = 0;
    pool->num_free--;
}

void kva__pool_queue_push_tail(kva_pool *pool, int32_t b)
{
    kva__pool_block *k = &pool->blocks[b];
    k->prev = pool->free_tail;
    k->next = -1;
    if (pool->free_tail >= 0)
        pool->blocks[pool->free_tail].next = b;
    else
        pool->free_head = b;
    pool->free_tail = b;
    k->in_queue = 1;
    pool->num_free++;
}

/* ---- hash map ---- */

static const uint8_t *block_hash(const kva_pool *pool, int32_t b)
{
    return pool->block_hashes + (size_t)b * pool->hash_len;
}

/* Home slot of a hash: its first 8 bytes are already uniformly distributed. */
static uint32_t home_slot(const kva_pool *pool, const uint8_t *hash)
{
    uint64_t h;
    memcpy(&h, hash, sizeof h);
    h ^= h >> 29;
    return (uint32_t)h & pool->map_mask;
}

/* Slot holding hash, or the empty slot where it would go. */
static uint32_t map_probe(const kva_pool *pool, const uint8_t *hash)
{
    uint32_t i = home_slot(pool, hash);
    while (pool->map[i] >= 0 && memcmp(block_hash(pool, pool->map[i]), hash, pool->hash_len))
        i = (i + 1) & pool->map_mask;
    return i;
}

int32_t kva__pool_map_find(const kva_pool *pool, const uint8_t *hash)
{
    return pool->map[map_probe(pool, hash)];
}

/* Empties slot i and shifts later entries of its probe run back so that
 * every remaining key stays reachable from its home slot. */
static void map_delete_slot(kva_pool *pool, uint32_t i)
{
    uint32_t m = pool->map_mask, j = i;
    for (;;) {
        j = (j + 1) & m;
        if (pool->map[j] < 0)
            break;
        uint32_t home = home_slot(pool, block_hash(pool, pool->map[j]));
        /* The entry at j may move to i if i lies cyclically in [home, j). */
        if (((j - home) & m) >= ((j - i) & m)) {
            pool->map[i] = pool->map[j];
            i = j;
        }
    }
    pool->map[i] = -1;
    pool->map_count--;
}

void kva__pool_cache_insert(kva_pool *pool, int32_t b, const uint8_t *hash)
{
    kva__pool_block *k = &pool->blocks[b];
    memcpy(pool->block_hashes + (size_t)b * pool->hash_len, hash, pool->hash_len);
    k->has_hash = 1;
    pool->num_cached++;
    uint32_t i = map_probe(pool, hash);
    int32_t first = pool->map[i];
    if (first < 0) {
        pool->map[i] = b;
        pool->map_count++;
        k->dup_prev = k->dup_next = -1;
        return;
    }
    /* Same hash already cached: join its duplicate list after the first. */
    kva__pool_block *f = &pool->blocks[first];
    k->dup_prev = first;
    k->dup_next = f->dup_next;
    if (f->dup_next >= 0)
        pool->blocks[f->dup_next].dup_prev = b;
    f->dup_next = b;
}

/* Removes block b's hash from the map (the block must have one). */
static void cache_evict(kva_pool *pool, int32_t b)
{
    kva__pool_block *k = &pool->blocks[b];
    if (k->dup_prev >= 0) {
        pool->blocks[k->dup_prev].dup_next = k->dup_next;
        if (k->dup_next >= 0)
            pool->blocks[k->dup_next].dup_prev = k->dup_prev;
    } else {
        uint32_t i = map_probe(pool, block_hash(pool, b));
        if (k->dup_next >= 0) {
            /* The next duplicate has the same key, so it takes over the slot. */
            pool->map[i] = k->dup_next;
            pool->blocks[k->dup_next].dup_prev = -1;
        } else {
            map_delete_slot(pool, i);
        }
    }
    k->dup_prev = k->dup_next = -1;
    k->has_hash = 0;
    pool->num_cached--;
}

int32_t kva__pool_take_free(kva_pool *pool)
{
    int32_t b = pool->free_head;
    kva__pool_queue_remove(pool, b);
    if (pool->blocks[b].has_hash) {
        cache_evict(pool, b);
        pool->num_evicted++;
    }
    pool->blocks[b].ref = 1;
    return b;
}

void kva__pool_ref(kva_pool *pool, int32_t b)
{
    if (b == 0)
        return;
    if (pool->blocks[b].ref == 0)
        kva__pool_queue_remove(pool, b);
    pool->blocks[b].ref++;
}

void kva__pool_release(kva_pool *pool, int32_t b)
{
    if (b == 0)
        return;
    if (--pool->blocks[b].ref == 0)
        kva__pool_queue_push_tail(pool, b);
}

kva__pool_request *kva__pool_find_request(const kva_pool *pool, int32_t request_id,
                                          const char *func)
{
    if (request_id < 0 || request_id >= pool->cap_reqs || pool->reqs[request_id] == NULL) {
        kva__fail(KVA_STATUS_OUT_OF_RANGE, "%s: request_id %d is not a live request", func,
                  (int)request_id);
        return NULL;
    }
    return pool->reqs[request_id];
}

/* ---- creation ---- */

kva_status kva_pool_create(const kva_pool_desc *desc, kva_pool **out)
{
    kva__clear_error();
    KVA_CHECK_PTR(desc);
    KVA_CHECK_PTR(out);
    if (desc->num_blocks < 2 || desc->num_blocks > KVA_POOL_MAX_BLOCKS)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "kva_pool_create: num_blocks %d is outside [2, %d] (block 0 is the "
                         "null block)",
                         (int)desc->num_blocks, KVA_POOL_MAX_BLOCKS);
    if (desc->block_size < 1 || desc->block_size > KVA_POOL_MAX_BLOCK_SIZE)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "kva_pool_create: block_size %d is outside [1, %d]", (int)desc->block_size,
                         KVA_POOL_MAX_BLOCK_SIZE);
    if ((int)desc->hash < 0 || desc->hash >= KVA_POOL_HASH_COUNT_)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "kva_pool_create: hash %d is not a kva_pool_hash", (int)desc->hash);
    if (desc->enable_prefix_caching != 0 && desc->enable_prefix_caching != 1)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "kva_pool_create: enable_prefix_caching %d is not 0 or 1",
                         (int)desc->enable_prefix_caching);

    kva_pool *p = calloc(1, sizeof *p);
    if (p == NULL)
        return kva__fail(KVA_STATUS_OUT_OF_MEMORY, "kva_pool_create: out of memory");
    p->desc = *desc;
    kva_status st = kva__pool_hash_init(p);
    if (st != KVA_STATUS_OK) {
        kva_pool_destroy(p);
        return st;
    }
    size_t nb = (size_t)desc->num_blocks, slots = 1;
    while (slots < 2 * nb)
        slots *= 2;
    p->blocks = calloc(nb, sizeof *p->blocks);
    p->block_hashes = malloc(nb * p->hash_len);
    p->map = malloc(slots * sizeof *p->map);
    if (p->blocks == NULL || p->block_hashes == NULL || p->map == NULL) {
        kva_pool_destroy(p);
        return kva__fail(KVA_STATUS_OUT_OF_MEMORY,
                         "kva_pool_create: out of memory for num_blocks %d", (int)desc->num_blocks);
    }
    memset(p->block_hashes, 0, nb * p->hash_len);
    for (size_t i = 0; i < slots; i++)
        p->map[i] = -1;
    p->map_mask = (uint32_t)(slots - 1);
    p->free_head = p->free_tail = -1;
    for (int32_t b = 0; b < desc->num_blocks; b++) {
        p->blocks[b].prev = p->blocks[b].next = -1;
        p->blocks[b].dup_prev = p->blocks[b].dup_next = -1;
    }
    /* Blocks 1 .. NB-1 start free, in id order; the null block never is. */
    for (int32_t b = 1; b < desc->num_blocks; b++)
        kva__pool_queue_push_tail(p, b);
    *out = p;
    return KVA_STATUS_OK;
}

void kva_pool_destroy(kva_pool *pool)
{
    if (pool == NULL)
        return;
    for (int32_t i = 0; i < pool->cap_reqs; i++)
        kva__pool_request_delete(pool->reqs[i]);
    free(pool->reqs);
    free(pool->free_ids);
    kva__pool_hash_release(pool);
    free(pool->blocks);
    free(pool->block_hashes);
    free(pool->map);
    free(pool);
}

/* ---- statistics and reset ---- */

kva_status kva_pool_get_stats(const kva_pool *pool, kva_pool_stats *out)
{
    kva__clear_error();
    KVA_CHECK_PTR(pool);
    KVA_CHECK_PTR(out);
    kva_pool_stats s;
    memset(&s, 0, sizeof s);
    s.num_blocks = pool->desc.num_blocks - 1;
    s.num_free_blocks = pool->num_free;
    s.num_used_blocks = s.num_blocks - pool->num_free;
    s.num_cached_blocks = pool->num_cached;
    s.num_requests = pool->num_reqs;
    s.usage = (double)s.num_used_blocks / (double)s.num_blocks;
    s.query_tokens = pool->query_tokens;
    s.hit_tokens = pool->hit_tokens;
    s.hit_rate = s.query_tokens > 0 ? (double)s.hit_tokens / (double)s.query_tokens : 0.0;
    s.num_evicted_blocks = pool->num_evicted;
    *out = s;
    return KVA_STATUS_OK;
}

kva_status kva_pool_reset_prefix_cache(kva_pool *pool)
{
    kva__clear_error();
    KVA_CHECK_PTR(pool);
    int32_t used = pool->desc.num_blocks - 1 - pool->num_free;
    if (used > 0)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "kva_pool_reset_prefix_cache: %d blocks are still in use; free every "
                         "request's blocks first",
                         (int)used);
    for (int32_t b = 1; b < pool->desc.num_blocks; b++) {
        kva__pool_block *k = &pool->blocks[b];
        k->has_hash = 0;
        k->dup_prev = k->dup_next = -1;
    }
    for (uint32_t i = 0; i <= pool->map_mask; i++)
        pool->map[i] = -1;
    pool->map_count = 0;
    pool->num_cached = 0;
    return KVA_STATUS_OK;
}

/* ---- invariant checker ---- */

#define VIOLATION(...) kva__fail(KVA_STATUS_INTERNAL, "kva_pool_check: " __VA_ARGS__)

static kva_status check_queue(const kva_pool *pool)
{
    int32_t nb = pool->desc.num_blocks, count = 0, prev = -1;
    for (int32_t b = pool->free_head; b >= 0; b = pool->blocks[b].next) {
        if (b < 1 || b >= nb)
            return VIOLATION("free queue holds block id %d (valid: 1..%d)", (int)b, (int)nb - 1);
        const kva__pool_block *k = &pool->blocks[b];
        if (k->prev != prev)
            return VIOLATION("block %d in the free queue has prev %d, expected %d", (int)b,
                             (int)k->prev, (int)prev);
        if (!k->in_queue || k->ref != 0)
            return VIOLATION("block %d is linked in the free queue with in_queue %d, ref %d",
                             (int)b, (int)k->in_queue, (int)k->ref);
        if (++count > nb)
            return VIOLATION("free queue has a cycle");
        prev = b;
    }
    if (prev != pool->free_tail)
        return VIOLATION("free queue ends at block %d but the tail is %d", (int)prev,
                         (int)pool->free_tail);
    if (count != pool->num_free)
        return VIOLATION("free queue links %d blocks but num_free is %d", (int)count,
                         (int)pool->num_free);
    return KVA_STATUS_OK;
}

static kva_status check_map(const kva_pool *pool)
{
    int32_t nb = pool->desc.num_blocks, entries = 0, chained = 0, hashed = 0;
    for (uint32_t i = 0; i <= pool->map_mask; i++) {
        int32_t first = pool->map[i];
        if (first < 0)
            continue;
        entries++;
        if (first < 1 || first >= nb)
            return VIOLATION("map slot %u holds block id %d", i, (int)first);
        if (kva__pool_map_find(pool, block_hash(pool, first)) != first)
            return VIOLATION("block %d in map slot %u is not found by its hash", (int)first, i);
        if (pool->blocks[first].dup_prev != -1)
            return VIOLATION("block %d heads a hash in the map but has dup_prev %d", (int)first,
                             (int)pool->blocks[first].dup_prev);
        int32_t prev = -1;
        for (int32_t b = first; b >= 0; b = pool->blocks[b].dup_next) {
            if (b < 1 || b >= nb || ++chained > nb)
                return VIOLATION("duplicate list of block %d is broken at %d", (int)first, (int)b);
            const kva__pool_block *k = &pool->blocks[b];
            if (!k->has_hash || k->dup_prev != prev)
                return VIOLATION("block %d in the map has has_hash %d, dup_prev %d "
                                 "(expected %d)",
                                 (int)b, (int)k->has_hash, (int)k->dup_prev, (int)prev);
            if (memcmp(block_hash(pool, b), block_hash(pool, first), pool->hash_len))
                return VIOLATION("block %d is listed under block %d's hash but differs", (int)b,
                                 (int)first);
            prev = b;
        }
    }
    for (int32_t b = 0; b < nb; b++)
        hashed += pool->blocks[b].has_hash;
    if (entries != pool->map_count)
        return VIOLATION("map has %d entries but map_count is %d", (int)entries,
                         (int)pool->map_count);
    if (chained != hashed || hashed != pool->num_cached)
        return VIOLATION("%d blocks reachable from the map, %d blocks hold a hash, "
                         "num_cached is %d",
                         (int)chained, (int)hashed, (int)pool->num_cached);
    return KVA_STATUS_OK;
}

/* Checks one live request's table against its tokens and hashes and adds its
 * references to refs [NB]. */
static kva_status check_request(const kva_pool *pool, int32_t id, const kva__pool_request *r,
                                int32_t *refs)
{
    int32_t nb = pool->desc.num_blocks, bs = pool->desc.block_size;
    if ((int64_t)r->num_tokens > (int64_t)r->num_blocks * bs)
        return VIOLATION("request %d has %d tokens but only %d blocks", (int)id, (int)r->num_tokens,
                         (int)r->num_blocks);
    int32_t full = r->num_tokens / bs;
    int32_t want_hashes = pool->desc.enable_prefix_caching ? full : 0;
    if (r->num_hashes != want_hashes)
        return VIOLATION("request %d has %d block hashes, expected %d", (int)id, (int)r->num_hashes,
                         (int)want_hashes);
    for (int32_t i = 0; i < r->num_blocks; i++) {
        int32_t b = r->blocks[i];
        if (b < 0 || b >= nb)
            return VIOLATION("request %d block %d is id %d", (int)id, (int)i, (int)b);
        if (b == 0)
            continue;
        refs[b]++;
        const kva__pool_block *k = &pool->blocks[b];
        if (i >= full) {
            /* A block still being filled belongs to this request alone. */
            if (k->has_hash || k->ref != 1)
                return VIOLATION("request %d's unfilled block %d (id %d) has has_hash %d, "
                                 "ref %d",
                                 (int)id, (int)i, (int)b, (int)k->has_hash, (int)k->ref);
        } else if (pool->desc.enable_prefix_caching &&
                   (!k->has_hash ||
                    memcmp(block_hash(pool, b), r->hashes + (size_t)i * pool->hash_len,
                           pool->hash_len))) {
            return VIOLATION("request %d's full block %d (id %d) is not cached under the "
                             "request's hash",
                             (int)id, (int)i, (int)b);
        }
    }
    return KVA_STATUS_OK;
}

kva_status kva_pool_check(const kva_pool *pool)
{
    kva__clear_error();
    KVA_CHECK_PTR(pool);
    int32_t nb = pool->desc.num_blocks;
    const kva__pool_block *z = &pool->blocks[0];
    if (z->ref != 0 || z->in_queue || z->has_hash || pool->free_head == 0 || pool->free_tail == 0)
        return VIOLATION("null block has ref %d, in_queue %d, has_hash %d", (int)z->ref,
                         (int)z->in_queue, (int)z->has_hash);
    KVA_TRY(check_queue(pool));
    int32_t queued = 0;
    for (int32_t b = 1; b < nb; b++) {
        const kva__pool_block *k = &pool->blocks[b];
        if (k->ref < 0 || (k->ref == 0) != (k->in_queue == 1))
            return VIOLATION("block %d has ref %d and in_queue %d", (int)b, (int)k->ref,
                             (int)k->in_queue);
        queued += k->in_queue;
    }
    if (queued != pool->num_free)
        return VIOLATION("%d blocks are marked free but num_free is %d", (int)queued,
                         (int)pool->num_free);
    KVA_TRY(check_map(pool));
    if (!pool->desc.enable_prefix_caching && pool->num_cached != 0)
        return VIOLATION("prefix caching is off but %d blocks are cached", (int)pool->num_cached);

    int32_t *refs = calloc((size_t)nb, sizeof *refs);
    if (refs == NULL)
        return kva__fail(KVA_STATUS_OUT_OF_MEMORY, "kva_pool_check: out of memory");
    kva_status st = KVA_STATUS_OK;
    int32_t live = 0;
    for (int32_t id = 0; id < pool->cap_reqs && st == KVA_STATUS_OK; id++) {
        if (pool->reqs[id] == NULL)
            continue;
        live++;
        st = check_request(pool, id, pool->reqs[id], refs);
    }
    for (int32_t b = 1; b < nb && st == KVA_STATUS_OK; b++)
        if (refs[b] != pool->blocks[b].ref)
            st = VIOLATION("block %d has ref %d but appears in %d block tables", (int)b,
                           (int)pool->blocks[b].ref, (int)refs[b]);
    free(refs);
    if (st == KVA_STATUS_OK && live != pool->num_reqs)
        st = VIOLATION("%d live requests but num_reqs is %d", (int)live, (int)pool->num_reqs);
    return st;
}
