#!/usr/bin/env bash
# test_mla_llm.sh - the end-to-end MLA check (examples/llm/deepseek_mla_check.py): a small
# random-weight DeepSeek-V3 in transformers (2 layers, H 16, Dc 512, Dr 64, Dn 128, Dv 128)
# against the same weights with every attention layer on kvattn's MLA (latent paged cache,
# kva_mla_run: compute-friendly prompt, absorbed decode), f32 and bf16 caches. Needs a
# Python with torch and transformers (PYTHON, default /work/venv-llm/bin/python) and the
# shared library (KVATTN_LIBRARY, default build/libkvattn.so). Prints both reports; exits
# non-zero if either check fails. No download: the model is built from a config.
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-/work/venv-llm/bin/python}
export KVATTN_LIBRARY=${KVATTN_LIBRARY:-build/libkvattn.so}
[ -f "$KVATTN_LIBRARY" ] || { echo "test_mla_llm.sh: $KVATTN_LIBRARY not built" >&2; exit 1; }
rc=0
for dt in f32 bf16; do
  "$py" examples/llm/deepseek_mla_check.py --dtype "$dt" "$@" 2> >(grep -v -i deprecat >&2) || rc=1
done
exit $rc
