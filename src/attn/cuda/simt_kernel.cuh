/*
 * simt_kernel.cuh - the one body of the CUDA-core attention kernel
 * ("decode_simt"): one CTA per unit of work (a plan item, or ROWS rows of
 * one), every head of the GQA slice and every query row of the unit in the
 * same CTA, so each K/V row loaded serves all of them. What the cache format
 * changes enters as a load policy P (below): attn_simt.cuh holds the
 * f32/f16/bf16 policy (instantiated per dtype in attn_simt*.cu),
 * attn_quant.cuh the quantized one (int8/fp8 codes and their scales,
 * instantiated per format family in attn_quant*.cu), so the build compiles
 * them in parallel.
 *
 * Inside a CTA of 4 warps (docs/cuda-decode.md, "The decode kernels"): a key row is
 * read by a lane group of LK lanes (lane li holds P::KE key channels and
 * P::NCV chunks of P::VV value channels ((li + c*LK)*VV + e)); every group
 * keeps its own online softmax for all ROWS rows; warps take interleaved
 * steps of P::U*32/LK keys with the next step's loads in flight; groups and
 * warps merge at the end (simt_merge.cuh). Scores are in fp32, base 2. The
 * grid is persistent (CTA b runs units b, b + gridDim.x, ... of the device
 * header's counts), so a captured graph replays with any later plan.
 *
 * A load policy P (a struct of static members) gives:
 *   Args               the kernel's argument struct (meta, q, k, v, sinks, out,
 *                      lse, ws, H, Hkv, G, D, Dv, B, layout_hnd, causal,
 *                      window_left, chunk, has_alibi, scale, softcap)
 *   KE, NCV, VV, U     K floats per lane, V chunks and floats per chunk, keys
 *                      per lane group and step
 *   RING               loads through the cp.async ring (CHUNKS 16-byte copies
 *                      per key and K or V; issue_async) instead of registers
 *   GROW_SKIP          rescale the accumulators only when a row max moved
 *   NARROW             loop only over the keys some row of the unit sees
 *   QO                 the query loads give a per-row offset (reduced here)
 *   Regs               one step's K/V chunks (k, v) and what else it needs
 *   units(a, n), unit<ROWS>(a, u, n, w)    the persistent loop's units
 *   ragged(a)          K/V ragged (NHD, B = 1, block = kv_start + j)
 *   load_q<LK>(a, row, kvh, li, q, o)       q of token row `row` (T*H + h)
 *   issue<LK>(a, ka, bt_row, kvs, kb, g, li, kend, r)   the step at kb
 *   k_float(r, u, kf), v_float(r, u, c, vf)  key u's channels as floats
 *   score(a, r, u, dot, qo)                  the raw score from the dot
 *   value(a, kvh, d, O, L)                   sum_j p_j v_jd in value units
 *   store(a, i, o)                           out element i
 */
#ifndef KVA_CUDA_SIMT_KERNEL_CUH
#define KVA_CUDA_SIMT_KERNEL_CUH

extern "C" {
#include "cuda_backend.h"
#include "partition.h"
#include "prefill_mma.h"
}
#include "cuda_check.h"
#include "dcp_pos.cuh"
#include "simt_merge.cuh"
#include "tree_mask.cuh"

#include <math.h>
#include <stdint.h>

#define KVA_SIMT_NW 4     /* warps per CTA */
#define KVA_SIMT_STAGES 4 /* P::RING: steps in flight per warp */

/* One unit of work: rows r < nrows are packed rows m = mstart + r of
 * request req, kv head kvh: query i0 + m / nh, head kvh*G + h0 + m % nh;
 * ntot: rows of the whole item (its split partials are [ntot, Dv], [ntot]). */
typedef struct kva__simt_unit {
    int32_t req, kvh, h0, nh, i0, mstart, nrows, ntot, k0, k1, task, split;
} kva__simt_unit;

/* A plan item as one unit (its rows fit ROWS). */
__device__ __forceinline__ void kva__simt_item_unit(const kva__cuda_item &it, kva__simt_unit &w)
{
    w.req = it.req, w.kvh = it.kv_head, w.h0 = it.h0, w.nh = it.nh, w.i0 = it.i0;
    w.ntot = w.nrows = it.nq * it.nh;
    w.mstart = 0;
    w.k0 = it.k0, w.k1 = it.k1;
    w.task = it.task, w.split = it.split;
}

