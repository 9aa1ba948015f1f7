/* bench_report.c - the aligned table and the JSON file of `kvattn bench`. */
#include "bench.h"
#include "cli.h"

#include <math.h>
#include <stdio.h>

/* "268.44 MB": decimal units (1 MB = 1e6 bytes, as GB/s is 1e9 bytes/s). */
static const char *fmt_bytes(char *buf, size_t n, double bytes)
{
    if (bytes >= 1e9)
        snprintf(buf, n, "%.3f GB", bytes / 1e9);
    else if (bytes >= 1e6)
        snprintf(buf, n, "%.2f MB", bytes / 1e6);
    else
        snprintf(buf, n, "%.2f KB", bytes / 1e3);
    return buf;
}

static const char *fmt_time(char *buf, size_t n, double s)
{
    if (s >= 1.0)
        snprintf(buf, n, "%.3f s", s);
    else if (s >= 1e-3)
        snprintf(buf, n, "%.3f ms", s * 1e3);
    else
        snprintf(buf, n, "%.2f us", s * 1e6);
    return buf;
}

static const char *fmt_flops(char *buf, size_t n, double flops)
{
    if (flops >= 1e12)
        snprintf(buf, n, "%.3f TFLOP", flops / 1e12);
    else if (flops >= 1e9)
        snprintf(buf, n, "%.3f GFLOP", flops / 1e9);
    else
        snprintf(buf, n, "%.3f MFLOP", flops / 1e6);
    return buf;
}

static void row(const char *metric, const char *value, const char *note)
{
    printf("  %-18s %-16s %s\n", metric, value, note ? note : "");
}

bench_roofline bench_roofline_of(const bench_counts *c, double read_bw, double fma_peak)
{
    bench_roofline rl = {0, 0, 0};
    if (fma_peak > 0 && c->flops > 0)
        rl.compute_gbps = fma_peak * c->kv_bytes / c->flops;
    if (read_bw > 0 && rl.compute_gbps > 0) {
        rl.compute_bound = rl.compute_gbps < read_bw;
        rl.bound_gbps = rl.compute_bound ? rl.compute_gbps : read_bw;
    }
    return rl;
}

