/*
 * qinf_rows.h - kvattn.h's rule for an infinite element of q over an
 * INT8_CHANNEL cache, and its one exception, as a batch whose marked rows'
 * results the header fixes exactly. Shared by test_quant_qinf.c (reference
 * and CPU backends) and tests/cuda/test_cuda_nan.c (test_qinf_channel).
 *
 * The rule (kva_attention_run): an infinite q element scores in IEEE
 * arithmetic over the keys as the format defines them, k = (c - o) s for a
 * code c, offset o and scale s > 0: -inf times a positive element is -inf,
 * times a negative one +inf, times 0 NaN. The exception (CUDA's kernels
 * over INT8_CHANNEL): the product takes the code's sign, c, not c - o; the
 * two differ only for a code between 0 and o, both included: strictly
 * between, the infinity takes c's sign; a code of 0 scores NaN where c - o
 * gives an infinity; a code equal to o scores an infinity where c - o = 0
 * gives NaN.
 *
 * The batch: H 8 / Hkv 2, D = Dv = 128, B 16, bf16 q and out, per-channel
 * scales (positive) and offsets; channel QI_CH's offset is +3 on kv head 0
 * and -3 on kv head 1 (integers, so a code can equal it). Every key of
 * request r holds at channel QI_CH of kv head g the code qi_codes[r][g][j % 2]
 * (the rest as kva_cache_write quantized random data); each row of qi_rows
 * holds +inf or -inf at channel QI_CH of q, the rest of q random. A row
 * whose every visible score is NaN writes NaN (out and lse); one whose every
 * score is -inf writes 0 and lse -inf (no sinks). Rows with +inf scores,
 * whose result the header does not state, are not checked (QI_ANY); every
 * other row is finite and equals the reference within the bf16 tolerance.
 * Requests: four decodes (1 / 300 keys), a fresh prefill of 32 and a chunked
 * prefill of 40 after 200 cached keys (causal), so the prefills run as the
 * CUDA backend's prefill tiles (32 x 4 packed rows and more).
 */
#ifndef KVA_TEST_QINF_ROWS_H
#define KVA_TEST_QINF_ROWS_H

#include "batchgen.h"
#include "internal.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { QI_R = 6, QI_H = 8, QI_HKV = 2, QI_D = 128, QI_B = 16, QI_CH = 7 };

/* What a row must show. */
enum { QI_FIN = 0, QI_NAN, QI_ZERO, QI_ANY };

static const int32_t qi_qlen[QI_R] = {1, 1, 1, 1, 32, 40};
static const int32_t qi_slen[QI_R] = {300, 300, 300, 300, 32, 240};
/* Channel QI_CH's offset per kv head. */
static const float qi_off[QI_HKV] = {3.0f, -3.0f};
/* Channel QI_CH's codes per request and kv head (keys alternate the two). */
static const int8_t qi_codes[QI_R][QI_HKV][2] = {
    {{3, 3}, {-3, -3}},       /* codes equal to the offset */
    {{0, 0}, {0, 0}},         /* code 0 */
    {{1, 2}, {-1, -2}},       /* strictly between 0 and the offset */
    {{100, 100}, {100, 100}}, /* beyond it: both rules agree */
    {{3, 3}, {0, 0}},         /* prefill: code = offset, code 0 */
    {{1, 2}, {100, 100}},     /* chunked prefill: between, beyond */
};

/* A marked row: request r's query i, head h (kv head h / 4), q's channel
 * QI_CH = sign * inf; what it must show under the rule and the exception. */
typedef struct qi_row {
    int32_t r, i, h;
    int sign;
    uint8_t rule, exc;
} qi_row;

