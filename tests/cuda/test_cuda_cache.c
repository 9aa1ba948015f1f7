/*
 * test_cuda_cache.c - the CUDA cache calls and merge_states against the host
 * implementations: kva_cache_write into device caches (dtype conversion,
 * padding slots, token strides, NHD/HND) compared byte for byte with the same
 * write into a host cache; copy_blocks inside a device cache; swap_blocks
 * device -> host -> device; kva_merge_states against the reference; bad
 * inputs (wrong memory space) rejected with the cache untouched. Exits 77
 * without a GPU.
 */
#include "cache_util.h"
#include "cuda_util.h"

#ifdef KVA_HAVE_CUDA

/* Bytes of a device cache's K and V, downloaded into a snapshot. */
static snapshot take_dev(const kva_cache *c)
{
    kva_cache_desc d;
    void *k, *v;
    kva_cache_get_desc(c, &d);
    kva_cache_data(c, &k, &v);
    snapshot s = {NULL, NULL, store_bytes(&d, d.head_dim), store_bytes(&d, d.head_dim_v)};
    s.k = malloc(s.kb);
    s.v = malloc(s.vb);
    to_host(s.k, k, s.kb);
    to_host(s.v, v, s.vb);
    return s;
}

static int same_snap(const snapshot *a, const snapshot *b)
{
    return a->kb == b->kb && a->vb == b->vb && memcmp(a->k, b->k, a->kb) == 0 &&
           memcmp(a->v, b->v, a->vb) == 0;
}

static void test_write(void)
{
    static const kva_dtype dts[] = {KVA_DTYPE_F32, KVA_DTYPE_F16, KVA_DTYPE_BF16};
    kva_rng rng = {42};
    kva_context *ref = new_ctx(KVA_BACKEND_REF, 1), *gpu = new_ctx(KVA_BACKEND_CUDA, 0);
    for (int i = 0; i < 36; i++) {
        const kva_dtype cdt = dts[i % 3], sdt = dts[(i / 3) % 3];
        const kva_layout lay = (i / 9) % 2 ? KVA_LAYOUT_HND : KVA_LAYOUT_NHD;
        const int32_t B = i % 4 == 0 ? 1 : 16, NB = 40, Hkv = 1 + i % 3, D = 64 + 8 * (i % 3);
        const int32_t Dv = i % 2 ? D : 128, T = 1 + (i * 7) % (B == 1 ? NB : 50);
        kva_cache_desc d = make_desc(NB, B, Hkv, D, Dv, cdt, lay);
        kva_cache *hc = NULL, *dc = NULL;
        CHECK_OK(kva_cache_create(ref, &d, &hc));
        CHECK_OK(kva_cache_create(gpu, &d, &dc));
        fill_cache(hc, &rng);
        cache_upload(dc, hc);
        /* Token rows with a stride larger than the row (a fused QKV slice). */
        const int64_t ks = (int64_t)Hkv * D + (i % 2 ? 16 : 0), vs = (int64_t)Hkv * Dv + 8;
        const size_t es = kva_dtype_size(sdt);
        void *k = malloc((size_t)T * ks * es), *v = malloc((size_t)T * vs * es);
        kva_test_fill(k, sdt, (size_t)T * ks, &rng, 1.0);
        kva_test_fill(v, sdt, (size_t)T * vs, &rng, 1.0);
        int64_t *slots = malloc(sizeof(int64_t) * (size_t)T);
        int32_t *perm = malloc(sizeof(int32_t) * (size_t)NB * B);
        for (int32_t j = 0; j < NB * B; j++)
            perm[j] = j;
        for (int32_t j = NB * B - 1; j > 0; j--) {
            int32_t x = kva_rng_int(&rng, 0, j), t = perm[j];
            perm[j] = perm[x];
            perm[x] = t;
        }
        for (int32_t t = 0; t < T; t++)
            slots[t] = t % 5 == 3 ? -1 : perm[t]; /* distinct slots, some padding */
        void *dk = dev_from(k, (size_t)T * ks * es), *dv = dev_from(v, (size_t)T * vs * es);
        int64_t *ds = dev_from(slots, sizeof(int64_t) * (size_t)T);
        CHECK_OK(kva_cache_write(ref, hc, T, k, ks, v, vs, sdt, slots));
        CHECK_OK(kva_cache_write(gpu, dc, T, dk, ks, dv, vs, sdt, ds));
        snapshot want = take(hc), got = take_dev(dc);
        CHECK_MSG(same_snap(&got, &want), "write case %d: src %s -> cache %s %s B=%d", i,
                  kva_dtype_name(sdt), kva_dtype_name(cdt), lay ? "HND" : "NHD", (int)B);
        drop(&want);
        drop(&got);
        cudaFree(dk);
        cudaFree(dv);
        cudaFree(ds);
        free(k);
        free(v);
        free(slots);
        free(perm);
        kva_cache_destroy(hc);
        kva_cache_destroy(dc);
    }
    kva_context_destroy(ref);
    kva_context_destroy(gpu);
}

