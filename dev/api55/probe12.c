/* probe12: kva_plan_info's classification against kvattn.h's definitions, random batches. */
#include "kvattn.h"
#include <stdio.h>
#include <stdlib.h>
int main(void)
{
    kva_context *ctx; kva_context_desc cd = {KVA_BACKEND_CPU, 2, 0}; kva_context_create(&cd, &ctx);
    srand(5);
    int bad = 0;
    for (int it = 0; it < 20000; it++) {
        int R = rand() % 6, thr = rand() % 4 == 0 ? 0 : rand() % 5;
        int32_t qsl[8] = {0}, sl[8], bt[8 * 8];
        for (int i = 0; i < 64; i++) bt[i] = i % 30;
        int nd = 0, ndt = 0, np = 0, npt = 0, maxq = 0, maxs = 0, any_ctx = 0, T = 0, dfirst = 1, seen_p = 0, any_spec = 0;
        int eff = thr == 0 ? 1 : thr;
        for (int r = 0; r < R; r++) {
            int q = rand() % 3 == 0 ? 0 : 1 + (rand() % 3 == 0 ? rand() % 6 : 0);
            int s = q + (rand() % 2 ? rand() % 20 : 0);
            qsl[r + 1] = qsl[r] + q; sl[r] = s; T += q;
            if (q == 0) continue;
            maxq = q > maxq ? q : maxq; maxs = s > maxs ? s : maxs;
            if (q <= eff) { nd++; ndt += q; if (seen_p) dfirst = 0; if (q > 1) any_spec = 1; }
            else { np++; npt += q; seen_p = 1; if (s > q) any_ctx = 1; }
        }
        kva_plan_desc d = {0};
        d.num_requests = R; d.query_start_loc = qsl; d.seq_lens = sl; d.block_table = bt; d.block_table_stride = 8; d.block_size = 4;
        d.decode_threshold = thr; d.num_heads = 2; d.num_kv_heads = 1; d.head_dim = 8; d.q_dtype = KVA_DTYPE_F32; d.causal = 1; d.window_left = -1;
        kva_plan *p; if (kva_plan_create(ctx, &d, &p)) { printf("plan fail %s\n", kva_last_error()); continue; }
        kva_plan_info in; kva_plan_get_info(p, &in);
        kva_attn_state want = T == 0 ? KVA_STATE_EMPTY : np == 0 ? (any_spec ? KVA_STATE_SPEC_DECODING : KVA_STATE_DECODE_ONLY) : nd == 0 ? (any_ctx ? KVA_STATE_PREFILL_CACHE_HIT : KVA_STATE_PREFILL_NO_CACHE) : KVA_STATE_CHUNKED_PREFILL;
        if (in.state != want || in.num_tokens != T || in.num_decodes != nd || in.num_decode_tokens != ndt || in.num_prefills != np || in.num_prefill_tokens != npt || in.max_q_len != maxq || in.max_seq_len != maxs || in.decode_first != dfirst) {
            if (bad++ < 10) printf("it %d R %d thr %d: state %s want %s; T %d/%d nd %d/%d ndt %d/%d np %d/%d npt %d/%d maxq %d/%d maxs %d/%d df %d/%d\n", it, R, thr, kva_attn_state_name(in.state), kva_attn_state_name(want), in.num_tokens, T, in.num_decodes, nd, in.num_decode_tokens, ndt, in.num_prefills, np, in.num_prefill_tokens, npt, in.max_q_len, maxq, in.max_seq_len, maxs, in.decode_first, dfirst);
        }
        kva_plan_destroy(p);
    }
    printf("%d bad\n", bad);
    return 0;
}
