#!/usr/bin/env python3
"""Check the example's SmolLM2 model against transformers on the same GGUF file.

transformers dequantizes the GGUF (it needs `gguf`, `accelerate` and torch) and runs it in f32.
For each prompt it produces a greedy continuation of --num-tokens tokens and the logits of the
teacher-forced sequence; our model then runs teacher-forced on the same tokens (prefill, then
one decode per token, through the continuous-batching engine) with each KV cache format, and
the script reports top-1 agreement and max |dlogit| per format. It also lets our model
generate greedily on its own (f32 cache) and counts the prompts whose first --greedy-tokens
tokens equal transformers'.

    python examples/llm/check_transformers.py --formats f32,f16,bf16,int8_channel,fp8

The transformers results are kept in --ref-cache (an .npz), so later runs need no torch.
Pass criteria (f32 cache): top-1 agreement >= 99%, max |dlogit| <= 5e-3, greedy text equal
on most prompts.
"""

import argparse
import datetime
import json
import os
import sys
import time

PROMPTS = [
    "Write a short story about a robot who learns to paint.",
    "Explain how a transformer language model generates text.",
    "What are the health benefits of drinking green tea?",
    "Describe the water cycle for a ten year old.",
    "Give me five tips for writing clean Python code.",
    "Why do leaves change color in autumn?",
]


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=["smollm2", "gemma3"], default="smollm2")
    ap.add_argument("--attn", choices=["kvattn", "numpy"], default="kvattn")
    ap.add_argument("--backend", choices=["cpu", "ref", "cuda"], default="cpu")
    ap.add_argument("--formats", default="f32,f16,bf16,int8_channel,int8_token_k,fp8")
    ap.add_argument("--num-prompts", type=int, default=6)
    ap.add_argument("--num-tokens", type=int, default=64)
    ap.add_argument("--greedy-tokens", type=int, default=32)
    ap.add_argument("--gemma-prompt-len", type=int, default=640, help="gemma3: prompt tokens (window 512)")
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ref-cache", help="default: build/llm-<model>-transformers-ref.npz")
    ap.add_argument("--json", help="write the results here")
    return ap.parse_args()


def transformers_reference(gguf_path, prompts, num_tokens):
    """Greedy continuation and teacher-forced logits [num_tokens, vocab] per prompt (torch, f32)."""
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_grad_enabled(False)
    m = AutoModelForCausalLM.from_pretrained(
        os.path.dirname(gguf_path), gguf_file=os.path.basename(gguf_path), torch_dtype=torch.float32
    ).eval()
    toks, logits = [], []
    for p in prompts:
        ids = torch.tensor([p])
        out = m(ids, use_cache=True)
        past, gen = out.past_key_values, []
        nxt = int(out.logits[0, -1].argmax())
        for _ in range(num_tokens):  # plain argmax, no stop token: the continuation is well defined
            gen.append(nxt)
            out = m(torch.tensor([[nxt]]), past_key_values=past, use_cache=True)
            past, nxt = out.past_key_values, int(out.logits[0, -1].argmax())
        full = m(torch.tensor([p + gen])).logits[0]  # one teacher-forced pass over prompt + continuation
        toks.append(gen)
        logits.append(full[len(p) - 1 : len(p) - 1 + num_tokens].numpy().astype(np.float32))
    return np.array(toks, dtype=np.int64), np.stack(logits), torch.__version__


def gemma3_setup(args, here):
    """Gemma 3 270M: prompts longer than its 512-token window (the first part of three of
    kvattn's docs pages), tokenized by transformers' tokenizer built from the GGUF."""
    import gemma3
    from generate import DEFAULT_PROMPTS
    from transformers import AutoTokenizer

    path = gemma3.find_gemma3_gguf()
    cfg, weights = gemma3.load(path)
    saved = "build/llm-gemma3-tokenizer"  # building it from the GGUF's 262k tokens takes minutes
    if os.path.isdir(saved):
        tok = AutoTokenizer.from_pretrained(saved)
    else:
        tok = AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))
        tok.save_pretrained(saved)
    docs = os.path.join(here, "..", "..", "docs")
    prompts = []
    for name in ("architecture.md", "pool.md", "quant.md")[: args.num_prompts]:
        with open(os.path.join(docs, name)) as f:
            prompts.append(tok(f.read()).input_ids[: args.gemma_prompt_len])
    calib = [tok(t).input_ids for t in DEFAULT_PROMPTS]
    return prompts, calib, path, gemma3.Gemma3(cfg, weights)


