/*
 * test_api_aliasing.c - kvattn.h's aliasing rule, checked by the run calls:
 * an output (out, lse; the indexer's indices, topk_length) that overlaps an
 * input (q, the ragged k / v, sinks, the MLA weights, the sparse indices, the
 * indexer's weights, the cache's K / V storage) or the other output gets
 * KVA_STATUS_INVALID_ARGUMENT with a message naming both, and nothing is
 * written (kva_merge_states too, whose out / lse_out may only be its inputs
 * themselves: in place, the host helpers kva_batch_reorder_decode_first,
 * kva_dcp_local_lens and kva_dcp_slots, and the pool's outputs); buffers that only touch (one ends
 * where the next begins) run and give the bytes of a run on separate buffers. Reference and CPU
 * backends.
 *
 * Every buffer of a case lives in one arena (poisoned with NaN), so that the
 * overlaps are real and the "nothing written" check covers every byte a
 * refused call could have written.
 */
#include "blackbox_util.h"
#include "indexer_util.h"
#include "sparse_util.h"

/* T, H, D, Dv, Hkv of the fixture of blackbox_util.h and its ragged twin. */
enum { AT = 4, AH = 4, AD = 16, AHKV = 2, AQ = AT * AH * AD, ALSE = AT * AH, AKV = 12 * AHKV * AD };

/* A refused call: INVALID_ARGUMENT, a message naming output a and b. */
#define REFUSED(expr, a, b)                                                                        \
    do {                                                                                           \
        CHECK_STATUS(expr, KVA_STATUS_INVALID_ARGUMENT);                                           \
        CHECK_ERROR_MENTIONS("overlaps");                                                          \
        CHECK_ERROR_MENTIONS(a);                                                                   \
        CHECK_ERROR_MENTIONS(b);                                                                   \
    } while (0)

/* The arena of a case: n floats, NaN-poisoned, and its checksum. */
typedef struct arena {
    float *p;
    size_t n;
    uint64_t sum;
} arena;

static void arena_init(arena *a, size_t n)
{
    a->p = malloc(n * sizeof(float));
    a->n = n;
    kva_test_poison(a->p, KVA_DTYPE_F32, n);
}

static void arena_seal(arena *a)
{
    a->sum = bb_sum(a->p, a->n * sizeof(float));
}

static int arena_same(const arena *a)
{
    return bb_sum(a->p, a->n * sizeof(float)) == a->sum;
}

/* kva_attention_run with q at the arena's offset qo and out / lse at other
 * offsets (lo < 0: no lse; so < 0: no sinks, else sinks [H] at so). */
static kva_status paged_at(bb_fix *f, arena *a, size_t qo, size_t oo, long lo, long so)
{
    return kva_attention_run(f->ctx, f->plan, a->p + qo, f->cache, so < 0 ? NULL : a->p + so,
                             a->p + oo, lo < 0 ? NULL : a->p + lo);
}

