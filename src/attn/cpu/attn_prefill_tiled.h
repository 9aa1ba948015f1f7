/*
 * attn_prefill_tiled.h - body of the tiled prefill kernels, compiled once per
 * vector ISA (attn_v4_prefill_avx2.c, attn_v5_prefill_avx512.c). Not a
 * normal header: each includer defines the vector primitives below first,
 * then includes this file once; everything in it is static.
 *
 * One call computes one work item (the contract of attn_v1.c): M = nq * nh
 * attention rows (nq query rows x nh heads of one GQA group, row m = ii * nh
 * + hh) against keys [k0, k1) of one request and kv head. Mp is M rounded up
 * to whole vectors. The item is computed as two register-blocked GEMMs per
 * tile of PF_KT keys, with the attention rows in the vector lanes:
 *
 *   QT [D, Mp]       the query tile, transposed once per item, scale folded in
 *   ST [KT, Mp]      = K_tile [KT, D] x QT: scores, then probabilities in place
 *   OT [Dv, Mp]     += V_tile^T [Dv, KT] x ST: unnormalized outputs
 *
 * Both GEMMs broadcast scalars of K or V from their natural rows (paged cache
 * rows, or rows converted once per tile from f16/bf16 and shared by all
 * heads of the group), so no K/V tile is ever transposed, and the online
 * softmax is purely vertical: the running max, the sum and the rescale of a
 * row are lanes of vectors, with no horizontal reduction. Tiles no row can
 * see are skipped before their rows are touched; only tiles some row sees in
 * part (the causal diagonal, window edges, split ends) mask element-wise.
 *
 * Exactness (tests/test_cpu_nonfinite.c): masked scores become -inf before
 * the max, so a masked key's NaN never reaches a row; a masked key gets
 * weight exactly 0, and when a partially visible tile holds a non-finite
 * value (0 * inf = NaN), its P x V runs per row over the row's own keys.
 * Rows whose scores so far are all -inf stay empty, NaN rows stay NaN, as in
 * attn_v1.c.
 *
 * The includer defines:
 *   PF_FN            the kernel's name
 *   PF_VL            floats per vector
 *   pf_v             the vector type
 *   pf_load(p) pf_store(p, x) pf_set1(f) pf_zero() pf_fma(a, b, c) = a*b + c
 *   pf_add pf_sub pf_mul
 *   pf_maxskip(x, m) per lane: x > m ? x : m, and m when x is NaN
 *   pf_mask_keys(x, j, lo, hi) lanes with !(lo[l] <= j < hi[l]) set to -inf
 *   pf_exp(x)        e^x for x <= 0, -inf -> 0, NaN -> NaN
 *   pf_tanh(x)       tanh
 *   pf_alibi(x, slope, j, pos) x + slope[l] * (float)(j - pos[l])
 *   PF_S_MR, PF_S_NV  score micro-kernel block: keys x vectors of rows
 *   PF_O_MR, PF_O_NV  output micro-kernel block: Dv elements x vectors of rows
 */
#include "cpu_attn.h"

#include <immintrin.h>
#include <math.h>

#define PF_INLINE static inline __attribute__((always_inline))

/* ---- K/V rows of a tile ---- */

