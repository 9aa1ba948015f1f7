/*
 * attn_v3_avx512.h - the vector pieces of the AVX-512 decode kernels v3/v4
 * (attn_v3_avx512.c, which describes the scheme): exp16, the 16x16
 * transpose-and-add, the row formats and their in-register conversion
 * (ld16), the per-item fold info, the spread prefetch, and the score loops
 * (fp32 path and the AVX512_BF16 dot products of v4). Included only by
 * attn_v3_avx512.c, compiled with the AVX-512 flags.
 */
#ifndef KVA_ATTN_V3_AVX512_H
#define KVA_ATTN_V3_AVX512_H

#include "cpu_attn.h"
#include "cpu_fold.h"

#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define AI static inline __attribute__((always_inline))

/* e^x in fp32 for x <= 0 (the softmax's only inputs): x = n ln2 + r with
 * |r| <= ln2/2 (two-part ln2), e^r by its degree-7 Taylor polynomial (error
 * below 1e-8 relative, about one ulp in total), times 2^n by vscalefps, which
 * flushes to 0 below the smallest subnormal; x = -inf gives 0, NaN stays NaN. */
AI __m512 exp16(__m512 x)
{
    const __m512 xc = _mm512_max_ps(x, _mm512_set1_ps(-110.0f)); /* NaN -> -110, fixed below */
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(xc, _mm512_set1_ps(1.44269504089f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), xc);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.0f / 5040.0f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    const __m512 y = _mm512_scalef_ps(p, n);
    return _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), x);
}

/* Sums of 16 vectors: lane i of the result is the sum of the lanes of v[i]. */
AI __m512 hsum16(const __m512 v[16])
{
    __m512 s[8], t[4], u[2];
    for (int i = 0; i < 8; i++)
        s[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[i], v[i + 8], 0x44),
                             _mm512_shuffle_f32x4(v[i], v[i + 8], 0xee));
    /* s[i]: 128-bit blocks 0,1 hold v[i] (8 partial sums), blocks 2,3 v[i+8]. */
    for (int i = 0; i < 4; i++)
        t[i] = _mm512_add_ps(_mm512_shuffle_f32x4(s[i], s[i + 4], 0x88),
                             _mm512_shuffle_f32x4(s[i], s[i + 4], 0xdd));
    /* t[i]: blocks hold 4 partial sums of v[i], v[i+8], v[i+4], v[i+12]. */
    for (int i = 0; i < 2; i++)
        u[i] =
            _mm512_add_ps(_mm512_unpacklo_ps(t[i], t[i + 2]), _mm512_unpackhi_ps(t[i], t[i + 2]));
    const __m512 w = _mm512_add_ps(_mm512_unpacklo_ps(u[0], u[1]), _mm512_unpackhi_ps(u[0], u[1]));
    /* w: block k lane j is the sum of t[j]'s block k: vectors 0-3, 8-11, 4-7, 12-15. */
    return _mm512_shuffle_f32x4(w, w, 0xd8);
}

/* Row formats: FMT_* (cpu_fold.h); ld16 and load_chunk are what read them. */

/* 16 elements [i, i+16) of a K/V row of format fmt as fp32 (see above: int8
 * without scale/offset, fp8 as value / 2^8); lanes outside m are 0 (only the
 * masked lanes are read). This and load_chunk are the only places that know
 * the row format. */
