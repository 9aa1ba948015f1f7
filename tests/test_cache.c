/*
 * test_cache.c - the paged KV cache: create/create_from, descriptor
 * validation, kva_cache_write (reshape_and_cache) in both layouts and every
 * storage/source dtype pair, copy_blocks, swap_blocks, and caches past 2^31
 * elements. Bad inputs are in test_cache_errors.c.
 *
 * Expected cache contents are built here with the test's own index math
 * (strides of the layout written out, not kva__cache_row) into a copy of the
 * cache taken before the call; the whole K and V storage is then compared
 * byte for byte, which checks the written rows and that nothing else moved.
 */
/* mmap's MAP_ANONYMOUS and MAP_NORESERVE are not in strict C11 / POSIX. */
#define _DEFAULT_SOURCE 1

#include "cache_util.h"

#include <sys/mman.h>

/* Applies a write to the snapshot with the test's own index math:
 * src rows at src + t*stride (elements of sdt), heads contiguous. */
static void expect_write(snapshot *s, const kva_cache_desc *d, int32_t t_count, const void *k,
                         int64_t ks, const void *v, int64_t vs, kva_dtype sdt, const int64_t *slots)
{
    for (int32_t t = 0; t < t_count; t++) {
        if (slots[t] < 0)
            continue;
        uint64_t block = (uint64_t)slots[t] / (uint64_t)d->block_size;
        uint64_t off = (uint64_t)slots[t] % (uint64_t)d->block_size;
        for (int32_t h = 0; h < d->num_kv_heads; h++) {
            for (int32_t i = 0; i < d->head_dim; i++) {
                float x = kva__load_f(k, sdt, (size_t)(t * ks + h * d->head_dim + i));
                kva__store_f(s->k, d->dtype, ref_offset(d, block, off, h, d->head_dim) + i, x);
            }
            for (int32_t i = 0; i < d->head_dim_v; i++) {
                float x = kva__load_f(v, sdt, (size_t)(t * vs + h * d->head_dim_v + i));
                kva__store_f(s->v, d->dtype, ref_offset(d, block, off, h, d->head_dim_v) + i, x);
            }
        }
    }
}

/* Writes T random tokens to distinct random slots (a few of them padding),
 * from contiguous rows or from slices of a fused QKV buffer, and compares the
 * whole cache against the expected image. */
static void run_write_case(kva_context *ctx, int32_t nb, int32_t b, int32_t hkv, int32_t d,
                           int32_t dv_arg, kva_dtype cdt, kva_layout layout, kva_dtype sdt,
                           int32_t t_count, int fused, uint64_t seed)
{
    kva_rng r = {seed};
    kva_cache_desc desc = make_desc(nb, b, hkv, d, dv_arg, cdt, layout);
    int32_t dv = dv_arg ? dv_arg : d;
    kva_cache *c = NULL;
    CHECK_OK(kva_cache_create(ctx, &desc, &c));
    if (!c)
        return;
    fill_cache(c, &r);
    snapshot want = take(c);

    /* Distinct slots: a shuffled prefix of 0..NB*B-1; every 7th token is padding. */
    int64_t num_slots = (int64_t)nb * b;
    int64_t *perm = malloc((size_t)num_slots * sizeof *perm);
    for (int64_t i = 0; i < num_slots; i++)
        perm[i] = i;
    for (int64_t i = num_slots - 1; i > 0; i--) {
        int64_t j = (int64_t)(kva_rng_u64(&r) % (uint64_t)(i + 1)), tmp = perm[i];
        perm[i] = perm[j];
        perm[j] = tmp;
    }
    int64_t *slots = malloc((size_t)t_count * sizeof *slots);
    const int64_t pads[3] = {-1, -7, INT64_MIN};
    for (int32_t t = 0; t < t_count; t++)
        slots[t] = t % 7 == 3 ? pads[t % 3] : perm[t];

    /* Source rows: a fused [T, H*D + Hkv*D + Hkv*Dv] buffer with H = 2*Hkv, or
     * separate contiguous k and v. */
    int64_t qw = fused ? 2 * (int64_t)hkv * d : 0;
    int64_t row = qw + (int64_t)hkv * d + (int64_t)hkv * dv;
    size_t es = kva_dtype_size(sdt);
    char *buf = malloc((size_t)(t_count * row) * es);
    kva_test_fill(buf, sdt, (size_t)(t_count * row), &r, 1.0);
    const char *k, *v;
    int64_t ks, vs, ks_arg, vs_arg;
    if (fused) {
        k = buf + qw * es;
        v = buf + (qw + (int64_t)hkv * d) * es;
        ks = vs = ks_arg = vs_arg = row;
    } else {
        k = buf;
        v = buf + (size_t)t_count * hkv * d * es;
        ks = (int64_t)hkv * d;
        vs = (int64_t)hkv * dv;
        ks_arg = (seed & 1) ? ks : 0; /* explicit contiguous stride or 0 */
        vs_arg = (seed & 1) ? vs : 0;
    }
    expect_write(&want, &c->desc, t_count, k, ks, v, vs, sdt, slots);
    CHECK_OK(kva_cache_write(ctx, c, t_count, k, ks_arg, v, vs_arg, sdt, slots));
    CHECK_MSG(same(c, &want),
              "write: layout %d, cache %s, src %s, B %d, Hkv %d, D %d, Dv %d, T %d, fused %d",
              (int)layout, kva_dtype_name(cdt), kva_dtype_name(sdt), b, hkv, d, dv, t_count, fused);
    CHECK(strcmp(kva_last_error(), "") == 0);
    free(buf);
    free(slots);
    free(perm);
    drop(&want);
    kva_cache_destroy(c);
}

