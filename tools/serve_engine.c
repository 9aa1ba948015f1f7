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
 * --backend cuda: the caches live on GPU 0; q/K/V are slices of the same
 * random buffer uploaded once, out is a device buffer; the slot mapping goes
 * up once per step from pinned memory. Every call is enqueued on one stream
 * (the context's), and the step ends with one stream synchronization, where
 * an engine samples its tokens. Events around every layer's write and
 * attention give their device times. Before the run, a warm-up step (writes
 * skipped) loads the kernels and finds a shape the backend refuses.
 *
 * --verify: at steps 1, 2, 4, 8, ... and at the first step of each attention
 * state, one layer's new K/V rows are looked up in its cache through the
 * block-table rows (they must be where attention reads them: the reference
 * backend writes the same rows at the slots the block table gives into a
 * host cache, and the rows must match byte for byte, token scales included),
 * and its output
 * is recomputed by the reference backend on the same cache and compared with
 * the test suite's per-dtype tolerances. The
 * reference is slow, so it checks a subset of the batch (the first decode,
 * the first prefill, then others in order) within a work budget; a long
 * prefill keeps only its first queries with a correspondingly shorter
 * seq_len, which leaves those rows unchanged under the causal mask. On CUDA
 * the checked layer writes into its own NaN-poisoned device output (so the
 * step is not interrupted); after the step's synchronization the output and
 * the layer's cache come down to the host (a host cache of the reference
 * context), where the same checks run.
 */
#include "kvattn_cuda.h"
#include "serve_sim.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The per-dtype tolerances of the test suite, stated once in bench/data.h. */
#include "../bench/data.h"

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
    kva_cache **caches; /* [L], in the backend's memory space */
    int dev;            /* --backend cuda */
    serve_dev *d;       /* its stream and 2L + 1 events */
    char err[256];      /* a failure outside the library (serve_engine_error) */
    char verr[256];     /* the first --verify mismatch (serve_engine_verify_error) */
    kva_pool *pool;
    size_t es;    /* bytes per element of the dtype */
    int32_t tmax; /* most tokens in one step (the token budget) */
    void *rand;   /* [tmax * (H + 2 Hkv) * D + RAND_SHIFTS * D] random values */
    void *out;    /* [tmax, H, D] (CUDA: the checked layer's output, downloaded) */
    size_t n_rand;
    /* CUDA: device twins of rand and out, the checked layer's output, slots. */
    void *d_rand, *d_out, *d_vout;
    int64_t *d_slots;
    /* The step's metadata, sized for cap_r requests. */
    int32_t cap_r;
    int32_t *perm, *qsl, *seq_lens; /* [cap_r], [cap_r + 1], [cap_r] */
    int32_t *bt;                    /* [cap_r * cap_stride] */
    size_t cap_bt;
    int64_t *slots; /* [tmax] (CUDA: pinned) */
    int64_t step;
    int seen_state[KVA_STATE_EMPTY + 1];
    /* Reference check buffers. */
    int32_t *v_sel, *v_qsl, *v_seq, *v_bt;
    void *v_q, *v_out; /* [tmax, H, D] */
    int64_t *v_slots;  /* [tmax] slots from the block-table rows */
    kva_cache *mirror; /* CUDA: host copy of the checked layer's cache (ref context) */
    kva_cache *expect; /* the new rows written by the reference (ref context) */
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
    pd.cascade = o->cascade;
    return pd;
}

static kva_status reserve(serve_engine *e, int32_t R, int32_t stride);

/* Bytes of a cache's K, V and token-scale storage. */
static void cache_sizes(const kva_cache *c, int32_t nb, size_t *k, size_t *v, size_t *ts)
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
    cache_sizes(c, e->o.num_blocks, &nk, &nv, &nts);
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
static kva_status dev_fail(serve_engine *e, kva_status st)
{
    snprintf(e->err, sizeof e->err, "%s", serve_dev_error(e->d));
    return st;
}

