/*
 * kvattn.h - the public C API of kvattn, with the headers it includes at its
 * end (kvattn_merge.h, kvattn_dcp.h, kvattn_c8.h, kvattn_mla.h, kvattn_pool.h); kvattn_cuda.h,
 * kvattn_mpi.h and kvattn_nccl.h add the CUDA-, MPI- and NCCL-only calls.
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

/* ------------------------------------------------------------------------ */
/* Paged KV cache                                                            */
/* ------------------------------------------------------------------------ */

typedef enum kva_layout {
    KVA_LAYOUT_NHD = 0, /* K: [NB, B, Hkv, D], V: [NB, B, Hkv, Dv] (vLLM, FlashAttention) */
    KVA_LAYOUT_HND = 1, /* K: [NB, Hkv, B, D], V: [NB, Hkv, B, Dv] (FlashInfer's HND) */
} kva_layout;

/*
 * Quantized caches (docs/quant.md has the layouts, bytes per token, measured
 * error and the NaN policy). A cache's format is part of its descriptor; its
 * scales are given once at creation (kva_cache_create_quant) and copied into
 * the cache's memory space. Writes quantize, attention dequantizes inside the
 * kernel; q and out stay f32, f16 or bf16.
 *
 *   format          dtype     K                          V
 *   NONE            f32/f16/  as stored                  as stored
 *                   bf16
 *   INT8_CHANNEL    I8        q = clamp(rne(x/s + o))    same, own s/o
 *   ("C8")                    x = (q - o) * s; s, o per (kv head, channel)
 *   INT8_TOKEN_K    I8        q = rne(x / s_t),          as INT8_CHANNEL
 *                             s_t = max|k| / 127 per (token, kv head),
 *                             kept in the cache: [NB, Hkv, B] float32
 *   INT8_TOKEN_K_V16 f16/bf16 as INT8_TOKEN_K (int8)     as stored (dtype)
 *   FP8_E4M3        FP8_E4M3  q = fp8(x / s), x = q * s; s per tensor or per kv head
 *   FP8_DS_MLA      FP8_E4M3  MLA caches only: FlashMLA's "fp8_ds_mla" rows, below
 *   FP8_TOKEN       FP8_E4M3  index-key caches only (KVA_ATTN_INDEX), below
 *
 * rne = round to nearest, ties to even; clamp to [-128, 127].
 *
 * Formats and kinds: FP8_DS_MLA and FP8_TOKEN exist for one kind each; a
 * descriptor that names either with another kind fails with
 * KVA_STATUS_INVALID_ARGUMENT. A format the kind could hold but kvattn does
 * not implement for it (e.g. INT8_CHANNEL for an MLA or index-key cache)
 * fails with KVA_STATUS_UNSUPPORTED.
 *
 * FP8_DS_MLA (DeepSeek V3.2, vLLM's "fp8_ds_mla" cache, byte for byte as
 * FlashMLA reads it): kind KVA_ATTN_MLA with Dc = head_dim_v a multiple of
 * 128 and Dr = head_dim - Dc. Each token's row is Dc + 4 * Dc / 128 + 2 * Dr
 * bytes (DeepSeek, Dc 512 / Dr 64: 656): the Dc e4m3 codes of c_kv, then one
 * float32 scale per tile of 128 codes, s = max(amax(tile) / 448, FLT_MIN) as
 * vLLM's concat_and_cache_ds_mla writes it (readers take any positive
 * float32 scale, e.g. powers of two), then the Dr values of k_pe as bf16,
 * unquantized. c_kv = code * s of its tile. Rows are contiguous, token after
 * token, B rows per block (layouts NHD and HND coincide). No static scales.
 * Non-finite c_kv, tile by tile as FP8_TOKEN rows below: a NaN is left out
 * of amax and stored as NaN; +-inf makes the tile's s infinite, and the
 * whole tile reads back as NaN.
 *
 * FP8_TOKEN (the DeepSeek V3.2 indexer's key cache, as vLLM lays it out):
 * kind KVA_ATTN_INDEX; each block holds its B rows of D e4m3 codes, token
 * after token, then B float32 scales, one per token, s = max(amax / 448,
 * FLT_MIN) on write (any positive scale on read): D + 4 bytes per token.
 * A NaN element is left out of amax and stored as NaN (0x7f); an infinite
 * one makes s infinite, and then the whole row reads back as NaN (its own
 * code is NaN, every other code is 0 and 0 * inf is NaN), so the indexer
 * gives that key a NaN logit.
 */
