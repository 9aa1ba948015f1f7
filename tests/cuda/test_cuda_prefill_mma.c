/*
 * test_cuda_prefill_mma.c - the tensor-core prefill kernel (src/attn/cuda/
 * prefill_mma.cu) against the reference backend.
 *
 * Each case draws a random paged batch (tests/batchgen.h: shuffled block
 * tables, shared prefixes), runs the REF backend on host copies and the kernel
 * on device copies (outputs poisoned with 0xff bytes, i.e. NaN, before every
 * launch), for every prefill kernel that exists for the head size
 * (kva__cuda_prefill_kernel: mma.sync at D = Dv, and on sm_90a at D/Dv 64/64,
 * 128/128, 192/128 and 256/256 the wgmma kernel with and without TMA) and for the dispatcher's
 * choice, and compares out and lse. Covered by a seeded covering design (every axis walks its
 * values in a fresh random order): D 64/128/256, (H, Hkv) with GQA groups 1/4/8 and MQA, B
 * 1/5/16/64, NHD/HND, bf16/f16, causal or not, windows, soft-cap, scale, ALiBi, sinks (small and
 * about +-60), lse or NULL, fresh prefills, chunked prefills (q_len < seq_len), mixed batches with
 * q_len 1-4 rows; explicit batches add q_len 0 / seq_len 0 requests, non-causal rows that see no
 * key (out 0, lse -inf or the sink), q_len > seq_len, and a long prefill crossing many key tiles;
 * batches at each head size of the sm_90a wgmma kernels (test_wgmma, test_wgmma_tma; D 192 / Dv 128
 * runs there only). A fixed-capacity grid (more CTAs than tiles) is used every time, so CTAs past
 * num_tiles must exit without writing; every other case's out starts 4 bytes past a 16-byte
 * boundary (the kernels' 4-byte store paths) and the bytes around out must stay poisoned.
 * Host-side checks: the tile builder's order and errors, and
 * the launcher's rejections.
 *
 * Tolerance: the kernel rounds the softmax weights P to the input dtype for the
 * P V product (as FlashAttention does), so out may differ from the fp64
 * reference by up to u * max|v| (u = 2^-8 bf16, 2^-11 f16: the rounding bound
 * of P, summed over weights that add up to 1) on top of the harness's per-dtype
 * tolerance. lse does not depend on that rounding and gets the harness's f32
 * tolerance. With "small" as argv[1] or KVA_TEST_QUICK set (as the other CUDA
 * tests take it) only a few small cases run (for compute-sanitizer).
 *
 * Exit 77 when there is no GPU (or the build has no CUDA).
 */
#ifndef KVA_HAVE_CUDA
#include <stdio.h>

int main(void)
{
    printf("skipped: built without CUDA\n");
    return 77;
}
#else

#include "batchgen.h"
#include "prefill_mma.h"

#include <cuda_runtime.h>

#define CUDA_OK(expr)                                                                              \
    do {                                                                                           \
        cudaError_t e_ = (expr);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorString(e_)); \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

typedef struct cfg {
    int32_t D, Dv, H, Hkv, R, B, max_len; /* Dv 0: Dv = D */
    unsigned kinds;
    kva_dtype dt;
    kva_layout layout;
    int causal, window, alibi, sinks, lse, share;
    int nan_tail; /* NaN in the unused slots of each request's last block (share = 0) */
    float softcap, scale;
    uint64_t seed;
} cfg;

static void print_cfg(const cfg *c, const kva_test_batch *b)
{
    fprintf(
        stderr,
        "  case: D=%d Dv=%d H=%d Hkv=%d R=%d B=%d max_len=%d kinds=%u %s %s causal=%d window=%d "
        "softcap=%g scale=%g alibi=%d sinks=%d lse=%d seed=%llu T=%d\n",
        c->D, c->Dv > 0 ? c->Dv : c->D, c->H, c->Hkv, b->R, c->B, c->max_len, c->kinds,
        kva_dtype_name(c->dt), c->layout == KVA_LAYOUT_NHD ? "NHD" : "HND", c->causal, c->window,
        (double)c->softcap, (double)c->scale, c->alibi, c->sinks, c->lse,
        (unsigned long long)c->seed, b->T);
}

