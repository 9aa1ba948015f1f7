/*
 * cli_quant.h - the static scales and storage dtype `kvattn bench` and
 * `kvattn serve-sim` give a quantized cache of their random data (uniform,
 * |x| < 1.74): scalar int8 scales 1.75/127 (K and V, or V only for per-token
 * keys), fp8 scales 1.75/448, V in the 16-bit dtype for INT8_TOKEN_K_V16. Header-only:
 * the serve-sim test compiles tools/serve_*.c without the rest of the CLI.
 */
#ifndef KVA_CLI_QUANT_H
#define KVA_CLI_QUANT_H

#include "kvattn.h"

#include <string.h>

typedef struct kva_cli_quant {
    float int8_scale, fp8_scale;
    kva_quant_params qp;
} kva_cli_quant;

/* Fills *s for format q and data dtype dtype; returns the params to pass to
 * kva_cache_create_quant (NULL for formats without static scales) and sets
 * *cache_dtype to the cache's storage dtype. s must outlive the call that
 * uses the params. */
static inline const kva_quant_params *kva_cli_quant_setup(kva_quant q, kva_dtype dtype,
                                                          kva_cli_quant *s, kva_dtype *cache_dtype)
{
    s->int8_scale = 1.75f / 127.0f;
    s->fp8_scale = 1.75f / 448.0f;
    memset(&s->qp, 0, sizeof s->qp);
    s->qp.k_scale = s->qp.v_scale = &s->int8_scale;
    s->qp.k_scale_len = s->qp.v_scale_len = 1;
    *cache_dtype = dtype;
    switch (q) {
    case KVA_QUANT_NONE:
        return NULL;
    case KVA_QUANT_INT8_TOKEN_K_V16: /* V in dtype: f16 or bf16 (both commands refuse f32) */
        return NULL;
    case KVA_QUANT_INT8_TOKEN_K:
        s->qp.k_scale = NULL;
        s->qp.k_scale_len = 0;
        *cache_dtype = KVA_DTYPE_I8;
        return &s->qp;
    case KVA_QUANT_FP8_E4M3:
        s->qp.k_scale = s->qp.v_scale = &s->fp8_scale;
        *cache_dtype = KVA_DTYPE_FP8_E4M3;
        return &s->qp;
    default: /* INT8_CHANNEL */
        *cache_dtype = KVA_DTYPE_I8;
        return &s->qp;
    }
}

#endif /* KVA_CLI_QUANT_H */
