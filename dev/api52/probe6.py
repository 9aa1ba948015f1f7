import sys
import numpy as np
sys.path.insert(0, "tests/python")
import kvattn
from kvattn import flashinfer as fi
from test_fi_custom_mask import batch, tree_mask, masked_attention, plan, segment_packed
rng = np.random.default_rng(9)
q_lens = [3, 0, 5, 1]; ctx = [10, 4, 0, 7]
b = batch(rng, q_lens, ctx, "HND")
masks = [tree_mask(rng, ql, s) for ql, s in zip(q_lens, b["kv_lens"])]
flat = np.concatenate([m.reshape(-1) for m in masks])
w = fi.BatchPrefillWithPagedKVCacheWrapper(None, "HND")
plan(w, b, custom_mask=flat)
ro, rl = masked_attention(b["q"], b["keys"], b["values"], masks, 1 / np.sqrt(32))
out = w.run(b["q"], b["paged"])
print("run ok", np.abs(out - ro).max())
f = w.forward(b["q"], b["paged"], causal=False)
print("forward(causal=False) keeps the tree", np.abs(f - ro).max())
f2 = w.forward(b["q"], b["paged"], logits_soft_cap=5.0)
print("forward softcap changed", np.abs(f2 - ro).max())
try:
    w.forward(b["q"], b["paged"], window_left=3)
    print("forward window on tree ACCEPTED")
except kvattn.KvaError as e:
    print("forward window refused:", str(e)[:100])
out3 = w.run(b["q"], b["paged"])
print("after refused forward, run = softcap plan?", np.abs(out3 - f2).max())
# q_len 0 request with packed mask
pm = segment_packed(masks)
w2 = fi.BatchPrefillWithPagedKVCacheWrapper(None, "HND")
plan(w2, b, packed_custom_mask=pm)
print("packed", np.abs(w2.run(b["q"], b["paged"]) - ro).max())
# both given: packed wins
plan(w2, b, packed_custom_mask=pm, custom_mask=np.zeros_like(flat))
print("both given packed wins", np.abs(w2.run(b["q"], b["paged"]) - ro).max())
# ragged wrapper custom_mask -> Unsupported
wr = fi.BatchPrefillWithRaggedKVCacheWrapper(None, "NHD")
try:
    wr.plan(b["qo"], b["qo"], 4, 2, 32, custom_mask=flat); print("ragged mask ACCEPTED")
except kvattn.KvaError as e:
    print("ragged mask refused", type(e).__name__)
