/*
 * bench_mla.c - `kvattn bench --mla`: multi-head latent attention for one
 * layer (kva_mla_run, or the absorbed kernel-level kva_attention_run with
 * --kernel) over a latent cache, checked against the reference backend's
 * naive math, then timed.
 *
 * Modes: decode (R requests of q_len new tokens after a context: the
 * absorbed path), prefill (R prompts: the compute-friendly path), mixed (R
 * decodes plus one chunked prefill in one plan: both paths). Counts:
 *   latent bytes: every visible key's latent row once per request (D * es;
 *     what the absorbed path must read), against the machine's read bandwidth;
 *   FLOPs: absorbed rows 2 * (D + Dc) per (head, visible key) plus the
 *     absorption and output projections 2 * (Dn * Dc + Dc * Dv) per row;
 *     compute-friendly 2 * (Dn + Dr + Dv) per (head, visible key) plus the
 *     decompression 2 * Dc * (Dn + Dv) per (head, key); against the FMA peak.
 * --compare-split times the absorbed path without split-KV (at most one key
 * piece per item) and with the default split in alternating rounds of one
 * run, so that load on the machine hits both alike.
 * The check runs the reference on request 0 (and the prefill of a mixed
 * batch) for two heads (q and weights sliced), which keeps the fp64 naive
 * math to seconds; the whole output is checked for NaN.
 * --backend cuda times the layer on GPU 0 (bench_mla_cuda.c) and splits
 * kva_mla_run's time into its phases; the attention phase of the
 * compute-friendly path is also reported as attention FLOPs per second.
 */
#include "bench.h" /* bench_median */
#include "bench_mla.h"
#include "cli.h"
#include "internal.h"                 /* kva__context_force_kernel, mla_max_splits */
#include "../bench/data.h"            /* KVA_TEST_MLA_BF16DOT_LSE_ATOL */
#include "../src/attn/cpu/cpu_attn.h" /* kva__cpu_plan_kernel */
#include "../src/attn/cpu/mla_cpu.h"  /* kva__cpu_mla_split_of */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct mla_opts {
    int mode; /* 0 decode, 1 prefill, 2 mixed */
    int32_t batch, context, q_len, heads, Dc, Dr, Dn, Dv, B, threads, iters, warmup;
    kva_dtype dt;
    int fp8, kernel, no_check, no_ceiling, compare_split, cuda, paired;
    int32_t max_splits;  /* ctx->mla_max_splits: 0 default, 1 no split-KV */
    const char *variant; /* a registry kernel forced by name, or NULL */
} mla_opts;

static void usage(void)
{
    printf("usage: kvattn bench --mla [options]\n"
           "\n"
           "Times one layer of multi-head latent attention (DeepSeek-V2/V3 shapes) on the\n"
           "CPU backend after checking it against the reference backend's naive math.\n"
           "  --mode decode|prefill|mixed  decode: absorbed path; prefill: compute-friendly\n"
           "                       path; mixed: R decodes + one chunked prefill [decode]\n"
           "  --batch R            requests (mixed: decodes) [decode 16, prefill 1, mixed 8]\n"
           "  --context N          cached tokens per request [decode 4096, prefill 0, mixed 2048]\n"
           "  --q-len n            new tokens (decode: per request; else of the prefill)\n"
           "                       [decode 1, prefill 1024, mixed 256]\n"
           "  --heads H            query heads [16]\n"
           "  --kv-lora-rank Dc, --rope-dim Dr, --nope-dim Dn, --v-dim Dv  [512, 64, 128, 128]\n"
           "  --dtype f32|f16|bf16 q, weights, output and cache dtype [bf16]\n"
           "  --kv-quant none|fp8  FP8 E4M3 latent cache [none]\n"
           "  --block-size B       [64]\n"
           "  --kernel             time kva_attention_run on absorbed q (decode mode)\n"
           "  --backend cpu|cuda   cuda: GPU 0, with the phases of kva_mla_run [cpu]\n"
           "  --threads N          0 = all cores [0]\n"
           "  --variant NAME       force a registry kernel (mla_portable, mla_avx2, mla_avx512,\n"
           "                       mla_avx512bf16)\n"
           "  --max-splits N       most key pieces per absorbed item, 1 = no split-KV [0: auto]\n"
           "  --compare-split      time without and with split-KV in alternating rounds\n"
           "  --paired             CPU: a read pass with the same threads after every timed\n"
           "                       run: the fraction of the read bandwidth the latent bytes\n"
           "                       reach, run by run (the median is printed)\n"
           "  --iters N, --warmup N  [10, 2]\n"
           "  --no-check, --no-ceiling\n");
}

