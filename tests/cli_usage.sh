#!/bin/sh
# cli_usage.sh KVATTN - docs/cli.md's exit statuses of the `kvattn` CLI: a bad
# value of any command's flag is a usage error (exit 2) with a "kvattn:"
# message on stderr, never a crash, a library error (exit 1) or a run; small
# valid edge values run (exit 0). ctest runs it (label cpu).
K=${1:?usage: cli_usage.sh path/to/kvattn}
fails=0
n=0
tmp=${TMPDIR:-/tmp}/kva_cli_usage.$$
# expect RC ARGS...: runs kvattn ARGS, checks the exit status (and, for 2,
# that stderr names the problem).
expect() {
    want=$1
    shift
    n=$((n + 1))
    "$K" "$@" >"$tmp.out" 2>"$tmp.err"
    rc=$?
    if [ "$rc" != "$want" ]; then
        echo "FAIL: kvattn $*: exit $rc, expected $want: $(head -c 300 "$tmp.err")"
        fails=$((fails + 1))
    elif [ "$want" = 2 ] && ! grep -q "kvattn" "$tmp.err"; then
        echo "FAIL: kvattn $*: exit 2 without a message on stderr"
        fails=$((fails + 1))
    fi
}
# expect_msg RC TEXT ARGS...: expect RC ARGS..., and stderr says TEXT.
expect_msg() {
    want=$1
    text=$2
    shift 2
    f0=$fails
    expect "$want" "$@"
    if [ "$fails" = "$f0" ] && ! grep -qF -- "$text" "$tmp.err"; then
        echo "FAIL: kvattn $*: stderr does not say \"$text\": $(head -c 300 "$tmp.err")"
        fails=$((fails + 1))
    fi
}
IX="bench --indexer --threads 1 --iters 1 --warmup 0 --batch 1 --context 64 --q-len 2 --heads 2 --head-dim 16 --topk 8 --block-size 16"
for flag in --batch --q-len --heads --head-dim --topk --block-size --iters; do
    expect 2 $IX $flag 0
done
for flag in --batch --context --q-len --heads --head-dim --topk --block-size --threads --iters --warmup; do
    expect 2 $IX $flag -1
    expect 2 $IX $flag 1x
    expect 2 $IX $flag ""
    expect 2 $IX $flag 2147483648
done
expect 2 $IX --head-dim 12
expect 2 $IX --head-dim 584
expect 2 $IX --heads 4097
expect 2 $IX --topk 65537
expect 2 $IX --block-size 65537
expect 2 $IX --threads 1025
expect 2 $IX --dtype f32
expect 2 $IX --kv-quant int8
expect 2 $IX --no-such-flag
expect 0 $IX
expect 0 $IX --context 0
expect 0 $IX --block-size 1 --context 5
expect 0 $IX --head-dim 8 --topk 1

B="bench --threads 1 --iters 1 --warmup 0 --no-ceiling --batch 1 --context 8 --heads 2 --kv-heads 1 --head-dim 8 --block-size 4"
for flag in --batch --q-len --heads --kv-heads --head-dim --block-size; do
    expect 2 $B $flag 0
done
expect 2 $B --head-dim 12
expect 2 $B --causal 2
expect 2 $B --window -2
expect 2 $B --attention-chunk -1
expect 2 $B --dtype f64
expect 2 $B --tree x
expect 2 $B --heads 3 --kv-heads 2
expect 0 $B --window 0
expect 0 $B --attention-chunk 1
expect 0 $B --window 0 --attention-chunk 1
expect 0 $B --tree chain --q-len 3
expect 0 $B --tree random --q-len 1
# kvattn.h's mask rules as usage errors (before any library call): a draft
# tree needs the causal mask, takes no window, chunk, ALiBi or sweep, and at
# most KVA_MAX_TREE_TOKENS tokens; a chunk needs the causal mask.
expect 2 $B --tree chain --q-len 3 --window 0
expect 2 $B --tree star --q-len 3 --window 5
expect 2 $B --tree chain --q-len 3 --attention-chunk 4
expect 2 $B --tree random --q-len 3 --alibi
expect 2 $B --tree chain --q-len 3 --causal 0
expect 2 $B --tree chain --q-len 65
expect 2 $B --tree chain --sweep decode
expect 2 $B --tree chain --mode mixed
expect 2 $B --attention-chunk 4 --causal 0
expect 0 $B --tree chain --q-len 64 --window -1 --attention-chunk 0 --sinks --softcap 5
expect 0 $B --window 2 --causal 0

