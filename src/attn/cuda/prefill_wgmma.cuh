/*
 * prefill_wgmma.cuh - device helpers of the sm_90a wgmma prefill kernels
 * (prefill_wgmma.cu): tile header and paged K/V gather, the swizzled
 * shared-memory layout, the S = Q K^T and O += P V wgmma sequences, the online
 * softmax and the epilogue (mbarriers, named barriers and TMA boxes: the
 * wrappers of async_ptx.cuh). Included by
 * prefill_wgmma.cu only (after prefill_mma.h, mma_ptx.cuh, wgmma_ptx.cuh);
 * everything that issues sm_90a instructions is compiled only where
 * KVA_WGMMA_BODY is defined (sm_90a device passes).
 */
#ifndef KVA_CUDA_PREFILL_WGMMA_CUH
#define KVA_CUDA_PREFILL_WGMMA_CUH

#include "async_ptx.cuh"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define KVA_WGMMA_BODY 1
#endif

#define WG_M KVA__CUDA_PREFILL_TILE_M /* rows per tile of the plan's list (128) */
#define WG_LOG2E 1.4426950408889634f
#define WG_LN2 0.6931471805599453f
/* Bytes of one [rows, d] operand in the swizzled layout. */
#define WG_TILE_BYTES(rows, d) ((rows) * (d)*2)

/*
 * The kernel's traits. Head sizes: DK (Q and K rows, the k extent of
 * S = Q K^T) and DV (V rows, the n extent of O = P V). Served: (64, 64),
 * (128, 128), (192, 128) (MLA's prefill with the rope part in K) and
 * (256, 256).
 * Tile shape (NCW consumer warpgroups of 64 rows, M = 64 NCW rows per CTA
 * tile, BN keys per K/V tile; docs/cuda-prefill.md has the table): wide (NCW
 * 2, BN 128), narrow (NCW 1, BN 64; D 128 when the plan picks it:
 * kva__cuda_prefill_args.narrow), and wide with 64-key tiles (NCW 2, BN 64;
 * D 256, whose O [64, 256] leaves room for S [64, 64] only). wg_dims gives
 * the K/V ring depth that fits next to Q [M, DK]: wide 4 stages at DK 64, 3
 * at 128, 2 at 192 and 256; narrow 3 (two CTAs in 228 KB without the 1 KB
 * alignment pad: PAD below).
 */
template <int DK, int DV, int NCW = 2, int BN = 128> struct wg_dims {
    static_assert(DK % 64 == 0 && DV % 64 == 0 && DK <= 256 && DV <= 256, "wgmma head sizes");
    static_assert((NCW == 2 && (BN == 128 || BN == 64)) || (NCW == 1 && BN == 64),
                  "wgmma tile shapes");
    static_assert(DV <= 128 || (NCW == 2 && BN == 64), "Dv 256: the 64-key wide shape only");
    static constexpr int M = 64 * NCW;     /* rows per CTA tile */
    static constexpr int SPLIT = WG_M / M; /* CTA tiles per tile of the plan's list */
    static constexpr int CTAS = 3 - NCW;   /* CTAs per SM */
    static constexpr int NST = NCW == 1 ? 3 : DK == 64 ? 4 : DK == 128 ? 3 : 2;
    static constexpr uint32_t QB = WG_TILE_BYTES(M, DK), KB = WG_TILE_BYTES(BN, DK),
                              VB = WG_TILE_BYTES(BN, DV);
    static constexpr uint32_t IDB = 2 * BN * 4; /* staged block ids [2][BN] int32 */
    /* The CTA-tile ring of the dynamic schedule (wg_sched): SR slots, each an
     * int32 and two mbarriers. */
    static constexpr int SR = 4;
    static constexpr uint32_t SCB = 20 * SR;
    /* Shared memory past the 1024-byte aligned base: Q, the ring, its 2 NST
     * mbarriers, the block ids and the CTA-tile ring. */
    static constexpr uint32_t BODY = QB + NST * (KB + VB) + 16 * NST + IDB + SCB;
    /* PAD: the launch asks for 1 KB more than BODY, so the kernel can align
     * its base itself. Where CTAS CTAs cannot have it (the narrow shape's
     * three stages: 2 x (BODY + 1 KB reserved by the system) fill the SM's
     * 228 KB with 0.9 KB left), the launch asks for BODY and the kernel
     * relies on the dynamic shared memory starting 1024-byte aligned (it
     * does without static shared memory); if it ever does not, the kernel
     * runs a ring of NST - 1 stages from the aligned address, which fits. */
    static constexpr bool PAD = CTAS * (BODY + 2048) <= 228 * 1024;
    static constexpr uint32_t SMEM = BODY + (PAD ? 1024 : 0);
    static_assert(CTAS * (SMEM + 1024) <= 228 * 1024, "shared memory of the wgmma prefill");
    static_assert(PAD || NST > 2, "the unpadded layout falls back to NST - 1 stages");
    static constexpr int NO = DV / 2;  /* O accumulators per consumer thread */
    static constexpr int NS = BN / 2;  /* S accumulators per consumer thread */
    static constexpr int KS = BN / 16; /* k-steps of O += P V */
    /* setmaxnreg of the producer and the consumers: their sum over the
     * CTA's warpgroups is what the launch bound gives (65,536 registers per
     * SM over CTAS * (NCW + 1) * 128 threads). */
    static constexpr int REG_P = 40, REG_C = NCW == 2 ? 232 : 216;
    /* Whether the TMA form issues P V of key tile it - 1 under the softmax
     * of tile it (INTRA): a consumer then holds two stages at once, which at
     * Dv 256 is the whole 2-stage ring, so the producer could not fill a
     * stage until both consumers' P V of tile it - 1 were done (late in
     * iteration it). There P V goes out with the next S, as in the cp.async
     * form, and releases its stage at the start of the iteration. */
    static constexpr bool TMA_INTRA = DV <= 128;
};

