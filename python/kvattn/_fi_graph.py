"""FlashInfer's CUDA-graph mode of the paged wrappers (use_cuda_graph=True).

FlashInfer fixes a graph-mode wrapper's batch size and page count by the
buffers given at construction, and copies each plan() into them, so a graph
captured over run() reads the newest plan when replayed. kvattn's CUDA
context keeps its plans in device buffers of its own that also keep their
addresses (kvattn_cuda.h), as long as no plan needs more than they hold: a
plan that grows them frees the old ones, which a captured graph would go on
reading. So in graph mode the wrapper reserves the context's buffers for the
largest plan the FlashInfer buffers allow before the first capture, and
refuses, after a capture, a plan that would not fit instead of growing them.
kvattn's page table is dense ([requests, the longest request's pages]), so
the page-table reservation is the larger of the indices buffer's length and
twice the first plan's table; a later table larger than that is fine before a
capture (the reservation grows) and refused after one. With an indices
buffer of batch_size x P entries, as SGLang (max batch x context pages) and
vLLM (max_num_seqs x pages per request) size theirs, every request may hold
up to P pages after a capture; what kvattn refuses and FlashInfer accepts is
a skew beyond that: one request holding more than indices buffer /
batch_size pages. Reserving for the worst skew the buffer allows (batch_size
x the whole buffer) would cost batch_size times the buffer, per wrapper
(docs/python.md has the numbers); a page table the kernels read through
indptr (CSR, as FlashInfer's) would remove the bound. The prefill wrapper
reserves more query rows than requests, so that the context has prefill-tile
capacity (and a captured run launches the prefill kernel) even when its
first plan has one row per request.
A captured run also keeps what the plan of its capture fixed in its kernels'
arguments and choice (kvattn_cuda.h): the causal flag and window (which also
shape the plan's work list), ALiBi on/off, and for the MLA wrapper the
kernel's rows per item (H x the longest q_len, in 16 / 32 / 64). After a
capture a plan that differs in them is refused (the causal flag only where
the plan has a request of more than one query row: for q_len 1 it masks
nothing). The scale and soft-cap stay the captured ones, as in FlashInfer.
Outside graph mode, run() under capture is refused: a later plan could grow
the buffers under the graph (FlashInfer's own wrappers need graph mode for
capture as well, their plan() allocating new buffers otherwise)."""

import sys

import numpy as np

from . import _tensor as T
from ._errors import InvalidArgumentError, UnsupportedError


def _length(x, name):
    if x is None:
        raise InvalidArgumentError("%s must be a tensor in CUDA-graph mode (use_cuda_graph=True)"
                                   % name)
    return int(T.view(x, name).shape[0])