static int parse(int argc, char **argv, mla_opts *o)
{
    memset(o, 0, sizeof *o);
    o->batch = o->context = o->q_len = -1;
    o->heads = 16;
    o->Dc = 512;
    o->Dr = 64;
    o->Dn = 128;
    o->Dv = 128;
    o->B = 64;
    o->iters = 10;
    o->warmup = 2;
    o->dt = KVA_DTYPE_BF16;
    static const char *const modes[] = {"decode", "prefill", "mixed"};
    static const char *const dts[] = {"f32", "f16", "bf16"};
    static const char *const quants[] = {"none", "fp8"};
    static const char *const backends[] = {"cpu", "cuda"};
    static const char *const value_flags[] = {
        "--mode",     "--dtype",   "--kv-quant",   "--variant", "--max-splits",   "--backend",
        "--batch",    "--context", "--q-len",      "--heads",   "--kv-lora-rank", "--rope-dim",
        "--nope-dim", "--v-dim",   "--block-size", "--threads", "--iters",        "--warmup"};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--mla"))
            continue;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage();
            return KVA_EXIT_OK;
        }
        if (!strcmp(a, "--kernel") || !strcmp(a, "--no-check") || !strcmp(a, "--no-ceiling") ||
            !strcmp(a, "--compare-split") || !strcmp(a, "--paired")) {
            if (!strcmp(a, "--paired"))
                o->paired = 1;
            else if (!strcmp(a, "--kernel"))
                o->kernel = 1;
            else if (!strcmp(a, "--compare-split"))
                o->compare_split = 1;
            else if (!strcmp(a, "--no-check"))
                o->no_check = 1;
            else
                o->no_ceiling = 1;
            continue;
        }
        char name[40]; /* "--flag v" or "--flag=v" */
        const char *v = kva_cli_flag_split(argc, argv, &i, name, sizeof name, "bench --mla",
                                           value_flags, sizeof value_flags / sizeof value_flags[0]);
        if (!v)
            return KVA_EXIT_USAGE;
        a = name;
        int ok = 1, c = 0;
        if (!strcmp(a, "--mode"))
            ok = kva_cli_parse_choice(a, v, modes, 3, &o->mode);
        else if (!strcmp(a, "--dtype")) {
            ok = kva_cli_parse_choice(a, v, dts, 3, &c);
            o->dt = c == 0 ? KVA_DTYPE_F32 : c == 1 ? KVA_DTYPE_F16 : KVA_DTYPE_BF16;
        } else if (!strcmp(a, "--kv-quant"))
            ok = kva_cli_parse_choice(a, v, quants, 2, &o->fp8);
        else if (!strcmp(a, "--variant"))
            o->variant = v;
        else if (!strcmp(a, "--max-splits"))
            ok = kva_cli_parse_i32(a, v, 0, KVA_MLA_MAX_SPLITS, &o->max_splits);
        else if (!strcmp(a, "--backend"))
            ok = kva_cli_parse_choice(a, v, backends, 2, &o->cuda);
        else {
            static const char *const flags[] = {"--batch",    "--context",      "--q-len",
                                                "--heads",    "--kv-lora-rank", "--rope-dim",
                                                "--nope-dim", "--v-dim",        "--block-size",
                                                "--threads",  "--iters",        "--warmup"};
            int32_t *dst[] = {&o->batch, &o->context, &o->q_len, &o->heads,
                              &o->Dc,    &o->Dr,      &o->Dn,    &o->Dv,
                              &o->B,     &o->threads, &o->iters, &o->warmup};
            int k = 0;
            while (k < 12 && strcmp(a, flags[k]))
                k++;
            if (k == 12) {
                fprintf(stderr, "kvattn: bench --mla: unknown option '%s'\n", a);
                return KVA_EXIT_USAGE;
            }
            ok = kva_cli_parse_i32(a, v, k == 1 || k >= 9 ? 0 : 1, 1 << 24, dst[k]);
        }
        if (!ok)
            return KVA_EXIT_USAGE;
    }
    /* Limits of the library (kvattn.h) checked here, so that a value out of
     * range is a usage error (exit 2), not a failing library call (exit 1). */
    if (o->heads > KVA_MAX_HEADS || o->threads > KVA_MAX_THREADS || o->Dc % 8 || o->Dr % 8 ||
        o->Dn % 8 || o->Dv % 8 || (int64_t)o->Dc + o->Dr > KVA_MAX_HEAD_DIM ||
        o->Dn > KVA_MAX_HEAD_DIM || o->Dv > KVA_MAX_HEAD_DIM) {
        fprintf(stderr,
                "kvattn: bench --mla: --heads %d (at most %d), --threads %d (at most %d), "
                "--kv-lora-rank %d + --rope-dim %d (at most %d), --nope-dim %d, --v-dim %d (at "
                "most %d): head sizes are multiples of 8\n",
                (int)o->heads, KVA_MAX_HEADS, (int)o->threads, KVA_MAX_THREADS, (int)o->Dc,
                (int)o->Dr, KVA_MAX_HEAD_DIM, (int)o->Dn, (int)o->Dv, KVA_MAX_HEAD_DIM);
        return KVA_EXIT_USAGE;
    }
    static const int32_t defaults[3][3] = {{16, 4096, 1}, {1, 0, 1024}, {8, 2048, 256}};
    if (o->batch < 0)
        o->batch = defaults[o->mode][0];
    if (o->context < 0)
        o->context = defaults[o->mode][1];
    if (o->q_len < 0)
        o->q_len = defaults[o->mode][2];
    if (o->iters < 1)
        o->iters = 1;
    if (o->kernel && (o->compare_split || o->max_splits)) {
        fprintf(stderr, "kvattn: bench --mla: split-KV is kva_mla_run's; not with --kernel\n");
        return KVA_EXIT_USAGE;
    }
    if (o->kernel && o->mode != 0) {
        fprintf(stderr, "kvattn: bench --mla: --kernel times the absorbed decode only\n");
        return KVA_EXIT_USAGE;
    }
    return -1;
}

