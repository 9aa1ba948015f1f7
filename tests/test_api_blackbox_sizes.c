/*
 * test_api_blackbox_sizes.c - black-box audit, round four (session 38, task
 * api38): sizes and offsets at the edges of kvattn.h's ranges, and the mask
 * and score rules at the edges of their values. Public API only; every
 * output is poisoned before its run and checked against kvattn.h's formula
 * computed here in double from the rows the cache holds (kva_cache_read).
 *
 *   - a cache of 2^32 K elements (caller storage, reserved but only touched
 *     where written) in both layouts: writes, reads, block copies and swaps
 *     at block ids whose element and byte offsets pass 2^31 and 2^32, and
 *     runs over them equal to the same rows at small block ids;
 *   - seq_len = KVA_MAX_SEQ_LEN with windows and local chunks (block tables
 *     of 2^20 entries per row), paged and ragged, the ragged keys of the
 *     last request past row 2^31;
 *   - soft-cap, ALiBi and sinks together, the default scale, keys of -inf
 *     (kvattn.h: a score of -inf carries no weight), rows without keys.
 */
#define _DEFAULT_SOURCE /* mmap flags, madvise */
#include "blackbox_oracle.h"

#include <sys/mman.h>

/* Reserves bytes of zero pages that cost memory only where touched. */
static void *sz_map(size_t bytes)
{
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

/* ---- a cache of 2^32 elements ---- */

enum { BIG_B = 16, BIG_HKV = 4, BIG_D = 128, BIG_DV = 64, BIG_NBLK = 6, BIG_T = BIG_NBLK * BIG_B };
#define BIG_NB (1 << 19) /* 2^19 * 16 * 4 * 128 = 2^32 K elements (8 GiB of f16) */

/* Runs a three-request plan (decode, prefill, short prefill) over the blocks
 * ids[0..5] of cache c on backend ctx: out [T, H, Dv] f16, lse [T, H]. */
static kva_status big_run(kva_context *ctx, const kva_cache *c, const int32_t *ids, const void *q,
                          uint16_t *out, float *lse, kva_plan_desc *pd_out, int32_t *bt)
{
    static const int32_t perm[3][BIG_NBLK] = {
        {5, 0, 3, 1, 4, 2}, {2, 4, 1, 0, 5, 3}, {3, 5, 0, 2, 1, 4}};
    static const int32_t qsl[4] = {0, 1, 6, 8}, sl[3] = {90, 37, 16};
    for (int r = 0; r < 3; r++)
        for (int j = 0; j < BIG_NBLK; j++)
            bt[r * BIG_NBLK + j] = ids[perm[r][j]];
    kva_plan_desc pd = {.num_requests = 3,
                        .query_start_loc = qsl,
                        .seq_lens = sl,
                        .block_table = bt,
                        .block_table_stride = BIG_NBLK,
                        .block_size = BIG_B,
                        .num_heads = 2 * BIG_HKV,
                        .num_kv_heads = BIG_HKV,
                        .head_dim = BIG_D,
                        .head_dim_v = BIG_DV,
                        .q_dtype = KVA_DTYPE_F16,
                        .causal = 1,
                        .window_left = -1};
    *pd_out = pd;
    kva_plan *plan = NULL;
    kva_status st = kva_plan_create(ctx, &pd, &plan);
    if (st != KVA_STATUS_OK)
        return st;
    kva_test_poison(out, KVA_DTYPE_F16, (size_t)8 * 2 * BIG_HKV * BIG_DV);
    kva_test_poison(lse, KVA_DTYPE_F32, (size_t)8 * 2 * BIG_HKV);
    st = kva_attention_run(ctx, plan, q, c, NULL, out, lse);
    kva_plan_destroy(plan);
    return st;
}

/* kvattn.h: k_data holds NB*B*Hkv*D elements in the desc's layout; writes,
 * reads, copies, swaps and runs address any block id below NB. Block ids
 * near 2^19 put K rows past element 2^31 and byte 2^32. */
static void test_big_cache_offsets(void)
{
    const size_t kel = (size_t)BIG_NB * BIG_B * BIG_HKV * BIG_D;
    const size_t vel = (size_t)BIG_NB * BIG_B * BIG_HKV * BIG_DV;
    uint16_t *kbig = sz_map(kel * 2), *vbig = sz_map(vel * 2);
    if (!kbig || !vbig) {
        fprintf(stderr, "  (skipped: cannot reserve %zu GiB of address space)\n",
                (kel + vel) * 2 >> 30);
        return;
    }
    const int32_t big_ids[BIG_NBLK] = {BIG_NB - 1, BIG_NB - 2, (3 << 17) + 1,
                                       1 << 18,    5,          (1 << 18) - 1};
    const int32_t small_ids[BIG_NBLK] = {0, 1, 2, 3, 4, 5};
    kva_rng rng = {3801};
    uint16_t *k = malloc((size_t)BIG_T * BIG_HKV * BIG_D * 2);
    uint16_t *v = malloc((size_t)BIG_T * BIG_HKV * BIG_DV * 2);
    uint16_t *kr = malloc((size_t)BIG_T * BIG_HKV * BIG_D * 2);
    uint16_t *vr = malloc((size_t)BIG_T * BIG_HKV * BIG_DV * 2);
    uint16_t *q = malloc((size_t)8 * 2 * BIG_HKV * BIG_D * 2);
    kva_test_fill(k, KVA_DTYPE_F16, (size_t)BIG_T * BIG_HKV * BIG_D, &rng, 1.0);
    kva_test_fill(v, KVA_DTYPE_F16, (size_t)BIG_T * BIG_HKV * BIG_DV, &rng, 1.0);
    kva_test_fill(q, KVA_DTYPE_F16, (size_t)8 * 2 * BIG_HKV * BIG_D, &rng, 1.0);
    int64_t sbig[BIG_T], ssmall[BIG_T];
    for (int32_t t = 0; t < BIG_T; t++) {
        sbig[t] = (int64_t)big_ids[t / BIG_B] * BIG_B + t % BIG_B;
        ssmall[t] = t;
    }
    for (int lay = 0; lay < 2; lay++) {
        const kva_layout layout = lay ? KVA_LAYOUT_HND : KVA_LAYOUT_NHD;
        uint16_t out[2][2][8 * 2 * BIG_HKV * BIG_DV];
        float lse[2][2][8 * 2 * BIG_HKV];
        for (int b = 0; b < 2; b++) {
            kva_context *ctx = new_ctx(kBk[b], 2);
            kva_cache_desc bd =
                make_desc(BIG_NB, BIG_B, BIG_HKV, BIG_D, BIG_DV, KVA_DTYPE_F16, layout);
            kva_cache_desc sd =
                make_desc(BIG_NBLK, BIG_B, BIG_HKV, BIG_D, BIG_DV, KVA_DTYPE_F16, layout);
            kva_cache *big = NULL, *small = NULL;
            CHECK_OK(kva_cache_create_from(ctx, &bd, kbig, vbig, &big));
            CHECK_OK(kva_cache_create(ctx, &sd, &small));
            if (!big || !small) {
                kva_cache_destroy(small);
                kva_context_destroy(ctx);
                continue;
            }
            CHECK_OK(kva_cache_write(ctx, big, BIG_T, k, 0, v, 0, KVA_DTYPE_F16, sbig));
            CHECK_OK(kva_cache_write(ctx, small, BIG_T, k, 0, v, 0, KVA_DTYPE_F16, ssmall));
            /* Each row sits where the layout puts it (the test's own 64-bit math). */
            size_t misplaced = 0;
            for (int32_t t = 0; t < BIG_T; t++)
                for (int32_t h = 0; h < BIG_HKV; h++) {
                    const uint64_t ko = ref_offset(&bd, (uint64_t)big_ids[t / BIG_B],
                                                   (uint64_t)(t % BIG_B), (uint64_t)h, BIG_D);
                    const uint64_t vo = ref_offset(&bd, (uint64_t)big_ids[t / BIG_B],
                                                   (uint64_t)(t % BIG_B), (uint64_t)h, BIG_DV);
                    misplaced +=
                        memcmp(kbig + ko, k + ((size_t)t * BIG_HKV + h) * BIG_D, BIG_D * 2) != 0;
                    misplaced +=
                        memcmp(vbig + vo, v + ((size_t)t * BIG_HKV + h) * BIG_DV, BIG_DV * 2) != 0;
                }
            CHECK_MSG(misplaced == 0, "%s %s: %zu rows not where the layout puts them",
                      kva_backend_name(kBk[b]), lay ? "HND" : "NHD", misplaced);
            kva_test_poison(kr, KVA_DTYPE_F16, (size_t)BIG_T * BIG_HKV * BIG_D);
            kva_test_poison(vr, KVA_DTYPE_F16, (size_t)BIG_T * BIG_HKV * BIG_DV);
            CHECK_OK(kva_cache_read(ctx, big, BIG_T, sbig, kr, 0, vr, 0, KVA_DTYPE_F16));
            CHECK(memcmp(kr, k, (size_t)BIG_T * BIG_HKV * BIG_D * 2) == 0);
            CHECK(memcmp(vr, v, (size_t)BIG_T * BIG_HKV * BIG_DV * 2) == 0);
            /* Runs over the high ids equal runs over the same rows at low ids. */
            kva_plan_desc pd;
            int32_t bt[3 * BIG_NBLK];
            CHECK_OK(big_run(ctx, big, big_ids, q, out[b][0], lse[b][0], &pd, bt));
            sz_sem m = {1.0 / sqrt((double)BIG_D), 0.0, 1, -1, 0, NULL, NULL};
            CHECK(sz_check_run(ctx, big, &pd, &m, q, out[b][0], lse[b][0], KVA_DTYPE_F16,
                               "big ids") == 0);
            CHECK_OK(big_run(ctx, small, small_ids, q, out[b][1], lse[b][1], &pd, bt));
            CHECK_MSG(memcmp(out[b][0], out[b][1], sizeof out[b][0]) == 0 &&
                          memcmp(lse[b][0], lse[b][1], sizeof lse[b][0]) == 0,
                      "%s %s: a run over block ids near 2^19 differs from the same rows at ids "
                      "0..5",
                      kva_backend_name(kBk[b]), lay ? "HND" : "NHD");
            /* Copies and swaps between high ids move the right rows. */
            const int32_t cp[2 * 2] = {BIG_NB - 1, BIG_NB - 3, 1 << 18, (3 << 17) + 7};
            CHECK_OK(kva_cache_copy_blocks(ctx, big, cp, 2));
            int64_t s2[2 * BIG_B];
            for (int32_t t = 0; t < BIG_B; t++) {
                s2[t] = (int64_t)(BIG_NB - 3) * BIG_B + t;
                s2[BIG_B + t] = (int64_t)((3 << 17) + 7) * BIG_B + t;
            }
            CHECK_OK(kva_cache_read(ctx, big, 2 * BIG_B, s2, kr, 0, vr, 0, KVA_DTYPE_F16));
            const size_t krow = (size_t)BIG_B * BIG_HKV * BIG_D, vrow = krow / BIG_D * BIG_DV;
            CHECK(memcmp(kr, k, krow * 2) == 0 && memcmp(vr, v, vrow * 2) == 0);
            CHECK(memcmp(kr + krow, k + 3 * krow, krow * 2) == 0 &&
                  memcmp(vr + vrow, v + 3 * vrow, vrow * 2) == 0);
            const int32_t sw[2 * 2] = {BIG_NB - 2, 0, (3 << 17) + 1, 5};
            CHECK_OK(kva_cache_swap_blocks(ctx, big, small, sw, 2));
            const int32_t back[2] = {4, BIG_NB - 5};
            CHECK_OK(kva_cache_swap_blocks(ctx, small, big, back, 1));
            CHECK_OK(kva_cache_read(ctx, small, BIG_B, ssmall, kr, 0, vr, 0, KVA_DTYPE_F16));
            CHECK(memcmp(kr, k + krow, krow * 2) == 0 && memcmp(vr, v + vrow, vrow * 2) == 0);
            CHECK_OK(
                kva_cache_read(ctx, small, BIG_B, ssmall + 5 * BIG_B, kr, 0, vr, 0, KVA_DTYPE_F16));
            CHECK(memcmp(kr, k + 2 * krow, krow * 2) == 0 &&
                  memcmp(vr, v + 2 * vrow, vrow * 2) == 0);
            for (int32_t t = 0; t < BIG_B; t++)
                s2[t] = (int64_t)(BIG_NB - 5) * BIG_B + t;
            CHECK_OK(kva_cache_read(ctx, big, BIG_B, s2, kr, 0, vr, 0, KVA_DTYPE_F16));
            CHECK(memcmp(kr, k + 4 * krow, krow * 2) == 0 &&
                  memcmp(vr, v + 4 * vrow, vrow * 2) == 0);
            kva_cache_destroy(big);
            kva_cache_destroy(small);
            kva_context_destroy(ctx);
        }
        CHECK(kva_test_compare("big cpu vs ref", out[1][0], out[0][0], KVA_DTYPE_F16,
                               sizeof out[0][0] / 2, kva_test_atol(KVA_DTYPE_F16),
                               kva_test_rtol(KVA_DTYPE_F16)) == 0);
        /* Zero the touched pages for the next layout (reads of the untouched
         * ones give zeros). */
        madvise(kbig, kel * 2, MADV_DONTNEED);
        madvise(vbig, vel * 2, MADV_DONTNEED);
    }
    munmap(kbig, kel * 2);
    munmap(vbig, vel * 2);
    free(k);
    free(v);
    free(kr);
    free(vr);
    free(q);
}

/* ---- seq_len = KVA_MAX_SEQ_LEN ---- */

enum { LIM_B = 1024, LIM_NB = 8, LIM_H = 4, LIM_HKV = 2, LIM_D = 16, LIM_DV = 8 };
#define LIM_STRIDE (KVA_MAX_SEQ_LEN / LIM_B)

/* Requests of 2^30 keys (2^20 block-table entries per row, cycling over the
 * cache's 8 blocks) with windows and local chunks that keep the visible keys
 * few: paged runs of the CPU backend against the formula, and ragged runs of
 * the same keys, whose last request's rows start past row 2^31. */
static void test_seq_len_limit(void)
{
    const int32_t S = KVA_MAX_SEQ_LEN;
    /* Request 0 holds context only (its rows come first in the ragged
     * layout), then a decode, then a 3-token chunked prefill. */
    static const int32_t qsl[4] = {0, 0, 1, 4};
    const int32_t sl[3] = {S, S, S - 5};
    int32_t *bt = malloc(sizeof(int32_t) * 3 * (size_t)LIM_STRIDE);
    for (int32_t r = 0; r < 3; r++)
        for (int32_t j = 0; j < LIM_STRIDE; j++)
            bt[(size_t)r * LIM_STRIDE + j] = (j * 5 + r * 3) % LIM_NB;
    const float alibi[LIM_H] = {0.5f, 0.25f, 0.125f, 0.0625f};
    const float sinks[LIM_H] = {0.3f, -1.0f, 2.0f, 0.0f};
    const struct {
        int32_t window, chunk;
        float softcap;
        int alibi_sinks;
    } cases[] = {{300, 0, 0.0f, 0}, {-1, 1000, 0.0f, 0}, {600, 1000, 0.0f, 0},
                 {100, 0, 5.0f, 1}, {0, 0, 0.0f, 1},     {-1, 7, 2.0f, 1}};
    kva_rng rng = {3802};
    float q[4 * LIM_H * LIM_D], out[4 * LIM_H * LIM_DV], lse[4 * LIM_H];
    kva_test_fill(q, KVA_DTYPE_F32, sizeof q / sizeof q[0], &rng, 1.0);
    /* The CPU backend only: the reference visits every key of a request
     * (2^30 per row here) and is checked at these sizes by the formula
     * anyway. */
    for (int b = 1; b < 2; b++) {
        kva_context *ctx = new_ctx(kBk[b], 2);
        kva_cache_desc cd =
            make_desc(LIM_NB, LIM_B, LIM_HKV, LIM_D, LIM_DV, KVA_DTYPE_F32, KVA_LAYOUT_NHD);
        kva_cache *c = NULL;
        CHECK_OK(kva_cache_create(ctx, &cd, &c));
        fill_cache(c, &rng);
        for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
            kva_plan_desc pd = {.num_requests = 3,
                                .query_start_loc = qsl,
                                .seq_lens = sl,
                                .block_table = bt,
                                .block_table_stride = LIM_STRIDE,
                                .block_size = LIM_B,
                                .num_heads = LIM_H,
                                .num_kv_heads = LIM_HKV,
                                .head_dim = LIM_D,
                                .head_dim_v = LIM_DV,
                                .q_dtype = KVA_DTYPE_F32,
                                .causal = 1,
                                .window_left = cases[ci].window,
                                .softcap = cases[ci].softcap,
                                .alibi_slopes = cases[ci].alibi_sinks ? alibi : NULL,
                                .attention_chunk = cases[ci].chunk};
            const float *sk = cases[ci].alibi_sinks ? sinks : NULL;
            sz_sem m = {1.0 / sqrt((double)LIM_D), cases[ci].softcap, 1, cases[ci].window,
                        cases[ci].chunk,           pd.alibi_slopes,   sk};
            char label[96];
            snprintf(label, sizeof label, "%s seq 2^30 window %d chunk %d softcap %g",
                     kva_backend_name(kBk[b]), (int)cases[ci].window, (int)cases[ci].chunk,
                     (double)cases[ci].softcap);
            kva_plan *plan = NULL;
            CHECK_OK(kva_plan_create(ctx, &pd, &plan));
            if (!plan)
                continue;
            kva_test_poison(out, KVA_DTYPE_F32, sizeof out / sizeof out[0]);
            kva_test_poison(lse, KVA_DTYPE_F32, sizeof lse / sizeof lse[0]);
            CHECK_OK(kva_attention_run(ctx, plan, q, c, sk, out, lse));
            CHECK_MSG(sz_check_run(ctx, c, &pd, &m, q, out, lse, KVA_DTYPE_F32, label) == 0, "%s",
                      label);
            kva_plan_destroy(plan);
            if (ci != 0 && ci != 3)
                continue;
            /* The same keys packed per request (kv_start = 0, 2^30, 2^31):
             * only the rows the masks leave visible are touched. */
            kva_plan_desc rd = pd;
            rd.block_table = NULL;
            rd.block_table_stride = 0;
            const int64_t rows = 3 * (int64_t)S;
            float *kr = sz_map((size_t)rows * LIM_HKV * LIM_D * 4);
            float *vr = sz_map((size_t)rows * LIM_HKV * LIM_DV * 4);
            if (!kr || !vr) {
                fprintf(stderr, "  (ragged part skipped: cannot reserve the packed K/V)\n");
                if (kr)
                    munmap(kr, (size_t)rows * LIM_HKV * LIM_D * 4);
                continue;
            }
            int64_t kv0 = 0;
            for (int32_t r = 0; r < 3; r++) {
                const int32_t q_len = qsl[r + 1] - qsl[r];
                const int64_t lo = sl[r] - q_len - (cases[ci].window > 0 ? cases[ci].window : 0);
                for (int64_t j = lo < 0 ? 0 : lo; q_len > 0 && j < sl[r]; j++) {
                    const int64_t slot =
                        (int64_t)bt[(size_t)r * LIM_STRIDE + j / LIM_B] * LIM_B + j % LIM_B;
                    CHECK_OK(kva_cache_read(ctx, c, 1, &slot, kr + (kv0 + j) * LIM_HKV * LIM_D, 0,
                                            vr + (kv0 + j) * LIM_HKV * LIM_DV, 0, KVA_DTYPE_F32));
                }
                kv0 += sl[r];
            }
            CHECK_OK(kva_plan_create(ctx, &rd, &plan));
            float rout[4 * LIM_H * LIM_DV], rlse[4 * LIM_H];
            kva_test_poison(rout, KVA_DTYPE_F32, sizeof rout / sizeof rout[0]);
            kva_test_poison(rlse, KVA_DTYPE_F32, sizeof rlse / sizeof rlse[0]);
            CHECK_OK(kva_attention_run_ragged(ctx, plan, q, kr, vr, sk, rout, rlse));
            CHECK_MSG(
                kva_test_compare("ragged", rout, out, KVA_DTYPE_F32, sizeof out / 4,
                                 kva_test_atol(KVA_DTYPE_F32), kva_test_rtol(KVA_DTYPE_F32)) == 0 &&
                    kva_test_compare_f32("ragged lse", rlse, lse, sizeof lse / 4, 1e-5, 1e-5) == 0,
                "%s: ragged run past row 2^31 differs from the paged run", label);
            kva_plan_destroy(plan);
            munmap(kr, (size_t)rows * LIM_HKV * LIM_D * 4);
            munmap(vr, (size_t)rows * LIM_HKV * LIM_DV * 4);
        }
        kva_cache_destroy(c);
        kva_context_destroy(ctx);
    }
    free(bt);
}

