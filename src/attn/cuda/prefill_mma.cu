/*
 * prefill_mma.cu - the mma.sync prefill (prefill_mma_kernel.cuh, the one
 * body; docs/cuda-prefill.md) over f16 / bf16 caches: its 16-bit load
 * policy, and the host side of every prefill kernel: the tile list (heaviest
 * tiles first, in L2-sized sections), shape support, the kernel choice
 * (mma.sync or the sm_90a wgmma kernel, prefill_wgmma.cu) and the launch.
 *
 * One configuration per head size (mma_cfg below): D 128 runs 4 warps x 32
 * rows (two m16 tiles per warp, so each K/V fragment read from shared memory
 * feeds two mma; O takes D fp32 registers per thread), D 64 and D 256 run 8
 * warps x 16 rows (O is 16 x D per warp, D / 2 registers per thread; D 256
 * with 32 keys per tile and one CTA per SM). This is the portable prefill
 * (sm_80 and later); on sm_90a the wgmma kernel takes D 128.
 */
extern "C" {
#include "internal.h"
}
#include "mma_ptx.cuh"
#include "prefill_mma.h"
#include "prefill_mma_kernel.cuh"
#include "sort_inline.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define TILE_M KVA__CUDA_PREFILL_TILE_M

/* ------------------------------------------------------------------------ */
/* The 16-bit load policy (prefill_mma_kernel.cuh)                           */
/* ------------------------------------------------------------------------ */

/* The configuration per head size: {BN keys per tile, NW warps, WM m16 tiles
 * per warp, MINB CTAs per SM}. */
template <int D> struct mma_cfg;
template <> struct mma_cfg<64> {
    enum { BN = 64, NW = 8, WM = 1, MINB = 2 };
};
template <> struct mma_cfg<128> {
    enum { BN = 64, NW = 4, WM = 2, MINB = 1 };
};
template <> struct mma_cfg<256> {
    enum { BN = 32, NW = 8, WM = 1, MINB = 1 };
};

/*
 * f16 / bf16 K and V (Ty: kva__mma_bf16 or kva__mma_f16, also q's and
 * out's dtype). Q is copied with cp.async (its group joins the first key
 * tile's); K and V tiles are gathered straight into their swizzled stages.
 * Dynamic shared memory: Q [TILE_M, D], then K [2][BN, D], V [2][BN, D].
 */
