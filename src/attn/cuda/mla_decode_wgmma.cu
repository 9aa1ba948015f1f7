/*
 * mla_decode_wgmma.cu - absorbed MLA decode on sm_90a warpgroup MMA
 * ("mla_decode_wgmma_sm90"): the plan's work items of up to 64 rows over a
 * latent paged cache (D 576 = c_kv 512 | k_pe 64, values = the first 512
 * columns), the same math and item format as mla_decode_mma.cu, which keeps
 * the items of 16 and 32 rows (H * q_len <= 32: no padding of small head
 * counts to 64) and every item on sm_80. The body is mla_wgmma_body.cuh's
 * (shared with the sparse MLA); this file is its dense work policy: an item
 * of the uploaded plan, key tiles of the request's contiguous positions
 * gathered by cp.async through the block table, the plan's masks, and the
 * split partials or outputs of ml_finish.
 *
 * The policy's FP8 parameter: an FP8 E4M3 latent cache (one k_scale,
 * mla_decode_common.cuh). Its rows are loaded by the filling warpgroup of
 * the body's alternating-tile schedule (MW_SCHED_ALT; 2 threads per key)
 * and converted exactly into the 16-bit tile, as the sparse policy does
 * with fp8_ds_mla rows: each warpgroup converts the rows of its own tiles
 * in the body's two fill parts, the rows of its next tile prefetched into
 * L2 a pair of tiles ahead; the scale multiplies the logits' scale and the
 * output rows.
 *
 * The policy's TMA parameter: a 16-bit latent cache whose block size is a
 * multiple of 64 (a 64-key tile then lies in one block) under a plan
 * without a window or chunked mask (every item starts on a tile boundary):
 * the body's alternating-tile schedule with TMA copies (MW_SCHED_ALT_TMA).
 * Each fill part of a tile is 4 or 5 [64 rows, 64 columns] boxes of a 2-D
 * tensor map over the cache's NB * B rows, issued by one thread and landing
 * on the part's mbarrier; a tile's rows past the item are whole cache rows
 * (stale or poison) that the body zeroes. Other 16-bit caches keep the
 * split-key schedule (MW_SCHED_SPLIT, cp.async gathers of the rows).
 */
extern "C" {
#include "cuda_backend.h"
}
#include "cuda_check.h"
#include "mla_wgmma_body.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <type_traits>
#include <cudaTypedefs.h>

/* The kernel argument of the TMA policy: the attention arguments and the
 * tensor map of the 16-bit latent cache as [NB * B, 576] with [64, 64]
 * boxes (128-byte swizzle: one box is one column block of a ring tile). */
struct mw_targs : kva__cuda_attn_args {
    CUtensorMap tm;
};

#ifdef KVA_MLA_WGMMA_BODY
/* The dense work policy of mla_wgmma_kernel (interface: mla_wgmma_body.cuh);
 * FP8: the cache holds FP8 E4M3 codes (above); TMA (16-bit caches whose
 * block size is a multiple of 64, items starting on a tile boundary): the
 * alternating-tile schedule with each tile's column blocks copied as TMA
 * boxes (MW_SCHED_ALT_TMA). */
