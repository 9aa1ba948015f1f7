/*
 * cuda_backend.h - state and internal interfaces of the CUDA backend, shared
 * by its .cu files (C declarations; the .cu files include it in extern "C").
 *
 * Device metadata: one device buffer per context, cut into fixed sections
 * (header, work items, split tasks, query_start_loc, seq_lens, kv_start,
 * block_table, alibi, prefill tiles, global seq_lens, tree words). Its section addresses change
 * only when it grows, which happens only at plan time; kernels read every per-plan value (counts,
 * block-table stride) from the header, so a captured graph replays with the
 * metadata of whatever plan was uploaded last.
 */
#ifndef KVA_CUDA_BACKEND_H
#define KVA_CUDA_BACKEND_H

#include "internal.h"
#include "kvattn_cuda.h"
#include "prefill_mma.h"

/* ---- context and memory (cuda_ctx.cu, cache_ops.cu, cache_quant.cu,
 * device.cu): core reaches these only through kva__cuda_ops and its memory
 * table (src/core/internal.h) ---- */

/* Number of CUDA devices visible (0 without a driver or a GPU). */
int kva__cuda_device_count(void);
/* Creates ctx->state (stream 0, empty buffers) on ctx->device_id; frees it. */
kva_status kva__cuda_context_init(kva_context *ctx);
void kva__cuda_context_free(kva_context *ctx);
/* Device memory on ctx's device (bytes > 0); freed on device_id. */
kva_status kva__cuda_alloc(const kva_context *ctx, size_t bytes, void **out);
void kva__cuda_free(int32_t device_id, void *p);
/* The memory table's cache entries (kva__memory_ops): K and V of a device
 * cache, plus the quantized formats' device state (kva__cuda_cache_quant_init);
 * writes (slots >= NB*B are skipped by the kernel); block copies between a
 * device cache and a device or host cache, on the context's stream. */
kva_status kva__cuda_cache_alloc(kva_context *ctx, kva_cache *c);
void kva__cuda_cache_free(kva_cache *c);
kva_status kva__cuda_cache_write(kva_context *ctx, kva_cache *cache, int32_t num_tokens,
                                 const void *k, int64_t k_stride, const void *v, int64_t v_stride,
                                 kva_dtype src_dtype, const int64_t *slot_mapping);
kva_status kva__cuda_copy_blocks(kva_context *ctx, const kva_cache *src, kva_cache *dst,
                                 const int32_t *pairs, int32_t n);
/* Quantized device caches: allocates c->k_token_scale (zeroed, INT8_TOKEN_K
 * formats), c->dev_scales (a copy of the host c->k_scale .. v_offset) and
 * c->dev_reject on ctx's device; kva__cuda_cache_quant_free releases them. */
kva_status kva__cuda_cache_quant_init(const kva_context *ctx, kva_cache *c);
void kva__cuda_cache_quant_free(kva_cache *c);

/* One work item as the kernels read it (from kva__work_item). */
typedef struct kva__cuda_item {
    int32_t req, kv_head, h0, nh, i0, nq, k0, k1, task, split;
} kva__cuda_item;

/* One split task (from kva__split_task); partials at ws + ws_off floats:
 * num_splits blocks of [nq*nh, Dv] outputs then [nq*nh] lse; keys [k0, k1)
 * in chunks of `chunk`. done: the task's partials written so far in this
 * run, counted by the tensor-core decode, whose CTA that writes the last one
 * merges the task (decode_mma_kernel.cuh); grab: the key units of the task
 * that decode's warps have taken so far (its balanced schedule). Both are
 * uploaded 0 and set back to 0 by the merging CTA, so every run and graph
 * replay starts from 0. */
typedef struct kva__cuda_task {
    int32_t req, kv_head, h0, nh, i0, nq, num_splits, done;
    int32_t k0, k1, chunk, grab;
    int64_t ws_off;
} kva__cuda_task;