/* ---- block ids up to INT32_MAX - 1, many requests ---- */

/* kvattn.h: block ids are int32; a cache of NB = INT32_MAX blocks (B 1, Hkv
 * 1, D 8 f32: 64 GiB of K reserved, a few pages touched) takes every id
 * below NB in writes, reads, copies, swaps and runs; a plan that reads id
 * NB - 1 is refused (OUT_OF_RANGE) by a cache of NB - 1 blocks, which it
 * leaves as it was. */
static void test_max_block_id(void)
{
    const int32_t NB = INT32_MAX, D = 8;
    const size_t bytes = (size_t)NB * D * 4;
    float *kb = sz_map(bytes), *vb = sz_map(bytes);
    if (!kb || !vb) {
        fprintf(stderr, "  (skipped: cannot reserve 2 x %zu GiB of address space)\n", bytes >> 30);
        if (kb)
            munmap(kb, bytes);
        return;
    }
    const int32_t ids[4] = {NB - 1, NB - 2, 0, (int32_t)1 << 30};
    kva_rng rng = {3807};
    float k[4 * D], v[4 * D], kr[4 * D], vr[4 * D], q[2 * 2 * D];
    kva_test_fill(k, KVA_DTYPE_F32, 4 * D, &rng, 1.0);
    kva_test_fill(v, KVA_DTYPE_F32, 4 * D, &rng, 1.0);
    kva_test_fill(q, KVA_DTYPE_F32, 2 * 2 * D, &rng, 1.0);
    int64_t slots[4];
    for (int i = 0; i < 4; i++)
        slots[i] = ids[i];
    for (int b = 0; b < 2; b++) {
        kva_context *ctx = new_ctx(kBk[b], 2);
        kva_cache_desc cd = make_desc(NB, 1, 1, D, 0, KVA_DTYPE_F32, KVA_LAYOUT_NHD);
        kva_cache_desc sd = make_desc(NB - 1, 1, 1, D, 0, KVA_DTYPE_F32, KVA_LAYOUT_NHD);
        kva_cache *c = NULL, *s = NULL;
        CHECK_OK(kva_cache_create_from(ctx, &cd, kb, vb, &c));
        CHECK_OK(kva_cache_create_from(ctx, &sd, kb, vb, &s));
        if (!c || !s) {
            kva_cache_destroy(c);
            kva_context_destroy(ctx);
            continue;
        }
        CHECK_OK(kva_cache_write(ctx, c, 4, k, 0, v, 0, KVA_DTYPE_F32, slots));
        CHECK(memcmp(kb + (size_t)(NB - 1) * D, k, D * 4) == 0 &&
              memcmp(vb + (size_t)(NB - 2) * D, v + D, D * 4) == 0);
        kva_test_poison(kr, KVA_DTYPE_F32, 4 * D);
        CHECK_OK(kva_cache_read(ctx, c, 4, slots, kr, 0, vr, 0, KVA_DTYPE_F32));
        CHECK(memcmp(kr, k, sizeof k) == 0 && memcmp(vr, v, sizeof v) == 0);
        /* A slot of NB * B is one too far, on the larger and the smaller cache. */
        const int64_t far = (int64_t)NB;
        BAD(kva_cache_write(ctx, c, 1, k, 0, v, 0, KVA_DTYPE_F32, &far), KVA_STATUS_OUT_OF_RANGE);
        const int64_t far_s = (int64_t)NB - 1;
        BAD(kva_cache_write(ctx, s, 1, k, 0, v, 0, KVA_DTYPE_F32, &far_s), KVA_STATUS_OUT_OF_RANGE);
        CHECK(memcmp(kb + (size_t)(NB - 1) * D, k, D * 4) == 0);
        /* Decode over keys at ids NB - 1, NB - 2, 0, 2^30 (in that order),
         * and a 1-token prefill over the last two: as the same keys at
         * a cache's first ids. */
        const int32_t qsl[3] = {0, 1, 2}, sl[2] = {4, 2};
        int32_t bt[2 * 4] = {NB - 1, NB - 2, 0, 1 << 30, 0, 1 << 30, -1, -1};
        kva_plan_desc pd = {.num_requests = 2,
                            .query_start_loc = qsl,
                            .seq_lens = sl,
                            .block_table = bt,
                            .block_table_stride = 4,
                            .block_size = 1,
                            .num_heads = 2,
                            .num_kv_heads = 1,
                            .head_dim = D,
                            .q_dtype = KVA_DTYPE_F32,
                            .causal = 1,
                            .window_left = -1};
        kva_plan *plan = NULL;
        CHECK_OK(kva_plan_create(ctx, &pd, &plan));
        float out[2 * 2 * D], lse[2 * 2];
        kva_test_poison(out, KVA_DTYPE_F32, 2 * 2 * D);
        kva_test_poison(lse, KVA_DTYPE_F32, 4);
        CHECK_OK(kva_attention_run(ctx, plan, q, c, NULL, out, lse));
        sz_sem m = {1.0 / sqrt((double)D), 0.0, 1, -1, 0, NULL, NULL};
        CHECK(sz_check_run(ctx, c, &pd, &m, q, out, lse, KVA_DTYPE_F32, "max id") == 0);
        /* The cache one block short refuses the plan and is left alone. */
        const uint64_t before = bb_sum(out, sizeof out);
        BAD(kva_attention_run(ctx, plan, q, s, NULL, out, lse), KVA_STATUS_OUT_OF_RANGE);
        CHECK(bb_sum(out, sizeof out) == before);
        /* Copies and swaps at the top ids. */
        const int32_t cp[2] = {NB - 1, NB - 3};
        CHECK_OK(kva_cache_copy_blocks(ctx, c, cp, 1));
        CHECK(memcmp(kb + (size_t)(NB - 3) * D, k, D * 4) == 0);
        const int32_t bad_cp[2] = {NB - 1, NB};
        BAD(kva_cache_copy_blocks(ctx, c, bad_cp, 1), KVA_STATUS_OUT_OF_RANGE);
        /* Swaps out of the top ids into a small cache and back. */
        kva_cache_desc md = make_desc(8, 1, 1, D, 0, KVA_DTYPE_F32, KVA_LAYOUT_NHD);
        kva_cache *sm = NULL;
        CHECK_OK(kva_cache_create(ctx, &md, &sm));
        const int32_t sw[2] = {NB - 2, 5}, back[2] = {5, NB - 4};
        CHECK_OK(kva_cache_swap_blocks(ctx, c, sm, sw, 1));
        CHECK_OK(kva_cache_swap_blocks(ctx, sm, c, back, 1));
        CHECK(memcmp(kb + (size_t)(NB - 4) * D, k + D, D * 4) == 0 &&
              memcmp(vb + (size_t)(NB - 4) * D, v + D, D * 4) == 0);
        const int32_t bad_sw[2] = {NB, 0}, bad_back[2] = {0, NB};
        BAD(kva_cache_swap_blocks(ctx, c, sm, bad_sw, 1), KVA_STATUS_OUT_OF_RANGE);
        BAD(kva_cache_swap_blocks(ctx, sm, c, bad_back, 1), KVA_STATUS_OUT_OF_RANGE);
        kva_cache_destroy(sm);
        kva_plan_destroy(plan);
        kva_cache_destroy(c);
        kva_cache_destroy(s);
        kva_context_destroy(ctx);
        madvise(kb, bytes, MADV_DONTNEED);
        madvise(vb, bytes, MADV_DONTNEED);
    }
    munmap(kb, bytes);
    munmap(vb, bytes);
}