AI __m512 ld16(const void *row, int32_t i, const int fmt, __mmask16 m)
{
    if (fmt == FMT_F32)
        return _mm512_maskz_loadu_ps(m, (const float *)row + i);
    if (fmt >= FMT_I8) {
        const unsigned char *p = (const unsigned char *)row + i;
        const __m128i b =
            m == 0xffff ? _mm_loadu_si128((const __m128i *)p) : _mm_maskz_loadu_epi8(m, p);
        if (fmt < FMT_FP8)
            return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b));
        /* e4m3 s.eeee.mmm -> f16 s.0eeee.mmm0000000: the same value / 2^8,
         * subnormals included (f16 has 10 mantissa bits and a 2^8 wider
         * exponent range). Sign-extended and shifted by 7, a negative code
         * also sets bit 14, which the mask clears. */
        __m256i h = _mm256_and_si256(_mm256_slli_epi16(_mm256_cvtepi8_epi16(b), 7),
                                     _mm256_set1_epi16((short)0xbf80));
        if (fmt == FMT_FP8N) /* |code| 0x7f is NaN (1.875 as built) */
            h = _mm256_mask_mov_epi16(
                h,
                _mm256_cmpeq_epi16_mask(_mm256_and_si256(h, _mm256_set1_epi16(0x7fff)),
                                        _mm256_set1_epi16(0x3f80)),
                _mm256_set1_epi16(0x7e00));
        return _mm512_cvtph_ps(h);
    }
    const __m256i h = m == 0xffff ? _mm256_loadu_si256((const __m256i *)((const uint16_t *)row + i))
                                  : _mm256_maskz_loadu_epi16(m, (const uint16_t *)row + i);
    if (fmt == FMT_F16)
        return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* What the loops need besides the rows for the quantized formats, set per
 * item (run_item) and per chunk (load_chunk). */
typedef struct fold_info {
    int kf, vf;                   /* row formats of K and V */
    const float *koff;            /* [D] key offsets of the item's kv head (FMT_I8 keys) */
    const float *voff;            /* [Dv] value offsets (FMT_I8 values) */
    float tok[KVA_CPU_KEY_CHUNK]; /* per-token key scales of the chunk (FMT_I8T) */
    /* The chunk PF_DIST ahead, prefetched key by key inside the scores loop
     * of the current chunk (pf_key); NULL once done. */
    const kva__cpu_chunk_rows *pf;
    int32_t pf_n;
    size_t pf_kbytes, pf_vbytes;
    size_t kesz; /* bytes of a K element as stored (key_at's L1 prefetch) */
    int kq;      /* int8 keys scored by VNNI dot products against s->qi (variant 4) */
    /* Key order of the loops (key_at): 1 where a kv head's rows are strided
     * inside a block (NHD cache with Hkv > 1, rows read in place). */
    int ko;
} fold_info;

/*
 * The key the loops visit at step i of keys [ta, te): i itself, or where ko
 * is set, the keys of each group of 4 (aligned, inside [ta, te)) in the order
 * 0, 2, 1, 3, with the row two steps ahead prefetched into L1 (pf_l1). In an
 * NHD cache a kv head's rows are Hkv * D elements apart; read in order, the
 * core's stride prefetcher locks on that stride and (the explanation that
 * fits the measurements; the VM has no counters to show it) at the end of
 * each block (16 rows at B 16) goes on fetching at that stride, lines of
 * other blocks that nobody reads: DRAM traffic and miss buffers spent for
 * nothing. No two consecutive steps of 0, 2, 1, 3, 4, 6, 5, 7 have the same
 * stride, so the prefetcher does not lock on; the L1 prefetch of the row two
 * steps ahead (from L2, where pf_key_k/v put it) does what it did for the
 * current chunk. Measured: docs/performance.md ("NHD key order").
 */
AI int32_t key_at(int32_t i, int ko, int32_t ta, int32_t te)
{
    const int32_t g = i & ~3;
    if (!ko || g < ta || g + 4 > te)
        return i;
    return i ^ (((i ^ (i >> 1)) & 1) * 3);
}

/* L1 prefetch of `bytes` bytes from p (a row of the current chunk). */
AI void pf_l1(const void *p, size_t bytes)
{
    for (size_t b = 0; b < bytes; b += 64)
        _mm_prefetch((const char *)p + b, _MM_HINT_T0);
}

