/* test_pool_blackbox.c - kvattn_pool.h's promises checked through the
 * public API only (no pool internals): tail-first eviction with the free
 * queue's head taken first, drop_window(0) with a partial last block, forks
 * of a request with dropped blocks, lookahead positions, reset while in use,
 * and failing calls that change nothing observable. test_pool.c and
 * test_pool_property.c test the same pool from the inside. */
#include "harness.h"

static kva_pool *make_pool(int32_t nb, int32_t bs)
{
    kva_pool_desc d = {nb, bs, KVA_POOL_HASH_XXH3_128, 1};
    kva_pool *p = NULL;
    kva_status st = kva_pool_create(&d, &p);
    if (st == KVA_STATUS_UNSUPPORTED) { /* a build without xxHash */
        d.hash = KVA_POOL_HASH_SHA256;
        st = kva_pool_create(&d, &p);
    }
    CHECK_OK(st);
    return p;
}

/* Everything a caller can observe about request id (and the pool). */
typedef struct {
    kva_pool_stats stats;
    kva_pool_request_info info;
    int32_t row[16];
} view;

static void look(const kva_pool *p, int32_t id, view *v)
{
    memset(v, 0, sizeof *v);
    CHECK_OK(kva_pool_get_stats(p, &v->stats));
    CHECK_OK(kva_pool_request_get_info(p, id, &v->info));
    CHECK_OK(kva_pool_request_block_table(p, id, v->row, 16, NULL));
}

static void same(const kva_pool *p, int32_t id, const view *before, int line)
{
    view now;
    look(p, id, &now);
    CHECK_MSG(memcmp(&now, before, sizeof now) == 0, "pool changed by a failing call (line %d)",
              line);
    CHECK_MSG(kva_pool_check(p) == KVA_STATUS_OK, "line %d: %s", line, kva_last_error());
}

/* add + allocate + append of the uncached part; returns the id. */
static int32_t prefill(kva_pool *p, const int32_t *prompt, int32_t n, int32_t *cached)
{
    int32_t id = -1, c = -1;
    CHECK_OK(kva_pool_request_add(p, prompt, n, NULL, 0, &id, &c));
    CHECK_OK(kva_pool_request_allocate(p, id, n - c, 0));
    CHECK_OK(kva_pool_request_append_tokens(p, id, prompt + c, n - c));
    if (cached)
        *cached = c;
    return id;
}

/* Blocks are released last block first, to the tail of the free queue, and
 * taken from its head: a freed prompt loses its tail blocks first, and a
 * later request with the same prompt still hits its leading blocks. */
static void test_tail_first_eviction(void)
{
    enum { B = 4 };
    kva_pool *p = make_pool(5, B); /* 4 usable blocks */
    int32_t a[3 * B + 1], other[2 * B];
    for (int i = 0; i < 3 * B + 1; i++)
        a[i] = 100 + i;
    for (int i = 0; i < 2 * B; i++)
        other[i] = 900 + i;
    int32_t c = -1, id = prefill(p, a, 3 * B + 1, &c);
    CHECK(c == 0);
    int32_t row_a[4];
    CHECK_OK(kva_pool_request_block_table(p, id, row_a, 4, NULL));
    CHECK_OK(kva_pool_request_free(p, id));
    kva_pool_stats s;
    CHECK_OK(kva_pool_get_stats(p, &s));
    CHECK(s.num_free_blocks == 4 && s.num_cached_blocks == 3 && s.num_used_blocks == 0);
    /* Two blocks for another prompt: A's partial block, then its third full one. */
    int32_t ob = prefill(p, other, 2 * B - 1, &c);
    int32_t row_o[2];
    CHECK_OK(kva_pool_request_block_table(p, ob, row_o, 2, NULL));
    CHECK_MSG(row_o[0] == row_a[3] && row_o[1] == row_a[2], "took %d %d, A had %d %d %d %d",
              (int)row_o[0], (int)row_o[1], (int)row_a[0], (int)row_a[1], (int)row_a[2],
              (int)row_a[3]);
    CHECK_OK(kva_pool_get_stats(p, &s));
    CHECK(s.num_evicted_blocks == 1 && s.num_cached_blocks == 3); /* + the new full block */
    /* A's prompt again: its first two blocks hit (the third was evicted). */
    int32_t again = -1;
    CHECK_OK(kva_pool_request_add(p, a, 3 * B + 1, NULL, 0, &again, &c));
    CHECK(c == 2 * B);
    int32_t row2[2];
    CHECK_OK(kva_pool_request_block_table(p, again, row2, 2, NULL));
    CHECK(row2[0] == row_a[0] && row2[1] == row_a[1]);
    CHECK_OK(kva_pool_check(p));
    kva_pool_destroy(p);
}

/* drop_window(0) releases every block before position num_tokens: the full
 * blocks, not the partial one that holds the next position; a fork of that
 * request shares the null entries and copies the partial block. */
