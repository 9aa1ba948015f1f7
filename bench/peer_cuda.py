#!/usr/bin/env python3
"""peer_cuda.py - kvattn's CUDA backend next to its peers on one GPU, in one run.

Measures, on the same device and in the same process run:
  * ceilings: a device-to-device copy (bytes read + written) and a bf16 GEMM;
  * paged decode (bf16, block 16, batch 64, 4096 keys, H/Hkv 32/8, D 128):
    kvattn (bench_cuda, paged: the default kernel with a 32-layer CUDA-graph
    replay, variant 3 on CUDA cores, HND, spec decode q_len 4, 4 x 32k), PyTorch
    SDPA with the flash and cuDNN backends on a contiguous cache, FlashInfer's
    BatchDecodeWithPagedKVCacheWrapper on a paged cache of the same shape;
  * causal prefill (bf16, H/Hkv 32/8, D 128; one 4096-token prompt and
    8 prompts of 1024): kvattn through kva_attention_run (prefills on the
    tensor-core kernel prefill_mma), SDPA flash and cuDNN, FlashInfer's
    BatchPrefillWithPagedKVCacheWrapper.
KV bytes count every visible key's K and V once per kv head; FLOPs count 4*D
per visible query-key pair and head. Times are medians of CUDA-event-timed
runs after warm-up. Every peer runs in try/except: a peer that cannot run is
reported with its error instead of a number.

Usage: peer_cuda.py --ours build-cuda/bench_cuda [--out DIR] [--skip-prefill]
       [--prefill-only] [--skip-flashinfer]
Prefill rows also give a back-to-back time (30 calls queued between one pair
of events: no host gap), for ours and the peers alike.
"""
import argparse
import datetime
import json
import os
import subprocess
import sys
import traceback

import torch
import torch.nn.functional as F

DEC = dict(batch=64, keys=4096, H=32, Hkv=8, D=128, page=16)
PRE = dict(H=32, Hkv=8, D=128, page=16)
PRE_PAGES = (16, 64)  # block sizes of the paged prefill rows (ours and FlashInfer)
PRE_SHAPES = ((1, 4096), (8, 1024))  # (prompts, tokens each)


def median_ms(fn, iters=30, warmup=5):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]


def b2b_ms(fn, iters=30, reps=5):
    """Per call, with `iters` calls queued between one pair of events (the GPU
    never waits for the host); median of `reps` such batches."""
    fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(iters):
            fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) / iters)
    out.sort()
    return out[len(out) // 2]


def ceilings():
    n = 1 << 30
    x = torch.empty(n, dtype=torch.uint8, device="cuda").random_(0, 255)
    y = torch.empty_like(x)
    ms = median_ms(lambda: y.copy_(x), iters=20)
    copy_tbs = 2 * n / (ms * 1e-3) / 1e12
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    ms = median_ms(lambda: a @ b, iters=10)
    gemm = 2 * 8192**3 / (ms * 1e-3) / 1e12
    del x, y, a, b
    return copy_tbs, gemm


def sdpa(backend, q, k, v, causal):
    from torch.nn.attention import sdpa_kernel

    def run():
        with sdpa_kernel([backend]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)

    try:
        run()
        return median_ms(run), "enable_gqa", b2b_ms(run)
    except Exception:
        # Backend without GQA support: expand K/V to H heads (same FLOPs, more bytes).
        g = q.shape[1] // k.shape[1]
        ke, ve = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)

        def run2():
            with sdpa_kernel([backend]):
                return F.scaled_dot_product_attention(q, ke, ve, is_causal=causal)

        run2()
        return median_ms(run2), "expanded K/V (no GQA support)", b2b_ms(run2)


