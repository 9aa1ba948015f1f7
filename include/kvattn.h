/*
 * kvattn.h - the public C API of kvattn, with the headers it includes: the
 * paged KV cache (kvattn_cache.h, in the place of its cache section) and, at
 * its end, kvattn_merge.h, kvattn_dcp.h, kvattn_c8.h, kvattn_mla.h and
 * kvattn_pool.h; kvattn_cuda.h, kvattn_mpi.h and kvattn_nccl.h add the CUDA-,
 * MPI- and NCCL-only calls.
 *
 * kvattn owns a paged KV cache and computes attention for one layer of a mixed
 * serving batch (prefills, chunked prefills, decodes, speculative decodes).
 * An engine calls it like this every step:
 *
 *   kva_plan_create(ctx, &batch_metadata, &plan);      once per step (or
 *                                                      kva_plan_update)
 *   for each layer:
 *     kva_cache_write(ctx, cache[l], ...new K/V...);   reshape_and_cache
 *     kva_attention_run(ctx, plan, q, cache[l], ...);  attention
 *   kva_plan_destroy(plan);
 *
 * Shape glossary used throughout: T tokens of the step, R requests, H query
 * heads, Hkv kv heads, D head size of q/k, Dv head size of v/out, B block
 * (page) size in tokens, NB number of blocks.
 *
 * Memory spaces: kva_plan_create reads host arrays. Every tensor argument of a
 * run-path call (cache_write, attention_run, merge_states) lives where the
 * context's backend computes: host memory for the reference and CPU backends,
 * device memory for the CUDA backend. The block pairs of copy_blocks and
 * swap_blocks are host arrays on every backend (they are validated on the
 * host). Run-path calls never allocate and never synchronize with the host
 * (CUDA: a swap into pageable host memory completes before it returns).
 * CUDA-only entry points (stream, graph-capture capacity) are in kvattn_cuda.h.
 *
 * Aliasing: unless a call's comment allows it (kva_convert with src == dst,
 * kva_merge_states in place, kva_dcp_local_lens in place, the DCP combines'
 * packed buffers), the outputs of a call (out, lse, written cache blocks,
 * index lists) must not overlap its inputs or each other; inputs may overlap
 * one another (they are only read). The run calls (kva_attention_run,
 * kva_attention_run_ragged, kva_mla_run, kva_mla_sparse_run,
 * kva_indexer_run), kva_merge_states_n, kva_merge_states (whose in-place
 * outputs are its inputs' own pointers) and the host helpers
 * kva_batch_reorder_decode_first, kva_dcp_local_lens (in place allowed) and
 * kva_dcp_slots check it by address ranges (device pointers are compared,
 * never read): out and lse (the indexer's indices and topk_length)
 * overlapping each other, q, the ragged k / v, sinks, the MLA weights, the
 * sparse indices, the indexer's weights or the cache's storage (K, V,
 * per-token key scales) get KVA_STATUS_INVALID_ARGUMENT with a message naming
 * both, and nothing is written. Adjacent buffers are fine.
 * The cache calls check it the same way: kva_cache_write's k / v rows and
 * slot_mapping against the whole storage of the cache (K, V and the per-token
 * key scales: which blocks a call writes depends on slot values the host may
 * not read), kva_cache_read's k / v rows against each other, slot_mapping and
 * the cache's storage, and the pairs of kva_cache_copy_blocks /
 * kva_cache_swap_blocks against the destination cache's storage (swap: also
 * src's storage against dst's). Token-strided rows are compared row by row
 * when k and v share a stride (k and v interleaved in one fused buffer are
 * fine), by the ranges they cover otherwise.
 *
 * Lifetimes: a plan belongs to the context that created it (or last updated
 * it). Destroy a context's plans before the context; kva_plan_destroy of a
 * plan whose context is gone only frees it, and every other use of such a plan
 * is undefined. A cache is independent of contexts and plans.
 *
 * Errors: every fallible call returns a kva_status. On failure, kva_last_error()
 * holds a message naming the argument and the bad value (thread-local), and no
 * output, cache or plan passed to the call has been modified. Every call that
 * returns a kva_status clears the message on entry, so it is "" after a
 * success: read it right after the failing call (as errno).
 *
 * Limits: the KVA_MAX_* limits below and the head-size rule (multiples of 8
 * from 8 to KVA_MAX_HEAD_DIM = 576; the CUDA backend's caches and plans stop
 * at 256 except MLA's 576, see kva_cache_desc) hold for every entry point
 * that takes such a value (cache, plan, merge, checkpoint scales, context);
 * values outside are rejected.
 *
 * Zero sizes: a count (tokens, requests, block pairs, elements, prompt or
 * slot counts of the pool) may be 0: the call validates its other arguments
 * and returns KVA_STATUS_OK without touching any tensor, and the pointers of
 * the empty arrays may be NULL. A shape dimension (heads, head sizes, block
 * size, number of blocks) is never 0. The one exception is
 * kva_pool_request_add, whose prompt needs at least one token.
 *
 * Threading: a context may be used from one thread at a time; its scratch
 * workspace is shared by the calls made through it. Different contexts are
 * independent. Plans and caches are only read by attention calls, so one plan
 * may serve calls on several contexts of the same backend, provided each
 * context has reserved the plan's workspace: it created the plan, or created
 * a plan from the same descriptor with the same number of threads (CPU: the
 * workspace holds per-thread scratch areas and split partials whose count
 * depends on the thread count; a context whose reservation is smaller than
 * the plan's refuses it with KVA_STATUS_INVALID_ARGUMENT, and one whose
 * reservation holds it runs the plan on at most as many of its threads as
 * the reservation holds scratch areas for). A plan that runs as a cascade
 * (kva_plan_info.num_cascade_groups > 0, which the default KVA_CASCADE_AUTO
 * may choose) is the exception: it runs only on the context that created it,
 * or that last updated it (else KVA_STATUS_INVALID_ARGUMENT); set cascade =
 * KVA_CASCADE_OFF for a plan shared between contexts. As with FlashInfer's
 * plan/run, the simplest rule is one plan per context. Writing a cache while
 * another thread reads it is a race.
 */
