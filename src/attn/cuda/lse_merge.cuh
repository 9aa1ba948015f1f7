/*
 * lse_merge.cuh - the one LSE merge of partial attention states that every
 * CUDA merge runs, one warp per row: the split merge (split_merge.cu's
 * split_merge_kernel and the tensor-core decode's last-CTA merge,
 * decode_mma_kernel.cuh), kva_merge_states, kva_merge_states_n, the cascade
 * merge (split_merge.cu's merge_rows_kernel) and the NCCL LSA combine
 * (src/comm/dcp_nccl_lsa.cu, whose parts are the peers' windows).
 */
#ifndef KVA_CUDA_LSE_MERGE_CUH
#define KVA_CUDA_LSE_MERGE_CUH

extern "C" {
#include "cuda_backend.h"
}
#include "elem_io.cuh"

#include <math.h>
#include <stdint.h>
#include <string.h>
#include <type_traits>

/*
 * The LSE-weighted mean of one row's parts, computed by the 32 lanes of a
 * warp together (all must call it, with the same row): R gives r.parts,
 * r.lse(p) (natural log) and r.val(p, d) (channel d of part p's out row, as a
 * float), and sink is the lse of a part without value (-inf: none). Lane l
 * gets channels d0 + l + 32 i (i < NV, below Dv) in o[i]; every lane gets the
 * row's lse in lv. As the reference: the values of a part of weight 0 do not
 * count (they may be NaN; every part's row must be readable memory), all -inf
 * gives 0 and -inf, a NaN lse makes the row NaN (out and lse).
 *
 * The lanes share the parts' lses (lane l reads parts l, l + 32, ...: one
 * round of loads and a shuffle reduction instead of a chain over the parts)
 * and each lane's weight goes to the others by shuffle; the sum over the
 * parts' values is branch-free (a select, not a skip, drops a weight-0 part's
 * values), so several parts' loads are in flight at once.
 */
template <int NV, typename R>
static __device__ __forceinline__ void kva__lse_merge(const R &r, float sink, int32_t d0,
                                                      int32_t Dv, float o[NV], float &lv)
{
    const int lane = threadIdx.x & 31;
    float M = sink;
    bool nan = false;
    for (int32_t p = lane; p < r.parts; p += 32) {
        const float l = r.lse(p);
        nan |= l != l;
        M = fmaxf(M, l);
    }
#pragma unroll
    for (int x = 16; x > 0; x >>= 1)
        M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, x));
    nan = __any_sync(0xffffffffu, nan);
    if (nan || M == -INFINITY) {
#pragma unroll
        for (int i = 0; i < NV; i++)
            o[i] = nan ? NAN : 0.f;
        lv = nan ? NAN : -INFINITY;
        return;
    }
    float L = 0.f, acc[NV];
#pragma unroll
    for (int i = 0; i < NV; i++)
        acc[i] = 0.f;
    for (int32_t p0 = 0; p0 < r.parts; p0 += 32) {
        const int32_t n = r.parts - p0 < 32 ? r.parts - p0 : 32; /* the same in every lane */
        const float cl = lane < n ? expf(r.lse(p0 + lane) - M) : 0.f;
        L += cl;
        /* 8 parts' loads in flight per lane: the tensor-core decode's
         * last-CTA merge of a long request's 32+ splits is a chain of these
         * rounds at the end of the kernel. */
#pragma unroll 8
        for (int32_t j = 0; j < n; j++) {
            const float c = __shfl_sync(0xffffffffu, cl, j);
#pragma unroll
            for (int i = 0; i < NV; i++) {
                const int32_t d = d0 + lane + 32 * i;
                const float x = d < Dv ? r.val(p0 + j, d) : 0.f;
                acc[i] += c > 0.f ? c * x : 0.f;
            }
        }
    }
#pragma unroll
    for (int x = 16; x > 0; x >>= 1)
        L += __shfl_xor_sync(0xffffffffu, L, x);
    L += expf(sink - M);
#pragma unroll
    for (int i = 0; i < NV; i++)
        o[i] = acc[i] / L;
    lv = M + logf(L);
}

/* Parts of row r of a split task: block sp of [nrows, Dv] outputs then
 * [nrows] lse at base + sp * blk. Read through L2 (ld.cg): in the
 * tensor-core decode's last-CTA merge other CTAs of the same grid wrote them
 * (an SM's L1 is not coherent with their stores). */
