/*
 * test_serve_sim.c - the serving simulation (tools/serve_*.c) on small
 * configurations: every request finishes with exactly its output tokens, the
 * token accounting adds up, the pool's invariants hold after every step,
 * chunked prefill and preemption really happen when they should, prefix hits
 * appear exactly when prompts share a prefix, the concurrency gate holds,
 * the reference check passes, and bad configurations fail with a message.
 */
#include "harness.h"
#include "serve_sim.h"

/* A small model and workload: f32, 2 layers, H 4 / Hkv 2, D 64, B 16; 12
 * prompts of a 32-token shared prefix + ~40 own tokens, ~6 outputs; a
 * 64-token budget so prefills are chunked. */
static void small_opts(serve_opts *o)
{
    serve_opts_init(o);
    o->threads = 2;
    o->layers = 2;
    o->heads = 4;
    o->kv_heads = 2;
    o->head_dim = 64;
    o->block_size = 16;
    o->dtype = KVA_DTYPE_F32;
    o->num_blocks = 256;
    o->max_num_batched_tokens = 64;
    o->max_num_seqs = 8;
    o->num_prompts = 12;
    o->input_len = 40;
    o->output_len = 6;
    o->prefix_len = 32;
    o->range_ratio = 0.5;
    o->seed = 7;
    o->check_pool = 1;
}

/* What the step hook observed. */
typedef struct watch {
    const serve_opts *o;
    int64_t steps;
    int failures;
    int saw_partial_prefill; /* a running request with more than one token left to compute */
    int32_t max_inflight;
} watch;

static int hook(void *user, const serve_req *reqs, int32_t n, kva_pool *pool, const serve_stats *st)
{
    watch *w = user;
    w->steps++;
    int32_t inflight = 0, running = 0;
    for (int32_t i = 0; i < n; i++) {
        const serve_req *r = &reqs[i];
        int ok = r->num_output <= r->output_len && r->num_computed <= r->num_tokens &&
                 r->num_tokens == r->prompt_len + r->num_output;
        for (int32_t k = 1; k < r->num_output; k++)
            ok = ok && r->token_s[k] >= r->token_s[k - 1];
        if (r->num_output > 0)
            ok = ok && r->token_s[0] >= r->submit_s && r->submit_s >= r->arrival_s;
        if (r->state == SERVE_REQ_RUNNING) {
            running++;
            ok = ok && r->pool_id >= 0;
            if (r->num_tokens - r->num_computed > 1)
                w->saw_partial_prefill = 1;
        }
        if (r->state == SERVE_REQ_WAITING)
            ok = ok && r->pool_id < 0 && r->num_computed == 0;
        if (r->state == SERVE_REQ_WAITING || r->state == SERVE_REQ_RUNNING)
            inflight++;
        if (!ok) {
            fprintf(stderr, "request %d broke an invariant at step %lld\n", (int)i,
                    (long long)st->steps);
            w->failures++;
            return 1;
        }
    }
    if (inflight > w->max_inflight)
        w->max_inflight = inflight;
    if (running > w->o->max_num_seqs)
        w->failures++;
    /* kva_pool_check runs inside the loop (check_pool); the live request
     * count must match the running requests. */
    kva_pool_stats ps;
    if (kva_pool_get_stats(pool, &ps) != KVA_STATUS_OK || ps.num_requests != running)
        w->failures++;
    return w->failures != 0;
}

/* Runs o and checks the end state; returns the run (caller frees). */
static kva_status run_checked(const serve_opts *o, serve_run *run, watch *w)
{
    memset(w, 0, sizeof *w);
    w->o = o;
    kva_status st = serve_sim_run(o, hook, w, run);
    if (st != KVA_STATUS_OK) {
        fprintf(stderr, "serve_sim_run: %s\n", run->error);
        return st;
    }
    CHECK(w->failures == 0);
    CHECK(w->steps == run->stats.steps);
    /* Every request finished with exactly its output tokens; the KV computed
     * adds up: scheduled = final computed - prefix hits + discarded by
     * preemption. */
    int64_t final_computed = 0, preempt = 0;
    for (int32_t i = 0; i < run->num_reqs; i++) {
        const serve_req *r = &run->reqs[i];
        CHECK(r->state == SERVE_REQ_FINISHED);
        CHECK(r->num_output == r->output_len);
        CHECK(r->num_computed == r->prompt_len + r->output_len - 1);
        CHECK(r->pool_id == -1);
        final_computed += r->num_computed;
        preempt += r->num_preemptions;
    }
    CHECK(preempt == run->stats.preemptions);
    CHECK_MSG(run->stats.scheduled_tokens ==
                  final_computed - run->stats.cached_tokens + run->stats.discarded_tokens,
              "scheduled %lld, computed %lld, cached %lld, discarded %lld",
              (long long)run->stats.scheduled_tokens, (long long)final_computed,
              (long long)run->stats.cached_tokens, (long long)run->stats.discarded_tokens);
    /* The pool ends empty; its own hit counters agree with the scheduler's. */
    CHECK(run->pool_stats.num_used_blocks == 0);
    CHECK(run->pool_stats.num_requests == 0);
    if (o->prefix_caching)
        CHECK(run->pool_stats.hit_tokens >= run->stats.cached_tokens);
    CHECK(run->duration_s > 0);
    return st;
}

