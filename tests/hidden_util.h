/*
 * hidden_util.h - the cases of the hidden-slot tests (test_api_blackbox_hidden.c
 * on the reference and CPU backends, tests/cuda/test_cuda_hidden.c on CUDA):
 * a paged cache whose whole storage first holds garbage (NaN, +inf or -inf
 * bit patterns of each format: kvattn.h's "contents unspecified until
 * written"), then only the keys each request has, written through
 * kva_cache_write; selected keys inside seq_len that some rows do not see
 * (causal, window, chunk, tree, sparse index lists) are then overwritten with
 * non-finite rows. The same run on a clean twin cache (zeros, the written
 * keys with their finite values) gives the truth: every row that sees no
 * overwritten key must come out the same up to rounding (out and lse). Slot
 * classes covered: page tails past seq_len, block-table entries past a
 * request's pages (valid ids of garbage blocks), rows of q_len 0 requests,
 * keys hidden by the masks from rows of the same request, unlisted keys of
 * sparse plans, the other rank's keys of DCP plans.
 * Host memory only: the CUDA test copies the storage to and from the device.
 */
#ifndef KVA_TEST_HIDDEN_UTIL_H
#define KVA_TEST_HIDDEN_UTIL_H

#include "cache_util.h"

enum { HC_MAXR = 4, HC_MAXBT = 8, HC_MAXT = 48, HC_MAXK = 16, HC_MAXHID = 4 };

/* The entry point a case runs. */
enum { HC_ATTN = 0, HC_MLA_RUN = 1, HC_SPARSE = 2 };
/* The garbage of a pass: NaN, +inf or -inf patterns (int8 codes 127 / -128,
 * e4m3 codes NaN / +448 / -448 where the format has no infinity). */
enum { HC_NAN = 0, HC_PINF = 1, HC_NINF = 2, HC_PATTERNS = 3 };

typedef struct hc_case {
    char name[96];
    int api;
    kva_cache_desc cd;
    kva_plan_desc pd; /* points into the arrays below (hc_fix_ptrs) */
    int32_t qsl[HC_MAXR + 1], sl[HC_MAXR], bt[HC_MAXR * HC_MAXBT], tree[HC_MAXT];
    int32_t idx[HC_MAXT * HC_MAXK];
    /* Positions inside seq_len (global) overwritten with garbage, per request. */
    int32_t hid[HC_MAXR][HC_MAXHID];
    int nhid[HC_MAXR];
    int32_t T;
} hc_case;

static inline void hc_fix_ptrs(hc_case *c)
{
    c->pd.query_start_loc = c->qsl;
    c->pd.seq_lens = c->sl;
    c->pd.block_table = c->bt;
    if (c->pd.tree_parents)
        c->pd.tree_parents = c->tree;
}

/* Keys request r holds on this plan's rank. */
static inline int32_t hc_local_len(const hc_case *c, int r)
{
    int32_t n = c->sl[r];
    if (c->pd.dcp_size > 1)
        kva_dcp_local_lens(1, &c->sl[r], c->pd.dcp_size, c->pd.dcp_rank,
                           c->pd.dcp_interleave ? c->pd.dcp_interleave : 1, &n);
    return n;
}

/* A batch of R requests (q_lens, seq_lens) over a cache with blocks of B
 * tokens: each request gets ceil(local_len / B) blocks in a scattered order;
 * every block-table entry past them names one of two spare blocks that no
 * request owns (garbage). kind, formats and heads as given. */
