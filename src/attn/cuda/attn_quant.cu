/*
 * attn_quant.cu - paged attention over quantized caches on CUDA
 * (KVA_QUANT_INT8_CHANNEL, INT8_TOKEN_K, INT8_TOKEN_K_V16, FP8_E4M3): the
 * work items of the plan (decodes, speculative decodes, chunked prefills)
 * that decode_mma_quant.cu does not take, and the prefill tiles that the
 * quantized tensor-core prefill (prefill_mma_quant.h, launched from here)
 * does not cover. kva__cuda_attention() sends a quantized cache here.
 *
 * The cache is never converted to a float copy: each lane reads 1-byte K and
 * V codes (2-byte V for INT8_TOKEN_K_V16) with 16-byte loads (8-byte loads
 * for the ROWS = 8 instantiation, which keeps the per-lane registers of q and
 * the accumulators at 64 floats each, and for head sizes that are not a
 * multiple of 16) and dequantizes them in registers:
 *   int8: code c as the float 2^23 + (c ^ 0x80) built with one byte_perm,
 *         minus 2^23 + 128 (exact);
 *   fp8:  cvt e4m3x2 -> f16x2 (exact, NaN kept), then f16 -> f32.
 * The scales never enter the inner loops:
 *   K static (INT8_CHANNEL, FP8):  q'_d = q_d * s_d once per item, and the
 *       offsets as one constant per row, qo = sum_d q'_d o_d:
 *       score = sum_d q'_d c_d - qo = sum_d q_d (c_d - o_d) s_d;
 *   K per token (INT8_TOKEN_K*):    score = s_t * sum_d q_d c_d, one multiply
 *       per key and row;
 *   V static (INT8, FP8):           acc_d = sum_j p_j c_jd, and at the end
 *       out_d = s_d (acc_d - o_d l) / l (P.V, the split partials and their
 *       merge are linear in V; sinks only change the denominator).
 * The rest follows attn_simt.cu's register pipeline (lane groups of LK lanes per key
 * row, U keys per group and step with the next step's loads in flight,
 * online softmax in base 2, groups merged by shuffles and warps through
 * shared memory, persistent grid over the device header's counts).
 *
 * Units of work: the plan's items (at most ROWS rows, a key range, maybe a
 * split) and, when the plan has prefill tiles, each tile's 128 packed rows
 * (token-major: m = i * G + g, prefill_mma.h) cut into 128 / ROWS units over
 * the request's whole key range. Each unit loops only over the keys some of
 * its rows can see. Only prefill tiles the tensor-core kernel of
 * prefill_mma_quant.h does not cover (kva__cuda_qprefill_usable: other head
 * sizes, FP8 with per-channel key scales, a V16 V dtype other than q's,
 * unaligned pointers) run here.
 */
extern "C" {
#include "cuda_backend.h"
#include "partition.h"
#include "prefill_mma.h"
}
#include "attn_quant_ld.cuh"
#include "cuda_check.h"
#include "dcp_pos.cuh"
#include "tree_mask.cuh"
#include "quant_args.cuh"
#include "simt_merge.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define QA_NW 4 /* warps per CTA */
#define QA_U 2  /* keys per lane group and step */
#define QA_LOG2E 1.4426950408889634f
/* 1: items of plans partitioned for the tensor-core decode over quantized K/V run on the
 * tensor-core kernel of decode_mma_quant.cu; 0: everything on this file's
 * CUDA-core kernel. */
#ifndef KVA__CUDA_QUANT_MMA
#define KVA__CUDA_QUANT_MMA 1
#endif

