#!/usr/bin/env bash
# bench/gpu on the GPU machine: one iteration of `loomctl rl` on a Llama-3.2-1B-shaped model (random
# init) in bf16 on one GPU, through a real control plane (`loomd --standalone`, two slots on the one
# GPU): a served rollout job draws 256 prompts of 128 random tokens x 4 samples x 256 new tokens
# (temperature 1, end tokens ignored), the exact_match rule scores them, a train job takes one pass
# over the 1,024 samples (policy gradient, GRPO advantages, AdamW, 16 steps of 64), and the rollout
# job loads the new weights. Prints the time in rollout, scoring, training and the weight update,
# and the weight update against reading the checkpoint's model file (goal: at most 2x).
# Usage (from the repository root, Loom's binaries in BIN): bench/gpu/rl_iteration.sh BIN OUT [PLUGIN]
set -euo pipefail
bin=$1 out=$2 plugin=${3:-}
mkdir -p "$out"
here=$(cd "$(dirname "$0")" && pwd)
config=$here/llama-1b-config.json
kernels=""
[ -n "$plugin" ] && kernels="\"kernels\": {\"plugins\": [\"cuda\"]},"
python3 - "$out" <<'PY'
import json, random, sys
out = sys.argv[1]
rng = random.Random(0)
with open(f"{out}/prompts.jsonl", "w") as f:
    for i in range(256):
        ids = [rng.randrange(3, 128000) for _ in range(128)]
        f.write(json.dumps({"id": f"p{i}", "prompt_token_ids": ids, "reference": [rng.randrange(3, 128000)]}) + "\n")
PY
cat > "$out/rollout.json" <<JSON
{"name": "bench-rl-rollout", "kind": "rollout", "resources": {"ranks": 1, "device": "cuda", "device_memory_gb": 60},
 $kernels
 "model": {"config": "$config", "init_seed": 1},
 "rollout": {"serve": true, "max_num_seqs": 256, "max_num_batched_tokens": 8192, "kv_cache_memory_gb": 40}}
JSON
cat > "$out/train.json" <<JSON
{"name": "bench-rl-train", "kind": "train", "resources": {"ranks": 1, "device": "cuda", "device_memory_gb": 70},
 $kernels
 "model": {"config": "$config", "init_seed": 1},
 "data": {"seq_len": 384, "reward": {"rule": "exact_match"}},
 "train": {"steps": 16, "loss": {"type": "policy_gradient"}},
 "deepspeed": {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 16, "bf16": {"enabled": true},
               "steps_per_print": 4, "optimizer": {"type": "AdamW", "params": {"lr": 1e-6}}}}
JSON
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
server=127.0.0.1:$port
"$bin/loomd" --standalone --listen "$server" --state-dir "$out/state" --slots 2 --gpus 0,0 > "$out/loomd.log" 2>&1 &
loomd=$!
trap 'kill $loomd 2>/dev/null; wait $loomd 2>/dev/null || true' EXIT
for _ in $(seq 100); do
  job=$("$bin/loomctl" --server "$server" --token-file "$out/state/planner/admin.token" submit "$out/rollout.json" 2>/dev/null) && break
  sleep 0.2
done
cat > "$out/loop.json" <<JSON
{"name": "bench-rl", "rollout_job": "$job", "prompts": "$out/prompts.jsonl", "train": "$out/train.json",
 "iterations": 1, "work_dir": "$out/run", "wait_s": 600,
 "sampling": {"n": 4, "temperature": 1.0, "max_tokens": 256, "ignore_eos": true}}
JSON
"$bin/loomctl" --server "$server" --token-file "$out/state/planner/admin.token" rl "$out/loop.json" -o json > "$out/rl.jsonl" 2> "$out/rl.err" ||
  { echo "loomctl rl failed: see rl.err"; cat "$out/rl.err"; }
cp "$out"/state/jobs/*/attempt-1/rank-0.log "$out/" 2>/dev/null || true
"$bin/loomctl" --server "$server" --token-file "$out/state/planner/admin.token" cancel "$job" > /dev/null 2>&1 || true
python3 - "$out" <<'PY'
import glob, json, os, sys, time
out = sys.argv[1]
lines = [json.loads(l) for l in open(f"{out}/rl.jsonl") if l.strip()]
if not lines:
    sys.exit("no iteration finished")
it = lines[0]
model = sorted(glob.glob(f"{out}/run/checkpoints/global_step*/model*.safetensors"))
size = sum(os.path.getsize(m) for m in model)
start = time.perf_counter()
for m in model:
    with open(m, "rb") as f:
        while f.read(64 << 20):
            pass
read_s = time.perf_counter() - start
print(f"one RL iteration, Llama-3.2-1B shape, bf16, 1 GPU: {it['samples']} samples")
for key in ["rollout_s", "score_s", "train_s", "update_weights_s"]:
    print(f"  {key:18} {it[key]:8.2f} s")
print(f"  weights: {size / 1e9:.2f} GB in {len(model)} file(s), read in {read_s:.2f} s "
      f"({size / 1e9 / read_s:.1f} GB/s); the update took {it['update_weights_s'] / read_s:.2f}x that (goal <= 2x)")
PY
