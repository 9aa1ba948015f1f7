/*
 * test_api_blackbox_heads.c - odd head counts and large head sizes with the
 * hidden-slot rule: kvattn.h takes any H that Hkv divides (query head h reads
 * kv head h / (H / Hkv)) and head sizes that are multiples of 8 up to
 * KVA_MAX_HEAD_DIM = 576, and promises that slots no row reads may hold
 * anything. The other hidden-slot tests (test_api_blackbox_hidden.c,
 * _blocks.c) use H 4, Hkv 2, D 32 / 64. Here H 3, 9 and 63 over GQA groups
 * of 1, 3, 7, 9, 21 and 63 (the CPU kernels' row blocks of 8 / 4 / 2 / 1
 * with each remainder), D from 8 to 576 (Dv != D on the unquantized
 * formats), each at block sizes 1 and 160 (one block of 152 keys a
 * request), with a mask that rotates (a mixed batch, a window, local chunks
 * with a soft-cap, a draft tree, ALiBi, non-causal rows with q_len >
 * seq_len, a q_len 0 request) and a format and layout that rotate
 * (hidden_cases.h's seven MHA formats, NHD / HND). On the reference, the CPU
 * backend as dispatched and at its portable ISA level (and, without
 * KVA_TEST_QUICK, at AVX2 / AVX-512 and with every CPU kernel forced):
 *  - over a clean cache, every row equals the reference's (2x the dtype
 *    tolerances of bench/data.h), outputs poisoned first;
 *  - over a cache whose storage first held NaN, +inf or -inf garbage, with
 *    keys that some rows do not see overwritten by non-finite rows, every
 *    row that sees none of them equals the clean run (hidden_run.h).
 */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include "hidden_cases.h"
#include "hidden_run.h"
#include "hidden_variants.h"

enum { HD_MAX_CASES = 32 };

/* (H, Hkv, D, Dv): Dv is used on the unquantized formats only (the quantized
 * ones need Dv = D). */
static const struct {
    int32_t h, hkv, d, dv;
} kHeads[] = {
    {3, 1, 264, 136}, {9, 3, 520, 520}, {63, 7, 40, 24}, {63, 9, 24, 40},
    {63, 3, 8, 8},    {9, 1, 576, 64},  {3, 3, 136, 8},  {63, 1, 16, 16},
};
enum { HD_NH = (int)(sizeof kHeads / sizeof kHeads[0]) };

/* ALiBi slopes for up to 63 heads. */
static float g_slopes[64];

/* The mask kinds, rotating over the cases. */
enum { M_MIXED, M_WINDOW, M_CHUNK, M_TREE, M_ALIBI, M_NONCAUSAL, M_QLEN0, M_COUNT };
static const char *const kMaskNames[M_COUNT] = {"mixed", "window",    "chunk+softcap", "tree",
                                                "alibi", "noncausal", "qlen0"};

