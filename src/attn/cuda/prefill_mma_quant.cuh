/*
 * prefill_mma_quant.cuh - the tensor-core paged prefill kernel over quantized
 * caches (prefill_mma_quant.h), included by the per-format instantiation
 * files prefill_mma_quant_*.cu (one translation unit per format, so the
 * instantiations compile in parallel).
 *
 * prefill_mma.cu's FlashAttention-2 kernel (128 packed (token, head) rows
 * per CTA, key tiles from the diagonal down, online softmax in log2 units,
 * lazy rescaling, masks per element only on boundary tiles) with these
 * changes:
 *   - K and V codes (1 byte; 2-byte V for INT8_TOKEN_K_V16) and the BN
 *     per-token key scales are gathered with cp.async into a two-stage
 *     staging area (half the bytes of a bf16 tile), then converted once per
 *     CTA into f16 tiles [BN, D] laid out as prefill_mma.cu's (swizzled, read
 *     with ldmatrix): int8 c -> the f16 1152 + c minus 1152 (byte_perm +
 *     hsub2, exact), e4m3 -> f16 by cvt (exact). The 16-bit V of
 *     INT8_TOKEN_K_V16 is copied already swizzled and read in place;
 *   - S = Q'' K^T in f16 (fp32 accumulation) with Q'' = q * s_k * 2^e_r:
 *     e_r a power of two per packed row r that puts max_c |q_c s_c| of the
 *     row in [2^14, 2^15), so Q'' never overflows f16 (65504) nor loses bits
 *     to f16 subnormals (q in bf16 has 8 exponent bits). Per-head scales
 *     (FP8, the per-token formats' unit scales, INT8_CHANNEL with per-head
 *     or per-tensor scales) are not folded: Q'' = q * 2^e_r, exact (f16 and
 *     bf16 q values are f16 values times a power of two); per-channel
 *     scales (INT8_CHANNEL) are folded as an f16 pair Q'' = hi + lo
 *     (lo = rn(Q'' - hi)), two mma passes, as decode_mma_quant.cu;
 *   - scores: s = 2^-e_r * s_k * (S - qo_r) with qo_r = sum_c Q''_c o_c (the
 *     INT8_CHANNEL offsets, from the rounded Q'', in fp32), or
 *     s = 2^-e_r * t_j * S (per-token key scale t_j); then soft-cap, ALiBi
 *     and masks as prefill_mma.cu;
 *   - O += P C_V with P rounded to f16 (INT8_TOKEN_K_V16: P in V's dtype,
 *     O += P V), l summed from P in fp32 (so lse carries no rounding of P),
 *     and in the epilogue
 *     out_c = s_c (O_c - o_c l) / l (o_c = 0 for FP8; no V scale for
 *     INT8_TOKEN_K_V16); sinks only change the denominator.
 * Error bound against attention over the dequantized cache: scores are
 * exact up to fp32 accumulation for per-head K scales; with per-channel
 * scales |ds| <= 2^-22 * scale * sum_c |q_c s_c (c_c - o_c)| (+ fp32
 * accumulation); lse carries no other error; the output carries P's
 * rounding, |dout| <= u_P * max_j |v_j| with u_P = 2^-11 (f16 P) or 2^-8
 * (bf16 P of INT8_TOKEN_K_V16 with bf16 V), plus the output dtype's rounding.
 */
#ifndef KVA_CUDA_PREFILL_MMA_QUANT_CUH
#define KVA_CUDA_PREFILL_MMA_QUANT_CUH

extern "C" {
#include "internal.h"
}
#include "mma_ptx.cuh"
#include "prefill_mma_common.cuh"
#include "tree_mask.cuh"
#include "prefill_mma_quant.h"
#include "quant_cvt.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <math.h>
#include <stdint.h>
#include <type_traits>

#define QP_TILE_M KVA__CUDA_PREFILL_TILE_M

/* Formats: INT8_CHANNEL (int8 K with per-channel scale + offset, int8 V),
 * INT8_TOKEN_K (int8 K with per-token scales, int8 V), FP8_E4M3, and
 * INT8_TOKEN_K_V16 (int8 K with per-token scales, V in the q dtype). */
enum { QP_I8 = 0, QP_I8T = 1, QP_FP8 = 2, QP_V16 = 3 };