static void paged_cases(kva_backend be)
{
    bb_fix f;
    bb_fix_init(&f, be, 11);
    const float sinks[AH] = {0.5f, -1.0f, 0.25f, 2.0f};
    /* The run on separate buffers: the bytes every accepted placement must give. */
    CHECK_OK(kva_attention_run(f.ctx, f.plan, f.q, f.cache, sinks, f.out, f.lse));
    /* Written everywhere: the placements are compared with these bytes only,
     * in buffers that hold the same poison. */
    CHECK(kva_test_count_poisoned(f.out, KVA_DTYPE_F32, AQ) == 0 &&
          kva_test_count_poisoned(f.lse, KVA_DTYPE_F32, ALSE) == 0);
    float want_out[AQ], want_lse[ALSE];
    memcpy(want_out, f.out, sizeof want_out);
    memcpy(want_lse, f.lse, sizeof want_lse);
    kva_test_poison(f.out, KVA_DTYPE_F32, AQ);
    kva_test_poison(f.lse, KVA_DTYPE_F32, ALSE);
    f.sum_out = bb_sum(f.out, sizeof f.out);
    f.sum_lse = bb_sum(f.lse, sizeof f.lse);

    /* Arena layout: [pad AQ + ALSE][q AQ][out-or-q AQ][lse ALSE][sinks AH][pad 64]. */
    arena a;
    arena_init(&a, 3 * AQ + 2 * ALSE + AH + 64);
    const size_t q0 = AQ + ALSE, b0 = q0 + AQ, l0 = b0 + AQ, s0 = l0 + ALSE;
    memcpy(a.p + q0, f.q, sizeof f.q);
    memcpy(a.p + s0, sinks, sizeof sinks);
    arena_seal(&a);

    /* out == q, out over q's last element, out ending on q's first element. */
    REFUSED(paged_at(&f, &a, q0, q0, (long)l0, (long)s0), "output out", "input q");
    CHECK(arena_same(&a));
    REFUSED(paged_at(&f, &a, q0, b0 - 1, (long)l0, (long)s0), "output out", "input q");
    CHECK(arena_same(&a));
    REFUSED(paged_at(&f, &a, q0, q0 + 1 - AQ, -1, -1), "output out", "input q");
    CHECK(arena_same(&a));
    /* lse over q's tail, over out, over the sinks; out over the sinks. */
    REFUSED(paged_at(&f, &a, q0, b0, (long)(b0 - 3), (long)s0), "output lse", "input q");
    CHECK(arena_same(&a));
    REFUSED(paged_at(&f, &a, q0, b0, (long)(b0 + AQ - 1), (long)s0), "output lse", "output out");
    CHECK(arena_same(&a));
    REFUSED(paged_at(&f, &a, q0, b0, (long)(s0 - ALSE + 1), (long)s0), "output lse", "input sinks");
    CHECK(arena_same(&a));
    REFUSED(paged_at(&f, &a, q0, s0 + AH - AQ, -1, (long)s0), "output out", "input sinks");
    CHECK(arena_same(&a));
    /* out over the cache's K, then its V storage: the cache stays as it was. */
    void *ck = NULL, *cv = NULL;
    CHECK_OK(kva_cache_data(f.cache, &ck, &cv));
    REFUSED(kva_attention_run(f.ctx, f.plan, f.q, f.cache, NULL, (float *)ck + 5, NULL),
            "output out", "input cache K");
    REFUSED(kva_attention_run(f.ctx, f.plan, f.q, f.cache, NULL, f.out, (float *)cv), "output lse",
            "input cache V");
    CHECK(bb_untouched(&f));

    /* Touching buffers run: q, out, lse, sinks back to back, then out before q. */
    CHECK_OK(paged_at(&f, &a, q0, b0, (long)l0, (long)s0));
    CHECK(memcmp(a.p + b0, want_out, sizeof want_out) == 0);
    CHECK(memcmp(a.p + l0, want_lse, sizeof want_lse) == 0);
    kva_test_poison(a.p, KVA_DTYPE_F32, a.n);
    memcpy(a.p + b0, f.q, sizeof f.q); /* q now after out: out at q0, lse before out */
    memcpy(a.p + s0, sinks, sizeof sinks);
    CHECK_OK(paged_at(&f, &a, b0, q0, (long)(q0 - ALSE), (long)s0));
    CHECK(memcmp(a.p + q0, want_out, sizeof want_out) == 0);
    CHECK(memcmp(a.p + q0 - ALSE, want_lse, sizeof want_lse) == 0);
    /* Inputs may overlap each other: sinks inside q is allowed. */
    CHECK_OK(kva_attention_run(f.ctx, f.plan, a.p + b0, f.cache, a.p + b0 + 3, f.out, NULL));
    free(a.p);
    bb_fix_free(&f);
}

