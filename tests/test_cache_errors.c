/*
 * test_cache_errors.c - every bad input to the cache API: each gets its status,
 * a message naming the argument or value, and leaves the cache byte-identical
 * (checked against a snapshot of the whole K and V storage).
 */
#include "cache_util.h"

/* The out-of-memory test asks for ~2^54 bytes: AddressSanitizer must return
 * NULL instead of reporting the request as an error. */
#if defined(__SANITIZE_ADDRESS__)
#define KVA_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KVA_TEST_ASAN 1
#endif
#endif
#ifdef KVA_TEST_ASAN
const char *__asan_default_options(void);
const char *__asan_default_options(void)
{
    return "allocator_may_return_null=1";
}
#endif

/* Checks one failing create: status, message, and *out untouched. */
#define CHECK_CREATE_FAILS(ctx, desc, st, word)                                                    \
    do {                                                                                           \
        kva_cache *out_ = (kva_cache *)(uintptr_t)0x1234;                                          \
        CHECK_STATUS(kva_cache_create((ctx), (desc), &out_), (st));                                \
        CHECK_ERROR_MENTIONS(word);                                                                \
        CHECK(out_ == (kva_cache *)(uintptr_t)0x1234);                                             \
    } while (0)

static void test_create_bad_inputs(void)
{
    kva_context *ctx = new_ctx(KVA_BACKEND_REF, 1);
    const kva_cache_desc good = make_desc(4, 16, 2, 64, 0, KVA_DTYPE_F16, KVA_LAYOUT_NHD);
    kva_cache *out = NULL;
    CHECK_STATUS(kva_cache_create(NULL, &good, &out), KVA_STATUS_NULL_POINTER);
    CHECK_ERROR_MENTIONS("ctx");
    CHECK_STATUS(kva_cache_create(ctx, NULL, &out), KVA_STATUS_NULL_POINTER);
    CHECK_ERROR_MENTIONS("desc");
    CHECK_STATUS(kva_cache_create(ctx, &good, NULL), KVA_STATUS_NULL_POINTER);
    CHECK_ERROR_MENTIONS("out");
    CHECK(out == NULL);

    kva_cache_desc d = good;
    d.block_size = 0;
    CHECK_CREATE_FAILS(ctx, &d, KVA_STATUS_INVALID_ARGUMENT, "block_size");
    d = good;
    d.num_blocks = -1;
    CHECK_CREATE_FAILS(ctx, &d, KVA_STATUS_INVALID_ARGUMENT, "num_blocks");
    d.num_blocks = 0;
    CHECK_CREATE_FAILS(ctx, &d, KVA_STATUS_INVALID_ARGUMENT, "num_blocks");
    d = good;
    d.num_kv_heads = -2;
    CHECK_CREATE_FAILS(ctx, &d, KVA_STATUS_INVALID_ARGUMENT, "num_kv_heads");
    d = good;
    d.head_dim = 12;
    CHECK_CREATE_FAILS(ctx, &d, KVA_STATUS_UNSUPPORTED, "head_dim = 12");
    d.head_dim = KVA_MAX_HEAD_DIM + 8;
    CHECK_CREATE_FAILS(ctx, &d, KVA_STATUS_UNSUPPORTED, "head_dim = 584");
    d.head_dim = 0;
    CHECK_CREATE_FAILS(ctx, &d, KVA_STATUS_INVALID_ARGUMENT, "head_dim");
    d = good;
    d.head_dim_v = 12;
    CHECK_CREATE_FAILS(ctx, &d, KVA_STATUS_UNSUPPORTED, "head_dim_v");
    d.head_dim_v = -8;
    CHECK_CREATE_FAILS(ctx, &d, KVA_STATUS_INVALID_ARGUMENT, "head_dim_v");
    d = good;
    d.dtype = KVA_DTYPE_I8;
    CHECK_CREATE_FAILS(ctx, &d, KVA_STATUS_UNSUPPORTED, "dtype");
    d.dtype = KVA_DTYPE_FP8_E4M3;
    CHECK_CREATE_FAILS(ctx, &d, KVA_STATUS_UNSUPPORTED, "dtype");
    d.dtype = (kva_dtype)42;
    CHECK_CREATE_FAILS(ctx, &d, KVA_STATUS_INVALID_ARGUMENT, "dtype");
    d = good;
    d.layout = (kva_layout)7;
    CHECK_CREATE_FAILS(ctx, &d, KVA_STATUS_INVALID_ARGUMENT, "layout");
    d = good;
    d.quant = (kva_quant)99;
    CHECK_CREATE_FAILS(ctx, &d, KVA_STATUS_INVALID_ARGUMENT, "quant");
    d.quant = KVA_QUANT_INT8_CHANNEL; /* needs dtype i8 and scales */
    CHECK_CREATE_FAILS(ctx, &d, KVA_STATUS_DTYPE_MISMATCH, "quant");
    /* Sizes: 2^31 * 2^31 * 4096 * 256 overflows 64 bits (Hkv = 2^31 is
     * refused by KVA_MAX_HEADS first); 2^54 bytes fits the arithmetic but no
     * allocator. */
    d = make_desc(INT32_MAX, INT32_MAX, INT32_MAX, 256, 0, KVA_DTYPE_F32, KVA_LAYOUT_NHD);
    CHECK_CREATE_FAILS(ctx, &d, KVA_STATUS_INVALID_ARGUMENT, "num_kv_heads");
    d = make_desc(INT32_MAX, INT32_MAX, KVA_MAX_HEADS, 256, 0, KVA_DTYPE_F32, KVA_LAYOUT_NHD);
    CHECK_CREATE_FAILS(ctx, &d, KVA_STATUS_INVALID_ARGUMENT, "num_blocks");
    d = make_desc(1 << 30, 1 << 20, 1, 8, 0, KVA_DTYPE_F16, KVA_LAYOUT_NHD);
    CHECK_CREATE_FAILS(ctx, &d, KVA_STATUS_OUT_OF_MEMORY, "bytes");

    /* create_from: NULL storage, misaligned storage, K and V overlapping. */
    float mem[2 * 16 * 2 * 64 + 8];
    kva_cache_desc f = make_desc(1, 16, 2, 64, 0, KVA_DTYPE_F32, KVA_LAYOUT_NHD);
    out = NULL;
    CHECK_STATUS(kva_cache_create_from(ctx, &f, NULL, mem, &out), KVA_STATUS_NULL_POINTER);
    CHECK_ERROR_MENTIONS("k_data");
    CHECK_STATUS(kva_cache_create_from(ctx, &f, mem, NULL, &out), KVA_STATUS_NULL_POINTER);
    CHECK_ERROR_MENTIONS("v_data");
    CHECK_STATUS(kva_cache_create_from(NULL, &f, mem, mem + 2048, &out), KVA_STATUS_NULL_POINTER);
    CHECK_ERROR_MENTIONS("ctx");
    CHECK_STATUS(kva_cache_create_from(ctx, NULL, mem, mem + 2048, &out), KVA_STATUS_NULL_POINTER);
    CHECK_ERROR_MENTIONS("desc");
    CHECK_STATUS(kva_cache_create_from(ctx, &f, mem, mem + 2048, NULL), KVA_STATUS_NULL_POINTER);
    CHECK_ERROR_MENTIONS("out");
    CHECK_STATUS(kva_cache_create_from(ctx, &f, (char *)mem + 2, mem + 2048, &out),
                 KVA_STATUS_INVALID_ARGUMENT);
    CHECK_ERROR_MENTIONS("k_data");
    CHECK_STATUS(kva_cache_create_from(ctx, &f, mem, (char *)(mem + 2048) + 1, &out),
                 KVA_STATUS_INVALID_ARGUMENT);
    CHECK_ERROR_MENTIONS("v_data");
    CHECK_STATUS(kva_cache_create_from(ctx, &f, mem, mem + 2047, &out),
                 KVA_STATUS_INVALID_ARGUMENT);
    CHECK_ERROR_MENTIONS("overlap");
    f.block_size = 0;
    CHECK_STATUS(kva_cache_create_from(ctx, &f, mem, mem + 2048, &out),
                 KVA_STATUS_INVALID_ARGUMENT);
    CHECK_ERROR_MENTIONS("block_size");
    CHECK(out == NULL);

    CHECK_STATUS(kva_cache_get_desc(NULL, &f), KVA_STATUS_NULL_POINTER);
    CHECK_ERROR_MENTIONS("cache");
    kva_cache *c = NULL;
    CHECK_OK(kva_cache_create(ctx, &good, &c));
    CHECK_STATUS(kva_cache_get_desc(c, NULL), KVA_STATUS_NULL_POINTER);
    CHECK_ERROR_MENTIONS("out");
    void *k = NULL;
    CHECK_STATUS(kva_cache_data(NULL, &k, NULL), KVA_STATUS_NULL_POINTER);
    CHECK_ERROR_MENTIONS("cache");
    CHECK(k == NULL);
    kva_cache_destroy(c);
    kva_context_destroy(ctx);
}

