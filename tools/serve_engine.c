/*
 * serve_engine.c - the engine of `kvattn serve-sim`: L attention layers of
 * the model (serve_model.c: MHA/GQA, or MLA over a latent cache) that run on
 * the chosen backend through the public API, one kva_cache per layer, all
 * indexed by the block ids of one kva_pool.
 *
 * One step, as an engine runs it:
 *   the batch in decode-first order (kva_batch_reorder_decode_first);
 *   block-table rows and slot mappings from the pool;
 *   the plan, once: kva_plan_create in the first step, kva_plan_update (in
 *   place, reusing the plan's memory) in every later one;
 *   for each layer: kva_cache_write of the new tokens' K/V (MLA: c_kv and
 *   k_pe), kva_attention_run (MLA: kva_mla_run with the layer's W_UK, W_UV).
 * q, K and V are random: slices of one buffer filled once at creation, at an
 * offset that changes with the layer and the step, so no time goes to a
 * random generator on the step path. (The values are therefore not a
 * function of the token ids: a prefix-cache hit reads KV written for another
 * request, which attention cannot tell apart.)
 *
 * --backend cuda: the caches live on GPU 0; q/K/V are slices of the same
 * random buffer uploaded once, out is a device buffer; the slot mapping goes
 * up once per step from pinned memory. Every call is enqueued on one stream
 * (the context's), and the step ends with one stream synchronization, where
 * an engine samples its tokens. Events around every layer's write and
 * attention give their device times. Before the run, a warm-up step (writes
 * skipped) loads the kernels and finds a shape the backend refuses.
 *
 * --verify (serve_verify.c): at steps 1, 2, 4, 8, ... and at the first step
 * of each attention state, one layer's new rows are checked in its cache and
 * its output against the reference backend. On CUDA the checked layer writes
 * into its own NaN-poisoned device output (so the step is not interrupted);
 * after the step's synchronization the output and the layer's cache come
 * down to the host (a host cache of the reference context), where the same
 * checks run.
 */
#include "kvattn_cuda.h"
#ifdef KVA_HAVE_CUDA
/* src/attn/cuda/cuda_backend.h: --cuda-upload-min (a benchmark hook). */
kva_status kva__cuda_context_upload_min(kva_context *ctx, int64_t bytes);
kva_status kva__cuda_context_plan_probe(kva_context *ctx, double *stamps);
kva_status kva__cuda_context_staging_hot(kva_context *ctx, int64_t bytes);
#endif
#include "serve_engine.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The per-dtype tolerances of the test suite, stated once in bench/data.h. */
#include "../bench/data.h"

static kva_status reserve(serve_engine *e, int32_t R, int32_t stride);
static void probe_print(const serve_engine *e);

/* Bytes of a cache's K, V and token-scale storage. */
void serve_cache_sizes(const kva_cache *c, int32_t nb, size_t *k, size_t *v, size_t *ts)
{
    *k = kva_cache_block_bytes_k(c) * (size_t)nb;
    *v = kva_cache_block_bytes_v(c) * (size_t)nb;
    *ts = kva_cache_block_bytes_scales(c) * (size_t)nb;
}

/* Zeroes a cache's storage now, as an engine's warm-up touches it, so that
 * first-use costs (page faults) are not charged to the steps. */
static kva_status cache_zero(serve_engine *e, kva_cache *c)
{
    void *kd = NULL, *vd = NULL;
    float *ts = NULL;
    size_t nk, nv, nts;
    kva_status st = kva_cache_data(c, &kd, &vd);
    if (st == KVA_STATUS_OK)
        st = kva_cache_token_scales(c, &ts);
    if (st != KVA_STATUS_OK)
        return st;
    serve_cache_sizes(c, e->o.num_blocks, &nk, &nv, &nts);
    if (!e->dev) {
        memset(kd, 0, nk);
        memset(vd, 0, nv);
        if (ts)
            memset(ts, 0, nts);
        return KVA_STATUS_OK;
    }
    st = serve_dev_memset(e->d, kd, 0, nk);
    if (st == KVA_STATUS_OK)
        st = serve_dev_memset(e->d, vd, 0, nv);
    if (st == KVA_STATUS_OK && ts)
        st = serve_dev_memset(e->d, ts, 0, nts);
    return st;
}

