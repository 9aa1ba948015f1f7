/*
 * mla_wgmma_ops.cuh - the sm_90a pieces of the MLA wgmma body
 * (mla_wgmma_body.cuh): its tile geometry and shared-memory sizes, the wgmma
 * issue sequences of S = Q K^T and O += P V, the softmax P stores, and the
 * fill geometry, P fragments and named barriers of the alternating-tile
 * schedule. The tile loops that use them, and the work-policy interface,
 * are the body's.
 */
#ifndef KVA_CUDA_MLA_WGMMA_OPS_CUH
#define KVA_CUDA_MLA_WGMMA_OPS_CUH

#include "async_ptx.cuh"
#include "mla_decode_common.cuh"
#include "wgmma_ptx.cuh"

#include <math.h>
#include <stdint.h>

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define KVA_MLA_WGMMA_BODY 1
#endif

#define MW_M 64   /* rows per item */
#define MW_BN 64  /* keys per tile */
#define MW_NST 2  /* ring stages (alternating tiles: one per warpgroup) */
#define MW_WT 128 /* threads per warpgroup */
#define MW_QB (MW_M * ML_D * 2)
#define MW_KB (MW_BN * ML_D * 2)
#define MW_PB (MW_M * MW_BN * 2)
#define MW_PO (8 * MW_BN * 128) /* alternating tiles: a tile's P, its stage's column block 8 */
/* Dynamic shared memory of the split-key schedule (Q, ring, P) and of the
 * alternating-tile one (Q, ring: P lives in the ring). */
#define MW_SMEM (MW_QB + MW_NST * MW_KB + MW_PB + 1024)
#define MW_SMEM_ALT (MW_QB + MW_NST * MW_KB + 1024)
/* The alternating-tile schedule over TMA boxes: the ring's four mbarriers
 * (stage s, fill part p at MW_TBAR(bars, s, p)) follow the ring. */
#define MW_SMEM_TMA (MW_SMEM_ALT + 64)
#define MW_TBAR(bars, s, p) ((bars) + 8u * (2u * (uint32_t)(s) + (uint32_t)(p)))
/* The alternating-tile schedule with a producer warpgroup (MW_SCHED_ALT_PROD,
 * mla_wgmma_body.cuh): 384 threads, the two consumer warpgroups and the
 * producer (threads 256 .. 383); the ring's eight mbarriers follow it:
 * MW_PBAR(bars, 0, s, p) "full" (stage s, fill part p landed; the producer's
 * 128 threads arrive), MW_PBAR(bars, 1, s, p) "empty" (its last reader is
 * done; the 128 threads of the reading warpgroup arrive). setmaxnreg moves
 * registers inside the launch bound's 168 x 384 only: consumers MW_REG_C,
 * producer MW_REG_P, 2 x 128 MW_REG_C + 128 MW_REG_P = 64,512. The
 * consumers need 208 for ptxas to keep their wgmmas asynchronous (C7512 at
 * 200); the producer holds a part's codes across its wait. */
#define MW_NT_PROD (3 * MW_WT)
#define MW_SMEM_PROD (MW_SMEM_ALT + 64)
#define MW_PBAR(bars, e, s, p)                                                                     \
    ((bars) + 8u * (4u * (uint32_t)(e) + 2u * (uint32_t)(s) + (uint32_t)(p)))
#define MW_REG_C 208
#define MW_REG_P 88
/* Headroom of the lazily moved softmax reference max (log2 units): any
 * reference gives the same out and lse, this one moves only when a row's max
 * grows past it by more than MW_LAZY (or was -inf). */
#define MW_LAZY 8.f
/* The alternating-tile loop's softmax (mw_alt_loop, mla_wgmma_body.cuh) in
 * its lean form (LEAN, every schedule but MW_SCHED_ALT_PROD): the policy may
 * leave a tile's logits unscaled and return the factor, which the row
 * maxima take once per row and P's exponent in one FMA (mw_pack_p); the
 * quads' shuffles of the row maxima only where a warp vote on the threads'
 * own maxima says a row may move its reference; P into its stage by
 * stmatrix (mw_put_p); warpgroup 1's tile maxima before it waits for
 * warpgroup 0's reference. MW_SCHED_ALT_PROD keeps the earlier forms: its
 * consumers are compiled within 168 registers, where the lean forms' live
 * values spill more (the sparse fp8_ds_mla kernel, not measured with them). */
