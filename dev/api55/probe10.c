/* probe10: empty plans (R 0, or every q_len 0) with and without a block table, every run call. */
#include "kvattn.h"
#include <stdio.h>
#define P(expr) do { kva_status s_ = (expr); printf("%-4d %-28s %s | %s\n", __LINE__, kva_status_name(s_), #expr, kva_last_error()); } while (0)
int main(void)
{
    kva_context_desc cd[2] = {{KVA_BACKEND_REF, 1, 0}, {KVA_BACKEND_CPU, 1, 0}};
    for (int b = 0; b < 2; b++) {
        kva_context *ctx; kva_context_create(&cd[b], &ctx);
        printf("== %s\n", kva_backend_name(cd[b].backend));
        kva_cache_desc d = {4, 4, 2, 16, 0, KVA_DTYPE_F32, 0, 0, 0}; kva_cache *c; kva_cache_create(ctx, &d, &c);
        int32_t bt[4] = {0, 1, 2, 3}, qsl0[1] = {0}, qsl2[3] = {0, 0, 0}, sl2[2] = {5, 0};
        for (int v = 0; v < 5; v++) {
            kva_plan_desc e = {0}; e.num_heads = 4; e.num_kv_heads = 2; e.head_dim = 16; e.q_dtype = KVA_DTYPE_F32; e.block_size = 4; e.window_left = -1; e.causal = 1;
            if (v == 0) { e.num_requests = 0; }
            if (v == 1) { e.num_requests = 0; e.block_table = bt; e.block_table_stride = 4; e.query_start_loc = qsl0; }
            if (v == 2) { e.num_requests = 0; e.block_table = bt; e.block_table_stride = 0; }
            if (v == 3) { e.num_requests = 2; e.query_start_loc = qsl2; e.seq_lens = sl2; e.block_table = bt; e.block_table_stride = 2; }
            if (v == 4) { e.num_requests = 2; e.query_start_loc = qsl2; e.seq_lens = sl2; }
            kva_plan *pl = NULL;
            printf("-- variant %d\n", v);
            P(kva_plan_create(ctx, &e, &pl));
            P(kva_attention_run(ctx, pl, NULL, c, NULL, NULL, NULL));
            P(kva_attention_run_ragged(ctx, pl, NULL, NULL, NULL, NULL, NULL, NULL));
            kva_plan_destroy(pl);
        }
        kva_cache_destroy(c);
        kva_context_destroy(ctx);
    }
    return 0;
}
