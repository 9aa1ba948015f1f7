import sys
import numpy as np
sys.path.insert(0, "tests/python")
import kvattn
from kvattn import flashinfer as fi
from reference import attention
from poison import poisoned
LOG2E = 1 / np.log(2)
rng = np.random.default_rng(41)
bad = 0
for it in range(60):
    h = int(rng.choice([1, 3, 9, 63, 128]))
    dc, dr = [(512, 64), (128, 64), (64, 16), (256, 32), (8, 8), (64, 0)][rng.integers(6)]
    ps = int(rng.choice([1, 2, 64, 128]))
    r = int(rng.integers(1, 4))
    ql = [int(rng.choice([0, 1, 2, 5])) for _ in range(r)]
    kl = [q + int(rng.choice([0, 3, 70])) for q in ql]
    npg = [max(1, -(-s // ps)) for s in kl]
    nb = sum(npg) + 1
    perm = rng.permutation(nb).astype(np.int32)
    ip = np.concatenate([[0], np.cumsum(npg)]).astype(np.int32)
    ix = perm[: ip[-1]]
    dt = rng.choice([np.float32, np.float16])
    kv = rng.standard_normal((nb, ps, dc + dr)).astype(dt)
    qo = np.concatenate([[0], np.cumsum(ql)]).astype(np.int32)
    q = rng.standard_normal((qo[-1], h, dc + dr)).astype(dt)
    causal = bool(rng.integers(2)) or True
    desc = (h, dc, dr, ps, ql, kl, dt.__name__)
    try:
        w = fi.BatchMLAPagedAttentionWrapper(None)
        w.plan(qo, ip, ix, np.array(kl, np.int32), h, dc, dr, ps, causal, 0.07, dt, dt)
        o, l = w.run(query=q, kv_cache=kv, out=poisoned((qo[-1], h, dc), dt), return_lse=True)
        keys = [kv[ix[ip[i]:ip[i + 1]]].reshape(-1, dc + dr)[:kl[i], None, :] for i in range(r)]
        want, wl = attention(q, keys, [k_[..., :dc] for k_ in keys], ql, causal=True, scale=0.07)
        tol = 5e-5 if dt == np.float32 else 3e-3
        if not (np.allclose(o, want, atol=tol, rtol=tol) and np.allclose(l, wl * LOG2E, atol=3e-3, rtol=1e-3)):
            bad += 1; print("BAD", desc, np.abs(o - want).max())
    except Exception as e:
        print("EXC", desc, type(e).__name__, str(e)[:200])
print("bad", bad)