/* A failure of serve_device.c: its message becomes the engine's. */
kva_status serve_engine_dev_fail(serve_engine *e, kva_status st)
{
    snprintf(e->err, sizeof e->err, "%s", serve_dev_error(e->d));
    return st;
}

/* CUDA: one small step before the clock starts, as an engine's warm-up
 * (profile) run: it loads the kernels (the runtime loads modules lazily, at
 * their first launch), sizes the context's device metadata, and makes the
 * backend refuse an unsupported shape before the run. The metadata and the
 * split workspace are first reserved for the largest step (max_num_seqs
 * requests, the token budget; kva_cuda_context_reserve), as an engine sizes
 * its attention buffers at start-up, so no step pays for growing them (a
 * stream synchronize and pinned allocations); the block table's capacity
 * grows with the batches (it depends on the sequence lengths). A decode and a
 * prefill of up to 64 tokens over blocks 1.. (zeroed), on layer 0; the
 * cache write is launched with every slot -1 (skipped), so no cache changes. */
static kva_status warm_up(serve_engine *e)
{
    const serve_opts *o = &e->o;
    int32_t s = 64;
    if ((int64_t)s > (int64_t)(o->num_blocks - 1) * o->block_size)
        s = (o->num_blocks - 1) * o->block_size;
    const int32_t R = e->tmax >= 2 ? 2 : 1;
    const int32_t qp = R == 2 ? (e->tmax - 1 < s ? e->tmax - 1 : s) : 0;
    const int32_t stride = (s + o->block_size - 1) / o->block_size;
    kva_status rc = reserve(e, R, stride);
    if (rc != KVA_STATUS_OK)
        return rc;
    if (o->kind != KVA_ATTN_MLA) { /* MLA plans keep their own buffers (mla_run) */
        kva_cuda_capacity cap = {o->max_num_seqs, e->tmax, 0, o->heads, o->kv_heads, o->head_dim};
        if ((rc = kva_cuda_context_reserve(e->ctx, &cap)) != KVA_STATUS_OK)
            return rc;
    }
    e->qsl[0] = 0;
    e->qsl[1] = 1;
    e->seq_lens[0] = s;
    if (R == 2) {
        e->qsl[2] = 1 + qp;
        e->seq_lens[1] = s;
    }
    for (int32_t j = 0; j < R; j++)
        for (int32_t i = 0; i < stride; i++)
            e->bt[(size_t)j * stride + (size_t)i] = 1 + i;
    const int32_t T = e->qsl[R];
    for (int32_t t = 0; t < T; t++)
        e->slots[t] = -1;
    kva_plan_desc pd =
        serve_step_desc(o, R, e->qsl, e->seq_lens, e->bt, stride, serve_layer_local(o, 0));
    kva_plan *plan = NULL;
    if ((rc = kva_plan_create(e->ctx, &pd, &plan)) != KVA_STATUS_OK)
        return rc;
    const char *k = (const char *)e->d_rand + (size_t)e->tmax * e->sh.q * e->es;
    const char *v = k + (size_t)e->tmax * e->sh.k * e->es;
    if ((rc = serve_dev_upload(e->d, e->d_slots, e->slots, (size_t)T * sizeof(int64_t))) !=
        KVA_STATUS_OK) {
        kva_plan_destroy(plan);
        return serve_engine_dev_fail(e, rc);
    }
    rc = kva_cache_write(e->ctx, e->caches[0], T, k, 0, v, 0, o->dtype, e->d_slots);
    if (rc == KVA_STATUS_OK)
        rc = serve_layer_attention(e->ctx, o, plan, e->d_rand, serve_engine_w_uk(e, e->d_w, 0),
                                   serve_engine_w_uv(e, e->d_w, 0), e->caches[0], e->d_out);
    if (rc == KVA_STATUS_OK && (rc = serve_dev_sync(e->d)) != KVA_STATUS_OK)
        serve_engine_dev_fail(e, rc);
    kva_plan_destroy(plan);
    return rc;
}

