import sys
import numpy as np
sys.path.insert(0, "tests/python")
import kvattn
from poison import poisoned, untouched
def show(name, f):
    try:
        r = f(); print("OK  ", name, "->", r)
    except Exception as e:
        print("EXC ", name, type(e).__name__, str(e)[:220])
rng = np.random.default_rng(2)
ref, cpu = kvattn.Context("ref"), kvattn.Context("cpu", 2)
kw = dict(block_size=4, num_heads=9, num_kv_heads=3, head_dim=16, q_dtype="f32")
c_ref = kvattn.Cache(ref, 4, 4, 3, 16, dtype="f32"); c_cpu = kvattn.Cache(cpu, 4, 4, 3, 16, dtype="f32")
for c in (c_ref, c_cpu):
    c.write(rng.standard_normal((10, 3, 16)).astype(np.float32), rng.standard_normal((10, 3, 16)).astype(np.float32), np.arange(10))
p = kvattn.Plan(cpu, [0, 2], [10], [[0, 1, 2]], **kw)
q = rng.standard_normal((2, 9, 16)).astype(np.float32)
want = p.run(q, c_cpu)
out = poisoned(want.shape)
show("cpu plan on ref ctx", lambda: (p.run(q, c_cpu, ctx=ref, out=out), untouched(out))[1])
show("cpu plan over ref-made cache", lambda: np.array_equal(p.run(q, c_ref), want))
show("update with ref ctx", lambda: p.update([0, 1], [5], [[0, 1]], ctx=ref))
show("after refused update", lambda: np.array_equal(p.run(q, c_cpu), want))
show("update bad seq", lambda: p.update([0, 3], [2], [[0, 1]]))
show("after refused update 2", lambda: np.array_equal(p.run(q, c_cpu), want))
show("update wrong R", lambda: p.update([0, 1, 2], [5], [[0, 1]]))
show("after refused update 3", lambda: np.array_equal(p.run(q, c_cpu), want))
show("update tree on non-tree", lambda: p.update([0, 2], [10], [[0, 1, 2]], tree=[-1, 0]))
print(p.info)
show("run after tree update", lambda: p.run(q, c_cpu).shape)
pm = kvattn.Plan(cpu, [0, 2], [10], [[0, 1, 2]], block_size=4, num_heads=9, num_kv_heads=1, head_dim=24, head_dim_v=16, q_dtype="f32", kind="mla", scale=0.1)
show("mla plan on mha cache", lambda: pm.run(rng.standard_normal((2, 9, 24)).astype(np.float32), c_cpu))
pr = kvattn.Plan(cpu, [0, 2], [10], None, **kw)
show("ragged plan run paged", lambda: pr.run(q, c_cpu))
show("paged plan run ragged", lambda: p.run_ragged(q, np.zeros((10, 3, 16), np.float32), np.zeros((10, 3, 16), np.float32)).shape)
