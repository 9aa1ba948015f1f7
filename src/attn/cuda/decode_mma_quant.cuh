/*
 * decode_mma_quant.cuh - the tensor-core decode (decode_mma.cu, registry name
 * decode_mma_sm80) over quantized caches: KVA_QUANT_INT8_CHANNEL,
 * INT8_TOKEN_K and FP8_E4M3 (1-byte K and V), and INT8_TOKEN_K_V16 (int8 K,
 * V in the q dtype). attn_quant.cu sends the work items of a plan
 * partitioned for the tensor-core decode here (items of up to 16 rows, nq
 * query tokens x nh heads of one kv head, one m16 tile) and keeps the
 * prefill tiles on its CUDA-core kernel.
 *
 * This header is the load policy of the tensor-core decode's one body
 * (decode_mma_kernel.cuh) for these formats, instantiated per format family
 * in decode_mma_quant_{i8,fp8,v16}.cu (f16 and bf16 q, D 64 / 128 / 256) so
 * the build compiles them in parallel; decode_mma_quant.cu is the host side.
 *
 * The design is docs/cuda.md, "Quantized caches": steps of BNW keys (32 for
 * 1-byte V at D <= 128, else 16) with their per-token key scales in a ring of
 * NST stages (configuration at qm_load); codes turned into f16 exactly in
 * registers (int8: 0x6400 | (c ^ 0x80) = 1024 + 128 + c, K codes minus 1152,
 * V's bias taken off O once in pv; fp8: cvt e4m3x2 -> f16x2); the scales
 * never enter the key loop (S = Q' K^T with Q'_c = q_c s_c as f16 hi + lo,
 * row exponent kva__q_row_exp; out_c = s_c (O_c - o_c l) / l). Fragments are
 * built from bytes (no ldmatrix for 8-bit elements): lane (g4, t4) takes
 * channels 16 t4 .. +15 of each 64 for S (Q' laid out to match, qm_qword),
 * and 4 channels of keys 2t4, 2t4+1, 2t4+8, 2t4+9 for P V, regrouped by
 * byte_perm so that output channel (tile 4g + j, column n) is 32 g + 4 n + j.
 */
#ifndef KVA_CUDA_DECODE_MMA_QUANT_CUH
#define KVA_CUDA_DECODE_MMA_QUANT_CUH

extern "C" {
#include "cuda_backend.h"
}
#include "cuda_check.h"
#include "decode_mma_kernel.cuh"
#include "mma_ptx.cuh"
#include "quant_args.cuh"
#include "quant_cvt.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

/* Kernel arguments: the tensor-core decode's plus the cache's scales. */
typedef struct kva__cuda_quant_mma_args {
    kva__cuda_attn_args a; /* k, v: the codes; scale, masks, items as decode_mma.cu */
    const float *kts;      /* [NB, Hkv, B] per-token key scales (INT8_TOKEN_K), or NULL */
    const float *ks, *ko;  /* [Hkv, D] static K scale / offset (unit / zero for per-token) */
    const float *vs, *vo;  /* [Hkv, Dv] static V scale / offset */
    int32_t q16;           /* q is 16-byte aligned (vector loads of its rows) */
} kva__cuda_quant_mma_args;

/* Formats: K and V int8 codes, K and V fp8 codes, int8 K codes with a 16-bit
 * V in the q dtype (INT8_TOKEN_K_V16). */
enum { QM_I8 = 0, QM_FP8 = 1, QM_V16 = 2 };

/* Output store of the epilogue (kva__dmma_write): OT __half or __nv_bfloat16. */
template <typename OT> struct qm_out {
    typedef OT elem;
    static __device__ __forceinline__ void store(OT *p, float x)
    {
        *p = (OT)x;
    }
};

/* The mma element type of OT. */
template <typename OT> struct qm_ty {
    typedef kva__mma_f16 type;
};
template <> struct qm_ty<__nv_bfloat16> {
    typedef kva__mma_bf16 type;
};

/* Byte offsets in the K and V tiles [16, D] (16-byte chunks, swizzled so
 * that the fragment loads of a warp are free of bank conflicts: K rows r
 * and r + 1 alternate halves of 128 bytes, V rows 2t, 2t + 2, ... rotate). */
template <int D> static __device__ __forceinline__ uint32_t qm_koff(int r, int c)
{
    constexpr int CH = D / 16;
    const int x = CH >= 8 ? (r & 1) << 2 : 0;
    return (uint32_t)(r * D + ((c ^ x) << 4));
}
template <int D> static __device__ __forceinline__ uint32_t qm_voff(int r, int c)
{
    constexpr int CH = D / 16;
    const int x = CH >= 8 ? ((r >> 1) & 3) << 1 : ((r >> 1) & 1) << 1;
    return (uint32_t)(r * D + ((c ^ x) << 4));
}

