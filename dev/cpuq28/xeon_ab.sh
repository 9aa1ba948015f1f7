#!/usr/bin/env bash
# xeon_ab.sh - issue 23's CPU target rows for several kvattn binaries in one
# call, alternated round by round (each round: every binary runs
# `SET=target ROUNDS=1 scripts/cpu_decode_paired.sh`, i.e. f16 and int8 C8,
# GQA 1 and 4, BATCH x 16k, D 128, Hkv 8, NHD, --paired).
# Usage: [ROUNDS=3 THREADS=16 BATCH=16 DEBS=dir] bash dev/cpuq28/xeon_ab.sh tag=path/kvattn ...
# Binaries built elsewhere (Release, -DKVA_CUDA=OFF) may need the optional
# libraries of the dev VM: .deb files in DEBS are unpacked and put on
# LD_LIBRARY_PATH when a binary lacks one.
set -uo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=${ROUNDS:-3}
export THREADS=${THREADS:-16} BATCH=${BATCH:-16} SET=target
if [ -n "${DEBS:-}" ] && [ -d "$DEBS" ]; then
  for d in "$DEBS"/*.deb; do dpkg -x "$d" /tmp/dx; done
  export LD_LIBRARY_PATH=/tmp/dx/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
fi
echo "host: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2) x $(nproc); flags:" \
  "$(grep -m1 -o -w -e avx512_vnni -e avx512_bf16 -e amx_int8 /proc/cpuinfo | sort -u | tr '\n' ' ')"
for a in "$@"; do
  echo "binary ${a%%=*}: ${a#*=} $(ldd "${a#*=}" | grep -c 'not found') libraries not found"
done
for r in $(seq "$ROUNDS"); do
  for a in "$@"; do
    K=${a#*=} ROUNDS=1 bash scripts/cpu_decode_paired.sh 2>&1 | grep -v '^start\|^end' |
      sed "s/^r1 /r$r ${a%%=*} /"
  done
done