template <int D_, typename Ty_> struct pf16_policy {
    typedef mma_cfg<D_> C;
    typedef kva__cuda_prefill_args Args;
    typedef Ty_ Ty;
    typedef Ty_ TyS;
    typedef Ty_ TyP;
    typedef typename Ty_::elem elem;
    static constexpr int D = D_, BN = C::BN, NW = C::NW, WM = C::WM, MINB = C::MINB;
    static constexpr int SQ = TILE_M * D * 2;
    static constexpr int SMEM = (TILE_M + 4 * BN) * D * 2;
    static constexpr bool KV_FIRST = false, CONVERT = false, LO = false;
    static constexpr int NT = NW * 32;
    static constexpr int CPR = D / 8; /* 16-byte chunks per row */
    /* A thread copies KV_ITERS rows lrow + k * KV_RPP of a key tile, one
     * 16-byte chunk lch each. */
    static constexpr int KV_RPP = NT / CPR;
    static constexpr int KV_ITERS = BN * CPR / NT;
    static_assert(NT % CPR == 0 && (BN * CPR) % NT == 0, "copy shape");
    struct Blocks {
        int k[KV_ITERS];
    };

    const Args &a;
    const kva__pf_tile &t;
    uint32_t sQ, sK, sV;
    int lrow, lch, head_off; /* head_off: the tile's, plus this thread's chunk */

    static __device__ __forceinline__ const Args &attn(const Args &q)
    {
        return q;
    }
    __device__ __forceinline__ pf16_policy(const Args &q, const kva__pf_tile &tt,
                                           unsigned char *smem)
        : a(q), t(tt)
    {
        sQ = kva__smem_u32(smem);
        sK = sQ + SQ;
        sV = sK + 2 * BN * D * 2;
        lrow = (int)threadIdx.x / CPR;
        lch = (int)threadIdx.x % CPR;
        head_off = t.head_off + lch * 8;
    }
    static __device__ __forceinline__ void clear(Blocks &b)
    {
#pragma unroll
        for (int k = 0; k < KV_ITERS; k++)
            b.k[k] = 0;
    }
    /* Q rows m0 .. m0 + TILE_M of the packed (token, head) rows. */
    __device__ __forceinline__ void stage_q() const
    {
        const elem *q = (const elem *)a.q;
        for (int idx = (int)threadIdx.x; idx < TILE_M * CPR; idx += NT) {
            const int row = idx / CPR, ch = idx % CPR;
            const int pm = t.m0 + row;
            const elem *src = q;
            int bytes = 0;
            if (pm < t.rows) {
                const int i = pm / t.G, g = pm - (pm / t.G) * t.G;
                src = q + ((size_t)(t.q_start + i) * t.H + (size_t)t.kvh * t.G + g) * D + ch * 8;
                bytes = 16;
            }
            kva__cp_async16(sQ + kva__swz<D>(row, ch), src, bytes);
        }
    }
    __device__ __forceinline__ void blocks(int n0, Blocks &b) const
    {
#pragma unroll
        for (int k = 0; k < KV_ITERS; k++)
            b.k[k] = t.key_block(n0 + lrow + k * KV_RPP);
    }
    __device__ __forceinline__ void copy(int st, int n0, const Blocks &b) const
    {
        const elem *kc = (const elem *)a.k, *vc = (const elem *)a.v;
#pragma unroll
        for (int k = 0; k < KV_ITERS; k++) {
            const int row = lrow + k * KV_RPP, j = n0 + row;
            const int o = t.key_slot(j);
            const bool in = t.key_in(j);
            const int64_t off =
                in ? (int64_t)b.k[k] * t.blk_stride + (o * t.row_stride + head_off) : 0;
            const uint32_t so = (uint32_t)st * BN * D * 2 + kva__swz<D>(row, lch);
            kva__cp_async16(sK + so, kc + off, in ? 16 : 0);
            kva__cp_async16(sV + so, vc + off, in ? 16 : 0);
        }
    }
    __device__ __forceinline__ void q_ready(int, int) const {}
    __device__ __forceinline__ void convert(int) const {}
    __device__ __forceinline__ uint32_t k_tile(int st) const
    {
        return sK + (uint32_t)st * BN * D * 2;
    }
    __device__ __forceinline__ uint32_t v_tile(int st) const
    {
        return sV + (uint32_t)st * BN * D * 2;
    }
    __device__ __forceinline__ void scores(float (*)[BN / 8][4], int, int) const {}
    __device__ __forceinline__ void vfix(int, float, float &, float &) const {}
};

/* ------------------------------------------------------------------------ */
/* Host side                                                                 */
/* ------------------------------------------------------------------------ */

extern "C" int kva__cuda_prefill_supported(int32_t head_dim, int32_t head_dim_v, kva_dtype dtype)
{
    if (dtype != KVA_DTYPE_BF16 && dtype != KVA_DTYPE_F16)
        return 0;
    return kva__cuda_prefill_kernel_exists(head_dim, head_dim_v, KVA__CUDA_PREFILL_MMA) ||
           kva__cuda_prefill_kernel_exists(head_dim, head_dim_v, KVA__CUDA_PREFILL_WGMMA);
}

extern "C" int64_t kva__cuda_prefill_tiles_count_subset(int32_t num_requests,
                                                        const int32_t *query_start_loc,
                                                        const uint8_t *use_req, int32_t num_heads,
                                                        int32_t num_kv_heads)
{
    if (num_requests < 0 || !query_start_loc || num_heads <= 0 || num_kv_heads <= 0 ||
        num_heads % num_kv_heads)
        return -1;
    const int64_t G = num_heads / num_kv_heads;
    int64_t n = 0;
    for (int32_t r = 0; r < num_requests; r++) {
        const int64_t q_len = (int64_t)query_start_loc[r + 1] - query_start_loc[r];
        if (q_len < 0 || q_len * G > INT32_MAX)
            return -1; /* packed row indices (m0) are int32 */
        if (use_req && !use_req[r])
            continue;
        n += (q_len * G + TILE_M - 1) / TILE_M * num_kv_heads;
        if (n > INT32_MAX)
            return -1;
    }
    return n;
}

/* A (request, m0) entry and its estimated cost, for the heaviest-first sort. */
typedef struct tile_cost {
    int64_t cost;
    int32_t index; /* position in build order, the tie-break (stable sort) */
    int32_t r, m0;
} tile_cost;

/* The tile list's order: heaviest first, ties in build order (a total
 * order: index is unique). */
static inline int tile_before(const tile_cost *x, const tile_cost *y)
{
    return x->cost != y->cost ? x->cost > y->cost : x->index < y->index;
}

