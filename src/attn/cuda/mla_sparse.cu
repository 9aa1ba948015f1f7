/*
 * mla_sparse.cu - sparse absorbed MLA (DeepSeek V3.2, kva_mla_sparse_run) on
 * mma.sync (registry entry "mla_decode_mma_sm80": plans of H <= 32, every
 * plan without sm_90a, and any plan when forced; H > 32 runs on the wgmma
 * body, mla_sparse_wgmma.cu) and the host side of both kernels (the kernel
 * choice, launches, splits, workspace, merge): every query token attends only the
 * latent rows its own index list names, gathered from the paged cache (or
 * from a request's dense rows in the separate mode), on mma.sync m16n8k16
 * with fp32 accumulation. The kernel is the absorbed MLA decode's body
 * (mla_decode_mma_kernel, mla_decode_mma.cuh) with the key-source policy
 * sp_mma<Ty, SRC> below:
 *   the row format SRC (mla_sparse_common.cuh): 16-bit latent rows of 1152
 *     bytes (a bf16/f16 cache, or the separate mode's gathered rows), or
 *     fp8_ds_mla rows of 656 bytes (codes, 4 tile scales, bf16 k_pe), which
 *     land in a raw ring and become a 16-bit tile of the CODES (e4m3 values
 *     are exact in bf16 and f16); the scales enter in fp32: S = sum over the
 *     4 c_kv tiles of s_tile(key) * (q_tile . codes_tile) + q_pe . k_pe, and
 *     P V uses P_tile = P * s_tile(key) for each tile's value columns. So the
 *     keys and values are the cache's exact dequantized values (only P is
 *     rounded to 16 bits, as for every cache), not FlashMLA's bf16 rounding
 *     of code * scale;
 *   the addressing (runtime): position p of the token's request through its
 *     block-table row, or dense row p of the request's gathered rows;
 *   the mask: per-stage key flags (entries past topk_length, -1 and
 *     positions outside 0 .. seq_len - 1 are unused: zero rows, logits
 *     -inf); the stores: ml_finish with sp_dst (LSE includes the sink).
 * With fp8_ds_mla rows and 16-row head tiles (H <= 16) the body computes
 * S transposed (sp_ds_mla::ST, ml_st_tile in mla_decode_mma.cuh): Q^T
 * stays in registers, split over two column halves of warps, and each warp
 * converts the columns it reads of its 16 keys (convert below); on sm_90
 * those rows land by one bulk copy each (sp_ds_mla::BULK, issue below).
 *
 * Work: item = (query token t, head tile of M = 16 MT rows, key split), one
 * per CTA. The M rows are heads h0 .. h0 + M - 1 of ONE token (each token
 * has its own index list, so tokens never share a key tile): MT = 1, 2 or 4,
 * the smallest that holds H up to 64, H > 64 in 64-row tiles. A token's K
 * index entries are cut into nsplit chunks when the items are too few to
 * fill the GPU; chunks are merged by sp_merge_kernel.
 */
extern "C" {
#include "cuda_backend.h"
#include "mla_sparse.h"
}
#include "cuda_check.h"
#include "mla_decode_mma.cuh"
#include "mla_sparse_common.cuh"
#include "wgmma_ptx.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

/* Eight bf16 k_pe values (one 16-byte chunk of an fp8_ds_mla row) as the
 * q dtype's 16-bit values: bf16 as stored, f16 rounded once (exact in f16's
 * normal range). */
static __device__ __forceinline__ uint4 sp_pe8(kva__mma_bf16, uint4 b)
{
    return b;
}
static __device__ __forceinline__ uint4 sp_pe8(kva__mma_f16, uint4 b)
{
    const uint32_t bw[4] = {b.x, b.y, b.z, b.w};
    uint32_t w[4];
#pragma unroll
    for (int i = 0; i < 4; i++)
        w[i] =
            kva__mma_f16::pack(__uint_as_float(bw[i] << 16), __uint_as_float(bw[i] & 0xffff0000u));
    return make_uint4(w[0], w[1], w[2], w[3]);
}

/* Who copies a tile's rows (C: the kernel's ml_tiles): N threads, TPK per
 * key, KPT keys each. Without producer warps the CTA's ML_NT threads (thread
 * i = tid, key i / TPK); with them (C::PROD) the lanes of the NPW copying
 * producer warps, one whole key each (i = tid - ML_NT, keys i + N j). */
