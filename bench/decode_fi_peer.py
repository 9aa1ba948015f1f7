#!/usr/bin/env python3
"""decode_fi_peer.py - FlashInfer's BatchDecodeWithPagedKVCacheWrapper on the
decode shapes of dev/final/run.sh's `bench_cuda --mode decode` rows (issue 23):
R requests of one query token after S cached tokens (S + 1 keys each), bf16 q /
o, H 32 / Hkv 8, D 128, paged NHD cache of page 16: R * ceil((S + 1) / 16) pages
in use in a shuffled order and one spare (bench_cuda's count, batches.h), random data:
16 x 1023, 16 x 4095, 64 x 4095, 1 x 131071 with a bf16 cache, and
64 x 4095 with an fp8 e4m3 cache (k_scale / v_scale 1; bench_cuda's fp8 row has
per-head scales). Both of FlashInfer's paths: "cuda-cores" (the default
decode kernel) and "tensor-cores" (use_tensor_cores=True: the fa2 prefill
kernel; backend="fa2" pinned, which its backend="auto" resolves to for a bf16
cache on SM90). Per call: the median of 30 CUDA-event-timed calls after 5
warm-ups; b2b: the mean of 30 calls enqueued back to back between one pair of
events (bench/peer_timing.py, shared with bench/prefill_sdpa_peer.py). TB/s KV counts every key's K and V once
per kv head (bench_cuda's count; fp8: the 1-byte codes only). check: request
0's output against a float32 softmax over its keys (max |err| <= 2e-2 bf16,
6e-2 fp8; "FAIL" otherwise).
KVA_FI_PREBUILT=DIR: load the JIT modules from DIR/<uri>/<uri>.so (compiled
without a GPU by bench/flashinfer_prebuild.sh) and compile nothing here; a
module missing there gives a "failed: not prebuilt" line, not a compile.
Line format (scripts/results.py final_rows, FI_DECODE_RE):
  fi-decode R=16 S=1023 H=32 Hkv=8 D=128 B=16 kv bf16 cuda-cores: 0.0400 ms 1.68 TB/s KV
  b2b 0.0300 ms 2.24 TB/s KV check ok (err 0.0039) (flashinfer 0.7.2.post1)   [one line]
Run it in the same device call as bench_cuda and compare within that call only.
Usage: decode_fi_peer.py [--quick | --modules]
  --quick: 16 x 1023 bf16 only. --modules: no GPU needed: with KVA_FI_PREBUILT,
  load every module these rows, bench/prefill_sdpa_peer.py short and
  bench/peer_mla.py use (the argument tuples FlashInfer's plan passes for them)
  and print "module NAME loaded|failed ..." per module; exit status 1 if one
  failed."""
import os
import sys

import torch

from peer_timing import timed  # bench/peer_timing.py: per call and b2b, as prefill_sdpa_peer.py

SHAPES = [(16, 1023, "bf16"), (16, 4095, "bf16"), (64, 4095, "bf16"), (1, 131071, "bf16"),
          (64, 4095, "fp8")]
H, HKV, D, PAGE = 32, 8, 128, 16
DEV = "cuda"  # dev/fidec41/test_decode_fi_peer.py runs case() on the CPU against a stand-in wrapper
TOL = {"bf16": 2e-2, "fp8": 6e-2}


