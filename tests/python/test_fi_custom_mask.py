"""kvattn.flashinfer's BatchPrefillWithPagedKVCacheWrapper.plan() with
FlashInfer's custom_mask / packed_custom_mask as SGLang's EAGLE tree verify
gives it: per request q draft tokens over kv = context + draft keys, each
draft token seeing the whole context and, among the drafts, itself and its
ancestors. Results against a float64 reference that applies the boolean mask
itself (not kvattn's tree code), both mask forms, NHD / HND; masks that are
not draft-tree masks raise and leave the previous plan working."""

import numpy as np
import pytest

import kvattn
from kvattn import flashinfer as fi
import poison
from test_flashinfer import LOG2E, random_paged


def masked_attention(q, keys, values, masks, scale):
    """q [T, H, D]; keys[r] [s, Hkv, D], values[r] [s, Hkv, Dv]; masks[r]
    bool [q_r, s] (True: the query row sees the key). float64 out [T, H, Dv]
    and natural-log lse [T, H]; a row seeing no key is 0 with lse -inf."""
    t_all, h, _ = q.shape
    out = np.zeros((t_all, h, values[0].shape[2]))
    lse = np.full((t_all, h), -np.inf)
    t0 = 0
    for k, v, m in zip(keys, values, masks):
        k, v = np.asarray(k, np.float64), np.asarray(v, np.float64)
        group = h // k.shape[1]
        for i in range(m.shape[0]):
            for hh in range(h):
                sc = (k[m[i], hh // group] @ q[t0 + i, hh].astype(np.float64)) * scale
                if sc.size:
                    mx = sc.max()
                    e = np.exp(sc - mx)
                    out[t0 + i, hh] = (e / e.sum()) @ v[m[i], hh // group]
                    lse[t0 + i, hh] = mx + np.log(e.sum())
        t0 += m.shape[0]
    return out, lse


def tree_mask(rng, q, s, shape="random"):
    """A draft-tree verification mask [q, s] for a random tree in topological
    order (parent of i: a random earlier token, or -1 for a root hanging off
    the context), built from the ancestor chains directly."""
    par = [-1] + [int(rng.integers(-1, i)) for i in range(1, q)]
    if shape == "chain":
        par = list(range(-1, q - 1))
    m = np.zeros((q, s), bool)
    m[:, : s - q] = True
    for i in range(q):
        j = i
        while j >= 0:
            m[i, s - q + j] = True
            j = par[j]
    return m


def segment_packed(masks):
    """FlashInfer's segment_packbits(..., bitorder="little") of the flat
    masks: each request's bits on new bytes."""
    return np.concatenate([np.packbits(m.reshape(-1), bitorder="little") for m in masks]
                          + [np.empty(0, np.uint8)])


def batch(rng, q_lens, ctx_lens, layout, dtype=np.float32, page_size=8, h=4, hkv=2, d=32):
    kv_lens = [c + ql for c, ql in zip(ctx_lens, q_lens)]
    paged, indptr, indices, last, keys, values = random_paged(rng, kv_lens, page_size, hkv, d,
                                                              layout, dtype, False)
    qo = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    q = rng.standard_normal((int(qo[-1]), h, d)).astype(dtype)
    return dict(paged=paged, indptr=indptr, indices=indices, last=last, keys=keys,
                values=values, qo=qo, q=q, kv_lens=kv_lens, args=(h, hkv, d, page_size))


def plan(w, b, dtype=np.float32, **kw):
    w.plan(b["qo"], b["indptr"], b["indices"], b["last"], *b["args"], q_data_type=dtype, **kw)


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("form", ["custom_mask", "packed_custom_mask", "torch"])
@pytest.mark.parametrize("seed", range(3))
def test_tree_verify_matches_masked_reference(layout, form, seed):
    rng = np.random.default_rng(100 + seed)
    r = int(rng.integers(2, 6))
    q_lens = [int(x) for x in rng.integers(1, 17, r)]
    q_lens[0] = 64 if seed == 2 else q_lens[0]  # KVA_MAX_TREE_TOKENS
    ctx_lens = [int(x) for x in rng.integers(0, 60, r)]
    b = batch(rng, q_lens, ctx_lens, layout)
    masks = [tree_mask(rng, ql, s, "chain" if i == 1 else "random")
             for i, (ql, s) in enumerate(zip(q_lens, b["kv_lens"]))]
    flat = np.concatenate([m.reshape(-1) for m in masks])
    if form == "custom_mask":
        kw = dict(custom_mask=flat)
    elif form == "packed_custom_mask":
        kw = dict(packed_custom_mask=segment_packed(masks))
    else:
        torch = pytest.importorskip("torch")
        kw = dict(custom_mask=torch.from_numpy(flat))
    w = fi.BatchPrefillWithPagedKVCacheWrapper(None, layout)
    plan(w, b, causal=bool(seed % 2), **kw)  # causal is ignored under a custom mask
    out = poison.poisoned(b["q"].shape)
    lse = poison.poisoned(b["q"].shape[:2])
    w.run(b["q"], b["paged"], out=out, lse=lse)
    ro, rl = masked_attention(b["q"], b["keys"], b["values"], masks, 1.0 / np.sqrt(32))
    np.testing.assert_allclose(out, ro, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(lse, rl * LOG2E, rtol=1e-5, atol=1e-4)
    # The mask matters: the same batch without it differs.
    w2 = fi.BatchPrefillWithPagedKVCacheWrapper(None, layout)
    plan(w2, b, causal=True)
    assert np.abs(w2.run(b["q"], b["paged"]) - ro).max() > 1e-3


def test_tree_verify_f16_and_empty_request():
    rng = np.random.default_rng(7)
    q_lens, ctx_lens = [5, 0, 3], [9, 4, 0]
    b = batch(rng, q_lens, ctx_lens, "NHD", np.float16)
    masks = [tree_mask(rng, ql, s) for ql, s in zip(q_lens, b["kv_lens"])]
    w = fi.BatchPrefillWithPagedKVCacheWrapper(None, "NHD")
    plan(w, b, np.float16, custom_mask=np.concatenate([m.reshape(-1) for m in masks]))
    out = w.run(b["q"], b["paged"])
    ro, _ = masked_attention(b["q"], b["keys"], b["values"], masks, 1.0 / np.sqrt(32))
    np.testing.assert_allclose(out.astype(np.float64), ro, rtol=1e-3, atol=1e-3)


def refused_cases():
    """(name, q_lens, ctx_lens, mask edit, exception, match): masks kvattn
    cannot express, and masks of the wrong size."""
    def non_tree(ms):  # row 2 sees token 0 but not its parent 1 (a DAG, not a chain)
        m, c = ms[0], ms[0].shape[1] - ms[0].shape[0]
        m[1, c:] = [1, 1, 0, 0]
        m[2, c:] = [1, 0, 1, 0]
        m[3, c:] = [1, 1, 1, 1]  # sees 0, 1 and 2: 2's chain lacks 1

    def hide_ctx(ms):
        ms[1][2, 3] = False

    def hide_self(ms):
        ms[0][1, ms[0].shape[1] - 3] = False

    def later(ms):
        m, c = ms[0], ms[0].shape[1] - ms[0].shape[0]
        m[0, c + 2] = True

    return [("non-tree block", [4, 3], [5, 6], non_tree, kvattn.UnsupportedError, "ancestor"),
            ("context key hidden", [4, 3], [5, 6], hide_ctx, kvattn.UnsupportedError,
             "request 1, query row 2 hides context key 3"),
            ("no diagonal", [4, 3], [5, 6], hide_self, kvattn.UnsupportedError, "itself"),
            ("sees a later draft", [4, 3], [5, 6], later, kvattn.UnsupportedError, "later"),
            ("too many tokens", [65, 2], [3, 4], None, kvattn.UnsupportedError, "at most 64")]


@pytest.mark.parametrize("form", ["custom_mask", "packed_custom_mask"])
def test_refused_masks_leave_previous_plan(form):
    rng = np.random.default_rng(11)
    for name, q_lens, ctx_lens, edit, exc, match in refused_cases():
        b0 = batch(rng, [2, 3], [7, 1], "NHD")  # the plan that must stand
        m0 = [tree_mask(rng, ql, s) for ql, s in zip([2, 3], b0["kv_lens"])]
        w = fi.BatchPrefillWithPagedKVCacheWrapper(None, "NHD")
        plan(w, b0, custom_mask=np.concatenate([m.reshape(-1) for m in m0]))
        want = w.run(b0["q"], b0["paged"])
        b = batch(rng, q_lens, ctx_lens, "NHD")
        masks = [tree_mask(rng, ql, s, "chain") for ql, s in zip(q_lens, b["kv_lens"])]
        if edit is not None:
            edit(masks)
        kw = ({"custom_mask": np.concatenate([m.reshape(-1) for m in masks])}
              if form == "custom_mask" else {"packed_custom_mask": segment_packed(masks)})
        with pytest.raises(exc, match=match):
            plan(w, b, **kw)
        out = poison.poisoned(b0["q"].shape)
        w.run(b0["q"], b0["paged"], out=out)
        np.testing.assert_array_equal(out, want, err_msg=name)


def test_refused_sizes_and_options():
    rng = np.random.default_rng(12)
    b = batch(rng, [3, 1], [0, 2], "NHD")  # 9 + 3 mask bits: 2 + 1 bytes segment-packed
    masks = [tree_mask(rng, ql, s) for ql, s in zip([3, 1], b["kv_lens"])]
    flat = np.concatenate([m.reshape(-1) for m in masks])
    w = fi.BatchPrefillWithPagedKVCacheWrapper(None, "NHD")
    plan(w, b, custom_mask=flat)
    want = w.run(b["q"], b["paged"])
    with pytest.raises(kvattn.ShapeMismatchError, match="custom_mask"):
        plan(w, b, custom_mask=flat[:-1])
    packed = segment_packed(masks)
    # One packed run over both requests (FlashInfer's packbits, no per-request
    # byte start, 2 bytes here) is not segment_packbits' layout.
    with pytest.raises(kvattn.ShapeMismatchError, match="segment_packbits"):
        plan(w, b, packed_custom_mask=np.packbits(flat, bitorder="little"))
    with pytest.raises(kvattn.ShapeMismatchError, match="uint8"):
        plan(w, b, packed_custom_mask=flat)
    with pytest.raises(kvattn.UnsupportedError):  # a window with a tree (C refuses it)
        plan(w, b, custom_mask=flat, window_left=3)
    with pytest.raises(kvattn.UnsupportedError):  # ALiBi with a tree
        plan(w, b, custom_mask=flat, pos_encoding_mode="ALIBI")
    with pytest.raises(kvattn.UnsupportedError, match="CUDA-graph"):
        g = fi.BatchPrefillWithPagedKVCacheWrapper(
            None, "NHD", use_cuda_graph=True, qo_indptr_buf=np.zeros(3, np.int32),
            paged_kv_indptr_buf=np.zeros(3, np.int32),
            paged_kv_indices_buf=np.zeros(len(b["indices"]), np.int32),
            paged_kv_last_page_len_buf=np.zeros(2, np.int32))
        plan(g, b, custom_mask=flat)
    np.testing.assert_array_equal(w.run(b["q"], b["paged"]), want)
    # FlashInfer's forward() replans with its causal (ignored under the mask).
    np.testing.assert_array_equal(w.forward(b["q"], b["paged"], causal=False), want)
    # packed_custom_mask wins over custom_mask, as in FlashInfer.
    plan(w, b, custom_mask=~flat, packed_custom_mask=packed)
    np.testing.assert_array_equal(w.run(b["q"], b["paged"]), want)
