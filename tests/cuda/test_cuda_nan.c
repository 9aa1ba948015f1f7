/*
 * test_cuda_nan.c - the NaN-score rule of kva_attention_run (kvattn.h) on
 * the CUDA backend, for MHA / GQA caches: a NaN score makes its row's out
 * and lse NaN, for any kernel and key split; a row whose every visible key
 * scores -inf writes 0 and lse -inf (or the sink); every other row equals
 * the reference backend. (MLA plans: test_cuda_mla_nan.c.)
 *
 * Each case fills a paged cache on the host (REF context, kva_cache_write
 * of random float data, so quantized formats are quantized as a write would
 * do; slots no request reads poisoned: bytes 0xff, token scales NaN), plants
 * single elements, and gives the run's backend a cache with the same bytes.
 * Two fixed batches (block tables not shared between requests):
 *   decode batch: r0 (1 / 700 keys) NaN in one K element of key 100, kv
 *     head 0: the heads of kv head 0 NaN; r1 (1 / 500) NaN in element 5 of
 *     the V row of key 37, kv head 1: out element 5 of kv head 1's heads a
 *     written NaN, the rest of the row (lse included) finite; r2 (a 3-token
 *     draft, 400 keys) NaN in K of key 399, kv head 1: only the last query
 *     sees it (causal), the two before stay finite; r3 (1 / 300) NaN in q of
 *     head 1; r4 (2 / 260) the -inf rows: q channel 7 = -inf in query 1 head
 *     0 and query 0 head H - 1, channel 7 of every key of their kv heads
 *     positive, so every score is -inf: out 0, lse -inf (the sink with
 *     sinks); r5 (1 / 200) clean;
 *   prefill batch: r0 a chunked prefill (100 new tokens after 200 cached)
 *     with NaN in K of new key 250, kv head 1 (queries 50.. see it) and in
 *     V element 9 of cached key 30, kv head 0 (every query sees it); r1 a
 *     fresh prefill of 64 with NaN in q (token 10, head 0) and in K of key
 *     40, kv head 0 (queries 40.. see it), and a -inf row (query 20, head
 *     H - 1); r2 a decode (1 / 1100) with NaN in K of key 7,
 *     kv head 1; r3 a fresh 3-token prefill, clean. The prefills run as
 *     prefill tiles, so r2 and r3 are the batch's only partition units: a
 *     forced split count cuts a unit into at most keys / 256 chunks
 *     (min_split_keys), so r2 has 1100 keys (up to 4 chunks).
 * A NaN value is planted only where every row of its request sees the key:
 * on CUDA a key a row does not see must still have a finite value where
 * other rows of its request see it (kvattn.h, docs/masks.md).
 * Caches: bf16 and f16 (NHD and HND), and the quantized formats: FP8_E4M3
 * (K and V NaN as codes 0x7f and 0xff), INT8_TOKEN_K_V16 (NaN in V only:
 * its K is int8), INT8_CHANNEL and INT8_TOKEN_K (NaN in q only). Int8 rows
 * cannot hold NaN: test_int8_refuse writes a NaN key (and value) row into
 * each int8 format on the run's backend: KVA_STATUS_INVALID_ARGUMENT and
 * the cache byte-identical (a NaN V row of INT8_TOKEN_K_V16 is stored).
 * Kernels (GPU; checked from the plan): the tensor-core decode
 * (decode_mma_sm80, and its quantized variant), decode_simt forced, the
 * prefill tiles on prefill_mma_sm80, prefill_wgmma_sm90 and
 * prefill_wgmma_tma_sm90 (where the build and device run them) and the
 * dispatcher's choice; forced splits (kva__cuda_context_force_splits: the
 * plan must have split tasks); GQA 4, MHA and MQA; sinks on some cases.
 * The -inf rows run over the quantized caches too: the quantized kernels
 * split q * s into f16 hi + lo (quant_cvt.cuh kva__q_hilo), where an
 * infinite element once gave lo = -inf - (-inf) = NaN and with it NaN rows
 * (and INT8_CHANNEL's offset sum -inf o_c with it); kvattn.h's rule for an
 * infinite q element: the IEEE scores over the dequantized keys.
 * test_qinf_channel: the same rule's one exception (kvattn.h: CUDA's
 * kernels over INT8_CHANNEL take the sign of the code c, not of c - o) on
 * qinf_rows.h's batch, whose marked rows differ between the rule and the
 * exception (codes 0, equal to the offset, between), on the tensor-core
 * decode and prefill and on decode_simt (what runs is read from the plan).
 * Outputs are poisoned (kva_test_poison) before every run, so an expected
 * NaN must be a written one; the reference's rows must show the same NaN /
 * -inf pattern. Finite rows: the harness's tolerances plus 2 u for the
 * kernels' P rounding (u = 2^-8 bf16, 2^-11 f16), lse 1e-4 + 2e-5 relative.
 * KVA_TEST_QUICK=1 leaves out the repeats (decode_simt on the quantized
 * formats, split prefills). Exits 77 without a GPU. KVA_TEST_NAN_CPU=1
 * runs the same cases with the CPU backend in place of the GPU (host
 * buffers, no kernel hooks): how the expectations were checked without one.
 */