/* Stage and phase of the gk-th K/V tile of a CTA's ring: n = NST stages, or
 * NF = NST - 1 where an unpadded layout (wg_dims::PAD) found its base
 * unaligned. With the pad n is the constant NST and the other branch folds
 * away. */
template <int NST> struct wg_ring {
    static constexpr uint32_t NF = NST > 2 ? NST - 1 : NST;
    uint32_t n;
    __device__ __forceinline__ int st(uint32_t gk) const
    {
        return (int)(n == NST ? gk % NST : gk % NF);
    }
    __device__ __forceinline__ uint32_t ph(uint32_t gk) const
    {
        return (n == NST ? gk / NST : gk / NF) & 1u;
    }
};

/* How 128 threads copy rows of C 16-byte chunks (C = D / 8): TPR threads per
 * row, each with chunks lch, lch + TPR, ... (SETS of them), RP rows per
 * pass. C 16 and 32: 16 threads per row, 8 rows per pass (32: two chunks per
 * thread); C 8 and 24: 8 threads per row, 16 rows per pass (24: three chunks
 * per thread). */
template <int C> struct wg_split {
    static constexpr int TPR = C % 16 == 0 ? 16 : 8;
    static constexpr int SETS = C / TPR;
    static constexpr int RP = 128 / TPR;
};

/* Byte offset of 16-byte chunk ch of row r in a swizzled [rows, D] operand:
 * column block ch / 8 ([rows][64] each), chunk (ch % 8) ^ (r % 8). */
#ifdef KVA_WGMMA_BODY
static __device__ __forceinline__ uint32_t wg_swz(int r, int ch, int rows)
{
    return (uint32_t)((ch >> 3) * rows * 128 + r * 128 + (((ch & 7) ^ (r & 7)) << 4));
}
#endif

/* wgmma by element type: wg_ops<kva__mma_bf16> and wg_ops<kva__mma_f16>. */
template <typename Ty> struct wg_ops;
#ifdef KVA_WGMMA_BODY
#define KVA__WG_OPS(Ty, ty)                                                                        \
    template <> struct wg_ops<Ty> {                                                                \
        static __device__ __forceinline__ void ss(float d[64], uint64_t a, uint64_t b, int sc)     \
        {                                                                                          \
            if (sc)                                                                                \
                kva__wgmma_ss_m64n128_##ty(d, a, b, 1);                                            \
            else                                                                                   \
                kva__wgmma_ss0_m64n128_##ty(d, a, b);                                              \
        }                                                                                          \
        static __device__ __forceinline__ void ss64(float d[32], uint64_t a, uint64_t b, int sc)   \
        {                                                                                          \
            if (sc)                                                                                \
                kva__wgmma_ss_m64n64_##ty(d, a, b, 1);                                             \
            else                                                                                   \
                kva__wgmma_ss0_m64n64_##ty(d, a, b);                                               \
        }                                                                                          \
        static __device__ __forceinline__ void rs(float d[64], const uint32_t a[4], uint64_t b)    \
        {                                                                                          \
            kva__wgmma_rs_m64n128_##ty##_tb(d, a, b, 1);                                           \
        }                                                                                          \
        static __device__ __forceinline__ void rs64(float d[32], const uint32_t a[4], uint64_t b)  \
        {                                                                                          \
            kva__wgmma_rs_m64n64_##ty##_tb(d, a, b, 1);                                            \
        }                                                                                          \
    };
#else
#define KVA__WG_OPS(Ty, ty)                                                                        \
    template <> struct wg_ops<Ty> {                                                                \
    };
#endif
KVA__WG_OPS(kva__mma_bf16, bf16)
KVA__WG_OPS(kva__mma_f16, f16)

/*
 * x / d for 0 <= x < 2^31 by a multiply-high, an add and a shift: d is the
 * launch's GQA group size G (H / Hkv), m and l come from the round-up method
 * (l = ceil(log2 d), m = 2^32 (2^l - d) / d + 1), computed once per thread at
 * the kernel's start. The packed rows' (token, head) split of every tile
 * header, Q load and output row would otherwise each run an integer division.
 */
struct wg_div {
    uint32_t d, m;
    int l;
};
static __device__ __forceinline__ wg_div wg_div_make(uint32_t d)
{
    wg_div v;
    v.d = d;
    v.l = d > 1 ? 32 - __clz((int)(d - 1)) : 0;
    v.m = (uint32_t)(((1ull << 32) * ((1ull << v.l) - d)) / d + 1);
    return v;
}
static __device__ __forceinline__ int wg_div_q(const wg_div &v, int x)
{
    return (int)((__umulhi((uint32_t)x, v.m) + (uint32_t)x) >> v.l);
}

/* A tile's record in the plan's list: request, first packed row, kv head.
 * The consumers load the next CTA tile's record before the current tile's
 * last P V, so the header built from it under the epilogue waits only for
 * the small, L1-resident query_start_loc and seq_lens. */
