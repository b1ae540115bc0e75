"""Loom's vocabulary-parallel losses against DeepSpeed 0.19.8's own, on the same sharded logits.

For 2 and 4 ranks, the same random fp32 logits [N, V] (a row masked to -inf in part, labels with
-100s) are split by vocabulary. Loom's ranks (tests/conformance/vocab_parallel_rank.cc, real
processes over UCX) and DeepSpeed's (torch.multiprocessing over gloo:
deepspeed.sequence.vocab_parallel_ops and deepspeed.sequence.cross_entropy) compute logprobs,
entropy, forward and reverse KL and the mean cross entropy, forward and backward with the same
upstream gradients. Every value and every shard's gradient agree within 1e-6; the cross entropy
computed a few rows at a time equals the one in a single block.

  python3 tests/oracles/vocab_parallel_test.py --bin build/bin
"""
import argparse
import os
import socket
import subprocess
import sys
import tempfile

os.environ.setdefault("DS_ACCELERATOR", "cpu")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

from parity_test import check, failures  # noqa: E402

ROWS, VOCAB, BLOCK_ROWS = 37, 96, 5


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def inputs(seed):
    g = torch.Generator().manual_seed(seed)
    student = torch.randn(ROWS, VOCAB, generator=g) * 3
    teacher = torch.randn(ROWS, VOCAB, generator=g) * 3
    # Some tokens masked out of both distributions (their probability is exactly 0).
    student[3, 10:20] = float("-inf")
    teacher[3, 10:20] = float("-inf")
    labels = torch.randint(0, VOCAB, (ROWS,), generator=g)
    labels[::7] = -100
    labels[3] = 0  # a label the masked row still gives a probability
    grad = torch.randn(ROWS, generator=g)
    return {"student": student, "teacher": teacher, "labels": labels, "grad": grad}


def deepspeed_rank(rank, world, port, data, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    import deepspeed
    deepspeed.comm.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
    from deepspeed.sequence.cross_entropy import vocab_parallel_cross_entropy
    from deepspeed.sequence.vocab_parallel_ops import (vocab_parallel_entropy, vocab_parallel_kl_div,
                                                       vocab_parallel_logprobs)
    group = dist.new_group(list(range(world)))
    columns = VOCAB // world
    shard = slice(rank * columns, (rank + 1) * columns)
    results = {}

    def run(name, fn, tensors, grad):
        leaves = [t[:, shard].clone().requires_grad_(True) for t in tensors]
        value = fn(*leaves)
        value.backward(grad)
        results[name] = value.detach()
        results[name + ".grad"] = leaves[0].grad
        if len(leaves) > 1:
            results[name + ".teacher_grad"] = leaves[1].grad

    s, t, labels, grad = data["student"], data["teacher"], data["labels"], data["grad"]
    run("logprobs", lambda x: vocab_parallel_logprobs(x, labels, tp_group=group), [s], grad)
    run("entropy", lambda x: vocab_parallel_entropy(x, tp_group=group), [s], grad)
    run("kl", lambda x, y: vocab_parallel_kl_div(x, y, reverse=False, tp_group=group), [s, t], grad)
    run("kl_reverse", lambda x, y: vocab_parallel_kl_div(x, y, reverse=True, tp_group=group), [s, t], grad)
    run("ce", lambda x: vocab_parallel_cross_entropy(x, labels, tp_group=group), [s], torch.tensor(1.0))
    save_file({k: v.contiguous() for k, v in results.items()}, f"{out}.rank{rank}.safetensors")
    dist.destroy_process_group()


def loom_ranks(bin_dir, world, data_path, out):
    port = free_port()
    env = dict(os.environ, WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
               LOOM_VP_INPUT=data_path, LOOM_VP_OUTPUT=out, LOOM_VP_BLOCK_ROWS=str(BLOCK_ROWS))
    procs = [subprocess.Popen([os.path.join(bin_dir, "loom-vocab-parallel-rank")], env=dict(env, RANK=str(r)),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(world)]
    for r, p in enumerate(procs):
        output, _ = p.communicate(timeout=120)
        check(p.returncode == 0, f"{world} ranks: Loom's rank {r} exits 0 {output.strip()[-300:]}")


def compare(world, work, data, data_path):
    theirs, ours = os.path.join(work, f"deepspeed-{world}"), os.path.join(work, f"loom-{world}")
    mp.spawn(deepspeed_rank, args=(world, free_port(), data, theirs), nprocs=world, join=True)
    loom_ranks(os.environ["LOOM_BIN"], world, data_path, ours)
    for r in range(world):
        a, b = load_file(f"{ours}.rank{r}.safetensors"), load_file(f"{theirs}.rank{r}.safetensors")
        for name in sorted(b):
            same_shape = name in a and a[name].shape == b[name].shape
            finite = torch.isfinite(b[name])
            agree = same_shape and torch.equal(torch.isfinite(a[name]), finite)
            # Within 1e-6 of DeepSpeed's value, relative to it where it exceeds 1 (fp32 sums of ~100 terms).
            scale = b[name][finite].abs().clamp_min(1.0) if agree else None
            diff = ((a[name][finite] - b[name][finite]).abs() / scale).max().item() if agree and finite.any() else 0.0
            check(agree and diff <= 1e-6, f"{world} ranks, rank {r}: {name} vs DeepSpeed, max difference {diff:.1e} "
                                          f"(relative where above 1)")
        blocked = max((a["ce_blocks"] - a["ce"]).abs().item(), (a["ce_blocks.grad"] - a["ce.grad"]).abs().max().item())
        check(blocked <= 1e-7, f"{world} ranks, rank {r}: cross entropy in blocks of {BLOCK_ROWS} rows vs one block, "
                               f"max |difference| {blocked:.1e}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bin", required=True)
    a = p.parse_args()
    os.environ["LOOM_BIN"] = os.path.abspath(a.bin)
    with tempfile.TemporaryDirectory(prefix="loom-vp-") as work:
        data = inputs(11)
        data_path = os.path.join(work, "inputs.safetensors")
        save_file(data, data_path)
        for world in (2, 4):
            compare(world, work, data, data_path)
    if failures:
        raise SystemExit(f"{len(failures)} checks failed")


if __name__ == "__main__":
    main()
