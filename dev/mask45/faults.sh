#!/usr/bin/env bash
# faults.sh - planted faults for tests/python/test_fi_custom_mask.py: each edit
# of the custom-mask decoder / wrapper must make that test fail (the clean tree
# passes). Needs a built libkvattn.so:  KVATTN_LIBRARY=PATH PY=venv-python dev/mask45/faults.sh
# Restores each file with git checkout after its fault.
set -u
cd "$(dirname "$0")/../.."
py=${PY:-python3}
export PYTHONPATH=$PWD/python:$PWD/tests/python
m=python/kvattn/_fi_mask.py
w=python/kvattn/flashinfer/__init__.py
run() { (cd tests/python && "$py" -m pytest -q -x -p no:cacheprovider test_fi_custom_mask.py >/dev/null 2>&1); }
run && echo "clean: passes" || { echo "clean: FAILS"; exit 1; }
fault() { # name file python-old python-new
  python3 - "$2" "$3" "$4" <<'PY'
import sys
p, old, new = sys.argv[1:]
s = open(p).read()
assert s.count(old) == 1, (p, old)
open(p, "w").write(s.replace(old, new))
PY
  if run; then echo "FAULT NOT CAUGHT: $1"; bad=1; else echo "caught: $1"; fi
  git checkout -q -- "$2"
}
bad=0
fault "no ancestor-chain check (any lower-triangular row with its diagonal)" $m \
  'want[has] |= t[parents[has]]' 'want |= np.tril(t, -1)'
fault "no context-column check" $m 'np.argwhere(~m[:, :c])' 'np.argwhere(~m[:, :0])'
fault "packed bits read big-endian" $m 'bitorder="little")[: sizes[r]]' 'bitorder="big")[: sizes[r]]'
fault "parent = the first earlier token seen, not the last" $m \
  'q - 1 - np.argmax(low[:, ::-1], 1)' 'np.argmax(low, 1)'
fault "decoded tree not planned" $w 'self._args["tree"] = tree' 'pass'
fault "causal=False given with a mask kept" $w 'causal=tree is not None or _causal_for(' \
  'causal=_causal_for('
fault "a refused mask replaces the plan (planned unmasked before decoding)" $w \
  '        tree = tree_from_mask(' \
  '        self._set_plan(qo, sl, bt, num_qo_heads, num_kv_heads, head_dim_qk, head_dim_vo, page_size, causal, pos_encoding_mode, window_left, logits_soft_cap, sm_scale, q_data_type, kv_data_type, o_data_type)
        tree = tree_from_mask('
exit $bad