static void test_basic_run(void)
{
    serve_opts o;
    small_opts(&o);
    serve_run run;
    watch w;
    CHECK_OK(run_checked(&o, &run, &w));
    /* The 64-token budget is smaller than every prompt: prefills are chunked. */
    CHECK(w.saw_partial_prefill);
    CHECK(run.stats.preemptions == 0);
    CHECK(run.stats.cached_tokens > 0);
    CHECK(run.stats.steps_by_state[KVA_STATE_CHUNKED_PREFILL] > 0);
    CHECK(run.stats.steps_by_state[KVA_STATE_DECODE_ONLY] > 0);
    CHECK(w.max_inflight == o.num_prompts); /* rate inf: all submitted at once */
    serve_metrics m;
    CHECK(serve_metrics_compute(&run, &m));
    int64_t in = 0, out = 0;
    for (int32_t i = 0; i < run.num_reqs; i++) {
        in += run.reqs[i].prompt_len;
        out += run.reqs[i].output_len;
    }
    CHECK(m.completed == o.num_prompts);
    CHECK(m.total_input == in && m.total_output == out);
    CHECK(fabs(m.output_throughput * m.duration_s - (double)out) < 1e-6 * (double)out);
    CHECK(m.mean_ttft_ms > 0 && m.median_ttft_ms <= m.p99_ttft_ms);
    CHECK(m.mean_itl_ms > 0 && m.mean_tpot_ms > 0);
    CHECK(m.attention_share > 0 && m.attention_share <= 1.0);
    CHECK(m.prefix_hit_rate > 0 && m.prefix_hit_rate < 1.0);
    /* The definitions are checked on hand-made times in
     * test_metrics_definitions; here the peak bucket holds at least one
     * token and at most all of them. */
    CHECK(m.max_output_tokens_per_s >= 1 && m.max_output_tokens_per_s <= (double)out);
    serve_run_free(&run);
}

static void test_preemption(void)
{
    serve_opts o;
    small_opts(&o);
    /* 9 usable blocks: one request needs up to 7 (~112 tokens), so running
     * several at once runs out and forces preemptions. */
    o.num_blocks = 10;
    o.max_num_batched_tokens = 128;
    serve_run run;
    watch w;
    CHECK_OK(run_checked(&o, &run, &w));
    CHECK_MSG(run.stats.preemptions > 0, "no preemption with a %d-block pool", (int)o.num_blocks);
    CHECK(run.stats.discarded_tokens > 0);
    serve_run_free(&run);
}

static void test_prefix_hits(void)
{
    serve_opts o;
    small_opts(&o);
    serve_run run;
    watch w;
    /* A shared prefix of two blocks: later prompts hit it. */
    o.prefix_len = 32;
    CHECK_OK(run_checked(&o, &run, &w));
    CHECK(run.stats.cached_tokens > 0);
    CHECK(run.stats.cached_tokens % o.block_size == 0);
    serve_run_free(&run);
    /* No shared prefix: random prompts never hit. */
    o.prefix_len = 0;
    CHECK_OK(run_checked(&o, &run, &w));
    CHECK(run.stats.cached_tokens == 0);
    CHECK(run.pool_stats.hit_tokens == 0);
    serve_run_free(&run);
    /* A shared prefix with prefix caching off: no hits either. */
    o.prefix_len = 32;
    o.prefix_caching = 0;
    CHECK_OK(run_checked(&o, &run, &w));
    CHECK(run.stats.cached_tokens == 0);
    serve_run_free(&run);
}

static void test_no_chunked_prefill(void)
{
    serve_opts o;
    small_opts(&o);
    o.chunked_prefill = 0;
    o.max_num_batched_tokens = 256; /* >= the longest prompt + outputs */
    serve_run run;
    watch w;
    CHECK_OK(run_checked(&o, &run, &w));
    CHECK(!w.saw_partial_prefill);
    serve_run_free(&run);
    /* A budget below the longest prompt is refused with a message. */
    o.max_num_batched_tokens = 32;
    CHECK_STATUS(serve_sim_run(&o, NULL, NULL, &run), KVA_STATUS_INVALID_ARGUMENT);
    CHECK(strstr(run.error, "--max-num-batched-tokens") != NULL);
    serve_run_free(&run);
}

