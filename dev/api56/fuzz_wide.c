/*
 * fuzz_wide.c - api56's differential probe (dev/, not a test): api48's
 * dev/api48/fuzz_combo.c (every MHA cache format, masks, trees, cascades,
 * plan updates, ragged runs, DCP shards, CPU against the reference) over
 * the shapes it left out: D and Dv anywhere from 8 to 576 (SIMD tails),
 * up to 4 kv heads and GQA groups up to 16, with the CPU backend's decode
 * and prefill kernels forced at random per case (kva__context_force_kernel,
 * so linked against the static library), and batches of up to 8 requests
 * whose leading blocks follow a binary trie (up to 4 levels) in half the
 * cases: nested shared prefixes for the cascade's grouping.
 *   gcc -O2 -Iinclude dev/api56/fuzz_wide.c build/libkvattn.a -fopenmp -lcrypto -lxxhash \
 *       -lcjson -lm -o /tmp/api56_wide && /tmp/api56_wide CASES SEED
 */
#include "kvattn.h"
kva_status kva__context_force_kernel(kva_context *ctx, const char *name);
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

#define MAXR 8
#define MAXBT 128

typedef struct cs {
    int R, B, hkv, H, D, Dv, causal, window, chunk, alibi, sinks, thr, tree, tree_packed, cascade;
    float softcap;
    kva_dtype dt, cdt;
    kva_layout lay;
    kva_quant quant;
    int sl_len[3]; /* INT8_CHANNEL / FP8 scale array lengths: k, v, offsets (0 none) */
    int32_t qsl[MAXR + 1], sl[MAXR], bt[MAXR * MAXBT], stride, NB, T;
    int32_t parents[MAXR * 8];
    uint8_t mask[MAXR * 8];
    float slopes[64], sk[64];
    float kscale[2304], vscale[2304], koff[2304], voff[2304];
} cs;

static kva_plan_desc desc_of(cs *c)
{
    kva_plan_desc d = {0};
    d.num_requests = c->R;
    d.query_start_loc = c->qsl;
    d.seq_lens = c->sl;
    d.block_table = c->bt;
    d.block_table_stride = c->stride;
    d.block_size = c->B;
    d.decode_threshold = c->thr;
    d.num_heads = c->H;
    d.num_kv_heads = c->hkv;
    d.head_dim = c->D;
    d.head_dim_v = c->Dv;
    d.q_dtype = c->dt;
    d.causal = c->causal;
    d.window_left = c->window;
    d.softcap = c->softcap;
    d.alibi_slopes = c->alibi ? c->slopes : NULL;
    d.attention_chunk = c->chunk;
    if (c->tree) {
        if (c->tree_packed)
            d.tree_mask = c->mask;
        else
            d.tree_parents = c->parents;
    }
    d.cascade = c->cascade;
    return d;
}

static kva_quant_params params_of(cs *c)
{
    kva_quant_params p = {0};
    if (c->quant == KVA_QUANT_INT8_CHANNEL || c->quant == KVA_QUANT_FP8_E4M3) {
        p.k_scale = c->kscale;
        p.k_scale_len = c->sl_len[0];
    }
    if (c->quant == KVA_QUANT_INT8_CHANNEL || c->quant == KVA_QUANT_INT8_TOKEN_K ||
        c->quant == KVA_QUANT_FP8_E4M3) {
        p.v_scale = c->vscale;
        p.v_scale_len = c->sl_len[1];
    }
    if (c->sl_len[2] &&
        (c->quant == KVA_QUANT_INT8_CHANNEL || c->quant == KVA_QUANT_INT8_TOKEN_K)) {
        if (c->quant == KVA_QUANT_INT8_CHANNEL) {
            p.k_offset = c->koff;
            p.k_offset_len = c->sl_len[2];
        }
        p.v_offset = c->voff;
        p.v_offset_len = c->sl_len[2];
    }
    return p;
}

