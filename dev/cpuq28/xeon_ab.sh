#!/usr/bin/env bash
# xeon_ab.sh - issue 23's CPU target rows for several kvattn binaries in one
# call, alternated round by round (each round: every binary runs
# `SET=target ROUNDS=1 scripts/cpu_decode_paired.sh`, i.e. f16 and int8 C8,
# GQA 1 and 4, BATCH x 16k, D 128, Hkv 8, NHD, --paired).
# Usage: [ROUNDS=3 THREADS=16 BATCH=16 DEBS=dir FP32=1] bash dev/cpuq28/xeon_ab.sh tag=path/kvattn ...
# FP32=1 adds per round and binary the int8 GQA 4 row on decode_avx512 (fp32
# key scores instead of decode_avx512bf16's VNNI dot products). VNNI_PORTS=1
# first compiles and runs dev/cpuq28/vnni_ports.c (one core: 512-bit VNNI
# and FMA throughput alone and mixed; needs gcc), under a second.
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
if [ "${VNNI_PORTS:-0}" = 1 ]; then
  gcc -O2 -mavx512f -mavx512vnni -o /tmp/vnni_ports dev/cpuq28/vnni_ports.c && taskset -c 0 /tmp/vnni_ports
fi
for a in "$@"; do
  echo "binary ${a%%=*}: ${a#*=} $(ldd "${a#*=}" | grep -c 'not found') libraries not found"
done
for r in $(seq "$ROUNDS"); do
  for a in "$@"; do
    K=${a#*=} ROUNDS=1 bash scripts/cpu_decode_paired.sh 2>&1 | grep -v '^start\|^end' |
      sed "s/^r1 /r$r ${a%%=*} /"
    if [ "${FP32:-0}" = 1 ]; then
      out=$(${a#*=} bench --batch "$BATCH" --context 16384 --kv-heads 8 --iters 16 --no-check \
        --paired --no-ceiling --heads 32 --dtype f16 --kv-quant int8 --threads "$THREADS" \
        --variant decode_avx512 2>&1)
      echo "r$r ${a%%=*} int8 GQA4 t$THREADS nhd B16 fp32-scores" \
        "$(echo "$out" | awk '/attention median/ {print $3, $4}'); paired" \
        "$(echo "$out" | awk '/paired read/ {print $3, "of read passes", $(NF-1), "GB/s"}')"
    fi
  done
done