/* The batch: R requests (decode: q_len each; prefill: q_len each; mixed: R
 * decodes of 1 token plus one prefill of q_len), all after `context` tokens. */
typedef struct mla_batch {
    int32_t R, T, stride, nb;
    int32_t *qsl, *sl, *bt;
} mla_batch;

static void make_batch(const mla_opts *o, mla_batch *b)
{
    b->R = o->batch + (o->mode == 2);
    b->qsl = calloc((size_t)b->R + 1, 4);
    b->sl = calloc((size_t)b->R, 4);
    int32_t maxs = 1;
    for (int32_t r = 0; r < b->R; r++) {
        const int32_t q = o->mode == 2 && r < o->batch ? 1 : o->q_len;
        b->qsl[r + 1] = b->qsl[r] + q;
        b->sl[r] = o->context + q;
        maxs = b->sl[r] > maxs ? b->sl[r] : maxs;
    }
    b->T = b->qsl[b->R];
    b->stride = (maxs + o->B - 1) / o->B;
    b->nb = b->R * b->stride + 1;
    b->bt = malloc((size_t)b->R * b->stride * 4);
    /* Blocks in a scrambled order (a pool hands them out so); block 0 unused. */
    const int64_t n = (int64_t)b->R * b->stride;
    const int64_t step = n % 7919 ? 7919 : 1; /* 7919 is prime: a permutation */
    for (int64_t i = 0; i < n; i++)
        b->bt[i] = 1 + (int32_t)((i * step) % n);
}