static void test_write_all_dtypes_layouts(void)
{
    kva_context *ctx = new_ctx(KVA_BACKEND_REF, 1);
    const kva_dtype dts[3] = {KVA_DTYPE_F32, KVA_DTYPE_F16, KVA_DTYPE_BF16};
    /* {B, Hkv, D, Dv (0 = D)} */
    const int32_t shapes[4][4] = {{1, 2, 8, 16}, {16, 8, 64, 32}, {64, 1, 128, 0}, {128, 2, 16, 8}};
    uint64_t seed = 100;
    for (int l = 0; l < 2; l++)
        for (int cd = 0; cd < 3; cd++)
            for (int sd = 0; sd < 3; sd++)
                for (int s = 0; s < 4; s++, seed++) {
                    const int32_t *sh = shapes[s];
                    int32_t nb = 5, slots = 5 * sh[0];
                    int32_t t_count = slots < 40 ? slots : 40;
                    run_write_case(ctx, nb, sh[0], sh[1], sh[2], sh[3], dts[cd], (kva_layout)l,
                                   dts[sd], t_count, (int)(seed % 3 == 0), seed);
                }
    kva_context_destroy(ctx);
}

/* A large write on the CPU backend with several threads (the parallel path). */
static void test_write_threaded(void)
{
    kva_context *ctx = new_ctx(KVA_BACKEND_CPU, 4);
    run_write_case(ctx, 40, 32, 8, 64, 0, KVA_DTYPE_F32, KVA_LAYOUT_NHD, KVA_DTYPE_F32, 1200, 0, 7);
    run_write_case(ctx, 40, 32, 8, 64, 32, KVA_DTYPE_BF16, KVA_LAYOUT_HND, KVA_DTYPE_F32, 1200, 1,
                   8);
    run_write_case(ctx, 40, 32, 8, 64, 32, KVA_DTYPE_F16, KVA_LAYOUT_HND, KVA_DTYPE_F16, 1200, 0,
                   9);
    kva_context_destroy(ctx);
}

