/*
 * prefill_mma.cu - paged prefill / chunked prefill attention on tensor cores
 * (C-style CUDA; templates only for compile-time sizes).
 *
 * FlashAttention-2 structure on mma.sync.m16n8k16 (f16 or bf16 inputs, fp32
 * accumulation), for sm_80 and later:
 *   - one CTA = one tile of TILE_M = 128 packed rows (token i, group head g;
 *     row m = i * G + g) of one (request, kv head); see prefill_mma.h;
 *   - Q [128, D] is staged in shared memory once; K and V tiles [BN, D] are
 *     gathered from the paged cache through the block table with cp.async
 *     (16-byte chunks, rows may come from different blocks, any B >= 1), two
 *     stages deep, so the copy of tile n-1 overlaps the math of tile n;
 *   - shared memory rows are XOR-swizzled in 16-byte chunks (chunk c of row r
 *     lives at c ^ (r & 7)), so ldmatrix reads and cp.async writes are free of
 *     bank conflicts;
 *   - S = Q K^T and O += P V on mma.sync; P goes from the S accumulators to
 *     A fragments in registers (converted to f16/bf16) without shared memory;
 *   - online softmax in registers in log2 units: scale * log2(e) is folded
 *     into one multiply, exponentials are kva__ex2.approx;
 *   - key tiles no row of the CTA can see (causal, window) are never loaded;
 *     only tiles crossing the diagonal, the window edge or seq_len are masked
 *     per element.
 *
 *   - lazy rescaling: the running max used as the exponent's reference moves
 *     (and O, l are rescaled) only when some row of the warp exceeds it by
 *     more than 8 (log2 units), so the weights stay <= 2^8 and the O rescale
 *     is skipped on almost every tile.
 * One configuration per head size (mma_cfg below): D 128 runs 4 warps x 32
 * rows (two m16 tiles per warp, so each K/V fragment read from shared memory
 * feeds two mma; O takes D fp32 registers per thread), D 64 and D 256 run 8
 * warps x 16 rows (O is 16 x D per warp, D / 2 registers per thread; D 256
 * with 32 keys per tile and one CTA per SM). This is the portable prefill
 * (sm_80 and later); on sm_90a the wgmma kernel (prefill_wgmma.cu) takes
 * D 128.
 */
extern "C" {
#include "internal.h"
}
#include "mma_ptx.cuh"
#include "prefill_mma.h"
#include "prefill_mma_common.cuh"
#include "sort_inline.h"
#include "tree_mask.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define TILE_M KVA__CUDA_PREFILL_TILE_M
#define LOG2E_F KVA__PF_LOG2E
#define LN2_F KVA__PF_LN2

/* ------------------------------------------------------------------------ */
/* The kernel                                                                */
/* ------------------------------------------------------------------------ */

/*
 * Template sizes: D head size (= Dv), BN keys per tile, NW warps, WM m16 tiles
 * per warp (NW * WM * 16 == TILE_M), MINB CTAs per SM the register budget must
 * allow (__launch_bounds__); mma_cfg gives them per D. Ty: kva__mma_bf16 or
 * kva__mma_f16.
 * Dynamic shared memory: Q [TILE_M, D], then K [2][BN, D], V [2][BN, D].
 */
