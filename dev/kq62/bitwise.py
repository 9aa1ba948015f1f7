"""bitwise.py - kq62: the int8 decode's outputs and LSE of the library named by
KVATTN_LIBRARY at the AVX-512-BF16 level (VNNI key scores; KVA_CPU_ISA=avx512
for the fp32 scores, a control that must differ), written to the
.npz named by argv[1], for a bitwise comparison of two builds:
  KVATTN_LIBRARY=base.so python dev/kq62/bitwise.py /tmp/a.npz
  KVATTN_LIBRARY=new.so python dev/kq62/bitwise.py /tmp/b.npz
  python dev/kq62/bitwise.py --compare /tmp/a.npz /tmp/b.npz
Cases: int8_channel (with offsets), int8_token_k; GQA 1, 4, 8; 3 requests of
1000-3000 keys (split items at 2 threads); q of normal rows, outlier rows
and tiny rows; fixed seeds."""
import os
import sys

import numpy as np

if sys.argv[1] == "--compare":
    a, b = np.load(sys.argv[2]), np.load(sys.argv[3])
    bad = [k for k in a.files if a[k].tobytes() != b[k].tobytes()]
    print(f"{len(a.files)} arrays compared, {len(bad)} differ: {bad}")
    sys.exit(1 if bad else 0)

os.environ.setdefault("KVA_CPU_ISA", "avx512bf16")  # avx512: the fp32 scores (a control)
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests", "python"))
import kvattn  # noqa: E402
from test_core import make_batch  # noqa: E402

HKV, D, B = 4, 128, 16
res = {}
for quant in ("int8_channel", "int8_token_k"):
    for gqa in (1, 4, 8):
        rng = np.random.default_rng(1000 + gqa)
        H = HKV * gqa
        ctx = kvattn.Context("cpu", 2)
        params = {}
        if quant == "int8_channel":
            params = dict(k_scale=rng.uniform(0.01, 0.05, HKV * D).astype(np.float32),
                          k_offset=rng.uniform(-2, 2, HKV * D).astype(np.float32),
                          v_scale=np.full(HKV * D, 0.04, np.float32))
        else:
            params = dict(v_scale=np.full(HKV * D, 0.04, np.float32))
        lens = [1000, 2049, 3000]
        seq_lens, bt, slots, nb = make_batch(rng, [1, 1, 1], lens, B)
        cache = kvattn.Cache(ctx, nb, B, HKV, D, dtype="i8", quant=quant, **params)
        for r in range(3):
            k = rng.standard_normal((len(slots[r]), HKV, D)).astype(np.float32)
            v = rng.standard_normal((len(slots[r]), HKV, D)).astype(np.float32)
            cache.write(k, v, slots[r])
        plan = kvattn.Plan(ctx, [0, 1, 2, 3], seq_lens, bt, block_size=B, num_heads=H,
                           num_kv_heads=HKV, head_dim=D, q_dtype="f16")
        q = rng.standard_normal((3, H, D)).astype(np.float16)
        q[1, 0, 5] = 300.0  # an outlier dim
        q[2, -1] *= np.float16(1e-4)  # a row of tiny values
        out = np.full((3, H, D), np.nan, np.float16)
        lse = np.full((3, H), np.nan, np.float32)
        plan.run(q, cache, out=out, lse=lse)
        res[f"{quant}_gqa{gqa}_out"] = out
        res[f"{quant}_gqa{gqa}_lse"] = lse
np.savez(sys.argv[1], **res)
print(f"{len(res)} arrays from {os.environ.get('KVATTN_LIBRARY')}, finite: "
      f"{all(np.isfinite(v).all() for v in res.values())}")
