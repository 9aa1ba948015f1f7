/*
 * quant.c - quantized cache formats: validation and expansion of the static
 * scales, quantization of one token on write, and the exact (fp64)
 * dequantization the reference backend reads with.
 *
 * Formats (include/kvattn.h, docs/quant.md):
 *   INT8_CHANNEL      K, V: q = clamp(rne(x / s + o), -128, 127), x = (q - o) * s,
 *                     s and o per (kv head, channel).
 *   INT8_TOKEN_K      K: s_t = max|k| / 127 per (token, kv head), q = rne(k / s_t),
 *                     x = q * s_t; V as INT8_CHANNEL.
 *   INT8_TOKEN_K_V16  K as INT8_TOKEN_K, V stored in f16/bf16.
 *   FP8_E4M3          q = fp8_e4m3(x / s) (round to nearest even, saturating),
 *                     x = q * s, s per tensor or per kv head.
 * The arithmetic of the write is float32: x / s and + o each round to float,
 * then rne. Static scales are expanded at creation to one value per (kv head,
 * channel), so every kernel indexes them the same way whatever granularity
 * the caller gave.
 */
#include "internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

const char *kva_quant_name(kva_quant quant)
{
    static const char *const names[KVA_QUANT_COUNT_] = {
        "none",     "int8_channel", "int8_token_k", "int8_token_k_v16",
        "fp8_e4m3", "fp8_ds_mla",   "fp8_token"};
    if ((unsigned)quant >= (unsigned)KVA_QUANT_COUNT_)
        return "invalid";
    return names[quant];
}

int kva__quant_is_int8(kva_quant q, int is_v)
{
    if (q == KVA_QUANT_INT8_CHANNEL || q == KVA_QUANT_INT8_TOKEN_K)
        return 1;
    return q == KVA_QUANT_INT8_TOKEN_K_V16 && !is_v;
}

/* One static array of kva_quant_params. */
typedef struct param_array {
    const char *name; /* "params->k_scale", ... */
    const float *p;
    int64_t len;
    int is_scale; /* scales must be > 0; offsets only finite */
} param_array;

/* Checks one array against the lengths the format accepts (1, Hkv, and
 * Hkv*dim when per_channel) and its values; absent (NULL, 0) passes when the
 * array is optional. */
static kva_status check_array(const char *fn, const param_array *a, int required, int allowed,
                              int64_t hkv, int64_t dim, int per_channel, kva_quant q)
{
    if (a->p == NULL && a->len == 0) {
        if (required)
            return kva__fail(KVA_STATUS_NULL_POINTER,
                             "%s: %s is NULL but quant %s requires it (length 1, %lld or %lld)", fn,
                             a->name, kva_quant_name(q), (long long)hkv, (long long)(hkv * dim));
        return KVA_STATUS_OK;
    }
    if (!allowed)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "%s: %s is given (length %lld) but quant %s has no such array", fn,
                         a->name, (long long)a->len, kva_quant_name(q));
    if (a->p == NULL)
        return kva__fail(KVA_STATUS_NULL_POINTER, "%s: %s is NULL with length %lld", fn, a->name,
                         (long long)a->len);
    if (a->len != 1 && a->len != hkv && !(per_channel && a->len == hkv * dim)) {
        if (per_channel)
            return kva__fail(KVA_STATUS_SHAPE_MISMATCH,
                             "%s: %s has length %lld; quant %s takes 1, Hkv = %lld or Hkv * "
                             "dim = %lld",
                             fn, a->name, (long long)a->len, kva_quant_name(q), (long long)hkv,
                             (long long)(hkv * dim));
        return kva__fail(KVA_STATUS_SHAPE_MISMATCH,
                         "%s: %s has length %lld; quant %s takes 1 or Hkv = %lld", fn, a->name,
                         (long long)a->len, kva_quant_name(q), (long long)hkv);
    }
    for (int64_t i = 0; i < a->len; i++) {
        const float x = a->p[i];
        if (!isfinite(x) || (a->is_scale && !(x > 0.0f)))
            return kva__fail(KVA_STATUS_INVALID_ARGUMENT, "%s: %s[%lld] = %g must be %s", fn,
                             a->name, (long long)i, (double)x,
                             a->is_scale ? "finite and > 0" : "finite");
    }
    return KVA_STATUS_OK;
}

/* Expands array a (validated, or absent: fill) to [hkv, dim] at dst. */
static void expand(float *dst, const param_array *a, int64_t hkv, int64_t dim, float fill)
{
    for (int64_t h = 0; h < hkv; h++)
        for (int64_t c = 0; c < dim; c++) {
            float x = fill;
            if (a->p && a->len == 1)
                x = a->p[0];
            else if (a->p && a->len == hkv)
                x = a->p[h];
            else if (a->p)
                x = a->p[h * dim + c];
            dst[h * dim + c] = x;
        }
}