static void *dev_copy(const void *h, size_t bytes)
{
    void *d = NULL;
    CUDA_OK(cudaMalloc(&d, bytes > 0 ? bytes : 16));
    if (h && bytes)
        CUDA_OK(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
    return d;
}

static int cases_run, rows_checked, multi_tile;

/* Whether kernel v is in the comma-separated list (KVA_TEST_KERNELS). */
static int kernel_listed(const char *list, int v)
{
    for (const char *p = list; *p;) {
        char *end = NULL;
        const long x = strtol(p, &end, 10);
        if (end == p)
            return 0;
        if (x == v)
            return 1;
        p = *end == ',' ? end + 1 : end;
    }
    return 0;
}

/* Runs one case on the batch b (which the caller frees). */
static void run_batch(const cfg *c, const kva_test_batch *b)
{
    kva_rng rng = {c->seed * 7919 + 17};
    const int32_t H = c->H, Hkv = c->Hkv, D = c->D, Dv = c->Dv > 0 ? c->Dv : c->D, T = b->T;
    const size_t esz = kva_dtype_size(c->dt);
    kva_context_desc rd = {KVA_BACKEND_REF, 0, 0};
    kva_context *ref = NULL;
    CHECK_OK(kva_context_create(&rd, &ref));
    kva_cache *cache = NULL;
    CHECK_OK(kva_test_batch_cache(b, ref, &rng, Hkv, D, Dv, c->dt, c->layout, &cache));
    kva_plan_desc pd = kva_test_batch_plan_desc(b, H, Hkv, D, Dv, c->dt);
    pd.causal = c->causal;
    pd.window_left = c->window;
    pd.softcap = c->softcap;
    pd.scale = c->scale;
    float *slopes = malloc(sizeof(float) * (size_t)H), *sinks = malloc(sizeof(float) * (size_t)H);
    for (int32_t h = 0; h < H; h++) {
        slopes[h] = (float)pow(2.0, -8.0 * (h + 1) / H);
        sinks[h] = (float)(kva_rng_normal(&rng) * 2.0);
        if (c->sinks == 2)
            sinks[h] += h % 2 ? 60.0f : -60.0f;
    }
    pd.alibi_slopes = c->alibi ? slopes : NULL;
    kva_plan *plan = NULL;
    CHECK_OK(kva_plan_create(ref, &pd, &plan));
    if (!plan || !cache) {
        print_cfg(c, b);
        kva_cache_destroy(cache);
        kva_context_destroy(ref);
        free(slopes);
        free(sinks);
        return;
    }
    const size_t nq = (size_t)T * H * D, no = (size_t)T * H * Dv, nl = (size_t)T * H;
    void *q = malloc(nq * esz + 2), *out_ref = malloc(no * esz + 2), *out = malloc(no * esz + 2);
    float *lse_ref = malloc(nl * 4 + 4), *lse = malloc(nl * 4 + 4);
    kva_test_fill_uniform(q, c->dt, nq, &rng);
    kva_test_poison(out_ref, c->dt, no);
    kva_test_poison(lse_ref, KVA_DTYPE_F32, nl);
    const float *sk = c->sinks ? sinks : NULL;
    CHECK_OK(kva_attention_run(ref, plan, q, cache, sk, out_ref, lse_ref));

    /* Device copies. */
    void *k_h, *v_h;
    kva_cache_data(cache, &k_h, &v_h);
    const size_t kv_rows = (size_t)b->num_blocks * b->block_size * Hkv;
    const size_t k_bytes = kv_rows * D * esz, v_bytes = kv_rows * Dv * esz;
    /* After the reference ran: slots past seq_len of a request's last block
     * get NaN (0xffff in f16 and bf16); no kernel may load them into a
     * product (the TMA kernel must gather such tiles by cp.async). */
    for (int32_t r = 0; c->nan_tail && !c->share && r < b->R; r++) {
        const int32_t sl = b->seq_lens[r], B = b->block_size;
        if (sl % B == 0)
            continue;
        const size_t blk = (size_t)b->block_table[(size_t)r * b->stride + (size_t)(sl / B)];
        for (int32_t o = sl % B; o < B; o++)
            for (int32_t h = 0; h < Hkv; h++) {
                const size_t row = c->layout == KVA_LAYOUT_NHD
                                       ? (blk * (size_t)B + (size_t)o) * (size_t)Hkv + (size_t)h
                                       : (blk * (size_t)Hkv + (size_t)h) * (size_t)B + (size_t)o;
                memset((char *)k_h + row * (size_t)D * esz, 0xff, (size_t)D * esz);
                memset((char *)v_h + row * (size_t)Dv * esz, 0xff, (size_t)Dv * esz);
            }
    }
    void *d_q = dev_copy(q, nq * esz), *d_k = dev_copy(k_h, k_bytes), *d_v = dev_copy(v_h, v_bytes);
    /* Every other case writes out 4 bytes past a 16-byte boundary (the
     * wgmma epilogue's 4-byte store path; 16-byte stores need an aligned
     * out), the others at the boundary; the 16 spare bytes around out must
     * stay poisoned. */
    const size_t out_off = (cases_run & 1) ? 4 : 0;
    char *d_out_buf = dev_copy(NULL, no * esz + 16);
    void *d_out = d_out_buf + out_off;
    float *d_lse = dev_copy(NULL, nl * 4);
    float *d_sinks = dev_copy(sinks, sizeof(float) * (size_t)H);
    float *d_slopes = dev_copy(slopes, sizeof(float) * (size_t)H);
    int32_t *d_qsl = dev_copy(b->query_start_loc, sizeof(int32_t) * (size_t)(b->R + 1));
    int32_t *d_sl = dev_copy(b->seq_lens, sizeof(int32_t) * (size_t)(b->R > 0 ? b->R : 1));
    int32_t *d_bt = dev_copy(b->block_table, sizeof(int32_t) * (size_t)b->R * (size_t)b->stride);
    const int64_t count =
        kva__cuda_prefill_tiles_count_subset(b->R, b->query_start_loc, NULL, H, Hkv);
    CHECK(count >= 0);
    const int32_t capacity = (int32_t)count + 3; /* a fixed-capacity grid with spare CTAs */
    int32_t *tiles = malloc(sizeof(int32_t) * KVA__CUDA_PREFILL_TILE_INTS * (size_t)capacity);
    int32_t ntiles = -1;
    CHECK_OK(kva__cuda_prefill_tiles_build_sections(b->R, b->query_start_loc, b->seq_lens, NULL, H,
                                                    Hkv, c->causal, c->window, 0, 0, tiles,
                                                    capacity, &ntiles));
    CHECK(ntiles == count);
    int32_t *d_tiles = dev_copy(tiles, sizeof(int32_t) * 4 * (size_t)capacity);
    int32_t *d_ntiles = dev_copy(&ntiles, sizeof ntiles);
    /* The wgmma kernels run with the static tile order (sched NULL), then
     * with the dynamic schedule. Its launches share the counters (zero before
     * the first), so a launch that left them non-zero would make the next one
     * skip tiles; they must read 0 after each. */
    const int32_t sched0[2] = {0, 0};
    int32_t *d_sched = dev_copy(sched0, sizeof sched0);

    kva__cuda_prefill_args a;
    memset(&a, 0, sizeof a);
    a.q = d_q;
    a.k = d_k;
    a.v = d_v;
    a.out = d_out;
    a.lse = c->lse ? d_lse : NULL;
    a.sinks = c->sinks ? d_sinks : NULL;
    a.alibi_slopes = c->alibi ? d_slopes : NULL;
    a.query_start_loc = d_qsl;
    a.seq_lens = d_sl;
    a.block_table = d_bt;
    a.tiles = d_tiles;
    a.num_tiles = d_ntiles;
    a.grid_tiles = capacity;
    a.block_table_stride = b->stride;
    a.block_size = b->block_size;
    a.num_blocks = b->num_blocks;
    a.num_heads = H;
    a.num_kv_heads = Hkv;
    a.head_dim = D;
    a.head_dim_v = Dv;
    a.dtype = c->dt;
    a.layout = c->layout;
    a.scale = c->scale > 0.0f ? c->scale : (float)(1.0 / sqrt((double)D));
    a.causal = c->causal;
    a.window_left = c->window;
    a.softcap = c->softcap;

    const double u = c->dt == KVA_DTYPE_BF16 ? 0x1p-8 : 0x1p-11;
    const double atol = kva_test_atol(c->dt) + u * 1.7320508; /* max|v| of the uniform fill */
    /* Kernel 0 is the dispatcher's choice (KVA__CUDA_PREFILL_AUTO).
     * KVA_TEST_KERNELS="a,b,..." (kva__cuda_prefill_kernel values) runs only
     * those (sanitizer runs of one kernel; every kernel by default). The
     * wgmma kernels at D = Dv 128 run in both tile shapes (args.narrow), and
     * every kernel but mma.sync with both tile schedules (args.sched). */
    const char *only = getenv("KVA_TEST_KERNELS");
    const int shapes = D == 128 && Dv == 128 ? 2 : 1,
              nv = (KVA__CUDA_PREFILL_WGMMA_TMA + 1) * shapes;
    for (int vs = 0; vs < 2 * nv; vs++) {
        const int var = vs % (KVA__CUDA_PREFILL_WGMMA_TMA + 1);
        a.narrow = vs % nv > KVA__CUDA_PREFILL_WGMMA_TMA;
        a.sched = vs >= nv ? d_sched : NULL;
        if (a.sched && var == KVA__CUDA_PREFILL_MMA)
            continue; /* mma.sync has no schedule to choose */
        if (var > 0 && !kva__cuda_prefill_kernel_exists(D, Dv, (kva__cuda_prefill_kernel)var))
            continue;
        if (only && !kernel_listed(only, var))
            continue;
        if (a.narrow && var == KVA__CUDA_PREFILL_MMA)
            continue; /* mma.sync has one shape */
        CUDA_OK(cudaMemset(d_out_buf, 0xff, no * esz + 16));
        CUDA_OK(cudaMemset(d_lse, 0xff, nl * 4));
        CHECK_OK(kva__cuda_prefill_launch_kernel(&a, NULL, (kva__cuda_prefill_kernel)var));
        CUDA_OK(cudaDeviceSynchronize());
        CUDA_OK(cudaMemcpy(out, d_out, no * esz, cudaMemcpyDeviceToHost));
        CUDA_OK(cudaMemcpy(lse, d_lse, nl * 4, cudaMemcpyDeviceToHost));
        size_t bad = kva_test_compare("out", out, out_ref, c->dt, no, atol, kva_test_rtol(c->dt));
        int32_t sched_after[2] = {-1, -1};
        CUDA_OK(cudaMemcpy(sched_after, d_sched, sizeof sched_after, cudaMemcpyDeviceToHost));
        bad += sched_after[0] != 0 || sched_after[1] != 0; /* not reset for the next launch */
        unsigned char guard[16];
        CUDA_OK(cudaMemcpy(guard, d_out_buf, out_off, cudaMemcpyDeviceToHost));
        CUDA_OK(cudaMemcpy(guard + out_off, d_out_buf + out_off + no * esz, 16 - out_off,
                           cudaMemcpyDeviceToHost));
        for (int i = 0; i < 16; i++)
            bad += guard[i] != 0xff; /* written outside out */
        if (c->lse)
            bad += kva_test_compare_f32("lse", lse, lse_ref, nl, kva_test_atol(KVA_DTYPE_F32),
                                        kva_test_rtol(KVA_DTYPE_F32));
        else /* lse NULL: the poisoned buffer must stay untouched (all 0xff) */
            for (size_t i = 0; i < nl; i++)
                bad += ((const uint32_t *)(const void *)lse)[i] != 0xffffffffu;
        CHECK_MSG(bad == 0, "%zu mismatches (kernel %d, narrow %d, dynamic schedule %d)", bad, var,
                  (int)a.narrow, a.sched != NULL);
        if (bad) {
            print_cfg(c, b);
            break;
        }
    }
    cases_run++;
    rows_checked += (int)nl;
    for (int32_t r = 0; r < b->R; r++)
        multi_tile += b->seq_lens[r] > 64 && b->q_lens[r] * (H / Hkv) > 1;

    CUDA_OK(cudaFree(d_q));
    CUDA_OK(cudaFree(d_k));
    CUDA_OK(cudaFree(d_v));
    CUDA_OK(cudaFree(d_out_buf));
    CUDA_OK(cudaFree(d_lse));
    CUDA_OK(cudaFree(d_sinks));
    CUDA_OK(cudaFree(d_slopes));
    CUDA_OK(cudaFree(d_qsl));
    CUDA_OK(cudaFree(d_sl));
    CUDA_OK(cudaFree(d_bt));
    CUDA_OK(cudaFree(d_tiles));
    CUDA_OK(cudaFree(d_ntiles));
    CUDA_OK(cudaFree(d_sched));
    free(tiles);
    free(q);
    free(out_ref);
    free(out);
    free(lse_ref);
    free(lse);
    free(slopes);
    free(sinks);
    kva_plan_destroy(plan);
    kva_cache_destroy(cache);
    kva_context_destroy(ref);
}

/* Reference cost in fp64 multiply-adds (two passes over the visible keys). */
static double ref_cost(const kva_test_batch *b, const cfg *c)
{
    double s = 0;
    for (int32_t r = 0; r < b->R; r++)
        s += (double)b->q_lens[r] * b->seq_lens[r];
    return s * c->H * 3.0 * c->D;
}

/* A random batch for c, shrunk (requests, then lengths) under the budget. */
static void run_random(cfg c, double budget)
{
    kva_rng rng = {c.seed};
    kva_test_batch b;
    for (;;) {
        kva_test_batch_random(&b, &rng, c.R, c.B, c.max_len, c.kinds, c.share);
        if (ref_cost(&b, &c) <= budget || (c.R == 1 && c.max_len <= 8))
            break;
        kva_test_batch_free(&b);
        if (c.R > 1)
            c.R = c.R * 2 / 3;
        else
            c.max_len = c.max_len * 2 / 3;
    }
    run_batch(&c, &b);
    kva_test_batch_free(&b);
}

static int axis_pick(kva_rng *rng, int *perm, int n, int i)
{
    if (i % n == 0) {
        for (int j = 0; j < n; j++)
            perm[j] = j;
        for (int j = n - 1; j > 0; j--) {
            int x = kva_rng_int(rng, 0, j), t = perm[j];
            perm[j] = perm[x];
            perm[x] = t;
        }
    }
    return perm[i % n];
}

static int small_mode;

/* The covering grid over every axis. */
static void test_grid(void)
{
    static const int32_t dims[] = {64, 128, 256};
    static const int32_t heads[][2] = {{4, 4}, {8, 2}, {16, 2}, {8, 1}, {32, 8}};
    static const int32_t bsizes[] = {1, 5, 16, 64};
    static const int32_t reqs[] = {1, 3, 8};
    static const int32_t lens[] = {40, 200, 700};
    static const unsigned kinds[] = {12u, 4u, 15u, 8u};
    static const int32_t windows[] = {-1, -1, 0, 9, 100};
    static const float caps[] = {0.0f, 2.5f};
    static const float scales[] = {0.0f, 0.3f};
    int p[20][8];
    kva_rng rng = {0x5eed1234};
    const int N = small_mode ? 6 : 96;
    const int failed_before = kva_test_checks_failed_;
    for (int i = 0; i < N; i++) {
        cfg c;
        memset(&c, 0, sizeof c);
        c.D = dims[axis_pick(&rng, p[0], 3, i)];
        const int hi = axis_pick(&rng, p[1], 5, i);
        c.H = heads[hi][0];
        c.Hkv = heads[hi][1];
        c.B = bsizes[axis_pick(&rng, p[2], 4, i)];
        c.R = reqs[axis_pick(&rng, p[3], 3, i)];
        c.max_len = small_mode ? 70 : lens[axis_pick(&rng, p[4], 3, i)];
        c.kinds = kinds[axis_pick(&rng, p[5], 4, i)];
        c.dt = axis_pick(&rng, p[6], 2, i) ? KVA_DTYPE_F16 : KVA_DTYPE_BF16;
        c.layout = axis_pick(&rng, p[7], 2, i) ? KVA_LAYOUT_HND : KVA_LAYOUT_NHD;
        c.causal = axis_pick(&rng, p[8], 2, i) ? 0 : 1;
        c.window = windows[axis_pick(&rng, p[9], 5, i)];
        c.softcap = caps[axis_pick(&rng, p[10], 2, i)];
        c.scale = scales[axis_pick(&rng, p[11], 2, i)];
        c.alibi = axis_pick(&rng, p[12], 2, i);
        c.sinks = axis_pick(&rng, p[13], 3, i);
        c.lse = axis_pick(&rng, p[14], 4, i) != 0;
        c.share = axis_pick(&rng, p[15], 2, i);
        c.seed = 1000 + (uint64_t)i;
        run_random(c, small_mode ? 4e5 : 2e7);
        if (kva_test_checks_failed_ - failed_before > 10)
            break;
    }
}

/* Explicit batches: empty requests, rows that see no key, q_len > seq_len. */
static void test_edges(void)
{
    static const int32_t ql_a[] = {0, 20, 0, 1, 3}, sl_a[] = {10, 50, 0, 33, 3};
    static const int32_t ql_b[] = {5, 3, 130, 0}, sl_b[] = {0, 7, 40, 0};
    for (int v = 0; v < 8; v++) {
        cfg c;
        memset(&c, 0, sizeof c);
        c.D = v % 4 == 3 ? 256 : v % 2 ? 128 : 64;
        c.H = v & 2 ? 8 : 4;
        c.Hkv = v & 4 ? 1 : 4;
        c.B = v % 3 == 0 ? 5 : 16;
        c.dt = v & 1 ? KVA_DTYPE_F16 : KVA_DTYPE_BF16;
        c.layout = v & 2 ? KVA_LAYOUT_HND : KVA_LAYOUT_NHD;
        c.window = v == 5 ? 4 : -1;
        c.sinks = v & 1;
        c.alibi = v == 6;
        c.lse = 1;
        c.seed = 77 + (uint64_t)v;
        kva_rng rng = {c.seed};
        kva_test_batch b;
        /* Causal: q_len 0 requests (seq_len 0 or not) between others, q_len 1 and q = s. */
        c.causal = 1;
        kva_test_batch_init(&b, &rng, 5, ql_a, sl_a, c.B, 2, v & 1);
        run_batch(&c, &b);
        kva_test_batch_free(&b);
        /* Non-causal: seq_len 0 rows (out 0, lse -inf or the sink), q_len > seq_len. */
        c.causal = 0;
        kva_test_batch_init(&b, &rng, 4, ql_b, sl_b, c.B, 2, 0);
        run_batch(&c, &b);
        kva_test_batch_free(&b);
        if (small_mode && v >= 1)
            break;
    }
}

/* One long causal prefill and one chunked prefill crossing many key tiles. */
static void test_long(void)
{
    static const int32_t ql[] = {500, 200}, sl[] = {500, 900};
    for (int v = 0; v < 3; v++) {
        cfg c;
        memset(&c, 0, sizeof c);
        c.D = v == 0 ? 128 : v == 1 ? 64 : 256;
        c.H = 4;
        c.Hkv = v == 1 ? 4 : 1;
        c.B = v == 2 ? 64 : 16;
        c.dt = v == 1 ? KVA_DTYPE_F16 : KVA_DTYPE_BF16;
        c.layout = v == 1 ? KVA_LAYOUT_HND : KVA_LAYOUT_NHD;
        c.causal = 1;
        c.window = v == 2 ? 333 : -1;
        c.lse = 1;
        c.sinks = v == 1;
        c.seed = 4242 + (uint64_t)v;
        kva_rng rng = {c.seed};
        kva_test_batch b;
        kva_test_batch_init(&b, &rng, 2, ql, sl, c.B, 1, 0);
        run_batch(&c, &b);
        kva_test_batch_free(&b);
    }
}

/* The head sizes (D, Dv) of the wgmma kernel: its traits (prefill_wgmma.cuh). */
static const int32_t wg_dims[][2] = {{128, 128}, {64, 64}, {192, 128}, {256, 256}};
#define WG_NDIMS ((int)(sizeof wg_dims / sizeof wg_dims[0]))

/* Batches aimed at the sm_90a wgmma kernels at each of its head sizes
 * (mma.sync runs on those with D = Dv too): 128-key tiles crossed many
 * times, lengths that are not multiples of the tile, chunked prefills after
 * cached context (q_len < seq_len), GQA groups 1/4/8, B 1/16/64, NHD/HND,
 * bf16/f16, LSE or NULL, and the soft-cap / ALiBi / sinks / window paths once
 * each. On a compute capability 9.0 device of a build with sm_90a code the
 * wgmma kernels must exist (so this cannot pass by skipping them). */
static void test_wgmma(void)
{
    static const int32_t ql[] = {600, 77, 300, 5}, sl[] = {600, 1500, 429, 700};
    static const int32_t ql_s[] = {130, 33}, sl_s[] = {130, 300};
    static const int32_t heads[][2] = {{8, 8}, {8, 2}, {16, 2}};
    static const int32_t bsizes[] = {1, 16, 64};
#ifdef KVA_CUDA_SM90A
    int dev = 0, major = 0, minor = 0;
    CUDA_OK(cudaGetDevice(&dev));
    CUDA_OK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    CUDA_OK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
    if (major == 9 && minor == 0)
        for (int di = 0; di < WG_NDIMS; di++)
            for (int v = KVA__CUDA_PREFILL_WGMMA; v <= KVA__CUDA_PREFILL_WGMMA_TMA; v++)
                CHECK_MSG(kva__cuda_prefill_kernel_exists(wg_dims[di][0], wg_dims[di][1],
                                                          (kva__cuda_prefill_kernel)v),
                          "wgmma kernel %d missing for D %d", v, wg_dims[di][0]);
#endif
    const int n = small_mode ? 2 : 9;
    for (int i = 0; i < WG_NDIMS * n; i++) {
        const int v = i % n, di = i / n;
        cfg c;
        memset(&c, 0, sizeof c);
        c.D = wg_dims[di][0];
        c.Dv = wg_dims[di][1];
        c.H = heads[v % 3][0];
        c.Hkv = heads[v % 3][1];
        c.B = bsizes[(v + v / 3) % 3];
        c.dt = v & 1 ? KVA_DTYPE_F16 : KVA_DTYPE_BF16;
        c.layout = (v / 2) & 1 ? KVA_LAYOUT_HND : KVA_LAYOUT_NHD;
        c.causal = v != 4;
        c.window = v == 5 ? 200 : -1;
        c.softcap = v == 6 ? 5.0f : 0.0f;
        c.alibi = v == 7;
        c.sinks = v == 8 ? 2 : v == 2;
        c.lse = v != 3;
        c.seed = 9000 + (uint64_t)i;
        kva_rng rng = {c.seed};
        kva_test_batch b;
        if (small_mode)
            kva_test_batch_init(&b, &rng, 2, ql_s, sl_s, c.B, 1, 0);
        else
            kva_test_batch_init(&b, &rng, 4, ql, sl, c.B, 1, v & 1);
        run_batch(&c, &b);
        kva_test_batch_free(&b);
    }
}

/* Batches aimed at the TMA path of the wgmma kernel, at each of its head
 * sizes: block sizes 8, 32, 128 and 256 (boxes of 8 .. 128 rows, a box at a
 * row offset inside a block of 256), both layouts, causal or not, a window
 * (tiles below its edge skipped, interior tiles above it), and NaN in the
 * unused slots of every request's last block, so a tile that crosses seq_len
 * must not be loaded by TMA. Every kernel runs on them. */
static void test_wgmma_tma(void)
{
    static const int32_t ql[] = {260, 20}, sl[] = {260, 600};
    static const int32_t bsizes[] = {8, 32, 128, 256};
    for (int i = 0; i < 4 * WG_NDIMS; i++) {
        const int v = i % 4, di = i / 4;
        cfg c;
        memset(&c, 0, sizeof c);
        c.D = wg_dims[di][0];
        c.Dv = wg_dims[di][1];
        c.H = v == 2 ? 8 : 16;
        c.Hkv = v == 2 ? 8 : 2;
        c.B = bsizes[v];
        c.dt = v & 1 ? KVA_DTYPE_F16 : KVA_DTYPE_BF16;
        c.layout = v == 1 || v == 3 ? KVA_LAYOUT_HND : KVA_LAYOUT_NHD;
        c.causal = v != 2;
        c.window = v == 3 ? 150 : -1;
        c.sinks = v == 1;
        c.lse = 1;
        c.nan_tail = 1;
        c.seed = 9100 + (uint64_t)i;
        kva_rng rng = {c.seed};
        kva_test_batch b;
        kva_test_batch_init(&b, &rng, 2, ql, sl, c.B, 1, 0);
        run_batch(&c, &b);
        kva_test_batch_free(&b);
        if (small_mode && v >= 1)
            i += 2; /* two block sizes per head size */
    }
    /* More CTA tiles (192) than an H100 has SMs, so the persistent wgmma
     * kernels walk several tiles per CTA (the K/V ring and its mbarrier
     * phases carried from tile to tile), at each head size (ring depths 3,
     * 4, 2); the second batch is non-causal with a seq_len 0 request last,
     * whose tiles have no key tile at all. */
    static const int32_t ql_p[] = {130, 130, 130, 130, 130, 130},
                         sl_p[] = {130, 130, 130, 130, 130, 130};
    static const int32_t ql_n[] = {130, 130, 130, 130, 130, 3},
                         sl_n[] = {130, 200, 130, 130, 130, 0};
    for (int i = 0; i < 2 * WG_NDIMS; i++) {
        const int v = i % 2, di = i / 2;
        if (small_mode && v == 1 && di > 0)
            continue; /* sanitizer runs: the non-causal batch at D 128 only */
        cfg c;
        memset(&c, 0, sizeof c);
        c.D = wg_dims[di][0];
        c.Dv = wg_dims[di][1];
        c.H = 16;
        c.Hkv = 16;
        c.B = v ? 32 : 64;
        c.dt = v ? KVA_DTYPE_F16 : KVA_DTYPE_BF16;
        c.layout = v ? KVA_LAYOUT_HND : KVA_LAYOUT_NHD;
        c.causal = !v;
        c.window = -1;
        c.sinks = v;
        c.lse = 1;
        c.nan_tail = 1;
        c.seed = 9200 + (uint64_t)i;
        kva_rng rng = {c.seed};
        kva_test_batch b;
        kva_test_batch_init(&b, &rng, 6, v ? ql_n : ql_p, v ? sl_n : sl_p, c.B, 1, 0);
        run_batch(&c, &b);
        kva_test_batch_free(&b);
    }
}

/* Estimated cost of tile {r, m0} as the builder counts it (causal, no window). */
static int64_t tile_keys(const int32_t *qsl, const int32_t *sl, int32_t G, const int32_t *t)
{
    const int32_t q = qsl[t[0] + 1] - qsl[t[0]], rows = q * G;
    const int32_t last = (t[1] + 128 < rows ? t[1] + 128 : rows) - 1;
    const int32_t hi = sl[t[0]] - q + last / G + 1;
    return hi < sl[t[0]] ? hi : sl[t[0]];
}

/* L2 sections: the same tiles as the plain order, each exactly once; requests
 * longest first; within a section heaviest first; a section's (request, kv
 * head) groups read at most section_keys keys (or it holds one group). */
static void test_sections(void)
{
    /* 6 requests (one not sent), H 8, Hkv 4 (G 2): 2 .. 9 tiles per kv head. */
    static const int32_t qsl[] = {0, 300, 310, 700, 828, 1428, 1600};
    static const int32_t sl[] = {300, 1010, 700, 128, 600, 172};
    static const uint8_t use[] = {1, 1, 1, 1, 1, 0};
    enum { CAP = 256, H = 8, HKV = 4, G = 2 };
    int32_t plain[CAP * 4], sec[CAP * 4], n0 = -1, n1 = -1;
    const int64_t count = kva__cuda_prefill_tiles_count_subset(6, qsl, use, H, HKV);
    CHECK(count > 0 && count <= CAP);
    CHECK_OK(kva__cuda_prefill_tiles_build_sections(6, qsl, sl, use, H, HKV, 1, -1, 0, 0, plain,
                                                    CAP, &n0));
    const int64_t budget = 2000; /* keys of one section */
    CHECK_OK(kva__cuda_prefill_tiles_build_sections(6, qsl, sl, use, H, HKV, 1, -1, 0, budget, sec,
                                                    CAP, &n1));
    CHECK(n0 == count && n1 == count);
    /* A permutation of the plain list. */
    int used[CAP] = {0};
    for (int32_t i = 0; i < n1; i++) {
        int found = 0;
        for (int32_t j = 0; j < n0 && !found; j++)
            if (!used[j] && !memcmp(&sec[4 * i], &plain[4 * j], 4 * sizeof(int32_t)))
                used[j] = found = 1;
        CHECK(found);
    }
    /* Sections are the runs of the list that whole groups (request, kv head)
     * span: a group's tiles lie between its first and last position. */
    int32_t last[6 * HKV];
    for (int32_t i = 0; i < n1; i++)
        last[sec[4 * i] * HKV + sec[4 * i + 2]] = i;
    int32_t sections = 0, start = 0;
    while (start < n1) {
        int32_t end = start + 1;
        for (int32_t i = start; i < end; i++) {
            const int32_t l = last[sec[4 * i] * HKV + sec[4 * i + 2]] + 1;
            end = l > end ? l : end;
        }
        int64_t keys = 0;
        int ng = 0;
        for (int32_t i = start; i < end; i++) {
            const int32_t *t = &sec[4 * i];
            int first = 1; /* the group's first tile in the list */
            for (int32_t j = start; j < i && first; j++)
                first = !(sec[4 * j] == t[0] && sec[4 * j + 2] == t[2]);
            if (first) {
                keys += sl[t[0]];
                ng++;
            }
            CHECK(i == start || tile_keys(qsl, sl, G, t) <= tile_keys(qsl, sl, G, t - 4));
        }
        CHECK(keys <= budget || ng == 1);
        sections++;
        start = end;
    }
    CHECK(sections > 1);
    /* The longest request (1, 1010 keys) comes first. */
    CHECK(sec[0] == 1);
    /* Without a budget the order is the plain one. */
    CHECK_OK(kva__cuda_prefill_tiles_build_sections(6, qsl, sl, use, H, HKV, 1, -1, 0, 0, sec, CAP,
                                                    &n1));
    CHECK(n1 == n0 && !memcmp(sec, plain, (size_t)n0 * 4 * sizeof(int32_t)));
}

/* Host side: the tile builder's order and errors, the launcher's rejections. */
static void test_host(void)
{
    static const int32_t qsl[] = {0, 1, 301, 301, 557}, sl[] = {90, 300, 0, 1000};
    int32_t tiles[64 * 4], n = -1;
    /* H = 8, Hkv = 2 (G = 4): request 1 has 1200 rows -> 10 tiles per kv head. */
    const int64_t count = kva__cuda_prefill_tiles_count_subset(4, qsl, NULL, 8, 2);
    CHECK(count == (1 + 10 + 0 + 8) * 2);
    CHECK_OK(
        kva__cuda_prefill_tiles_build_sections(4, qsl, sl, NULL, 8, 2, 1, -1, 0, 0, tiles, 64, &n));
    CHECK(n == count);
    /* Heaviest first: request 3's last tile (chunked prefill, sees ~1000 keys). */
    CHECK(tiles[0] == 3 && tiles[1] == 7 * 128);
    int seen[4] = {0, 0, 0, 0};
    for (int32_t t = 0; t < n; t++) {
        CHECK(tiles[t * 4 + 2] >= 0 && tiles[t * 4 + 2] < 2);
        if (tiles[t * 4] >= 0 && tiles[t * 4] < 4)
            seen[tiles[t * 4]]++;
    }
    CHECK(seen[0] == 2 && seen[1] == 20 && seen[2] == 0 && seen[3] == 16);
    /* Too small a capacity: status, message, nothing written. */
    int32_t before[64 * 4];
    memcpy(before, tiles, sizeof tiles);
    n = -5;
    CHECK_STATUS(
        kva__cuda_prefill_tiles_build_sections(4, qsl, sl, NULL, 8, 2, 1, -1, 0, 0, tiles, 10, &n),
        KVA_STATUS_OUT_OF_RANGE);
    CHECK_ERROR_MENTIONS("capacity");
    CHECK(n == -5 && memcmp(before, tiles, sizeof tiles) == 0);
    CHECK_STATUS(
        kva__cuda_prefill_tiles_build_sections(4, qsl, sl, NULL, 8, 3, 1, -1, 0, 0, tiles, 64, &n),
        KVA_STATUS_INVALID_ARGUMENT);
    test_sections();
    CHECK(kva__cuda_prefill_supported(128, 128, KVA_DTYPE_BF16));
    CHECK(kva__cuda_prefill_supported(64, 64, KVA_DTYPE_F16));
    CHECK(kva__cuda_prefill_supported(256, 256, KVA_DTYPE_BF16));
    CHECK(!kva__cuda_prefill_supported(96, 96, KVA_DTYPE_BF16));
    CHECK(!kva__cuda_prefill_supported(128, 64, KVA_DTYPE_BF16));
    CHECK(!kva__cuda_prefill_supported(128, 128, KVA_DTYPE_F32));
    CHECK(!kva__cuda_prefill_supported(192, 128, KVA_DTYPE_F32));
    CHECK(!kva__cuda_prefill_supported(192, 192, KVA_DTYPE_BF16));
    /* D 192 / Dv 128 has only the wgmma kernel. */
    const int wg = kva__cuda_prefill_wgmma_ready();
    CHECK(kva__cuda_prefill_supported(192, 128, KVA_DTYPE_F16) == wg);
    CHECK(kva__cuda_prefill_kernel_exists(256, 256, KVA__CUDA_PREFILL_MMA) &&
          kva__cuda_prefill_kernel_exists(64, 64, KVA__CUDA_PREFILL_MMA) &&
          !kva__cuda_prefill_kernel_exists(192, 128, KVA__CUDA_PREFILL_MMA) &&
          !kva__cuda_prefill_kernel_exists(128, 64, KVA__CUDA_PREFILL_MMA));
    CHECK(kva__cuda_prefill_kernel_exists(256, 256, KVA__CUDA_PREFILL_WGMMA) == wg &&
          !kva__cuda_prefill_kernel_exists(256, 128, KVA__CUDA_PREFILL_WGMMA) &&
          !kva__cuda_prefill_kernel_exists(128, 64, KVA__CUDA_PREFILL_WGMMA_TMA) &&
          !kva__cuda_prefill_kernel_exists(128, 128, KVA__CUDA_PREFILL_AUTO));
    CHECK(kva__cuda_prefill_kernel_exists(64, 64, KVA__CUDA_PREFILL_WGMMA_TMA) == wg &&
          kva__cuda_prefill_kernel_exists(192, 128, KVA__CUDA_PREFILL_WGMMA) == wg);
    CHECK(!kva__cuda_prefill_kernel_exists(64, 64, (kva__cuda_prefill_kernel)4));
    CHECK(kva__cuda_prefill_kernel_default(256, 256, 16, 100) ==
          (wg ? KVA__CUDA_PREFILL_WGMMA_TMA : KVA__CUDA_PREFILL_MMA));
    CHECK(kva__cuda_prefill_kernel_default(64, 64, 16, 100) ==
          (wg ? KVA__CUDA_PREFILL_WGMMA_TMA : KVA__CUDA_PREFILL_MMA));
    CHECK(kva__cuda_prefill_kernel_default(192, 128, 5, 100) ==
          (wg ? KVA__CUDA_PREFILL_WGMMA : KVA__CUDA_PREFILL_MMA));
    kva__cuda_prefill_args a;
    memset(&a, 0, sizeof a);
    a.head_dim = a.head_dim_v = 96;
    a.dtype = KVA_DTYPE_BF16;
    a.grid_tiles = 1;
    CHECK_STATUS(kva__cuda_prefill_launch_kernel(&a, NULL, KVA__CUDA_PREFILL_AUTO),
                 KVA_STATUS_UNSUPPORTED);
    CHECK_ERROR_MENTIONS("D = 96");
    a.head_dim = a.head_dim_v = 128;
    CHECK_STATUS(kva__cuda_prefill_launch_kernel(&a, NULL, KVA__CUDA_PREFILL_AUTO),
                 KVA_STATUS_NULL_POINTER);
}

int main(int argc, char **argv)
{
    small_mode = (argc > 1 && strcmp(argv[1], "small") == 0) || getenv("KVA_TEST_QUICK");
    RUN(test_host);
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        printf("skipped: no CUDA device\n");
        return 77;
    }
    RUN(test_edges);
    RUN(test_wgmma);
    RUN(test_wgmma_tma);
    RUN(test_grid);
    if (!small_mode)
        RUN(test_long);
    fprintf(stderr, "  %d cases, %d rows, %d multi-tile requests\n", cases_run, rows_checked,
            multi_tile);
    if (!getenv("KVA_TEST_ONLY")) /* a subset of the tests runs fewer cases */
        CHECK(cases_run >= (small_mode ? 12 : 115));
    return kva_test_finish();
}
#endif
