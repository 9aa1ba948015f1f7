/*
 * attn_simt.cu - paged (and ragged) attention on CUDA cores: one CTA per work
 * item (request, kv head, query tile, key split), every head of the GQA slice
 * and every query row of the tile in the same CTA, so each K/V row loaded
 * serves all of them. The decode family's portable kernel ("decode_simt",
 * cuda_kernels.cu): f32, head sizes the tensor-core decode (decode_mma.cu)
 * does not cover, ragged K/V, and the prefills of shapes without a prefill
 * tile kernel. cuda_dispatch.cu chooses between them.
 *
 * K/V loads: f16/bf16 go through cp.async into a per-lane ring of KVA_STAGES
 * steps in shared memory (3 CTAs/SM at 4 rows, more bytes in flight) and the
 * warp reduction of P V transposes (attn_xpose.cuh) where U*ROWS >= LK; f32
 * loads into registers, the next step's loads in flight during the current
 * step.
 *
 * Layout of the work inside a CTA of 4 warps:
 *   - a key row of width D is read by a lane group of LK lanes, each lane
 *     holding NCH chunks of 16 bytes (VEC elements): lane li of a group owns
 *     channels (li + c*LK)*VEC .. +VEC for c < NCH, so the group's loads of
 *     one row are contiguous 16-byte accesses;
 *   - a warp holds 32/LK groups, each on its own key, and every group keeps
 *     its own online-softmax state (m, l, acc) for all ROWS attention rows;
 *   - warps take interleaved steps of U*32/LK keys;
 *   - at the end the groups merge by shuffles, the warps through shared
 *     memory, and the CTA writes out/lse (or the split partial, merged by
 *     split_merge_kernel).
 * Scores are computed in fp32 in base 2 (scale * log2 e folded in), the
 * soft-cap and ALiBi in natural units first.
 *
 * The grid is persistent and independent of the plan (SMs x resident CTAs):
 * CTA b runs items b, b + gridDim.x, ... of the item count in the device
 * header, so a captured graph replays with any later plan's metadata.
 */
extern "C" {
#include "cuda_backend.h"
#include "partition.h"
#include "prefill_mma.h"
}
#include "cuda_check.h"
#include "dcp_pos.cuh"
#include "tree_mask.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>

#define KVA_NW 4 /* warps per CTA */
#define KVA_LOG2E 1.4426950408889634f

typedef kva__cuda_attn_args attn_args; /* cuda_backend.h */

/* ---- element conversions (16-byte vectors of VEC elements) ---- */

template <typename T> struct vec_of;
template <> struct vec_of<float> {
    static constexpr int n = 4;
};
template <> struct vec_of<__half> {
    static constexpr int n = 8;
};
template <> struct vec_of<__nv_bfloat16> {
    static constexpr int n = 8;
};

__device__ __forceinline__ void to_float(const uint4 &u, float *f, const float *)
{
    f[0] = __uint_as_float(u.x);
    f[1] = __uint_as_float(u.y);
    f[2] = __uint_as_float(u.z);
    f[3] = __uint_as_float(u.w);
}
__device__ __forceinline__ void bf2(uint32_t w, float *f)
{
    f[0] = __uint_as_float(w << 16);
    f[1] = __uint_as_float(w & 0xffff0000u);
}
__device__ __forceinline__ void to_float(const uint4 &u, float *f, const __nv_bfloat16 *)
{
    bf2(u.x, f);
    bf2(u.y, f + 2);
    bf2(u.z, f + 4);
    bf2(u.w, f + 6);
}
__device__ __forceinline__ void h2(uint32_t w, float *f)
{
    __half2 h = *reinterpret_cast<__half2 *>(&w);
    float2 x = __half22float2(h);
    f[0] = x.x;
    f[1] = x.y;
}
__device__ __forceinline__ void to_float(const uint4 &u, float *f, const __half *)
{
    h2(u.x, f);
    h2(u.y, f + 2);
    h2(u.z, f + 4);
    h2(u.w, f + 6);
}

__device__ __forceinline__ void store_elem(float *p, size_t i, float x)
{
    p[i] = x;
}
__device__ __forceinline__ void store_elem(__half *p, size_t i, float x)
{
    p[i] = __float2half_rn(x);
}
__device__ __forceinline__ void store_elem(__nv_bfloat16 *p, size_t i, float x)
{
    p[i] = __float2bfloat16_rn(x);
}

