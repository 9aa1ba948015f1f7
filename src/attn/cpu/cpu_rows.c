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

/* Each *_layout below lays its arrays out in order from base, pointing the
 * fields of obj at them, or with base NULL only adds up their bytes (so the
 * size and the map cannot disagree); it returns the bytes. Every array
 * starts on a 64-byte boundary. */
#define ARRAY(obj, field, type, n)                                                                 \
    do {                                                                                           \
        if (base)                                                                                  \
            (obj)->field = (type *)(base + off);                                                   \
        off += span((n), sizeof(type));                                                            \
    } while (0)

/* The tiled prefill kernels' arrays (kva__cpu_tile). */
static size_t tile_layout(unsigned char *base, int32_t D, int32_t Dv, kva__cpu_tile *t)
{
    const size_t R = KVA_CPU_TILE_ROWS, K = KVA_CPU_TILE_KEYS;
    const size_t W = (size_t)(D > Dv ? D : Dv);
    size_t off = 0;
    /* 32 floats more per row of qt, st, ot, kb, vb: the kernels' padded
     * row strides (prefill_tiled.inc, pf_ld: at most n + 31). */
    const size_t LR = R + 32;
    ARRAY(t, qt, float, (size_t)D *LR);
    ARRAY(t, st, float, K *LR);
    ARRAY(t, ot, float, (size_t)Dv *LR);
    ARRAY(t, kb, float, K *((size_t)D + 32));
    ARRAY(t, vb, float, K *((size_t)Dv + 32));
    ARRAY(t, mx, float, R);
    ARRAY(t, sum, float, R);
    ARRAY(t, alpha, float, R);
    ARRAY(t, muse, float, R);
    ARRAY(t, cmax, float, R);
    ARRAY(t, slope, float, R);
    ARRAY(t, row, float, W);
    ARRAY(t, lo, int32_t, R);
    ARRAY(t, hi, int32_t, R);
    ARRAY(t, pos, int32_t, R);
    ARRAY(t, kp, const float *, K);
    ARRAY(t, vp, const float *, K);
    ARRAY(t, rows, const unsigned char *, 4 * K);
    return off;
}

/* One decode group member's state (kva__cpu_scratch_member): the arrays a
 * member does not share with the others, for GROUP_ROWS rows. */
static size_t member_layout(unsigned char *base, int32_t D, int32_t Dv, kva__cpu_scratch *m)
{
    const size_t R = KVA_CPU_GROUP_ROWS;
    size_t off = 0;
    ARRAY(m, q, float, R *(size_t)D);
    ARRAY(m, acc, float, R *(size_t)Dv);
    ARRAY(m, mx, float, R);
    ARRAY(m, sum, float, R);
    ARRAY(m, lo, int32_t, R);
    ARRAY(m, hi, int32_t, R);
    ARRAY(m, qi, int8_t, R * 3 * (size_t)D);
    ARRAY(m, qk, float, R * 2);
    ARRAY(m, qc, int32_t, R * 4);
    return off;
}

/* A thread's scratch (kva__cpu_scratch), the tile area and the group
 * members' states last. */
static size_t scratch_layout(unsigned char *base, int32_t D, int32_t Dv, kva__cpu_scratch *s)
{
    const size_t R = KVA_CPU_MAX_ROWS, C = KVA_CPU_KEY_CHUNK;
    size_t off = 0;
    ARRAY(s, q, float, R *(size_t)D);
    ARRAY(s, acc, float, R *(size_t)Dv);
    ARRAY(s, mx, float, R);
    ARRAY(s, sum, float, R);
    ARRAY(s, p, float, C);
    ARRAY(s, kbuf, float, C *(size_t)D);
    ARRAY(s, vbuf, float, C *(size_t)Dv);
    ARRAY(s, lo, int32_t, R);
    ARRAY(s, hi, int32_t, R);
    ARRAY(s, kp, const float *, C);
    ARRAY(s, vp, const float *, C);
    ARRAY(s, pm, float, R *C);
    ARRAY(s, alpha, float, R);
    ARRAY(s, live, int32_t, R);
    ARRAY(s, vs, float, 2 * 8 * 16 * 16);
    ARRAY(s, qi, int8_t, R * 3 * (size_t)D);
    ARRAY(s, qk, float, R * 2);
    ARRAY(s, qc, int32_t, R * 4);
    ARRAY(s, kt, int32_t, (size_t)KVA_MAX_HEAD_DIM / 4 * 16);
    if (base)
        s->tile = base + off;
    off += tile_layout(NULL, D, Dv, NULL);
    if (base)
        s->group = base + off;
    return off + KVA_CPU_GROUP_MAX * member_layout(NULL, D, Dv, NULL);
}
#undef ARRAY

void kva__cpu_scratch_member(const kva__cpu_scratch *s, int32_t i, int32_t D, int32_t Dv,
                             kva__cpu_scratch *member)
{
    *member = *s;
    member_layout(s->group + (size_t)i * member_layout(NULL, D, Dv, NULL), D, Dv, member);
}

void kva__cpu_tile_map(void *area, int32_t D, int32_t Dv, kva__cpu_tile *t)
{
    tile_layout(area, D, Dv, t);
}

size_t kva__cpu_scratch_bytes(int32_t D, int32_t Dv)
{
    return scratch_layout(NULL, D, Dv, NULL);
}

void kva__cpu_scratch_map(void *area, int32_t D, int32_t Dv, kva__cpu_scratch *s)
{
    scratch_layout(area, D, Dv, s);
}