typedef enum kva_quant {
    KVA_QUANT_NONE = 0,             /* K/V stored in the cache dtype (f32, f16 or bf16) */
    KVA_QUANT_INT8_CHANNEL = 1,     /* C8: int8 K and V, static per-channel scale + offset */
    KVA_QUANT_INT8_TOKEN_K = 2,     /* int8 K with per-token scales, int8 V per channel */
    KVA_QUANT_INT8_TOKEN_K_V16 = 3, /* int8 K with per-token scales, V in f16/bf16 */
    KVA_QUANT_FP8_E4M3 = 4,         /* fp8 e4m3 K and V, per-tensor or per-kv-head scales */
    KVA_QUANT_FP8_DS_MLA = 5,       /* MLA latent rows as FlashMLA's fp8_ds_mla (656 bytes) */
    KVA_QUANT_FP8_TOKEN = 6,        /* index keys: fp8 e4m3 with a per-token scale */
    KVA_QUANT_COUNT_
} kva_quant;

/* "none", "int8_channel", "int8_token_k", "int8_token_k_v16", "fp8_e4m3",
 * "fp8_ds_mla", "fp8_token"; "invalid" otherwise. */
KVA_API const char *kva_quant_name(kva_quant quant);

/*
 * Static scales of a quantized cache (host arrays, copied at creation).
 * Each array's length selects its granularity:
 *   1            one value for the whole tensor,
 *   Hkv          one value per kv head,
 *   Hkv * D      one value per (kv head, channel), channel fastest
 *                (Hkv * Dv for the V arrays).
 * Scales must be finite and > 0; offsets finite (INT8 only; NULL with length
 * 0 means offset 0). Per format:
 *   INT8_CHANNEL      k_scale, v_scale required; k_offset, v_offset optional.
 *   INT8_TOKEN_K      v_scale required, v_offset optional; no k arrays
 *                     (key scales are computed per token on write).
 *   INT8_TOKEN_K_V16  no arrays (params may be NULL).
 *   FP8_E4M3          k_scale, v_scale of length 1 or Hkv; an absent one (or
 *                     NULL params) is 1.0, vLLM's default; no offsets.
 */
typedef struct kva_quant_params {
    const float *k_scale;
    int64_t k_scale_len;
    const float *k_offset;
    int64_t k_offset_len;
    const float *v_scale;
    int64_t v_scale_len;
    const float *v_offset;
    int64_t v_offset_len;
} kva_quant_params;

/*
 * Attention kind: what one cache row holds and how a plan reads it. A plan
 * runs only on a cache of its own kind. Descriptors that leave the field 0
 * (zero-initialized, as every descriptor should be) get KVA_ATTN_MHA, the
 * behaviour of caches and plans before the field existed.
 */
