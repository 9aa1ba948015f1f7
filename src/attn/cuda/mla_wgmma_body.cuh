/*
 * mla_wgmma_body.cuh - the absorbed MLA attention body on sm_90a warpgroup
 * MMA, shared by the dense decode (mla_decode_wgmma.cu,
 * "mla_decode_wgmma_sm90": the plan's work items over contiguous key ranges
 * of a paged latent cache) and the sparse MLA (mla_sparse_wgmma.cu, the
 * same registry entry for kva_mla_sparse_run: one query token's heads
 * against the rows its index list names). What differs enters as the work
 * policy W of mla_wgmma_kernel<Ty, W> (see "The work policy" below): which
 * item a CTA runs, where its key rows come from and how they reach the
 * shared tile (cp.async of 16-bit rows, or FP8 rows, fp8_ds_mla or dense
 * e4m3, loaded and converted by the CTA), the logit mask and the
 * end-of-item stores.
 *
 * One CTA = two warpgroups (256 threads) runs one item at a time
 * (persistent grid). Per item Q [64, 576] is staged in shared memory in the
 * wgmma K-major layout (128-byte swizzle, 9 column blocks). Key tiles of 64
 * latent rows land in a 2-stage ring in the same layout (every row read once
 * from global memory, for S and for P V). Per tile:
 *   - S: warpgroup g computes Q K^T for keys 32 g .. 32 g + 31 of the tile
 *     (36 wgmma m64n32k16, A = Q and B = K from shared memory);
 *   - P is written to shared memory ([64, 64] in the input dtype, K-major,
 *     swizzled) against the running reference max, which moves lazily (only
 *     when a row's max grows past it by MW_LAZY, so P stays below 2^MW_LAZY
 *     and O is rarely rescaled); one barrier votes whether any row moved: if
 *     none did (the usual case) P is final, otherwise the row maxima go
 *     through shared memory, both warpgroups move the reference the same
 *     way, rescale, rewrite P and meet at a second barrier;
 *   - O: warpgroup g owns value columns 256 g .. 256 g + 255 (O [64, 256] in
 *     128 registers per thread) and adds P [64, 64] V (8 wgmma m64n128k16,
 *     A = P and B = the tile's value columns, MN-major, from shared memory).
 * The S and P V issue sequences are instantiated per warpgroup and picked by
 * a warpgroup-uniform branch, so that their descriptors are constant offsets
 * from uniform registers (with the warpgroup index in a per-thread register,
 * every wgmma needed its descriptor converted).
 * Shared memory: Q 72 KB + 2 x 72 KB ring + P 8 KB (+ 1 KB alignment).
 * Everything that issues sm_90a instructions is compiled only for sm_90a
 * (__CUDA_ARCH_FEAT_SM90_ALL); other device passes get an empty kernel that the
 * host never launches (the registry entry is usable only with sm_90a code and
 * a compute capability 9.0 device).
 */
#ifndef KVA_CUDA_MLA_WGMMA_BODY_CUH
#define KVA_CUDA_MLA_WGMMA_BODY_CUH

#include "mla_decode_common.cuh"
#include "wgmma_ptx.cuh"

#include <math.h>
#include <stdint.h>

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define KVA_MLA_WGMMA_BODY 1
#endif

#define MW_M 64  /* rows per item */
#define MW_BN 64 /* keys per tile */
#define MW_NST 2 /* ring stages */
#define MW_QB (MW_M * ML_D * 2)
#define MW_KB (MW_BN * ML_D * 2)
#define MW_PB (MW_M * MW_BN * 2)
#define MW_SMEM (MW_QB + MW_NST * MW_KB + MW_PB + 1024)
/* Headroom of the lazily moved softmax reference max (log2 units): any
 * reference gives the same out and lse, this one moves only when a row's max
 * grows past it by more than MW_LAZY (or was -inf). */
