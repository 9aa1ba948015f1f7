/* test_pool.c - the block pool: eviction order, prefix hits and their cap,
 * extra keys, forks, sliding-window drops, reset, both hash functions, bad
 * input and the invariant checker. The random model test is test_pool_property.c. */
#include "harness.h"

#include "../src/pool/pool_internal.h"

/* ---- helpers ---- */

static kva_pool *make_pool(int32_t nb, int32_t bs, kva_pool_hash hash, int32_t caching)
{
    kva_pool_desc d = {nb, bs, hash, caching};
    kva_pool *p = NULL;
    CHECK_OK(kva_pool_create(&d, &p));
    return p;
}

/* Adds a request for prompt [n], allocates it fully and appends the whole
 * prompt minus its cached part (a prefill step). Returns the id. */
static int32_t prefill(kva_pool *p, const int32_t *prompt, int32_t n, const char *extra,
                       int32_t *cached)
{
    int32_t id = -1, c = -1;
    size_t el = extra ? strlen(extra) : 0;
    CHECK_OK(kva_pool_request_add(p, prompt, n, extra, el, &id, &c));
    CHECK_OK(kva_pool_request_allocate(p, id, n - c, 0));
    CHECK_OK(kva_pool_request_append_tokens(p, id, prompt + c, n - c));
    CHECK_OK(kva_pool_check(p));
    if (cached)
        *cached = c;
    return id;
}

/* Free-queue order, head first, read from the internals. */
static int32_t queue_order(const kva_pool *p, int32_t *out, int32_t cap)
{
    int32_t n = 0;
    for (int32_t b = p->free_head; b >= 0 && n < cap; b = p->blocks[b].next)
        out[n++] = b;
    return n;
}

/* Everything observable about a pool: stats, free-queue order, and for each
 * request id below 64 its info and block-table row. */
typedef struct {
    kva_pool_stats stats;
    int32_t queue[256];
    int32_t queue_len;
    int32_t live[64];
    kva_pool_request_info info[64];
    int32_t rows[64][32];
} snapshot;

static void take_snapshot(const kva_pool *p, snapshot *s)
{
    memset(s, 0, sizeof *s);
    CHECK_OK(kva_pool_get_stats(p, &s->stats));
    s->queue_len = queue_order(p, s->queue, 256);
    for (int32_t id = 0; id < 64; id++) {
        s->live[id] = kva_pool_request_get_info(p, id, &s->info[id]) == KVA_STATUS_OK;
        if (s->live[id])
            CHECK_OK(kva_pool_request_block_table(p, id, s->rows[id], 32, NULL));
    }
    kva__clear_error();
}

/* Checks that p still matches snapshot s and that its invariants hold. */
static void check_unchanged(const kva_pool *p, const snapshot *s, int line)
{
    snapshot now;
    char msg[512];
    snprintf(msg, sizeof msg, "%s", kva_last_error());
    take_snapshot(p, &now);
    CHECK_MSG(memcmp(&now, s, sizeof now) == 0, "pool changed by a failing call (line %d)", line);
    CHECK_MSG(kva_pool_check(p) == KVA_STATUS_OK, "line %d: %s", line, kva_last_error());
    /* Restore the failing call's message for CHECK_ERROR_MENTIONS. */
    kva__fail(KVA_STATUS_INVALID_ARGUMENT, "%s", msg);
}

#define CHECK_UNCHANGED(p, s) check_unchanged((p), (s), __LINE__)

/* ---- tests ---- */

static void test_create_bad_args(void)
{
    kva_pool *p = NULL;
    kva_pool_desc d = {8, 4, KVA_POOL_HASH_SHA256, 1};
    CHECK_STATUS(kva_pool_create(NULL, &p), KVA_STATUS_NULL_POINTER);
    CHECK_ERROR_MENTIONS("desc");
    CHECK_STATUS(kva_pool_create(&d, NULL), KVA_STATUS_NULL_POINTER);
    CHECK_ERROR_MENTIONS("out");
    int32_t bad_nb[] = {1, 0, -5, KVA_POOL_MAX_BLOCKS + 1};
    for (int i = 0; i < 4; i++) {
        d.num_blocks = bad_nb[i];
        CHECK_STATUS(kva_pool_create(&d, &p), KVA_STATUS_INVALID_ARGUMENT);
        CHECK_ERROR_MENTIONS("num_blocks");
        CHECK(p == NULL);
    }
    d.num_blocks = 8;
    int32_t bad_bs[] = {0, -1, KVA_POOL_MAX_BLOCK_SIZE + 1};
    for (int i = 0; i < 3; i++) {
        d.block_size = bad_bs[i];
        CHECK_STATUS(kva_pool_create(&d, &p), KVA_STATUS_INVALID_ARGUMENT);
        CHECK_ERROR_MENTIONS("block_size");
    }
    d.block_size = 4;
    d.hash = (kva_pool_hash)7;
    CHECK_STATUS(kva_pool_create(&d, &p), KVA_STATUS_INVALID_ARGUMENT);
    CHECK_ERROR_MENTIONS("hash");
    d.hash = KVA_POOL_HASH_XXH3_128;
    d.enable_prefix_caching = 2;
    CHECK_STATUS(kva_pool_create(&d, &p), KVA_STATUS_INVALID_ARGUMENT);
    CHECK_ERROR_MENTIONS("enable_prefix_caching");
    CHECK(p == NULL);

    /* The smallest pool: the null block and one block. */
    d.num_blocks = 2;
    d.enable_prefix_caching = 0;
    CHECK_OK(kva_pool_create(&d, &p));
    kva_pool_stats s;
    CHECK_OK(kva_pool_get_stats(p, &s));
    CHECK(s.num_blocks == 1 && s.num_free_blocks == 1 && s.num_used_blocks == 0);
    CHECK_OK(kva_pool_check(p));
    kva_pool_destroy(p);
    kva_pool_destroy(NULL);
}

