/*
 * test_cache_aliasing.c - kvattn.h's aliasing rule, checked by the cache
 * operations: kva_cache_write's k / v rows and slot_mapping against the
 * cache's storage (K, V, per-token key scales), kva_cache_read's k / v
 * destinations against each other, slot_mapping and the storage, and the
 * block pairs of kva_cache_copy_blocks / kva_cache_swap_blocks against the
 * destination cache's storage. A refused call gets KVA_STATUS_INVALID_ARGUMENT
 * with a message naming both buffers, and every byte it could have written
 * is as before; buffers that only touch run, and give the bytes of a call on
 * separate buffers. Reference and CPU backends.
 *
 * The caches of most cases wrap one arena (kva_cache_create_from) that also
 * holds the user buffers, so the overlaps are real and one checksum covers
 * every byte. The first case checks the span comparison itself against a
 * byte-by-byte one.
 */
#include "blackbox_util.h"

/* A refused call: INVALID_ARGUMENT, a message naming a and b. */
#define REFUSED(expr, a, b)                                                                        \
    do {                                                                                           \
        CHECK_STATUS(expr, KVA_STATUS_INVALID_ARGUMENT);                                           \
        CHECK_ERROR_MENTIONS("overlaps");                                                          \
        CHECK_ERROR_MENTIONS(a);                                                                   \
        CHECK_ERROR_MENTIONS(b);                                                                   \
    } while (0)

/* The MHA cache of the cases: NB 4, B 4, Hkv 2, D = Dv = 8, f32, NHD. A
 * token's K or V row is ROW floats; the storage is KS floats per half. */
enum { NB = 4, BS = 4, HKV = 2, DH = 8, ROW = HKV * DH, KS = NB * BS * ROW, T = 5 };

/* The arena of a case: [k rows | K | V | v rows | slots | spare], floats. */
enum {
    O_K = 0,
    O_CK = O_K + T * ROW,
    O_CV = O_CK + KS,
    O_V = O_CV + KS,
    O_S = O_V + T * ROW,
    O_END = O_S + 2 * T + T * ROW
};

static const int64_t kSlots[T] = {3, 9, -1, 14, 0};

/* Whether the bytes [p, p + n) of two strided row sets share a byte, one
 * byte at a time. */
static int brute_overlap(const kva__span *a, const kva__span *b)
{
    for (int64_t t = 0; t < (a->rows > 1 ? a->rows : 1); t++)
        for (size_t i = 0; i < a->bytes; i++) {
            const char *x = (const char *)a->p + t * a->stride + (int64_t)i;
            for (int64_t u = 0; u < (b->rows > 1 ? b->rows : 1); u++) {
                const char *y = (const char *)b->p + u * b->stride;
                if (x >= y && x < y + b->bytes)
                    return 1;
            }
        }
    return 0;
}

/* kva__spans_overlap is exact for equal strides or a single row, and never
 * says "disjoint" for spans that share a byte. */
static void test_span_overlap_exact(void)
{
    static char buf[512];
    long exact = 0, wrong = 0;
    for (int ra = 1; ra <= 4; ra++)
        for (int rb = 1; rb <= 4; rb++)
            for (int sa = 4; sa <= 9; sa++)
                for (int sb = 4; sb <= 9; sb++)
                    for (int la = 1; la <= sa; la++)
                        for (int lb = 1; lb <= sb; lb += 2)
                            for (int d = -40; d <= 40; d++) {
                                const kva__span a = {"a", buf + 200, (size_t)la, ra, sa};
                                const kva__span b = {"b", buf + 200 + d, (size_t)lb, rb, sb};
                                const int got = kva__spans_overlap(&a, &b);
                                const int want = brute_overlap(&a, &b);
                                const int must_exact = sa == sb || ra == 1 || rb == 1;
                                if (got != want && (must_exact || !got)) {
                                    if (wrong++ < 5)
                                        CHECK_MSG(
                                            0,
                                            "ra %d rb %d sa %d sb %d la %d lb %d d %d: %d, want %d",
                                            ra, rb, sa, sb, la, lb, d, got, want);
                                }
                                exact += must_exact;
                            }
    CHECK(wrong == 0);
    CHECK(exact > 10000); /* the grid did run */
    /* Empty and absent spans never overlap. */
    const kva__span e = {"e", buf, 0, 1, 0}, n = {"n", NULL, 8, 1, 0}, f = {"f", buf, 8, 1, 0};
    CHECK(!kva__spans_overlap(&e, &f) && !kva__spans_overlap(&n, &f) && kva__spans_overlap(&f, &f));
}

