/*
 * test_cuda_attn.c - the CUDA attention kernels against the reference
 * backend over the foundation grid: random mixed batches (decode, spec
 * decode, chunked and fresh prefill) crossed with D/Dv, GQA pairs (MHA, GQA,
 * MQA), block sizes from 1, dtypes, layouts, causal/window/non-causal masks,
 * soft-cap, ALiBi, sinks, LSE on/off, paged and ragged. Device outputs are
 * poisoned with NaN (0xff bytes) before every run, and the cache slots no
 * request may read (past seq_len in a partly filled block, unused blocks)
 * hold NaN too. Prefills of paged f16/bf16 plans with D in {64, 128, 256}
 * run on the tensor-core kernel (prefill_mma) next to the decode kernel;
 * test_mma_mixed covers those shapes explicitly and checks the routing.
 * Also: split-KV on long contexts, rows that see no key, the stale-plan rule.
 * Exits 77 without a GPU.
 */
#include "batchgen.h"
#include "cuda_util.h"
#include "../../src/plan/partition.h"
#include "../../src/attn/cuda/cuda_backend.h"

#ifdef KVA_HAVE_CUDA

typedef struct cfg {
    uint64_t seed;
    int32_t R, max_len;
    unsigned kinds;
    int32_t H, Hkv, D, Dv, B;
    kva_dtype dt;
    kva_layout layout;
    int32_t causal, window, chunk; /* chunk: attention_chunk, 0 = none */
    float softcap, scale;
    int alibi, sinks, lse, ragged;
    const char *dkernel; /* decode-family kernel forced on the CUDA context (NULL: default) */
    const char *pkernel; /* prefill-family kernel forced (NULL: the dispatcher's choice) */
    int keep_tail;       /* 1: leave the cache's unreadable slots random (default: NaN) */
    int want_mma;        /* 1: the plan must route at least one prefill to prefill_mma */
    int balanced;        /* 1: the balanced schedule of split items (kva__cuda_context_balanced) */
} cfg;

/* Writes NaN (0xff bytes) into every K/V slot of the host cache that no
 * request of b may read: slots at or past seq_len in each request's last
 * (partly filled) block, every slot of unused blocks and, with a local
 * attention chunk (> 0), of the blocks that end before the chunk of the
 * request's first query. A block shared by several requests keeps the slots
 * any of them reads. */
static void poison_unread_slots(kva_cache *hc, const kva_test_batch *b, int32_t chunk)
{
    kva_cache_desc cd;
    kva_cache_get_desc(hc, &cd);
    void *kp, *vp;
    kva_cache_data(hc, &kp, &vp);
    const int32_t B = cd.block_size, Hkv = cd.num_kv_heads;
    int32_t *used = calloc((size_t)cd.num_blocks, sizeof(int32_t)); /* slots read per block */
    for (int32_t r = 0; r < b->R; r++)
        for (int32_t k = 0; (int64_t)k * B < b->seq_lens[r]; k++) {
            const int32_t first = b->seq_lens[r] - b->q_lens[r];
            if (chunk > 0 && b->q_lens[r] > 0 && (k + 1) * B <= first - first % chunk)
                continue;
            const int32_t blk = b->block_table[(size_t)r * b->stride + k];
            const int32_t n = b->seq_lens[r] - k * B < B ? b->seq_lens[r] - k * B : B;
            if (n > used[blk])
                used[blk] = n;
        }
    const size_t es = kva_dtype_size(cd.dtype);
    for (int32_t blk = 0; blk < cd.num_blocks; blk++)
        for (int32_t o = used[blk]; o < B; o++)
            for (int32_t h = 0; h < Hkv; h++) {
                const int64_t row = cd.layout == KVA_LAYOUT_NHD ? ((int64_t)blk * B + o) * Hkv + h
                                                                : ((int64_t)blk * Hkv + h) * B + o;
                memset((char *)kp + (size_t)row * cd.head_dim * es, 0xff, (size_t)cd.head_dim * es);
                memset((char *)vp + (size_t)row * cd.head_dim_v * es, 0xff,
                       (size_t)cd.head_dim_v * es);
            }
    free(used);
}

static void print_cfg(const cfg *c)
{
    fprintf(stderr,
            "  case seed=%llu R=%d max_len=%d kinds=%u H=%d Hkv=%d D=%d Dv=%d B=%d dt=%s %s "
            "causal=%d window=%d chunk=%d softcap=%g scale=%g alibi=%d sinks=%d lse=%d "
            "ragged=%d kernels=%s,%s\n",
            (unsigned long long)c->seed, c->R, c->max_len, c->kinds, c->H, c->Hkv, c->D, c->Dv,
            c->B, kva_dtype_name(c->dt), c->layout == KVA_LAYOUT_NHD ? "NHD" : "HND", c->causal,
            c->window, c->chunk, (double)c->softcap, (double)c->scale, c->alibi, c->sinks, c->lse,
            c->ragged, c->dkernel ? c->dkernel : "default", c->pkernel ? c->pkernel : "default");
}

/* Runs one case on the reference and the CUDA backend (given batch, or a
 * random one when b is NULL) and compares out and lse. Returns 1 if equal. */