kva_status kva__quant_params_expand(const char *fn, const kva_cache_desc *d,
                                    const kva_quant_params *params, float **out)
{
    *out = NULL;
    const kva_quant q = d->quant;
    if (q == KVA_QUANT_NONE) {
        if (params)
            return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                             "%s: params is given but desc->quant is none (unquantized caches "
                             "have no scales)",
                             fn);
        return KVA_STATUS_OK;
    }
    /* fp8_ds_mla carries its scales in the rows: no static arrays. */
    if (q == KVA_QUANT_FP8_DS_MLA) {
        if (params &&
            (params->k_scale || params->k_scale_len || params->k_offset || params->k_offset_len ||
             params->v_scale || params->v_scale_len || params->v_offset || params->v_offset_len))
            return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                             "%s: params has static scales but quant fp8_ds_mla keeps one scale "
                             "per 128 c_kv values inside each row (pass NULL)",
                             fn);
        return KVA_STATUS_OK;
    }
    kva_quant_params none;
    memset(&none, 0, sizeof none);
    const kva_quant_params *p = params ? params : &none;
    const param_array arr[4] = {
        {"params->k_scale", p->k_scale, p->k_scale_len, 1},
        {"params->k_offset", p->k_offset, p->k_offset_len, 0},
        {"params->v_scale", p->v_scale, p->v_scale_len, 1},
        {"params->v_offset", p->v_offset, p->v_offset_len, 0},
    };
    /* Which arrays the format takes: required, allowed; per-channel lengths. */
    int req[4] = {0, 0, 0, 0}, allow[4] = {0, 0, 0, 0}, per_channel = 1;
    switch (q) {
    case KVA_QUANT_INT8_CHANNEL:
        req[0] = req[2] = 1;
        allow[0] = allow[1] = allow[2] = allow[3] = 1;
        break;
    case KVA_QUANT_INT8_TOKEN_K:
        req[2] = 1;
        allow[2] = allow[3] = 1;
        break;
    case KVA_QUANT_FP8_E4M3:
        allow[0] = allow[2] = 1;
        per_channel = 0;
        break;
    default: /* INT8_TOKEN_K_V16: nothing */
        break;
    }
    /* An MLA cache's values are its keys' first Dc columns: one k_scale
     * serves both, so the v arrays are refused and v_scale mirrors k_scale. */
    const int mla = d->kind == KVA_ATTN_MLA;
    if (mla)
        allow[2] = 0;
    const int64_t hkv = d->num_kv_heads, dk = d->head_dim, dv = d->head_dim_v;
    for (int i = 0; i < 4; i++)
        KVA_TRY(check_array(fn, &arr[i], req[i], allow[i], hkv, i < 2 ? dk : dv, per_channel, q));
    /* FP8_TOKEN rows carry their own scales (src/cache/index_cache.c). */
    if (q == KVA_QUANT_FP8_TOKEN)
        return KVA_STATUS_OK;
    const size_t n = (size_t)(2 * hkv * dk + 2 * hkv * dv);
    float *buf = malloc(n * sizeof(float));
    if (!buf)
        return kva__fail(KVA_STATUS_OUT_OF_MEMORY, "%s: cannot allocate %zu bytes of scales", fn,
                         n * sizeof(float));
    float *ks = buf, *ko = ks + hkv * dk, *vs = ko + hkv * dk, *vo = vs + hkv * dv;
    expand(ks, &arr[0], hkv, dk, 1.0f);
    expand(ko, &arr[1], hkv, dk, 0.0f);
    expand(vs, mla ? &arr[0] : &arr[2], hkv, dv, 1.0f);
    expand(vo, &arr[3], hkv, dv, 0.0f);
    *out = buf;
    return KVA_STATUS_OK;
}

/* ---- write ---- */

/* Loads n elements of a float-typed row as float (the dtype test hoisted out
 * of the loop). */
static void load_row(float *restrict dst, const char *restrict src, kva_dtype dt, int64_t n)
{
    if (dt == KVA_DTYPE_F32) {
        memcpy(dst, src, (size_t)n * sizeof(float));
    } else if (dt == KVA_DTYPE_F16) {
        for (int64_t i = 0; i < n; i++)
            dst[i] = kva_f16_to_f32(((const uint16_t *)src)[i]);
    } else {
        /* bf16 -> f32 is a shift of the bits (exact). */
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, src + 2 * i, sizeof h);
            const uint32_t u = (uint32_t)h << 16;
            memcpy(&dst[i], &u, sizeof u);
        }
    }
}

