/*
 * indexer_util.h - one lightning-indexer case for tests/test_indexer.c and
 * tests/cuda/test_cuda_indexer.c: random index keys (request-local
 * positions) behind shuffled block tables, random index queries and head
 * weights, an independent FP8_TOKEN quantizer, the test's own fp64 logits
 * and the checker of a top-K row against them.
 *
 * The keys the test scores are the values the cache holds, computed here
 * without the library: the key rounded to the cache dtype, or code * scale
 * from this file's quantizer (which test_indexer.c checks the written bytes
 * against).
 */
#ifndef KVA_TEST_INDEXER_UTIL_H
#define KVA_TEST_INDEXER_UTIL_H

#include "harness.h"

#include <float.h>

#define IDX_MAX_REQ 8

typedef struct idx_case {
    int32_t Hi, D, B, K;
    kva_dtype dt; /* q dtype, and the cache dtype when unquantized */
    int fp8;      /* 1: FP8_E4M3 + FP8_TOKEN cache */
    int32_t R, q_len[IDX_MAX_REQ], seq_len[IDX_MAX_REQ];
    int ties;       /* 1: some key rows repeat an earlier row of their request (exact ties) */
    int nan_key;    /* 1: one key of request 0 holds a NaN */
    int same;       /* 1: every key of request 0 repeats its first: all logits tie */
    int qfp8;       /* 1: index_q_quant = FP8_TOKEN (q quantized per token and head) */
    double tol_rel; /* the checker's tolerance / M (idx_logits); 0: fp32 rounding */
    uint64_t seed;
} idx_case;

/* A case of R requests of q_len ql [R] queries and seq_len sl [R] keys
 * (R <= IDX_MAX_REQ), Hi heads of D, block size B, top K, q dtype dt, FP8
 * keys when fp8; the flags (ties, nan_key, same, qfp8) and tol_rel are 0:
 * the caller sets those it wants. */
static inline idx_case idx_case_of(int32_t Hi, int32_t D, int32_t B, int32_t K, kva_dtype dt,
                                   int fp8, int32_t R, const int32_t *ql, const int32_t *sl,
                                   uint64_t seed)
{
    idx_case c;
    memset(&c, 0, sizeof c);
    c.Hi = Hi;
    c.D = D;
    c.B = B;
    c.K = K;
    c.dt = dt;
    c.fp8 = fp8;
    c.R = R;
    memcpy(c.q_len, ql, (size_t)R * sizeof *ql);
    memcpy(c.seq_len, sl, (size_t)R * sizeof *sl);
    c.seed = seed;
    return c;
}

/* A context of backend b with the given thread count (checked). */
static inline kva_context *idx_ctx(kva_backend b, int32_t threads)
{
    kva_context_desc cd = {.backend = b, .num_threads = threads};
    kva_context *ctx = NULL;
    CHECK_OK(kva_context_create(&cd, &ctx));
    return ctx;
}

/* ---- the independent FP8 e4m3fn encoder and FP8_TOKEN quantizer ---- */

/* The value of e4m3fn code c (from the format's definition: bias 7, 3
 * mantissa bits, subnormals at exponent field 0, 0x7f / 0xff NaN). */
static inline double idx_e4m3_value(int c)
{
    const int sign = c & 0x80, e = (c >> 3) & 15, m = c & 7;
    if ((c & 0x7f) == 0x7f)
        return NAN;
    const double v = e == 0 ? m * ldexp(1.0, -9) : (8 + m) * ldexp(1.0, e - 10);
    return sign ? -v : v;
}

/* The code nearest to x (ties to the even code), saturating at +-448. */
static inline uint8_t idx_e4m3_encode(float x)
{
    if (x != x)
        return 0x7f;
    int best = 0;
    double bd = INFINITY;
    for (int c = 0; c < 256; c++) {
        const double v = idx_e4m3_value(c);
        if (v != v || (c == 0x80))
            continue;
        const double dd = fabs(v - (double)x);
        if (dd < bd || (dd == bd && (c & 1) == 0 && (best & 1) == 1)) {
            bd = dd;
            best = c;
        }
    }
    return (uint8_t)best;
}

