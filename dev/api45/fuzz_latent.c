/*
 * fuzz_latent.c - api45's differential probe (dev/, not a test): random
 * batches for the latent kinds, run on the reference backend and on the CPU
 * backend with 1 and 3 threads, one cache shared by all three contexts:
 *   mode 0: dense MLA, kva_attention_run (absorbed, sinks) and kva_mla_run
 *           (layer level), causal or not, q_len 0 / seq_len 0 requests,
 *           decode_threshold 0..3, f32/f16/bf16 or an FP8 latent cache;
 *   mode 1: sparse MLA, random index lists (-1, duplicates, topk_length,
 *           wide strides, sinks), MIXED / SEPARATE, 16-bit / FP8 / fp8_ds_mla;
 *   mode 2: the indexer, 16-bit / FP8_TOKEN keys, FP8 index queries, K above
 *           and below the visible keys; rows compared by the logits they list.
 * Prints the cases whose results disagree beyond the dtype's tolerance, and
 * any call that fails on one backend only.
 *   gcc -O2 -Iinclude dev/api45/fuzz_latent.c -Lbuild -lkvattn \
 *       -Wl,-rpath,$PWD/build -lm -o /tmp/fz && /tmp/fz CASES SEED
 */
#include "kvattn.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t st = 88172645463325252ull;
static uint64_t rnd(void)
{
    st ^= st << 13;
    st ^= st >> 7;
    st ^= st << 17;
    return st;
}
static int ri(int n)
{
    return (int)(rnd() % (uint64_t)n);
}
static float rf(void)
{
    return (float)((rnd() >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}
static int pick(const int *v, int n)
{
    return v[ri(n)];
}

static void fill(void *p, kva_dtype dt, size_t n, float amp)
{
    for (size_t i = 0; i < n; i++) {
        float x = rf() * amp;
        if (dt == KVA_DTYPE_F32)
            ((float *)p)[i] = x;
        else if (dt == KVA_DTYPE_F16)
            ((uint16_t *)p)[i] = kva_f32_to_f16(x);
        else
            ((uint16_t *)p)[i] = kva_f32_to_bf16(x);
    }
}
static double ld(const void *p, kva_dtype dt, size_t i)
{
    if (dt == KVA_DTYPE_F32)
        return ((const float *)p)[i];
    if (dt == KVA_DTYPE_F16)
        return kva_f16_to_f32(((const uint16_t *)p)[i]);
    return kva_bf16_to_f32(((const uint16_t *)p)[i]);
}
static void poison(void *p, size_t bytes)
{
    memset(p, 0xff, bytes); /* NaN in every float dtype */
}

static kva_context *cx[3];
static const char *cxn[3] = {"ref", "cpu1", "cpu3"};

typedef struct batch {
    int R, T, B, nb, stride;
    int ql[8], sl[8], qsl[9];
    int *bt;
} batch;

static void make_batch(batch *b, int causal, int maxq, int maxs)
{
    b->R = 1 + ri(4);
    b->B = pick((const int[]){1, 3, 8, 16, 64}, 5);
    b->qsl[0] = 0;
    int blocks = 0, maxb = 1;
    for (int r = 0; r < b->R; r++) {
        b->ql[r] = ri(6) == 0 ? 0 : 1 + ri(maxq);
        b->sl[r] = ri(maxs + 1);
        if (ri(8) == 0)
            b->sl[r] = 0;
        if (causal && b->sl[r] < b->ql[r])
            b->sl[r] = b->ql[r] + ri(4);
        b->qsl[r + 1] = b->qsl[r] + b->ql[r];
        int n = (b->sl[r] + b->B - 1) / b->B;
        blocks += n;
        maxb = n > maxb ? n : maxb;
    }
    b->T = b->qsl[b->R];
    b->nb = blocks + 2;
    b->stride = maxb + ri(2);
    b->bt = malloc(sizeof(int) * (size_t)b->R * b->stride);
    int *perm = malloc(sizeof(int) * (size_t)b->nb);
    for (int i = 0; i < b->nb; i++)
        perm[i] = i;
    for (int i = b->nb - 1; i > 0; i--) {
        int j = ri(i + 1), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    int next = 0;
    for (int r = 0; r < b->R; r++)
        for (int k = 0; k < b->stride; k++)
            b->bt[r * b->stride + k] = k < (b->sl[r] + b->B - 1) / b->B ? perm[next++] : -1;
    free(perm);
}

static int64_t slot_of(const batch *b, int r, int j)
{
    return (int64_t)b->bt[r * b->stride + j / b->B] * b->B + j % b->B;
}

static size_t compared, nonzero;
static int cmp(const char *what, int cs, int be, const void *a, const void *g, kva_dtype dt,
               size_t n, double tol)
{
    double amax = 1e-30, worst = 0;
    size_t wi = 0;
    for (size_t i = 0; i < n; i++)
        amax = fmax(amax, fabs(ld(a, dt, i)));
    for (size_t i = 0; i < n; i++) {
        double x = ld(a, dt, i), y = ld(g, dt, i), e;
        compared++;
        nonzero += x != 0;
        if (isnan(x) || isnan(y))
            e = (isnan(x) && isnan(y)) ? 0 : INFINITY;
        else if (isinf(x) || isinf(y))
            e = x == y ? 0 : INFINITY;
        else
            e = fabs(x - y) / fmax(1.0, amax);
        if (e > worst) {
            worst = e;
            wi = i;
        }
    }
    if (worst > tol) {
        printf("case %d %s %s: worst %g at %zu (ref %g got %g)\n", cs, cxn[be], what, worst, wi,
               ld(a, dt, wi), ld(g, dt, wi));
        return 1;
    }
    return 0;
}

static double tol_of(kva_dtype dt)
{
    return dt == KVA_DTYPE_F32 ? 2e-5 : dt == KVA_DTYPE_F16 ? 4e-3 : 3e-2;
}

/* mode 0: dense MLA, absorbed and layer level */
static int case_dense(int cs)
{
    const kva_dtype dts[3] = {KVA_DTYPE_F32, KVA_DTYPE_F16, KVA_DTYPE_BF16};
    kva_dtype dt = dts[ri(3)];
    int fp8 = ri(4) == 0;
    int causal = ri(3) != 0;
    batch b;
    make_batch(&b, causal, ri(3) ? 3 : 9, ri(3) ? 40 : 300);
    int H = pick((const int[]){1, 2, 3, 16, 17}, 5);
    int Dc = pick((const int[]){16, 32, 64, 128}, 4), Dr = pick((const int[]){8, 16, 64}, 3);
    int Dn = pick((const int[]){8, 16, 32}, 3), Dv = pick((const int[]){8, 16, 24}, 3);
    kva_cache_desc cd = {b.nb,
                         b.B,
                         1,
                         Dc + Dr,
                         Dc,
                         fp8 ? KVA_DTYPE_FP8_E4M3 : dt,
                         KVA_LAYOUT_NHD,
                         fp8 ? KVA_QUANT_FP8_E4M3 : KVA_QUANT_NONE,
                         KVA_ATTN_MLA};
    float ks = 0.01f;
    kva_quant_params qp = {.k_scale = &ks, .k_scale_len = 1};
    kva_cache *c = NULL;
    if (kva_cache_create_quant(cx[1], &cd, fp8 ? &qp : NULL, &c) != KVA_STATUS_OK) {
        printf("case %d cache: %s\n", cs, kva_last_error());
        free(b.bt);
        return 1;
    }
    kva_dtype src = fp8 ? KVA_DTYPE_F32 : dt;
    size_t es = kva_dtype_size(dt), ses = kva_dtype_size(src);
    int nslots = b.nb * b.B;
    void *ckv = malloc((size_t)nslots * Dc * ses), *kpe = malloc((size_t)nslots * Dr * ses);
    int64_t *slots = malloc(sizeof(int64_t) * nslots);
    for (int i = 0; i < nslots; i++)
        slots[i] = i;
    fill(ckv, src, (size_t)nslots * Dc, 1.0f);
    fill(kpe, src, (size_t)nslots * Dr, 1.0f);
    kva_cache_write(cx[1], c, nslots, ckv, 0, kpe, 0, src, slots);
    int Tq = b.T > 0 ? b.T : 1;
    void *q = malloc((size_t)Tq * H * (Dc + Dr) * es),
         *ql = malloc((size_t)Tq * H * (Dn + Dr) * es);
    void *wuk = malloc((size_t)H * Dn * Dc * es), *wuv = malloc((size_t)H * Dc * Dv * es);
    fill(q, dt, (size_t)b.T * H * (Dc + Dr), 1.0f);
    fill(ql, dt, (size_t)b.T * H * (Dn + Dr), 1.0f);
    fill(wuk, dt, (size_t)H * Dn * Dc, 0.3f);
    fill(wuv, dt, (size_t)H * Dc * Dv, 0.3f);
    float *sinks = NULL;
    if (ri(3) == 0) {
        sinks = malloc(sizeof(float) * H);
        for (int h = 0; h < H; h++)
            sinks[h] = rf() * 2;
    }
    kva_plan_desc pd = {.num_requests = b.R,
                        .query_start_loc = b.qsl,
                        .seq_lens = b.sl,
                        .block_table = b.bt,
                        .block_table_stride = b.stride,
                        .block_size = b.B,
                        .decode_threshold = ri(4),
                        .num_heads = H,
                        .num_kv_heads = 1,
                        .head_dim = Dc + Dr,
                        .head_dim_v = Dc,
                        .q_dtype = dt,
                        .scale = 0.2f,
                        .causal = causal,
                        .window_left = -1,
                        .kind = KVA_ATTN_MLA,
                        .mla_qk_nope_head_dim = Dn,
                        .mla_v_head_dim = Dv};
    size_t no = (size_t)Tq * H * Dc, nl = (size_t)Tq * H * Dv;
    void *out[3], *lout[3];
    float *lse[3], *llse[3];
    int bad = 0;
    kva_status s0 = 0, s1 = 0;
    for (int e = 0; e < 3; e++) {
        out[e] = malloc(no * es);
        lout[e] = malloc(nl * es);
        lse[e] = malloc(sizeof(float) * Tq * H);
        llse[e] = malloc(sizeof(float) * Tq * H);
        poison(out[e], no * es);
        poison(lout[e], nl * es);
        poison(lse[e], sizeof(float) * Tq * H);
        poison(llse[e], sizeof(float) * Tq * H);
        kva_plan *p = NULL;
        kva_status s = kva_plan_create(cx[e], &pd, &p);
        if (s != KVA_STATUS_OK) {
            if (e == 0 || s != s0)
                printf("case %d %s plan: %s\n", cs, cxn[e], kva_last_error());
            s0 = s;
            bad |= e > 0;
            continue;
        }
        s = kva_attention_run(cx[e], p, q, c, sinks, out[e], lse[e]);
        if (s != KVA_STATUS_OK)
            printf("case %d %s run: %s\n", cs, cxn[e], kva_last_error()), bad = 1;
        s = kva_mla_run(cx[e], p, ql, wuk, wuv, c, lout[e], llse[e]);
        if (s != KVA_STATUS_OK && s != s1)
            printf("case %d %s mla_run: %s\n", cs, cxn[e], kva_last_error()), bad = 1;
        {
            /* lse NULL: the same out, byte for byte. */
            void *o2 = malloc(no * es), *l2 = malloc(nl * es);
            poison(o2, no * es);
            poison(l2, nl * es);
            if (kva_attention_run(cx[e], p, q, c, sinks, o2, NULL) != KVA_STATUS_OK ||
                (b.T > 0 && memcmp(o2, out[e], (size_t)b.T * H * Dc * es) != 0))
                printf("case %d %s attn lse NULL differs\n", cs, cxn[e]), bad = 1;
            if (s == KVA_STATUS_OK &&
                (kva_mla_run(cx[e], p, ql, wuk, wuv, c, l2, NULL) != KVA_STATUS_OK ||
                 (b.T > 0 && memcmp(l2, lout[e], (size_t)b.T * H * Dv * es) != 0)))
                printf("case %d %s mla_run lse NULL differs\n", cs, cxn[e]), bad = 1;
            free(o2), free(l2);
        }
        if (e == 0)
            s1 = s;
        kva_plan_destroy(p);
    }
    if (!bad && b.T > 0)
        for (int e = 1; e < 3; e++) {
            double tl = tol_of(dt);
            bad |= cmp("attn out", cs, e, out[0], out[e], dt, (size_t)b.T * H * Dc, tl);
            bad |= cmp("attn lse", cs, e, lse[0], lse[e], KVA_DTYPE_F32, (size_t)b.T * H, tl);
            if (s1 == KVA_STATUS_OK) {
                bad |= cmp("layer out", cs, e, lout[0], lout[e], dt, (size_t)b.T * H * Dv, tl * 2);
                bad |=
                    cmp("layer lse", cs, e, llse[0], llse[e], KVA_DTYPE_F32, (size_t)b.T * H, tl);
            }
        }
    if (bad)
        printf("  dense case %d: dt %s fp8 %d causal %d H %d Dc %d Dr %d Dn %d Dv %d B %d thr %d "
               "sinks %d R %d ql/sl %d/%d %d/%d %d/%d %d/%d\n",
               cs, kva_dtype_name(dt), fp8, causal, H, Dc, Dr, Dn, Dv, b.B, pd.decode_threshold,
               sinks != NULL, b.R, b.ql[0], b.sl[0], b.ql[1], b.sl[1], b.ql[2], b.sl[2], b.ql[3],
               b.sl[3]);
    for (int e = 0; e < 3; e++) {
        free(out[e]);
        free(lout[e]);
        free(lse[e]);
        free(llse[e]);
    }
    free(q), free(ql), free(wuk), free(wuv), free(sinks), free(ckv), free(kpe), free(slots);
    free(b.bt);
    kva_cache_destroy(c);
    return bad;
}

/* mode 1: sparse MLA */
static int case_sparse(int cs)
{
    const kva_dtype dts[3] = {KVA_DTYPE_F32, KVA_DTYPE_F16, KVA_DTYPE_BF16};
    kva_dtype dt = dts[ri(3)];
    int fmt = ri(3); /* 0 none, 1 fp8, 2 ds_mla */
    batch b;
    make_batch(&b, 0, ri(3) ? 3 : 9, ri(3) ? 40 : 300);
    int H = pick((const int[]){1, 2, 3, 16, 17, 64}, 6);
    int Dc = fmt == 2 ? pick((const int[]){128, 256}, 2) : pick((const int[]){16, 32, 64, 128}, 4);
    int Dr = pick((const int[]){8, 16, 64}, 3);
    int K = 1 + ri(ri(2) ? 8 : 70), spad = ri(3) ? 0 : ri(5);
    kva_cache_desc cd = {b.nb,
                         b.B,
                         1,
                         Dc + Dr,
                         Dc,
                         fmt ? KVA_DTYPE_FP8_E4M3 : dt,
                         KVA_LAYOUT_NHD,
                         fmt == 0   ? KVA_QUANT_NONE
                         : fmt == 1 ? KVA_QUANT_FP8_E4M3
                                    : KVA_QUANT_FP8_DS_MLA,
                         KVA_ATTN_MLA};
    float ks = 0.01f;
    kva_quant_params qp = {.k_scale = &ks, .k_scale_len = 1};
    kva_cache *c = NULL;
    if (kva_cache_create_quant(cx[1], &cd, fmt == 1 ? &qp : NULL, &c) != KVA_STATUS_OK) {
        printf("case %d cache: %s\n", cs, kva_last_error());
        free(b.bt);
        return 1;
    }
    kva_dtype src = fmt ? KVA_DTYPE_F32 : dt;
    size_t es = kva_dtype_size(dt), ses = kva_dtype_size(src);
    int nslots = b.nb * b.B;
    void *ckv = malloc((size_t)nslots * Dc * ses), *kpe = malloc((size_t)nslots * Dr * ses);
    int64_t *slots = malloc(sizeof(int64_t) * nslots);
    for (int i = 0; i < nslots; i++)
        slots[i] = i;
    fill(ckv, src, (size_t)nslots * Dc, 1.0f);
    fill(kpe, src, (size_t)nslots * Dr, 1.0f);
    kva_cache_write(cx[1], c, nslots, ckv, 0, kpe, 0, src, slots);
    int Tq = b.T > 0 ? b.T : 1, stride = K + spad;
    void *q = malloc((size_t)Tq * H * (Dc + Dr) * es);
    fill(q, dt, (size_t)b.T * H * (Dc + Dr), 1.0f);
    int32_t *idx = malloc(sizeof(int32_t) * (size_t)Tq * stride), *len = NULL;
    int uselen = ri(2);
    if (uselen)
        len = malloc(sizeof(int32_t) * Tq);
    for (int r = 0; r < b.R; r++)
        for (int t = b.qsl[r]; t < b.qsl[r + 1]; t++) {
            for (int k = 0; k < stride; k++) {
                int v = -1;
                if (b.sl[r] > 0 && ri(5) != 0)
                    v = ri(b.sl[r]);
                if (k > 0 && ri(6) == 0)
                    v = idx[(size_t)t * stride + k - 1];
                idx[(size_t)t * stride + k] = k < K ? v : 12345678;
            }
            if (len)
                len[t] = ri(K + 1);
        }
    float *sinks = NULL;
    if (ri(3) == 0) {
        sinks = malloc(sizeof(float) * H);
        for (int h = 0; h < H; h++)
            sinks[h] = rf() * 2;
    }
    kva_plan_desc pd = {.num_requests = b.R,
                        .query_start_loc = b.qsl,
                        .seq_lens = b.sl,
                        .block_table = b.bt,
                        .block_table_stride = b.stride,
                        .block_size = b.B,
                        .decode_threshold = ri(4),
                        .num_heads = H,
                        .num_kv_heads = 1,
                        .head_dim = Dc + Dr,
                        .head_dim_v = Dc,
                        .q_dtype = dt,
                        .scale = 0.1f,
                        .causal = ri(2),
                        .window_left = -1,
                        .kind = KVA_ATTN_MLA,
                        .sparse_topk = K,
                        .sparse_mode = ri(2)};
    size_t no = (size_t)Tq * H * Dc;
    void *out[3];
    float *lse[3];
    int bad = 0;
    for (int e = 0; e < 3; e++) {
        out[e] = malloc(no * es);
        lse[e] = malloc(sizeof(float) * Tq * H);
        poison(out[e], no * es);
        poison(lse[e], sizeof(float) * Tq * H);
        kva_plan *p = NULL;
        if (kva_plan_create(cx[e], &pd, &p) != KVA_STATUS_OK) {
            printf("case %d %s plan: %s\n", cs, cxn[e], kva_last_error());
            bad = 1;
            continue;
        }
        if (kva_mla_sparse_run(cx[e], p, q, c, idx, spad ? stride : 0, len, sinks, out[e],
                               lse[e]) != KVA_STATUS_OK)
            printf("case %d %s run: %s\n", cs, cxn[e], kva_last_error()), bad = 1;
        {
            void *o2 = malloc(no * es);
            poison(o2, no * es);
            if (kva_mla_sparse_run(cx[e], p, q, c, idx, spad ? stride : 0, len, sinks, o2, NULL) !=
                    KVA_STATUS_OK ||
                (b.T > 0 && memcmp(o2, out[e], (size_t)b.T * H * Dc * es) != 0))
                printf("case %d %s sparse lse NULL differs\n", cs, cxn[e]), bad = 1;
            free(o2);
        }
        kva_plan_destroy(p);
    }
    if (!bad && b.T > 0)
        for (int e = 1; e < 3; e++) {
            /* SEPARATE: the CPU backend reads prefill rows back as bf16 (kvattn.h). */
            double tl = pd.sparse_mode ? tol_of(KVA_DTYPE_BF16) : tol_of(dt);
            bad |= cmp("sparse out", cs, e, out[0], out[e], dt, (size_t)b.T * H * Dc, tl);
            bad |= cmp("sparse lse", cs, e, lse[0], lse[e], KVA_DTYPE_F32, (size_t)b.T * H, tl);
        }
    if (bad)
        printf("  sparse case %d: dt %s fmt %d H %d Dc %d Dr %d K %d pad %d B %d thr %d mode %d "
               "len %d sinks %d R %d ql/sl %d/%d %d/%d %d/%d %d/%d\n",
               cs, kva_dtype_name(dt), fmt, H, Dc, Dr, K, spad, b.B, pd.decode_threshold,
               pd.sparse_mode, uselen, sinks != NULL, b.R, b.ql[0], b.sl[0], b.ql[1], b.sl[1],
               b.ql[2], b.sl[2], b.ql[3], b.sl[3]);
    for (int e = 0; e < 3; e++)
        free(out[e]), free(lse[e]);
    free(q), free(idx), free(len), free(sinks), free(ckv), free(kpe), free(slots), free(b.bt);
    kva_cache_destroy(c);
    return bad;
}

/* mode 2: the indexer; CPU rows are checked against the reference's logits */
static int case_index(int cs)
{
    const kva_dtype dts[3] = {KVA_DTYPE_F32, KVA_DTYPE_F16, KVA_DTYPE_BF16};
    kva_dtype dt = dts[ri(3)];
    int fp8 = ri(2), qq = ri(2);
    batch b;
    make_batch(&b, 1, ri(3) ? 3 : 9, ri(3) ? 40 : 300);
    int Hi = pick((const int[]){1, 3, 8, 16}, 4), D = pick((const int[]){16, 32, 64, 128}, 4);
    int K = 1 + ri(ri(2) ? 8 : 70), spad = ri(3) ? 0 : ri(5), stride = K + spad;
    kva_cache_desc cd = {b.nb,
                         b.B,
                         1,
                         D,
                         0,
                         fp8 ? KVA_DTYPE_FP8_E4M3 : dt,
                         KVA_LAYOUT_NHD,
                         fp8 ? KVA_QUANT_FP8_TOKEN : KVA_QUANT_NONE,
                         KVA_ATTN_INDEX};
    kva_cache *c = NULL;
    if (kva_cache_create(cx[1], &cd, &c) != KVA_STATUS_OK) {
        printf("case %d cache: %s\n", cs, kva_last_error());
        free(b.bt);
        return 1;
    }
    kva_dtype src = fp8 ? KVA_DTYPE_F32 : dt;
    size_t es = kva_dtype_size(dt), ses = kva_dtype_size(src);
    int nslots = b.nb * b.B;
    void *keys = malloc((size_t)nslots * D * ses);
    int64_t *slots = malloc(sizeof(int64_t) * nslots);
    for (int i = 0; i < nslots; i++)
        slots[i] = i;
    fill(keys, src, (size_t)nslots * D, 1.0f);
    kva_cache_write(cx[1], c, nslots, keys, 0, NULL, 0, src, slots);
    float *kr = malloc(sizeof(float) * (size_t)nslots * D);
    kva_cache_read(cx[1], c, nslots, slots, kr, 0, NULL, 0, KVA_DTYPE_F32);
    int Tq = b.T > 0 ? b.T : 1;
    void *q = malloc((size_t)Tq * Hi * D * es);
    fill(q, dt, (size_t)b.T * Hi * D, 1.0f);
    float *w = malloc(sizeof(float) * (size_t)Tq * Hi);
    for (int i = 0; i < b.T * Hi; i++)
        w[i] = ri(8) == 0 ? 0.0f : rf();
    kva_plan_desc pd = {.num_requests = b.R,
                        .query_start_loc = b.qsl,
                        .seq_lens = b.sl,
                        .block_table = b.bt,
                        .block_table_stride = b.stride,
                        .block_size = b.B,
                        .decode_threshold = ri(4),
                        .num_heads = Hi,
                        .num_kv_heads = 1,
                        .head_dim = D,
                        .q_dtype = dt,
                        .causal = 1,
                        .window_left = -1,
                        .kind = KVA_ATTN_INDEX,
                        .sparse_topk = K,
                        .index_q_quant = qq ? KVA_QUANT_FP8_TOKEN : KVA_QUANT_NONE};
    int32_t *ind[3], *len[3];
    int bad = 0;
    for (int e = 0; e < 3; e++) {
        ind[e] = malloc(sizeof(int32_t) * (size_t)Tq * stride);
        len[e] = malloc(sizeof(int32_t) * Tq);
        memset(ind[e], 0x7b, sizeof(int32_t) * (size_t)Tq * stride);
        memset(len[e], 0x7b, sizeof(int32_t) * Tq);
        kva_plan *p = NULL;
        if (kva_plan_create(cx[e], &pd, &p) != KVA_STATUS_OK) {
            printf("case %d %s plan: %s\n", cs, cxn[e], kva_last_error());
            bad = 1;
            continue;
        }
        if (kva_indexer_run(cx[e], p, q, w, c, ind[e], spad ? stride : 0, len[e]) != KVA_STATUS_OK)
            printf("case %d %s run: %s\n", cs, cxn[e], kva_last_error()), bad = 1;
        kva_plan_destroy(p);
    }
    /* Logit of key j for token t (double, q as given: fp8 q only approximated). */
    if (!bad)
        for (int r = 0; r < b.R; r++)
            for (int i = 0; i < b.ql[r]; i++) {
                int t = b.qsl[r] + i, pos = b.sl[r] - b.ql[r] + i;
                int want = pos + 1 < K ? pos + 1 : K;
                for (int e = 0; e < 3; e++) {
                    if (len[e][t] != want) {
                        printf("case %d %s t %d topk_length %d want %d\n", cs, cxn[e], t, len[e][t],
                               want);
                        bad = 1;
                    }
                    for (int k = 0; k < stride; k++) {
                        int v = ind[e][(size_t)t * stride + k];
                        int ok = k >= K      ? v == 0x7b7b7b7b
                                 : k >= want ? v == -1
                                             : v >= 0 && v <= pos;
                        if (!ok) {
                            printf("case %d %s t %d entry %d = %d (want %d, pos %d)\n", cs, cxn[e],
                                   t, k, v, want, pos);
                            bad = 1;
                            break;
                        }
                    }
                }
                if (bad)
                    continue;
                /* CPU rows list keys whose logits match the reference's at every rank. */
                for (int k = 0; k < want; k++) {
                    double L[3], scale = 0;
                    for (int e = 0; e < 3; e++) {
                        int j = ind[e][(size_t)t * stride + k];
                        const float *kv = kr + slot_of(&b, r, j) * D;
                        double l = 0;
                        for (int h = 0; h < Hi; h++) {
                            double dot = 0, ad = 0;
                            for (int d = 0; d < D; d++) {
                                double qv = ld(q, dt, ((size_t)t * Hi + h) * D + d);
                                dot += qv * kv[d];
                                ad += fabs(qv * kv[d]);
                            }
                            l += w[t * Hi + h] * (dot > 0 ? dot : 0);
                            if (e == 0)
                                scale += fabs(w[t * Hi + h]) * ad;
                        }
                        L[e] = l;
                    }
                    double tl = (qq ? 0.15 : 1e-5) * fmax(scale, 1e-30);
                    compared++;
                    for (int e = 1; e < 3; e++)
                        if (fabs(L[e] - L[0]) > tl) {
                            printf("case %d %s t %d rank %d logit %g ref %g (tol %g)\n", cs, cxn[e],
                                   t, k, L[e], L[0], tl);
                            bad = 1;
                        }
                }
            }
    if (bad)
        printf("  index case %d: dt %s fp8 %d qq %d Hi %d D %d K %d pad %d B %d thr %d R %d "
               "ql/sl %d/%d %d/%d %d/%d %d/%d\n",
               cs, kva_dtype_name(dt), fp8, qq, Hi, D, K, spad, b.B, pd.decode_threshold, b.R,
               b.ql[0], b.sl[0], b.ql[1], b.sl[1], b.ql[2], b.sl[2], b.ql[3], b.sl[3]);
    for (int e = 0; e < 3; e++)
        free(ind[e]), free(len[e]);
    free(q), free(w), free(keys), free(kr), free(slots), free(b.bt);
    kva_cache_destroy(c);
    return bad;
}

int main(int argc, char **argv)
{
    int cases = argc > 1 ? atoi(argv[1]) : 300, bad = 0;
    int only = argc > 3 ? atoi(argv[3]) : -1;
    if (argc > 2)
        st += (uint64_t)atoll(argv[2]) * 0x9E3779B97F4A7C15ull;
    kva_backend be[3] = {KVA_BACKEND_REF, KVA_BACKEND_CPU, KVA_BACKEND_CPU};
    int th[3] = {1, 1, 3};
    for (int i = 0; i < 3; i++) {
        kva_context_desc d = {be[i], th[i], 0};
        if (kva_context_create(&d, &cx[i]) != KVA_STATUS_OK)
            return 2;
    }
    for (int cs = 0; cs < cases; cs++) {
        int mode = only >= 0 ? only : cs % 3;
        bad += mode == 0 ? case_dense(cs) : mode == 1 ? case_sparse(cs) : case_index(cs);
    }
    printf("%d cases, %d bad (%zu values compared, %zu nonzero)\n", cases, bad, compared, nonzero);
    for (int i = 0; i < 3; i++)
        kva_context_destroy(cx[i]);
    return bad != 0;
}
