/*
 * test_cuda_mla_run.c - the layer-level MLA (kva_mla_run) on the CUDA backend
 * against the reference backend's naive, non-absorbed fp64 result on the same
 * data (tests/mla_util.h: random latent rows behind shuffled block tables,
 * random q, W_UK, W_UV; DeepSeek's Dc 512 / Dr 64, which the CUDA absorbed
 * decode needs, with Dn 128 / Dv 128 (the wgmma prefill's D 192 / Dv 128) or
 * Dn 64 / Dv 128 (D = Dv = 128)).
 *
 * Every case is a mixed batch: decodes (q_len 1-4) and prefills in one plan,
 * decode thresholds 1 and 4 (so q_len 2-4 takes either path), contexts 0, 1,
 * block edges and longer than one decompression chunk (the chunk is forced to
 * 64 or 128 keys in some cases, so the chunked-context merge runs many
 * rounds), block sizes 1, 16, 64, H in {1, 3, 16, 128}, bf16 and f16, causal
 * and not (a row without keys: out 0, LSE -inf). The latent rows come from
 * the reference's cache; on the GPU the blocks no request uses and the slots
 * past each request's length are NaN, so a read of a wrong row fails. out and
 * lse are poisoned before every run. One case is also captured in a CUDA
 * graph and replayed (the same bits as the eager run). On sm_90a the GEMMs
 * (projections and decompression) run the wgmma form where the shape takes
 * it (Dn 64's W_UK^T does not); four cases (two under KVA_TEST_QUICK) run
 * again with the mma.sync form forced and with the wgmma form's persistent
 * grid capped at 5 CTAs, so that each CTA streams many tiles of other rows,
 * column blocks and heads (kva__cuda_context_mla_gemm 1, 2).
 *
 * Tolerances: the CUDA path rounds to the input dtype where the reference
 * does not (q_nope . W_UK and the latent output on the absorbed path, the
 * decompressed K and V on the other, P before P . V), each a relative 2^-8
 * (bf16) / 2^-11 (f16) of O(1) values; out within atol + rtol |ref| with
 * bf16 3e-2 / 2/128, f16 5e-3 / 2e-3, cosine distance of the whole output
 * bf16 <= 2e-5, f16 <= 1e-6; LSE within 2e-2 (bf16) / 3e-3 (f16) absolute.
 * A wrong head, row, chunk or merge moves elements by O(1).
 *
 * FP8 E4M3 latent caches (k_scale 0.02; the device cache holds the
 * reference cache's bytes): mixed batches at H 1, 16, 128, block sizes 1,
 * 16, 64, bf16 and f16 q, thresholds 1 and 4, with the same tolerances (the
 * decompressed K and V and the absorbed path's roundings are those of a
 * 16-bit cache; the codes convert exactly).
 *
 * Bad input: a misaligned q, the kernel-level call on a layer plan with
 * compute-friendly requests, on a 16-bit and on an FP8 cache (a status, a
 * message, out unchanged); head sizes the prefill kernel does not take and
 * f32 q (refused at plan creation).
 * KVA_TEST_QUICK=1 runs the first cases and the errors (compute-sanitizer).
 * Exits 77 without a GPU.
 */
#include "cuda_util.h"
#include "../mla_util.h"
#include "../../src/attn/cuda/cuda_backend.h"

#ifdef KVA_HAVE_CUDA

static double out_atol(kva_dtype dt)
{
    return dt == KVA_DTYPE_BF16 ? 3e-2 : 5e-3;
}
static double out_rtol(kva_dtype dt)
{
    return dt == KVA_DTYPE_BF16 ? 2.0 / 128 : 2e-3;
}

static double cos_dist(const void *a, const void *b, kva_dtype dt, size_t n)
{
    double ab = 0, aa = 0, bb = 0;
    for (size_t i = 0; i < n; i++) {
        const double x = kva_test_get(a, dt, i), y = kva_test_get(b, dt, i);
        ab += x * y, aa += x * x, bb += y * y;
    }
    return aa == 0 && bb == 0 ? 0 : 1.0 - ab / sqrt(aa * bb);
}

/* The device copy of a case: cache (unused blocks and tail slots NaN), q, W. */
typedef struct gpu_case {
    kva_context *ctx;
    kva_cache *cache;
    void *q, *w_uk, *w_uv, *out;
    float *lse;
} gpu_case;