/* Named barriers of the alternating-tile loop (0 is __syncthreads): SC0 /
 * SC1 the reference of warpgroup 0's / 1's tile is in s_ref, P0 / P1 its P
 * is in its stage, FREE0 / FREE1 the other warpgroup is done reading stage
 * 0 / 1 (all 256 threads); WG0 + g: warpgroup g's own copies or P stores
 * are visible. */
enum { MW_BAR_SC0 = 1, MW_BAR_SC1, MW_BAR_P0, MW_BAR_P1, MW_BAR_FREE0, MW_BAR_FREE1, MW_BAR_WG0 };

#ifdef KVA_MLA_WGMMA_BODY
/* Accumulator lists of the two wgmma shapes below: S [64, 32] is d[4][4]
 * (n8 tile j, element e: row 16 w + g + 8 (e / 2), column 8 j + 2 t + e % 2,
 * the mma.sync C layout, see wgmma_ptx.cuh), O [64, 128] is d[16][4]. */
#define MW_D4(c, j) c(d[j][0]), c(d[j][1]), c(d[j][2]), c(d[j][3])
#define MW_D16(c) MW_D4(c, 0), MW_D4(c, 1), MW_D4(c, 2), MW_D4(c, 3)
#define MW_D64(c)                                                                                  \
    MW_D16(c), MW_D4(c, 4), MW_D4(c, 5), MW_D4(c, 6), MW_D4(c, 7), MW_D4(c, 8), MW_D4(c, 9),       \
        MW_D4(c, 10), MW_D4(c, 11), MW_D4(c, 12), MW_D4(c, 13), MW_D4(c, 14), MW_D4(c, 15)
#define MW_R16 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}"

/* S (+)= A [64, 16] B [16, 32], A and B K-major in shared memory. */
#define MW_SS_N32(ty)                                                                              \
    static __device__ __forceinline__ void mw_ss_n32_##ty(float(&d)[4][4], uint64_t da,            \
                                                          uint64_t db, int scale_d)                \
    {                                                                                              \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"                                  \
                     "wgmma.mma_async.sync.aligned.m64n32k16.f32." #ty "." #ty " " MW_R16          \
                     ", %16, %17, p, 1, 1, 0, 0;\n}\n"                                             \
                     : MW_D16("+f")                                                                \
                     : "l"(da), "l"(db), "r"(scale_d));                                            \
    }
MW_SS_N32(bf16)
MW_SS_N32(f16)
/* O += A [64, 16] B [16, 128], A K-major, B MN-major (imm-trans-b = 1). */
#define MW_SS_N128_TB(ty)                                                                          \
    static __device__ __forceinline__ void mw_ss_n128_tb_##ty(float(&d)[16][4], uint64_t da,       \
                                                              uint64_t db)                         \
    {                                                                                              \
        asm volatile("wgmma.mma_async.sync.aligned.m64n128k16.f32." #ty "." #ty " " KVA__WG_R64    \
                     ", %64, %65, 1, 1, 1, 0, 1;\n"                                                \
                     : MW_D64("+f")                                                                \
                     : "l"(da), "l"(db));                                                          \
    }
MW_SS_N128_TB(bf16)
MW_SS_N128_TB(f16)