static void test_rate_and_concurrency(void)
{
    serve_opts o;
    small_opts(&o);
    o.request_rate = 50.0;
    o.max_concurrency = 3;
    serve_run run;
    watch w;
    CHECK_OK(run_checked(&o, &run, &w));
    CHECK(w.max_inflight <= 3 && w.max_inflight >= 1);
    /* vllm bench serve's arrivals: a delay before every request, increasing,
     * the last scaled to arrive at exactly num_prompts / rate. */
    CHECK(run.reqs[0].arrival_s > 0.0);
    for (int32_t i = 1; i < run.num_reqs; i++)
        CHECK(run.reqs[i].arrival_s >= run.reqs[i - 1].arrival_s);
    CHECK(fabs(run.reqs[run.num_reqs - 1].arrival_s - o.num_prompts / o.request_rate) < 1e-12);
    serve_run_free(&run);
}

static void test_poisson_unlimited(void)
{
    serve_opts o;
    small_opts(&o);
    o.request_rate = 20.0;
    serve_run run;
    watch w;
    CHECK_OK(run_checked(&o, &run, &w));
    /* Without a concurrency limit every request is sent at its arrival,
     * also when it arrives in the middle of a step. */
    for (int32_t i = 0; i < run.num_reqs; i++)
        CHECK(run.reqs[i].submit_s == run.reqs[i].arrival_s);
    serve_run_free(&run);
}

static void test_verify(void)
{
    serve_opts o;
    small_opts(&o);
    o.verify = 1;
    o.dtype = KVA_DTYPE_BF16;
    serve_run run;
    watch w;
    CHECK_OK(run_checked(&o, &run, &w));
    CHECK(run.stats.verify_steps >= 3);
    CHECK(run.stats.verify_tokens > 0);
    CHECK(run.stats.verify_failures == 0);
    serve_run_free(&run);
    /* A budget that admits most prompts in the first step: they hit the
     * prefix blocks that the first request writes in that same step. */
    o.max_num_batched_tokens = 512;
    CHECK_OK(run_checked(&o, &run, &w));
    CHECK(run.stats.cached_tokens >= (int64_t)(o.num_prompts - 1) * o.prefix_len);
    CHECK(run.stats.verify_failures == 0);
    serve_run_free(&run);
}

/* --verify with cascade steps (automatic mode): prefix-cache hits over 256+
 * shared keys make the CPU plan run a cascade, whose two passes' bf16
 * outputs are rounded before the merge, while the reference backend runs the
 * step plainly; the check must bound that (the cascade tests' tolerance) and
 * pass, and the steps must really have cascaded. */
static void test_verify_cascade(void)
{
    serve_opts o;
    small_opts(&o);
    o.verify = 1;
    o.dtype = KVA_DTYPE_BF16;
    o.layers = 1;
    o.num_prompts = 3;
    o.range_ratio = 0.0;
    o.input_len = 600;
    o.prefix_len = 512;
    o.output_len = 4;
    o.max_num_batched_tokens = 256;
    o.cascade = KVA_CASCADE_AUTO;
    serve_run run;
    watch w;
    CHECK_OK(run_checked(&o, &run, &w));
    CHECK_MSG(run.stats.cascade_steps > 0, "no step ran a cascade");
    CHECK(run.stats.verify_steps >= 3);
    CHECK_MSG(run.stats.verify_failures == 0, "%d failures, max err %g",
              (int)run.stats.verify_failures, run.stats.verify_max_err);
    serve_run_free(&run);
}

/* --verify can fail: an output element off by 1 and a new token written at
 * the wrong slot are each reported in every checked step, with a message,
 * while the run itself completes (the command then exits 1). */
static void test_verify_detects(void)
{
    static const int faults[] = {SERVE_FAULT_OUTPUT, SERVE_FAULT_SLOT};
    static const kva_quant formats[] = {KVA_QUANT_NONE, KVA_QUANT_INT8_TOKEN_K};
    for (int f = 0; f < 2; f++) {
        for (int q = 0; q < 2; q++) {
            serve_opts o;
            small_opts(&o);
            o.verify = 1;
            o.dtype = KVA_DTYPE_BF16;
            o.kv_quant = formats[q];
            o.fault = faults[f];
            serve_run run;
            CHECK_OK(serve_sim_run(&o, NULL, NULL, &run));
            CHECK(run.stats.verify_steps >= 3);
            /* Every checked step has T > 1 tokens but the decode-only ones:
             * the slot fault needs two tokens, the output fault hits all. */
            if (faults[f] == SERVE_FAULT_OUTPUT)
                CHECK(run.stats.verify_failures == run.stats.verify_steps);
            else
                CHECK(run.stats.verify_failures >= 1);
            CHECK(run.verify_error[0] != '\0');
            CHECK(strstr(run.verify_error, faults[f] == SERVE_FAULT_OUTPUT
                                               ? "1 output elements differ"
                                               : "0 output elements differ") != NULL);
            serve_run_free(&run);
        }
    }
}

