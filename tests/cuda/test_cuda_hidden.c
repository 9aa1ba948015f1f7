/*
 * test_cuda_hidden.c - test_api_blackbox_hidden's cases on the CUDA backend:
 * garbage (NaN, +inf, -inf patterns of every format) in cache slots a row
 * never sees - page tails past seq_len, block-table entries past a
 * request's pages, the blocks of q_len 0 requests, keys the causal / window
 * / chunk / tree masks hide from some rows of a tile, keys a sparse index
 * list leaves out, the other DCP rank's keys - must not reach the row. Each
 * case is built on the host (hidden_run.h: storage filled, keys written,
 * hidden keys overwritten), uploaded to a device cache of the same desc
 * (cache_upload), and run twice on the same kernel: garbage and clean
 * (zeros); rows that see no overwritten key must agree up to rounding, out
 * and lse. Kernels: the dispatcher's choice, then every registry kernel
 * that runs here forced in turn (KVA_TEST_QUICK: the dispatcher's only);
 * each clean run prints what its plan runs (kva__cuda_plan: the work items'
 * kernel, the prefill tiles and their kernel), and a forced kernel the plan
 * does not run (another family's, plan_runs) is skipped and counted, so the
 * strict map below names kernels that ran, not kernels forced.
 * Cases the CUDA backend does not take (f32 caches, shapes outside its
 * range: KVA_STATUS_UNSUPPORTED at cache or plan creation; the sparse MLA
 * over an fp8_e4m3 latent cache, which it does not read: UNSUPPORTED from
 * the clean run, which must leave the outputs as they were - the only
 * refusal at the run that counts as not taken, known_refusal) are skipped
 * and counted. The MLA cases use DeepSeek's latent rows (Dc 512, Dr 64, H 16).
 * kvattn.h promises every backend that slots no row reads never reach an
 * output; a key inside seq_len that one row's mask hides but another row of
 * the request sees may reach the first on CUDA (its kernels add 0 * v,
 * docs/masks.md), so by default only the hidden keys no row sees are
 * overwritten; KVA_TEST_HIDDEN_STRICT=1 overwrites them all, as the host
 * test does (expected to fail on the kernels that add 0 * v: a map of them).
 * Exits 77 without a GPU. KVA_TEST_HIDDEN_CPU=1 runs the very same steps
 * with the CPU backend in place of the GPU (host buffers, its registry's
 * kernels): how the test itself was exercised on a machine without one.
 */
#include "cuda_standin.h"
#include "hidden_cases.h"
#include "hidden_run.h"
#include "../../src/attn/cuda/cuda_backend.h"

#ifdef KVA_HAVE_CUDA

enum { HC_MAX_GPU_KERNELS = 32 };

static void cache_copy(kva_cache *dst, const kva_cache *src)
{
    if (g_gpu) {
        cache_upload(dst, src);
        return;
    }
    void *sk, *sv, *dk, *dv;
    float *ss = NULL, *ds = NULL;
    kva_cache_data(src, &sk, &sv);
    kva_cache_data(dst, &dk, &dv);
    const size_t nb = (size_t)src->desc.num_blocks;
    memcpy(dk, sk, nb * kva_cache_block_bytes_k(src));
    if (kva_cache_block_bytes_v(src))
        memcpy(dv, sv, nb * kva_cache_block_bytes_v(src));
    kva_cache_token_scales(src, &ss);
    kva_cache_token_scales(dst, &ds);
    if (ss && ds)
        memcpy(ds, ss, nb * kva_cache_block_bytes_scales(src));
}

/* NULL (the dispatcher's choice), then every CUDA registry kernel that runs here. */
static int gpu_kernels(const char **v)
{
    int n = 0;
    v[n++] = NULL;
    if (kva_test_quick())
        return n;
    kva_context_desc gd = {standin_backend(), 1, 0};
    kva_context *gpu = NULL;
    if (kva_context_create(&gd, &gpu) != KVA_STATUS_OK)
        return n;
    int32_t nk = 0;
    const kva__kernel_info *k = kva__context_kernels(gpu, &nk);
    for (int32_t i = 0; i < nk && n < HC_MAX_GPU_KERNELS; i++)
        if (!k[i].usable || k[i].usable(gpu))
            v[n++] = k[i].name;
    kva_context_destroy(gpu);
    return n;
}

