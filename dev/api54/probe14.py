import sys
import numpy as np
sys.path.insert(0, "tests/python")
import kvattn
rng = np.random.default_rng(8)
ctx = kvattn.Context("cpu", 1)
def show(name, f):
    try:
        r = f(); print("OK  ", name, "->", r)
    except Exception as e:
        print("EXC ", name, type(e).__name__, str(e)[:200])
Hkv, D = 7, 520
for quant, dt, kw in [("int8_channel", "i8", dict(k_scale=np.full(Hkv * D, 0.03, np.float32), v_scale=np.full(Hkv * D, 0.03, np.float32))),
                      ("int8_token_k", "i8", dict(v_scale=[0.02])), ("int8_token_k_v16", "f16", {}), ("fp8_e4m3", "fp8_e4m3", dict(k_scale=[0.1], v_scale=[0.1])), ("none", "f16", {})]:
    c = kvattn.Cache(ctx, 3, 5, Hkv, D, dtype=dt, quant=quant, **kw)
    k = rng.standard_normal((4, Hkv, D)).astype(np.float32); v = rng.standard_normal((4, Hkv, D)).astype(np.float32)
    k[1, 3, 7] = np.nan; v[2, 0, 0] = np.nan; k[2, 6, 519] = np.inf
    ka, va = c.k_array().view(np.uint8), c.v_array().view(np.uint8)
    before = (ka.copy(), va.copy())
    show(quant + " skipped NaN/inf rows", lambda: c.write(k, v, np.array([0, -1, -5, 4])))
    show(quant + " ... rows 0 and 3 written", lambda: (not np.array_equal(ka, before[0])))
    b2 = (ka.copy(), va.copy())
    show(quant + " NaN key row written", lambda: c.write(k, v, np.array([6, 7, 8, 9])))
    print("     unchanged:", np.array_equal(ka, b2[0]) and np.array_equal(va, b2[1]))
    k2 = k.copy(); k2[1, 3, 7] = 0; v2 = v.copy(); v2[2, 0, 0] = 0; k2[2, 6, 519] = 0; k2[3, 6, 519] = np.inf
    b3 = (ka.copy(), va.copy())
    show(quant + " inf key only", lambda: c.write(k2, v2, np.array([6, 7, 8, 9])))
    print("     unchanged:", np.array_equal(ka, b3[0]) and np.array_equal(va, b3[1]))
    b4 = (ka.copy(), va.copy())
    show(quant + " slot out of range", lambda: c.write(k2, v2, np.array([6, 7, 8, 15])))
    print("     unchanged:", np.array_equal(ka, b4[0]) and np.array_equal(va, b4[1]))