/* Quantized caches (--kv-quant) pass the same checks: the rows the
 * reference backend writes at the block-table slots equal the cache's, and
 * attention matches the reference over the same codes. */
static void test_verify_quant(void)
{
    static const kva_quant formats[] = {KVA_QUANT_INT8_CHANNEL, KVA_QUANT_INT8_TOKEN_K,
                                        KVA_QUANT_INT8_TOKEN_K_V16, KVA_QUANT_FP8_E4M3};
    for (size_t i = 0; i < sizeof formats / sizeof formats[0]; i++) {
        serve_opts o;
        small_opts(&o);
        o.verify = 1;
        o.dtype = KVA_DTYPE_BF16;
        o.kv_quant = formats[i];
        serve_run run;
        watch w;
        CHECK_OK(run_checked(&o, &run, &w));
        CHECK(run.stats.verify_steps >= 3);
        CHECK(run.stats.verify_failures == 0);
        CHECK(run.verify_error[0] == '\0');
        serve_run_free(&run);
    }
    /* --kv-cache-mem counts the stored bytes: 1-byte codes (+ a float32 key
     * scale per token and kv head for the per-token formats). */
    serve_opts o;
    serve_opts_init(&o);
    const int64_t tok = (int64_t)o.block_size * o.kv_heads * o.layers, d = o.head_dim;
    CHECK(serve_block_bytes(&o) == tok * 2 * d * 2); /* bf16 K and V */
    o.kv_quant = KVA_QUANT_INT8_CHANNEL;
    CHECK(serve_block_bytes(&o) == tok * 2 * d);
    o.kv_quant = KVA_QUANT_INT8_TOKEN_K;
    CHECK(serve_block_bytes(&o) == tok * (2 * d + 4));
    o.kv_quant = KVA_QUANT_INT8_TOKEN_K_V16;
    CHECK(serve_block_bytes(&o) == tok * (d + 2 * d + 4));
}

/* MLA layers (kva_mla_run over a latent cache) at small sizes: every request
 * finishes, the run has decode-only and mixed steps (the absorbed and the
 * compute-friendly path), and --verify's checks (the latent rows where the
 * block table says, the output against the reference's naive MLA) pass for
 * f32, bf16 and an FP8 latent cache. */
static void mla_opts(serve_opts *o)
{
    small_opts(o);
    o->kind = KVA_ATTN_MLA;
    o->heads = 4;
    o->mla_kv_rank = 64;
    o->mla_rope_dim = 16;
    o->mla_nope_dim = 32;
    o->mla_v_dim = 24;
    o->verify = 1;
}

static void test_mla(void)
{
    static const kva_dtype dts[] = {KVA_DTYPE_F32, KVA_DTYPE_BF16, KVA_DTYPE_BF16};
    for (int i = 0; i < 3; i++) {
        serve_opts o;
        mla_opts(&o);
        o.dtype = dts[i];
        o.kv_quant = i == 2 ? KVA_QUANT_FP8_E4M3 : KVA_QUANT_NONE;
        serve_run run;
        watch w;
        CHECK_OK(run_checked(&o, &run, &w));
        CHECK(run.stats.steps_by_state[KVA_STATE_DECODE_ONLY] > 0);
        CHECK(run.stats.steps_by_state[KVA_STATE_CHUNKED_PREFILL] > 0);
        CHECK(run.stats.verify_steps >= 3);
        CHECK(run.stats.verify_tokens > 0);
        CHECK_MSG(run.stats.verify_failures == 0, "%s%s: %s", kva_dtype_name(o.dtype),
                  i == 2 ? " fp8" : "", run.verify_error);
        serve_run_free(&run);
    }
    /* The checks can fail on MLA layers too. */
    static const int faults[] = {SERVE_FAULT_OUTPUT, SERVE_FAULT_SLOT};
    for (int f = 0; f < 2; f++) {
        serve_opts o;
        mla_opts(&o);
        o.fault = faults[f];
        serve_run run;
        CHECK_OK(serve_sim_run(&o, NULL, NULL, &run));
        CHECK(run.stats.verify_failures >= 1);
        CHECK(run.verify_error[0] != '\0');
        serve_run_free(&run);
    }
}

/* The DeepSeek-V2-Lite preset: its shapes, its KV bytes per token (one
 * latent row of Dc + Dr per layer against H (Dn + Dr + Dv) for MHA), and a
 * short verified run of two of its layers. */
