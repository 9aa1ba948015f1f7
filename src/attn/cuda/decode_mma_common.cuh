/*
 * decode_mma_common.cuh - the per-item steps of the tensor-core decode
 * (decode_mma_kernel.cuh, for every cache format; the MLA decodes use some):
 * the visible key range of the thread's rows, the logit transform, the
 * online-softmax update of rows g4 and g4 + 8 of an m16 tile, and the
 * end-of-item merge of the warps and the epilogue (out, lse, split partial,
 * sink).
 *
 * Fragment layout (mma m16n8k16, lane = 4 g4 + t4): S [16, 16] of one tile
 * of keys kb .. kb + 15 is sc[nt][e], row g4 + (e >> 1) * 8, key
 * kb + nt * 8 + 2 * t4 + (e & 1); O [16, D] is o[n][e], row g4 + (e >> 1) * 8.
 * Scores and m are in log2 units (scale * log2 e).
 */
#ifndef KVA_CUDA_DECODE_MMA_COMMON_CUH
#define KVA_CUDA_DECODE_MMA_COMMON_CUH

#include "dcp_pos.cuh"
#include "mma_ptx.cuh"
#include "tree_mask.cuh"

#include <math.h>
#include <stdint.h>

#define KVA__DMMA_LOG2E 1.4426950408889634f
#define KVA__DMMA_LN2 0.6931471805599453f

/* The thread's two rows g4 and g4 + 8 of item w (nrows rows, request of
 * s keys and q_len queries): visible keys [lo, hi), position, ALiBi slope
 * (log2 units); [lo_all, hi_all): the keys every row of the item sees (none
 * of a draft tree's keys, tree: the request's tree or NULL, tree_mask.cuh).
 * Row r is query r / w.nh, head r % w.nh. PERQ: one step per query (its
 * w.nh rows see the same keys) instead of one per row; the same results
 * (the MLA wgmma decode's 64-row items: 64 dependent steps with a division
 * each, before the item's first copies, became one or two). */
template <bool PERQ = false>
static __device__ __forceinline__ void
kva__dmma_rows(const kva__cuda_attn_args &a, const kva__cuda_item &w, int32_t nrows, int32_t s,
               int32_t q_len, int g4, int32_t lo[2], int32_t hi[2], int32_t pos[2], float slope[2],
               int32_t &lo_all, int32_t &hi_all, const kva__cuda_tree *tree = nullptr)
{
    lo_all = w.k0;
    hi_all = w.k1;
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        lo[hf] = 0;
        hi[hf] = 0;
        pos[hf] = 0;
        slope[hf] = 0.f;
    }
    if constexpr (PERQ) {
        /* rows r0 .. r0 + w.nh - 1 (below nrows) are query qi */
        for (int32_t r0 = 0, qi = 0; r0 < nrows && w.nh > 0; r0 += w.nh, qi++) {
            int32_t p, h_, l_;
            kva__cuda_row_keys(a.meta, a.causal, a.window_left, a.chunk, w.req, s, q_len, w.i0 + qi,
                               l_, h_, p);
            const int32_t rlo = l_ > w.k0 ? l_ : w.k0, rhi = h_ < w.k1 ? h_ : w.k1;
            lo_all = rlo > lo_all ? rlo : lo_all;
            hi_all = rhi < hi_all ? rhi : hi_all;
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                const int32_t r = g4 + hf * 8, hh = r - r0;
                if (hh >= 0 && hh < w.nh && r < nrows) {
                    lo[hf] = rlo;
                    hi[hf] = rhi;
                    pos[hf] = p;
                    if (a.has_alibi)
                        slope[hf] = a.meta.alibi[w.kv_head * a.G + w.h0 + hh] * KVA__DMMA_LOG2E;
                }
            }
        }
        if (tree && hi_all > tree->t0)
            hi_all = tree->t0;
        return;
    }
    for (int r = 0; r < nrows; r++) {
        const int32_t qi = r / w.nh, hh = r - qi * w.nh;
        int32_t p, h_, l_;
        kva__cuda_row_keys(a.meta, a.causal, a.window_left, a.chunk, w.req, s, q_len, w.i0 + qi, l_,
                           h_, p);
        const int32_t rlo = l_ > w.k0 ? l_ : w.k0, rhi = h_ < w.k1 ? h_ : w.k1;
        lo_all = rlo > lo_all ? rlo : lo_all;
        hi_all = rhi < hi_all ? rhi : hi_all;
#pragma unroll
        for (int hf = 0; hf < 2; hf++)
            if (r == g4 + hf * 8) {
                lo[hf] = rlo;
                hi[hf] = rhi;
                pos[hf] = p;
                if (a.has_alibi)
                    slope[hf] = a.meta.alibi[w.kv_head * a.G + w.h0 + hh] * KVA__DMMA_LOG2E;
            }
    }
    if (tree && hi_all > tree->t0)
        hi_all = tree->t0;
}

