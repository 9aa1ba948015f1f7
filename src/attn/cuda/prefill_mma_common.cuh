/*
 * prefill_mma_common.cuh - device pieces of the mma.sync prefill's one body
 * (prefill_mma_kernel.cuh, with its 16-bit and quantized load policies),
 * some of them also used by the wgmma prefill (prefill_wgmma_kernel.cuh):
 * ldmatrix addressing, the rows' positions and heads, the accumulator init,
 * the score transform and masks (folded into per-row bounds and visibility
 * words), the online softmax (one tile of TILE_M = 128 packed (token, group
 * head) rows per CTA, WM m16 tiles per warp, BN keys per key tile, log2
 * units), O += P V and the row end (the quantized policy's V scales as a
 * functor).
 * C-style CUDA; templates only for compile-time sizes.
 */
#ifndef KVA_CUDA_PREFILL_MMA_COMMON_CUH
#define KVA_CUDA_PREFILL_MMA_COMMON_CUH

extern "C" {
#include "internal.h"
}
#include "mma_ptx.cuh"
#include "prefill_mma.h"
#include "tree_mask.cuh"

#include <math.h>
#include <stdint.h>

#define KVA__PF_LOG2E 1.4426950408889634f
#define KVA__PF_LN2 0.6931471805599453f

/*
 * ldmatrix addresses without a register per (row, chunk) pair. Every lane
 * reads rows with row & 7 == lane & 7 at logical chunk 2 * kk + b (b = one
 * lane bit), so its physical chunk is 8 * (kk >> 2) + ((2 * (kk & 3)) ^ y)
 * with y = b ^ (lane & 7): four byte offsets per lane (xo_*) plus immediates.
 * Q (A operand) and V (B operand, transposed) take b = lane >> 4; K (B
 * operand) takes b = (lane >> 3) & 1 and rows 8..15 for lanes 16..31.
 * q_lane: this lane's row of the warp's Q rows [16 * WM, D] at sQ; k_row,
 * v_row: byte offsets of this lane's rows in a K / V tile [BN, D].
 */
template <int D, int WM>
static __device__ __forceinline__ void
kva__pf_ldsm_lanes(int lane, int warp, uint32_t sQ, uint32_t xo_q[4], uint32_t xo_k[4],
                   uint32_t &q_lane, uint32_t &k_row, uint32_t &v_row)
{
#pragma unroll
    for (int c = 0; c < 4; c++) {
        xo_q[c] = (uint32_t)(((2 * c) ^ ((lane >> 4) ^ (lane & 7))) * 16);
        xo_k[c] = (uint32_t)(((2 * c) ^ (((lane >> 3) & 1) ^ (lane & 7))) * 16);
    }
    q_lane = sQ + (uint32_t)((warp * 16 * WM + (lane & 15)) * D * 2);
    k_row = (uint32_t)(((lane & 7) + ((lane >> 4) << 3)) * D * 2);
    v_row = (uint32_t)(((lane & 7) + (((lane >> 3) & 1) << 3)) * D * 2);
}

/* Position (pos) and query head (head) of this thread's rows: m16 tile mt of
 * the warp, half hf (row g4 or g4 + 8); rows past m_last take m_last's. */
template <int WM>
static __device__ __forceinline__ void kva__pf_rows(int m0, int warp, int g4, int m_last, int G,
                                                    int seq_len, int q_len, int kvh, int pos[WM][2],
                                                    int head[WM][2])
{
#pragma unroll
    for (int mt = 0; mt < WM; mt++)
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            const int pm = min(m0 + warp * 16 * WM + mt * 16 + hf * 8 + g4, m_last);
            const int i = pm / G;
            pos[mt][hf] = seq_len - q_len + i;
            head[mt][hf] = kvh * G + (pm - i * G);
        }
}

