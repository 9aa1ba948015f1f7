/*
 * cmd_bench.c - `kvattn bench`: check one attention shape against the
 * reference backend, warm up, time it, and report median/min time, GB/s and
 * GFLOP/s (how bytes and FLOPs are counted: docs/cli.md).
 *
 * The step it builds is what an engine runs for one layer: a plan from the
 * batch metadata, the cache written through kva_cache_write (shuffled block
 * tables, as a block pool hands them out), then kva_attention_run (or
 * kva_attention_run_ragged with --ragged, which reads packed K/V, no cache).
 */
#include "bench.h"
#include "cli.h"
#include "internal.h" /* kva__context_force_kernel (--variant) */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Timed iterations chosen from the warm-up time when --iters is not given:
 * about this many seconds in total, within [AUTO_ITERS_MIN, AUTO_ITERS_MAX]. */
#define AUTO_SECONDS 2.0
#define AUTO_ITERS_MIN 3
#define AUTO_ITERS_MAX 200
/* Plan creations timed for the "plan create" row. */
#define PLAN_REPEATS 5

void kva_cli_usage_bench(void)
{
    printf("usage: kvattn bench [options]\n"
           "\n"
           "Checks one attention shape against the reference backend, warms up, then times\n"
           "--iters runs and reports the median and min time, KV bytes read, GB/s, FLOPs and\n"
           "GFLOP/s. Defaults: a serving decode step (16 requests x 4096 cached tokens,\n"
           "H=32, Hkv=8, D=128, bf16, B=16) on the CPU backend with all cores.\n"
           "\n"
           "batch:\n"
           "  --mode decode|prefill|mixed  decode: R requests of --q-len new tokens (1; >1 is\n"
           "                       spec decode) after --context cached tokens; prefill: R\n"
           "                       prompts of --q-len tokens (after --context cached tokens,\n"
           "                       default 0); mixed: R decodes plus one chunked prefill of\n"
           "                       --q-len tokens, all after --context cached tokens [decode]\n"
           "  --batch R            requests (mixed: decodes)     [16; prefill: 2]\n"
           "  --context N          cached tokens per request     [4096; prefill: 0; mixed: 2048]\n"
           "  --q-len n            new tokens per request        [1; prefill: 512; mixed: 128]\n"
           "  --ragged             time kva_attention_run_ragged (packed K/V, no cache)\n"
           "shape:\n"
           "  --heads H            query heads                   [32]\n"
           "  --kv-heads Hkv       kv heads (H multiple of Hkv)  [8]\n"
           "  --head-dim D         head size, multiple of 8, <= 576 (CUDA 256) [128]\n"
           "  --head-dim-v Dv      value head size (0 = D)       [0]\n"
           "  --block-size B       tokens per cache block        [16]\n"
           "  --dtype f32|f16|bf16 q, cache and output dtype     [bf16]\n"
           "  --layout nhd|hnd     cache layout                  [nhd]\n"
           "  --kv-quant none|int8|int8-token|int8-token-v16|fp8\n"
           "                       quantized cache format (docs/quant.md) [none]\n"
           "mask:\n"
           "  --causal 0|1         bottom-right causal mask      [1]\n"
           "  --window N           sliding window (window_left), -1 = none [-1]\n"
           "  --attention-chunk C  local attention: keys of the query's chunk of C only\n"
           "                       (attention_chunk, Llama 4), 0 = none [0]\n"
           "  --tree chain|star|random  each request's --q-len tokens (<= 64) are a\n"
           "                       draft tree (tree verification); --causal 1, no\n"
           "                       --window, --attention-chunk, --alibi, --sweep [none]\n"
           "  --softcap c          logits soft-cap, 0 = none     [0]\n"
           "  --alibi              ALiBi slopes 2^(-8(h+1)/H)\n"
           "  --sinks              per-head sink logits (random, unit variance)\n"
           "run:\n"
           "  --backend ref|cpu|cuda  backend to time (cuda: GPU 0; the cache is written on\n"
           "                       the host, checked there, uploaded; times with CUDA events\n"
           "                       and a device-to-device copy as the ceiling) [cpu]\n"
           "  --threads N          CPU threads (cuda: of the host cache write), 0 = all [0]\n"
           "  --variant NAME[,NAME] cpu: registry kernels forced on the items of their family\n"
           "                       (`kvattn info` lists them, e.g. decode_avx2 or\n"
           "                       prefill_portable); a kernel this build or CPU (or\n"
           "                       KVA_CPU_ISA) cannot run is a usage error [the\n"
           "                       dispatcher's per-item choice]\n"
           "  --parts              mixed mode: also time the decodes alone and the chunked\n"
           "                       prefill alone, and print mixed / (decodes + chunk)\n"
           "  --sweep SET          run a built-in list of shapes instead of one, one table\n"
           "                       row each (progress on stderr): decode | prefill | mixed\n"
           "                       | all; shape flags are ignored, the others apply\n"
           "  --iters N            timed runs, 0 = about %.0f s worth (%d..%d) [0]\n"
           "  --warmup N           untimed runs before timing    [2]\n"
           "  --seed N             random data seed              [1234]\n"
           "  --no-check           skip the check against the reference backend\n"
           "  --no-ceiling         skip measuring the machine's read bandwidth and FMA peak\n"
           "  --paired             cpu: one read pass over the ceiling's buffer after every\n"
           "                       timed run; prints the median over runs of (run's GB/s /\n"
           "                       its pass's GB/s): kernel and ceiling under the same load\n"
           "  --json FILE          also write the result as JSON to FILE\n"
           "  --mla                multi-head latent attention instead (its own options:\n"
           "                       kvattn bench --mla --help)\n"
           "  --mla-sparse         sparse MLA (DeepSeek V3.2) instead (its own options:\n"
           "                       kvattn bench --mla-sparse --help)\n"
           "  --cascade            a shared-prefix decode step, plain vs cascade plan (its\n"
           "                       own options: kvattn bench --cascade --help)\n"
           "  --indexer            DeepSeek V3.2's lightning indexer, top-K keys per token\n"
           "                       (its own options: kvattn bench --indexer --help)\n"
           "\n"
           "Exit status: 0 success, 1 library error or failed check, 2 bad usage.\n",
           AUTO_SECONDS, AUTO_ITERS_MIN, AUTO_ITERS_MAX);
}