static void test_copy_swap(void)
{
    kva_rng rng = {7};
    kva_context *ref = new_ctx(KVA_BACKEND_REF, 1), *gpu = new_ctx(KVA_BACKEND_CUDA, 0);
    kva_cache_desc d = make_desc(24, 16, 2, 128, 128, KVA_DTYPE_BF16, KVA_LAYOUT_NHD);
    kva_cache_desc dh = d;
    dh.num_blocks = 10;
    kva_cache *hc = NULL, *dc = NULL, *host = NULL;
    CHECK_OK(kva_cache_create(ref, &d, &hc));
    CHECK_OK(kva_cache_create(gpu, &d, &dc));
    CHECK_OK(kva_cache_create(ref, &dh, &host));
    fill_cache(hc, &rng);
    fill_cache(host, &rng);
    cache_upload(dc, hc);
    /* copy_blocks inside the device cache, as on the host. */
    const int32_t pairs[] = {1, 5, 2, 6, 3, 3, 9, 20};
    CHECK_OK(kva_cache_copy_blocks(ref, hc, pairs, 4));
    CHECK_OK(kva_cache_copy_blocks(gpu, dc, pairs, 4));
    snapshot want = take(hc), got = take_dev(dc);
    CHECK(same_snap(&got, &want));
    drop(&got);
    /* Swap out device blocks to the host cache, then swap host blocks in. */
    const int32_t out_pairs[] = {5, 0, 20, 9, 7, 4};
    snapshot hs = take(host);
    CHECK_OK(kva_cache_swap_blocks(gpu, dc, host, out_pairs, 3));
    CUDA_OK(cudaDeviceSynchronize());
    expect_copy(&hs, &want, &d, out_pairs, 3);
    CHECK(same(host, &hs));
    const int32_t in_pairs[] = {1, 11, 4, 12};
    fill_cache(host, &rng);
    snapshot hs2 = take(host);
    CHECK_OK(kva_cache_swap_blocks(gpu, host, dc, in_pairs, 2));
    expect_copy(&want, &hs2, &d, in_pairs, 2);
    got = take_dev(dc);
    CHECK(same_snap(&got, &want));
    /* A CPU context cannot copy a device cache; nothing changes. */
    CHECK_STATUS(kva_cache_swap_blocks(ref, dc, host, out_pairs, 3), KVA_STATUS_INVALID_ARGUMENT);
    CHECK_ERROR_MENTIONS("device");
    CHECK(same(host, &hs2));
    /* Bad ids are rejected before anything is copied. */
    const int32_t bad_pairs[] = {1, 2, 3, 99};
    CHECK_STATUS(kva_cache_copy_blocks(gpu, dc, bad_pairs, 2), KVA_STATUS_OUT_OF_RANGE);
    snapshot after = take_dev(dc);
    CHECK(same_snap(&after, &got));
    drop(&after);
    drop(&got);
    drop(&want);
    drop(&hs);
    drop(&hs2);
    kva_cache_destroy(hc);
    kva_cache_destroy(dc);
    kva_cache_destroy(host);
    kva_context_destroy(ref);
    kva_context_destroy(gpu);
}

