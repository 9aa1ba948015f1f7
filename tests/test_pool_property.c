/*
 * test_pool_property.c - random operations on the block pool checked against
 * an independent model after every step.
 *
 * The model knows the live requests, their computed tokens, extra keys, block
 * counts and dropped window prefixes. It also plays the engine's KV cache:
 * every appended token is "written" through the pool's slot mapping into a
 * simulated cache that records, per slot, the token, its position and the
 * extra key. Then:
 *   - a prefix hit must return slots whose recorded token, position and key
 *     equal the prompt's (so a hit never serves another prefix's KV), and it
 *     must be at least as long as the prefix any live request has computed
 *     (full blocks of live requests are always cached);
 *   - a write must go to a block no other live request holds;
 *   - every live request's slots must still hold what it wrote;
 *   - block counts are conserved and failing calls change nothing.
 */
#include "harness.h"

#define MAX_REQS 10
#define MAX_TOKENS 256
#define DOC_LEN 48
#define VOCAB 5

typedef struct {
    int32_t id;    /* pool request id */
    int32_t extra; /* 0 none, 1 "x", 2 "y" */
    int32_t tokens[MAX_TOKENS];
    int32_t num_tokens;
    int32_t pending[MAX_TOKENS]; /* prompt tokens not yet computed */
    int32_t num_pending;
    int32_t num_blocks;
    int32_t dropped; /* blocks 0 .. dropped-1 are the null block */
} model_req;

typedef struct {
    kva_pool *pool;
    int32_t nb, bs, caching;
    model_req reqs[MAX_REQS];
    int32_t num_reqs;
    int32_t *kv_tok, *kv_pos, *kv_extra; /* simulated cache [NB * B] */
    int32_t docs[4][DOC_LEN];
    kva_rng rng;
    long ops, hits, exhausted;
} model;

/* Keys 1 and 2 have equal lengths, so only their bytes tell them apart. */
static const char *extra_bytes(int32_t e)
{
    return e == 0 ? NULL : e == 1 ? "x" : "y";
}
static size_t extra_len(int32_t e)
{
    return e == 0 ? 0 : 1;
}

static int rnd(model *m, int lo, int hi)
{
    return kva_rng_int(&m->rng, lo, hi);
}

/* Block id of position p of model request r, from the pool's table. */
static int32_t pool_block(const model *m, const model_req *r, int32_t i)
{
    int32_t row[MAX_TOKENS];
    CHECK_OK(kva_pool_request_block_table(m->pool, r->id, row, MAX_TOKENS, NULL));
    return row[i];
}

/* Number of live requests other than skip whose table holds block b. */
static int holders(const model *m, int32_t b, int skip)
{
    int n = 0;
    for (int k = 0; k < m->num_reqs; k++) {
        if (k == skip)
            continue;
        int32_t row[MAX_TOKENS], nb = 0;
        CHECK_OK(kva_pool_request_block_table(m->pool, m->reqs[k].id, row, MAX_TOKENS, &nb));
        for (int i = 0; i < nb; i++)
            n += row[i] == b;
    }
    return n;
}

/* Observable state for "a failing call changed nothing". */
typedef struct {
    kva_pool_stats stats;
    int32_t rows[MAX_REQS][MAX_TOKENS];
    kva_pool_request_info info[MAX_REQS];
} snap;

static void take_snap(const model *m, snap *s)
{
    memset(s, 0, sizeof *s);
    CHECK_OK(kva_pool_get_stats(m->pool, &s->stats));
    for (int k = 0; k < m->num_reqs; k++) {
        CHECK_OK(
            kva_pool_request_block_table(m->pool, m->reqs[k].id, s->rows[k], MAX_TOKENS, NULL));
        CHECK_OK(kva_pool_request_get_info(m->pool, m->reqs[k].id, &s->info[k]));
    }
}

