#!/usr/bin/env bash
# main.sh - the main job on a fresh machine: install dependencies, build kvattn
# (Release), and run the default benchmark. Extra arguments go to `kvattn bench`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
ninja -C build kvattn_cli >/dev/null
./build/kvattn info
./build/kvattn bench "$@"
