/*
 * bench.h - the pieces of `kvattn bench`: options, the step's batch, the
 * correctness check against the reference backend, and the report.
 *
 * Shape glossary as in kvattn.h: T tokens, R requests, H query heads, Hkv kv
 * heads, D head size, Dv value head size, B block size, NB blocks.
 */
#ifndef KVA_CLI_BENCH_H
#define KVA_CLI_BENCH_H

#include "kvattn.h"

#include <stdint.h>
#include <stdio.h>

typedef enum bench_mode { BENCH_DECODE = 0, BENCH_PREFILL = 1, BENCH_MIXED = 2 } bench_mode;

/* Everything the command line sets. Fields left at -1 take their mode's default
 * in bench_opts_resolve. */
typedef struct bench_opts {
    bench_mode mode;
    int32_t batch;   /* R (decode, prefill) or number of decodes (mixed) */
    int32_t context; /* cached tokens before the step's new tokens, per request */
    int32_t
        q_len; /* new tokens: per decode (decode), per request (prefill), of the chunk (mixed) */
    int32_t heads, kv_heads, head_dim, head_dim_v, block_size;
    kva_dtype dtype;
    kva_quant kv_quant; /* --kv-quant: the cache's format (KVA_QUANT_NONE: stored in dtype) */
    kva_layout layout;
    int32_t causal;
    int32_t window; /* window_left, -1 for none */
    int32_t chunk;  /* attention_chunk (local attention), 0 for none */
    int tree;       /* draft tree of each request's q_len tokens: BENCH_TREE_* */
    float softcap;
    kva_backend backend;
    int32_t threads;
    int32_t iters; /* 0 = chosen from the warm-up time */
    int32_t warmup;
    uint64_t seed;
    const char *json; /* file for the machine-readable result, or NULL */
    int no_check;
    int no_ceiling; /* skip measuring the machine's read bandwidth and FMA peak */
    int ragged;     /* time kva_attention_run_ragged instead of the paged path */
    int alibi;      /* ALiBi slopes 2^(-8(h+1)/H) */
    int sinks;      /* per-head sink logits */
    /* Registry kernels forced on the context (`kvattn info` lists them), comma
     * separated, one per family at most; NULL = the dispatcher's choice. */
    const char *variant;
    int parts;  /* mixed mode: also time the decodes alone and the chunk alone */
    int paired; /* cpu: a read pass after every timed run (bench_result.paired_*) */
    int sweep;  /* bench_sweep_set: 0 = one shape */
    int quiet;  /* no table on stdout (the sweep prints one row per shape) */
} bench_opts;

/* Draft trees of --tree: none, a chain (ordinary speculative decoding as a
 * tree), a star (every token a child of the first), random parents. */
enum { BENCH_TREE_NONE = 0, BENCH_TREE_CHAIN = 1, BENCH_TREE_STAR = 2, BENCH_TREE_RANDOM = 3 };

/* Shape sets of --sweep (bench_sweep.c). */
enum { SWEEP_NONE = 0, SWEEP_DECODE = 1, SWEEP_PREFILL = 2, SWEEP_MIXED = 4, SWEEP_ALL = 7 };

/* Sets the defaults; bench_opts_resolve fills the mode-dependent ones. */
void bench_opts_init(bench_opts *o);
void bench_opts_resolve(bench_opts *o);
const char *bench_mode_name(bench_mode m);

/*
 * One step's batch on the host: metadata, block tables and every tensor the
 * run reads or writes. The check batch (a reduced copy) has the same form plus
 * src_token, the row of the full batch each of its tokens reproduces.
 */
