/*
 * cpu_dequant.c - portable chunk converter for quantized caches
 * (kva__cpu_dequant_rows, contract in cpu_dequant.h), and the dispatch to the
 * AVX2 converter when the CPU has it.
 *
 * The C8 form x = q * s - (o * s) is one FMA per element in the AVX2 path;
 * the portable loop computes the same expression with a separate multiply and
 * subtract. Both differ from the exact (q - o) * s by at most a few ulp of
 * o * s, far below the quantization step s (tests compare with the fp64
 * reference at float tolerance).
 */
#include "cpu_attn.h"
#include "cpu_dequant.h"
#include "cpu_fold.h"

int kva__cpu_dequant_simd(const kva__cpu_features *f)
{
#if KVA_X86_SIMD
    return kva__cpu_isa_of(f) >= KVA__ISA_AVX2;
#else
    (void)f;
    return 0;
#endif
}

void kva__cpu_dequant_rows(int32_t n, int32_t width, kva_dtype dt, const unsigned char *const *rows,
                           const float *const *token_scale, const float *scale, const float *offset,
                           int simd, float *dst)
{
    if (dt == KVA_DTYPE_F32 || dt == KVA_DTYPE_F16 || dt == KVA_DTYPE_BF16) {
        for (int32_t t = 0; t < n; t++)
            kva__cpu_load_row(dst + (size_t)t * width, rows[t], dt, width);
        return;
    }
    /* os = offset * scale, once per chunk (width <= KVA_MAX_HEAD_DIM). */
    float os_buf[KVA_MAX_HEAD_DIM];
    const float *os = NULL;
    if (dt == KVA_DTYPE_I8 && !token_scale && offset) {
        for (int32_t c = 0; c < width; c++)
            os_buf[c] = offset[c] * scale[c];
        os = os_buf;
    }
#if KVA_X86_SIMD
    if (simd) {
        kva__cpu_dequant_rows_avx2(n, width, dt, rows, token_scale, scale, os, dst);
        return;
    }
#else
    (void)simd;
#endif
    for (int32_t t = 0; t < n; t++) {
        float *restrict d = dst + (size_t)t * width;
        if (dt == KVA_DTYPE_I8) {
            const int8_t *restrict q = (const int8_t *)rows[t];
            if (token_scale) {
                const float s = token_scale[t][0];
                for (int32_t c = 0; c < width; c++)
                    d[c] = (float)q[c] * s;
            } else if (os) {
                for (int32_t c = 0; c < width; c++)
                    d[c] = (float)q[c] * scale[c] - os[c];
            } else {
                for (int32_t c = 0; c < width; c++)
                    d[c] = (float)q[c] * scale[c];
            }
        } else { /* FP8_E4M3 */
            const uint8_t *restrict q = rows[t];
            for (int32_t c = 0; c < width; c++)
                d[c] = kva__cpu_fp8_to_f32(q[c]) * scale[c];
        }
    }
}

void kva__cpu_dequant_chunk(const kva__cpu_run *run, int32_t kvh, int32_t n,
                            const unsigned char *const *krows, const float *const *kscales,
                            const unsigned char *const *vrows, float *kdst, float *vdst)
{
    const kva_cache *c = run->cache;
    const int32_t D = c->desc.head_dim, Dv = c->desc.head_dim_v;
    const int token_k = c->k_token_scale != NULL;
    const int v16 = c->desc.quant == KVA_QUANT_INT8_TOKEN_K_V16;
    kva__cpu_dequant_rows(n, D, c->k_dtype, krows, token_k ? kscales : NULL,
                          token_k ? NULL : c->k_scale + (size_t)kvh * D,
                          token_k ? NULL : c->k_offset + (size_t)kvh * D, run->dequant_simd, kdst);
    kva__cpu_dequant_rows(n, Dv, c->desc.dtype, vrows, NULL,
                          v16 ? NULL : c->v_scale + (size_t)kvh * Dv,
                          v16 ? NULL : c->v_offset + (size_t)kvh * Dv, run->dequant_simd, vdst);
}

/* ---- static-scale folding of the in-register decode kernels (cpu_fold.h) ---- */

static int float_fmt(kva_dtype dt)
{
    return dt == KVA_DTYPE_BF16 ? FMT_BF16 : dt == KVA_DTYPE_F16 ? FMT_F16 : FMT_F32;
}

static int all_zero(const float *x, int32_t n)
{
    for (int32_t i = 0; i < n; i++)
        if (x[i] != 0.0f)
            return 0;
    return 1;
}

void kva__cpu_fold_begin(const kva__cpu_run *run, const kva__work_item *it, float *q, int32_t M,
                         kva__cpu_fold *f)
{
    const int32_t D = run->plan->d.head_dim, Dv = run->plan->d.head_dim_v;
    f->koff = f->voff = NULL;
    if (!run->quant) {
        f->kf = f->vf = float_fmt(run->kv_dt);
        return;
    }
    const kva_cache *c = run->cache;
    const int32_t kvh = it->kv_head;
    const int fp8 = c->desc.dtype == KVA_DTYPE_FP8_E4M3;
    f->kf = c->k_token_scale ? FMT_I8T : fp8 ? FMT_FP8 : FMT_I8;
    f->vf = c->desc.quant == KVA_QUANT_INT8_TOKEN_K_V16 ? float_fmt(c->desc.dtype)
            : fp8                                       ? FMT_FP8
                                                        : FMT_I8;
    f->koff = c->k_offset + (size_t)kvh * D;
    f->voff = c->v_offset + (size_t)kvh * Dv;
    /* Symmetric int8 (every offset of the head 0, e.g. no offsets given):
     * no subtraction. Pairs with only one side symmetric keep FMT_I8 on both
     * (subtracting zeros is exact). */
    const int kz = f->kf != FMT_I8 || all_zero(f->koff, D);
    const int vz = f->vf == FMT_I8 && all_zero(f->voff, Dv);
    if (vz && kz) {
        f->vf = FMT_I8S;
        f->kf = f->kf == FMT_I8 ? FMT_I8S : f->kf;
    }
    if (f->kf != FMT_I8T) {
        const float *ks = c->k_scale + (size_t)kvh * D;
        const float s = fp8 ? 256.0f : 1.0f;
        for (int32_t m = 0; m < M; m++)
            for (int32_t x = 0; x < D; x++)
                q[(size_t)m * D + x] *= ks[x] * s;
    }
}

void kva__cpu_fold_end(const kva__cpu_run *run, const kva__work_item *it, float *acc, int32_t M,
                       int vf)
{
    if (vf < FMT_I8)
        return;
    const int32_t Dv = run->plan->d.head_dim_v;
    const float *vs = run->cache->v_scale + (size_t)it->kv_head * Dv;
    const float s = vf >= FMT_FP8 ? 256.0f : 1.0f;
    for (int32_t m = 0; m < M; m++)
        for (int32_t x = 0; x < Dv; x++)
            acc[(size_t)m * Dv + x] *= vs[x] * s;
}
