/*
 * split_merge.cu - the LSE merges of partial attention states on the GPU, all
 * through one merge (kva__lse_merge, lse_merge.cuh: one warp per row) over a
 * source of parts:
 *   split_merge_kernel: the second pass of a run whose plan split some work
 *     items into key chunks: merges every split task's partials, adds the
 *     sink and writes out / lse (kva__merge_split_task). It follows every
 *     decode kernel that does not merge its tasks itself (attn_simt,
 *     attn_quant, the MLA decodes): they all write partials in the same
 *     layout. The tensor-core decode (decode_mma_kernel.cuh) merges each task
 *     in the last CTA that wrote one of its partials, with the same function.
 *   merge_rows_kernel: one warp per row (token, head) of [T, H], for
 *     kva_merge_states (two parts), kva_merge_states_n (P strided parts, the
 *     DCP combine) and the cascade merge (a row with its C prefix rows, in
 *     place; src/attn/cascade.c).
 */
#include "cuda_check.h"
#include "lse_merge.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>
#include <type_traits>

/* Every split task of the plan (meta's header count), one CTA per task at a
 * time; NV * 32 channels per pass over a row. */
template <int NV, typename T>
__global__ void __launch_bounds__(256)
    split_merge_kernel(kva__cuda_meta meta, const float *ws, const float *sinks, T *out, float *lse,
                       int32_t H, int32_t G, int32_t Dv)
{
    const int32_t n_tasks = meta.hdr[KVA_CUDA_HDR_TASKS];
    for (int32_t ti = blockIdx.x; ti < n_tasks; ti += gridDim.x)
        kva__merge_split_task<NV>(meta, meta.tasks[ti], ws, sinks, out, lse, H, G, Dv);
}

/* split_merge_kernel for T with the fewest channels per lane that cover Dv
 * in one pass (up to 512, the MLA decodes' Dc). */
template <typename T>
static void split_merge_go(const kva__cuda_meta &meta, const float *ws, const float *sinks, T *out,
                           float *lse, int32_t H, int32_t G, int32_t Dv, int grid, cudaStream_t s)
{
    if (Dv <= 128)
        split_merge_kernel<4, T><<<grid, 256, 0, s>>>(meta, ws, sinks, out, lse, H, G, Dv);
    else if (Dv <= 256)
        split_merge_kernel<8, T><<<grid, 256, 0, s>>>(meta, ws, sinks, out, lse, H, G, Dv);
    else
        split_merge_kernel<16, T><<<grid, 256, 0, s>>>(meta, ws, sinks, out, lse, H, G, Dv);
}

extern "C" kva_status kva__cuda_split_merge_launch(const kva__cuda_meta *meta, const float *ws,
                                                   const float *sinks, void *out, float *lse,
                                                   int32_t H, int32_t G, int32_t Dv,
                                                   kva_dtype dtype, int grid, void *stream)
{
    cudaStream_t s = (cudaStream_t)stream;
    if (dtype == KVA_DTYPE_F32)
        split_merge_go(*meta, ws, sinks, (float *)out, lse, H, G, Dv, grid, s);
    else if (dtype == KVA_DTYPE_F16)
        split_merge_go(*meta, ws, sinks, (__half *)out, lse, H, G, Dv, grid, s);
    else
        split_merge_go(*meta, ws, sinks, (__nv_bfloat16 *)out, lse, H, G, Dv, grid, s);
    KVA_CUDA_LAUNCHED("split_merge_kernel");
    return KVA_STATUS_OK;
}

/* ---- row merges: one warp per row n of [T * H] ---- */

/* The parts of row n of a row source S: S::row(n) gives parts, lse(p),
 * val(p, d) (as kva__split_parts) and skip (the row is left as it is). */