template <int D, int BN, int NW, int WM, int MINB, typename Ty>
__global__ void __launch_bounds__(NW * 32, MINB) prefill_mma_kernel(const kva__cuda_prefill_args a)
{
    static_assert(NW * WM * 16 == TILE_M, "tile rows");
    static_assert(D % 64 == 0 && BN % 16 == 0, "sizes");
    constexpr int NT = NW * 32; /* threads */
    constexpr int CPR = D / 8;  /* 16-byte chunks per row */
    constexpr int NB8 = BN / 8; /* n8 blocks of S */
    constexpr int DB8 = D / 8;  /* n8 blocks of O */
    typedef typename Ty::elem elem;

    const int tile_idx = blockIdx.x;
    if (tile_idx >= *a.num_tiles)
        return;
    const int32_t *tile = a.tiles + (size_t)tile_idx * KVA__CUDA_PREFILL_TILE_INTS;
    const int r = tile[0], m0 = tile[1], kvh = tile[2];

    extern __shared__ __align__(128) unsigned char smem[];
    const uint32_t sQ = kva__smem_u32(smem);
    const uint32_t sK = sQ + TILE_M * D * 2;
    const uint32_t sV = sK + 2 * BN * D * 2;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int H = a.num_heads, G = a.num_heads / a.num_kv_heads;
    const int q_start = a.query_start_loc[r];
    const int q_len = a.query_start_loc[r + 1] - q_start;
    const int seq_len = a.seq_lens[r];
    const int rows = q_len * G; /* packed rows of this (request, kv head) */
    const int B = a.block_size;
    const int bt_stride =
        a.block_table_stride_dev ? *a.block_table_stride_dev : a.block_table_stride;
    const int32_t *bt = a.block_table + (size_t)r * bt_stride;
    /* The window and the local chunk give each row a first key (kva__first_key);
     * window_left >= KVA_MAX_SEQ_LEN excludes nothing. */
    const int window = a.window_left < KVA_MAX_SEQ_LEN ? a.window_left : -1;
    const int chunk = a.attention_chunk;

    /* Positions of the tile's first and last valid rows (CTA-uniform). */
    const int m_last = min(m0 + TILE_M, rows) - 1;
    const int pos_min = seq_len - q_len + m0 / G;
    const int pos_max = seq_len - q_len + m_last / G;
    int kv_lo = kva__first_key(pos_min, window, chunk);
    int kv_hi = a.causal ? min(seq_len, pos_max + 1) : seq_len;

    /* ---- stage Q: rows m0 .. m0 + TILE_M of the packed (token, head) rows ---- */
    const elem *q = (const elem *)a.q;
    for (int idx = tid; idx < TILE_M * CPR; idx += NT) {
        const int row = idx / CPR, ch = idx % CPR;
        const int pm = m0 + row;
        const elem *src = q;
        int bytes = 0;
        if (pm < rows) {
            const int i = pm / G, g = pm - (pm / G) * G;
            src = q + ((size_t)(q_start + i) * H + (size_t)kvh * G + g) * D + ch * 8;
            bytes = 16;
        }
        kva__cp_async16(sQ + kva__swz<D>(row, ch), src, bytes);
    }

    /* K/V gather of key rows n0 .. n0 + BN into a stage, in two phases so the
     * block-table loads' latency hides behind S = Q K^T: kv_blocks() loads the
     * block ids of this thread's rows (KV_ITERS rows lrow + k * KV_RPP, one
     * 16-byte chunk lch each), kv_copy() issues the cp.async copies. Rows outside
     * [kv_lo, kv_hi) -- past seq_len (a partly filled block's unused slots,
     * which may hold any bit pattern, NaN included), past the causal diagonal
     * of the tile's last row, or before the window of its first row -- are
     * zero-filled and their block-table entries never read, so no row's
     * P V product meets them (0 * NaN). */
    constexpr int KV_RPP = NT / CPR;
    constexpr int KV_ITERS = BN * CPR / NT;
    static_assert(NT % CPR == 0 && (BN * CPR) % NT == 0, "copy shape");
    const int lrow = tid / CPR, lch = tid % CPR;
    const elem *kc = (const elem *)a.k, *vc = (const elem *)a.v;
    const int Hkv = a.num_kv_heads;
    const int nhd = a.layout == KVA_LAYOUT_NHD;
    /* Element offset of key j of this kv head: blk * blk_stride + o * row_stride
     * + head_off with blk = block_table[j / B], o = j % B (a shift for B = 2^k). */
    const int64_t blk_stride = (int64_t)B * Hkv * D;
    const int row_stride = nhd ? Hkv * D : D;
    const int head_off = (nhd ? kvh * D : kvh * B * D) + lch * 8;
    const int b_shift = (B & (B - 1)) == 0 ? __ffs(B) - 1 : -1;
    auto kv_blocks = [&](int n0, int blk[KV_ITERS]) {
#pragma unroll
        for (int k = 0; k < KV_ITERS; k++) {
            const int j = n0 + lrow + k * KV_RPP;
            const int bi = b_shift >= 0 ? j >> b_shift : j / B;
            blk[k] = j >= kv_lo && j < kv_hi ? bt[bi] : 0;
        }
    };
    auto kv_copy = [&](int st, int n0, const int blk[KV_ITERS]) {
#pragma unroll
        for (int k = 0; k < KV_ITERS; k++) {
            const int row = lrow + k * KV_RPP, j = n0 + row;
            const int o = b_shift >= 0 ? j & (B - 1) : j % B;
            const bool in = j >= kv_lo && j < kv_hi;
            const int64_t off = in ? (int64_t)blk[k] * blk_stride + (o * row_stride + head_off) : 0;
            const uint32_t so = (uint32_t)st * BN * D * 2 + kva__swz<D>(row, lch);
            kva__cp_async16(sK + so, kc + off, in ? 16 : 0);
            kva__cp_async16(sV + so, vc + off, in ? 16 : 0);
        }
    };

    /* ---- per-thread rows: warp's m16 tile mt, half hf (row g or g + 8) ---- */
    const int g4 = lane >> 2, t4 = lane & 3;

    /* ldmatrix addressing and the rows' positions and heads. */
    uint32_t xo_q[4], xo_k[4], q_lane, k_row, v_row;
    kva__pf_ldsm_lanes<D, WM>(lane, warp, sQ, xo_q, xo_k, q_lane, k_row, v_row);
    int pos[WM][2], head[WM][2];
    kva__pf_rows<WM>(m0, warp, g4, m_last, G, seq_len, q_len, kvh, pos, head);
    kva__pf_mask<WM> mk;
    kva__pf_mask_init<WM>(mk, a, pos, seq_len, q_len, q_start, pos_min, pos_max);
    const float scale = a.scale > 0.0f ? a.scale : rsqrtf((float)D);
    const float softcap = a.softcap;
    const float score_mul = softcap > 0.0f ? scale / softcap : 0.0f; /* before tanh */
    const float cap_mul = softcap * LOG2E_F;                         /* after tanh */
    const float scale_log2 = scale * LOG2E_F;

    float o[WM][DB8][4];
    float m_run[WM][2], l_run[WM][2];
    kva__pf_init<WM, DB8>(o, m_run, l_run);

    const int n_first = kv_lo / BN;
    const int n_last = kv_hi > kv_lo ? (kv_hi - 1) / BN : n_first - 1;
    if (n_last >= n_first) {
        int blk[KV_ITERS];
        kv_blocks(n_last * BN, blk);
        kv_copy(0, n_last * BN, blk);
    }
    kva__cp_async_commit();

    /* Key tiles from the last (the diagonal, masked) down to the first. The copy
     * of tile n - 1 into the other stage is issued after S of tile n, once every
     * warp has passed this iteration's barrier (so the previous readers of that
     * stage are done). */
    for (int n = n_last, it = 0; n >= n_first; n--, it++) {
        const int st = it & 1;
        const int has_next = n - 1 >= n_first;
        int blk[KV_ITERS];
#pragma unroll
        for (int k = 0; k < KV_ITERS; k++)
            blk[k] = 0;
        if (has_next)
            kv_blocks((n - 1) * BN, blk);
        kva__cp_async_wait<0>();
        __syncthreads();

        const int n0 = n * BN;
        const uint32_t k_lane = sK + (uint32_t)st * BN * D * 2 + k_row;
        const uint32_t v_lane = sV + (uint32_t)st * BN * D * 2 + v_row;

        /* S = Q K^T: [16 * WM, BN] per warp. */
        float s[WM][NB8][4];
#pragma unroll
        for (int mt = 0; mt < WM; mt++)
#pragma unroll
            for (int nb = 0; nb < NB8; nb++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    s[mt][nb][e] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) {
            uint32_t qa[WM][4];
#pragma unroll
            for (int mt = 0; mt < WM; mt++)
                kva__ldsm_x4(q_lane + xo_q[kk & 3] + (kk >> 2) * 128 + mt * 16 * D * 2, qa[mt]);
#pragma unroll
            for (int p = 0; p < BN / 16; p++) {
                uint32_t kb[4];
                kva__ldsm_x4(k_lane + xo_k[kk & 3] + (kk >> 2) * 128 + p * 16 * D * 2, kb);
#pragma unroll
                for (int mt = 0; mt < WM; mt++) {
                    Ty::mma(s[mt][2 * p], qa[mt], kb[0], kb[1]);
                    Ty::mma(s[mt][2 * p + 1], qa[mt], kb[2], kb[3]);
                }
            }
        }

        if (has_next)
            kv_copy(st ^ 1, (n - 1) * BN, blk);
        kva__cp_async_commit();

        /* Scores and online softmax, in log2 units. Fast path (no soft-cap, no
         * ALiBi, no masked element in this tile: CTA-uniform): S stays raw and
         * mul = scale * log2(e) is applied in the exponent's FFMA. Otherwise S is
         * transformed to log2 units first (mul = 1), masked elements to -inf. */
        const int need_mask = kva__pf_mask_needed<WM, BN>(mk, n0);
        const int transform = need_mask || softcap > 0.0f || a.alibi_slopes != NULL;
        const float mul = transform ? 1.0f : scale_log2;
        if (transform)
            kva__pf_transform<WM, NB8>(s, mk, pos, head, a.alibi_slopes, softcap, scale_log2,
                                       score_mul, cap_mul, n0, t4);
        uint32_t pk[WM][NB8][2]; /* P, packed pairs */
        kva__pf_softmax<WM, NB8, DB8, Ty>(s, o, m_run, l_run, mul, pk);
        /* O += P V: P [16 * WM, BN] from registers, V [BN, D]. */
        kva__pf_pv_tile<D, WM, BN, Ty>(o, pk, v_lane, xo_q);
        __syncthreads(); /* stage st is overwritten by the next iteration's copy */
    }
    kva__cp_async_wait<0>();

    /* ---- epilogue: sink, normalization, out and lse ---- */
    kva__pf_row_end<D, WM, Ty>(a, o, m_run, l_run, head, m0, warp, g4, t4, rows, q_start, G,
                               [](int, float, float &, float &) {});
}

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

