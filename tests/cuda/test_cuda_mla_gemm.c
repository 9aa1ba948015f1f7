/*
 * test_cuda_mla_gemm.c - kva_mla_run's batched GEMM (kva__cuda_mla_gemm,
 * src/attn/cuda/mla_run.h) on its own, against an fp64 host product of the
 * same inputs: random 16-bit (or FP8 E4M3 code) A rows gathered through a
 * row map with negative entries (zero rows), B K-major or MN-major with
 * padded rows and head strides, C rows scattered through a map with negative
 * entries into padded, poisoned rows (what the map does not name, the
 * padding columns and the skipped rows must keep the poison).
 *
 * Shapes: the decompression's product pair (c_kv . W_UK^T and c_kv . W_UV
 * in one call, either order of the arguments, K 512, N 128, rows not a
 * multiple of the 128-row tile), a pair of the same B majorness (two
 * launches), single products of the absorbed path's shapes (N 512 / K 128,
 * one head's A per head), an FP8 A with its scale, and a shape the sm_90a
 * form does not take (N 64); the pair form with two column blocks per
 * product and one k step per tile (N 256, K 64: copies two steps ahead run
 * two tiles ahead, held FP8 codes cross every tile boundary), and a pair
 * whose C2 is 4- but not 16-byte aligned (the dispatch splits it: C on the
 * sm_90a form, C2 on mma.sync). C2 has its own row stride and head stride
 * (head gaps, poisoned), so a product that takes the other's strides
 * fails. Each runs on the dispatch's form with the
 * persistent grid the device fits, capped at 5 and at 1 CTA (every CTA walks
 * tiles of other rows, column blocks and heads), and forced onto the
 * mma.sync form; on devices without the sm_90a form every run is mma.sync.
 *
 * Tolerance: the output is rounded once to bf16 / f16 from fp32 sums of K
 * products of O(1) values (sums of O(sqrt K)): |got - ref| <= 2^-7 |ref| +
 * 0.02 (bf16), 2^-10 |ref| + 0.01 (f16); a wrong row, column block, head or
 * k step moves an element by O(sqrt K).
 *
 * Bad input: a second product with a misaligned stride is refused with a
 * clear status and C untouched. Exits 77 without a GPU.
 */
#include "cuda_util.h"
#include "../../src/attn/cuda/mla_run.h"
#include "../../src/attn/cuda/prefill_mma.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#ifdef KVA_HAVE_CUDA

typedef struct gcase {
    const char *name;
    int32_t M, N, K, H;
    int pair; /* 1: a second product (b2) */
    int b_kn, b2_kn;
    int a_head;  /* 1: A holds one K-slice per head (projections), 0: shared (c_kv) */
    int gather;  /* A rows through a map with negative entries */
    int scatter; /* C rows through a map with negative entries */
    int fp8;     /* A as FP8 E4M3 codes, C = scale A B */
    kva_dtype dt;
    int c2_off; /* C2 starts this many elements past its allocation (2: 4-byte aligned) */
} gcase;

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 11);
}
static float urand(void)
{
    return (float)((rnd() & 0xffffff) / 8388608.0 - 1.0); /* [-1, 1) */
}

/* Host copies of one case's operands and device buffers. */
typedef struct gdata {
    int32_t ra, rc; /* A rows stored, C rows stored */
    int64_t lda, a_hs, ldb, b_hs, ldc, ldb2, b2_hs;
    int64_t ldc2, c2_head; /* C2's strides: its own, and heads N + 8 apart (poisoned gaps) */
    void *ha, *hb, *hb2;   /* host A, B, B2 */
    int32_t *arow, *crow;  /* host maps (NULL: identity) */
    void *da, *db, *db2, *dc, *dc2; /* device */
    int32_t *darow, *dcrow;
    size_t ca_bytes, cb_bytes; /* C, C2 bytes */
} gdata;

