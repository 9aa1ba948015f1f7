/*
 * test_cuda_mla.c - the CUDA absorbed MLA decode (kva_attention_run on a
 * KVA_ATTN_MLA plan: q [T, H, 576], latent cache rows [c_kv 512 | k_pe 64],
 * out [T, H, 512] + LSE) against an fp64 host computation of the same math
 * (FlashMLA's flash_mla_with_kvcache), written here from the definition:
 *   score_j = scale * <q_row, latent_j> over 576, key j visible if j < s and
 *   (causal) j <= s - q_len + i; out = softmax . latent[:, :512]; lse natural.
 * The latent rows enter through kva_cache_write on the CUDA context (c_kv and
 * k_pe, as vLLM's concat_and_cache_mla), into a cache first filled with NaN
 * (0xff bytes), so a read of an unwritten slot fails the case; out and lse are
 * poisoned before every run. Grid: H in {1, 3, 9, 16, 32, 63, 64, 128}, q_len
 * 1-4, contexts 1, block edges, long (up to 32k), block sizes 1, 16 and 64,
 * bf16 and f16, causal and not (seq_len 0: out 0, lse -inf), split and unsplit
 * plans (forced split counts too), a CUDA-graph capture and replay of two
 * cases (bitwise equal to the eager run), two cases with spike keys whose
 * logits jump mid-request (the lazy softmax max moves).
 * Tolerances (FlashMLA's test, loosened where the dtype forces it): the
 * cosine distance 1 - 2<a,b>/(|a|^2 + |b|^2) of the whole output at most 5e-6
 * (FlashMLA's, unchanged); every out element within 8e-4 + u max|v| +
 * 2.01/128 |ref|, where u max|v| (u = 2^-8 bf16, 2^-11 f16; max|v| = sqrt 3 of
 * the uniform fill) is the rounding of P to the input dtype before P V, which
 * both kernels do (as FlashMLA and FlashAttention): on H100 it moved elements
 * near zero by up to 5e-3 in bf16 (bench_cuda.c's decode check allows the
 * same term); LSE within 2e-5 absolute (fp32 scores over 576 products and the
 * hardware's approximate exp2: up to 5.4e-6 seen; the 1e-6 is
 * fp64-grade). The largest errors are printed per case. Bad input: f32 q, head sizes other
 * than 576 / 512, an MLA cache under an MHA plan, an MHA plan of D 576 on
 * CUDA: a status, a message, out untouched. KVA_TEST_QUICK=1 runs the first
 * cases (compute-sanitizer). Exits 77 without a GPU.
 *
 * FP8 E4M3 latent caches (one k_scale, not a power of two): the grid's fp8
 * cases write the same 16-bit c_kv / k_pe into the device cache and into a
 * reference-backend host cache, require the two caches byte-identical
 * (poison bytes of unwritten slots included), and take the fp64 reference
 * from the host cache's codes times the scale (the values the reference
 * backend reads); H 1, 16, 32, 64, 128, q_len 1-2, B 1 / 16 / 64, contexts 0,
 * 1 and block edges, split plans, both kernels. The same tolerances hold:
 * the kernels convert the codes exactly and apply the scale in fp32.
 * test_fp8_cache checks the write byte for byte against the host's from f32,
 * f16 and bf16 sources with saturating values, NaN, infinities, signed zeros
 * and fp8 subnormals (padding slots skipped), kva_cache_read against the
 * host's read, copy_blocks and swap_blocks, and the rejections that remain
 * (v_scale on an MLA cache, f32 q).
 */
#include "cuda_util.h"
#include "../../src/plan/partition.h"
#include "../../src/attn/cuda/cuda_backend.h"

#ifdef KVA_HAVE_CUDA

#define DC 512
#define DR 64
#define DL (DC + DR)

typedef struct mcase {
    uint64_t seed;
    int32_t H, R, q_min, q_max, s_min, s_max, B;
    kva_dtype dt;
    int32_t causal, splits;
    const int32_t *s_fixed; /* [R] seq_lens (NULL: uniform in [s_min, s_max] + q) */
    int graph;              /* 1: also capture the run in a CUDA graph and replay it */
    int spikes;             /* 1: three keys per request with growing logits (below) */
    int fp8;                /* 1: an FP8 E4M3 latent cache (k_scale FP8_SCALE) */
} mcase;

#define FP8_SCALE 0.0137f

static double to_d(const uint16_t *p, kva_dtype dt, size_t i)
{
    return dt == KVA_DTYPE_F16 ? kva_f16_to_f32(p[i]) : kva_bf16_to_f32(p[i]);
}

/* fp64 reference of rows of request r: out [q_len, H, 512], lse [q_len, H];
 * lat: the latent rows [L, 576] as the cache holds them, in double. */
static void reference(const uint16_t *q, const double *lat, kva_dtype dt, int32_t H, int32_t qs,
                      int32_t q_len, int32_t s, int64_t lat0, int causal, double scale, double *out,
                      double *lse)
{
    double *sc = malloc(sizeof(double) * (size_t)(s > 0 ? s : 1));
    for (int32_t i = 0; i < q_len; i++)
        for (int32_t h = 0; h < H; h++) {
            const size_t qrow = ((size_t)(qs + i) * H + h) * DL;
            const int32_t hi = causal ? s - q_len + i + 1 : s;
            double m = -INFINITY;
            for (int32_t j = 0; j < hi; j++) {
                double acc = 0;
                for (int c = 0; c < DL; c++)
                    acc += to_d(q, dt, qrow + c) * lat[(size_t)(lat0 + j) * DL + c];
                sc[j] = acc * scale;
                m = sc[j] > m ? sc[j] : m;
            }
            double l = 0;
            double *o = out + ((size_t)(qs + i) * H + h) * DC;
            for (int c = 0; c < DC; c++)
                o[c] = 0;
            for (int32_t j = 0; j < hi; j++) {
                const double p = exp(sc[j] - m);
                l += p;
                for (int c = 0; c < DC; c++)
                    o[c] += p * lat[(size_t)(lat0 + j) * DL + c];
            }
            for (int c = 0; c < DC; c++)
                o[c] = l > 0 ? o[c] / l : 0;
            lse[(size_t)(qs + i) * H + h] = l > 0 ? m + log(l) : -INFINITY;
        }
    free(sc);
}