def use_prebuilt(pre):
    """Point FlashInfer's module generators at PRE/<uri>/<uri>.so: the decode
    module (decode.py's get_batch_decode_module), the prefill modules its
    tensor-core path and the prefill wrapper load (prefill.py's
    get_batch_prefill_module) and the MLA module of
    BatchMLAPagedAttentionWrapper's fa2 / fa3 backends (get_batch_mla_module in
    mla/_batch_mla/_backends/_fa_common.py, wrapped as FlashInfer's own spec
    wraps it: _BatchMLAModuleProxy stages the plan's metadata). Nothing is
    generated or compiled."""
    import tvm_ffi
    import flashinfer.decode as fdec
    import flashinfer.prefill as fpre
    import flashinfer.jit.attention.modules as mods
    import flashinfer.mla._batch_mla._backends._fa_common as fmla

    class Prebuilt:
        def __init__(self, uri, adapter=None):
            self.path = os.path.join(pre, uri, uri + ".so")
            self.adapter = adapter

        def build_and_load(self):
            if not os.path.exists(self.path):
                raise FileNotFoundError(f"not prebuilt: {os.path.basename(self.path)}")
            m = tvm_ffi.load_module(self.path)
            return self.adapter(m) if self.adapter else m

    def prefill_uri(mode, surface):
        return lambda backend, *a: Prebuilt(mods._get_batch_prefill_module_uri(
            fpre.get_batch_prefill_uri(backend, *a), backend, mode, surface))

    fdec.gen_batch_decode_module = lambda *a: Prebuilt(fdec.get_batch_decode_uri(*a))
    # fa3 (the prefill rows): the runtime-stride module; fa2 (use_tensor_cores): the equal-stride
    # primary, and the independent-stride paged one only if K and V had different strides (never here)
    fpre.gen_batch_prefill_module = prefill_uri("runtime", "full")
    fpre._gen_batch_prefill_primary_module = prefill_uri("equal", "full")
    fpre._gen_batch_prefill_independent_paged_module = prefill_uri("independent", "paged")
    # MLA: the backend name and the argument tuple of gen_batch_mla_module give the uri (fa3: suffix _sm90)
    fmla.gen_batch_mla_module = lambda *a: Prebuilt(mods.get_batch_mla_uri(*a), mods._BatchMLAModuleProxy)
    fmla.get_batch_mla_module.cache_clear()  # an lru_cache: nothing loaded before the patch is kept

