/*
 * test_local_attn.c - chunked local attention (kva_plan_desc.attention_chunk)
 * on the reference and CPU backends.
 *
 * Each case builds one random batch (fixed seed, shuffled block tables, one
 * extra cache block whose K and V rows are all NaN), replaces every block of
 * a request that lies wholly before the chunk of its first query by that NaN
 * block (as kva_pool_request_drop_chunk would put the null block there), runs
 * the reference once and the CPU backend with the dispatcher's choice and
 * with every kernel that runs here forced, outputs and lse poisoned with NaN
 * before every run, and compares with the per-dtype tolerances of harness.h.
 * A kernel that reads a key before its row's chunk start meets NaN there.
 *
 * The edge cases engines got wrong: a chunk boundary inside a prefill chunk,
 * a query span covering 3 and more chunks, max seq_len < C, page 16 with
 * C = 8192 at a context beyond 8192, many chunks per request (C = 8 and 16),
 * chunks with a window, soft-cap, ALiBi and sinks, NHD and HND, f32/f16/bf16,
 * and split items. The reference's chunk clause is checked on its own
 * against its window clause (a decode at position p with chunk C sees what
 * window_left = p % C shows it) and C >= seq_len against no chunk.
 */
#include "batchgen.h"
#include "cpu_kernels.h"
#include "internal.h"
#include "../src/attn/cpu/cpu_attn.h"

#include <math.h>
#include <stdlib.h>

typedef struct lcase {
    int32_t H, Hkv, D, B, C;
    kva_dtype dt;
    int32_t R;
    int32_t q_len[4], ctx[4]; /* per request: new tokens, cached tokens before them */
    int32_t window;           /* window_left, -1 none */
    float softcap;
    int alibi, sinks, split;
    kva_layout layout;
    uint64_t seed;
} lcase;

static void print_case(const lcase *c, const char *kernel)
{
    fprintf(stderr,
            "  case: H=%d Hkv=%d D=%d B=%d C=%d dt=%d R=%d q=%d,%d,%d,%d ctx=%d,%d,%d,%d "
            "window=%d softcap=%g alibi=%d sinks=%d split=%d layout=%d seed=%llu kernel=%s\n",
            c->H, c->Hkv, c->D, c->B, c->C, (int)c->dt, c->R, c->q_len[0], c->q_len[1], c->q_len[2],
            c->q_len[3], c->ctx[0], c->ctx[1], c->ctx[2], c->ctx[3], c->window, (double)c->softcap,
            c->alibi, c->sinks, c->split, (int)c->layout, (unsigned long long)c->seed,
            kernel ? kernel : "dispatcher");
}

/* Fills block `blk` of the cache (K and V rows of every kv head) with NaN. */
static void poison_block(kva_cache *cache, int32_t blk)
{
    kva_cache_desc d;
    void *k, *v;
    kva_cache_get_desc(cache, &d);
    kva_cache_data(cache, &k, &v);
    const size_t kb = (size_t)d.block_size * d.num_kv_heads * d.head_dim;
    const size_t vb = (size_t)d.block_size * d.num_kv_heads * d.head_dim_v;
    const size_t es = kva_dtype_size(d.dtype);
    kva_test_poison((char *)k + (size_t)blk * kb * es, d.dtype, kb);
    kva_test_poison((char *)v + (size_t)blk * vb * es, d.dtype, vb);
}