def main():
    args = parse_args()
    args.ref_cache = args.ref_cache or f"build/llm-{args.model}-transformers-ref.npz"
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, str(args.threads))
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, here)
    import numpy as np

    import gguf_model
    from engine import generate
    from generate import calibration_prompts, make_attn
    from model import Llama

    if args.model == "smollm2":
        path = gguf_model.find_smollm2_gguf()
        cfg, weights, tok = gguf_model.load(path)
        model = Llama(cfg, weights)
        prompts = [tok.encode(gguf_model.chat_prompt(t)).ids for t in PROMPTS[: args.num_prompts]]
        calib = calibration_prompts(tok)
    else:
        prompts, calib, path, model = gemma3_setup(args, here)
        cfg = model.cfg
    n = args.num_tokens

    key = json.dumps([prompts, n])
    ref = None
    if os.path.exists(args.ref_cache):
        z = np.load(args.ref_cache)
        if str(z["key"]) == key:
            ref = (z["tokens"], z["logits"], str(z["torch"]))
    if ref is None:
        t0 = time.perf_counter()
        ref = transformers_reference(path, prompts, n)
        print(f"transformers reference: {time.perf_counter() - t0:.1f} s")
        os.makedirs(os.path.dirname(os.path.abspath(args.ref_cache)), exist_ok=True)
        np.savez(args.ref_cache, key=key, tokens=ref[0], logits=ref[1], torch=ref[2])
    ref_tokens, ref_logits, torch_version = ref
    ref_top1 = ref_logits.argmax(-1)
    print(f"{len(prompts)} prompts ({min(map(len, prompts))}-{max(map(len, prompts))} tokens), "
          f"{n} teacher-forced tokens each; transformers argmax == its greedy tokens: "
          f"{(ref_top1 == ref_tokens).mean():.4f}")

    results = dict(
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        gguf=os.path.basename(path), torch=torch_version, prompts=len(prompts), tokens=n,
        attn=args.attn, backend=args.backend, formats={},
    )
    ok = True
    for fmt in args.formats.split(","):
        ns = argparse.Namespace(backend=args.backend, kv_dtype=fmt, block_size=args.block_size,
                                num_blocks=64 * len(prompts), threads=args.threads)
        attn = make_attn(ns, model, args.attn, calib)
        t0 = time.perf_counter()
        reqs, _, _ = generate(model, attn, prompts, n, forced=list(ref_tokens), keep_logits=True,
                              max_num_seqs=len(prompts), max_batched_tokens=256)
        got = np.stack([np.array(r.logits) for r in reqs])
        d = np.abs(got - ref_logits)
        r = dict(top1_agreement=float((got.argmax(-1) == ref_top1).mean()), max_abs_dlogit=float(d.max()),
                 mean_abs_dlogit=float(d.mean()), seconds=time.perf_counter() - t0)
        if fmt == args.formats.split(",")[0] and args.greedy_tokens > 0:
            g, _, _ = generate(model, make_attn(ns, model, args.attn, calib), prompts, args.greedy_tokens,
                               max_num_seqs=len(prompts), max_batched_tokens=256, stop_at_eos=False)
            same = [x.generated == list(ref_tokens[i][: args.greedy_tokens]) for i, x in enumerate(g)]
            r["greedy_equal_prompts"] = int(sum(same))
            first = [next((j for j, (a, b) in enumerate(zip(x.generated, ref_tokens[i])) if a != b),
                          args.greedy_tokens) for i, x in enumerate(g)]
            r["greedy_first_mismatch"] = first
        results["formats"][fmt] = r
        line = (f"{args.attn:6s} {fmt:16s} top-1 {r['top1_agreement']:.4f}  max|dlogit| {r['max_abs_dlogit']:.3g}"
                f"  mean|dlogit| {r['mean_abs_dlogit']:.2g}")
        if "greedy_equal_prompts" in r:
            line += f"  greedy {args.greedy_tokens} tok equal on {r['greedy_equal_prompts']}/{len(prompts)}"
        print(line, flush=True)
        if fmt == "f32":
            ok = ok and r["top1_agreement"] >= 0.99 and r["max_abs_dlogit"] <= 5e-3
            ok = ok and r.get("greedy_equal_prompts", len(prompts)) * 2 > len(prompts)
    print("check vs transformers (f32 cache):", "PASS" if ok else "FAIL")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
