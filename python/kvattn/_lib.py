"""ctypes view of include/kvattn.h: the shared library, its structs and prototypes.

The C header is the one source of truth; this file only restates its types
for ctypes. Every struct here must match kvattn.h field for field
(tests/python/test_plan_features.py compares each with the C struct: the
member names in the headers, the offsets and sizes a C compiler gives).
"""

import ctypes
import operator
import os
import sys
from ctypes import POINTER, Structure, c_char_p, c_double, c_float, c_int, c_int32, c_int64
from ctypes import c_size_t, c_uint8, c_void_p

_HERE = os.path.dirname(os.path.abspath(__file__))


def _find_library():
    """The shared library: $KVATTN_LIBRARY, else the one installed next to this file."""
    env = os.environ.get("KVATTN_LIBRARY")
    if env:
        return env
    names = {"darwin": ["libkvattn.dylib"], "win32": ["kvattn.dll"]}.get(sys.platform, [])
    names += ["libkvattn.so"]
    for d in (_HERE, os.path.join(_HERE, "lib")):
        for n in names:
            p = os.path.join(d, n)
            if os.path.exists(p):
                return p
    raise ImportError(
        "kvattn: libkvattn shared library not found next to %s; install the package with "
        "`pip install .` from the repository root, or set KVATTN_LIBRARY" % _HERE
    )


lib = ctypes.CDLL(_find_library())
LIBRARY_PATH = lib._name

# C integer types a Python value must fit: ctypes would wrap it silently
# (2**32 + 3 -> 3), so _fit refuses it before the call. c_int is c_int32 here.
_INT_RANGES = {
    c_int32: (-(2**31), 2**31 - 1),
    c_int64: (-(2**63), 2**63 - 1),
    c_size_t: (0, 2 ** (8 * ctypes.sizeof(c_size_t)) - 1),
}


def _fit(value, ctype, what):
    """value as a Python int for a C integer of ctype (other ctypes: value
    unchanged); InvalidArgumentError for a non-integer or a value outside
    the type's range."""
    rng = _INT_RANGES.get(ctype)
    if rng is None:
        return value
    try:  # a bool is no count, id or size (request_id=True is a mistake)
        i = None if _is_bool(value) else operator.index(value)
    except TypeError:
        i = None
    if i is None or not rng[0] <= i <= rng[1]:
        from ._errors import InvalidArgumentError  # _errors imports this module

        raise InvalidArgumentError("%s: %r is not an integer in [%d, %d]"
                                   % (what, value, rng[0], rng[1]))
    return i


def _is_bool(value):
    """True for a bool: Python's, numpy's, or a 0-d numpy / torch bool array."""
    np = sys.modules.get("numpy")
    if isinstance(value, bool) or (np is not None and isinstance(value, np.bool_)):
        return True
    dt = getattr(value, "dtype", None)
    return (dt is not None and "bool" in str(dt) and getattr(value, "ndim", -1) == 0
            and type(value).__module__.split(".")[0] in ("numpy", "torch"))


def _flag(value, what):
    """value as a Python bool for an argument documented as a bool: a bool,
    numpy bool or 0-d numpy / torch bool array; anything else (a string such
    as "no", an int, None) is InvalidArgumentError rather than its truth."""
    if not _is_bool(value):
        from ._errors import InvalidArgumentError  # _errors imports this module

        raise InvalidArgumentError("%s: a bool expected, got %r" % (what, value))
    return bool(value)


class _Struct(Structure):
    """A C struct whose constructor refuses integer field values the field
    cannot hold (fields assigned later are the caller's to check, with _fit)."""

    def __init__(self, *args, **kw):
        f = self._fields_
        name = type(self).__name__
        args = [_fit(a, f[i][1], "%s.%s" % (name, f[i][0])) if i < len(f) else a
                for i, a in enumerate(args)]
        if kw:
            ty = dict(f)
            kw = {k: _fit(v, ty.get(k), "%s.%s" % (name, k)) for k, v in kw.items()}
        super().__init__(*args, **kw)


# Enum values (kvattn.h).
BACKENDS = {"ref": 0, "cpu": 1, "cuda": 2}
DTYPES = {"f32": 0, "f16": 1, "bf16": 2, "i8": 3, "fp8_e4m3": 4, "u8": 5}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}
DTYPE_SIZES = {0: 4, 1: 2, 2: 2, 3: 1, 4: 1, 5: 1}
LAYOUTS = {"NHD": 0, "HND": 1}
QUANTS = {"none": 0, "int8_channel": 1, "int8_token_k": 2, "int8_token_k_v16": 3, "fp8_e4m3": 4,
          "fp8_ds_mla": 5, "fp8_token": 6}