/* A write of a single known value, checked at a hand-computed position. */
static void test_write_known_position(void)
{
    kva_context *ctx = new_ctx(KVA_BACKEND_REF, 1);
    for (int l = 0; l < 2; l++) {
        /* NB 3, B 4, Hkv 2, D 8, f32; token -> slot 6 = block 1, offset 2. */
        kva_cache_desc desc = make_desc(3, 4, 2, 8, 0, KVA_DTYPE_F32, (kva_layout)l);
        kva_cache *c = NULL;
        CHECK_OK(kva_cache_create(ctx, &desc, &c));
        float *kd, *vd;
        kva_cache_data(c, (void **)&kd, (void **)&vd);
        kva_test_poison(kd, KVA_DTYPE_F32, 3 * 4 * 2 * 8);
        kva_test_poison(vd, KVA_DTYPE_F32, 3 * 4 * 2 * 8);
        float k[16], v[16];
        for (int i = 0; i < 16; i++) {
            k[i] = 1.0f + (float)i;
            v[i] = -1.0f - (float)i;
        }
        int64_t slot = 6;
        CHECK_OK(kva_cache_write(ctx, c, 1, k, 0, v, 0, KVA_DTYPE_F32, &slot));
        /* NHD: head h at ((1*4 + 2)*2 + h)*8; HND: ((1*2 + h)*4 + 2)*8. */
        int base0 = l == 0 ? 96 : 80, base1 = l == 0 ? 104 : 112;
        CHECK(kd[base0] == 1.0f && kd[base0 + 7] == 8.0f);
        CHECK(kd[base1] == 9.0f && kd[base1 + 7] == 16.0f);
        CHECK(vd[base1 + 3] == -12.0f);
        int written = 0;
        for (int i = 0; i < 3 * 4 * 2 * 8; i++)
            written += !kva_test_poisoned(kd, KVA_DTYPE_F32, (size_t)i);
        CHECK(written == 16);
        kva_cache_destroy(c);
    }
    kva_context_destroy(ctx);
}

/* Conversions inside the write round exactly like the scalar conversions,
 * also on special values: NaN (quiet, signalling, negative), inf, overflow,
 * ties, subnormals, signed zero, and random bit patterns of every exponent. */
static void test_write_special_values(void)
{
    kva_context *ctx = new_ctx(KVA_BACKEND_CPU, 2);
    enum { HKV = 4, D = 64, T = 64, N = T * HKV * D };
    const uint32_t specials[] = {0x7fc00000u, 0x7f800001u, 0xffc00001u, 0x7f800000u,
                                 0xff800000u, 0x7f7fffffu, 0x477ff000u, 0x477fefffu,
                                 0x3f808000u, 0x3f818000u, 0x33000000u, 0x33000001u,
                                 0x00000001u, 0x80400000u, 0x00000000u, 0x80000000u};
    float *src = malloc(N * sizeof *src);
    kva_rng r = {99};
    for (int i = 0; i < N; i++) {
        uint32_t u = i < 16 ? specials[i] : (uint32_t)kva_rng_u64(&r);
        memcpy(&src[i], &u, sizeof u);
    }
    int64_t slots[T];
    for (int t = 0; t < T; t++)
        slots[t] = T - 1 - t;
    for (int dt = 1; dt <= 2; dt++) {
        for (int l = 0; l < 2; l++) {
            kva_cache_desc desc = make_desc(1, T, HKV, D, 0, (kva_dtype)dt, (kva_layout)l);
            kva_cache *c = NULL;
            CHECK_OK(kva_cache_create(ctx, &desc, &c));
            CHECK_OK(kva_cache_write(ctx, c, T, src, 0, src, 0, KVA_DTYPE_F32, slots));
            const uint16_t *k;
            kva_cache_data(c, (void **)&k, NULL);
            int bad = 0;
            for (int t = 0; t < T; t++)
                for (int h = 0; h < HKV; h++)
                    for (int i = 0; i < D; i++) {
                        float x = src[(t * HKV + h) * D + i];
                        uint16_t want = dt == 1 ? kva_f32_to_f16(x) : kva_f32_to_bf16(x);
                        uint16_t got = k[ref_offset(&desc, 0, (uint64_t)slots[t], h, D) + i];
                        uint32_t bits;
                        memcpy(&bits, &x, sizeof bits);
                        if (got != want && bad++ < 5)
                            fprintf(stderr, "  %s: %08x -> %04x, want %04x\n",
                                    kva_dtype_name((kva_dtype)dt), (unsigned)bits, got, want);
                    }
            CHECK_MSG(bad == 0, "%d special values differ (%s, layout %d)", bad,
                      kva_dtype_name((kva_dtype)dt), l);
            kva_cache_destroy(c);
        }
    }
    free(src);
    kva_context_destroy(ctx);
}

