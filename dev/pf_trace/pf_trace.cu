/*
 * pf_trace.cu - diagnostic, outside the library (dev/): where the sm_90a wgmma prefill's CTA
 * tiles spend their time (issue 23: the fixed per-tile cost of short prompts).
 *
 * Compiles the kernel body (src/attn/cuda/prefill_wgmma_kernel.cuh, renamed so it cannot clash
 * with the library's instantiations) with its KVA_WG_TRACE hook defined: one thread per
 * warpgroup records %globaltimer and clock64 at the phase boundaries of every CTA tile
 * (producer: 0 header built, 1 first free stage, 2 tile's copies issued; consumer: 3 tile
 * start, 4 Q in, 5 first K/V tile in, 6 first S done, 7 last P V done, 8 epilogue done, 9 next
 * Q issued, before the epilogue) into
 * a slot fixed by (tile, warpgroup, event), so recording takes no atomics. Runs it on a
 * synthetic causal batch (R prompts of Q tokens after C cached ones, H 32 / Hkv 8, D 128, bf16,
 * paged NHD B 16 with shuffled blocks, tiles in the plan's L2-section order), after the
 * library's kernel of the same shape on the same inputs, and checks that the two outputs are
 * equal bit for bit (the hook must not change what the kernel computes). Prints: kernel times
 * (library, traced), CTAs and tiles per CTA, per key-tile count the median cycles of each
 * consumer phase, the producer's waits, and how the CTAs' lifetimes spread.
 *
 * Usage: pf_trace R Q C NARROW [CSV]   (NARROW 1: the narrow tile shape; CSV: raw records;
 * PF_SCHED=1: the dynamic tile schedule, where the tree has it)
 * Build and run on the GPU machine: dev/pf_trace/run.sh (docs in that file).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <map>
#include <vector>

#include <cuda_runtime.h>

/* One record per (CTA tile, warpgroup, event). */
struct pf_rec {
    unsigned long long gt, clk; /* %globaltimer (ns), clock64 (SM cycles); gt 0: not recorded */
    int cta, sm, nkt, pad;      /* nkt: key tiles of the CTA tile (-1 before it is known) */
};
#define PF_EV 10           /* events per warpgroup */
#define PF_WG 3            /* warpgroups per CTA at most */
__device__ pf_rec *pf_buf; /* [tiles][PF_WG][PF_EV] */

static __device__ __forceinline__ void pf_record(int ev, int ti, int nkt)
{
    if ((threadIdx.x & 127) != 0)
        return;
    pf_rec r;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(r.gt));
    r.clk = (unsigned long long)clock64();
    unsigned sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    r.cta = (int)blockIdx.x;
    r.sm = (int)sm;
    r.nkt = nkt;
    r.pad = 0;
    pf_buf[((size_t)ti * PF_WG + (threadIdx.x >> 7)) * PF_EV + ev] = r;
}
#define KVA_WG_TRACE(ev, ti, nkt) pf_record((ev), (ti), (nkt))
#define prefill_wgmma_ws_kernel pf_trace_kernel
#include "prefill_wgmma_kernel.cuh"
#undef prefill_wgmma_ws_kernel