template <typename C> struct sp_copiers {
    static constexpr unsigned N = C::PROD ? 32 * C::NPW : ML_NT;
    static constexpr unsigned TPK = C::PROD ? 1 : ML_NT / C::BN;
    static constexpr int KPT = C::PROD ? C::BN / N : 1;
    static_assert(KPT <= 2 && C::BN % (N / TPK) == 0, "keys of the copying threads");
    static __device__ __forceinline__ unsigned index()
    {
        return C::PROD ? threadIdx.x - ML_NT : threadIdx.x;
    }
    static __device__ __forceinline__ int key(unsigned i, int j)
    {
        return (int)(i / TPK + (N / TPK) * j);
    }
};

/* The sparse key-source policy of mla_decode_mma_kernel (interface:
 * mla_decode_mma.cuh). Item = (token, head tile of C::M rows, key split),
 * one per CTA (the grid is the item count); its keys are the token's index
 * entries kbeg .. kend - 1. The copying threads (sp_copiers) copy their keys
 * of every tile: the position of an entry is read two tiles ahead and its
 * cache row (the block-table entry) one tile ahead of the copies, so the
 * copies never wait for either; unused entries are zeros with flag 0 (logits
 * -inf); with C::BULK the key's first thread copies the whole row (one bulk
 * copy). With producer warps (C::PROD) the compute threads read no entry.
 * SRC: sp_rows16 or sp_ds_mla. */