/* Prefetches (into L2) the K row (pf_key_k) or the V row (pf_key_v) of key
 * `key` of the chunk fi->pf. The K rows are requested from the scores loop
 * and the V rows from the P.V loop of the chunk PF_DIST before: spread over
 * the compute, 4 + 4 lines per key (D = 128, bf16) keep the misses of later
 * chunks in flight while this one computes, whereas a burst of a whole
 * chunk's 256 lines fills the miss buffers and stalls the core until they
 * drain (1 thread, 8 x 4096 bf16: 17.2 -> 10.6 ms together with reading the
 * rows in place instead of copying them first). */
AI void pf_key_k(const fold_info *fi, int32_t key)
{
    if (!fi || !fi->pf || key >= fi->pf_n)
        return;
    const char *k = (const char *)fi->pf->k[key];
    for (size_t b = 0; b < fi->pf_kbytes; b += 64)
        _mm_prefetch(k + b, _MM_HINT_T2);
}

AI void pf_key_v(const fold_info *fi, int32_t key)
{
    if (!fi || !fi->pf || key >= fi->pf_n)
        return;
    const char *v = (const char *)fi->pf->v[key];
    for (size_t b = 0; b < fi->pf_vbytes; b += 64)
        _mm_prefetch(v + b, _MM_HINT_T2);
}

/* Lanes of the last 16-element vector of a row of n elements (n a multiple of 8). */
#define TAIL16(n) ((n) % 16 ? (__mmask16)0x00ff : (__mmask16)0xffff)
#define NVEC16(n) (((n) + 15) / 16)

/* The scores of NB heads from the partial sums in s->vs ([2 halves, 8 heads,
 * 16 keys, 16 lanes]): hsum16 per 16 keys, the per-token key scale applied
 * for FMT_I8T (score = s_tok * (q . k)), stored into s->pm rows m0... */
AI void scores_finish(kva__cpu_scratch *s, int32_t m0, const int NB, int32_t nk, const int kd,
                      const fold_info *fi)
{
    const float *vs = s->vs;
    for (int32_t half = 0; half * 16 < nk; half++)
        for (int b = 0; b < NB; b++) {
            __m512 v[16];
            for (int t = 0; t < 16; t++)
                v[t] = _mm512_loadu_ps(vs + (half * 128 + b * 16 + t) * 16);
            __m512 sc = hsum16(v);
            if (kd == FMT_I8T)
                sc = _mm512_mul_ps(sc, _mm512_loadu_ps(fi->tok + half * 16));
            _mm512_storeu_ps(s->pm + (size_t)(m0 + b) * KVA_CPU_KEY_CHUNK + half * 16, sc);
        }
}

/*
 * Scores of the NB (<= 8) rows m0.. (q tile rows of one query row) against
 * the chunk's nk keys, into s->pm [m, KEY_CHUNK]. The head dims are taken in
 * parts of PW vectors (64 dims for up to 4 heads, 32 for more): the part of
 * q of the NB heads stays in registers (16 zmm) while the keys stream
 * through, each key's part loaded and converted once for the NB heads. The
 * per-(head, key) 16-lane partial sums add up over the parts in s->vs
 * [2 halves of the chunk, 8 heads, 16 keys, 16 lanes]; hsum16 turns 16 keys of a head into one
 * vector of scores.
 */
