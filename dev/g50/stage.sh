#!/usr/bin/env bash
# stage.sh [BUILD]: builds on the dev VM (no GPU needed) what dev/g50/run.sh
# runs on the H200 in one call, and stages it in /work/main/.dev/g50 (git-
# ignored; carry [".dev/g50"]), xz-compressed:
#   new:   test_cuda_graph, test_cuda_plan_update, test_cuda_nan,
#          test_cuda_hidden, test_cuda_mla_nan, the quantized kernels' tests
#          (test_cuda_quant*, test_cuda_qmag), bench_cuda (this tree);
#   base:  bench_cuda_base and test_cuda_nan_old: the same sources linked
#          against main's quantized decode / prefill objects (main's
#          quant_cvt.cuh: lo = inf - inf); test_cuda_nan_old must FAIL
#          (the -inf rows over quantized caches), bench_cuda_base is the
#          A/B baseline of the quantized decode;
#   faults (dev/g50/faults.patch): test_cuda_hidden_fault (a refused sparse
#          MLA run writes 16 bytes of out) and test_cuda_graph_fault (one
#          element of layer 17 after replay B): both must FAIL.
# Release, sm_90a-real, optional libraries off, libgcc / libstdc++ static (as
# dev/g41/stage.sh). Configure BUILD first as dev/g41/stage.sh does.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd) b=${1:-build-cu}
tests="test_cuda_graph test_cuda_plan_update test_cuda_nan test_cuda_hidden test_cuda_mla_nan
       test_cuda_quant test_cuda_quant_attn test_cuda_quant_prefill test_cuda_qmag"
nice -n 10 ninja -C "$b" -j2 kvattn_static $tests bench_cuda
cd "$b"
# ninja's compile command of object $1 with source $2 and output $3
obj_cmd() {
  local o=CMakeFiles/kvattn_obj.dir/$1.o cmd
  cmd=$(ninja -t commands "$o" | tail -1)
  cmd=${cmd//"$root/$1"/"$2"}
  cmd=${cmd//" -MF $o.d"/" -MF $3.d"}
  cmd=${cmd//" -MT $o"/" -MT $3"}
  cmd=${cmd//" -o $o"/" -o $3"}
  [[ $cmd == *" -o $3"* && $cmd != *" $o"* ]] || { echo "obj_cmd: cannot redirect $o" >&2; exit 1; }
  echo "$cmd"
}
# base: main's quantized q staging
quant="decode_mma_quant decode_mma_quant_fp8 decode_mma_quant_i8 decode_mma_quant_v16
       prefill_mma_quant prefill_mma_quant_fp8 prefill_mma_quant_i8 prefill_mma_quant_i8t
       prefill_mma_quant_v16"
rm -rf g50_base && mkdir -p g50_base/src
git -C "$root" archive main src/attn/cuda | tar -x -C g50_base
for f in $quant; do
  c=$(obj_cmd src/attn/cuda/$f.cu "$root/$b/g50_base/src/attn/cuda/$f.cu" g50_base/$f.cu.o)
  eval "nice -n 10 $c"
done
cp libkvattn.a g50_base/libkvattn.a
(cd g50_base && ar r libkvattn.a $(for f in $quant; do echo $f.cu.o; done))
relink() { # target, library, output
  local l
  l=$(ninja -t commands "$1" | tail -1)
  l=${l//" libkvattn.a "/" $2 "}
  l=${l//"-o $1 "/"-o $3 "}
  eval "$l"
}
relink bench_cuda g50_base/libkvattn.a g50_base/bench_cuda_base
relink test_cuda_nan g50_base/libkvattn.a g50_base/test_cuda_nan_old
# faults
rm -rf g50_fault && mkdir -p g50_fault && cp -r "$root/src" "$root/tests" g50_fault/
(cd g50_fault && patch -s -p1 <"$root/dev/g50/faults.patch")
c=$(obj_cmd src/attn/cuda/mla_sparse.cu "$root/$b/g50_fault/src/attn/cuda/mla_sparse.cu" g50_fault/mla_sparse.cu.o)
eval "nice -n 10 $c"
cp libkvattn.a g50_fault/libkvattn.a && (cd g50_fault && ar r libkvattn.a mla_sparse.cu.o)
relink test_cuda_hidden g50_fault/libkvattn.a g50_fault/test_cuda_hidden_fault
t=CMakeFiles/test_cuda_graph.dir/tests/cuda/test_cuda_graph.c.o
c=$(ninja -t commands "$t" | tail -1)
c=${c//"$root/tests/cuda/test_cuda_graph.c"/"$root/$b/g50_fault/tests/cuda/test_cuda_graph.c -I$root/tests/cuda -I$root/tests"}
c=${c//" -MF $t.d"/" -MF g50_fault/test_cuda_graph.c.o.d"}
c=${c//" -MT $t"/" -MT g50_fault/test_cuda_graph.c.o"}
c=${c//" -o $t "/" -o g50_fault/test_cuda_graph.c.o "}
[[ $c != *" $t"* ]] || { echo "cannot redirect $t" >&2; exit 1; }
eval "$c"
l=$(ninja -t commands test_cuda_graph | tail -1)
l=${l//" $t "/" g50_fault/test_cuda_graph.c.o "}
l=${l//"-o test_cuda_graph "/"-o g50_fault/test_cuda_graph_fault "}
eval "$l"
# stage
s=/work/main/.dev/g50
rm -rf "$s" && mkdir -p "$s/bin"
for x in $tests bench_cuda g50_base/bench_cuda_base g50_base/test_cuda_nan_old \
  g50_fault/test_cuda_hidden_fault g50_fault/test_cuda_graph_fault; do cp "$x" "$s/bin/"; done
(cd "$s" && tar -cf - bin | xz -T2 -6 >bins.tar.xz && rm -rf bin)
cp "$root/dev/g50/run.sh" "$s/run.sh"
ls -la "$s"
