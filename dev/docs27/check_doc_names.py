#!/usr/bin/env python3
"""List backticked file names, paths and identifiers in docs/*.md and
README.md that match nothing in the tracked tree (issue 15: docs true to the
code). Usage: python3 dev/docs27/check_doc_names.py [files...]
Run from the repository root. Prints `doc:line: token (what was looked for)`;
exits 1 when something is missing. A token may be allowed to be absent
(commands, options, branch names...) by the ALLOW list below or by being
marked as gone in its sentence; read each hit, do not trust it blindly."""
import os, re, subprocess, sys

files = subprocess.run(['git', 'ls-files'], capture_output=True, text=True).stdout.split()
fileset = set(files)
basenames = {}
for f in files:
    basenames.setdefault(os.path.basename(f), []).append(f)
dirs = set()
for f in files:
    d = os.path.dirname(f)
    while d:
        dirs.add(d); d = os.path.dirname(d)
src_text = None
def corpus():
    global src_text
    if src_text is None:
        parts = []
        for f in files:
            if f.endswith('.md') or f.startswith('bench/results/') or f.startswith('docs/'):
                continue
            try:
                with open(f, errors='replace') as fh:
                    parts.append(fh.read())
            except OSError:
                pass
        src_text = '\n'.join(parts)
    return src_text

EXT = r'\.(c|h|cu|cuh|inc|py|sh|md|txt|json|cmake|patch|toml|cfg|yml|yaml)$'
# names of other projects (vLLM, NCCL, MPI) the docs cite on purpose
ALLOW = {'cp_kv_cache_interleave_size', 'local_len', 'parent_hash', 'new_rid',
         'reshape_and_cache_flash', 'calculate_kv_scales', 'long_prefill_token_threshold',
         '--bind-to', 'nccl_device.h', 'quant_model_description.json',
         'model.safetensors.index.json'}
missing = 0
docs = sys.argv[1:] or sorted([f for f in files if f.startswith('docs/') and f.endswith('.md')
                               and not f.startswith('docs/results/')] + ['README.md'])
for doc in docs:
    text = open(doc).read()
    in_fence = False
    for ln, line in enumerate(text.split('\n'), 1):
        if line.startswith('```'):
            in_fence = not in_fence
            continue
        toks = re.findall(r'`([^`]+)`', line) if not in_fence else []
        # links [x](path)
        for m in re.finditer(r'\]\(([^)#\s]+)(#[^)]*)?\)', line):
            target = m.group(1)
            if re.match(r'https?:|mailto:', target):
                continue
            p = os.path.normpath(os.path.join(os.path.dirname(doc), target))
            if p not in fileset and p not in dirs:
                print(f'{doc}:{ln}: link {target} (no such tracked file {p})'); missing += 1
        for tok in toks:
            for t in re.split(r'[\s,()]+', tok):
                t = t.strip('.:;*')
                if not t:
                    continue
                # brace forms a.{cu,h} and a_{x,y}.cu
                m = re.match(r'^(.*)\{([^}]*)\}(.*)$', t)
                cands = [m.group(1) + x + m.group(3) for x in m.group(2).split(',')] if m else [t]
                for c in cands:
                    if '*' in c or '<' in c or '$' in c or '=' in c:
                        continue
                    if re.search(EXT, c) and re.match(r'^[\w./-]+$', c):
                        if c in fileset or os.path.basename(c) in basenames or c in dirs:
                            if '/' in c and c not in fileset and not any(f.endswith('/' + c) or f == c for f in files) and c not in dirs:
                                print(f'{doc}:{ln}: path {c} (basename exists elsewhere: {basenames.get(os.path.basename(c))})'); missing += 1
                            continue
                        if c not in ALLOW:
                            print(f'{doc}:{ln}: file {c}'); missing += 1
                        continue
                    for c in re.split(r'(?:->|[.\[\]:;!&|+/"\'])+', c):
                      if re.match(r'^(kva_|kva__|KVA_|kvattn_)\w+$', c):
                        if not c.endswith('_') and not re.search(r'\b' + re.escape(c) + r'\b', corpus()):
                            print(f'{doc}:{ln}: identifier {c}'); missing += 1
                      elif re.match(r'^[a-z][a-z0-9]*(_[a-z0-9]+)+$', c) and len(c) > 6:
                        if c not in ALLOW and not re.search(r'\b' + re.escape(c) + r'\b', corpus()):
                            print(f'{doc}:{ln}: name {c}'); missing += 1
                      elif re.match(r'^--[a-z][\w-]*$', c):
                        if c not in ALLOW and c not in corpus():
                            print(f'{doc}:{ln}: option {c}'); missing += 1
sys.exit(1 if missing else 0)