/*
 * Key-row addressing without branches. Row index of key j for kv head kvh:
 *   NHD: (block * B + off) * Hkv + kvh,  HND: (block * Hkv + kvh) * B + off,
 * i.e. block * B*Hkv + off * ostride + hoff (ostride Hkv or 1, hoff kvh or
 * kvh * B), and the per-token scale index (block * Hkv + kvh) * B + off
 * (toff = kvh * B). Ragged K/V is NHD with B = 1 and block = kvs + j.
 * j / B comes from a double-precision reciprocal with one correction step
 * (exact for j, B < 2^31), so non-power-of-two block sizes cost no divide.
 */
typedef struct kva__simt_addr {
    int64_t bstride, ostride, hoff, toff;
    double inv_b;
} kva__simt_addr;

__device__ __forceinline__ int64_t kva__simt_key_row(int32_t B, const kva__simt_addr &ka,
                                                     const int32_t *bt_row, bool ragged,
                                                     int64_t kvs, int32_t j, int64_t *tsi)
{
    int32_t blk = (int32_t)((double)j * ka.inv_b);
    int32_t off = j - blk * B;
    blk = off >= B ? blk + 1 : blk;
    off = off >= B ? off - B : off;
    blk = off < 0 ? blk - 1 : blk;
    off = off < 0 ? off + B : off;
    const int64_t block = ragged ? kvs + blk : (int64_t)__ldg(bt_row + blk);
    *tsi = block * ka.bstride + ka.toff + off;
    return block * ka.bstride + off * ka.ostride + ka.hoff;
}

/* 16-byte global -> shared copy (sm_80+); src_bytes 0 writes zeros and reads nothing. */
__device__ __forceinline__ void kva__simt_cp16(void *smem, const void *gmem, int src_bytes)
{
    const unsigned dst = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem),
                 "r"(src_bytes)
                 : "memory");
}
__device__ __forceinline__ void kva__simt_cp_commit()
{
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N> __device__ __forceinline__ void kva__simt_cp_wait()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/* This lane's partial dots of key u of the step with every row (its KE
 * channels). */
template <class P, int ROWS>
__device__ __forceinline__ void kva__simt_dots(const typename P::Regs &rg, int u,
                                               const float (&q)[ROWS][P::KE], float (&dot)[ROWS])
{
    float kf[P::KE];
    P::k_float(rg, u, kf);
#pragma unroll
    for (int r = 0; r < ROWS; r++) {
        float x = 0.f;
#pragma unroll
        for (int e = 0; e < P::KE; e++)
            x = fmaf(q[r][e], kf[e], x);
        dot[r] = x;
    }
}

/*
 * One step of the key loop for one lane: the U keys kb + u*KPW + g, whose K
 * and V chunks are in rg, update the online-softmax state (m, l, acc) of
 * every row.
 */
template <class P, int LK, int ROWS>
__device__ __forceinline__ void
kva__simt_step(const typename P::Args &a, int32_t kb, int g, const typename P::Regs &rg,
               const float (&q)[ROWS][P::KE], const float (&qo)[ROWS], const int32_t (&lo)[ROWS],
               const int32_t (&hi)[ROWS], const int32_t (&pos)[ROWS], const float (&slope)[ROWS],
               int32_t lo_all, int32_t hi_all, const kva__cuda_tree &tree, float (&m)[ROWS],
               float (&l)[ROWS], float (&acc)[ROWS][P::NCV][P::VV])
{
    constexpr int U = P::U, NCV = P::NCV, VV = P::VV;
    constexpr int KPW = 32 / LK;
    const float scale_log2 = a.scale * KVA__SIMT_LOG2E;
    /* Raw scores of the U keys for every row (reduced over the group). */
    float sc[U][ROWS];
#pragma unroll
    for (int u = 0; u < U; u++) {
        float dot[ROWS];
        kva__simt_dots<P, ROWS>(rg, u, q, dot);
#pragma unroll
        for (int r = 0; r < ROWS; r++) {
#pragma unroll
            for (int o = LK / 2; o >= 1; o >>= 1)
                dot[r] += __shfl_xor_sync(0xffffffffu, dot[r], o);
            sc[u][r] = P::score(a, rg, u, dot[r], qo[r]);
        }
    }
    /* Scale (or soft-cap) into base-2 logits: one uniform branch. */
    if (a.softcap > 0.f) {
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int r = 0; r < ROWS; r++)
                sc[u][r] = a.softcap * tanhf(sc[u][r] * a.scale / a.softcap) * KVA__SIMT_LOG2E;
    } else {
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int r = 0; r < ROWS; r++)
                sc[u][r] *= scale_log2;
    }
    /* ALiBi and the mask (both skipped when they cannot matter: no slopes;
     * every key of this warp's step visible to every row). Rows past the
     * unit's have lo = hi = 0: masked. */
    if (a.has_alibi) {
#pragma unroll
        for (int r = 0; r < ROWS; r++)
#pragma unroll
            for (int u = 0; u < U; u++)
                sc[u][r] =
                    fmaf(slope[r], (float)(kva__cuda_key_pos(a.meta, kb + u * KPW + g) - pos[r]),
                         sc[u][r]);
    }
    if (!(kb >= lo_all && kb + U * KPW <= hi_all)) {
#pragma unroll
        for (int r = 0; r < ROWS; r++)
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int32_t j = kb + u * KPW + g;
                const bool vis = j >= lo[r] && j < hi[r] && kva__cuda_tree_sees(tree, pos[r], j);
                sc[u][r] = vis ? sc[u][r] : -INFINITY;
            }
    }
    /* Online softmax; sc becomes the weights p. */
    float cr[ROWS];
    bool grew = false;