void bench_report_print(const bench_opts *o, const bench_batch *b, const bench_result *r)
{
    char v[64], n[160], t[64];
    const kva_plan_info *pi = &r->info;
    printf("\n");
    char where[288];
    if (o->backend == KVA_BACKEND_CUDA)
        snprintf(where, sizeof where, "%s", r->device);
    else
        snprintf(where, sizeof where, "%d thread%s", (int)r->threads, r->threads == 1 ? "" : "s");
    printf("kvattn bench: %s%s, backend %s (%s), %s, layout %s, kv quant %s\n",
           bench_mode_name(o->mode), o->ragged ? " (ragged, no cache)" : "",
           kva_backend_name(o->backend), where, kva_dtype_name(o->dtype),
           o->layout == KVA_LAYOUT_NHD ? "nhd" : "hnd", kva_quant_name(o->kv_quant));
    printf("  %-18s R=%d T=%d H=%d Hkv=%d D=%d Dv=%d B=%d NB=%d\n", "shape", (int)b->num_requests,
           (int)b->num_tokens, (int)o->heads, (int)o->kv_heads, (int)o->head_dim,
           (int)o->head_dim_v, (int)o->block_size, (int)b->num_blocks);
    if (o->mode == BENCH_MIXED)
        printf("  %-18s %d decodes (q_len 1) + 1 chunk of %d tokens, each after %d cached tokens\n",
               "requests", (int)o->batch, (int)o->q_len, (int)o->context);
    else
        printf("  %-18s %d x (q_len %d after %d cached tokens)\n", "requests", (int)o->batch,
               (int)o->q_len, (int)o->context);
    printf("  %-18s causal=%d window_left=%d attention_chunk=%d tree=%s softcap=%g alibi=%d "
           "sinks=%d\n",
           "mask", (int)o->causal, (int)o->window, (int)o->chunk,
           o->tree == BENCH_TREE_CHAIN  ? "chain"
           : o->tree == BENCH_TREE_STAR ? "star"
           : o->tree                    ? "random"
                                        : "none",
           (double)o->softcap, o->alibi, o->sinks);
    if (o->variant)
        printf("  %-18s %s on the items of its family (--variant)\n", "kernel forced", o->variant);
    printf("  %-18s state %s, %d decodes (%d tokens), %d prefills (%d tokens), %d work items\n",
           "plan", kva_attn_state_name(pi->state), (int)pi->num_decodes, (int)pi->num_decode_tokens,
           (int)pi->num_prefills, (int)pi->num_prefill_tokens, (int)pi->num_work_items);
    if (r->check.done)
        printf("  %-18s max abs err %.3g, lse %.3g (%s) on %d of %d requests%s\n", "check",
               r->check.max_abs_err, r->check.max_lse_err, r->check.ok ? "ok" : "FAILED",
               (int)r->check.requests_checked, (int)b->num_requests,
               r->check.truncated ? " (causal prefixes)" : "");
    else
        printf("  %-18s skipped (%s)\n", "check",
               r->check.skip_reason ? r->check.skip_reason : "--no-check");
    printf("\n");

    printf("  %-18s %-16s %s\n", "metric", "value", "note");
    snprintf(n, sizeof n, "%d iters, min %s", (int)r->iters, fmt_time(t, sizeof t, r->min_s));
    row("attention median", fmt_time(v, sizeof v, r->median_s), n);
    row("KV bytes read", fmt_bytes(v, sizeof v, r->counts.kv_bytes),
        "K+V of visible keys, once per kv head");
    double gbps = r->median_s > 0 ? r->counts.kv_bytes / r->median_s / 1e9 : 0;
    snprintf(v, sizeof v, "%.2f GB/s", gbps);
    if (r->read_bw > 0 && o->backend == KVA_BACKEND_CUDA)
        snprintf(n, sizeof n, "%.1f%% of device copy %.2f GB/s (read + write, same run)",
                 100.0 * gbps / r->read_bw, r->read_bw);
    else if (r->read_bw > 0)
        snprintf(n, sizeof n, "%.1f%% of measured read bandwidth %.2f GB/s",
                 100.0 * gbps / r->read_bw, r->read_bw);
    else
        snprintf(n, sizeof n, "bandwidth ceiling not measured");
    row("bandwidth", v, n);
    if (r->paired_bw > 0) {
        snprintf(v, sizeof v, "%.1f%%", 100.0 * r->paired_frac);
        snprintf(n, sizeof n,
                 "of the read bandwidth, paired: median over %d runs (read passes %.2f GB/s)",
                 (int)r->iters, r->paired_bw);
        row("paired read", v, n);
    }
    if (r->read_bw_1t > 0) {
        snprintf(v, sizeof v, "%.2f GB/s", r->read_bw_1t);
        snprintf(n, sizeof n, "read bandwidth with 1 thread: %d threads read %.2fx as much",
                 (int)r->threads, r->read_bw / r->read_bw_1t);
        row("read, 1 thread", v, n);
    }
    row("FLOPs", fmt_flops(v, sizeof v, r->counts.flops),
        "2*D + 2*Dv per unmasked (query head, key)");
    double gflops = r->median_s > 0 ? r->counts.flops / r->median_s / 1e9 : 0;
    snprintf(v, sizeof v, "%.2f GFLOP/s", gflops);
    if (r->fma_peak > 0)
        snprintf(n, sizeof n, "%.1f%% of measured fp32 FMA peak %.1f GFLOP/s (%s)",
                 100.0 * gflops / r->fma_peak, r->fma_peak, r->peak_isa);
    else if (o->backend == KVA_BACKEND_CUDA)
        snprintf(n, sizeof n, "CUDA events, median of the runs");
    else
        snprintf(n, sizeof n, "FMA peak not measured");
    row("throughput", v, n);
    if (o->backend != KVA_BACKEND_CUDA) {
        const bench_roofline rl = bench_roofline_of(&r->counts, r->read_bw, r->fma_peak);
        if (rl.compute_gbps > 0) {
            snprintf(v, sizeof v, "%.2f GB/s", rl.compute_gbps);
            snprintf(n, sizeof n, "FMA peak x bytes / FLOPs (%.3g FLOP/byte)",
                     r->counts.flops / r->counts.kv_bytes);
            row("compute ceiling", v, n);
        }
        if (rl.bound_gbps > 0) {
            snprintf(v, sizeof v, "%.2f GB/s", rl.bound_gbps);
            snprintf(n, sizeof n, "%.1f%% of the roofline min(read, compute): %s-bound",
                     100.0 * gbps / rl.bound_gbps, rl.compute_bound ? "compute" : "memory");
            row("roofline", v, n);
        }
    }
    row("plan create", fmt_time(v, sizeof v, r->plan_s),
        o->backend == KVA_BACKEND_CUDA ? "median, host (partition + metadata upload)"
                                       : "median, host, once per step");
    if (!o->ragged) {
        snprintf(n, sizeof n, "median, %d new tokens (reshape_and_cache)", (int)b->num_tokens);
        row("cache write", fmt_time(v, sizeof v, r->write_s), n);
    }
    if (r->decodes_s > 0 && r->chunk_s > 0) {
        row("mixed (parts loop)", fmt_time(v, sizeof v, r->mixed_s),
            "median, timed round-robin with the two parts");
        row("decodes alone", fmt_time(v, sizeof v, r->decodes_s), "median, own plan, same cache");
        row("chunk alone", fmt_time(v, sizeof v, r->chunk_s), "median, own plan, same cache");
        const double sum = r->decodes_s + r->chunk_s;
        row("sum of parts", fmt_time(v, sizeof v, sum), "");
        snprintf(v, sizeof v, "%.3f", r->mixed_s / sum);
        row("mixed / parts", v, "the mixed step's median over the sum (<= 1: no penalty)");
    }
}

