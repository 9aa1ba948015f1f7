/*
 * internal.h - definitions shared across kvattn's source files (never installed).
 *
 * The public API layer (src/cache, src/plan, src/attn/api.c) validates
 * every argument, then calls the context's backend through kva__backend_ops.
 * Backends may assume their inputs are valid.
 */
#ifndef KVA_INTERNAL_H
#define KVA_INTERNAL_H

#include "kvattn.h"

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

/* ---- errors (src/core/status.c) ---- */

/* Records a printf-style message for kva_last_error() on this thread and
 * returns status, so call sites read `return kva__fail(KVA_STATUS_X, "...")`.
 * Exported (with kva__clear_error) for the communicator libraries
 * kvattn_mpi and kvattn_nccl (src/comm/), which link the shared library;
 * not part of the API. */
KVA_API kva_status kva__fail(kva_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
/* Clears this thread's message; every public entry point calls it first. */
KVA_API void kva__clear_error(void);

/* Checks a required pointer argument: returns KVA_STATUS_NULL_POINTER naming it. */
#define KVA_CHECK_PTR(p)                                                                           \
    do {                                                                                           \
        if ((p) == NULL)                                                                           \
            return kva__fail(KVA_STATUS_NULL_POINTER, "%s: argument '%s' is NULL", __func__, #p);  \
    } while (0)

/* Checks that a tensor pointer is aligned to its element size (or to align
 * bytes): kernels read it through typed pointers. */
#define KVA_CHECK_ALIGNED(p, align)                                                                \
    do {                                                                                           \
        if ((uintptr_t)(const void *)(p) % (uintptr_t)(align) != 0)                                \
            return kva__fail(KVA_STATUS_INVALID_ARGUMENT,                                          \
                             "%s: argument '%s' = %p is not aligned to %zu bytes", __func__, #p,   \
                             (const void *)(p), (size_t)(align));                                  \
    } while (0)

/* Propagates a failing status. */
#define KVA_TRY(expr)                                                                              \
    do {                                                                                           \
        kva_status kva_try_s_ = (expr);                                                            \
        if (kva_try_s_ != KVA_STATUS_OK)                                                           \
            return kva_try_s_;                                                                     \
    } while (0)

/* ---- dtypes (src/core/dtype.c) ---- */

/* 1 for F32, F16, BF16. */
int kva__dtype_is_float(kva_dtype dtype);
/* The bf16 bits of the f32 of bits u: round to nearest even, NaN kept quiet
 * (kva_f32_to_bf16). Branch-free and inline, so row loops over it vectorize. */
static inline uint16_t kva__bf16_bits(uint32_t u)
{
    const uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? (u >> 16) | 0x40u : r);
}
/* Loads element i of a float-typed buffer as float. */
static inline float kva__load_f(const void *p, kva_dtype dt, size_t i)
{
    if (dt == KVA_DTYPE_F32)
        return ((const float *)p)[i];
    if (dt == KVA_DTYPE_F16)
        return kva_f16_to_f32(((const uint16_t *)p)[i]);
    return kva_bf16_to_f32(((const uint16_t *)p)[i]);
}
/* Stores x as element i of a float-typed buffer (round-to-nearest-even). */
static inline void kva__store_f(void *p, kva_dtype dt, size_t i, float x)
{
    if (dt == KVA_DTYPE_F32)
        ((float *)p)[i] = x;
    else if (dt == KVA_DTYPE_F16)
        ((uint16_t *)p)[i] = kva_f32_to_f16(x);
    else
        ((uint16_t *)p)[i] = kva_f32_to_bf16(x);
}

/* 1 if d is a head size the library accepts on some backend: a multiple of 8
 * from 8 to KVA_MAX_HEAD_DIM (include/kvattn.h). A backend may take less
 * (kva__backend_ops.max_head_dim; kva__head_dim_check). */
int kva__head_dim_ok(int32_t d);

/* ---- CPU features (src/core/cpu_features.c) ---- */

/* 1 where the CPU backend's x86-64 SIMD kernel files are built (x86-64, and
 * CMake's KVA_CPU_SIMD on, which otherwise defines KVA_NO_SIMD and leaves the
 * *_avx2*.c / *_avx512*.c files out). Code that calls into those files checks
 * this, not __x86_64__; the ISA level (kva__cpu_isa_of) is PORTABLE without
 * them. */
#if defined(__x86_64__) && !defined(KVA_NO_SIMD)
#define KVA_X86_SIMD 1
#else
#define KVA_X86_SIMD 0
#endif

typedef struct kva__cpu_features {
    int avx2, fma, f16c; /* x86-64 */
    int avx512f, avx512bw, avx512vl, avx512dq;
    int avx512bf16, avx512vnni; /* vdpbf16ps / vpdpbusd (with AVX-512 F) */
    /* vdpbf16ps scores beat fp32 FMA scores: set on AMD CPUs with
     * AVX512_BF16 (Zen 4 issues 512-bit FMAs at half rate and vdpbf16ps at
     * full rate), not on Intel ones (there vdpbf16ps does half the FMAs'
     * multiply-adds per cycle). The prefill dispatch reads it. */
    int bf16dot_fast;
    int neon; /* AArch64 */
} kva__cpu_features;

/* Detects the running CPU's vector ISA (cpuid + xgetbv on x86-64). */
void kva__cpu_features_get(kva__cpu_features *out);

/* Kernel ISA levels of the CPU backend, in increasing order. */
typedef enum kva__cpu_isa {
    KVA__ISA_PORTABLE = 0,  /* plain C */
    KVA__ISA_AVX2 = 1,      /* AVX2 + FMA + F16C */
    KVA__ISA_AVX512 = 2,    /* AVX-512 F/BW/VL/DQ (+ AVX2, FMA, F16C) */
    KVA__ISA_AVX512BF16 = 3 /* AVX-512 plus AVX512_BF16 */
} kva__cpu_isa;

/* The highest ISA level kernels may use: what the CPU and OS support, lowered
 * by the environment variable KVA_CPU_ISA=portable|avx2|avx512|avx512bf16 (an
 * override never raises the level above the detected one; other values are
 * ignored). Read at plan time, so tests and benchmarks can force each path.
 * kva__cpu_isa_of applies it to features detected earlier (the CPU backend's
 * plans use ctx->cpu_features: no cpuid per plan); kva__cpu_isa_level detects
 * first (tools, tests). */
kva__cpu_isa kva__cpu_isa_of(const kva__cpu_features *f);
kva__cpu_isa kva__cpu_isa_level(void);
const char *kva__cpu_isa_name(kva__cpu_isa isa);
/* Space-separated names of the detected features, e.g. "avx2 fma f16c"; "none" if none. */
const char *kva__cpu_isa_string(void);

/* ---- context (src/core/context.c) ---- */

typedef struct kva__backend_ops kva__backend_ops;

/* ---- kernel registry and the one force hook (src/core/kernels.c) ----
 *
 * Every backend lists the kernels it dispatches among in one registry
 * (kva__backend_ops.kernels), each named by what it is: "<family>_<isa or
 * arch>", e.g. "decode_avx512", "prefill_avx2", "decode_portable",
 * "prefill_wgmma_sm90", "prefill_mma_sm80". The dispatcher chooses per plan
 * (and per work item) as before; kva__context_force_kernel is the only
 * sanctioned way for tests and benchmarks to make it run one named kernel
 * instead. No environment variables, no writes into plan internals. */
typedef enum kva__kernel_family {
    KVA__KERNEL_DECODE = 0,  /* decode-shaped items (q_len 1..4, few rows) */
    KVA__KERNEL_PREFILL = 1, /* prefill-shaped items */
    KVA__KERNEL_MLA = 2,     /* the layer-level MLA items (kva_mla_run) */
    KVA__KERNEL_FAMILIES
} kva__kernel_family;

typedef struct kva__kernel_info {
    const char *name;
    kva__kernel_family family;
    /* 1 if this build and machine can run the kernel on ctx (ISA level,
     * compute capability); NULL = always. */
    int (*usable)(const kva_context *ctx);
} kva__kernel_info;

/* Makes plans created on ctx from now on run the registry kernel `name` for
 * every item of its family (the other family keeps its own forcing or the
 * dispatcher's choice). name NULL or "" clears every forcing. Fails with
 * KVA_STATUS_INVALID_ARGUMENT naming the registry when the backend has no
 * such kernel, and KVA_STATUS_UNSUPPORTED when this machine or build cannot
 * run it; ctx is unchanged then. */
kva_status kva__context_force_kernel(kva_context *ctx, const char *name);
/* The registry index forced for family on ctx, or -1 (dispatcher's choice). */
int32_t kva__context_forced_kernel(const kva_context *ctx, kva__kernel_family family);
/* The backend's registry: *count entries (NULL, 0 for a backend without one). */
const kva__kernel_info *kva__context_kernels(const kva_context *ctx, int32_t *count);

struct kva_context {
    kva_backend backend;
    int32_t num_threads;
    int32_t device_id;
    const kva__backend_ops *ops;
    kva__cpu_features cpu_features; /* detected at creation, for plan-time kernel choices */
    /* Scratch memory for run-path calls; grown only by kva_plan_create (never
     * during a run), in the backend's memory space (ops->memory). */
    void *workspace;
    size_t workspace_bytes;
    /* Backend state made by ops->context_init (the CUDA backend's stream and
     * device metadata buffers), else NULL. */
    void *state;
    /* Registry index + 1 of the kernel forced per family (kva__context_force_kernel); 0 = none. */
    int32_t forced_kernel[KVA__KERNEL_FAMILIES];
    /* Most key splits of one absorbed kva_mla_run item on the CPU backend
     * (src/attn/cpu/mla_cpu.c), for tests and benches: 0 = the default, 1 =
     * no split-KV. Read when a plan is created. */
    int32_t mla_max_splits;
    /* A second context of the same backend, device and threads, made by the
     * first cascade plan (src/plan/cascade.c): it holds the prefix pass's
     * plan (the CUDA backend keeps one uploaded plan per context) and the
     * cascade buffers. NULL until then; destroyed with this context. */
    kva_context *aux;
};

/* Grows ctx->workspace to at least bytes, in the context's memory space
 * (ctx->ops->memory->workspace_reserve). */
kva_status kva__context_reserve_workspace(kva_context *ctx, size_t bytes);
/* Checks a head size (D or Dv, named by what) against the context's backend:
 * KVA_STATUS_UNSUPPORTED naming fn, the value and the backend's limit when
 * its kernels cannot take it. d already passed kva__head_dim_ok. */
kva_status kva__head_dim_check(const char *fn, const kva_context *ctx, const char *what, int32_t d);
/* Host memory (src/core/context.c, src/cache/): the workspace of host
 * backends. */
kva_status kva__host_workspace_reserve(kva_context *ctx, size_t bytes);
void kva__host_workspace_free(kva_context *ctx);

/* ---- cache (src/cache/) ---- */

struct kva_cache {
    kva_cache_desc desc; /* head_dim_v resolved */
    /* The memory space that owns k/v (and the per-token scales): the table of
     * the creating context's backend (ops->memory). Frees, writes and block
     * copies go through it; a context may read the cache only if its own
     * backend has the same table (and device). */
    const struct kva__memory_ops *mem;
    void *k; /* [NB, B, Hkv, D] (NHD) or [NB, Hkv, B, D] (HND) */
    void *v; /* same with Dv */
    int owns_memory;
    int32_t device_id;     /* device of k/v when mem->per_device (CUDA), else 0 */
    kva_dtype k_dtype;     /* K storage dtype (desc.dtype; I8 for INT8_TOKEN_K_V16) */
    size_t elem_size;      /* bytes of a K element */
    size_t v_elem;         /* bytes of a V element (desc.dtype) */
    int64_t k_block_elems; /* B * Hkv * D */
    int64_t v_block_elems; /* B * Hkv * Dv */
    /* Quantization (src/cache/quant.c); all NULL for KVA_QUANT_NONE. Static
     * scales are expanded to one value per (kv head, channel):
     * k_scale/k_offset [Hkv, D], v_scale/v_offset [Hkv, Dv] (offsets are 0
     * where the format has none). One allocation holds all four. */
    float *k_scale, *k_offset, *v_scale, *v_offset;
    /* Per-token key scales [NB, Hkv, B] float32 (INT8_TOKEN_K formats), or NULL;
     * in the cache's memory space (device memory for CUDA caches). */
    float *k_token_scale;
    /* CUDA quantized caches: a device copy of the four expanded static arrays
     * (same order as k_scale .. v_offset, one allocation; the host copies above
     * stay for swap_blocks' comparison), and one device word recording the
     * first element the last write rejected (int8 NaN policy; cache_ops.cu).
     * NULL otherwise. */
    float *dev_scales;
    unsigned long long *dev_reject;
    /* [NB] host scratch, all zero between calls: copy/swap pair checks mark
     * blocks here in O(pairs) without allocating on the run path. */
    unsigned char *pair_flags;
};

/* KVA_STATUS_OK if ctx may touch cache: the cache lives in the memory
 * space of ctx's backend (and on its device); else INVALID_ARGUMENT naming
 * fn and both spaces (src/cache/cache.c). */
kva_status kva__cache_check_space(const char *fn, const kva_context *ctx, const kva_cache *cache);

/* Element offset of (block, offset in block, kv head) for a row of width
 * dim in a cache of the given layout; 64-bit throughout. */
static inline int64_t kva__cache_row(const kva_cache_desc *d, int64_t block, int64_t off,
                                     int64_t head, int64_t dim)
{
    if (d->layout == KVA_LAYOUT_NHD)
        return ((block * d->block_size + off) * d->num_kv_heads + head) * dim;
    return ((block * d->num_kv_heads + head) * d->block_size + off) * dim;
}

/* Width of the rows V lives in: Dv for MHA caches; D for MLA caches, whose V
 * rows are the first Dv columns of the K rows (cache->v == cache->k). Element
 * offsets of V rows are kva__cache_row(d, block, off, head, kva__cache_v_dim(d)). */
static inline int64_t kva__cache_v_dim(const kva_cache_desc *d)
{
    return d->kind == KVA_ATTN_MLA ? d->head_dim : d->head_dim_v;
}

/* ---- quantized caches (src/cache/quant.c) ---- */

/* FP8_DS_MLA (FlashMLA's fp8_ds_mla, include/kvattn.h): c_kv values per
 * float32 scale, and the bytes of one token's row for D = Dc + Dr: Dc e4m3
 * codes, Dc / 128 float32 scales, Dr bf16 values of k_pe (DeepSeek: 656). */
#define KVA__DS_MLA_TILE 128
static inline int64_t kva__ds_mla_row_bytes(int64_t D, int64_t Dc)
{
    return Dc + 4 * (Dc / KVA__DS_MLA_TILE) + 2 * (D - Dc);
}
/* Quantizes one latent row, c_kv [Dc] and k_pe [Dr] in float32, into the
 * fp8_ds_mla row dst [kva__ds_mla_row_bytes] (src/cache/ds_mla.c): per tile
 * s = max(amax / 448, FLT_MIN), codes fp8(x / s), k_pe as bf16 (rne). */
void kva__ds_mla_quantize_row(uint8_t *dst, const float *ckv, const float *kpe, int64_t Dc,
                              int64_t Dr);
/* Dequantizes an fp8_ds_mla row into ckv [Dc] (code * scale, float32) and
 * kpe [Dr] (bf16 -> float32, exact); either may be NULL. */
void kva__ds_mla_dequantize_row(const uint8_t *row, float *ckv, float *kpe, int64_t Dc, int64_t Dr);
/* The host memory space's kva_cache_read (src/cache/cache_read.c), also the
 * gather of the host backends' separate sparse prefill: slots already
 * checked (< NB*B; negative ones skipped), strides in dst elements. */
kva_status kva__host_cache_read(kva_context *ctx, const kva_cache *cache, int32_t num_tokens,
                                const int64_t *slot_mapping, void *k, int64_t k_stride, void *v,
                                int64_t v_stride, kva_dtype dst_dtype);

/* Validates params for the resolved descriptor d and expands them into one
 * allocation of [Hkv*D] k_scale, k_offset, [Hkv*Dv] v_scale, v_offset (in that
 * order), stored in *out (NULL for KVA_QUANT_NONE). fn names the caller. */
kva_status kva__quant_params_expand(const char *fn, const kva_cache_desc *d,
                                    const kva_quant_params *params, float **out);
/* 1 if K (is_v = 0) or V (is_v = 1) of the format is stored as int8. */
int kva__quant_is_int8(kva_quant q, int is_v);
/* Index of the per-token key scale of (block, offset, head) in k_token_scale. */
static inline int64_t kva__token_scale_index(const kva_cache_desc *d, int64_t block, int64_t off,
                                             int64_t head)
{
    return (block * d->num_kv_heads + head) * d->block_size + off;
}
/* Checks the float rows that a write would quantize to int8: NaN anywhere (and
 * +-inf in per-token key rows) is rejected. Arguments as kva_cache_write's. */
kva_status kva__quant_check_rows(const kva_cache *c, int32_t num_tokens, const char *k,
                                 int64_t k_stride_bytes, const char *v, int64_t v_stride_bytes,
                                 kva_dtype src_dt, const int64_t *slots);
/* Quantizes one token's K (is_v = 0) or V row (all heads) into the cache at
 * (block, off); src in src_dt, heads contiguous. Per-token key scales are
 * written too. */
void kva__quant_write_token(const kva_cache *c, int is_v, int64_t block, int64_t off,
                            const char *src, kva_dtype src_dt);
/* Dequantized value of channel ch of the K (is_v = 0) or V row of (block, off,
 * head), in double, exactly as the format defines it (reference backend). */
double kva__quant_load(const kva_cache *c, int is_v, int64_t block, int64_t off, int64_t head,
                       int64_t ch);
/* Channels 0 .. n-1 of the same row into out [n]: each equal to
 * kva__quant_load's, the row's address and scales found once. */
void kva__quant_load_row(const kva_cache *c, int is_v, int64_t block, int64_t off, int64_t head,
                         int64_t n, double *out);

/* ---- index-key caches (kind KVA_ATTN_INDEX; src/cache/index_cache.c) ----
 *
 * One key row of D values per token, Hkv 1, no V storage (v == k,
 * v_block_elems 0). Unquantized: K [NB, B, D] in the cache dtype. FP8_TOKEN:
 * each block is B * (D + 4) bytes, the B rows of D e4m3 codes, token after
 * token, then the B float32 scales (x = code * scale). */

/* Bytes per row that the format adds for its scale: 4 for FP8_TOKEN, else 0. */
static inline size_t kva__index_scale_bytes(const kva_cache_desc *d)
{
    return d->quant == KVA_QUANT_FP8_TOKEN ? sizeof(float) : 0;
}
/* The FP8_TOKEN scale of a row whose absolute maximum is amax (NaN ignored
 * by the caller): max(amax / 448, FLT_MIN), as vLLM's indexer cache write. */
float kva__index_fp8_scale(float amax);
/* The FP8_TOKEN quantization of one row x [D] (a key row of the cache, or
 * an index query row of an FP8-q indexer plan): codes [D] = e4m3(x / s),
 * x / s in float32, round to nearest even, saturating; returns s. */
float kva__index_fp8_quant_row(const float *x, int64_t D, uint8_t *codes);
/* The relations of kind KVA_ATTN_INDEX (validate_desc in cache.c): Hkv 1,
 * head_dim_v 0 or D, F32/F16/BF16 unquantized or FP8_E4M3 + FP8_TOKEN. */
kva_status kva__index_cache_validate(const char *fn, const kva_cache_desc *d);
/* Token (block, off)'s key row: the D values (codes of FP8_TOKEN rows) as
 * float into dst [D]; returns the row's scale (1 when unquantized), so the
 * key is dst * scale. Host caches only. */
float kva__index_load_key(const kva_cache *c, int64_t block, int64_t off, float *dst);
/* kva_cache_write into a host index-key cache, after the API's checks (the
 * slots are checked here first): k [T, D] rows at k_stride elements. */
kva_status kva__host_index_write(kva_context *ctx, kva_cache *cache, int32_t num_tokens,
                                 const void *k, int64_t k_stride, kva_dtype src_dtype,
                                 const int64_t *slot_mapping);
/* The memory spaces' read-back of an index-key cache (kva_cache_read after
 * validation, strides resolved): k [T, D] rows at k_stride elements in
 * dst_dtype. Host: every slot checked first; CUDA: slots >= NB*B skipped. */
kva_status kva__host_index_read(kva_context *ctx, const kva_cache *cache, int32_t num_tokens,
                                const int64_t *slot_mapping, void *k, int64_t k_stride,
                                kva_dtype dst_dtype);
/* kva_cache_read of an index-key cache: the API-level checks (v NULL, k
 * given, strides, dtype, memory space), then the space's read. */
kva_status kva__index_cache_read(kva_context *ctx, const kva_cache *cache, int32_t num_tokens,
                                 const int64_t *slot_mapping, void *k, int64_t k_token_stride,
                                 void *v, int64_t v_token_stride, kva_dtype dst_dtype);

/* ---- plan (src/plan/) ---- */

/* Backend-specific work partition; defined by the backend that builds it. */
typedef struct kva__partition kva__partition;

struct kva_plan {
    kva_backend backend;         /* backend of the context that built it */
    const kva__backend_ops *ops; /* that context's backend table (plan_release at destroy) */
    kva_plan_desc d;             /* scalars resolved (head_dim_v, scale, decode_threshold);
                                    its pointer fields are NULL: use the copies below */
    int32_t *query_start_loc;    /* [R+1] host copy */
    int32_t *seq_lens;           /* [R] host copy (global lengths under DCP) */
    int32_t *kv_lens;            /* [R] keys this rank holds per request: seq_lens, or
                                    the local lengths of a sharded (DCP) plan */
    int64_t *kv_start;           /* [R+1] exclusive prefix sum of kv_lens (ragged K/V rows) */
    int32_t *block_table;        /* [R, d.block_table_stride] host copy, or NULL */
    float *alibi_slopes;         /* [H] host copy, or NULL */
    uint64_t *tree_bits;         /* [T] tree plans: bit k of query token t's word = it sees
                                    tree token k of its request (kva__tree_lanes); else NULL */
    int32_t max_block_id;        /* largest block id any request reads, -1 if none */
    kva_plan_info info;
    size_t workspace_bytes; /* ctx workspace the run needs (reserved at plan time) */
    kva__partition *part;   /* built by ops->plan_build, freed by ops->plan_release */
    void *device;           /* backend-owned device copies (CUDA) */
    /* kva_plan_update: the capacities of the host arrays above (elements of
     * the per-request arrays, of block_table, of alibi_slopes), and the
     * plan before last (memory the next update builds in; its backend part
     * recycled or released), or NULL. */
    int64_t cap_reqs, cap_bt, cap_heads;
    kva_plan *spare;
    /* A cascade plan's passes (src/plan/cascade.c; part and device stay
     * NULL), or NULL. */
    struct kva__cascade *cascade;
};

/* ---- cascade (shared-prefix) plans (src/plan/cascade.c, src/attn/cascade.c) ----
 *
 * A cascade plan runs as two ordinary plans and two index passes:
 *   gather:  q_pref [C, M, H, D] = q rows gather[0..M) (the groups' rows, group
 *            after group), copied C times, once per key chunk;
 *   prefix:  plan `prefix` on ctx->aux, non-causal: virtual request (c, g)
 *            holds group g's rows of copy c and reads chunk c of the group's
 *            shared blocks -> out_pref [C, M, H, Dv], lse_pref [C, M, H];
 *   suffix:  plan `suffix` on ctx: every request over its keys after its
 *            group's prefix (all of them when ungrouped), with the sinks ->
 *            out, lse (or lse_suf);
 *   merge:   per level l, out/lse row t merged in place with its C prefix
 *            rows (merge[l * T + t] >= 0; -1 when t has no group at level l).
 * Nested groups (levels): a group of level l > 0 attends only its part of
 * the prefix (the blocks after its parent's), with its rows listed again,
 * so a token has one prefix row per level it belongs to. Buffers live in
 * ctx->aux's workspace past the prefix plan's own bytes. */
typedef struct kva__cascade {
    kva_plan *prefix;   /* built on aux */
    kva_plan *suffix;   /* built on the plan's context */
    kva_context *aux;   /* the context the prefix plan was built on */
    int32_t num_groups; /* G: groups of every level */
    int32_t num_levels; /* L: 1 without nested groups */
    int32_t num_chunks; /* C */
    int32_t rows;       /* M: query rows of all groups (a row once per level) */
    int32_t *gather;    /* [M] token of each prefix row (host) */
    int32_t *merge;     /* [L, T] prefix row of each token per level, or -1 (host) */
    size_t off_q, off_out, off_lse, off_lse_suf, off_tmp, off_idx; /* bytes into aux->workspace */
    size_t aux_bytes;                                              /* aux workspace the run needs */
} kva__cascade;

/* Sparse MLA plans (d.sparse_topk > 0): the rows the separate mode
 * (KVA_SPARSE_SEPARATE) gathers into the workspace at once, the longest
 * seq_len of the plan's prefill requests (q_len > decode_threshold); 0 for
 * a MIXED plan or one without prefills (src/plan/plan.c). A backend's
 * plan_build reserves this many dense latent rows [rows, D] in its gather
 * dtype. */
int64_t kva__sparse_gather_rows(const kva_plan *p);

/* Decides and builds the cascade of plan p (classified, not yet built) from
 * desc: validates a given grouping, finds or takes the groups, runs the cost
 * model and, when a cascade is chosen, builds both passes and sets
 * p->cascade (else leaves it NULL: p is built as a plain plan). */
kva_status kva__cascade_plan(kva_context *ctx, const kva_plan_desc *desc, kva_plan *p);
/* Frees p->cascade (its two plans included). */
void kva__cascade_free(kva_plan *p);
/* kva_attention_run of a cascade plan after the API's checks. */
kva_status kva__cascade_run(kva_context *ctx, const kva_plan *plan, const void *q,
                            const kva_cache *cache, const float *sinks, void *out, float *lse);
/* The host backends' index passes (reference and CPU): cascade_gather and
 * cascade_merge of kva__backend_ops over the host index arrays. */
kva_status kva__host_cascade_gather(kva_context *ctx, const kva_plan *plan, const void *q,
                                    void *q_pref);
kva_status kva__host_cascade_merge(kva_context *ctx, const kva_plan *plan, int32_t level,
                                   const void *out_pref, const float *lse_pref, void *out,
                                   float *lse);

/* What a backend's cascade costs, for the plan's choice (kva_cascade_mode
 * AUTO): rates of the passes and the fixed cost of the extra ones. */
typedef struct kva__cascade_cost {
    double read_bw;      /* bytes/s of keys read once (the prefix pass) */
    double reread_bw;    /* bytes/s of keys several requests read in turn (plain plans
                            re-read a shared prefix, partly from cache) */
    double reread_max;   /* prefixes of at most this many K/V bytes are re-read at
                            reread_bw, larger ones at read_bw; 0: any size */
    double decode_flops; /* flop/s of the plain (decode) kernels */
    double prefix_flops; /* flop/s of the prefix pass (prefill kernels) */
    double fixed_s;      /* seconds of the gather, prefix launch and merge */
    double prefix_rows;  /* attention rows per kv head (query rows x GQA group) at which
                            the prefix pass reaches prefix_flops; fewer scale it down in
                            proportion (unfilled vector lanes); 0: no scaling */
    int32_t units;       /* parallel units to fill (CUDA: 2 x SMs); 0: no key chunks */
} kva__cascade_cost;

/* ---- decode context parallelism: positions of a sharded plan ----
 *
 * A sharded plan (d.dcp_size > 1, resolved: size >= 1, interleave >= 1)
 * holds local key j of a request at global position
 * ((j / I) * N + rank) * I + j % I, which grows with j; so the keys a row
 * sees (a contiguous global range under every mask) are a contiguous local
 * range too, and masks only need the two maps below. */

/* The number of the rank's local keys whose global position is below g. */
static inline int64_t kva__dcp_local_count(const kva_plan_desc *d, int64_t g)
{
    if (g <= 0)
        return 0;
    const int64_t I = d->dcp_interleave, span = (int64_t)d->dcp_size * I;
    const int64_t rem = g % span - (int64_t)d->dcp_rank * I;
    return g / span * I + (rem < 0 ? 0 : rem > I ? I : rem);
}

/* The first key visible to the query at (global) position pos under the
 * window (window_left >= 0) and the local-attention chunk (chunk > 0): the
 * larger of pos - window_left and the start of pos's chunk, at least 0. Both
 * masks keep a row's visible keys one contiguous range, and the first key
 * never decreases as pos grows, so a tile of rows sees [first key of its
 * first row, last key of its last row). Shared by the plan and every kernel. */
#ifdef __CUDACC__
#define KVA__HOST_DEVICE __host__ __device__
#else
#define KVA__HOST_DEVICE
#endif
static inline KVA__HOST_DEVICE int32_t kva__first_key(int32_t pos, int32_t window_left,
                                                      int32_t chunk)
{
    int32_t lo = window_left >= 0 && pos - window_left > 0 ? pos - window_left : 0;
    if (chunk > 0 && pos > 0) {
        const int32_t start = pos - pos % chunk;
        lo = start > lo ? start : lo;
    }
    return lo;
}

/* Everything kva_plan_create and kva_plan_update check of ctx and desc
 * before they build anything (src/plan/plan_check.c): on success *dcp holds
 * desc with its DCP fields resolved, *max_block_id the largest block id a
 * request with queries reads (-1 if none) and *tree_bits a tree plan's mask
 * words (kva__plan_tree_bits; NULL without a tree; the caller owns them). */
kva_status kva__plan_check_desc(kva_context *ctx, const kva_plan_desc *given, kva_plan_desc *dcp,
                                int32_t *max_block_id, uint64_t **tree_bits);

/* Validates a plan descriptor's draft tree (tree_parents or tree_mask, after
 * the batch arrays were checked) and builds its words (kva_plan.tree_bits)
 * into *out, or NULL for a plan without a tree (src/plan/tree.c). */
kva_status kva__plan_tree_bits(const kva_plan_desc *d, uint64_t **out);

/* Visibility of the keys c0 .. c0 + 31 of request r to its query i under the
 * plan's tree mask, one bit per key (bit t = key c0 + t): all ones without a
 * tree; with one, the committed keys (below s - q) are visible and tree key
 * s - q + k is if bit k of the row's tree word is set. Kernels AND it into
 * their lane masks of a 32-key chunk. */
static inline uint32_t kva__tree_lanes(const kva_plan *p, int32_t r, int32_t i, int64_t c0)
{
    if (!p->tree_bits)
        return 0xffffffffu;
    const int32_t q0 = p->query_start_loc[r];
    const int64_t t0 = (int64_t)p->seq_lens[r] - (p->query_start_loc[r + 1] - q0);
    const uint64_t bits = p->tree_bits[q0 + i];
    const int64_t off = c0 - t0;
    if (off >= 64)
        return 0;
    if (off >= 0)
        return (uint32_t)(bits >> off);
    if (off <= -32)
        return 0xffffffffu;
    const int sh = (int)-off;
    return (uint32_t)(bits << sh) | ((1u << sh) - 1u);
}

/* The global position of local key j (j itself for an unsharded plan): the
 * key position of the ALiBi bias. */
static inline int64_t kva__key_pos(const kva_plan_desc *d, int64_t j)
{
    if (d->dcp_size <= 1)
        return j;
    const int64_t I = d->dcp_interleave;
    return ((j / I) * d->dcp_size + d->dcp_rank) * I + j % I;
}

/* ---- backends ----
 *
 * Everything core (src/core, src/cache, src/plan, src/attn/api.c) does that
 * depends on the backend goes through these two tables: core validates, then
 * calls the context's table. A backend lives in its own folder and is listed
 * once, in kva__backends (src/core/context.c); a memory space (where caches
 * and workspace live, with the cache operations that touch that memory) is a
 * kva__memory_ops that one or more backends point at. */

typedef struct kva__memory_ops {
    const char *name; /* "host", "cuda device": names the space in messages */
    int host;         /* 1: plain host memory: any backend's block copy may read
                         and write it (CUDA's swap-in / swap-out) */
    int per_device;   /* 1: allocations belong to one device (kva_cache.device_id):
                         a context of another device may not touch them */
    /* Grows ctx->workspace to at least bytes (never during a run); frees it. */
    kva_status (*workspace_reserve)(kva_context *ctx, size_t bytes);
    void (*workspace_free)(kva_context *ctx);
    /* Allocates c's storage for the validated c->desc (k, v and, for the
     * INT8_TOKEN_K formats, k_token_scale, zeroed), plus whatever the space
     * needs of the host static scales c->k_scale .. v_offset (CUDA: a device
     * copy). An MLA cache has v_block_elems 0: K only, then c->v = c->k (and
     * cache_free must not free v twice). On failure the fields it set stay
     * set for cache_free. */
    kva_status (*cache_alloc)(kva_context *ctx, kva_cache *c);
    /* Frees what cache_alloc made (k and v only if c->owns_memory); each
     * pointer may be NULL. */
    void (*cache_free)(kva_cache *c);
    /* kva_cache_write after validation, except the slot values, which only
     * this space can read (host: every slot checked before anything is
     * written; device: the kernel skips slots >= NB*B). Strides in source
     * elements, resolved; num_tokens > 0. MLA caches: k = c_kv rows [T, Dc]
     * at k_stride, v = k_pe rows [T, Dr] at v_stride; each slot's row becomes
     * [c_kv | k_pe] (FP8_E4M3: quantized with the per-tensor k scale). */
    kva_status (*cache_write)(kva_context *ctx, kva_cache *cache, int32_t num_tokens, const void *k,
                              int64_t k_stride, const void *v, int64_t v_stride,
                              kva_dtype src_dtype, const int64_t *slot_mapping);
    /* Block copies after validation: pairs [n, 2] host array of independent
     * (src, dst) ids; src and dst are each in this space or in host memory. */
    kva_status (*copy_blocks)(kva_context *ctx, const kva_cache *src, kva_cache *dst,
                              const int32_t *pairs, int32_t n);
    /* kva_cache_read after validation, except the slot values (as
     * cache_write); strides in destination elements, resolved; k or v may be
     * NULL (not both); num_tokens > 0. NULL: the space cannot read back
     * (kva_cache_read refuses with KVA_STATUS_UNSUPPORTED). */
    kva_status (*cache_read)(kva_context *ctx, const kva_cache *cache, int32_t num_tokens,
                             const int64_t *slot_mapping, void *k, int64_t k_stride, void *v,
                             int64_t v_stride, kva_dtype dst_dtype);
} kva__memory_ops;

extern const kva__memory_ops kva__host_memory; /* src/cache/host_memory.c */

struct kva__backend_ops {
    const char *name;
    /* Builds plan->part and reserves workspace; called at the end of kva_plan_create. */
    kva_status (*plan_build)(kva_context *ctx, kva_plan *plan);
    void (*plan_release)(kva_plan *plan);
    kva_status (*attention_paged)(kva_context *ctx, const kva_plan *plan, const void *q,
                                  const kva_cache *cache, const float *sinks, void *out,
                                  float *lse);
    kva_status (*attention_ragged)(kva_context *ctx, const kva_plan *plan, const void *q,
                                   const void *k, const void *v, const float *sinks, void *out,
                                   float *lse);
    kva_status (*merge_states)(kva_context *ctx, int32_t num_tokens, int32_t num_heads,
                               int32_t head_dim_v, kva_dtype dtype, const void *out_a,
                               const float *lse_a, const void *out_b, const float *lse_b, void *out,
                               float *lse_out);
    /* The kernel registry (see kva__kernel_info); NULL / 0 for none. */
    const kva__kernel_info *kernels;
    int32_t num_kernels;

    /* ---- context and memory ---- */
    /* Largest head size (D and Dv) its kernels take, <= KVA_MAX_HEAD_DIM
     * (0 means KVA_MAX_HEAD_DIM); caches, plans and merges beyond it get
     * KVA_STATUS_UNSUPPORTED (kva__head_dim_check). */
    int32_t max_head_dim;
    /* Host threads it runs on: 1 (ctx->num_threads is forced to 1), or 0
     * (kva_context_desc.num_threads, 0 = all cores). */
    int32_t max_threads;
    /* Devices visible (kva_context_desc.device_id must be below it); 0 makes
     * the backend unavailable. NULL: a host backend, always available, whose
     * device_id is ignored. */
    int (*device_count)(void);
    /* Creates ctx->state on ctx->device_id (NULL: nothing to create); frees
     * it, called before the memory space frees the workspace. */
    kva_status (*context_init)(kva_context *ctx);
    void (*context_free)(kva_context *ctx);
    /* Where its caches and workspace live. */
    const kva__memory_ops *memory;
    /* kva_merge_states_n after validation (num_parts >= 1, num_tokens > 0,
     * strides resolved (never 0); lse_out may be NULL). */
    kva_status (*merge_states_n)(kva_context *ctx, int32_t num_parts, int32_t num_tokens,
                                 int32_t num_heads, int32_t head_dim_v, kva_dtype dtype,
                                 const void *outs, int64_t out_stride, const float *lses,
                                 int64_t lse_stride, void *out, float *lse_out);

    /* ---- MLA (last, so tables initialized by position, as cuda_ctx.cu's,
     * leave them NULL) (plans and caches of kind KVA_ATTN_MLA; NULL: the backend has
     * none, and kva_plan_create refuses such plans with KVA_STATUS_UNSUPPORTED) ----
     * The cache's V rows are the first Dv = Dc columns of its K rows
     * (cache->v == cache->k, row stride D = Dc + Dr: kva__cache_v_dim).
     * mla_attention_paged: kva_attention_run on an MLA plan (absorbed):
     *   q [T, H, Dc + Dr], out [T, H, Dc] in q_dtype, sinks [H] or NULL,
     *   lse [T, H] or NULL; same semantics as attention_paged.
     * mla_run: kva_mla_run (layer level): q [T, H, Dn + Dr], w_uk [H, Dn, Dc],
     *   w_uv [H, Dc, Dv] in q_dtype, out [T, H, Dv] in q_dtype, lse [T, H] or
     *   NULL; Dn = plan->d.mla_qk_nope_head_dim, Dv = plan->d.mla_v_head_dim
     *   (both > 0; plan_build reserved the workspace it needs). */
    kva_status (*mla_attention_paged)(kva_context *ctx, const kva_plan *plan, const void *q,
                                      const kva_cache *cache, const float *sinks, void *out,
                                      float *lse);
    kva_status (*mla_run)(kva_context *ctx, const kva_plan *plan, const void *q, const void *w_uk,
                          const void *w_uv, const kva_cache *cache, void *out, float *lse);

    /* ---- cascade (kva__cascade; NULL cascade_gather: the backend has none
     * and plans decline it) ----
     * cascade_cost: the cost model's rates on ctx (NULL: the plan never
     *   chooses a cascade by itself, KVA_CASCADE_ON still runs one).
     * cascade_follow: makes aux run where ctx runs (CUDA: on ctx's stream),
     *   before aux's plan is built; NULL for host backends.
     * cascade_upload: at plan time, after both passes are built: the index
     *   arrays into the backend's memory (CUDA: aux's workspace at off_idx);
     *   NULL for host backends, whose passes read the host arrays.
     * cascade_gather / cascade_merge: the index passes (kva__cascade), on
     *   ctx's stream; q_pref, out_pref and lse_pref point into aux's
     *   workspace; out [T, H, Dv] and lse [T, H] are merged in place with the
     *   prefix rows of one level (merge[level * T ..]), once per level. */
    kva_status (*cascade_cost)(const kva_context *ctx, kva__cascade_cost *out);
    kva_status (*cascade_follow)(kva_context *aux, const kva_context *ctx);
    kva_status (*cascade_upload)(kva_context *ctx, const kva_plan *plan);
    kva_status (*cascade_gather)(kva_context *ctx, const kva_plan *plan, const void *q,
                                 void *q_pref);
    kva_status (*cascade_merge)(kva_context *ctx, const kva_plan *plan, int32_t level,
                                const void *out_pref, const float *lse_pref, void *out, float *lse);

    /* ---- sparse MLA and the indexer (kvattn_mla.h; NULL: the backend has
     * none, and kva_plan_create refuses such plans with
     * KVA_STATUS_UNSUPPORTED) ----
     * mla_sparse: kva_mla_sparse_run after the API's checks (host backends:
     *   every index and topk_length checked by the API first); indices_stride
     *   resolved (>= K); topk_length may be NULL; plan_build reserved the
     *   workspace (KVA_SPARSE_SEPARATE: the gathered rows).
     * indexer: kva_indexer_run after the API's checks; indices_stride
     *   resolved; topk_length may be NULL. */
    kva_status (*mla_sparse)(kva_context *ctx, const kva_plan *plan, const void *q,
                             const kva_cache *cache, const int32_t *indices, int64_t indices_stride,
                             const int32_t *topk_length, const float *sinks, void *out, float *lse);
    kva_status (*indexer)(kva_context *ctx, const kva_plan *plan, const void *q,
                          const float *weights, const kva_cache *cache, int32_t *indices,
                          int64_t indices_stride, int32_t *topk_length);

    /* Optional (kva_plan_update): keeps what plan_build can rebuild in of a
     * replaced plan's backend part (left in plan->part / plan->device, which
     * plan_build then finds non-NULL) and frees the rest. NULL: plan_release
     * is called instead and plan_build always starts from NULL. */
    void (*plan_recycle)(kva_plan *plan);
};

/* The N-way LSE merge of kva_merge_states_n on host memory (src/attn/cpu/
 * cpu_merge.c), on ctx's threads, over parts whose token rows are strided:
 * head h of token t of part p is the row at outs + p * out_stride + t *
 * out_tok + h * Dv and its lse lses[p * lse_stride + t * lse_tok + h]
 * (elements); out [T, H, Dv] and lse_out [T, H] (or NULL) are contiguous.
 * Exported for kvattn_mpi, whose combine merges the ranks' partials in place
 * in their [T, all heads, Dv] layout. */
KVA_API void kva__cpu_merge_rows(const kva_context *ctx, int32_t num_parts, int32_t num_tokens,
                                 int32_t num_heads, int32_t head_dim_v, kva_dtype dtype,
                                 const void *outs, int64_t out_stride, int64_t out_tok,
                                 const float *lses, int64_t lse_stride, int64_t lse_tok, void *out,
                                 float *lse_out);

extern const kva__backend_ops kva__ref_ops;  /* src/attn/ref/ */
extern const kva__backend_ops kva__cpu_ops;  /* src/attn/cpu/ */
extern const kva__backend_ops kva__cuda_ops; /* src/attn/cuda/ (no_cuda.c: "unavailable") */

/* The table of backend b (< KVA_BACKEND_COUNT_): kva__backends in context.c. */
const kva__backend_ops *kva__backend(kva_backend b);
/* Devices backend b sees (0 for host backends and for unavailable ones). */
int kva__backend_device_count(kva_backend b);

/* Checks a per-token row stride (kva_cache_write / kva_cache_read's token
 * strides, the sparse runs' indices_stride; fn the public call, name the
 * argument) in elements of elem bytes, resolving 0 to row_elems: at least a
 * row, and the last of num_tokens rows within PTRDIFF_MAX bytes
 * (src/cache/cache_write.c). */
kva_status kva__resolve_token_stride(const char *fn, const char *name, int64_t stride,
                                     int64_t row_elems, int32_t num_tokens, size_t elem,
                                     int64_t *out);

/* The aliasing rule of kvattn.h, by address ranges (src/core/aliasing.c).
 * A span is one tensor argument: its name, address and bytes (an absent
 * argument has p NULL or bytes 0); rows > 1 makes it rows rows of `bytes`
 * bytes, stride bytes apart (0 or 1: one contiguous range). */
typedef struct kva__span {
    const char *name;
    const void *p;
    size_t bytes;
    int64_t rows;
    int64_t stride;
} kva__span;
/* 1 if [a, a + na) and [b, b + nb) overlap (empty ranges never do). */
int kva__overlaps(const void *a, size_t na, const void *b, size_t nb);
/* 1 if two spans share a byte (exact row by row for equal strides). */
int kva__spans_overlap(const kva__span *a, const kva__span *b);
/* rows * cols * es, saturated at SIZE_MAX. rows, cols >= 0. */
size_t kva__span_bytes(int64_t rows, int64_t cols, size_t es);
/* KVA_STATUS_OK if no output outs[i] overlaps an input ins[j] or an earlier
 * output; else INVALID_ARGUMENT naming fn and both (absent spans skipped). */
kva_status kva__check_disjoint(const char *fn, const kva__span *outs, int no, const kva__span *ins,
                               int ni);
/* The cache's storage: K, V (NULL where V lives in the K rows: MLA and
 * index-key caches) and the per-token key scales (NULL for other formats). */
void kva__cache_spans(const kva_cache *cache, kva__span spans[3]);

/* kva_cache_read's aliasing check (src/cache/cache_read.c): the rows of k
 * and v (k_row / v_row bytes each, num_tokens rows at byte strides; NULL:
 * absent) must not overlap each other, slot_mapping or the cache's storage. */
kva_status kva__check_read_aliasing(const char *fn, const kva_cache *cache, int32_t num_tokens,
                                    const int64_t *slot_mapping, const void *k, size_t k_row,
                                    int64_t k_stride, const void *v, size_t v_row,
                                    int64_t v_stride);

/* Host memory space pieces (src/cache/), used by kva__host_memory. */
kva_status kva__host_cache_write(kva_context *ctx, kva_cache *cache, int32_t num_tokens,
                                 const void *k, int64_t k_stride, const void *v, int64_t v_stride,
                                 kva_dtype src_dtype, const int64_t *slot_mapping);
kva_status kva__host_copy_blocks(kva_context *ctx, const kva_cache *src, kva_cache *dst,
                                 const int32_t *pairs, int32_t n);

#endif /* KVA_INTERNAL_H */