#ifndef KVATTN_H
#define KVATTN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32) && defined(KVA_BUILD_SHARED)
#define KVA_API __declspec(dllexport)
#elif defined(__GNUC__)
#define KVA_API __attribute__((visibility("default")))
#else
#define KVA_API
#endif

#define KVA_VERSION_MAJOR 0
#define KVA_VERSION_MINOR 1
#define KVA_VERSION_PATCH 0

/* Limits every backend accepts (larger values are rejected with a status). */
#define KVA_MAX_SEQ_LEN (1 << 30) /* longest seq_len, and most query tokens in one plan */
#define KVA_MAX_HEADS 4096        /* most query heads (and kv heads) */
#define KVA_MAX_TOPK 65536        /* most keys per token of a sparse plan (sparse_topk) */
#define KVA_MAX_TREE_TOKENS 64    /* most query tokens of a request of a tree plan */
#define KVA_MAX_CASCADE_LEVELS 8  /* most levels of nested cascade groups */
#define KVA_MAX_THREADS 1024      /* most CPU threads a context may ask for */
/* Largest head size D (and Dv) of any backend: MLA's absorbed 512 + 64. A
 * backend may take less (kva_cache_desc lists each backend's range); a head
 * size beyond its backend's range gets KVA_STATUS_UNSUPPORTED. */
#define KVA_MAX_HEAD_DIM 576

/* "MAJOR.MINOR.PATCH" of the library that is linked (may differ from the header). */
KVA_API const char *kva_version(void);

/* ------------------------------------------------------------------------ */
/* Status codes                                                              */
/* ------------------------------------------------------------------------ */

/* X(NAME, description): one list generates the enum, kva_status_name() and
 * kva_status_string(). Values are stable: new codes are appended. */
#define KVA_STATUS_LIST(X)                                                                         \
    X(OK, "success")                                                                               \
    X(INVALID_ARGUMENT, "an argument has an invalid value")                                        \
    X(NULL_POINTER, "a required pointer argument is NULL")                                         \
    X(UNSUPPORTED, "the configuration is valid but not supported")                                 \
    X(OUT_OF_RANGE, "an index or length is outside its valid range")                               \
    X(DTYPE_MISMATCH, "tensor dtypes do not agree")                                                \
    X(SHAPE_MISMATCH, "tensor shapes do not agree")                                                \
    X(OUT_OF_MEMORY, "memory allocation failed")                                                   \
    X(BACKEND_UNAVAILABLE, "the requested backend is not available")                               \
    X(DEVICE_ERROR, "the device runtime reported an error")                                        \
    X(IO_ERROR, "a file could not be read or is malformed")                                        \
    X(POOL_EXHAUSTED, "the block pool has too few free blocks")                                    \
    X(INTERNAL, "internal error (a bug in kvattn)")

typedef enum kva_status {
#define KVA_X_(name, desc) KVA_STATUS_##name,
    KVA_STATUS_LIST(KVA_X_)
#undef KVA_X_
        KVA_STATUS_COUNT_
} kva_status;