#include "cuda_quant_util.h"
#include "cuda_standin.h"
#include "qinf_rows.h"
#include "../../src/plan/partition.h"
#include "../../src/attn/cuda/cuda_backend.h"

#ifdef KVA_HAVE_CUDA

/* ---- caches of the run's backend (buffers: cuda_standin.h) ---- */

/* K, V and token-scale bytes of cache c (either backend) into host memory
 * (three malloc'ed buffers, the last NULL without token scales). */
static void cache_bytes(const kva_cache *c, void **k, void **v, void **ts)
{
    void *ck, *cv;
    float *cs = NULL;
    kva_cache_data(c, &ck, &cv);
    kva_cache_token_scales(c, &cs);
    *k = malloc(bytes_k(c));
    *v = malloc(bytes_v(c));
    *ts = cs ? malloc(bytes_ts(c)) : NULL;
    buf_get(*k, ck, bytes_k(c));
    buf_get(*v, cv, bytes_v(c));
    if (cs)
        buf_get(*ts, cs, bytes_ts(c));
}

/* A cache of the run's backend holding host cache h's bytes (same desc and
 * static scales p). */
static kva_cache *cache_clone(kva_context *ctx, const kva_cache *h, const kva_quant_params *p)
{
    kva_cache *c = NULL;
    CHECK_OK(kva_cache_create_quant(ctx, &h->desc, h->desc.quant ? p : NULL, &c));
    if (!c)
        return NULL;
    if (g_gpu) {
        cache_upload(c, h);
        return c;
    }
    void *hk, *hv, *ck, *cv;
    float *hs = NULL, *cs = NULL;
    kva_cache_data(h, &hk, &hv);
    kva_cache_data(c, &ck, &cv);
    memcpy(ck, hk, bytes_k(h));
    memcpy(cv, hv, bytes_v(h));
    kva_cache_token_scales(h, &hs);
    kva_cache_token_scales(c, &cs);
    if (hs && cs)
        memcpy(cs, hs, bytes_ts(h));
    return c;
}

/* ---- a case ---- */

typedef struct ncfg {
    int f;              /* index into fmts, or -1: an unquantized cache of dtype dt */
    kva_dtype dt;       /* q dtype (and the unquantized cache's) */
    kva_layout layout;  /* NHD or HND */
    int32_t H, Hkv, D;  /* Dv = D, B = 16 */
    int prefill;        /* 0: the decode batch, 1: the prefill batch */
    int sinks;          /* per-head sink logits */
    const char *kernel; /* forced registry kernel (NULL: the plan's) */
    int splits;         /* forced split count (0: the plan's) */
} ncfg;

/* What a row must show. */
enum { ROW_FIN = 0, ROW_NAN, ROW_NEGINF, ROW_VNAN };

typedef struct expect {
    int32_t H, Dv;
    uint8_t *kind;  /* [rows] ROW_* */
    int16_t *velem; /* [rows] the NaN out element of a ROW_VNAN row */
} expect;

/* Sets element e of the K (v = 0) or V (v = 1) row of key j of request r,
 * kv head kvh, of host cache c to NaN (neg: the fp8 code 0xff), or with
 * pos to a positive value (the -inf rows' channel). Returns 0 where the
 * format cannot hold it (an int8 row and NaN). */
static int plant(kva_cache *c, const kva_test_batch *b, int v, int32_t r, int32_t j, int32_t kvh,
                 int32_t e, int neg, int pos)
{
    const kva_cache_desc *d = &c->desc;
    const int32_t blk = b->block_table[(size_t)r * b->stride + j / d->block_size];
    const int64_t i =
        kva__cache_row(d, blk, j % d->block_size, kvh, v ? d->head_dim_v : d->head_dim) + e;
    const size_t es = v ? (size_t)c->v_elem : (size_t)c->elem_size;
    char *base = v ? (char *)c->v : (char *)c->k;
    const kva_dtype dt = d->quant == KVA_QUANT_INT8_TOKEN_K_V16 && v ? d->dtype
                         : d->quant == KVA_QUANT_FP8_E4M3            ? KVA_DTYPE_FP8_E4M3
                         : d->quant != KVA_QUANT_NONE                ? KVA_DTYPE_I8
                                                                     : d->dtype;
    unsigned char *p = (unsigned char *)base + (size_t)i * es;
    if (dt == KVA_DTYPE_FP8_E4M3) {
        *p = pos ? 0x38 : neg ? 0xff : 0x7f; /* 0x38: 1.0 */
        return 1;
    }
    if (dt == KVA_DTYPE_I8) {
        if (!pos)
            return 0;
        *(signed char *)p = 100; /* (100 - o) s > 0: offsets lie in [-3, 3] */
        return 1;
    }
    const float x = pos ? 0.25f + fabsf((float)kva_test_get(p, dt, 0)) : NAN;
    uint16_t u = dt == KVA_DTYPE_BF16 ? kva_f32_to_bf16(x) : kva_f32_to_f16(x);
    memcpy(p, &u, 2);
    return 1;
}