/* The device side of the engine: stream, caches zeroed, buffers uploaded. */
static kva_status create_device(serve_engine *e)
{
    const serve_opts *o = &e->o;
    const size_t T = (size_t)e->tmax, out = T * e->sh.out * e->es;
    kva_status st;
    if ((st = kva_cuda_context_set_stream(e->ctx, serve_dev_stream(e->d))) != KVA_STATUS_OK ||
        (st = kva_cuda_context_set_deferred_write_status(e->ctx, 1)) != KVA_STATUS_OK)
        return st;
    if ((st = serve_dev_alloc(e->d, e->n_rand * e->es, &e->d_rand)) != KVA_STATUS_OK ||
        (st = serve_dev_alloc(e->d, out, &e->d_out)) != KVA_STATUS_OK ||
        (st = serve_dev_alloc(e->d, T * sizeof(int64_t), (void **)&e->d_slots)) != KVA_STATUS_OK ||
        (o->verify && (st = serve_dev_alloc(e->d, out, &e->d_vout)) != KVA_STATUS_OK) ||
        (e->w && (st = serve_dev_alloc(e->d, e->n_w * e->es, &e->d_w)) != KVA_STATUS_OK) ||
        (e->w && (st = serve_dev_upload(e->d, e->d_w, e->w, e->n_w * e->es)) != KVA_STATUS_OK) ||
        (st = serve_dev_upload(e->d, e->d_rand, e->rand, e->n_rand * e->es)) != KVA_STATUS_OK ||
        (st = serve_dev_sync(e->d)) != KVA_STATUS_OK)
        return serve_engine_dev_fail(e, st);
    return warm_up(e);
}

/* --dcp: the combine; under --verify rank 0's unsharded layer 0
 * (serve_verify_dcp). */
static kva_status dcp_create(serve_engine *e)
{
    const serve_opts *o = &e->o;
    const size_t T = (size_t)e->tmax, rows = T * (size_t)o->heads;
    kva_status st = serve_dcp_create(e->ctx, o, e->tmax, &e->dcp);
    if (st != KVA_STATUS_OK)
        return st;
    if (!o->verify || o->dcp_rank != 0)
        return KVA_STATUS_OK;
    serve_opts fo = *o;
    fo.block_size = o->dcp * o->block_size;
    if ((st = serve_cache_create(e->ctx, &fo, &e->full)) != KVA_STATUS_OK)
        return st;
    e->full_slots = malloc(T * sizeof(int64_t));
    e->full_out = malloc(rows * (size_t)o->head_dim * e->es);
    e->gathered = malloc(rows * (size_t)o->head_dim * e->es);
    if (!e->full_slots || !e->full_out || !e->gathered)
        return KVA_STATUS_OUT_OF_MEMORY;
    return KVA_STATUS_OK;
}