static void test_create_desc_and_data(void)
{
    kva_context *ctx = new_ctx(KVA_BACKEND_CPU, 2);
    kva_cache_desc desc = make_desc(7, 16, 4, 128, 0, KVA_DTYPE_BF16, KVA_LAYOUT_HND);
    kva_cache *c = NULL;
    CHECK_OK(kva_cache_create(ctx, &desc, &c));
    kva_cache_desc got;
    CHECK_OK(kva_cache_get_desc(c, &got));
    CHECK(got.num_blocks == 7 && got.block_size == 16 && got.num_kv_heads == 4);
    CHECK(got.head_dim == 128 && got.head_dim_v == 128 && got.dtype == KVA_DTYPE_BF16);
    CHECK(got.layout == KVA_LAYOUT_HND && got.quant == KVA_QUANT_NONE);
    CHECK(kva_cache_block_bytes_k(c) == 16 * 4 * 128 * 2);
    CHECK(kva_cache_block_bytes_v(c) == 16 * 4 * 128 * 2);
    void *k = NULL, *v = NULL;
    CHECK_OK(kva_cache_data(c, &k, NULL));
    CHECK_OK(kva_cache_data(c, NULL, &v));
    CHECK(k != NULL && v != NULL && k != v);
    CHECK((uintptr_t)k % 64 == 0 && (uintptr_t)v % 64 == 0);
    kva_cache_destroy(c);

    desc = make_desc(2, 8, 1, 64, 16, KVA_DTYPE_F32, KVA_LAYOUT_NHD);
    CHECK_OK(kva_cache_create(ctx, &desc, &c));
    CHECK(kva_cache_block_bytes_k(c) == 8 * 64 * 4);
    CHECK(kva_cache_block_bytes_v(c) == 8 * 16 * 4);
    kva_cache_get_desc(c, &got);
    CHECK(got.head_dim_v == 16);
    kva_cache_destroy(c);
    kva_cache_destroy(NULL);
    CHECK(kva_cache_block_bytes_k(NULL) == 0 && kva_cache_block_bytes_v(NULL) == 0);
    kva_context_destroy(ctx);
}

/* create_from wraps caller memory, writes land there, destroy leaves it. */
static void test_create_from(void)
{
    kva_context *ctx = new_ctx(KVA_BACKEND_REF, 1);
    kva_cache_desc desc = make_desc(4, 16, 2, 32, 16, KVA_DTYPE_F16, KVA_LAYOUT_NHD);
    size_t kn = 4 * 16 * 2 * 32, vn = 4 * 16 * 2 * 16;
    uint16_t *kmem = malloc(kn * 2), *vmem = malloc(vn * 2);
    kva_rng r = {31};
    kva_test_fill(kmem, KVA_DTYPE_F16, kn, &r, 1.0);
    kva_test_fill(vmem, KVA_DTYPE_F16, vn, &r, 1.0);
    kva_cache *c = NULL;
    CHECK_OK(kva_cache_create_from(ctx, &desc, kmem, vmem, &c));
    void *k, *v;
    kva_cache_data(c, &k, &v);
    CHECK(k == kmem && v == vmem);
    snapshot want = take(c);
    float ks[3 * 64], vs[3 * 32];
    kva_test_fill(ks, KVA_DTYPE_F32, 3 * 64, &r, 1.0);
    kva_test_fill(vs, KVA_DTYPE_F32, 3 * 32, &r, 1.0);
    int64_t slots[3] = {63, 0, 17};
    expect_write(&want, &desc, 3, ks, 64, vs, 32, KVA_DTYPE_F32, slots);
    CHECK_OK(kva_cache_write(ctx, c, 3, ks, 0, vs, 0, KVA_DTYPE_F32, slots));
    CHECK(memcmp(kmem, want.k, kn * 2) == 0 && memcmp(vmem, want.v, vn * 2) == 0);
    kva_cache_destroy(c); /* must not free kmem/vmem (ASan would report it) */
    CHECK(memcmp(kmem, want.k, kn * 2) == 0);
    drop(&want);
    free(kmem);
    free(vmem);
    kva_context_destroy(ctx);
}