/* Row (in rows of D bytes) and token-scale index of key j of kv head kvh in
 * block `block` (its block-table entry): NHD (block * B + off) * Hkv + kvh,
 * HND (block * Hkv + kvh) * B + off; scales [NB, Hkv, B]: (block * Hkv +
 * kvh) * B + off. */
static __device__ __forceinline__ int64_t qm_key_row(const kva__cuda_quant_mma_args &q,
                                                     int64_t block, int32_t kvh, int32_t j,
                                                     int64_t *tsi)
{
    const kva__cuda_attn_args &a = q.a;
    /* A power-of-two block size (the usual case) takes a mask, not a division. */
    const int32_t off = (a.B & (a.B - 1)) == 0 ? j & (a.B - 1) : j % a.B;
    *tsi = (block * a.Hkv + kvh) * a.B + off;
    return a.layout_hnd ? *tsi : (block * a.B + off) * a.Hkv + kvh;
}

/* The block-table entry of key kb + lane % BNW of the item's keys (-1 at
 * or past kend): the lane's part of the step's block-table read, which the
 * body issues one step before the step's copies (qm_load::key_row). */
template <int BNW>
static __device__ __forceinline__ int32_t qm_key_block(const kva__cuda_quant_mma_args &q,
                                                       const int32_t *bt_row, int32_t kb,
                                                       int32_t kend, int lane)
{
    const int32_t B = q.a.B, j = kb + (lane & (BNW - 1));
    /* A power-of-two block size (the usual case) takes a shift, not a division. */
    const bool pow2 = (B & (B - 1)) == 0;
    return j < kend ? __ldg(bt_row + (pow2 ? j >> (__ffs(B) - 1) : j / B)) : -1;
}

/* The copies of a step whose keys kb .. kb + BNW - 1 all lie before kend,
 * with kb and the block size multiples of 16 (the usual case: every step
 * but an item's last): each 16 keys lie in one block (lane 16 gi holds its
 * entry, qm_key_block: one shuffle per 16 keys), and a key's row is that
 * block's first row plus a multiple of the rows per key (Hkv for NHD, 1
 * for HND) that is a constant of the unrolled copy loop: no per-key
 * shuffles, no zero-fill selects. Returns false (nothing issued) where
 * the step does not qualify. */
template <int D, int BNW, int VB>
static __device__ __forceinline__ bool qm_issue_pages(const kva__cuda_quant_mma_args &q,
                                                      int32_t blkv, int32_t kvh, int32_t kb,
                                                      int32_t kend, uint32_t st, int lane)
{
    const kva__cuda_attn_args &a = q.a;
    if (((a.B | kb) & 15) != 0 || kb + BNW > kend)
        return false;
    constexpr int NG = BNW / 16; /* 16-key groups of the step */
    const int32_t rs = a.layout_hnd ? 1 : a.Hkv; /* rows per key */
    int64_t rb[NG], tb[NG]; /* the groups' first rows and token-scale indices */
#pragma unroll
    for (int gi = 0; gi < NG; gi++) {
        /* Key kb + 16 gi: its offset in the block (B a multiple of 16). */
        const int32_t j0 = kb + 16 * gi;
        const int32_t off = (a.B & (a.B - 1)) == 0 ? j0 & (a.B - 1) : j0 % a.B;
        const int64_t block = __shfl_sync(0xffffffffu, blkv, 16 * gi);
        tb[gi] = (block * a.Hkv + kvh) * a.B + off;
        rb[gi] = a.layout_hnd ? tb[gi] : (block * a.B + off) * a.Hkv + kvh;
    }
    /* Chunk x = lane + 32 i of the step's [BNW, D / 16] 16-byte chunks is key
     * x / CH = lane / CH + i * 32 / CH, chunk lane % CH: its 16-key group
     * and the key's place in it are constants of i. */
    constexpr int CH = D / 16, KPI = 32 / CH;
    static_assert(KPI <= 16 && 16 % KPI == 0, "a chunk round inside one group");
    const int64_t lo = (int64_t)(lane / CH) * rs * D + (lane % CH) * 16; /* the lane's chunk */
    const char *kp = (const char *)q.a.k + lo, *vp = (const char *)q.a.v;
    if constexpr (VB == 1 && D <= 128) {
        /* K and V codes under the L2 evict-first policy: they are read once
         * per call, and the next call's metadata and the split partials stay.
         * Only on this path (measured): a build with the policy on every copy
         * path (the shuffled one, 16-bit V, D 256) failed a D 256 16-bit-V
         * case with an illegal instruction on the H200 (cause not found). */
        const uint64_t pol = kva__l2_evict_first();
#pragma unroll
        for (int i = 0; i < BNW * CH / 32; i++) {
            const int key = lane / CH + i * KPI, c = lane % CH;
            const int gi = (i * KPI) / 16, m = (i * KPI) % 16;
            const int64_t boff = (rb[gi] + (int64_t)m * rs) * D;
            kva__cp_async16_pol(st + qm_koff<D>(key, c), kp + boff, 16, pol);
            kva__cp_async16_pol(st + BNW * D + qm_voff<D>(key, c), vp + lo + boff, 16, pol);
        }
    } else {
#pragma unroll
        for (int i = 0; i < BNW * CH / 32; i++) {
            const int key = lane / CH + i * KPI, c = lane % CH;
            const int gi = (i * KPI) / 16, m = (i * KPI) % 16;
            const int64_t boff = (rb[gi] + (int64_t)m * rs) * D;
            kva__cp_async16(st + qm_koff<D>(key, c), kp + boff, 16);
            if (VB == 1)
                kva__cp_async16(st + BNW * D + qm_voff<D>(key, c), vp + lo + boff, 16);
        }
    }
    if (VB == 2) {
        /* 16-bit V rows: D / 8 chunks, the bf16 kernel's swizzle (ldmatrix.trans). */
        constexpr int CV = D / 8, KPV = 32 / CV;
        static_assert(KPV <= 16 && 16 % KPV == 0, "a chunk round inside one group");
        const char *vl = vp + ((int64_t)(lane / CV) * rs * (2 * D) + (lane % CV) * 16);
#pragma unroll
        for (int i = 0; i < BNW * CV / 32; i++) {
            const int key = lane / CV + i * KPV, c = lane % CV;
            const int gi = (i * KPV) / 16, m = (i * KPV) % 16;
            const int64_t boff = (rb[gi] + (int64_t)m * rs) * (2 * D);
            kva__cp_async16(st + BNW * D + kva__swz<D>(key, c), vl + boff, 16);
        }
    }
    if (q.kts && lane < BNW) {
        const int64_t t0 = NG == 1 || lane < 16 ? tb[0] : tb[NG - 1];
        kva__cp_async4(st + BNW * D * (1 + VB) + lane * 4, q.kts + t0 + (lane & 15), 4);
    }
    return true;
}