/* Shared-memory layout of an instantiation (bytes). */
template <int D, int BN, int FMT, bool LO> struct qp_cfg {
    static constexpr bool KTOK = FMT == QP_I8T || FMT == QP_V16; /* per-token key scales */
    static constexpr int VB = FMT == QP_V16 ? 2 : 1;             /* bytes per V element */
    static constexpr int SQ = QP_TILE_M * D * 2;                 /* Q'' hi (and lo) f16 */
    static constexpr int OFF_K16 = SQ * (LO ? 2 : 1);            /* K [BN, D] f16 */
    static constexpr int OFF_V16 = OFF_K16 + BN * D * 2;         /* V [BN, D] f16 (1-byte V) */
    static constexpr int OFF_STG = OFF_V16 + (VB == 1 ? BN * D * 2 : 0);
    static constexpr int STG_V = BN * D;              /* V in a stage */
    static constexpr int STG_T = STG_V + BN * D * VB; /* key scales in a stage */
    static constexpr int STAGE = STG_T + (KTOK ? 4 * BN : 0);
    static constexpr int SMEM = OFF_STG + 2 * STAGE;
    static_assert(STAGE % 16 == 0, "stage alignment");
};

/* 2^e as a float, e in [-126, 127]. */
static __device__ __forceinline__ float qp_exp2i(int e)
{
    return __int_as_float((e + 127) << 23);
}

/*
 * D head size (= Dv), BN keys per tile, NW warps, WM m16 tiles per warp
 * (NW * WM * 16 == TILE_M), MINB CTAs per SM for __launch_bounds__, FMT
 * (above), LO: per-channel K scales folded as hi + lo (INT8_CHANNEL only),
 * Ty: the q / out dtype (kva__mma_bf16 or kva__mma_f16; also P's and V's
 * for QP_V16). Dynamic shared memory: qp_cfg.
 */
