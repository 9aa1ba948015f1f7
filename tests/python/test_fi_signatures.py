"""kvattn.flashinfer's signatures against FlashInfer 0.7.2's, frozen in
fi_signatures_072.py (written by dev/api46/freeze_fi_signatures.py from the
installed package; CI has no FlashInfer). A call a FlashInfer user makes must
bind the same way in kvattn:

- FlashInfer's positional parameters are kvattn's first positional ones, same
  names, same order (a positional call fills the same parameters);
- every FlashInfer keyword exists in kvattn and accepts a keyword;
- defaults are FlashInfer's (kvattn may give one where FlashInfer has none,
  e.g. float_workspace_buffer=None);
- kvattn's own extra parameters have defaults and, if positional, come after
  all of FlashInfer's (so they cannot take a FlashInfer positional argument);
- *args where FlashInfer has *args (the wrappers' run() refuses them, as the
  legacy positional tail FlashInfer warns about is then empty).
What kvattn does with an accepted argument (use it, ignore a hint, or raise
UnsupportedError) is checked by the behaviour tests (test_fi_conformance.py,
test_fi_api.py)."""

import inspect

import pytest

from kvattn import flashinfer as fi
from fi_signatures_072 import SIGNATURES, VERSION

POSITIONAL = ("POSITIONAL_ONLY", "POSITIONAL_OR_KEYWORD")


def _kvattn_object(key):
    parts = key.split(".")
    obj = getattr(fi, parts[0], None)
    for p in parts[1:]:
        obj = getattr(obj, p, None) if obj is not None else None
    return obj


def _kvattn_params(obj):
    ps = list(inspect.signature(obj).parameters.values())
    if ps and ps[0].name == "self":
        ps = ps[1:]
    return ps


def _problems(key, frozen):
    """Why FlashInfer calls of key would bind differently in kvattn ([] if none)."""
    obj = _kvattn_object(key)
    if obj is None:
        return ["%s: missing in kvattn.flashinfer" % key]
    mine = _kvattn_params(obj)
    byname = {p.name: p for p in mine}
    out = []
    fi_pos = [n for n, k, _ in frozen if k in POSITIONAL]
    my_pos = [p.name for p in mine if p.kind.name in POSITIONAL]
    if my_pos[: len(fi_pos)] != fi_pos:
        out.append("positional order %s, FlashInfer's %s" % (my_pos, fi_pos))
    fi_names = set()
    for name, kind, default in frozen:
        fi_names.add(name)
        if kind == "VAR_POSITIONAL":
            if not any(p.kind.name == "VAR_POSITIONAL" for p in mine):
                out.append("no *%s (FlashInfer has one)" % name)
            continue
        if kind == "VAR_KEYWORD":
            continue
        p = byname.get(name)
        if p is None:
            out.append("lacks %s (%s, default %s)" % (name, kind, default))
            continue
        if kind == "KEYWORD_ONLY" and p.kind.name not in ("POSITIONAL_OR_KEYWORD", "KEYWORD_ONLY"):
            out.append("%s does not take a keyword" % name)
        if default in ("NO_DEFAULT", "OTHER"):
            continue
        if p.default is inspect.Parameter.empty:
            out.append("%s has no default (FlashInfer's %s)" % (name, default))
        elif repr(p.default) != default:
            out.append("%s default %r, FlashInfer's %s" % (name, p.default, default))
    n_fi_pos = len(fi_pos)
    for i, p in enumerate(mine):
        if p.name in fi_names or p.kind.name in ("VAR_POSITIONAL", "VAR_KEYWORD"):
            continue
        if p.default is inspect.Parameter.empty:
            out.append("kvattn's extra %s has no default" % p.name)
        if p.kind.name in POSITIONAL and i < n_fi_pos:
            out.append("kvattn's extra positional %s sits among FlashInfer's" % p.name)
    return ["%s: %s" % (key, x) for x in out]


@pytest.mark.parametrize("key", sorted(SIGNATURES))
def test_signature_matches_flashinfer_072(key):
    assert VERSION.startswith("0.7.2")
    assert _problems(key, SIGNATURES[key]) == []


def test_the_check_can_fail():
    """The comparison finds a shifted positional parameter, a missing
    keyword, a changed default and a positional extra."""
    frozen = SIGNATURES["BatchDecodeWithPagedKVCacheWrapper.plan"]
    swapped = list(frozen)
    swapped[7], swapped[8] = swapped[8], swapped[7]
    assert any("positional order" in x for x in _problems(
        "BatchDecodeWithPagedKVCacheWrapper.plan", swapped))
    extra = frozen + [("no_such_keyword", "KEYWORD_ONLY", "None")]
    assert any("lacks no_such_keyword" in x for x in _problems(
        "BatchDecodeWithPagedKVCacheWrapper.plan", extra))
    changed = [(n, k, "'HND'" if n == "pos_encoding_mode" else d) for n, k, d in frozen]
    assert any("pos_encoding_mode default" in x for x in _problems(
        "BatchDecodeWithPagedKVCacheWrapper.plan", changed))
    short = [x for x in frozen if x[0] != "window_left"]
    assert any("positional order" in x or "extra positional window_left" in x
               for x in _problems("BatchDecodeWithPagedKVCacheWrapper.plan", short))