/* Checks one failing write: status, message mentions word, cache unchanged. */
#define CHECK_WRITE_FAILS(call, st, word, c, snap)                                                 \
    do {                                                                                           \
        CHECK_STATUS(call, (st));                                                                  \
        CHECK_ERROR_MENTIONS(word);                                                                \
        CHECK(same((c), (snap)));                                                                  \
    } while (0)

static void test_write_bad_inputs(void)
{
    kva_context *ctx = new_ctx(KVA_BACKEND_CPU, 2);
    kva_cache_desc desc = make_desc(4, 16, 2, 32, 16, KVA_DTYPE_F16, KVA_LAYOUT_HND);
    kva_cache *c = NULL;
    CHECK_OK(kva_cache_create(ctx, &desc, &c));
    kva_rng r = {70};
    fill_cache(c, &r);
    snapshot s = take(c);
    enum { T = 8 };
    float k[T * 2 * 32], v[T * 2 * 16];
    kva_test_fill(k, KVA_DTYPE_F32, T * 64, &r, 1.0);
    kva_test_fill(v, KVA_DTYPE_F32, T * 32, &r, 1.0);
    int64_t slots[T] = {0, 1, 2, 3, 4, 5, 6, 7};
    const kva_dtype f32 = KVA_DTYPE_F32;

    CHECK_WRITE_FAILS(kva_cache_write(NULL, c, T, k, 0, v, 0, f32, slots), KVA_STATUS_NULL_POINTER,
                      "ctx", c, &s);
    CHECK_STATUS(kva_cache_write(ctx, NULL, T, k, 0, v, 0, f32, slots), KVA_STATUS_NULL_POINTER);
    CHECK_ERROR_MENTIONS("cache");
    CHECK_WRITE_FAILS(kva_cache_write(ctx, c, T, NULL, 0, v, 0, f32, slots),
                      KVA_STATUS_NULL_POINTER, "'k'", c, &s);
    CHECK_WRITE_FAILS(kva_cache_write(ctx, c, T, k, 0, NULL, 0, f32, slots),
                      KVA_STATUS_NULL_POINTER, "'v'", c, &s);
    CHECK_WRITE_FAILS(kva_cache_write(ctx, c, T, k, 0, v, 0, f32, NULL), KVA_STATUS_NULL_POINTER,
                      "slot_mapping", c, &s);
    CHECK_WRITE_FAILS(kva_cache_write(ctx, c, T, (const char *)k + 2, 0, v, 0, f32, slots),
                      KVA_STATUS_INVALID_ARGUMENT, "not aligned", c, &s);
    CHECK_WRITE_FAILS(kva_cache_write(ctx, c, T, k, 0, v, 0, f32,
                                      (const int64_t *)(const void *)((const char *)slots + 4)),
                      KVA_STATUS_INVALID_ARGUMENT, "slot_mapping", c, &s);
    CHECK_WRITE_FAILS(kva_cache_write(ctx, c, -1, k, 0, v, 0, f32, slots),
                      KVA_STATUS_INVALID_ARGUMENT, "num_tokens = -1", c, &s);
    CHECK_WRITE_FAILS(kva_cache_write(ctx, c, T, k, 0, v, 0, KVA_DTYPE_I8, slots),
                      KVA_STATUS_UNSUPPORTED, "src_dtype", c, &s);
    CHECK_WRITE_FAILS(kva_cache_write(ctx, c, T, k, 0, v, 0, KVA_DTYPE_FP8_E4M3, slots),
                      KVA_STATUS_UNSUPPORTED, "src_dtype", c, &s);
    CHECK_WRITE_FAILS(kva_cache_write(ctx, c, T, k, 0, v, 0, (kva_dtype)-3, slots),
                      KVA_STATUS_INVALID_ARGUMENT, "src_dtype", c, &s);
    /* Strides: smaller than a row (Hkv*D = 64, Hkv*Dv = 32), negative, overflowing. */
    CHECK_WRITE_FAILS(kva_cache_write(ctx, c, T, k, 63, v, 0, f32, slots),
                      KVA_STATUS_INVALID_ARGUMENT, "k_token_stride = 63", c, &s);
    CHECK_WRITE_FAILS(kva_cache_write(ctx, c, T, k, -64, v, 0, f32, slots),
                      KVA_STATUS_INVALID_ARGUMENT, "k_token_stride", c, &s);
    CHECK_WRITE_FAILS(kva_cache_write(ctx, c, T, k, 0, v, 16, f32, slots),
                      KVA_STATUS_INVALID_ARGUMENT, "v_token_stride = 16", c, &s);
    CHECK_WRITE_FAILS(kva_cache_write(ctx, c, T, k, INT64_MAX / 4, v, 0, f32, slots),
                      KVA_STATUS_INVALID_ARGUMENT, "k_token_stride", c, &s);
    /* A slot past the cache (NB*B = 64) at token 5: tokens 0..4 are valid,
     * yet nothing is written. */
    slots[5] = 64;
    CHECK_WRITE_FAILS(kva_cache_write(ctx, c, T, k, 0, v, 0, f32, slots), KVA_STATUS_OUT_OF_RANGE,
                      "slot_mapping[5] = 64", c, &s);
    slots[5] = INT64_MAX;
    CHECK_WRITE_FAILS(kva_cache_write(ctx, c, T, k, 0, v, 0, f32, slots), KVA_STATUS_OUT_OF_RANGE,
                      "slot_mapping[5]", c, &s);
    slots[5] = 5;
    /* A cache in device memory cannot be written by a host context. */
    c->mem = kva__cuda_ops.memory; /* another space: device memory */
    CHECK_WRITE_FAILS(kva_cache_write(ctx, c, T, k, 0, v, 0, f32, slots),
                      KVA_STATUS_INVALID_ARGUMENT, "device memory", c, &s);
    c->mem = &kva__host_memory;
    /* num_tokens == 0: NULL buffers are fine and nothing changes. */
    CHECK_OK(kva_cache_write(ctx, c, 0, NULL, 0, NULL, 0, f32, NULL));
    CHECK(same(c, &s));
    /* All padding: nothing changes either. */
    int64_t pad[T] = {-1, -1, -2, -1, -9, -1, -1, -1};
    CHECK_OK(kva_cache_write(ctx, c, T, k, 0, v, 0, f32, pad));
    CHECK(same(c, &s));
    /* The error message is cleared by the next successful call. */
    CHECK_OK(kva_cache_write(ctx, c, T, k, 0, v, 0, f32, slots));
    CHECK(strcmp(kva_last_error(), "") == 0);
    CHECK(!same(c, &s));
    drop(&s);
    kva_cache_destroy(c);
    kva_context_destroy(ctx);
}