/* kva_merge_states: out_a / lse_a and out_b / lse_b [T * H, Dv]. */
template <typename T> struct states2_src {
    const T *oa, *ob;
    const float *la, *lb;
    int32_t Dv;
    struct row_t {
        const T *oa, *ob;
        float la, lb;
        int32_t parts;
        bool skip;
        __device__ __forceinline__ float lse(int32_t p) const
        {
            return p ? lb : la;
        }
        __device__ __forceinline__ float val(int32_t p, int32_t d) const
        {
            return load_f(p ? ob : oa, d);
        }
    };
    __device__ __forceinline__ row_t row(int64_t n) const
    {
        return {oa + n * Dv, ob + n * Dv, la[n], lb[n], 2, false};
    }
};

/* kva_merge_states_n: part p of row n at outs + p * os + n * Dv, lse
 * lses[p * ls + n]. */
template <typename T> struct states_n_src {
    const T *outs;
    const float *lses;
    int64_t os, ls;
    int32_t P, Dv;
    struct row_t {
        const T *o;
        const float *l;
        int64_t os, ls;
        int32_t parts;
        bool skip;
        __device__ __forceinline__ float lse(int32_t p) const
        {
            return l[p * ls];
        }
        __device__ __forceinline__ float val(int32_t p, int32_t d) const
        {
            return load_f(o + p * os, d);
        }
    };
    __device__ __forceinline__ row_t row(int64_t n) const
    {
        return {outs + n * Dv, lses + n, os, ls, P, false};
    }
};

/* Cascade: row (t, h) of out / lse [T, H] whose token is grouped (merge[t] =
 * m >= 0), with the C prefix rows (k * M + m, h) of out_pref / lse_pref
 * [C * M, H] as parts 1 .. C. */
template <typename T> struct cascade_src {
    const int32_t *merge;
    const T *out, *out_pref;
    const float *lse, *lse_pref;
    int32_t C, M, H, Dv;
    struct row_t {
        const T *o, *op;
        const float *l, *lp;
        int64_t pstride; /* rows between two prefix parts: M * H */
        int32_t Dv, parts;
        bool skip;
        __device__ __forceinline__ float lse(int32_t p) const
        {
            return p ? lp[(p - 1) * pstride] : *l;
        }
        __device__ __forceinline__ float val(int32_t p, int32_t d) const
        {
            return load_f(p ? op + (p - 1) * pstride * Dv : o, d);
        }
    };
    __device__ __forceinline__ row_t row(int64_t n) const
    {
        const int64_t t = n / H, h = n % H;
        const int32_t m = merge[t];
        const int64_t pr = (int64_t)(m < 0 ? 0 : m) * H + h;
        return {out + n * Dv, out_pref + pr * Dv, lse + n, lse_pref + pr, (int64_t)M * H, Dv, C + 1,
                m < 0};
    }
};

/* Row n of src merged into out [rows, Dv] in T's type and lse_out [rows] (or
 * NULL); Dv <= 256 (the backend's max_head_dim). Every lane reads the row's
 * parts before any lane writes, so out and lse_out may alias a part. */
template <typename T, typename S>
__global__ void __launch_bounds__(128)
    merge_rows_kernel(const S src, int64_t rows, int32_t Dv, T *out, float *lse_out)
{
    const int lane = threadIdx.x & 31;
    const int64_t warps = (int64_t)gridDim.x * (blockDim.x >> 5);
    for (int64_t n = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); n < rows;
         n += warps) {
        const typename S::row_t r = src.row(n);
        if (r.skip)
            continue;
        float o[256 / 32], lv;
        kva__lse_merge<256 / 32>(r, -INFINITY, 0, Dv, o, lv);
        __syncwarp();
#pragma unroll
        for (int i = 0; i < 256 / 32; i++) {
            const int32_t d = lane + 32 * i;
            if (d < Dv)
                store_f(out, n * Dv + d, o[i]);
        }
        if (lse_out && lane == 0)
            lse_out[n] = lv;
    }
}

/* merge_rows_kernel of source family Src (Src<T>) in dtype's T over the rows
 * of [T * H], 4 rows per CTA of 128 threads; mk(T *) gives the source. */
