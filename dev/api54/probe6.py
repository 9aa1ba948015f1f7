import sys
import numpy as np, torch
sys.path.insert(0, "tests/python")
import kvattn
from kvattn import flashinfer as fi
from reference import attention
from test_flashinfer import random_paged
from poison import poisoned, untouched, torch_poisoned, torch_untouched
LOG2E = 1 / np.log(2)
def show(name, f):
    try:
        r = f()
        print("OK  ", name, "->", r if not isinstance(r, (np.ndarray, tuple, torch.Tensor)) else "arrays")
    except Exception as e:
        print("EXC ", name, type(e).__name__, str(e)[:250])
rng = np.random.default_rng(11)
H, HKV, D, PS = 9, 3, 24, 4
paged, ip, ix, lp, keys, values = random_paged(rng, [5, 9], PS, HKV, D, "NHD", np.float16, False)
tp = tuple(torch.from_numpy(x) for x in paged)
# T = 0 batches
w = fi.BatchPrefillWithPagedKVCacheWrapper(None, "NHD")
show("prefill T0 plan", lambda: w.plan(np.zeros(3, np.int32), ip, ix, lp, H, HKV, D, PS, causal=True))
show("prefill T0 run", lambda: w.run(torch.zeros((0, H, D), dtype=torch.float16), tp, return_lse=True))
wd = fi.BatchDecodeWithPagedKVCacheWrapper(None, "NHD")
show("decode R0 plan", lambda: wd.plan(np.zeros(1, np.int32), np.zeros(0, np.int32), np.zeros(0, np.int32), H, HKV, D, PS))
show("decode R0 run", lambda: wd.run(torch.zeros((0, H, D), dtype=torch.float16), tp, return_lse=True))
wr = fi.BatchPrefillWithRaggedKVCacheWrapper(None)
show("ragged T0 plan", lambda: wr.plan(np.zeros(2, np.int32), np.array([0, 3], np.int32), H, HKV, D, causal=False))
show("ragged T0 run", lambda: wr.run(torch.zeros((0, H, D), dtype=torch.float16), torch.zeros((3, HKV, D), dtype=torch.float16), torch.zeros((3, HKV, D), dtype=torch.float16)))
# torch out variants
qo = np.array([0, 2, 5], np.int32)
w.plan(qo, ip, ix, lp, H, HKV, D, PS, causal=True)
q = torch.from_numpy(rng.standard_normal((5, H, D)).astype(np.float16))
ref = w.run(q, tp)
for nm, mk in [("f32", lambda: torch_poisoned((5, H, D), torch.float32)),
               ("transposed", lambda: torch_poisoned((H, 5, D), torch.float16).transpose(0, 1)),
               ("last-strided", lambda: torch_poisoned((5, H, 2 * D), torch.float16)[..., ::2]),
               ("expand", lambda: torch_poisoned((1, H, D), torch.float16).expand(5, H, D)),
               ("requires_grad", lambda: torch_poisoned((5, H, D), torch.float32).half().requires_grad_(True)),
               ("bigger", lambda: torch_poisoned((6, H, D), torch.float16)),
               ("overlap q", None)]:
    def f(mk=mk, nm=nm):
        out = q if nm == "overlap q" else mk()
        r = w.run(q, tp, out=out)
        return ("same" if r is out else "other", bool((r == ref).all()))
    show("torch out " + nm, f)
# lse HN with torch
l = torch_poisoned((H, 5), torch.float32)
show("lse HN", lambda: w.run(q, tp, lse=l, return_lse=True, lse_layout="HN")[1] is l)
show("lse HN transposed-view", lambda: w.run(q, tp, lse=torch_poisoned((5, H), torch.float32).t(), return_lse=True, lse_layout="HN"))
show("lse NH given, no return", lambda: (lambda ll: (w.run(q, tp, lse=ll), torch_untouched(ll))[1])(torch_poisoned((5, H), torch.float32)))
show("lse NH given, ln base no return", lambda: (lambda ll: (w.run(q, tp, lse=ll, lse_base="ln"), ll[0,0].item())[1])(torch_poisoned((5, H), torch.float32)))
o2, l2 = w.run(q, tp, return_lse=True)
o3, l3 = w.run(q, tp, return_lse=True, lse_base="ln")
print("ln base ok", torch.allclose(l3, l2 * np.log(2)))
# sinks
s = torch.from_numpy(rng.standard_normal(H).astype(np.float32))
show("sinks f16", lambda: w.run(q, tp, sinks=s.half()))
show("sinks wrong len", lambda: w.run(q, tp, sinks=s[:3].contiguous()))
show("sinks numpy list", lambda: w.run(q, tp, sinks=list(s.numpy())))
