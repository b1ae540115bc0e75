#!/usr/bin/env python3
"""Loom's collectives against torch.distributed, side by side in one run: Loom's UCX communicator
against gloo on host memory, or with --device cuda (on a machine with several GPUs) Loom's NCCL
communicator against torch.distributed's NCCL, one rank per GPU.

For each world size: the probe job's collective benchmark through `loomctl run` (real ranks,
the embedded control plane) and bench/comm/torch_dist_bench.py under torchrun, same ops, sizes
and dtype (float32). On the host it also measures a single thread's memcpy bandwidth (the goal's
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
OPS = ["all_reduce", "all_gather", "reduce_scatter", "all_to_all"]
ROW = re.compile(r"^(\w+)\s+(\d+) (B|KiB|MiB)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+(\d+)$")
UNIT = {"B": 1, "KiB": 1024, "MiB": 1 << 20}


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


def loom(loomctl, ranks, min_bytes, max_bytes, device):
    with tempfile.TemporaryDirectory() as state:
        spec = {"name": "comm-bench", "kind": "probe", "resources": {"ranks": ranks, "device": device},
                "probe": {"ticks": 0, "collectives": {"ops": OPS, "min_bytes": min_bytes, "max_bytes": max_bytes,
                                                      "iterations": 20, "warmup": 3, "dtype": "float32"}}}
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
                out[(m.group(1), int(m.group(2)) * UNIT[m.group(3)])] = float(m.group(7))
        return out


def torch_dist(ranks, min_bytes, max_bytes, backend):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks),
           os.path.join(HERE, "torch_dist_bench.py"), ",".join(OPS), str(min_bytes), str(max_bytes), backend]
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
    for ranks in [int(r) for r in args.ranks.split(",")]:
        ours = loom(args.loomctl, ranks, args.min_bytes, args.max_bytes, args.device)
        ref = torch_dist(ranks, args.min_bytes, args.max_bytes, "nccl" if cuda else "gloo")
        print(f"### {ranks} ranks: busbw GB/s\n")
        print(f"| op | size | {mine_name} | {theirs_name} | Loom / {theirs_name} |")
        print("|---|---|---|---|---|")
        worst = {}
        for (op, size) in sorted(ours, key=lambda k: (OPS.index(k[0]), k[1])):
            mine, theirs = ours[(op, size)], ref.get((op, size))
            ratio = mine / theirs if theirs else float("nan")
            if size >= 1 << 20 and theirs:
                worst[op] = min(worst.get(op, float("inf")), ratio)
            print(f"| {op} | {human(size)} | {mine:.3f} | {theirs if theirs is None else f'{theirs:.3f}'} | {ratio:.2f} |")
        print()
        for op in OPS:
            if op in worst:
                goal = "" if cuda else " (goal >= 2)"
                print(f"- {op}: lowest Loom/{theirs_name} ratio at >= 1 MiB: {worst[op]:.2f}{goal}")
        at64 = ours.get(("all_reduce", 64 << 20))
        if at64 and copy:
            print(f"- all_reduce busbw at 64 MiB: {at64:.2f} GB/s = {100 * at64 / copy:.0f}% of memcpy (goal >= 70%)")
        print()


if __name__ == "__main__":
    main()