AI void scores_nb(kva__cpu_scratch *s, int32_t m0, const int NB, int32_t nk, const int32_t D,
                  const int kd, const fold_info *fi, const int ko)
{
    const int NV = NVEC16(D);
    const __mmask16 tail = TAIL16(D);
    const int PW = NB <= 4 ? 4 : 2;
    float *vs = s->vs;
    const int32_t nkr = (nk + 15) & ~15; /* keys rounded up to whole vectors of scores */
    for (int j0 = 0; j0 < NV; j0 += PW) {
        const int nj = NV - j0 < PW ? NV - j0 : PW;
        __m512 qr[8][4];
        for (int b = 0; b < NB; b++)
            for (int j = 0; j < nj; j++)
                qr[b][j] = _mm512_maskz_loadu_ps(j0 + j == NV - 1 ? tail : 0xffff,
                                                 s->q + (size_t)(m0 + b) * D + 16 * (j0 + j));
        for (int32_t i = 0; i < nkr; i++) {
            const int32_t key = key_at(i, ko, 0, nkr);
            if (j0 == 0)
                pf_key_k(fi, i);
            if (ko && i + 2 < nk)
                pf_l1((const char *)s->kp[key_at(i + 2, 1, 0, nkr)] + 16 * j0 * fi->kesz,
                      (size_t)16 * nj * fi->kesz);
            if (key >= nk) {
                if (j0 == 0)
                    for (int b = 0; b < NB; b++)
                        _mm512_storeu_ps(vs + ((key >> 4) * 128 + b * 16 + (key & 15)) * 16,
                                         _mm512_setzero_ps());
                continue;
            }
            __m512 kr[4];
            for (int j = 0; j < nj; j++) {
                const __mmask16 mj = j0 + j == NV - 1 ? tail : 0xffff;
                kr[j] = ld16(s->kp[key], 16 * (j0 + j), kd, mj);
                /* (k - o): q already holds q * s (no cancellation-prone expansion). */
                if (kd == FMT_I8)
                    kr[j] =
                        _mm512_sub_ps(kr[j], _mm512_maskz_loadu_ps(mj, fi->koff + 16 * (j0 + j)));
            }
            for (int b = 0; b < NB; b++) {
                __m512 a0 = _mm512_mul_ps(qr[b][0], kr[0]);
                for (int j = 1; j < nj; j++)
                    a0 = _mm512_fmadd_ps(qr[b][j], kr[j], a0);
                float *dst = vs + ((key >> 4) * 128 + b * 16 + (key & 15)) * 16;
                _mm512_storeu_ps(dst, j0 == 0 ? a0 : _mm512_add_ps(_mm512_loadu_ps(dst), a0));
            }
        }
    }
    scores_finish(s, m0, NB, nk, kd, fi);
}

/*
 * scores_nb for D = 128 in one pass over the keys: each K row is loaded and
 * converted once (8 zmm) for the NB (<= 4) heads; q of the first two heads
 * stays in registers (16 zmm), that of heads 2 and 3 is read from s->q (L1)
 * as FMA memory operands, so each key costs 8 conversions, 8 * NB FMAs, NB
 * stores and no reload of partial sums. Per head the two 64-dim halves are
 * summed in the order scores_nb's two passes use (mul + 3 FMAs each, then
 * the halves added), so the scores are bitwise those of scores_nb.
 * (scores_nb at D = 128 and NB = 4: 2 passes, each key's 4 K vectors
 * converted per pass and the partial sums stored, reloaded and added.)
 */
AI void scores_nb_d128(kva__cpu_scratch *s, int32_t m0, const int NB, int32_t nk, const int kd,
                       const fold_info *fi, const int ko)
{
    const int NBR = NB < 2 ? NB : 2; /* heads with q in registers */
    float *vs = s->vs;
    const float *q = s->q + (size_t)m0 * 128;
    const int32_t nkr = (nk + 15) & ~15;
    __m512 qr[2][8];
    for (int b = 0; b < NBR; b++)
        for (int j = 0; j < 8; j++)
            qr[b][j] = _mm512_loadu_ps(q + (size_t)b * 128 + 16 * j);
    for (int32_t i = 0; i < nkr; i++) {
        const int32_t key = key_at(i, ko, 0, nkr);
        pf_key_k(fi, i);
        if (ko && i + 2 < nk)
            pf_l1(s->kp[key_at(i + 2, 1, 0, nkr)], (size_t)128 * fi->kesz);
        float *dst0 = vs + ((key >> 4) * 128 + (key & 15)) * 16; /* head b: + b * 256 */
        if (key >= nk) {
            for (int b = 0; b < NB; b++)
                _mm512_storeu_ps(dst0 + b * 256, _mm512_setzero_ps());
            continue;
        }
        __m512 kr[8];
        for (int j = 0; j < 8; j++) {
            kr[j] = ld16(s->kp[key], 16 * j, kd, 0xffff);
            if (kd == FMT_I8)
                kr[j] = _mm512_sub_ps(kr[j], _mm512_loadu_ps(fi->koff + 16 * j));
        }
        for (int b = 0; b < NB; b++) {
            __m512 qv[8];
            for (int j = 0; j < 8; j++)
                qv[j] =
                    b < NBR ? qr[b < 2 ? b : 0][j] : _mm512_loadu_ps(q + (size_t)b * 128 + 16 * j);
            __m512 lo = _mm512_mul_ps(qv[0], kr[0]), hi = _mm512_mul_ps(qv[4], kr[4]);
            for (int j = 1; j < 4; j++) {
                lo = _mm512_fmadd_ps(qv[j], kr[j], lo);
                hi = _mm512_fmadd_ps(qv[4 + j], kr[4 + j], hi);
            }
            _mm512_storeu_ps(dst0 + b * 256, _mm512_add_ps(lo, hi));
        }
    }
    scores_finish(s, m0, NB, nk, kd, fi);
}

