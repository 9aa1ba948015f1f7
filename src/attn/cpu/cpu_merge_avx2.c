/*
 * cpu_merge_avx2.c - AVX2 + FMA + F16C row merge of the CPU backend's
 * multi-part LSE merge (kva__cpu_merge_rows; contract in cpu_attn.h). CMake
 * compiles this file with -mavx2 -mfma -mf16c; it is called only when the
 * context's ISA level is AVX2 or higher.
 *
 * Eight columns at a time, the accumulator stays in a register across the
 * parts (acc = sum_p w_p out_p, a fused multiply-add per part), and the
 * result is stored straight from it: bf16 rounds to nearest even in the
 * integer domain (NaN kept quiet, as kva_f32_to_bf16 does), f32 is stored as
 * is; f16 rows go through the scalar row store (its rounding and NaN rules).
 * bf16 rows take 16 columns per load (merge_row_bf16): a short DCP combine
 * is bound by these instructions, not by memory.
 */
#if defined(__x86_64__)

#include "cpu_attn.h"
#include "prefill_avx2.h" /* pf_exp */

#include <immintrin.h>

/* Eight elements of a row of dtype dt at p, as fp32 (exact). */
static inline __m256 load8(const unsigned char *p, kva_dtype dt)
{
    if (dt == KVA_DTYPE_F32)
        return _mm256_loadu_ps((const float *)p);
    const __m128i h = _mm_loadu_si128((const __m128i *)p);
    if (dt == KVA_DTYPE_F16)
        return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* Eight fp32 as bf16 in the low 16 bits of 32-bit lanes: kva__bf16_bits on
 * each lane (round to nearest even, NaN kept quiet). */
static inline __m256i bf16_lanes(__m256 x)
{
    const __m256i u = _mm256_castps_si256(x);
    const __m256i hi = _mm256_srli_epi32(u, 16);
    const __m256i odd = _mm256_and_si256(hi, _mm256_set1_epi32(1));
    const __m256i r = _mm256_srli_epi32(
        _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), odd), 16);
    /* NaN lanes (rare): the quiet bit set on the high half instead. */
    const __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
    if (_mm256_testz_ps(nan, nan))
        return r;
    const __m256i qnan = _mm256_or_si256(hi, _mm256_set1_epi32(0x40));
    return _mm256_blendv_epi8(r, qnan, _mm256_castps_si256(nan));
}

/* Eight fp32 as bf16 at p. */
static inline void store8_bf16(unsigned char *p, __m256 x)
{
    const __m256i r = bf16_lanes(x);
    /* r holds 16-bit values in 32-bit lanes: pack within lanes, then gather
     * the two lanes' low halves. */
    const __m256i pk = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
    _mm_storeu_si128((__m128i *)p, _mm256_castsi256_si128(pk));
}

/* Stores the nv vectors a (8 * nv columns from column c) of the merged row. */
static inline void store_cols(kva_dtype dt, unsigned char *dst, float *acc, int32_t c,
                              const __m256 *a, int nv)
{
    for (int v = 0; v < nv; v++) {
        if (dt == KVA_DTYPE_BF16)
            store8_bf16(dst + (size_t)(c + 8 * v) * 2, a[v]);
        else if (dt == KVA_DTYPE_F32)
            _mm256_storeu_ps((float *)dst + c + 8 * v, a[v]);
        else
            _mm256_storeu_ps(acc + c + 8 * v, a[v]);
    }
}

/* Merges columns [c, c + 8 * nv) over the parts; nv is a constant where it
 * inlines, so the nv independent accumulators unroll into registers. */
static inline void merge_cols(kva_dtype dt, size_t es, int32_t num_parts, const unsigned char *row0,
                              size_t part_bytes, const float *wts, unsigned char *dst, float *acc,
                              int32_t c, int nv)
{
    __m256 a[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                   _mm256_setzero_ps()};
    const unsigned char *r = row0 + (size_t)c * es;
    for (int32_t p = 0; p < num_parts; p++, r += part_bytes) {
        if (wts[p] == 0.0f)
            continue; /* a part of weight 0 is not read */
        const __m256 w = _mm256_set1_ps(wts[p]);
        for (int v = 0; v < nv; v++)
            a[v] = _mm256_fmadd_ps(w, load8(r + (size_t)8 * v * es, dt), a[v]);
    }
    store_cols(dt, dst, acc, c, a, nv);
}

/* Two vectors of bf16 values in 32-bit lanes (bf16_lanes of lo and hi),
 * packed within each 128-bit lane: the inverse of widen_lo / widen_hi below,
 * so the 16 columns of one load come back in their order. */
static inline __m256i pack_bf16(__m256 lo, __m256 hi)
{
    return _mm256_packus_epi32(bf16_lanes(lo), bf16_lanes(hi));
}

/* The 16 bf16 columns of x as fp32, exact: each element shifted into the
 * high half of a 32-bit lane by interleaving zeros below it. Within each
 * 128-bit lane, widen_lo takes columns 0-3 and widen_hi columns 4-7. */
static inline __m256 widen_lo(__m256i x)
{
    return _mm256_castsi256_ps(_mm256_unpacklo_epi16(_mm256_setzero_si256(), x));
}
static inline __m256 widen_hi(__m256i x)
{
    return _mm256_castsi256_ps(_mm256_unpackhi_epi16(_mm256_setzero_si256(), x));
}

/* kva__cpu_merge_row_avx2 for bf16 rows: 32 columns per step, two 32-byte
 * loads per part widened in place (the columns permuted within 128-bit
 * lanes alike in every part and in the accumulators, and put back by the
 * pack), then 16 columns and 8 for the rest of Dv. */