/* Byte pointers of the K and V rows of keys c0 .. c0+n-1 (n <= KVA_CPU_TILE_KEYS). */
static void pf_locate(const kva__cpu_run *run, int32_t r, int32_t kvh, int32_t c0, int32_t n,
                      const unsigned char **kr, const unsigned char **vr)
{
    const kva_plan *plan = run->plan;
    const int32_t D = plan->d.head_dim, Dv = plan->d.head_dim_v;
    const size_t esz = kva_dtype_size(run->kv_dt);
    if (run->cache) {
        const kva_cache_desc *cd = &run->cache->desc;
        const int32_t B = cd->block_size;
        const int32_t *bt = plan->block_table + (int64_t)r * plan->d.block_table_stride;
        const size_t rows = cd->layout == KVA_LAYOUT_NHD ? (size_t)cd->num_kv_heads : 1;
        const size_t kstep = rows * D * esz, vstep = rows * Dv * esz;
        const unsigned char *kbase = run->cache->k, *vbase = run->cache->v;
        int32_t j = c0;
        while (j < c0 + n) {
            const int32_t blk = bt[j / B], off = j % B;
            const int32_t cnt = B - off < c0 + n - j ? B - off : c0 + n - j;
            const unsigned char *kp = kbase + (size_t)kva__cache_row(cd, blk, off, kvh, D) * esz;
            const unsigned char *vp = vbase + (size_t)kva__cache_row(cd, blk, off, kvh, Dv) * esz;
            for (int32_t t = 0; t < cnt; t++) {
                kr[j - c0 + t] = kp + (size_t)t * kstep;
                vr[j - c0 + t] = vp + (size_t)t * vstep;
            }
            j += cnt;
        }
    } else {
        const int64_t Hkv = plan->d.num_kv_heads, row0 = plan->kv_start[r] + c0;
        const unsigned char *kb = run->k, *vb = run->v;
        for (int32_t t = 0; t < n; t++) {
            kr[t] = kb + (size_t)(((row0 + t) * Hkv + kvh) * D) * esz;
            vr[t] = vb + (size_t)(((row0 + t) * Hkv + kvh) * Dv) * esz;
        }
    }
}

static void pf_prefetch(const unsigned char *const *kr, const unsigned char *const *vr, int32_t n,
                        size_t kbytes, size_t vbytes)
{
    for (int32_t t = 0; t < n; t++) {
        for (size_t b = 0; b < kbytes; b += 64)
            _mm_prefetch((const char *)kr[t] + b, _MM_HINT_T1);
        for (size_t b = 0; b < vbytes; b += 64)
            _mm_prefetch((const char *)vr[t] + b, _MM_HINT_T1);
    }
}

/* n (multiple of 8) f16/bf16 values -> fp32, 8 at a time (exact). */
static void pf_convert(float *restrict dst, const void *restrict src, kva_dtype dt, int32_t n)
{
    const uint16_t *s = src;
    if (dt == KVA_DTYPE_BF16) {
        for (int32_t i = 0; i < n; i += 8) {
            __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(s + i)));
            _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)));
        }
    } else {
        for (int32_t i = 0; i < n; i += 8)
            _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + i))));
    }
}

/* Points kp/vp [n] at fp32 rows: the cache's own rows for f32, else rows
 * converted into kb [n, D] / vb [n, Dv] once for the whole group (keys only
 * when `keys`: the bf16 score path reads K as it is). */
static void pf_load_tile(const kva__cpu_run *run, const unsigned char *const *kr,
                         const unsigned char *const *vr, int32_t n, int keys, kva__cpu_tile *t)
{
    const int32_t D = run->plan->d.head_dim, Dv = run->plan->d.head_dim_v;
    if (run->kv_dt == KVA_DTYPE_F32) {
        for (int32_t j = 0; j < n; j++) {
            t->kp[j] = (const float *)kr[j];
            t->vp[j] = (const float *)vr[j];
        }
        return;
    }
    for (int32_t j = 0; j < n; j++) {
        if (keys) {
            pf_convert(t->kb + (size_t)j * D, kr[j], run->kv_dt, D);
            t->kp[j] = t->kb + (size_t)j * D;
        }
        pf_convert(t->vb + (size_t)j * Dv, vr[j], run->kv_dt, Dv);
        t->vp[j] = t->vb + (size_t)j * Dv;
    }
}

/* ---- micro-kernels ---- */

/*
 * ST[r, 0 .. NV*VL) = sum_d K[r][d] * QT[d, 0 .. NV*VL) for MR keys r.
 *   kp: [MR] fp32 key rows of D; qt: QT + column offset, rows ldq apart;
 *   st: ST + row/column offset, rows lds apart.
 */
