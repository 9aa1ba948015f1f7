/*
 * kvattn_cache.h - the paged KV cache: layouts, quantized formats, attention
 * kinds, the cache descriptor, and the calls that create, inspect, write,
 * read, copy and swap caches. kvattn.h includes it in the place of its cache
 * section (its plan and attention sections use these types); it may be
 * included on its own.
 */
/* kvattn.h first and outside the guard: included on its own, this header is
 * read in its place inside kvattn.h, after the declarations it uses (status,
 * dtypes, context); the outer copy then finds the guard defined. */
#include "kvattn.h"

#ifndef KVATTN_CACHE_H
#define KVATTN_CACHE_H

#ifdef __cplusplus
extern "C" {
#endif

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
 * checked before anything is copied; a dst that appears twice is an error, so
 * is a block that one pair writes and another reads (a chain or a swap,
 * whose result would depend on the copy order; a pair (b, b) writes nothing
 * and is allowed), and so is a pairs array inside the cache's storage
 * (Aliasing); KVA_STATUS_INVALID_ARGUMENT, nothing copied. */
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

#ifdef __cplusplus
}
#endif

#endif /* KVATTN_CACHE_H */