template <typename Ty, typename SRC> struct sp_mma {
    typedef sp_args args;
    typedef SRC rows;
    sp_item mi;
    int32_t k0, kend;
    sp_key k_next[2];  /* the thread's keys j in the next tile to issue */
    int32_t p_next[2]; /* the positions of their entries in the tile after that */

    __device__ __forceinline__ explicit sp_mma(const args &) {}
    static __device__ __forceinline__ int32_t items(const args &a)
    {
        return a.nt * a.tiles * a.nsplit;
    }
    static __device__ __forceinline__ float scale_log2(const args &a)
    {
        return a.scale * KVA__DMMA_LOG2E;
    }
    template <typename C> __device__ __forceinline__ bool load(const args &a, int32_t it)
    {
        mi = sp_item_load<C::M>(a, it); /* tokens of the other side of the launch: skipped */
        if (mi.skip)
            return false;
        k0 = mi.kbeg;
        kend = mi.kend;
        typedef sp_copiers<C> K;
        if (C::PROD && threadIdx.x < ML_NT)
            return true; /* a compute thread: no copies */
#pragma unroll
        for (int j = 0; j < K::KPT; j++) {
            const int key = K::key(K::index(), j);
            k_next[j] = sp_locate(a, mi.bt_row, sp_pos(mi.idx_row, k0 + key, kend), mi.s);
            p_next[j] = sp_pos(mi.idx_row, k0 + C::BN + key, kend);
        }
        return true;
    }
    /* The copies of the thread's keys of tile kb (sp_copiers: k_next[j]'s
     * row, zeros when unused, as key i / TPK + (N / TPK) j, chunks i % TPK +
     * TPK c) and their flags; then the next keys ahead. C::BULK: the key's
     * first thread copies the whole row with one bulk copy completing on bar
     * (its arrival with the row's bytes), or, unused, the key's TPK threads
     * store the zeros and the first arrives alone. */
    template <typename C>
    __device__ __forceinline__ void issue(const args &a, int32_t kb, uint32_t stage, int *ok,
                                          uint32_t bar)
    {
        typedef sp_copiers<C> K;
#pragma unroll
        for (int j = 0; j < K::KPT; j++)
            issue_key<C>(a, kb, K::key(K::index(), j), (int)(K::index() % K::TPK), k_next[j],
                         p_next[j], stage, ok, bar);
    }
    /* issue's copies of one key (key of the tile kb, the thread's chunks c0 +
     * TPK i) from kn, then kn and pn moved on a tile. */
    template <typename C>
    __device__ __forceinline__ void issue_key(const args &a, int32_t kb, int key, int c0,
                                              sp_key &kn, int32_t &pn, uint32_t stage, int *ok,
                                              uint32_t bar) const
    {
        constexpr int TPK = sp_copiers<C>::TPK;
        const sp_key k_next = kn;
        const unsigned char *src =
            a.rows + (k_next.ok ? ((int64_t)k_next.blk * a.B + k_next.off) * SRC::ROW : 0);
        if (c0 == 0)
            ok[key] = k_next.ok;
        if constexpr (C::BULK) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
            const uint32_t d = stage + (uint32_t)(key * SRC::ROW);
            if (k_next.ok) {
                if (c0 == 0) {
                    kva__mbar_expect_tx(bar, SRC::ROW);
                    kva__bulk_load(d, src, SRC::ROW, bar);
                }
            } else {
                for (int c = c0; c < SRC::CH; c += TPK)
                    asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(d + 16 * c),
                                 "r"(0)
                                 : "memory");
                /* a later bulk copy (async proxy) rewrites these bytes */
                kva__fence_proxy_async();
                if (c0 == 0)
                    kva__mbar_arrive(bar);
            }
#endif
        } else if constexpr (SRC::FP8) { /* unrolled: every offset but the thread's is a constant */
            const uint32_t d = stage + (uint32_t)(key * SRC::ROW + c0 * 16);
            const int n = k_next.ok ? 16 : 0;
#pragma unroll
            for (int i = 0; i < (SRC::CH + TPK - 1) / TPK; i++)
                if (SRC::CH % TPK == 0 || c0 + TPK * i < SRC::CH)
                    kva__cp_async16(d + TPK * 16 * i, src + (n ? (c0 + TPK * i) * 16 : 0), n);
        } else {
            for (int c = c0; c < SRC::CH; c += TPK)
                kva__cp_async16(stage + ml_off<0>(key, c), src + (k_next.ok ? c * 16 : 0),
                                k_next.ok ? 16 : 0);
        }
        kn = sp_locate(a, mi.bt_row, pn, mi.s);
        pn = sp_pos(mi.idx_row, kb + 2 * C::BN + key, kend);
    }
    template <typename C, typename elem>
    __device__ __forceinline__ void stage_q(const args &a, unsigned char *dst) const
    {
        sp_stage_q<C::M, 0, elem>(a, mi, dst);
    }
    __device__ __forceinline__ void masks(const args &, int) {}
    /* fp8_ds_mla raw rows [BN, 656] -> the 16-bit tile [BN, 576], by the
     * warps that read them in S: the rows of this warp's S slice (keys key0 ..
     * key0 + KW - 1; each of the MT warps sharing the slice takes KW / MT of
     * them), c_kv chunk c (8 codes) as their exact 16-bit values (the scales
     * enter in fp32 in the kernel), k_pe (bf16) in the q dtype (f16: exact in
     * its normal range); then only the warps of the slice meet (MT = 1: the
     * warp alone). P V reads every row of the tile after P's barrier, and the
     * next tile's conversion starts after the loop's first barrier. Lane l
     * takes c_kv chunks l and l + 32 of each row (a warp reads 256 contiguous
     * bytes and stores one 512-byte row) and k_pe chunk l % 8 of rows l / 8 +
     * 4 j; every offset but the lane's is a constant. The transposed S
     * (C::ST; rt: the warp's column half hh): the warp converts the columns
     * it reads, c_kv chunks 32 hh + l and k_pe chunks 4 hh + l % 4 of rows
     * l / 4 + 8 j, of the 16 keys of its group, and meets no other warp. */
    template <typename C>
    static __device__ __forceinline__ void convert(const unsigned char *raw, unsigned char *tile,
                                                   int key0, int rt, int kg, int lane)
    {
        constexpr int MT = C::M / 16, R = C::KW / MT, ROW = sp_ds_mla::ROW;
        if constexpr (C::ST) {
            const unsigned char *src = raw + key0 * ROW;
            unsigned char *dst = tile + key0 * ML_D * 2; /* key0 % 16 = 0: row k's swizzle */
            const int c = 32 * rt + lane, cp = 4 * rt + (lane & 3);
            /* Loads of 8 rows, then their conversions and stores: the raw
             * stage and the tile are both shared memory, so the compiler
             * cannot move a load above the previous row's store itself. */
#pragma unroll
            for (int r0 = 0; r0 < 16; r0 += 8) {
                uint2 codes[8];
#pragma unroll
                for (int r = 0; r < 8; r++)
                    codes[r] = *reinterpret_cast<const uint2 *>(src + (r0 + r) * ROW + c * 8);
#pragma unroll
                for (int r = 0; r < 8; r++)
                    *reinterpret_cast<uint4 *>(dst + ml_off<0>(r0 + r, c)) =
                        kva__fp8x8_as<Ty>(codes[r]);
            }
#pragma unroll
            for (int j = 0; j < 2; j++) {
                const int r = (lane >> 2) + 8 * j;
                const uint4 b =
                    *reinterpret_cast<const uint4 *>(src + r * ROW + ML_DV + 16 + cp * 16);
                *reinterpret_cast<uint4 *>(dst + ml_off<0>(r, ML_DV / 8 + cp)) = sp_pe8(Ty(), b);
            }
            __syncwarp();
            return;
        }
        static_assert(C::KW % MT == 0 && R % 4 == 0, "fp8_ds_mla: 4 k_pe rows per warp pass");
        const int r0 = key0 + rt * R;
        const unsigned char *src = raw + r0 * ROW;
        /* R a multiple of 8: r0 is too (key0 is), so row r0 + k has the
         * swizzle of row k and every store offset past dst is a constant. */
        constexpr bool AL = R % 8 == 0;
        unsigned char *dst = tile + (AL ? r0 * ML_D * 2 : 0);
        const int rb = AL ? 0 : r0;
        constexpr int UNROLL = MT == 4 ? 2 : 2 * R; /* MT = 4: no registers to spare */
#pragma unroll UNROLL
        for (int i = 0; i < 2 * R; i++) {
            const int c = lane + 32 * (i % 2);
            const uint2 codes = *reinterpret_cast<const uint2 *>(src + (i / 2) * ROW + c * 8);
            *reinterpret_cast<uint4 *>(dst + ml_off<0>(rb + i / 2, c)) = kva__fp8x8_as<Ty>(codes);
        }
#pragma unroll
        for (int j = 0; j < R / 4; j++) {
            const int r = (lane >> 3) + 4 * j, c = lane & 7;
            const uint4 b = *reinterpret_cast<const uint4 *>(src + r * ROW + ML_DV + 16 + c * 16);
            *reinterpret_cast<uint4 *>(dst + ml_off<0>(rb + r, ML_DV / 8 + c)) = sp_pe8(Ty(), b);
        }
        ml_slice_sync<MT>(kg);
    }
    /* fp8_ds_mla: the 4 fp32 tile scales of the thread's keys key0 + 8 nt + 2 t4 + e. */
    template <typename C>
    static __device__ __forceinline__ void key_scales(const unsigned char *raw, int key0, int t4,
                                                      float (*ksc)[2][4])
    {
#pragma unroll
        for (int nt = 0; nt < C::NBS; nt++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const float4 v = *reinterpret_cast<const float4 *>(
                    raw + (key0 + nt * 8 + 2 * t4 + e) * sp_ds_mla::ROW + ML_DV);
                ksc[nt][e][0] = v.x, ksc[nt][e][1] = v.y, ksc[nt][e][2] = v.z, ksc[nt][e][3] = v.w;
            }
    }
    /* fp8_ds_mla: the 4 fp32 tile scales of key `key` of a raw stage. */
    static __device__ __forceinline__ float4 key_scale4(const unsigned char *raw, int key)
    {
        return *reinterpret_cast<const float4 *>(raw + key * sp_ds_mla::ROW + ML_DV);
    }
    /* Logits in log2 units; unused keys -inf. */
    template <typename C>
    __device__ __forceinline__ void logits(float (*sc)[4], const args &, float scale_log2,
                                           int32_t, int key0, int t4, const int *ok) const
    {
#pragma unroll
        for (int nt = 0; nt < C::NBS; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int kt = key0 + nt * 8 + 2 * t4 + (e & 1);
                sc[nt][e] = ok[kt] ? sc[nt][e] * scale_log2 : -INFINITY;
            }
    }
    template <typename C>
    __device__ __forceinline__ void finish(const args &a, float (*s_sum)[64], int slice, int r0,
                                           int col0, int t4, float l_run[2], const float m_run[2],
                                           const float (*o)[4]) const
    {
        /* Ends with a barrier: s_sum, Q, the ring and the flags are rewritten by a next item. */
        ml_finish<C::NBO, C::NS, Ty, (C::NPW > 0)>(sp_dst{a, mi.t, mi.h0, mi.nrows, mi.split},
                                                   s_sum, slice, r0, col0, t4, l_run, m_run, o);
    }
};