typedef struct qa_args {
    kva__cuda_meta meta;
    const int32_t *ptiles; /* [n, 4] prefill tiles {r, m0, kvh, 0}, or NULL */
    const void *q;         /* [T, H, D] in qdt */
    const uint8_t *k;      /* K codes in the cache layout */
    const uint8_t *v;      /* V codes (or f16/bf16) in the cache layout */
    const float *kts;      /* [NB, Hkv, B] per-token key scales, or NULL */
    const float *ks, *ko;  /* [Hkv, D] static K scale / offset */
    const float *vs, *vo;  /* [Hkv, Dv] static V scale / offset */
    const float *sinks;    /* [H] or NULL */
    void *out;             /* [T, H, Dv] in qdt */
    float *lse;            /* [T, H] or NULL */
    float *ws;             /* split partials */
    int32_t H, Hkv, G, D, Dv, B;
    int32_t isub; /* units per item (item rows up to isub * ROWS); 0: items run elsewhere */
    int32_t hnd, causal, window_left, chunk, has_alibi, qdt; /* chunk: attention_chunk */
    float scale, softcap;
} qa_args;

/*
 * Row (in elements of one head's width) and per-token scale index of key j of
 * kv head kvh: block * B*Hkv + off * ostride + kvh * hstride, and
 * (block * Hkv + kvh) * B + off. j / B via a double reciprocal with one
 * correction step (exact for j, B < 2^31).
 */
typedef struct qa_addr {
    int64_t bstride, ostride, hoff, toff;
    double inv_b;
} qa_addr;

__device__ __forceinline__ int64_t key_row(const qa_args &a, const qa_addr &ka,
                                           const int32_t *bt_row, int32_t j, int64_t *tsi)
{
    int32_t blk = (int32_t)((double)j * ka.inv_b);
    int32_t off = j - blk * a.B;
    blk = off >= a.B ? blk + 1 : blk;
    off = off >= a.B ? off - a.B : off;
    blk = off < 0 ? blk - 1 : blk;
    off = off < 0 ? off + a.B : off;
    const int64_t block = (int64_t)__ldg(bt_row + blk);
    *tsi = block * ka.bstride + ka.toff + off;
    return block * ka.bstride + off * ka.ostride + ka.hoff;
}

/*
 * LK lanes per key row; lane li holds K channels li*CB .. +CB (one chunk) and
 * V chunks c < NCHV of CB bytes: channels (li + c*LK)*VV .. +VV.
 */
template <int FMT, int LK, int ROWS, int CB>
__device__ __forceinline__ void issue(const qa_args &a, const qa_addr &ka, const int32_t *bt_row,
                                      int32_t kb, int g, int li, int32_t kend,
                                      chunk<CB> (&kr)[QA_U],
                                      chunk<CB> (&vr)[QA_U][FMT >= 2 ? 2 : 1], float (&ts)[QA_U])
{
    constexpr int VB = FMT >= 2 ? 2 : 1, NCHV = VB, VV = CB / VB;
    constexpr int KPW = 32 / LK;
#pragma unroll
    for (int u = 0; u < QA_U; u++) {
        const int32_t j = kb + u * KPW + g;
        zero(kr[u]);
#pragma unroll
        for (int c = 0; c < NCHV; c++)
            zero(vr[u][c]);
        ts[u] = 0.f;
        if (j < kend) {
            int64_t tsi;
            const int64_t row = key_row(a, ka, bt_row, j, &tsi);
            if (li * CB < a.D)
                kr[u] = ldc<CB>(a.k + row * a.D + li * CB);
#pragma unroll
            for (int c = 0; c < NCHV; c++) {
                const int d0 = (li + c * LK) * VV;
                if (d0 < a.Dv)
                    vr[u][c] = ldc<CB>(a.v + (row * a.Dv + d0) * VB);
            }
            if (a.kts)
                ts[u] = __ldg(a.kts + tsi);
        }
    }
}

/* One unit of work: rows r < nrows are packed rows m = mstart + r of
 * request req, kv head kvh: query i0 + m / nh, head kvh*G + h0 + m % nh;
 * ntot: rows of the whole item (its split partials are [ntot, Dv], [ntot]). */
typedef struct qa_unit {
    int32_t req, kvh, h0, nh, i0, mstart, nrows, ntot, k0, k1, task, split;
} qa_unit;

