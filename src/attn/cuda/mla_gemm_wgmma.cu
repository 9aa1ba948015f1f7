/*
 * mla_gemm_wgmma.cu - the sm_90a form of kva_mla_run's batched GEMM
 * (mla_run.h has the contract, mla_gemm.cu the mma.sync form, which stays
 * the fallback, and the dispatch between them): C[h][m, n] = sum_k
 * A[h][m, k] B[h][k, n] on wgmma.mma_async m64n128k16, fp32 accumulation,
 * the result rounded once to the element type. Its main customer is the
 * compute-friendly path's decompression, c_kv [keys, Dc] . W_UK[h]^T and
 * c_kv [keys, Dc] . W_UV[h] for every head (2 keys H Dc (Dn + Dv) FLOPs),
 * which runs as one product pair (NB = 2: both halves of a tile share its A
 * rows); the absorbed path's two projections take the single form (NB = 1)
 * where their shapes fit.
 *
 * Tiles: 128 rows x 128 columns per product, NB products per tile (128 x 256
 * outputs for the pair), two warpgroups (rows 0-63 and 64-127, all columns
 * each: 64 fp32 accumulators per product and thread), k steps of 64 (one
 * 128-byte swizzle atom wide). Each stage holds A [128, 64] and the NB
 * B tiles (16 KiB each); NB = 1: three stages, 97 KiB, two CTAs per SM;
 * NB = 2: four stages, 193 KiB, one CTA per SM. The pair reads 768 bytes of
 * operands per 64 KiFLOP (48 KiB per 128 x 256 x 64 step) where two single
 * products read 1024 (at ~300 TFLOP/s the single form moves ~5 TB/s of
 * operands from L2, by count).
 *
 * Persistent CTAs: the grid is what fits on the device at once (occupancy x
 * SMs, at most the tile count), CTA b takes tiles b, b + grid, ... (rows
 * fastest, then column blocks, then heads), and its k steps form one stream
 * across its tiles: copies run AHEAD = stages - 2 steps in front of the
 * products, into the next tile's rows while the current tile is still
 * multiplying, so a tile's first steps wait on nothing and its epilogue's
 * stores overlap the next tile's copies. The next tile's A row indices are
 * loaded one tile ahead.
 *
 * Every thread copies (no producer warp): A and B with 16-byte cp.async in
 * the 128-byte swizzled layout the descriptors read (chunk c of row r at
 * chunk c ^ (r % 8)). A is K-major ([128 rows][64]); B is K-major ([128 n
 * rows][64], W_UK[h] read as W_UK^T, KN false) or MN-major ([64 k rows][128]
 * as two 64-column blocks, KN true: the wgmma's transpose-B form reads it).
 *
 * The step loop (step s of the stream, stage s % NST): wait for step s's
 * copies, make them visible to the async proxy, CTA barrier; issue step s's
 * wgmmas (4 per product); copy step s + AHEAD into stage (s - 2) % NST; wait
 * until at most one wgmma group is pending (all at a tile's last step, whose
 * accumulators the epilogue then reads). The barrier at the top of step s
 * tells every thread that both warpgroups are done with step s - 2, whose
 * stage that step refills. A tile's first wgmma overwrites the accumulators
 * (scale-d 0).
 *
 * Epilogue: each quad's 4 x 4 block of packed column pairs is transposed
 * by three shuffles, so every thread stores 8 consecutive columns with one
 * 16-byte store (a warp writes 8 rows x 64 contiguous bytes per store).
 *
 * The A format is the policy parameter of the one body: gw_a16 (16-bit
 * rows, cp.async) or gw_afp8<TR> (an FP8 E4M3 latent cache: 8 codes loaded
 * by plain loads, held in registers for one step where copies run two
 * ahead, then converted exactly to TR's 16-bit values and stored into the
 * same swizzled slot, the cache's scale applied to the fp32 result before
 * its one rounding, as the fallback does). Rows past M and negative
 * A rows read zeros; C rows past M and negative C rows are not written.
 * Shapes taken: K a multiple of 64, N a multiple of 128, C (and C2) 16-byte
 * aligned (and the contract's multiples of 8 and alignments); others take
 * the fallback. The pair runs with B K-major and B2 MN-major (either order
 * of the arguments); other pairs run as two single launches.
 */
