/*
 * indexer_wgmma.cu - the lightning indexer's logits kernel on sm_90a wgmma
 * (DeepSeek's shape: Hi 64 index heads of D 128); indexer.cu plans and
 * launches it where the build and device have sm_90a, and keeps the
 * mma.sync kernel for other shapes and devices.
 *
 * One CTA of two warpgroups per tile = (up to 4 consecutive query tokens of
 * one request) x (up to IDX_CHUNK keys). The roles of index_logits_kernel
 * are swapped: the keys are the M side, the queries the N side, so
 *   S [64 keys, 128 = 2 tokens x 64 heads] = K [64, 128] . Q_pair^T
 * is one m64n128k16 chain of 8 wgmma per warpgroup and token pair, both
 * operands K-major in 128-byte-swizzled shared memory. Each accumulator row
 * is one key: ReLU, the head weights and the sum over a token's 64 heads
 * happen in the thread (16 columns) and over the 4 threads of a quad
 * (2 shuffles), with no exchange between warps and no contamination
 * between keys (a NaN key spoils only its own row).
 *
 * The operand type M is a trait: the q dtype (bf16, f16; m64n128k16, FP8
 * key codes converted exactly to it) or e4m3 (iwg_e4m3: the FP8-q mode of
 * kva_plan_desc.index_q_quant over FP8_TOKEN keys; q holds the codes the
 * run quantized, the weights their scales, and the key codes go to shared
 * memory as they are, m64n128k32 at twice the rate).
 *
 * Per step of 128 keys (warpgroup w takes keys 64 w .. 64 w + 63): the
 * codes prefetched into registers during the previous step are converted
 * exactly to the q dtype (or copied, e4m3) and stored swizzled, the next step's codes and
 * scales are loaded into registers (in flight during the products), then
 * both token pairs run. Shared memory (~99 KB) and <= 128 registers keep
 * two CTAs per SM, so one CTA's conversion overlaps the other's products.
 */
extern "C" {
#include "cuda_backend.h"
}
#include "cuda_check.h"
#include "indexer.cuh"
#include "wgmma_ptx.cuh"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define IDX_WG_BODY 1
#endif

#define WG_KEYS 128                             /* keys per step */
#define WG_OP_BYTES (128 * IDX_WG_D * 2)        /* one [128, D] 16-bit operand (e4m3: half) */
#define WG_Q_BYTES (IDX_WG_G / 2 * WG_OP_BYTES) /* the token pairs' operands */
#define WG_SMEM (WG_Q_BYTES + WG_OP_BYTES + IDX_WG_G * IDX_WG_HI * 4 + WG_KEYS * 4 + 1024)

/* The operand type of the FP8-q mode (kva_plan_desc.index_q_quant) over
 * FP8_TOKEN keys: q and key codes both e4m3, m64n128k32 products; q is
 * the codes kva__cuda_indexer_parts quantized into the workspace. */
struct iwg_e4m3 {
    typedef uint8_t elem;
};

/* Byte offset of 16-byte chunk ch (8 elements) of row r in a [128, D]
 * operand with 128-byte swizzle: column blocks of 64 elements, [128][128 B]
 * each, chunk (ch % 8) ^ (r % 8) within the row. */
#ifdef IDX_WG_BODY
static __device__ __forceinline__ uint32_t iwg_swz(int r, int ch)
{
    return (uint32_t)((ch >> 3) * 128 * 128 + r * 128 + (((ch & 7) ^ (r & 7)) << 4));
}
#endif

/* D [64, 128] (+)= A [64, k] B [k, 128] by operand type (k = 32 bytes). */
template <typename M> struct iwg_mma;
#ifdef IDX_WG_BODY
#define IWG_MMA(Ty, ty)                                                                            \
    template <> struct iwg_mma<Ty> {                                                               \
        static __device__ __forceinline__ void ss(float d[64], uint64_t a, uint64_t b, int acc)    \
        {                                                                                          \
            if (acc)                                                                               \
                kva__wgmma_ss_m64n128_##ty(d, a, b, 1);                                            \
            else                                                                                   \
                kva__wgmma_ss0_m64n128_##ty(d, a, b);                                              \
        }                                                                                          \
    };
IWG_MMA(kva__mma_bf16, bf16)
IWG_MMA(kva__mma_f16, f16)
IWG_MMA(iwg_e4m3, e4m3)
#undef IWG_MMA
#endif

/*
 * q: [T, 64, 128] of M::elem (the q dtype, or e4m3 codes); wts: [T, 64];
 * cache: index-key blocks (FP8_TOKEN: B rows of 128 codes then B float32
 * scales; else B rows of 128 values of the q dtype); tiles: [grid] {request, first token, tokens,
 * first key}; tok_n: [T] keys each token scores; bt: [R, stride];
 * logits: [tokens of the pass, smax], row t - tok_base. Hi and D are the
 * plan's (64, 128: the kernel is built for them).
 */