/* "KVA_STATUS_OK", ... ; "KVA_STATUS_UNKNOWN" for values outside the enum. */
KVA_API const char *kva_status_name(kva_status status);
/* One-line human description of the status code. */
KVA_API const char *kva_status_string(kva_status status);
/* Detailed message of the last call on this thread that returned a
 * kva_status: why it failed, or "" if it succeeded (every such call clears
 * the message on entry). */
KVA_API const char *kva_last_error(void);

/* ------------------------------------------------------------------------ */
/* Data types                                                                */
/* ------------------------------------------------------------------------ */

typedef enum kva_dtype {
    KVA_DTYPE_F32 = 0,
    KVA_DTYPE_F16 = 1,      /* IEEE binary16 */
    KVA_DTYPE_BF16 = 2,     /* bfloat16 */
    KVA_DTYPE_I8 = 3,       /* int8, for quantized caches */
    KVA_DTYPE_FP8_E4M3 = 4, /* OCP fp8 e4m3fn, for quantized caches */
    KVA_DTYPE_U8 = 5,       /* raw bytes, for packed formats (e.g. FP8 MLA) */
    KVA_DTYPE_COUNT_
} kva_dtype;

/* Bytes per element (1, 2 or 4); 0 for an invalid dtype. */
KVA_API size_t kva_dtype_size(kva_dtype dtype);
/* "f32", "f16", "bf16", "i8", "fp8_e4m3", "u8"; "invalid" otherwise. */
KVA_API const char *kva_dtype_name(kva_dtype dtype);

/* Scalar conversions, round-to-nearest-even, NaN stays NaN, overflow to inf. */
KVA_API uint16_t kva_f32_to_f16(float x);
KVA_API float kva_f16_to_f32(uint16_t h);
KVA_API uint16_t kva_f32_to_bf16(float x);
KVA_API float kva_bf16_to_f32(uint16_t h);

/* OCP FP8 E4M3 ("e4m3fn": bias 7, max 448, no infinities, NaN = 0x7f / 0xff).
 * f32 -> fp8 rounds to nearest even and saturates: finite values beyond 448
 * and +-inf become +-448 (code 0x7e / 0xfe); NaN becomes 0x7f with its sign.
 * fp8 -> f32 is exact. */
KVA_API uint8_t kva_f32_to_fp8_e4m3(float x);
KVA_API float kva_fp8_e4m3_to_f32(uint8_t code);

/* Convert n elements between f32/f16/bf16 host buffers (src and dst may not
 * overlap unless src == dst and the dtypes are equal). */
KVA_API kva_status kva_convert(const void *src, kva_dtype src_dtype, void *dst, kva_dtype dst_dtype,
                               size_t n);

/* ------------------------------------------------------------------------ */
/* Context                                                                   */
/* ------------------------------------------------------------------------ */

typedef enum kva_backend {
    KVA_BACKEND_REF = 0,  /* scalar C, fp64 accumulation: the reference */
    KVA_BACKEND_CPU = 1,  /* optimized CPU: threads + SIMD */
    KVA_BACKEND_CUDA = 2, /* NVIDIA GPUs (sm_80, sm_90a) */
    KVA_BACKEND_COUNT_
} kva_backend;

/* "ref", "cpu", "cuda"; "invalid" otherwise. */
KVA_API const char *kva_backend_name(kva_backend backend);
/* 1 if the backend was compiled in and can run on this machine, else 0. */
KVA_API int kva_backend_available(kva_backend backend);

typedef struct kva_context_desc {
    kva_backend backend;
    int32_t num_threads; /* CPU backend threads, 0..KVA_MAX_THREADS; 0 = all cores */
    int32_t device_id;   /* CUDA device ordinal; ignored elsewhere */
} kva_context_desc;

typedef struct kva_context kva_context;

/* desc may be NULL: CPU backend, all cores. */
KVA_API kva_status kva_context_create(const kva_context_desc *desc, kva_context **out);
KVA_API void kva_context_destroy(kva_context *ctx); /* NULL is a no-op */
KVA_API kva_backend kva_context_backend(const kva_context *ctx);
/* Threads the CPU backend uses (1 for the reference backend). */
KVA_API int32_t kva_context_num_threads(const kva_context *ctx);

/* The paged KV cache (kva_cache_create, kva_cache_write, ...): its own header,
 * read here, before the plan and attention sections that use its types. */
#include "kvattn_cache.h"

/* ------------------------------------------------------------------------ */
/* Batch metadata and plan                                                   */
/* ------------------------------------------------------------------------ */

