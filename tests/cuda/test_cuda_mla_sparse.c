/*
 * test_cuda_mla_sparse.c - the CUDA sparse MLA (kva_mla_sparse_run) and the
 * device fp8_ds_mla cache, against values computed here from the definitions
 * in include/kvattn.h and kvattn_mla.h:
 *   - the fp8_ds_mla bytes of a device kva_cache_write equal those of a
 *     quantizer written here from the header's description (per 128-value
 *     tile s = max(amax / 448, FLT_MIN), codes fp8(x / s), then the 4
 *     float32 scales, then k_pe as bf16), and those of the host (reference
 *     backend) writer of the same rows;
 *   - kva_cache_read on the device returns code * s (f32) and k_pe exactly,
 *     leaves the rows of a -1 slot untouched; copy_blocks moves the bytes;
 *   - kva_mla_sparse_run against an fp64 reference over the exact
 *     dequantized rows (code * s, in double): per token its index list
 *     (random positions, -1 entries, duplicates counted twice, entries
 *     outside 0 .. seq_len - 1 treated as -1 as documented for CUDA),
 *     topk_length (NULL, random 0 .. K, 0, and values outside 0 .. K, which
 *     mean K on CUDA), sinks, a row with no entry (out 0, lse -inf or the
 *     sink); H in {1, 3, 16, 24, 48, 64, 96, 128} (mma.sync: 16-, 32- and
 *     64-row head tiles); decode tokens (q_len 1-4) and prefill
 *     tokens in one plan; MIXED and SEPARATE equal to the reference and to
 *     each other; fp8_ds_mla and bf16 / f16 latent caches; split and
 *     unsplit launches; every run also captured in a CUDA graph and
 *     replayed into poisoned outputs (the eager run's bits);
 *   - every case on both kernels of the MLA family (forced):
 *     mla_decode_mma_sm80 and, where usable, mla_decode_wgmma_sm90, whose
 *     64-row head tiles pad H 1 / 3 / 16 / 48 and which reads fp8_ds_mla
 *     rows as code * s rounded to the q dtype (its reference: the rows so
 *     rounded; MIXED and SEPARATE then also equal each other); two head
 *     tiles per token, the second partly used, over fp8_ds_mla with splits
 *     (H 96) and H 128 with f16 q; more items than the wgmma kernel's
 *     persistent CTAs (H 128 over 100 decode requests: 200 to 400 items,
 *     so CTAs run more than one and carry the ring's mbarrier phases from
 *     item to item); block sizes 1, 16, 64 and 48 (not a power of two: the
 *     block-table lookup's division). The quick set (the first six) holds
 *     H 96 and H 24 (mma.sync's 32-row tiles over fp8_ds_mla).
 * Tolerances (FlashMLA's, plus the rounding of P to the input dtype before
 * P V that every tensor-core kernel here does, as test_cuda_mla.c states):
 * out within 1e-3 + u max|v| + 2.01/128 |ref| (u = 2^-8 bf16, 2^-11 f16),
 * the cosine distance of the whole output at most 5e-6, lse within 2e-5
 * (fp32 scores, the hardware's exp2). Outputs are poisoned (NaN) before
 * every run; the cache is NaN-filled before the writes. KVA_TEST_QUICK=1
 * runs the first cases (compute-sanitizer). Exits 77 without a GPU.
 */
#include "cuda_util.h"

#include <float.h>

#ifdef KVA_HAVE_CUDA

#define DC 512
#define DR 64
#define DL (DC + DR)
#define ROWB 656 /* fp8_ds_mla bytes per token */

typedef struct scase {
    uint64_t seed;
    int32_t H, R, q_min, q_max; /* decode requests, q_len in [q_min, q_max] */
    int32_t P, pq;              /* prefill requests of pq tokens each */
    int32_t s_min, s_max, B, K;
    int fp8;       /* 1: fp8_ds_mla cache, 0: latent cache of the q dtype */
    kva_dtype dt;  /* q, out and source dtype */
    int sinks, tl; /* tl: 0 no topk_length, 1 random ones (with 0 and out-of-range) */
} scase;

/* Quantizes one row as the header defines fp8_ds_mla (written from the
 * description, not from the library): bytes[656] and the values it
 * dequantizes to (code * s, exact in double). */