/* Unit u of the persistent loop: the plan's items cut into isub units of
 * ROWS rows (sub-unit major: units sub * n_items + item, so the empty sub-
 * units of short items come last), then the prefill tiles' units of ROWS
 * rows; returns 0 for a unit past its item's (or request's) rows. */
template <int ROWS>
__device__ __forceinline__ int get_unit(const qa_args &a, int32_t u, int32_t n_items, qa_unit &w)
{
    const int32_t n_iu = n_items * a.isub;
    if (u < n_iu) {
        const int32_t sub = u / n_items, i = u - sub * n_items;
        const kva__cuda_item it = a.meta.items[i];
        w.req = it.req, w.kvh = it.kv_head, w.h0 = it.h0, w.nh = it.nh, w.i0 = it.i0;
        w.ntot = it.nq * it.nh;
        w.mstart = sub * ROWS;
        const int32_t left = w.ntot - w.mstart;
        w.nrows = left < ROWS ? left : ROWS;
        w.k0 = it.k0, w.k1 = it.k1;
        w.task = it.task, w.split = it.split;
        return w.nrows > 0;
    }
    constexpr int SUB = KVA__CUDA_PREFILL_TILE_M / ROWS;
    const int32_t t = (u - n_iu) / SUB, sub = (u - n_iu) - t * SUB;
    const int32_t *tile = a.ptiles + (int64_t)t * KVA__CUDA_PREFILL_TILE_INTS;
    w.req = tile[0], w.kvh = tile[2], w.h0 = 0, w.nh = a.G, w.i0 = 0;
    const int32_t q_len = a.meta.qsl[w.req + 1] - a.meta.qsl[w.req];
    w.mstart = tile[1] + sub * ROWS;
    const int32_t left = q_len * a.G - w.mstart;
    w.nrows = left < ROWS ? left : ROWS;
    w.ntot = 0;
    w.k0 = 0, w.k1 = a.meta.seq_lens[w.req];
    w.task = -1, w.split = 0;
    return w.nrows > 0;
}

typedef struct qa_unit_rows {
    int32_t nrows;
} qa_unit_rows;

/*
 * One step of the key loop for one lane: the U keys kb + u*KPW + g, whose K
 * and V chunks (and per-token scales) are in kr/vr/ts, update the online-
 * softmax state (m, l, acc) of every row.
 */
