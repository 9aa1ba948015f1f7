/*
 * test_api_blackbox_combos.c - black-box round eleven: feature combinations
 * that no other test runs together on the host backends (api48's
 * dev/api48/fuzz_combo.c found them unpaired): every MHA cache format
 * (f32, bf16, INT8_CHANNEL with per-channel scales and offsets, INT8_TOKEN_K,
 * INT8_TOKEN_K_V16, FP8_E4M3 per kv head) in NHD and HND, under
 *   - draft trees given as tree_parents and as the packed tree_mask, in a
 *     batch with q_len 0 requests (test_tree_attn runs unquantized caches),
 *   - a local chunk with a window, sinks and a soft-cap, and ALiBi,
 *   - shared-prefix batches run as a cascade (KVA_CASCADE_ON);
 * each case on the CPU backend (1 and 3 threads) against the reference
 * backend, outputs poisoned; one CPU plan updated (kva_plan_update) through
 * every case gives the fresh plan's bytes (kvattn.h: "same results of every
 * run call"); the non-tree cases also sharded over 2 and 3 DCP ranks (each
 * rank's cache written through kva_dcp_slots, the partials combined by
 * kva_merge_states_n) against the unsharded reference.
 */
#include "cache_util.h"

enum { CR = 4, CMAXT = 24, CH = 4, CHKV = 2, CD = 16, CB = 4, CNB = 24, CSTRIDE = 5 };

typedef struct fmt {
    const char *name;
    kva_quant quant;
    kva_dtype cdt; /* cache dtype */
    int gran;      /* make_params: 0 per channel, 1 per kv head, 2 per tensor */
} fmt;

static const fmt kFmts[] = {
    {"f32", KVA_QUANT_NONE, KVA_DTYPE_F32, 0},
    {"bf16", KVA_QUANT_NONE, KVA_DTYPE_BF16, 0},
    {"int8_channel", KVA_QUANT_INT8_CHANNEL, KVA_DTYPE_I8, 0},
    {"int8_token_k", KVA_QUANT_INT8_TOKEN_K, KVA_DTYPE_I8, 0},
    {"int8_token_k_v16", KVA_QUANT_INT8_TOKEN_K_V16, KVA_DTYPE_BF16, 0},
    {"fp8_e4m3", KVA_QUANT_FP8_E4M3, KVA_DTYPE_FP8_E4M3, 1},
};

/* Masks: 0 tree (parents), 1 tree (packed mask), 2 chunk + window + sinks +
 * soft-cap, 3 ALiBi + sinks, 4 shared prefix as a cascade. */
enum { M_TREE_PARENTS, M_TREE_MASK, M_CHUNK, M_ALIBI, M_CASCADE, M_COUNT };
static const char *const kMasks[M_COUNT] = {"tree parents", "tree mask", "chunk window sinks cap",
                                            "alibi sinks", "cascade"};

/* The batch of mask m: q_len 0 requests included; the cascade's requests
 * share their first two blocks (8 tokens before every first query). */
typedef struct batch {
    int32_t R, T, qsl[CR + 1], sl[CR], bt[CR * CSTRIDE], parents[CMAXT];
    uint8_t tmask[64];
    float slopes[CH], sinks[CH];
} batch;

static void make_batch(int m, batch *b)
{
    static const int32_t ql_tree[CR] = {3, 0, 1, 5}, sl_tree[CR] = {9, 4, 6, 17};
    static const int32_t ql_mix[CR] = {1, 6, 0, 3}, sl_mix[CR] = {13, 18, 7, 11};
    static const int32_t ql_cas[CR] = {1, 1, 2, 1}, sl_cas[CR] = {11, 17, 12, 9};
    const int32_t *ql = m <= M_TREE_MASK ? ql_tree : m == M_CASCADE ? ql_cas : ql_mix;
    const int32_t *sl = m <= M_TREE_MASK ? sl_tree : m == M_CASCADE ? sl_cas : sl_mix;
    memset(b, 0, sizeof *b);
    b->R = CR;
    for (int r = 0; r < CR; r++) {
        b->sl[r] = sl[r];
        b->qsl[r + 1] = b->qsl[r] + ql[r];
        for (int j = 0; j < CSTRIDE; j++) /* distinct blocks; -1 past the keys */
            b->bt[r * CSTRIDE + j] = j * CB < sl[r] ? 1 + r * CSTRIDE + j : -1;
        if (m == M_CASCADE)
            b->bt[r * CSTRIDE] = 21, b->bt[r * CSTRIDE + 1] = 22;
    }
    b->T = b->qsl[CR];
    /* Trees: parent of token i is i - 1, i - 2 or a root; the packed mask
     * holds each row's ancestors (FlashInfer's segment_packbits order). */
    int byte = 0;
    for (int r = 0; r < CR; r++) {
        const int q = ql[r], o = b->qsl[r];
        for (int i = 0; i < q; i++) {
            b->parents[o + i] = i == 0 ? -1 : i % 3 == 2 ? i - 2 : i % 3 == 0 ? -1 : i - 1;
            for (int k = i; k >= 0; k = b->parents[o + k])
                b->tmask[byte + (i * q + k) / 8] |= (uint8_t)(1u << ((i * q + k) % 8));
        }
        byte += (q * q + 7) / 8;
    }
    for (int h = 0; h < CH; h++) {
        b->slopes[h] = 0.25f / (float)(h + 1);
        b->sinks[h] = 0.5f * (float)h - 0.75f;
    }
}