/* The split partials of tokens t0 .. t0 + nt - 1 merged with the sink: one
 * warp per (token, head), lanes over 16 columns each. */
template <typename Ty> __global__ void __launch_bounds__(128) sp_merge_kernel(const sp_args a)
{
    const int lane = threadIdx.x & 31;
    const int64_t n = (int64_t)blockIdx.x * 4 + (threadIdx.x >> 5);
    if (n >= (int64_t)a.nt * a.H)
        return;
    const int32_t t = a.t0 + (int32_t)(n / a.H), h = (int32_t)(n % a.H);
    if (a.side) { /* only this launch's side */
        const int32_t r = sp_request(a, t);
        const int32_t q_len = __ldg(a.qsl + r + 1) - __ldg(a.qsl + r);
        if ((a.side == 1) != (q_len <= a.dthr))
            return;
    }
    const float *plse = a.ws + (int64_t)a.nt * a.H * a.nsplit * ML_DV + n * a.nsplit;
    float M = a.sinks ? a.sinks[h] * KVA__DMMA_LOG2E : -INFINITY;
    for (int p = 0; p < a.nsplit; p++)
        M = fmaxf(M, plse[p]);
    const float mt = M == -INFINITY ? 0.f : M;
    float acc[16], L = a.sinks ? exp2f(a.sinks[h] * KVA__DMMA_LOG2E - mt) : 0.f;
#pragma unroll
    for (int i = 0; i < 16; i++)
        acc[i] = 0.f;
    for (int p = 0; p < a.nsplit; p++) {
        const float w = exp2f(plse[p] - mt);
        if (w == 0.f)
            continue;
        L += w;
        const float4 *po = reinterpret_cast<const float4 *>(a.ws + (n * a.nsplit + p) * ML_DV);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const float4 v = po[lane + 32 * i];
            acc[4 * i] += w * v.x;
            acc[4 * i + 1] += w * v.y;
            acc[4 * i + 2] += w * v.z;
            acc[4 * i + 3] += w * v.w;
        }
    }
    /* A NaN L (a part's NaN lse: a NaN score) makes out and lse NaN. */
    const float f = L > 0.f ? 1.f / L : (L == 0.f ? 0.f : L);
    typename Ty::elem *dst = (typename Ty::elem *)a.out + ((int64_t)t * a.H + h) * ML_DV;
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            Ty::store(dst + 4 * (lane + 32 * i) + e, acc[4 * i + e] * f);
    if (a.lse && lane == 0)
        a.lse[(int64_t)t * a.H + h] =
            L > 0.f ? (mt + log2f(L)) * KVA__DMMA_LN2 : (L == 0.f ? -INFINITY : L);
}