__device__ __forceinline__ uint4 ldg16(const void *p)
{
    return __ldg(reinterpret_cast<const uint4 *>(p));
}

/*
 * Key-row addressing without branches. Row index of key j for kv head kvh:
 *   NHD: (block * B + off) * Hkv + kvh,  HND: (block * Hkv + kvh) * B + off,
 * i.e. block * B*Hkv + off * ostride + kvh * hstride (ostride Hkv or 1,
 * hstride 1 or B). Ragged K/V is NHD with B = 1 and block = kv_start + j.
 * j / B comes from a double-precision reciprocal with one correction step
 * (exact for j, B < 2^31), so non-power-of-two block sizes cost no divide.
 */
typedef struct key_addr {
    int64_t bstride, ostride, hoff;
    double inv_b;
} key_addr;

__device__ __forceinline__ int64_t key_row(const attn_args &a, const key_addr &ka,
                                           const int32_t *bt_row, int64_t kvs, int32_t j)
{
    int32_t blk = (int32_t)((double)j * ka.inv_b);
    int32_t off = j - blk * a.B;
    blk = off >= a.B ? blk + 1 : blk;
    off = off >= a.B ? off - a.B : off;
    blk = off < 0 ? blk - 1 : blk;
    off = off < 0 ? off + a.B : off;
    const int64_t block = a.ragged ? kvs + blk : (int64_t)__ldg(bt_row + blk);
    return block * ka.bstride + off * ka.ostride + ka.hoff;
}

/* Issues the 16-byte K and V loads of the U keys kb + u*KPW + g (zeros for
 * keys >= kend, whose block-table read is clamped to key kend - 1). */
template <typename T, int LK, int NCH, int U>
__device__ __forceinline__ void
issue_kv(const attn_args &a, const key_addr &ka, const int32_t *bt_row, int64_t kvs, int32_t kb,
         int g, int li, int32_t kend, uint4 (&kr)[U][NCH], uint4 (&vr)[U][NCH])
{
    constexpr int VEC = vec_of<T>::n;
    constexpr int KPW = 32 / LK;
    const T *kp = (const T *)a.k;
    const T *vp = (const T *)a.v;
    int64_t row[U];
    bool ok[U];
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int32_t j = kb + u * KPW + g;
        ok[u] = j < kend;
        row[u] = key_row(a, ka, bt_row, kvs, ok[u] ? j : kend - 1);
    }
#pragma unroll
    for (int u = 0; u < U; u++) {
#pragma unroll
        for (int c = 0; c < NCH; c++) {
            const int d0 = (li + c * LK) * VEC;
            kr[u][c] = make_uint4(0, 0, 0, 0);
            vr[u][c] = make_uint4(0, 0, 0, 0);
            if (ok[u] && d0 < a.D)
                kr[u][c] = ldg16(kp + row[u] * a.D + d0);
            if (ok[u] && d0 < a.Dv)
                vr[u][c] = ldg16(vp + row[u] * a.Dv + d0);
        }
    }
}

/* ---- cp.async (sm_80+) ---- */

#define KVA_STAGES 4 /* v2: steps in flight per warp */

/* 16-byte global -> shared copy; src_bytes 0 writes zeros and reads nothing. */
__device__ __forceinline__ void cp_async16(void *smem, const void *gmem, int src_bytes)
{
    const unsigned dst = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem),
                 "r"(src_bytes)
                 : "memory");
}
__device__ __forceinline__ void cp_async_commit()
{
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N> __device__ __forceinline__ void cp_async_wait()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/* v2's issue_kv: the same chunks as issue_kv, copied into the lane's slots of
 * one ring stage (slot (u, c, K/V) at stage + ((u*NCH + c)*2 + kv)*32). */
template <typename T, int LK, int NCH, int U>
__device__ __forceinline__ void issue_async(const attn_args &a, const key_addr &ka,
                                            const int32_t *bt_row, int64_t kvs, int32_t kb, int g,
                                            int li, int32_t kend, uint4 *stage)
{
    constexpr int VEC = vec_of<T>::n;
    constexpr int KPW = 32 / LK;
    const T *kp = (const T *)a.k;
    const T *vp = (const T *)a.v;
    int64_t row[U];
    bool ok[U];
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int32_t j = kb + u * KPW + g;
        ok[u] = j < kend;
        row[u] = key_row(a, ka, bt_row, kvs, ok[u] ? j : kend - 1);
    }
#pragma unroll
    for (int u = 0; u < U; u++) {
#pragma unroll
        for (int c = 0; c < NCH; c++) {
            const int d0 = (li + c * LK) * VEC;
            const bool kok = ok[u] && d0 < a.D, vok = ok[u] && d0 < a.Dv;
            cp_async16(stage + ((u * NCH + c) * 2) * 32, kok ? kp + row[u] * a.D + d0 : kp,
                       kok ? 16 : 0);
            cp_async16(stage + ((u * NCH + c) * 2 + 1) * 32, vok ? vp + row[u] * a.Dv + d0 : vp,
                       vok ? 16 : 0);
        }
    }
}