/* The step's state, as vLLM-Ascend's attention backend classifies it. */
typedef enum kva_attn_state {
    KVA_STATE_PREFILL_NO_CACHE = 0,  /* only prefills, none has cached context */
    KVA_STATE_PREFILL_CACHE_HIT = 1, /* only prefills, some start after cached context */
    KVA_STATE_DECODE_ONLY = 2,       /* every request has q_len == 1 */
    KVA_STATE_CHUNKED_PREFILL = 3,   /* decodes and prefills mixed */
    KVA_STATE_SPEC_DECODING = 4,     /* only decodes, some with q_len > 1 */
    KVA_STATE_EMPTY = 5              /* no query tokens at all */
} kva_attn_state;

/* "prefill_no_cache", ... */
KVA_API const char *kva_attn_state_name(kva_attn_state state);

typedef struct kva_plan_desc {
    /* Batch metadata (host arrays, read during kva_plan_create only). */
    int32_t num_requests;           /* R >= 0 */
    const int32_t *query_start_loc; /* [R+1] cu_seqlens_q: non-decreasing, [0] == 0; T = [R] */
    const int32_t *seq_lens;        /* [R] context + new tokens of each request (kv length);
                                       >= q_len when causal */
    const int32_t *block_table;     /* [R, block_table_stride] int32 block ids; NULL for
                                       plans used only with kva_attention_run_ragged (or
                                       of R = 0, which every run call takes). The
                                       whole R * stride array is copied into the plan, but
                                       only the first ceil(seq_len / B) entries of a row
                                       with q_len > 0 are used and must be >= 0; the rest
                                       (padding, e.g. -1) and rows with q_len 0 may hold
                                       any value */
    int32_t block_table_stride;     /* max blocks per request (row length of block_table) */
    int32_t block_size;             /* B of the caches this plan will read */
    int32_t decode_threshold;       /* q_len <= this counts as a decode (1 + spec tokens);
                                       0 means 1 */

    /* Attention shape and semantics. */
    int32_t num_heads;         /* H, a multiple of Hkv, at most KVA_MAX_HEADS */
    int32_t num_kv_heads;      /* Hkv */
    int32_t head_dim;          /* D (range as kva_cache_desc's, per backend) */
    int32_t head_dim_v;        /* Dv; 0 means Dv = D */
    kva_dtype q_dtype;         /* dtype of q and out: F32, F16 or BF16 */
    float scale;               /* softmax scale > 0; 0 means 1/sqrt(D) (negative or
                                  non-finite: KVA_STATUS_INVALID_ARGUMENT) */
    int32_t causal;            /* bottom-right aligned causal mask (see kva_attention_run):
                                  0 for none; any other value means causal (as a C bool) */
    int32_t window_left;       /* key j visible only if pos - j <= window_left; -1 = no window
                                  (as are values >= KVA_MAX_SEQ_LEN, which exclude nothing) */
    float softcap;             /* logits soft-cap c > 0, or 0 for none. Backends compute
                                  scores in float32 (the reference in double): scores
                                  beyond float32's range make them disagree. */
    const float *alibi_slopes; /* [H] host, copied into the plan; NULL for none */
    kva_attn_kind kind;        /* of the caches it reads; 0 = KVA_ATTN_MHA (see kva_attn_kind) */

    /* Decode context parallelism (DCP, docs/dcp.md): the KV cache of every
     * request is sharded over dcp_size ranks, token i of a request living on
     * rank (i / I) mod dcp_size, I = dcp_interleave. A sharded plan describes
     * one rank: seq_lens stay GLOBAL (every position and mask is global), the
     * block_table is the rank's own and covers its local tokens only
     * (kva_dcp_local_lens), q holds every query head, and the run writes the
     * rank's partial out and lse over its keys, which a combine
     * (kva_merge_states_n, kvattn_mpi.h, kvattn_nccl.h) turns into the
     * full result. Sinks count once: a sharded run adds them on rank 0 only.
     * All zero (zero-initialized descriptors) = unsharded. */
    int32_t dcp_size;       /* N ranks, 0 or 1 = unsharded, at most KVA_MAX_DCP
                               (kvattn_merge.h) */
    int32_t dcp_rank;       /* this plan's rank, 0 .. N-1 */
    int32_t dcp_interleave; /* I >= 1 consecutive tokens per rank in turn; 0 means 1 */
    /* kind KVA_ATTN_MLA only (must be 0 otherwise): the head sizes of the
     * layer-level call kva_mla_run, Dn = qk_nope_head_dim (DeepSeek 128) and
     * Dv = v_head_dim (128), multiples of 8 from 8 to KVA_MAX_HEAD_DIM, and
     * Dn + Dr (Dr = head_dim - head_dim_v; the head size the compute-friendly
     * path attends with) at most KVA_MAX_HEAD_DIM (else
     * KVA_STATUS_UNSUPPORTED). Both 0:
     * the plan serves kva_attention_run only (kva_mla_run refuses it); both
     * given: it serves both, and kva_plan_create reserves the workspace of the
     * layer-level call. */
    int32_t mla_qk_nope_head_dim;
    int32_t mla_v_head_dim;

    /* Chunked local attention (Llama 4's attention_chunk_size, docs/masks.md):
     * C > 0 limits the query at position pos to keys j with j / C == pos / C
     * (integer division), on top of the causal rule and any window: every
     * request attends within its current chunk only, and a long request costs
     * what that chunk costs. 0 = off. Needs causal = 1 (a non-causal plan
     * with a chunk gets KVA_STATUS_UNSUPPORTED). Positions are global under
     * DCP. */
    int32_t attention_chunk;

    /* Tree verification (speculative decoding with a draft tree, docs/masks.md):
     * the q_len = q query tokens of each request are a draft tree (q <=
     * KVA_MAX_TREE_TOKENS) at key positions s - q .. s - 1 after its committed
     * context; query i sees every committed key j < s - q (one pass over the
     * context serves the whole tree) and tree key s - q + k only if token k is
     * i or an ancestor of i. Give the tree one of two ways (both NULL = off):
     *   tree_parents [T] int32: the parent of each query token as an index
     *     within its request (0 .. i - 1), or -1 for a root, which hangs off
     *     the committed context;
     *   tree_mask: FlashInfer's packed_custom_mask restricted to the tree
     *     part: for each request in order, its q x q bits row-major (bit i*q + k
     *     = query i sees tree token k), packed with bitorder "little" (element e
     *     is bit e % 8 of byte e / 8) and each request starting on a new byte
     *     (segment_packbits), so request r starts at byte sum over r' < r of
     *     ceil(q_r'^2 / 8). Every row must hold its diagonal and no bit above
     *     it (tree tokens come in topological order).
     * Needs causal = 1; no window, chunk, ALiBi, MLA or DCP. Every backend
     * (reference, CPU, CUDA: every cache format and kernel, graph-capturable). */
    const int32_t *tree_parents;
    const uint8_t *tree_mask;

    /* Cascade (shared-prefix) attention, docs/cascade.md. Requests whose
     * block-table rows begin with the same block ids share those keys; a
     * cascade plan attends such a shared prefix once per group, with all the
     * group's query rows together, then each request's own keys, and merges
     * the two by their LSE (the result equals the plain plan's up to
     * rounding). cascade is a kva_cascade_mode (0 = automatic). The grouping
     * is found from the block table, or given: cascade_group [R] (host, read
     * during kva_plan_create) names each request's group 0..G-1, or -1 for
     * none, and cascade_prefix_len [G] the tokens each group shares, a
     * positive multiple of B that ends at or before every member's first
     * query (seq_len - q_len) and over which every member's block ids equal.
     * Requests with q_len 0 are ignored (their blocks need not match; their
     * cascade_group entry must still be -1 or a group). A grouping that does
     * not match the block table is refused (KVA_STATUS_INVALID_ARGUMENT or
     * OUT_OF_RANGE).
     * Plans with ALiBi, a sliding window, a local chunk, a draft tree, DCP
     * sharding or kind KVA_ATTN_MLA, and backends without cascade kernels,
     * decline it (KVA_CASCADE_ON: KVA_STATUS_UNSUPPORTED). A plan that runs
     * as a cascade (kva_plan_info.num_cascade_groups > 0) runs on the context
     * that created (or last updated) it only, and kva_attention_run_ragged refuses it
     * (KVA_STATUS_INVALID_ARGUMENT): a plan for ragged runs has no block
     * table, or cascade = KVA_CASCADE_OFF. */
    int32_t cascade;                   /* kva_cascade_mode */
    int32_t num_cascade_groups;        /* G of a given grouping; 0 without one */
    const int32_t *cascade_group;      /* [R] group of each request or -1; NULL: find them */
    const int32_t *cascade_prefix_len; /* [G] shared tokens of each group */

    /* Sparse attention (DeepSeek V3.2, kvattn_mla.h). sparse_topk = K > 0
     * makes a kind KVA_ATTN_MLA plan a sparse MLA plan, run by
     * kva_mla_sparse_run only (each query token attends the K positions of
     * its own index list), and is the K of a kind KVA_ATTN_INDEX plan
     * (kva_indexer_run picks K keys per token); at most KVA_MAX_TOPK. 0: a
     * dense plan (KVA_ATTN_INDEX plans need K > 0). sparse_mode is a
     * kva_sparse_mode (sparse MLA plans only; 0 otherwise). Sparse plans take
     * no window, soft-cap, ALiBi, chunk, tree, cascade or DCP; causal is
     * ignored (the index list is the mask); decode_threshold splits decodes
     * from prefills as in every plan. */
    int32_t sparse_topk;
    int32_t sparse_mode;

    /* Nested cascade groups (docs/cascade.md): cascade_parent [G] (host,
     * read during kva_plan_create) gives each group of a given grouping its
     * parent group, or -1 for a top-level group; NULL: every group is
     * top-level. A parent comes before its child (parent[g] < g) and shares
     * fewer tokens (cascade_prefix_len[parent] < cascade_prefix_len[g]); the
     * child's members share the parent's prefix too, so they need not be
     * listed twice: cascade_group names each request's deepest group. Each
     * level's part of the prefix is attended once per group and merged by LSE;
     * at most KVA_MAX_CASCADE_LEVELS levels. Found groupings nest by themselves (requests that
     * share more leading blocks than their group form subgroups). */
    const int32_t *cascade_parent;

    /* Lightning indexer plans (kind KVA_ATTN_INDEX, kva_indexer_run) only;
     * 0 otherwise. How the index queries enter the logits, a kva_quant:
     *   KVA_QUANT_NONE (0): products of q in q_dtype with the keys (exact
     *     in fp32 on CPU and CUDA).
     *   KVA_QUANT_FP8_TOKEN: each (token, head) row q[t, h] [D] is first
     *     quantized as the FP8_TOKEN key rows are (s = max(amax / 448,
     *     FLT_MIN), NaN left out of amax and coded NaN; codes = e4m3(x / s),
     *     x / s in float32, round to nearest even, saturating), and the
     *     logits use code * s in place of q (DeepSeek V3.2's inference
     *     code and DeepGEMM's fp8_mqa_logits quantize the index query so;
     *     their fp8 products are twice the bf16 rate on Hopper). Every
     *     backend quantizes alike; the sm_90a CUDA kernel then multiplies
     *     codes by key codes on fp8 tensor cores (where the cache is
     *     FP8_TOKEN), whose accumulation keeps fewer bits than fp32, so
     *     more keys of nearly equal logits trade places near the K-th
     *     (the tests allow 2^-10 of sum_h |w_h| sum_d |q_hd k_d|,
     *     docs/indexer.md). */
    int32_t index_q_quant;
} kva_plan_desc;

