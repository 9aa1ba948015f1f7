/*
 * blackbox_oracle.h - kvattn.h's attention formula in double for the
 * black-box tests (test_api_blackbox_sizes.c, test_api_blackbox_edges.c):
 * the visible keys of a row by the header's rule, their rows read back from
 * the cache (kva_cache_read), scores with soft-cap, ALiBi and sinks, and a
 * check of a paged run's out and lse against it.
 */
#ifndef KVA_TEST_BLACKBOX_ORACLE_H
#define KVA_TEST_BLACKBOX_ORACLE_H

#include "blackbox_util.h"

/* The scalar semantics of one plan (kvattn.h, kva_attention_run). */
typedef struct sz_sem {
    double scale, softcap;
    int32_t causal, window, chunk;
    const float *alibi, *sinks;
} sz_sem;

/* Whether key j is visible to the query at position pos of a request with
 * seq_len s (kvattn.h's rule, trees aside). */
static inline int sz_visible(const sz_sem *m, int64_t s, int64_t pos, int64_t j)
{
    if (j >= s || (m->causal && j > pos))
        return 0;
    if (m->window >= 0 && pos - j > m->window)
        return 0;
    if (m->chunk > 0 && j / m->chunk != pos / m->chunk)
        return 0;
    return 1;
}

/*
 * kvattn.h's formula for query head h of one row in double: q [D] (already
 * f64), the n visible keys' positions pos_j [n] and their K rows k [n, Hkv, D]
 * and V rows v [n, Hkv, Dv] (f32, as kva_cache_read gives them); out [Dv],
 * *lse. A row without keys gives 0 and -inf (or the sink).
 */
static inline void sz_oracle(const sz_sem *m, const double *q, int32_t D, int32_t Dv, int32_t Hkv,
                             int32_t kvh, int32_t h, int64_t pos, int32_t n, const int64_t *posj,
                             const float *k, const float *v, double *out, double *lse)
{
    double mx = -INFINITY;
    double *sc = malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
    for (int32_t t = 0; t < n; t++) {
        const float *kr = k + ((size_t)t * Hkv + kvh) * D;
        double s = 0.0;
        for (int32_t x = 0; x < D; x++)
            s += q[x] * (double)kr[x];
        s *= m->scale;
        if (m->softcap > 0.0)
            s = m->softcap * tanh(s / m->softcap);
        if (m->alibi)
            s += (double)m->alibi[h] * (double)(posj[t] - pos);
        sc[t] = s;
        mx = s > mx ? s : mx;
    }
    const double sink = m->sinks ? (double)m->sinks[h] : -INFINITY;
    mx = sink > mx ? sink : mx;
    for (int32_t x = 0; x < Dv; x++)
        out[x] = 0.0;
    if (mx == -INFINITY) {
        *lse = -INFINITY;
        free(sc);
        return;
    }
    double sum = m->sinks ? exp(sink - mx) : 0.0;
    for (int32_t t = 0; t < n; t++) {
        const double w = exp(sc[t] - mx);
        sum += w;
        const float *vr = v + ((size_t)t * Hkv + kvh) * Dv;
        for (int32_t x = 0; x < Dv; x++)
            out[x] += w * (double)vr[x];
    }
    for (int32_t x = 0; x < Dv; x++)
        out[x] /= sum;
    *lse = mx + log(sum);
    free(sc);
}

/*
 * Checks out [T, H, Dv] and lse [T, H] of a paged run against the oracle
 * over the keys kvattn.h makes visible, read back from the cache through the
 * plan's block table (bt [R, stride]). q [T, H, D] in dt; out within
 * 2 * (atol + rtol * |want|). Returns the number of mismatches.
 */