static int64_t b_ld(const gcase *c, int kn)
{
    return kn ? c->N + 8 : c->K + 8; /* [K][N] rows or [N][K] rows, padded */
}

static void gdata_make(const gcase *c, gdata *d)
{
    memset(d, 0, sizeof *d);
    const int es = 2, ae = c->fp8 ? 1 : 2;
    d->ra = c->M + 37;
    d->a_hs = c->a_head ? c->K : 0;
    d->lda = (c->a_head ? (int64_t)c->H * c->K : c->K) + 64;
    const size_t na = (size_t)d->ra * d->lda;
    d->ha = malloc(na * ae);
    for (size_t i = 0; i < na; i++) {
        if (c->fp8) {
            uint8_t code = (uint8_t)(rnd() % 0x58); /* |x| <= 15 (no NaN codes) */
            ((uint8_t *)d->ha)[i] = code | (rnd() & 1 ? 0x80 : 0);
        } else {
            kva__store_f(d->ha, c->dt, i, urand());
        }
    }
    d->ldb = b_ld(c, c->b_kn);
    d->b_hs = (int64_t)(c->b_kn ? c->K : c->N) * d->ldb + 64;
    d->ldb2 = b_ld(c, c->b2_kn);
    d->b2_hs = (int64_t)(c->b2_kn ? c->K : c->N) * d->ldb2 + 64;
    const size_t nb = (size_t)c->H * d->b_hs, nb2 = (size_t)c->H * d->b2_hs;
    d->hb = malloc(nb * es);
    d->hb2 = malloc(nb2 * es);
    for (size_t i = 0; i < nb; i++)
        kva__store_f(d->hb, c->dt, i, urand());
    for (size_t i = 0; i < nb2; i++)
        kva__store_f(d->hb2, c->dt, i, urand());
    if (c->gather) {
        d->arow = malloc(sizeof(int32_t) * c->M);
        for (int32_t m = 0; m < c->M; m++)
            d->arow[m] = rnd() % 11 == 0 ? -1 : (int32_t)(rnd() % (uint32_t)d->ra);
    }
    d->rc = c->M + 21;
    if (c->scatter) { /* a permutation of the first M rows of rc, some skipped */
        d->crow = malloc(sizeof(int32_t) * c->M);
        int32_t *perm = malloc(sizeof(int32_t) * d->rc);
        for (int32_t i = 0; i < d->rc; i++)
            perm[i] = i;
        for (int32_t i = d->rc - 1; i > 0; i--) {
            const int32_t j = (int32_t)(rnd() % (uint32_t)(i + 1)), t = perm[i];
            perm[i] = perm[j], perm[j] = t;
        }
        for (int32_t m = 0; m < c->M; m++)
            d->crow[m] = rnd() % 13 == 0 ? -1 : perm[m];
        free(perm);
    }
    d->ldc = (int64_t)c->H * c->N + 16;
    d->c2_head = c->N + 8;
    d->ldc2 = (int64_t)c->H * d->c2_head + 24;
    d->ca_bytes = (size_t)d->rc * d->ldc * es;
    d->cb_bytes = ((size_t)d->rc * d->ldc2 + (size_t)c->c2_off) * es;
    d->da = dev_from(d->ha, na * ae);
    d->db = dev_from(d->hb, nb * es);
    d->db2 = dev_from(d->hb2, nb2 * es);
    d->darow = d->arow ? dev_from(d->arow, sizeof(int32_t) * c->M) : NULL;
    d->dcrow = d->crow ? dev_from(d->crow, sizeof(int32_t) * c->M) : NULL;
    d->dc = dev_poisoned(d->ca_bytes);
    d->dc2 = dev_poisoned(d->cb_bytes);
}

static void gdata_free(gdata *d)
{
    free(d->ha), free(d->hb), free(d->hb2), free(d->arow), free(d->crow);
    cudaFree(d->da), cudaFree(d->db), cudaFree(d->db2), cudaFree(d->dc), cudaFree(d->dc2);
    cudaFree(d->darow), cudaFree(d->dcrow);
}