/* An f32 NHD cache over the arena's K / V, filled at random. */
static kva_cache *arena_cache(kva_context *ctx, float *arena, kva_rng *r)
{
    kva_cache_desc cd = make_desc(NB, BS, HKV, DH, DH, KVA_DTYPE_F32, KVA_LAYOUT_NHD);
    kva_cache *c = NULL;
    CHECK_OK(kva_cache_create_from(ctx, &cd, arena + O_CK, arena + O_CV, &c));
    kva_test_fill(arena, KVA_DTYPE_F32, O_END, r, 1.0);
    memcpy(arena + O_S, kSlots, sizeof kSlots);
    return c;
}

static void write_case(kva_backend bk)
{
    kva_rng r = {11 + (uint64_t)bk};
    kva_context *ctx = new_ctx(bk, 2);
    float *a = malloc(O_END * sizeof(float));
    kva_cache *c = arena_cache(ctx, a, &r);
    const int64_t *slots = (const int64_t *)(a + O_S);
    const uint64_t sum = bb_sum(a, O_END * sizeof(float));
    /* k / v rows or slot_mapping inside the storage. */
    REFUSED(kva_cache_write(ctx, c, T, a + O_CK, 0, a + O_V, 0, KVA_DTYPE_F32, slots), "cache K",
            "input k");
    REFUSED(kva_cache_write(ctx, c, T, a + O_K, 0, a + O_CV + 100, 0, KVA_DTYPE_F32, slots),
            "cache V", "input v");
    REFUSED(kva_cache_write(ctx, c, T, a + O_K, 0, a + O_V, 0, KVA_DTYPE_F32,
                            (const int64_t *)(a + O_CK + 128)),
            "cache K", "slot_mapping");
    /* One element in: k's last row ends on K's first element, v's first
     * row starts on V's last. */
    REFUSED(kva_cache_write(ctx, c, T, a + O_K + 1, 0, a + O_V, 0, KVA_DTYPE_F32, slots), "cache K",
            "input k");
    REFUSED(kva_cache_write(ctx, c, T, a + O_K, 0, a + O_V - 1, 0, KVA_DTYPE_F32, slots), "cache V",
            "input v");
    /* Strided k whose last row reaches into K. */
    REFUSED(kva_cache_write(ctx, c, 3, a + O_K, 2 * ROW + 1, a + O_V, 0, KVA_DTYPE_F32, slots),
            "cache K", "input k");
    CHECK_MSG(bb_sum(a, O_END * sizeof(float)) == sum, "a refused write changed the arena");

    /* Touching on both sides: runs, and writes what separate buffers do. */
    kva_cache_desc cd;
    CHECK_OK(kva_cache_get_desc(c, &cd));
    kva_cache *ref = NULL;
    CHECK_OK(kva_cache_create(ctx, &cd, &ref));
    void *rk, *rv;
    CHECK_OK(kva_cache_data(ref, &rk, &rv));
    memcpy(rk, a + O_CK, KS * sizeof(float));
    memcpy(rv, a + O_CV, KS * sizeof(float));
    float *k = malloc(T * ROW * sizeof(float)), *v = malloc(T * ROW * sizeof(float));
    memcpy(k, a + O_K, T * ROW * sizeof(float));
    memcpy(v, a + O_V, T * ROW * sizeof(float));
    CHECK_OK(kva_cache_write(ctx, ref, T, k, 0, v, 0, KVA_DTYPE_F32, kSlots));
    CHECK_OK(kva_cache_write(ctx, c, T, a + O_K, 0, a + O_V, 0, KVA_DTYPE_F32, slots));
    CHECK(memcmp(rk, a + O_CK, KS * sizeof(float)) == 0);
    CHECK(memcmp(rv, a + O_CV, KS * sizeof(float)) == 0);
    CHECK(memcmp(k, a + O_K, T * ROW * sizeof(float)) == 0); /* inputs as they were */
    /* Token 0 went to slot 3 (block 0, offset 3). */
    CHECK(memcmp(a + O_CK + 3 * ROW, a + O_K, ROW * sizeof(float)) == 0);
    free(k);
    free(v);
    kva_cache_destroy(ref);
    kva_cache_destroy(c);

    /* MLA: c_kv (k) and k_pe (v) against the latent rows (K storage only). */
    enum { DC = 16, DR = 8, MLS = NB * BS * (DC + DR) };
    float *m = malloc((MLS + T * (DC + DR)) * sizeof(float));
    kva_test_fill(m, KVA_DTYPE_F32, MLS + T * (DC + DR), &r, 1.0);
    kva_cache_desc md = {
        NB, BS, 1, DC + DR, DC, KVA_DTYPE_F32, KVA_LAYOUT_NHD, KVA_QUANT_NONE, KVA_ATTN_MLA};
    CHECK_OK(kva_cache_create_from(ctx, &md, m, NULL, &c));
    const uint64_t msum = bb_sum(m, (MLS + T * (DC + DR)) * sizeof(float));
    REFUSED(kva_cache_write(ctx, c, T, m + 40, 0, m + MLS, 0, KVA_DTYPE_F32, kSlots), "cache K",
            "input k");
    REFUSED(kva_cache_write(ctx, c, T, m + MLS, 0, m + MLS - DR, 0, KVA_DTYPE_F32, kSlots),
            "cache K", "input v");
    CHECK(bb_sum(m, (MLS + T * (DC + DR)) * sizeof(float)) == msum);
    CHECK_OK(kva_cache_write(ctx, c, T, m + MLS, 0, m + MLS + T * DC, 0, KVA_DTYPE_F32, kSlots));
    kva_cache_destroy(c);
    free(m);

    /* Index-key cache (library storage): a key row inside it. */
    kva_cache_desc xd = {
        NB, BS, 1, 16, 0, KVA_DTYPE_F32, KVA_LAYOUT_NHD, KVA_QUANT_NONE, KVA_ATTN_INDEX};
    CHECK_OK(kva_cache_create(ctx, &xd, &c));
    void *xk, *xv;
    CHECK_OK(kva_cache_data(c, &xk, &xv));
    kva_test_fill(xk, KVA_DTYPE_F32, NB * BS * 16, &r, 1.0);
    const uint64_t xsum = bb_sum(xk, (size_t)NB * BS * 16 * sizeof(float));
    REFUSED(kva_cache_write(ctx, c, T, (float *)xk + 16, 0, NULL, 0, KVA_DTYPE_F32, kSlots),
            "cache K", "input k");
    CHECK(bb_sum(xk, (size_t)NB * BS * 16 * sizeof(float)) == xsum);
    kva_cache_destroy(c);

    /* INT8_TOKEN_K_V16: k over the per-token key scales. */
    kva_cache_desc qd = make_desc(NB, BS, HKV, DH, DH, KVA_DTYPE_F16, KVA_LAYOUT_NHD);
    qd.quant = KVA_QUANT_INT8_TOKEN_K_V16;
    CHECK_OK(kva_cache_create(ctx, &qd, &c));
    float *ts = NULL;
    CHECK_OK(kva_cache_token_scales(c, &ts));
    CHECK(ts != NULL);
    if (ts) {
        for (int i = 0; i < NB * HKV * BS; i++)
            ts[i] = 0.5f + (float)i;
        const uint64_t tsum = bb_sum(ts, NB * HKV * BS * sizeof(float));
        float vrow[ROW] = {0};
        REFUSED(kva_cache_write(ctx, c, 1, ts + 8, 0, vrow, 0, KVA_DTYPE_F32, kSlots),
                "cache key scales", "input k");
        CHECK(bb_sum(ts, NB * HKV * BS * sizeof(float)) == tsum);
    }
    kva_cache_destroy(c);
    free(a);
    kva_context_destroy(ctx);
}