/* Parses argv into o; returns -1 on success, else the exit status. */
static int parse_bench(int argc, char **argv, bench_opts *o)
{
    static const char *const modes[] = {"decode", "prefill", "mixed"};
    static const char *const dtypes[] = {"f32", "f16", "bf16"};
    static const kva_dtype dtype_vals[] = {KVA_DTYPE_F32, KVA_DTYPE_F16, KVA_DTYPE_BF16};
    static const char *const layouts[] = {"nhd", "hnd"};
    static const char *const backends[] = {"ref", "cpu", "cuda"};
    static const kva_backend backend_vals[] = {KVA_BACKEND_REF, KVA_BACKEND_CPU, KVA_BACKEND_CUDA};
    static const char *const value_flags[] = {
        "--mode",     "--batch",      "--context",    "--q-len",   "--heads",  "--kv-heads",
        "--head-dim", "--head-dim-v", "--block-size", "--dtype",   "--layout", "--causal",
        "--window",   "--softcap",    "--backend",    "--threads", "--iters",  "--warmup",
        "--seed",     "--json",       "--kv-quant",   "--variant", "--sweep",  "--attention-chunk",
        "--tree"};
    const int32_t BIG = 1 << 24;
    bench_opts_init(o);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int k = 0, ok = 1;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            kva_cli_usage_bench();
            return KVA_EXIT_OK;
        }
        if (strcmp(a, "--no-check") == 0) {
            o->no_check = 1;
            continue;
        }
        if (strcmp(a, "--no-ceiling") == 0) {
            o->no_ceiling = 1;
            continue;
        }
        if (strcmp(a, "--ragged") == 0) {
            o->ragged = 1;
            continue;
        }
        if (strcmp(a, "--alibi") == 0) {
            o->alibi = 1;
            continue;
        }
        if (strcmp(a, "--sinks") == 0) {
            o->sinks = 1;
            continue;
        }
        if (strcmp(a, "--parts") == 0) {
            o->parts = 1;
            continue;
        }
        if (strcmp(a, "--paired") == 0) {
            o->paired = 1;
            continue;
        }
        /* Every other option takes a value: "--flag v" or "--flag=v". */
        const char *f = NULL;
        for (size_t n = 0; n < sizeof value_flags / sizeof value_flags[0]; n++)
            if (kva_cli_flag_is(a, value_flags[n]))
                f = value_flags[n];
        if (!f) {
            fprintf(stderr, "kvattn bench: unknown option '%s' (see kvattn bench --help)\n", a);
            return KVA_EXIT_USAGE;
        }
        const char *val = kva_cli_flag_value(argc, argv, &i, f);
        if (!val)
            return KVA_EXIT_USAGE;
        if (!strcmp(f, "--mode")) {
            ok = kva_cli_parse_choice(f, val, modes, 3, &k);
            o->mode = (bench_mode)k;
        } else if (!strcmp(f, "--batch"))
            ok = kva_cli_parse_i32(f, val, 1, BIG, &o->batch);
        else if (!strcmp(f, "--context"))
            ok = kva_cli_parse_i32(f, val, 0, BIG, &o->context);
        else if (!strcmp(f, "--q-len"))
            ok = kva_cli_parse_i32(f, val, 1, BIG, &o->q_len);
        else if (!strcmp(f, "--heads"))
            ok = kva_cli_parse_i32(f, val, 1, 4096, &o->heads);
        else if (!strcmp(f, "--kv-heads"))
            ok = kva_cli_parse_i32(f, val, 1, 4096, &o->kv_heads);
        else if (!strcmp(f, "--head-dim"))
            ok = kva_cli_parse_i32(f, val, 8, KVA_MAX_HEAD_DIM, &o->head_dim);
        else if (!strcmp(f, "--head-dim-v"))
            ok = kva_cli_parse_i32(f, val, 0, KVA_MAX_HEAD_DIM, &o->head_dim_v);
        else if (!strcmp(f, "--block-size"))
            ok = kva_cli_parse_i32(f, val, 1, 65536, &o->block_size);
        else if (!strcmp(f, "--dtype")) {
            ok = kva_cli_parse_choice(f, val, dtypes, 3, &k);
            o->dtype = dtype_vals[k];
        } else if (!strcmp(f, "--kv-quant")) {
            static const char *const quants[] = {"none", "int8", "int8-token", "int8-token-v16",
                                                 "fp8"};
            ok = kva_cli_parse_choice(f, val, quants, 5, &k);
            o->kv_quant = (kva_quant)k; /* same order as kva_quant */
        } else if (!strcmp(f, "--tree")) {
            static const char *const trees[] = {"chain", "star", "random"};
            ok = kva_cli_parse_choice(f, val, trees, 3, &k);
            o->tree = BENCH_TREE_CHAIN + k;
        } else if (!strcmp(f, "--layout")) {
            ok = kva_cli_parse_choice(f, val, layouts, 2, &k);
            o->layout = k == 0 ? KVA_LAYOUT_NHD : KVA_LAYOUT_HND;
        } else if (!strcmp(f, "--causal"))
            ok = kva_cli_parse_i32(f, val, 0, 1, &o->causal);
        else if (!strcmp(f, "--window"))
            ok = kva_cli_parse_i32(f, val, -1, BIG, &o->window);
        else if (!strcmp(f, "--attention-chunk"))
            ok = kva_cli_parse_i32(f, val, 0, BIG, &o->chunk);
        else if (!strcmp(f, "--softcap"))
            ok = kva_cli_parse_float(f, val, 0.0f, 1e6f, &o->softcap);
        else if (!strcmp(f, "--backend")) {
            ok = kva_cli_parse_choice(f, val, backends, 3, &k);
            o->backend = backend_vals[k];
        } else if (!strcmp(f, "--threads"))
            ok = kva_cli_parse_i32(f, val, 0, 4096, &o->threads);
        else if (!strcmp(f, "--iters"))
            ok = kva_cli_parse_i32(f, val, 0, 1000000, &o->iters);
        else if (!strcmp(f, "--warmup"))
            ok = kva_cli_parse_i32(f, val, 0, 1000000, &o->warmup);
        else if (!strcmp(f, "--variant"))
            o->variant = val;
        else if (!strcmp(f, "--sweep"))
            ok = bench_sweep_parse(val, &o->sweep);
        else if (!strcmp(f, "--seed"))
            ok = kva_cli_parse_u64(f, val, &o->seed);
        else if (!strcmp(f, "--json")) {
            o->json = val;
            if (!*val) {
                fprintf(stderr, "kvattn: --json: empty file name\n");
                ok = 0;
            }
        }
        if (!ok)
            return KVA_EXIT_USAGE;
    }
    bench_opts_resolve(o);
    if (o->head_dim % 8 != 0 || (o->head_dim_v % 8 != 0)) {
        fprintf(stderr, "kvattn: --head-dim %d / --head-dim-v %d: must be multiples of 8\n",
                (int)o->head_dim, (int)o->head_dim_v);
        return KVA_EXIT_USAGE;
    }
    /* kvattn_cache.h: INT8_TOKEN_K_V16 stores V in the cache dtype, F16 or
     * BF16, and --dtype is the cache dtype too (as in serve-sim). */
    if (o->kv_quant == KVA_QUANT_INT8_TOKEN_K_V16 && o->dtype == KVA_DTYPE_F32) {
        fprintf(stderr, "kvattn: --kv-quant int8-token-v16 keeps V in the 16-bit --dtype: use "
                        "--dtype f16 or bf16, not f32\n");
        return KVA_EXIT_USAGE;
    }
    if (o->ragged && o->kv_quant != KVA_QUANT_NONE) {
        fprintf(stderr, "kvattn: --kv-quant applies to the paged cache, not to --ragged\n");
        return KVA_EXIT_USAGE;
    }
    if (o->heads % o->kv_heads != 0) {
        fprintf(stderr, "kvattn: --heads %d is not a multiple of --kv-heads %d\n", (int)o->heads,
                (int)o->kv_heads);
        return KVA_EXIT_USAGE;
    }
    /* kvattn.h's mask rules, refused here as usage errors rather than by
     * kva_plan_create (exit 1): a chunk needs the causal mask; a draft tree
     * needs it too, takes no window, chunk or ALiBi, and at most
     * KVA_MAX_TREE_TOKENS tokens per request (--sweep's shapes have more). */
    if (o->chunk > 0 && !o->causal) {
        fprintf(stderr, "kvattn: --attention-chunk %d needs --causal 1\n", (int)o->chunk);
        return KVA_EXIT_USAGE;
    }
    if (o->tree != BENCH_TREE_NONE &&
        (!o->causal || o->window >= 0 || o->chunk > 0 || o->alibi || o->sweep)) {
        fprintf(stderr, "kvattn: --tree needs --causal 1 and takes no --window, "
                        "--attention-chunk, --alibi or --sweep\n");
        return KVA_EXIT_USAGE;
    }
    if (o->tree != BENCH_TREE_NONE && o->q_len > KVA_MAX_TREE_TOKENS) {
        fprintf(stderr, "kvattn: --tree: --q-len %d is over %d tokens (KVA_MAX_TREE_TOKENS)\n",
                (int)o->q_len, KVA_MAX_TREE_TOKENS);
        return KVA_EXIT_USAGE;
    }
    if (o->variant && o->backend != KVA_BACKEND_CPU) {
        fprintf(stderr, "kvattn: --variant %s: kvattn bench forces cpu kernels only\n", o->variant);
        return KVA_EXIT_USAGE;
    }
    if (o->parts && (o->mode != BENCH_MIXED || o->ragged)) {
        fprintf(stderr, "kvattn: --parts needs --mode mixed and the paged path (no --ragged)\n");
        return KVA_EXIT_USAGE;
    }
    if (o->backend == KVA_BACKEND_CUDA && (o->parts || o->sweep || o->ragged)) {
        fprintf(stderr, "kvattn: --backend cuda times one paged shape: no --parts, --sweep or "
                        "--ragged\n");
        return KVA_EXIT_USAGE;
    }
    if (o->backend == KVA_BACKEND_CUDA) {
        char why[256];
        if (!bench_cuda_available(why, sizeof why)) {
            fprintf(stderr, "kvattn: --backend cuda: %s\n", why);
            return KVA_EXIT_LIBRARY;
        }
    }
    if ((int64_t)o->context + o->q_len > (1 << 30)) {
        fprintf(stderr, "kvattn: --context + --q-len is too large\n");
        return KVA_EXIT_USAGE;
    }
    return -1;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double bench_median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Everything one bench run owns, released by bench_cleanup. */