extern "C" int64_t kva__cuda_prefill_tiles_count(int32_t num_requests,
                                                 const int32_t *query_start_loc, int32_t num_heads,
                                                 int32_t num_kv_heads)
{
    return kva__cuda_prefill_tiles_count_subset(num_requests, query_start_loc, NULL, num_heads,
                                                num_kv_heads);
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

extern "C" kva_status
kva__cuda_prefill_tiles_build_subset(int32_t num_requests, const int32_t *query_start_loc,
                                     const int32_t *seq_lens, const uint8_t *use_req,
                                     int32_t num_heads, int32_t num_kv_heads, int32_t causal,
                                     int32_t window_left, int32_t attention_chunk, int32_t *tiles,
                                     int32_t capacity, int32_t *num_tiles)
{
    return kva__cuda_prefill_tiles_build_sections(num_requests, query_start_loc, seq_lens, use_req,
                                                  num_heads, num_kv_heads, causal, window_left,
                                                  attention_chunk, 0, tiles, capacity, num_tiles);
}

extern "C" kva_status kva__cuda_prefill_tiles_build(int32_t num_requests,
                                                    const int32_t *query_start_loc,
                                                    const int32_t *seq_lens, int32_t num_heads,
                                                    int32_t num_kv_heads, int32_t causal,
                                                    int32_t window_left, int32_t *tiles,
                                                    int32_t capacity, int32_t *num_tiles)
{
    return kva__cuda_prefill_tiles_build_subset(num_requests, query_start_loc, seq_lens, NULL,
                                                num_heads, num_kv_heads, causal, window_left, 0,
                                                tiles, capacity, num_tiles);
}

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

/* Launches the kernel for head size D with its dynamic shared memory. */
template <int D, typename Ty>
static kva_status launch_d(const kva__cuda_prefill_args *a, cudaStream_t stream)
{
    typedef mma_cfg<D> C;
    auto fn = prefill_mma_kernel<D, C::BN, C::NW, C::WM, C::MINB, Ty>;
    const size_t smem = (size_t)(TILE_M + 4 * C::BN) * D * 2;
    cudaError_t e =
        cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess)
        return kva__fail(KVA_STATUS_DEVICE_ERROR,
                         "kva__cuda_prefill_launch: cudaFuncSetAttribute(%zu bytes of shared "
                         "memory, D = %d): %s",
                         smem, D, cudaGetErrorString(e));
    fn<<<a->grid_tiles, C::NW * 32, smem, stream>>>(*a);
    e = cudaGetLastError();
    if (e != cudaSuccess)
        return kva__fail(KVA_STATUS_DEVICE_ERROR,
                         "kva__cuda_prefill_launch: launch of %d tiles (D = %d): %s",
                         (int)a->grid_tiles, D, cudaGetErrorString(e));
    return KVA_STATUS_OK;
}

