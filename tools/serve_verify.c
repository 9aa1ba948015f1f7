/*
 * serve_verify.c - serve-sim's --verify (docs/serve-sim.md): at steps 1, 2,
 * 4, 8, ... and at the first step of each attention state, one layer's new
 * K/V rows (MLA: latent rows) are looked up in its cache through the
 * block-table rows (they must be where attention reads them: the reference
 * backend writes the same rows at the slots the block table gives into a
 * host cache, and the rows must match byte for byte, token scales included),
 * and its output is recomputed by the reference backend on the same cache
 * (MLA: the reference's naive kva_mla_run with the layer's weights) and
 * compared with the test suite's per-dtype tolerances. The reference is
 * slow, so it checks a subset of the batch (the first decode, the first
 * prefill, then others in order) within a work budget; a long prefill keeps
 * only its first queries with a correspondingly shorter seq_len, which
 * leaves those rows unchanged under the causal mask. CUDA runs the same
 * checks on downloaded copies (serve_engine.c).
 */
#include "kvattn_cuda.h"
#include "serve_engine.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The per-dtype tolerances of the test suite, stated once in bench/data.h. */
#include "../bench/data.h"

/* Reference work allowed per verified step, in (query head, key) pairs times
 * 2D: about 0.15 s of the reference backend on one core of the development
 * machine. */
#define VERIFY_BUDGET 3.0e7

/* Reference work of a request with q queries over seq_len s (causal). */
static double ref_cost(const serve_opts *o, int32_t q, int32_t s)
{
    /* Query i sees s - q + i + 1 keys. */
    double pairs = (double)q * (double)(s - q) + 0.5 * (double)q * (double)(q + 1);
    if (o->kind != KVA_ATTN_MLA)
        return pairs * (double)o->heads * 2.0 * (double)o->head_dim;
    /* MLA: the naive reference decompresses every key of every head, Dc *
     * (Dn + Dv) products each, then attends with Dn + Dr + Dv per pair. */
    const double Dc = o->mla_kv_rank, Dn = o->mla_nope_dim, Dv = o->mla_v_dim;
    const double Dr = o->mla_rope_dim;
    return (double)o->heads * ((double)s * Dc * (Dn + Dv) + pairs * (Dn + Dr + Dv));
}

/* Checks that every new token's K and V rows (k: [T, Hkv, D], v: [T, Hkv, D]
 * in the source dtype, plan order; MLA: c_kv [T, Dc], k_pe [T, Dr], whose
 * latent rows hold both, an MLA cache having no V bytes) sit in layer l's cache where attention
 * reads them. `cache` is a host cache with layer l's bytes (the layer's own
 * cache on host backends, its downloaded mirror on CUDA). The reference
 * backend writes the same rows into e->expect at the slots the block-table
 * rows give (block bt[j][pos / B], offset pos % B); the cache must then hold
 * the same bytes at those slots (K and V rows, and the per-token key scales
 * of the int8_token_k formats): quantization is specified bit for bit, so
 * every backend stores the same codes. This ties the slot mapping used by
 * kva_cache_write to the block-table rows used by kva_attention_run, which
 * the reference comparison cannot see (both read the same cache). Returns
 * the number of mismatched rows, or -1 when the reference write fails. */
