/*
 * decode_avx512.c - CPU attention kernels decode_avx512 and decode_avx512bf16:
 * AVX-512 (F/BW/VL/DQ), GQA-packed online softmax for decode-shaped items;
 * decode_avx512bf16 adds AVX512_BF16 scores for bf16 q and cache, and on CPUs with
 * AVX512_VNNI int8 dot-product scores for int8 keys.
 *
 * Same work item and semantics as decode_portable (attn_portable.c); the
 * loop structure (scores with keys outer and up to 4 heads' q in registers,
 * hsum16 reductions, vdpbf16ps and VNNI int8 scores, register-blocked P.V,
 * the NHD key order 0, 2, 1, 3 of key_at) and the non-finite rules are
 * docs/architecture.md, "The AVX-512 decode step"; measurements and what was
 * tried: bench/results/2026-11-22_performance-journal.md.
 */
#include "cpu_attn.h"

#if defined(__x86_64__)

#include "decode_avx512.h"

/* Whether an fp8 row of `bytes` bytes holds a NaN code (0x7f, 0xff). */
AI int row_has_nan_fp8(const unsigned char *src, size_t bytes)
{
    const __m512i lo7 = _mm512_set1_epi8(0x7f);
    __mmask64 nan = 0;
    for (size_t b = 0; b < bytes; b += 64) {
        const __mmask64 m = bytes - b >= 64 ? ~(__mmask64)0 : ((__mmask64)1 << (bytes - b)) - 1;
        const __m512i x = _mm512_maskz_loadu_epi8(m, src + b);
        nan |= _mm512_mask_cmpeq_epi8_mask(m, _mm512_and_si512(x, lo7), lo7);
    }
    return nan != 0;
}

/* kva__cpu_decode_isa.fp8_nan: the n K and V rows of an fp8 chunk. */
static int chunk_has_nan_fp8(const kva__cpu_chunk_rows *cr, int32_t n, size_t kbytes, size_t vbytes)
{
    return chunk_any_row(cr, n, kbytes, vbytes, row_has_nan_fp8);
}

/* kva__cpu_decode_isa.acc_unpair: pv_block's pair layout stores each full
 * 32-dim block of a row as [even dims, odd dims]. */
static void bf16_acc_unpair(float *acc, int32_t M, int32_t Dv)
{
    const __m512i lo = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    const __m512i hi =
        _mm512_set_epi32(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8);
    for (int32_t m = 0; m < M; m++)
        for (int32_t d = 0; d + 32 <= Dv; d += 32) {
            float *a = acc + (size_t)m * Dv + d;
            const __m512 ev = _mm512_loadu_ps(a), od = _mm512_loadu_ps(a + 16);
            _mm512_storeu_ps(a, _mm512_permutex2var_ps(ev, lo, od));
            _mm512_storeu_ps(a + 16, _mm512_permutex2var_ps(ev, hi, od));
        }
}

/* The mask of the dims d.. of a row of D dims (16 or fewer). */
AI __mmask16 dims16(int32_t d, int32_t D)
{
    return D - d >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (D - d)) - 1u);
}

/*
 * kva__cpu_kq_prepare_avx512 (cpu_attn.h), 16 dims at a time, bitwise the
 * scalar definition: the maxima are exact in any order; each qn is the same
 * double product rounded by vcvtpd2dq in the current rounding mode (the
 * scalar adds and removes 1.5 x 2^52, which rounds the same way for
 * |x| <= 2^22); the digits are the same int32 arithmetic (n - c is a
 * multiple of 256, so the shift is the division) and their sums are exact.
 * The offsets' term is a sum in double whose order matters: each product
 * qn_d koff_d is exact (23 x 24 significant bits), so a row's sum is fixed
 * by its order of d alone, kept by summing 8 rows at once, one per lane, d
 * by d, over their qn saved in nrow.
 */