static inline void hc_init(hc_case *c, const char *name, int R, const int32_t *ql,
                           const int32_t *sl, int32_t B, int32_t Hkv, int32_t H, int32_t D,
                           int32_t Dv, kva_dtype dt, kva_layout layout, kva_quant quant,
                           kva_attn_kind kind)
{
    memset(c, 0, sizeof *c);
    snprintf(c->name, sizeof c->name, "%s", name);
    c->pd.num_requests = R;
    for (int r = 0; r < R; r++) {
        c->qsl[r + 1] = c->qsl[r] + ql[r];
        c->sl[r] = sl[r];
    }
    c->T = c->qsl[R];
    c->pd.block_table_stride = HC_MAXBT;
    c->pd.block_size = B;
    c->pd.num_heads = H;
    c->pd.num_kv_heads = Hkv;
    c->pd.head_dim = D;
    c->pd.head_dim_v = Dv;
    c->pd.q_dtype = quant == KVA_QUANT_NONE               ? dt
                    : quant == KVA_QUANT_INT8_TOKEN_K_V16 ? dt
                                                          : KVA_DTYPE_BF16;
    c->pd.causal = 1;
    c->pd.window_left = -1;
    c->pd.kind = kind;
    c->pd.cascade = KVA_CASCADE_OFF;
    c->cd = (kva_cache_desc){1, B, Hkv, D, Dv, dt, layout, quant, kind};
}

/* Assigns blocks once the plan fields that change local lengths are set. */
static inline void hc_blocks(hc_case *c)
{
    const int R = c->pd.num_requests;
    const int32_t B = c->pd.block_size;
    int32_t used = 0;
    for (int r = 0; r < R; r++)
        used += (hc_local_len(c, r) + B - 1) / B;
    const int32_t nb = used + 2;
    /* Blocks nb - 2 and nb - 1 are the spares. */
    int32_t next = 0;
    for (int r = 0; r < R; r++) {
        const int32_t n = (hc_local_len(c, r) + B - 1) / B;
        /* Request r owns blocks next .. next + n - 1, in a permuted order;
         * the entries past them name the spares. */
        for (int32_t k = 0; k < HC_MAXBT; k++)
            c->bt[r * HC_MAXBT + k] = k < n ? next + (n - 1 - k) : used + (k + r) % 2;
        next += n;
    }
    c->cd.num_blocks = nb;
    hc_fix_ptrs(c);
}

/* Whether query row i of request r sees key j (kvattn.h's visibility rule;
 * sparse: j is listed in the token's index row). */
static inline int hc_visible(const hc_case *c, int r, int32_t i, int32_t j)
{
    const int32_t q = c->qsl[r + 1] - c->qsl[r], s = c->sl[r], pos = s - q + i;
    if (c->api == HC_SPARSE) {
        const int32_t *row = c->idx + (size_t)(c->qsl[r] + i) * c->pd.sparse_topk;
        for (int32_t k = 0; k < c->pd.sparse_topk; k++)
            if (row[k] == j)
                return 1;
        return 0;
    }
    if (j >= s || j < 0)
        return 0;
    if (c->pd.causal && j > pos)
        return 0;
    if (c->pd.window_left >= 0 && pos - j > c->pd.window_left)
        return 0;
    if (c->pd.attention_chunk > 0 && j / c->pd.attention_chunk != pos / c->pd.attention_chunk)
        return 0;
    if (c->pd.tree_parents && j >= s - q) {
        int32_t k = j - (s - q), t = i;
        while (t >= 0 && t != k)
            t = c->tree[c->qsl[r] + t];
        return t == k;
    }
    return 1;
}

/* Whether some query row of request r sees key j. */
static inline int hc_seen(const hc_case *c, int r, int32_t j)
{
    for (int32_t i = 0; i < c->qsl[r + 1] - c->qsl[r]; i++)
        if (hc_visible(c, r, i, j))
            return 1;
    return 0;
}

/* Whether a row of token t (of request r, row i) sees no overwritten key. */
static inline int hc_row_checked(const hc_case *c, int r, int32_t i)
{
    for (int k = 0; k < c->nhid[r]; k++)
        if (hc_visible(c, r, i, c->hid[r][k]))
            return 0;
    return 1;
}

/* ---- garbage ---- */

