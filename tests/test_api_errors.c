/*
 * test_api_errors.c - argument validation of kva_attention_run,
 * kva_attention_run_ragged and kva_merge_states.
 *
 * Every bad input gets its own call; each checks the status, that the message
 * names the argument, and that out, lse and the cache are byte-identical to
 * copies taken before the call (all filled with random data first).
 */
#include "harness.h"
#include "internal.h"

#define H 4
#define HKV 2
#define D 32
#define BS 4
#define NB 4
#define R 2
#define T 4 /* q_lens {1, 3} */

/* Random host buffers of one run and their snapshots. */
typedef struct fixture {
    kva_context *ctx;
    kva_cache *cache; /* NB=4, B=4, Hkv=2, D=32, f16, NHD */
    kva_plan *plan;   /* f16, q_lens {1, 3}, seq_lens {5, 7}, stride 2, blocks < NB */
    uint16_t q[T * H * D];
    uint16_t out[T * H * D];
    float lse[T * H];
    uint16_t k_rows[7 + 5][HKV * D]; /* ragged K: [sum(seq_lens), Hkv, D] */
    uint16_t v_rows[7 + 5][HKV * D];
    /* Snapshots. */
    uint16_t out0[T * H * D];
    float lse0[T * H];
    unsigned char *k0, *v0;
    size_t cache_bytes;
} fixture;

static const int32_t kQsl[R + 1] = {0, 1, 4};
static const int32_t kSeq[R] = {5, 7};
static const int32_t kTable[R * 2] = {3, 1, 0, 2};

static kva_plan_desc base_desc(kva_dtype dt)
{
    kva_plan_desc d;
    memset(&d, 0, sizeof d);
    d.num_requests = R;
    d.query_start_loc = kQsl;
    d.seq_lens = kSeq;
    d.block_table = kTable;
    d.block_table_stride = 2;
    d.block_size = BS;
    d.num_heads = H;
    d.num_kv_heads = HKV;
    d.head_dim = D;
    d.q_dtype = dt;
    d.causal = 1;
    d.window_left = -1;
    return d;
}

static kva_cache_desc base_cache_desc(void)
{
    kva_cache_desc c = {NB,          BS, HKV, D, 0, KVA_DTYPE_F16, KVA_LAYOUT_NHD, KVA_QUANT_NONE,
                        KVA_ATTN_MHA};
    return c;
}

/* Creates a cache from desc and fills its K/V with random bytes of valid f16 numbers. */
static kva_cache *make_cache(kva_context *ctx, const kva_cache_desc *cd, kva_rng *rng)
{
    kva_cache *c = NULL;
    CHECK_OK(kva_cache_create(ctx, cd, &c));
    if (!c)
        return NULL;
    int32_t dv = cd->head_dim_v ? cd->head_dim_v : cd->head_dim;
    size_t rows = (size_t)cd->num_blocks * cd->block_size * cd->num_kv_heads;
    void *k = NULL, *v = NULL;
    CHECK_OK(kva_cache_data(c, &k, &v));
    kva_test_fill(k, cd->dtype, rows * (size_t)cd->head_dim, rng, 1.0);
    kva_test_fill(v, cd->dtype, rows * (size_t)dv, rng, 1.0);
    return c;
}

static void fixture_init(fixture *f, kva_backend backend, kva_rng *rng)
{
    memset(f, 0, sizeof *f);
    kva_context_desc cd = {backend, 1, 0};
    CHECK_OK(kva_context_create(&cd, &f->ctx));
    kva_cache_desc c = base_cache_desc();
    f->cache = make_cache(f->ctx, &c, rng);
    kva_plan_desc d = base_desc(KVA_DTYPE_F16);
    CHECK_OK(kva_plan_create(f->ctx, &d, &f->plan));
    kva_test_fill(f->q, KVA_DTYPE_F16, T * H * D, rng, 1.0);
    kva_test_fill(f->out, KVA_DTYPE_F16, T * H * D, rng, 1.0);
    kva_test_fill(f->lse, KVA_DTYPE_F32, T * H, rng, 1.0);
    kva_test_fill(f->k_rows, KVA_DTYPE_F16, 12 * HKV * D, rng, 1.0);
    kva_test_fill(f->v_rows, KVA_DTYPE_F16, 12 * HKV * D, rng, 1.0);
    memcpy(f->out0, f->out, sizeof f->out);
    memcpy(f->lse0, f->lse, sizeof f->lse);
    f->cache_bytes = (size_t)NB * kva_cache_block_bytes_k(f->cache);
    f->k0 = malloc(f->cache_bytes);
    f->v0 = malloc(f->cache_bytes);
    void *k = NULL, *v = NULL;
    CHECK_OK(kva_cache_data(f->cache, &k, &v));
    memcpy(f->k0, k, f->cache_bytes);
    memcpy(f->v0, v, f->cache_bytes);
}

