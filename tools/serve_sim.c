/*
 * serve_sim.c - the main loop of `kvattn serve-sim` and its defaults.
 *
 * Time is virtual: the clock starts at 0 (the first request arrives then, or
 * after its Poisson delay), advances by the measured wall time of each step's
 * real work (scheduling, pool calls, plan, cache writes, attention for every
 * layer, bookkeeping), and jumps over idle time to the next arrival instead
 * of sleeping. Time
 * spent on --verify checks is measured and left out. A token produced by a
 * step is stamped with the clock at the end of that step. Requests are
 * submitted when they have arrived and fewer than --max-concurrency are in
 * flight (vllm bench serve's semaphore): at their arrival time, or when a
 * slot opened if the gate held them back. TTFT counts from submission, so it
 * includes the wait for the step that was running when the request came.
 */
#define _POSIX_C_SOURCE 200809L
#include "serve_sim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

double serve_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void serve_opts_init(serve_opts *o)
{
    memset(o, 0, sizeof *o);
    o->cuda_upload_min = -1;
    o->cuda_staging_hot = -1;
    /* Model: 4 layers of Llama-3-8B's attention (H 32, Hkv 8, D 128), bf16. */
    o->backend = KVA_BACKEND_CPU;
    o->threads = 0;
    o->layers = 4;
    o->heads = 32;
    o->kv_heads = 8;
    o->head_dim = 128;
    o->block_size = 16;
    o->dtype = KVA_DTYPE_BF16;
    o->num_blocks = 0;
    o->kv_cache_mem = (int64_t)512 << 20;
    o->prefix_caching = 1;
    o->hash = KVA_POOL_HASH_SHA256;
    /* Scheduler: vLLM v1's budget for latency-bound serving and its max_num_seqs. */
    o->max_num_batched_tokens = 2048;
    o->max_num_seqs = 256;
    o->chunked_prefill = 1;
    /* Workload: 32 prompts of a 256-token shared prefix + ~256 own tokens,
     * ~64 output tokens, all sent at once. */
    o->num_prompts = 32;
    o->input_len = 256;
    o->output_len = 64;
    o->prefix_len = 256;
    o->range_ratio = 0.25;
    o->request_rate = 0.0;
    o->max_concurrency = 0;
    o->seed = 0;
    o->progress = 0;
}

void serve_opts_resolve(serve_opts *o)
{
    if (o->dcp && o->dcp_interleave == 0)
        o->dcp_interleave = o->block_size;
    if (o->num_blocks == 0) {
        int64_t nb = o->kv_cache_mem / serve_block_bytes(o);
        o->num_blocks = nb < 2 ? 2 : nb > (1 << 30) ? (1 << 30) : (int32_t)nb;
    }
}

void serve_run_free(serve_run *run)
{
    serve_workload_free(run->reqs, run->num_reqs);
    run->reqs = NULL;
}

/* The progress bar: on a terminal it is redrawn at most 10 times a second,
 * with the requests done (as vllm bench serve's tqdm counts) and the output
 * tokens generated so far (which move while all requests are still running);
 * otherwise a line every quarter of the requests, so logs stay short. */
typedef struct progress_state {
    int tty;
    int last_quarter;
    double last_draw; /* wall clock of the last redraw */
    int64_t tokens_total;
} progress_state;

static void progress(const serve_opts *o, progress_state *p, int32_t done, int32_t n,
                     int64_t tokens, double now)
{
    if (!o->progress)
        return;
    if (p->tty) {
        double t = serve_now();
        if (done < n && t - p->last_draw < 0.1)
            return;
        p->last_draw = t;
        int w = 30, fill = (int)((int64_t)done * w / n);
        fprintf(stderr, "\rserve-sim [");
        for (int i = 0; i < w; i++)
            fputc(i < fill ? '#' : '.', stderr);
        fprintf(stderr, "] %d/%d requests, %lld/%lld tokens, %.1f s", (int)done, (int)n,
                (long long)tokens, (long long)p->tokens_total, now);
        if (done == n)
            fputc('\n', stderr);
    } else {
        int q = (int)((int64_t)done * 4 / n);
        if (q <= p->last_quarter)
            return;
        p->last_quarter = q;
        fprintf(stderr, "serve-sim: %d/%d requests done, %.1f s simulated\n", (int)done, (int)n,
                now);
    }
    fflush(stderr);
}

/* Fills run->error with the failing call and the library's message (or the
 * engine's own, for a failure outside the library: the CUDA runtime). */
static kva_status lib_fail(serve_run *run, const serve_engine *e, const char *what, kva_status st)
{
    const char *msg = serve_engine_error(e);
    snprintf(run->error, sizeof run->error, "%s failed: %s: %s", what, kva_status_name(st),
             msg[0] ? msg : kva_last_error());
    return st;
}

