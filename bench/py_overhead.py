"""Per-call cost of the Python layer: one decode step (plan + run + plan
destroy) timed in C (bench/py_step.c, compiled here with cc into a shared
library against the package's libkvattn), through raw ctypes calls with
prepared arguments, through kvattn.Plan / Plan.run, and through the
FlashInfer decode wrapper's plan() + run(). Same shapes, CPU backend, 1
thread. The paths alternate round by round (15 rounds), so a busy machine
loads them alike; prints the medians in microseconds per step and each
path's cost above C. Then the same Python paths once more with
kva_plan_create and kva_attention_run replaced by a C function that returns
0 at once (kva_dtype_size of an invalid dtype, with the same ctypes
argument types): the Python layer's own cost, ctypes calls included, with no
attention work in it.

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


def c_step(r, s):
    """py_step_us(iters) of bench/py_step.c, built into a temporary shared library."""
    here = os.path.dirname(os.path.abspath(__file__))
    inc = os.path.join(here, "..", "include")
    libdir = os.path.dirname(kvattn.LIBRARY_PATH)
    tmp = tempfile.mkdtemp()
    so = os.path.join(tmp, "py_step.so")
    subprocess.run(["cc", "-O2", "-std=c11", "-shared", "-fPIC", "-I", inc,
                    os.path.join(here, "py_step.c"), "-o", so, "-L", libdir,
                    "-l:" + os.path.basename(kvattn.LIBRARY_PATH), "-Wl,-rpath," + libdir],
                   check=True)
    f = ctypes.CDLL(so).py_step_us
    f.restype, f.argtypes = ctypes.c_double, [ctypes.c_int] * 3

    def timed(iters):
        t = f(r, s, iters)
        if t < 0:
            raise RuntimeError("py_step_us failed: " + kvattn._lib.kva_last_error().decode())
        return t

    return timed


def py_timed(fn):
    def timed(iters):
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        return (time.perf_counter() - t0) / iters * 1e6

    return timed


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
    paths = [("C (bench/py_step.c)", c_step(r, s)), ("raw ctypes", py_timed(raw)),
             ("kvattn.Plan + Plan.run", py_timed(wrapped)),
             ("flashinfer decode plan + run", py_timed(flashinfer)),
             ("Plan.run alone (plan made once)", py_timed(run_only))]
    times = {name: [] for name, _ in paths}
    for name, fn in paths:
        fn(max(iters // 10, 1))  # warm-up
    for _ in range(15):
        for name, fn in paths:
            times[name].append(fn(iters))
    med = {name: statistics.median(t) for name, t in times.items()}
    t_c = med[paths[0][0]]
    print("decode step: R %d, seq_len %d, H %d, Hkv %d, D %d, f16, B %d, CPU backend, 1 thread"
          % (r, s, H, HKV, D, B))
    print("%-34s %10s %14s" % ("path", "us/step", "above C (us)"))
    for name, _ in paths:
        above = "" if "alone" in name else "%.2f" % (med[name] - t_c)
        print("%-34s %10.2f %14s" % (name, med[name], above))
    # The Python layer alone: the two C entry points stubbed.
    stubs = {}
    for name in ("kva_plan_create", "kva_attention_run"):
        real = getattr(L, name)
        stub = getattr(L.lib, "kva_dtype_size")
        f = type(real).from_address(ctypes.addressof(stub))  # same function, own prototype
        f.restype, f.argtypes = ctypes.c_int, real.argtypes
        stubs[name] = real
        setattr(L, name, f)
    try:
        py = {name: [] for name in ("kvattn.Plan + Plan.run", "flashinfer decode plan + run")}
        fns = [("kvattn.Plan + Plan.run", py_timed(wrapped)),
               ("flashinfer decode plan + run", py_timed(flashinfer))]
        for _ in range(15):
            for name, fn in fns:
                py[name].append(fn(iters))
    finally:
        for name, real in stubs.items():
            setattr(L, name, real)
    print("Python layer alone (C calls stubbed), us/step:")
    for name, t in py.items():
        print("  %-32s %10.2f" % (name, statistics.median(t)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
