/*
 * serve_sim.h - `kvattn serve-sim`: a serving-workload simulation that drives
 * the real library end to end (docs/serve-sim.md).
 *
 * Pieces, one file each:
 *   serve_workload.c  the requests: lengths, token ids, arrival times (vLLM's
 *                     random dataset with a shared prefix, Poisson arrivals)
 *   serve_sched.c     the scheduler: continuous batching with a token budget,
 *                     chunked prefill, max_num_seqs, prefix-cache lookups
 *                     through kva_pool, preemption by recompute
 *   serve_model.c     the model: presets (--model), tensor and cache sizes per
 *                     token, the caches, the plan, one layer's attention call
 *                     (kva_attention_run, or kva_mla_run for MLA layers)
 *   serve_engine.c    the engine: L layers, one kva_cache each; per step one
 *                     plan, then the cache write and attention per layer
 *   serve_verify.c    the optional check of sampled steps against the
 *                     reference backend (--verify)
 *   serve_sim.c       the loop: virtual clock, concurrency gate, token times
 *   serve_metrics.c   vllm bench serve's metrics, the table and the JSON
 *   serve_device.c    --backend cuda: stream, events, device buffers (CUDA
 *                     runtime; stubs in builds without it)
 *
 * The module uses only the public API (include/kvattn.h, kvattn_cuda.h), the
 * C library and (serve_device.c, CUDA builds of the CLI) the CUDA runtime, so
 * tests/test_serve_sim.c compiles it directly.
 *
 * Shape glossary as in kvattn.h: T tokens, R requests, H query heads, Hkv kv
 * heads, D head size, B block size, NB blocks, L layers; MLA (docs/mla.md):
 * Dc latent width, Dr rotary width, Dn non-rotary query/key width, Dv value
 * width.
 */
#ifndef KVA_SERVE_SIM_H
#define KVA_SERVE_SIM_H

#include "kvattn.h"

#include <stdint.h>
#include <stdio.h>

/* Everything the command line sets (serve_opts_init gives the defaults). */
typedef struct serve_opts {
    /* Model: L layers of attention with these shapes; random q/K/V. */
    kva_backend backend;
    int32_t threads; /* CPU threads, 0 = all cores */
    int32_t layers;  /* L */
    int32_t heads;   /* H */
    int32_t kv_heads;
    int32_t head_dim; /* D (= Dv) */
    /* MLA layers (kind KVA_ATTN_MLA): every layer is MLA over a latent cache
     * [NB, B, Dc + Dr]; kv_heads and head_dim are not used then. */
    kva_attn_kind kind;
    int32_t mla_kv_rank;  /* Dc (kv_lora_rank) */
    int32_t mla_rope_dim; /* Dr (qk_rope_head_dim) */
    int32_t mla_nope_dim; /* Dn (qk_nope_head_dim) */
    int32_t mla_v_dim;    /* Dv (v_head_dim) */
    /* Chunked local attention (Llama 4, docs/masks.md): the local layers'
     * plans take attention_chunk C; every chunk_global_every-th layer (l % N
     * == N - 1) is global (no chunk); 0 = every layer local. C = 0: none. */
    int32_t attention_chunk;
    int32_t chunk_global_every;
    int32_t block_size;
    kva_dtype dtype;      /* q, output and (unquantized) cache dtype */
    kva_quant kv_quant;   /* cache format (docs/quant.md); KVA_QUANT_NONE by default */
    int32_t num_blocks;   /* NB of every layer's cache and of the pool; 0 = from kv_cache_mem */
    int64_t kv_cache_mem; /* bytes of K+V over all layers when num_blocks is 0 */
    int prefix_caching;   /* 1: the pool caches full blocks by content */
    kva_pool_hash hash;   /* the pool's block hash */
    int32_t cascade;      /* kva_cascade_mode of every step's plan (0 = automatic) */
    /* Scheduler. */
    int32_t max_num_batched_tokens; /* token budget of one step */
    int32_t max_num_seqs;           /* most running requests */
    int chunked_prefill;            /* 0: a prefill must fit the budget whole */
    /* Workload (vllm bench serve --dataset-name random). */
    int32_t num_prompts;
    int32_t input_len;       /* random part of the prompt, after the shared prefix */
    int32_t output_len;      /* tokens generated per request (no early stop) */
    int32_t prefix_len;      /* shared prefix tokens in front of every prompt */
    double range_ratio;      /* lengths uniform in [len * (1 - r), len * (1 + r)] */
    double request_rate;     /* requests per second (vLLM's Poisson); 0 = all at time 0 */
    int32_t max_concurrency; /* most requests in flight; 0 = no limit */
    uint64_t seed;
    /* Checks and output. */
    int verify;               /* compare sampled steps with the reference backend */
    int plan_create;          /* --plan-create: a new plan each step (no kva_plan_update) */
    int64_t cuda_upload_min;  /* --cuda-upload-min: a CUDA plan's metadata copy spans at
                                 least this many bytes (kva__cuda_context_upload_min);
                                 -1: the library's default */
    int64_t cuda_staging_hot; /* --cuda-staging-hot: the hot staging ring's half
                                 (kva__cuda_context_staging_hot); -1: the default */
    int32_t plan_probe;       /* --plan-probe MODE (CUDA, benchmarks): 1 the plan's time split
                                 into its phases per decode-only step; 2 also a stream query
                                 (timed) before the plan; 3 also the same plan again (warm);
                                 4 also an event record (timed) before the plan */
    int check_pool;           /* kva_pool_check after every step */
    int progress;             /* progress bar on stderr */
    /* Tests only (no flag): a fault injected into every checked layer, which
     * --verify must report. SERVE_FAULT_OUTPUT adds 1 to the first output
     * element before the comparison (every backend); SERVE_FAULT_SLOT
     * writes the step's first new token at the last one's slot (host
     * backends; CUDA steps upload their slots once, before the layers). */
    int fault;
    /* --dcp (serve_dcp.c, docs/dcp.md): decode context parallelism over the
     * ranks of MPI_COMM_WORLD (mpirun -np N). dcp = N (0: off); dcp_rank is
     * this process's rank; dcp_interleave I (0: B) tokens in a row per rank.
     * Every rank runs the same scheduler over a pool of NB blocks of N * B
     * tokens; its caches keep the rank's B tokens of each such block. */
    int32_t dcp, dcp_rank, dcp_interleave;
} serve_opts;