template <typename Ty, bool FP8, bool TMA = false> struct mw_dense {
    typedef typename std::conditional<TMA, mw_targs, kva__cuda_attn_args>::type args;
    static constexpr int SCHED = FP8 ? MW_SCHED_ALT : TMA ? MW_SCHED_ALT_TMA : MW_SCHED_SPLIT;
    ml_item mi;
    bool skip;
    int32_t k0, kend;
    int32_t lo[2], hi[2], pos[2], lo_all, hi_all;
    float slope[2];
    int64_t row, rown; /* FP8: the fill thread's key row in the tile being filled, in the next */

    static __device__ __forceinline__ int32_t items(const args &a)
    {
        return a.meta.hdr[KVA_CUDA_HDR_ITEMS];
    }
    /* FP8: the fill thread's cache row in tile kb (-1 past kend). */
    __device__ __forceinline__ int64_t key_row(const args &a, int32_t kb) const
    {
        return ml_row<MW_BN, MW_WT>(a, mi.bt_row, kb, kend, threadIdx.x & (MW_WT - 1));
    }
    /* Item it: its Q copies (ml_stage_q's cp.async, a group of their own),
     * behind the first tile's copies (16-bit split-key, both committed) or
     * ahead of the first tile (FP8: then the row of the fill thread's first
     * tile; TMA: the body's mw_first, after this), so that Q lands while the
     * rest of the item's start runs; the mask bounds. */
    __device__ __forceinline__ mw_dense(const args &a, int32_t it, uint32_t sK,
                                        unsigned char *q_gen, int r0)
    {
        mi = ml_item_load(a, it, a.meta.hdr[KVA_CUDA_HDR_BT_STRIDE]);
        skip = false;
        k0 = mi.w.k0;
        kend = mi.w.k1;
        if constexpr (!FP8 && !TMA) {
            if (k0 < kend)
                ml_issue<MW_BN, MW_BN>(a, mi.bt_row, k0, kend, sK);
            kva__cp_async_commit();
        }
        ml_stage_q<MW_M, MW_M, typename Ty::elem, true>(a, mi.w, mi.nrows, mi.qs, q_gen);
        kva__cp_async_commit();
        if constexpr (FP8)
            rown = key_row(a, k0 + (threadIdx.x >= MW_WT ? MW_BN : 0));
        kva__dmma_rows<true>(a, mi.w, mi.nrows, mi.s, mi.q_len, r0, lo, hi, pos, slope, lo_all,
                             hi_all);
    }
    /* 16-bit (MW_SCHED_SPLIT): the copies of tile kb; nothing lands later. */
    __device__ __forceinline__ void next(const args &a, int32_t kb, uint32_t stage, int)
    {
        if (kb < kend)
            ml_issue<MW_BN, MW_BN>(a, mi.bt_row, kb, kend, stage);
    }
    __device__ __forceinline__ void land(const args &, int32_t, uint32_t, int) {}
    __device__ __forceinline__ void logits(float (&sc)[4][4], const args &a, float scale_log2,
                                           int32_t kb, int wg, int t4, int)
    {
        kva__dmma_logits<32>(sc, a, scale_log2, kb + wg * 32, t4, lo_all, hi_all, lo, hi, pos,
                             slope);
    }
    /* FP8 and TMA (MW_SCHED_ALT, MW_SCHED_ALT_TMA): the thread's Q copies,
     * issued by the constructor, landed (the body's fence and CTA barrier
     * follow; the FP8 fills' cp.async groups are empty). FP8: part PART of
     * tile kb loaded and converted exactly (thread half c: codes 64 b + 32 c
     * .. + 31 of each block b); with part 0 the row of the warpgroup's next
     * tile is looked up and prefetched into L2 (a pair of tiles ahead). */
    __device__ __forceinline__ void stage_q(const args &, unsigned char *) const
    {
        kva__cp_async_wait<0>();
    }
    template <int WG, int PART>
    __device__ __forceinline__ void fill(const args &a, int32_t kb, uint32_t stage, int)
    {
        if (PART == 0) {
            row = rown;
            rown = key_row(a, kb + 2 * MW_BN);
            if (rown >= 0 && mw_fhalf() == 0)
                mw_prefetch_l2((const unsigned char *)a.k + rown * ML_D, ML_D);
        }
        const uint4 *src = reinterpret_cast<const uint4 *>((const unsigned char *)a.k +
                                                           (row >= 0 ? row : 0) * ML_D) +
                           2 * mw_fhalf();
#pragma unroll
        for (int i = 0; i < MW_FNB(PART); i++) {
            const int b = mw_fblk<WG, PART>(i);
            uint4 raw[2];
#pragma unroll
            for (int h = 0; h < 2; h++)
                raw[h] = row >= 0 ? __ldg(src + 4 * b + h) : make_uint4(0, 0, 0, 0);
#pragma unroll
            for (int h = 0; h < 2; h++) {
                mw_st16(mw_fill_at(stage, b, 2 * h),
                        kva__fp8x8_as<Ty>(make_uint2(raw[h].x, raw[h].y)));
                mw_st16(mw_fill_at(stage, b, 2 * h + 1),
                        kva__fp8x8_as<Ty>(make_uint2(raw[h].z, raw[h].w)));
            }
        }
    }
    /* The alternating tiles' logits: a tile every row sees whole, without
     * ALiBi or soft-cap, stays unscaled (the body applies the returned
     * factor); otherwise scaled and masked here (factor 1). */
    __device__ __forceinline__ float logits(float (&sc)[8][4], const args &a, float scale_log2,
                                            int32_t kb, int t4, int)
    {
        const float s2 = FP8 ? scale_log2 * a.kv_scale : scale_log2;
        if (!(a.softcap > 0.f) && !a.has_alibi && kb >= lo_all && kb + MW_BN <= hi_all && s2 > 0.f)
            return s2;
        kva__dmma_logits<64>(sc, a, s2, kb, t4, lo_all, hi_all, lo, hi, pos, slope);
        return 1.f;
    }
    /* TMA (one thread): the cache row of tile kb (< kend; a tile lies
     * inside one cache block; a shift for power-of-two blocks). */
    __device__ __forceinline__ int32_t trow(const args &a, int32_t kb) const
    {
        const int32_t blk = (a.B & (a.B - 1)) ? kb / a.B : kb >> (__ffs(a.B) - 1);
        return __ldg(mi.bt_row + blk) * a.B + (kb - blk * a.B);
    }
    /* TMA (one thread): part PART of the tile at cache row `row` into stage
     * S's ring slot at `stage`, the column blocks mw_fblk<S, PART> as
     * [64, 64] boxes completing on bar. */
    template <int S, int PART>
    __device__ __forceinline__ void tfill(const args &a, int32_t row, uint32_t stage,
                                          uint32_t bar) const
    {
        kva__mbar_expect_tx(bar, MW_FNB(PART) * MW_BN * 128);
#pragma unroll
        for (int i = 0; i < MW_FNB(PART); i++) {
            const int b = mw_fblk<S, PART>(i);
            kva__tma_load2(stage + (uint32_t)(b * MW_BN * 128), &a.tm, 64 * b, row, bar);
        }
    }
    __device__ __forceinline__ void finish(const args &a, float (*s_sum)[64], int wg, int r0,
                                           int t4, float l_run[2], const float m_run[2],
                                           const float (*o)[4])
    {
        ml_finish<32, 2, Ty>(ml_dst{a, mi.w, mi.nrows, mi.qs, FP8 ? a.kv_scale : 1.f}, s_sum, wg,
                             r0, wg * 256, t4, l_run, m_run, o);
    }
};
#else
template <typename Ty, bool FP8, bool TMA = false>
struct mw_dense { /* host and non-sm_90a passes: empty kernel */
    typedef typename std::conditional<TMA, mw_targs, kva__cuda_attn_args>::type args;
};
#endif