/* Quantizes one row x [D]: scale max(amax / 448, FLT_MIN), codes of x / s. */
static inline float idx_quant_row(const float *x, int32_t D, uint8_t *codes)
{
    float amax = 0.0f;
    for (int32_t i = 0; i < D; i++)
        if (fabsf(x[i]) > amax)
            amax = fabsf(x[i]);
    float s = amax / 448.0f;
    if (!(s > FLT_MIN))
        s = FLT_MIN;
    for (int32_t i = 0; i < D; i++)
        codes[i] = idx_e4m3_encode(x[i] / s);
    return s;
}

/* ---- a case's data ---- */

typedef struct idx_data {
    int32_t T, nb, stride, total; /* tokens, blocks, block-table stride, keys of all requests */
    int32_t qsl[IDX_MAX_REQ + 1];
    int32_t kstart[IDX_MAX_REQ + 1]; /* first key row of each request in keys */
    int32_t *bt;                     /* [R, stride] */
    int64_t *slots;                  /* [total] cache slot of each key row */
    float *keys;                     /* [total, D] the source rows */
    double *kval;                    /* [total, D] the values the cache holds */
    void *q;                         /* [T, Hi, D] in dt */
    float *w;                        /* [T, Hi] */
} idx_data;

static inline void idx_free(idx_data *x)
{
    free(x->bt);
    free(x->slots);
    free(x->keys);
    free(x->kval);
    free(x->q);
    free(x->w);
    memset(x, 0, sizeof *x);
}

/* Builds the data of case c (host arrays only). */
static inline void idx_build(const idx_case *c, idx_data *x)
{
    memset(x, 0, sizeof *x);
    kva_rng rng = {c->seed};
    const int32_t D = c->D, B = c->B;
    x->stride = 1;
    for (int32_t r = 0; r < c->R; r++) {
        x->qsl[r + 1] = x->qsl[r] + c->q_len[r];
        x->kstart[r + 1] = x->kstart[r] + c->seq_len[r];
        const int32_t nbr = (c->seq_len[r] + B - 1) / B;
        x->nb += nbr;
        if (nbr > x->stride)
            x->stride = nbr;
    }
    x->nb += 1; /* one spare block no request uses */
    x->T = x->qsl[c->R];
    x->total = x->kstart[c->R];
    /* Blocks handed out in a shuffled order. */
    int32_t *perm = malloc((size_t)x->nb * sizeof *perm);
    for (int32_t i = 0; i < x->nb; i++)
        perm[i] = i;
    for (int32_t i = x->nb - 1; i > 0; i--) {
        const int32_t j = kva_rng_int(&rng, 0, i), tmp = perm[i];
        perm[i] = perm[j];
        perm[j] = tmp;
    }
    x->bt = calloc((size_t)c->R * x->stride, sizeof *x->bt);
    x->slots = malloc(((size_t)x->total + 1) * sizeof *x->slots);
    int32_t next = 0;
    for (int32_t r = 0; r < c->R; r++) {
        for (int32_t b = 0; b < (c->seq_len[r] + B - 1) / B; b++)
            x->bt[r * x->stride + b] = perm[next++];
        for (int32_t j = 0; j < c->seq_len[r]; j++)
            x->slots[x->kstart[r] + j] = (int64_t)x->bt[r * x->stride + j / B] * B + j % B;
    }
    free(perm);
    x->keys = malloc(((size_t)x->total + 1) * D * sizeof *x->keys);
    x->kval = malloc(((size_t)x->total + 1) * D * sizeof *x->kval);
    kva_test_fill(x->keys, KVA_DTYPE_F32, (size_t)x->total * D, &rng, 1.0);
    if (c->ties) /* every 5th key repeats the key 3 before it */
        for (int32_t r = 0; r < c->R; r++)
            for (int32_t j = 3; j < c->seq_len[r]; j += 5)
                memcpy(x->keys + (size_t)(x->kstart[r] + j) * D,
                       x->keys + (size_t)(x->kstart[r] + j - 3) * D, (size_t)D * sizeof(float));
    if (c->same)
        for (int32_t j = 1; j < c->seq_len[0]; j++)
            memcpy(x->keys + (size_t)j * D, x->keys, (size_t)D * sizeof(float));
    if (c->nan_key && c->seq_len[0] > 1)
        x->keys[(size_t)(c->seq_len[0] / 2) * D + 1] = NAN;
    uint8_t codes[KVA_MAX_HEAD_DIM];
    for (int32_t t = 0; t < x->total; t++) {
        const float *k = x->keys + (size_t)t * D;
        if (c->fp8) {
            const float s = idx_quant_row(k, D, codes);
            for (int32_t i = 0; i < D; i++)
                x->kval[(size_t)t * D + i] = idx_e4m3_value(codes[i]) * (double)s;
        } else {
            for (int32_t i = 0; i < D; i++) {
                float v = k[i];
                if (c->dt == KVA_DTYPE_F16)
                    v = kva_f16_to_f32(kva_f32_to_f16(v));
                else if (c->dt == KVA_DTYPE_BF16)
                    v = kva_bf16_to_f32(kva_f32_to_bf16(v));
                x->kval[(size_t)t * D + i] = v;
            }
        }
    }
    const size_t nq = (size_t)x->T * c->Hi * D;
    x->q = malloc((nq + 1) * kva_dtype_size(c->dt));
    kva_test_fill(x->q, c->dt, nq, &rng, 1.0);
    x->w = malloc(((size_t)x->T * c->Hi + 1) * sizeof *x->w);
    for (size_t i = 0; i < (size_t)x->T * c->Hi; i++) /* mostly positive, some negative */
        x->w[i] = (float)(kva_rng_unit(&rng) * 1.2 - 0.2) / sqrtf((float)c->Hi);
}

