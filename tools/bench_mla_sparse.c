/*
 * bench_mla_sparse.c - `kvattn bench --mla-sparse`: sparse MLA
 * (kva_mla_sparse_run, DeepSeek V3.2 shapes) checked against the reference
 * backend, then timed, on any backend that runs it through the public API.
 *
 * The batch: R decode requests of q_len tokens, plus optionally one prefill
 * request of P tokens, all over `context` cached tokens, every token with
 * its own list of K distinct random positions of its request (what the
 * indexer would pick). Counts:
 *   gathered bytes: every listed row once per token (the cache format's row:
 *     656 bytes for fp8_ds_mla), against the machine's read bandwidth, and
 *     with --paired against a read pass run after every timed run;
 *   FLOPs: 2 * (D + Dc) per (head, listed key), against the FMA peak.
 * The check runs the reference backend on the first decode request (and the
 * first two tokens of the prefill), with FlashMLA's output tolerance.
 * --backend cuda runs bench_mla_sparse_cuda.c instead: without shape
 * options the issue-17 suite (decode and prefill shapes on the device), with
 * them one shape of --batch requests of --q-len tokens (or one prefill of
 * --prefill tokens), seq_len --context, --heads, --topk, --cache ds_mla|bf16,
 * --mode; bf16 q; CUDA-event medians of --iters runs.
 */
#include "bench.h" /* bench_median */
#include "bench_mla_sparse.h"
#include "cli.h"
#include "internal.h"                 /* kva__context_force_kernel */
#include "../bench/data.h"            /* kva_test_sparse_bf16dot_bounds */
#include "../src/attn/cpu/cpu_attn.h" /* kva__cpu_plan_kernel */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct sp_opts {
    int32_t batch, context, q_len, prefill, heads, topk, Dc, Dr, B, threads, iters, warmup;
    kva_dtype dt;
    int cache, mode, backend, no_check, no_ceiling, paired;
    int shape_set; /* a shape option was given (--backend cuda: one shape, not the suite) */
    const char *variant;
} sp_opts;

static const char *const caches[] = {"ds_mla", "fp8", "bf16", "f16", "f32"};

static void usage(void)
{
    printf("usage: kvattn bench --mla-sparse [options]\n"
           "\n"
           "Times sparse MLA (kva_mla_sparse_run: each query token attends the K keys of its\n"
           "own index list) after checking it against the reference backend.\n"
           "  --batch R            decode requests [32]\n"
           "  --q-len n            tokens per decode request [1]\n"
           "  --prefill P          tokens of one prefill request, 0 for none [0]\n"
           "  --context N          cached tokens per request [8192]\n"
           "  --topk K             listed keys per token [2048]\n"
           "  --heads H            query heads [16]\n"
           "  --kv-lora-rank Dc, --rope-dim Dr  [512, 64]\n"
           "  --cache ds_mla|fp8|bf16|f16|f32  latent cache format [ds_mla]\n"
           "  --dtype f32|f16|bf16 q and output dtype [bf16]\n"
           "  --mode mixed|separate  kva_sparse_mode [mixed]\n"
           "  --block-size B       [64]\n"
           "  --backend ref|cpu|cuda  [cpu]; cuda without shape options runs the issue-17\n"
           "                       suite (decode B 128 / prefill 4k, H 128 / 16 / 64, fp8_ds_mla\n"
           "                       and bf16 caches, both modes); with them, one shape of\n"
           "                       --batch x --q-len tokens or one --prefill (bf16 q, cache\n"
           "                       ds_mla or bf16, or f16 q over ds_mla; --context is the\n"
           "                       seq_len)\n"
           "  --threads N          0 = all cores [0]\n"
           "  --variant NAME       force a registry kernel (mla_portable, mla_avx2, mla_avx512,\n"
           "                       mla_avx512bf16; cuda, with a shape option:\n"
           "                       mla_decode_mma_sm80, mla_decode_wgmma_sm90)\n"
           "  --paired             a read pass after every timed run: the fraction of the\n"
           "                       read bandwidth the gathered rows reach, run by run\n"
           "  --iters N, --warmup N  [10, 2]\n"
           "  --no-check, --no-ceiling\n");
}