enum { SERVE_FAULT_NONE = 0, SERVE_FAULT_OUTPUT = 1, SERVE_FAULT_SLOT = 2 };

void serve_opts_init(serve_opts *o);
/* Resolves num_blocks from kv_cache_mem when it is 0. */
void serve_opts_resolve(serve_opts *o);

/* ---- serve_model.c ---- */

/* Tokens per block of the pool: B, or N * B under --dcp (serve_model.c). */
int32_t serve_pool_block_size(const serve_opts *o);

/* Applies the preset `name` (--model); returns 0 if there is none. */
int serve_opts_set_model(serve_opts *o, const char *name);
/* One line per preset for --help. */
void serve_print_models(FILE *f);

/* Elements per token of the model's tensors (in the model's dtype). */
typedef struct serve_shape {
    size_t q;          /* query: H * D (MLA: H * (Dn + Dr)) */
    size_t k, v;       /* the cache write's sources: Hkv * D each (MLA: c_kv Dc, k_pe Dr) */
    size_t out;        /* output: H * D (MLA: H * Dv) */
    size_t unit;       /* elements of one query head: the shift unit of the random slices */
    size_t w_uk, w_uv; /* elements of one layer's W_UK [H, Dn, Dc], W_UV [H, Dc, Dv]; 0 for MHA */
} serve_shape;

void serve_model_shape(const serve_opts *o, serve_shape *s);
/* Bytes of KV cache per token over all layers, as the format stores them
 * (MLA: the latent row). */
int64_t serve_token_bytes(const serve_opts *o);
/* The same for an MHA model of the same heads (MLA: H * (Dn + Dr + Dv)
 * elements per token and layer); serve_token_bytes for MHA models. */
int64_t serve_token_bytes_mha(const serve_opts *o);
/* Bytes of K and V storage of one block over all layers. */
int64_t serve_block_bytes(const serve_opts *o);
/* Creates one layer's cache on ctx: the model's shape, the NHD layout and
 * --kv-quant's format with the static scales serve-sim uses. */
kva_status serve_cache_create(kva_context *ctx, const serve_opts *o, kva_cache **out);
/* 1 if layer l is a local (chunked) layer: attention_chunk > 0 and l is not
 * one of the every-N-th global layers. */
int serve_layer_local(const serve_opts *o, int32_t l);
/* The plan descriptor of a step: causal, no window, the model's shapes
 * (MLA: the latent cache's, the layer-level head sizes, scale 1/sqrt(Dn + Dr));
 * local != 0: the local layers' attention_chunk. */
kva_plan_desc serve_step_desc(const serve_opts *o, int32_t R, const int32_t *qsl,
                              const int32_t *seq_lens, const int32_t *bt, int32_t stride,
                              int local);