/* How a sparse MLA plan runs its prefill tokens (kva_plan_desc.sparse_mode). */
typedef enum kva_sparse_mode {
    /* Every token, decode or prefill, reads its indexed rows from the cache
     * in place (FlashMLA's kernel over the paged cache; vLLM's mixed batch). */
    KVA_SPARSE_MIXED = 0,
    /* Decodes as MIXED; each prefill request's keys are first read back from
     * the cache into a dense workspace (kva_cache_read, as bf16 (f32 on the
     * reference)), and its tokens run a prefill kernel over that workspace
     * (FlashMLA's sparse prefill; vLLM's separate prefill / decode). The
     * plan reserves the workspace for its longest prefill. Equal to MIXED up
     * to rounding (CUDA reads the rows back in the q dtype, f16 or bf16: over
     * an FP8_DS_MLA cache its prefills see code * scale rounded to it, as
     * MIXED does on sm_90a at H > 32; the other CUDA kernel and the host
     * backends use the exact values in MIXED). */
    KVA_SPARSE_SEPARATE = 1,
    KVA_SPARSE_MODE_COUNT_
} kva_sparse_mode;

/* Whether a plan runs shared prefixes as a cascade (kva_plan_desc.cascade). */
typedef enum kva_cascade_mode {
    /* The plan estimates each group's time with and without the cascade
     * (keys read, flops, the extra passes) and keeps the groups that pay;
     * configurations that cannot cascade run as plain plans. */
    KVA_CASCADE_AUTO = 0,
    KVA_CASCADE_OFF = 1, /* never (a given grouping is still validated) */
    KVA_CASCADE_ON = 2,  /* every group found or given, whether it pays or not */
    KVA_CASCADE_MODE_COUNT_
} kva_cascade_mode;