template <int FMT, int LK, int ROWS, int CB>
__device__ __forceinline__ void
attend(const qa_args &a, int32_t kb, int g, int32_t nrows, bool ktok, const chunk<CB> (&kr)[QA_U],
       const chunk<CB> (&vr)[QA_U][FMT >= 2 ? 2 : 1], const float (&ts)[QA_U],
       const float (&q)[ROWS][CB], const float (&qo)[ROWS], const int32_t (&lo)[ROWS],
       const int32_t (&hi)[ROWS], const int32_t (&pos)[ROWS], const float (&slope)[ROWS],
       int32_t lo_all, int32_t hi_all, const kva__cuda_tree &tree, float (&m)[ROWS],
       float (&l)[ROWS], float (&acc)[ROWS][FMT >= 2 ? 2 : 1][FMT >= 2 ? CB / 2 : CB])
{
    constexpr int VB = FMT >= 2 ? 2 : 1, NCHV = VB, VV = CB / VB, KV = CB;
    constexpr int KPW = 32 / LK;
    const float scale_log2 = a.scale * QA_LOG2E;
    const qa_unit_rows w = {nrows};
    /* Scores of the U keys for every row. */
    float sc[QA_U][ROWS];
#pragma unroll
    for (int u = 0; u < QA_U; u++) {
        float kf[KV];
        deq_k<FMT, CB>(kr[u], kf);
#pragma unroll
        for (int r = 0; r < ROWS; r++) {
            float dot = 0.f;
#pragma unroll
            for (int e = 0; e < KV; e++)
                dot = fmaf(q[r][e], kf[e], dot);
#pragma unroll
            for (int o = LK / 2; o >= 1; o >>= 1)
                dot += __shfl_xor_sync(0xffffffffu, dot, o);
            sc[u][r] = ktok ? dot * ts[u] : dot - qo[r];
        }
    }
    if (a.softcap > 0.f) {
#pragma unroll
        for (int u = 0; u < QA_U; u++)
#pragma unroll
            for (int r = 0; r < ROWS; r++)
                sc[u][r] = a.softcap * tanhf(sc[u][r] * a.scale / a.softcap) * QA_LOG2E;
    } else {
#pragma unroll
        for (int u = 0; u < QA_U; u++)
#pragma unroll
            for (int r = 0; r < ROWS; r++)
                sc[u][r] *= scale_log2;
    }
    if (a.has_alibi) {
#pragma unroll
        for (int r = 0; r < ROWS; r++)
#pragma unroll
            for (int u = 0; u < QA_U; u++)
                sc[u][r] =
                    fmaf(slope[r], (float)(kva__cuda_key_pos(a.meta, kb + u * KPW + g) - pos[r]),
                         sc[u][r]);
    }
    if (!(kb >= lo_all && kb + QA_U * KPW <= hi_all)) {
#pragma unroll
        for (int r = 0; r < ROWS; r++)
#pragma unroll
            for (int u = 0; u < QA_U; u++) {
                const int32_t j = kb + u * KPW + g;
                const bool vis =
                    r < w.nrows && j >= lo[r] && j < hi[r] && kva__cuda_tree_sees(tree, pos[r], j);
                sc[u][r] = vis ? sc[u][r] : -INFINITY;
            }
    }
    /* Online softmax; sc becomes the weights p. */
    float cr[ROWS];
    bool grew = false;
#pragma unroll
    for (int r = 0; r < ROWS; r++) {
        float mx = m[r];
#pragma unroll
        for (int u = 0; u < QA_U; u++)
            mx = fmaxf(mx, sc[u][r]);
        const float mu = mx == -INFINITY ? 0.f : mx;
        const float corr = exp2f(m[r] - mu);
        m[r] = mx;
        float psum = 0.f;
#pragma unroll
        for (int u = 0; u < QA_U; u++) {
            sc[u][r] = exp2f(sc[u][r] - mu);
            psum += sc[u][r];
        }
        l[r] = l[r] * corr + psum;
        cr[r] = corr;
        grew |= corr != 1.f;
    }
    /* Rescale the accumulators only when some row's maximum moved in this
     * warp (a factor of exactly 1 changes nothing: bit-identical). */
    if (__any_sync(0xffffffffu, grew)) {
#pragma unroll
        for (int r = 0; r < ROWS; r++)
#pragma unroll
            for (int c = 0; c < NCHV; c++)
#pragma unroll
                for (int e = 0; e < VV; e++)
                    acc[r][c][e] *= cr[r];
    }
#pragma unroll
    for (int u = 0; u < QA_U; u++) {
#pragma unroll
        for (int c = 0; c < NCHV; c++) {
            float vf[VV];
            deq_v<FMT, CB>(vr[u][c], vf);
#pragma unroll
            for (int r = 0; r < ROWS; r++)
#pragma unroll
                for (int e = 0; e < VV; e++)
                    acc[r][c][e] = fmaf(sc[u][r], vf[e], acc[r][c][e]);
        }
    }
}

