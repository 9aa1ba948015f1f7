/*
 * cpu_merge_avx512.c - AVX-512 row merge of bf16 rows for the CPU backend's
 * multi-part LSE merge (kva__cpu_merge_rows; contract in cpu_attn.h). CMake
 * compiles this file with AVX-512 F/BW/VL/DQ; it is called only when the
 * context's ISA level is AVX512 or higher (other dtypes, and bf16 below that
 * level, take cpu_merge_avx2.c).
 *
 * A short DCP combine (a few decodes: 128 rows of 256 bytes per part) is
 * bound by the merge's instructions, not by memory, so each step takes 32
 * columns: one 64-byte load per part, widened to fp32 in place by
 * interleaving zeros below each element (which permutes the columns within
 * 128-bit lanes, alike in every part and in the accumulators), one fused
 * multiply-add per half, and one rounding store that packs the halves back
 * into column order. The tail of Dv (a multiple of 8) is masked.
 */
#if defined(__x86_64__)

#include "cpu_attn.h"

#include <immintrin.h>

/* Columns 0-3 (lo) or 4-7 (hi) of each 128-bit lane of x, bf16 -> fp32 exactly. */
static inline __m512 widen_lo(__m512i x)
{
    return _mm512_castsi512_ps(_mm512_unpacklo_epi16(_mm512_setzero_si512(), x));
}
static inline __m512 widen_hi(__m512i x)
{
    return _mm512_castsi512_ps(_mm512_unpackhi_epi16(_mm512_setzero_si512(), x));
}

/* Sixteen fp32 as bf16 in the low half of 32-bit lanes: kva__bf16_bits on
 * each lane (round to nearest even; a NaN keeps its high half with the quiet
 * bit set), without a branch: the NaN lanes are a mask. */
static inline __m512i bf16_lanes(__m512 x)
{
    const __m512i u = _mm512_castps_si512(x);
    const __m512i hi = _mm512_srli_epi32(u, 16);
    const __m512i odd = _mm512_and_si512(hi, _mm512_set1_epi32(1));
    const __m512i r = _mm512_srli_epi32(
        _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), odd), 16);
    const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    return _mm512_mask_or_epi32(r, nan, hi, _mm512_set1_epi32(0x40));
}

void kva__cpu_merge_row_bf16_avx512(int32_t Dv, int32_t num_parts, const unsigned char *row0,
                                    size_t part_bytes, const float *wts, void *dst)
{
    unsigned char *d = dst;
    for (int32_t c = 0; c < Dv; c += 32) {
        /* Columns [c, c + 32), or the last Dv - c of them. */
        const __mmask32 m = Dv - c >= 32 ? ~(__mmask32)0 : ((__mmask32)1 << (Dv - c)) - 1;
        __m512 lo = _mm512_setzero_ps(), hi = _mm512_setzero_ps();
        const unsigned char *r = row0 + (size_t)c * 2;
        for (int32_t p = 0; p < num_parts; p++, r += part_bytes) {
            if (wts[p] == 0.0f)
                continue; /* a part of weight 0 is not read */
            const __m512 w = _mm512_set1_ps(wts[p]);
            const __m512i x = _mm512_maskz_loadu_epi16(m, r);
            lo = _mm512_fmadd_ps(w, widen_lo(x), lo);
            hi = _mm512_fmadd_ps(w, widen_hi(x), hi);
        }
        const __m512i out = _mm512_packus_epi32(bf16_lanes(lo), bf16_lanes(hi));
        _mm512_mask_storeu_epi16(d + (size_t)c * 2, m, out);
    }
}

#endif
