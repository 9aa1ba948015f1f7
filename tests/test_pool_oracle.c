/*
 * test_pool_oracle.c - the block pool against an exact model written from
 * kvattn_pool.h and docs/pool.md only (no pool internals).
 *
 * test_pool_property.c checks that hits serve the right KV and bounds the hit
 * length from below. This model predicts everything a caller can observe:
 *   - the free queue: new blocks come from its head, released blocks join its
 *     tail, a request's blocks are released last block first (free, window and
 *     chunk drops), a hit takes a free cached block out of the middle; so every
 *     allocated or copied block id is predicted exactly (ids reused after free);
 *   - the prefix cache keyed by (extra key, whole token prefix): a hit is the
 *     longest run of leading blocks that have a cached block, capped at
 *     (n - 1) / B blocks; the hit block must be one of the blocks cached under
 *     that key (duplicates are allowed, the pool picks one);
 *   - eviction: taking a free cached block drops its hash (num_evicted_blocks);
 *   - every stats field, every request's info and block-table row and slots;
 *   - failing calls (exhausted pool, bad ids, bad counts) change nothing.
 * Prompts are built from a few block-sized chunks, so the same block content
 * appears under different parents (equal blocks with different prefixes must
 * not hit), and two extra keys of equal length differ only in their bytes.
 */
#include "harness.h"

#define MAX_NB 40
#define MAX_REQS 8
#define MAX_TOK 160
#define MAX_KEYS 4096

typedef struct {
    int32_t id, extra, num_tokens, num_blocks, num_pending;
    int32_t tokens[MAX_TOK], pending[MAX_TOK], blocks[MAX_TOK];
} mreq;

typedef struct {
    int32_t extra, len, tokens[MAX_TOK];
} mkey;

typedef struct {
    kva_pool *pool;
    int32_t nb, bs, caching;
    int32_t ref[MAX_NB], key[MAX_NB]; /* key: index into keys, -1 uncached */
    int32_t queue[MAX_NB], qlen;      /* free queue, head first */
    mreq reqs[MAX_REQS];
    int32_t num_reqs;
    mkey *keys;
    int32_t num_keys;
    int64_t query, hit, evicted;
    int32_t chunks[4][16];
    kva_rng rng;
    long op;
} model;

static const char *const extras[3] = {NULL, "ab", "ba"};

static int rnd(model *m, int lo, int hi) { return lo + (int)((uint32_t)kva_rng_u64(&m->rng) % (uint32_t)(hi - lo + 1)); }

static int32_t key_of(model *m, int32_t extra, const int32_t *t, int32_t len, int create)
{
    for (int32_t k = 0; k < m->num_keys; k++)
        if (m->keys[k].extra == extra && m->keys[k].len == len &&
            memcmp(m->keys[k].tokens, t, (size_t)len * sizeof(int32_t)) == 0)
            return k;
    if (!create || m->num_keys == MAX_KEYS)
        return -1;
    mkey *k = &m->keys[m->num_keys];
    k->extra = extra;
    k->len = len;
    memcpy(k->tokens, t, (size_t)len * sizeof(int32_t));
    return m->num_keys++;
}

static void q_remove(model *m, int32_t b)
{
    for (int32_t i = 0; i < m->qlen; i++)
        if (m->queue[i] == b) {
            memmove(m->queue + i, m->queue + i + 1, (size_t)(m->qlen - i - 1) * sizeof(int32_t));
            m->qlen--;
            return;
        }
    CHECK_MSG(0, "op %ld: model: block %d not in the free queue", m->op, b);
}

static int32_t take_head(model *m)
{
    int32_t b = m->queue[0];
    q_remove(m, b);
    if (m->key[b] >= 0) {
        m->key[b] = -1;
        m->evicted++;
    }
    m->ref[b] = 1;
    return b;
}

static void release(model *m, int32_t b)
{
    if (b != 0 && --m->ref[b] == 0)
        m->queue[m->qlen++] = b;
}