static void set_q(void *q, const ncfg *c, size_t i, float x)
{
    const uint16_t u = c->dt == KVA_DTYPE_BF16 ? kva_f32_to_bf16(x) : kva_f32_to_f16(x);
    memcpy((char *)q + i * 2, &u, 2);
}

static size_t row_of(const kva_test_batch *b, int32_t H, int32_t r, int32_t i, int32_t h)
{
    return (size_t)(b->query_start_loc[r] + i) * H + h;
}

/* Marks the rows of request r's queries [i0, q_len), every head of kv head
 * kvh, as kind (and velem). */
static void mark(expect *x, const kva_test_batch *b, int32_t Hkv, int32_t r, int32_t i0,
                 int32_t kvh, int kind, int32_t e)
{
    const int32_t G = x->H / Hkv;
    for (int32_t i = i0; i < b->q_lens[r]; i++)
        for (int32_t h = kvh * G; h < (kvh + 1) * G; h++) {
            x->kind[row_of(b, x->H, r, i, h)] = (uint8_t)kind;
            x->velem[row_of(b, x->H, r, i, h)] = (int16_t)e;
        }
}

/* -inf row: q channel 7 of (r, i, h) -inf, channel 7 of every key of its kv
 * head positive. */
static void plant_neginf(kva_cache *hc, const kva_test_batch *b, const ncfg *c, void *q, expect *x,
                         int32_t r, int32_t i, int32_t h)
{
    const int32_t kvh = h / (c->H / c->Hkv);
    for (int32_t j = 0; j < b->seq_lens[r]; j++)
        plant(hc, b, 0, r, j, kvh, 7, 0, 1);
    set_q(q, c, row_of(b, c->H, r, i, h) * c->D + 7, -INFINITY);
    x->kind[row_of(b, c->H, r, i, h)] = ROW_NEGINF;
}

/* Plants the batch's NaN and -inf inputs (header comment) into host cache
 * hc and q, and fills x. */
static void plant_batch(kva_cache *hc, const kva_test_batch *b, const ncfg *c, void *q, expect *x)
{
    const int32_t H = c->H, Hkv = c->Hkv, D = c->D, k1 = Hkv > 1 ? 1 : 0;
    if (!c->prefill) {
        if (plant(hc, b, 0, 0, 100, 0, 17, 0, 0))
            mark(x, b, Hkv, 0, 0, 0, ROW_NAN, 0);
        if (plant(hc, b, 1, 1, 37, k1, 5, 1, 0))
            mark(x, b, Hkv, 1, 0, k1, ROW_VNAN, 5);
        if (plant(hc, b, 0, 2, 399, k1, 3, 1, 0))
            mark(x, b, Hkv, 2, 2, k1, ROW_NAN, 0);
        set_q(q, c, row_of(b, H, 3, 0, 1) * D + 60, NAN);
        x->kind[row_of(b, H, 3, 0, 1)] = ROW_NAN;
        plant_neginf(hc, b, c, q, x, 4, 1, 0);
        plant_neginf(hc, b, c, q, x, 4, 0, H - 1);
    } else {
        if (plant(hc, b, 1, 0, 30, 0, 9, 0, 0))
            mark(x, b, Hkv, 0, 0, 0, ROW_VNAN, 9);
        if (plant(hc, b, 0, 0, 250, k1, 3, 0, 0))
            mark(x, b, Hkv, 0, 50, k1, ROW_NAN, 0);
        set_q(q, c, row_of(b, H, 1, 10, 0) * D + 33, NAN);
        x->kind[row_of(b, H, 1, 10, 0)] = ROW_NAN;
        if (plant(hc, b, 0, 1, 40, 0, 1, 1, 0))
            mark(x, b, Hkv, 1, 40, 0, ROW_NAN, 0);
        plant_neginf(hc, b, c, q, x, 1, 20, H - 1);
        if (plant(hc, b, 0, 2, 7, k1, 20, 0, 0))
            mark(x, b, Hkv, 2, 0, k1, ROW_NAN, 0);
    }
}

/* ---- checks ---- */

typedef struct tol {
    double atol, rtol, lse;
} tol;

static int close_to(double a, double b, const tol *t)
{
    return isfinite(a) && fabs(a - b) <= t->atol + t->rtol * fabs(b);
}

/* Checks out [rows, Dv] (dt) and lse row by row against x and the
 * reference (want, lse_want); sinks: the sink logits or NULL. */