/* Full consistency check of the pool against the model. */
static void check_model(model *m)
{
    CHECK_MSG(kva_pool_check(m->pool) == KVA_STATUS_OK, "op %ld: %s", m->ops, kva_last_error());
    kva_pool_stats s;
    CHECK_OK(kva_pool_get_stats(m->pool, &s));
    CHECK(s.num_requests == m->num_reqs);
    CHECK(s.num_blocks == m->nb - 1 && s.num_used_blocks + s.num_free_blocks == m->nb - 1);
    CHECK(m->caching || s.num_cached_blocks == 0);
    uint8_t *used = calloc((size_t)m->nb, 1);
    int32_t distinct = 0;
    for (int k = 0; k < m->num_reqs; k++) {
        model_req *r = &m->reqs[k];
        kva_pool_request_info info;
        CHECK_OK(kva_pool_request_get_info(m->pool, r->id, &info));
        CHECK_MSG(info.num_tokens == r->num_tokens && info.num_blocks == r->num_blocks,
                  "op %ld: request %d has %d tokens, %d blocks; model %d, %d", m->ops, r->id,
                  info.num_tokens, info.num_blocks, r->num_tokens, r->num_blocks);
        CHECK((int64_t)r->num_blocks * m->bs >= r->num_tokens);
        int32_t row[MAX_TOKENS];
        CHECK_OK(kva_pool_request_block_table(m->pool, r->id, row, MAX_TOKENS, NULL));
        for (int i = 0; i < r->num_blocks; i++) {
            CHECK_MSG((row[i] == 0) == (i < r->dropped), "op %ld: request %d block %d is %d",
                      m->ops, r->id, i, row[i]);
            if (row[i] > 0 && !used[row[i]]) {
                used[row[i]] = 1;
                distinct++;
            }
        }
        for (int i = r->num_blocks; i < MAX_TOKENS; i++)
            CHECK(row[i] == 0);
        /* Every computed token outside the window is still in its slot. */
        for (int32_t p = r->dropped * m->bs; p < r->num_tokens; p++) {
            int64_t slot = (int64_t)row[p / m->bs] * m->bs + p % m->bs;
            CHECK_MSG(m->kv_tok[slot] == r->tokens[p] && m->kv_pos[slot] == p &&
                          m->kv_extra[slot] == r->extra,
                      "op %ld: request %d position %d lost its KV", m->ops, r->id, p);
        }
    }
    CHECK_MSG(distinct == s.num_used_blocks, "op %ld: %d blocks in tables, %d used", m->ops,
              distinct, s.num_used_blocks);
    free(used);
}

/* Random prompt: a prefix of one of four documents, then random tokens. */
static int32_t make_prompt(model *m, int32_t *p)
{
    int32_t n = 0, doc = rnd(m, 0, 3), l1 = rnd(m, 0, 40), l2 = rnd(m, 0, 8);
    for (int i = 0; i < l1; i++)
        p[n++] = m->docs[doc][i];
    for (int i = 0; i < l2; i++)
        p[n++] = rnd(m, 0, VOCAB - 1);
    if (n == 0)
        p[n++] = rnd(m, 0, VOCAB - 1);
    return n;
}

static void op_add(model *m)
{
    if (m->num_reqs == MAX_REQS)
        return;
    int32_t prompt[64], n = make_prompt(m, prompt), e = rnd(m, 0, 9);
    e = e < 7 ? 0 : e < 9 ? 1 : 2;
    /* The longest computed prefix a live request with the same key holds. */
    int32_t bound = 0;
    for (int k = 0; k < m->num_reqs && m->caching; k++) {
        model_req *r = &m->reqs[k];
        if (r->extra != e || r->dropped > 0)
            continue;
        int32_t i = 0;
        while (i < (n - 1) / m->bs && (i + 1) * m->bs <= r->num_tokens &&
               memcmp(r->tokens + i * m->bs, prompt + i * m->bs, m->bs * sizeof(int32_t)) == 0)
            i++;
        if (i > bound)
            bound = i;
    }
    int32_t id = -1, c = -1;
    CHECK_OK(kva_pool_request_add(m->pool, prompt, n, extra_bytes(e), extra_len(e), &id, &c));
    CHECK(c >= 0 && c % m->bs == 0 && c <= (n - 1) / m->bs * m->bs);
    CHECK_MSG(c >= bound * m->bs, "op %ld: hit %d tokens, a live request holds %d", m->ops, c,
              bound * m->bs);
    CHECK(m->caching || c == 0);
    m->hits += c > 0;
    model_req *r = &m->reqs[m->num_reqs++];
    memset(r, 0, sizeof *r);
    r->id = id;
    r->extra = e;
    memcpy(r->tokens, prompt, (size_t)c * sizeof(int32_t));
    r->num_tokens = c;
    memcpy(r->pending, prompt + c, (size_t)(n - c) * sizeof(int32_t));
    r->num_pending = n - c;
    r->num_blocks = c / m->bs;
    /* The hit's slots hold exactly this prompt's KV under this key. */
    for (int32_t p = 0; p < c; p++) {
        int64_t slot = (int64_t)pool_block(m, r, p / m->bs) * m->bs + p % m->bs;
        CHECK_MSG(m->kv_tok[slot] == prompt[p] && m->kv_pos[slot] == p && m->kv_extra[slot] == e,
                  "op %ld: hit position %d serves another prefix's KV", m->ops, p);
    }
}