/* ---- host side ---- */

/* The kernel for q dtype dt over a 16-bit or (fp8) an FP8 E4M3 latent cache. */
static ml_kernel_fn mw_pick(kva_dtype dt, int fp8)
{
    if (dt == KVA_DTYPE_BF16)
        return fp8 ? mla_wgmma_kernel<kva__mma_bf16, mw_dense<kva__mma_bf16, true>>
                   : mla_wgmma_kernel<kva__mma_bf16, mw_dense<kva__mma_bf16, false>>;
    if (dt == KVA_DTYPE_F16)
        return fp8 ? mla_wgmma_kernel<kva__mma_f16, mw_dense<kva__mma_f16, true>>
                   : mla_wgmma_kernel<kva__mma_f16, mw_dense<kva__mma_f16, false>>;
    return NULL;
}

/* The alternating-tile TMA kernel (16-bit latent caches). */
typedef void (*mw_tma_fn)(mw_targs);
static mw_tma_fn mw_pick_tma(kva_dtype dt)
{
    if (dt == KVA_DTYPE_BF16)
        return mla_wgmma_kernel<kva__mma_bf16, mw_dense<kva__mma_bf16, false, true>>;
    if (dt == KVA_DTYPE_F16)
        return mla_wgmma_kernel<kva__mma_f16, mw_dense<kva__mma_f16, false, true>>;
    return NULL;
}