/* Header words of the device metadata. */
enum {
    KVA_CUDA_HDR_ITEMS = 0, /* number of work items */
    KVA_CUDA_HDR_TASKS,     /* number of split tasks */
    KVA_CUDA_HDR_REQS,      /* R */
    KVA_CUDA_HDR_BT_STRIDE, /* block_table_stride */
    KVA_CUDA_HDR_PTILES,    /* tiles of the tensor-core prefill kernel (prefill_mma.h) */
    /* A sharded plan whose rows do not all see every local key (dcp_pos.cuh):
     * N, this rank, the interleave; 0 otherwise. */
    KVA_CUDA_HDR_DCP_N,
    KVA_CUDA_HDR_DCP_RANK,
    KVA_CUDA_HDR_DCP_I,
    /* 1 when the plan has a draft tree: meta.tree holds a word per query
     * token (tree_mask.cuh); 0 otherwise. */
    KVA_CUDA_HDR_TREE,
    /* Two counters of the wgmma prefill's dynamic CTA-tile schedule
     * (kva__cuda_prefill_args.sched): zero between launches (the kernel's
     * last CTA resets them; every upload writes them 0). */
    KVA_CUDA_HDR_PSCHED,
    KVA_CUDA_HDR_PSCHED_DONE,
    KVA_CUDA_HDR_USED, /* words in use: new words go above this line */
    KVA_CUDA_HDR_WORDS = 16
};
#ifdef __cplusplus
static_assert(KVA_CUDA_HDR_USED <= KVA_CUDA_HDR_WORDS, "the plan header's words outgrew it");
#else
_Static_assert(KVA_CUDA_HDR_USED <= KVA_CUDA_HDR_WORDS, "the plan header's words outgrew it");
#endif

/* Capacities (element counts) of the metadata sections. */
typedef struct kva__cuda_caps {
    int64_t items, tasks, reqs, bt, heads;
    int64_t tree;   /* tree words (query tokens of a tree plan) */
    int64_t ptiles; /* prefill tiles; 0 until a plan or reserve needs them. It is
                       also the prefill kernel's grid size (CTAs past the header's
                       KVA_CUDA_HDR_PTILES count exit). */
} kva__cuda_caps;

/* Section pointers into the device metadata buffer. */
typedef struct kva__cuda_meta {
    const int32_t *hdr;          /* [KVA_CUDA_HDR_WORDS] */
    const kva__cuda_item *items; /* [caps.items] */
    const kva__cuda_task *tasks; /* [caps.tasks] */
    const int32_t *qsl;          /* [caps.reqs + 1] query_start_loc */
    const int32_t *seq_lens;     /* [caps.reqs] */
    const int64_t *kv_start;     /* [caps.reqs + 1] ragged K/V row starts */
    const int32_t *block_table;  /* [caps.bt] */
    const float *alibi;          /* [caps.heads] */
    const int32_t *ptiles;       /* [caps.ptiles, 4] prefill tiles {r, m0, kvh, 0} */
    const int32_t *dcp_seq_lens; /* [caps.reqs] global seq_lens (sharded plans, dcp_pos.cuh) */
    const uint64_t *tree;        /* [caps.tree] tree words of the query tokens (kva_plan.tree_bits,
                                    read while the header's KVA_CUDA_HDR_TREE is set) */
    int32_t items_cap;           /* caps.items: a CTA may read its first item's record before
                                    it knows the header's item count (decode_mma_kernel.cuh) */
} kva__cuda_meta;

/* The CUDA backend's kernels, as indices into its registry (kva__cuda_kernels,
 * cuda_kernels.cu); tests and benchmarks force one through
 * kva__context_force_kernel. Each covers every cache format (float and
 * quantized) it has a K/V load path for. */
typedef enum kva__cuda_kernel {
    /* Decode family: the plan's work items (decodes, speculative decodes,
     * short chunked prefills, ragged and unsupported shapes). */
    KVA__CUDA_K_DECODE_MMA = 0, /* "decode_mma_sm80": tensor cores, 16-row items (decode_mma*.cu) */
    KVA__CUDA_K_DECODE_SIMT,    /* "decode_simt": CUDA cores, any dtype and head size
                                   (attn_simt.cu, attn_quant.cu) */
    /* Prefill family: the plan's prefill tiles (prefill_mma.h). */
    KVA__CUDA_K_PREFILL_WGMMA_TMA, /* "prefill_wgmma_tma_sm90" */
    KVA__CUDA_K_PREFILL_WGMMA,     /* "prefill_wgmma_sm90" */
    /* The same two in the narrow tile shape (prefill_wgmma.cuh wg_dims; D 128,
     * the wide shape at other head sizes); the two above force the wide one,
     * the plan picks by q_len when none is forced. */
    KVA__CUDA_K_PREFILL_WGMMA_TMA_NARROW, /* "prefill_wgmma_tma_narrow_sm90" */
    KVA__CUDA_K_PREFILL_WGMMA_NARROW,     /* "prefill_wgmma_narrow_sm90" */
    KVA__CUDA_K_PREFILL_MMA,              /* "prefill_mma_sm80" (float and quantized caches) */
    KVA__CUDA_K_PREFILL_ITEMS,            /* "prefill_items": no tiles, prefills as work items of
                                             the plan's decode-family kernel */
    /* MLA family: every work item of a latent-cache plan (KVA_ATTN_MLA). */
    KVA__CUDA_K_MLA_DECODE_MMA,   /* "mla_decode_mma_sm80": absorbed MLA on mma.sync,
                                     items of 16, 32 or 64 rows (mla_decode_mma.cu) */
    KVA__CUDA_K_MLA_DECODE_WGMMA, /* "mla_decode_wgmma_sm90": absorbed MLA on sm_90a
                                     wgmma, items of 64 rows (mla_decode_wgmma.cu) */
    KVA__CUDA_KERNELS
} kva__cuda_kernel;
extern const kva__kernel_info kva__cuda_kernels[KVA__CUDA_KERNELS];