/* O = 0, running max -inf, running sum 0. */
template <int WM, int DB8>
static __device__ __forceinline__ void kva__pf_init(float o[WM][DB8][4], float m_run[WM][2],
                                                    float l_run[WM][2])
{
#pragma unroll
    for (int mt = 0; mt < WM; mt++) {
#pragma unroll
        for (int db = 0; db < DB8; db++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                o[mt][db][e] = 0.0f;
        m_run[mt][0] = m_run[mt][1] = -INFINITY;
        l_run[mt][0] = l_run[mt][1] = 0.0f;
    }
}

/* O += P V for keys 16 * kk .. 16 * kk + 16 of the tile: pa [WM][4] the A
 * fragments of P, V [BN, D] at v_lane (kva__pf_ldsm_lanes' v_row added). */
template <int D, int WM, typename Ty>
static __device__ __forceinline__ void kva__pf_pv(float o[WM][D / 8][4], uint32_t pa[WM][4],
                                                  uint32_t v_lane, const uint32_t xo_q[4], int kk)
{
#pragma unroll
    for (int dp = 0; dp < D / 16; dp++) {
        uint32_t vb[4];
        kva__ldsm_x4_trans(v_lane + xo_q[dp & 3] + (dp >> 2) * 128 + kk * 16 * D * 2, vb);
#pragma unroll
        for (int mt = 0; mt < WM; mt++) {
            Ty::mma(o[mt][2 * dp], pa[mt], vb[0], vb[1]);
            Ty::mma(o[mt][2 * dp + 1], pa[mt], vb[2], vb[3]);
        }
    }
}

/*
 * The mask of a CTA tile, folded into per-row bounds when the tile starts:
 * row (mt, hf) sees keys lo <= j < hi (causal, seq_len, window and chunk)
 * and, among the draft-tree keys j >= tree.t0, those set in its tree word
 * (tree_mask.cuh). hi_min and lo_max (the smallest hi, the largest lo of the
 * tile: CTA-uniform) tell which key tiles need the per-element mask.
 */
template <int WM> struct kva__pf_mask {
    int lo[WM][2], hi[WM][2];
    int hi_min, lo_max;
    kva__cuda_tree tree;
};

/* The mask of the tile whose rows sit at pos (kva__pf_rows), positions
 * pos_min .. pos_max, of the request whose query tokens start at q_start. */
template <int WM>
static __device__ __forceinline__ void
kva__pf_mask_init(kva__pf_mask<WM> &mk, const kva__cuda_prefill_args &a, const int pos[WM][2],
                  int seq_len, int q_len, int q_start, int pos_min, int pos_max)
{
    /* window_left >= KVA_MAX_SEQ_LEN excludes nothing. */
    const int window = a.window_left < KVA_MAX_SEQ_LEN ? a.window_left : -1;
#pragma unroll
    for (int mt = 0; mt < WM; mt++)
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            mk.lo[mt][hf] = kva__first_key(pos[mt][hf], window, a.attention_chunk);
            mk.hi[mt][hf] = a.causal ? min(seq_len, pos[mt][hf] + 1) : seq_len;
        }
    mk.hi_min = a.causal ? min(seq_len, pos_min + 1) : seq_len;
    mk.lo_max = kva__first_key(pos_max, window, a.attention_chunk);
    mk.tree = kva__cuda_tree_at(a.tree, a.tree_on ? *a.tree_on : 0, q_start, seq_len, q_len);
}

/* Whether some row of the tile may not see some key of n0 .. n0 + BN. */
template <int WM, int BN>
static __device__ __forceinline__ bool kva__pf_mask_needed(const kva__pf_mask<WM> &mk, int n0)
{
    return n0 + BN > mk.hi_min || n0 < mk.lo_max || n0 + BN > mk.tree.t0;
}

/*
 * Scores s [WM][NB8][4] of key tile n0 in log2 units (element e of n8 block
 * nb: row half e / 2, key n0 + 8 nb + 2 t4 + e % 2): soft-cap or the scale,
 * ALiBi (alibi: [H] slopes or NULL; head: the rows' query heads), masked
 * elements -inf. The rows' visibility words are built once per tile, so the
 * per-element test is one bit test at a constant position.
 */