/* The ragged run: the fixture's batch without a block table, keys packed. */
static void ragged_cases(kva_backend be)
{
    bb_fix f;
    bb_fix_init(&f, be, 12);
    kva_plan_desc d = f.pd;
    d.block_table = NULL;
    d.block_table_stride = 0;
    kva_plan *plan = NULL;
    CHECK_OK(kva_plan_create(f.ctx, &d, &plan));
    kva_rng rng = {77};
    float k[AKV], v[AKV];
    kva_test_fill(k, KVA_DTYPE_F32, AKV, &rng, 1.0);
    kva_test_fill(v, KVA_DTYPE_F32, AKV, &rng, 1.0);
    CHECK_OK(kva_attention_run_ragged(f.ctx, plan, f.q, k, v, NULL, f.out, f.lse));
    /* Written everywhere, and right: the paged run over a cache holding the
     * same keys at the fixture's block table (another path of the backend)
     * gives the same values; the placements below are compared with these
     * bytes only. */
    CHECK(kva_test_count_poisoned(f.out, KVA_DTYPE_F32, AQ) == 0 &&
          kva_test_count_poisoned(f.lse, KVA_DTYPE_F32, ALSE) == 0);
    {
        kva_cache_desc cd = make_desc(6, 3, AHKV, AD, 0, KVA_DTYPE_F32, KVA_LAYOUT_NHD);
        kva_cache *kc = NULL;
        CHECK_OK(kva_cache_create(f.ctx, &cd, &kc));
        int64_t slots[12];
        for (int r = 0, row = 0; r < 2; r++)
            for (int j = 0; j < f.sl[r]; j++, row++)
                slots[row] = (int64_t)f.bt[r * 3 + j / 3] * 3 + j % 3;
        CHECK_OK(kva_cache_write(f.ctx, kc, 12, k, 0, v, 0, KVA_DTYPE_F32, slots));
        float po[AQ], pl[ALSE];
        kva_test_poison(po, KVA_DTYPE_F32, AQ);
        kva_test_poison(pl, KVA_DTYPE_F32, ALSE);
        CHECK_OK(kva_attention_run(f.ctx, f.plan, f.q, kc, NULL, po, pl));
        CHECK(kva_test_compare("ragged out", f.out, po, KVA_DTYPE_F32, AQ, 1e-5, 1e-5) == 0);
        CHECK(kva_test_compare_f32("ragged lse", f.lse, pl, ALSE, 1e-5, 1e-5) == 0);
        kva_cache_destroy(kc);
    }
    float want_out[AQ], want_lse[ALSE];
    memcpy(want_out, f.out, sizeof want_out);
    memcpy(want_lse, f.lse, sizeof want_lse);

    /* Arena: [q AQ][k AKV][v AKV][out AQ][lse ALSE]. */
    arena a;
    arena_init(&a, 2 * AQ + 2 * AKV + ALSE);
    float *q = a.p, *ka = q + AQ, *va = ka + AKV, *out = va + AKV, *lse = out + AQ;
    memcpy(q, f.q, sizeof f.q);
    memcpy(ka, k, sizeof k);
    memcpy(va, v, sizeof v);
    arena_seal(&a);
    REFUSED(kva_attention_run_ragged(f.ctx, plan, q, ka, va, NULL, ka, lse), "output out",
            "input k");
    CHECK(arena_same(&a));
    REFUSED(kva_attention_run_ragged(f.ctx, plan, q, ka, va, NULL, out - 1, lse), "output out",
            "input v");
    CHECK(arena_same(&a));
    REFUSED(kva_attention_run_ragged(f.ctx, plan, q, ka, va, NULL, out, va + AKV - 2), "output lse",
            "input v");
    CHECK(arena_same(&a));
    REFUSED(kva_attention_run_ragged(f.ctx, plan, q, ka, va, NULL, q + 7, NULL), "output out",
            "input q");
    CHECK(arena_same(&a));
    /* k and v may be one buffer (inputs overlap freely); out right after v. */
    CHECK_OK(kva_attention_run_ragged(f.ctx, plan, q, ka, va, NULL, out, lse));
    CHECK(memcmp(out, want_out, sizeof want_out) == 0);
    CHECK(memcmp(lse, want_lse, sizeof want_lse) == 0);
    kva_plan_destroy(plan);
    free(a.p);
    bb_fix_free(&f);
}

