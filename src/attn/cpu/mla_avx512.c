/*
 * mla_avx512.c - the layer-level MLA items (mla_items.inc) compiled for
 * AVX-512 (CMakeLists.txt gives *_avx512.c its flags), with the absorbed
 * path's score product written in intrinsics: the compiler does not keep a
 * tile of accumulators in registers on its own. Also the registry's
 * mla_avx512bf16 (kva__cpu_mla_item_avx512bf16): the same items with the
 * absorbed path's latent rows taken by vdpbf16ps (mla_bf16dot.inc). Called only after run-time
 * detection (mla_cpu.c); elsewhere it compiles to nothing.
 */
#include "mla_cpu.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#include <math.h>
#include <string.h>

/* ST [n, M] (row stride lds) = kb [n, K] (stride ldk) . qT [K, M] (stride
 * ldq). M % 32 == 0: tiles of 8 keys x 32 rows (kb rows are read up to the
 * next multiple of 8 past n: the callers' buffers hold C rows); M % 16 == 0:
 * 16 keys x 16 rows; 16 accumulators either way, per channel d the rows'
 * vector(s) of qT loaded once and each key's channel broadcast. Other M: a
 * plain loop. */
static void mla_scores(const float *restrict kb, int32_t ldk, const float *restrict qT, int32_t ldq,
                       int32_t n, int32_t K, int32_t M, float *restrict ST, int32_t lds)
{
    if (M % 32 == 0) {
        for (int32_t m0 = 0; m0 < M; m0 += 32)
            for (int32_t j0 = 0; j0 < n; j0 += 8) {
                __m512 a[8][2];
                for (int u = 0; u < 8; u++)
                    a[u][0] = a[u][1] = _mm512_setzero_ps();
                const float *k0 = kb + (size_t)j0 * ldk;
                for (int32_t d = 0; d < K; d++) {
                    const __m512 q0 = _mm512_loadu_ps(qT + (size_t)d * ldq + m0);
                    const __m512 q1 = _mm512_loadu_ps(qT + (size_t)d * ldq + m0 + 16);
                    for (int u = 0; u < 8; u++) {
                        const __m512 k = _mm512_set1_ps(k0[(size_t)u * ldk + d]);
                        a[u][0] = _mm512_fmadd_ps(k, q0, a[u][0]);
                        a[u][1] = _mm512_fmadd_ps(k, q1, a[u][1]);
                    }
                }
                for (int u = 0; u < 8 && j0 + u < n; u++) {
                    _mm512_storeu_ps(ST + (size_t)(j0 + u) * lds + m0, a[u][0]);
                    _mm512_storeu_ps(ST + (size_t)(j0 + u) * lds + m0 + 16, a[u][1]);
                }
            }
        return;
    }
    if (M % 16 != 0) {
        for (int32_t j = 0; j < n; j++)
            for (int32_t m = 0; m < M; m++) {
                float x = 0.0f;
                for (int32_t d = 0; d < K; d++)
                    x += kb[(size_t)j * ldk + d] * qT[(size_t)d * ldq + m];
                ST[(size_t)j * lds + m] = x;
            }
        return;
    }
    for (int32_t m0 = 0; m0 < M; m0 += 16)
        for (int32_t j0 = 0; j0 < n; j0 += 16) {
            __m512 a[16];
            for (int u = 0; u < 16; u++)
                a[u] = _mm512_setzero_ps();
            const float *k0 = kb + (size_t)j0 * ldk;
            const int kn = n - j0 < 16 ? n - j0 : 16;
            if (kn == 16) {
                for (int32_t d = 0; d < K; d++) {
                    const __m512 q = _mm512_loadu_ps(qT + (size_t)d * ldq + m0);
                    for (int u = 0; u < 16; u++)
                        a[u] = _mm512_fmadd_ps(_mm512_set1_ps(k0[(size_t)u * ldk + d]), q, a[u]);
                }
            } else {
                for (int32_t d = 0; d < K; d++) {
                    const __m512 q = _mm512_loadu_ps(qT + (size_t)d * ldq + m0);
                    for (int u = 0; u < kn; u++)
                        a[u] = _mm512_fmadd_ps(_mm512_set1_ps(k0[(size_t)u * ldk + d]), q, a[u]);
                }
            }
            for (int u = 0; u < kn; u++)
                _mm512_storeu_ps(ST + (size_t)(j0 + u) * lds + m0, a[u]);
        }
}
#define MLA_HAVE_SCORES 1

/* o [M, W] (row stride W) += PT [n, M]^T (row stride ldp) . kb [n, W] (row
 * stride ldk), row m over the keys before its limit (kva__cpu_mla_lim of
 * vis), M a multiple of 4: tiles of 4 rows x 64 columns in 16 accumulators,
 * keys innermost (4 value vectors loaded, 4 weights broadcast per key) up to
 * the limit of the tile's first row, then each row alone up to its own (the
 * limits grow with the row); a column tail under 64 in 16-wide steps (W is a
 * multiple of 8: the last step masked). */
