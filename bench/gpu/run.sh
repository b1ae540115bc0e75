#!/usr/bin/env bash
# bench/gpu on the GPU machine: Loom trains a Llama-3.2-1B-shaped model (random init) in bf16 on
# one GPU through the real control plane (`loomctl run`: embedded planner, loomd, one rank, NCCL
# for the gradients when there are several), at ZeRO stages 0 and 3; transformers + PyTorch
# trains the same model on the same GPU; the bf16 matmul rate is measured in the same run.
# With PLUGIN (the CUDA kernel plugin, libloom_kernels_cuda.so), both stages run again with the
# model's rms_norm, rope, swiglu and cross entropy on its fused kernels (the job's
# kernels.plugins).
# Usage (from the repository root, with Loom's binaries in BIN and their libraries on
# LD_LIBRARY_PATH): bench/gpu/run.sh BIN OUT [MICRO] [PLUGIN]
# RUNS (Loom's runs, default all that apply: z0 z3 z0-cuda-kernels z3-cuda-kernels z2-offload
# z3-offload-param) and DS_STAGES (DeepSpeed's ZeRO stages, default "0 3 3-offload-param") pick a
# subset when time on the GPU is short.
set -euo pipefail
bin=$1 out=$2 micro=${3:-8} plugin=${4:-} seq=2048 steps=12
mkdir -p "$out"
here=$(cd "$(dirname "$0")" && pwd)
python3 "$here/random_tokens.py" "$out/random.tokens" 320
python3 "$here/hf_reference.py" --config "$here/llama-1b-config.json" --seq $seq --micro "$micro" --steps $steps \
  --profile > "$out/reference.jsonl" 2> "$out/reference.err" || echo "reference failed: see reference.err"
# DeepSpeed itself, where it imports (scripts/gpu/fetch-wheels brings it and its pure-Python
# dependencies along; PYTHONPATH points at them).
for stage in ${DS_STAGES-0 3 3-offload-param}; do
  extra=()
  [[ $stage == *-offload-param ]] && extra=(--offload-param)
  python3 "$here/deepspeed_reference.py" --config "$here/llama-1b-config.json" --stage "${stage%%-*}" --seq $seq \
    --micro "$micro" --steps $steps "${extra[@]}" >> "$out/reference.jsonl" 2> "$out/deepspeed-z$stage.err" ||
    echo "deepspeed stage $stage did not run: see reference.jsonl and deepspeed-z$stage.err"
