import sys
import numpy as np
sys.path.insert(0, "tests/python")
import kvattn
from kvattn import flashinfer as fi
rng = np.random.default_rng(5)
def oracle(vs, ss):  # base-2 lse
    ss = np.asarray(ss, np.float64); vs = np.asarray(vs, np.float64)
    m = ss.max(0)
    w = np.where(np.isneginf(ss), 0, np.exp2(ss - np.where(np.isneginf(m), 0, m)))
    den = w.sum(0)
    v = np.where(den[..., None] > 0, (w[..., None] * vs).sum(0) / np.where(den > 0, den, 1)[..., None], 0)
    s = np.where(den > 0, np.log2(np.where(den > 0, den, 1)) + m, -np.inf)
    return v, s
for dt in (np.float32, np.float16):
    T, H, D = 7, 63, 24
    va, vb = rng.standard_normal((2, T, H, D)).astype(dt)
    sa, sb = (rng.standard_normal((2, T, H)) * 3).astype(np.float32)
    sa[0, :5] = -np.inf; sb[0, 3:9] = -np.inf; sa[1, 10] = -np.inf; sb[1, 10] = -np.inf
    v, s = fi.merge_state(va, sa, vb, sb)
    wv, ws = oracle([va, vb], [sa, sb])
    tol = 1e-5 if dt == np.float32 else 2e-3
    print(dt.__name__, "merge_state", np.allclose(v, wv, atol=tol, rtol=tol), np.allclose(s, ws, atol=1e-5), (np.isneginf(s) == np.isneginf(ws)).all())
    v2, s2 = va.copy(), sa.copy()
    fi.merge_state_in_place(v2, s2, vb, sb)
    print(dt.__name__, "in place", np.allclose(v2, wv, atol=tol, rtol=tol), np.allclose(s2, ws, atol=1e-5))
    mask = rng.random(T) < 0.5
    v3, s3 = va.copy(), sa.copy()
    fi.merge_state_in_place(v3, s3, vb, sb, mask=mask)
    print(dt.__name__, "masked", np.allclose(v3[mask], wv[mask], atol=tol, rtol=tol), np.array_equal(v3[~mask], va[~mask]), np.array_equal(s3[~mask], sa[~mask]))
    N = 5
    V = rng.standard_normal((T, N, H, D)).astype(dt)
    S = (rng.standard_normal((T, N, H)) * 3).astype(np.float32)
    S[2, :, 4] = -np.inf
    v4, s4 = fi.merge_states(V, S)
    wv, ws = oracle(np.moveaxis(V, 1, 0), np.moveaxis(S, 1, 0))
    print(dt.__name__, "merge_states", np.allclose(v4, wv, atol=tol, rtol=tol), np.allclose(s4, ws, atol=1e-4), (np.isneginf(s4) == np.isneginf(ws)).all())
