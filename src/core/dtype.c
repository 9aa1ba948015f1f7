/* dtype.c - element sizes, names, and f32 <-> f16/bf16/fp8 e4m3 conversions. */
#include "internal.h"

#include <string.h>

size_t kva_dtype_size(kva_dtype dtype)
{
    switch (dtype) {
    case KVA_DTYPE_F32:
        return 4;
    case KVA_DTYPE_F16:
    case KVA_DTYPE_BF16:
        return 2;
    case KVA_DTYPE_I8:
    case KVA_DTYPE_FP8_E4M3:
    case KVA_DTYPE_U8:
        return 1;
    default:
        return 0;
    }
}

const char *kva_dtype_name(kva_dtype dtype)
{
    static const char *const names[KVA_DTYPE_COUNT_] = {"f32", "f16",      "bf16",
                                                        "i8",  "fp8_e4m3", "u8"};
    if ((unsigned)dtype >= (unsigned)KVA_DTYPE_COUNT_)
        return "invalid";
    return names[dtype];
}

int kva__dtype_is_float(kva_dtype dtype)
{
    return dtype == KVA_DTYPE_F32 || dtype == KVA_DTYPE_F16 || dtype == KVA_DTYPE_BF16;
}

int kva__head_dim_ok(int32_t d)
{
    return d >= 8 && d <= KVA_MAX_HEAD_DIM && d % 8 == 0;
}

/* The bits of a float and back through a union (C11 6.5.2.3), not memcpy:
 * the same machine code in an optimized build, and no addressable local,
 * which under AddressSanitizer gave each call of the per-element conversions
 * below a redzoned stack frame (29% of the sanitizer run of
 * test_cpu_prefill: bench/results/vm_2026-11-27_ci19.txt). */
typedef union {
    float f;
    uint32_t u;
} f32_pun;

static uint32_t f32_bits(float x)
{
    const f32_pun v = {.f = x};
    return v.u;
}

static float bits_f32(uint32_t u)
{
    const f32_pun v = {.u = u};
    return v.f;
}

/* IEEE binary32 -> binary16 with round-to-nearest-even, including subnormals. */
uint16_t kva_f32_to_f16(float x)
{
    uint32_t u = f32_bits(x);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t abs = u & 0x7fffffffu;
    if (abs >= 0x7f800000u) /* inf or NaN: keep NaN quiet and non-zero */
        return (uint16_t)(sign | 0x7c00u |
                          (abs > 0x7f800000u ? 0x200u | ((abs >> 13) & 0x3ffu) : 0));
    if (abs >= 0x477ff000u) /* rounds to >= 65520: overflow to inf */
        return (uint16_t)(sign | 0x7c00u);
    if (abs < 0x38800000u) {   /* below 2^-14: subnormal or zero in f16 */
        if (abs < 0x33000000u) /* below half the smallest subnormal (2^-25): zero */
            return sign;
        uint32_t exp = abs >> 23;
        uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126u - exp; /* 14..24 : value = mant * 2^(exp-150) */
        uint32_t half = mant >> shift;
        uint32_t rem = mant & ((1u << shift) - 1u);
        uint32_t halfway = 1u << (shift - 1u);
        if (rem > halfway || (rem == halfway && (half & 1u)))
            half++;
        return (uint16_t)(sign | half);
    }
    /* Normal: rebias exponent (127 -> 15) and round the 13 dropped bits. */
    uint32_t r = abs - 0x38000000u;
    uint32_t rem = r & 0x1fffu;
    uint32_t h = r >> 13;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u)))
        h++; /* may carry into the exponent, which is correct rounding */
    return (uint16_t)(sign | h);
}

float kva_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    if (exp == 0x1fu)
        return bits_f32(sign | 0x7f800000u | (mant << 13));
    if (exp == 0) {
        if (mant == 0)
            return bits_f32(sign);
        /* Subnormal: mant * 2^-24, exact in f32. */
        float v = (float)mant * 5.9604644775390625e-8f;
        return sign ? -v : v;
    }
    return bits_f32(sign | ((exp + 112u) << 23) | (mant << 13));
}

uint16_t kva_f32_to_bf16(float x)
{
    /* NaN: sign kept, a quiet mantissa bit forced; otherwise round to nearest
     * even (overflows correctly to inf). */
    return kva__bf16_bits(f32_bits(x));
}

float kva_bf16_to_f32(uint16_t h)
{
    return bits_f32((uint32_t)h << 16);
}

