/*
 * cmd_serve_sim.c - `kvattn serve-sim`: parses the options, runs the
 * simulation (tools/serve_*.c, docs/serve-sim.md) and prints vllm bench
 * serve's result table.
 */
#include "cli.h"
#include "serve_sim.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void kva_cli_usage_serve_sim(void)
{
    serve_opts d;
    serve_opts_init(&d);
    printf("usage: kvattn serve-sim [options]\n"
           "\n"
           "Simulates an LLM server on the real library: a vLLM-v1-style scheduler\n"
           "(continuous batching, token budget, chunked prefill, preemption by recompute)\n"
           "over the block pool with prefix caching, and a model of L attention layers with\n"
           "random q/K/V; each step writes K/V into the paged caches and runs attention for\n"
           "every layer. Prints vllm bench serve's result table. Time is the measured wall\n"
           "time of the steps (idle gaps between arrivals are skipped, not slept).\n"
           "\n"
           "workload (vllm bench serve --dataset-name random):\n"
           "  --num-prompts N          requests                         [%d]\n"
           "  --input-len N            prompt tokens after the prefix   [%d]\n"
           "  --output-len N           generated tokens per request     [%d]\n"
           "  --range-ratio r          lengths uniform in len*(1-r)..len*(1+r), 0 <= r < 1 [%g]\n"
           "  --prefix-len N           shared prefix tokens of every prompt [%d]\n"
           "  --request-rate R|inf     Poisson arrivals, requests/s; inf = all at once [inf]\n"
           "  --max-concurrency N      most requests in flight, 0 = no limit [0]\n"
           "  --seed N                 workload and data seed           [%llu]\n"
           "scheduler:\n"
           "  --max-num-batched-tokens N  token budget of a step        [%d]\n"
           "  --max-num-seqs N         most running requests            [%d]\n"
           "  --no-chunked-prefill     a prefill must fit one step's budget whole\n"
           "  --no-prefix-caching      no prefix cache in the block pool\n"
           "  --hash sha256|xxh3       block hash of the prefix cache   [sha256]\n"
           "  --cascade auto|off|on    cascade plans (docs/cascade.md)  [auto]\n"
           "  --attention-chunk C      chunked local attention of C tokens in the local\n"
           "                           layers (Llama 4; docs/masks.md), 0 = none [0]\n"
           "  --chunk-global-every N   with a chunk: every N-th layer is global, 0 = none [0]\n",
           (int)d.num_prompts, (int)d.input_len, (int)d.output_len, d.range_ratio,
           (int)d.prefix_len, (unsigned long long)d.seed, (int)d.max_num_batched_tokens,
           (int)d.max_num_seqs);
    printf("model (one slice of Llama-3-8B's attention by default):\n"
           "  --model NAME             a preset; the flags below apply on top of it:\n");
    serve_print_models(stdout);
    printf("  --layers L               attention layers                 [%d]\n"
           "  --num-heads H            query heads                      [%d]\n"
           "  --num-kv-heads Hkv       kv heads (H multiple of Hkv; not MLA) [%d]\n"
           "  --head-dim D             head size, multiple of 8, <= 576 (CUDA 256; not MLA) [%d]\n"
           "  --block-size B           tokens per cache block           [%d]\n"
           "  --dtype f32|f16|bf16     q, cache and output dtype        [bf16]\n"
           "  --kv-quant none|int8|int8-token|int8-token-v16|fp8\n"
           "                           quantized cache format (docs/quant.md; MLA: none\n"
           "                           or fp8)                          [none]\n"
           "  --num-blocks NB          blocks per layer cache (and pool), 0 = from\n"
           "                           --kv-cache-mem                   [0]\n"
           "  --kv-cache-mem SIZE      K+V memory of all layers, e.g. 512M, 2G [512M]\n"
           "run:\n"
           "  --backend ref|cpu|cuda   attention backend; cuda: GPU 0, one stream\n"
           "                           synchronization per step         [cpu]\n"
           "  --threads N              CPU threads, 0 = all cores (not with cuda) [0]\n"
           "  --dcp                    decode context parallelism over the ranks of\n"
           "                           mpirun -np N (MPI builds; docs/dcp.md): each rank\n"
           "                           keeps 1/N of the KV cache, the MPI combine joins\n"
           "                           the partial outputs; rank 0 prints\n"
           "  --dcp-interleave I       tokens in a row per rank, dividing B [B]\n"
           "  --verify                 check sampled steps against the reference backend\n"
           "                           and the pool invariants after every step; exit 1 on\n"
           "                           a mismatch\n"
           "  --plan-create            kva_plan_create + destroy every step instead of\n"
           "                           updating one plan (kva_plan_update), to compare\n"
           "  --cuda-upload-min SIZE   benchmarks: every CUDA plan's metadata copy spans\n"
           "                           at least SIZE bytes of the buffer, 0 = its used\n"
           "                           bytes (the copy's host cost by size)  [32K]\n"
           "  --cuda-staging-hot SIZE  benchmarks: the half of the CUDA context's hot\n"
           "                           staging ring (uploads up to SIZE); 0 = none\n"
           "                           (every upload in the large ring)     [128K]\n"
           "  --plan-probe MODE        benchmarks (cuda): split each decode-only step's\n"
           "                           plan time into its phases (medians printed); 2: a\n"
           "                           stream query before the plan, 3: the plan again\n"
           "                           right after (warm caches), 4: an event record\n"
           "                           before the plan  [0]\n"
           "  --json FILE              also write the results as JSON (vllm's field names)\n"
           "  --progress, --no-progress  progress bar on stderr [on when stderr is a tty]\n"
           "\n"
           "Exit status: 0 success, 1 library error or failed check, 2 bad usage.\n",
           (int)d.layers, (int)d.heads, (int)d.kv_heads, (int)d.head_dim, (int)d.block_size);
}

