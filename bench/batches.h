/*
 * batches.h - random serving batches for attention tests and benchmarks
 * (tests reach it through tests/batchgen.h, which adds the harness).
 *
 * A kva_test_batch holds the host metadata of one step (query_start_loc,
 * seq_lens, block table) plus a cache sized for it. Block ids are handed out
 * from a shuffled permutation, so block tables are never in order, and with
 * `share` set some requests reuse the leading blocks of the previous request
 * (a shared prefix, as a prefix cache produces).
 */
#ifndef KVA_BENCH_BATCHES_H
#define KVA_BENCH_BATCHES_H

#include "data.h"

typedef struct kva_test_batch {
    int32_t R;
    int32_t T;                /* total query tokens */
    int32_t *q_lens;          /* [R] */
    int32_t *seq_lens;        /* [R] */
    int32_t *query_start_loc; /* [R+1] */
    int32_t *block_table;     /* [R, stride] */
    int32_t stride;           /* block table row length */
    int32_t block_size;       /* B */
    int32_t num_blocks;       /* NB of the cache the batch needs */
} kva_test_batch;

/* Kinds of requests in a mixed batch. */
enum { KVA_TEST_DECODE, KVA_TEST_SPEC, KVA_TEST_CHUNKED, KVA_TEST_FRESH };

/*
 * Builds the metadata for R requests with the given q_lens and seq_lens
 * (seq_len >= q_len). Blocks come from a random permutation of
 * [0, NB) where NB leaves `spare` unused blocks; with share != 0, each request
 * after the first reuses up to half of the previous request's blocks as its
 * leading blocks (when both are long enough). Row entries past a request's
 * needed blocks are filled with -1 (never read).
 */