static void test_mla_preset(void)
{
    serve_opts o;
    serve_opts_init(&o);
    CHECK(!serve_opts_set_model(&o, "deepseek-v3"));
    CHECK(o.kind == KVA_ATTN_MHA && o.layers == 4);
    CHECK(serve_opts_set_model(&o, "deepseek-v2-lite"));
    CHECK(o.kind == KVA_ATTN_MLA && o.layers == 27 && o.heads == 16);
    CHECK(o.mla_kv_rank == 512 && o.mla_rope_dim == 64);
    CHECK(o.mla_nope_dim == 128 && o.mla_v_dim == 128);
    CHECK(serve_token_bytes(&o) == 27 * (512 + 64) * 2);                /* bf16 */
    CHECK(serve_token_bytes_mha(&o) == 27 * 16 * (128 + 64 + 128) * 2); /* 8.9x */
    CHECK(serve_block_bytes(&o) == serve_token_bytes(&o) * o.block_size);
    o.kv_quant = KVA_QUANT_FP8_E4M3;
    CHECK(serve_token_bytes(&o) == 27 * (512 + 64));
    CHECK(serve_token_bytes_mha(&o) == 27 * 16 * (128 + 64 + 128));
    CHECK(serve_opts_set_model(&o, "llama3-8b-slice"));
    CHECK(o.kind == KVA_ATTN_MHA && o.layers == 4 && o.heads == 32 && o.kv_heads == 8);
    CHECK(o.head_dim == 128);

    small_opts(&o);
    CHECK(serve_opts_set_model(&o, "deepseek-v2-lite"));
    o.layers = 2;
    o.dtype = KVA_DTYPE_BF16;
    o.num_prompts = 4;
    o.prefix_len = 16;
    o.input_len = 24;
    o.output_len = 4;
    o.verify = 1;
    serve_run run;
    watch w;
    CHECK_OK(run_checked(&o, &run, &w));
    CHECK(run.stats.verify_steps >= 2);
    CHECK_MSG(run.stats.verify_failures == 0, "%s", run.verify_error);
    serve_run_free(&run);
}

/* The Llama-4 preset: 3 local layers (attention_chunk 8192) and 1 global;
 * then a short verified run of its pattern with a chunk the prompts cross
 * (C 32, global every 2nd layer), so each step plans twice and the checked
 * layers alternate between local and global. */
static void test_chunk_preset(void)
{
    serve_opts o;
    serve_opts_init(&o);
    CHECK(serve_opts_set_model(&o, "llama4-scout-slice"));
    CHECK(o.kind == KVA_ATTN_MHA && o.layers == 4 && o.heads == 40 && o.kv_heads == 8);
    CHECK(o.attention_chunk == 8192 && o.chunk_global_every == 4);
    CHECK(serve_layer_local(&o, 0) && serve_layer_local(&o, 2) && !serve_layer_local(&o, 3));
    o.attention_chunk = 0;
    CHECK(!serve_layer_local(&o, 0));

    small_opts(&o);
    CHECK(serve_opts_set_model(&o, "llama4-scout-slice"));
    o.heads = 8;
    o.kv_heads = 2;
    o.attention_chunk = 32;
    o.chunk_global_every = 2;
    o.dtype = KVA_DTYPE_BF16;
    o.verify = 1;
    serve_run run;
    watch w;
    CHECK_OK(run_checked(&o, &run, &w));
    CHECK(run.stats.verify_steps >= 3);
    CHECK_MSG(run.stats.verify_failures == 0, "%s", run.verify_error);
    serve_run_free(&run);
}

/* --backend cuda where this build has no CUDA runtime (the test compiles
 * tools/serve_device.c without it) or no GPU is visible: the engine refuses
 * before the first step, with BACKEND_UNAVAILABLE and a message that says
 * why, and nothing is left allocated (the sanitizer build checks leaks). */
static void test_cuda_unavailable(void)
{
    char why[200];
    if (serve_dev_available(why, sizeof why))
        return; /* a GPU build of this test would run the simulation instead */
    CHECK(strlen(why) > 0);
    serve_opts o;
    small_opts(&o);
    o.backend = KVA_BACKEND_CUDA;
    o.threads = 0;
    serve_run run;
    CHECK_STATUS(serve_sim_run(&o, NULL, NULL, &run), KVA_STATUS_BACKEND_UNAVAILABLE);
    CHECK(strstr(run.error, "--backend cuda") != NULL);
    CHECK(strstr(run.error, why) != NULL);
    serve_run_free(&run);
}

static void test_pool_too_small(void)
{
    serve_opts o;
    small_opts(&o);
    o.num_blocks = 3; /* 2 usable blocks: no prompt fits */
    serve_run run;
    CHECK_STATUS(serve_sim_run(&o, NULL, NULL, &run), KVA_STATUS_POOL_EXHAUSTED);
    CHECK(strstr(run.error, "pool is too small") != NULL);
    serve_run_free(&run);
}