/* One resident-CTAs-per-SM answer of the occupancy query (kva__cuda_state.occ). */
typedef struct kva__cuda_occ {
    kva_dtype dtype;
    int32_t dmax;
    int rows, kernel, per_sm;
} kva__cuda_occ;
#define KVA__CUDA_OCC_CACHE 16

/* The staging rings of a context's plan uploads (cuda_meta.cu,
 * staging_acquire): pinned memory in two halves per ring; an upload stages
 * the byte ranges it copies, packed; uploads are staged one after another in
 * a half, and when the next one does not fit in what is left of it, an event
 * on the stream marks that half (its copies) and the upload moves to the
 * other half, first waiting for that half's own event. Ring 0 (hot) takes the
 * uploads of up to kva__cuda_state.staging_hot bytes (KVA__CUDA_STAGING_HOT
 * unless a benchmark set it) in halves of that size, small enough to stay in
 * the host's caches between steps; ring 1 the larger ones, in halves sized by
 * the largest upload so far (at most one metadata buffer), made by the first
 * such upload. */
#define KVA__CUDA_RINGS 2
#define KVA__CUDA_STAGING_HOT ((size_t)128 << 10)
typedef struct kva__cuda_ring {
    void *events[2]; /* cudaEvent_t per half */
    int pending[2];  /* the half's event has been recorded and not yet waited for */
    uint64_t pos;    /* where the next upload is staged: a byte offset into the ring */
    int half;        /* the half that pos lies in (pos may be its end) */
} kva__cuda_ring;

typedef struct kva__cuda_state {
    int device;
    void *stream; /* cudaStream_t; NULL = legacy default stream */
    int num_sms;
    uint64_t generation; /* bumped by every plan upload */
    kva__cuda_caps caps;
    int force_splits;          /* 0, the chunks every partition unit of this context's plans
                                  is cut into, or -1: the former split choice (benchmarks;
                                  kva__partition_grid) */
    int balanced;              /* 1: the tensor-core decode's balanced schedule of split items
                                  (kva__cuda_context_balanced; 0, the default, keeps runs
                                  bitwise reproducible) */
    int deferred_write_status; /* kva_cuda_context_set_deferred_write_status */
    int drain_deferred;        /* kva_cuda_context_set_stream moved onto a capturing stream
                                  without draining the staging rings (no host wait may run
                                  during capture): the next drain or upload synchronizes the
                                  device and restarts the rings */
    size_t upload_min;         /* a plan's one copy spans at least this many bytes of the
                                  buffer (KVA__CUDA_UPLOAD_MIN unless a benchmark set it,
                                  kva__cuda_context_upload_min; 0: its used bytes) */
    size_t staging_hot;        /* the hot staging ring's half (KVA__CUDA_STAGING_HOT unless a
                                  benchmark set it, kva__cuda_context_staging_hot; 0: no hot
                                  ring) */
    double *probe;             /* benchmarks (kva__cuda_context_plan_probe): clock stamps of the
                                  plan build's phases, or NULL */
    void *meta_dev;            /* device metadata buffer */
    void *meta_host;           /* pinned staging of the hot ring (kva__cuda_ring 0): its two
                                  halves (256 bytes when it has none) */
    void *stage_big;           /* pinned staging of ring 1: its two halves, or NULL before
                                  the first upload larger than the hot ring's half */
    size_t stage_big_half;     /* bytes of each half of stage_big (0 while NULL) */
    size_t meta_bytes;         /* size of the device buffer */
    kva__cuda_ring *ring;      /* [KVA__CUDA_RINGS] the staging rings' events and counters */
    int ring_slots;            /* 2 (the staging halves) once meta_host is allocated */
    kva__cuda_meta meta;
    /* Resident CTAs per SM of the attention kernels for the shapes planned so
     * far (cuda_ctx.cu, ctas_per_sm_cached): fixed per kernel and device, so
     * kva_plan_create asks the runtime once per shape, not per plan. */
    kva__cuda_occ occ[KVA__CUDA_OCC_CACHE];
    int num_occ;
    /* What the prefill launchers ask the runtime and driver once per context
     * instead of per launch (SM count, tensor maps, kernel attributes). */
    kva__cuda_prefill_host_cache prefill_host;
    /* ctx->workspace / ctx->workspace_bytes hold the device split partials. */
    int32_t mla_chunk_keys;    /* kva__cuda_context_mla_chunk: 0 = the plan's choice */
    int mla_gemm_mma;          /* kva__cuda_context_mla_gemm: 1 = kva_mla_run's GEMMs run the
                                  mma.sync form everywhere, 2 = the wgmma form on a grid of
                                  5 CTAs */
    int64_t index_pass_floats; /* kva__cuda_context_indexer_test: 0 = IDX_WS_FLOATS */
    int index_no_wgmma;        /* kva__cuda_context_indexer_test: flags bits 0, 2, 3 */
    int index_topk_full;       /* kva__cuda_context_indexer_test: 1 = full-row top-K passes */
} kva__cuda_state;

