/*
 * attn_xpose.cuh - the key-loop step of the CUDA-core kernel (simt_kernel.cuh)
 * for the load policies with the cp.async ring (f16/bf16; included by
 * simt_kernel.cuh; a template, hence in a header).
 *
 * A plain step reduces each of the U*ROWS dot products of a lane group
 * with its own log2(LK) shuffles and then runs the softmax update for every
 * (key, row) pair in every lane: 64 shuffles and ~200 scalar instructions per
 * step for ROWS = 4, U = 4, LK = 16. Here the NV = U*ROWS partial dots are
 * reduced by a transposing butterfly: at each of the log2(LK) rounds a lane
 * keeps half of its values and sends the other half to its partner, so the
 * group needs NV - NV/LK shuffles in all and lane li ends up holding the M =
 * NV/LK complete dots idx = li*M + k (idx = u*ROWS + r). The softmax update
 * then runs on M values per lane; the row maxima and the weights are shared
 * with shuffles (ROWS + NV of them) for the value accumulation, which every
 * lane does for its channels as before. Requires NV >= LK.
 */
#ifndef KVA_ATTN_XPOSE_CUH
#define KVA_ATTN_XPOSE_CUH

/* Per-lane copies of the row data of the M values a lane owns after the
 * butterfly (fixed for an item). */
template <int M> struct xpose_rows {
    int32_t lo[M], hi[M], pos[M];
    float slope[M];
    float m[M]; /* running max of the value's row */
};

template <int ROWS, int M>
__device__ __forceinline__ void
xpose_rows_init(xpose_rows<M> &x, int li, const int32_t (&lo)[ROWS], const int32_t (&hi)[ROWS],
                const int32_t (&pos)[ROWS], const float (&slope)[ROWS])
{
#pragma unroll
    for (int k = 0; k < M; k++) {
        const int r = (li * M + k) % ROWS;
        x.lo[k] = 0;
        x.hi[k] = 0;
        x.pos[k] = 0;
        x.slope[k] = 0.f;
        x.m[k] = -INFINITY;
#pragma unroll
        for (int rr = 0; rr < ROWS; rr++) {
            if (rr == r) {
                x.lo[k] = lo[rr];
                x.hi[k] = hi[rr];
                x.pos[k] = pos[rr];
                x.slope[k] = slope[rr];
            }
        }
    }
}

/* One round (offset O, N values held) of the butterfly, then the next; the
 * recursion keeps every array index a compile-time constant. */
template <int O, int N, int NV> struct butterfly {
    static __device__ __forceinline__ void run(float (&x)[NV], int li)
    {
        const bool upper = (li & O) != 0;
#pragma unroll
        for (int i = 0; i < N / 2; i++) {
            const float send = upper ? x[i] : x[i + N / 2];
            const float keep = upper ? x[i + N / 2] : x[i];
            x[i] = keep + __shfl_xor_sync(0xffffffffu, send, O);
        }
        butterfly<O / 2, N / 2, NV>::run(x, li);
    }
};
template <int N, int NV> struct butterfly<0, N, NV> {
    static __device__ __forceinline__ void run(float (&)[NV], int) {}
};

template <class P, int LK, int ROWS>
__device__ __forceinline__ void
kva__simt_step_x(const typename P::Args &a, int32_t kb, int g, int li, const typename P::Regs &rg,
                 const float (&q)[ROWS][P::KE], xpose_rows<P::U * ROWS / LK> &xr, int32_t lo_all,
                 int32_t hi_all, const kva__cuda_tree &tree, float (&m)[ROWS], float (&l)[ROWS],
                 float (&acc)[ROWS][P::NCV][P::VV])
{
    constexpr int U = P::U, NCV = P::NCV, VV = P::VV;
    constexpr int KPW = 32 / LK;
    constexpr int NV = U * ROWS;
    constexpr int M = NV / LK;
    const unsigned full = 0xffffffffu;
    const int base = (threadIdx.x & 31) & ~(LK - 1);

    /* Partial dots x[u*ROWS + r] over this lane's channels. */
    float x[NV];
#pragma unroll
    for (int u = 0; u < U; u++) {
        float dot[ROWS];
        kva__simt_dots<P, ROWS>(rg, u, q, dot);
#pragma unroll
        for (int r = 0; r < ROWS; r++)
            x[u * ROWS + r] = dot[r];
    }
    /* Transposing butterfly: after the round with offset o, a lane holds
     * half as many values, each summed over twice as many lanes. */
    butterfly<LK / 2, NV, NV>::run(x, li);
    /* The M owned logits: scale or soft-cap, ALiBi, mask. */
    float s[M];
    const bool inside = kb >= lo_all && kb + U * KPW <= hi_all;
#pragma unroll
    for (int k = 0; k < M; k++) {
        const int u = (li * M + k) / ROWS;
        const int32_t j = kb + u * KPW + g;
        float v = a.softcap > 0.f ? a.softcap * tanhf(x[k] * a.scale / a.softcap) * KVA__SIMT_LOG2E
                                  : x[k] * (a.scale * KVA__SIMT_LOG2E);
        if (a.has_alibi) /* key position: dcp_pos.cuh */
            v = fmaf(xr.slope[k], (float)(kva__cuda_key_pos(a.meta, j) - xr.pos[k]), v);
        const bool vis =
            inside || (j >= xr.lo[k] && j < xr.hi[k] && kva__cuda_tree_sees(tree, xr.pos[k], j));
        s[k] = vis ? v : -INFINITY;
    }
    /* Row maxima over the lanes that hold the same row (different keys). */
    float p[M];
#pragma unroll
    for (int k = 0; k < M; k++) {
        float rm = s[k];
#pragma unroll
        for (int o = ROWS / M; o < LK; o <<= 1)
            rm = fmaxf(rm, __shfl_xor_sync(full, rm, o));
        xr.m[k] = fmaxf(xr.m[k], rm);
        const float mu = xr.m[k] == -INFINITY ? 0.f : xr.m[k];
        p[k] = exp2f(s[k] - mu);
    }
    /* Every lane rescales its accumulators with the rows' new maxima. */
#pragma unroll
    for (int r = 0; r < ROWS; r++) {
        const float mn = __shfl_sync(full, xr.m[r % M], base + r / M);
        const float mu = mn == -INFINITY ? 0.f : mn;
        const float corr = exp2f(m[r] - mu);
        m[r] = mn;
        l[r] *= corr;
#pragma unroll
        for (int c = 0; c < NCV; c++)
#pragma unroll
            for (int e = 0; e < VV; e++)
                acc[r][c][e] *= corr;
    }
    /* Weights to every lane, then the value accumulation for its channels. */
#pragma unroll
    for (int u = 0; u < U; u++) {
        float vf[NCV][VV];
#pragma unroll
        for (int c = 0; c < NCV; c++)
            P::v_float(rg, u, c, vf[c]);
#pragma unroll
        for (int r = 0; r < ROWS; r++) {
            const int idx = u * ROWS + r;
            const float pv = __shfl_sync(full, p[idx % M], base + idx / M);
            l[r] += pv;
#pragma unroll
            for (int c = 0; c < NCV; c++)
#pragma unroll
                for (int e = 0; e < VV; e++)
                    acc[r][c][e] = fmaf(pv, vf[c][e], acc[r][c][e]);
        }
    }
}

#endif /* KVA_ATTN_XPOSE_CUH */
