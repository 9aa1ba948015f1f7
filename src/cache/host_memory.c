/*
 * host_memory.c - the host memory space (kva__host_memory): where the
 * reference and CPU backends keep their caches and workspace, and the
 * space every backend's block copy can reach (CUDA's swap-in and swap-out).
 *
 * The table's cache writes and block copies live next to their validation
 * (kva__host_cache_write in cache_write.c, kva__host_copy_blocks in
 * cache_copy.c), the workspace in src/core/context.c; this file allocates
 * and frees cache storage.
 */
#if defined(__linux__)
#define _DEFAULT_SOURCE /* madvise */
#include <sys/mman.h>
#endif
#include "internal.h"

#include <stdlib.h>
#include <string.h>

/* Host memory for one of K/V: 64-byte aligned (SIMD loads), size rounded up.
 * Caches of 2 MiB or more are 2 MiB aligned and asked to be backed by huge
 * pages (Linux THP in madvise mode): attention reads a few rows of every
 * 4 KiB page of a block (one kv head's rows, Hkv * D elements apart), so with
 * 4 KiB pages nearly every other key is a TLB miss. */
static void *alloc_host(uint64_t bytes)
{
    const uint64_t huge = (uint64_t)2 << 20;
    uint64_t align = bytes >= huge ? huge : 64u;
    uint64_t rounded = (bytes + align - 1) & ~(align - 1);
    if (rounded < bytes || rounded > (uint64_t)PTRDIFF_MAX)
        return NULL;
    void *p = aligned_alloc((size_t)align, (size_t)rounded);
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    if (p && align == huge)
        (void)madvise(p, (size_t)rounded, MADV_HUGEPAGE); /* a hint: failure is harmless */
#endif
    return p;
}

/* K [NB * k_block_elems], V [NB * v_block_elems] and, for the INT8_TOKEN_K
 * formats, the per-token key scales [NB, Hkv, B] float32, zeroed (a slot
 * never written dequantizes to 0). The static scales stay where they are. */
static kva_status host_cache_alloc(kva_context *ctx, kva_cache *c)
{
    (void)ctx;
    const kva_cache_desc *d = &c->desc;
    const uint64_t nb = (uint64_t)d->num_blocks;
    const uint64_t kb = nb * (uint64_t)c->k_block_elems * c->elem_size;
    const uint64_t vb = nb * (uint64_t)c->v_block_elems * c->v_elem;
    const uint64_t tb = nb * (uint64_t)d->block_size * (uint64_t)d->num_kv_heads * sizeof(float);
    const int token_k =
        d->quant == KVA_QUANT_INT8_TOKEN_K || d->quant == KVA_QUANT_INT8_TOKEN_K_V16;
    c->k = alloc_host(kb);
    /* An MLA cache's values live in its K rows (v_block_elems 0). */
    c->v = c->v_block_elems > 0 ? alloc_host(vb) : c->k;
    c->owns_memory = 1;
    if (token_k) {
        c->k_token_scale = alloc_host(tb);
        if (c->k_token_scale)
            memset(c->k_token_scale, 0, (size_t)tb);
    }
    if (!c->k || !c->v || (token_k && !c->k_token_scale))
        return kva__fail(KVA_STATUS_OUT_OF_MEMORY,
                         "kva_cache_create: cannot allocate %llu bytes of K and %llu bytes of V",
                         (unsigned long long)kb, (unsigned long long)vb);
    return KVA_STATUS_OK;
}

static void host_cache_free(kva_cache *c)
{
    if (c->owns_memory) {
        if (c->v != c->k)
            free(c->v);
        free(c->k);
    }
    free(c->k_token_scale);
}

const kva__memory_ops kva__host_memory = {
    .name = "host",
    .host = 1,
    .per_device = 0,
    .workspace_reserve = kva__host_workspace_reserve,
    .workspace_free = kva__host_workspace_free,
    .cache_alloc = host_cache_alloc,
    .cache_free = host_cache_free,
    .cache_write = kva__host_cache_write,
    .copy_blocks = kva__host_copy_blocks,
    .cache_read = kva__host_cache_read,
};