/* Logits of the tile of BN keys kb.. (BN / 8 n8 tiles: 16 for the bf16
 * kernel, 16 or 32 for the quantized one) in log2 units: soft-cap or scale
 * (PRE: sc is already scaled unless there is a soft-cap), then ALiBi and the
 * mask (with the draft tree, if tree is given), the mask only where some row
 * may not see some key of the tile. */
template <int BN, bool PRE = false>
static __device__ __forceinline__ void
kva__dmma_logits(float sc[][4], const kva__cuda_attn_args &a, float scale_log2, int32_t kb, int t4,
                 int32_t lo_all, int32_t hi_all, const int32_t lo[2], const int32_t hi[2],
                 const int32_t pos[2], const float slope[2], const kva__cuda_tree *tree = nullptr)
{
    const bool inside = kb >= lo_all && kb + BN <= hi_all;
    if (a.softcap > 0.f) {
#pragma unroll
        for (int nt = 0; nt < BN / 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                sc[nt][e] = a.softcap * tanhf(sc[nt][e] * a.scale / a.softcap) * KVA__DMMA_LOG2E;
    } else if (!PRE) {
#pragma unroll
        for (int nt = 0; nt < BN / 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                sc[nt][e] *= scale_log2;
    }
    if (a.has_alibi || !inside) {
        /* With a tree, the rows' visibility words of the step (tree_mask.cuh:
         * bit nt * 8 + e % 2 of row hf is key kb + 8 nt + 2 t4 + e % 2), built
         * once, so each element is one bit test and the row's tree word is read
         * once; without one (tree == nullptr, a compile-time constant at every
         * caller) the bounds are compared per element. */
        constexpr int NWD = (BN + 31) / 32;
        uint32_t vw[2][NWD];
        if (tree) {
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                const int32_t ti = pos[hf] - tree->t0;
                uint64_t tw = 0ull;
                if (kb + BN > tree->t0 && (uint32_t)ti < (uint32_t)tree->n)
                    tw = __ldg(tree->w + ti);
#pragma unroll
                for (int q = 0; q < NWD; q++)
                    vw[hf][q] =
                        kva__cuda_vis_word(kb + 2 * t4 + 32 * q, lo[hf], hi[hf], tree->t0, tw);
            }
        }
#pragma unroll
        for (int nt = 0; nt < BN / 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int hf = e >> 1;
                const int32_t j = kb + nt * 8 + 2 * t4 + (e & 1);
                const float x =
                    a.has_alibi ? fmaf(slope[hf], (float)(kva__cuda_key_pos(a.meta, j) - pos[hf]),
                                       sc[nt][e])
                                : sc[nt][e];
                const int i = nt * 8 + (e & 1);
                const bool vis =
                    tree ? ((vw[hf][i >> 5] >> (i & 31)) & 1u) != 0 : j >= lo[hf] && j < hi[hf];
                sc[nt][e] = vis ? x : -INFINITY;
            }
    }
}

/* The max of row g4 + 8 hf over NT n8 tiles of logits (the thread's keys,
 * then its 4 lanes): every tensor-core decode's and MLA kernel's tile max. */
template <int NT>
static __device__ __forceinline__ float kva__dmma_row_max(const float (*sc)[4], int hf)
{
    float mx = fmaxf(sc[0][2 * hf], sc[0][2 * hf + 1]);
#pragma unroll
    for (int nt = 1; nt < NT; nt++)
        mx = fmaxf(mx, fmaxf(sc[nt][2 * hf], sc[nt][2 * hf + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    return fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
}

/* Online softmax of rows g4 and g4 + 8 (4 lanes share a row) over NT n8
 * tiles of keys: m_run, l_run and O [16, D] (NO n8 tiles: D / 8 and any the
 * caller keeps beside them) rescaled, sc replaced by P. rows8 false (a
 * warp-uniform value: the item has at most 8 rows): rows 8-15 are no
 * attention rows; their P is 0 and their state is left as it is. */
template <int NO, int NT = 2>
static __device__ __forceinline__ void kva__dmma_softmax(float sc[][4], float m_run[2],
                                                         float l_run[2], float o[NO][4],
                                                         bool rows8 = true)
{
    if (!rows8) {
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            sc[nt][2] = 0.f;
            sc[nt][3] = 0.f;
        }
        const float m_new = fmaxf(m_run[0], kva__dmma_row_max<NT>(sc, 0));
        if (__any_sync(0xffffffffu, m_new != m_run[0])) {
            const float mu = m_new == -INFINITY ? 0.f : m_new;
            const float alpha = kva__ex2(m_run[0] - mu); /* 0 while m_run = -inf */
            m_run[0] = m_new;
            l_run[0] *= alpha;
#pragma unroll
            for (int n = 0; n < NO; n++) {
                o[n][0] *= alpha;
                o[n][1] *= alpha;
            }
        }
        const float mu = m_run[0] == -INFINITY ? 0.f : m_run[0];
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const float p = kva__ex2(sc[nt][e] - mu);
                sc[nt][e] = p;
                l_run[0] += p;
            }
        return;
    }
    float m_new[2];
#pragma unroll
    for (int hf = 0; hf < 2; hf++)
        m_new[hf] = fmaxf(m_run[hf], kva__dmma_row_max<NT>(sc, hf));
    if (__any_sync(0xffffffffu, m_new[0] != m_run[0] || m_new[1] != m_run[1])) {
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            const float mu = m_new[hf] == -INFINITY ? 0.f : m_new[hf];
            const float alpha = kva__ex2(m_run[hf] - mu); /* 0 while m_run = -inf */
            m_run[hf] = m_new[hf];
            l_run[hf] *= alpha;
#pragma unroll
            for (int n = 0; n < NO; n++) {
                o[n][2 * hf] *= alpha;
                o[n][2 * hf + 1] *= alpha;
            }
        }
    }
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        const float mu = m_run[hf] == -INFINITY ? 0.f : m_run[hf];
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const float p = kva__ex2(sc[nt][2 * hf + e] - mu);
                sc[nt][2 * hf + e] = p;
                l_run[hf] += p;
            }
    }
}

