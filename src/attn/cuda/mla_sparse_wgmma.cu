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
 *     this backend's separate mode read them. Each row is converted once
 *     per head tile (H 128: twice per token).
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

/* The sparse work policy of mla_wgmma_kernel (interface: mla_wgmma_body.cuh).
 * 16-bit rows: thread tid copies key tid / 4 of every tile (part tid % 4);
 * fp8_ds_mla: the fill thread (2 per key) converts its half of its key. */
template <typename Ty, bool FP8> struct ms_sparse {
    typedef sp_args args;
    static constexpr int SCHED = FP8 ? MW_SCHED_ALT_PROD : MW_SCHED_SPLIT;
    sp_item mi;
    bool skip;
    int32_t k0, kend;
    int64_t row1;            /* 16-bit: the thread's key row in the next tile */
    int32_t pnext;           /* its entry's position in the tile after that */
    int64_t row[2], rown[2]; /* fp8, producer: the fill thread's key row in stage s's tile being
                                filled, in its next */

    static __device__ __forceinline__ int32_t items(const args &a)
    {
        return a.nt * a.tiles * a.nsplit;
    }
    __device__ __forceinline__ int32_t pos(int32_t j) const
    {
        return j < kend ? __ldg(mi.idx_row + j) : -1;
    }
    /* fp8_ds_mla: the fill thread's cache row in tile kb (-1: unused entry
     * or past kend). */
    __device__ __forceinline__ int64_t key_row(const args &a, int32_t kb) const
    {
        const int32_t j = kb + mw_fkey();
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
     * .. + 31 of block b), their 2 tile scales and, in part 1, block 8 (k_pe
     * values 32 c .. 32 c + 31) into registers, before the stage part is
     * free; in part 0 it then looks up the row of the stage's next tile (kt
     * + 128). put converts the codes (code * scale) into the stage once it
     * is free, and in part 1 prefetches the next tile's rows into L2. */
    __device__ __forceinline__ void stage_q(const args &a, unsigned char *q_gen) const
    {
        sp_stage_q<MW_M, MW_M, typename Ty::elem>(a, mi, q_gen);
    }
    struct raw {
        uint4 v[8];   /* value block i of the part: v[2 i], v[2 i + 1] */
        uint4 pe[4];  /* part 1: the thread's k_pe chunks */
        float scl[2]; /* scale of blocks 0, 1 and of blocks 2, 3 of the part */
    };
    template <int S, int PART>
    __device__ __forceinline__ void fetch(const args &a, int32_t kt, raw &r)
    {
        if (PART == 0)
            row[S] = rown[S];
        const int64_t rw = row[S];
        const unsigned char *src = a.rows + (rw >= 0 ? rw : 0) * sp_ds_mla::ROW;
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
#pragma unroll
        for (int k = 0; k < 2; k++)
            r.scl[k] = rw >= 0 ? __ldg(reinterpret_cast<const float *>(src + ML_DV) +
                                       (mw_fblk<S, PART>(2 * k) >> 1))
                               : 0.f;
        if (PART == 1)
#pragma unroll
            for (int k = 0; k < 4; k++)
                r.pe[k] = rw >= 0
                              ? __ldg(reinterpret_cast<const uint4 *>(src + ML_DV + 16) + 4 * c + k)
                              : make_uint4(0, 0, 0, 0);
        if (PART == 0)
            rown[S] = key_row(a, kt + 2 * MW_BN);
    }
    template <int S, int PART>
    __device__ __forceinline__ void put(const args &a, int32_t, const raw &r, uint32_t stage,
                                        int st)
    {
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
            for (int k = 0; k < 4; k++) {
                const uint32_t bw[4] = {r.pe[k].x, r.pe[k].y, r.pe[k].z, r.pe[k].w};
                uint32_t w[4];
#pragma unroll
                for (int e = 0; e < 4; e++)
                    w[e] = Ty::pack(__uint_as_float(bw[e] << 16),
                                    __uint_as_float(bw[e] & 0xffff0000u));
                mw_st16(mw_fill_at(stage, 8, k), make_uint4(w[0], w[1], w[2], w[3]));
            }
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
template <typename Ty, bool FP8> struct ms_sparse { /* other passes: the kernel is empty */
    typedef sp_args args;
    static constexpr int SCHED = FP8 ? MW_SCHED_ALT_PROD : MW_SCHED_SPLIT; /* its launch bound */
};
#endif

typedef void (*ms_kernel_fn)(sp_args);

static ms_kernel_fn ms_pick(kva_dtype dt, int fp8)
{
    if (dt == KVA_DTYPE_BF16)
        return fp8 ? mla_wgmma_kernel<kva__mma_bf16, ms_sparse<kva__mma_bf16, true>>
                   : mla_wgmma_kernel<kva__mma_bf16, ms_sparse<kva__mma_bf16, false>>;
    if (dt == KVA_DTYPE_F16)
        return fp8 ? mla_wgmma_kernel<kva__mma_f16, ms_sparse<kva__mma_f16, true>>
                   : mla_wgmma_kernel<kva__mma_f16, ms_sparse<kva__mma_f16, false>>;
    return NULL;
}

kva_status kva__cuda_sparse_wgmma_launch(const sp_args *a, kva_dtype q_dtype, int fp8, int grid,
                                         void *stream)
{
    const ms_kernel_fn fn = ms_pick(q_dtype, fp8);
    if (!fn || !kva__cuda_prefill_wgmma_ready())
        return kva__fail(KVA_STATUS_UNSUPPORTED,
                         "kva_mla_sparse_run: mla_decode_wgmma_sm90 needs an sm_90a build and "
                         "device and f16/bf16 q (got %s)",
                         kva_dtype_name(q_dtype));
    const int smem = fp8 ? MW_SMEM_PROD : MW_SMEM;
    KVA_CUDA_TRY(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    fn<<<grid, fp8 ? MW_NT_PROD : ML_NT, (size_t)smem, (cudaStream_t)stream>>>(*a);
    KVA_CUDA_LAUNCHED("mla_sparse wgmma kernel");
    return KVA_STATUS_OK;
}