/* Compares everything observable with the model. */
static void compare(model *m, const char *what)
{
    CHECK_MSG(kva_pool_check(m->pool) == KVA_STATUS_OK, "op %ld %s: %s", m->op, what,
              kva_last_error());
    kva_pool_stats s;
    CHECK_OK(kva_pool_get_stats(m->pool, &s));
    int32_t used = 0, cached = 0;
    for (int32_t b = 1; b < m->nb; b++) {
        used += m->ref[b] > 0;
        cached += m->key[b] >= 0;
    }
    CHECK_MSG(s.num_blocks == m->nb - 1 && s.num_used_blocks == used && s.num_free_blocks == m->qlen &&
                  s.num_cached_blocks == cached && s.num_requests == m->num_reqs,
              "op %ld %s: stats used %d free %d cached %d reqs %d; model %d %d %d %d", m->op, what,
              s.num_used_blocks, s.num_free_blocks, s.num_cached_blocks, s.num_requests, used,
              m->qlen, cached, m->num_reqs);
    CHECK_MSG(s.query_tokens == m->query && s.hit_tokens == m->hit && s.num_evicted_blocks == m->evicted,
              "op %ld %s: query %lld hit %lld evicted %lld; model %lld %lld %lld", m->op, what,
              (long long)s.query_tokens, (long long)s.hit_tokens, (long long)s.num_evicted_blocks,
              (long long)m->query, (long long)m->hit, (long long)m->evicted);
    CHECK(s.hit_rate == (m->query ? (double)m->hit / (double)m->query : 0.0));
    CHECK(s.usage == (double)used / (double)(m->nb - 1));
    for (int k = 0; k < m->num_reqs; k++) {
        mreq *r = &m->reqs[k];
        kva_pool_request_info info;
        CHECK_OK(kva_pool_request_get_info(m->pool, r->id, &info));
        CHECK_MSG(info.num_tokens == r->num_tokens && info.num_blocks == r->num_blocks,
                  "op %ld %s: request %d info %d tokens %d blocks; model %d %d", m->op, what, r->id,
                  info.num_tokens, info.num_blocks, r->num_tokens, r->num_blocks);
        int32_t row[MAX_TOK + 2], nbk = -1;
        for (int i = 0; i < MAX_TOK + 2; i++)
            row[i] = -7;
        CHECK_OK(kva_pool_request_block_table(m->pool, r->id, row, MAX_TOK + 1, &nbk));
        CHECK(nbk == r->num_blocks && row[MAX_TOK + 1] == -7);
        for (int i = 0; i <= MAX_TOK; i++) {
            int32_t want = i < r->num_blocks ? r->blocks[i] : 0;
            CHECK_MSG(row[i] == want, "op %ld %s: request %d block %d is %d, model %d", m->op, what,
                      r->id, i, row[i], want);
            if (row[i] != want)
                break;
        }
    }
}

static mreq *find(model *m, int32_t id)
{
    for (int k = 0; k < m->num_reqs; k++)
        if (m->reqs[k].id == id)
            return &m->reqs[k];
    return NULL;
}

static int32_t make_prompt(model *m, int32_t *p)
{
    int32_t n = 0, nchunks = rnd(m, 0, 4);
    for (int c = 0; c < nchunks; c++) {
        int32_t which = rnd(m, 0, 3);
        for (int i = 0; i < m->bs; i++)
            p[n++] = m->chunks[which][i];
    }
    for (int i = rnd(m, nchunks == 0, m->bs + 1); i > 0; i--)
        p[n++] = rnd(m, 0, 1);
    return n;
}

