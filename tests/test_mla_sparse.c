/*
 * test_mla_sparse.c - sparse MLA (kva_mla_sparse_run) on the reference and
 * CPU backends.
 *
 *   - The reference backend against this file's own fp64 sparse attention
 *     (rows read back with kva_cache_read, every listed entry counted as
 *     often as it is listed, the sink in the denominator): tight tolerance.
 *   - Every CPU MLA kernel of the registry this machine runs, MIXED and
 *     SEPARATE, against the reference with FlashMLA's tolerances: out within
 *     abs 1e-3 or rel 2/128 per element, cosine distance <= 5e-6, LSE within
 *     abs 1e-6 (MIXED; SEPARATE reads bf16 rows, so its LSE is held to the
 *     bf16 gather's error instead, except over bf16 caches, where the
 *     gather is exact).
 *   - mla_avx512bf16 (where this machine runs it), given bf16 queries, rounds
 *     the probabilities to bf16 for its dot products, as the dense decode
 *     does (mla_bf16dot.inc), and, over an fp8_ds_mla cache, each
 *     dequantized c_kv value too: bounds derived from those roundings
 *     (bf16dot_bounds); f32 / f16 queries run in fp32 (FlashMLA's bounds).
 *   - H in {1, 3, 16, 64, 128}; bf16/f16/f32, fp8_e4m3 and fp8_ds_mla caches;
 *     decodes (q_len 1..4) and prefills in one plan; unused (-1) and
 *     repeated entries; topk_length (0, K, and between); all-invalid lists
 *     (out 0, lse -inf; with sinks lse = sink); indices_stride > K.
 * Outputs are poisoned before every run. KVA_TEST_QUICK=1 keeps K small.
 */
#include "sparse_util.h"

#include <float.h>

/* This file's reference: out [T, H, Dc] and lse [T, H] in fp64, over the
 * rows kva_cache_read gives in float32, or for prefill requests (q_len >
 * thr) in pre_dt: BF16 is what the CPU backend's separate mode reads. */
static void naive(kva_context *ctx, const sp_case *c, const sp_data *m, kva_dtype pre_dt,
                  double *out, double *lse)
{
    const int32_t D = c->Dc + c->Dr, Dc = c->Dc, ks = c->K + c->stride_pad;
    const kva_plan_desc pd = sp_plan_desc(c, m);
    float *rows = malloc((size_t)(c->K > 0 ? c->K : 1) * D * sizeof(float));
    int64_t *slots = malloc((size_t)(c->K > 0 ? c->K : 1) * sizeof(int64_t));
    double *s = malloc((size_t)(c->K > 0 ? c->K : 1) * sizeof(double));
    uint16_t *half = malloc((size_t)(c->K > 0 ? c->K : 1) * D * sizeof(uint16_t));
    for (int32_t r = 0; r < c->R; r++)
        for (int32_t t = m->qsl[r]; t < m->qsl[r + 1]; t++) {
            const int32_t *idx = m->idx + (size_t)t * ks;
            const int32_t n = m->len ? m->len[t] : c->K;
            int32_t nv = 0;
            for (int32_t e = 0; e < n; e++)
                if (idx[e] >= 0)
                    slots[nv++] = (int64_t)m->bt[(size_t)r * m->stride + idx[e] / c->B] * c->B +
                                  idx[e] % c->B;
            const int pre = m->qsl[r + 1] - m->qsl[r] > c->thr && pre_dt == KVA_DTYPE_BF16;
            if (nv > 0 && !pre)
                CHECK_OK(
                    kva_cache_read(ctx, m->cache, nv, slots, rows, D, rows + Dc, D, KVA_DTYPE_F32));
            if (nv > 0 && pre) { /* bf16 rows, widened */
                CHECK_OK(kva_cache_read(ctx, m->cache, nv, slots, half, D, half + Dc, D,
                                        KVA_DTYPE_BF16));
                for (size_t i = 0; i < (size_t)nv * D; i++)
                    rows[i] = kva_bf16_to_f32(half[i]);
            }
            for (int32_t h = 0; h < c->H; h++) {
                const size_t row = (size_t)t * c->H + h;
                double mx = m->sinks ? m->sinks[h] : -INFINITY;
                for (int32_t j = 0; j < nv; j++) {
                    double x = 0.0;
                    for (int32_t i = 0; i < D; i++)
                        x += kva_test_get(m->q, c->dt, row * D + i) * rows[(size_t)j * D + i];
                    s[j] = x * pd.scale;
                    mx = s[j] > mx ? s[j] : mx;
                }
                double w = m->sinks ? exp(m->sinks[h] - mx) : 0.0;
                for (int32_t i = 0; i < Dc; i++)
                    out[row * Dc + i] = 0.0;
                for (int32_t j = 0; j < nv; j++) {
                    const double p = exp(s[j] - mx);
                    w += p;
                    for (int32_t i = 0; i < Dc; i++)
                        out[row * Dc + i] += p * rows[(size_t)j * D + i];
                }
                for (int32_t i = 0; i < Dc && nv > 0; i++)
                    out[row * Dc + i] /= w;
                lse[row] = nv > 0 ? mx + log(w) : m->sinks ? m->sinks[h] : -INFINITY;
            }
        }
    free(rows);
    free(slots);
    free(s);
    free(half);
}

