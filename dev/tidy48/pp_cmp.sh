#!/bin/bash
# pp_cmp.sh BUILD OLD_INCLUDE [TARGET...]: preprocesses every C / C++ translation unit of the
# ninja TARGETs (default kvattn) of BUILD twice, once with the tree's include/ and once with
# OLD_INCLUDE in its place (-E -P: no line markers), and compares the token streams with
# whitespace squeezed. Equal streams compile to the same object (a Release build has no debug
# line info). tidy48 used it to show that moving kvattn.h's cache section into kvattn_cache.h
# changed no declaration and no declaration order.
set -euo pipefail # a failed preprocessor run stops the script
b=$(cd "$1" && pwd); old=$(cd "$2" && pwd); shift 2
tgts=("$@"); [ ${#tgts[@]} -gt 0 ] || tgts=(kvattn)
new=$(cd "$b/.." && pwd)/include
tmp=$(mktemp -d); n=0; bad=0; api=0
while read -r cmd; do
  src=${cmd##* -c }
  run=$(echo "$cmd" | sed -e 's/ -MT [^ ]*//; s/ -MF [^ ]*//; s/ -MD//; s/ -o [^ ]*/ -E -P/; s/ -c / /')
  (cd "$b" && eval "$run") | tr -s ' \t\n' ' ' >"$tmp/new"
  (cd "$b" && eval "${run//-I$new /-I$old }") | tr -s ' \t\n' ' ' >"$tmp/old"
  [ -s "$tmp/new" ] && [ -s "$tmp/old" ] || { echo "empty preprocessor output: $src" >&2; exit 2; }
  grep -q 'kva_cache_create' "$tmp/new" && api=$((api + 1))
  n=$((n + 1))
  if ! cmp -s "$tmp/old" "$tmp/new"; then echo "differs: $src"; bad=$((bad + 1)); fi
done < <(cd "$b" && ninja -t commands "${tgts[@]}" | grep -E '^/[^ ]*(cc|c\+\+|g\+\+|gcc|clang) .* -c ' | sort -u)
rm -rf "$tmp"
echo "$n translation units ($api see the cache API), $bad with different preprocessed tokens"
[ "$bad" = 0 ]