static void test_hash_vectors(void)
{
    /* FIPS 180-2 appendix B.1: SHA-256("abc"). */
    static const uint8_t sha_abc[32] = {0xba, 0x78, 0x16, 0xbf, 0x8f, 0x01, 0xcf, 0xea,
                                        0x41, 0x41, 0x40, 0xde, 0x5d, 0xae, 0x22, 0x23,
                                        0xb0, 0x03, 0x61, 0xa3, 0x96, 0x17, 0x7a, 0x9c,
                                        0xb4, 0x10, 0xff, 0x61, 0xf2, 0x00, 0x15, 0xad};
    /* xxHash's published XXH128 of the empty input (canonical form). */
    static const uint8_t xxh_empty[16] = {0x99, 0xaa, 0x06, 0xd3, 0x01, 0x47, 0x98, 0xd8,
                                          0x60, 0x01, 0xc3, 0x24, 0x46, 0x8d, 0x49, 0x7f};
    uint8_t out[32];
    CHECK_OK(kva__pool_digest(KVA_POOL_HASH_SHA256, "abc", 3, out));
    CHECK(memcmp(out, sha_abc, 32) == 0);
    CHECK_OK(kva__pool_digest(KVA_POOL_HASH_XXH3_128, "", 0, out));
    CHECK(memcmp(out, xxh_empty, 16) == 0);

    /* The block hash is the digest of parent | tokens LE | len LE | extra. */
    kva_pool *p = make_pool(4, 2, KVA_POOL_HASH_SHA256, 1);
    int32_t toks[2] = {0x04030201, -1};
    uint8_t bytes[32 + 8 + 8 + 2], want[32], got[32];
    memset(bytes, 0, 32);
    const uint8_t tail[] = {1, 2, 3, 4, 0xff, 0xff, 0xff, 0xff, 2, 0, 0, 0, 0, 0, 0, 0, 'x', 'y'};
    memcpy(bytes + 32, tail, sizeof tail);
    CHECK_OK(kva__pool_digest(KVA_POOL_HASH_SHA256, bytes, sizeof bytes, want));
    CHECK_OK(kva__pool_hash_block(p, NULL, toks, (const uint8_t *)"xy", 2, got));
    CHECK(memcmp(got, want, 32) == 0);
    kva_pool_destroy(p);
}

static void test_both_hashes_hit(void)
{
    kva_pool_hash kinds[2] = {KVA_POOL_HASH_SHA256, KVA_POOL_HASH_XXH3_128};
    for (int k = 0; k < 2; k++) {
        kva_pool *p = make_pool(16, 4, kinds[k], 1);
        CHECK(p->hash_len == (k == 0 ? 32u : 16u));
        int32_t prompt[10] = {5, 6, 7, 8, 9, 10, 11, 12, 13, 14};
        int32_t c = -1;
        int32_t a = prefill(p, prompt, 10, NULL, &c);
        CHECK(c == 0);
        int32_t b = prefill(p, prompt, 10, NULL, &c);
        CHECK(c == 8);
        int32_t ra[4], rb[4];
        CHECK_OK(kva_pool_request_block_table(p, a, ra, 4, NULL));
        CHECK_OK(kva_pool_request_block_table(p, b, rb, 4, NULL));
        CHECK(ra[0] == rb[0] && ra[1] == rb[1] && ra[2] != rb[2]);
        kva_pool_stats s;
        CHECK_OK(kva_pool_get_stats(p, &s));
        CHECK(s.query_tokens == 20 && s.hit_tokens == 8);
        CHECK(fabs(s.hit_rate - 0.4) < 1e-12);
        CHECK(s.num_used_blocks == 4 && s.num_cached_blocks == 2);
        kva_pool_destroy(p);
    }
}

