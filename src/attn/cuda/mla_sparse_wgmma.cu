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
 *     by cp.async into the ring like the dense decode's tiles, the row of
 *     each thread's key looked up one tile ahead;
 *   fp8_ds_mla rows (656 bytes): each row is prefetched into L2 two tiles
 *     ahead (one bulk prefetch), then, while the previous tile's P V runs,
 *     loaded by its 4 threads (thread c: c_kv tile c's 128 codes and scale,
 *     k_pe values 16 c .. 16 c + 15) into registers and written into the
 *     ring as q-dtype values code * scale (fp32 product, rounded once), as
 *     FlashMLA's sparse kernels and this backend's separate mode read them.
 *     Each row is converted once per head tile (H 128: twice per token).
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
 * Thread tid copies or converts key tid / 4 of every tile (part tid % 4). */
template <typename Ty, bool FP8> struct ms_sparse {
    typedef sp_args args;
    sp_item mi;
    bool skip;
    int32_t k0, kend;
    int64_t row1, row2; /* the thread's key row in the next tile and (fp8) the one after */
    int32_t pnext;      /* its entry's position in the tile after those */

    static __device__ __forceinline__ int32_t items(const args &a)
    {
        return a.nt * a.tiles * a.nsplit;
    }
    __device__ __forceinline__ int32_t pos(int32_t j) const
    {
        return j < kend ? __ldg(mi.idx_row + j) : -1;
    }
    /* fp8_ds_mla: row (or zeros for -1) as key `key` of the tile at stage,
     * part c = tid % 4, in the q dtype. */
    __device__ __forceinline__ void convert(const args &a, int64_t row, uint32_t stage) const
    {
        const int key = threadIdx.x >> 2, c = threadIdx.x & 3;
        uint4 cw[8], pe[2];
        float scl = 0.f;
        if (row >= 0) {
            const unsigned char *src = a.rows + row * sp_ds_mla::ROW;
#pragma unroll
            for (int i = 0; i < 8; i++)
                cw[i] = __ldg(reinterpret_cast<const uint4 *>(src + 128 * c) + i);
            scl = __ldg(reinterpret_cast<const float *>(src + ML_DV) + c);
#pragma unroll
            for (int i = 0; i < 2; i++)
                pe[i] = __ldg(reinterpret_cast<const uint4 *>(src + ML_DV + 16 + 32 * c) + i);
        } else {
#pragma unroll
            for (int i = 0; i < 8; i++)
                cw[i] = make_uint4(0, 0, 0, 0);
            pe[0] = pe[1] = make_uint4(0, 0, 0, 0);
        }
        const uint32_t base = stage + (uint32_t)(key * 128);
        /* c_kv tile c: chunks 16 c + k (8 codes each) in column blocks 2 c, 2 c + 1. */
#pragma unroll
        for (int k = 0; k < 16; k++) {
            const uint32_t lo = k & 1 ? cw[k >> 1].z : cw[k >> 1].x;
            const uint32_t hi = k & 1 ? cw[k >> 1].w : cw[k >> 1].y;
            uint32_t w[4];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const uint32_t word = i < 2 ? lo : hi;
                const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(
                    (__nv_fp8x2_storage_t)((word >> (16 * (i & 1))) & 0xffffu), __NV_E4M3);
                const float2 f = __half22float2(__half2(h));
                w[i] = Ty::pack(f.x * scl, f.y * scl);
            }
            const int ch = 16 * c + k;
            mw_st16(base + (uint32_t)((ch >> 3) * MW_BN * 128 + (((ch & 7) ^ (key & 7)) << 4)),
                    make_uint4(w[0], w[1], w[2], w[3]));
        }
        /* k_pe values 16 c .. 16 c + 15: chunks 64 + 2 c + i, column block 8. */
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const uint32_t bw[4] = {pe[i].x, pe[i].y, pe[i].z, pe[i].w};
            uint32_t w[4];
#pragma unroll
            for (int e = 0; e < 4; e++)
                w[e] = Ty::pack(__uint_as_float(bw[e] << 16), __uint_as_float(bw[e] & 0xffff0000u));
            const int ch = 2 * c + i;
            mw_st16(base + (uint32_t)(8 * MW_BN * 128 + ((ch ^ (key & 7)) << 4)),
                    make_uint4(w[0], w[1], w[2], w[3]));
        }
    }
    /* Item it: token, head tile, split; the first tile in stage 0, Q. */
    __device__ __forceinline__ ms_sparse(const args &a, int32_t it, uint32_t sK,
                                         unsigned char *q_gen, int)
    {
        mi = sp_item_load<MW_M>(a, it);
        skip = mi.skip;
        if (skip)
            return;
        k0 = mi.kbeg;
        kend = mi.kend;

        const int key = threadIdx.x >> 2;
        const int64_t first = ms_row(a, mi.bt_row, pos(k0 + key), mi.s);
        if (FP8) {
            row1 = ms_row(a, mi.bt_row, pos(k0 + MW_BN + key), mi.s);
            if (row1 >= 0 && (threadIdx.x & 3) == 0)
                mw_prefetch_l2(a.rows + row1 * sp_ds_mla::ROW, sp_ds_mla::ROW);
            if (k0 < kend)
                land_row(a, first, sK, 0);
        } else {
            if (k0 < kend)
                issue_row(a, first, sK, 0);
            row1 = ms_row(a, mi.bt_row, pos(k0 + MW_BN + key), mi.s);
        }
        row2 = -1;
        pnext = pos(k0 + 2 * MW_BN + key);
        kva__cp_async_commit();
        sp_stage_q<MW_M, MW_M, typename Ty::elem>(a, mi, q_gen);
    }
    /* 16-bit rows: the copies of `row` as the thread's key (cp.async). */
    __device__ __forceinline__ void issue_row(const args &a, int64_t row, uint32_t stage,
                                              int st) const
    {
        ml_issue_row_at<MW_BN, MW_BN>(a.rows, row, stage);
        if ((threadIdx.x & 3) == 0)
            ms_ok()[st][threadIdx.x >> 2] = row >= 0;
    }
    /* fp8_ds_mla: `row` converted into the thread's part of its key. */
    __device__ __forceinline__ void land_row(const args &a, int64_t row, uint32_t stage,
                                             int st) const
    {
        convert(a, row, stage);
        if ((threadIdx.x & 3) == 0)
            ms_ok()[st][threadIdx.x >> 2] = row >= 0;
    }
    __device__ __forceinline__ void next(const args &a, int32_t kb, uint32_t stage, int st)
    {
        if (kb >= kend)
            return;
        const int key = threadIdx.x >> 2;
        if (FP8) { /* the tile after kb into L2 (its rows are loaded during kb - 64's P V) */
            row2 = ms_row(a, mi.bt_row, pnext, mi.s);
            if (row2 >= 0 && (threadIdx.x & 3) == 0)
                mw_prefetch_l2(a.rows + row2 * sp_ds_mla::ROW, sp_ds_mla::ROW);
        } else {
            issue_row(a, row1, stage, st);
            row1 = ms_row(a, mi.bt_row, pnext, mi.s);
        }
        pnext = pos(kb + 2 * MW_BN + key);
    }
    __device__ __forceinline__ void land(const args &a, int32_t kb, uint32_t stage, int st)
    {
        if (!FP8 || kb >= kend)
            return;
        land_row(a, row1, stage, st);
        row1 = row2;
    }
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
    KVA_CUDA_TRY(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, MW_SMEM));
    fn<<<grid, ML_NT, (size_t)MW_SMEM, (cudaStream_t)stream>>>(*a);
    KVA_CUDA_LAUNCHED("mla_sparse wgmma kernel");
    return KVA_STATUS_OK;
}
