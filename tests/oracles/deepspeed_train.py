"""Reference training run: a Hugging Face causal LM trained by DeepSpeed on CPU (gloo), fed exactly
the samples Loom feeds.

  python3 deepspeed_train.py --model DIR --data FILE.tokens --seq-len N --data-seed S --steps N
                             --ds-config FILE.json [--world N] --out FILE.jsonl [--save-dir DIR]
                             [--ds-checkpoint DIR] [--ds-load DIR [--universal]] [--frozen REGEX]

Writes one JSON line per optimizer step to --out (and stdout, from rank 0):
  {"step": s (1-based), "loss": mean loss over the step's micro-batches and ranks,
   "lr": the lr the step's optimizer update used, "grad_norm": global grad norm before clipping}
Data: step s (0-based) takes global positions [s*train_batch_size, (s+1)*train_batch_size) of the
shuffled sample order (token_file.SampleOrder); micro-batch m of rank r takes the `micro` samples at
s*train_batch_size + (m*world + r)*micro. See README.md for the DeepSpeed semantics this exposes.
"""
import argparse
import json
import logging
import os
import re
import socket
import sys

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from token_file import SampleOrder, micro_batch_start, num_samples, read_token_file, sample  # noqa: E402


def grad_norm(params):
    """The 2-norm of all gradients, computed as deepspeed.runtime.utils.clip_grad_norm_ does."""
    norms = [p.grad.detach().float().norm(2) for p in params if p.grad is not None]
    if not norms:  # ZeRO stages 2 and 3 keep gradients in their own partitions
        return float("nan")
    return torch.stack(norms).pow(2).sum().pow(0.5).item()


def worker(rank, world, port, a):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    import deepspeed
    import deepspeed.runtime.engine as ds_engine
    from transformers import AutoModelForCausalLM

    deepspeed.utils.logger.setLevel(logging.WARNING)  # no INFO lines; the rest to stderr, not stdout
    for handler in deepspeed.utils.logger.handlers:
        handler.setStream(sys.stderr)
    # On the CPU accelerator, init JIT-compiles a shared-memory C++ op (about 90 s, needs g++ and
    # ninja) that only inference_all_reduce uses; training's all_reduce is torch.distributed's.
    sys.modules["deepspeed.comm.torch"].build_shm_op = lambda: None  # (deepspeed.comm.torch is torch)
    deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)

    # DeepSpeed's clip_grad_norm_ returns the pre-clip norm, but the engine drops it for a plain
    # (stage 0, fp32) optimizer, whose get_global_grad_norm() stays None: record it here.
    clip_norms = []
    ds_clip = ds_engine.clip_grad_norm_

    def recording_clip(*args, **kwargs):
        norm = ds_clip(*args, **kwargs)
        clip_norms.append(float(norm))
        return norm

    ds_engine.clip_grad_norm_ = recording_clip

    with open(a.ds_config) as f:
        config = json.load(f)
    if a.universal:  # what a universal checkpoint's users set: its loader, not ZeRO's
        config["checkpoint"] = {"load_universal": True}
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32, attn_implementation="sdpa")
    if a.frozen:
        for name, p in model.named_parameters():
            if re.fullmatch(a.frozen, name):
                p.requires_grad_(False)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=[p for p in model.parameters() if p.requires_grad],
                                           config=config)
    micro, ga, tbs = engine.train_micro_batch_size_per_gpu(), engine.gradient_accumulation_steps(), \
        engine.train_batch_size()
    assert tbs == micro * ga * world, (tbs, micro, ga, world)

    _, tokens = read_token_file(a.data)
    order = SampleOrder(num_samples(len(tokens), a.seq_len), a.data_seed)
    out = open(a.out, "w") if rank == 0 else None
    params = [p for p in engine.module.parameters() if p.requires_grad]

    import time
    first = 0
    if a.ds_load:  # DeepSpeed's own resumption: its checkpoint, then `steps` more steps from there
        engine.load_checkpoint(a.ds_load)
        first = engine.global_steps
    for s in range(first, first + a.steps):
        started = time.perf_counter()
        lr = engine.get_lr()[0]  # the scheduler moves the lr after the update, so this is the one used
        loss_sum = 0.0
        for m in range(ga):
            start = micro_batch_start(s, tbs, m, micro, rank, world)
            pairs = [sample(tokens, order.sample_at(start + k), a.seq_len) for k in range(micro)]
            inputs = torch.from_numpy(np.stack([x for x, _ in pairs]))
            labels = torch.from_numpy(np.stack([y for _, y in pairs]))
            logits = engine(input_ids=inputs).logits
            loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), labels.reshape(-1))
            engine.backward(loss)  # scales by 1/ga; all-reduces (averages) grads on the boundary
            loss_sum += loss.item()
            if m == ga - 1:
                assert engine.is_gradient_accumulation_boundary()
                norm = grad_norm(params)  # grads are all-reduced and not yet clipped here
                clip_norms.clear()
            engine.step()
        if engine.get_global_grad_norm() is not None:
            norm = float(engine.get_global_grad_norm())
        elif clip_norms:
            norm = clip_norms[-1]
        mean_loss = torch.tensor([loss_sum / ga], dtype=torch.float64)
        torch.distributed.all_reduce(mean_loss)
        line = {"step": s + 1, "loss": mean_loss.item() / world, "lr": lr, "grad_norm": norm,
                "seconds": time.perf_counter() - started}
        if out:
            out.write(json.dumps(line) + "\n")
            out.flush()
            print(json.dumps(line), flush=True)

    if out:
        out.close()
        if a.save_dir:
            engine.module.save_pretrained(a.save_dir, safe_serialization=True)
    if a.ds_checkpoint:  # DeepSpeed's own checkpoint (every rank writes its partition)
        engine.save_checkpoint(a.ds_checkpoint)
    # DeepSpeed's wandb monitor leaves its run to the interpreter's exit (wandb's atexit hook),
    # which os._exit below skips: end it as that hook would.
    wandb = sys.modules.get("wandb")
    if wandb is not None and wandb.run is not None:
        wandb.finish()
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    # Everything is written and every rank is past the barrier. Leave without the interpreter's
    # teardown: under load a rank has aborted there ("terminate called without an active
    # exception", a C++ thread still joinable at exit), failing a run whose work was done.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--seq-len", type=int, required=True)
    p.add_argument("--data-seed", type=int, required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--ds-config", required=True)
    p.add_argument("--world", type=int, default=1)
    p.add_argument("--out", required=True)
    p.add_argument("--save-dir")
    p.add_argument("--ds-checkpoint")
    p.add_argument("--ds-load", help="resume from this DeepSpeed checkpoint directory and train --steps more")
    p.add_argument("--universal", action="store_true", help="--ds-load names a universal checkpoint")
    p.add_argument("--frozen", help="parameters whose names match this regex are not trained")
    a = p.parse_args()
    # free_port() lets the port go before torch.distributed binds it: a process of a test running
    # beside this one (ctest -j2) can take it in between. Only that collision is retried.
    for attempt in range(3):
        port = free_port()
        try:
            if a.world == 1:
                worker(0, 1, port, a)
            else:
                torch.multiprocessing.spawn(worker, args=(a.world, port, a), nprocs=a.world, join=True)
            return
        except Exception as e:  # noqa: BLE001 - re-raised unless it is the port collision
            text = str(e)
            if attempt == 2 or not ("EADDRINUSE" in text or "address already in use" in text.lower()):
                raise
            print(f"deepspeed_train.py: port {port} was taken before the rendezvous bound it; again",
                  file=sys.stderr)


if __name__ == "__main__":
    main()
