/*
 * bench_check.c - `kvattn bench` checks the backend under test against the
 * reference backend before timing it.
 *
 * The reference (scalar, fp64 accumulation) is slow, so a large shape is
 * checked on a reduced copy of its batch that still reproduces rows of the full
 * run exactly: a subset of the requests (the first one and the first whose
 * q_len differs, e.g. a decode and the chunked prefill of a mixed batch), and,
 * for causal masks, only the first q' queries of a long request. With a causal
 * mask query i of a request sees keys j <= s - q + i, so dropping the request's
 * last q - q' queries together with their keys (seq_len s - q + q') changes
 * none of the kept rows. The reference reads the same cache (the same shuffled
 * blocks) and the same q rows, and its output is compared with the rows the
 * backend wrote for the full batch.
 */
#include "bench.h"
#include "cli.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The per-dtype tolerances of the test suite, stated once in bench/data.h. */
#include "../bench/data.h"

/* Reference work allowed for the check, in units of (query head, key) pairs
 * times (D + Dv). The reference backend does about 2.2e8 units/s on one core
 * of the 2-core x86-64 development machine, so this is about 1.5 s. */
#define REF_BUDGET 3.0e8

static double ref_cost(const bench_opts *o, int32_t q, int32_t s)
{
    return bench_request_pairs(o, q, s) * (double)(o->head_dim + o->head_dim_v);
}

/* Picks the requests and their kept q_lens; returns the count. */
static int32_t choose_subset(const bench_opts *o, const bench_batch *b, int32_t *sel,
                             int32_t *q_keep, int *truncated)
{
    const int32_t R = b->num_requests;
    double total = 0;
    for (int32_t r = 0; r < R; r++) {
        sel[r] = r;
        q_keep[r] = b->query_start_loc[r + 1] - b->query_start_loc[r];
        total += ref_cost(o, q_keep[r], b->seq_lens[r]);
    }
    *truncated = 0;
    if (total <= REF_BUDGET)
        return R;
    /* The first request, and the first one of another q_len (or the second). */
    int32_t n = R > 0 ? 1 : 0;
    if (R > 1) {
        int32_t other = 1;
        for (int32_t r = 1; r < R; r++) {
            if (q_keep[r] != q_keep[0]) {
                other = r;
                break;
            }
        }
        sel[1] = other;
        q_keep[1] = q_keep[other];
        n = 2;
    }
    if (!o->causal)
        return n;
    /* Causal: halve the longest kept query range until the budget holds. */
    for (;;) {
        double cost = 0;
        int32_t longest = 0;
        for (int32_t k = 0; k < n; k++) {
            int32_t r = sel[k], q = b->query_start_loc[r + 1] - b->query_start_loc[r];
            cost += ref_cost(o, q_keep[k], b->seq_lens[r] - q + q_keep[k]);
            if (q_keep[k] > q_keep[longest])
                longest = k;
        }
        if (cost <= REF_BUDGET || q_keep[longest] <= 1)
            break;
        q_keep[longest] = (q_keep[longest] + 1) / 2;
        *truncated = 1;
    }
    return n;
}

