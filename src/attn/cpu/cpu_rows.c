/*
 * cpu_rows.c - row conversions and scratch layout of the CPU backend.
 *
 * Loads (kva__cpu_load_row, static inline in cpu_attn.h so that it inlines
 * into the kernels' per-key loops) are branch-free loops over the row that
 * the compiler vectorizes (f16 and bf16 to fp32 are exact). Stores round to nearest
 * even: bf16 in a loop that vectorizes (the DCP merges store every element they
 * read), f16 through the library's scalar converter.
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
    } else { /* kva_f32_to_bf16's rounding, inline: the loop vectorizes */
        uint16_t *restrict d = dst;
        for (int32_t i = 0; i < n; i++) {
            uint32_t u;
            memcpy(&u, src + i, sizeof u);
            d[i] = kva__bf16_bits(u);
        }
    }
}

/* Bytes of n elements of size sz, rounded up to 64. */
static size_t span(size_t n, size_t sz)
{
    return (n * sz + 63u) & ~(size_t)63u;
}

/* Lays out the tiled prefill arrays from base (NULL: only measures); returns the bytes. */
static size_t tile_layout(unsigned char *base, int32_t D, int32_t Dv, kva__cpu_tile *t)
{
    const size_t R = KVA_CPU_TILE_ROWS, K = KVA_CPU_TILE_KEYS;
    const size_t W = (size_t)(D > Dv ? D : Dv);
    size_t off = 0;
#define TILE_ARRAY(field, type, n)                                                                 \
    do {                                                                                           \
        if (base)                                                                                  \
            t->field = (type *)(base + off);                                                       \
        off += span((n), sizeof(type));                                                            \
    } while (0)
    /* 32 floats more per row of qt, st, ot, kb, vb: the kernels' padded
     * row strides (prefill_tiled.inc, pf_ld: at most n + 31). */
    const size_t LR = R + 32;
    TILE_ARRAY(qt, float, (size_t)D *LR);
    TILE_ARRAY(st, float, K *LR);
    TILE_ARRAY(ot, float, (size_t)Dv *LR);
    TILE_ARRAY(kb, float, K *((size_t)D + 32));
    TILE_ARRAY(vb, float, K *((size_t)Dv + 32));
    TILE_ARRAY(mx, float, R);
    TILE_ARRAY(sum, float, R);
    TILE_ARRAY(alpha, float, R);
    TILE_ARRAY(muse, float, R);
    TILE_ARRAY(cmax, float, R);
    TILE_ARRAY(slope, float, R);
    TILE_ARRAY(row, float, W);
    TILE_ARRAY(lo, int32_t, R);
    TILE_ARRAY(hi, int32_t, R);
    TILE_ARRAY(pos, int32_t, R);
    TILE_ARRAY(kp, const float *, K);
    TILE_ARRAY(vp, const float *, K);
    TILE_ARRAY(rows, const unsigned char *, 4 * K);
#undef TILE_ARRAY
    return off;
}

/* Bytes of one decode group member's state (kva__cpu_scratch_member). */
static size_t member_bytes(int32_t D, int32_t Dv)
{
    const size_t R = KVA_CPU_GROUP_ROWS;
    return span(R * (size_t)D, sizeof(float)) + span(R * (size_t)Dv, sizeof(float)) +
           2 * span(R, sizeof(float)) + 2 * span(R, sizeof(int32_t)) + span(R * 3 * (size_t)D, 1) +
           span(R * 2, sizeof(float)) + span(R * 4, sizeof(int32_t));
}

void kva__cpu_scratch_member(const kva__cpu_scratch *s, int32_t i, int32_t D, int32_t Dv,
                             kva__cpu_scratch *member)
{
    const size_t R = KVA_CPU_GROUP_ROWS;
    unsigned char *p = s->group + (size_t)i * member_bytes(D, Dv);
    *member = *s;
    member->q = (float *)p;
    p += span(R * (size_t)D, sizeof(float));
    member->acc = (float *)p;
    p += span(R * (size_t)Dv, sizeof(float));
    member->mx = (float *)p;
    p += span(R, sizeof(float));
    member->sum = (float *)p;
    p += span(R, sizeof(float));
    member->lo = (int32_t *)p;
    p += span(R, sizeof(int32_t));
    member->hi = (int32_t *)p;
    p += span(R, sizeof(int32_t));
    member->qi = (int8_t *)p;
    p += span(R * 3 * (size_t)D, 1);
    member->qk = (float *)p;
    p += span(R * 2, sizeof(float));
    member->qc = (int32_t *)p;
}

void kva__cpu_tile_map(void *area, int32_t D, int32_t Dv, kva__cpu_tile *t)
{
    tile_layout(area, D, Dv, t);
}

size_t kva__cpu_scratch_bytes(int32_t D, int32_t Dv)
{
    const size_t R = KVA_CPU_MAX_ROWS, C = KVA_CPU_KEY_CHUNK;
    return span(R * (size_t)D, sizeof(float)) + span(R * (size_t)Dv, sizeof(float)) +
           2 * span(R, sizeof(float)) + span(C, sizeof(float)) +
           span(C * (size_t)D, sizeof(float)) + span(C * (size_t)Dv, sizeof(float)) +
           2 * span(R, sizeof(int32_t)) + 2 * span(C, sizeof(const float *)) +
           span(R * C, sizeof(float)) + span(R, sizeof(float)) + span(R, sizeof(int32_t)) +
           span(2 * 8 * 16 * 16, sizeof(float)) + span(R * 3 * (size_t)D, 1) +
           span(R * 2, sizeof(float)) + span(R * 4, sizeof(int32_t)) +
           span((size_t)KVA_MAX_HEAD_DIM / 4 * 16, sizeof(int32_t)) +
           tile_layout(NULL, D, Dv, NULL) + KVA_CPU_GROUP_MAX * member_bytes(D, Dv);
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
    p += span(2 * 8 * 16 * 16, sizeof(float));
    s->qi = (int8_t *)p;
    p += span(R * 3 * (size_t)D, 1);
    s->qk = (float *)p;
    p += span(R * 2, sizeof(float));
    s->qc = (int32_t *)p;
    p += span(R * 4, sizeof(int32_t));
    s->kt = (int32_t *)p;
    p += span((size_t)KVA_MAX_HEAD_DIM / 4 * 16, sizeof(int32_t));
    s->tile = p;
    p += tile_layout(NULL, D, Dv, NULL);
    s->group = p;
}
