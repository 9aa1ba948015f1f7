#!/usr/bin/env bash
# main.sh - the main job on a fresh machine: install dependencies, build kvattn
# (Release), print `kvattn info`, and run the serving simulation `kvattn
# serve-sim` on its default (vllm bench serve's result table, under a minute
# on 2 cores). Extra arguments go to serve-sim; `bash scripts/main.sh bench
# [options]` runs `kvattn bench` (one attention shape, checked and timed) instead.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
ninja -C build kvattn_cli >/dev/null
./build/kvattn info
if [ "${1:-}" = bench ]; then
  shift
  ./build/kvattn bench "$@"
else
  ./build/kvattn serve-sim "$@"
fi