int kva__cpu_kq_prepare_avx512(const float *q, int32_t M, int32_t D, const float *koff, int8_t *qi,
                               float *qk, int32_t *qc)
{
    /* Each row's max |q_d| (kept in qk[2m] until its step replaces it), and
     * whether every |q_d| is <= 3.4e38f (masked-off dims load as 0). */
    const __m512 lim = _mm512_set1_ps(3.4e38f);
    __mmask16 ok = 0xffff;
    for (int32_t m = 0; m < M; m++) {
        const float *qm = q + (size_t)m * D;
        __m512 mx = _mm512_setzero_ps();
        for (int32_t d = 0; d < D; d += 16) {
            const __m512 a = _mm512_abs_ps(_mm512_maskz_loadu_ps(dims16(d, D), qm + d));
            mx = _mm512_max_ps(a, mx);
            ok &= _mm512_cmp_ps_mask(a, lim, _CMP_LE_OQ);
        }
        qk[2 * m] = _mm512_reduce_max_ps(mx);
    }
    if (ok != 0xffff)
        return 0;
    const __m512i c128 = _mm512_set1_epi32(128), c255 = _mm512_set1_epi32(255);
    const __m512i nmax = _mm512_set1_epi32(1 << 22), nmin = _mm512_set1_epi32(-(1 << 22));
    int32_t nrow[8 * KVA_MAX_HEAD_DIM]; /* [8, D] qn of the block's rows (koff only) */
    for (int32_t m0 = 0; m0 < M; m0 += 8) {
        const int32_t nb = M - m0 < 8 ? M - m0 : 8;
        for (int32_t r = 0; r < nb; r++) {
            const int32_t m = m0 + r;
            const float *qm = q + (size_t)m * D;
            int8_t *qa = qi + (size_t)m * 3 * D, *qb = qa + D, *qcd = qb + D;
            const float amax = qk[2 * m];
            /* In double: 2^22 / amax overflows float for subnormal rows. */
            const __m512d inv = _mm512_set1_pd(amax > 0.0f ? 0x1p22 / amax : 0.0);
            __m512i sa = _mm512_setzero_si512(), sb = sa, sc = sa;
            for (int32_t d = 0; d < D; d += 16) {
                const __mmask16 k = dims16(d, D);
                const __m512 x = _mm512_maskz_loadu_ps(k, qm + d);
                const __m256 xl = _mm512_castps512_ps256(x), xh = _mm512_extractf32x8_ps(x, 1);
                const __m256i nl = _mm512_cvtpd_epi32(_mm512_mul_pd(_mm512_cvtps_pd(xl), inv));
                const __m256i nh = _mm512_cvtpd_epi32(_mm512_mul_pd(_mm512_cvtps_pd(xh), inv));
                __m512i n = _mm512_inserti64x4(_mm512_castsi256_si512(nl), nh, 1);
                n = _mm512_min_epi32(_mm512_max_epi32(n, nmin), nmax);
                const __m512i c =
                    _mm512_sub_epi32(_mm512_and_si512(_mm512_add_epi32(n, c128), c255), c128);
                const __m512i n1 = _mm512_srai_epi32(_mm512_sub_epi32(n, c), 8);
                const __m512i b =
                    _mm512_sub_epi32(_mm512_and_si512(_mm512_add_epi32(n1, c128), c255), c128);
                const __m512i a = _mm512_srai_epi32(_mm512_sub_epi32(n1, b), 8);
                _mm512_mask_cvtepi32_storeu_epi8(qa + d, k, a);
                _mm512_mask_cvtepi32_storeu_epi8(qb + d, k, b);
                _mm512_mask_cvtepi32_storeu_epi8(qcd + d, k, c);
                sa = _mm512_add_epi32(sa, a);
                sb = _mm512_add_epi32(sb, b);
                sc = _mm512_add_epi32(sc, c);
                if (koff)
                    _mm512_mask_storeu_epi32(nrow + (size_t)r * D + d, k, n);
            }
            qk[2 * m] = amax * 0x1p-22f;
            qk[2 * m + 1] = 0.0f;
            qc[4 * m] = 128 * _mm512_reduce_add_epi32(sa);
            qc[4 * m + 1] = 128 * _mm512_reduce_add_epi32(sb);
            qc[4 * m + 2] = 128 * _mm512_reduce_add_epi32(sc);
            qc[4 * m + 3] = 0;
        }
        if (koff) {
            /* Lane r: row m0 + r (lanes past nb repeat row 0, unused). */
            const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
            const __m256i row = _mm256_mullo_epi32(
                _mm256_and_si256(lane, _mm256_cmpgt_epi32(_mm256_set1_epi32(nb), lane)),
                _mm256_set1_epi32(D));
            __m512d off = _mm512_setzero_pd();
            for (int32_t d = 0; d < D; d++) {
                const __m256i n = _mm256_i32gather_epi32(nrow + d, row, 4);
                off = _mm512_add_pd(
                    off, _mm512_mul_pd(_mm512_cvtepi32_pd(n), _mm512_set1_pd((double)koff[d])));
            }
            double o[8];
            _mm512_storeu_pd(o, off);
            for (int32_t r = 0; r < nb; r++)
                qk[2 * (m0 + r) + 1] = (float)o[r];
        }
    }
    return 1;
}