void bench_report_json_write(FILE *f, const bench_opts *o, const bench_result *r)
{
    const kva_plan_info *pi = &r->info;
    double gbps = r->median_s > 0 ? r->counts.kv_bytes / r->median_s / 1e9 : 0;
    double gflops = r->median_s > 0 ? r->counts.flops / r->median_s / 1e9 : 0;
    fprintf(f, "{\n");
    fprintf(f, "  \"version\": \"%s\",\n", kva_version());
    fprintf(f, "  \"mode\": \"%s\",\n  \"ragged\": %s,\n", bench_mode_name(o->mode),
            o->ragged ? "true" : "false");
    fprintf(f, "  \"backend\": \"%s\",\n  \"threads\": %d,\n", kva_backend_name(o->backend),
            (int)r->threads);
    if (o->backend == KVA_BACKEND_CUDA)
        fprintf(f, "  \"device\": \"%s\",\n  \"ceiling\": \"device copy, read + write\",\n",
                r->device);
    fprintf(f, "  \"dtype\": \"%s\",\n  \"layout\": \"%s\",\n", kva_dtype_name(o->dtype),
            o->layout == KVA_LAYOUT_NHD ? "nhd" : "hnd");
    fprintf(f, "  \"kv_quant\": \"%s\",\n", kva_quant_name(o->kv_quant));
    fprintf(f,
            "  \"shape\": {\"batch\": %d, \"requests\": %d, \"tokens\": %d, \"context\": %d, "
            "\"q_len\": %d, \"heads\": %d, \"kv_heads\": %d, \"head_dim\": %d, "
            "\"head_dim_v\": %d, \"block_size\": %d, \"num_blocks\": %d},\n",
            (int)o->batch, (int)r->num_requests, (int)r->num_tokens, (int)o->context, (int)o->q_len,
            (int)o->heads, (int)o->kv_heads, (int)o->head_dim, (int)o->head_dim_v,
            (int)o->block_size, (int)r->num_blocks);
    fprintf(f,
            "  \"mask\": {\"causal\": %d, \"window_left\": %d, \"attention_chunk\": %d, "
            "\"softcap\": %g, \"alibi\": %s, \"sinks\": %s},\n",
            (int)o->causal, (int)o->window, (int)o->chunk, (double)o->softcap,
            o->alibi ? "true" : "false", o->sinks ? "true" : "false");
    fprintf(f, "  \"variant\": \"%s\",\n", o->variant ? o->variant : "");
    fprintf(f,
            "  \"plan\": {\"state\": \"%s\", \"num_decodes\": %d, \"num_decode_tokens\": %d, "
            "\"num_prefills\": %d, \"num_prefill_tokens\": %d, \"num_work_items\": %d},\n",
            kva_attn_state_name(pi->state), (int)pi->num_decodes, (int)pi->num_decode_tokens,
            (int)pi->num_prefills, (int)pi->num_prefill_tokens, (int)pi->num_work_items);
    if (r->check.done)
        fprintf(f,
                "  \"check\": {\"done\": true, \"ok\": %s, \"max_abs_err\": %.6g, "
                "\"max_lse_err\": %.6g, \"requests_checked\": %d, \"tokens_checked\": %d, "
                "\"truncated\": %s},\n",
                r->check.ok ? "true" : "false", r->check.max_abs_err, r->check.max_lse_err,
                (int)r->check.requests_checked, (int)r->check.tokens_checked,
                r->check.truncated ? "true" : "false");
    else
        fprintf(f, "  \"check\": {\"done\": false},\n");
    fprintf(f, "  \"iters\": %d,\n  \"warmup\": %d,\n  \"seed\": %llu,\n", (int)r->iters,
            (int)o->warmup, (unsigned long long)o->seed);
    fprintf(f, "  \"median_ms\": %.6f,\n  \"min_ms\": %.6f,\n", r->median_s * 1e3, r->min_s * 1e3);
    fprintf(f, "  \"plan_create_ms\": %.6f,\n", r->plan_s * 1e3);
    if (!o->ragged)
        fprintf(f, "  \"cache_write_ms\": %.6f,\n", r->write_s * 1e3);
    fprintf(f, "  \"kv_bytes\": %.0f,\n  \"gbps\": %.4f,\n", r->counts.kv_bytes, gbps);
    fprintf(f, "  \"flops\": %.0f,\n  \"gflops\": %.4f,\n", r->counts.flops, gflops);
    fprintf(f, "  \"read_bw_gbps\": %.4f,\n", r->read_bw);
    if (r->paired_bw > 0)
        fprintf(f, "  \"paired_read_frac\": %.4f,\n  \"paired_read_bw_gbps\": %.4f,\n",
                r->paired_frac, r->paired_bw);
    if (o->backend != KVA_BACKEND_CUDA) {
        const bench_roofline rl = bench_roofline_of(&r->counts, r->read_bw, r->fma_peak);
        fprintf(f, "  \"read_bw_1t_gbps\": %.4f,\n", r->read_bw_1t);
        fprintf(f, "  \"compute_ceiling_gbps\": %.4f,\n  \"roofline_gbps\": %.4f,\n",
                rl.compute_gbps, rl.bound_gbps);
    }
    if (r->decodes_s > 0 && r->chunk_s > 0)
        fprintf(f,
                "  \"parts_mixed_ms\": %.6f,\n  \"decodes_ms\": %.6f,\n  \"chunk_ms\": %.6f,\n"
                "  \"mixed_over_parts\": %.4f,\n",
                r->mixed_s * 1e3, r->decodes_s * 1e3, r->chunk_s * 1e3,
                r->mixed_s / (r->decodes_s + r->chunk_s));
    fprintf(f, "  \"fma_peak_gflops\": %.4f,\n  \"fma_peak_isa\": \"%s\"\n", r->fma_peak,
            r->peak_isa ? r->peak_isa : "");
    fprintf(f, "}");
}

int bench_report_json(const char *path, const bench_opts *o, const bench_result *r)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return -1;
    bench_report_json_write(f, o, r);
    fprintf(f, "\n");
    return fclose(f) == 0 ? 0 : -1;
}
