"""Ragged runs of tree / chunk / DCP plans vs the reference (python)."""
import sys
import numpy as np
sys.path.insert(0, "tests/python")
import kvattn
from reference import attention
rng = np.random.default_rng(4)
bad = 0
for trial in range(80):
    be = ["ref", "cpu"][trial % 2]
    ctx = kvattn.Context(be, num_threads=2)
    R = int(rng.integers(1, 4)); ql = [int(rng.choice([0, 1, 2, 4])) for _ in range(R)]
    sl = [q + int(rng.integers(0, 20)) for q in ql]
    feat = ["tree", "chunk", "dcp", "plain"][trial % 4 if trial % 8 < 4 else (trial // 8) % 4]
    kw = dict(num_heads=2, num_kv_heads=1, head_dim=8, q_dtype="f32", block_size=16)
    trees = None; chunk = 0; dcp = None
    if feat == "tree":
        trees = [[-1 if k == 0 else int(rng.integers(-1, k)) for k in range(q)] for q in ql]; kw["tree"] = trees
    if feat == "chunk":
        chunk = 3; kw["attention_chunk"] = 3
    if feat == "dcp":
        dcp = (2, int(rng.integers(0, 2)), 2); kw.update(dcp_size=2, dcp_rank=dcp[1], dcp_interleave=2)
    keys = [rng.standard_normal((s, 1, 8)).astype(np.float32) for s in sl]
    vals = [rng.standard_normal((s, 1, 8)).astype(np.float32) for s in sl]
    q = rng.standard_normal((sum(ql), 2, 8)).astype(np.float32)
    qsl = np.concatenate([[0], np.cumsum(ql)]).astype(np.int32)
    try:
        p = kvattn.Plan(ctx, qsl, np.array(sl, np.int32), None, **kw)
    except kvattn.KvaError as e:
        print(feat, "refused", e); continue
    if dcp:
        own = [((np.arange(s) // dcp[2]) % dcp[0] == dcp[1]) for s in sl]
        K = np.concatenate([k[o] for k, o in zip(keys, own)]) if sl else np.zeros((0, 1, 8), np.float32)
        V = np.concatenate([v[o] for v, o in zip(vals, own)])
    else:
        K = np.concatenate(keys); V = np.concatenate(vals)
    try:
        out, lse = p.run_ragged(q, K, V, return_lse=True)
    except kvattn.KvaError as e:
        print(feat, be, "run refused", e); continue
    want, wl = attention(q, keys, vals, ql, causal=True, chunk=chunk, trees=trees, dcp=dcp)
    if not (np.allclose(out, want, atol=1e-4) and np.allclose(lse, wl, atol=1e-4)):
        bad += 1; print("MISMATCH", trial, be, feat, ql, sl)
print("bad", bad)