struct wg_rec {
    int r, m0, kvh;
};
static __device__ __forceinline__ wg_rec wg_rec_load(const kva__cuda_prefill_args &a, int ti)
{
    const int32_t *tile = a.tiles + (size_t)ti * KVA__CUDA_PREFILL_TILE_INTS;
    wg_rec rc;
    rc.r = __ldg(tile);
    rc.m0 = __ldg(tile + 1);
    rc.kvh = __ldg(tile + 2);
    return rc;
}
/* The record of CTA tile ti when each tile of the plan's list is SPLIT CTA
 * tiles of M rows (wg_dims): list tile ti / SPLIT, rows from M (ti % SPLIT). */
template <int SPLIT, int M>
static __device__ __forceinline__ wg_rec wg_rec_of(const kva__cuda_prefill_args &a, int ti)
{
    wg_rec rc = wg_rec_load(a, SPLIT == 1 ? ti : ti / SPLIT);
    if (SPLIT > 1)
        rc.m0 += (ti % SPLIT) * M;
    return rc;
}

/*
 * The dynamic CTA-tile schedule (kva__cuda_prefill_args.sched != NULL). CTA
 * b takes CTA tile b first; every further tile comes from the launch's
 * counter sched[0] (tile gridDim.x + the value an atomicAdd returns), so a CTA
 * that finishes early takes the next tile of the heaviest-first list instead
 * of the static snake order's share, whose CTAs' lifetimes spread where the
 * tiles' costs are not what the order assumes (docs/cuda-prefill.md). The
 * producer's thread 0 fetches the tile of round k + 1 once it has issued round
 * k's copies and publishes it through an SR-slot ring in shared memory: slot
 * (k - 1) % SR, a "full" mbarrier (one arrival, that thread's) and an
 * "empty" one that every thread of the CTA arrives on once it has read the
 * slot (the producer's threads when they start round k, the consumers'
 * before the last P V of round k - 1). A CTA's fetches stop at the
 * first tile >= n_tiles; then it counts itself in sched[1], and the last CTA
 * of the grid sets both counters back to 0 for the next launch.
 */
#ifdef KVA_WGMMA_BODY
template <int SR> struct wg_sched {
    uint32_t full, empty, slot; /* mbarriers [SR] (8 bytes each), int32 [SR] */
    /* The CTA tile of round k >= 1: every thread of the CTA, once per k, in
     * order. */
    __device__ __forceinline__ int take(int k) const
    {
        const uint32_t s = (uint32_t)(k - 1) % SR, u = (uint32_t)(k - 1) / SR;
        kva__mbar_wait(full + 8 * s, u & 1u);
        int ti;
        asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(ti) : "r"(slot + 4 * s) : "memory");
        kva__mbar_arrive(empty + 8 * s);
        return ti;
    }
    /* Publishes ti as the CTA tile of round k >= 1 (the producer's thread 0). */
    __device__ __forceinline__ void put(int k, int ti) const
    {
        const uint32_t s = (uint32_t)(k - 1) % SR, u = (uint32_t)(k - 1) / SR;
        if (u >= 1)
            kva__mbar_wait(empty + 8 * s, (u & 1u) ^ 1u);
        asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(slot + 4 * s), "r"(ti) : "memory");
        kva__mbar_arrive(full + 8 * s);
    }
};
/* A CTA's fetches are over (its last one returned a tile >= n_tiles, or it
 * had no tile): the grid's last CTA to get here resets the counters. */
static __device__ __forceinline__ void wg_sched_done(int32_t *sc)
{
    __threadfence();
    if (atomicAdd(sc + 1, 1) == (int)gridDim.x - 1) {
        atomicExch(sc, 0);
        atomicExch(sc + 1, 0);
    }
}
#endif

/* Tile header: request, rows, visible key range. */
struct wg_tile {
    int r, m0, kvh, q_start, q_len, seq_len, rows, G, m_last, pos_min, pos_max, kv_lo, kv_hi;
};
/* The header of a CTA tile of M rows from m0 (a CTA tile past the request's
 * rows, the second half of a short request's list tile, sees no key). */
template <int M>
static __device__ __forceinline__ void wg_tile_init(wg_tile &t, const kva__cuda_prefill_args &a,
                                                    const wg_rec &rc, const wg_div &gd)
{
    t.r = rc.r;
    t.m0 = rc.m0;
    t.kvh = rc.kvh;
    t.G = (int)gd.d;
    t.q_start = __ldg(a.query_start_loc + t.r);
    t.q_len = __ldg(a.query_start_loc + t.r + 1) - t.q_start;
    t.seq_len = __ldg(a.seq_lens + t.r);
    t.rows = t.q_len * t.G;
    t.m_last = min(t.m0 + M, t.rows) - 1;
    t.pos_min = t.seq_len - t.q_len + wg_div_q(gd, t.m0);
    t.pos_max = t.seq_len - t.q_len + wg_div_q(gd, t.m_last);
    const int window = a.window_left < KVA_MAX_SEQ_LEN ? a.window_left : -1;
    t.kv_lo = kva__first_key(t.pos_min, window, a.attention_chunk);
    t.kv_hi = a.causal ? min(t.seq_len, t.pos_max + 1) : t.seq_len;
    if (M < WG_M && t.m0 >= t.rows)
        t.kv_hi = t.kv_lo;
}