extern "C" {
#include "mla_run.h"
#include "prefill_mma.h" /* kva__cuda_prefill_wgmma_ready */
}
#include "cuda_check.h"
#include "mma_ptx.cuh"
#include "quant_cvt.cuh"
#include "wgmma_ptx.cuh"

#include <cuda_runtime.h>

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define KVA_GW_BODY 1
#endif

namespace
{

constexpr int GW_BM = 128, GW_BN = 128, GW_BK = 64, GW_THREADS = 256;
constexpr uint32_t GW_AB = GW_BM * GW_BK * 2; /* A stage bytes */
constexpr uint32_t GW_BB = GW_BN * GW_BK * 2; /* one B tile's stage bytes */

/* Per product count: stages, steps copied ahead, CTAs per SM it is built for. */
template <int NB> struct gw_cfg {
    static constexpr int NST = NB == 1 ? 3 : 4;
    static constexpr int AHEAD = NST - 2;
    static constexpr int CTAS = NB == 1 ? 2 : 1;
    static constexpr uint32_t STAGE = GW_AB + NB * GW_BB; /* 1024-byte multiple */
    static constexpr uint32_t SMEM = NST * STAGE + 1024;  /* + the alignment pad */
    static_assert(CTAS * (SMEM + 1024) <= 228 * 1024, "CTAs per SM");
};

/* The product pair: B2 / C2 as the second product (NB = 2). */
struct gw_p {
    kva__cuda_mla_gemm_args g;
    const char *b[2];
    int64_t ldb[2], b_head[2];
    char *c[2];
    int64_t ldc[2], c_head[2];
};

#ifdef KVA_GW_BODY
/* Shared slot of this thread's A chunk j (row (tid / 8) + 32 j, chunk
 * tid % 8) in the stage at sA. */
static __device__ __forceinline__ uint32_t gw_adst(uint32_t sA, int j)
{
    const int r = (int)(threadIdx.x >> 3) + 32 * j, c = threadIdx.x & 7;
    return sA + (uint32_t)(r * 128 + ((c ^ (r & 7)) << 4));
}
#endif

/* The A formats. fetch(h, sA, j, src, any): this thread's 16-byte chunk j
 * (8 elements) of A at src (NULL: a zero chunk) for the stage at sA; any is
 * a valid global address for the zero-fill form. put(h): stores what fetch
 * held in registers (nothing for cp.async); the loader calls it at once, or
 * (HOLD, when copies run two or more steps ahead) one step later, so that
 * the loads' latency passes under a step's products. */
struct gw_a16 {
    static constexpr int BYTES = 2;       /* bytes per A element */
    static constexpr bool SCALED = false; /* C = c_scale * A B */
    static constexpr bool HOLD = false;
    struct held {
    };
#ifdef KVA_GW_BODY
    static __device__ __forceinline__ void fetch(held &, uint32_t sA, int j, const char *src,
                                                 const void *any)
    {
        kva__cp_async16(gw_adst(sA, j), src ? src : any, src ? 16 : 0);
    }
    static __device__ __forceinline__ void put(held &) {}
#endif
};
/* FP8 E4M3 codes: 8 per chunk by a plain load, converted exactly to TR's
 * 16-bit values and stored into the same swizzled slot. */
template <typename TR> struct gw_afp8 {
    static constexpr int BYTES = 1;
    static constexpr bool SCALED = true;
    static constexpr bool HOLD = true;
    struct held {
        uint2 v[4];
        uint32_t sA;
        bool pend;
    };
#ifdef KVA_GW_BODY
    static __device__ __forceinline__ void fetch(held &h, uint32_t sA, int j, const char *src,
                                                 const void *)
    {
        h.v[j] = src ? *reinterpret_cast<const uint2 *>(src) : make_uint2(0, 0);
        h.sA = sA, h.pend = true;
    }
    static __device__ __forceinline__ void put(held &h)
    {
        if (!h.pend)
            return;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const uint4 v = kva__fp8x8_as<TR>(h.v[j]);
            asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(gw_adst(h.sA, j)),
                         "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
                         : "memory");
        }
        h.pend = false;
    }
