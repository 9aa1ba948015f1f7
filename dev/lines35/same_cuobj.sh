#!/usr/bin/env bash
# same_cuobj.sh - compares CUDA objects (nvcc .cu.o) of two builds without
# cuobjdump: the embedded device code (the .nv_fatbin section: every cubin and
# PTX of the object) must be byte-identical, and the host code identical in
# objdump -dr (text and relocations). Other bytes (nvcc's temporary file name
# in the host object's strings, local label numbers) are not compared.
# Usage: bash dev/lines35/same_cuobj.sh BASE_BUILD NEW_BUILD OBJ...
#   OBJ: paths relative to the build folders, e.g.
#   CMakeFiles/kvattn_obj.dir/src/attn/cuda/decode_mma.cu.o
set -euo pipefail
base=$1 new=$2
shift 2
bad=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for o in "$@"; do
    for side in base new; do
        f=${!side}/$o
        if objdump -h "$f" | grep -q ' \.nv_fatbin '; then
            objcopy -O binary --only-section=.nv_fatbin "$f" "$tmp/$side.fatbin"
        else
            : > "$tmp/$side.fatbin"
        fi
        objdump -dr --no-show-raw-insn "$f" | sed 1,2d > "$tmp/$side.host"
    done
    dev=same host=same
    cmp -s "$tmp/base.fatbin" "$tmp/new.fatbin" || { dev=DIFFERENT; bad=1; }
    cmp -s "$tmp/base.host" "$tmp/new.host" || { host=DIFFERENT; bad=1; }
    printf 'device %-9s (%8d bytes)  host %-9s  %s\n' "$dev" "$(wc -c < "$tmp/new.fatbin")" "$host" "$o"
done
exit $bad
