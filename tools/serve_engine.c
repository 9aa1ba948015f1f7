/*
 * serve_engine.c - the model of `kvattn serve-sim`: L attention layers that
 * run on the chosen backend through the public API, one kva_cache per layer,
 * all indexed by the block ids of one kva_pool.
 *
 * One step, as an engine runs it:
 *   the batch in decode-first order (kva_batch_reorder_decode_first);
 *   block-table rows and slot mappings from the pool;
 *   kva_plan_create once;
 *   for each layer: kva_cache_write of the new tokens' K/V, kva_attention_run;
 *   kva_plan_destroy.
 * q, K and V are random: slices of one buffer filled once at creation, at an
 * offset that changes with the layer and the step, so no time goes to a
 * random generator on the step path. (The values are therefore not a
 * function of the token ids: a prefix-cache hit reads KV written for another
 * request, which attention cannot tell apart.)
 *
 * --verify: at steps 1, 2, 4, 8, ... and at the first step of each attention
 * state, one layer's new K/V rows are looked up in its cache through the
 * block-table rows (they must be where attention reads them), and its output
 * is recomputed by the reference backend on the same cache and compared with
 * the test suite's per-dtype tolerances. The
 * reference is slow, so it checks a subset of the batch (the first decode,
 * the first prefill, then others in order) within a work budget; a long
 * prefill keeps only its first queries with a correspondingly shorter
 * seq_len, which leaves those rows unchanged under the causal mask.
 */
#include "serve_sim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The per-dtype tolerances of the test suite, stated once in tests/harness.h
 * (its unused test counters would warn here). */
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-variable"
#pragma GCC diagnostic ignored "-Wunused-function"
#endif
#include "harness.h"
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif

/* Distinct offsets (in units of D elements) at which the random slices start. */
#define RAND_SHIFTS 64
/* Reference work allowed per verified step, in (query head, key) pairs times
 * 2D: about 0.15 s of the reference backend on one core of the development
 * machine. */
#define VERIFY_BUDGET 3.0e7

struct serve_engine {
    serve_opts o;
    kva_context *ctx;
    kva_context *ref;   /* --verify only */
    kva_cache **caches; /* [L] */
    kva_pool *pool;
    size_t es;    /* bytes per element of the dtype */
    int32_t tmax; /* most tokens in one step (the token budget) */
    void *rand;   /* [tmax * (H + 2 Hkv) * D + RAND_SHIFTS * D] random values */
    void *out;    /* [tmax, H, D] */
    /* The step's metadata, sized for cap_r requests. */
    int32_t cap_r;
    int32_t *perm, *qsl, *seq_lens; /* [cap_r], [cap_r + 1], [cap_r] */
    int32_t *bt;                    /* [cap_r * cap_stride] */
    size_t cap_bt;
    int64_t *slots; /* [tmax] */
    int64_t step;
    int seen_state[KVA_STATE_EMPTY + 1];
    /* Reference check buffers. */
    int32_t *v_sel, *v_qsl, *v_seq, *v_bt;
    void *v_q, *v_out; /* [tmax, H, D] */
};

/* The step's attention plan: causal, no window, the model's shapes. */
static kva_plan_desc step_desc(const serve_opts *o, int32_t R, const int32_t *qsl,
                               const int32_t *seq_lens, const int32_t *bt, int32_t stride)
{
    kva_plan_desc pd = {0};
    pd.num_requests = R;
    pd.query_start_loc = qsl;
    pd.seq_lens = seq_lens;
    pd.block_table = bt;
    pd.block_table_stride = stride;
    pd.block_size = o->block_size;
    pd.num_heads = o->heads;
    pd.num_kv_heads = o->kv_heads;
    pd.head_dim = o->head_dim;
    pd.q_dtype = o->dtype;
    pd.causal = 1;
    pd.window_left = -1;
    return pd;
}