kva_status serve_engine_create(const serve_opts *o, serve_engine **out)
{
    kva_status st;
    serve_engine *e = calloc(1, sizeof *e);
    *out = NULL;
    if (!e)
        return KVA_STATUS_OUT_OF_MEMORY;
    e->o = *o;
    e->es = kva_dtype_size(o->dtype);
    serve_model_shape(o, &e->sh);
    e->tmax = o->max_num_batched_tokens;
    e->dev = o->backend == KVA_BACKEND_CUDA;
    if (e->dev) {
        char why[200];
        if (!serve_dev_available(why, sizeof why)) {
            snprintf(e->err, sizeof e->err, "--backend cuda: %s", why);
            st = KVA_STATUS_BACKEND_UNAVAILABLE;
            goto fail;
        }
        if ((st = serve_dev_create(2 * o->layers + 1, &e->d)) != KVA_STATUS_OK) {
            serve_engine_dev_fail(e, st);
            goto fail;
        }
    }
    kva_context_desc cd = {o->backend, o->threads, 0};
    if ((st = kva_context_create(&cd, &e->ctx)) != KVA_STATUS_OK)
        goto fail;
#ifdef KVA_HAVE_CUDA
    if (e->dev && o->cuda_upload_min >= 0 &&
        (st = kva__cuda_context_upload_min(e->ctx, o->cuda_upload_min)) != KVA_STATUS_OK)
        goto fail;
    if (e->dev && o->cuda_staging_hot >= 0 &&
        (st = kva__cuda_context_staging_hot(e->ctx, o->cuda_staging_hot)) != KVA_STATUS_OK)
        goto fail;
    if (e->dev && o->plan_probe > 0 &&
        (st = kva__cuda_context_plan_probe(e->ctx, e->probe_st)) != KVA_STATUS_OK)
        goto fail;
#endif
    if (o->verify && !o->dcp) {
        kva_context_desc rd = {KVA_BACKEND_REF, 1, 0};
        if ((st = kva_context_create(&rd, &e->ref)) != KVA_STATUS_OK)
            goto fail;
    }
    kva_pool_desc pd = {o->num_blocks, serve_pool_block_size(o), o->hash, o->prefix_caching};
    if ((st = kva_pool_create(&pd, &e->pool)) != KVA_STATUS_OK)
        goto fail;
    e->caches = calloc((size_t)o->layers, sizeof *e->caches);
    if (!e->caches) {
        st = KVA_STATUS_OUT_OF_MEMORY;
        goto fail;
    }
    for (int32_t l = 0; l < o->layers; l++) {
        if ((st = serve_cache_create(e->ctx, o, &e->caches[l])) != KVA_STATUS_OK)
            goto fail;
        if ((st = cache_zero(e, e->caches[l])) != KVA_STATUS_OK) {
            serve_engine_dev_fail(e, st);
            goto fail;
        }
    }
    const size_t T = (size_t)e->tmax;
    const serve_shape *sh = &e->sh;
    e->n_rand = T * (sh->q + sh->k + sh->v) + RAND_SHIFTS * sh->unit;
    e->rand = malloc(e->n_rand * e->es);
    e->out = malloc(T * sh->out * e->es);
    e->n_w = (size_t)o->layers * (sh->w_uk + sh->w_uv);
    if (e->n_w && !(e->w = malloc(e->n_w * e->es))) {
        st = KVA_STATUS_OUT_OF_MEMORY;
        goto fail;
    }
    if (e->dev) {
        if ((st = serve_dev_alloc_host(e->d, T * sizeof *e->slots, (void **)&e->slots)) !=
            KVA_STATUS_OK) {
            serve_engine_dev_fail(e, st);
            goto fail;
        }
    } else {
        e->slots = malloc(T * sizeof *e->slots);
    }
    if (o->dcp && (st = dcp_create(e)) != KVA_STATUS_OK)
        goto fail;
    if (o->verify && !o->dcp) {
        e->v_q = malloc(T * sh->q * e->es);
        e->v_out = malloc(T * sh->out * e->es);
        e->v_slots = malloc(T * sizeof *e->v_slots);
        if ((st = serve_cache_create(e->ref, o, &e->expect)) != KVA_STATUS_OK ||
            (e->dev && (st = serve_cache_create(e->ref, o, &e->mirror)) != KVA_STATUS_OK))
            goto fail;
    }
    if (!e->rand || !e->out || !e->slots ||
        (o->verify && !o->dcp && (!e->v_q || !e->v_out || !e->v_slots))) {
        st = KVA_STATUS_OUT_OF_MEMORY;
        goto fail;
    }
    kva_rng rng = {o->seed ^ 0xa77e47105ull};
    kva_test_fill_uniform(e->rand, o->dtype, e->n_rand, &rng);
    if (e->w) /* variance 1/Dc: k_nope and v of unit variance, as tests/mla_util.h */
        kva_test_fill(e->w, o->dtype, e->n_w, &rng, 1.0 / sqrt((double)o->mla_kv_rank));
    if (e->dev && (st = create_device(e)) != KVA_STATUS_OK)
        goto fail;
    *out = e;
    return KVA_STATUS_OK;
fail:
    /* The caller reads the message before the engine is gone. */
    *out = e;
    return st;
}

