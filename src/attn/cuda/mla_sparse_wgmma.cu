/*
 * mla_sparse_wgmma.cu - sparse absorbed MLA (kva_mla_sparse_run, DeepSeek
 * V3.2) on the sm_90a wgmma MLA body (mla_wgmma_body.cuh, registry entry
 * "mla_decode_wgmma_sm90"): the body's sparse work policy. An item is one
 * query token x a head tile of 64 rows (heads h0 .. h0 + 63 of that token;
 * fewer heads are zero rows) x a key split; its keys are the entries of the
 * token's own index list, turned into cache rows through its request's
 * block-table row (or, for the separate mode's dense rows, used as row
 * numbers). Entries past topk_length, -1 and positions outside
 * 0 .. seq_len - 1 are unused: their rows are zeros in the tile and their
 * logits -inf (the per-stage key flags s_ok).
 *
 * Two row formats (the policy's FP8 parameter):
 *   16-bit rows (a latent cache of the q dtype, or the dense rows): copied
 *     by cp.async into the ring like the dense decode's tiles (the body's
 *     split-key schedule, MW_SCHED_SPLIT), the row of each thread's key
 *     looked up one tile ahead;
 *   fp8_ds_mla rows (656 bytes), on the body's alternating-tile schedule
 *     with the early S (MW_SCHED_ALT_EARLY): each row is prefetched into L2
 *     one tile of its warpgroup ahead (one bulk prefetch), then, in the
 *     body's two fill parts, loaded by its 2 threads into registers and
 *     written into the ring as q-dtype values code * scale (fp32 product,
 *     rounded once), as FlashMLA's sparse kernels and this backend's
 *     separate mode read them. With one head tile per token (H <= 64) each
 *     row is converted once; with two (H 65 .. 128) the two head tiles of a
 *     token run in the two CTAs of a cluster, in step over the same keys
 *     (MW_SCHED_ALT_XOVER, the "crossover" of FlashMLA's sparse FP8
 *     decode): CTA rank r converts keys 32 r .. 32 r + 31 of every tile (4
 *     threads per key) and stores them into its own ring and, through
 *     distributed shared memory, into the other CTA's, so each row is
 *     converted once per token. Per warpgroup and fill part two mbarriers
 *     in each CTA carry the hand-offs: "free" (the 4 warps of each CTA's
 *     warpgroup done reading that part of their stage: 8 arrivals, local
 *     and remote) before anyone writes it, "full" before the wgmmas read
 *     it (the CTA's own 128 writer threads arrive after their stores and
 *     a proxy fence; the other CTA's stores are st.async, whose bytes
 *     complete on it: MW_XO_TX). Per-thread phase bits live in shared
 *     memory between items. Beyond 128 heads each head tile converts its
 *     own rows.
 * Split partials and their merge are mla_sparse.cu's (ml_finish with sp_dst,
 * sp_merge_kernel), so the launch geometry is the mma.sync kernel's with
 * 64-row head tiles.
 */
extern "C" {
#include "cuda_backend.h"
}
#include "cuda_check.h"
#include "mla_sparse_common.cuh"
#include "mla_wgmma_body.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <math.h>
#include <stdint.h>

#ifdef KVA_MLA_WGMMA_BODY
/* Flags of the keys of the two ring stages: 1 used, 0 unused (masked). */
static __device__ __forceinline__ int (*ms_ok())[MW_BN]
{
    __shared__ int ok[MW_NST][MW_BN];
    return ok;
}

/* Crossover (MW_SCHED_ALT_XOVER) mbarriers: full [2 warpgroups][2 parts],
 * then free [2][2]; and each thread's phase bits between items. */
static __device__ __forceinline__ uint32_t ms_bars()
{
    __shared__ __align__(8) uint64_t bars[8];
    return kva__smem_u32(bars);
}
/* Bytes the other CTA stores into a part of a tile: its 32 keys' column
 * blocks (4 or 5 x 32 x 128 bytes), part 0 also their 4-byte key flags. */
#define MW_XO_TX(PART) ((PART) == 0 ? 4 * 32 * 128 + 32 * 4 : 5 * 32 * 128)
static __device__ __forceinline__ unsigned char *ms_phase()
{
    __shared__ unsigned char ph[ML_NT];
    return ph;
}

/* Cache row of entry j of the token's list (-1: unused or past kend). */
static __device__ __forceinline__ int64_t ms_row(const sp_args &a, const int32_t *bt_row, int32_t p,
                                                 int32_t s)
{
    const sp_key k = sp_locate(a, bt_row, p, s);
    return k.ok ? (int64_t)k.blk * a.B + k.off : -1;
}