/* The cache and plan descriptors of a case. */
static inline kva_cache_desc idx_cache_desc(const idx_case *c, const idx_data *x)
{
    kva_cache_desc d = {0};
    d.num_blocks = x->nb;
    d.block_size = c->B;
    d.num_kv_heads = 1;
    d.head_dim = c->D;
    d.dtype = c->fp8 ? KVA_DTYPE_FP8_E4M3 : c->dt;
    d.quant = c->fp8 ? KVA_QUANT_FP8_TOKEN : KVA_QUANT_NONE;
    d.kind = KVA_ATTN_INDEX;
    return d;
}

static inline kva_plan_desc idx_plan_desc(const idx_case *c, const idx_data *x)
{
    kva_plan_desc p = {0};
    p.num_requests = c->R;
    p.num_heads = c->Hi;
    p.num_kv_heads = 1;
    p.head_dim = c->D;
    p.q_dtype = c->dt;
    p.causal = 1;
    p.window_left = -1;
    p.query_start_loc = x->qsl;
    p.seq_lens = c->seq_len;
    p.block_table = x->bt;
    p.block_table_stride = x->stride;
    p.block_size = c->B;
    p.kind = KVA_ATTN_INDEX;
    p.sparse_topk = c->K;
    p.index_q_quant = c->qfp8 ? KVA_QUANT_FP8_TOKEN : KVA_QUANT_NONE;
    return p;
}

/* ---- the test's fp64 reference and the checker ---- */

/* Logits of token t (request r, n = pos + 1 keys) into L [n]; M = the
 * row's magnitude max_j sum_h |w_h| sum_d |q_hd k_jd| (the scale of fp32
 * rounding errors). With c->qfp8 the q rows are this file's quantizer's
 * code * scale, as the library must quantize them; qfp8 = -1 scores the
 * unquantized q whatever the case says (the overlap statistics). */
