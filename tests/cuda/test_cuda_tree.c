/*
 * test_cuda_tree.c - tree verification (kva_plan_desc.tree_parents and
 * .tree_mask) on the CUDA backend against the reference backend, through the
 * public API on random data:
 *   - mixed batches: decodes (q_len 1), small trees that run as work items
 *     of the decode-family kernels and trees of up to KVA_MAX_TREE_TOKENS
 *     (64) tokens that run as prefill tiles; chains, stars, depth-8 and
 *     random trees; committed contexts from 0 keys to past one split-KV
 *     chunk, at and off block edges;
 *   - the tree given as parents and as FlashInfer's packed mask;
 *   - GQA 32/8, MHA 8/8, MQA 16/1; D 64, 128 and 96 (the CUDA-core kernel);
 *   - bf16, f16 and f32 caches and every quantized format (INT8_CHANNEL,
 *     INT8_TOKEN_K, INT8_TOKEN_K_V16 f16/bf16, FP8_E4M3);
 *   - every decode and prefill kernel that runs here, forced in turn;
 *   - soft-cap and sinks rotated in; outputs poisoned (NaN) before each run,
 *     cache slots no request reads NaN.
 * Also: a graph captured over one tree plan replays a plan with other trees
 * and a plan without a tree; tree plans with what trees do not combine with
 * (a sharded plan, a window) get a status on a CUDA context too, and a tree
 * of 65 tokens. KVA_TEST_QUICK=1 runs a shorter list. Exits 77 without a
 * GPU.
 */
#include "cuda_quant_util.h"
#include "tree_util.h"
#include "../../src/attn/cuda/cuda_backend.h"

#ifdef KVA_HAVE_CUDA

typedef struct tcfg {
    uint64_t seed;
    int32_t H, Hkv, D, B;
    kva_dtype dt; /* q, out (and the cache for float caches) */
    int f;        /* index into fmts (cuda_quant_util.h), or -1: float cache */
    kva_layout layout;
    int packed; /* 1: the trees as a packed tree_mask, 0: tree_parents */
    float softcap;
    int sinks;
    const char *dkernel; /* decode-family kernel forced (NULL: the default) */
    const char *pkernel; /* prefill-family kernel forced (NULL: the dispatcher's) */
} tcfg;

static void print_tcfg(const tcfg *c)
{
    fprintf(stderr,
            "  case seed=%llu H=%d Hkv=%d D=%d B=%d %s cache %s %s %s softcap=%g sinks=%d "
            "kernels=%s,%s\n",
            (unsigned long long)c->seed, c->H, c->Hkv, c->D, c->B, kva_dtype_name(c->dt),
            c->f < 0 ? "float" : kva_quant_name(fmts[c->f]),
            c->layout == KVA_LAYOUT_HND ? "HND" : "NHD", c->packed ? "tree_mask" : "tree_parents",
            (double)c->softcap, c->sinks, c->dkernel ? c->dkernel : "default",
            c->pkernel ? c->pkernel : "default");
}

/* A host (REF) cache and its device copy for the batch: random K/V in every
 * slot, then the slots no request reads made NaN on the host before the
 * upload. */
