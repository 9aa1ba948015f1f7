"""api54 probe: Plan-level differential (CPU vs reference backend, and f32
caches vs the fp64 oracle) at odd head counts / head sizes, block sizes 1 and
large, q_len 0 requests, every mask kind."""
import sys, os
import numpy as np
sys.path.insert(0, "tests/python")
import kvattn
from reference import attention
from poison import poisoned, untouched

SEED = int(sys.argv[1]) if len(sys.argv) > 1 else 1
N = int(sys.argv[2]) if len(sys.argv) > 2 else 50
rng = np.random.default_rng(SEED)
ctxs = {"ref": kvattn.Context("ref"), "cpu": kvattn.Context("cpu", num_threads=2)}
HEADS = [(3, 1), (3, 3), (9, 3), (9, 1), (9, 9), (63, 7), (63, 9), (63, 21), (63, 1), (63, 63)]
bad = 0
QUANT = [("f32", "none"), ("f16", "none"), ("bf16", "none"), ("f16", "fp8_e4m3"), ("f16", "int8_token_k"),
         ("bf16", "int8_token_k_v16"), ("f32", "fp8_e4m3"), ("f32", "int8_channel")]
STORE = {"none": None, "fp8_e4m3": "fp8_e4m3", "int8_token_k": "i8", "int8_token_k_v16": "bf16", "int8_channel": "i8"}
for i in range(N):
    h, hkv = HEADS[rng.integers(len(HEADS))]
    d = int(rng.choice([8, 24, 72, 136, 264, 520, 576] if h < 63 else [8, 24, 40]))
    dv = d if rng.random() < 0.7 else int(rng.choice([8, 16, 40]))
    b = int(rng.choice([1, 2, 7, 128, 512]))
    layout = str(rng.choice(["NHD", "HND"]))
    qdt, quant = QUANT[rng.integers(len(QUANT))]
    if quant != "none":
        dv = d
    R = int(rng.integers(1, 5))
    feat = str(rng.choice(["plain", "window", "chunk", "tree", "alibi", "noncausal", "noncausal"]))
    causal = feat != "noncausal"
    q_lens = [int(rng.choice([0, 1, 2, 4, 7])) for _ in range(R)]
    if causal:
        seq = [ql + int(rng.choice([0, 1, 5, 30, 130])) for ql in q_lens]
    else:
        seq = [int(rng.choice([0, 1, 3, 30])) for _ in range(R)]
    window = int(rng.choice([0, 1, 3, 40])) if feat in ("window", "noncausal") and rng.random() < 0.6 else -1
    chunk = int(rng.choice([1, 3, 8, 64])) if feat == "chunk" else 0
    trees = None
    if feat == "tree":
        trees = [[(-1 if k == 0 or rng.random() < 0.2 else int(rng.integers(0, k))) for k in range(ql)] for ql in q_lens]
    alibi = (rng.random(h) * 0.3).astype(np.float32) if feat == "alibi" or rng.random() < 0.1 else None
    sinks = rng.standard_normal(h).astype(np.float32) if rng.random() < 0.3 else None
    softcap = float(rng.choice([0.0, 0.0, 5.0]))
    scale = float(rng.choice([0.0, 0.05]))
    dth = int(rng.choice([0, 1, 4]))
    keys = [rng.standard_normal((s, hkv, d)).astype(np.float32) for s in seq]
    vals = [rng.standard_normal((s, hkv, dv)).astype(np.float32) for s in seq]
    nblk = [-(-s // b) for s in seq]
    total = sum(nblk) + 2
    perm = rng.permutation(np.arange(total)).astype(np.int32)
    bt = np.full((R, max(max(nblk), 1) + 1), -1, np.int32)
    at = 0
    for r, n in enumerate(nblk):
        bt[r, :n] = perm[at: at + n]; at += n
    T = sum(q_lens)
    q = rng.standard_normal((T, h, d)).astype(np.float32)
    qsl = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    npdt = {"f32": np.float32, "f16": np.float16}.get(qdt)
    if npdt is None:
        import ml_dtypes
        npdt = ml_dtypes.bfloat16
    desc = dict(h=h, hkv=hkv, d=d, dv=dv, b=b, layout=layout, qdt=qdt, quant=quant, feat=feat,
                q_lens=q_lens, seq=seq, window=window, chunk=chunk, softcap=softcap, scale=scale,
                sinks=sinks is not None, alibi=alibi is not None, dth=dth)
    res = {}
    for name, ctx in ctxs.items():
        try:
            kw = {}
            if quant == "fp8_e4m3":
                kw = dict(k_scale=[0.02], v_scale=[0.03])
            if quant == "int8_token_k":
                kw = dict(v_scale=[0.03])
            if quant == "int8_channel":
                kw = dict(k_scale=np.full(hkv * d, 0.03, np.float32), v_scale=np.full(hkv * d, 0.03, np.float32),
                          k_offset=np.full(hkv * d, 0.5, np.float32), v_offset=np.full(hkv * d, -0.5, np.float32))
            cache = kvattn.Cache(ctx, total, b, hkv, d, dv, dtype=STORE[quant] or qdt, layout=layout, quant=quant, **kw)
            for r, s in enumerate(seq):
                if not s: continue
                pos = np.arange(s)
                cache.write(keys[r].astype(npdt), vals[r].astype(npdt), (bt[r, pos // b].astype(np.int64) * b + pos % b))
            pkw = dict(block_size=b, num_heads=h, num_kv_heads=hkv, head_dim=d, head_dim_v=dv, q_dtype=qdt,
                       causal=causal, window_left=window, softcap=softcap, attention_chunk=chunk, scale=scale,
                       alibi_slopes=alibi, decode_threshold=dth)
            if trees is not None: pkw["tree"] = trees
            p = kvattn.Plan(ctx, qsl, np.array(seq, np.int32), bt, **pkw)
            out = poisoned((T, h, dv), npdt)
            lse = poisoned((T, h))
            p.run(q.astype(npdt), cache, out=out, lse=lse, sinks=sinks)
            res[name] = (np.asarray(out, np.float64), np.asarray(lse, np.float64))
        except kvattn.KvaError as e:
            res[name] = "refused: " + str(e)[:200]
    if isinstance(res["ref"], str) or isinstance(res["cpu"], str):
        if res["ref"] != res["cpu"] or True:
            print("case", i, desc, res["ref"] if isinstance(res["ref"], str) else "ref ran", "|",
                  res["cpu"] if isinstance(res["cpu"], str) else "cpu ran")
        if isinstance(res["ref"], str) != isinstance(res["cpu"], str):
            bad += 1
        continue
    (o1, l1), (o2, l2) = res["ref"], res["cpu"]
    tol = {"f32": 2e-4, "f16": 4e-3, "bf16": 3e-2}[qdt]
    msgs = []
    if np.isnan(o2).any() or np.isnan(l2).any():
        msgs.append("NaN in cpu")
    if not np.allclose(o1, o2, atol=tol, rtol=tol):
        msgs.append("cpu!=ref out max %g" % np.nanmax(np.abs(o1 - o2)))
    if not np.allclose(l1, l2, atol=tol, rtol=tol, equal_nan=True):
        msgs.append("cpu!=ref lse")
    if qdt == "f32" and quant == "none":
        want, wl = attention(q, keys, vals, q_lens, causal=causal, window_left=window, softcap=softcap,
                             scale=scale or None, alibi=alibi, sinks=sinks, chunk=chunk, trees=trees)
        if not np.allclose(o1, want, atol=2e-4, rtol=2e-4):
            msgs.append("ref!=oracle out max %g" % np.nanmax(np.abs(o1 - want)))
        if not np.allclose(l1, wl, atol=2e-4, rtol=2e-4):
            msgs.append("ref!=oracle lse")
    if msgs:
        bad += 1
        print("BAD case", i, desc, msgs)
print("bad", bad, "of", N)
