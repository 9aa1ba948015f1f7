"""Two threads calling the trtllm decode / MLA functions (one kept wrapper per device)."""
import sys, threading
import numpy as np
sys.path.insert(0, "tests/python")
import kvattn
from kvattn.flashinfer import decode as fd, mla as fm
rng = np.random.default_rng(4)
jobs = []
for t in range(2):
    k = rng.standard_normal((200, 2, 16, 64)).astype(np.float32)
    v = rng.standard_normal((200, 2, 16, 64)).astype(np.float32)
    q = rng.standard_normal((2 + t, 8, 64)).astype(np.float32)
    bt = rng.permutation(200)[: (2 + t) * 60].reshape(2 + t, 60).astype(np.int32)
    sl = np.array([900 + 50 * t] * (2 + t))
    want = fd.trtllm_batch_decode_with_kv_cache(q, (k, v), None, bt, sl, 1000, bmm1_scale=0.1)
    jobs.append((lambda q=q, k=k, v=v, bt=bt, sl=sl: fd.trtllm_batch_decode_with_kv_cache(q, (k, v), None, bt, sl, 1000, bmm1_scale=0.1), want))
bad = [0, 0]; err = [None, None]
def loop(i):
    f, want = jobs[i]
    try:
        for _ in range(1500):
            bad[i] += not np.array_equal(f(), want)
    except Exception as e:
        err[i] = repr(e)[:200]
ts = [threading.Thread(target=loop, args=(i,), daemon=True) for i in range(2)]
[t.start() for t in ts]; [t.join(120) for t in ts]
print("alive", [t.is_alive() for t in ts], "bad", bad, "err", err)