/* "512M", "2G", "1.5G", "65536K" or plain bytes; binary units. */
static int parse_size(const char *flag, const char *s, int64_t *out)
{
    char *end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    double mul = 1.0;
    if (end != s + kva_cli_number_len(s, 1))
        end = (char *)s; /* " 5M", "+5M", "0x5M": not a number (docs/cli.md) */
    if (end != s && *end) {
        switch (*end) {
        case 'k':
        case 'K':
            mul = 1024.0;
            break;
        case 'm':
        case 'M':
            mul = 1024.0 * 1024.0;
            break;
        case 'g':
        case 'G':
            mul = 1024.0 * 1024.0 * 1024.0;
            break;
        default:
            mul = 0.0;
        }
        end++;
        if (*end == 'i' && end[1] == 'B')
            end += 2;
        else if (*end == 'B')
            end++;
    }
    if (end == s || *end != '\0' || mul == 0.0 || errno == ERANGE || !isfinite(v) || v <= 0) {
        fprintf(stderr, "kvattn: %s: '%s' is not a size (e.g. 512M, 2G, or bytes)\n", flag, s);
        return 0;
    }
    if (v * mul > 1e15) {
        fprintf(stderr, "kvattn: %s: '%s' is too large (at most 1e15 bytes)\n", flag, s);
        return 0;
    }
    *out = (int64_t)(v * mul);
    return 1;
}