static int gpu_make(const mla_case *c, const mla_data *m, gpu_case *g)
{
    memset(g, 0, sizeof *g);
    kva_context_desc gd = {KVA_BACKEND_CUDA, 0, 0};
    CHECK_OK(kva_context_create(&gd, &g->ctx));
    kva_cache_desc cd = mla_cache_desc(c, m->nb);
    const float fp8_scale = 0.02f;
    kva_quant_params qp = {.k_scale = &fp8_scale, .k_scale_len = 1};
    CHECK_OK(kva_cache_create_quant(g->ctx, &cd, c->fp8 ? &qp : NULL, &g->cache));
    if (!g->cache)
        return 0;
    cache_upload(g->cache, m->cache);
    void *dk = NULL;
    kva_cache_data(g->cache, &dk, NULL);
    const size_t row = (size_t)(c->Dc + c->Dr) * kva_dtype_size(cd.dtype);
    uint8_t *used = calloc((size_t)m->nb, 1);
    for (int32_t r = 0; r < c->R; r++) {
        const int32_t nbr = (c->seq_len[r] + c->B - 1) / c->B;
        for (int32_t b = 0; b < nbr; b++)
            used[m->bt[(size_t)r * m->stride + b]] = 1;
        if (c->seq_len[r] % c->B) { /* the last block's tail */
            const int32_t blk = m->bt[(size_t)r * m->stride + nbr - 1];
            const size_t off = ((size_t)blk * c->B + (size_t)(c->seq_len[r] % c->B)) * row;
            CUDA_OK(
                cudaMemset((char *)dk + off, 0xff, (size_t)(c->B - c->seq_len[r] % c->B) * row));
        }
    }
    for (int32_t b = 0; b < m->nb; b++)
        if (!used[b])
            dev_fill((char *)dk + (size_t)b * c->B * row, 0xff, (size_t)c->B * row);
    free(used);
    const size_t es = mla_es(c->dt), T = (size_t)(m->T > 0 ? m->T : 1);
    g->q = dev_from(m->q, T * c->H * (c->Dn + c->Dr) * es);
    g->w_uk = dev_from(m->w_uk, (size_t)c->H * c->Dn * c->Dc * es);
    g->w_uv = dev_from(m->w_uv, (size_t)c->H * c->Dc * c->Dv * es);
    g->out = dev_poisoned(T * c->H * c->Dv * es);
    g->lse = dev_poisoned(T * c->H * sizeof(float));
    return 1;
}

/* The kernel-level call (kva_attention_run) on a layer plan with a
 * compute-friendly request is refused and writes nothing. Its out is the
 * latent [T, H, Dc] (and q the absorbed [T, H, Dc + Dr]), so the buffers
 * are sized for that call, not for kva_mla_run's [T, H, Dv]: with the
 * layer's smaller out, the run's aliasing check would (rightly) refuse the
 * out that reaches into lse first. */
static void kernel_call_refused(const mla_case *c, const mla_data *m, const gpu_case *g,
                                const kva_plan *plan)
{
    const size_t es = mla_es(c->dt), T = (size_t)(m->T > 0 ? m->T : 1);
    void *q = dev_poisoned(T * c->H * (c->Dc + c->Dr) * es);
    void *out = dev_poisoned(T * c->H * c->Dc * es);
    float *lse = dev_poisoned(T * c->H * sizeof(float));
    CHECK_STATUS(kva_attention_run(g->ctx, plan, q, g->cache, NULL, out, lse),
                 KVA_STATUS_UNSUPPORTED);
    CHECK_ERROR_MENTIONS("kva_mla_run");
    CHECK(dev_untouched(out));
    CHECK(dev_untouched(lse));
    cudaFree(q);
    cudaFree(out);
    cudaFree(lse);
}

static void gpu_free(gpu_case *g)
{
    cudaFree(g->q);
    cudaFree(g->w_uk);
    cudaFree(g->w_uv);
    cudaFree(g->out);
    cudaFree(g->lse);
    kva_cache_destroy(g->cache);
    kva_context_destroy(g->ctx);
}

/* Captures kva_mla_run of plan in a CUDA graph on a new stream (which also
 * proves the run makes no host synchronization), replays it into poisoned
 * out / lse, and checks the bits against the eager run's got / lse. */