static int64_t check_written(serve_engine *e, const kva_cache *cache, int32_t R, int32_t stride,
                             const void *k, const void *v)
{
    const serve_opts *o = &e->o;
    const int32_t B = o->block_size, Hkv = o->kind == KVA_ATTN_MLA ? 1 : o->kv_heads;
    int32_t T = e->qsl[R];
    for (int32_t j = 0; j < R; j++) {
        int32_t q_len = e->qsl[j + 1] - e->qsl[j], ctx = e->seq_lens[j] - q_len;
        for (int32_t i = 0; i < q_len; i++) {
            int32_t pos = ctx + i;
            e->v_slots[e->qsl[j] + i] =
                (int64_t)e->bt[(size_t)j * (size_t)stride + (size_t)(pos / B)] * B + pos % B;
        }
    }
    if (kva_cache_write(e->ref, e->expect, T, k, 0, v, 0, o->dtype, e->v_slots) != KVA_STATUS_OK)
        return -1;
    const size_t rk = kva_cache_block_bytes_k(cache) / (size_t)B;
    const size_t rv = kva_cache_block_bytes_v(cache) / (size_t)B;
    void *kd = NULL, *vd = NULL, *ke = NULL, *ve = NULL;
    float *ts = NULL, *te = NULL;
    if (kva_cache_data(cache, &kd, &vd) != KVA_STATUS_OK ||
        kva_cache_data(e->expect, &ke, &ve) != KVA_STATUS_OK ||
        kva_cache_token_scales(cache, &ts) != KVA_STATUS_OK ||
        kva_cache_token_scales(e->expect, &te) != KVA_STATUS_OK)
        return -1;
    int64_t bad = 0;
    for (int32_t t = 0; t < T; t++) {
        const size_t slot = (size_t)e->v_slots[t];
        int ok = memcmp((const char *)kd + slot * rk, (const char *)ke + slot * rk, rk) == 0 &&
                 memcmp((const char *)vd + slot * rv, (const char *)ve + slot * rv, rv) == 0;
        /* Token scales: [NB, Hkv, B]. */
        const size_t b = slot / (size_t)B, off = slot % (size_t)B;
        for (int32_t h = 0; ts && ok && h < Hkv; h++) {
            size_t x = (b * (size_t)Hkv + (size_t)h) * (size_t)B + off;
            ok = memcmp(&ts[x], &te[x], sizeof(float)) == 0;
        }
        bad += !ok;
    }
    return bad;
}

/* The extra bound of the CUDA backend's tensor-core kernels (decode variant
 * 4, the prefill kernels, the quantized decode): as FlashAttention, they
 * round the softmax weights P to 16 bits for P V, so out may differ from the
 * reference by u * max|v| more, u = 2^-8 when P is bf16 (bf16 q over a bf16
 * cache or 16-bit V) and 2^-11 when it is f16 (f16 q; 1-byte K/V, whose
 * codes become f16); max|v| <= 2 (the uniform fill, sqrt 3, plus a
 * quantization step). The CUDA tests use the same bound. f32 q and the host
 * backends round nothing. */
static double p_rounding(const serve_opts *o)
{
    if (o->backend != KVA_BACKEND_CUDA || o->dtype == KVA_DTYPE_F32)
        return 0.0;
    int bf16_p = o->dtype == KVA_DTYPE_BF16 &&
                 (o->kv_quant == KVA_QUANT_NONE || o->kv_quant == KVA_QUANT_INT8_TOKEN_K_V16);
    return (bf16_p ? 0x1p-8 : 0x1p-11) * 2.0;
}

/* The bounds of an output element: the test suite's per dtype, and for MLA
 * those of tests/test_mla.c (whose fp32 sums run over Dc-wide latent rows,
 * and whose 16-bit q, weights and cache round the absorbed query); over a
 * bf16 latent cache the CPU's mla_avx512bf16 (chosen on AMD) rounds the
 * absorbed queries and P to bf16, and gets test_mla's bound for that. */
static void tolerances(const serve_opts *o, double *atol, double *rtol)
{
    const kva_dtype dt = o->dtype;
    if (o->kind == KVA_ATTN_MLA) {
        *atol = dt == KVA_DTYPE_F32                                     ? 5e-5
                : dt == KVA_DTYPE_BF16 && o->kv_quant == KVA_QUANT_NONE ? KVA_TEST_MLA_BF16DOT_ATOL
                                                                        : 8e-4;
        *rtol = dt == KVA_DTYPE_F32 ? 5e-5 : dt == KVA_DTYPE_F16 ? 2e-3 : 2.0 / 128;
        return;
    }
    *atol = kva_test_atol(dt) + p_rounding(o);
    *rtol = kva_test_rtol(dt);
}

/* Whether the step's plan may have run layer l as a cascade: its two passes'
 * outputs are rounded to the output dtype before the merge rounds again
 * (docs/cascade.md), an error of up to u * max|v| however small the result,
 * which the relative bound above does not cover. With chunked layers the
 * engine's current plan may be another layer kind's, so any cascade-enabled
 * run with local layers counts. */
static int step_may_cascade(const serve_engine *e)
{
    if (e->o.cascade == KVA_CASCADE_OFF)
        return 0;
    if (e->o.attention_chunk > 0)
        return 1;
    kva_plan_info info;
    return e->plan && kva_plan_get_info(e->plan, &info) == KVA_STATUS_OK &&
           info.num_cascade_groups > 0;
}

