import sys
import numpy as np
sys.path.insert(0, "tests/python")
import kvattn
from kvattn import flashinfer as fi
def tryit(name, f):
    try:
        r = f(); print("OK  ", name)
    except Exception as e:
        print("EXC ", name, type(e).__name__, str(e)[:160])
ctx = kvattn.Context("cpu")
c = kvattn.Cache(ctx, 4, 4, 1, 8, dtype="f32")
p = kvattn.Plan(ctx, [0, 0], [3], [[1]], block_size=4, num_heads=2, num_kv_heads=1, head_dim=8, q_dtype="f32")
q0 = np.zeros((0, 2, 8), np.float32)
tryit("run T=0", lambda: p.run(q0, c))
tryit("run T=0 out given", lambda: p.run(q0, c, out=np.zeros((0, 2, 8), np.float32), lse=np.zeros((0, 2), np.float32)))
pr = kvattn.Plan(ctx, [0, 0], [0], None, block_size=4, num_heads=2, num_kv_heads=1, head_dim=8, q_dtype="f32")
tryit("ragged T=0", lambda: pr.run_ragged(q0, np.zeros((0, 1, 8), np.float32), np.zeros((0, 1, 8), np.float32)))
tryit("merge_states T=0", lambda: kvattn.merge_states(q0, np.zeros((0, 2), np.float32), q0, np.zeros((0, 2), np.float32)))
tryit("merge_states_n T=0", lambda: kvattn.merge_states_n(np.zeros((2, 0, 2, 8), np.float32), np.zeros((2, 0, 2), np.float32)))
tryit("merge_states_n H=0", lambda: kvattn.merge_states_n(np.zeros((2, 1, 0, 8), np.float32), np.zeros((2, 1, 0), np.float32)))
w = fi.BatchDecodeWithPagedKVCacheWrapper(None, "NHD")
kv = np.random.default_rng(0).standard_normal((4, 2, 4, 1, 8)).astype(np.float32)
tryit("fi plan R=0", lambda: w.plan(np.array([0], np.int32), np.zeros(0, np.int32), np.zeros(0, np.int32), 2, 1, 8, 4, q_data_type="float32"))
tryit("fi run R=0", lambda: w.run(q0, kv))
tryit("fi merge_state T=0", lambda: fi.merge_state(q0, np.zeros((0, 2), np.float32), q0, np.zeros((0, 2), np.float32)))
tryit("fi merge_states T=0", lambda: fi.merge_states(np.zeros((0, 3, 2, 8), np.float32), np.zeros((0, 3, 2), np.float32)))
wr = fi.BatchPrefillWithRaggedKVCacheWrapper(None, "NHD")
tryit("fi ragged plan 0", lambda: wr.plan(np.array([0, 0], np.int32), np.array([0, 0], np.int32), 2, 1, 8, q_data_type="float32"))
tryit("fi ragged run 0", lambda: wr.run(q0, np.zeros((0, 1, 8), np.float32), np.zeros((0, 1, 8), np.float32)))
import torch
tryit("torch write 0", lambda: c.write(torch.zeros(0, 1, 8), torch.zeros(0, 1, 8), torch.zeros(0, dtype=torch.int64)))
tryit("torch merge_states_n T=0", lambda: kvattn.merge_states_n(torch.zeros(2, 0, 2, 8), torch.zeros(2, 0, 2)))
