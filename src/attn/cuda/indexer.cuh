/*
 * indexer.cuh - what the CUDA lightning indexer's files share (indexer.cu:
 * plan, mma.sync logits kernel, top-K, run; indexer_wgmma.cu: the sm_90a
 * logits kernels; indexer_qquant.cu: the FP8-q mode's queries;
 * indexer_probe.cu: the benchmark baseline; index_cache.cu: the FP8_TOKEN
 * quantization): tile sizes, the plan's device part, the exact fp8 key
 * conversion, the key loads, the row quantization and the top-K's order
 * key. CUDA C++ only; after cuda_backend.h.
 */
#ifndef KVA_CUDA_INDEXER_CUH
#define KVA_CUDA_INDEXER_CUH

#include "mma_ptx.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <float.h>

#define IDX_WARPS 4
#define IDX_KEYS (IDX_WARPS * 32) /* keys per step of a logits CTA */
#define IDX_CHUNK 2048            /* keys per tile */
#define IDX_MAX_G 4               /* query tokens per tile */
#define IDX_SMEM_MAX (112 * 1024) /* two logits CTAs per SM */
#define IDX_TOPK_MAX 4096
#define IDX_TOPK_THREADS 1024
#define IDX_TOPK_BUF 4096 /* candidates of the K-th key's first-pass bin in shared memory */
#define IDX_WS_FLOATS ((size_t)1 << 28) /* 1 GiB of logits per pass */
#define IDX_HIST_BINS 2048              /* the top-K's first radix pass: bits 31-21 */

/* The CUDA part of an indexer plan (kva__cuda_plan.index). */
typedef struct kva__cuda_index_plan {
    void *dev;            /* one device allocation: tiles, tok_n, block table */
    const int4 *tiles;    /* [num_tiles] {request, first token, tokens, first key} */
    const int32_t *tok_n; /* [T] keys each token scores (pos + 1) */
    const int32_t *bt;    /* [R, stride] */
    int32_t num_tiles, G, smax, stride, num_passes;
    int32_t *pass;         /* host [num_passes + 1, 2]: first tile, first token of each pass */
    size_t smem;           /* dynamic shared memory of the logits kernel */
    int wg;                /* 1: the sm_90a wgmma logits kernel (indexer_wgmma.cu) */
    int qf8;               /* 1: index_q_quant FP8_TOKEN (q quantized by index_qquant_kernel) */
    int topk_full;         /* 1: every top-K pass reads the whole row (tests, benchmarks) */
    int ws;                /* 1: FP8-q over FP8_TOKEN keys may take the warp-specialized kernel */
    int num_sms;           /* its grid: one persistent CTA per SM */
    void *tmap_encode;     /* cuTensorMapEncodeTiled, for its tensor maps */
    size_t qc_off, wq_off; /* FP8-q: workspace bytes of q's codes, the scaled weights */
    size_t hist_off;       /* ws: workspace bytes of the first radix pass's counts */
} kva__cuda_index_plan;

/* Four fp8 e4m3 codes of w as two packed pairs of the mma element type (exact). */
template <typename M>
static __device__ __forceinline__ void cvt4(uint32_t w, uint32_t &lo, uint32_t &hi)
{
    const __half2_raw a =
        __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(w & 0xffffu), __NV_E4M3);
    const __half2_raw b = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(w >> 16), __NV_E4M3);
    if constexpr (sizeof(typename M::elem) == 2 && __is_same(typename M::elem, __half)) {
        lo = (uint32_t)a.x | ((uint32_t)a.y << 16);
        hi = (uint32_t)b.x | ((uint32_t)b.y << 16);
    } else {
        const float2 fa = __half22float2(__half2(a)), fb = __half22float2(__half2(b));
        lo = M::pack(fa.x, fa.y);
        hi = M::pack(fb.x, fb.y);
    }
}

/* The FP8_TOKEN quantization of one row by one warp (the key write of
 * index_cache.cu, the FP8-q mode's queries): each lane's amax of its
 * elements (NaN left out) -> the row's s = max(amax / 448, FLT_MIN), on
 * every lane; then each element's code is e4m3(x / s), x / s rounded as
 * the host's float division, saturating (NaN -> NaN). */