static void make_caches(const tcfg *c, const kva_test_batch *b, kva_context *ref, kva_context *gpu,
                        kva_rng *rng, kva_cache **hc, kva_cache **dc)
{
    const int32_t Hkv = c->Hkv, D = c->D;
    *hc = *dc = NULL;
    if (c->f < 0) {
        CHECK_OK(kva_test_batch_cache(b, ref, rng, Hkv, D, D, c->dt, c->layout, hc));
        if (!*hc)
            return;
        kva_cache_desc cd;
        kva_cache_get_desc(*hc, &cd);
        poison_unread(*hc, b);
        CHECK_OK(kva_cache_create(gpu, &cd, dc));
        if (*dc)
            cache_upload(*dc, *hc);
        return;
    }
    kva_cache_desc cd = {b->num_blocks,   c->B,      Hkv,        D,           D,
                         fmt_dtype(c->f), c->layout, fmts[c->f], KVA_ATTN_MHA};
    float *buf = malloc(sizeof(float) * 2 * Hkv * 2 * D);
    kva_quant_params p;
    make_params(cd.quant, Hkv, D, D, 0, rng, buf, &p);
    qpair qp;
    qpair_create(ref, gpu, &cd, &p, &qp);
    if (qp.hc && qp.dc) {
        const int32_t n = b->num_blocks * c->B;
        float *k = malloc(sizeof(float) * (size_t)n * Hkv * D);
        float *v = malloc(sizeof(float) * (size_t)n * Hkv * D);
        int64_t *slots = malloc(sizeof(int64_t) * (size_t)n);
        kva_test_fill_uniform(k, KVA_DTYPE_F32, (size_t)n * Hkv * D, rng);
        kva_test_fill_uniform(v, KVA_DTYPE_F32, (size_t)n * Hkv * D, rng);
        for (int32_t i = 0; i < n; i++)
            slots[i] = i;
        CHECK_OK(kva_cache_write(ref, qp.hc, n, k, 0, v, 0, KVA_DTYPE_F32, slots));
        poison_unread(qp.hc, b);
        upload_quant(qp.dc, qp.hc);
        free(k);
        free(v);
        free(slots);
    }
    free(buf);
    *hc = qp.hc;
    *dc = qp.dc;
}

/* The trees of a batch: request r's q_len tokens are a tree of kind
 * kinds[r % 4] (parents [T]); mask holds their packed form. */
static void make_trees(const kva_test_batch *b, kva_rng *rng, int32_t *par, uint8_t *mask)
{
    static const int kinds[] = {TREE_RANDOM, TREE_CHAIN, TREE_STAR, TREE_DEPTH8};
    for (int32_t r = 0; r < b->R; r++)
        make_tree(kinds[r % 4], b->q_lens[r], rng, par + b->query_start_loc[r]);
    pack_mask(b->R, b->q_lens, par, mask);
}

/* The reference's out and lse of one case, kept while only the CUDA
 * kernels forced and the tree's form change (the same seed gives the same
 * cache, trees and q): the scalar reference dominates the test's time. */
typedef struct ref_memo {
    int valid;
    void *want;
    float *lw;
} ref_memo;

static void memo_clear(ref_memo *m)
{
    free(m->want);
    free(m->lw);
    memset(m, 0, sizeof *m);
}

/* Runs plan descriptor pd on the reference over hc with q (and sinks, or
 * NULL), or takes its result from memo (if given and valid; else stores it
 * there), and compares out and lse with the device's dout and dl (copied
 * back here). Returns the number of mismatches. */
static size_t compare_ref(const tcfg *c, kva_context *ref, const kva_plan_desc *pd, kva_cache *hc,
                          const void *q, const float *sinks, const void *dout, const float *dl,
                          ref_memo *memo)
{
    const size_t es = kva_dtype_size(c->dt);
    const size_t nq = (size_t)pd->query_start_loc[pd->num_requests] * c->H * c->D;
    const size_t nl = nq / (size_t)c->D;
    void *want = memo && memo->valid ? memo->want : malloc(nq * es + 16);
    float *lw = memo && memo->valid ? memo->lw : malloc(nl * 4 + 16);
    void *got = malloc(nq * es + 16);
    float *lg = malloc(nl * 4 + 16);
    kva_test_poison(got, c->dt, nq);
    kva_test_poison(lg, KVA_DTYPE_F32, nl);
    size_t bad = 1;
    if (!memo || !memo->valid) {
        kva_test_poison(want, c->dt, nq);
        kva_test_poison(lw, KVA_DTYPE_F32, nl);
        kva_plan *pr = NULL;
        CHECK_OK(kva_plan_create(ref, pd, &pr));
        if (pr)
            CHECK_OK(kva_attention_run(ref, pr, q, hc, sinks, want, lw));
        kva_plan_destroy(pr);
        if (memo && pr) {
            memo->valid = 1;
            memo->want = want;
            memo->lw = lw;
        }
    }
    if (!memo || memo->valid) {
        to_host(got, dout, nq * es);
        to_host(lg, dl, nl * 4);
        /* The tensor-core kernels round the softmax weights to 16 bits for
         * P V (bf16 P: 2^-8, f16: 2^-11, times max|v| <= 2 with the
         * quantization step); lse keeps the f32 bound. */
        const int bf = c->dt == KVA_DTYPE_BF16 || (c->f >= 0 && fmt_dtype(c->f) == KVA_DTYPE_BF16);
        const double pu = c->dt == KVA_DTYPE_F32 ? 0.0 : bf ? 0x1p-8 : 0x1p-11;
        const double atol = kva_test_atol(c->dt) + 2.0 * pu;
        bad = kva_test_compare("out", got, want, c->dt, nq, atol, kva_test_rtol(c->dt));
        bad += kva_test_compare_f32("lse", lg, lw, nl, 1e-4, 2e-5);
    }
    if (!memo || !memo->valid)
        free(want), free(lw);
    free(got), free(lg);
    return bad;
}

