#!/usr/bin/env bash
# deps.sh - installs the Debian packages kvattn builds with, if any is missing.
# Sourced by main.sh and test.sh; safe to run repeatedly.
set -euo pipefail
kva_pkgs=(build-essential cmake ninja-build libssl-dev libxxhash-dev libcjson-dev pkg-config)
# The DCP combine over MPI (kvattn_mpi) and its 2-rank test (mpirun).
kva_pkgs+=(libopenmpi-dev openmpi-bin)
# scripts/fuzz.sh: clang 14 with libFuzzer and its OpenMP runtime.
kva_pkgs+=(clang-14 libclang-rt-14-dev libomp-14-dev)
kva_missing=()
for p in "${kva_pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || kva_missing+=("$p")
done
if [ ${#kva_missing[@]} -gt 0 ]; then
  echo "deps: installing ${kva_missing[*]}" >&2
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${kva_missing[@]}" >/dev/null
fi

# The Python package's test (scripts/test_python.sh) makes a venv: Debian's
# python3 needs python3-venv for that (pip, numpy, pytest and
# scikit-build-core then come from PyPI into the venv).
kva_py_missing=()
for p in python3 python3-venv; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || kva_py_missing+=("$p")
done
if [ ${#kva_py_missing[@]} -gt 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "deps: installing ${kva_py_missing[*]}" >&2
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${kva_py_missing[@]}" >/dev/null
fi
