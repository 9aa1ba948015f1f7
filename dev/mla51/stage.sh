#!/usr/bin/env bash
# dev/mla51/stage.sh (a copy of dev/mla50/stage.sh) SCRIPT SIDE[:BIN,BIN]... : stages a device call in
# /work/main/.dev/mla51 (git-ignored; carry [".dev/mla51"]): the bench and
# test binaries of each SIDE (build-cu/side_SIDE/bin, dev/mla51/side.sh),
# xz-compressed (KVA_BINS: only these binaries), the script. KVA_STAGE: another folder.
set -euo pipefail
cd "$(dirname "$0")/../.."
s=${KVA_STAGE:-/work/main/.dev/mla51} scr=$1
shift
rm -rf "$s" && mkdir -p "$s/bins"
for a in "$@"; do # SIDE or SIDE:bin,bin
  v=${a%%:*} bl=${KVA_BINS:-$(ls "build-cu/side_${a%%:*}/bin")}
  [ "$a" = "$v" ] || bl=${a#*:}
  mkdir -p "$s/bins/$v"
  for b in ${bl//,/ }; do cp "build-cu/side_$v/bin/$b" "$s/bins/$v/"; done
done
(cd "$s" && tar -cf - bins | xz -T2 -6 >bins.tar.xz && rm -rf bins)
cp "dev/mla51/$scr" "$s/"
ls -la "$s"
