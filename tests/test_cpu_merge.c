/*
 * test_cpu_merge.c - kva_merge_states on the CPU backend against the
 * reference: random rows with -inf sides, in-place aliasing of either side,
 * and the header's contract that a side whose lse is -inf contributes
 * nothing whatever its out row holds (NaN and inf garbage rows, both sides
 * -inf, weights that underflow in fp32 or also in fp64).
 */
#include "harness.h"
#include "internal.h"

/*
 * Merges states a (out [T, H, Dv] in dt, lse la [T, H]) and b on the
 * reference and on a CPU context of `threads` threads, outputs poisoned first,
 * and compares; then repeats the CPU merge in place into side a (in_a) or
 * side b, which overwrites that side, and compares again.
 */
static void check_merge(kva_dtype dt, int32_t T, int32_t H, int32_t Dv, int32_t threads, void *a,
                        float *la, void *bb, float *lb, int in_a)
{
    const size_t n = (size_t)T * H * Dv, nl = (size_t)T * H, esz = kva_dtype_size(dt);
    void *o_ref = malloc(n * esz), *o_cpu = malloc(n * esz);
    float *l_ref = malloc(nl * 4), *l_cpu = malloc(nl * 4);
    kva_context_desc rd = {KVA_BACKEND_REF, 0, 0}, cd = {KVA_BACKEND_CPU, threads, 0};
    kva_context *ref = NULL, *cpu = NULL;
    CHECK_OK(kva_context_create(&rd, &ref));
    CHECK_OK(kva_context_create(&cd, &cpu));
    kva_test_poison(o_ref, dt, n);
    kva_test_poison(o_cpu, dt, n);
    kva_test_poison(l_ref, KVA_DTYPE_F32, nl);
    kva_test_poison(l_cpu, KVA_DTYPE_F32, nl);
    CHECK_OK(kva_merge_states(ref, T, H, Dv, dt, a, la, bb, lb, o_ref, l_ref));
    CHECK_OK(kva_merge_states(cpu, T, H, Dv, dt, a, la, bb, lb, o_cpu, l_cpu));
    size_t bad =
        kva_test_compare("merge out", o_cpu, o_ref, dt, n, kva_test_atol(dt), kva_test_rtol(dt));
    bad += kva_test_compare_f32("merge lse", l_cpu, l_ref, nl, kva_test_atol(KVA_DTYPE_F32),
                                kva_test_rtol(KVA_DTYPE_F32));
    CHECK_MSG(bad == 0, "merge_states %s T=%d H=%d Dv=%d: %zu mismatches", kva_dtype_name(dt),
              (int)T, (int)H, (int)Dv, bad);
    void *io = in_a ? a : bb;
    float *il = in_a ? la : lb;
    CHECK_OK(kva_merge_states(cpu, T, H, Dv, dt, a, la, bb, lb, io, il));
    bad =
        kva_test_compare("merge in place", io, o_ref, dt, n, kva_test_atol(dt), kva_test_rtol(dt));
    bad += kva_test_compare_f32("merge lse in place", il, l_ref, nl, kva_test_atol(KVA_DTYPE_F32),
                                kva_test_rtol(KVA_DTYPE_F32));
    CHECK_MSG(bad == 0, "in-place merge_states %s (into %s): %zu mismatches", kva_dtype_name(dt),
              in_a ? "a" : "b", bad);
    kva_context_destroy(ref);
    kva_context_destroy(cpu);
    free(o_ref);
    free(o_cpu);
    free(l_ref);
    free(l_cpu);
}