static int run_batch(const cfg *c, const kva_test_batch *given)
{
    kva_rng rng = {c->seed};
    kva_test_batch batch;
    if (given)
        batch = *given;
    else
        kva_test_batch_random(&batch, &rng, c->R, c->B, c->max_len, c->kinds, 1);
    const kva_test_batch *b = &batch;
    const int32_t H = c->H, Hkv = c->Hkv, D = c->D, Dv = c->Dv, T = b->T;
    const size_t es = kva_dtype_size(c->dt);
    kva_context_desc rd = {KVA_BACKEND_REF, 0, 0}, gd = {KVA_BACKEND_CUDA, 0, 0};
    kva_context *ref = NULL, *gpu = NULL;
    CHECK_OK(kva_context_create(&rd, &ref));
    CHECK_OK(kva_context_create(&gd, &gpu));

    kva_cache *hc = NULL, *dc = NULL;
    void *hk = NULL, *hv = NULL, *dk = NULL, *dv = NULL;
    int64_t kv_rows = 0;
    for (int32_t r = 0; r < b->R; r++)
        kv_rows += b->seq_lens[r];
    if (c->ragged) {
        size_t kn = (size_t)kv_rows * Hkv * D, vn = (size_t)kv_rows * Hkv * Dv;
        hk = malloc(kn * es + 16);
        hv = malloc(vn * es + 16);
        kva_test_fill_uniform(hk, c->dt, kn, &rng);
        kva_test_fill_uniform(hv, c->dt, vn, &rng);
        dk = dev_from(hk, kn * es);
        dv = dev_from(hv, vn * es);
    } else {
        CHECK_OK(kva_test_batch_cache(b, ref, &rng, Hkv, D, Dv, c->dt, c->layout, &hc));
        if (hc && !c->keep_tail)
            poison_unread_slots(hc, b, c->chunk);
        kva_cache_desc cd;
        kva_cache_get_desc(hc, &cd);
        CHECK_OK(kva_cache_create(gpu, &cd, &dc));
        if (hc && dc)
            cache_upload(dc, hc);
    }

    kva_plan_desc pd = kva_test_batch_plan_desc(b, H, Hkv, D, Dv, c->dt);
    if (c->ragged) {
        pd.block_table = NULL;
        pd.block_table_stride = 0;
        pd.block_size = 0;
    }
    pd.causal = c->causal;
    pd.window_left = c->window;
    pd.attention_chunk = c->chunk;
    pd.softcap = c->softcap;
    pd.scale = c->scale;
    float *slopes = malloc(sizeof(float) * (size_t)H), *sinks = malloc(sizeof(float) * (size_t)H);
    for (int32_t h = 0; h < H; h++) {
        slopes[h] = (float)pow(2.0, -8.0 * (h + 1) / H);
        sinks[h] = (float)(kva_rng_normal(&rng) * 2.0);
    }
    pd.alibi_slopes = c->alibi ? slopes : NULL;
    kva_plan *pr = NULL, *pg = NULL;
    CHECK_OK(kva_plan_create(ref, &pd, &pr));
    /* The forced kernels decide the partition (the tensor-core decode: 16 rows
     * per item) and whether prefills get tiles. */
    CHECK_OK(kva__context_force_kernel(gpu, NULL));
    if (c->dkernel)
        CHECK_OK(kva__context_force_kernel(gpu, c->dkernel));
    CHECK_OK(kva__cuda_context_balanced(gpu, c->balanced));
    if (c->pkernel)
        CHECK_OK(kva__context_force_kernel(gpu, c->pkernel));
    CHECK_OK(kva_plan_create(gpu, &pd, &pg));
    const kva__cuda_plan *gcp = pg ? (const kva__cuda_plan *)pg->device : NULL;
    if (gcp && c->dkernel && kva__cuda_decode_mma_supported(D, Dv, c->dt)) {
        const int want = strcmp(c->dkernel, "decode_mma_sm80") == 0 ? KVA__CUDA_K_DECODE_MMA
                                                                    : KVA__CUDA_K_DECODE_SIMT;
        CHECK_MSG(gcp->decode_kernel == want, "%s forced but the plan runs %s", c->dkernel,
                  kva__cuda_kernels[gcp->decode_kernel].name);
    }
    if (gcp && c->pkernel && strcmp(c->pkernel, "prefill_items") == 0)
        CHECK_MSG(gcp->num_ptiles == 0, "prefill_items forced but the plan has %d tiles",
                  (int)gcp->num_ptiles);
    if (pg && c->want_mma)
        CHECK_MSG(((const kva__cuda_plan *)pg->device)->num_ptiles > 0,
                  "the plan routed no prefill to prefill_mma");

    const size_t nq = (size_t)T * H * D, no = (size_t)T * H * Dv, nl = (size_t)T * H;
    void *q = malloc(nq * es + 16), *out_ref = malloc(no * es + 16),
         *out_gpu = malloc(no * es + 16);
    float *lse_ref = malloc(nl * 4 + 16), *lse_gpu = malloc(nl * 4 + 16);
    kva_test_fill_uniform(q, c->dt, nq, &rng);
    void *dq = dev_from(q, nq * es);
    float *dsinks = c->sinks ? dev_from(sinks, (size_t)H * 4) : NULL;
    void *dout = dev_poisoned(no * es);
    float *dlse = c->lse ? dev_poisoned(nl * 4) : NULL;
    const float *hs = c->sinks ? sinks : NULL;

    kva_test_poison(out_ref, c->dt, no);
    kva_test_poison(lse_ref, KVA_DTYPE_F32, nl);
    if (c->ragged) {
        CHECK_OK(kva_attention_run_ragged(ref, pr, q, hk, hv, hs, out_ref, lse_ref));
        CHECK_OK(kva_attention_run_ragged(gpu, pg, dq, dk, dv, dsinks, dout, dlse));
    } else {
        CHECK_OK(kva_attention_run(ref, pr, q, hc, hs, out_ref, lse_ref));
        CHECK_OK(kva_attention_run(gpu, pg, dq, dc, dsinks, dout, dlse));
    }
    kva_test_poison(out_gpu, c->dt, no);
    kva_test_poison(lse_gpu, KVA_DTYPE_F32, nl);
    to_host(out_gpu, dout, no * es);
    /* prefill_mma and the tensor-core decode round the softmax
     * weights to the input dtype for P V (as FlashAttention): out may differ
     * by u * max|v| more (u = 2^-8 bf16, 2^-11 f16; max|v| = sqrt(3) for the
     * uniform fill), lse does not. */
    const int mma = gcp && (gcp->num_ptiles > 0 || gcp->decode_kernel == KVA__CUDA_K_DECODE_MMA);
    const double atol = kva_test_atol(c->dt) +
                        (mma ? (c->dt == KVA_DTYPE_BF16 ? 0x1p-8 : 0x1p-11) * 1.7320508 : 0.0);
    size_t bad = kva_test_compare("out", out_gpu, out_ref, c->dt, no, atol, kva_test_rtol(c->dt));
    if (c->lse) {
        to_host(lse_gpu, dlse, nl * 4);
        bad += kva_test_compare_f32("lse", lse_gpu, lse_ref, nl, 1e-4, 2e-5);
    }
    CHECK_MSG(bad == 0, "%zu mismatches (T=%d, %d work items)", bad, (int)T,
              pg ? (int)pg->info.num_work_items : -1);
    if (bad)
        print_cfg(c);

    kva_plan_destroy(pr);
    kva_plan_destroy(pg);
    cudaFree(dq);
    cudaFree(dsinks);
    cudaFree(dout);
    cudaFree(dlse);
    cudaFree(dk);
    cudaFree(dv);
    free(q);
    free(out_ref);
    free(out_gpu);
    free(lse_ref);
    free(lse_gpu);
    free(slopes);
    free(sinks);
    free(hk);
    free(hv);
    kva_cache_destroy(hc);
    kva_cache_destroy(dc);
    kva_context_destroy(ref);
    kva_context_destroy(gpu);
    if (!given)
        kva_test_batch_free(&batch);
    return bad == 0;
}