static kva__cuda_mla_gemm_args gargs(const gcase *c, const gdata *d, float scale)
{
    kva__cuda_mla_gemm_args g;
    memset(&g, 0, sizeof g);
    g.a = d->da, g.a_rows = d->darow, g.lda = d->lda, g.a_head = d->a_hs;
    g.b = d->db, g.ldb = d->ldb, g.b_head = d->b_hs, g.b_kn = c->b_kn;
    g.c = d->dc, g.c_rows = d->dcrow, g.ldc = d->ldc, g.c_head = c->N;
    g.M = c->M, g.N = c->N, g.K = c->K, g.heads = c->H, g.dtype = c->dt;
    g.a_fp8 = c->fp8, g.c_scale = scale;
    if (c->pair) {
        g.b2 = d->db2, g.ldb2 = d->ldb2, g.b2_head = d->b2_hs, g.b2_kn = c->b2_kn;
        g.c2 = (char *)d->dc2 + 2 * (size_t)c->c2_off, g.ldc2 = d->ldc2, g.c2_head = d->c2_head;
    }
    return g;
}

static double a_at(const gcase *c, const gdata *d, int64_t row, int h, int k)
{
    const size_t i = (size_t)row * d->lda + (size_t)h * d->a_hs + k;
    return c->fp8 ? kva_fp8_e4m3_to_f32(((const uint8_t *)d->ha)[i]) : kva__load_f(d->ha, c->dt, i);
}
static double b_at(const gcase *c, const void *hb, int kn, int64_t ld, int64_t hs, int h, int k,
                   int n)
{
    const size_t i = (size_t)h * hs + (kn ? (size_t)k * ld + n : (size_t)n * ld + k);
    return kva__load_f(hb, c->dt, i);
}

/* The fp64 product q (0: A B, 1: A B2) of every row m, head h, column n
 * at ref[(m H + h) N + n] (scaled for FP8). */
static double *reference(const gcase *c, const gdata *d, int q, float scale)
{
    const void *hb = q ? d->hb2 : d->hb;
    const int kn = q ? c->b2_kn : c->b_kn;
    const int64_t ld = q ? d->ldb2 : d->ldb, hs = q ? d->b2_hs : d->b_hs;
    const double sc = c->fp8 ? scale : 1.0;
    double *ref = calloc((size_t)c->M * c->H * c->N, sizeof(double));
    double *bt = malloc(sizeof(double) * c->K * c->N); /* one head's B as [n][k] */
    double *ar = malloc(sizeof(double) * c->K);
    for (int h = 0; h < c->H; h++) {
        for (int k = 0; k < c->K; k++)
            for (int n = 0; n < c->N; n++)
                bt[(size_t)n * c->K + k] = b_at(c, hb, kn, ld, hs, h, k, n);
        for (int32_t m = 0; m < c->M; m++) {
            const int32_t r = d->arow ? d->arow[m] : m;
            if (r < 0)
                continue; /* a zero row */
            for (int k = 0; k < c->K; k++)
                ar[k] = a_at(c, d, r, h, k);
            for (int n = 0; n < c->N; n++) {
                double acc = 0;
                const double *bn = bt + (size_t)n * c->K;
                for (int k = 0; k < c->K; k++)
                    acc += ar[k] * bn[k];
                ref[((size_t)m * c->H + h) * c->N + n] = acc * sc;
            }
        }
    }
    free(ar);
    free(bt);
    return ref;
}

/* Checks product q of one run (got: all of C or C2's allocation on the
 * host) against ref; returns the mismatches. Product q's element (row r,
 * head h, column n) is at off + r ldc + h ch + n; every other element of
 * the allocation (rows not written, head gaps, row padding, C2's leading
 * c2_off elements) must keep the poison. */