/* scores_nb with the head count nb (1..8) as a constant; D = 128 takes the
 * one-pass loop (scores_nb_d128, same scores). */
AI void scores_rows(kva__cpu_scratch *s, int32_t m0, int32_t nb, int32_t nk, const int32_t D,
                    const int kd, const fold_info *fi, const int ko)
{
    if (nb > 4) { /* two passes of 4 heads with q in registers beat one of 8 */
        if (D == 128)
            scores_nb_d128(s, m0, 4, nk, kd, fi, ko);
        else
            scores_nb(s, m0, 4, nk, D, kd, fi, ko);
        m0 += 4;
        nb -= 4;
    }
    switch (nb) {
#define NB_CASE(n)                                                                                 \
    case n:                                                                                        \
        if (D == 128)                                                                              \
            scores_nb_d128(s, m0, n, nk, kd, fi, ko);                                              \
        else                                                                                       \
            scores_nb(s, m0, n, nk, D, kd, fi, ko);                                                \
        break;
        NB_CASE(1)
        NB_CASE(2)
        NB_CASE(3)
        NB_CASE(4)
        NB_CASE(5)
        NB_CASE(6)
        NB_CASE(7)
        NB_CASE(8)
#undef NB_CASE
    default:
        break;
    }
}

/*
 * Int8 key scores by integer dot products (variant 4 on CPUs with
 * AVX512_VNNI; FMT_I8, FMT_I8S and FMT_I8T keys). A query row q' (softmax
 * and key scales folded) is held as a 23-bit integer q' ~ step * qn, |qn| <=
 * 2^22 (kq_prepare below), written as 3 signed base-256 digits qn = 2^16 a +
 * 2^8 b + c; a key row's codes k are biased to unsigned bytes k + 128. Keys
 * are the lanes: 16 rows are transposed by dwords (4 dims per lane, s->kt),
 * and vpdpbusd adds per lane the 4 products of (k + 128) with a digit's 4
 * dims, broadcast from qi. The digit sums are exact int32 (|.| <= 2^23);
 * minus 128 x the digit's sum they are exact sums over d of digit * k, and
 *   score = step * (2^16 A + 2^8 B + C - sum_d qn_d o_d)
 * (the key offsets' term qk[m][1], 0 for symmetric keys) is exact but for
 * qn's rounding (relative 2^-23 of the row's largest |q'|) and a few fp32
 * roundings, like the fp32 path. Per key and head: 3 x D/64 vpdpbusd
 * against D/16 fp32 FMAs plus the conversion of K and the 16x16 reductions.
 */

