import sys
import numpy as np
sys.path.insert(0, "tests/python")
import kvattn
from kvattn.flashinfer import decode as fd, mla as fm
def tryit(name, f):
    try:
        r = f(); print("OK  ", name, np.asarray(r).ravel()[:4] if r is not None else None)
    except Exception as e:
        print("EXC ", name, type(e).__name__, str(e)[:200])
rng = np.random.default_rng(1)
P, page, hkv, d, h = 3, 4, 1, 8, 2
k = rng.standard_normal((P, hkv, page, d)).astype(np.float32); v = rng.standard_normal((P, hkv, page, d)).astype(np.float32)
q = rng.standard_normal((1, h, d)).astype(np.float32)
bt = np.array([[0, 1, 2]], np.int32)
T = fd.trtllm_batch_decode_with_kv_cache
tryit("seq 5", lambda: T(q, (k, v), None, bt, np.array([5]), 12))
tryit("seq 2**32+5", lambda: T(q, (k, v), None, bt, np.array([2**32 + 5]), 2**40))
tryit("seq 2.7 float", lambda: T(q, (k, v), None, bt, np.array([5.7]), 20))
tryit("seq > pages*page", lambda: T(q, (k, v), None, bt, np.array([13]), 20))
tryit("bt entry past P", lambda: T(q, (k, v), None, np.array([[0, 7, 2]], np.int32), np.array([9]), 20))
tryit("bt int64 huge", lambda: T(q, (k, v), None, np.array([[0, 2**32 + 1, 2]], np.int64), np.array([9]), 20))
tryit("max_seq_len float", lambda: T(q, (k, v), None, bt, np.array([5]), 12.5))
tryit("window_left 2", lambda: T(q, (k, v), None, bt, np.array([9]), 20, window_left=2))
tryit("bmm1 0", lambda: T(q, (k, v), None, bt, np.array([9]), 20, bmm1_scale=0.0))
tryit("bmm2 0", lambda: T(q, (k, v), None, bt, np.array([9]), 20, bmm2_scale=0.0))
tryit("sinks wrong len", lambda: T(q, (k, v), None, bt, np.array([9]), 20, sinks=np.zeros(3, np.float32)))
tryit("B=0", lambda: T(np.zeros((0, h, d), np.float32), (k, v), None, np.zeros((0, 3), np.int32), np.zeros(0, np.int64), 20))
# mla
Dc, Dr, H = 64, 16, 4
kvm = rng.standard_normal((3, page, Dc + Dr)).astype(np.float32)
qm = rng.standard_normal((1, 1, H, Dc + Dr)).astype(np.float32)
M = fm.trtllm_batch_decode_with_kv_cache_mla
tryit("mla seq 5", lambda: M(qm, kvm, None, 128, Dc, Dr, bt, np.array([5]), 12))
tryit("mla seq 2**32+5", lambda: M(qm, kvm, None, 128, Dc, Dr, bt, np.array([2**32 + 5]), 2**40))
tryit("mla seq 0", lambda: M(qm, kvm, None, 128, Dc, Dr, bt, np.array([0]), 12))