static void check_rows(const char *label, const expect *x, size_t rows, kva_dtype dt,
                       const void *got, const float *lse, const void *want, const float *lse_want,
                       const float *sinks, tol t)
{
    const int32_t Dv = x->Dv;
    size_t n[4] = {0, 0, 0, 0}, bad[4] = {0, 0, 0, 0}, bad_ref = 0;
    for (size_t i = 0; i < rows; i++) {
        const int k = x->kind[i];
        int ok = 1, ref = 1;
        n[k]++;
        if (k == ROW_NAN) {
            ok = kva_test_nan_written(lse, KVA_DTYPE_F32, i);
            ref = kva_test_nan_written(lse_want, KVA_DTYPE_F32, i);
            for (int32_t e = 0; e < Dv; e++) {
                ok &= kva_test_nan_written(got, dt, i * Dv + e);
                ref &= kva_test_nan_written(want, dt, i * Dv + e);
            }
        } else {
            const double a = lse[i], b = lse_want[i];
            ok = isinf(b) ? a == b : fabs(a - b) <= t.lse + 2e-5 * fabs(b);
            ref = !isnan(b);
            if (k == ROW_NEGINF) {
                const double s = sinks ? sinks[i % (size_t)x->H] : -INFINITY;
                ref &= sinks ? fabs(b - s) <= 1e-6 * (1 + fabs(s)) : b == s;
            }
            for (int32_t e = 0; e < Dv; e++) {
                const size_t o = i * Dv + e;
                const double y = kva_test_get(want, dt, o);
                if (k == ROW_VNAN && e == x->velem[i]) {
                    ok &= kva_test_nan_written(got, dt, o);
                    ref &= kva_test_nan_written(want, dt, o);
                } else {
                    ok &= close_to(kva_test_get(got, dt, o), y, &t);
                    ref &= !isnan(y) && (k != ROW_NEGINF || y == 0.0);
                }
            }
        }
        if (!ok && bad[0] + bad[1] + bad[2] + bad[3] < 6) {
            static const char *names[4] = {"finite", "NaN", "-inf", "NaN element"};
            fprintf(stderr,
                    "  %s: row %zu (%s expected): lse %.7g (want %.7g), out[0] %.7g (want %.7g)\n",
                    label, i, names[k], (double)lse[i], (double)lse_want[i],
                    kva_test_get(got, dt, i * Dv), kva_test_get(want, dt, i * Dv));
        }
        bad[k] += !ok;
        bad_ref += !ref;
    }
    printf(
        "  %s: rows finite %zu (%zu wrong), NaN %zu (%zu), -inf %zu (%zu), NaN element %zu (%zu)\n",
        label, n[0], bad[0], n[1], bad[1], n[2], bad[2], n[3], bad[3]);
    CHECK_MSG(n[ROW_FIN] > 0 && n[ROW_NAN] > 0, "%s: %zu finite and %zu NaN rows", label, n[0],
              n[1]);
    CHECK_MSG(bad_ref == 0, "%s: the reference disagrees with the expectation in %zu rows", label,
              bad_ref);
    CHECK_MSG(bad[0] + bad[1] + bad[2] + bad[3] == 0,
              "%s: wrong rows: %zu finite, %zu NaN, %zu -inf, %zu NaN element", label, bad[0],
              bad[1], bad[2], bad[3]);
}

/* ---- one case ---- */

static const char *fmt_name(const ncfg *c)
{
    static char s[64];
    if (c->f < 0)
        return kva_dtype_name(c->dt);
    snprintf(s, sizeof s, "%s/%s", kva_quant_name(fmts[c->f]), kva_dtype_name(fmt_dtype(c->f)));
    return s;
}

