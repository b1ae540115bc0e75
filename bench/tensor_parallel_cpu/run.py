"""Tensor parallelism on CPU ranks: step time and peak resident memory per rank of tp2 x dp2 and
tp4 against dp4 (ZeRO 0) at the same world size, global batch and data, in one run, on a Llama of
a few hundred MB (163M parameters, 650 MB in fp32).

  python3 bench/tensor_parallel_cpu/run.py --bin build/bin [--ranks 4] [--steps 5] [--seq-len 128]

Each layout runs `--steps` optimizer steps through `loomctl run` (real loomd, real ranks, UCX);
the step time is the median over the steps after the first (warm-up). Peak RSS is rank 0's VmHWM
after the first step (its `memory per rank` line), the parameter, gradient and optimizer-state
bytes the engine's. Prints a markdown table with each layout's ratios to dp.
"""
import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "oracles"))

from parity_test import memory_line  # noqa: E402

CONFIG = {"model_type": "llama", "vocab_size": 32000, "hidden_size": 1024, "intermediate_size": 2816,
          "num_hidden_layers": 8, "num_attention_heads": 16, "num_key_value_heads": 8,
          "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "tie_word_embeddings": False}


def run(bin_dir, work, data, seq, steps, ranks, tp):
    name = f"tp{tp}-dp{ranks // tp}"
    ds = {"train_batch_size": 4, "train_micro_batch_size_per_gpu": 4 // (ranks // tp), "gradient_clipping": 1.0,
          "steps_per_print": 1, "zero_optimization": {"stage": 0},
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.01}}}
    if tp > 1:
        ds["tensor_parallel"] = {"autotp_size": tp}
    spec = {"name": name, "kind": "train", "resources": {"ranks": ranks},
            "model": {"config": os.path.join(work, "config.json"), "init_seed": 1},
            "data": {"train": data, "seq_len": seq, "seed": 1}, "train": {"steps": steps}, "deepspeed": ds}
    path = os.path.join(work, name + ".json")
    with open(path, "w") as f:
        json.dump(spec, f)
    state = os.path.join(work, name)
    subprocess.run([os.path.join(bin_dir, "loomctl"), "run", path, "--state-dir", state], check=True,
                   capture_output=True, timeout=1800)
    log = open(glob.glob(os.path.join(state, "jobs", "*", "attempt-1", "rank-0.log"))[0]).read()
    times = []
    for line in log.splitlines():
        if line.startswith("step ") and "tokens/s" in line and int(line.split()[1].split("/")[0]) > 1:
            times.append(4 * seq / float(line.split("tokens/s ")[1].split()[0]))
    return name, statistics.median(times), memory_line(log)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bin", required=True)
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--seq-len", type=int, default=128)
    a = p.parse_args()
    bin_dir = os.path.abspath(a.bin)
    with tempfile.TemporaryDirectory(prefix="loom-tp-bench-") as work:
        with open(os.path.join(work, "config.json"), "w") as f:
            json.dump(CONFIG, f)
        data = os.path.join(work, "data.tokens")
        subprocess.run([os.path.join(bin_dir, "loomctl"), "data", "prepare", "/usr/share/common-licenses/GPL-3",
                        "--output", data], check=True, capture_output=True)
        results = [run(bin_dir, work, data, a.seq_len, a.steps, a.ranks, tp) for tp in (1, 2, 4) if a.ranks % tp == 0]
    base_time, base_memory = results[0][1], results[0][2]
    mib = 1 << 20
    print(f"| layout ({a.ranks} ranks) | s/step | vs dp | peak RSS per rank | vs dp | parameters | gradients | "
          f"optimizer state |")
    print("|---|---|---|---|---|---|---|---|")
    for name, seconds, memory in results:
        print(f"| {name} | {seconds:.2f} | {seconds / base_time:.2f}x | {memory['peak RSS'] / mib:.0f} MiB | "
              f"{memory['peak RSS'] / base_memory['peak RSS']:.2f}x | {memory['parameters'] / mib:.0f} MiB | "
              f"{memory['gradients'] / mib:.0f} MiB | {memory['optimizer state'] / mib:.0f} MiB |")


if __name__ == "__main__":
    main()