typedef enum kva_attn_kind {
    /* Separate K and V rows per kv head: MHA, GQA (Hkv < H) and MQA (Hkv = 1). */
    KVA_ATTN_MHA = 0,
    /* Multi-head latent attention (DeepSeek-V2/V3, Kimi K2): one latent row
     * per token, [c_kv (Dc) | k_pe (Dr)], shared by all query heads.
     * Cache: num_kv_heads = 1, head_dim = Dc + Dr, head_dim_v = Dc (given, not
     * 0, and < head_dim, so Dr = head_dim - head_dim_v >= 8); dtype F32, F16 or
     * BF16 (KVA_QUANT_NONE), or FP8_E4M3 (KVA_QUANT_FP8_E4M3, one per-tensor
     * k_scale, no v arrays: the values are the keys' first Dc columns). There
     * is no separate V storage: kva_cache_data's v_data points at K (each V
     * row is the first Dc columns of its K row, row stride Dc + Dr) and
     * kva_cache_block_bytes_v is 0. Layouts NHD and HND coincide.
     * Write: kva_cache_write with k = c_kv [T, Dc] and v = k_pe [T, Dr]
     * (vLLM's concat_and_cache_mla); token strides default to Dc and Dr.
     * Plans of this kind (Hkv = 1, D = Dc + Dr, Dv = Dc, an explicit scale,
     * no window, soft-cap or ALiBi) run kva_attention_run, the absorbed
     * kernel-level call (FlashMLA's flash_mla_with_kvcache), and kva_mla_run,
     * the layer-level call that takes the un-absorbed query and the layer's
     * W_UK / W_UV. An MLA cache may also hold FlashMLA's FP8 rows
     * (KVA_QUANT_FP8_DS_MLA, dtype FP8_E4M3, no params), which sparse plans
     * read (kva_mla_sparse_run, kvattn_mla.h). */
    KVA_ATTN_MLA = 1,
    /* Index keys of DeepSeek V3.2's lightning indexer: one key row of D
     * values per token (DeepSeek: 128), no values. Cache: num_kv_heads = 1,
     * head_dim = D, head_dim_v 0 or D (ignored: there is no V storage,
     * v_data is NULL, kva_cache_block_bytes_v is 0); dtype F32, F16 or BF16
     * (KVA_QUANT_NONE) or FP8_E4M3 with KVA_QUANT_FP8_TOKEN (no params).
     * Write: kva_cache_write with k = keys [T, D] and v = NULL. Plans of this
     * kind (num_kv_heads 1, head_dim D, num_heads = the index heads) run
     * kva_indexer_run only (kvattn_mla.h). */
    KVA_ATTN_INDEX = 2,
    KVA_ATTN_KIND_COUNT_
} kva_attn_kind;

/*
 * Head sizes D and Dv are multiples of 8 from 8 to the backend's limit: 576
 * (KVA_MAX_HEAD_DIM) on the reference and CPU backends, 256 on the CUDA
 * backend (whose MLA caches and plans take D 576 with Dv 512: DeepSeek's
 * latent rows, f16/bf16). Beyond it, or not a multiple of 8:
 * KVA_STATUS_UNSUPPORTED.
 */
typedef struct kva_cache_desc {
    int32_t num_blocks;   /* NB >= 1 */
    int32_t block_size;   /* B >= 1 tokens per block */
    int32_t num_kv_heads; /* Hkv, 1..KVA_MAX_HEADS */
    int32_t head_dim;     /* D: multiple of 8, 8..576 (CUDA: 8..256; MLA 576) */
    int32_t head_dim_v;   /* Dv: multiple of 8, 8..576 (CUDA: 8..256; MLA 512); 0 means Dv = D */
    kva_dtype dtype;      /* storage dtype: F32, F16 or BF16 for KVA_QUANT_NONE;
                             I8 for INT8_CHANNEL and INT8_TOKEN_K; FP8_E4M3 for
                             FP8_E4M3; for INT8_TOKEN_K_V16 the dtype of V
                             (F16 or BF16), K being int8 */
    kva_layout layout;
    kva_quant quant;
    kva_attn_kind kind; /* 0 = KVA_ATTN_MHA; any other value: see kva_attn_kind */
} kva_cache_desc;

typedef struct kva_cache kva_cache;

/* Allocates K and V storage in the context's memory space. The contents are
 * unspecified until written. Quantized formats need kva_cache_create_quant
 * (except FP8_E4M3 with unit scales and INT8_TOKEN_K_V16, which have no
 * static scales). */
KVA_API kva_status kva_cache_create(kva_context *ctx, const kva_cache_desc *desc, kva_cache **out);
/* kva_cache_create with the static scales of a quantized format (params may
 * be NULL where the format needs none; must be NULL for KVA_QUANT_NONE). The
 * scales are validated (length, finite, > 0) and copied into the cache; the
 * per-token key scale storage of the INT8_TOKEN_K formats is allocated too. */
KVA_API kva_status kva_cache_create_quant(kva_context *ctx, const kva_cache_desc *desc,
                                          const kva_quant_params *params, kva_cache **out);
/* Wraps caller-owned storage (host memory for ref/CPU, device memory for CUDA):
 * k_data holds NB*B*Hkv*D elements, v_data NB*B*Hkv*Dv elements, in the
 * desc's layout. The caller keeps ownership and must outlive the cache.
 * Unquantized caches only (KVA_QUANT_NONE). An MLA cache (kind
 * KVA_ATTN_MLA) has no V storage: k_data holds NB*B*(Dc + Dr) elements and
 * v_data must be NULL. */
