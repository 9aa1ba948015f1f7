"""Very long single requests on the CPU backend vs a float64 oracle on sampled rows."""
import sys, time
import numpy as np
import kvattn
rng = np.random.default_rng(7)
ctx = kvattn.Context("cpu", num_threads=2)
H, HKV, D = 4, 2, 16
def oracle(q, K, V, pos, scale, window=-1, chunk=0, softcap=0.0, sink=None):
    # q [H, D]; K, V [s, Hkv, D] float64
    s = K.shape[0]; j = np.arange(s)
    vis = j <= pos
    if window >= 0: vis &= pos - j <= window
    if chunk: vis &= j // chunk == pos // chunk
    out = np.zeros((H, D)); lse = np.zeros(H)
    for h in range(H):
        kh = h // (H // HKV)
        sc = (K[vis, kh] @ q[h]) * scale
        if softcap: sc = softcap * np.tanh(sc / softcap)
        allsc = sc if sink is None else np.concatenate([sc, [sink[h]]])
        m = allsc.max(); e = np.exp(allsc - m); den = e.sum()
        out[h] = (np.exp(sc - m) / den) @ V[vis, kh]; lse[h] = m + np.log(den)
    return out, lse
bad = 0
for (s, ql, B, dt, window, chunk, softcap, layout) in [
        (65536, 1, 16, "f16", -1, 0, 0.0, "NHD"), (65537, 3, 16, "bf16", -1, 0, 0.0, "HND"),
        (70001, 40, 7, "f16", -1, 0, 0.0, "NHD"), (131073, 2, 16, "f32", 1000, 0, 0.0, "NHD"),
        (100000, 5, 32, "f16", -1, 8192, 30.0, "HND"), (1 << 20, 1, 256, "f16", -1, 0, 0.0, "NHD"),
        (300000, 700, 16, "bf16", -1, 0, 0.0, "NHD")]:
    t0 = time.time()
    nb = -(-s // B) + 1
    cache = kvattn.Cache(ctx, nb, B, HKV, D, dtype=dt, layout=layout)
    K = rng.standard_normal((s, HKV, D)).astype(np.float32)
    V = rng.standard_normal((s, HKV, D)).astype(np.float32)
    perm = rng.permutation(nb - 1).astype(np.int32) + 1
    bt = perm[None, :]
    pos = np.arange(s)
    cache.write(K, V, (perm[pos // B].astype(np.int64) * B + pos % B))
    # what the cache holds (rounded)
    import ml_dtypes
    cast = {"f16": np.float16, "bf16": ml_dtypes.bfloat16, "f32": np.float32}[dt]
    Kc = K.astype(cast).astype(np.float64); Vc = V.astype(cast).astype(np.float64)
    q = rng.standard_normal((ql, H, D)).astype(np.float32).astype(cast)
    sink = rng.standard_normal(H).astype(np.float32) if softcap else None
    p = kvattn.Plan(ctx, [0, ql], [s], bt, block_size=B, num_heads=H, num_kv_heads=HKV, head_dim=D,
                    q_dtype=dt, window_left=window, attention_chunk=chunk, softcap=softcap)
    out, lse = p.run(q, cache, return_lse=True, sinks=sink)
    out = np.asarray(out).astype(np.float64)
    rows = sorted(set([0, ql - 1] + list(rng.integers(0, ql, size=min(ql, 6)))))
    for i in rows:
        w, wl = oracle(q[i].astype(np.float64), Kc, Vc, s - ql + i, 1 / np.sqrt(D), window, chunk, softcap, sink)
        tol = 2e-2 if dt != "f32" else 1e-4
        e = np.abs(out[i] - w).max(); el = np.abs(lse[i] - wl).max()
        if not (e <= tol and el <= 1e-3):
            bad += 1; print("MISMATCH", s, ql, B, dt, "row", i, "err", e, "lse err", el)
    print("case s=%d q=%d B=%d %s ok (%.1f s), max err rows %s" % (s, ql, B, dt, time.time() - t0, rows))
print("bad", bad)
