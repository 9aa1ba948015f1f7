#!/usr/bin/env bash
# test_python.sh - the Python package: copies the repository's files (what a
# clean clone has, plus untracked files git does not ignore) to build/py-src,
# `pip install`s it into the venv build/py-venv (CPU-only, no C tests or
# tools: the fast build CI uses; the CMake build directory build/py-build is
# kept between runs), then runs pytest on tests/python.
#   KVA_PY_PREBUILT=PATH  the wheel packs this already built libkvattn.so
#                         instead of compiling the library (scripts/test.sh
#                         passes the Release build's; CMake option
#                         KVA_PYTHON_PREBUILT)
#   KVA_PY_VENV=DIR       use this venv instead of build/py-venv (made if
#                         absent), e.g. one with torch installed, so that
#                         tests/python/test_torch.py runs instead of skipping
# Extra arguments go to pytest (e.g. -k decode).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${KVA_PY_VENV:-build/py-venv}
src=build/py-src
mkdir -p build
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
py="$(cd "$venv" && pwd)/bin/python" # absolute, symlink kept (it marks the venv)
# Build backend and test tools (ml_dtypes: the numpy bfloat16 / fp8 cases of
# tests/python, which skip without it), installed once into the venv (the wheel is
# then built without an isolated environment, so no download per run).
"$venv/bin/python" -c "import numpy, pytest, scikit_build_core, ml_dtypes" 2>/dev/null ||
  "$venv/bin/pip" install -q numpy pytest "scikit-build-core>=0.10" ml_dtypes

rm -rf "$src"
mkdir -p "$src"
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  git ls-files -co --exclude-standard -z | xargs -0 cp -p --parents -t "$src"
else # not a git checkout: everything but build outputs and venvs
  tar --exclude='./build*' --exclude='./.venv*' --exclude='./.git' -cf - . | tar -xpf - -C "$src"
fi
# Always defined (empty: build the library), so that the kept build directory
# does not remember an earlier run's choice.
prebuilt=""
if [ -n "${KVA_PY_PREBUILT:-}" ]; then
  [ -f "$KVA_PY_PREBUILT" ] || { echo "test_python.sh: KVA_PY_PREBUILT=$KVA_PY_PREBUILT: no such file" >&2; exit 1; }
  prebuilt=$(realpath "$KVA_PY_PREBUILT")
fi
"$venv/bin/pip" install -q --no-build-isolation --no-deps --force-reinstall "$src" \
  -C cmake.define.KVA_CUDA=OFF -C build-dir="$PWD/build/py-build" \
  -C cmake.define.KVA_PYTHON_PREBUILT="$prebuilt"
if [ -n "${KVA_PY_PREBUILT:-}" ]; then
  # The installed package must load the library it was given.
  lib=$(cd tests/python && "$py" -c "import kvattn; print(kvattn.LIBRARY_PATH)")
  echo "kvattn package over $lib"
  cmp "$KVA_PY_PREBUILT" "$lib"
fi
(cd tests/python && "$py" -m pytest -q -p no:cacheprovider "$@" .)
