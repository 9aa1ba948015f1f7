import sys
import numpy as np
sys.path.insert(0, "tests/python")
import kvattn
from kvattn import flashinfer as fi
from reference import attention
from poison import poisoned, untouched
LOG2E = 1 / np.log(2)
rng = np.random.default_rng(21)
bad = 0
for it in range(150):
    h, hkv = [(3, 1), (9, 3), (63, 9), (63, 7), (9, 9)][rng.integers(5)]
    d = int(rng.choice([8, 24, 72, 136]))
    dv = int(rng.choice([d, 8, 40]))
    r = int(rng.integers(1, 4))
    causal = bool(rng.integers(2))
    ql = [int(rng.choice([0, 1, 3, 6])) for _ in range(r)]
    kl = [int(rng.choice([0, 2, 9, 33])) for _ in range(r)]
    if causal:
        kl = [max(a, b) for a, b in zip(kl, ql)]
    wl = int(rng.choice([-1, -1, 0, 2, 10]))
    cap = rng.choice([None, 4.0])
    alibi = rng.random() < 0.25 and not cap
    off = int(rng.choice([0, 0, 5]))
    qo = np.concatenate([[0], np.cumsum(ql)]).astype(np.int32)
    kv = (np.concatenate([[0], np.cumsum(kl)]) + off).astype(np.int32)
    dt = rng.choice([np.float32, np.float16])
    q = rng.standard_normal((qo[-1], h, d)).astype(dt)
    k = rng.standard_normal((kv[-1] + 2, hkv, d)).astype(dt)
    v = rng.standard_normal((kv[-1] + 2, hkv, dv)).astype(dt)
    desc = dict(h=h, hkv=hkv, d=d, dv=dv, ql=ql, kl=kl, causal=causal, wl=wl, cap=cap, alibi=alibi, off=off, dt=dt.__name__)
    try:
        w = fi.BatchPrefillWithRaggedKVCacheWrapper(None)
        w.plan(qo, kv, h, hkv, d, head_dim_vo=dv, causal=causal, window_left=wl, logits_soft_cap=cap,
               pos_encoding_mode="ALIBI" if alibi else "NONE", q_data_type=dt)
        out = poisoned((qo[-1], h, dv), dt)
        o, l = w.run(q, k, v, out=out, return_lse=True)
        keys = [k[kv[i]:kv[i + 1]] for i in range(r)]
        vals = [v[kv[i]:kv[i + 1]] for i in range(r)]
        sl = fi.get_alibi_slopes(h) if alibi else None
        want, wlse = attention(q, keys, vals, ql, causal=causal, window_left=wl, softcap=cap or 0.0, alibi=sl)
        tol = 3e-5 if dt == np.float32 else 4e-3
        ok = np.allclose(o, want, atol=tol, rtol=tol)
        # FlashInfer's ALiBi lse: + slope * (kv_len - q_len) per row (base 2)
        if alibi:
            shift = np.concatenate([np.full((q_, h), 0.0) + (kl_ - q_) * sl[None, :] for q_, kl_ in zip(ql, kl)]) if qo[-1] else np.zeros((0, h))
            wlse = wlse + shift
        wl2 = wlse * LOG2E
        fin = np.isfinite(wl2)
        okl = (np.isfinite(l) == fin).all() and np.allclose(l[fin], wl2[fin], atol=2e-3, rtol=1e-3)
        if not (ok and okl):
            bad += 1; print("BAD", desc, ok, okl)
    except Exception as e:
        print("EXC", desc, type(e).__name__, str(e)[:200])
print("bad", bad)