template <typename Ty> struct mw_ops;
template <> struct mw_ops<kva__mma_bf16> {
    static __device__ __forceinline__ void s(float (&d)[4][4], uint64_t a, uint64_t b, int sc)
    {
        mw_ss_n32_bf16(d, a, b, sc);
    }
    /* S (+)= A [64, 16] B [16, 64], both K-major in shared memory. */
    static __device__ __forceinline__ void s(float (&d)[8][4], uint64_t a, uint64_t b, int sc)
    {
        kva__wgmma_ss_m64n64_bf16(&d[0][0], a, b, sc);
    }
    static __device__ __forceinline__ void o(float (&d)[16][4], uint64_t a, uint64_t b)
    {
        mw_ss_n128_tb_bf16(d, a, b);
    }
    /* O += A [64, 16] (registers) B [16, 128] (MN-major in shared memory). */
    static __device__ __forceinline__ void orr(float (&d)[16][4], const uint32_t a[4], uint64_t b)
    {
        kva__wgmma_rs_m64n128_bf16_tb(&d[0][0], a, b, 1);
    }
    static __device__ __forceinline__ float2 unpack(uint32_t w)
    {
        return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
    }
};
template <> struct mw_ops<kva__mma_f16> {
    static __device__ __forceinline__ void s(float (&d)[4][4], uint64_t a, uint64_t b, int sc)
    {
        mw_ss_n32_f16(d, a, b, sc);
    }
    static __device__ __forceinline__ void s(float (&d)[8][4], uint64_t a, uint64_t b, int sc)
    {
        kva__wgmma_ss_m64n64_f16(&d[0][0], a, b, sc);
    }
    static __device__ __forceinline__ void o(float (&d)[16][4], uint64_t a, uint64_t b)
    {
        mw_ss_n128_tb_f16(d, a, b);
    }
    static __device__ __forceinline__ void orr(float (&d)[16][4], const uint32_t a[4], uint64_t b)
    {
        kva__wgmma_rs_m64n128_f16_tb(&d[0][0], a, b, 1);
    }
    static __device__ __forceinline__ float2 unpack(uint32_t w)
    {
        __half2_raw h;
        h.x = (unsigned short)(w & 0xffffu);
        h.y = (unsigned short)(w >> 16);
        return __half22float2(__half2(h));
    }
};
#endif

#ifdef KVA_MLA_WGMMA_BODY
/* 16-byte store to shared address dst (policies that convert rows into the
 * ring: the sparse fp8_ds_mla and the dense FP8 E4M3 ones). */
static __device__ __forceinline__ void mw_st16(uint32_t dst, uint4 v)
{
    asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(dst), "r"(v.x), "r"(v.y),
                 "r"(v.z), "r"(v.w)
                 : "memory");
}
/* Prefetch of bytes (a multiple of 16, 16-byte aligned) at p into L2. */
static __device__ __forceinline__ void mw_prefetch_l2(const void *p, uint32_t bytes)
{
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(p), "r"(bytes) : "memory");
}

/* S = Q K^T for keys 32 WG .. 32 WG + 31 of the tile whose descriptor is dk:
 * 36 k-steps over 576 in two accumulator chains (even and odd k-steps, summed
 * by the caller); issued and committed. */
template <typename Ty, int WG>
static __device__ __forceinline__ void mw_s(float (&sc)[4][4], float (&sc2)[4][4], uint64_t dq,
                                            uint64_t dk)
{
    kva__wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < ML_D / 16; kk++)
        mw_ops<Ty>::s(
            kk & 1 ? sc2 : sc, dq + (uint64_t)(((kk >> 2) * MW_M * 128 + (kk & 3) * 32) >> 4),
            dk + (uint64_t)(((kk >> 2) * MW_BN * 128 + WG * 32 * 128 + (kk & 3) * 32) >> 4),
            kk > 1);
    kva__wgmma_commit();
}

/* O += P V over the tile's 64 keys (4 k-steps) for value columns
 * 256 WG + 128 h .. + 127 (column blocks 4 WG + 2 h and + 1) of the tile whose
 * value descriptor is dv; issued and committed. */
template <typename Ty, int WG>
static __device__ __forceinline__ void mw_pv(float (&o)[32][4], uint64_t dp, uint64_t dv)
{
    kva__wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < MW_BN / 16; kk++)
#pragma unroll
        for (int h = 0; h < 2; h++)
            mw_ops<Ty>::o(*reinterpret_cast<float(*)[16][4]>(&o[16 * h]),
                          dp + (uint64_t)((kk * 32) >> 4),
                          dv + (uint64_t)(((4 * WG + 2 * h) * MW_BN * 128 + kk * 16 * 128) >> 4));
    kva__wgmma_commit();
}
#endif

#ifdef KVA_MLA_WGMMA_BODY
/* P = 2^(sc - mu) of rows r0, r0 + 8 and this warpgroup's keys 32 wg + 8 j +
 * 2 t4 + e into the shared [64, 64] P tile (K-major, 128-byte swizzle, the
 * input dtype); psum gets the thread's row sums. */