/* Random cases over the foundation grid, fixed seed. */
static void test_grid(void)
{
    static const int32_t dims[][2] = {{64, 64}, {128, 128}, {256, 256}, {8, 8},
                                      {96, 96}, {192, 128}, {40, 72},   {128, 64}};
    static const int32_t heads[][2] = {{4, 4}, {8, 2}, {32, 8}, {16, 1}, {12, 4}, {24, 3}};
    static const int32_t bsizes[] = {1, 3, 16, 16, 32, 64};
    static const kva_dtype dts[] = {KVA_DTYPE_F32, KVA_DTYPE_F16, KVA_DTYPE_BF16, KVA_DTYPE_BF16};
    static const int32_t windows[] = {-1, -1, -1, 0, 7, 100};
    static const unsigned kinds[] = {15u, 15u, 1u, 3u, 12u};
    static const int32_t reqs[] = {1, 3, 9, 24};
    static const int32_t lens[] = {20, 150, 700};
    kva_rng rng = {20261122};
    int failed = 0;
    /* KVA_TEST_QUICK (compute-sanitizer runs): the first cases only. */
    const int n = getenv("KVA_TEST_QUICK") ? 12 : 160;
    for (int i = 0; i < n && failed < 5; i++) {
        cfg c;
        memset(&c, 0, sizeof c);
        c.seed = 1000 + (uint64_t)i;
        c.R = reqs[kva_rng_int(&rng, 0, 3)];
        c.max_len = lens[kva_rng_int(&rng, 0, 2)];
        c.kinds = kinds[kva_rng_int(&rng, 0, 4)];
        int hi = kva_rng_int(&rng, 0, 5), di = kva_rng_int(&rng, 0, 7);
        c.H = heads[hi][0];
        c.Hkv = heads[hi][1];
        c.D = dims[di][0];
        c.Dv = dims[di][1];
        c.B = bsizes[kva_rng_int(&rng, 0, 5)];
        c.dt = dts[kva_rng_int(&rng, 0, 3)];
        c.layout = kva_rng_int(&rng, 0, 1) ? KVA_LAYOUT_HND : KVA_LAYOUT_NHD;
        c.causal = kva_rng_int(&rng, 0, 4) != 0;
        c.window = windows[kva_rng_int(&rng, 0, 5)];
        c.softcap = kva_rng_int(&rng, 0, 3) == 0 ? 2.0f : 0.0f;
        c.scale = kva_rng_int(&rng, 0, 2) == 0 ? 0.3f : 0.0f;
        c.alibi = kva_rng_int(&rng, 0, 3) == 0;
        c.sinks = kva_rng_int(&rng, 0, 2) == 0;
        c.lse = kva_rng_int(&rng, 0, 3) != 0;
        c.ragged = kva_rng_int(&rng, 0, 7) == 0;
        /* Both decode kernels (f32 and uncovered shapes always run
         * decode_simt), and prefills on tiles (the dispatcher's kernel or
         * mma.sync) or as work items. */
        c.dkernel = i % 2 ? "decode_simt" : "decode_mma_sm80";
        c.pkernel = i % 3 == 1 ? "prefill_items" : i % 3 == 2 ? "prefill_mma_sm80" : NULL;
        if (c.R * c.max_len > 6000 && (c.kinds & 12u))
            c.R = 3;
        if (!run_batch(&c, NULL))
            failed++;
    }
}

