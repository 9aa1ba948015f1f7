/*
 * serve_sched.c - the scheduler of `kvattn serve-sim`, modeled on vLLM v1's.
 *
 * A request has num_tokens known tokens (prompt + generated so far) of which
 * num_computed have their KV in the cache. Every step gives each scheduled
 * request num_tokens - num_computed new tokens, or fewer when the step's token
 * budget (max_num_batched_tokens) runs out (chunked prefill). When a step
 * brings num_computed up to num_tokens, the request samples its next token:
 * a prefill's last chunk yields the first output token, and every decode step
 * (one new token) yields one more. So prefill and decode are one rule.
 *
 * Policy of one step:
 *  1. Running requests, in admission order: each gets its new tokens (capped
 *     by the remaining budget when chunked prefill is on). If the pool cannot
 *     hold them, the most recently admitted running request is preempted: its
 *     blocks are freed, its computed tokens forgotten (recompute, not swap),
 *     and it goes to the front of the waiting queue. This repeats until the
 *     allocation succeeds or the request preempted itself.
 *  2. Waiting requests, first come first served, unless step 1 preempted
 *     someone: while the budget lasts and fewer than max_num_seqs run, the
 *     head of the queue is looked up in the prefix cache
 *     (kva_pool_request_add), and admitted if its uncached tokens (or a chunk
 *     of them) can be allocated; otherwise it is released and admission stops
 *     for this step (no skipping ahead, so no starvation).
 * A scheduled request's new tokens are committed to the pool at once
 * (batch_add), so later admissions in the same step hit the blocks it fills.
 * A preempted request is looked up again on readmission, with its generated
 * tokens as part of its prompt, so its own blocks hit if nobody evicted them.
 */
#include "serve_sim.h"

#include <stdlib.h>
#include <string.h>

struct serve_sched {
    serve_req *reqs;
    int32_t n;
    kva_pool *pool;
    int32_t budget; /* max_num_batched_tokens */
    int32_t max_seqs;
    int chunked;
    int32_t *waiting; /* [n] ring buffer of request indices */
    int32_t w_head, w_count;
    int32_t *running; /* [n] request indices in admission order */
    int32_t n_running;
    /* The step's batch. */
    int32_t *b_req, *b_pool, *b_ctx, *b_new; /* [n] each */
    int32_t b_n;
};

kva_status serve_sched_create(const serve_opts *o, serve_req *reqs, int32_t n, kva_pool *pool,
                              serve_sched **out)
{
    serve_sched *s = calloc(1, sizeof *s);
    if (!s)
        return KVA_STATUS_OUT_OF_MEMORY;
    size_t cap = (size_t)n + 1;
    s->waiting = malloc(cap * sizeof(int32_t));
    s->running = malloc(cap * sizeof(int32_t));
    s->b_req = malloc(cap * sizeof(int32_t));
    s->b_pool = malloc(cap * sizeof(int32_t));
    s->b_ctx = malloc(cap * sizeof(int32_t));
    s->b_new = malloc(cap * sizeof(int32_t));
    if (!s->waiting || !s->running || !s->b_req || !s->b_pool || !s->b_ctx || !s->b_new) {
        serve_sched_destroy(s);
        return KVA_STATUS_OUT_OF_MEMORY;
    }
    s->reqs = reqs;
    s->n = n;
    s->pool = pool;
    s->budget = o->max_num_batched_tokens;
    s->max_seqs = o->max_num_seqs;
    s->chunked = o->chunked_prefill;
    *out = s;
    return KVA_STATUS_OK;
}

void serve_sched_destroy(serve_sched *s)
{
    if (!s)
        return;
    free(s->waiting);
    free(s->running);
    free(s->b_req);
    free(s->b_pool);
    free(s->b_ctx);
    free(s->b_new);
    free(s);
}

int32_t serve_sched_num_waiting(const serve_sched *s)
{
    return s->w_count;
}

