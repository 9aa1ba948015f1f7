import sys, os
import numpy as np
sys.path.insert(0, "tests/python")
import kvattn
from kvattn import flashinfer as fi
from reference import attention
rng = np.random.default_rng(5)
def tryit(name, f):
    try:
        r = f(); print("OK  ", name, "->", r if not hasattr(r, "shape") else r.shape)
    except Exception as e:
        print("EXC ", name, type(e).__name__, str(e)[:200])
ctx = kvattn.Context("cpu")
c = kvattn.Cache(ctx, 4, 4, 1, 8, dtype="f32")
e = np.zeros((0, 1, 8), np.float32)
tryit("write 0 tokens numpy", lambda: c.write(e, e, np.zeros(0, np.int64)))
ci = kvattn.Cache.index(ctx, 4, 4, head_dim=128, fp8=True)
tryit("index write 0 tokens", lambda: ci.write(np.zeros((0, 128), np.float32), None, np.zeros(0, np.int64)))
cm = kvattn.Cache.mla(ctx, 4, 4, kv_lora_rank=64, qk_rope_head_dim=16, dtype="f32") if True else None
tryit("mla write 0 tokens", lambda: cm.write(np.zeros((0, 64), np.float32), np.zeros((0, 16), np.float32), np.zeros(0, np.int64)))
# trtllm seq_lens wrap
P, page, hkv, d, h = 3, 4, 1, 8, 2
k = rng.standard_normal((P, hkv, page, d)).astype(np.float32); v = rng.standard_normal((P, hkv, page, d)).astype(np.float32)
q = rng.standard_normal((1, h, d)).astype(np.float32)
bt = np.array([[0, 1, 2]], np.int32)
tryit("trtllm seq 2**32+5", lambda: fi.trtllm_batch_decode_with_kv_cache(q, (k, v), None, bt, np.array([2**32 + 5]), 2**40))
tryit("trtllm seq 5", lambda: fi.trtllm_batch_decode_with_kv_cache(q, (k, v), None, bt, np.array([5]), 12))
tryit("trtllm seq > pages", lambda: fi.trtllm_batch_decode_with_kv_cache(q, (k, v), None, bt, np.array([13]), 20))
tryit("trtllm seq 2.5", lambda: fi.trtllm_batch_decode_with_kv_cache(q, (k, v), None, bt, np.array([2.5]), 20))
tryit("trtllm bt -1 in range", lambda: fi.trtllm_batch_decode_with_kv_cache(q, (k, v), None, np.array([[0, -1, 2]], np.int32), np.array([9]), 20))
tryit("trtllm bt past pages", lambda: fi.trtllm_batch_decode_with_kv_cache(q, (k, v), None, np.array([[0, 7, 2]], np.int32), np.array([9]), 20))
# get_seq_lens
tryit("get_seq_lens", lambda: fi.get_seq_lens(np.array([0, 0, 2]), np.array([3, 4]), 16))
# merge_states_n
tryit("merge P=0", lambda: kvattn.merge_states_n(np.zeros((0, 2, 2, 8), np.float32), np.zeros((0, 2, 2), np.float32)))
tryit("merge T=0", lambda: kvattn.merge_states_n(np.zeros((2, 0, 2, 8), np.float32), np.zeros((2, 0, 2), np.float32)))
# dcp
tryit("dcp_local_lens list", lambda: kvattn.dcp_local_lens([5, 7], 2, 1, 2))
tryit("dcp_local_lens rank>=N", lambda: kvattn.dcp_local_lens([5, 7], 2, 2, 1))
tryit("dcp_slots count 0", lambda: kvattn.dcp_slots([1, 2], 0, 0, dcp_size=2, dcp_rank=0, block_size=4))
tryit("dcp_slots neg first", lambda: kvattn.dcp_slots([1, 2], -1, 2, dcp_size=2, dcp_rank=0, block_size=4))
# Pool.drop_chunk
pool = kvattn.Pool(16, 4)
rid = pool.add_request(list(range(30)))
pool.allocate(rid, 30)
tryit("drop_chunk 8", lambda: pool.drop_chunk(rid, 8))
tryit("bt after", lambda: pool.block_table(rid))
tryit("drop_chunk 0", lambda: pool.drop_chunk(rid, 0))
tryit("drop_chunk 6 (not mult of B)", lambda: pool.drop_chunk(rid, 6))
tryit("drop_chunk -1", lambda: pool.drop_chunk(rid, -1))
tryit("drop_chunk bad rid", lambda: pool.drop_chunk(999, 8))
tryit("drop_window", lambda: pool.drop_window(rid, 8))