static void test_drop_all_then_fork(void)
{
    enum { B = 3 };
    kva_pool *p = make_pool(12, B);
    int32_t prompt[2 * B + 2];
    for (int i = 0; i < 2 * B + 2; i++)
        prompt[i] = 7 * i + 1;
    int32_t id = prefill(p, prompt, 2 * B + 2, NULL);
    int32_t before[3], row[4];
    CHECK_OK(kva_pool_request_block_table(p, id, before, 3, NULL));
    CHECK_OK(kva_pool_request_drop_window(p, id, 0));
    CHECK_OK(kva_pool_request_block_table(p, id, row, 4, NULL));
    CHECK(row[0] == 0 && row[1] == 0 && row[2] == before[2] && row[3] == 0);
    int64_t slot = -1;
    CHECK_OK(kva_pool_request_slots(p, id, 2 * B + 1, 1, &slot));
    CHECK(slot == (int64_t)before[2] * B + 1);
    view v;
    look(p, id, &v);
    CHECK_STATUS(kva_pool_request_slots(p, id, B, 1, &slot), KVA_STATUS_OUT_OF_RANGE);
    CHECK_ERROR_MENTIONS("dropped");
    same(p, id, &v, __LINE__);
    /* The next token goes into the kept partial block. */
    CHECK_OK(kva_pool_request_allocate(p, id, 1, 0));
    CHECK_OK(kva_pool_request_append_tokens(p, id, prompt, 1));
    int32_t f = -1, copy[2] = {-5, -5};
    /* 2B + 3 tokens = 3 full blocks: no partial block to copy. */
    CHECK_OK(kva_pool_request_fork(p, id, &f, copy));
    CHECK(copy[0] == -1 && copy[1] == -1);
    int32_t frow[4];
    CHECK_OK(kva_pool_request_block_table(p, f, frow, 4, NULL));
    CHECK(frow[0] == 0 && frow[1] == 0 && frow[2] == before[2] && frow[3] == 0);
    /* One more token in the fork: a fresh block; the source keeps its own. */
    CHECK_OK(kva_pool_request_allocate(p, f, 1, 0));
    CHECK_OK(kva_pool_request_append_tokens(p, f, prompt, 1));
    int32_t f2 = -1;
    CHECK_OK(kva_pool_request_fork(p, f, &f2, copy));
    CHECK(copy[1] > 0 && copy[0] > 0 && copy[0] != copy[1]);
    CHECK_OK(kva_pool_check(p));
    CHECK_OK(kva_pool_request_free(p, id));
    CHECK_OK(kva_pool_request_free(p, f));
    CHECK_OK(kva_pool_request_free(p, f2));
    kva_pool_stats s;
    CHECK_OK(kva_pool_get_stats(p, &s));
    CHECK(s.num_used_blocks == 0 && s.num_free_blocks == 11 && s.num_requests == 0);
    CHECK_OK(kva_pool_check(p));
    kva_pool_destroy(p);
}

/* Lookahead positions are allocated and writable; past them nothing is. */
static void test_lookahead_and_failures_change_nothing(void)
{
    enum { B = 4 };
    kva_pool *p = make_pool(6, B);
    int32_t prompt[5] = {1, 2, 3, 4, 5};
    int32_t id = prefill(p, prompt, 5, NULL);
    CHECK_OK(kva_pool_request_allocate(p, id, 1, 2)); /* 8 positions: 2 blocks */
    kva_pool_request_info info;
    CHECK_OK(kva_pool_request_get_info(p, id, &info));
    CHECK(info.num_blocks == 2 && info.num_tokens == 5);
    CHECK_OK(kva_pool_request_append_tokens(p, id, prompt, 3)); /* 6, 7, 8: lookahead */
    view v;
    look(p, id, &v);
    CHECK_STATUS(kva_pool_request_append_tokens(p, id, prompt, 1), KVA_STATUS_OUT_OF_RANGE);
    CHECK_ERROR_MENTIONS("not allocated");
    same(p, id, &v, __LINE__);
    CHECK_STATUS(kva_pool_request_allocate(p, id, INT32_MAX - 4, INT32_MAX),
                 KVA_STATUS_OUT_OF_RANGE);
    same(p, id, &v, __LINE__);
    CHECK_STATUS(kva_pool_request_allocate(p, id, 4 * B + 1, 0), KVA_STATUS_POOL_EXHAUSTED);
    same(p, id, &v, __LINE__);
    int64_t slots[2] = {-7, -7};
    CHECK_STATUS(kva_pool_request_slots(p, id, 7, 2, slots), KVA_STATUS_OUT_OF_RANGE);
    CHECK(slots[0] == -7 && slots[1] == -7);
    int32_t row[1] = {-7};
    CHECK_STATUS(kva_pool_request_block_table(p, id, row, 1, NULL), KVA_STATUS_OUT_OF_RANGE);
    CHECK(row[0] == -7);
    /* Reset is refused while a block is in use and changes nothing. */
    CHECK_STATUS(kva_pool_reset_prefix_cache(p), KVA_STATUS_INVALID_ARGUMENT);
    same(p, id, &v, __LINE__);
    CHECK(v.stats.num_cached_blocks == 2);
    CHECK_OK(kva_pool_request_free(p, id));
    CHECK_OK(kva_pool_reset_prefix_cache(p));
    kva_pool_stats s;
    CHECK_OK(kva_pool_get_stats(p, &s));
    CHECK(s.num_cached_blocks == 0 && s.num_free_blocks == 5);
    int32_t c = -1;
    id = prefill(p, prompt, 5, &c);
    CHECK(c == 0); /* nothing cached any more */
    CHECK_OK(kva_pool_check(p));
    kva_pool_destroy(p);
}

int main(void)
{
    RUN(test_tail_first_eviction);
    RUN(test_drop_all_then_fork);
    RUN(test_lookahead_and_failures_change_nothing);
    return kva_test_finish();
}