static void run_case(const ncfg *c, uint64_t seed)
{
    char label[200];
    snprintf(label, sizeof label, "%s %s %s H %d/%d D %d%s kernel %s splits %d",
             c->prefill ? "prefill" : "decode", fmt_name(c),
             c->layout == KVA_LAYOUT_HND ? "HND" : "NHD", (int)c->H, (int)c->Hkv, (int)c->D,
             c->sinks ? " sinks" : "", c->kernel ? c->kernel : "default", c->splits);
    kva_context *ctx = run_ctx();
    if (g_gpu && c->kernel && kva__context_force_kernel(ctx, c->kernel) != KVA_STATUS_OK) {
        printf("  %s: kernel not usable here, skipped\n", label);
        kva_context_destroy(ctx);
        return;
    }
    if (g_gpu)
        CHECK_OK(kva__cuda_context_force_splits(ctx, c->splits));
    kva_rng rng = {seed};
    kva_test_batch b;
    static const int32_t bq[6] = {1, 1, 3, 1, 2, 1}, bs[6] = {700, 500, 400, 300, 260, 200};
    static const int32_t pq[4] = {100, 64, 1, 3}, ps[4] = {300, 64, 1100, 3};
    kva_test_batch_init(&b, &rng, c->prefill ? 4 : 6, c->prefill ? pq : bq, c->prefill ? ps : bs,
                        16, 2, 0);
    const int32_t H = c->H, Hkv = c->Hkv, D = c->D, T = b.T;
    const kva_quant quant = c->f < 0 ? KVA_QUANT_NONE : fmts[c->f];
    kva_cache_desc cd = {b.num_blocks, 16,    Hkv,         D, D, c->f < 0 ? c->dt : fmt_dtype(c->f),
                         c->layout,    quant, KVA_ATTN_MHA};
    float *pbuf = malloc(sizeof(float) * 4 * Hkv * D);
    kva_quant_params qp;
    make_params(quant, Hkv, D, D, 1, &rng, pbuf, &qp);
    kva_context *href = make_ctx(KVA_BACKEND_REF);
    kva_cache *hc = NULL;
    CHECK_OK(kva_cache_create_quant(href, &cd, quant ? &qp : NULL, &hc));
    const size_t nq = (size_t)T * H * D, rows = (size_t)T * H, no = rows * D;
    void *q = malloc(nq * 2), *want = malloc(no * 2), *got = malloc(no * 2);
    float *lw = malloc(rows * 4), *lg = malloc(rows * 4), *sinks = malloc((size_t)H * 4);
    expect x = {H, D, calloc(rows, 1), calloc(rows, 2)};
    kva_test_fill_uniform(q, c->dt, nq, &rng);
    for (int32_t h = 0; h < H; h++)
        sinks[h] = (float)(kva_rng_normal(&rng) * 2.0);
    if (hc) {
        const int32_t n = b.num_blocks * 16;
        float *kf = malloc(sizeof(float) * (size_t)n * Hkv * D);
        float *vf = malloc(sizeof(float) * (size_t)n * Hkv * D);
        int64_t *slots = malloc(sizeof(int64_t) * (size_t)n);
        kva_test_fill_uniform(kf, KVA_DTYPE_F32, (size_t)n * Hkv * D, &rng);
        kva_test_fill_uniform(vf, KVA_DTYPE_F32, (size_t)n * Hkv * D, &rng);
        for (int32_t i = 0; i < n; i++)
            slots[i] = i;
        CHECK_OK(kva_cache_write(href, hc, n, kf, 0, vf, 0, KVA_DTYPE_F32, slots));
        poison_unread(hc, &b);
        free(kf), free(vf), free(slots);
        plant_batch(hc, &b, c, q, &x);
    }
    kva_plan_desc pd = kva_test_batch_plan_desc(&b, H, Hkv, D, D, c->dt);
    pd.causal = 1;
    pd.window_left = -1;
    kva_plan *pr = NULL, *pg = NULL;
    CHECK_OK(kva_plan_create(href, &pd, &pr));
    kva_cache *cc = hc ? cache_clone(ctx, hc, &qp) : NULL;
    CHECK_OK(kva_plan_create(ctx, &pd, &pg));
    const float *hs = c->sinks ? sinks : NULL;
    if (pr && pg && cc) {
        kva_test_poison(want, c->dt, no);
        kva_test_poison(lw, KVA_DTYPE_F32, rows);
        CHECK_OK(kva_attention_run(href, pr, q, hc, hs, want, lw));
        if (g_gpu) {
            const kva__cuda_plan *cp = (const kva__cuda_plan *)pg->device;
            printf("  %s: decode kernel %s, %d prefill tiles, %d split tasks\n", label,
                   kva__cuda_kernels[cp->decode_kernel].name, (int)cp->num_ptiles,
                   (int)pg->part->num_tasks);
            if (c->kernel && strncmp(c->kernel, "decode_", 7) == 0)
                CHECK_MSG(strcmp(kva__cuda_kernels[cp->decode_kernel].name, c->kernel) == 0,
                          "%s: the plan runs %s", label, kva__cuda_kernels[cp->decode_kernel].name);
            if (c->kernel && strncmp(c->kernel, "prefill_", 8) == 0)
                CHECK_MSG((cp->num_ptiles > 0) == (strcmp(c->kernel, "prefill_items") != 0),
                          "%s: %d prefill tiles", label, (int)cp->num_ptiles);
            if (c->splits)
                CHECK_MSG(pg->part->num_tasks > 0, "%s: the plan does not split", label);
        }
        void *dq = buf_from(q, nq * 2);
        float *dsk = c->sinks ? buf_from(sinks, (size_t)H * 4) : NULL;
        kva_test_poison(got, c->dt, no);
        kva_test_poison(lg, KVA_DTYPE_F32, rows);
        void *dout = buf_from(got, no * 2);
        float *dl = buf_from(lg, rows * 4);
        CHECK_OK(kva_attention_run(ctx, pg, dq, cc, dsk, dout, dl));
        buf_get(got, dout, no * 2);
        buf_get(lg, dl, rows * 4);
        const double u = c->dt == KVA_DTYPE_BF16 ? 0x1p-8 : 0x1p-11;
        const tol t = {kva_test_atol(c->dt) + 2 * u, kva_test_rtol(c->dt), 1e-4};
        check_rows(label, &x, rows, c->dt, got, lg, want, lw, hs, t);
        buf_free(dq), buf_free(dout), buf_free(dl);
        if (dsk)
            buf_free(dsk);
    }
    kva_plan_destroy(pr);
    kva_plan_destroy(pg);
    kva_cache_destroy(cc);
    kva_cache_destroy(hc);
    kva_context_destroy(href);
    kva_context_destroy(ctx);
    free(q), free(want), free(got), free(lw), free(lg), free(sinks), free(pbuf);
    free(x.kind), free(x.velem);
    kva_test_batch_free(&b);
}

