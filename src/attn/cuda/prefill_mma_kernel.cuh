/*
 * prefill_mma_kernel.cuh - the one body of the mma.sync prefill: paged
 * prefill / chunked prefill attention on tensor cores (mma.sync m16n8k16,
 * fp32 accumulation), sm_80 and later. What the cache format changes enters
 * as a load policy P (below): prefill_mma.cu holds the 16-bit policy (f16 /
 * bf16 K and V) and its host side, prefill_mma_quant.cuh the quantized one
 * (int8 / fp8 codes and their scales), instantiated per format in
 * prefill_mma_quant_{i8,i8t,fp8,v16}.cu so the build compiles them in
 * parallel.
 *
 * FlashAttention-2 structure (docs/cuda-prefill.md, "Design"): one CTA = one
 * tile of TILE_M = 128 packed rows (row m = i * G + g) of one (request, kv
 * head), see prefill_mma.h; Q staged once, K/V tiles gathered by cp.async two
 * stages deep into XOR-swizzled shared memory, S and O on mma.sync, online
 * softmax in log2 units. Key rows outside [kv_lo, kv_hi) are zero-filled and
 * their block-table entries never read, so no P V product meets a NaN there.
 *
 * A load policy P gives (static members unless said otherwise):
 *   Args            the kernel's argument struct; attn(q) its prefill
 *                   arguments (kva__cuda_prefill_args)
 *   D, BN, NW, WM, MINB: head size (= Dv), keys per tile, warps, m16 tiles
 *                   per warp (NW * WM * 16 == TILE_M), CTAs per SM of
 *                   __launch_bounds__; SMEM: dynamic shared bytes (Q at 0)
 *   Ty (q / out dtype), TyS (S = Q K^T), TyP (P and V of O += P V): the
 *                   mma types of mma_ptx.cuh; LO: a second Q tile (lo) at
 *                   byte SQ added into S
 *   KV_FIRST        the first key tile's copy is issued before Q is staged
 *   CONVERT         the next tile's copy is issued before this tile's math
 *                   and convert(st) (with its barrier) runs then; else the
 *                   copy is issued after S and the iteration ends with a
 *                   barrier
 *   Blocks          the block ids a thread reads for one key tile's copy
 *   members of an object P(q, t, smem) built per thread:
 *     blocks(n0, b), copy(st, n0, b): the two phases of a key tile's gather
 *                   into stage st (block ids first, so their latency hides
 *                   behind S = Q K^T), stage_q(): Q into shared memory,
 *     q_ready(warp, g4): after Q is staged and the first copy issued,
 *     convert(st), k_tile(st), v_tile(st): the shared addresses of the K and
 *                   V tiles the math reads, scores(s, st, t4): S to score
 *                   units (after S = Q K^T), vfix(c, l, x0, x1): O's columns
 *                   c, c + 1 to the output before normalization
 */
#ifndef KVA_CUDA_PREFILL_MMA_KERNEL_CUH
#define KVA_CUDA_PREFILL_MMA_KERNEL_CUH

extern "C" {
#include "internal.h"
}
#include "mma_ptx.cuh"
#include "prefill_mma.h"
#include "prefill_mma_common.cuh"
#include "tree_mask.cuh"

#include <cuda_runtime.h>

#include <stdint.h>

/* What both policies know of a CTA's tile: request r, first packed row m0,
 * kv head kvh, the request's shape, the keys [kv_lo, kv_hi) some row of the
 * tile may see, and where key j of kv head kvh lies in the cache (element
 * offset blk * blk_stride + slot * row_stride + head_off, blk = the block
 * table's entry for j / B, slot = j % B; a shift for B = 2^k). */
struct kva__pf_tile {
    int r, m0, kvh;
    int H, G, q_start, q_len, seq_len, rows, B;
    const int32_t *bt; /* the request's block-table row */
    int m_last, pos_min, pos_max, kv_lo, kv_hi;
    int Hkv, b_shift, row_stride, head_off;
    int64_t blk_stride;

