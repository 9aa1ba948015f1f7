import sys
import numpy as np, torch
sys.path.insert(0, "tests/python")
import kvattn
from kvattn import flashinfer as fi
from reference import attention
from test_flashinfer import random_paged
from poison import torch_poisoned, torch_untouched
LOG2E = 1 / np.log(2)
rng = np.random.default_rng(12)
H, HKV, D, PS = 9, 3, 72, 5
kl = [7, 13, 1]
paged, ip, ix, lp, keys, values = random_paged(rng, kl, PS, HKV, D, "HND", np.float32, True)
kv = torch.from_numpy(paged).to(torch.bfloat16)
keys = [torch.from_numpy(k).to(torch.bfloat16).float().numpy() for k in keys]
values = [torch.from_numpy(v).to(torch.bfloat16).float().numpy() for v in values]
qo = torch.tensor([0, 3, 8, 9], dtype=torch.int32)
q = torch.randn(9, H, D).to(torch.bfloat16)
w = fi.BatchPrefillWithPagedKVCacheWrapper(torch.empty(1024, dtype=torch.uint8), "HND")
w.plan(qo, torch.from_numpy(ip), torch.from_numpy(ix), torch.from_numpy(lp), H, HKV, D, PS, causal=True,
       q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16, logits_soft_cap=8.0)
out = torch_poisoned((9, H, D), torch.bfloat16)
lse = torch_poisoned((9, H), torch.float32)
o, l = w.run(q, kv, out=out, lse=lse, return_lse=True)
want, wl = attention(q.float().numpy(), keys, values, [3, 5, 1], causal=True, softcap=8.0)
print(o is out, np.abs(o.float().numpy() - want).max(), np.abs(l.numpy() - wl * LOG2E).max())
# decode with torch int64 metadata, HND 5-D, out non-contig
wd = fi.BatchDecodeWithPagedKVCacheWrapper(torch.empty(16, dtype=torch.uint8), "HND")
wd.plan(torch.from_numpy(ip).long(), torch.from_numpy(ix).long(), torch.from_numpy(lp).long(), H, HKV, D, PS, q_data_type="bfloat16")
qd = torch.randn(3, H, D).to(torch.bfloat16)
base = torch_poisoned((3, 2 * H, D), torch.bfloat16)
od = wd.run(qd, kv, out=base[:, ::2])
want, _ = attention(qd.float().numpy(), keys, values, [1, 1, 1], causal=False)
print(np.abs(base[:, ::2].float().numpy() - want).max(), torch_untouched(base[:, 1::2]))