static void mla_graph_replay(const mla_case *c, const mla_data *m, gpu_case *g, kva_plan *plan,
                             const void *got, const float *lse)
{
    const size_t rows = (size_t)m->T * c->H, n_out = rows * c->Dv * mla_es(c->dt);
    cudaStream_t st;
    cudaGraph_t gr;
    cudaGraphExec_t ge;
    CUDA_OK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    CHECK_OK(kva_cuda_context_set_stream(g->ctx, st));
    CUDA_OK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    CHECK_OK(kva_mla_run(g->ctx, plan, g->q, g->w_uk, g->w_uv, g->cache, g->out, g->lse));
    CUDA_OK(cudaStreamEndCapture(st, &gr));
    CUDA_OK(cudaGraphInstantiate(&ge, gr, 0));
    dev_fill(g->out, 0xff, n_out);
    dev_fill(g->lse, 0xff, rows * 4);
    CUDA_OK(cudaGraphLaunch(ge, st));
    CUDA_OK(cudaStreamSynchronize(st));
    void *out2 = malloc(n_out + 16);
    float *lse2 = malloc(rows * 4 + 4);
    to_host(out2, g->out, n_out);
    to_host(lse2, g->lse, rows * 4);
    CHECK_MSG(memcmp(out2, got, n_out) == 0 && memcmp(lse2, lse, rows * 4) == 0,
              "H %d: the graph replay differs from the eager run", (int)c->H);
    free(out2);
    free(lse2);
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(gr);
    CHECK_OK(kva_cuda_context_set_stream(g->ctx, NULL));
    cudaStreamDestroy(st);
}

/* Runs case c (chunk: forced context chunk in keys, 0 = the plan's; graph:
 * also replay the run from a captured CUDA graph; both: run it again with
 * kva_mla_run's GEMMs forced onto the mma.sync form, which the dispatch
 * otherwise leaves to shapes and devices the sm_90a wgmma form does not
 * take, and once more with the wgmma form on a grid of 5 CTAs). */
static void run_case_v(const mla_case *c, int32_t chunk, int graph, int both)
{
    kva_context *ref = NULL;
    kva_context_desc rd = {KVA_BACKEND_REF, 1, 0};
    CHECK_OK(kva_context_create(&rd, &ref));
    mla_data m;
    if (!mla_data_make(ref, c, &m)) {
        CHECK_MSG(0, "case setup failed: %s", kva_last_error());
        mla_data_free(&m);
        kva_context_destroy(ref);
        return;
    }
    const size_t rows = (size_t)m.T * c->H, n_out = rows * c->Dv, es = mla_es(c->dt);
    void *want = malloc(n_out * es + 16), *got = malloc(n_out * es + 16);
    float *lse_want = malloc(rows * 4 + 4), *lse = malloc(rows * 4 + 4);
    kva_plan_desc pd = mla_plan_desc(c, &m, 1);
    kva_plan *plan = NULL;
    CHECK_OK(kva_plan_create(ref, &pd, &plan));
    kva_test_poison(want, c->dt, n_out);
    CHECK_OK(kva_mla_run(ref, plan, m.q, m.w_uk, m.w_uv, m.cache, want, lse_want));
    kva_plan_destroy(plan);

    for (int mma = 0; mma <= 2 * both; mma++) {
        gpu_case g;
        if (gpu_make(c, &m, &g)) {
            CHECK_OK(kva__cuda_context_mla_chunk(g.ctx, chunk));
            CHECK_OK(kva__cuda_context_mla_gemm(g.ctx, mma));
            plan = NULL;
            CHECK_OK(kva_plan_create(g.ctx, &pd, &plan));
            if (plan) {
                CHECK_OK(kva_mla_run(g.ctx, plan, g.q, g.w_uk, g.w_uv, g.cache, g.out, g.lse));
                to_host(got, g.out, n_out * es);
                to_host(lse, g.lse, rows * 4);
                const size_t bad = kva_test_compare("mla_run cuda", got, want, c->dt, n_out,
                                                    out_atol(c->dt), out_rtol(c->dt));
                const size_t bad_lse =
                    kva_test_compare_f32("mla_run cuda lse", lse, lse_want, rows,
                                         c->dt == KVA_DTYPE_BF16 ? 2e-2 : 3e-3, 0);
                double emax = 0, lmax = 0;
                for (size_t i = 0; i < n_out; i++) {
                    const double e =
                        fabs(kva_test_get(got, c->dt, i) - kva_test_get(want, c->dt, i));
                    emax = e > emax || isnan(e) ? e : emax;
                }
                for (size_t i = 0; i < rows; i++) {
                    const double e = isinf(lse_want[i]) && lse[i] == lse_want[i]
                                         ? 0
                                         : fabs((double)lse[i] - lse_want[i]);
                    lmax = e > lmax || isnan(e) ? e : lmax;
                }
                const double cd = cos_dist(got, want, c->dt, n_out);
                const double cd_max = c->dt == KVA_DTYPE_BF16 ? 2e-5 : 1e-6;
                printf("  H %3d Dn %3d B %2d %s%s thr %d causal %d chunk %4d T %4d%s: max |dout| "
                       "%.3g, max |dlse| %.3g, cos dist %.3g\n",
                       (int)c->H, (int)c->Dn, (int)c->B, kva_dtype_name(c->dt),
                       c->fp8 ? " fp8-cache" : "", (int)c->thr, (int)c->causal, (int)chunk,
                       (int)m.T,
                       mma == 1   ? " gemm mma"
                       : mma == 2 ? " gemm 5 CTAs"
                                  : "",
                       emax, lmax, cd);
                CHECK_MSG(bad == 0 && bad_lse == 0 && cd <= cd_max,
                          "H %d B %d %s thr %d: %zu out and %zu lse mismatches, cos dist %.3g",
                          (int)c->H, (int)c->B, kva_dtype_name(c->dt), (int)c->thr, bad, bad_lse,
                          cd);
                if (graph)
                    mla_graph_replay(c, &m, &g, plan, got, lse);
            }
            kva_plan_destroy(plan);
        }
        gpu_free(&g);
    }
    free(want);
    free(got);
    free(lse_want);
    free(lse);
    mla_data_free(&m);
    kva_context_destroy(ref);
}

