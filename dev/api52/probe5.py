"""Plan.update across mask kinds vs a fresh Plan (bit-equal), and refused updates leave the plan."""
import sys
import numpy as np
sys.path.insert(0, "tests/python")
import kvattn
rng = np.random.default_rng(int(sys.argv[1]) if len(sys.argv) > 1 else 3)
bad = 0
def batch(R, B, tree_ok, nblocks):
    ql = [int(rng.choice([0, 1, 1, 3, 4])) for _ in range(R)]
    sl = [q + int(rng.integers(0, 30)) for q in ql]
    nb = max(-(-max(sl) // B), 1)
    bt = rng.integers(1, nblocks, size=(R, nb)).astype(np.int32)
    tree = None
    if tree_ok and rng.random() < 0.6:
        tree = [[-1 if k == 0 or rng.random() < 0.3 else int(rng.integers(0, k)) for k in range(q)] for q in ql]
    casc = None
    return np.concatenate([[0], np.cumsum(ql)]).astype(np.int32), np.array(sl, np.int32), bt, tree
for trial in range(300):
    be = str(rng.choice(["ref", "cpu"]))
    ctx = kvattn.Context(be, num_threads=2)
    B = int(rng.choice([1, 3, 16])); R = int(rng.integers(1, 4)); nblocks = 200
    chunk = int(rng.choice([0, 0, 5])); window = int(rng.choice([-1, -1, 4]))
    cascade = str(rng.choice(["auto", "off"]))
    tree_ok = chunk == 0 and window < 0
    cache = kvattn.Cache(ctx, nblocks, B, 1, 8, dtype="f32")
    allk = rng.standard_normal((nblocks * B, 1, 8)).astype(np.float32)
    cache.write(allk, allk * 0.5, np.arange(nblocks * B, dtype=np.int64))
    kw = dict(block_size=B, num_heads=2, num_kv_heads=1, head_dim=8, q_dtype="f32", window_left=window,
              attention_chunk=chunk, cascade=cascade)
    q1, s1, b1, t1 = batch(R, B, tree_ok, nblocks)
    try:
        p = kvattn.Plan(ctx, q1, s1, b1, tree=t1, **kw)
    except kvattn.KvaError as e:
        print("create refused", e); continue
    for step in range(3):
        R2 = int(rng.integers(1, 4))
        q2, s2, b2, t2 = batch(R2, B, tree_ok, nblocks)
        # sometimes a shared prefix for cascade
        if R2 > 1 and rng.random() < 0.5:
            b2[1:, :1] = b2[0, :1]
        try:
            fresh = kvattn.Plan(ctx, q2, s2, b2, tree=t2, **kw)
        except kvattn.KvaError as e:
            print("fresh refused", e); continue
        qq = rng.standard_normal((int(q2[-1]), 2, 8)).astype(np.float32)
        want, wl = fresh.run(qq, cache, return_lse=True)
        p.update(q2, s2, b2, tree=t2)
        got, gl = p.run(qq, cache, return_lse=True)
        ia, ib = p.info, fresh.info
        same_info = all(getattr(ia, f) == getattr(ib, f) for f in dir(ia) if not f.startswith("_") and not callable(getattr(ia, f)))
        if not (np.array_equal(got, want, equal_nan=True) and np.array_equal(gl, wl, equal_nan=True) and same_info):
            bad += 1
            print("MISMATCH trial", trial, be, kw, "step", step, "info", same_info, "maxerr", np.nanmax(np.abs(got - want)) if got.size else 0)
        # refused update: a tree with a cycle/later parent, or wrong length
        if int(q2[-1]) >= 2 and tree_ok:
            badtree = [[0] * int(q) for q in np.diff(q2)]  # parent of token 0 = itself
            try:
                p.update(q2, s2, b2, tree=badtree)
                print("bad tree ACCEPTED", trial)
            except kvattn.KvaError:
                pass
            got2, gl2 = p.run(qq, cache, return_lse=True)
            if not np.array_equal(got2, want, equal_nan=True):
                bad += 1; print("REFUSED UPDATE CHANGED PLAN", trial)
        fresh.close()
print("done bad", bad)