/*
 * One step of the key loop for one lane: the U keys kb + u*KPW + g whose K and
 * V chunks are in kr/vr update the online-softmax state (m, l, acc) of every
 * row. Shared by both load paths, which differ only in how kr/vr are loaded.
 */
template <typename T, int LK, int NCH, int ROWS, int U>
__device__ __forceinline__ void
attend_step(const attn_args &a, int32_t kb, int g, const uint4 (&kr)[U][NCH],
            const uint4 (&vr)[U][NCH], const float (&q)[ROWS][NCH][vec_of<T>::n],
            const int32_t (&lo)[ROWS], const int32_t (&hi)[ROWS], const int32_t (&pos)[ROWS],
            const float (&slope)[ROWS], int32_t lo_all, int32_t hi_all, const kva__cuda_tree &tree,
            float (&m)[ROWS], float (&l)[ROWS], float (&acc)[ROWS][NCH][vec_of<T>::n])
{
    constexpr int VEC = vec_of<T>::n;
    constexpr int KPW = 32 / LK;
    const float scale_log2 = a.scale * KVA_LOG2E;
    /* Raw scores of the U keys for every row (reduced over the group). */
    float sc[U][ROWS];
#pragma unroll
    for (int u = 0; u < U; u++) {
        float kf[NCH][VEC];
#pragma unroll
        for (int c = 0; c < NCH; c++)
            to_float(kr[u][c], kf[c], (const T *)nullptr);
#pragma unroll
        for (int r = 0; r < ROWS; r++) {
            float dot = 0.f;
#pragma unroll
            for (int c = 0; c < NCH; c++)
#pragma unroll
                for (int e = 0; e < VEC; e++)
                    dot = fmaf(q[r][c][e], kf[c][e], dot);
#pragma unroll
            for (int o = LK / 2; o >= 1; o >>= 1)
                dot += __shfl_xor_sync(0xffffffffu, dot, o);
            sc[u][r] = dot;
        }
    }
    /* Scale (or soft-cap) into base-2 logits: one uniform branch. */
    if (a.softcap > 0.f) {
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int r = 0; r < ROWS; r++)
                sc[u][r] = a.softcap * tanhf(sc[u][r] * a.scale / a.softcap) * KVA_LOG2E;
    } else {
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int r = 0; r < ROWS; r++)
                sc[u][r] *= scale_log2;
    }
    /* ALiBi and the mask (both skipped when they cannot matter: no
     * slopes; every key of this warp's step visible to every row). */
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
#pragma unroll
        for (int c = 0; c < NCH; c++)
#pragma unroll
            for (int e = 0; e < VEC; e++)
                acc[r][c][e] *= corr;
    }
#pragma unroll
    for (int u = 0; u < U; u++) {
        float vf[NCH][VEC];
#pragma unroll
        for (int c = 0; c < NCH; c++)
            to_float(vr[u][c], vf[c], (const T *)nullptr);
#pragma unroll
        for (int r = 0; r < ROWS; r++)
#pragma unroll
            for (int c = 0; c < NCH; c++)
#pragma unroll
                for (int e = 0; e < VEC; e++)
                    acc[r][c][e] = fmaf(sc[u][r], vf[c][e], acc[r][c][e]);
    }
}

/*
 * T: element type of q, K/V and out. LK: lanes per key row; NCH: 16-byte
 * chunks per lane (LK*NCH*VEC >= max(D, Dv)); ROWS: attention rows per CTA.
 */
#include "attn_xpose.cuh"
#include "simt_merge.cuh"

/* RING: loads through the cp.async ring, plus the transposing reduction of
 * attn_xpose.cuh where U*ROWS >= LK (f16/bf16); else the register pipeline
 * (f32). */
template <typename T> struct simt_ring {
    static constexpr bool on = vec_of<T>::n == 8;
};