/* Sparse MLA: out over q, lse over the index rows, out over topk_length;
 * out right after the index rows runs. */
static void sparse_cases(kva_backend be)
{
    const sp_case c = {.H = 4,
                       .Dc = 64,
                       .Dr = 32,
                       .B = 8,
                       .K = 8,
                       .dt = KVA_DTYPE_F32,
                       .quant = KVA_QUANT_NONE,
                       .thr = 1,
                       .R = 2,
                       .q_len = {1, 2},
                       .seq_len = {10, 12},
                       .use_len = 1,
                       .seed = 5};
    kva_context *ctx = new_ctx(be, 2);
    sp_data m;
    if (!sp_data_make(ctx, &c, &m)) {
        CHECK_MSG(0, "setup: %s", kva_last_error());
        kva_context_destroy(ctx);
        return;
    }
    kva_plan_desc d = sp_plan_desc(&c, &m);
    kva_plan *plan = NULL;
    CHECK_OK(kva_plan_create(ctx, &d, &plan));
    const size_t nq = (size_t)m.T * c.H * (c.Dc + c.Dr), no = (size_t)m.T * c.H * c.Dc;
    const size_t ni = (size_t)m.T * c.K; /* index rows of stride K (stride_pad 0) */
    /* Arena: [q nq][indices ni][topk_length T][out no][lse T*H]. */
    arena a;
    arena_init(&a, nq + ni + (size_t)m.T + no + (size_t)m.T * c.H);
    float *q = a.p, *out = q + nq + ni + m.T, *lse = out + no;
    int32_t *idx = (int32_t *)(q + nq), *len = idx + ni;
    memcpy(q, m.q, nq * sizeof(float));
    memcpy(idx, m.idx, ni * sizeof(int32_t));
    memcpy(len, m.len, (size_t)m.T * sizeof(int32_t));
    arena_seal(&a);
    const int64_t st = c.K;
    REFUSED(kva_mla_sparse_run(ctx, plan, q, m.cache, idx, st, len, NULL, q + 1, lse), "output out",
            "input q");
    CHECK(arena_same(&a));
    REFUSED(kva_mla_sparse_run(ctx, plan, q, m.cache, idx, st, len, NULL, out, (float *)idx),
            "output lse", "input indices");
    CHECK(arena_same(&a));
    REFUSED(kva_mla_sparse_run(ctx, plan, q, m.cache, idx, st, len, NULL, (float *)(len + m.T - 1),
                               lse),
            "output out", "input topk_length");
    CHECK(arena_same(&a));
    CHECK_OK(kva_mla_sparse_run(ctx, plan, q, m.cache, idx, st, len, NULL, out, lse));
    CHECK(!isnan(out[0]) && !isnan(lse[m.T * c.H - 1]));
    kva_plan_destroy(plan);
    free(a.p);
    sp_data_free(&m);
    kva_context_destroy(ctx);
}