#pragma unroll
    for (int r = 0; r < ROWS; r++) {
        float mx = m[r];
#pragma unroll
        for (int u = 0; u < U; u++)
            mx = fmaxf(mx, sc[u][r]);
        const float mu = mx == -INFINITY ? 0.f : mx;
        const float corr = exp2f(m[r] - mu);
        m[r] = mx;
        float psum = 0.f;
#pragma unroll
        for (int u = 0; u < U; u++) {
            sc[u][r] = exp2f(sc[u][r] - mu);
            psum += sc[u][r];
        }
        l[r] = l[r] * corr + psum;
        cr[r] = corr;
        grew |= corr != 1.f;
    }
    /* With GROW_SKIP the accumulators are rescaled only when some row's
     * maximum moved in this warp (a factor of exactly 1 changes nothing). */
    if (!P::GROW_SKIP || __any_sync(0xffffffffu, grew)) {
#pragma unroll
        for (int r = 0; r < ROWS; r++)
#pragma unroll
            for (int c = 0; c < NCV; c++)
#pragma unroll
                for (int e = 0; e < VV; e++)
                    acc[r][c][e] *= cr[r];
    }
#pragma unroll
    for (int u = 0; u < U; u++) {
#pragma unroll
        for (int c = 0; c < NCV; c++) {
            float vf[VV];
            P::v_float(rg, u, c, vf);
#pragma unroll
            for (int r = 0; r < ROWS; r++)
#pragma unroll
                for (int e = 0; e < VV; e++)
                    acc[r][c][e] = fmaf(sc[u][r], vf[e], acc[r][c][e]);
        }
    }
}

#include "attn_xpose.cuh"

/* Dynamic shared memory of an instantiation: the ring (P::RING). */
template <class P> constexpr size_t kva__simt_smem()
{
    return P::RING ? (size_t)KVA_SIMT_NW * KVA_SIMT_STAGES * P::U * P::CHUNKS * 2 * 32 * 16 : 0;
}

