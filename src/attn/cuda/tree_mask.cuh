/*
 * tree_mask.cuh - the draft-tree trait of the CUDA mask code (tree
 * verification, docs/masks.md): which of a request's last q_len keys a row
 * sees.
 *
 * A tree plan uploads one 64-bit word per query token (kva_plan.tree_bits:
 * bit k = the token sees tree token k of its request) and sets the header
 * word KVA_CUDA_HDR_TREE. Every kernel keeps its row ranges [lo, pos + 1) of
 * the causal mask; a unit of work (an item or a tile: rows of one request)
 * takes a kva__cuda_tree with the request's first tree key t0 = s - q_len,
 * and where the kernels apply their per-element mask they also require
 * kva__cuda_tree_sees. Without a tree t0 is INT32_MAX, so every key passes
 * the first comparison and no word is read. Keys below t0 (the committed
 * context) are visible to every row, so tiles of keys that end at or before
 * t0 keep the kernels' unmasked fast path; only tiles reaching t0 are masked,
 * and the words are read (from L1) only there. Tree plans are never sharded,
 * so positions are local: the row at position pos is query pos - t0.
 */
#ifndef KVA_CUDA_TREE_MASK_CUH
#define KVA_CUDA_TREE_MASK_CUH

#include <stdint.h>

/* The tree of the request a unit of work belongs to. */
struct kva__cuda_tree {
    const uint64_t *w; /* [q_len] the request's words (query tokens qs .. qs + q_len) */
    int32_t t0;        /* first tree key s - q_len; INT32_MAX without a tree */
    int32_t n;         /* q_len: rows past it (a tile's padding) see no tree key */
};

/* The tree of the request whose query tokens start at qs (s keys, q_len
 * queries); words = the metadata's tree section, on = the header's
 * KVA_CUDA_HDR_TREE (0: no tree). */
static __device__ __forceinline__ kva__cuda_tree kva__cuda_tree_at(const uint64_t *words,
                                                                   int32_t on, int32_t qs,
                                                                   int32_t s, int32_t q_len)
{
    kva__cuda_tree t;
    t.w = words + qs;
    t.t0 = on ? s - q_len : INT32_MAX;
    t.n = q_len;
    return t;
}

/* Whether the row at position pos may see key j under the tree (the other
 * clauses of the mask are the caller's): a committed key always, tree key
 * t0 + k if bit k of the row's word is set. */
static __device__ __forceinline__ bool kva__cuda_tree_sees(const kva__cuda_tree &t, int32_t pos,
                                                           int32_t j)
{
    if (j < t.t0)
        return true;
    const uint32_t k = (uint32_t)(j - t.t0), i = (uint32_t)(pos - t.t0);
    return k < 64u && i < (uint32_t)t.n && ((__ldg(t.w + i) >> k) & 1u);
}

/* The low n bits set, n in [0, 32]. */
static __device__ __forceinline__ uint32_t kva__cuda_ones32(int32_t n)
{
    return n >= 32 ? 0xffffffffu : (1u << n) - 1u;
}

/*
 * The visibility word of one row for the 32 keys kb .. kb + 31: bit i set
 * iff the row sees key kb + i, that is lo <= kb + i < hi (causal, seq_len,
 * window, chunk: the row's bounds) and, for a tree key kb + i >= t0, bit
 * kb + i - t0 of the row's tree word tw (0 for rows off the tree; t0 =
 * INT32_MAX without a tree). Kernels build a row's words once per masked key
 * tile, so the per-element test of the unrolled softmax loop is one bit test
 * with a constant position (docs/cuda-prefill.md: the kernels' code size).
 */
static __device__ __forceinline__ uint32_t kva__cuda_vis_word(int32_t kb, int32_t lo, int32_t hi,
                                                              int32_t t0, uint64_t tw)
{
    const int32_t a = min(max(lo - kb, 0), 32), b = min(max(hi - kb, 0), 32);
    uint32_t m = kva__cuda_ones32(b) & ~kva__cuda_ones32(a);
    const int32_t d = kb - t0; /* tree key of bit 0 (negative: below the tree) */
    if (d > -32) {
        const uint32_t tb = d >= 64 ? 0u : d >= 0 ? (uint32_t)(tw >> d) : (uint32_t)(tw << -d);
        m &= kva__cuda_ones32(max(-d, 0)) | tb; /* committed keys below t0, tree keys */
    }
    return m;
}

#endif /* KVA_CUDA_TREE_MASK_CUH */
