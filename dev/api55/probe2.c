/* probe2: cache, plan, run edges from the headers' promises. */
#include "kvattn.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#define P(expr) do { kva_status s_ = (expr); printf("%-4d %-28s %s | %s\n", __LINE__, kva_status_name(s_), #expr, kva_last_error()); } while (0)

static uint64_t sum(const void *p, size_t n) { uint64_t h = 1469598103934665603ull; const unsigned char *b = p; for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull; return h; }

int main(void)
{
    kva_context *ctx, *ctx2, *rc;
    kva_context_desc cd = {KVA_BACKEND_CPU, 2, 0}, rd = {KVA_BACKEND_REF, 0, 0};
    kva_context_create(&cd, &ctx); kva_context_create(&cd, &ctx2); kva_context_create(&rd, &rc);
    enum { NB = 8, B = 4, HKV = 2, D = 16, H = 4 };
    kva_cache_desc d = {NB, B, HKV, D, 0, KVA_DTYPE_F32, KVA_LAYOUT_NHD, 0, 0};
    kva_cache *c;
    P(kva_cache_create(ctx, &d, &c));
    float k[8 * HKV * D], v[8 * HKV * D];
    for (int i = 0; i < 8 * HKV * D; i++) { k[i] = sinf(i); v[i] = cosf(i); }
    int64_t slots[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    P(kva_cache_write(ctx, c, 8, k, 0, v, 0, KVA_DTYPE_F32, slots));
    void *kd, *vd; kva_cache_data(c, &kd, &vd);
    size_t cb = (size_t)NB * B * HKV * D * 4;
    uint64_t s0 = sum(kd, cb) ^ sum(vd, cb);
#define SAME() printf("     cache %s\n", (sum(kd, cb) ^ sum(vd, cb)) == s0 ? "same" : "CHANGED")
    P(kva_cache_write(ctx, c, 2, k, -32, v, 0, KVA_DTYPE_F32, slots)); SAME();
    P(kva_cache_write(ctx, c, 2, k, 8, v, 0, KVA_DTYPE_F32, slots)); SAME();
    P(kva_cache_write(ctx, c, 2, k, INT64_MAX / 2, v, 0, KVA_DTYPE_F32, slots)); SAME();
    P(kva_cache_write(ctx, c, 2, k, INT64_MAX, v, 0, KVA_DTYPE_F32, slots)); SAME();
    P(kva_cache_write(ctx, c, 3, k, INT64_MAX / 2, v, 0, KVA_DTYPE_F32, slots)); SAME();
    P(kva_cache_write(ctx, c, -1, k, 0, v, 0, KVA_DTYPE_F32, slots)); SAME();
    P(kva_cache_write(ctx, c, 2, k, 0, v, 0, KVA_DTYPE_I8, slots)); SAME();
    P(kva_cache_write(ctx, c, 2, k, 0, NULL, 0, KVA_DTYPE_F32, slots)); SAME();
    int64_t bs[2] = {0, NB * B};
    P(kva_cache_write(ctx, c, 2, k, 0, v, 0, KVA_DTYPE_F32, bs)); SAME();
    int64_t ms[2] = {INT64_MIN, -1};
    P(kva_cache_write(ctx, c, 2, k, 0, v, 0, KVA_DTYPE_F32, ms)); SAME();
    /* read */
    float rk[8 * HKV * D], rv[8 * HKV * D];
    memset(rk, 0x7f, sizeof rk);
    P(kva_cache_read(ctx, c, 2, slots, rk, -32, rv, 0, KVA_DTYPE_F32));
    P(kva_cache_read(ctx, c, 2, slots, rk, 8, rv, 0, KVA_DTYPE_F32));
    P(kva_cache_read(ctx, c, 2, slots, rk, INT64_MAX / 2, rv, 0, KVA_DTYPE_F32));
    P(kva_cache_read(ctx, c, 2, slots, NULL, 0, NULL, 0, KVA_DTYPE_F32));
    P(kva_cache_read(ctx, c, 2, slots, rk, 0, rv, 0, KVA_DTYPE_I8));
    P(kva_cache_read(ctx, c, 2, bs, rk, 0, rv, 0, KVA_DTYPE_F32));
    P(kva_cache_read(ctx, c, 0, NULL, NULL, 0, NULL, 0, KVA_DTYPE_F32));
    /* copy */
    int32_t pr[4] = {0, 1, 2, 3};
    P(kva_cache_copy_blocks(ctx, c, pr, -1)); SAME();
    int32_t pneg[2] = {-1, 3}; P(kva_cache_copy_blocks(ctx, c, pneg, 1)); SAME();
    int32_t pnb[2] = {0, NB}; P(kva_cache_copy_blocks(ctx, c, pnb, 1)); SAME();
    int32_t pself[4] = {2, 2, 2, 5}; P(kva_cache_copy_blocks(ctx, c, pself, 2));
    int32_t pself2[4] = {5, 2, 2, 2}; P(kva_cache_copy_blocks(ctx, c, pself2, 2));
    P(kva_cache_copy_blocks(ctx, c, NULL, 1)); SAME();
    P(kva_cache_copy_blocks(ctx, c, NULL, 0));
    /* swap between differently shaped caches */
    const char *nm[] = {"B", "Hkv", "D", "Dv", "dtype", "layout", "quant", "kind"};
    for (int m = 0; m < 8; m++) {
        kva_cache_desc e = d; e.num_blocks = 3;
        if (m == 0) e.block_size = 8;
        if (m == 1) e.num_kv_heads = 1;
        if (m == 2) e.head_dim = 8;
        if (m == 3) e.head_dim_v = 8;
        if (m == 4) e.dtype = KVA_DTYPE_F16;
        if (m == 5) e.layout = KVA_LAYOUT_HND;
        if (m == 6) { e.quant = KVA_QUANT_FP8_E4M3; e.dtype = KVA_DTYPE_FP8_E4M3; }
        if (m == 7) { e.kind = KVA_ATTN_MLA; e.num_kv_heads = 1; e.head_dim = 32; e.head_dim_v = 16; }
        kva_cache *o = NULL;
        kva_status st = kva_cache_create(ctx, &e, &o);
        int32_t sp[2] = {1, 2};
        printf("swap mismatch %s (create %s): ", nm[m], kva_status_name(st));
        if (o) { kva_status s1 = kva_cache_swap_blocks(ctx, c, o, sp, 1); printf("%s %s\n", kva_status_name(s1), kva_last_error()); kva_cache_destroy(o); }
        else printf("\n");
    }
    /* two INT8_CHANNEL caches of different scales */
    {
        kva_cache_desc q = d; q.quant = KVA_QUANT_INT8_CHANNEL; q.dtype = KVA_DTYPE_I8;
        float s1 = 0.1f, s2 = 0.2f;
        kva_quant_params a = {&s1, 1, NULL, 0, &s1, 1, NULL, 0}, b = {&s2, 1, NULL, 0, &s2, 1, NULL, 0};
        kva_cache *qa, *qb;
        P(kva_cache_create_quant(ctx, &q, &a, &qa));
        P(kva_cache_create_quant(ctx, &q, &b, &qb));
        int32_t sp[2] = {1, 2};
        P(kva_cache_swap_blocks(ctx, qa, qb, sp, 1));
        kva_cache_destroy(qa); kva_cache_destroy(qb);
    }
    /* swap into a REF cache from a CPU context */
    { kva_cache *o; kva_cache_desc e = d; e.num_blocks = 3; kva_cache_create(rc, &e, &o); int32_t sp[2] = {1, 2}; P(kva_cache_swap_blocks(ctx, c, o, sp, 1)); P(kva_cache_swap_blocks(rc, o, c, sp, 1)); kva_cache_destroy(o); }

    /* plans */
    int32_t qsl[3] = {0, 1, 4}, sl[2] = {5, 9}, bt[6] = {0, 1, -1, 2, 3, 4};
    kva_plan_desc pd = {0};
    pd.num_requests = 2; pd.query_start_loc = qsl; pd.seq_lens = sl; pd.block_table = bt; pd.block_table_stride = 3;
    pd.block_size = B; pd.num_heads = H; pd.num_kv_heads = HKV; pd.head_dim = D; pd.q_dtype = KVA_DTYPE_F32; pd.causal = 1; pd.window_left = -1;
    kva_plan *pl = NULL;
    P(kva_plan_create(ctx, &pd, &pl));
    float q[4 * H * D], out[4 * H * D], lse[4 * H];
    for (int i = 0; i < 4 * H * D; i++) q[i] = sinf(0.3f * i);
    P(kva_attention_run(ctx, pl, q, c, NULL, out, lse));
    uint64_t so = sum(out, sizeof out) ^ sum(lse, sizeof lse);
#define TRY(field, val) do { kva_plan_desc e = pd; e.field = val; kva_plan *p2 = (kva_plan *)0x1; kva_status s_ = kva_plan_create(ctx, &e, &p2); printf("plan %s=%s: %s %s%s\n", #field, #val, kva_status_name(s_), kva_last_error(), (s_ != 0 && p2 != (kva_plan *)0x1 && p2 != NULL) ? " OUT WRITTEN" : ""); if (s_ == 0) kva_plan_destroy(p2); \
        s_ = kva_plan_update(ctx, pl, &e); printf("   update: %s\n", kva_status_name(s_)); if (s_ == 0) kva_plan_update(ctx, pl, &pd); } while (0)
    TRY(block_table_stride, -1);
    TRY(block_table_stride, 1);
    TRY(decode_threshold, -1);
    TRY(decode_threshold, INT32_MAX);
    TRY(window_left, -2);
    TRY(window_left, INT32_MIN);
    TRY(window_left, INT32_MAX);
    TRY(softcap, -1.0f);
    TRY(softcap, NAN);
    TRY(softcap, INFINITY);
    TRY(scale, INFINITY);
    TRY(scale, -0.0f);
    TRY(dcp_size, 1);
    TRY(dcp_rank, 1);
    TRY(dcp_interleave, -1);
    TRY(mla_qk_nope_head_dim, 8);
    TRY(sparse_topk, -1);
    TRY(sparse_mode, 1);
    TRY(index_q_quant, 6);
    TRY(attention_chunk, -1);
    TRY(causal, 7);
    TRY(num_requests, -1);
    TRY(head_dim_v, 584);
    TRY(head_dim_v, -8);
    TRY(num_kv_heads, 0);
    TRY(num_heads, 6);
    TRY(cascade, 3);
    TRY(num_cascade_groups, -1);
    TRY(num_cascade_groups, 1);
    TRY(block_size, 0);
    TRY(q_dtype, KVA_DTYPE_I8);
    {
        float sl_nan[H] = {NAN, 1, 1, 1}; TRY(alibi_slopes, sl_nan);
        float sl_inf[H] = {INFINITY, 1, 1, 1}; TRY(alibi_slopes, sl_inf);
    }
    { int32_t q2[3] = {0, 1, 4}; int32_t s2[2] = {5, 3}; TRY(seq_lens, s2); (void)q2; }
    { int32_t q2[3] = {1, 1, 4}; TRY(query_start_loc, q2); }
    { int32_t q2[3] = {0, 2, 1}; TRY(query_start_loc, q2); }
    { int32_t s2[2] = {5, (1 << 30) + 1}; TRY(seq_lens, s2); }
    { int32_t b2[6] = {0, 1, -1, 2, -3, 4}; TRY(block_table, b2); }
    { int32_t b2[6] = {0, -1, 99, 2, 3, 4}; TRY(block_table, b2); }
    TRY(block_table, NULL);
    P(kva_attention_run(ctx, pl, q, c, NULL, out, lse));
    printf("plan still runs, same out: %s\n", (sum(out, sizeof out) ^ sum(lse, sizeof lse)) == so ? "yes" : "NO");
    /* update with a ctx of another backend */
    P(kva_plan_update(rc, pl, &pd));
    /* plan run on ctx2 (never reserved) */
    P(kva_attention_run(ctx2, pl, q, c, NULL, out, lse));
    /* plan updated by ctx2, then run on ctx */
    P(kva_plan_update(ctx2, pl, &pd));
    P(kva_attention_run(ctx2, pl, q, c, NULL, out, lse));
    P(kva_attention_run(ctx, pl, q, c, NULL, out, lse));
    /* plan on ref run with cpu ctx */
    kva_plan *rp; P(kva_plan_create(rc, &pd, &rp));
    P(kva_attention_run(ctx, rp, q, c, NULL, out, lse));
    /* a cascade plan updated on ctx2, run on ctx */
    {
        int32_t cqsl[3] = {0, 2, 4}, csl[2] = {9, 9}, cbt[6] = {0, 1, 2, 0, 1, 3};
        kva_plan_desc e = pd; e.query_start_loc = cqsl; e.seq_lens = csl; e.block_table = cbt; e.cascade = KVA_CASCADE_ON;
        kva_plan *cp; P(kva_plan_create(ctx, &e, &cp));
        kva_plan_info in; kva_plan_get_info(cp, &in); printf("cascade groups %d\n", in.num_cascade_groups);
        P(kva_attention_run(ctx2, cp, q, c, NULL, out, lse));
        P(kva_plan_update(ctx2, cp, &e));
        P(kva_attention_run(ctx, cp, q, c, NULL, out, lse));
        P(kva_attention_run(ctx2, cp, q, c, NULL, out, lse));
        /* update to non-cascade on ctx2, then run on ctx (reserved the same desc) */
        P(kva_plan_update(ctx2, cp, &pd));
        P(kva_attention_run(ctx, cp, q, c, NULL, out, lse));
        kva_plan_destroy(cp);
    }
    kva_plan_info inf;
    P(kva_plan_get_info(NULL, &inf)); P(kva_plan_get_info(pl, NULL));
    kva_plan_destroy(pl); kva_plan_destroy(rp);
    kva_cache_destroy(c);
    kva_context_destroy(ctx); kva_context_destroy(ctx2); kva_context_destroy(rc);
    return 0;
}
