#!/usr/bin/env python3
"""Peer comparison on the CPU: kvattn vs PyTorch's scaled_dot_product_attention.

Times torch.nn.functional.scaled_dot_product_attention on the CPU (contiguous
K/V, [batch, heads, tokens, D]) and `kvattn bench` (paged K/V in a block cache
with shuffled block tables) on the same shapes, dtypes and thread count, and
prints per shape: ours ms, torch ms, and torch / ours (> 1: kvattn is faster).

Shapes (H=32 query heads, Hkv=8 kv heads, D=128 unless given):
  prefill N   one causal prompt of N tokens, no cached context
  decode R C  R requests of one new token after C cached tokens
GQA: torch gets enable_gqa=True when this torch supports it; otherwise K/V are
expanded with repeat_interleave *before* timing (torch is not charged for it).
Both sides report the median of their timed runs, or with --stat min the
fastest run (on a shared, noisy machine the least disturbed one), after the
same number of warm-up runs, with the same thread count (torch.set_num_threads
and `kvattn bench --threads`). With --rounds N the two sides alternate N
times per shape (odd rounds start with kvattn, even ones with torch); the
table gives each side's best round and their ratio, plus the median of the
N same-round ratios (each taken under the same load). Run via
scripts/peer_cpu.sh.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

DTYPES = {"bf16": torch.bfloat16, "f32": torch.float32, "f16": torch.float16}


def parse_shape(s):
    f = s.split(":")
    if f[0] == "prefill" and len(f) == 2:
        return {"mode": "prefill", "batch": 1, "q_len": int(f[1]), "context": 0}
    if f[0] == "decode" and len(f) == 3:
        return {"mode": "decode", "batch": int(f[1]), "q_len": 1, "context": int(f[2])}
    raise argparse.ArgumentTypeError("shape must be prefill:N or decode:R:C, got %r" % s)


def gqa_mode(H, Hkv, dtype):
    """'enable_gqa' if this torch's SDPA takes it on the CPU, else 'repeat_interleave'."""
    if H == Hkv:
        return "none"
    q = torch.randn(1, H, 4, 16, dtype=dtype)
    k = torch.randn(1, Hkv, 4, 16, dtype=dtype)
    try:
        F.scaled_dot_product_attention(q, k, k, is_causal=True, enable_gqa=True)
        return "enable_gqa"
    except (TypeError, RuntimeError):
        return "repeat_interleave"