/* ---- host side ---- */

typedef void (*sp_kernel_fn)(sp_args);

typedef struct sp_pick {
    sp_kernel_fn fn, merge;
    int smem, bn, threads; /* threads: the host pass's NTHR (sp_threads) */
} sp_pick;

template <typename Ty, typename SRC, int MT> static sp_pick sp_pick_at(void)
{
    typedef ml_tiles<MT, false, SRC> C;
    const sp_pick k = {mla_decode_mma_kernel<Ty, MT, false, sp_mma<Ty, SRC>>, sp_merge_kernel<Ty>,
                       C::SMEM, C::BN, C::NTHR};
    return k;
}
template <typename Ty, typename SRC> static sp_pick sp_pick_mt(int mt)
{
    return mt == 1   ? sp_pick_at<Ty, SRC, 1>()
           : mt == 2 ? sp_pick_at<Ty, SRC, 2>()
                     : sp_pick_at<Ty, SRC, 4>();
}

/* Threads per CTA of k's kernel on the current device: its NTHR where the
 * binary loaded for the device was built for them (launch bound NTHR: an
 * sm_90a pass with producer warps), else ML_NT (passes without them). */
static kva_status sp_threads(sp_pick *k)
{
    cudaFuncAttributes fa;
    KVA_CUDA_TRY(cudaFuncGetAttributes(&fa, k->fn));
    if (k->threads > ML_NT && fa.maxThreadsPerBlock < k->threads)
        k->threads = ML_NT;
    return KVA_STATUS_OK;
}