template <typename Ty>
static __device__ __forceinline__ void mw_store_p(const float (&sc)[4][4], const float mu[2],
                                                  uint32_t sP, int wg, int r0, int t4,
                                                  float psum[2])
{
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        const int r = r0 + 8 * hf;
        float sum = 0.f;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const float p0 = kva__ex2(sc[j][2 * hf] - mu[hf]);
            const float p1 = kva__ex2(sc[j][2 * hf + 1] - mu[hf]);
            sum += p0 + p1;
            const int key = wg * 32 + j * 8 + 2 * t4;
            const uint32_t addr =
                sP + (uint32_t)(r * 128 + ((((key >> 3) ^ (r & 7))) << 4) + (key & 7) * 2);
            asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(Ty::pack(p0, p1)) : "memory");
        }
        psum[hf] = sum;
    }
}
#endif

/* Column block i of warpgroup WG's stage in its fill and S order: blocks
 * 4 WG .. 4 WG + 3 (its own value half, part 0 of a fill), then the other
 * value half and block 8 (part 1). mw_fblk<WG, PART>(i): block i of part
 * PART (4 blocks in part 0, 5 in part 1). */
template <int WG> static __device__ __forceinline__ constexpr int mw_blk(int i)
{
    return i < 4 ? 4 * WG + i : (i < 8 ? 4 * (1 - WG) + i - 4 : 8);
}
template <int WG, int PART> static __device__ __forceinline__ constexpr int mw_fblk(int i)
{
    return mw_blk<WG>(4 * PART + i);
}
#define MW_FNB(PART) ((PART) == 0 ? 4 : 5)

#ifdef KVA_MLA_WGMMA_BODY
/* The fill thread's key (t / 2) and half (t % 2) of warpgroup thread t:
 * in each column block it fills 16-byte chunks 4 half .. 4 half + 3 of its
 * key's row, at mw_fill_at(stage, b, k). */
static __device__ __forceinline__ int mw_fkey()
{
    return (threadIdx.x & (MW_WT - 1)) >> 1;
}
static __device__ __forceinline__ int mw_fhalf()
{
    return threadIdx.x & 1;
}
static __device__ __forceinline__ uint32_t mw_fill_at(uint32_t stage, int b, int k)
{
    const int key = mw_fkey(), ch = 4 * mw_fhalf() + k;
    return stage + (uint32_t)(b * MW_BN * 128 + key * 128 + ((ch ^ (key & 7)) << 4));
}
/* S (+)= Q K^T over column blocks mw_blk<WG>(O0 .. O1 - 1) of the tile whose
 * descriptor is dk (4 k-steps each; the first k-step of block order 0
 * overwrites S). Issued only: the caller fences, commits and waits. */
template <typename Ty, int WG, int O0, int O1>
static __device__ __forceinline__ void mw_s64(float (&sc)[8][4], uint64_t dq, uint64_t dk)
{
#pragma unroll
    for (int i = O0; i < O1; i++) {
        const int b = mw_blk<WG>(i);
#pragma unroll
        for (int k = 0; k < 4; k++)
            mw_ops<Ty>::s(sc, dq + (uint64_t)((b * MW_M * 128 + k * 32) >> 4),
                          dk + (uint64_t)((b * MW_BN * 128 + k * 32) >> 4), i > 0 || k > 0);
    }
}

/* The warpgroup's fill copies landed (cp.async groups: PEND may still be
 * pending) and are visible to its wgmmas (async proxy, all 128 threads). */
template <int WG, int PEND> static __device__ __forceinline__ void mw_landed()
{
    kva__cp_async_wait<PEND>();
    kva__fence_proxy_async();
    kva__named_bar(true, MW_BAR_WG0 + WG, MW_WT);
}

/* Warpgroup WG's 128 threads meet (its own named barrier). */
template <int WG> static __device__ __forceinline__ void mw_wg_sync()
{
    kva__named_bar(true, MW_BAR_WG0 + WG, MW_WT);
}

/* TMA tiles hold whole cache rows: the rows z0 .. 63 of a tile past its
 * item's keys (z0 >= 1) are zeroed in value blocks 0 .. 7 by warpgroup WG
 * (their P is 0, but 0 times a stale NaN would not be), made visible to the
 * wgmma reads, and the warpgroup meets. */