template <int WM, int NB8>
static __device__ __forceinline__ void
kva__pf_transform(float s[WM][NB8][4], const kva__pf_mask<WM> &mk, const int pos[WM][2],
                  const int head[WM][2], const float *alibi, float softcap, float scale_log2,
                  float score_mul, float cap_mul, int n0, int t4)
{
    constexpr int NWD = (NB8 * 8 + 31) / 32; /* visibility words per row */
#pragma unroll
    for (int mt = 0; mt < WM; mt++) {
        float sl[2] = {0.0f, 0.0f};
        if (alibi) {
            sl[0] = alibi[head[mt][0]] * KVA__PF_LOG2E;
            sl[1] = alibi[head[mt][1]] * KVA__PF_LOG2E;
        }
        uint32_t vis[2][NWD];
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            const int ti = pos[mt][hf] - mk.tree.t0; /* the row's tree index */
            uint64_t tw = 0ull;
            if (n0 + NB8 * 8 > mk.tree.t0 && (uint32_t)ti < (uint32_t)mk.tree.n)
                tw = __ldg(mk.tree.w + ti);
#pragma unroll
            for (int q = 0; q < NWD; q++)
                vis[hf][q] = kva__cuda_vis_word(n0 + 2 * t4 + 32 * q, mk.lo[mt][hf], mk.hi[mt][hf],
                                                mk.tree.t0, tw);
        }
#pragma unroll
        for (int nb = 0; nb < NB8; nb++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int hf = e >> 1, i = nb * 8 + (e & 1);
                float x = s[mt][nb][e];
                x = softcap > 0.0f ? cap_mul * tanhf(x * score_mul) : x * scale_log2;
                x += sl[hf] * (float)(n0 + i + 2 * t4 - pos[mt][hf]);
                s[mt][nb][e] = (vis[hf][i >> 5] >> (i & 31)) & 1u ? x : -INFINITY;
            }
    }
}

/*
 * Online softmax of the tile's scores s [WM][NB8][4] (log2 units once
 * multiplied by mul: 1 after kva__pf_transform, else scale * log2(e)) for
 * the thread's rows: m_run and l_run (per-thread partial sums, from P in
 * fp32) updated, O [WM][DB8][4] rescaled lazily (the reference max moves only
 * when some row of the warp grows past it by more than 8, so weights stay
 * <= 2^8; exact for any reference, as l and O share it), and P packed in TyP
 * into pk: pk[mt][nb][hf] = keys 8 nb + 2 t4, + 1 of row half hf, which are
 * the A fragments of O += P V (kva__pf_pv_tile).
 */
template <int WM, int NB8, int DB8, typename TyP>
static __device__ __forceinline__ void kva__pf_softmax(float s[WM][NB8][4], float o[WM][DB8][4],
                                                       float m_run[WM][2], float l_run[WM][2],
                                                       float mul, uint32_t pk[WM][NB8][2])
{
#pragma unroll
    for (int mt = 0; mt < WM; mt++) {
        float m_new[2];
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            float mx = -INFINITY;
#pragma unroll
            for (int nb = 0; nb < NB8; nb++)
                mx = fmaxf(mx, fmaxf(s[mt][nb][2 * hf], s[mt][nb][2 * hf + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            m_new[hf] = fmaxf(m_run[mt][hf], mx * mul);
        }
        const bool rescale = __any_sync(0xffffffffu, m_new[0] > m_run[mt][0] + 8.0f ||
                                                         m_new[1] > m_run[mt][1] + 8.0f);
        if (rescale) {
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                const float m_use = m_new[hf] == -INFINITY ? 0.0f : m_new[hf];
                const float alpha = kva__ex2(m_run[mt][hf] - m_use); /* 0 while m_run = -inf */
                m_run[mt][hf] = m_new[hf];
                l_run[mt][hf] *= alpha;
#pragma unroll
                for (int db = 0; db < DB8; db++) {
                    o[mt][db][2 * hf] *= alpha;
                    o[mt][db][2 * hf + 1] *= alpha;
                }
            }
        }
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            const float m_use = m_run[mt][hf] == -INFINITY ? 0.0f : m_run[mt][hf];
            float sum = 0.0f;
#pragma unroll
            for (int nb = 0; nb < NB8; nb++) {
                const float p0 = kva__ex2(fmaf(s[mt][nb][2 * hf], mul, -m_use));
                const float p1 = kva__ex2(fmaf(s[mt][nb][2 * hf + 1], mul, -m_use));
                pk[mt][nb][hf] = TyP::pack(p0, p1);
                sum += p0 + p1;
            }
            l_run[mt][hf] += sum; /* per-thread partial */
        }
    }
}