KVA_API kva_status kva_cache_create_from(kva_context *ctx, const kva_cache_desc *desc, void *k_data,
                                         void *v_data, kva_cache **out);
/* kva_cache_create_from for storage that interleaves K and V page by page,
 * as FlashInfer's 5-D paged cache does: kv_data holds desc->num_blocks = NP
 * pages, [NP, 2, B, Hkv, D] (NHD) or [NP, 2, Hkv, B, D] (HND), each page's K
 * followed by its V (unquantized, Dv = D). The cache has 2*NP - 1 blocks;
 * page p is block 2p (K at page 2p of kv_data, V one page later), so block
 * tables and slot mappings name block 2p for page p. The odd blocks alias
 * the pages' halves: a block table or slot that names one reads or writes
 * the wrong half (not checked: plans do not see the cache). */
KVA_API kva_status kva_cache_create_from_interleaved(kva_context *ctx, const kva_cache_desc *desc,
                                                     void *kv_data, kva_cache **out);
KVA_API void kva_cache_destroy(kva_cache *cache); /* NULL is a no-op */

/* The descriptor with Dv resolved (head_dim_v is never 0 here). */
KVA_API kva_status kva_cache_get_desc(const kva_cache *cache, kva_cache_desc *out);
/* Base pointers of the K and V storage (either out-pointer may be NULL). */
KVA_API kva_status kva_cache_data(const kva_cache *cache, void **k_data, void **v_data);
/* The per-token key scales of the INT8_TOKEN_K formats: [NB, Hkv, B] float32
 * (block b's B*Hkv scales are contiguous, kva_cache_block_bytes_scales bytes),
 * in the cache's memory space; *scales = NULL for the other formats. A caller
 * that moves blocks itself (offload, transfer to another engine) through
 * kva_cache_data must move these with them: the int8 keys mean nothing
 * without them. */
KVA_API kva_status kva_cache_token_scales(const kva_cache *cache, float **scales);
/* Bytes of K and of V storage for one block (all kv heads), quantized
 * elements only (the INT8_TOKEN_K key scales are kva_cache_block_bytes_scales).
 * The packed formats keep their scales inside the block and count them:
 * FP8_DS_MLA B rows of Dc + 4 Dc / 128 + 2 Dr bytes, FP8_TOKEN B (D + 4). */
KVA_API size_t kva_cache_block_bytes_k(const kva_cache *cache);
KVA_API size_t kva_cache_block_bytes_v(const kva_cache *cache);
/* Bytes of per-token scale storage for one block (B * Hkv float32 key scales
 * for the INT8_TOKEN_K formats, else 0); copy/swap move them with the block. */
KVA_API size_t kva_cache_block_bytes_scales(const kva_cache *cache);
/* Bytes of the static scales and offsets the cache holds (independent of NB). */
KVA_API size_t kva_cache_static_scale_bytes(const kva_cache *cache);

/*
 * Write the new tokens' keys and values into the cache (vLLM's
 * reshape_and_cache). k: [T, Hkv, D], v: [T, Hkv, Dv] in src_dtype (F32, F16 or
 * BF16; converted to the cache dtype with round-to-nearest-even). Token t's row
 * starts at k + t*k_token_stride elements (0 means contiguous, Hkv*D), so slices
 * of a fused QKV projection can be passed without a copy; heads and channels
 * of a row are contiguous. slot_mapping: [T] int64, slot = block*B + offset; a
 * negative slot skips the token (padding): its k and v rows are never read,
 * so they may hold anything (NaN included, for every format). A slot >= NB*B
 * is an error and nothing is written (CUDA backend: slot_mapping is device
 * memory, which the host does not read; the kernel skips such a slot instead).
 * Two tokens of one call with the same slot leave that slot's contents
 * unspecified (any mix of the two rows; other slots are written normally).
 * Quantized caches quantize on write (formats above). INT8 cannot store NaN:
 * a NaN in any int8-quantized row (or +-inf in a per-token key row, whose
 * scale would be infinite) is rejected with KVA_STATUS_INVALID_ARGUMENT
 * naming the token, head and channel, and nothing is written; +-inf and large
 * finite values saturate to -128 / 127 under static scales. FP8 keeps NaN
 * (code 0x7f) and saturates the rest to +-448.
 * MLA caches (kind KVA_ATTN_MLA): k is c_kv [T, Dc] and v is k_pe [T, Dr]
 * (vLLM's concat_and_cache_mla); slot t's row becomes [c_kv(t) | k_pe(t)];
 * token strides default to Dc and Dr elements. A k / v row or slot_mapping
 * that overlaps the cache's storage (any block, scales included) is refused
 * with KVA_STATUS_INVALID_ARGUMENT before anything is written (Aliasing).
 */