done
runs="z0 z3 z3-offload-param"
[ -n "$plugin" ] && runs="$runs z0-cuda-kernels z3-cuda-kernels"
# ZeRO-Offload: the optimizer step on the host, on the CPU plugin's AdamW (16 cores here).
cpu_plugin=$(cd "$bin/.." && pwd)/lib/libloom_kernels_cpu.so
[ -f "$cpu_plugin" ] && runs="$runs z2-offload"
for run in ${RUNS:-$runs}; do
  stage=${run:1:1}
  kernels="" zero="{\"stage\": $stage}"
  [[ $run == *cuda-kernels ]] && kernels="\"kernels\": {\"plugins\": [\"cuda\"]},"
  if [[ $run == *offload ]]; then
    kernels="\"kernels\": {\"plugins\": [\"cpu\"]},"
    zero="{\"stage\": $stage, \"offload_optimizer\": {\"device\": \"cpu\", \"pin_memory\": true}}"
  fi
  [[ $run == *offload-param ]] && zero="{\"stage\": 3, \"offload_param\": {\"device\": \"cpu\", \"pin_memory\": true}}"
  cat > "$out/loom-$run.json" <<JSON
{"name": "bench-gpu-$run", "kind": "train", "resources": {"ranks": 1, "device": "cuda", "device_memory_gb": 139}, $kernels
 "model": {"config": "$here/llama-1b-config.json", "init_seed": 1},
 "data": {"train": "$out/random.tokens", "seq_len": $seq, "seed": 1},
 "train": {"steps": $steps, "profile_step": $steps},
 "deepspeed": {"train_batch_size": $micro, "train_micro_batch_size_per_gpu": $micro, "steps_per_print": 1,
   "bf16": {"enabled": true}, "gradient_clipping": 1.0, "zero_optimization": $zero,
   "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}}}
JSON
  "$bin/loomctl" run "$out/loom-$run.json" --state-dir "$out/state-$run" > "$out/loom-$run.out" 2>&1 ||
    echo "loom $run failed: see loom-$run.out"
  cp "$out"/state-$run/jobs/*/attempt-1/rank-0.log "$out/loom-$run-rank0.log" 2>/dev/null || true
done
python3 - "$out" $micro $seq <<'PY'
import json, re, statistics, sys
out, micro, seq = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
ref = [json.loads(l) for l in open(f"{out}/reference.jsonl")] if open(f"{out}/reference.jsonl").read() else []
flops = next((r["matmul_flops"] for r in ref if "matmul_flops" in r), None)
hf = next((r for r in ref if r.get("reference")), None)
params = hf["parameters"] if hf else 1235814400
def mfu(tps):  # 6 N per token plus attention 12 * layers * hidden * seq
    return tps * (6 * params + 12 * 16 * 2048 * seq) / flops if flops else float("nan")
rows = []
if hf:
    rows.append(("transformers + PyTorch (bf16 autocast, fused AdamW)", hf["tokens_per_s"], hf.get("peak_gib")))
for r in ref:
    if r.get("reference") == "deepspeed":
        if "tokens_per_s" in r:
            offload = ", parameters offloaded" if r.get("offload_param") else ""
            rows.append((f"DeepSpeed {r.get('version', '')} ZeRO {r['stage']} (bf16, torch AdamW{offload})",
                         r["tokens_per_s"], r.get("peak_gib")))
        else:
            print(f"DeepSpeed ZeRO {r['stage']}: did not run: {r.get('error')}")
for run in ("z0", "z3", "z0-cuda-kernels", "z3-cuda-kernels", "z2-offload", "z3-offload-param"):
    try:
        log = open(f"{out}/loom-{run}-rank0.log").read()
    except OSError:
        continue
    # Steps 3 to the last but one: the last runs under the profiler (train.profile_step).
    steps = re.findall(r"step (\d+)/(\d+): .*tokens/s (\d+)", log)
    tps = [float(m) for s, n, m in steps if 2 < int(s) < int(n)]
    fused = {"cuda-kernels": ", CUDA kernel plugin", "offload": ", optimizer offloaded to the CPU plugin",
             "offload-param": ", parameters offloaded"}.get(run.split("-", 1)[-1], "")
    peak = re.search(r"device peak ([\d.]+) (GiB|MiB)", log)
    peak_gib = float(peak.group(1)) / (1 if peak.group(2) == "GiB" else 1024) if peak else None
    if tps:
        rows.append((f"Loom ZeRO {run[1]} (bf16, fp32 masters, AdamW{fused})", statistics.median(tps), peak_gib))
print(f"matmul bf16 8192^3: {flops / 1e12:.0f} TFLOP/s" if flops else "matmul: not measured")
print("| trainer | tokens/s | MFU | vs transformers | device peak |")
print("|---|---|---|---|---|")
for name, tps, peak_gib in rows:
    ratio = tps / hf["tokens_per_s"] if hf else float("nan")
    peak = f"{peak_gib:.1f} GiB" if peak_gib else ""
    print(f"| {name} | {tps:,.0f} | {mfu(tps):.1%} | {ratio:.2f}x | {peak} |")
prof = next((r for r in ref if "profile" in r), None)
if prof:
    print(f"\ntransformers + PyTorch, one step: {prof['step_ms']} ms, GPU busy {prof['gpu_busy_ms']} ms")
    print("| part of the step | GPU ms | of the step |")
    print("|---|---|---|")
    for part, ms in prof["profile"].items():
        print(f"| {part} | {ms} | {ms / prof['step_ms']:.1%} |")
    idle = prof["step_ms"] - prof["gpu_busy_ms"]
    print(f"| GPU idle (launch gaps, host work) | {idle:.2f} | {idle / prof['step_ms']:.1%} |")
# Loom's own profile of its last step (train.profile_step), for the fastest run that has one.
for run in ("z0-cuda-kernels", "z0"):
    try:
        log = open(f"{out}/loom-{run}-rank0.log").read()
    except OSError:
        continue
    at = log.find("profile of step")
    if at < 0:
        continue
    print(f"\nLoom ZeRO 0 ({run}), one step under train.profile_step:")
    for line in log[at:].splitlines()[1:]:
        if not (line.startswith("|") or line.startswith("GPU busy") or not line.strip()):
            break
        print(line)
    break
PY