/* Runs case c on ctx (mode given) into out / lse (poisoned first). */
static int run(kva_context *ctx, const sp_case *c, const sp_data *m, int32_t mode, void *out,
               float *lse)
{
    sp_case cc = *c;
    cc.mode = mode;
    kva_plan_desc pd = sp_plan_desc(&cc, m);
    kva_plan *plan = NULL;
    CHECK_OK(kva_plan_create(ctx, &pd, &plan));
    if (!plan)
        return 0;
    const size_t rows = (size_t)m->T * c->H;
    kva_test_poison(out, c->dt, rows * c->Dc);
    kva_test_poison(lse, KVA_DTYPE_F32, rows);
    kva_status st = kva_mla_sparse_run(ctx, plan, m->q, m->cache, m->idx, c->K + c->stride_pad,
                                       m->len, m->sinks, out, lse);
    CHECK_OK(st);
    kva_plan_destroy(plan);
    return st == KVA_STATUS_OK;
}

/* The bounds of one comparison: per element within atol or rel rtol (2/128,
 * FlashMLA's), the cosine distance, the LSE within lse_rel (relative beyond
 * 1) or lse_atol. */
typedef struct sp_bounds {
    double atol, cos, lse_rel, lse_atol;
} sp_bounds;

/* FlashMLA's: out abs 1e-3, cosine distance 5e-6, LSE 1e-6 (relative
 * beyond 1). */
static const sp_bounds flashmla_bounds = {1e-3, 5e-6, 1e-6, 0.0};

/* The bounds of a run by bf16 dot products (mla_avx512bf16 with bf16
 * queries over rows it reads as bf16), derived as tests/test_mla.c's header
 * derives the dense ones. Each rounding is a relative error <= u = 2^-9,
 * standard deviation s = u / sqrt 3 = 1.13e-3. The queries are bf16
 * already (exact). Over an fp8_ds_mla cache the dequantized c_kv values
 * are rounded (k_pe is stored in bf16): a score scale . q . k moves by
 * s . scale . sqrt(sum_{d < Dc} (q_d k_d)^2) = s f sqrt(Dc / D), f =
 * scale . sqrt(D) for this data's unit-variance q and rows (sparse_util.h:
 * scale 1 / sqrt(128 + Dr), so f = 1 at Dc 128, Dr 32 and sqrt 3 at
 * DeepSeek's 512, 64): score sd sig = ds s f sqrt(Dc / D). The LSE moves by
 * at most one score's error: atol 5e-5 + 6 sig (the row sums take P before
 * its rounding). An output element moves by sqrt 2 sig through the scores,
 * s through P's rounding and, over fp8_ds_mla, s through the values'
 * rounding: e = sqrt 2 sig + (1 + ds) s for unit values where a key or two
 * carry the softmax; rows whose keys cancel, and values beyond 1, make the
 * tails heavier, so the element bound is 8e-4 + 5 e (observed: up to 3 e,
 * the largest of 10^5 - 10^6 elements), and the cosine distance 5e-6
 * (FlashMLA's, the output's own rounding) + (2.3 e)^2 / 2 (test_mla's
 * relative rms error). bench/data.h computes them
 * (kva_test_sparse_bf16dot_bounds, shared with `kvattn bench
 * --mla-sparse`). */
