/*
 * cpu_rows.c - row conversions and scratch layout of the CPU backend.
 *
 * Loads (kva__cpu_load_row, static inline in cpu_attn.h so that it inlines
 * into the kernels' per-key loops) are branch-free loops over the row that
 * the compiler vectorizes (f16 and bf16 to fp32 are exact). Stores round to nearest
 * even through the library's scalar converters: they run once per output
 * element, far off the hot path.
 */
#include "cpu_attn.h"

#include <stdint.h>
#include <string.h>

void kva__cpu_store_row(void *dst, kva_dtype dt, const float *src, int32_t n)
{
    if (dt == KVA_DTYPE_F32) {
        memcpy(dst, src, (size_t)n * sizeof(float));
    } else if (dt == KVA_DTYPE_F16) {
        uint16_t *d = dst;
        for (int32_t i = 0; i < n; i++)
            d[i] = kva_f32_to_f16(src[i]);
    } else {
        uint16_t *d = dst;
        for (int32_t i = 0; i < n; i++)
            d[i] = kva_f32_to_bf16(src[i]);
    }
}

/* Bytes of n elements of size sz, rounded up to 64. */
static size_t span(size_t n, size_t sz)
{
    return (n * sz + 63u) & ~(size_t)63u;
}

size_t kva__cpu_scratch_bytes(int32_t D, int32_t Dv)
{
    const size_t R = KVA_CPU_MAX_ROWS, C = KVA_CPU_KEY_CHUNK;
    return span(R * (size_t)D, sizeof(float)) + span(R * (size_t)Dv, sizeof(float)) +
           2 * span(R, sizeof(float)) + span(C, sizeof(float)) +
           span(C * (size_t)D, sizeof(float)) + span(C * (size_t)Dv, sizeof(float)) +
           2 * span(R, sizeof(int32_t)) + 2 * span(C, sizeof(const float *)) +
           span(R * C, sizeof(float)) + span(R, sizeof(float)) + span(R, sizeof(int32_t)) +
           span(8 * 16 * 16, sizeof(float));
}

void kva__cpu_scratch_map(void *area, int32_t D, int32_t Dv, kva__cpu_scratch *s)
{
    const size_t R = KVA_CPU_MAX_ROWS, C = KVA_CPU_KEY_CHUNK;
    unsigned char *p = area;
    s->q = (float *)p;
    p += span(R * (size_t)D, sizeof(float));
    s->acc = (float *)p;
    p += span(R * (size_t)Dv, sizeof(float));
    s->mx = (float *)p;
    p += span(R, sizeof(float));
    s->sum = (float *)p;
    p += span(R, sizeof(float));
    s->p = (float *)p;
    p += span(C, sizeof(float));
    s->kbuf = (float *)p;
    p += span(C * (size_t)D, sizeof(float));
    s->vbuf = (float *)p;
    p += span(C * (size_t)Dv, sizeof(float));
    s->lo = (int32_t *)p;
    p += span(R, sizeof(int32_t));
    s->hi = (int32_t *)p;
    p += span(R, sizeof(int32_t));
    s->kp = (const float **)p;
    p += span(C, sizeof(const float *));
    s->vp = (const float **)p;
    p += span(C, sizeof(const float *));
    s->pm = (float *)p;
    p += span(R * C, sizeof(float));
    s->alpha = (float *)p;
    p += span(R, sizeof(float));
    s->live = (int32_t *)p;
    p += span(R, sizeof(int32_t));
    s->vs = (float *)p;
}
