"""api54 probe: edge semantics of the FlashInfer wrappers."""
import sys, traceback
import numpy as np
sys.path.insert(0, "tests/python")
import kvattn
from kvattn import flashinfer as fi
from reference import attention
from test_flashinfer import random_paged
from poison import poisoned, untouched

def show(name, f):
    try:
        r = f()
        print("OK  ", name, "->", r if not isinstance(r, (np.ndarray, tuple)) else "arrays")
    except Exception as e:
        print("EXC ", name, type(e).__name__, str(e)[:250])

rng = np.random.default_rng(5)
D = 16
# causal with q_len > kv_len (FlashInfer: rows with pos < 0 see nothing)
paged, indptr, indices, last, keys, values = random_paged(rng, [3, 10], 4, 2, D, "NHD", np.float32, False)
qo = np.array([0, 5, 8], np.int32)
q = rng.standard_normal((8, 4, D)).astype(np.float32)
w = fi.BatchPrefillWithPagedKVCacheWrapper(None, "NHD")
show("causal q5>kv3 plan", lambda: w.plan(qo, indptr, indices, last, 4, 2, D, 4, causal=True, q_data_type="float32"))
# decode with a kv_len 0 request (indptr equal)
ip = np.array([0, 0, 2], np.int32); ix = np.array([1, 2], np.int32); lp = np.array([0, 3], np.int32)
wd = fi.BatchDecodeWithPagedKVCacheWrapper(None, "NHD")
show("decode kv0 plan", lambda: wd.plan(ip, ix, lp, 4, 2, D, 4, q_data_type="float32"))
q2 = rng.standard_normal((2, 4, D)).astype(np.float32)
show("decode kv0 run", lambda: print(wd.run(q2, paged, return_lse=True)[1]))
# out of wrong dtype / shape / non-contiguous
paged, indptr, indices, last, keys, values = random_paged(rng, [6, 10], 4, 2, D, "NHD", np.float32, False)
w = fi.BatchPrefillWithPagedKVCacheWrapper(None, "NHD")
qo = np.array([0, 3, 7], np.int32)
q = rng.standard_normal((7, 4, D)).astype(np.float32)
w.plan(qo, indptr, indices, last, 4, 2, D, 4, causal=True, q_data_type="float32")
for nm, out in [("f16", poisoned((7, 4, D), np.float16)), ("shape", poisoned((7, 4, D + 1))),
                ("shape2", poisoned((6, 4, D))), ("nc-last", poisoned((7, 4, 2 * D))[..., ::2]),
                ("nc-tok", poisoned((14, 4, D))[::2]), ("readonly", None), ("f64", np.zeros((7,4,D)))]:
    if nm == "readonly":
        out = poisoned((7, 4, D)); out.flags.writeable = False
    def f(out=out):
        r = w.run(q, paged, out=out)
        return ("same" if r is out else "other", untouched(out) if out.dtype != np.float64 else None)
    show("out " + nm, f)
for nm, lse in [("f16", poisoned((7, 4), np.float16)), ("shape", poisoned((7, 5))), ("HN", poisoned((4, 7))),
                ("nc", poisoned((7, 8))[:, ::2]), ("tok-stride", poisoned((14, 4))[::2])]:
    def f(lse=lse):
        r = w.run(q, paged, lse=lse, return_lse=True)
        return ("same" if r[1] is lse else "other", untouched(lse))
    show("lse " + nm, f)
# run twice
a = w.run(q, paged); b = w.run(q, paged); print("twice equal", np.array_equal(a, b))
# pos_encoding_mode
show("ROPE", lambda: w.plan(qo, indptr, indices, last, 4, 2, D, 4, pos_encoding_mode="ROPE_LLAMA", q_data_type="float32"))
show("bogus", lambda: w.plan(qo, indptr, indices, last, 4, 2, D, 4, pos_encoding_mode="XX", q_data_type="float32"))
print("after refused plans run equal", np.array_equal(w.run(q, paged), a))
# window at run
show("run window_left=2", lambda: w.run(q, paged, window_left=2))
# sm_scale 0, negative
show("sm_scale 0", lambda: w.plan(qo, indptr, indices, last, 4, 2, D, 4, sm_scale=0.0, q_data_type="float32"))
show("sm_scale -0.5", lambda: w.plan(qo, indptr, indices, last, 4, 2, D, 4, sm_scale=-0.5, q_data_type="float32"))
show("sm_scale nan", lambda: w.plan(qo, indptr, indices, last, 4, 2, D, 4, sm_scale=float('nan'), q_data_type="float32"))
show("softcap neg", lambda: w.plan(qo, indptr, indices, last, 4, 2, D, 4, logits_soft_cap=-1.0, q_data_type="float32"))
show("softcap nan", lambda: w.plan(qo, indptr, indices, last, 4, 2, D, 4, logits_soft_cap=float('nan'), q_data_type="float32"))
show("window -2", lambda: w.plan(qo, indptr, indices, last, 4, 2, D, 4, window_left=-2, q_data_type="float32"))
show("window 2.5", lambda: w.plan(qo, indptr, indices, last, 4, 2, D, 4, window_left=2.5, q_data_type="float32"))
show("window True", lambda: w.plan(qo, indptr, indices, last, 4, 2, D, 4, window_left=True, q_data_type="float32"))
show("heads 4.0", lambda: w.plan(qo, indptr, indices, last, 4.0, 2, D, 4, q_data_type="float32"))
show("page_size 4.0", lambda: w.plan(qo, indptr, indices, last, 4, 2, D, 4.0, q_data_type="float32"))
show("page_size 0", lambda: w.plan(qo, indptr, indices, last, 4, 2, D, 0, q_data_type="float32"))
show("qo decreasing", lambda: w.plan(np.array([0, 5, 3], np.int32), indptr, indices, last, 4, 2, D, 4, q_data_type="float32"))
show("qo[0]=1", lambda: w.plan(np.array([1, 3, 7], np.int32), indptr, indices, last, 4, 2, D, 4, q_data_type="float32"))
show("indptr[0]=1", lambda: w.plan(qo, indptr + 1, np.concatenate([indices, [0]]).astype(np.int32), last, 4, 2, D, 4, q_data_type="float32"))
show("last 0 with pages", lambda: w.plan(qo, indptr, indices, np.array([0, 2], np.int32), 4, 2, D, 4, causal=False, q_data_type="float32"))
show("indices out of range", lambda: w.plan(qo, indptr, np.array([0, 99, 1, 2, 3], np.int32)[:len(indices)], last, 4, 2, D, 4, q_data_type="float32"))
print("after refused plans run equal", np.array_equal(w.run(q, paged), a))
show("q wrong rows", lambda: w.run(q[:6], paged))
show("q wrong dtype", lambda: w.run(q.astype(np.float16), paged))
show("q wrong heads", lambda: w.run(q[:, :3].copy(), paged))
show("q 2D", lambda: w.run(q.reshape(7, -1), paged))
show("cache f16", lambda: w.run(q, tuple(x.astype(np.float16) for x in paged)))
show("cache HND shape", lambda: w.run(q, tuple(x.transpose(0, 2, 1, 3).copy() for x in paged)))
show("cache few blocks", lambda: w.run(q, tuple(x[:2].copy() for x in paged)))