void serve_engine_destroy(serve_engine *e)
{
    if (!e)
        return;
    probe_print(e);
    free(e->probe);
    if (e->caches)
        for (int32_t l = 0; l < e->o.layers; l++)
            kva_cache_destroy(e->caches[l]);
    free(e->caches);
    kva_cache_destroy(e->mirror);
    serve_dcp_destroy(e->dcp);
    kva_cache_destroy(e->full);
    free(e->full_slots);
    free(e->full_out);
    free(e->gathered);
    kva_cache_destroy(e->expect);
    kva_pool_destroy(e->pool);
    kva_plan_destroy(e->plan);
    kva_context_destroy(e->ref);
    kva_context_destroy(e->ctx);
    free(e->rand);
    free(e->out);
    free(e->w);
    if (e->dev)
        serve_dev_free_host(e->slots);
    else
        free(e->slots);
    serve_dev_free(e->d_rand);
    serve_dev_free(e->d_out);
    serve_dev_free(e->d_vout);
    serve_dev_free(e->d_w);
    serve_dev_free(e->d_slots);
    serve_dev_destroy(e->d);
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
    free(e->v_slots);
    free(e);
}

const char *serve_engine_error(const serve_engine *e)
{
    return e ? e->err : "";
}

const char *serve_engine_verify_error(const serve_engine *e)
{
    return e ? e->verr : "";
}

kva_pool *serve_engine_pool(serve_engine *e)
{
    return e->pool;
}