static void run_lcase(const lcase *c)
{
    kva_rng rng = {c->seed};
    int32_t seq[4];
    for (int32_t r = 0; r < c->R; r++)
        seq[r] = c->ctx[r] + c->q_len[r];
    kva_test_batch b;
    kva_test_batch_init(&b, &rng, c->R, c->q_len, seq, c->B, 2, 0);
    const int32_t nan_block = b.num_blocks++; /* an extra block no request owns */
    for (int32_t r = 0; r < c->R; r++) {
        const int32_t first_pos = seq[r] - c->q_len[r];
        const int32_t start = first_pos - first_pos % c->C;
        for (int32_t i = 0; (i + 1) * c->B <= start; i++)
            b.block_table[(size_t)r * b.stride + i] = nan_block;
    }
    const int32_t H = c->H, D = c->D, T = b.T;
    const size_t esz = kva_dtype_size(c->dt);

    kva_context_desc rd = {KVA_BACKEND_REF, 0, 0}, cd = {KVA_BACKEND_CPU, 2, 0};
    kva_context *ref = NULL, *cpu = NULL;
    CHECK_OK(kva_context_create(&rd, &ref));
    CHECK_OK(kva_context_create(&cd, &cpu));
    kva_cache *cache = NULL;
    CHECK_OK(kva_test_batch_cache(&b, ref, &rng, c->Hkv, D, D, c->dt, c->layout, &cache));
    if (!cache)
        return;
    poison_block(cache, nan_block);

    kva_plan_desc pd = kva_test_batch_plan_desc(&b, H, c->Hkv, D, D, c->dt);
    pd.attention_chunk = c->C;
    pd.window_left = c->window;
    pd.softcap = c->softcap;
    float *slopes = malloc(sizeof(float) * (size_t)H), *sinks = malloc(sizeof(float) * (size_t)H);
    for (int32_t h = 0; h < H; h++) {
        slopes[h] = (float)pow(2.0, -8.0 * (h + 1) / H);
        sinks[h] = (float)(kva_rng_normal(&rng) * 2.0);
    }
    pd.alibi_slopes = c->alibi ? slopes : NULL;
    const float *sk = c->sinks ? sinks : NULL;

    const size_t nq = (size_t)T * H * D, nl = (size_t)T * H;
    void *q = malloc(nq * esz), *out_ref = malloc(nq * esz), *out_cpu = malloc(nq * esz);
    float *lse_ref = malloc(nl * sizeof(float)), *lse_cpu = malloc(nl * sizeof(float));
    kva_test_fill_uniform(q, c->dt, nq, &rng);

    kva_plan *pref = NULL;
    CHECK_OK(kva_plan_create(ref, &pd, &pref));
    kva_test_poison(out_ref, c->dt, nq);
    kva_test_poison(lse_ref, KVA_DTYPE_F32, nl);
    if (pref)
        CHECK_OK(kva_attention_run(ref, pref, q, cache, sk, out_ref, lse_ref));

    const char *vs[KVA_TEST_MAX_KERNELS + 1];
    const int nv = kva_test_cpu_runnable(vs);
    for (int i = 0; i < nv && pref; i++) {
        kva_plan *pcpu = NULL;
        CHECK_OK(kva__context_force_kernel(cpu, vs[i])); /* NULL: none */
        CHECK_OK(kva_plan_create(cpu, &pd, &pcpu));
        if (!pcpu)
            break;
        if (c->split) {
            kva__partition_params pp = {3, KVA_CPU_MAX_ROWS, KVA_CPU_PREFILL_ROWS, 32, 64, 16, 64};
            CHECK_OK(kva__cpu_plan_partition(cpu, pcpu, &pp));
        }
        kva_test_poison(out_cpu, c->dt, nq);
        kva_test_poison(lse_cpu, KVA_DTYPE_F32, nl);
        CHECK_OK(kva_attention_run(cpu, pcpu, q, cache, sk, out_cpu, lse_cpu));
        size_t bad = kva_test_compare("out", out_cpu, out_ref, c->dt, nq, kva_test_atol(c->dt),
                                      kva_test_rtol(c->dt));
        bad += kva_test_compare_f32("lse", lse_cpu, lse_ref, nl, kva_test_atol(KVA_DTYPE_F32),
                                    kva_test_rtol(KVA_DTYPE_F32));
        CHECK_MSG(bad == 0, "%zu mismatches (T=%d)", bad, (int)T);
        if (bad)
            print_case(c, vs[i]);
        kva_plan_destroy(pcpu);
    }
    CHECK_OK(kva__context_force_kernel(cpu, NULL));

    free(q);
    free(out_ref);
    free(out_cpu);
    free(lse_ref);
    free(lse_cpu);
    free(slopes);
    free(sinks);
    kva_plan_destroy(pref);
    kva_cache_destroy(cache);
    kva_context_destroy(ref);
    kva_context_destroy(cpu);
    kva_test_batch_free(&b);
}

static lcase base(int32_t C, int32_t B, kva_dtype dt, uint64_t seed)
{
    lcase c;
    memset(&c, 0, sizeof c);
    c.H = 8;
    c.Hkv = 2;
    c.D = 64;
    c.B = B;
    c.C = C;
    c.dt = dt;
    c.R = 1;
    c.window = -1;
    c.layout = KVA_LAYOUT_NHD;
    c.seed = seed;
    return c;
}