static void read_case(kva_backend bk)
{
    kva_rng r = {23 + (uint64_t)bk};
    kva_context *ctx = new_ctx(bk, 2);
    float *a = malloc(O_END * sizeof(float));
    kva_cache *c = arena_cache(ctx, a, &r);
    const int64_t *slots = (const int64_t *)(a + O_S);
    const uint64_t sum = bb_sum(a, O_END * sizeof(float));
    /* Destinations inside the storage, over slot_mapping, over each other. */
    REFUSED(kva_cache_read(ctx, c, T, slots, a + O_CK + 8, 0, a + O_V, 0, KVA_DTYPE_F32),
            "output k", "cache K");
    REFUSED(kva_cache_read(ctx, c, T, slots, a + O_K, 0, a + O_CV - 1, 0, KVA_DTYPE_F32),
            "output v", "cache K"); /* v's first element is K's last */
    REFUSED(kva_cache_read(ctx, c, 2, slots, a + O_K, 0, a + O_S - ROW, 0, KVA_DTYPE_F32),
            "output v", "slot_mapping");
    REFUSED(kva_cache_read(ctx, c, 2, slots, a + O_K, 0, a + O_K + ROW / 2, 0, KVA_DTYPE_F32),
            "output v", "output k");
    /* k and v interleaved in one [T, 2 * ROW] buffer, v one element early. */
    REFUSED(kva_cache_read(ctx, c, 2, slots, a + O_V, 2 * ROW, a + O_V + ROW - 1, 2 * ROW,
                           KVA_DTYPE_F32),
            "output v", "output k");
    CHECK_MSG(bb_sum(a, O_END * sizeof(float)) == sum, "a refused read changed the arena");

    /* Separate destinations: the expected rows. */
    float *k = malloc(T * ROW * sizeof(float)), *v = malloc(T * ROW * sizeof(float));
    kva_test_poison(k, KVA_DTYPE_F32, T * ROW);
    kva_test_poison(v, KVA_DTYPE_F32, T * ROW);
    CHECK_OK(kva_cache_read(ctx, c, T, kSlots, k, 0, v, 0, KVA_DTYPE_F32));
    /* k and v interleaved in one [T, 2 * ROW] buffer (a fused K|V layout):
     * the rows do not touch, the call runs. Slot 2 is padding: its rows keep
     * their poison in both. */
    float *fused = malloc(T * 2 * ROW * sizeof(float));
    kva_test_poison(fused, KVA_DTYPE_F32, T * 2 * ROW);
    CHECK_OK(
        kva_cache_read(ctx, c, T, kSlots, fused, 2 * ROW, fused + ROW, 2 * ROW, KVA_DTYPE_F32));
    int same_rows = 1;
    for (int t = 0; t < T; t++)
        same_rows &= memcmp(fused + t * 2 * ROW, k + t * ROW, ROW * sizeof(float)) == 0 &&
                     memcmp(fused + t * 2 * ROW + ROW, v + t * ROW, ROW * sizeof(float)) == 0;
    CHECK_MSG(same_rows, "the interleaved read differs from separate buffers");
    /* Touching: k right after V's storage (over the arena's v rows), v
     * right after slot_mapping; the padding token's rows keep their bytes. */
    float *tk = a + O_V, *tv = a + O_S + 2 * T;
    memcpy(k + 2 * ROW, tk + 2 * ROW, ROW * sizeof(float));
    memcpy(v + 2 * ROW, tv + 2 * ROW, ROW * sizeof(float));
    CHECK_OK(kva_cache_read(ctx, c, T, slots, tk, 0, tv, 0, KVA_DTYPE_F32));
    CHECK(memcmp(tk, k, T * ROW * sizeof(float)) == 0);
    CHECK(memcmp(tv, v, T * ROW * sizeof(float)) == 0);
    free(fused);

    /* Index-key cache: the destination inside the storage. */
    kva_cache *x = NULL;
    kva_cache_desc xd = {
        NB, BS, 1, 16, 0, KVA_DTYPE_F32, KVA_LAYOUT_NHD, KVA_QUANT_NONE, KVA_ATTN_INDEX};
    CHECK_OK(kva_cache_create(ctx, &xd, &x));
    void *xk, *xv;
    CHECK_OK(kva_cache_data(x, &xk, &xv));
    kva_test_fill(xk, KVA_DTYPE_F32, NB * BS * 16, &r, 1.0);
    const uint64_t xsum = bb_sum(xk, (size_t)NB * BS * 16 * sizeof(float));
    REFUSED(kva_cache_read(ctx, x, T, kSlots, (float *)xk + 32, 0, NULL, 0, KVA_DTYPE_F32),
            "output k", "cache K");
    CHECK(bb_sum(xk, (size_t)NB * BS * 16 * sizeof(float)) == xsum);
    kva_cache_destroy(x);
    free(k);
    free(v);
    kva_cache_destroy(c);
    free(a);
    kva_context_destroy(ctx);
}