#endif
};

#ifdef KVA_GW_BODY
/* The m64n128k16 products by element type: B K-major (ss) or MN-major (tb). */
template <typename TR> struct gw_ops;
template <> struct gw_ops<kva__mma_bf16> {
    static __device__ __forceinline__ void ss(float d[64], uint64_t a, uint64_t b, int acc)
    {
        kva__wgmma_ss_m64n128_bf16(d, a, b, acc);
    }
    static __device__ __forceinline__ void tb(float d[64], uint64_t a, uint64_t b, int acc)
    {
        kva__wgmma_ss_m64n128_bf16_tb(d, a, b, acc);
    }
};
template <> struct gw_ops<kva__mma_f16> {
    static __device__ __forceinline__ void ss(float d[64], uint64_t a, uint64_t b, int acc)
    {
        kva__wgmma_ss_m64n128_f16(d, a, b, acc);
    }
    static __device__ __forceinline__ void tb(float d[64], uint64_t a, uint64_t b, int acc)
    {
        kva__wgmma_ss_m64n128_f16_tb(d, a, b, acc);
    }
};

/* Product q's B layout: KN0 for the first, KN1 for the second. */
template <bool KN0, bool KN1> static __device__ __forceinline__ bool gw_kn(int q)
{
    return q == 0 ? KN0 : KN1;
}

/* Tile t of the grid: rows fastest, then column blocks, then heads. */
struct gw_tile {
    int m0, n0, h;
};
static __device__ __forceinline__ gw_tile gw_tile_of(const gw_p &p, int t)
{
    const int mt = (p.g.M + GW_BM - 1) / GW_BM, nt = p.g.N / GW_BN;
    gw_tile r;
    r.m0 = (t % mt) * GW_BM;
    r.n0 = ((t / mt) % nt) * GW_BN;
    r.h = t / mt / nt;
    return r;
}

/* This thread's A row indices of tile rows m0 + (tid / 8) + 32 j (-1: zero). */
static __device__ __forceinline__ void gw_rows(const gw_p &p, int m0, int32_t row[4])
{
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const int m = m0 + (threadIdx.x >> 3) + 32 * j;
        row[j] = m < p.g.M ? (p.g.a_rows ? p.g.a_rows[m] : m) : -1;
    }
}

/* The loader's position in the CTA's step stream and its tile's sources:
 * A rows (tid / 8) + 32 j, chunk tid % 8 (NULL: a zero row); product q's B
 * first chunk (K-major: n rows (tid / 8) + 32 j, chunk tid % 8; MN-major: k
 * rows (tid / 16) + 16 j, chunk tid % 16). */
template <typename AL, int NB> struct gw_ld {
    const char *a[4];
    const char *b[NB];
    int32_t next[4];     /* the next tile's A rows */
    typename AL::held h; /* A chunks held for the next call (AL::put) */
    int t, ks;           /* tile, k step */
};