static int g_skipped, g_ran, g_not_run;

/* The runs refused at kva_*_run that the test knows: the CUDA sparse MLA
 * reads fp8_ds_mla and latent caches of q's dtype only (mla_sparse.cu,
 * kva__cuda_mla_sparse), so the cases "sparse fp8 mixed" and "sparse fp8
 * separate" (an FP8_E4M3 latent cache) get KVA_STATUS_UNSUPPORTED. Any other
 * refusal, or another status for these two, is a failure. */
static int known_refusal(const hc_case *c, kva_status rs)
{
    return c->api == HC_SPARSE && c->cd.quant == KVA_QUANT_FP8_E4M3 && rs == KVA_STATUS_UNSUPPORTED;
}

/* What the CUDA plan runs (plan introspection: kva__cuda_plan's work-item
 * kernel and prefill tiles), into s [n]; returns whether registry kernel
 * `forced` (NULL: the dispatcher's choice) is among them. A kernel forced on
 * a case it does not run (one of another family: an MLA kernel on an MHA
 * case, a prefill kernel on a batch without prefill tiles, a wgmma prefill
 * over a quantized cache, whose tiles only prefill_mma_sm80 reads) leaves the
 * plan's own kernels in place: that run would repeat the default's, so
 * run_case skips it and the strict map lists the kernels that ran. */
static int plan_runs(const kva_plan *plan, const hc_case *c, const char *forced, char *s, size_t n)
{
    const kva__cuda_plan *cp = (const kva__cuda_plan *)plan->device;
    static const char *tile_names[4] = {"auto", "mma", "wgmma", "wgmma_tma"};
    if (!cp) {
        /* A cascade plan keeps no record of its own (internal.h: its prefix
         * and suffix plans run the forced kernel as any plan does; that crashed
         * here first on the H200): every kernel is taken, as before the check. */
        snprintf(s, n, "%s", plan->cascade ? "cascade: its prefix and suffix plans" : "no record");
        return 1;
    }
    if (cp->decode_kernel < 0 || cp->decode_kernel >= KVA__CUDA_KERNELS) {
        snprintf(s, n, "decode kernel %d outside the registry", cp->decode_kernel);
        return 1;
    }
    const int pk = (int)cp->prefill_kernel;
    snprintf(s, n, "items %s, %d prefill tiles (%s%s)", kva__cuda_kernels[cp->decode_kernel].name,
             (int)cp->num_ptiles, pk >= 0 && pk < 4 ? tile_names[pk] : "?",
             cp->prefill_narrow ? ", narrow" : "");
    if (!forced)
        return 1;
    int k = -1;
    for (int i = 0; i < KVA__CUDA_KERNELS; i++)
        if (!strcmp(kva__cuda_kernels[i].name, forced))
            k = i;
    const int tiles = cp->num_ptiles > 0, quant = c->cd.quant != KVA_QUANT_NONE;
    switch (k) {
    case KVA__CUDA_K_DECODE_MMA:
    case KVA__CUDA_K_DECODE_SIMT:
    case KVA__CUDA_K_MLA_DECODE_MMA:
    case KVA__CUDA_K_MLA_DECODE_WGMMA:
        return cp->decode_kernel == k;
    case KVA__CUDA_K_PREFILL_MMA:
        return tiles && cp->prefill_kernel == KVA__CUDA_PREFILL_MMA;
    case KVA__CUDA_K_PREFILL_WGMMA:
    case KVA__CUDA_K_PREFILL_WGMMA_NARROW:
        return tiles && !quant && cp->prefill_kernel == KVA__CUDA_PREFILL_WGMMA &&
               cp->prefill_narrow == (k == KVA__CUDA_K_PREFILL_WGMMA_NARROW);
    case KVA__CUDA_K_PREFILL_WGMMA_TMA:
    case KVA__CUDA_K_PREFILL_WGMMA_TMA_NARROW:
        return tiles && !quant && cp->prefill_kernel == KVA__CUDA_PREFILL_WGMMA_TMA &&
               cp->prefill_narrow == (k == KVA__CUDA_K_PREFILL_WGMMA_TMA_NARROW);
    case KVA__CUDA_K_PREFILL_ITEMS:
        /* Prefills as work items: an MHA batch with prefills and no tiles
         * (forced, the plan has cp->mma 0; where the shape never has tiles
         * this repeats the default's run). */
        return !tiles && plan->info.num_prefills > 0 &&
               cp->decode_kernel != KVA__CUDA_K_MLA_DECODE_MMA &&
               cp->decode_kernel != KVA__CUDA_K_MLA_DECODE_WGMMA;
    default:
        return 0;
    }
}