static void make_batch(kva_test_batch *b, uint64_t seed, int32_t R, const int32_t *q,
                       const int32_t *s, int32_t B)
{
    kva_rng rng = {seed};
    kva_test_batch_init(b, &rng, R, q, s, B, 2, 1);
}

/* Long contexts with few items force split-KV and the second-pass merge;
 * the decode benchmark's shape (GQA 32/8, D 128, B 16) with q_len 1..4. The
 * tensor-core decode runs it with fixed chunks (the default) and on the
 * balanced schedule (its warps take the tasks' key units as they go). */
static void test_split_kv(void)
{
    static const int32_t q[] = {1, 4, 1, 2}, s[] = {9000, 5000, 300, 4100};
    static const kva_dtype dts[] = {KVA_DTYPE_BF16, KVA_DTYPE_F16, KVA_DTYPE_F32};
    for (int i = 0; i < 3; i++) {
        kva_test_batch b;
        make_batch(&b, 77 + (uint64_t)i, 4, q, s, 16);
        cfg c;
        memset(&c, 0, sizeof c);
        c.seed = 5 + (uint64_t)i;
        c.H = 32;
        c.Hkv = 8;
        c.D = c.Dv = 128;
        c.B = 16;
        c.dt = dts[i];
        c.causal = 1;
        c.window = -1;
        c.sinks = i == 1;
        c.lse = 1;
        c.layout = i == 2 ? KVA_LAYOUT_HND : KVA_LAYOUT_NHD;
        c.dkernel = "decode_simt";
        run_batch(&c, &b);
        c.dkernel = "decode_mma_sm80";
        run_batch(&c, &b);
        c.balanced = 1; /* the balanced schedule of split items, on the same batch */
        run_batch(&c, &b);
        kva_test_batch_free(&b);
    }
}

/* More items than the tensor-core decode's persistent grid, so every CTA runs
 * several in turn (its next item's first copies go out during the current
 * item's epilogue): about 2.5 items per resident CTA of the device, ragged
 * short contexts, two long ones (split tasks, merged by a last CTA that has
 * further items), a 3-token draft; bf16 D 128 NHD with sinks, f16 D 64 HND
 * with a window (3 CTAs per SM). The same batch with fewer requests than the
 * grid runs a grid of its items. */
static void test_many_items(void)
{
    int dev = 0, sms = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
        sms = 1;
    enum { RMAX = 160 };
    const int32_t R =
        sms * 3 * 5 / 2 / 8 < RMAX ? (sms * 3 * 5 / 2 / 8 > 4 ? sms * 3 * 5 / 2 / 8 : 4) : RMAX;
    int32_t q[RMAX], s[RMAX];
    kva_rng rng = {7373};
    for (int32_t r = 0; r < R; r++) {
        q[r] = r == 2 ? 3 : 1;
        s[r] = r == 0 ? 9000 : r == 5 ? 5000 : kva_rng_int(&rng, 20, 700);
    }
    for (int i = 0; i < 3; i++) {
        kva_test_batch b;
        make_batch(&b, 61 + (uint64_t)i, i == 2 ? 5 : R, q, s, 16);
        cfg c;
        memset(&c, 0, sizeof c);
        c.seed = 23 + (uint64_t)i;
        c.H = 32;
        c.Hkv = 8;
        c.D = c.Dv = i == 1 ? 64 : 128;
        c.B = 16;
        c.dt = i == 1 ? KVA_DTYPE_F16 : KVA_DTYPE_BF16;
        c.causal = 1;
        c.window = i == 1 ? 300 : -1;
        c.sinks = i != 1;
        c.lse = 1;
        c.layout = i == 1 ? KVA_LAYOUT_HND : KVA_LAYOUT_NHD;
        c.dkernel = "decode_mma_sm80";
        run_batch(&c, &b);
        kva_test_batch_free(&b);
    }
}