int32_t serve_sched_num_running(const serve_sched *s)
{
    return s->n_running;
}

int32_t serve_sched_head(const serve_sched *s)
{
    return s->w_count > 0 ? s->waiting[s->w_head] : -1;
}

void serve_sched_submit(serve_sched *s, int32_t req)
{
    s->waiting[(s->w_head + s->w_count) % s->n] = req;
    s->w_count++;
    s->reqs[req].state = SERVE_REQ_WAITING;
}

static void push_front(serve_sched *s, int32_t req)
{
    s->w_head = (s->w_head + s->n - 1) % s->n;
    s->waiting[s->w_head] = req;
    s->w_count++;
    s->reqs[req].state = SERVE_REQ_WAITING;
}

/* Adds a request whose blocks are allocated to the step's batch and commits
 * its new tokens to the pool now, as vLLM v1's allocate_slots caches the
 * blocks a step will fill when it schedules them: a request admitted later
 * in the same step already hits them. That is safe because the engine writes
 * every new token's K/V of a layer before it runs that layer's attention. */
static kva_status batch_add(serve_sched *s, int32_t req, int32_t num_new)
{
    serve_req *r = &s->reqs[req];
    kva_status rc =
        kva_pool_request_append_tokens(s->pool, r->pool_id, r->tokens + r->num_computed, num_new);
    if (rc != KVA_STATUS_OK)
        return rc;
    s->b_req[s->b_n] = req;
    s->b_pool[s->b_n] = r->pool_id;
    s->b_ctx[s->b_n] = r->num_computed;
    s->b_new[s->b_n] = num_new;
    s->b_n++;
    return KVA_STATUS_OK;
}

/* Preemption by recompute: the request gives back every block and starts over
 * from the front of the waiting queue. */
static kva_status preempt(serve_sched *s, int32_t req, serve_stats *st)
{
    serve_req *r = &s->reqs[req];
    kva_status rc = kva_pool_request_free(s->pool, r->pool_id);
    if (rc != KVA_STATUS_OK)
        return rc;
    r->pool_id = -1;
    st->discarded_tokens += r->num_computed;
    r->num_computed = 0;
    r->num_preemptions++;
    st->preemptions++;
    push_front(s, req);
    return KVA_STATUS_OK;
}

/* Step 1: the running requests. *preempted receives whether anyone was. */
static kva_status schedule_running(serve_sched *s, int32_t *budget, int *preempted, serve_stats *st)
{
    int32_t i = 0;
    while (*budget > 0 && i < s->n_running) {
        int32_t req = s->running[i];
        serve_req *r = &s->reqs[req];
        int32_t num_new = r->num_tokens - r->num_computed;
        if (num_new > *budget) {
            if (!s->chunked) {
                i++;
                continue;
            }
            num_new = *budget;
        }
        int scheduled = 1;
        for (;;) {
            kva_status rc = kva_pool_request_allocate(s->pool, r->pool_id, num_new, 0);
            if (rc == KVA_STATUS_OK)
                break;
            if (rc != KVA_STATUS_POOL_EXHAUSTED)
                return rc;
            /* Preempt the lowest-priority (most recently admitted) request. */
            int32_t victim = s->running[--s->n_running];
            if ((rc = preempt(s, victim, st)) != KVA_STATUS_OK)
                return rc;
            *preempted = 1;
            if (victim == req) {
                scheduled = 0;
                break;
            }
        }
        if (!scheduled)
            break;
        kva_status rc = batch_add(s, req, num_new);
        if (rc != KVA_STATUS_OK)
            return rc;
        *budget -= num_new;
        i++;
    }
    return KVA_STATUS_OK;
}