/* The sort of a section's entries (sort_inline.h): qsort's indirect
 * comparisons were most of the tile list's host time
 * (bench/results/h100_2026-11-27_pf4.txt). */
KVA__DEFINE_SORT(tile_sort, tile_cost, tile_before, 8)

/* A section's part of one request: its kv heads h0 .. h1 - 1. */
typedef struct tile_group {
    int32_t r, h0, h1;
} tile_group;

/*
 * Sections (section_keys > 0): the (request, kv head) groups are dealt, the
 * requests in order of their heaviest tile (longest first), into consecutive
 * sections whose groups together read at most section_keys keys (a group
 * reads its request's seq_len keys; a section holds at least one group), and
 * the tiles are listed section after section, heaviest first within each.
 * The tiles of one section run at about the same time and reread the same
 * K/V, so with the section's K/V inside the L2 cache each K/V tile comes from
 * DRAM about once (32 x 256 at GQA 4: every kv head's K/V is read by 8 query
 * tiles). section_keys <= 0: one section (heaviest first over the batch).
 */
extern "C" kva_status kva__cuda_prefill_tiles_build_sections(
    int32_t num_requests, const int32_t *query_start_loc, const int32_t *seq_lens,
    const uint8_t *use_req, int32_t num_heads, int32_t num_kv_heads, int32_t causal,
    int32_t window_left, int32_t attention_chunk, int64_t section_keys, int32_t *tiles,
    int32_t capacity, int32_t *num_tiles)
{
    KVA_CHECK_PTR(query_start_loc);
    KVA_CHECK_PTR(num_tiles);
    if (num_requests > 0)
        KVA_CHECK_PTR(seq_lens);
    const int64_t count = kva__cuda_prefill_tiles_count_subset(num_requests, query_start_loc,
                                                               use_req, num_heads, num_kv_heads);
    if (count < 0)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "%s: bad batch (num_requests = %d, num_heads = %d, num_kv_heads = %d, "
                         "or a negative q_len)",
                         __func__, (int)num_requests, (int)num_heads, (int)num_kv_heads);
    if (count > capacity)
        return kva__fail(KVA_STATUS_OUT_OF_RANGE, "%s: the batch needs %lld tiles, capacity = %d",
                         __func__, (long long)count, (int)capacity);
    if (count > 0)
        KVA_CHECK_PTR(tiles);
    const int64_t G = num_heads / num_kv_heads;
    const int32_t window = window_left < KVA_MAX_SEQ_LEN ? window_left : -1;
    const int32_t R = num_requests > 0 ? num_requests : 0;
    /* One entry per (request, m0), each expanding to one tile per kv head of
     * its section; per request its first entry, entry count and heaviest cost;
     * the section's entries; the groups. */
    const size_t ne = (size_t)(count > 0 ? count : 1);
    tile_cost *tc = (tile_cost *)malloc(sizeof(tile_cost) * 3 * ne);
    int64_t *rq = (int64_t *)malloc(sizeof(int64_t) * 3 * (size_t)(R + 1));
    tile_group *grp = (tile_group *)malloc(sizeof(tile_group) * (size_t)(R + 1));
    int32_t *order = (int32_t *)malloc(sizeof(int32_t) * (size_t)(R + 1));
    if (!tc || !rq || !grp || !order) {
        free(tc);
        free(rq);
        free(grp);
        free(order);
        return kva__fail(KVA_STATUS_OUT_OF_MEMORY, "%s: %lld tiles", __func__, (long long)count);
    }
    tile_cost *sec = tc + ne, *tmp = tc + 2 * ne; /* tmp: tile_sort's */
    int64_t *first = rq, *nent = rq + (R + 1), *heavy = rq + 2 * (R + 1);
    int32_t n = 0, nr = 0;
    for (int32_t r = 0; r < R; r++) {
        const int64_t q_len = (int64_t)query_start_loc[r + 1] - query_start_loc[r];
        const int64_t s = seq_lens[r];
        first[r] = n;
        nent[r] = 0;
        heavy[r] = 0;
        if ((use_req && !use_req[r]) || q_len <= 0)
            continue;
        for (int64_t m0 = 0; m0 < q_len * G; m0 += TILE_M) {
            const int64_t m_last = (m0 + TILE_M < q_len * G ? m0 + TILE_M : q_len * G) - 1;
            const int64_t pmin = s - q_len + m0 / G, pmax = s - q_len + m_last / G;
            const int64_t lo = kva__first_key((int32_t)pmin, window, attention_chunk);
            int64_t hi = causal ? pmax + 1 : s;
            hi = hi > s ? s : hi;
            tc[n].cost = (hi > lo ? hi - lo : 0) + 64; /* + fixed cost: Q load, epilogue */
            tc[n].index = n;
            tc[n].r = r;
            tc[n].m0 = (int32_t)m0;
            heavy[r] = tc[n].cost > heavy[r] ? tc[n].cost : heavy[r];
            n++;
        }
        nent[r] = n - first[r];
        order[nr++] = r;
    }
    /* With sections, requests by their heaviest tile, longest first
     * (insertion sort, stable: a batch has few prefills). */
    for (int32_t i = 1; section_keys > 0 && i < nr; i++) {
        const int32_t r = order[i];
        int32_t j = i;
        while (j > 0 && heavy[order[j - 1]] < heavy[r]) {
            order[j] = order[j - 1];
            j--;
        }
        order[j] = r;
    }
    int32_t w = 0, oi = 0, h = 0;
    while (oi < nr) {
        /* Groups of the next section: whole requests' kv heads h0 .. h1 - 1
         * while their keys fit section_keys (at least one group). */
        int32_t ng = 0;
        int64_t keys = 0;
        while (oi < nr) {
            const int32_t r = order[oi];
            const int64_t s = seq_lens[r] > 0 ? seq_lens[r] : 1;
            int32_t fit = num_kv_heads - h;
            if (section_keys > 0) {
                const int64_t room = (section_keys - keys) / s;
                fit = room < fit ? (int32_t)room : fit;
                if (fit < 1 && (ng > 0 || keys > 0))
                    break;
                fit = fit < 1 ? 1 : fit;
            }
            grp[ng].r = r;
            grp[ng].h0 = h;
            grp[ng].h1 = h + fit;
            ng++;
            keys += (int64_t)fit * s;
            h += fit;
            if (h == num_kv_heads) {
                h = 0;
                oi++;
            }
            if (section_keys > 0 && keys >= section_keys)
                break;
        }
        /* The section's entries, heaviest first, each expanded to its heads. */
        int32_t m = 0;
        for (int32_t g = 0; g < ng; g++)
            for (int64_t e = 0; e < nent[grp[g].r]; e++) {
                sec[m] = tc[first[grp[g].r] + e];
                sec[m].index = m; /* the tie-break: group order, then m0 */
                sec[m].r = g;     /* the group, for its kv heads */
                m++;
            }
        tile_sort(sec, tmp, m);
        for (int32_t e = 0; e < m; e++) {
            const tile_group *gr = &grp[sec[e].r];
            for (int32_t kh = gr->h0; kh < gr->h1; kh++) {
                int32_t *t = tiles + (size_t)w * KVA__CUDA_PREFILL_TILE_INTS;
                t[0] = gr->r;
                t[1] = sec[e].m0;
                t[2] = kh;
                t[3] = 0;
                w++;
            }
        }
    }
    free(tc);
    free(rq);
    free(grp);
    free(order);
    *num_tiles = w;
    return KVA_STATUS_OK;
}