/* Waits until no upload of st still reads its staging (before the context's
 * stream changes; cuda_meta.cu). */
kva_status kva__cuda_upload_drain(kva__cuda_state *st);

/* Plan-side data of the CUDA backend (plan->device). */
typedef struct kva__cuda_plan {
    uint64_t generation; /* state generation this plan uploaded */
    int rows;            /* attention rows per work item of the decode kernel */
    int decode_kernel;   /* KVA__CUDA_K_DECODE_MMA or _SIMT: the work items' kernel */
    int per_sm;          /* resident CTAs per SM of that kernel (grid size) */
    kva__cuda_prefill_kernel prefill_kernel; /* the prefill tiles' kernel
                                                (KVA__CUDA_PREFILL_AUTO: the dispatcher's) */
    int has_alibi;
    int balanced;         /* the tensor-core decode runs the balanced schedule of split items:
                             the context asked for it (kva__cuda_context_balanced) and some
                             task has at least KVA__CUDA_BALANCED_SPLITS splits */
    int mma;              /* the shape runs prefills on prefill_mma (paged plans, D in
                             {64, 128, 256}, Dv == D, f16/bf16): under graph capture
                             the kernel is launched whenever the context has
                             prefill-tile capacity (with 0 tiles when the batch has no
                             prefill, so captured graphs replay batches with
                             prefills); eager runs skip it when num_ptiles == 0 */
    int32_t num_ptiles;   /* prefill tiles of this plan */
    int prefill_narrow;   /* the prefill tiles run the wgmma kernels' narrow tile shape
                             (kva__cuda_prefill_args.narrow): every prefill is short */
    int32_t num_prefills; /* requests routed to prefill_mma */
    int dcp_global;       /* sharded, and some row does not see every local key: masks on
                             global positions (dcp_pos.cuh), no prefill tiles */
    /* Layer-level MLA plans (mla head sizes given): kva_mla_run's part
     * (mla_run.h); the partition then holds the absorbed requests only. */
    struct kva__cuda_mla_plan *mla;
    /* Indexer plans (kind KVA_ATTN_INDEX, indexer.cu): their own device
     * tiles and metadata; the fields above stay 0. */
    struct kva__cuda_index_plan *index;
} kva__cuda_plan;

/* The lightning indexer (indexer.cu): plan build (instead of the attention
 * partition; sets plan->device with .index), its release, and the run
 * (kva__backend_ops.indexer). */
kva_status kva__cuda_indexer_plan_build(kva_context *ctx, kva_plan *plan);
void kva__cuda_indexer_plan_free(struct kva__cuda_index_plan *ip);
kva_status kva__cuda_indexer(kva_context *ctx, const kva_plan *plan, const void *q,
                             const float *weights, const kva_cache *cache, int32_t *indices,
                             int64_t indices_stride, int32_t *topk_length);
/* Benchmarks (tools/bench_indexer_cuda.c): the run's parts (bit 0: the
 * logits kernel, bit 1: the top-K kernel; 3 = kva__cuda_indexer), and a
 * kernel reading exactly the keys (codes and scales) the logits kernel
 * reads, once per tile, nothing else; *bytes (if not NULL) receives that
 * count. Enqueued on ctx's stream. */