/* CUDA: one small step before the clock starts, as an engine's warm-up
 * (profile) run: it loads the kernels (the runtime loads modules lazily, at
 * their first launch), sizes the context's device metadata, and makes the
 * backend refuse an unsupported shape before the run. A decode and a
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
    kva_plan_desc pd = step_desc(o, R, e->qsl, e->seq_lens, e->bt, stride);
    kva_plan *plan = NULL;
    if ((rc = kva_plan_create(e->ctx, &pd, &plan)) != KVA_STATUS_OK)
        return rc;
    const size_t q_elems = (size_t)e->tmax * (size_t)o->heads * (size_t)o->head_dim;
    const char *k = (const char *)e->d_rand + q_elems * e->es;
    const char *v = k + (size_t)e->tmax * (size_t)o->kv_heads * (size_t)o->head_dim * e->es;
    if ((rc = serve_dev_upload(e->d, e->d_slots, e->slots, (size_t)T * sizeof(int64_t))) !=
        KVA_STATUS_OK) {
        kva_plan_destroy(plan);
        return dev_fail(e, rc);
    }
    rc = kva_cache_write(e->ctx, e->caches[0], T, k, 0, v, 0, o->dtype, e->d_slots);
    if (rc == KVA_STATUS_OK)
        rc = kva_attention_run(e->ctx, plan, e->d_rand, e->caches[0], NULL, e->d_out, NULL);
    if (rc == KVA_STATUS_OK && (rc = serve_dev_sync(e->d)) != KVA_STATUS_OK)
        dev_fail(e, rc);
    kva_plan_destroy(plan);
    return rc;
}

/* The device side of the engine: stream, caches zeroed, buffers uploaded. */
static kva_status create_device(serve_engine *e)
{
    const serve_opts *o = &e->o;
    const size_t T = (size_t)e->tmax, H = (size_t)o->heads, D = (size_t)o->head_dim;
    kva_status st;
    if ((st = kva_cuda_context_set_stream(e->ctx, serve_dev_stream(e->d))) != KVA_STATUS_OK ||
        (st = kva_cuda_context_set_deferred_write_status(e->ctx, 1)) != KVA_STATUS_OK)
        return st;
    if ((st = serve_dev_alloc(e->d, e->n_rand * e->es, &e->d_rand)) != KVA_STATUS_OK ||
        (st = serve_dev_alloc(e->d, T * H * D * e->es, &e->d_out)) != KVA_STATUS_OK ||
        (st = serve_dev_alloc(e->d, T * sizeof(int64_t), (void **)&e->d_slots)) != KVA_STATUS_OK ||
        (o->verify &&
         (st = serve_dev_alloc(e->d, T * H * D * e->es, &e->d_vout)) != KVA_STATUS_OK) ||
        (st = serve_dev_upload(e->d, e->d_rand, e->rand, e->n_rand * e->es)) != KVA_STATUS_OK ||
        (st = serve_dev_sync(e->d)) != KVA_STATUS_OK)
        return dev_fail(e, st);
    return warm_up(e);
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
            dev_fail(e, st);
            goto fail;
        }
    }
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
    for (int32_t l = 0; l < o->layers; l++) {
        if ((st = serve_cache_create(e->ctx, o, &e->caches[l])) != KVA_STATUS_OK)
            goto fail;
        if ((st = cache_zero(e, e->caches[l])) != KVA_STATUS_OK) {
            dev_fail(e, st);
            goto fail;
        }
    }
    const size_t T = (size_t)e->tmax, H = (size_t)o->heads, Hkv = (size_t)o->kv_heads;
    const size_t D = (size_t)o->head_dim;
    e->n_rand = T * (H + 2 * Hkv) * D + RAND_SHIFTS * D;
    e->rand = malloc(e->n_rand * e->es);
    e->out = malloc(T * H * D * e->es);
    if (e->dev) {
        if ((st = serve_dev_alloc_host(e->d, T * sizeof *e->slots, (void **)&e->slots)) !=
            KVA_STATUS_OK) {
            dev_fail(e, st);
            goto fail;
        }
    } else {
        e->slots = malloc(T * sizeof *e->slots);
    }
    if (o->verify) {
        e->v_q = malloc(T * H * D * e->es);
        e->v_out = malloc(T * H * D * e->es);
        e->v_slots = malloc(T * sizeof *e->v_slots);
        if ((st = serve_cache_create(e->ref, o, &e->expect)) != KVA_STATUS_OK ||
            (e->dev && (st = serve_cache_create(e->ref, o, &e->mirror)) != KVA_STATUS_OK))
            goto fail;
    }
    if (!e->rand || !e->out || !e->slots || (o->verify && (!e->v_q || !e->v_out || !e->v_slots))) {
        st = KVA_STATUS_OUT_OF_MEMORY;
        goto fail;
    }
    kva_rng rng = {o->seed ^ 0xa77e47105ull};
    kva_test_fill_uniform(e->rand, o->dtype, e->n_rand, &rng);
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
    if (e->caches)
        for (int32_t l = 0; l < e->o.layers; l++)
            kva_cache_destroy(e->caches[l]);
    free(e->caches);
    kva_cache_destroy(e->mirror);
    kva_cache_destroy(e->expect);
    kva_pool_destroy(e->pool);
    kva_context_destroy(e->ref);
    kva_context_destroy(e->ctx);
    free(e->rand);
    free(e->out);
    if (e->dev)
        serve_dev_free_host(e->slots);
    else
        free(e->slots);
    serve_dev_free(e->d_rand);
    serve_dev_free(e->d_out);
    serve_dev_free(e->d_vout);
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