static void test_deterministic(void)
{
    serve_opts o;
    small_opts(&o);
    o.num_blocks = 10;
    o.max_num_batched_tokens = 128;
    serve_run a, b;
    CHECK_OK(serve_sim_run(&o, NULL, NULL, &a));
    CHECK_OK(serve_sim_run(&o, NULL, NULL, &b));
    CHECK(a.stats.steps == b.stats.steps);
    CHECK(a.stats.preemptions == b.stats.preemptions);
    CHECK(a.stats.scheduled_tokens == b.stats.scheduled_tokens);
    for (int32_t i = 0; i < a.num_reqs; i++)
        CHECK(a.reqs[i].prompt_len == b.reqs[i].prompt_len &&
              a.reqs[i].output_len == b.reqs[i].output_len);
    serve_run_free(&a);
    serve_run_free(&b);
}

static void test_percentile(void)
{
    /* numpy.percentile's linear interpolation: position p/100 * (n - 1). */
    double v[] = {4.0, 1.0, 3.0, 2.0};
    CHECK(fabs(serve_percentile(v, 4, 50.0) - 2.5) < 1e-12);
    CHECK(fabs(serve_percentile(v, 4, 99.0) - 3.97) < 1e-12);
    CHECK(serve_percentile(v, 4, 0.0) == 1.0 && serve_percentile(v, 4, 100.0) == 4.0);
    double one[] = {5.0};
    CHECK(serve_percentile(one, 1, 99.0) == 5.0);
}

/* Builds requests for the scheduler-only tests: prompts of distinct token ids
 * (no shared prefix), nothing arrived yet. */
static serve_req *make_reqs(int32_t n, int32_t prompt_len, int32_t output_len)
{
    serve_req *reqs = calloc((size_t)n, sizeof *reqs);
    for (int32_t i = 0; reqs && i < n; i++) {
        serve_req *r = &reqs[i];
        r->prompt_len = prompt_len;
        r->output_len = output_len;
        r->tokens = malloc(((size_t)prompt_len + (size_t)output_len) * sizeof *r->tokens);
        r->token_s = malloc((size_t)output_len * sizeof *r->token_s);
        if (!r->tokens || !r->token_s) {
            serve_workload_free(reqs, n);
            return NULL;
        }
        for (int32_t k = 0; k < prompt_len + output_len; k++)
            r->tokens[k] = 1000 * (i + 1) + k;
        r->num_tokens = prompt_len;
        r->pool_id = -1;
    }
    return reqs;
}

/* Schedules one step and checks its batch: requests (by index) and q_lens. */
static void step_expect(serve_sched *s, serve_req *reqs, serve_stats *st, int32_t n_expect,
                        const int32_t *req_expect, const int32_t *q_expect, int step)
{
    serve_batch b;
    CHECK_OK(serve_sched_schedule(s, &b, st));
    CHECK_MSG(b.num_requests == n_expect, "step %d: %d requests scheduled, expected %d", step,
              (int)b.num_requests, (int)n_expect);
    for (int32_t k = 0; k < b.num_requests && k < n_expect; k++) {
        const serve_req *r = &reqs[req_expect[k]];
        CHECK_MSG(b.pool_ids[k] == r->pool_id && b.num_new[k] == q_expect[k] &&
                      b.context[k] == r->num_computed,
                  "step %d, entry %d: pool id %d q_len %d context %d, expected request %d "
                  "(pool id %d) q_len %d context %d",
                  step, (int)k, (int)b.pool_ids[k], (int)b.num_new[k], (int)b.context[k],
                  (int)req_expect[k], (int)r->pool_id, (int)q_expect[k], (int)r->num_computed);
    }
    int32_t emitted[8], finished[8], ne = 0, nf = 0;
    CHECK_OK(serve_sched_update(s, emitted, &ne, finished, &nf));
}

/* vLLM v1's policy traced by hand on a pool of 6 usable blocks of 4 tokens, a
 * budget of 8 tokens and three 8-token prompts (A, B, C): running requests go
 * first, a waiting prefill is chunked to the budget that is left, FCFS
 * admission stops at the first request that does not fit the pool, the most
 * recently admitted request is preempted (recompute) when a running one needs
 * a block, it returns to the front of the queue, and nobody is admitted in a
 * step that preempted. */