static kva_plan_desc plan_desc(int m, const batch *b, kva_dtype qdt)
{
    kva_plan_desc d = {0};
    d.num_requests = b->R;
    d.query_start_loc = b->qsl;
    d.seq_lens = b->sl;
    d.block_table = b->bt;
    d.block_table_stride = CSTRIDE;
    d.block_size = CB;
    d.num_heads = CH;
    d.num_kv_heads = CHKV;
    d.head_dim = CD;
    d.q_dtype = qdt;
    d.causal = 1;
    d.window_left = m == M_CHUNK ? 5 : -1;
    d.attention_chunk = m == M_CHUNK ? 6 : 0;
    d.softcap = m == M_CHUNK ? 4.0f : 0.0f;
    d.alibi_slopes = m == M_ALIBI ? b->slopes : NULL;
    d.tree_parents = m == M_TREE_PARENTS ? b->parents : NULL;
    d.tree_mask = m == M_TREE_MASK ? b->tmask : NULL;
    d.cascade = m == M_CASCADE ? KVA_CASCADE_ON : KVA_CASCADE_OFF;
    return d;
}

/* The keys of every slot (f32 [NB * B, Hkv, D]) and a cache of format f
 * holding them (nb blocks; slots: the slot of each of n rows, NULL = 0..). */
static kva_cache *make_cache(kva_context *ctx, const fmt *f, kva_layout lay, int32_t nb,
                             const float *k, const float *v, const int64_t *slots, int32_t n)
{
    kva_rng r = {99};
    float buf[2 * CHKV * 2 * CD];
    kva_quant_params p;
    make_params(f->quant, CHKV, CD, CD, f->gran, &r, buf, &p);
    kva_cache_desc cd = make_desc(nb, CB, CHKV, CD, 0, f->cdt, lay);
    cd.quant = f->quant;
    kva_cache *c = NULL;
    CHECK_OK(kva_cache_create_quant(ctx, &cd, f->quant ? &p : NULL, &c));
    if (c && n > 0)
        CHECK_OK(kva_cache_write(ctx, c, n, k, 0, v, 0, KVA_DTYPE_F32, slots));
    return c;
}

/* Runs plan desc d on ctx over cache c into poisoned out / lse (q_dtype qdt). */
static kva_status run_into(kva_context *ctx, const kva_plan_desc *d, kva_plan *given, const void *q,
                           kva_cache *c, const float *sinks, void *out, float *lse, size_t no,
                           size_t nl)
{
    kva_test_poison(out, d->q_dtype, no);
    kva_test_poison(lse, KVA_DTYPE_F32, nl);
    kva_plan *p = given;
    kva_status s = p ? KVA_STATUS_OK : kva_plan_create(ctx, d, &p);
    if (s == KVA_STATUS_OK)
        s = kva_attention_run(ctx, p, q, c, sinks, out, lse);
    if (!given)
        kva_plan_destroy(p);
    return s;
}

/* The tolerances of a run against the reference: the cascade's rounding of
 * its two passes where it runs one. */
static size_t cmp(const char *what, const void *o, const float *l, const void *ro, const float *rl,
                  kva_dtype qdt, size_t no, size_t nl, int cascade)
{
    const double at = cascade ? kva_test_cascade_atol(qdt) : kva_test_atol(qdt);
    const double rt = cascade ? kva_test_cascade_rtol(qdt) : kva_test_rtol(qdt);
    return kva_test_compare(what, o, ro, qdt, no, at, rt) +
           kva_test_compare_f32(what, l, rl, nl, 1e-4, 1e-4);
}

