/*
 * simt_merge.cuh - the end of a work unit in the CUDA-core attention kernels
 * (attn_simt.cu over f32/f16/bf16 caches, attn_quant.cu over quantized ones;
 * device functions, hence a header): the lane groups of a warp merge their
 * online-softmax states by shuffles, the warps through shared memory, and
 * each (row, channel) element is finished as the output (with the sink) and
 * lse, or as a split partial that split_merge.cu combines.
 *
 * States are in log2 units: m the running max of the scaled scores, l the sum
 * of exp2(s - m), acc the sum of exp2(s - m) v per channel. A warp holds
 * 32 / LK lane groups; lane li of every group holds the same NC x VE
 * channels ((li + c * LK) * VE + e), so groups merge by xor-shuffles over
 * lane distances LK, 2 LK, ... 16.
 */
#ifndef KVA_CUDA_SIMT_MERGE_CUH
#define KVA_CUDA_SIMT_MERGE_CUH

#include <math.h>
#include <stdint.h>

#define KVA__SIMT_LN2 0.6931471805599453f
#define KVA__SIMT_LOG2E 1.4426950408889634f

/* Merges the warp's lane groups; afterwards every group holds the warp's
 * state. m, l [ROWS]; acc [ROWS][NC][VE]. */
template <int LK, int ROWS, int NC, int VE>
__device__ __forceinline__ void kva__simt_merge_groups(float (&m)[ROWS], float (&l)[ROWS],
                                                       float (&acc)[ROWS][NC][VE])
{
#pragma unroll
    for (int o = LK; o < 32; o <<= 1) {
#pragma unroll
        for (int r = 0; r < ROWS; r++) {
            const float mo = __shfl_xor_sync(0xffffffffu, m[r], o);
            const float lo = __shfl_xor_sync(0xffffffffu, l[r], o);
            const float mx = fmaxf(m[r], mo);
            const float mu = mx == -INFINITY ? 0.f : mx;
            const float ca = exp2f(m[r] - mu), cb = exp2f(mo - mu);
            l[r] = l[r] * ca + lo * cb;
            m[r] = mx;
#pragma unroll
            for (int c = 0; c < NC; c++)
#pragma unroll
                for (int e = 0; e < VE; e++) {
                    const float x = __shfl_xor_sync(0xffffffffu, acc[r][c][e], o);
                    acc[r][c][e] = acc[r][c][e] * ca + x * cb;
                }
        }
    }
}

/* Group 0 of warp `warp` stores the warp's state: s_acc [NW][ROWS][DC],
 * s_m, s_l [NW][ROWS] in shared memory (the caller synchronizes). */
template <int LK, int ROWS, int NC, int VE, int NW, int DC>
__device__ __forceinline__ void
kva__simt_store_warp(int warp, int g, int li, const float (&m)[ROWS], const float (&l)[ROWS],
                     const float (&acc)[ROWS][NC][VE], float (&s_acc)[NW][ROWS][DC],
                     float (&s_m)[NW][ROWS], float (&s_l)[NW][ROWS])
{
    if (g != 0)
        return;
#pragma unroll
    for (int r = 0; r < ROWS; r++) {
#pragma unroll
        for (int c = 0; c < NC; c++)
#pragma unroll
            for (int e = 0; e < VE; e++)
                s_acc[warp][r][(li + c * LK) * VE + e] = acc[r][c][e];
        if (li == 0) {
            s_m[warp][r] = m[r];
            s_l[warp][r] = l[r];
        }
    }
}

/* The CTA's state of row r, channel d, over the NW warps: *M the max (log2
 * units, -inf if no key was visible), *mu the reference used (0 for -inf),
 * *L and *O the sums relative to mu. */
template <int NW, int ROWS, int DC>
__device__ __forceinline__ void kva__simt_combine(const float (&s_m)[NW][ROWS],
                                                  const float (&s_l)[NW][ROWS],
                                                  const float (&s_acc)[NW][ROWS][DC], int r, int d,
                                                  float *M, float *mu, float *L, float *O)
{
    float mx = -INFINITY;
#pragma unroll
    for (int w = 0; w < NW; w++)
        mx = fmaxf(mx, s_m[w][r]);
    const float u = mx == -INFINITY ? 0.f : mx;
    float ls = 0.f, os = 0.f;
#pragma unroll
    for (int w = 0; w < NW; w++) {
        const float c = exp2f(s_m[w][r] - u);
        ls += s_l[w][r] * c;
        os += s_acc[w][r][d] * c;
    }
    *M = mx;
    *mu = u;
    *L = ls;
    *O = os;
}

/* Split partial of one element: out over this chunk's keys (0 when no key
 * was visible) and, for d == 0, lse (natural log) without the sink, at
 * row m of a partial block [nrows, Dv] then [nrows]. A NaN L propagates. */
__device__ __forceinline__ void kva__simt_write_partial(float *blk, int32_t nrows, int32_t Dv,
                                                        int32_t m, int32_t d, float mu, float L,
                                                        float O)
{
    blk[(int64_t)m * Dv + d] = L > 0.f ? O / L : (L == 0.f ? 0.f : L);
    if (d == 0)
        blk[(int64_t)nrows * Dv + m] =
            L > 0.f ? (mu + log2f(L)) * KVA__SIMT_LN2 : (L == 0.f ? -INFINITY : L);
}

/* The final output of one element with the sink (natural-log logit, or NULL)
 * in the denominator: returns out and, for d == 0 and lse != NULL, writes
 * lse (natural log) at *lse. */
__device__ __forceinline__ float kva__simt_finish(float M, float mu, float L, float O,
                                                  const float *sink, int32_t d, float *lse)
{
    float Mt = M, sink2 = -INFINITY;
    if (sink) {
        sink2 = *sink * KVA__SIMT_LOG2E;
        Mt = fmaxf(M, sink2);
    }
    const float mt = Mt == -INFINITY ? 0.f : Mt;
    const float cf = exp2f(mu - mt);
    const float Lt = L * cf + (sink ? exp2f(sink2 - mt) : 0.f);
    if (lse && d == 0)
        *lse = Lt > 0.f ? (mt + log2f(Lt)) * KVA__SIMT_LN2 : (Lt == 0.f ? -INFINITY : Lt);
    return Lt > 0.f ? O * cf / Lt : (Lt == 0.f ? 0.f : Lt);
}

#endif /* KVA_CUDA_SIMT_MERGE_CUH */