class GraphMode:
    """The graph-mode state of one paged wrapper."""

    def __init__(self, batch_size, num_indices, prefill=False):
        self.batch_size = batch_size
        self.num_indices = num_indices
        self.prefill = prefill  # plans may hold requests of several rows (prefill tiles)
        self.max_rows = None  # query rows: fixed by the first plan (FlashInfer's rule)
        self.q_len_per_req = None  # decode: fixed by the first plan (FlashInfer's rule)
        self.reserved = None  # (R, T, page-table entries, H, Hkv, Dv) reserved on the context
        self.captured = False  # run() was captured into a graph
        self.key = None  # fixed_key of the newest plan made (made())
        self.captured_key = None  # fixed_key of the plan the graphs were captured over

    @classmethod
    def decode(cls, indptr_buf, indices_buf, last_page_len_buf):
        """FlashInfer's decode wrapper: batch size = len(paged_kv_last_page_len_buffer)."""
        n_indptr = _length(indptr_buf, "paged_kv_indptr_buffer")
        n_indices = _length(indices_buf, "paged_kv_indices_buffer")
        bs = _length(last_page_len_buf, "paged_kv_last_page_len_buffer")
        if n_indptr != bs + 1:
            raise InvalidArgumentError("paged_kv_indptr_buffer must hold batch_size + 1 = %d "
                                       "entries in CUDA-graph mode" % (bs + 1))
        return cls(bs, n_indices)

    @classmethod
    def prefill(cls, qo_indptr_buf, indptr_buf, indices_buf, last_page_len_buf):
        """FlashInfer's paged prefill wrapper: batch size = len(qo_indptr_buf) - 1."""
        bs = _length(qo_indptr_buf, "qo_indptr_buf") - 1
        if _length(indptr_buf, "paged_kv_indptr_buf") != bs + 1:
            raise InvalidArgumentError("paged_kv_indptr_buf must hold batch_size + 1 = %d "
                                       "entries in CUDA-graph mode" % (bs + 1))
        if _length(last_page_len_buf, "paged_kv_last_page_len_buf") != bs:
            raise InvalidArgumentError("paged_kv_last_page_len_buf must hold batch_size = %d "
                                       "entries in CUDA-graph mode" % bs)
        return cls(bs, _length(indices_buf, "paged_kv_indices_buf"), prefill=True)

    @classmethod
    def mla(cls, qo_indptr, kv_indices):
        """FlashInfer's MLA wrapper: its CSR buffers, where given, fix the batch
        size (len(qo_indptr) - 1) and the page count; without them (a dense
        page table) nothing is fixed but the first plan's query rows."""
        bs = _length(qo_indptr, "qo_indptr") - 1 if qo_indptr is not None else None
        return cls(bs, _length(kv_indices, "kv_indices") if kv_indices is not None else 0)

    def check_plan(self, batch_size, num_indices, rows, q_len_per_req=None):
        """FlashInfer's graph-mode checks of plan(), before anything changes."""
        if self.batch_size is not None and batch_size != self.batch_size:
            raise InvalidArgumentError("CUDA-graph mode: the batch size %d differs from the %d "
                                       "fixed by the buffers given at construction"
                                       % (batch_size, self.batch_size))
        if self.num_indices and num_indices > self.num_indices:
            raise InvalidArgumentError("CUDA-graph mode: %d page indices exceed the indices "
                                       "buffer's %d" % (num_indices, self.num_indices))
        if (q_len_per_req is not None and self.q_len_per_req is not None
                and q_len_per_req != self.q_len_per_req):
            raise InvalidArgumentError("CUDA-graph mode: q_len_per_req %d differs from the "
                                       "first plan's %d (use one wrapper per q_len_per_req)"
                                       % (q_len_per_req, self.q_len_per_req))
        if self.max_rows is not None and rows > self.max_rows:
            raise InvalidArgumentError("CUDA-graph mode: %d query rows exceed the %d of the "
                                       "first plan" % (rows, self.max_rows))

    def planned(self, rows, q_len_per_req=None):
        if self.max_rows is None:
            self.max_rows = rows
        if self.q_len_per_req is None:
            self.q_len_per_req = q_len_per_req

    def reserve(self, ctx, kw, mla_rows=None):
        """Before a plan on ctx (a CUDA context): keeps the device buffers the
        graph reads, or refuses the plan after a capture (also one that
        differs from the captured plan in what the graph's kernels keep).
        Returns the plan's fixed_key, for made() once the plan exists."""
        key = fixed_key(kw, mla_rows)
        if self.captured and not compatible(key, self.captured_key):
            raise InvalidArgumentError(
                "CUDA-graph mode: this plan differs from the one the graph was captured over in "
                "what the captured kernels keep (%s); replaying it would compute the captured "
                "plan's masks or kernel shape" % _diff(key, self.captured_key))
        bt = kw["block_table"]
        r, width = (bt.shape[0], bt.shape[1]) if bt.ndim == 2 else (bt.shape[0], 0)
        rows = int(kw["query_start_loc"][-1]) if r else 0
        shape = (kw["num_heads"], kw["num_kv_heads"], kw["head_dim_v"] or kw["head_dim"])
        need = (r, rows, r * width)
        have = self.reserved
        if have is not None and have[3:] == shape and all(n <= h for n, h in zip(need, have)):
            return key
        if self.captured:
            per_req = "" if not have or not r else (
                "; with %d requests a request may hold at most %d pages (size the indices buffer "
                "as batch_size x the longest request's pages, as SGLang and vLLM do)"
                % (r, have[2] // r))
            raise InvalidArgumentError(
                "CUDA-graph mode: this plan needs %d requests, %d query rows and a page table of "
                "%d x %d = %d entries (kvattn's table is dense: requests x the longest request's "
                "pages); the buffers reserved before the graph was captured hold %s%s, and "
                "growing them would leave the captured graph reading freed memory"
                % (r, rows, r, width, need[2], have and "%d, %d and %d" % have[:3], per_req))
        bt_cap = max(self.num_indices, 2 * need[2], have[2] if have and have[3:] == shape else 0)
        reqs = self.batch_size if self.batch_size is not None else max(r, have[0] if have else 0)
        tokens = max(self.max_rows or 0, rows)
        if self.prefill:  # kva_cuda_context_reserve reserves prefill tiles only for T > R
            tokens = max(tokens, reqs + 1)
        cap = (reqs, tokens, bt_cap) + shape
        ctx.reserve(*cap)
        self.reserved = cap
        return key

    def made(self, key):
        """The plan of key (reserve()'s) was made: the one a capture now records."""
        self.key = key

    def capture(self):
        """run() is being captured over the newest plan. A later capture's
        plan is compatible with the first's (reserve() refused any other),
        so later plans are held to the first capture's key."""
        if self.captured_key is None:
            self.captured_key = self.key
        self.captured = True


# The scale and soft-cap are kernel arguments only (the graph keeps the
# captured ones, as FlashInfer's graphs do); these also shape the plan's
# work list or the kernel's choice.
_KEY_FIELDS = ("causal", "window_left", "block_size", "q_dtype", "head_dim", "head_dim_v",
               "num_heads", "num_kv_heads", "mla_layer")


def fixed_key(kw, mla_rows=None):
    """What a captured run keeps of the plan it was captured over (kernel
    arguments, kernel choice): a dict of kw's mask and shape fields, ALiBi
    on/off, the MLA kernel's rows per item, and the longest q_len (for
    compatible())."""
    key = {f: kw.get(f) for f in _KEY_FIELDS}
    key["alibi"] = kw.get("alibi_slopes") is not None
    key["mla_rows"] = mla_rows
    qo = np.asarray(kw["query_start_loc"], np.int64)
    key["max_q_len"] = int(np.diff(qo).max()) if qo.size > 1 else 0
    return key


def compatible(key, captured):
    """Whether a plan of key replays right in a graph captured over a plan of
    captured: the same fields, except that the causal flag may differ where
    the plan has no request of more than one query row (causal masks nothing
    then: a row at the last position sees every key)."""
    if captured is None:
        return True
    for f in key:
        if f == "max_q_len" or key[f] == captured[f]:
            continue
        if f == "causal" and key["max_q_len"] <= 1:
            continue
        return False
    return True


def _diff(key, captured):
    return ", ".join("%s %r, captured %r" % (f, key[f], captured[f]) for f in key
                     if f != "max_q_len" and key[f] != captured[f])


def mla_rows(num_heads, query_start_loc):
    """The CUDA MLA decode's rows per item for a kernel-level MLA plan
    (kva__cuda_mla_decode_rows over the plan's longest q_len): 16, 32 or 64.
    (A layer-level plan's absorbed part counts its decodes only; such plans
    are not captured, and mla_layer tells them apart.)"""
    qo = np.asarray(query_start_loc, np.int64)
    mq = max(int(np.diff(qo).max()) if qo.size > 1 else 1, 1)
    r = int(num_heads) * mq
    return 16 if r <= 16 else 32 if r <= 32 else 64


def capturing(ctx, q):
    """True when q is a torch CUDA tensor and its device's current stream is
    capturing a CUDA graph (only checked once torch is loaded)."""
    torch = sys.modules.get("torch")
    if torch is None or ctx.device != T.CUDA or not T.is_torch(q):
        return False
    return bool(torch.cuda.is_current_stream_capturing())


def on_current_stream(ctx):
    """Puts a CUDA context on torch's current stream of its device (when torch
    is loaded; other backends: nothing): runs are issued there, and a plan's
    upload is ordered before the runs and graph replays on that stream, as
    FlashInfer's plan() copies on it."""
    torch = sys.modules.get("torch")
    if torch is not None and ctx.device == T.CUDA and torch.cuda.is_available():
        ctx.set_stream(torch.cuda.current_stream(ctx.device_id).cuda_stream)


def refuse_uncaptured(graph, prepared):
    """run() under capture: needs graph mode and a plan prepared by plan()
    (a plan made during capture would upload inside the graph)."""
    if graph is None:
        raise UnsupportedError(
            "run() under CUDA graph capture needs a wrapper made with use_cuda_graph=True and its "
            "buffers (FlashInfer's CUDA-graph mode): without them a later plan() may grow the "
            "context's device buffers, which the captured graph would go on reading")
    if not prepared:
        raise UnsupportedError(
            "run() under CUDA graph capture with a cache form, window_left or q/k scale that "
            "plan() did not prepare: run once with these arguments before capturing")
    graph.capture()
