"""Device and host memory of kvattn.flashinfer's graph-mode wrappers at SGLang
sizes (py50, session 42): for each case, a graph-mode wrapper with SGLang's
buffers (indices buffer = max batch x context pages, shared by every captured
batch size's wrapper) and its first plan (SGLang's capture: every request's
length 1). Device: torch.cuda.mem_get_info's free memory before the wrapper
and after its first plan, less what torch's own allocator reserved between
(kvattn allocates with cudaMalloc, outside it). Host: VmRSS (the pinned
staging is resident). Two wrappers per case: the second shows the steady
per-wrapper cost (the first also pays kvattn's per-process CUDA set-up).
Prints one line per wrapper."""
import sys
import time

import torch

from kvattn import flashinfer as fi

dev = torch.device("cuda")
torch.zeros(1, device=dev)
MiB = 1 << 20


def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def snap():
    torch.cuda.synchronize()
    return torch.cuda.mem_get_info()[0], torch.cuda.memory_reserved(), rss()


def decode(bs, nidx, h, hkv, d, page):
    i32 = dict(dtype=torch.int32, device=dev)
    bufs = dict(paged_kv_indptr_buffer=torch.zeros(bs + 1, **i32),
                paged_kv_indices_buffer=torch.zeros(nidx, **i32),
                paged_kv_last_page_len_buffer=torch.zeros(bs, **i32))
    ws = torch.empty(128 * MiB, dtype=torch.uint8, device=dev)
    args = (torch.arange(bs + 1, **i32), torch.arange(bs, **i32), torch.ones(bs, **i32))
    s0 = snap()
    w = fi.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_cuda_graph=True, **bufs)
    t = time.perf_counter()
    w.plan(*args, h, hkv, d, page, data_type=torch.bfloat16)
    return w, s0, time.perf_counter() - t, (bufs, ws)


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
    return w, s0, time.perf_counter() - t, (bufs, ws)


CTX, MAXBS = 131072, 256  # Llama-3.1 context; a max captured batch of 256
CASES = [
    ("decode H32/Hkv8/D128 page 1, bs 256", decode, (256, MAXBS * CTX, 32, 8, 128, 1)),
    ("decode H32/Hkv8/D128 page 1, bs 1", decode, (1, MAXBS * CTX, 32, 8, 128, 1)),
    ("decode H32/Hkv8/D128 page 16, bs 256", decode, (256, MAXBS * CTX // 16, 32, 8, 128, 16)),
    ("MLA H16 Dc512/Dr64 page 1, bs 256", mla, (256, MAXBS * 163840, 16, 512, 64, 1)),
    ("MLA H128 Dc512/Dr64 page 1, bs 256", mla, (256, MAXBS * 163840, 128, 512, 64, 1)),
]
keep = []
print("GPU:", torch.cuda.get_device_name(0), "SMs:",
      torch.cuda.get_device_properties(0).multi_processor_count)
print("%-40s %4s %11s %11s %9s" % ("case", "n", "dev MiB", "host MiB", "plan ms"))
for name, fn, args in CASES:
    if len(sys.argv) > 1 and sys.argv[1] not in name:
        continue
    for n in (1, 2):
        w, s0, dt, hold = fn(*args)
        s1 = snap()
        dev_b = (s0[0] - s1[0]) - (s1[1] - s0[1])
        print("%-40s %4d %11.1f %11.1f %9.1f" % (name, n, dev_b / MiB, (s1[2] - s0[2]) / MiB,
                                                dt * 1e3), flush=True)
        keep.append((w, hold))
    del keep[:]
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