template <typename AL, bool KN0, bool KN1, int NB>
static __device__ __forceinline__ void gw_setup(const gw_p &p, gw_ld<AL, NB> &L)
{
    const int tid = threadIdx.x;
    const gw_tile tl = gw_tile_of(p, L.t);
#pragma unroll
    for (int j = 0; j < 4; j++)
        L.a[j] = L.next[j] >= 0 ? (const char *)p.g.a +
                                      AL::BYTES * ((int64_t)L.next[j] * p.g.lda +
                                                   (int64_t)tl.h * p.g.a_head + (tid & 7) * 8)
                                : NULL;
#pragma unroll
    for (int q = 0; q < NB; q++) {
        const char *b = p.b[q] + 2 * ((int64_t)tl.h * p.b_head[q]);
        L.b[q] = gw_kn<KN0, KN1>(q)
                     ? b + 2 * ((int64_t)(tid >> 4) * p.ldb[q] + tl.n0 + (tid & 15) * 8)
                     : b + 2 * ((int64_t)(tl.n0 + (tid >> 3)) * p.ldb[q] + (tid & 7) * 8);
    }
    /* the following tile's rows, used at its setup (the load is not waited for here) */
    if (L.t + (int)gridDim.x < (int)(((p.g.M + GW_BM - 1) / GW_BM) * (p.g.N / GW_BN) * p.g.heads))
        gw_rows(p, gw_tile_of(p, L.t + gridDim.x).m0, L.next);
}

/* Copies the loader's step into the stage at sA (A, then the NB B tiles;
 * issued B first) and advances the loader. */
template <typename AL, bool KN0, bool KN1, int NB>
static __device__ __forceinline__ void gw_load(const gw_p &p, gw_ld<AL, NB> &L, int ksteps,
                                               uint32_t sA)
{
    if (L.ks == 0)
        gw_setup<AL, KN0, KN1, NB>(p, L);
    const int tid = threadIdx.x;
    const int ra = tid >> 3, ca = tid & 7;
    const int64_t ka = (int64_t)L.ks * GW_BK * AL::BYTES;
#pragma unroll
    for (int q = 0; q < NB; q++) {
        const bool kn = gw_kn<KN0, KN1>(q);
        const uint32_t sB = sA + GW_AB + (uint32_t)q * GW_BB;
        const char *b = L.b[q] + (int64_t)L.ks * (kn ? 2 * GW_BK * p.ldb[q] : 2 * GW_BK);
        const int64_t bj = kn ? 2 * 16 * p.ldb[q] : 2 * 32 * p.ldb[q];
#pragma unroll
        for (int j = 0; j < 4; j++) {
            uint32_t dst;
            if (kn) {
                const int r = (tid >> 4) + 16 * j, c = tid & 15;
                dst =
                    sB + (uint32_t)((c >> 3) * GW_BK * 128 + r * 128 + (((c & 7) ^ (r & 7)) << 4));
            } else {
                const int r = ra + 32 * j;
                dst = sB + (uint32_t)(r * 128 + ((ca ^ (r & 7)) << 4));
            }
            kva__cp_async16(dst, b + j * bj, 16);
        }
    }
    /* A last (B's copies are on their way while a held format's loads
     * wait, when it is stored at once) */
#pragma unroll
    for (int j = 0; j < 4; j++)
        AL::fetch(L.h, sA, j, L.a[j] ? L.a[j] + ka : NULL, p.g.a);
    if (!(AL::HOLD && gw_cfg<NB>::AHEAD >= 2))
        AL::put(L.h);
    if (++L.ks == ksteps) {
        L.ks = 0;
        L.t += gridDim.x;
    }
}

/* v[idx] for a run-time idx < 4 (selects: v stays in registers). */
static __device__ __forceinline__ uint32_t gw_pick(const uint32_t v[4], int idx)
{
    return idx == 0 ? v[0] : idx == 1 ? v[1] : idx == 2 ? v[2] : v[3];
}

/* Stores one product's [64, 128] accumulators d of this warpgroup to rows
 * tile m0 + 64 wg + ..., columns n0 + ...: lane (g, t) holds column pairs
 * 8 j + 2 t of rows g and g + 8; the quad's 4 x 4 block of pairs of columns
 * 32 b .. 32 b + 31 is transposed so that lane t holds the 8 columns
 * 32 b + 8 t (one 16-byte store). */
