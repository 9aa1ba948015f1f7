/*
 * prefill_mma_quant.cuh - the quantized load policy of the mma.sync prefill
 * (prefill_mma_kernel.cuh, the one body; prefill_mma_quant.h), included by
 * the per-format instantiation files prefill_mma_quant_*.cu (one
 * translation unit per format, so the instantiations compile in parallel).
 *
 * The design and its error bound are docs/cuda.md, "Prefill over quantized
 * caches on tensor cores": K/V codes (and the BN per-token key scales)
 * gathered by cp.async into a two-stage staging area and converted once per
 * CTA into f16 tiles laid out as prefill_mma.cu's (exact); S = Q'' K^T in f16
 * with Q'' = q * s_k * 2^e_r (e_r per packed row puts max |q_c s_c| in
 * [2^14, 2^15); per-head scales not folded, per-channel ones as hi + lo, two
 * mma passes); s = 2^-e_r * s_k * (S - qo_r) or 2^-e_r * t_j * S; O += P C_V
 * with P rounded to f16 (V16: P V in V's dtype), l summed from the fp32 P,
 * out_c = s_c (O_c - o_c l) / l.
 */
#ifndef KVA_CUDA_PREFILL_MMA_QUANT_CUH
#define KVA_CUDA_PREFILL_MMA_QUANT_CUH

extern "C" {
#include "internal.h"
}
#include "mma_ptx.cuh"
#include "prefill_mma_kernel.cuh"
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

/*
 * The quantized load policy (prefill_mma_kernel.cuh). D head size (= Dv), BN
 * keys per tile, NW warps, WM m16 tiles per warp (NW * WM * 16 == TILE_M),
 * MINB CTAs per SM for __launch_bounds__, FMT (above), LO: per-channel K
 * scales folded as hi + lo (INT8_CHANNEL only), Ty: the q / out dtype
 * (kva__mma_bf16 or kva__mma_f16; also P's and V's for QP_V16). Dynamic
 * shared memory: qp_cfg. The first key tile's copy is issued before Q is
 * staged (its latency hides there); each tile's codes are converted once
 * per CTA after the next tile's copy is issued.
 */
template <int D_, int BN_, int NW_, int WM_, int MINB_, int FMT, bool LO_, typename Ty_>
struct qp_policy {
    typedef qp_cfg<D_, BN_, FMT, LO_> cfg;
    typedef kva__cuda_qprefill_args Args;
    typedef Ty_ Ty;
    typedef kva__mma_f16 TyS; /* S = Q'' K^T in f16 over converted codes */
    /* P V runs in f16 over converted codes, in the q dtype over a 16-bit V. */
    typedef typename std::conditional<FMT == QP_V16, Ty_, kva__mma_f16>::type TyP;
    typedef typename Ty_::elem elem;
    static constexpr int D = D_, BN = BN_, NW = NW_, WM = WM_, MINB = MINB_;
    static constexpr int SQ = cfg::SQ, SMEM = cfg::SMEM;
    static constexpr bool KV_FIRST = true, CONVERT = true, LO = LO_;
    static_assert(!LO || FMT == QP_I8, "hi + lo only for per-channel K scales");
    static constexpr bool KTOK = cfg::KTOK;
    static constexpr int NT = NW * 32;
    static constexpr int CPR = D / 8; /* 16-byte chunks per f16 row */
    static constexpr int CK = D / 16; /* 16-byte chunks per code row */
    /* A thread copies code rows lrow + k * KV_RPP (chunk lch) and, for
     * QP_V16, V rows vrow + k * V_RPP (chunk vch) of a key tile. */
    static constexpr int KV_RPP = NT / CK;
    static constexpr int KV_ITERS = BN * CK / NT;
    static_assert(NT % CK == 0 && (BN * CK) % NT == 0, "copy shape");
    static constexpr int V_RPP = NT / CPR;
    static constexpr int V_ITERS = FMT == QP_V16 ? BN * CPR / NT : 1;
    static_assert(FMT != QP_V16 || (NT % CPR == 0 && (BN * CPR) % NT == 0), "copy shape");
    struct Blocks {
        int k[KV_ITERS], v[V_ITERS], t;
    };

    const Args &qa;
    const kva__pf_tile &t;
    unsigned char *smem;
    uint32_t sQ, sK, sV, sS;
    int lrow, lch, vrow, vch;
    float rmul[WM][2], qo_r[WM][2]; /* the thread's rows' 2^-e_r * s_k and qo_r */