/* One layer's attention: kva_attention_run, or for MLA kva_mla_run with the
 * layer's weights (w_uk, w_uv unused for MHA). out: [T, shape.out]. */
kva_status serve_layer_attention(kva_context *ctx, const serve_opts *o, const kva_plan *plan,
                                 const void *q, const void *w_uk, const void *w_uv,
                                 const kva_cache *cache, void *out);

/* One request of the workload and what happened to it. */
typedef enum serve_req_state {
    SERVE_REQ_PENDING = 0, /* not yet arrived, or held back by max_concurrency */
    SERVE_REQ_WAITING = 1, /* submitted, in the waiting queue */
    SERVE_REQ_RUNNING = 2,
    SERVE_REQ_FINISHED = 3
} serve_req_state;

typedef struct serve_req {
    int32_t prompt_len;
    int32_t output_len;
    int32_t *tokens;  /* [prompt_len + output_len] token ids, the outputs fixed in advance */
    double arrival_s; /* arrival time (0 for all when request_rate is 0) */
    /* Progress. */
    serve_req_state state;
    int32_t num_tokens;   /* prompt + generated tokens so far */
    int32_t num_computed; /* tokens whose KV is in the cache */
    int32_t num_output;   /* generated tokens */
    int32_t pool_id;      /* kva_pool request id, -1 when it holds no blocks */
    int32_t num_preemptions;
    /* Times on the virtual clock. */
    double submit_s; /* sent to the engine (after the concurrency gate) */
    double *token_s; /* [output_len] time of each generated token */
} serve_req;

/* Per-step counters the engine and the scheduler add up. */
typedef struct serve_stats {
    int64_t steps;
    int64_t steps_by_state[KVA_STATE_EMPTY + 1]; /* indexed by kva_attn_state */
    int64_t scheduled_tokens;                    /* query tokens over all steps */
    int64_t preemptions;
    int64_t discarded_tokens; /* computed tokens forgotten by preemptions */
    int64_t admitted_tokens;  /* prompt (+ recomputed) tokens looked up at admission */
    int64_t cached_tokens;    /* of those, prefix-cache hits */
    int32_t peak_running;
    double peak_kv_usage; /* most blocks in use / (NB - 1) */
    double step_s;        /* wall time of the steps (the virtual clock's busy time) */
    double attention_s;   /* inside kva_attention_run (CUDA: device time, events) */
    double write_s;       /* inside kva_cache_write (CUDA: device time, events) */
    double plan_s;        /* inside kva_plan_create / destroy */
    double plan_max_s;    /* the most plan time of one step */
    double combine_s;     /* --dcp: inside kva_dcp_mpi_combine */
    double step_s_by_state[KVA_STATE_EMPTY + 1]; /* step_s by the steps' kva_attn_state */
    double plan_s_by_state[KVA_STATE_EMPTY + 1]; /* plan_s likewise */
    int32_t last_state;                          /* the last step's state (set by the engine) */
    int64_t cascade_steps; /* steps whose (first layer's) plan ran a cascade */
    /* --verify */
    int32_t verify_steps;
    int32_t verify_failures;
    int64_t verify_tokens;
    double verify_max_err;
} serve_stats;

/* ---- serve_workload.c ---- */

/* Creates the requests sorted by arrival time; returns 0 when out of memory. */
int serve_workload_create(const serve_opts *o, serve_req **out);
void serve_workload_free(serve_req *reqs, int32_t n);

/* ---- serve_engine.c ---- */

typedef struct serve_engine serve_engine;

/* One step's batch as the scheduler hands it to the engine: R requests in
 * scheduling order with their pool ids, computed tokens before the step and
 * new tokens (q_len). */
typedef struct serve_batch {
    int32_t num_requests;
    const int32_t *pool_ids; /* [R] */
    const int32_t *context;  /* [R] tokens already in the cache */
    const int32_t *num_new;  /* [R] q_len */
} serve_batch;

/* Creates the engine (--backend cuda: also its device buffers and a warm-up
 * step). *out is set even when this fails, so that serve_engine_error can
 * say why; serve_engine_destroy it either way. */
kva_status serve_engine_create(const serve_opts *o, serve_engine **out);
void serve_engine_destroy(serve_engine *e);
kva_pool *serve_engine_pool(serve_engine *e);
/* --dcp: the largest v over the ranks (a collective). */
double serve_engine_dcp_max(serve_engine *e, double v);
/* Threads of the backend's context. */
int32_t serve_engine_threads(const serve_engine *e);
/* The message of a failure that did not come from the library (a CUDA
 * runtime call, a device check), "" when there is none: then
 * kva_last_error() has it. */