/* A cache of c's format holding kf / vf (f32 [NB*B, Hkv, D|Dv]) in slot order. */
static kva_cache *make_cache(kva_context *ctx, cs *c, int NB, const float *kf, const float *vf,
                             const int64_t *slots, int ntok)
{
    kva_cache_desc cd = {NB, c->B, c->hkv, c->D, c->Dv, c->cdt, c->lay, c->quant, 0};
    kva_quant_params p = params_of(c);
    kva_cache *cache = NULL;
    kva_status s = kva_cache_create_quant(ctx, &cd, c->quant ? &p : NULL, &cache);
    if (s) {
        printf("cache_create: %s %s\n", kva_status_name(s), kva_last_error());
        return NULL;
    }
    s = kva_cache_write(ctx, cache, ntok, kf, 0, vf, 0, KVA_DTYPE_F32, slots);
    if (s) {
        printf("cache_write: %s %s\n", kva_status_name(s), kva_last_error());
        kva_cache_destroy(cache);
        return NULL;
    }
    return cache;
}

static void gen(cs *c)
{
    memset(c, 0, sizeof *c);
    c->R = 1 + ri(MAXR);
    c->B = 1 + ri(8);
    static const int groups[8] = {1, 2, 3, 4, 5, 7, 8, 16};
    c->hkv = 1 + ri(4);
    c->H = c->hkv * groups[ri(8)];
    if (c->H > 64)
        c->H = c->hkv * 8;
    c->D = ri(3) ? 8 * (1 + ri(72)) : 8 * (1 + ri(4));
    c->Dv = ri(2) ? c->D : 8 * (1 + ri(72));
    c->causal = ri(4) != 0;
    c->tree = c->causal && ri(4) == 0;
    c->tree_packed = ri(2);
    c->window = !c->tree && ri(3) == 0 ? ri(8) : -1;
    c->chunk = (c->causal && !c->tree && ri(4) == 0) ? 1 + ri(6) : 0;
    c->softcap = ri(4) == 0 ? 2.0f + ri(5) : 0.0f;
    c->alibi = !c->tree && ri(4) == 0;
    c->sinks = ri(3) == 0;
    c->thr = ri(3);
    c->dt = (kva_dtype)ri(3);
    c->lay = (kva_layout)ri(2);
    c->quant = (kva_quant)ri(5);
    c->cdt = c->quant == KVA_QUANT_NONE               ? c->dt
             : c->quant == KVA_QUANT_INT8_TOKEN_K_V16 ? (kva_dtype)(1 + ri(2))
             : c->quant == KVA_QUANT_FP8_E4M3         ? KVA_DTYPE_FP8_E4M3
                                                      : KVA_DTYPE_I8;
    if (c->quant == KVA_QUANT_INT8_TOKEN_K_V16 || c->quant == KVA_QUANT_FP8_E4M3)
        c->Dv = c->D; /* keep shapes simple for the per-channel arrays */
    const int lens_i8[3] = {1, c->hkv, c->hkv * c->D};
    c->sl_len[0] = c->quant == KVA_QUANT_FP8_E4M3 ? (ri(2) ? 1 : c->hkv) : lens_i8[ri(3)];
    c->sl_len[1] = c->quant == KVA_QUANT_FP8_E4M3 ? (ri(2) ? 1 : c->hkv) : lens_i8[ri(2)];
    c->sl_len[2] = ri(2) ? 0 : 1; /* offsets per tensor */
    for (int i = 0; i < 2304; i++) {
        c->kscale[i] = c->quant == KVA_QUANT_FP8_E4M3 ? 0.004f * (1 + ri(4)) : 0.01f * (1 + ri(3));
        c->vscale[i] = c->quant == KVA_QUANT_FP8_E4M3 ? 0.004f * (1 + ri(4)) : 0.01f * (1 + ri(3));
        c->koff[i] = (float)(ri(5) - 2);
        c->voff[i] = (float)(ri(5) - 2);
    }
    c->cascade = ri(2) && !c->tree && c->window < 0 && !c->chunk && !c->alibi ? KVA_CASCADE_ON
                                                                              : KVA_CASCADE_AUTO;
    /* Shared prefix: P leading blocks common to every request, or (trie)
     * following each request's random path in a binary trie, so that
     * requests share 1 .. P blocks (nested groups). */
    int P = ri(3) ? 1 + ri(4) : 0;
    int trie = ri(2);
    if (getenv("FUZZ_CASCADE")) { /* cascade-heavy: nested prefixes, cascade on */
        c->causal = 1;
        c->tree = c->alibi = c->chunk = 0;
        c->window = -1;
        c->cascade = KVA_CASCADE_ON;
        P = 2 + ri(3);
        trie = 1;
        if (c->R < 3)
            c->R = 3 + ri(MAXR - 2);
    }
    int path[MAXR];
    for (int r = 0; r < MAXR; r++)
        path[r] = ri(16);
    const int big = ri(4) == 0; /* long contexts: split-KV, many key tiles */
    if (big)
        c->B = 16 * (1 + ri(2));
    int T = 0, maxb = 0;
    for (int r = 0; r < c->R; r++) {
        int q = ri(5) == 0 ? 0 : (ri(2) ? 1 : 1 + ri(7));
        int s = c->causal ? q + ri(big ? 1500 : 14) : ri(big ? 1500 : 14);
        if (P && c->causal && s - q < P * c->B)
            s = q + P * c->B + ri(4);
        if (!c->causal && ri(5) == 0)
            s = 0;
        c->sl[r] = s;
        T += q;
        c->qsl[r + 1] = T;
        int nb = (s + c->B - 1) / c->B;
        if (nb > maxb)
            maxb = nb;
    }
    c->T = T;
    c->stride = maxb ? maxb : 1;
    /* Blocks 1 .. 31: the shared prefixes; the others from 32 on. */
    const int own = c->R * c->stride + 2;
    c->NB = own + 32;
    for (int r = 0; r < c->R; r++)
        for (int b = 0; b < c->stride; b++)
            c->bt[r * c->stride + b] = (c->causal && b < P)
                                           ? (trie ? (1 << b) + (path[r] & ((1 << b) - 1)) : 1 + b)
                                           : (ri(4) == 0 ? -1 : 32 + (r * c->stride + b + 1) % own);
    for (int r = 0; r < c->R; r++) {
        int nb = (c->sl[r] + c->B - 1) / c->B;
        for (int b = 0; b < nb; b++)
            if (c->bt[r * c->stride + b] < 0)
                c->bt[r * c->stride + b] = 32 + r * c->stride + b;
    }
    for (int h = 0; h < c->H; h++) {
        c->slopes[h] = 0.1f * (h + 1);
        c->sk[h] = rf();
    }
    /* Trees: each token's parent is earlier in its request or -1. */
    int byte = 0;
    memset(c->mask, 0, sizeof c->mask);
    for (int r = 0; r < c->R; r++) {
        int q = c->qsl[r + 1] - c->qsl[r];
        for (int i = 0; i < q; i++) {
            int p = i == 0 || ri(4) == 0 ? -1 : ri(i);
            c->parents[c->qsl[r] + i] = p;
            /* row i: itself and its ancestors */
            for (int k = i; k >= 0; k = c->parents[c->qsl[r] + k]) {
                int e = i * q + k;
                c->mask[byte + e / 8] |= (uint8_t)(1u << (e % 8));
                if (c->parents[c->qsl[r] + k] < 0)
                    break;
            }
        }
        byte += (q * q + 7) / 8;
    }
}

