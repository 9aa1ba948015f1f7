/*
 * test_cuda_quant.c - quantized caches on the CUDA backend, every format
 * (INT8_CHANNEL, INT8_TOKEN_K, INT8_TOKEN_K_V16 f16/bf16, FP8_E4M3):
 *   1. kva_cache_write on the device equals the CPU backend's write byte for
 *      byte (K, V and the per-token key scales copied back), for f32/f16/bf16
 *      sources, both layouts, block sizes 1..64, strided sources, padding
 *      slots, saturating values, and NaN where the format stores it (fp8, the
 *      16-bit V of V16);
 *   2. int8 rows with NaN (and +-inf in per-token key rows) are rejected with
 *      KVA_STATUS_INVALID_ARGUMENT naming token, head and channel, and the
 *      device cache stays byte-identical; in a captured graph the write is
 *      dropped on the device and kva_cuda_cache_write_status reports it;
 *   3. copy_blocks and swap_blocks carry the per-token scales (device ->
 *      host cache equals the CPU cache after the same copies);
 *   4. attention over the device cache (the CPU-written bytes uploaded)
 *      equals the reference backend over the same host cache, to the q
 *      dtype's tolerance, over mixed batches (decode, spec decode, chunked
 *      and fresh prefills, which include the prefill tiles of the
 *      tensor-core shapes), GQA/MQA, D != Dv, D not a multiple of 16, masks,
 *      soft-cap, ALiBi, sinks, LSE, split-KV decodes, the default plans
 *      (variant 4: the tensor-core kernel of decode_mma_quant.cu for 1-byte
 *      K/V, whose f16 P adds 2^-11 max|v| to the out bound) and the CUDA-core
 *      variants (register pipeline, cp.async ring = plan variant 2); outputs
 *      poisoned with NaN before each run, unread token scales and fp8/16-bit
 *      slots NaN;
 *   4b. speculative decodes of 1..8 tokens over default plans (16-row items,
 *      q_len x G > 8: GQA 1/4/8, D 64/128/256, B 1/16, NHD/HND, splits), on
 *      the tensor-core kernel and, every third case, the CUDA-core one;
 *   4c. every version of the tensor-core kernel (decode_mma_quant.cu) over
 *      decodes, speculative decodes and split decodes, q 16-byte aligned or
 *      not;
 *   5. a graph captured over a quantized decode replays to the same output.
 * KVA_TEST_QUICK=1 runs the first cases of each list. Exits 77 without a GPU.
 */
#include "batchgen.h"
#include "cuda_util.h"
#include "../../src/plan/partition.h"
#include "../../src/attn/cuda/cuda_backend.h"

#ifdef KVA_HAVE_CUDA

static const kva_quant fmts[] = {KVA_QUANT_INT8_CHANNEL, KVA_QUANT_INT8_TOKEN_K,
                                 KVA_QUANT_INT8_TOKEN_K_V16, KVA_QUANT_INT8_TOKEN_K_V16,
                                 KVA_QUANT_FP8_E4M3};
/* The storage dtype of fmts[i] (V16: f16 then bf16 V). */
static kva_dtype fmt_dtype(int i)
{
    return fmts[i] == KVA_QUANT_FP8_E4M3           ? KVA_DTYPE_FP8_E4M3
           : fmts[i] == KVA_QUANT_INT8_TOKEN_K_V16 ? (i == 2 ? KVA_DTYPE_F16 : KVA_DTYPE_BF16)
                                                   : KVA_DTYPE_I8;
}
#define NFMT ((int)(sizeof fmts / sizeof fmts[0]))

static int quick(void)
{
    return getenv("KVA_TEST_QUICK") != NULL;
}

static kva_context *make_ctx(kva_backend b)
{
    kva_context_desc cd = {b, b == KVA_BACKEND_CPU ? 2 : 0, 0};
    kva_context *c = NULL;
    CHECK_OK(kva_context_create(&cd, &c));
    return c;
}

/* Random static scales for unit-variance data (as test_quant_attn.c);
 * per-channel, per-head or per-tensor lengths rotate with gran. buf holds
 * 2*Hkv*(D+Dv) floats. */
static void make_params(kva_quant q, int32_t Hkv, int32_t D, int32_t Dv, int gran, kva_rng *r,
                        float *buf, kva_quant_params *p)
{
    memset(p, 0, sizeof *p);
    float *ks = buf, *ko = ks + Hkv * D, *vs = ko + Hkv * D, *vo = vs + Hkv * Dv;
    for (int32_t i = 0; i < Hkv * D; i++) {
        ks[i] = (float)((1.8 + 0.7 * kva_rng_unit(r)) / 127.0);
        ko[i] = (float)(6.0 * kva_rng_unit(r) - 3.0);
    }
    for (int32_t i = 0; i < Hkv * Dv; i++) {
        vs[i] = (float)((1.8 + 0.7 * kva_rng_unit(r)) / 127.0);
        vo[i] = (float)(6.0 * kva_rng_unit(r) - 3.0);
    }
    const int64_t kl = gran == 0 ? Hkv * D : gran == 1 ? Hkv : 1;
    const int64_t vl = gran == 0 ? Hkv * Dv : gran == 1 ? Hkv : 1;
    if (q == KVA_QUANT_INT8_CHANNEL) {
        *p = (kva_quant_params){ks, kl, gran == 2 ? NULL : ko, gran == 2 ? 0 : kl, vs, vl, vo, vl};
    } else if (q == KVA_QUANT_INT8_TOKEN_K) {
        p->v_scale = vs, p->v_scale_len = vl;
        p->v_offset = gran == 1 ? NULL : vo, p->v_offset_len = gran == 1 ? 0 : vl;
    } else if (q == KVA_QUANT_FP8_E4M3) {
        for (int32_t h = 0; h < Hkv; h++) {
            ks[h] = (float)(0.004 + 0.016 * kva_rng_unit(r));
            vs[h] = (float)(0.004 + 0.016 * kva_rng_unit(r));
        }
        p->k_scale = ks, p->k_scale_len = gran == 2 ? 1 : Hkv;
        p->v_scale = vs, p->v_scale_len = gran == 2 ? 1 : Hkv;
    }
}

/* A host (REF context) and a device cache of the same quantized desc. */
typedef struct qpair {
    kva_cache *hc, *dc;
} qpair;

static void qpair_create(kva_context *href, kva_context *gpu, const kva_cache_desc *cd,
                         const kva_quant_params *p, qpair *qp)
{
    qp->hc = qp->dc = NULL;
    CHECK_OK(kva_cache_create_quant(href, cd, p, &qp->hc));
    CHECK_OK(kva_cache_create_quant(gpu, cd, p, &qp->dc));
}

static void qpair_destroy(qpair *qp)
{
    kva_cache_destroy(qp->hc);
    kva_cache_destroy(qp->dc);
}

static size_t bytes_k(const kva_cache *c)
{
    return (size_t)c->desc.num_blocks * kva_cache_block_bytes_k(c);
}
static size_t bytes_v(const kva_cache *c)
{
    return (size_t)c->desc.num_blocks * kva_cache_block_bytes_v(c);
}
static size_t bytes_ts(const kva_cache *c)
{
    return (size_t)c->desc.num_blocks * kva_cache_block_bytes_scales(c);
}