/* The cascade bounds of bench/data.h for a cascade step, at least the
 * plain bounds. */
static void cascade_tolerances(const serve_opts *o, double *atol, double *rtol)
{
    const double ca = kva_test_cascade_atol(o->dtype), cr = kva_test_cascade_rtol(o->dtype);
    *atol = *atol > ca ? *atol : ca;
    *rtol = *rtol > cr ? *rtol : cr;
}

/* Checks layer l's output (out: host [T, shape.out], plan order) against the
 * reference run over `cache` (a host cache holding layer l's bytes). The
 * step fails if any element differs or misplaced (check_written) != 0. */
static kva_status verify_layer(serve_engine *e, int32_t R, int32_t stride, int32_t l, const void *q,
                               const kva_cache *cache, const void *out, int64_t misplaced,
                               serve_stats *st)
{
    const serve_opts *o = &e->o;
    const size_t qn = e->sh.q, on = e->sh.out, row = qn * e->es;
    /* Candidates: the first decode, the first prefill, then the rest in order. */
    int32_t first_prefill = -1, n = 0;
    for (int32_t j = 0; j < R; j++)
        if (e->qsl[j + 1] - e->qsl[j] > 1 && first_prefill < 0)
            first_prefill = j;
    int32_t *keep_q = e->v_seq; /* [n] kept queries of each selected request */
    double budget = VERIFY_BUDGET;
    for (int32_t pass = 0; pass < 2; pass++) {
        for (int32_t j = 0; j < R; j++) {
            int first = j == 0 || j == first_prefill;
            if ((pass == 0) != first)
                continue;
            int32_t q_len = e->qsl[j + 1] - e->qsl[j], s = e->seq_lens[j];
            int32_t qk = q_len;
            while (qk > 1 && ref_cost(o, qk, s - q_len + qk) > budget)
                qk = (qk + 1) / 2;
            double c = ref_cost(o, qk, s - q_len + qk);
            if (c > budget && n > 0)
                continue;
            budget -= c;
            e->v_sel[n] = j;
            keep_q[n] = qk;
            n++;
        }
    }
    /* The reduced batch: same block-table rows, first qk queries. */
    int32_t t = 0;
    int32_t *v_seq = malloc((size_t)n * sizeof *v_seq);
    if (!v_seq)
        return KVA_STATUS_OUT_OF_MEMORY;
    for (int32_t k = 0; k < n; k++) {
        int32_t j = e->v_sel[k], q_len = e->qsl[j + 1] - e->qsl[j];
        e->v_qsl[k] = t;
        v_seq[k] = e->seq_lens[j] - q_len + keep_q[k];
        memcpy(e->v_bt + (size_t)k * stride, e->bt + (size_t)j * stride,
               (size_t)stride * sizeof(int32_t));
        memcpy((char *)e->v_q + (size_t)t * row, (const char *)q + (size_t)e->qsl[j] * row,
               (size_t)keep_q[k] * row);
        t += keep_q[k];
    }
    e->v_qsl[n] = t;
    kva_test_poison(e->v_out, o->dtype, (size_t)t * on);
    kva_plan_desc pd =
        serve_step_desc(o, n, e->v_qsl, v_seq, e->v_bt, stride, serve_layer_local(o, l));
    kva_plan *plan = NULL;
    kva_status rc = kva_plan_create(e->ref, &pd, &plan);
    if (rc == KVA_STATUS_OK)
        rc = serve_layer_attention(e->ref, o, plan, e->v_q, serve_engine_w_uk(e, e->w, l),
                                   serve_engine_w_uv(e, e->w, l), cache, e->v_out);
    kva_plan_destroy(plan);
    if (rc == KVA_STATUS_OK) {
        double atol, rtol;
        tolerances(o, &atol, &rtol);
        if (o->kind != KVA_ATTN_MLA && step_may_cascade(e))
            cascade_tolerances(o, &atol, &rtol);
        size_t bad = 0;
        for (int32_t k = 0; k < n; k++) {
            int32_t j = e->v_sel[k];
            for (int32_t i = 0; i < keep_q[k]; i++) {
                size_t src = ((size_t)e->qsl[j] + (size_t)i) * on;
                size_t dst = ((size_t)e->v_qsl[k] + (size_t)i) * on;
                for (size_t x = 0; x < on; x++) {
                    double got = kva_test_get(out, o->dtype, src + x);
                    double want = kva_test_get(e->v_out, o->dtype, dst + x);
                    double err = fabs(got - want);
                    if (!(err <= atol + rtol * fabs(want))) {
                        bad++;
                        if (isnan(err)) /* an unwritten (poisoned) element */
                            err = INFINITY;
                    }
                    if (err > st->verify_max_err)
                        st->verify_max_err = err;
                }
            }
        }
        st->verify_steps++;
        st->verify_tokens += t;
        if (bad || misplaced) {
            st->verify_failures++;
            if (misplaced)
                st->verify_max_err = INFINITY;
            if (!e->verr[0])
                snprintf(e->verr, sizeof e->verr,
                         "step %lld, layer %d: %zu output elements differ from the reference "
                         "(largest error so far %.3g), %lld new K/V rows are not where the "
                         "block table says",
                         (long long)e->step, (int)l, bad, st->verify_max_err, (long long)misplaced);
        }
    }
    free(v_seq);
    return rc;
}