/* Checks that every new token's K and V rows (k: [T, Hkv, D], v: [T, Hkv, D]
 * in the source dtype, plan order) sit in layer l's cache where attention
 * reads them. `cache` is a host cache with layer l's bytes (the layer's own
 * cache on host backends, its downloaded mirror on CUDA). The reference
 * backend writes the same rows into e->expect at the slots the block-table
 * rows give (block bt[j][pos / B], offset pos % B); the cache must then hold
 * the same bytes at those slots (K and V rows, and the per-token key scales
 * of the int8_token_k formats): quantization is specified bit for bit, so
 * every backend stores the same codes. This ties the slot mapping used by
 * kva_cache_write to the block-table rows used by kva_attention_run, which
 * the reference comparison cannot see (both read the same cache). Returns
 * the number of mismatched rows, or -1 when the reference write fails. */
static int64_t check_written(serve_engine *e, const kva_cache *cache, int32_t R, int32_t stride,
                             const void *k, const void *v)
{
    const serve_opts *o = &e->o;
    const int32_t B = o->block_size, Hkv = o->kv_heads;
    int32_t T = e->qsl[R];
    for (int32_t j = 0; j < R; j++) {
        int32_t q_len = e->qsl[j + 1] - e->qsl[j], ctx = e->seq_lens[j] - q_len;
        for (int32_t i = 0; i < q_len; i++) {
            int32_t pos = ctx + i;
            e->v_slots[e->qsl[j] + i] =
                (int64_t)e->bt[(size_t)j * (size_t)stride + (size_t)(pos / B)] * B + pos % B;
        }
    }
    if (kva_cache_write(e->ref, e->expect, T, k, 0, v, 0, o->dtype, e->v_slots) != KVA_STATUS_OK)
        return -1;
    const size_t rk = kva_cache_block_bytes_k(cache) / (size_t)B;
    const size_t rv = kva_cache_block_bytes_v(cache) / (size_t)B;
    void *kd = NULL, *vd = NULL, *ke = NULL, *ve = NULL;
    float *ts = NULL, *te = NULL;
    if (kva_cache_data(cache, &kd, &vd) != KVA_STATUS_OK ||
        kva_cache_data(e->expect, &ke, &ve) != KVA_STATUS_OK ||
        kva_cache_token_scales(cache, &ts) != KVA_STATUS_OK ||
        kva_cache_token_scales(e->expect, &te) != KVA_STATUS_OK)
        return -1;
    int64_t bad = 0;
    for (int32_t t = 0; t < T; t++) {
        const size_t slot = (size_t)e->v_slots[t];
        int ok = memcmp((const char *)kd + slot * rk, (const char *)ke + slot * rk, rk) == 0 &&
                 memcmp((const char *)vd + slot * rv, (const char *)ve + slot * rv, rv) == 0;
        /* Token scales: [NB, Hkv, B]. */
        const size_t b = slot / (size_t)B, off = slot % (size_t)B;
        for (int32_t h = 0; ts && ok && h < Hkv; h++) {
            size_t x = (b * (size_t)Hkv + (size_t)h) * (size_t)B + off;
            ok = memcmp(&ts[x], &te[x], sizeof(float)) == 0;
        }
        bad += !ok;
    }
    return bad;
}

/* The extra bound of the CUDA backend's tensor-core kernels (decode variant
 * 4, the prefill kernels, the quantized decode): as FlashAttention, they
 * round the softmax weights P to 16 bits for P V, so out may differ from the
 * reference by u * max|v| more, u = 2^-8 when P is bf16 (bf16 q over a bf16
 * cache or 16-bit V) and 2^-11 when it is f16 (f16 q; 1-byte K/V, whose
 * codes become f16); max|v| <= 2 (the uniform fill, sqrt 3, plus a
 * quantization step). The CUDA tests use the same bound. f32 q and the host
 * backends round nothing. */
static double p_rounding(const serve_opts *o)
{
    if (o->backend != KVA_BACKEND_CUDA || o->dtype == KVA_DTYPE_F32)
        return 0.0;
    int bf16_p = o->dtype == KVA_DTYPE_BF16 &&
                 (o->kv_quant == KVA_QUANT_NONE || o->kv_quant == KVA_QUANT_INT8_TOKEN_K_V16);
    return (bf16_p ? 0x1p-8 : 0x1p-11) * 2.0;
}