/* Checks n values of one row for NaN (and infinities when no_inf), one head
 * (<= KVA_MAX_HEAD_DIM values) at a time; returns the first bad index or -1. */
static int64_t first_bad(const char *row, kva_dtype dt, int64_t n, int64_t dim, int no_inf)
{
    float x[KVA_MAX_HEAD_DIM];
    const size_t es = kva_dtype_size(dt);
    for (int64_t h0 = 0; h0 < n; h0 += dim) {
        load_row(x, row + (size_t)h0 * es, dt, dim);
        int bad = 0;
        for (int64_t c = 0; c < dim; c++) /* branch-free scan: vectorizes */
            bad |= (x[c] != x[c]) | (no_inf & (fabsf(x[c]) == INFINITY));
        if (!bad)
            continue;
        for (int64_t c = 0; c < dim; c++)
            if (x[c] != x[c] || (no_inf && isinf(x[c])))
                return h0 + c;
    }
    return -1;
}

kva_status kva__quant_check_rows(const kva_cache *c, int32_t num_tokens, const char *k,
                                 int64_t k_stride_bytes, const char *v, int64_t v_stride_bytes,
                                 kva_dtype src_dt, const int64_t *slots)
{
    const kva_cache_desc *d = &c->desc;
    const int k_int8 = kva__quant_is_int8(d->quant, 0), v_int8 = kva__quant_is_int8(d->quant, 1);
    const int k_token =
        d->quant == KVA_QUANT_INT8_TOKEN_K || d->quant == KVA_QUANT_INT8_TOKEN_K_V16;
    const int64_t hkv = d->num_kv_heads;
    for (int32_t t = 0; t < num_tokens; t++) {
        if (slots[t] < 0)
            continue;
        for (int is_v = 0; is_v < 2; is_v++) {
            if (!(is_v ? v_int8 : k_int8))
                continue;
            const int64_t dim = is_v ? d->head_dim_v : d->head_dim;
            const char *row = is_v ? v + t * v_stride_bytes : k + t * k_stride_bytes;
            const int no_inf = !is_v && k_token;
            int64_t bad = first_bad(row, src_dt, hkv * dim, dim, no_inf);
            if (bad >= 0) {
                const float x = kva__load_f(row, src_dt, (size_t)bad);
                return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                                 "kva_cache_write: %s[token %d, head %lld, channel %lld] = %g: "
                                 "quant %s cannot store %s; nothing was written",
                                 is_v ? "v" : "k", (int)t, (long long)(bad / dim),
                                 (long long)(bad % dim), (double)x, kva_quant_name(d->quant),
                                 no_inf ? "NaN or infinite keys (per-token scale)" : "NaN");
            }
        }
    }
    return KVA_STATUS_OK;
}

/* rne(y) clamped to int8; y is not NaN (checked before the write). Clamping
 * first gives the same code as rounding first (127.5 would round to 128 and
 * clamp back to 127), and keeps |y| <= 128, where adding and subtracting
 * 1.5 * 2^23 rounds to an integer with the FPU's round-to-nearest-even: a
 * branch-free form the compiler vectorizes (nearbyintf is a call on SSE2). */
static inline int8_t to_i8(float y)
{
    y = y < -128.0f ? -128.0f : y;
    y = y > 127.0f ? 127.0f : y;
    y = (y + 12582912.0f) - 12582912.0f;
    return (int8_t)(int)y;
}

