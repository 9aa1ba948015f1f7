#!/usr/bin/env python3
"""test_decode_fi_peer.py - CPU checks of bench/decode_fi_peer.py (no GPU, no FlashInfer kernels):
case() against a stand-in BatchDecodeWithPagedKVCacheWrapper that computes paged decode its own way
(per request: the table's pages, the last page cut to last_page_len, torch SDPA with GQA), so that its
reference and its check are exercised: the check passes on the right output and fails on outputs that
read the last page's stale rows, read pages in the wrong order, read the fp8 codes as integers or map
query heads to kv heads another way.
Run with a Python that has torch (e.g. /work/fi40/venv/bin/python): exit status 0 when all pass."""
import os
import sys
import types

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import decode_fi_peer as peer  # noqa: E402

peer.DEV = "cpu"
peer.H, peer.HKV, peer.D = 8, 2, 64  # small heads: a CPU run in seconds


class StandIn:
    """Paged decode from FlashInfer's documented plan / run arguments; `fault` breaks it on purpose."""
    fault = None

    def __init__(self, ws, layout, use_tensor_cores=False, backend="auto"):
        assert layout == "NHD" and backend == "fa2"

    def plan(self, indptr, indices, last, H, Hkv, D, page, q_data_type=None, kv_data_type=None):
        self.p = (indptr.tolist(), indices.tolist(), last.tolist(), H, Hkv, D, page, kv_data_type)

    def run(self, q, cache, k_scale=None, v_scale=None):
        indptr, indices, last, H, Hkv, D, page, kvt = self.p
        assert cache.dtype == kvt and (k_scale is not None) == (kvt != torch.bfloat16)
        out = torch.empty(q.shape, dtype=torch.bfloat16)
        for r in range(len(last)):
            pages = indices[indptr[r]:indptr[r + 1]]
            if StandIn.fault == "order":
                pages = pages[::-1]
            kv = cache[pages]
            kv = kv.float() if StandIn.fault != "fp8-raw" else kv.view(torch.int8).float() / 16
            n = (len(pages) - 1) * page + (last[r] if StandIn.fault != "last" else page)
            k = kv[:, 0].reshape(-1, Hkv, D)[:n].transpose(0, 1)
            v = kv[:, 1].reshape(-1, Hkv, D)[:n].transpose(0, 1)
            if StandIn.fault == "gqa":  # query head h on kv head h % Hkv instead of h // (H / Hkv)
                k, v = k.repeat(H // Hkv, 1, 1), v.repeat(H // Hkv, 1, 1)
            o = F.scaled_dot_product_attention(q[r].float()[:, None], k, v, enable_gqa=True)
            out[r] = o[:, 0].to(torch.bfloat16)
        return out


def main():
    fi = types.SimpleNamespace(BatchDecodeWithPagedKVCacheWrapper=StandIn)
    fails = 0

    def expect(kv, R, S, fault, ok):
        nonlocal fails
        StandIn.fault = fault
        call, ref, nbytes = peer.case(fi, R, S, kv, tensor_cores=False)
        err = (call()[0].float() - ref).abs().max().item()
        got = err <= peer.TOL[kv]
        good = got == ok and nbytes == R * (S + 1) * peer.HKV * peer.D * 2 * (1 if kv == "fp8" else 2)
        fails += not good
        print(f"{'ok  ' if good else 'FAIL'} kv {kv} R {R} S {S} fault {fault}: err {err:.4f}, "
              f"check {'passes' if got else 'fails'} (expected {'pass' if ok else 'fail'})")

    for kv in ("bf16", "fp8"):
        expect(kv, 3, 70, None, True)       # last page of 71 - 64 = 7 rows
        expect(kv, 3, 70, "last", False)    # reads the last page's 9 stale rows too
        expect(kv, 3, 70, "order", False)   # the pages in reverse order: the padding rows move in
        expect(kv, 1, 4095, None, True)     # full last page
    expect("fp8", 2, 100, "fp8-raw", False)  # reads the codes as integers
    expect("bf16", 2, 100, "gqa", False)     # another query-head to kv-head map
    print("all passed" if not fails else f"{fails} failed")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