PF_INLINE void pf_mk_scores(const int MR, const int NV, const float *const *kp, const float *qt,
                            size_t ldq, int32_t D, float *st, size_t lds)
{
    pf_v c[PF_S_MR][PF_S_NV];
    const float *k[PF_S_MR];
    for (int r = 0; r < MR; r++) {
        k[r] = kp[r];
        for (int j = 0; j < NV; j++)
            c[r][j] = pf_zero();
    }
    for (int32_t d = 0; d < D; d++) {
        pf_v b[PF_S_NV];
        for (int j = 0; j < NV; j++)
            b[j] = pf_load(qt + (size_t)d * ldq + j * PF_VL);
        for (int r = 0; r < MR; r++) {
            const pf_v a = pf_set1(k[r][d]);
            for (int j = 0; j < NV; j++)
                c[r][j] = pf_fma(a, b[j], c[r][j]);
        }
    }
    for (int r = 0; r < MR; r++)
        for (int j = 0; j < NV; j++)
            pf_store(st + (size_t)r * lds + j * PF_VL, c[r][j]);
}

/*
 * OT[dv0 + r, cols] = OT[dv0 + r, cols] * alpha + sum_{n in [n0, n1)} V[n][dv0 + r] * P[n, cols]
 * for MR value elements r and NV vectors of rows.
 *   vp: [KT] fp32 value rows; pt: ST (probabilities) + column offset, rows ldp
 *   apart; ot: OT + row dv0 and column offset, rows ldo apart; alpha: [NV].
 */
PF_INLINE void pf_mk_values(const int MR, const int NV, const float *const *vp, int32_t dv0,
                            const float *pt, size_t ldp, int32_t n0, int32_t n1, float *ot,
                            size_t ldo, const pf_v *alpha)
{
    pf_v c[PF_O_MR][PF_O_NV];
    for (int r = 0; r < MR; r++)
        for (int j = 0; j < NV; j++)
            c[r][j] = pf_mul(pf_load(ot + (size_t)r * ldo + j * PF_VL), alpha[j]);
    for (int32_t n = n0; n < n1; n++) {
        pf_v b[PF_O_NV];
        for (int j = 0; j < NV; j++)
            b[j] = pf_load(pt + (size_t)n * ldp + j * PF_VL);
        const float *v = vp[n] + dv0;
        for (int r = 0; r < MR; r++) {
            const pf_v a = pf_set1(v[r]);
            for (int j = 0; j < NV; j++)
                c[r][j] = pf_fma(a, b[j], c[r][j]);
        }
    }
    for (int r = 0; r < MR; r++)
        for (int j = 0; j < NV; j++)
            pf_store(ot + (size_t)r * ldo + j * PF_VL, c[r][j]);
}

/* Dispatch on the remainder block sizes (compile-time constants inside). */
#if PF_S_MR > 6 || PF_O_MR > 6
#error "PF_CASES_MR covers blocks of at most 6 rows"
#endif
#define PF_CASES_MR(X, NV)                                                                         \
    switch (mr) {                                                                                  \
    case 1:                                                                                        \
        X(1, NV);                                                                                  \
        break;                                                                                     \
    case 2:                                                                                        \
        X(2, NV);                                                                                  \
        break;                                                                                     \
    case 3:                                                                                        \
        X(3, NV);                                                                                  \
        break;                                                                                     \
    case 4:                                                                                        \
        X(4, NV);                                                                                  \
        break;                                                                                     \
    case 5:                                                                                        \
        X(5, NV);                                                                                  \
        break;                                                                                     \
    case 6:                                                                                        \
        X(6, NV);                                                                                  \
        break;                                                                                     \
    default:                                                                                       \
        break;                                                                                     \
    }