static inline void kva_test_batch_init(kva_test_batch *b, kva_rng *rng, int32_t R,
                                       const int32_t *q_lens, const int32_t *seq_lens,
                                       int32_t block_size, int32_t spare, int share)
{
    memset(b, 0, sizeof *b);
    b->R = R;
    b->block_size = block_size;
    b->q_lens = malloc(sizeof(int32_t) * (size_t)(R > 0 ? R : 1));
    b->seq_lens = malloc(sizeof(int32_t) * (size_t)(R > 0 ? R : 1));
    b->query_start_loc = malloc(sizeof(int32_t) * (size_t)(R + 1));
    int32_t max_blocks = 1;
    int32_t total_blocks = 0;
    b->query_start_loc[0] = 0;
    for (int32_t r = 0; r < R; r++) {
        b->q_lens[r] = q_lens[r];
        b->seq_lens[r] = seq_lens[r];
        b->query_start_loc[r + 1] = b->query_start_loc[r] + q_lens[r];
        int32_t nb = (seq_lens[r] + block_size - 1) / block_size;
        if (nb > max_blocks)
            max_blocks = nb;
        total_blocks += nb;
    }
    b->T = b->query_start_loc[R];
    b->stride = max_blocks + 1; /* one spare column so rows are not tight */
    b->num_blocks = total_blocks + spare + 1;
    int32_t *perm = malloc(sizeof(int32_t) * (size_t)b->num_blocks);
    for (int32_t i = 0; i < b->num_blocks; i++)
        perm[i] = i;
    for (int32_t i = b->num_blocks - 1; i > 0; i--) {
        int32_t j = kva_rng_int(rng, 0, i);
        int32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    b->block_table = malloc(sizeof(int32_t) * (size_t)R * (size_t)b->stride + 1);
    int32_t next = 0;
    for (int32_t r = 0; r < R; r++) {
        int32_t *row = b->block_table + (size_t)r * (size_t)b->stride;
        int32_t nb = (seq_lens[r] + block_size - 1) / block_size;
        int32_t shared = 0;
        if (share && r > 0) {
            int32_t prev_nb = (seq_lens[r - 1] + block_size - 1) / block_size;
            shared = prev_nb / 2 < nb / 2 ? prev_nb / 2 : nb / 2;
        }
        for (int32_t i = 0; i < b->stride; i++) {
            if (i < shared)
                row[i] = b->block_table[(size_t)(r - 1) * (size_t)b->stride + (size_t)i];
            else if (i < nb)
                row[i] = perm[next++];
            else
                row[i] = -1;
        }
    }
    free(perm);
}

/*
 * A random mixed batch: each request is a decode (q_len 1), a speculative
 * decode (q_len 2..4), a chunked prefill (context > 0 plus a chunk) or a
 * fresh prefill (no context), with lengths up to max_len that cross block
 * boundaries. kinds_mask selects which kinds may appear (bit = 1 << kind).
 */
static inline void kva_test_batch_random(kva_test_batch *b, kva_rng *rng, int32_t R,
                                         int32_t block_size, int32_t max_len, unsigned kinds_mask,
                                         int share)
{
    int32_t *q = malloc(sizeof(int32_t) * (size_t)(R > 0 ? R : 1));
    int32_t *s = malloc(sizeof(int32_t) * (size_t)(R > 0 ? R : 1));
    for (int32_t r = 0; r < R; r++) {
        int kind;
        do
            kind = kva_rng_int(rng, 0, 3);
        while (!(kinds_mask & (1u << kind)));
        int32_t ctx = kva_rng_int(rng, 1, max_len);
        switch (kind) {
        case KVA_TEST_DECODE:
            q[r] = 1;
            s[r] = ctx;
            break;
        case KVA_TEST_SPEC:
            q[r] = kva_rng_int(rng, 2, 4);
            s[r] = ctx + q[r];
            break;
        case KVA_TEST_CHUNKED:
            q[r] = kva_rng_int(rng, 2, max_len / 2 + 2);
            s[r] = ctx + q[r];
            break;
        default:
            q[r] = kva_rng_int(rng, 1, max_len);
            s[r] = q[r];
            break;
        }
    }
    kva_test_batch_init(b, rng, R, q, s, block_size, 3, share);
    free(q);
    free(s);
}

static inline void kva_test_batch_free(kva_test_batch *b)
{
    free(b->q_lens);
    free(b->seq_lens);
    free(b->query_start_loc);
    free(b->block_table);
    memset(b, 0, sizeof *b);
}

/* A plan descriptor for the batch with the given attention shape; mask
 * options are left off (callers set them). */
static inline kva_plan_desc kva_test_batch_plan_desc(const kva_test_batch *b, int32_t H,
                                                     int32_t Hkv, int32_t D, int32_t Dv,
                                                     kva_dtype q_dtype)
{
    kva_plan_desc d;
    memset(&d, 0, sizeof d);
    d.num_requests = b->R;
    d.query_start_loc = b->query_start_loc;
    d.seq_lens = b->seq_lens;
    d.block_table = b->block_table;
    d.block_table_stride = b->stride;
    d.block_size = b->block_size;
    d.decode_threshold = 4;
    d.num_heads = H;
    d.num_kv_heads = Hkv;
    d.head_dim = D;
    d.head_dim_v = Dv;
    d.q_dtype = q_dtype;
    d.causal = 1;
    d.window_left = -1;
    return d;
}

/* Creates a cache sized for the batch and fills all of its K and V storage
 * with unit-variance uniform values (so shared and unused blocks hold data too). */
static inline kva_status kva_test_batch_cache(const kva_test_batch *b, kva_context *ctx,
                                              kva_rng *rng, int32_t Hkv, int32_t D, int32_t Dv,
                                              kva_dtype dtype, kva_layout layout, kva_cache **out)
{
    kva_cache_desc cd;
    memset(&cd, 0, sizeof cd);
    cd.num_blocks = b->num_blocks;
    cd.block_size = b->block_size;
    cd.num_kv_heads = Hkv;
    cd.head_dim = D;
    cd.head_dim_v = Dv;
    cd.dtype = dtype;
    cd.layout = layout;
    cd.quant = KVA_QUANT_NONE;
    kva_status s = kva_cache_create(ctx, &cd, out);
    if (s != KVA_STATUS_OK)
        return s;
    void *k, *v;
    kva_cache_data(*out, &k, &v);
    size_t rows = (size_t)b->num_blocks * (size_t)b->block_size * (size_t)Hkv;
    kva_test_fill_uniform(k, dtype, rows * (size_t)D, rng);
    kva_test_fill_uniform(v, dtype, rows * (size_t)Dv, rng);
    return KVA_STATUS_OK;
}

#endif /* KVA_BENCH_BATCHES_H */