typedef struct kva_plan kva_plan;

/* The step as kva_plan_create classified it. Requests with q_len 0 produce no
 * rows and are ignored by every field but num_tokens: they count in neither
 * num_decodes nor num_prefills (kva_batch_reorder_decode_first, by contrast,
 * sorts them with the decodes), and leave state, decode_first, max_q_len and
 * max_seq_len as the batch without them would have them. */
typedef struct kva_plan_info {
    kva_attn_state state;
    int32_t num_tokens;  /* T */
    int32_t num_decodes; /* requests with 1 <= q_len <= decode_threshold */
    int32_t num_decode_tokens;
    int32_t num_prefills; /* the other requests */
    int32_t num_prefill_tokens;
    int32_t decode_first; /* 1 if all decodes come before all prefills */
    int32_t max_q_len;
    int32_t max_seq_len;
    int32_t num_work_items;     /* units of parallel work the backend will run */
    int32_t num_cascade_groups; /* shared-prefix groups run as a cascade (0: none) */
    int32_t cascade_rows;       /* query rows of those groups */
    int32_t cascade_chunks;     /* key chunks each group's prefix pass is cut into */
} kva_plan_info;

/* Validates the batch metadata and builds the per-step plan: copies the
 * metadata (to the device for the CUDA backend), classifies the step and
 * partitions the work for the context's backend. */
