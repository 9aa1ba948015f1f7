/*
 * test_cascade.c - cascade (shared-prefix) plans on the reference and CPU
 * backends against the reference's plain plan: shared and unshared requests
 * mixed, prefixes at and off block edges, groups of one, several groups,
 * prefill rows in the same step, sinks and soft-cap, every cache format;
 * the automatic choice (declines small prefixes, takes long ones) and the
 * declines (ALiBi, window, DCP); bad groupings get a status and change
 * nothing; outputs are poisoned before every run.
 */
#include "cascade_util.h"

static void run_case(const cas_case *c, kva_backend be)
{
    cas_run_host(c, be, 1234);
}

static void test_mixes(void)
{
    const kva_backend bes[] = {KVA_BACKEND_CPU, KVA_BACKEND_REF};
    for (int i = 0; i < 2; i++) {
        cas_case c = cas_base("decodes, 2 groups found");
        run_case(&c, bes[i]);
        c.name = "decodes, 2 groups given";
        c.given = 1;
        run_case(&c, bes[i]);
        /* A member whose first query lies inside the third shared block:
         * found, the group shares 2 blocks (its prefix ends off the edge of
         * what the block ids share), and its other members the third in a
         * nested group. */
        c = cas_base("prefix off the shared edge");
        c.req[2].q_len = 10, c.req[2].own = 4;
        c.expect_groups = 3;
        run_case(&c, bes[i]);
        c = cas_prefill_rows("groups of one, prefill rows");
        run_case(&c, bes[i]);
    }
    /* Given prefixes shorter than what the blocks share; sinks and soft-cap;
     * GQA 8 and MHA; HND; f16 and bf16. */
    cas_case c = cas_base("given shorter prefixes, sinks, soft-cap");
    c.given = 1, c.given_len[0] = 16, c.given_len[1] = 32;
    c.sinks = 1, c.softcap = 30.0f;
    run_case(&c, KVA_BACKEND_CPU);
    c = cas_base("GQA 8, HND, bf16");
    c.H = 16, c.Hkv = 2, c.D = 128, c.layout = KVA_LAYOUT_HND;
    c.dt = c.cache_dt = KVA_DTYPE_BF16;
    run_case(&c, KVA_BACKEND_CPU);
    c = cas_base("MHA, f16, block 32");
    c.H = 4, c.Hkv = 4, c.B = 32, c.dt = c.cache_dt = KVA_DTYPE_F16;
    run_case(&c, KVA_BACKEND_CPU);
}

/* Every cache format the decode reads. */
static void test_formats(void)
{
    static const struct {
        kva_quant q;
        kva_dtype cdt, qdt;
    } f[] = {{KVA_QUANT_INT8_CHANNEL, KVA_DTYPE_I8, KVA_DTYPE_F32},
             {KVA_QUANT_INT8_TOKEN_K, KVA_DTYPE_I8, KVA_DTYPE_BF16},
             {KVA_QUANT_INT8_TOKEN_K_V16, KVA_DTYPE_F16, KVA_DTYPE_F16},
             {KVA_QUANT_FP8_E4M3, KVA_DTYPE_FP8_E4M3, KVA_DTYPE_F32}};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
        cas_case c = cas_base(kva_quant_name(f[i].q));
        c.quant = f[i].q, c.cache_dt = f[i].cdt, c.dt = f[i].qdt;
        run_case(&c, KVA_BACKEND_CPU);
    }
}

/* Plans only (no cache): the cost model's choice and the declines. */
static int32_t groups_of(kva_context *ctx, kva_plan_desc *d, kva_status want)
{
    kva_plan *p = NULL;
    CHECK_STATUS(kva_plan_create(ctx, d, &p), want);
    if (!p)
        return -1;
    kva_plan_info info;
    CHECK_OK(kva_plan_get_info(p, &info));
    kva_plan_destroy(p);
    return info.num_cascade_groups;
}

/* R decodes sharing P tokens (page 16, H/Hkv 32/8, D 128, bf16), each with
 * `own` more keys. */