/* Step 2: admit waiting requests first come first served. */
static kva_status schedule_waiting(serve_sched *s, int32_t *budget, serve_stats *st)
{
    while (s->w_count > 0 && *budget > 0 && s->n_running < s->max_seqs) {
        int32_t req = s->waiting[s->w_head];
        serve_req *r = &s->reqs[req];
        int32_t pid = -1, cached = 0;
        kva_status rc =
            kva_pool_request_add(s->pool, r->tokens, r->num_tokens, NULL, 0, &pid, &cached);
        if (rc != KVA_STATUS_OK)
            return rc;
        int32_t num_new = r->num_tokens - cached;
        int fits = num_new <= *budget || s->chunked;
        if (num_new > *budget)
            num_new = *budget;
        if (fits) {
            rc = kva_pool_request_allocate(s->pool, pid, num_new, 0);
            if (rc != KVA_STATUS_OK && rc != KVA_STATUS_POOL_EXHAUSTED)
                return rc;
            fits = rc == KVA_STATUS_OK;
        }
        if (!fits) {
            /* Leave it at the head of the queue for a later step. */
            return kva_pool_request_free(s->pool, pid);
        }
        s->w_head = (s->w_head + 1) % s->n;
        s->w_count--;
        r->pool_id = pid;
        r->num_computed = cached;
        r->state = SERVE_REQ_RUNNING;
        s->running[s->n_running++] = req;
        st->admitted_tokens += r->num_tokens;
        st->cached_tokens += cached;
        if ((rc = batch_add(s, req, num_new)) != KVA_STATUS_OK)
            return rc;
        *budget -= num_new;
    }
    return KVA_STATUS_OK;
}

kva_status serve_sched_schedule(serve_sched *s, serve_batch *b, serve_stats *st)
{
    int32_t budget = s->budget;
    int preempted = 0;
    s->b_n = 0;
    kva_status rc = schedule_running(s, &budget, &preempted, st);
    if (rc == KVA_STATUS_OK && !preempted)
        rc = schedule_waiting(s, &budget, st);
    if (rc != KVA_STATUS_OK)
        return rc;
    if (s->n_running > st->peak_running)
        st->peak_running = s->n_running;
    b->num_requests = s->b_n;
    b->pool_ids = s->b_pool;
    b->context = s->b_ctx;
    b->num_new = s->b_new;
    /* Nothing runs and the head of the queue was refused: it alone does not
     * fit the pool, and never will. */
    if (s->b_n == 0 && s->n_running == 0 && s->w_count > 0)
        return KVA_STATUS_POOL_EXHAUSTED;
    return KVA_STATUS_OK;
}

kva_status serve_sched_update(serve_sched *s, int32_t *emitted, int32_t *num_emitted,
                              int32_t *finished, int32_t *num_finished)
{
    int32_t ne = 0, nf = 0;
    for (int32_t k = 0; k < s->b_n; k++) {
        int32_t req = s->b_req[k];
        serve_req *r = &s->reqs[req];
        r->num_computed += s->b_new[k]; /* in the pool since batch_add */
        if (r->num_computed < r->num_tokens)
            continue; /* a prefill chunk that is not the last */
        /* Sample the next token (fixed in advance: tokens[num_tokens]). */
        r->num_output++;
        r->num_tokens++;
        emitted[ne++] = req;
        if (r->num_output == r->output_len) {
            kva_status rc = kva_pool_request_free(s->pool, r->pool_id);
            if (rc != KVA_STATUS_OK)
                return rc;
            r->pool_id = -1;
            r->state = SERVE_REQ_FINISHED;
            finished[nf++] = req;
        }
    }
    /* Drop the finished requests from the running list, keeping the order. */
    if (nf > 0) {
        int32_t w = 0;
        for (int32_t i = 0; i < s->n_running; i++)
            if (s->reqs[s->running[i]].state == SERVE_REQ_RUNNING)
                s->running[w++] = s->running[i];
        s->n_running = w;
    }
    *num_emitted = ne;
    *num_finished = nf;
    return KVA_STATUS_OK;
}
