/*
 * mla_sparse_common.cuh - what the two sparse MLA kernels share: the row
 * formats, the launch arguments, the token -> request search, the index
 * entry -> cache row lookup and the destinations of the end-of-item stores
 * (sp_dst, for ml_finish). The kernels are mla_sparse.cu (mma.sync, any H
 * in 16/32/64-row head tiles, sm_80 and up) and mla_sparse_wgmma.cu (the
 * sm_90a wgmma MLA body, 64-row head tiles).
 */
#ifndef KVA_CUDA_MLA_SPARSE_COMMON_CUH
#define KVA_CUDA_MLA_SPARSE_COMMON_CUH

#include "mla_decode_common.cuh"

#include <stdint.h>

/* Row sources. ROW: bytes per row in global memory; CH: its 16-byte chunks;
 * the rest: the row format of the mma.sync body (ml_dense_rows,
 * mla_decode_mma.cuh; stages: what fits 227 KB). */
struct sp_rows16 { /* latent rows in the q dtype: [c_kv 512 | k_pe 64] */
    static constexpr bool FP8 = false;
    static constexpr int ROW = ML_D * 2;
    static constexpr int CH = ML_CH;
    static constexpr int RAW_ROW = 0;
    static constexpr int NP = 1;
    static constexpr bool FLAGS = true;
    template <int MT> static constexpr bool BULK = false;
    template <int MT> static constexpr int PROD = 0;
    template <int MT, bool> static constexpr int NST = MT == 4 ? 3 : 2;
    template <int MT> static constexpr bool ST = false;
};
struct sp_ds_mla { /* 512 e4m3 codes, 4 float32 tile scales, 64 bf16 k_pe */
    static constexpr bool FP8 = true;
    static constexpr int ROW = 656;
    static constexpr int CH = 41;
    static constexpr int RAW_ROW = ROW;
    static constexpr int NP = ML_DV / 128;
    static constexpr bool FLAGS = true;
    /* 16-row items: one bulk copy per row (656 bytes, 16-byte aligned)
     * instead of 41 16-byte cp.async of 4 threads, which queue behind each
     * other in the load/store unit (MT 2 and 4 keep cp.async: no registers
     * to spare for the mbarrier's phases). */
    template <int MT> static constexpr bool BULK = MT == 1;
    /* 16-row items: two producer warps look up the rows and issue their
     * bulk copies (64 a tile, one per lane) while the 8 compute warps
     * compute; the compute warps no longer wait on the copy engine's
     * command queue (ml_tiles::NPW, mla_decode_mma.cuh). One producer warp
     * (two keys per lane) was slower than the compute warps' own copies on
     * the H200: the per-warp issue loop, not the copy engine, is the limit. */
    template <int MT> static constexpr int PROD = MT == 1 ? 2 : 0;
    template <int MT, bool> static constexpr int NST = MT == 4 || MT == 1 ? 3 : 2;
    /* 16-row items: the transposed S (ml_st_tile, mla_decode_mma.cuh). */
    template <int MT> static constexpr bool ST = MT == 1;
};

/* Everything one launch reads (fixed per launch, so graph-capturable). */
typedef struct sp_args {
    const void *q;             /* [T, H, 576] */
    const unsigned char *rows; /* cache storage, or the dense rows [s, 576] of one request */
    const int32_t *idx;        /* [T, K] at idx_stride */
    int64_t idx_stride;
    const int32_t *topk_len; /* [T] or NULL */
    const float *sinks;      /* [H] or NULL */
    void *out;               /* [T, H, 512] */
    float *lse;              /* [T, H] or NULL */
    float *ws;               /* split partials: [nt, H, nsplit, 512], then [nt, H, nsplit] */
    const int32_t *qsl, *seq_lens, *bt; /* the uploaded plan (device) */
    int32_t R, bt_stride, B;
    int32_t H, K, nsplit, split_keys, tiles; /* tiles: head tiles of M rows per token */
    int32_t t0, nt;                          /* the launch's tokens t0 .. t0 + nt - 1 */
    int32_t side, dthr;                      /* 1: decode tokens only (q_len <= dthr),
                                                2: prefill tokens only, 0: every token */
    int32_t dense;                           /* rows are positions of the token's request */
    float scale;
} sp_args;