/* The tensor-core decode kernel on decode-shaped batches: GQA
 * groups 1, 4, 8, 16 and 32 (more than one 16-row item per token), q_len 1..8
 * (speculative decodes: the causal mask inside the draft tokens), D 64/128/256,
 * bf16/f16, NHD/HND, block sizes 1/16/32, causal/window/non-causal, soft-cap,
 * ALiBi, sinks, LSE; contexts long enough to be split on a few requests. Every
 * fourth case runs the CUDA-core kernel on the same batch. */
static void test_decode_mma(void)
{
    static const int32_t heads[][2] = {{8, 8}, {32, 8}, {64, 8}, {16, 1}, {32, 1}, {12, 4}};
    static const int32_t dims[] = {128, 64, 256};
    static const int32_t bsizes[] = {16, 1, 32};
    static const int32_t windows[] = {-1, -1, 50, 1000};
    const int n = getenv("KVA_TEST_QUICK") ? 8 : 36;
    kva_rng rng = {4242};
    int failed = 0;
    for (int i = 0; i < n && failed < 5; i++) {
        cfg c;
        memset(&c, 0, sizeof c);
        c.seed = 2000 + (uint64_t)i;
        c.H = heads[i % 6][0];
        c.Hkv = heads[i % 6][1];
        c.D = c.Dv = dims[(i / 2) % 3];
        c.B = bsizes[(i / 3) % 3];
        c.dt = (i / 4) % 2 ? KVA_DTYPE_F16 : KVA_DTYPE_BF16;
        c.layout = (i / 5) % 2 ? KVA_LAYOUT_HND : KVA_LAYOUT_NHD;
        c.causal = i % 7 != 6;
        c.window = windows[(i / 3) % 4];
        c.softcap = i % 5 == 2 ? 3.0f : 0.0f;
        c.alibi = i % 6 == 4;
        c.sinks = i % 3 == 1;
        c.lse = i % 4 != 3;
        c.dkernel = i % 4 == 3 ? "decode_simt" : "decode_mma_sm80";
        /* Few requests with long contexts (split-KV) or many short ones. */
        const int32_t R = i % 2 ? 3 : 12;
        int32_t q[12], sl[12];
        for (int32_t r = 0; r < R; r++) {
            q[r] = 1 + (int32_t)kva_rng_int(&rng, 0, 7); /* 1..8 */
            if (i % 3 == 0)
                q[r] = 1 + r % 2 * 3; /* decodes and 4-token drafts */
            sl[r] = q[r] + (R == 3 ? (int32_t)kva_rng_int(&rng, 1500, 5000)
                                   : (int32_t)kva_rng_int(&rng, 0, 700));
        }
        kva_test_batch b;
        make_batch(&b, 900 + (uint64_t)i, R, q, sl, c.B);
        if (!run_batch(&c, &b))
            failed++;
        kva_test_batch_free(&b);
    }
}

/* kva__context_force_kernel on the CUDA backend: an unknown name fails and
 * lists the registry; a forced kernel steers the plan; the forced wgmma
 * prefill runs at D 256 (sm_90a); a forced prefill kernel that does not exist
 * for the shape (mma.sync at D 192 / Dv 128) fails the run with a status and
 * leaves out untouched. */