KINDS = {"mha": 0, "mla": 1, "index": 2}  # kva_attn_kind
SPARSE_MODES = {"mixed": 0, "separate": 1}  # kva_sparse_mode
CASCADE_MODES = {"auto": 0, "off": 1, "on": 2}  # kva_cascade_mode
MAX_TREE_TOKENS = 64  # KVA_MAX_TREE_TOKENS
MAX_DCP = 256  # KVA_MAX_DCP (kvattn_merge.h)
POOL_HASHES = {"sha256": 0, "xxh3_128": 1}
STATES = {
    0: "prefill_no_cache",
    1: "prefill_cache_hit",
    2: "decode_only",
    3: "chunked_prefill",
    4: "spec_decoding",
    5: "empty",
}


class ContextDesc(_Struct):
    _fields_ = [("backend", c_int), ("num_threads", c_int32), ("device_id", c_int32)]


class CacheDesc(_Struct):
    _fields_ = [
        ("num_blocks", c_int32),
        ("block_size", c_int32),
        ("num_kv_heads", c_int32),
        ("head_dim", c_int32),
        ("head_dim_v", c_int32),
        ("dtype", c_int),
        ("layout", c_int),
        ("quant", c_int),
        ("kind", c_int),  # kva_attn_kind; 0 = KVA_ATTN_MHA
    ]


class QuantParams(_Struct):
    _fields_ = [
        ("k_scale", c_void_p),
        ("k_scale_len", c_int64),
        ("k_offset", c_void_p),
        ("k_offset_len", c_int64),
        ("v_scale", c_void_p),
        ("v_scale_len", c_int64),
        ("v_offset", c_void_p),
        ("v_offset_len", c_int64),
    ]


class PlanDesc(_Struct):
    _fields_ = [
        ("num_requests", c_int32),
        ("query_start_loc", c_void_p),
        ("seq_lens", c_void_p),
        ("block_table", c_void_p),
        ("block_table_stride", c_int32),
        ("block_size", c_int32),
        ("decode_threshold", c_int32),
        ("num_heads", c_int32),
        ("num_kv_heads", c_int32),
        ("head_dim", c_int32),
        ("head_dim_v", c_int32),
        ("q_dtype", c_int),
        ("scale", c_float),
        ("causal", c_int32),
        ("window_left", c_int32),
        ("softcap", c_float),
        ("alibi_slopes", c_void_p),
        ("kind", c_int),  # kva_attn_kind of the caches it reads; 0 = KVA_ATTN_MHA
        # Decode context parallelism (docs/dcp.md); all 0 = unsharded.
        ("dcp_size", c_int32),
        ("dcp_rank", c_int32),
        ("dcp_interleave", c_int32),
        ("mla_qk_nope_head_dim", c_int32),  # kind MLA: Dn of kva_mla_run, else 0
        ("mla_v_head_dim", c_int32),  # kind MLA: Dv of kva_mla_run, else 0
        ("attention_chunk", c_int32),  # chunked local attention C, 0 = off (docs/masks.md)
        ("tree_parents", c_void_p),  # [T] int32 draft-tree parents, or NULL
        ("tree_mask", c_void_p),  # packed tree mask (FlashInfer layout), or NULL
        # Cascade (shared-prefix) plans (docs/cascade.md); all 0 = automatic.
        ("cascade", c_int32),  # kva_cascade_mode: 0 auto, 1 off, 2 on
        ("num_cascade_groups", c_int32),
        ("cascade_group", c_void_p),  # [R] int32 or NULL
        ("cascade_prefix_len", c_void_p),  # [G] int32
        # Sparse MLA / indexer plans (kvattn_mla.h); 0 = dense.
        ("sparse_topk", c_int32),
        ("sparse_mode", c_int32),  # kva_sparse_mode: 0 mixed, 1 separate
        ("cascade_parent", c_void_p),  # [G] int32 parent group of each given group, or NULL
        ("index_q_quant", c_int32),  # indexer plans: kva_quant of q, 0 none, 6 fp8_token
    ]


class PlanInfo(_Struct):
    _fields_ = [
        ("state", c_int),
        ("num_tokens", c_int32),
        ("num_decodes", c_int32),
        ("num_decode_tokens", c_int32),
        ("num_prefills", c_int32),
        ("num_prefill_tokens", c_int32),
        ("decode_first", c_int32),
        ("max_q_len", c_int32),
        ("max_seq_len", c_int32),
        ("num_work_items", c_int32),
        ("num_cascade_groups", c_int32),
        ("cascade_rows", c_int32),
        ("cascade_chunks", c_int32),
    ]