kva_status serve_engine_create(const serve_opts *o, serve_engine **out)
{
    kva_status st;
    serve_engine *e = calloc(1, sizeof *e);
    if (!e)
        return KVA_STATUS_OUT_OF_MEMORY;
    e->o = *o;
    e->es = kva_dtype_size(o->dtype);
    e->tmax = o->max_num_batched_tokens;
    kva_context_desc cd = {o->backend, o->threads, 0};
    if ((st = kva_context_create(&cd, &e->ctx)) != KVA_STATUS_OK)
        goto fail;
    if (o->verify) {
        kva_context_desc rd = {KVA_BACKEND_REF, 1, 0};
        if ((st = kva_context_create(&rd, &e->ref)) != KVA_STATUS_OK)
            goto fail;
    }
    kva_pool_desc pd = {o->num_blocks, o->block_size, o->hash, o->prefix_caching};
    if ((st = kva_pool_create(&pd, &e->pool)) != KVA_STATUS_OK)
        goto fail;
    e->caches = calloc((size_t)o->layers, sizeof *e->caches);
    if (!e->caches) {
        st = KVA_STATUS_OUT_OF_MEMORY;
        goto fail;
    }
    kva_cache_desc cdesc = {o->num_blocks, o->block_size,  o->kv_heads,   o->head_dim, 0,
                            o->dtype,      KVA_LAYOUT_NHD, KVA_QUANT_NONE};
    for (int32_t l = 0; l < o->layers; l++) {
        if ((st = kva_cache_create(e->ctx, &cdesc, &e->caches[l])) != KVA_STATUS_OK)
            goto fail;
        /* Touch the host memory now, as an engine's warm-up does, so that page
         * faults on first use are not charged to the steps' cache writes. */
        void *kd = NULL, *vd = NULL;
        if ((st = kva_cache_data(e->caches[l], &kd, &vd)) != KVA_STATUS_OK)
            goto fail;
        memset(kd, 0, kva_cache_block_bytes_k(e->caches[l]) * (size_t)o->num_blocks);
        memset(vd, 0, kva_cache_block_bytes_v(e->caches[l]) * (size_t)o->num_blocks);
    }
    const size_t T = (size_t)e->tmax, H = (size_t)o->heads, Hkv = (size_t)o->kv_heads;
    const size_t D = (size_t)o->head_dim;
    size_t n_rand = T * (H + 2 * Hkv) * D + RAND_SHIFTS * D;
    e->rand = malloc(n_rand * e->es);
    e->out = malloc(T * H * D * e->es);
    e->slots = malloc(T * sizeof *e->slots);
    if (o->verify) {
        e->v_q = malloc(T * H * D * e->es);
        e->v_out = malloc(T * H * D * e->es);
    }
    if (!e->rand || !e->out || !e->slots || (o->verify && (!e->v_q || !e->v_out))) {
        st = KVA_STATUS_OUT_OF_MEMORY;
        goto fail;
    }
    kva_rng rng = {o->seed ^ 0xa77e47105ull};
    kva_test_fill_uniform(e->rand, o->dtype, n_rand, &rng);
    *out = e;
    return KVA_STATUS_OK;
fail:
    serve_engine_destroy(e);
    return st;
}

void serve_engine_destroy(serve_engine *e)
{
    if (!e)
        return;
    if (e->caches)
        for (int32_t l = 0; l < e->o.layers; l++)
            kva_cache_destroy(e->caches[l]);
    free(e->caches);
    kva_pool_destroy(e->pool);
    kva_context_destroy(e->ref);
    kva_context_destroy(e->ctx);
    free(e->rand);
    free(e->out);
    free(e->slots);
    free(e->perm);
    free(e->qsl);
    free(e->seq_lens);
    free(e->bt);
    free(e->v_sel);
    free(e->v_qsl);
    free(e->v_seq);
    free(e->v_bt);
    free(e->v_q);
    free(e->v_out);
    free(e);
}

kva_pool *serve_engine_pool(serve_engine *e)
{
    return e->pool;
}

int32_t serve_engine_threads(const serve_engine *e)
{
    return kva_context_num_threads(e->ctx);
}

