/*
 * main.c - a consumer of an installed kvattn: one decode step of one request
 * (H 2, Hkv 1, D 8, 5 cached tokens in blocks of 4) on the CPU backend,
 * checked against a direct softmax computed here.
 *
 * Usage: consumer [--no-pool-hashes] [--no-c8-loader]
 * The flags say that the library was built with KVA_WITH_OPENSSL/XXHASH=OFF
 * or KVA_WITH_CJSON=OFF; the program then checks that the calls needing them
 * fail with KVA_STATUS_UNSUPPORTED (and otherwise that they work).
 */
#include <kvattn.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#define CHECK(call)                                                                                \
    do {                                                                                           \
        kva_status st_ = (call);                                                                   \
        if (st_ != KVA_STATUS_OK) {                                                                \
            fprintf(stderr, "%s failed: %s: %s\n", #call, kva_status_name(st_), kva_last_error()); \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

enum { H = 2, HKV = 1, D = 8, B = 4, NB = 4, S = 5 };

static int check_optional(int no_hashes, int no_loader)
{
    kva_pool_desc pd = {16, B, KVA_POOL_HASH_SHA256, 1};
    kva_pool *pool = NULL;
    kva_status st = kva_pool_create(&pd, &pool);
    kva_pool_destroy(pool);
    if (st != (no_hashes ? KVA_STATUS_UNSUPPORTED : KVA_STATUS_OK)) {
        fprintf(stderr, "pool with prefix caching: %s (%s)\n", kva_status_name(st),
                kva_last_error());
        return 1;
    }
    pd.enable_prefix_caching = 0; /* works in every build */
    CHECK(kva_pool_create(&pd, &pool));
    kva_pool_destroy(pool);
    kva_c8_scales *sc = NULL;
    st = kva_c8_scales_load("/nonexistent-kvattn-checkpoint", 0, 1, 64, 0, 1, &sc);
    if (st != (no_loader ? KVA_STATUS_UNSUPPORTED : KVA_STATUS_IO_ERROR)) {
        fprintf(stderr, "kva_c8_scales_load: %s (%s)\n", kva_status_name(st), kva_last_error());
        return 1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    int no_hashes = 0, no_loader = 0;
    for (int i = 1; i < argc; i++) {
        no_hashes |= !strcmp(argv[i], "--no-pool-hashes");
        no_loader |= !strcmp(argv[i], "--no-c8-loader");
    }
    kva_context_desc cd = {KVA_BACKEND_CPU, 1, 0};
    kva_context *ctx = NULL;
    CHECK(kva_context_create(&cd, &ctx));
    kva_cache_desc desc = {NB, B, HKV, D, 0, KVA_DTYPE_F32, KVA_LAYOUT_NHD, KVA_QUANT_NONE};
    kva_cache *cache = NULL;
    CHECK(kva_cache_create(ctx, &desc, &cache));

    float k[S][D], v[S][D], q[H][D], out[H][D];
    for (int t = 0; t < S; t++)
        for (int c = 0; c < D; c++) {
            k[t][c] = sinf(0.3f * (float)(t * D + c));
            v[t][c] = cosf(0.7f * (float)(t * D + c));
        }
    for (int h = 0; h < H; h++)
        for (int c = 0; c < D; c++)
            q[h][c] = 0.25f * (float)(h + 1) * cosf((float)c);
    /* Tokens 0..4 in blocks 2 and 0 (block table {2, 0}). */
    int64_t slots[S] = {8, 9, 10, 11, 0};
    CHECK(kva_cache_write(ctx, cache, S, k, 0, v, 0, KVA_DTYPE_F32, slots));

    int32_t qsl[2] = {0, 1}, seq_lens[1] = {S}, table[2] = {2, 0};
    kva_plan_desc pd;
    memset(&pd, 0, sizeof pd);
    pd.num_requests = 1;
    pd.query_start_loc = qsl;
    pd.seq_lens = seq_lens;
    pd.block_table = table;
    pd.block_table_stride = 2;
    pd.block_size = B;
    pd.num_heads = H;
    pd.num_kv_heads = HKV;
    pd.head_dim = D;
    pd.q_dtype = KVA_DTYPE_F32;
    pd.causal = 1;
    pd.window_left = -1;
    kva_plan *plan = NULL;
    CHECK(kva_plan_create(ctx, &pd, &plan));
    CHECK(kva_attention_run(ctx, plan, q, cache, NULL, out, NULL));

    double worst = 0;
    for (int h = 0; h < H; h++) {
        double sc[S], m = -1e300, sum = 0;
        for (int t = 0; t < S; t++) {
            sc[t] = 0;
            for (int c = 0; c < D; c++)
                sc[t] += (double)q[h][c] * k[t][c];
            sc[t] /= sqrt((double)D);
            m = sc[t] > m ? sc[t] : m;
        }
        for (int t = 0; t < S; t++)
            sum += exp(sc[t] - m);
        for (int c = 0; c < D; c++) {
            double o = 0;
            for (int t = 0; t < S; t++)
                o += exp(sc[t] - m) / sum * v[t][c];
            worst = fmax(worst, fabs(o - out[h][c]));
        }
    }
    kva_plan_destroy(plan);
    kva_cache_destroy(cache);
    kva_context_destroy(ctx);
    if (!(worst < 1e-5)) {
        fprintf(stderr, "consumer: max |out - ref| = %g\n", worst);
        return 1;
    }
    if (check_optional(no_hashes, no_loader))
        return 1;
    printf("consumer: kvattn %s ok (max |out - ref| = %.2g)\n", kva_version(), worst);
    return 0;
}