/* SERVE_FAULT_OUTPUT: out[0] += 1 (out: host, in the model's dtype). */
static void fault_output(const serve_opts *o, void *out)
{
    float x = (float)kva_test_get(out, o->dtype, 0) + 1.0f;
    if (o->dtype == KVA_DTYPE_F32)
        ((float *)out)[0] = x;
    else if (o->dtype == KVA_DTYPE_F16)
        ((uint16_t *)out)[0] = kva_f32_to_f16(x);
    else
        ((uint16_t *)out)[0] = kva_f32_to_bf16(x);
}

/* CUDA --verify, after the step's synchronization: layer l's output (its
 * own device buffer) and cache come down to the host, where check_written
 * and verify_layer run on the host copy (e->mirror). The deferred status of
 * the layer's int8 writes is read too (a rejected write is a failure). */
kva_status serve_verify_device(serve_engine *e, int32_t R, int32_t stride, int32_t l,
                               serve_stats *st)
{
    const serve_opts *o = &e->o;
    const int32_t T = e->qsl[R];
    void *dk = NULL, *dv = NULL, *hk = NULL, *hv = NULL;
    float *dts = NULL, *hts = NULL;
    size_t nk, nv, nts;
    kva_status rc = kva_cuda_cache_write_status(e->ctx, e->caches[l]);
    if (rc != KVA_STATUS_OK)
        return rc;
    if ((rc = kva_cache_data(e->caches[l], &dk, &dv)) != KVA_STATUS_OK ||
        (rc = kva_cache_data(e->mirror, &hk, &hv)) != KVA_STATUS_OK ||
        (rc = kva_cache_token_scales(e->caches[l], &dts)) != KVA_STATUS_OK ||
        (rc = kva_cache_token_scales(e->mirror, &hts)) != KVA_STATUS_OK)
        return rc;
    serve_cache_sizes(e->caches[l], o->num_blocks, &nk, &nv, &nts);
    if ((rc = serve_dev_download(e->d, e->out, e->d_vout, (size_t)T * e->sh.out * e->es)) !=
            KVA_STATUS_OK ||
        (rc = serve_dev_download(e->d, hk, dk, nk)) != KVA_STATUS_OK ||
        (rc = serve_dev_download(e->d, hv, dv, nv)) != KVA_STATUS_OK ||
        (dts && (rc = serve_dev_download(e->d, hts, dts, nts)) != KVA_STATUS_OK))
        return serve_engine_dev_fail(e, rc);
    size_t shift = (size_t)((e->step * 7 + l * 13) % RAND_SHIFTS) * e->sh.unit;
    const char *q = (const char *)e->rand + shift * e->es;
    const char *k = q + (size_t)e->tmax * e->sh.q * e->es;
    const char *v = k + (size_t)e->tmax * e->sh.k * e->es;
    if (o->fault == SERVE_FAULT_OUTPUT)
        fault_output(o, e->out);
    int64_t misplaced = check_written(e, e->mirror, R, stride, k, v);
    if (misplaced < 0)
        return KVA_STATUS_INTERNAL;
    return verify_layer(e, R, stride, l, q, e->mirror, e->out, misplaced, st);
}