typedef struct bench_state {
    bench_batch b;
    kva_context *ctx;
    kva_cache *cache;
    kva_plan *plan;
    double *times;
} bench_state;

static void bench_cleanup(bench_state *s)
{
    kva_plan_destroy(s->plan);
    kva_cache_destroy(s->cache);
    kva_context_destroy(s->ctx);
    bench_batch_free(&s->b);
    free(s->times);
}

static kva_status run_once(const bench_opts *o, bench_state *s)
{
    bench_batch *b = &s->b;
    if (o->ragged)
        return kva_attention_run_ragged(s->ctx, s->plan, b->q, b->k_ragged, b->v_ragged, b->sinks,
                                        b->out, b->lse);
    return kva_attention_run(s->ctx, s->plan, b->q, s->cache, b->sinks, b->out, b->lse);
}

/*
 * Mixed mode --parts: the decodes alone (the batch's first o->batch requests)
 * and the chunked prefill alone (its last request), each with its own plan over
 * the same cache. An engine that ran the two kinds of requests as separate
 * calls would pay their sum. The three steps are timed round-robin (mixed,
 * decodes, chunk, mixed, ...) so that a shared machine's changing load hits
 * all three alike; res->mixed_s is the mixed step's median in this loop.
 */
static int time_parts(const bench_opts *o, bench_state *s, int iters, bench_result *res)
{
    const bench_batch *b = &s->b;
    const int32_t R = b->num_requests, last = R - 1;
    const size_t es = kva_dtype_size(o->dtype), H = (size_t)o->heads;
    kva_plan_desc full, pd;
    bench_plan_desc(o, b, &full);
    kva_plan *dec = NULL, *chunk = NULL;
    double *tm = malloc(3 * (size_t)iters * sizeof *tm);
    kva_status st;
    int rc = KVA_EXIT_OK;
    if (!tm) {
        fprintf(stderr, "kvattn: out of memory\n");
        return KVA_EXIT_LIBRARY;
    }

    pd = full;
    pd.num_requests = o->batch;
    if ((st = kva_plan_create(s->ctx, &pd, &dec)) != KVA_STATUS_OK) {
        rc = kva_cli_lib_error("kva_plan_create (decodes alone)", st);
        goto done;
    }
    const int32_t t0 = b->query_start_loc[last];
    const int32_t qsl[2] = {0, b->query_start_loc[R] - t0};
    pd = full;
    pd.num_requests = 1;
    pd.query_start_loc = qsl;
    pd.seq_lens = b->seq_lens + last;
    pd.block_table = b->block_table + (size_t)last * (size_t)b->block_table_stride;
    if ((st = kva_plan_create(s->ctx, &pd, &chunk)) != KVA_STATUS_OK) {
        rc = kva_cli_lib_error("kva_plan_create (chunk alone)", st);
        goto done;
    }
    const void *q_chunk = (const unsigned char *)b->q + (size_t)t0 * H * o->head_dim * es;
    void *out_chunk = (unsigned char *)b->out + (size_t)t0 * H * o->head_dim_v * es;
    float *lse_chunk = b->lse + (size_t)t0 * H;
    for (int k = -1; k < iters; k++) { /* k = -1: warm-up of the two new plans */
        for (int w = 0; w < 3; w++) {
            const double t = kva_cli_now();
            if (w == 0)
                st = run_once(o, s);
            else if (w == 1)
                st = kva_attention_run(s->ctx, dec, b->q, s->cache, b->sinks, b->out, b->lse);
            else
                st = kva_attention_run(s->ctx, chunk, q_chunk, s->cache, b->sinks, out_chunk,
                                       lse_chunk);
            if (st != KVA_STATUS_OK) {
                rc = kva_cli_lib_error("kva_attention_run (parts)", st);
                goto done;
            }
            if (k >= 0)
                tm[(size_t)w * iters + k] = kva_cli_now() - t;
        }
    }
    res->mixed_s = bench_median(tm, iters);
    res->decodes_s = bench_median(tm + iters, iters);
    res->chunk_s = bench_median(tm + 2 * (size_t)iters, iters);
done:
    kva_plan_destroy(dec);
    kva_plan_destroy(chunk);
    free(tm);
    return rc;
}

