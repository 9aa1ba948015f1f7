/*
 * hidden_cases.h - the case list of the hidden-slot tests (hidden_util.h):
 * MHA / GQA caches of every format and both layouts, decodes (q_len 1),
 * speculative rows (q_len 3) and causal prefills; sliding window, local
 * chunks, a draft tree, a cascade over a shared prefix, non-causal rows, DCP
 * ranks, a q_len 0 request; MLA caches (f32, bf16, FP8) for the kernel-level
 * call and both paths of kva_mla_run; sparse MLA (bf16, FP8, fp8_ds_mla,
 * MIXED and SEPARATE). hc_cases fills at most HC_MAX_CASES.
 */
#ifndef KVA_TEST_HIDDEN_CASES_H
#define KVA_TEST_HIDDEN_CASES_H

#include "hidden_util.h"

enum { HC_MAX_CASES = 80 };

/* The case classes (the prefixes of hc_case names), one test function each
 * in both hidden-slot tests: HC_CLASSES(HC_CLASS_TEST) defines test_<fn>
 * calling the including file's run_class(prefix), HC_CLASSES(HC_CLASS_RUN)
 * runs them in main(). */
#define HC_CLASSES(X)                                                                              \
    X(mixed, "mixed")                                                                              \
    X(window, "window")                                                                            \
    X(chunk, "chunk")                                                                              \
    X(tree, "tree")                                                                                \
    X(noncausal, "noncausal")                                                                      \
    X(qlen0, "qlen0")                                                                              \
    X(dcp, "dcp")                                                                                  \
    X(cascade, "cascade")                                                                          \
    X(mla_kernel, "mla kernel")                                                                    \
    X(mla_run, "mla_run")                                                                          \
    X(sparse, "sparse")
#define HC_CLASS_TEST(fn, prefix)                                                                  \
    static void test_##fn(void)                                                                    \
    {                                                                                              \
        run_class(prefix);                                                                         \
    }
#define HC_CLASS_RUN(fn, prefix) RUN(test_##fn);

static inline void hc_hide(hc_case *c, int r, int32_t pos)
{
    c->hid[r][c->nhid[r]++] = pos;
}

/* The MHA formats: (dtype, quant). */
static const struct {
    kva_dtype dt;
    kva_quant q;
    const char *name;
} kHcFormats[] = {
    {KVA_DTYPE_F32, KVA_QUANT_NONE, "f32"},
    {KVA_DTYPE_F16, KVA_QUANT_NONE, "f16"},
    {KVA_DTYPE_BF16, KVA_QUANT_NONE, "bf16"},
    {KVA_DTYPE_I8, KVA_QUANT_INT8_CHANNEL, "c8"},
    {KVA_DTYPE_I8, KVA_QUANT_INT8_TOKEN_K, "int8_token_k"},
    {KVA_DTYPE_BF16, KVA_QUANT_INT8_TOKEN_K_V16, "int8_token_k_v16"},
    {KVA_DTYPE_FP8_E4M3, KVA_QUANT_FP8_E4M3, "fp8"},
};
enum { HC_NFMT = (int)(sizeof kHcFormats / sizeof kHcFormats[0]) };

/* cuda: the MLA cases at the CUDA backend's shapes (Dc 512, Dr 64, H 16,
 * Dn = Dv = 128; no f32 latent rows). */