/* Makes the per-request arrays hold R requests and the block table R * stride. */
static kva_status reserve(serve_engine *e, int32_t R, int32_t stride)
{
    if (R > e->cap_r) {
        int32_t c = R < 64 ? 64 : R;
        int32_t *p1 = realloc(e->perm, (size_t)c * sizeof(int32_t));
        if (p1)
            e->perm = p1;
        int32_t *p2 = realloc(e->qsl, ((size_t)c + 1) * sizeof(int32_t));
        if (p2)
            e->qsl = p2;
        int32_t *p3 = realloc(e->seq_lens, (size_t)c * sizeof(int32_t));
        if (p3)
            e->seq_lens = p3;
        int32_t *p4 = realloc(e->v_sel, (size_t)c * sizeof(int32_t));
        if (p4)
            e->v_sel = p4;
        int32_t *p5 = realloc(e->v_qsl, ((size_t)c + 1) * sizeof(int32_t));
        if (p5)
            e->v_qsl = p5;
        int32_t *p6 = realloc(e->v_seq, (size_t)c * sizeof(int32_t));
        if (p6)
            e->v_seq = p6;
        if (!p1 || !p2 || !p3 || !p4 || !p5 || !p6)
            return KVA_STATUS_OUT_OF_MEMORY;
        e->cap_r = c;
    }
    size_t need = (size_t)R * (size_t)stride + 1;
    if (need > e->cap_bt) {
        size_t c = need * 2;
        int32_t *p1 = realloc(e->bt, c * sizeof(int32_t));
        if (p1)
            e->bt = p1;
        int32_t *p2 = realloc(e->v_bt, c * sizeof(int32_t));
        if (p2)
            e->v_bt = p2;
        if (!p1 || !p2)
            return KVA_STATUS_OUT_OF_MEMORY;
        e->cap_bt = c;
    }
    return KVA_STATUS_OK;
}

/* Reference work of a request with q queries over seq_len s (causal). */
static double ref_cost(const serve_opts *o, int32_t q, int32_t s)
{
    /* Query i sees s - q + i + 1 keys. */
    double pairs = (double)q * (double)(s - q) + 0.5 * (double)q * (double)(q + 1);
    return pairs * (double)o->heads * 2.0 * (double)o->head_dim;
}

/* Checks that every new token's K and V rows (k: [T, Hkv, D], v: [T, Hkv, D],
 * in plan order) sit in layer l's cache where attention reads them: at block
 * bt[j][pos / B], offset pos % B of the NHD layout [NB, B, Hkv, D]. This ties
 * the slot mapping used by kva_cache_write to the block-table rows used by
 * kva_attention_run, which the reference comparison cannot see (both
 * backends read the same cache). The source dtype is the cache dtype, so the
 * rows must match bit for bit. Returns the number of mismatched rows. */
static int64_t check_written(const serve_engine *e, int32_t R, int32_t stride, const void *k,
                             const void *v, int32_t l)
{
    const serve_opts *o = &e->o;
    const size_t row = (size_t)o->kv_heads * (size_t)o->head_dim * e->es;
    void *kd = NULL, *vd = NULL;
    if (kva_cache_data(e->caches[l], &kd, &vd) != KVA_STATUS_OK)
        return 1;
    int64_t bad = 0;
    for (int32_t j = 0; j < R; j++) {
        int32_t q_len = e->qsl[j + 1] - e->qsl[j], ctx = e->seq_lens[j] - q_len;
        for (int32_t i = 0; i < q_len; i++) {
            int32_t pos = ctx + i, t = e->qsl[j] + i;
            size_t slot =
                (size_t)e->bt[(size_t)j * (size_t)stride + (size_t)(pos / o->block_size)] *
                    (size_t)o->block_size +
                (size_t)(pos % o->block_size);
            if (memcmp((const char *)kd + slot * row, (const char *)k + (size_t)t * row, row) !=
                    0 ||
                memcmp((const char *)vd + slot * row, (const char *)v + (size_t)t * row, row) != 0)
                bad++;
        }
    }
    return bad;
}

/* Checks layer l's output (e->out, in plan order) against the reference. The
 * step fails if any element differs or misplaced (check_written) > 0. */
