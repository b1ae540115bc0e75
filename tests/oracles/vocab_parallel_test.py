"""Loom's vocabulary-parallel losses against DeepSpeed 0.19.8's own, on the same sharded logits.

For 1, 2 and 4 ranks, the same random fp32 logits [N, V] (a row masked to -inf in part, labels with
-100s) are split by vocabulary. Loom's ranks (tests/conformance/vocab_parallel_rank.cc, real
processes over UCX) and DeepSpeed's (torch.multiprocessing over gloo:
deepspeed.sequence.vocab_parallel_ops and deepspeed.sequence.cross_entropy) compute logprobs,
entropy, forward and reverse KL and the mean cross entropy, forward and backward with the same
upstream gradients. Every value and every shard's gradient agree within 1e-6; the cross entropy
computed a few rows at a time equals the one in a single block.

Then the response-token losses of training on rollouts: a rollout batch in DeepSpeed's form
(prompt and response right-padded, response_start_idx) is packed by Loom as its trainer packs
rollout samples, and its mean response-token cross entropy and generalized JSD losses (beta 0.5,
0 and 1, a temperature, a pointwise clip, and on one rank the teacher's top-k) are compared with
DeepSpeed's runtime/rollout/opsd.py: ResponseTokenBatch.from_rollout's targets and mask, and
generalized_jsd_loss, forward and the student's gradient, within 1e-6.

  python3 tests/oracles/vocab_parallel_test.py --bin build/bin
"""
import os
import socket
import subprocess
import sys
import tempfile

os.environ.setdefault("DS_ACCELERATOR", "cpu")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from loom_runs import oracle_args  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

from parity_test import check, failures  # noqa: E402

ROWS, VOCAB, BLOCK_ROWS = 37, 96, 5
# The rollout batch: sequence lengths and where each response starts (the longest fills the row).
ROLLOUT_LENGTHS, ROLLOUT_STARTS = [9, 6, 12, 4], [3, 5, 4, 1]


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
    batch, width = len(ROLLOUT_LENGTHS), max(ROLLOUT_LENGTHS)
    ids = torch.randint(0, VOCAB, (batch, width), generator=g)
    mask = torch.zeros(batch, width, dtype=torch.long)
    for b, length in enumerate(ROLLOUT_LENGTHS):
        mask[b, :length] = 1
    ids = ids * mask  # right padding with token 0
    return {"student": student, "teacher": teacher, "labels": labels, "grad": grad,
            "rollout_input_ids": ids, "rollout_attention_mask": mask,
            "rollout_response_start": torch.tensor(ROLLOUT_STARTS),
            "rollout_student": torch.randn(batch, width, VOCAB, generator=g) * 3,
            "rollout_teacher": torch.randn(batch, width, VOCAB, generator=g) * 3}


JSD_CASES = {"jsd_mixture": dict(beta=0.5, temperature=1.0), "jsd_forward_kl": dict(beta=0.0, temperature=2.0),
             "jsd_reverse_kl": dict(beta=1.0, temperature=1.0),
             "jsd_clipped": dict(beta=0.3, temperature=1.5, pointwise_clip=0.05)}


def deepspeed_response_losses(data, world, shard, results):
    """opsd.py's targets, mask and JSD on the whole logits; each result's gradient cut to the shard."""
    import torch.nn.functional as F
    from deepspeed.runtime.rollout.base import RolloutBatch
    from deepspeed.runtime.rollout.opsd import ResponseTokenBatch, generalized_jsd_loss
    batch = ResponseTokenBatch.from_rollout(RolloutBatch(data["rollout_input_ids"], data["rollout_attention_mask"],
                                                         data["rollout_response_start"]))
    cases = dict(JSD_CASES)
    if world == 1:
        cases["jsd_top_k"] = dict(beta=0.5, temperature=1.0, teacher_top_k=5)

    def keep(name, loss, student):
        loss.backward()
        results[name] = loss.detach()
        results[name + ".grad"] = student.grad[:, :-1, shard].reshape(-1, VOCAB // world)

    student = data["rollout_student"].clone().requires_grad_(True)
    logits = batch.select_causal_logits(student)
    targets = batch.target_ids.masked_fill(~batch.response_mask, -100)
    keep("response_ce", F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1), ignore_index=-100), student)
    for name, options in cases.items():
        student = data["rollout_student"].clone().requires_grad_(True)
        out = generalized_jsd_loss(batch.select_causal_logits(student),
                                   batch.select_causal_logits(data["rollout_teacher"]), batch.response_mask, **options)
        keep(name, out.loss, student)


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
    deepspeed_response_losses(data, world, shard, results)
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
    a = oracle_args(__doc__)
    os.environ["LOOM_BIN"] = a.bin
    with tempfile.TemporaryDirectory(prefix="loom-vp-") as work:
        data = inputs(11)
        data_path = os.path.join(work, "inputs.safetensors")
        save_file(data, data_path)
        for world in (1, 2, 4):
            compare(world, work, data, data_path)
    if failures:
        raise SystemExit(f"{len(failures)} checks failed")


if __name__ == "__main__":
    main()