static double tol_of(kva_dtype dt)
{
    return dt == 0 ? 1e-5 : dt == 1 ? 2e-3 : 2e-2;
}

/* Counts elements of a (n out, nl lse) that differ from b beyond tol. */
static size_t ndiff(const float *oa, const float *la, const float *ob, const float *lb, size_t n,
                    size_t nl, double tol)
{
    size_t bad = 0;
    for (size_t x = 0; x < n; x++)
        if (!(fabs(oa[x] - ob[x]) <= tol * (1 + fabs(ob[x]))) && !(isnan(oa[x]) && isnan(ob[x])))
            bad++;
    for (size_t x = 0; x < nl; x++)
        if (!(la[x] == lb[x] || fabs(la[x] - lb[x]) <= 1e-3 * (1 + fabs(lb[x]))))
            bad++;
    return bad;
}

#define DESCR(c)                                                                                   \
    "R %d B %d H %d/%d D %d/%d causal %d win %d chunk %d cap %g alibi %d sinks %d dt %d lay %d "   \
    "thr %d quant %d cdt %d tree %d/%d cascade %d kernels %d/%d"
#define ARGS(c)                                                                                    \
    (c)->R, (c)->B, (c)->H, (c)->hkv, (c)->D, (c)->Dv, (c)->causal, (c)->window, (c)->chunk,       \
        (c)->softcap, (c)->alibi, (c)->sinks, (c)->dt, (c)->lay, (c)->thr, (c)->quant, (c)->cdt,   \
        (c)->tree, (c)->tree_packed, (c)->cascade, kd, kp

