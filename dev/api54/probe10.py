import sys
import numpy as np
sys.path.insert(0, "tests/python")
import kvattn
from kvattn import flashinfer as fi
from reference import attention, ancestors
from test_flashinfer import random_paged
from poison import poisoned
LOG2E = 1 / np.log(2)
rng = np.random.default_rng(31)
bad = 0
for it in range(120):
    h, hkv = [(3, 1), (9, 3), (63, 9), (63, 21), (9, 9)][rng.integers(5)]
    d = int(rng.choice([8, 24, 72]))
    ps = int(rng.choice([1, 3, 64, 256]))
    layout = str(rng.choice(["NHD", "HND"]))
    r = int(rng.integers(1, 4))
    ql = [int(rng.choice([0, 1, 4, 9])) for _ in range(r)]
    kl = [q + int(rng.choice([0, 1, 20])) for q in ql]
    trees = [[(-1 if k == 0 or rng.random() < 0.2 else int(rng.integers(0, k))) for k in range(q)] for q in ql]
    masks = []
    for q, s, t in zip(ql, kl, trees):
        m = np.zeros((q, s), bool)
        for i in range(q):
            m[i, : s - q] = True
            for a in ancestors(t, i):
                m[i, s - q + a] = True
        masks.append(m.reshape(-1))
    flat = np.concatenate(masks) if masks else np.zeros(0, bool)
    packed = np.concatenate([np.packbits(m, bitorder="little") for m in masks]).astype(np.uint8)
    dt = rng.choice([np.float32, np.float16])
    paged, ip, ix, lp, keys, values = random_paged(rng, kl, ps, hkv, d, layout, dt, bool(rng.integers(2)))
    qo = np.concatenate([[0], np.cumsum(ql)]).astype(np.int32)
    q = rng.standard_normal((qo[-1], h, d)).astype(dt)
    use_packed = bool(rng.integers(2))
    try:
        w = fi.BatchPrefillWithPagedKVCacheWrapper(None, layout)
        w.plan(qo, ip, ix, lp, h, hkv, d, ps, custom_mask=None if use_packed else flat,
               packed_custom_mask=packed if use_packed else None, q_data_type=dt, causal=bool(rng.integers(2)))
        o, l = w.run(q, paged, out=poisoned(q.shape, dt), return_lse=True)
        want, wl = attention(q, keys, values, ql, causal=True, trees=trees)
        tol = 3e-5 if dt == np.float32 else 4e-3
        if not (np.allclose(o, want, atol=tol, rtol=tol) and np.allclose(l, wl * LOG2E, atol=2e-3)):
            bad += 1; print("BAD", h, hkv, d, ps, layout, ql, kl)
    except Exception as e:
        print("EXC", h, hkv, d, ps, layout, ql, kl, type(e).__name__, str(e)[:200])
print("bad", bad)