static size_t check_product(const gcase *c, const gdata *d, int q, const void *got,
                            const double *ref, const char *what)
{
    const double rt = c->dt == KVA_DTYPE_BF16 ? 1.0 / 128 : 1.0 / 1024;
    const double at = c->dt == KVA_DTYPE_BF16 ? 0.02 : 0.01;
    const int64_t ldc = q ? d->ldc2 : d->ldc, ch = q ? d->c2_head : c->N;
    const size_t off = q ? (size_t)c->c2_off : 0;
    const size_t total = (q ? d->cb_bytes : d->ca_bytes) / 2;
    uint8_t *written = calloc((size_t)d->rc, 1);
    size_t bad = 0;
    for (int32_t m = 0; m < c->M; m++) {
        const int32_t cr = d->crow ? d->crow[m] : m;
        if (cr < 0)
            continue;
        written[cr] = 1;
        for (int h = 0; h < c->H; h++)
            for (int n = 0; n < c->N; n++) {
                const double want = ref[((size_t)m * c->H + h) * c->N + n];
                const double v =
                    kva__load_f(got, c->dt, off + (size_t)cr * ldc + (size_t)h * ch + n);
                if (!(fabs(v - want) <= rt * fabs(want) + at)) {
                    if (bad < 3)
                        printf("    %s %s product %d: row %d head %d col %d: %g, want %g\n",
                               c->name, what, q, (int)m, h, n, v, want);
                    bad++;
                }
            }
    }
    /* everything else keeps the poison */
    for (size_t i = 0; i < total; i++) {
        if (i >= off) {
            const int64_t r = (int64_t)((i - off) / (size_t)ldc),
                          e = (int64_t)((i - off) % (size_t)ldc);
            if (written[r] && e / ch < c->H && e % ch < c->N)
                continue;
        }
        const uint16_t u = ((const uint16_t *)got)[i];
        if (u != 0xffffu) {
            if (bad < 3)
                printf("    %s %s product %d: element %zu written (0x%04x)\n", c->name, what, q, i,
                       u);
            bad++;
        }
    }
    free(written);
    return bad;
}

/* Runs case c with the dispatch (max_ctas 0, 5, 1) and on the forced
 * mma.sync form, each into freshly poisoned C and C2. */
static void run_gcase(const gcase *c)
{
    gdata d;
    gdata_make(c, &d);
    const float scale = c->fp8 ? 0.05f : 1.f;
    double *ref[2] = {reference(c, &d, 0, scale), c->pair ? reference(c, &d, 1, scale) : NULL};
    void *got = malloc(d.ca_bytes > d.cb_bytes ? d.ca_bytes : d.cb_bytes);
    const int caps[4] = {0, 5, 1, -1}; /* -1: mma.sync */
    for (int v = 0; v < 4; v++) {
        kva__cuda_mla_gemm_args g = gargs(c, &d, scale);
        g.max_ctas = caps[v] > 0 ? caps[v] : 0;
        g.mma_only = caps[v] < 0;
        char what[32];
        snprintf(what, sizeof what, caps[v] < 0 ? "mma.sync" : "ctas %d", caps[v]);
        dev_fill(d.dc, 0xff, d.ca_bytes);
        dev_fill(d.dc2, 0xff, d.cb_bytes);
        CHECK_OK(kva__cuda_mla_gemm(&g, NULL));
        CUDA_OK(cudaDeviceSynchronize());
        size_t bad = 0;
        for (int q = 0; q <= c->pair; q++) {
            to_host(got, q ? d.dc2 : d.dc, q ? d.cb_bytes : d.ca_bytes);
            bad += check_product(c, &d, q, got, ref[q], what);
        }
        if (!c->pair) { /* C2 untouched */
            to_host(got, d.dc2, d.cb_bytes);
            for (size_t i = 0; i < d.cb_bytes; i++)
                bad += ((const uint8_t *)got)[i] != 0xff;
        }
        printf("  %-22s %-9s M %4d N %3d K %3d H %2d %s: %zu mismatches\n", c->name, what,
               (int)c->M, (int)c->N, (int)c->K, (int)c->H, kva_dtype_name(c->dt), bad);
        CHECK_MSG(bad == 0, "%s (%s): %zu mismatches", c->name, what, bad);
    }
    free(got);
    free(ref[0]);
    free(ref[1]);
    gdata_free(&d);
}