template <typename M, bool FP8>
__global__ void __launch_bounds__(IDX_WG_THREADS, 2)
    index_logits_wg_kernel(const typename M::elem *q, const float *wts, const char *cache,
                           int64_t block_bytes, const int4 *tiles, const int32_t *tok_n,
                           const int32_t *bt, int32_t stride, int32_t Hi, int32_t D, int32_t B,
                           float *logits, int32_t smax, int32_t tok_base)
{
#ifdef IDX_WG_BODY
    constexpr int NV = FP8 ? 4 : 8; /* 16-byte key chunks per thread and step */
    /* Bytes per operand row and of one [128, D] operand; e4m3 operands
     * (QF8) take the key codes as they are, 16-bit ones their values. */
    constexpr bool QF8 = sizeof(typename M::elem) == 1;
    constexpr int ROWB = IDX_WG_D * (int)sizeof(typename M::elem), OPB = 128 * ROWB;
    static_assert(!QF8 || FP8, "e4m3 operands need FP8_TOKEN keys");
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const uint32_t raw_u = kva__smem_u32(smem_raw);
    const uint32_t pad = (1024u - (raw_u & 1023u)) & 1023u; /* swizzle atoms: 1024-aligned */
    unsigned char *sq = smem_raw + pad, *sk = sq + WG_Q_BYTES;
    float *wsm = (float *)(sk + WG_OP_BYTES); /* [4 tokens, 64] */
    float *scs = wsm + IDX_WG_G * IDX_WG_HI;  /* [128] key scales of the step */
    const uint32_t sq_u = raw_u + pad, sk_u = sq_u + WG_Q_BYTES;
    const int4 tile = tiles[blockIdx.x];
    const int32_t r = tile.x, t0 = tile.y, nt = tile.z, k0 = tile.w;
    const int tid = threadIdx.x;
    (void)Hi, (void)D;

    /* Queries: token tok's head h is row (tok % 2) * 64 + h of pair tok / 2;
     * absent tokens are zeros (their logits are not written). */
    for (int e = tid; e < IDX_WG_G * IDX_WG_HI * (ROWB / 16); e += IDX_WG_THREADS) {
        const int row = e / (ROWB / 16), ch = e % (ROWB / 16);
        uint4 v = make_uint4(0u, 0u, 0u, 0u);
        if (row / IDX_WG_HI < nt)
            v = *(const uint4 *)((const char *)q + ((int64_t)t0 * IDX_WG_HI + row) * ROWB +
                                 ch * 16);
        *(uint4 *)(sq + (row >> 7) * OPB + iwg_swz(row & 127, ch)) = v;
    }
    for (int e = tid; e < IDX_WG_G * IDX_WG_HI; e += IDX_WG_THREADS)
        wsm[e] = e / IDX_WG_HI < nt ? wts[(int64_t)t0 * IDX_WG_HI + e] : 0.0f;

    const int32_t n_last = tok_n[t0 + nt - 1];
    const int32_t kend = n_last < k0 + IDX_CHUNK ? n_last : k0 + IDX_CHUNK;
    const int32_t *btr = bt + (int64_t)r * stride;
    /* This thread's chunks: FP8 keys (tid / 8) + 32 i, 16 codes at c = tid % 8;
     * 16-bit keys (tid / 16) + 16 i, 8 values at c = tid % 16. */
    const int kstep = FP8 ? 32 : 16, c = FP8 ? (tid & 7) : (tid & 15);
    const int jb = FP8 ? (tid >> 3) : (tid >> 4);
    uint4 kr[NV];
    float sr[NV];
    /* Loads step kb's chunks (and FP8 scales) into kr / sr. */
#define IWG_LOAD(kb)                                                                               \
    _Pragma("unroll") for (int i = 0; i < NV; i++)                                                 \
    {                                                                                              \
        const int32_t key = (kb) + jb + kstep * i;                                                 \
        kr[i] = make_uint4(0u, 0u, 0u, 0u);                                                        \
        sr[i] = 1.0f;                                                                              \
        if (key < kend) {                                                                          \
            const char *base = cache + (int64_t)btr[key / B] * block_bytes;                        \
            const int32_t off = key % B;                                                           \
            if (FP8) {                                                                             \
                kr[i] = ld16(base + (int64_t)off * IDX_WG_D + c * 16, block_bytes);                \
                if (c == 0)                                                                        \
                    sr[i] = *(const float *)(base + (int64_t)B * IDX_WG_D + (int64_t)off * 4);     \
            } else {                                                                               \
                kr[i] = *(const uint4 *)(base + ((int64_t)off * IDX_WG_D + c * 8) * 2);            \
            }                                                                                      \
        }                                                                                          \
    }
    {
        IWG_LOAD(k0);
    }

    const int wg = tid >> 7, wq = (tid >> 5) & 3, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const uint64_t dk = kva__wgmma_desc(sk_u + (uint32_t)wg * 64 * 128, 16, 1024);
    const uint64_t dq = kva__wgmma_desc(sq_u, 16, 1024);
    for (int32_t kb = k0; kb < kend; kb += WG_KEYS) {
        __syncthreads(); /* the previous step's products and scales are consumed */
#pragma unroll
        for (int i = 0; i < NV; i++) {
            const int j = jb + kstep * i;
            if constexpr (QF8) {
                *(uint4 *)(sk + iwg_swz(j, c)) = kr[i]; /* codes as they are */
                if (c == 0)
                    scs[j] = sr[i];
            } else if constexpr (FP8) {
                uint4 lo, hi;
                cvt4<M>(kr[i].x, lo.x, lo.y);
                cvt4<M>(kr[i].y, lo.z, lo.w);
                cvt4<M>(kr[i].z, hi.x, hi.y);
                cvt4<M>(kr[i].w, hi.z, hi.w);
                *(uint4 *)(sk + iwg_swz(j, 2 * c)) = lo;
                *(uint4 *)(sk + iwg_swz(j, 2 * c + 1)) = hi;
                if (c == 0)
                    scs[j] = sr[i];
            } else {
                *(uint4 *)(sk + iwg_swz(j, c)) = kr[i];
                if (c == 0)
                    scs[j] = 1.0f;
            }
        }
        kva__fence_proxy_async();
        if (kb + WG_KEYS < kend) {
            IWG_LOAD(kb + WG_KEYS); /* in flight during the products */
        }
        __syncthreads();
        const int32_t key0 = kb + wg * 64; /* this warpgroup's first key */
        for (int p = 0; 2 * p < nt; p++) {
            const int32_t tl = 2 * p + 1 < nt ? 2 * p + 1 : nt - 1;
            if (key0 >= tok_n[t0 + tl])
                continue; /* all after the pair's tokens (uniform per warpgroup) */
            float d[64];
            kva__wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < ROWB / 32; kk++) { /* 32 bytes of the rows per product */
                const uint32_t o = (uint32_t)((kk >> 2) * 128 * 128 + (kk & 3) * 32);
                iwg_mma<M>::ss(d, dk + (uint64_t)(o >> 4), dq + (uint64_t)((p * OPB + o) >> 4),
                               kk > 0);
            }
            kva__wgmma_commit();
            kva__wgmma_wait<0>();
#pragma unroll
            for (int e = 0; e < 64; e++)
                kva__reg_fence(d[e]);
            /* d[4 j + e]: key row 16 wq + g + 8 (e / 2), column 8 j + 2 t + e % 2
             * = token j / 8 of the pair, head 8 (j % 8) + 2 t + e % 2. */
            float part[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}}; /* [token of pair][row half] */
#pragma unroll
            for (int j = 0; j < 16; j++) {
                const float2 w =
                    *(const float2 *)(wsm + (2 * p + j / 8) * IDX_WG_HI + 8 * (j % 8) + 2 * t);
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const float x = d[4 * j + e];
                    part[j / 8][e / 2] +=
                        (e & 1 ? w.y : w.x) * (x < 0.0f ? 0.0f : x); /* NaN kept */
                }
            }