static void test_force_kernel(void)
{
    static const int32_t q[] = {40, 1}, s[] = {100, 60};
    kva_test_batch b;
    make_batch(&b, 4, 2, q, s, 16);
    kva_context_desc gd = {KVA_BACKEND_CUDA, 0, 0};
    kva_context *gpu = NULL;
    CHECK_OK(kva_context_create(&gd, &gpu));
    kva_cache_desc cd = {b.num_blocks,   16,          2, 256, 256, KVA_DTYPE_BF16, KVA_LAYOUT_NHD,
                         KVA_QUANT_NONE, KVA_ATTN_MHA};
    kva_cache *dc = NULL;
    CHECK_OK(kva_cache_create(gpu, &cd, &dc));
    kva_plan_desc pd = kva_test_batch_plan_desc(&b, 8, 2, 256, 256, KVA_DTYPE_BF16);
    CHECK_STATUS(kva__context_force_kernel(gpu, "decode_v4"), KVA_STATUS_INVALID_ARGUMENT);
    CHECK_ERROR_MENTIONS("decode_mma_sm80");
    CHECK_OK(kva__context_force_kernel(gpu, "decode_simt"));
    CHECK(kva__context_forced_kernel(gpu, KVA__KERNEL_DECODE) == KVA__CUDA_K_DECODE_SIMT);
    kva_plan *p = NULL;
    CHECK_OK(kva_plan_create(gpu, &pd, &p));
    CHECK(p && ((const kva__cuda_plan *)p->device)->decode_kernel == KVA__CUDA_K_DECODE_SIMT);
    kva_plan_destroy(p);
    p = NULL;
    CHECK_OK(kva__context_force_kernel(gpu, NULL));
    CHECK_OK(kva_plan_create(gpu, &pd, &p));
    CHECK(p && ((const kva__cuda_plan *)p->device)->decode_kernel == KVA__CUDA_K_DECODE_MMA);
    kva_plan_destroy(p);
    p = NULL;
    void *dq = dev_poisoned((size_t)b.T * 8 * 256 * 2);
    void *dout = dev_poisoned((size_t)b.T * 8 * 256 * 2);
    const kva_status fs = kva__context_force_kernel(gpu, "prefill_wgmma_sm90");
    if (fs == KVA_STATUS_OK) { /* an sm_90a build on an H100: D 256 runs on wgmma */
        CHECK_OK(kva_plan_create(gpu, &pd, &p));
        if (p) {
            CHECK(((const kva__cuda_plan *)p->device)->prefill_kernel == KVA__CUDA_PREFILL_WGMMA);
            CHECK_OK(kva_attention_run(gpu, p, dq, dc, NULL, dout, NULL));
            CHECK(!dev_untouched(dout));
        }
    } else {
        CHECK_STATUS(fs, KVA_STATUS_UNSUPPORTED);
        CHECK_ERROR_MENTIONS("prefill_wgmma_sm90");
        CHECK(dev_untouched(dout));
    }
    kva_plan_destroy(p);
    p = NULL;
    cudaFree(dq);
    cudaFree(dout);
    kva_cache_destroy(dc);
    dc = NULL;
    /* mma.sync has no D 192 / Dv 128 kernel: forced there, the run fails. */
    kva_cache_desc cd2 = {b.num_blocks,   16,          2, 192, 128, KVA_DTYPE_BF16, KVA_LAYOUT_NHD,
                          KVA_QUANT_NONE, KVA_ATTN_MHA};
    CHECK_OK(kva_cache_create(gpu, &cd2, &dc));
    kva_plan_desc pd2 = kva_test_batch_plan_desc(&b, 8, 2, 192, 128, KVA_DTYPE_BF16);
    dq = dev_poisoned((size_t)b.T * 8 * 192 * 2);
    dout = dev_poisoned((size_t)b.T * 8 * 128 * 2);
    CHECK_OK(kva__context_force_kernel(gpu, "prefill_mma_sm80"));
    CHECK_OK(kva_plan_create(gpu, &pd2, &p));
    if (p && dc) {
        CHECK_STATUS(kva_attention_run(gpu, p, dq, dc, NULL, dout, NULL),
                     KVA_STATUS_INVALID_ARGUMENT);
        CHECK_ERROR_MENTIONS("D = 192");
    }
    CHECK(dev_untouched(dout));
    kva_plan_destroy(p);
    cudaFree(dq);
    cudaFree(dout);
    kva_cache_destroy(dc);
    kva_context_destroy(gpu);
    kva_test_batch_free(&b);
}

/* Mixed batches (decodes, spec decodes, chunked and fresh prefills, a long
 * context) at every shape prefill_mma covers: D 64/128/256 x bf16/f16, NHD
 * and HND, block sizes 16, 3 (not a power of two), 64 and 1, with the masks
 * and extras rotated. The prefills run on prefill_mma, the rest on the decode
 * kernel, in one kva_attention_run; unread cache slots hold NaN. */
static void test_mma_mixed(void)
{
    static const int32_t q[] = {1, 300, 1, 77, 4, 130, 1, 17};
    static const int32_t s[] = {500, 300, 1000, 900, 260, 1333, 37, 17};
    static const int32_t dims[] = {64, 128, 256};
    static const int32_t bsz[] = {16, 3, 64, 1};
    const int n = getenv("KVA_TEST_QUICK") ? 2 : 12;
    for (int i = 0; i < n; i++) {
        cfg c;
        memset(&c, 0, sizeof c);
        c.seed = 300 + (uint64_t)i;
        c.D = c.Dv = dims[i % 3];
        c.dt = (i / 3) % 2 ? KVA_DTYPE_F16 : KVA_DTYPE_BF16;
        c.H = c.D == 256 ? 16 : 32;
        c.Hkv = c.D == 256 ? 4 : (i % 4 == 3 ? 32 : 8);
        c.B = bsz[(i / 2) % 4];
        c.layout = i % 2 ? KVA_LAYOUT_HND : KVA_LAYOUT_NHD;
        c.causal = i % 5 != 4;
        c.window = i % 4 == 1 ? 100 : -1;
        c.softcap = i % 6 == 2 ? 5.0f : 0.0f;
        c.alibi = i % 7 == 3;
        c.sinks = i % 3 == 1;
        c.lse = i % 4 != 2;
        c.want_mma = 1;
        kva_test_batch b;
        make_batch(&b, 600 + (uint64_t)i, 8, q, s, c.B);
        run_batch(&c, &b);
        /* Every prefill tile kernel this machine has, forced (the narrow
         * shape exists at D 128 only; at D 256, whose default is the TMA
         * form at B 16 and 64, the cp.async form only: test_cuda_prefill_mma
         * runs every kernel at every head size, and the reference's cost
         * grows with D). */
        static const char *const pk[] = {"prefill_wgmma_tma_sm90", "prefill_wgmma_sm90",
                                         "prefill_wgmma_tma_narrow_sm90", "prefill_mma_sm80"};
        for (int k = 0; k < 4; k++)
            if (kernel_usable(pk[k]) && (k != 2 || c.D == 128) && (k == 1 || c.D != 256)) {
                c.pkernel = pk[k];
                run_batch(&c, &b);
            }
        kva_test_batch_free(&b);
    }
}