void kva__quant_write_token(const kva_cache *c, int is_v, int64_t block, int64_t off,
                            const char *src, kva_dtype src_dt)
{
    const kva_cache_desc *d = &c->desc;
    const int64_t dim = is_v ? d->head_dim_v : d->head_dim;
    const size_t elem = is_v ? c->v_elem : c->elem_size;
    char *base = is_v ? c->v : c->k;
    const int token_k = !is_v && c->k_token_scale != NULL;
    const int int8 = kva__quant_is_int8(d->quant, is_v);
    const size_t src_elem = kva_dtype_size(src_dt);
    float x[KVA_MAX_HEAD_DIM];
    for (int64_t h = 0; h < d->num_kv_heads; h++) {
        unsigned char *dst =
            (unsigned char *)base + kva__cache_row(d, block, off, h, dim) * (int64_t)elem;
        load_row(x, src + (size_t)(h * dim) * src_elem, src_dt, dim);
        const float *restrict scale = (is_v ? c->v_scale : c->k_scale) + h * dim;
        const float *restrict offset = (is_v ? c->v_offset : c->k_offset) + h * dim;
        int8_t *restrict q8 = (int8_t *)dst;
        if (token_k) {
            /* Symmetric per-token scale: max|k| / 127 over the head's row. */
            float amax = 0.0f;
            for (int64_t ch = 0; ch < dim; ch++) {
                const float a = fabsf(x[ch]);
                amax = a > amax ? a : amax;
            }
            const float s = amax / 127.0f;
            c->k_token_scale[kva__token_scale_index(d, block, off, h)] = s;
            /* s == 0: an all-zero row (or one below 127 * 2^-149) stores 0. */
            if (s > 0.0f)
                for (int64_t ch = 0; ch < dim; ch++)
                    q8[ch] = to_i8(x[ch] / s);
            else
                memset(q8, 0, (size_t)dim);
        } else if (int8) {
            for (int64_t ch = 0; ch < dim; ch++)
                q8[ch] = to_i8(x[ch] / scale[ch] + offset[ch]);
        } else if (d->quant == KVA_QUANT_FP8_E4M3) {
            for (int64_t ch = 0; ch < dim; ch++)
                dst[ch] = kva_f32_to_fp8_e4m3(x[ch] / scale[ch]);
        } else { /* 16-bit V of INT8_TOKEN_K_V16 */
            for (int64_t ch = 0; ch < dim; ch++)
                kva__store_f(dst, d->dtype, (size_t)ch, x[ch]);
        }
    }
}

/* ---- read (reference) ---- */

double kva__quant_load(const kva_cache *c, int is_v, int64_t block, int64_t off, int64_t head,
                       int64_t ch)
{
    const kva_cache_desc *d = &c->desc;
    if (d->kind == KVA_ATTN_MLA)
        is_v = 0; /* V channel ch of a latent row is its K channel ch, same scale */
    const int64_t dim = is_v ? d->head_dim_v : d->head_dim;
    const int64_t e = kva__cache_row(d, block, off, head, dim) + ch;
    const size_t s0 = (size_t)(head * dim + ch);
    if (!is_v && c->k_token_scale) {
        const double s = c->k_token_scale[kva__token_scale_index(d, block, off, head)];
        return (double)((const int8_t *)c->k)[e] * s;
    }
    const float *scale = is_v ? c->v_scale : c->k_scale;
    const float *offset = is_v ? c->v_offset : c->k_offset;
    if (kva__quant_is_int8(d->quant, is_v))
        return ((double)((const int8_t *)(is_v ? c->v : c->k))[e] - (double)offset[s0]) *
               (double)scale[s0];
    if (d->quant == KVA_QUANT_FP8_E4M3)
        return (double)kva_fp8_e4m3_to_f32(((const uint8_t *)(is_v ? c->v : c->k))[e]) *
               (double)scale[s0];
    return (double)kva__load_f(c->v, d->dtype, (size_t)e); /* 16-bit V */
}

void kva__quant_load_row(const kva_cache *c, int is_v, int64_t block, int64_t off, int64_t head,
                         int64_t n, double *out)
{
    const kva_cache_desc *d = &c->desc;
    if (d->kind == KVA_ATTN_MLA)
        is_v = 0; /* as kva__quant_load */
    const int64_t dim = is_v ? d->head_dim_v : d->head_dim;
    const int64_t e = kva__cache_row(d, block, off, head, dim);
    const size_t s0 = (size_t)(head * dim);
    if (!is_v && c->k_token_scale) {
        const double s = c->k_token_scale[kva__token_scale_index(d, block, off, head)];
        const int8_t *k = (const int8_t *)c->k + e;
        for (int64_t ch = 0; ch < n; ch++)
            out[ch] = (double)k[ch] * s;
        return;
    }
    if (kva__quant_is_int8(d->quant, is_v)) {
        const float *scale = (is_v ? c->v_scale : c->k_scale) + s0;
        const float *offset = (is_v ? c->v_offset : c->k_offset) + s0;
        const int8_t *x = (const int8_t *)(is_v ? c->v : c->k) + e;
        for (int64_t ch = 0; ch < n; ch++)
            out[ch] = ((double)x[ch] - (double)offset[ch]) * (double)scale[ch];
    } else if (d->quant == KVA_QUANT_FP8_E4M3) {
        const float *scale = (is_v ? c->v_scale : c->k_scale) + s0;
        const uint8_t *x = (const uint8_t *)(is_v ? c->v : c->k) + e;
        for (int64_t ch = 0; ch < n; ch++)
            out[ch] = (double)kva_fp8_e4m3_to_f32(x[ch]) * (double)scale[ch];
    } else { /* 16-bit V */
        for (int64_t ch = 0; ch < n; ch++)
            out[ch] = (double)kva__load_f(c->v, d->dtype, (size_t)(e + ch));
    }
}