/*
 * Per-thread rows and CTA-uniform scalars of the softmax and the epilogue.
 * The mask is folded into per-row bounds when the CTA tile starts: row hf
 * sees keys lo[hf] <= j < hi[hf] (causal, seq_len, window and chunk), and
 * among the draft-tree keys j >= t0 only those whose bit j - t0 is set in the
 * row's tree word (t0 = INT32_MAX without a tree). A masked key tile turns
 * them into each row's visibility words once (kva__cuda_vis_word), so the
 * per-element test is one bit test and the unrolled 64-element loop stays
 * small (docs/cuda-prefill.md: the kernel's code size).
 */
struct wg_ctx {
    int pos[2], head[2]; /* position and query head of rows hf = 0, 1 */
    int tok[2];          /* their query token (output row / H), -1 past the request */
    int lo[2], hi[2];    /* the rows' visible keys [lo, hi) without the tree */
    const uint64_t *tw;  /* the request's draft-tree words, read on tiles reaching t0 */
    int t0, tn;          /* first draft-tree key (INT32_MAX: no tree), tree rows */
    int hi_min, lo_max;  /* CTA-uniform: the smallest hi, the largest lo of the tile */
    int t4;
    float scale_log2; /* the softmax scale times log2(e); soft-cap and ALiBi are passed
                         to wg_softmax from the kernel's arguments */
};

#ifdef KVA_WGMMA_BODY
/* Fills c for the thread's rows t.m0 + rbase + g4 + 8 hf (rbase = 64 *
 * warpgroup + 16 * warp in it) of tile t (DK: the default scale's head
 * size; tree_on: the launch's *a.tree_on, read once per thread). */
template <int DK>
static __device__ __forceinline__ void wg_ctx_init(wg_ctx &c, const kva__cuda_prefill_args &a,
                                                   const wg_tile &t, int rbase, const wg_div &gd,
                                                   int tree_on)
{
    const int lane = threadIdx.x & 31;
    const int window = a.window_left < KVA_MAX_SEQ_LEN ? a.window_left : -1;
    const kva__cuda_tree tree = kva__cuda_tree_at(a.tree, tree_on, t.q_start, t.seq_len, t.q_len);
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        /* Rows past the request take the last row's mask; they write nothing. */
        const int pu = t.m0 + rbase + hf * 8 + (lane >> 2), pm = min(pu, t.m_last);
        const int i = wg_div_q(gd, pm), p = t.seq_len - t.q_len + i;
        c.pos[hf] = p;
        c.head[hf] = t.kvh * t.G + (pm - i * t.G);
        c.tok[hf] = pu < t.rows ? t.q_start + i : -1;
        c.lo[hf] = kva__first_key(p, window, a.attention_chunk);
        c.hi[hf] = a.causal ? min(t.seq_len, p + 1) : t.seq_len;
    }
    c.tw = tree.w;
    c.t0 = tree.t0;
    c.tn = tree.n;
    c.hi_min = a.causal ? min(t.seq_len, t.pos_min + 1) : t.seq_len;
    c.lo_max = kva__first_key(t.pos_max, window, a.attention_chunk);
    c.t4 = lane & 3;
    const float scale = a.scale > 0.0f ? a.scale : rsqrtf((float)DK);
    c.scale_log2 = scale * WG_LOG2E;
}

/*
 * The plan's score transforms of one key tile, in place (raw scores in, log2
 * units out): soft-cap (cap * tanh(score / cap)) or the plain scale, then
 * ALiBi's slope[head] * (j - pos). Each is its own unrolled loop, entered
 * only when the plan has the transform, so the common path (a causal mask
 * only) never fetches their code (docs/cuda-prefill.md: the kernel's code
 * size).
 */
template <int NS>
static __device__ __forceinline__ void wg_transform(float (&s)[NS], const wg_ctx &c, float softcap,
                                                    const float *alibi, int n0)
{
    if (softcap > 0.0f) {
        const float score_mul = c.scale_log2 * WG_LN2 / softcap, cap_mul = softcap * WG_LOG2E;
#pragma unroll
        for (int e = 0; e < NS; e++)
            s[e] = cap_mul * tanhf(s[e] * score_mul);
    } else {
#pragma unroll
        for (int e = 0; e < NS; e++)
            s[e] *= c.scale_log2;
    }
    if (alibi) {
        const float sl[2] = {alibi[c.head[0]] * WG_LOG2E, alibi[c.head[1]] * WG_LOG2E};
#pragma unroll
        for (int e = 0; e < NS; e++) {
            const int hf = (e >> 1) & 1, j = n0 + (e >> 2) * 8 + (e & 1) + 2 * c.t4;
            s[e] += sl[hf] * (float)(j - c.pos[hf]);
        }
    }
}

/*
 * The mask of one key tile that crosses a row's bounds or the draft tree:
 * invisible elements become -inf. The rows' visibility words
 * (tree_mask.cuh): bit (e / 4) * 8 + e % 2 of the 128-bit word of row hf is
 * element e's key n0 + 8 (e / 4) + 2 t4 + e % 2. The tree words (keys t0 ..
 * t0 + 63; rows are the request's query tokens, tree positions t0 .. t0 +
 * q_len - 1) are read only on tiles reaching t0, 0 off the tree.
 */
