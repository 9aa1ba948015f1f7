import sys
import numpy as np
sys.path.insert(0, "tests/python")
import kvattn
from kvattn import flashinfer as fi
from reference import attention
rng = np.random.default_rng(3)
NP, B, H = 3, 4, 4
buf = rng.standard_normal(NP * B * 80).astype(np.float32)
w = fi.BatchMLAPagedAttentionWrapper(None)
for dc, dr in [(64, 16), (48, 32), (56, 16)]:
    kv = buf[: NP * B * (dc + dr)].reshape(NP, B, dc + dr)
    q = rng.standard_normal((2, H, dc + dr)).astype(np.float32)
    w.plan(np.array([0, 1, 2]), np.array([0, 1, 3]), np.array([2, 0, 1]), np.array([3, 6]), H, dc, dr, B, False, 0.1, "float32", "float32")
    try:
        o = w.run(query=q, kv_cache=kv)
        rows = [kv[[2]].reshape(-1, dc + dr)[:3], kv[[0, 1]].reshape(-1, dc + dr)[:6]]
        want, _ = attention(q, [r[:, None] for r in rows], [r[:, None, :dc] for r in rows], [1, 1], causal=False, scale=0.1)
        print(dc, dr, "ok", np.allclose(o, want, atol=1e-5))
    except Exception as e:
        print(dc, dr, "EXC", type(e).__name__, e)
