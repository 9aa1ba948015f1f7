"""The poison of outputs in the Python tests: a NaN whose payload no
computation produces (bench/data.h's kva_test_poison: f32 0x7fd5d5d5, 16-bit
0x7fd5), so that a check that an output (or a cache) was left untouched
compares the poison's bits: a call that wrongly wrote NaN into it fails, where
np.isnan(out).all() passed. torch_poisoned / torch_untouched: the same for
torch tensors (any device)."""
import numpy as np

_BITS = {4: (np.uint32, 0x7FD5D5D5), 2: (np.uint16, 0x7FD5)}


def poisoned(shape, dtype=np.float32):
    """A new array of shape and float dtype (f32, f16 or bf16) holding the poison."""
    a = np.empty(shape, dtype)
    fill(a)
    return a


def fill(a):
    """Fills the float array a (f32, f16 or bf16) with the poison, in place."""
    u, bits = _BITS[a.dtype.itemsize]
    a.view(u)[...] = bits


def untouched(a):
    """Whether every element of a still holds the poison's bits."""
    u, bits = _BITS[a.dtype.itemsize]
    return bool((np.ascontiguousarray(a).view(u) == bits).all())


def torch_poisoned(shape, dtype, device="cpu"):
    """A new torch tensor of shape and float dtype (f32, f16 or bf16) holding the poison."""
    import torch
    t = torch.empty(shape, dtype=dtype, device=device)
    u, bits = {4: (torch.int32, 0x7FD5D5D5), 2: (torch.int16, 0x7FD5)}[t.element_size()]
    t.view(u).fill_(bits)
    return t


def torch_untouched(t):
    """Whether every element of torch tensor t still holds the poison's bits."""
    import torch
    u, bits = {4: (torch.int32, 0x7FD5D5D5), 2: (torch.int16, 0x7FD5)}[t.element_size()]
    return bool((t.contiguous().view(u) == bits).all())