static void test_eviction_order(void)
{
    /* B = 2, blocks 1..5. Requests A, B, C of one full block each get 1, 2, 3. */
    kva_pool *p = make_pool(6, 2, KVA_POOL_HASH_SHA256, 1);
    int32_t pa[2] = {1, 2}, pb[2] = {3, 4}, pc[2] = {5, 6};
    int32_t a = prefill(p, pa, 2, NULL, NULL), b = prefill(p, pb, 2, NULL, NULL),
            c = prefill(p, pc, 2, NULL, NULL);
    int32_t q[8], row[4];
    CHECK(queue_order(p, q, 8) == 2 && q[0] == 4 && q[1] == 5);
    CHECK_OK(kva_pool_request_free(p, a));
    CHECK_OK(kva_pool_request_free(p, b));
    CHECK_OK(kva_pool_request_free(p, c));
    CHECK(queue_order(p, q, 8) == 5 && q[0] == 4 && q[1] == 5 && q[2] == 1 && q[3] == 2 &&
          q[4] == 3);
    CHECK_OK(kva_pool_check(p));

    /* A hit on B's free cached block takes it out of the middle of the queue.
     * The prompt is B's block plus one token, so the cap allows one block. */
    int32_t pb2[3] = {3, 4, 9};
    int32_t id = -1, cached = -1;
    CHECK_OK(kva_pool_request_add(p, pb2, 3, NULL, 0, &id, &cached));
    CHECK(cached == 2);
    CHECK(queue_order(p, q, 8) == 4 && q[0] == 4 && q[1] == 5 && q[2] == 1 && q[3] == 3);
    CHECK_OK(kva_pool_request_block_table(p, id, row, 4, NULL));
    CHECK(row[0] == 2 && row[1] == 0);
    CHECK_OK(kva_pool_check(p));

    /* New blocks come from the head: never-used 4 and 5, then A's block 1,
     * whose cached hash is evicted. */
    CHECK_OK(kva_pool_request_allocate(p, id, 1, 4));
    CHECK_OK(kva_pool_request_block_table(p, id, row, 4, NULL));
    CHECK(row[0] == 2 && row[1] == 4 && row[2] == 5 && row[3] == 1);
    kva_pool_stats s;
    CHECK_OK(kva_pool_get_stats(p, &s));
    CHECK(s.num_evicted_blocks == 1 && s.num_cached_blocks == 2 && s.num_free_blocks == 1);
    CHECK_OK(kva_pool_check(p));
    /* A's prompt no longer hits; C's still does. */
    int32_t pa2[3] = {1, 2, 0}, pc2[3] = {5, 6, 0};
    int32_t id2 = -1, id3 = -1;
    CHECK_OK(kva_pool_request_add(p, pa2, 3, NULL, 0, &id2, &cached));
    CHECK(cached == 0);
    CHECK_OK(kva_pool_request_add(p, pc2, 3, NULL, 0, &id3, &cached));
    CHECK(cached == 2);

    /* The queue is empty now (id3's hit revived block 3). Freeing id3 queues
     * 3; freeing id releases its row 2,4,5,1 last block first: 1,5,4,2. */
    CHECK_OK(kva_pool_request_free(p, id3));
    CHECK_OK(kva_pool_request_free(p, id));
    CHECK(queue_order(p, q, 8) == 5 && q[0] == 3 && q[1] == 1 && q[2] == 5 && q[3] == 4 &&
          q[4] == 2);
    CHECK_OK(kva_pool_check(p));
    kva_pool_destroy(p);
}

static void test_hit_cap(void)
{
    kva_pool *p = make_pool(32, 4, KVA_POOL_HASH_SHA256, 1);
    int32_t prompt[13];
    for (int i = 0; i < 13; i++)
        prompt[i] = 100 + i;
    int32_t c = -1, id = -1;
    prefill(p, prompt, 13, NULL, &c); /* caches blocks 0..2 (tokens 0..11) */
    CHECK(c == 0);
    /* Exactly 3 full blocks: 2 come from the cache, one token at least is computed. */
    CHECK_OK(kva_pool_request_add(p, prompt, 12, NULL, 0, &id, &c));
    CHECK(c == 8);
    kva_pool_request_info info;
    CHECK_OK(kva_pool_request_get_info(p, id, &info));
    CHECK(info.num_tokens == 8 && info.num_blocks == 2 && info.num_cached_tokens == 8);
    CHECK_OK(kva_pool_request_add(p, prompt, 13, NULL, 0, &id, &c));
    CHECK(c == 12);
    CHECK_OK(kva_pool_request_add(p, prompt, 4, NULL, 0, &id, &c));
    CHECK(c == 0);
    CHECK_OK(kva_pool_request_add(p, prompt, 5, NULL, 0, &id, &c));
    CHECK(c == 4);
    /* A change in block 1 stops the chain there, even though block 2 matches. */
    int32_t other[13];
    memcpy(other, prompt, sizeof other);
    other[6] = -7;
    CHECK_OK(kva_pool_request_add(p, other, 13, NULL, 0, &id, &c));
    CHECK(c == 4);
    CHECK_OK(kva_pool_check(p));
    kva_pool_destroy(p);
}

static void test_extra_key(void)
{
    kva_pool *p = make_pool(32, 2, KVA_POOL_HASH_XXH3_128, 1);
    int32_t prompt[5] = {1, 2, 3, 4, 5};
    int32_t c = -1;
    prefill(p, prompt, 5, "tenant-a", &c);
    CHECK(c == 0);
    prefill(p, prompt, 5, "tenant-b", &c);
    CHECK(c == 0);
    prefill(p, prompt, 5, NULL, &c);
    CHECK(c == 0);
    prefill(p, prompt, 5, "tenant-a", &c);
    CHECK(c == 4);
    prefill(p, prompt, 5, "tenant-b", &c);
    CHECK(c == 4);
    prefill(p, prompt, 5, NULL, &c);
    CHECK(c == 4);
    /* A key that is a prefix of another is a different key. */
    prefill(p, prompt, 5, "tenant-", &c);
    CHECK(c == 0);
    kva_pool_destroy(p);
}