/* Snapshot of a cache's K, V and token scales (host copy of device data). */
typedef struct snap {
    unsigned char *k, *v, *ts;
} snap;

static void snap_take(const kva_cache *c, snap *s)
{
    void *k, *v;
    float *ts = NULL;
    kva_cache_data(c, &k, &v);
    kva_cache_token_scales(c, &ts);
    s->k = malloc(bytes_k(c) + 1);
    s->v = malloc(bytes_v(c) + 1);
    s->ts = malloc(bytes_ts(c) + 1);
    if (c->mem == KVA_BACKEND_CUDA) {
        to_host(s->k, k, bytes_k(c));
        to_host(s->v, v, bytes_v(c));
        if (ts)
            to_host(s->ts, ts, bytes_ts(c));
    } else {
        memcpy(s->k, k, bytes_k(c));
        memcpy(s->v, v, bytes_v(c));
        if (ts)
            memcpy(s->ts, ts, bytes_ts(c));
    }
}

static void snap_free(snap *s)
{
    free(s->k);
    free(s->v);
    free(s->ts);
}

/* 1 if the two caches (same desc) hold the same bytes; prints the first difference. */
static int same_bytes(const char *label, const kva_cache *a, const kva_cache *b)
{
    snap x, y;
    snap_take(a, &x);
    snap_take(b, &y);
    int ok = 1;
    const struct {
        const char *n;
        unsigned char *p, *q;
        size_t len;
    } parts[3] = {{"k", x.k, y.k, bytes_k(a)},
                  {"v", x.v, y.v, bytes_v(a)},
                  {"scales", x.ts, y.ts, bytes_ts(a)}};
    for (int i = 0; i < 3; i++) {
        if (memcmp(parts[i].p, parts[i].q, parts[i].len) == 0)
            continue;
        size_t j = 0;
        while (parts[i].p[j] == parts[i].q[j])
            j++;
        fprintf(stderr, "  %s: %s differs at byte %zu of %zu: %02x vs %02x\n", label, parts[i].n, j,
                parts[i].len, parts[i].p[j], parts[i].q[j]);
        ok = 0;
    }
    snap_free(&x);
    snap_free(&y);
    return ok;
}

/* Fills n source elements of dt: unit-variance uniform, 3% of them x40
 * (saturating int8 and fp8), and with nan_every > 0 every nan_every-th a NaN. */
static void fill_src(void *p, kva_dtype dt, size_t n, kva_rng *r, size_t nan_every)
{
    float *f = malloc(n * sizeof(float) + 4);
    kva_test_fill_uniform(f, KVA_DTYPE_F32, n, r);
    for (size_t i = 0; i < n; i++) {
        if (kva_rng_int(r, 0, 99) < 3)
            f[i] *= 40.0f;
        if (nan_every && i % nan_every == nan_every / 2)
            f[i] = (i / nan_every) % 2 ? -NAN : NAN;
    }
    kva_convert(f, KVA_DTYPE_F32, p, dt, n);
    free(f);
}

/* One write of T tokens (row strides ks/vs elements) through both backends. */
static void write_both(kva_context *href, kva_context *gpu, qpair *qp, int32_t T, const void *k,
                       int64_t ks, const void *v, int64_t vs, kva_dtype sdt, const int64_t *slots)
{
    const size_t es = kva_dtype_size(sdt);
    const int32_t Hkv = qp->hc->desc.num_kv_heads;
    const size_t krow = (size_t)Hkv * qp->hc->desc.head_dim;
    const size_t vrow = (size_t)Hkv * qp->hc->desc.head_dim_v;
    /* Elements the T rows span (stride 0 = contiguous rows). */
    const size_t kn = T ? (size_t)(T - 1) * (ks ? (size_t)ks : krow) + krow : 0;
    const size_t vn = T ? (size_t)(T - 1) * (vs ? (size_t)vs : vrow) + vrow : 0;
    void *dk = dev_from(k, kn * es), *dv = dev_from(v, vn * es);
    int64_t *dsl = dev_from(slots, (size_t)T * sizeof(int64_t));
    CHECK_OK(kva_cache_write(href, qp->hc, T, k, ks, v, vs, sdt, slots));
    CHECK_OK(kva_cache_write(gpu, qp->dc, T, dk, ks, dv, vs, sdt, dsl));
    CUDA_OK(cudaDeviceSynchronize());
    cudaFree(dk);
    cudaFree(dv);
    cudaFree(dsl);
}

/* Fills every slot of both caches (finite data), then writes a strided,
 * padded, permuted batch of T tokens over them. */
static void fill_and_write(kva_context *href, kva_context *gpu, qpair *qp, kva_rng *rng,
                           kva_dtype sdt, int with_nan)
{
    const kva_cache_desc *d = &qp->hc->desc;
    const int32_t Hkv = d->num_kv_heads, D = d->head_dim, Dv = d->head_dim_v;
    const int32_t n = d->num_blocks * d->block_size;
    const size_t es = kva_dtype_size(sdt);
    int64_t *slots = malloc(sizeof(int64_t) * (size_t)n);
    for (int32_t i = 0; i < n; i++)
        slots[i] = i;
    void *k = malloc((size_t)n * Hkv * D * es), *v = malloc((size_t)n * Hkv * Dv * es);
    fill_src(k, sdt, (size_t)n * Hkv * D, rng, 0);
    fill_src(v, sdt, (size_t)n * Hkv * Dv, rng, 0);
    write_both(href, gpu, qp, n, k, 0, v, 0, sdt, slots);
    free(k);
    free(v);
    /* Second write: T tokens, rows strided (a fused QKV slice), some padding. */
    const int32_t T = n < 40 ? n : 40;
    const int64_t ks = (int64_t)Hkv * D + 24, vs = (int64_t)Hkv * Dv + 8;
    for (int32_t i = n - 1; i > 0; i--) {
        const int32_t j = kva_rng_int(rng, 0, i);
        const int64_t t = slots[i];
        slots[i] = slots[j];
        slots[j] = t;
    }
    for (int32_t t = 0; t < T; t++)
        if (kva_rng_int(rng, 0, 7) == 0)
            slots[t] = -1;
    k = malloc((size_t)T * ks * es);
    v = malloc((size_t)T * vs * es);
    /* NaN only where the format stores it: fp8 K and V, the 16-bit V of V16. */
    const int kq = d->quant == KVA_QUANT_FP8_E4M3;
    const int vq = kq || d->quant == KVA_QUANT_INT8_TOKEN_K_V16;
    fill_src(k, sdt, (size_t)T * ks, rng, with_nan && kq ? 37 : 0);
    fill_src(v, sdt, (size_t)T * vs, rng, with_nan && vq ? 29 : 0);
    write_both(href, gpu, qp, T, k, ks, v, vs, sdt, slots);
    free(k);
    free(v);
    free(slots);
}