typedef struct bench_batch {
    int32_t num_requests;     /* R */
    int32_t num_tokens;       /* T */
    int32_t *query_start_loc; /* [R+1] */
    int32_t *seq_lens;        /* [R] */
    int32_t *block_table;     /* [R, block_table_stride], shuffled block ids */
    int32_t block_table_stride;
    int32_t num_blocks;    /* NB of the cache: every block of every request */
    void *q;               /* [T, H, D] dtype */
    void *out;             /* [T, H, Dv] dtype */
    float *lse;            /* [T, H] */
    void *k_new, *v_new;   /* [T, Hkv, D], [T, Hkv, Dv]: the step's new keys/values */
    int64_t *slot_new;     /* [T] cache slots of the new tokens */
    void *k_ragged;        /* [sum(seq_lens), Hkv, D] (--ragged only) */
    void *v_ragged;        /* [sum(seq_lens), Hkv, Dv] (--ragged only) */
    int64_t *src_token;    /* [T] check batch only: token of the full batch; else NULL */
    float *slopes;         /* [H] ALiBi slopes (--alibi), else NULL */
    float *sinks;          /* [H] sink logits (--sinks), else NULL */
    int32_t *tree_parents; /* [T] draft-tree parents (--tree), else NULL */
} bench_batch;

/* bench_batch.c */
kva_status bench_batch_build(const bench_opts *o, bench_batch *b);
void bench_batch_free(bench_batch *b);
/* The plan descriptor of batch b (pointers into b). */
void bench_plan_desc(const bench_opts *o, const bench_batch *b, kva_plan_desc *d);
/* Creates the cache of the options on ctx (kva_cache_create_quant; quantized
 * formats with scalar scales fitted to the uniform data). */
kva_status bench_cache_create(kva_context *ctx, const bench_opts *o, const bench_batch *b,
                              kva_cache **out);
/* Writes every key and value of every request into the cache: context tokens
 * from random data, then the step's new tokens (k_new/v_new at slot_new). */
kva_status bench_cache_fill(kva_context *ctx, const bench_opts *o, const bench_batch *b,
                            kva_cache *cache);
/* Writes only the step's new tokens (what an engine does every layer). */
kva_status bench_cache_write_new(kva_context *ctx, const bench_opts *o, const bench_batch *b,
                                 kva_cache *cache);
/* Fills b->k_ragged/v_ragged (allocating them) for the ragged path. */
kva_status bench_ragged_fill(const bench_opts *o, bench_batch *b);
/* Fills n elements of a float buffer of dtype dt with uniform values of unit
 * variance (never all zeros) from the generator state *s. */
void bench_fill(void *p, kva_dtype dt, size_t n, uint64_t *s);
/* Fills n elements with NaN so that an element a kernel does not write shows. */
void bench_poison(void *p, kva_dtype dt, size_t n);

/* Work counted per the docs: KV bytes (every visible key's K and V once per kv
 * head), FLOPs (2*D + 2*Dv per unmasked (query head, key) pair). */
typedef struct bench_counts {
    double kv_bytes;
    double flops;
    double pairs; /* unmasked (query head, key) pairs */
} bench_counts;
bench_counts bench_count(const bench_opts *o, const bench_batch *b);
/* Unmasked (query head, key) pairs of one request with q_len q and seq_len s. */
double bench_request_pairs(const bench_opts *o, int32_t q, int32_t s);

/* bench_check.c */
typedef struct bench_check_result {
    int done; /* 0 when skipped */
    const char *skip_reason;
    int ok;
    double max_abs_err; /* output */
    double max_lse_err;
    size_t num_bad;
    int32_t requests_checked;
    int32_t tokens_checked;
    int truncated; /* 1 if the checked requests were shortened (causal prefix) */
    double ref_seconds;
} bench_check_result;

/* Runs the reference backend on a reduced copy of the batch (or the whole
 * batch when it is cheap) and compares with b->out/b->lse, which the backend
 * under test has just written. Returns a library status; a mismatch is
 * reported in r->ok, not as a status. */
kva_status bench_check(const bench_opts *o, const bench_batch *b, const kva_cache *cache,
                       bench_check_result *r);
/* bench_check, then its line on stdout (unless --quiet); a mismatch is
 * reported on stderr naming `backend`. Returns a KVA_EXIT_* code: OK only
 * when the check ran and passed. */