/* Parents [T + 1] and their packed mask for batch b's trees (make_trees). */
typedef struct trees {
    int32_t *par;
    uint8_t *mask;
} trees;

static trees trees_make(const kva_test_batch *b, kva_rng *rng)
{
    trees t;
    size_t mask_bytes = 1;
    for (int32_t r = 0; r < b->R; r++)
        mask_bytes += ((size_t)b->q_lens[r] * b->q_lens[r] + 7) / 8;
    t.par = malloc(sizeof(int32_t) * (size_t)(b->T + 1));
    t.mask = malloc(mask_bytes);
    make_trees(b, rng, t.par, t.mask);
    return t;
}

static void trees_free(trees *t)
{
    free(t->par);
    free(t->mask);
}

/* Runs the batch's trees on the reference (or takes its result from memo,
 * compare_ref) and the CUDA backend and compares out and lse; returns 1 if
 * they agree. */
static int run_tree(const tcfg *c, const kva_test_batch *b, ref_memo *memo)
{
    kva_rng rng = {c->seed};
    const int32_t H = c->H, D = c->D, T = b->T;
    kva_context *ref = make_ctx(KVA_BACKEND_REF), *gpu = make_ctx(KVA_BACKEND_CUDA);
    if (c->dkernel)
        CHECK_OK(kva__context_force_kernel(gpu, c->dkernel));
    if (c->pkernel)
        CHECK_OK(kva__context_force_kernel(gpu, c->pkernel));
    kva_cache *hc = NULL, *dc = NULL;
    make_caches(c, b, ref, gpu, &rng, &hc, &dc);
    trees tr = trees_make(b, &rng);
    kva_plan_desc pd = kva_test_batch_plan_desc(b, H, c->Hkv, D, D, c->dt);
    pd.causal = 1;
    pd.softcap = c->softcap;
    if (c->packed)
        pd.tree_mask = tr.mask;
    else
        pd.tree_parents = tr.par;
    kva_plan *pg = NULL;
    CHECK_OK(kva_plan_create(gpu, &pd, &pg));
    const kva__cuda_plan *gcp = pg ? (const kva__cuda_plan *)pg->device : NULL;
    if (gcp && c->pkernel && strcmp(c->pkernel, "prefill_items") == 0)
        CHECK_MSG(gcp->num_ptiles == 0, "prefill_items forced but the plan has %d tiles",
                  (int)gcp->num_ptiles);

    const size_t es = kva_dtype_size(c->dt);
    const size_t nq = (size_t)T * H * D, nl = (size_t)T * H;
    void *q = malloc(nq * es + 16);
    float *sinks = malloc(sizeof(float) * (size_t)H);
    for (int32_t h = 0; h < H; h++)
        sinks[h] = (float)(kva_rng_normal(&rng) * 2.0);
    kva_test_fill_uniform(q, c->dt, nq, &rng);
    void *dq = dev_from(q, nq * es), *dout = dev_poisoned(nq * es);
    float *dl = dev_poisoned(nl * 4), *ds = c->sinks ? dev_from(sinks, (size_t)H * 4) : NULL;
    size_t bad = 1;
    if (pg && hc && dc) {
        CHECK_OK(kva_attention_run(gpu, pg, dq, dc, ds, dout, dl));
        bad = compare_ref(c, ref, &pd, hc, q, c->sinks ? sinks : NULL, dout, dl, memo);
        CHECK_MSG(bad == 0, "%zu mismatches (T=%d, %d work items, %d prefill tiles)", bad, (int)T,
                  (int)pg->info.num_work_items, gcp ? (int)gcp->num_ptiles : -1);
    }
    if (bad)
        print_tcfg(c);
    kva_plan_destroy(pg);
    cudaFree(dq);
    cudaFree(dout);
    cudaFree(dl);
    cudaFree(ds);
    free(q), free(sinks);
    trees_free(&tr);
    kva_cache_destroy(hc);
    kva_cache_destroy(dc);
    kva_context_destroy(ref);
    kva_context_destroy(gpu);
    return bad == 0;
}

