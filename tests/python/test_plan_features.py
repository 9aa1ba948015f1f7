"""The plan features of include/kvattn.h reached from Python: chunked local
attention (Plan(attention_chunk=C), Pool.drop_chunk), draft trees (tree=,
tree_mask=), cascade plans (cascade=, the explicit grouping, Plan.info's
cascade fields) and decode context parallelism (dcp_size / dcp_rank /
dcp_interleave, dcp_local_lens, dcp_slots, merge_states_n), against the
numpy reference (reference.py, from the header's text), outputs poisoned;
bad inputs raise and leave outputs untouched. Also: every ctypes struct of
_lib.py against the C struct of the same name (field names from the
headers, offsets and sizes from a C compiler)."""

import ctypes
import os
import re
import shutil
import subprocess

import numpy as np
import pytest

import kvattn
from kvattn import _lib as L
from poison import poisoned, untouched
from reference import ancestors, attention

RNG = np.random.default_rng(43)
HERE = os.path.dirname(os.path.abspath(__file__))
INCLUDE = os.path.join(HERE, "..", "..", "include")

try:
    import torch
except ImportError:  # plain numpy venv
    torch = None


@pytest.fixture(scope="module", params=["ref", "cpu"])
def ctx(request):
    c = kvattn.Context(request.param, num_threads=2)
    yield c
    c.close()


@pytest.fixture(params=["numpy", "torch"])
def conv(request):
    """How the test hands arrays to the package: as they are, or as torch tensors."""
    if request.param == "numpy":
        return lambda a: a
    if torch is None:
        pytest.skip("torch is not installed")
    return lambda a: None if a is None else torch.from_numpy(np.ascontiguousarray(a))


def qsl_of(q_lens):
    return np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)