kva_status kva__cuda_indexer_parts(kva_context *ctx, const kva_plan *plan, const void *q,
                                   const float *weights, const kva_cache *cache, int32_t *indices,
                                   int64_t indices_stride, int32_t *topk_length, int parts);
kva_status kva__cuda_indexer_probe(kva_context *ctx, const kva_plan *plan, const kva_cache *cache,
                                   double *bytes);
/* Tests and benchmarks: indexer plans created on ctx from now on hold at
 * most pass_floats logits per pass (0: the default 1 GiB), so a small plan
 * runs the multi-pass path; flags bit 0: those plans use the mma.sync
 * logits kernel where the sm_90a one would run; bit 1: their top-K reads
 * the whole row in every radix pass (no shared-memory candidate buffer);
 * bit 2: the FP8-q mode takes the sm_90a wgmma kernel, not the
 * warp-specialized one; bit 3: the warp-specialized kernel runs 2 CTAs
 * (each takes many tiles). Bits 0, 2 and 3 live in index_no_wgmma. */
kva_status kva__cuda_context_indexer_test(kva_context *ctx, int64_t pass_floats, int flags);
/* Index-key caches in device memory (index_cache.cu): storage (v aliases k),
 * the write (k [T, D] rows at k_stride elements; slots past the cache
 * skipped) and their read-back (called by kva__cuda_cache_read). */
kva_status kva__cuda_index_cache_alloc(kva_context *ctx, kva_cache *c);
kva_status kva__cuda_index_cache_write(kva_context *ctx, kva_cache *cache, int32_t num_tokens,
                                       const void *k, int64_t k_stride, kva_dtype src_dtype,
                                       const int64_t *slot_mapping);
kva_status kva__cuda_index_cache_read(kva_context *ctx, const kva_cache *cache, int32_t num_tokens,
                                      const int64_t *slot_mapping, void *k, int64_t k_stride,
                                      kva_dtype dst_dtype);

/* kva_cache_write into a quantized device cache (cache_quant.cu); arguments
 * as kva__cuda_cache_write's. */
kva_status kva__cuda_cache_write_quant(kva_context *ctx, kva_cache *cache, int32_t num_tokens,
                                       const void *k, int64_t k_stride, const void *v,
                                       int64_t v_stride, kva_dtype src_dtype,
                                       const int64_t *slot_mapping);
/* kva_attention_run over a quantized paged cache (attn_quant.cu): every item
 * of the plan and every prefill tile, then the split merge. */
kva_status kva__cuda_attention_quant(kva_context *ctx, const kva_plan *plan, const void *q,
                                     const kva_cache *cache, const float *sinks, void *out,
                                     float *lse);

/* The prefill-tile kernels' arguments (prefill_mma.h) of a run of plan on
 * ctx over the paged cache (k, v: its K and V; for a quantized cache the
 * codes) from the plan, the context's metadata (tiles, block table, header)
 * and the cache; every other field 0 (cuda_dispatch.cu). */
void kva__cuda_prefill_args_init(kva__cuda_prefill_args *pa, const kva_context *ctx,
                                 const kva_plan *plan, const kva_cache *cache, const void *q,
                                 const void *k, const void *v, const float *sinks, void *out,
                                 float *lse);

/* Attention rows (query rows x heads) one CTA of the attention kernel holds,
 * chosen from the GQA group size only (so it is a property of the shape). */
int kva__cuda_rows_for_group(int32_t group);

/* Rows of one item of the tensor-core decode kernel: one m16 tile. */
#define KVA__CUDA_MMA_DECODE_ROWS 16

/* The largest resident CTAs per SM x split-task rows of the kernels a plan
 * within cap may run, and (*per_sm_max) the largest resident CTAs per SM
 * alone (cuda_plan.cu; kva_cuda_context_reserve's workspace is 12 x SMs x
 * the first x (Dv + 1) floats, cuda_meta.cu caps_for). Needs the device
 * current; both at least 1. */
int64_t kva__cuda_reserve_slot_rows(const kva_cuda_capacity *cap, int *per_sm_max);