int bench_check_report(const bench_opts *o, const bench_batch *b, const kva_cache *cache,
                       const char *backend, bench_check_result *r);

/* bench_report.c */
typedef struct bench_result {
    kva_plan_info info;
    int32_t threads;
    int32_t iters;
    double median_s, min_s;
    double plan_s;     /* median kva_plan_create time */
    double write_s;    /* median kva_cache_write of the step's new tokens (paged only) */
    double read_bw;    /* measured machine read bandwidth GB/s, 0 if not measured */
    double read_bw_1t; /* the same with 1 thread (measured when threads > 1), else 0 */
    double fma_peak;   /* measured fp32 FMA peak GFLOP/s, 0 if not measured */
    /* --paired: each timed run k is followed by one read pass over the
     * ceiling's buffer with the same threads (bw_k GB/s); paired_frac is the
     * median over k of (KV bytes / time_k) / bw_k, paired_bw the median bw_k:
     * kernel and ceiling under the same load of a shared machine. 0 when not
     * measured. */
    double paired_frac, paired_bw;
    const char *peak_isa; /* vector ISA the peak was measured with */
    bench_counts counts;
    bench_check_result check;
    /* Mixed mode with --parts: medians of the mixed step, the decodes alone and
     * the chunked prefill alone (own plans over the same cache), timed
     * round-robin; 0 when not measured. */
    double mixed_s, decodes_s, chunk_s;
    int32_t num_requests, num_tokens, num_blocks; /* of the batch (R, T, NB) */
    char device[256]; /* --backend cuda: the GPU's name; read_bw is its copy ceiling */
} bench_result;

/* cmd_bench.c: one shape, start to end (batch, cache, plan, check, timing,
 * ceilings, report unless o->quiet). Returns the exit status. */
int bench_run_shape(const bench_opts *o, bench_result *res);
/* Parses the value of --sweep ("decode", "prefill", "mixed", "all"). */
int bench_sweep_parse(const char *val, int *set);
/* bench_sweep.c: runs the shapes of o->sweep with o's other options. */
int bench_sweep(const bench_opts *o);

/* The roofline of the shape on the measured ceilings: the compute-limited
 * rate fma_peak * kv_bytes / flops (GB/s: the K/V bytes a kernel doing only
 * the counted fp32 FMAs at the peak would get through) and the bound
 * min(read_bw, that rate). 0 where a ceiling was not measured. */
typedef struct bench_roofline {
    double compute_gbps; /* fma_peak * kv_bytes / flops */
    double bound_gbps;   /* min(read_bw, compute_gbps) */
    int compute_bound;   /* 1 when compute_gbps < read_bw */
} bench_roofline;
bench_roofline bench_roofline_of(const bench_counts *c, double read_bw, double fma_peak);

void bench_report_print(const bench_opts *o, const bench_batch *b, const bench_result *r);
/* Returns 0 on success, -1 if the file cannot be written. */
int bench_report_json(const char *path, const bench_opts *o, const bench_result *r);
/* Writes the result as one JSON object (no trailing newline). */
void bench_report_json_write(FILE *f, const bench_opts *o, const bench_result *r);

/* bench_device.c: --backend cuda. bench_cuda_available says whether this build
 * has the CUDA backend and sees a GPU (else why, in why[0..n)). bench_cuda_main
 * runs one shape of the built batch b: the cache written by the CPU backend on
 * the host and uploaded, the check against the reference over that host
 * cache, timing with CUDA events, and a device-to-device copy as the ceiling
 * (res->read_bw, bytes read + written). Returns the exit status. */
int bench_cuda_available(char *why, size_t n);
int bench_cuda_main(const bench_opts *o, bench_batch *b, bench_result *res);

/* Median of v[0..n) (sorts v). */
double bench_median(double *v, int n);

#endif /* KVA_CLI_BENCH_H */