struct kva__split_parts {
    const float *base;
    int64_t blk;
    int32_t nrows, Dv, r, parts;
    __device__ __forceinline__ float lse(int32_t p) const
    {
        return __ldcg(base + p * blk + (int64_t)nrows * Dv + r);
    }
    __device__ __forceinline__ float val(int32_t p, int32_t d) const
    {
        return __ldcg(base + p * blk + (int64_t)r * Dv + d);
    }
};

/*
 * Merges split task t into out [T, H, Dv] (T: float, __half or
 * __nv_bfloat16) and lse [T, H] (or NULL), with sinks [H] (or NULL): its
 * partials at ws + t.ws_off are num_splits blocks of [nq * nh, Dv] outputs
 * then [nq * nh] lse (natural log). Every thread of the calling CTA calls it
 * (blockDim.x a multiple of 32); warp w takes rows w, w + warps, ..., NV * 32
 * channels at a time.
 */
template <int NV, typename T>
static __device__ __forceinline__ void
kva__merge_split_task(const kva__cuda_meta &meta, const kva__cuda_task &t, const float *ws,
                      const float *sinks, T *out, float *lse, int32_t H, int32_t G, int32_t Dv)
{
    const int32_t nrows = t.nq * t.nh, qs = meta.qsl[t.req];
    const int64_t blk = (int64_t)nrows * (Dv + 1);
    const int lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    for (int32_t r = threadIdx.x >> 5; r < nrows; r += warps) {
        const int32_t qi = r / t.nh, head = t.kv_head * G + t.h0 + (r - qi * t.nh);
        const int64_t row = (int64_t)(qs + t.i0 + qi) * H + head;
        const kva__split_parts parts = {ws + t.ws_off, blk, nrows, Dv, r, t.num_splits};
        for (int32_t d0 = 0; d0 < Dv; d0 += 32 * NV) {
            float o[NV], lv;
            kva__lse_merge<NV>(parts, sinks ? sinks[head] : -INFINITY, d0, Dv, o, lv);
#pragma unroll
            for (int i = 0; i < NV; i++) {
                const int32_t d = d0 + lane + 32 * i;
                if (d < Dv)
                    store_f(out, row * Dv + d, o[i]);
            }
            if (lse && d0 == 0 && lane == 0)
                lse[row] = lv;
        }
    }
}

/*
 * One unit of kva__merge_split_cta_ch: channels [d, d + VW) of row r of a
 * split task whose P partial blocks start at base, blk floats apart ([nrows,
 * Dv] outputs then [nrows] lse each). An online merge over chunks of CH
 * parts: every part's lse and values of a chunk are loaded together (one
 * round of L2 loads per chunk instead of an lse pass, then the values), the
 * running max, sum and accumulators rescaled per chunk. Same results as
 * kva__lse_merge: a part of weight 0 adds nothing (its values may be NaN), a
 * NaN lse makes the row NaN, all -inf (and no sink) gives 0 and -inf.
 * SH: the blocks are a copy in shared memory (plain loads; else L2 loads).
 */
template <int VW, int CH, bool SH = false>
static __device__ __forceinline__ void
kva__merge_unit(const float *base, int64_t blk, int32_t nrows, int32_t Dv, int32_t r, int32_t d,
                int32_t P, float sink, float o[VW], float &lv)
{
    typedef typename std::conditional<VW == 4, float4, float>::type vec;
    float m = -INFINITY, L = 0.f, acc[VW];
    bool nan = false;
#pragma unroll
    for (int i = 0; i < VW; i++)
        acc[i] = 0.f;
    for (int32_t p0 = 0; p0 < P; p0 += CH) {
        float l[CH], x[CH][VW];
#pragma unroll
        for (int j = 0; j < CH; j++) {
            const int32_t p = p0 + j < P ? p0 + j : P - 1; /* a valid part; weight 0 past P */
            const float *pb = base + p * blk;
            const float *pl = pb + (int64_t)nrows * Dv + r;
            const vec *pv = reinterpret_cast<const vec *>(pb + (int64_t)r * Dv + d);
            l[j] = p0 + j < P ? (SH ? *pl : __ldcg(pl)) : -INFINITY;
            const vec v = SH ? *pv : __ldcg(pv);
            memcpy(x[j], &v, sizeof v);
        }
        float mc = m;
#pragma unroll
        for (int j = 0; j < CH; j++) {
            nan |= l[j] != l[j];
            mc = fmaxf(mc, l[j]);
        }
        if (mc == -INFINITY)
            continue;
        const float sc = expf(m - mc); /* 0 while m = -inf */
        L *= sc;
#pragma unroll
        for (int i = 0; i < VW; i++)
            acc[i] *= sc;
#pragma unroll
        for (int j = 0; j < CH; j++) {
            const float c = expf(l[j] - mc);
            L += c;
#pragma unroll
            for (int i = 0; i < VW; i++)
                acc[i] += c > 0.f ? c * x[j][i] : 0.f;
        }
        m = mc;
    }
    const float M = fmaxf(m, sink);
    if (nan || M == -INFINITY) {
#pragma unroll
        for (int i = 0; i < VW; i++)
            o[i] = nan ? NAN : 0.f;
        lv = nan ? NAN : -INFINITY;
        return;
    }
    const float sc = expf(m - M);
    L = L * sc + expf(sink - M);
#pragma unroll
    for (int i = 0; i < VW; i++)
        o[i] = acc[i] * sc / L;
    lv = M + logf(L);
}