template <int FMT, int LK, int ROWS, int CB>
__global__ void __launch_bounds__(QA_NW * 32, 2) qa_kernel(qa_args a)
{
    constexpr int VB = FMT >= 2 ? 2 : 1, NCHV = VB, VV = CB / VB;
    constexpr int KV = CB;              /* K channels per lane */
    constexpr int KPW = 32 / LK;        /* keys per warp and u */
    constexpr int DCV = LK * NCHV * VV; /* V channels covered */
    __shared__ float s_acc[QA_NW][ROWS][DCV];
    __shared__ float s_m[QA_NW][ROWS], s_l[QA_NW][ROWS];

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane / LK, li = lane % LK;
    const int32_t n_items = a.meta.hdr[KVA_CUDA_HDR_ITEMS];
    const int32_t tree_on = a.meta.hdr[KVA_CUDA_HDR_TREE]; /* tree_mask.cuh */
    const int32_t n_tiles = a.ptiles ? a.meta.hdr[KVA_CUDA_HDR_PTILES] : 0;
    const int32_t n_units = n_items * a.isub + n_tiles * (KVA__CUDA_PREFILL_TILE_M / ROWS);
    const int32_t bt_stride = a.meta.hdr[KVA_CUDA_HDR_BT_STRIDE];
    /* INT8_TOKEN_K with static V: the format of I8 but per-token K scales. */
    const bool ktok = a.kts != nullptr;

    for (int32_t un = blockIdx.x; un < n_units; un += gridDim.x) {
        qa_unit w;
        if (!get_unit<ROWS>(a, un, n_items, w))
            continue; /* uniform over the CTA */
        const int32_t qs = a.meta.qsl[w.req];
        const int32_t q_len = a.meta.qsl[w.req + 1] - qs;
        const int32_t s = a.meta.seq_lens[w.req];
        const kva__cuda_tree tree = kva__cuda_tree_at(a.meta.tree, tree_on, qs, s, q_len);
        const int32_t *bt_row = a.meta.block_table + (int64_t)w.req * bt_stride;

        /* Per row: the scaled query chunk, qo, visible keys, ALiBi slope. */
        float q[ROWS][KV], qo[ROWS], slope[ROWS];
        int32_t lo[ROWS], hi[ROWS], pos[ROWS];
        const int d0 = li * KV;
#pragma unroll
        for (int r = 0; r < ROWS; r++) {
            lo[r] = 0, hi[r] = 0, pos[r] = 0, slope[r] = 0.f;
            float o = 0.f;
#pragma unroll
            for (int e = 0; e < KV; e++)
                q[r][e] = 0.f;
            if (r < w.nrows) {
                const int32_t m = w.mstart + r, qi = m / w.nh, hh = m - qi * w.nh;
                const int32_t head = w.kvh * a.G + w.h0 + hh;
                const int32_t i = w.i0 + qi;
                int32_t p, h_, l_;
                kva__cuda_row_keys(a.meta, a.causal, a.window_left, a.chunk, w.req, s, q_len, i, l_,
                                   h_, p);
                lo[r] = l_ > w.k0 ? l_ : w.k0;
                hi[r] = h_ < w.k1 ? h_ : w.k1;
                pos[r] = p;
                if (a.has_alibi)
                    slope[r] = a.meta.alibi[head] * QA_LOG2E;
                if (d0 < a.D) {
                    const int64_t qb = ((int64_t)(qs + i) * a.H + head) * a.D + d0;
                    const int64_t sb = (int64_t)w.kvh * a.D + d0;
#pragma unroll
                    for (int e = 0; e < KV; e++) {
                        /* (per-token formats have unit static K scales) */
                        const float x = load_q(a.q, a.qdt, qb + e) * a.ks[sb + e];
                        q[r][e] = x;
                        if constexpr (FMT == QF_I8)
                            o = fmaf(x, a.ko[sb + e], o);
                    }
                }
            }
#pragma unroll
            for (int x = LK / 2; x >= 1; x >>= 1)
                o += __shfl_xor_sync(0xffffffffu, o, x);
            qo[r] = ktok ? 0.f : o;
        }

        float m[ROWS], l[ROWS], acc[ROWS][NCHV][VV];
#pragma unroll
        for (int r = 0; r < ROWS; r++) {
            m[r] = -INFINITY, l[r] = 0.f;
#pragma unroll
            for (int c = 0; c < NCHV; c++)
#pragma unroll
                for (int e = 0; e < VV; e++)
                    acc[r][c][e] = 0.f;
        }

        /* Keys some row sees [kbeg, kend); keys every row sees [lo_all, hi_all). */
        int32_t kbeg = w.k1, kend = w.k0, lo_all = w.k0, hi_all = w.k1;
#pragma unroll
        for (int r = 0; r < ROWS; r++)
            if (r < w.nrows && lo[r] < hi[r]) {
                kbeg = min(kbeg, lo[r]);
                kend = max(kend, hi[r]);
            }
#pragma unroll
        for (int r = 0; r < ROWS; r++)
            if (r < w.nrows) {
                lo_all = max(lo_all, lo[r]);
                hi_all = min(hi_all, hi[r]);
            }
        hi_all = min(hi_all, tree.t0); /* steps reaching a tree key are masked */
        qa_addr ka;
        ka.bstride = (int64_t)a.B * a.Hkv;
        ka.ostride = a.hnd ? 1 : a.Hkv;
        ka.hoff = a.hnd ? (int64_t)w.kvh * a.B : w.kvh;
        ka.toff = (int64_t)w.kvh * a.B;
        ka.inv_b = 1.0 / (double)a.B;
        constexpr int STEP = QA_NW * QA_U * KPW;

        if (kbeg < kend) {
            const int32_t kb0 = kbeg + warp * (QA_U * KPW);
            chunk<CB> kr[QA_U], vr[QA_U][NCHV];

            float ts[QA_U];
            issue<FMT, LK, ROWS, CB>(a, ka, bt_row, kb0, g, li, kend, kr, vr, ts);
            for (int32_t kb = kb0; kb < kend; kb += STEP) {
                chunk<CB> kn[QA_U], vn[QA_U][NCHV];
                float tn[QA_U];
                issue<FMT, LK, ROWS, CB>(a, ka, bt_row, kb + STEP, g, li, kend, kn, vn, tn);
                attend<FMT, LK, ROWS, CB>(a, kb, g, w.nrows, ktok, kr, vr, ts, q, qo, lo, hi, pos,
                                          slope, lo_all, hi_all, tree, m, l, acc);
#pragma unroll
                for (int u = 0; u < QA_U; u++) {
                    kr[u] = kn[u];
                    ts[u] = tn[u];
#pragma unroll
                    for (int c = 0; c < NCHV; c++)
                        vr[u][c] = vn[u][c];
                }
            }
        }

        /* Merge the groups of each warp, then the warps; apply the V scales and
         * write element (r, d) per thread. */
        kva__simt_merge_groups<LK, ROWS, NCHV, VV>(m, l, acc);
        kva__simt_store_warp<LK, ROWS, NCHV, VV, QA_NW, DCV>(warp, g, li, m, l, acc, s_acc, s_m,
                                                             s_l);
        __syncthreads();
        for (int32_t x = threadIdx.x; x < w.nrows * a.Dv; x += blockDim.x) {
            const int32_t r = x / a.Dv, d = x - r * a.Dv;
            float M, mu, L, O;
            kva__simt_combine<QA_NW, ROWS, DCV>(s_m, s_l, s_acc, r, d, &M, &mu, &L, &O);
            /* sum_j p_j v_jd in value units (0 when no key is visible). */
            if constexpr (FMT == QF_I8 || FMT == QF_FP8) {
                const int64_t sv = (int64_t)w.kvh * a.Dv + d;
                O = FMT == QF_I8 ? a.vs[sv] * (O - a.vo[sv] * L) : a.vs[sv] * O;
            }
            const int32_t m_ = w.mstart + r, qi = m_ / w.nh, hh = m_ - qi * w.nh;
            const int32_t head = w.kvh * a.G + w.h0 + hh;
            const int64_t tok = qs + w.i0 + qi;
            if (w.task >= 0) {
                const kva__cuda_task t = a.meta.tasks[w.task];
                kva__simt_write_partial(a.ws + t.ws_off + (int64_t)w.split * w.ntot * (a.Dv + 1),
                                        w.ntot, a.Dv, m_, d, mu, L, O);
            } else {
                const float o = kva__simt_finish(M, mu, L, O, a.sinks ? a.sinks + head : NULL, d,
                                                 a.lse ? a.lse + tok * a.H + head : NULL);
                store_out(a.out, a.qdt, (tok * a.H + head) * a.Dv + d, o);
            }
        }
        __syncthreads();
    }
}

