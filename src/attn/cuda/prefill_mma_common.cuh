/*
 * prefill_mma_common.cuh - device pieces shared by the mma.sync prefill
 * kernels: prefill_mma.cu (f16 / bf16 cache) and prefill_mma_quant.cuh
 * (quantized caches). Both run FlashAttention-2 over one tile of TILE_M =
 * 128 packed (token, group head) rows per CTA (prefill_mma.h), WM m16 tiles
 * per warp, BN keys per key tile, online softmax in log2 units; the pieces
 * here are the parts whose logic is the same in both: ldmatrix addressing,
 * the rows' positions and heads, S = Q K^T, the online softmax, O += P V,
 * and the per-row end (sink, 1 / l, lse). The score transform and masks
 * stay in each kernel (moved here they compiled to other instructions).
 * C-style CUDA; templates only for compile-time sizes.
 */
#ifndef KVA_CUDA_PREFILL_MMA_COMMON_CUH
#define KVA_CUDA_PREFILL_MMA_COMMON_CUH

extern "C" {
#include "internal.h"
}
#include "mma_ptx.cuh"
#include "prefill_mma.h"

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

/*
 * S = Q K^T for one key tile: s [WM][BN / 8][4] (the warp's [16 * WM, BN]),
 * from Q rows at q_lane (LO: plus a second pass over the Q rows lo_off bytes
 * further, the lo half of a hi + lo split) and the K tile at k_lane.
 */
template <int D, int BN, int WM, bool LO, typename Ty>
static __device__ __forceinline__ void kva__pf_qk(float s[WM][BN / 8][4], uint32_t q_lane,
                                                  uint32_t k_lane, const uint32_t xo_q[4],
                                                  const uint32_t xo_k[4], uint32_t lo_off)
{
#pragma unroll
    for (int mt = 0; mt < WM; mt++)
#pragma unroll
        for (int nb = 0; nb < BN / 8; nb++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                s[mt][nb][e] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {
        uint32_t qa[WM][4], ql[WM][4];
#pragma unroll
        for (int mt = 0; mt < WM; mt++) {
            kva__ldsm_x4(q_lane + xo_q[kk & 3] + (kk >> 2) * 128 + mt * 16 * D * 2, qa[mt]);
            if (LO)
                kva__ldsm_x4(q_lane + lo_off + xo_q[kk & 3] + (kk >> 2) * 128 + mt * 16 * D * 2,
                             ql[mt]);
        }
#pragma unroll
        for (int p = 0; p < BN / 16; p++) {
            uint32_t kb[4];
            kva__ldsm_x4(k_lane + xo_k[kk & 3] + (kk >> 2) * 128 + p * 16 * D * 2, kb);
#pragma unroll
            for (int mt = 0; mt < WM; mt++) {
                Ty::mma(s[mt][2 * p], qa[mt], kb[0], kb[1]);
                Ty::mma(s[mt][2 * p + 1], qa[mt], kb[2], kb[3]);
                if (LO) {
                    Ty::mma(s[mt][2 * p], ql[mt], kb[0], kb[1]);
                    Ty::mma(s[mt][2 * p + 1], ql[mt], kb[2], kb[3]);
                }
            }
        }
    }
}

/*
 * Online softmax of one m16 tile: s [NB8][4] (scores times mul = log2 units)
 * becomes P = 2^(s * mul - m_run), O [DB8][4] and l_run are rescaled when the
 * running max moves, l_run gets this thread's partial row sums. PACK: P goes
 * to pk [NB8][2] as TyP pairs (s is left as it was) instead of back to s.
 * LAZY: keep the reference max (and skip rescaling O) until some row of the
 * warp grows past it by more than 8, so that weights stay <= 2^8; exact for
 * any reference, as l and O share it.
 */
template <int NB8, int DB8, bool LAZY, bool PACK, typename TyP>
static __device__ __forceinline__ void kva__pf_softmax(float s[NB8][4], float o[DB8][4],
                                                       float m_run[2], float l_run[2], float mul,
                                                       uint32_t pk[][2])
{
    float m_new[2];
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        float mx = -INFINITY;
#pragma unroll
        for (int nb = 0; nb < NB8; nb++)
            mx = fmaxf(mx, fmaxf(s[nb][2 * hf], s[nb][2 * hf + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        m_new[hf] = fmaxf(m_run[hf], mx * mul);
    }
    const bool rescale =
        !LAZY || __any_sync(0xffffffffu, m_new[0] > m_run[0] + 8.0f || m_new[1] > m_run[1] + 8.0f);
    if (rescale) {
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            const float m_use = m_new[hf] == -INFINITY ? 0.0f : m_new[hf];
            const float alpha = kva__ex2(m_run[hf] - m_use); /* 0 while m_run = -inf */
            m_run[hf] = m_new[hf];
            l_run[hf] *= alpha;
#pragma unroll
            for (int db = 0; db < DB8; db++) {
                o[db][2 * hf] *= alpha;
                o[db][2 * hf + 1] *= alpha;
            }
        }
    }
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        const float m_use = m_run[hf] == -INFINITY ? 0.0f : m_run[hf];
        float sum = 0.0f;
#pragma unroll
        for (int nb = 0; nb < NB8; nb++) {
            const float p0 = kva__ex2(fmaf(s[nb][2 * hf], mul, -m_use));
            const float p1 = kva__ex2(fmaf(s[nb][2 * hf + 1], mul, -m_use));
            if (PACK) {
                pk[nb][hf] = TyP::pack(p0, p1);
            } else {
                s[nb][2 * hf] = p0;
                s[nb][2 * hf + 1] = p1;
            }
            sum += p0 + p1;
        }
        l_run[hf] += sum; /* per-thread partial */
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
 * End of one row: l_part is this thread's partial sum of P; returns the row
 * sum (over the four lanes of the row) and sets inv (the factor of O: the
 * sink's share of the denominator included, 0 when no key is visible and
 * there is no sink) and lse (natural log units; -inf for an empty row). NaN
 * l (a NaN score) falls through. sinks: per query head, or NULL.
 */
static __device__ __forceinline__ float kva__pf_row_end(float l_part, float m, const float *sinks,
                                                        int head, float &inv, float &lse)
{
    float l = l_part;
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const float l_keys = l;
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
    return l_keys;
}

#endif /* KVA_CUDA_PREFILL_MMA_COMMON_CUH */