static inline size_t sz_check_run_tol(kva_context *ctx, const kva_cache *c, const kva_plan_desc *pd,
                                      const sz_sem *m, const void *q, const void *out,
                                      const float *lse, kva_dtype dt, double atol, double rtol,
                                      const char *label)
{
    const int32_t H = pd->num_heads, Hkv = pd->num_kv_heads, D = pd->head_dim;
    const int32_t Dv = pd->head_dim_v ? pd->head_dim_v : D, B = pd->block_size;
    size_t bad = 0;
    for (int32_t r = 0; r < pd->num_requests; r++) {
        const int32_t q_len = pd->query_start_loc[r + 1] - pd->query_start_loc[r];
        const int64_t s = pd->seq_lens[r];
        for (int32_t i = 0; i < q_len; i++) {
            const int64_t pos = s - q_len + i;
            const int64_t t = pd->query_start_loc[r] + i;
            /* The visible keys: a window or a chunk keeps them few here. */
            int64_t lo = m->window >= 0 ? pos - m->window : 0;
            if (m->chunk > 0 && pos >= 0 && (pos / m->chunk) * m->chunk > lo)
                lo = (pos / m->chunk) * m->chunk;
            lo = lo < 0 ? 0 : lo;
            int32_t n = 0;
            int64_t *posj = malloc(sizeof(int64_t) * (size_t)(s - lo + 1));
            int64_t *slot = malloc(sizeof(int64_t) * (size_t)(s - lo + 1));
            for (int64_t j = lo; j < s; j++)
                if (sz_visible(m, s, pos, j)) {
                    posj[n] = j;
                    slot[n] =
                        (int64_t)pd->block_table[(int64_t)r * pd->block_table_stride + j / B] * B +
                        j % B;
                    n++;
                }
            float *k = malloc(sizeof(float) * ((size_t)n * Hkv * D + 1));
            float *v = malloc(sizeof(float) * ((size_t)n * Hkv * Dv + 1));
            CHECK_OK(kva_cache_read(ctx, c, n, slot, k, 0, v, 0, KVA_DTYPE_F32));
            double qd[KVA_MAX_HEAD_DIM], want[KVA_MAX_HEAD_DIM], wl;
            for (int32_t h = 0; h < H; h++) {
                for (int32_t x = 0; x < D; x++)
                    qd[x] = kva_test_get(q, dt, ((size_t)t * H + h) * D + x);
                sz_oracle(m, qd, D, Dv, Hkv, h / (H / Hkv), h, pos, n, posj, k, v, want, &wl);
                for (int32_t x = 0; x < Dv; x++) {
                    const double a = kva_test_get(out, dt, ((size_t)t * H + h) * Dv + x);
                    if (!(fabs(a - want[x]) <= 2.0 * (atol + rtol * fabs(want[x])))) {
                        if (bad++ < 4)
                            fprintf(stderr, "  %s: r %d i %d h %d x %d: got %.8g want %.8g\n",
                                    label, (int)r, (int)i, (int)h, (int)x, a, want[x]);
                    }
                }
                if (lse) {
                    const double a = lse[t * H + h];
                    if (!((isinf(wl) && a == wl) || fabs(a - wl) <= 1e-5 + 1e-5 * fabs(wl))) {
                        if (bad++ < 4)
                            fprintf(stderr, "  %s: r %d i %d h %d: lse %.8g want %.8g\n", label,
                                    (int)r, (int)i, (int)h, a, wl);
                    }
                }
            }
            free(posj);
            free(slot);
            free(k);
            free(v);
        }
    }
    return bad;
}

/* sz_check_run_tol with the dtype's tolerances (harness.h). */
static inline size_t sz_check_run(kva_context *ctx, const kva_cache *c, const kva_plan_desc *pd,
                                  const sz_sem *m, const void *q, const void *out, const float *lse,
                                  kva_dtype dt, const char *label)
{
    return sz_check_run_tol(ctx, c, pd, m, q, out, lse, dt, kva_test_atol(dt), kva_test_rtol(dt),
                            label);
}

#endif /* KVA_TEST_BLACKBOX_ORACLE_H */