static int parse(int argc, char **argv, sp_opts *o)
{
    memset(o, 0, sizeof *o);
    o->batch = 32;
    o->context = 8192;
    o->q_len = 1;
    o->heads = 16;
    o->topk = 2048;
    o->Dc = 512;
    o->Dr = 64;
    o->B = 64;
    o->iters = 10;
    o->warmup = 2;
    o->dt = KVA_DTYPE_BF16;
    o->backend = 1;
    static const char *const dts[] = {"f32", "f16", "bf16"};
    static const char *const modes[] = {"mixed", "separate"};
    static const char *const backends[] = {"ref", "cpu", "cuda"};
    static const char *const value_flags[] = {
        "--dtype",    "--cache",      "--mode",    "--backend", "--variant", "--batch",
        "--context",  "--q-len",      "--prefill", "--heads",   "--topk",    "--kv-lora-rank",
        "--rope-dim", "--block-size", "--threads", "--iters",   "--warmup"};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--mla-sparse"))
            continue;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage();
            return KVA_EXIT_OK;
        }
        if (!strcmp(a, "--no-check") || !strcmp(a, "--no-ceiling") || !strcmp(a, "--paired")) {
            *(!strcmp(a, "--no-check")     ? &o->no_check
              : !strcmp(a, "--no-ceiling") ? &o->no_ceiling
                                           : &o->paired) = 1;
            continue;
        }
        char name[40]; /* "--flag v" or "--flag=v" */
        const char *v = kva_cli_flag_split(argc, argv, &i, name, sizeof name, "bench --mla-sparse",
                                           value_flags, sizeof value_flags / sizeof value_flags[0]);
        if (!v)
            return KVA_EXIT_USAGE;
        a = name;
        int ok = 1, c = 0;
        static const char *const shape_opts[] = {"--batch",   "--q-len", "--prefill",
                                                 "--context", "--topk",  "--heads",
                                                 "--cache",   "--mode",  "--dtype"};
        for (int k = 0; k < 9; k++)
            o->shape_set |= !strcmp(a, shape_opts[k]);
        if (!strcmp(a, "--dtype")) {
            ok = kva_cli_parse_choice(a, v, dts, 3, &c);
            o->dt = c == 0 ? KVA_DTYPE_F32 : c == 1 ? KVA_DTYPE_F16 : KVA_DTYPE_BF16;
        } else if (!strcmp(a, "--cache"))
            ok = kva_cli_parse_choice(a, v, caches, 5, &o->cache);
        else if (!strcmp(a, "--mode"))
            ok = kva_cli_parse_choice(a, v, modes, 2, &o->mode);
        else if (!strcmp(a, "--backend"))
            ok = kva_cli_parse_choice(a, v, backends, 3, &o->backend);
        else if (!strcmp(a, "--variant"))
            o->variant = v;
        else {
            static const char *const flags[] = {
                "--batch",        "--context",  "--q-len",      "--prefill", "--heads", "--topk",
                "--kv-lora-rank", "--rope-dim", "--block-size", "--threads", "--iters", "--warmup"};
            int32_t *dst[] = {&o->batch, &o->context, &o->q_len, &o->prefill,
                              &o->heads, &o->topk,    &o->Dc,    &o->Dr,
                              &o->B,     &o->threads, &o->iters, &o->warmup};
            int k = 0;
            while (k < 12 && strcmp(a, flags[k]))
                k++;
            if (k == 12) {
                fprintf(stderr, "kvattn: bench --mla-sparse: unknown option '%s'\n", a);
                return KVA_EXIT_USAGE;
            }
            const int zero_ok = k == 0 || k == 3 || k >= 9;
            ok = kva_cli_parse_i32(a, v, zero_ok ? 0 : 1, 1 << 24, dst[k]);
        }
        if (!ok)
            return KVA_EXIT_USAGE;
    }
    o->iters = o->iters < 1 ? 1 : o->iters;
    /* Limits of the library (kvattn.h) checked here: a usage error (exit 2),
     * not a failing library call (exit 1). */
    if (o->heads > KVA_MAX_HEADS || o->topk > KVA_MAX_TOPK || o->threads > KVA_MAX_THREADS ||
        o->Dc % 8 || o->Dr % 8 || (int64_t)o->Dc + o->Dr > KVA_MAX_HEAD_DIM) {
        fprintf(stderr,
                "kvattn: bench --mla-sparse: --heads %d (at most %d), --topk %d (at most %d), "
                "--threads %d (at most %d), --kv-lora-rank %d + --rope-dim %d (multiples of 8, "
                "at most %d)\n",
                (int)o->heads, KVA_MAX_HEADS, (int)o->topk, KVA_MAX_TOPK, (int)o->threads,
                KVA_MAX_THREADS, (int)o->Dc, (int)o->Dr, KVA_MAX_HEAD_DIM);
        return KVA_EXIT_USAGE;
    }
    if (o->batch + (o->prefill > 0) == 0 || o->q_len > o->context || o->prefill > o->context) {
        fprintf(stderr, "kvattn: bench --mla-sparse: need requests, and q_len and prefill <= "
                        "context\n");
        return KVA_EXIT_USAGE;
    }
    if (o->backend == 2 && o->shape_set &&
        ((o->batch > 0 && o->prefill > 0) || o->dt == KVA_DTYPE_F32 ||
         (o->dt == KVA_DTYPE_F16 && o->cache != 0) || (o->cache != 0 && o->cache != 2) ||
         o->Dc != 512 || o->Dr != 64 || o->B != 64)) {
        fprintf(stderr, "kvattn: bench --mla-sparse: --backend cuda times either --batch R "
                        "decodes or one --prefill P (--batch 0), bf16 q (or f16 q over ds_mla), "
                        "--cache ds_mla or bf16, "
                        "Dc 512, Dr 64, block size 64\n");
        return KVA_EXIT_USAGE;
    }
    if (o->backend == 2 && !o->shape_set && o->variant) {
        fprintf(stderr, "kvattn: bench --mla-sparse: --variant with --backend cuda needs a shape "
                        "option (--batch, --heads, ...: it forces the one shape's kernel; the "
                        "suite forces its own)\n");
        return KVA_EXIT_USAGE;
    }
    return -1;
}

