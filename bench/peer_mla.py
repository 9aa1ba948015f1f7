#!/usr/bin/env python3
"""peer_mla.py - kvattn's absorbed MLA decode next to FlashInfer's
BatchMLAPagedAttentionWrapper on one GPU, in one run (issue 16's shapes).

Every shape is a batch of R requests with Q new tokens after S cached ones
(causal), H heads, latent rows of 576 (c_kv 512 + k_pe 64) in bf16, pages of
64 tokens with a shuffled page table. TB/s counts the latent bytes once per
request (R * (S + Q) * 1152), TFLOP/s counts 2 * (576 + 512) per visible
query-key pair and head; both sides use the same counts. The ceiling is a
1 GiB device-to-device copy in the same run (bytes read + written). Ours runs
first for every shape (bench_cuda_mla, which also checks request 0 against
the CPU backend), then FlashInfer (whose first plan JIT-compiles its kernel);
a peer that cannot run is reported with its error.

Usage: peer_mla.py --ours build/bench_cuda_mla [--out DIR] [--skip-flashinfer] [--heads 16,128]
"""
import argparse
import json
import os
import subprocess
import traceback

import torch

from peer_cuda import median_ms  # CUDA-event median, shared with the decode peers

# (R, S, Q, H): the memory-bound and compute-bound shapes, and H 8 / 64
# for the bandwidth at small and large head counts.
SHAPES = [
    (128, 4096, 1, 16),
    (128, 16384, 1, 16),
    (64, 32768, 1, 16),
    (128, 4096, 1, 8),
    (128, 4096, 1, 64),
    (128, 4096, 1, 128),
    (128, 8192, 2, 128),
]
PAGE = 64
# Ours only, with other kernels forced (--forced, registry names; default the
# mma.sync kernel) where the wgmma one is the default.
FORCED = [(128, 4096, 1, 64), (128, 4096, 1, 128), (128, 8192, 2, 128)]


def work(R, S, Q, H):
    s = S + Q
    pairs = sum(R * (s - Q + i + 1) for i in range(Q))
    return R * s * 576 * 2, pairs * H * 2.0 * (576 + 512)


def copy_tbs():
    n = 1 << 30
    x = torch.empty(n, dtype=torch.uint8, device="cuda").fill_(7)
    y = torch.empty_like(x)
    ms = median_ms(lambda: y.copy_(x), iters=20)
    del x, y
    return 2.0 * n / (ms * 1e-3) * 1e-12


