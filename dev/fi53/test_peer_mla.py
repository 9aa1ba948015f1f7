#!/usr/bin/env python3
"""test_peer_mla.py - bench/peer_mla.py's FlashInfer check (fi_case) on the
CPU, against a stand-in for FlashInfer's BatchMLAPagedAttentionWrapper that
computes the absorbed MLA attention from the plan's page table in float32 and
rounds to bf16 (what a correct kernel returns), and against planted faults a
wrong kernel could make: pages in reverse table order, the
causal mask dropped, the partial last page ignored, the softmax scale of 576
dims, one request's rows for another. The check must pass the stand-in and
fail every fault.
Run: PYTHONPATH=bench python3 dev/fi53/test_peer_mla.py (any torch, no GPU)."""
import sys
import types

import torch

import peer_mla

FAULT = None


class StandIn:
    """plan() / run() with the argument names and layouts peer_mla.py uses."""

    def __init__(self, ws):
        self._planned_backend_name = "stand-in"

    def plan(self, *, qo_indptr, kv_indptr, kv_indices, kv_len_arr, num_heads, head_dim_ckv,
             head_dim_kpe, page_size, causal, sm_scale, q_data_type, kv_data_type):
        self.p = (qo_indptr.tolist(), kv_indptr.tolist(), kv_indices.long(), kv_len_arr.tolist(),
                  page_size, causal, sm_scale)

    def run(self, q_nope, q_pe, ckv, kpe):
        qo, kvp, idx, lens, page, causal, scale = self.p
        if FAULT == "scale576":
            scale = 1.0 / 576 ** 0.5
        out = torch.empty(q_nope.shape, dtype=torch.bfloat16)
        for r in range(len(lens)):
            rr = (r + 1) % len(lens) if FAULT == "request" else r
            pages = idx[kvp[rr]:kvp[rr + 1]]
            if FAULT == "order":
                pages = pages.flip(0)
            s = lens[rr]
            if FAULT == "partial":
                s = (s // page) * page
            c = ckv[pages].reshape(-1, ckv.shape[-1])[:s].float()
            k = torch.cat([c, kpe[pages].reshape(-1, kpe.shape[-1])[:s].float()], dim=1)
            q = torch.cat([q_nope[qo[r]:qo[r + 1]], q_pe[qo[r]:qo[r + 1]]], dim=2).float()
            lg = torch.einsum("qhd,kd->qhk", q, k) * scale
            nq = q.shape[0]
            if causal and FAULT != "nocausal":
                m = torch.arange(s)[None, :] > (lens[rr] - nq + torch.arange(nq))[:, None]
                lg.masked_fill_(m[:, None, :], float("-inf"))
            out[qo[r]:qo[r + 1]] = torch.einsum("qhk,kd->qhd", torch.softmax(lg, -1), c).bfloat16()
        return out


def main():
    global FAULT
    fi = types.SimpleNamespace(mla=types.SimpleNamespace(BatchMLAPagedAttentionWrapper=StandIn))
    bad = 0
    # (R, S, Q, H, fault, must pass); S + Q off a page edge so the partial page matters
    cases = [(3, 70, 1, 4, None, True), (3, 70, 2, 16, None, True), (2, 200, 2, 8, None, True),
             (3, 70, 1, 4, "order", False), (3, 70, 2, 16, "nocausal", False),
             (3, 70, 1, 4, "partial", False), (3, 70, 2, 16, "scale576", False),
             (3, 70, 1, 4, "request", False), (2, 200, 2, 8, "order", False)]
    for R, S, Q, H, fault, want in cases:
        FAULT = fault
        torch.manual_seed(R * 7 + S + Q + H)
        call, backend, err = peer_mla.fi_case(fi, R, S, Q, H, dev="cpu")
        e = err(call())
        ok = e <= peer_mla.FI_TOL
        good = ok == want
        bad += not good
        print(f"{'ok  ' if good else 'BAD '} R {R} S {S} Q {Q} H {H} fault {fault}: err {e:.4f}, check "
              f"{'passes' if ok else 'fails'} (expected {'pass' if want else 'fail'}), backend {backend}")
    print("all passed" if not bad else f"{bad} wrong")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