S="serve-sim --threads 1 --num-prompts 2 --input-len 8 --output-len 2 --prefix-len 4 --layers 1 --num-heads 2 --num-kv-heads 1 --head-dim 8 --block-size 4 --num-blocks 64 --dtype f32"
for flag in --num-prompts --output-len --layers --num-heads --num-kv-heads --block-size --max-num-seqs --max-num-batched-tokens; do
    expect 2 $S $flag 0
done
expect 2 $S --range-ratio 1
expect 2 $S --request-rate 0
expect 2 $S --hash md5
expect 2 $S --cascade maybe
expect 2 $S --num-blocks 3
expect 0 $S --verify --attention-chunk 1
# --chunk-global-every without a chunk would be ignored: refused; a preset's
# N with --attention-chunk 0 (every layer global) runs.
expect 2 $S --chunk-global-every 2
expect 2 $S --chunk-global-every 2 --attention-chunk 0
MD="serve-sim --threads 1 --num-prompts 1 --input-len 8 --output-len 1 --prefix-len 0 --model deepseek-v2-lite --layers 1 --num-heads 2 --block-size 4 --num-blocks 16 --dtype f32"
expect 0 $MD
expect 2 $MD --chunk-global-every 2
expect 0 $S --chunk-global-every 0
expect 0 $S --verify --attention-chunk 4 --chunk-global-every 1
SC="serve-sim --threads 1 --num-prompts 1 --input-len 8 --output-len 1 --prefix-len 0 --num-heads 8 --num-kv-heads 8 --head-dim 8 --block-size 4 --num-blocks 32 --dtype f32"
expect 0 $SC --model llama4-scout-slice --attention-chunk 0
expect 0 $SC --model llama4-scout-slice --chunk-global-every 2
expect 0 $S --verify --num-blocks 8 --max-num-seqs 1
# --cascade on with layers kvattn.h keeps from a cascade (MLA, a local
# chunk: kva_plan_create's KVA_STATUS_UNSUPPORTED) is a usage error before
# the run, not a failed model step (exit 1); auto runs them plainly.
expect 2 $MD --cascade on
expect 2 $S --cascade on --attention-chunk 4
expect 2 $S --cascade on --attention-chunk 4 --chunk-global-every 2
expect 2 $SC --model llama4-scout-slice --cascade on
expect 0 $SC --model llama4-scout-slice --cascade on --attention-chunk 0
expect 0 $MD --cascade auto
expect 0 $S --cascade on
# A decimal below DBL_MIN is a number (strtod's underflow ERANGE): in range
# it runs, out of range it says so; above DBL_MAX it is refused.
expect 0 $S --range-ratio 1e-320
expect 0 $S --range-ratio 1e-400
expect 2 $S --request-rate 1e-320
expect 2 $S --request-rate 1e400

DC="bench --dcp 2 --seq-len 64 --heads 2 --kv-heads 1 --head-dim 8 --block-size 4 --threads 1 --iters 1"
expect 2 $DC --head-dim 12
expect 2 $DC --dcp 0
expect 2 $DC --heads 3 --kv-heads 2
expect 2 $DC --block-size 0
expect 2 $DC --interleave 0
expect 0 $DC --dcp 1
expect 0 $DC --seq-len 1
# --flag=value (docs/cli.md): the value after '=', never the next argument.
expect 0 bench --dcp=2 --seq-len=64 --heads=2 --kv-heads=1 --head-dim=8 --block-size=4 --threads=1 --iters=1
expect 2 $DC --dcp= 2
expect 2 $DC --seq-len= 64
expect 2 $DC --seq-len
expect 0 bench --mla --threads=1 --iters=1 --warmup=0 --batch=1 --context=16 --heads=2
expect 0 bench --mla-sparse --threads=1 --iters=1 --warmup=0 --batch=1 --context=64 --topk=8 --heads=2
expect 0 bench --indexer --threads=1 --iters=1 --warmup=0 --batch=1 --context=64 --q-len=2 --heads=2 --head-dim=16 --topk=8 --block-size=16
expect 0 bench --cascade --threads=1 --iters=1 --warmup=0 --batch=2 --shared-prefix=16 --suffix=4 --heads=2 --kv-heads=1 --head-dim=8 --block-size=4 --no-ceiling
for mode in --mla --mla-sparse --indexer --cascade; do
    expect 2 bench $mode --threads= 1
    expect 2 bench $mode --iters