template <typename T, int LK, int NCH, int ROWS>
__global__ void __launch_bounds__(KVA_NW * 32, simt_ring<T>::on &&ROWS == 4 ? 3 : 2)
    attn_kernel(attn_args a)
{
    constexpr bool ASYNC = simt_ring<T>::on;
    constexpr int VEC = vec_of<T>::n;
    constexpr int KPW = 32 / LK;        /* keys per warp and step */
    constexpr int U = NCH == 1 ? 4 : 2; /* keys per group per iteration */
    constexpr int DC = LK * NCH * VEC;  /* channels covered */
    constexpr bool XPOSE = ASYNC && U * ROWS >= LK;
    constexpr int XM = XPOSE ? U * ROWS / LK : 1;
    __shared__ float s_acc[KVA_NW][ROWS][DC];
    __shared__ float s_m[KVA_NW][ROWS], s_l[KVA_NW][ROWS];
    extern __shared__ uint4 s_ring[]; /* ASYNC: [NW][STAGES][U][NCH][K/V][32 lanes] */

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane / LK, li = lane % LK;
    const int32_t n_items = a.meta.hdr[KVA_CUDA_HDR_ITEMS];
    const int32_t tree_on = a.meta.hdr[KVA_CUDA_HDR_TREE]; /* tree_mask.cuh */
    const int32_t bt_stride = a.meta.hdr[KVA_CUDA_HDR_BT_STRIDE];
    const T *qp = (const T *)a.q;

    for (int32_t it = blockIdx.x; it < n_items; it += gridDim.x) {
        const kva__cuda_item w = a.meta.items[it];
        const int32_t nrows = w.nq * w.nh;
        const int32_t qs = a.meta.qsl[w.req];
        const int32_t q_len = a.meta.qsl[w.req + 1] - qs;
        const int32_t s = a.meta.seq_lens[w.req];
        const kva__cuda_tree tree = kva__cuda_tree_at(a.meta.tree, tree_on, qs, s, q_len);
        const int32_t *bt_row =
            a.ragged ? nullptr : a.meta.block_table + (int64_t)w.req * bt_stride;
        const int64_t kvs = a.ragged ? a.meta.kv_start[w.req] : 0;

        /* Per row: query vector chunk, visible key range, ALiBi slope and position. */
        float q[ROWS][NCH][VEC];
        int32_t lo[ROWS], hi[ROWS], pos[ROWS];
        float slope[ROWS];
#pragma unroll
        for (int r = 0; r < ROWS; r++) {
            lo[r] = 0;
            hi[r] = 0;
            pos[r] = 0;
            slope[r] = 0.f;
#pragma unroll
            for (int c = 0; c < NCH; c++)
#pragma unroll
                for (int e = 0; e < VEC; e++)
                    q[r][c][e] = 0.f;
            if (r < nrows) {
                const int32_t qi = r / w.nh, hh = r - qi * w.nh;
                const int32_t head = w.kv_head * a.G + w.h0 + hh;
                const int32_t i = w.i0 + qi;
                int32_t p, h_, l_;
                kva__cuda_row_keys(a.meta, a.causal, a.window_left, a.chunk, w.req, s, q_len, i, l_,
                                   h_, p);
                lo[r] = l_ > w.k0 ? l_ : w.k0;
                hi[r] = h_ < w.k1 ? h_ : w.k1;
                pos[r] = p;
                if (a.has_alibi)
                    slope[r] = a.meta.alibi[head] * KVA_LOG2E;
                const T *qrow = qp + ((int64_t)(qs + i) * a.H + head) * a.D;
#pragma unroll
                for (int c = 0; c < NCH; c++) {
                    const int d0 = (li + c * LK) * VEC;
                    if (d0 < a.D)
                        to_float(ldg16(qrow + d0), q[r][c], (const T *)nullptr);
                }
            }
        }

        float m[ROWS], l[ROWS], acc[ROWS][NCH][VEC];
#pragma unroll
        for (int r = 0; r < ROWS; r++) {
            m[r] = -INFINITY;
            l[r] = 0.f;
#pragma unroll
            for (int c = 0; c < NCH; c++)
#pragma unroll
                for (int e = 0; e < VEC; e++)
                    acc[r][c][e] = 0.f;
        }

        const int32_t kend = w.k1;
        /* Keys every real row sees: steps inside [lo_all, hi_all) skip the mask. */
        int32_t lo_all = 0, hi_all = kend;
#pragma unroll
        for (int r = 0; r < ROWS; r++) {
            if (r < nrows) {
                lo_all = lo[r] > lo_all ? lo[r] : lo_all;
                hi_all = hi[r] < hi_all ? hi[r] : hi_all;
            }
        }
        hi_all = hi_all < tree.t0 ? hi_all : tree.t0; /* tree keys: masked steps */
        key_addr ka;
        ka.bstride = (int64_t)a.B * a.Hkv;
        ka.ostride = a.layout_hnd ? 1 : a.Hkv;
        ka.hoff = a.layout_hnd ? (int64_t)w.kv_head * a.B : w.kv_head;
        ka.inv_b = 1.0 / (double)a.B;
        constexpr int STEP = KVA_NW * U * KPW;
        const int32_t kb0 = w.k0 + warp * (U * KPW);
        if constexpr (!ASYNC) {
            /* v1: the loads of the next step go to registers and are in
             * flight while the current step is computed. */
            uint4 kr[U][NCH], vr[U][NCH];
            issue_kv<T, LK, NCH, U>(a, ka, bt_row, kvs, kb0, g, li, kend, kr, vr);
            for (int32_t kb = kb0; kb < kend; kb += STEP) {
                uint4 kn[U][NCH], vn[U][NCH];
                issue_kv<T, LK, NCH, U>(a, ka, bt_row, kvs, kb + STEP, g, li, kend, kn, vn);
                attend_step<T, LK, NCH, ROWS, U>(a, kb, g, kr, vr, q, lo, hi, pos, slope, lo_all,
                                                 hi_all, tree, m, l, acc);
#pragma unroll
                for (int u = 0; u < U; u++)
#pragma unroll
                    for (int c = 0; c < NCH; c++) {
                        kr[u][c] = kn[u][c];
                        vr[u][c] = vn[u][c];
                    }
            }
        } else {
            /* v2: cp.async into a ring of KVA_STAGES steps in shared memory,
             * private to the lane (each lane reads back only the 16-byte chunks
             * it copied, so wait_group alone orders the accesses). */
            uint4 *ring = s_ring + (size_t)warp * KVA_STAGES * U * NCH * 2 * 32 + lane;
            xpose_rows<XM> xr;
            if constexpr (XPOSE)
                xpose_rows_init<ROWS, XM>(xr, li, lo, hi, pos, slope);
#pragma unroll
            for (int st = 0; st < KVA_STAGES - 1; st++) {
                issue_async<T, LK, NCH, U>(a, ka, bt_row, kvs, kb0 + st * STEP, g, li, kend,
                                           ring + st * (U * NCH * 2 * 32));
                cp_async_commit();
            }
            int stage = 0;
            for (int32_t kb = kb0; kb < kend; kb += STEP) {
                const int ahead = stage == 0 ? KVA_STAGES - 1 : stage - 1;
                issue_async<T, LK, NCH, U>(a, ka, bt_row, kvs, kb + (KVA_STAGES - 1) * STEP, g, li,
                                           kend, ring + ahead * (U * NCH * 2 * 32));
                cp_async_commit();
                cp_async_wait<KVA_STAGES - 1>();
                const uint4 *cur = ring + stage * (U * NCH * 2 * 32);
                uint4 kr[U][NCH], vr[U][NCH];
#pragma unroll
                for (int u = 0; u < U; u++)
#pragma unroll
                    for (int c = 0; c < NCH; c++) {
                        kr[u][c] = cur[((u * NCH + c) * 2) * 32];
                        vr[u][c] = cur[((u * NCH + c) * 2 + 1) * 32];
                    }
                if constexpr (XPOSE)
                    attend_step_x<T, LK, NCH, ROWS, U>(a, kb, g, li, kr, vr, q, xr, lo_all, hi_all,
                                                       tree, m, l, acc);
                else
                    attend_step<T, LK, NCH, ROWS, U>(a, kb, g, kr, vr, q, lo, hi, pos, slope,
                                                     lo_all, hi_all, tree, m, l, acc);
                stage = stage == KVA_STAGES - 1 ? 0 : stage + 1;
            }
            cp_async_wait<0>(); /* nothing may land in the ring after the item */
        }

        /* Merge the groups of each warp, then the warps; element (r, d) per thread. */
        kva__simt_merge_groups<LK, ROWS, NCH, VEC>(m, l, acc);
        kva__simt_store_warp<LK, ROWS, NCH, VEC, KVA_NW, DC>(warp, g, li, m, l, acc, s_acc, s_m,
                                                             s_l);
        __syncthreads();
        for (int32_t x = threadIdx.x; x < nrows * a.Dv; x += blockDim.x) {
            const int32_t r = x / a.Dv, d = x - r * a.Dv;
            float M, mu, L, O;
            kva__simt_combine<KVA_NW, ROWS, DC>(s_m, s_l, s_acc, r, d, &M, &mu, &L, &O);
            const int32_t qi = r / w.nh, hh = r - qi * w.nh;
            const int32_t head = w.kv_head * a.G + w.h0 + hh;
            const int64_t tok = qs + w.i0 + qi;
            if (w.task >= 0) {
                const kva__cuda_task t = a.meta.tasks[w.task];
                kva__simt_write_partial(a.ws + t.ws_off + (int64_t)w.split * nrows * (a.Dv + 1),
                                        nrows, a.Dv, r, d, mu, L, O);
            } else {
                const float o = kva__simt_finish(M, mu, L, O, a.sinks ? a.sinks + head : NULL, d,
                                                 a.lse ? a.lse + tok * a.H + head : NULL);
                store_elem((T *)a.out, (size_t)((tok * a.H + head) * a.Dv + d), o);
            }
        }
        __syncthreads();
    }
}

