#!/usr/bin/env python3
"""flashinfer_side_by_side.py - kvattn.flashinfer next to FlashInfer itself on
one GPU: the same wrapper calls (plan, then run with return_lse) on identical
inputs, results compared (out with rtol = atol = 1e-3 for f16, 1e-2 for
bf16; LSE, base 2 in both, with atol 1e-3), times as ratios.

Needs torch with CUDA, flashinfer (e.g. wheels installed offline as
scripts/cuda.sh does with KVA_WHEELS) and the kvattn package built with CUDA
(`pip install .`, or PYTHONPATH=python KVATTN_LIBRARY=build-cuda/libkvattn.so).
Times: CUDA-event medians of run() after warm-up (plan() excluded; per call,
host launch gap included for both). ratio = FlashInfer time / kvattn time
(> 1: kvattn faster).

Usage: flashinfer_side_by_side.py [--out DIR] [--quick] [--cases 0,4]
(--cases: indices into the case list, to bound FlashInfer's JIT compiles.)
"""
import argparse
import json
import os
import sys
import traceback

import torch

import flashinfer
import kvattn
from kvattn import flashinfer as kfi


def median_ms(fn, iters=30, warmup=5):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    ts.sort()
    return ts[len(ts) // 2]


def paged(batch_kv_lens, page, hkv, d, layout, dtype, five_d, gen):
    npages = [-(-s // page) for s in batch_kv_lens]
    nb = sum(npages) + 8
    perm = torch.randperm(nb, generator=gen).int()
    indptr = torch.tensor([0] + list(torch.tensor(npages).cumsum(0)), dtype=torch.int32)
    indices = perm[: int(indptr[-1])]
    last = torch.tensor([s - (n - 1) * page for s, n in zip(batch_kv_lens, npages)],
                        dtype=torch.int32)
    inner = (page, hkv, d) if layout == "NHD" else (hkv, page, d)
    if five_d:
        cache = torch.randn((nb, 2) + inner, generator=gen).to(dtype).cuda()
    else:
        cache = (torch.randn((nb,) + inner, generator=gen).to(dtype).cuda(),
                 torch.randn((nb,) + inner, generator=gen).to(dtype).cuda())
    return cache, indptr.cuda(), indices.cuda(), last.cuda()


def case_rows(quick):
    big = not quick
    rows = []
    for dtype in (torch.float16, torch.bfloat16):
        rows.append(dict(kind="decode", batch=64 if big else 8, kv=4096 if big else 512, H=32,
                         Hkv=8, D=128, page=16, layout="NHD", dtype=dtype, five_d=False))
    rows.append(dict(kind="decode", batch=16, kv=2048, H=32, Hkv=8, D=128, page=16,
                     layout="HND", dtype=torch.float16, five_d=True))
    rows.append(dict(kind="decode", batch=16, kv=1000, H=16, Hkv=4, D=64, page=16,
                     layout="NHD", dtype=torch.float16, five_d=False, window_left=255,
                     soft_cap=30.0))
    rows.append(dict(kind="prefill", batch=8 if big else 2, q=1024 if big else 256, ctx=0,
                     H=32, Hkv=8, D=128, page=16, layout="NHD", dtype=torch.bfloat16,
                     five_d=False))
    rows.append(dict(kind="prefill", batch=4, q=512, ctx=1536, H=32, Hkv=8, D=128, page=16,
                     layout="NHD", dtype=torch.float16, five_d=False))
    rows.append(dict(kind="prefill", batch=4, q=128, ctx=384, H=8, Hkv=8, D=256, page=16,
                     layout="HND", dtype=torch.float16, five_d=True, window_left=127))
    return rows


def run_case(c, gen):
    dev = torch.device("cuda:0")
    ws_fi = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
    ws_k = torch.empty(16, dtype=torch.uint8, device=dev)
    if c["kind"] == "decode":
        kv_lens = [c["kv"]] * c["batch"]
        q_lens = [1] * c["batch"]
    else:
        kv_lens = [c["ctx"] + c["q"]] * c["batch"]
        q_lens = [c["q"]] * c["batch"]
    cache, indptr, indices, last = paged(kv_lens, c["page"], c["Hkv"], c["D"], c["layout"],
                                         c["dtype"], c["five_d"], gen)
    q = torch.randn((sum(q_lens), c["H"], c["D"]), generator=gen).to(c["dtype"]).to(dev)
    common = dict(window_left=c.get("window_left", -1), logits_soft_cap=c.get("soft_cap"),
                  q_data_type=c["dtype"])
    outs, times = {}, {}
    for name, mod, ws in (("flashinfer", flashinfer, ws_fi), ("kvattn", kfi, ws_k)):
        if c["kind"] == "decode":
            w = mod.BatchDecodeWithPagedKVCacheWrapper(ws, c["layout"])
            w.plan(indptr, indices, last, c["H"], c["Hkv"], c["D"], c["page"],
                   kv_data_type=c["dtype"], **common)
        else:
            qo = torch.tensor([0] + list(torch.tensor(q_lens).cumsum(0)), dtype=torch.int32,
                              device=dev)
            w = mod.BatchPrefillWithPagedKVCacheWrapper(ws, c["layout"])
            w.plan(qo, indptr, indices, last, c["H"], c["Hkv"], c["D"], c["page"], causal=True,
                   kv_data_type=c["dtype"], **common)
        outs[name] = w.run(q, cache, return_lse=True)
        times[name] = median_ms(lambda: w.run(q, cache))
    (of, lf), (ok, lk) = outs["flashinfer"], outs["kvattn"]
    tol = 1e-3 if c["dtype"] == torch.float16 else 1e-2
    d_out = (of.float() - ok.float()).abs().max().item()
    d_lse = (lf - lk).abs().max().item()
    ok_out = torch.allclose(ok.float(), of.float(), rtol=tol, atol=tol)
    ok_lse = torch.allclose(lk, lf, rtol=1e-3, atol=1e-3)
    return dict(max_abs_out=d_out, max_abs_lse=d_lse, equal=bool(ok_out and ok_lse),
                ms_flashinfer=times["flashinfer"], ms_kvattn=times["kvattn"],
                ratio=times["flashinfer"] / times["kvattn"])


def label(c):
    dt = {torch.float16: "f16", torch.bfloat16: "bf16"}[c["dtype"]]
    shape = ("%d x %d" % (c["batch"], c["kv"]) if c["kind"] == "decode"
             else "%d x %d (+%d ctx)" % (c["batch"], c["q"], c["ctx"]))
    extra = "".join([" 5-D" if c["five_d"] else "",
                     " win %d" % c["window_left"] if "window_left" in c else "",
                     " cap %g" % c["soft_cap"] if c.get("soft_cap") else ""])
    return "%s %s %s H%d/%d D%d B%d %s%s" % (c["kind"], shape, dt, c["H"], c["Hkv"], c["D"],
                                            c["page"], c["layout"], extra)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--cases", default=None)
    a = ap.parse_args()
    if not torch.cuda.is_available() or not kvattn.backend_available("cuda"):
        print("flashinfer_side_by_side: needs a GPU and kvattn built with CUDA")
        return 1
    gen = torch.Generator().manual_seed(21)
    print("kvattn %s (%s), flashinfer %s, torch %s, %s" % (
        kvattn.__version__, kvattn.LIBRARY_PATH, getattr(flashinfer, "__version__", "?"),
        torch.__version__, torch.cuda.get_device_name()))
    results, status = [], 0
    print("%-58s %8s %10s %10s %10s %8s" % ("case", "equal", "|dout|", "FI ms", "kva ms",
                                            "FI/kva"))
    cases = case_rows(a.quick)
    if a.cases:
        cases = [cases[int(i)] for i in a.cases.split(",")]
    for c in cases:
        try:
            r = run_case(c, gen)
        except Exception as e:  # a case that cannot run is reported, not hidden
            traceback.print_exc()
            r = dict(error="%s: %s" % (type(e).__name__, e))
        r["case"] = label(c)
        results.append(r)
        if "error" in r:
            status = 1
            print("%-58s %s" % (r["case"], r["error"][:60]))
        else:
            status |= 0 if r["equal"] else 1
            print("%-58s %8s %10.2e %10.4f %10.4f %8.2f" % (
                r["case"], "yes" if r["equal"] else "NO", r["max_abs_out"], r["ms_flashinfer"],
                r["ms_kvattn"], r["ratio"]))
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "flashinfer_side_by_side.json"), "w") as f:
            json.dump(results, f, indent=1)
    return status


if __name__ == "__main__":
    sys.exit(main())