def ours(binary, R, S, Q, H, kernel=None):
    p = subprocess.run([binary, "--batch", str(R), "--context", str(S), "--q-len", str(Q),
                        "--heads", str(H), "--block-size", str(PAGE)] +
                       (["--kernel", kernel] if kernel else []),
                       capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        raise RuntimeError(p.stderr.strip()[-400:])
    return json.loads(p.stdout.strip().splitlines()[-1]), p.stderr.strip()


def flashinfer_ms(R, S, Q, H):
    import flashinfer
    s = S + Q
    n = (s + PAGE - 1) // PAGE
    dev, bf = "cuda", torch.bfloat16
    ckv = torch.randn(R * n, PAGE, 512, dtype=bf, device=dev)
    kpe = torch.randn(R * n, PAGE, 64, dtype=bf, device=dev)
    q_nope = torch.randn(R * Q, H, 512, dtype=bf, device=dev)
    q_pe = torch.randn(R * Q, H, 64, dtype=bf, device=dev)
    qo_indptr = torch.arange(R + 1, dtype=torch.int32, device=dev) * Q
    kv_indptr = torch.arange(R + 1, dtype=torch.int32, device=dev) * n
    kv_indices = torch.randperm(R * n, device=dev).to(torch.int32)
    kv_len = torch.full((R,), s, dtype=torch.int32, device=dev)
    ws = torch.empty(256 << 20, dtype=torch.int8, device=dev)
    w = flashinfer.mla.BatchMLAPagedAttentionWrapper(ws)
    w.plan(qo_indptr, kv_indptr, kv_indices, kv_len, H, 512, 64, PAGE, True,
           1.0 / 192 ** 0.5, bf, bf)
    ms = median_ms(lambda: w.run(q_nope, q_pe, ckv, kpe))
    del ckv, kpe
    torch.cuda.empty_cache()
    return ms, flashinfer.__version__


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ours", required=True)
    ap.add_argument("--out", default=".")
    ap.add_argument("--skip-flashinfer", action="store_true")
    ap.add_argument("--forced", default="mla_decode_mma_sm80",
                    help="comma-separated kernel names run (ours only) on the FORCED shapes")
    ap.add_argument("--heads", default="",
                    help="comma-separated H values: only the shapes with these heads")
    a = ap.parse_args()
    ceil = copy_tbs()
    dev = torch.cuda.get_device_name()
    rows = []
    forced = [k for k in a.forced.split(",") if k]
    heads = {int(h) for h in a.heads.split(",") if h}
    for R, S, Q, H, kernel in [s + (None,) for s in SHAPES] + \
            [s + (k,) for k in forced for s in FORCED]:
        if heads and H not in heads:
            continue
        kvb, fl = work(R, S, Q, H)
        row = dict(R=R, S=S, Q=Q, H=H, kv_bytes=kvb, flops=fl, kernel=kernel)
        try:
            j, line = ours(a.ours, R, S, Q, H, kernel)
            row["ours_ms"] = j["ms"]
            row["ours_check_bad"] = j["check_bad"]
            print(line, flush=True)
        except Exception as e:  # noqa: BLE001 - report and go on
            row["ours_error"] = str(e)[-300:]
        rows.append(row)
    table(dev, ceil, rows)  # ours alone first: a FlashInfer JIT that outlasts the call loses nothing
    for row in [r for r in rows if not r["kernel"]] if not a.skip_flashinfer else []:
        try:
            ms, ver = flashinfer_ms(row["R"], row["S"], row["Q"], row["H"])
            row["fi_ms"], row["fi_version"] = ms, ver
        except Exception:  # noqa: BLE001
            row["fi_error"] = traceback.format_exc().strip().splitlines()[-1][-300:]
            print(traceback.format_exc()[-1500:], flush=True)
        with open(os.path.join(a.out, "peer_mla.json"), "w") as f:
            json.dump(dict(device=dev, copy_tbs=ceil, rows=rows), f, indent=1)
    if not a.skip_flashinfer:
        table(dev, ceil, rows)


def table(dev, ceil, rows):
    print(f"{dev}: copy ceiling {ceil:.3f} TB/s (read + write, same run)")
    print(f"{'R':>4} {'S':>6} {'Q':>2} {'H':>4} | {'ours ms':>8} {'TB/s':>6} {'%copy':>6} "
          f"{'TFLOP/s':>8} | {'FI ms':>8} {'TB/s':>6} {'TFLOP/s':>8} | FI ms / ours ms")
    for r in rows:
        def cols(ms):
            if ms is None:
                return f"{'-':>8} {'-':>6} {'-':>6} {'-':>8}"
            tbs = r["kv_bytes"] / (ms * 1e-3) * 1e-12
            return (f"{ms:8.4f} {tbs:6.3f} {100 * tbs / ceil:5.1f}% "
                    f"{r['flops'] / (ms * 1e-3) * 1e-12:8.1f}")
        o, f = r.get("ours_ms"), r.get("fi_ms")
        fc = cols(f).split()
        ratio = f"{f / o:.2f}x" if o and f else r.get("fi_error", r.get("ours_error", ""))[:60]
        print(f"{r['R']:4d} {r['S']:6d} {r['Q']:2d} {r['H']:4d} | {cols(o)} | "
              f"{fc[0]:>8} {fc[1]:>6} {fc[3]:>8} | {ratio}"
              + (f" ({r['kernel']} forced)" if r["kernel"] else ""), flush=True)

if __name__ == "__main__":
    main()