def decode_peers(res):
    from torch.nn.attention import SDPBackend

    c = DEC
    kv_bytes = c["batch"] * c["keys"] * c["Hkv"] * c["D"] * 2 * 2
    q = torch.randn(c["batch"], c["H"], 1, c["D"], dtype=torch.bfloat16, device="cuda")
    k = torch.randn(c["batch"], c["Hkv"], c["keys"], c["D"], dtype=torch.bfloat16, device="cuda")
    v = torch.randn_like(k)
    for name, be in (("SDPA flash (contiguous)", SDPBackend.FLASH_ATTENTION),
                     ("SDPA cuDNN (contiguous)", SDPBackend.CUDNN_ATTENTION)):
        try:
            ms, note, _ = sdpa(be, q, k, v, False)
            res.append(dict(case="decode", name=name, ms=ms, kv_bytes=kv_bytes, note=note))
        except Exception as e:
            res.append(dict(case="decode", name=name, error=repr(e)[:300]))
    del k, v
    try:
        import flashinfer

        pages_per = c["keys"] // c["page"]
        npages = c["batch"] * pages_per + 7
        cache = torch.randn(npages, 2, c["page"], c["Hkv"], c["D"], dtype=torch.bfloat16,
                            device="cuda")
        perm = torch.randperm(npages, device="cuda")[: c["batch"] * pages_per].int()
        indptr = torch.arange(0, c["batch"] + 1, dtype=torch.int32, device="cuda") * pages_per
        last = torch.full((c["batch"],), c["page"], dtype=torch.int32, device="cuda")
        qd = q.reshape(c["batch"], c["H"], c["D"]).contiguous()
        ws = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
        for tc in (False, True):
            name = "FlashInfer paged decode" + (" (tensor cores)" if tc else "")
            try:
                w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_tensor_cores=tc)
                w.plan(indptr, perm, last, c["H"], c["Hkv"], c["D"], c["page"],
                       q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16)
                ms = median_ms(lambda: w.run(qd, cache))
                res.append(dict(case="decode", name=name, ms=ms, kv_bytes=kv_bytes,
                                note="flashinfer " + flashinfer.__version__))
            except Exception as e:
                res.append(dict(case="decode", name=name, error=repr(e)[:300]))
                traceback.print_exc()
        del cache
    except Exception as e:
        res.append(dict(case="decode", name="FlashInfer", error=repr(e)[:300]))
        traceback.print_exc()


def prefill_peers(res, flashinfer_too=True):
    for nreq, n in PRE_SHAPES:
        prefill_peers_shape(res, nreq, n, flashinfer_too)


def prefill_peers_shape(res, nreq, n, flashinfer_too=True):
    from torch.nn.attention import SDPBackend

    c = PRE
    tag = f"prefill {nreq}x{n}"
    flops = nreq * 4.0 * c["D"] * c["H"] * n * (n + 1) / 2
    q = torch.randn(nreq, c["H"], n, c["D"], dtype=torch.bfloat16, device="cuda")
    k = torch.randn(nreq, c["Hkv"], n, c["D"], dtype=torch.bfloat16, device="cuda")
    v = torch.randn_like(k)
    for name, be in (("SDPA flash", SDPBackend.FLASH_ATTENTION),
                     ("SDPA cuDNN", SDPBackend.CUDNN_ATTENTION)):
        try:
            ms, note, bb = sdpa(be, q, k, v, True)
            res.append(dict(case=tag, name=name, ms=ms, flops=flops, note=note, b2b_ms=bb))
        except Exception as e:
            res.append(dict(case=tag, name=name, error=repr(e)[:300]))
    for page in PRE_PAGES if flashinfer_too else ():
        name = "FlashInfer paged prefill" + ("" if page == c["page"] else f", page {page}")
        try:
            import flashinfer

            per = n // page
            pages = nreq * per
            cache = torch.randn(pages + 3, 2, page, c["Hkv"], c["D"], dtype=torch.bfloat16,
                                device="cuda")
            perm = torch.randperm(pages + 3, device="cuda")[:pages].int()
            qo = torch.arange(0, nreq + 1, dtype=torch.int32, device="cuda") * n
            kv_indptr = torch.arange(0, nreq + 1, dtype=torch.int32, device="cuda") * per
            last = torch.full((nreq,), page, dtype=torch.int32, device="cuda")
            ws = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
            w = flashinfer.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD")
            w.plan(qo, kv_indptr, perm, last, c["H"], c["Hkv"], c["D"], page, causal=True,
                   q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16)
            qf = q.permute(0, 2, 1, 3).reshape(nreq * n, c["H"], c["D"]).contiguous()
            ms = median_ms(lambda: w.run(qf, cache), iters=20)
            res.append(dict(case=tag, name=name, ms=ms, flops=flops,
                            note="flashinfer " + flashinfer.__version__,
                            b2b_ms=b2b_ms(lambda: w.run(qf, cache))))
        except Exception as e:
            res.append(dict(case=tag, name=name, error=repr(e)[:300]))
            traceback.print_exc()