/* ---- dispatch ---- */

typedef void (*qa_kernel_fn)(qa_args);

template <int FMT, int ROWS, int CB> static qa_kernel_fn pick_lk(int lk)
{
    if constexpr (CB == 16) {
        return lk <= 8 ? qa_kernel<FMT, 8, ROWS, CB> : qa_kernel<FMT, 16, ROWS, CB>;
    } else {
        return lk <= 8    ? qa_kernel<FMT, 8, ROWS, CB>
               : lk <= 16 ? qa_kernel<FMT, 16, ROWS, CB>
                          : qa_kernel<FMT, 32, ROWS, CB>;
    }
}

template <int FMT> static qa_kernel_fn pick_fmt(int rows16, int lk)
{
    return rows16 ? pick_lk<FMT, 4, 16>(lk) : pick_lk<FMT, 8, 8>(lk);
}

/*
 * The instantiation for a cache and the plan's rows per item: ROWS = 4 with
 * 16-byte chunks when items hold at most 4 rows and the rows are 16-byte
 * aligned (D, and Dv for 1-byte V, multiples of 16), else ROWS = 8 with
 * 8-byte chunks; LK lanes cover D (one chunk) and Dv (VB chunks). The loads
 * go through registers (a cp.async ring measured slower on an H100: the
 * kernel is issue-bound rather than latency-bound).
 */
