"""End-to-end check of kvattn's MLA against transformers' own DeepSeek-V3 attention.

A small random-weight DeepSeek-V3 (transformers' DeepseekV3ForCausalLM: its naive,
non-absorbed MLA, its RoPE and softmax scale) is run twice on the same weights:

  reference  transformers as it is (eager attention, its own cache), float32;
  kvattn     every attention layer replaced by kvattn: the layer's latent rows
             [c_kv | k_pe] written into a kvattn MLA paged cache (kva_cache_write,
             shuffled blocks), attention by kva_mla_run with the layer's W_UK / W_UV
             taken from kv_b_proj, decode_threshold 1, so the 256-token prompt takes
             the compute-friendly chunked path and every decode step the absorbed one.

Checks: the prompt's logits, then 64 decode steps fed the reference's greedy tokens;
logits within tolerance (f32 cache: 1e-3 absolute; bf16 cache: 5e-2, bf16's rounding
of q, cache and weights), and kvattn's greedy token equal to the reference's at every
step (bf16: except where the reference's top-2 gap is below twice the step's logit
error, a tie at that precision, which is reported). Exit status 0 when all pass.

Usage: KVATTN_LIBRARY=build/libkvattn.so python examples/llm/deepseek_mla_check.py
       [--dtype f32|bf16] [--backend cpu|ref] [--layers 2] [--prompt 256] [--steps 64]
"""

import argparse
import ctypes
import os
import sys

import numpy as np
import torch

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(_ROOT, "python"))
from kvattn import _lib as L  # noqa: E402


def check(st, what):
    if st != 0:
        raise RuntimeError("%s: %s: %s" % (what, L.kva_status_name(st).decode(),
                                           L.kva_last_error().decode()))


def to_dtype(x, dt):
    """A contiguous numpy array of x in kvattn dtype dt ('f32' or 'bf16' as raw uint16)."""
    x = x.detach().to(torch.float32).contiguous()
    if dt == "f32":
        return x.numpy().copy()
    return x.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16).copy()


def from_dtype(a, dt, shape):
    if dt == "f32":
        return torch.from_numpy(a.reshape(shape).copy())
    return torch.from_numpy(a.view(np.int16).reshape(shape).copy()).view(torch.bfloat16).float()