/* Parses argv into o; returns -1 on success, else the exit status. */
static int parse_serve(int argc, char **argv, serve_opts *o, const char **json)
{
    static const char *const dtypes[] = {"f32", "f16", "bf16"};
    static const kva_dtype dtype_vals[] = {KVA_DTYPE_F32, KVA_DTYPE_F16, KVA_DTYPE_BF16};
    static const char *const backends[] = {"ref", "cpu", "cuda"};
    static const char *const hashes[] = {"sha256", "xxh3"};
    static const char *const value_flags[] = {"--num-prompts",
                                              "--input-len",
                                              "--output-len",
                                              "--range-ratio",
                                              "--prefix-len",
                                              "--request-rate",
                                              "--max-concurrency",
                                              "--seed",
                                              "--max-num-batched-tokens",
                                              "--max-num-seqs",
                                              "--hash",
                                              "--layers",
                                              "--num-heads",
                                              "--num-kv-heads",
                                              "--head-dim",
                                              "--block-size",
                                              "--dtype",
                                              "--kv-quant",
                                              "--num-blocks",
                                              "--kv-cache-mem",
                                              "--cuda-upload-min",
                                              "--plan-probe",
                                              "--cuda-staging-hot",
                                              "--backend",
                                              "--threads",
                                              "--json",
                                              "--model",
                                              "--cascade",
                                              "--attention-chunk",
                                              "--chunk-global-every",
                                              "--dcp-interleave"};
    const int32_t BIG = 1 << 24;
    int threads_set = 0, mha_shape_set = 0, global_every_set = 0;
    serve_opts_init(o);
    o->progress = isatty(STDERR_FILENO);
    *json = NULL;
    /* --model first, wherever it stands, so that the other flags refine it. */
    for (int i = 1; i < argc; i++) {
        if (!kva_cli_flag_is(argv[i], "--model"))
            continue;
        const char *val = kva_cli_flag_value(argc, argv, &i, "--model");
        if (!val)
            return KVA_EXIT_USAGE;
        if (!serve_opts_set_model(o, val)) {
            fprintf(stderr, "kvattn: --model: unknown preset '%s'; presets:\n", val);
            serve_print_models(stderr);
            return KVA_EXIT_USAGE;
        }
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int k = 0, ok = 1;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            kva_cli_usage_serve_sim();
            return KVA_EXIT_OK;
        }
        if (strcmp(a, "--no-chunked-prefill") == 0) {
            o->chunked_prefill = 0;
            continue;
        }
        if (strcmp(a, "--no-prefix-caching") == 0) {
            o->prefix_caching = 0;
            continue;
        }
        if (strcmp(a, "--plan-create") == 0) {
            o->plan_create = 1;
            continue;
        }
        if (strcmp(a, "--verify") == 0) {
            o->verify = 1;
            o->check_pool = 1;
            continue;
        }
        if (strcmp(a, "--dcp") == 0) {
            o->dcp = -1; /* N and the rank come from MPI (kva_cli_serve_sim) */
            continue;
        }
        if (strcmp(a, "--progress") == 0 || strcmp(a, "--no-progress") == 0) {
            o->progress = a[2] == 'p';
            continue;
        }
        const char *f = NULL;
        for (size_t n = 0; n < sizeof value_flags / sizeof value_flags[0]; n++)
            if (kva_cli_flag_is(a, value_flags[n]))
                f = value_flags[n];
        if (!f) {
            fprintf(stderr, "kvattn serve-sim: unknown option '%s' (see kvattn serve-sim --help)\n",
                    a);
            return KVA_EXIT_USAGE;
        }
        const char *val = kva_cli_flag_value(argc, argv, &i, f);
        if (!val)
            return KVA_EXIT_USAGE;
        if (!strcmp(f, "--num-prompts"))
            ok = kva_cli_parse_i32(f, val, 1, BIG, &o->num_prompts);
        else if (!strcmp(f, "--input-len"))
            ok = kva_cli_parse_i32(f, val, 0, BIG, &o->input_len);
        else if (!strcmp(f, "--output-len"))
            ok = kva_cli_parse_i32(f, val, 1, BIG, &o->output_len);
        else if (!strcmp(f, "--range-ratio"))
            ok = kva_cli_parse_double(f, val, 0.0, 0.999, &o->range_ratio);
        else if (!strcmp(f, "--prefix-len"))
            ok = kva_cli_parse_i32(f, val, 0, BIG, &o->prefix_len);
        else if (!strcmp(f, "--request-rate")) {
            if (strcmp(val, "inf") == 0)
                o->request_rate = 0.0;
            else
                ok = kva_cli_parse_double(f, val, 1e-6, 1e9, &o->request_rate);
        } else if (!strcmp(f, "--max-concurrency"))
            ok = kva_cli_parse_i32(f, val, 0, BIG, &o->max_concurrency);
        else if (!strcmp(f, "--seed"))
            ok = kva_cli_parse_u64(f, val, &o->seed);
        else if (!strcmp(f, "--max-num-batched-tokens"))
            ok = kva_cli_parse_i32(f, val, 1, BIG, &o->max_num_batched_tokens);
        else if (!strcmp(f, "--max-num-seqs"))
            ok = kva_cli_parse_i32(f, val, 1, BIG, &o->max_num_seqs);
        else if (!strcmp(f, "--cascade")) {
            static const char *const modes[] = {"auto", "off", "on"};
            ok = kva_cli_parse_choice(f, val, modes, 3, &k);
            o->cascade = k; /* KVA_CASCADE_AUTO, _OFF, _ON in this order */
        } else if (!strcmp(f, "--attention-chunk"))
            ok = kva_cli_parse_i32(f, val, 0, KVA_MAX_SEQ_LEN, &o->attention_chunk);
        else if (!strcmp(f, "--chunk-global-every"))
            ok = global_every_set = kva_cli_parse_i32(f, val, 0, 1024, &o->chunk_global_every);
        else if (!strcmp(f, "--hash")) {
            ok = kva_cli_parse_choice(f, val, hashes, 2, &k);
            o->hash = k == 0 ? KVA_POOL_HASH_SHA256 : KVA_POOL_HASH_XXH3_128;
        } else if (!strcmp(f, "--layers"))
            ok = kva_cli_parse_i32(f, val, 1, 1024, &o->layers);
        else if (!strcmp(f, "--num-heads"))
            ok = kva_cli_parse_i32(f, val, 1, KVA_MAX_HEADS, &o->heads);
        else if (!strcmp(f, "--num-kv-heads")) {
            ok = kva_cli_parse_i32(f, val, 1, KVA_MAX_HEADS, &o->kv_heads);
            mha_shape_set = 1;
        } else if (!strcmp(f, "--head-dim")) {
            ok = kva_cli_parse_i32(f, val, 8, KVA_MAX_HEAD_DIM, &o->head_dim);
            mha_shape_set = 1;
        } else if (!strcmp(f, "--dcp-interleave"))
            ok = kva_cli_parse_i32(f, val, 1, 65536, &o->dcp_interleave);
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
        } else if (!strcmp(f, "--num-blocks"))
            ok = kva_cli_parse_i32(f, val, 0, 1 << 30, &o->num_blocks);
        else if (!strcmp(f, "--kv-cache-mem"))
            ok = parse_size(f, val, &o->kv_cache_mem);
        else if (!strcmp(f, "--cuda-upload-min")) {
            o->cuda_upload_min = 0;
            ok = !strcmp(val, "0") || parse_size(f, val, &o->cuda_upload_min);
            if (ok && o->cuda_upload_min > ((int64_t)1 << 30)) {
                fprintf(stderr, "kvattn: --cuda-upload-min: at most 1G\n");
                ok = 0;
            }
        } else if (!strcmp(f, "--cuda-staging-hot")) {
            o->cuda_staging_hot = 0;
            ok = !strcmp(val, "0") || parse_size(f, val, &o->cuda_staging_hot);
            if (ok && (o->cuda_staging_hot > ((int64_t)64 << 20) || o->cuda_staging_hot % 256)) {
                fprintf(stderr, "kvattn: --cuda-staging-hot: a multiple of 256 up to 64M\n");
                ok = 0;
            }
        } else if (!strcmp(f, "--plan-probe")) {
            ok = kva_cli_parse_i32(f, val, 0, 4, &o->plan_probe);
        } else if (!strcmp(f, "--backend")) {
            ok = kva_cli_parse_choice(f, val, backends, 3, &k);
            o->backend = (kva_backend)k;
        } else if (!strcmp(f, "--threads")) {
            ok = kva_cli_parse_i32(f, val, 0, KVA_MAX_THREADS, &o->threads);
            threads_set = 1;
        } else if (!strcmp(f, "--json")) {
            *json = val;
            if (!*val) {
                fprintf(stderr, "kvattn: --json: empty file name\n");
                ok = 0;
            }
        }
        if (!ok)
            return KVA_EXIT_USAGE;
    }
    if (o->kind == KVA_ATTN_MLA) {
        if (mha_shape_set) {
            fprintf(stderr, "kvattn: --num-kv-heads / --head-dim: an MLA model's layers have one "
                            "latent kv head of the preset's Dc + Dr\n");
            return KVA_EXIT_USAGE;
        }
        if (o->kv_quant != KVA_QUANT_NONE && o->kv_quant != KVA_QUANT_FP8_E4M3) {
            fprintf(stderr, "kvattn: --kv-quant %s: an MLA latent cache is unquantized or fp8\n",
                    kva_quant_name(o->kv_quant));
            return KVA_EXIT_USAGE;
        }
        if (o->attention_chunk > 0) {
            fprintf(stderr, "kvattn: --attention-chunk %d: MLA layers take no local chunk\n",
                    (int)o->attention_chunk);
            return KVA_EXIT_USAGE;
        }
    } else if (o->head_dim % 8 != 0) {
        fprintf(stderr, "kvattn: --head-dim %d: must be a multiple of 8\n", (int)o->head_dim);
        return KVA_EXIT_USAGE;
    }
    /* kvattn.h: MLA plans and plans with a local chunk decline a cascade, and
     * KVA_CASCADE_ON makes kva_plan_create fail on them (UNSUPPORTED): a
     * combination of options that kvattn.h refuses is a usage error, found
     * before the run (the local layers of a --chunk-global-every model too). */
    if (o->cascade == KVA_CASCADE_ON && (o->kind == KVA_ATTN_MLA || o->attention_chunk > 0)) {
        fprintf(stderr, "kvattn: --cascade on: %s take no cascade (kvattn.h); use auto or off\n",
                o->kind == KVA_ATTN_MLA ? "an MLA model's layers"
                                        : "layers with a local chunk (--attention-chunk)");
        return KVA_EXIT_USAGE;
    }
    /* A preset's N stays with --attention-chunk 0 (every layer global); a
     * given N without a chunk would be ignored, so it is refused. */
    if (global_every_set && o->chunk_global_every > 0 && o->attention_chunk == 0) {
        fprintf(stderr,
                "kvattn: --chunk-global-every %d needs --attention-chunk (or a preset "
                "with local layers)\n",
                (int)o->chunk_global_every);
        return KVA_EXIT_USAGE;
    }
    if (o->kind != KVA_ATTN_MLA && o->heads % o->kv_heads != 0) {
        fprintf(stderr, "kvattn: --num-heads %d is not a multiple of --num-kv-heads %d\n",
                (int)o->heads, (int)o->kv_heads);
        return KVA_EXIT_USAGE;
    }
    if (o->dcp) {
        char why[160];
        const char *bad = why;
        if (!serve_dcp_available(why, sizeof why))
            bad = why;
        else if (o->backend == KVA_BACKEND_CUDA)
            bad = "--backend cuda (the MPI combine works on host memory)";
        else if (o->kind == KVA_ATTN_MLA)
            bad = "an MLA model";
        else if (o->cascade == KVA_CASCADE_ON)
            bad = "--cascade on (sharded plans take no cascade)";
        else if (o->dcp_interleave && o->block_size % o->dcp_interleave != 0)
            bad = "a --dcp-interleave that does not divide --block-size";
        else
            bad = NULL;
        if (bad) {
            fprintf(stderr, "kvattn: --dcp: not with %s\n", bad);
            return KVA_EXIT_USAGE;
        }
    } else if (o->dcp_interleave) {
        fprintf(stderr, "kvattn: --dcp-interleave needs --dcp\n");
        return KVA_EXIT_USAGE;
    }
    if (o->num_blocks == 1) {
        fprintf(stderr, "kvattn: --num-blocks 1: the pool needs at least 2 blocks (block 0 is "
                        "the null block)\n");
        return KVA_EXIT_USAGE;
    }
    if ((int64_t)o->prefix_len + (int64_t)(o->input_len * (1.0 + o->range_ratio)) +
            (int64_t)(o->output_len * (1.0 + o->range_ratio)) >
        (1 << 30)) {
        fprintf(stderr, "kvattn: --prefix-len + --input-len + --output-len is too large\n");
        return KVA_EXIT_USAGE;
    }
    if (o->kv_quant == KVA_QUANT_INT8_TOKEN_K_V16 && o->dtype == KVA_DTYPE_F32) {
        fprintf(stderr, "kvattn: --kv-quant int8-token-v16 keeps V in the 16-bit --dtype: use "
                        "--dtype f16 or bf16, not f32\n");
        return KVA_EXIT_USAGE;
    }
    if (o->backend == KVA_BACKEND_CUDA && threads_set) {
        fprintf(stderr,
                "kvattn: --threads %d: the cuda backend runs on GPU 0, not on CPU "
                "threads (leave --threads out)\n",
                (int)o->threads);
        return KVA_EXIT_USAGE;
    }
    if (o->backend == KVA_BACKEND_CUDA) {
        /* Without a GPU (or a CUDA build) the run cannot start: say why. The
         * backend's own limits (shapes, dtypes) are found by the engine's
         * warm-up step, before the run. */
        char why[200];
        if (!serve_dev_available(why, sizeof why)) {
            fprintf(stderr, "kvattn serve-sim: --backend cuda: %s\n", why);
            return KVA_EXIT_LIBRARY;
        }
        if (!kva_backend_available(KVA_BACKEND_CUDA)) {
            fprintf(stderr, "kvattn serve-sim: --backend cuda: the library's CUDA backend is not "
                            "available (see kvattn info)\n");
            return KVA_EXIT_LIBRARY;
        }
    }
    /* An unwritable --json file is found now, not after the whole run. The
     * probe leaves an existing file as it was and removes one it created. */
    if (*json) {
        int existed = access(*json, F_OK) == 0;
        FILE *jf = fopen(*json, "a");
        if (!jf) {
            fprintf(stderr, "kvattn: --json '%s': cannot write the file: %s\n", *json,
                    strerror(errno));
            return KVA_EXIT_USAGE;
        }
        fclose(jf);
        if (!existed)
            remove(*json);
    }
    return -1;
}