/* Kernel arguments of the attention kernels (fixed for a captured graph). */
typedef struct kva__cuda_attn_args {
    kva__cuda_meta meta;
    const void *q;      /* [T, H, D] */
    const void *k;      /* paged K, or ragged [sum s, Hkv, D] */
    const void *v;      /* paged V, or ragged [sum s, Hkv, Dv] */
    const float *sinks; /* [H] or NULL */
    void *out;          /* [T, H, Dv] */
    float *lse;         /* [T, H] or NULL */
    float *ws;          /* split partials */
    int32_t H, Hkv, G, D, Dv, B;
    int32_t layout_hnd, ragged, causal, window_left, chunk, has_alibi; /* chunk: attention_chunk */
    float scale, softcap;
    /* Appended last, so that objects built against the fields above still
     * agree on them (bench/mla_ab_cuda.sh links a base tree's MLA files):
     * kv_fp8 1: the MLA decode reads an FP8_E4M3 latent cache, whose k_scale
     * kv_scale the FP8 instantiations fold into the logits' scale and the
     * output; 0: a latent cache of the q dtype. */
    int32_t kv_fp8;
    float kv_scale;
    /* Appended after kv_fp8 for the same reason: the paged cache's block
     * count NB (0 when unknown or ragged), which bounds the TMA tensor map
     * of the MLA wgmma decode's 16-bit latent rows. */
    int32_t NB;
} kva__cuda_attn_args;

/* decode_mma.cu: 1 if the tensor-core decode kernel covers the shape (D in
 * {64, 128, 256}, Dv == D, f16/bf16). */
int kva__cuda_decode_mma_supported(int32_t head_dim, int32_t head_dim_v, kva_dtype dtype);
/* Resident CTAs per SM of the tensor-core decode kernel for the shape (raises
 * its dynamic shared-memory limit); 0 if it cannot run. */
int kva__cuda_decode_mma_ctas_per_sm(kva_dtype dtype, int32_t head_dim);
/* The grid of an eager tensor-core decode launch (plain and quantized): the
 * plan's items when it has fewer than the full persistent grid (SMs x
 * resident CTAs). A grid of n_items CTAs puts them on as many SMs, where the
 * full grid's first n_items CTAs appear (from timings) to share SMs two by two
 * while other SMs idle (a batch of 16 decodes x 8 kv heads: 128 unsplit items on 132 SMs;
 * bench/results/h200_2026-11-27_dec25.txt, "grid = items"). Under graph
 * capture (eager 0) the grid stays full, so the graph replays any later plan. */
static inline int kva__cuda_decode_grid(int full, int32_t n_items, int eager)
{
    return eager && n_items > 0 && n_items < full ? (int)n_items : full;
}
/* Launches the tensor-core decode kernel with `grid` persistent CTAs on
 * stream (of device `device`; eager: the stream is not capturing a graph);
 * balanced: the instantiation with the balanced schedule of split items
 * (kva__cuda_plan.balanced). */
kva_status kva__cuda_decode_mma_launch(const kva__cuda_attn_args *a, kva_dtype dtype, int grid,
                                       int balanced, int eager, int device, void *stream);
/* mla_decode_mma.cu: 1 if the absorbed MLA decode covers the shape (D = 576,
 * Dv = 512, f16/bf16); the attention rows of its items for H heads and the
 * plan's longest q_len (16, 32 or 64: H * q_len rounded up to a multiple of 16,
 * at most 64); resident CTAs per SM (raises the dynamic shared-memory limit;
 * 0 if it cannot run); the launch over every item of the uploaded plan with
 * `grid` persistent CTAs (split partials as decode_mma.cu's); a->kv_fp8: the
 * cache is FP8_E4M3 with its k_scale in a->kv_scale (else of the q dtype).
 * The FP8 kernels need no more shared memory than the 16-bit ones, so the
 * plan's occupancy (16-bit kernels) holds for both. */
int kva__cuda_mla_decode_supported(int32_t head_dim, int32_t head_dim_v, kva_dtype dtype);
int kva__cuda_mla_decode_rows(int32_t num_heads, int32_t max_q_len);
int kva__cuda_mla_decode_ctas_per_sm(kva_dtype dtype, int rows);
kva_status kva__cuda_mla_decode_launch(const kva__cuda_attn_args *a, kva_dtype dtype, int rows,
                                       int grid, void *stream);
/* mla_decode_wgmma.cu: the same over items of up to 64 rows on sm_90a wgmma;
 * resident CTAs per SM (0 without sm_90a code or device) and the launch. */
int kva__cuda_mla_wgmma_ctas_per_sm(kva_dtype dtype);
kva_status kva__cuda_mla_wgmma_launch(const kva__cuda_attn_args *a, kva_dtype dtype, int grid,
                                      void *stream);