/* 1. Device writes equal CPU writes byte for byte. */
static void test_write_bytes(void)
{
    kva_context *href = make_ctx(KVA_BACKEND_REF), *gpu = make_ctx(KVA_BACKEND_CUDA);
    static const int32_t shapes[][3] = {{2, 64, 64}, {4, 128, 128}, {1, 256, 256},
                                        {3, 40, 72}, {8, 8, 16},    {2, 96, 128}};
    static const int32_t bsz[] = {16, 1, 3, 64, 5, 32};
    static const kva_dtype sdts[] = {KVA_DTYPE_F32, KVA_DTYPE_F16, KVA_DTYPE_BF16};
    kva_rng rng = {4242};
    const int n = quick() ? 8 : 30;
    for (int i = 0; i < n; i++) {
        const int f = i % NFMT, si = (i / NFMT + i) % 6;
        kva_cache_desc cd = {0};
        cd.num_blocks = 9;
        cd.block_size = bsz[(i * 7 + 1) % 6];
        cd.num_kv_heads = shapes[si][0];
        cd.head_dim = shapes[si][1];
        cd.head_dim_v = shapes[si][2];
        cd.dtype = fmt_dtype(f);
        cd.layout = i % 2 ? KVA_LAYOUT_HND : KVA_LAYOUT_NHD;
        cd.quant = fmts[f];
        float *buf = malloc(sizeof(float) * 2 * cd.num_kv_heads * (cd.head_dim + cd.head_dim_v));
        kva_quant_params p;
        make_params(cd.quant, cd.num_kv_heads, cd.head_dim, cd.head_dim_v, i % 3, &rng, buf, &p);
        qpair qp;
        qpair_create(href, gpu, &cd, &p, &qp);
        if (qp.hc && qp.dc) {
            fill_and_write(href, gpu, &qp, &rng, sdts[i % 3], 1);
            char label[96];
            snprintf(label, sizeof label, "write %s %s B=%d D=%d/%d src %s",
                     kva_quant_name(cd.quant), kva_dtype_name(cd.dtype), cd.block_size, cd.head_dim,
                     cd.head_dim_v, kva_dtype_name(sdts[i % 3]));
            CHECK_MSG(same_bytes(label, qp.hc, qp.dc), "%s", label);
        }
        qpair_destroy(&qp);
        free(buf);
    }
    kva_context_destroy(href);
    kva_context_destroy(gpu);
}

/* 2. Rejected int8 writes: status, message, device cache unchanged; and the
 * captured write, dropped on the device, reported by kva_cuda_cache_write_status. */