/* The loop proper; e, s and the scratch arrays are owned by serve_sim_run. */
static kva_status sim_loop(const serve_opts *o, serve_engine *e, serve_sched *s, int32_t *emitted,
                           int32_t *finished, serve_step_hook hook, void *user, serve_run *run)
{
    serve_req *reqs = run->reqs;
    const int32_t n = run->num_reqs;
    kva_pool *pool = serve_engine_pool(e);
    serve_stats *st = &run->stats;
    double now = 0.0, gate_s = 0.0; /* gate_s: when a concurrency slot last opened */
    int32_t next = 0, inflight = 0, done = 0;
    int64_t tokens = 0;
    progress_state ps_bar = {isatty(STDERR_FILENO), 0, 0.0, 0};
    for (int32_t i = 0; i < n; i++)
        ps_bar.tokens_total += reqs[i].output_len;
    kva_status rc;
    while (done < n) {
        /* A request that arrived during the last step is sent at its arrival
         * (it waits for the step to end inside the "server", which counts in
         * its TTFT); one held back by the gate is sent when a slot freed. */
        while (next < n && reqs[next].arrival_s <= now &&
               (o->max_concurrency == 0 || inflight < o->max_concurrency)) {
            reqs[next].submit_s = reqs[next].arrival_s > gate_s ? reqs[next].arrival_s : gate_s;
            serve_sched_submit(s, next);
            next++;
            inflight++;
        }
        if (o->max_concurrency > 0 && inflight >= o->max_concurrency)
            gate_s = INFINITY; /* closed until a request finishes */
        if (serve_sched_num_waiting(s) == 0 && serve_sched_num_running(s) == 0) {
            now = reqs[next].arrival_s; /* idle until the next arrival */
            continue;
        }
        double t0 = serve_now(), verify_s = 0.0;
        serve_batch b;
        rc = serve_sched_schedule(s, &b, st);
        if (rc == KVA_STATUS_POOL_EXHAUSTED) {
            int32_t head = serve_sched_head(s);
            const serve_req *r = &reqs[head];
            int64_t need = (int64_t)r->prompt_len + r->output_len - 1;
            snprintf(run->error, sizeof run->error,
                     "the pool is too small: request %d (%d prompt + %d output tokens) needs "
                     "%lld blocks of %d tokens to finish, the pool has %d (raise --num-blocks "
                     "or --kv-cache-mem)",
                     (int)head, (int)r->prompt_len, (int)r->output_len,
                     (long long)((need + serve_pool_block_size(o) - 1) / serve_pool_block_size(o)),
                     (int)serve_pool_block_size(o), (int)o->num_blocks - 1);
            return rc;
        }
        if (rc != KVA_STATUS_OK)
            return lib_fail(run, NULL, "scheduling (kva_pool_request_*)", rc);
        if ((rc = serve_engine_step(e, &b, o->verify, st, &verify_s)) != KVA_STATUS_OK)
            return lib_fail(run, e,
                            "the model step (kva_plan_create/kva_cache_write/"
                            "kva_attention_run)",
                            rc);
        kva_pool_stats ps;
        kva_pool_get_stats(pool, &ps);
        if (ps.usage > st->peak_kv_usage)
            st->peak_kv_usage = ps.usage;
        int32_t ne = 0, nf = 0;
        if ((rc = serve_sched_update(s, emitted, &ne, finished, &nf)) != KVA_STATUS_OK)
            return lib_fail(run, NULL, "recording the step (kva_pool_request_append_tokens/free)",
                            rc);
        if (o->check_pool) {
            double c0 = serve_now();
            if ((rc = kva_pool_check(pool)) != KVA_STATUS_OK)
                return lib_fail(run, NULL, "kva_pool_check", rc);
            verify_s += serve_now() - c0;
        }
        double dt = serve_now() - t0 - verify_s;
        if (o->dcp) /* the group's step takes its slowest rank's time (serve_dcp.c) */
            dt = serve_engine_dcp_max(e, dt);
        now += dt;
        st->step_s += dt;
        if (b.num_requests > 0)
            st->step_s_by_state[st->last_state] += dt;
        for (int32_t k = 0; k < ne; k++) {
            serve_req *r = &reqs[emitted[k]];
            r->token_s[r->num_output - 1] = now;
        }
        done += nf;
        inflight -= nf;
        if (nf > 0 && gate_s == INFINITY)
            gate_s = now;
        tokens += ne;
        if (hook && hook(user, reqs, n, pool, st) != 0) {
            snprintf(run->error, sizeof run->error, "the step hook stopped the run");
            return KVA_STATUS_INTERNAL;
        }
        progress(o, &ps_bar, done, n, tokens, now);
    }
    run->duration_s = now;
    kva_pool_get_stats(pool, &run->pool_stats);
    return KVA_STATUS_OK;
}