template <int NS>
static __device__ __forceinline__ void wg_mask(float (&s)[NS], const wg_ctx &c, int n0)
{
    constexpr int BN = 2 * NS;
    uint32_t vis[2][BN / 32];
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        uint64_t tw = 0ull;
        if (n0 + BN > c.t0 && (uint32_t)(c.pos[hf] - c.t0) < (uint32_t)c.tn)
            tw = __ldg(c.tw + (c.pos[hf] - c.t0));
#pragma unroll
        for (int q = 0; q < BN / 32; q++)
            vis[hf][q] = kva__cuda_vis_word(n0 + 2 * c.t4 + 32 * q, c.lo[hf], c.hi[hf], c.t0, tw);
    }
#pragma unroll
    for (int e = 0; e < NS; e++) {
        const int hf = (e >> 1) & 1, i = (e >> 2) * 8 + (e & 1);
        s[e] = (vis[hf][i >> 5] >> (i & 31)) & 1u ? s[e] : -INFINITY;
    }
}

/*
 * Online softmax of one key tile (keys n0 .. n0 + 127) in log2 units, as
 * prefill_mma: s[4 nb + e] is row hf = e / 2, key n0 + 8 nb + 2 t4 + e % 2.
 * Transforms (wg_transform, only with soft-cap or ALiBi) and masks (wg_mask,
 * only on tiles crossing a row's bounds or the tree) the tile; otherwise
 * the raw score goes straight into the exponent's FFMA with scale * log2(e).
 * Updates m_run and l_run (per-thread partial sums), rescales o lazily (the
 * reference max moves only when a row of the warp grows past it by more than
 * 8, so weights stay <= 2^8), and packs P into pa: the register A operands of
 * the k-steps (keys 16 kk .. + 15) of O += P V ({0, 1}: keys 0..7 of rows g,
 * g + 8; {2, 3}: keys 8..15).
 */
template <typename Ty, bool DEFER, int NO, int NS>
static __device__ __forceinline__ bool wg_softmax(float (&s)[NS], float (&o)[NO],
                                                  uint32_t (&pa)[NS / 8][4], float (&m_run)[2],
                                                  float (&l_run)[2], const wg_ctx &c, float softcap,
                                                  const float *alibi, int n0, float (&alpha_out)[2])
{
    constexpr int BN = 2 * NS;
    const int transform = softcap > 0.0f || alibi != NULL;
    const float mul = transform ? 1.0f : c.scale_log2;
    if (transform)
        wg_transform(s, c, softcap, alibi, n0);
    if (n0 + BN > c.hi_min || n0 < c.lo_max || n0 + BN > c.t0)
        wg_mask(s, c, n0);
    float m_new[2];
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        float mx = -INFINITY;
#pragma unroll
        for (int nb = 0; nb < BN / 8; nb++)
            mx = fmaxf(mx, fmaxf(s[4 * nb + 2 * hf], s[4 * nb + 2 * hf + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        m_new[hf] = fmaxf(m_run[hf], mx * mul);
    }
    const bool resc =
        __any_sync(0xffffffffu, m_new[0] > m_run[0] + 8.0f || m_new[1] > m_run[1] + 8.0f);
    if (resc) {
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            const float m_use = m_new[hf] == -INFINITY ? 0.0f : m_new[hf];
            const float alpha = kva__ex2(m_run[hf] - m_use); /* 0 while m_run = -inf */
            alpha_out[hf] = alpha;
            m_run[hf] = m_new[hf];
            l_run[hf] *= alpha;
            if (!DEFER) {
#pragma unroll
                for (int nb = 0; nb < NO / 4; nb++) {
                    o[4 * nb + 2 * hf] *= alpha;
                    o[4 * nb + 2 * hf + 1] *= alpha;
                }
            }
        }
    }
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        const float m_use = m_run[hf] == -INFINITY ? 0.0f : m_run[hf];
        float sum = 0.0f;
#pragma unroll
        for (int nb = 0; nb < BN / 8; nb++) {
            const float p0 = kva__ex2(fmaf(s[4 * nb + 2 * hf], mul, -m_use));
            const float p1 = kva__ex2(fmaf(s[4 * nb + 2 * hf + 1], mul, -m_use));
            sum += p0 + p1;
            pa[nb >> 1][(nb & 1) * 2 + hf] = Ty::pack(p0, p1);
        }
        l_run[hf] += sum;
    }
    return resc; /* warp-uniform; with DEFER the caller rescales o by alpha_out (wg_rescale_o) */
}

/* O *= alpha of its row half (o[4 nb + e] is row hf = e / 2): the rescale
 * wg_softmax<Ty, true> leaves to its caller. */
template <int NO>
static __device__ __forceinline__ void wg_rescale_o(float (&o)[NO], const float (&alpha)[2])
{
#pragma unroll
    for (int nb = 0; nb < NO / 4; nb++) {
        o[4 * nb] *= alpha[0];
        o[4 * nb + 1] *= alpha[0];
        o[4 * nb + 2] *= alpha[1];
        o[4 * nb + 3] *= alpha[1];
    }
}

/* Sink, normalization, out and lse of the thread's rows (as prefill_mma; the
 * output rows come from c, no tile header is read). A row's 8-column blocks
 * are spread over its quad (lane t4 holds columns 2 t4, 2 t4 + 1 of each);
 * where out is 16-byte aligned, two shuffle rounds transpose each group of
 * four blocks across the quad, so lane t4 holds block 4 g + t4 whole and
 * writes it with one 16-byte store: a quarter of the store instructions, each
 * writing 64 contiguous bytes of a row instead of 16 (the epilogue's stores
 * were the largest fixed cost of a short CTA tile; docs/cuda-prefill.md).
 * Otherwise (out only 4-byte aligned) every lane stores its 4-byte pairs. */