template <typename TR>
static __device__ __forceinline__ void gw_store(const float d[64], char *c, int64_t ldc,
                                                int64_t c_head, const gw_p &p, const gw_tile &tl,
                                                float cs)
{
    const int tid = threadIdx.x, lane = tid & 31, w = (tid >> 5) & 3, wg = tid >> 7;
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int half = 0; half < 2; half++) {
        const int m = tl.m0 + wg * 64 + w * 16 + g + half * 8;
        int64_t row = -1;
        if (m < p.g.M)
            row = p.g.c_rows ? p.g.c_rows[m] : m;
        char *crow = row >= 0 ? c + 2 * (row * ldc + (int64_t)tl.h * c_head + tl.n0 + 8 * t) : NULL;
#pragma unroll
        for (int b = 0; b < 4; b++) {
            uint32_t v[4], o[4];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int j = 4 * b + i;
                v[i] = TR::pack(d[4 * j + 2 * half] * cs, d[4 * j + 2 * half + 1] * cs);
            }
            /* o[k] = lane k's pair t: columns 32 b + 8 t + 2 k, + 1 */
            const uint32_t r1 = __shfl_xor_sync(0xffffffffu, gw_pick(v, t ^ 1), 1);
            const uint32_t r2 = __shfl_xor_sync(0xffffffffu, gw_pick(v, t ^ 2), 2);
            const uint32_t r3 = __shfl_xor_sync(0xffffffffu, gw_pick(v, t ^ 3), 3);
            const uint32_t own = gw_pick(v, t);
#pragma unroll
            for (int k = 0; k < 4; k++)
                o[k] = (k == t) ? own : (k == (t ^ 1)) ? r1 : (k == (t ^ 2)) ? r2 : r3;
            if (crow)
                *(uint4 *)(crow + 2 * 32 * b) = make_uint4(o[0], o[1], o[2], o[3]);
        }
    }
}
#endif

