"""Per-call cost of the Python layer: one decode step (plan + run + plan
destroy) timed in C (bench/py_step.c, compiled here with cc against the
installed package's library), through raw ctypes calls with prepared
arguments, through kvattn.Plan / Plan.run, and through the FlashInfer
decode wrapper's plan() + run(). Same shapes, CPU backend, 1 thread.
Prints medians of 15 rounds in microseconds and the Python layer's cost above C.

Usage: python bench/py_overhead.py [--requests 8] [--seq-len 64] [--iters 2000]
"""

import argparse
import ctypes
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

import kvattn
from kvattn import _lib as L
from kvattn import flashinfer as fi

H, HKV, D, B = 8, 2, 64, 16


def median_us(fn, iters, rounds=15):
    fn()
    t = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        t.append((time.perf_counter() - t0) / iters * 1e6)
    return statistics.median(t)


def c_time(r, s, iters):
    here = os.path.dirname(os.path.abspath(__file__))
    inc = os.path.join(here, "..", "include")
    libdir = os.path.dirname(kvattn.LIBRARY_PATH)
    with tempfile.TemporaryDirectory() as tmp:
        exe = os.path.join(tmp, "py_step")
        subprocess.run(["cc", "-O2", "-std=c11", "-I", inc, os.path.join(here, "py_step.c"), "-o",
                        exe, "-L", libdir, "-l:" + os.path.basename(kvattn.LIBRARY_PATH),
                        "-Wl,-rpath," + libdir], check=True)
        out = subprocess.run([exe, str(r), str(s), str(iters)], check=True, capture_output=True,
                             text=True).stdout
    return float(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--iters", type=int, default=2000)
    a = ap.parse_args()
    r, s, iters = a.requests, a.seq_len, a.iters
    nbr = -(-s // B)
    nb = r * nbr
    ctx = kvattn.Context("cpu", num_threads=1)
    kc = np.full((nb, B, HKV, D), 0.01, np.float16)
    vc = np.full((nb, B, HKV, D), 0.01, np.float16)
    cache = kvattn.Cache.from_tensors(ctx, kc, vc)
    qsl = np.arange(r + 1, dtype=np.int32)
    sl = np.full(r, s, np.int32)
    bt = np.arange(nb, dtype=np.int32).reshape(r, nbr)
    q = np.zeros((r, H, D), np.float16)
    out = np.empty((r, H, D), np.float16)

    # Raw ctypes: prepared descriptor and addresses, three calls per step.
    desc = L.PlanDesc(r, qsl.ctypes.data, sl.ctypes.data, bt.ctypes.data, nbr, B, 0, H, HKV, D,
                      0, 1, 0.0, 1, -1, 0.0, None)
    h = ctypes.c_void_p()
    dref, href = ctypes.byref(desc), ctypes.byref(h)
    qp, op, cp, cx = q.ctypes.data, out.ctypes.data, cache._h, ctx._h

    def raw():
        L.kva_plan_create(cx, dref, href)
        L.kva_attention_run(cx, h.value, qp, cp, None, op, None)
        L.kva_plan_destroy(h.value)

    def wrapped():
        p = kvattn.Plan(ctx, qsl, sl, bt, block_size=B, num_heads=H, num_kv_heads=HKV,
                        head_dim=D, q_dtype="f16")
        p.run(q, cache, out=out)
        p.close()

    indptr = np.arange(r + 1, dtype=np.int32) * nbr
    indices = np.arange(nb, dtype=np.int32)
    last = np.full(r, s - (nbr - 1) * B, np.int32)
    w = fi.BatchDecodeWithPagedKVCacheWrapper(None, "NHD", context=ctx)

    def flashinfer():
        w.plan(indptr, indices, last, H, HKV, D, B, q_data_type="float16")
        w.run(q, (kc, vc), out=out)

    def run_only():
        plan.run(q, cache, out=out)

    plan = kvattn.Plan(ctx, qsl, sl, bt, block_size=B, num_heads=H, num_kv_heads=HKV,
                       head_dim=D, q_dtype="f16")
    t_c = c_time(r, s, iters)
    rows = [("C (bench/py_step.c)", t_c), ("raw ctypes", median_us(raw, iters)),
            ("kvattn.Plan + run", median_us(wrapped, iters)),
            ("Plan.run only (C run ~ part of C row)", median_us(run_only, iters)),
            ("flashinfer decode plan + run", median_us(flashinfer, iters // 4))]
    print("decode step: R %d, seq_len %d, H %d, Hkv %d, D %d, f16, B %d, CPU backend, 1 thread"
          % (r, s, H, HKV, D, B))
    print("%-40s %10s %14s" % ("path", "us/step", "above C (us)"))
    for name, t in rows:
        print("%-40s %10.2f %14s" % (name, t, "" if "only" in name else "%.2f" % (t - t_c)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
