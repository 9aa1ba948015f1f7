/*
 * fuzz_ref_cpu.c - api41's differential probe (dev/, not a test): random mixed
 * batches with rarely combined options (non-causal rows with seq_len 0 or
 * pos < 0 under a window, q_len 0 requests, chunks, soft-cap, ALiBi, sinks,
 * GQA, Dv != D, f32/f16/bf16, NHD/HND, decode_threshold 0..2) run on the
 * reference backend and the CPU backend with 1 and 3 threads; prints the
 * cases whose out / lse disagree beyond the dtype's tolerance.
 *   gcc -O2 -Iinclude dev/api41/fuzz_ref_cpu.c -Lbuild-rel -lkvattn \
 *       -Wl,-rpath,$PWD/build-rel -lm -o /tmp/fuzz && /tmp/fuzz CASES SEED
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include "kvattn.h"
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
int main(int argc, char **argv)
{
    int cases = argc > 1 ? atoi(argv[1]) : 300, bad = 0, ran = 0;
    if (argc > 2)
        st += (uint64_t)atoll(argv[2]) * 0x9E3779B97F4A7C15ull;
    kva_context *cx[3];
    kva_backend be[3] = {KVA_BACKEND_REF, KVA_BACKEND_CPU, KVA_BACKEND_CPU};
    int th[3] = {1, 1, 3};
    for (int i = 0; i < 3; i++) {
        kva_context_desc cd = {be[i], th[i], 0};
        kva_context_create(&cd, &cx[i]);
    }
    for (int c = 0; c < cases; c++) {
        int R = 1 + ri(4), B = 1 + ri(8), hkv = 1 + ri(2), g = 1 + ri(3), H = hkv * g;
        int D = 8 * (1 + ri(4)), Dv = ri(2) ? D : 8 * (1 + ri(4));
        int causal = ri(3) != 0, window = ri(3) == 0 ? ri(6) : -1,
            chunk = (causal && ri(4) == 0) ? 1 + ri(6) : 0;
        float softcap = ri(3) == 0 ? 2.0f + ri(5) : 0.0f;
        int alibi = ri(3) == 0, sinks = ri(3) == 0;
        kva_dtype dt = (kva_dtype)ri(3);
        kva_layout lay = (kva_layout)ri(2);
        int thr = ri(3); /* decode_threshold 0,1,2 */
        int32_t qsl[5] = {0}, sl[4], bt[4 * 16];
        int T = 0, maxb = 0;
        for (int r = 0; r < R; r++) {
            int q = ri(4) == 0 ? 0 : 1 + ri(5);
            int s = causal ? q + ri(12) : ri(12);
            if (!causal && ri(5) == 0)
                s = 0;
            sl[r] = s;
            T += q;
            qsl[r + 1] = T;
            int nb = (s + B - 1) / B;
            if (nb > maxb)
                maxb = nb;
        }
        if (maxb > 16 || T == 0) {
            c--;
            continue;
        }
        int stride = maxb ? maxb : 1, NB = R * stride + 2;
        for (int r = 0; r < R; r++)
            for (int b = 0; b < stride; b++)
                bt[r * stride + b] = ri(4) == 0 ? -1 : (r * stride + b + 1) % NB;
        for (int r = 0; r < R; r++) {
            int nb = (sl[r] + B - 1) / B;
            for (int b = 0; b < nb; b++)
                if (bt[r * stride + b] < 0)
                    bt[r * stride + b] = r * stride + b;
        }
        float slopes[16], sk[16];
        for (int h = 0; h < H; h++) {
            slopes[h] = 0.1f * (h + 1);
            sk[h] = rf();
        }
        kva_plan_desc d = {0};
        d.num_requests = R;
        d.query_start_loc = qsl;
        d.seq_lens = sl;
        d.block_table = bt;
        d.block_table_stride = stride;
        d.block_size = B;
        d.decode_threshold = thr;
        d.num_heads = H;
        d.num_kv_heads = hkv;
        d.head_dim = D;
        d.head_dim_v = Dv;
        d.q_dtype = dt;
        d.causal = causal;
        d.window_left = window;
        d.softcap = softcap;
        d.alibi_slopes = alibi ? slopes : NULL;
        d.attention_chunk = chunk;
        kva_cache_desc cd = {NB, B, hkv, D, Dv, dt, lay, 0, 0};
        size_t es = kva_dtype_size(dt);
        size_t kn = (size_t)NB * B * hkv * D, vn = (size_t)NB * B * hkv * Dv;
        float *kf = malloc(kn * 4), *vf = malloc(vn * 4), *qf = malloc((size_t)T * H * D * 4);
        void *kb = malloc(kn * es), *vb = malloc(vn * es), *qb = malloc((size_t)T * H * D * es);
        for (size_t i = 0; i < kn; i++)
            kf[i] = rf();
        for (size_t i = 0; i < vn; i++)
            vf[i] = rf();
        for (size_t i = 0; i < (size_t)T * H * D; i++)
            qf[i] = 2 * rf();
        kva_convert(kf, 0, kb, dt, kn);
        kva_convert(vf, 0, vb, dt, vn);
        kva_convert(qf, 0, qb, dt, (size_t)T * H * D);
        float *o[3], *l[3];
        void *ob[3];
        int ok = 1;
        for (int i = 0; i < 3; i++) {
            kva_cache *cache = NULL;
            kva_plan *p = NULL;
            o[i] = malloc((size_t)T * H * Dv * 4);
            l[i] = malloc((size_t)T * H * 4);
            ob[i] = malloc((size_t)T * H * Dv * es);
            memset(ob[i], 0xff, (size_t)T * H * Dv * es);
            for (int x = 0; x < T * H; x++)
                l[i][x] = NAN;
            kva_status s1 = kva_cache_create_from(cx[i], &cd, kb, vb, &cache);
            kva_status s2 = s1 ? s1 : kva_plan_create(cx[i], &d, &p);
            kva_status s3 =
                s2 ? s2 : kva_attention_run(cx[i], p, qb, cache, sinks ? sk : NULL, ob[i], l[i]);
            if (s3) {
                if (i == 0)
                    printf("case %d: %s %s\n", c, kva_status_name(s3), kva_last_error());
                ok = 0;
            }
            kva_convert(ob[i], dt, o[i], 0, (size_t)T * H * Dv);
            kva_plan_destroy(p);
            kva_cache_destroy(cache);
        }
        if (ok) {
            ran++;
            double tol = dt == 0 ? 1e-5 : dt == 1 ? 2e-3 : 2e-2;
            for (int i = 1; i < 3; i++) {
                size_t nbad = 0;
                for (size_t x = 0; x < (size_t)T * H * Dv; x++)
                    if (!(fabs(o[i][x] - o[0][x]) <= tol * (1 + fabs(o[0][x]))))
                        nbad++;
                for (int x = 0; x < T * H; x++)
                    if (!(l[i][x] == l[0][x] ||
                          fabs(l[i][x] - l[0][x]) <= 1e-3 * (1 + fabs(l[0][x]))))
                        nbad++;
                if (nbad) {
                    bad++;
                    printf("MISMATCH case %d backend %d threads %d: %zu bad (R %d B %d H %d/%d D "
                           "%d/%d causal %d win %d chunk %d cap %g alibi %d sinks %d dt %d lay %d "
                           "thr %d)\n",
                           c, i, th[i], nbad, R, B, H, hkv, D, Dv, causal, window, chunk, softcap,
                           alibi, sinks, dt, lay, thr);
                }
            }
        }
        for (int i = 0; i < 3; i++) {
            free(o[i]);
            free(l[i]);
            free(ob[i]);
        }
        free(kf);
        free(vf);
        free(qf);
        free(kb);
        free(vb);
        free(qb);
    }
    printf("ran %d, mismatches %d\n", ran, bad);
    return 0;
}