/* One device run of case c with storage pattern pat (or zeros): out, lse
 * on the host. Returns 0 when the backend does not take the case, -1 (clean
 * run, GPU) when the forced kernel (NULL: none) is not one the plan runs. */
static int gpu_run(kva_context *gpu, kva_context *host, const hc_case *c, int pat,
                   const hc_inputs *din, void *out, float *lse, const char *forced)
{
    kva_cache *hc = hc_host_cache(host, c, pat);
    if (!hc)
        return 0;
    float buf[2 * 2 * 2 * 576 + 8];
    kva_quant_params qp;
    hc_params(&c->cd, buf, &qp);
    kva_cache *dc = NULL;
    const kva_status cs =
        kva_cache_create_quant(gpu, &c->cd, c->cd.quant == KVA_QUANT_NONE ? NULL : &qp, &dc);
    kva_plan *plan = NULL;
    const kva_status ps = cs == KVA_STATUS_OK ? kva_plan_create(gpu, &c->pd, &plan) : cs;
    int ran = 0;
    char what[160] = "";
    if (cs == KVA_STATUS_UNSUPPORTED || ps == KVA_STATUS_UNSUPPORTED ||
        cs == KVA_STATUS_DTYPE_MISMATCH || ps == KVA_STATUS_DTYPE_MISMATCH) {
        ran = 0;
    } else if (cs != KVA_STATUS_OK || ps != KVA_STATUS_OK) {
        CHECK_MSG(0, "%s: cache %s, plan %s (%s)", c->name, kva_status_name(cs),
                  kva_status_name(ps), kva_last_error());
    } else if (g_gpu && pat < 0 && !plan_runs(plan, c, forced, what, sizeof what)) {
        ran = -1;
    } else {
        if (g_gpu && pat < 0)
            printf("  %s: %s: %s\n", c->name, forced ? forced : "default", what);
        cache_copy(dc, hc);
        const size_t outb = (size_t)c->T * hc_out_dim(c) * kva_dtype_size(c->pd.q_dtype);
        const size_t lseb = (size_t)c->T * c->pd.num_heads * sizeof(float);
        void *dout = buf_poisoned(outb);
        float *dlse = buf_poisoned(lseb);
        const kva_status rs = hc_call(gpu, c, plan, din, dc, dout, dlse);
        buf_get(out, dout, outb);
        buf_get(lse, dlse, lseb);
        buf_free(dout);
        buf_free(dlse);
        if (pat < 0 && known_refusal(c, rs)) {
            /* Refused at the run (known_refusal): not taken, and the
             * outputs as they were (0xff bytes). */
            size_t touched = 0;
            for (size_t i = 0; i < outb; i++)
                touched += ((const unsigned char *)out)[i] != 0xff;
            for (size_t i = 0; i < lseb; i++)
                touched += ((const unsigned char *)lse)[i] != 0xff;
            CHECK_MSG(touched == 0, "%s: a run refused with %s wrote %zu output bytes", c->name,
                      kva_status_name(rs), touched);
        } else {
            CHECK_MSG(rs == KVA_STATUS_OK, "%s: run %s (%s)", c->name, kva_status_name(rs),
                      kva_last_error());
            ran = rs == KVA_STATUS_OK;
        }
    }
    kva_plan_destroy(plan);
    kva_cache_destroy(dc);
    kva_cache_destroy(hc);
    return ran;
}

