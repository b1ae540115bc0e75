#!/usr/bin/env bash
# bench/gpu on the GPU machine: rollout of a Llama-3.2-1B-shaped model (random init) in bf16 on one
# GPU, 256 prompts of 128 random tokens and 256 new tokens each (greedy, end tokens ignored),
# through the real control plane (`loomctl run`); transformers' generate with static batching on
# the same model and batch in the same run, and DeepSpeed 0.19.8's rollout (HybridEngineRollout,
# bench/gpu/deepspeed_rollout.py) in the modes of DS_MODES (default "plain continuous
# graph_capture"; where DeepSpeed imports). Loom runs with CUDA graphs on and off, with asynchronous
# scheduling off ("graphs-sync"), and without the kernel plugin (paged attention on the libtorch reference). Prints a table with each run's output
# tokens/s, its ratio to transformers, and the fraction of the decode bandwidth bound (weights
# plus the KV read per step at the card's memory bandwidth: H200 4.8 TB/s, H100 SXM 3.35 TB/s,
# H100 PCIe 2.0 TB/s, or BANDWIDTH bytes/s for another card). The run "arriving" (CUDA graphs, the plugin)
# takes 1,024 such requests arriving evenly over ARRIVAL_S seconds (default 6) instead, through
# the same 256 running sequences: its latencies are those of a loaded server.
# Usage (from the repository root, Loom's binaries in BIN): bench/gpu/rollout.sh BIN OUT [PLUGIN]
# PROFILE_STEP: a step of the graphs run under the profiler (its report in loom-graphs-rank0.log);
# PROFILE_PREFILL: one of the eager run's. REFERENCES=0: Loom's runs only (no transformers or
# DeepSpeed: the table's ratios stay empty), for a quick look at a change.
set -euo pipefail
bin=$1 out=$2 plugin=${3:-} batch=${BATCH:-256} prompt=128 new=256
mkdir -p "$out"
here=$(cd "$(dirname "$0")" && pwd)
config=$here/llama-1b-config.json
: > "$out/reference.jsonl"
if [ "${REFERENCES:-1}" != 0 ]; then
  python3 "$here/hf_generate.py" --config "$config" --batch "$batch" --prompt $prompt --new $new \
    > "$out/reference.jsonl" 2> "$out/reference.err" || echo "transformers generate failed: see reference.err"
fi
if [ "${REFERENCES:-1}" != 0 ] && python3 -c "import deepspeed" 2>/dev/null; then
  for mode in ${DS_MODES-plain continuous graph_capture}; do
    python3 "$here/deepspeed_rollout.py" --config "$config" --batch "$batch" --prompt $prompt --new $new --mode "$mode" \
      > "$out/deepspeed-$mode.jsonl" 2> "$out/deepspeed-$mode.err" ||
      echo "DeepSpeed rollout $mode failed: see deepspeed-$mode.err"
  done
fi
python3 - "$out" "$batch" $prompt $new "${ARRIVAL_S:-6}" <<'PY'
import json, random, sys
out, batch, prompt, new, arrival = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
rng = random.Random(0)
for name, count, spread in [("prompts", batch, 0.0), ("arriving", 1024, arrival)]:
    with open(f"{out}/{name}.jsonl", "w") as f:
        for i in range(count):
            ids = [rng.randrange(3, 128000) for _ in range(prompt)]
            line = {"prompt_token_ids": ids, "sampling": {"temperature": 0, "max_new_tokens": new, "ignore_eos": True}}
            if spread:
                line["arrival_s"] = spread * i / count
            f.write(json.dumps(line) + "\n")
PY
runs="graphs graphs-sync eager arriving"
[ -n "$plugin" ] || runs="reference-graphs"
[ -n "$plugin" ] && runs="$runs reference-graphs"
for run in ${RUNS:-$runs}; do
  graphs=true async=true kernels="" profile=${PROFILE_STEP:-0}
  [[ $run == graphs-sync ]] && async=false profile=0
  [[ $run == eager ]] && graphs=false profile=${PROFILE_PREFILL:-0}
  prompts=$out/prompts.jsonl
  [[ $run == arriving ]] && prompts=$out/arriving.jsonl profile=0
  [[ $run != reference* && -n $plugin ]] && kernels="\"kernels\": {\"plugins\": [\"cuda\"]},"
  cat > "$out/loom-$run.json" <<JSON
{"name": "bench-rollout-$run", "kind": "rollout", "resources": {"ranks": 1, "device": "cuda", "device_memory_gb": 139},
 $kernels
 "model": {"config": "$config", "init_seed": 1},
 "rollout": {"prompts": "$prompts", "output": "$out/loom-$run-output.jsonl", "max_num_seqs": $batch,
             "max_num_batched_tokens": 8192, "cuda_graphs": $graphs, "async_scheduling": $async,
             "profile_step": $profile}}
