"""features.py's probes agree with the library they probe: a probe that
called a built-in part missing would skip tests that should run (and one that
called a missing part built in would let them fail), so each answer is
checked against the call it stands for."""

import pytest

import features
import kvattn


@pytest.mark.parametrize("name", ["sha256", "xxh3_128"])
def test_hash_probe_agrees(name):
    option = features.missing_hash(name)
    if option is None:
        kvattn.Pool(8, 4, hash=name).close()
    else:
        with pytest.raises(kvattn.UnsupportedError, match=option + "=OFF"):
            kvattn.Pool(8, 4, hash=name)
    kvattn.Pool(8, 4, hash=name, enable_prefix_caching=False).close()  # any build


def test_c8_loader_probe_agrees(tmp_path):
    option = features.missing_c8_loader()
    err = kvattn.IOError_ if option is None else kvattn.UnsupportedError
    with pytest.raises(err):
        kvattn.load_c8_scales(tmp_path, 0, 1, 8)  # a directory without a checkpoint
