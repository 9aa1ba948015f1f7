"""kva_pool: the block pool with hash-chained prefix caching (host-side)."""

import ctypes

import numpy as np

from . import _errors
from . import _lib as L
from . import _tensor as T

_check = _errors.check
_byref = ctypes.byref


def _ptr(a):
    return T.address(a)


def _tokens(x, name):
    """Token ids as a 1-D int32 host array; a 0-D or 2-D one is refused (a
    flattened [B, T] batch would be taken for one request's B*T tokens)."""
    t = T.host_array(x, np.int32, name)
    # (host_array makes a 0-D input 1-D: its own ndim decides)
    if (x.ndim if hasattr(x, "ndim") else np.ndim(x)) != 1:
        raise _errors.ShapeMismatchError("%s: a 1-D sequence of token ids, got shape %s"
                                         % (name, np.shape(x)))
    return t


class Pool:
    """Hands out the blocks of a paged cache to requests and caches full
    blocks by content (vLLM's automatic prefix caching). Block 0 is the null
    block. Request ids are small ints. Use from one thread at a time."""

    def __init__(self, num_blocks, block_size, hash="sha256", enable_prefix_caching=True):
        pc = L._flag(enable_prefix_caching, "enable_prefix_caching")
        d = L.PoolDesc(num_blocks, block_size, _hash_code(hash), 1 if pc else 0)
        h = ctypes.c_void_p()
        _check(L.kva_pool_create(_byref(d), _byref(h)))
        self._h = h.value
        self.num_blocks, self.block_size = num_blocks, block_size

    def add_request(self, prompt_tokens, extra_key=b""):
        """Adds a request; returns (request_id, num_cached_tokens). prompt_tokens:
        a 1-D sequence of token ids. extra_key (bytes, or str as UTF-8)
        separates its cache entries from other keys'."""
        t = _tokens(prompt_tokens, "prompt_tokens")
        if extra_key is None:
            extra_key = b""
        elif isinstance(extra_key, str):
            extra_key = extra_key.encode()
        if not isinstance(extra_key, (bytes, bytearray, memoryview)):
            # bytes(5) would be five zero bytes: a silent, colliding key
            raise _errors.InvalidArgumentError("extra_key: bytes or str, got %s"
                                               % type(extra_key).__name__)
        ek = bytes(extra_key)
        rid, cached = ctypes.c_int32(), ctypes.c_int32()
        _check(L.kva_pool_request_add(self._h, _ptr(t), t.shape[0], ek or None, len(ek),
                                      _byref(rid), _byref(cached)))
        return rid.value, cached.value

    def allocate(self, request_id, num_new_tokens, num_lookahead_tokens=0):
        """Covers num_tokens + new + lookahead positions with blocks; raises
        PoolExhaustedError (changing nothing) when too few are free."""
        _check(L.kva_pool_request_allocate(self._h, request_id, num_new_tokens,
                                           num_lookahead_tokens))

    def append_tokens(self, request_id, tokens):
        """Records tokens as computed (their KV is written); caches full blocks."""
        t = _tokens(tokens, "tokens")
        _check(L.kva_pool_request_append_tokens(self._h, request_id, _ptr(t), t.shape[0]))

    def fork(self, request_id):
        """Parallel sampling: returns (new_request_id, copy) where copy is the
        (src, dst) block pair to pass to Cache.copy_blocks, or None."""
        rid = ctypes.c_int32()
        cp = np.empty(2, np.int32)
        _check(L.kva_pool_request_fork(self._h, request_id, _byref(rid), _ptr(cp)))
        return rid.value, (None if cp[0] < 0 else (int(cp[0]), int(cp[1])))

    def free(self, request_id):
        _check(L.kva_pool_request_free(self._h, request_id))

    def drop_window(self, request_id, window_tokens):
        """Releases blocks wholly before num_tokens - window_tokens."""
        _check(L.kva_pool_request_drop_window(self._h, request_id, window_tokens))

    def drop_chunk(self, request_id, chunk_tokens):
        """Chunked local attention (Plan(attention_chunk=C)): releases the
        blocks wholly before the chunk start of the next token, num_tokens -
        num_tokens % chunk_tokens, putting the null block 0 in their place."""
        _check(L.kva_pool_request_drop_chunk(self._h, request_id, chunk_tokens))

    def block_table(self, request_id, row_len=None):
        """The request's block-table row as int32 [row_len] (0-padded); its own
        length when row_len is None."""
        n = ctypes.c_int32()
        if row_len is None:
            _check(L.kva_pool_request_block_table(self._h, request_id, None, 0, _byref(n)))
            row_len = n.value
        row_len = L._fit(row_len, L.c_int32, "row_len")  # before np.empty(2.5), np.empty(2**40)
        row = np.empty(max(row_len, 0), np.int32)  # row_len < 0: the C call refuses it
        _check(L.kva_pool_request_block_table(self._h, request_id, _ptr(row), row_len, _byref(n)))
        if n.value > row_len:  # row_len 0 is C's query of the count: no row was written
            raise _errors.OutOfRangeError(
                "kva_pool_request_block_table: row_len %d is shorter than request %d's %d blocks"
                % (row_len, request_id, n.value))
        return row

    def slots(self, request_id, first_pos, count):
        """Slots int64 [count] of positions first_pos .. first_pos + count - 1."""
        count = L._fit(count, L.c_int32, "count")  # before np.empty(2.5), np.empty(2**40)
        s = np.empty(max(count, 0), np.int64)  # count < 0: the C call refuses it
        _check(L.kva_pool_request_slots(self._h, request_id, first_pos, count, _ptr(s)))
        return s

    def request_info(self, request_id):
        """dict: num_tokens, num_blocks, num_cached_tokens."""
        c = L.PoolRequestInfo()
        _check(L.kva_pool_request_get_info(self._h, request_id, _byref(c)))
        return {f: getattr(c, f) for f, _ in c._fields_}

    def stats(self):
        """dict of kva_pool_stats (usage, hit_rate, ...)."""
        c = L.PoolStats()
        _check(L.kva_pool_get_stats(self._h, _byref(c)))
        return {f: getattr(c, f) for f, _ in c._fields_}

    def reset_prefix_cache(self):
        _check(L.kva_pool_reset_prefix_cache(self._h))

    def check(self):
        """Checks every pool invariant; raises InternalError naming the first violation."""
        _check(L.kva_pool_check(self._h))

    def close(self):
        if getattr(self, "_h", None):
            L.kva_pool_destroy(self._h)
            self._h = None

    __del__ = close


def _hash_code(h):
    if L._is_bool(h):  # True == 1 would pick xxh3_128
        raise _errors.InvalidArgumentError("hash: %r is not one of %s" % (h, list(L.POOL_HASHES)))
    if h in L.POOL_HASHES.values():
        return h
    if h not in L.POOL_HASHES:
        raise _errors.InvalidArgumentError("hash: %r is not one of %s" % (h, list(L.POOL_HASHES)))
    return L.POOL_HASHES[h]
