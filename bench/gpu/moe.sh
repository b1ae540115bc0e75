#!/usr/bin/env bash
# MoE on one GPU: Loom trains a Mixtral-shaped model (8 experts, top 2, hidden 2048, 16 layers,
# 3.6B parameters, random init) in bf16 through `loomctl run` at ZeRO 0, its experts as grouped
# GEMMs (at::_grouped_mm); transformers + PyTorch trains the same model on the same GPU with its
# experts looped one by one (experts_implementation eager) and as grouped GEMMs (grouped_mm, its
# default). Reports tokens/s and the ratios.
# Usage (from the repository root, with Loom's binaries in BIN and their libraries on
# LD_LIBRARY_PATH): bench/gpu/moe.sh BIN OUT [MICRO] [PLUGIN]
# Environment: REFERENCE_EXPERTS (the transformers runs: "eager grouped_mm"), MOE_PROFILE_STEP (a
# Loom step to run under the profiler: its table lands in loom-*-rank0.log), MOE_EXPERTS (extra
# keys of the expert_parallel section, e.g. '"gate_up_impl": "fused"'), MOE_DEEPSPEED (extra keys of
# the deepspeed object, e.g. '"activation_checkpointing": {}').
set -euo pipefail
bin=$1 out=$2 micro=${3:-4} plugin=${4:-} seq=2048 steps=8
mkdir -p "$out"
here=$(cd "$(dirname "$0")" && pwd)
config_dir=$out/mixtral
mkdir -p "$config_dir"
cp "$here/mixtral-config.json" "$config_dir/config.json"
python3 "$here/random_tokens.py" "$out/random.tokens" 320 32000
: > "$out/reference.jsonl"
for experts in ${REFERENCE_EXPERTS-eager grouped_mm}; do
  python3 "$here/hf_reference.py" --config "$config_dir" --seq $seq --micro "$micro" --steps $steps \
    --experts $experts >> "$out/reference.jsonl" 2> "$out/reference-$experts.err" ||
    echo "transformers ($experts) failed: see reference-$experts.err"
done
runs="z0"  # with the plugin, only on its fused kernels (the GPU time is short)
[ -n "$plugin" ] && runs="z0-cuda-kernels"
profile="" experts=""
[ -n "${MOE_PROFILE_STEP:-}" ] && profile=", \"profile_step\": $MOE_PROFILE_STEP"
[ -n "${MOE_DEEPSPEED:-}" ] && experts="$MOE_DEEPSPEED,"
[ -n "${MOE_EXPERTS:-}" ] && experts+="\"expert_parallel\": {\"enabled\": true, \"autoep_size\": 1, $MOE_EXPERTS},"
for run in $runs; do
  kernels=""
  [[ $run == *cuda-kernels ]] && kernels="\"kernels\": {\"plugins\": [\"cuda\"]},"
  cat > "$out/loom-$run.json" <<JSON
{"name": "bench-moe-$run", "kind": "train", "resources": {"ranks": 1, "device": "cuda", "device_memory_gb": 139}, $kernels
 "model": {"config": "$config_dir/config.json", "init_seed": 1},
 "data": {"train": "$out/random.tokens", "seq_len": $seq, "seed": 1},
 "train": {"steps": $steps$profile},
 "deepspeed": {"train_batch_size": $micro, "train_micro_batch_size_per_gpu": $micro, "steps_per_print": 1,
   "bf16": {"enabled": true}, "gradient_clipping": 1.0, "zero_optimization": {"stage": 0},
   $experts
   "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}}}
JSON
  rm -rf "$out/state-$run"  # one job in it: the rank log below is this run's
  "$bin/loomctl" run "$out/loom-$run.json" --state-dir "$out/state-$run" > "$out/loom-$run.out" 2>&1 ||
    echo "loom $run failed: see loom-$run.out"
  cp "$out"/state-$run/jobs/*/attempt-1/rank-0.log "$out/loom-$run-rank0.log" 2>/dev/null || true
done
python3 - "$out" <<'PY'
import json, re, statistics, sys
out = sys.argv[1]
ref = [json.loads(l) for l in open(f"{out}/reference.jsonl") if l.strip()]
hf = {r["experts"]: r for r in ref if r.get("reference")}
rows = [(f"transformers + PyTorch (bf16 autocast, fused AdamW, experts {e})", r["tokens_per_s"], r.get("peak_gib"))
        for e, r in hf.items()]
for run in ("z0", "z0-cuda-kernels"):
    try:
        log = open(f"{out}/loom-{run}-rank0.log").read()
    except OSError:
        continue
    steps = re.findall(r"step (\d+)/(\d+): .*tokens/s (\d+)", log)
    tps = [float(m) for s, n, m in steps if 2 < int(s) <= int(n)]
    peak = re.search(r"device peak ([\d.]+) GiB", log)
    if tps:
        rows.append((f"Loom ZeRO 0 (bf16, fp32 masters, AdamW, grouped GEMM experts"
                     f"{', CUDA kernel plugin' if 'cuda' in run else ''})", statistics.median(tps),
                     float(peak.group(1)) if peak else None))
print("| trainer | tokens/s | vs transformers eager | vs transformers grouped_mm | peak GiB |")
print("|---|---|---|---|---|")
for name, tps, peak in rows:
    ratio = lambda e: f"{tps / hf[e]['tokens_per_s']:.2f}x" if e in hf else "-"
    print(f"| {name} | {tps:,.0f} | {ratio('eager')} | {ratio('grouped_mm')} | {peak if peak is not None else '-'} |")
PY
