b=build-mla/bench_cuda_mla
for sh in "--context 4096 --q-len 1" "--context 8192 --q-len 2"; do
 for e in 0 1 2 4 5; do echo "exp=$e $(KVA_MLA_EXP=$e $b --batch 128 --heads 128 --block-size 64 $sh --iters 10 2>&1 >/dev/null | grep -o 'median.*TFLOP/s')"; done
 echo "v1 $($b --batch 128 --heads 128 --block-size 64 $sh --iters 10 --kernel mla_decode_wgmma_v1_sm90 2>&1 >/dev/null | grep -o 'median.*TFLOP/s')"
done
grep -A1 "Error: Race" $OUT/racecheck_test_cuda_mla.log | grep -o "at .*" | sort | uniq -c | sort -rn | head -12
