"""kvattn.h's rule for an infinite element of q over quantized caches, on the
reference and CPU backends (every ISA level): the scores are the IEEE
products over the keys as the format defines them, so a row whose q holds
-inf in a channel where every visible key is positive writes out 0 and lse
-inf, and the item's other rows are unchanged. The CUDA test test_cuda_nan.c
runs these rows too, but its CPU stand-in is built only with CUDA; here a
plain CPU build runs them. Over int8 keys the CPU's VNNI scores
(kva__cpu_kq_prepare_avx512, src/attn/cpu/cpu_attn.h) must hand such an item
to the fp32 scores: its other rows (heads of the same kv head) are compared
with the reference, and a second request without -inf keeps the VNNI
path."""

import numpy as np
import pytest

import kvattn
from poison import poisoned
from test_core import make_batch

H, HKV, D, B, CH = 8, 2, 64, 4, 7  # CH: the channel that holds -inf
ROW = (0, 1)  # token 0 (request 0's decode), head 1 (kv head 0)

FORMATS = {
    # quant: cache dtype, scale / offset arrays
    "int8_channel": ("i8", dict(k_scale=np.full(HKV * D, 0.04, np.float32),
                                k_offset=np.tile(np.arange(D) % 7 - 3, HKV).astype(np.float32),
                                v_scale=np.full(HKV * D, 0.04, np.float32))),
    "int8_token_k": ("i8", dict(v_scale=np.full(HKV * D, 0.04, np.float32))),
    "int8_token_k_v16": ("f16", {}),
    "fp8_e4m3": ("fp8_e4m3", dict(k_scale=[0.02], v_scale=[0.02])),
}


def _run(backend, quant, isa, monkeypatch):
    rng = np.random.default_rng(11)
    if isa:
        monkeypatch.setenv("KVA_CPU_ISA", isa)
    else:
        monkeypatch.delenv("KVA_CPU_ISA", raising=False)
    ctx = kvattn.Context(backend, 2)
    dtype, params = FORMATS[quant]
    seq_lens, bt, slots, nb = make_batch(rng, [1, 1], [37, 20], B)
    cache = kvattn.Cache(ctx, nb, B, HKV, D, dtype=dtype, quant=quant, **params)
    for r in range(2):
        k = rng.standard_normal((len(slots[r]), HKV, D)).astype(np.float32)
        v = rng.standard_normal((len(slots[r]), HKV, D)).astype(np.float32)
        k[:, 0, CH] = 1.0 + np.abs(k[:, 0, CH])  # every key of kv head 0: positive there
        cache.write(k, v, slots[r])
    plan = kvattn.Plan(ctx, [0, 1, 2], seq_lens, bt, block_size=B, num_heads=H,
                       num_kv_heads=HKV, head_dim=D, q_dtype="f16")
    q = rng.standard_normal((2, H, D)).astype(np.float16)
    q[ROW + (CH,)] = -np.inf
    out, lse = poisoned((2, H, D), np.float16), poisoned((2, H), np.float32)
    plan.run(q, cache, out=out, lse=lse)
    return out.astype(np.float32), lse


@pytest.mark.parametrize("quant", sorted(FORMATS))
@pytest.mark.parametrize("isa", [None, "portable", "avx2", "avx512", "avx512bf16"])
def test_neg_inf_q_over_quantized_cache(quant, isa, monkeypatch):
    ro, rl = _run("ref", quant, None, monkeypatch)
    out, lse = _run("cpu", quant, isa, monkeypatch)
    for o, l, who in ((ro, rl, "ref"), (out, lse, "cpu")):
        assert np.all(o[ROW] == 0.0) and l[ROW] == -np.inf, (who, o[ROW][:4], l[ROW])
    fin = np.ones((2, H), bool)
    fin[ROW] = False
    assert np.all(np.isfinite(out[fin])) and np.all(np.isfinite(lse[fin]))
    np.testing.assert_allclose(out[fin], ro[fin], rtol=2e-3, atol=2e-3)
    np.testing.assert_allclose(lse[fin], rl[fin], rtol=1e-5, atol=1e-5)