/* Request shapes: q_len (tree size) and seq_len (committed context + tree);
 * ts_short keeps the scalar reference's time down (quick mode, graph). */
static const int32_t tq[] = {1, 16, 64, 5, 1, 33, 8, 64, 2, 16};
static const int32_t ts[] = {300,     16,     64 + 1500, 5 + 100, 17,
                             33 + 15, 8 + 31, 64 + 700,  2,       16 + 2100};
static const int32_t ts_short[] = {300,     16,     64 + 150, 5 + 100, 17,
                                   33 + 15, 8 + 31, 64 + 70,  2,       16 + 210};
#define NREQ ((int32_t)(sizeof tq / sizeof tq[0]))

static void make_batch(kva_test_batch *b, uint64_t seed, int32_t B, int short_ctx)
{
    kva_rng rng = {seed};
    kva_test_batch_init(b, &rng, NREQ, tq, short_ctx ? ts_short : ts, B, 2, 1);
}

/* Float caches: every kernel that runs here, forced in turn, over GQA, MHA
 * and MQA, D 64 / 128 / 96, bf16 / f16 / f32. */
static void test_float(void)
{
    static const int32_t heads[][2] = {{32, 8}, {8, 8}, {16, 1}};
    static const int32_t dims[] = {128, 64, 96};
    static const char *const dk[] = {NULL, "decode_simt", "decode_mma_sm80"};
    static const char *const pk[] = {NULL,
                                     "prefill_wgmma_tma_sm90",
                                     "prefill_wgmma_sm90",
                                     "prefill_wgmma_tma_narrow_sm90",
                                     "prefill_wgmma_narrow_sm90",
                                     "prefill_mma_sm80",
                                     "prefill_items"};
    const int n = quick() ? 3 : 9;
    for (int i = 0; i < n; i++) {
        tcfg c;
        memset(&c, 0, sizeof c);
        c.seed = 4100 + (uint64_t)i;
        c.H = heads[i % 3][0];
        c.Hkv = heads[i % 3][1];
        c.D = dims[(i + i / 3) % 3];
        c.B = i % 2 ? 16 : 5;
        c.f = -1;
        c.dt = i % 3 == 1 ? KVA_DTYPE_F16 : KVA_DTYPE_BF16;
        c.layout = i % 2 ? KVA_LAYOUT_HND : KVA_LAYOUT_NHD;
        c.softcap = i == 4 ? 5.0f : 0.0f;
        c.sinks = i % 4 == 2;
        kva_test_batch b;
        make_batch(&b, 5200 + (uint64_t)i, c.B, quick() && i > 0);
        ref_memo memo = {0, NULL, NULL};
        for (int d = 0; d < 3; d++)
            for (int k = 0; k < (int)(sizeof pk / sizeof pk[0]); k++) {
                if ((d > 0 && k > 0) || (dk[d] && !kernel_usable(dk[d])) ||
                    (pk[k] && !kernel_usable(pk[k])))
                    continue;
                c.dkernel = dk[d];
                c.pkernel = pk[k];
                c.packed = (d + k + i) % 2;
                CHECK_MSG(run_tree(&c, &b, &memo), "float case %d, kernels %s / %s", i,
                          dk[d] ? dk[d] : "default", pk[k] ? pk[k] : "default");
            }
        c.dt = KVA_DTYPE_F32; /* the CUDA-core kernels */
        c.dkernel = c.pkernel = NULL;
        memo_clear(&memo);
        CHECK_MSG(run_tree(&c, &b, NULL), "float case %d, f32", i);
        kva_test_batch_free(&b);
    }
    printf("test_float: %d batches done\n", n);
    fflush(stdout);
}