def ours(binary, res, skip_prefill=False, prefill_only=False):
    runs = [
        ("decode", "kvattn paged decode (graph: 32 layers)",
         ["--mode", "decode", "--batch", "64", "--context", "4095", "--graph-layers", "32"]),
        ("decode", "kvattn paged decode, variant 3 (CUDA cores)",
         ["--mode", "decode", "--batch", "64", "--context", "4095", "--kernel", "decode_simt"]),
        ("decode", "kvattn paged decode HND",
         ["--mode", "decode", "--batch", "64", "--context", "4095", "--layout", "hnd"]),
        ("decode", "kvattn spec decode q=4",
         ["--mode", "decode", "--batch", "64", "--context", "4092", "--q-len", "4"]),
        ("decode", "kvattn decode batch 4, 32k keys (split-KV)",
         ["--mode", "decode", "--batch", "4", "--context", "32767"]),
        ("prefill 1x4096", "kvattn paged prefill (prefill_mma)",
         ["--mode", "prefill", "--batch", "1", "--context", "0", "--q-len", "4096",
          "--iters", "20"]),
        ("prefill 8x1024", "kvattn paged prefill (prefill_mma)",
         ["--mode", "prefill", "--batch", "8", "--context", "0", "--q-len", "1024",
          "--iters", "20"]),
        ("prefill 1x4096", "kvattn paged prefill, block 64",
         ["--mode", "prefill", "--batch", "1", "--context", "0", "--q-len", "4096",
          "--iters", "20", "--block-size", "64"]),
        ("prefill 8x1024", "kvattn paged prefill, block 64",
         ["--mode", "prefill", "--batch", "8", "--context", "0", "--q-len", "1024",
          "--iters", "20", "--block-size", "64"]),
    ]
    for case, name, args in runs:
        if (skip_prefill and case != "decode") or (prefill_only and case == "decode"):
            continue
        try:
            p = subprocess.run([binary] + args, capture_output=True, text=True, timeout=300)
            sys.stderr.write(p.stderr)
            j = json.loads(p.stdout.strip().splitlines()[-1])
            row = dict(case=case, name=name, ms=j["ms"], kv_bytes=j["kv_bytes"],
                       flops=j["flops"], note="check " + ("ok" if j["check_bad"] == 0 else
                                                          "FAILED"))
            if j.get("graph_ms_per_layer"):
                row["graph_ms"] = j["graph_ms_per_layer"]
            if j.get("b2b_ms") and case != "decode":
                row["b2b_ms"] = j["b2b_ms"]
            res.append(row)
        except Exception as e:
            res.append(dict(case=case, name=name, error=repr(e)[:300]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ours", required=True)
    ap.add_argument("--out", default=".")
    ap.add_argument("--skip-prefill", action="store_true",
                    help="decode rows only (no prefill peers or prefill runs of ours)")
    ap.add_argument("--prefill-only", action="store_true",
                    help="prefill rows only (no decode peers or decode runs of ours)")
    ap.add_argument("--skip-flashinfer", action="store_true",
                    help="no FlashInfer rows (its first run compiles kernels for minutes)")
    a = ap.parse_args()
    dev = torch.cuda.get_device_name(0)
    copy_tbs, gemm = ceilings()
    res = []
    ours(a.ours, res, a.skip_prefill, a.prefill_only)
    if not a.prefill_only:
        decode_peers(res)
    if not a.skip_prefill:
        prefill_peers(res, not a.skip_flashinfer)
    res.sort(key=lambda r: r["case"])  # stable: each case's rows together, kvattn first
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [f"device: {dev}; torch {torch.__version__}; {date}",
             f"measured ceilings: copy {copy_tbs:.2f} TB/s (read+write), bf16 GEMM {gemm:.0f} "
             "TFLOP/s", "",
             f"{'case':14} {'implementation':40} {'ms':>9} {'TB/s':>6} {'%copy':>6} "
             f"{'TFLOP/s':>8}  note"]
    for r in res:
        if "error" in r:
            lines.append(f"{r['case']:14} {r['name']:40} {'-':>9}  ERROR {r['error']}")
            continue
        s = r["ms"] * 1e-3
        tbs = r.get("kv_bytes", 0) / s / 1e12 if r.get("kv_bytes") else 0
        tf = r.get("flops", 0) / s / 1e12 if r.get("flops") else 0
        note = r.get("note", "")
        if r.get("b2b_ms") and r.get("flops"):
            note += (f"; back to back {r['b2b_ms']:.4f} ms = "
                     f"{r['flops'] / (r['b2b_ms'] * 1e-3) / 1e12:.1f} TFLOP/s")
        if r.get("graph_ms"):
            gt = r["kv_bytes"] / (r["graph_ms"] * 1e-3) / 1e12
            note += f"; graph replay {r['graph_ms']:.4f} ms/layer = {gt:.2f} TB/s"
        lines.append(f"{r['case']:14} {r['name']:40} {r['ms']:9.4f} {tbs:6.2f} "
                     f"{100 * tbs / copy_tbs:5.1f}% {tf:8.1f}  {note}")
    out = "\n".join(lines)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "peer_results.json"), "w") as f:
        json.dump(dict(device=dev, date=date, copy_tbs=copy_tbs, gemm_tflops=gemm, rows=res), f,
                  indent=1)
    with open(os.path.join(a.out, "table.txt"), "w") as f:
        f.write(out + "\n")
    print(out)


if __name__ == "__main__":
    main()