static void test_copy_blocks(void)
{
    for (int l = 0; l < 2; l++) {
        kva_context *ctx = new_ctx(KVA_BACKEND_CPU, 3);
        kva_rng r = {40 + (uint64_t)l};
        kva_cache_desc desc = make_desc(9, 16, 2, 64, 32, KVA_DTYPE_BF16, (kva_layout)l);
        kva_cache *c = NULL;
        CHECK_OK(kva_cache_create(ctx, &desc, &c));
        fill_cache(c, &r);
        snapshot before = take(c), want = take(c);
        /* Pairs (2, 2) and (0, 0) are no-ops; blocks 7 and 8 stay untouched. */
        const int32_t pairs[5][2] = {{0, 3}, {1, 4}, {2, 2}, {5, 6}, {0, 0}};
        expect_copy(&want, &before, &c->desc, &pairs[0][0], 5);
        CHECK_OK(kva_cache_copy_blocks(ctx, c, &pairs[0][0], 5));
        CHECK(same(c, &want));
        CHECK_OK(kva_cache_copy_blocks(ctx, c, NULL, 0));
        CHECK(same(c, &want));
        drop(&before);
        drop(&want);
        kva_cache_destroy(c);

        /* Many pairs over big blocks: the threaded path. */
        desc = make_desc(64, 64, 8, 64, 0, KVA_DTYPE_F32, (kva_layout)l);
        CHECK_OK(kva_cache_create(ctx, &desc, &c));
        fill_cache(c, &r);
        before = take(c);
        want = take(c);
        int32_t many[32][2];
        for (int i = 0; i < 32; i++) {
            many[i][0] = 2 * i;      /* even blocks are sources */
            many[i][1] = 63 - 2 * i; /* odd blocks are destinations */
        }
        expect_copy(&want, &before, &c->desc, &many[0][0], 32);
        CHECK_OK(kva_cache_copy_blocks(ctx, c, &many[0][0], 32));
        CHECK(same(c, &want));
        drop(&before);
        drop(&want);
        kva_cache_destroy(c);
        kva_context_destroy(ctx);
    }
}

static void test_swap_blocks(void)
{
    kva_context *ctx = new_ctx(KVA_BACKEND_CPU, 2);
    kva_rng r = {50};
    for (int l = 0; l < 2; l++) {
        kva_cache_desc ds = make_desc(6, 16, 2, 32, 16, KVA_DTYPE_F16, (kva_layout)l);
        kva_cache_desc dd = ds;
        dd.num_blocks = 10;
        dd.head_dim_v = 16;
        kva_cache *src = NULL, *dst = NULL;
        CHECK_OK(kva_cache_create(ctx, &ds, &src));
        CHECK_OK(kva_cache_create(ctx, &dd, &dst));
        fill_cache(src, &r);
        fill_cache(dst, &r);
        snapshot src_before = take(src), want = take(dst);
        const int32_t pairs[4][2] = {{5, 9}, {0, 0}, {3, 4}, {5, 1}};
        expect_copy(&want, &src_before, &src->desc, &pairs[0][0], 4);
        CHECK_OK(kva_cache_swap_blocks(ctx, src, dst, &pairs[0][0], 4));
        CHECK(same(dst, &want));
        CHECK(same(src, &src_before));
        /* And back: dst block 9 -> src block 2. */
        const int32_t back[1][2] = {{9, 2}};
        snapshot want_src = take(src);
        expect_copy(&want_src, &want, &dst->desc, &back[0][0], 1);
        CHECK_OK(kva_cache_swap_blocks(ctx, dst, src, &back[0][0], 1));
        CHECK(same(src, &want_src));
        CHECK_OK(kva_cache_swap_blocks(ctx, dst, src, NULL, 0));
        drop(&src_before);
        drop(&want);
        drop(&want_src);
        kva_cache_destroy(src);
        kva_cache_destroy(dst);
    }
    kva_context_destroy(ctx);
}

/* A cache whose byte offsets pass 2^32: K is 70000 blocks of 64 KiB (4.3 GiB),
 * mapped with MAP_NORESERVE so that only the touched pages exist. */