/* The sparse work policy of mla_wgmma_kernel (interface: mla_wgmma_body.cuh).
 * 16-bit rows: thread tid copies key tid / 4 of every tile (part tid % 4);
 * fp8_ds_mla: the fill thread (2 per key) converts its half of its key;
 * XO (fp8_ds_mla, two head tiles per token, a cluster of 2 CTAs): the fill
 * thread (4 per key, keys 32 rank ..) converts its quarter of its key into
 * both CTAs' rings. */
template <typename Ty, bool FP8, bool XO = false> struct ms_sparse {
    typedef sp_args args;
    static constexpr int SCHED =
        !FP8 ? MW_SCHED_SPLIT : XO ? MW_SCHED_ALT_XOVER : MW_SCHED_ALT_EARLY;
    sp_item mi;
    uint32_t xs; /* XO: bits 0-1 the phase parity of part 0 / 1, bits 2-3 its fill pending */
    bool skip;
    int32_t k0, kend;
    int64_t row1;      /* 16-bit: the thread's key row in the next tile */
    int32_t pnext;     /* its entry's position in the tile after that */
    int64_t row, rown; /* fp8: the fill thread's key row in the tile being filled, in the next */

    static __device__ __forceinline__ int32_t items(const args &a)
    {
        return a.nt * a.tiles * a.nsplit;
    }
    __device__ __forceinline__ int32_t pos(int32_t j) const
    {
        return j < kend ? __ldg(mi.idx_row + j) : -1;
    }
    /* fp8_ds_mla: the fill thread's key in a tile (XO: key 32 rank + t / 4
     * of the warpgroup's thread t). */
    static __device__ __forceinline__ int fkey()
    {
        return XO ? 32 * (int)(blockIdx.x & 1) + ((threadIdx.x & (MW_WT - 1)) >> 2) : mw_fkey();
    }
    /* fp8_ds_mla: the fill thread's cache row in tile kb (-1: unused entry
     * or past kend). */
    __device__ __forceinline__ int64_t key_row(const args &a, int32_t kb) const
    {
        const int32_t j = kb + fkey();
        return ms_row(a, mi.bt_row, j < kend ? __ldg(mi.idx_row + j) : -1, mi.s);
    }
    /* fp8_ds_mla: 8 codes (c) times the tile scale scl, in the q dtype. */
    static __device__ __forceinline__ uint4 cvt8(uint2 c, float scl)
    {
        uint32_t w[4];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const uint32_t word = i < 2 ? c.x : c.y;
            const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(
                (__nv_fp8x2_storage_t)((word >> (16 * (i & 1))) & 0xffffu), __NV_E4M3);
            const float2 f = __half22float2(__half2(h));
            w[i] = Ty::pack(f.x * scl, f.y * scl);
        }
        return make_uint4(w[0], w[1], w[2], w[3]);
    }
    /* Item it: token, head tile, split; 16-bit: the first tile in stage 0,
     * Q; fp8_ds_mla: the row of the fill thread's first tile. */
    __device__ __forceinline__ ms_sparse(const args &a, int32_t it, uint32_t sK,
                                         unsigned char *q_gen, int)
    {
        if constexpr (XO) {
            /* The cluster's CTAs (ranks it % 2 = blockIdx.x % 2) take head
             * tiles 0 and 1 of the same (token, split). */
            const int32_t pair = it >> 1;
            if (it == (int32_t)blockIdx.x) { /* the CTA's first item: the mbarriers */
                if (threadIdx.x < 4) {
                    kva__mbar_init(ms_bars() + 8 * threadIdx.x, MW_WT);
                    kva__mbar_init(ms_bars() + 8 * (4 + threadIdx.x), 8);
                }
                ms_phase()[threadIdx.x] = 0;
                kva__cluster_sync(); /* the inits, before the other CTA's arrives */
            }
            xs = ms_phase()[threadIdx.x];
            it = ((pair / a.nsplit) * a.tiles + (it & 1)) * a.nsplit + pair % a.nsplit;
        }
        mi = sp_item_load<MW_M>(a, it);
        skip = mi.skip;
        if (skip)
            return;
        k0 = mi.kbeg;
        kend = mi.kend;
        if constexpr (FP8) {
            rown = key_row(a, k0 + (threadIdx.x >= MW_WT ? MW_BN : 0));
        } else {
            const int key = threadIdx.x >> 2;
            const int64_t first = ms_row(a, mi.bt_row, pos(k0 + key), mi.s);
            if (k0 < kend)
                issue_row(a, first, sK, 0);
            row1 = ms_row(a, mi.bt_row, pos(k0 + MW_BN + key), mi.s);
            pnext = pos(k0 + 2 * MW_BN + key);
            kva__cp_async_commit();
            sp_stage_q<MW_M, MW_M, typename Ty::elem>(a, mi, q_gen);
        }
    }
    /* 16-bit rows: the copies of `row` as the thread's key (cp.async). */
    __device__ __forceinline__ void issue_row(const args &a, int64_t row, uint32_t stage,
                                              int st) const
    {
        ml_issue_row_at<MW_BN, MW_BN>(a.rows, row, stage);
        if ((threadIdx.x & 3) == 0)
            ms_ok()[st][threadIdx.x >> 2] = row >= 0;
    }
    /* 16-bit (MW_SCHED_SPLIT): the copies of tile kb; nothing lands later. */
    __device__ __forceinline__ void next(const args &a, int32_t kb, uint32_t stage, int st)
    {
        if (kb >= kend)
            return;
        const int key = threadIdx.x >> 2;
        issue_row(a, row1, stage, st);
        row1 = ms_row(a, mi.bt_row, pnext, mi.s);
        pnext = pos(kb + 2 * MW_BN + key);
    }
    __device__ __forceinline__ void land(const args &, int32_t, uint32_t, int) {}
    __device__ __forceinline__ void logits(float (&sc)[4][4], const args &, float scale_log2,
                                           int32_t, int wg, int t4, int st) const
    {
        const int *ok = ms_ok()[st];
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                sc[j][e] =
                    ok[wg * 32 + j * 8 + 2 * t4 + (e & 1)] ? sc[j][e] * scale_log2 : -INFINITY;
    }
    /* fp8_ds_mla (MW_SCHED_ALT_EARLY): Q, then part PART of tile kb (flags
     * of its keys with part 0): rows loaded and converted (thread half c:
     * codes 64 b + 32 c .. + 31 of block b < 8 times their tile's scale, k_pe
     * values 32 c .. 32 c + 31 for block 8); after part 1 the rows of the
     * warpgroup's next tile are looked up and prefetched into L2. */
    __device__ __forceinline__ void stage_q(const args &a, unsigned char *q_gen) const
    {
        sp_stage_q<MW_M, MW_M, typename Ty::elem>(a, mi, q_gen);
    }
    /* XO: 16 codes (c, the thread's quarter q of a value block) times scl as
     * the two 16-byte chunks 2 q, 2 q + 1 of the tile row; 16 bf16 k_pe
     * values in the q dtype. */
    static __device__ __forceinline__ void pe8(uint4 pe, uint4 &w)
    {
        const uint32_t bw[4] = {pe.x, pe.y, pe.z, pe.w};
        uint32_t v[4];
#pragma unroll
        for (int e = 0; e < 4; e++)
            v[e] = Ty::pack(__uint_as_float(bw[e] << 16), __uint_as_float(bw[e] & 0xffff0000u));
        w = make_uint4(v[0], v[1], v[2], v[3]);
    }
    /* XO: part PART of tile kb by the warpgroup's 128 threads of both CTAs
     * (see the file comment): free, then converted into both rings, then
     * full. */
    template <int WG, int PART>
    __device__ __forceinline__ void fill_xo(const args &a, int32_t kb, uint32_t stage, int st)
    {
        const uint32_t peer = (blockIdx.x & 1) ^ 1;
        const uint32_t full = ms_bars() + 8 * (2 * WG + PART), fre = full + 32;
        /* The caller's order: this warp's reads of the part (wgmma and the
         * flags) are done; both CTAs write it once all 8 warps said so. */
        __syncwarp();
        if ((threadIdx.x & 31) == 0) {
            kva__mbar_arrive_remote(kva__mapa(fre, peer));
            kva__mbar_arrive(fre);
        }
        kva__mbar_wait_cl(fre, (xs >> PART) & 1);
        const int key = fkey(), q = threadIdx.x & 3;
        const uint32_t rfull = kva__mapa(full, peer);
        if (PART == 0) {
            row = rown;
            if (q == 0) {
                const uint32_t ok = kva__smem_u32(&ms_ok()[st][key]);
                ms_ok()[st][key] = row >= 0;
                kva__st_async4(kva__mapa(ok, peer), row >= 0, rfull);
            }
        }
        const unsigned char *src = a.rows + (row >= 0 ? row : 0) * sp_ds_mla::ROW;
        const uint32_t rstage = kva__mapa(stage, peer);
#pragma unroll
        for (int i = 0; i < MW_FNB(PART); i++) {
            const int b = mw_fblk<WG, PART>(i);
            uint4 w0, w1;
            if (b < 8) {
                uint4 raw = make_uint4(0, 0, 0, 0);
                float scl = 0.f;
                if (row >= 0) {
                    raw = __ldg(reinterpret_cast<const uint4 *>(src + 64 * b + 16 * q));
                    scl = __ldg(reinterpret_cast<const float *>(src + ML_DV) + (b >> 1));
                }
                w0 = cvt8(make_uint2(raw.x, raw.y), scl);
                w1 = cvt8(make_uint2(raw.z, raw.w), scl);
            } else {
                const uint4 *pe = reinterpret_cast<const uint4 *>(src + ML_DV + 16) + 2 * q;
                pe8(row >= 0 ? __ldg(pe) : make_uint4(0, 0, 0, 0), w0);
                pe8(row >= 0 ? __ldg(pe + 1) : make_uint4(0, 0, 0, 0), w1);
            }
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const uint32_t off = (uint32_t)(b * MW_BN * 128 + key * 128 +
                                                (((2 * q + h) ^ (key & 7)) << 4));
                mw_st16(stage + off, h ? w1 : w0);
                kva__st_async16(rstage + off, h ? w1 : w0, rfull);
            }
        }
        kva__fence_proxy_async(); /* this CTA's ring stores -> the wgmma reads */
        if ((threadIdx.x & (MW_WT - 1)) == 0) /* one arrive also expects the other CTA's bytes */
            kva__mbar_expect_tx(full, MW_XO_TX(PART));
        else
            kva__mbar_arrive(full);
        xs |= 4u << PART;
        if (PART == 1) { /* the rows of the warpgroup's next tile into L2 */
            rown = key_row(a, kb + 2 * MW_BN);
            if (rown >= 0 && q == 0)
                mw_prefetch_l2(a.rows + rown * sp_ds_mla::ROW, sp_ds_mla::ROW);
        }
    }
    /* XO: the warpgroup's pending fills landed (PEND 1: the last fill's
     * part 1 may still be pending). */
    template <int WG, int PEND> __device__ __forceinline__ void landed()
    {
        const uint32_t full = ms_bars() + 8 * (2 * WG);
        if (xs & 4u) {
            kva__mbar_wait_cl(full, xs & 1u);
            xs = (xs ^ 1u) & ~4u;
        }
        if (PEND == 0 && (xs & 8u)) {
            kva__mbar_wait_cl(full + 8, (xs >> 1) & 1u);
            xs = (xs ^ 2u) & ~8u;
        }
        kva__fence_proxy_async(); /* the other CTA's st.async bytes -> the wgmma reads */
    }
    template <int WG, int PART>
    __device__ __forceinline__ void fill(const args &a, int32_t kb, uint32_t stage, int st)
    {
        if constexpr (XO) {
            fill_xo<WG, PART>(a, kb, stage, st);
            return;
        }
        if (PART == 0) {
            row = rown;
            if (mw_fhalf() == 0)
                ms_ok()[st][mw_fkey()] = row >= 0;
        }
        const unsigned char *src = a.rows + (row >= 0 ? row : 0) * sp_ds_mla::ROW;
        const int c = mw_fhalf();
#pragma unroll
        for (int i = 0; i < MW_FNB(PART); i++) {
            const int b = mw_fblk<WG, PART>(i);
            if (b < 8) {
                uint4 raw[2];
                float scl = 0.f;
                if (row >= 0) {
#pragma unroll
                    for (int h = 0; h < 2; h++)
                        raw[h] = __ldg(reinterpret_cast<const uint4 *>(src + 64 * b + 32 * c) + h);
                    scl = __ldg(reinterpret_cast<const float *>(src + ML_DV) + (b >> 1));
                } else {
                    raw[0] = raw[1] = make_uint4(0, 0, 0, 0);
                }
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    mw_st16(mw_fill_at(stage, b, 2 * h), cvt8(make_uint2(raw[h].x, raw[h].y), scl));
                    mw_st16(mw_fill_at(stage, b, 2 * h + 1),
                            cvt8(make_uint2(raw[h].z, raw[h].w), scl));
                }
            } else {
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    const uint4 pe =
                        row >= 0
                            ? __ldg(reinterpret_cast<const uint4 *>(src + ML_DV + 16) + 4 * c + k)
                            : make_uint4(0, 0, 0, 0);
                    const uint32_t bw[4] = {pe.x, pe.y, pe.z, pe.w};
                    uint32_t w[4];
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        w[e] = Ty::pack(__uint_as_float(bw[e] << 16),
                                        __uint_as_float(bw[e] & 0xffff0000u));
                    mw_st16(mw_fill_at(stage, b, k), make_uint4(w[0], w[1], w[2], w[3]));
                }
            }
        }
        if (PART == 1) { /* the rows of the warpgroup's next tile into L2 */
            rown = key_row(a, kb + 2 * MW_BN);
            if (rown >= 0 && mw_fhalf() == 0)
                mw_prefetch_l2(a.rows + rown * sp_ds_mla::ROW, sp_ds_mla::ROW);
        }
    }
    __device__ __forceinline__ void logits(float (&sc)[8][4], const args &, float scale_log2,
                                           int32_t, int t4, int st) const
    {
        const int *ok = ms_ok()[st];
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                sc[j][e] = ok[j * 8 + 2 * t4 + (e & 1)] ? sc[j][e] * scale_log2 : -INFINITY;
    }
    __device__ __forceinline__ void finish(const args &a, float (*s_sum)[64], int wg, int r0,
                                           int t4, float l_run[2], const float m_run[2],
                                           const float (*o)[4])
    {
        if constexpr (XO)
            ms_phase()[threadIdx.x] = (unsigned char)(xs & 3u);
        /* Ends with a barrier: s_sum, Q, the ring and the flags are rewritten by the
         * next item. */
        ml_finish<32, 2, Ty>(sp_dst{a, mi.t, mi.h0, mi.nrows, mi.split}, s_sum, wg, r0, wg * 256,
                             t4, l_run, m_run, o);
    }
};
#else
template <typename Ty, bool FP8, bool XO = false> struct ms_sparse { /* other passes: empty */
    typedef sp_args args;
};
#endif

