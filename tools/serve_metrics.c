/*
 * serve_metrics.c - the metrics of `kvattn serve-sim`, defined as vllm bench
 * serve defines them, and their table and JSON file.
 *
 * Per request (times on the virtual clock, t_k the time of output token k):
 *   TTFT = t_1 - submit time; E2EL = t_n - submit time;
 *   TPOT = (t_n - t_1) / (n - 1), only for requests with n > 1 tokens;
 *   ITL  = every gap t_{k+1} - t_k, pooled over all requests.
 * Mean, median, standard deviation and P99 (numpy's linear interpolation) are
 * over those samples. Throughputs divide totals by the duration (start to the
 * last token). Peak output token throughput is the most tokens generated in
 * one 1-second bucket counted from the first submission; peak concurrent
 * requests the most requests in flight during one such bucket.
 */
#define _POSIX_C_SOURCE 200809L
#include "serve_sim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double serve_percentile(double *v, size_t n, double p)
{
    if (n == 0)
        return 0.0;
    qsort(v, n, sizeof *v, cmp_double);
    double pos = p / 100.0 * (double)(n - 1);
    size_t lo = (size_t)floor(pos), hi = lo + 1 < n ? lo + 1 : lo;
    return v[lo] + (v[hi] - v[lo]) * (pos - (double)lo);
}

/* Mean, median, std and P99 of v [n] in milliseconds (v is sorted). */
static void summarize(double *v, size_t n, double *mean, double *median, double *p99, double *sd)
{
    double s = 0.0, s2 = 0.0;
    for (size_t i = 0; i < n; i++)
        s += v[i];
    *mean = n ? s / (double)n * 1e3 : 0.0;
    for (size_t i = 0; i < n; i++)
        s2 += (v[i] - s / (double)n) * (v[i] - s / (double)n);
    *sd = n ? sqrt(s2 / (double)n) * 1e3 : 0.0;
    *median = serve_percentile(v, n, 50.0) * 1e3;
    *p99 = serve_percentile(v, n, 99.0) * 1e3;
}

