/*
 * bench_sweep.c - `kvattn bench --sweep SET`: the shapes of the issue's speed
 * targets, one table row each, with a progress line on stderr.
 *
 *   decode:  H/Hkv in {8/8, 32/8, 64/8} x context {4k, 16k, 32k} x batch {1, 16, 64}
 *   prefill: 1k, 2k, 4k prompts, causal, GQA 4 (H=32, Hkv=8)
 *   mixed:   decodes + one chunked prefill, with the decodes alone and the
 *            chunk alone timed too (mixed / parts)
 *
 * D, B, dtype, layout, masks, threads, iterations, variant and --no-check
 * come from the command line; the shape flags are ignored. The machine's
 * ceilings are measured once, before the first shape.
 */
#include "bench.h"
#include "cli.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

int bench_sweep_parse(const char *val, int *set)
{
    static const char *const names[] = {"decode", "prefill", "mixed", "all"};
    static const int sets[] = {SWEEP_DECODE, SWEEP_PREFILL, SWEEP_MIXED, SWEEP_ALL};
    int k = 0;
    if (!kva_cli_parse_choice("--sweep", val, names, 4, &k))
        return 0;
    *set = sets[k];
    return 1;
}

/* One shape of the sweep. */
typedef struct sweep_shape {
    bench_mode mode;
    int32_t batch, context, q_len, heads, kv_heads;
} sweep_shape;

/* Fills shapes (at most cap) for the set; returns how many. */
static int sweep_shapes(int set, sweep_shape *sh, int cap)
{
    static const int32_t hh[3][2] = {{8, 8}, {32, 8}, {64, 8}};
    static const int32_t ctx[3] = {4096, 16384, 32768};
    static const int32_t bat[3] = {1, 16, 64};
    static const int32_t pre[3] = {1024, 2048, 4096};
    /* Mixed: decodes, context of every request, chunk length. */
    static const int32_t mix[2][3] = {{16, 4096, 512}, {64, 2048, 1024}};
    int n = 0;
    if (set & SWEEP_DECODE)
        for (int h = 0; h < 3; h++)
            for (int c = 0; c < 3; c++)
                for (int b = 0; b < 3 && n < cap; b++)
                    sh[n++] = (sweep_shape){BENCH_DECODE, bat[b], ctx[c], 1, hh[h][0], hh[h][1]};
    if (set & SWEEP_PREFILL)
        for (int p = 0; p < 3 && n < cap; p++)
            sh[n++] = (sweep_shape){BENCH_PREFILL, 1, 0, pre[p], 32, 8};
    if (set & SWEEP_MIXED)
        for (int m = 0; m < 2 && n < cap; m++)
            sh[n++] = (sweep_shape){BENCH_MIXED, mix[m][0], mix[m][1], mix[m][2], 32, 8};
    return n;
}

static const char *set_name(int set)
{
    return set == SWEEP_DECODE    ? "decode"
           : set == SWEEP_PREFILL ? "prefill"
           : set == SWEEP_MIXED   ? "mixed"
                                  : "all";
}