static kva_plan_desc plan_desc(const mla_opts *o, const mla_batch *b, int layer)
{
    kva_plan_desc p = {.num_requests = b->R,
                       .query_start_loc = b->qsl,
                       .seq_lens = b->sl,
                       .block_table = b->bt,
                       .block_table_stride = b->stride,
                       .block_size = o->B,
                       .decode_threshold = o->mode == 0 ? o->q_len : 1,
                       .num_heads = o->heads,
                       .num_kv_heads = 1,
                       .head_dim = o->Dc + o->Dr,
                       .head_dim_v = o->Dc,
                       .q_dtype = o->dt,
                       .scale = (float)(1.0 / sqrt((double)(o->Dn + o->Dr))),
                       .causal = 1,
                       .window_left = -1,
                       .kind = KVA_ATTN_MLA,
                       .mla_qk_nope_head_dim = layer ? o->Dn : 0,
                       .mla_v_head_dim = layer ? o->Dv : 0};
    return p;
}

static void fill(void *p, kva_dtype dt, size_t n, uint64_t *s, double sigma)
{
    for (size_t i = 0; i < n; i++) {
        *s = *s * 6364136223846793005ull + 1442695040888963407ull;
        const float x = (float)(((double)(*s >> 11) / 9007199254740992.0 * 2.0 - 1.0) * sigma);
        if (dt == KVA_DTYPE_F32)
            ((float *)p)[i] = x;
        else
            ((uint16_t *)p)[i] = dt == KVA_DTYPE_F16 ? kva_f32_to_f16(x) : kva_f32_to_bf16(x);
    }
}

static double get(const void *p, kva_dtype dt, size_t i)
{
    if (dt == KVA_DTYPE_F32)
        return ((const float *)p)[i];
    const uint16_t h = ((const uint16_t *)p)[i];
    return dt == KVA_DTYPE_F16 ? kva_f16_to_f32(h) : kva_bf16_to_f32(h);
}

/* The reference on request r for heads 0 and 1; returns the largest error
 * of out (relative to the row's largest value) and of lse, or -1 on failure. */
static double check_request(const mla_opts *o, const mla_batch *b, const kva_cache *cache,
                            int32_t r, const void *q, const void *wuk, const void *wuv,
                            const void *out, const float *lse, double *lse_err)
{
    const int32_t Hc = o->heads < 2 ? o->heads : 2, Dq = o->Dn + o->Dr;
    const size_t es = kva_dtype_size(o->dt);
    const int32_t q0 = b->qsl[r], n = b->qsl[r + 1] - q0;
    int32_t qsl[2] = {0, n};
    kva_context *ref = NULL;
    kva_context_desc cd = {KVA_BACKEND_REF, 1, 0};
    if (kva_context_create(&cd, &ref) != KVA_STATUS_OK)
        return -1;
    kva_plan_desc pd = plan_desc(o, b, 1);
    pd.num_requests = 1;
    pd.query_start_loc = qsl;
    pd.seq_lens = b->sl + r;
    pd.block_table = b->bt + (size_t)r * b->stride;
    pd.num_heads = Hc;
    kva_plan *plan = NULL;
    unsigned char *qs = malloc((size_t)n * Hc * Dq * es), *ro = malloc((size_t)n * Hc * o->Dv * es);
    float *rl = malloc((size_t)n * Hc * 4);
    double err = -1;
    if (kva_plan_create(ref, &pd, &plan) == KVA_STATUS_OK) {
        for (int32_t t = 0; t < n; t++)
            memcpy(qs + (size_t)t * Hc * Dq * es,
                   (const unsigned char *)q + ((size_t)(q0 + t) * o->heads) * Dq * es,
                   (size_t)Hc * Dq * es);
        /* Weights of heads 0 .. Hc-1 are the first rows of w_uk and w_uv. */
        if (kva_mla_run(ref, plan, qs, wuk, wuv, cache, ro, rl) == KVA_STATUS_OK) {
            err = 0;
            *lse_err = 0;
            for (int32_t t = 0; t < n; t++)
                for (int32_t h = 0; h < Hc; h++) {
                    double mx = 1e-30, e = 0;
                    for (int32_t i = 0; i < o->Dv; i++) {
                        const double w = get(ro, o->dt, ((size_t)t * Hc + h) * o->Dv + i);
                        const double g =
                            get(out, o->dt, ((size_t)(q0 + t) * o->heads + h) * o->Dv + i);
                        mx = fabs(w) > mx ? fabs(w) : mx;
                        e = fabs(g - w) > e ? fabs(g - w) : e;
                    }
                    err = e / mx > err ? e / mx : err;
                    const double le = fabs(lse[(size_t)(q0 + t) * o->heads + h] - rl[t * Hc + h]);
                    *lse_err = le > *lse_err ? le : *lse_err;
                }
        }
    }
    kva_plan_destroy(plan);
    kva_context_destroy(ref);
    free(qs);
    free(ro);
    free(rl);
    return err;
}

