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
 * e4m3, loaded and converted by the filling warpgroup), the logit mask and
 * the end-of-item stores.
 *
 * One CTA = two warpgroups (256 threads) runs one item at a time
 * (persistent grid). Per item Q [64, 576] is staged in shared memory in the
 * wgmma K-major layout (128-byte swizzle, 9 column blocks). Key tiles of 64
 * latent rows land in a 2-stage ring in the same layout (every row read once
 * from global memory, for S and for P V). The schedule alternates whole
 * tiles between the warpgroups (FlashMLA's sm90 decode does the same): the
 * item's tiles go in pairs, tile 2i in stage 0 belongs to warpgroup 0, tile
 * 2i + 1 in stage 1 to warpgroup 1, and warpgroup g
 *   - fills its own stage (its 128 threads, 2 per key);
 *   - computes S = Q K^T of its whole tile (36 wgmma m64n64k16, A = Q and
 *     B = K from shared memory) and the tile's P, which it writes into the
 *     stage's column block 8 (the k_pe columns, no longer needed once S is
 *     done), so P needs no buffer of its own;
 *   - owns value columns 256 g .. 256 g + 255 (O [64, 256] in 128 registers
 *     per thread) and adds P V of both tiles of the pair to them: its own
 *     tile's first ("local"), then the other warpgroup's ("remote").
 * One warpgroup's softmax and hand-offs run while the other's wgmmas use the
 * tensor cores. The softmax reference max is held lazily (it moves only when
 * a row's max grows past it by MW_LAZY, so P stays below 2^MW_LAZY and O is
 * rarely rescaled) and is shared through s_ref in a chain: warpgroup 0 moves
 * it for tile 2i, warpgroup 1 adopts it, may move it for tile 2i + 1, and
 * warpgroup 0 rewrites the P rows of tile 2i whose reference moved (rare)
 * before handing P over. Named barriers (MW_BAR_*) carry the hand-offs:
 * reference ready (SC0, SC1), P ready (P0, P1), stage read by the other
 * warpgroup (FREE0, FREE1). A stage is refilled in two parts so that the
 * copy overlaps the pair's remaining work: first the filler's own value
 * half (read only by its local P V), then the other value half and block 8
 * (read by the other warpgroup's remote P V); S walks the column blocks in
 * the same order and waits for each part just before it.
 * The S and P V issue sequences are instantiated per warpgroup (the whole
 * tile loop is, under a warpgroup-uniform branch), so that their
 * descriptors are constant offsets from uniform registers.
 * Shared memory: Q 72 KB + 2 x 72 KB ring (+ 1 KB alignment).
 * Everything that issues sm_90a instructions is compiled only for sm_90a
 * (__CUDA_ARCH_FEAT_SM90_ALL); other device passes get an empty kernel that the
 * host never launches (the registry entry is usable only with sm_90a code and
 * a compute capability 9.0 device).
 */
#ifndef KVA_CUDA_MLA_WGMMA_BODY_CUH
#define KVA_CUDA_MLA_WGMMA_BODY_CUH

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
#define MW_NST 2  /* ring stages: one per warpgroup */
#define MW_WT 128 /* threads per warpgroup (each fills its own stage) */
#define MW_QB (MW_M * ML_D * 2)
#define MW_KB (MW_BN * ML_D * 2)
#define MW_PO (8 * MW_BN * 128) /* a tile's P [64, 64]: its stage's column block 8 */
#define MW_SMEM (MW_QB + MW_NST * MW_KB + 1024)
/* Headroom of the lazily moved softmax reference max (log2 units): any
 * reference gives the same out and lse, this one moves only when a row's max
 * grows past it by more than MW_LAZY (or was -inf). */
#define MW_LAZY 8.f
/* Named barriers of the tile loop (0 is __syncthreads): SC0 / SC1 the
 * reference of warpgroup 0's / 1's tile is in s_ref, P0 / P1 its P is in its
 * stage, FREE0 / FREE1 the other warpgroup is done reading stage 0 / 1 (all
 * 256 threads); WG0 + g: warpgroup g's own copies or P stores are visible. */
enum { MW_BAR_SC0 = 1, MW_BAR_SC1, MW_BAR_P0, MW_BAR_P1, MW_BAR_FREE0, MW_BAR_FREE1, MW_BAR_WG0 };

#ifdef KVA_MLA_WGMMA_BODY
/* Accumulator list of O [64, 128]: d[16][4] (n8 tile j, element e: row
 * 16 w + g + 8 (e / 2), column 8 j + 2 t + e % 2, the mma.sync C layout, see
 * wgmma_ptx.cuh); S [64, 64] is the same with 8 n8 tiles. */
#define MW_D4(c, j) c(d[j][0]), c(d[j][1]), c(d[j][2]), c(d[j][3])
#define MW_D16(c) MW_D4(c, 0), MW_D4(c, 1), MW_D4(c, 2), MW_D4(c, 3)
#define MW_D64(c)                                                                                  \
    MW_D16(c), MW_D4(c, 4), MW_D4(c, 5), MW_D4(c, 6), MW_D4(c, 7), MW_D4(c, 8), MW_D4(c, 9),       \
        MW_D4(c, 10), MW_D4(c, 11), MW_D4(c, 12), MW_D4(c, 13), MW_D4(c, 14), MW_D4(c, 15)

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
/* Fill part PART of warpgroup WG's stage with 16-bit latent rows [576] of
 * `rows` by cp.async: the thread's key is cache row `row` (zeros for -1). */
template <int WG, int PART>
static __device__ __forceinline__ void mw_copy16(const void *rows, int64_t row, uint32_t stage)
{
    const bool ok = row >= 0;
    const char *src = (const char *)rows + (ok ? row * (int64_t)(ML_D * 2) : 0) + mw_fhalf() * 64;
#pragma unroll
    for (int i = 0; i < MW_FNB(PART); i++) {
        const int b = mw_fblk<WG, PART>(i);
#pragma unroll
        for (int k = 0; k < 4; k++)
            kva__cp_async16(mw_fill_at(stage, b, k), src + b * 128 + k * 16, ok ? 16 : 0);
    }
}

/* S (+)= Q K^T over column blocks mw_blk<WG>(O0 .. O1 - 1) of the tile whose
 * descriptor is dk (4 k-steps each; the first k-step of block order 0
 * overwrites S). Issued only: the caller fences, commits and waits. */
template <typename Ty, int WG, int O0, int O1>
static __device__ __forceinline__ void mw_s(float (&sc)[8][4], uint64_t dq, uint64_t dk)
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

/* S part 0 (the warpgroup's own value half: column blocks 4 WG .. + 3) of
 * the tile at dk once its copies landed (cp.async groups: PEND may still be
 * pending, part 1's), issued and committed as a group of its own. */
template <typename Ty, int WG, int PEND>
static __device__ __forceinline__ void mw_s_part0(float (&sc)[8][4], uint64_t dq, uint64_t dk)
{
    kva__cp_async_wait<PEND>();
    kva__fence_proxy_async();
    kva__named_bar(true, MW_BAR_WG0 + WG, MW_WT);
    kva__wgmma_fence();
    mw_s<Ty, WG, 0, 4>(sc, dq, dk);
    kva__wgmma_commit();
}

/* O += P V over a tile's 64 keys (4 k-steps) for value columns
 * 256 WG + 128 h .. + 127 (column blocks 4 WG + 2 h and + 1) of the tile whose
 * P descriptor is dp and value descriptor dv; issued and committed. */
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

/* P = 2^(sc - mu) of rows r0, r0 + 8 as the A fragments of the local P V
 * (pa[kk]: k-step kk, keys 16 kk .. + 15: rows r0 / r0 + 8 x keys 16 kk +
 * 2 t4 (+ 1) and + 8, in the input dtype); psum gets the thread's row sums
 * of the fp32 values. */
template <typename Ty>
static __device__ __forceinline__ void mw_pack_p(const float (&sc)[8][4], const float mu[2],
                                                 uint32_t (&pa)[4][4], float psum[2])
{
    psum[0] = psum[1] = 0.f;
#pragma unroll
    for (int j = 0; j < 8; j++)
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            const float p0 = kva__ex2(sc[j][2 * hf] - mu[hf]);
            const float p1 = kva__ex2(sc[j][2 * hf + 1] - mu[hf]);
            psum[hf] += p0 + p1;
            pa[j >> 1][2 * (j & 1) + hf] = Ty::pack(p0, p1);
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
/* The P fragments into the [64, 64] P tile at sP (K-major, 128-byte swizzle)
 * for the other warpgroup's remote P V. */
static __device__ __forceinline__ void mw_put_p(const uint32_t (&pa)[4][4], uint32_t sP, int r0,
                                                int t4)
{
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

/*
 * The work policy W of mla_wgmma_kernel<Ty, W>: a class, one object per item.
 *   typedef args               the kernel's argument struct;
 *   static items(a)            work items of the launch (CTAs loop over them);
 *   W(a, it, r0)               loads item it and sets what logits needs for
 *                              the thread's rows r0, r0 + 8 and what the
 *                              fills of its warpgroup's first tile need;
 *   skip, k0, kend             the item does nothing (CTA-uniform); its keys
 *                              k0 .. kend - 1, in tiles of 64;
 *   stage_q(a, q_gen)          Q [64, 576] of the item (rows past it zero)
 *                              into shared memory at q_gen, all threads;
 *   fill<WG, PART>(a, kb, stage, st)  by the 128 threads of warpgroup WG:
 *                              column blocks mw_fblk<WG, PART> of the tile
 *                              kb (< kend; keys past kend zeros) into its
 *                              stage (ring slot st = WG), thread t taking key
 *                              t / 2 at mw_fill_at; cp.async (the caller
 *                              commits each part) or stores; the fills of
 *                              one warpgroup come in tile order, part 0
 *                              then part 1, its tiles kb 128 apart;
 *   logits(sc, a, scale_log2, kb, t4, st)  S of the thread's keys
 *                              kb + 8 j + 2 t4 + e (ring slot st) into
 *                              log2-unit logits, masked keys -inf;
 *   finish(a, s_sum, wg, r0, t4, l_run, m_run, o)  the item's stores; ends
 *                              with every thread past s_sum.
 */

#ifdef KVA_MLA_WGMMA_BODY
/* The tile loop of warpgroup WG over the item's pairs of tiles (see the
 * header comment); both warpgroups meet at the same named barriers in each
 * pair, also where a pair has no second tile (kend inside the first). */
template <typename Ty, int WG, typename W>
static __device__ __forceinline__ void mw_loop(W &wi, const typename W::args &a, uint32_t sQ,
                                               uint32_t sK, float *s_ref, int r0, int t4,
                                               float scale_log2, float (&o)[32][4],
                                               float m_run[2], float l_run[2])
{
    const uint32_t mine = sK + WG * MW_KB, other = sK + (1 - WG) * MW_KB;
    const uint64_t dq = kva__wgmma_desc(sQ, 16, 1024);
    const uint64_t dk = kva__wgmma_desc(mine, 16, 1024);
    const uint64_t dv_mine = kva__wgmma_desc(mine, MW_BN * 128, 1024);
    const uint64_t dv_other = kva__wgmma_desc(other, MW_BN * 128, 1024);
    const uint64_t dp_other = kva__wgmma_desc(other + MW_PO, 16, 1024);
    const int32_t k0 = wi.k0, kend = wi.kend;
    float sc[8][4];

    /* S part 0 of the first tile (both parts' copies are committed). The
     * S steps are issued even where the warpgroup has no tile (their result
     * is not used): on a path of its own, ptxas serializes every wgmma. */
    mw_s_part0<Ty, WG, 1>(sc, dq, dk);
    for (int32_t kb = k0; kb < kend; kb += 2 * MW_BN) {
        const int32_t kt = kb + WG * MW_BN; /* this warpgroup's tile */
        const bool have = kt < kend, have1 = kb + MW_BN < kend; /* CTA-uniform */
        const int32_t kn = kt + 2 * MW_BN;                       /* its next tile */
        float mu[2] = {0.f, 0.f}, psum[2] = {0.f, 0.f};

        /* The rest of S of the own tile (part 0's k-steps were issued with
         * the previous pair's remote P V) once part 1 landed. */
        kva__cp_async_wait<0>();
        kva__fence_proxy_async();
        kva__named_bar(true, MW_BAR_WG0 + WG, MW_WT);
        kva__wgmma_fence();
        mw_s<Ty, WG, 4, 9>(sc, dq, dk);
        kva__wgmma_commit();
        kva__wgmma_wait<0>();
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                kva__reg_fence(sc[j][e]);
        if (have)
            wi.logits(sc, a, scale_log2, kt, t4, WG);
        if constexpr (WG == 1) {
            /* Adopt warpgroup 0's reference for this pair. */
            kva__named_bar(true, MW_BAR_SC0, ML_NT);
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                const float m0 = s_ref[r0 + 8 * hf];
                if (m0 != m_run[hf])
                    mw_move(o, m_run, l_run, hf, m0);
            }
            __syncwarp(); /* the quad's reads before its lane 0 writes below */
        }
        if (have) {
            /* The tile's row maxima; a row whose max grew past the lazy
             * headroom (or was -inf and is not now) moves the reference. */
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                const float mx = kva__dmma_row_max<8>(sc, hf);
                if (mx > m_run[hf] + MW_LAZY) /* -inf + MW_LAZY is -inf */
                    mw_move(o, m_run, l_run, hf, mx);
                mu[hf] = m_run[hf] == -INFINITY ? 0.f : m_run[hf];
                if (t4 == 0)
                    s_ref[r0 + 8 * hf] = m_run[hf];
            }
        }
        kva__named_bar(false, WG == 0 ? MW_BAR_SC0 : MW_BAR_SC1, ML_NT);
        uint32_t pa[4][4];
        if (have) {
            mw_pack_p<Ty>(sc, mu, pa, psum);
            l_run[0] += psum[0];
            l_run[1] += psum[1];
            mw_pv_rs<Ty, WG>(o, pa, dv_mine); /* local P V, P from registers */
        }
        if constexpr (WG == 0) {
            /* Warpgroup 1's reference: rows it moved get O and P rescaled
             * (after the local P V read the old P), then P goes to stage 0. */
            kva__named_bar(true, MW_BAR_SC1, ML_NT);
            kva__wgmma_wait<0>();
            mw_o_fence(o);
            mw_a_fence(pa);
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                const float m1 = s_ref[r0 + 8 * hf];
                if (m1 != m_run[hf]) {
                    mw_scale_p<Ty>(pa, hf, kva__ex2(m_run[hf] - m1)); /* 0 from -inf */
                    mw_move(o, m_run, l_run, hf, m1);
                }
            }
            mw_put_p(pa, mine + MW_PO, r0, t4);
            kva__fence_proxy_async(); /* P stores -> the other warpgroup's wgmma reads */
            kva__named_bar(false, MW_BAR_P0, ML_NT);
            /* Our value half of stage 0 is free: part 0 of the next tile. */
            if (kn < kend)
                wi.template fill<WG, 0>(a, kn, mine, WG);
            kva__cp_async_commit();
            kva__named_bar(true, MW_BAR_P1, ML_NT);
            if (have1)
                mw_pv<Ty, WG>(o, dp_other, dv_other); /* remote P V */
        } else {
            if (have) {
                mw_put_p(pa, mine + MW_PO, r0, t4);
                kva__fence_proxy_async();
            }
            kva__named_bar(false, MW_BAR_P1, ML_NT);
            kva__named_bar(true, MW_BAR_P0, ML_NT);
            mw_pv<Ty, WG>(o, dp_other, dv_other); /* remote P V */
            kva__wgmma_wait<1>();                 /* the local one */
            mw_a_fence(pa);
            if (kn < kend)
                wi.template fill<WG, 0>(a, kn, mine, WG);
            kva__cp_async_commit();
        }
        /* S part 0 of the next tile queues behind the remote P V; then the
         * remote P V is waited for, the other warpgroup told, and part 1 of
         * the next tile goes into what it read. */
        mw_s_part0<Ty, WG, 0>(sc, dq, dk);
        kva__wgmma_wait<1>();
        mw_o_fence(o);
        kva__named_bar(false, WG == 0 ? MW_BAR_FREE1 : MW_BAR_FREE0, ML_NT);
        kva__named_bar(true, WG == 0 ? MW_BAR_FREE0 : MW_BAR_FREE1, ML_NT);
        if (kn < kend)
            wi.template fill<WG, 1>(a, kn, mine, WG);
        kva__cp_async_commit();
    }
    kva__wgmma_wait<0>(); /* the unused S part 0 past the item's last tile */
}

