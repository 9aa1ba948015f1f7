/* probe5: plan ownership across contexts through kva_plan_update. */
#include "kvattn.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#define P(expr) do { kva_status s_ = (expr); printf("%-4d %-28s %s | %s\n", __LINE__, kva_status_name(s_), #expr, kva_last_error()); } while (0)
static uint64_t sum(const void *p, size_t n) { uint64_t h = 1469598103934665603ull; const unsigned char *b = p; for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull; return h; }
int main(int argc, char **argv)
{
    int threads_b = argc > 1 ? atoi(argv[1]) : 2;
    kva_context *A, *Bc;
    kva_context_desc da = {KVA_BACKEND_CPU, 2, 0}, db = {KVA_BACKEND_CPU, threads_b, 0};
    kva_context_create(&da, &A); kva_context_create(&db, &Bc);
    enum { NB = 8, BS = 4, HKV = 2, D = 16, H = 4 };
    kva_cache_desc cd = {NB, BS, HKV, D, 0, KVA_DTYPE_F32, KVA_LAYOUT_NHD, 0, 0};
    kva_cache *c; kva_cache_create(A, &cd, &c);
    float k[NB * BS * HKV * D], v[NB * BS * HKV * D];
    for (int i = 0; i < NB * BS * HKV * D; i++) { k[i] = sinf(i * 0.7f); v[i] = cosf(i * 1.3f); }
    int64_t sl[NB * BS]; for (int i = 0; i < NB * BS; i++) sl[i] = i;
    kva_cache_write(A, c, NB * BS, k, 0, v, 0, KVA_DTYPE_F32, sl);
    int32_t cqsl[3] = {0, 2, 4}, csl[2] = {9, 9}, cbt[6] = {0, 1, 2, 0, 1, 3};
    kva_plan_desc pd = {0};
    pd.num_requests = 2; pd.query_start_loc = cqsl; pd.seq_lens = csl; pd.block_table = cbt; pd.block_table_stride = 3;
    pd.block_size = BS; pd.num_heads = H; pd.num_kv_heads = HKV; pd.head_dim = D; pd.q_dtype = KVA_DTYPE_F32; pd.causal = 1; pd.window_left = -1;
    pd.cascade = KVA_CASCADE_ON;
    float q[4 * H * D], out[4 * H * D], lse[4 * H], out2[4 * H * D], lse2[4 * H];
    for (int i = 0; i < 4 * H * D; i++) q[i] = sinf(0.3f * i);
    kva_plan *p; P(kva_plan_create(A, &pd, &p));
    P(kva_attention_run(A, p, q, c, NULL, out, lse));
    /* failing update on B: plan unchanged, still A's */
    kva_plan_desc bad = pd; bad.window_left = -5;
    P(kva_plan_update(Bc, p, &bad));
    memset(out2, 0xff, sizeof out2);
    P(kva_attention_run(A, p, q, c, NULL, out2, lse2));
    printf("after failed update on B, run on A same: %d\n", memcmp(out, out2, sizeof out) == 0 && memcmp(lse, lse2, sizeof lse) == 0);
    P(kva_attention_run(Bc, p, q, c, NULL, out2, lse2));
    /* failing update on A with cascade desc that is refused at a later stage (grouping mismatch) */
    int32_t grp[2] = {0, 0}, plen[1] = {8};
    kva_plan_desc bad2 = pd; bad2.num_cascade_groups = 1; bad2.cascade_group = grp; bad2.cascade_prefix_len = plen; /* prefix 8 > seq - q = 7 */
    P(kva_plan_update(A, p, &bad2));
    memset(out2, 0xff, sizeof out2);
    P(kva_attention_run(A, p, q, c, NULL, out2, lse2));
    printf("after failed update on A, same: %d\n", memcmp(out, out2, sizeof out) == 0 && memcmp(lse, lse2, sizeof lse) == 0);
    /* bad2 on B */
    P(kva_plan_update(Bc, p, &bad2));
    memset(out2, 0xff, sizeof out2);
    P(kva_attention_run(A, p, q, c, NULL, out2, lse2));
    printf("after failed update (late) on B, run on A same: %d\n", memcmp(out, out2, sizeof out) == 0 && memcmp(lse, lse2, sizeof lse) == 0);
    /* good update on B, destroy A, run on B */
    P(kva_plan_update(Bc, p, &pd));
    kva_context_destroy(A);
    memset(out2, 0xff, sizeof out2);
    P(kva_attention_run(Bc, p, q, c, NULL, out2, lse2));
    printf("after update on B + destroy A, same: %d (max diff ", memcmp(out, out2, sizeof out) == 0);
    double md = 0; for (int i = 0; i < 4 * H * D; i++) md = fmax(md, fabs(out[i] - out2[i])); printf("%g)\n", md);
    /* update again on B to plain, then to cascade */
    kva_plan_desc plain = pd; plain.cascade = KVA_CASCADE_OFF;
    P(kva_plan_update(Bc, p, &plain));
    P(kva_attention_run(Bc, p, q, c, NULL, out2, lse2));
    P(kva_plan_update(Bc, p, &pd));
    P(kva_attention_run(Bc, p, q, c, NULL, out2, lse2));
    kva_plan_destroy(p);
    kva_cache_destroy(c);
    kva_context_destroy(Bc);
    return 0;
}
