/*
 * ds_mla.c - FlashMLA's fp8_ds_mla latent rows (KVA_QUANT_FP8_DS_MLA,
 * include/kvattn.h): quantization of one row on write and its
 * dequantization on read.
 *
 * A row for D = Dc + Dr is Dc e4m3 codes of c_kv, then Dc / 128 float32
 * scales (one per tile of 128 codes), then Dr bf16 values of k_pe: 656
 * bytes for DeepSeek's Dc 512, Dr 64. The writer's scale is vLLM's
 * concat_and_cache_ds_mla one, s = max(amax(tile) / 448, FLT_MIN); readers
 * take whatever positive float32 scale the row holds.
 */
#include "internal.h"

#include <float.h>
#include <math.h>
#include <string.h>

void kva__ds_mla_quantize_row(uint8_t *dst, const float *ckv, const float *kpe, int64_t Dc,
                              int64_t Dr)
{
    uint8_t *scales = dst + Dc;
    uint8_t *pe = scales + 4 * (Dc / KVA__DS_MLA_TILE);
    for (int64_t t0 = 0; t0 < Dc; t0 += KVA__DS_MLA_TILE) {
        float amax = 0.0f;
        for (int64_t i = t0; i < t0 + KVA__DS_MLA_TILE; i++) {
            const float a = fabsf(ckv[i]);
            amax = a > amax ? a : amax; /* a NaN never wins: its code stays NaN */
        }
        float s = amax / 448.0f;
        s = s > FLT_MIN ? s : FLT_MIN;
        memcpy(scales + 4 * (t0 / KVA__DS_MLA_TILE), &s, sizeof s);
        for (int64_t i = t0; i < t0 + KVA__DS_MLA_TILE; i++)
            dst[i] = kva_f32_to_fp8_e4m3(ckv[i] / s);
    }
    for (int64_t i = 0; i < Dr; i++) {
        const uint16_t h = kva_f32_to_bf16(kpe[i]);
        memcpy(pe + 2 * i, &h, sizeof h);
    }
}

void kva__ds_mla_dequantize_row(const uint8_t *row, float *ckv, float *kpe, int64_t Dc, int64_t Dr)
{
    const uint8_t *scales = row + Dc;
    const uint8_t *pe = scales + 4 * (Dc / KVA__DS_MLA_TILE);
    if (ckv)
        for (int64_t t0 = 0; t0 < Dc; t0 += KVA__DS_MLA_TILE) {
            float s;
            memcpy(&s, scales + 4 * (t0 / KVA__DS_MLA_TILE), sizeof s);
            for (int64_t i = t0; i < t0 + KVA__DS_MLA_TILE; i++)
                ckv[i] = kva_fp8_e4m3_to_f32(row[i]) * s;
        }
    if (kpe)
        for (int64_t i = 0; i < Dr; i++) {
            uint16_t h;
            memcpy(&h, pe + 2 * i, sizeof h);
            kpe[i] = kva_bf16_to_f32(h);
        }
}