/* ST [n, Mp] = K_tile x QT, blocked PF_S_MR keys x PF_S_NV vectors. */
static void pf_scores(const kva__cpu_tile *t, int32_t n, int32_t D, int32_t Mp)
{
    const int32_t nvec = Mp / PF_VL;
    for (int32_t v0 = 0; v0 < nvec; v0 += PF_S_NV) {
        const int32_t nv = nvec - v0 < PF_S_NV ? nvec - v0 : PF_S_NV;
        const float *qt = t->qt + (size_t)v0 * PF_VL;
        for (int32_t j0 = 0; j0 < n; j0 += PF_S_MR) {
            const int mr = n - j0 < PF_S_MR ? n - j0 : PF_S_MR;
            float *st = t->st + (size_t)j0 * Mp + (size_t)v0 * PF_VL;
            const float *const *kp = t->kp + j0;
#define PF_X(MR_, NV_) pf_mk_scores(MR_, NV_, kp, qt, (size_t)Mp, D, st, (size_t)Mp)
            if (nv == PF_S_NV && mr == PF_S_MR)
                PF_X(PF_S_MR, PF_S_NV);
            else if (nv == PF_S_NV) {
                PF_CASES_MR(PF_X, PF_S_NV)
            } else {
                for (int32_t u = 0; u < nv; u++) {
                    const float *qu = qt + (size_t)u * PF_VL;
                    float *su = st + (size_t)u * PF_VL;
#undef PF_X
#define PF_X(MR_, NV_) pf_mk_scores(MR_, 1, kp, qu, (size_t)Mp, D, su, (size_t)Mp)
                    PF_CASES_MR(PF_X, 1)
                }
            }
#undef PF_X
        }
    }
}

#ifdef PF_BF16_SCORES
/*
 * Scores from bf16 pairs (variant 6): ST[r, cols] = sum_{d2} <K[r][2d2, 2d2+1],
 * QT2[d2, cols]>, with kp [MR] the keys' bf16 rows straight from the cache
 * and qt QT2 [D/2, Mp] of (q[2d2], q[2d2+1]) pairs (unscaled), rows ldq apart.
 */
PF_INLINE void pf_mk_scores_bf16(const int MR, const int NV, const unsigned char *const *kp,
                                 const uint32_t *qt, size_t ldq, int32_t D2, float *st, size_t lds)
{
    __m512 c[PF_S_MR][PF_S_NV];
    const unsigned char *k[PF_S_MR];
    for (int r = 0; r < MR; r++) {
        k[r] = kp[r];
        for (int j = 0; j < NV; j++)
            c[r][j] = _mm512_setzero_ps();
    }
    for (int32_t d2 = 0; d2 < D2; d2++) {
        __m512i b[PF_S_NV];
        for (int j = 0; j < NV; j++)
            b[j] = _mm512_loadu_si512(qt + (size_t)d2 * ldq + j * PF_VL);
        for (int r = 0; r < MR; r++) {
            uint32_t w;
            memcpy(&w, k[r] + (size_t)d2 * 4, sizeof w);
            const __m512i a = _mm512_set1_epi32((int)w);
            for (int j = 0; j < NV; j++)
                c[r][j] = _mm512_dpbf16_ps(c[r][j], (__m512bh)a, (__m512bh)b[j]);
        }
    }
    for (int r = 0; r < MR; r++)
        for (int j = 0; j < NV; j++)
            _mm512_storeu_ps(st + (size_t)r * lds + j * PF_VL, c[r][j]);
}