/* Quantized caches: every format, default plans (the tensor-core kernels
 * where they cover the format) and plans for the CUDA-core kernels. */
static void test_quant(void)
{
    for (int f = 0; f < NFMT; f++)
        for (int simt = 0; simt < (quick() && f != 1 ? 1 : 2); simt++) {
            tcfg c;
            memset(&c, 0, sizeof c);
            c.seed = 4300 + (uint64_t)(f * 2 + simt);
            c.H = f % 2 ? 8 : 32;
            c.Hkv = 8;
            c.D = f == 4 && simt ? 64 : 128;
            c.B = 16;
            c.f = f;
            /* INT8_TOKEN_K_V16: q in the V dtype (its tensor-core path). */
            c.dt = fmts[f] == KVA_QUANT_INT8_TOKEN_K_V16 ? fmt_dtype(f)
                   : f % 2                               ? KVA_DTYPE_F16
                                                         : KVA_DTYPE_BF16;
            c.layout = simt ? KVA_LAYOUT_HND : KVA_LAYOUT_NHD;
            c.packed = f % 2;
            c.sinks = f == 1;
            c.dkernel = simt ? "decode_simt" : NULL;
            c.pkernel = simt ? "prefill_items" : NULL;
            kva_test_batch b;
            make_batch(&b, 5400 + (uint64_t)f, c.B, quick());
            CHECK_MSG(run_tree(&c, &b, NULL), "quant format %s%s", kva_quant_name(fmts[f]),
                      simt ? ", CUDA-core kernels" : "");
            kva_test_batch_free(&b);
        }
    printf("test_quant: %d formats done\n", NFMT);
    fflush(stdout);
}

/* A graph captured over a run of one tree plan replays, after new plans of
 * the same shape, other trees (the words live in the context's metadata)
 * and a plan without a tree (the header's tree flag); each replay's out
 * is poisoned first and compared with the reference. */
static void test_graph(void)
{
    tcfg c;
    memset(&c, 0, sizeof c);
    c.seed = 4500;
    c.H = 32;
    c.Hkv = 8;
    c.D = 128;
    c.B = 16;
    c.f = -1;
    c.dt = KVA_DTYPE_BF16;
    kva_test_batch b;
    make_batch(&b, 5500, c.B, 1);
    kva_rng rng = {c.seed};
    kva_context *ref = make_ctx(KVA_BACKEND_REF), *gpu = make_ctx(KVA_BACKEND_CUDA);
    cudaStream_t stream = NULL;
    CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    CHECK_OK(kva_cuda_context_set_stream(gpu, stream));
    kva_cuda_capacity cap = {NREQ, 512, (int64_t)NREQ * b.stride, c.H, c.Hkv, c.D};
    CHECK_OK(kva_cuda_context_reserve(gpu, &cap));
    kva_cache *hc = NULL, *dc = NULL;
    make_caches(&c, &b, ref, gpu, &rng, &hc, &dc);
    const size_t nq = (size_t)b.T * c.H * c.D, nl = (size_t)b.T * c.H;
    void *q = malloc(nq * 2);
    kva_test_fill_uniform(q, c.dt, nq, &rng);
    void *dq = dev_from(q, nq * 2), *dout = dev_poisoned(nq * 2);
    float *dl = dev_poisoned(nl * 4);
    trees t1 = trees_make(&b, &rng), t2 = trees_make(&b, &rng);
    kva_plan_desc pd = kva_test_batch_plan_desc(&b, c.H, c.Hkv, c.D, c.D, c.dt);
    pd.causal = 1;
    pd.tree_parents = t1.par;
    kva_plan *p = NULL;
    CHECK_OK(kva_plan_create(gpu, &pd, &p));
    CUDA_OK(cudaStreamSynchronize(stream));
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    CHECK_OK(kva_attention_run(gpu, p, dq, dc, NULL, dout, dl));
    CUDA_OK(cudaStreamEndCapture(stream, &graph));
    CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    for (int step = 0; step < 3 && exec; step++) {
        /* step 0: the captured plan; 1: other trees (as a mask); 2: no tree. */
        pd.tree_parents = step == 0 ? t1.par : NULL;
        pd.tree_mask = step == 1 ? t2.mask : NULL;
        if (step > 0) {
            kva_plan_destroy(p);
            p = NULL;
            CHECK_OK(kva_plan_create(gpu, &pd, &p));
        }
        CUDA_OK(cudaMemsetAsync(dout, 0xff, nq * 2, stream));
        CUDA_OK(cudaMemsetAsync(dl, 0xff, nl * 4, stream));
        CUDA_OK(cudaGraphLaunch(exec, stream));
        CUDA_OK(cudaStreamSynchronize(stream));
        CHECK_MSG(compare_ref(&c, ref, &pd, hc, q, NULL, dout, dl, NULL) == 0, "graph replay %d",
                  step);
    }
    if (exec)
        cudaGraphExecDestroy(exec);
    if (graph)
        cudaGraphDestroy(graph);
    kva_plan_destroy(p);
    trees_free(&t1);
    trees_free(&t2);
    cudaFree(dq);
    cudaFree(dout);
    cudaFree(dl);
    free(q);
    kva_cache_destroy(hc);
    kva_cache_destroy(dc);
    kva_context_destroy(ref);
    kva_context_destroy(gpu);
    cudaStreamDestroy(stream);
    kva_test_batch_free(&b);
    printf("test_graph: done\n");
    fflush(stdout);
}