static void run_case_g(const mla_case *c, int32_t chunk, int graph)
{
    run_case_v(c, chunk, graph, 0);
}
static void run_case(const mla_case *c, int32_t chunk)
{
    run_case_g(c, chunk, 0);
}

/* Decodes q_len 1-4 (context 0 and block edges), a prefill without cached
 * context, and prefills with context across block and chunk edges. */
static mla_case mixed(int32_t H, int32_t Dn, int32_t B, kva_dtype dt, int32_t thr, uint64_t seed)
{
    const int32_t ql[7] = {1, 1, 2, 4, 17, 9, 5};
    const int32_t sl[7] = {1, B, B + 1, 2 * B + 3, 17, B + 70, 200};
    return mla_case_of(H, 512, 64, Dn, 128, B, dt, 1, thr, 7, ql, sl, seed);
}

static void test_grid(void)
{
    const int32_t Hs[4] = {1, 3, 16, 128}, Bs[3] = {1, 16, 64};
    const int quick = getenv("KVA_TEST_QUICK") != NULL;
    for (int i = 0; i < (quick ? 2 : 8); i++) {
        const int32_t H = Hs[i % 4], B = Bs[i % 3];
        const kva_dtype dt = i % 2 ? KVA_DTYPE_F16 : KVA_DTYPE_BF16;
        mla_case c = mixed(H, i == 5 ? 64 : 128, B, dt, i < 4 ? 1 : 4, 200 + (uint64_t)i);
        if (H == 128) { /* keep the fp64 reference quick */
            c.seq_len[6] = 90;
            c.seq_len[5] = B + 20;
        }
        run_case_v(&c, i % 3 == 0 ? 64 : i % 3 == 1 ? 0 : 128, i == 0, i == 1 || i == 3);
    }
    /* FP8 E4M3 latent caches (the first two also under KVA_TEST_QUICK; the
     * first is also replayed from a CUDA graph). */
    const int32_t Hf[4] = {16, 128, 1, 16}, Bf[4] = {16, 64, 1, 64};
    for (int i = 0; i < (quick ? 2 : 4); i++) {
        const kva_dtype dt = i == 2 ? KVA_DTYPE_F16 : KVA_DTYPE_BF16;
        mla_case c = mixed(Hf[i], 128, Bf[i], dt, i % 2 ? 4 : 1, 300 + (uint64_t)i);
        c.fp8 = 1;
        if (Hf[i] == 128) {
            c.seq_len[6] = 90;
            c.seq_len[5] = Bf[i] + 20;
        }
        run_case_v(&c, i == 3 ? 64 : 0, i == 0, i == 1);
    }
}

/* Non-causal rows: seq_len 0 (out 0, LSE -inf) in both paths, q_len > seq_len. */
static void test_noncausal(void)
{
    const int32_t ql[4] = {2, 3, 6, 1}, sl[4] = {0, 5, 2, 0};
    mla_case c = mla_case_of(3, 512, 64, 128, 128, 16, KVA_DTYPE_BF16, 0, 1, 4, ql, sl, 11);
    run_case(&c, 0);
}

/* A context of many chunks: 1500 keys in chunks of 128 (12 rounds), and the
 * plan's own chunking of the same batch. */