/* ST [n, Mp] = K_tile x QT2 from the bf16 rows kr [n]. */
static void pf_scores_bf16(const kva__cpu_tile *t, const unsigned char *const *kr, int32_t n,
                           int32_t D, int32_t Mp)
{
    const int32_t nvec = Mp / PF_VL;
    const uint32_t *qt2 = (const uint32_t *)t->qt;
    for (int32_t v0 = 0; v0 < nvec; v0 += PF_S_NV) {
        const int32_t nv = nvec - v0 < PF_S_NV ? nvec - v0 : PF_S_NV;
        const uint32_t *qt = qt2 + (size_t)v0 * PF_VL;
        for (int32_t j0 = 0; j0 < n; j0 += PF_S_MR) {
            const int mr = n - j0 < PF_S_MR ? n - j0 : PF_S_MR;
            float *st = t->st + (size_t)j0 * Mp + (size_t)v0 * PF_VL;
            const unsigned char *const *kp = kr + j0;
#define PF_X(MR_, NV_) pf_mk_scores_bf16(MR_, NV_, kp, qt, (size_t)Mp, D / 2, st, (size_t)Mp)
            if (nv == PF_S_NV && mr == PF_S_MR)
                PF_X(PF_S_MR, PF_S_NV);
            else if (nv == PF_S_NV) {
                PF_CASES_MR(PF_X, PF_S_NV)
            } else {
                for (int32_t u = 0; u < nv; u++) {
                    const uint32_t *qu = qt + (size_t)u * PF_VL;
                    float *su = st + (size_t)u * PF_VL;
#undef PF_X
#define PF_X(MR_, NV_) pf_mk_scores_bf16(MR_, 1, kp, qu, (size_t)Mp, D / 2, su, (size_t)Mp)
                    PF_CASES_MR(PF_X, 1)
                }
            }
#undef PF_X
        }
    }
}
#endif

/* OT = OT * alpha + V_tile^T x P over keys [n0, n1) of the tile. */
static void pf_values(const kva__cpu_tile *t, int32_t n0, int32_t n1, int32_t Dv, int32_t Mp)
{
    const int32_t nvec = Mp / PF_VL;
    for (int32_t v0 = 0; v0 < nvec; v0 += PF_O_NV) {
        const int32_t nv = nvec - v0 < PF_O_NV ? nvec - v0 : PF_O_NV;
        const float *pt = t->st + (size_t)v0 * PF_VL;
        pf_v al[PF_O_NV];
        for (int32_t u = 0; u < nv; u++)
            al[u] = pf_load(t->alpha + (size_t)(v0 + u) * PF_VL);
        for (int32_t d0 = 0; d0 < Dv; d0 += PF_O_MR) {
            const int mr = Dv - d0 < PF_O_MR ? Dv - d0 : PF_O_MR;
            float *ot = t->ot + (size_t)d0 * Mp + (size_t)v0 * PF_VL;
#define PF_X(MR_, NV_) pf_mk_values(MR_, NV_, t->vp, d0, pt, (size_t)Mp, n0, n1, ot, (size_t)Mp, al)
            if (nv == PF_O_NV && mr == PF_O_MR)
                PF_X(PF_O_MR, PF_O_NV);
            else if (nv == PF_O_NV) {
                PF_CASES_MR(PF_X, PF_O_NV)
            } else {
                for (int32_t u = 0; u < nv; u++) {
                    const float *pu = pt + (size_t)u * PF_VL;
                    float *ou = ot + (size_t)u * PF_VL;
                    const pf_v *au = al + u;
#undef PF_X
#define PF_X(MR_, NV_) pf_mk_values(MR_, 1, t->vp, d0, pu, (size_t)Mp, n0, n1, ou, (size_t)Mp, au)
                    PF_CASES_MR(PF_X, 1)
                }
            }
#undef PF_X
        }
    }
}

/* 1 if every value of V rows [0, n) is finite (x - x is 0, else NaN). */
static int pf_values_finite(const kva__cpu_tile *t, int32_t n, int32_t Dv)
{
    __m256 acc = _mm256_setzero_ps();
    for (int32_t j = 0; j < n; j++)
        for (int32_t x = 0; x < Dv; x += 8) {
            const __m256 v = _mm256_loadu_ps(t->vp[j] + x);
            acc = _mm256_add_ps(acc, _mm256_sub_ps(v, v));
        }
    float a[8];
    _mm256_storeu_ps(a, acc);
    int ok = 1;
    for (int l = 0; l < 8; l++)
        ok &= a[l] == 0.0f;
    return ok;
}

/* ---- the online softmax of one tile ---- */

/*
 * Turns ST [n, Mp] (scores of keys c0 .. c0+n-1) into probabilities in place
 * and updates mx, sum, alpha [Mp]. lo/hi [Mp] are each row's visible keys
 * (clipped to the item); partial != 0 when some row sees only part of the
 * tile, which masks element-wise; scale_scores multiplies the scores by the
 * softmax scale first (the bf16 path keeps q unscaled).
 */