#pragma unroll
            for (int a = 0; a < 2; a++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    float v = part[a][h];
                    v += __shfl_xor_sync(0xffffffffu, v, 1);
                    v += __shfl_xor_sync(0xffffffffu, v, 2);
                    part[a][h] = v;
                }
            /* Lane t of the quad writes token t / 2 of the pair, row half t % 2. */
            const float v = t == 0   ? part[0][0]
                            : t == 1 ? part[0][1]
                            : t == 2 ? part[1][0]
                                     : part[1][1];
            const int tok = 2 * p + (t >> 1);
            const int32_t col = wg * 64 + wq * 16 + g + 8 * (t & 1), key = kb + col;
            if (tok < nt && key < tok_n[t0 + tok])
                logits[(int64_t)(t0 + tok - tok_base) * smax + key] = v * scs[col];
        }
    }
#undef IWG_LOAD
#else
    (void)q, (void)wts, (void)cache, (void)block_bytes, (void)tiles, (void)tok_n, (void)bt;
    (void)stride, (void)Hi, (void)D, (void)B, (void)logits, (void)smax, (void)tok_base;
#endif
}

size_t kva__cuda_index_wg_smem(void)
{
    return WG_SMEM;
}

template <typename M, bool FP8> static void *wg_fn()
{
    return (void *)index_logits_wg_kernel<M, FP8>;
}

void *kva__cuda_index_wg_fn(kva_dtype q_dtype, int fp8, int qf8)
{
    if (qf8 && fp8)
        return wg_fn<iwg_e4m3, true>();
    if (q_dtype == KVA_DTYPE_BF16)
        return fp8 ? wg_fn<kva__mma_bf16, true>() : wg_fn<kva__mma_bf16, false>();
    return fp8 ? wg_fn<kva__mma_f16, true>() : wg_fn<kva__mma_f16, false>();
}
