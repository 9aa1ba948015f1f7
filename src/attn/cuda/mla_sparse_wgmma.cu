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
 *     with the early S and a producer warpgroup (MW_SCHED_ALT_PROD, 384
 *     threads): each row is prefetched into L2 one tile of its stage ahead
 *     (one bulk prefetch), then, in the body's two fill parts, loaded by 2
 *     producer threads into registers (all of a part's loads before the
 *     part is free) and written into the ring as q-dtype values code *
 *     scale (fp32 product, rounded once), as FlashMLA's sparse kernels and
 *     this backend's separate mode read them. With one head tile per
 *     token (H <= 64) each row is gathered and converted once. With an even
 *     number of head tiles (H 65 .. 128: two) the two head tiles of a token
 *     run in the two CTAs of a cluster, over the same keys in step (the
 *     policy's XO trait, "the cluster of two" in mla_wgmma_body.cuh): the
 *     producer of CTA rank r gathers and converts keys 32 r .. 32 r + 31 of
 *     every tile (4 threads per key, a quarter row each) and stores them
 *     into its own ring and, by st.async through distributed shared memory,
 *     into the other CTA's, so each row is gathered and converted once per
 *     token instead of once per head tile.
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

/* Cache row of entry j of the token's list (-1: unused or past kend). */
static __device__ __forceinline__ int64_t ms_row(const sp_args &a, const int32_t *bt_row, int32_t p,
                                                 int32_t s)
{
    const sp_key k = sp_locate(a, bt_row, p, s);
    return k.ok ? (int64_t)k.blk * a.B + k.off : -1;
}

/* A producer thread's registers for one fill part (fetch, then put):
 * 2 threads per key: its half of the part's 4 value blocks (v[2 i], v[2 i + 1]
 * of block i), in part 1 its half of k_pe (pe); XO, 4 threads per key: its
 * quarter (v[i] of block i; pe: 2 chunks). scl: the scale of blocks 0, 1 and
 * of blocks 2, 3 of the part. */
template <bool XO> struct ms_raw {
    uint4 v[8];
    uint4 pe[4];
    float scl[2];
};
template <> struct ms_raw<true> {
    uint4 v[4];
    uint4 pe[2];
    float scl[2];
};

/* The sparse work policy of mla_wgmma_kernel (interface: mla_wgmma_body.cuh).
 * 16-bit rows: thread tid copies key tid / 4 of every tile (part tid % 4);
 * fp8_ds_mla: the fill thread (2 per key) converts its half of its key;
 * CL (fp8_ds_mla, an even number of head tiles: the cluster of two, see the
 * file comment): the fill thread (4 per key, keys 32 rank .. 32 rank + 31
 * of every tile) converts its quarter of its key into both CTAs' rings. */
template <typename Ty, bool FP8, bool CL = false> struct ms_sparse {
    typedef sp_args args;
    static constexpr int SCHED = FP8 ? MW_SCHED_ALT_PROD : MW_SCHED_SPLIT;
    static constexpr bool XO = CL; /* mw_xo<W> (mla_wgmma_body.cuh) */
    typedef ms_raw<CL> raw;
    sp_item mi;
    bool skip;
    int32_t k0, kend;
    int64_t row1;            /* 16-bit: the thread's key row in the next tile */
    int32_t pnext;           /* its entry's position in the tile after that */
    int64_t row[2], rown[2]; /* fp8, producer: the fill thread's key row in stage s's tile being
                                filled, in its next */
    int32_t pn[2]; /* XO, producer: its index entry in stage s's tile after that (the row
                      lookup goes one tile ahead of the block-table lookup) */

    static __device__ __forceinline__ int32_t items(const args &a)
    {
        return a.nt * a.tiles * a.nsplit;
    }
    __device__ __forceinline__ int32_t pos(int32_t j) const
    {
        return j < kend ? __ldg(mi.idx_row + j) : -1;
    }
    /* fp8_ds_mla: the fill thread's key in a tile (XO: 32 rank + t / 4 of
     * producer thread t) and, XO, its quarter of the key's row (16-byte
     * chunks 2 q, 2 q + 1 of every column block). */
    static __device__ __forceinline__ int fkey()
    {
        if constexpr (CL)
            return 32 * (int)(mw_peer() ^ 1u) + ((threadIdx.x & (MW_WT - 1)) >> 2);
        else
            return mw_fkey();
    }
    static __device__ __forceinline__ int fquarter()
    {
        return threadIdx.x & 3;
    }
    /* XO: bytes the other CTA's producer stores into a fill part here (its
     * 32 keys' column blocks of the part; part 0 also their key flags). */
    static __host__ __device__ constexpr uint32_t tx(int part)
    {
        return part == 0 ? 4 * 32 * 128 + 32 * 4 : 5 * 32 * 128;
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
        if constexpr (CL) {
            /* Items in pairs: item 2 p + rank is head tile 2 (p's tile pair)
             * + rank of pair p's (token, split), so the two CTAs of a
             * cluster (ranks it % 2 of an even grid) run the same keys. */
            const int32_t p = it >> 1, x = p / a.nsplit, half = a.tiles >> 1;
            it = ((x / half) * a.tiles + 2 * (x % half) + (it & 1)) * a.nsplit + p % a.nsplit;
        }
        mi = sp_item_load<MW_M>(a, it);
        skip = mi.skip;
        if (skip)
            return;
        k0 = mi.kbeg;
        kend = mi.kend;
        if constexpr (FP8) {
            if (threadIdx.x >= 2 * MW_WT) { /* the producer warpgroup */
                rown[0] = key_row(a, k0);
                rown[1] = key_row(a, k0 + MW_BN);
                if constexpr (CL) {
                    pn[0] = pos(k0 + 2 * MW_BN + fkey());
                    pn[1] = pos(k0 + 3 * MW_BN + fkey());
                }
            }
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
    /* fp8_ds_mla (MW_SCHED_ALT_PROD): Q by the consumers; part PART of tile
     * kt into stage S (flags of its keys with part 0) by the producer
     * warpgroup (mla_wgmma_body.cuh, mw_pfill) in two steps: fetch loads the
     * thread's codes of the part's 4 value blocks (half c: codes 64 b + 32 c
     * .. + 31 of block b; XO, quarter q: codes 64 b + 16 q .. + 15), their 2
     * tile scales and, in part 1, its share of block 8 (k_pe) into
     * registers, before the stage part is free; in part 0 it then looks up
     * the row of the stage's next tile (kt + 128). put converts the codes
     * (code * scale) into the stage once it is free (XO: into both CTAs'),
     * and in part 1 prefetches the next tile's rows into L2. */
    __device__ __forceinline__ void stage_q(const args &a, unsigned char *q_gen) const
    {
        sp_stage_q<MW_M, MW_M, typename Ty::elem>(a, mi, q_gen);
    }
    /* Part PART of tile kt (stage S): the loads (see raw). */
    template <int S, int PART>
    __device__ __forceinline__ void fetch(const args &a, int32_t kt, raw &r)
    {
        if (PART == 0)
            row[S] = rown[S];
        const int64_t rw = row[S];
        const unsigned char *src = a.rows + (rw >= 0 ? rw : 0) * sp_ds_mla::ROW;
        if constexpr (CL) {
            const int q = fquarter();
#pragma unroll
            for (int i = 0; i < 4; i++)
                r.v[i] = rw >= 0 ? __ldg(reinterpret_cast<const uint4 *>(
                                       src + 64 * mw_fblk<S, PART>(i) + 16 * q))
                                 : make_uint4(0, 0, 0, 0);
        } else {
            const int c = mw_fhalf();
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int b = mw_fblk<S, PART>(i);
#pragma unroll
                for (int h = 0; h < 2; h++)
                    r.v[2 * i + h] =
                        rw >= 0 ? __ldg(reinterpret_cast<const uint4 *>(src + 64 * b + 32 * c) + h)
                                : make_uint4(0, 0, 0, 0);
            }
        }
#pragma unroll
        for (int k = 0; k < 2; k++)
            r.scl[k] = rw >= 0 ? __ldg(reinterpret_cast<const float *>(src + ML_DV) +
                                       (mw_fblk<S, PART>(2 * k) >> 1))
                               : 0.f;
        /* part 1: the thread's k_pe chunks (XO: 2 q, 2 q + 1; else 4 c .. 4 c + 3) */
        constexpr int NPE = CL ? 2 : 4;
        const int pe0 = CL ? 2 * fquarter() : 4 * mw_fhalf();
        if (PART == 1)
#pragma unroll
            for (int k = 0; k < NPE; k++)
                r.pe[k] = rw >= 0
                              ? __ldg(reinterpret_cast<const uint4 *>(src + ML_DV + 16) + pe0 + k)
                              : make_uint4(0, 0, 0, 0);
        if (PART == 0) {
            if constexpr (CL) { /* no load here waits for another */
                rown[S] = ms_row(a, mi.bt_row, pn[S], mi.s);
                pn[S] = pos(kt + 4 * MW_BN + fkey());
            } else {
                rown[S] = key_row(a, kt + 2 * MW_BN);
            }
        }
    }
    /* 8 bf16 k_pe values (raw bits) in the q dtype. */
    static __device__ __forceinline__ uint4 pe8(uint4 pe)
    {
        const uint32_t bw[4] = {pe.x, pe.y, pe.z, pe.w};
        uint32_t w[4];
#pragma unroll
        for (int e = 0; e < 4; e++)
            w[e] = Ty::pack(__uint_as_float(bw[e] << 16), __uint_as_float(bw[e] & 0xffff0000u));
        return make_uint4(w[0], w[1], w[2], w[3]);
    }
    /* Part PART of tile kt into stage S (ring slot st, shared address
     * stage): the converted chunks (XO: also into the other CTA's ring at
     * the same offsets by st.async, completing on its copy of `full`, the
     * part's "full" mbarrier); part 0 first sets the keys' flags. */
    template <int S, int PART>
    __device__ __forceinline__ void put(const args &a, int32_t, const raw &r, uint32_t stage, int st,
                                        uint32_t full)
    {
        if constexpr (CL) {
            const uint32_t peer = mw_peer();
            const uint32_t rstage = kva__mapa(stage, peer), rfull = kva__mapa(full, peer);
            const int key = fkey(), q = fquarter();
            if (PART == 0 && q == 0) {
                const int ok = row[S] >= 0;
                ms_ok()[st][key] = ok;
                kva__st_async4(kva__mapa(kva__smem_u32(&ms_ok()[st][key]), peer), (uint32_t)ok,
                               rfull);
            }
#pragma unroll
            for (int i = 0; i < MW_FNB(PART); i++) {
                const int b = mw_fblk<S, PART>(i);
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    uint4 w; /* i < 4: a value block (b < 8); i == 4: block 8, k_pe */
                    if (i < 4)
                        w = cvt8(h ? make_uint2(r.v[i].z, r.v[i].w) : make_uint2(r.v[i].x, r.v[i].y),
                                 r.scl[i >> 1]);
                    else
                        w = pe8(r.pe[h]);
                    const uint32_t off =
                        (uint32_t)(b * MW_BN * 128 + key * 128 + (((2 * q + h) ^ (key & 7)) << 4));
                    mw_st16(stage + off, w);
                    kva__st_async16(rstage + off, w, rfull);
                }
            }
            /* the rows of the stage's next tile into L2 (this CTA's keys) */
            if (PART == 1 && rown[S] >= 0 && q == 0)
                mw_prefetch_l2(a.rows + rown[S] * sp_ds_mla::ROW, sp_ds_mla::ROW);
            return;
        }
        if (PART == 0 && mw_fhalf() == 0)
            ms_ok()[st][mw_fkey()] = row[S] >= 0;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int b = mw_fblk<S, PART>(i);
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const uint4 w = r.v[2 * i + h];
                mw_st16(mw_fill_at(stage, b, 2 * h), cvt8(make_uint2(w.x, w.y), r.scl[i >> 1]));
                mw_st16(mw_fill_at(stage, b, 2 * h + 1), cvt8(make_uint2(w.z, w.w), r.scl[i >> 1]));
            }
        }
        if (PART == 1) {
#pragma unroll
            for (int k = 0; k < 4; k++)
                mw_st16(mw_fill_at(stage, 8, k), pe8(r.pe[k]));
            /* the rows of the stage's next tile into L2 */
            if (rown[S] >= 0 && mw_fhalf() == 0)
                mw_prefetch_l2(a.rows + rown[S] * sp_ds_mla::ROW, sp_ds_mla::ROW);
        }
    }
    /* (scaled here: the factor left to the body is 1) */
    __device__ __forceinline__ float logits(float (&sc)[8][4], const args &, float scale_log2,
                                            int32_t, int t4, int st) const
    {
        const int *ok = ms_ok()[st];
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                sc[j][e] = ok[j * 8 + 2 * t4 + (e & 1)] ? sc[j][e] * scale_log2 : -INFINITY;
        return 1.f;
    }
    __device__ __forceinline__ void finish(const args &a, float (*s_sum)[64], int wg, int r0,
                                           int t4, float l_run[2], const float m_run[2],
                                           const float (*o)[4]) const
    {
        /* Ends with a barrier: s_sum, Q, the ring and the flags are rewritten by the
         * next item. */
        ml_finish<32, 2, Ty>(sp_dst{a, mi.t, mi.h0, mi.nrows, mi.split}, s_sum, wg, r0, wg * 256,
                             t4, l_run, m_run, o);
    }
};
#else
template <typename Ty, bool FP8, bool CL = false> struct ms_sparse { /* other passes: empty */
    typedef sp_args args;
    static constexpr int SCHED = FP8 ? MW_SCHED_ALT_PROD : MW_SCHED_SPLIT; /* its launch bound */
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
    /* fp8_ds_mla rows with an even number of head tiles (H 65 .. 128: two):
     * the cluster of two, on an even grid (the items come in pairs). */
    const int xo = fp8 && a->tiles % 2 == 0;
    const ms_kernel_fn fn = ms_pick(q_dtype, fp8, xo);
    if (!fn || !kva__cuda_prefill_wgmma_ready())
        return kva__fail(KVA_STATUS_UNSUPPORTED,
                         "kva_mla_sparse_run: mla_decode_wgmma_sm90 needs an sm_90a build and "
                         "device and f16/bf16 q (got %s)",
                         kva_dtype_name(q_dtype));
    const int smem = fp8 ? MW_SMEM_PROD : MW_SMEM;
    KVA_CUDA_TRY(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    if (!xo) {
        fn<<<grid, fp8 ? MW_NT_PROD : ML_NT, (size_t)smem, (cudaStream_t)stream>>>(*a);
        KVA_CUDA_LAUNCHED("mla_sparse wgmma kernel");
        return KVA_STATUS_OK;
    }
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = 2;
    at[0].val.clusterDim.y = 1;
    at[0].val.clusterDim.z = 1;
    cfg.blockDim = dim3(MW_NT_PROD);
    cfg.dynamicSmemBytes = (size_t)smem;
    cfg.stream = (cudaStream_t)stream;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    /* An even grid (the caller's is at least the 2 items of a pair), at
     * most the clusters resident at once: a persistent grid, so a cluster
     * that waits for a free pair of SMs would only add a wave (without the
     * answer, the grid as it is: the items need no co-residency). */
    int n = grid > 2 ? grid & ~1 : 2, clusters = 0;
    cfg.gridDim = dim3((unsigned)n);
    if (cudaOccupancyMaxActiveClusters(&clusters, fn, &cfg) != cudaSuccess)
        (void)cudaGetLastError(); /* the query's error is not the launch's */
    else if (clusters > 0 && n > 2 * clusters)
        n = 2 * clusters;
    cfg.gridDim = dim3((unsigned)n);
    KVA_CUDA_TRY(cudaLaunchKernelEx(&cfg, fn, *a));
    KVA_CUDA_LAUNCHED("mla_sparse wgmma kernel (cluster of two)");
    return KVA_STATUS_OK;
}
