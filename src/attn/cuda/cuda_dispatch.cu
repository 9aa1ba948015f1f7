/*
 * cuda_dispatch.cu - the CUDA backend's run path: kva_attention_run and
 * kva_attention_run_ragged on a plan that kva__cuda_plan_build (cuda_plan.cu)
 * partitioned and uploaded. Per run it launches, on the context's stream:
 *   1. the prefill tiles' kernel (prefill_mma.h: wgmma on sm_90a at its head sizes,
 *      else mma.sync; quantized caches: attn_quant.cu takes the whole run);
 *   2. the work items' kernel the plan chose (cp->decode_kernel): the
 *      tensor-core decode (decode_mma.cu) or the CUDA-core kernel
 *      (attn_simt.cu);
 *   3. the split merge (split_merge.cu), unless the items' kernel merged its
 *      split tasks itself (the tensor-core decode: last-CTA merge).
 * Which kernel runs is decided per plan (kva__cuda_plan_build: the shape, or a
 * kernel forced through kva__context_force_kernel) and, for the prefill
 * tiles, per run (the cache's block size decides TMA).
 */
extern "C" {
#include "cuda_backend.h"
#include "partition.h"
#include "prefill_mma.h"
}
#include "cuda_check.h"
#include "quant_args.cuh"

#include <cuda_runtime.h>
#include <stdint.h>
#include <string.h>

typedef kva__cuda_attn_args attn_args;

extern "C" void kva__cuda_prefill_args_init(kva__cuda_prefill_args *pa, const kva_context *ctx,
                                            const kva_plan *plan, const kva_cache *cache,
                                            const void *q, const void *k, const void *v,
                                            const float *sinks, void *out, float *lse)
{
    const kva__cuda_state *st = (const kva__cuda_state *)ctx->state;
    const kva__cuda_plan *cp = (const kva__cuda_plan *)plan->device;
    const kva_plan_desc *d = &plan->d;
    memset(pa, 0, sizeof *pa);
    pa->q = q;
    pa->k = k;
    pa->v = v;
    pa->out = out;
    pa->lse = lse;
    pa->sinks = sinks;
    pa->alibi_slopes = cp->has_alibi ? st->meta.alibi : NULL;
    pa->query_start_loc = st->meta.qsl;
    pa->seq_lens = st->meta.seq_lens;
    pa->block_table = st->meta.block_table;
    pa->tiles = st->meta.ptiles;
    pa->num_tiles = st->meta.hdr + KVA_CUDA_HDR_PTILES;
    pa->grid_tiles = (int32_t)st->caps.ptiles;
    /* Per-plan values come from the device header (graph replay). */
    pa->block_table_stride_dev = st->meta.hdr + KVA_CUDA_HDR_BT_STRIDE;
    pa->tree = st->meta.tree;
    pa->tree_on = st->meta.hdr + KVA_CUDA_HDR_TREE;
    pa->block_size = cache->desc.block_size;
    pa->num_blocks = cache->desc.num_blocks;
    pa->num_heads = d->num_heads;
    pa->num_kv_heads = d->num_kv_heads;
    pa->head_dim = d->head_dim;
    pa->head_dim_v = d->head_dim_v;
    pa->dtype = d->q_dtype;
    pa->layout = cache->desc.layout;
    pa->scale = d->scale;
    pa->causal = d->causal;
    pa->window_left = d->window_left;
    pa->attention_chunk = d->attention_chunk;
    pa->softcap = d->softcap;
}

/*
 * The plan's prefills on the tensor-core kernel (prefill_mma.h). kva__cuda_plan_build
 * left them out of the work items and uploaded their tile list into the
 * metadata's prefill-tile section, its count into the header. The grid is the
 * section's capacity (CTAs past the count exit), so a graph captured here
 * replays any later plan that fits the capacity; the block-table stride is
 * read from the header for the same reason. Under graph capture it is
 * launched whenever the shape runs prefills there and the context has tile
 * capacity (0 tiles: the CTAs exit at once), not only when this plan has
 * prefills, so a graph captured over a decode-only batch also replays batches
 * with prefills; eager runs (eager != 0) skip it when the plan has no tile.
 */
static kva_status launch_prefill(kva_context *ctx, const kva_plan *plan, const attn_args *a,
                                 const kva_cache *cache, int eager)
{
    kva__cuda_state *st = (kva__cuda_state *)ctx->state;
    const kva__cuda_plan *cp = (const kva__cuda_plan *)plan->device;
    if (!cp->mma || !cache || st->caps.ptiles <= 0 || (eager && cp->num_ptiles == 0))
        return KVA_STATUS_OK;
    kva__cuda_prefill_args pa;
    kva__cuda_prefill_args_init(&pa, ctx, plan, cache, a->q, a->k, a->v, a->sinks, a->out, a->lse);
    pa.host_cache = &st->prefill_host;
    pa.narrow = cp->prefill_narrow;
    /* The dynamic tile schedule's counters: launches on the context's one
     * stream run one after the other, so the header's two words serve all. */
    pa.sched = (int32_t *)(st->meta.hdr + KVA_CUDA_HDR_PSCHED);
    return kva__cuda_prefill_launch_kernel(&pa, st->stream, cp->prefill_kernel);
}