#define CHECK_COPY_FAILS(call, st, word, c, snap)                                                  \
    do {                                                                                           \
        CHECK_STATUS(call, (st));                                                                  \
        CHECK_ERROR_MENTIONS(word);                                                                \
        CHECK(same((c), (snap)));                                                                  \
    } while (0)

/* Bad pairs for copy_blocks on a cache of nb blocks (small: the flag table;
 * large: the pairwise scan). */
static void check_copy_bad_pairs(kva_context *ctx, int32_t nb)
{
    kva_cache_desc desc = make_desc(nb, 2, 1, 8, 0, KVA_DTYPE_F16, KVA_LAYOUT_NHD);
    kva_cache *c = NULL;
    CHECK_OK(kva_cache_create(ctx, &desc, &c));
    kva_rng r = {80 + (uint64_t)nb};
    fill_cache(c, &r);
    snapshot s = take(c);
    const int32_t last = nb - 1;
    int32_t p[4][2] = {{0, 1}, {2, 3}, {4, 5}, {6, last}};

    CHECK_COPY_FAILS(kva_cache_copy_blocks(NULL, c, &p[0][0], 4), KVA_STATUS_NULL_POINTER, "ctx", c,
                     &s);
    CHECK_STATUS(kva_cache_copy_blocks(ctx, NULL, &p[0][0], 4), KVA_STATUS_NULL_POINTER);
    CHECK_ERROR_MENTIONS("cache");
    CHECK_COPY_FAILS(kva_cache_copy_blocks(ctx, c, NULL, 4), KVA_STATUS_NULL_POINTER, "pairs", c,
                     &s);
    CHECK_COPY_FAILS(kva_cache_copy_blocks(ctx, c, &p[0][0], -2), KVA_STATUS_INVALID_ARGUMENT,
                     "num_pairs = -2", c, &s);
    p[3][1] = nb; /* dst past the cache, after three valid pairs */
    CHECK_COPY_FAILS(kva_cache_copy_blocks(ctx, c, &p[0][0], 4), KVA_STATUS_OUT_OF_RANGE,
                     "pairs[3][1]", c, &s);
    p[3][1] = last;
    p[2][0] = -1;
    CHECK_COPY_FAILS(kva_cache_copy_blocks(ctx, c, &p[0][0], 4), KVA_STATUS_OUT_OF_RANGE,
                     "pairs[2][0] = -1", c, &s);
    p[2][0] = 4;
    p[3][1] = 3; /* duplicate dst */
    CHECK_COPY_FAILS(kva_cache_copy_blocks(ctx, c, &p[0][0], 4), KVA_STATUS_INVALID_ARGUMENT,
                     "pairs[3][1] = 3", c, &s);
    p[3][1] = last;
    p[3][0] = 5; /* block 5 is the dst of pair 2 and the src of pair 3: a chain */
    CHECK_COPY_FAILS(kva_cache_copy_blocks(ctx, c, &p[0][0], 4), KVA_STATUS_INVALID_ARGUMENT,
                     "pairs[3][0] = 5", c, &s);
    p[3][0] = 6;
    p[1][1] = 0; /* block 0 is the src of pair 0 and the dst of pair 1 */
    CHECK_COPY_FAILS(kva_cache_copy_blocks(ctx, c, &p[0][0], 4), KVA_STATUS_INVALID_ARGUMENT,
                     "pairs[0][0] = 0", c, &s);
    /* A self pair next to a pair reading the same block is fine. */
    int32_t ok[2][2] = {{3, 3}, {3, last}};
    expect_copy(&s, &s, &c->desc, &ok[0][0], 2);
    CHECK_OK(kva_cache_copy_blocks(ctx, c, &ok[0][0], 2));
    CHECK(same(c, &s));
    drop(&s);
    kva_cache_destroy(c);
}