/* Layer-level MLA: out over w_uv, lse over w_uk. */
static void mla_layer_cases(kva_backend be)
{
    const int32_t ql[2] = {1, 2}, sl[2] = {9, 14};
    const mla_case c = mla_case_of(2, 32, 16, 24, 16, 4, KVA_DTYPE_F32, 1, 1, 2, ql, sl, 9);
    kva_context *ctx = new_ctx(be, 2);
    mla_data m;
    if (!mla_data_make(ctx, &c, &m)) {
        CHECK_MSG(0, "setup: %s", kva_last_error());
        kva_context_destroy(ctx);
        return;
    }
    kva_plan_desc d = mla_plan_desc(&c, &m, 1);
    kva_plan *plan = NULL;
    CHECK_OK(kva_plan_create(ctx, &d, &plan));
    const size_t nq = (size_t)m.T * c.H * (c.Dn + c.Dr), nuk = (size_t)c.H * c.Dn * c.Dc,
                 nuv = (size_t)c.H * c.Dc * c.Dv, no = (size_t)m.T * c.H * c.Dv;
    arena a;
    arena_init(&a, nq + nuk + nuv + no + (size_t)m.T * c.H);
    float *q = a.p, *uk = q + nq, *uv = uk + nuk, *out = uv + nuv, *lse = out + no;
    memcpy(q, m.q, nq * sizeof(float));
    memcpy(uk, m.w_uk, nuk * sizeof(float));
    memcpy(uv, m.w_uv, nuv * sizeof(float));
    arena_seal(&a);
    REFUSED(kva_mla_run(ctx, plan, q, uk, uv, m.cache, out - 4, lse), "output out", "input w_uv");
    CHECK(arena_same(&a));
    REFUSED(kva_mla_run(ctx, plan, q, uk, uv, m.cache, out, uk + nuk - 1), "output lse",
            "input w_uk");
    CHECK(arena_same(&a));
    CHECK_OK(kva_mla_run(ctx, plan, q, uk, uv, m.cache, out, lse));
    CHECK(!isnan(out[0]) && !isnan(lse[m.T * c.H - 1]));
    kva_plan_destroy(plan);
    free(a.p);
    mla_data_free(&m);
    kva_context_destroy(ctx);
}

/* The indexer: indices over q or the weights, topk_length over the indices;
 * indices right after the weights run. The cache is never read when the
 * call is refused, so it is left unwritten. */
static void indexer_cases(kva_backend be)
{
    const int32_t ql[2] = {1, 3}, sl[2] = {9, 6};
    const idx_case c = idx_case_of(2, 32, 4, 4, KVA_DTYPE_F32, 0, 2, ql, sl, 3);
    idx_data x;
    idx_build(&c, &x);
    kva_context *ctx = new_ctx(be, 2);
    kva_cache_desc cd = idx_cache_desc(&c, &x);
    kva_plan_desc pd = idx_plan_desc(&c, &x);
    kva_cache *cache = NULL;
    kva_plan *plan = NULL;
    CHECK_OK(kva_cache_create(ctx, &cd, &cache));
    CHECK_OK(kva_plan_create(ctx, &pd, &plan));
    const size_t nq = (size_t)x.T * c.Hi * c.D, nw = (size_t)x.T * c.Hi, ni = (size_t)x.T * c.K;
    arena a;
    arena_init(&a, nq + nw + ni + (size_t)x.T);
    float *q = a.p, *w = q + nq;
    int32_t *ind = (int32_t *)(w + nw), *len = ind + ni;
    memcpy(q, x.q, nq * sizeof(float));
    memcpy(w, x.w, nw * sizeof(float));
    arena_seal(&a);
    REFUSED(kva_indexer_run(ctx, plan, q, w, cache, (int32_t *)q + 3, 0, NULL), "output indices",
            "input q");
    CHECK(arena_same(&a));
    REFUSED(kva_indexer_run(ctx, plan, q, w, cache, ind - 1, 0, len), "output indices",
            "input weights");
    CHECK(arena_same(&a));
    REFUSED(kva_indexer_run(ctx, plan, q, w, cache, ind, 0, ind + ni - 2), "output topk_length",
            "output indices");
    CHECK(arena_same(&a));
    CHECK_OK(kva_indexer_run(ctx, plan, q, w, cache, ind, 0, len));
    CHECK(len[0] == 4 && len[x.T - 1] == 4); /* min(K, pos + 1) keys each */
    kva_plan_destroy(plan);
    kva_cache_destroy(cache);
    kva_context_destroy(ctx);
    free(a.p);
    idx_free(&x);
}

