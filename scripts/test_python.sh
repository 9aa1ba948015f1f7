#!/usr/bin/env bash
# test_python.sh - the Python package: copies the repository's files (what a
# clean clone has, plus untracked files git does not ignore) to build/py-src,
# `pip install`s it into the venv build/py-venv (CPU-only, no C tests or
# tools: the fast build CI uses; the CMake build directory build/py-build is
# kept between runs), then runs pytest on tests/python.
# Extra arguments go to pytest (e.g. -k decode).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=build/py-venv
src=build/py-src
mkdir -p build
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
# Build backend and test tools, installed once into the venv (the wheel is
# then built without an isolated environment, so no download per run).
"$venv/bin/python" -c "import numpy, pytest, scikit_build_core" 2>/dev/null ||
  "$venv/bin/pip" install -q numpy pytest "scikit-build-core>=0.10"

rm -rf "$src"
mkdir -p "$src"
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  git ls-files -co --exclude-standard -z | xargs -0 cp -p --parents -t "$src"
else # not a git checkout: everything but build outputs and venvs
  tar --exclude='./build*' --exclude='./.venv*' --exclude='./.git' -cf - . | tar -xpf - -C "$src"
fi
"$venv/bin/pip" install -q --no-build-isolation --no-deps --force-reinstall "$src" \
  -C cmake.define.KVA_CUDA=OFF -C build-dir="$PWD/build/py-build"
(cd tests/python && ../../"$venv"/bin/python -m pytest -q -p no:cacheprovider "$@" .)