done
# An unknown flag is "unknown option" wherever it stands, last on the line
# too (where it has no value to read), in every bench mode as in bench and
# serve-sim; a known flag last on the line still "needs a value".
for mode in --mla --mla-sparse --indexer --cascade "--dcp 2"; do
    expect_msg 2 "unknown option '--sinks'" bench $mode --threads 1 --sinks
    expect_msg 2 "unknown option '--no-such" bench $mode --no-such=1 --threads 1
    expect_msg 2 "--iters needs a value" bench $mode --threads 1 --iters
done
expect_msg 2 "unknown option '--no-such'" bench --threads 1 --no-such
expect_msg 2 "unknown option '--no-such'" serve-sim --threads 1 --no-such
# int8-token-v16 keeps V in the cache dtype, f16 or bf16 (kvattn_cache.h):
# --dtype f32 is a usage error in bench as in serve-sim; f16 / bf16 run.
expect_msg 2 "int8-token-v16" $B --kv-quant int8-token-v16 --dtype f32
expect_msg 2 "int8-token-v16" $S --kv-quant int8-token-v16 --dtype f32
for dt in f16 bf16; do
    expect 0 $B --kv-quant int8-token-v16 --dtype $dt
    S16=$(echo "$S" | sed "s/--dtype f32/--dtype $dt/")
    expect 0 $S16 --kv-quant int8-token-v16
done

M="bench --mla --threads 1 --iters 1 --warmup 0 --batch 1 --context 16 --heads 2"
expect 2 $M --kv-lora-rank 12
expect 2 $M --kv-lora-rank 520
expect 2 $M --rope-dim 12
expect 2 $M --v-dim 12
expect 2 $M --heads 4097
expect 2 $M --threads 1025
expect 0 $M
MS="bench --mla-sparse --threads 1 --iters 1 --warmup 0 --batch 1 --context 64 --topk 8 --heads 2"
expect 2 $MS --kv-lora-rank 12
expect 2 $MS --heads 4097
expect 2 $MS --topk 65537
expect 2 $MS --threads 1025
expect 0 $MS

# A number is an optional '-' and decimal digits (integers) or a decimal
# fraction with an optional exponent (rates, ratios, soft-cap, sizes):
# docs/cli.md. A space, '+', hex, octal-looking prefixes, inf or nan is a
# usage error in every command's numeric flags (one parser, tools/cli_args.c).
for v in " 1" "1 " "+1" 0x1 "1.0" 1e0 -; do
    expect 2 $B --batch "$v"
    expect 2 $S --num-prompts "$v"
    expect 2 $IX --batch "$v"
    expect 2 $DC --seq-len "$v"
    expect 2 $M --batch "$v"
    expect 2 $MS --batch "$v"
done
for v in " 1" "+1" 0x1 "1 " +0 " 0" 0x0; do
    expect 2 $B --seed "$v"
    expect 2 $S --seed "$v"
done
for v in " 1" "+1" 0x1p0 "1 " "1e" "." "-.e1" nan infinity " inf" +inf; do
    expect 2 $B --softcap "$v"
    expect 2 $S --request-rate "$v"
done
expect 2 $B --softcap inf
expect 0 $S --request-rate inf
for v in " 0.5" "+0.5" 0x0.8p0; do
    expect 2 $S --range-ratio "$v"
done
for v in " 512M" "+512M" 0x20M "512 M" inf; do
    expect 2 $S --kv-cache-mem "$v"
done
expect 0 $B --seed 010
expect 0 $B --softcap 2.5e1
expect 0 $B --softcap .5
expect 0 $B --softcap 5.
expect 0 $B --batch 01
expect 0 $S --range-ratio .5 --request-rate 1e3 --kv-cache-mem 1.5M --num-blocks 0
expect 0 $S --seed 18446744073709551615

expect 2 no-such-command
expect 0 --version
rm -f "$tmp.out" "$tmp.err"
echo "$((n - fails)) passed, $fails failed"
[ "$fails" = 0 ]