/* Transposes 16 rows of 16 dwords: r[j] lane t = row t's dword j. */
AI void transpose16_epi32(__m512i r[16])
{
    __m512i t[16], u[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    /* u[4i + k]: 128-bit block L holds rows 4i..4i+3 of dword 4L + k. */
    for (int i = 0; i < 4; i++) {
        u[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    for (int k = 0; k < 4; k++) {
        const __m512i w0 = _mm512_shuffle_i32x4(u[k], u[4 + k], 0x88);
        const __m512i w1 = _mm512_shuffle_i32x4(u[k], u[4 + k], 0xdd);
        const __m512i w2 = _mm512_shuffle_i32x4(u[8 + k], u[12 + k], 0x88);
        const __m512i w3 = _mm512_shuffle_i32x4(u[8 + k], u[12 + k], 0xdd);
        r[k] = _mm512_shuffle_i32x4(w0, w2, 0x88);
        r[8 + k] = _mm512_shuffle_i32x4(w0, w2, 0xdd);
        r[4 + k] = _mm512_shuffle_i32x4(w1, w3, 0x88);
        r[12 + k] = _mm512_shuffle_i32x4(w1, w3, 0xdd);
    }
}

#if defined(__GNUC__)
#define KVA_TARGET_VNNI __attribute__((target("avx512vnni"), noinline))

/* Scores of NB (1..4) rows m0.. for 16 keys transposed in s->kt (nw dwords
 * per row) into s->pm [m, KEY_CHUNK] at key offset k0. */
AI __attribute__((target("avx512vnni"))) void i8dot_rows(kva__cpu_scratch *s, int32_t m0,
                                                         const int NB, int32_t nw, int32_t D,
                                                         int32_t k0, const int kd,
                                                         const fold_info *fi)
{
    const int32_t *restrict kt = s->kt;
    const int8_t *restrict q0 = s->qi + (size_t)m0 * 3 * D;
    const size_t rs = (size_t)3 * D; /* bytes between two rows' digits */
    __m512i a0 = _mm512_setzero_si512(), b0 = a0, c0 = a0, a1 = a0, b1 = a0, c1 = a0;
    __m512i a2 = a0, b2 = a0, c2 = a0, a3 = a0, b3 = a0, c3 = a0;
    /* acc += dpbusd(t, broadcast dword at p): inline asm, because GCC 12
     * copies the accumulators of the intrinsic every iteration. */
#define I8DOT_BCAST_ACC(acc, row, part)                                                            \
    __asm__("vpdpbusd %2%{1to16%}, %1, %0"                                                         \
            : "+v"(acc)                                                                            \
            : "v"(t), "m"(*(const int32_t *)(q0 + (row)*rs + (part)*D + 4 * j)))
    for (int32_t j = 0; j < nw; j++) {
        const __m512i t = _mm512_load_si512(kt + 16 * j);
        I8DOT_BCAST_ACC(a0, 0, 0);
        I8DOT_BCAST_ACC(b0, 0, 1);
        I8DOT_BCAST_ACC(c0, 0, 2);
        if (NB > 1) {
            I8DOT_BCAST_ACC(a1, 1, 0);
            I8DOT_BCAST_ACC(b1, 1, 1);
            I8DOT_BCAST_ACC(c1, 1, 2);
        }
        if (NB > 2) {
            I8DOT_BCAST_ACC(a2, 2, 0);
            I8DOT_BCAST_ACC(b2, 2, 1);
            I8DOT_BCAST_ACC(c2, 2, 2);
        }
        if (NB > 3) {
            I8DOT_BCAST_ACC(a3, 3, 0);
            I8DOT_BCAST_ACC(b3, 3, 1);
            I8DOT_BCAST_ACC(c3, 3, 2);
        }
    }
#undef I8DOT_BCAST_ACC
    const __m512i acc[4][3] = {{a0, b0, c0}, {a1, b1, c1}, {a2, b2, c2}, {a3, b3, c3}};
    for (int b = 0; b < NB; b++) {
        const int32_t m = m0 + b;
        const int32_t *qc = s->qc + (size_t)m * 4;
        const __m512 hi = _mm512_cvtepi32_ps(_mm512_sub_epi32(acc[b][0], _mm512_set1_epi32(qc[0])));
        const __m512 mid =
            _mm512_cvtepi32_ps(_mm512_sub_epi32(acc[b][1], _mm512_set1_epi32(qc[1])));
        const __m512 lo = _mm512_cvtepi32_ps(_mm512_sub_epi32(acc[b][2], _mm512_set1_epi32(qc[2])));
        __m512 x = _mm512_fmadd_ps(mid, _mm512_set1_ps(256.0f),
                                   _mm512_sub_ps(lo, _mm512_set1_ps(s->qk[2 * m + 1])));
        x = _mm512_fmadd_ps(hi, _mm512_set1_ps(65536.0f), x);
        x = _mm512_mul_ps(x, _mm512_set1_ps(s->qk[2 * m]));
        if (kd == FMT_I8T)
            x = _mm512_mul_ps(x, _mm512_loadu_ps(fi->tok + k0));
        _mm512_storeu_ps(s->pm + (size_t)m * KVA_CPU_KEY_CHUNK + k0, x);
    }
}

/* Scores of the nb rows m0.. (one query row's heads) against the chunk's nk
 * int8 keys s->kp (D dims, D a multiple of 4), as described above; the
 * chunk PF_DIST ahead has its K rows prefetched. */
static KVA_TARGET_VNNI void scores_rows_i8dot(kva__cpu_scratch *s, int32_t m0, int32_t nb,
                                              int32_t nk, int32_t D, const fold_info *fi)
{
    const int32_t NW = D / 4;
    const __m512i bias = _mm512_set1_epi8((char)0x80);
    for (int32_t k0 = 0; k0 < nk; k0 += 16) {
        /* The next chunk's K rows, all of them by the last 16 keys. */
        for (int32_t t = k0; t < (k0 + 16 < nk ? k0 + 16 : KVA_CPU_KEY_CHUNK); t++)
            pf_key_k(fi, t);
        for (int32_t j0 = 0; j0 < NW; j0 += 16) {
            const int32_t nw = NW - j0 < 16 ? NW - j0 : 16;
            const __mmask16 lm = nw == 16 ? (__mmask16)0xffff : (__mmask16)((1u << nw) - 1u);
            __m512i r[16];
            for (int t = 0; t < 16; t++)
                r[t] = _mm512_xor_si512(
                    _mm512_maskz_loadu_epi32(lm, (const int32_t *)s->kp[k0 + t] + j0), bias);
            transpose16_epi32(r);
            int32_t *restrict kt = s->kt + 16 * j0;
            for (int32_t j = 0; j < nw; j++)
                _mm512_store_si512(kt + 16 * j, r[j]);
        }
        int32_t m = m0;
        const int32_t m1 = m0 + nb;
        const int kd = fi->kf;
        for (; m + 4 <= m1; m += 4)
            if (kd == FMT_I8T)
                i8dot_rows(s, m, 4, NW, D, k0, FMT_I8T, fi);
            else
                i8dot_rows(s, m, 4, NW, D, k0, FMT_I8, fi);
        for (; m < m1; m++)
            if (kd == FMT_I8T)
                i8dot_rows(s, m, 1, NW, D, k0, FMT_I8T, fi);
            else
                i8dot_rows(s, m, 1, NW, D, k0, FMT_I8, fi);
    }
}
#endif

#if defined(__AVX512BF16__)
/*
 * scores_rows for bf16 q and bf16 K (variant 4): vdpbf16ps multiplies pairs
 * of bf16 values exactly (8-bit significands: the products fit fp32) and adds
 * them in fp32, so the scores carry only fp32 summation error like the fp32
 * path, at half the instructions and with no conversion of K. q is read
 * unscaled from the input (q_row: [nb, D] bf16 of this query row's heads)
 * and the softmax scale multiplies the scores. Inputs that are bf16
 * subnormals count as 0 (the instruction's DAZ), below any tolerance.
 */
AI void scores_bf16_nb(const kva__cpu_run *run, kva__cpu_scratch *s, const uint16_t *q_row,
                       int32_t m0, const int NB, int32_t nk, const int32_t D, const fold_info *fi,
                       const int ko)
{
    const int NV = D / 32;
    const __m512 scale = _mm512_set1_ps(run->plan->d.scale);
    float *vs = s->vs;
    /* q of the NB heads in registers for the whole chunk (NB = 4, D = 128:
     * 16 zmm), so each key costs its 4 K loads and NB * NV dot products. */
    __m512bh qr[8][8];
    for (int b = 0; b < NB; b++)
        for (int j = 0; j < NV; j++)
            qr[b][j] = (__m512bh)_mm512_loadu_si512(q_row + (size_t)b * D + 32 * j);
    for (int32_t half = 0; half * 16 < nk; half++) {
        for (int32_t i = 0; i < 16; i++) {
            const int32_t t = key_at(i, ko, 0, 16), key = half * 16 + t;
            pf_key_k(fi, half * 16 + i);
            if (ko && half * 16 + i + 2 < nk)
                pf_l1(s->kp[key_at(half * 16 + i + 2, 1, 0, 32)], (size_t)D * 2);
            if (key >= nk) {
                for (int b = 0; b < NB; b++)
                    _mm512_storeu_ps(vs + (b * 16 + t) * 16, _mm512_setzero_ps());
                continue;
            }
            __m512bh kr[8];
            const uint16_t *kp = (const uint16_t *)s->kp[key];
            for (int j = 0; j < NV; j++)
                kr[j] = (__m512bh)_mm512_loadu_si512(kp + 32 * j);
            for (int b = 0; b < NB; b++) {
                __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
                for (int j = 0; j + 1 < NV; j += 2) {
                    a0 = _mm512_dpbf16_ps(a0, qr[b][j], kr[j]);
                    a1 = _mm512_dpbf16_ps(a1, qr[b][j + 1], kr[j + 1]);
                }
                if (NV % 2)
                    a0 = _mm512_dpbf16_ps(a0, qr[b][NV - 1], kr[NV - 1]);
                _mm512_storeu_ps(vs + (b * 16 + t) * 16, _mm512_add_ps(a0, a1));
            }
        }
        for (int b = 0; b < NB; b++) {
            __m512 v[16];
            for (int t = 0; t < 16; t++)
                v[t] = _mm512_loadu_ps(vs + (b * 16 + t) * 16);
            _mm512_storeu_ps(s->pm + (size_t)(m0 + b) * KVA_CPU_KEY_CHUNK + half * 16,
                             _mm512_mul_ps(hsum16(v), scale));
        }
    }
}

/* scores_bf16_nb with the head count nb (1..8) as a constant. */
AI void scores_rows_bf16(const kva__cpu_run *run, kva__cpu_scratch *s, const uint16_t *q_row,
                         int32_t m0, int32_t nb, int32_t nk, const int32_t D, const fold_info *fi,
                         const int ko)
{
    if (nb > 4) { /* two passes of 4 heads with q in registers (8 would spill) */
        scores_bf16_nb(run, s, q_row, m0, 4, nk, D, fi, ko);
        q_row += (size_t)4 * D;
        m0 += 4;
        nb -= 4;
    }
    switch (nb) {
#define NB_CASE(n)                                                                                 \
    case n:                                                                                        \
        scores_bf16_nb(run, s, q_row, m0, n, nk, D, fi, ko);                                       \
        break;
        NB_CASE(1)
        NB_CASE(2)
        NB_CASE(3)
        NB_CASE(4)
        NB_CASE(5)
        NB_CASE(6)
        NB_CASE(7)
        NB_CASE(8)
#undef NB_CASE
    default:
        break;
    }
}
#endif

#endif /* KVA_ATTN_V3_AVX512_H */