template <class P, int LK, int ROWS>
__global__ void __launch_bounds__(KVA_SIMT_NW * 32, P::RING &&ROWS == 4 ? 3 : 2)
    kva__simt_kernel(typename P::Args a)
{
    constexpr int U = P::U, KE = P::KE, NCV = P::NCV, VV = P::VV;
    constexpr int KPW = 32 / LK;       /* keys per warp and u */
    constexpr int DCV = LK * NCV * VV; /* V channels covered */
    constexpr bool XPOSE = P::RING && U * ROWS >= LK;
    constexpr int XM = XPOSE ? U * ROWS / LK : 1;
    __shared__ float s_acc[KVA_SIMT_NW][ROWS][DCV];
    __shared__ float s_m[KVA_SIMT_NW][ROWS], s_l[KVA_SIMT_NW][ROWS];
    extern __shared__ uint4 s_ring[]; /* RING: [NW][STAGES][U][CHUNKS][K/V][32 lanes] */

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane / LK, li = lane % LK;
    const int32_t n_items = a.meta.hdr[KVA_CUDA_HDR_ITEMS];
    const int32_t tree_on = a.meta.hdr[KVA_CUDA_HDR_TREE]; /* tree_mask.cuh */
    const int32_t n_units = P::template units<ROWS>(a, n_items);
    const int32_t bt_stride = a.meta.hdr[KVA_CUDA_HDR_BT_STRIDE];

    for (int32_t un = blockIdx.x; un < n_units; un += gridDim.x) {
        kva__simt_unit w;
        if (!P::template unit<ROWS>(a, un, n_items, w))
            continue; /* uniform over the CTA */
        const int32_t qs = a.meta.qsl[w.req];
        const int32_t q_len = a.meta.qsl[w.req + 1] - qs;
        const int32_t s = a.meta.seq_lens[w.req];
        const kva__cuda_tree tree = kva__cuda_tree_at(a.meta.tree, tree_on, qs, s, q_len);
        const bool ragged = P::ragged(a);
        const int32_t *bt_row = ragged ? nullptr : a.meta.block_table + (int64_t)w.req * bt_stride;
        const int64_t kvs = ragged ? a.meta.kv_start[w.req] : 0;

        /* Per row: the query chunk (and offset), visible keys, ALiBi slope. */
        float q[ROWS][KE], qo[ROWS], slope[ROWS];
        int32_t lo[ROWS], hi[ROWS], pos[ROWS];
#pragma unroll
        for (int r = 0; r < ROWS; r++) {
            lo[r] = 0, hi[r] = 0, pos[r] = 0, slope[r] = 0.f;
            float o = 0.f;
#pragma unroll
            for (int e = 0; e < KE; e++)
                q[r][e] = 0.f;
            if (r < w.nrows) {
                const int32_t m = w.mstart + r, qi = m / w.nh, hh = m - qi * w.nh;
                const int32_t head = w.kvh * a.G + w.h0 + hh;
                const int32_t i = w.i0 + qi;
                int32_t p, h_, l_;
                kva__cuda_row_keys(a.meta, a.causal, a.window_left, a.chunk, w.req, s, q_len, i, l_,
                                   h_, p);
                lo[r] = l_ > w.k0 ? l_ : w.k0;
                hi[r] = h_ < w.k1 ? h_ : w.k1;
                pos[r] = p;
                if (a.has_alibi)
                    slope[r] = a.meta.alibi[head] * KVA__SIMT_LOG2E;
                P::template load_q<LK>(a, (int64_t)(qs + i) * a.H + head, w.kvh, li, q[r], o);
            }
            qo[r] = 0.f;
            if constexpr (P::QO) {
#pragma unroll
                for (int x = LK / 2; x >= 1; x >>= 1)
                    o += __shfl_xor_sync(0xffffffffu, o, x);
                qo[r] = o;
            }
        }

        float m[ROWS], l[ROWS], acc[ROWS][NCV][VV];
#pragma unroll
        for (int r = 0; r < ROWS; r++) {
            m[r] = -INFINITY, l[r] = 0.f;
#pragma unroll
            for (int c = 0; c < NCV; c++)
#pragma unroll
                for (int e = 0; e < VV; e++)
                    acc[r][c][e] = 0.f;
        }

        /* Keys the loop runs over [kbeg, kend) (NARROW: those some row
         * sees); keys every row sees [lo_all, hi_all): no mask there. */
        int32_t kbeg = w.k0, kend = w.k1, lo_all = w.k0, hi_all = w.k1;
        if constexpr (P::NARROW) {
            kbeg = w.k1, kend = w.k0;
#pragma unroll
            for (int r = 0; r < ROWS; r++)
                if (r < w.nrows && lo[r] < hi[r]) {
                    kbeg = min(kbeg, lo[r]);
                    kend = max(kend, hi[r]);
                }
        }
#pragma unroll
        for (int r = 0; r < ROWS; r++)
            if (r < w.nrows) {
                lo_all = max(lo_all, lo[r]);
                hi_all = min(hi_all, hi[r]);
            }
        hi_all = min(hi_all, tree.t0); /* steps reaching a tree key are masked */
        kva__simt_addr ka;
        ka.bstride = (int64_t)a.B * a.Hkv;
        ka.ostride = a.layout_hnd ? 1 : a.Hkv;
        ka.hoff = a.layout_hnd ? (int64_t)w.kvh * a.B : w.kvh;
        ka.toff = (int64_t)w.kvh * a.B;
        ka.inv_b = 1.0 / (double)a.B;
        constexpr int STEP = KVA_SIMT_NW * U * KPW;
        const int32_t kb0 = kbeg + warp * (U * KPW);
        if constexpr (!P::RING) {
            /* The loads of the next step go to registers and are in flight
             * while the current step is computed. */
            if (!P::NARROW || kbeg < kend) {
                typename P::Regs rg;
                P::template issue<LK>(a, ka, bt_row, kvs, kb0, g, li, kend, rg);
                for (int32_t kb = kb0; kb < kend; kb += STEP) {
                    typename P::Regs rn;
                    P::template issue<LK>(a, ka, bt_row, kvs, kb + STEP, g, li, kend, rn);
                    kva__simt_step<P, LK, ROWS>(a, kb, g, rg, q, qo, lo, hi, pos, slope, lo_all,
                                                hi_all, tree, m, l, acc);
                    rg = rn;
                }
            }
        } else {
            /* cp.async into a ring of KVA_SIMT_STAGES steps in shared memory,
             * private to the lane (each lane reads back only the 16-byte
             * chunks it copied, so wait_group alone orders the accesses). */
            constexpr int SST = U * P::CHUNKS * 2 * 32; /* uint4 per stage */
            uint4 *ring = s_ring + (size_t)warp * KVA_SIMT_STAGES * SST + lane;
            xpose_rows<XM> xr;
            if constexpr (XPOSE)
                xpose_rows_init<ROWS, XM>(xr, li, lo, hi, pos, slope);
#pragma unroll
            for (int st = 0; st < KVA_SIMT_STAGES - 1; st++) {
                P::template issue_async<LK>(a, ka, bt_row, kvs, kb0 + st * STEP, g, li, kend,
                                            ring + st * SST);
                kva__simt_cp_commit();
            }
            int stage = 0;
            for (int32_t kb = kb0; kb < kend; kb += STEP) {
                const int ahead = stage == 0 ? KVA_SIMT_STAGES - 1 : stage - 1;
                P::template issue_async<LK>(a, ka, bt_row, kvs, kb + (KVA_SIMT_STAGES - 1) * STEP,
                                            g, li, kend, ring + ahead * SST);
                kva__simt_cp_commit();
                kva__simt_cp_wait<KVA_SIMT_STAGES - 1>();
                typename P::Regs rg;
                P::ring_read(ring + stage * SST, rg);
                if constexpr (XPOSE)
                    kva__simt_step_x<P, LK, ROWS>(a, kb, g, li, rg, q, xr, lo_all, hi_all, tree, m,
                                                  l, acc);
                else
                    kva__simt_step<P, LK, ROWS>(a, kb, g, rg, q, qo, lo, hi, pos, slope, lo_all,
                                                hi_all, tree, m, l, acc);
                stage = stage == KVA_SIMT_STAGES - 1 ? 0 : stage + 1;
            }
            kva__simt_cp_wait<0>(); /* nothing may land in the ring after the unit */
        }

        /* Merge the groups of each warp, then the warps; element (r, d) per thread. */
        kva__simt_merge_groups<LK, ROWS, NCV, VV>(m, l, acc);
        kva__simt_store_warp<LK, ROWS, NCV, VV, KVA_SIMT_NW, DCV>(warp, g, li, m, l, acc, s_acc,
                                                                  s_m, s_l);
        __syncthreads();
        for (int32_t x = threadIdx.x; x < w.nrows * a.Dv; x += blockDim.x) {
            const int32_t r = x / a.Dv, d = x - r * a.Dv;
            float M, mu, L, O;
            kva__simt_combine<KVA_SIMT_NW, ROWS, DCV>(s_m, s_l, s_acc, r, d, &M, &mu, &L, &O);
            O = P::value(a, w.kvh, d, O, L);
            const int32_t m_ = w.mstart + r, qi = m_ / w.nh, hh = m_ - qi * w.nh;
            const int32_t head = w.kvh * a.G + w.h0 + hh;
            const int64_t tok = qs + w.i0 + qi;
            if (w.task >= 0) {
                const kva__cuda_task t = a.meta.tasks[w.task];
                kva__simt_write_partial(a.ws + t.ws_off + (int64_t)w.split * w.ntot * (a.Dv + 1),
                                        w.ntot, a.Dv, m_, d, mu, L, O);
            } else {
                const float o = kva__simt_finish(M, mu, L, O, a.sinks ? a.sinks + head : NULL, d,
                                                 a.lse ? a.lse + tok * a.H + head : NULL);
                P::store(a, (tok * a.H + head) * a.Dv + d, o);
            }
        }
        __syncthreads();
    }
}

/* A kernel instantiation and its dynamic shared memory (the ring). */
template <class Args> struct kva__simt_launch {
    void (*fn)(Args);
    size_t smem;
};

template <class P, int LK, int ROWS> static kva__simt_launch<typename P::Args> kva__simt_make()
{
    kva__simt_launch<typename P::Args> k = {kva__simt_kernel<P, LK, ROWS>, kva__simt_smem<P>()};
    return k;
}

#endif /* KVA_CUDA_SIMT_KERNEL_CUH */
