import sys
import numpy as np
sys.path.insert(0, "tests/python")
import kvattn
from reference import attention
from poison import poisoned, untouched
def show(name, f):
    try:
        r = f()
        print("OK  ", name, "->", r)
    except Exception as e:
        print("EXC ", name, type(e).__name__, str(e)[:250])
rng = np.random.default_rng(4)
H, HKV, D, B = 9, 3, 24, 5
seq = [40, 7, 300]; ql = [3, 1, 0]
nb = sum(-(-s // B) for s in seq) + 1
bt = np.full((3, 70), -1, np.int32); at = 0
for r, s in enumerate(seq):
    n = -(-s // B); bt[r, :n] = np.arange(at, at + n); at += n
qsl = np.concatenate([[0], np.cumsum(ql)]).astype(np.int32)
q = rng.standard_normal((sum(ql), H, D)).astype(np.float32)
a = kvattn.Context("cpu", 4); b = kvattn.Context("cpu", 1); c = kvattn.Context("cpu", 4)
cache = kvattn.Cache(a, nb, B, HKV, D, dtype="f32")
keys = [rng.standard_normal((s, HKV, D)).astype(np.float32) for s in seq]
vals = [rng.standard_normal((s, HKV, D)).astype(np.float32) for s in seq]
for r, s in enumerate(seq):
    pos = np.arange(s); cache.write(keys[r], vals[r], bt[r, pos // B].astype(np.int64) * B + pos % B)
kw = dict(block_size=B, num_heads=H, num_kv_heads=HKV, head_dim=D, q_dtype="f32", cascade="off")
p = kvattn.Plan(a, qsl, np.array(seq, np.int32), bt, **kw)
want = p.run(q, cache)
out = poisoned(want.shape)
show("run on fresh 1-thread ctx", lambda: (p.run(q, cache, ctx=b, out=out), untouched(out))[1])
out = poisoned(want.shape)
show("run on fresh 4-thread ctx", lambda: (p.run(q, cache, ctx=c, out=out), untouched(out))[1])
pc = kvattn.Plan(c, qsl, np.array(seq, np.int32), bt, **kw)
show("run on ctx c after same desc plan", lambda: np.array_equal(p.run(q, cache, ctx=c), want))
pb = kvattn.Plan(b, qsl, np.array(seq, np.int32), bt, **kw)
show("run on ctx b after own plan (1 thread)", lambda: np.allclose(p.run(q, cache, ctx=b), want, atol=1e-6))
# q_len 0 requests and info
i1 = p.info
p2 = kvattn.Plan(a, np.array([0, 3, 4], np.int32), np.array(seq[:2], np.int32), bt[:2], **kw)
print("info with q0:", i1); print("info without:", p2.info)
print("reorder", kvattn.reorder_decode_first([0, 3, 1, 0, 2], 0), kvattn.reorder_decode_first([0, 3, 1, 0, 2], 2))
