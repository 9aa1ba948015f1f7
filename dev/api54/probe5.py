import sys
import numpy as np
sys.path.insert(0, "tests/python")
import kvattn
from kvattn import flashinfer as fi
from reference import attention
from test_flashinfer import random_paged
from poison import poisoned, untouched
LOG2E = 1 / np.log(2)
def show(name, f):
    try:
        r = f()
        print("OK  ", name, "->", r if not isinstance(r, (np.ndarray, tuple)) else "arrays")
    except Exception as e:
        print("EXC ", name, type(e).__name__, str(e)[:250])
rng = np.random.default_rng(9)
# decode q_len_per_req
for H, HKV, D, PS, n in [(9, 3, 24, 1, 3), (63, 7, 8, 64, 2), (3, 1, 136, 5, 4)]:
    kl = [5, 9, 4]
    paged, ip, ix, lp, keys, values = random_paged(rng, kl, PS, HKV, D, "HND", np.float32, True)
    q = rng.standard_normal((3 * n, H, D)).astype(np.float32)
    w = fi.BatchDecodeWithPagedKVCacheWrapper(None, "HND")
    try:
        w.plan(ip, ix, lp, H, HKV, D, PS, q_data_type="float32", q_len_per_req=n, logits_soft_cap=3.0, window_left=2)
        o, l = w.run(q, paged, return_lse=True)
        ro, rl = attention(q, keys, values, [n] * 3, causal=True, softcap=3.0, window_left=2)
        print("qlpr", H, n, np.allclose(o, ro, atol=1e-5), np.allclose(l, rl * LOG2E, atol=1e-4))
    except Exception as e:
        print("qlpr EXC", type(e).__name__, e)
# cascade 2 levels: shared prefix + own pages
H, HKV, D, PS = 9, 3, 40, 3
pre = 7; own = [4, 1, 6]; ql = [2, 1, 3]
nb = 20
kc = rng.standard_normal((nb, PS, HKV, D)).astype(np.float32)
vc = rng.standard_normal((nb, PS, HKV, D)).astype(np.float32)
pre_pages = np.array([3, 8, 11], np.int32)  # 7 keys: 3 pages, last 1
own_pages = [np.array([1, 2], np.int32), np.array([9], np.int32), np.array([5, 6], np.int32)]
T = sum(ql)
q = rng.standard_normal((T, H, D)).astype(np.float32)
qo = np.concatenate([[0], np.cumsum(ql)]).astype(np.int32)
lvl0 = (np.array([0, T], np.int32), np.array([0, 3], np.int32), pre_pages, np.array([1], np.int32))
ip1 = np.concatenate([[0], np.cumsum([len(p) for p in own_pages])]).astype(np.int32)
lp1 = np.array([(o - (len(p) - 1) * PS) if len(p) else 0 for o, p in zip(own, own_pages)], np.int32)
ix1 = np.concatenate(own_pages).astype(np.int32)
w = fi.MultiLevelCascadeAttentionWrapper(2, None, "NHD")
show("cascade plan", lambda: w.plan([lvl0[0], qo], [lvl0[1], ip1], [lvl0[2], ix1], [lvl0[3], lp1], H, HKV, D, PS, causal=True, q_data_type="float32"))
def rows(pages, n):
    return kc[pages].reshape(-1, HKV, D)[:n], vc[pages].reshape(-1, HKV, D)[:n]
pk, pv = rows(pre_pages, pre)
keys, vals = [], []
for r in range(3):
    ok_, ov_ = rows(own_pages[r], own[r]) if own[r] else (np.zeros((0, HKV, D), np.float32),) * 2
    keys.append(np.concatenate([pk, ok_])); vals.append(np.concatenate([pv, ov_]))
# causal on last level only: query i of request r sees all prefix + own keys j <= own - q + i
trees = None
want = np.zeros((T, H, D))
t0 = 0
for r in range(3):
    s = pre + own[r]
    for i in range(ql[r]):
        pos_own = own[r] - ql[r] + i
        vis = np.concatenate([np.ones(pre, bool), np.arange(own[r]) <= pos_own])
        for h in range(H):
            kh = h // (H // HKV)
            sc = keys[r][vis, kh] @ q[t0 + i, h].astype(np.float64) / np.sqrt(D)
            e = np.exp(sc - sc.max()); want[t0 + i, h] = (e / e.sum()) @ vals[r][vis, kh]
    t0 += ql[r]
show("cascade run", lambda: print(np.abs(w.run(q, (kc, vc)) - want).max()))