template <typename Ty, int DV>
static __device__ __forceinline__ void wg_epilogue(const kva__cuda_prefill_args &a, const wg_ctx &c,
                                                   const float (&o)[DV / 2],
                                                   const float (&m_run)[2], const float (&l_run)[2])
{
    typedef typename Ty::elem elem;
    elem *out = (elem *)a.out;
    const bool v16 = ((uintptr_t)a.out & 15u) == 0; /* launch-uniform */
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        float l = l_run[hf];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        float inv, lse;
        kva__pf_row_norm(l, m_run[hf], a.sinks, c.head[hf], inv, lse);
        const size_t orow = (size_t)(c.tok[hf] < 0 ? 0 : c.tok[hf]) * a.num_heads + c.head[hf];
        elem *dst = out + orow * DV;
        if (v16) {
            /* Every lane shuffles (the quad shares the row, tok < 0 or not). */
#pragma unroll
            for (int g = 0; g < DV / 32; g++) {
                uint32_t x[4];
#pragma unroll
                for (int j = 0; j < 4; j++)
                    x[j] = Ty::pack(o[4 * (4 * g + j) + 2 * hf] * inv,
                                    o[4 * (4 * g + j) + 2 * hf + 1] * inv);
                /* x[j] of lane t: columns 2 t, 2 t + 1 of block 4 g + j. Round
                 * 1 swaps x[1] of even lanes with x[0] of odd ones (and x[3]
                 * with x[2]), round 2 x[2..3] of lanes t4 < 2 with x[0..1] of
                 * lanes t4 >= 2: then x[j] of lane t is columns 2 j, 2 j + 1
                 * of block 4 g + t. */
                const bool odd = (c.t4 & 1) != 0, hi = (c.t4 & 2) != 0;
#pragma unroll
                for (int p = 0; p < 4; p += 2) {
                    const uint32_t r = __shfl_xor_sync(0xffffffffu, odd ? x[p] : x[p + 1], 1);
                    x[p] = odd ? r : x[p];
                    x[p + 1] = odd ? x[p + 1] : r;
                }
#pragma unroll
                for (int p = 0; p < 2; p++) {
                    const uint32_t r = __shfl_xor_sync(0xffffffffu, hi ? x[p] : x[p + 2], 2);
                    x[p] = hi ? r : x[p];
                    x[p + 2] = hi ? x[p + 2] : r;
                }
                if (c.tok[hf] >= 0)
                    *(uint4 *)(dst + (4 * g + c.t4) * 8) = make_uint4(x[0], x[1], x[2], x[3]);
            }
        } else if (c.tok[hf] >= 0) {
#pragma unroll
            for (int nb = 0; nb < DV / 8; nb++) {
                const uint32_t v = Ty::pack(o[4 * nb + 2 * hf] * inv, o[4 * nb + 2 * hf + 1] * inv);
                *(uint32_t *)(dst + nb * 8 + 2 * c.t4) = v;
            }
        }
        if (a.lse && c.t4 == 0 && c.tok[hf] >= 0)
            a.lse[orow] = lse;
    }
}

/*
 * Paged K/V gather of key rows n0 .. n0 + BN - 1 into a stage (K at sk, V at sv)
 * by cp.async (wg_gather_ids). Rows outside [kv_lo, kv_hi) are zero-filled
 * without reading the cache (a partly filled block's unused slots may hold
 * NaN; no row's P V product meets them).
 */
struct wg_kv {
    const int32_t *bt;
    const char *k, *v;    /* this kv head's element 0 + the thread's first chunk, bytes */
    int64_t k_blk, v_blk; /* bytes per block of K and V */
    int k_row, v_row;     /* bytes between the key rows of one block */
    int B, b_shift, kv_lo, kv_hi;
};
/* Block id of key j (0 outside [kv_lo, kv_hi), where the block table is not
 * read). */
static __device__ __forceinline__ int wg_blk_of(const wg_kv &g, int j)
{
    const int bi = g.b_shift >= 0 ? j >> g.b_shift : j / g.B;
    return j >= g.kv_lo && j < g.kv_hi ? g.bt[bi] : 0;
}
/* Gathers rows n0 .. n0 + 127 of one operand of C chunks per row (src: the
 * thread's first chunk of the head's row 0; blk_b, row_b: bytes per block and
 * between rows) into the stage at dst by 128 threads (index t; wg_split:
 * chunk t % TPR + TPR s of rows t / TPR + RP k), with the block ids staged in
 * shared memory (int32 [128] at sids): no global load on the copy path. PAIR:
 * also the second operand (src2 into dst2) at the same offsets (K and V when
 * DK = DV). POW2: B is a power of two (a mask instead of a division; two
 * instantiations, so the common path carries no division code). */