static void test_write_rejects(void)
{
    kva_context *href = make_ctx(KVA_BACKEND_REF), *gpu = make_ctx(KVA_BACKEND_CUDA);
    kva_rng rng = {99};
    for (int f = 0; f < NFMT; f++) {
        if (fmts[f] == KVA_QUANT_FP8_E4M3)
            continue;
        kva_cache_desc cd = {6, 16, 2, 64, 64, fmt_dtype(f), KVA_LAYOUT_NHD, fmts[f]};
        float buf[2 * 2 * 128];
        kva_quant_params p;
        make_params(cd.quant, 2, 64, 64, 0, &rng, buf, &p);
        qpair qp;
        qpair_create(href, gpu, &cd, &p, &qp);
        if (!qp.hc || !qp.dc) {
            qpair_destroy(&qp);
            continue;
        }
        fill_and_write(href, gpu, &qp, &rng, KVA_DTYPE_F32, 0);
        snap before;
        snap_take(qp.dc, &before);
        const int32_t T = 6;
        float k[6 * 128], v[6 * 128];
        int64_t slots[6] = {3, 17, -1, 40, 41, 95};
        kva_test_fill_uniform(k, KVA_DTYPE_F32, sizeof k / 4, &rng);
        kva_test_fill_uniform(v, KVA_DTYPE_F32, sizeof v / 4, &rng);
        /* A NaN at token 3, head 1, channel 5: in V where V is int8, else in K;
         * a NaN in the padding token 2 is ignored; +inf in K saturates under
         * static scales but is rejected for per-token keys (token 4). */
        const int v_int8 = kva__quant_is_int8(cd.quant, 1);
        (v_int8 ? v : k)[3 * 128 + 64 + 5] = NAN;
        k[2 * 128 + 7] = NAN;
        void *dk = dev_from(k, sizeof k), *dv = dev_from(v, sizeof v);
        int64_t *ds = dev_from(slots, sizeof slots);
        CHECK_STATUS(kva_cache_write(href, qp.hc, T, k, 0, v, 0, KVA_DTYPE_F32, slots),
                     KVA_STATUS_INVALID_ARGUMENT);
        char want[64];
        snprintf(want, sizeof want, "%s[token 3, head 1, channel 5]", v_int8 ? "v" : "k");
        CHECK_ERROR_MENTIONS(want);
        CHECK_STATUS(kva_cache_write(gpu, qp.dc, T, dk, 0, dv, 0, KVA_DTYPE_F32, ds),
                     KVA_STATUS_INVALID_ARGUMENT);
        CHECK_ERROR_MENTIONS(want);
        CHECK_ERROR_MENTIONS("nothing was written");
        snap after;
        snap_take(qp.dc, &after);
        CHECK(memcmp(before.k, after.k, bytes_k(qp.dc)) == 0);
        CHECK(memcmp(before.v, after.v, bytes_v(qp.dc)) == 0);
        CHECK(memcmp(before.ts, after.ts, bytes_ts(qp.dc)) == 0);
        snap_free(&after);
        /* +inf at token 4, head 0, channel 9 (the NaN removed). */
        (v_int8 ? v : k)[3 * 128 + 64 + 5] = 0.25f;
        k[4 * 128 + 9] = INFINITY;
        CUDA_OK(cudaMemcpy(dk, k, sizeof k, cudaMemcpyHostToDevice));
        CUDA_OK(cudaMemcpy(dv, v, sizeof v, cudaMemcpyHostToDevice));
        const int tok = cd.quant != KVA_QUANT_INT8_CHANNEL;
        const kva_status want_inf = tok ? KVA_STATUS_INVALID_ARGUMENT : KVA_STATUS_OK;
        CHECK_STATUS(kva_cache_write(href, qp.hc, T, k, 0, v, 0, KVA_DTYPE_F32, slots), want_inf);
        CHECK_STATUS(kva_cache_write(gpu, qp.dc, T, dk, 0, dv, 0, KVA_DTYPE_F32, ds), want_inf);
        if (tok)
            CHECK_ERROR_MENTIONS("k[token 4, head 0, channel 9]");
        CHECK_MSG(same_bytes("after +inf", qp.hc, qp.dc), "%s", kva_quant_name(cd.quant));

        /* Captured: the bad write is dropped by the graph, reported afterwards. */
        k[4 * 128 + 9] = 0.5f;
        (v_int8 ? v : k)[1 * 128 + 3] = NAN;
        CUDA_OK(cudaMemcpy(dk, k, sizeof k, cudaMemcpyHostToDevice));
        CUDA_OK(cudaMemcpy(dv, v, sizeof v, cudaMemcpyHostToDevice));
        snap_free(&before);
        snap_take(qp.dc, &before);
        cudaStream_t s;
        CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
        CHECK_OK(kva_cuda_context_set_stream(gpu, s));
        cudaGraph_t g;
        cudaGraphExec_t ge;
        CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
        CHECK_OK(kva_cache_write(gpu, qp.dc, T, dk, 0, dv, 0, KVA_DTYPE_F32, ds));
        CUDA_OK(cudaStreamEndCapture(s, &g));
        CUDA_OK(cudaGraphInstantiate(&ge, g, 0));
        CUDA_OK(cudaGraphLaunch(ge, s));
        CHECK_STATUS(kva_cuda_cache_write_status(gpu, qp.dc), KVA_STATUS_INVALID_ARGUMENT);
        snprintf(want, sizeof want, "%s[token 1, head 0, channel 3]", v_int8 ? "v" : "k");
        CHECK_ERROR_MENTIONS(want);
        snap_take(qp.dc, &after);
        CHECK(memcmp(before.k, after.k, bytes_k(qp.dc)) == 0);
        CHECK(memcmp(before.v, after.v, bytes_v(qp.dc)) == 0);
        CHECK(memcmp(before.ts, after.ts, bytes_ts(qp.dc)) == 0);
        /* Fixed input replayed: written, status OK, equal to the CPU write. */
        (v_int8 ? v : k)[1 * 128 + 3] = -0.75f;
        CUDA_OK(cudaMemcpy(dk, k, sizeof k, cudaMemcpyHostToDevice));
        CUDA_OK(cudaMemcpy(dv, v, sizeof v, cudaMemcpyHostToDevice));
        CUDA_OK(cudaGraphLaunch(ge, s));
        CHECK_OK(kva_cuda_cache_write_status(gpu, qp.dc));
        CHECK_OK(kva_cache_write(href, qp.hc, T, k, 0, v, 0, KVA_DTYPE_F32, slots));
        CHECK_MSG(same_bytes("graph replay", qp.hc, qp.dc), "%s", kva_quant_name(cd.quant));
        cudaGraphExecDestroy(ge);
        cudaGraphDestroy(g);
        CHECK_OK(kva_cuda_context_set_stream(gpu, NULL));
        cudaStreamDestroy(s);
        snap_free(&before);
        snap_free(&after);

        /* Deferred status: two bad writes return OK and change nothing, the
         * good write after them goes through, the status call names the
         * first bad write once and then reports OK. */
        CHECK_STATUS(kva_cuda_context_set_deferred_write_status(gpu, 2),
                     KVA_STATUS_INVALID_ARGUMENT);
        CHECK_ERROR_MENTIONS("deferred");
        CHECK_STATUS(kva_cuda_context_set_deferred_write_status(href, 1),
                     KVA_STATUS_INVALID_ARGUMENT);
        CHECK_OK(kva_cuda_context_set_deferred_write_status(gpu, 1));
        snap_take(qp.dc, &before);
        const float good = (v_int8 ? v : k)[5 * 128 + 64 + 2];
        (v_int8 ? v : k)[5 * 128 + 64 + 2] = NAN;
        CUDA_OK(cudaMemcpy(dk, k, sizeof k, cudaMemcpyHostToDevice));
        CUDA_OK(cudaMemcpy(dv, v, sizeof v, cudaMemcpyHostToDevice));
        CHECK_OK(kva_cache_write(gpu, qp.dc, T, dk, 0, dv, 0, KVA_DTYPE_F32, ds));
        (v_int8 ? v : k)[5 * 128 + 64 + 2] = good;
        (v_int8 ? v : k)[0 * 128 + 1] = NAN;
        CUDA_OK(cudaMemcpy(dk, k, sizeof k, cudaMemcpyHostToDevice));
        CUDA_OK(cudaMemcpy(dv, v, sizeof v, cudaMemcpyHostToDevice));
        CHECK_OK(kva_cache_write(gpu, qp.dc, T, dk, 0, dv, 0, KVA_DTYPE_F32, ds));
        snap_take(qp.dc, &after);
        CHECK(memcmp(before.k, after.k, bytes_k(qp.dc)) == 0);
        CHECK(memcmp(before.v, after.v, bytes_v(qp.dc)) == 0);
        CHECK(memcmp(before.ts, after.ts, bytes_ts(qp.dc)) == 0);
        snap_free(&after);
        (v_int8 ? v : k)[0 * 128 + 1] = 1.5f;
        kva_test_fill_uniform(k + 128, KVA_DTYPE_F32, 128, &rng); /* token 1 changes */
        CUDA_OK(cudaMemcpy(dk, k, sizeof k, cudaMemcpyHostToDevice));
        CUDA_OK(cudaMemcpy(dv, v, sizeof v, cudaMemcpyHostToDevice));
        CHECK_OK(kva_cache_write(gpu, qp.dc, T, dk, 0, dv, 0, KVA_DTYPE_F32, ds));
        CHECK_OK(kva_cache_write(href, qp.hc, T, k, 0, v, 0, KVA_DTYPE_F32, slots));
        CHECK_MSG(same_bytes("deferred good write", qp.hc, qp.dc), "%s", kva_quant_name(cd.quant));
        CHECK_STATUS(kva_cuda_cache_write_status(gpu, qp.dc), KVA_STATUS_INVALID_ARGUMENT);
        snprintf(want, sizeof want, "%s[token 5, head 1, channel 2]", v_int8 ? "v" : "k");
        CHECK_ERROR_MENTIONS(want);
        CHECK_OK(kva_cuda_cache_write_status(gpu, qp.dc));
        CHECK_OK(kva_cuda_context_set_deferred_write_status(gpu, 0));
        snap_free(&before);
        cudaFree(dk);
        cudaFree(dv);
        cudaFree(ds);
        qpair_destroy(&qp);
    }
    kva_context_destroy(href);
    kva_context_destroy(gpu);
}

/* 3. copy_blocks / swap_blocks move K, V and the per-token scales. */
static void test_copy_swap(void)
{
    kva_context *href = make_ctx(KVA_BACKEND_REF), *gpu = make_ctx(KVA_BACKEND_CUDA);
    kva_rng rng = {7};
    for (int f = 0; f < NFMT; f++) {
        kva_cache_desc cd = {
            8, 5, 2, 64, 32, fmt_dtype(f), f % 2 ? KVA_LAYOUT_HND : KVA_LAYOUT_NHD, fmts[f]};
        float buf[2 * 2 * 96];
        kva_quant_params p;
        make_params(cd.quant, 2, 64, 32, 1, &rng, buf, &p);
        qpair qp;
        qpair_create(href, gpu, &cd, &p, &qp);
        if (!qp.hc || !qp.dc) {
            qpair_destroy(&qp);
            continue;
        }
        fill_and_write(href, gpu, &qp, &rng, KVA_DTYPE_BF16, 0);
        const int32_t pairs[3][2] = {{1, 6}, {4, 4}, {2, 0}};
        CHECK_OK(kva_cache_copy_blocks(href, qp.hc, &pairs[0][0], 3));
        CHECK_OK(kva_cache_copy_blocks(gpu, qp.dc, &pairs[0][0], 3));
        CHECK_MSG(same_bytes("copy_blocks", qp.hc, qp.dc), "%s", kva_quant_name(cd.quant));
        /* Swap-out of every block into a host cache, then back into a fresh device cache. */
        kva_cache *out = NULL, *back = NULL;
        CHECK_OK(kva_cache_create_quant(href, &cd, &p, &out));
        CHECK_OK(kva_cache_create_quant(gpu, &cd, &p, &back));
        int32_t all[8][2];
        for (int32_t b = 0; b < 8; b++)
            all[b][0] = b, all[b][1] = 7 - b;
        CHECK_OK(kva_cache_swap_blocks(gpu, qp.dc, out, &all[0][0], 8));
        CHECK_OK(kva_cache_swap_blocks(gpu, out, back, &all[0][0], 8));
        CUDA_OK(cudaDeviceSynchronize());
        CHECK_MSG(same_bytes("swap out and in", qp.hc, back), "%s", kva_quant_name(cd.quant));
        kva_cache_destroy(out);
        kva_cache_destroy(back);
        qpair_destroy(&qp);
    }
    kva_context_destroy(href);
    kva_context_destroy(gpu);
}

