/*
 * bench_indexer.c - `kvattn bench --indexer`: DeepSeek V3.2's lightning
 * indexer (kva_indexer_run) over R requests of --q-len new tokens after
 * --context cached tokens, every token picking its top --topk keys.
 *
 * Reports the median time, keys scored per second (sum over tokens of
 * pos + 1) and the logit TFLOP/s (2 Hi D per key). Before timing, a few
 * tokens (each request's first and last) are checked against the
 * reference backend: their top-K sets must agree except for keys the two
 * rank differently by float rounding (near-ties), counted and printed.
 * On CUDA (bench_indexer_cuda.c) it also times the two kernels apart and
 * the baseline of the target: a kernel that reads the index keys
 * (codes and scales) once per query block (one logits tile: up to 4 tokens
 * of a request x 2048 keys) and does nothing else; the bytes it reads are
 * printed with the ratio.
 */
#include "bench_indexer.h"
#include "cli.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(void)
{
    printf("usage: kvattn bench --indexer [options]\n"
           "  --backend cpu|cuda   backend to time                     [cpu]\n"
           "  --batch R            requests                            [1]\n"
           "  --context N          cached tokens before the new ones   [cpu 4096; cuda 28672]\n"
           "  --q-len n            new tokens per request              [cpu 16; cuda 4096]\n"
           "  --heads Hi           index heads                         [64]\n"
           "  --head-dim D         index head size, multiple of 8, <= 576 [128]\n"
           "  --topk K             keys per token                      [2048]\n"
           "  --block-size B       tokens per cache block              [64]\n"
           "  --dtype f16|bf16     q dtype (and the cache's if unquantized) [bf16]\n"
           "  --kv-quant fp8|none  FP8_TOKEN or unquantized keys       [fp8]\n"
           "  --q-quant fp8|none   q quantized per token and head to e4m3 (index_q_quant)\n"
           "                       or used as given                    [none]\n"
           "  --threads N          CPU threads, 0 = all                [0]\n"
           "  --iters N --warmup N timed and untimed runs              [5, 1]\n"
           "  --no-check           skip the check against the reference backend\n"
           "  --mma-sync           cuda: force the mma.sync logits kernel\n"
           "  --topk-full          cuda: every top-K radix pass reads the whole row\n"
           "  --no-ws              cuda: FP8-q on the sm_90a wgmma kernel, not the\n"
           "                       warp-specialized one\n");
}