static void shared_batch(cas_case *c, int32_t R, int32_t P, int32_t own)
{
    memset(c, 0, sizeof *c);
    c->H = 32, c->Hkv = 8, c->D = 128, c->B = 16;
    c->dt = c->cache_dt = KVA_DTYPE_BF16;
    c->R = R, c->G = 1, c->shared[0] = P / 16;
    for (int32_t i = 0; i < R; i++)
        c->req[i] = (cas_req){0, 1, own};
}

static void test_choice(void)
{
    kva_context *ctx = new_ctx(KVA_BACKEND_CPU, 2);
    kva_rng r = {5};
    cas_case c;
    cas_batch b;
    /* The small case declines; a long shared prefix pays with 16
     * threads (the plain decode bound by its reads) and with 2 (the prefix
     * pass's tiled kernel does the same flops ~3x faster than the decode's). */
    kva_context *wide = new_ctx(KVA_BACKEND_CPU, 16);
    shared_batch(&c, 8, 128, 256);
    cas_build(&c, &r, &b);
    kva_plan_desc d = cas_desc(&c, &b, KVA_CASCADE_AUTO, 0);
    CHECK(groups_of(ctx, &d, KVA_STATUS_OK) == 0);
    d.cascade = KVA_CASCADE_ON;
    CHECK(groups_of(ctx, &d, KVA_STATUS_OK) == 1);
    free(b.bt);
    shared_batch(&c, 32, 8192, 256);
    cas_build(&c, &r, &b);
    d = cas_desc(&c, &b, KVA_CASCADE_AUTO, 0);
    CHECK(groups_of(wide, &d, KVA_STATUS_OK) == 1);
    CHECK(groups_of(ctx, &d, KVA_STATUS_OK) == 1);
    d.cascade = KVA_CASCADE_OFF;
    CHECK(groups_of(wide, &d, KVA_STATUS_OK) == 0);
    kva_context_destroy(wide);
    /* Declines: automatic plans run plain, forced ones are refused. */
    float slopes[32];
    for (int i = 0; i < 32; i++)
        slopes[i] = 0.01f * (float)(i + 1);
    for (int k = 0; k < 2; k++) {
        d = cas_desc(&c, &b, KVA_CASCADE_AUTO, 0);
        if (k == 0)
            d.alibi_slopes = slopes;
        else
            d.window_left = 4096;
        CHECK(groups_of(ctx, &d, KVA_STATUS_OK) == 0);
        d.cascade = KVA_CASCADE_ON;
        CHECK(groups_of(ctx, &d, KVA_STATUS_UNSUPPORTED) == -1);
        CHECK_ERROR_MENTIONS(k == 0 ? "ALiBi" : "sliding window");
    }
    d = cas_desc(&c, &b, KVA_CASCADE_ON, 0);
    d.dcp_size = 2;
    CHECK(groups_of(ctx, &d, KVA_STATUS_UNSUPPORTED) == -1);
    CHECK_ERROR_MENTIONS("DCP");
    free(b.bt);
    kva_context_destroy(ctx);
}