/*
 * The merge of one split task by one CTA, the only reader of its partials
 * (the tensor-core decode's last-CTA merge): the task of item w (its rows:
 * w.nq query tokens from w.i0 of the request whose first token is qs, x
 * w.nh heads from w.h0 of kv head w.kv_head), nsplit partial blocks at base
 * ([nrows, Dv] outputs then [nrows] lse each), into out [T, H, Dv] (T: float,
 * __half or __nv_bfloat16) and lse [T, H] (or NULL), with sinks [H] (or
 * NULL). Every thread takes units of VW channels of one row (4 when the
 * blocks are 16-byte aligned, else 1) and merges all parts of its unit
 * itself, CH parts' loads in flight (kva__merge_unit), so 4 rows x Dv 128
 * are one unit per thread of a 128-thread CTA and 32 splits are two rounds
 * of L2 loads at CH 16; the item gives what the task would (no dependent
 * reads).
 */
template <int CH, bool SH, typename T>
static __device__ __forceinline__ void
kva__merge_split_cta_ch(const float *base, int32_t nsplit, const kva__cuda_item &w, int32_t qs,
                        const float *sinks, T *out, float *lse, int32_t H, int32_t G, int32_t Dv)
{
    const int32_t nrows = w.nq * w.nh;
    const int64_t blk = (int64_t)nrows * (Dv + 1);
    const bool v4 = Dv % 4 == 0 && blk % 4 == 0 && ((uintptr_t)base & 15) == 0;
    const int32_t C = v4 ? Dv / 4 : Dv; /* units per row */
    for (int32_t x = threadIdx.x; x < nrows * C; x += blockDim.x) {
        const int32_t r = x / C, c = x - r * C;
        const int32_t qi = r / w.nh, head = w.kv_head * G + w.h0 + (r - qi * w.nh);
        const int64_t row = (int64_t)(qs + w.i0 + qi) * H + head;
        const float sink = sinks ? sinks[head] : -INFINITY;
        float lv;
        if (v4) {
            float o[4];
            kva__merge_unit<4, CH, SH>(base, blk, nrows, Dv, r, 4 * c, nsplit, sink, o, lv);
#pragma unroll
            for (int i = 0; i < 4; i++)
                store_f(out, row * Dv + 4 * c + i, o[i]);
        } else {
            float o[1];
            kva__merge_unit<1, CH, SH>(base, blk, nrows, Dv, r, c, nsplit, sink, o, lv);
            store_f(out, row * Dv + c, o[0]);
        }
        if (lse && c == 0)
            lse[row] = lv;
    }
}

/* kva__merge_split_cta_ch with as many parts in flight as the task has, up
 * to 16 (no loads of parts past nsplit for 2-8 splits); SH: the blocks at
 * base are a copy in shared memory. */
template <typename T, bool SH = false>
static __device__ __forceinline__ void
kva__merge_split_cta(const float *base, int32_t nsplit, const kva__cuda_item &w, int32_t qs,
                     const float *sinks, T *out, float *lse, int32_t H, int32_t G, int32_t Dv)
{
    if (nsplit <= 4)
        kva__merge_split_cta_ch<4, SH>(base, nsplit, w, qs, sinks, out, lse, H, G, Dv);
    else if (nsplit <= 8)
        kva__merge_split_cta_ch<8, SH>(base, nsplit, w, qs, sinks, out, lse, H, G, Dv);
    else
        kva__merge_split_cta_ch<16, SH>(base, nsplit, w, qs, sinks, out, lse, H, G, Dv);
}

#endif /* KVA_CUDA_LSE_MERGE_CUH */