/* Writes with a CUDA context into a host cache (and the reverse) are refused. */
static void test_bad_inputs(void)
{
    kva_rng rng = {9};
    kva_context *ref = new_ctx(KVA_BACKEND_REF, 1), *gpu = new_ctx(KVA_BACKEND_CUDA, 0);
    kva_cache_desc d = make_desc(4, 16, 1, 64, 64, KVA_DTYPE_F16, KVA_LAYOUT_NHD);
    kva_cache *hc = NULL, *dc = NULL;
    CHECK_OK(kva_cache_create(ref, &d, &hc));
    CHECK_OK(kva_cache_create(gpu, &d, &dc));
    fill_cache(hc, &rng);
    snapshot s = take(hc);
    uint16_t k[64], v[64];
    kva_test_fill(k, KVA_DTYPE_F16, 64, &rng, 1.0);
    kva_test_fill(v, KVA_DTYPE_F16, 64, &rng, 1.0);
    int64_t slot = 3;
    CHECK_STATUS(kva_cache_write(gpu, hc, 1, k, 0, v, 0, KVA_DTYPE_F16, &slot),
                 KVA_STATUS_INVALID_ARGUMENT);
    CHECK(same(hc, &s));
    CHECK_STATUS(kva_cache_write(ref, dc, 1, k, 0, v, 0, KVA_DTYPE_F16, &slot),
                 KVA_STATUS_INVALID_ARGUMENT);
    CHECK_ERROR_MENTIONS("device");
    drop(&s);
    kva_cache_destroy(hc);
    kva_cache_destroy(dc);
    kva_context_destroy(ref);
    kva_context_destroy(gpu);
}

static void test_merge(void)
{
    static const kva_dtype dts[] = {KVA_DTYPE_F32, KVA_DTYPE_F16, KVA_DTYPE_BF16};
    kva_rng rng = {11};
    kva_context *ref = new_ctx(KVA_BACKEND_REF, 1), *gpu = new_ctx(KVA_BACKEND_CUDA, 0);
    for (int i = 0; i < 6; i++) {
        const kva_dtype dt = dts[i % 3];
        const int32_t T = 37 + i, H = 8, Dv = i < 3 ? 128 : 72, inplace = i >= 3;
        const size_t n = (size_t)T * H * Dv, nl = (size_t)T * H, es = kva_dtype_size(dt);
        void *a = malloc(n * es), *b = malloc(n * es), *o = malloc(n * es), *og = malloc(n * es);
        float *la = malloc(nl * 4), *lb = malloc(nl * 4), *lo = malloc(nl * 4),
              *lg = malloc(nl * 4);
        kva_test_fill(a, dt, n, &rng, 1.0);
        kva_test_fill(b, dt, n, &rng, 1.0);
        for (size_t r = 0; r < nl; r++) {
            la[r] = (float)(kva_rng_normal(&rng) * 3.0);
            lb[r] = (float)(kva_rng_normal(&rng) * 3.0);
            if (r % 7 == 0)
                la[r] = -INFINITY;
            if (r % 11 == 0)
                lb[r] = -INFINITY;
        }
        void *da = dev_from(a, n * es), *db = dev_from(b, n * es);
        float *dla = dev_from(la, nl * 4), *dlb = dev_from(lb, nl * 4);
        void *dout = inplace ? da : dev_poisoned(n * es);
        float *dlo = inplace ? dla : dev_poisoned(nl * 4);
        CHECK_OK(kva_merge_states(ref, T, H, Dv, dt, a, la, b, lb, o, lo));
        CHECK_OK(kva_merge_states(gpu, T, H, Dv, dt, da, dla, db, dlb, dout, dlo));
        to_host(og, dout, n * es);
        to_host(lg, dlo, nl * 4);
        size_t bad =
            kva_test_compare("merge out", og, o, dt, n, kva_test_atol(dt), kva_test_rtol(dt));
        bad += kva_test_compare_f32("merge lse", lg, lo, nl, 1e-5, 1e-5);
        CHECK_MSG(bad == 0, "merge case %d: %zu mismatches", i, bad);
        if (!inplace) {
            cudaFree(dout);
            cudaFree(dlo);
        }
        cudaFree(da);
        cudaFree(db);
        cudaFree(dla);
        cudaFree(dlb);
        free(a);
        free(b);
        free(o);
        free(og);
        free(la);
        free(lb);
        free(lo);
        free(lg);
    }
    kva_context_destroy(ref);
    kva_context_destroy(gpu);
}

#endif /* KVA_HAVE_CUDA */

int main(void)
{
    int skip = cuda_test_skip();
    if (skip)
        return skip;
#ifdef KVA_HAVE_CUDA
    RUN(test_write);
    RUN(test_copy_swap);
    RUN(test_bad_inputs);
    RUN(test_merge);
#endif
    return kva_test_finish();
}