/* 2^17 requests (decodes, 2- and 3-token prefills, q_len 0 padding, with
 * 1 .. 40 keys each, blocks scattered over the cache): CPU equals the
 * reference, and both equal the formula on a sample of requests. */
static void test_many_requests(void)
{
    const int32_t R = kva_test_quick() ? 1 << 14 : 1 << 17, B = 4, NB = 4096, W = 10, D = 8;
    int32_t *qsl = malloc(sizeof(int32_t) * (size_t)(R + 1));
    int32_t *sl = malloc(sizeof(int32_t) * (size_t)R);
    int32_t *bt = malloc(sizeof(int32_t) * (size_t)R * W);
    kva_rng rng = {3808};
    qsl[0] = 0;
    for (int32_t r = 0; r < R; r++) {
        const int32_t q = kva_rng_int(&rng, 0, 3);
        sl[r] = q + kva_rng_int(&rng, 0, 37);
        qsl[r + 1] = qsl[r] + q;
        for (int32_t j = 0; j < W; j++)
            bt[(size_t)r * W + j] = kva_rng_int(&rng, 0, NB - 1);
    }
    const int32_t T = qsl[R];
    kva_plan_desc pd = {.num_requests = R,
                        .query_start_loc = qsl,
                        .seq_lens = sl,
                        .block_table = bt,
                        .block_table_stride = W,
                        .block_size = B,
                        .num_heads = 2,
                        .num_kv_heads = 1,
                        .head_dim = D,
                        .q_dtype = KVA_DTYPE_F32,
                        .causal = 1,
                        .window_left = -1};
    float *q = malloc(sizeof(float) * (size_t)T * 2 * D);
    float *out[2], *lse[2];
    kva_test_fill(q, KVA_DTYPE_F32, (size_t)T * 2 * D, &rng, 1.0);
    kva_cache_desc cd = make_desc(NB, B, 1, D, 0, KVA_DTYPE_F32, KVA_LAYOUT_NHD);
    for (int b = 0; b < 2; b++) {
        kva_context *ctx = new_ctx(kBk[b], 2);
        kva_cache *c = NULL;
        kva_plan *plan = NULL;
        CHECK_OK(kva_cache_create(ctx, &cd, &c));
        kva_rng fill = {3809};
        fill_cache(c, &fill);
        CHECK_OK(kva_plan_create(ctx, &pd, &plan));
        out[b] = malloc(sizeof(float) * (size_t)T * 2 * D);
        lse[b] = malloc(sizeof(float) * (size_t)T * 2);
        kva_test_poison(out[b], KVA_DTYPE_F32, (size_t)T * 2 * D);
        kva_test_poison(lse[b], KVA_DTYPE_F32, (size_t)T * 2);
        CHECK_OK(kva_attention_run(ctx, plan, q, c, NULL, out[b], lse[b]));
        /* The formula on the first 64 requests (a plan of their own rows). */
        kva_plan_desc head = pd;
        head.num_requests = 64;
        sz_sem m = {1.0 / sqrt((double)D), 0.0, 1, -1, 0, NULL, NULL};
        CHECK(sz_check_run(ctx, c, &head, &m, q, out[b], lse[b], KVA_DTYPE_F32, "many") == 0);
        kva_plan_destroy(plan);
        kva_cache_destroy(c);
        kva_context_destroy(ctx);
    }
    CHECK(kva_test_compare("many requests", out[1], out[0], KVA_DTYPE_F32, (size_t)T * 2 * D,
                           kva_test_atol(KVA_DTYPE_F32), kva_test_rtol(KVA_DTYPE_F32)) == 0);
    CHECK(kva_test_compare_f32("many requests lse", lse[1], lse[0], (size_t)T * 2, 1e-5, 1e-5) ==
          0);
    for (int b = 0; b < 2; b++) {
        free(out[b]);
        free(lse[b]);
    }
    free(q);
    free(qsl);
    free(sl);
    free(bt);
}

int main(void)
{
    RUN(test_big_cache_offsets);
    RUN(test_max_block_id);
    RUN(test_many_requests);
    RUN(test_seq_len_limit);
    return kva_test_finish();
}
