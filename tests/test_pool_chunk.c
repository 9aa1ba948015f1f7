/*
 * test_pool_chunk.c - kva_pool_request_drop_chunk, the block pool's side of
 * chunked local attention (vLLM's chunked-local manager).
 *
 *   - Its invariants over random decode and prefill steps of several
 *     requests with chunk sizes at, below and above the block size (and not
 *     multiples of it): after every drop, exactly the blocks that end at or
 *     before the chunk start of the next token are the null block, every
 *     other block of the request is a real one, the pool's own checker
 *     (kva_pool_check) passes and used + free = NB - 1; a second drop is a
 *     no-op; the kept blocks' slots are still served.
 *   - End to end: a request decoded step by step from a pool with C = 24
 *     and B = 8; the null block 0 holds NaN in the cache, so attention with
 *     attention_chunk = C over the pool's block table (with its null
 *     entries) must equal the reference over a full table.
 *   - Bad input: chunk_tokens < 1, an unknown request: status, nothing changed.
 */
#include "harness.h"

#include "../bench/batches.h"
#include "../src/pool/pool_internal.h"

static kva_pool *make_pool(int32_t nb, int32_t bs)
{
    kva_pool_desc d = {nb, bs, KVA_POOL_HASH_SHA256, 1};
    kva_pool *p = NULL;
    CHECK_OK(kva_pool_create(&d, &p));
    return p;
}

/* Checks request id after a drop with chunk C: blocks ending at or before the
 * chunk start of position num_tokens are null, the rest are real. */
static void check_request(const kva_pool *p, int32_t id, int32_t C)
{
    kva_pool_request_info info;
    CHECK_OK(kva_pool_request_get_info(p, id, &info));
    int32_t row[512];
    int32_t nb = 0;
    CHECK_OK(kva_pool_request_block_table(p, id, row, 512, &nb));
    const int32_t B = p->desc.block_size, start = info.num_tokens - info.num_tokens % C;
    for (int32_t i = 0; i < nb; i++) {
        const int dropped = (i + 1) * B <= start;
        CHECK_MSG(dropped ? row[i] == 0 : row[i] > 0,
                  "request %d block %d = %d (tokens %d, C %d, B %d)", (int)id, (int)i, (int)row[i],
                  (int)info.num_tokens, (int)C, (int)B);
    }
    /* The slots of the chunk's keys are still served. */
    if (info.num_tokens > start) {
        int64_t slots[512];
        const int32_t n = info.num_tokens - start < 512 ? info.num_tokens - start : 512;
        CHECK_OK(kva_pool_request_slots(p, id, start, n, slots));
    }
}

static void test_invariants(void)
{
    static const int32_t Cs[] = {16, 8, 5, 24, 100};
    kva_rng rng = {7};
    for (int ci = 0; ci < 5; ci++) {
        const int32_t B = 8, C = Cs[ci];
        kva_pool *p = make_pool(400, B);
        int32_t ids[4], tok = 1;
        for (int r = 0; r < 4; r++) {
            int32_t prompt[40], c = 0;
            const int32_t n = kva_rng_int(&rng, 1, 40);
            for (int32_t i = 0; i < n; i++)
                prompt[i] = tok++;
            CHECK_OK(kva_pool_request_add(p, prompt, n, NULL, 0, &ids[r], &c));
            CHECK_OK(kva_pool_request_allocate(p, ids[r], n - c, 0));
            CHECK_OK(kva_pool_request_append_tokens(p, ids[r], prompt + c, n - c));
        }
        for (int step = 0; step < 60; step++)
            for (int r = 0; r < 4; r++) {
                /* Decodes mostly, a chunk of a few tokens now and then. */
                const int32_t n = step % 7 == 3 ? kva_rng_int(&rng, 2, 19) : 1;
                int32_t t[19];
                for (int32_t i = 0; i < n; i++)
                    t[i] = tok++;
                CHECK_OK(kva_pool_request_allocate(p, ids[r], n, 0));
                CHECK_OK(kva_pool_request_append_tokens(p, ids[r], t, n));
                CHECK_OK(kva_pool_request_drop_chunk(p, ids[r], C));
                check_request(p, ids[r], C);
                kva_pool_stats st, st2;
                CHECK_OK(kva_pool_get_stats(p, &st));
                CHECK(st.num_used_blocks + st.num_free_blocks == 399);
                CHECK_OK(kva_pool_request_drop_chunk(p, ids[r], C)); /* a no-op now */
                CHECK_OK(kva_pool_get_stats(p, &st2));
                CHECK(st2.num_free_blocks == st.num_free_blocks);
                CHECK_MSG(kva_pool_check(p) == KVA_STATUS_OK, "%s", kva_last_error());
            }
        for (int r = 0; r < 4; r++)
            CHECK_OK(kva_pool_request_free(p, ids[r]));
        CHECK_OK(kva_pool_check(p));
        kva_pool_destroy(p);
    }
}