    __device__ __forceinline__ bool key_in(int j) const
    {
        return j >= kv_lo && j < kv_hi;
    }
    /* Block id of key j, 0 (never read) outside [kv_lo, kv_hi). */
    __device__ __forceinline__ int key_block(int j) const
    {
        const int bi = b_shift >= 0 ? j >> b_shift : j / B;
        return key_in(j) ? bt[bi] : 0;
    }
    __device__ __forceinline__ int key_slot(int j) const
    {
        return b_shift >= 0 ? j & (B - 1) : j % B;
    }
};

/* S [WM][BN / 8][4] = Q K^T of one key tile (S zeroed by the caller): Q rows
 * at q_lane (plus a lo tile LO_OFF bytes on with LO), K [BN, D] at k_lane;
 * xo_q, xo_k from kva__pf_ldsm_lanes. */
template <int D, int WM, int BN, typename TyS, bool LO, int LO_OFF>
static __device__ __forceinline__ void kva__pf_qk(float s[WM][BN / 8][4], uint32_t q_lane,
                                                  uint32_t k_lane, const uint32_t xo_q[4],
                                                  const uint32_t xo_k[4])
{
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {
        uint32_t qa[WM][4], ql[WM][4];
#pragma unroll
        for (int mt = 0; mt < WM; mt++) {
            kva__ldsm_x4(q_lane + xo_q[kk & 3] + (kk >> 2) * 128 + mt * 16 * D * 2, qa[mt]);
            if (LO)
                kva__ldsm_x4(q_lane + LO_OFF + xo_q[kk & 3] + (kk >> 2) * 128 + mt * 16 * D * 2,
                             ql[mt]);
        }
#pragma unroll
        for (int p = 0; p < BN / 16; p++) {
            uint32_t kb[4];
            kva__ldsm_x4(k_lane + xo_k[kk & 3] + (kk >> 2) * 128 + p * 16 * D * 2, kb);
#pragma unroll
            for (int mt = 0; mt < WM; mt++) {
                TyS::mma(s[mt][2 * p], qa[mt], kb[0], kb[1]);
                TyS::mma(s[mt][2 * p + 1], qa[mt], kb[2], kb[3]);
                if (LO) {
                    TyS::mma(s[mt][2 * p], ql[mt], kb[0], kb[1]);
                    TyS::mma(s[mt][2 * p + 1], ql[mt], kb[2], kb[3]);
                }
            }
        }
    }
}