static inline void hc_fill16(void *p, size_t bytes, uint16_t v)
{
    for (size_t i = 0; i < bytes / 2; i++)
        memcpy((char *)p + 2 * i, &v, 2);
}
static inline void hc_fill32(void *p, size_t bytes, float v)
{
    for (size_t i = 0; i < bytes / 4; i++)
        memcpy((char *)p + 4 * i, &v, 4);
}

/* Fills bytes of storage of element type dt with pattern pat. */
static inline void hc_garbage(void *p, size_t bytes, kva_dtype dt, int pat)
{
    const float f = pat == HC_NAN ? NAN : pat == HC_PINF ? INFINITY : -INFINITY;
    switch (dt) {
    case KVA_DTYPE_F32:
        hc_fill32(p, bytes, f);
        break;
    case KVA_DTYPE_F16:
        hc_fill16(p, bytes, pat == HC_NAN ? 0x7e00 : pat == HC_PINF ? 0x7c00 : 0xfc00);
        break;
    case KVA_DTYPE_BF16:
        hc_fill16(p, bytes, pat == HC_NAN ? 0x7fc0 : pat == HC_PINF ? 0x7f80 : 0xff80);
        break;
    case KVA_DTYPE_FP8_E4M3:
        memset(p, pat == HC_NAN ? 0x7f : pat == HC_PINF ? 0x7e : 0xfe, bytes);
        break;
    default:
        memset(p, pat == HC_NINF ? 0x80 : 0x7f, bytes);
        break; /* int8: largest codes */
    }
}

/* Fills a host cache's whole storage (keys, values, per-token scales) with
 * garbage; zeros when pat < 0. FP8_DS_MLA rows mix codes, float32 scales and
 * bf16 k_pe: bytes 0xff (NaN in all three), 0x7f (NaN codes, scales and k_pe
 * 3.4e38) or 0xfe (-448, -1.7e38). */
static inline void hc_fill_storage(kva_cache *c, int pat, void *k, void *v, float *ts)
{
    kva_cache_desc d;
    CHECK_OK(kva_cache_get_desc(c, &d));
    const size_t nb = (size_t)d.num_blocks;
    const size_t kb = kva_cache_block_bytes_k(c) * nb, vb = kva_cache_block_bytes_v(c) * nb;
    const size_t sb = kva_cache_block_bytes_scales(c) * nb;
    if (pat < 0) {
        memset(k, 0, kb);
        if (vb)
            memset(v, 0, vb);
        if (sb)
            memset(ts, 0, sb);
        return;
    }
    if (d.quant == KVA_QUANT_FP8_DS_MLA) {
        memset(k, pat == HC_NAN ? 0xff : pat == HC_PINF ? 0x7f : 0xfe, kb);
        return;
    }
    const kva_dtype kdt = d.quant == KVA_QUANT_INT8_TOKEN_K_V16 ? KVA_DTYPE_I8 : d.dtype;
    hc_garbage(k, kb, kdt, pat);
    if (vb)
        hc_garbage(v, vb, d.dtype, pat);
    if (sb)
        hc_garbage(ts, sb, KVA_DTYPE_F32, pat);
}

/* The value a hidden key's row is overwritten with through kva_cache_write
 * (f32 source): NaN / +-inf for float and FP8 rows; int8 rows cannot hold
 * NaN, so +-1e30 (saturated codes; the per-token key scale is then set to
 * the pattern directly, hc_poison_scale). */
static inline float hc_hidden_value(const kva_cache_desc *d, int pat)
{
    const int int8 = d->quant == KVA_QUANT_INT8_CHANNEL || d->quant == KVA_QUANT_INT8_TOKEN_K ||
                     d->quant == KVA_QUANT_INT8_TOKEN_K_V16;
    if (int8)
        return pat == HC_NINF ? -1e30f : 1e30f;
    return pat == HC_NAN ? NAN : pat == HC_PINF ? INFINITY : -INFINITY;
}

#endif /* KVA_TEST_HIDDEN_UTIL_H */