/* The tensor-core decode over quantized caches (decode_mma_quant.cu): 1 if it covers the
 * shape (INT8_CHANNEL, INT8_TOKEN_K or FP8_E4M3 with f16/bf16 q, or
 * INT8_TOKEN_K_V16 whose V dtype cache_dtype is the q dtype; D = Dv in {64,
 * 128, 256}). */
int kva__cuda_decode_mma_quant_supported(kva_quant quant, kva_dtype cache_dtype, int32_t head_dim,
                                         int32_t head_dim_v, kva_dtype q_dtype);
/* Launches it over every item of the uploaded plan (persistent grid) on the
 * context's stream; split partials as decode_mma.cu's (the caller merges). */
kva_status kva__cuda_decode_mma_quant_run(kva_context *ctx, const kva_plan *plan, const void *q,
                                          const kva_cache *cache, const float *sinks, void *out,
                                          float *lse);
/* KVA_STATUS_OK if ctx is a CUDA context; else a failure (NULL ctx, another
 * backend) whose message starts with fn. */
kva_status kva__cuda_check_ctx(const char *fn, const kva_context *ctx);
/* Prefill tiles over quantized caches on tensor cores (prefill_mma_quant.cu):
 * _usable: 1 if the run's cache, shape and pointers (16-byte aligned q, k,
 * v) are covered (else attn_quant.cu runs the tiles on CUDA cores);
 * _run: launches it over the uploaded plan's prefill tiles (grid of the
 * context's tile capacity; CTAs past the header's count exit). */
int kva__cuda_qprefill_usable(const kva_context *ctx, const kva_plan *plan, const void *q,
                              const kva_cache *cache);
kva_status kva__cuda_qprefill_run(kva_context *ctx, const kva_plan *plan, const void *q,
                                  const kva_cache *cache, const float *sinks, void *out,
                                  float *lse);
/* Benchmarks: plans created on ctx from now on cut every unit (request x kv
 * head x head slice x query tile) into `splits` key chunks (bounded by the
 * minimum chunk length and the most chunks), to time split counts the plan
 * would not pick; -1 makes the former choice (four candidates by makespan
 * alone), 0 restores the default. */
kva_status kva__cuda_context_force_splits(kva_context *ctx, int splits);

/* Benchmarks and tests: with on = 1, plans created on ctx from now on whose
 * split tasks have at least KVA__CUDA_BALANCED_SPLITS splits run the
 * tensor-core decode's balanced schedule (decode_mma_kernel.cuh, dm_steps:
 * the warps of a task's items take its key units as they come, so which keys
 * each partial holds, and the output's last bits, change from run to run);
 * 0, the default, keeps every split item on its own chunk. */
kva_status kva__cuda_context_balanced(kva_context *ctx, int on);

/* A plan's metadata upload in one copy spans at least this many bytes of the
 * buffer from its start (at most the whole buffer; the bytes past the plan's
 * sections are stale staging, as the gaps between sections already are): the
 * driver takes a shorter host-to-device copy through its own staging on the
 * host, at a host cost that grows with its size, and a copy of this size or
 * more by DMA straight from the pinned staging, at a flat and lower one
 * (dev/host28/copy_sweep.cu measures both; the results logs have the
 * numbers). The copy engine's time hardly changes at these sizes. */
#define KVA__CUDA_UPLOAD_MIN ((size_t)32 << 10)

/* Benchmarks: plans uploaded on ctx from now on copy at least `bytes` of the
 * metadata buffer from its start (as KVA__CUDA_UPLOAD_MIN, the default), to
 * time the copy's host cost by size; 0 copies the used span only. */
kva_status kva__cuda_context_upload_min(kva_context *ctx, int64_t bytes);

/* Benchmarks and tests: the half of ctx's hot staging ring (uploads of up to
 * `bytes` are staged there; 0: none, every upload in the large ring,
 * as before the hot ring), a multiple of 256 up to 64 MiB. Only before the
 * context has staging (its first plan or kva_cuda_context_reserve), else
 * KVA_STATUS_INVALID_ARGUMENT. */
kva_status kva__cuda_context_staging_hot(kva_context *ctx, int64_t bytes);

/* Benchmarks: every attention plan built on ctx from now on writes the
 * CLOCK_MONOTONIC time (us) at the ends of its phases into
 * stamps[KVA__CUDA_PROBE_*] (NULL stops it), so a caller that times the
 * whole kva_plan_create / kva_plan_update can split it: the generic checks
 * and copies (until ENTRY), the current-device and capture queries, the
 * partition, the capacity checks, the staging slot, its fill, the copy. */