/* The tensor map of a's 16-bit latent cache ([NB * B, 576], [64, 64] boxes,
 * 128-byte swizzle) into t->tm; 0 where the TMA kernel cannot run the plan:
 * the block size is not a multiple of 64 (a tile would span blocks), a
 * window or chunked mask may start an item inside a tile, NB is unknown or
 * the driver refuses. */
static int mw_tma_args(const kva__cuda_attn_args *a, kva_dtype dt, mw_targs *t)
{
    if (a->kv_fp8 || a->B % 64 != 0 || a->NB <= 0 || a->window_left >= 0 || a->chunk > 0 ||
        (int64_t)a->NB * a->B > INT32_MAX || ((uintptr_t)a->k & 127u) != 0)
        return 0;
    void *fn = NULL;
    cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault,
                                         &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess || !fn) {
        (void)cudaGetLastError();
        return 0;
    }
    memset(t, 0, sizeof *t);
    memcpy(static_cast<kva__cuda_attn_args *>(t), a, sizeof *a);
    const cuuint64_t dims[2] = {ML_D, (cuuint64_t)a->NB * (cuuint64_t)a->B};
    const cuuint64_t strides[1] = {ML_D * 2};
    const cuuint32_t box[2] = {64, MW_BN}, estr[2] = {1, 1};
    const CUresult r = ((PFN_cuTensorMapEncodeTiled_v12000)fn)(
        &t->tm,
        dt == KVA_DTYPE_BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
        2, const_cast<void *>(a->k), dims, strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE,
        CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    return r == CUDA_SUCCESS;
}

/* Launches fn over `grid` persistent CTAs (for both argument types). */
template <typename A>
static kva_status mw_launch(void (*fn)(A), int smem, const A &args, int grid, void *stream)
{
    KVA_CUDA_TRY(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)grid);
    cfg.blockDim = dim3(ML_NT);
    cfg.dynamicSmemBytes = (size_t)smem;
    cfg.stream = (cudaStream_t)stream;
    KVA_CUDA_TRY(cudaLaunchKernelEx(&cfg, fn, args));
    KVA_CUDA_LAUNCHED("mla_decode kernel");
    return KVA_STATUS_OK;
}

extern "C" int kva__cuda_mla_wgmma_ctas_per_sm(kva_dtype dtype)
{
    return kva__cuda_prefill_wgmma_ready() ? ml_ctas_per_sm(mw_pick(dtype, 0), MW_SMEM) : 0;
}

extern "C" kva_status kva__cuda_mla_wgmma_launch(const kva__cuda_attn_args *a, kva_dtype dtype,
                                                 int grid, void *stream)
{
    const ml_kernel_fn fn = mw_pick(dtype, a->kv_fp8);
    if (!fn || !kva__cuda_mla_decode_supported(a->D, a->Dv, dtype) || a->Hkv != 1 || a->ragged ||
        !kva__cuda_prefill_wgmma_ready())
        return kva__fail(KVA_STATUS_UNSUPPORTED,
                         "kva_attention_run: mla_decode_wgmma_sm90 needs an sm_90a build and "
                         "device, D = 576, Dv = 512, Hkv = 1, a paged f16/bf16 or fp8_e4m3 latent "
                         "cache with f16/bf16 q (got "
                         "D = %d, Dv = %d, Hkv = %d, dtype = %s)",
                         (int)a->D, (int)a->Dv, (int)a->Hkv, kva_dtype_name(dtype));
    /* 16-bit caches: the TMA kernel where it can run the plan. */
    mw_targs t;
    const mw_tma_fn tf = mw_pick_tma(dtype);
    if (tf && mw_tma_args(a, dtype, &t))
        return mw_launch(tf, MW_SMEM_TMA, t, grid, stream);
    return mw_launch(fn, a->kv_fp8 ? MW_SMEM_ALT : MW_SMEM, *a, grid, stream);
}