int serve_metrics_compute(const serve_run *run, serve_metrics *m)
{
    memset(m, 0, sizeof *m);
    const int32_t n = run->num_reqs;
    size_t n_itl = 0;
    for (int32_t i = 0; i < n; i++)
        n_itl += run->reqs[i].num_output > 1 ? (size_t)run->reqs[i].num_output - 1 : 0;
    double *ttft = malloc(((size_t)n + 1) * sizeof *ttft);
    double *tpot = malloc(((size_t)n + 1) * sizeof *tpot);
    double *e2el = malloc(((size_t)n + 1) * sizeof *e2el);
    double *itl = malloc((n_itl + 1) * sizeof *itl);
    /* The 1-s buckets start at the first submission, as vLLM's start at the
     * earliest request start. */
    double t_min = INFINITY, t_max = 0.0;
    for (int32_t i = 0; i < n; i++) {
        const serve_req *r = &run->reqs[i];
        if (r->state != SERVE_REQ_FINISHED)
            continue;
        t_min = r->submit_s < t_min ? r->submit_s : t_min;
        t_max = r->token_s[r->num_output - 1] > t_max ? r->token_s[r->num_output - 1] : t_max;
    }
    if (!(t_min <= t_max))
        t_min = t_max = 0.0;
    int32_t nb = (int32_t)ceil(t_max - t_min) + 1;
    double *tok_bucket = calloc((size_t)nb, sizeof *tok_bucket);
    int32_t *conc_bucket = calloc((size_t)nb, sizeof *conc_bucket);
    if (!ttft || !tpot || !e2el || !itl || !tok_bucket || !conc_bucket) {
        free(ttft);
        free(tpot);
        free(e2el);
        free(itl);
        free(tok_bucket);
        free(conc_bucket);
        return 0;
    }
    size_t n_tpot = 0, k_itl = 0;
    for (int32_t i = 0; i < n; i++) {
        const serve_req *r = &run->reqs[i];
        if (r->state != SERVE_REQ_FINISHED)
            continue;
        int32_t no = r->num_output;
        m->completed++;
        m->total_input += r->prompt_len;
        m->total_output += no;
        double first = r->token_s[0], last = r->token_s[no - 1];
        ttft[m->completed - 1] = first - r->submit_s;
        e2el[m->completed - 1] = last - r->submit_s;
        if (no > 1)
            tpot[n_tpot++] = (last - first) / (double)(no - 1);
        for (int32_t k = 0; k < no; k++) {
            if (k > 0)
                itl[k_itl++] = r->token_s[k] - r->token_s[k - 1];
            int32_t bkt = (int32_t)(r->token_s[k] - t_min);
            if (bkt >= 0 && bkt < nb)
                tok_bucket[bkt] += 1.0;
        }
        for (int32_t s = (int32_t)(r->submit_s - t_min); s <= (int32_t)(last - t_min) && s < nb;
             s++)
            conc_bucket[s]++;
    }
    for (int32_t s = 0; s < nb; s++) {
        if (tok_bucket[s] > m->max_output_tokens_per_s)
            m->max_output_tokens_per_s = tok_bucket[s];
        if (conc_bucket[s] > m->max_concurrent_requests)
            m->max_concurrent_requests = conc_bucket[s];
    }
    m->duration_s = run->duration_s;
    double d = run->duration_s > 0 ? run->duration_s : 1e-9;
    m->request_throughput = m->completed / d;
    m->output_throughput = (double)m->total_output / d;
    m->total_token_throughput = (double)(m->total_input + m->total_output) / d;
    summarize(ttft, (size_t)m->completed, &m->mean_ttft_ms, &m->median_ttft_ms, &m->p99_ttft_ms,
              &m->std_ttft_ms);
    summarize(tpot, n_tpot, &m->mean_tpot_ms, &m->median_tpot_ms, &m->p99_tpot_ms, &m->std_tpot_ms);
    summarize(itl, k_itl, &m->mean_itl_ms, &m->median_itl_ms, &m->p99_itl_ms, &m->std_itl_ms);
    summarize(e2el, (size_t)m->completed, &m->mean_e2el_ms, &m->median_e2el_ms, &m->p99_e2el_ms,
              &m->std_e2el_ms);
    const serve_stats *st = &run->stats;
    m->prefix_hit_rate =
        st->admitted_tokens > 0 ? (double)st->cached_tokens / (double)st->admitted_tokens : 0.0;
    double busy = st->step_s > 0 ? st->step_s : 1e-9;
    m->attention_share = st->attention_s / busy;
    m->write_share = st->write_s / busy;
    m->plan_share = st->plan_s / busy;
    m->decode_plan_share = st->step_s_by_state[KVA_STATE_DECODE_ONLY] > 0
                               ? st->plan_s_by_state[KVA_STATE_DECODE_ONLY] /
                                     st->step_s_by_state[KVA_STATE_DECODE_ONLY]
                               : 0.0;
    const int64_t dec = st->steps_by_state[KVA_STATE_DECODE_ONLY];
    m->mean_step_ms = st->steps > 0 ? 1e3 * st->step_s / (double)st->steps : 0.0;
    m->mean_decode_step_ms =
        dec > 0 ? 1e3 * st->step_s_by_state[KVA_STATE_DECODE_ONLY] / (double)dec : 0.0;
    free(ttft);
    free(tpot);
    free(e2el);
    free(itl);
    free(tok_bucket);
    free(conc_bucket);
    return 1;
}