static qa_kernel_fn pick(const kva_cache *c, int plan_rows, int *rows)
{
    const kva_cache_desc *d = &c->desc;
    const int fmt = d->quant == KVA_QUANT_FP8_E4M3 ? QF_FP8
                    : d->quant == KVA_QUANT_INT8_TOKEN_K_V16
                        ? (d->dtype == KVA_DTYPE_BF16 ? QF_I8_BF16 : QF_I8_F16)
                        : QF_I8;
    const int vb = fmt >= QF_I8_F16 ? 2 : 1;
    const int rows16 =
        plan_rows <= 4 && d->head_dim % 16 == 0 && (vb == 2 || d->head_dim_v % 16 == 0);
    const int cb = rows16 ? 16 : 8, vv = cb / vb;
    *rows = rows16 ? 4 : 8;
    const int nk = d->head_dim / cb;
    const int nv = (d->head_dim_v / vv + vb - 1) / vb;
    const int lk = nk > nv ? nk : nv;
    switch (fmt) {
    case QF_FP8:
        return pick_fmt<QF_FP8>(rows16, lk);
    case QF_I8_F16:
        return pick_fmt<QF_I8_F16>(rows16, lk);
    case QF_I8_BF16:
        return pick_fmt<QF_I8_BF16>(rows16, lk);
    default:
        return pick_fmt<QF_I8>(rows16, lk);
    }
}