static inline int hc_cases(hc_case *cs, int cuda)
{
    int n = 0;
    char nm[96];
    /* Mixed batches: a decode, three speculative rows, a causal prefill; the
     * last key (and the one before) of the multi-row requests hidden from
     * their earlier rows. Every format, both layouts, GQA 2:1 at D 64, B 16
     * (page tails of 5, 3 and 13 slots). */
    for (int f = 0; f < HC_NFMT; f++)
        for (int l = 0; l < 2; l++) {
            const int32_t ql[3] = {1, 3, 13}, sl[3] = {21, 19, 29};
            snprintf(nm, sizeof nm, "mixed %s %s", kHcFormats[f].name, l ? "HND" : "NHD");
            hc_case *c = &cs[n++];
            hc_init(c, nm, 3, ql, sl, 16, 2, 4, 64, 64, kHcFormats[f].dt, (kva_layout)l,
                    kHcFormats[f].q, KVA_ATTN_MHA);
            c->pd.decode_threshold = 3;
            hc_hide(c, 1, 18);
            hc_hide(c, 2, 28);
            hc_hide(c, 2, 27);
            hc_blocks(c);
        }
    /* The masks, each over three formats (16-bit, FP8, int8 per-token keys). */
    static const int kMaskFmt[3] = {2, 6, 4};
    for (int m = 0; m < 3; m++) {
        const int f = kMaskFmt[m];
        const kva_dtype dt = kHcFormats[f].dt;
        const kva_quant q = kHcFormats[f].q;
        const kva_layout lay = (kva_layout)(m % 2);
        hc_case *c;
        { /* sliding window 5: keys 0..3 lie outside every row's window */
            const int32_t ql[2] = {1, 8}, sl[2] = {37, 40};
            snprintf(nm, sizeof nm, "window %s", kHcFormats[f].name);
            c = &cs[n++];
            hc_init(c, nm, 2, ql, sl, 16, 1, 2, 32, 32, dt, lay, q, KVA_ATTN_MHA);
            c->pd.window_left = 5;
            for (int32_t j = 0; j < 4; j++)
                hc_hide(c, 0, j), hc_hide(c, 1, j);
            hc_blocks(c);
        }
        { /* local chunks of 16: key 20 (chunk 1) hidden from the rows of chunk 2 */
            const int32_t ql[2] = {10, 1}, sl[2] = {40, 45};
            snprintf(nm, sizeof nm, "chunk %s", kHcFormats[f].name);
            c = &cs[n++];
            hc_init(c, nm, 2, ql, sl, 16, 2, 4, 32, 32, dt, lay, q, KVA_ATTN_MHA);
            c->pd.attention_chunk = 16;
            hc_hide(c, 0, 20);
            hc_hide(c, 0, 39);
            hc_hide(c, 1, 20);
            hc_blocks(c);
        }
        { /* draft tree of 5 (parents -1 0 0 1 2): tokens 3 and 1 hidden from the others */
            const int32_t ql[2] = {5, 1}, sl[2] = {24, 19};
            snprintf(nm, sizeof nm, "tree %s", kHcFormats[f].name);
            c = &cs[n++];
            hc_init(c, nm, 2, ql, sl, 16, 2, 4, 32, 32, dt, lay, q, KVA_ATTN_MHA);
            const int32_t par[6] = {-1, 0, 0, 1, 2, -1};
            memcpy(c->tree, par, sizeof par);
            c->pd.tree_parents = c->tree;
            c->pd.decode_threshold = 5;
            hc_hide(c, 0, 19 + 3);
            hc_hide(c, 0, 19 + 1);
            hc_blocks(c);
        }
        { /* a tree of 4 (parents -1 0 0 1) as a decode item (one head per kv head) */
            const int32_t ql[2] = {4, 1}, sl[2] = {37, 20};
            snprintf(nm, sizeof nm, "tree decode %s", kHcFormats[f].name);
            c = &cs[n++];
            hc_init(c, nm, 2, ql, sl, 16, 2, 2, 32, 32, dt, lay, q, KVA_ATTN_MHA);
            const int32_t par[5] = {-1, 0, 0, 1, -1};
            memcpy(c->tree, par, sizeof par);
            c->pd.tree_parents = c->tree;
            c->pd.decode_threshold = 4;
            hc_hide(c, 0, 33 + 1); /* seen by rows 1 and 3 */
            hc_blocks(c);
        }
        { /* a tree of 12 as a prefill item: parents -1 0 1 .. with two branches */
            const int32_t ql[1] = {12}, sl[1] = {40};
            snprintf(nm, sizeof nm, "tree prefill %s", kHcFormats[f].name);
            c = &cs[n++];
            hc_init(c, nm, 1, ql, sl, 16, 1, 8, 32, 32, dt, lay, q, KVA_ATTN_MHA);
            const int32_t par[12] = {-1, 0, 1, 2, 3, 4, 0, 6, 7, 8, 9, 10};
            memcpy(c->tree, par, sizeof par);
            c->pd.tree_parents = c->tree;
            c->pd.decode_threshold = 1;
            hc_hide(c, 0, 28 + 2); /* first branch, seen by rows 2..5 */
            hc_hide(c, 0, 28 + 4);
            hc_blocks(c);
        }
        { /* non-causal rows (encoder / cross-attention), q_len > seq_len too */
            const int32_t ql[2] = {6, 9}, sl[2] = {21, 5};
            snprintf(nm, sizeof nm, "noncausal %s", kHcFormats[f].name);
            c = &cs[n++];
            hc_init(c, nm, 2, ql, sl, 16, 2, 2, 32, 32, dt, lay, q, KVA_ATTN_MHA);
            c->pd.causal = 0;
            hc_blocks(c);
        }
        { /* a q_len 0 request whose blocks were never written */
            const int32_t ql[3] = {2, 0, 7}, sl[3] = {18, 33, 23};
            snprintf(nm, sizeof nm, "qlen0 %s", kHcFormats[f].name);
            c = &cs[n++];
            hc_init(c, nm, 3, ql, sl, 16, 2, 4, 32, 32, dt, lay, q, KVA_ATTN_MHA);
            c->pd.decode_threshold = 2;
            hc_hide(c, 2, 22);
            hc_blocks(c); /* the writer skips q_len 0 requests: their blocks keep garbage */
        }
        /* DCP, 2 ranks, interleave 1 and 4, rank 1 and 0. */
        for (int rk = 0; rk < 2; rk++) {
            const int32_t ql[2] = {1, 9}, sl[2] = {27, 38};
            snprintf(nm, sizeof nm, "dcp rank %d %s", rk, kHcFormats[f].name);
            c = &cs[n++];
            hc_init(c, nm, 2, ql, sl, 4, 1, 2, 32, 32, dt, lay, q, KVA_ATTN_MHA);
            c->pd.dcp_size = 2;
            c->pd.dcp_rank = rk;
            c->pd.dcp_interleave = rk ? 4 : 1;
            hc_hide(c, 1, 37);
            hc_hide(c, 1, 36);
            hc_blocks(c);
        }
        { /* cascade: three requests share their first two blocks (32 keys) */
            const int32_t ql[3] = {1, 2, 4}, sl[3] = {45, 40, 38};
            snprintf(nm, sizeof nm, "cascade %s", kHcFormats[f].name);
            c = &cs[n++];
            hc_init(c, nm, 3, ql, sl, 16, 2, 4, 32, 32, dt, lay, q, KVA_ATTN_MHA);
            c->pd.cascade = KVA_CASCADE_ON;
            c->pd.decode_threshold = 1;
            hc_hide(c, 1, 39);
            hc_hide(c, 2, 37);
            hc_blocks(c);
            for (int r = 1; r < 3; r++)
                for (int k = 0; k < 2; k++)
                    c->bt[r * HC_MAXBT + k] = c->bt[k];
        }
    }
    /* MLA: Dc 128, Dr 16, H 4 (CUDA: Dc 512, Dr 64, H 16); decodes q 1 and
     * 2, a prefill of 9. */
    const int32_t Dc = cuda ? 512 : 128, Dr = cuda ? 64 : 16, Hm = cuda ? 16 : 4;
    static const struct {
        kva_dtype dt;
        kva_quant q;
        const char *name;
    } kMla[4] = {{KVA_DTYPE_F32, KVA_QUANT_NONE, "f32"},
                 {KVA_DTYPE_BF16, KVA_QUANT_NONE, "bf16"},
                 {KVA_DTYPE_FP8_E4M3, KVA_QUANT_FP8_E4M3, "fp8"},
                 {KVA_DTYPE_FP8_E4M3, KVA_QUANT_FP8_DS_MLA, "fp8_ds_mla"}};
    for (int f = 0; f < 4; f++)
        for (int api = 0; api < 3; api++) {
            if ((f == 3 && api != HC_SPARSE) || (cuda && f == 0))
                continue; /* fp8_ds_mla rows serve sparse plans only */
            const int32_t ql[3] = {1, 2, 9}, sl[3] = {21, 35, 25};
            const kva_dtype qdt = kMla[f].q == KVA_QUANT_NONE ? kMla[f].dt : KVA_DTYPE_BF16;
            for (int mode = 0; mode < (api == HC_SPARSE ? 2 : 1); mode++) {
                snprintf(nm, sizeof nm, "%s %s%s",
                         api == HC_ATTN      ? "mla kernel"
                         : api == HC_MLA_RUN ? "mla_run"
                                             : "sparse",
                         kMla[f].name, api == HC_SPARSE ? (mode ? " separate" : " mixed") : "");
                hc_case *c = &cs[n++];
                hc_init(c, nm, 3, ql, sl, 16, 1, Hm, Dc + Dr, Dc, kMla[f].dt, KVA_LAYOUT_NHD,
                        kMla[f].q, KVA_ATTN_MLA);
                c->api = api;
                c->pd.q_dtype = qdt;
                c->pd.scale = 0.08f;
                c->pd.decode_threshold = 2;
                if (api == HC_MLA_RUN)
                    c->pd.mla_qk_nope_head_dim = cuda ? 128 : 16,
                    c->pd.mla_v_head_dim = cuda ? 128 : 16;
                if (api == HC_SPARSE) {
                    /* K 8: token t lists 8 distinct positions of its request,
                     * never the hidden ones (0 and s - 1) and, for the last
                     * token, padding -1 in two entries. */
                    c->pd.sparse_topk = 8;
                    c->pd.sparse_mode = mode;
                    c->pd.causal = 0;
                    for (int r = 0; r < 3; r++) {
                        hc_hide(c, r, 0);
                        hc_hide(c, r, sl[r] - 1);
                        for (int32_t t = c->qsl[r]; t < c->qsl[r + 1]; t++)
                            for (int k = 0; k < 8; k++)
                                c->idx[t * 8 + k] = 1 + (int32_t)((t * 5 + k * 3) % (sl[r] - 2));
                    }
                    c->idx[(c->T - 1) * 8 + 6] = c->idx[(c->T - 1) * 8 + 7] = -1;
                } else {
                    hc_hide(c, 1, 34);
                    hc_hide(c, 2, 24);
                    hc_hide(c, 2, 23);
                }
                hc_blocks(c);
            }
        }
    return n;
}

#endif /* KVA_TEST_HIDDEN_CASES_H */