static void mla_pv(const float *restrict PT, int32_t ldp, const float *restrict kb, int32_t ldk,
                   int32_t n, int32_t M, int32_t W, float *restrict o, const kva__cpu_mla_vis *vis)
{
    for (int32_t m0 = 0; m0 < M; m0 += 4) {
        int32_t lim[4];
        for (int u = 0; u < 4; u++)
            lim[u] = kva__cpu_mla_lim(vis, m0 + u, n);
        int32_t c0 = 0;
        for (; c0 + 64 <= W; c0 += 64) {
            __m512 a[4][4];
            for (int u = 0; u < 4; u++)
                for (int v = 0; v < 4; v++)
                    a[u][v] = _mm512_loadu_ps(o + (size_t)(m0 + u) * W + c0 + 16 * v);
            for (int32_t j = 0; j < lim[0]; j++) {
                const float *vr = kb + (size_t)j * ldk + c0;
                const __m512 v0 = _mm512_loadu_ps(vr), v1 = _mm512_loadu_ps(vr + 16);
                const __m512 v2 = _mm512_loadu_ps(vr + 32), v3 = _mm512_loadu_ps(vr + 48);
                for (int u = 0; u < 4; u++) {
                    const __m512 p = _mm512_set1_ps(PT[(size_t)j * ldp + m0 + u]);
                    a[u][0] = _mm512_fmadd_ps(p, v0, a[u][0]);
                    a[u][1] = _mm512_fmadd_ps(p, v1, a[u][1]);
                    a[u][2] = _mm512_fmadd_ps(p, v2, a[u][2]);
                    a[u][3] = _mm512_fmadd_ps(p, v3, a[u][3]);
                }
            }
            for (int u = 1; u < 4; u++)
                for (int32_t j = lim[0]; j < lim[u]; j++) {
                    const float *vr = kb + (size_t)j * ldk + c0;
                    const __m512 p = _mm512_set1_ps(PT[(size_t)j * ldp + m0 + u]);
                    for (int v = 0; v < 4; v++)
                        a[u][v] = _mm512_fmadd_ps(p, _mm512_loadu_ps(vr + 16 * v), a[u][v]);
                }
            for (int u = 0; u < 4; u++)
                for (int v = 0; v < 4; v++)
                    _mm512_storeu_ps(o + (size_t)(m0 + u) * W + c0 + 16 * v, a[u][v]);
        }
        for (; c0 < W; c0 += 16) {
            const __mmask16 k = W - c0 >= 16 ? (__mmask16)0xffff : (__mmask16)0xff;
            for (int u = 0; u < 4; u++) {
                float *orow = o + (size_t)(m0 + u) * W + c0;
                __m512 a = _mm512_maskz_loadu_ps(k, orow);
                for (int32_t j = 0; j < lim[u]; j++)
                    a = _mm512_fmadd_ps(_mm512_set1_ps(PT[(size_t)j * ldp + m0 + u]),
                                        _mm512_maskz_loadu_ps(k, kb + (size_t)j * ldk + c0), a);
                _mm512_mask_storeu_ps(orow, k, a);
            }
        }
    }
}
#define MLA_HAVE_PV 1

/* mla_items.inc's row loader (defined there, after this file's tiles). */
static void mla_load(float *restrict dst, const void *src, kva_dtype dt, int64_t n);

/* y [c0, c0 + 16 NV) += sum over i < k of coef[i] . w[i, c0 ..) (bf16 rows
 * of n), summed in NV registers across the rows. */
static inline __attribute__((always_inline)) void
mla_rows_block(float *restrict y, const float *restrict coef, const uint16_t *w, int32_t k,
               int32_t n, int32_t c0, const int NV)
{
    __m512 acc[16];
    for (int v = 0; v < NV; v++)
        acc[v] = _mm512_loadu_ps(y + c0 + 16 * v);
    for (int32_t i = 0; i < k; i++) {
        const __m512 a = _mm512_set1_ps(coef[i]);
        const uint16_t *r = w + (size_t)i * n + c0;
        for (int v = 0; v < NV; v++) {
            const __m256i h = _mm256_loadu_si256((const __m256i *)(r + 16 * v));
            const __m512 x = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
            acc[v] = _mm512_fmadd_ps(a, x, acc[v]);
        }
    }
    for (int v = 0; v < NV; v++)
        _mm512_storeu_ps(y + c0 + 16 * v, acc[v]);
}

/* y [n] += sum over i < k of coef[i] . w[i, 0 .. n) (w [k, n] in dt): for
 * bf16 rows and n a multiple of 16, blocks of 256, 128 or 16 columns summed
 * in registers over all k rows, each row's bf16 block widened in registers
 * (one read of w, no fp32 copy); other dtypes row by row through wrow. */