enum {
    KVA__CUDA_PROBE_ENTRY,   /* the CUDA build starts (generic plan done) */
    KVA__CUDA_PROBE_DEVICE,  /* cudaGetDevice */
    KVA__CUDA_PROBE_CAPTURE, /* cudaStreamIsCapturing */
    KVA__CUDA_PROBE_PART,    /* the grid partition */
    KVA__CUDA_PROBE_RESERVE, /* buffer and workspace capacity checks */
    KVA__CUDA_PROBE_SLOT,    /* the staging slot acquired */
    KVA__CUDA_PROBE_FILL,    /* the metadata staged */
    KVA__CUDA_PROBE_COPY,    /* the copies enqueued */
    KVA__CUDA_PROBE_N
};
kva_status kva__cuda_context_plan_probe(kva_context *ctx, double *stamps);

/* Tests: plans created on ctx from now on decompress the cached context of
 * kva_mla_run's compute-friendly requests in chunks of `keys` keys per
 * request (a multiple of 64, at most 2^20); 0 restores the plan's choice. */
kva_status kva__cuda_context_mla_chunk(kva_context *ctx, int32_t keys);
/* Tests and benchmarks: kva_mla_run on ctx runs its GEMMs (projections and
 * decompression, mla_gemm.cu) on the mma.sync form even where the sm_90a
 * wgmma form takes the shape (mma = 1), by the dispatch (mma = 0), or by the
 * dispatch with the wgmma form's persistent grid capped at 5 CTAs (mma = 2:
 * every CTA walks many tiles across rows, column blocks and heads). */
kva_status kva__cuda_context_mla_gemm(kva_context *ctx, int mma);
/* Launches the attention kernel over every item of the uploaded plan, then
 * the split merge; kv is the paged cache or NULL with ragged k/v. */
kva_status kva__cuda_attention(kva_context *ctx, const kva_plan *plan, const void *q,
                               const kva_cache *cache, const void *k, const void *v,
                               const float *sinks, void *out, float *lse);
kva_status kva__cuda_merge_states(kva_context *ctx, int32_t num_tokens, int32_t num_heads,
                                  int32_t head_dim_v, kva_dtype dtype, const void *out_a,
                                  const float *lse_a, const void *out_b, const float *lse_b,
                                  void *out, float *lse_out);
/* Cascade plans (cascade.cu): the kva__backend_ops cascade entries. */
kva_status kva__cuda_cascade_cost(const kva_context *ctx, kva__cascade_cost *out);
kva_status kva__cuda_cascade_follow(kva_context *aux, const kva_context *ctx);
kva_status kva__cuda_cascade_upload(kva_context *ctx, const kva_plan *plan);
kva_status kva__cuda_cascade_gather(kva_context *ctx, const kva_plan *plan, const void *q,
                                    void *q_pref);
kva_status kva__cuda_cascade_merge(kva_context *ctx, const kva_plan *plan, int32_t level,
                                   const void *out_pref, const float *lse_pref, void *out,
                                   float *lse);
kva_status kva__cuda_merge_states_n(kva_context *ctx, int32_t num_parts, int32_t num_tokens,
                                    int32_t num_heads, int32_t head_dim_v, kva_dtype dtype,
                                    const void *outs, int64_t out_stride, const float *lses,
                                    int64_t lse_stride, void *out, float *lse_out);
/* CTAs per SM the CUDA-core attention kernel (attn_simt.cu) reaches for this
 * shape (occupancy query; also raises its dynamic shared-memory limit); 0 if
 * it cannot run. */
int kva__cuda_simt_ctas_per_sm(kva_dtype dtype, int32_t dmax, int rows);
/* Launches the CUDA-core attention kernel over every item of the uploaded
 * plan with `grid` persistent CTAs on stream (attn_simt.cu). */
kva_status kva__cuda_simt_launch(const kva__cuda_attn_args *a, kva_dtype dtype, int rows, int grid,
                                 void *stream);
/* Launches the split merge over every split task of the uploaded plan
 * (split_merge.cu): the LSE-weighted partials of ws, sinks [H] (or NULL) into
 * out [T, H, Dv] in dtype and lse [T, H] (or NULL), `grid` CTAs on stream. */
kva_status kva__cuda_split_merge_launch(const kva__cuda_meta *meta, const float *ws,
                                        const float *sinks, void *out, float *lse, int32_t H,
                                        int32_t G, int32_t Dv, kva_dtype dtype, int grid,
                                        void *stream);

#endif /* KVA_CUDA_BACKEND_H */