/* Builds the reduced batch cb from b: requests sel[0..n) with q_keep queries. */
static kva_status build_subset(const bench_opts *o, const bench_batch *b, const int32_t *sel,
                               const int32_t *q_keep, int32_t n, bench_batch *cb)
{
    const size_t es = kva_dtype_size(o->dtype);
    const size_t H = (size_t)o->heads, Hkv = (size_t)o->kv_heads;
    const size_t D = (size_t)o->head_dim, Dv = (size_t)o->head_dim_v;
    memset(cb, 0, sizeof *cb);
    int64_t T = 0, rows = 0;
    for (int32_t k = 0; k < n; k++) {
        int32_t r = sel[k], q = b->query_start_loc[r + 1] - b->query_start_loc[r];
        T += q_keep[k];
        rows += b->seq_lens[r] - q + q_keep[k];
    }
    cb->num_requests = n;
    cb->num_tokens = (int32_t)T;
    cb->block_table_stride = b->block_table_stride;
    cb->num_blocks = b->num_blocks;
    cb->query_start_loc = calloc((size_t)n + 1, sizeof(int32_t));
    cb->seq_lens = calloc((size_t)n + 1, sizeof(int32_t));
    cb->block_table = calloc((size_t)n * (size_t)b->block_table_stride + 1, sizeof(int32_t));
    cb->q = malloc(((size_t)T + 1) * H * D * es);
    cb->out = malloc(((size_t)T + 1) * H * Dv * es);
    cb->lse = malloc(((size_t)T + 1) * H * sizeof(float));
    cb->src_token = malloc(((size_t)T + 1) * sizeof(int64_t));
    if (o->ragged) {
        cb->k_ragged = malloc(((size_t)rows + 1) * Hkv * D * es);
        cb->v_ragged = malloc(((size_t)rows + 1) * Hkv * Dv * es);
    }
    if (b->tree_parents)
        cb->tree_parents = malloc(((size_t)T + 1) * sizeof(int32_t));
    if (b->slopes && (cb->slopes = malloc(H * sizeof(float))) != NULL)
        memcpy(cb->slopes, b->slopes, H * sizeof(float));
    if (b->sinks && (cb->sinks = malloc(H * sizeof(float))) != NULL)
        memcpy(cb->sinks, b->sinks, H * sizeof(float));
    if (!cb->query_start_loc || !cb->seq_lens || !cb->block_table || !cb->q || !cb->out ||
        !cb->lse || !cb->src_token || (o->ragged && (!cb->k_ragged || !cb->v_ragged)) ||
        (b->slopes && !cb->slopes) || (b->sinks && !cb->sinks) ||
        (b->tree_parents && !cb->tree_parents)) {
        bench_batch_free(cb);
        return KVA_STATUS_OUT_OF_MEMORY;
    }
    int64_t t = 0, row = 0;
    for (int32_t k = 0; k < n; k++) {
        int32_t r = sel[k], q0 = b->query_start_loc[r];
        int32_t q = b->query_start_loc[r + 1] - q0;
        int32_t s = b->seq_lens[r] - q + q_keep[k];
        cb->query_start_loc[k] = (int32_t)t;
        cb->seq_lens[k] = s;
        memcpy(cb->block_table + (size_t)k * b->block_table_stride,
               b->block_table + (size_t)r * b->block_table_stride,
               (size_t)b->block_table_stride * sizeof(int32_t));
        memcpy((char *)cb->q + (size_t)t * H * D * es, (const char *)b->q + (size_t)q0 * H * D * es,
               (size_t)q_keep[k] * H * D * es);
        for (int32_t i = 0; i < q_keep[k]; i++)
            cb->src_token[t + i] = q0 + i;
        /* The first q_keep tokens of a tree are a tree: parents come first. */
        if (b->tree_parents)
            memcpy(cb->tree_parents + t, b->tree_parents + q0, (size_t)q_keep[k] * sizeof(int32_t));
        if (o->ragged) {
            /* Request r's keys start at the prefix sum of the earlier seq_lens. */
            int64_t kv0 = 0;
            for (int32_t j = 0; j < r; j++)
                kv0 += b->seq_lens[j];
            memcpy((char *)cb->k_ragged + (size_t)row * Hkv * D * es,
                   (const char *)b->k_ragged + (size_t)kv0 * Hkv * D * es,
                   (size_t)s * Hkv * D * es);
            memcpy((char *)cb->v_ragged + (size_t)row * Hkv * Dv * es,
                   (const char *)b->v_ragged + (size_t)kv0 * Hkv * Dv * es,
                   (size_t)s * Hkv * Dv * es);
        }
        t += q_keep[k];
        row += s;
    }
    cb->query_start_loc[n] = (int32_t)t;
    bench_poison(cb->out, o->dtype, (size_t)T * H * Dv);
    bench_poison(cb->lse, KVA_DTYPE_F32, (size_t)T * H);
    return KVA_STATUS_OK;
}