/* Refused tree plans on a CUDA context: a status naming the field, no plan. */
static void test_refused(void)
{
    static const int32_t q[] = {4, 65}, sl[] = {40, 100};
    kva_rng rng = {4600};
    kva_test_batch b;
    kva_test_batch_init(&b, &rng, 2, q, sl, 16, 2, 1);
    kva_context *gpu = make_ctx(KVA_BACKEND_CUDA);
    int32_t par[69];
    for (int32_t i = 0; i < 69; i++)
        par[i] = i < 4 ? i - 1 : i - 5; /* two chains */
    kva_plan_desc pd = kva_test_batch_plan_desc(&b, 8, 2, 64, 64, KVA_DTYPE_BF16);
    pd.causal = 1;
    pd.tree_parents = par;
    kva_plan *p = NULL;
    CHECK_STATUS(kva_plan_create(gpu, &pd, &p), KVA_STATUS_UNSUPPORTED);
    CHECK_ERROR_MENTIONS("KVA_MAX_TREE_TOKENS");
    CHECK(p == NULL);
    b.query_start_loc[2] = 4 + 64; /* the second tree cut to 64 tokens */
    b.q_lens[1] = 64;
    pd = kva_test_batch_plan_desc(&b, 8, 2, 64, 64, KVA_DTYPE_BF16);
    pd.causal = 1;
    pd.tree_parents = par;
    pd.dcp_size = 2;
    CHECK_STATUS(kva_plan_create(gpu, &pd, &p), KVA_STATUS_UNSUPPORTED);
    CHECK_ERROR_MENTIONS("dcp_size");
    CHECK(p == NULL);
    pd.dcp_size = 0;
    pd.window_left = 8;
    CHECK_STATUS(kva_plan_create(gpu, &pd, &p), KVA_STATUS_UNSUPPORTED);
    CHECK_ERROR_MENTIONS("window_left");
    CHECK(p == NULL);
    pd.window_left = -1;
    CHECK_OK(kva_plan_create(gpu, &pd, &p));
    kva_plan_destroy(p);
    kva_context_destroy(gpu);
    kva_test_batch_free(&b);
}

#endif /* KVA_HAVE_CUDA */

int main(void)
{
    int skip = cuda_test_skip();
    if (skip)
        return skip;
#ifdef KVA_HAVE_CUDA
    RUN(test_refused);
    RUN(test_float);
    RUN(test_quant);
    RUN(test_graph);
#endif
    return kva_test_finish();
}