const char *serve_engine_error(const serve_engine *e);
/* The first --verify mismatch, "" when there was none. */
const char *serve_engine_verify_error(const serve_engine *e);
/* Runs one step: the plan, then for each layer the cache write and attention.
 * verify != 0 also checks one layer against the reference. Adds to *st; the
 * time spent verifying goes to *verify_s (not part of the step). */
kva_status serve_engine_step(serve_engine *e, const serve_batch *b, int verify, serve_stats *st,
                             double *verify_s);

/* ---- serve_sched.c ---- */

typedef struct serve_sched serve_sched;

kva_status serve_sched_create(const serve_opts *o, serve_req *reqs, int32_t n, kva_pool *pool,
                              serve_sched **out);
void serve_sched_destroy(serve_sched *s);
/* Appends a submitted request to the tail of the waiting queue. */
void serve_sched_submit(serve_sched *s, int32_t req);
/* Number of requests waiting / running. */
int32_t serve_sched_num_waiting(const serve_sched *s);
int32_t serve_sched_num_running(const serve_sched *s);
/* The request at the head of the waiting queue, -1 if none. */
int32_t serve_sched_head(const serve_sched *s);
/* Schedules one step into *b (pointers into the scheduler) and commits the
 * scheduled tokens to the pool (kva_pool_request_append_tokens: their full
 * blocks are cached at once, as vLLM v1 does). An empty batch
 * with requests waiting means one request alone does not fit the pool:
 * KVA_STATUS_POOL_EXHAUSTED with a message. */
kva_status serve_sched_schedule(serve_sched *s, serve_batch *b, serve_stats *st);
/* After the step ran: counts the step's tokens as computed (the pool has them
 * since serve_sched_schedule), samples a token for every request whose KV
 * caught up, frees the blocks of and finishes requests that reached
 * output_len. The indices of requests that got a token go to emitted [R]
 * (count in *num_emitted), of those that finished to finished [R]. */
kva_status serve_sched_update(serve_sched *s, int32_t *emitted, int32_t *num_emitted,
                              int32_t *finished, int32_t *num_finished);

/* ---- serve_sim.c ---- */

/* Called after every step (and may be NULL): the test checks invariants here.
 * Returns 0 to go on, non-zero to stop the run with KVA_STATUS_INTERNAL. */
typedef int (*serve_step_hook)(void *user, const serve_req *reqs, int32_t n, kva_pool *pool,
                               const serve_stats *st);

typedef struct serve_run {
    serve_req *reqs; /* [num_prompts], owned (serve_run_free) */
    int32_t num_reqs;
    serve_stats stats;
    double duration_s; /* virtual time from the start to the last token */
    double wall_s;     /* real time of the whole run */
    int32_t threads;   /* threads the backend used */
    char device[160];  /* --backend cuda: "GPU 0: <name>" */
    int32_t num_blocks;
    kva_pool_stats pool_stats; /* at the end */
    char error[320];           /* why the run failed, when it did */
    char verify_error[256];    /* the first --verify mismatch, "" if none */
} serve_run;

/* Runs the whole simulation. On failure run->error says why (naming the
 * library call and kva_last_error() when a call failed). */
kva_status serve_sim_run(const serve_opts *o, serve_step_hook hook, void *user, serve_run *run);
void serve_run_free(serve_run *run);
/* Monotonic clock in seconds. */
double serve_now(void);

/* ---- serve_metrics.c ---- */

/* The metrics of vllm bench serve (its benchmark_serving.py definitions). */
typedef struct serve_metrics {
    int32_t completed;
    int64_t total_input, total_output;
    double duration_s;
    double request_throughput, output_throughput, total_token_throughput;
    double max_output_tokens_per_s;  /* most tokens generated in one 1-s bucket */
    int32_t max_concurrent_requests; /* most requests in flight in one 1-s bucket */
    double mean_ttft_ms, median_ttft_ms, p99_ttft_ms, std_ttft_ms;
    double mean_tpot_ms, median_tpot_ms, p99_tpot_ms, std_tpot_ms;
    double mean_itl_ms, median_itl_ms, p99_itl_ms, std_itl_ms;
    double mean_e2el_ms, median_e2el_ms, p99_e2el_ms, std_e2el_ms;
    double prefix_hit_rate; /* cached / admitted tokens */
    double attention_share; /* attention_s / step_s */
    double write_share;
    double plan_share;
    double decode_plan_share;   /* plan / step time of the decode-only steps */
    double mean_step_ms;        /* step_s / steps */
    double mean_decode_step_ms; /* over the decode-only steps */
} serve_metrics;