static __device__ __forceinline__ float kva__fp8_token_scale_warp(float amax)
{
    for (int o = 16; o > 0; o >>= 1) {
        const float x = __shfl_xor_sync(0xffffffffu, amax, o);
        amax = x > amax ? x : amax;
    }
    const float s = amax / 448.0f;
    return s > FLT_MIN ? s : FLT_MIN;
}
static __device__ __forceinline__ unsigned char kva__fp8_token_code(float x, float s)
{
    return (unsigned char)__nv_cvt_float_to_fp8(__fdiv_rn(x, s), __NV_SATFINITE, __NV_E4M3);
}

/* Order-preserving key of a logit (the top-K's radix order): -0 as +0,
 * NaN lowest (0). */
static __device__ __forceinline__ uint32_t kva__index_order_key(float x)
{
    if (x != x)
        return 0u;
    const uint32_t u = __float_as_uint(x == 0.0f ? 0.0f : x);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* 16 bytes at p: one vector load when blocks are 16-byte multiples, else
 * four words (FP8_TOKEN blocks of B (D + 4) bytes are 4-byte multiples). */
static __device__ __forceinline__ uint4 ld16(const char *p, int64_t block_bytes)
{
    if ((block_bytes & 15) == 0)
        return *(const uint4 *)p;
    const uint32_t *u = (const uint32_t *)p;
    return make_uint4(u[0], u[1], u[2], u[3]);
}

/* The FP8-q mode's queries (indexer_qquant.cu): rows = T Hi rows of q
 * [rows, D] (f16 or bf16 q_dtype) quantized as FP8_TOKEN key rows into qc
 * [rows, D] (e8: e4m3 codes; else their exact values in q_dtype) and
 * wq [rows] = wts * s, on stream s. */
void kva__cuda_index_qquant(kva_dtype q_dtype, int e8, const void *q, const float *wts,
                            int64_t rows, int32_t D, void *qc, float *wq, cudaStream_t s);

/* The sm_90a logits kernel (indexer_wgmma.cu): Hi = IDX_WG_HI index heads of
 * D = IDX_WG_D, tiles of up to IDX_WG_G tokens x IDX_CHUNK keys, run by
 * IDX_WG_THREADS threads with kva__cuda_index_wg_smem() bytes of dynamic
 * shared memory; the kernel has index_logits_kernel's parameters.
 * kva__cuda_index_wg_fn gives the instantiation for a q dtype and key
 * format (fp8: FP8_TOKEN codes, else keys of the q dtype); qf8 with fp8:
 * the e4m3 x e4m3 one (q as e4m3 codes). */
#define IDX_WG_HI 64
#define IDX_WG_D 128
#define IDX_WG_G 4
#define IDX_WG_THREADS 256
size_t kva__cuda_index_wg_smem(void);
void *kva__cuda_index_wg_fn(kva_dtype q_dtype, int fp8, int qf8);

/* The warp-specialized sm_90a kernel (indexer_wgmma.cu) of the FP8-q mode
 * over FP8_TOKEN keys with B a multiple of 64: TMA-fed, persistent CTAs
 * of three warpgroups. kva__cuda_index_ws_launch encodes its tensor maps
 * and launches it on tiles [0, ntiles) of a pass; it returns 0 (nothing
 * launched) when a map cannot be encoded. Besides the logits it counts
 * each row's logits per bin of the top-K's first radix pass into hist. */
typedef struct kva__cuda_index_ws_args {
    void *encode;      /* cuTensorMapEncodeTiled (kva__cuda_index_ws_encoder) */
    const void *qc;    /* [T, 64, 128] e4m3 codes of q */
    const float *wq;   /* [T, 64] scaled weights */
    const char *cache; /* FP8_TOKEN blocks of block_bytes = B (128 + 4) */
    int64_t block_bytes;
    int32_t num_blocks, B, T;
    const int4 *tiles; /* [ntiles] */
    int32_t ntiles;
    const int32_t *tok_n, *bt; /* [T], [R, stride] */
    int32_t stride;
    float *logits; /* [tokens of the pass, smax] */
    int32_t smax, tok_base;
    uint32_t
        *hist; /* [tokens of the pass, IDX_HIST_BINS], zeroed: counts of the top-K's first pass */
    int grid;  /* CTAs at most (the SM count) */
} kva__cuda_index_ws_args;
size_t kva__cuda_index_ws_smem(void);
void *kva__cuda_index_ws_fn(void);
void *kva__cuda_index_ws_encoder(void);
int kva__cuda_index_ws_launch(const kva__cuda_index_ws_args *a, cudaStream_t s);

#endif