template <int C, bool PAIR, bool POW2, int BN>
static __device__ __forceinline__ void
wg_gather_rows(const wg_kv &g, const char *src, const char *src2, int64_t blk_b, int row_b, int t,
               int n0, uint32_t dst, uint32_t dst2, uint32_t sids)
{
    typedef wg_split<C> sp;
    const int lrow = t >> (sp::TPR == 16 ? 4 : 3), lch = t & (sp::TPR - 1);
    const uint32_t swz =
        (uint32_t)((lch >> 3) * BN * 128 + lrow * 128 + (((lch & 7) ^ (lrow & 7)) << 4));
#pragma unroll
    for (int k = 0; k < BN / sp::RP; k++) {
        const int row = lrow + sp::RP * k, j = n0 + row;
        const int o = POW2 ? j & (g.B - 1) : j % g.B;
        const bool in = j >= g.kv_lo && j < g.kv_hi;
        int blk;
        asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(blk) : "r"(sids + 4u * (uint32_t)row));
        const int64_t off = in ? (int64_t)blk * blk_b + (int64_t)o * row_b : 0;
#pragma unroll
        for (int st = 0; st < sp::SETS; st++) {
            /* Chunk lch + TPR st: column block (lch + TPR st) / 8; within the
             * block the chunk is swizzled by the row (wg_swz; RP and TPR are
             * multiples of 8). */
            const uint32_t so = swz + (uint32_t)((sp::TPR * st >> 3) * BN * 128 + k * sp::RP * 128);
            kva__cp_async16(dst + so, src + off + sp::TPR * st * 16, in ? 16 : 0);
            if (PAIR)
                kva__cp_async16(dst2 + so, src2 + off + sp::TPR * st * 16, in ? 16 : 0);
        }
    }
}
/* Gathers keys n0 .. n0 + BN - 1 of K [BN, DK] into sk and V [BN, DV] into
 * sv (one pass over the rows when DK = DV). */
template <int DK, int DV, int BN>
static __device__ __forceinline__ void wg_gather_ids(const wg_kv &g, int t, int n0, uint32_t sk,
                                                     uint32_t sv, uint32_t sids)
{
    if constexpr (DK == DV) {
        if (g.b_shift >= 0)
            wg_gather_rows<DK / 8, true, true, BN>(g, g.k, g.v, g.k_blk, g.k_row, t, n0, sk, sv,
                                                   sids);
        else
            wg_gather_rows<DK / 8, true, false, BN>(g, g.k, g.v, g.k_blk, g.k_row, t, n0, sk, sv,
                                                    sids);
    } else if (g.b_shift >= 0) {
        wg_gather_rows<DK / 8, false, true, BN>(g, g.k, g.k, g.k_blk, g.k_row, t, n0, sk, sk, sids);
        wg_gather_rows<DV / 8, false, true, BN>(g, g.v, g.v, g.v_blk, g.v_row, t, n0, sv, sv, sids);
    } else {
        wg_gather_rows<DK / 8, false, false, BN>(g, g.k, g.k, g.k_blk, g.k_row, t, n0, sk, sk,
                                                 sids);
        wg_gather_rows<DV / 8, false, false, BN>(g, g.v, g.v, g.v_blk, g.v_row, t, n0, sv, sv,
                                                 sids);
    }
}

/* The gather state of tile t for thread tid of the producer (its first chunk
 * of a K and a V row: wg_split). */
template <int DK, int DV>
static __device__ __forceinline__ void wg_kv_init(wg_kv &g, const kva__cuda_prefill_args &a,
                                                  const wg_tile &t, int tid)
{
    const int Hkv = a.num_kv_heads, B = a.block_size, nhd = a.layout == KVA_LAYOUT_NHD;
    const int bt_stride =
        a.block_table_stride_dev ? *a.block_table_stride_dev : a.block_table_stride;
    g.bt = a.block_table + (size_t)t.r * bt_stride;
    /* Rows of D elements before this kv head's first row: NHD kvh, HND kvh * B. */
    const int64_t head_rows = nhd ? (int64_t)t.kvh : (int64_t)t.kvh * B;
    const int64_t k_off = (head_rows * DK + (tid & (wg_split<DK / 8>::TPR - 1)) * 8) * 2;
    g.k = (const char *)a.k + k_off;
    g.v = (const char *)a.v +
          (DK == DV ? k_off : (head_rows * DV + (tid & (wg_split<DV / 8>::TPR - 1)) * 8) * 2);
    g.k_blk = (int64_t)B * Hkv * DK * 2;
    g.v_blk = (int64_t)B * Hkv * DV * 2;
    g.k_row = (nhd ? Hkv * DK : DK) * 2;
    g.v_row = (nhd ? Hkv * DV : DV) * 2;
    g.B = B;
    g.b_shift = (B & (B - 1)) == 0 ? __ffs(B) - 1 : -1;
    g.kv_lo = t.kv_lo;
    g.kv_hi = t.kv_hi;
}
/* Q rows m0 + r0 .. m0 + r0 + nrows - 1 of the tile (zeros past the request)
 * into the swizzled [M, DK] Q operand at sq, by NT threads (index t).
 * Where C (16-byte chunks per row) divides NT into RPI = NT / C, a multiple
 * of 8 dividing nrows (DK 64 and 128), a thread copies chunk t % C of
 * rows r0 + t / C + RPI k: its
 * shared-memory address steps by RPI rows (the swizzle depends on the row
 * mod 8 only) and its (token, head) by RPI packed rows, di tokens and dg
 * heads with a carry past G, so only the first row takes a division. Other
 * DK (192, 256) take a division per chunk. */