static void hd_case(hc_case *c, int hi, int32_t B, int mask, int fi)
{
    const int f = fi % HC_NFMT;
    const kva_layout lay = (kva_layout)(fi % 2);
    const int32_t cap = B == 1 ? HC_MAXBT : B - 8; /* keys a request may hold */
    const int32_t H = kHeads[hi].h, Hkv = kHeads[hi].hkv, D = kHeads[hi].d;
    const int32_t Dv = kHcFormats[f].q == KVA_QUANT_NONE ? kHeads[hi].dv : D;
    char nm[96];
    snprintf(nm, sizeof nm, "%s H %d Hkv %d D %d Dv %d B %d %s %s", kMaskNames[mask], H, Hkv, D, Dv,
             B, kHcFormats[f].name, lay ? "HND" : "NHD");
    int32_t ql[3] = {1, 3, 4}, sl[3] = {cap - 2, cap, cap - 1};
    int R = 3;
    switch (mask) {
    case M_NONCAUSAL: /* q_len > seq_len, and a request without keys */
        ql[0] = 5, sl[0] = 3, ql[1] = 2, sl[1] = 0, ql[2] = 3, sl[2] = cap - 3;
        break;
    case M_QLEN0:
        ql[1] = 0;
        break;
    case M_TREE:
        R = 2, ql[0] = 5, sl[0] = cap, ql[1] = 1, sl[1] = cap - 1;
        break;
    default:
        break;
    }
    hc_init(c, nm, R, ql, sl, B, Hkv, H, D, Dv, kHcFormats[f].dt, lay, kHcFormats[f].q,
            KVA_ATTN_MHA);
    switch (mask) {
    case M_MIXED: /* each request's last key hidden from its earlier rows */
        c->pd.decode_threshold = 3;
        hc_hide(c, 1, sl[1] - 1);
        hc_hide(c, 2, sl[2] - 1);
        hc_hide(c, 2, sl[2] - 2);
        break;
    case M_WINDOW: /* window 3 (B 1) or 100: key 0 outside every row's window */
        c->pd.window_left = B == 1 ? 3 : 100;
        hc_hide(c, 0, 0);
        hc_hide(c, 1, 0);
        hc_hide(c, 2, 0);
        break;
    case M_CHUNK: /* chunks of 3 (B 1) or 102 keys, soft-cap 5: the rows lie past chunk 0 */
        c->pd.attention_chunk = B == 1 ? 3 : 102;
        c->pd.softcap = 5.0f;
        hc_hide(c, 0, 0);
        hc_hide(c, 1, 0);
        hc_hide(c, 2, 0);
        break;
    case M_TREE: { /* parents -1 0 0 1 2: tokens 3 and 1 hidden from the others */
        const int32_t par[6] = {-1, 0, 0, 1, 2, -1};
        memcpy(c->tree, par, sizeof par);
        c->pd.tree_parents = c->tree;
        c->pd.decode_threshold = 5;
        hc_hide(c, 0, sl[0] - 5 + 3);
        hc_hide(c, 0, sl[0] - 5 + 1);
        break;
    }
    case M_ALIBI:
        c->pd.alibi_slopes = g_slopes;
        c->pd.softcap = 10.0f;
        hc_hide(c, 2, sl[2] - 1);
        break;
    case M_NONCAUSAL:
        c->pd.causal = 0;
        break;
    case M_QLEN0:
        c->pd.decode_threshold = 1;
        hc_hide(c, 2, sl[2] - 1);
        break;
    }
    hc_blocks(c);
}

static int hd_cases(hc_case *cs)
{
    int n = 0;
    for (int hi = 0; hi < HD_NH; hi++)
        for (int bi = 0; bi < 2; bi++) {
            const int k = 2 * hi + bi;
            hd_case(&cs[n++], hi, bi ? 160 : 1, k % M_COUNT, k);
        }
    return n;
}

/* Rows of got that differ from want beyond 2x the dtype tolerances (out) or
 * 1e-5 relative (lse), or were left unwritten; prints the first. */
static int hd_compare(const hc_case *c, const char *who, const void *got, const float *glse,
                      const void *want, const float *wlse)
{
    const kva_dtype dt = c->pd.q_dtype;
    const int32_t H = c->pd.num_heads, dv = hc_out_dim(c) / H;
    int bad = 0;
    for (int32_t t = 0; t < c->T; t++)
        for (int32_t h = 0; h < H; h++) {
            const size_t o = ((size_t)t * H + h) * dv;
            int ok = !kva_test_poisoned(glse, KVA_DTYPE_F32, (size_t)t * H + h);
            for (int32_t e = 0; e < dv && ok; e++) {
                const double g = kva_test_get(got, dt, o + e), w = kva_test_get(want, dt, o + e);
                ok = !kva_test_poisoned(got, dt, o + e) &&
                     fabs(g - w) <= 2 * (kva_test_atol(dt) + kva_test_rtol(dt) * fabs(w));
            }
            const double gl = glse[t * H + h], wl = wlse[t * H + h];
            ok &= gl == wl || fabs(gl - wl) <= 1e-5 * (1 + fabs(wl));
            if (ok)
                continue;
            if (!bad)
                fprintf(stderr, "  %s: %s: token %d head %d: out[0] %g (ref %g), lse %g (ref %g)\n",
                        c->name, who, t, h, kva_test_get(got, dt, o), kva_test_get(want, dt, o), gl,
                        wl);
            bad++;
        }
    return bad;
}

static void test_odd_heads(void)
{
    for (int h = 0; h < 64; h++)
        g_slopes[h] = 0.5f / (float)(1 + h % 8);
    static hc_case cs[HD_MAX_CASES];
    const int n = hd_cases(cs);
    CHECK(n <= HD_MAX_CASES);
    hc_variant vs[8 + KVA_TEST_MAX_KERNELS];
    const int nv = hc_variants(vs, 0);
    for (int i = 0; i < n; i++)
        hc_run_against_ref(&cs[i], vs, nv, hd_compare);
}

int main(void)
{
    RUN(test_odd_heads);
    return kva_test_finish();
}