static sp_bounds bf16dot_bounds(const sp_case *c)
{
    sp_bounds b = {0.0, 0.0, 0.0, 0.0};
    kva_test_sparse_bf16dot_bounds(c->Dc, c->Dr, c->quant == KVA_QUANT_FP8_DS_MLA, &b.atol,
                                   &b.lse_atol, &b.cos);
    return b;
}

/* The worst error seen against each bound of bf16dot_bounds, as a fraction
 * of the bound (printed at the end: the margins). */
static double seen_out, seen_lse, seen_cos;

/* FlashMLA's checks of got against want (out [rows, Dc] in dt, lse [rows])
 * within bounds b. Rows whose lse is -inf must match exactly. track: record
 * the margins (seen_*). */
static void compare(const char *label, const sp_case *c, const void *got, const double *want,
                    size_t rows, const float *lse, const double *lse_want, sp_bounds b, int track)
{
    const size_t n = rows * c->Dc;
    size_t bad = 0, bad_lse = 0;
    double dot = 0.0, ng = 0.0, nw = 0.0, worst = 0.0, worst_lse = 0.0;
    for (size_t i = 0; i < n; i++) {
        const double g = kva_test_get(got, c->dt, i), w = want[i], e = fabs(g - w);
        if (!(e <= b.atol || e <= 2.0 / 128.0 * fabs(w)))
            bad++;
        worst = e > worst || e != e ? e : worst;
        if (track && !(e <= 2.0 / 128.0 * fabs(w)))
            seen_out = fmax(seen_out, e / b.atol);
        dot += g * w, ng += g * g, nw += w * w;
    }
    for (size_t r = 0; r < rows; r++) {
        const double e = fabs((double)lse[r] - lse_want[r]);
        const int ok = isinf(lse_want[r])
                           ? lse[r] == (float)lse_want[r]
                           : e <= b.lse_rel * fmax(1.0, fabs(lse_want[r])) || e <= b.lse_atol;
        bad_lse += !ok;
        worst_lse = !isinf(lse_want[r]) && (e > worst_lse || e != e) ? e : worst_lse;
    }
    const double cos_dist = ng > 0 && nw > 0 ? 1.0 - dot / sqrt(ng * nw) : (ng == nw ? 0.0 : 1.0);
    if (track) {
        seen_lse = fmax(seen_lse, worst_lse / b.lse_atol);
        seen_cos = fmax(seen_cos, cos_dist / b.cos);
    }
    CHECK_MSG(bad == 0 && bad_lse == 0 && cos_dist <= b.cos,
              "%s (H %d, %s cache %s, K %d): %zu/%zu out elements off (worst %.3g), cosine "
              "distance %.3g, %zu lse off (worst %.3g)",
              label, (int)c->H, kva_quant_name(c->quant), kva_dtype_name(c->dt), (int)c->K, bad, n,
              worst, cos_dist, bad_lse, worst_lse);
}

/* The largest |a - b| and the cosine distance of two outputs [n] in dt. */
static void agreement(const void *a, const void *b, kva_dtype dt, size_t n, double *worst,
                      double *cos_dist)
{
    double dot = 0.0, na = 0.0, nb = 0.0;
    *worst = 0.0;
    for (size_t i = 0; i < n; i++) {
        const double x = kva_test_get(a, dt, i), y = kva_test_get(b, dt, i);
        *worst = fabs(x - y) > *worst || x != y ? fmax(*worst, fabs(x - y)) : *worst;
        dot += x * y, na += x * x, nb += y * y;
    }
    *cos_dist = na > 0 && nb > 0 ? 1.0 - dot / sqrt(na * nb) : (na == nb ? 0.0 : 1.0);
}

/* The reference backend against naive, then every CPU kernel in both modes
 * (the separate mode against naive over the bf16 rows it reads), and the
 * two modes against each other. */