/* Uploads a host quantized cache's bytes (K, V, token scales) to the device
 * cache of the same desc and scales. */
static void upload_quant(kva_cache *dc, const kva_cache *hc)
{
    cache_upload(dc, hc);
    float *hs = NULL, *ds = NULL;
    kva_cache_token_scales(hc, &hs);
    kva_cache_token_scales(dc, &ds);
    if (hs && ds)
        CUDA_OK(cudaMemcpy(ds, hs, bytes_ts(hc), cudaMemcpyHostToDevice));
}

/* Makes every slot no request reads unreadable: token scales NaN, and the
 * slots' bytes 0xff (NaN for fp8 and 16-bit V; -1 for int8). */
static void poison_unread(kva_cache *hc, const kva_test_batch *b)
{
    const kva_cache_desc *d = &hc->desc;
    const int32_t B = d->block_size, Hkv = d->num_kv_heads;
    int32_t *used = calloc((size_t)d->num_blocks, sizeof(int32_t));
    for (int32_t r = 0; r < b->R; r++)
        for (int32_t j = 0; (int64_t)j * B < b->seq_lens[r]; j++) {
            const int32_t blk = b->block_table[(size_t)r * b->stride + j];
            const int32_t n = b->seq_lens[r] - j * B < B ? b->seq_lens[r] - j * B : B;
            if (n > used[blk])
                used[blk] = n;
        }
    for (int32_t blk = 0; blk < d->num_blocks; blk++)
        for (int32_t o = used[blk]; o < B; o++)
            for (int32_t h = 0; h < Hkv; h++) {
                const int64_t rk = kva__cache_row(d, blk, o, h, d->head_dim);
                const int64_t rv = kva__cache_row(d, blk, o, h, d->head_dim_v);
                memset((char *)hc->k + rk * (int64_t)hc->elem_size, 0xff,
                       (size_t)d->head_dim * hc->elem_size);
                memset((char *)hc->v + rv * (int64_t)hc->v_elem, 0xff,
                       (size_t)d->head_dim_v * hc->v_elem);
                if (hc->k_token_scale)
                    hc->k_token_scale[kva__token_scale_index(d, blk, o, h)] = NAN;
            }
    free(used);
}

typedef struct acfg {
    int f; /* index into fmts */
    int32_t H, Hkv, D, Dv, B;
    kva_dtype qdt;
    kva_layout layout;
    int32_t causal, window;
    float softcap;
    int alibi, sinks, lse, gran;
    int kind;         /* 0 mixed random batch, 1 long decodes (split-KV), 2 mixed with big prefills,
                         3 decodes and speculative decodes of 1..8 tokens (decode_threshold 8) */
    int variant;      /* plan variant forced (2: the cp.async ring), 0: the default */
    int qmma;         /* version of the tensor-core kernel (decode_mma_quant.cu), 0: the default */
    int q_odd;        /* q at an element-aligned but not 16-byte aligned device address */
    float qmag, kmag; /* 0, or the spread of q (normal, sigma) and of K (uniform times kmag,
                         static K scales times kmag), with the softmax scale set to keep the
                         logits O(1): q * s beyond the f16 range */
} acfg;

static void print_acfg(const acfg *c)
{
    fprintf(stderr,
            "  case %s/%s H=%d Hkv=%d D=%d Dv=%d B=%d q %s %s causal=%d window=%d softcap=%g "
            "alibi=%d sinks=%d lse=%d gran=%d kind=%d variant=%d qmma=%d q_odd=%d\n",
            kva_quant_name(fmts[c->f]), kva_dtype_name(fmt_dtype(c->f)), c->H, c->Hkv, c->D, c->Dv,
            c->B, kva_dtype_name(c->qdt), c->layout == KVA_LAYOUT_HND ? "HND" : "NHD", c->causal,
            c->window, (double)c->softcap, c->alibi, c->sinks, c->lse, c->gran, c->kind, c->variant,
            c->qmma, c->q_odd);
}