static void test_sched_policy(void)
{
    serve_opts o;
    serve_opts_init(&o);
    o.block_size = 4;
    o.max_num_batched_tokens = 8;
    o.max_num_seqs = 4;
    o.prefix_caching = 0;
    enum { A = 0, B = 1, C = 2 };
    serve_req *reqs = make_reqs(3, 8, 20);
    CHECK(reqs != NULL);
    if (!reqs)
        return;
    kva_pool_desc pd = {7, 4, KVA_POOL_HASH_SHA256, 0};
    kva_pool *pool = NULL;
    serve_sched *s = NULL;
    CHECK_OK(kva_pool_create(&pd, &pool));
    CHECK_OK(serve_sched_create(&o, reqs, 3, pool, &s));
    if (!pool || !s)
        goto done;
    serve_stats st;
    memset(&st, 0, sizeof st);
    for (int32_t i = 0; i < 3; i++)
        serve_sched_submit(s, i);
    /* 1: A's whole prompt uses the budget. A: 2 blocks. */
    step_expect(s, reqs, &st, 1, (const int32_t[]){A}, (const int32_t[]){8}, 1);
    CHECK(reqs[A].num_output == 1 && reqs[B].state == SERVE_REQ_WAITING);
    /* 2: A decodes, B gets a 7-token chunk. A: 3 blocks, B: 2. */
    step_expect(s, reqs, &st, 2, (const int32_t[]){A, B}, (const int32_t[]){1, 7}, 2);
    CHECK(reqs[B].num_output == 0 && reqs[B].num_computed == 7);
    /* 3: B's last prompt token; C's 6-token chunk needs 2 blocks, 1 is free:
     * C is not admitted and holds nothing. */
    step_expect(s, reqs, &st, 2, (const int32_t[]){A, B}, (const int32_t[]){1, 1}, 3);
    CHECK(reqs[B].num_output == 1 && reqs[C].state == SERVE_REQ_WAITING && reqs[C].pool_id < 0);
    CHECK(serve_sched_head(s) == C);
    /* 4, 5: decodes; B takes the last free block at step 4. */
    step_expect(s, reqs, &st, 2, (const int32_t[]){A, B}, (const int32_t[]){1, 1}, 4);
    step_expect(s, reqs, &st, 2, (const int32_t[]){A, B}, (const int32_t[]){1, 1}, 5);
    CHECK(st.preemptions == 0);
    /* 6: A (13 tokens) needs a 4th block: B, the most recently admitted, is
     * preempted with its 10 computed tokens, and goes before C in the queue;
     * the step admits nobody although budget is left. */
    step_expect(s, reqs, &st, 1, (const int32_t[]){A}, (const int32_t[]){1}, 6);
    CHECK(st.preemptions == 1 && st.discarded_tokens == 10);
    CHECK(reqs[B].state == SERVE_REQ_WAITING && reqs[B].num_computed == 0 && reqs[B].pool_id < 0 &&
          reqs[B].num_preemptions == 1);
    CHECK(serve_sched_head(s) == B && serve_sched_num_waiting(s) == 2);
    CHECK(serve_sched_num_running(s) == 1);
    /* 7: B is readmitted with its 3 generated tokens as part of its prompt
     * (11 tokens), chunked to the 7 left of the budget; C still waits. */
    CHECK(reqs[B].num_tokens == 11);
    step_expect(s, reqs, &st, 2, (const int32_t[]){A, B}, (const int32_t[]){1, 7}, 7);
    CHECK(reqs[C].state == SERVE_REQ_WAITING && serve_sched_head(s) == C);
    CHECK_OK(kva_pool_check(pool));
done:
    serve_sched_destroy(s);
    kva_pool_destroy(pool);
    serve_workload_free(reqs, 3);
}

/* Prefix blocks are cached when they are scheduled, as vLLM v1's
 * allocate_slots caches them: B, admitted in the same step as A, hits the two
 * blocks A computes in that step (A's prompt of 12 tokens, B's sharing the
 * first 8, blocks of 4). */
static void test_sched_same_step_hit(void)
{
    serve_opts o;
    serve_opts_init(&o);
    o.block_size = 4;
    o.max_num_batched_tokens = 64;
    o.max_num_seqs = 4;
    serve_req *reqs = make_reqs(2, 12, 4);
    CHECK(reqs != NULL);
    if (!reqs)
        return;
    for (int32_t k = 0; k < 8; k++)
        reqs[1].tokens[k] = reqs[0].tokens[k];
    kva_pool_desc pd = {20, 4, KVA_POOL_HASH_SHA256, 1};
    kva_pool *pool = NULL;
    serve_sched *s = NULL;
    CHECK_OK(kva_pool_create(&pd, &pool));
    CHECK_OK(serve_sched_create(&o, reqs, 2, pool, &s));
    if (pool && s) {
        serve_stats st;
        memset(&st, 0, sizeof st);
        serve_sched_submit(s, 0);
        serve_sched_submit(s, 1);
        serve_batch b;
        CHECK_OK(serve_sched_schedule(s, &b, &st));
        CHECK(b.num_requests == 2);
        CHECK(st.cached_tokens == 8);
        CHECK(b.num_requests == 2 && b.context[0] == 0 && b.num_new[0] == 12 && b.context[1] == 8 &&
              b.num_new[1] == 4);
        /* B's block-table row starts with A's first two blocks. */
        int32_t row_a[4], row_b[4];
        CHECK_OK(kva_pool_request_block_table(pool, reqs[0].pool_id, row_a, 4, NULL));
        CHECK_OK(kva_pool_request_block_table(pool, reqs[1].pool_id, row_b, 4, NULL));
        CHECK(row_a[0] == row_b[0] && row_a[1] == row_b[1] && row_a[2] != row_b[2]);
        CHECK_OK(kva_pool_check(pool));
    }
    serve_sched_destroy(s);
    kva_pool_destroy(pool);
    serve_workload_free(reqs, 2);
}

