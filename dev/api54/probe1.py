"""api54 probe: random paged prefill / decode wrapper cases vs reference.py."""
import sys, traceback
import numpy as np
sys.path.insert(0, "tests/python")
import kvattn
from kvattn import flashinfer as fi
from reference import attention
from test_flashinfer import random_paged
from poison import poisoned, untouched

rng = np.random.default_rng(int(sys.argv[1]) if len(sys.argv) > 1 else 1)
HEADS = [(3, 1), (3, 3), (9, 3), (9, 1), (9, 9), (63, 7), (63, 9), (63, 21), (63, 1)]
DS = [8, 24, 40, 72, 136, 264]
PAGES = [1, 2, 5, 64, 256]
fails = 0
for it in range(int(sys.argv[2]) if len(sys.argv) > 2 else 60):
    h, hkv = HEADS[rng.integers(len(HEADS))]
    d = int(rng.choice(DS)) if h < 63 else int(rng.choice([8, 24, 40]))
    ps = int(rng.choice(PAGES))
    layout = str(rng.choice(["NHD", "HND"]))
    dt = rng.choice([np.float32, np.float16])
    r = int(rng.integers(1, 5))
    causal = bool(rng.integers(2))
    ql = [int(rng.choice([0, 1, 2, 5, 9])) for _ in range(r)]
    kl = [int(rng.choice([0, 1, 3, 17, 70])) for _ in range(r)]
    if causal:
        kl = [max(k, q) for k, q in zip(kl, ql)]
    wl = int(rng.choice([-1, -1, 0, 1, 7]))
    cap = rng.choice([None, 5.0])
    sm = rng.choice([None, 0.2])
    kind = str(rng.choice(["prefill", "decode"]))
    if kind == "decode":
        ql = [1] * r
    desc = dict(kind=kind, h=h, hkv=hkv, d=d, ps=ps, layout=layout, dt=dt.__name__, ql=ql, kl=kl,
                causal=causal, wl=wl, cap=cap, sm=sm)
    try:
        paged, indptr, indices, last, keys, values = random_paged(rng, kl, ps, hkv, d, layout, dt,
                                                                  bool(rng.integers(2)))
        # random_paged gives kv 0 one page with last = 0 - 0*ps = 0
        T = sum(ql)
        q = rng.standard_normal((T, h, d)).astype(dt)
        qo = np.concatenate([[0], np.cumsum(ql)]).astype(np.int32)
        if kind == "prefill":
            w = fi.BatchPrefillWithPagedKVCacheWrapper(None, layout)
            w.plan(qo, indptr, indices, last, h, hkv, d, ps, causal=causal, window_left=wl,
                   logits_soft_cap=cap, sm_scale=sm, q_data_type=dt)
            eff_causal = causal
        else:
            w = fi.BatchDecodeWithPagedKVCacheWrapper(None, layout)
            w.plan(indptr, indices, last, h, hkv, d, ps, window_left=wl, logits_soft_cap=cap,
                   sm_scale=sm, q_data_type=dt)
            eff_causal = False
        out = poisoned((T, h, d), dt)
        o, l = w.run(q, paged, out=out, return_lse=True)
        want, wl_ = attention(q, keys, values, ql, causal=eff_causal, window_left=wl,
                              softcap=cap or 0.0, scale=sm)
        tol = 2e-5 if dt == np.float32 else 3e-3
        np.testing.assert_allclose(o.astype(np.float64), want, rtol=tol * 5, atol=tol * 5)
        wlse = wl_ / np.log(2)
        np.testing.assert_allclose(np.where(np.isinf(wlse), 0, l), np.where(np.isinf(wlse), 0, wlse),
                                   rtol=1e-4, atol=1e-3)
        assert (np.isinf(l) == np.isinf(wlse)).all(), "inf pattern"
    except Exception as e:
        fails += 1
        print("FAIL", desc, type(e).__name__, str(e)[:300])
print("fails", fails)