static inline void idx_logits_q(const idx_case *c, const idx_data *x, int32_t r, int32_t t,
                                int32_t n, int qfp8, double *L, double *M)
{
    const int32_t Hi = c->Hi, D = c->D;
    double *qd = malloc((size_t)Hi * D * sizeof *qd);
    for (size_t e = 0; e < (size_t)Hi * D; e++)
        qd[e] = kva_test_get(x->q, c->dt, (size_t)t * Hi * D + e);
    if (qfp8 == 1) {
        float row[KVA_MAX_HEAD_DIM];
        uint8_t codes[KVA_MAX_HEAD_DIM];
        for (int32_t h = 0; h < Hi; h++) {
            for (int32_t d = 0; d < D; d++)
                row[d] = (float)qd[(size_t)h * D + d];
            const float s = idx_quant_row(row, D, codes);
            for (int32_t d = 0; d < D; d++)
                qd[(size_t)h * D + d] = idx_e4m3_value(codes[d]) * (double)s;
        }
    }
    *M = 0.0;
    for (int32_t j = 0; j < n; j++) {
        const double *k = x->kval + (size_t)(x->kstart[r] + j) * D;
        double logit = 0.0, mag = 0.0;
        for (int32_t h = 0; h < Hi; h++) {
            double dot = 0.0, ad = 0.0;
            for (int32_t d = 0; d < D; d++) {
                const double qv = qd[(size_t)h * D + d];
                dot += qv * k[d];
                ad += fabs(qv * k[d]);
            }
            const double wh = x->w[(size_t)t * Hi + h];
            logit += wh * (dot < 0.0 ? 0.0 : dot);
            mag += fabs(wh) * ad;
        }
        L[j] = logit;
        if (mag > *M)
            *M = mag;
    }
    free(qd);
}
static inline void idx_logits(const idx_case *c, const idx_data *x, int32_t r, int32_t t, int32_t n,
                              double *L, double *M)
{
    idx_logits_q(c, x, r, t, n, c->qfp8 ? 1 : -1, L, M);
}

/* 1 if key a ranks before key b in exact arithmetic (NaN last, ties by position). */
static inline int idx_before(const double *L, int32_t a, int32_t b)
{
    const int na = L[a] != L[a], nb = L[b] != L[b];
    if (na != nb)
        return nb;
    if (na)
        return a < b;
    return L[a] > L[b] || (L[a] == L[b] && a < b);
}

/* A logit as a rank value: NaN below everything. */
static inline double idx_rank(double v)
{
    return v != v ? -INFINITY : v;
}

/* The reference order ord [n] of the positions: a merge sort by idx_before. */
static inline void idx_order(const double *L, int32_t n, int32_t *ord)
{
    for (int32_t j = 0; j < n; j++)
        ord[j] = j;
    int32_t *tmp = malloc((size_t)n * sizeof *tmp + 1);
    for (int32_t w = 1; w < n; w *= 2) {
        for (int32_t lo = 0; lo < n; lo += 2 * w) {
            const int32_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
            int32_t i = lo, j = mid, o = lo;
            while (i < mid && j < hi)
                tmp[o++] = idx_before(L, ord[j], ord[i]) ? ord[j++] : ord[i++];
            while (i < mid)
                tmp[o++] = ord[i++];
            while (j < hi)
                tmp[o++] = ord[j++];
        }
        memcpy(ord, tmp, (size_t)n * sizeof *ord);
    }
    free(tmp);
}

/*
 * Checks one output row (row [K], len = its topk_length or -1 if none)
 * against the exact logits L [n]. exact = 1: the row must be the sorted
 * reference exactly. exact = 0: keys whose logits lie within tol of each
 * other may swap (float rounding), and nothing else:
 *   - len = min(K, n), the rest -1, listed keys distinct and in [0, n);
 *   - the listed set is the top set up to tol: every listed logit >= the
 *     reference K-th - tol, every unlisted one <= it + tol (NaN ranks
 *     lowest);
 *   - consecutive entries are ordered up to tol, exactly tied logits by
 *     position.
 * Returns the number of failures (and prints the first).
 */
static inline int idx_check_row(const char *label, int32_t t, const int32_t *row, int32_t len,
                                int32_t K, const double *L, int32_t n, double tol, int exact,
                                int32_t *ord, unsigned char *seen)
{
    const int32_t m = n < K ? n : K;
    int bad = 0;
    idx_order(L, n, ord);
    if (len >= 0 && len != m)
        bad++;
    memset(seen, 0, (size_t)n);
    for (int32_t k = 0; k < K && !bad; k++) {
        const int32_t v = row[k];
        if (k >= m) {
            bad += v != -1;
            continue;
        }
        if (v < 0 || v >= n || seen[v]) {
            bad++;
            break;
        }
        seen[v] = 1;
        if (exact) {
            bad += v != ord[k];
            continue;
        }
        const double kth = idx_rank(L[ord[m - 1]]);
        bad += idx_rank(L[v]) < kth - tol;
        if (k > 0) {
            const int32_t u = row[k - 1];
            const double lu = idx_rank(L[u]), lv = idx_rank(L[v]);
            bad += lv > lu + tol;
            bad += (L[u] == L[v] || (L[u] != L[u] && L[v] != L[v])) && u > v;
        }
    }
    if (!bad && !exact && m > 0) {
        const double kth = idx_rank(L[ord[m - 1]]);
        for (int32_t j = 0; j < n; j++)
            if (!seen[j] && idx_rank(L[j]) > kth + tol)
                bad++;
    }
    if (bad) {
        fprintf(stderr, "%s: token %d (n %d, K %d, len %d): row differs from the reference:\n",
                label, (int)t, (int)n, (int)K, (int)len);
        for (int32_t k = 0; k < (m < 8 ? m : 8); k++)
            fprintf(stderr, "  [%d] got %d (%.9g) want %d (%.9g)\n", (int)k, (int)row[k],
                    row[k] >= 0 && row[k] < n ? L[row[k]] : 0.0, (int)ord[k], L[ord[k]]);
    }
    return bad;
}