static void pf_softmax(const kva__cpu_run *run, kva__cpu_tile *t, int32_t c0, int32_t n, int32_t Mp,
                       int partial, int scale_scores)
{
    const kva_plan_desc *d = &run->plan->d;
    const int32_t nvec = Mp / PF_VL;
    const float cap = d->softcap, inv_cap = cap > 0.0f ? 1.0f / cap : 0.0f;
    const int alibi = run->plan->alibi_slopes != NULL;
    /* Pass 1: soft-cap, ALiBi, mask; the tile max of each row (NaN skipped). */
    for (int32_t u = 0; u < nvec; u++) {
        const size_t col = (size_t)u * PF_VL;
        pf_v cmax = pf_set1(-INFINITY);
        for (int32_t j = 0; j < n; j++) {
            float *sp = t->st + (size_t)j * Mp + col;
            pf_v x = pf_load(sp);
            if (scale_scores)
                x = pf_mul(x, pf_set1(d->scale));
            if (cap > 0.0f)
                x = pf_mul(pf_set1(cap), pf_tanh(pf_mul(x, pf_set1(inv_cap))));
            if (alibi)
                x = pf_alibi(x, t->slope + col, c0 + j, t->pos + col);
            if (partial)
                x = pf_mask_keys(x, c0 + j, t->lo + col, t->hi + col);
            if (scale_scores || cap > 0.0f || alibi || partial)
                pf_store(sp, x);
            cmax = pf_maxskip(x, cmax);
        }
        pf_store(t->cmax + col, cmax);
    }
    /* Per row: the new max, the rescale factor, the max the exponent uses. */
    for (int32_t m = 0; m < Mp; m++) {
        const float mold = t->mx[m];
        float mnew = kva__cpu_max_nan(mold, t->cmax[m]);
        if (mnew == -INFINITY) {
            /* Every score so far is -inf (the row stays as it is: weight 0)
             * or NaN (the row becomes NaN). */
            int nan = 0;
            for (int32_t j = 0; j < n; j++) {
                const float x = t->st[(size_t)j * Mp + m];
                nan |= x != x;
            }
            if (!nan) {
                t->alpha[m] = 1.0f;
                t->muse[m] = 0.0f; /* exp(-inf - 0) = 0 for every key */
                continue;
            }
            mnew = NAN;
        }
        t->alpha[m] = mold == -INFINITY ? 0.0f : expf(mold - mnew);
        t->muse[m] = mnew;
        t->mx[m] = mnew;
    }
    /* Pass 2: p = exp(s - max), and the row sums. */
    for (int32_t u = 0; u < nvec; u++) {
        const size_t col = (size_t)u * PF_VL;
        const pf_v mu = pf_load(t->muse + col);
        pf_v ps = pf_zero();
        for (int32_t j = 0; j < n; j++) {
            float *sp = t->st + (size_t)j * Mp + col;
            const pf_v p = pf_exp(pf_sub(pf_load(sp), mu));
            pf_store(sp, p);
            ps = pf_add(ps, p);
        }
        const pf_v al = pf_load(t->alpha + col);
        pf_store(t->sum + col, pf_fma(pf_load(t->sum + col), al, ps));
    }
}

/* Exact P x V of a partially visible tile holding a non-finite value: each
 * row adds only its own visible keys. */
static void pf_values_rows(kva__cpu_tile *t, int32_t c0, int32_t n, int32_t Dv, int32_t M,
                           int32_t Mp)
{
    for (int32_t dv = 0; dv < Dv; dv++) {
        float *o = t->ot + (size_t)dv * Mp;
        for (int32_t m = 0; m < M; m++)
            o[m] *= t->alpha[m];
    }
    for (int32_t m = 0; m < M; m++) {
        const int32_t a = t->lo[m] > c0 ? t->lo[m] - c0 : 0;
        const int32_t e = t->hi[m] < c0 + n ? t->hi[m] - c0 : n;
        for (int32_t j = a; j < e; j++) {
            const float p = t->st[(size_t)j * Mp + m];
            const float *v = t->vp[j];
            for (int32_t dv = 0; dv < Dv; dv++)
                t->ot[(size_t)dv * Mp + m] += p * v[dv];
        }
    }
}