static void quant_row(const float *ckv, const float *kpe, unsigned char *bytes, double *deq)
{
    for (int t = 0; t < DC / 128; t++) {
        float amax = 0.f;
        for (int i = 0; i < 128; i++)
            amax = fabsf(ckv[t * 128 + i]) > amax ? fabsf(ckv[t * 128 + i]) : amax;
        float s = amax / 448.0f;
        s = s > FLT_MIN ? s : FLT_MIN;
        memcpy(bytes + DC + 4 * t, &s, 4);
        for (int i = 0; i < 128; i++) {
            const uint8_t c = kva_f32_to_fp8_e4m3(ckv[t * 128 + i] / s);
            bytes[t * 128 + i] = c;
            deq[t * 128 + i] = (double)kva_fp8_e4m3_to_f32(c) * (double)s;
        }
    }
    for (int i = 0; i < DR; i++) {
        const uint16_t b = kva_f32_to_bf16(kpe[i]);
        memcpy(bytes + DC + 16 + 2 * i, &b, 2);
        deq[DC + i] = kva_bf16_to_f32(b);
    }
}

/* One token's fp64 reference: out [H, 512], lse [H]. */
static void reference(const double *q, const double *lat, const int32_t *idx, int32_t klen,
                      int32_t s, int32_t H, double scale, const float *sinks, double *out,
                      double *lse)
{
    double *sc = malloc(sizeof(double) * (size_t)(klen > 0 ? klen : 1));
    for (int32_t h = 0; h < H; h++) {
        double m = sinks ? sinks[h] : -INFINITY;
        for (int32_t j = 0; j < klen; j++) {
            const int32_t p = idx[j];
            sc[j] = -INFINITY;
            if (p < 0 || p >= s)
                continue;
            double acc = 0;
            for (int c = 0; c < DL; c++)
                acc += q[(size_t)h * DL + c] * lat[(size_t)p * DL + c];
            sc[j] = acc * scale;
            m = sc[j] > m ? sc[j] : m;
        }
        double *o = out + (size_t)h * DC, l = sinks && m > -INFINITY ? exp(sinks[h] - m) : 0;
        for (int c = 0; c < DC; c++)
            o[c] = 0;
        for (int32_t j = 0; j < klen; j++) {
            if (sc[j] == -INFINITY)
                continue;
            const double pj = exp(sc[j] - m);
            l += pj;
            for (int c = 0; c < DC; c++)
                o[c] += pj * lat[(size_t)idx[j] * DL + c];
        }
        for (int c = 0; c < DC; c++)
            o[c] = l > 0 ? o[c] / l : 0;
        lse[h] = l > 0 ? m + log(l) : -INFINITY;
    }
    free(sc);
}

/* Compares out/lse with the reference (and names the case); 1 if within tolerance. */
static int compare(const char *what, const scase *c, const void *out, const float *lse,
                   const double *ro, const double *rl, size_t n_out, size_t n_lse)
{
    const double atol = 1e-3 + (c->dt == KVA_DTYPE_F16 ? 0x1p-11 : 0x1p-8) * 1.7320508;
    size_t bad = 0, bad_lse = 0;
    double dot = 0, na = 0, nr = 0, max_err = 0, max_lse = 0;
    for (size_t i = 0; i < n_out; i++) {
        const double a = kva_test_get(out, c->dt, i), b = ro[i];
        if (!(fabs(a - b) <= atol + 2.01 / 128 * fabs(b)) && bad++ < 4)
            fprintf(stderr, "  %s out[%zu] (row %zu, col %zu): got %.6g, want %.6g\n", what, i,
                    i / DC, i % DC, a, b);
        max_err = fabs(a - b) > max_err || a != a ? fabs(a - b) : max_err;
        dot += a * b, na += a * a, nr += b * b;
    }
    for (size_t i = 0; i < n_lse; i++) {
        const double a = lse[i], b = rl[i];
        const int l_ok = isinf(b) ? a == b : fabs(a - b) <= 2e-5;
        if (!isinf(b))
            max_lse = fabs(a - b) > max_lse || a != a ? fabs(a - b) : max_lse;
        if (!l_ok && bad_lse++ < 4)
            fprintf(stderr, "  %s lse[%zu]: got %.9g, want %.9g\n", what, i, a, b);
    }
    const double cosd = na + nr > 0 ? 1.0 - 2.0 * dot / (na + nr) : 0.0;
    const int ok = bad == 0 && bad_lse == 0 && cosd <= 5e-6 && cosd == cosd;
    fprintf(stderr,
            "  %s seed=%llu H=%d K=%d %s %s sinks=%d tl=%d: out bad %zu (max err %.3g), cos "
            "dist %.3g, lse bad %zu (max %.3g)%s\n",
            what, (unsigned long long)c->seed, c->H, c->K, c->fp8 ? "fp8_ds_mla" : "16-bit",
            kva_dtype_name(c->dt), c->sinks, c->tl, bad, max_err, cosd, bad_lse, max_lse,
            ok ? "" : "  FAILED");
    return ok;
}