/* P [16, 16] as the A operand of an m16n8k16 mma (Ty: kva__mma_bf16 or
 * kva__mma_f16). */
template <typename Ty>
static __device__ __forceinline__ void kva__dmma_pack_p(const float sc[2][4], uint32_t pa[4])
{
    pa[0] = Ty::pack(sc[0][0], sc[0][1]);
    pa[1] = Ty::pack(sc[0][2], sc[0][3]);
    pa[2] = Ty::pack(sc[1][0], sc[1][1]);
    pa[3] = Ty::pack(sc[1][2], sc[1][3]);
}

/* Row sums of l over the 4 lanes of a row. */
static __device__ __forceinline__ void kva__dmma_row_sums(float l_run[2])
{
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        l_run[hf] += __shfl_xor_sync(0xffffffffu, l_run[hf], 1);
        l_run[hf] += __shfl_xor_sync(0xffffffffu, l_run[hf], 2);
    }
}

/* Merge of the NW warps' states of row r, channels d .. d + CW - 1: s_m,
 * s_l [NW][M], s_acc [NW][M][D] fp32, warp w's [M][D] at s_acc + w * WS. M:
 * the row max over the warps, mu: M or 0 when -inf, L and O[i]: sum and
 * O[r, d + i] relative to mu. The row's weights are computed once for its CW
 * channels, whose loads and sums are independent (one thread's epilogue is a
 * latency-bound chain: a CTA has one warp per scheduler). */
