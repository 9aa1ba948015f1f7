"""Attention and KV cache in plain numpy (f32): the example's own reference path.

Each request keeps contiguous per-layer K/V arrays [capacity, Hkv, D]; attention is the
textbook causal softmax(q k^T * scale) v in f32, as transformers' eager attention computes it.
There is no block pool here, so no prefix caching: every prompt token is computed.
The engine drives it through the same calls as kvattn_attn.KvattnAttention.
"""

import numpy as np


class NumpyAttention:
    name = "numpy"

    def __init__(self, cfg):
        self.cfg = cfg
        self.kv = {}  # request id -> [K, V] lists of [capacity, Hkv, D] per layer
        self.lens = {}
        self.next_id = 0
        self.items = []

    # Request lifecycle (the pool-facing half of the interface).
    def add_request(self, prompt_tokens):
        rid = self.next_id
        self.next_id += 1
        self.kv[rid] = None
        self.lens[rid] = 0
        return rid, 0  # no prefix cache: 0 tokens cached

    def allocate(self, rid, num_new_tokens):
        c = self.cfg
        need = self.lens[rid] + num_new_tokens
        cur = self.kv[rid]
        if cur is None or cur[0][0].shape[0] < need:
            cap = max(64, 2 * need)
            shape = (cap, c.num_kv_heads, c.head_dim)
            new = [[np.zeros(shape, np.float32) for _ in range(c.num_layers)] for _ in range(2)]
            if cur is not None:
                n = self.lens[rid]
                for kv in range(2):
                    for layer in range(c.num_layers):
                        new[kv][layer][:n] = cur[kv][layer][:n]
            self.kv[rid] = new
        return True

    def commit(self, rid, tokens):
        self.lens[rid] += len(tokens)

    def free(self, rid):
        del self.kv[rid], self.lens[rid]

    def stats(self):
        return {}

    # One model step.
    def begin_step(self, items):
        """items: [(request id, first position, number of new tokens)] in token order."""
        self.items = items

    def attend(self, layer, q, k, v):
        c = self.cfg
        H, Hkv, D = c.num_heads, c.num_kv_heads, c.head_dim
        G = H // Hkv
        scale = np.float32(c.attn_scale or 1.0 / np.sqrt(D))
        window = c.layer_window[layer] if c.layer_window else -1
        out = np.empty_like(q)
        t0 = 0
        for rid, start, n in self.items:
            K, V = self.kv[rid][0][layer], self.kv[rid][1][layer]
            K[start : start + n] = k[t0 : t0 + n]
            V[start : start + n] = v[t0 : t0 + n]
            s = start + n
            qr = q[t0 : t0 + n].reshape(n, Hkv, G, D).transpose(1, 2, 0, 3)  # [Hkv, G, n, D]
            kr = K[:s].transpose(1, 2, 0)  # [Hkv, D, s]
            scores = np.matmul(qr, kr[:, None]) * scale  # [Hkv, G, n, s]
            pos = start + np.arange(n)
            hidden = np.arange(s)[None, :] > pos[:, None]
            if window >= 0:
                hidden |= pos[:, None] - np.arange(s)[None, :] > window
            scores[..., hidden] = -np.inf
            scores -= scores.max(axis=-1, keepdims=True)
            p = np.exp(scores)
            p /= p.sum(axis=-1, keepdims=True)
            o = np.matmul(p, V[:s].transpose(1, 0, 2)[:, None])  # [Hkv, G, n, D]
            out[t0 : t0 + n] = o.transpose(2, 0, 1, 3).reshape(n, H, D)
            t0 += n
        return out