/* The edge cases, each in every float dtype. */
static void test_edges(void)
{
    for (int t = 0; t < 3; t++) {
        const kva_dtype dt = (kva_dtype)t;
        /* A chunk boundary inside a prefill chunk: positions 40..79, C = 64. */
        lcase c = base(64, 16, dt, 11 + t);
        c.q_len[0] = 40, c.ctx[0] = 40;
        run_lcase(&c);
        /* A query span covering 4 chunks (C = 32, positions 20..139), with a decode and a
         * spec decode beside it. */
        c = base(32, 16, dt, 21 + t);
        c.R = 3;
        c.q_len[0] = 120, c.ctx[0] = 20;
        c.q_len[1] = 1, c.ctx[1] = 95;
        c.q_len[2] = 3, c.ctx[2] = 62; /* positions 62..64 straddle a chunk start */
        run_lcase(&c);
        /* max seq_len < C: the chunk excludes nothing. */
        c = base(8192, 16, dt, 31 + t);
        c.R = 2;
        c.q_len[0] = 100, c.ctx[0] = 200;
        c.q_len[1] = 1, c.ctx[1] = 700;
        run_lcase(&c);
        /* Many chunks per request (more virtual batches than 2 x requests): C = 8 and a
         * block size of 16 (chunks inside one block), C = 16 over B = 5. */
        c = base(8, 16, dt, 41 + t);
        c.R = 2;
        c.q_len[0] = 70, c.ctx[0] = 33;
        c.q_len[1] = 2, c.ctx[1] = 300;
        run_lcase(&c);
        c = base(16, 5, dt, 51 + t);
        c.R = 2;
        c.q_len[0] = 61, c.ctx[0] = 7;
        c.q_len[1] = 4, c.ctx[1] = 126;
        run_lcase(&c);
    }
}

/* Page 16 with C = 8192 past the first chunk: a decode at 9000 (chunk 1, 809 keys), a
 * decode on the first key of a chunk (position 8192: one key), a prefill crossing
 * 8192, all with split items as a long decode gets them. */
static void test_long(void)
{
    lcase c = base(8192, 16, KVA_DTYPE_BF16, 61);
    c.H = 4;
    c.Hkv = 1;
    c.R = 3;
    c.q_len[0] = 1, c.ctx[0] = 8999;
    c.q_len[1] = 1, c.ctx[1] = 8192;
    c.q_len[2] = 37, c.ctx[2] = 8170;
    run_lcase(&c);
    c.split = 1;
    c.dt = KVA_DTYPE_F32;
    c.seed = 62;
    run_lcase(&c);
}

/* Chunks with the other masks, layouts and GQA shapes. */
static void test_with_masks(void)
{
    kva_rng rng = {71};
    for (int i = 0; i < 12; i++) {
        lcase c = base(kva_rng_int(&rng, 1, 4) * 16, 16, (kva_dtype)(i % 3), 80 + (uint64_t)i);
        c.H = i % 2 ? 12 : 6;
        c.Hkv = i % 2 ? 4 : 1;
        c.D = i % 4 < 2 ? 128 : 64;
        c.R = 3;
        for (int r = 0; r < 3; r++) {
            c.q_len[r] = r == 0 ? kva_rng_int(&rng, 1, 150) : kva_rng_int(&rng, 1, 4);
            c.ctx[r] = kva_rng_int(&rng, 0, 300);
        }
        c.window = i % 3 == 0 ? kva_rng_int(&rng, 0, 40) : -1;
        c.softcap = i % 4 == 1 ? 20.0f : 0.0f;
        c.alibi = i % 5 == 2;
        c.sinks = i % 2;
        c.split = i % 3 == 2;
        c.layout = i % 2 ? KVA_LAYOUT_HND : KVA_LAYOUT_NHD;
        run_lcase(&c);
    }
}

/* Runs one decode per request on backend be with the given plan options, into out [R*H*D]. */
static void run_decodes(kva_backend be, kva_test_batch *b, kva_cache *cache, const void *q,
                        int32_t chunk, int32_t window, void *out)
{
    kva_context_desc cd = {be, 1, 0};
    kva_context *ctx = NULL;
    CHECK_OK(kva_context_create(&cd, &ctx));
    kva_plan_desc pd = kva_test_batch_plan_desc(b, 4, 2, 32, 32, KVA_DTYPE_F32);
    pd.attention_chunk = chunk;
    pd.window_left = window;
    kva_plan *p = NULL;
    CHECK_OK(kva_plan_create(ctx, &pd, &p));
    kva_test_poison(out, KVA_DTYPE_F32, (size_t)b->T * 4 * 32);
    if (p)
        CHECK_OK(kva_attention_run(ctx, p, q, cache, NULL, out, NULL));
    kva_plan_destroy(p);
    kva_context_destroy(ctx);
}