template <typename TR, typename AL, bool KN0, bool KN1, int NB>
__global__ void __launch_bounds__(GW_THREADS, gw_cfg<NB>::CTAS) gw_kernel(gw_p p)
{
#ifdef KVA_GW_BODY
    typedef gw_cfg<NB> C;
    extern __shared__ __align__(16) unsigned char gw_smem[];
    const uint32_t base = (kva__smem_u32(gw_smem) + 1023u) & ~1023u;
    const int tid = threadIdx.x, wg = tid >> 7;
    const int tiles = ((p.g.M + GW_BM - 1) / GW_BM) * (p.g.N / GW_BN) * p.g.heads;
    const int ksteps = p.g.K / GW_BK;
    const int total = ((tiles - 1 - (int)blockIdx.x) / (int)gridDim.x + 1) * ksteps;
    const float cs = AL::SCALED ? p.g.c_scale : 1.f;

    gw_ld<AL, NB> L;
    L.t = blockIdx.x, L.ks = 0;
    if constexpr (AL::HOLD)
        L.h.pend = false;
    gw_rows(p, gw_tile_of(p, L.t).m0, L.next);
    int lpos = 0, lst = 0; /* loader step and stage */
#pragma unroll 1
    for (; lpos < C::AHEAD; lpos++) {
        AL::put(L.h);
        if (lpos < total)
            gw_load<AL, KN0, KN1, NB>(p, L, ksteps, base + (uint32_t)lst * C::STAGE);
        kva__cp_async_commit();
        lst = lst + 1 == C::NST ? 0 : lst + 1;
    }

    float acc[NB][64];
#pragma unroll
    for (int q = 0; q < NB; q++)
#pragma unroll
        for (int i = 0; i < 64; i++)
            acc[q][i] = 0.f;
    int cst = 0; /* compute stage */
#pragma unroll 1
    for (int ct = blockIdx.x; ct < tiles; ct += gridDim.x) {
#pragma unroll 1
        for (int ks = 0; ks < ksteps; ks++) {
            const uint32_t sA = base + (uint32_t)cst * C::STAGE;
            kva__cp_async_wait<C::AHEAD - 1>();
            kva__fence_proxy_async();
            __syncthreads();
            /* A: this warpgroup's 64 rows, K-major; B K-major (SBO 1024) or
             * MN-major (LBO: the 64-column blocks' stride). */
            const uint64_t da = kva__wgmma_desc(sA + (uint32_t)wg * 64 * 128, 16, 1024);
            kva__wgmma_fence();
#pragma unroll
            for (int q = 0; q < NB; q++) {
                const bool kn = gw_kn<KN0, KN1>(q);
                const uint32_t sB = sA + GW_AB + (uint32_t)q * GW_BB;
                const uint64_t db =
                    kn ? kva__wgmma_desc(sB, GW_BK * 128, 1024) : kva__wgmma_desc(sB, 16, 1024);
#pragma unroll
                for (int kk = 0; kk < GW_BK / 16; kk++) {
                    const int keep = ks > 0 || kk > 0; /* a tile's first product overwrites */
                    if (kn)
                        gw_ops<TR>::tb(acc[q], da + (uint64_t)((kk * 32) >> 4),
                                       db + (uint64_t)((kk * 16 * 128) >> 4), keep);
                    else
                        gw_ops<TR>::ss(acc[q], da + (uint64_t)((kk * 32) >> 4),
                                       db + (uint64_t)((kk * 32) >> 4), keep);
                }
            }
            kva__wgmma_commit();
            AL::put(L.h); /* a held format's step lpos - 1 (stored at once: nothing) */
            if (lpos < total)
                gw_load<AL, KN0, KN1, NB>(p, L, ksteps, base + (uint32_t)lst * C::STAGE);
            kva__cp_async_commit();
            lpos++;
            lst = lst + 1 == C::NST ? 0 : lst + 1;
            cst = cst + 1 == C::NST ? 0 : cst + 1;
            kva__wgmma_wait<1>();
        }
        /* the tile's products done: the epilogue */
        kva__wgmma_wait<0>();
#pragma unroll
        for (int q = 0; q < NB; q++)
#pragma unroll
            for (int i = 0; i < 64; i++)
                kva__reg_fence(acc[q][i]);
        const gw_tile tl = gw_tile_of(p, ct);
#pragma unroll
        for (int q = 0; q < NB; q++)
            gw_store<TR>(acc[q], p.c[q], p.ldc[q], p.c_head[q], p, tl, cs);
    }
    kva__cp_async_wait<0>();
#else
    (void)p;
    /* (no sm_90a code in this pass: the policy and the configuration are
     * named only so that device passes without it do not warn about their
     * unused members) */
    if (AL::SCALED && AL::BYTES < 0 && AL::HOLD && gw_cfg<NB>::AHEAD < 0)
        __trap();
#endif
}

