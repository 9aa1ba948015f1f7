/*
 * lse_merge.cuh - the one LSE merge of partial attention states that every
 * CUDA merge kernel (split_merge.cu: the split work items' second pass,
 * kva_merge_states and kva_merge_states_n, the cascade merge) runs.
 */
#ifndef KVA_CUDA_LSE_MERGE_CUH
#define KVA_CUDA_LSE_MERGE_CUH

#include "elem_io.cuh"

#include <math.h>
#include <stdint.h>

/*
 * The LSE-weighted mean of one row's parts: R gives r.parts, r.lse(p)
 * (natural log) and r.out(p) (part p's out row [Dv], float or 16-bit), and
 * sink is the lse of a part without value (-inf: none). Channels
 * d0 + STEP * i (i < NV, below Dv) go to o[i], the row's lse to lv. As the
 * reference: the values of a part of weight 0 do not count (they may be NaN;
 * every part's row must be readable memory), all -inf gives 0 and -inf, a NaN
 * lse makes the row NaN (out and lse).
 */
template <int NV, int STEP, typename R>
static __device__ __forceinline__ void kva__lse_merge(const R &r, float sink, int32_t d0,
                                                      int32_t Dv, float o[NV], float &lv)
{
    float M = sink;
    bool nan = false;
    for (int32_t p = 0; p < r.parts; p++) {
        const float l = r.lse(p);
        nan |= l != l;
        M = fmaxf(M, l);
    }
    if (nan || M == -INFINITY) {
#pragma unroll
        for (int i = 0; i < NV; i++)
            o[i] = nan ? NAN : 0.f;
        lv = nan ? NAN : -INFINITY;
        return;
    }
    float L = expf(sink - M), acc[NV];
#pragma unroll
    for (int i = 0; i < NV; i++)
        acc[i] = 0.f;
    /* Branch-free over the parts (a select, not a skip, drops a weight-0
     * part's values), so the compiler can keep several parts' loads in flight. */
    for (int32_t p = 0; p < r.parts; p++) {
        const float c = expf(r.lse(p) - M);
        L += c;
        const auto *v = r.out(p);
#pragma unroll
        for (int i = 0; i < NV; i++) {
            const int32_t d = d0 + STEP * i;
            const float x = d < Dv ? load_f(v, d) : 0.f;
            acc[i] += c > 0.f ? c * x : 0.f;
        }
    }
#pragma unroll
    for (int i = 0; i < NV; i++)
        o[i] = acc[i] / L;
    lv = M + logf(L);
}

#endif /* KVA_CUDA_LSE_MERGE_CUH */