/* The reference's chunk clause against its window clause: one request's decode at
 * position p with chunk C sees keys p - p % C .. p, which window_left = p % C shows it
 * too; and a chunk of at least seq_len excludes nothing. */
static void test_ref_identities(void)
{
    kva_rng rng = {91};
    const int32_t C = 24;
    for (int32_t s = 1; s <= 80; s += 7) {
        const int32_t ql = 1, p = s - 1;
        kva_test_batch b;
        kva_test_batch_init(&b, &rng, 1, &ql, &s, 8, 1, 0);
        kva_context_desc rd = {KVA_BACKEND_REF, 0, 0};
        kva_context *ref = NULL;
        CHECK_OK(kva_context_create(&rd, &ref));
        kva_cache *cache = NULL;
        CHECK_OK(
            kva_test_batch_cache(&b, ref, &rng, 2, 32, 32, KVA_DTYPE_F32, KVA_LAYOUT_NHD, &cache));
        float q[4 * 32], a[4 * 32], w[4 * 32], full[4 * 32], wide[4 * 32];
        kva_test_fill_uniform(q, KVA_DTYPE_F32, 4 * 32, &rng);
        run_decodes(KVA_BACKEND_REF, &b, cache, q, C, -1, a);
        run_decodes(KVA_BACKEND_REF, &b, cache, q, 0, p % C, w);
        run_decodes(KVA_BACKEND_REF, &b, cache, q, 0, -1, full);
        run_decodes(KVA_BACKEND_REF, &b, cache, q, s, -1, wide);
        CHECK_MSG(memcmp(a, w, sizeof a) == 0, "chunk %d != window %d at s = %d", (int)C,
                  (int)(p % C), (int)s);
        CHECK_MSG(memcmp(wide, full, sizeof a) == 0, "chunk %d excluded something", (int)s);
        /* Past the first chunk the chunk must exclude something. */
        if (p >= C)
            CHECK_MSG(memcmp(a, full, sizeof a) != 0, "chunk excluded nothing at s = %d", (int)s);
        kva_cache_destroy(cache);
        kva_context_destroy(ref);
        kva_test_batch_free(&b);
    }
}

/* Bad chunks: a status naming the field, no plan. */
static void test_bad_inputs(void)
{
    const int32_t ql = 3, s = 40;
    kva_rng rng = {5};
    kva_test_batch b;
    kva_test_batch_init(&b, &rng, 1, &ql, &s, 16, 1, 0);
    for (int be = 0; be < 2; be++) {
        kva_context_desc cd = {be ? KVA_BACKEND_CPU : KVA_BACKEND_REF, 1, 0};
        kva_context *ctx = NULL;
        CHECK_OK(kva_context_create(&cd, &ctx));
        kva_plan_desc pd = kva_test_batch_plan_desc(&b, 4, 2, 32, 32, KVA_DTYPE_F32);
        kva_plan *p = (kva_plan *)&pd; /* must stay untouched on failure */
        pd.attention_chunk = -5;
        CHECK_STATUS(kva_plan_create(ctx, &pd, &p), KVA_STATUS_INVALID_ARGUMENT);
        CHECK_ERROR_MENTIONS("attention_chunk = -5");
        CHECK(p == (kva_plan *)&pd);
        pd.attention_chunk = 16;
        pd.causal = 0;
        CHECK_STATUS(kva_plan_create(ctx, &pd, &p), KVA_STATUS_UNSUPPORTED);
        CHECK_ERROR_MENTIONS("causal");
        CHECK(p == (kva_plan *)&pd);
        /* MLA plans take no chunk. */
        pd.causal = 1;
        pd.kind = KVA_ATTN_MLA;
        pd.num_heads = 4;
        pd.num_kv_heads = 1;
        pd.head_dim = 64;
        pd.head_dim_v = 48;
        pd.scale = 0.1f;
        CHECK_STATUS(kva_plan_create(ctx, &pd, &p), KVA_STATUS_UNSUPPORTED);
        CHECK_ERROR_MENTIONS("attention_chunk = 16");
        CHECK(p == (kva_plan *)&pd);
        kva_context_destroy(ctx);
    }
    kva_test_batch_free(&b);
}

int main(void)
{
    RUN(test_ref_identities);
    RUN(test_bad_inputs);
    RUN(test_edges);
    RUN(test_long);
    RUN(test_with_masks);
    return kva_test_finish();
}