/* Checks every row of a run's output against the test's reference;
 * returns the number of bad rows. topk may be NULL. */
static inline int idx_check(const char *label, const idx_case *c, const idx_data *x,
                            const int32_t *indices, int64_t stride, const int32_t *topk, int exact)
{
    int32_t maxn = 1;
    for (int32_t r = 0; r < c->R; r++)
        if (c->seq_len[r] > maxn)
            maxn = c->seq_len[r];
    double *L = malloc((size_t)maxn * sizeof *L);
    int32_t *ord = malloc((size_t)maxn * sizeof *ord);
    unsigned char *seen = malloc((size_t)maxn);
    int bad = 0;
    for (int32_t r = 0; r < c->R; r++)
        for (int32_t i = 0; i < c->q_len[r]; i++) {
            const int32_t t = x->qsl[r] + i, n = c->seq_len[r] - c->q_len[r] + i + 1;
            double M = 0.0;
            idx_logits(c, x, r, t, n, L, &M);
            /* fp32 sums of D products per head, then Hi heads (or the
             * case's own bound). */
            const double tol =
                (c->tol_rel > 0.0 ? c->tol_rel : 8.0 * (c->D + c->Hi) * ldexp(1.0, -24)) * M;
            const int b = idx_check_row(label, t, indices + (int64_t)t * stride,
                                        topk ? topk[t] : -1, c->K, L, n, tol, exact, ord, seen);
            bad += b != 0;
        }
    free(L);
    free(ord);
    free(seen);
    return bad;
}

/* How much quantizing q changes the exact top K: over every token of the
 * case, the share of the unquantized q's top min(K, n) keys that the
 * FP8-q logits' top min(K, n) also lists (both from this file's fp64
 * logits, no library output). */
static inline double idx_fp8q_overlap(const idx_case *c, const idx_data *x)
{
    int32_t maxn = 1;
    for (int32_t r = 0; r < c->R; r++)
        if (c->seq_len[r] > maxn)
            maxn = c->seq_len[r];
    double *L = malloc((size_t)maxn * sizeof *L), M;
    int32_t *oa = malloc((size_t)maxn * sizeof *oa), *ob = malloc((size_t)maxn * sizeof *ob);
    unsigned char *in = malloc((size_t)maxn);
    double hit = 0.0, all = 0.0;
    for (int32_t r = 0; r < c->R; r++)
        for (int32_t i = 0; i < c->q_len[r]; i++) {
            const int32_t t = x->qsl[r] + i, n = c->seq_len[r] - c->q_len[r] + i + 1;
            const int32_t m = n < c->K ? n : c->K;
            idx_logits_q(c, x, r, t, n, -1, L, &M);
            idx_order(L, n, oa);
            idx_logits_q(c, x, r, t, n, 1, L, &M);
            idx_order(L, n, ob);
            memset(in, 0, (size_t)(n > 0 ? n : 0));
            for (int32_t k = 0; k < m; k++)
                in[oa[k]] = 1;
            for (int32_t k = 0; k < m; k++)
                hit += in[ob[k]];
            all += m;
        }
    free(L);
    free(oa);
    free(ob);
    free(in);
    return all > 0.0 ? hit / all : 1.0;
}

#endif /* KVA_TEST_INDEXER_UTIL_H */