/* Chunked local attention (attention_chunk): the blocks before each request's
 * current chunk hold NaN, so a kernel that reads them fails. Batches with
 * chunk boundaries inside prefills, query spans over 3 and more chunks,
 * decodes on a chunk's first key, max seq_len below C, and page 16 with C
 * 8192 past the first chunk; D 64, 128 and 256 (chunks of 16 keys, inside
 * the 64-key tiles of the D 256 wgmma kernel, with a window); every decode
 * and prefill kernel that runs here, f16/bf16/f32, with a window, soft-cap,
 * ALiBi and sinks rotated in. */
static void test_chunk(void)
{
    static const int32_t q[] = {1, 300, 1, 77, 4, 130, 1, 17};
    static const int32_t s[] = {500, 300, 1024, 900, 260, 1333, 37, 17};
    static const int32_t ql[] = {1, 1, 37, 2}, sl[] = {9000, 8193, 8207, 12000};
    static const int32_t chunks[] = {128, 64, 16, 8192};
    static const char *const dk[] = {NULL, "decode_simt", "decode_mma_sm80"};
    static const char *const pk[] = {NULL, "prefill_wgmma_tma_sm90", "prefill_wgmma_sm90",
                                     "prefill_mma_sm80"};
    for (int i = 0; i < 8; i++) {
        cfg c;
        memset(&c, 0, sizeof c);
        c.seed = 900 + (uint64_t)i;
        c.D = c.Dv = i % 2 ? 64 : i == 2 ? 256 : 128;
        c.dt = i % 3 == 2 ? KVA_DTYPE_F16 : KVA_DTYPE_BF16;
        c.H = c.D == 256 ? 8 : 32; /* the reference's cost */
        c.Hkv = c.D == 256 ? 2 : 8;
        c.B = i % 4 == 1 ? 5 : 16;
        c.layout = i % 2 ? KVA_LAYOUT_HND : KVA_LAYOUT_NHD;
        c.causal = 1;
        c.chunk = chunks[i % 4];
        c.window = i == 2 ? 40 : -1;
        c.softcap = i == 5 ? 5.0f : 0.0f;
        c.alibi = i == 6;
        c.sinks = i % 3 == 1;
        c.lse = 1;
        kva_test_batch b;
        if (c.chunk == 8192)
            make_batch(&b, 950 + (uint64_t)i, 4, ql, sl, c.B);
        else
            make_batch(&b, 950 + (uint64_t)i, 8, q, s, c.B);
        for (int d = 0; d < 3; d++)
            for (int k = 0; k < 4; k++) {
                if ((d > 0 && k > 0) || (dk[d] && !kernel_usable(dk[d])) ||
                    (pk[k] && !kernel_usable(pk[k])))
                    continue;
                c.dkernel = dk[d];
                c.pkernel = pk[k];
                CHECK_MSG(run_batch(&c, &b), "chunk case %d, kernels %s / %s", i,
                          dk[d] ? dk[d] : "default", pk[k] ? pk[k] : "default");
            }
        /* f32 runs on the CUDA-core kernels only. */
        c.dt = KVA_DTYPE_F32;
        c.dkernel = c.pkernel = NULL;
        CHECK_MSG(run_batch(&c, &b), "chunk case %d, f32", i);
        kva_test_batch_free(&b);
    }
    printf("test_chunk: 8 batches done\n"); /* progress: the grid after it is long */
    fflush(stdout);
}

/* Sharded (DCP) plans: a local chunk is accepted (its start is taken on
 * global positions; test_cuda_dcp checks the results), a sharded MLA plan
 * gets KVA_STATUS_UNSUPPORTED with a message naming the case and no plan. */
static void test_dcp_plans(void)
{
    static const int32_t q[] = {1}, s[] = {100};
    kva_test_batch b;
    make_batch(&b, 3, 1, q, s, 16);
    kva_context_desc gd = {KVA_BACKEND_CUDA, 0, 0};
    kva_context *gpu = NULL;
    CHECK_OK(kva_context_create(&gd, &gpu));
    kva_plan_desc pd = kva_test_batch_plan_desc(&b, 8, 2, 128, 128, KVA_DTYPE_BF16);
    pd.attention_chunk = 32;
    pd.dcp_size = 2;
    pd.dcp_rank = 1;
    kva_plan *p = NULL;
    CHECK_OK(kva_plan_create(gpu, &pd, &p));
    CHECK(p != NULL);
    kva_plan_destroy(p);
    p = NULL;
    pd = kva_test_batch_plan_desc(&b, 8, 1, 576, 512, KVA_DTYPE_BF16);
    pd.kind = KVA_ATTN_MLA;
    pd.scale = 0.0625f;
    pd.dcp_size = 2;
    CHECK_STATUS(kva_plan_create(gpu, &pd, &p), KVA_STATUS_UNSUPPORTED);
    CHECK_ERROR_MENTIONS("MLA");
    CHECK(p == NULL);
    printf("test_dcp_plans: done\n");
    fflush(stdout);
    kva_context_destroy(gpu);
    kva_test_batch_free(&b);
}