void serve_print_header(FILE *f, const serve_opts *o, const serve_run *run)
{
    double mib = (double)serve_block_bytes(o) * (double)run->num_blocks / (1024.0 * 1024.0);
    char who[200];
    if (o->backend == KVA_BACKEND_CUDA)
        snprintf(who, sizeof who, "%s", run->device);
    else
        snprintf(who, sizeof who, "%d threads", (int)run->threads);
    char fmt[64] = "";
    if (o->kv_quant != KVA_QUANT_NONE)
        snprintf(fmt, sizeof fmt, " KV %s", kva_quant_name(o->kv_quant));
    char shape[96];
    if (o->kind == KVA_ATTN_MLA)
        snprintf(shape, sizeof shape, "MLA H=%d Dc=%d Dr=%d Dn=%d Dv=%d", (int)o->heads,
                 (int)o->mla_kv_rank, (int)o->mla_rope_dim, (int)o->mla_nope_dim,
                 (int)o->mla_v_dim);
    else if (o->attention_chunk > 0)
        snprintf(shape, sizeof shape, "H=%d Hkv=%d D=%d chunk %d (global every %d)", (int)o->heads,
                 (int)o->kv_heads, (int)o->head_dim, (int)o->attention_chunk,
                 (int)o->chunk_global_every);
    else
        snprintf(shape, sizeof shape, "H=%d Hkv=%d D=%d", (int)o->heads, (int)o->kv_heads,
                 (int)o->head_dim);
    fprintf(f,
            "serve-sim: backend %s (%s); model %d layers %s %s%s B=%d; "
            "KV pool %d blocks (%.0f MiB)\n",
            kva_backend_name(o->backend), who, (int)o->layers, shape, kva_dtype_name(o->dtype), fmt,
            (int)o->block_size, (int)run->num_blocks, mib);
    fprintf(f, "serve-sim: %d prompts, prefix %d + input %d, output %d, range ratio %g, rate %s",
            (int)o->num_prompts, (int)o->prefix_len, (int)o->input_len, (int)o->output_len,
            o->range_ratio, o->request_rate > 0 ? "" : "inf");
    if (o->request_rate > 0)
        fprintf(f, "%g", o->request_rate);
    fprintf(f,
            "; max-num-seqs %d, max-num-batched-tokens %d, chunked prefill %s, prefix caching "
            "%s, seed %llu\n",
            (int)o->max_num_seqs, (int)o->max_num_batched_tokens, o->chunked_prefill ? "on" : "off",
            o->prefix_caching ? "on" : "off", (unsigned long long)o->seed);
}

static void rule(FILE *f, const char *title, char c)
{
    int n = (int)strlen(title), left = (50 - n) / 2, right = 50 - n - left;
    for (int i = 0; i < left; i++)
        fputc(c, f);
    fputs(title, f);
    for (int i = 0; i < right; i++)
        fputc(c, f);
    fputc('\n', f);
}

#define ROW_I(name, v) fprintf(f, "%-40s %lld\n", name, (long long)(v))
#define ROW_F(name, v) fprintf(f, "%-40s %.2f\n", name, (double)(v))

