"""Graph-mode wrapper memory and plan time (ws51, for session 43's first H200
call): dev/py50/mem.py's cases (SGLang buffers: indices = max batch 256 x
context pages), each wrapper's first plan (SGLang's capture: every request
length 1), then STEPS plans of a serving step (every request LEN tokens) with
no synchronization between them, as a decode loop plans before each replay.
Per wrapper: device MiB (cudaMemGetInfo's free memory before the wrapper and
after its first plan, less torch's own reserve), pinned host MiB (VmRSS; the
pinned staging is resident) after the first plan and after the steps, first
plan ms, and the steps' plan time (median us; the wrapper's Python and the
host copy of the indices are in it, the same on both sides). Two wrappers per
case, the first kept alive; quote the n = 2 lines (n = 1 pays kvattn's
per-process set-up and the previous case's frees). Run by dev/ws51/ab.sh
once per side (KVATTN_LIBRARY: base or new)."""
import sys
import time

import torch

from kvattn import flashinfer as fi

dev = torch.device("cuda")
torch.zeros(1, device=dev)
MiB = 1 << 20
STEPS, LEN = 20, 2048


def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def snap():
    torch.cuda.synchronize()
    return torch.cuda.mem_get_info()[0], torch.cuda.memory_reserved(), rss()


def step_args(bs, page, i32):
    pages = (LEN + page - 1) // page
    indptr = torch.arange(bs + 1, **i32) * pages
    indices = torch.arange(bs * pages, **i32)
    last = torch.full((bs,), LEN - (pages - 1) * page, **i32)
    return indptr, indices, last


def decode(bs, nidx, h, hkv, d, page):
    i32 = dict(dtype=torch.int32, device=dev)
    bufs = dict(paged_kv_indptr_buffer=torch.zeros(bs + 1, **i32),
                paged_kv_indices_buffer=torch.zeros(nidx, **i32),
                paged_kv_last_page_len_buffer=torch.zeros(bs, **i32))
    ws = torch.empty(128 * MiB, dtype=torch.uint8, device=dev)
    first = (torch.arange(bs + 1, **i32), torch.arange(bs, **i32), torch.ones(bs, **i32))
    s0 = snap()
    w = fi.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_cuda_graph=True, **bufs)
    t = time.perf_counter()
    w.plan(*first, h, hkv, d, page, data_type=torch.bfloat16)
    dt = time.perf_counter() - t
    s1 = snap()
    step = step_args(bs, page, i32)
    plan = lambda: w.plan(*step, h, hkv, d, page, data_type=torch.bfloat16)
    return w, s0, s1, dt, plan, (bufs, ws, step)


def mla(bs, nidx, h, dc, dr, page):
    i32 = dict(dtype=torch.int32, device=dev)
    bufs = dict(qo_indptr=torch.zeros(bs + 1, **i32), kv_indptr=torch.zeros(bs + 1, **i32),
                kv_indices=torch.zeros(nidx, **i32), kv_len_arr=torch.zeros(bs, **i32))
    ws = torch.empty(128 * MiB, dtype=torch.uint8, device=dev)
    ar = torch.arange(bs + 1, **i32)
    s0 = snap()
    w = fi.BatchMLAPagedAttentionWrapper(ws, use_cuda_graph=True, **bufs)
    t = time.perf_counter()
    w.plan(ar, ar, torch.arange(bs, **i32), torch.ones(bs, **i32), h, dc, dr, page, False,
           0.1, torch.bfloat16, torch.bfloat16)
    dt = time.perf_counter() - t
    s1 = snap()
    indptr, indices, _ = step_args(bs, page, i32)
    lens = torch.full((bs,), LEN, **i32)
    plan = lambda: w.plan(ar, indptr, indices, lens, h, dc, dr, page, False, 0.1,
                          torch.bfloat16, torch.bfloat16)
    return w, s0, s1, dt, plan, (bufs, ws, indptr, indices, lens)


CTX, MAXBS = 131072, 256  # Llama-3.1 context; a max captured batch of 256
CASES = [
    ("decode H32/Hkv8/D128 page 1, bs 256", decode, (256, MAXBS * CTX, 32, 8, 128, 1)),
    ("decode H32/Hkv8/D128 page 16, bs 256", decode, (256, MAXBS * CTX // 16, 32, 8, 128, 16)),
    ("decode H32/Hkv8/D128 page 1, bs 1", decode, (1, MAXBS * CTX, 32, 8, 128, 1)),
    ("MLA H16 Dc512/Dr64 page 1, bs 256", mla, (256, MAXBS * 163840, 16, 512, 64, 1)),
    ("MLA H128 Dc512/Dr64 page 1, bs 256", mla, (256, MAXBS * 163840, 128, 512, 64, 1)),
]
keep = []
print("GPU:", torch.cuda.get_device_name(0), "SMs:",
      torch.cuda.get_device_properties(0).multi_processor_count, "lib:",
      sys.argv[1] if len(sys.argv) > 1 else "?")
print("%-38s %2s %9s %9s %9s %8s %9s" % ("case", "n", "dev MiB", "host MiB", "+steps", "plan ms",
                                          "step us"))
for name, fn, args in CASES:
    for n in (1, 2):
        w, s0, s1, dt, plan, hold = fn(*args)
        plan()  # the steps' shape once (Python-side caches), then timed
        torch.cuda.synchronize()
        ts = []
        for _ in range(STEPS):
            t = time.perf_counter()
            plan()
            ts.append(time.perf_counter() - t)
        s2 = snap()
        ts.sort()
        dev_b = (s0[0] - s1[0]) - (s1[1] - s0[1])
        print("%-38s %2d %9.1f %9.1f %9.1f %8.1f %9.1f" % (
            name, n, dev_b / MiB, (s1[2] - s0[2]) / MiB, (s2[2] - s1[2]) / MiB, dt * 1e3,
            ts[len(ts) // 2] * 1e6), flush=True)
        keep.append((w, hold))
    del keep[:]
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