typedef void (*ms_kernel_fn)(sp_args);

template <typename Ty> static ms_kernel_fn ms_pick_ty(int fp8, int xo)
{
    return !fp8 ? mla_wgmma_kernel<Ty, ms_sparse<Ty, false>>
           : xo ? mla_wgmma_kernel<Ty, ms_sparse<Ty, true, true>>
                : mla_wgmma_kernel<Ty, ms_sparse<Ty, true>>;
}
static ms_kernel_fn ms_pick(kva_dtype dt, int fp8, int xo)
{
    if (dt == KVA_DTYPE_BF16)
        return ms_pick_ty<kva__mma_bf16>(fp8, xo);
    if (dt == KVA_DTYPE_F16)
        return ms_pick_ty<kva__mma_f16>(fp8, xo);
    return NULL;
}

kva_status kva__cuda_sparse_wgmma_launch(const sp_args *a, kva_dtype q_dtype, int fp8, int grid,
                                         void *stream)
{
    /* Two head tiles per token over fp8_ds_mla rows: the crossover kernel,
     * in clusters of 2 CTAs (an even grid: the items come in pairs). */
    const int xo = fp8 && a->tiles == 2;
    const ms_kernel_fn fn = ms_pick(q_dtype, fp8, xo);
    if (!fn || !kva__cuda_prefill_wgmma_ready())
        return kva__fail(KVA_STATUS_UNSUPPORTED,
                         "kva_mla_sparse_run: mla_decode_wgmma_sm90 needs an sm_90a build and "
                         "device and f16/bf16 q (got %s)",
                         kva_dtype_name(q_dtype));
    const int smem = fp8 ? MW_SMEM_ALT : MW_SMEM;
    KVA_CUDA_TRY(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    if (xo) {
        cudaLaunchConfig_t cfg = {};
        cudaLaunchAttribute at[1];
        at[0].id = cudaLaunchAttributeClusterDimension;
        at[0].val.clusterDim.x = 2;
        at[0].val.clusterDim.y = 1;
        at[0].val.clusterDim.z = 1;
        cfg.gridDim = dim3((unsigned)(grid & ~1));
        cfg.blockDim = dim3(ML_NT);
        cfg.dynamicSmemBytes = (size_t)smem;
        cfg.stream = (cudaStream_t)stream;
        cfg.attrs = at;
        cfg.numAttrs = 1;
        KVA_CUDA_TRY(cudaLaunchKernelEx(&cfg, fn, *a));
    } else {
        fn<<<grid, ML_NT, (size_t)smem, (cudaStream_t)stream>>>(*a);
    }
    KVA_CUDA_LAUNCHED("mla_sparse wgmma kernel");
    return KVA_STATUS_OK;
}