template <int WG> static __device__ __forceinline__ void mw_zero_rows(uint32_t stage, int z0)
{
    const int t = threadIdx.x & (MW_WT - 1);
    for (int x = z0 * 8 + t; x < MW_BN * 8 * 8; x += MW_WT) {
        const int b = x / (MW_BN * 8), rc = x - b * (MW_BN * 8);
        if (rc >= z0 * 8)
            mw_st16(stage + (uint32_t)(b * MW_BN * 128 + rc * 16), make_uint4(0, 0, 0, 0));
    }
    kva__fence_proxy_async();
    mw_wg_sync<WG>();
}

/* S [64, 64] of the tile: its committed wgmmas waited for and the
 * accumulators fenced. */
static __device__ __forceinline__ void mw_s_done(float (&sc)[8][4])
{
    kva__wgmma_commit();
    kva__wgmma_wait<0>();
#pragma unroll
    for (int j = 0; j < 8; j++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            kva__reg_fence(sc[j][e]);
}

/* S part 0 (the warpgroup's own value half: column blocks 4 WG .. + 3) of
 * the tile at dk once its copies landed (part 1's group may still be
 * pending: PEND), issued and committed as a group of its own. */
template <typename Ty, int WG, int PEND>
static __device__ __forceinline__ void mw_s_part0(float (&sc)[8][4], uint64_t dq, uint64_t dk)
{
    mw_landed<WG, PEND>();
    kva__wgmma_fence();
    mw_s64<Ty, WG, 0, 4>(sc, dq, dk);
    kva__wgmma_commit();
}

/* O [64, 256] accumulators of the thread: all pending wgmmas waited for. */
static __device__ __forceinline__ void mw_o_fence(float (&o)[32][4])
{
#pragma unroll
    for (int n = 0; n < 32; n++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            kva__reg_fence(o[n][e]);
}

/* Row hf of the thread's running state moves to reference m (>= m_run, or
 * m_run -inf): l_run and O scaled by 2^(m_run - m). */
static __device__ __forceinline__ void mw_move(float (&o)[32][4], float m_run[2], float l_run[2],
                                               int hf, float m)
{
    const float alpha = kva__ex2(m_run[hf] - (m == -INFINITY ? 0.f : m)); /* 0 from -inf */
    m_run[hf] = m;
    l_run[hf] *= alpha;
#pragma unroll
    for (int n = 0; n < 32; n++) {
        o[n][2 * hf] *= alpha;
        o[n][2 * hf + 1] *= alpha;
    }
}

/* The max of row r0 + 8 hf over the thread's 16 logits of the tile (its
 * quad's other lanes not included: mw_quad_max). */
static __device__ __forceinline__ float mw_tmax(const float (&sc)[8][4], int hf)
{
    float m[4];
#pragma unroll
    for (int j = 0; j < 4; j++)
        m[j] = fmaxf(fmaxf(sc[2 * j][2 * hf], sc[2 * j][2 * hf + 1]),
                     fmaxf(sc[2 * j + 1][2 * hf], sc[2 * j + 1][2 * hf + 1]));
    return fmaxf(fmaxf(m[0], m[1]), fmaxf(m[2], m[3]));
}
/* The max of x over the 4 lanes of the thread's quad (the lanes of a row). */
static __device__ __forceinline__ float mw_quad_max(float x)
{
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

/* P = 2^(mul sc - mu) of rows r0, r0 + 8 as the A fragments of the local P V
 * (pa[kk]: k-step kk, keys 16 kk .. + 15: rows r0 / r0 + 8 x keys 16 kk +
 * 2 t4 (+ 1) and + 8, in the input dtype); psum gets the thread's row sums
 * of the fp32 values. mul: the logits' factor the policy left to P (1 where
 * sc is already in log2 units). */
template <typename Ty, bool LEAN>
static __device__ __forceinline__ void mw_pack_p(const float (&sc)[8][4], const float mu[2],
                                                 float mul, uint32_t (&pa)[4][4], float psum[2])
{
    if constexpr (LEAN) {
        /* (the row sums as a tree: 3 dependent adds after the pairs, not 8) */
        float s2[8][2];
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                const float x0 = fmaf(sc[j][2 * hf], mul, -mu[hf]);
                const float x1 = fmaf(sc[j][2 * hf + 1], mul, -mu[hf]);
                const float p0 = kva__ex2(x0), p1 = kva__ex2(x1);
                s2[j][hf] = p0 + p1;
                pa[j >> 1][2 * (j & 1) + hf] = Ty::pack(p0, p1);
            }
#pragma unroll
        for (int hf = 0; hf < 2; hf++)
            psum[hf] = ((s2[0][hf] + s2[1][hf]) + (s2[2][hf] + s2[3][hf])) +
                       ((s2[4][hf] + s2[5][hf]) + (s2[6][hf] + s2[7][hf]));
    } else { /* (mul is 1 here: the policies of these kernels scale) */
        psum[0] = psum[1] = 0.f;
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                const float p0 = kva__ex2(sc[j][2 * hf] * mul - mu[hf]);
                const float p1 = kva__ex2(sc[j][2 * hf + 1] * mul - mu[hf]);
                psum[hf] += p0 + p1;
                pa[j >> 1][2 * (j & 1) + hf] = Ty::pack(p0, p1);
            }
    }
}
/* Row hf of the P fragments times alpha (its reference moved). */
template <typename Ty>
static __device__ __forceinline__ void mw_scale_p(uint32_t (&pa)[4][4], int hf, float alpha)
{
#pragma unroll
    for (int kk = 0; kk < 4; kk++)
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const float2 f = mw_ops<Ty>::unpack(pa[kk][2 * i + hf]);
            pa[kk][2 * i + hf] = Ty::pack(f.x * alpha, f.y * alpha);
        }
}
/* The P fragments into the [64, 64] P tile at sP (K-major, 128-byte swizzle;
 * sP 1024-byte aligned) for the other warpgroup's remote P V. stmatrix: per
 * k-step kk one x4 store of the four 8 x 8 matrices pa[kk][i] (rows 16 w +
 * 8 (i & 1) + 0..7 of the thread's warp w, key chunk 2 kk + (i >> 1)); lane l
 * gives the address of row l & 7 of matrix l >> 3. In a 1024-byte aligned
 * tile that chunk's swizzled address differs from k-step 0's by kk << 5. */