static void op_add(model *m)
{
    if (m->num_reqs == MAX_REQS)
        return;
    int32_t prompt[MAX_TOK], n = make_prompt(m, prompt), e = rnd(m, 0, 2);
    int32_t id = -1, c = -1;
    CHECK_OK(kva_pool_request_add(m->pool, prompt, n, extras[e], e ? 2 : 0, &id, &c));
    CHECK_MSG(id >= 0 && find(m, id) == NULL, "op %ld: new id %d", m->op, id);
    int32_t row[MAX_TOK];
    CHECK_OK(kva_pool_request_block_table(m->pool, id, row, MAX_TOK, NULL));
    int32_t hit = 0;
    for (; m->caching && hit < (n - 1) / m->bs; hit++) {
        int32_t k = key_of(m, e, prompt, (hit + 1) * m->bs, 0), any = 0;
        for (int32_t b = 1; b < m->nb && k >= 0; b++)
            any |= m->key[b] == k;
        if (!any)
            break;
        CHECK_MSG(hit * m->bs >= c || m->key[row[hit]] == k,
                  "op %ld: hit block %d (%d) is not cached under the prompt's prefix", m->op, hit,
                  row[hit]);
    }
    CHECK_MSG(c == hit * m->bs, "op %ld: add hit %d tokens, model %d", m->op, c, hit * m->bs);
    mreq *r = &m->reqs[m->num_reqs++];
    memset(r, 0, sizeof *r);
    r->id = id;
    r->extra = e;
    r->num_tokens = r->num_blocks = 0;
    for (int32_t i = 0; i < c / m->bs && i < hit; i++) {
        int32_t b = row[i];
        if (m->ref[b]++ == 0)
            q_remove(m, b);
        r->blocks[r->num_blocks++] = b;
    }
    r->num_tokens = r->num_blocks * m->bs;
    memcpy(r->tokens, prompt, (size_t)r->num_tokens * sizeof(int32_t));
    r->num_pending = n - r->num_tokens;
    memcpy(r->pending, prompt + r->num_tokens, (size_t)r->num_pending * sizeof(int32_t));
    if (m->caching) {
        m->query += n;
        m->hit += r->num_tokens;
    }
}

static void op_allocate(model *m, mreq *r)
{
    int32_t nn = rnd(m, 0, 2 * m->bs + 1), la = rnd(m, 0, 2) ? 0 : rnd(m, 0, 3);
    int32_t want = (r->num_tokens + nn + la + m->bs - 1) / m->bs;
    if (want > MAX_TOK / 2)
        return;
    kva_status st = kva_pool_request_allocate(m->pool, r->id, nn, la);
    if (want - r->num_blocks > m->qlen) {
        CHECK_STATUS(st, KVA_STATUS_POOL_EXHAUSTED);
        return;
    }
    CHECK_OK(st);
    while (r->num_blocks < want)
        r->blocks[r->num_blocks++] = take_head(m);
}

static void op_append(model *m, mreq *r)
{
    int32_t room = r->num_blocks * m->bs - r->num_tokens;
    if (room <= 0 || r->num_tokens >= MAX_TOK - 2 * m->bs)
        return;
    int32_t n = rnd(m, 1, room), toks[MAX_TOK];
    for (int i = 0; i < n; i++) {
        if (r->num_pending > 0) {
            toks[i] = r->pending[0];
            memmove(r->pending, r->pending + 1, (size_t)--r->num_pending * sizeof(int32_t));
        } else {
            toks[i] = rnd(m, 0, 1);
        }
    }
    int64_t slots[MAX_TOK];
    CHECK_OK(kva_pool_request_slots(m->pool, r->id, r->num_tokens, n, slots));
    for (int i = 0; i < n; i++) {
        int32_t p = r->num_tokens + i;
        CHECK(slots[i] == (int64_t)r->blocks[p / m->bs] * m->bs + p % m->bs);
    }
    CHECK_OK(kva_pool_request_append_tokens(m->pool, r->id, toks, n));
    int32_t full0 = r->num_tokens / m->bs;
    memcpy(r->tokens + r->num_tokens, toks, (size_t)n * sizeof(int32_t));
    r->num_tokens += n;
    for (int32_t i = full0; m->caching && i < r->num_tokens / m->bs; i++)
        m->key[r->blocks[i]] = key_of(m, r->extra, r->tokens, (i + 1) * m->bs, 1);
}

