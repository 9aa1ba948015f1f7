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
#include "async_ptx.cuh"
#include "wgmma_ptx.cuh"

#include <cuda.h> /* CUtensorMap (types only; the driver entry point is looked up) */
#include <cudaTypedefs.h>
#include <string.h>

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

/* ---- the warp-specialized e4m3 kernel ---- */

#define WS_NST 8                                /* key ring stages, one page each */
#define WS_PAGE 64                              /* keys per page: a consumer's M */
#define WS_PB (WS_PAGE * IDX_WG_D)              /* code bytes of a page */
#define WS_QB (IDX_WG_G * IDX_WG_HI * IDX_WG_D) /* a tile's q codes */
#define WS_WB (IDX_WG_G * IDX_WG_HI * 4)        /* a tile's scaled weights */
/* Shared memory: q [2][WS_QB], keys [WS_NST][WS_PB] (1024-byte aligned for
 * the swizzle), weights [2][WS_WB], key scales [WS_NST][WS_PAGE], then the
 * mbarriers: qfull [2], qempty [2], full [WS_NST], empty [WS_NST]. */
#define WS_OFF_K (2 * WS_QB)
#define WS_OFF_W (WS_OFF_K + WS_NST * WS_PB)
#define WS_OFF_S (WS_OFF_W + 2 * WS_WB)
#define WS_OFF_H (WS_OFF_S + WS_NST * WS_PAGE * 4) /* [4 tokens, IDX_HIST_BINS] counts */
#define WS_OFF_BAR (WS_OFF_H + IDX_WG_G * IDX_HIST_BINS * 4)
#define WS_SMEM (WS_OFF_BAR + (4 + 2 * WS_NST) * 8 + 1024)

/* The tensor maps of one launch: keys (e4m3 codes of the FP8_TOKEN cache,
 * dims (D bytes, B rows, NB blocks), box 128 x 64 x 1) and q's codes
 * (dims (D bytes, T Hi rows), box 128 x 256: one tile's 4 tokens), both
 * with the 128-byte swizzle the wgmma descriptors read. */
struct iws_maps {
    CUtensorMap k, q;
};

#ifdef IDX_WG_BODY
/* ReLU that keeps NaN (a NaN key spoils its own logit only). */
static __device__ __forceinline__ float iws_relu(float x)
{
    float y;
    asm("max.NaN.f32 %0, %1, 0f00000000;\n" : "=f"(y) : "f"(x));
    return y;
}
#define IWS_D16(b) KVA__WG_D8("+f", b), KVA__WG_D8("+f", b + 8)
/* D [64, 256] (+)= A [64, 32] B [32, 256], e4m3 from shared memory, fp32
 * accumulators d[128] (the m64nNk16 fragment of wgmma_ptx.cuh, j < 32). */
static __device__ __forceinline__ void iws_mma(float d[128], uint64_t da, uint64_t db, int acc)
{
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k32.f32.e4m3.e4m3 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "
        "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, "
        "%36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, "
        "%53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, "
        "%70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, "
        "%87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, "
        "%103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, "
        "%117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, %128, %129, p, 1, "
        "1;\n}\n"
        : IWS_D16(0), IWS_D16(16), IWS_D16(32), IWS_D16(48), IWS_D16(64), IWS_D16(80), IWS_D16(96),
          IWS_D16(112)
        : "l"(da), "l"(db), "r"(acc));
}
#undef IWS_D16
#endif

/*
 * The FP8-q mode over FP8_TOKEN keys with block size B a multiple of 64,
 * warp-specialized: warpgroup 0 is the producer (one warp: TMA loads of
 * each tile's q codes and scaled weights into one of two buffers, and of
 * the keys, one 64-key page = an 8 KB box of codes plus its 256 bytes of
 * scales per stage of a WS_NST-deep ring, through mbarriers), warpgroups
 * 1 and 2 the consumers. The CTAs are persistent (grid <= SMs; CTA i takes
 * tiles i, i + grid, ...) and number the pages they load 0, 1, 2, ... over
 * all their tiles; consumer c takes the pages of parity c:
 *   S [64 keys, 256 = 4 tokens x 64 heads] = K_page [64, 128] . Q_tile^T
 * as 4 m64n256k32 e4m3 wgmma, issued in page order through two named
 * barriers (consumer c issues page n after the other issued page n - 1),
 * so one consumer's epilogue (ReLU, head weights, the sums over heads)
 * runs under the other's products. The epilogue is index_logits_wg_kernel's
 * with 4 tokens per accumulator row and the quad's sums reduced and
 * scattered in 6 shuffles (lane t of a quad ends with token t). The
 * epilogue also counts each logit in its bin of the top-K's first radix
 * pass (shared memory, per token of the tile); at the end of a tile both
 * consumers add the counts to hist and clear them, so the top-K kernel
 * skips that pass over the row.
 * wq: [T, 64] scaled weights; tiles [ntiles]; hist: [tokens of the pass,
 * IDX_HIST_BINS], zeroed; the rest as index_logits_wg_kernel.
 */