/* kva_merge_states at arena offsets: out_a, lse_a, out_b, lse_b, out, lse. */
static kva_status merge_at(kva_context *ctx, arena *a, size_t oa, size_t la, size_t ob, size_t lb,
                           size_t o, size_t l)
{
    return kva_merge_states(ctx, AT, AH, AD, KVA_DTYPE_F32, a->p + oa, a->p + la, a->p + ob,
                            a->p + lb, a->p + o, a->p + l);
}

/* kva_merge_states: out may be out_a or out_b and lse_out lse_a or lse_b
 * (in place, kvattn.h), any other overlap of an output with an input or the
 * other output is refused with nothing written; the in-place merges give the
 * bytes of the merge into separate buffers. */
static void merge_cases(kva_backend be)
{
    kva_rng rng = {12};
    kva_context *ctx = new_ctx(be, 2);
    float ia[AQ], ib[AQ], ila[ALSE], ilb[ALSE], want_out[AQ], want_lse[ALSE];
    kva_test_fill(ia, KVA_DTYPE_F32, AQ, &rng, 1.0);
    kva_test_fill(ib, KVA_DTYPE_F32, AQ, &rng, 1.0);
    kva_test_fill(ila, KVA_DTYPE_F32, ALSE, &rng, 2.0);
    kva_test_fill(ilb, KVA_DTYPE_F32, ALSE, &rng, 2.0);
    CHECK_OK(
        kva_merge_states(ctx, AT, AH, AD, KVA_DTYPE_F32, ia, ila, ib, ilb, want_out, want_lse));
    /* Arena: [a AQ][b AQ][la ALSE][lb ALSE][out AQ][lse ALSE][pad 64]. */
    arena a;
    arena_init(&a, 3 * AQ + 3 * ALSE + 64);
    const size_t a0 = 0, b0 = AQ, la0 = 2 * AQ, lb0 = la0 + ALSE, o0 = lb0 + ALSE, l0 = o0 + AQ;
    memcpy(a.p + a0, ia, sizeof ia);
    memcpy(a.p + b0, ib, sizeof ib);
    memcpy(a.p + la0, ila, sizeof ila);
    memcpy(a.p + lb0, ilb, sizeof ilb);
    arena_seal(&a);
    /* out shifted into out_a by one head row, out across out_a's end and
     * out_b's start, out over lse_a, lse_out one element into lse_a, lse_out
     * inside out, lse_out over out_b's tail; out == out_a with lse_out inside
     * out_b (in place on one side, an overlap on the other). */
    REFUSED(merge_at(ctx, &a, a0, la0, b0, lb0, a0 + AD, l0), "output out", "input out_a");
    CHECK(arena_same(&a));
    REFUSED(merge_at(ctx, &a, a0, la0, b0, lb0, AQ / 2, l0), "output out", "input out_a");
    CHECK(arena_same(&a));
    REFUSED(merge_at(ctx, &a, a0, la0, b0, lb0, la0 + ALSE - 1, l0), "output out", "input lse_a");
    CHECK(arena_same(&a));
    REFUSED(merge_at(ctx, &a, a0, la0, b0, lb0, o0, la0 + 1), "output lse_out", "input lse_a");
    CHECK(arena_same(&a));
    REFUSED(merge_at(ctx, &a, a0, la0, b0, lb0, o0, o0 + 5), "output lse_out", "output out");
    CHECK(arena_same(&a));
    REFUSED(merge_at(ctx, &a, a0, la0, b0, lb0, o0, b0 + AQ - 1), "output lse_out", "input out_b");
    CHECK(arena_same(&a));
    REFUSED(merge_at(ctx, &a, a0, la0, b0, lb0, a0, b0 + 7), "output lse_out", "input out_b");
    CHECK(arena_same(&a));
    /* Separate, touching buffers; then in place into A, into B, and mixed. */
    CHECK_OK(merge_at(ctx, &a, a0, la0, b0, lb0, o0, l0));
    CHECK(memcmp(a.p + o0, want_out, sizeof want_out) == 0);
    CHECK(memcmp(a.p + l0, want_lse, sizeof want_lse) == 0);
    for (int place = 0; place < 3; place++) {
        memcpy(a.p + a0, ia, sizeof ia);
        memcpy(a.p + b0, ib, sizeof ib);
        memcpy(a.p + la0, ila, sizeof ila);
        memcpy(a.p + lb0, ilb, sizeof ilb);
        const size_t o = place == 1 ? b0 : a0, l = place == 0 ? la0 : lb0;
        CHECK_OK(merge_at(ctx, &a, a0, la0, b0, lb0, o, l));
        CHECK_MSG(memcmp(a.p + o, want_out, sizeof want_out) == 0, "in place %d: out", place);
        CHECK_MSG(memcmp(a.p + l, want_lse, sizeof want_lse) == 0, "in place %d: lse", place);
    }
    /* Inputs may overlap each other: A merged with itself, in place. */
    memcpy(a.p + a0, ia, sizeof ia);
    memcpy(a.p + la0, ila, sizeof ila);
    CHECK_OK(merge_at(ctx, &a, a0, la0, a0, la0, a0, la0));
    kva_context_destroy(ctx);
    free(a.p);
}