/* The batch, its cache and its inputs, built on a host context. */
typedef struct sp_batch {
    int32_t R, T, stride, nb;
    int32_t *qsl, *sl, *bt, *idx;
    kva_cache *cache;
    void *q;
    size_t row_bytes; /* bytes of one gathered row */
} sp_batch;

static uint64_t rnd(uint64_t *s)
{
    *s += 0x9e3779b97f4a7c15ull;
    uint64_t z = *s;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void fill(void *p, kva_dtype dt, size_t n, uint64_t *s)
{
    for (size_t i = 0; i < n; i++)
        kva__store_f(p, dt, i, (float)((double)(rnd(s) >> 11) * 0x1p-53 * 3.4 - 1.7));
}

static kva_status make_batch(kva_context *ctx, const sp_opts *o, sp_batch *b)
{
    memset(b, 0, sizeof *b);
    b->R = o->batch + (o->prefill > 0);
    b->qsl = calloc((size_t)b->R + 1, sizeof(int32_t));
    b->sl = calloc((size_t)b->R, sizeof(int32_t));
    b->stride = (o->context + o->B - 1) / o->B;
    b->nb = b->R * b->stride + 1;
    b->bt = calloc((size_t)b->R * b->stride, sizeof(int32_t));
    for (int32_t r = 0; r < b->R; r++) {
        b->sl[r] = o->context;
        b->qsl[r + 1] = b->qsl[r] + (r < o->batch ? o->q_len : o->prefill);
        for (int32_t j = 0; j < b->stride; j++) /* scattered blocks: request-major stride */
            b->bt[(size_t)r * b->stride + j] = 1 + j * b->R + r;
    }
    b->T = b->qsl[b->R];
    const int q8 = o->cache <= 1;
    kva_cache_desc kd = {.num_blocks = b->nb,
                         .block_size = o->B,
                         .num_kv_heads = 1,
                         .head_dim = o->Dc + o->Dr,
                         .head_dim_v = o->Dc,
                         .dtype = q8              ? KVA_DTYPE_FP8_E4M3
                                  : o->cache == 2 ? KVA_DTYPE_BF16
                                  : o->cache == 3 ? KVA_DTYPE_F16
                                                  : KVA_DTYPE_F32,
                         .quant = o->cache == 0   ? KVA_QUANT_FP8_DS_MLA
                                  : o->cache == 1 ? KVA_QUANT_FP8_E4M3
                                                  : KVA_QUANT_NONE,
                         .kind = KVA_ATTN_MLA};
    const float fp8_scale = 1.0f / 128;
    kva_quant_params qp = {.k_scale = &fp8_scale, .k_scale_len = 1};
    KVA_TRY(kva_cache_create_quant(ctx, &kd, o->cache == 1 ? &qp : NULL, &b->cache));
    b->row_bytes = kva_cache_block_bytes_k(b->cache) / (size_t)o->B;
    uint64_t seed = 42;
    const int32_t chunk = 4096, D = o->Dc + o->Dr;
    float *ckv = malloc((size_t)chunk * o->Dc * 4), *kpe = malloc((size_t)chunk * o->Dr * 4);
    int64_t *slots = malloc((size_t)chunk * 8);
    kva_status st = KVA_STATUS_OK;
    for (int32_t r = 0; r < b->R && st == KVA_STATUS_OK; r++)
        for (int32_t j0 = 0; j0 < o->context && st == KVA_STATUS_OK; j0 += chunk) {
            const int32_t n = o->context - j0 < chunk ? o->context - j0 : chunk;
            fill(ckv, KVA_DTYPE_F32, (size_t)n * o->Dc, &seed);
            fill(kpe, KVA_DTYPE_F32, (size_t)n * o->Dr, &seed);
            for (int32_t t = 0; t < n; t++)
                slots[t] = (int64_t)b->bt[(size_t)r * b->stride + (j0 + t) / o->B] * o->B +
                           (j0 + t) % o->B;
            st = kva_cache_write(ctx, b->cache, n, ckv, 0, kpe, 0, KVA_DTYPE_F32, slots);
        }
    free(ckv);
    free(kpe);
    free(slots);
    KVA_TRY(st);
    b->q = malloc((size_t)b->T * o->heads * D * kva_dtype_size(o->dt));
    fill(b->q, o->dt, (size_t)b->T * o->heads * D, &seed);
    /* K distinct positions per token: a partial shuffle of one permutation
     * of 0 .. context - 1 that carries over from token to token. */
    const int32_t K = o->topk < o->context ? o->topk : o->context;
    int32_t *perm = malloc((size_t)o->context * sizeof(int32_t));
    for (int32_t i = 0; i < o->context; i++)
        perm[i] = i;
    b->idx = malloc((size_t)b->T * o->topk * sizeof(int32_t));
    for (int32_t t = 0; t < b->T; t++) {
        int32_t *row = b->idx + (size_t)t * o->topk;
        for (int32_t e = 0; e < o->topk; e++) {
            if (e >= K) {
                row[e] = -1;
                continue;
            }
            const int32_t j = e + (int32_t)(rnd(&seed) % (uint64_t)(o->context - e));
            const int32_t x = perm[j];
            perm[j] = perm[e];
            perm[e] = x;
            row[e] = x;
        }
    }
    free(perm);
    return KVA_STATUS_OK;
}

static kva_plan_desc plan_desc(const sp_opts *o, const sp_batch *b, int32_t R)
{
    kva_plan_desc d = {.num_requests = R,
                       .query_start_loc = b->qsl,
                       .seq_lens = b->sl,
                       .block_table = b->bt,
                       .block_table_stride = b->stride,
                       .block_size = o->B,
                       .decode_threshold = o->q_len > 4 ? o->q_len : 4,
                       .num_heads = o->heads,
                       .num_kv_heads = 1,
                       .head_dim = o->Dc + o->Dr,
                       .head_dim_v = o->Dc,
                       .q_dtype = o->dt,
                       .scale = (float)(1.0 / sqrt(128.0 + o->Dr)),
                       .window_left = -1,
                       .kind = KVA_ATTN_MLA,
                       .sparse_topk = o->topk,
                       .sparse_mode = o->mode};
    return d;
}

/* The reference backend on request 0 (and the first two prefill tokens, as
 * a one-request plan over the prefill's rows): the worst element error
 * beyond FlashMLA's tolerance (abs 1e-3 or rel 2/128), 0 when within. The
 * separate mode's prefill reads bf16 rows: its tokens get abs 0.05 (what
 * test_mla_sparse allows between the modes). bf16dot: the run took bf16
 * queries by bf16 dot products (mla_avx512bf16), rounding P (and
 * fp8_ds_mla's dequantized values) to bf16: the output bound of
 * test_mla_sparse for rows it reads as bf16 (bf16 and fp8_ds_mla caches;
 * the separate mode's prefill has 0.05 anyway). */
static double check(const sp_opts *o, sp_batch *b, const void *out, int bf16dot)
{
    double dot_atol = 1e-3, lse_atol, cos_max;
    kva_test_sparse_bf16dot_bounds(o->Dc, o->Dr, o->cache == 0, &dot_atol, &lse_atol, &cos_max);
    kva_context *ref = NULL;
    kva_context_desc rd = {KVA_BACKEND_REF, 1, 0};
    if (kva_context_create(&rd, &ref) != KVA_STATUS_OK)
        return INFINITY;
    const size_t es = kva_dtype_size(o->dt), H = (size_t)o->heads, Dc = (size_t)o->Dc;
    double worst = 0.0;
    for (int part = 0; part < 1 + (o->prefill > 0); part++) {
        const int32_t r = part == 0 ? 0 : b->R - 1;
        if (part == 0 && o->batch == 0)
            continue;
        const int32_t t0 = b->qsl[r], n = part == 0 ? o->q_len : (o->prefill < 2 ? o->prefill : 2);
        int32_t qsl[2] = {0, n};
        kva_plan_desc d = plan_desc(o, b, 1);
        d.query_start_loc = qsl;
        d.seq_lens = b->sl + r;
        d.block_table = b->bt + (size_t)r * b->stride;
        d.sparse_mode = KVA_SPARSE_MIXED;
        const size_t D = Dc + (size_t)o->Dr, rows = (size_t)n * H;
        void *want = malloc(rows * Dc * es);
        kva_plan *plan = NULL;
        if (kva_plan_create(ref, &d, &plan) != KVA_STATUS_OK ||
            kva_mla_sparse_run(ref, plan, (const char *)b->q + (size_t)t0 * H * D * es, b->cache,
                               b->idx + (size_t)t0 * o->topk, 0, NULL, NULL, want,
                               NULL) != KVA_STATUS_OK)
            worst = INFINITY;
        for (size_t i = 0; i < rows * Dc && worst < INFINITY; i++) {
            const double w = kva__load_f(want, o->dt, i);
            const double g = kva__load_f(out, o->dt, (size_t)t0 * H * Dc + i);
            const double e = fabs(g - w);
            const int dot_rows = o->dt == KVA_DTYPE_BF16 && (o->cache == 0 || o->cache == 2);
            const double atol = part == 1 && o->mode == KVA_SPARSE_SEPARATE ? 0.05
                                : bf16dot && dot_rows                       ? dot_atol
                                                                            : 1e-3;
            if (!(e <= atol || e <= 2.0 / 128.0 * fabs(w)))
                worst = e > worst ? e : worst;
        }
        kva_plan_destroy(plan);
        free(want);
    }
    kva_context_destroy(ref);
    return worst;
}

int kva_cli_bench_mla_sparse(int argc, char **argv)
{
    sp_opts o;
    int rc = parse(argc, argv, &o);
    if (rc >= 0)
        return rc;
    if (o.backend == 2) {
        const bench_sp_shape one = {"one",
                                    o.batch > 0 ? o.batch : 1,
                                    o.batch > 0 ? o.q_len : o.prefill,
                                    o.context,
                                    o.heads,
                                    o.topk,
                                    o.cache == 0,
                                    o.mode == 1,
                                    o.variant,
                                    o.dt == KVA_DTYPE_F16};
        return bench_mla_sparse_cuda(o.shape_set ? &one : NULL, o.iters);
    }
    kva_context *ctx = NULL;
    kva_context_desc cd = {o.backend == 0 ? KVA_BACKEND_REF : KVA_BACKEND_CPU, o.threads, 0};
    kva_status st = kva_context_create(&cd, &ctx);
    if (st != KVA_STATUS_OK)
        return kva_cli_lib_error("kva_context_create", st);
    if (o.variant && (st = kva__context_force_kernel(ctx, o.variant)) != KVA_STATUS_OK)
        return kva_cli_lib_error("--variant", st);
    sp_batch b;
    if ((st = make_batch(ctx, &o, &b)) != KVA_STATUS_OK)
        return kva_cli_lib_error("building the batch", st);
    const size_t es = kva_dtype_size(o.dt), H = (size_t)o.heads, rows = (size_t)b.T * H;
    void *out = malloc(rows * (size_t)o.Dc * es);
    float *lse = malloc(rows * sizeof(float));
    kva_plan_desc pd = plan_desc(&o, &b, b.R);
    kva_plan *plan = NULL;
    if ((st = kva_plan_create(ctx, &pd, &plan)) != KVA_STATUS_OK)
        return kva_cli_lib_error("kva_plan_create", st);
    const int nt = kva_context_num_threads(ctx);
    kva_cli_reader rd = {0};
    if (o.paired && kva_cli_reader_open(&rd, nt) != 0) {
        fprintf(stderr, "kvattn: out of memory\n");
        return KVA_EXIT_LIBRARY;
    }
    double *tm = malloc((size_t)o.iters * sizeof(double)), *pbw = calloc((size_t)o.iters, 8);
    for (int k = -o.warmup - 1; k < o.iters; k++) {
        const double t0 = kva_cli_now();
        st = kva_mla_sparse_run(ctx, plan, b.q, b.cache, b.idx, 0, NULL, NULL, out, lse);
        const double dt = kva_cli_now() - t0;
        if (st != KVA_STATUS_OK)
            return kva_cli_lib_error("kva_mla_sparse_run", st);
        if (k >= 0) {
            tm[k] = dt;
            if (o.paired)
                pbw[k] = kva_cli_reader_pass(&rd);
        }
    }
    /* Work: every listed key (K distinct per token, or all keys when K
     * exceeds the context) once per token. */
    const double keys = (double)b.T * (o.topk < o.context ? o.topk : o.context);
    const double bytes = keys * (double)b.row_bytes;
    const double flops = 2.0 * keys * (double)H * (double)(2 * o.Dc + o.Dr);
    double *frac = malloc((size_t)o.iters * sizeof(double));
    for (int k = 0; k < o.iters; k++)
        frac[k] = pbw[k] > 0 ? bytes / 1e9 / (tm[k] * pbw[k]) : 0;
    const double med = bench_median(tm, o.iters), best = tm[0];
    const double pfrac = bench_median(frac, o.iters), pb = bench_median(pbw, o.iters);
    printf("kvattn bench --mla-sparse: R %d x q_len %d%s, context %d, topk %d, H %d, Dc %d Dr "
           "%d, %s cache (%zu bytes/row), q %s, %s, backend %s, %d threads\n",
           (int)o.batch, (int)o.q_len, o.prefill ? " + 1 prefill" : "", (int)o.context, (int)o.topk,
           (int)o.heads, (int)o.Dc, (int)o.Dr, caches[o.cache], b.row_bytes, kva_dtype_name(o.dt),
           o.mode ? "separate" : "mixed", o.backend ? "cpu" : "ref", nt);
    if (o.prefill)
        printf("  prefill: %d tokens\n", (int)o.prefill);
    if (o.backend == 1)
        printf("  kernel %s\n", kva__cpu_plan_kernel(plan, KVA__KERNEL_MLA));
    printf("  time median %.3f ms, min %.3f ms (%d iters)\n", med * 1e3, best * 1e3, o.iters);
    printf("  gathered %.1f MB -> %.2f GB/s; %.2f GFLOP -> %.4f TFLOP/s\n", bytes / 1e6,
           bytes / med / 1e9, flops / 1e9, flops / med / 1e12);
    if (o.paired)
        printf("  paired read: %.1f%% of the read bandwidth (median over %d runs; read passes "
               "%.2f GB/s)\n",
               100.0 * pfrac, o.iters, pb);
    if (!o.no_ceiling) {
        const double bw = kva_cli_measure_read_bw(nt);
        const char *isa = NULL;
        const double peak = kva_cli_measure_fma_peak(nt, &isa);
        printf("  ceilings: read %.2f GB/s (%.0f%% of it), FMA peak %.1f GFLOP/s %s (%.0f%%)\n", bw,
               100.0 * bytes / med / 1e9 / bw, peak, isa ? isa : "",
               100.0 * flops / med / 1e9 / peak);
    }
    rc = KVA_EXIT_OK;
    if (!o.no_check) {
        const char *kn = o.backend == 1 ? kva__cpu_plan_kernel(plan, KVA__KERNEL_MLA) : NULL;
        const double e = check(&o, &b, out, kn && !strcmp(kn, "mla_avx512bf16"));
        printf("  check vs ref (request 0%s): %s\n", o.prefill ? ", 2 prefill tokens" : "",
               e == 0 ? "ok" : "FAILED");
        rc = e == 0 ? KVA_EXIT_OK : KVA_EXIT_LIBRARY;
    }
    if (o.paired)
        kva_cli_reader_close(&rd);
    kva_plan_destroy(plan);
    kva_cache_destroy(b.cache);
    kva_context_destroy(ctx);
    free(out);
    free(lse);
    free(tm);
    free(pbw);
    free(frac);
    free(b.q);
    free(b.idx);
    free(b.qsl);
    free(b.sl);
    free(b.bt);
    return rc;
}