static void test_copy_bad_inputs(void)
{
    kva_context *ctx = new_ctx(KVA_BACKEND_REF, 1);
    check_copy_bad_pairs(ctx, 10);
    check_copy_bad_pairs(ctx, 20000);
    kva_context_destroy(ctx);
}

static void test_swap_bad_inputs(void)
{
    kva_context *ctx = new_ctx(KVA_BACKEND_REF, 1);
    kva_cache_desc ds = make_desc(4, 16, 2, 32, 0, KVA_DTYPE_BF16, KVA_LAYOUT_NHD);
    kva_cache_desc dd = ds;
    dd.num_blocks = 8;
    kva_cache *src = NULL, *dst = NULL;
    CHECK_OK(kva_cache_create(ctx, &ds, &src));
    CHECK_OK(kva_cache_create(ctx, &dd, &dst));
    kva_rng r = {90};
    fill_cache(src, &r);
    fill_cache(dst, &r);
    snapshot s = take(dst), ss = take(src);
    int32_t p[3][2] = {{0, 7}, {1, 6}, {3, 0}};

    CHECK_COPY_FAILS(kva_cache_swap_blocks(NULL, src, dst, &p[0][0], 3), KVA_STATUS_NULL_POINTER,
                     "ctx", dst, &s);
    CHECK_COPY_FAILS(kva_cache_swap_blocks(ctx, NULL, dst, &p[0][0], 3), KVA_STATUS_NULL_POINTER,
                     "src", dst, &s);
    CHECK_STATUS(kva_cache_swap_blocks(ctx, src, NULL, &p[0][0], 3), KVA_STATUS_NULL_POINTER);
    CHECK_ERROR_MENTIONS("dst");
    CHECK_COPY_FAILS(kva_cache_swap_blocks(ctx, src, dst, NULL, 3), KVA_STATUS_NULL_POINTER,
                     "pairs", dst, &s);
    CHECK_COPY_FAILS(kva_cache_swap_blocks(ctx, src, dst, &p[0][0], -1),
                     KVA_STATUS_INVALID_ARGUMENT, "num_pairs", dst, &s);
    CHECK_COPY_FAILS(kva_cache_swap_blocks(ctx, dst, dst, &p[0][0], 1), KVA_STATUS_INVALID_ARGUMENT,
                     "same cache", dst, &s);
    /* Ids: src ids are checked against the src cache (4 blocks), dst ids
     * against the dst cache (8 blocks). */
    p[1][0] = 5;
    CHECK_COPY_FAILS(kva_cache_swap_blocks(ctx, src, dst, &p[0][0], 3), KVA_STATUS_OUT_OF_RANGE,
                     "pairs[1][0] = 5", dst, &s);
    p[1][0] = 1;
    p[2][1] = 8;
    CHECK_COPY_FAILS(kva_cache_swap_blocks(ctx, src, dst, &p[0][0], 3), KVA_STATUS_OUT_OF_RANGE,
                     "pairs[2][1] = 8", dst, &s);
    p[2][1] = 7;
    CHECK_COPY_FAILS(kva_cache_swap_blocks(ctx, src, dst, &p[0][0], 3), KVA_STATUS_INVALID_ARGUMENT,
                     "pairs[2][1] = 7", dst, &s);
    p[2][1] = 0;
    CHECK(same(src, &ss));

    /* Mismatched shapes: each field in turn. */
    struct {
        const char *field;
        kva_status st;
    } cases[] = {
        {"dtype", KVA_STATUS_DTYPE_MISMATCH},      {"layout", KVA_STATUS_SHAPE_MISMATCH},
        {"block_size", KVA_STATUS_SHAPE_MISMATCH}, {"num_kv_heads", KVA_STATUS_SHAPE_MISMATCH},
        {"head_dim", KVA_STATUS_SHAPE_MISMATCH},   {"head_dim_v", KVA_STATUS_SHAPE_MISMATCH}};
    for (int i = 0; i < 6; i++) {
        kva_cache_desc m = ds;
        m.num_blocks = 8;
        if (i == 0)
            m.dtype = KVA_DTYPE_F16;
        else if (i == 1)
            m.layout = KVA_LAYOUT_HND;
        else if (i == 2)
            m.block_size = 8;
        else if (i == 3)
            m.num_kv_heads = 1;
        else if (i == 4)
            m.head_dim = 64, m.head_dim_v = 32;
        else
            m.head_dim_v = 64;
        kva_cache *o = NULL;
        CHECK_OK(kva_cache_create(ctx, &m, &o));
        fill_cache(o, &r);
        snapshot os = take(o);
        CHECK_COPY_FAILS(kva_cache_swap_blocks(ctx, src, o, &p[0][0], 3), cases[i].st,
                         cases[i].field, o, &os);
        drop(&os);
        kva_cache_destroy(o);
    }

    /* Two caches over the same caller memory overlap. */
    uint16_t *mem = malloc(2 * 4 * 16 * 2 * 32 * 2);
    kva_cache *a = NULL, *b = NULL;
    CHECK_OK(kva_cache_create_from(ctx, &ds, mem, mem + 4096, &a));
    CHECK_OK(kva_cache_create_from(ctx, &ds, mem + 4096, mem, &b));
    int32_t one[1][2] = {{0, 1}};
    CHECK_STATUS(kva_cache_swap_blocks(ctx, a, b, &one[0][0], 1), KVA_STATUS_INVALID_ARGUMENT);
    CHECK_ERROR_MENTIONS("overlap");
    kva_cache_destroy(a);
    kva_cache_destroy(b);
    free(mem);

    /* A device cache cannot be swapped by a host context (only a CUDA one). */
    dst->mem = kva__cuda_ops.memory;
    CHECK_COPY_FAILS(kva_cache_swap_blocks(ctx, src, dst, &p[0][0], 3), KVA_STATUS_INVALID_ARGUMENT,
                     "dst", dst, &s);
    dst->mem = &kva__host_memory;
    CHECK(same(src, &ss));
    drop(&s);
    drop(&ss);
    kva_cache_destroy(src);
    kva_cache_destroy(dst);
    kva_context_destroy(ctx);
}

int main(void)
{
    RUN(test_create_bad_inputs);
    RUN(test_write_bad_inputs);
    RUN(test_copy_bad_inputs);
    RUN(test_swap_bad_inputs);
    return kva_test_finish();
}