class PoolDesc(_Struct):
    _fields_ = [
        ("num_blocks", c_int32),
        ("block_size", c_int32),
        ("hash", c_int),
        ("enable_prefix_caching", c_int32),
    ]


class PoolStats(_Struct):
    _fields_ = [
        ("num_blocks", c_int32),
        ("num_used_blocks", c_int32),
        ("num_free_blocks", c_int32),
        ("num_cached_blocks", c_int32),
        ("num_requests", c_int32),
        ("usage", c_double),
        ("query_tokens", c_int64),
        ("hit_tokens", c_int64),
        ("hit_rate", c_double),
        ("num_evicted_blocks", c_int64),
    ]


class PoolRequestInfo(_Struct):
    _fields_ = [("num_tokens", c_int32), ("num_blocks", c_int32), ("num_cached_tokens", c_int32)]


class C8Scales(_Struct):
    _fields_ = [
        ("num_kv_heads", c_int32),
        ("head_dim", c_int32),
        ("params", QuantParams),
        ("data", c_void_p),
    ]


_P = c_void_p  # every handle and tensor pointer crosses as an address
_I32, _I64 = c_int32, c_int64


_CALLER_INTS = ("kva_c8_scales_load", "kva_batch_reorder_decode_first", "kva_dcp_local_lens",
                 "kva_dcp_slots")


def _proto(name, restype, *argtypes):
    f = getattr(lib, name, None)
    if f is None:
        return None
    f.restype = restype
    f.argtypes = list(argtypes)
    # Entry points whose integers come from the caller as they are (the pool's
    # request ids and counts, the loader's layer and ranks) check them; the
    # others get shapes, strides and enum codes the package computed.
    ints = [(i, t) for i, t in enumerate(argtypes) if t in _INT_RANGES]
    if not ints or not (name.startswith("kva_pool_") or name in _CALLER_INTS):
        return f

    def call(*args):
        a = list(args)
        for i, t in ints:
            if i < len(a):
                a[i] = _fit(a[i], t, "%s: argument %d" % (name, i + 1))
        return f(*a)

    call.__name__ = name
    return call


kva_version = _proto("kva_version", c_char_p)
kva_status_name = _proto("kva_status_name", c_char_p, c_int)
kva_status_string = _proto("kva_status_string", c_char_p, c_int)
kva_last_error = _proto("kva_last_error", c_char_p)
kva_backend_available = _proto("kva_backend_available", c_int, c_int)

kva_context_create = _proto("kva_context_create", c_int, POINTER(ContextDesc), POINTER(_P))
kva_context_destroy = _proto("kva_context_destroy", None, _P)
kva_context_num_threads = _proto("kva_context_num_threads", _I32, _P)

kva_cache_create_quant = _proto(
    "kva_cache_create_quant", c_int, _P, POINTER(CacheDesc), POINTER(QuantParams), POINTER(_P)
)
kva_cache_create_from = _proto(
    "kva_cache_create_from", c_int, _P, POINTER(CacheDesc), _P, _P, POINTER(_P)
)
kva_cache_create_from_interleaved = _proto(
    "kva_cache_create_from_interleaved", c_int, _P, POINTER(CacheDesc), _P, POINTER(_P)
)
kva_cache_destroy = _proto("kva_cache_destroy", None, _P)
kva_cache_get_desc = _proto("kva_cache_get_desc", c_int, _P, POINTER(CacheDesc))
kva_cache_data = _proto("kva_cache_data", c_int, _P, POINTER(_P), POINTER(_P))
kva_cache_token_scales = _proto("kva_cache_token_scales", c_int, _P, POINTER(_P))
kva_cache_block_bytes_k = _proto("kva_cache_block_bytes_k", c_size_t, _P)
kva_cache_block_bytes_v = _proto("kva_cache_block_bytes_v", c_size_t, _P)
kva_cache_write = _proto("kva_cache_write", c_int, _P, _P, _I32, _P, _I64, _P, _I64, c_int, _P)
kva_cache_read = _proto("kva_cache_read", c_int, _P, _P, _I32, _P, _P, _I64, _P, _I64, c_int)
kva_cache_copy_blocks = _proto("kva_cache_copy_blocks", c_int, _P, _P, _P, _I32)
kva_cache_swap_blocks = _proto("kva_cache_swap_blocks", c_int, _P, _P, _P, _P, _I32)