kva_status kva_convert(const void *src, kva_dtype src_dtype, void *dst, kva_dtype dst_dtype,
                       size_t n)
{
    kva__clear_error();
    if (!kva__dtype_is_float(src_dtype))
        return kva__fail(KVA_STATUS_UNSUPPORTED,
                         "kva_convert: src_dtype %d (%s) is not f32/f16/bf16", (int)src_dtype,
                         kva_dtype_name(src_dtype));
    if (!kva__dtype_is_float(dst_dtype))
        return kva__fail(KVA_STATUS_UNSUPPORTED,
                         "kva_convert: dst_dtype %d (%s) is not f32/f16/bf16", (int)dst_dtype,
                         kva_dtype_name(dst_dtype));
    if (n == 0)
        return KVA_STATUS_OK;
    KVA_CHECK_PTR(src);
    KVA_CHECK_PTR(dst);
    /* n elements of up to 4 bytes must fit the address space, equal dtypes
     * too (n * 4 would wrap, and memmove would run past both buffers). */
    if (n > SIZE_MAX / 4)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "kva_convert: n = %zu elements overflows the address space", n);
    if (src_dtype == dst_dtype) {
        if (src != dst)
            memmove(dst, src, n * kva_dtype_size(src_dtype));
        return KVA_STATUS_OK;
    }
    /* Different dtypes: the element loops below read and write at different
     * strides (and the bf16 loops promise restrict), so overlapping buffers
     * would be garbled part way; the header forbids it, and it is refused
     * before anything is written. */
    const uintptr_t s0 = (uintptr_t)src, d0 = (uintptr_t)dst;
    const size_t sb = kva_dtype_size(src_dtype), db = kva_dtype_size(dst_dtype);
    if (s0 < d0 + n * db && d0 < s0 + n * sb)
        return kva__fail(KVA_STATUS_INVALID_ARGUMENT,
                         "kva_convert: src %p (%zu bytes of %s) and dst %p (%zu bytes of %s) "
                         "overlap; only src == dst with equal dtypes may",
                         src, n * sb, kva_dtype_name(src_dtype), dst, n * db,
                         kva_dtype_name(dst_dtype));
    /* bf16 <-> f32 (the DCP combines' conversions) in loops that vectorize. */
    if (src_dtype == KVA_DTYPE_BF16 && dst_dtype == KVA_DTYPE_F32) {
        const uint16_t *restrict s = src;
        float *restrict d = dst;
        for (size_t i = 0; i < n; i++)
            d[i] = bits_f32((uint32_t)s[i] << 16);
        return KVA_STATUS_OK;
    }
    if (src_dtype == KVA_DTYPE_F32 && dst_dtype == KVA_DTYPE_BF16) {
        const float *restrict s = src;
        uint16_t *restrict d = dst;
        for (size_t i = 0; i < n; i++)
            d[i] = kva__bf16_bits(f32_bits(s[i]));
        return KVA_STATUS_OK;
    }
    for (size_t i = 0; i < n; i++)
        kva__store_f(dst, dst_dtype, i, kva__load_f(src, src_dtype, i));
    return KVA_STATUS_OK;
}

/*
 * f32 -> OCP fp8 e4m3fn: sign, 4 exponent bits (bias 7), 3 mantissa bits.
 * Normals are (1 + m/8) * 2^(e-7) for e = 1..15 (e = 15, m = 7 is NaN, so the
 * largest finite value is 1.75 * 2^8 = 448); subnormals are m * 2^-9. The
 * conversion saturates (vLLM's fp8 cache does): |x| >= 448, inf included,
 * becomes 448. Rounding is to nearest, ties to even, in integer arithmetic on
 * the f32 bits (no dependence on the FPU rounding mode).
 */
uint8_t kva_f32_to_fp8_e4m3(float x)
{
    uint32_t u = f32_bits(x);
    uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
    uint32_t abs = u & 0x7fffffffu;
    if (abs > 0x7f800000u)
        return (uint8_t)(sign | 0x7fu);
    if (abs >= 0x43e00000u) /* >= 448 (inf included): saturate */
        return (uint8_t)(sign | 0x7eu);
    if (abs < 0x3c800000u) {    /* below 2^-6: subnormal or zero in e4m3 */
        if (abs <= 0x3a800000u) /* <= 2^-10, half of 2^-9: rounds to 0 (ties to even) */
            return sign;
        /* value = mant * 2^(exp - 150); the result is value * 2^9 rounded. */
        uint32_t exp = abs >> 23;
        uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
        uint32_t shift = 141u - exp; /* 150 - 9 - exp: 21 .. 24 for exp 120 .. 117 */
        uint32_t q = mant >> shift;
        uint32_t rem = mant & ((1u << shift) - 1u);
        uint32_t halfway = 1u << (shift - 1u);
        if (rem > halfway || (rem == halfway && (q & 1u)))
            q++; /* q == 8 is code 0x08 = 2^-6, the smallest normal: still right */
        return (uint8_t)(sign | q);
    }
    /* Normal: keep 3 of the 23 mantissa bits, rebias the exponent 127 -> 7. */
    uint32_t r = abs - (120u << 23);
    uint32_t rem = r & 0xfffffu;
    uint32_t q = r >> 20;
    if (rem > 0x80000u || (rem == 0x80000u && (q & 1u)))
        q++; /* carries into the exponent correctly; cannot pass 448 (< 0x43e00000) */
    return (uint8_t)(sign | q);
}

float kva_fp8_e4m3_to_f32(uint8_t code)
{
    uint32_t sign = (uint32_t)(code & 0x80u) << 24;
    uint32_t e = (code >> 3) & 0xfu, m = code & 7u;
    if ((code & 0x7fu) == 0x7fu)
        return bits_f32(sign | 0x7fc00000u);
    if (e == 0) {
        float v = (float)m * 0x1p-9f; /* exact */
        return sign ? -v : v;
    }
    return bits_f32(sign | ((e + 120u) << 23) | (m << 20));
}
