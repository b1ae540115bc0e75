"""Ulysses sequence parallelism on CPU ranks: peak resident memory per rank and step time of sp2 x
dp2 and sp4 against dp4 (ZeRO 0) at the same world size, global batch and data, at a long and a
short sequence, in one run; and the all-to-all's share of the step.

  python3 bench/sequence_parallel_cpu/run.py --bin build/bin [--seq-len 8192] [--short-seq-len 1024]
                                             [--steps 4]

Each layout trains a small Llama (hidden 256, 2 layers, 8 heads / 4 KV heads) on a global batch
of 4 samples through `loomctl run` (real loomd, 4 real ranks, UCX shared memory). Peak RSS is rank
0's VmHWM after the first step (its `memory per rank` line). What grows with the sequence is the
difference between the long and the short run's peak; Ulysses' goal is 1/sp of dp's. The ranks
run with glibc's mmap threshold fixed at 128 KiB (MALLOC_MMAP_THRESHOLD_; --glibc-default leaves
it dynamic): otherwise glibc raises the threshold as large blocks are freed and keeps later ones
in its heap, and the peak RSS counts memory the process no longer uses. The step
time is the median of the steps after the first, the last step excluded: it runs under the
profiler (train.profile_step), whose table gives the time rank 0 spent in
`loom::sequence_parallel_all_to_all`. Prints a markdown table.
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

CONFIG = {"model_type": "llama", "vocab_size": 260, "hidden_size": 256, "intermediate_size": 688,
          "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 4,
          "max_position_embeddings": 16384, "rms_norm_eps": 1e-5, "tie_word_embeddings": False}
BATCH = 4


def run(bin_dir, work, data, seq, steps, ranks, sp, env):
    name = f"sp{sp}-dp{ranks // sp}-seq{seq}"
    ds = {"train_batch_size": BATCH, "train_micro_batch_size_per_gpu": 1, "gradient_clipping": 1.0,
          "steps_per_print": 1, "zero_optimization": {"stage": 0},
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.01}}}
    if sp > 1:
        ds["sequence_parallel_size"] = sp
    spec = {"name": name, "kind": "train", "resources": {"ranks": ranks},
            "model": {"config": os.path.join(work, "config.json"), "init_seed": 1},
            "data": {"train": data, "seq_len": seq, "seed": 1},
            "train": {"steps": steps, "profile_step": steps}, "deepspeed": ds}
    path = os.path.join(work, name + ".json")
    with open(path, "w") as f:
        json.dump(spec, f)
    state = os.path.join(work, name)
    subprocess.run([os.path.join(bin_dir, "loomctl"), "run", path, "--state-dir", state], check=True,
                   capture_output=True, timeout=3600, env=env)
    log = open(glob.glob(os.path.join(state, "jobs", "*", "attempt-1", "rank-0.log"))[0]).read()
    times = []
    for line in log.splitlines():
        if line.startswith("step ") and "tokens/s" in line:
            step = int(line.split()[1].split("/")[0])
            if 1 < step < steps:
                times.append(BATCH * seq / float(line.split("tokens/s ")[1].split()[0]))
    exchange = re.search(r"\| loom::sequence_parallel_all_to_all \| ([\d.]+) \| ([\d.]+)% \|", log)
    return {"name": name, "sp": sp, "seconds": statistics.median(times), "memory": memory_line(log),
            "exchange_share": float(exchange.group(2)) / 100 if exchange else 0.0}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bin", required=True)
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=8192)
    p.add_argument("--short-seq-len", type=int, default=1024)
    p.add_argument("--glibc-default", action="store_true", help="leave glibc's mmap threshold dynamic")
    a = p.parse_args()
    env = dict(os.environ)
    if not a.glibc_default:
        env["MALLOC_MMAP_THRESHOLD_"] = str(128 << 10)
    bin_dir = os.path.abspath(a.bin)
    layouts = [sp for sp in (1, 2, 4) if a.ranks % sp == 0]
    with tempfile.TemporaryDirectory(prefix="loom-sp-bench-") as work:
        with open(os.path.join(work, "config.json"), "w") as f:
            json.dump(CONFIG, f)
        data = os.path.join(work, "data.tokens")
        subprocess.run([os.path.join(bin_dir, "loomctl"), "data", "prepare", "/usr/share/common-licenses/GPL-3",
                        "/usr/share/common-licenses/GPL-2", "--output", data], check=True, capture_output=True)
        long_runs = [run(bin_dir, work, data, a.seq_len, a.steps, a.ranks, sp, env) for sp in layouts]
        short_runs = [run(bin_dir, work, data, a.short_seq_len, a.steps, a.ranks, sp, env) for sp in layouts]
    mib = 1 << 20
    base = long_runs[0]
    base_growth = base["memory"]["peak RSS"] - short_runs[0]["memory"]["peak RSS"]
    print(f"| layout ({a.ranks} ranks) | s/step at {a.seq_len} | vs dp | all-to-all share | "
          f"peak RSS per rank at {a.seq_len} | at {a.short_seq_len} | growth | growth vs dp | goal |")
    print("|---|---|---|---|---|---|---|---|---|")
    for long, short in zip(long_runs, short_runs):
        growth = long["memory"]["peak RSS"] - short["memory"]["peak RSS"]
        print(f"| {'dp' + str(a.ranks) if long['sp'] == 1 else long['name'].rsplit('-seq', 1)[0]} | "
              f"{long['seconds']:.2f} | {long['seconds'] / base['seconds']:.2f}x | "
              f"{100 * long['exchange_share']:.1f}% | {long['memory']['peak RSS'] / mib:.0f} MiB | "
              f"{short['memory']['peak RSS'] / mib:.0f} MiB | {growth / mib:.0f} MiB | "
              f"{growth / base_growth:.2f}x | {1 / long['sp']:.2f}x |")


if __name__ == "__main__":
    main()