/* A plan with a block table sends its prefills to the paged tensor-core
 * kernel, so kva_attention_run_ragged refuses it (status, message, out
 * untouched) instead of skipping those rows. */
static void test_ragged_refuses_paged_prefill(void)
{
    static const int32_t q[] = {1, 100}, s[] = {50, 100};
    kva_test_batch b;
    make_batch(&b, 5, 2, q, s, 16);
    kva_context_desc gd = {KVA_BACKEND_CUDA, 0, 0};
    kva_context *gpu = NULL;
    CHECK_OK(kva_context_create(&gd, &gpu));
    kva_plan_desc pd = kva_test_batch_plan_desc(&b, 8, 2, 64, 64, KVA_DTYPE_BF16);
    kva_plan *p = NULL;
    CHECK_OK(kva_plan_create(gpu, &pd, &p));
    const size_t nkv = (size_t)150 * 2 * 64 * 2, nq = (size_t)b.T * 8 * 64 * 2;
    void *dk = dev_poisoned(nkv), *dv = dev_poisoned(nkv), *dq = dev_poisoned(nq);
    void *dout = dev_poisoned(nq);
    CHECK_STATUS(kva_attention_run_ragged(gpu, p, dq, dk, dv, NULL, dout, NULL),
                 KVA_STATUS_INVALID_ARGUMENT);
    CHECK_ERROR_MENTIONS("block_table");
    CHECK(dev_untouched(dout));
    kva_plan_destroy(p);
    cudaFree(dk);
    cudaFree(dv);
    cudaFree(dq);
    cudaFree(dout);
    kva_context_destroy(gpu);
    kva_test_batch_free(&b);
}

/* Non-causal rows that see no key (seq_len 0): out 0 and lse -inf, or the sink. */
static void test_empty_rows(void)
{
    static const int32_t q[] = {2, 4, 0, 7, 1}, s[] = {400, 0, 0, 50, 0};
    for (int sk = 0; sk < 2; sk++) {
        kva_test_batch b;
        make_batch(&b, 91, 5, q, s, 16);
        cfg c;
        memset(&c, 0, sizeof c);
        c.seed = 9;
        c.H = 8;
        c.Hkv = 2;
        c.D = c.Dv = 64;
        c.B = 16;
        c.dt = KVA_DTYPE_BF16;
        c.window = -1;
        c.sinks = sk;
        c.lse = 1;
        run_batch(&c, &b);
        kva_test_batch_free(&b);
    }
}

/* The most recent plan of a CUDA context owns its device metadata: running an
 * older plan fails with a status and leaves out untouched. */
static void test_stale_plan(void)
{
    static const int32_t q[] = {1, 1}, s[] = {100, 60};
    kva_test_batch b;
    make_batch(&b, 3, 2, q, s, 16);
    kva_context_desc gd = {KVA_BACKEND_CUDA, 0, 0};
    kva_context *gpu = NULL;
    CHECK_OK(kva_context_create(&gd, &gpu));
    kva_cache_desc cd = {b.num_blocks,   16,          2, 64, 64, KVA_DTYPE_F16, KVA_LAYOUT_NHD,
                         KVA_QUANT_NONE, KVA_ATTN_MHA};
    kva_cache *dc = NULL;
    CHECK_OK(kva_cache_create(gpu, &cd, &dc));
    kva_plan_desc pd = kva_test_batch_plan_desc(&b, 4, 2, 64, 64, KVA_DTYPE_F16);
    kva_plan *p1 = NULL, *p2 = NULL;
    CHECK_OK(kva_plan_create(gpu, &pd, &p1));
    CHECK_OK(kva_plan_create(gpu, &pd, &p2));
    void *dq = dev_poisoned((size_t)b.T * 4 * 64 * 2);
    void *dout = dev_poisoned((size_t)b.T * 4 * 64 * 2);
    CHECK_STATUS(kva_attention_run(gpu, p1, dq, dc, NULL, dout, NULL), KVA_STATUS_INVALID_ARGUMENT);
    CHECK_ERROR_MENTIONS("stale");
    unsigned char probe[16];
    to_host(probe, dout, sizeof probe);
    int untouched = 1;
    for (int i = 0; i < 16; i++)
        untouched &= probe[i] == 0xff;
    CHECK(untouched);
    kva_plan_destroy(p1);
    kva_plan_destroy(p2);
    cudaFree(dq);
    cudaFree(dout);
    kva_cache_destroy(dc);
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
    RUN(test_dcp_plans);
    RUN(test_chunk);
    RUN(test_stale_plan);
    RUN(test_empty_rows);
    RUN(test_split_kv);
    RUN(test_many_items);
    RUN(test_decode_mma);
    RUN(test_force_kernel);
    RUN(test_mma_mixed);
    RUN(test_ragged_refuses_paged_prefill);
    RUN(test_grid);
#endif
    return kva_test_finish();
}
