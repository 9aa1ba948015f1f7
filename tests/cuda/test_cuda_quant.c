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
 *   4. attention over the device cache: test_cuda_quant_attn.c;
 *   5. a graph captured over a quantized decode replays to the same output.
 * KVA_TEST_QUICK=1 runs the first cases of each list. Exits 77 without a GPU.
 */
#include "cuda_quant_util.h"
#include "../../src/plan/partition.h"
#include "../../src/attn/cuda/cuda_backend.h"

#ifdef KVA_HAVE_CUDA

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
        (pg && ((const kva__cuda_plan *)pg->device)->decode_kernel == KVA__CUDA_K_DECODE_MMA &&
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
#endif
    return kva_test_finish();
}