static void test_bad_groupings(void)
{
    kva_context *ctx = new_ctx(KVA_BACKEND_CPU, 2);
    kva_rng r = {9};
    cas_case c = cas_base("bad");
    cas_batch b;
    cas_build(&c, &r, &b);
    kva_plan *sentinel = (kva_plan *)&c, *p = sentinel;
    kva_plan_desc d = cas_desc(&c, &b, KVA_CASCADE_AUTO, 1);
#define BAD(status, mention)                                                                       \
    do {                                                                                           \
        CHECK_STATUS(kva_plan_create(ctx, &d, &p), status);                                        \
        CHECK_ERROR_MENTIONS(mention);                                                             \
        CHECK(p == sentinel);                                                                      \
        d = cas_desc(&c, &b, KVA_CASCADE_AUTO, 1);                                                 \
    } while (0)
    d.cascade = 7;
    BAD(KVA_STATUS_INVALID_ARGUMENT, "kva_cascade_mode");
    d.num_cascade_groups = -1;
    BAD(KVA_STATUS_INVALID_ARGUMENT, "num_cascade_groups");
    d.cascade_prefix_len = NULL;
    BAD(KVA_STATUS_NULL_POINTER, "cascade_prefix_len");
    d.cascade_group = NULL;
    BAD(KVA_STATUS_NULL_POINTER, "cascade_group");
    b.grp[3] = 2;
    BAD(KVA_STATUS_OUT_OF_RANGE, "cascade_group[3]");
    b.grp[3] = 1;
    b.plen[1] = 20;
    BAD(KVA_STATUS_INVALID_ARGUMENT, "multiple of block_size");
    b.plen[1] = 48; /* group 1 shares 2 blocks; request 3 has 2 * 16 + 1 keys */
    BAD(KVA_STATUS_OUT_OF_RANGE, "first query");
    b.plen[1] = 32;
    b.grp[1] = 0; /* request 1 shares no block with group 0 */
    b.plen[0] = 32;
    BAD(KVA_STATUS_INVALID_ARGUMENT, "does not share");
    b.grp[1] = -1;
    b.plen[0] = 48;
    const int32_t save = b.bt[4 * b.stride + 2];
    b.bt[4 * b.stride + 2] = b.bt[1 * b.stride];
    BAD(KVA_STATUS_INVALID_ARGUMENT, "block 2 of request 4");
    b.bt[4 * b.stride + 2] = save;
    /* The valid grouping, declined by OFF, still validated (above) and accepted. */
    d.cascade = KVA_CASCADE_OFF;
    CHECK_OK(kva_plan_create(ctx, &d, &p));
    kva_plan_destroy(p);
#undef BAD
    free(b.bt);
    kva_context_destroy(ctx);
}

/* A cascade plan refuses the ragged run and a context that did not create it,
 * writing nothing. */
static void test_bad_runs(void)
{
    cas_case c = cas_base("runs");
    kva_rng r = {3};
    cas_batch b;
    cas_build(&c, &r, &b);
    kva_context *ctx = new_ctx(KVA_BACKEND_CPU, 2), *other = new_ctx(KVA_BACKEND_CPU, 2);
    kva_cache_desc cd = make_desc(b.NB, c.B, c.Hkv, c.D, c.D, c.dt, c.layout);
    kva_cache *cache = NULL;
    CHECK_OK(kva_cache_create(ctx, &cd, &cache));
    fill_cache(cache, &r);
    kva_plan_desc d = cas_desc(&c, &b, KVA_CASCADE_ON, 0);
    kva_plan *p = NULL, *q2 = NULL;
    CHECK_OK(kva_plan_create(ctx, &d, &p));
    CHECK_OK(kva_plan_create(other, &d, &q2)); /* other gets its aux context */
    const size_t n = (size_t)b.T * c.H * c.D;
    float *q = malloc(n * 4), *o = malloc(n * 4), *k = malloc(n * 4);
    kva_test_fill(q, KVA_DTYPE_F32, n, &r, 1.0);
    kva_test_poison(o, KVA_DTYPE_F32, n);
    CHECK_STATUS(kva_attention_run(other, p, q, cache, NULL, o, NULL), KVA_STATUS_INVALID_ARGUMENT);
    CHECK_ERROR_MENTIONS("context that created it");
    CHECK_STATUS(kva_attention_run_ragged(ctx, p, q, k, k, NULL, o, NULL),
                 KVA_STATUS_INVALID_ARGUMENT);
    CHECK_ERROR_MENTIONS("cascade plan");
    size_t written = 0;
    for (size_t i = 0; i < n; i++)
        written += !kva_test_poisoned(o, KVA_DTYPE_F32, i);
    CHECK(written == 0);
    kva_plan_destroy(p);
    kva_plan_destroy(q2);
    kva_cache_destroy(cache);
    kva_context_destroy(ctx);
    kva_context_destroy(other);
    free(q), free(o), free(k), free(b.bt);
}

int main(void)
{
    RUN(test_mixes);
    RUN(test_formats);
    RUN(test_choice);
    RUN(test_bad_groupings);
    RUN(test_bad_runs);
    return kva_test_finish();
}