class KvattnMLA:
    """One request's latent caches (one per layer) and the per-step plan."""

    def __init__(self, cfg, backend, dt, max_tokens, block_size=16, threads=2):
        self.dt, self.B = dt, block_size
        self.H = cfg.num_attention_heads
        self.Dc, self.Dr = cfg.kv_lora_rank, cfg.qk_rope_head_dim
        self.Dn, self.Dv = cfg.qk_nope_head_dim, cfg.v_head_dim
        cd = L.ContextDesc(L.BACKENDS[backend], threads, 0)
        self.ctx = ctypes.c_void_p()
        check(L.kva_context_create(ctypes.byref(cd), ctypes.byref(self.ctx)), "context")
        nblocks = (max_tokens + block_size - 1) // block_size
        self.NB = nblocks + 1
        rng = np.random.default_rng(7)
        # The request's blocks in a shuffled order (block 0 unused), as a pool hands them out.
        self.bt = (1 + rng.permutation(nblocks)).astype(np.int32)
        self.caches = []
        for _ in range(cfg.num_hidden_layers):
            desc = L.CacheDesc(self.NB, block_size, 1, self.Dc + self.Dr, self.Dc,
                               L.DTYPES[dt], 0, 0, 1)  # NHD, unquantized, KVA_ATTN_MLA
            c = ctypes.c_void_p()
            check(L.kva_cache_create_quant(self.ctx, ctypes.byref(desc), None, ctypes.byref(c)),
                  "cache")
            self.caches.append(c)
        self.pos = 0  # tokens cached before the current step
        self.plan = None

    def begin_step(self, T):
        """The plan of a step that adds T tokens after self.pos cached ones."""
        if self.plan is not None:
            L.kva_plan_destroy(self.plan)
        self.T = T
        self.qsl = np.array([0, T], np.int32)
        self.sl = np.array([self.pos + T], np.int32)
        pd = L.PlanDesc()
        pd.num_requests = 1
        pd.query_start_loc = self.qsl.ctypes.data
        pd.seq_lens = self.sl.ctypes.data
        pd.block_table = self.bt.ctypes.data
        pd.block_table_stride = len(self.bt)
        pd.block_size = self.B
        pd.decode_threshold = 1
        pd.num_heads = self.H
        pd.num_kv_heads = 1
        pd.head_dim = self.Dc + self.Dr
        pd.head_dim_v = self.Dc
        pd.q_dtype = L.DTYPES[self.dt]
        pd.scale = self.scale
        pd.causal = 1
        pd.window_left = -1
        pd.kind = 1
        pd.mla_qk_nope_head_dim = self.Dn
        pd.mla_v_head_dim = self.Dv
        self.plan = ctypes.c_void_p()
        check(L.kva_plan_create(self.ctx, ctypes.byref(pd), ctypes.byref(self.plan)), "plan")
        pos = np.arange(self.pos, self.pos + T)
        self.slots = (self.bt[pos // self.B].astype(np.int64) * self.B + pos % self.B).copy()

    def end_step(self):
        self.pos += self.T

    def attend(self, layer, q, c_kv, k_pe, w_uk, w_uv):
        """q [T, H, Dn + Dr], c_kv [T, Dc], k_pe [T, Dr] (roped), weights: out [T, H, Dv]."""
        dt, T = self.dt, self.T
        ckv, kpe = to_dtype(c_kv, dt), to_dtype(k_pe, dt)
        check(L.kva_cache_write(self.ctx, self.caches[layer], T, ckv.ctypes.data, 0,
                                kpe.ctypes.data, 0, L.DTYPES[dt], self.slots.ctypes.data),
              "cache_write")
        qa = to_dtype(q, dt)
        out = np.empty(T * self.H * self.Dv, np.float32 if dt == "f32" else np.uint16)
        lse = np.empty(T * self.H, np.float32)
        check(L.kva_mla_run(self.ctx, self.plan, qa.ctypes.data, w_uk.ctypes.data,
                            w_uv.ctypes.data, self.caches[layer], out.ctypes.data,
                            lse.ctypes.data), "kva_mla_run")
        return from_dtype(out, dt, (T, self.H, self.Dv))


def patch_attention(model, kv):
    """Replaces every DeepseekV3Attention.forward by kvattn's (same projections and RoPE)."""
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as M

    for layer_idx, layer in enumerate(model.model.layers):
        attn = layer.self_attn
        H, Dn, Dv, Dc = attn.num_heads, attn.qk_nope_head_dim, attn.v_head_dim, attn.kv_lora_rank
        w = attn.kv_b_proj.weight.detach().view(H, Dn + Dv, Dc)
        w_uk = to_dtype(w[:, :Dn, :], kv.dt)                   # [H, Dn, Dc]
        w_uv = to_dtype(w[:, Dn:, :].transpose(1, 2), kv.dt)   # [H, Dc, Dv]
        kv.scale = float(attn.scaling)

        def forward(hidden_states, position_embeddings, attention_mask=None, *a, attn=attn,
                    layer_idx=layer_idx, w_uk=w_uk, w_uv=w_uv, **kw):
            b, T = hidden_states.shape[:-1]
            assert b == 1
            if attn.q_lora_rank is None:
                q = attn.q_proj(hidden_states)
            else:
                q = attn.q_b_proj(attn.q_a_layernorm(attn.q_a_proj(hidden_states)))
            q = q.view(1, T, -1, attn.qk_head_dim).transpose(1, 2)
            q_pass, q_rot = torch.split(q, [attn.qk_nope_head_dim, attn.qk_rope_head_dim], -1)
            ckv = attn.kv_a_proj_with_mqa(hidden_states)
            c, k_rot = torch.split(ckv, [attn.kv_lora_rank, attn.qk_rope_head_dim], -1)
            c = attn.kv_a_layernorm(c)
            k_rot = k_rot.view(1, 1, T, attn.qk_rope_head_dim)
            cos, sin = position_embeddings
            if attn.config.rope_interleave:
                q_rot, k_rot = M.apply_rotary_pos_emb_interleave(q_rot, k_rot, cos, sin)
            else:
                q_rot, k_rot = M.apply_rotary_pos_emb(q_rot, k_rot, cos, sin)
            qf = torch.cat((q_pass, q_rot), -1)[0].transpose(0, 1)  # [T, H, Dn + Dr]
            out = kv.attend(layer_idx, qf, c[0], k_rot[0, 0], w_uk, w_uv)
            out = out.to(hidden_states.dtype).reshape(1, T, -1)
            return attn.o_proj(out), None

        attn.forward = forward


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dtype", choices=["f32", "bf16"], default="f32")
    ap.add_argument("--backend", choices=["cpu", "ref"], default="cpu")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    torch.manual_seed(0)
    cfg = DeepseekV3Config(
        vocab_size=2048, hidden_size=512, intermediate_size=1024, moe_intermediate_size=256,
        num_hidden_layers=args.layers, first_k_dense_replace=args.layers,  # dense MLPs
        num_attention_heads=16, num_key_value_heads=16, q_lora_rank=384, kv_lora_rank=512,
        qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128,
        max_position_embeddings=4096, initializer_range=0.05, tie_word_embeddings=False,
        attn_implementation="eager")
    ref = DeepseekV3ForCausalLM(cfg).eval().float()
    prompt = torch.randint(0, cfg.vocab_size, (1, args.prompt))

    # Reference: the prompt's logits, then greedy steps with transformers' own cache.
    with torch.no_grad():
        r = ref(prompt, use_cache=True)
        ref_logits = [r.logits[0]]
        past, tok, ref_tokens = r.past_key_values, int(r.logits[0, -1].argmax()), []
        for _ in range(args.steps):
            ref_tokens.append(tok)
            r = ref(torch.tensor([[tok]]), cache=past, use_cache=True)
            past = r.past_key_values
            ref_logits.append(r.logits[0])
            tok = int(r.logits[0, -1].argmax())

    # kvattn: the same weights, attention replaced. Decode steps feed the reference's
    # greedy tokens (teacher forcing), so every step compares logits of the same
    # context; kvattn's own greedy choice at each step is compared with the reference's.
    kv = KvattnMLA(cfg, args.backend, args.dtype, args.prompt + args.steps + 1,
                   threads=args.threads)
    patch_attention(ref, kv)
    tol = 1e-3 if args.dtype == "f32" else 5e-2
    with torch.no_grad():
        kv.begin_step(args.prompt)
        got = ref(prompt, use_cache=False).logits[0]
        kv.end_step()
        diffs = [float((got - ref_logits[0]).abs().max())]
        kv_tokens = [int(got[-1].argmax())]
        for i in range(args.steps):
            kv.begin_step(1)
            got = ref(torch.tensor([[ref_tokens[i]]]), position_ids=torch.tensor([[kv.pos]]),
                      use_cache=False).logits[0]
            kv.end_step()
            diffs.append(float((got - ref_logits[i + 1]).abs().max()))
            kv_tokens.append(int(got[-1].argmax()))
    ref_next = ref_tokens + [int(ref_logits[-1][-1].argmax())]
    worst = max(diffs)
    # A step whose reference top-2 gap is below twice the logit error is a tie at this
    # precision: kvattn may pick either token there.
    mismatch, ties = [], 0
    for i, (a, b) in enumerate(zip(kv_tokens, ref_next)):
        if a != b:
            top2 = torch.topk(ref_logits[i][-1], 2).values
            gap = float(top2[0] - top2[1])
            mismatch.append((i, gap))
            ties += gap < 2 * diffs[i]
    ok = worst <= tol and ties == len(mismatch) and (args.dtype != "f32" or not mismatch)
    scale = float(torch.cat(ref_logits).abs().max())
    print("deepseek_mla_check: transformers %s, torch %s, %d layers, H 16, Dc 512, Dr 64, "
          "Dn 128, Dv 128; kvattn %s backend, %s cache, block 16" % (
              __import__("transformers").__version__, torch.__version__, args.layers,
              args.backend, args.dtype))
    print("  prompt %d tokens (compute-friendly path): max |dlogit| %.3g" % (args.prompt,
                                                                              diffs[0]))
    print("  %d decode steps on the reference's greedy tokens (absorbed path): max |dlogit| "
          "%.3g; logits up to %.3g" % (args.steps, max(diffs[1:]) if args.steps else 0.0,
                                       scale))
    print("  greedy tokens identical at %d of %d steps%s" % (
        len(kv_tokens) - len(mismatch), len(kv_tokens),
        "" if not mismatch else "; differing at %s (reference top-2 gap; ties below twice "
        "the logit error: %d of %d)" % (", ".join("step %d (%.3g)" % m for m in mismatch),
                                        ties, len(mismatch))))
    print("  tolerance %.3g: %s" % (tol, "PASS" if ok else "FAIL"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