static int parse(int argc, char **argv, bench_index_opts *o)
{
    memset(o, 0, sizeof *o);
    o->batch = 1;
    o->context = -1;
    o->q_len = -1;
    o->heads = 64;
    o->head_dim = 128;
    o->topk = 2048;
    o->B = 64;
    o->dt = KVA_DTYPE_BF16;
    o->fp8 = 1;
    o->iters = 5;
    o->warmup = 1;
    static const char *const backends[] = {"cpu", "cuda"};
    static const char *const dts[] = {"f16", "bf16"};
    static const char *const quants[] = {"none", "fp8"};
    static const char *const value_flags[] = {
        "--backend",    "--dtype",   "--kv-quant", "--q-quant",  "--batch",
        "--context",    "--q-len",   "--heads",    "--head-dim", "--topk",
        "--block-size", "--threads", "--iters",    "--warmup"};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--indexer"))
            continue;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage();
            return KVA_EXIT_OK;
        }
        if (!strcmp(a, "--no-check") || !strcmp(a, "--mma-sync") || !strcmp(a, "--topk-full") ||
            !strcmp(a, "--no-ws")) {
            *(!strcmp(a, "--no-check")    ? &o->no_check
              : !strcmp(a, "--mma-sync")  ? &o->mma_sync
              : !strcmp(a, "--topk-full") ? &o->topk_full
                                          : &o->no_ws) = 1;
            continue;
        }
        char name[40]; /* "--flag v" or "--flag=v" */
        const char *v = kva_cli_flag_split(argc, argv, &i, name, sizeof name, "bench --indexer",
                                           value_flags, sizeof value_flags / sizeof value_flags[0]);
        if (!v)
            return KVA_EXIT_USAGE;
        a = name;
        int ok = 1, c = 0;
        if (!strcmp(a, "--backend"))
            ok = kva_cli_parse_choice(a, v, backends, 2, &o->cuda);
        else if (!strcmp(a, "--dtype")) {
            ok = kva_cli_parse_choice(a, v, dts, 2, &c);
            o->dt = c == 0 ? KVA_DTYPE_F16 : KVA_DTYPE_BF16;
        } else if (!strcmp(a, "--kv-quant"))
            ok = kva_cli_parse_choice(a, v, quants, 2, &o->fp8);
        else if (!strcmp(a, "--q-quant"))
            ok = kva_cli_parse_choice(a, v, quants, 2, &o->qfp8);
        else {
            static const char *const flags[] = {
                "--batch", "--context",    "--q-len",   "--heads", "--head-dim",
                "--topk",  "--block-size", "--threads", "--iters", "--warmup"};
            int32_t *dst[] = {&o->batch, &o->context, &o->q_len,   &o->heads, &o->head_dim,
                              &o->topk,  &o->B,       &o->threads, &o->iters, &o->warmup};
            /* Each flag's range, so that a bad value is a usage error (exit 2)
             * and never reaches the library or the batch arithmetic (a block
             * size of 0 divided by zero). */
            static const int32_t lo[] = {1, 0, 1, 1, 8, 1, 1, 0, 1, 0};
            static const int32_t hi[] = {KVA_MAX_SEQ_LEN, KVA_MAX_SEQ_LEN, KVA_MAX_SEQ_LEN,
                                         KVA_MAX_HEADS,   KVA_MAX_HEAD_DIM, KVA_MAX_TOPK,
                                         65536,           KVA_MAX_THREADS,  KVA_MAX_SEQ_LEN,
                                         KVA_MAX_SEQ_LEN};
            int k = 0;
            while (k < 10 && strcmp(a, flags[k]))
                k++;
            if (k == 10) {
                fprintf(stderr, "kvattn: bench --indexer: unknown option '%s'\n", a);
                return KVA_EXIT_USAGE;
            }
            ok = kva_cli_parse_i32(a, v, lo[k], hi[k], dst[k]);
            if (ok && dst[k] == &o->head_dim && o->head_dim % 8 != 0) {
                fprintf(stderr, "kvattn: --head-dim: %d is not a multiple of 8\n",
                        (int)o->head_dim);
                ok = 0;
            }
        }
        if (!ok)
            return KVA_EXIT_USAGE;
    }
    if (o->context < 0)
        o->context = o->cuda ? 28672 : 4096;
    if (o->q_len < 0)
        o->q_len = o->cuda ? 4096 : 16;
    if (o->batch < 1 || o->q_len < 1 || o->iters < 1 || o->topk < 1) {
        fprintf(stderr,
                "kvattn: bench --indexer: --batch, --q-len, --iters, --topk must be >= 1\n");
        return KVA_EXIT_USAGE;
    }
    return -1;
}

/* Random keys written into a host cache, q, w, the plan arrays. */
static int build(const bench_index_opts *o, bench_index_data *x)
{
    memset(x, 0, sizeof *x);
    const int32_t R = o->batch, s = o->context + o->q_len, B = o->B, D = o->head_dim;
    const int32_t nbr = (s + B - 1) / B;
    x->T = R * o->q_len;
    x->qsl = malloc(((size_t)R + 1) * 4);
    x->seq = malloc((size_t)R * 4);
    x->bt = malloc((size_t)R * nbr * 4);
    int64_t *slots = malloc((size_t)s * 8);
    float *keys = malloc((size_t)s * D * 4);
    const size_t nq = (size_t)x->T * o->heads * D;
    x->q = malloc(nq * 2);
    x->w = malloc((size_t)x->T * o->heads * 4);
    if (!x->qsl || !x->seq || !x->bt || !slots || !keys || !x->q || !x->w) {
        free(slots);
        free(keys);
        return KVA_EXIT_LIBRARY;
    }
    kva_rng rng = {20261126};
    for (int32_t r = 0; r <= R; r++)
        x->qsl[r] = r * o->q_len;
    for (int32_t r = 0; r < R; r++) {
        x->seq[r] = s;
        for (int32_t b = 0; b < nbr; b++)
            x->bt[r * nbr + b] = r * nbr + b;
    }
    x->stride = nbr;
    kva_test_fill_uniform(x->q, o->dt, nq, &rng);
    for (size_t i = 0; i < (size_t)x->T * o->heads; i++)
        x->w[i] = (float)(kva_rng_unit(&rng) * 1.2 - 0.2) / sqrtf((float)o->heads);
    kva_context_desc cd = {.backend = KVA_BACKEND_CPU, .num_threads = o->threads};
    kva_status st = kva_context_create(&cd, &x->host_ctx);
    kva_cache_desc kd = {.num_blocks = R * nbr,
                         .block_size = B,
                         .num_kv_heads = 1,
                         .head_dim = D,
                         .dtype = o->fp8 ? KVA_DTYPE_FP8_E4M3 : o->dt,
                         .quant = o->fp8 ? KVA_QUANT_FP8_TOKEN : KVA_QUANT_NONE,
                         .kind = KVA_ATTN_INDEX};
    if (st == KVA_STATUS_OK)
        st = kva_cache_create(x->host_ctx, &kd, &x->cache);
    for (int32_t r = 0; r < R && st == KVA_STATUS_OK; r++) {
        kva_test_fill_uniform(keys, KVA_DTYPE_F32, (size_t)s * D, &rng);
        for (int32_t j = 0; j < s; j++)
            slots[j] = (int64_t)x->bt[r * nbr + j / B] * B + j % B;
        st = kva_cache_write(x->host_ctx, x->cache, s, keys, 0, NULL, 0, KVA_DTYPE_F32, slots);
    }
    free(slots);
    free(keys);
    if (st != KVA_STATUS_OK)
        return kva_cli_lib_error("indexer bench setup", st);
    kva_plan_desc *p = &x->pd;
    memset(p, 0, sizeof *p);
    p->num_requests = R;
    p->num_heads = o->heads;
    p->num_kv_heads = 1;
    p->head_dim = D;
    p->q_dtype = o->dt;
    p->causal = 1;
    p->window_left = -1;
    p->query_start_loc = x->qsl;
    p->seq_lens = x->seq;
    p->block_table = x->bt;
    p->block_table_stride = nbr;
    p->block_size = B;
    p->kind = KVA_ATTN_INDEX;
    p->sparse_topk = o->topk;
    p->index_q_quant = o->qfp8 ? KVA_QUANT_FP8_TOKEN : KVA_QUANT_NONE;
    x->keys_scored = 0.0;
    for (int32_t r = 0; r < R; r++)
        for (int32_t i = 0; i < o->q_len; i++)
            x->keys_scored += (double)(s - o->q_len + i + 1);
    return KVA_EXIT_OK;
}

