/*
 * test_cuda_cascade.c - cascade (shared-prefix) plans on the CUDA backend
 * against the reference backend's plain plan over the same rows: the CPU
 * test's mixes (groups found and given, prefixes off the shared edge, groups
 * of one, prefill rows in the step, sinks and soft-cap), a group large enough
 * for the tensor-core prefill tiles with its prefix cut into key chunks,
 * every cache format the decode reads, forced on/off, nested groups (two
 * and three levels), and cascade runs captured in a CUDA graph and replayed (also on a
 * stream the context moved onto during the capture). Outputs are poisoned
 * before every run. Exits 77 without the CUDA build or a device.
 */
#include "cascade_util.h"
#include "cuda_util.h"

#ifdef KVA_HAVE_CUDA

/* Runs case c on the CUDA backend (graph 1: planned on a stream, captured
 * there and replayed; graph 2: planned on the legacy stream, the context
 * moved onto a non-blocking stream only once that stream captures, as
 * torch.cuda.graph's side stream: the prefix pass on the auxiliary context
 * must follow it into the graph) and compares it with the reference's plain
 * run; returns the plan's info. */
static kva_plan_info run_case(const cas_case *c, int graph)
{
    cas_data x;
    cas_data_make(c, 4321, &x);
    const size_t nq = x.nq, nl = x.nl, es = kva_dtype_size(c->dt);
    void *o = malloc(nq * es);
    float *l = malloc(nl * 4);
    kva_context *ctx = new_ctx(KVA_BACKEND_CUDA, 0);
    void *dk = dev_from(x.kr, x.rows * 4), *dv = dev_from(x.vr, x.rows * 4);
    void *dslots = dev_from(x.slots, x.nslots * sizeof(int64_t));
    kva_cache *dc = cas_cache(ctx, c, &x.b, dk, dv, dslots);
    float *dsinks = x.sinks ? dev_from(x.sinks, sizeof(float) * (size_t)c->H) : NULL;
    void *dq = dev_from(x.q, nq * es), *dout = dev_poisoned(nq * es);
    float *dlse = dev_poisoned(nl * 4);
    cudaStream_t stream = NULL;
    if (graph == 1) {
        CUDA_OK(cudaStreamCreate(&stream));
        CHECK_OK(kva_cuda_context_set_stream(ctx, stream));
    } else if (graph == 2) {
        CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    }
    kva_plan *plan = NULL;
    kva_plan_desc d = cas_desc(c, &x.b, c->mode, c->given);
    CHECK_OK(kva_plan_create(ctx, &d, &plan));
    kva_plan_info info;
    memset(&info, 0, sizeof info);
    CHECK_OK(kva_plan_get_info(plan, &info));
    CHECK_MSG(info.num_cascade_groups == c->expect_groups, "%s: %d cascade groups, want %d",
              c->name, (int)info.num_cascade_groups, (int)c->expect_groups);
    if (graph) {
        cudaGraph_t g = NULL;
        cudaGraphExec_t exec = NULL;
        if (graph == 2) /* the legacy stream's plan uploads, before the capture */
            CUDA_OK(cudaDeviceSynchronize());
        CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
        if (graph == 2) /* no host wait: the staging drain is left to the next plan */
            CHECK_OK(kva_cuda_context_set_stream(ctx, stream));
        CHECK_OK(kva_attention_run(ctx, plan, dq, dc, dsinks, dout, dlse));
        CUDA_OK(cudaStreamEndCapture(stream, &g));
        CUDA_OK(cudaGraphInstantiate(&exec, g, 0));
        CHECK(dev_untouched(dout)); /* capture runs nothing */
        CUDA_OK(cudaGraphLaunch(exec, stream));
        CUDA_OK(cudaStreamSynchronize(stream));
        CUDA_OK(cudaGraphExecDestroy(exec));
        CUDA_OK(cudaGraphDestroy(g));
    } else {
        CHECK_OK(kva_attention_run(ctx, plan, dq, dc, dsinks, dout, dlse));
    }
    to_host(o, dout, nq * es);
    to_host(l, dlse, nl * 4);
    size_t bad = kva_test_compare("out", o, x.o_ref, c->dt, nq, cas_atol(c->dt), cas_rtol(c->dt));
    bad += kva_test_compare_f32("lse", l, x.l_ref, nl, 2e-4, 2e-4);
    CHECK_MSG(bad == 0, "%s%s: %zu mismatches", c->name, graph ? " (graph)" : "", bad);
    /* Without lse: the suffix pass's lse goes to the workspace. */
    dev_fill(dout, 0xff, nq * es);
    CHECK_OK(kva_attention_run(ctx, plan, dq, dc, dsinks, dout, NULL));
    to_host(o, dout, nq * es);
    bad = kva_test_compare("out", o, x.o_ref, c->dt, nq, cas_atol(c->dt), cas_rtol(c->dt));
    CHECK_MSG(bad == 0, "%s (no lse): %zu mismatches", c->name, bad);

    kva_plan_destroy(plan);
    kva_cache_destroy(dc);
    kva_context_destroy(ctx);
    if (stream)
        cudaStreamDestroy(stream);
    cudaFree(dk), cudaFree(dv), cudaFree(dslots), cudaFree(dsinks), cudaFree(dq), cudaFree(dout),
        cudaFree(dlse);
    cas_data_free(&x);
    free(o), free(l);
    return info;
}