extern "C" kva_status kva__cuda_attention(kva_context *ctx, const kva_plan *plan, const void *q,
                                          const kva_cache *cache, const void *k, const void *v,
                                          const float *sinks, void *out, float *lse)
{
    /* attn_quant.cu: all items and tiles of quantized MHA caches (an FP8
     * latent cache runs the MLA decode below, which reads its codes). */
    const int mla_fp8 = cache && cache->desc.kind == KVA_ATTN_MLA &&
                        cache->desc.quant == KVA_QUANT_FP8_E4M3;
    if (cache && cache->desc.quant != KVA_QUANT_NONE && !mla_fp8)
        return kva__cuda_attention_quant(ctx, plan, q, cache, sinks, out, lse);
    const kva__cuda_state *st = (const kva__cuda_state *)ctx->state;
    const kva__cuda_plan *cp = (const kva__cuda_plan *)plan->device;
    const kva_plan_desc *d = &plan->d;
    cudaStream_t stream = (cudaStream_t)st->stream;
    attn_args a;
    memset(&a, 0, sizeof a);
    a.meta = st->meta;
    a.q = q;
    a.k = cache ? cache->k : k;
    a.v = cache ? cache->v : v;
    kva__attn_args_common(a, ctx, plan, cache, sinks, out, lse);
    a.layout_hnd = cache && cache->desc.layout == KVA_LAYOUT_HND;
    a.ragged = cache == NULL;
    a.kv_fp8 = mla_fp8;
    a.kv_scale = mla_fp8 ? cache->k_scale[0] : 1.f;
    a.NB = cache ? cache->desc.num_blocks : 0;

    /* 16-byte loads need 16-byte aligned rows: q rows are D elements apart,
     * cache rows D (or Dv) elements; D is a multiple of 8, so for f16/bf16
     * every row is aligned once the base pointers are, f32 needs D % 4 == 0
     * (always true). */
    if (((uintptr_t)q | (uintptr_t)a.k | (uintptr_t)a.v) % 16 != 0)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "kva_attention_run: CUDA backend needs 16-byte aligned q (%p), k (%p) and "
                         "v (%p)",
                         q, a.k, a.v);

    /* Eager runs (the stream is not capturing a graph) launch only the kernels
     * that have work in this plan: the host knows its prefill tiles, work items
     * and split tasks. A kernel with nothing to do still costs its launch and a
     * few microseconds of GPU time (1 x 4096 causal prefill on an H100: the
     * empty decode and merge kernels after the prefill kernel took ~9 us of
     * 273). Under capture every kernel is launched, so that the graph replays
     * any later plan that fits the context's capacities. */
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    KVA_CUDA_TRY(cudaStreamIsCapturing(stream, &cs));
    const int eager = cs == cudaStreamCaptureStatusNone;
    KVA_TRY(launch_prefill(ctx, plan, &a, cache, eager));
    const int grid = st->num_sms * cp->per_sm;
    if (eager && plan->part->num_items == 0) {
        /* no decode or short-prefill item */
    } else if (cp->decode_kernel == KVA__CUDA_K_MLA_DECODE_MMA) {
        KVA_TRY(kva__cuda_mla_decode_launch(&a, d->q_dtype, cp->rows, grid, stream));
    } else if (cp->decode_kernel == KVA__CUDA_K_MLA_DECODE_WGMMA) {
        KVA_TRY(kva__cuda_mla_wgmma_launch(&a, d->q_dtype, grid, stream));
    } else if (cp->decode_kernel == KVA__CUDA_K_DECODE_MMA) {
        KVA_TRY(kva__cuda_decode_mma_launch(
            &a, d->q_dtype, kva__cuda_decode_grid(grid, plan->part->num_items, eager), cp->balanced,
            eager, st->device, stream));
    } else {
        KVA_TRY(kva__cuda_simt_launch(&a, d->q_dtype, cp->rows, grid, stream));
    }
    /* Launched under capture even when the plan has no split task (it then
     * exits), so a graph captured over a plan without splits replays plans
     * with splits; never after the tensor-core decode, which merged every
     * task of the plan (all its split items are that kernel's). */
    if ((eager && plan->part->num_tasks == 0) || cp->decode_kernel == KVA__CUDA_K_DECODE_MMA)
        return KVA_STATUS_OK;
    return kva__cuda_split_merge_launch(&a.meta, a.ws, sinks, out, lse, a.H, a.G, a.Dv, d->q_dtype,
                                        st->num_sms * 2, stream);
}