def paged(ctx, seq_lens, b, h_kv, d, keys=None, dtype=np.float32, extra=2):
    """A cache holding each request's keys and values behind a shuffled block
    table: (cache, block_table, keys, values)."""
    nblk = [-(-int(s) // b) for s in seq_lens]
    total = sum(nblk) + extra
    perm = RNG.permutation(np.arange(1, total + 1)).astype(np.int32)
    bt = np.full((len(seq_lens), max(max(nblk), 1)), -1, np.int32)
    at = 0
    for r, n in enumerate(nblk):
        bt[r, :n] = perm[at: at + n]
        at += n
    cache = kvattn.Cache(ctx, total + 1, b, h_kv, d, dtype=dtype)
    if keys is None:
        keys = [RNG.standard_normal((s, h_kv, d)).astype(dtype) for s in seq_lens]
    values = [RNG.standard_normal(k.shape).astype(dtype) for k in keys]
    for r, s in enumerate(seq_lens):
        pos = np.arange(s)
        cache.write(keys[r], values[r], (bt[r, pos // b] * b + pos % b).astype(np.int64))
    return cache, bt, keys, values


def close(out, ref, tol):
    np.testing.assert_allclose(np.asarray(out, np.float64), ref, rtol=tol, atol=tol)


def tonp(x):
    return x.numpy() if torch is not None and isinstance(x, torch.Tensor) else x


# ---------------------------------------------------------------- struct layouts

STRUCTS = {"ContextDesc": "kva_context_desc", "CacheDesc": "kva_cache_desc",
           "QuantParams": "kva_quant_params", "PlanDesc": "kva_plan_desc",
           "PlanInfo": "kva_plan_info", "PoolDesc": "kva_pool_desc",
           "PoolStats": "kva_pool_stats", "PoolRequestInfo": "kva_pool_request_info",
           "C8Scales": "kva_c8_scales", "CudaCapacity": "kva_cuda_capacity"}


def header_fields(name):
    """The member names of C struct `name`, in order, from include/*.h."""
    for f in sorted(os.listdir(INCLUDE)):
        text = open(os.path.join(INCLUDE, f)).read()
        m = re.search(r"typedef struct %s \{(.*?)\} %s;" % (name, name), text, re.S)
        if m:
            body = re.sub(r"/\*.*?\*/|//[^\n]*", "", m.group(1), flags=re.S)
            return [re.search(r"(\w+)\s*$", decl.strip()).group(1)
                    for decl in body.split(";") if decl.strip()]
    raise AssertionError("struct %s is in no header of %s" % (name, INCLUDE))


def test_ctypes_structs_match_the_c_structs(tmp_path):
    """Each ctypes struct has the C struct's members in order (names from the
    headers: a member missing at the end, the classic silent bug, shows)
    and the C compiler's offsets and sizes."""
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if cc is None or not os.path.exists(os.path.join(INCLUDE, "kvattn.h")):
        pytest.skip("no C compiler or no include/ next to the tests")
    fields = {py: header_fields(c) for py, c in STRUCTS.items()}
    for py, names in fields.items():
        assert [f for f, _ in getattr(L, py)._fields_] == names, py
    lines = ['#include "kvattn.h"', '#include "kvattn_cuda.h"', "#include <stddef.h>",
             "#include <stdio.h>", "int main(void) {"]
    for py, c in STRUCTS.items():
        lines.append('printf("%s size %%zu\\n", sizeof(%s));' % (py, c))
        for f in fields[py]:
            lines.append('printf("%s %s %%zu\\n", offsetof(%s, %s));' % (py, f, c, f))
    lines += ["return 0;", "}"]
    src, exe = tmp_path / "layout.c", tmp_path / "layout"
    src.write_text("\n".join(lines) + "\n")
    subprocess.run([cc, "-I", INCLUDE, str(src), "-o", str(exe)], check=True)
    got = {}
    for line in subprocess.run([str(exe)], check=True, capture_output=True,
                               text=True).stdout.splitlines():
        py, f, n = line.split()
        got[(py, f)] = int(n)
    for py in STRUCTS:
        cls = getattr(L, py)
        assert got[(py, "size")] == ctypes.sizeof(cls), py
        for f in fields[py]:
            assert got[(py, f)] == getattr(cls, f).offset, (py, f)


# ---------------------------------------------------------------- local chunks

@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_chunk_matches_reference(ctx, conv, dtype):
    """Prefills that cross chunk edges, decodes deep into a long context, C
    not a multiple of B, with a window, sinks or ALiBi on top."""
    h, hkv, d, b = 4, 2, 32, 5
    for case, (chunk, window, q_lens, ctx_lens) in enumerate([
            (12, -1, [1, 7, 30, 3], [90, 5, 0, 40]),
            (8, 5, [1, 1, 17], [63, 64, 3]),
            (16, -1, [2, 40], [100, 0]),
            (1, -1, [3, 1], [4, 9])]):
        seq_lens = np.asarray(ctx_lens, np.int32) + np.asarray(q_lens, np.int32)
        cache, bt, keys, values = paged(ctx, seq_lens, b, hkv, d, dtype=dtype)
        qsl = qsl_of(q_lens)
        q = RNG.standard_normal((qsl[-1], h, d)).astype(dtype)
        sinks = RNG.standard_normal(h).astype(np.float32) if case == 1 else None
        alibi = np.linspace(0.05, 0.4, h).astype(np.float32) if case == 2 else None
        plan = kvattn.Plan(ctx, conv(qsl), conv(seq_lens), conv(bt), block_size=b, num_heads=h,
                           num_kv_heads=hkv, head_dim=d, q_dtype=dtype, window_left=window,
                           attention_chunk=chunk, alibi_slopes=alibi)
        out, lse = poisoned((qsl[-1], h, d), dtype), poisoned((qsl[-1], h))
        plan.run(q, cache, out=out, lse=lse, sinks=sinks)
        ro, rl = attention(q, keys, values, q_lens, causal=True, window_left=window,
                           alibi=alibi, sinks=sinks, chunk=chunk)
        tol = 2e-5 if dtype == np.float32 else 2e-3
        close(out, ro, tol)
        close(lse, rl, tol)
        if chunk > 1:  # the chunk changes what these rows see
            plain, _ = attention(q, keys, values, q_lens, causal=True, window_left=window,
                                 alibi=alibi, sinks=sinks)
            assert np.abs(plain - ro).max() > 10 * tol


def test_chunk_refused(ctx):
    kw = dict(block_size=4, num_heads=2, num_kv_heads=2, head_dim=16, q_dtype="f32")
    args = ([0, 1], [9], [[1, 2, 3]])
    with pytest.raises(kvattn.UnsupportedError, match="causal"):
        kvattn.Plan(ctx, *args, causal=False, attention_chunk=4, **kw)
    with pytest.raises(kvattn.InvalidArgumentError, match="negative"):
        kvattn.Plan(ctx, *args, attention_chunk=-4, **kw)
    with pytest.raises(kvattn.InvalidArgumentError, match="attention_chunk"):
        kvattn.Plan(ctx, *args, attention_chunk=2**32 + 4, **kw)  # not wrapped to 4
    with pytest.raises(kvattn.UnsupportedError):
        kvattn.Plan(ctx, *args, attention_chunk=4, tree=[-1], **kw)


def test_pool_drop_chunk_then_chunked_decode(ctx):
    """Pool.drop_chunk frees the blocks before the next token's chunk and puts
    the null block in their place; a chunked decode over that row, with the
    null block full of NaN, is the reference's."""
    b, c, n = 4, 16, 50
    pool = kvattn.Pool(64, b, enable_prefix_caching=False)
    rid, _ = pool.add_request(np.arange(n))
    pool.allocate(rid, n)
    pool.append_tokens(rid, np.arange(n))
    used = pool.stats()["num_used_blocks"]
    pool.drop_chunk(rid, c)  # next token 50: its chunk starts at 48, blocks 0..11 go
    pool.check()
    row = pool.block_table(rid)
    assert (row[:12] == 0).all() and (row[12:] > 0).all()
    assert pool.stats()["num_used_blocks"] == used - 12
    pool.allocate(rid, 1)
    row = pool.block_table(rid)
    with pytest.raises(kvattn.KvaError):  # dropped positions have no slots
        pool.slots(rid, 0, 1)
    cache = kvattn.Cache(ctx, 64, b, 1, 16, dtype="f32")
    cache.k_array()[0] = np.nan
    cache.v_array()[0] = np.nan
    k = RNG.standard_normal((n + 1, 1, 16)).astype(np.float32)
    v = RNG.standard_normal((n + 1, 1, 16)).astype(np.float32)
    cache.write(k[48:], v[48:], pool.slots(rid, 48, n + 1 - 48))
    plan = kvattn.Plan(ctx, [0, 1], [n + 1], row[None], block_size=b, num_heads=2,
                       num_kv_heads=1, head_dim=16, q_dtype="f32", attention_chunk=c)
    q = RNG.standard_normal((1, 2, 16)).astype(np.float32)
    out = plan.run(q, cache, out=poisoned((1, 2, 16)))
    close(out, attention(q, [k], [v], [1], causal=True, chunk=c)[0], 2e-5)
    with pytest.raises(kvattn.KvaError):
        pool.drop_chunk(rid, 0)
    with pytest.raises(kvattn.InvalidArgumentError):
        pool.drop_chunk(rid, 2**32 + 16)
    pool.check()


# ---------------------------------------------------------------- draft trees

def random_tree(q):
    return [-1] + [int(RNG.integers(-1, i)) for i in range(1, q)]


def packed_mask(trees):
    """FlashInfer's segment-packed tree mask, from the header's text: per
    request q x q bits row-major, bit i*q + k = query i sees tree token k,
    little bit order, each request on a new byte."""
    segs = []
    for par in trees:
        q = len(par)
        m = np.zeros((q, q), bool)
        for i in range(q):
            m[i, sorted(ancestors(par, i))] = True
        segs.append(np.packbits(m.reshape(-1), bitorder="little"))
    return np.concatenate(segs) if segs else np.empty(0, np.uint8)


def tree_batch(ctx, q_lens, ctx_lens, h=4, hkv=2, d=32, b=8):
    seq_lens = np.asarray(ctx_lens, np.int32) + np.asarray(q_lens, np.int32)
    cache, bt, keys, values = paged(ctx, seq_lens, b, hkv, d)
    qsl = qsl_of(q_lens)
    q = RNG.standard_normal((qsl[-1], h, d)).astype(np.float32)
    kw = dict(block_size=b, num_heads=h, num_kv_heads=hkv, head_dim=d, q_dtype="f32")
    return seq_lens, cache, bt, keys, values, qsl, q, kw


def test_tree_matches_reference(ctx, conv):
    """Random trees (and a chain, a star, a decode) given as a flat parent
    array, as one list per request and as the packed mask: all three the
    reference's, and bit for bit equal to each other."""
    q_lens = [5, 1, 9, 16, 3]
    trees = [random_tree(5), [-1], random_tree(9), list(range(-1, 15)), [-1, 0, 0]]
    seq_lens, cache, bt, keys, values, qsl, q, kw = tree_batch(ctx, q_lens, [20, 33, 0, 7, 64])
    sinks = RNG.standard_normal(4).astype(np.float32)
    ro, rl = attention(q, keys, values, q_lens, causal=True, sinks=sinks, trees=trees)
    flat = np.concatenate(trees).astype(np.int32)
    outs = []
    for form in ({"tree": conv(flat)}, {"tree": [conv(np.asarray(t, np.int32)) for t in trees]},
                 {"tree": [list(t) for t in trees]}, {"tree_mask": conv(packed_mask(trees))},
                 {"tree_mask": bytes(packed_mask(trees))}):
        plan = kvattn.Plan(ctx, qsl, seq_lens, bt, **kw, **form)
        out, lse = poisoned(ro.shape), poisoned(rl.shape)
        plan.run(q, cache, out=out, lse=lse, sinks=sinks)
        close(out, ro, 2e-5)
        close(lse, rl, 2e-5)
        outs.append(out)
    for o in outs[1:]:
        np.testing.assert_array_equal(o, outs[0])
    plain, _ = attention(q, keys, values, q_lens, causal=True, sinks=sinks)
    assert np.abs(plain - ro).max() > 1e-3  # the trees change what rows see


def test_tree_update_and_shared_template(ctx):
    """update() takes the new step's tree (and none means none), and a plan
    of the same shape made after a tree plan is no tree plan (the context's
    shared descriptor template keeps no tree pointer)."""
    q_lens = [4, 6]
    trees = [[-1, -1, 1, 1], [-1, 0, 0, 2, 2, 4]]
    seq_lens, cache, bt, keys, values, qsl, q, kw = tree_batch(ctx, q_lens, [10, 3])
    plan = kvattn.Plan(ctx, qsl, seq_lens, bt, **kw, tree=trees)
    other = kvattn.Plan(ctx, qsl, seq_lens, bt, **kw)  # same template, no tree
    close(other.run(q, cache, out=poisoned(q.shape)),
          attention(q, keys, values, q_lens, causal=True)[0], 2e-5)
    trees2 = [[-1, 0, 1, 0], [-1, -1, -1, 0, 1, 2]]
    plan.update(qsl, seq_lens, bt, tree_mask=packed_mask(trees2))
    close(plan.run(q, cache, out=poisoned(q.shape)),
          attention(q, keys, values, q_lens, causal=True, trees=trees2)[0], 2e-5)
    plan.update(qsl, seq_lens, bt)
    close(plan.run(q, cache, out=poisoned(q.shape)),
          attention(q, keys, values, q_lens, causal=True)[0], 2e-5)
    with pytest.raises(kvattn.InvalidArgumentError, match="tree_parents"):
        plan.update(qsl, seq_lens, bt, tree=[[-1, 0, 5, 0], [-1] * 6])  # parent after child
    close(plan.run(q, cache, out=poisoned(q.shape)),  # unchanged by the failed update
          attention(q, keys, values, q_lens, causal=True)[0], 2e-5)


def test_tree_refused(ctx):
    seq_lens, cache, bt, keys, values, qsl, q, kw = tree_batch(ctx, [3, 2], [5, 5])
    bad = [
        (kvattn.ShapeMismatchError, "tree", dict(tree=[-1, 0, 1, -1])),  # 4 of 5 tokens
        (kvattn.ShapeMismatchError, r"tree\[1\]", dict(tree=[[-1, 0, 1], [-1]])),
        (kvattn.ShapeMismatchError, "per-request", dict(tree=[[-1, 0, 1]])),
        (kvattn.InvalidArgumentError, "tree_parents", dict(tree=[-1, 0, 2, -1, 0])),
        (kvattn.InvalidArgumentError, "tree_parents", dict(tree=[-1, 0, 1, -2, 0])),
        (kvattn.ShapeMismatchError, "tree_mask", dict(tree_mask=packed_mask([[-1, 0, 1]]))),
        (kvattn.InvalidArgumentError, "boolean", dict(tree_mask=np.ones(3, bool))),
        (kvattn.InvalidArgumentError, "both", dict(tree=[-1, 0, 1, -1, 0],
                                                   tree_mask=packed_mask([[-1, 0, 1], [-1, 0]]))),
        (kvattn.UnsupportedError, "window", dict(tree=[-1, 0, 1, -1, 0], window_left=3)),
        (kvattn.UnsupportedError, "causal", dict(tree=[-1, 0, 1, -1, 0], causal=False)),
        (kvattn.InvalidArgumentError, "tree", dict(tree=[-1, 0, 1, -1, 2**32])),
    ]
    m = packed_mask([[-1, 0, 1], [-1, 0]])
    m_above = m.copy()
    m_above[0] |= 1 << 1  # row 0 of request 0 sees token 1
    m_nodiag = m.copy()
    m_nodiag[0] &= 0xFE
    bad += [(kvattn.InvalidArgumentError, "above|after", dict(tree_mask=m_above)),
            (kvattn.InvalidArgumentError, "diagonal", dict(tree_mask=m_nodiag))]
    for exc, msg, extra in bad:
        with pytest.raises(exc, match=msg):
            kvattn.Plan(ctx, qsl, seq_lens, bt, **dict(kw, **extra))
    big = kvattn.Plan(ctx, [0, 64], [64], [list(range(1, 9))], **kw, tree=random_tree(64))
    assert big.info.max_q_len == 64
    with pytest.raises(kvattn.UnsupportedError, match="64"):
        kvattn.Plan(ctx, [0, 65], [65], [list(range(1, 10))], **kw, tree=random_tree(65))
    with pytest.raises(kvattn.InvalidArgumentError, match="need cascade_group"):
        kvattn.Plan(ctx, qsl, seq_lens, bt, **kw, cascade_prefix_len=[8])


# ---------------------------------------------------------------- cascade

def shared_prefix_batch(ctx, b=4, h=8, hkv=2, d=32):
    """Four decodes and a spec decode: requests 0-3 share 6 blocks, of which
    0 and 1 share 3 more; request 4 shares nothing."""
    q_lens, own = [1, 1, 1, 2, 3], [5, 9, 3, 7, 20]
    shared = [9, 9, 6, 6, 0]
    base = RNG.standard_normal((9 * b, hkv, d)).astype(np.float32)
    keys = [np.concatenate([base[: s * b], RNG.standard_normal((o, hkv, d)).astype(np.float32)])
            for s, o in zip(shared, own)]
    seq_lens = np.asarray([k.shape[0] for k in keys], np.int32)
    cache, bt, keys, values = paged(ctx, seq_lens, b, hkv, d, keys=keys)
    vbase = values[0][: 9 * b]
    for r, s in enumerate(shared):  # the shared blocks' ids and values
        bt[r, :s] = bt[0, :s]
        values[r][: s * b] = vbase[: s * b]
    for r in range(len(q_lens)):
        pos = np.arange(seq_lens[r])
        cache.write(keys[r], values[r], (bt[r, pos // b] * b + pos % b).astype(np.int64))
    qsl = qsl_of(q_lens)
    q = RNG.standard_normal((qsl[-1], h, d)).astype(np.float32)
    kw = dict(block_size=b, num_heads=h, num_kv_heads=hkv, head_dim=d, q_dtype="f32")
    ro, rl = attention(q, keys, values, q_lens, causal=True)
    return seq_lens, cache, bt, qsl, q, kw, ro, rl


def test_cascade_matches_reference(ctx, conv):
    seq_lens, cache, bt, qsl, q, kw, ro, rl = shared_prefix_batch(ctx)
    grouped = [
        (dict(cascade="off"), 0),
        (dict(cascade=False), 0),
        (dict(cascade="on"), None),  # found: nested, so at least the top group
        (dict(cascade=True, cascade_group=conv(np.int32([0, 0, 0, 0, -1])),
              cascade_prefix_len=conv(np.int32([24]))), 1),
        (dict(cascade=2, cascade_group=[1, 1, 0, 0, -1], cascade_prefix_len=[24, 36],
              cascade_parent=[-1, 0]), 2),
        (dict(cascade="off", cascade_group=[0, 0, -1, -1, -1], cascade_prefix_len=[36]), 0),
    ]
    for extra, groups in grouped:
        plan = kvattn.Plan(ctx, conv(qsl), conv(seq_lens), conv(bt), **kw, **extra)
        info = plan.info
        if groups is None:
            assert info.num_cascade_groups >= 1
        else:
            assert info.num_cascade_groups == groups, extra
        if info.num_cascade_groups:
            assert info.cascade_rows >= 4 and info.cascade_chunks >= 1
        out, lse = poisoned(ro.shape), poisoned(rl.shape)
        plan.run(q, cache, out=out, lse=lse)
        close(out, ro, 2e-5)
        close(lse, rl, 2e-5)
    auto = kvattn.Plan(ctx, qsl, seq_lens, bt, **kw)  # "auto": whatever pays, same result
    close(auto.run(q, cache, out=poisoned(ro.shape)), ro, 2e-5)


def test_cascade_refused(ctx):
    seq_lens, cache, bt, qsl, q, kw, ro, rl = shared_prefix_batch(ctx)
    bad = [
        (kvattn.InvalidArgumentError, "cascade", dict(cascade="maybe")),
        (kvattn.ShapeMismatchError, "cascade_group", dict(cascade_group=[0, 0],
                                                          cascade_prefix_len=[24])),
        (kvattn.ShapeMismatchError, "cascade_parent", dict(
            cascade_group=[0, 0, 0, 0, -1], cascade_prefix_len=[24], cascade_parent=[-1, 0])),
        (kvattn.InvalidArgumentError, "cascade_group", dict(cascade_parent=[-1])),
        (kvattn.KvaError, None, dict(cascade="on", cascade_group=[0, 0, 0, 0, 0],
                                   cascade_prefix_len=[24])),  # request 4 does not share
        (kvattn.KvaError, None, dict(cascade="on", cascade_group=[0, 0, -1, -1, -1],
                                   cascade_prefix_len=[40])),  # past their shared blocks
        (kvattn.UnsupportedError, "window", dict(cascade="on", window_left=8)),
    ]
    for exc, msg, extra in bad:
        with pytest.raises(exc, match=msg):
            kvattn.Plan(ctx, qsl, seq_lens, bt, **dict(kw, **extra))
    # A cascade plan runs on the context that made it only: another context's
    # run is refused, the output untouched (the other context has reserved the
    # plain plan's workspace, which would run there).
    plan = kvattn.Plan(ctx, qsl, seq_lens, bt, **kw, cascade="on")
    assert plan.info.num_cascade_groups >= 1
    other = kvattn.Context(ctx.backend, num_threads=2)
    kvattn.Plan(other, qsl, seq_lens, bt, **kw, cascade="off").run(q, cache, ctx=other)
    out = poisoned(ro.shape)
    with pytest.raises(kvattn.InvalidArgumentError, match="cascade"):
        plan.run(q, cache, out=out, ctx=other)
    assert untouched(out)
    other.close()


# ---------------------------------------------------------------- decode context parallelism

def local_positions(s, n, rank, il):
    j = np.arange(s)
    return j[(j // il) % n == rank]


def test_dcp_helpers(conv):
    """dcp_local_lens and dcp_slots against the header's formulas."""
    for n, il in [(2, 1), (3, 2), (4, 4), (1, 1)]:
        sl = np.int32([0, 1, 7, 16, 33])
        for rank in range(n):
            want = [len(local_positions(s, n, rank, il)) for s in sl]
            np.testing.assert_array_equal(kvattn.dcp_local_lens(conv(sl), n, rank, il), want)
            row = RNG.permutation(np.arange(1, 20)).astype(np.int32)[:9]
            first, count = 5, 20
            slots = kvattn.dcp_slots(conv(row), first, count, dcp_size=n, dcp_rank=rank,
                                     block_size=3, dcp_interleave=il)
            for t, pos in enumerate(range(first, first + count)):
                if (pos // il) % n != rank:
                    assert slots[t] == -1
                else:  # local token k: the rank's positions before pos
                    k = len(local_positions(pos, n, rank, il))
                    assert slots[t] == row[k // 3] * 3 + k % 3
    inplace = np.int32([5, 9])
    assert kvattn.dcp_local_lens(inplace, 2, 1, 2, out=inplace) is inplace
    np.testing.assert_array_equal(inplace, [2, 4])


def test_dcp_helpers_refused():
    out = np.full(6, 7, np.int64)
    with pytest.raises(kvattn.OutOfRangeError):  # local token 2 needs row[1]
        kvattn.dcp_slots([3], 0, 6, dcp_size=2, dcp_rank=0, block_size=2, out=out)
    assert (out == 7).all()
    lens = np.full(2, 7, np.int32)
    for n, rank, il in [(2, 2, 1), (2, -1, 1), (300, 0, 1), (2, 0, -1)]:
        with pytest.raises(kvattn.InvalidArgumentError):
            kvattn.dcp_local_lens([5, 6], n, rank, il, out=lens)
        assert (lens == 7).all()
    with pytest.raises(kvattn.InvalidArgumentError):
        kvattn.dcp_local_lens([5, 6], 2**32 + 2, 0)
    with pytest.raises(kvattn.ShapeMismatchError):
        kvattn.dcp_local_lens([5, 6], 2, 0, out=np.zeros(3, np.int32))


@pytest.mark.parametrize("n,il", [(2, 1), (3, 2), (4, 3)])
def test_dcp_ranks_and_combine(ctx, conv, n, il):
    """Each rank's plan over its own cache (written through dcp_slots) gives the
    reference's partial for its keys (global masks: causal prefill, a chunk,
    sinks on rank 0 only); merge_states_n of the N partials is the unsharded
    result. The same through run_ragged with the rank's local K/V rows."""
    h, hkv, d, b = 4, 2, 16, 4
    q_lens, ctx_lens = [1, 1, 6, 2], [40, 3, 17, 0]
    seq_lens = np.int32(ctx_lens) + np.int32(q_lens)
    qsl = qsl_of(q_lens)
    keys = [RNG.standard_normal((s, hkv, d)).astype(np.float32) for s in seq_lens]
    values = [RNG.standard_normal((s, hkv, d)).astype(np.float32) for s in seq_lens]
    q = RNG.standard_normal((qsl[-1], h, d)).astype(np.float32)
    sinks = RNG.standard_normal(h).astype(np.float32)
    for chunk in (0, 8):
        ro, rl = attention(q, keys, values, q_lens, causal=True, sinks=sinks, chunk=chunk)
        outs, lses = poisoned((n,) + ro.shape), poisoned((n,) + rl.shape)
        for rank in range(n):
            local = kvattn.dcp_local_lens(seq_lens, n, rank, il)
            nblk = [max(-(-int(x) // b), 1) for x in local]
            bt = np.zeros((len(q_lens), max(nblk)), np.int32)
            bt_ids = RNG.permutation(np.arange(1, sum(nblk) + 1)).astype(np.int32)
            at = 0
            for r, m in enumerate(nblk):
                bt[r, :m] = bt_ids[at: at + m]
                at += m
            cache = kvattn.Cache(ctx, sum(nblk) + 1, b, hkv, d, dtype="f32")
            for r, s in enumerate(seq_lens):  # every rank is given all rows, keeps its own
                cache.write(keys[r], values[r],
                            kvattn.dcp_slots(bt[r], 0, int(s), dcp_size=n, dcp_rank=rank,
                                             block_size=b, dcp_interleave=il))
            kw = dict(block_size=b, num_heads=h, num_kv_heads=hkv, head_dim=d, q_dtype="f32",
                      attention_chunk=chunk, dcp_size=n, dcp_rank=rank, dcp_interleave=il)
            plan = kvattn.Plan(ctx, conv(qsl), conv(seq_lens), conv(bt), **kw)
            plan.run(q, cache, out=outs[rank], lse=lses[rank], sinks=sinks)
            po, pl = attention(q, keys, values, q_lens, causal=True, sinks=sinks, chunk=chunk,
                               dcp=(n, rank, il))
            close(outs[rank], po, 2e-5)
            close(lses[rank], pl, 2e-5)
            # Ragged: the rank's own rows of each request, in position order.
            rp = kvattn.Plan(ctx, qsl, seq_lens, None, **kw)
            assert rp.kv_len_total == int(local.sum())
            lk = np.concatenate([k[local_positions(s, n, rank, il)]
                                 for k, s in zip(keys, seq_lens)])
            lv = np.concatenate([v[local_positions(s, n, rank, il)]
                                 for v, s in zip(values, seq_lens)])
            ragged = rp.run_ragged(q, lk, lv, out=poisoned(ro.shape), sinks=sinks)
            close(ragged, po, 2e-5)
            full = np.concatenate([k for k in keys])  # the global rows: refused, not read
            bad = poisoned(ro.shape)
            with pytest.raises(kvattn.ShapeMismatchError):
                rp.run_ragged(q, full, full, out=bad)
            assert untouched(bad)
        out, lse = kvattn.merge_states_n(conv(outs), conv(lses))
        close(tonp(out), ro, 2e-5)
        close(tonp(lse), rl, 2e-5)


def test_dcp_plan_refused(ctx):
    kw = dict(block_size=4, num_heads=2, num_kv_heads=2, head_dim=16, q_dtype="f32")
    args = ([0, 1], [9], [[1, 2]])
    for extra in (dict(dcp_size=2, dcp_rank=2), dict(dcp_size=2, dcp_rank=-1),
                  dict(dcp_size=257), dict(dcp_size=2, dcp_interleave=-1)):
        with pytest.raises(kvattn.InvalidArgumentError, match="dcp"):
            kvattn.Plan(ctx, *args, **kw, **extra)
    with pytest.raises(kvattn.OutOfRangeError):  # rank 0 of 2 holds 5 tokens: 2 blocks
        kvattn.Plan(ctx, [0, 1], [9], [[1]], **kw, dcp_size=2)
    with pytest.raises(kvattn.UnsupportedError):
        kvattn.Plan(ctx, *args, **kw, dcp_size=2, tree=[-1])


# ---------------------------------------------------------------- merge_states_n

def merge_ref(outs, lses):
    m = lses.max(0)
    m = np.where(np.isfinite(m), m, 0.0)
    w = np.exp(lses - m)
    den = w.sum(0)
    out = np.where(den[..., None] > 0, (w[..., None] * outs).sum(0) / np.where(
        den > 0, den, 1)[..., None], 0.0)
    return out, np.log(den) + m


def test_merge_states_n_packed_parts(ctx):
    """Parts at a stride (packed [out | lse] blocks, as a collective leaves
    them), a part of -inf lse that is not read, P = 1."""
    p, t, h, dv = 3, 5, 4, 8
    buf = RNG.standard_normal((p, t * h * dv + t * h)).astype(np.float32)
    outs = buf[:, : t * h * dv].reshape(p, t, h, dv)
    lses = buf[:, t * h * dv:].reshape(p, t, h)
    lses[1, 2] = -np.inf
    outs[1, 2] = np.nan  # a -inf part's rows are not read
    out, lse = kvattn.merge_states_n(outs, lses, out=poisoned((t, h, dv)),
                                     lse=poisoned((t, h)), ctx=ctx)
    ro, rl = merge_ref(np.where(np.isnan(outs), 0, outs).astype(np.float64), lses)
    close(out, ro, 1e-5)
    close(lse, rl, 1e-5)
    o1, l1 = kvattn.merge_states_n(outs[:1], lses[:1], ctx=ctx)
    close(o1, outs[0], 1e-6)
    close(l1, lses[0], 1e-6)
    o16, _ = kvattn.merge_states_n(outs.astype(np.float16), lses, ctx=ctx)
    close(o16, ro, 2e-3)


def test_merge_states_n_refused(ctx):
    p, t, h, dv = 2, 3, 2, 8
    outs = RNG.standard_normal((p, t, h, dv)).astype(np.float32)
    lses = RNG.standard_normal((p, t, h)).astype(np.float32)
    out, lse = poisoned((t, h, dv)), poisoned((t, h))
    bad = [
        (kvattn.InvalidArgumentError, "stride", (np.broadcast_to(outs[:1], outs.shape), lses)),
        (kvattn.InvalidArgumentError, "stride", (outs[::-1], lses)),
        (kvattn.InvalidArgumentError, "contiguous", (outs.transpose(0, 1, 3, 2).copy()
                                                     .transpose(0, 1, 3, 2), lses)),
        (kvattn.ShapeMismatchError, "lses", (outs, lses[:, :2])),
        (kvattn.ShapeMismatchError, "outs", (outs[0], lses)),
        (kvattn.ShapeMismatchError, "parts", (outs[:0], lses[:0])),
        (kvattn.DtypeMismatchError, "lses", (outs, lses.astype(np.float16))),
        (kvattn.DtypeMismatchError, "outs", (outs.astype(np.float64), lses)),
    ]
    for exc, msg, (o, l_) in bad:
        with pytest.raises(exc, match=msg):
            kvattn.merge_states_n(o, l_, out=out, lse=lse, ctx=ctx)
        assert untouched(out) and untouched(lse)
    with pytest.raises(kvattn.InvalidArgumentError):  # lse inside the inputs
        kvattn.merge_states_n(outs, lses, out=out, lse=lses[0], ctx=ctx)
    assert untouched(out)
    with pytest.raises(kvattn.ShapeMismatchError):
        kvattn.merge_states_n(outs, lses, out=poisoned((t, h, dv + 8)), lse=lse, ctx=ctx)
    assert untouched(lse)
