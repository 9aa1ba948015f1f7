/*
 * serve_workload.c - the simulated requests, like vllm bench serve's random
 * dataset: every prompt is a shared prefix of --prefix-len random token ids
 * followed by its own random part of about --input-len tokens; each request
 * generates about --output-len tokens and never stops early (ignore_eos).
 * Lengths are uniform integers in [floor(len * (1 - r)), ceil(len * (1 + r))]
 * with r the range ratio. Arrivals follow vllm bench serve's Poisson process
 * of --request-rate requests per second: an exponential delay before every
 * request (the first one too), the cumulative delays then scaled so that the
 * last request arrives at num_prompts / rate. All requests come at time 0
 * when the rate is 0 (inf on the command line).
 */
#include "serve_sim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Token ids are drawn below this vocabulary size (Llama 2's 32000). */
#define SERVE_VOCAB 32000

/* splitmix64: one stream per use, seeded from the run's seed. */
static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double rng_unit(uint64_t *s)
{
    return (double)(rng_next(s) >> 11) * 0x1.0p-53;
}

/* Uniform integer in [lo, hi]. */
static int32_t rng_int(uint64_t *s, int32_t lo, int32_t hi)
{
    return lo + (int32_t)(rng_next(s) % (uint64_t)((int64_t)hi - lo + 1));
}

/* A length uniform in [floor(len * (1 - r)), ceil(len * (1 + r))] (vLLM's
 * bounds), at least lo. */
static int32_t sample_len(uint64_t *s, int32_t len, double r, int32_t lo)
{
    int32_t a = (int32_t)floor(len * (1.0 - r)), b = (int32_t)ceil(len * (1.0 + r));
    int32_t v = rng_int(s, a < b ? a : b, b);
    return v < lo ? lo : v;
}

int serve_workload_create(const serve_opts *o, serve_req **out)
{
    const int32_t n = o->num_prompts;
    serve_req *reqs = calloc((size_t)n, sizeof *reqs);
    int32_t *prefix = malloc(((size_t)o->prefix_len + 1) * sizeof *prefix);
    if (!reqs || !prefix) {
        free(reqs);
        free(prefix);
        return 0;
    }
    uint64_t s = o->seed ^ 0x5e27e5e2ull;
    for (int32_t i = 0; i < o->prefix_len; i++)
        prefix[i] = rng_int(&s, 0, SERVE_VOCAB - 1);
    double t = 0.0;
    for (int32_t i = 0; i < n; i++) {
        serve_req *r = &reqs[i];
        /* A prompt has at least one token of its own after the prefix when the
         * prefix is empty, and at least one output token. */
        int32_t own = sample_len(&s, o->input_len, o->range_ratio, o->prefix_len > 0 ? 0 : 1);
        r->prompt_len = o->prefix_len + own;
        r->output_len = sample_len(&s, o->output_len, o->range_ratio, 1);
        size_t total = (size_t)r->prompt_len + (size_t)r->output_len;
        r->tokens = malloc(total * sizeof *r->tokens);
        r->token_s = malloc((size_t)r->output_len * sizeof *r->token_s);
        if (!r->tokens || !r->token_s) {
            serve_workload_free(reqs, n);
            free(prefix);
            return 0;
        }
        memcpy(r->tokens, prefix, (size_t)o->prefix_len * sizeof *prefix);
        for (size_t k = (size_t)o->prefix_len; k < total; k++)
            r->tokens[k] = rng_int(&s, 0, SERVE_VOCAB - 1);
        if (o->request_rate > 0)
            t += -log(1.0 - rng_unit(&s)) / o->request_rate;
        r->arrival_s = t;
        r->state = SERVE_REQ_PENDING;
        r->num_tokens = r->prompt_len;
        r->pool_id = -1;
    }
    /* As vllm bench serve does: scale the arrivals so that the last one is at
     * exactly num_prompts / rate, which keeps the offered load equal across
     * seeds (the sum of exponential gaps alone is off by a few percent). */
    if (o->request_rate > 0 && t > 0) {
        double scale = (double)n / o->request_rate / t;
        for (int32_t i = 0; i < n; i++)
            reqs[i].arrival_s *= scale;
    }
    free(prefix);
    *out = reqs;
    return 1;
}

void serve_workload_free(serve_req *reqs, int32_t n)
{
    if (!reqs)
        return;
    for (int32_t i = 0; i < n; i++) {
        free(reqs[i].tokens);
        free(reqs[i].token_s);
    }
    free(reqs);
}