/* Checks layer l's output (out: host [T, H, D], plan order) against the
 * reference run over `cache` (a host cache holding layer l's bytes). The
 * step fails if any element differs or misplaced (check_written) != 0. */
static kva_status verify_layer(serve_engine *e, int32_t R, int32_t stride, int32_t l, const void *q,
                               const kva_cache *cache, const void *out, int64_t misplaced,
                               serve_stats *st)
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
        rc = kva_attention_run(e->ref, plan, e->v_q, cache, NULL, e->v_out, NULL);
    kva_plan_destroy(plan);
    if (rc == KVA_STATUS_OK) {
        const double atol = kva_test_atol(o->dtype) + p_rounding(o), rtol = kva_test_rtol(o->dtype);
        size_t bad = 0;
        for (int32_t k = 0; k < n; k++) {
            int32_t j = e->v_sel[k];
            for (int32_t i = 0; i < keep_q[k]; i++) {
                size_t src = ((size_t)e->qsl[j] + (size_t)i) * H * D;
                size_t dst = ((size_t)e->v_qsl[k] + (size_t)i) * H * D;
                for (size_t x = 0; x < H * D; x++) {
                    double got = kva_test_get(out, o->dtype, src + x);
                    double want = kva_test_get(e->v_out, o->dtype, dst + x);
                    double err = fabs(got - want);
                    if (!(err <= atol + rtol * fabs(want))) {
                        bad++;
                        if (isnan(err)) /* an unwritten (poisoned) element */
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
            if (!e->verr[0])
                snprintf(e->verr, sizeof e->verr,
                         "step %lld, layer %d: %zu output elements differ from the reference "
                         "(largest error so far %.3g), %lld new K/V rows are not where the "
                         "block table says",
                         (long long)e->step, (int)l, bad, st->verify_max_err, (long long)misplaced);
        }
    }
    free(v_seq);
    return rc;
}

/* SERVE_FAULT_OUTPUT: out[0] += 1 (out: host, in the model's dtype). */
static void fault_output(const serve_opts *o, void *out)
{
    float x = (float)kva_test_get(out, o->dtype, 0) + 1.0f;
    if (o->dtype == KVA_DTYPE_F32)
        ((float *)out)[0] = x;
    else if (o->dtype == KVA_DTYPE_F16)
        ((uint16_t *)out)[0] = kva_f32_to_f16(x);
    else
        ((uint16_t *)out)[0] = kva_f32_to_bf16(x);
}

/* CUDA --verify, after the step's synchronization: layer l's output (its
 * own device buffer) and cache come down to the host, where check_written
 * and verify_layer run on the host copy (e->mirror). The deferred status of
 * the layer's int8 writes is read too (a rejected write is a failure). */
static kva_status verify_device(serve_engine *e, int32_t R, int32_t stride, int32_t l,
                                serve_stats *st)
{
    const serve_opts *o = &e->o;
    const size_t H = (size_t)o->heads, Hkv = (size_t)o->kv_heads, D = (size_t)o->head_dim;
    const int32_t T = e->qsl[R];
    void *dk = NULL, *dv = NULL, *hk = NULL, *hv = NULL;
    float *dts = NULL, *hts = NULL;
    size_t nk, nv, nts;
    kva_status rc = kva_cuda_cache_write_status(e->ctx, e->caches[l]);
    if (rc != KVA_STATUS_OK)
        return rc;
    if ((rc = kva_cache_data(e->caches[l], &dk, &dv)) != KVA_STATUS_OK ||
        (rc = kva_cache_data(e->mirror, &hk, &hv)) != KVA_STATUS_OK ||
        (rc = kva_cache_token_scales(e->caches[l], &dts)) != KVA_STATUS_OK ||
        (rc = kva_cache_token_scales(e->mirror, &hts)) != KVA_STATUS_OK)
        return rc;
    cache_sizes(e->caches[l], o->num_blocks, &nk, &nv, &nts);
    if ((rc = serve_dev_download(e->d, e->out, e->d_vout, (size_t)T * H * D * e->es)) !=
            KVA_STATUS_OK ||
        (rc = serve_dev_download(e->d, hk, dk, nk)) != KVA_STATUS_OK ||
        (rc = serve_dev_download(e->d, hv, dv, nv)) != KVA_STATUS_OK ||
        (dts && (rc = serve_dev_download(e->d, hts, dts, nts)) != KVA_STATUS_OK))
        return dev_fail(e, rc);
    size_t shift = (size_t)((e->step * 7 + l * 13) % RAND_SHIFTS) * D;
    const char *q = (const char *)e->rand + shift * e->es;
    const char *k = q + (size_t)e->tmax * H * D * e->es;
    const char *v = k + (size_t)e->tmax * Hkv * D * e->es;
    if (o->fault == SERVE_FAULT_OUTPUT)
        fault_output(o, e->out);
    int64_t misplaced = check_written(e, e->mirror, R, stride, k, v);
    if (misplaced < 0)
        return KVA_STATUS_INTERNAL;
    return verify_layer(e, R, stride, l, q, e->mirror, e->out, misplaced, st);
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
    const size_t out_bytes = (size_t)T * H * D * e->es;
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
            dev_fail(e, rc);
    }
    for (int32_t l = 0; l < o->layers && rc == KVA_STATUS_OK; l++) {
        size_t shift = (size_t)((e->step * 7 + l * 13) % RAND_SHIFTS) * D;
        /* Host slices; on CUDA the same offsets into the device copy. */
        const char *hq = (const char *)e->rand + shift * e->es;
        const char *hk = hq + (size_t)e->tmax * H * D * e->es;
        const char *hv = hk + (size_t)e->tmax * Hkv * D * e->es;
        const char *base = dev ? (const char *)e->d_rand : (const char *)e->rand;
        const char *q = base + (hq - (const char *)e->rand);
        const char *k = base + (hk - (const char *)e->rand);
        const char *v = base + (hv - (const char *)e->rand);
        int check_layer = check && l == (int32_t)(e->step % o->layers);
        void *out = dev ? (check_layer ? e->d_vout : e->d_out) : e->out;
        if (check_layer) {
            checked = l;
            if (!dev) /* an unwritten output element shows as NaN */
                kva_test_poison(e->out, o->dtype, (size_t)T * H * D);
        }
        int64_t saved_slot = e->slots[0];
        if (check_layer && !dev && o->fault == SERVE_FAULT_SLOT && T > 1)
            e->slots[0] = e->slots[T - 1];
        t0 = serve_now();
        rc = kva_cache_write(e->ctx, e->caches[l], T, k, 0, v, 0, o->dtype,
                             dev ? e->d_slots : e->slots);
        double t1 = serve_now();
        e->slots[0] = saved_slot;
        if (!dev)
            st->write_s += t1 - t0;
        if (rc == KVA_STATUS_OK && dev && (rc = serve_dev_record(e->d, 2 * l + 1)) != KVA_STATUS_OK)
            dev_fail(e, rc);
        if (rc != KVA_STATUS_OK)
            break;
        rc = kva_attention_run(e->ctx, plan, q, e->caches[l], NULL, out, NULL);
        if (!dev)
            st->attention_s += serve_now() - t1;
        if (rc == KVA_STATUS_OK && dev && (rc = serve_dev_record(e->d, 2 * l + 2)) != KVA_STATUS_OK)
            dev_fail(e, rc);
        if (rc == KVA_STATUS_OK && check_layer && !dev) {
            double v0 = serve_now();
            if (o->fault == SERVE_FAULT_OUTPUT)
                fault_output(o, e->out);
            int64_t misplaced = check_written(e, e->caches[l], R, stride, hk, hv);
            rc = misplaced < 0
                     ? KVA_STATUS_INTERNAL
                     : verify_layer(e, R, stride, l, hq, e->caches[l], e->out, misplaced, st);
            *verify_s += serve_now() - v0;
        }
    }
    /* CUDA: the step ends when the stream has run it (an engine samples the
     * step's tokens here); then the events give the device times. */
    if (dev && rc == KVA_STATUS_OK) {
        if ((rc = serve_dev_sync(e->d)) != KVA_STATUS_OK)
            dev_fail(e, rc);
        for (int32_t l = 0; l < o->layers && rc == KVA_STATUS_OK; l++) {
            double w = 0.0, a = 0.0;
            rc = serve_dev_elapsed(e->d, 2 * l, 2 * l + 1, &w);
            if (rc == KVA_STATUS_OK)
                rc = serve_dev_elapsed(e->d, 2 * l + 1, 2 * l + 2, &a);
            if (rc != KVA_STATUS_OK)
                dev_fail(e, rc);
            st->write_s += w;
            st->attention_s += a;
        }
        if (rc == KVA_STATUS_OK && checked >= 0) {
            double v0 = serve_now();
            rc = verify_device(e, R, stride, checked, st);
            *verify_s += serve_now() - v0;
        }
    }
    t0 = serve_now();
    kva_plan_destroy(plan);
    st->plan_s += serve_now() - t0;
    return rc;
}