static sp_pick sp_choose(kva_dtype q_dtype, int fp8, int mt)
{
    if (q_dtype == KVA_DTYPE_F16)
        return fp8 ? sp_pick_mt<kva__mma_f16, sp_ds_mla>(mt)
                   : sp_pick_mt<kva__mma_f16, sp_rows16>(mt);
    return fp8 ? sp_pick_mt<kva__mma_bf16, sp_ds_mla>(mt)
               : sp_pick_mt<kva__mma_bf16, sp_rows16>(mt);
}

/* Row tiles of 16 per item for H heads: 1, 2 or 4. */
static int sp_mt(int32_t H)
{
    return H <= 16 ? 1 : H <= 32 ? 2 : 4;
}

/* 1 if the plan runs on the wgmma MLA body (mla_sparse_wgmma.cu), chosen in
 * kva_plan_create (kva__cuda_sparse_kernel). */
static int sp_wgmma(const kva_plan *p)
{
    const kva__cuda_plan *cp = (const kva__cuda_plan *)p->device;
    return cp && cp->decode_kernel == KVA__CUDA_K_MLA_DECODE_WGMMA;
}

/* Head tiles per token and keys per tile of the plan's kernel. */
static void sp_geometry(const kva_plan *p, int32_t *tiles, int *bn)
{
    const int32_t H = p->d.num_heads;
    if (sp_wgmma(p)) {
        *tiles = (H + 63) / 64;
        *bn = 64;
        return;
    }
    const int mt = sp_mt(H);
    *tiles = (H + 16 * mt - 1) / (16 * mt);
    *bn = mt == 4 ? 32 : 64;
}

extern "C" int kva__cuda_sparse_kernel(const kva_context *ctx, const kva_plan *plan)
{
    const int fd = kva__context_forced_kernel(ctx, KVA__KERNEL_DECODE);
    if (fd == KVA__CUDA_K_MLA_DECODE_MMA)
        return KVA__CUDA_K_MLA_DECODE_MMA;
    return fd == KVA__CUDA_K_MLA_DECODE_WGMMA ||
                   (plan->d.num_heads > 32 && kva__cuda_prefill_wgmma_ready())
               ? KVA__CUDA_K_MLA_DECODE_WGMMA
               : KVA__CUDA_K_MLA_DECODE_MMA;
}

/* Key splits of a launch of `items` unsplit items over K entries of BN-key
 * tiles on num_sms SMs (one resident CTA each): none when the items fill two
 * waves; else the n (each split at least 4 tiles) with the fewest tile steps
 * on the busiest SM, ceil(items n / num_sms) CTAs of ceil(K / n / BN) tiles
 * plus one for the CTA's start (Q and the first tiles in flight), the fewest
 * splits on a tie (no partials, no merge). */
static int32_t sp_splits(int64_t items, int32_t K, int bn, int num_sms, int32_t *split_keys)
{
    const int64_t sms = num_sms > 0 ? num_sms : 1;
    const int64_t most = ((int64_t)K + 4 * bn - 1) / (4 * bn);
    int64_t keys = ((int64_t)K + bn - 1) / bn * bn, best = -1;
    for (int64_t n = 1; items > 0 && items < 2 * sms && n <= most; n++) {
        const int64_t kn = ((int64_t)K + n - 1) / n;
        const int64_t tiles = (kn + bn - 1) / bn, m = ((int64_t)K + tiles * bn - 1) / (tiles * bn);
        const int64_t cost = (items * m + sms - 1) / sms * (tiles + 1);
        if (best < 0 || cost < best)
            best = cost, keys = tiles * bn;
    }
    *split_keys = (int32_t)keys;
    return (int32_t)(((int64_t)K + keys - 1) / keys);
}

/* The launches of a plan: tokens, side, splits (host arrays of the plan). */
typedef struct sp_launch {
    int32_t t0, nt, side, r; /* r: the request of a dense (separate-mode) launch, else -1 */
    int32_t nsplit, split_keys;
    int64_t active; /* tokens that run */
} sp_launch;