/* The host helpers: kva_batch_reorder_decode_first (perm and num_decodes
 * vs q_lens and each other), kva_dcp_local_lens (local_lens may be seq_lens
 * itself, no other overlap), kva_dcp_slots (slots vs the block-table row). */
static void test_host_helpers(void)
{
    int32_t m[16];
    const int32_t ql[6] = {5, 1, 3, 1, 1, 7};
    int32_t want[6], nd = -1;
    CHECK_OK(kva_batch_reorder_decode_first(6, ql, 1, want, &nd));
    memcpy(m, ql, sizeof ql);
    memset(m + 6, 0x7f, sizeof(int32_t) * 10);
    const uint64_t sum = bb_sum(m, sizeof m);
    REFUSED(kva_batch_reorder_decode_first(6, m, 1, m, NULL), "output perm", "input q_lens");
    REFUSED(kva_batch_reorder_decode_first(6, m, 1, m + 5, NULL), "output perm", "input q_lens");
    REFUSED(kva_batch_reorder_decode_first(6, m, 1, m + 6, m + 3), "output num_decodes",
            "input q_lens");
    REFUSED(kva_batch_reorder_decode_first(6, m, 1, m + 6, m + 11), "output num_decodes",
            "output perm");
    CHECK(bb_sum(m, sizeof m) == sum);
    CHECK_OK(kva_batch_reorder_decode_first(6, m, 1, m + 6, m + 12)); /* touching */
    CHECK(memcmp(m + 6, want, sizeof want) == 0 && m[12] == nd);

    const int32_t lens[4] = {10, 21, 30, 41};
    int32_t local[4];
    CHECK_OK(kva_dcp_local_lens(4, lens, 3, 1, 2, local));
    memcpy(m, lens, sizeof lens);
    memset(m + 4, 0x7f, sizeof(int32_t) * 12);
    const uint64_t sum2 = bb_sum(m, sizeof m);
    REFUSED(kva_dcp_local_lens(4, m, 3, 1, 2, m + 1), "output local_lens", "input seq_lens");
    CHECK(bb_sum(m, sizeof m) == sum2);
    CHECK_OK(kva_dcp_local_lens(4, m, 3, 1, 2, m)); /* in place */
    CHECK(memcmp(m, local, sizeof local) == 0);

    int64_t sl[12];
    int32_t *row = (int32_t *)sl;
    for (int i = 0; i < 4; i++)
        row[i] = 3 + i;
    memset(sl + 2, 0x7f, sizeof(int64_t) * 10);
    const uint64_t sum3 = bb_sum(sl, sizeof sl);
    REFUSED(kva_dcp_slots(2, 0, 1, 4, row, 4, 0, 8, sl + 1), "output slots",
            "input block_table_row");
    CHECK(bb_sum(sl, sizeof sl) == sum3);
    CHECK_OK(kva_dcp_slots(2, 0, 1, 4, row, 4, 0, 8, sl + 2)); /* touching */
    CHECK(sl[2] == 12 && sl[3] == -1 && sl[4] == 13);

    /* The pool's outputs: request ids, cached-token counts, the fork's copy
     * pair and block-table rows must not overlap each other or the prompt. */
    kva_pool_desc pd = {16, 4, KVA_POOL_HASH_SHA256, 0};
    kva_pool *pool = NULL;
    CHECK_OK(kva_pool_create(&pd, &pool));
    if (!pool)
        return;
    int32_t t[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, -1, -1, -1}, rid = -1;
    const uint64_t sum4 = bb_sum(t, sizeof t);
    REFUSED(kva_pool_request_add(pool, t, 9, NULL, 0, t + 9, t + 9), "output out_num_cached_tokens",
            "output out_request_id");
    REFUSED(kva_pool_request_add(pool, t, 9, NULL, 0, t + 8, NULL), "output out_request_id",
            "input prompt_tokens");
    REFUSED(kva_pool_request_add(pool, t, 9, t + 9, 8, t + 10, t + 11), "output out_request_id",
            "input extra_key");
    CHECK(bb_sum(t, sizeof t) == sum4);
    kva_pool_stats st;
    CHECK_OK(kva_pool_get_stats(pool, &st));
    CHECK(st.num_requests == 0);                                        /* nothing was added */
    CHECK_OK(kva_pool_request_add(pool, t, 9, NULL, 0, t + 9, t + 10)); /* touching */
    rid = t[9];
    CHECK(t[10] == 0 && rid >= 0);
    CHECK_OK(kva_pool_request_allocate(pool, rid, 9, 0));
    CHECK_OK(kva_pool_request_append_tokens(pool, rid, t, 9));
    int32_t f[3] = {-5, -5, -5};
    REFUSED(kva_pool_request_fork(pool, rid, f + 1, f), "output out_request_id", "output out_copy");
    CHECK(f[0] == -5 && f[1] == -5 && f[2] == -5);
    CHECK_OK(kva_pool_get_stats(pool, &st));
    CHECK(st.num_requests == 1 && st.num_used_blocks == 3); /* no fork, no copy block taken */
    int32_t bt[5] = {-5, -5, -5, -5, -5};
    REFUSED(kva_pool_request_block_table(pool, rid, bt, 4, bt + 3), "output out_num_blocks",
            "output row");
    CHECK(bt[0] == -5 && bt[3] == -5 && bt[4] == -5);
    CHECK_OK(kva_pool_request_block_table(pool, rid, bt, 4, bt + 4)); /* touching */
    CHECK(bt[4] == 3 && bt[3] == 0);
    CHECK_OK(kva_pool_check(pool));
    kva_pool_destroy(pool);
}

static void test_paged(void)
{
    for (int b = 0; b < 2; b++)
        paged_cases(kBk[b]);
}

static void test_ragged(void)
{
    for (int b = 0; b < 2; b++)
        ragged_cases(kBk[b]);
}

static void test_mla(void)
{
    for (int b = 0; b < 2; b++) {
        sparse_cases(kBk[b]);
        mla_layer_cases(kBk[b]);
        indexer_cases(kBk[b]);
    }
}

static void test_merge(void)
{
    for (int b = 0; b < 2; b++)
        merge_cases(kBk[b]);
}

int main(void)
{
    RUN(test_paged);
    RUN(test_ragged);
    RUN(test_mla);
    RUN(test_merge);
    RUN(test_host_helpers);
    return kva_test_finish();
}
