"""api56 probe (dev/, not a test): random FlashInfer paged decode / prefill wrapper
plans and runs (page sizes 1-16, GQA, NHD / HND, (k, v) or 5-D caches, pages of other
batches before the indptr, q_len 0 / kv_len 0 requests, windows, soft-cap, sm_scale,
ALiBi with FlashInfer's LSE shift) against tests/python/reference.py in float64.
  KVATTN_LIBRARY=build/libkvattn.so PYTHONPATH=python:tests/python python dev/api56/fuzz_fi.py SEED N
"""
import math, sys, numpy as np, kvattn
from kvattn import flashinfer as fi
from reference import attention
LOG2E = 1/math.log(2)
seed = int(sys.argv[1]) if len(sys.argv) > 1 else 0
N = int(sys.argv[2]) if len(sys.argv) > 2 else 200
rng = np.random.default_rng(seed)
bad = 0
for case in range(N):
    R = int(rng.integers(1, 6)); ps = int(rng.choice([1, 2, 3, 4, 16])); hkv = int(rng.integers(1, 4)); g = int(rng.choice([1, 2, 3, 8]))
    H = hkv * g; D = int(rng.choice([8, 16, 24, 64])); layout = str(rng.choice(["NHD", "HND"])); five = bool(rng.integers(2))
    decode = bool(rng.integers(2))
    q_lens = [1]*R if decode else [int(rng.choice([0, 1, 2, 5])) for _ in range(R)]
    causal = True if decode else bool(rng.integers(2))
    kv_lens = []
    for ql in q_lens:
        if causal and ql > 1: kv_lens.append(ql + int(rng.integers(0, 20)))
        else: kv_lens.append(int(rng.integers(0, 20)) if rng.integers(4) else 0)
    pages = [(s + ps - 1)//ps for s in kv_lens]
    lead = int(rng.integers(0, 3)); NP = sum(pages) + lead + 2
    k = rng.standard_normal((NP, ps, hkv, D)).astype(np.float32); v = rng.standard_normal((NP, ps, hkv, D)).astype(np.float32)
    perm = rng.permutation(NP); ip=[lead]; ix=list(perm[:lead]); keys=[]; vals=[]; at=lead
    for s, n in zip(kv_lens, pages):
        ids = perm[at:at+n]; at += n; ix += list(ids); ip.append(ip[-1]+n)
        keys.append(k[ids].reshape(-1, hkv, D)[:s]); vals.append(v[ids].reshape(-1, hkv, D)[:s])
    lp = [s - (n-1)*ps if n else 0 for s, n in zip(kv_lens, pages)]
    kc, vc = (k.transpose(0,2,1,3).copy(), v.transpose(0,2,1,3).copy()) if layout == "HND" else (k, v)
    cache = np.stack([kc, vc], 1) if five else (kc, vc)
    window = int(rng.choice([-1, -1, 0, 1, 3, 7])); cap = float(rng.choice([0, 0, 2.5])); sm = None if rng.integers(2) else float(rng.uniform(0.05, 0.5))
    alibi = bool(rng.integers(4) == 0) and not cap
    qo = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32); T = int(qo[-1])
    if T == 0: continue
    q = rng.standard_normal((T, H, D)).astype(np.float32)
    kw = dict(window_left=window, logits_soft_cap=cap or None, sm_scale=sm, q_data_type="float32", pos_encoding_mode="ALIBI" if alibi else "NONE")
    try:
        if decode:
            w = fi.BatchDecodeWithPagedKVCacheWrapper(None, layout)
            w.plan(np.array(ip, np.int32), np.array(ix, np.int32), np.array(lp, np.int32), H, hkv, D, ps, **kw)
            out, lse = w.run(q, cache, return_lse=True)
        else:
            w = fi.BatchPrefillWithPagedKVCacheWrapper(None, layout)
            w.plan(qo, np.array(ip, np.int32), np.array(ix, np.int32), np.array(lp, np.int32), H, hkv, D, ps, causal=causal, **kw)
            out, lse = w.run(q, cache, return_lse=True)
    except kvattn.KvaError as e:
        # causal prefill with q_len > kv_len is documented as refused
        if causal and any(ql > 1 and ql > s for ql, s in zip(q_lens, kv_lens)):
            continue
        if causal and max(q_lens) > 1 and any(ql == 1 and s == 0 for ql, s in zip(q_lens, kv_lens)):
            continue  # documented refusal (docs/python.md)
        print("case", case, "raised", type(e).__name__, e); bad += 1; continue
    slopes = fi.get_alibi_slopes(H) if alibi else None
    ro, rl = attention(q, keys, vals, q_lens, causal=causal and max(q_lens) > 1 or (causal and all(s >= 1 for s in kv_lens)), window_left=window, softcap=cap, scale=sm, alibi=slopes)
    wl = rl * LOG2E
    if alibi:
        t0 = 0
        for r, ql in enumerate(q_lens):
            wl[t0:t0+ql] += (slopes * (kv_lens[r] - ql))[None, :] * LOG2E; t0 += ql
    eo = np.abs(out - ro).max(); fin = np.isfinite(wl)
    el = np.abs(lse[fin] - wl[fin]).max() if fin.any() else 0
    inf_ok = np.array_equal(np.isneginf(lse), np.isneginf(wl))
    if not (eo < 1e-4 and el < 1e-4 and inf_ok):
        bad += 1
        print("MISMATCH case", case, dict(R=R, ps=ps, H=H, hkv=hkv, D=D, layout=layout, five=five, decode=decode, q_lens=q_lens, kv_lens=kv_lens, causal=causal, window=window, cap=cap, sm=sm, alibi=alibi), eo, el, inf_ok)
print("seed", seed, "cases", N, "bad", bad)