#define MW_LAZY 8.f

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
    static __device__ __forceinline__ void o(float (&d)[16][4], uint64_t a, uint64_t b)
    {
        mw_ss_n128_tb_bf16(d, a, b);
    }
};
template <> struct mw_ops<kva__mma_f16> {
    static __device__ __forceinline__ void s(float (&d)[4][4], uint64_t a, uint64_t b, int sc)
    {
        mw_ss_n32_f16(d, a, b, sc);
    }
    static __device__ __forceinline__ void o(float (&d)[16][4], uint64_t a, uint64_t b)
    {
        mw_ss_n128_tb_f16(d, a, b);
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

/*
 * The work policy W of mla_wgmma_kernel<Ty, W>: a class, one object per item.
 *   typedef args               the kernel's argument struct;
 *   static items(a)            work items of the launch (CTAs loop over them);
 *   W(a, it, sK, q_gen, r0)    loads item it; unless it skips the item,
 *                              starts the copies of its first key tile into
 *                              ring stage 0 at sK (committed), stages Q
 *                              [64, 576] (rows past the item's zero) at q_gen
 *                              and sets what logits needs for the thread's
 *                              rows r0, r0 + 8;
 *   skip, k0, kend             the item does nothing (CTA-uniform); its keys
 *                              k0 .. kend - 1, in tiles of 64;
 *   next(a, kb, stage, st)     after S of tile kb - 64 is issued: the copies
 *                              of tile kb (if kb < kend) into `stage` (ring
 *                              slot st; the caller commits them);
 *   land(a, kb, stage, st)     after P V of tile kb - 64 is issued: what the
 *                              policy itself writes into `stage` (slot st)
 *                              for tile kb;
 *   logits(sc, a, scale_log2, kb, wg, t4, st)  S of the thread's keys
 *                              kb + 32 wg + 8 j + 2 t4 + e (ring slot st) into
 *                              log2-unit logits, masked keys -inf;
 *   finish(a, s_sum, wg, r0, t4, l_run, m_run, o)  the item's stores; ends
 *                              with every thread past s_sum.
 *
 * The tile loop, per 64-key tile (stage = its ring slot):
 *   1. wait for this thread's copies of the tile, barrier (the tile landed;
 *      both warpgroups' P V of the previous tile are done);
 *   2. issue S, then the copy of the next tile into the other stage (S first:
 *      the copy issued ahead of S, or in whole 128-byte lines per warp
 *      instruction, ran slower);
 *   3. S done: logits, the thread's row maxima into s_max, and P written
 *      against the current reference max m_run (the lazy max rarely moves);
 *   4. one barrier with a vote: when no row's max grew past m_run + MW_LAZY
 *      (the usual case) P is final; otherwise (the item's first tile, a
 *      jump) every thread takes its rows' maxima from s_max, moves the
 *      reference, rescales, rewrites P, and all meet at a second barrier;
 *   5. P V issued, the policy's land step for the next tile, P V waited for.
 */
template <typename Ty, typename W>
__global__ void __launch_bounds__(ML_NT, 1) mla_wgmma_kernel(const typename W::args a)
{
#ifdef KVA_MLA_WGMMA_BODY
    extern __shared__ __align__(1024) unsigned char mw_smem_raw[];
    __shared__ float s_max[2][64], s_sum[2][64];
    const uint32_t raw = kva__smem_u32(mw_smem_raw);
    const uint32_t sQ = (raw + 1023u) & ~1023u;
    const uint32_t sK = sQ + MW_QB, sP = sK + MW_NST * MW_KB;
    unsigned char *q_gen = mw_smem_raw + (sQ - raw);

    const int tid = threadIdx.x, lane = tid & 31, g4 = lane >> 2, t4 = lane & 3;
    const int wg = tid >> 7;                   /* warpgroup: key slice of S, column half of O */
    const int r0 = ((tid >> 5) & 3) * 16 + g4; /* the thread's rows r0 and r0 + 8 */
    const int32_t n_items = W::items(a);
    const float scale_log2 = a.scale * KVA__DMMA_LOG2E;
    const uint64_t dq = kva__wgmma_desc(sQ, 16, 1024);
    const uint64_t dk = kva__wgmma_desc(sK, 16, 1024);
    const uint64_t dv = kva__wgmma_desc(sK, MW_BN * 128, 1024);
    const uint64_t dp = kva__wgmma_desc(sP, 16, 1024);

    for (int32_t it = blockIdx.x; it < n_items; it += gridDim.x) {
        W wi(a, it, sK, q_gen, r0);
        if (wi.skip)
            continue;
        const int32_t kend = wi.kend;

        /* O [64, 256] of this warpgroup: n8 tiles 16 h + n are columns
         * 256 wg + 128 h + 8 n + ... (two m64n128 accumulators). */
        float o[32][4];
#pragma unroll
        for (int n = 0; n < 32; n++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                o[n][e] = 0.f;
        float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};

        const int32_t k0 = wi.k0;
        for (int32_t kb = k0; kb < kend; kb += MW_BN) {
            const int stage = ((kb - k0) / MW_BN) & 1;
            kva__cp_async_wait<0>();
            kva__fence_proxy_async(); /* cp.async and Q stores -> the wgmma operand reads */
            __syncthreads();          /* 1. tile kb landed; the other stage and P are free */
            const uint32_t st_off = (uint32_t)stage * MW_KB;

            /* 2. S = Q K^T for keys kb + 32 wg .. + 31: 36 k-steps over 576, in
             * two accumulator chains (even and odd k-steps) summed afterwards.
             * Warpgroup-uniform branches: each side's descriptors are then
             * constant offsets from uniform bases. */
            float sc[4][4], sc2[4][4];
            if (wg == 0)
                mw_s<Ty, 0>(sc, sc2, dq, dk + (st_off >> 4));
            else
                mw_s<Ty, 1>(sc, sc2, dq, dk + (st_off >> 4));
            /* The next tile's copies go out while the tensor cores run S. */
            wi.next(a, kb + MW_BN, sK + (stage ^ 1) * MW_KB, stage ^ 1);
            kva__cp_async_commit();
            kva__wgmma_wait<0>();
#pragma unroll
            for (int j = 0; j < 4; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    kva__reg_fence(sc[j][e]);
                    kva__reg_fence(sc2[j][e]);
                    sc[j][e] += sc2[j][e];
                }
            wi.logits(sc, a, scale_log2, kb, wg, t4, stage);

            /* 3. The thread's row maxima over its keys and 4 lanes; a row
             * whose max grew past the lazy headroom (or was -inf and is not
             * now) votes to move the reference. */
            bool move = false;
            float mu[2], psum[2];
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                const float mx = kva__dmma_row_max<4>(sc, hf);
                if (t4 == 0)
                    s_max[wg][r0 + 8 * hf] = mx;
                move |= mx > m_run[hf] + MW_LAZY; /* -inf + MW_LAZY is -inf */
                mu[hf] = m_run[hf] == -INFINITY ? 0.f : m_run[hf];
            }
            mw_store_p<Ty>(sc, mu, sP, wg, r0, t4, psum);
            kva__fence_proxy_async(); /* P stores -> the wgmma operand reads */
            /* 4. Every thread's vote; the barrier also publishes s_max and P. */
            if (__syncthreads_or(move)) {
#pragma unroll
                for (int hf = 0; hf < 2; hf++) {
                    const int r = r0 + 8 * hf;
                    float mx = fmaxf(m_run[hf], fmaxf(s_max[0][r], s_max[1][r]));
                    if (m_run[hf] != -INFINITY && !(mx > m_run[hf] + MW_LAZY))
                        mx = m_run[hf];
                    mu[hf] = mx == -INFINITY ? 0.f : mx;
                    const float alpha = kva__ex2(m_run[hf] - mu[hf]); /* 0 while m_run = -inf */
                    m_run[hf] = mx;
                    l_run[hf] *= alpha;
#pragma unroll
                    for (int n = 0; n < 32; n++) {
                        o[n][2 * hf] *= alpha;
                        o[n][2 * hf + 1] *= alpha;
                    }
                }
                /* P against the moved reference (nobody reads P before the
                 * barrier below). */
                mw_store_p<Ty>(sc, mu, sP, wg, r0, t4, psum);
                kva__fence_proxy_async();
                __syncthreads();
            }
            l_run[0] += psum[0];
            l_run[1] += psum[1];

            /* 5. O += P V over the tile's 64 keys (4 k-steps) for value columns
             * 256 wg + 128 h .. + 127: column blocks 4 wg + 2 h and + 1. */
            if (wg == 0)
                mw_pv<Ty, 0>(o, dp, dv + (st_off >> 4));
            else
                mw_pv<Ty, 1>(o, dp, dv + (st_off >> 4));
            wi.land(a, kb + MW_BN, sK + (stage ^ 1) * MW_KB, stage ^ 1);
            kva__wgmma_wait<0>();
#pragma unroll
            for (int n = 0; n < 32; n++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    kva__reg_fence(o[n][e]);
        }
        kva__cp_async_wait<0>(); /* nothing may land in the ring after the item */
        wi.finish(a, s_sum, wg, r0, t4, l_run, m_run, o);
    }
#endif
}

#endif
