"""torch tensors (CPU; CUDA where a GPU and a CUDA build are there) through
the core API and the FlashInfer wrappers; skipped without torch. The package
itself imports without torch (checked in a subprocess)."""

import subprocess
import sys

import numpy as np
import pytest

import kvattn
from kvattn import flashinfer as fi
from reference import attention

torch = pytest.importorskip("torch")
LOG2E = 1.4426950408889634


def test_import_without_torch():
    code = ("import sys; sys.modules['torch'] = None; import kvattn, kvattn.flashinfer; "
            "print(kvattn.__version__)")
    subprocess.run([sys.executable, "-c", code], check=True)


def devices():
    yield "cpu"
    if torch.cuda.is_available() and kvattn.backend_available("cuda"):
        yield "cuda"


@pytest.mark.parametrize("device", list(devices()))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_decode_wrapper_torch(device, dtype):
    g = torch.Generator().manual_seed(3)
    b, hkv, h, d, nb = 16, 2, 8, 64, 12
    kv_lens = [37, 5, 64]
    npages = [-(-s // b) for s in kv_lens]
    indptr = torch.tensor([0] + list(np.cumsum(npages)), dtype=torch.int32)
    indices = torch.randperm(nb, generator=g)[: int(indptr[-1])].int()
    last = torch.tensor([s - (n - 1) * b for s, n in zip(kv_lens, npages)], dtype=torch.int32)
    cache = torch.randn(nb, 2, b, hkv, d, generator=g).to(dtype).to(device)
    q = torch.randn(3, h, d, generator=g).to(dtype).to(device)
    ws = torch.empty(16, dtype=torch.uint8, device=device)
    w = fi.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD")
    w.plan(indptr.to(device), indices.to(device), last.to(device), h, hkv, d, b,
           q_data_type=dtype, logits_soft_cap=20.0)
    out, lse = w.run(q, cache, return_lse=True)
    assert out.device.type == device and out.dtype == dtype and lse.dtype == torch.float32
    kc, vc = cache[:, 0].float().cpu().numpy(), cache[:, 1].float().cpu().numpy()
    keys = [kc[indices[indptr[r]:indptr[r + 1]]].reshape(-1, hkv, d)[:s]
            for r, s in enumerate(kv_lens)]
    values = [vc[indices[indptr[r]:indptr[r + 1]]].reshape(-1, hkv, d)[:s]
              for r, s in enumerate(kv_lens)]
    ro, rl = attention(q.float().cpu().numpy(), keys, values, [1, 1, 1], causal=True,
                       softcap=20.0)
    tol = 1e-3 if dtype == torch.float16 else 1e-2
    np.testing.assert_allclose(out.float().cpu().numpy(), ro, rtol=tol, atol=tol)
    np.testing.assert_allclose(lse.cpu().numpy(), rl * LOG2E, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("device", list(devices()))
def test_core_cache_write_run_torch(device):
    ctx = kvattn.Context("cuda" if device == "cuda" else "cpu")
    g = torch.Generator().manual_seed(4)
    cache = kvattn.Cache(ctx, 4, 8, 2, 32, dtype=torch.float32)
    k = torch.randn(13, 2, 32, generator=g).to(device)
    v = torch.randn(13, 2, 32, generator=g).to(device)
    cache.write(k, v, torch.arange(13, dtype=torch.int64, device=device))
    # A strided token dimension: k/v as slices of a fused [T, 3, Hkv, D] tensor.
    fused = torch.randn(2, 3, 2, 32, generator=g).to(device)
    cache.write(fused[:, 1], fused[:, 2], torch.tensor([13, 14], device=device))
    plan = kvattn.Plan(ctx, [0, 2], [15], [[0, 1]], block_size=8, num_heads=4,
                       num_kv_heads=2, head_dim=32, q_dtype="f32")
    q = torch.randn(2, 4, 32, generator=g).to(device)
    out, lse = plan.run(q, cache, return_lse=True)
    keys = torch.cat([k, fused[:, 1]]).cpu().numpy()
    values = torch.cat([v, fused[:, 2]]).cpu().numpy()
    ro, rl = attention(q.cpu().numpy(), [keys], [values], [2], causal=True)
    np.testing.assert_allclose(out.cpu().numpy(), ro, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(lse.cpu().numpy(), rl, rtol=1e-5, atol=1e-5)
    wrong = q.cpu() if device == "cuda" else q.to(torch.float16)
    with pytest.raises((kvattn.InvalidArgumentError, kvattn.DtypeMismatchError)):
        plan.run(wrong, cache)