kva_plan_create = _proto("kva_plan_create", c_int, _P, POINTER(PlanDesc), POINTER(_P))
kva_plan_destroy = _proto("kva_plan_destroy", None, _P)
kva_plan_update = _proto("kva_plan_update", c_int, _P, _P, POINTER(PlanDesc))
kva_plan_get_info = _proto("kva_plan_get_info", c_int, _P, POINTER(PlanInfo))
kva_batch_reorder_decode_first = _proto(
    "kva_batch_reorder_decode_first", c_int, _I32, _P, _I32, _P, POINTER(_I32)
)

kva_attention_run = _proto("kva_attention_run", c_int, _P, _P, _P, _P, _P, _P, _P)
kva_mla_run = _proto("kva_mla_run", c_int, _P, _P, _P, _P, _P, _P, _P, _P)
kva_mla_sparse_run = _proto(
    "kva_mla_sparse_run", c_int, _P, _P, _P, _P, _P, _I64, _P, _P, _P, _P
)
kva_indexer_run = _proto("kva_indexer_run", c_int, _P, _P, _P, _P, _P, _P, _I64, _P)
kva_attention_run_ragged = _proto("kva_attention_run_ragged", c_int, _P, _P, _P, _P, _P, _P, _P, _P)
kva_merge_states = _proto(
    "kva_merge_states", c_int, _P, _I32, _I32, _I32, c_int, _P, _P, _P, _P, _P, _P
)
kva_merge_states_n = _proto(
    "kva_merge_states_n", c_int, _P, _I32, _I32, _I32, _I32, c_int, _P, _I64, _P, _I64, _P, _P
)
kva_dcp_local_lens = _proto("kva_dcp_local_lens", c_int, _I32, _P, _I32, _I32, _I32, _P)
kva_dcp_slots = _proto("kva_dcp_slots", c_int, _I32, _I32, _I32, _I32, _P, _I32, _I32, _I32, _P)

kva_c8_scales_load = _proto(
    "kva_c8_scales_load", c_int, c_char_p, _I32, _I32, _I32, _I32, _I32, POINTER(POINTER(C8Scales))
)
kva_c8_scales_free = _proto("kva_c8_scales_free", None, POINTER(C8Scales))

kva_pool_create = _proto("kva_pool_create", c_int, POINTER(PoolDesc), POINTER(_P))
kva_pool_destroy = _proto("kva_pool_destroy", None, _P)
kva_pool_request_add = _proto(
    "kva_pool_request_add", c_int, _P, _P, _I32, _P, c_size_t, POINTER(_I32), POINTER(_I32)
)
kva_pool_request_allocate = _proto("kva_pool_request_allocate", c_int, _P, _I32, _I32, _I32)
kva_pool_request_append_tokens = _proto("kva_pool_request_append_tokens", c_int, _P, _I32, _P, _I32)
kva_pool_request_fork = _proto("kva_pool_request_fork", c_int, _P, _I32, POINTER(_I32), _P)
kva_pool_request_free = _proto("kva_pool_request_free", c_int, _P, _I32)
kva_pool_request_drop_window = _proto("kva_pool_request_drop_window", c_int, _P, _I32, _I32)
kva_pool_request_drop_chunk = _proto("kva_pool_request_drop_chunk", c_int, _P, _I32, _I32)
kva_pool_request_block_table = _proto(
    "kva_pool_request_block_table", c_int, _P, _I32, _P, _I32, POINTER(_I32)
)
kva_pool_request_slots = _proto("kva_pool_request_slots", c_int, _P, _I32, _I32, _I32, _P)
kva_pool_request_get_info = _proto(
    "kva_pool_request_get_info", c_int, _P, _I32, POINTER(PoolRequestInfo)
)
kva_pool_get_stats = _proto("kva_pool_get_stats", c_int, _P, POINTER(PoolStats))
kva_pool_reset_prefix_cache = _proto("kva_pool_reset_prefix_cache", c_int, _P)
kva_pool_check = _proto("kva_pool_check", c_int, _P)

# CUDA-only entry points (kvattn_cuda.h); present in every build (they fail
# with a status on other backends), looked up defensively all the same.
kva_cuda_context_set_stream = _proto("kva_cuda_context_set_stream", c_int, _P, _P)


class CudaCapacity(_Struct):
    _fields_ = [("max_requests", c_int32), ("max_tokens", c_int32), ("max_block_table", c_int64),
                ("num_heads", c_int32), ("num_kv_heads", c_int32), ("head_dim_v", c_int32)]


kva_cuda_context_reserve = _proto("kva_cuda_context_reserve", c_int, _P, POINTER(CudaCapacity))

__all__ = ["lib", "c_uint8"]