int kva_cli_serve_sim(int argc, char **argv)
{
    serve_opts o;
    const char *json = NULL;
    int rc = parse_serve(argc, argv, &o, &json);
    if (rc >= 0)
        return rc;
    /* --dcp: every rank parsed the same command line, so the same checks
     * passed on all of them before MPI starts; rank 0 prints. */
    const int dcp = o.dcp != 0;
    if (dcp) {
        if (!serve_dcp_init(NULL, NULL, &o)) {
            fprintf(stderr, "kvattn serve-sim: --dcp: MPI_Init failed\n");
            return KVA_EXIT_LIBRARY;
        }
        if (o.heads % o.dcp != 0) {
            if (o.dcp_rank == 0)
                fprintf(stderr,
                        "kvattn serve-sim: --dcp: %d heads are not a multiple of %d ranks\n",
                        (int)o.heads, (int)o.dcp);
            serve_dcp_finalize();
            return KVA_EXIT_USAGE;
        }
        if (o.dcp_rank != 0)
            o.progress = 0;
    }
    serve_run run;
    kva_status st = serve_sim_run(&o, NULL, NULL, &run);
    if (st != KVA_STATUS_OK) {
        fprintf(stderr, "kvattn serve-sim: %s\n", run.error);
        if (dcp) /* the other ranks may wait in a collective */
            serve_dcp_abort(KVA_EXIT_LIBRARY);
        serve_run_free(&run);
        /* A configuration the run cannot finish (checked before it starts) is
         * bad usage; anything else is a library failure. */
        return st == KVA_STATUS_INVALID_ARGUMENT || st == KVA_STATUS_POOL_EXHAUSTED
                   ? KVA_EXIT_USAGE
                   : KVA_EXIT_LIBRARY;
    }
    serve_opts_resolve(&o);
    serve_metrics m;
    if (!serve_metrics_compute(&run, &m)) {
        fprintf(stderr, "kvattn serve-sim: out of memory for the metrics\n");
        serve_run_free(&run);
        return KVA_EXIT_LIBRARY;
    }
    rc = KVA_EXIT_OK;
    if (dcp && o.dcp_rank != 0) {
        serve_run_free(&run);
        serve_dcp_finalize();
        return rc;
    }
    serve_print_header(stdout, &o, &run);
    serve_print_table(stdout, &o, &run, &m);
    if (json && serve_write_json(json, &o, &run, &m) != 0) {
        fprintf(stderr, "kvattn: cannot write --json file '%s'\n", json);
        rc = KVA_EXIT_LIBRARY;
    }
    if (o.verify && run.stats.verify_failures > 0) {
        fprintf(stderr,
                "kvattn serve-sim: --verify: %d of %d checked steps differ from the reference "
                "backend (max abs err %.3g); first: %s\n",
                (int)run.stats.verify_failures, (int)run.stats.verify_steps,
                run.stats.verify_max_err, run.verify_error);
        rc = KVA_EXIT_LIBRARY;
    }
    serve_run_free(&run);
    if (dcp)
        serve_dcp_finalize();
    return rc;
}