double serve_engine_dcp_max(serve_engine *e, double v)
{
    return serve_dcp_max(e->dcp, v);
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

/* --plan-probe: one plan's phases into row[0..SERVE_PROBE_PLAN) from the
 * library's stamps and the caller's times t0, t1 around it (s). */
static void probe_plan(const serve_engine *e, double t0, double t1, double *row)
{
    const double *s = e->probe_st;
    row[0] = (t1 - t0) * 1e6;
    row[1] = s[0] - t0 * 1e6;
    for (int i = 1; i < SERVE_PROBE_STAMPS; i++)
        row[1 + i] = s[i] - s[i - 1];
    row[SERVE_PROBE_PLAN - 1] = t1 * 1e6 - s[SERVE_PROBE_STAMPS - 1];
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* --plan-probe: the medians of the rows' columns, on stdout. */
static void probe_print(const serve_engine *e)
{
    static const char *const names[SERVE_PROBE_PLAN] = {"total",     "generic", "device", "capture",
                                                        "partition", "reserve", "slot",   "fill",
                                                        "copy",      "tail"};
    const int32_t n = e->probe_rows;
    double *v = malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
    if (!v || n == 0) {
        free(v);
        return;
    }
    double med[SERVE_PROBE_COLS], mean[SERVE_PROBE_COLS];
    for (int c = 0; c < SERVE_PROBE_COLS; c++) {
        mean[c] = 0.0;
        for (int32_t r = 0; r < n; r++) {
            v[r] = e->probe[(size_t)r * SERVE_PROBE_COLS + c];
            mean[c] += v[r] / n;
        }
        qsort(v, (size_t)n, sizeof *v, cmp_double);
        med[c] = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
    }
    free(v);
    for (int k = 0; k < (e->o.plan_probe == 3 ? 2 : 1); k++) {
        printf("plan probe %s (mode %d, %d decode-only steps, median us):", k ? "again" : "first",
               (int)e->o.plan_probe, (int)n);
        for (int c = 0; c < SERVE_PROBE_PLAN; c++)
            printf(" %s %.2f", names[c], med[k * (SERVE_PROBE_PLAN + 1) + c]);
        /* The share is a ratio of sums: the means show what the medians
         * leave out (the staging's event record and wait once per half). */
        printf(" | means: total %.2f slot %.2f", mean[k * (SERVE_PROBE_PLAN + 1)],
               mean[k * (SERVE_PROBE_PLAN + 1) + 6]);
        if (k == 0 && e->o.plan_probe == 2)
            printf(" | query before %.2f", med[SERVE_PROBE_PLAN]);
        if (k == 0 && e->o.plan_probe == 4)
            printf(" | event record before %.2f", med[SERVE_PROBE_PLAN]);
        printf("\n");
    }
}

/* Plans the step into e->plan: created once, then updated in place
 * (--plan-create: destroyed and created again every step). */
static kva_status replan(serve_engine *e, const kva_plan_desc *pd)
{
    if (e->plan && e->o.plan_create) {
        kva_plan_destroy(e->plan);
        e->plan = NULL;
    }
    if (!e->plan)
        return kva_plan_create(e->ctx, pd, &e->plan);
    return kva_plan_update(e->ctx, e->plan, pd);
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
        if (rc == KVA_STATUS_OK && !e->dcp)
            rc = kva_pool_request_slots(e->pool, pid, b->context[k], b->num_new[k], e->slots + T);
        /* --dcp: the rank's own tokens through the same row (serve_dcp.c);
         * the unsharded check cache takes the pool's slots. */
        if (rc == KVA_STATUS_OK && e->dcp)
            rc = kva_dcp_slots(o->dcp, o->dcp_rank, o->dcp_interleave, o->block_size,
                               e->bt + (size_t)j * stride, stride, b->context[k], b->num_new[k],
                               e->slots + T);
        if (rc == KVA_STATUS_OK && e->full)
            rc = kva_pool_request_slots(e->pool, pid, b->context[k], b->num_new[k],
                                        e->full_slots + T);
        if (rc != KVA_STATUS_OK)
            return rc;
        T += b->num_new[k];
    }
    e->qsl[R] = T;
    st->scheduled_tokens += T;

    int local = serve_layer_local(o, 0);
    kva_plan_desc pd = serve_step_desc(o, R, e->qsl, e->seq_lens, e->bt, stride, local);
    double probe_q = 0.0;
    if ((o->plan_probe == 2 || o->plan_probe == 4) && e->dev) {
        /* The first runtime call after the last step: a stream query (2),
         * or a cheap enqueue, an event record (4; event 0 is recorded again
         * after the plan, where the step's device times start). */
        const double q0 = serve_now();
        if (o->plan_probe == 2)
            (void)serve_dev_query(e->d);
        else if ((rc = serve_dev_record(e->d, 0)) != KVA_STATUS_OK)
            return rc;
        probe_q = (serve_now() - q0) * 1e6;
    }
    double t0 = serve_now();
    if ((rc = replan(e, &pd)) != KVA_STATUS_OK)
        return rc;
    const double t1p = serve_now();
    double plan_step = t1p - t0; /* this step's plan time */
    if (o->plan_probe > 0 && e->dev && T == R && e->step > 2) {
        if (e->probe_rows == e->probe_cap) {
            const int32_t c = e->probe_cap ? 2 * e->probe_cap : 256;
            double *p = realloc(e->probe, sizeof(double) * (size_t)c * SERVE_PROBE_COLS);
            if (!p)
                return KVA_STATUS_OUT_OF_MEMORY;
            e->probe = p;
            e->probe_cap = c;
        }
        double *row = e->probe + (size_t)e->probe_rows++ * SERVE_PROBE_COLS;
        memset(row, 0, sizeof(double) * SERVE_PROBE_COLS);
        probe_plan(e, t0, t1p, row);
        row[SERVE_PROBE_PLAN] = probe_q;
        if (o->plan_probe == 3) { /* the same plan again: warm caches, not counted */
            const double a0 = serve_now();
            if ((rc = replan(e, &pd)) != KVA_STATUS_OK)
                return rc;
            probe_plan(e, a0, serve_now(), row + SERVE_PROBE_PLAN + 1);
        }
    }
    kva_plan *plan = e->plan;
    kva_plan_info info;
    if ((rc = kva_plan_get_info(plan, &info)) != KVA_STATUS_OK)
        return rc;
    st->steps++;
    st->cascade_steps += info.num_cascade_groups > 0;
    st->steps_by_state[info.state]++;
    st->last_state = (int32_t)info.state;
    /* Verify at steps 1, 2, 4, ... and at the first step of each state. */
    int check = verify && !e->dcp && ((e->step & (e->step - 1)) == 0 || !e->seen_state[info.state]);
    e->seen_state[info.state] = 1;

    const serve_shape *sh = &e->sh;
    const size_t out_bytes = (size_t)T * sh->out * e->es;
    const int dev = e->dev;
    int32_t checked = -1; /* the layer checked in this step */
    if (dev) {
        /* The slot mapping goes up once per step; the checked layer's own
         * output is poisoned (0xff bytes are NaN in f32, f16 and bf16). */
        rc = serve_dev_upload(e->d, e->d_slots, e->slots, (size_t)T * sizeof(int64_t));
        if (rc == KVA_STATUS_OK && check)
            rc = serve_dev_memset(e->d, e->d_vout, 0xff, out_bytes);
        if (rc == KVA_STATUS_OK)
            rc = serve_dev_record(e->d, 0);
        if (rc != KVA_STATUS_OK)
            serve_engine_dev_fail(e, rc);
    }
    for (int32_t l = 0; l < o->layers && rc == KVA_STATUS_OK; l++) {
        if (serve_layer_local(o, l) != local) {
            /* Local (chunked) and global layers take plans of their own; a
             * CUDA context keeps only its latest plan's metadata, so the step
             * plans again where the layer kind changes (the upload lands in
             * the next layer's write time on CUDA). */
            local = !local;
            t0 = serve_now();
            pd = serve_step_desc(o, R, e->qsl, e->seq_lens, e->bt, stride, local);
            rc = replan(e, &pd);
            plan_step += serve_now() - t0;
            if (rc != KVA_STATUS_OK)
                break;
        }
        size_t shift = (size_t)((e->step * 7 + l * 13) % RAND_SHIFTS) * sh->unit;
        /* Host slices; on CUDA the same offsets into the device copy. */
        const char *hq = (const char *)e->rand + shift * e->es;
        const char *hk = hq + (size_t)e->tmax * sh->q * e->es;
        const char *hv = hk + (size_t)e->tmax * sh->k * e->es;
        const char *base = dev ? (const char *)e->d_rand : (const char *)e->rand;
        const char *q = base + (hq - (const char *)e->rand);
        const char *k = base + (hk - (const char *)e->rand);
        const char *v = base + (hv - (const char *)e->rand);
        int check_layer = check && l == (int32_t)(e->step % o->layers);
        void *out = dev ? (check_layer ? e->d_vout : e->d_out) : e->out;
        if (check_layer) {
            checked = l;
            if (!dev) /* an unwritten output element shows as NaN */
                kva_test_poison(e->out, o->dtype, (size_t)T * sh->out);
        }
        /* --dcp --verify checks layer 0 of every step (serve_verify_dcp). */
        const int dcp_check = e->dcp && verify && l == 0;
        if (dcp_check)
            kva_test_poison(e->out, o->dtype, (size_t)T * (o->heads / o->dcp) * o->head_dim);
        int64_t saved_slot = e->slots[0];
        if ((check_layer || dcp_check) && !dev && o->fault == SERVE_FAULT_SLOT && T > 1)
            e->slots[0] = e->slots[T - 1];
        t0 = serve_now();
        rc = kva_cache_write(e->ctx, e->caches[l], T, k, 0, v, 0, o->dtype,
                             dev ? e->d_slots : e->slots);
        double t1 = serve_now();
        e->slots[0] = saved_slot;
        if (!dev)
            st->write_s += t1 - t0;
        if (rc == KVA_STATUS_OK && dev && (rc = serve_dev_record(e->d, 2 * l + 1)) != KVA_STATUS_OK)
            serve_engine_dev_fail(e, rc);
        if (rc != KVA_STATUS_OK)
            break;
        void *part = NULL;
        float *part_lse = NULL;
        if (e->dcp) { /* the rank's partial, straight into the combine's window */
            rc = serve_dcp_partials(e->dcp, T, &part, &part_lse);
            if (rc == KVA_STATUS_OK)
                rc = kva_attention_run(e->ctx, plan, q, e->caches[l], NULL, part, part_lse);
        } else
            rc = serve_layer_attention(
                e->ctx, o, plan, q, serve_engine_w_uk(e, dev ? e->d_w : e->w, l),
                serve_engine_w_uv(e, dev ? e->d_w : e->w, l), e->caches[l], out);
        if (!dev)
            st->attention_s += serve_now() - t1;
        if (rc == KVA_STATUS_OK && e->dcp) {
            double c0 = serve_now();
            rc = serve_dcp_combine(e->dcp, T, part, part_lse, out);
            st->combine_s += serve_now() - c0;
            if (rc == KVA_STATUS_OK && dcp_check) {
                double v0 = serve_now();
                rc = serve_verify_dcp(e, R, stride, hq, hk, hv, st);
                *verify_s += serve_now() - v0;
            }
        }
        if (rc == KVA_STATUS_OK && dev && (rc = serve_dev_record(e->d, 2 * l + 2)) != KVA_STATUS_OK)
            serve_engine_dev_fail(e, rc);
        if (rc == KVA_STATUS_OK && check_layer && !dev) {
            double v0 = serve_now();
            rc = serve_verify_host(e, R, stride, l, hq, hk, hv, st);
            *verify_s += serve_now() - v0;
        }
    }
    st->plan_s += plan_step;
    st->plan_s_by_state[info.state] += plan_step;
    if (plan_step > st->plan_max_s)
        st->plan_max_s = plan_step;
    /* CUDA: the step ends when the stream has run it (an engine samples the
     * step's tokens here); then the events give the device times. */
    if (dev && rc == KVA_STATUS_OK) {
        if ((rc = serve_dev_sync(e->d)) != KVA_STATUS_OK)
            serve_engine_dev_fail(e, rc);
        for (int32_t l = 0; l < o->layers && rc == KVA_STATUS_OK; l++) {
            double w = 0.0, a = 0.0;
            rc = serve_dev_elapsed(e->d, 2 * l, 2 * l + 1, &w);
            if (rc == KVA_STATUS_OK)
                rc = serve_dev_elapsed(e->d, 2 * l + 1, 2 * l + 2, &a);
            if (rc != KVA_STATUS_OK)
                serve_engine_dev_fail(e, rc);
            st->write_s += w;
            st->attention_s += a;
        }
        if (rc == KVA_STATUS_OK && checked >= 0) {
            double v0 = serve_now();
            rc = serve_verify_device(e, R, stride, checked, st);
            *verify_s += serve_now() - v0;
        }
    }
    return rc;
}
