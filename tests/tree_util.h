/*
 * tree_util.h - draft trees for the tree-verification tests (test_tree_attn.c
 * on ref/CPU, cuda/test_cuda_tree.c): parents of a chain, a star, a depth-8
 * tree or a random tree, and FlashInfer's packed_custom_mask of a batch of
 * trees.
 */
#ifndef KVA_TEST_TREE_UTIL_H
#define KVA_TEST_TREE_UTIL_H

#include "harness.h"

#include <stdint.h>
#include <string.h>

enum { TREE_CHAIN, TREE_STAR, TREE_DEPTH8, TREE_RANDOM };

/* Parents [q] of a tree of the given kind. */
static inline void make_tree(int kind, int32_t q, kva_rng *rng, int32_t *par)
{
    for (int32_t i = 0; i < q; i++) {
        if (kind == TREE_CHAIN)
            par[i] = i - 1;
        else if (kind == TREE_STAR)
            par[i] = i == 0 ? -1 : 0;
        else if (kind == TREE_DEPTH8) /* a chain of 8, then branches off it */
            par[i] = i < 8 ? i - 1 : kva_rng_int(rng, 0, 6);
        else
            par[i] = kva_rng_int(rng, -1, i - 1);
    }
}

/* Packs request trees (parents pars, q_lens qs, R requests) into FlashInfer's
 * packed_custom_mask of the tree part, little bit order, each request on a
 * new byte. mask must hold sum ceil(q^2 / 8) bytes. */
static inline void pack_mask(int32_t R, const int32_t *qs, const int32_t *pars, uint8_t *mask)
{
    size_t byte = 0, t0 = 0;
    for (int32_t r = 0; r < R; r++) {
        const int32_t q = qs[r];
        memset(mask + byte, 0, ((size_t)q * q + 7) / 8);
        for (int32_t i = 0; i < q; i++)
            for (int32_t k = i; k >= 0; k = pars[t0 + k]) {
                const size_t e = (size_t)i * q + k;
                mask[byte + e / 8] |= (uint8_t)(1u << (e % 8));
            }
        byte += ((size_t)q * q + 7) / 8;
        t0 += q;
    }
}

#endif /* KVA_TEST_TREE_UTIL_H */