__global__ void __launch_bounds__(384, 1)
    index_logits_ws_kernel(const __grid_constant__ iws_maps tm, const char *cache,
                           int64_t block_bytes, const float *wq, const int4 *tiles, int32_t ntiles,
                           const int32_t *tok_n, const int32_t *bt, int32_t stride, int32_t B,
                           float *logits, int32_t smax, int32_t tok_base, uint32_t *hist)
{
#ifdef IDX_WG_BODY
    extern __shared__ __align__(16) unsigned char smem_raw[]; /* aligned up to 1024 below */
    const uint32_t base = (kva__smem_u32(smem_raw) + 1023u) & ~1023u;
    const unsigned char *sbase = smem_raw + (base - kva__smem_u32(smem_raw));
    const uint32_t qfull = base + WS_OFF_BAR, qempty = qfull + 16, full = qfull + 32,
                   empty = full + 8 * WS_NST;
    const int tid = threadIdx.x, wg = tid >> 7, lane = tid & 31;
    if (tid == 0) {
        for (int i = 0; i < 2; i++) {
            kva__mbar_init(qfull + 8 * i, 1);
            kva__mbar_init(qempty + 8 * i, 256);
        }
        for (int i = 0; i < WS_NST; i++) {
            kva__mbar_init(full + 8 * i, 1);
            kva__mbar_init(empty + 8 * i, 128);
        }
    }
    __syncthreads();
    if (wg == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
        if (tid >= 32)
            return;
        uint32_t gk = 0; /* pages loaded so far */
        int li = 0;      /* tiles loaded so far */
        for (int ti = blockIdx.x; ti < ntiles; ti += gridDim.x, li++) {
            const int4 tile = tiles[ti];
            const int32_t n_last = tok_n[tile.y + tile.z - 1];
            const int32_t kend = n_last < tile.w + IDX_CHUNK ? n_last : tile.w + IDX_CHUNK;
            const int np = (kend - tile.w + WS_PAGE - 1) / WS_PAGE; /* <= 32 */
            /* Lane p holds the block of page p (no dependent load per page). */
            int32_t blk = 0;
            if (lane < np)
                blk = bt[(int64_t)tile.x * stride + (tile.w + WS_PAGE * lane) / B];
            const int qs = li & 1;
            if (li >= 2)
                kva__mbar_wait(qempty + 8 * qs, ((li >> 1) - 1) & 1);
            if (lane == 0) {
                kva__mbar_expect_tx(qfull + 8 * qs, WS_QB + (uint32_t)tile.z * IDX_WG_HI * 4);
                kva__tma_load2(base + qs * WS_QB, &tm.q, 0, tile.y * IDX_WG_HI, qfull + 8 * qs);
                kva__bulk_load(base + WS_OFF_W + qs * WS_WB, wq + (int64_t)tile.y * IDX_WG_HI,
                               (uint32_t)tile.z * IDX_WG_HI * 4, qfull + 8 * qs);
            }
            for (int p = 0; p < np; p++, gk++) {
                const int st = (int)(gk % WS_NST);
                const int32_t b = __shfl_sync(0xffffffffu, blk, p);
                if (gk >= WS_NST)
                    kva__mbar_wait(empty + 8 * st, ((gk / WS_NST) - 1) & 1);
                if (lane == 0) {
                    const int32_t off = (tile.w + WS_PAGE * p) % B;
                    const uint32_t bar = full + 8 * st;
                    kva__mbar_expect_tx(bar, WS_PB + WS_PAGE * 4);
                    kva__tma_load3(base + WS_OFF_K + st * WS_PB, &tm.k, 0, off, b, bar);
                    kva__bulk_load(base + WS_OFF_S + st * WS_PAGE * 4,
                                   cache + (int64_t)b * block_bytes + (int64_t)B * IDX_WG_D +
                                       (int64_t)off * 4,
                                   WS_PAGE * 4, bar);
                }
            }
        }
    } else {
        asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
        const int c = wg - 1, wq4 = (tid >> 5) & 3, g = lane >> 2, t = lane & 3;
        const int row0 = 16 * wq4 + g;                 /* this thread's key rows: row0, row0 + 8 */
        uint32_t *sh = (uint32_t *)(sbase + WS_OFF_H); /* [4, IDX_HIST_BINS] */
        for (int i = tid - 128; i < IDX_WG_G * IDX_HIST_BINS; i += 256)
            sh[i] = 0u;
        kva__named_bar(true, 3, 256);
        uint32_t gk = 0;
        int li = 0;
        for (int ti = blockIdx.x; ti < ntiles; ti += gridDim.x, li++) {
            const int4 tile = tiles[ti];
            const int32_t t0 = tile.y, nt = tile.z, k0 = tile.w;
            /* The tile's tokens are consecutive: token t0 + i scores n0 + i keys. */
            const int32_t n0 = tok_n[t0], n_last = tok_n[t0 + nt - 1];
            const int32_t kend = n_last < k0 + IDX_CHUNK ? n_last : k0 + IDX_CHUNK;
            const int np = (kend - k0 + WS_PAGE - 1) / WS_PAGE;
            const int qs = li & 1;
            kva__mbar_wait(qfull + 8 * qs, (li >> 1) & 1);
            const uint64_t dq = kva__wgmma_desc(base + qs * WS_QB, 16, 1024);
            const float *wsm = (const float *)(sbase + WS_OFF_W + qs * WS_WB);
            for (int p = 0; p < np; p++, gk++) {
                if ((int)(gk & 1) != c)
                    continue;
                const int st = (int)(gk % WS_NST);
                kva__mbar_wait(full + 8 * st, (gk / WS_NST) & 1);
                if (gk > 0)
                    kva__named_bar(true, 1 + c, 256); /* page gk - 1 is issued */
                const uint64_t dk = kva__wgmma_desc(base + WS_OFF_K + st * WS_PB, 16, 1024);
                float d[128];
                kva__wgmma_fence();
#pragma unroll
                for (int kk = 0; kk < 4; kk++)
                    iws_mma(d, dk + (uint64_t)(2 * kk), dq + (uint64_t)(2 * kk), kk > 0);
                kva__wgmma_commit();
                if (p + 1 < np || ti + (int)gridDim.x < ntiles)
                    kva__named_bar(false, 2 - c,
                                   256); /* the other consumer may issue page gk + 1 */
                kva__wgmma_wait<0>();
#pragma unroll
                for (int e = 0; e < 128; e++)
                    kva__reg_fence(d[e]);
                const float *scs = (const float *)(sbase + WS_OFF_S + st * WS_PAGE * 4);
                const float sc0 = scs[row0], sc1 = scs[row0 + 8];
                kva__mbar_arrive(empty + 8 * st);
                /* d[4 j + e]: key row row0 + 8 (e / 2), column 8 j + 2 t + e % 2 =
                 * token j / 8, head 8 (j % 8) + 2 t + e % 2. part[2 a + h]: token a,
                 * row half h. */
                float part[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
                for (int j = 0; j < 32; j++) {
                    const float2 w =
                        *(const float2 *)(wsm + (j >> 3) * IDX_WG_HI + 8 * (j & 7) + 2 * t);
                    float *pa = part + 2 * (j >> 3); /* one FMA per product */
                    pa[0] = fmaf(w.x, iws_relu(d[4 * j]), pa[0]);
                    pa[0] = fmaf(w.y, iws_relu(d[4 * j + 1]), pa[0]);
                    pa[1] = fmaf(w.x, iws_relu(d[4 * j + 2]), pa[1]);
                    pa[1] = fmaf(w.y, iws_relu(d[4 * j + 3]), pa[1]);
                }
                /* Reduce-scatter over the quad: lanes t & 2 keep tokens 2, 3, then
                 * lanes t & 1 the odd token of their pair: lane t ends with token t. */
                const bool h2 = (t & 2) != 0, h1 = (t & 1) != 0;
                float u[4], v[2];
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const float keep = h2 ? part[i + 4] : part[i],
                                send = h2 ? part[i] : part[i + 4];
                    u[i] = keep + __shfl_xor_sync(0xffffffffu, send, 2);
                }
#pragma unroll
                for (int i = 0; i < 2; i++) {
                    const float keep = h1 ? u[i + 2] : u[i], send = h1 ? u[i] : u[i + 2];
                    v[i] = keep + __shfl_xor_sync(0xffffffffu, send, 1);
                }
                const int32_t key = k0 + WS_PAGE * p + row0;
                if (t < nt) {
                    float *out = logits + (int64_t)(t0 + t - tok_base) * smax;
                    uint32_t *ht = sh + t * IDX_HIST_BINS;
                    if (key < n0 + t) {
                        const float x = v[0] * sc0;
                        out[key] = x;
                        atomicAdd(ht + (kva__index_order_key(x) >> 21), 1u);
                    }
                    if (key + 8 < n0 + t) {
                        const float x = v[1] * sc1;
                        out[key + 8] = x;
                        atomicAdd(ht + (kva__index_order_key(x) >> 21), 1u);
                    }
                }
            }
            kva__mbar_arrive(qempty + 8 * qs); /* this consumer's products of the tile are done */
            /* The tile's counts (both consumers' epilogues are done) go to
             * hist; the bins are clear again before the next tile counts. */
            kva__named_bar(true, 3, 256);
            for (int i = tid - 128; i < nt * IDX_HIST_BINS; i += 256) {
                const uint32_t n = sh[i];
                if (n) {
                    atomicAdd(hist + (int64_t)(t0 - tok_base) * IDX_HIST_BINS + i, n);
                    sh[i] = 0u;
                }
            }
            kva__named_bar(true, 3, 256);
        }
    }
#else
    (void)tm, (void)cache, (void)block_bytes, (void)wq, (void)tiles, (void)ntiles, (void)tok_n;
    (void)bt, (void)stride, (void)B, (void)logits, (void)smax, (void)tok_base, (void)hist;
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

size_t kva__cuda_index_ws_smem(void)
{
    return WS_SMEM;
}

void *kva__cuda_index_ws_fn(void)
{
    return (void *)index_logits_ws_kernel;
}

void *kva__cuda_index_ws_encoder(void)
{
    void *fn = NULL;
    cudaDriverEntryPointQueryResult r = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault,
                                         &r) != cudaSuccess ||
        r != cudaDriverEntryPointSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    return fn;
}