/* Calls f(launch) for every launch of the plan, in run order: MIXED: one over
 * every token; SEPARATE: the decode tokens from the cache, then each prefill
 * request over its dense rows. */
template <typename F> static kva_status sp_for_launches(const kva_plan *p, int num_sms, F f)
{
    const kva_plan_desc *d = &p->d;
    const int32_t R = d->num_requests, T = p->query_start_loc[R];
    int32_t tiles = 0;
    int bn = 0;
    sp_geometry(p, &tiles, &bn);
    const int sep = d->sparse_mode == KVA_SPARSE_SEPARATE;
    int64_t decodes = 0;
    for (int32_t r = 0; r < R; r++) {
        const int32_t q = p->query_start_loc[r + 1] - p->query_start_loc[r];
        decodes += !sep || q <= d->decode_threshold ? q : 0;
    }
    sp_launch l;
    if (decodes > 0) {
        l.t0 = 0, l.nt = T, l.side = sep ? 1 : 0, l.r = -1, l.active = decodes;
        l.nsplit = sp_splits(decodes * tiles, d->sparse_topk, bn, num_sms, &l.split_keys);
        KVA_TRY(f(l));
    }
    for (int32_t r = 0; sep && r < R; r++) {
        const int32_t q = p->query_start_loc[r + 1] - p->query_start_loc[r];
        if (q <= d->decode_threshold)
            continue;
        l.t0 = p->query_start_loc[r], l.nt = q, l.side = 0, l.r = r, l.active = q;
        l.nsplit = sp_splits((int64_t)q * tiles, d->sparse_topk, bn, num_sms, &l.split_keys);
        KVA_TRY(f(l));
    }
    return KVA_STATUS_OK;
}

extern "C" kva_status kva__cuda_sparse_workspace(const kva_context *ctx, const kva_plan *plan,
                                                 size_t *bytes, size_t *rows_off)
{
    const kva__cuda_state *st = (const kva__cuda_state *)ctx->state;
    const int32_t H = plan->d.num_heads;
    size_t part = 0, dense = 0;
    const size_t es = kva_dtype_size(plan->d.q_dtype);
    KVA_TRY(sp_for_launches(plan, st->num_sms, [&](const sp_launch &l) {
        if (l.nsplit > 1) {
            const size_t b = (size_t)l.nt * H * l.nsplit * (ML_DV + 1) * sizeof(float);
            part = b > part ? b : part;
        }
        if (l.r >= 0) {
            const size_t b = (size_t)plan->seq_lens[l.r] * ML_D * es;
            dense = b > dense ? b : dense;
        }
        return KVA_STATUS_OK;
    }));
    *rows_off = (part + 255u) & ~(size_t)255u;
    *bytes = *rows_off + dense;
    return KVA_STATUS_OK;
}

extern "C" int kva__cuda_sparse_supported(const kva_plan *plan)
{
    return plan->d.head_dim == ML_D && plan->d.head_dim_v == ML_DV &&
           (plan->d.q_dtype == KVA_DTYPE_BF16 || plan->d.q_dtype == KVA_DTYPE_F16);
}