/* The chunk steps of each format pair (cpu_fold.h), one file each. */
static const kva__cpu_steps *const pair_steps[PAIR_COUNT] = {
    [PAIR_F32] = &kva__avx512_steps_f32,           [PAIR_F16] = &kva__avx512_steps_f16,
    [PAIR_BF16] = &kva__avx512_steps_bf16,         [PAIR_I8] = &kva__avx512_steps_i8,
    [PAIR_I8S] = &kva__avx512_steps_i8s,           [PAIR_I8T_I8] = &kva__avx512_steps_i8t_i8,
    [PAIR_I8T_I8S] = &kva__avx512_steps_i8t_i8s,   [PAIR_I8T_F16] = &kva__avx512_steps_i8t_f16,
    [PAIR_I8T_BF16] = &kva__avx512_steps_i8t_bf16, [PAIR_FP8] = &kva__avx512_steps_fp8,
    [PAIR_FP8N] = &kva__avx512_steps_fp8n,
};

/* decode_avx512 and decode_avx512bf16: the same steps; the latter adds the
 * vdpbf16ps steps for bf16 q and cache (without a compiler that knows
 * AVX512_BF16 it has none) and the VNNI int8 key scores. */
static const kva__cpu_decode_isa avx512 = {pair_steps,        NULL,           1, NULL,
                                           chunk_has_nan_fp8, bf16_acc_unpair};
#if defined(__AVX512BF16__)
static const kva__cpu_decode_isa avx512bf16 = {
    pair_steps,     &kva__avx512_steps_bf16dot, 1, kva__cpu_kq_prepare_avx512, chunk_has_nan_fp8,
    bf16_acc_unpair};
#else
static const kva__cpu_decode_isa avx512bf16 = {
    pair_steps, NULL, 1, kva__cpu_kq_prepare_avx512, chunk_has_nan_fp8, bf16_acc_unpair};
#endif

void kva__cpu_decode_avx512(const kva__cpu_run *run, const kva__work_item *it, kva__cpu_scratch *s)
{
    kva__cpu_decode_item(run, it, s, &avx512);
}

void kva__cpu_decode_avx512bf16(const kva__cpu_run *run, const kva__work_item *it,
                                kva__cpu_scratch *s)
{
    kva__cpu_decode_item(run, it, s, &avx512bf16);
}

void kva__cpu_decode_avx512_group(const kva__cpu_run *run, const kva__work_item *items, int32_t n,
                                  kva__cpu_scratch *s)
{
    kva__cpu_decode_group(run, items, n, s, &avx512);
}

void kva__cpu_decode_avx512bf16_group(const kva__cpu_run *run, const kva__work_item *items,
                                      int32_t n, kva__cpu_scratch *s)
{
    kva__cpu_decode_group(run, items, n, s, &avx512bf16);
}

#endif /* __x86_64__ */