static const qi_row qi_rows[] = {
    {0, 0, 0, -1, QI_NAN, QI_ZERO},   /* (3 - 3) = 0: NaN; 3 > 0: -inf */
    {0, 0, 5, +1, QI_NAN, QI_ZERO},   /* (-3 + 3) = 0: NaN; +inf * -3 = -inf */
    {1, 0, 1, +1, QI_ZERO, QI_NAN},   /* +inf * (0 - 3) = -inf; inf * 0 */
    {1, 0, 6, -1, QI_ZERO, QI_NAN},   /* -inf * (0 + 3) = -inf; inf * 0 */
    {2, 0, 0, +1, QI_ZERO, QI_ANY},   /* +inf * (1 - 3) = -inf; +inf * 1 */
    {2, 0, 2, -1, QI_ANY, QI_ZERO},   /* -inf * (1 - 3) = +inf; -inf * 1 */
    {2, 0, 4, -1, QI_ZERO, QI_ANY},   /* -inf * (-1 + 3) = -inf; -inf * -1 */
    {2, 0, 7, +1, QI_ANY, QI_ZERO},   /* +inf * (-1 + 3) = +inf; +inf * -1 */
    {3, 0, 3, -1, QI_ZERO, QI_ZERO},  /* -inf * 97, -inf * 100 */
    {3, 0, 4, -1, QI_ZERO, QI_ZERO},  /* -inf * 103, -inf * 100 */
    {4, 31, 1, -1, QI_NAN, QI_ZERO},  /* prefill, code = offset */
    {4, 0, 2, -1, QI_NAN, QI_ZERO},   /* its first row: key 0 only */
    {4, 17, 6, -1, QI_ZERO, QI_NAN},  /* code 0 under offset -3 */
    {5, 39, 0, +1, QI_ZERO, QI_ANY},  /* chunked prefill: +inf * (c - 3) */
    {5, 5, 3, -1, QI_ANY, QI_ZERO},   /* -inf * (1 - 3); -inf * 1 */
    {5, 20, 4, -1, QI_ZERO, QI_ZERO}, /* beyond the offset -3 */
};
enum { QI_NROWS = (int)(sizeof qi_rows / sizeof qi_rows[0]) };

/* One problem: the batch, a host (REF-context) cache with the codes
 * planted, q [T, H, D] bf16, the static parameters. */
typedef struct qi_problem {
    kva_test_batch b;
    kva_cache *hc;
    uint16_t *q;
    float pbuf[4 * QI_HKV * QI_D];
    kva_quant_params qp;
    kva_plan_desc pd;
} qi_problem;

static inline size_t qi_row_of(const kva_test_batch *b, int32_t r, int32_t i, int32_t h)
{
    return (size_t)(b->query_start_loc[r] + i) * QI_H + (size_t)h;
}

/* Builds the problem on REF context ref (seed: the random data). */
static inline void qi_init(qi_problem *p, kva_context *ref, uint64_t seed)
{
    memset(p, 0, sizeof *p);
    kva_rng rng = {seed};
    kva_test_batch_init(&p->b, &rng, QI_R, qi_qlen, qi_slen, QI_B, 2, 0);
    float *ks = p->pbuf, *ko = ks + QI_HKV * QI_D, *vs = ko + QI_HKV * QI_D,
          *vo = vs + QI_HKV * QI_D;
    for (int32_t i = 0; i < QI_HKV * QI_D; i++) {
        ks[i] = (float)((1.8 + 0.7 * kva_rng_unit(&rng)) / 127.0);
        ko[i] = (float)(6.0 * kva_rng_unit(&rng) - 3.0);
        vs[i] = (float)((1.8 + 0.7 * kva_rng_unit(&rng)) / 127.0);
        vo[i] = (float)(6.0 * kva_rng_unit(&rng) - 3.0);
    }
    for (int32_t g = 0; g < QI_HKV; g++)
        ko[g * QI_D + QI_CH] = qi_off[g];
    p->qp = (kva_quant_params){ks, QI_HKV * QI_D, ko, QI_HKV * QI_D,
                               vs, QI_HKV * QI_D, vo, QI_HKV * QI_D};
    const kva_cache_desc cd = {
        p->b.num_blocks,        QI_B,        QI_HKV, QI_D, QI_D, KVA_DTYPE_I8, KVA_LAYOUT_NHD,
        KVA_QUANT_INT8_CHANNEL, KVA_ATTN_MHA};
    CHECK_OK(kva_cache_create_quant(ref, &cd, &p->qp, &p->hc));
    const size_t nq = (size_t)p->b.T * QI_H * QI_D;
    p->q = malloc(nq * 2);
    kva_test_fill_uniform(p->q, KVA_DTYPE_BF16, nq, &rng);
    p->pd = kva_test_batch_plan_desc(&p->b, QI_H, QI_HKV, QI_D, QI_D, KVA_DTYPE_BF16);
    p->pd.causal = 1;
    p->pd.window_left = -1;
    p->pd.decode_threshold = 1;
    if (!p->hc)
        return;
    const int32_t n = p->b.num_blocks * QI_B;
    const size_t ne = (size_t)n * QI_HKV * QI_D;
    float *kf = malloc(ne * 4), *vf = malloc(ne * 4);
    int64_t *slots = malloc(sizeof(int64_t) * (size_t)n);
    kva_test_fill_uniform(kf, KVA_DTYPE_F32, ne, &rng);
    kva_test_fill_uniform(vf, KVA_DTYPE_F32, ne, &rng);
    for (int32_t i = 0; i < n; i++)
        slots[i] = i;
    CHECK_OK(kva_cache_write(ref, p->hc, n, kf, 0, vf, 0, KVA_DTYPE_F32, slots));
    free(kf), free(vf), free(slots);
    /* The codes at channel QI_CH of every key each request reads. */
    const kva_cache_desc *d = &p->hc->desc;
    for (int32_t r = 0; r < QI_R; r++)
        for (int32_t j = 0; j < qi_slen[r]; j++) {
            const int32_t blk = p->b.block_table[(size_t)r * p->b.stride + j / QI_B];
            for (int32_t g = 0; g < QI_HKV; g++) {
                const int64_t e = kva__cache_row(d, blk, j % QI_B, g, QI_D) + QI_CH;
                ((int8_t *)p->hc->k)[e] = qi_codes[r][g][j % 2];
            }
        }
    for (int i = 0; i < QI_NROWS; i++) {
        const qi_row *w = &qi_rows[i];
        const uint16_t inf = kva_f32_to_bf16(w->sign > 0 ? INFINITY : -INFINITY);
        p->q[qi_row_of(&p->b, w->r, w->i, w->h) * QI_D + QI_CH] = inf;
    }
}

