/*
 * data.h - data helpers shared by the tests (through tests/harness.h), the
 * benchmarks and the CLI's correctness checks: a seeded RNG, random fills in
 * any float dtype, element access, NaN poisoning, and the per-dtype
 * tolerances with a tolerance-checked comparison, stated once here; and the
 * plan descriptor of an MLA batch.
 * Header-only (static inline); no test counters, so including it costs
 * nothing unused.
 */
#ifndef KVA_BENCH_DATA_H
#define KVA_BENCH_DATA_H

#include "kvattn.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- RNG: splitmix64, fixed seeds ---- */

typedef struct {
    uint64_t s;
} kva_rng;

static inline uint64_t kva_rng_u64(kva_rng *r)
{
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in [0, 1). */
static inline double kva_rng_unit(kva_rng *r)
{
    return (kva_rng_u64(r) >> 11) * 0x1.0p-53;
}

/* Uniform integer in [lo, hi]. */
static inline int32_t kva_rng_int(kva_rng *r, int32_t lo, int32_t hi)
{
    return lo + (int32_t)(kva_rng_u64(r) % (uint64_t)(hi - lo + 1));
}

/* Standard normal (Box-Muller). */
static inline double kva_rng_normal(kva_rng *r)
{
    double u1 = kva_rng_unit(r), u2 = kva_rng_unit(r);
    if (u1 < 1e-300)
        u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

/* Fills n elements of a float-typed buffer with N(0, sigma^2) values (never zeros). */
static inline void kva_test_fill(void *p, kva_dtype dt, size_t n, kva_rng *r, double sigma)
{
    for (size_t i = 0; i < n; i++) {
        float x = (float)(kva_rng_normal(r) * sigma);
        if (dt == KVA_DTYPE_F32)
            ((float *)p)[i] = x;
        else if (dt == KVA_DTYPE_F16)
            ((uint16_t *)p)[i] = kva_f32_to_f16(x);
        else
            ((uint16_t *)p)[i] = kva_f32_to_bf16(x);
    }
}

/* Fills n elements with uniform values of unit variance in (-sqrt 3, sqrt 3),
 * never zero: far cheaper than kva_test_fill's Box-Muller normals, for
 * caches of millions of elements. */
static inline void kva_test_fill_uniform(void *p, kva_dtype dt, size_t n, kva_rng *r)
{
    for (size_t i = 0; i < n; i++) {
        uint64_t u = kva_rng_u64(r);
        float x = (float)((int64_t)(u >> 11) - (int64_t)(1ull << 52)) * (float)(1.7320508 / 0x1p52);
        if (x == 0.0f)
            x = 0.5f;
        if (dt == KVA_DTYPE_F32)
            ((float *)p)[i] = x;
        else if (dt == KVA_DTYPE_F16)
            ((uint16_t *)p)[i] = kva_f32_to_f16(x);
        else
            ((uint16_t *)p)[i] = kva_f32_to_bf16(x);
    }
}

/* Reads element i of a float-typed buffer. */
static inline double kva_test_get(const void *p, kva_dtype dt, size_t i)
{
    if (dt == KVA_DTYPE_F32)
        return ((const float *)p)[i];
    if (dt == KVA_DTYPE_F16)
        return kva_f16_to_f32(((const uint16_t *)p)[i]);
    return kva_bf16_to_f32(((const uint16_t *)p)[i]);
}

/* The poison of outputs: a NaN whose payload no arithmetic produces (a
 * computed NaN carries an input's payload or the default quiet one, 0x7fc00000
 * / 0x7e00 / 0x7fc0), so that an element a kernel fails to write is caught
 * also where the written value must be NaN: kva_test_nan_written tells the
 * two apart, and "left untouched" checks compare the exact bits
 * (kva_test_poisoned). Inputs the tests want NaN hold NAN, never this. */
#define KVA_TEST_POISON32 0x7fd5d5d5u
#define KVA_TEST_POISON16 0x7fd5u

/* Fills n elements with the poison NaN so that any element a kernel fails to write is caught. */
static inline void kva_test_poison(void *p, kva_dtype dt, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (dt == KVA_DTYPE_F32)
            memcpy((char *)p + 4 * i, &(uint32_t){KVA_TEST_POISON32}, 4);
        else
            ((uint16_t *)p)[i] = KVA_TEST_POISON16;
    }
}

/* Whether element i of p (a float dtype) still holds kva_test_poison's bits. */
static inline int kva_test_poisoned(const void *p, kva_dtype dt, size_t i)
{
    if (dt == KVA_DTYPE_F32) {
        uint32_t u;
        memcpy(&u, (const char *)p + 4 * i, 4);
        return u == KVA_TEST_POISON32;
    }
    return ((const uint16_t *)p)[i] == KVA_TEST_POISON16;
}

/* Number of the n elements of p that still hold the poison: never written.
 * Tests that compare two runs' bytes check this as well, since an element
 * that neither run writes is equal in both. */
static inline size_t kva_test_count_poisoned(const void *p, kva_dtype dt, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        k += (size_t)kva_test_poisoned(p, dt, i);
    return k;
}

/* Whether element i of p holds a NaN that was written (not the poison). */
static inline int kva_test_nan_written(const void *p, kva_dtype dt, size_t i)
{
    return isnan(kva_test_get(p, dt, i)) && !kva_test_poisoned(p, dt, i);
}

/* Tolerances per dtype of the compared outputs: |a - b| <= atol + rtol * |b|.
 * f32 outputs: fp32 accumulation against the fp64 reference. f16/bf16 outputs
 * are rounded once at the end, so two correct results differ by at most one
 * unit in the last place: 2^-10 (f16) or 2^-7 (bf16) relative, plus a little
 * fp32 accumulation error; atol only covers values near zero, where the
 * absolute fp32 error of a long weighted sum exceeds an ulp of the result. */
static inline double kva_test_atol(kva_dtype dt)
{
    return dt == KVA_DTYPE_F32 ? 2e-5 : 1e-5;
}
static inline double kva_test_rtol(kva_dtype dt)
{
    return dt == KVA_DTYPE_F32 ? 2e-5 : dt == KVA_DTYPE_F16 ? 1.2e-3 : 9e-3;
}

/* Bounds of MLA over a bf16 latent cache on a kernel that rounds the
 * absorbed queries and the softmax weights P to bf16 (the CPU's
 * mla_avx512bf16; the CUDA kernels have their own, looser ones) against the
 * fp64 reference, for unit-variance data: out atol (with the bf16 rtol),
 * LSE atol, cosine distance. tests/test_mla.c derives them. */
#define KVA_TEST_MLA_BF16DOT_ATOL 6.3e-3
#define KVA_TEST_MLA_BF16DOT_LSE_ATOL 7e-3
#define KVA_TEST_MLA_BF16DOT_COS 2e-5

/* The same for sparse MLA by bf16 dot products (mla_avx512bf16 with bf16
 * queries, exact in bf16, over rows it reads as bf16: a bf16 cache,
 * fp8_ds_mla rows dequantized to bf16 (ds 1), gathered rows), for
 * unit-variance q and rows and the scale 1 / sqrt(128 + Dr) of
 * tests/sparse_util.h and `bench --mla-sparse`: out atol (with the bf16
 * rtol), LSE atol, cosine distance. tests/test_mla_sparse.c derives them. */
static inline void kva_test_sparse_bf16dot_bounds(int32_t Dc, int32_t Dr, int ds, double *atol,
                                                  double *lse_atol, double *cos_max)
{
    const double s = 0x1p-9 / sqrt(3.0), D = Dc + Dr;
    const double sig = ds ? s * sqrt(D / (128.0 + Dr)) * sqrt(Dc / D) : 0.0;
    const double e = sqrt(2.0) * sig + (ds ? 2.0 : 1.0) * s;
    *atol = 8e-4 + 5.0 * e;
    *lse_atol = 5e-5 + 6.0 * sig;
    *cos_max = 5e-6 + 2.3 * e * 2.3 * e / 2.0;
}

/* Tolerances of a cascade run against the reference's plain one: the two
 * passes' outputs are rounded to the output dtype before the merge rounds
 * again, an error of up to one rounding of the partials however small the
 * merged value (tests/cascade_util.h, serve-sim --verify). */
static inline double kva_test_cascade_atol(kva_dtype dt)
{
    return dt == KVA_DTYPE_F32 ? 1e-4 : dt == KVA_DTYPE_F16 ? 1e-3 : 8e-3;
}
static inline double kva_test_cascade_rtol(kva_dtype dt)
{
    return dt == KVA_DTYPE_F32 ? 1e-4 : dt == KVA_DTYPE_F16 ? 3e-3 : 2e-2;
}

/* Compares n elements; returns the number of mismatches (NaN always mismatches)
 * and prints the first few with a label. */
static inline size_t kva_test_compare(const char *label, const void *got, const void *want,
                                      kva_dtype dt, size_t n, double atol, double rtol)
{
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        double a = kva_test_get(got, dt, i), b = kva_test_get(want, dt, i);
        int ok = (isinf(b) && a == b) || fabs(a - b) <= atol + rtol * fabs(b);
        if (!ok) {
            if (bad < 5)
                fprintf(stderr, "  %s: element %zu: got %.8g, want %.8g\n", label, i, a, b);
            bad++;
        }
    }
    return bad;
}