def time_torch(sh, H, Hkv, D, dtype, iters, warmup, stat):
    g = torch.Generator().manual_seed(1234)
    B, q_len, kv_len = sh["batch"], sh["q_len"], sh["context"] + sh["q_len"]
    q = torch.randn(B, H, q_len, D, generator=g).to(dtype)
    k = torch.randn(B, Hkv, kv_len, D, generator=g).to(dtype)
    v = torch.randn(B, Hkv, kv_len, D, generator=g).to(dtype)
    mode = gqa_mode(H, Hkv, dtype)
    kw = {}
    if mode == "enable_gqa":
        kw["enable_gqa"] = True
    elif mode == "repeat_interleave":
        k = k.repeat_interleave(H // Hkv, dim=1)
        v = v.repeat_interleave(H // Hkv, dim=1)
    # Prefill without context: top-left and bottom-right causal masks agree.
    # A decode's single query sees every key: no mask.
    causal = sh["mode"] == "prefill"
    times = []
    with torch.inference_mode():
        for i in range(warmup + iters):
            t0 = time.perf_counter()
            F.scaled_dot_product_attention(q, k, v, is_causal=causal, **kw)
            if i >= warmup:
                times.append(time.perf_counter() - t0)
    return (min(times) if stat == "min" else statistics.median(times)) * 1e3, mode


def time_ours(kvattn, sh, H, Hkv, D, dt, threads, iters, warmup, check, stat):
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as tf:
        path = tf.name
    cmd = [kvattn, "bench", "--mode", sh["mode"], "--batch", str(sh["batch"]),
           "--q-len", str(sh["q_len"]), "--context", str(sh["context"]), "--heads", str(H),
           "--kv-heads", str(Hkv), "--head-dim", str(D), "--dtype", dt, "--threads",
           str(threads), "--iters", str(iters), "--warmup", str(warmup), "--no-ceiling",
           "--json", path]
    if not check:
        cmd.append("--no-check")
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        sys.stderr.write(r.stdout + r.stderr)
        raise SystemExit("kvattn bench failed: " + " ".join(cmd))
    with open(path) as f:
        res = json.load(f)
    os.unlink(path)
    return res["min_ms" if stat == "min" else "median_ms"], res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kvattn", default="build/kvattn", help="path of the kvattn binary")
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="threads on both sides")
    ap.add_argument("--dtypes", default="bf16,f16,f32", help="comma-separated: bf16,f16,f32")
    ap.add_argument("--shapes", type=parse_shape, nargs="*",
                    default=[parse_shape(s) for s in
                             ("prefill:1024", "prefill:2048", "prefill:4096", "decode:16:4096")])
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--no-check", action="store_true", help="skip kvattn's reference check")
    ap.add_argument("--stat", choices=("median", "min"), default="median",
                    help="statistic of the timed runs on both sides")
    ap.add_argument("--rounds", type=int, default=1,
                    help="alternate torch and kvattn this many times per shape, keep the best")
    ap.add_argument("--json", help="also write the rows as JSON to this file")
    a = ap.parse_args()

    torch.set_num_threads(a.threads)
    print("torch %s (CPU capability %s), %d threads; kvattn %s" %
          (torch.__version__, torch.backends.cpu.get_cpu_capability(), torch.get_num_threads(),
           a.kvattn))
    print("load average at start: %.2f %.2f %.2f" % os.getloadavg())
    print("%-18s %-5s %-18s %10s %10s %12s %14s   (%s of %d runs, best of %d rounds; "
          "same-round ratios)" %
          ("shape", "dtype", "torch GQA", "ours ms", "torch ms", "torch/ours", "median ratio",
           a.stat, a.iters, a.rounds))
    rows = []
    for sh in a.shapes:
        for dt in a.dtypes.split(","):
            name = ("prefill %d" % sh["q_len"] if sh["mode"] == "prefill" else
                    "decode %dx%d" % (sh["batch"], sh["context"]))
            sys.stderr.write("peer: %s %s ...\n" % (name, dt))
            # Rounds alternate the two sides so that slow drifts of a shared
            # machine's load hit both; each side keeps its best round.
            t_torch = t_ours = float("inf")
            ratios = []
            for rnd in range(a.rounds):
                def run_torch():
                    return time_torch(sh, a.heads, a.kv_heads, a.head_dim, DTYPES[dt],
                                      a.iters, a.warmup, a.stat)

                def run_ours():
                    return time_ours(a.kvattn, sh, a.heads, a.kv_heads, a.head_dim, dt,
                                     a.threads, a.iters, a.warmup, rnd == 0 and not a.no_check,
                                     a.stat)
                if rnd % 2 == 0:
                    to, res = run_ours()
                    tt, mode = run_torch()
                else:
                    tt, mode = run_torch()
                    to, res = run_ours()
                ratios.append(tt / to)
                t_torch, t_ours = min(t_torch, tt), min(t_ours, to)
            med = statistics.median(ratios)
            print("%-18s %-5s %-18s %10.2f %10.2f %11.2fx %13.2fx   [%s]" %
                  (name, dt, mode, t_ours, t_torch, t_torch / t_ours, med,
                   " ".join("%.2f" % x for x in ratios)))
            sys.stdout.flush()
            rows.append({"shape": name, "dtype": dt, "torch_gqa": mode, "ours_ms": t_ours,
                         "torch_ms": t_torch, "ratio": t_torch / t_ours,
                         "median_round_ratio": med, "round_ratios": ratios,
                         "stat": a.stat, "rounds": a.rounds, "threads": a.threads})
    print("load average at end: %.2f %.2f %.2f" % os.getloadavg())
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"torch": torch.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