static void op_fork(model *m, mreq *r)
{
    if (m->num_reqs == MAX_REQS)
        return;
    int32_t full = r->num_tokens / m->bs, tail = r->num_tokens % m->bs != 0;
    int32_t id = -1, copy[2] = {-5, -5};
    kva_status st = kva_pool_request_fork(m->pool, r->id, &id, copy);
    if (tail && m->qlen == 0) {
        CHECK_STATUS(st, KVA_STATUS_POOL_EXHAUSTED);
        return;
    }
    CHECK_OK(st);
    mreq *c = &m->reqs[m->num_reqs++];
    *c = *r; /* r may have moved? no: appended after r */
    c->id = id;
    for (int32_t i = 0; i < full; i++)
        if (c->blocks[i] != 0)
            m->ref[c->blocks[i]]++;
    c->num_blocks = full;
    if (tail) {
        int32_t b = take_head(m);
        CHECK_MSG(copy[0] == r->blocks[full] && copy[1] == b, "op %ld: fork copy (%d, %d), model (%d, %d)",
                  m->op, copy[0], copy[1], r->blocks[full], b);
        c->blocks[c->num_blocks++] = b;
    } else {
        CHECK(copy[0] == -1 && copy[1] == -1);
    }
}

static void op_free(model *m, int k)
{
    mreq *r = &m->reqs[k];
    CHECK_OK(kva_pool_request_free(m->pool, r->id));
    for (int32_t i = r->num_blocks - 1; i >= 0; i--)
        release(m, r->blocks[i]);
    m->reqs[k] = m->reqs[--m->num_reqs];
}

/* drop_window (chunk 0) or drop_chunk (chunk > 0). */
static void op_drop(model *m, mreq *r, int32_t chunk)
{
    int32_t first;
    if (chunk == 0) {
        int32_t w = rnd(m, 0, 2 * m->bs);
        CHECK_OK(kva_pool_request_drop_window(m->pool, r->id, w));
        first = r->num_tokens - w;
    } else {
        CHECK_OK(kva_pool_request_drop_chunk(m->pool, r->id, chunk));
        first = r->num_tokens - r->num_tokens % chunk;
    }
    for (int32_t i = (first > 0 ? first / m->bs : 0) - 1; i >= 0; i--) {
        release(m, r->blocks[i]);
        r->blocks[i] = 0;
    }
}

/* Calls that must fail and change nothing. */
static void op_bad(model *m, mreq *r)
{
    int32_t toks[4] = {0, 1, 0, 1}, id = -3, c = -3, copy[2];
    int64_t slots[4];
    int32_t dead = 1000 + rnd(m, 0, 50), room = r ? r->num_blocks * m->bs - r->num_tokens : 0;
    switch (rnd(m, 0, 9)) {
    case 0: CHECK(kva_pool_request_allocate(m->pool, dead, 1, 0) != KVA_STATUS_OK); break;
    case 1: CHECK(kva_pool_request_free(m->pool, -1) != KVA_STATUS_OK); break;
    case 2: CHECK(kva_pool_request_fork(m->pool, dead, &id, copy) != KVA_STATUS_OK); break;
    case 3: CHECK(kva_pool_request_add(m->pool, toks, 0, NULL, 0, &id, &c) != KVA_STATUS_OK); break;
    case 4:
        if (r) CHECK(kva_pool_request_allocate(m->pool, r->id, -1, 0) != KVA_STATUS_OK);
        break;
    case 5:
        if (r) CHECK(kva_pool_request_drop_window(m->pool, r->id, -1) != KVA_STATUS_OK);
        break;
    case 6:
        if (r) CHECK(kva_pool_request_drop_chunk(m->pool, r->id, 0) != KVA_STATUS_OK);
        break;
    case 7:
        if (r && room < 4)
            CHECK(kva_pool_request_append_tokens(m->pool, r->id, toks, room + 1) != KVA_STATUS_OK);
        break;
    case 8:
        if (r && r->num_blocks > 0 && r->blocks[0] == 0)
            CHECK(kva_pool_request_slots(m->pool, r->id, 0, 1, slots) != KVA_STATUS_OK);
        else if (r)
            CHECK(kva_pool_request_slots(m->pool, r->id, r->num_blocks * m->bs, 1, slots) !=
                  KVA_STATUS_OK);
        break;
    default:
        if (r) CHECK(kva_pool_request_allocate(m->pool, r->id, INT32_MAX - 1, 2) != KVA_STATUS_OK);
        break;
    }
}