template <typename Ty>
static kva_status launch_dtype(const kva__cuda_prefill_args *a, cudaStream_t st)
{
    const char *who = "kva__cuda_prefill_launch_kernel";
    switch (a->head_dim) {
    case 64:
        return kva__pf_launch<pf16_policy<64, Ty>>(*a, a->grid_tiles, st, who);
    case 128:
        return kva__pf_launch<pf16_policy<128, Ty>>(*a, a->grid_tiles, st, who);
    default:
        return kva__pf_launch<pf16_policy<256, Ty>>(*a, a->grid_tiles, st, who);
    }
}

extern "C" int kva__cuda_prefill_kernel_exists(int32_t head_dim, int32_t head_dim_v,
                                               kva__cuda_prefill_kernel kernel)
{
    switch (kernel) {
    case KVA__CUDA_PREFILL_MMA:
        return head_dim == head_dim_v && (head_dim == 64 || head_dim == 128 || head_dim == 256);
    case KVA__CUDA_PREFILL_WGMMA:
    case KVA__CUDA_PREFILL_WGMMA_TMA:
        return kva__cuda_prefill_wgmma_dims(head_dim, head_dim_v) &&
               kva__cuda_prefill_wgmma_ready();
    default:
        return 0;
    }
}

/* TMA loads of the wgmma kernel pay from B 16 up (B a power of two, NB known:
 * the tensor maps describe the whole cache); below, the cp.async gather of
 * KVA__CUDA_PREFILL_WGMMA is faster. */