/* ---- dispatch ---- */

extern "C" int kva__cuda_rows_for_group(int32_t group)
{
    return group <= 4 ? 4 : 8;
}

typedef void (*attn_kernel_fn)(attn_args);

/* A kernel instantiation and its dynamic shared memory (the ring). */
typedef struct attn_launch {
    attn_kernel_fn fn;
    size_t smem;
} attn_launch;

template <typename T, int LK, int NCH, int ROWS> static attn_launch make()
{
    constexpr int U = NCH == 1 ? 4 : 2;
    attn_launch k = {attn_kernel<T, LK, NCH, ROWS>,
                     simt_ring<T>::on ? (size_t)KVA_NW * KVA_STAGES * U * NCH * 2 * 32 * 16 : 0};
    return k;
}

/* The instantiation for element type T covering dmax channels with `rows`
 * (f16/bf16: 8 elements per 16 bytes, so 32 lanes cover D = 256 with one
 * chunk; f32 needs two chunks per lane past D = 128). */
template <typename T, int ROWS> static attn_launch pick_rows(int32_t dmax)
{
    constexpr int VEC = vec_of<T>::n;
    const int chunks = (dmax + VEC - 1) / VEC;
    if (chunks <= 8)
        return make<T, 8, 1, ROWS>();
    if (chunks <= 16)
        return make<T, 16, 1, ROWS>();
    if constexpr (VEC == 8)
        return make<T, 32, 1, ROWS>();
    else {
        if (chunks <= 32)
            return make<T, 32, 1, ROWS>();
        return make<T, 32, 2, ROWS>();
    }
}