template <int NT, int DK, int M>
static __device__ __forceinline__ void wg_load_q(const kva__cuda_prefill_args &a, const wg_tile &tl,
                                                 uint32_t sq, int r0, int nrows, int t,
                                                 const wg_div &gd)
{
    typedef uint16_t elem;
    constexpr int C = DK / 8; /* 16-byte chunks per row */
    const elem *q = (const elem *)a.q;
    if constexpr (NT % C == 0 && (NT / C) % 8 == 0) {
        constexpr int RPI = NT / C;
        static_assert(RPI % 8 == 0, "Q rows per step: a multiple of the swizzle period");
        const int ch = t % C, row0 = r0 + t / C;
        int pm = tl.m0 + row0, i = wg_div_q(gd, pm), g = pm - i * tl.G;
        const int di = wg_div_q(gd, RPI), dg = RPI - di * tl.G;
        const elem *base = q + (size_t)tl.kvh * tl.G * DK + ch * 8;
        const uint32_t dst = sq + wg_swz(row0, ch, M);
        for (int k = 0; k * RPI < nrows; k++) {
            const bool in = pm < tl.rows;
            const elem *src =
                in ? base + ((size_t)(tl.q_start + i) * a.num_heads + (size_t)g) * DK : q;
            kva__cp_async16(dst + (uint32_t)(k * RPI * 128), src, in ? 16 : 0);
            pm += RPI;
            i += di;
            g += dg;
            if (g >= tl.G) {
                g -= tl.G;
                i++;
            }
        }
    } else {
        for (int idx = t; idx < nrows * C; idx += NT) {
            const int row = r0 + idx / C, ch = idx % C, pm = tl.m0 + row;
            const elem *src = q;
            int bytes = 0;
            if (pm < tl.rows) {
                const int i = wg_div_q(gd, pm), g = pm - i * tl.G;
                src = q +
                      ((size_t)(tl.q_start + i) * a.num_heads + (size_t)tl.kvh * tl.G + g) * DK +
                      ch * 8;
                bytes = 16;
            }
            kva__cp_async16(sq + wg_swz(row, ch, M), src, bytes);
        }
    }
}
/* S = Q K^T [64, BN] for one warpgroup: DK / 16 k-steps over D (4 per
 * 64-element column block of Q [M, DK] and K [BN, DK]); m64n128k16 or
 * m64n64k16 (BN = 2 NS). */
template <typename Ty, int DK, int M, int NS>
static __device__ __forceinline__ void wg_qk(float (&s)[NS], uint64_t dq, uint64_t dk)
{
    constexpr int BN = 2 * NS;
#pragma unroll
    for (int kk = 0; kk < DK / 16; kk++) {
        const uint64_t qa = dq + (uint64_t)(((kk >> 2) * M * 128 + (kk & 3) * 32) >> 4);
        const uint64_t kb = dk + (uint64_t)(((kk >> 2) * BN * 128 + (kk & 3) * 32) >> 4);
        if constexpr (BN == 64)
            wg_ops<Ty>::ss64(s, qa, kb, kk > 0);
        else
            wg_ops<Ty>::ss(s, qa, kb, kk > 0);
    }
}
/* O [64, DV] += P V for one warpgroup: KS = BN / 16 k-steps over the tile's
 * keys (m64n128k16, m64n64k16 at DV 64, two m64n128k16 at DV 256: columns
 * 0..127 into o[0..63] and 128..255, V's column blocks 2 and 3 at 2 BN 128
 * bytes on, into o[64..127], which is the accumulator layout of one
 * m64n256k16). */
template <typename Ty, int DV, int KS>
static __device__ __forceinline__ void wg_pv(float (&o)[DV / 2], const uint32_t (&pa)[KS][4],
                                             uint64_t dv)
{
#pragma unroll
    for (int kk = 0; kk < KS; kk++) {
        const uint64_t vb = dv + (uint64_t)((kk * 16 * 128) >> 4);
        if constexpr (DV == 64) {
            wg_ops<Ty>::rs64(o, pa[kk], vb);
        } else if constexpr (DV == 256) {
            constexpr int BN = KS * 16;
            wg_ops<Ty>::rs(o, pa[kk], vb);
            wg_ops<Ty>::rs(o + 64, pa[kk], vb + (uint64_t)((2 * BN * 128) >> 4));
        } else {
            wg_ops<Ty>::rs(o, pa[kk], vb);
        }
    }
}
#endif /* KVA_WGMMA_BODY */

/*
 * TMA (KVA__CUDA_PREFILL_WGMMA_TMA). Two tensor maps over the paged cache, K and V, each
 * rank 4 with the dimensions in increasing stride: NHD [NB, B, Hkv, D] as
 * (D, Hkv, B, NB), HND [NB, Hkv, B, D] as (D, B, Hkv, NB) (D: DK for K, DV
 * for V); box 64 elements of D by box_rows = min(B, BN) key rows of one head of one block,
 * 128-byte swizzle, so a box lands as box_rows rows of 128 bytes in exactly the swizzled [rows][64]
 * column-block layout of wg_swz (the box's shared-memory address is 1024-byte aligned because
 * box_rows is a multiple of 8). Built on the host per launch (kva__wg_tmaps_encode); ok = 0 when
 * the cache cannot be described (B not a power of two >= 8, NB unknown, encode failure): the kernel
 * then gathers every tile by cp.async.
 */
struct wg_tmaps {
    CUtensorMap k, v; /* 64-byte aligned, 128 bytes each */
    int ok, box_rows;
};

#endif