kva_status serve_sim_run(const serve_opts *o, serve_step_hook hook, void *user, serve_run *run)
{
    memset(run, 0, sizeof *run);
    serve_opts opts = *o;
    serve_opts_resolve(&opts);
    run->num_blocks = opts.num_blocks;
    double w0 = serve_now();
    if (!serve_workload_create(&opts, &run->reqs)) {
        snprintf(run->error, sizeof run->error, "out of memory for %d requests",
                 (int)opts.num_prompts);
        return KVA_STATUS_OUT_OF_MEMORY;
    }
    run->num_reqs = opts.num_prompts;
    if (!opts.chunked_prefill) {
        /* Without chunking a prefill (or a recompute after preemption, which
         * includes the generated tokens) must fit one step's budget. */
        for (int32_t i = 0; i < run->num_reqs; i++) {
            int32_t need = run->reqs[i].prompt_len + run->reqs[i].output_len - 1;
            if (need > opts.max_num_batched_tokens) {
                snprintf(run->error, sizeof run->error,
                         "--no-chunked-prefill: request %d has %d prompt + %d output tokens; "
                         "--max-num-batched-tokens %d must be at least %d",
                         (int)i, (int)run->reqs[i].prompt_len, (int)run->reqs[i].output_len,
                         (int)opts.max_num_batched_tokens, (int)need);
                return KVA_STATUS_INVALID_ARGUMENT;
            }
        }
    }
    /* A request that cannot finish even alone in the pool would stop the run
     * half way: refuse the configuration up front. */
    for (int32_t i = 0; i < run->num_reqs; i++) {
        int64_t need = (int64_t)run->reqs[i].prompt_len + run->reqs[i].output_len - 1;
        const int32_t pb = serve_pool_block_size(&opts);
        int64_t blocks = (need + pb - 1) / pb;
        if (blocks > (int64_t)opts.num_blocks - 1) {
            snprintf(run->error, sizeof run->error,
                     "the pool is too small: request %d (%d prompt + %d output tokens) needs "
                     "%lld blocks of %d tokens to finish, the pool has %d (raise --num-blocks "
                     "or --kv-cache-mem)",
                     (int)i, (int)run->reqs[i].prompt_len, (int)run->reqs[i].output_len,
                     (long long)blocks, (int)pb, (int)opts.num_blocks - 1);
            return KVA_STATUS_POOL_EXHAUSTED;
        }
    }
    serve_engine *e = NULL;
    serve_sched *s = NULL;
    int32_t *emitted = malloc(((size_t)run->num_reqs + 1) * sizeof *emitted);
    int32_t *finished = malloc(((size_t)run->num_reqs + 1) * sizeof *finished);
    kva_status rc = (!emitted || !finished) ? KVA_STATUS_OUT_OF_MEMORY : KVA_STATUS_OK;
    if (rc != KVA_STATUS_OK)
        snprintf(run->error, sizeof run->error, "out of memory");
    /* The engine's step buffers hold the most tokens one step can have: the
     * budget, or every request's whole sequence when that is less, so that a
     * huge --max-num-batched-tokens does not allocate gigabytes for nothing.
     * The scheduler keeps the budget as given (it never binds then). */
    serve_opts eopts = opts;
    int64_t all_tokens = 0;
    for (int32_t i = 0; i < run->num_reqs; i++)
        all_tokens += (int64_t)run->reqs[i].prompt_len + run->reqs[i].output_len - 1;
    if (all_tokens < eopts.max_num_batched_tokens)
        eopts.max_num_batched_tokens = (int32_t)all_tokens;
    if (rc == KVA_STATUS_OK && (rc = serve_engine_create(&eopts, &e)) != KVA_STATUS_OK)
        lib_fail(run, e, "creating the model (context, pool, caches, warm-up)", rc);
    if (rc == KVA_STATUS_OK) {
        rc = serve_sched_create(&opts, run->reqs, run->num_reqs, serve_engine_pool(e), &s);
        if (rc != KVA_STATUS_OK)
            snprintf(run->error, sizeof run->error, "out of memory for the scheduler");
    }
    if (rc == KVA_STATUS_OK) {
        run->threads = serve_engine_threads(e);
        if (opts.backend == KVA_BACKEND_CUDA)
            serve_dev_name(run->device, sizeof run->device);
        rc = sim_loop(&opts, e, s, emitted, finished, hook, user, run);
        snprintf(run->verify_error, sizeof run->verify_error, "%s", serve_engine_verify_error(e));
    }
    serve_sched_destroy(s);
    serve_engine_destroy(e);
    free(emitted);
    free(finished);
    run->wall_s = serve_now() - w0;
    return rc;
}
