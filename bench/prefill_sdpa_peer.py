#!/usr/bin/env python3
"""prefill_sdpa_peer.py - torch SDPA (flash and cuDNN backends) on the shapes of
bench/cuda_prefill_bench.c (causal bf16, contiguous K/V expanded to H heads),
plus the bf16 matmul ceiling, in one process. Median of 30 CUDA-event-timed
calls after 5 warm-ups; TFLOP/s = 2 * (D + Dv) * H * R * S (S + 1) / 2 / time
(Dv: the value head size; D 192 / Dv 128 is MLA's prefill with the rope part
in K).
Used by bench/prefill_mma_bench.sh; run it in the same device call as the
kvattn benchmark and compare ratios within that call only."""
import torch, statistics
from torch.nn.attention import sdpa_kernel, SDPBackend
import torch.nn.functional as F
def t(fn, reps=30):
    for _ in range(5): fn()
    torch.cuda.synchronize()
    ms = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True); b = torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record(); b.synchronize(); ms.append(a.elapsed_time(b))
    return statistics.median(ms)
x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
ms = t(lambda: x @ x, 10)
print(f"matmul 8192^3 bf16: {2*8192**3/ms/1e9:.1f} TFLOP/s (ceiling)")
del x
for name, R, S, H, Hkv, D, Dv in [("1x4096 H32/8 D128", 1, 4096, 32, 8, 128, 128),
                                  ("1x4096 H32/32 D128", 1, 4096, 32, 32, 128, 128),
                                  ("8x1024 H32/8 D128", 8, 1024, 32, 8, 128, 128),
                                  ("1x4096 H32/8 D64", 1, 4096, 32, 8, 64, 64),
                                  ("1x4096 H16/4 D256", 1, 4096, 16, 4, 256, 256),
                                  ("1x4096 H32/32 D192/128", 1, 4096, 32, 32, 192, 128)]:
    q = torch.randn(R, H, S, D, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(R, H, S, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(R, H, S, Dv, device="cuda", dtype=torch.bfloat16)
    flops = 2 * (D + Dv) * H * R * S * (S + 1) / 2
    for bname, be in [("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)]:
        try:
            with sdpa_kernel(be):
                ms = t(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
            print(f"{name:22s} sdpa-{bname:5s} {ms:8.3f} ms {flops/ms/1e9:7.1f} TFLOP/s")
        except Exception as e:
            print(f"{name:22s} sdpa-{bname:5s} failed: {str(e)[:100]}")
