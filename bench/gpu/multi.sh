#!/usr/bin/env bash
# Several GPUs of one host: the bench/gpu model on N GPUs at ZeRO stages 0-3 (one rank per GPU,
# NCCL), against the same global batch on 1 GPU (N micro-batches of gradient accumulation): the
# losses must agree within bf16 tolerance, and tokens/s gives the scaling efficiency. DeepSpeed
# trains the same model on the same N GPUs at the stages of DS_STAGES (default "1 2 3").
# With PLUGIN (libloom_kernels_cuda.so), Loom's runs use its fused kernels. STAGES (default
# "0 1 2 3") picks Loom's stages on N GPUs.
# Usage (repository root, Loom's binaries in BIN, libraries on LD_LIBRARY_PATH):
#   bench/gpu/multi.sh BIN OUT GPUS [MICRO] [PLUGIN]
set -euo pipefail
bin=$1 out=$2 gpus=$3 micro=${4:-8} plugin=${5:-} seq=2048 steps=10
kernels=""
[ -n "$plugin" ] && kernels="\"kernels\": {\"plugins\": [\"cuda\"]},"
mkdir -p "$out"
here=$(cd "$(dirname "$0")" && pwd)
python3 "$here/random_tokens.py" "$out/random.tokens" 640
run() {  # name ranks stage
  cat > "$out/$1.json" <<JSON
{"name": "$1", "kind": "train", "resources": {"ranks": $2, "device": "cuda", "device_memory_gb": 139}, $kernels
 "model": {"config": "$here/llama-1b-config.json", "init_seed": 1},
 "data": {"train": "$out/random.tokens", "seq_len": $seq, "seed": 1},
 "train": {"steps": $steps},
 "deepspeed": {"train_batch_size": $((micro * gpus)), "train_micro_batch_size_per_gpu": $micro, "steps_per_print": 1,
   "bf16": {"enabled": true}, "gradient_clipping": 1.0, "zero_optimization": {"stage": $3},
   "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}}}
JSON
  rm -rf "$out/state-$1"  # one job in it: the rank log below is this run's
  "$bin/loomctl" run "$out/$1.json" --state-dir "$out/state-$1" > "$out/$1.out" 2>&1 || echo "$1 failed: see $1.out"
  cp "$out"/state-$1/jobs/*/attempt-1/rank-0.log "$out/$1-rank0.log" 2>/dev/null || true
}
run one-gpu 1 0
for stage in ${STAGES-0 1 2 3}; do run "gpus$gpus-z$stage" "$gpus" "$stage"; done
: >"$out/deepspeed.jsonl"
for stage in ${DS_STAGES-1 2 3}; do
  python3 "$here/deepspeed_reference.py" --config "$here/llama-1b-config.json" --stage "$stage" --seq $seq \
    --micro "$micro" --steps $steps --gpus "$gpus" >>"$out/deepspeed.jsonl" 2>"$out/deepspeed-z$stage.err" ||
    echo "deepspeed stage $stage on $gpus GPUs did not run: see deepspeed.jsonl and deepspeed-z$stage.err"
done
python3 - "$out" "$gpus" "$micro" "$seq" ${STAGES-0 1 2 3} <<'PY'
import re, statistics, sys
out, gpus, micro, seq = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
stages = [int(s) for s in sys.argv[5:]]
def read(name):
    try:
        log = open(f"{out}/{name}-rank0.log").read()
    except OSError:
        return None, None
    steps = re.findall(r"step (\d+)/\d+: loss ([0-9.]+) .*tokens/s (\d+)", log)
    losses = {int(s): float(l) for s, l, _ in steps}
    tps = statistics.median(float(t) for s, _, t in steps if int(s) > 2) if len(steps) > 2 else None
    return losses, tps
base_losses, base_tps = read("one-gpu")
print(f"1 GPU, batch {micro * gpus} (micro {micro} x {gpus} accumulation): {base_tps:,.0f} tokens/s" if base_tps else "1 GPU: failed")
print(f"| GPUs | stage | tokens/s | scaling efficiency | max loss difference vs 1 GPU |")
print("|---|---|---|---|---|")
for stage in stages:
    losses, tps = read(f"gpus{gpus}-z{stage}")
    if not tps:
        print(f"| {gpus} | {stage} | failed | | |")
        continue
    diff = max(abs(losses[s] - base_losses[s]) for s in base_losses) if base_losses else float("nan")
    print(f"| {gpus} | {stage} | {tps:,.0f} | {tps / (gpus * base_tps):.0%} | {diff:.4f} |")
import json
ds = [json.loads(line) for line in open(f"{out}/deepspeed.jsonl") if line.strip()]
if ds:
    print()
    print(f"| GPUs | stage | DeepSpeed tokens/s | Loom / DeepSpeed |")
    print("|---|---|---|---|")
for r in ds:
    if "tokens_per_s" not in r:
        print(f"| {gpus} | {r['stage']} | did not run: {r.get('error', '')[:80]} | |")
        continue
    _, tps = read(f"gpus{gpus}-z{r['stage']}")
    ratio = f"{tps / r['tokens_per_s']:.2f}x" if tps else ""
    print(f"| {gpus} | {r['stage']} | {r['tokens_per_s']:,.0f} | {ratio} |")
PY
