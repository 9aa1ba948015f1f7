#!/usr/bin/env bash
# same_code.sh - checks that the changes since REV to source files touch only
# comments and white space: every changed C/C++/CUDA file under src/ is
# reduced to its token text (comments removed by the preprocessor in
# -fpreprocessed mode, which expands no macro or include; runs of white space
# folded to one space) at REV and in the working tree, and the two must match.
# Prints one line per file, "same" or "DIFFERENT", and exits 1 on any
# difference. __LINE__/__FILE__ are not used under src/ (checked here too), so
# equal token text means the compiler sees the same program.
# Usage: bash dev/lines35/same_code.sh [REV]   (default: main)
set -euo pipefail
cd "$(dirname "$0")/../.."
rev=${1:-main}
tokens() { # $1 = language, stdin = source
    gcc -x "$1" -fpreprocessed -E -P -w - 2>/dev/null | tr -s ' \t\n' ' '
}
if grep -rqE '__LINE__|__FILE__' src; then
    echo "src/ uses __LINE__ or __FILE__: line moves can change code" >&2
    exit 1
fi
bad=0
for f in $(git diff --name-only "$rev" -- src); do
    case "$f" in
        *.c | *.h | *.inc) lang=c ;;
        *.cu | *.cuh | *.cpp) lang=c++ ;;
        *) echo "skipped (not C/C++/CUDA): $f"; continue ;;
    esac
    a=$(git show "$rev:$f" 2>/dev/null | tokens $lang | sha256sum)
    b=$(tokens $lang < "$f" | sha256sum)
    if [ "$a" = "$b" ]; then echo "same       $f"; else echo "DIFFERENT  $f"; bad=1; fi
done
exit $bad