static void release(bench_index_data *x)
{
    kva_cache_destroy(x->cache);
    kva_context_destroy(x->host_ctx);
    free(x->qsl);
    free(x->seq);
    free(x->bt);
    free(x->q);
    free(x->w);
}

/* The reference's rows for request r's first and last tokens (each planned
 * as a one-token request over the same block table row). With --q-quant
 * fp8 the reference also runs those tokens with q as given, and the share
 * of that top K the run's rows keep is printed. */
static int check(const bench_index_opts *o, const bench_index_data *x, const int32_t *ind)
{
    kva_context_desc cd = {.backend = KVA_BACKEND_REF};
    kva_context *ref = NULL;
    kva_status st = kva_context_create(&cd, &ref);
    const int32_t K = o->topk, Hi = o->heads, D = o->head_dim;
    int32_t worst = 0, checked = 0;
    double kept = 0.0, listed = 0.0;
    for (int32_t r = 0; r < o->batch && st == KVA_STATUS_OK; r++)
        for (int e = 0; e < 2; e++) {
            const int32_t i = e == 0 ? 0 : o->q_len - 1, t = x->qsl[r] + i;
            int32_t qsl[2] = {0, 1}, sl = x->seq[r] - o->q_len + i + 1;
            kva_plan_desc p = x->pd;
            p.num_requests = 1;
            p.query_start_loc = qsl;
            p.seq_lens = &sl;
            p.block_table = x->bt + (int64_t)r * x->stride;
            kva_plan *plan = NULL, *plan_b = NULL;
            int32_t *want = malloc((size_t)K * 4), *want_b = malloc((size_t)K * 4);
            const void *qt = (const char *)x->q + (size_t)t * Hi * D * 2;
            st = kva_plan_create(ref, &p, &plan);
            if (st == KVA_STATUS_OK)
                st = kva_indexer_run(ref, plan, qt, x->w + (size_t)t * Hi, x->cache, want, 0, NULL);
            p.index_q_quant = KVA_QUANT_NONE;
            if (st == KVA_STATUS_OK && o->qfp8)
                st = kva_plan_create(ref, &p, &plan_b);
            if (st == KVA_STATUS_OK && o->qfp8)
                st = kva_indexer_run(ref, plan_b, qt, x->w + (size_t)t * Hi, x->cache, want_b, 0,
                                     NULL);
            if (st == KVA_STATUS_OK) {
                /* Entries of the device row missing from the reference's set. */
                int32_t missing = 0;
                const int32_t *got = ind + (int64_t)t * K;
                unsigned char *in = calloc((size_t)sl + 1, 1);
                for (int32_t k = 0; k < K; k++)
                    if (want[k] >= 0 && want[k] < sl)
                        in[want[k]] = 1;
                for (int32_t k = 0; k < K; k++)
                    missing += got[k] >= 0 && (got[k] >= sl || !in[got[k]]);
                if (o->qfp8) { /* the bf16-q top K kept by the run's row */
                    memset(in, 0, (size_t)sl + 1);
                    for (int32_t k = 0; k < K; k++)
                        if (want_b[k] >= 0 && want_b[k] < sl)
                            in[want_b[k]] = 1, listed++;
                    for (int32_t k = 0; k < K; k++)
                        kept += got[k] >= 0 && got[k] < sl && in[got[k]];
                }
                free(in);
                worst = missing > worst ? missing : worst;
                checked++;
            }
            kva_plan_destroy(plan);
            kva_plan_destroy(plan_b);
            free(want);
            free(want_b);
        }
    kva_context_destroy(ref);
    if (st != KVA_STATUS_OK)
        return kva_cli_lib_error("indexer reference check", st);
    printf("check: %d tokens against the reference: at most %d of %d listed keys outside the "
           "reference's top-%d (near-ties)\n",
           (int)checked, (int)worst, (int)K, (int)K);
    if (o->qfp8)
        printf("fp8 q: the rows keep %.1f%% of the top-%d the reference picks with q as given "
               "(same tokens; random data)\n",
               listed > 0.0 ? 100.0 * kept / listed : 100.0, (int)K);
    /* fp32 products swap near-ties only; e4m3 products (CUDA, --q-quant fp8)
     * accumulate with fewer bits, so more keys near the K-th trade places. */
    return worst * (o->qfp8 && o->cuda ? 50 : 1000) > K ? KVA_EXIT_LIBRARY : KVA_EXIT_OK;
}

