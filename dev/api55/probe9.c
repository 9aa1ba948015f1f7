/* probe9: zero counts still validate the other arguments (kvattn.h, Zero sizes). */
#include "kvattn.h"
#include <stdio.h>
#define P(expr) do { kva_status s_ = (expr); printf("%-4d %-28s %s | %s\n", __LINE__, kva_status_name(s_), #expr, kva_last_error()); } while (0)
int main(void)
{
    kva_context *ctx; kva_context_desc cd = {KVA_BACKEND_CPU, 1, 0}; kva_context_create(&cd, &ctx);
    kva_context *rc; kva_context_desc rd = {KVA_BACKEND_REF, 1, 0}; kva_context_create(&rd, &rc);
    kva_cache_desc d = {4, 4, 2, 16, 0, KVA_DTYPE_F32, 0, 0, 0}; kva_cache *c, *c2, *c3, *ci;
    kva_cache_create(ctx, &d, &c);
    kva_cache_desc d2 = d; d2.head_dim = 8; kva_cache_create(ctx, &d2, &c2);
    kva_cache_desc d3 = d; d3.kind = KVA_ATTN_MLA; d3.num_kv_heads = 1; d3.head_dim_v = 8; kva_cache_create(ctx, &d3, &c3);
    kva_cache_desc di = {4, 4, 1, 16, 0, KVA_DTYPE_F32, 0, 0, KVA_ATTN_INDEX}; kva_cache_create(ctx, &di, &ci);
    P(kva_cache_write(NULL, c, 0, NULL, 0, NULL, 0, KVA_DTYPE_F32, NULL));
    P(kva_cache_write(ctx, NULL, 0, NULL, 0, NULL, 0, KVA_DTYPE_F32, NULL));
    P(kva_cache_write(ctx, c, 0, NULL, 0, NULL, 0, KVA_DTYPE_I8, NULL));
    P(kva_cache_write(ctx, c, 0, NULL, -5, NULL, 0, KVA_DTYPE_F32, NULL));
    P(kva_cache_write(ctx, c, 0, NULL, 8, NULL, 0, KVA_DTYPE_F32, NULL));
    P(kva_cache_write(rc, c, 0, NULL, 0, NULL, 0, KVA_DTYPE_F32, NULL));
    P(kva_cache_write(rc, c, 1, (float[32]){0}, 0, (float[32]){0}, 0, KVA_DTYPE_F32, (int64_t[1]){0}));
    P(kva_cache_read(ctx, c, 0, NULL, NULL, 0, NULL, 0, KVA_DTYPE_I8));
    P(kva_cache_read(ctx, c, 0, NULL, NULL, -1, NULL, 0, KVA_DTYPE_F32));
    P(kva_cache_read(ctx, ci, 0, NULL, NULL, 0, (void *)8, 0, KVA_DTYPE_F32));
    P(kva_cache_read(ctx, ci, 1, (int64_t[1]){0}, (float[16]){0}, 0, (float[16]){0}, 0, KVA_DTYPE_F32));
    P(kva_cache_write(ctx, ci, 0, NULL, 0, (void *)8, 0, KVA_DTYPE_F32, NULL));
    P(kva_cache_write(ctx, ci, 1, (float[16]){0}, 0, (float[16]){0}, 0, KVA_DTYPE_F32, (int64_t[1]){0}));
    P(kva_cache_copy_blocks(NULL, c, NULL, 0));
    P(kva_cache_copy_blocks(ctx, NULL, NULL, 0));
    P(kva_cache_copy_blocks(ctx, c, NULL, -1));
    P(kva_cache_swap_blocks(ctx, c, c2, NULL, 0));
    P(kva_cache_swap_blocks(ctx, c, c3, NULL, 0));
    P(kva_cache_swap_blocks(ctx, c, c, NULL, 0));
    P(kva_cache_swap_blocks(ctx, c, c, (int32_t[2]){0, 1}, 1));
    P(kva_merge_states(ctx, 0, 0, 8, KVA_DTYPE_F32, NULL, NULL, NULL, NULL, NULL, NULL));
    P(kva_merge_states(ctx, 0, 1, 12, KVA_DTYPE_F32, NULL, NULL, NULL, NULL, NULL, NULL));
    P(kva_merge_states(ctx, 0, 1, 8, KVA_DTYPE_I8, NULL, NULL, NULL, NULL, NULL, NULL));
    P(kva_merge_states(NULL, 0, 1, 8, KVA_DTYPE_F32, NULL, NULL, NULL, NULL, NULL, NULL));
    P(kva_merge_states_n(ctx, 0, 0, 1, 8, KVA_DTYPE_F32, NULL, 0, NULL, 0, NULL, NULL));
    P(kva_merge_states_n(ctx, 2, 0, 1, 8, KVA_DTYPE_F32, NULL, -1, NULL, 0, NULL, NULL));
    P(kva_merge_states_n(ctx, 2, 0, 1, 8, KVA_DTYPE_F32, NULL, 3, NULL, 0, NULL, NULL));
    kva_pool *p; kva_pool_desc pd = {8, 4, 0, 0}; kva_pool_create(&pd, &p);
    P(kva_pool_request_slots(p, 5, 0, 0, NULL));
    P(kva_pool_request_slots(p, -1, 0, 0, NULL));
    P(kva_pool_request_append_tokens(p, 5, NULL, 0));
    P(kva_pool_request_allocate(p, 5, 0, 0));
    P(kva_pool_request_block_table(p, 5, NULL, 0, NULL));
    P(kva_pool_request_slots(NULL, 0, 0, 0, NULL));
    P(kva_batch_reorder_decode_first(0, NULL, -1, NULL, NULL));
    P(kva_batch_reorder_decode_first(0, NULL, 1, NULL, NULL));
    P(kva_convert(NULL, KVA_DTYPE_I8, NULL, KVA_DTYPE_F32, 0));
    P(kva_dcp_slots(2, 5, 1, 4, NULL, 0, 0, 0, NULL));
    P(kva_dcp_slots(2, 0, 1, 4, NULL, -1, 0, 0, NULL));
    /* empty plan run with bad args */
    kva_plan_desc e = {0}; e.num_requests = 0; e.num_heads = 4; e.num_kv_heads = 2; e.head_dim = 16; e.q_dtype = KVA_DTYPE_F32; e.block_size = 4; e.window_left = -1;
    kva_plan *pl = NULL; P(kva_plan_create(ctx, &e, &pl));
    P(kva_attention_run(ctx, pl, NULL, c, NULL, NULL, NULL));
    P(kva_attention_run(ctx, pl, NULL, c2, NULL, NULL, NULL));
    P(kva_attention_run(ctx, pl, NULL, NULL, NULL, NULL, NULL));
    P(kva_attention_run(rc, pl, NULL, c, NULL, NULL, NULL));
    P(kva_attention_run_ragged(ctx, pl, NULL, NULL, NULL, NULL, NULL, NULL));
    P(kva_mla_run(ctx, pl, NULL, NULL, NULL, c, NULL, NULL));
    P(kva_mla_sparse_run(ctx, pl, NULL, c, NULL, 0, NULL, NULL, NULL, NULL));
    P(kva_indexer_run(ctx, pl, NULL, NULL, ci, NULL, 0, NULL));
    e.q_dtype = KVA_DTYPE_F16; kva_plan *pl16; kva_plan_create(ctx, &e, &pl16);
    P(kva_attention_run(ctx, pl16, NULL, c, NULL, NULL, NULL));
    return 0;
}