template <int D, int BN, int NW, int WM, int MINB, int FMT, bool LO, typename Ty>
__global__ void __launch_bounds__(NW * 32, MINB)
    prefill_mma_quant_kernel(const kva__cuda_qprefill_args qa)
{
    typedef qp_cfg<D, BN, FMT, LO> cfg;
    static_assert(NW * WM * 16 == QP_TILE_M, "tile rows");
    static_assert(D % 64 == 0 && BN % 16 == 0, "sizes");
    static_assert(!LO || FMT == QP_I8, "hi + lo only for per-channel K scales");
    constexpr bool KTOK = cfg::KTOK;
    constexpr int NT = NW * 32;
    constexpr int CPR = D / 8;  /* 16-byte chunks per f16 row */
    constexpr int CK = D / 16;  /* 16-byte chunks per code row */
    constexpr int NB8 = BN / 8; /* n8 blocks of S */
    constexpr int DB8 = D / 8;  /* n8 blocks of O */
    typedef typename Ty::elem elem;
    /* P V runs in f16 over converted codes, in the q dtype over a 16-bit V. */
    typedef typename std::conditional<FMT == QP_V16, Ty, kva__mma_f16>::type TyP;
    const kva__cuda_prefill_args &a = qa.p;

    const int tile_idx = blockIdx.x;
    if (tile_idx >= *a.num_tiles)
        return;
    const int32_t *tile = a.tiles + (size_t)tile_idx * KVA__CUDA_PREFILL_TILE_INTS;
    const int r = tile[0], m0 = tile[1], kvh = tile[2];

    extern __shared__ __align__(128) unsigned char smem[];
    __shared__ float s_rmul[QP_TILE_M], s_qo[QP_TILE_M];
    const uint32_t sQ = kva__smem_u32(smem);
    const uint32_t sK = sQ + cfg::OFF_K16;
    const uint32_t sV = sQ + cfg::OFF_V16;
    const uint32_t sS = sQ + cfg::OFF_STG;
    unsigned char *stg_p = smem + cfg::OFF_STG;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int H = a.num_heads, G = a.num_heads / a.num_kv_heads;
    const int q_start = a.query_start_loc[r];
    const int q_len = a.query_start_loc[r + 1] - q_start;
    const int seq_len = a.seq_lens[r];
    const int rows = q_len * G;
    const int B = a.block_size;
    const int bt_stride =
        a.block_table_stride_dev ? *a.block_table_stride_dev : a.block_table_stride;
    const int32_t *bt = a.block_table + (size_t)r * bt_stride;
    /* The window and the local chunk give each row a first key (kva__first_key);
     * window_left >= KVA_MAX_SEQ_LEN excludes nothing. */
    const int window = a.window_left < KVA_MAX_SEQ_LEN ? a.window_left : -1;
    const int chunk = a.attention_chunk;

    const int m_last = min(m0 + QP_TILE_M, rows) - 1;
    const int pos_min = seq_len - q_len + m0 / G;
    const int pos_max = seq_len - q_len + m_last / G;
    const int kv_lo = kva__first_key(pos_min, window, chunk);
    const int kv_hi = a.causal ? min(seq_len, pos_max + 1) : seq_len;

    /* ---- K/V gather (codes) of key rows n0 .. n0 + BN into staging stage st.
     * As prefill_mma.cu: rows outside [kv_lo, kv_hi) are zero-filled (codes 0
     * and scale 0 convert to 0, never NaN) and their block ids never read. */
    constexpr int KV_RPP = NT / CK;
    constexpr int KV_ITERS = BN * CK / NT;
    static_assert(NT % CK == 0 && (BN * CK) % NT == 0, "copy shape");
    constexpr int V_RPP = NT / CPR;
    constexpr int V_ITERS = FMT == QP_V16 ? BN * CPR / NT : 1;
    static_assert(FMT != QP_V16 || (NT % CPR == 0 && (BN * CPR) % NT == 0), "copy shape");
    const int lrow = tid / CK, lch = tid % CK;
    const int vrow = tid / CPR, vch = tid % CPR;
    const unsigned char *kc = (const unsigned char *)a.k, *vc = (const unsigned char *)a.v;
    const int Hkv = a.num_kv_heads;
    const int nhd = a.layout == KVA_LAYOUT_NHD;
    /* Element offset of key j: blk * blk_stride + o * row_stride + head_off. */
    const int64_t blk_stride = (int64_t)B * Hkv * D;
    const int row_stride = nhd ? Hkv * D : D;
    const int head_off = nhd ? kvh * D : kvh * B * D;
    const int b_shift = (B & (B - 1)) == 0 ? __ffs(B) - 1 : -1;
    auto blk_of = [&](int j) {
        const int bi = b_shift >= 0 ? j >> b_shift : j / B;
        return j >= kv_lo && j < kv_hi ? bt[bi] : 0;
    };
    auto off_of = [&](int j) {
        const int o = b_shift >= 0 ? j & (B - 1) : j % B;
        return o;
    };
    struct blks {
        int k[KV_ITERS], v[V_ITERS], t;
    };
    auto kv_blocks = [&](int n0, blks &b) {
#pragma unroll
        for (int k = 0; k < KV_ITERS; k++)
            b.k[k] = blk_of(n0 + lrow + k * KV_RPP);
        if (FMT == QP_V16) {
#pragma unroll
            for (int k = 0; k < V_ITERS; k++)
                b.v[k] = blk_of(n0 + vrow + k * V_RPP);
        }
        if (KTOK && tid < BN)
            b.t = blk_of(n0 + tid);
    };
    auto kv_copy = [&](int st, int n0, const blks &b) {
        const uint32_t stage = sS + (uint32_t)st * cfg::STAGE;
#pragma unroll
        for (int k = 0; k < KV_ITERS; k++) {
            const int row = lrow + k * KV_RPP, j = n0 + row;
            const bool in = j >= kv_lo && j < kv_hi;
            const int64_t off =
                in ? (int64_t)b.k[k] * blk_stride + (off_of(j) * row_stride + head_off + lch * 16)
                   : 0;
            const uint32_t so = (uint32_t)(row * D + lch * 16);
            kva__cp_async16(stage + so, kc + off, in ? 16 : 0);
            if (FMT != QP_V16)
                kva__cp_async16(stage + cfg::STG_V + so, vc + off, in ? 16 : 0);
        }
        if (FMT == QP_V16) {
#pragma unroll
            for (int k = 0; k < V_ITERS; k++) {
                const int row = vrow + k * V_RPP, j = n0 + row;
                const bool in = j >= kv_lo && j < kv_hi;
                const int64_t off =
                    in ? ((int64_t)b.v[k] * blk_stride + (off_of(j) * row_stride + head_off)) * 2 +
                             vch * 16
                       : 0;
                kva__cp_async16(stage + cfg::STG_V + kva__swz<D>(row, vch), vc + off, in ? 16 : 0);
            }
        }
        if (KTOK && tid < BN) {
            const int j = n0 + tid;
            const bool in = j >= kv_lo && j < kv_hi;
            const int64_t ti = in ? ((int64_t)b.t * Hkv + kvh) * B + off_of(j) : 0;
            kva__cp_async4(stage + cfg::STG_T + tid * 4, qa.kts + ti, in ? 4 : 0);
        }
    };
    /* Codes of stage st -> the f16 tiles K (and V for 1-byte V). */
    auto convert = [&](int st) {
        const unsigned char *stage = stg_p + st * cfg::STAGE;
#pragma unroll
        for (int k = 0; k < KV_ITERS; k++) {
            const int row = lrow + k * KV_RPP;
#pragma unroll
            for (int part = 0; part < (FMT == QP_V16 ? 1 : 2); part++) {
                const uint4 w = *(const uint4 *)(stage + part * cfg::STG_V + row * D + lch * 16);
                uint4 x0, x1;
                kva__cvt4_f16<FMT == QP_FP8>(w.x, x0.x, x0.y);
                kva__cvt4_f16<FMT == QP_FP8>(w.y, x0.z, x0.w);
                kva__cvt4_f16<FMT == QP_FP8>(w.z, x1.x, x1.y);
                kva__cvt4_f16<FMT == QP_FP8>(w.w, x1.z, x1.w);
                unsigned char *dst = smem + (part ? cfg::OFF_V16 : cfg::OFF_K16);
                *(uint4 *)(dst + kva__swz<D>(row, 2 * lch)) = x0;
                *(uint4 *)(dst + kva__swz<D>(row, 2 * lch + 1)) = x1;
            }
        }
    };

    /* Issue the first tile's copy before staging Q (its latency hides there). */
    const int n_first = kv_lo / BN;
    const int n_last = kv_hi > kv_lo ? (kv_hi - 1) / BN : n_first - 1;
    if (n_last >= n_first) {
        blks b0;
        kv_blocks(n_last * BN, b0);
        kv_copy(0, n_last * BN, b0);
    }
    kva__cp_async_commit();

    /* ---- stage Q'' = q * s_k * 2^e_r (hi [, lo]) and qo_r, 2^-e_r * s_k ----
     * Thread: chunk vch (8 channels) of rows vrow + i * V_RPP; a row's CPR
     * chunks lie in consecutive lanes of one warp (CPR <= 32). */
    {
        static_assert(CPR <= 32 && 32 % CPR == 0 && (QP_TILE_M * CPR) % NT == 0, "Q chunks");
        const elem *q = (const elem *)a.q;
        const float ku = LO ? 1.0f : qa.ks[(size_t)kvh * D];
#pragma unroll 1
        for (int row = vrow; row < QP_TILE_M; row += V_RPP) {
            const int pm = m0 + row, c0 = vch * 8;
            float v[8];
#pragma unroll
            for (int j = 0; j < 8; j++)
                v[j] = 0.0f;
            if (pm < rows) {
                const int i = pm / G, g = pm - (pm / G) * G;
                const elem *src = q + ((size_t)(q_start + i) * H + (size_t)kvh * G + g) * D + c0;
                uint4 raw = *(const uint4 *)src;
                const elem *e8 = (const elem *)&raw;
#pragma unroll
                for (int j = 0; j < 8; j++)
                    v[j] = (float)e8[j];
                if (LO) {
                    const float4 *ks = (const float4 *)(qa.ks + (size_t)kvh * D + c0);
                    const float4 s0 = __ldg(ks), s1 = __ldg(ks + 1);
                    const float sv[8] = {s0.x, s0.y, s0.z, s0.w, s1.x, s1.y, s1.z, s1.w};
#pragma unroll
                    for (int j = 0; j < 8; j++)
                        v[j] *= sv[j];
                }
            }
            float mx = 0.0f;
#pragma unroll
            for (int j = 0; j < 8; j++)
                mx = fmaxf(mx, fabsf(v[j]));
#pragma unroll
            for (int o = CPR / 2; o >= 1; o >>= 1)
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
            /* e: max |Q''| in [2^14, 2^15); 0 for a zero or non-finite row
             * (NaN and inf propagate as in the reference). */
            int e = 0;
            if (mx > 0.0f && mx <= 3.4e38f) {
                int ex;
                frexpf(mx, &ex); /* mx in [2^(ex-1), 2^ex) */
                e = min(max(15 - ex, -120), 120);
            }
            const float up = qp_exp2i(e);
            __half hi[8], lo[8];
            float qo = 0.0f;
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const float x = v[j] * up;
                hi[j] = __float2half_rn(x);
                lo[j] = __float2half_rn(x - __half2float(hi[j]));
            }
            if (FMT == QP_I8) {
                const float4 *ko = (const float4 *)(qa.ko + (size_t)kvh * D + c0);
                const float4 o0 = __ldg(ko), o1 = __ldg(ko + 1);
                const float ov[8] = {o0.x, o0.y, o0.z, o0.w, o1.x, o1.y, o1.z, o1.w};
#pragma unroll
                for (int j = 0; j < 8; j++)
                    qo = fmaf(__half2float(hi[j]) + (LO ? __half2float(lo[j]) : 0.0f), ov[j], qo);
#pragma unroll
                for (int o = CPR / 2; o >= 1; o >>= 1)
                    qo += __shfl_xor_sync(0xffffffffu, qo, o);
            }
            *(uint4 *)(smem + kva__swz<D>(row, vch)) = *(const uint4 *)hi;
            if (LO)
                *(uint4 *)(smem + cfg::SQ + kva__swz<D>(row, vch)) = *(const uint4 *)lo;
            if (vch == 0) {
                s_rmul[row] = qp_exp2i(-e) * ku;
                s_qo[row] = qo;
            }
        }
    }

    const int g4 = lane >> 2, t4 = lane & 3;
    /* ldmatrix addressing and the rows' positions and heads: prefill_mma.cu's. */
    uint32_t xo_q[4], xo_k[4], q_lane, k_row, v_row;
    kva__pf_ldsm_lanes<D, WM>(lane, warp, sQ, xo_q, xo_k, q_lane, k_row, v_row);
    int pos[WM][2], head[WM][2];
    kva__pf_rows<WM>(m0, warp, g4, m_last, G, seq_len, q_len, kvh, pos, head);
    kva__pf_mask<WM> mk;
    kva__pf_mask_init<WM>(mk, a, pos, seq_len, q_len, q_start, pos_min, pos_max);
    const float scale = a.scale > 0.0f ? a.scale : rsqrtf((float)D);
    const float softcap = a.softcap;
    const float score_mul = softcap > 0.0f ? scale / softcap : 0.0f;
    const float cap_mul = softcap * KVA__PF_LOG2E;
    const float scale_log2 = scale * KVA__PF_LOG2E;

    float o[WM][DB8][4];
    float m_run[WM][2], l_run[WM][2], rmul[WM][2], qo_r[WM][2];
    kva__pf_init<WM, DB8>(o, m_run, l_run);
    __syncthreads(); /* Q'', s_rmul, s_qo */