/* ---- the cases ---- */

/* 16-bit caches: the decode kernels (tensor-core, CUDA-core), splits,
 * sinks, GQA 4 / MHA / MQA, NHD / HND. */
static void test_decode(void)
{
    const ncfg cs[] = {
        {-1, KVA_DTYPE_BF16, KVA_LAYOUT_NHD, 8, 2, 128, 0, 0, "decode_mma_sm80", 0},
        {-1, KVA_DTYPE_BF16, KVA_LAYOUT_NHD, 8, 2, 128, 0, 0, "decode_mma_sm80", 4},
        {-1, KVA_DTYPE_BF16, KVA_LAYOUT_NHD, 8, 2, 128, 0, 1, "decode_simt", 4},
        {-1, KVA_DTYPE_F16, KVA_LAYOUT_HND, 4, 4, 64, 0, 1, "decode_mma_sm80", 3},
        {-1, KVA_DTYPE_F16, KVA_LAYOUT_HND, 4, 4, 64, 0, 0, "decode_simt", 0},
        {-1, KVA_DTYPE_BF16, KVA_LAYOUT_HND, 8, 1, 64, 0, 1, NULL, 2},
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++)
        run_case(&cs[i], 5100 + i);
}

/* 16-bit caches: the prefill tiles' kernels (mma.sync, wgmma with and
 * without TMA, the dispatcher's), a chunked prefill with its context. */
static void test_prefill(void)
{
    const ncfg cs[] = {
        {-1, KVA_DTYPE_BF16, KVA_LAYOUT_NHD, 8, 2, 128, 1, 1, "prefill_mma_sm80", 0},
        {-1, KVA_DTYPE_BF16, KVA_LAYOUT_NHD, 8, 2, 128, 1, 0, "prefill_wgmma_sm90", 0},
        {-1, KVA_DTYPE_BF16, KVA_LAYOUT_NHD, 8, 2, 128, 1, 1, "prefill_wgmma_tma_sm90", 4},
        {-1, KVA_DTYPE_F16, KVA_LAYOUT_HND, 4, 1, 64, 1, 1, NULL, 0},
        {-1, KVA_DTYPE_F16, KVA_LAYOUT_HND, 4, 1, 64, 1, 0, "prefill_mma_sm80", 2},
        {-1, KVA_DTYPE_BF16, KVA_LAYOUT_HND, 4, 4, 64, 1, 0, "prefill_items", 0},
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++)
        run_case(&cs[i], 5200 + i);
}

/* Every quantized format: the default decode (the quantized tensor-core
 * kernel where it covers the format), split; decode_simt; the prefill
 * tiles (prefill_mma_sm80's quantized variant) with sinks. */
static void test_quant(void)
{
    for (int f = 0; f < NFMT; f++) {
        const kva_dtype qdt = fmts[f] == KVA_QUANT_INT8_TOKEN_K_V16 ? fmt_dtype(f) : KVA_DTYPE_BF16;
        const kva_layout lay = f % 2 ? KVA_LAYOUT_HND : KVA_LAYOUT_NHD;
        const ncfg cs[4] = {
            {f, qdt, lay, 8, 2, 128, 0, 0, NULL, 4},
            {f, qdt, lay, 8, 2, 128, 1, 1, NULL, 0},
            {f, qdt, lay, 8, 2, 128, 0, 1, "decode_simt", 0},
            {f, qdt, lay, 8, 2, 128, 1, 0, NULL, 3},
        };
        for (int i = 0; i < (kva_test_quick() ? 2 : 4); i++)
            run_case(&cs[i], 5300 + 10 * (uint64_t)f + (uint64_t)i);
    }
}

/* An int8 row cannot hold NaN: a write of 3 tokens whose second holds NaN
 * in one K (then V) element is refused on the run's backend and leaves the
 * cache byte-identical; INT8_TOKEN_K_V16 stores a NaN V (its V is 16-bit). */