/* Random rows, some sides -inf, then the same merge in place. */
static void test_merge_states(void)
{
    kva_rng rng = {8080};
    static const kva_dtype dts[] = {KVA_DTYPE_F32, KVA_DTYPE_F16, KVA_DTYPE_BF16};
    for (int i = 0; i < 9; i++) {
        const kva_dtype dt = dts[i % 3];
        const int32_t T = kva_rng_int(&rng, 1, 300), H = kva_rng_int(&rng, 1, 8);
        const int32_t Dv = 8 * kva_rng_int(&rng, 1, 32);
        const size_t n = (size_t)T * H * Dv, nl = (size_t)T * H, esz = kva_dtype_size(dt);
        void *a = malloc(n * esz), *bb = malloc(n * esz);
        float *la = malloc(nl * 4), *lb = malloc(nl * 4);
        kva_test_fill(a, dt, n, &rng, 1.0);
        kva_test_fill(bb, dt, n, &rng, 1.0);
        for (size_t x = 0; x < nl; x++) {
            int kind = kva_rng_int(&rng, 0, 5);
            la[x] = kind == 0 ? -INFINITY : (float)(kva_rng_normal(&rng) * 4);
            lb[x] = kind == 1 || kind == 2 ? -INFINITY : (float)(kva_rng_normal(&rng) * 4);
        }
        check_merge(dt, T, H, Dv, 1 + i % 3, a, la, bb, lb, i % 2);
        free(a);
        free(bb);
        free(la);
        free(lb);
    }
}

/* kva_merge_states: a side whose lse is -inf contributes nothing, whatever
 * its out row holds; both -inf gives 0 and -inf; weights that underflow in
 * fp32 (lse 200 apart) give the other side. */
static void test_merge_states_nonfinite(void)
{
    static const kva_dtype dts[] = {KVA_DTYPE_F32, KVA_DTYPE_F16, KVA_DTYPE_BF16};
    kva_rng rng = {555};
    for (int i = 0; i < 6; i++) {
        const kva_dtype dt = dts[i % 3];
        const int32_t T = 97, H = 3, Dv = i < 3 ? 8 : 72;
        const size_t n = (size_t)T * H * Dv, nl = (size_t)T * H, esz = kva_dtype_size(dt);
        unsigned char *a = malloc(n * esz), *bb = malloc(n * esz);
        float *la = malloc(nl * 4), *lb = malloc(nl * 4);
        kva_test_fill(a, dt, n, &rng, 1.0);
        kva_test_fill(bb, dt, n, &rng, 1.0);
        for (size_t x = 0; x < nl; x++) {
            const float base = (float)(kva_rng_normal(&rng) * 3);
            const int kind = (int)(x % 7);
            unsigned char *ra = a + x * Dv * esz, *rb = bb + x * Dv * esz;
            la[x] = base;
            lb[x] = base + (float)kva_rng_normal(&rng);
            if (kind == 0 || kind == 1) { /* a empty, garbage row (NaN, inf) */
                la[x] = -INFINITY;
                for (int32_t c = 0; c < Dv; c++)
                    kva__store_f(ra, dt, (size_t)c, c % 2 ? NAN : (kind ? -INFINITY : INFINITY));
            } else if (kind == 2) { /* b empty, garbage row */
                lb[x] = -INFINITY;
                for (int32_t c = 0; c < Dv; c++)
                    kva__store_f(rb, dt, (size_t)c, c % 3 ? INFINITY : NAN);
            } else if (kind == 3) { /* both empty, garbage rows */
                la[x] = lb[x] = -INFINITY;
                kva_test_poison(ra, dt, (size_t)Dv);
                kva_test_poison(rb, dt, (size_t)Dv);
            } else if (kind == 4) { /* weights underflow in fp32, finite rows */
                la[x] = base - 200.0f;
            } else if (kind == 5) { /* b underflows in fp64 too: its NaN row is skipped */
                lb[x] = base - 1000.0f;
                kva_test_poison(rb, dt, (size_t)Dv);
            }
        }
        check_merge(dt, T, H, Dv, 1 + i % 2, a, la, bb, lb, 1);
        free(a);
        free(bb);
        free(la);
        free(lb);
    }
}

int main(void)
{
    RUN(test_merge_states);
    RUN(test_merge_states_nonfinite);
    return kva_test_finish();
}