/* The metric definitions on a hand-made run: request 0 submitted at 0 with
 * tokens at 1.0, 1.5 and 2.5 s; request 1 submitted at 0.5 with one token at
 * 1.2 s. Expected values computed by hand from vllm bench serve's formulas. */
static void test_metrics_definitions(void)
{
    double t0[] = {1.0, 1.5, 2.5}, t1[] = {1.2};
    serve_req reqs[2];
    memset(reqs, 0, sizeof reqs);
    reqs[0].prompt_len = 10;
    reqs[0].output_len = reqs[0].num_output = 3;
    reqs[0].submit_s = 0.0;
    reqs[0].token_s = t0;
    reqs[1].prompt_len = 20;
    reqs[1].output_len = reqs[1].num_output = 1;
    reqs[1].submit_s = 0.5;
    reqs[1].token_s = t1;
    reqs[0].state = reqs[1].state = SERVE_REQ_FINISHED;
    serve_run run;
    memset(&run, 0, sizeof run);
    run.reqs = reqs;
    run.num_reqs = 2;
    run.duration_s = 2.5;
    run.stats.step_s = 2.0;
    run.stats.attention_s = 1.5;
    run.stats.admitted_tokens = 100;
    run.stats.cached_tokens = 25;
    serve_metrics m;
    CHECK(serve_metrics_compute(&run, &m));
#define NEAR(x, want)                                                                              \
    CHECK_MSG(fabs((x) - (want)) < 1e-9, "%s = %.12g, expected %.12g", #x, x, want)
    CHECK(m.completed == 2 && m.total_input == 30 && m.total_output == 4);
    NEAR(m.request_throughput, 0.8);
    NEAR(m.output_throughput, 1.6);
    NEAR(m.total_token_throughput, 13.6);
    /* TTFT samples 1.0 and 0.7 s. */
    NEAR(m.mean_ttft_ms, 850.0);
    NEAR(m.median_ttft_ms, 850.0);
    NEAR(m.std_ttft_ms, 150.0);
    NEAR(m.p99_ttft_ms, 997.0);
    /* TPOT: request 0 only, (2.5 - 1.0) / 2; request 1 has one token. */
    NEAR(m.mean_tpot_ms, 750.0);
    NEAR(m.p99_tpot_ms, 750.0);
    /* ITL samples 0.5 and 1.0 s. */
    NEAR(m.mean_itl_ms, 750.0);
    NEAR(m.median_itl_ms, 750.0);
    NEAR(m.p99_itl_ms, 995.0);
    /* E2EL 2.5 and 0.7 s. */
    NEAR(m.mean_e2el_ms, 1600.0);
    NEAR(m.std_e2el_ms, 900.0);
    /* Tokens at 1.0, 1.2, 1.5 fall in bucket [1, 2); both requests are in
     * flight during buckets 0 and 1. */
    NEAR(m.max_output_tokens_per_s, 3.0);
    CHECK(m.max_concurrent_requests == 2);
    NEAR(m.prefix_hit_rate, 0.25);
    NEAR(m.attention_share, 0.75);
    /* The same run 0.6 s later (the first request arrived after a delay):
     * the buckets count from the first submission, so the peaks stay. */
    double u0[] = {1.6, 2.1, 3.1}, u1[] = {1.8};
    reqs[0].submit_s = 0.6;
    reqs[0].token_s = u0;
    reqs[1].submit_s = 1.1;
    reqs[1].token_s = u1;
    run.duration_s = 3.1;
    CHECK(serve_metrics_compute(&run, &m));
    NEAR(m.mean_ttft_ms, 850.0);
    NEAR(m.max_output_tokens_per_s, 3.0);
    CHECK(m.max_concurrent_requests == 2);
#undef NEAR
}

int main(void)
{
    RUN(test_percentile);
    RUN(test_metrics_definitions);
    RUN(test_sched_policy);
    RUN(test_sched_same_step_hit);
    RUN(test_basic_run);
    RUN(test_preemption);
    RUN(test_prefix_hits);
    RUN(test_no_chunked_prefill);
    RUN(test_rate_and_concurrency);
    RUN(test_poisson_unlimited);
    RUN(test_verify);
    RUN(test_verify_quant);
    RUN(test_verify_cascade);
    RUN(test_verify_detects);
    RUN(test_mla);
    RUN(test_mla_preset);
    RUN(test_chunk_preset);
    RUN(test_cuda_unavailable);
    RUN(test_pool_too_small);
    RUN(test_deterministic);
    return kva_test_finish();
}