int kva_cli_bench_mla(int argc, char **argv)
{
    mla_opts o;
    int rc = parse(argc, argv, &o);
    if (rc >= 0)
        return rc;
    mla_batch b;
    make_batch(&o, &b);
    const size_t es = kva_dtype_size(o.dt), H = (size_t)o.heads, D = (size_t)(o.Dc + o.Dr);
    const size_t Dq = (size_t)(o.Dn + o.Dr);
    kva_context *ctx = NULL;
    kva_context_desc cd = {KVA_BACKEND_CPU, o.threads, 0};
    kva_status st = kva_context_create(&cd, &ctx);
    if (st != KVA_STATUS_OK)
        return kva_cli_lib_error("kva_context_create", st);
    if (o.variant && (st = kva__context_force_kernel(ctx, o.variant)) != KVA_STATUS_OK)
        return kva_cli_lib_error("--variant", st);
    ctx->mla_max_splits = o.max_splits;
    kva_cache_desc kd = {.num_blocks = b.nb,
                         .block_size = o.B,
                         .num_kv_heads = 1,
                         .head_dim = (int32_t)D,
                         .head_dim_v = o.Dc,
                         .dtype = o.fp8 ? KVA_DTYPE_FP8_E4M3 : o.dt,
                         .quant = o.fp8 ? KVA_QUANT_FP8_E4M3 : KVA_QUANT_NONE,
                         .kind = KVA_ATTN_MLA};
    const float fp8_scale = 1.0f / 128;
    kva_quant_params qp = {.k_scale = &fp8_scale, .k_scale_len = 1};
    kva_cache *cache = NULL;
    if ((st = kva_cache_create_quant(ctx, &kd, o.fp8 ? &qp : NULL, &cache)) != KVA_STATUS_OK)
        return kva_cli_lib_error("kva_cache_create_quant", st);
    /* Every slot of every block table row, from random rows, 4096 at a time. */
    uint64_t seed = 1234;
    const int32_t chunk = 4096;
    void *ckv = malloc((size_t)chunk * o.Dc * es), *kpe = malloc((size_t)chunk * o.Dr * es);
    int64_t *slots = malloc((size_t)chunk * 8);
    for (int32_t r = 0; r < b.R && st == KVA_STATUS_OK; r++)
        for (int32_t j0 = 0; j0 < b.sl[r] && st == KVA_STATUS_OK; j0 += chunk) {
            const int32_t n = b.sl[r] - j0 < chunk ? b.sl[r] - j0 : chunk;
            fill(ckv, o.dt, (size_t)n * o.Dc, &seed, 1.7);
            fill(kpe, o.dt, (size_t)n * o.Dr, &seed, 1.7);
            for (int32_t t = 0; t < n; t++) {
                const int32_t j = j0 + t;
                slots[t] = (int64_t)b.bt[(size_t)r * b.stride + j / o.B] * o.B + j % o.B;
            }
            st = kva_cache_write(ctx, cache, n, ckv, 0, kpe, 0, o.dt, slots);
        }
    free(ckv);
    free(kpe);
    free(slots);
    if (st != KVA_STATUS_OK)
        return kva_cli_lib_error("kva_cache_write", st);
    const size_t qw = o.kernel ? D : Dq, ow = o.kernel ? (size_t)o.Dc : (size_t)o.Dv;
    void *q = malloc((size_t)b.T * H * qw * es), *out = malloc((size_t)b.T * H * ow * es);
    void *wuk = malloc(H * o.Dn * o.Dc * es), *wuv = malloc(H * o.Dc * o.Dv * es);
    float *lse = malloc((size_t)b.T * H * 4);
    fill(q, o.dt, (size_t)b.T * H * qw, &seed, 1.7);
    fill(wuk, o.dt, H * o.Dn * o.Dc, &seed, 1.7 / sqrt((double)o.Dc));
    fill(wuv, o.dt, H * o.Dc * o.Dv, &seed, 1.7 / sqrt((double)o.Dc));
    kva_plan_desc pd = plan_desc(&o, &b, !o.kernel);
    kva_plan *plan = NULL;
    /* Rounds: one timing per pass (--compare-split: unsplit, then split;
     * the plan's workspace holds the split's partials, which the unsplit
     * pass leaves unused). --backend cuda times on the GPU (bench_mla_cuda.c),
     * which gives one median and the best time. */
    const int passes = o.compare_split && !o.cuda ? 2 : 1;
    double *tms = malloc((size_t)passes * (size_t)o.iters * sizeof *tms);
    double *ptm = calloc((size_t)o.iters, sizeof *ptm), *pbw = calloc((size_t)o.iters, sizeof *pbw);
    kva_cli_reader rd = {0};
    bench_mla_times ct;
    memset(&ct, 0, sizeof ct);
    if (o.cuda) {
        bench_mla_io io = {.cache = cache,
                           .kv_scale = fp8_scale,
                           .plan_desc = &pd,
                           .q = q,
                           .w_uk = wuk,
                           .w_uv = wuv,
                           .q_bytes = (size_t)b.T * H * qw * es,
                           .w_uk_bytes = H * o.Dn * o.Dc * es,
                           .w_uv_bytes = H * o.Dc * o.Dv * es,
                           .out = out,
                           .lse = lse,
                           .out_bytes = (size_t)b.T * H * ow * es,
                           .lse_bytes = (size_t)b.T * H * 4,
                           .iters = o.iters,
                           .warmup = o.warmup,
                           .kernel = o.kernel};
        if ((rc = bench_mla_cuda(&io, &ct)) != KVA_EXIT_OK)
            return rc;
        for (int i = 0; i < o.iters; i++)
            tms[i] = ct.median;
        tms[0] = ct.best;
        o.no_ceiling = 1;
    } else {
        if ((st = kva_plan_create(ctx, &pd, &plan)) != KVA_STATUS_OK)
            return kva_cli_lib_error("kva_plan_create", st);
        if (o.paired && kva_cli_reader_open(&rd, kva_context_num_threads(ctx)) != 0) {
            fprintf(stderr, "kvattn: out of memory\n");
            return KVA_EXIT_LIBRARY;
        }
        for (int k = -o.warmup - 1; k < o.iters; k++)
            for (int ps = 0; ps < passes; ps++) {
                if (o.compare_split)
                    ctx->mla_max_splits = ps == 0 ? 1 : o.max_splits;
                const double t0 = kva_cli_now();
                st = o.kernel ? kva_attention_run(ctx, plan, q, cache, NULL, out, lse)
                              : kva_mla_run(ctx, plan, q, wuk, wuv, cache, out, lse);
                if (st != KVA_STATUS_OK)
                    return kva_cli_lib_error(o.kernel ? "kva_attention_run" : "kva_mla_run", st);
                if (k >= 0)
                    tms[(size_t)ps * o.iters + k] = kva_cli_now() - t0;
                if (k >= 0 && o.paired && ps == passes - 1) { /* the run, then a read pass */
                    ptm[k] = tms[(size_t)ps * o.iters + k];
                    pbw[k] = kva_cli_reader_pass(&rd);
                }
            }
    }
    for (int ps = 0; ps < passes; ps++) { /* insertion sort: the medians */
        double *tm = tms + (size_t)ps * o.iters;
        for (int i = 1; i < o.iters; i++)
            for (int j = i; j > 0 && tm[j] < tm[j - 1]; j--) {
                const double t = tm[j];
                tm[j] = tm[j - 1];
                tm[j - 1] = t;
            }
    }
    const double *tm = tms + (size_t)(passes - 1) * o.iters;
    const double med = tm[o.iters / 2], best = tm[0];
    kva__cpu_mla_split sp = {1, 0, 0, 0};
    if (!o.kernel && !o.cuda)
        kva__cpu_mla_split_of(ctx, plan, kva_context_num_threads(ctx), &sp);

    /* Work: latent bytes and FLOPs per path (header comment). */
    double bytes = 0, flops = 0, attn_flops = 0;
    const size_t kv_es = o.fp8 ? 1 : es;
    for (int32_t r = 0; r < b.R; r++) {
        const double q_len = b.qsl[r + 1] - b.qsl[r], s = b.sl[r];
        const double pairs = q_len * (s - q_len) + q_len * (q_len + 1) / 2;
        bytes += s * (double)D * (double)kv_es;
        if (q_len <= pd.decode_threshold || o.kernel)
            flops += 2.0 * H * pairs * (double)(D + o.Dc) +
                     (o.kernel ? 0 : 2.0 * H * q_len * (o.Dn * o.Dc + o.Dc * o.Dv));
        else
            flops += 2.0 * H * pairs * (double)(Dq + o.Dv) + 2.0 * H * s * o.Dc * (o.Dn + o.Dv),
                attn_flops += 2.0 * H * pairs * (double)(Dq + o.Dv);
    }
    int nan = 0;
    for (size_t i = 0; i < (size_t)b.T * H * ow; i++)
        nan |= isnan(get(out, o.dt, i));
    printf("kvattn bench --mla: %s%s, R %d x (context %d + q_len %d), H %d, Dc %d Dr %d Dn %d "
           "Dv %d, %s%s, B %d, %d threads\n",
           o.mode == 0   ? "decode"
           : o.mode == 1 ? "prefill"
                         : "mixed",
           o.kernel ? " (kernel-level absorbed)" : "", (int)o.batch, (int)o.context, (int)o.q_len,
           (int)o.heads, (int)o.Dc, (int)o.Dr, (int)o.Dn, (int)o.Dv, kva_dtype_name(o.dt),
           o.fp8 ? " fp8 latent" : "", (int)o.B, o.cuda ? 0 : (int)kva_context_num_threads(ctx));
    if (o.cuda)
        printf("  backend cuda (GPU 0)\n");
    printf("  KV bytes per token: latent %zu, MHA of the same heads (K %zu + V %zu per head) "
           "%zu (%.1fx)\n",
           D * kv_es, Dq, (size_t)o.Dv, H * (Dq + o.Dv) * es,
           (double)(H * (Dq + o.Dv) * es) / (double)(D * kv_es));
    if (!o.kernel && !o.cuda)
        printf("  kernel %s, split-KV %d piece%s per absorbed item\n",
               kva__cpu_plan_kernel(plan, KVA__KERNEL_MLA), (int)sp.split,
               sp.split == 1 ? "" : "s");
    if (o.compare_split)
        printf("  without split-KV: median %.3f ms, min %.3f ms -> %.2f GB/s (split: %.2fx)\n",
               tms[o.iters / 2] * 1e3, tms[0] * 1e3, bytes / tms[o.iters / 2] / 1e9,
               tms[o.iters / 2] / med);
    printf("  time median %.3f ms, min %.3f ms (%d iters)\n", med * 1e3, best * 1e3, o.iters);
    printf("  latent bytes %.1f MB -> %.2f GB/s; %.2f GFLOP -> %.1f GFLOP/s\n", bytes / 1e6,
           bytes / med / 1e9, flops / 1e9, flops / med / 1e9);
    if (o.paired && !o.cuda) {
        /* Each run's latent bytes over its time, against the read pass after it. */
        for (int k = 0; k < o.iters; k++)
            ptm[k] = pbw[k] > 0 ? bytes / 1e9 / (ptm[k] * pbw[k]) : 0;
        const double pfrac = bench_median(ptm, o.iters), pb = bench_median(pbw, o.iters);
        printf("  paired read: %.1f%% of the read bandwidth (median over %d runs; read passes "
               "%.2f GB/s)\n",
               100.0 * pfrac, o.iters, pb);
        kva_cli_reader_close(&rd);
    }
    if (ct.has_phases) {
        const double *p = ct.phase;
        printf("  phases (medians of %d timed runs): absorbed %.3f ms, decompress %.3f ms, "
               "attention %.3f ms, merge %.3f ms\n",
               o.iters, p[0] * 1e3, p[1] * 1e3, p[2] * 1e3, p[3] * 1e3);
        if (p[2] > 0)
            printf("  compute-friendly attention: %.2f GFLOP -> %.1f TFLOP/s (kernel part)\n",
                   attn_flops / 1e9, attn_flops / p[2] / 1e12);
    }
    if (!o.no_ceiling) {
        const int nt = kva_context_num_threads(ctx);
        const double bw = kva_cli_measure_read_bw(nt);
        const char *isa = NULL;
        const double peak = kva_cli_measure_fma_peak(nt, &isa);
        /* Both ceilings come in GB/s and GFLOP/s. */
        printf("  ceilings: read %.2f GB/s (%.0f%% of it), FMA peak %.1f GFLOP/s %s (%.0f%%)\n", bw,
               100.0 * bytes / med / 1e9 / bw, peak, isa ? isa : "",
               100.0 * flops / med / 1e9 / peak);
    }
    rc = KVA_EXIT_OK;
    if (nan) {
        fprintf(stderr, "kvattn: bench --mla: the output holds NaN\n");
        rc = KVA_EXIT_LIBRARY;
    }
    if (!o.no_check && !o.kernel) {
        /* Request 0, and the prefill of a mixed batch. */
        for (int32_t r = 0; r < b.R; r += (o.mode == 2 ? b.R - 1 : b.R)) {
            double le = 0;
            const double e = check_request(&o, &b, cache, r, q, wuk, wuv, out, lse, &le);
            const double tol = o.dt == KVA_DTYPE_F32 ? 1e-4 : 2.0 / 128;
            /* The CUDA paths round q_abs, the latent output and the decompressed K
             * to the input dtype (the CPU's fp32 items keep them in f32): their
             * LSE moves by the dtype's rounding of the scores; the CPU's
             * mla_avx512bf16 rounds q_abs over a bf16 cache (tests/test_mla.c's
             * bound). */
            const char *kn = o.cuda ? NULL : kva__cpu_plan_kernel(plan, KVA__KERNEL_MLA);
            const int bf16dot =
                kn && !strcmp(kn, "mla_avx512bf16") && o.dt == KVA_DTYPE_BF16 && !o.fp8;
            const double lse_tol = o.cuda && o.dt != KVA_DTYPE_F32 ? 1e-2
                                   : bf16dot                       ? KVA_TEST_MLA_BF16DOT_LSE_ATOL
                                                                   : 1e-3;
            const int ok = e >= 0 && e <= tol && le <= lse_tol;
            printf("  check vs ref (request %d, heads 0-1): max err %.2g of the row max, lse "
                   "%.2g: %s\n",
                   (int)r, e, le, ok ? "ok" : "FAILED");
            if (!ok)
                rc = KVA_EXIT_LIBRARY;
            if (o.mode != 2)
                break;
        }
    }
    kva_plan_destroy(plan);
    kva_cache_destroy(cache);
    kva_context_destroy(ctx);
    free(q);
    free(out);
    free(wuk);
    free(wuv);
    free(lse);
    free(tms);
    free(ptm);
    free(pbw);
    free(b.qsl);
    free(b.sl);
    free(b.bt);
    return rc;
}