template <typename T> static attn_launch pick(int32_t dmax, int rows)
{
    return rows <= 4 ? pick_rows<T, 4>(dmax) : pick_rows<T, 8>(dmax);
}

static attn_launch pick_kernel(kva_dtype dt, int32_t dmax, int rows)
{
    if (dt == KVA_DTYPE_F32)
        return pick<float>(dmax, rows);
    if (dt == KVA_DTYPE_F16)
        return pick<__half>(dmax, rows);
    return pick<__nv_bfloat16>(dmax, rows);
}

extern "C" int kva__cuda_simt_ctas_per_sm(kva_dtype dtype, int32_t dmax, int rows)
{
    attn_launch k = pick_kernel(dtype, dmax, rows);
    int n = 0;
    if (k.smem > 48 * 1024 &&
        cudaFuncSetAttribute(k.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)k.smem) !=
            cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, k.fn, KVA_NW * 32, k.smem) !=
        cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return n;
}

extern "C" kva_status kva__cuda_simt_launch(const kva__cuda_attn_args *a, kva_dtype dtype, int rows,
                                            int grid, void *stream)
{
    const int32_t dmax = a->D > a->Dv ? a->D : a->Dv;
    attn_launch kl = pick_kernel(dtype, dmax, rows);
    kl.fn<<<grid, KVA_NW * 32, kl.smem, (cudaStream_t)stream>>>(*a);
    KVA_CUDA_LAUNCHED("attn_kernel");
    return KVA_STATUS_OK;
}
