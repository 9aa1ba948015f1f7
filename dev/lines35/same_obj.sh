#!/usr/bin/env bash
# same_obj.sh - compares the object code of two copies of a CMake object
# directory (e.g. kvattn_obj.dir built from main, saved aside, and the same
# directory rebuilt from the working tree): for every .o, the disassembly
# (objdump -d --no-show-raw-insn, file names cut) and the symbol table with
# sizes (nm -S) must match. Prints one line per differing object and a count.
# Usage: bash dev/lines35/same_obj.sh BASE_DIR NEW_DIR
set -euo pipefail
base=$1 new=$2
n=0 bad=0
while IFS= read -r o; do
    n=$((n + 1))
    a=$( (objdump -d --no-show-raw-insn "$base/$o" | sed 1,2d; nm -S "$base/$o") | sha256sum)
    b=$( (objdump -d --no-show-raw-insn "$new/$o" | sed 1,2d; nm -S "$new/$o") | sha256sum)
    [ "$a" = "$b" ] || { echo "DIFFERENT $o"; bad=$((bad + 1)); }
done < <(cd "$base" && find . -name '*.o' | sort)
echo "$n objects compared, $bad different"
[ "$bad" = 0 ]
