"""torch.distributed, the reference for Loom's collectives: gloo on host tensors against Loom's UCX
communicator, or NCCL on each rank's GPU against Loom's NCCL communicator; the same ops and sizes
as the probe's collective benchmark, busbw by nccl-tests' factors, and the same statistic: each
of REPEATS timed loops gives a mean, a rank's time is their median, the slowest rank's counts.
Run under torchrun; rank 0 prints one JSON object per (op, size).

  torchrun --nproc-per-node N torch_dist_bench.py OPS MIN_BYTES MAX_BYTES [gloo|nccl] [REPEATS]
"""
import json
import os
import sys
import time

import torch
import torch.distributed as dist

FACTORS = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "all_to_all_v": lambda n: (n - 1) / n,
}


def uneven_splits(rank, n, count):
    """The probe's all_to_all_v parts: rank i sends rank j ((i + j) % n + 1) units."""
    unit = count // (n * (n + 1) // 2)
    return ([unit * ((j + rank) % n + 1) for j in range(n)],   # to each rank (input splits)
            [unit * ((j + rank) % n + 1) for j in range(n)])   # from each rank (output splits)


def run(op, count, n, out, inp, splits=None):
    if op == "all_reduce":
        dist.all_reduce(inp)
    elif op == "all_gather":
        dist.all_gather_into_tensor(out, inp)
    elif op == "reduce_scatter":
        dist.reduce_scatter_tensor(out, inp)
    elif op == "all_to_all_v":
        dist.all_to_all_single(out, inp, output_split_sizes=splits[1], input_split_sizes=splits[0])
    else:
        dist.all_to_all_single(out, inp)


def main():
    backend = sys.argv[4] if len(sys.argv) > 4 else "gloo"
    device = "cpu"
    if backend == "nccl":
        device = f"cuda:{int(os.environ['LOCAL_RANK'])}"
        torch.cuda.set_device(device)
    dist.init_process_group(backend)
    n, rank = dist.get_world_size(), dist.get_rank()
    ops = sys.argv[1].split(",")
    min_bytes, max_bytes = int(sys.argv[2]), int(sys.argv[3])
    repeats = int(sys.argv[5]) if len(sys.argv) > 5 else 1

    def sync():
        if backend == "nccl":
            torch.cuda.synchronize()
    for op in ops:
        size = min_bytes
        while size <= max_bytes:
            count = max(1, size // 4)
            if op != "all_reduce":
                count = max(n, count // n * n)
            units = n * (n + 1) // 2
            if op == "all_to_all_v":
                count = max(units, count // units * units)
            splits = uneven_splits(rank, n, count) if op == "all_to_all_v" else None
            if op == "all_gather":
                inp, out = torch.ones(count // n, device=device), torch.empty(count, device=device)
            elif op == "reduce_scatter":
                inp, out = torch.ones(count, device=device), torch.empty(count // n, device=device)
            else:
                inp, out = torch.ones(count, device=device), torch.empty(count, device=device)
            iters = max(2, min(20, (2 << 30) // (count * 4)))
            try:
                for _ in range(3):
                    run(op, count, n, out, inp, splits)
                means = []
                for _ in range(repeats):
                    sync()
                    dist.barrier()
                    sync()
                    start = time.perf_counter()
                    for _ in range(iters):
                        run(op, count, n, out, inp, splits)
                    sync()
                    means.append((time.perf_counter() - start) / iters)
                seconds = sorted(means)[len(means) // 2]
            except RuntimeError as e:  # an op gloo does not implement
                if rank == 0:
                    print(json.dumps({"op": op, "bytes": count * 4, "error": str(e).splitlines()[0]}), flush=True)
                break
            t = torch.tensor([seconds], dtype=torch.float64, device=device)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            seconds = t.item()
            algbw = count * 4 / seconds / 1e9
            if rank == 0:
                print(json.dumps({"op": op, "bytes": count * 4, "seconds": seconds, "algbw": algbw,
                                  "busbw": algbw * FACTORS[op](n)}), flush=True)
            size *= 2
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