/* Runs one case; returns 1 if it passed. */
static int run_case(const scase *c)
{
    kva_rng rng = {c->seed};
    const int32_t R = c->R + c->P, H = c->H, B = c->B, K = c->K;
    int32_t *qsl = calloc((size_t)R + 1, sizeof(int32_t)), *sl = malloc(sizeof(int32_t) * R);
    int64_t *lat0 = malloc(sizeof(int64_t) * (R + 1));
    int32_t nb = 0, stride = 1;
    lat0[0] = 0;
    for (int32_t r = 0; r < R; r++) {
        const int32_t q = r < c->R ? kva_rng_int(&rng, c->q_min, c->q_max) : c->pq;
        qsl[r + 1] = qsl[r] + q;
        sl[r] = kva_rng_int(&rng, c->s_min, c->s_max) + q;
        lat0[r + 1] = lat0[r] + sl[r];
        const int32_t n = (sl[r] + B - 1) / B;
        nb += n;
        stride = n > stride ? n : stride;
    }
    const int32_t T = qsl[R], NB = nb + 3;
    const int64_t L = lat0[R];
    int32_t *perm = malloc(sizeof(int32_t) * NB), *bt = malloc(sizeof(int32_t) * R * stride);
    for (int32_t i = 0; i < NB; i++)
        perm[i] = i;
    for (int32_t i = NB - 1; i > 0; i--) {
        const int32_t j = kva_rng_int(&rng, 0, i), t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    for (int32_t r = 0, used = 0; r < R; r++) {
        const int32_t n = (sl[r] + B - 1) / B;
        for (int32_t k = 0; k < stride; k++)
            bt[(size_t)r * stride + k] = k < n ? perm[used + k] : -1;
        used += n;
    }
    /* Slots of every token, plus one -1 slot (padding) at the end. */
    int64_t *slots = malloc(sizeof(int64_t) * (size_t)(L + 1));
    for (int32_t r = 0; r < R; r++)
        for (int32_t j = 0; j < sl[r]; j++)
            slots[lat0[r] + j] = (int64_t)bt[(size_t)r * stride + j / B] * B + j % B;
    slots[L] = -1;

    /* Sources: c_kv [L, 512], k_pe [L, 64] in dt; q [T, H, 576]. */
    const kva_dtype dt = c->dt;
    const size_t es = kva_dtype_size(dt);
    void *ckv = malloc(es * (size_t)(L + 1) * DC), *kpe = malloc(es * (size_t)(L + 1) * DR);
    void *q = malloc(es * (size_t)T * H * DL);
    kva_test_fill_uniform(ckv, dt, (size_t)(L + 1) * DC, &rng);
    kva_test_fill_uniform(kpe, dt, (size_t)(L + 1) * DR, &rng);
    kva_test_fill(q, dt, (size_t)T * H * DL, &rng, 1.0);
    /* Expected bytes and values of every token's row. */
    unsigned char *bytes = malloc((size_t)L * ROWB + 1);
    double *lat = malloc(sizeof(double) * (size_t)(L + 1) * DL);
    for (int64_t j = 0; j < L; j++) {
        float fc[DC], fp[DR];
        for (int i = 0; i < DC; i++)
            fc[i] = (float)kva_test_get(ckv, dt, (size_t)j * DC + i);
        for (int i = 0; i < DR; i++)
            fp[i] = (float)kva_test_get(kpe, dt, (size_t)j * DR + i);
        if (c->fp8) {
            quant_row(fc, fp, bytes + j * ROWB, lat + j * DL);
        } else {
            for (int i = 0; i < DC; i++)
                lat[j * DL + i] = fc[i];
            for (int i = 0; i < DR; i++)
                lat[j * DL + DC + i] = fp[i];
        }
    }
    double *qd = malloc(sizeof(double) * (size_t)T * H * DL);
    for (size_t i = 0; i < (size_t)T * H * DL; i++)
        qd[i] = kva_test_get(q, dt, i);

    kva_context_desc gd = {KVA_BACKEND_CUDA, 0, 0};
    kva_context *gpu = NULL;
    CHECK_OK(kva_context_create(&gd, &gpu));
    kva_cache_desc cd = {NB,
                         B,
                         1,
                         DL,
                         DC,
                         c->fp8 ? KVA_DTYPE_FP8_E4M3 : dt,
                         KVA_LAYOUT_NHD,
                         c->fp8 ? KVA_QUANT_FP8_DS_MLA : KVA_QUANT_NONE,
                         KVA_ATTN_MLA};
    kva_cache *cache = NULL;
    CHECK_OK(kva_cache_create(gpu, &cd, &cache));
    if (!cache) {
        kva_context_destroy(gpu);
        return 0;
    }
    const size_t cbytes = (size_t)NB * kva_cache_block_bytes_k(cache);
    CHECK(cbytes == (size_t)NB * B * (c->fp8 ? ROWB : DL * es));
    void *ck = NULL;
    kva_cache_data(cache, &ck, NULL);
    dev_fill(ck, 0xff, cbytes);
    void *d_ckv = dev_from(ckv, es * (size_t)(L + 1) * DC);
    void *d_kpe = dev_from(kpe, es * (size_t)(L + 1) * DR);
    void *d_slots = dev_from(slots, sizeof(int64_t) * (size_t)(L + 1));
    CHECK_OK(kva_cache_write(gpu, cache, (int32_t)L + 1, d_ckv, 0, d_kpe, 0, dt, d_slots));
    int ok = 1;
    unsigned char *hc = malloc(cbytes);
    to_host(hc, ck, cbytes);
    if (c->fp8) {
        /* The bytes of every written row against the quantizer above ... */
        size_t bad = 0;
        for (int64_t j = 0; j < L; j++)
            bad += memcmp(hc + slots[j] * ROWB, bytes + j * ROWB, ROWB) != 0;
        CHECK_MSG(bad == 0, "%zu of %lld fp8_ds_mla rows differ from the header's quantizer", bad,
                  (long long)L);
        ok &= bad == 0;
        /* ... and the whole storage against the host writer's. */
        kva_context_desc rd = {KVA_BACKEND_REF, 1, 0};
        kva_context *ref = NULL;
        kva_cache *hcache = NULL;
        CHECK_OK(kva_context_create(&rd, &ref));
        CHECK_OK(kva_cache_create(ref, &cd, &hcache));
        if (hcache) {
            void *hk = NULL;
            kva_cache_data(hcache, &hk, NULL);
            memset(hk, 0xff, cbytes);
            CHECK_OK(kva_cache_write(ref, hcache, (int32_t)L + 1, ckv, 0, kpe, 0, dt, slots));
            CHECK_MSG(memcmp(hk, hc, cbytes) == 0,
                      "device and host fp8_ds_mla caches differ (byte-identical writes)");
        }
        kva_cache_destroy(hcache);
        kva_context_destroy(ref);
    }
    /* Read-back: every row (f32), the -1 slot's row untouched. */
    {
        float *d_k = dev_poisoned(sizeof(float) * (size_t)(L + 1) * DC);
        float *d_v = dev_poisoned(sizeof(float) * (size_t)(L + 1) * DR);
        CHECK_OK(
            kva_cache_read(gpu, cache, (int32_t)L + 1, d_slots, d_k, 0, d_v, 0, KVA_DTYPE_F32));
        float *hk = malloc(sizeof(float) * (size_t)(L + 1) * DC);
        float *hv = malloc(sizeof(float) * (size_t)(L + 1) * DR);
        to_host(hk, d_k, sizeof(float) * (size_t)(L + 1) * DC);
        to_host(hv, d_v, sizeof(float) * (size_t)(L + 1) * DR);
        size_t bad = 0;
        for (int64_t j = 0; j < L; j++) {
            for (int i = 0; i < DC; i++)
                bad += hk[j * DC + i] != (float)lat[j * DL + i];
            for (int i = 0; i < DR; i++)
                bad += hv[j * DR + i] != (float)lat[j * DL + DC + i];
        }
        for (int i = 0; i < DC; i++)
            bad += hk[L * DC + i] == hk[L * DC + i]; /* still NaN */
        CHECK_MSG(bad == 0, "kva_cache_read: %zu values differ", bad);
        ok &= bad == 0;
        free(hk), free(hv);
        cudaFree(d_k), cudaFree(d_v);
    }
    /* copy_blocks: request 0's first block onto a spare one, byte for byte. */
    {
        const int32_t pair[2] = {bt[0], perm[NB - 1]};
        const size_t bb = kva_cache_block_bytes_k(cache);
        CHECK_OK(kva_cache_copy_blocks(gpu, cache, pair, 1));
        unsigned char *a = malloc(bb), *b = malloc(bb);
        to_host(a, (char *)ck + (size_t)pair[0] * bb, bb);
        to_host(b, (char *)ck + (size_t)pair[1] * bb, bb);
        CHECK_MSG(memcmp(a, b, bb) == 0, "kva_cache_copy_blocks: the block's bytes differ");
        free(a), free(b);
    }

    /* Index lists [T, K] at stride K + 3, topk_length, sinks. */
    const int64_t istr = K + 3;
    int32_t *idx = malloc(sizeof(int32_t) * (size_t)T * istr);
    int32_t *tl = malloc(sizeof(int32_t) * T), *klen = malloc(sizeof(int32_t) * T);
    for (int32_t r = 0; r < R; r++)
        for (int32_t t = qsl[r]; t < qsl[r + 1]; t++) {
            int32_t *row = idx + (size_t)t * istr;
            for (int64_t j = 0; j < istr; j++) {
                const int32_t u = kva_rng_int(&rng, 0, 99);
                row[j] = u < 5    ? -1
                         : u < 8  ? sl[r] + kva_rng_int(&rng, 0, 5) /* past seq_len: unused */
                         : u < 10 ? -2 - kva_rng_int(&rng, 0, 5)    /* below -1: unused */
                         : u < 14 && j > 0 ? row[kva_rng_int(&rng, 0, (int32_t)j - 1)] /* dup */
                                           : kva_rng_int(&rng, 0, sl[r] - 1);
            }
            const int32_t u = kva_rng_int(&rng, 0, 9);
            tl[t] = u == 0 ? 0 : u == 1 ? -3 : u == 2 ? K + 5 : kva_rng_int(&rng, 1, K);
            klen[t] = !c->tl || tl[t] < 0 || tl[t] > K ? K : tl[t];
        }
    for (int64_t j = 0; j < K; j++) /* token 0 lists no key at all */
        idx[j] = j % 2 ? -1 : -7;
    float *sinks = malloc(sizeof(float) * H);
    for (int32_t h = 0; h < H; h++)
        sinks[h] = (float)(kva_rng_unit(&rng) * 4 - 2);
    const double scale = 1.0 / sqrt(192.0);
    const size_t no = (size_t)T * H * DC, nl = (size_t)T * H;
    double *ro = malloc(sizeof(double) * no), *rl = malloc(sizeof(double) * nl);
    for (int32_t r = 0; r < R; r++)
        for (int32_t t = qsl[r]; t < qsl[r + 1]; t++)
            reference(qd + (size_t)t * H * DL, lat + lat0[r] * DL, idx + (size_t)t * istr, klen[t],
                      sl[r], H, scale, c->sinks ? sinks : NULL, ro + (size_t)t * H * DC,
                      rl + (size_t)t * H);

    /* The separate mode reads fp8_ds_mla rows back in the q dtype (as vLLM
     * gathers bf16 for FlashMLA's sparse prefill): its prefill tokens'
     * reference uses those rounded values (ro_sep). The wgmma kernel reads
     * every fp8_ds_mla row so (code * s rounded to the q dtype, as FlashMLA's
     * sparse kernels): its reference is ro16 for every token. */
    double *ro_sep = malloc(sizeof(double) * no), *rl_sep = malloc(sizeof(double) * nl);
    double *ro16 = malloc(sizeof(double) * no), *rl16 = malloc(sizeof(double) * nl);
    memcpy(ro_sep, ro, sizeof(double) * no);
    memcpy(rl_sep, rl, sizeof(double) * nl);
    memcpy(ro16, ro, sizeof(double) * no);
    memcpy(rl16, rl, sizeof(double) * nl);
    if (c->fp8) {
        double *lat16 = malloc(sizeof(double) * (size_t)(L + 1) * DL);
        for (size_t i = 0; i < (size_t)L * DL; i++) {
            const float f = (float)lat[i];
            lat16[i] = dt == KVA_DTYPE_F16 ? kva_f16_to_f32(kva_f32_to_f16(f))
                                           : kva_bf16_to_f32(kva_f32_to_bf16(f));
        }
        for (int32_t r = 0; r < R; r++)
            for (int32_t t = qsl[r]; t < qsl[r + 1]; t++)
                reference(qd + (size_t)t * H * DL, lat16 + lat0[r] * DL, idx + (size_t)t * istr,
                          klen[t], sl[r], H, scale, c->sinks ? sinks : NULL,
                          ro16 + (size_t)t * H * DC, rl16 + (size_t)t * H);
        for (int32_t t = qsl[c->R]; t < T; t++) { /* the prefill tokens */
            memcpy(ro_sep + (size_t)t * H * DC, ro16 + (size_t)t * H * DC, sizeof(double) * H * DC);
            memcpy(rl_sep + (size_t)t * H, rl16 + (size_t)t * H, sizeof(double) * H);
        }
        free(lat16);
    }

    void *d_q = dev_from(q, es * (size_t)T * H * DL);
    void *d_idx = dev_from(idx, sizeof(int32_t) * (size_t)T * istr);
    void *d_tl = c->tl ? dev_from(tl, sizeof(int32_t) * T) : NULL;
    void *d_sinks = c->sinks ? dev_from(sinks, sizeof(float) * H) : NULL;
    void *d_out = dev_poisoned(no * es), *d_lse = dev_poisoned(sizeof(float) * nl);
    void *outs[2] = {malloc(no * es), malloc(no * es)};
    float *lses[2] = {malloc(sizeof(float) * nl), malloc(sizeof(float) * nl)};
    /* Both kernels of the MLA family: mma.sync (16/32/64-row head tiles) and,
     * where this build and device have it, the wgmma body (64-row tiles). */
    static const char *const kernels[2] = {"mla_decode_mma_sm80", "mla_decode_wgmma_sm90"};
    for (int kn = 0; kn < 2; kn++) {
        const kva_status fs = kva__context_force_kernel(gpu, kernels[kn]);
        if (fs == KVA_STATUS_UNSUPPORTED)
            continue;
        CHECK_OK(fs);
        const int wg = kn == 1;
        fprintf(stderr, " kernel %s\n", kernels[kn]);
        for (int mode = 0; mode < 2; mode++) {
            kva_plan_desc pd =
                kva_test_mla_desc(R, qsl, sl, bt, stride, B, H, DL, DC, dt, scale, 0);
            pd.sparse_topk = K;
            pd.sparse_mode = mode ? KVA_SPARSE_SEPARATE : KVA_SPARSE_MIXED;
            kva_plan *plan = NULL;
            CHECK_OK(kva_plan_create(gpu, &pd, &plan));
            if (!plan) {
                ok = 0;
                continue;
            }
            dev_fill(d_out, 0xff, no * es);
            dev_fill(d_lse, 0xff, sizeof(float) * nl);
            CHECK_OK(kva_mla_sparse_run(gpu, plan, d_q, cache, d_idx, istr, d_tl, d_sinks, d_out,
                                        d_lse));
            to_host(outs[mode], d_out, no * es);
            to_host(lses[mode], d_lse, sizeof(float) * nl);
            ok &= compare(mode ? "separate" : "mixed", c, outs[mode], lses[mode],
                          wg && c->fp8 ? ro16
                          : mode       ? ro_sep
                                       : ro,
                          wg && c->fp8 ? rl16
                          : mode       ? rl_sep
                                       : rl,
                          no, nl);
            /* The same run captured in a CUDA graph (capture fails on any host
             * sync) and replayed into poisoned outputs: the eager run's bits. */
            {
                cu_graph g;
                graph_begin(gpu, &g);
                CHECK_OK(kva_mla_sparse_run(gpu, plan, d_q, cache, d_idx, istr, d_tl, d_sinks,
                                            d_out, d_lse));
                graph_end(gpu, &g);
                dev_fill(d_out, 0xff, no * es);
                dev_fill(d_lse, 0xff, sizeof(float) * nl);
                graph_replay(&g);
                unsigned char *o2 = malloc(no * es);
                float *l2 = malloc(sizeof(float) * nl);
                to_host(o2, d_out, no * es);
                to_host(l2, d_lse, sizeof(float) * nl);
                const int same = memcmp(o2, outs[mode], no * es) == 0 &&
                                 memcmp(l2, lses[mode], sizeof(float) * nl) == 0;
                CHECK_MSG(same, "seed %llu %s %s: graph replay differs from the eager run",
                          (unsigned long long)c->seed, kernels[kn], mode ? "separate" : "mixed");
                ok &= same;
                free(o2), free(l2);
                graph_free(&g);
            }
            kva_plan_destroy(plan);
        }
        /* Over 16-bit caches, and over any cache on the wgmma kernel, both modes
         * read the same values: they agree with each other as with the
         * reference. */
        if (!c->fp8 || wg) {
            double *o0 = malloc(sizeof(double) * no), *l0 = malloc(sizeof(double) * nl);
            for (size_t i = 0; i < no; i++)
                o0[i] = kva_test_get(outs[0], dt, i);
            for (size_t i = 0; i < nl; i++)
                l0[i] = lses[0][i];
            ok &= compare("separate vs mixed", c, outs[1], lses[1], o0, l0, no, nl);
            free(o0), free(l0);
        }
    }
    CHECK(ok);
    kva_cache_destroy(cache);
    kva_context_destroy(gpu);
    cudaFree(d_ckv), cudaFree(d_kpe), cudaFree(d_slots), cudaFree(d_q), cudaFree(d_idx);
    cudaFree(d_tl), cudaFree(d_sinks), cudaFree(d_out), cudaFree(d_lse);
    free(outs[0]), free(outs[1]), free(lses[0]), free(lses[1]), free(ro), free(rl);
    free(ro_sep), free(rl_sep), free(ro16), free(rl16);
    free(idx), free(tl), free(klen), free(sinks), free(qd), free(lat), free(bytes), free(q);
    free(ckv), free(kpe), free(slots), free(perm), free(bt), free(qsl), free(sl), free(lat0),
        free(hc);
    return ok;
}

static void test_grid(void)
{
    const scase cases[] = {
        /* seed, H, R, q_min, q_max, P, pq, s_min, s_max, B, K, fp8, dt, sinks, tl */
        {1, 16, 5, 1, 4, 2, 24, 100, 3000, 64, 256, 1, KVA_DTYPE_BF16, 1, 1},
        {2, 1, 3, 1, 2, 1, 9, 50, 400, 16, 64, 1, KVA_DTYPE_BF16, 0, 1},
        {3, 3, 3, 1, 4, 1, 6, 10, 300, 1, 128, 0, KVA_DTYPE_BF16, 1, 0},
        {4, 64, 2, 1, 2, 1, 8, 500, 2000, 64, 512, 1, KVA_DTYPE_BF16, 1, 1},
        {10, 96, 3, 1, 3, 1, 8, 300, 2000, 64, 512, 1, KVA_DTYPE_BF16, 1, 1},
        {12, 24, 3, 1, 3, 1, 7, 200, 1500, 64, 512, 1, KVA_DTYPE_BF16, 1, 1},
        {5, 128, 2, 1, 2, 1, 6, 1000, 4000, 64, 2048, 1, KVA_DTYPE_BF16, 0, 1},
        {6, 16, 4, 1, 4, 1, 12, 100, 1000, 16, 256, 1, KVA_DTYPE_F16, 1, 1},
        {7, 128, 3, 2, 2, 0, 0, 200, 900, 64, 256, 0, KVA_DTYPE_BF16, 1, 1},
        {8, 48, 40, 1, 1, 0, 0, 100, 800, 64, 128, 1, KVA_DTYPE_BF16, 1, 0},
        {9, 16, 1, 1, 1, 1, 64, 3000, 6000, 64, 2048, 1, KVA_DTYPE_BF16, 1, 1},
        {11, 128, 2, 1, 4, 1, 5, 100, 1500, 16, 256, 1, KVA_DTYPE_F16, 0, 1},
        {13, 16, 6, 1, 2, 1, 10, 200, 2500, 48, 512, 1, KVA_DTYPE_BF16, 1, 1},
        {14, 128, 100, 1, 2, 0, 0, 200, 900, 64, 128, 1, KVA_DTYPE_BF16, 1, 1},
    };
    const int n = (int)(sizeof cases / sizeof cases[0]);
    const int run = getenv("KVA_TEST_QUICK") != NULL ? 6 : n;
    int failed = 0;
    for (int i = 0; i < run; i++)
        failed += !run_case(&cases[i]);
    CHECK_MSG(failed == 0, "%d of %d sparse MLA cases failed", failed, run);
}

/* Bad input: a status and message; out and the caches untouched. */
static void test_bad_input(void)
{
    kva_context_desc gd = {KVA_BACKEND_CUDA, 0, 0};
    kva_context *gpu = NULL;
    CHECK_OK(kva_context_create(&gd, &gpu));
    const int32_t qsl[2] = {0, 1}, sl[1] = {5}, bt[1] = {0};
    kva_plan_desc pd = kva_test_mla_desc(1, qsl, sl, bt, 1, 16, 16, DL, DC, KVA_DTYPE_F32, 0.07, 0);
    pd.sparse_topk = 8;
    kva_plan *plan = NULL;
    /* f32 q: the CUDA sparse kernel takes f16 and bf16. */
    CHECK_STATUS(kva_plan_create(gpu, &pd, &plan), KVA_STATUS_UNSUPPORTED);
    CHECK(plan == NULL);
    /* A bf16 latent cache under an f16 plan: refused by the API's checks. */
    pd.q_dtype = KVA_DTYPE_F16;
    CHECK_OK(kva_plan_create(gpu, &pd, &plan));
    kva_cache_desc cd = {2,           16, 1, DL, DC, KVA_DTYPE_BF16, KVA_LAYOUT_NHD, KVA_QUANT_NONE,
                         KVA_ATTN_MLA};
    kva_cache *cache = NULL;
    CHECK_OK(kva_cache_create(gpu, &cd, &cache));
    void *d_q = dev_poisoned(16 * DL * 2), *d_out = dev_poisoned(16 * DC * 2);
    int32_t *d_idx = dev_from((int32_t[8]){0, 1, 2, 3, 4, -1, -1, -1}, 8 * sizeof(int32_t));
    if (plan && cache) {
        CHECK_STATUS(kva_mla_sparse_run(gpu, plan, d_q, cache, d_idx, 8, NULL, NULL, d_out, NULL),
                     KVA_STATUS_DTYPE_MISMATCH);
        CHECK(dev_untouched(d_out));
    }
    kva_plan_destroy(plan);
    kva_cache_destroy(cache);
    /* kva_cache_read of a quantized MHA cache: not on the device. */
    kva_cache_desc md = {
        2, 16, 2, 64, 64, KVA_DTYPE_I8, KVA_LAYOUT_NHD, KVA_QUANT_INT8_CHANNEL, KVA_ATTN_MHA};
    float ones[128];
    for (int i = 0; i < 128; i++)
        ones[i] = 1.f;
    kva_quant_params qp = {ones, 128, NULL, 0, ones, 128, NULL, 0};
    CHECK_OK(kva_cache_create_quant(gpu, &md, &qp, &cache));
    int64_t *d_slot = dev_from((int64_t[1]){3}, sizeof(int64_t));
    if (cache) {
        CHECK_STATUS(kva_cache_read(gpu, cache, 1, d_slot, d_out, 0, NULL, 0, KVA_DTYPE_F16),
                     KVA_STATUS_UNSUPPORTED);
        CHECK(dev_untouched(d_out));
    }
    kva_cache_destroy(cache);
    cudaFree(d_q), cudaFree(d_out), cudaFree(d_idx), cudaFree(d_slot);
    kva_context_destroy(gpu);
}

/* kva_cache_read of unquantized MHA caches (NHD and HND) returns what was
 * written, converted to the destination dtype. */
static void test_read_mha(void)
{
    kva_context_desc gd = {KVA_BACKEND_CUDA, 0, 0};
    kva_context *gpu = NULL;
    CHECK_OK(kva_context_create(&gd, &gpu));
    kva_rng rng = {77};
    for (int layout = 0; layout < 2; layout++) {
        const int32_t T = 37, Hkv = 2, D = 64, Dv = 32;
        kva_cache_desc d = {
            8, 16, Hkv, D, Dv, KVA_DTYPE_BF16, (kva_layout)layout, KVA_QUANT_NONE, KVA_ATTN_MHA};
        kva_cache *cache = NULL;
        CHECK_OK(kva_cache_create(gpu, &d, &cache));
        uint16_t *k = malloc(2 * T * Hkv * D), *v = malloc(2 * T * Hkv * Dv);
        kva_test_fill(k, KVA_DTYPE_BF16, (size_t)T * Hkv * D, &rng, 1.0);
        kva_test_fill(v, KVA_DTYPE_BF16, (size_t)T * Hkv * Dv, &rng, 1.0);
        int64_t slots[37];
        for (int32_t t = 0; t < T; t++)
            slots[t] = (t * 7 + 3) % 128;
        void *d_k = dev_from(k, 2 * T * Hkv * D), *d_v = dev_from(v, 2 * T * Hkv * Dv);
        void *d_s = dev_from(slots, sizeof slots);
        float *d_rk = dev_poisoned(4 * T * Hkv * D), *d_rv = dev_poisoned(4 * T * Hkv * Dv);
        if (cache) {
            CHECK_OK(kva_cache_write(gpu, cache, T, d_k, 0, d_v, 0, KVA_DTYPE_BF16, d_s));
            CHECK_OK(kva_cache_read(gpu, cache, T, d_s, d_rk, 0, d_rv, 0, KVA_DTYPE_F32));
        }
        float *rk = malloc(4 * T * Hkv * D), *rv = malloc(4 * T * Hkv * Dv);
        to_host(rk, d_rk, 4 * T * Hkv * D);
        to_host(rv, d_rv, 4 * T * Hkv * Dv);
        size_t bad = 0;
        for (size_t i = 0; i < (size_t)T * Hkv * D; i++)
            bad += rk[i] != kva_bf16_to_f32(k[i]);
        for (size_t i = 0; i < (size_t)T * Hkv * Dv; i++)
            bad += rv[i] != kva_bf16_to_f32(v[i]);
        CHECK_MSG(bad == 0, "MHA read-back (layout %d): %zu values differ", layout, bad);
        kva_cache_destroy(cache);
        free(k), free(v), free(rk), free(rv);
        cudaFree(d_k), cudaFree(d_v), cudaFree(d_s), cudaFree(d_rk), cudaFree(d_rv);
    }
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
    RUN(test_read_mha);
    RUN(test_grid);
#endif
    return kva_test_finish();
}