KVA_API kva_status kva_plan_create(kva_context *ctx, const kva_plan_desc *desc, kva_plan **out);
KVA_API void kva_plan_destroy(kva_plan *plan); /* NULL is a no-op */
/*
 * Re-plans an existing plan for a new step: afterwards plan is what
 * kva_plan_create(ctx, desc) would have built (same info, same work, same
 * results of every run call), and the old plan is gone, but its memory is
 * reused: the host copies, and on the CUDA backend the partition's arrays and
 * the device record (no allocation once they are large enough). desc is
 * checked exactly as kva_plan_create checks it (the same statuses and
 * messages). ctx must be of the backend plan was built on (else
 * KVA_STATUS_INVALID_ARGUMENT); a plan of any kind, cascade or not, may be
 * updated to any other. On failure the plan is unchanged and still runs,
 * except after a device error or a failed device allocation on the CUDA
 * backend (the context's metadata buffers may be gone: run calls on the plan
 * then fail with KVA_STATUS_INVALID_ARGUMENT until an update succeeds). As
 * with kva_plan_create, a CUDA context holds only its latest plan's device
 * metadata. An engine's step loop: create once, update every step, destroy
 * at the end.
 */
KVA_API kva_status kva_plan_update(kva_context *ctx, kva_plan *plan, const kva_plan_desc *desc);
KVA_API kva_status kva_plan_get_info(const kva_plan *plan, kva_plan_info *out);

/*
 * Decode-first reordering helper (vLLM reorders each batch so that decodes come
 * first). Given q_lens [R], writes a stable permutation perm [R] such that
 * requests perm[0..] are all decodes (q_len <= decode_threshold, 0 means 1;
 * q_len 0 included), then all prefills, each group in its original order.
 * *num_decodes receives the number of decodes (may be NULL). perm and
 * num_decodes must not overlap q_lens or each other
 * (KVA_STATUS_INVALID_ARGUMENT, nothing written).
 */
KVA_API kva_status kva_batch_reorder_decode_first(int32_t num_requests, const int32_t *q_lens,
                                                  int32_t decode_threshold, int32_t *perm,
                                                  int32_t *num_decodes);

/* ------------------------------------------------------------------------ */
/* Attention                                                                 */
/* ------------------------------------------------------------------------ */

