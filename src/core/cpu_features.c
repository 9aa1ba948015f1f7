/*
 * cpu_features.c - runtime detection of the CPU's vector ISA.
 *
 * On x86-64 a feature counts only if the CPU reports it (cpuid) AND the
 * operating system saves the register state it needs (xgetbv: XCR0). A CPU
 * with AVX-512 under an OS that does not enable ZMM state must not run
 * AVX-512 code, so both checks are required. AArch64 always has NEON
 * (Advanced SIMD is mandatory in ARMv8-A). Everything else reports nothing.
 *
 * No global mutable state: detection runs on every call. cpuid traps to the
 * hypervisor on a VM (about 30 us per detection measured here), so the
 * library detects once per context (kva_context_create stores
 * ctx->cpu_features) and plans choose kernels from that copy
 * (kva__cpu_isa_of); nothing detects on the run path.
 */
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(_M_X64) || defined(__i386__)
#if defined(__GNUC__)
#include <cpuid.h>
#define KVA_X86_CPUID 1
#endif
#endif

#ifdef KVA_X86_CPUID

/* XCR0 bits: 1 = SSE (XMM) state, 2 = AVX (upper YMM) state, 5..7 = AVX-512
 * opmask, upper ZMM0-15 and ZMM16-31 state. */
#define XCR0_YMM_MASK 0x06u
#define XCR0_ZMM_MASK 0xe6u

/* Reads XCR0. Encoded as bytes so that no -mxsave flag is needed. */
static uint64_t read_xcr0(void)
{
    uint32_t eax, edx;
    __asm__ volatile(".byte 0x0f, 0x01, 0xd0" /* xgetbv */
                     : "=a"(eax), "=d"(edx)
                     : "c"(0));
    return ((uint64_t)edx << 32) | eax;
}

static void detect_x86(kva__cpu_features *f)
{
    unsigned a, b, c, d;
    if (!__get_cpuid_count(1, 0, &a, &b, &c, &d))
        return;
    int osxsave = (c >> 27) & 1;
    int avx = (c >> 28) & 1;
    int fma = (c >> 12) & 1;
    int f16c = (c >> 29) & 1;
    if (!osxsave || !avx)
        return; /* without AVX state saving none of our features is usable */
    uint64_t xcr0 = read_xcr0();
    int os_ymm = (xcr0 & XCR0_YMM_MASK) == XCR0_YMM_MASK;
    int os_zmm = (xcr0 & XCR0_ZMM_MASK) == XCR0_ZMM_MASK;
    if (!os_ymm)
        return;
    f->fma = fma;
    f->f16c = f16c;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d))
        return;
    f->avx2 = (b >> 5) & 1;
    if (os_zmm) {
        f->avx512f = (b >> 16) & 1;
        f->avx512bw = f->avx512f && ((b >> 30) & 1);
        f->avx512vl = f->avx512f && ((b >> 31) & 1);
        f->avx512dq = f->avx512f && ((b >> 17) & 1);
        f->avx512vnni = f->avx512f && ((c >> 11) & 1);
        /* Leaf 7 subleaf 1 EAX bit 5: AVX512_BF16 (subleaf 1 exists when
         * subleaf 0 EAX, the highest subleaf, is at least 1). */
        unsigned max_sub = a, a1, b1, c1, d1;
        if (f->avx512f && max_sub >= 1 && __get_cpuid_count(7, 1, &a1, &b1, &c1, &d1))
            f->avx512bf16 = (a1 >> 5) & 1;
    }
    /* Leaf 0: the vendor string in EBX, EDX, ECX ("AuthenticAMD"). */
    unsigned v[4];
    if (f->avx512bf16 && __get_cpuid(0, &v[3], &v[0], &v[2], &v[1])) {
        char vendor[13];
        memcpy(vendor, v, 12);
        vendor[12] = '\0';
        f->bf16dot_fast = strcmp(vendor, "AuthenticAMD") == 0;
    }
}

#endif /* KVA_X86_CPUID */

void kva__cpu_features_get(kva__cpu_features *out)
{
    if (!out)
        return;
    memset(out, 0, sizeof *out);
#if defined(KVA_X86_CPUID)
    detect_x86(out);
#elif defined(__aarch64__) || defined(_M_ARM64)
    out->neon = 1;
#endif
}

const char *kva__cpu_isa_string(void)
{
    /* Per-thread buffer, rebuilt on every call: long enough for every name. */
    static _Thread_local char buf[160];
    kva__cpu_features f;
    kva__cpu_features_get(&f);
    const struct {
        int on;
        const char *name;
    } names[] = {
        {f.avx2, "avx2"},
        {f.fma, "fma"},
        {f.f16c, "f16c"},
        {f.avx512f, "avx512f"},
        {f.avx512bw, "avx512bw"},
        {f.avx512vl, "avx512vl"},
        {f.avx512dq, "avx512dq"},
        {f.avx512bf16, "avx512bf16"},
        {f.avx512vnni, "avx512vnni"},
        {f.neon, "neon"},
    };
    size_t len = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        if (!names[i].on)
            continue;
        int n = snprintf(buf + len, sizeof buf - len, "%s%s", len ? " " : "", names[i].name);
        if (n < 0 || (size_t)n >= sizeof buf - len)
            break;
        len += (size_t)n;
    }
    if (len == 0)
        snprintf(buf, sizeof buf, "none");
    return buf;
}

static const char *const isa_names[] = {"portable", "avx2", "avx512", "avx512bf16"};

const char *kva__cpu_isa_name(kva__cpu_isa isa)
{
    return (unsigned)isa < sizeof isa_names / sizeof isa_names[0] ? isa_names[isa] : "invalid";
}

kva__cpu_isa kva__cpu_isa_of(const kva__cpu_features *f)
{
    kva__cpu_isa level = KVA__ISA_PORTABLE;
    if (KVA_X86_SIMD && f->avx2 && f->fma && f->f16c) {
        level = KVA__ISA_AVX2;
        if (f->avx512f && f->avx512bw && f->avx512vl && f->avx512dq) {
            level = KVA__ISA_AVX512;
            if (f->avx512bf16)
                level = KVA__ISA_AVX512BF16;
        }
    }
    const char *env = getenv("KVA_CPU_ISA");
    if (env && *env) {
        for (int i = 0; i < (int)(sizeof isa_names / sizeof isa_names[0]); i++)
            if (strcmp(env, isa_names[i]) == 0 && (kva__cpu_isa)i < level)
                level = (kva__cpu_isa)i;
    }
    return level;
}

kva__cpu_isa kva__cpu_isa_level(void)
{
    kva__cpu_features f;
    kva__cpu_features_get(&f);
    return kva__cpu_isa_of(&f);
}