/* Decodes one request through the pool and checks attention over its table. */
static void test_attention(void)
{
    const int32_t B = 8, C = 24, H = 4, Hkv = 2, D = 32, NB = 64;
    kva_pool *p = make_pool(NB, B);
    kva_context_desc rd = {KVA_BACKEND_REF, 0, 0}, cd = {KVA_BACKEND_CPU, 2, 0};
    kva_context *ref = NULL, *cpu = NULL;
    CHECK_OK(kva_context_create(&rd, &ref));
    CHECK_OK(kva_context_create(&cd, &cpu));
    kva_cache_desc desc = {NB,          B, Hkv, D, D, KVA_DTYPE_F32, KVA_LAYOUT_NHD, KVA_QUANT_NONE,
                           KVA_ATTN_MHA};
    kva_cache *cache = NULL;
    CHECK_OK(kva_cache_create(ref, &desc, &cache));
    kva_rng rng = {11};
    void *k, *v;
    kva_cache_data(cache, &k, &v);
    kva_test_fill_uniform(k, KVA_DTYPE_F32, (size_t)NB * B * Hkv * D, &rng);
    kva_test_fill_uniform(v, KVA_DTYPE_F32, (size_t)NB * B * Hkv * D, &rng);
    kva_test_poison(k, KVA_DTYPE_F32, (size_t)B * Hkv * D); /* the null block */
    kva_test_poison(v, KVA_DTYPE_F32, (size_t)B * Hkv * D);
    int32_t id = -1, c = 0, first = 5;
    CHECK_OK(kva_pool_request_add(p, &first, 1, NULL, 0, &id, &c));
    CHECK_OK(kva_pool_request_allocate(p, id, 1, 0));
    CHECK_OK(kva_pool_request_append_tokens(p, id, &first, 1));
    int32_t full[64]; /* every block the request ever held, for the reference */
    float q[4 * 32], want[4 * 32], got[4 * 32];
    for (int32_t pos = 1; pos < 100; pos++) {
        /* The step's token at position pos: allocate, drop what its chunk no longer needs. */
        CHECK_OK(kva_pool_request_allocate(p, id, 1, 0));
        CHECK_OK(kva_pool_request_drop_chunk(p, id, C));
        int32_t row[64], nb = 0;
        CHECK_OK(kva_pool_request_block_table(p, id, row, 64, &nb));
        for (int32_t i = 0; i < nb; i++)
            if (row[i] > 0)
                full[i] = row[i];
        const int32_t qsl[2] = {0, 1}, sl = pos + 1;
        kva_plan_desc pd;
        memset(&pd, 0, sizeof pd);
        pd.num_requests = 1;
        pd.query_start_loc = qsl;
        pd.seq_lens = &sl;
        pd.block_table_stride = 64;
        pd.block_size = B;
        pd.num_heads = H;
        pd.num_kv_heads = Hkv;
        pd.head_dim = D;
        pd.q_dtype = KVA_DTYPE_F32;
        pd.causal = 1;
        pd.window_left = -1;
        pd.attention_chunk = C;
        kva_test_fill_uniform(q, KVA_DTYPE_F32, (size_t)H * D, &rng);
        pd.block_table = full;
        kva_plan *pr = NULL, *pc = NULL;
        CHECK_OK(kva_plan_create(ref, &pd, &pr));
        pd.block_table = row;
        CHECK_OK(kva_plan_create(cpu, &pd, &pc));
        kva_test_poison(want, KVA_DTYPE_F32, (size_t)H * D);
        kva_test_poison(got, KVA_DTYPE_F32, (size_t)H * D);
        if (pr && pc) {
            CHECK_OK(kva_attention_run(ref, pr, q, cache, NULL, want, NULL));
            CHECK_OK(kva_attention_run(cpu, pc, q, cache, NULL, got, NULL));
        }
        const size_t bad =
            kva_test_compare("out", got, want, KVA_DTYPE_F32, (size_t)H * D,
                             kva_test_atol(KVA_DTYPE_F32), kva_test_rtol(KVA_DTYPE_F32));
        CHECK_MSG(bad == 0, "position %d", (int)pos);
        kva_plan_destroy(pr);
        kva_plan_destroy(pc);
        const int32_t t = 1000 + pos;
        CHECK_OK(kva_pool_request_append_tokens(p, id, &t, 1));
    }
    CHECK_OK(kva_pool_check(p));
    kva_cache_destroy(cache);
    kva_context_destroy(ref);
    kva_context_destroy(cpu);
    kva_pool_destroy(p);
}

static void test_bad_input(void)
{
    kva_pool *p = make_pool(16, 4);
    int32_t prompt[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, id = -1, c = 0;
    CHECK_OK(kva_pool_request_add(p, prompt, 10, NULL, 0, &id, &c));
    CHECK_OK(kva_pool_request_allocate(p, id, 10, 0));
    CHECK_OK(kva_pool_request_append_tokens(p, id, prompt, 10));
    kva_pool_stats before, after;
    CHECK_OK(kva_pool_get_stats(p, &before));
    CHECK_STATUS(kva_pool_request_drop_chunk(p, id, 0), KVA_STATUS_INVALID_ARGUMENT);
    CHECK_ERROR_MENTIONS("chunk_tokens 0");
    CHECK_STATUS(kva_pool_request_drop_chunk(p, id, -3), KVA_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(kva_pool_request_drop_chunk(p, id + 7, 4), KVA_STATUS_OUT_OF_RANGE);
    CHECK_STATUS(kva_pool_request_drop_chunk(NULL, id, 4), KVA_STATUS_NULL_POINTER);
    CHECK_OK(kva_pool_get_stats(p, &after));
    CHECK(memcmp(&before, &after, sizeof before) == 0);
    int32_t row[4];
    CHECK_OK(kva_pool_request_block_table(p, id, row, 4, NULL));
    CHECK(row[0] > 0 && row[1] > 0 && row[2] > 0);
    /* C = 8 at 10 tokens: the chunk starts at 8, blocks 0 and 1 (tokens 0..7) go. */
    CHECK_OK(kva_pool_request_drop_chunk(p, id, 8));
    CHECK_OK(kva_pool_request_block_table(p, id, row, 4, NULL));
    CHECK(row[0] == 0 && row[1] == 0 && row[2] > 0);
    CHECK_OK(kva_pool_check(p));
    kva_pool_destroy(p);
}

int main(void)
{
    RUN(test_bad_input);
    RUN(test_invariants);
    RUN(test_attention);
    return kva_test_finish();
}