/* The warp copies K and V of keys kb .. kb + BNW - 1 (zeros past kend; BNW
 * 16 or 32; VB bytes per V element) and their token scales into the stage at
 * st, blkv: the lane's qm_key_block of the step: qm_issue_pages where the
 * step qualifies, else lane l computes the row of key l % BNW and the others
 * get it by shuffle. */
template <int D, int BNW, int VB>
static __device__ __forceinline__ void qm_issue(const kva__cuda_quant_mma_args &q, int32_t blkv,
                                                int32_t kvh, int32_t kb, int32_t kend,
                                                uint32_t st, int lane)
{
    if (qm_issue_pages<D, BNW, VB>(q, blkv, kvh, kb, kend, st, lane))
        return;
    constexpr int CH = D / 16;
    const int32_t jl = kb + (lane & (BNW - 1));
    int64_t tsi = 0;
    const int64_t mine = jl < kend ? qm_key_row(q, blkv, kvh, jl, &tsi) : -1;
    const char *kp = (const char *)q.a.k, *vp = (const char *)q.a.v;
#pragma unroll
    for (int i = 0; i < BNW * CH / 32; i++) {
        const int x = lane + 32 * i, key = x / CH, c = x % CH;
        const int64_t row = __shfl_sync(0xffffffffu, mine, key);
        const bool ok = row >= 0;
        const int64_t boff = ok ? row * (int64_t)D + c * 16 : 0;
        kva__cp_async16(st + qm_koff<D>(key, c), kp + boff, ok ? 16 : 0);
        if (VB == 1)
            kva__cp_async16(st + BNW * D + qm_voff<D>(key, c), vp + boff, ok ? 16 : 0);
    }
    if (VB == 2) {
        /* 16-bit V rows: D / 8 chunks, the bf16 kernel's swizzle (ldmatrix.trans). */
        constexpr int CV = D / 8;
#pragma unroll
        for (int i = 0; i < BNW * CV / 32; i++) {
            const int x = lane + 32 * i, key = x / CV, c = x % CV;
            const int64_t row = __shfl_sync(0xffffffffu, mine, key);
            const bool ok = row >= 0;
            const int64_t boff = ok ? row * (int64_t)(2 * D) + c * 16 : 0;
            kva__cp_async16(st + BNW * D + kva__swz<D>(key, c), vp + boff, ok ? 16 : 0);
        }
    }
    if (q.kts && lane < BNW) {
        const bool ok = mine >= 0;
        kva__cp_async4(st + BNW * D * (1 + VB) + lane * 4, ok ? q.kts + tsi : q.kts, ok ? 4 : 0);
    }
}