static void merge_row_bf16(int32_t Dv, int32_t num_parts, const unsigned char *row0,
                           size_t part_bytes, const float *wts, unsigned char *dst)
{
    int32_t c = 0;
    for (; c + 32 <= Dv; c += 32) {
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        const unsigned char *r = row0 + (size_t)c * 2;
        for (int32_t p = 0; p < num_parts; p++, r += part_bytes) {
            if (wts[p] == 0.0f)
                continue; /* a part of weight 0 is not read */
            const __m256 w = _mm256_set1_ps(wts[p]);
            const __m256i x = _mm256_loadu_si256((const __m256i *)r);
            const __m256i y = _mm256_loadu_si256((const __m256i *)(r + 32));
            a0 = _mm256_fmadd_ps(w, widen_lo(x), a0);
            a1 = _mm256_fmadd_ps(w, widen_hi(x), a1);
            a2 = _mm256_fmadd_ps(w, widen_lo(y), a2);
            a3 = _mm256_fmadd_ps(w, widen_hi(y), a3);
        }
        _mm256_storeu_si256((__m256i *)(dst + (size_t)c * 2), pack_bf16(a0, a1));
        _mm256_storeu_si256((__m256i *)(dst + (size_t)c * 2 + 32), pack_bf16(a2, a3));
    }
    for (; c + 16 <= Dv; c += 16) {
        __m256 a0 = _mm256_setzero_ps(), a1 = a0;
        const unsigned char *r = row0 + (size_t)c * 2;
        for (int32_t p = 0; p < num_parts; p++, r += part_bytes) {
            if (wts[p] == 0.0f)
                continue;
            const __m256 w = _mm256_set1_ps(wts[p]);
            const __m256i x = _mm256_loadu_si256((const __m256i *)r);
            a0 = _mm256_fmadd_ps(w, widen_lo(x), a0);
            a1 = _mm256_fmadd_ps(w, widen_hi(x), a1);
        }
        _mm256_storeu_si256((__m256i *)(dst + (size_t)c * 2), pack_bf16(a0, a1));
    }
    for (; c < Dv; c += 8)
        merge_cols(KVA_DTYPE_BF16, 2, num_parts, row0, part_bytes, wts, dst, NULL, c, 1);
}

unsigned kva__cpu_merge_weights8_avx2(int32_t num_parts, const float *l0, int64_t stride, float *w,
                                      float *lse)
{
    __m256 m = _mm256_set1_ps(-INFINITY), nan = _mm256_setzero_ps();
    for (int32_t p = 0; p < num_parts; p++) {
        const __m256 l = _mm256_loadu_ps(l0 + p * stride);
        nan = _mm256_or_ps(nan, _mm256_cmp_ps(l, l, _CMP_UNORD_Q));
        m = _mm256_max_ps(l, m); /* NaN lanes: the nan mask takes them */
    }
    /* Rows with no key (max -inf) or a +inf lse (NaN weights) go the scalar way. */
    const __m256 empty = _mm256_cmp_ps(m, _mm256_set1_ps(-INFINITY), _CMP_EQ_OQ);
    const __m256 pinf = _mm256_cmp_ps(m, _mm256_set1_ps(INFINITY), _CMP_EQ_OQ);
    const unsigned special =
        (unsigned)_mm256_movemask_ps(_mm256_or_ps(nan, _mm256_or_ps(empty, pinf)));
    /* exp(l - m), exactly 1 for the largest part (and 0 for l = -inf). */
    const __m256 one = _mm256_set1_ps(1.0f);
    __m256 sum = _mm256_setzero_ps();
    for (int32_t p = 0; p < num_parts; p++) {
        const __m256 l = _mm256_loadu_ps(l0 + p * stride);
        const __m256 top = _mm256_cmp_ps(l, m, _CMP_EQ_OQ);
        const __m256 e = _mm256_blendv_ps(pf_exp(_mm256_sub_ps(l, m)), one, top);
        _mm256_storeu_ps(w + p * 8, e);
        sum = _mm256_add_ps(sum, e);
    }
    const __m256 inv = _mm256_div_ps(one, sum);
    for (int32_t p = 0; p < num_parts; p++)
        _mm256_storeu_ps(w + p * 8, _mm256_mul_ps(_mm256_loadu_ps(w + p * 8), inv));
    float ms[8], ss[8];
    _mm256_storeu_ps(ms, m);
    _mm256_storeu_ps(ss, sum);
    for (int l = 0; l < 8; l++)
        lse[l] = ms[l] + logf(ss[l]);
    return special;
}

void kva__cpu_merge_row_avx2(kva_dtype dt, int32_t Dv, int32_t num_parts, const unsigned char *row0,
                             size_t part_bytes, const float *wts, void *dst)
{
    if (dt == KVA_DTYPE_BF16) {
        merge_row_bf16(Dv, num_parts, row0, part_bytes, wts, dst);
        return;
    }
    const size_t es = dt == KVA_DTYPE_F32 ? 4 : 2;
    float acc[KVA_MAX_HEAD_DIM]; /* the f16 row before its scalar store */
    int32_t c = 0;
    for (; c + 32 <= Dv; c += 32)
        merge_cols(dt, es, num_parts, row0, part_bytes, wts, dst, acc, c, 4);
    for (; c < Dv; c += 8)
        merge_cols(dt, es, num_parts, row0, part_bytes, wts, dst, acc, c, 1);
    if (dt == KVA_DTYPE_F16)
        kva__cpu_store_row(dst, dt, acc, Dv);
}

#endif