#define CK(x)                                                                                      \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));    \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)
#define KO(x)                                                                                      \
    do {                                                                                           \
        kva_status s_ = (x);                                                                       \
        if (s_ != KVA_STATUS_OK) {                                                                 \
            fprintf(stderr, "%s:%d: %s: status %d\n", __FILE__, __LINE__, #x, (int)s_);            \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

/* Uniform bf16 in [-1, 1) from a hash of the index and a seed. */
static __global__ void pf_fill(uint16_t *p, size_t n, uint32_t seed)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        uint32_t x = (uint32_t)i * 2654435761u ^ seed;
        x ^= x >> 15;
        x *= 2246822519u;
        x ^= x >> 13;
        const float f = (float)(x >> 8) * (2.0f / 16777216.0f) - 1.0f;
        p[i] = __bfloat16_as_ushort(__float2bfloat16(f));
    }
}

static double median(std::vector<double> v)
{
    if (v.empty())
        return 0.0;
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

/* a.sched = p where the tree's kva__cuda_prefill_args has the dynamic tile
 * schedule's counters (PF_SCHED=1), nothing on older trees. */
template <typename T> static auto set_sched(T &a, int32_t *p, int) -> decltype(a.sched = p, void())
{
    a.sched = p;
}
template <typename T> static void set_sched(T &, int32_t *, long) {}

int main(int argc, char **argv)
{
    if (argc < 5) {
        fprintf(stderr, "usage: pf_trace R Q C NARROW [CSV]\n");
        return 2;
    }
    const int R = atoi(argv[1]), Q = atoi(argv[2]), C = atoi(argv[3]), narrow = atoi(argv[4]);
    const int H = 32, Hkv = 8, D = 128, B = 16;
    const int S = Q + C, bpr = (S + B - 1) / B, NB = R * bpr + 1, T = R * Q;
    std::vector<int32_t> qsl(R + 1), sl(R), bt((size_t)R * bpr), perm(NB);
    for (int r = 0; r <= R; r++)
        qsl[r] = r * Q;
    for (int r = 0; r < R; r++)
        sl[r] = S;
    for (int i = 0; i < NB; i++)
        perm[i] = i;
    uint64_t st = 88172645463325252ull; /* xorshift: shuffled block ids */
    for (int i = NB - 1; i > 0; i--) {
        st ^= st << 13, st ^= st >> 7, st ^= st << 17;
        std::swap(perm[i], perm[(int)(st % (uint64_t)(i + 1))]);
    }
    for (size_t i = 0; i < bt.size(); i++)
        bt[i] = perm[i];
    const int64_t count = kva__cuda_prefill_tiles_count_subset(R, qsl.data(), NULL, H, Hkv);
    std::vector<int32_t> tiles((size_t)count * KVA__CUDA_PREFILL_TILE_INTS);
    std::vector<uint8_t> use(R, 1);
    int32_t nt = 0;
    /* The plan's order: L2 sections of 16 MiB of K/V (cuda_meta.cu). */
    KO(kva__cuda_prefill_tiles_build_sections(R, qsl.data(), sl.data(), use.data(), H, Hkv, 1, -1,
                                              0, (16 << 20) / (2 * D * 2), tiles.data(),
                                              (int32_t)count, &nt));
    const size_t nq = (size_t)T * H * D, nkv = (size_t)NB * B * Hkv * D;
    uint16_t *q, *k, *v, *out;
    int32_t *d_qsl, *d_sl, *d_bt, *d_tiles, *d_nt;
    CK(cudaMalloc(&q, nq * 2));
    CK(cudaMalloc(&k, nkv * 2));
    CK(cudaMalloc(&v, nkv * 2));
    CK(cudaMalloc(&out, nq * 2));
    CK(cudaMalloc(&d_qsl, sizeof(int32_t) * (R + 1)));
    CK(cudaMalloc(&d_sl, sizeof(int32_t) * R));
    CK(cudaMalloc(&d_bt, sizeof(int32_t) * bt.size()));
    CK(cudaMalloc(&d_tiles, sizeof(int32_t) * tiles.size()));
    CK(cudaMalloc(&d_nt, sizeof(int32_t)));
    pf_fill<<<1024, 256>>>(q, nq, 1u);
    pf_fill<<<1024, 256>>>(k, nkv, 2u);
    pf_fill<<<1024, 256>>>(v, nkv, 3u);
    CK(cudaMemcpy(d_qsl, qsl.data(), sizeof(int32_t) * (R + 1), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_sl, sl.data(), sizeof(int32_t) * R, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_bt, bt.data(), sizeof(int32_t) * bt.size(), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_tiles, tiles.data(), sizeof(int32_t) * tiles.size(), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_nt, &nt, sizeof nt, cudaMemcpyHostToDevice));

    kva__cuda_prefill_args a;
    memset(&a, 0, sizeof a);
    a.q = q;
    a.k = k;
    a.v = v;
    a.out = out;
    a.query_start_loc = d_qsl;
    a.seq_lens = d_sl;
    a.block_table = d_bt;
    a.tiles = d_tiles;
    a.num_tiles = d_nt;
    a.grid_tiles = nt;
    a.block_table_stride = bpr;
    a.block_size = B;
    a.num_blocks = NB;
    a.num_heads = H;
    a.num_kv_heads = Hkv;
    a.head_dim = D;
    a.head_dim_v = D;
    a.dtype = KVA_DTYPE_BF16;
    a.layout = KVA_LAYOUT_NHD;
    a.causal = 1;
    a.window_left = -1;
    a.narrow = narrow;
    const char *sch = getenv("PF_SCHED");
    int32_t *d_sched = NULL;
    if (sch && atoi(sch)) {
        CK(cudaMalloc(&d_sched, 2 * sizeof(int32_t)));
        CK(cudaMemset(d_sched, 0, 2 * sizeof(int32_t)));
        set_sched(a, d_sched, 0);
    }

    const int split = narrow ? 2 : 1, nslots = nt * split * PF_WG * PF_EV;
    pf_rec *buf;
    CK(cudaMalloc(&buf, sizeof(pf_rec) * (size_t)nslots));
    CK(cudaMemcpyToSymbol(pf_buf, &buf, sizeof buf));
    std::vector<uint16_t> ref(nq), got(nq);
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    float ms_lib = 0.0f, ms_tr = 0.0f;
    std::vector<double> lib_ms;
    for (int rep = 0; rep < 25; rep++) { /* the library kernel: median of runs 5..24 */
        CK(cudaMemset(out, 0xff, nq * 2));
        CK(cudaEventRecord(e0));
        KO(kva__cuda_prefill_launch_kernel(&a, NULL, KVA__CUDA_PREFILL_WGMMA_TMA));
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        CK(cudaEventElapsedTime(&ms_lib, e0, e1));
        if (rep >= 5)
            lib_ms.push_back(ms_lib);
    }
    ms_lib = (float)median(lib_ms);
    CK(cudaMemcpy(ref.data(), out, nq * 2, cudaMemcpyDeviceToHost));
    for (int rep = 0; rep < 5; rep++) {
        CK(cudaMemset(out, 0xff, nq * 2));
        CK(cudaMemset(buf, 0, sizeof(pf_rec) * (size_t)nslots));
        CK(cudaEventRecord(e0));
        if (narrow)
            KO((launch_ws<true, true, kva__mma_bf16, 128, 128, 1, 64, 3>(&a, 0)));
        else
            KO((launch_ws<true, true, kva__mma_bf16, 128, 128, 2, 128, 0>(&a, 0)));
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        CK(cudaEventElapsedTime(&ms_tr, e0, e1));
    }
    CK(cudaMemcpy(got.data(), out, nq * 2, cudaMemcpyDeviceToHost));
    size_t diff = 0;
    for (size_t i = 0; i < nq; i++)
        diff += ref[i] != got[i];
    std::vector<pf_rec> rec((size_t)nslots);
    CK(cudaMemcpy(rec.data(), buf, sizeof(pf_rec) * (size_t)nslots, cudaMemcpyDeviceToHost));
    const double flop = 4.0 * D * H * ((double)R * Q * (Q + 1) / 2 + (double)R * Q * C);
    printf("pf_trace %dx%d+%d %s: library kernel %.4f ms (%.1f TFLOP/s), traced %.4f ms; outputs "
           "%s (%zu of %zu elements differ)\n",
           R, Q, C, narrow ? "narrow" : "wide", ms_lib, flop / ms_lib / 1e9, ms_tr,
           diff ? "DIFFER" : "equal", diff, nq);

    /* Every CTA tile's consumer phases (cycles), by key-tile count. */
    const int ntl = nt * split, ncw = narrow ? 1 : 2;
    unsigned long long g0 = ~0ull, g1 = 0;
    std::map<int, std::vector<double>> ph[7];
    std::map<int, std::vector<double>> cta_first, cta_last, cta_tiles;
    std::vector<double> p_wait, p_issue;
    double ns_per_clk_sum = 0.0;
    int ns_per_clk_n = 0, missing = 0;
    for (int ti = 0; ti < ntl; ti++) {
        for (int w = 1; w <= ncw; w++) {
            const pf_rec *e = &rec[((size_t)ti * PF_WG + w) * PF_EV];
            if (!e[3].gt || !e[4].gt || !e[8].gt) {
                missing++;
                continue;
            }
            const int nk = e[4].nkt;
            g0 = std::min(g0, e[3].gt);
            g1 = std::max(g1, e[8].gt);
            ph[0][nk].push_back((double)(e[4].clk - e[3].clk)); /* Q wait + context */
            if (nk > 0 && e[5].gt && e[6].gt && e[7].gt) {
                ph[1][nk].push_back((double)(e[5].clk - e[4].clk)); /* first K/V wait */
                ph[2][nk].push_back((double)(e[6].clk - e[5].clk)); /* first S */
                ph[3][nk].push_back((double)(e[7].clk - e[6].clk)); /* softmaxes, rest, last P V */
            }
            ph[4][nk].push_back((double)(e[8].clk - (nk > 0 ? e[7].clk : e[4].clk))); /* epilogue */
            if (e[9].gt) /* of which: next header and Q load issue */
                ph[6][nk].push_back((double)(e[9].clk - (nk > 0 ? e[7].clk : e[4].clk)));
            ph[5][nk].push_back((double)(e[8].clk - e[3].clk)); /* all */
            if (e[8].clk > e[3].clk) {
                ns_per_clk_sum += (double)(e[8].gt - e[3].gt) / (double)(e[8].clk - e[3].clk);
                ns_per_clk_n++;
            }
            const int cta = e[3].cta;
            cta_first[cta].push_back((double)e[3].gt);
            cta_last[cta].push_back((double)e[8].gt);
            cta_tiles[cta].push_back(1.0);
        }
        const pf_rec *p = &rec[(size_t)ti * PF_WG * PF_EV];
        if (p[0].gt && p[1].gt && p[2].gt && p[0].nkt > 0) {
            p_wait.push_back((double)(p[1].clk - p[0].clk));
            p_issue.push_back((double)(p[2].clk - p[1].clk));
        }
    }
    printf("  CTA tiles %d (%d consumer records missing), CTAs %zu, span %.1f us, ns per cycle "
           "%.3f\n",
           ntl, missing, cta_tiles.size(), (double)(g1 - g0) / 1e3,
           ns_per_clk_n ? ns_per_clk_sum / ns_per_clk_n : 0.0);
    printf("  consumer phases, median cycles per CTA tile (n: CTA tiles of that many key tiles)\n");
    printf("  keys  n      Q+ctx  KV0wait  S0      rest    epilog  (nextQ) total\n");
    for (auto &kv : ph[5]) {
        const int nk = kv.first;
        printf("  %-5d %-6zu %-6.0f %-8.0f %-7.0f %-7.0f %-7.0f %-7.0f %-7.0f\n", nk,
               kv.second.size(), median(ph[0][nk]), median(ph[1][nk]), median(ph[2][nk]),
               median(ph[3][nk]), median(ph[4][nk]), median(ph[6][nk]), median(kv.second));
    }
    printf("  producer: median cycles from header to first free stage %.0f, then to the tile's "
           "last copy issued %.0f\n",
           median(p_wait), median(p_issue));
    std::vector<double> life, start, ntile;
    for (auto &kv : cta_first) {
        const double f = *std::min_element(kv.second.begin(), kv.second.end());
        const double l = *std::max_element(cta_last[kv.first].begin(), cta_last[kv.first].end());
        life.push_back((l - f) / 1e3);
        start.push_back((f - (double)g0) / 1e3);
        ntile.push_back((double)cta_tiles[kv.first].size());
    }
    std::sort(life.begin(), life.end());
    std::sort(start.begin(), start.end());
    std::sort(ntile.begin(), ntile.end());
    if (!life.empty())
        printf("  per CTA: tiles min/median/max %.0f/%.0f/%.0f; lifetime us min/median/max "
               "%.1f/%.1f/%.1f; first tile starts after us median/max %.1f/%.1f\n",
               ntile.front(), median(ntile), ntile.back(), life.front(), median(life), life.back(),
               median(start), start.back());
    if (argc > 5) {
        FILE *f = fopen(argv[5], "w");
        if (f) {
            fprintf(f, "tile,wg,ev,cta,sm,nkt,gt,clk\n");
            for (int ti = 0; ti < ntl; ti++)
                for (int w = 0; w < PF_WG; w++)
                    for (int ev = 0; ev < PF_EV; ev++) {
                        const pf_rec &r = rec[((size_t)ti * PF_WG + w) * PF_EV + ev];
                        if (r.gt)
                            fprintf(f, "%d,%d,%d,%d,%d,%d,%llu,%llu\n", ti, w, ev, r.cta, r.sm,
                                    r.nkt, r.gt, r.clk);
                    }
            fclose(f);
        }
    }
    return diff ? 1 : 0;
}
