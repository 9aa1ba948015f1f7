/*
 * test_api_blackbox_blocks.c - block sizes 1 and non-powers of two (3, 5, 7)
 * with every mask and feature: kvattn_cache.h takes any B >= 1, and kvattn.h
 * promises the same attention whatever the paging, and that slots no row
 * reads may hold anything (NaN and infinities included). Each case (a mixed
 * batch, a sliding window, local chunks of B + 2 keys with a soft-cap, a
 * draft tree, ALiBi with a soft-cap, non-causal rows, a q_len 0 request,
 * a DCP rank, a cascade over two shared blocks; MLA's kernel-level call and
 * kva_mla_run) runs for every B over a format and layout that rotate with B
 * (the MHA and MLA formats of hidden_cases.h),
 * on the reference, the CPU backend as dispatched and at its portable ISA
 * level (and, without KVA_TEST_QUICK, at AVX2 / AVX-512 and with every CPU
 * kernel forced):
 *  - over a clean cache (zeros, the keys written), every row equals the
 *    reference's (2x the dtype tolerances of bench/data.h), outputs
 *    poisoned first;
 *  - over a cache whose whole storage first held NaN, +inf or -inf garbage,
 *    with keys that some rows do not see overwritten by non-finite rows,
 *    every row that sees none of them equals the clean run (hidden_run.h).
 * The hidden-slot test (test_api_blackbox_hidden.c) runs B 16 and 4 only.
 */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include "hidden_cases.h"
#include "hidden_run.h"
#include "hidden_variants.h"

enum { BB_MAX_CASES = 48 };

static const int32_t kBlockSizes[] = {1, 3, 5, 7};
enum { BB_NB = (int)(sizeof kBlockSizes / sizeof kBlockSizes[0]) };

/* ALiBi slopes of the alibi cases (H 4). */
static const float kSlopes[4] = {0.5f, 0.25f, 0.125f, 0.0625f};

/* A case over B's rotating format: fi picks the format, the layout alternates. */
static hc_case *bb_init(hc_case *cs, int *n, const char *what, int32_t B, int fi, int R,
                        const int32_t *ql, const int32_t *sl)
{
    char nm[96];
    const int f = fi % HC_NFMT;
    const kva_layout lay = (kva_layout)(fi % 2);
    snprintf(nm, sizeof nm, "%s B %d %s %s", what, B, kHcFormats[f].name, lay ? "HND" : "NHD");
    hc_case *c = &cs[(*n)++];
    hc_init(c, nm, R, ql, sl, B, 2, 4, 32, 32, kHcFormats[f].dt, lay, kHcFormats[f].q,
            KVA_ATTN_MHA);
    return c;
}

/* The cases of every block size; sequence lengths fit the HC_MAXBT blocks of
 * a request (cap = 8 B keys; a DCP rank holds about half of its keys). */