int main(int argc, char **argv)
{
    int cases = argc > 1 ? atoi(argv[1]) : 300, bad = 0, ran = 0, nupd = 0, nrag = 0, ndcp = 0;
    int ngrp = 0; /* CPU plans with two or more cascade groups */
    if (argc > 2)
        st += (uint64_t)atoll(argv[2]) * 0x9E3779B97F4A7C15ull;
    kva_context *cx[3];
    const kva_backend be[3] = {KVA_BACKEND_REF, KVA_BACKEND_CPU, KVA_BACKEND_CPU};
    const int th[3] = {1, 1, 3};
    for (int i = 0; i < 3; i++) {
        kva_context_desc cd = {be[i], th[i], 0};
        kva_context_create(&cd, &cx[i]);
    }
    kva_plan *upd = NULL; /* the CPU plan updated case after case */
    static const char *const dk[4] = {"decode_portable", "decode_avx2", "decode_avx512",
                                      "decode_avx512bf16"};
    static const char *const pk[4] = {"prefill_portable", "prefill_avx2", "prefill_avx512",
                                      "prefill_avx512bf16"};
    for (int ci = 0; ci < cases; ci++) {
        cs c;
        gen(&c);
        /* Context 1 runs a forced kernel pair (or the dispatcher's); the
         * updated plan (made on it) keeps the kernels of its first build. */
        const int kd = ri(5), kp = ri(5);
        kva__context_force_kernel(cx[1], NULL);
        if (kd < 4 && kva__context_force_kernel(cx[1], dk[kd]) != KVA_STATUS_OK)
            kva__context_force_kernel(cx[1], NULL);
        if (kp < 4)
            kva__context_force_kernel(cx[1], pk[kp]);
        if (upd) {
            kva_plan_destroy(upd);
            upd = NULL;
        }
        if (c.stride > MAXBT || c.T == 0 || c.NB * c.B > 40000 ||
            (double)c.NB * c.B * c.hkv * (c.D + c.Dv) > 6e6) {
            ci--;
            continue;
        }
        const int T = c.T, H = c.H, D = c.D, Dv = c.Dv, hkv = c.hkv, NB = c.NB, B = c.B;
        const size_t nq = (size_t)T * H * D, no = (size_t)T * H * Dv, nl = (size_t)T * H;
        const int ntok = NB * B;
        float *kf = malloc((size_t)ntok * hkv * D * 4), *vf = malloc((size_t)ntok * hkv * Dv * 4);
        int64_t *slots = malloc((size_t)ntok * 8);
        for (int i = 0; i < ntok; i++)
            slots[i] = i;
        for (size_t i = 0; i < (size_t)ntok * hkv * D; i++)
            kf[i] = rf();
        for (size_t i = 0; i < (size_t)ntok * hkv * Dv; i++)
            vf[i] = rf();
        const size_t es = kva_dtype_size(c.dt);
        float *qf = malloc(nq * 4);
        void *qb = malloc(nq * es);
        for (size_t i = 0; i < nq; i++)
            qf[i] = 2 * rf();
        kva_convert(qf, 0, qb, c.dt, nq);
        kva_plan_desc d = desc_of(&c);
        float *o[3], *l[3];
        void *ob = malloc(no * es);
        int ok = 1;
        kva_cache *caches[3] = {0};
        kva_status s = KVA_STATUS_OK;
        for (int i = 0; i < 3; i++) {
            o[i] = malloc(no * 4);
            l[i] = malloc(nl * 4);
            memset(ob, 0xfe, no * es);
            for (size_t x = 0; x < nl; x++)
                l[i][x] = NAN;
            kva_plan *p = NULL;
            kva_plan_desc di = d;
            if (i == 0 && c.cascade == KVA_CASCADE_AUTO)
                di.cascade = KVA_CASCADE_OFF; /* the reference: cascade on request only */
            caches[i] = make_cache(cx[i], &c, NB, kf, vf, slots, ntok);
            s = caches[i] ? kva_plan_create(cx[i], &di, &p) : KVA_STATUS_INTERNAL;
            if (!s)
                s = kva_attention_run(cx[i], p, qb, caches[i], c.sinks ? c.sk : NULL, ob, l[i]);
            if (s) {
                if (i == 0 || s != KVA_STATUS_UNSUPPORTED)
                    printf("case %d be %d: %s %s (" DESCR(c) ")\n", ci, i, kva_status_name(s),
                           kva_last_error(), ARGS(&c));
                ok = 0;
            }
            kva_convert(ob, c.dt, o[i], 0, no);
            if (i == 1 && !s) {
                /* the updated plan: the same bytes */
                kva_status su =
                    upd ? kva_plan_update(cx[1], upd, &di) : kva_plan_create(cx[1], &di, &upd);
                void *ub = malloc(no * es);
                float *ul = malloc(nl * 4);
                memset(ub, 0xfe, no * es);
                if (!su)
                    su =
                        kva_attention_run(cx[1], upd, qb, caches[1], c.sinks ? c.sk : NULL, ub, ul);
                void *ob2 = malloc(no * es);
                kva_plan_info ia, ib;
                kva_plan_get_info(p, &ia);
                ngrp += ia.num_cascade_groups >= 2;
                kva_plan_get_info(upd, &ib);
                kva_status s2 =
                    kva_attention_run(cx[1], p, qb, caches[1], c.sinks ? c.sk : NULL, ob2, l[i]);
                if (su || s2 || memcmp(ub, ob2, no * es) || memcmp(ul, l[i], nl * 4) ||
                    memcmp(&ia, &ib, sizeof ia)) {
                    bad++;
                    printf("UPDATE case %d: %s %s (" DESCR(c) ")\n", ci, kva_status_name(su),
                           kva_last_error(), ARGS(&c));
                }
                nupd++;
                free(ub), free(ul), free(ob2);
            }
            kva_plan_destroy(p);
        }
        if (ok) {
            ran++;
            const double tol = tol_of(c.dt);
            for (int i = 1; i < 3; i++) {
                size_t nb = ndiff(o[i], l[i], o[0], l[0], no, nl, tol);
                if (nb) {
                    bad++;
                    printf("MISMATCH case %d threads %d: %zu bad (" DESCR(c) ")\n", ci, th[i], nb,
                           ARGS(&c));
                }
            }
        }
        /* Ragged: unquantized, the keys of each request packed in q_dtype. */
        if (ok && c.quant == KVA_QUANT_NONE) {
            size_t nk = 0;
            for (int r = 0; r < c.R; r++)
                nk += (size_t)c.sl[r];
            void *kr = malloc((nk + 1) * hkv * D * es), *vr = malloc((nk + 1) * hkv * Dv * es);
            size_t row = 0;
            for (int r = 0; r < c.R; r++)
                for (int j = 0; j < c.sl[r]; j++, row++) {
                    const int slot = c.bt[r * c.stride + j / B] * B + j % B;
                    kva_convert(kf + (size_t)slot * hkv * D, 0, (char *)kr + row * hkv * D * es,
                                c.dt, (size_t)hkv * D);
                    kva_convert(vf + (size_t)slot * hkv * Dv, 0, (char *)vr + row * hkv * Dv * es,
                                c.dt, (size_t)hkv * Dv);
                }
            kva_plan_desc dr = d;
            dr.block_table = NULL;
            dr.block_table_stride = 0;
            dr.cascade = KVA_CASCADE_AUTO;
            for (int i = 0; i < 2; i++) {
                kva_plan *p = NULL;
                float *ro = malloc(no * 4), *rl = malloc(nl * 4);
                memset(ob, 0xfe, no * es);
                s = kva_plan_create(cx[i], &dr, &p);
                if (!s)
                    s = kva_attention_run_ragged(cx[i], p, qb, kr, vr, c.sinks ? c.sk : NULL, ob,
                                                 rl);
                if (s)
                    printf("ragged: %s\n", kva_last_error());
                kva_convert(ob, c.dt, ro, 0, no);
                size_t nb = s ? 1 : ndiff(ro, rl, o[0], l[0], no, nl, tol_of(c.dt));
                if (nb) {
                    bad++;
                    printf("RAGGED case %d be %d: %zu bad %s %s (" DESCR(c) ")\n", ci, i, nb,
                           kva_status_name(s), kva_last_error(), ARGS(&c));
                }
                nrag++;
                kva_plan_destroy(p);
                free(ro), free(rl);
            }
            free(kr), free(vr);
        }
        /* DCP: sharded over N ranks on the CPU, combined, against the reference. */
        if (ok && !c.tree && !(c.cascade == KVA_CASCADE_ON && 0)) {
            const int N = 2 + ri(2), I = 1 + ri(3);
            float *po = malloc((size_t)N * no * 4), *pl = malloc((size_t)N * nl * 4);
            void *pb = malloc((size_t)N * no * es), *mo = malloc(no * es);
            float *ml = malloc(nl * 4), *mf = malloc(no * 4);
            int dok = 1;
            for (int k = 0; k < N && dok; k++) {
                int32_t ll[MAXR], rbt[MAXR * MAXBT];
                kva_dcp_local_lens(c.R, c.sl, N, k, I, ll);
                int rstride = 1;
                for (int r = 0; r < c.R; r++)
                    if ((ll[r] + B - 1) / B > rstride)
                        rstride = (ll[r] + B - 1) / B;
                const int rNB = c.R * rstride + 1;
                for (int r = 0; r < c.R; r++)
                    for (int b = 0; b < rstride; b++)
                        rbt[r * rstride + b] = 1 + r * rstride + b;
                kva_cache *rc = make_cache(cx[1], &c, rNB, kf, vf, slots, 0);
                /* each request's global keys through kva_dcp_slots */
                for (int r = 0; r < c.R && rc; r++) {
                    int64_t *sl2 = malloc((size_t)(c.sl[r] + 1) * 8);
                    float *kk = malloc((size_t)(c.sl[r] + 1) * hkv * D * 4),
                          *vv = malloc((size_t)(c.sl[r] + 1) * hkv * Dv * 4);
                    for (int j = 0; j < c.sl[r]; j++) {
                        const int slot = c.bt[r * c.stride + j / B] * B + j % B;
                        memcpy(kk + (size_t)j * hkv * D, kf + (size_t)slot * hkv * D,
                               (size_t)hkv * D * 4);
                        memcpy(vv + (size_t)j * hkv * Dv, vf + (size_t)slot * hkv * Dv,
                               (size_t)hkv * Dv * 4);
                    }
                    if (kva_dcp_slots(N, k, I, B, rbt + r * rstride, rstride, 0, c.sl[r], sl2) ||
                        kva_cache_write(cx[1], rc, c.sl[r], kk, 0, vv, 0, KVA_DTYPE_F32, sl2)) {
                        printf("DCP setup case %d: %s\n", ci, kva_last_error());
                        dok = 0;
                    }
                    free(kk), free(vv), free(sl2);
                }
                kva_plan_desc dd = d;
                dd.block_table = rbt;
                dd.block_table_stride = rstride;
                dd.dcp_size = N;
                dd.dcp_rank = k;
                dd.dcp_interleave = I;
                dd.cascade = KVA_CASCADE_OFF;
                kva_plan *p = NULL;
                s = rc ? kva_plan_create(cx[1], &dd, &p) : KVA_STATUS_INTERNAL;
                if (!s)
                    s = kva_attention_run(cx[1], p, qb, rc, c.sinks ? c.sk : NULL,
                                          (char *)pb + (size_t)k * no * es, pl + (size_t)k * nl);
                if (s) {
                    if (s != KVA_STATUS_UNSUPPORTED)
                        printf("DCP case %d rank %d: %s %s (" DESCR(c) ")\n", ci, k,
                               kva_status_name(s), kva_last_error(), ARGS(&c));
                    dok = 0;
                }
                kva_plan_destroy(p);
                kva_cache_destroy(rc);
            }
            if (dok) {
                s = kva_merge_states_n(cx[1], N, T, H, Dv, c.dt, pb, 0, pl, 0, mo, ml);
                kva_convert(mo, c.dt, mf, 0, no);
                size_t nb = s ? 1 : ndiff(mf, ml, o[0], l[0], no, nl, 2 * tol_of(c.dt));
                if (nb) {
                    bad++;
                    printf("DCP MISMATCH case %d N %d I %d: %zu bad %s (" DESCR(c) ")\n", ci, N, I,
                           nb, kva_last_error(), ARGS(&c));
                }
                ndcp++;
            }
            free(po), free(pl), free(pb), free(mo), free(ml), free(mf);
        }
        for (int i = 0; i < 3; i++) {
            free(o[i]);
            free(l[i]);
            kva_cache_destroy(caches[i]);
        }
        free(ob), free(kf), free(vf), free(slots), free(qf), free(qb);
    }
    kva_plan_destroy(upd);
    printf("ran %d (updates %d, ragged %d, dcp %d, plans of 2+ cascade groups %d), mismatches %d\n",
           ran, nupd, nrag, ndcp, ngrp, bad);
    for (int i = 0; i < 3; i++)
        kva_context_destroy(cx[i]);
    return 0;
}