/* 4. Attention: device vs reference over the same quantized bytes. */
static int run_attn(const acfg *c, uint64_t seed)
{
    kva_rng rng = {seed};
    kva_test_batch b;
    if (c->kind == 1) {
        const int32_t ql[4] = {1, 1, 2, 1}, sl[4] = {9000, 5000, 300, 4100};
        kva_test_batch_init(&b, &rng, 4, ql, sl, c->B, 2, 1);
    } else if (c->kind == 2) {
        const int32_t ql[6] = {1, 200, 3, 77, 1, 130}, sl[6] = {500, 200, 900, 300, 37, 400};
        kva_test_batch_init(&b, &rng, 6, ql, sl, c->B, 2, 1);
    } else if (c->kind == 3) {
        const int32_t ql[8] = {4, 3, 8, 1, 6, 2, 5, 4},
                      sl[8] = {700, 33, 2500, 17, 300, 64, 1200, 129};
        kva_test_batch_init(&b, &rng, 8, ql, sl, c->B, 2, 1);
    } else {
        kva_test_batch_random(&b, &rng, 7, c->B, 150, 0xf, 1);
    }
    kva_context *href = make_ctx(KVA_BACKEND_REF), *gpu = make_ctx(KVA_BACKEND_CUDA);
    CHECK_OK(kva__cuda_context_force_quant_mma(gpu, c->qmma));
    const int32_t H = c->H, Hkv = c->Hkv, D = c->D, Dv = c->Dv, T = b.T;
    kva_cache_desc cd = {b.num_blocks, c->B, Hkv, D, Dv, fmt_dtype(c->f), c->layout, fmts[c->f]};
    float *buf = malloc(sizeof(float) * 2 * Hkv * (D + Dv));
    kva_quant_params p;
    make_params(cd.quant, Hkv, D, Dv, c->gran, &rng, buf, &p);
    const double kmag = c->kmag > 0.f ? c->kmag : 1.0;
    for (int32_t i = 0; i < Hkv * D && cd.quant != KVA_QUANT_INT8_TOKEN_K &&
                        cd.quant != KVA_QUANT_INT8_TOKEN_K_V16;
         i++)
        buf[i] = (float)(buf[i] * kmag); /* K scales (the first Hkv for fp8) */
    qpair qp;
    qpair_create(href, gpu, &cd, &p, &qp);
    int bad_total = 1;
    if (qp.hc && qp.dc) {
        /* Every slot written from unit-variance float data on the host. */
        const int32_t n = b.num_blocks * c->B;
        float *k = malloc(sizeof(float) * (size_t)n * Hkv * D);
        float *v = malloc(sizeof(float) * (size_t)n * Hkv * Dv);
        int64_t *slots = malloc(sizeof(int64_t) * (size_t)n);
        kva_test_fill_uniform(k, KVA_DTYPE_F32, (size_t)n * Hkv * D, &rng);
        kva_test_fill_uniform(v, KVA_DTYPE_F32, (size_t)n * Hkv * Dv, &rng);
        for (size_t i = 0; c->kmag > 0.f && i < (size_t)n * Hkv * D; i++)
            k[i] *= c->kmag;
        for (int32_t i = 0; i < n; i++)
            slots[i] = i;
        CHECK_OK(kva_cache_write(href, qp.hc, n, k, 0, v, 0, KVA_DTYPE_F32, slots));
        poison_unread(qp.hc, &b);
        upload_quant(qp.dc, qp.hc);
        free(k);
        free(v);
        free(slots);

        kva_plan_desc pd = kva_test_batch_plan_desc(&b, H, Hkv, D, Dv, c->qdt);
        pd.causal = c->causal;
        pd.window_left = c->window;
        pd.softcap = c->softcap;
        if (c->qmag > 0.f) /* logits of about unit spread */
            pd.scale = (float)(1.0 / (sqrt((double)D) * c->qmag * kmag));
        if (c->kind == 3)
            pd.decode_threshold = 8;
        float *slopes = malloc(sizeof(float) * (size_t)H),
              *sinks = malloc(sizeof(float) * (size_t)H);
        for (int32_t h = 0; h < H; h++) {
            slopes[h] = (float)pow(2.0, -8.0 * (h + 1) / H);
            sinks[h] = (float)(kva_rng_normal(&rng) * 2.0);
        }
        pd.alibi_slopes = c->alibi ? slopes : NULL;
        kva_plan *pr = NULL, *pg = NULL;
        CHECK_OK(kva_plan_create(href, &pd, &pr));
        CHECK_OK(kva_plan_create(gpu, &pd, &pg));
        if (pg && c->variant)
            pg->part->variant = c->variant;
        const size_t es = kva_dtype_size(c->qdt);
        const size_t nq = (size_t)T * H * D, no = (size_t)T * H * Dv, nl = (size_t)T * H;
        void *q = malloc(nq * es + 4), *want = malloc(no * es + 4), *got = malloc(no * es + 4);
        float *lw = malloc(nl * 4 + 4), *lg = malloc(nl * 4 + 4);
        if (c->qmag > 0.f)
            kva_test_fill(q, c->qdt, nq, &rng, c->qmag);
        else
            kva_test_fill_uniform(q, c->qdt, nq, &rng);
        /* q_odd: q one element past a 16-byte boundary (scalar q loads). */
        char *dq_base = NULL;
        if (c->q_odd) {
            CUDA_OK(cudaMalloc((void **)&dq_base, nq * es + 16));
            CUDA_OK(cudaMemcpy(dq_base + es, q, nq * es, cudaMemcpyHostToDevice));
        } else {
            dq_base = dev_from(q, nq * es);
        }
        void *dq = dq_base + (c->q_odd ? es : 0), *dout = dev_poisoned(no * es);
        float *dl = c->lse ? dev_poisoned(nl * 4) : NULL;
        float *ds = c->sinks ? dev_from(sinks, (size_t)H * 4) : NULL;
        kva_test_poison(want, c->qdt, no);
        kva_test_poison(lw, KVA_DTYPE_F32, nl);
        kva_test_poison(got, c->qdt, no);
        kva_test_poison(lg, KVA_DTYPE_F32, nl);
        CHECK_OK(kva_attention_run(href, pr, q, qp.hc, c->sinks ? sinks : NULL, want,
                                   c->lse ? lw : NULL));
        CHECK_OK(kva_attention_run(gpu, pg, dq, qp.dc, ds, dout, dl));
        to_host(got, dout, no * es);
        /* Items of a plan partitioned for variant 4 over 1-byte K and V run
         * on the tensor-core kernel (decode_mma_quant.cu), which rounds the
         * softmax weights to f16 for P V (as variant 4 and FlashAttention):
         * out may differ by 2^-11 max|v| more (|v| <= 2: the uniform fill,
         * sqrt 3, plus the quantization step). Its scores are exact to
         * ~2^-22 (Q' as f16 hi + lo), so lse keeps its tolerance. */
        const int tiles = pg ? ((const kva__cuda_plan *)pg->device)->num_ptiles : 0;
        /* The prefill tiles run on the tensor-core prefill kernel
         * (prefill_mma_quant.h) where it covers the shape: the same f16 P. */
        const int mma = (pg && pg->part->variant == 4 &&
                         kva__cuda_decode_mma_quant_supported(cd.quant, cd.dtype, D, Dv, c->qdt)) ||
                        (tiles > 0 && kva__cuda_qprefill_usable(gpu, pg, dq, qp.dc));
        /* INT8_TOKEN_K_V16 rounds P to V's dtype (bf16: 2^-8). */
        const double pu =
            cd.quant == KVA_QUANT_INT8_TOKEN_K_V16 && c->qdt == KVA_DTYPE_BF16 ? 0x1p-8 : 0x1p-11;
        const double atol = kva_test_atol(c->qdt) + (mma ? pu * 2.0 : 0.0);
        size_t bad = kva_test_compare("out", got, want, c->qdt, no, atol, kva_test_rtol(c->qdt));
        if (c->lse) {
            to_host(lg, dl, nl * 4);
            bad += kva_test_compare_f32("lse", lg, lw, nl, 1e-4, 2e-5);
        }
        CHECK_MSG(bad == 0, "%zu mismatches (T=%d, %d items, %d prefill tiles)", bad, (int)T,
                  pg ? (int)pg->info.num_work_items : -1, tiles);
        if (bad)
            print_acfg(c);
        bad_total = bad != 0;
        kva_plan_destroy(pr);
        kva_plan_destroy(pg);
        cudaFree(dq_base);
        cudaFree(dout);
        cudaFree(dl);
        cudaFree(ds);
        free(q), free(want), free(got), free(lw), free(lg), free(slopes), free(sinks);
    }
    qpair_destroy(&qp);
    free(buf);
    kva_context_destroy(href);
    kva_context_destroy(gpu);
    kva_test_batch_free(&b);
    return !bad_total;
}

