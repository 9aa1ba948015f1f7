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
the reference backend), then FlashInfer (whose first plan JIT-compiles its
kernel, unless KVA_FI_PREBUILT=DIR: then its module is loaded from
DIR/<uri>/<uri>.so, compiled without a GPU by bench/flashinfer_prebuild.sh's
"mla" module, and nothing is compiled here, as in bench/decode_fi_peer.py);
a peer that cannot run is reported with its error. FlashInfer's wrapper plans
with its backend "auto" (fa3 on SM90a); the backend it planned is reported.
FlashInfer's request 0 is checked against a float32 softmax over its latent
rows (every query token's visible keys): the error's norm over the reference's
norm <= 2e-2 ("check ok", else "FAIL" in the table; the times are kept).

Usage: peer_mla.py --ours build/bench_cuda_mla [--out DIR] [--skip-flashinfer] [--heads 16,128]
       peer_mla.py --modules   (no GPU: with KVA_FI_PREBUILT, load the prebuilt
                                module its plan loads; exit status 1 if missing)
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


SCALE = 1.0 / 192 ** 0.5  # DeepSeek's 1/sqrt(Dn + Dr), as bench_cuda_mla
FI_TOL = 2e-2  # |out - ref| / |ref| (norms over request 0's Q x H x 512 values)


def fi_case(fi, R, S, Q, H, dev="cuda"):
    """FlashInfer's wrapper planned for R requests of S + Q latent rows (Q new
    tokens, causal), its call, the backend it planned, request 0's reference
    output (float32, [Q, H, 512]) and a function that gives request 0's
    relative error of an output. dev/fi53/test_peer_mla.py runs it on the CPU
    against a stand-in wrapper."""
    s = S + Q
    n = (s + PAGE - 1) // PAGE
    bf = torch.bfloat16
    ckv = torch.randn(R * n, PAGE, 512, dtype=bf, device=dev)
    kpe = torch.randn(R * n, PAGE, 64, dtype=bf, device=dev)
    q_nope = torch.randn(R * Q, H, 512, dtype=bf, device=dev)
    q_pe = torch.randn(R * Q, H, 64, dtype=bf, device=dev)
    qo_indptr = torch.arange(R + 1, dtype=torch.int32, device=dev) * Q
    kv_indptr = torch.arange(R + 1, dtype=torch.int32, device=dev) * n
    kv_indices = torch.randperm(R * n, device=dev).to(torch.int32)
    kv_len = torch.full((R,), s, dtype=torch.int32, device=dev)
    ws = torch.empty(256 << 20, dtype=torch.int8, device=dev)
    w = fi.mla.BatchMLAPagedAttentionWrapper(ws)
    w.plan(qo_indptr=qo_indptr, kv_indptr=kv_indptr, kv_indices=kv_indices, kv_len_arr=kv_len,
           num_heads=H, head_dim_ckv=512, head_dim_kpe=64, page_size=PAGE, causal=True,
           sm_scale=SCALE, q_data_type=bf, kv_data_type=bf)
    backend = getattr(w, "_planned_backend_name", None) or "?"
    # request 0: its pages in table order, the first s rows; query token i sees keys 0 .. S + i
    idx = kv_indices[:n].long()
    c0 = ckv[idx].reshape(n * PAGE, 512)[:s].float()
    k0 = torch.cat([c0, kpe[idx].reshape(n * PAGE, 64)[:s].float()], dim=1)  # s, 576
    q0 = torch.cat([q_nope[:Q], q_pe[:Q]], dim=2).float()  # Q, H, 576
    logits = torch.einsum("qhd,kd->qhk", q0, k0) * SCALE
    mask = torch.arange(s, device=dev)[None, :] > (S + torch.arange(Q, device=dev))[:, None]  # Q, s
    logits.masked_fill_(mask[:, None, :], float("-inf"))
    ref = torch.einsum("qhk,kd->qhd", torch.softmax(logits, dim=-1), c0)
    err = lambda out: ((out[:Q].float() - ref).norm() / ref.norm()).item()
    return (lambda: w.run(q_nope, q_pe, ckv, kpe)), backend, err


def flashinfer_ms(R, S, Q, H):
    import flashinfer
    call, backend, err = fi_case(flashinfer, R, S, Q, H)
    e = err(call())
    ms = median_ms(call)
    del call
    torch.cuda.empty_cache()
    return ms, flashinfer.__version__, backend, e


def check_modules():
    """--modules: the MLA module from KVA_FI_PREBUILT, through FlashInfer's
    getter (bench/decode_fi_peer.py's check, this script's module only)."""
    from decode_fi_peer import modules
    return modules(only=("mla",))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ours")
    ap.add_argument("--modules", action="store_true",
                    help="no GPU: check that the prebuilt module (KVA_FI_PREBUILT) loads, and exit")
    ap.add_argument("--out", default=".")
    ap.add_argument("--skip-flashinfer", action="store_true")
    ap.add_argument("--forced", default="mla_decode_mma_sm80",
                    help="comma-separated kernel names run (ours only) on the FORCED shapes")
    ap.add_argument("--heads", default="",
                    help="comma-separated H values: only the shapes with these heads")
    a = ap.parse_args()
    if a.modules:
        raise SystemExit(check_modules())
    if not a.ours:
        ap.error("--ours is required")
    pre = os.environ.get("KVA_FI_PREBUILT")
    if pre and not a.skip_flashinfer:
        try:  # FlashInfer's module from PRE/<uri>/<uri>.so; nothing is compiled (bench/decode_fi_peer.py)
            from decode_fi_peer import use_prebuilt
            use_prebuilt(pre)
            print(f"flashinfer: prebuilt modules from {pre}", flush=True)
        except Exception as e:  # noqa: BLE001 - the rows then report FlashInfer's own error
            print(f"flashinfer: prebuilt modules not set up ({type(e).__name__}: {str(e)[:160]})", flush=True)
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
            ms, ver, backend, e = flashinfer_ms(row["R"], row["S"], row["Q"], row["H"])
            row["fi_ms"], row["fi_version"], row["fi_backend"], row["fi_err"] = ms, ver, backend, e
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
        fi = ""
        if f:
            ok = "ok" if r["fi_err"] <= FI_TOL else "FAIL"
            fi = f" (FI {r['fi_backend']}, check {ok} {r['fi_err']:.4f})"
        print(f"{r['R']:4d} {r['S']:6d} {r['Q']:2d} {r['H']:4d} | {cols(o)} | "
              f"{fc[0]:>8} {fc[1]:>6} {fc[3]:>8} | {ratio}{fi}"
              + (f" ({r['kernel']} forced)" if r["kernel"] else ""), flush=True)

if __name__ == "__main__":
    main()