/* The 32-bit word of Q' [16, D] f16 (in the order of the mma A fragments,
 * qm_load::scores) that holds row r's channels c and c + 1 (c even). Per
 * 64-channel slice kk, row pair g = r % 8 (rows g and g + 8) and lane column
 * t4 (channels 16 t4 .. + 15 of the slice, qm_load::scores): 16 words, one
 * 16-byte chunk per mma k-step st (channels 16 t4 + 4 st .. + 3) holding
 * the A fragment {row g: 4 st, 4 st + 1; row g + 8: same; row g: 4 st + 2,
 * 4 st + 3; row g + 8: same}, so that one 16-byte load gives a fragment
 * (no register moves); the chunks of a 64-byte group are rotated by
 * t4 / 2 + 2 (g % 2), so that each quarter warp's loads hit distinct banks. */
static __device__ __forceinline__ int qm_qword(int r, int c)
{
    const int kk = c >> 6, t4 = (c >> 4) & 3, st = (c >> 2) & 3, u = (c >> 1) & 1;
    const int g = r & 7, h = r >> 3, sw = (t4 >> 1) | ((g & 1) << 1);
    return (((kk * 8 + g) * 4 + t4) << 4) + ((st ^ sw) << 2) + 2 * u + h;
}

/* Q'[r, c] = q[r, c] * ks[kvh, c] times 2^k_r (kva__q_row_exp) as two f16,
 * hi + lo (zeros past nrows), s_up[r] = 2^-k_r and qo[r] = sum_c Q'[r, c] o_c
 * (INT8_CHANNEL offsets); Q' in fragment order (qm_qword), hi to sQ, lo to
 * sQl ([16 D / 2] words each). packed (nrows <= 8, hi and lo both used): lo
 * of row r goes to row r + 8 of sQ, so that one m16 pass of the scores gives
 * both (qm_load::scores). In chunks of 8 channels per thread (16-byte loads
 * of q when q16, two float4 of the scales and offsets); the
 * D / 8 chunks of a row lie in consecutive lanes of one warp, which take the
 * row max and sum qo by shuffles. One barrier at the end (Q', s_qo and s_up
 * visible). */
template <int FMT, typename OT, int D>
static __device__ __forceinline__ void
qm_stage_q(const kva__cuda_quant_mma_args &q, const kva__cuda_item &w, int32_t nrows, int32_t qs,
           bool ktok, bool packed, uint32_t *sQ, uint32_t *sQl, float *s_qo, float *s_up)
{
    const kva__cuda_attn_args &a = q.a;
    constexpr int C8 = D / 8, NI = DM_M * C8 / (DM_NW * 32);
    static_assert((DM_NW * 32) % C8 == 0 && C8 <= 32, "a row's chunks in one warp");
    static_assert((DM_M * C8) % (DM_NW * 32) == 0, "whole chunk rounds");
    float vv[NI][8];
#pragma unroll
    for (int i = 0; i < NI; i++) {
        const int x = threadIdx.x + i * DM_NW * 32;
        const int r = x / C8, c = (x % C8) * 8;
        float *v = vv[i];
#pragma unroll
        for (int j = 0; j < 8; j++)
            v[j] = 0.f;
        if (r < nrows) {
            const int32_t qi = r / w.nh, hh = r - qi * w.nh;
            const int32_t head = w.kv_head * a.G + w.h0 + hh;
            const OT *qp = (const OT *)a.q + ((int64_t)(qs + w.i0 + qi) * a.H + head) * D + c;
            OT qv[8];
            if (q.q16) {
                *(uint4 *)qv = __ldg((const uint4 *)qp);
            } else {
#pragma unroll
                for (int j = 0; j < 8; j++)
                    qv[j] = qp[j];
            }
            float sv[8];
            kva__ldg_f8(q.ks + (int64_t)w.kv_head * D + c, sv);
#pragma unroll
            for (int j = 0; j < 8; j++)
                v[j] = (float)qv[j] * sv[j];
        }
    }
#pragma unroll
    for (int i = 0; i < NI; i++) {
        const int x = threadIdx.x + i * DM_NW * 32;
        const int r = x / C8, c = (x % C8) * 8;
        __half hi[8], lo[8];
        const int k = kva__q_hilo<C8>(vv[i], hi, lo);
        if (x % C8 == 0)
            s_up[r] = kva__exp2i(-k);
        const uint32_t *hw = (const uint32_t *)hi, *lw = (const uint32_t *)lo;
#pragma unroll
        for (int p = 0; p < 4; p++) {
            if (!packed) {
                sQ[qm_qword(r, c + 2 * p)] = hw[p];
                sQl[qm_qword(r, c + 2 * p)] = lw[p];
            } else if (r < DM_M / 2) {
                sQ[qm_qword(r, c + 2 * p)] = hw[p];
                sQ[qm_qword(r + DM_M / 2, c + 2 * p)] = lw[p];
            }
        }
        if (FMT == QM_I8 && !ktok) {
            const float acc =
                kva__q_offset_dot<C8, true>(hi, lo, q.ko + (int64_t)w.kv_head * D + c);
            if (x % C8 == 0)
                s_qo[r] = acc;
        }
    }
    __syncthreads();
}

