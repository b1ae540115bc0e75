#!/usr/bin/env python3
"""Loom's collectives against torch.distributed, side by side in one run: Loom's UCX communicator
against gloo on host memory, or with --device cuda (on a machine with several GPUs) Loom's NCCL
communicator against torch.distributed's NCCL, one rank per GPU.

For each world size: the probe job's collective benchmark through `loomctl run` (real ranks,
the embedded control plane) and bench/comm/torch_dist_bench.py under torchrun, same ops, sizes
and dtype (float32). On the host, Loom runs with tensors from the communicator's allocate()
(memory every rank maps, worked on in place) and with ordinary tensors (carried by UCX messages). On the host it also measures a single thread's memcpy bandwidth (the goal's
yardstick) and two processes' copying at once (what ranks sharing the memory can get). Prints markdown: busbw per op and size, the ratio, and the goals' verdicts.

    python3 bench/comm/run_comm_bench.py [--ranks 2,4] [--min-bytes 1024] [--max-bytes 268435456]
                                         [--device cpu|cuda] [--loomctl PATH]
"""
import argparse
import glob
import json
import os
import re
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
OPS = ["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "all_to_all_v"]
ROW = re.compile(r"^(\w+)\s+(\d+) (B|KiB|MiB)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+(\d+)$")


def memcpy_gbps(size=256 << 20, repeats=5):
    src = np.ones(size, dtype=np.uint8)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    best = min(timed(lambda: np.copyto(dst, src)) for _ in range(repeats))
    return size / best / 1e9


def concurrent_memcpy_gbps(processes=2):
    """Each of `processes` processes copying at once: what the memory gives ranks that share it."""
    import multiprocessing
    with multiprocessing.get_context("spawn").Pool(processes) as pool:
        return pool.map(memcpy_gbps, [64 << 20] * processes)


def timed(fn):
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


REPEATS = 3  # timed loops per size on both sides; the median loop's mean counts


def loom(loomctl, ranks, min_bytes, max_bytes, device, shared_memory):
    with tempfile.TemporaryDirectory() as state:
        spec = {"name": "comm-bench", "kind": "probe", "resources": {"ranks": ranks, "device": device},
                "probe": {"ticks": 0, "collectives": {"ops": OPS, "min_bytes": min_bytes, "max_bytes": max_bytes,
                                                      "iterations": 20, "warmup": 3, "repeats": REPEATS,
                                                      "dtype": "float32",
                                                      "shared_memory": shared_memory}}}
        path = os.path.join(state, "spec.json")
        with open(path, "w") as f:
            json.dump(spec, f)
        subprocess.run([loomctl, "run", path, "--state-dir", os.path.join(state, "run")], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        log = glob.glob(os.path.join(state, "run", "jobs", "*", "attempt-1", "rank-0.log"))[0]
        out = {}
        for line in open(log):
            m = ROW.match(line.strip())
            if m:
                # The exact bytes from the element count: the size column is rounded to whole
                # KiB or MiB, and all_to_all_v's sizes are multiples of n (n + 1) / 2 elements.
                out[(m.group(1), int(m.group(4)) * 4)] = float(m.group(7))
        return out


def torch_dist(ranks, min_bytes, max_bytes, backend):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks),
           os.path.join(HERE, "torch_dist_bench.py"), ",".join(OPS), str(min_bytes), str(max_bytes), backend,
           str(REPEATS)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    res = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env)
    out = {}
    for line in res.stdout.splitlines():
        if line.startswith("{"):
            row = json.loads(line)
            if "busbw" in row:
                out[(row["op"], row["bytes"])] = row["busbw"]
    return out


def human(b):
    return f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB" if b >= 1024 else f"{b} B"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--ranks", default="2,4")
    p.add_argument("--min-bytes", type=int, default=1024)
    p.add_argument("--max-bytes", type=int, default=256 << 20)
    p.add_argument("--loomctl", default=os.path.join(ROOT, "build", "bin", "loomctl"))
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    args = p.parse_args()

    cuda = args.device == "cuda"
    mine_name, theirs_name = ("Loom NCCL", "torch.distributed NCCL") if cuda else ("Loom UCX", "gloo")
    copy = None if cuda else memcpy_gbps()
    if copy:
        both = ", ".join(f"{g:.2f}" for g in concurrent_memcpy_gbps(2))
        print(f"memcpy, one thread, 256 MiB: {copy:.2f} GB/s copied; two processes at once, 64 MiB each: {both} GB/s\n")
    # On the host Loom runs twice: tensors from the communicator's allocate() (shared memory the
    # collectives work in place in; what Loom's CPU training buffers use) and ordinary tensors
    # (what the UCX messages carry).
    variants = [("", True)] if cuda else [(" (allocate)", True), (" (ordinary)", False)]
    for ranks in [int(r) for r in args.ranks.split(",")]:
        ours = {label: loom(args.loomctl, ranks, args.min_bytes, args.max_bytes, args.device, shared)
                for label, shared in variants}
        ref = torch_dist(ranks, args.min_bytes, args.max_bytes, "nccl" if cuda else "gloo")
        labels = [label for label, _ in variants]
        print(f"### {ranks} ranks: busbw GB/s\n")
        print("| op | size | " + " | ".join(f"{mine_name}{l}" for l in labels) + f" | {theirs_name} | " +
              " | ".join(f"Loom{l} / {theirs_name}" for l in labels) + " |")
        print("|---|---|" + "---|" * (2 * len(labels) + 1))
        worst = {label: {} for label in labels}
        keys = sorted(ours[labels[0]], key=lambda k: (OPS.index(k[0]), k[1]))
        for (op, size) in keys:
            theirs = ref.get((op, size))
            mine = [ours[label].get((op, size)) for label in labels]
            ratios = [m / theirs if (theirs and m) else float("nan") for m in mine]
            for label, ratio in zip(labels, ratios):
                if size >= 1 << 20 and theirs:
                    worst[label][op] = min(worst[label].get(op, float("inf")), ratio)
            print(f"| {op} | {human(size)} | " + " | ".join(f"{m:.3f}" for m in mine) +
                  f" | {theirs if theirs is None else f'{theirs:.3f}'} | " + " | ".join(f"{r:.2f}" for r in ratios) + " |")
        print()
        for label in labels:
            for op in OPS:
                if op in worst[label]:
                    goal = "" if cuda else " (goal >= 2)"
                    print(f"- {op}{label}: lowest Loom/{theirs_name} ratio at >= 1 MiB: {worst[label][op]:.2f}{goal}")
            at64 = ours[label].get(("all_reduce", 64 << 20))
            if at64 and copy:
                print(f"- all_reduce{label} busbw at 64 MiB: {at64:.2f} GB/s = {100 * at64 / copy:.0f}% of memcpy "
                      "(goal >= 70%)")
        print()


if __name__ == "__main__":
    main()