#pragma unroll
    for (int mt = 0; mt < WM; mt++)
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            const int lr = warp * 16 * WM + mt * 16 + hf * 8 + g4;
            rmul[mt][hf] = s_rmul[lr];
            qo_r[mt][hf] = s_qo[lr];
        }

    /* Key tiles from the last (the diagonal) down to the first. Per tile: the
     * codes of tile n landed (wait + barrier: also every warp is done with
     * the f16 tiles and with staging stage st ^ 1), the copy of tile n - 1
     * is issued into st ^ 1, stage st is converted, barrier, math. */
    for (int n = n_last, it = 0; n >= n_first; n--, it++) {
        const int st = it & 1;
        const int has_next = n - 1 >= n_first;
        blks bn;
        if (has_next)
            kv_blocks((n - 1) * BN, bn);
        kva__cp_async_wait<0>();
        __syncthreads();
        if (has_next)
            kv_copy(st ^ 1, (n - 1) * BN, bn);
        kva__cp_async_commit();
        convert(st);
        __syncthreads();

        const int n0 = n * BN;
        const uint32_t k_lane = sK + k_row;
        const uint32_t v_lane =
            (FMT == QP_V16 ? sS + (uint32_t)st * cfg::STAGE + cfg::STG_V : sV) + v_row;

        /* S = Q'' K^T: [16 * WM, BN] per warp (LO: plus the lo pass). */
        float s[WM][NB8][4];
#pragma unroll
        for (int mt = 0; mt < WM; mt++)
#pragma unroll
            for (int nb = 0; nb < NB8; nb++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    s[mt][nb][e] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) {
            uint32_t qa_[WM][4], ql_[WM][4];
#pragma unroll
            for (int mt = 0; mt < WM; mt++) {
                kva__ldsm_x4(q_lane + xo_q[kk & 3] + (kk >> 2) * 128 + mt * 16 * D * 2, qa_[mt]);
                if (LO)
                    kva__ldsm_x4(q_lane + cfg::SQ + xo_q[kk & 3] + (kk >> 2) * 128 +
                                     mt * 16 * D * 2,
                                 ql_[mt]);
            }
#pragma unroll
            for (int p = 0; p < BN / 16; p++) {
                uint32_t kb[4];
                kva__ldsm_x4(k_lane + xo_k[kk & 3] + (kk >> 2) * 128 + p * 16 * D * 2, kb);
#pragma unroll
                for (int mt = 0; mt < WM; mt++) {
                    kva__mma_f16::mma(s[mt][2 * p], qa_[mt], kb[0], kb[1]);
                    kva__mma_f16::mma(s[mt][2 * p + 1], qa_[mt], kb[2], kb[3]);
                    if (LO) {
                        kva__mma_f16::mma(s[mt][2 * p], ql_[mt], kb[0], kb[1]);
                        kva__mma_f16::mma(s[mt][2 * p + 1], ql_[mt], kb[2], kb[3]);
                    }
                }
            }
        }

        /* Score units: s = 2^-e_r s_k (S - qo_r) or 2^-e_r t_j S. */
        {
            const float *ts = (const float *)(stg_p + st * cfg::STAGE + cfg::STG_T); /* KTOK only */
#pragma unroll
            for (int nb = 0; nb < NB8; nb++) {
                float2 t2 = make_float2(1.0f, 1.0f);
                if (KTOK)
                    t2 = *(const float2 *)(ts + nb * 8 + 2 * t4);
#pragma unroll
                for (int mt = 0; mt < WM; mt++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int hf = e >> 1;
                        float x = s[mt][nb][e];
                        if (FMT == QP_I8)
                            x -= qo_r[mt][hf];
                        if (KTOK)
                            x *= (e & 1) ? t2.y : t2.x;
                        s[mt][nb][e] = x * rmul[mt][hf];
                    }
            }
        }

        /* From here on as prefill_mma.cu (lazy rescaling). */
        const int need_mask = kva__pf_mask_needed<WM, BN>(mk, n0);
        const int transform = need_mask || softcap > 0.0f || a.alibi_slopes != NULL;
        const float mul = transform ? 1.0f : scale_log2;
        if (transform)
            kva__pf_transform<WM, NB8>(s, mk, pos, head, a.alibi_slopes, softcap, scale_log2,
                                       score_mul, cap_mul, n0, t4);
        uint32_t pk[WM][NB8][2]; /* P in TyP, packed pairs */
        kva__pf_softmax<WM, NB8, DB8, TyP>(s, o, m_run, l_run, mul, pk);
        /* O += P V: P [16 * WM, BN] from registers, V [BN, D] (f16 codes or TyP). */
        kva__pf_pv_tile<D, WM, BN, TyP>(o, pk, v_lane, xo_q);
    }
    kva__cp_async_wait<0>();

    /* ---- epilogue: V scales, sink, normalization, out and lse ----
     * out_c = s_c (O_c - o_c l) / l (o_c = 0 for FP8, no scale for V16). */
    kva__pf_row_end<D, WM, Ty>(a, o, m_run, l_run, head, m0, warp, g4, t4, rows, q_start, G,
                               [&](int c, float lk, float &x0, float &x1) {
                                   if (FMT != QP_V16) {
                                       const float2 vs =
                                           __ldg((const float2 *)(qa.vs + (size_t)kvh * D + c));
                                       if (FMT != QP_FP8) {
                                           const float2 vo =
                                               __ldg((const float2 *)(qa.vo + (size_t)kvh * D + c));
                                           x0 = fmaf(-vo.x, lk, x0);
                                           x1 = fmaf(-vo.y, lk, x1);
                                       }
                                       x0 *= vs.x;
                                       x1 *= vs.y;
                                   }
                               });
}