static void check(const sp_case *c)
{
    kva_context *ref = NULL, *cpu = NULL;
    kva_context_desc rd = {KVA_BACKEND_REF, 1, 0}, cd = {KVA_BACKEND_CPU, 2, 0};
    CHECK_OK(kva_context_create(&rd, &ref));
    CHECK_OK(kva_context_create(&cd, &cpu));
    sp_data m;
    if (!ref || !cpu || !sp_data_make(ref, c, &m)) {
        CHECK_MSG(0, "case setup failed: %s", kva_last_error());
        kva_context_destroy(ref);
        kva_context_destroy(cpu);
        return;
    }
    const size_t rows = (size_t)m.T * c->H, n = rows * c->Dc, es = kva_dtype_size(c->dt);
    double *want = malloc((n + 1) * 8), *lse_want = malloc((rows + 1) * 8);
    double *want_bf = malloc((n + 1) * 8), *lse_bf = malloc((rows + 1) * 8);
    void *got = malloc(n * es + 4), *mixed = malloc(n * es + 4);
    float *lse = malloc(rows * 4 + 4);
    naive(ref, c, &m, KVA_DTYPE_F32, want, lse_want);
    naive(ref, c, &m, KVA_DTYPE_BF16, want_bf, lse_bf);
    /* The reference backend, both modes (SEPARATE reads float32 rows). */
    for (int32_t mode = 0; mode < 2; mode++)
        if (run(ref, c, &m, mode, got, lse))
            compare(mode ? "ref separate" : "ref mixed", c, got, want, rows, lse, lse_want,
                    flashmla_bounds, 0);
    /* mla_avx512bf16 with bf16 queries reads by bf16 dot products the rows
     * of a bf16 or an fp8_ds_mla cache (MIXED; SEPARATE's decode tokens) and
     * the gathered bf16 rows (SEPARATE's prefills); other caches' rows, and
     * every row for f32 / f16 queries, in fp32. */
    static const char *const kernels[] = {"mla_portable", "mla_avx2", "mla_avx512",
                                          "mla_avx512bf16"};
    const int dot_rows =
        c->quant == KVA_QUANT_FP8_DS_MLA || (c->quant == KVA_QUANT_NONE && c->dt == KVA_DTYPE_BF16);
    for (int k = 0; k < 4; k++) {
        if (kva__context_force_kernel(cpu, kernels[k]) != KVA_STATUS_OK)
            continue; /* not in this build or not on this machine */
        const int dot = k == 3 && c->dt == KVA_DTYPE_BF16;
        const sp_bounds bb = dot ? bf16dot_bounds(c) : flashmla_bounds;
        char label[64];
        snprintf(label, sizeof label, "cpu %s mixed", kernels[k]);
        if (run(cpu, c, &m, KVA_SPARSE_MIXED, mixed, lse))
            compare(label, c, mixed, want, rows, lse, lse_want,
                    dot && dot_rows ? bb : flashmla_bounds, dot && dot_rows);
        snprintf(label, sizeof label, "cpu %s separate", kernels[k]);
        if (!run(cpu, c, &m, KVA_SPARSE_SEPARATE, got, lse))
            continue;
        compare(label, c, got, want_bf, rows, lse, lse_bf, bb, dot);
        /* MIXED == SEPARATE: to FlashMLA's tolerances where the bf16 rows
         * are exact (bf16 caches) or both modes read the same bf16 rows
         * (bf16 dot products over fp8_ds_mla), else to the bf16 rounding of
         * the rows (and, where only SEPARATE ran bf16 dot products, their
         * bound). */
        double worst, cos_dist;
        agreement(got, mixed, c->dt, n, &worst, &cos_dist);
        const int exact = (c->quant == KVA_QUANT_NONE && c->dt == KVA_DTYPE_BF16) ||
                          (dot && c->quant == KVA_QUANT_FP8_DS_MLA);
        const double cos_max = dot && !dot_rows ? fmax(2e-5, bb.cos) : 2e-5;
        CHECK_MSG(
            exact ? cos_dist <= 5e-6 && worst <= 2.0 / 128.0 : cos_dist <= cos_max && worst <= 0.05,
            "%s: separate vs mixed: worst %.3g, cosine distance %.3g", label, worst, cos_dist);
    }
    free(want);
    free(lse_want);
    free(want_bf);
    free(lse_bf);
    free(got);
    free(mixed);
    free(lse);
    sp_data_free(&m);
    kva_context_destroy(ref);
    kva_context_destroy(cpu);
}

static int quick(void)
{
    return getenv("KVA_TEST_QUICK") != NULL;
}

