"""FlashInfer's custom attention mask (plan()'s custom_mask /
packed_custom_mask) decoded into kvattn's draft trees (docs/masks.md).

FlashInfer's mask holds, per request with q query rows and s keys, q x s
booleans row-major (element i * s + j: query i sees key j), the requests one
after the other; packed_custom_mask is the same bits packed with
bitorder="little" (element e is bit e % 8 of byte e / 8), each request
starting on a new byte, as flashinfer.segment_packbits lays them out (the
packing FlashInfer's plan() applies to a custom_mask). kvattn runs the masks
of draft-tree verification (SGLang's EAGLE tree verify): every query row sees
the request's first s - q keys (the committed context), and among the last q
keys (the draft tokens, in topological order) itself and its ancestors. Any
other mask is refused with UnsupportedError naming the request, row and key
that kvattn cannot express."""

import numpy as np

from . import _lib as L
from . import _tensor as T
from ._errors import InvalidArgumentError, ShapeMismatchError, UnsupportedError


def _bits(custom_mask, packed_custom_mask, q_lens, kv_lens):
    """Each request's mask as a bool [q, s] array (a list), from either form;
    packed_custom_mask wins where both are given, as in FlashInfer."""
    sizes = q_lens * kv_lens
    if packed_custom_mask is not None:
        if "bool" in str(getattr(packed_custom_mask, "dtype", "")):
            raise ShapeMismatchError(
                "packed_custom_mask: packed bits (uint8) expected, got a boolean array (give it "
                "as custom_mask, or pack it with flashinfer.segment_packbits(..., "
                "bitorder='little'))")
        pm = T.host_array(packed_custom_mask, np.uint8, "packed_custom_mask").reshape(-1)
        nbytes = (sizes + 7) // 8
        if pm.shape[0] != int(nbytes.sum()):
            raise ShapeMismatchError(
                "packed_custom_mask: %d bytes, expected %d: ceil(q_len * kv_len / 8) bytes per "
                "request, each request on a new byte (segment_packbits' layout)"
                % (pm.shape[0], int(nbytes.sum())))
        starts = np.concatenate([[0], np.cumsum(nbytes)])
        return [np.unpackbits(pm[starts[r]: starts[r + 1]], bitorder="little")[: sizes[r]]
                .astype(bool).reshape(int(q_lens[r]), int(kv_lens[r]))
                for r in range(q_lens.shape[0])]
    m = T.host_array(custom_mask, np.bool_, "custom_mask").reshape(-1)
    if m.shape[0] != int(sizes.sum()):
        raise ShapeMismatchError("custom_mask: %d elements, expected sum(q_len * kv_len) = %d"
                                 % (m.shape[0], int(sizes.sum())))
    starts = np.concatenate([[0], np.cumsum(sizes)])
    return [m[starts[r]: starts[r + 1]].reshape(int(q_lens[r]), int(kv_lens[r]))
            for r in range(q_lens.shape[0])]


def _tree_parents(r, m):
    """Request r's draft-tree parents (q int32, -1 a root) from its bool
    [q, s] mask, or UnsupportedError where the mask is not a tree mask."""
    q, s = m.shape
    if q == 0:
        return np.empty(0, np.int32)
    if q > L.MAX_TREE_TOKENS:
        raise UnsupportedError("custom_mask: request %d has %d query rows; kvattn's tree masks "
                               "take at most %d (KVA_MAX_TREE_TOKENS)"
                               % (r, q, L.MAX_TREE_TOKENS))
    if s < q:
        raise UnsupportedError("custom_mask: request %d has %d query rows over %d keys; kvattn's "
                               "tree masks put the q draft tokens at the last q keys"
                               % (r, q, s))
    c = s - q
    hidden = np.argwhere(~m[:, :c])
    if hidden.size:
        i, j = hidden[0]
        raise UnsupportedError("custom_mask: request %d, query row %d hides context key %d of %d; "
                               "kvattn's tree masks show every draft token the whole context "
                               "(the first kv_len - q_len keys)" % (r, i, j, c))
    t = m[:, c:]
    # parent(i) = the last earlier draft token that row i sees (-1: none).
    low = np.tril(t, -1)
    parents = np.where(low.any(1), q - 1 - np.argmax(low[:, ::-1], 1), -1).astype(np.int32)
    # A tree row is {i} + its parent's row; parents come first, so this check
    # row by row makes every row exactly its ancestor chain.
    want = np.eye(q, dtype=bool)
    has = parents >= 0
    want[has] |= t[parents[has]]
    bad = np.argwhere(t != want)
    if bad.size:
        i, k = bad[0]
        why = ("does not see itself" if i == k else "sees a later draft token" if k > i else
               "sees draft token %d, not an ancestor along its parent chain" % k if t[i, k] else
               "hides draft token %d, an ancestor of its parent %d" % (k, parents[i]))
        raise UnsupportedError("custom_mask: request %d, draft row %d (key %d) %s; kvattn's "
                               "tree masks let a draft token see exactly itself and its ancestors"
                               % (r, i, c + i, why))
    return parents


def tree_from_mask(custom_mask, packed_custom_mask, qo_indptr, kv_lens):
    """The flat [T] int32 parents of the tree that FlashInfer's custom mask
    (qo_indptr [R+1], kv_lens [R]) describes, for Plan(tree=); raises
    ShapeMismatchError (wrong length) or UnsupportedError (not a tree mask)
    before anything is planned."""
    qo = T.host_array(qo_indptr, np.int64, "qo_indptr")
    q_lens = np.diff(qo)
    kl = np.asarray(kv_lens, np.int64)
    if kl.shape != q_lens.shape:
        raise ShapeMismatchError("custom_mask: qo_indptr has %d requests, the page table %d"
                                 % (q_lens.shape[0], kl.shape[0]))
    if (q_lens < 0).any():
        raise InvalidArgumentError("qo_indptr: decreasing")
    masks = _bits(custom_mask, packed_custom_mask, q_lens, kl)
    parts = [_tree_parents(r, m) for r, m in enumerate(masks)]
    return np.concatenate(parts) if parts else np.empty(0, np.int32)