/* Launches one instantiation with its dynamic shared memory. */
template <int D, int BN, int NW, int WM, int MINB, int FMT, bool LO, typename Ty>
static kva_status qp_launch_one(const kva__cuda_qprefill_args *qa, cudaStream_t stream)
{
    const size_t smem = (size_t)qp_cfg<D, BN, FMT, LO>::SMEM;
    auto fn = prefill_mma_quant_kernel<D, BN, NW, WM, MINB, FMT, LO, Ty>;
    cudaError_t e =
        cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess)
        return kva__fail(KVA_STATUS_DEVICE_ERROR,
                         "kva_attention_run: quantized prefill: cudaFuncSetAttribute(%zu bytes "
                         "of shared memory, D = %d): %s",
                         smem, D, cudaGetErrorString(e));
    fn<<<qa->p.grid_tiles, NW * 32, smem, stream>>>(*qa);
    e = cudaGetLastError();
    if (e != cudaSuccess)
        return kva__fail(KVA_STATUS_DEVICE_ERROR,
                         "kva_attention_run: quantized prefill: launch of %d tiles (D = %d): %s",
                         (int)qa->p.grid_tiles, D, cudaGetErrorString(e));
    return KVA_STATUS_OK;
}

/* The configuration per format and head size (8 warps x 16 rows or 4 warps x
 * 32 rows; 64 or 32 keys per tile), lazy rescaling in all: the fastest on an
 * H100 per format (docs/cuda.md). 4 x 32 rows for the 1-byte formats with
 * exact Q'' (!LO); 8 x 16 rows with per-channel scales (LO: the hi + lo Q
 * tiles; at D 128 with 32 keys per tile, half the K/V shared memory, so two
 * CTAs per SM still fit) and for INT8_TOKEN_K_V16; D 256 runs 8 x 16 rows
 * with 32 keys per tile. */
