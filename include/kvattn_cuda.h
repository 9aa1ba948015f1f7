/*
 * kvattn_cuda.h - entry points of the CUDA backend that have no meaning on
 * other backends: the stream a context runs on, and the capacity of the
 * device metadata a context keeps for its plans (CUDA graph capture).
 *
 * Stream: every call through a CUDA context (cache write/copy, plan upload,
 * attention, merge) is enqueued on the context's stream, the legacy default
 * stream 0 unless set here. Run-path calls never synchronize with the host.
 *
 * Plans and graphs: a CUDA context owns one set of device metadata buffers
 * (batch metadata and work lists) of fixed capacity. kva_plan_create uploads
 * its plan into them (cudaMemcpyAsync on the stream, from pinned staging), so
 * the most recent plan of a context owns the device metadata: running an older
 * plan of the same context fails with KVA_STATUS_INVALID_ARGUMENT. Because the
 * buffers keep their addresses, a graph captured over kva_attention_run (for
 * any number of layers) can be replayed after a new kva_plan_create, provided
 *   - the new plan has the same attention shape and semantics (H, Hkv, D, Dv,
 *     q_dtype, block_size, scale, causal, window_left, softcap, ALiBi on/off),
 *   - it fits the reserved capacity (the buffers did not grow), and
 *   - the tensors (q, cache, sinks, out, lse) are at the captured addresses.
 * Buffers grow only in kva_plan_create (which synchronizes the stream first
 * and is refused while the stream is capturing); reserve the largest batch
 * before capturing with kva_cuda_context_reserve.
 */
#ifndef KVATTN_CUDA_H
#define KVATTN_CUDA_H

#include "kvattn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Sets the stream (a cudaStream_t, or NULL for the legacy default stream) of
 * a CUDA context. The caller keeps ownership of the stream. Pending plan
 * uploads are drained first (a host wait for their copies); when the new
 * stream is capturing a graph, where a host wait would end the capture, that
 * wait is left to the context's next plan upload or stream change outside
 * capture, which then synchronizes the device once. So a graph can be
 * captured on a stream of its own over a context planned on another. The
 * auxiliary context of the context's cascade plans (their prefix pass)
 * moves with it. Kernels
 * already enqueued on the old stream are not drained: a context's runs share
 * its workspace (split-KV partials, the prefill tile counters), so they must
 * not overlap in time. Order the old stream's work before the new stream's
 * (an event, or a synchronize) before running on the new one; use one
 * context per stream for concurrent streams. Plan on the stream the runs (or
 * the graph's replays) are issued on: a plan's upload is ordered before them
 * by that stream only. */
KVA_API kva_status kva_cuda_context_set_stream(kva_context *ctx, void *stream);
/* The context's stream (NULL = legacy default stream). */
KVA_API kva_status kva_cuda_context_get_stream(const kva_context *ctx, void **out);

/* Capacity of the device metadata of a CUDA context: any plan with at most
 * these many requests, query tokens and block-table entries and this
 * attention shape fits without growing the buffers. */
typedef struct kva_cuda_capacity {
    int32_t max_requests;    /* R */
    int32_t max_tokens;      /* T */
    int64_t max_block_table; /* R * block_table_stride entries */
    int32_t num_heads;       /* H */
    int32_t num_kv_heads;    /* Hkv */
    int32_t head_dim_v;      /* Dv (sizes the split-KV partials) */
} kva_cuda_capacity;

/* Grows the context's device metadata and workspace to hold any plan within
 * cap, exactly (a plan beyond cap that grows them adds headroom of its own;
 * synchronizes the stream; refused while it is capturing). With
 * max_tokens > max_requests it also reserves the tile list of the tensor-core
 * prefill kernel, whose (possibly empty) launch is then part of every run of
 * a shape it supports, so a graph captured over decodes replays prefills.
 * It also reserves max_tokens draft-tree words, so a graph replays tree
 * plans too. */
KVA_API kva_status kva_cuda_context_reserve(kva_context *ctx, const kva_cuda_capacity *cap);

/* Quantized caches with int8 rows cannot store NaN (kvattn.h). On CUDA a
 * write checks its rows on the device and drops the whole write when one is
 * bad (the cache stays byte-identical). By default, outside stream capture,
 * kva_cache_write waits for that check (one stream synchronization per write
 * of an int8 cache) and returns the host backends' KVA_STATUS_INVALID_ARGUMENT.
 * During capture, or always once deferred mode is set on the context
 * (kva_cuda_context_set_deferred_write_status(ctx, 1): no write ever waits),
 * kva_cache_write returns KVA_STATUS_OK and a rejected write is recorded in
 * the cache instead. kva_cuda_cache_write_status (which synchronizes the
 * context's stream) reports the first write recorded since its previous call
 * -- KVA_STATUS_INVALID_ARGUMENT naming the token, head and channel -- and
 * clears the record; KVA_STATUS_OK when there is none (also for caches
 * without int8 rows). Writes after a rejected one still go through. */
KVA_API kva_status kva_cuda_context_set_deferred_write_status(kva_context *ctx, int deferred);
KVA_API kva_status kva_cuda_cache_write_status(kva_context *ctx, const kva_cache *cache);

#ifdef __cplusplus
}
#endif

#endif /* KVATTN_CUDA_H */