/* Returns 0 when out of memory. */
int serve_metrics_compute(const serve_run *run, serve_metrics *m);
/* Linear-interpolated percentile p in [0, 100] of v [n] (sorted in place). */
double serve_percentile(double *v, size_t n, double p);
void serve_print_header(FILE *f, const serve_opts *o, const serve_run *run);
void serve_print_table(FILE *f, const serve_opts *o, const serve_run *run, const serve_metrics *m);
/* Returns 0 on success, -1 if the file cannot be written. */
int serve_write_json(const char *path, const serve_opts *o, const serve_run *run,
                     const serve_metrics *m);

/* ---- serve_dcp.c ---- */

/* --dcp over MPI (builds of the CLI with MPI; stubs elsewhere, which fail
 * with KVA_STATUS_UNSUPPORTED and a reason). */
typedef struct serve_dcp serve_dcp;

/* 1 if this build has MPI, else 0 with the reason in why. */
int serve_dcp_available(char *why, size_t n);
/* MPI_Init; the run's N and this rank into o. Returns 0 on failure. */
int serve_dcp_init(int *argc, char ***argv, serve_opts *o);
/* MPI_Finalize (after serve_dcp_init only). */
void serve_dcp_finalize(void);
/* Ends every rank's process (MPI_Abort): a failed rank's peers may be
 * waiting in a collective. */
void serve_dcp_abort(int code);
/* The combine of one run (A2A) for up to max_tokens tokens, on ctx. */
kva_status serve_dcp_create(kva_context *ctx, const serve_opts *o, int32_t max_tokens,
                            serve_dcp **out);
void serve_dcp_destroy(serve_dcp *d);
/* Where this rank's attention writes its partial [T, H, D] and lse [T, H]
 * for the next combine (kva_dcp_mpi_partials: in the shared window). */
kva_status serve_dcp_partials(serve_dcp *d, int32_t T, void **part, float **lse);
/* kva_dcp_mpi_combine (A2A): part and lse -> out [T, H / N, D]. */
kva_status serve_dcp_combine(serve_dcp *d, int32_t T, const void *part, const float *lse,
                             void *out);
/* The largest v over the ranks (every rank calls it). */
double serve_dcp_max(serve_dcp *d, double v);
/* Rank 0 receives every rank's n bytes at mine into all [N][n]. */
kva_status serve_dcp_gather(serve_dcp *d, const void *mine, size_t n, void *all);

/* ---- serve_device.c ---- */

/* The CUDA side of --backend cuda: one non-blocking stream on GPU 0 (set as
 * the context's stream), num_events timing events on it, device and pinned
 * host buffers. Without the CUDA runtime in this build every call fails with
 * KVA_STATUS_BACKEND_UNAVAILABLE and serve_dev_available says why. Failing
 * calls leave the runtime's message in serve_dev_error(d). */
typedef struct serve_dev serve_dev;

/* 1 if a CUDA device is visible to this build, else 0 with the reason in why. */
int serve_dev_available(char *why, size_t n);
/* *out is set (and must be destroyed) even when this fails. */
kva_status serve_dev_create(int32_t num_events, serve_dev **out);
void serve_dev_destroy(serve_dev *d);
const char *serve_dev_error(const serve_dev *d);
void *serve_dev_stream(serve_dev *d); /* a cudaStream_t */
void serve_dev_name(char *name, size_t n);
kva_status serve_dev_alloc(serve_dev *d, size_t n, void **p);
void serve_dev_free(void *p);
kva_status serve_dev_alloc_host(serve_dev *d, size_t n, void **p); /* pinned */
void serve_dev_free_host(void *p);
/* Enqueued on the stream (src must stay unchanged until the stream passes it). */
kva_status serve_dev_upload(serve_dev *d, void *dst, const void *src, size_t n);
/* Enqueued on the stream, then waits for it. */
kva_status serve_dev_download(serve_dev *d, void *dst, const void *src, size_t n);
kva_status serve_dev_memset(serve_dev *d, void *p, int value, size_t n);
kva_status serve_dev_record(serve_dev *d, int32_t event);
kva_status serve_dev_sync(serve_dev *d);
/* cudaStreamQuery on the stream: 1 if it has run everything, else 0. */
int serve_dev_query(serve_dev *d);
/* Seconds between two recorded (and completed) events. */
kva_status serve_dev_elapsed(serve_dev *d, int32_t a, int32_t b, double *sec);

#endif /* KVA_SERVE_SIM_H */