static int bb_cases(hc_case *cs)
{
    int n = 0;
    for (int bi = 0; bi < BB_NB; bi++) {
        const int32_t B = kBlockSizes[bi], cap = HC_MAXBT * B;
        int fi = bi;
        hc_case *c;
        { /* a decode, speculative rows and a prefill; each last key hidden from earlier rows */
            const int32_t ql[3] = {1, 3, 5}, sl[3] = {cap - 2, cap, cap - 1};
            c = bb_init(cs, &n, "mixed", B, fi++, 3, ql, sl);
            c->pd.decode_threshold = 3;
            hc_hide(c, 1, sl[1] - 1);
            hc_hide(c, 2, sl[2] - 1);
            hc_hide(c, 2, sl[2] - 2);
            hc_blocks(c);
        }
        { /* sliding window 2: key 0 lies outside every row's window */
            const int32_t ql[2] = {1, 4}, sl[2] = {cap, cap - 1};
            c = bb_init(cs, &n, "window", B, fi++, 2, ql, sl);
            c->pd.window_left = 2;
            hc_hide(c, 0, 0);
            hc_hide(c, 1, 0);
            hc_blocks(c);
        }
        { /* local chunks of B + 2 keys (never a multiple of B > 2), soft-cap 5: every row
           * lies past the first chunk */
            const int32_t ql[2] = {4, 1}, sl[2] = {cap, cap - 1};
            c = bb_init(cs, &n, "chunk", B, fi++, 2, ql, sl);
            c->pd.attention_chunk = B + 2;
            c->pd.softcap = 5.0f;
            hc_hide(c, 0, 0);
            hc_hide(c, 1, 0);
            hc_blocks(c);
        }
        { /* a draft tree of 5 (parents -1 0 0 1 2): tokens 3 and 1 hidden from the others */
            const int32_t ql[2] = {5, 1}, sl[2] = {cap, cap - 1};
            c = bb_init(cs, &n, "tree", B, fi++, 2, ql, sl);
            const int32_t par[6] = {-1, 0, 0, 1, 2, -1};
            memcpy(c->tree, par, sizeof par);
            c->pd.tree_parents = c->tree;
            c->pd.decode_threshold = 5;
            hc_hide(c, 0, sl[0] - 5 + 3);
            hc_hide(c, 0, sl[0] - 5 + 1);
            hc_blocks(c);
        }
        { /* ALiBi and soft-cap 10 */
            const int32_t ql[2] = {2, 6}, sl[2] = {cap - 1, cap};
            c = bb_init(cs, &n, "alibi", B, fi++, 2, ql, sl);
            c->pd.alibi_slopes = kSlopes;
            c->pd.softcap = 10.0f;
            hc_hide(c, 1, sl[1] - 1);
            hc_blocks(c);
        }
        { /* non-causal rows, q_len > seq_len too */
            const int32_t ql[2] = {3, 6}, sl[2] = {cap - 1, 4};
            c = bb_init(cs, &n, "noncausal", B, fi++, 2, ql, sl);
            c->pd.causal = 0;
            hc_blocks(c);
        }
        { /* a q_len 0 request whose blocks were never written */
            const int32_t ql[3] = {2, 0, 3}, sl[3] = {cap - 1, cap, cap - 2};
            c = bb_init(cs, &n, "qlen0", B, fi++, 3, ql, sl);
            c->pd.decode_threshold = 2;
            hc_hide(c, 2, sl[2] - 1);
            hc_blocks(c);
        }
        { /* DCP, 2 ranks: rank B % 2, interleave 1 (B 1, 5) or 2 (B 3, 7) */
            const int32_t ql[2] = {1, 5}, sl[2] = {cap + 1, cap + 2};
            c = bb_init(cs, &n, "dcp", B, fi++, 2, ql, sl);
            c->pd.dcp_size = 2;
            c->pd.dcp_rank = B % 2;
            c->pd.dcp_interleave = bi % 2 ? 2 : 1;
            hc_hide(c, 1, sl[1] - 1);
            hc_hide(c, 1, sl[1] - 2);
            hc_blocks(c);
        }
        { /* cascade: three requests share their first two blocks */
            const int32_t ql[3] = {1, 2, 3}, sl[3] = {cap - 1, cap, cap - 2};
            c = bb_init(cs, &n, "cascade", B, fi++, 3, ql, sl);
            c->pd.cascade = KVA_CASCADE_ON;
            c->pd.decode_threshold = 1;
            hc_hide(c, 1, sl[1] - 1);
            hc_hide(c, 2, sl[2] - 1);
            hc_blocks(c);
            for (int r = 1; r < 3; r++)
                for (int k = 0; k < 2; k++)
                    c->bt[r * HC_MAXBT + k] = c->bt[k];
        }
        /* MLA (Dc 128, Dr 16, H 4): the kernel-level call and kva_mla_run, latent rows
         * f32 / bf16 / FP8 rotating with B; each last key hidden from earlier rows. */
        static const struct {
            kva_dtype dt;
            kva_quant q;
            const char *name;
        } kMla[3] = {{KVA_DTYPE_F32, KVA_QUANT_NONE, "f32"},
                     {KVA_DTYPE_BF16, KVA_QUANT_NONE, "bf16"},
                     {KVA_DTYPE_FP8_E4M3, KVA_QUANT_FP8_E4M3, "fp8"}};
        for (int api = HC_ATTN; api <= HC_MLA_RUN; api++) {
            const int f = (bi + api) % 3;
            const int32_t ql[3] = {1, 2, 5}, sl[3] = {cap - 1, cap, cap - 2};
            char nm[96];
            snprintf(nm, sizeof nm, "%s B %d %s", api == HC_ATTN ? "mla kernel" : "mla_run", B,
                     kMla[f].name);
            c = &cs[n++];
            hc_init(c, nm, 3, ql, sl, B, 1, 4, 128 + 16, 128, kMla[f].dt, KVA_LAYOUT_NHD, kMla[f].q,
                    KVA_ATTN_MLA);
            c->api = api;
            c->pd.q_dtype = kMla[f].q == KVA_QUANT_NONE ? kMla[f].dt : KVA_DTYPE_BF16;
            c->pd.scale = 0.08f;
            c->pd.decode_threshold = 2;
            if (api == HC_MLA_RUN)
                c->pd.mla_qk_nope_head_dim = 16, c->pd.mla_v_head_dim = 16;
            hc_hide(c, 1, sl[1] - 1);
            hc_hide(c, 2, sl[2] - 1);
            hc_hide(c, 2, sl[2] - 2);
            hc_blocks(c);
        }
    }
    return n;
}