/* The prefill of load policy P (above). */
template <typename P>
__global__ void __launch_bounds__(P::NW * 32, P::MINB) prefill_mma_kernel(const typename P::Args q)
{
    constexpr int D = P::D, BN = P::BN, NW = P::NW, WM = P::WM;
    constexpr int TM = KVA__CUDA_PREFILL_TILE_M;
    static_assert(NW * WM * 16 == TM, "tile rows");
    static_assert(D % 64 == 0 && BN % 16 == 0, "sizes");
    constexpr int NB8 = BN / 8; /* n8 blocks of S */
    constexpr int DB8 = D / 8;  /* n8 blocks of O */
    const kva__cuda_prefill_args &a = P::attn(q);

    const int tile_idx = blockIdx.x;
    if (tile_idx >= *a.num_tiles)
        return;
    const int32_t *tile = a.tiles + (size_t)tile_idx * KVA__CUDA_PREFILL_TILE_INTS;
    extern __shared__ __align__(128) unsigned char smem[];

    kva__pf_tile t;
    t.r = tile[0];
    t.m0 = tile[1];
    t.kvh = tile[2];
    t.H = a.num_heads;
    t.G = a.num_heads / a.num_kv_heads;
    t.q_start = a.query_start_loc[t.r];
    t.q_len = a.query_start_loc[t.r + 1] - t.q_start;
    t.seq_len = a.seq_lens[t.r];
    t.rows = t.q_len * t.G; /* packed rows of this (request, kv head) */
    t.B = a.block_size;
    const int bt_stride =
        a.block_table_stride_dev ? *a.block_table_stride_dev : a.block_table_stride;
    t.bt = a.block_table + (size_t)t.r * bt_stride;
    /* The window and the local chunk give each row a first key (kva__first_key);
     * window_left >= KVA_MAX_SEQ_LEN excludes nothing. */
    const int window = a.window_left < KVA_MAX_SEQ_LEN ? a.window_left : -1;
    /* Positions of the tile's first and last valid rows (CTA-uniform). */
    t.m_last = min(t.m0 + TM, t.rows) - 1;
    t.pos_min = t.seq_len - t.q_len + t.m0 / t.G;
    t.pos_max = t.seq_len - t.q_len + t.m_last / t.G;
    t.kv_lo = kva__first_key(t.pos_min, window, a.attention_chunk);
    t.kv_hi = a.causal ? min(t.seq_len, t.pos_max + 1) : t.seq_len;
    t.Hkv = a.num_kv_heads;
    const int nhd = a.layout == KVA_LAYOUT_NHD;
    t.blk_stride = (int64_t)t.B * t.Hkv * D;
    t.row_stride = nhd ? t.Hkv * D : D;
    t.head_off = nhd ? t.kvh * D : t.kvh * t.B * D;
    t.b_shift = (t.B & (t.B - 1)) == 0 ? __ffs(t.B) - 1 : -1;

    P pol(q, t, smem);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

    const int n_first = t.kv_lo / BN;
    const int n_last = t.kv_hi > t.kv_lo ? (t.kv_hi - 1) / BN : n_first - 1;
    /* The first key tile: the last one (the diagonal, masked). */
    auto first_copy = [&]() {
        if (n_last >= n_first) {
            typename P::Blocks b;
            pol.blocks(n_last * BN, b);
            pol.copy(0, n_last * BN, b);
        }
        kva__cp_async_commit();
    };
    if constexpr (P::KV_FIRST)
        first_copy(); /* its latency hides behind the staging of Q */
    pol.stage_q();

    /* ---- per-thread rows: warp's m16 tile mt, half hf (row g or g + 8) ---- */
    const int g4 = lane >> 2, t4 = lane & 3;
    /* ldmatrix addressing and the rows' positions and heads. */
    uint32_t xo_q[4], xo_k[4], q_lane, k_row, v_row;
    kva__pf_ldsm_lanes<D, WM>(lane, warp, kva__smem_u32(smem), xo_q, xo_k, q_lane, k_row, v_row);
    int pos[WM][2], head[WM][2];
    kva__pf_rows<WM>(t.m0, warp, g4, t.m_last, t.G, t.seq_len, t.q_len, t.kvh, pos, head);
    kva__pf_mask<WM> mk;
    kva__pf_mask_init<WM>(mk, a, pos, t.seq_len, t.q_len, t.q_start, t.pos_min, t.pos_max);
    const float scale = a.scale > 0.0f ? a.scale : rsqrtf((float)D);
    const float softcap = a.softcap;
    const float score_mul = softcap > 0.0f ? scale / softcap : 0.0f; /* before tanh */
    const float cap_mul = softcap * KVA__PF_LOG2E;                   /* after tanh */
    const float scale_log2 = scale * KVA__PF_LOG2E;

    float o[WM][DB8][4];
    float m_run[WM][2], l_run[WM][2];
    kva__pf_init<WM, DB8>(o, m_run, l_run);
    if constexpr (!P::KV_FIRST)
        first_copy();
    pol.q_ready(warp, g4);

    /* Key tiles from the last (the diagonal, masked) down to the first. With
     * CONVERT the copy of tile n - 1 into the other stage is issued once the
     * codes of tile n landed and every warp passed the barrier (so also the
     * previous readers of the f16 tiles and of that stage are done), then
     * stage st is converted; else it is issued after S of tile n, and the
     * iteration ends with a barrier. */
    for (int n = n_last, it = 0; n >= n_first; n--, it++) {
        const int st = it & 1;
        const int has_next = n - 1 >= n_first;
        typename P::Blocks bn;
        P::clear(bn);
        if (has_next)
            pol.blocks((n - 1) * BN, bn);
        kva__cp_async_wait<0>();
        __syncthreads();
        if constexpr (P::CONVERT) {
            if (has_next)
                pol.copy(st ^ 1, (n - 1) * BN, bn);
            kva__cp_async_commit();
            pol.convert(st);
        }

        const int n0 = n * BN;
        /* S = Q K^T: [16 * WM, BN] per warp. */
        float s[WM][NB8][4];
#pragma unroll
        for (int mt = 0; mt < WM; mt++)
#pragma unroll
            for (int nb = 0; nb < NB8; nb++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    s[mt][nb][e] = 0.0f;
        kva__pf_qk<D, WM, BN, typename P::TyS, P::LO, P::SQ>(s, q_lane, pol.k_tile(st) + k_row,
                                                             xo_q, xo_k);

        if constexpr (!P::CONVERT) {
            if (has_next)
                pol.copy(st ^ 1, (n - 1) * BN, bn);
            kva__cp_async_commit();
        }
        pol.scores(s, st, t4);

        /* Scores and online softmax, in log2 units. Fast path (no soft-cap, no
         * ALiBi, no masked element in this tile: CTA-uniform): S stays raw and
         * mul = scale * log2(e) is applied in the exponent's FFMA. Otherwise S is
         * transformed to log2 units first (mul = 1), masked elements to -inf. */
        const int need_mask = kva__pf_mask_needed<WM, BN>(mk, n0);
        const int transform = need_mask || softcap > 0.0f || a.alibi_slopes != NULL;
        const float mul = transform ? 1.0f : scale_log2;
        if (transform)
            kva__pf_transform<WM, NB8>(s, mk, pos, head, a.alibi_slopes, softcap, scale_log2,
                                       score_mul, cap_mul, n0, t4);
        uint32_t pk[WM][NB8][2]; /* P in TyP, packed pairs */
        kva__pf_softmax<WM, NB8, DB8, typename P::TyP>(s, o, m_run, l_run, mul, pk);
        /* O += P V: P [16 * WM, BN] from registers, V [BN, D]. */
        kva__pf_pv_tile<D, WM, BN, typename P::TyP>(o, pk, pol.v_tile(st) + v_row, xo_q);
        if constexpr (!P::CONVERT)
            __syncthreads(); /* stage st is overwritten by the next iteration's copy */
    }
    kva__cp_async_wait<0>();

    /* ---- epilogue: the policy's V fix, sink, normalization, out and lse ---- */
    kva__pf_row_end<D, WM, typename P::Ty>(
        a, o, m_run, l_run, head, t.m0, warp, g4, t4, t.rows, t.q_start, t.G,
        [&](int c, float lk, float &x0, float &x1) { pol.vfix(c, lk, x0, x1); });
}

/* Launches prefill_mma_kernel<P> over grid CTAs with its dynamic shared
 * memory (who: the caller's name for messages). */
template <typename P>
static kva_status kva__pf_launch(const typename P::Args &q, int grid, cudaStream_t stream,
                                 const char *who)
{
    const size_t smem = (size_t)P::SMEM;
    auto fn = prefill_mma_kernel<P>;
    cudaError_t e =
        cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess)
        return kva__fail(KVA_STATUS_DEVICE_ERROR,
                         "%s: cudaFuncSetAttribute(%zu bytes of shared memory, D = %d): %s", who,
                         smem, P::D, cudaGetErrorString(e));
    fn<<<grid, P::NW * 32, smem, stream>>>(q);
    e = cudaGetLastError();
    if (e != cudaSuccess)
        return kva__fail(KVA_STATUS_DEVICE_ERROR, "%s: launch of %d tiles (D = %d): %s", who, grid,
                         P::D, cudaGetErrorString(e));
    return KVA_STATUS_OK;
}

#endif /* KVA_CUDA_PREFILL_MMA_KERNEL_CUH */
