"""Continuous batching: a step scheduler over the model and an attention backend.

Every step packs, within a token budget, one token for each running request that is decoding
and then chunks of the prompts still being prefilled (chunked prefill), admitting waiting
requests while there is room. Prefill chunks and decodes run in the same forward pass; a
request whose chunk reaches the end of its sequence gets a next token from the logits of its
last row (greedy, or a forced token for teacher forcing).
"""

import time

import numpy as np


class Request:
    def __init__(self, prompt, max_new_tokens, forced=None, keep_logits=False):
        self.prompt = list(prompt)
        self.max_new_tokens = max_new_tokens
        self.forced = forced  # teacher forcing: the tokens to feed instead of the argmax
        self.keep_logits = keep_logits
        self.generated = []
        self.logits = []  # [vocab] rows, one per generated token, when keep_logits
        self.rid = None
        self.num_computed = 0
        self.num_cached = 0
        self.done = False

    def seq(self):
        return self.prompt + self.generated


class Engine:
    def __init__(self, model, attn, max_num_seqs=8, max_batched_tokens=256, stop_at_eos=True):
        self.model = model
        self.attn = attn
        self.max_num_seqs = max_num_seqs
        self.max_batched_tokens = max_batched_tokens
        self.stop_at_eos = stop_at_eos
        self.waiting = []
        self.running = []
        self.steps = 0
        self.mixed_steps = 0  # steps with prefill chunks and decodes together
        self.prompt_tokens = 0  # prompt tokens computed (cache hits excluded)
        self.decode_tokens = 0

    def add(self, req):
        self.waiting.append(req)
        return req

    def _schedule(self):
        budget = self.max_batched_tokens
        batch = []  # (request, number of new tokens)
        for r in self.running:  # decodes first
            if r.num_computed >= len(r.prompt) and budget > 0:
                batch.append((r, 1))
                budget -= 1
        for r in self.running:  # then prompts already admitted
            left = len(r.prompt) - r.num_computed
            if left > 0 and budget > 0:
                n = min(left, budget)
                batch.append((r, n))
                budget -= n
        while self.waiting and len(self.running) < self.max_num_seqs and budget > 0:
            r = self.waiting.pop(0)
            r.rid, r.num_cached = self.attn.add_request(r.prompt)
            r.num_computed = r.num_cached
            self.running.append(r)
            n = min(len(r.prompt) - r.num_computed, budget)
            batch.append((r, n))
            budget -= n
        for r, n in batch:
            if not self.attn.allocate(r.rid, n):
                raise RuntimeError("KV cache exhausted: raise --num-blocks or lower --max-num-seqs")
        return batch

    def step(self):
        batch = self._schedule()
        if not batch:
            return False
        tokens, positions, items, rows = [], [], [], []
        for r, n in batch:
            seq = r.seq()
            tokens += seq[r.num_computed : r.num_computed + n]
            positions += range(r.num_computed, r.num_computed + n)
            items.append((r.rid, r.num_computed, n))
            if r.num_computed + n == len(seq):
                rows.append(len(tokens) - 1)
        self.attn.begin_step(items)
        logits = self.model.forward(tokens, positions, self.attn, rows)
        self.steps += 1
        decodes = sum(1 for r, n in batch if r.num_computed >= len(r.prompt))
        self.mixed_steps += int(0 < decodes < len(batch))
        row = 0
        for r, n in batch:
            seq = r.seq()
            self.attn.commit(r.rid, seq[r.num_computed : r.num_computed + n])
            if r.num_computed >= len(r.prompt):
                self.decode_tokens += n
            else:
                self.prompt_tokens += n
            r.num_computed += n
            if r.num_computed < len(seq):
                continue
            lg = logits[row]
            row += 1
            if r.keep_logits:
                r.logits.append(lg.copy())
            nxt = int(r.forced[len(r.generated)]) if r.forced is not None else int(np.argmax(lg))
            r.generated.append(nxt)
            eos = self.stop_at_eos and r.forced is None and nxt == self.model.cfg.eos_id
            if eos or len(r.generated) >= r.max_new_tokens:
                r.done = True
                self.attn.free(r.rid)
                self.running.remove(r)
        return True

    def run(self):
        t0 = time.perf_counter()
        while self.step():
            pass
        return time.perf_counter() - t0


def generate(model, attn, prompts, max_new_tokens, forced=None, keep_logits=False, **kw):
    """Runs every prompt (token lists) to completion; returns (requests, engine, seconds)."""
    eng = Engine(model, attn, **kw)
    reqs = [
        eng.add(Request(p, max_new_tokens, None if forced is None else forced[i], keep_logits))
        for i, p in enumerate(prompts)
    ]
    secs = eng.run()
    return reqs, eng, secs
