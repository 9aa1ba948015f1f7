"""Writes tests/python/fi_signatures_072.py: the signatures of the FlashInfer
objects kvattn.flashinfer mirrors, read from an installed FlashInfer
(flashinfer-python 0.7.2.post1 here) with inspect, no GPU needed.

    /path/to/venv-with-flashinfer/bin/python dev/api46/freeze_fi_signatures.py OUT.py

The decode wrapper's plan() is (..., page_size, *deprecated_positional_args,
**kwargs) in 0.7.2: its effective signature is written instead, the legacy
positional names (_BATCH_DECODE_PLAN_LEGACY_POS_ARGS, the order positional
calls bind in) as positional parameters with _plan_impl's defaults, and
_plan_impl's other keyword-only parameters as keyword-only.

It also writes MODULES: for flashinfer itself ("") and the submodules engines
import from (decode, prefill, cascade, mla, page, utils), which of CANDIDATES
(the names kvattn.flashinfer mirrors, or deliberately leaves out) each holds,
and the signatures of the module-level functions in FUNCTIONS (api47)."""

import importlib
import inspect
import sys

import flashinfer
import flashinfer.decode as fdec
import flashinfer.utils as futils
import flashinfer.page as fpage

CLASSES = ["BatchDecodeWithPagedKVCacheWrapper", "BatchPrefillWithPagedKVCacheWrapper",
           "BatchPrefillWithRaggedKVCacheWrapper", "MultiLevelCascadeAttentionWrapper",
           "BatchMLAPagedAttentionWrapper"]
METHODS = ["__init__", "plan", "begin_forward", "run", "run_return_lse", "forward",
           "forward_return_lse"]
SIMPLE = (type(None), bool, int, float, str)
SUBMODULES = ["decode", "prefill", "cascade", "mla", "page", "utils"]
CANDIDATES = CLASSES + ["merge_state", "merge_state_in_place", "merge_states", "get_alibi_slopes",
                        "fast_decode_plan", "get_seq_lens", "trtllm_batch_decode_with_kv_cache",
                        "trtllm_batch_decode_with_kv_cache_mla", "append_paged_kv_cache",
                        "get_batch_indices_positions"]
FUNCTIONS = {"decode.fast_decode_plan": fdec.fast_decode_plan,
             "decode.trtllm_batch_decode_with_kv_cache": fdec.trtllm_batch_decode_with_kv_cache,
             "mla.trtllm_batch_decode_with_kv_cache_mla":
                 fdec.trtllm_batch_decode_with_kv_cache_mla,
             "page.get_seq_lens": fpage.get_seq_lens}


def params(sig):
    out = []
    for p in list(sig.parameters.values())[1:] if next(iter(sig.parameters), "") == "self" \
            else sig.parameters.values():
        d = p.default
        if d is inspect.Parameter.empty:
            dv = "NO_DEFAULT"
        elif isinstance(d, SIMPLE):
            dv = repr(d)
        else:
            dv = "OTHER"  # a torch dtype or object default: not compared
        out.append((p.name, p.kind.name, dv))
    return out


def decode_plan():
    impl = inspect.signature(fdec.BatchDecodeWithPagedKVCacheWrapper._plan_impl)
    ps = params(impl)
    legacy = list(fdec._BATCH_DECODE_PLAN_LEGACY_POS_ARGS)
    byname = {n: (n, k, d) for n, k, d in ps}
    head = [x for x in ps if x[1] == "POSITIONAL_OR_KEYWORD"]
    return head + [(n, "POSITIONAL_OR_KEYWORD", byname[n][2]) for n in legacy] + \
        [x for x in ps if x[1] == "KEYWORD_ONLY" and x[0] not in legacy]


def main(path):
    table = {}
    for c in CLASSES:
        cls = getattr(flashinfer, c)
        for m in METHODS:
            f = getattr(cls, m, None)
            if f is None:
                continue
            if c == "BatchDecodeWithPagedKVCacheWrapper" and m in ("plan", "begin_forward"):
                table[c + "." + m] = decode_plan()
            else:
                table[c + "." + m] = params(inspect.signature(f))
    for name in ("merge_state", "merge_state_in_place", "merge_states"):
        table[name] = params(inspect.signature(getattr(flashinfer, name)))
    table["get_alibi_slopes"] = params(inspect.signature(futils.get_alibi_slopes))
    for k, f in FUNCTIONS.items():
        table[k] = params(inspect.signature(f))
    modules = {"": [n for n in CANDIDATES if hasattr(flashinfer, n)]}
    for m in SUBMODULES:
        mod = importlib.import_module("flashinfer." + m)
        modules[m] = [n for n in CANDIDATES if hasattr(mod, n)]
    with open(path, "w") as f:
        f.write('"""Signatures of FlashInfer %s (flashinfer-python), frozen by\n'
                'dev/api46/freeze_fi_signatures.py for test_fi_signatures.py: per object,\n'
                '(name, kind, default repr or NO_DEFAULT / OTHER) of each parameter after self."""\n\n'
                % flashinfer.__version__)
        f.write("VERSION = %r\n\nSIGNATURES = {\n" % flashinfer.__version__)
        for k, v in table.items():
            f.write("    %r: [\n" % k)
            for x in v:
                f.write("        %r,\n" % (x,))
            f.write("    ],\n")
        f.write("}\n\n# Which of the mirrored names FlashInfer's package and submodules hold.\n"
                "MODULES = {\n")
        for k, v in modules.items():
            f.write("    %r: %r,\n" % (k, v))
        f.write("}\n")


if __name__ == "__main__":
    main(sys.argv[1])