/* O += P V over the tile's BN keys: pk from kva__pf_softmax, V [BN, D] at
 * v_lane (TyP: V's dtype). */
template <int D, int WM, int BN, typename TyP>
static __device__ __forceinline__ void kva__pf_pv_tile(float o[WM][D / 8][4],
                                                       const uint32_t pk[WM][BN / 8][2],
                                                       uint32_t v_lane, const uint32_t xo_q[4])
{
#pragma unroll
    for (int kk = 0; kk < BN / 16; kk++) {
        uint32_t pa[WM][4];
#pragma unroll
        for (int mt = 0; mt < WM; mt++) {
            pa[mt][0] = pk[mt][2 * kk][0];
            pa[mt][1] = pk[mt][2 * kk][1];
            pa[mt][2] = pk[mt][2 * kk + 1][0];
            pa[mt][3] = pk[mt][2 * kk + 1][1];
        }
        kva__pf_pv<D, WM, TyP>(o, pa, v_lane, xo_q, kk);
    }
}

/* The end of one row's online softmax (log2 units): l its sum of P over
 * all lanes, m its reference max; with sinks ([H] logits, or NULL) the
 * head's sink joins the denominator. inv normalizes O, lse in natural log
 * units; a row with no visible key and no sink gets inv 0 and lse -inf (a
 * NaN l, from a NaN score, falls through). */
static __device__ __forceinline__ void kva__pf_row_norm(float l, float m, const float *sinks,
                                                        int head, float &inv, float &lse)
{
    float f = 1.0f;
    if (sinks) {
        const float sink2 = sinks[head] * KVA__PF_LOG2E;
        const float m_f = fmaxf(m, sink2);
        f = kva__ex2(m - m_f); /* 0 when m = -inf */
        l = l * f + kva__ex2(sink2 - m_f);
        m = m_f;
    }
    inv = l == 0.0f ? 0.0f : f / l;
    lse = l == 0.0f ? -INFINITY : (m + __log2f(l)) * KVA__PF_LN2;
}

/*
 * The row end: sink, normalization, out [T, H, D] and lse of the thread's
 * rows (row m0 + 16 (WM warp + mt) + 8 hf + g4 of the packed rows; rows past
 * `rows` are padding). vfix(c, lk, x0, x1) turns O's columns c, c + 1 into
 * the output before the normalization (lk: the row's sum of P; the quantized
 * kernel's V scales and offsets; nothing for a float cache).
 */
template <int D, int WM, typename Ty, typename VFix>
static __device__ __forceinline__ void
kva__pf_row_end(const kva__cuda_prefill_args &a, const float o[WM][D / 8][4],
                const float m_run[WM][2], const float l_run[WM][2], const int head[WM][2], int m0,
                int warp, int g4, int t4, int rows, int q_start, int G, VFix vfix)
{
    typedef typename Ty::elem elem;
    elem *out = (elem *)a.out;
#pragma unroll
    for (int mt = 0; mt < WM; mt++)
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            float lk = l_run[mt][hf];
            lk += __shfl_xor_sync(0xffffffffu, lk, 1);
            lk += __shfl_xor_sync(0xffffffffu, lk, 2);
            float inv, lse;
            kva__pf_row_norm(lk, m_run[mt][hf], a.sinks, head[mt][hf], inv, lse);
            const int pm = m0 + warp * 16 * WM + mt * 16 + hf * 8 + g4;
            if (pm >= rows)
                continue;
            const size_t orow = (size_t)(q_start + pm / G) * a.num_heads + head[mt][hf];
            elem *dst = out + orow * D;
#pragma unroll
            for (int db = 0; db < D / 8; db++) {
                const int c = db * 8 + 2 * t4;
                float x0 = o[mt][db][2 * hf], x1 = o[mt][db][2 * hf + 1];
                vfix(c, lk, x0, x1);
                *(uint32_t *)(dst + c) = Ty::pack(x0 * inv, x1 * inv);
            }
            if (a.lse && t4 == 0)
                a.lse[orow] = lse;
        }
}

#endif /* KVA_CUDA_PREFILL_MMA_COMMON_CUH */