static void run_case(const hc_case *c, const char **kern, int nk)
{
    const size_t es = kva_dtype_size(c->pd.q_dtype);
    const size_t outb = (size_t)c->T * hc_out_dim(c) * es;
    const size_t lseb = (size_t)c->T * c->pd.num_heads * sizeof(float);
    void *out_c = malloc(outb), *out_g = malloc(outb);
    float *lse_c = malloc(lseb), *lse_g = malloc(lseb);
    hc_inputs in, din;
    hc_inputs_make(c, &in);
    const kva_plan_desc *p = &c->pd;
    const int32_t Dr = p->head_dim - p->head_dim_v;
    const size_t nq =
        (size_t)c->T * p->num_heads *
        (c->api == HC_MLA_RUN ? (size_t)(p->mla_qk_nope_head_dim + Dr) : (size_t)p->head_dim);
    din.q = buf_from(in.q, nq * es);
    din.w_uk =
        c->api == HC_MLA_RUN
            ? buf_from(in.w_uk, (size_t)p->num_heads * p->mla_qk_nope_head_dim * p->head_dim_v * es)
            : NULL;
    din.w_uv =
        c->api == HC_MLA_RUN
            ? buf_from(in.w_uv, (size_t)p->num_heads * p->head_dim_v * p->mla_v_head_dim * es)
            : NULL;
    din.idx = c->api == HC_SPARSE
                  ? buf_from(c->idx, (size_t)c->T * p->sparse_topk * sizeof(int32_t))
                  : NULL;
    kva_context *host = new_ctx(KVA_BACKEND_REF, 1);
    int bad_runs = 0;
    for (int ki = 0; ki < nk; ki++) {
        kva_context_desc gd = {standin_backend(), 2, 0};
        kva_context *gpu = NULL;
        CHECK_OK(kva_context_create(&gd, &gpu));
        if (!gpu)
            break;
        if (kern[ki] && kva__context_force_kernel(gpu, kern[ki]) != KVA_STATUS_OK) {
            kva_context_destroy(gpu);
            continue;
        }
        const char *who = kern[ki] ? kern[ki] : "default";
        const int taken = gpu_run(gpu, host, c, -1, &din, out_c, lse_c, kern[ki]);
        if (taken < 0) { /* the forced kernel does not run this case (plan_runs) */
            g_not_run++;
            kva_context_destroy(gpu);
            continue;
        }
        if (!taken) {
            g_skipped += ki == 0;
            kva_context_destroy(gpu);
            break;
        }
        g_ran += ki == 0;
        for (int pat = 0; pat < HC_PATTERNS; pat++) {
            if (gpu_run(gpu, host, c, pat, &din, out_g, lse_g, kern[ki]) <= 0)
                continue;
            const int bad = hc_compare(c, who, pat, out_g, lse_g, out_c, lse_c);
            if (bad) {
                bad_runs++;
                fprintf(stderr, "  -> %s: %s %s: %d rows differ\n", c->name, g_gpu ? "cuda" : "cpu",
                        who, bad);
            }
        }
        kva_context_destroy(gpu);
    }
    CHECK_MSG(bad_runs == 0, "%s: %d runs (kernel x pattern) leak hidden slots", c->name, bad_runs);
    kva_context_destroy(host);
    buf_free(din.q);
    if (din.w_uk)
        buf_free(din.w_uk);
    if (din.w_uv)
        buf_free(din.w_uv);
    if (din.idx)
        buf_free(din.idx);
    hc_inputs_free(&in);
    free(out_c);
    free(out_g);
    free(lse_c);
    free(lse_g);
}

static void run_class(const char *prefix)
{
    static hc_case cs[HC_MAX_CASES];
    const int n = hc_cases(cs, 1);
    const char *kern[HC_MAX_GPU_KERNELS + 1];
    const int nk = gpu_kernels(kern);
    for (int i = 0; i < n; i++)
        if (!strncmp(cs[i].name, prefix, strlen(prefix)))
            run_case(&cs[i], kern, nk);
}

HC_CLASSES(HC_CLASS_TEST)

#endif /* KVA_HAVE_CUDA */

int main(void)
{
#ifdef KVA_HAVE_CUDA
    hc_all_hidden = getenv("KVA_TEST_HIDDEN_STRICT") != NULL;
    int skip = standin_start("KVA_TEST_HIDDEN_CPU");
#else
    int skip = cuda_test_skip();
#endif
    if (skip)
        return skip;
#ifdef KVA_HAVE_CUDA
    HC_CLASSES(HC_CLASS_RUN)
    printf("cases run on the %s: %d, not taken by its backend: %d; forced kernels the plan "
           "does not run (skipped): %d\n",
           g_gpu ? "GPU" : "CPU", g_ran, g_skipped, g_not_run);
    CHECK_MSG(g_ran > 0, "no case ran");
#endif
    return kva_test_finish();
}