    static __device__ __forceinline__ const kva__cuda_prefill_args &attn(const Args &q)
    {
        return q.p;
    }
    /* Per packed row of the tile: 2^-e_r * s_k (row_mul) and qo_r (row_qo;
     * two arrays, so a format without offsets drops the second). */
    static __device__ __forceinline__ float *row_mul()
    {
        __shared__ float s_rmul[QP_TILE_M];
        return s_rmul;
    }
    static __device__ __forceinline__ float *row_qo()
    {
        __shared__ float s_qo[QP_TILE_M];
        return s_qo;
    }
    __device__ __forceinline__ qp_policy(const Args &q, const kva__pf_tile &tt, unsigned char *sm)
        : qa(q), t(tt), smem(sm)
    {
        sQ = kva__smem_u32(smem);
        sK = sQ + cfg::OFF_K16;
        sV = sQ + cfg::OFF_V16;
        sS = sQ + cfg::OFF_STG;
        lrow = (int)threadIdx.x / CK;
        lch = (int)threadIdx.x % CK;
        vrow = (int)threadIdx.x / CPR;
        vch = (int)threadIdx.x % CPR;
    }
    static __device__ __forceinline__ void clear(Blocks &) {}
    __device__ __forceinline__ void blocks(int n0, Blocks &b) const
    {
#pragma unroll
        for (int k = 0; k < KV_ITERS; k++)
            b.k[k] = t.key_block(n0 + lrow + k * KV_RPP);
        if (FMT == QP_V16) {
#pragma unroll
            for (int k = 0; k < V_ITERS; k++)
                b.v[k] = t.key_block(n0 + vrow + k * V_RPP);
        }
        if (KTOK && (int)threadIdx.x < BN)
            b.t = t.key_block(n0 + (int)threadIdx.x);
    }
    /* Codes (and V16's V, swizzled; the key scales) of key rows n0 .. n0 +
     * BN into staging stage st; rows outside [kv_lo, kv_hi) zero-filled
     * (codes 0 and scale 0 convert to 0, never NaN). */
    __device__ __forceinline__ void copy(int st, int n0, const Blocks &b) const
    {
        const unsigned char *kc = (const unsigned char *)qa.p.k,
                            *vc = (const unsigned char *)qa.p.v;
        const uint32_t stage = sS + (uint32_t)st * cfg::STAGE;
#pragma unroll
        for (int k = 0; k < KV_ITERS; k++) {
            const int row = lrow + k * KV_RPP, j = n0 + row;
            const bool in = t.key_in(j);
            const int64_t off = in ? (int64_t)b.k[k] * t.blk_stride +
                                         (t.key_slot(j) * t.row_stride + t.head_off + lch * 16)
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
                const bool in = t.key_in(j);
                const int64_t off = in ? ((int64_t)b.v[k] * t.blk_stride +
                                          (t.key_slot(j) * t.row_stride + t.head_off)) *
                                                 2 +
                                             vch * 16
                                       : 0;
                kva__cp_async16(stage + cfg::STG_V + kva__swz<D>(row, vch), vc + off, in ? 16 : 0);
            }
        }
        if (KTOK && (int)threadIdx.x < BN) {
            const int j = n0 + (int)threadIdx.x;
            const bool in = t.key_in(j);
            const int64_t ti = in ? ((int64_t)b.t * t.Hkv + t.kvh) * t.B + t.key_slot(j) : 0;
            kva__cp_async4(stage + cfg::STG_T + (int)threadIdx.x * 4, qa.kts + ti, in ? 4 : 0);
        }
    }
    /* Codes of stage st -> the f16 tiles K (and V for 1-byte V), then a
     * barrier. */
    __device__ __forceinline__ void convert(int st) const
    {
        const unsigned char *stage = smem + cfg::OFF_STG + st * cfg::STAGE;
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
        __syncthreads();
    }
    /* Stage Q'' = q * s_k * 2^e_r (hi [, lo]) and qo_r, 2^-e_r * s_k
     * Thread: chunk vch (8 channels) of rows vrow + i * V_RPP; a row's CPR
     * chunks lie in consecutive lanes of one warp (CPR <= 32). */
    __device__ __forceinline__ void stage_q() const
    {
        float *s_rmul = row_mul(), *s_qo = row_qo();
        static_assert(CPR <= 32 && 32 % CPR == 0 && (QP_TILE_M * CPR) % NT == 0, "Q chunks");
        const elem *q = (const elem *)qa.p.q;
        const float ku = LO ? 1.0f : qa.ks[(size_t)t.kvh * D];
#pragma unroll 1
        for (int row = vrow; row < QP_TILE_M; row += V_RPP) {
            const int pm = t.m0 + row, c0 = vch * 8;
            float v[8];
#pragma unroll
            for (int j = 0; j < 8; j++)
                v[j] = 0.0f;
            if (pm < t.rows) {
                const int i = pm / t.G, g = pm - (pm / t.G) * t.G;
                const elem *src =
                    q + ((size_t)(t.q_start + i) * t.H + (size_t)t.kvh * t.G + g) * D + c0;
                uint4 raw = *(const uint4 *)src;
                const elem *e8 = (const elem *)&raw;
#pragma unroll
                for (int j = 0; j < 8; j++)
                    v[j] = (float)e8[j];
                if (LO) {
                    float sv[8];
                    kva__ldg_f8(qa.ks + (size_t)t.kvh * D + c0, sv);
#pragma unroll
                    for (int j = 0; j < 8; j++)
                        v[j] *= sv[j];
                }
            }
            /* e: max |Q''| in [2^14, 2^15) (kva__q_row_exp). */
            __half hi[8], lo[8];
            const int e = kva__q_hilo<CPR>(v, hi, lo);
            float qo = 0.0f;
            if (FMT == QP_I8)
                qo = kva__q_offset_dot<CPR, LO>(hi, lo, qa.ko + (size_t)t.kvh * D + c0);
            *(uint4 *)(smem + kva__swz<D>(row, vch)) = *(const uint4 *)hi;
            if (LO)
                *(uint4 *)(smem + cfg::SQ + kva__swz<D>(row, vch)) = *(const uint4 *)lo;
            if (vch == 0) {
                s_rmul[row] = kva__exp2i(-e) * ku;
                if (FMT == QP_I8)
                    s_qo[row] = qo;
            }
        }
    }
    /* S to score units: s = 2^-e_r s_k (S - qo_r) or 2^-e_r t_j S. */
    __device__ __forceinline__ void scores(float s[WM][BN / 8][4], int st, int t4) const
    {
        constexpr int NB8 = BN / 8;
        const float *ts =
            (const float *)(smem + cfg::OFF_STG + st * cfg::STAGE + cfg::STG_T); /* KTOK only */
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
    /* Q'', the row factors and the first copy issued: a barrier, then this
     * thread's rows' factors. */
    __device__ __forceinline__ void q_ready(int warp, int g4)
    {
        const float *s_rmul = row_mul(), *s_qo = row_qo();
        __syncthreads(); /* Q'', the row factors */
#pragma unroll
        for (int mt = 0; mt < WM; mt++)
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                const int lr = warp * 16 * WM + mt * 16 + hf * 8 + g4;
                rmul[mt][hf] = s_rmul[lr];
                qo_r[mt][hf] = FMT == QP_I8 ? s_qo[lr] : 0.0f;
            }
    }
    __device__ __forceinline__ uint32_t k_tile(int) const
    {
        return sK;
    }
    /* V: the converted f16 tile, or QP_V16's 16-bit V in its stage. */
    __device__ __forceinline__ uint32_t v_tile(int st) const
    {
        return FMT == QP_V16 ? sS + (uint32_t)st * cfg::STAGE + cfg::STG_V : sV;
    }
    /* out_c = s_c (O_c - o_c l) / l (o_c = 0 for FP8, no scale for V16). */
    __device__ __forceinline__ void vfix(int c, float lk, float &x0, float &x1) const
    {
        if (FMT != QP_V16) {
            const float2 vs = __ldg((const float2 *)(qa.vs + (size_t)t.kvh * D + c));
            if (FMT != QP_FP8) {
                const float2 vo = __ldg((const float2 *)(qa.vo + (size_t)t.kvh * D + c));
                x0 = fmaf(-vo.x, lk, x0);
                x1 = fmaf(-vo.y, lk, x1);
            }
            x0 *= vs.x;
            x1 *= vs.y;
        }
    }
};

/* Launches one instantiation with its dynamic shared memory. */
template <int D, int BN, int NW, int WM, int MINB, int FMT, bool LO, typename Ty>
static kva_status qp_launch_one(const kva__cuda_qprefill_args *qa, cudaStream_t stream)
{
    return kva__pf_launch<qp_policy<D, BN, NW, WM, MINB, FMT, LO, Ty>>(
        *qa, qa->p.grid_tiles, stream, "kva_attention_run: quantized prefill");
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