/* Four codes of w as f16 pairs: int8 with the bias 1152 (I8B), else as
 * kva__cvt4_f16 (fp8 exact; int8 exact, the bias taken off per element). */
template <bool I8B>
static __device__ __forceinline__ void qm_cvt4(uint32_t w, uint32_t &lo, uint32_t &hi)
{
    if (I8B)
        kva__cvt4_f16_b1152(w, lo, hi);
    else
        kva__cvt4_f16<true>(w, lo, hi);
}

/* The load policy (decode_mma_kernel.cuh) of format FMT (QM_I8, QM_FP8 or
 * QM_V16), q and out dtype OT (__half or __nv_bfloat16), head size D = Dv.
 * Ring stages per warp (NST - 1 steps in flight), keys per step and shared
 * memory: 1-byte V at D <= 128 runs 32 keys per warp step (KT = 2): two
 * 16-key sub-tiles whose score chains interleave and share the Q'
 * fragments, one softmax update and one block-table lookup per 32 keys;
 * D 256 runs 16-key steps (registers). A stage holds the K codes [BNW, D]
 * bytes, V [BNW, D] (codes, or 16-bit for QM_V16, swizzled as the 16-bit
 * policy's tiles) and BNW key scales. QM_V16 runs 16-key steps (NST 5 / 4 /
 * 4: a 16-key stage already carries 6 KB at D 128). Q' hi and lo [16, D + 8]
 * f16 come first. */