static void test_int8_refuse(void)
{
    for (int f = 0; f < NFMT; f++) {
        if (fmts[f] == KVA_QUANT_FP8_E4M3)
            continue;
        const int32_t Hkv = 2, D = 64, NB = 4, n = 3;
        kva_context *ctx = run_ctx();
        kva_rng rng = {5400 + (uint64_t)f};
        kva_cache_desc cd = {NB,      16,          Hkv, D, D, fmt_dtype(f), KVA_LAYOUT_NHD,
                             fmts[f], KVA_ATTN_MHA};
        float pbuf[4 * 2 * 64];
        kva_quant_params qp;
        make_params(fmts[f], Hkv, D, D, 1, &rng, pbuf, &qp);
        kva_cache *c = NULL;
        CHECK_OK(kva_cache_create_quant(ctx, &cd, &qp, &c));
        if (!c) {
            kva_context_destroy(ctx);
            continue;
        }
        const size_t rn = (size_t)NB * 16 * Hkv * D;
        float *kf = malloc(rn * 4), *vf = malloc(rn * 4);
        int64_t *slots = malloc(sizeof(int64_t) * NB * 16);
        kva_test_fill_uniform(kf, KVA_DTYPE_F32, rn, &rng);
        kva_test_fill_uniform(vf, KVA_DTYPE_F32, rn, &rng);
        for (int32_t i = 0; i < NB * 16; i++)
            slots[i] = i;
        void *dk = buf_from(kf, rn * 4), *dv = buf_from(vf, rn * 4);
        int64_t *ds = buf_from(slots, sizeof(int64_t) * NB * 16);
        CHECK_OK(kva_cache_write(ctx, c, NB * 16, dk, 0, dv, 0, KVA_DTYPE_F32, ds));
        buf_free(dk), buf_free(dv), buf_free(ds);
        void *k0, *v0, *s0;
        cache_bytes(c, &k0, &v0, &s0);
        for (int v = 0; v < 2; v++) {
            /* tokens to slots 20, 21, 22; token 1, head 1, channel 5 NaN */
            const int64_t sl[3] = {20, 21, 22};
            float *rowk = malloc((size_t)n * Hkv * D * 4), *rowv = malloc((size_t)n * Hkv * D * 4);
            kva_test_fill_uniform(rowk, KVA_DTYPE_F32, (size_t)n * Hkv * D, &rng);
            kva_test_fill_uniform(rowv, KVA_DTYPE_F32, (size_t)n * Hkv * D, &rng);
            (v ? rowv : rowk)[(size_t)(1 * Hkv + 1) * D + 5] = NAN;
            void *ek = buf_from(rowk, (size_t)n * Hkv * D * 4);
            void *ev = buf_from(rowv, (size_t)n * Hkv * D * 4);
            int64_t *es = buf_from(sl, sizeof sl);
            const int stores = v && fmts[f] == KVA_QUANT_INT8_TOKEN_K_V16;
            char label[96];
            snprintf(label, sizeof label, "%s/%s NaN %s", kva_quant_name(fmts[f]),
                     kva_dtype_name(fmt_dtype(f)), v ? "V" : "K");
            CHECK_STATUS(kva_cache_write(ctx, c, n, ek, 0, ev, 0, KVA_DTYPE_F32, es),
                         stores ? KVA_STATUS_OK : KVA_STATUS_INVALID_ARGUMENT);
            void *k1, *v1, *s1;
            cache_bytes(c, &k1, &v1, &s1);
            if (stores) {
                /* The V16 write went through: the NaN element is stored. */
                const int64_t o = kva__cache_row(&c->desc, 1, 5, 1, D) + 5;
                CHECK_MSG(isnan(kva_test_get(v1, cd.dtype, (size_t)o)), "%s: V not NaN", label);
            } else {
                const int same = memcmp(k0, k1, bytes_k(c)) == 0 &&
                                 memcmp(v0, v1, bytes_v(c)) == 0 &&
                                 (!s0 || memcmp(s0, s1, bytes_ts(c)) == 0);
                CHECK_MSG(same, "%s: refused write changed the cache", label);
            }
            printf("  %s: %s\n", label, stores ? "stored" : "refused, cache unchanged");
            free(k1), free(v1), free(s1);
            buf_free(ek), buf_free(ev), buf_free(es);
            free(rowk), free(rowv);
        }
        free(k0), free(v0), free(s0), free(kf), free(vf), free(slots);
        kva_cache_destroy(c);
        kva_context_destroy(ctx);
    }
}

/* ---- an infinite q element over INT8_CHANNEL (qinf_rows.h) ---- */

/* What plan pg runs (attn_quant.cu's choice), into what [n]: the work items
 * on decode_mma_sm80's quantized variant when it is the plan's item kernel
 * with 16-row items and covers the shape, else on the CUDA-core kernel
 * (decode_simt's body); the prefill tiles on the quantized prefill_mma_sm80
 * when kva__cuda_qprefill_usable, else on the CUDA-core kernel. Every one of
 * them takes kvattn.h's INT8_CHANNEL exception. */
static void qi_kernels(const kva_context *ctx, const kva_plan *pg, const void *dq,
                       const kva_cache *dc, char *what, size_t n)
{
    const kva__cuda_plan *cp = (const kva__cuda_plan *)pg->device;
    const int items = cp->decode_kernel == KVA__CUDA_K_DECODE_MMA &&
                      cp->rows == KVA__CUDA_MMA_DECODE_ROWS &&
                      kva__cuda_decode_mma_quant_supported(KVA_QUANT_INT8_CHANNEL, KVA_DTYPE_I8,
                                                           QI_D, QI_D, KVA_DTYPE_BF16);
    const int tiles = cp->num_ptiles > 0;
    const int tiles_tc = tiles && kva__cuda_qprefill_usable(ctx, pg, dq, dc);
    snprintf(what, n, "items on %s (%s cores), %d prefill tiles%s",
             kva__cuda_kernels[cp->decode_kernel].name, items ? "tensor" : "CUDA",
             (int)cp->num_ptiles, tiles ? (tiles_tc ? " on tensor cores" : " on CUDA cores") : "");
}

