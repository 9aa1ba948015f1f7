#!/usr/bin/env python3
"""peer_cascade.py - FlashInfer's shared-prefix decode next to kvattn's cascade bench.

For each shape (batch R, shared prefix P, own suffix S; H/Hkv 32/8, D 128,
page 16, bf16, one decode token per request) it times, on the same GPU and in
the same run as `kvattn bench --cascade --backend cuda`:
  * FlashInfer's BatchDecodeWithPagedKVCacheWrapper (tensor cores) over each
    request's full page list (prefix pages shared by every request): no cascade;
  * FlashInfer's MultiLevelCascadeAttentionWrapper with two levels: level 0
    holds all R query rows against the P/16 prefix pages, level 1 each
    request's own S/16 pages.
Times are medians of CUDA-event-timed runs after warm-up. A peer that cannot
run is reported with its error instead of a number.

Usage: peer_cascade.py [--shapes R:P:S,...] [--warm] [--only plain|cascade]
--warm only runs each wrapper once (FlashInfer JIT-compiles its kernels on
first use; a warm pass can overlap a build, the timed pass then finds them
compiled). --only runs one of the two wrappers: the plain tensor-core decode
and the cascade compile different kernel modules (FA2 and, on sm_90a, FA3
prefill kernels), so two --warm --only processes compile them side by side.
"""
import argparse
import traceback

import torch

from peer_cuda import median_ms

H, HKV, D, PAGE = 32, 8, 128, 16


def median_us(fn, iters, warmup):
    return median_ms(fn, iters, warmup) * 1e3


def shape(R, P, S, iters, only):
    import flashinfer

    pp, sp = P // PAGE, S // PAGE
    npages = pp + R * sp
    cache = torch.randn(npages, 2, PAGE, HKV, D, dtype=torch.bfloat16, device="cuda")
    perm = torch.randperm(npages, device="cuda").int()
    prefix = perm[:pp]
    own = perm[pp:].view(R, sp)
    q = torch.randn(R, H, D, dtype=torch.bfloat16, device="cuda")
    ws = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    i32 = dict(dtype=torch.int32, device="cuda")
    row = {}
    ref = None
    try:
        if only == "cascade":
            raise LookupError("not run (--only cascade)")
        w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_tensor_cores=True)
        full = torch.cat([prefix.expand(R, pp), own], dim=1).reshape(-1).contiguous()
        w.plan(torch.arange(R + 1, **i32) * (pp + sp), full, torch.full((R,), PAGE, **i32),
               H, HKV, D, PAGE, q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16)
        ref = w.run(q, cache)
        row["plain"] = median_us(lambda: w.run(q, cache), iters, min(iters, 5))
    except LookupError as e:
        row["plain_error"] = str(e)
    except Exception as e:
        row["plain_error"] = repr(e)[:200]
        traceback.print_exc()
    try:
        if only == "plain":
            raise LookupError("not run (--only plain)")
        c = flashinfer.MultiLevelCascadeAttentionWrapper(2, ws, "NHD")
        c.plan([torch.tensor([0, R], **i32), torch.arange(R + 1, **i32)],
               [torch.tensor([0, pp], **i32), torch.arange(R + 1, **i32) * sp],
               [prefix.contiguous(), own.reshape(-1).contiguous()],
               [torch.tensor([PAGE], **i32), torch.full((R,), PAGE, **i32)],
               H, HKV, D, PAGE, q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16)
        out = c.run(q, cache)
        if ref is not None:
            row["max_diff"] = (out.float() - ref.float()).abs().max().item()
        row["cascade"] = median_us(lambda: c.run(q, cache), iters, min(iters, 5))
    except LookupError as e:
        row["cascade_error"] = str(e)
    except Exception as e:
        row["cascade_error"] = repr(e)[:200]
        traceback.print_exc()
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="128:32768:256,64:8192:256,8:128:256")
    ap.add_argument("--warm", action="store_true")
    ap.add_argument("--only", choices=["plain", "cascade"])
    a = ap.parse_args()
    import flashinfer

    print("FlashInfer %s on %s" % (flashinfer.__version__, torch.cuda.get_device_name()))
    for s in a.shapes.split(","):
        R, P, S = (int(x) for x in s.split(":"))
        r = shape(R, P, S, 1 if a.warm else 30, a.only)
        plain, casc = r.get("plain"), r.get("cascade")
        print("peer R %d P %d S %d: flashinfer plain %s us, cascade %s us%s%s" % (
            R, P, S, "%.1f" % plain if plain else r.get("plain_error"),
            "%.1f" % casc if casc else r.get("cascade_error"),
            " (%.2fx)" % (plain / casc) if plain and casc else "",
            " max diff %.3g" % r["max_diff"] if "max_diff" in r else ""))
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