static void test_shapes(void)
{
    const int quick = getenv("KVA_TEST_QUICK") != NULL;
    printf("  sm_90a form: %s\n", kva__cuda_prefill_wgmma_ready() ? "yes" : "no (mma.sync only)");
    const gcase cs[] = {
        /* name, M, N, K, H, pair, b_kn, b2_kn, a_head, gather, scatter, fp8, dt, c2_off */
        {"decompress pair", 700, 128, 512, 5, 1, 0, 1, 0, 1, 0, 0, KVA_DTYPE_BF16, 0},
        {"pair, V first", 260, 128, 512, 3, 1, 1, 0, 0, 1, 1, 0, KVA_DTYPE_F16, 0},
        {"pair fp8", 333, 128, 512, 3, 1, 0, 1, 0, 1, 0, 1, KVA_DTYPE_BF16, 0},
        {"q_nope . W_UK", 70, 512, 128, 4, 0, 1, 1, 1, 1, 0, 0, KVA_DTYPE_BF16, 0},
        {"o_lat . W_UV", 45, 128, 512, 6, 0, 1, 1, 1, 0, 1, 0, KVA_DTYPE_F16, 0},
        {"pair, same layout", 300, 256, 128, 3, 1, 1, 1, 0, 0, 1, 0, KVA_DTYPE_BF16, 0},
        {"single fp8 K-major", 130, 128, 256, 2, 0, 0, 0, 0, 1, 1, 1, KVA_DTYPE_F16, 0},
        {"pair N 64", 150, 64, 512, 2, 1, 0, 1, 0, 1, 0, 0, KVA_DTYPE_BF16, 0},
        {"pair N 256 K 64", 300, 256, 64, 3, 1, 0, 1, 0, 1, 1, 0, KVA_DTYPE_F16, 0},
        {"pair N 256 K 64 fp8", 200, 256, 64, 2, 1, 1, 0, 0, 1, 0, 1, KVA_DTYPE_BF16, 0},
        {"pair, C2 4-aligned", 260, 128, 512, 2, 1, 0, 1, 0, 1, 1, 0, KVA_DTYPE_BF16, 2},
    };
    const int n = (int)(sizeof cs / sizeof cs[0]);
    for (int i = 0; i < (quick ? 3 : n); i++)
        run_gcase(&cs[i]);
}

/* A second product with a misaligned stride: refused, C untouched. */
static void test_errors(void)
{
    const gcase c = {"bad", 64, 128, 512, 1, 1, 0, 1, 0, 0, 0, 0, KVA_DTYPE_BF16, 0};
    gdata d;
    gdata_make(&c, &d);
    kva__cuda_mla_gemm_args g = gargs(&c, &d, 1.f);
    g.ldb2 = d.ldb2 + 1;
    CHECK_STATUS(kva__cuda_mla_gemm(&g, NULL), KVA_STATUS_INVALID_ARGUMENT);
    CHECK_ERROR_MENTIONS("second GEMM");
    CUDA_OK(cudaDeviceSynchronize());
    CHECK(dev_untouched(d.dc) && dev_untouched(d.dc2));
    gdata_free(&d);
}

#endif

int main(void)
{
    const int skip = cuda_test_skip();
    if (skip)
        return skip;
#ifdef KVA_HAVE_CUDA
    RUN(test_errors);
    RUN(test_shapes);
#endif
    return kva_test_finish();
}