static void fixture_free(fixture *f)
{
    kva_plan_destroy(f->plan);
    kva_cache_destroy(f->cache);
    kva_context_destroy(f->ctx);
    free(f->k0);
    free(f->v0);
}

/* 1 if out, lse and the cache still hold the bytes of the snapshot. Reads the
 * cache's internal pointers, not kva_cache_data, which would clear the message. */
static int untouched(const fixture *f)
{
    const void *k = f->cache->k, *v = f->cache->v;
    return memcmp(f->out, f->out0, sizeof f->out) == 0 &&
           memcmp(f->lse, f->lse0, sizeof f->lse) == 0 && memcmp(k, f->k0, f->cache_bytes) == 0 &&
           memcmp(v, f->v0, f->cache_bytes) == 0;
}

/* Runs expr expecting status and a message that mentions substr, with nothing written. */
#define EXPECT_BAD(f_, expr, status_, substr_)                                                     \
    do {                                                                                           \
        CHECK_STATUS((expr), (status_));                                                           \
        CHECK_ERROR_MENTIONS(substr_);                                                             \
        CHECK_MSG(untouched(f_), "%s wrote to out, lse or the cache", #expr);                      \
    } while (0)

static const kva_backend kBackends[2] = {KVA_BACKEND_REF, KVA_BACKEND_CPU};

/* ---- kva_attention_run ---- */

static void test_paged_null_pointers(void)
{
    kva_rng rng = {11};
    for (int bi = 0; bi < 2; bi++) {
        fixture f;
        fixture_init(&f, kBackends[bi], &rng);
        EXPECT_BAD(&f, kva_attention_run(NULL, f.plan, f.q, f.cache, NULL, f.out, f.lse),
                   KVA_STATUS_NULL_POINTER, "ctx");
        EXPECT_BAD(&f, kva_attention_run(f.ctx, NULL, f.q, f.cache, NULL, f.out, f.lse),
                   KVA_STATUS_NULL_POINTER, "plan");
        EXPECT_BAD(&f, kva_attention_run(f.ctx, f.plan, NULL, f.cache, NULL, f.out, f.lse),
                   KVA_STATUS_NULL_POINTER, "'q'");
        EXPECT_BAD(&f, kva_attention_run(f.ctx, f.plan, f.q, NULL, NULL, f.out, f.lse),
                   KVA_STATUS_NULL_POINTER, "cache");
        EXPECT_BAD(&f, kva_attention_run(f.ctx, f.plan, f.q, f.cache, NULL, NULL, f.lse),
                   KVA_STATUS_NULL_POINTER, "out");
        fixture_free(&f);
    }
}

/* A cache that differs from the plan in one field. */
static void expect_cache_mismatch(fixture *f, kva_rng *rng, kva_cache_desc cd, kva_status want,
                                  const char *substr1, const char *substr2)
{
    kva_cache *other = make_cache(f->ctx, &cd, rng);
    if (!other)
        return;
    void *k = NULL, *v = NULL;
    CHECK_OK(kva_cache_data(other, &k, &v));
    size_t kb = (size_t)cd.num_blocks * kva_cache_block_bytes_k(other);
    size_t vb = (size_t)cd.num_blocks * kva_cache_block_bytes_v(other);
    unsigned char *k0 = malloc(kb), *v0 = malloc(vb);
    memcpy(k0, k, kb);
    memcpy(v0, v, vb);
    EXPECT_BAD(f, kva_attention_run(f->ctx, f->plan, f->q, other, NULL, f->out, f->lse), want,
               substr1);
    CHECK_ERROR_MENTIONS(substr2);
    CHECK(memcmp(k, k0, kb) == 0 && memcmp(v, v0, vb) == 0);
    free(k0);
    free(v0);
    kva_cache_destroy(other);
}

static void test_paged_cache_mismatch(void)
{
    kva_rng rng = {12};
    for (int bi = 0; bi < 2; bi++) {
        fixture f;
        fixture_init(&f, kBackends[bi], &rng);
        kva_cache_desc cd = base_cache_desc();
        cd.num_kv_heads = 1;
        expect_cache_mismatch(&f, &rng, cd, KVA_STATUS_SHAPE_MISMATCH, "num_kv_heads = 1",
                              "num_kv_heads = 2");
        cd = base_cache_desc();
        cd.head_dim = 64;
        expect_cache_mismatch(&f, &rng, cd, KVA_STATUS_SHAPE_MISMATCH, "head_dim = 64",
                              "head_dim = 32");
        cd = base_cache_desc();
        cd.head_dim_v = 16;
        expect_cache_mismatch(&f, &rng, cd, KVA_STATUS_SHAPE_MISMATCH, "head_dim_v = 16",
                              "head_dim_v = 32");
        cd = base_cache_desc();
        cd.block_size = 8;
        expect_cache_mismatch(&f, &rng, cd, KVA_STATUS_SHAPE_MISMATCH, "block_size = 8",
                              "block_size = 4");
        cd = base_cache_desc();
        cd.dtype = KVA_DTYPE_BF16; /* cache bf16, plan f16 */
        expect_cache_mismatch(&f, &rng, cd, KVA_STATUS_DTYPE_MISMATCH, "bf16", "f16");
        fixture_free(&f);
    }
}

/* The other direction of the dtype check: cache f16, plan bf16. */
static void test_paged_dtype_mismatch(void)
{
    kva_rng rng = {13};
    fixture f;
    fixture_init(&f, KVA_BACKEND_REF, &rng);
    kva_plan_desc d = base_desc(KVA_DTYPE_BF16);
    kva_plan *bf = NULL;
    CHECK_OK(kva_plan_create(f.ctx, &d, &bf));
    EXPECT_BAD(&f, kva_attention_run(f.ctx, bf, f.q, f.cache, NULL, f.out, f.lse),
               KVA_STATUS_DTYPE_MISMATCH, "cache dtype f16");
    CHECK_ERROR_MENTIONS("q_dtype bf16");
    kva_plan_destroy(bf);
    fixture_free(&f);
}

static void test_paged_block_out_of_range(void)
{
    kva_rng rng = {14};
    for (int bi = 0; bi < 2; bi++) {
        fixture f;
        fixture_init(&f, kBackends[bi], &rng);
        const int32_t table[R * 2] = {3, 1, 0, 9}; /* block 9, cache has 4 */
        kva_plan_desc d = base_desc(KVA_DTYPE_F16);
        d.block_table = table;
        kva_plan *p = NULL;
        CHECK_OK(kva_plan_create(f.ctx, &d, &p));
        EXPECT_BAD(&f, kva_attention_run(f.ctx, p, f.q, f.cache, NULL, f.out, f.lse),
                   KVA_STATUS_OUT_OF_RANGE, "block 9");
        CHECK_ERROR_MENTIONS("4 blocks");
        kva_plan_destroy(p);
        fixture_free(&f);
    }
}

static void test_paged_plan_context(void)
{
    kva_rng rng = {15};
    fixture f;
    fixture_init(&f, KVA_BACKEND_REF, &rng);
    /* A plan built by a CPU context, run on the REF context. */
    kva_context_desc cd = {KVA_BACKEND_CPU, 1, 0};
    kva_context *cpu = NULL;
    CHECK_OK(kva_context_create(&cd, &cpu));
    kva_plan_desc d = base_desc(KVA_DTYPE_F16);
    kva_plan *cpu_plan = NULL;
    CHECK_OK(kva_plan_create(cpu, &d, &cpu_plan));
    EXPECT_BAD(&f, kva_attention_run(f.ctx, cpu_plan, f.q, f.cache, NULL, f.out, f.lse),
               KVA_STATUS_INVALID_ARGUMENT, "plan was built by backend 'cpu'");
    EXPECT_BAD(
        &f, kva_attention_run_ragged(f.ctx, cpu_plan, f.q, f.k_rows, f.v_rows, NULL, f.out, f.lse),
        KVA_STATUS_INVALID_ARGUMENT, "plan was built by backend 'cpu'");

    /* A plan that reserved more workspace than this context holds (built with
     * another context of the same backend): forced through the internal field. */
    size_t saved = f.plan->workspace_bytes;
    f.plan->workspace_bytes = f.ctx->workspace_bytes + 64;
    EXPECT_BAD(&f, kva_attention_run(f.ctx, f.plan, f.q, f.cache, NULL, f.out, f.lse),
               KVA_STATUS_INVALID_ARGUMENT, "workspace");
    EXPECT_BAD(&f,
               kva_attention_run_ragged(f.ctx, f.plan, f.q, f.k_rows, f.v_rows, NULL, f.out, f.lse),
               KVA_STATUS_INVALID_ARGUMENT, "workspace");
    f.plan->workspace_bytes = saved;

    /* A plan without a block table is for the ragged run only. */
    d.block_table = NULL;
    kva_plan *ragged = NULL;
    CHECK_OK(kva_plan_create(f.ctx, &d, &ragged));
    EXPECT_BAD(&f, kva_attention_run(f.ctx, ragged, f.q, f.cache, NULL, f.out, f.lse),
               KVA_STATUS_INVALID_ARGUMENT, "block_table");

    /* A cache in device memory cannot be read by a host backend (forced field). */
    const kva__memory_ops *mem = f.cache->mem;
    f.cache->mem = kva__cuda_ops.memory;
    EXPECT_BAD(&f, kva_attention_run(f.ctx, f.plan, f.q, f.cache, NULL, f.out, f.lse),
               KVA_STATUS_INVALID_ARGUMENT, "cache");
    f.cache->mem = mem;

    kva_plan_destroy(ragged);
    kva_plan_destroy(cpu_plan);
    kva_context_destroy(cpu);
    fixture_free(&f);
}

/* A table of no operations: every entry point must say UNSUPPORTED and write nothing. */
static const kva__backend_ops kNullOps = {
    .name = "nullops", .max_head_dim = KVA_MAX_HEAD_DIM, .memory = &kva__host_memory};

static void test_unimplemented_ops(void)
{
    kva_rng rng = {16};
    fixture f;
    fixture_init(&f, KVA_BACKEND_REF, &rng);
    const kva__backend_ops *real = f.ctx->ops;
    f.ctx->ops = &kNullOps;
    EXPECT_BAD(&f, kva_attention_run(f.ctx, f.plan, f.q, f.cache, NULL, f.out, f.lse),
               KVA_STATUS_UNSUPPORTED, "not implemented by backend 'nullops'");
    EXPECT_BAD(&f,
               kva_attention_run_ragged(f.ctx, f.plan, f.q, f.k_rows, f.v_rows, NULL, f.out, f.lse),
               KVA_STATUS_UNSUPPORTED, "not implemented by backend 'nullops'");
    EXPECT_BAD(
        &f, kva_merge_states(f.ctx, T, H, D, KVA_DTYPE_F16, f.q, f.lse, f.q, f.lse, f.out, f.lse),
        KVA_STATUS_UNSUPPORTED, "not implemented by backend 'nullops'");
    f.ctx->ops = real;
    fixture_free(&f);
}

/* Valid calls on the real backends: they must succeed and write every element
 * (out is poisoned with NaN first). */
static void test_valid_calls(void)
{
    kva_rng rng = {17};
    for (int bi = 0; bi < 2; bi++) {
        fixture f;
        fixture_init(&f, kBackends[bi], &rng);
        kva_test_poison(f.out, KVA_DTYPE_F16, T * H * D);
        CHECK_OK(kva_attention_run(f.ctx, f.plan, f.q, f.cache, NULL, f.out, f.lse));
        for (size_t i = 0; i < T * H * D; i++)
            CHECK(isfinite(kva_test_get(f.out, KVA_DTYPE_F16, i)));
        static uint16_t first[T * H * D];
        memcpy(first, f.out, sizeof first);

        kva_test_poison(f.out, KVA_DTYPE_F16, T * H * D);
        CHECK_OK(
            kva_attention_run_ragged(f.ctx, f.plan, f.q, f.k_rows, f.v_rows, NULL, f.out, NULL));
        for (size_t i = 0; i < T * H * D; i++)
            CHECK(isfinite(kva_test_get(f.out, KVA_DTYPE_F16, i)));

        /* A cache created by the other host backend is interchangeable: the same
         * bytes give the same output. */
        kva_context_desc cd = {kBackends[1 - bi], 1, 0};
        kva_context *other = NULL;
        CHECK_OK(kva_context_create(&cd, &other));
        kva_cache_desc c = base_cache_desc();
        kva_cache *oc = make_cache(other, &c, &rng);
        memcpy(oc->k, f.cache->k, f.cache_bytes);
        memcpy(oc->v, f.cache->v, f.cache_bytes);
        kva_test_poison(f.out, KVA_DTYPE_F16, T * H * D);
        CHECK_OK(kva_attention_run(f.ctx, f.plan, f.q, oc, NULL, f.out, NULL));
        CHECK(memcmp(f.out, first, sizeof first) == 0);
        kva_cache_destroy(oc);
        kva_context_destroy(other);
        fixture_free(&f);
    }
}

/* Tensor pointers not aligned to their element size are rejected, nothing written. */
static void test_misaligned_tensors(void)
{
    kva_rng rng = {19};
    for (int bi = 0; bi < 2; bi++) {
        fixture f;
        fixture_init(&f, kBackends[bi], &rng);
        char *qb = (char *)f.q, *ob = (char *)f.out, *lb = (char *)f.lse;
        EXPECT_BAD(&f, kva_attention_run(f.ctx, f.plan, qb + 1, f.cache, NULL, f.out, f.lse),
                   KVA_STATUS_INVALID_ARGUMENT, "'q'");
        EXPECT_BAD(&f, kva_attention_run(f.ctx, f.plan, f.q, f.cache, NULL, ob + 1, f.lse),
                   KVA_STATUS_INVALID_ARGUMENT, "'out'");
        EXPECT_BAD(
            &f,
            kva_attention_run(f.ctx, f.plan, f.q, f.cache, NULL, f.out, (float *)(void *)(lb + 2)),
            KVA_STATUS_INVALID_ARGUMENT, "'lse'");
        EXPECT_BAD(&f,
                   kva_attention_run_ragged(f.ctx, f.plan, f.q, (char *)f.k_rows + 1, f.v_rows,
                                            NULL, f.out, f.lse),
                   KVA_STATUS_INVALID_ARGUMENT, "'k'");
        EXPECT_BAD(&f,
                   kva_merge_states(f.ctx, T, H, D, KVA_DTYPE_F16, f.q, f.lse, qb + 1, f.lse, f.out,
                                    f.lse),
                   KVA_STATUS_INVALID_ARGUMENT, "'out_b'");
        fixture_free(&f);
    }
}

/* An empty step is OK after validation and needs no tensors. */
static void test_empty_step(void)
{
    kva_rng rng = {18};
    for (int bi = 0; bi < 2; bi++) {
        fixture f;
        fixture_init(&f, kBackends[bi], &rng);
        const int32_t qsl[3] = {0, 0, 0};
        kva_plan_desc d = base_desc(KVA_DTYPE_F16);
        d.query_start_loc = qsl;
        kva_plan *p = NULL;
        CHECK_OK(kva_plan_create(f.ctx, &d, &p));
        CHECK_OK(kva_attention_run(f.ctx, p, NULL, f.cache, NULL, NULL, NULL));
        CHECK_OK(kva_attention_run_ragged(f.ctx, p, NULL, NULL, NULL, NULL, NULL, NULL));
        /* The cache is still checked for an empty step. */
        kva_cache_desc cd = base_cache_desc();
        cd.block_size = 8;
        kva_cache *other = make_cache(f.ctx, &cd, &rng);
        CHECK_STATUS(kva_attention_run(f.ctx, p, NULL, other, NULL, NULL, NULL),
                     KVA_STATUS_SHAPE_MISMATCH);
        CHECK_ERROR_MENTIONS("block_size");
        CHECK(untouched(&f));
        kva_cache_destroy(other);
        kva_plan_destroy(p);
        fixture_free(&f);
    }
}

/* ---- kva_attention_run_ragged ---- */

static void test_ragged_null_pointers(void)
{
    kva_rng rng = {19};
    for (int bi = 0; bi < 2; bi++) {
        fixture f;
        fixture_init(&f, kBackends[bi], &rng);
        const void *k = f.k_rows, *v = f.v_rows;
        EXPECT_BAD(&f, kva_attention_run_ragged(NULL, f.plan, f.q, k, v, NULL, f.out, f.lse),
                   KVA_STATUS_NULL_POINTER, "ctx");
        EXPECT_BAD(&f, kva_attention_run_ragged(f.ctx, NULL, f.q, k, v, NULL, f.out, f.lse),
                   KVA_STATUS_NULL_POINTER, "plan");
        EXPECT_BAD(&f, kva_attention_run_ragged(f.ctx, f.plan, NULL, k, v, NULL, f.out, f.lse),
                   KVA_STATUS_NULL_POINTER, "'q'");
        EXPECT_BAD(&f, kva_attention_run_ragged(f.ctx, f.plan, f.q, NULL, v, NULL, f.out, f.lse),
                   KVA_STATUS_NULL_POINTER, "'k'");
        EXPECT_BAD(&f, kva_attention_run_ragged(f.ctx, f.plan, f.q, k, NULL, NULL, f.out, f.lse),
                   KVA_STATUS_NULL_POINTER, "'v'");
        EXPECT_BAD(&f, kva_attention_run_ragged(f.ctx, f.plan, f.q, k, v, NULL, NULL, f.lse),
                   KVA_STATUS_NULL_POINTER, "'out'");
        fixture_free(&f);
    }
}

/* ---- kva_merge_states ---- */

static void test_merge_errors(void)
{
    kva_rng rng = {20};
    for (int bi = 0; bi < 2; bi++) {
        fixture f;
        fixture_init(&f, kBackends[bi], &rng);
        uint16_t a[T * H * D], b[T * H * D];
        float la[T * H], lb[T * H];
        kva_test_fill(a, KVA_DTYPE_F16, T * H * D, &rng, 1.0);
        kva_test_fill(b, KVA_DTYPE_F16, T * H * D, &rng, 1.0);
        kva_test_fill(la, KVA_DTYPE_F32, T * H, &rng, 2.0);
        kva_test_fill(lb, KVA_DTYPE_F32, T * H, &rng, 2.0);
        kva_context *c = f.ctx;
        const kva_dtype F16 = KVA_DTYPE_F16;
        float *lo = f.lse;
        void *o = f.out;
        EXPECT_BAD(&f, kva_merge_states(NULL, T, H, D, F16, a, la, b, lb, o, lo),
                   KVA_STATUS_NULL_POINTER, "ctx");
        EXPECT_BAD(&f, kva_merge_states(c, -1, H, D, F16, a, la, b, lb, o, lo),
                   KVA_STATUS_INVALID_ARGUMENT, "num_tokens = -1");
        EXPECT_BAD(&f, kva_merge_states(c, T, -2, D, F16, a, la, b, lb, o, lo),
                   KVA_STATUS_INVALID_ARGUMENT, "num_heads = -2");
        EXPECT_BAD(&f, kva_merge_states(c, T, H, 12, F16, a, la, b, lb, o, lo),
                   KVA_STATUS_UNSUPPORTED, "head_dim_v = 12");
        EXPECT_BAD(&f, kva_merge_states(c, T, H, 0, F16, a, la, b, lb, o, lo),
                   KVA_STATUS_UNSUPPORTED, "head_dim_v = 0");
        EXPECT_BAD(&f, kva_merge_states(c, T, H, D, KVA_DTYPE_I8, a, la, b, lb, o, lo),
                   KVA_STATUS_UNSUPPORTED, "dtype");
        EXPECT_BAD(&f, kva_merge_states(c, T, H, D, (kva_dtype)42, a, la, b, lb, o, lo),
                   KVA_STATUS_UNSUPPORTED, "dtype");
        EXPECT_BAD(&f, kva_merge_states(c, T, H, D, F16, NULL, la, b, lb, o, lo),
                   KVA_STATUS_NULL_POINTER, "out_a");
        EXPECT_BAD(&f, kva_merge_states(c, T, H, D, F16, a, NULL, b, lb, o, lo),
                   KVA_STATUS_NULL_POINTER, "lse_a");
        EXPECT_BAD(&f, kva_merge_states(c, T, H, D, F16, a, la, NULL, lb, o, lo),
                   KVA_STATUS_NULL_POINTER, "out_b");
        EXPECT_BAD(&f, kva_merge_states(c, T, H, D, F16, a, la, b, NULL, o, lo),
                   KVA_STATUS_NULL_POINTER, "lse_b");
        EXPECT_BAD(&f, kva_merge_states(c, T, H, D, F16, a, la, b, lb, NULL, lo),
                   KVA_STATUS_NULL_POINTER, "'out'");
        EXPECT_BAD(&f, kva_merge_states(c, T, H, D, F16, a, la, b, lb, o, NULL),
                   KVA_STATUS_NULL_POINTER, "lse_out");
        /* Nothing to merge (T = 0): OK without any tensor. num_heads is a
         * shape dimension, never 0 (the header's zero-size rule). */
        CHECK_OK(kva_merge_states(c, 0, H, D, F16, NULL, NULL, NULL, NULL, NULL, NULL));
        EXPECT_BAD(&f, kva_merge_states(c, T, 0, D, F16, a, la, b, lb, o, lo),
                   KVA_STATUS_INVALID_ARGUMENT, "num_heads = 0");
        EXPECT_BAD(&f, kva_merge_states(c, 0, 0, D, F16, NULL, NULL, NULL, NULL, NULL, NULL),
                   KVA_STATUS_INVALID_ARGUMENT, "num_heads = 0");
        EXPECT_BAD(&f, kva_merge_states(c, T, KVA_MAX_HEADS + 1, D, F16, a, la, b, lb, o, lo),
                   KVA_STATUS_INVALID_ARGUMENT, "num_heads = 4097");

        /* A valid merge must match the formula computed here in double. */
        kva_test_poison(f.out, F16, T * H * D);
        kva_test_poison(f.lse, KVA_DTYPE_F32, T * H);
        CHECK_OK(kva_merge_states(c, T, H, D, F16, a, la, b, lb, f.out, f.lse));
        {
            uint16_t want[T * H * D];
            float want_lse[T * H];
            for (int i = 0; i < T * H; i++) {
                double m = la[i] > lb[i] ? la[i] : lb[i];
                double wa = exp(la[i] - m), wb = exp(lb[i] - m);
                want_lse[i] = (float)(m + log(wa + wb));
                for (int j = 0; j < D; j++) {
                    size_t e = (size_t)i * D + j;
                    double x = (wa * kva_f16_to_f32(a[e]) + wb * kva_f16_to_f32(b[e])) / (wa + wb);
                    want[e] = kva_f32_to_f16((float)x);
                }
            }
            CHECK(kva_test_compare("merge out", f.out, want, F16, T * H * D, kva_test_atol(F16),
                                   kva_test_rtol(F16)) == 0);
            CHECK(kva_test_compare_f32("merge lse", f.lse, want_lse, T * H, 1e-5, 1e-5) == 0);
        }
        fixture_free(&f);
    }
}

int main(void)
{
    RUN(test_paged_null_pointers);
    RUN(test_paged_cache_mismatch);
    RUN(test_paged_dtype_mismatch);
    RUN(test_paged_block_out_of_range);
    RUN(test_paged_plan_context);
    RUN(test_unimplemented_ops);
    RUN(test_valid_calls);
    RUN(test_misaligned_tensors);
    RUN(test_empty_step);
    RUN(test_ragged_null_pointers);
    RUN(test_merge_errors);
    return kva_test_finish();
}