/* DCP: the batch sharded over N ranks (interleave I) on the CPU, each
 * rank's cache written through kva_dcp_slots, the partials combined. */
static void check_dcp(kva_context *cpu, const fmt *f, kva_layout lay, int m, const batch *b,
                      kva_dtype qdt, const void *q, const float *k, const float *v, const void *ro,
                      const float *rl, int N, int I)
{
    const size_t no = (size_t)b->T * CH * CD, nl = (size_t)b->T * CH, es = kva_dtype_size(qdt);
    void *parts = malloc((size_t)N * no * es), *out = malloc(no * es);
    float *lses = malloc((size_t)N * nl * 4), *lse = malloc(nl * 4);
    const int row = CHKV * CD;
    for (int rank = 0; rank < N; rank++) {
        int32_t ll[CR], rbt[CR * CSTRIDE];
        CHECK_OK(kva_dcp_local_lens(b->R, b->sl, N, rank, I, ll));
        for (int i = 0; i < CR * CSTRIDE; i++)
            rbt[i] = 1 + i; /* one row of CSTRIDE blocks per request */
        kva_cache *c = make_cache(cpu, f, lay, 1 + CR * CSTRIDE, NULL, NULL, NULL, 0);
        for (int r = 0; r < b->R && c; r++) {
            int64_t slots[CSTRIDE * CB];
            float kk[CSTRIDE * CB * CHKV * CD], vv[CSTRIDE * CB * CHKV * CD];
            for (int j = 0; j < b->sl[r]; j++) { /* the request's global keys */
                const int64_t s = (int64_t)b->bt[r * CSTRIDE + j / CB] * CB + j % CB;
                memcpy(kk + j * row, k + s * row, row * sizeof(float));
                memcpy(vv + j * row, v + s * row, row * sizeof(float));
            }
            CHECK_OK(kva_dcp_slots(N, rank, I, CB, rbt + r * CSTRIDE, CSTRIDE, 0, b->sl[r], slots));
            CHECK_OK(kva_cache_write(cpu, c, b->sl[r], kk, 0, vv, 0, KVA_DTYPE_F32, slots));
        }
        kva_plan_desc d = plan_desc(m, b, qdt);
        d.block_table = rbt;
        d.dcp_size = N, d.dcp_rank = rank, d.dcp_interleave = I;
        d.cascade = KVA_CASCADE_OFF;
        CHECK_OK(run_into(cpu, &d, NULL, q, c, b->sinks, (char *)parts + rank * no * es,
                          lses + rank * nl, no, nl));
        CHECK(kva_test_count_poisoned((char *)parts + rank * no * es, qdt, no) == 0);
        kva_cache_destroy(c);
    }
    kva_test_poison(out, qdt, no);
    kva_test_poison(lse, KVA_DTYPE_F32, nl);
    CHECK_OK(kva_merge_states_n(cpu, N, b->T, CH, CD, qdt, parts, 0, lses, 0, out, lse));
    /* Each rank's partial is rounded to the q dtype before the combine. */
    const size_t bad = cmp("dcp", out, lse, ro, rl, qdt, no, nl, 1);
    CHECK_MSG(bad == 0, "%s %s %s N %d I %d: %zu mismatches", f->name, lay ? "HND" : "NHD",
              kMasks[m], N, I, bad);
    free(parts), free(out), free(lses), free(lse);
}

