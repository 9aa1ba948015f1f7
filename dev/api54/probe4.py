import sys
import numpy as np
sys.path.insert(0, "tests/python")
import kvattn
from kvattn import flashinfer as fi
from reference import attention
from test_flashinfer import random_paged
from poison import poisoned, untouched
rng = np.random.default_rng(7)
D, H, HKV, PS = 16, 4, 2, 4
# same address, interleaved 5-D first, then an overlapping (k, v) tuple
nb = 6
flat = rng.standard_normal(((nb + 1) * PS * HKV * D,)).astype(np.float32)
kv5 = flat[: 6 * PS * HKV * D].reshape(3, 2, PS, HKV, D)
k1 = flat[: 3 * PS * HKV * D].reshape(3, PS, HKV, D)
v1 = flat[PS * HKV * D: 4 * PS * HKV * D].reshape(3, PS, HKV, D)
ip = np.array([0, 2], np.int32); ix = np.array([2, 0], np.int32); lp = np.array([3], np.int32)
q = rng.standard_normal((1, H, D)).astype(np.float32)
def ref(kc, vc):
    kk = np.concatenate([kc[2], kc[0]])[:7]; vv = np.concatenate([vc[2], vc[0]])[:7]
    return attention(q, [kk], [vv], [1], causal=False)[0]
w = fi.BatchDecodeWithPagedKVCacheWrapper(None, "NHD")
w.plan(ip, ix, lp, H, HKV, D, PS, q_data_type="float32")
o5 = w.run(q, kv5)
print("5-D ok", np.allclose(o5, ref(kv5[:, 0], kv5[:, 1]), atol=1e-5))
ot = w.run(q, (k1, v1))
print("tuple after 5-D ok", np.allclose(ot, ref(k1, v1), atol=1e-5))
w2 = fi.BatchDecodeWithPagedKVCacheWrapper(None, "NHD")
w2.plan(ip, ix, lp, H, HKV, D, PS, q_data_type="float32")
ot2 = w2.run(q, (k1, v1))
print("tuple fresh ok", np.allclose(ot2, ref(k1, v1), atol=1e-5))
print("5-D after tuple ok", np.allclose(w2.run(q, kv5), ref(kv5[:, 0], kv5[:, 1]), atol=1e-5))