/* Runs one case; returns 1 if it passed. */
static int run_case(const mcase *c, int quick_print)
{
    kva_rng rng = {c->seed};
    const int32_t R = c->R, H = c->H, B = c->B;
    int32_t *qsl = calloc((size_t)R + 1, sizeof(int32_t)), *sl = malloc(sizeof(int32_t) * R);
    int64_t *lat0 = malloc(sizeof(int64_t) * (R + 1)); /* first latent row of each request */
    int32_t nb = 0, stride = 1;
    lat0[0] = 0;
    for (int32_t r = 0; r < R; r++) {
        const int32_t q = kva_rng_int(&rng, c->q_min, c->q_max);
        qsl[r + 1] = qsl[r] + q;
        sl[r] = c->s_fixed ? c->s_fixed[r]
                           : kva_rng_int(&rng, c->s_min, c->s_max) + (c->causal ? q : 0);
        lat0[r + 1] = lat0[r] + sl[r];
        const int32_t nbr = (sl[r] + B - 1) / B;
        nb += nbr;
        stride = nbr > stride ? nbr : stride;
    }
    const int32_t T = qsl[R], NB = nb + 3;
    const int64_t L = lat0[R];
    /* Block table: a shuffled permutation of the blocks (3 spare ones stay NaN). */
    int32_t *perm = malloc(sizeof(int32_t) * NB),
            *bt = malloc(sizeof(int32_t) * (size_t)R * stride);
    for (int32_t i = 0; i < NB; i++)
        perm[i] = i;
    for (int32_t i = NB - 1; i > 0; i--) {
        const int32_t j = kva_rng_int(&rng, 0, i), t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    int64_t *slots = malloc(sizeof(int64_t) * (size_t)(L > 0 ? L : 1));
    for (int32_t r = 0, used = 0; r < R; r++)
        for (int32_t k = 0; k < stride; k++) {
            const int32_t n = (sl[r] + B - 1) / B;
            bt[(size_t)r * stride + k] = k < n ? perm[used + k] : -1;
            if (k == stride - 1)
                used += n;
        }
    for (int32_t r = 0; r < R; r++)
        for (int32_t j = 0; j < sl[r]; j++)
            slots[lat0[r] + j] = (int64_t)bt[(size_t)r * stride + j / B] * B + j % B;

    /* Host data: latent rows [L, 576] (c_kv | k_pe), q [T, H, 576]. */
    const kva_dtype dt = c->dt;
    uint16_t *lat = malloc(sizeof(uint16_t) * (size_t)(L > 0 ? L : 1) * DL);
    uint16_t *ckv = malloc(sizeof(uint16_t) * (size_t)(L > 0 ? L : 1) * DC);
    uint16_t *kpe = malloc(sizeof(uint16_t) * (size_t)(L > 0 ? L : 1) * DR);
    uint16_t *q = malloc(sizeof(uint16_t) * (size_t)T * H * DL);
    kva_test_fill_uniform(lat, dt, (size_t)L * DL, &rng);
    kva_test_fill(q, dt, (size_t)T * H * DL, &rng, 1.0);
    if (c->spikes)
        /* Keys s/4, s/2 and 3s/4 of each request become constant rows 2, 4
         * and 8: the heads whose q sums to a large positive value see their
         * row max jump by more than 8 (log2 units) past the first tile,
         * which moves the kernels' lazily kept softmax max mid-request
         * (uniform random data never does). */
        for (int32_t r = 0; r < R; r++)
            for (int k = 1; k <= 3; k++) {
                const float v = (float)(1 << k);
                const uint16_t h = dt == KVA_DTYPE_F16 ? kva_f32_to_f16(v) : kva_f32_to_bf16(v);
                const int64_t row = lat0[r] + (int64_t)sl[r] * k / 4;
                for (int i = 0; i < DL && sl[r] >= 4; i++)
                    lat[row * DL + i] = h;
            }
    for (int64_t j = 0; j < L; j++) {
        memcpy(ckv + j * DC, lat + j * DL, DC * 2);
        memcpy(kpe + j * DR, lat + j * DL + DC, DR * 2);
    }
    const double scale = 1.0 / sqrt(192.0);

    kva_context_desc gd = {KVA_BACKEND_CUDA, 0, 0};
    kva_context *gpu = NULL;
    CHECK_OK(kva_context_create(&gd, &gpu));
    if (c->splits)
        CHECK_OK(kva__cuda_context_force_splits(gpu, c->splits));
    const int fp8 = c->fp8;
    const size_t ces = fp8 ? 1 : 2; /* bytes per cache element */
    kva_cache_desc cd = {NB,
                         B,
                         1,
                         DL,
                         DC,
                         fp8 ? KVA_DTYPE_FP8_E4M3 : dt,
                         KVA_LAYOUT_NHD,
                         fp8 ? KVA_QUANT_FP8_E4M3 : KVA_QUANT_NONE,
                         KVA_ATTN_MLA};
    const float ksc = FP8_SCALE;
    const kva_quant_params qp = {.k_scale = &ksc, .k_scale_len = 1};
    kva_cache *cache = NULL;
    CHECK_OK(kva_cache_create_quant(gpu, &cd, fp8 ? &qp : NULL, &cache));
    void *ck = NULL;
    kva_cache_data(cache, &ck, NULL);
    const size_t cbytes = (size_t)NB * B * DL * ces;
    dev_fill(ck, 0xff, cbytes);
    void *d_ckv = dev_from(ckv, (size_t)L * DC * 2), *d_kpe = dev_from(kpe, (size_t)L * DR * 2);
    void *d_slots = dev_from(slots, sizeof(int64_t) * (size_t)L);
    if (L > 0)
        CHECK_OK(kva_cache_write(gpu, cache, (int32_t)L, d_ckv, 0, d_kpe, 0, dt, d_slots));
    /* The latent rows as the kernels must see them, in double: the 16-bit
     * values, or (fp8) the codes of the reference backend's write of the
     * same input times the scale, after checking that the device write
     * produced the same bytes. */
    double *latd = malloc(sizeof(double) * ((size_t)L * DL + 1));
    if (!fp8) {
        for (size_t i = 0; i < (size_t)L * DL; i++)
            latd[i] = to_d(lat, dt, i);
    } else {
        kva_context_desc rd = {KVA_BACKEND_REF, 1, 0};
        kva_context *ref = NULL;
        kva_cache *hc = NULL;
        CHECK_OK(kva_context_create(&rd, &ref));
        CHECK_OK(kva_cache_create_quant(ref, &cd, &qp, &hc));
        void *hk = NULL;
        kva_cache_data(hc, &hk, NULL);
        memset(hk, 0xff, cbytes);
        if (L > 0)
            CHECK_OK(kva_cache_write(ref, hc, (int32_t)L, ckv, 0, kpe, 0, dt, slots));
        uint8_t *dev_bytes = malloc(cbytes);
        to_host(dev_bytes, ck, cbytes);
        CHECK_MSG(memcmp(dev_bytes, hk, cbytes) == 0,
                  "seed %llu: the device FP8 latent write differs from the reference backend's",
                  (unsigned long long)c->seed);
        const uint8_t *codes = (const uint8_t *)hk;
        for (int64_t j = 0; j < L; j++)
            for (int e = 0; e < DL; e++)
                latd[(size_t)j * DL + e] =
                    (double)kva_fp8_e4m3_to_f32(codes[(size_t)slots[j] * DL + e]) * (double)ksc;
        free(dev_bytes);
        kva_cache_destroy(hc);
        kva_context_destroy(ref);
    }

    kva_plan_desc pd =
        kva_test_mla_desc(R, qsl, sl, bt, stride, B, H, DL, DC, dt, scale, c->causal);
    const size_t no = (size_t)T * H * DC;
    void *d_q = dev_from(q, (size_t)T * H * DL * 2);
    void *d_out = dev_poisoned(no * 2), *d_lse = dev_poisoned(sizeof(float) * (size_t)T * H);
    double *ro = malloc(sizeof(double) * (no + 1)), *rl = malloc(sizeof(double) * (T * H + 1));
    for (int32_t r = 0; r < R; r++)
        reference(q, latd, dt, H, qsl[r], qsl[r + 1] - qsl[r], sl[r], lat0[r], c->causal, scale, ro,
                  rl);
    /* The default kernel, then mla_decode_mma_sm80 forced when the default was
     * the wgmma one (items of 64 rows on sm_90a). */
    int ok = 1;
    for (int pass = 0; pass < 2; pass++) {
        kva_plan *plan = NULL;
        CHECK_OK(kva_plan_create(gpu, &pd, &plan));
        if (!plan) {
            ok = 0;
            break;
        }
        const kva__cuda_plan *cp = (const kva__cuda_plan *)plan->device;
        const int kernel = cp->decode_kernel;
        CHECK(kernel == KVA__CUDA_K_MLA_DECODE_MMA || kernel == KVA__CUDA_K_MLA_DECODE_WGMMA);
        CHECK(pass == 0 || kernel == KVA__CUDA_K_MLA_DECODE_MMA);
        dev_fill(d_out, 0xff, no * 2);
        dev_fill(d_lse, 0xff, sizeof(float) * (size_t)T * H);
        CHECK_OK(kva_attention_run(gpu, plan, d_q, cache, NULL, d_out, d_lse));
        uint16_t *out = malloc(no * 2 + 2);
        float *lse = malloc(sizeof(float) * (size_t)T * H + 4);
        to_host(out, d_out, no * 2);
        to_host(lse, d_lse, sizeof(float) * (size_t)T * H);
        /* P is rounded to the input dtype before P V (header comment). */
        const double atol = 8e-4 + (dt == KVA_DTYPE_F16 ? 0x1p-11 : 0x1p-8) * 1.7320508;
        size_t bad = 0, bad_lse = 0;
        double dot = 0, na = 0, nr = 0, max_lse = 0, max_err = 0;
        for (size_t i = 0; i < no; i++) {
            const double a = to_d(out, dt, i), b = ro[i];
            const int e_ok = fabs(a - b) <= atol + 2.01 / 128 * fabs(b);
            if (!e_ok && bad++ < 5)
                fprintf(stderr, "  out[%zu] (row %zu, col %zu): got %.6g, want %.6g\n", i, i / DC,
                        i % DC, a, b);
            max_err = fabs(a - b) > max_err || a != a ? fabs(a - b) : max_err;
            dot += a * b, na += a * a, nr += b * b;
        }
        for (size_t i = 0; i < (size_t)T * H; i++) {
            const double a = lse[i], b = rl[i];
            const int l_ok = isinf(b) ? a == b : fabs(a - b) <= 2e-5;
            if (!isinf(b))
                max_lse = fabs(a - b) > max_lse || a != a ? fabs(a - b) : max_lse;
            if (!l_ok && bad_lse++ < 5)
                fprintf(stderr, "  lse[%zu]: got %.9g, want %.9g\n", i, a, b);
        }
        const double cosd = na + nr > 0 ? 1.0 - 2.0 * dot / (na + nr) : 0.0;
        const int pass_ok = bad == 0 && bad_lse == 0 && cosd <= 5e-6 && cosd == cosd;
        if (!pass_ok || quick_print)
            fprintf(stderr,
                    "  case seed=%llu H=%d R=%d q=%d..%d T=%d B=%d %s%s causal=%d splits=%d %s "
                    "items=%d tasks=%d rows=%d: out bad %zu (max err %.3g), cos dist %.3g, lse "
                    "bad %zu (max %.3g)\n",
                    (unsigned long long)c->seed, H, R, c->q_min, c->q_max, T, B, kva_dtype_name(dt),
                    fp8 ? " fp8-cache" : "", c->causal, c->splits, kva__cuda_kernels[kernel].name,
                    plan->part->num_items, plan->part->num_tasks, cp->rows, bad, max_err, cosd,
                    bad_lse, max_lse);
        CHECK(pass_ok);
        ok &= pass_ok;
        if (c->graph && pass == 0) {
            /* The run captured in a CUDA graph (which also proves it makes no
             * host synchronization) and replayed into poisoned buffers: the
             * same bits as the eager run. */
            cudaStream_t st;
            cudaGraph_t g;
            cudaGraphExec_t ge;
            CUDA_OK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
            CHECK_OK(kva_cuda_context_set_stream(gpu, st));
            CUDA_OK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
            CHECK_OK(kva_attention_run(gpu, plan, d_q, cache, NULL, d_out, d_lse));
            CUDA_OK(cudaStreamEndCapture(st, &g));
            CUDA_OK(cudaGraphInstantiate(&ge, g, 0));
            dev_fill(d_out, 0xff, no * 2);
            dev_fill(d_lse, 0xff, sizeof(float) * (size_t)T * H);
            CUDA_OK(cudaGraphLaunch(ge, st));
            CUDA_OK(cudaStreamSynchronize(st));
            uint16_t *out2 = malloc(no * 2 + 2);
            float *lse2 = malloc(sizeof(float) * (size_t)T * H + 4);
            to_host(out2, d_out, no * 2);
            to_host(lse2, d_lse, sizeof(float) * (size_t)T * H);
            CHECK_MSG(memcmp(out2, out, no * 2) == 0 &&
                          memcmp(lse2, lse, sizeof(float) * (size_t)T * H) == 0,
                      "graph replay differs from the eager run");
            free(out2), free(lse2);
            cudaGraphExecDestroy(ge);
            cudaGraphDestroy(g);
            CHECK_OK(kva_cuda_context_set_stream(gpu, NULL));
            cudaStreamDestroy(st);
        }
        free(out), free(lse);
        kva_plan_destroy(plan);
        if (kernel != KVA__CUDA_K_MLA_DECODE_WGMMA)
            break;
        CHECK_OK(kva__context_force_kernel(gpu, "mla_decode_mma_sm80"));
    }
    free(ro), free(rl), free(latd);
    kva_cache_destroy(cache);
    kva_context_destroy(gpu);
    cudaFree(d_q), cudaFree(d_out), cudaFree(d_lse), cudaFree(d_ckv), cudaFree(d_kpe),
        cudaFree(d_slots);
    free(qsl), free(sl), free(lat0), free(perm), free(bt), free(slots), free(lat), free(ckv),
        free(kpe), free(q);
    return ok;
}

static const int32_t S_EDGES16[] = {1, 15, 16, 17, 33, 300};
static const int32_t S_EDGES64[] = {63, 64, 65, 129, 1000};
static const int32_t S_NOKEY[] = {0, 5, 100, 0};
static const int32_t S_LONG[] = {32768};

static void test_grid(void)
{
    /* seed, H, R, q_min, q_max, s_min, s_max, B, dtype, causal, splits, s_fixed, graph, spikes,
     * fp8 */
    const mcase cases[] = {
        {1, 16, 6, 1, 1, 0, 0, 16, KVA_DTYPE_BF16, 1, 0, S_EDGES16, 0, 0, 0},
        {2, 128, 2, 1, 2, 100, 700, 64, KVA_DTYPE_BF16, 1, 0, NULL, 1, 0, 0},
        {3, 3, 4, 1, 4, 0, 200, 64, KVA_DTYPE_BF16, 1, 0, NULL, 0, 0, 0},
        {4, 64, 5, 1, 1, 0, 0, 64, KVA_DTYPE_BF16, 1, 0, S_EDGES64, 0, 0, 0},
        {5, 16, 3, 1, 3, 0, 150, 16, KVA_DTYPE_F16, 1, 0, NULL, 0, 0, 0},
        {6, 1, 3, 1, 4, 0, 100, 16, KVA_DTYPE_BF16, 1, 0, NULL, 0, 0, 0},
        {7, 16, 2, 2, 2, 4000, 5000, 64, KVA_DTYPE_BF16, 1, 0, NULL, 1, 0, 0},
        {8, 16, 2, 1, 1, 900, 1100, 16, KVA_DTYPE_BF16, 1, 3, NULL, 0, 0, 0},
        {9, 16, 4, 1, 2, 0, 0, 16, KVA_DTYPE_BF16, 0, 0, S_NOKEY, 0, 0, 0},
        {10, 128, 1, 4, 4, 200, 300, 16, KVA_DTYPE_BF16, 1, 0, NULL, 0, 0, 0},
        {11, 63, 3, 1, 1, 1, 400, 64, KVA_DTYPE_BF16, 1, 0, NULL, 0, 0, 0},
        {12, 9, 5, 1, 3, 1, 300, 1, KVA_DTYPE_BF16, 1, 0, NULL, 0, 0, 0},
        {13, 16, 4, 4, 4, 1, 500, 64, KVA_DTYPE_BF16, 1, 0, NULL, 0, 0, 0},
        {14, 32, 3, 1, 1, 1, 800, 16, KVA_DTYPE_BF16, 1, 5, NULL, 0, 0, 0},
        {15, 16, 150, 1, 1, 1, 300, 64, KVA_DTYPE_BF16, 1, 0, NULL, 0, 0, 0},
        {16, 16, 1, 1, 1, 0, 0, 64, KVA_DTYPE_BF16, 1, 0, S_LONG, 0, 0, 0},
        {17, 8, 3, 1, 2, 1000, 3000, 64, KVA_DTYPE_F16, 1, 0, NULL, 0, 0, 0},
        {18, 128, 2, 2, 2, 1000, 2000, 64, KVA_DTYPE_BF16, 1, 0, NULL, 0, 0, 0},
        {19, 128, 3, 1, 2, 300, 900, 64, KVA_DTYPE_BF16, 1, 0, NULL, 0, 1, 0},
        {20, 64, 2, 1, 1, 1500, 2500, 16, KVA_DTYPE_F16, 1, 3, NULL, 0, 1, 0},
        /* FP8 E4M3 latent caches (the last field); the first four also run
         * under KVA_TEST_QUICK. */
        {21, 16, 6, 1, 1, 0, 0, 16, KVA_DTYPE_BF16, 1, 0, S_EDGES16, 0, 0, 1},
        {22, 128, 2, 1, 2, 100, 700, 64, KVA_DTYPE_BF16, 1, 0, NULL, 1, 0, 1},
        {23, 1, 3, 1, 2, 0, 100, 1, KVA_DTYPE_BF16, 1, 0, NULL, 0, 0, 1},
        {24, 16, 4, 1, 2, 0, 0, 16, KVA_DTYPE_F16, 0, 0, S_NOKEY, 0, 0, 1},
        {25, 128, 5, 1, 1, 0, 0, 64, KVA_DTYPE_F16, 1, 0, S_EDGES64, 0, 0, 1},
        {26, 16, 2, 1, 1, 900, 1100, 16, KVA_DTYPE_BF16, 1, 3, NULL, 0, 0, 1},
        {27, 64, 2, 1, 1, 1500, 2500, 16, KVA_DTYPE_BF16, 1, 3, NULL, 0, 1, 1},
        {28, 32, 3, 1, 1, 1, 800, 16, KVA_DTYPE_BF16, 1, 0, NULL, 0, 0, 1},
        {29, 16, 2, 2, 2, 3000, 4000, 64, KVA_DTYPE_BF16, 1, 0, NULL, 0, 0, 1},
    };
    const int n = (int)(sizeof cases / sizeof cases[0]);
    const int quick = getenv("KVA_TEST_QUICK") != NULL;
    int failed = 0, run = 0, fp8_run = 0;
    for (int i = 0; i < n; i++) {
        if (quick && !(i < 5 || (cases[i].fp8 && fp8_run < 4)))
            continue;
        fp8_run += cases[i].fp8;
        run++;
        mcase c = cases[i];
        if (c.s_fixed == S_EDGES16)
            c.R = 6;
        else if (c.s_fixed == S_EDGES64)
            c.R = 5;
        else if (c.s_fixed == S_NOKEY)
            c.R = 4;
        else if (c.s_fixed == S_LONG)
            c.R = 1;
        failed += !run_case(&c, 1);
    }
    CHECK_MSG(failed == 0, "%d of %d MLA cases failed", failed, run);
}

/* Two floats equal as the caches read them: the same bits, or both a NaN
 * that was written (an unwritten slot's 0xff codes read as NaN), never
 * kva_test_poison's bits, which both reads' outputs held before the call. */
static int same_f32(float a, float b)
{
    uint32_t ua, ub;
    memcpy(&ua, &a, 4);
    memcpy(&ub, &b, 4);
    if (ua == KVA_TEST_POISON32 || ub == KVA_TEST_POISON32)
        return 0;
    return (a != a && b != b) || ua == ub;
}

/* The FP8 E4M3 latent cache's write, read, copy and swap on the device
 * against the reference backend's, byte for byte. */
static void test_fp8_cache(void)
{
    kva_rng rng = {77};
    kva_context_desc gd = {KVA_BACKEND_CUDA, 0, 0}, rd = {KVA_BACKEND_REF, 1, 0};
    kva_context *gpu = NULL, *ref = NULL;
    CHECK_OK(kva_context_create(&gd, &gpu));
    CHECK_OK(kva_context_create(&rd, &ref));
    enum { NB = 6, BS = 16, T = 70 };
    const float ksc = 0.37f; /* 448 * 0.37 = 165.76: larger values saturate */
    const kva_quant_params qp = {.k_scale = &ksc, .k_scale_len = 1};
    const kva_cache_desc cd = {
        NB, BS, 1, DL, DC, KVA_DTYPE_FP8_E4M3, KVA_LAYOUT_NHD, KVA_QUANT_FP8_E4M3, KVA_ATTN_MLA};
    const size_t cbytes = (size_t)NB * BS * DL;
    /* Slots: a shuffled subset of the cache's, every 9th token padding (-1). */
    int64_t slots[T];
    int32_t perm[NB * BS];
    for (int32_t i = 0; i < NB * BS; i++)
        perm[i] = i;
    for (int32_t i = NB * BS - 1; i > 0; i--) {
        const int32_t j = kva_rng_int(&rng, 0, i), t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    for (int t = 0; t < T; t++)
        slots[t] = t % 9 == 4 ? -1 : perm[t];
    /* Values: normal * 60, every 7th element one of the edge values. */
    const float edge[] = {NAN,
                          -NAN,
                          INFINITY,
                          -INFINITY,
                          0.0f,
                          -0.0f,
                          1e9f,
                          -1e9f,
                          0.37f * 0x1p-9f,
                          0.37f * 0x1p-10f,
                          0.37f * 0x1.8p-9f,
                          165.76f,
                          171.f,
                          0.37f * 17.f,
                          0.37f * 19.f};
    const int ne = (int)(sizeof edge / sizeof edge[0]);
    float *x = malloc(sizeof(float) * T * DL);
    for (size_t i = 0; i < (size_t)T * DL; i++)
        x[i] = i % 7 == 3 ? edge[(i / 7) % ne] : (float)(kva_rng_normal(&rng) * 60.0);
    const kva_dtype src_dts[3] = {KVA_DTYPE_F32, KVA_DTYPE_F16, KVA_DTYPE_BF16};
    void *d_slots = dev_from(slots, sizeof slots);
    for (int sd = 0; sd < 3; sd++) {
        const kva_dtype st = src_dts[sd];
        const size_t es = kva_dtype_size(st);
        /* c_kv [T, DC] and k_pe [T, DR] of the same values, token strides
         * DC + 8 and DR + 8 (non-default). */
        const int64_t ks = DC + 8, vs = DR + 8;
        void *hk = malloc(es * T * ks), *hv = malloc(es * T * vs);
        memset(hk, 0, es * T * ks);
        memset(hv, 0, es * T * vs);
        for (int t = 0; t < T; t++)
            for (int e = 0; e < DL; e++) {
                if (e < DC)
                    kva__store_f(hk, st, (size_t)t * ks + e, x[(size_t)t * DL + e]);
                else
                    kva__store_f(hv, st, (size_t)t * vs + e - DC, x[(size_t)t * DL + e]);
            }
        kva_cache *dc = NULL, *hc = NULL;
        CHECK_OK(kva_cache_create_quant(gpu, &cd, &qp, &dc));
        CHECK_OK(kva_cache_create_quant(ref, &cd, &qp, &hc));
        if (!dc || !hc) {
            kva_cache_destroy(dc);
            kva_cache_destroy(hc);
            free(hk), free(hv);
            continue;
        }
        void *dk = NULL, *hkc = NULL, *dv = NULL;
        kva_cache_data(dc, &dk, &dv);
        kva_cache_data(hc, &hkc, NULL);
        CHECK(dv == dk);
        CHECK(kva_cache_block_bytes_k(dc) == (size_t)BS * DL && kva_cache_block_bytes_v(dc) == 0);
        dev_fill(dk, 0xa5, cbytes);
        memset(hkc, 0xa5, cbytes);
        void *d_k = dev_from(hk, es * T * ks), *d_v = dev_from(hv, es * T * vs);
        CHECK_OK(kva_cache_write(gpu, dc, T, d_k, ks, d_v, vs, st, d_slots));
        CHECK_OK(kva_cache_write(ref, hc, T, hk, ks, hv, vs, st, slots));
        uint8_t *got = malloc(cbytes);
        to_host(got, dk, cbytes);
        size_t bad = 0;
        for (size_t i = 0; i < cbytes; i++)
            if (got[i] != ((const uint8_t *)hkc)[i] && bad++ < 5)
                fprintf(stderr,
                        "  %s source: byte %zu (slot %zu, channel %zu): device 0x%02x, "
                        "host 0x%02x\n",
                        kva_dtype_name(st), i, i / DL, i % DL, got[i], ((const uint8_t *)hkc)[i]);
        CHECK_MSG(bad == 0, "%s source: %zu FP8 latent bytes differ from the host write",
                  kva_dtype_name(st), bad);
        /* A source dtype the write does not take: refused, nothing written. */
        CHECK_STATUS(kva_cache_write(gpu, dc, T, d_k, ks, d_v, vs, KVA_DTYPE_FP8_E4M3, d_slots),
                     KVA_STATUS_UNSUPPORTED);
        to_host(got, dk, cbytes);
        CHECK_MSG(memcmp(got, hkc, cbytes) == 0, "a refused write changed the cache");
        if (sd == 0) {
            /* kva_cache_read (f32: code * scale) against the host's read. */
            const int32_t n = T;
            float *rk = malloc(sizeof(float) * n * DC), *rv = malloc(sizeof(float) * n * DR);
            float *gk = malloc(sizeof(float) * n * DC), *gv = malloc(sizeof(float) * n * DR);
            int64_t rs[T];
            for (int t = 0; t < T; t++)
                rs[t] = slots[t] < 0 ? perm[t] : slots[t]; /* padding: an unwritten slot */
            void *d_rs = dev_from(rs, sizeof rs);
            /* Both sides poisoned with kva_test_poison's NaN (not 0xff
             * bytes): the expected values include NaN, read from the 0xff
             * codes of unwritten slots. */
            kva_test_poison(rk, KVA_DTYPE_F32, (size_t)n * DC);
            kva_test_poison(rv, KVA_DTYPE_F32, (size_t)n * DR);
            float *d_rk = dev_from(rk, sizeof(float) * n * DC);
            float *d_rv = dev_from(rv, sizeof(float) * n * DR);
            CHECK_OK(kva_cache_read(gpu, dc, n, d_rs, d_rk, 0, d_rv, 0, KVA_DTYPE_F32));
            CHECK_OK(kva_cache_read(ref, hc, n, rs, rk, 0, rv, 0, KVA_DTYPE_F32));
            to_host(gk, d_rk, sizeof(float) * n * DC);
            to_host(gv, d_rv, sizeof(float) * n * DR);
            size_t rbad = 0;
            for (size_t i = 0; i < (size_t)n * DC; i++)
                rbad += !same_f32(gk[i], rk[i]);
            for (size_t i = 0; i < (size_t)n * DR; i++)
                rbad += !same_f32(gv[i], rv[i]);
            CHECK_MSG(rbad == 0, "kva_cache_read: %zu values differ from the host's read", rbad);
            cudaFree(d_rs), cudaFree(d_rk), cudaFree(d_rv);
            free(rk), free(rv), free(gk), free(gv);
            /* copy_blocks inside the cache, then swap out to a host cache and
             * back in, as on the host. */
            const int32_t pairs[] = {0, 5, 2, 3, 1, 1};
            CHECK_OK(kva_cache_copy_blocks(gpu, dc, pairs, 3));
            CHECK_OK(kva_cache_copy_blocks(ref, hc, pairs, 3));
            to_host(got, dk, cbytes);
            CHECK_MSG(memcmp(got, hkc, cbytes) == 0, "copy_blocks differs from the host's");
            kva_cache *host = NULL;
            CHECK_OK(kva_cache_create_quant(ref, &cd, &qp, &host));
            if (host) {
                void *hh = NULL;
                kva_cache_data(host, &hh, NULL);
                memset(hh, 0x11, cbytes);
                const int32_t out_pairs[] = {5, 0, 3, 4}, in_pairs[] = {0, 1};
                CHECK_OK(kva_cache_swap_blocks(gpu, dc, host, out_pairs, 2));
                CHECK(memcmp((uint8_t *)hh, (uint8_t *)hkc + 5 * BS * DL, BS * DL) == 0);
                CHECK(memcmp((uint8_t *)hh + 4 * BS * DL, (uint8_t *)hkc + 3 * BS * DL, BS * DL) ==
                      0);
                CHECK(((uint8_t *)hh)[2 * BS * DL] == 0x11);
                CHECK_OK(kva_cache_swap_blocks(gpu, host, dc, in_pairs, 1));
                to_host(got, dk, cbytes);
                CHECK(memcmp(got + BS * DL, hh, BS * DL) == 0);
                kva_cache_destroy(host);
            }
        }
        free(got);
        cudaFree(d_k), cudaFree(d_v);
        free(hk), free(hv);
        kva_cache_destroy(dc);
        kva_cache_destroy(hc);
    }
    /* An MLA cache's values are its keys' columns: a v_scale is refused, and
     * so is a k_scale of 2 values (FP8 scales are per tensor or kv head). */
    const float two[2] = {0.5f, 0.5f};
    kva_quant_params bad = {.k_scale = &ksc, .k_scale_len = 1, .v_scale = &ksc, .v_scale_len = 1};
    kva_cache *fc = NULL;
    CHECK_STATUS(kva_cache_create_quant(gpu, &cd, &bad, &fc), KVA_STATUS_INVALID_ARGUMENT);
    CHECK(fc == NULL);
    bad = (kva_quant_params){.k_scale = two, .k_scale_len = 2};
    CHECK_STATUS(kva_cache_create_quant(gpu, &cd, &bad, &fc), KVA_STATUS_SHAPE_MISMATCH);
    CHECK(fc == NULL);
    cudaFree(d_slots);
    free(x);
    kva_context_destroy(ref);
    kva_context_destroy(gpu);
}

/* Every FP8 E4M3 code through the decode kernels' conversion, exactly: two
 * requests of one cached key each (q_len 1), so P is 1 and out is the key's
 * first 512 values times k_scale (a power of two: exact in bf16 and f16).
 * Request 0's row holds all 254 non-NaN codes (subnormals, zeros and 448
 * included, each at least twice); request 1's row is the same with NaN
 * codes (0x7f, 0xff) in it, so its logit and every output are NaN. H 16,
 * 32, 64 and 128 reach the 16-row kernel with Q in registers, the 32- and
 * 64-row mma kernels and the wgmma one (then mma forced), bf16 and f16. */
static void test_fp8_codes(void)
{
    const int32_t Hs[] = {16, 32, 64, 128}, B = 16, NB = 2;
    const float ksc = 0.0625f;
    const kva_quant_params qp = {.k_scale = &ksc, .k_scale_len = 1};
    uint8_t rows[NB * B * DL];
    memset(rows, 0, sizeof rows);
    for (int e = 0, k = 0; e < DL; e++, k = (k + 1) % 254) {
        const uint8_t code = (uint8_t)(k < 127 ? k : k + 1); /* 0x00-0x7e, 0x80-0xfe */
        rows[e] = code;
        rows[(size_t)B * DL + e] = code; /* request 1's row: slot B */
    }
    rows[(size_t)B * DL + 3] = 0x7f;
    rows[(size_t)B * DL + 300] = 0xff;
    for (int hi = 0; hi < 4; hi++)
        for (int di = 0; di < 2; di++) {
            const int32_t H = Hs[hi];
            const kva_dtype dt = di ? KVA_DTYPE_F16 : KVA_DTYPE_BF16;
            if (dt == KVA_DTYPE_F16 && (H == 32 || H == 128))
                continue;
            kva_context_desc gd = {KVA_BACKEND_CUDA, 0, 0};
            kva_context *gpu = NULL;
            CHECK_OK(kva_context_create(&gd, &gpu));
            const kva_cache_desc cd = {
                NB,          B, 1, DL, DC, KVA_DTYPE_FP8_E4M3, KVA_LAYOUT_NHD, KVA_QUANT_FP8_E4M3,
                KVA_ATTN_MLA};
            kva_cache *cache = NULL;
            CHECK_OK(kva_cache_create_quant(gpu, &cd, &qp, &cache));
            if (!cache) {
                kva_context_destroy(gpu);
                continue;
            }
            void *ck = NULL;
            kva_cache_data(cache, &ck, NULL);
            CHECK(cudaMemcpy(ck, rows, sizeof rows, cudaMemcpyHostToDevice) == cudaSuccess);
            const int32_t qsl[3] = {0, 1, 2}, sl[2] = {1, 1}, bt[2] = {0, 1};
            kva_plan_desc pd =
                kva_test_mla_desc(2, qsl, sl, bt, 1, B, H, DL, DC, dt, 1.0 / sqrt(192.0), 1);
            kva_rng rng = {77 + H};
            uint16_t *q = malloc(sizeof(uint16_t) * 2 * H * DL);
            kva_test_fill(q, dt, (size_t)2 * H * DL, &rng, 1.0);
            const size_t no = (size_t)2 * H * DC;
            void *d_q = dev_from(q, sizeof(uint16_t) * 2 * H * DL), *d_out = dev_poisoned(no * 2);
            uint16_t *out = malloc(no * 2);
            for (int pass = 0; pass < 2; pass++) {
                kva_plan *plan = NULL;
                CHECK_OK(kva_plan_create(gpu, &pd, &plan));
                if (!plan)
                    break;
                const int kernel = ((const kva__cuda_plan *)plan->device)->decode_kernel;
                /* A finite poison (0xbebe: -0.37 in bf16, -1.68 in f16), not NaN: token 1's
                 * row must become NaN, which an unwritten row would not. */
                dev_fill(d_out, 0xbe, no * 2);
                CHECK_OK(kva_attention_run(gpu, plan, d_q, cache, NULL, d_out, NULL));
                to_host(out, d_out, no * 2);
                size_t bad = 0;
                for (size_t i = 0; i < no; i++) {
                    const size_t tok = i / ((size_t)H * DC), c = i % DC;
                    const double a = to_d(out, dt, i);
                    const double want = (double)(kva_fp8_e4m3_to_f32(rows[c]) * ksc);
                    const int ok = tok == 0 ? a == want : a != a;
                    if (!ok && bad++ < 5)
                        fprintf(stderr, "  H %d %s %s: out[tok %zu, col %zu] = %.9g, want %.9g\n",
                                (int)H, kva_dtype_name(dt), kva__cuda_kernels[kernel].name, tok, c,
                                a, tok == 0 ? want : NAN);
                }
                CHECK_MSG(bad == 0, "FP8 codes: H %d %s %s: %zu outputs differ", (int)H,
                          kva_dtype_name(dt), kva__cuda_kernels[kernel].name, bad);
                kva_plan_destroy(plan);
                if (kernel != KVA__CUDA_K_MLA_DECODE_WGMMA)
                    break;
                CHECK_OK(kva__context_force_kernel(gpu, "mla_decode_mma_sm80"));
            }
            free(q), free(out);
            cudaFree(d_q), cudaFree(d_out);
            kva_cache_destroy(cache);
            kva_context_destroy(gpu);
        }
}

/* Bad input: a status, a message naming the problem, out untouched. */
static void test_bad_input(void)
{
    kva_context_desc gd = {KVA_BACKEND_CUDA, 0, 0};
    kva_context *gpu = NULL;
    CHECK_OK(kva_context_create(&gd, &gpu));
    const int32_t qsl[2] = {0, 1}, sl[1] = {5}, bt[1] = {0};
    kva_plan_desc pd = kva_test_mla_desc(1, qsl, sl, bt, 1, 16, 16, DL, DC, KVA_DTYPE_F32, 0.07, 1);
    kva_plan *plan = NULL;
    /* f32 q: the CUDA MLA kernel takes f16 and bf16. */
    CHECK_STATUS(kva_plan_create(gpu, &pd, &plan), KVA_STATUS_UNSUPPORTED);
    CHECK_ERROR_MENTIONS("MLA");
    CHECK(plan == NULL);
    /* Dc 256 + Dr 64: not the kernel's head sizes. */
    pd.q_dtype = KVA_DTYPE_BF16;
    pd.head_dim = 320;
    pd.head_dim_v = 256;
    CHECK_STATUS(kva_plan_create(gpu, &pd, &plan), KVA_STATUS_UNSUPPORTED);
    CHECK_ERROR_MENTIONS("576");
    /* An MHA plan of D 576 on CUDA: beyond the MHA kernels' head sizes. */
    pd.kind = KVA_ATTN_MHA;
    pd.head_dim = DL;
    pd.head_dim_v = DL;
    CHECK_STATUS(kva_plan_create(gpu, &pd, &plan), KVA_STATUS_UNSUPPORTED);
    CHECK(plan == NULL);
    /* An MLA cache under an MHA plan (D 128): kind mismatch at run time. */
    kva_cache_desc cd = {2,           16, 1, DL, DC, KVA_DTYPE_BF16, KVA_LAYOUT_NHD, KVA_QUANT_NONE,
                         KVA_ATTN_MLA};
    kva_cache *cache = NULL;
    CHECK_OK(kva_cache_create(gpu, &cd, &cache));
    pd.head_dim = 128;
    pd.head_dim_v = 128;
    CHECK_OK(kva_plan_create(gpu, &pd, &plan));
    void *d_q = dev_poisoned(16 * DL * 2), *d_out = dev_poisoned(16 * DL * 2);
    if (plan && cache) {
        CHECK_STATUS(kva_attention_run(gpu, plan, d_q, cache, NULL, d_out, NULL),
                     KVA_STATUS_SHAPE_MISMATCH);
        CHECK_ERROR_MENTIONS("kind");
        CHECK(dev_untouched(d_out));
    }
    kva_plan_destroy(plan);
    kva_cache_destroy(cache);
    cudaFree(d_q), cudaFree(d_out);
    kva_context_destroy(gpu);
}
#endif

int main(void)
{
    const int skip = cuda_test_skip();
    if (skip)
        return skip;
#ifdef KVA_HAVE_CUDA
    RUN(test_bad_input);
    RUN(test_fp8_cache);
    RUN(test_fp8_codes);
    RUN(test_grid);
#endif
    return kva_test_finish();
}