/* Compares float32 arrays that may contain -inf (LSE). */
static inline size_t kva_test_compare_f32(const char *label, const float *got, const float *want,
                                          size_t n, double atol, double rtol)
{
    return kva_test_compare(label, got, want, KVA_DTYPE_F32, n, atol, rtol);
}

/* ---- MLA plan descriptor ---- */

/* The plan descriptor of an MLA batch (kind KVA_ATTN_MLA, one latent kv head
 * of head_dim = Dc + Dr, head_dim_v = Dc; q_len <= 4 counts as a decode, no
 * window), shared by the MLA tests, benchmarks and the CLI's sparse MLA
 * bench; callers set the sparse and layer-level fields on the result. */
static inline kva_plan_desc kva_test_mla_desc(int32_t R, const int32_t *qsl,
                                              const int32_t *seq_lens, const int32_t *block_table,
                                              int32_t stride, int32_t B, int32_t H,
                                              int32_t head_dim, int32_t head_dim_v,
                                              kva_dtype q_dtype, double scale, int causal)
{
    kva_plan_desc pd;
    memset(&pd, 0, sizeof pd);
    pd.num_requests = R;
    pd.query_start_loc = qsl;
    pd.seq_lens = seq_lens;
    pd.block_table = block_table;
    pd.block_table_stride = stride;
    pd.block_size = B;
    pd.decode_threshold = 4;
    pd.num_heads = H;
    pd.num_kv_heads = 1;
    pd.head_dim = head_dim;
    pd.head_dim_v = head_dim_v;
    pd.q_dtype = q_dtype;
    pd.scale = (float)scale;
    pd.causal = causal;
    pd.window_left = -1;
    pd.kind = KVA_ATTN_MLA;
    return pd;
}

#endif /* KVA_BENCH_DATA_H */