/* The request of token t: the r with qsl[r] <= t < qsl[r + 1]. */
static __device__ __forceinline__ int32_t sp_request(const sp_args &a, int32_t t)
{
    int32_t lo = 0, hi = a.R - 1;
    while (lo < hi) {
        const int32_t mid = (lo + hi + 1) >> 1;
        if (__ldg(a.qsl + mid) <= t)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

/* Position of index entry j (or -1 past kend), read by the thread that will
 * copy the key. */
static __device__ __forceinline__ int32_t sp_pos(const int32_t *idx_row, int32_t j, int32_t kend)
{
    return j < kend ? __ldg(idx_row + j) : -1;
}

/* A key on its way to the ring: whether it is used, and its row as
 * blk * B + off (dense rows: blk 0, off = the position). The block-table
 * entry is loaded one tile before the copy, so the copy never waits on it. */
struct sp_key {
    int32_t ok, blk, off;
};
static __device__ __forceinline__ sp_key sp_locate(const sp_args &a, const int32_t *bt_row,
                                                   int32_t p, int32_t s)
{
    sp_key k;
    k.ok = p >= 0 && p < s;
    k.blk = k.ok && !a.dense ? __ldg(bt_row + p / a.B) : 0;
    k.off = !k.ok ? 0 : a.dense ? p : p % a.B;
    return k;
}

/* Item `it` of a launch (token, head tile of M rows, key split) and what it
 * reads: skip when the token belongs to the other side of the launch; its
 * request's seq_len and block-table row, its index row, its keys kbeg ..
 * kend - 1 (topk_length outside 0 .. K means K) and heads h0 .. h0 + nrows - 1. */
struct sp_item {
    bool skip;
    int32_t t, split, s, kbeg, kend, h0, nrows;
    const int32_t *bt_row, *idx_row;
};
template <int M>
static __device__ __forceinline__ sp_item sp_item_load(const sp_args &a, int32_t it)
{
    sp_item m;
    int32_t x = it;
    m.split = x % a.nsplit;
    x /= a.nsplit;
    const int32_t tile = x % a.tiles;
    m.t = a.t0 + x / a.tiles;
    const int32_t r = sp_request(a, m.t);
    const int32_t q_len = __ldg(a.qsl + r + 1) - __ldg(a.qsl + r);
    m.skip = (a.side == 1 && q_len > a.dthr) || (a.side == 2 && q_len <= a.dthr);
    m.s = __ldg(a.seq_lens + r);
    m.bt_row = a.bt + (int64_t)r * a.bt_stride;
    m.idx_row = a.idx + (int64_t)m.t * a.idx_stride;
    int32_t klen = a.topk_len ? __ldg(a.topk_len + m.t) : a.K;
    if (klen < 0 || klen > a.K)
        klen = a.K;
    m.kbeg = m.split * a.split_keys;
    m.kend = min(klen, m.kbeg + a.split_keys);
    m.h0 = tile * M;
    m.nrows = min(M, a.H - m.h0);
    return m;
}

/* Q [M, 576] of item m (heads h0 .. of token t, as one query row of nrows
 * heads; zeros past nrows) into shared memory at dst in layout ROWS. */
template <int M, int ROWS, typename elem>
static __device__ __forceinline__ void sp_stage_q(const sp_args &a, const sp_item &m,
                                                  unsigned char *dst)
{
    kva__cuda_item w = {};
    w.h0 = m.h0;
    w.nh = m.nrows;
    w.nq = 1;
    kva__cuda_attn_args qa = {};
    qa.q = a.q;
    qa.H = a.H;
    ml_stage_q<M, ROWS, elem>(qa, w, m.nrows, m.t, dst);
}

/* The destination policy of ml_finish (mla_decode_common.cuh) for the sparse
 * items (token t, heads h0 + r, key split `split`): split partials at
 * ws + ((t - t0) H + h) nsplit + split rows of 512 (8-byte aligned, stored in
 * pairs), their lse after all rows in log2 units (sp_merge_kernel's), or out
 * [T, H, 512] and lse [T, H] of head h0 + r. */
struct sp_dst {
    static constexpr bool PAIRS = true;
    static constexpr float LSE_UNIT = 1.f;
    static constexpr float vsc = 1.f;
    const sp_args &a;
    int32_t t, h0, nrows, split;
    __device__ __forceinline__ bool partials() const
    {
        return a.nsplit > 1;
    }
    __device__ __forceinline__ ml_part part(int32_t r) const
    {
        const int64_t prow = ((int64_t)(t - a.t0) * a.H + h0 + r) * a.nsplit + split;
        return {a.ws, prow * ML_DV, (int64_t)a.nt * a.H * a.nsplit * ML_DV + prow};
    }
    __device__ __forceinline__ ml_out out(int32_t r) const
    {
        return {t, h0 + r};
    }
};

/* The sparse MLA on the sm_90a wgmma MLA body (mla_sparse_wgmma.cu): a
 * launch of `grid` persistent CTAs over the a->nt * a->tiles * a->nsplit
 * items of 64-row head tiles, on stream; KVA_STATUS_UNSUPPORTED without
 * sm_90a code and device or for a q dtype other than f16/bf16. */
kva_status kva__cuda_sparse_wgmma_launch(const sp_args *a, kva_dtype q_dtype, int fp8, int grid,
                                         void *stream);

#endif