extern "C" kva_status kva__cuda_attention_quant(kva_context *ctx, const kva_plan *plan,
                                                const void *q, const kva_cache *cache,
                                                const float *sinks, void *out, float *lse)
{
    const kva__cuda_state *st = (const kva__cuda_state *)ctx->state;
    const kva__cuda_plan *cp = (const kva__cuda_plan *)plan->device;
    const kva_plan_desc *d = &plan->d;
    const kva_cache_desc *cd = &cache->desc;
    cudaStream_t stream = (cudaStream_t)st->stream;
    qa_args a;
    memset(&a, 0, sizeof a);
    a.meta = st->meta;
    a.ptiles = cp->mma && st->caps.ptiles > 0 ? st->meta.ptiles : NULL;
    a.q = q;
    a.k = (const uint8_t *)cache->k;
    a.v = (const uint8_t *)cache->v;
    kva__quant_args_scales(a, cache);
    kva__quant_args_common(a, ctx, plan, cache, sinks, out, lse);
    a.hnd = cd->layout == KVA_LAYOUT_HND;
    a.qdt = (int)d->q_dtype;
    if ((uintptr_t)q % kva_dtype_size(d->q_dtype) != 0)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "kva_attention_run: q = %p is not aligned to its %s elements", q,
                         kva_dtype_name(d->q_dtype));

    /* ROWS from the rows the plan's items actually hold (a plan partitioned
     * for the tensor-core decode may hold up to 16 per item, a GQA-4 decode
     * batch 4);
     * every item is cut into isub units of ROWS rows, isub from the plan's
     * bound cp->rows, so a captured graph replaying a later plan of the
     * same shape (larger items) still covers every row. */
    int32_t item_rows = 1;
    for (int32_t i = 0; i < plan->part->num_items; i++) {
        const kva__work_item *it = &plan->part->items[i];
        if (it->nq * it->nh > item_rows)
            item_rows = it->nq * it->nh;
    }
    int rows = 8;
    const qa_kernel_fn kfn = pick(cache, item_rows < cp->rows ? item_rows : cp->rows, &rows);
    a.isub = (cp->rows + rows - 1) / rows;
    /* A plan partitioned for the tensor-core decode (16-row items) over 1-byte
     * K and V: its items run on decode_mma_quant.cu, the prefill tiles (if
     * any) stay here; both write disjoint rows (or split partials) and the
     * merge below covers both. */
    const int mma =
        KVA__CUDA_QUANT_MMA && cp->decode_kernel == KVA__CUDA_K_DECODE_MMA &&
        cp->rows == KVA__CUDA_MMA_DECODE_ROWS &&
        kva__cuda_decode_mma_quant_supported(cd->quant, cd->dtype, a.D, a.Dv, d->q_dtype);
    if (mma) {
        KVA_TRY(kva__cuda_decode_mma_quant_run(ctx, plan, q, cache, sinks, out, lse));
        a.isub = 0; /* the kernel below runs only the prefill tiles */
    }
    /* Prefill tiles over covered formats and shapes run on the tensor-core
     * kernel (prefill_mma_quant.h) with the same tile list; rows disjoint
     * from the items'. A forced wgmma prefill has no quantized K/V path. */
    if (a.ptiles && cp->prefill_kernel != KVA__CUDA_PREFILL_AUTO &&
        cp->prefill_kernel != KVA__CUDA_PREFILL_MMA)
        return kva__fail(KVA_STATUS_UNSUPPORTED,
                         "kva_attention_run: the forced prefill kernel %s does not read %s caches",
                         kva__cuda_kernels[KVA__CUDA_K_PREFILL_WGMMA_TMA +
                                           (cp->prefill_kernel == KVA__CUDA_PREFILL_WGMMA)]
                             .name,
                         kva_quant_name(cd->quant));
    if (a.ptiles && kva__cuda_qprefill_usable(ctx, plan, q, cache)) {
        KVA_TRY(kva__cuda_qprefill_run(ctx, plan, q, cache, sinks, out, lse));
        a.ptiles = NULL;
    }
    int per_sm = 0;
    KVA_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kfn, QA_NW * 32, 0));
    if (per_sm < 1)
        return kva__fail(KVA_STATUS_DEVICE_ERROR,
                         "kva_attention_run: the quantized attention kernel (%s, D/Dv %d/%d) "
                         "cannot be resident on device %d",
                         kva_quant_name(cd->quant), (int)a.D, (int)a.Dv, (int)st->device);
    if (a.isub > 0 || a.ptiles) {
        kfn<<<st->num_sms * per_sm, QA_NW * 32, 0, stream>>>(a);
        KVA_CUDA_LAUNCHED("qa_kernel");
    }
    /* Always launched (it exits when the plan has no split task: graph
     * replay), except after the tensor-core decode, which merged every split
     * task itself (the prefill tiles write no partials). */
    if (mma)
        return KVA_STATUS_OK;
    return kva__cuda_split_merge_launch(&a.meta, a.ws, sinks, out, lse, a.H, a.G, a.Dv, d->q_dtype,
                                        st->num_sms * 2, stream);
}
