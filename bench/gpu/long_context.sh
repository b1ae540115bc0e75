#!/usr/bin/env bash
# The longest sequence the Llama-3.2-1B-shaped model (random init, bf16, fp32 masters, AdamW,
# ZeRO 0, one sample per step, no activation checkpointing) trains at on one GPU with sp = 1, by
# how the loss is computed: "whole" (model.loss_block_rows = seq_len: one block, an fp32 copy of
# every logit), "chunked" (the default: blocks of at most 2^24 logits, never an fp32 copy of the
# logits) and, with the CUDA kernel plugin, "fused" (its cross entropy). Each ladder climbs in
# steps of 8192 tokens until a run fails; prints each run's result and device peak.
# Usage (from the repository root, with Loom's binaries in BIN and their libraries on
# LD_LIBRARY_PATH): bench/gpu/long_context.sh BIN OUT [PLUGIN]
set -uo pipefail
bin=$1 out=$2 plugin=${3:-} steps=2
mkdir -p "$out"
here=$(cd "$(dirname "$0")" && pwd)
python3 "$here/random_tokens.py" "$out/random.tokens" 100
modes="whole chunked"
[ -n "$plugin" ] && modes="$modes fused"
echo "| loss | seq_len | result | device peak | tokens/s (step 2) |"
echo "|---|---|---|---|---|"
for mode in $modes; do
  case $mode in
    whole) ladder="16384 24576 32768 40960 49152" ;;
    *) ladder="32768 40960 49152 57344 65536 73728" ;;
  esac
  for seq in $ladder; do
    run=$mode-$seq model="\"config\": \"$here/llama-1b-config.json\", \"init_seed\": 1" kernels=""
    [ "$mode" = whole ] && model="$model, \"loss_block_rows\": $seq"
    [ "$mode" = fused ] && kernels="\"kernels\": {\"plugins\": [\"cuda\"]},"
    cat > "$out/loom-$run.json" <<JSON
{"name": "bench-long-$run", "kind": "train", "resources": {"ranks": 1, "device": "cuda", "device_memory_gb": 139}, $kernels
 "model": {$model},
 "data": {"train": "$out/random.tokens", "seq_len": $seq, "seed": 1},
 "train": {"steps": $steps},
 "deepspeed": {"train_batch_size": 1, "train_micro_batch_size_per_gpu": 1, "steps_per_print": 1,
   "bf16": {"enabled": true}, "gradient_clipping": 1.0, "zero_optimization": {"stage": 0},
   "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}}}
JSON
    ok=1
    rm -rf "$out/state-$run"  # one job in it: the rank log below is this run's
    timeout 300 "$bin/loomctl" run "$out/loom-$run.json" --state-dir "$out/state-$run" > "$out/loom-$run.out" 2>&1 || ok=0
    log=$(ls "$out"/state-$run/jobs/*/attempt-1/rank-0.log 2>/dev/null | head -1)
    peak=$(grep -o 'device peak [0-9.]* [KMG]iB' "$log" 2>/dev/null | head -1 | sed 's/device peak //')
    tps=$(grep -o 'step 2/2: .*tokens/s [0-9]*' "$log" 2>/dev/null | grep -o '[0-9]*$')
    if [ $ok = 1 ]; then
      echo "| $mode | $seq | trains | ${peak:-?} | ${tps:-?} |"
    else
      why=$(grep -o 'out of memory\|OutOfMemory\|CUDA error[^;]*' "$out/loom-$run.out" "$log" 2>/dev/null | head -1 | cut -d: -f2-)
      echo "| $mode | $seq | fails (${why:-see loom-$run.out}) | | |"
      break
    fi
  done
done