int kva__cuda_index_ws_launch(const kva__cuda_index_ws_args *a, cudaStream_t s)
{
    PFN_cuTensorMapEncodeTiled_v12000 encode = (PFN_cuTensorMapEncodeTiled_v12000)a->encode;
    iws_maps tm;
    memset(&tm, 0, sizeof tm);
    const cuuint32_t estr[3] = {1, 1, 1};
    /* Keys: (D code bytes, B rows, NB blocks); rows 128 bytes apart, blocks
     * block_bytes apart (their scales follow the rows). */
    const cuuint64_t kdims[3] = {IDX_WG_D, (cuuint64_t)a->B, (cuuint64_t)a->num_blocks};
    const cuuint64_t kstr[2] = {IDX_WG_D, (cuuint64_t)a->block_bytes};
    const cuuint32_t kbox[3] = {IDX_WG_D, WS_PAGE, 1};
    /* q's codes: (D bytes, T Hi rows). */
    const cuuint64_t qdims[2] = {IDX_WG_D, (cuuint64_t)a->T * IDX_WG_HI};
    const cuuint64_t qstr[1] = {IDX_WG_D};
    const cuuint32_t qbox[2] = {IDX_WG_D, IDX_WG_G * IDX_WG_HI};
    if (!encode ||
        encode(&tm.k, CU_TENSOR_MAP_DATA_TYPE_UINT8, 3, (void *)a->cache, kdims, kstr, kbox, estr,
               CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
               CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS ||
        encode(&tm.q, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, (void *)a->qc, qdims, qstr, qbox, estr,
               CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
               CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS)
        return 0;
    const int grid = a->ntiles < a->grid ? a->ntiles : a->grid;
    index_logits_ws_kernel<<<grid, 384, WS_SMEM, s>>>(tm, a->cache, a->block_bytes, a->wq, a->tiles,
                                                      a->ntiles, a->tok_n, a->bt, a->stride, a->B,
                                                      a->logits, a->smax, a->tok_base, a->hist);
    return 1;
}