static void op_allocate(model *m, model_req *r)
{
    int32_t nn = rnd(m, 0, 2 * m->bs + 2), la = rnd(m, 0, 1) ? rnd(m, 0, 3) : 0;
    kva_pool_stats s;
    CHECK_OK(kva_pool_get_stats(m->pool, &s));
    int32_t want = (r->num_tokens + nn + la + m->bs - 1) / m->bs;
    if (want > MAX_TOKENS / 2)
        return;
    snap before, after;
    take_snap(m, &before);
    kva_status st = kva_pool_request_allocate(m->pool, r->id, nn, la);
    if (want - r->num_blocks > s.num_free_blocks) {
        CHECK_STATUS(st, KVA_STATUS_POOL_EXHAUSTED);
        take_snap(m, &after);
        CHECK_MSG(memcmp(&before, &after, sizeof before) == 0,
                  "op %ld: failed allocation changed the pool", m->ops);
        m->exhausted++;
        return;
    }
    CHECK_OK(st);
    if (want > r->num_blocks)
        r->num_blocks = want;
}

static void op_append(model *m, model_req *r, int k)
{
    int32_t room = r->num_blocks * m->bs - r->num_tokens;
    if (rnd(m, 0, 19) == 0) {
        /* Past the allocated slots: refused, nothing changes. */
        int32_t toks[MAX_TOKENS] = {0};
        snap before, after;
        take_snap(m, &before);
        if (room + 1 < MAX_TOKENS) {
            CHECK_STATUS(kva_pool_request_append_tokens(m->pool, r->id, toks, room + 1),
                         KVA_STATUS_OUT_OF_RANGE);
            take_snap(m, &after);
            CHECK(memcmp(&before, &after, sizeof before) == 0);
        }
        return;
    }
    if (room <= 0)
        return;
    int32_t n = rnd(m, 1, room), toks[MAX_TOKENS];
    if (r->num_tokens + n > MAX_TOKENS - 8)
        return;
    for (int i = 0; i < n; i++) {
        if (r->num_pending > 0) {
            toks[i] = r->pending[0];
            memmove(r->pending, r->pending + 1, (size_t)--r->num_pending * sizeof(int32_t));
        } else {
            toks[i] = rnd(m, 0, VOCAB - 1);
        }
    }
    /* The engine writes the new tokens' KV through the slot mapping. */
    int64_t slots[MAX_TOKENS];
    CHECK_OK(kva_pool_request_slots(m->pool, r->id, r->num_tokens, n, slots));
    for (int i = 0; i < n; i++) {
        int32_t b = (int32_t)(slots[i] / m->bs);
        CHECK_MSG(b > 0 && holders(m, b, k) == 0, "op %ld: write to block %d that is shared",
                  m->ops, b);
        m->kv_tok[slots[i]] = toks[i];
        m->kv_pos[slots[i]] = r->num_tokens + i;
        m->kv_extra[slots[i]] = r->extra;
    }
    CHECK_OK(kva_pool_request_append_tokens(m->pool, r->id, toks, n));
    memcpy(r->tokens + r->num_tokens, toks, (size_t)n * sizeof(int32_t));
    r->num_tokens += n;
}

static void op_fork(model *m, model_req *r)
{
    if (m->num_reqs == MAX_REQS)
        return;
    kva_pool_stats s;
    CHECK_OK(kva_pool_get_stats(m->pool, &s));
    int32_t tail = r->num_tokens % m->bs != 0, full = r->num_tokens / m->bs;
    int32_t id = -1, copy[2];
    snap before, after;
    take_snap(m, &before);
    kva_status st = kva_pool_request_fork(m->pool, r->id, &id, copy);
    if (tail && s.num_free_blocks == 0) {
        CHECK_STATUS(st, KVA_STATUS_POOL_EXHAUSTED);
        take_snap(m, &after);
        CHECK(memcmp(&before, &after, sizeof before) == 0);
        return;
    }
    CHECK_OK(st);
    CHECK(tail ? copy[0] == pool_block(m, r, full) && copy[1] > 0 : copy[0] == -1 && copy[1] == -1);
    if (tail) /* the engine copies the partial block (kva_cache_copy_blocks) */
        for (int o = 0; o < m->bs; o++) {
            m->kv_tok[copy[1] * m->bs + o] = m->kv_tok[copy[0] * m->bs + o];
            m->kv_pos[copy[1] * m->bs + o] = m->kv_pos[copy[0] * m->bs + o];
            m->kv_extra[copy[1] * m->bs + o] = m->kv_extra[copy[0] * m->bs + o];
        }
    model_req *c = &m->reqs[m->num_reqs++];
    *c = *r;
    c->id = id;
    c->num_blocks = full + tail;
}

static void op_free(model *m, int k)
{
    CHECK_OK(kva_pool_request_free(m->pool, m->reqs[k].id));
    m->reqs[k] = m->reqs[--m->num_reqs];
}

static void op_window(model *m, model_req *r)
{
    int32_t w = rnd(m, 0, 3 * m->bs);
    CHECK_OK(kva_pool_request_drop_window(m->pool, r->id, w));
    int32_t first = r->num_tokens - w;
    if (first > 0 && first / m->bs > r->dropped)
        r->dropped = first / m->bs;
}