JSON
  rm -rf "$out/state-$run"  # one job in it: the rank log below is this run's
  "$bin/loomctl" run "$out/loom-$run.json" --state-dir "$out/state-$run" > "$out/loom-$run.out" 2>&1 ||
    echo "loom $run failed: see loom-$run.out"
  cp "$out"/state-$run/jobs/*/attempt-1/rank-0.log "$out/loom-$run-rank0.log" 2>/dev/null || true
done
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
case $gpu in
  *H200*) bandwidth=4.8e12 ;;
  *H100*PCIe*) bandwidth=2.0e12 ;;
  *H100*) bandwidth=3.35e12 ;;
  *) bandwidth=${BANDWIDTH:-4.8e12} ;;
esac
python3 - "$out" "$batch" $prompt $new "$bandwidth" "$gpu" <<'PY'
import json, re, sys
out, batch, prompt, new = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
bandwidth, gpu = float(sys.argv[5]), sys.argv[6]
text = open(f"{out}/reference.jsonl").read()
hf = json.loads(text.splitlines()[0]) if text.strip() else None
# The decode bound: each step reads the bf16 weights and every sequence's keys and values so far.
params, layers, kv_heads, head_dim = 1235814400, 16, 8, 64
kv_per_token = layers * 2 * kv_heads * head_dim * 2
mean_context = prompt + new / 2
step_bytes = 2 * params + batch * mean_context * kv_per_token
bound = batch * bandwidth / step_bytes
rows = []
if hf:
    rows.append((f"transformers {hf['version']} generate (static batch, sdpa)", hf["output_tokens_per_s"], ""))
for mode in ["plain", "continuous", "graph_capture", "continuous_graph_capture"]:
    try:
        ds = json.loads(open(f"{out}/deepspeed-{mode}.jsonl").read().splitlines()[0])
    except (OSError, IndexError, ValueError):
        continue
    rows.append((f"DeepSpeed {ds['version']} rollout, {mode}", ds["output_tokens_per_s"], ""))
ds_best = max([tps for name, tps, _ in rows if name.startswith("DeepSpeed")], default=0)
for run, name in [("graphs", "Loom, CUDA graphs, paged-attention kernel"),
                  ("graphs-sync", "Loom, CUDA graphs, paged-attention kernel, asynchronous scheduling off"),
                  ("eager", "Loom, eager, paged-attention kernel"),
                  ("reference-graphs", "Loom, CUDA graphs, libtorch paged attention"),
                  ("arriving", "Loom, 1,024 requests arriving over time, CUDA graphs")]:
    try:
        log = open(f"{out}/loom-{run}-rank0.log").read()
    except OSError:
        continue
    m = re.search(r"([\d.]+) output tokens/s", log)
    lat = re.search(r"time to first token p50 ([\d.]+) s p90 ([\d.]+) s .* inter-token latency p50 ([\d.]+) s "
                    r"p90 ([\d.]+) s", log)
    if m:
        ms = [float(g) * 1e3 for g in lat.groups()] if lat else []
        extra = (f"TTFT p50 {ms[0]:.0f} ms p90 {ms[1]:.0f} ms, ITL p50 {ms[2]:.2f} ms p90 {ms[3]:.2f} ms"
                 if lat else "")
        rows.append((name, float(m.group(1)), extra))
print(f"{batch} sequences x ({prompt} prompt + {new} new tokens), bf16, one {gpu or 'GPU'}; "
      f"decode bound {bound:,.0f} tokens/s at {bandwidth / 1e12:.2f} TB/s")
print("| run | output tokens/s | vs transformers | vs DeepSpeed's best | of the bound | latency |")
print("|---|---|---|---|---|---|")
for name, tps, extra in rows:
    ratio = f"{tps / hf['output_tokens_per_s']:.2f}x" if hf else ""
    vs_ds = f"{tps / ds_best:.2f}x" if ds_best else ""
    print(f"| {name} | {tps:,.0f} | {ratio} | {vs_ds} | {tps / bound:.0%} | {extra} |")
PY