/* One decode-and-prefill batch per head count, DeepSeek's shapes. */
static void test_heads(void)
{
    static const int32_t Hs[] = {1, 3, 16, 64, 128};
    for (int i = 0; i < 5; i++) {
        sp_case c = {.H = Hs[i],
                     .Dc = 512,
                     .Dr = 64,
                     .B = 64,
                     .K = quick() ? 64 : 256,
                     .dt = KVA_DTYPE_BF16,
                     .quant = KVA_QUANT_FP8_DS_MLA,
                     .thr = 4,
                     .R = 3,
                     .q_len = {1, 2, 6},
                     .seq_len = {300, 97, 530},
                     .unused = 0.1,
                     .dup = 0.05,
                     .seed = 100 + (uint64_t)i};
        check(&c);
    }
}

/* Every MLA cache format and q dtype, small shapes, odd block sizes. */
static void test_formats(void)
{
    static const kva_quant qs[] = {KVA_QUANT_NONE, KVA_QUANT_FP8_E4M3, KVA_QUANT_FP8_DS_MLA};
    static const kva_dtype dts[] = {KVA_DTYPE_F32, KVA_DTYPE_F16, KVA_DTYPE_BF16};
    for (int qi = 0; qi < 3; qi++)
        for (int di = 0; di < 3; di++) {
            sp_case c = {.H = 5,
                         .Dc = 128,
                         .Dr = 32,
                         .B = 16,
                         .K = 48,
                         .dt = dts[di],
                         .quant = qs[qi],
                         .thr = 1,
                         .R = 4,
                         .q_len = {1, 1, 9, 3},
                         .seq_len = {40, 1, 77, 64},
                         .use_len = 1,
                         .sinks = di == 1,
                         .unused = 0.2,
                         .dup = 0.1,
                         .stride_pad = 5,
                         .seed = 200 + (uint64_t)(qi * 3 + di)};
            check(&c);
        }
}

/* Repeated entries count as often as listed; the naive reference does that
 * (and would differ were they counted once: a row listing one key twice
 * and another once weighs them 2:1). */
static void test_duplicates(void)
{
    sp_case c = {.H = 16,
                 .Dc = 512,
                 .Dr = 64,
                 .B = 32,
                 .K = 128,
                 .dt = KVA_DTYPE_BF16,
                 .quant = KVA_QUANT_FP8_DS_MLA,
                 .thr = 2,
                 .R = 2,
                 .q_len = {2, 5},
                 .seq_len = {50, 70},
                 .dup = 0.6,
                 .seed = 300};
    check(&c);
}

/* Rows with nothing to attend: every entry -1, topk_length 0 (odd tokens
 * via use_len), a request of seq_len 0: out 0 and lse -inf, or lse = sink. */
static void test_empty_rows(void)
{
    for (int sinks = 0; sinks < 2; sinks++) {
        sp_case c = {.H = 3,
                     .Dc = 128,
                     .Dr = 64,
                     .B = 8,
                     .K = 16,
                     .dt = KVA_DTYPE_F32,
                     .quant = KVA_QUANT_FP8_DS_MLA,
                     .thr = 1,
                     .R = 3,
                     .q_len = {1, 3, 2},
                     .seq_len = {0, 20, 5},
                     .use_len = 1,
                     .sinks = sinks,
                     .unused = 1.0,
                     .seed = 400 + (uint64_t)sinks};
        check(&c);
        sp_case d = c;
        d.unused = 0.3; /* some rows keep keys, the topk_length 0 ones none */
        check(&d);
    }
}

/* A long prefill with DeepSeek's topk (full mode only). */
static void test_long(void)
{
    if (quick())
        return;
    sp_case c = {.H = 16,
                 .Dc = 512,
                 .Dr = 64,
                 .B = 64,
                 .K = 2048,
                 .dt = KVA_DTYPE_BF16,
                 .quant = KVA_QUANT_FP8_DS_MLA,
                 .thr = 4,
                 .R = 2,
                 .q_len = {2, 20},
                 .seq_len = {4000, 3000},
                 .unused = 0.02,
                 .dup = 0.01,
                 .seed = 500};
    check(&c);
}

int main(void)
{
    RUN(test_formats);
    RUN(test_duplicates);
    RUN(test_empty_rows);
    RUN(test_heads);
    RUN(test_long);
    printf("bf16 dot products: worst error / bound: out %.3f, lse %.3f, cosine %.3f\n", seen_out,
           seen_lse, seen_cos);
    return kva_test_finish();
}