static void op_reset(model *m)
{
    int32_t used = 0;
    for (int32_t b = 1; b < m->nb; b++)
        used += m->ref[b] > 0;
    if (used) {
        CHECK_STATUS(kva_pool_reset_prefix_cache(m->pool), KVA_STATUS_INVALID_ARGUMENT);
        return;
    }
    CHECK_OK(kva_pool_reset_prefix_cache(m->pool));
    for (int32_t b = 1; b < m->nb; b++)
        m->key[b] = -1;
}

static void run(int32_t nb, int32_t bs, kva_pool_hash hash, int32_t caching, uint64_t seed, long ops)
{
    static model m;
    memset(&m, 0, sizeof m);
    m.nb = nb;
    m.bs = bs;
    m.caching = caching;
    m.keys = calloc(MAX_KEYS, sizeof(mkey));
    m.rng.s = seed;
    for (int c = 0; c < 4; c++)
        for (int i = 0; i < bs; i++)
            m.chunks[c][i] = (c == 3 && i == bs - 1) ? 7 : rnd(&m, 0, 1);
    kva_pool_desc d = {nb, bs, hash, caching};
    CHECK_OK(kva_pool_create(&d, &m.pool));
    for (int32_t b = 0; b < nb; b++)
        m.key[b] = -1;
    for (int32_t b = 1; b < nb; b++)
        m.queue[m.qlen++] = b; /* block ids in order, like vLLM's */
    compare(&m, "create");
    int fails0 = kva_test_checks_failed_;
    for (m.op = 0; m.op < ops && kva_test_checks_failed_ == fails0; m.op++) {
        int k = m.num_reqs ? rnd(&m, 0, m.num_reqs - 1) : -1;
        mreq *r = k >= 0 ? &m.reqs[k] : NULL;
        int what = rnd(&m, 0, 99);
        const char *name = "";
        if (what < 18 || !r) {
            op_add(&m);
            name = "add";
        } else if (what < 38) {
            op_allocate(&m, r);
            name = "allocate";
        } else if (what < 62) {
            op_append(&m, r);
            name = "append";
        } else if (what < 68) {
            op_fork(&m, r);
            name = "fork";
        } else if (what < 80) {
            op_free(&m, k);
            name = "free";
        } else if (what < 85) {
            op_drop(&m, r, 0);
            name = "drop_window";
        } else if (what < 89) {
            op_drop(&m, r, rnd(&m, 1, 2 * bs + 1));
            name = "drop_chunk";
        } else if (what < 98) {
            op_bad(&m, r);
            name = "bad";
        } else {
            op_reset(&m);
            name = "reset";
        }
        compare(&m, name);
    }
    while (m.num_reqs > 0)
        op_free(&m, m.num_reqs - 1);
    compare(&m, "final free");
    printf("nb %d bs %d caching %d: %ld ops, %lld of %lld prompt tokens hit, %lld evictions\n", nb,
           bs, caching, m.op, (long long)m.hit, (long long)m.query, (long long)m.evicted);
    kva_pool_destroy(m.pool);
    free(m.keys);
}

static void test_oracle_b1(void) { run(9, 1, KVA_POOL_HASH_XXH3_128, 1, 11, 4000); }
static void test_oracle_b3(void) { run(17, 3, KVA_POOL_HASH_SHA256, 1, 12, 4000); }
static void test_oracle_b4_tight(void) { run(6, 4, KVA_POOL_HASH_XXH3_128, 1, 13, 4000); }
static void test_oracle_b2_wide(void) { run(40, 2, KVA_POOL_HASH_SHA256, 1, 14, 4000); }
static void test_oracle_nocache(void) { run(12, 3, KVA_POOL_HASH_SHA256, 0, 15, 3000); }

int main(void)
{
    RUN(test_oracle_b1);
    RUN(test_oracle_b3);
    RUN(test_oracle_b4_tight);
    RUN(test_oracle_b2_wide);
    RUN(test_oracle_nocache);
    return kva_test_finish();
}