template <int FMT, typename OT, int D_> struct qm_load {
    typedef kva__cuda_quant_mma_args Args;
    typedef qm_out<OT> Out;
    static constexpr int D = D_;
    static constexpr int VB = FMT == QM_V16 ? 2 : 1;       /* bytes per V element */
    static constexpr int KT = D <= 128 && VB == 1 ? 2 : 1; /* 16-key sub-tiles */
    static constexpr int BNW = DM_BN * KT, NT = 2 * KT;    /* keys per warp step */
    static constexpr int NST = VB == 2   ? (D == 64 ? 5 : 4)
                               : KT == 2 ? (D == 64 ? 4 : 3)
                                         : (D == 64    ? 8
                                            : D == 128 ? 6
                                                       : 5);
    static constexpr int QW = DM_M * D / 2;           /* words of Q' hi (or lo) */
    static constexpr int SQ = 2 * QW * 4;             /* Q' hi, lo [16, D] f16 (qm_qword) */
    static constexpr int VOFF = BNW * D;              /* V in the stage (bytes) */
    static constexpr int TSOFF = VOFF + BNW * D * VB; /* key scales in the stage */
    static constexpr int STAGE = TSOFF + 4 * BNW;
    static constexpr int SMEM = SQ + DM_NW * NST * STAGE;
    static constexpr int MINB = D == 64 ? 3 : D == 128 ? 2 : 1;
    static constexpr bool RAGGED = false, ISSUE_FIRST = true;
    /* Scores come out in log2 units (the softmax scale in it.f) without a
     * soft-cap; int8 V keeps one accumulator tile more: 1152 sum_k P (the
     * bias of its codes in f16, kva__cvt4_f16_b1152), taken off O at the end. */
    static constexpr bool PRESCALED = true;
    static constexpr int NX = FMT == QM_I8 ? 1 : 0;
    static_assert(DM_NW * DM_M * D * 4 <= DM_NW * NST * STAGE, "merge space");
    static_assert(STAGE % 16 == 0, "stage alignment");
    /* Of rows g4 and g4 + 8: f = 2^-k (kva__q_row_exp) times scale log2 e (no
     * soft-cap; times 1 with one), qo = sum_c Q'_c o_c (INT8_CHANNEL) and
     * nf = -qo f;
     * two: f alone would leave the normal range, so f is 2^-k and sl2 (the
     * scale) follows as a second factor; packed: rows 8-15 of Q' hold the
     * lo parts of rows 0-7 (qm_stage_q); rows8: rows 8-15 are attention
     * rows (more than 8 rows). */
    struct Item {
        float f[2], qo[2], nf[2], sl2;
        bool packed, rows8, two;
    };
    /* QM_V16: P V in the q dtype (V's), as the 16-bit policy. */
    typedef typename qm_ty<OT>::type TyV;

    static __device__ __forceinline__ const kva__cuda_attn_args &attn(const Args &q)
    {
        return q.a;
    }

    /* The body reads a step's block-table entries (key_row, one per lane)
     * one step before it issues the step's copies (issue_row), on either
     * schedule, so the copies never wait for them. */
    static constexpr bool ROWS_AHEAD = true, ROWS_AHEAD_PLAIN = true;

    static __device__ __forceinline__ int32_t key_row(const Args &q, const int32_t *bt_row,
                                                      int64_t, int32_t, int32_t kb, int32_t kend,
                                                      int lane)
    {
        return qm_key_block<BNW>(q, bt_row, kb, kend, lane);
    }

    static __device__ __forceinline__ void issue_row(const Args &q, int32_t blkv, int32_t kvh,
                                                     int32_t kb, int32_t kend, uint32_t st,
                                                     int lane)
    {
        qm_issue<D, BNW, VB>(q, blkv, kvh, kb, kend, st, lane);
    }

    static __device__ __forceinline__ void issue(const Args &q, const int32_t *bt_row, int64_t,
                                                 int32_t kvh, int32_t kb, int32_t kend, uint32_t st,
                                                 int lane)
    {
        issue_row(q, key_row(q, bt_row, 0, kvh, kb, kend, lane), kvh, kb, kend, st, lane);
    }

    /* Q' of the item (qm_stage_q, with its barrier), then the thread's rows'
     * scale and offset terms. */
    static __device__ __forceinline__ void stage_q(const Args &q, const kva__cuda_item &w,
                                                   int32_t nrows, int32_t qs, unsigned char *smem,
                                                   Item &it, int g4)
    {
        __shared__ float s_qo[DM_M], s_up[DM_M];
        uint32_t *sQ = (uint32_t *)smem;
        const bool ktok = q.kts != nullptr;
        it.packed = !ktok && nrows <= DM_M / 2;
        it.rows8 = nrows > DM_M / 2;
        qm_stage_q<FMT, OT, D>(q, w, nrows, qs, ktok, it.packed, sQ, sQ + QW, s_qo, s_up);
        /* The body multiplies by scale log2 e only under a soft-cap (PRESCALED). */
        const float sl2 = q.a.softcap > 0.f ? 1.f : q.a.scale * KVA__DMMA_LOG2E;
        it.sl2 = sl2;
        it.two = false;
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            const float up = s_up[g4 + 8 * hf], f = up * sl2;
            const bool ok = fabsf(f) >= 1.17549435e-38f && fabsf(f) <= 3.4028235e38f;
            it.two = it.two || !ok;
            it.f[hf] = f;
            it.qo[hf] = FMT == QM_I8 && !ktok ? s_qo[g4 + 8 * hf] : 0.f;
        }
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            if (it.two)
                it.f[hf] = s_up[g4 + 8 * hf];
            it.nf[hf] = -it.qo[hf] * it.f[hf];
        }
    }

    /* S = Q' K^T [16, BNW] (B column g4 is key g4 + 8 nt; sub-tile kt:
     * nt = 2 kt, 2 kt + 1). Per 64 channels: the lane's 16 channels 16 t4 ..
     * of rows g4, g4 + 8 of Q' and of its key rows. Codes are exact in f16
     * and so are their products with Q' hi and lo: S is Q' K^T to about
     * 2^-22 (the lo pass is skipped for per-token keys, where Q' = 2^k q is
     * exact in f16 down to 2^-31 of the row's max). Packed items (at most 8
     * rows: every GQA <= 8 decode) carry lo in rows 8-15, so one pass of
     * mma gives hi (rows g4) and lo (rows g4 + 8) and their sum is S; the
     * second pass runs only for items of more than 8 rows. Rows 8-15 of an
     * item of at most 8 rows that is not packed are zeros: not loaded. The
     * Q' fragments of a 64-channel slice serve every sub-tile; the
     * sub-tiles' accumulator chains interleave. Then the offset term or
     * the per-token key scales, 2^-k and the softmax scale (one factor,
     * it.f); rows 8-15 only where they are attention rows (it.rows8). */
    static __device__ __forceinline__ void scores(float sc[NT][4], const Args &q,
                                                  const unsigned char *smem,
                                                  const unsigned char *sk, uint32_t, const Item &it,
                                                  int lane)
    {
        const int g4 = lane >> 2, t4 = lane & 3;
        const bool ktok = q.kts != nullptr, lo_pass = !ktok && !it.packed;
        const uint32_t *sQ = (const uint32_t *)smem;
        const int sw = (t4 >> 1) | ((g4 & 1) << 1); /* qm_qword's rotation */
#pragma unroll
        for (int kk = 0; kk < D / 64; kk++) {
            /* The A fragments of the slice's 4 k-steps, one 16-byte load each
             * (qm_qword); rows 8-15 of an item of at most 8 rows that is not
             * packed are zeros there. */
            uint4 af[2][4];
#pragma unroll
            for (int pass = 0; pass < 2; pass++) {
                if (pass == 1 && !lo_pass)
                    break;
                const uint32_t *q0 = sQ + pass * QW + (((kk * 8 + g4) * 4 + t4) << 4);
#pragma unroll
                for (int st = 0; st < 4; st++)
                    af[pass][st] = *(const uint4 *)(q0 + ((st ^ sw) << 2));
            }
#pragma unroll
            for (int kt = 0; kt < KT; kt++) {
                uint32_t kb_[2][4][2];
#pragma unroll
                for (int nt = 0; nt < 2; nt++) {
                    const uint4 kw =
                        *(const uint4 *)(sk + qm_koff<D>(16 * kt + g4 + 8 * nt, kk * 4 + t4));
                    kva__cvt4_f16<FMT == QM_FP8>(kw.x, kb_[nt][0][0], kb_[nt][0][1]);
                    kva__cvt4_f16<FMT == QM_FP8>(kw.y, kb_[nt][1][0], kb_[nt][1][1]);
                    kva__cvt4_f16<FMT == QM_FP8>(kw.z, kb_[nt][2][0], kb_[nt][2][1]);
                    kva__cvt4_f16<FMT == QM_FP8>(kw.w, kb_[nt][3][0], kb_[nt][3][1]);
                }
#pragma unroll
                for (int pass = 0; pass < 2; pass++) {
                    if (pass == 1 && !lo_pass)
                        break;
#pragma unroll
                    for (int st = 0; st < 4; st++) {
                        const uint32_t *a4 = (const uint32_t *)&af[pass][st];
                        kva__mma_f16::mma(sc[2 * kt], a4, kb_[0][st][0], kb_[0][st][1]);
                        kva__mma_f16::mma(sc[2 * kt + 1], a4, kb_[1][st][0], kb_[1][st][1]);
                    }
                }
            }
        }
        /* Element e: row g4 + (e >> 1) * 8, key kb + nt * 8 + 2 * t4 + (e & 1).
         * Rows 8-15 of an item of at most 8 rows are left as they are (the
         * softmax gives them P 0). */
        if (it.packed) {
            /* Row g4's S is its hi part plus its lo part (row g4 + 8). */
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                sc[nt][0] += sc[nt][2];
                sc[nt][1] += sc[nt][3];
            }
        }
        if (ktok) {
            /* S ts_j f. */
            const float *ts = (const float *)(sk + TSOFF);
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                const float2 t2 = *(const float2 *)(ts + nt * 8 + 2 * t4);
#pragma unroll
                for (int e = 0; e < 4; e++)
                    if (e < 2 || it.rows8)
                        sc[nt][e] *= (e & 1 ? t2.y : t2.x) * it.f[e >> 1];
            }
        } else {
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    if (e < 2 || it.rows8)
                        sc[nt][e] = fmaf(sc[nt][e], it.f[e >> 1], it.nf[e >> 1]);
        }
        if (it.two) {
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    sc[nt][e] *= it.sl2;
        }
    }

    /* O += P V of the step: QM_V16 as the 16-bit policy (P in V's dtype, V
     * by ldmatrix.trans); else O += P C_V with P [16, 16] of each sub-tile in
     * f16 as the A operand (k = key); int8 codes as c + 1152, and
     * o[D / 8] += 1152 P (every column: 1152 times the row's sum of P as f16,
     * exact), which store_acc takes off. */
    static __device__ __forceinline__ void pv(float o[D / 8 + NX][4], const float sc[NT][4],
                                              const unsigned char *stp, uint32_t st, int lane)
    {
        const int g4 = lane >> 2, t4 = lane & 3;
        if constexpr (FMT == QM_V16) {
            static_assert(KT == 1, "16-bit V: 16-key steps");
            kva__dmma_pv16<TyV, D>(o, sc, st + VOFF, lane);
        } else {
            const unsigned char *sv = stp + VOFF;
            uint32_t pa[KT][4];
#pragma unroll
            for (int kt = 0; kt < KT; kt++)
                kva__dmma_pack_p<kva__mma_f16>(sc + 2 * kt, pa[kt]);
#pragma unroll
            for (int g = 0; g < D / 32; g++) {
#pragma unroll
                for (int kt = 0; kt < KT; kt++) {
                    /* Channels 32 g + 4 g4 .. +3 of keys 16 kt + (2t4, 2t4+1,
                     * 2t4+8, 2t4+9). */
                    const int c = 2 * g + (g4 >> 2), b = 4 * (g4 & 3), k0 = 16 * kt + 2 * t4;
                    const uint32_t r0 = *(const uint32_t *)(sv + qm_voff<D>(k0, c) + b);
                    const uint32_t r1 = *(const uint32_t *)(sv + qm_voff<D>(k0 + 1, c) + b);
                    const uint32_t r8 = *(const uint32_t *)(sv + qm_voff<D>(k0 + 8, c) + b);
                    const uint32_t r9 = *(const uint32_t *)(sv + qm_voff<D>(k0 + 9, c) + b);
                    uint32_t b0[4], b1[4];
                    qm_cvt4<FMT == QM_I8>(__byte_perm(r0, r1, 0x5140), b0[0], b0[1]);
                    qm_cvt4<FMT == QM_I8>(__byte_perm(r0, r1, 0x7362), b0[2], b0[3]);
                    qm_cvt4<FMT == QM_I8>(__byte_perm(r8, r9, 0x5140), b1[0], b1[1]);
                    qm_cvt4<FMT == QM_I8>(__byte_perm(r8, r9, 0x7362), b1[2], b1[3]);
#pragma unroll
                    for (int j = 0; j < 4; j++)
                        kva__mma_f16::mma(o[4 * g + j], pa[kt], b0[j], b1[j]);
                }
            }
            if constexpr (NX == 1) {
                /* 1152 in f16 (0x6480) as every element of B. */
#pragma unroll
                for (int kt = 0; kt < KT; kt++)
                    kva__mma_f16::mma(o[D / 8], pa[kt], 0x64806480u, 0x64806480u);
            }
        }
    }

    /* Row half hf of O: tile 4g + j, column n = 2 t4 (+1) is channel
     * 32 g + 4 n + j; QM_V16: the standard layout, channels 8 n + 2 t4 (+1).
     * int8: less the bias sum (o[D / 8], pv). */
    static __device__ __forceinline__ void store_acc(float *dst, const float o[D / 8 + NX][4],
                                                     int hf, int t4)
    {
        const float bias = NX == 1 ? o[D / 8 + NX - 1][2 * hf] : 0.f;
#pragma unroll
        for (int n = 0; n < D / 8; n++) {
            const int ch = FMT == QM_V16 ? 8 * n + 2 * t4 : 32 * (n >> 2) + 8 * t4 + (n & 3);
            dst[ch] = o[n][2 * hf] - bias;
            dst[ch + (FMT == QM_V16 ? 1 : 4)] = o[n][2 * hf + 1] - bias;
        }
    }

    /* sum_j p_j v_jd in value units (0 when no key is visible): the V scales. */
    static __device__ __forceinline__ float value(const Args &q, const kva__cuda_item &w, int32_t d,
                                                  float L, float O)
    {
        const int64_t sv_ = (int64_t)w.kv_head * D + d;
        if (FMT == QM_I8)
            return q.vs[sv_] * (O - q.vo[sv_] * L);
        if (FMT == QM_FP8)
            return q.vs[sv_] * O;
        return O;
    }
};

