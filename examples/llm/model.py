"""The Llama forward pass in numpy (f32), with attention behind a small interface.

One call runs the model over a flat batch of T tokens that may belong to several requests
(prefill chunks and decodes mixed, as continuous batching schedules them). Everything except
attention is numpy: embedding, RMSNorm, rotary embedding, the projections, the SwiGLU MLP and
the (tied) LM head. Attention (with the KV cache write) is done by an `attn` object:

    attn.attend(layer, q [T, H, D], k [T, Hkv, D], v [T, Hkv, D]) -> out [T, H, D]

for the batch that `attn.begin_step` described (numpy_attn.NumpyAttention, kvattn_attn.*).
"""

import numpy as np


class Llama:
    def __init__(self, cfg, weights):
        self.cfg = cfg
        c = cfg
        self.embed = weights["token_embd.weight"]  # [vocab, hidden]
        self.lm_head = weights["output.weight"]  # [vocab, hidden]
        self.norm = weights["output_norm.weight"]
        self.layers = []
        for i in range(c.num_layers):
            b = f"blk.{i}."
            self.layers.append(
                dict(
                    attn_norm=weights[b + "attn_norm.weight"],
                    ffn_norm=weights[b + "ffn_norm.weight"],
                    # Fused projections: [(H + 2 Hkv) D, hidden] and [2 ffn, hidden].
                    qkv=np.ascontiguousarray(
                        np.concatenate(
                            [weights[b + n] for n in ("attn_q.weight", "attn_k.weight", "attn_v.weight")]
                        )
                    ),
                    o=weights[b + "attn_output.weight"],
                    gate_up=np.ascontiguousarray(
                        np.concatenate([weights[b + "ffn_gate.weight"], weights[b + "ffn_up.weight"]])
                    ),
                    down=weights[b + "ffn_down.weight"],
                )
            )
        # Rotary embedding as the Hugging Face Llama computes it (f32): inv_freq [D/2].
        d = c.head_dim
        self.inv_freq = (1.0 / (c.rope_base ** (np.arange(0, d, 2, dtype=np.int64).astype(np.float32) / d))).astype(
            np.float32
        )

    def _rms_norm(self, x, w):
        var = np.mean(x * x, axis=-1, keepdims=True, dtype=np.float32)
        return w * (x * (1.0 / np.sqrt(var + np.float32(self.cfg.rms_eps))).astype(np.float32))

    def _rope(self, x, cos, sin):
        """x [T, heads, D]; rotates the halves of each head: x*cos + rotate_half(x)*sin."""
        half = x.shape[-1] // 2
        rot = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
        return x * cos[:, None, :] + rot * sin[:, None, :]

    def forward(self, tokens, positions, attn, logit_rows):
        """tokens, positions: [T] int; logit_rows: indices of the rows whose logits are needed.

        Returns logits [len(logit_rows), vocab] f32.
        """
        c = self.cfg
        T = len(tokens)
        H, Hkv, D = c.num_heads, c.num_kv_heads, c.head_dim
        freqs = np.asarray(positions, dtype=np.float32)[:, None] * self.inv_freq[None, :]
        emb = np.concatenate([freqs, freqs], axis=-1)
        cos, sin = np.cos(emb), np.sin(emb)
        x = self.embed[np.asarray(tokens)]  # [T, hidden]
        for i, L in enumerate(self.layers):
            h = self._rms_norm(x, L["attn_norm"])
            qkv = h @ L["qkv"].T
            q = self._rope(qkv[:, : H * D].reshape(T, H, D), cos, sin)
            k = self._rope(qkv[:, H * D : (H + Hkv) * D].reshape(T, Hkv, D), cos, sin)
            v = np.ascontiguousarray(qkv[:, (H + Hkv) * D :].reshape(T, Hkv, D))
            o = attn.attend(i, np.ascontiguousarray(q, np.float32), np.ascontiguousarray(k, np.float32), v)
            x = x + o.reshape(T, H * D) @ L["o"].T
            h = self._rms_norm(x, L["ffn_norm"])
            gu = h @ L["gate_up"].T
            g, u = gu[:, : c.ffn], gu[:, c.ffn :]
            x = x + ((g / (1.0 + np.exp(-g))) * u) @ L["down"].T
        h = self._rms_norm(x[np.asarray(logit_rows, dtype=np.intp)], self.norm)
        return h @ self.lm_head.T