template <bool LEAN>
static __device__ __forceinline__ void mw_put_p(const uint32_t (&pa)[4][4], uint32_t sP, int r0,
                                                int t4)
{
    if constexpr (LEAN) {
        (void)r0;
        (void)t4;
        const int l = threadIdx.x & 31;
        const int r = 16 * ((threadIdx.x >> 5) & 3) + 8 * ((l >> 3) & 1) + (l & 7);
        const uint32_t a0 = sP + (uint32_t)(r * 128 + (((l >> 4) ^ (l & 7)) << 4));
#pragma unroll
        for (int kk = 0; kk < 4; kk++)
            asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(
                             a0 ^ (uint32_t)(kk << 5)),
                         "r"(pa[kk][0]), "r"(pa[kk][1]), "r"(pa[kk][2]), "r"(pa[kk][3])
                         : "memory");
    } else {
#pragma unroll
        for (int kk = 0; kk < 4; kk++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int r = r0 + 8 * (i & 1), key = 16 * kk + 8 * (i >> 1) + 2 * t4;
                const uint32_t addr =
                    sP + (uint32_t)(r * 128 + ((((key >> 3) ^ (r & 7))) << 4) + (key & 7) * 2);
                asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(pa[kk][i]) : "memory");
            }
    }
}
/* O += P V from the P fragments (local P V: this warpgroup's own tile, its
 * value columns 256 WG ..); issued and committed. The fragments must stay
 * untouched until the wgmma is waited for (mw_a_fence after the wait). */
template <typename Ty, int WG>
static __device__ __forceinline__ void mw_pv_rs(float (&o)[32][4], const uint32_t (&pa)[4][4],
                                                uint64_t dv)
{
    kva__wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < MW_BN / 16; kk++)
#pragma unroll
        for (int h = 0; h < 2; h++)
            mw_ops<Ty>::orr(*reinterpret_cast<float(*)[16][4]>(&o[16 * h]), pa[kk],
                            dv + (uint64_t)(((4 * WG + 2 * h) * MW_BN * 128 + kk * 16 * 128) >> 4));
    kva__wgmma_commit();
}
static __device__ __forceinline__ void mw_a_fence(uint32_t (&pa)[4][4])
{
#pragma unroll
    for (int kk = 0; kk < 4; kk++)
#pragma unroll
        for (int i = 0; i < 4; i++)
            asm volatile("" : "+r"(pa[kk][i])::"memory");
}
#endif

#endif