/* Rows of got that differ from want beyond 2x the dtype tolerances (out) or
 * 1e-5 relative (lse), MLA over 16-bit rows by bench/data.h's bf16-dot
 * bounds, or were left unwritten; prints the first. */
static int bb_compare(const hc_case *c, const char *who, const void *got, const float *glse,
                      const void *want, const float *wlse)
{
    const kva_dtype dt = c->pd.q_dtype;
    const int32_t H = c->pd.num_heads, dv = hc_out_dim(c) / H;
    /* MLA over 16-bit rows: the CPU's bf16 dot products round the absorbed
     * queries and P (bench/data.h's bounds); else the dtype tolerances. */
    const int lowp = c->cd.kind == KVA_ATTN_MLA && dt != KVA_DTYPE_F32;
    const double oat = lowp ? KVA_TEST_MLA_BF16DOT_ATOL : kva_test_atol(dt);
    int bad = 0;
    for (int32_t t = 0; t < c->T; t++)
        for (int32_t h = 0; h < H; h++) {
            const size_t o = ((size_t)t * H + h) * dv;
            int ok = !kva_test_poisoned(glse, KVA_DTYPE_F32, (size_t)t * H + h);
            for (int32_t e = 0; e < dv && ok; e++) {
                const double g = kva_test_get(got, dt, o + e), w = kva_test_get(want, dt, o + e);
                ok = !kva_test_poisoned(got, dt, o + e) &&
                     fabs(g - w) <= 2 * (oat + kva_test_rtol(dt) * fabs(w));
            }
            const double gl = glse[t * H + h], wl = wlse[t * H + h];
            const double ltol = lowp ? KVA_TEST_MLA_BF16DOT_LSE_ATOL : 1e-5 * (1 + fabs(wl));
            ok &= gl == wl || fabs(gl - wl) <= ltol;
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

static void test_block_sizes(void)
{
    static hc_case cs[BB_MAX_CASES];
    const int n = bb_cases(cs);
    CHECK(n <= BB_MAX_CASES);
    hc_variant vs[8 + KVA_TEST_MAX_KERNELS];
    const int nv = hc_variants(vs, 0);
    for (int i = 0; i < n; i++)
        hc_run_against_ref(&cs[i], vs, nv, bb_compare);
}

int main(void)
{
    RUN(test_block_sizes);
    return kva_test_finish();
}