template <int FMT, bool LO, typename Ty>
static kva_status qp_launch_d(const kva__cuda_qprefill_args *qa, cudaStream_t st)
{
    constexpr bool WIDE = !LO && FMT != QP_V16;
    switch (qa->p.head_dim) {
    case 64:
        if constexpr (WIDE)
            return qp_launch_one<64, 64, 4, 2, 1, FMT, LO, Ty>(qa, st);
        else
            return qp_launch_one<64, 64, 8, 1, 2, FMT, LO, Ty>(qa, st);
    case 128:
        if constexpr (WIDE)
            return qp_launch_one<128, 64, 4, 2, 1, FMT, LO, Ty>(qa, st);
        else if constexpr (LO)
            return qp_launch_one<128, 32, 8, 1, 2, FMT, LO, Ty>(qa, st);
        else
            return qp_launch_one<128, 64, 8, 1, 2, FMT, LO, Ty>(qa, st);
    default:
        return qp_launch_one<256, 32, 8, 1, 1, FMT, LO, Ty>(qa, st);
    }
}

/* Per-format entry points (prefill_mma_quant_<fmt>.cu), arguments checked by
 * kva__cuda_qprefill_launch. */
kva_status kva__qp_launch_i8(const kva__cuda_qprefill_args *qa, cudaStream_t st);
kva_status kva__qp_launch_i8t(const kva__cuda_qprefill_args *qa, cudaStream_t st);
kva_status kva__qp_launch_fp8(const kva__cuda_qprefill_args *qa, cudaStream_t st);
kva_status kva__qp_launch_v16(const kva__cuda_qprefill_args *qa, cudaStream_t st);

#endif /* KVA_CUDA_PREFILL_MMA_QUANT_CUH */