def case(fi, R, S, kv, tensor_cores):
    """The wrapper planned for R requests of S + 1 keys, its call, request 0's
    reference output (float32) and the KV bytes one call reads."""
    keys = S + 1
    per = (keys + PAGE - 1) // PAGE
    g = torch.Generator(device=DEV)
    g.manual_seed(R * 1000003 + S)
    cache = torch.randn(R * per + 1, 2, PAGE, HKV, D, device=DEV, dtype=torch.bfloat16, generator=g)
    kvt = torch.bfloat16
    if kv == "fp8":
        kvt = torch.float8_e4m3fn
        cache = cache.to(kvt)
    idx = torch.randperm(R * per + 1, device=DEV, generator=g)[:R * per].int()
    indptr = torch.arange(0, R + 1, dtype=torch.int32, device=DEV) * per
    last = torch.full((R,), keys - (per - 1) * PAGE, dtype=torch.int32, device=DEV)
    q = torch.randn(R, H, D, device=DEV, dtype=torch.bfloat16, generator=g)
    ws = torch.zeros(256 << 20, dtype=torch.uint8, device=DEV)
    w = fi.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_tensor_cores=tensor_cores,
                                              backend="fa2")
    w.plan(indptr, idx, last, H, HKV, D, PAGE, q_data_type=torch.bfloat16, kv_data_type=kvt)
    kw = {"k_scale": 1.0, "v_scale": 1.0} if kv == "fp8" else {}
    call = lambda: w.run(q, cache, **kw)
    # request 0: its pages in table order, the first `keys` rows (gathered as bytes: fp8 needs no
    # indexing kernel of its own)
    pages = cache.view(torch.uint8)[idx[:per].long()].view(kvt).float()  # per, 2, PAGE, HKV, D
    k = pages[:, 0].reshape(per * PAGE, HKV, D)[:keys]
    v = pages[:, 1].reshape(per * PAGE, HKV, D)[:keys]
    q0 = q[0].float().view(HKV, H // HKV, D)  # query head h reads kv head h // (H / Hkv)
    s = torch.einsum("kgd,nkd->kgn", q0, k) / D ** 0.5
    ref = torch.einsum("kgn,nkd->kgd", torch.softmax(s, dim=-1), v).reshape(H, D)
    nbytes = R * keys * HKV * D * 2 * (1 if kv == "fp8" else 2)
    return call, ref, nbytes


def modules(only=()):
    """Loads the prebuilt modules (KVA_FI_PREBUILT) through FlashInfer's own
    getters, as the wrappers' plan would, without a GPU (only: these names)."""
    import flashinfer.decode as fdec
    import flashinfer.prefill as fpre
    import flashinfer.mla._batch_mla._backends._fa_common as fmla
    use_prebuilt(os.environ["KVA_FI_PREBUILT"])
    bf, e4, i32 = torch.bfloat16, torch.float8_e4m3fn, torch.int32
    getters = {"decode": lambda: fdec.get_batch_decode_module(bf, bf, bf, i32, D, D, 0, False, False),
               "decode-fp8": lambda: fdec.get_batch_decode_module(bf, e4, bf, i32, D, D, 0, False, False),
               "decode-tc": lambda: fpre.get_batch_prefill_module("fa2", bf, bf, bf, i32, D, D, 0, False, False,
                                                                  False),
               "decode-tc-fp8": lambda: fpre.get_batch_prefill_module("fa2", bf, e4, bf, i32, D, D, 0, False,
                                                                      False, False),
               "prefill": lambda: fpre.get_batch_prefill_module("fa3", bf, bf, bf, i32, D, D, 0, False, False,
                                                                False),
               # bench/peer_mla.py: BatchMLAPagedAttentionWrapper, backend "auto" = fa3 on SM90a, bf16,
               # c_kv 512, k_pe 64, int32 indptr, no profiler (fa3_backend.py's plan)
               "mla": lambda: fmla.get_batch_mla_module("fa3", bf, bf, bf, i32, 512, 64, False)}
    # the functions each wrapper calls on its module (the prefill modules' run is paged_run)
    need = {n: ("plan", "paged_run" if n.startswith(("prefill", "decode-tc")) else "run") for n in getters}
    bad = 0
    for name, get in getters.items():
        if only and name not in only:
            continue
        try:
            m = get()
            # the decode and prefill getters return a namespace of the module's functions, the MLA getter
            # the module wrapped (_BatchMLAModuleProxy)
            inner = getattr(m, "_module", m)
            has = inner.implements_function if hasattr(inner, "implements_function") else vars(inner).__contains__
            missing = [f for f in need[name] if not has(f)]
            if missing:
                raise LookupError(f"no {', '.join(missing)} in the module")
            print(f"module {name} loaded ({', '.join(need[name])}){' as ' + type(m).__name__ if inner is not m else ''}")
        except Exception as e:
            bad += 1
            print(f"module {name} failed: {type(e).__name__}: {str(e)[:160]}")
    return 1 if bad else 0


def main():
    if "--modules" in sys.argv[1:]:
        sys.exit(modules())
    shapes = SHAPES[:1] if "--quick" in sys.argv[1:] else SHAPES
    try:
        pre = os.environ.get("KVA_FI_PREBUILT")
        import flashinfer as fi
        if pre:
            use_prebuilt(pre)
        ver = fi.__version__
    except Exception as e:
        print(f"fi-decode: not run ({str(e)[:120]})")
        return
    print(f"# fi-decode: flashinfer {ver}, {torch.cuda.get_device_name()}"
          f"{', prebuilt modules from ' + pre if pre else ''}", flush=True)
    for R, S, kv in shapes:
        for path, tc in (("cuda-cores", False), ("tensor-cores", True)):
            head = f"fi-decode R={R} S={S} H={H} Hkv={HKV} D={D} B={PAGE} kv {kv} {path}:"
            try:
                call, ref, nbytes = case(fi, R, S, kv, tc)
                err = (call()[0].float() - ref).abs().max().item()
                ok = "ok" if err <= TOL[kv] else "FAIL"
                ms, b2b = timed(call)
                print(f"{head} {ms:.4f} ms {nbytes / ms / 1e9:.3f} TB/s KV  b2b {b2b:.4f} ms "
                      f"{nbytes / b2b / 1e9:.3f} TB/s KV  check {ok} (err {err:.4f}) (flashinfer {ver})",
                      flush=True)
            except Exception as e:
                print(f"{head} failed: {type(e).__name__}: {str(e)[:160]}", flush=True)
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