static void test_long(void)
{
    if (getenv("KVA_TEST_QUICK"))
        return;
    const int32_t ql[3] = {1, 40, 3}, sl[3] = {1500, 1500, 700};
    mla_case c = mla_case_of(3, 512, 64, 128, 128, 64, KVA_DTYPE_BF16, 1, 1, 3, ql, sl, 31);
    run_case(&c, 128);
    run_case_v(&c, 0, 0, 1);
}

/* Bad input: a status, a message, out unchanged. */
static void test_errors(void)
{
    kva_context *ref = NULL;
    kva_context_desc rd = {KVA_BACKEND_REF, 1, 0};
    CHECK_OK(kva_context_create(&rd, &ref));
    const int32_t ql[2] = {1, 20}, sl[2] = {30, 40};
    mla_case c = mla_case_of(4, 512, 64, 128, 128, 16, KVA_DTYPE_BF16, 1, 1, 2, ql, sl, 5);
    mla_data m;
    CHECK(mla_data_make(ref, &c, &m));
    gpu_case g;
    if (m.cache && gpu_make(&c, &m, &g)) {
        kva_plan_desc pd = mla_plan_desc(&c, &m, 1);
        kva_plan *plan = NULL;
        CHECK_OK(kva_plan_create(g.ctx, &pd, &plan));
        /* Misaligned q. */
        CHECK_STATUS(
            kva_mla_run(g.ctx, plan, (char *)g.q + 2, g.w_uk, g.w_uv, g.cache, g.out, g.lse),
            KVA_STATUS_INVALID_ARGUMENT);
        CHECK_ERROR_MENTIONS("aligned");
        /* The kernel-level call on a layer plan with a compute-friendly request. */
        kernel_call_refused(&c, &m, &g, plan);
        kva_plan_destroy(plan);
        /* Dn + Dr = 160: no prefill kernel for D 160 / Dv 128 (decodes only would run). */
        pd.mla_qk_nope_head_dim = 96;
        CHECK_STATUS(kva_plan_create(g.ctx, &pd, &plan), KVA_STATUS_UNSUPPORTED);
        CHECK_ERROR_MENTIONS("Dn + Dr = 160");
        pd.decode_threshold = 20;
        CHECK_OK(kva_plan_create(g.ctx, &pd, &plan));
        kva_plan_destroy(plan);
        gpu_free(&g);
    }
    mla_data_free(&m);
    /* The same on an FP8 latent cache: the kernel-level call on the layer
     * plan is refused, nothing written. */
    c.fp8 = 1;
    if (mla_data_make(ref, &c, &m) && gpu_make(&c, &m, &g)) {
        kva_plan_desc pd = mla_plan_desc(&c, &m, 1);
        kva_plan *plan = NULL;
        CHECK_OK(kva_plan_create(g.ctx, &pd, &plan));
        kernel_call_refused(&c, &m, &g, plan);
        kva_plan_destroy(plan);
        gpu_free(&g);
    }
    mla_data_free(&m);
    c.fp8 = 0;
    /* The CUDA backend's MLA plans are f16 / bf16 (whatever the cache). */
    kva_context *gpu = NULL;
    kva_context_desc gd = {KVA_BACKEND_CUDA, 0, 0};
    CHECK_OK(kva_context_create(&gd, &gpu));
    c.dt = KVA_DTYPE_F32;
    const int32_t qsl[3] = {0, 1, 21}, bt[6] = {0, 1, 2, 3, 4, 5};
    kva_plan_desc pd = {.num_requests = 2,
                        .query_start_loc = qsl,
                        .seq_lens = sl,
                        .block_table = bt,
                        .block_table_stride = 3,
                        .block_size = 16,
                        .num_heads = 4,
                        .num_kv_heads = 1,
                        .head_dim = 576,
                        .head_dim_v = 512,
                        .q_dtype = KVA_DTYPE_F32,
                        .scale = 0.07f,
                        .causal = 1,
                        .window_left = -1,
                        .kind = KVA_ATTN_MLA,
                        .mla_qk_nope_head_dim = 128,
                        .mla_v_head_dim = 128};
    kva_plan *plan = NULL;
    CHECK_STATUS(kva_plan_create(gpu, &pd, &plan), KVA_STATUS_UNSUPPORTED);
    CHECK(plan == NULL);
    kva_context_destroy(gpu);
    kva_context_destroy(ref);
}

#endif

int main(void)
{
    const int skip = cuda_test_skip();
    if (skip)
        return skip;
#ifdef KVA_HAVE_CUDA
    RUN(test_errors);
    RUN(test_grid);
    RUN(test_noncausal);
    RUN(test_long);
#endif
    return kva_test_finish();
}