/*
 * Attention for one layer over the paged cache.
 *   q:     [T, H, D] in the plan's q_dtype (contiguous)
 *   cache: written for every key the plan's seq_lens cover; its dtype must
 *          equal q_dtype for unquantized caches (quantized caches serve any
 *          q_dtype and are dequantized inside the kernel); B must equal the plan's.
 *          Slots no row reads may hold anything, NaN and infinities included
 *          (a page's slots past seq_len, block-table entries past a request's
 *          pages, the blocks of q_len 0 requests): they never reach an output.
 *          A key inside seq_len that a row does not see under its mask
 *          (causal, window, chunk, tree) never reaches that row on the
 *          reference and CPU backends, whatever its value; on the CUDA
 *          backend such a key's value must be finite where other rows of
 *          the same request see it: every CUDA kernel weights it 0 for the
 *          row and adds 0 * v, so a NaN or infinite value makes that row's
 *          out NaN (its lse stays right; docs/masks.md).
 *   sinks: [H] float32 per-head sink logits, or NULL. A sink joins the softmax
 *          denominator only. They are a layer weight, hence a run argument.
 *   out:   [T, H, Dv] in q_dtype
 *   lse:   [T, H] float32 natural-log sum-exp of the row's scores (including
 *          the sink), or NULL.
 *
 * Semantics for request r with q_len q and seq_len s, query i (0 <= i < q):
 *   pos = s - q + i (bottom-right aligned, as FlashAttention >= 2.1);
 *   score_j = scale * <q, k_j>; if softcap c > 0: score_j = c * tanh(score_j / c);
 *   with ALiBi: score_j += slope_h * (j - pos);
 *   key j is visible if j < s, and (causal) j <= pos, and (window) pos - j <= window_left,
 *   and (chunk C = attention_chunk > 0) j / C == pos / C,
 *   and (tree) j < s - q or token j - (s - q) is i or an ancestor of i;
 *   out = sum_j softmax_j * v_j over visible keys, the sink in the denominator.
 * Causal plans require q_len <= seq_len, so key j = pos is visible and every
 * row sees a key. Non-causal plans (encoder, cross-attention) may have
 * q_len > seq_len, including seq_len 0; a row that sees no key writes 0 and
 * lse = -inf, or lse = the sink logit if a sink is given. Query head h reads
 * kv head h / (H / Hkv). Requests with q_len 0 produce no rows. Tensor data
 * is not validated (the host never reads it on the run path): a NaN score
 * makes its row's out and lse NaN on every backend and for any key split, a
 * score of -inf carries no weight (a row whose every visible key scores -inf
 * writes 0 and lse -inf, or the sink, as a row without keys; under a
 * soft-cap c a key whose scale * <q, k_j> is -inf scores c * tanh(-inf) = -c
 * and counts), and sinks should be finite. An infinite element of q scores
 * in IEEE arithmetic over the keys as the cache format defines them
 * (kvattn_cache.h): -inf times a positive key element is -inf, times a
 * negative one +inf, times 0 NaN; so a row whose every visible key has a
 * positive element there writes 0 and lse -inf (or the sink). This holds on
 * every backend and cache format, with one exception: over an INT8_CHANNEL
 * cache, CUDA's kernels (tensor-core and CUDA-core) multiply the infinite
 * element by the stored code c, not by c - offset. The two differ only for a code
 * between 0 and the channel's offset, both included: strictly between, the
 * infinity takes c's sign; a code of 0 scores NaN (inf times 0) where
 * c - offset gives an infinity; a code equal to the offset scores an
 * infinity where c - offset = 0 gives NaN.
 *
 * MLA plans and caches (kind KVA_ATTN_MLA): the absorbed call, FlashMLA's
 * flash_mla_with_kvcache: q [T, H, Dc + Dr] (q_nope already multiplied by
 * W_UK, then q_pe), key j = the latent row [c_kv | k_pe], value j = c_kv
 * (its first Dc columns), out [T, H, Dc] (the caller multiplies by W_UV).
 *
 * Splitting keys: attention over keys [0, a) and over [a, s), computed with
 * the sink passed to one of the two parts only, merged by kva_merge_states,
 * equals attention over [0, s) whenever each part can be expressed with the
 * same mask semantics (e.g. a context part [0, a) with a <= s - q_len run
 * non-causally, and the rest causally); ALiBi and windows are defined by
 * positions within the call, so they do not carry over to shifted parts.
 */
KVA_API kva_status kva_attention_run(kva_context *ctx, const kva_plan *plan, const void *q,
                                     const kva_cache *cache, const float *sinks, void *out,
                                     float *lse);

/*
 * Attention without a cache, over new K/V packed per request (PrefillNoCache,
 * encoder self-attention with causal = 0, and cross-attention). Request r's keys
 * are rows kv_start[r] .. kv_start[r] + seq_lens[r] of k and v, where kv_start
 * is the exclusive prefix sum of the plan's seq_lens.
 *   k: [sum(seq_lens), Hkv, D], v: [sum(seq_lens), Hkv, Dv] in q_dtype.
 * A sharded (DCP) plan reads the rank's own keys only: request r's rows are
 * its local_lens[r] keys (kva_dcp_local_lens) in position order, kv_start
 * the prefix sum of those lengths; masks stay global (docs/dcp.md).
 * Masks and the other arguments are as in kva_attention_run. A plan that
 * runs as a cascade (kva_plan_desc.cascade) reads shared blocks of a paged
 * cache and is refused with KVA_STATUS_INVALID_ARGUMENT.
 */
KVA_API kva_status kva_attention_run_ragged(kva_context *ctx, const kva_plan *plan, const void *q,
                                            const void *k, const void *v, const float *sinks,
                                            void *out, float *lse);

#ifdef __cplusplus
}
#endif

/* The rest of the API, by subject (each includes this header). */
#include "kvattn_merge.h" /* merging partial results (kva_merge_states, _n) */
#include "kvattn_dcp.h"   /* decode context parallelism: local lengths and slots */
#include "kvattn_c8.h"    /* the C8 checkpoint scale loader */
#include "kvattn_mla.h"   /* kva_mla_run, sparse MLA and its indexer */
#include "kvattn_pool.h"  /* the block pool with prefix caching */

#endif /* KVATTN_H */
