#!/usr/bin/env bash
# Muon's cost on the GPU machine: Loom trains the Llama-3.2-1B-shaped model (random init, bf16,
# fp32 masters) on one GPU through `loomctl run`, with AdamW and with Muon (ns_method gram and
# standard) in the same run, at ZeRO stages 0 and 3; reports each run's median step time and
# tokens/s, Muon's cost over AdamW, and the Newton-Schulz time of each method (Muon's step time
# less AdamW's), whose ratio is Gram's gain over the standard iteration.
# Usage (from the repository root, with Loom's binaries in BIN and their libraries on
# LD_LIBRARY_PATH): bench/gpu/muon.sh BIN OUT [MICRO] [GA] [PLUGIN]
# GA (1): gradient accumulation steps; Muon runs once per optimizer step, so its share falls as
# the step grows. PLUGIN: the CUDA kernel plugin for the model's fused kernels (kernels.plugins).
set -euo pipefail
bin=$1 out=$2 micro=${3:-8} ga=${4:-1} plugin=${5:-} seq=2048 steps=10
kernels=""
[ -n "$plugin" ] && kernels="\"kernels\": {\"plugins\": [\"cuda\"]},"
mkdir -p "$out"
here=$(cd "$(dirname "$0")" && pwd)
python3 "$here/random_tokens.py" "$out/random.tokens" 320
for stage in 0 3; do
  for optimizer in adamw gram standard; do
    params='{"type": "AdamW", "params": {"lr": 1e-4}}'
    [ "$optimizer" != adamw ] && params="{\"type\": \"Muon\", \"params\": {\"lr\": 0.02, \"adam_lr\": 1e-4, \"ns_method\": \"$optimizer\"}}"
    run=z$stage-$optimizer
    cat > "$out/loom-$run.json" <<JSON
{"name": "bench-muon-$run", "kind": "train", "resources": {"ranks": 1, "device": "cuda", "device_memory_gb": 139}, $kernels
 "model": {"config": "$here/llama-1b-config.json", "init_seed": 1},
 "data": {"train": "$out/random.tokens", "seq_len": $seq, "seed": 1},
 "train": {"steps": $steps},
 "deepspeed": {"train_batch_size": $((micro * ga)), "train_micro_batch_size_per_gpu": $micro,
   "gradient_accumulation_steps": $ga, "steps_per_print": 1, "bf16": {"enabled": true}, "gradient_clipping": 1.0,
   "zero_optimization": {"stage": $stage}, "optimizer": $params}}
JSON
    rm -rf "$out/state-$run"  # one job in it: the rank log below is this run's
    "$bin/loomctl" run "$out/loom-$run.json" --state-dir "$out/state-$run" > "$out/loom-$run.out" 2>&1 ||
      echo "loom $run failed: see loom-$run.out"
    cp "$out"/state-$run/jobs/*/attempt-1/rank-0.log "$out/loom-$run-rank0.log" 2>/dev/null || true
  done
done
python3 - "$out" "$micro" "$ga" "$seq" "$plugin" <<'PY'
import re, statistics, sys
out, micro, ga, seq = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
print(f"micro batch {micro} x {ga} accumulation steps x {seq} tokens per optimizer step"
      + (", CUDA kernel plugin" if len(sys.argv) > 5 and sys.argv[5] else ""))
print("| ZeRO | optimizer | step ms | tokens/s | vs AdamW | Newton-Schulz ms |")
print("|---|---|---|---|---|---|")
for stage in (0, 3):
    ms = {}
    for optimizer in ("adamw", "gram", "standard"):
        try:
            log = open(f"{out}/loom-z{stage}-{optimizer}-rank0.log").read()
        except OSError:
            continue
        steps = re.findall(r"step (\d+)/(\d+): .*tokens/s (\d+)", log)
        tps = [float(t) for s, n, t in steps if int(s) > 2]
        if tps:
            ms[optimizer] = micro * ga * seq / statistics.median(tps) * 1e3
    for optimizer, step in ms.items():
        base = ms.get("adamw")
        extra = f"{step - base:.1f}" if base and optimizer != "adamw" else ""
        ratio = f"{step / base:.3f}x" if base else ""
        print(f"| {stage} | {optimizer if optimizer == 'adamw' else 'Muon ' + optimizer} | {step:.1f} | "
              f"{micro * ga * seq / step * 1e3:,.0f} | {ratio} | {extra} |")
    if all(k in ms for k in ("adamw", "gram", "standard")) and ms["gram"] > ms["adamw"]:
        print(f"ZeRO {stage}: standard / Gram Newton-Schulz time = "
              f"{(ms['standard'] - ms['adamw']) / (ms['gram'] - ms['adamw']):.2f}")
PY
