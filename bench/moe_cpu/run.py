"""Expert parallelism on CPU ranks: step time, the dispatch's share of the step and memory per
rank of a Mixtral-shaped model at ep2 x dp2 and ep4 against ep1 x dp4 (the same world size,
global batch and data), in one run.

  python3 bench/moe_cpu/run.py --bin build/bin [--ranks 4] [--steps 5] [--seq-len 512] [--stage 0]

The model (hidden 256, 4 layers, 8 heads / 4 KV heads, 8 experts of width 512, top 2, random
init) trains on a global batch of 8 samples through `loomctl run` (real loomd, real ranks, UCX
shared memory). The step time is the median of the steps after the first, the last excluded: it
runs under the profiler (train.profile_step), whose table gives the time rank 0 spent in
`loom::expert_parallel_all_to_all` (the rows' all-to-all-v, both ways, forward and backward).
Parameter bytes are rank 0's (its `memory per rank` line): the experts are 1/ep of them per rank.
Prints a markdown table.
"""
import argparse
import glob
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "oracles"))

from parity_test import memory_line  # noqa: E402

CONFIG = {"model_type": "mixtral", "vocab_size": 260, "hidden_size": 256, "intermediate_size": 512,
          "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 4, "num_local_experts": 8,
          "num_experts_per_tok": 2, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
          "tie_word_embeddings": False}
BATCH = 8


def run(bin_dir, work, data, seq, steps, ranks, ep, stage):
    name = f"ep{ep}-dp{ranks // ep}-zero{stage}"
    ds = {"train_batch_size": BATCH, "train_micro_batch_size_per_gpu": BATCH // ranks, "gradient_clipping": 1.0,
          "steps_per_print": 1, "zero_optimization": {"stage": stage},
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.01}}}
    if ep > 1:
        ds["expert_parallel"] = {"enabled": True, "autoep_size": ep}
    spec = {"name": name, "kind": "train", "resources": {"ranks": ranks},
            "model": {"config": os.path.join(work, "config.json"), "init_seed": 1},
            "data": {"train": data, "seq_len": seq, "seed": 1},
            "train": {"steps": steps, "profile_step": steps}, "deepspeed": ds}
    path = os.path.join(work, name + ".json")
    with open(path, "w") as f:
        json.dump(spec, f)
    state = os.path.join(work, name)
    subprocess.run([os.path.join(bin_dir, "loomctl"), "run", path, "--state-dir", state], check=True,
                   capture_output=True, timeout=3600)
    log = open(glob.glob(os.path.join(state, "jobs", "*", "attempt-1", "rank-0.log"))[0]).read()
    times = []
    for line in log.splitlines():
        if line.startswith("step ") and "tokens/s" in line:
            step = int(line.split()[1].split("/")[0])
            if 1 < step < steps:
                times.append(BATCH * seq / float(line.split("tokens/s ")[1].split()[0]))
    exchange = re.search(r"\| loom::expert_parallel_all_to_all \| ([\d.]+) \| ([\d.]+)% \|", log)
    return {"name": name, "ep": ep, "seconds": statistics.median(times), "memory": memory_line(log),
            "exchange_share": float(exchange.group(2)) / 100 if exchange else 0.0}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bin", required=True)
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--stage", type=int, default=0)
    a = p.parse_args()
    bin_dir = os.path.abspath(a.bin)
    with tempfile.TemporaryDirectory(prefix="loom-moe-bench-") as work:
        with open(os.path.join(work, "config.json"), "w") as f:
            json.dump(CONFIG, f)
        data = os.path.join(work, "data.tokens")
        subprocess.run([os.path.join(bin_dir, "loomctl"), "data", "prepare", "/usr/share/common-licenses/GPL-3",
                        "/usr/share/common-licenses/GPL-2", "--output", data], check=True, capture_output=True)
        runs = [run(bin_dir, work, data, a.seq_len, a.steps, a.ranks, ep, a.stage)
                for ep in (1, 2, 4) if a.ranks % ep == 0]
    mib = 1 << 20
    base = runs[0]
    print(f"| layout ({a.ranks} ranks, ZeRO {a.stage}) | s/step at {a.seq_len} tokens | vs ep1 | "
          f"all-to-all-v share | parameters per rank | vs ep1 |")
    print("|---|---|---|---|---|---|")
    for r in runs:
        params = r["memory"].get("parameters", 0)
        print(f"| {r['name'].rsplit('-zero', 1)[0]} | {r['seconds']:.3f} | {r['seconds'] / base['seconds']:.2f}x | "
              f"{100 * r['exchange_share']:.1f}% | {params / mib:.1f} MiB | "
              f"{params / base['memory'].get('parameters', 1):.2f}x |")


if __name__ == "__main__":
    main()