/* The bench proper once the options are valid; returns the exit status. */
/* Forces the comma-separated registry kernels `list` on ctx
 * (kva__context_force_kernel); -1 on success, else the exit status. */
static int force_kernels(kva_context *ctx, const char *list)
{
    char name[64];
    for (const char *p = list; *p;) {
        const size_t n = strcspn(p, ",");
        if (n == 0 || n >= sizeof name) {
            fprintf(stderr, "kvattn: --variant '%s': expected NAME[,NAME]\n", list);
            return KVA_EXIT_USAGE;
        }
        memcpy(name, p, n);
        name[n] = '\0';
        if (kva__context_force_kernel(ctx, name) != KVA_STATUS_OK) {
            fprintf(stderr, "kvattn: --variant %s: %s (`kvattn info` lists the kernels)\n", name,
                    kva_last_error());
            return KVA_EXIT_USAGE;
        }
        p += n + (p[n] == ',');
    }
    return -1;
}

static int bench_main(const bench_opts *o, bench_state *s, bench_result *res)
{
    kva_status st;
    bench_batch *b = &s->b;
    st = bench_batch_build(o, b);
    if (st != KVA_STATUS_OK) {
        fprintf(stderr, "kvattn: out of memory building the batch\n");
        return KVA_EXIT_LIBRARY;
    }
    if (o->backend == KVA_BACKEND_CUDA)
        return bench_cuda_main(o, b, res);
    kva_context_desc cd = {o->backend, o->threads, 0};
    if ((st = kva_context_create(&cd, &s->ctx)) != KVA_STATUS_OK)
        return kva_cli_lib_error("kva_context_create", st);
    if (o->variant) {
        int rc = force_kernels(s->ctx, o->variant);
        if (rc >= 0)
            return rc;
    }
    res->threads = kva_context_num_threads(s->ctx);
    res->num_requests = b->num_requests;
    res->num_tokens = b->num_tokens;
    res->num_blocks = b->num_blocks;

    /* Inputs: the paged cache written through kva_cache_write, or packed K/V. */
    if (o->ragged) {
        if (bench_ragged_fill(o, b) != KVA_STATUS_OK) {
            fprintf(stderr, "kvattn: out of memory for the ragged K/V\n");
            return KVA_EXIT_LIBRARY;
        }
    } else {
        if ((st = bench_cache_create(s->ctx, o, b, &s->cache)) != KVA_STATUS_OK)
            return kva_cli_lib_error("kva_cache_create_quant", st);
        if ((st = bench_cache_fill(s->ctx, o, b, s->cache)) != KVA_STATUS_OK)
            return kva_cli_lib_error("kva_cache_write", st);
    }

    /* The plan, built a few times to time it (an engine builds one per step). */
    kva_plan_desc pd;
    bench_plan_desc(o, b, &pd);
    double plan_times[PLAN_REPEATS];
    for (int k = 0; k < PLAN_REPEATS; k++) {
        kva_plan_destroy(s->plan);
        s->plan = NULL;
        double t0 = kva_cli_now();
        st = kva_plan_create(s->ctx, &pd, &s->plan);
        plan_times[k] = kva_cli_now() - t0;
        if (st != KVA_STATUS_OK)
            return kva_cli_lib_error("kva_plan_create", st);
    }
    res->plan_s = bench_median(plan_times, PLAN_REPEATS);
    if ((st = kva_plan_get_info(s->plan, &res->info)) != KVA_STATUS_OK)
        return kva_cli_lib_error("kva_plan_get_info", st);

    /* First run into poisoned outputs: what the check compares. */
    const size_t H = (size_t)o->heads, T = (size_t)b->num_tokens;
    bench_poison(b->out, o->dtype, T * H * (size_t)o->head_dim_v);
    bench_poison(b->lse, KVA_DTYPE_F32, T * H);
    double t0 = kva_cli_now();
    if ((st = run_once(o, s)) != KVA_STATUS_OK)
        return kva_cli_lib_error(o->ragged ? "kva_attention_run_ragged" : "kva_attention_run", st);
    double estimate = kva_cli_now() - t0;

    if (o->no_check) {
        res->check.skip_reason = "--no-check";
    } else if (o->backend == KVA_BACKEND_REF) {
        res->check.skip_reason = "the backend is the reference";
    } else {
        int rc = bench_check_report(o, b, s->cache, kva_backend_name(o->backend), &res->check);
        if (rc != KVA_EXIT_OK)
            return rc;
    }
    fflush(stdout);

    for (int k = 0; k < o->warmup; k++) {
        t0 = kva_cli_now();
        if ((st = run_once(o, s)) != KVA_STATUS_OK)
            return kva_cli_lib_error("attention (warm-up)", st);
        double dt = kva_cli_now() - t0;
        if (dt < estimate)
            estimate = dt;
    }
    int iters = o->iters;
    if (iters == 0) {
        double n = estimate > 0 ? AUTO_SECONDS / estimate : AUTO_ITERS_MAX;
        iters = n < AUTO_ITERS_MIN ? AUTO_ITERS_MIN : n > AUTO_ITERS_MAX ? AUTO_ITERS_MAX : (int)n;
    }
    res->iters = iters;
    s->times = malloc((size_t)iters * sizeof *s->times);
    if (!s->times) {
        fprintf(stderr, "kvattn: out of memory\n");
        return KVA_EXIT_LIBRARY;
    }
    kva_cli_reader rd = {0};
    double *pair_bw = NULL;
    if (o->paired && o->backend != KVA_BACKEND_CUDA) {
        pair_bw = malloc((size_t)iters * sizeof *pair_bw);
        if (!pair_bw || kva_cli_reader_open(&rd, res->threads) != 0) {
            free(pair_bw);
            fprintf(stderr, "kvattn: out of memory\n");
            return KVA_EXIT_LIBRARY;
        }
    }
    for (int k = 0; k < iters; k++) {
        t0 = kva_cli_now();
        st = run_once(o, s);
        s->times[k] = kva_cli_now() - t0;
        if (st != KVA_STATUS_OK) {
            free(pair_bw);
            kva_cli_reader_close(&rd);
            return kva_cli_lib_error("attention", st);
        }
        if (pair_bw)
            pair_bw[k] = kva_cli_reader_pass(&rd);
    }
    res->counts = bench_count(o, b);
    if (pair_bw) {
        /* times[k] * pair_bw[k]: the GB the read pass would have read in the
         * run's time; the run's fraction of it is kv_bytes / that. */
        double *frac = malloc((size_t)iters * sizeof *frac);
        if (frac) {
            for (int k = 0; k < iters; k++)
                frac[k] = s->times[k] * pair_bw[k] > 0
                              ? res->counts.kv_bytes / 1e9 / (s->times[k] * pair_bw[k])
                              : 0;
            res->paired_frac = bench_median(frac, iters);
            res->paired_bw = bench_median(pair_bw, iters);
            free(frac);
        }
        free(pair_bw);
        kva_cli_reader_close(&rd);
    }
    res->median_s = bench_median(s->times, iters);
    res->min_s = s->times[0]; /* sorted by median() */
    if (o->parts) {
        int rc = time_parts(o, s, iters, res);
        if (rc != KVA_EXIT_OK)
            return rc;
    }

    /* The step's cache write (same slots, same data: idempotent). */
    if (!o->ragged) {
        int n = iters < 50 ? iters : 50;
        for (int k = 0; k < n; k++) {
            t0 = kva_cli_now();
            st = bench_cache_write_new(s->ctx, o, b, s->cache);
            s->times[k] = kva_cli_now() - t0;
            if (st != KVA_STATUS_OK)
                return kva_cli_lib_error("kva_cache_write", st);
        }
        res->write_s = bench_median(s->times, n);
    }
    if (!o->no_ceiling) {
        res->read_bw = kva_cli_measure_read_bw(res->threads);
        if (res->threads > 1)
            res->read_bw_1t = kva_cli_measure_read_bw(1);
        res->fma_peak = kva_cli_measure_fma_peak(res->threads, &res->peak_isa);
    }

    if (!o->quiet)
        bench_report_print(o, b, res);
    if (o->json && !o->quiet && bench_report_json(o->json, o, res) != 0) {
        fprintf(stderr, "kvattn: cannot write --json file '%s'\n", o->json);
        return KVA_EXIT_LIBRARY;
    }
    return KVA_EXIT_OK;
}

int bench_run_shape(const bench_opts *o, bench_result *res)
{
    bench_state s;
    memset(&s, 0, sizeof s);
    memset(res, 0, sizeof *res);
    int rc = bench_main(o, &s, res);
    bench_cleanup(&s);
    return rc;
}

int kva_cli_bench(int argc, char **argv)
{
    for (int i = 0; i < argc; i++)
        if (kva_cli_flag_is(argv[i], "--dcp"))
            return kva_cli_bench_dcp(argc, argv); /* bench_dcp.c */
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--mla") == 0)
            return kva_cli_bench_mla(argc, argv);
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--indexer") == 0)
            return kva_cli_bench_indexer(argc, argv); /* bench_indexer.c */
        if (strcmp(argv[i], "--mla-sparse") == 0)
            return kva_cli_bench_mla_sparse(argc, argv); /* bench_mla_sparse.c */
    }
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--cascade") == 0)
            return kva_cli_bench_cascade(argc, argv); /* bench_cascade.c */
    bench_opts o;
    int rc = parse_bench(argc, argv, &o);
    if (rc >= 0)
        return rc;
    if (o.sweep)
        return bench_sweep(&o);
    bench_result res;
    return bench_run_shape(&o, &res);
}