template <typename Ty>
static kva_status launch_dtype(const kva__cuda_prefill_args *a, cudaStream_t st)
{
    switch (a->head_dim) {
    case 64:
        return launch_d<64, Ty>(a, st);
    case 128:
        return launch_d<128, Ty>(a, st);
    default:
        return launch_d<256, Ty>(a, st);
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

extern "C" kva_status kva__cuda_prefill_launch_kernel(const kva__cuda_prefill_args *a, void *stream,
                                                      kva__cuda_prefill_kernel kernel)
{
    KVA_CHECK_PTR(a);
    if (!kva__cuda_prefill_supported(a->head_dim, a->head_dim_v, a->dtype))
        return kva__fail(KVA_STATUS_UNSUPPORTED,
                         "kva__cuda_prefill_launch: D = %d, Dv = %d, dtype = %s not supported "
                         "(D = Dv in {64, 128, 256}, or D 192 / Dv 128 on sm_90a; f16 or bf16)",
                         (int)a->head_dim, (int)a->head_dim_v, kva_dtype_name(a->dtype));
    if (a->grid_tiles < 0)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT, "kva__cuda_prefill_launch: grid_tiles = %d",
                         (int)a->grid_tiles);
    if (a->grid_tiles == 0)
        return KVA_STATUS_OK;
    KVA__CUDA_PREFILL_CHECK_PTRS(a);
    /* cp.async copies 16-byte chunks: q, k and v must be 16-byte aligned (row
     * strides are multiples of D * 2 >= 128 bytes). */
    KVA__CUDA_PREFILL_CHECK_SHAPE(a, "kva__cuda_prefill_launch");
    if (kernel == KVA__CUDA_PREFILL_AUTO)
        kernel = kva__cuda_prefill_kernel_default(a->head_dim, a->head_dim_v, a->block_size,
                                                  a->num_blocks);
    if (!kva__cuda_prefill_kernel_exists(a->head_dim, a->head_dim_v, kernel))
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "kva__cuda_prefill_launch: prefill kernel %d does not exist for D = %d, "
                         "Dv = %d on this build and device",
                         (int)kernel, (int)a->head_dim, (int)a->head_dim_v);
    if (kernel != KVA__CUDA_PREFILL_MMA)
        return kva__cuda_prefill_wgmma_launch(a, stream, kernel == KVA__CUDA_PREFILL_WGMMA_TMA);
    cudaStream_t st = (cudaStream_t)stream;
    return a->dtype == KVA_DTYPE_BF16 ? launch_dtype<kva__mma_bf16>(a, st)
                                      : launch_dtype<kva__mma_f16>(a, st);
}

extern "C" kva_status kva__cuda_prefill_launch(const kva__cuda_prefill_args *a, void *stream)
{
    return kva__cuda_prefill_launch_kernel(a, stream, KVA__CUDA_PREFILL_AUTO);
}