/* Launches gw_kernel for p over every tile with the persistent grid. */
template <int NB, bool KN0, bool KN1>
static kva_status gw_launch(const gw_p &p, cudaStream_t stream)
{
    const kva__cuda_mla_gemm_args *g = &p.g;
    const bool bf = g->dtype == KVA_DTYPE_BF16;
    void (*k)(gw_p);
    if (g->a_fp8)
        k = bf ? gw_kernel<kva__mma_bf16, gw_afp8<kva__mma_bf16>, KN0, KN1, NB>
               : gw_kernel<kva__mma_f16, gw_afp8<kva__mma_f16>, KN0, KN1, NB>;
    else
        k = bf ? gw_kernel<kva__mma_bf16, gw_a16, KN0, KN1, NB>
               : gw_kernel<kva__mma_f16, gw_a16, KN0, KN1, NB>;
    const int smem = (int)gw_cfg<NB>::SMEM;
    /* Above the 48 KiB default, and all of the SM's unified memory as shared
     * memory so that the CTAs per SM fit (the driver's default carveout may
     * hold fewer): host-side attributes, cheap to set again. */
    KVA_CUDA_TRY(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    KVA_CUDA_TRY(cudaFuncSetAttribute(k, cudaFuncAttributePreferredSharedMemoryCarveout,
                                      (int)cudaSharedmemCarveoutMaxShared));
    int dev = 0, sms = 0, per_sm = 0;
    KVA_CUDA_TRY(cudaGetDevice(&dev));
    KVA_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    KVA_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k, GW_THREADS, smem));
    const int64_t tiles = (int64_t)((g->M + GW_BM - 1) / GW_BM) * (g->N / GW_BN) * g->heads;
    int64_t grid = (int64_t)sms * (per_sm > 0 ? per_sm : 1);
    if (g->max_ctas > 0 && grid > g->max_ctas)
        grid = g->max_ctas;
    if (grid > tiles)
        grid = tiles;
    k<<<(unsigned)grid, GW_THREADS, smem, stream>>>(p);
    KVA_CUDA_TRY(cudaGetLastError());
    return KVA_STATUS_OK;
}

} // namespace

extern "C" int kva__cuda_mla_gemm_wgmma_fits(const kva__cuda_mla_gemm_args *g)
{
#ifdef KVA_CUDA_SM90A
    const int64_t tiles = (int64_t)((g->M + GW_BM - 1) / GW_BM) * (g->N / GW_BN) * g->heads;
    return g->K % GW_BK == 0 && g->N % GW_BN == 0 && tiles < ((int64_t)1 << 31) - (1 << 20) &&
           (uintptr_t)g->c % 16 == 0 && (!g->b2 || (uintptr_t)g->c2 % 16 == 0) &&
           kva__cuda_prefill_wgmma_ready();
#else
    (void)g;
    return 0;
#endif
}

extern "C" kva_status kva__cuda_mla_gemm_wgmma(const kva__cuda_mla_gemm_args *g, void *stream)
{
    gw_p p;
    p.g = *g;
    p.b[0] = (const char *)g->b, p.ldb[0] = g->ldb, p.b_head[0] = g->b_head;
    p.c[0] = (char *)g->c, p.ldc[0] = g->ldc, p.c_head[0] = g->c_head;
    p.b[1] = (const char *)g->b2, p.ldb[1] = g->ldb2, p.b_head[1] = g->b2_head;
    p.c[1] = (char *)g->c2, p.ldc[1] = g->ldc2, p.c_head[1] = g->c2_head;
    cudaStream_t s = (cudaStream_t)stream;
    if (g->b2 && g->b_kn != g->b2_kn) {
        if (g->b_kn) { /* the pair's form takes the K-major product first */
            p.b[0] = p.b[1], p.ldb[0] = p.ldb[1], p.b_head[0] = p.b_head[1];
            p.c[0] = p.c[1], p.ldc[0] = p.ldc[1], p.c_head[0] = p.c_head[1];
            p.b[1] = (const char *)g->b, p.ldb[1] = g->ldb, p.b_head[1] = g->b_head;
            p.c[1] = (char *)g->c, p.ldc[1] = g->ldc, p.c_head[1] = g->c_head;
        }
        return gw_launch<2, false, true>(p, s);
    }
    for (int q = 0; q < (g->b2 ? 2 : 1); q++) {
        gw_p one = p;
        one.b[0] = p.b[q], one.ldb[0] = p.ldb[q], one.b_head[0] = p.b_head[q];
        one.c[0] = p.c[q], one.ldc[0] = p.ldc[q], one.c_head[0] = p.c_head[q];
        const int kn = q ? g->b2_kn : g->b_kn;
        const kva_status st =
            kn ? gw_launch<1, true, true>(one, s) : gw_launch<1, false, false>(one, s);
        if (st != KVA_STATUS_OK)
            return st;
    }
    return KVA_STATUS_OK;
}