int bench_sweep(const bench_opts *base)
{
    sweep_shape sh[64];
    const int n = sweep_shapes(base->sweep, sh, 64);
    const int tty = isatty(fileno(stderr));
    FILE *json = NULL;
    if (base->json && !(json = fopen(base->json, "w"))) {
        fprintf(stderr, "kvattn: cannot write --json file '%s'\n", base->json);
        return KVA_EXIT_LIBRARY;
    }

    /* Ceilings once, with the thread count the shapes will use. */
    double bw = 0, peak = 0;
    const char *isa = "";
    int threads = base->threads;
    if (threads == 0) {
        kva_context *ctx = NULL;
        kva_context_desc cd = {base->backend, 0, 0};
        if (kva_context_create(&cd, &ctx) == KVA_STATUS_OK)
            threads = kva_context_num_threads(ctx);
        kva_context_destroy(ctx);
    }
    if (!base->no_ceiling) {
        fprintf(stderr,
                "kvattn bench --sweep: measuring read bandwidth and FMA peak (%d threads)\n",
                threads);
        bw = kva_cli_measure_read_bw(threads);
        peak = kva_cli_measure_fma_peak(threads, &isa);
    }
    printf("kvattn bench --sweep %s: backend %s, %d threads, %s, D=%d, B=%d, layout %s\n",
           set_name(base->sweep), kva_backend_name(base->backend), threads,
           kva_dtype_name(base->dtype), (int)base->head_dim, (int)base->block_size,
           base->layout == KVA_LAYOUT_NHD ? "nhd" : "hnd");
    if (!base->no_ceiling)
        printf("ceilings: read bandwidth %.2f GB/s, fp32 FMA peak %.1f GFLOP/s (%s)\n", bw, peak,
               isa);
    printf("%-8s %5s %7s %6s %7s %10s %9s %6s %10s %6s %6s %5s %s\n", "mode", "R", "context",
           "q_len", "H/Hkv", "median ms", "GB/s", "%bw", "GFLOP/s", "%peak", "%roof", "check",
           "mixed/parts");
    fflush(stdout);
    if (json)
        fprintf(json,
                "{\n\"sweep\": \"%s\",\n\"threads\": %d,\n\"read_bw_gbps\": %.4f,\n"
                "\"fma_peak_gflops\": %.4f,\n\"fma_peak_isa\": \"%s\",\n\"shapes\": [\n",
                set_name(base->sweep), threads, bw, peak, isa);

    int rc = KVA_EXIT_OK;
    double t_start = kva_cli_now();
    for (int i = 0; i < n; i++) {
        bench_opts o = *base;
        o.sweep = SWEEP_NONE;
        o.quiet = 1;
        o.json = NULL;
        o.no_ceiling = 1;
        o.paired = 0; /* the sweep measures its ceilings once, before the shapes */
        o.mode = sh[i].mode;
        o.batch = sh[i].batch;
        o.context = sh[i].context;
        o.q_len = sh[i].q_len;
        o.heads = sh[i].heads;
        o.kv_heads = sh[i].kv_heads;
        o.parts = o.mode == BENCH_MIXED;
        fprintf(stderr, "%s[%d/%d] %s R=%d context=%d q_len=%d H=%d Hkv=%d (%.0f s elapsed)%s",
                tty ? "\r\033[K" : "", i + 1, n, bench_mode_name(o.mode), (int)o.batch,
                (int)o.context, (int)o.q_len, (int)o.heads, (int)o.kv_heads,
                kva_cli_now() - t_start, tty ? "" : "\n");
        bench_result r;
        int src = bench_run_shape(&o, &r);
        if (src != KVA_EXIT_OK) {
            printf("%-8s %5d %7d %6d %3d/%-3d failed (exit status %d, see stderr)\n",
                   bench_mode_name(o.mode), (int)o.batch, (int)o.context, (int)o.q_len,
                   (int)o.heads, (int)o.kv_heads, src);
            rc = src;
            continue;
        }
        r.read_bw = bw;
        r.fma_peak = peak;
        r.peak_isa = isa;
        const double gbps = r.counts.kv_bytes / r.median_s / 1e9;
        const double gflops = r.counts.flops / r.median_s / 1e9;
        char mixed[32] = "";
        if (r.decodes_s > 0 && r.chunk_s > 0)
            snprintf(mixed, sizeof mixed, "%.3f", r.mixed_s / (r.decodes_s + r.chunk_s));
        if (tty)
            fprintf(stderr, "\r\033[K");
        char pbw[16] = "-", ppk[16] = "-", prf[16] = "-";
        const bench_roofline rl = bench_roofline_of(&r.counts, bw, peak);
        if (rl.bound_gbps > 0)
            snprintf(prf, sizeof prf, "%.1f%%", 100.0 * gbps / rl.bound_gbps);
        if (bw > 0)
            snprintf(pbw, sizeof pbw, "%.1f%%", 100.0 * gbps / bw);
        if (peak > 0)
            snprintf(ppk, sizeof ppk, "%.1f%%", 100.0 * gflops / peak);
        printf("%-8s %5d %7d %6d %3d/%-3d %10.3f %9.2f %6s %10.2f %6s %6s %5s %s\n",
               bench_mode_name(o.mode), (int)o.batch, (int)o.context, (int)o.q_len, (int)o.heads,
               (int)o.kv_heads, r.median_s * 1e3, gbps, pbw, gflops, ppk, prf,
               r.check.done ? (r.check.ok ? "ok" : "FAIL") : "-", mixed);
        fflush(stdout);
        if (json) {
            bench_report_json_write(json, &o, &r);
            fprintf(json, "%s\n", i + 1 < n ? "," : "");
        }
    }
    fprintf(stderr, "%skvattn bench --sweep: %d shapes in %.0f s\n", tty ? "\r\033[K" : "", n,
            kva_cli_now() - t_start);
    if (json) {
        fprintf(json, "]\n}\n");
        if (fclose(json) != 0) {
            fprintf(stderr, "kvattn: cannot write --json file '%s'\n", base->json);
            return KVA_EXIT_LIBRARY;
        }
    }
    return rc;
}