/* ---- the kernel ---- */

void PF_FN(const kva__cpu_run *run, const kva__work_item *it, kva__cpu_scratch *s)
{
    const kva_plan *plan = run->plan;
    const kva_plan_desc *d = &plan->d;
    const int32_t H = d->num_heads, D = d->head_dim, Dv = d->head_dim_v;
    const int32_t G = H / d->num_kv_heads;
    const int32_t r = it->req, nq = it->nq, nh = it->nh;
    const int32_t hbase = it->kv_head * G + it->h0;
    const int32_t tok0 = plan->query_start_loc[r] + it->i0;
    const int32_t q_len = plan->query_start_loc[r + 1] - plan->query_start_loc[r];
    const int32_t seq = plan->seq_lens[r];
    const int32_t M = nq * nh, Mp = (M + PF_VL - 1) / PF_VL * PF_VL;
    const size_t esz = kva_dtype_size(run->dt);
    kva__cpu_tile t;
    kva__cpu_tile_map(s->tile, D, Dv, &t);
#ifdef PF_BF16_SCORES
    /* Scores from bf16 pairs: QT2 [D/2, Mp] (in t.qt) of unscaled q pairs. */
    const int bf16 = run->dt == KVA_DTYPE_BF16 && run->kv_dt == KVA_DTYPE_BF16;
    uint32_t *qt2 = (uint32_t *)t.qt;
#else
    const int bf16 = 0;
#endif

    /* QT [D, Mp] (scale folded in, padding rows 0) and the rows' metadata.
     * Padding rows see every key, so they never make a tile partial. */
    float *row = t.row;
    for (int32_t m = 0; m < Mp; m++) {
        t.mx[m] = -INFINITY;
        t.sum[m] = 0.0f;
        if (m >= M) {
            for (int32_t x = 0; x < D; x++)
                t.qt[(size_t)x * Mp + m] = 0.0f; /* also zeroes QT2 */
            t.lo[m] = INT32_MIN;
            t.hi[m] = INT32_MAX;
            t.pos[m] = 0;
            t.slope[m] = 0.0f;
            continue;
        }
        const int32_t ii = m / nh, h = hbase + m % nh;
        const unsigned char *src =
            (const unsigned char *)run->q + (size_t)(((int64_t)(tok0 + ii) * H + h) * D) * esz;
#ifdef PF_BF16_SCORES
        if (bf16) {
            const uint16_t *q16 = (const uint16_t *)src;
            for (int32_t x = 0; x < D; x += 2)
                qt2[(size_t)(x / 2) * Mp + m] = (uint32_t)q16[x] | (uint32_t)q16[x + 1] << 16;
        } else
#endif
        {
            kva__cpu_load_row(row, src, run->dt, D);
            for (int32_t x = 0; x < D; x++)
                t.qt[(size_t)x * Mp + m] = row[x] * d->scale;
        }
        int32_t lo, hi;
        kva__row_keys(d, seq, q_len, it->i0 + ii, &lo, &hi);
        t.lo[m] = lo > it->k0 ? lo : it->k0;
        t.hi[m] = hi < it->k1 ? hi : it->k1;
        t.pos[m] = seq - q_len + it->i0 + ii;
        t.slope[m] = plan->alibi_slopes ? plan->alibi_slopes[h] : 0.0f;
    }
    memset(t.ot, 0, (size_t)Dv * Mp * sizeof(float));

    /* Tiles of PF_KT keys; the rows of the next tile are prefetched. */
    const unsigned char **kr = t.rows, **vr = t.rows + KVA_CPU_TILE_KEYS;
    const unsigned char **kr2 = vr + KVA_CPU_TILE_KEYS, **vr2 = kr2 + KVA_CPU_TILE_KEYS;
    const size_t kv_esz = kva_dtype_size(run->kv_dt);
    int located = 0;
    for (int32_t c0 = it->k0; c0 < it->k1; c0 += PF_KT) {
        const int32_t c1 = c0 + PF_KT < it->k1 ? c0 + PF_KT : it->k1, n = c1 - c0;
        /* Rows that see the whole tile, rows that see part of it. */
        int any = 0, partial = 0;
        for (int32_t m = 0; m < M; m++) {
            const int32_t a = t.lo[m] > c0 ? t.lo[m] : c0, e = t.hi[m] < c1 ? t.hi[m] : c1;
            any |= a < e;
            partial |= a != c0 || e != c1;
        }
        if (!any) {
            located = 0;
            continue;
        }
        if (!located)
            pf_locate(run, r, it->kv_head, c0, n, kr, vr);
        located = 0;
        if (c1 < it->k1) {
            const int32_t n2 = it->k1 - c1 < PF_KT ? it->k1 - c1 : PF_KT;
            pf_locate(run, r, it->kv_head, c1, n2, kr2, vr2);
            pf_prefetch(kr2, vr2, n2, (size_t)D * kv_esz, (size_t)Dv * kv_esz);
            located = 1;
        }
        pf_load_tile(run, kr, vr, n, !bf16, &t);
#ifdef PF_BF16_SCORES
        if (bf16)
            pf_scores_bf16(&t, kr, n, D, Mp);
        else
#endif
            pf_scores(&t, n, D, Mp);
        pf_softmax(run, &t, c0, n, Mp, partial, bf16);
        if (partial && !pf_values_finite(&t, n, Dv))
            pf_values_rows(&t, c0, n, Dv, M, Mp);
        else
            pf_values(&t, 0, n, Dv, Mp);
        if (located) {
            const unsigned char **x = kr;
            kr = kr2;
            kr2 = x;
            x = vr;
            vr = vr2;
            vr2 = x;
        }
    }

    if (it->task >= 0) {
        /* Partial of chunk it->split: out [M, Dv] normalized over the chunk, then lse [M]. */
        const kva__split_task *tk = &run->part->tasks[it->task];
        float *po = run->partials + tk->ws_off + (int64_t)it->split * M * (Dv + 1);
        float *pl = po + (size_t)M * Dv;
        for (int32_t m = 0; m < M; m++) {
            const float l = t.sum[m];
            const float f = l == 0.0f ? 0.0f : 1.0f / l;
            float *o = po + (size_t)m * Dv;
            for (int32_t x = 0; x < Dv; x++)
                o[x] = t.ot[(size_t)x * Mp + m] * f;
            pl[m] = l == 0.0f ? -INFINITY : t.mx[m] + logf(l);
        }
        return;
    }

    /* Final rows: the sink joins the denominator only (as attn_v1.c). */
    for (int32_t m = 0; m < M; m++) {
        const int32_t ii = m / nh, h = hbase + m % nh;
        const float mx = t.mx[m], l = t.sum[m];
        float f, lse;
        if (run->sinks) {
            const float sink = run->sinks[h];
            const float top = kva__cpu_max_nan(mx, sink);
            const float wk = l == 0.0f ? 0.0f : expf(mx - top);
            const float den = l * wk + expf(sink - top);
            f = wk / den;
            lse = top + logf(den);
        } else if (l == 0.0f) {
            f = 0.0f;
            lse = -INFINITY;
        } else {
            f = 1.0f / l;
            lse = mx + logf(l);
        }
        for (int32_t x = 0; x < Dv; x++)
            row[x] = t.ot[(size_t)x * Mp + m] * f;
        const int64_t orow = (int64_t)(tok0 + ii) * H + h;
        kva__cpu_store_row((unsigned char *)run->out + (size_t)(orow * Dv) * esz, run->dt, row, Dv);
        if (run->lse)
            run->lse[orow] = lse;
    }
}