static kva_status verify_layer(serve_engine *e, int32_t R, int32_t stride, const void *q, int32_t l,
                               int64_t misplaced, serve_stats *st)
{
    const serve_opts *o = &e->o;
    const size_t H = (size_t)o->heads, D = (size_t)o->head_dim, row = H * D * e->es;
    /* Candidates: the first decode, the first prefill, then the rest in order. */
    int32_t first_prefill = -1, n = 0;
    for (int32_t j = 0; j < R; j++)
        if (e->qsl[j + 1] - e->qsl[j] > 1 && first_prefill < 0)
            first_prefill = j;
    int32_t *keep_q = e->v_seq; /* [n] kept queries of each selected request */
    double budget = VERIFY_BUDGET;
    for (int32_t pass = 0; pass < 2; pass++) {
        for (int32_t j = 0; j < R; j++) {
            int first = j == 0 || j == first_prefill;
            if ((pass == 0) != first)
                continue;
            int32_t q_len = e->qsl[j + 1] - e->qsl[j], s = e->seq_lens[j];
            int32_t qk = q_len;
            while (qk > 1 && ref_cost(o, qk, s - q_len + qk) > budget)
                qk = (qk + 1) / 2;
            double c = ref_cost(o, qk, s - q_len + qk);
            if (c > budget && n > 0)
                continue;
            budget -= c;
            e->v_sel[n] = j;
            keep_q[n] = qk;
            n++;
        }
    }
    /* The reduced batch: same block-table rows, first qk queries. */
    int32_t t = 0;
    int32_t *v_seq = malloc((size_t)n * sizeof *v_seq);
    if (!v_seq)
        return KVA_STATUS_OUT_OF_MEMORY;
    for (int32_t k = 0; k < n; k++) {
        int32_t j = e->v_sel[k], q_len = e->qsl[j + 1] - e->qsl[j];
        e->v_qsl[k] = t;
        v_seq[k] = e->seq_lens[j] - q_len + keep_q[k];
        memcpy(e->v_bt + (size_t)k * stride, e->bt + (size_t)j * stride,
               (size_t)stride * sizeof(int32_t));
        memcpy((char *)e->v_q + (size_t)t * row, (const char *)q + (size_t)e->qsl[j] * row,
               (size_t)keep_q[k] * row);
        t += keep_q[k];
    }
    e->v_qsl[n] = t;
    kva_test_poison(e->v_out, o->dtype, (size_t)t * H * D);
    kva_plan_desc pd = step_desc(o, n, e->v_qsl, v_seq, e->v_bt, stride);
    kva_plan *plan = NULL;
    kva_status rc = kva_plan_create(e->ref, &pd, &plan);
    if (rc == KVA_STATUS_OK)
        rc = kva_attention_run(e->ref, plan, e->v_q, e->caches[l], NULL, e->v_out, NULL);
    kva_plan_destroy(plan);
    if (rc == KVA_STATUS_OK) {
        const double atol = kva_test_atol(o->dtype), rtol = kva_test_rtol(o->dtype);
        size_t bad = 0;
        for (int32_t k = 0; k < n; k++) {
            int32_t j = e->v_sel[k];
            for (int32_t i = 0; i < keep_q[k]; i++) {
                size_t src = ((size_t)e->qsl[j] + (size_t)i) * H * D;
                size_t dst = ((size_t)e->v_qsl[k] + (size_t)i) * H * D;
                for (size_t x = 0; x < H * D; x++) {
                    double got = kva_test_get(e->out, o->dtype, src + x);
                    double want = kva_test_get(e->v_out, o->dtype, dst + x);
                    double err = fabs(got - want);
                    if (!(err <= atol + rtol * fabs(want))) {
                        bad++;
                        err = INFINITY;
                    }
                    if (err > st->verify_max_err)
                        st->verify_max_err = err;
                }
            }
        }
        st->verify_steps++;
        st->verify_tokens += t;
        if (bad || misplaced) {
            st->verify_failures++;
            if (misplaced)
                st->verify_max_err = INFINITY;
        }
    }
    free(v_seq);
    return rc;
}