static void copy_swap_case(kva_backend bk)
{
    kva_rng r = {37 + (uint64_t)bk};
    kva_context *ctx = new_ctx(bk, 2);
    float *a = malloc(O_END * sizeof(float));
    kva_cache *c = arena_cache(ctx, a, &r);
    /* copy_blocks: the pairs array inside K's storage (block 3) or V's. */
    int32_t *in_k = (int32_t *)(a + O_CK + 3 * BS * ROW), *in_v = (int32_t *)(a + O_CV + 5);
    in_k[0] = in_v[0] = 0;
    in_k[1] = in_v[1] = 1;
    const uint64_t sum = bb_sum(a, O_END * sizeof(float));
    REFUSED(kva_cache_copy_blocks(ctx, c, in_k, 1), "cache K", "pairs");
    REFUSED(kva_cache_copy_blocks(ctx, c, in_v, 1), "cache V", "pairs");
    CHECK_MSG(bb_sum(a, O_END * sizeof(float)) == sum, "a refused copy changed the arena");
    /* Touching: the pairs right after V's storage. */
    int32_t *after = (int32_t *)(a + O_V);
    after[0] = 0;
    after[1] = 1;
    CHECK_OK(kva_cache_copy_blocks(ctx, c, after, 1));
    CHECK(memcmp(a + O_CK, a + O_CK + BS * ROW, BS * ROW * sizeof(float)) == 0);
    CHECK(memcmp(a + O_CV, a + O_CV + BS * ROW, BS * ROW * sizeof(float)) == 0);
    kva_cache_destroy(c);

    /* swap_blocks between two caches back to back in one arena: src K, V,
     * dst K, V, then spare room. */
    kva_cache_desc cd = make_desc(NB, BS, HKV, DH, DH, KVA_DTYPE_F32, KVA_LAYOUT_NHD);
    const size_t n = 4 * KS + 8;
    float *s = malloc(n * sizeof(float));
    kva_test_fill(s, KVA_DTYPE_F32, n, &r, 1.0);
    kva_cache *src = NULL, *dst = NULL, *bad = NULL;
    CHECK_OK(kva_cache_create_from(ctx, &cd, s, s + KS, &src));
    CHECK_OK(kva_cache_create_from(ctx, &cd, s + 2 * KS, s + 3 * KS, &dst));
    int32_t *p_dst = (int32_t *)(s + 3 * KS + 6), *p_src = (int32_t *)(s + KS + 6);
    p_dst[0] = p_src[0] = 2;
    p_dst[1] = p_src[1] = 3;
    const uint64_t ssum = bb_sum(s, n * sizeof(float));
    REFUSED(kva_cache_swap_blocks(ctx, src, dst, p_dst, 1), "dst cache V", "pairs");
    /* dst's K one element into src's V. */
    CHECK_OK(kva_cache_create_from(ctx, &cd, s + 2 * KS - 1, s + 3 * KS, &bad));
    REFUSED(kva_cache_swap_blocks(ctx, src, bad, p_src, 1), "dst cache K", "src cache V");
    CHECK_MSG(bb_sum(s, n * sizeof(float)) == ssum, "a refused swap changed the arena");
    /* Pairs inside src's storage (only read) and touching caches: runs. */
    CHECK_OK(kva_cache_swap_blocks(ctx, src, dst, p_src, 1));
    CHECK(memcmp(s + 2 * KS + 3 * BS * ROW, s + 2 * BS * ROW, BS * ROW * sizeof(float)) == 0);
    kva_cache_destroy(bad);
    kva_cache_destroy(dst);
    kva_cache_destroy(src);
    free(s);
    free(a);
    kva_context_destroy(ctx);
}

static void test_cache_write_aliasing(void)
{
    for (int b = 0; b < 2; b++)
        write_case(kBk[b]);
}

static void test_cache_read_aliasing(void)
{
    for (int b = 0; b < 2; b++)
        read_case(kBk[b]);
}

static void test_cache_copy_swap_aliasing(void)
{
    for (int b = 0; b < 2; b++)
        copy_swap_case(kBk[b]);
}

int main(void)
{
    RUN(test_span_overlap_exact);
    RUN(test_cache_write_aliasing);
    RUN(test_cache_read_aliasing);
    RUN(test_cache_copy_swap_aliasing);
    return kva_test_finish();
}
