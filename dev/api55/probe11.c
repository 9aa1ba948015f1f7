/* probe11: allowed aliasing: fused k/v rows at a common stride (write and
 * read), merges in place with out on one side and lse_out on the other. */
#include "kvattn.h"
#include <math.h>
#include <stdio.h>
#include <string.h>
#define P(expr) do { kva_status s_ = (expr); printf("%-4d %-28s %s | %s\n", __LINE__, kva_status_name(s_), #expr, kva_last_error()); } while (0)
int main(void)
{
    kva_context_desc cds[2] = {{KVA_BACKEND_REF, 1, 0}, {KVA_BACKEND_CPU, 2, 0}};
    for (int b = 0; b < 2; b++) {
        kva_context *ctx; kva_context_create(&cds[b], &ctx);
        enum { HKV = 2, D = 16, DV = 8, T = 5 };
        static const kva_quant qs[3] = {KVA_QUANT_NONE, KVA_QUANT_INT8_TOKEN_K_V16, KVA_QUANT_FP8_E4M3};
        for (int qi = 0; qi < 3; qi++) {
            kva_cache_desc d = {4, 4, HKV, D, DV, KVA_DTYPE_F32, KVA_LAYOUT_HND, qs[qi], 0};
            if (qi == 1) d.dtype = KVA_DTYPE_F16;
            if (qi == 2) d.dtype = KVA_DTYPE_FP8_E4M3;
            kva_cache *c; P(kva_cache_create(ctx, &d, &c));
            const int64_t st = HKV * (D + DV) + 3; /* fused rows [k | v | pad] */
            float fused[T * (HKV * (D + DV) + 3)], kk[T * HKV * D], vv[T * HKV * DV];
            for (int i = 0; i < T * st; i++) fused[i] = sinf(i * 0.37f);
            for (int t = 0; t < T; t++) { memcpy(kk + t * HKV * D, fused + t * st, HKV * D * 4); memcpy(vv + t * HKV * DV, fused + t * st + HKV * D, HKV * DV * 4); }
            int64_t slots[T] = {3, 7, -1, 0, 15};
            P(kva_cache_write(ctx, c, T, fused, st, fused + HKV * D, st, KVA_DTYPE_F32, slots));
            float r1[T * 64], r2[T * 64], rk[T * HKV * D], rv[T * HKV * DV];
            memset(r1, 0, sizeof r1); memset(r2, 0, sizeof r2);
            P(kva_cache_read(ctx, c, T, slots, r1, st, r1 + HKV * D, st, KVA_DTYPE_F32));
            P(kva_cache_read(ctx, c, T, slots, rk, 0, rv, 0, KVA_DTYPE_F32));
            /* compare the fused read with the separate one */
            int bad = 0;
            for (int t = 0; t < T; t++) if (slots[t] >= 0) { bad += memcmp(r1 + t * st, rk + t * HKV * D, HKV * D * 4) != 0; bad += memcmp(r1 + t * st + HKV * D, rv + t * HKV * DV, HKV * DV * 4) != 0; }
            /* a separate write gives the same bytes */
            kva_cache *c2; kva_cache_create(ctx, &d, &c2);
            P(kva_cache_write(ctx, c2, T, kk, 0, vv, 0, KVA_DTYPE_F32, slots));
            void *k1, *v1, *k2, *v2; kva_cache_data(c, &k1, &v1); kva_cache_data(c2, &k2, &v2);
            float *s1, *s2; kva_cache_token_scales(c, &s1); kva_cache_token_scales(c2, &s2);
            int same = 1;
            for (int t = 0; t < T; t++) if (slots[t] >= 0) {
                (void)0;
            }
            double maxd = 0; for (int t = 0; t < T; t++) if (slots[t] >= 0) for (int i = 0; i < HKV * D; i++) maxd = fmax(maxd, fabs(rk[t * HKV * D + i] - kk[t * HKV * D + i]));
            printf("  %s %s: fused read mismatches %d, max |read - written| k %g, scales %s\n", kva_backend_name(cds[b].backend), kva_quant_name(qs[qi]), bad, maxd, s1 ? (memcmp(s1, s2, 4 * 16 * HKV) == 0 ? "same" : "DIFFER") : "-");
            (void)same; (void)k1; (void)k2; (void)v1; (void)v2;
            kva_cache_destroy(c); kva_cache_destroy(c2);
        }
        /* merge: out = out_a, lse_out = lse_b */
        enum { MT = 3, MH = 2, MD = 8 };
        float oa[MT * MH * MD], ob[MT * MH * MD], la[MT * MH], lb[MT * MH], ref[MT * MH * MD], lref[MT * MH];
        for (int i = 0; i < MT * MH * MD; i++) { oa[i] = sinf(i); ob[i] = cosf(i); }
        for (int i = 0; i < MT * MH; i++) { la[i] = sinf(3 * i); lb[i] = cosf(5 * i); }
        P(kva_merge_states(ctx, MT, MH, MD, KVA_DTYPE_F32, oa, la, ob, lb, ref, lref));
        P(kva_merge_states(ctx, MT, MH, MD, KVA_DTYPE_F32, oa, la, ob, lb, oa, lb));
        printf("  in-place mixed sides: out %s lse %s\n", memcmp(oa, ref, sizeof ref) ? "DIFFER" : "same", memcmp(lb, lref, sizeof lref) ? "DIFFER" : "same");
        kva_context_destroy(ctx);
    }
    return 0;
}