static int cmp_d(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Times the run on the CPU backend. */
static int run_cpu(const bench_index_opts *o, bench_index_data *x, int32_t *ind, double *med)
{
    kva_plan *plan = NULL;
    kva_status st = kva_plan_create(x->host_ctx, &x->pd, &plan);
    double *t = calloc((size_t)o->iters, sizeof *t);
    for (int i = 0; st == KVA_STATUS_OK && i < o->warmup + o->iters; i++) {
        const double t0 = kva_cli_now();
        st = kva_indexer_run(x->host_ctx, plan, x->q, x->w, x->cache, ind, 0, NULL);
        if (i >= o->warmup)
            t[i - o->warmup] = kva_cli_now() - t0;
    }
    kva_plan_destroy(plan);
    if (st != KVA_STATUS_OK) {
        free(t);
        return kva_cli_lib_error("kva_indexer_run (cpu)", st);
    }
    qsort(t, (size_t)o->iters, sizeof *t, cmp_d);
    *med = t[o->iters / 2];
    free(t);
    return KVA_EXIT_OK;
}

int kva_cli_bench_indexer(int argc, char **argv)
{
    bench_index_opts o;
    int rc = parse(argc, argv, &o);
    if (rc >= 0)
        return rc;
    bench_index_data x;
    rc = build(&o, &x);
    int32_t *ind = malloc((size_t)x.T * o.topk * 4 + 4);
    bench_index_times tm;
    memset(&tm, 0, sizeof tm);
    if (rc == KVA_EXIT_OK && ind)
        rc = o.cuda ? bench_indexer_cuda(&o, &x, ind, &tm) : run_cpu(&o, &x, ind, &tm.total);
    const double flops = 2.0 * o.heads * o.head_dim * x.keys_scored;
    if (rc == KVA_EXIT_OK) {
        printf("indexer %s: R %d, q_len %d after %d cached, Hi %d, D %d, K %d, %s keys, %s q%s\n",
               o.cuda ? "cuda" : "cpu", (int)o.batch, (int)o.q_len, (int)o.context, (int)o.heads,
               (int)o.head_dim, (int)o.topk, o.fp8 ? "fp8_token" : "unquantized",
               kva_dtype_name(o.dt), o.qfp8 ? " quantized to e4m3 (--q-quant fp8)" : "");
        printf("time %.3f ms (median of %d), %.3g keys/s, %.1f TFLOP/s of logits\n", tm.total * 1e3,
               (int)o.iters, x.keys_scored / tm.total, flops / tm.total * 1e-12);
        if (o.cuda)
            printf("parts: logits %.3f ms, top-K %.3f ms; baseline: reading the index keys once "
                   "per query block = %.3f GB in %.3f ms (%.0f GB/s); indexer / baseline = "
                   "%.2fx (target <= 2x)\n",
                   tm.logits * 1e3, tm.topk * 1e3, tm.read_bytes * 1e-9, tm.read * 1e3,
                   tm.read_bytes / tm.read * 1e-9, tm.total / tm.read);
        if (!o.no_check)
            rc = check(&o, &x, ind);
    }
    free(ind);
    release(&x);
    return rc;
}