static void test_attention(void)
{
    static const int32_t heads[][2] = {{8, 2}, {32, 8}, {16, 1}, {12, 4}, {6, 6}, {24, 3}};
    static const int32_t dims[][2] = {{128, 128}, {64, 64},  {256, 256}, {40, 72},
                                      {96, 96},   {128, 64}, {8, 8},     {64, 256}};
    static const int32_t bsz[] = {16, 1, 3, 64, 16, 7};
    static const kva_dtype qdts[] = {KVA_DTYPE_BF16, KVA_DTYPE_F16, KVA_DTYPE_F32};
    static const int32_t windows[] = {-1, -1, 0, 7, 100};
    kva_rng rng = {777};
    int failed = 0;
    const int n = quick() ? 12 : 90;
    for (int i = 0; i < n && failed < 6; i++) {
        acfg c;
        memset(&c, 0, sizeof c);
        c.f = i % NFMT;
        const int hi = kva_rng_int(&rng, 0, 5), di = kva_rng_int(&rng, 0, 7);
        c.H = heads[hi][0];
        c.Hkv = heads[hi][1];
        c.D = dims[di][0];
        c.Dv = dims[di][1];
        c.B = bsz[kva_rng_int(&rng, 0, 5)];
        c.qdt = qdts[(i / NFMT) % 3];
        c.layout = kva_rng_int(&rng, 0, 1) ? KVA_LAYOUT_HND : KVA_LAYOUT_NHD;
        c.causal = kva_rng_int(&rng, 0, 4) != 0;
        c.window = windows[kva_rng_int(&rng, 0, 4)];
        c.softcap = kva_rng_int(&rng, 0, 3) == 0 ? 5.0f : 0.0f;
        c.alibi = kva_rng_int(&rng, 0, 3) == 0;
        c.sinks = kva_rng_int(&rng, 0, 2) == 0;
        c.lse = kva_rng_int(&rng, 0, 3) != 0;
        c.gran = kva_rng_int(&rng, 0, 2);
        /* Every 7th case: long decodes (split-KV); every 5th: big prefills. */
        c.kind = i % 7 == 3 ? 1 : i % 5 == 2 ? 2 : 0;
        c.variant = i % 3; /* 0: the default (variant 4 where the shape has it), 2: the ring */
        if (c.kind == 2 && c.qdt == KVA_DTYPE_F32)
            c.qdt = KVA_DTYPE_BF16; /* the tensor-core shapes route prefill tiles */
        if (!run_attn(&c, 9000 + (uint64_t)i))
            failed++;
    }
    /* The decode benchmark's shape, each format, bf16 queries, split decodes. */
    for (int f = 0; f < NFMT && !quick(); f++) {
        acfg c = {
            f, 32, 8, 128,           128, 16, KVA_DTYPE_BF16, KVA_LAYOUT_NHD, 1, -1, 0.f, 0, 1,
            1, 0,  1, f % 2 ? 2 : 0, 0,   0};
        run_attn(&c, 31 + (uint64_t)f);
    }
}

/*
 * 4b. Speculative decodes over default plans: with f16/bf16 q and D in {64,
 * 128, 256} the plan is partitioned for variant 4 (items of up to 16 rows,
 * q_len x G of them), which the quantized path must cover whole (rows 8..15
 * of such items were once skipped). GQA 1/4/8, q_len 1..8, B 1/16, NHD/HND,
 * masks and splits (the 2500-key request splits).
 */
static void test_spec_decode(void)
{
    static const int32_t heads[][2] = {{16, 4}, {32, 4}, {8, 8}, {32, 8}};
    static const int32_t dims[] = {128, 64, 256};
    static const int32_t windows[] = {-1, -1, 5, 300};
    kva_rng rng = {4242};
    int failed = 0;
    const int n = quick() ? NFMT * 2 : NFMT * 12;
    for (int i = 0; i < n && failed < 6; i++) {
        acfg c;
        memset(&c, 0, sizeof c);
        c.f = i % NFMT;
        const int hi = (i / NFMT) % 4;
        c.H = heads[hi][0];
        c.Hkv = heads[hi][1];
        c.D = c.Dv = dims[(i / (NFMT * 4)) % 3];
        c.B = (i / 2) % 2 ? 1 : 16;
        c.qdt = i % 2 ? KVA_DTYPE_F16 : KVA_DTYPE_BF16;
        c.layout = (i / 3) % 2 ? KVA_LAYOUT_HND : KVA_LAYOUT_NHD;
        c.causal = 1;
        c.window = windows[kva_rng_int(&rng, 0, 3)];
        c.softcap = kva_rng_int(&rng, 0, 3) == 0 ? 5.0f : 0.0f;
        c.alibi = kva_rng_int(&rng, 0, 3) == 0;
        c.sinks = kva_rng_int(&rng, 0, 1);
        c.lse = 1;
        c.gran = kva_rng_int(&rng, 0, 2);
        c.kind = 3;
        /* The default (variant 4's 16-row items: on the tensor-core kernel for
         * 1-byte K/V); every third case on the CUDA-core kernel (sub-units). */
        c.variant = i % 3 == 2 ? 1 : 0;
        if (!run_attn(&c, 5100 + (uint64_t)i))
            failed++;
    }
}

/*
 * 4c. Every version of the quantized tensor-core kernel (decode_mma_quant.cu;
 * 16- and 32-key warp steps, Q' staging before or after the first copies)
 * over every format it covers (INT8_TOKEN_K_V16 with q in V's dtype): decodes and speculative
 * decodes of 1..8 tokens (kind 3) and long split decodes (kind 1), GQA 1/4/8, D 64/128/256, B 1/16,
 * NHD/HND, f16/bf16 q, and q not 16-byte aligned (scalar q loads).
 */