template <template <typename> class Src, typename Make>
static kva_status merge_rows_launch(const kva_context *ctx, kva_dtype dtype, int64_t rows,
                                    int32_t Dv, void *out, float *lse_out, Make mk)
{
    cudaStream_t s = (cudaStream_t)((const kva__cuda_state *)ctx->state)->stream;
    const int64_t ctas = (rows + 3) / 4;
    const int grid = ctas < 65535 ? (int)ctas : 65535;
    if (dtype == KVA_DTYPE_F32)
        merge_rows_kernel<float, Src<float>>
            <<<grid, 128, 0, s>>>(mk((const float *)0), rows, Dv, (float *)out, lse_out);
    else if (dtype == KVA_DTYPE_F16)
        merge_rows_kernel<__half, Src<__half>>
            <<<grid, 128, 0, s>>>(mk((const __half *)0), rows, Dv, (__half *)out, lse_out);
    else
        merge_rows_kernel<__nv_bfloat16, Src<__nv_bfloat16>><<<grid, 128, 0, s>>>(
            mk((const __nv_bfloat16 *)0), rows, Dv, (__nv_bfloat16 *)out, lse_out);
    KVA_CUDA_LAUNCHED("merge_rows_kernel");
    return KVA_STATUS_OK;
}

extern "C" kva_status kva__cuda_merge_states(kva_context *ctx, int32_t num_tokens,
                                             int32_t num_heads, int32_t head_dim_v, kva_dtype dtype,
                                             const void *out_a, const float *lse_a,
                                             const void *out_b, const float *lse_b, void *out,
                                             float *lse_out)
{
    return merge_rows_launch<states2_src>(
        ctx, dtype, (int64_t)num_tokens * num_heads, head_dim_v, out, lse_out, [&](auto *z) {
            typedef std::remove_const_t<std::remove_pointer_t<decltype(z)>> T;
            return states2_src<T>{(const T *)out_a, (const T *)out_b, lse_a, lse_b, head_dim_v};
        });
}

extern "C" kva_status
kva__cuda_merge_states_n(kva_context *ctx, int32_t num_parts, int32_t num_tokens, int32_t num_heads,
                         int32_t head_dim_v, kva_dtype dtype, const void *outs, int64_t out_stride,
                         const float *lses, int64_t lse_stride, void *out, float *lse_out)
{
    return merge_rows_launch<states_n_src>(
        ctx, dtype, (int64_t)num_tokens * num_heads, head_dim_v, out, lse_out, [&](auto *z) {
            typedef std::remove_const_t<std::remove_pointer_t<decltype(z)>> T;
            return states_n_src<T>{(const T *)outs, lses,      out_stride,
                                   lse_stride,      num_parts, head_dim_v};
        });
}

extern "C" kva_status kva__cuda_cascade_merge(kva_context *ctx, const kva_plan *plan, int32_t level,
                                              const void *out_pref, const float *lse_pref,
                                              void *out, float *lse)
{
    const kva__cascade *c = plan->cascade;
    /* The level's map: merge [L, T] follows gather [M] (nested groups merge
     * level by level). */
    const int32_t *merge = (const int32_t *)((const char *)c->aux->workspace + c->off_idx) +
                           c->rows + (int64_t)level * plan->info.num_tokens;
    const int32_t H = plan->d.num_heads, Dv = plan->d.head_dim_v;
    return merge_rows_launch<cascade_src>(
        ctx, plan->d.q_dtype, (int64_t)plan->info.num_tokens * H, Dv, out, lse, [&](auto *z) {
            typedef std::remove_const_t<std::remove_pointer_t<decltype(z)>> T;
            return cascade_src<T>{merge,
                                  (const T *)out,
                                  (const T *)out_pref,
                                  lse,
                                  lse_pref,
                                  c->num_chunks,
                                  c->rows,
                                  H,
                                  Dv};
        });
}