kva_status serve_verify_host(serve_engine *e, int32_t R, int32_t stride, int32_t l, const void *q,
                             const void *k, const void *v, serve_stats *st)
{
    if (e->o.fault == SERVE_FAULT_OUTPUT)
        fault_output(&e->o, e->out);
    int64_t misplaced = check_written(e, e->caches[l], R, stride, k, v);
    if (misplaced < 0)
        return KVA_STATUS_INTERNAL;
    return verify_layer(e, R, stride, l, q, e->caches[l], e->out, misplaced, st);
}

/* --dcp --verify, every step, layer 0 (the layer rank 0 keeps unsharded in
 * e->full: NB blocks of N * B tokens, indexed by the pool's block table as a
 * run without --dcp would): rank 0 writes the step's new rows there and runs
 * the unsharded plan; every rank sends its combined heads [T, H / N, D]; rank
 * 0 compares them head by head with the tolerance of tests/test_dcp.c (the
 * partials are rounded to the dtype before the combine: atol + rtol (|want| +
 * 1.75 (N - 1)), 1.75 bounding the random values). A collective: every rank
 * calls it at the same steps. */
kva_status serve_verify_dcp(serve_engine *e, int32_t R, int32_t stride, const void *q,
                            const void *k, const void *v, serve_stats *st)
{
    const serve_opts *o = &e->o;
    const int32_t T = e->qsl[R], N = o->dcp, Hn = o->heads / N, D = o->head_dim;
    const size_t mine = (size_t)T * Hn * D * e->es;
    if (o->fault == SERVE_FAULT_OUTPUT && o->dcp_rank == N - 1)
        fault_output(o, e->out);
    kva_status rc = serve_dcp_gather(e->dcp, e->out, mine, e->gathered);
    if (rc != KVA_STATUS_OK || o->dcp_rank != 0)
        return rc;
    /* The run without --dcp: block size N * B, the pool's slots. */
    serve_opts fo = *o;
    fo.dcp = 0;
    fo.block_size = N * o->block_size;
    if ((rc = kva_cache_write(e->ctx, e->full, T, k, 0, v, 0, o->dtype, e->full_slots)) !=
        KVA_STATUS_OK)
        return rc;
    kva_plan_desc pd =
        serve_step_desc(&fo, R, e->qsl, e->seq_lens, e->bt, stride, serve_layer_local(o, 0));
    kva_plan *plan = NULL;
    if ((rc = kva_plan_create(e->ctx, &pd, &plan)) != KVA_STATUS_OK)
        return rc;
    kva_test_poison(e->full_out, o->dtype, (size_t)T * o->heads * D);
    rc = kva_attention_run(e->ctx, plan, q, e->full, NULL, e->full_out, NULL);
    kva_plan_destroy(plan);
    if (rc != KVA_STATUS_OK)
        return rc;
    const double atol = kva_test_atol(o->dtype), rtol = kva_test_rtol(o->dtype);
    size_t bad = 0;
    for (int32_t t = 0; t < T; t++)
        for (int32_t h = 0; h < o->heads; h++)
            for (int32_t x = 0; x < D; x++) {
                /* Rank h / Hn sent head h as its head h % Hn. */
                size_t g = (((size_t)(h / Hn) * T + t) * Hn + h % Hn) * D + x;
                double got = kva_test_get(e->gathered, o->dtype, g);
                double want =
                    kva_test_get(e->full_out, o->dtype, ((size_t)t * o->heads + h) * D + x);
                double err = fabs(got - want);
                if (!(err <= atol + rtol * (fabs(want) + 1.75 * (N - 1)))) {
                    bad++;
                    if (isnan(err))
                        err = INFINITY;
                }
                if (err > st->verify_max_err)
                    st->verify_max_err = err;
            }
    st->verify_steps++;
    st->verify_tokens += T;
    if (bad) {
        st->verify_failures++;
        if (!e->verr[0])
            snprintf(e->verr, sizeof e->verr,
                     "step %lld, layer 0: %zu combined output elements of %d ranks differ from "
                     "the unsharded run (largest error so far %.3g)",
                     (long long)e->step, bad, (int)N, st->verify_max_err);
    }
    return KVA_STATUS_OK;
}
