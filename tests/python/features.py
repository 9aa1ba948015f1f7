"""Optional parts of the kvattn library under test (CMake KVA_WITH_OPENSSL,
KVA_WITH_XXHASH, KVA_WITH_CJSON). The library has no query for them: a call
that needs a part the build left out fails with KVA_STATUS_UNSUPPORTED and a
message naming the CMake option (kvattn_pool.h, quant_loader_off.c). Each
probe makes that call once and reads the answer; only that exact refusal
counts as "left out", any other error of the probe is raised, so a library
that has the part but fails the call makes the tests that use it fail rather
than skip. A test that needs a part calls need_hash() / need_c8_loader() first
and is skipped, with the option named, when the part is missing."""

import functools
import os
import tempfile

import pytest

import kvattn

_HASH_OPTION = {"sha256": "KVA_WITH_OPENSSL", "xxh3_128": "KVA_WITH_XXHASH"}
_HASH_NAME = {0: "sha256", 1: "xxh3_128"}


def _left_out(err, option):
    """Whether err is the library's refusal of a part built with option=OFF."""
    return isinstance(err, kvattn.UnsupportedError) and ("%s=OFF" % option) in str(err)


@functools.lru_cache(maxsize=None)
def missing_hash(name):
    """The CMake option that left block hash name ("sha256", "xxh3_128" or
    its code 0 / 1) out of the library, or None when it is built in."""
    name = _HASH_NAME.get(name, name)
    option = _HASH_OPTION[name]
    try:
        kvattn.Pool(4, 4, hash=name, enable_prefix_caching=True).close()
    except kvattn.UnsupportedError as e:
        if _left_out(e, option):
            return option
        raise
    return None


@functools.lru_cache(maxsize=None)
def missing_c8_loader():
    """"KVA_WITH_CJSON" when the library has no C8 checkpoint loader, else
    None (the probe reads a directory that does not exist: the loader's own
    error then, here an IOError, means it is built in)."""
    with tempfile.TemporaryDirectory() as d:
        try:
            kvattn.load_c8_scales(os.path.join(d, "absent"), 0, 1, 8)
        except kvattn.UnsupportedError as e:
            if _left_out(e, "KVA_WITH_CJSON"):
                return "KVA_WITH_CJSON"
            raise
        except kvattn.KvaError:
            return None
    raise AssertionError("load_c8_scales read a checkpoint from a directory that does not exist")


def need_hash(name="sha256"):
    """Skips the calling test when the library lacks block hash name (a Pool
    with prefix caching on, the default, needs "sha256")."""
    option = missing_hash(name)
    if option:
        pytest.skip("this build of kvattn has no %s block hash (%s=OFF): a Pool with prefix "
                    "caching cannot be made" % (_HASH_NAME.get(name, name), option))


def need_c8_loader():
    """Skips the calling test when the library has no C8 checkpoint loader."""
    if missing_c8_loader():
        pytest.skip("this build of kvattn has no C8 checkpoint loader (KVA_WITH_CJSON=OFF)")