/* The first tile of warpgroup WG in its stage (both parts, committed). */
template <int WG, typename W>
static __device__ __forceinline__ void mw_first(W &wi, const typename W::args &a, uint32_t sK)
{
    const int32_t kt = wi.k0 + WG * MW_BN;
    if (kt < wi.kend)
        wi.template fill<WG, 0>(a, kt, sK + WG * MW_KB, WG);
    kva__cp_async_commit();
    if (kt < wi.kend)
        wi.template fill<WG, 1>(a, kt, sK + WG * MW_KB, WG);
    kva__cp_async_commit();
}
#endif

template <typename Ty, typename W>
__global__ void __launch_bounds__(ML_NT, 1) mla_wgmma_kernel(const typename W::args a)
{
#ifdef KVA_MLA_WGMMA_BODY
    extern __shared__ __align__(1024) unsigned char mw_smem_raw[];
    __shared__ float s_ref[64], s_sum[2][64];
    const uint32_t raw = kva__smem_u32(mw_smem_raw);
    const uint32_t sQ = (raw + 1023u) & ~1023u;
    const uint32_t sK = sQ + MW_QB;
    unsigned char *q_gen = mw_smem_raw + (sQ - raw);

    const int tid = threadIdx.x, lane = tid & 31, g4 = lane >> 2, t4 = lane & 3;
    const int wg = tid >> 7;                   /* warpgroup: tiles 2i + wg, column half of O */
    const int r0 = ((tid >> 5) & 3) * 16 + g4; /* the thread's rows r0 and r0 + 8 */
    const int32_t n_items = W::items(a);
    const float scale_log2 = a.scale * KVA__DMMA_LOG2E;

    for (int32_t it = blockIdx.x; it < n_items; it += gridDim.x) {
        W wi(a, it, r0);
        if (wi.skip)
            continue;
        if (wg == 0)
            mw_first<0>(wi, a, sK);
        else
            mw_first<1>(wi, a, sK);
        wi.stage_q(a, q_gen);
        kva__fence_proxy_async(); /* Q stores -> the wgmma operand reads */
        __syncthreads();

        /* O [64, 256] of this warpgroup: n8 tiles 16 h + n are columns
         * 256 wg + 128 h + 8 n + ... (two m64n128 accumulators). */
        float o[32][4];
#pragma unroll
        for (int n = 0; n < 32; n++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                o[n][e] = 0.f;
        float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};
        if (wg == 0)
            mw_loop<Ty, 0>(wi, a, sQ, sK, s_ref, r0, t4, scale_log2, o, m_run, l_run);
        else
            mw_loop<Ty, 1>(wi, a, sQ, sK, s_ref, r0, t4, scale_log2, o, m_run, l_run);
        kva__cp_async_wait<0>(); /* nothing may land in the ring after the item */
        wi.finish(a, s_sum, wg, r0, t4, l_run, m_run, o);
    }
#endif
}

#endif