static void test_combos(void)
{
    kva_context *ref = new_ctx(KVA_BACKEND_REF, 1), *cpu1 = new_ctx(KVA_BACKEND_CPU, 1),
                *cpu3 = new_ctx(KVA_BACKEND_CPU, 3);
    const int nslots = CNB * CB, row = CHKV * CD;
    float *k = malloc((size_t)nslots * row * 4), *v = malloc((size_t)nslots * row * 4);
    kva_rng rng = {41};
    kva_test_fill_uniform(k, KVA_DTYPE_F32, (size_t)nslots * row, &rng);
    kva_test_fill_uniform(v, KVA_DTYPE_F32, (size_t)nslots * row, &rng);
    int64_t *slots = malloc((size_t)nslots * 8);
    for (int i = 0; i < nslots; i++)
        slots[i] = i;
    kva_plan *upd = NULL; /* the CPU plan updated through every case */
    const int nf = (int)(sizeof kFmts / sizeof kFmts[0]), quick = kva_test_quick();
    int ci = 0;
    for (int fi = 0; fi < nf; fi++)
        for (int lay = 0; lay < 2; lay++)
            for (int m = 0; m < M_COUNT; m++, ci++) {
                if (quick && ci % 3)
                    continue;
                const fmt *f = &kFmts[fi];
                const kva_dtype qdt = f->cdt == KVA_DTYPE_F32 ? KVA_DTYPE_F32 : KVA_DTYPE_BF16;
                batch b;
                make_batch(m, &b);
                const kva_plan_desc d = plan_desc(m, &b, qdt);
                const size_t nq = (size_t)b.T * CH * CD, no = nq, nl = (size_t)b.T * CH;
                const size_t es = kva_dtype_size(qdt);
                void *q = malloc(nq * es), *ro = malloc(no * es), *o = malloc(no * es);
                float *rl = malloc(nl * 4), *l = malloc(nl * 4);
                kva_rng qr = {(uint64_t)(7 + ci)};
                kva_test_fill(q, qdt, nq, &qr, 1.0);
                const float *sinks = m == M_CHUNK || m == M_ALIBI ? b.sinks : NULL;
                kva_cache *rc = make_cache(ref, f, (kva_layout)lay, CNB, k, v, slots, nslots);
                CHECK_OK(run_into(ref, &d, NULL, q, rc, sinks, ro, rl, no, nl));
                CHECK(kva_test_count_poisoned(ro, qdt, no) == 0);
                kva_context *cpus[2] = {cpu1, cpu3};
                for (int t = 0; t < 2; t++) {
                    kva_cache *c =
                        make_cache(cpus[t], f, (kva_layout)lay, CNB, k, v, slots, nslots);
                    kva_plan *p = NULL;
                    CHECK_OK(kva_plan_create(cpus[t], &d, &p));
                    kva_plan_info info;
                    CHECK_OK(kva_plan_get_info(p, &info));
                    if (m == M_CASCADE)
                        CHECK_MSG(info.num_cascade_groups == 1, "%s: %d cascade groups", f->name,
                                  (int)info.num_cascade_groups);
                    CHECK_OK(run_into(cpus[t], &d, p, q, c, sinks, o, l, no, nl));
                    const size_t bad = cmp("cpu", o, l, ro, rl, qdt, no, nl, m == M_CASCADE);
                    CHECK_MSG(bad == 0, "%s %s %s threads %d: %zu mismatches", f->name,
                              lay ? "HND" : "NHD", kMasks[m], t ? 3 : 1, bad);
                    if (t == 0) {
                        /* The updated plan: the fresh plan's info and bytes. */
                        void *uo = malloc(no * es);
                        float *ul = malloc(nl * 4);
                        kva_plan_info ui;
                        CHECK_OK(upd ? kva_plan_update(cpu1, upd, &d)
                                     : kva_plan_create(cpu1, &d, &upd));
                        CHECK_OK(kva_plan_get_info(upd, &ui));
                        CHECK(memcmp(&ui, &info, sizeof ui) == 0);
                        CHECK_OK(run_into(cpu1, &d, upd, q, c, sinks, uo, ul, no, nl));
                        CHECK_MSG(memcmp(uo, o, no * es) == 0 && memcmp(ul, l, nl * 4) == 0,
                                  "%s %s %s: the updated plan's bytes differ", f->name,
                                  lay ? "HND" : "NHD", kMasks[m]);
                        free(uo), free(ul);
                    }
                    kva_plan_destroy(p);
                    kva_cache_destroy(c);
                }
                if (m >= M_CHUNK && m != M_CASCADE)
                    for (int N = 2; N <= 3; N++)
                        check_dcp(cpu1, f, (kva_layout)lay, m, &b, qdt, q, k, v, ro, rl, N,
                                  N == 2 ? 1 : 2);
                kva_cache_destroy(rc);
                free(q), free(ro), free(o), free(rl), free(l);
            }
    kva_plan_destroy(upd);
    free(k), free(v), free(slots);
    kva_context_destroy(ref);
    kva_context_destroy(cpu1);
    kva_context_destroy(cpu3);
}

int main(void)
{
    RUN(test_combos);
    return kva_test_finish();
}