static void mla_rows_fma(float *restrict y, const float *restrict coef, const void *w, kva_dtype dt,
                         int32_t k, int32_t n, float *restrict wrow)
{
    if (dt != KVA_DTYPE_BF16 || n % 16 != 0) {
        const size_t es = kva_dtype_size(dt);
        for (int32_t i = 0; i < k; i++) {
            mla_load(wrow, (const char *)w + (size_t)i * n * es, dt, n);
            for (int32_t e = 0; e < n; e++)
                y[e] += coef[i] * wrow[e];
        }
        return;
    }
    int32_t c0 = 0;
    for (; c0 + 256 <= n; c0 += 256)
        mla_rows_block(y, coef, w, k, n, c0, 16);
    for (; c0 + 128 <= n; c0 += 128)
        mla_rows_block(y, coef, w, k, n, c0, 8);
    for (; c0 < n; c0 += 16)
        mla_rows_block(y, coef, w, k, n, c0, 1);
}
#define MLA_HAVE_ROWS_FMA 1

/* mla_rows_fma for nr rows at once that share w: y[u] [n] += sum over i < k
 * of coef[u][i] . w[i, 0 .. n). Four bf16 rows (n a multiple of 64) go as
 * tiles of 4 rows x 64 columns, so that each weight row is read and widened
 * once for the four (the staged head passes run every request's rows of a
 * head against its W_UK / W_UV: read once per row, the 128 KB of a
 * DeepSeek head's weights left L1 for every row). A tile reads its 64
 * columns of every weight row (1 KB apart at Dc 512), so the first column
 * block's lines are prefetched up front and each next block's a block ahead
 * (without, the strided reads waited on DRAM where the weights do not stay
 * in cache, as at H 128). Each output sums in the same order as
 * mla_rows_fma: the results are bitwise the same. */
static void mla_rows_fma_n(float *const *y, const float *const *coef, int32_t nr, const void *w,
                           kva_dtype dt, int32_t k, int32_t n, float *restrict wrow)
{
    if (nr != 4 || dt != KVA_DTYPE_BF16 || n % 64 != 0) {
        for (int32_t u = 0; u < nr; u++)
            mla_rows_fma(y[u], coef[u], w, dt, k, n, wrow);
        return;
    }
    for (int32_t i = 0; i < k; i++) /* the first column block's lines */
        for (int b = 0; b < 128; b += 64)
            _mm_prefetch((const char *)((const uint16_t *)w + (size_t)i * n) + b, _MM_HINT_T0);
    for (int32_t c0 = 0; c0 < n; c0 += 64) {
        __m512 acc[4][4];
        for (int u = 0; u < 4; u++)
            for (int v = 0; v < 4; v++)
                acc[u][v] = _mm512_loadu_ps(y[u] + c0 + 16 * v);
        for (int32_t i = 0; i < k; i++) {
            const uint16_t *r = (const uint16_t *)w + (size_t)i * n + c0;
            if (c0 + 64 < n) /* the next column block's lines of this row, a block ahead */
                for (int b = 0; b < 128; b += 64)
                    _mm_prefetch((const char *)(r + 64) + b, _MM_HINT_T0);
            __m512 x[4];
            for (int v = 0; v < 4; v++)
                x[v] = _mm512_castsi512_ps(_mm512_slli_epi32(
                    _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(r + 16 * v))), 16));
            for (int u = 0; u < 4; u++) {
                const __m512 a = _mm512_set1_ps(coef[u][i]);
                for (int v = 0; v < 4; v++)
                    acc[u][v] = _mm512_fmadd_ps(a, x[v], acc[u][v]);
            }
        }
        for (int u = 0; u < 4; u++)
            for (int v = 0; v < 4; v++)
                _mm512_storeu_ps(y[u] + c0 + 16 * v, acc[u][v]);
    }
}
#define MLA_HAVE_ROWS_FMA_N 1

#define KVA_MLA_ITEM kva__cpu_mla_item_avx512
#if defined(__AVX512BF16__)
/* mla_avx512bf16: the same items, the absorbed path's step 2 by bf16 dot
 * products (mla_bf16dot.inc) for a bf16 latent cache. */
#define KVA_MLA_ITEM_BF16DOT kva__cpu_mla_item_avx512bf16
#endif
#include "mla_items.inc"
#if defined(__AVX512BF16__)
#include "mla_bf16dot.inc"
#else
/* Without a compiler that knows AVX512_BF16, mla_avx512bf16 runs the fp32
 * items. */
void kva__cpu_mla_item_avx512bf16(const kva__cpu_mla *m, const kva__cpu_mla_item *it,
                                  float *scratch)
{
    kva__cpu_mla_item_avx512(m, it, scratch);
}
#endif
#endif