void serve_print_table(FILE *f, const serve_opts *o, const serve_run *run, const serve_metrics *m)
{
    const serve_stats *st = &run->stats;
    rule(f, " Serving Benchmark Result ", '=');
    ROW_I("Successful requests:", m->completed);
    ROW_I("Failed requests:", 0); /* a failing run stops with an error instead */
    if (o->max_concurrency > 0)
        ROW_I("Maximum request concurrency:", o->max_concurrency);
    if (o->request_rate > 0)
        ROW_F("Request rate configured (RPS):", o->request_rate);
    ROW_F("Benchmark duration (s):", m->duration_s);
    ROW_I("Total input tokens:", m->total_input);
    ROW_I("Total generated tokens:", m->total_output);
    ROW_F("Request throughput (req/s):", m->request_throughput);
    ROW_F("Output token throughput (tok/s):", m->output_throughput);
    ROW_F("Peak output token throughput (tok/s):", m->max_output_tokens_per_s);
    ROW_I("Peak concurrent requests:", m->max_concurrent_requests);
    ROW_F("Total Token throughput (tok/s):", m->total_token_throughput);
    rule(f, "Time to First Token", '-');
    ROW_F("Mean TTFT (ms):", m->mean_ttft_ms);
    ROW_F("Median TTFT (ms):", m->median_ttft_ms);
    ROW_F("P99 TTFT (ms):", m->p99_ttft_ms);
    rule(f, "Time per Output Token (excl. 1st token)", '-');
    ROW_F("Mean TPOT (ms):", m->mean_tpot_ms);
    ROW_F("Median TPOT (ms):", m->median_tpot_ms);
    ROW_F("P99 TPOT (ms):", m->p99_tpot_ms);
    rule(f, "Inter-token Latency", '-');
    ROW_F("Mean ITL (ms):", m->mean_itl_ms);
    ROW_F("Median ITL (ms):", m->median_itl_ms);
    ROW_F("P99 ITL (ms):", m->p99_itl_ms);
    rule(f, "kvattn engine", '-');
    ROW_F("Prefix cache hit rate (%):", 100.0 * m->prefix_hit_rate);
    if (o->backend == KVA_BACKEND_CUDA) {
        /* Device times (CUDA events) over the steps' wall time. */
        ROW_F("GPU attention share of step time (%):", 100.0 * m->attention_share);
        ROW_F("GPU KV write share of step time (%):", 100.0 * m->write_share);
        ROW_F("Host plan share of step time (%):", 100.0 * m->plan_share);
        if (st->steps_by_state[KVA_STATE_DECODE_ONLY] > 0)
            ROW_F("  of decode-only step time (%):", 100.0 * m->decode_plan_share);
        ROW_F("Host plan time, most in a step (us):", 1e6 * st->plan_max_s);
        /* Where the plan time goes: its sum and steps per step state (the
         * first step's plan and the prefill steps' are larger ones). */
        fprintf(f, "%-40s", "Host plan time by state (us / steps):");
        for (int k = 0; k <= KVA_STATE_EMPTY; k++)
            if (st->steps_by_state[k] > 0)
                fprintf(f, " %s %.1f / %lld;", kva_attn_state_name((kva_attn_state)k),
                        1e6 * st->plan_s_by_state[k], (long long)st->steps_by_state[k]);
        fprintf(f, "\n");
    } else {
        ROW_F("Attention share of step time (%):", 100.0 * m->attention_share);
        ROW_F("KV cache write share of step time (%):", 100.0 * m->write_share);
    }
    fprintf(f, "%-40s %lld (", "Engine steps:", (long long)st->steps);
    for (int s = 0, first = 1; s <= KVA_STATE_EMPTY; s++) {
        if (st->steps_by_state[s] == 0)
            continue;
        fprintf(f, "%s%lld %s", first ? "" : ", ", (long long)st->steps_by_state[s],
                kva_attn_state_name((kva_attn_state)s));
        first = 0;
    }
    fprintf(f, ")\n");
    ROW_I("Preemptions:", st->preemptions);
    ROW_F("Peak KV cache usage (%):", 100.0 * st->peak_kv_usage);
    ROW_I("KV cache bytes per token:", serve_token_bytes(o));
    if (o->kind == KVA_ATTN_MLA)
        fprintf(f, "%-40s %lld (%.1fx the MLA cache)\n",
                "  MHA of the same heads:", (long long)serve_token_bytes_mha(o),
                (double)serve_token_bytes_mha(o) / (double)serve_token_bytes(o));
    if (o->dcp) {
        /* serve_dcp.c: each rank's caches keep B of every N * B pool tokens. */
        const int64_t local = (int64_t)(run->num_blocks - 1) * o->block_size;
        fprintf(f, "%-40s %d ranks, interleave %d\n", "DCP (mpirun):", (int)o->dcp,
                (int)o->dcp_interleave);
        fprintf(f, "%-40s %lld per rank, %lld in the pool (%dx)\n",
                "KV cache token capacity:", (long long)local, (long long)local * o->dcp,
                (int)o->dcp);
        ROW_F("Combine share of step time (%):",
              st->step_s > 0 ? 100.0 * st->combine_s / st->step_s : 0.0);
    }
    ROW_F("Mean step time (ms):", m->mean_step_ms);
    if (st->steps_by_state[KVA_STATE_DECODE_ONLY] > 0)
        ROW_F("Mean decode-only step time (ms):", m->mean_decode_step_ms);
    if (o->verify)
        fprintf(f, "%-40s %d steps, %d failed (max abs err %.3g)\n",
                o->dcp ? "Unsharded check (layer 0):" : "Reference check:", (int)st->verify_steps,
                (int)st->verify_failures, st->verify_max_err);
    rule(f, "", '=');
}

