/*
 * kvattn_c8.h - the C8 checkpoint loader: static int8 KV-cache scales and offsets
 * read from a model checkpoint (docs/quant.md).
 * Included by kvattn.h; may be included on its own.
 */
#ifndef KVATTN_C8_H
#define KVATTN_C8_H

#include "kvattn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Checkpoint scales (C8)                                                    */
/* ------------------------------------------------------------------------ */

/*
 * The C8 scales of one layer, as a checkpoint ships them, sharded to one
 * tensor-parallel rank. params points into the arrays of this struct (valid
 * until kva_c8_scales_free) and can be passed to kva_cache_create_quant with
 * desc.quant = KVA_QUANT_INT8_CHANNEL.
 */
typedef struct kva_c8_scales {
    int32_t num_kv_heads; /* kv heads of this rank */
    int32_t head_dim;     /* channels per kv head */
    kva_quant_params params;
    float *data; /* owned storage behind params */
} kva_c8_scales;

/*
 * Reads layer `layer`'s k/v cache scales and offsets from the checkpoint in
 * checkpoint_dir: quant_model_description.json must say "kv_cache_type": "C8";
 * tensors are looked up through model.safetensors.index.json when present,
 * else in every *.safetensors file of the directory. Accepted names (first
 * match wins, {i} = layer):
 *   model.layers.{i}.self_attn.{k,v}_cache_{scale,offset}
 *   model.layers.{i}.self_attn.attn.{k,v}_cache_{scale,offset}
 *   model.layers.{i}.self_attn.{k,v}_proj.kv_cache_{scale,offset}
 * Scales are required, offsets optional (0). Each tensor is a scalar ([] or
 * [1]) or [num_kv_heads_total * head_dim] (also accepted as [Hkv_total, D]) in
 * F32, F16 or BF16. Sharding: with tp_size <= Hkv_total (tp_size dividing it),
 * rank r gets kv heads [r*Hkv_total/tp_size, (r+1)*Hkv_total/tp_size); with
 * tp_size > Hkv_total (Hkv_total dividing tp_size) each rank gets the one head
 * r / (tp_size / Hkv_total), as vLLM replicates kv heads. Errors: IO_ERROR for
 * a missing or unreadable file, malformed JSON or safetensors header,
 * truncated data or a missing tensor; DTYPE_MISMATCH / SHAPE_MISMATCH for a
 * tensor of the wrong dtype or shape; INVALID_ARGUMENT for bad arguments or a
 * value kva_cache_create_quant would refuse (a NaN, infinite, zero or negative
 * scale, a NaN or infinite offset, anywhere in the tensor, not only in this
 * rank's heads; the message names the tensor and the element's index);
 * UNSUPPORTED in a build without cJSON (CMake KVA_WITH_CJSON=OFF).
 */
KVA_API kva_status kva_c8_scales_load(const char *checkpoint_dir, int32_t layer,
                                      int32_t num_kv_heads_total, int32_t head_dim, int32_t tp_rank,
                                      int32_t tp_size, kva_c8_scales **out);
KVA_API void kva_c8_scales_free(kva_c8_scales *scales); /* NULL is a no-op */

#ifdef __cplusplus
}
#endif

#endif /* KVATTN_C8_H */