static void test_mma_versions(void)
{
    /* INT8_CHANNEL, INT8_TOKEN_K, FP8_E4M3, INT8_TOKEN_K_V16 bf16 and f16 V
     * (q in V's dtype: the tensor-core kernel's 16-bit V path). */
    static const int f1[] = {0, 1, 4, 3, 2};
    static const int32_t heads[][2] = {{32, 8}, {16, 16}, {64, 8}};
    static const int32_t dims[] = {128, 64, 256};
    kva_rng rng = {3131};
    int failed = 0;
    const int per = quick() ? 5 : 15;
    for (int ver = 1; ver <= KVA__CUDA_QUANT_MMA_VERSIONS; ver++)
        for (int i = 0; i < per && failed < 6; i++) {
            acfg c;
            memset(&c, 0, sizeof c);
            c.f = f1[i % 5];
            c.H = heads[(i / 3) % 3][0];
            c.Hkv = heads[(i / 3) % 3][1];
            c.D = c.Dv = dims[(i / 2) % 3];
            c.B = i % 4 == 1 ? 1 : 16;
            c.qdt = fmts[c.f] == KVA_QUANT_INT8_TOKEN_K_V16 ? fmt_dtype(c.f)
                    : i % 2                                 ? KVA_DTYPE_F16
                                                            : KVA_DTYPE_BF16;
            c.layout = (i / 4) % 2 ? KVA_LAYOUT_HND : KVA_LAYOUT_NHD;
            c.causal = 1;
            c.window = i % 6 == 4 ? 300 : -1;
            c.softcap = i % 6 == 5 ? 5.0f : 0.0f;
            c.alibi = i % 7 == 3;
            c.sinks = i % 2;
            c.lse = 1;
            c.gran = kva_rng_int(&rng, 0, 2);
            c.kind = i % 3 == 2 ? 1 : 3;
            c.qmma = ver;
            c.q_odd = i % 4 == 3;
            if (!run_attn(&c, 7700 + 100 * (uint64_t)ver + (uint64_t)i))
                failed++;
        }
    /* The version knob is checked. */
    kva_context *gpu = make_ctx(KVA_BACKEND_CUDA);
    CHECK_STATUS(kva__cuda_context_force_quant_mma(gpu, KVA__CUDA_QUANT_MMA_VERSIONS + 1),
                 KVA_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(kva__cuda_context_force_quant_mma(gpu, -1), KVA_STATUS_INVALID_ARGUMENT);
    CHECK_OK(kva__cuda_context_force_quant_mma(gpu, 0));
    kva_context_destroy(gpu);
}

/*
 * 4c. q * s beyond the f16 range: the tensor-core kernel holds Q' = q s in
 * f16 (decode_mma_quant.cu, qm_range). Large q (bf16 sigma 2e4, or 1e5 for
 * the per-token formats, where Q' = q; f16 sigma 1e4) against large keys
 * (kmag 5000: static K scales ~70), softmax scale chosen for unit logits;
 * both versions, every format, decodes, spec decodes and split decodes. An
 * f16 Q' without the range step is inf there and the rows NaN.
 */
static void test_q_range(void)
{
    static const int f1[] = {0, 1, 4, 3, 2};
    int failed = 0;
    for (int ver = 1; ver <= KVA__CUDA_QUANT_MMA_VERSIONS; ver++)
        for (int i = 0; i < (quick() ? 5 : 10) && failed < 4; i++) {
            acfg c;
            memset(&c, 0, sizeof c);
            c.f = f1[i % 5];
            c.H = 32;
            c.Hkv = 8;
            c.D = c.Dv = i % 3 == 2 ? 64 : 128;
            c.B = 16;
            c.qdt = fmts[c.f] == KVA_QUANT_INT8_TOKEN_K_V16 ? fmt_dtype(c.f)
                    : i >= 5                                ? KVA_DTYPE_F16
                                                            : KVA_DTYPE_BF16;
            c.layout = i % 2 ? KVA_LAYOUT_HND : KVA_LAYOUT_NHD;
            c.causal = 1;
            c.window = -1;
            c.sinks = i % 2;
            c.lse = 1;
            c.gran = i % 3;
            c.kind = i % 2 ? 1 : 3;
            c.qmma = ver;
            const int tok =
                fmts[c.f] == KVA_QUANT_INT8_TOKEN_K || fmts[c.f] == KVA_QUANT_INT8_TOKEN_K_V16;
            c.qmag = c.qdt == KVA_DTYPE_F16 ? 1e4f : tok ? 1e5f : 2e4f;
            c.kmag = 5000.f;
            if (!run_attn(&c, 5100 + 100 * (uint64_t)ver + (uint64_t)i))
                failed++;
        }
}

/* 5. A graph captured over a quantized decode replays to the direct result. */
static void test_graph(void)
{
    kva_context *href = make_ctx(KVA_BACKEND_REF), *gpu = make_ctx(KVA_BACKEND_CUDA);
    kva_rng rng = {55};
    const int32_t ql[8] = {1, 1, 1, 1, 1, 1, 1, 1}, sl[8] = {40, 3000, 17, 900, 5, 64, 650, 128};
    kva_test_batch b;
    kva_test_batch_init(&b, &rng, 8, ql, sl, 16, 2, 0);
    const int32_t H = 16, Hkv = 4, D = 128;
    kva_cache_desc cd = {b.num_blocks,          16, Hkv, D, D, KVA_DTYPE_I8, KVA_LAYOUT_NHD,
                         KVA_QUANT_INT8_TOKEN_K};
    float buf[2 * 4 * 256];
    kva_quant_params p;
    make_params(cd.quant, Hkv, D, D, 0, &rng, buf, &p);
    qpair qp;
    qpair_create(href, gpu, &cd, &p, &qp);
    const int32_t n = b.num_blocks * 16;
    float *k = malloc(sizeof(float) * (size_t)n * Hkv * D),
          *v = malloc(sizeof(float) * (size_t)n * Hkv * D);
    int64_t *slots = malloc(sizeof(int64_t) * (size_t)n);
    kva_test_fill_uniform(k, KVA_DTYPE_F32, (size_t)n * Hkv * D, &rng);
    kva_test_fill_uniform(v, KVA_DTYPE_F32, (size_t)n * Hkv * D, &rng);
    for (int32_t i = 0; i < n; i++)
        slots[i] = i;
    CHECK_OK(kva_cache_write(href, qp.hc, n, k, 0, v, 0, KVA_DTYPE_F32, slots));
    upload_quant(qp.dc, qp.hc);
    kva_plan_desc pd = kva_test_batch_plan_desc(&b, H, Hkv, D, D, KVA_DTYPE_BF16);
    kva_plan *pr = NULL, *pg = NULL;
    CHECK_OK(kva_plan_create(href, &pd, &pr));
    cudaStream_t s;
    CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CHECK_OK(kva_cuda_context_set_stream(gpu, s));
    CHECK_OK(kva_plan_create(gpu, &pd, &pg));
    const size_t no = (size_t)b.T * H * D;
    void *q = malloc(no * 2), *want = malloc(no * 2), *got = malloc(no * 2);
    kva_test_fill_uniform(q, KVA_DTYPE_BF16, no, &rng);
    void *dq = dev_from(q, no * 2), *dout = dev_poisoned(no * 2);
    CUDA_OK(cudaStreamSynchronize(s));
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    CHECK_OK(kva_attention_run(gpu, pg, dq, qp.dc, NULL, dout, NULL));
    CUDA_OK(cudaStreamEndCapture(s, &g));
    CUDA_OK(cudaGraphInstantiate(&ge, g, 0));
    CUDA_OK(cudaGraphLaunch(ge, s));
    CUDA_OK(cudaStreamSynchronize(s));
    CHECK_OK(kva_attention_run(href, pr, q, qp.hc, NULL, want, NULL));
    to_host(got, dout, no * 2);
    /* The decode items run on the tensor-core kernel (f16 P V): run_attn's bound. */
    const double atol =
        kva_test_atol(KVA_DTYPE_BF16) +
        (pg && pg->part->variant == 4 &&
                 kva__cuda_decode_mma_quant_supported(cd.quant, cd.dtype, D, D, KVA_DTYPE_BF16)
             ? 0x1p-11 * 2.0
             : 0.0);
    CHECK(kva_test_compare("graph", got, want, KVA_DTYPE_BF16, no, atol,
                           kva_test_rtol(KVA_DTYPE_BF16)) == 0);
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(g);
    CHECK_OK(kva_cuda_context_set_stream(gpu, NULL));
    cudaStreamDestroy(s);
    kva_plan_destroy(pr);
    kva_plan_destroy(pg);
    cudaFree(dq);
    cudaFree(dout);
    free(q), free(want), free(got), free(k), free(v), free(slots);
    qpair_destroy(&qp);
    kva_context_destroy(href);
    kva_context_destroy(gpu);
    kva_test_batch_free(&b);
}

#endif /* KVA_HAVE_CUDA */

int main(void)
{
    int skip = cuda_test_skip();
    if (skip)
        return skip;
#ifdef KVA_HAVE_CUDA
    RUN(test_write_bytes);
    RUN(test_write_rejects);
    RUN(test_copy_swap);
    RUN(test_graph);
    RUN(test_spec_decode);
    RUN(test_mma_versions);
    RUN(test_q_range);
    RUN(test_attention);
#endif
    return kva_test_finish();
}
