/*
 * prefill_mma_common.cuh - device pieces shared by the mma.sync prefill
 * kernels: prefill_mma.cu (f16 / bf16 cache) and prefill_mma_quant.cuh
 * (quantized caches). Both run FlashAttention-2 over one tile of TILE_M =
 * 128 packed (token, group head) rows per CTA (prefill_mma.h), WM m16 tiles
 * per warp, BN keys per key tile, online softmax in log2 units; the pieces
 * here are the parts whose logic is the same in both and whose machine
 * code does not change when moved here (checked with nvdisasm for sm_80 and
 * sm_90a): ldmatrix addressing, the rows' positions and heads, the
 * accumulator init and O += P V. S = Q K^T, the score transform and masks,
 * the online softmax and the row end stay in each kernel: moved here, they
 * compiled to other instruction schedules.
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

#endif /* KVA_CUDA_PREFILL_MMA_COMMON_CUH */