static void op_reset(model *m)
{
    kva_pool_stats s;
    CHECK_OK(kva_pool_get_stats(m->pool, &s));
    snap before, after;
    take_snap(m, &before);
    if (s.num_used_blocks > 0) {
        CHECK_STATUS(kva_pool_reset_prefix_cache(m->pool), KVA_STATUS_INVALID_ARGUMENT);
        take_snap(m, &after);
        CHECK(memcmp(&before, &after, sizeof before) == 0);
        /* Free everything, then reset for real. */
        while (m->num_reqs > 0)
            op_free(m, m->num_reqs - 1);
    }
    CHECK_OK(kva_pool_reset_prefix_cache(m->pool));
    CHECK_OK(kva_pool_get_stats(m->pool, &s));
    CHECK(s.num_cached_blocks == 0 && s.num_free_blocks == m->nb - 1);
}

static void run_config(int32_t nb, int32_t bs, kva_pool_hash hash, int32_t caching, uint64_t seed,
                       long num_ops)
{
    model m;
    memset(&m, 0, sizeof m);
    m.nb = nb;
    m.bs = bs;
    m.caching = caching;
    m.rng.s = seed;
    kva_pool_desc d = {nb, bs, hash, caching};
    CHECK_OK(kva_pool_create(&d, &m.pool));
    size_t slots = (size_t)nb * bs;
    m.kv_tok = malloc(slots * sizeof(int32_t));
    m.kv_pos = malloc(slots * sizeof(int32_t));
    m.kv_extra = malloc(slots * sizeof(int32_t));
    for (size_t i = 0; i < slots; i++)
        m.kv_tok[i] = m.kv_pos[i] = m.kv_extra[i] = -1;
    for (int k = 0; k < 4; k++)
        for (int i = 0; i < DOC_LEN; i++)
            m.docs[k][i] = rnd(&m, 0, VOCAB - 1);

    for (m.ops = 0; m.ops < num_ops && kva_test_checks_failed_ < 20; m.ops++) {
        int op = rnd(&m, 0, 999), k = m.num_reqs > 0 ? rnd(&m, 0, m.num_reqs - 1) : -1;
        if (op < 150 || k < 0)
            op_add(&m);
        else if (op < 380)
            op_allocate(&m, &m.reqs[k]);
        else if (op < 700)
            op_append(&m, &m.reqs[k], k);
        else if (op < 770)
            op_fork(&m, &m.reqs[k]);
        else if (op < 930)
            op_free(&m, k);
        else if (op < 990)
            op_window(&m, &m.reqs[k]);
        else if (op < 992)
            op_reset(&m);
        else {
            /* An id that is not live: refused, nothing changes. */
            snap before, after;
            take_snap(&m, &before);
            CHECK_STATUS(kva_pool_request_allocate(m.pool, 1000 + op, 1, 0),
                         KVA_STATUS_OUT_OF_RANGE);
            CHECK_STATUS(kva_pool_request_free(m.pool, -1 - op), KVA_STATUS_OUT_OF_RANGE);
            take_snap(&m, &after);
            CHECK(memcmp(&before, &after, sizeof before) == 0);
        }
        check_model(&m);
    }
    kva_pool_stats s;
    CHECK_OK(kva_pool_get_stats(m.pool, &s));
    printf("  nb %d bs %d hash %d caching %d: %ld ops, %ld adds with hits, %ld exhausted, "
           "hit rate %.3f, %lld evictions\n",
           nb, bs, (int)hash, caching, m.ops, m.hits, m.exhausted, s.hit_rate,
           (long long)s.num_evicted_blocks);
    CHECK(!caching || m.hits > 100);
    CHECK(m.exhausted > 10);
    kva_pool_destroy(m.pool);
    free(m.kv_tok);
    free(m.kv_pos);
    free(m.kv_extra);
}

static void test_random_sha256_b4(void)
{
    run_config(24, 4, KVA_POOL_HASH_SHA256, 1, 11, 40000);
}
static void test_random_xxh3_b1(void)
{
    run_config(24, 1, KVA_POOL_HASH_XXH3_128, 1, 22, 30000);
}
static void test_random_xxh3_b3(void)
{
    run_config(20, 3, KVA_POOL_HASH_XXH3_128, 1, 33, 30000);
}
static void test_random_no_cache(void)
{
    run_config(32, 2, KVA_POOL_HASH_SHA256, 0, 44, 20000);
}

int main(void)
{
    RUN(test_random_sha256_b4);
    RUN(test_random_xxh3_b1);
    RUN(test_random_xxh3_b3);
    RUN(test_random_no_cache);
    return kva_test_finish();
}