/* qinf_rows.h's batch on the run's backend: each marked row must show what
 * kvattn.h states (on CUDA the INT8_CHANNEL exception, on the CPU stand-in
 * the rule), every other row the reference's. Kernels: the dispatcher's
 * (decodes on decode_mma_sm80, the prefills as tiles), prefill_items (every
 * request an item of the tensor-core decode) and decode_simt (the decodes
 * on CUDA cores). */
static void test_qinf_channel(void)
{
    static const char *kernels[3] = {NULL, "prefill_items", "decode_simt"};
    kva_context *href = make_ctx(KVA_BACKEND_REF);
    qi_problem p;
    qi_init(&p, href, 5700);
    const size_t nq = (size_t)p.b.T * QI_H * QI_D, nl = (size_t)p.b.T * QI_H, no = nq;
    void *want = malloc(no * 2), *got = malloc(no * 2);
    float *lw = malloc(nl * 4), *lg = malloc(nl * 4);
    uint8_t *kind = malloc(nl);
    kva_plan *pr = NULL;
    CHECK_OK(kva_plan_create(href, &p.pd, &pr));
    if (p.hc && pr) {
        kva_test_poison(want, KVA_DTYPE_BF16, no);
        kva_test_poison(lw, KVA_DTYPE_F32, nl);
        CHECK_OK(kva_attention_run(href, pr, p.q, p.hc, NULL, want, lw));
        qi_expect(&p, NULL, kind);
        CHECK_MSG(qi_check("reference", &p, kind, want, lw, want, lw) == 0,
                  "the reference breaks kvattn.h's rule");
        for (int k = 0; k < 3; k++) {
            char label[240], what[160] = "CPU backend: the rule";
            kva_context *ctx = run_ctx();
            if (g_gpu && kernels[k] &&
                kva__context_force_kernel(ctx, kernels[k]) != KVA_STATUS_OK) {
                printf("  qinf %s: kernel not usable here, skipped\n", kernels[k]);
                kva_context_destroy(ctx);
                continue;
            }
            kva_cache *dc = cache_clone(ctx, p.hc, &p.qp);
            kva_plan *pg = NULL;
            CHECK_OK(kva_plan_create(ctx, &p.pd, &pg));
            void *dq = buf_from(p.q, nq * 2);
            if (dc && pg) {
                int exc[QI_R];
                for (int r = 0; r < QI_R; r++)
                    exc[r] = g_gpu;
                if (g_gpu) {
                    const kva__cuda_plan *cp = (const kva__cuda_plan *)pg->device;
                    qi_kernels(ctx, pg, dq, dc, what, sizeof what);
                    if (k == 1)
                        CHECK_MSG(cp->num_ptiles == 0, "prefill_items: %d tiles",
                                  (int)cp->num_ptiles);
                    if (k == 2)
                        CHECK_MSG(cp->decode_kernel == KVA__CUDA_K_DECODE_SIMT,
                                  "decode_simt: the plan runs %s",
                                  kva__cuda_kernels[cp->decode_kernel].name);
                }
                snprintf(label, sizeof label, "qinf %s: %s", kernels[k] ? kernels[k] : "default",
                         what);
                kva_test_poison(got, KVA_DTYPE_BF16, no);
                kva_test_poison(lg, KVA_DTYPE_F32, nl);
                void *dout = buf_from(got, no * 2);
                float *dl = buf_from(lg, nl * 4);
                CHECK_OK(kva_attention_run(ctx, pg, dq, dc, NULL, dout, dl));
                buf_get(got, dout, no * 2);
                buf_get(lg, dl, nl * 4);
                buf_free(dout), buf_free(dl);
                qi_expect(&p, exc, kind);
                const size_t bad = qi_check(label, &p, kind, got, lg, want, lw);
                CHECK_MSG(bad == 0, "%s: %zu rows wrong", label, bad);
            }
            buf_free(dq);
            kva_plan_destroy(pg);
            kva_cache_destroy(dc);
            kva_context_destroy(ctx);
        }
    }
    kva_plan_destroy(pr);
    free(want), free(got), free(lw), free(lg), free(kind);
    qi_free(&p);
    kva_context_destroy(href);
}

#endif

int main(void)
{
#ifdef KVA_HAVE_CUDA
    const int skip = standin_start("KVA_TEST_NAN_CPU");
    if (skip)
        return skip;
    RUN(test_decode);
    RUN(test_prefill);
    RUN(test_quant);
    RUN(test_int8_refuse);
    RUN(test_qinf_channel);
    return kva_test_finish();
#else
    return cuda_test_skip();
#endif
}