static void test_fork(void)
{
    kva_pool *p = make_pool(8, 4, KVA_POOL_HASH_SHA256, 1);
    int32_t prompt[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
    int32_t src = prefill(p, prompt, 10, NULL, NULL), child = -1, copy[2] = {7, 7};
    int32_t rs[4], rc[4];
    CHECK_OK(kva_pool_request_fork(p, src, &child, copy));
    CHECK(child != src);
    CHECK_OK(kva_pool_request_block_table(p, src, rs, 4, NULL));
    CHECK_OK(kva_pool_request_block_table(p, child, rc, 4, NULL));
    CHECK(rc[0] == rs[0] && rc[1] == rs[1]);
    CHECK(rc[2] != rs[2] && rc[2] > 0 && rc[3] == 0);
    CHECK(copy[0] == rs[2] && copy[1] == rc[2]);
    kva_pool_request_info info;
    CHECK_OK(kva_pool_request_get_info(p, child, &info));
    CHECK(info.num_tokens == 10 && info.num_blocks == 3);
    kva_pool_stats s;
    CHECK_OK(kva_pool_get_stats(p, &s));
    CHECK(s.num_used_blocks == 4 && s.num_requests == 2);
    CHECK(p->blocks[rs[0]].ref == 2 && p->blocks[rs[2]].ref == 1);
    CHECK_OK(kva_pool_check(p));

    /* Both continue independently; the child fills its copied block. */
    int32_t more[2] = {11, 12};
    CHECK_OK(kva_pool_request_allocate(p, child, 2, 0));
    CHECK_OK(kva_pool_request_append_tokens(p, child, more, 2));
    CHECK_OK(kva_pool_check(p));
    /* Freeing the source keeps the shared blocks alive for the child. */
    CHECK_OK(kva_pool_request_free(p, src));
    CHECK_OK(kva_pool_get_stats(p, &s));
    CHECK(s.num_used_blocks == 3 && p->blocks[rs[0]].ref == 1);
    CHECK_OK(kva_pool_check(p));

    /* A block-aligned source has nothing to copy. */
    int32_t child2 = -1;
    CHECK_OK(kva_pool_request_fork(p, child, &child2, copy));
    CHECK(copy[0] == -1 && copy[1] == -1);
    CHECK_OK(kva_pool_request_get_info(p, child2, &info));
    CHECK(info.num_tokens == 12 && info.num_blocks == 3);
    CHECK_OK(kva_pool_check(p));

    /* Forking a partial block with no free block fails and changes nothing. */
    int32_t one = 99;
    CHECK_OK(kva_pool_request_allocate(p, child2, 1, 0));
    CHECK_OK(kva_pool_request_append_tokens(p, child2, &one, 1));
    CHECK_OK(kva_pool_get_stats(p, &s));
    CHECK_OK(kva_pool_request_allocate(p, child, 4 * s.num_free_blocks, 0));
    snapshot before;
    take_snapshot(p, &before);
    int32_t child3 = -5;
    copy[0] = copy[1] = 7;
    CHECK_STATUS(kva_pool_request_fork(p, child2, &child3, copy), KVA_STATUS_POOL_EXHAUSTED);
    CHECK(child3 == -5 && copy[0] == 7);
    CHECK_UNCHANGED(p, &before);
    kva_pool_destroy(p);
}

static void test_allocation_failure(void)
{
    kva_pool *p = make_pool(6, 4, KVA_POOL_HASH_SHA256, 1);
    int32_t prompt[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    int32_t a = prefill(p, prompt, 9, NULL, NULL); /* 3 blocks, 2 cached */
    int32_t b = -1, c = -1;
    CHECK_OK(kva_pool_request_add(p, prompt, 9, NULL, 0, &b, &c));
    CHECK(c == 8);
    snapshot before;
    take_snapshot(p, &before);
    /* b needs 1 block for its last token + 8 lookahead = 3 blocks; 2 are free. */
    CHECK_STATUS(kva_pool_request_allocate(p, b, 1, 8), KVA_STATUS_POOL_EXHAUSTED);
    CHECK_ERROR_MENTIONS("free");
    CHECK_UNCHANGED(p, &before);
    CHECK_STATUS(kva_pool_request_allocate(p, a, 100, 0), KVA_STATUS_POOL_EXHAUSTED);
    CHECK_UNCHANGED(p, &before);
    CHECK_STATUS(kva_pool_request_allocate(p, a, INT32_MAX, 0), KVA_STATUS_OUT_OF_RANGE);
    CHECK_UNCHANGED(p, &before);
    /* Exactly enough succeeds; an allocation already covered is a no-op. */
    CHECK_OK(kva_pool_request_allocate(p, b, 1, 4));
    CHECK_OK(kva_pool_request_allocate(p, b, 1, 0));
    kva_pool_stats s;
    CHECK_OK(kva_pool_get_stats(p, &s));
    CHECK(s.num_free_blocks == 0 && s.num_used_blocks == 5 && s.usage == 1.0);
    CHECK_OK(kva_pool_check(p));
    kva_pool_destroy(p);
}

static void test_window_drop(void)
{
    kva_pool *p = make_pool(12, 2, KVA_POOL_HASH_SHA256, 1);
    int32_t prompt[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
    int32_t id = prefill(p, prompt, 10, NULL, NULL);
    int32_t before[8], row[8], q[16];
    CHECK_OK(kva_pool_request_block_table(p, id, before, 8, NULL));
    int32_t nq = queue_order(p, q, 16);
    /* The next token (position 10) sees keys >= 6: blocks 0..2 go. */
    CHECK_OK(kva_pool_request_drop_window(p, id, 4));
    CHECK_OK(kva_pool_request_block_table(p, id, row, 8, NULL));
    CHECK(row[0] == 0 && row[1] == 0 && row[2] == 0 && row[3] == before[3] && row[4] == before[4] &&
          row[5] == 0);
    /* Released last first: they join the tail as blocks 2, 1, 0. */
    int32_t nq2 = queue_order(p, q, 16);
    CHECK(nq2 == nq + 3 && q[nq] == before[2] && q[nq + 1] == before[1] && q[nq + 2] == before[0]);
    int64_t slots[4];
    CHECK_STATUS(kva_pool_request_slots(p, id, 4, 4, slots), KVA_STATUS_OUT_OF_RANGE);
    CHECK_ERROR_MENTIONS("sliding window");
    CHECK_OK(kva_pool_request_slots(p, id, 6, 4, slots));
    CHECK(slots[0] == (int64_t)before[3] * 2 && slots[3] == (int64_t)before[4] * 2 + 1);
    CHECK_OK(kva_pool_check(p));
    /* Dropping again, or with a window wider than the sequence, is a no-op. */
    CHECK_OK(kva_pool_request_drop_window(p, id, 4));
    CHECK_OK(kva_pool_request_drop_window(p, id, 1000));
    CHECK(queue_order(p, q, 16) == nq2);
    /* The dropped blocks stay cached: the same prompt hits all of them. */
    int32_t other = -1, c = -1;
    CHECK_OK(kva_pool_request_add(p, prompt, 10, NULL, 0, &other, &c));
    CHECK(c == 8);
    CHECK(queue_order(p, q, 16) == nq);
    CHECK_OK(kva_pool_check(p));
    /* Window 0 after decoding drops every full block before the next token. */
    int32_t t = 11;
    CHECK_OK(kva_pool_request_allocate(p, id, 2, 0));
    CHECK_OK(kva_pool_request_append_tokens(p, id, &t, 1));
    CHECK_OK(kva_pool_request_drop_window(p, id, 0));
    CHECK_OK(kva_pool_request_block_table(p, id, row, 8, NULL));
    CHECK(row[4] == 0 && row[5] > 0);
    CHECK_OK(kva_pool_check(p));
    kva_pool_destroy(p);
}

static void test_reset_prefix_cache(void)
{
    kva_pool *p = make_pool(8, 2, KVA_POOL_HASH_SHA256, 1);
    int32_t prompt[5] = {1, 2, 3, 4, 5};
    int32_t id = prefill(p, prompt, 5, NULL, NULL), c = -1;
    snapshot before;
    take_snapshot(p, &before);
    CHECK_STATUS(kva_pool_reset_prefix_cache(p), KVA_STATUS_INVALID_ARGUMENT);
    CHECK_ERROR_MENTIONS("in use");
    CHECK_UNCHANGED(p, &before);
    CHECK_OK(kva_pool_request_free(p, id));
    kva_pool_stats s;
    CHECK_OK(kva_pool_get_stats(p, &s));
    CHECK(s.num_cached_blocks == 2);
    CHECK_OK(kva_pool_reset_prefix_cache(p));
    CHECK_OK(kva_pool_get_stats(p, &s));
    CHECK(s.num_cached_blocks == 0 && s.num_free_blocks == 7);
    CHECK_OK(kva_pool_check(p));
    prefill(p, prompt, 5, NULL, &c);
    CHECK(c == 0);
    kva_pool_destroy(p);
}

static void test_duplicates(void)
{
    /* Two requests compute the same prompt before either is cached: both
     * blocks are cached under one hash, and evicting one keeps the other. */
    kva_pool *p = make_pool(8, 2, KVA_POOL_HASH_SHA256, 1);
    int32_t prompt[3] = {4, 4, 4}, a = -1, b = -1, c = -1, row[2];
    CHECK_OK(kva_pool_request_add(p, prompt, 3, NULL, 0, &a, &c));
    CHECK_OK(kva_pool_request_add(p, prompt, 3, NULL, 0, &b, &c));
    CHECK(c == 0);
    CHECK_OK(kva_pool_request_allocate(p, a, 3, 0));
    CHECK_OK(kva_pool_request_allocate(p, b, 3, 0));
    CHECK_OK(kva_pool_request_append_tokens(p, a, prompt, 3));
    CHECK_OK(kva_pool_request_append_tokens(p, b, prompt, 3));
    kva_pool_stats s;
    CHECK_OK(kva_pool_get_stats(p, &s));
    CHECK(s.num_cached_blocks == 2 && p->map_count == 1);
    CHECK_OK(kva_pool_check(p));
    CHECK_OK(kva_pool_request_block_table(p, b, row, 2, NULL));
    int32_t b_first = row[0];
    /* Free a and make its blocks the first evicted. */
    CHECK_OK(kva_pool_request_free(p, a));
    /* b holds 2 blocks; 7 blocks (14 tokens) take all 5 free ones, a's cached
     * block among them. */
    CHECK_OK(kva_pool_request_allocate(p, b, 11, 0));
    CHECK_OK(kva_pool_get_stats(p, &s));
    CHECK(s.num_free_blocks == 0 && s.num_cached_blocks == 1 && s.num_evicted_blocks == 1);
    CHECK_OK(kva_pool_check(p));
    int32_t d = -1;
    CHECK_OK(kva_pool_request_add(p, prompt, 3, NULL, 0, &d, &c));
    CHECK(c == 2);
    CHECK_OK(kva_pool_request_block_table(p, d, row, 2, NULL));
    CHECK(row[0] == b_first);
    CHECK_OK(kva_pool_check(p));
    kva_pool_destroy(p);
}

static void test_caching_disabled(void)
{
    kva_pool *p = make_pool(8, 2, KVA_POOL_HASH_SHA256, 0);
    int32_t prompt[5] = {1, 2, 3, 4, 5}, c = -1;
    prefill(p, prompt, 5, NULL, &c);
    prefill(p, prompt, 5, NULL, &c);
    CHECK(c == 0);
    kva_pool_stats s;
    CHECK_OK(kva_pool_get_stats(p, &s));
    CHECK(s.num_cached_blocks == 0 && s.query_tokens == 0 && s.hit_rate == 0.0);
    CHECK(s.num_used_blocks == 6);
    kva_pool_destroy(p);
}

static void test_block_table_and_slots(void)
{
    kva_pool *p = make_pool(16, 4, KVA_POOL_HASH_SHA256, 1);
    int32_t prompt[6] = {1, 2, 3, 4, 5, 6};
    int32_t id = -1, c = -1, row[6] = {-1, -1, -1, -1, -1, -1}, nb = -1;
    CHECK_OK(kva_pool_request_add(p, prompt, 6, NULL, 0, &id, &c));
    CHECK_OK(kva_pool_request_allocate(p, id, 6, 3)); /* 9 tokens: 3 blocks, 12 slots */
    CHECK_OK(kva_pool_request_block_table(p, id, NULL, 0, &nb));
    CHECK(nb == 3);
    CHECK_OK(kva_pool_request_block_table(p, id, row, 6, &nb));
    CHECK(row[0] == 1 && row[1] == 2 && row[2] == 3 && row[3] == 0 && row[5] == 0);
    int64_t slots[9];
    CHECK_OK(kva_pool_request_slots(p, id, 0, 9, slots));
    for (int i = 0; i < 9; i++)
        CHECK(slots[i] == (int64_t)row[i / 4] * 4 + i % 4);
    CHECK_OK(kva_pool_request_slots(p, id, 9, 0, NULL));
    snapshot before;
    take_snapshot(p, &before);
    CHECK_STATUS(kva_pool_request_slots(p, id, 5, 8, slots), KVA_STATUS_OUT_OF_RANGE);
    CHECK_ERROR_MENTIONS("not allocated");
    CHECK_STATUS(kva_pool_request_block_table(p, id, row, 2, &nb), KVA_STATUS_OUT_OF_RANGE);
    CHECK_ERROR_MENTIONS("row_len");
    CHECK_UNCHANGED(p, &before);
    /* Appending past the allocated slots fails; within them succeeds. */
    int32_t ten[13] = {0};
    CHECK_STATUS(kva_pool_request_append_tokens(p, id, ten, 13), KVA_STATUS_OUT_OF_RANGE);
    CHECK_UNCHANGED(p, &before);
    CHECK_OK(kva_pool_request_append_tokens(p, id, prompt, 6));
    CHECK_OK(kva_pool_request_append_tokens(p, id, ten, 6));
    CHECK_STATUS(kva_pool_request_append_tokens(p, id, ten, 1), KVA_STATUS_OUT_OF_RANGE);
    CHECK_OK(kva_pool_check(p));
    kva_pool_destroy(p);
}

static void test_bad_inputs(void)
{
    kva_pool *p = make_pool(8, 2, KVA_POOL_HASH_SHA256, 1);
    int32_t prompt[5] = {1, 2, 3, 4, 5};
    int32_t id = prefill(p, prompt, 5, NULL, NULL);
    int32_t gone = prefill(p, prompt, 5, NULL, NULL);
    CHECK_OK(kva_pool_request_free(p, gone));
    int32_t out = -3, c = -3, row[4], copy[2];
    int64_t slots[4];
    kva_pool_stats st;
    kva_pool_request_info info;
    snapshot s;
    take_snapshot(p, &s);

    /* NULL pool everywhere. */
    CHECK_STATUS(kva_pool_request_add(NULL, prompt, 5, NULL, 0, &out, &c), KVA_STATUS_NULL_POINTER);
    CHECK_ERROR_MENTIONS("pool");
    CHECK_STATUS(kva_pool_request_allocate(NULL, id, 1, 0), KVA_STATUS_NULL_POINTER);
    CHECK_STATUS(kva_pool_request_append_tokens(NULL, id, prompt, 1), KVA_STATUS_NULL_POINTER);
    CHECK_STATUS(kva_pool_request_fork(NULL, id, &out, copy), KVA_STATUS_NULL_POINTER);
    CHECK_STATUS(kva_pool_request_free(NULL, id), KVA_STATUS_NULL_POINTER);
    CHECK_STATUS(kva_pool_request_drop_window(NULL, id, 1), KVA_STATUS_NULL_POINTER);
    CHECK_STATUS(kva_pool_request_block_table(NULL, id, row, 4, NULL), KVA_STATUS_NULL_POINTER);
    CHECK_STATUS(kva_pool_request_slots(NULL, id, 0, 1, slots), KVA_STATUS_NULL_POINTER);
    CHECK_STATUS(kva_pool_request_get_info(NULL, id, &info), KVA_STATUS_NULL_POINTER);
    CHECK_STATUS(kva_pool_get_stats(NULL, &st), KVA_STATUS_NULL_POINTER);
    CHECK_STATUS(kva_pool_reset_prefix_cache(NULL), KVA_STATUS_NULL_POINTER);
    CHECK_STATUS(kva_pool_check(NULL), KVA_STATUS_NULL_POINTER);
    CHECK_UNCHANGED(p, &s);

    /* NULL required pointers. */
    CHECK_STATUS(kva_pool_request_add(p, NULL, 5, NULL, 0, &out, &c), KVA_STATUS_NULL_POINTER);
    CHECK_ERROR_MENTIONS("prompt_tokens");
    CHECK_STATUS(kva_pool_request_add(p, prompt, 5, NULL, 0, NULL, &c), KVA_STATUS_NULL_POINTER);
    CHECK_ERROR_MENTIONS("out_request_id");
    CHECK_STATUS(kva_pool_request_add(p, prompt, 5, NULL, 3, &out, &c), KVA_STATUS_NULL_POINTER);
    CHECK_ERROR_MENTIONS("extra_key");
    CHECK_STATUS(kva_pool_request_append_tokens(p, id, NULL, 1), KVA_STATUS_NULL_POINTER);
    CHECK_ERROR_MENTIONS("tokens");
    CHECK_STATUS(kva_pool_request_fork(p, id, NULL, copy), KVA_STATUS_NULL_POINTER);
    CHECK_ERROR_MENTIONS("out_request_id");
    CHECK_STATUS(kva_pool_request_fork(p, id, &out, NULL), KVA_STATUS_NULL_POINTER);
    CHECK_ERROR_MENTIONS("out_copy");
    CHECK_STATUS(kva_pool_request_block_table(p, id, NULL, 4, NULL), KVA_STATUS_NULL_POINTER);
    CHECK_ERROR_MENTIONS("row");
    CHECK_STATUS(kva_pool_request_slots(p, id, 0, 1, NULL), KVA_STATUS_NULL_POINTER);
    CHECK_ERROR_MENTIONS("slots");
    CHECK_STATUS(kva_pool_request_get_info(p, id, NULL), KVA_STATUS_NULL_POINTER);
    CHECK_STATUS(kva_pool_get_stats(p, NULL), KVA_STATUS_NULL_POINTER);
    CHECK_ERROR_MENTIONS("out");
    CHECK_UNCHANGED(p, &s);

    /* Unknown request ids: negative, never issued, freed. */
    int32_t bad_ids[3] = {-1, 1000, gone};
    for (int i = 0; i < 3; i++) {
        int32_t b = bad_ids[i];
        CHECK_STATUS(kva_pool_request_allocate(p, b, 1, 0), KVA_STATUS_OUT_OF_RANGE);
        CHECK_ERROR_MENTIONS("request_id");
        CHECK_STATUS(kva_pool_request_append_tokens(p, b, prompt, 1), KVA_STATUS_OUT_OF_RANGE);
        CHECK_STATUS(kva_pool_request_fork(p, b, &out, copy), KVA_STATUS_OUT_OF_RANGE);
        CHECK_ERROR_MENTIONS("request_id");
        CHECK_STATUS(kva_pool_request_free(p, b), KVA_STATUS_OUT_OF_RANGE);
        CHECK_STATUS(kva_pool_request_drop_window(p, b, 1), KVA_STATUS_OUT_OF_RANGE);
        CHECK_STATUS(kva_pool_request_block_table(p, b, row, 4, NULL), KVA_STATUS_OUT_OF_RANGE);
        CHECK_STATUS(kva_pool_request_slots(p, b, 0, 1, slots), KVA_STATUS_OUT_OF_RANGE);
        CHECK_STATUS(kva_pool_request_get_info(p, b, &info), KVA_STATUS_OUT_OF_RANGE);
        CHECK_ERROR_MENTIONS("request_id");
    }
    CHECK_UNCHANGED(p, &s);

    /* Negative and out-of-range counts. */
    CHECK_STATUS(kva_pool_request_add(p, prompt, 0, NULL, 0, &out, &c),
                 KVA_STATUS_INVALID_ARGUMENT);
    CHECK_ERROR_MENTIONS("n 0");
    CHECK_STATUS(kva_pool_request_add(p, prompt, -4, NULL, 0, &out, &c),
                 KVA_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(kva_pool_request_add(p, prompt, 5, "k", KVA_POOL_MAX_EXTRA + 1, &out, &c),
                 KVA_STATUS_INVALID_ARGUMENT);
    CHECK_ERROR_MENTIONS("extra_len");
    CHECK_STATUS(kva_pool_request_allocate(p, id, -1, 0), KVA_STATUS_INVALID_ARGUMENT);
    CHECK_ERROR_MENTIONS("num_new_tokens");
    CHECK_STATUS(kva_pool_request_allocate(p, id, 0, -2), KVA_STATUS_INVALID_ARGUMENT);
    CHECK_ERROR_MENTIONS("num_lookahead_tokens");
    CHECK_STATUS(kva_pool_request_append_tokens(p, id, prompt, -1), KVA_STATUS_INVALID_ARGUMENT);
    CHECK_ERROR_MENTIONS("n -1");
    CHECK_STATUS(kva_pool_request_drop_window(p, id, -1), KVA_STATUS_INVALID_ARGUMENT);
    CHECK_ERROR_MENTIONS("window_tokens");
    CHECK_STATUS(kva_pool_request_block_table(p, id, row, -1, NULL), KVA_STATUS_INVALID_ARGUMENT);
    CHECK_ERROR_MENTIONS("row_len");
    CHECK_STATUS(kva_pool_request_slots(p, id, -1, 1, slots), KVA_STATUS_INVALID_ARGUMENT);
    CHECK_ERROR_MENTIONS("first_pos");
    CHECK_STATUS(kva_pool_request_slots(p, id, 0, -1, slots), KVA_STATUS_INVALID_ARGUMENT);
    CHECK_ERROR_MENTIONS("count");
    CHECK_STATUS(kva_pool_request_slots(p, id, INT32_MAX, 1, slots), KVA_STATUS_OUT_OF_RANGE);
    CHECK(out == -3 && c == -3);
    CHECK_UNCHANGED(p, &s);
    kva_pool_destroy(p);
}

static void test_checker_detects_corruption(void)
{
    kva_pool *p = make_pool(8, 2, KVA_POOL_HASH_SHA256, 1);
    int32_t prompt[5] = {1, 2, 3, 4, 5};
    int32_t id = prefill(p, prompt, 5, NULL, NULL), row[4];
    CHECK_OK(kva_pool_request_block_table(p, id, row, 4, NULL));
    CHECK_OK(kva_pool_check(p));

    p->blocks[row[0]].ref++; /* a reference no table holds */
    CHECK_STATUS(kva_pool_check(p), KVA_STATUS_INTERNAL);
    CHECK_ERROR_MENTIONS("ref");
    p->blocks[row[0]].ref--;

    p->num_free++; /* count disagrees with the links */
    CHECK_STATUS(kva_pool_check(p), KVA_STATUS_INTERNAL);
    CHECK_ERROR_MENTIONS("num_free");
    p->num_free--;

    p->blocks[0].in_queue = 1; /* the null block marked free */
    CHECK_STATUS(kva_pool_check(p), KVA_STATUS_INTERNAL);
    CHECK_ERROR_MENTIONS("null block");
    p->blocks[0].in_queue = 0;

    p->block_hashes[(size_t)row[1] * p->hash_len] ^= 1; /* map key no longer matches */
    CHECK_STATUS(kva_pool_check(p), KVA_STATUS_INTERNAL);
    p->block_hashes[(size_t)row[1] * p->hash_len] ^= 1;

    int32_t second = p->blocks[p->free_head].next; /* break a queue link */
    p->blocks[second].prev = 0;
    CHECK_STATUS(kva_pool_check(p), KVA_STATUS_INTERNAL);
    CHECK_ERROR_MENTIONS("prev");
    p->blocks[second].prev = p->free_head;

    p->reqs[id]->blocks[2] = 0; /* a table losing a block */
    CHECK_STATUS(kva_pool_check(p), KVA_STATUS_INTERNAL);
    p->reqs[id]->blocks[2] = row[2];
    CHECK_OK(kva_pool_check(p));
    kva_pool_destroy(p);
}

int main(void)
{
    RUN(test_create_bad_args);
    RUN(test_hash_vectors);
    RUN(test_both_hashes_hit);
    RUN(test_eviction_order);
    RUN(test_hit_cap);
    RUN(test_extra_key);
    RUN(test_fork);
    RUN(test_allocation_failure);
    RUN(test_window_drop);
    RUN(test_reset_prefix_cache);
    RUN(test_duplicates);
    RUN(test_caching_disabled);
    RUN(test_block_table_and_slots);
    RUN(test_bad_inputs);
    RUN(test_checker_detects_corruption);
    return kva_test_finish();
}