extern "C" kva_status kva__cuda_mla_sparse(kva_context *ctx, const kva_plan *plan, const void *q,
                                           const kva_cache *cache, const int32_t *indices,
                                           int64_t indices_stride, const int32_t *topk_length,
                                           const float *sinks, void *out, float *lse)
{
    kva__cuda_state *st = (kva__cuda_state *)ctx->state;
    const kva_plan_desc *d = &plan->d;
    const kva_cache_desc *cd = &cache->desc;
    const int fp8 = cd->quant == KVA_QUANT_FP8_DS_MLA;
    if (!kva__cuda_sparse_supported(plan) || cd->head_dim != ML_D || cd->head_dim_v != ML_DV ||
        (!fp8 && (cd->quant != KVA_QUANT_NONE || cd->dtype != d->q_dtype)))
        return kva__fail(KVA_STATUS_UNSUPPORTED,
                         "kva_mla_sparse_run: the CUDA sparse MLA covers D 576 / Dv 512, f16 or "
                         "bf16 q, over an fp8_ds_mla cache or a latent cache of the q dtype (got "
                         "D %d / Dv %d, q %s, cache %s / %s)",
                         (int)d->head_dim, (int)d->head_dim_v, kva_dtype_name(d->q_dtype),
                         kva_dtype_name(cd->dtype), kva_quant_name(cd->quant));
    if ((uintptr_t)q % 16 != 0)
        return kva__fail(
            KVA_STATUS_INVALID_ARGUMENT,
            "kva_mla_sparse_run: q = %p: the CUDA sparse kernel reads q rows in 16-byte "
            "chunks and needs q 16-byte aligned",
            q);
    size_t ws_bytes = 0, rows_off = 0;
    KVA_TRY(kva__cuda_sparse_workspace(ctx, plan, &ws_bytes, &rows_off));
    if (ws_bytes > ctx->workspace_bytes)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "kva_mla_sparse_run: the context's workspace (%zu bytes) is smaller "
                         "than the plan's %zu; was the plan built on this context?",
                         ctx->workspace_bytes, ws_bytes);
    const int mt = sp_mt(d->num_heads);
    cudaStream_t stream = (cudaStream_t)st->stream;
    sp_args a;
    memset(&a, 0, sizeof a);
    a.q = q;
    a.idx = indices;
    a.idx_stride = indices_stride;
    a.topk_len = topk_length;
    a.sinks = sinks;
    a.out = out;
    a.lse = lse;
    a.ws = (float *)ctx->workspace;
    a.qsl = st->meta.qsl;
    a.seq_lens = st->meta.seq_lens;
    a.bt = st->meta.block_table;
    a.R = d->num_requests;
    a.bt_stride = d->block_table_stride;
    a.B = cd->block_size;
    a.H = d->num_heads;
    a.K = d->sparse_topk;
    int bn = 0;
    sp_geometry(plan, &a.tiles, &bn);
    const int wgmma = sp_wgmma(plan);
    a.dthr = d->decode_threshold;
    a.scale = d->scale;
    return sp_for_launches(plan, st->num_sms, [&](const sp_launch &l) -> kva_status {
        const int dense = l.r >= 0;
        sp_pick k = sp_choose(d->q_dtype, dense ? 0 : fp8, mt);
        sp_args b = a;
        b.t0 = l.t0, b.nt = l.nt, b.side = l.side, b.dense = dense;
        b.nsplit = l.nsplit, b.split_keys = l.split_keys;
        b.rows = (const unsigned char *)cache->k;
        if (dense) { /* request l.r's rows 0 .. s - 1, dequantized, into the workspace */
            void *rows = (char *)ctx->workspace + rows_off;
            KVA_TRY(kva__cuda_mla_gather_rows(
                ctx, cache,
                plan->block_table ? st->meta.block_table + (int64_t)l.r * d->block_table_stride
                                  : NULL,
                plan->seq_lens[l.r], rows, d->q_dtype));
            b.rows = (const unsigned char *)rows;
        }
        const int64_t grid = (int64_t)l.nt * a.tiles * l.nsplit;
        if (grid > 0x7fffffff)
            return kva__fail(KVA_STATUS_UNSUPPORTED,
                             "kva_mla_sparse_run: %lld items exceed one launch", (long long)grid);
        if (wgmma) { /* persistent CTAs, one per SM */
            const int64_t n = grid < st->num_sms ? grid : st->num_sms;
            if (n > 0)
                KVA_TRY(
                    kva__cuda_sparse_wgmma_launch(&b, d->q_dtype, dense ? 0 : fp8, (int)n, stream));
        } else {
            KVA_CUDA_TRY(
                cudaFuncSetAttribute(k.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, k.smem));
            KVA_TRY(sp_threads(&k));
            k.fn<<<(unsigned)grid, (unsigned)k.threads, (size_t)k.smem, stream>>>(b);
            KVA_CUDA_LAUNCHED("mla_decode_mma_kernel (sparse)");
        }
        if (l.nsplit > 1) {
            const int64_t rows = (int64_t)l.nt * a.H;
            k.merge<<<(unsigned)((rows + 3) / 4), 128, 0, stream>>>(b);
            KVA_CUDA_LAUNCHED("sp_merge_kernel");
        }
        return KVA_STATUS_OK;
    });
}
