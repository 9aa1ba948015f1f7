/*
 * mla_cpu.c - the CPU backend's layer-level MLA (kva_mla_run): work items,
 * scratch and the OpenMP team; the item bodies are in mla_items.inc.
 *
 * Work items need no list: item index r * H + h names request r and head h.
 * A request with q_len <= decode_threshold takes the absorbed path, one item
 * per group of KVA_MLA_HEAD_GROUP heads (the indices h % group == 0; the
 * others are empty), so each latent row is read once per group; a longer
 * request takes the compute-friendly path, one item per head. Requests with
 * q_len 0 have no items. The dynamic schedule spreads the items over the
 * threads; the empty indices cost a test each.
 */
#include "mla_cpu.h"

#include <math.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

size_t kva__cpu_mla_scratch_bytes(const kva_plan *plan)
{
    const kva_plan_desc *d = &plan->d;
    const size_t D = (size_t)d->head_dim, Dc = (size_t)d->head_dim_v, Dr = D - Dc;
    const size_t Dn = (size_t)d->mla_qk_nope_head_dim, Dv = (size_t)d->mla_v_head_dim;
    const size_t qmax = (size_t)plan->info.max_q_len, thr = (size_t)d->decode_threshold;
    const size_t group =
        d->num_heads < KVA_MLA_HEAD_GROUP ? (size_t)d->num_heads : (size_t)KVA_MLA_HEAD_GROUP;
    const size_t rows = (qmax < thr ? qmax : thr) * group;
    size_t n = kva__cpu_mla_floats(1, rows, D, Dc, Dr, Dn, Dv);
    if (qmax > thr) {
        const size_t p = kva__cpu_mla_floats(0, qmax, D, Dc, Dr, Dn, Dv);
        n = p > n ? p : n;
    }
    return (n * sizeof(float) + 63) & ~(size_t)63;
}

size_t kva__cpu_mla_workspace(const kva_plan *plan, int32_t nt)
{
    if (plan->d.kind != KVA_ATTN_MLA || plan->d.mla_qk_nope_head_dim == 0 ||
        plan->info.num_tokens == 0)
        return 0;
    return (size_t)(nt > 0 ? nt : 1) * kva__cpu_mla_scratch_bytes(plan);
}

kva_status kva__cpu_mla_run(kva_context *ctx, const kva_plan *plan, const void *q, const void *w_uk,
                            const void *w_uv, const kva_cache *cache, void *out, float *lse)
{
    const kva_plan_desc *d = &plan->d;
    kva__cpu_mla m;
    memset(&m, 0, sizeof m);
    m.plan = plan;
    m.cache = cache;
    m.q = q;
    m.w_uk = w_uk;
    m.w_uv = w_uv;
    m.out = out;
    m.lse = lse;
    m.H = d->num_heads;
    m.D = d->head_dim;
    m.Dc = d->head_dim_v;
    m.Dr = d->head_dim - d->head_dim_v;
    m.Dn = d->mla_qk_nope_head_dim;
    m.Dv = d->mla_v_head_dim;
    m.max_q_len = plan->info.max_q_len;
    if (cache->desc.quant == KVA_QUANT_FP8_E4M3) {
        const float s = cache->k_scale[0]; /* one per-tensor scale (MLA: Hkv = 1) */
        for (int i = 0; i < 256; i++)
            m.fp8_lut[i] = kva_fp8_e4m3_to_f32((uint8_t)i) * s;
    }
    void (*item_fn)(const kva__cpu_mla *, const kva__cpu_mla_item *, float *) =
        kva__cpu_mla_item_portable;
#if defined(__x86_64__) || defined(_M_X64)
    if (kva__cpu_isa_of(&ctx->cpu_features) >= KVA__ISA_AVX512)
        item_fn = kva__cpu_mla_item_avx512;
#endif
    /* Threads: the context's, as far as the workspace holds their scratch. */
    const size_t stride = kva__cpu_mla_scratch_bytes(plan);
    int nt = ctx->num_threads > 0 ? ctx->num_threads : 1;
    if ((size_t)nt > ctx->workspace_bytes / stride)
        nt = (int)(ctx->workspace_bytes / stride);
    if (nt < 1)
        nt = 1;
    const int64_t H = m.H, n_idx = (int64_t)d->num_requests * H;
    unsigned char *base = ctx->workspace;
#pragma omp parallel num_threads(nt)
    {
#ifdef _OPENMP
        const int tid = omp_get_thread_num();
#else
        const int tid = 0;
#endif
        float *scratch = (float *)(base + (size_t)tid * stride);
#pragma omp for schedule(dynamic, 1)
        for (int64_t idx = 0; idx < n_idx; idx++) {
            kva__cpu_mla_item it;
            it.r = (int32_t)(idx / H);
            it.h0 = (int32_t)(idx % H);
            const int32_t q_len = plan->query_start_loc[it.r + 1] - plan->query_start_loc[it.r];
            if (q_len == 0)
                continue;
            it.absorbed = q_len <= d->decode_threshold;
            if (it.absorbed && it.h0 % KVA_MLA_HEAD_GROUP != 0)
                continue; /* inside a group that the index h0 - h0 % group runs */
            it.nh = it.absorbed
                        ? (int32_t)(H - it.h0 < KVA_MLA_HEAD_GROUP ? H - it.h0 : KVA_MLA_HEAD_GROUP)
                        : 1;
            item_fn(&m, &it, scratch);
        }
    }
    return KVA_STATUS_OK;
}
