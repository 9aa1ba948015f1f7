/*
 * tree.c - the tree-verification mask of a plan (kva_plan_desc.tree_parents
 * or .tree_mask): validation, and the per-query-token words the kernels read.
 *
 * A tree plan stores, for every query token t, a 64-bit word whose bit k says
 * that t sees tree token k of its request (k = t itself or an ancestor). The
 * kernels keep their contiguous per-row key range [lo, pos + 1) and mask the
 * request's last q_len keys with the word (the CPU decode kernels through
 * kva__tree_lanes, the tiled prefill kernels through pf_tree_mask); the
 * committed context before them is read once per item for every row, as for
 * an ordinary speculative decode. The CUDA backend uploads the words with the
 * plan and its kernels AND them into their masks (src/attn/cuda/tree_mask.cuh).
 */
#include "internal.h"

#include <stdint.h>
#include <stdlib.h>

/* The masks the tree cannot be combined with, and the shape it needs. */
static kva_status check_tree_scalars(const kva_plan_desc *d)
{
    static const char fn[] = "kva_plan_create";
    if (d->tree_parents && d->tree_mask)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "%s: tree_parents and tree_mask are both given: pass one of them", fn);
    if (!d->causal)
        return kva__fail(KVA_STATUS_UNSUPPORTED,
                         "%s: a draft tree (tree_parents / tree_mask) needs causal = 1", fn);
    if (d->window_left >= 0 || d->attention_chunk > 0 || d->alibi_slopes ||
        d->kind == KVA_ATTN_MLA || d->dcp_size > 1)
        return kva__fail(KVA_STATUS_UNSUPPORTED,
                         "%s: a draft tree takes no window_left (%d), attention_chunk (%d), "
                         "alibi_slopes (%s), MLA kind or dcp_size > 1 (%d)",
                         fn, (int)d->window_left, (int)d->attention_chunk,
                         d->alibi_slopes ? "given" : "NULL", (int)d->dcp_size);
    return KVA_STATUS_OK;
}

/* Bit (i, k) of request r's packed segment (FlashInfer's little bit order). */
static int mask_bit(const uint8_t *seg, int32_t q, int32_t i, int32_t k)
{
    const int64_t e = (int64_t)i * q + k;
    return (seg[e >> 3] >> (e & 7)) & 1;
}

/* Checks request r's tree (q tokens from query token t0) and writes its
 * words bits [q]. */
static kva_status tree_request(const kva_plan_desc *d, int32_t r, int32_t t0, int32_t q,
                               const uint8_t *seg, uint64_t *bits)
{
    static const char fn[] = "kva_plan_create";
    if (q > KVA_MAX_TREE_TOKENS)
        return kva__fail(KVA_STATUS_UNSUPPORTED,
                         "%s: request %d has q_len = %d, but a draft tree has at most %d tokens "
                         "(KVA_MAX_TREE_TOKENS)",
                         fn, (int)r, (int)q, KVA_MAX_TREE_TOKENS);
    for (int32_t i = 0; i < q; i++) {
        if (d->tree_parents) {
            const int32_t par = d->tree_parents[t0 + i];
            if (par < -1 || par >= i)
                return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                                 "%s: tree_parents[%d] = %d (token %d of request %d): a parent "
                                 "is -1 (a root) or an earlier token of the request (0 .. %d)",
                                 fn, (int)(t0 + i), (int)par, (int)i, (int)r, (int)i - 1);
            bits[i] = (par < 0 ? 0 : bits[par]) | ((uint64_t)1 << i);
        } else {
            uint64_t w = 0;
            for (int32_t k = 0; k < q; k++)
                if (mask_bit(seg, q, i, k)) {
                    if (k > i)
                        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                                         "%s: tree_mask of request %d: row %d sees token %d "
                                         "after it (tree tokens come in topological order: "
                                         "no bit above the diagonal)",
                                         fn, (int)r, (int)i, (int)k);
                    w |= (uint64_t)1 << k;
                }
            if (!(w >> i & 1))
                return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                                 "%s: tree_mask of request %d: row %d lacks its diagonal bit "
                                 "(every token sees itself)",
                                 fn, (int)r, (int)i);
            bits[i] = w;
        }
    }
    return KVA_STATUS_OK;
}

kva_status kva__plan_tree_bits(const kva_plan_desc *d, uint64_t **out)
{
    *out = NULL;
    if (!d->tree_parents && !d->tree_mask)
        return KVA_STATUS_OK;
    KVA_TRY(check_tree_scalars(d));
    const int32_t R = d->num_requests;
    const int32_t T = R > 0 ? d->query_start_loc[R] : 0;
    uint64_t *bits = malloc(sizeof(uint64_t) * (size_t)(T > 0 ? T : 1));
    if (!bits)
        return kva__fail(KVA_STATUS_OUT_OF_MEMORY, "kva_plan_create: out of memory (%d tree words)",
                         (int)T);
    int64_t byte = 0; /* start of request r's segment in tree_mask */
    for (int32_t r = 0; r < R; r++) {
        const int32_t t0 = d->query_start_loc[r], q = d->query_start_loc[r + 1] - t0;
        const kva_status st =
            tree_request(d, r, t0, q, d->tree_mask ? d->tree_mask + byte : NULL, bits + t0);
        if (st != KVA_STATUS_OK) {
            free(bits);
            return st;
        }
        byte += ((int64_t)q * q + 7) / 8;
    }
    *out = bits;
    return KVA_STATUS_OK;
}