static int tma_pays(int32_t block_size, int32_t num_blocks)
{
    return num_blocks > 0 && block_size >= 16 && (block_size & (block_size - 1)) == 0;
}

extern "C" kva__cuda_prefill_kernel kva__cuda_prefill_kernel_default(int32_t head_dim,
                                                                     int32_t head_dim_v,
                                                                     int32_t block_size,
                                                                     int32_t num_blocks)
{
    if (kva__cuda_prefill_wgmma_dims(head_dim, head_dim_v) && kva__cuda_prefill_wgmma_ready())
        return tma_pays(block_size, num_blocks) ? KVA__CUDA_PREFILL_WGMMA_TMA
                                                : KVA__CUDA_PREFILL_WGMMA;
    return KVA__CUDA_PREFILL_MMA;
}

extern "C" kva_status kva__cuda_prefill_check(const kva__cuda_prefill_args *a, const char *fn)
{
    if (a->grid_tiles < 0)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT, "%s: grid_tiles = %d", fn,
                         (int)a->grid_tiles);
    if (a->grid_tiles == 0)
        return KVA_STATUS_OK;
    KVA_CHECK_PTR(a->q);
    KVA_CHECK_PTR(a->k);
    KVA_CHECK_PTR(a->v);
    KVA_CHECK_PTR(a->out);
    KVA_CHECK_PTR(a->query_start_loc);
    KVA_CHECK_PTR(a->seq_lens);
    KVA_CHECK_PTR(a->block_table);
    KVA_CHECK_PTR(a->tiles);
    KVA_CHECK_PTR(a->num_tiles);
    if (a->num_kv_heads <= 0 || a->num_heads <= 0 || a->num_heads % a->num_kv_heads ||
        a->block_size <= 0)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT, "%s: H = %d, Hkv = %d, B = %d", fn,
                         (int)a->num_heads, (int)a->num_kv_heads, (int)a->block_size);
    if (a->layout != KVA_LAYOUT_NHD && a->layout != KVA_LAYOUT_HND)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT, "%s: layout = %d", fn, (int)a->layout);
    KVA_CHECK_ALIGNED(a->q, 16);
    KVA_CHECK_ALIGNED(a->k, 16);
    KVA_CHECK_ALIGNED(a->v, 16);
    KVA_CHECK_ALIGNED(a->out, 4);
    return KVA_STATUS_OK;
}

extern "C" kva_status kva__cuda_prefill_launch_kernel(const kva__cuda_prefill_args *a, void *stream,
                                                      kva__cuda_prefill_kernel kernel)
{
    KVA_CHECK_PTR(a);
    if (!kva__cuda_prefill_supported(a->head_dim, a->head_dim_v, a->dtype))
        return kva__fail(
            KVA_STATUS_UNSUPPORTED,
            "kva__cuda_prefill_launch_kernel: D = %d, Dv = %d, dtype = %s not supported "
            "(D = Dv in {64, 128, 256}, or D 192 / Dv 128 on sm_90a; f16 or bf16)",
            (int)a->head_dim, (int)a->head_dim_v, kva_dtype_name(a->dtype));
    KVA_TRY(kva__cuda_prefill_check(a, "kva__cuda_prefill_launch_kernel"));
    if (a->grid_tiles == 0)
        return KVA_STATUS_OK;
    if (kernel == KVA__CUDA_PREFILL_AUTO)
        kernel = kva__cuda_prefill_kernel_default(a->head_dim, a->head_dim_v, a->block_size,
                                                  a->num_blocks);
    if (!kva__cuda_prefill_kernel_exists(a->head_dim, a->head_dim_v, kernel))
        return kva__fail(
            KVA_STATUS_INVALID_ARGUMENT,
            "kva__cuda_prefill_launch_kernel: prefill kernel %d does not exist for D = %d, "
            "Dv = %d on this build and device",
            (int)kernel, (int)a->head_dim, (int)a->head_dim_v);
    if (kernel != KVA__CUDA_PREFILL_MMA)
        return kva__cuda_prefill_wgmma_launch(a, stream, kernel == KVA__CUDA_PREFILL_WGMMA_TMA);
    cudaStream_t st = (cudaStream_t)stream;
    return a->dtype == KVA_DTYPE_BF16 ? launch_dtype<kva__mma_bf16>(a, st)
                                      : launch_dtype<kva__mma_f16>(a, st);
}