KVA_API kva_status kva_cache_write(kva_context *ctx, kva_cache *cache, int32_t num_tokens,
                                   const void *k, int64_t k_token_stride, const void *v,
                                   int64_t v_token_stride, kva_dtype src_dtype,
                                   const int64_t *slot_mapping);

/*
 * Read tokens back out of the cache, dequantized: the inverse of
 * kva_cache_write (what a "separate" sparse-MLA prefill gathers, what an
 * engine offloads or checks). For each t < num_tokens with slot s =
 * slot_mapping[t] >= 0, row t of k (and of v) receives the slot's K (and V)
 * values converted to dst_dtype (F32, F16 or BF16, round-to-nearest-even);
 * a negative slot leaves its rows untouched. Shapes and strides as
 * kva_cache_write's: MHA k [T, Hkv, D], v [T, Hkv, Dv]; MLA k = c_kv
 * [T, Dc], v = k_pe [T, Dr]; INDEX k [T, D], v must be NULL. k or v may be
 * NULL to skip that half (not both). Quantized values come back as the
 * format defines them (code * scale, (code - offset) * scale; FP8_DS_MLA:
 * the tile's scale, k_pe as stored; FP8_TOKEN: the token's scale), computed
 * in double and rounded once to F32 (exact for power-of-two scales), then
 * to dst_dtype. A slot >= NB*B is an error and nothing is written (CUDA:
 * slot_mapping is device memory; the kernel skips such a slot). CUDA reads
 * back MLA caches, index-key caches and unquantized MHA caches; a quantized
 * MHA cache gets KVA_STATUS_UNSUPPORTED (swap its blocks to a host cache).
 * k and v rows overlapping each other, slot_mapping or the cache's storage
 * are refused with KVA_STATUS_INVALID_ARGUMENT and nothing is written
 * (Aliasing); k and v may interleave in one buffer at a common stride.
 */
KVA_API kva_status kva_cache_read(kva_context *ctx, const kva_cache *cache, int32_t num_tokens,
                                  const int64_t *slot_mapping, void *k, int64_t k_token_stride,
                                  void *v, int64_t v_token_stride, kva_dtype dst_dtype);

/* Copy whole blocks inside one cache: pairs [n, 2] int32 of (src, dst) block
 * ids (vLLM's copy_blocks, used for copy-on-write of shared blocks). All ids are
 * checked before anything is copied; a dst that appears twice is an error, and
 * so is a pairs array inside the cache's storage (Aliasing). */
KVA_API kva_status kva_cache_copy_blocks(kva_context *ctx, kva_cache *cache, const int32_t *pairs,
                                         int32_t num_pairs);

/* Copy blocks between two caches of the same shape except NB (vLLM's
 * swap_blocks: swap-out to a host cache, swap-in back). pairs: [n, 2] int32 of
 * (src block in src, dst block in dst). The caches may belong to contexts of
 * different backends (device <-> host); ctx is the one that performs the copy.
 * Storage of src and dst that overlaps, or pairs inside dst's storage, is
 * refused with KVA_STATUS_INVALID_ARGUMENT (Aliasing). */
KVA_API kva_status kva_cache_swap_blocks(kva_context *ctx, const kva_cache *src, kva_cache *dst,
                                         const int32_t *pairs, int32_t num_pairs);

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
                                       plans used only with kva_attention_run_ragged. The
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
     * Dv = v_head_dim (128), multiples of 8 from 8 to KVA_MAX_HEAD_DIM. Both 0:
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
 * and counts), and sinks should be finite.
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
