#!/usr/bin/env python3
"""prefill_sdpa_peer.py - torch SDPA (flash and cuDNN backends) on the shapes of
bench/cuda_prefill_bench.c (causal bf16, contiguous K/V expanded to H heads),
plus the bf16 matmul ceiling, in one process. Median of 30 CUDA-event-timed
calls after 5 warm-ups ("per call"), and the mean of 30 calls enqueued back to
back between one pair of events ("b2b"); TFLOP/s = 2 * (D + Dv) * H * (visible
query-key pairs) / time, pairs = R * q (q + 1) / 2 + R * q * ctx for R prompts
of q tokens after ctx cached ones (causal, bottom-right aligned) (Dv: the value
head size; D 192 / Dv 128 is MLA's prefill with the rope part in K).
Argument "short" (issue 23): the serving step's short prefills instead, 1 x
4096, 2 x 2048, 8 x 1024, 32 x 256 and 4 x 1024 after 3072 cached tokens, at
H/Hkv 32/8, D 128 (the shapes of `bench_cuda --mode prefill`).
With "short", FlashInfer's BatchPrefillWithPagedKVCacheWrapper runs too when
flashinfer imports (paged NHD cache of Hkv heads, page 16, causal bottom-right
aligned), per call and back to back like SDPA. KVA_FI_PREBUILT=DIR: load its
JIT module from DIR/<uri>/<uri>.so, compiled elsewhere (e.g. on a machine
without a GPU with FLASHINFER_CUDA_ARCH_LIST=9.0a), and compile nothing here.
Used by bench/prefill_mma_bench.sh; run it in the same device call as the
kvattn benchmark and compare ratios within that call only."""
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from peer_timing import timed  # bench/peer_timing.py: per call and b2b, as decode_fi_peer.py

fi = None  # flashinfer, imported by main() with "short"


def fi_paged(R, S, C, H, Hkv, D, page=16):
    """FlashInfer's paged prefill over a random cache of R requests of S + C keys."""
    per = (S + C + page - 1) // page
    cache = torch.randn(R * per + 1, 2, page, Hkv, D, device="cuda", dtype=torch.bfloat16)
    idx = torch.randperm(R * per + 1, device="cuda")[:R * per].int()
    qo = torch.arange(0, R + 1, dtype=torch.int32, device="cuda") * S
    kvp = torch.arange(0, R + 1, dtype=torch.int32, device="cuda") * per
    last = torch.full((R,), (S + C) - (per - 1) * page, dtype=torch.int32, device="cuda")
    ws = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    w = fi.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD")
    w.plan(qo, kvp, idx, last, H, Hkv, D, page, causal=True,
           q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16)
    qf = torch.randn(R * S, H, D, device="cuda", dtype=torch.bfloat16)
    return lambda: w.run(qf, cache)


def main():
    global fi
    x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    ms, _ = timed(lambda: x @ x, 10)
    print(f"matmul 8192^3 bf16: {2*8192**3/ms/1e9:.1f} TFLOP/s (ceiling)")
    del x
    # name, R, q_len, cached tokens, H, Hkv, D, Dv
    if len(sys.argv) > 1 and sys.argv[1] == "short":
        shapes = [("1x4096 H32/8 D128", 1, 4096, 0, 32, 8, 128, 128),
                  ("2x2048 H32/8 D128", 2, 2048, 0, 32, 8, 128, 128),
                  ("8x1024 H32/8 D128", 8, 1024, 0, 32, 8, 128, 128),
                  ("32x256 H32/8 D128", 32, 256, 0, 32, 8, 128, 128),
                  ("4x1024+3072 H32/8 D128", 4, 1024, 3072, 32, 8, 128, 128)]
    else:
        shapes = [("1x4096 H32/8 D128", 1, 4096, 0, 32, 8, 128, 128),
                  ("1x4096 H32/32 D128", 1, 4096, 0, 32, 32, 128, 128),
                  ("8x1024 H32/8 D128", 8, 1024, 0, 32, 8, 128, 128),
                  ("1x4096 H32/8 D64", 1, 4096, 0, 32, 8, 64, 64),
                  ("1x4096 H16/4 D256", 1, 4096, 0, 16, 4, 256, 256),
                  ("1x4096 H32/32 D192/128", 1, 4096, 0, 32, 32, 192, 128)]
    fi = None
    if len(sys.argv) > 1 and sys.argv[1] == "short":
        try:
            import os
            import flashinfer as fi
            pre = os.environ.get("KVA_FI_PREBUILT")
            if pre:
                # The module is loaded from PRE/<uri>/<uri>.so (compiled elsewhere);
                # nothing is generated or compiled here (bench/decode_fi_peer.py's patch).
                from decode_fi_peer import use_prebuilt
                use_prebuilt(pre)
        except Exception as e:
            print(f"flashinfer: not run ({str(e)[:100]})")
            fi = None
    for name, R, S, C, H, Hkv, D, Dv in shapes:
        q = torch.randn(R, H, S, D, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(R, H, S + C, D, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(R, H, S + C, Dv, device="cuda", dtype=torch.bfloat16)
        flops = 2 * (D + Dv) * H * R * (S * (S + 1) / 2 + S * C)
        # A fresh prompt: is_causal (top-left = bottom-right); after cached tokens:
        # the bottom-right aligned causal bias.
        if C == 0:
            call = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            from torch.nn.attention.bias import causal_lower_right
            bias = causal_lower_right(S, S + C)
            call = lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        for bname, be in [("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)]:
            try:
                with sdpa_kernel(be):
                    ms, b2b = timed(call)
                print(f"{name:22s} sdpa-{bname:5s} {ms:8.3f} ms {flops/ms/1e9:7.1f} TFLOP/s"
                      f"  b2b {b2b:8.3f} ms {flops/b2b/1e9:7.1f} TFLOP/s")
            except Exception as e:
                print(f"{name:22s} sdpa-{bname:5s} failed: {str(e)[:100]}")
        if fi is not None and D == Dv:
            try:
                ms, b2b = timed(fi_paged(R, S, C, H, Hkv, D))
                print(f"{name:22s} flashinfer {ms:7.3f} ms {flops/ms/1e9:7.1f} TFLOP/s"
                      f"  b2b {b2b:8.3f} ms {flops/b2b/1e9:7.1f} TFLOP/s  (paged, page 16, {fi.__version__})")
            except Exception as e:
                print(f"{name:22s} flashinfer failed: {str(e)[:160]}")


if __name__ == "__main__":
    main()
