"""Differential probe of the Python Plan features (chunk, tree, cascade, DCP,
update) vs reference.py (float64), random combos; prints disagreements."""
import sys, os, itertools
import numpy as np
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests", "python"))
import kvattn
from reference import attention

SEED = int(sys.argv[1]) if len(sys.argv) > 1 else 1
N = int(sys.argv[2]) if len(sys.argv) > 2 else 200
rng = np.random.default_rng(SEED)
ctxs = {"ref": kvattn.Context("ref"), "cpu": kvattn.Context("cpu", num_threads=2)}
bad = 0

def case(i):
    global bad
    b = int(rng.choice([1, 3, 5, 16]))
    R = int(rng.integers(1, 5))
    hkv = int(rng.choice([1, 2])); h = hkv * int(rng.choice([1, 2])); d = int(rng.choice([8, 16]))
    feat = rng.choice(["chunk", "tree", "cascade", "dcp", "plain", "chunkdcp", "treedcp", "treecascade"])
    layout = str(rng.choice(["NHD", "HND"]))
    q_lens = [int(rng.choice([0, 1, 1, 2, 3, 5])) for _ in range(R)]
    seq = [ql + int(rng.integers(0, 40)) for ql in q_lens]
    if feat == "cascade" or feat == "treecascade":
        pre = int(rng.integers(1, 4)) * b
        seq = [s + pre for s in seq]
    window = int(rng.choice([-1, -1, 3, 17]))
    chunk = int(rng.choice([2, 7, 16])) if "chunk" in feat else 0
    dcp = (int(rng.choice([2, 3])), 0, int(rng.choice([1, 2, 4]))) if "dcp" in feat else None
    if dcp: dcp = (dcp[0], int(rng.integers(0, dcp[0])), dcp[2])
    trees = None
    if "tree" in feat:
        trees = [[(-1 if k == 0 or rng.random() < 0.2 else int(rng.integers(0, k))) for k in range(ql)] for ql in q_lens]
    sinks = rng.standard_normal(h).astype(np.float32) if rng.random() < 0.3 else None
    softcap = float(rng.choice([0.0, 0.0, 5.0]))
    # keys: shared prefix for cascade
    keys = [rng.standard_normal((s, hkv, d)).astype(np.float32) for s in seq]
    vals = [rng.standard_normal((s, hkv, d)).astype(np.float32) for s in seq]
    nblk = [-(-s // b) for s in seq]
    total = sum(nblk) + 3
    perm = rng.permutation(np.arange(1, total + 1)).astype(np.int32)
    bt = np.full((R, max(max(nblk), 1)), -1, np.int32)
    at = 0
    for r, n in enumerate(nblk):
        bt[r, :n] = perm[at: at + n]; at += n
    if feat in ("cascade", "treecascade") and R > 1:
        npre = pre // b
        for r in range(1, R):
            bt[r, :npre] = bt[0, :npre]
            keys[r][:pre] = keys[0][:pre]; vals[r][:pre] = vals[0][:pre]
    q = rng.standard_normal((sum(q_lens), h, d)).astype(np.float32)
    qsl = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    want, wl = attention(q, keys, vals, q_lens, causal=True, window_left=window, softcap=softcap,
                         sinks=sinks, chunk=chunk, trees=trees, dcp=dcp)
    for name, ctx in ctxs.items():
        cache = kvattn.Cache(ctx, total + 1, b, hkv, d, dtype="f32", layout=layout)
        for r, s in enumerate(seq):
            if not s: continue
            pos = np.arange(s)
            if dcp:
                own = (pos // dcp[2]) % dcp[0] == dcp[1]
                loc = kvattn.dcp_local_lens(np.array([s], np.int32), dcp[0], dcp[1], dcp[2])[0]
                sl = kvattn.dcp_slots(bt[r], 0, s, dcp_size=dcp[0], dcp_rank=dcp[1], block_size=b, dcp_interleave=dcp[2])
                cache.write(keys[r], vals[r], np.asarray(sl, np.int64))
            else:
                cache.write(keys[r], vals[r], (bt[r, pos // b] * b + pos % b).astype(np.int64))
        kw = dict(block_size=b, num_heads=h, num_kv_heads=hkv, head_dim=d, q_dtype="f32",
                  causal=True, window_left=window, softcap=softcap, attention_chunk=chunk)
        if trees is not None: kw["tree"] = trees
        if feat in ("cascade", "treecascade"): kw["cascade"] = "on"
        if dcp: kw.update(dcp_size=dcp[0], dcp_rank=dcp[1], dcp_interleave=dcp[2])
        try:
            p = kvattn.Plan(ctx, qsl, np.array(seq, np.int32), bt, **kw)
            out, lse = p.run(q, cache, return_lse=True, sinks=sinks)
        except kvattn.KvaError as e:
            print("case", i, name, feat, "refused:", e); continue
        out = np.asarray(out, np.float64); lse = np.asarray(lse, np.float64)
        ok = np.allclose(out, want, atol=2e-4, rtol=2e-4, equal_nan=False) and \
            np.allclose(lse, wl, atol=2e-4, rtol=2e-4)
        if not ok:
            bad += 1
            print("MISMATCH case", i, name, feat, dict(b=b, R=R, h=h, hkv=hkv, d=d, layout=layout, q_lens=q_lens,
                  seq=seq, window=window, chunk=chunk, dcp=dcp, trees=trees, sinks=sinks is not None, softcap=softcap),
                  "maxerr", np.nanmax(np.abs(out - want)) if out.size else 0)

for i in range(N):
    case(i)
print("done", N, "bad", bad)