/* Compares the rows of the full run (b) the reduced batch (cb) reproduces. */
static void compare(const bench_opts *o, const bench_batch *b, const bench_batch *cb,
                    bench_check_result *res)
{
    const size_t H = (size_t)o->heads, Dv = (size_t)o->head_dim_v;
    /* The CUDA tensor-core kernels (decode variant 4, prefill_mma, the
     * quantized decode) round the softmax weights P to the input dtype (f16
     * for quantized codes) for P V, as FlashAttention: out may differ by the
     * dtype's unit roundoff times max|v| more (bench/bench_cuda.c's bound;
     * |v| <= sqrt 3 for the uniform fill, 1.75 for the fitted quant scales). */
    const double u = o->dtype == KVA_DTYPE_BF16 ? 0x1p-8 : 0x1p-11;
    const double atol =
        kva_test_atol(o->dtype) +
        (o->backend == KVA_BACKEND_CUDA && o->dtype != KVA_DTYPE_F32 ? u * 1.75 : 0.0);
    const double rtol = kva_test_rtol(o->dtype);
    /* LSE is float32 in both; the backend accumulates in fp32, the reference in
     * fp64, so the difference is a few fp32 rounding steps of the sum. */
    const double lse_atol = 1e-3, lse_rtol = 1e-4;
    res->ok = 1;
    for (int64_t t = 0; t < cb->num_tokens; t++) {
        size_t src = (size_t)cb->src_token[t];
        for (size_t e = 0; e < H * Dv; e++) {
            double got = kva_test_get(b->out, o->dtype, src * H * Dv + e);
            double want = kva_test_get(cb->out, o->dtype, (size_t)t * H * Dv + e);
            double err = fabs(got - want);
            if (!(err <= atol + rtol * fabs(want))) {
                res->num_bad++;
                err = isnan(err) ? INFINITY : err;
            }
            if (err > res->max_abs_err)
                res->max_abs_err = err;
        }
        for (size_t h = 0; h < H; h++) {
            double got = b->lse[src * H + h], want = cb->lse[(size_t)t * H + h];
            double err = (isinf(want) && got == want) ? 0.0 : fabs(got - want);
            if (!(err <= lse_atol + lse_rtol * fabs(want))) {
                res->num_bad++;
                err = isnan(err) ? INFINITY : err;
            }
            if (err > res->max_lse_err)
                res->max_lse_err = err;
        }
    }
    if (res->num_bad)
        res->ok = 0;
}

kva_status bench_check(const bench_opts *o, const bench_batch *b, const kva_cache *cache,
                       bench_check_result *res)
{
    memset(res, 0, sizeof *res);
    const int32_t R = b->num_requests;
    int32_t *sel = malloc(((size_t)R + 1) * sizeof *sel);
    int32_t *q_keep = malloc(((size_t)R + 1) * sizeof *q_keep);
    if (!sel || !q_keep) {
        free(sel);
        free(q_keep);
        return KVA_STATUS_OUT_OF_MEMORY;
    }
    int32_t n = choose_subset(o, b, sel, q_keep, &res->truncated);
    bench_batch cb;
    kva_status st = build_subset(o, b, sel, q_keep, n, &cb);
    free(sel);
    free(q_keep);
    if (st != KVA_STATUS_OK)
        return st;
    res->requests_checked = n;
    res->tokens_checked = cb.num_tokens;

    kva_context *ref = NULL;
    kva_plan *plan = NULL;
    kva_context_desc cd = {KVA_BACKEND_REF, 1, 0};
    st = kva_context_create(&cd, &ref);
    if (st == KVA_STATUS_OK) {
        kva_plan_desc pd;
        bench_plan_desc(o, &cb, &pd);
        st = kva_plan_create(ref, &pd, &plan);
    }
    if (st == KVA_STATUS_OK) {
        double t0 = kva_cli_now();
        if (o->ragged)
            st = kva_attention_run_ragged(ref, plan, cb.q, cb.k_ragged, cb.v_ragged, cb.sinks,
                                          cb.out, cb.lse);
        else
            st = kva_attention_run(ref, plan, cb.q, cache, cb.sinks, cb.out, cb.lse);
        res->ref_seconds = kva_cli_now() - t0;
    }
    if (st == KVA_STATUS_OK) {
        compare(o, b, &cb, res);
        res->done = 1;
    }
    kva_plan_destroy(plan);
    kva_context_destroy(ref);
    bench_batch_free(&cb);
    return st;
}

int bench_check_report(const bench_opts *o, const bench_batch *b, const kva_cache *cache,
                       const char *backend, bench_check_result *r)
{
    kva_status st = bench_check(o, b, cache, r);
    if (st != KVA_STATUS_OK)
        return kva_cli_lib_error("reference check", st);
    if (!o->quiet)
        printf("check: max abs err %.3g, lse err %.3g (%s) vs ref on %d of %d requests, "
               "%d tokens%s\n",
               r->max_abs_err, r->max_lse_err, r->ok ? "ok" : "FAILED", (int)r->requests_checked,
               (int)b->num_requests, (int)r->tokens_checked,
               r->truncated ? " (causal prefixes)" : "");
    if (!r->ok) {
        fprintf(stderr,
                "kvattn: check failed: backend '%s' differs from the reference in %zu "
                "elements (max abs err %.3g); not timing it\n",
                backend, r->num_bad, r->max_abs_err);
        return KVA_EXIT_LIBRARY;
    }
    return KVA_EXIT_OK;
}