static inline void qi_free(qi_problem *p)
{
    kva_cache_destroy(p->hc);
    free(p->q);
    kva_test_batch_free(&p->b);
}

/* kind [T * H]: what each row must show when the requests r with exc[r] set
 * run on a kernel under the exception (exc NULL: none). */
static inline void qi_expect(const qi_problem *p, const int *exc, uint8_t *kind)
{
    memset(kind, QI_FIN, (size_t)p->b.T * QI_H);
    for (int i = 0; i < QI_NROWS; i++) {
        const qi_row *w = &qi_rows[i];
        kind[qi_row_of(&p->b, w->r, w->i, w->h)] = exc && exc[w->r] ? w->exc : w->rule;
    }
}

/* Checks out [T * H, D] (bf16) and lse row by row against kind and, for
 * finite rows, against the reference (want, lse_want). Prints a line of
 * counts; returns the number of wrong rows. */
static inline size_t qi_check(const char *label, const qi_problem *p, const uint8_t *kind,
                              const void *out, const float *lse, const void *want,
                              const float *lse_want)
{
    const size_t rows = (size_t)p->b.T * QI_H;
    const double atol = kva_test_atol(KVA_DTYPE_BF16) + 2 * 0x1p-8,
                 rtol = kva_test_rtol(KVA_DTYPE_BF16);
    size_t n[4] = {0, 0, 0, 0}, bad[4] = {0, 0, 0, 0};
    for (size_t i = 0; i < rows; i++) {
        const int k = kind[i];
        int ok = 1;
        n[k]++;
        if (k == QI_NAN) {
            ok = kva_test_nan_written(lse, KVA_DTYPE_F32, i);
            for (int32_t e = 0; e < QI_D; e++)
                ok &= kva_test_nan_written(out, KVA_DTYPE_BF16, i * QI_D + e);
        } else if (k == QI_ZERO) {
            ok = lse[i] == -INFINITY;
            for (int32_t e = 0; e < QI_D; e++)
                ok &= kva_test_get(out, KVA_DTYPE_BF16, i * QI_D + e) == 0.0;
        } else if (k == QI_FIN) {
            const double a = lse[i], b = lse_want[i];
            ok = isfinite(a) && fabs(a - b) <= 1e-4 + 2e-5 * fabs(b);
            for (int32_t e = 0; e < QI_D; e++) {
                const double x = kva_test_get(out, KVA_DTYPE_BF16, i * QI_D + e);
                const double y = kva_test_get(want, KVA_DTYPE_BF16, i * QI_D + e);
                ok &= isfinite(x) && fabs(x - y) <= atol + rtol * fabs(y);
            }
        }
        if (!ok && bad[0] + bad[1] + bad[2] < 6) {
            static const char *names[3] = {"finite", "NaN", "0 / -inf"};
            fprintf(stderr,
                    "  %s: row %zu (token %zu, head %zu; %s expected): lse %.7g, out[0] %.7g\n",
                    label, i, i / QI_H, i % QI_H, names[k], (double)lse[i],
                    kva_test_get(out, KVA_DTYPE_BF16, i * QI_D));
        }
        bad[k] += !ok;
    }
    printf("  %s: rows finite %zu (%zu wrong), NaN %zu (%zu), 0 / -inf %zu (%zu), open %zu\n",
           label, n[QI_FIN], bad[QI_FIN], n[QI_NAN], bad[QI_NAN], n[QI_ZERO], bad[QI_ZERO],
           n[QI_ANY]);
    return bad[0] + bad[1] + bad[2];
}

#endif /* KVA_TEST_QINF_ROWS_H */
