/*
 * fuzz_util.h - a reader of fuzzer input bytes for the libFuzzer harnesses
 * in tests/fuzz: integers biased towards the edges of their type (the
 * input picks an edge value or raw bytes), floats from raw bits or edges.
 * Past the end of the input every read returns 0.
 */
#ifndef KVA_FUZZ_UTIL_H
#define KVA_FUZZ_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef struct fz {
    const uint8_t *p;
    size_t n;
} fz;

static inline uint8_t fz_u8(fz *f)
{
    if (f->n == 0)
        return 0;
    f->n--;
    return *f->p++;
}

static inline uint32_t fz_u32(fz *f)
{
    uint32_t x = 0;
    for (int i = 0; i < 4; i++)
        x |= (uint32_t)fz_u8(f) << (8 * i);
    return x;
}

/* int32: one selector byte; < 0x80 picks an edge value (limits of the API
 * and of int32), < 0xc0 a small value (selector - 0x90), else raw bytes. */
static inline int32_t fz_i32(fz *f)
{
    static const int64_t edges[] = {0,
                                    1,
                                    -1,
                                    2,
                                    -2,
                                    7,
                                    8,
                                    9,
                                    16,
                                    64,
                                    128,
                                    255,
                                    256,
                                    257,
                                    264,
                                    4095,
                                    4096,
                                    4097,
                                    65535,
                                    65536,
                                    65537,
                                    (1 << 30) - 1,
                                    1 << 30,
                                    (1 << 30) + 1,
                                    INT32_MAX - 1,
                                    INT32_MAX,
                                    INT32_MIN,
                                    INT32_MIN + 1,
                                    1 << 16,
                                    1 << 20,
                                    46341 /* ceil(sqrt(2^31)) */};
    const uint8_t s = fz_u8(f);
    if (s < 0x80)
        return (int32_t)edges[s % (sizeof edges / sizeof edges[0])];
    if (s < 0xc0)
        return (int32_t)s - 0x90;
    return (int32_t)fz_u32(f);
}

/* int32 in [lo, hi] (small counts the harness must bound). */
static inline int32_t fz_range(fz *f, int32_t lo, int32_t hi)
{
    return lo + (int32_t)(fz_u8(f) % (uint32_t)(hi - lo + 1));
}

/* float: edges (0, +-1, +-inf, NaN, tiny, huge) or raw bits. */
static inline float fz_f32(fz *f)
{
    static const uint32_t edges[] = {0x00000000u, 0x3f800000u, 0xbf800000u, 0x7f800000u,
                                     0xff800000u, 0x7fc00000u, 0x00000001u, 0x7f7fffffu,
                                     0x3e000000u, 0x80000000u};
    const uint8_t s = fz_u8(f);
    uint32_t b = s < 0xa0 ? edges[s % (sizeof edges / sizeof edges[0])] : fz_u32(f);
    float x;
    memcpy(&x, &b, sizeof x);
    return x;
}

#endif /* KVA_FUZZ_UTIL_H */