int serve_write_json(const char *path, const serve_opts *o, const serve_run *run,
                     const serve_metrics *m)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return -1;
    const serve_stats *st = &run->stats;
    char date[32] = "";
    time_t now = time(NULL);
    struct tm tmv;
    if (gmtime_r(&now, &tmv))
        strftime(date, sizeof date, "%Y%m%d-%H%M%S", &tmv);
    fprintf(f, "{\n  \"date\": \"%s\",\n  \"backend\": \"kvattn-%s\",\n", date,
            kva_backend_name(o->backend));
    fprintf(f, "  \"num_prompts\": %d,\n", (int)o->num_prompts);
    if (o->request_rate > 0)
        fprintf(f, "  \"request_rate\": %.17g,\n", o->request_rate);
    else
        fprintf(f, "  \"request_rate\": \"inf\",\n");
    fprintf(f, "  \"burstiness\": 1.0,\n"); /* Poisson arrivals */
    if (o->max_concurrency > 0)
        fprintf(f, "  \"max_concurrency\": %d,\n", (int)o->max_concurrency);
    else
        fprintf(f, "  \"max_concurrency\": null,\n");
    fprintf(f, "  \"duration\": %.9g,\n  \"completed\": %d,\n  \"failed\": 0,\n", m->duration_s,
            (int)m->completed);
    fprintf(f, "  \"total_input_tokens\": %lld,\n  \"total_output_tokens\": %lld,\n",
            (long long)m->total_input, (long long)m->total_output);
    fprintf(f, "  \"request_throughput\": %.9g,\n  \"output_throughput\": %.9g,\n",
            m->request_throughput, m->output_throughput);
    fprintf(f, "  \"total_token_throughput\": %.9g,\n", m->total_token_throughput);
    fprintf(f, "  \"max_output_tokens_per_s\": %.9g,\n  \"max_concurrent_requests\": %d,\n",
            m->max_output_tokens_per_s, (int)m->max_concurrent_requests);
    struct {
        const char *name;
        double mean, median, sd, p99;
    } rows[] = {{"ttft", m->mean_ttft_ms, m->median_ttft_ms, m->std_ttft_ms, m->p99_ttft_ms},
                {"tpot", m->mean_tpot_ms, m->median_tpot_ms, m->std_tpot_ms, m->p99_tpot_ms},
                {"itl", m->mean_itl_ms, m->median_itl_ms, m->std_itl_ms, m->p99_itl_ms}};
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
        fprintf(f,
                "  \"mean_%s_ms\": %.9g,\n  \"median_%s_ms\": %.9g,\n  \"std_%s_ms\": %.9g,\n"
                "  \"p99_%s_ms\": %.9g,\n",
                rows[i].name, rows[i].mean, rows[i].name, rows[i].median, rows[i].name, rows[i].sd,
                rows[i].name, rows[i].p99);
    fprintf(f,
            "  \"mean_e2el_ms\": %.9g,\n  \"median_e2el_ms\": %.9g,\n  \"std_e2el_ms\": %.9g,\n"
            "  \"p99_e2el_ms\": %.9g,\n",
            m->mean_e2el_ms, m->median_e2el_ms, m->std_e2el_ms, m->p99_e2el_ms);
    const char *lists[] = {"input_lens", "output_lens", "ttfts"};
    for (int li = 0; li < 3; li++) {
        fprintf(f, "  \"%s\": [", lists[li]);
        for (int32_t i = 0; i < run->num_reqs; i++) {
            const serve_req *r = &run->reqs[i];
            if (li == 0)
                fprintf(f, "%s%d", i ? ", " : "", (int)r->prompt_len);
            else if (li == 1)
                fprintf(f, "%s%d", i ? ", " : "", (int)r->num_output);
            else
                fprintf(f, "%s%.9g", i ? ", " : "",
                        r->num_output > 0 ? r->token_s[0] - r->submit_s : 0.0);
        }
        fprintf(f, "],\n");
    }
    /* itls: per request, the gaps between its output tokens (seconds). */
    fprintf(f, "  \"itls\": [");
    for (int32_t i = 0; i < run->num_reqs; i++) {
        const serve_req *r = &run->reqs[i];
        fprintf(f, "%s[", i ? ", " : "");
        for (int32_t k = 1; k < r->num_output; k++)
            fprintf(f, "%s%.9g", k > 1 ? ", " : "", r->token_s[k] - r->token_s[k - 1]);
        fprintf(f, "]");
    }
    fprintf(f, "],\n");
    fprintf(f, "  \"kvattn\": {\n");
    fprintf(f,
            "    \"model\": {\"layers\": %d, \"num_heads\": %d, \"num_kv_heads\": %d, "
            "\"head_dim\": %d, \"dtype\": \"%s\", \"kv_quant\": \"%s\", \"block_size\": %d, "
            "\"num_blocks\": %d, \"attention\": \"%s\"",
            (int)o->layers, (int)o->heads, (int)o->kv_heads, (int)o->head_dim,
            kva_dtype_name(o->dtype), kva_quant_name(o->kv_quant), (int)o->block_size,
            (int)run->num_blocks, o->kind == KVA_ATTN_MLA ? "mla" : "mha");
    if (o->attention_chunk > 0)
        fprintf(f, ", \"attention_chunk\": %d, \"chunk_global_every\": %d", (int)o->attention_chunk,
                (int)o->chunk_global_every);
    if (o->kind == KVA_ATTN_MLA)
        fprintf(f,
                ", \"kv_lora_rank\": %d, \"qk_rope_head_dim\": %d, \"qk_nope_head_dim\": %d, "
                "\"v_head_dim\": %d",
                (int)o->mla_kv_rank, (int)o->mla_rope_dim, (int)o->mla_nope_dim, (int)o->mla_v_dim);
    fprintf(f, "},\n");
    fprintf(f,
            "    \"scheduler\": {\"max_num_batched_tokens\": %d, \"max_num_seqs\": %d, "
            "\"chunked_prefill\": %s, \"prefix_caching\": %s},\n",
            (int)o->max_num_batched_tokens, (int)o->max_num_seqs,
            o->chunked_prefill ? "true" : "false", o->prefix_caching ? "true" : "false");
    fprintf(f,
            "    \"workload\": {\"input_len\": %d, \"output_len\": %d, \"prefix_len\": %d, "
            "\"range_ratio\": %.9g, \"seed\": %llu},\n",
            (int)o->input_len, (int)o->output_len, (int)o->prefix_len, o->range_ratio,
            (unsigned long long)o->seed);
    fprintf(f, "    \"threads\": %d,\n    \"wall_s\": %.9g,\n", (int)run->threads, run->wall_s);
    if (o->backend == KVA_BACKEND_CUDA)
        fprintf(f, "    \"device\": \"%s\",\n    \"device_times\": \"cuda events\",\n",
                run->device);
    fprintf(f, "    \"prefix_cache_hit_rate\": %.9g,\n", m->prefix_hit_rate);
    fprintf(f, "    \"admitted_tokens\": %lld,\n    \"cached_tokens\": %lld,\n",
            (long long)st->admitted_tokens, (long long)st->cached_tokens);
    fprintf(f, "    \"pool_query_tokens\": %lld,\n    \"pool_hit_tokens\": %lld,\n",
            (long long)run->pool_stats.query_tokens, (long long)run->pool_stats.hit_tokens);
    fprintf(f, "    \"evicted_blocks\": %lld,\n", (long long)run->pool_stats.num_evicted_blocks);
    fprintf(f, "    \"step_s\": %.9g,\n    \"attention_s\": %.9g,\n    \"cache_write_s\": %.9g,\n",
            st->step_s, st->attention_s, st->write_s);
    fprintf(f, "    \"plan_s\": %.9g,\n    \"plan_max_s\": %.9g,\n", st->plan_s, st->plan_max_s);
    fprintf(f, "    \"decode_plan_share\": %.9g,\n", m->decode_plan_share);
    fprintf(f, "    \"mean_step_ms\": %.9g,\n    \"mean_decode_step_ms\": %.9g,\n", m->mean_step_ms,
            m->mean_decode_step_ms);
    fprintf(f, "    \"kv_bytes_per_token\": %lld,\n    \"kv_bytes_per_token_mha\": %lld,\n",
            (long long)serve_token_bytes(o), (long long)serve_token_bytes_mha(o));
    fprintf(f, "    \"attention_share\": %.9g,\n    \"cache_write_share\": %.9g,\n",
            m->attention_share, m->write_share);
    fprintf(f, "    \"steps\": %lld,\n    \"steps_by_state\": {", (long long)st->steps);
    for (int s = 0; s <= KVA_STATE_EMPTY; s++)
        fprintf(f, "%s\"%s\": %lld", s ? ", " : "", kva_attn_state_name((kva_attn_state)s),
                (long long)st->steps_by_state[s]);
    fprintf(f, "},\n    \"scheduled_tokens\": %lld,\n", (long long)st->scheduled_tokens);
    fprintf(f, "    \"preemptions\": %lld,\n    \"peak_running\": %d,\n",
            (long long)st->preemptions, (int)st->peak_running);
    fprintf(f, "    \"peak_kv_cache_usage\": %.9g", st->peak_kv_usage);
    if (o->verify)
        fprintf(f,
                ",\n    \"verify\": {\"steps\": %d, \"failures\": %d, \"tokens\": %lld, "
                "\"max_abs_err\": %.9g}",
                (int)st->verify_steps, (int)st->verify_failures, (long long)st->verify_tokens,
                st->verify_max_err);
    fprintf(f, "\n  }\n}\n");
    return fclose(f) == 0 ? 0 : -1;
}