kva_status serve_engine_step(serve_engine *e, const serve_batch *b, int verify, serve_stats *st,
                             double *verify_s)
{
    const serve_opts *o = &e->o;
    const int32_t R = b->num_requests;
    *verify_s = 0.0;
    if (R == 0)
        return KVA_STATUS_OK;
    e->step++;
    int32_t stride = 1;
    for (int32_t j = 0; j < R; j++) {
        int32_t nb = 0;
        kva_status rc = kva_pool_request_block_table(e->pool, b->pool_ids[j], NULL, 0, &nb);
        if (rc != KVA_STATUS_OK)
            return rc;
        if (nb > stride)
            stride = nb;
    }
    kva_status rc = reserve(e, R, stride);
    if (rc != KVA_STATUS_OK)
        return rc;
    /* Decode-first order, as vLLM reorders its batches. */
    if ((rc = kva_batch_reorder_decode_first(R, b->num_new, 1, e->perm, NULL)) != KVA_STATUS_OK)
        return rc;
    int32_t T = 0;
    for (int32_t j = 0; j < R; j++) {
        int32_t k = e->perm[j], pid = b->pool_ids[k];
        e->qsl[j] = T;
        e->seq_lens[j] = b->context[k] + b->num_new[k];
        rc = kva_pool_request_block_table(e->pool, pid, e->bt + (size_t)j * stride, stride, NULL);
        if (rc == KVA_STATUS_OK)
            rc = kva_pool_request_slots(e->pool, pid, b->context[k], b->num_new[k], e->slots + T);
        if (rc != KVA_STATUS_OK)
            return rc;
        T += b->num_new[k];
    }
    e->qsl[R] = T;
    st->scheduled_tokens += T;

    kva_plan_desc pd = step_desc(o, R, e->qsl, e->seq_lens, e->bt, stride);
    kva_plan *plan = NULL;
    double t0 = serve_now();
    if ((rc = kva_plan_create(e->ctx, &pd, &plan)) != KVA_STATUS_OK)
        return rc;
    st->plan_s += serve_now() - t0;
    kva_plan_info info;
    if ((rc = kva_plan_get_info(plan, &info)) != KVA_STATUS_OK) {
        kva_plan_destroy(plan);
        return rc;
    }
    st->steps++;
    st->steps_by_state[info.state]++;
    /* Verify at steps 1, 2, 4, ... and at the first step of each state. */
    int check = verify && ((e->step & (e->step - 1)) == 0 || !e->seen_state[info.state]);
    e->seen_state[info.state] = 1;

    const size_t H = (size_t)o->heads, Hkv = (size_t)o->kv_heads, D = (size_t)o->head_dim;
    for (int32_t l = 0; l < o->layers && rc == KVA_STATUS_OK; l++) {
        size_t shift = (size_t)((e->step * 7 + l * 13) % RAND_SHIFTS) * D;
        const char *q = (const char *)e->rand + shift * e->es;
        const char *k = q + (size_t)e->tmax * H * D * e->es;
        const char *v = k + (size_t)e->tmax * Hkv * D * e->es;
        int check_layer = check && l == (int32_t)(e->step % o->layers);
        if (check_layer) /* an unwritten output element shows as NaN */
            kva_test_poison(e->out, o->dtype, (size_t)T * H * D);
        t0 = serve_now();
        rc = kva_cache_write(e->ctx, e->caches[l], T, k, 0, v, 0, o->dtype, e->slots);
        double t1 = serve_now();
        st->write_s += t1 - t0;
        if (rc != KVA_STATUS_OK)
            break;
        rc = kva_attention_run(e->ctx, plan, q, e->caches[l], NULL, e->out, NULL);
        st->attention_s += serve_now() - t1;
        if (rc == KVA_STATUS_OK && check_layer) {
            double v0 = serve_now();
            int64_t misplaced = check_written(e, R, stride, k, v, l);
            rc = verify_layer(e, R, stride, q, l, misplaced, st);
            *verify_s += serve_now() - v0;
        }
    }
    t0 = serve_now();
    kva_plan_destroy(plan);
    st->plan_s += serve_now() - t0;
    return rc;
}