template <int NW, int M_, int D, int WS, int CW>
static __device__ __forceinline__ void
kva__dmma_merge(const float (*s_m)[M_], const float (*s_l)[M_], const float *s_acc, int32_t r,
                int32_t d, float &M, float &mu, float &L, float O[CW])
{
    M = -INFINITY;
#pragma unroll
    for (int ww = 0; ww < NW; ww++)
        M = fmaxf(M, s_m[ww][r]);
    mu = M == -INFINITY ? 0.f : M;
    L = 0.f;
#pragma unroll
    for (int i = 0; i < CW; i++)
        O[i] = 0.f;
#pragma unroll
    for (int ww = 0; ww < NW; ww++) {
        const float c = kva__ex2(s_m[ww][r] - mu);
        L += s_l[ww][r] * c;
        const float *src = s_acc + (size_t)ww * WS + r * D + d;
        float x[CW];
        if constexpr (CW == 4) {
            const float4 v = *reinterpret_cast<const float4 *>(src);
            x[0] = v.x, x[1] = v.y, x[2] = v.z, x[3] = v.w;
        } else {
#pragma unroll
            for (int i = 0; i < CW; i++)
                x[i] = src[i];
        }
#pragma unroll
        for (int i = 0; i < CW; i++)
            O[i] += x[i] * c;
    }
}

/* Writes elements (r, d .. d + CW - 1) of item w: the split partial (out
 * over the chunk's keys, lse without the sink) into blk, the item's block of
 * its task's partials ([nrows, D] then [nrows] lse; split items only: the
 * caller reads the task once per item), or out (St::store, St::elem) and
 * lse, the sink entering here. The row's values (head, token, its lse) once
 * for its CW channels; each channel's arithmetic as for one. */
template <int D, typename St, int CW>
static __device__ __forceinline__ void
kva__dmma_write(const kva__cuda_attn_args &a, const kva__cuda_item &w, int32_t nrows, int32_t qs,
                int32_t r, int32_t d, float M, float mu, float L, const float O[CW], float *blk)
{
    const int32_t qi = r / w.nh, hh = r - qi * w.nh;
    const int32_t head = w.kv_head * a.G + w.h0 + hh;
    const int64_t tok = qs + w.i0 + qi;
    if (w.task >= 0) {
#pragma unroll
        for (int i = 0; i < CW; i++)
            blk[(int64_t)r * D + d + i] = L > 0.f ? O[i] / L : 0.f;
        if (d == 0)
            blk[(int64_t)nrows * D + r] =
                L > 0.f ? (mu + log2f(L)) * KVA__DMMA_LN2 : (L == 0.f ? -INFINITY : L);
    } else {
        float Mt = M, sink2 = -INFINITY;
        if (a.sinks) {
            sink2 = a.sinks[head] * KVA__DMMA_LOG2E;
            Mt = fmaxf(M, sink2);
        }
        const float mt = Mt == -INFINITY ? 0.f : Mt;
        const float cf = exp2f(mu - mt);
        const float Lt = L * cf + (a.sinks ? exp2f(sink2 - mt) : 0.f);
        typename St::elem *dst = (typename St::elem *)a.out + (tok * a.H + head) * D + d;
#pragma unroll
        for (int i = 0; i < CW; i++)
            St::store(dst + i, Lt > 0.f ? O[i] * cf / Lt : (Lt == 0.f ? 0.f : Lt));
        if (a.lse && d == 0)
            a.lse[tok * a.H + head] =
                Lt > 0.f ? (mt + log2f(Lt)) * KVA__DMMA_LN2 : (Lt == 0.f ? -INFINITY : Lt);
    }
}

#endif