/* A kernel of the family and its dynamic shared memory (bytes). */
typedef dm_launch<kva__cuda_quant_mma_args> qm_launch;

/* qm_load of one format and q dtype as a family over D (dm_pick_d). */
template <int FMT, typename OT> struct qm_family {
    template <int D> using pol = qm_load<FMT, OT, D>;
};

/* The kernel for format FMT and q dtype dt (F16 or BF16) and head size D;
 * fn NULL where there is none. Instantiated by decode_mma_quant_{i8,fp8,v16}.cu. */
template <int FMT> static qm_launch qm_pick_dt(kva_dtype dt, int32_t D)
{
    if (dt == KVA_DTYPE_BF16)
        return dm_pick_d<qm_family<FMT, __nv_bfloat16>::template pol>(D);
    if (dt == KVA_DTYPE_F16)
        return dm_pick_d<qm_family<FMT, __half>::template pol>(D);
    return qm_launch{NULL, 0};
}

/* The kernel of each family for q dtype dt (F16 or BF16) and head size D;
 * fn NULL where the family has none. */
qm_launch kva__dmma_quant_pick_i8(kva_dtype dt, int32_t D);
qm_launch kva__dmma_quant_pick_fp8(kva_dtype dt, int32_t D);
qm_launch kva__dmma_quant_pick_v16(kva_dtype dt, int32_t D);

#endif /* KVA_CUDA_DECODE_MMA_QUANT_CUH */