static void test_large_offsets(void)
{
    const int32_t nb = 70000, b = 16, hkv = 8, d = 128, dv = 64;
    const uint64_t kb = (uint64_t)nb * b * hkv * d * 4, vb = (uint64_t)nb * b * hkv * dv * 4;
    kva_context *ctx = new_ctx(KVA_BACKEND_CPU, 2);
    for (int l = 0; l < 2; l++) {
        void *km = mmap(NULL, kb, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        void *vm = mmap(NULL, vb, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (km == MAP_FAILED || vm == MAP_FAILED) {
            /* MAP_NORESERVE needs no memory up front: a refusal is an environment
             * problem worth failing on, not a reason to skip silently. */
            CHECK_MSG(0, "mmap of %llu bytes failed", (unsigned long long)(kb + vb));
            if (km != MAP_FAILED)
                munmap(km, kb);
            if (vm != MAP_FAILED)
                munmap(vm, vb);
            break;
        }
        kva_cache_desc desc = make_desc(nb, b, hkv, d, dv, KVA_DTYPE_F32, (kva_layout)l);
        kva_cache *c = NULL;
        CHECK_OK(kva_cache_create_from(ctx, &desc, km, vm, &c));
        kva_rng r = {60 + (uint64_t)l};
        float k[3 * 8 * 128], v[3 * 8 * 64];
        kva_test_fill(k, KVA_DTYPE_F32, 3 * 8 * 128, &r, 1.0);
        kva_test_fill(v, KVA_DTYPE_F32, 3 * 8 * 64, &r, 1.0);
        /* The last slot, a slot in the block before it, and slot 5. */
        int64_t slots[3] = {(int64_t)nb * b - 1, (int64_t)(nb - 2) * b + 7, 5};
        CHECK_OK(kva_cache_write(ctx, c, 3, k, 0, v, 0, KVA_DTYPE_F32, slots));
        for (int t = 0; t < 3; t++) {
            uint64_t blk = (uint64_t)slots[t] / b, off = (uint64_t)slots[t] % b;
            for (uint64_t h = 0; h < (uint64_t)hkv; h++) {
                /* Byte positions written out per layout. */
                uint64_t kpos = l == 0 ? (((blk * b + off) * hkv + h) * d) * 4
                                       : (((blk * hkv + h) * b + off) * d) * 4;
                uint64_t vpos = l == 0 ? (((blk * b + off) * hkv + h) * dv) * 4
                                       : (((blk * hkv + h) * b + off) * dv) * 4;
                CHECK(memcmp((char *)km + kpos, k + (t * hkv + h) * d, d * 4) == 0);
                CHECK(memcmp((char *)vm + vpos, v + (t * hkv + h) * dv, dv * 4) == 0);
                if (t < 2)
                    CHECK(kpos > ((uint64_t)1 << 32));
            }
        }
        /* The unwritten row of slot NB*B-2, head 0, is still zero (fresh pages). */
        uint64_t zs = (uint64_t)nb * b - 2, zblk = zs / b, zoff = zs % b;
        uint64_t zpos =
            l == 0 ? ((zblk * b + zoff) * hkv) * d * 4 : ((zblk * hkv) * b + zoff) * d * 4;
        const float *zrow = (const float *)((const char *)km + zpos);
        CHECK(zrow[0] == 0.0f && zrow[d - 1] == 0.0f);
        /* Copy the last block onto block 1 and swap it into a small host cache. */
        const int32_t pairs[1][2] = {{nb - 1, 1}};
        CHECK_OK(kva_cache_copy_blocks(ctx, c, &pairs[0][0], 1));
        uint64_t bbk = (uint64_t)b * hkv * d * 4;
        CHECK(memcmp((char *)km + bbk, (char *)km + (uint64_t)(nb - 1) * bbk, bbk) == 0);
        kva_cache_desc small = desc;
        small.num_blocks = 2;
        kva_cache *h = NULL;
        CHECK_OK(kva_cache_create(ctx, &small, &h));
        const int32_t out_pairs[1][2] = {{nb - 2, 0}};
        CHECK_OK(kva_cache_swap_blocks(ctx, c, h, &out_pairs[0][0], 1));
        void *hk;
        kva_cache_data(h, &hk, NULL);
        CHECK(memcmp(hk, (char *)km + (uint64_t)(nb - 2) * bbk, bbk) == 0);
        kva_cache_destroy(h);
        kva_cache_destroy(c);
        munmap(km, kb);
        munmap(vm, vb);
    }
    kva_context_destroy(ctx);
}

int main(void)
{
    RUN(test_create_desc_and_data);
    RUN(test_write_known_position);
    RUN(test_write_all_dtypes_layouts);
    RUN(test_write_threaded);
    RUN(test_write_special_values);
    RUN(test_create_from);
    RUN(test_copy_blocks);
    RUN(test_swap_blocks);
    RUN(test_large_offsets);
    return kva_test_finish();
}
