"""Two Python threads, each with its own FlashInfer wrapper made without a
workspace (so both on the process's default CPU context)."""
import sys, threading
import numpy as np
sys.path.insert(0, "tests/python")
import kvattn
from kvattn import flashinfer as fi
from test_flashinfer import random_paged
rng = np.random.default_rng(3)
H, HKV, D, PS = 8, 2, 64, 16
jobs = []
for t in range(2):
    kl = [3000 + 500 * t, 2000, 4000]
    paged, ip, ix, lp, keys, values = random_paged(rng, kl, PS, HKV, D, "NHD", np.float32, False)
    w = fi.BatchDecodeWithPagedKVCacheWrapper(None, "NHD")
    w.plan(ip, ix, lp, H, HKV, D, PS, q_data_type="float32")
    q = rng.standard_normal((3, H, D)).astype(np.float32)
    jobs.append((w, q, paged, w.run(q, paged)))
print("same ctx:", jobs[0][0]._ctx is jobs[1][0]._ctx)
bad = [0, 0]
def loop(i):
    w, q, paged, want = jobs[i]
    for _ in range(300):
        if not np.array_equal(w.run(q, paged), want):
            bad[i] += 1
ts = [threading.Thread(target=loop, args=(i,)) for i in range(2)]
[t.start() for t in ts]; [t.join() for t in ts]
print("mismatching runs:", bad)