static void test_mixes(void)
{
    cas_case c = cas_base("decodes, 2 groups found");
    run_case(&c, 0);
    c.name = "decodes, 2 groups given";
    c.given = 1;
    run_case(&c, 0);
    c = cas_base("prefix off the shared edge");
    c.req[2].q_len = 10, c.req[2].own = 4;
    c.expect_groups = 3; /* the other members' third block: a nested group */
    run_case(&c, 0);
    c = cas_prefill_rows("groups of one, prefill rows, sinks, soft-cap");
    c.sinks = 1, c.softcap = 30.0f;
    run_case(&c, 0);
    c = cas_base("forced off");
    c.mode = KVA_CASCADE_OFF, c.expect_groups = 0;
    run_case(&c, 0);
}

/* 32 decodes (GQA 4, D 128, bf16) over a 1024-key prefix: tensor-core prefill
 * tiles, the prefix cut into key chunks; also captured in a graph. */
static void test_tiles_chunks(void)
{
    cas_case c;
    memset(&c, 0, sizeof c);
    c.name = "32 decodes, bf16, chunks";
    c.H = 16, c.Hkv = 4, c.D = 128, c.B = 16;
    c.dt = c.cache_dt = KVA_DTYPE_BF16;
    c.R = 34, c.G = 1, c.shared[0] = 64;
    for (int i = 0; i < 32; i++)
        c.req[i] = (cas_req){0, 1, 1 + 7 * i};
    c.req[32] = (cas_req){-1, 1, 300};
    c.req[33] = (cas_req){-1, 40, 90};
    c.mode = KVA_CASCADE_ON, c.expect_groups = 1;
    kva_plan_info info = run_case(&c, 0);
    CHECK_MSG(info.cascade_chunks > 1, "cascade_chunks = %d", (int)info.cascade_chunks);
    c.name = "32 decodes, bf16, chunks, in a graph";
    run_case(&c, 1);
    c.name = "32 decodes, f16, HND";
    c.dt = c.cache_dt = KVA_DTYPE_F16, c.layout = KVA_LAYOUT_HND;
    run_case(&c, 0);
}

/* Nested groups: two and three levels, found and given (the merge runs
 * once per level), and a two-level group of 32 decodes on the tensor-core
 * tiles with key chunks, also in a graph. */
static void test_nested(void)
{
    cas_case c = cas_two_levels("two levels found");
    run_case(&c, 0);
    c = cas_three_levels("three levels found, ragged");
    run_case(&c, 0);
    c.name = "three levels given, ragged, sinks";
    c.given = 1, c.sinks = 1;
    run_case(&c, 0);
    memset(&c, 0, sizeof c);
    c.name = "32 decodes in 2 levels, bf16, chunks";
    c.H = 16, c.Hkv = 4, c.D = 128, c.B = 16;
    c.dt = c.cache_dt = KVA_DTYPE_BF16;
    c.nested = 1;
    c.R = 33, c.G = 2, c.shared[0] = 64, c.shared[1] = 128;
    c.parent[0] = -1, c.parent[1] = 0;
    for (int i = 0; i < 32; i++)
        c.req[i] = (cas_req){i % 2, 1, 1 + 5 * i};
    c.req[32] = (cas_req){-1, 40, 90};
    c.mode = KVA_CASCADE_ON, c.expect_groups = 2;
    kva_plan_info info = run_case(&c, 0);
    CHECK_MSG(info.cascade_chunks > 1, "cascade_chunks = %d", (int)info.cascade_chunks);
    c.name = "32 decodes in 2 levels, in a graph";
    run_case(&c, 1);
    c.name = "32 decodes in 2 levels, in a graph captured on another stream";
    run_case(&c, 2);
}

static void test_formats(void)
{
    static const struct {
        kva_quant q;
        kva_dtype cdt, qdt;
    } f[] = {{KVA_QUANT_NONE, KVA_DTYPE_F32, KVA_DTYPE_F32},
             {KVA_QUANT_INT8_CHANNEL, KVA_DTYPE_I8, KVA_DTYPE_BF16},
             {KVA_QUANT_INT8_TOKEN_K, KVA_DTYPE_I8, KVA_DTYPE_F16},
             {KVA_QUANT_INT8_TOKEN_K_V16, KVA_DTYPE_BF16, KVA_DTYPE_BF16},
             {KVA_QUANT_FP8_E4M3, KVA_DTYPE_FP8_E4M3, KVA_DTYPE_BF16}};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
        cas_case c = cas_base(kva_quant_name(f[i].q));
        c.H = 16, c.Hkv = 4, c.D = 128;
        c.quant = f[i].q, c.cache_dt = f[i].cdt, c.dt = f[i].qdt;
        run_case(&c, 0);
    }
}

#endif /* KVA_HAVE_CUDA */

/* The automatic choice decides alike whether it finds a group or is given
 * it (cascade_util.h), on the CUDA cost model, where the shortcut's bound is
 * close to the gain at the turn. */
static void test_auto_bound(void)
{
    kva_context *ctx = new_ctx(KVA_BACKEND_CUDA, 0);
    cas_check_auto_bound(ctx, 29);
    kva_context_destroy(ctx);
}

int main(void)
{
    int skip = cuda_test_skip();
    if (skip)
        return skip;
#ifdef KVA_HAVE_CUDA
    RUN(test_mixes);
    RUN(test_tiles_chunks);
    RUN(test_nested);
    RUN(test_formats);
    RUN(test_auto_bound);
#endif
    return kva_test_finish();
}
