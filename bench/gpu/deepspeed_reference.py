"""DeepSpeed on the GPU, for bench/gpu: the Llama-3.2-1B-shaped model of hf_reference.py (random
init, sdpa) trained by DeepSpeed's engine with the config Loom's runs use (bf16 with fp32
masters, AdamW through torch, gradient clipping 1.0, the given ZeRO stage; --offload-param: stage 3
with the parameters in pinned host memory), on one GPU or, with --gpus N, on N GPUs of this host (one process per GPU, NCCL; the global batch is micro x N).
Prints one JSON line (rank 0's); "error" instead of "tokens_per_s" when DeepSpeed does not run
here.

  python3 deepspeed_reference.py --config llama-1b-config.json --stage 0 --seq 2048 --micro 8 --steps 12 [--gpus 2]
"""
import argparse
import json
import logging
import os
import socket
import subprocess
import sys
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--config", required=True)
    p.add_argument("--stage", type=int, default=0)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--micro", type=int, default=8)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--gpus", type=int, default=1)
    p.add_argument("--offload-param", action="store_true")
    a = p.parse_args()
    if "RANK" not in os.environ:
        return launch(a.gpus)
    rank = int(os.environ["RANK"])
    result = {"reference": "deepspeed", "stage": a.stage, "micro": a.micro, "seq": a.seq, "gpus": a.gpus,
              "offload_param": a.offload_param}
    try:
        import deepspeed
        import torch
        import transformers
        deepspeed.utils.logger.setLevel(logging.WARNING)
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        result["version"] = deepspeed.__version__
        deepspeed.init_distributed(dist_backend="nccl", auto_mpi_discovery=False)
        config = transformers.AutoConfig.from_pretrained(a.config)
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
        ds_config = {"train_batch_size": a.micro * a.gpus, "train_micro_batch_size_per_gpu": a.micro,
                     "gradient_clipping": 1.0, "bf16": {"enabled": True}, "steps_per_print": 1000,
                     "zero_optimization": {"stage": a.stage, **({"offload_param": {"device": "cpu", "pin_memory": True}}
                                                                if a.offload_param else {})},
                     # torch's AdamW: DeepSpeed's FusedAdam would JIT-compile a CUDA extension first.
                     "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True}}}
        engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds_config)
        tokens = torch.randint(0, config.vocab_size, (a.micro, a.seq + 1), device=engine.device)
        times = []
        for _ in range(a.steps):
            torch.cuda.synchronize()
            start = time.perf_counter()
            logits = engine(input_ids=tokens[:, :-1]).logits
            loss = torch.nn.functional.cross_entropy(logits.float().view(-1, logits.size(-1)),
                                                     tokens[:, 1:].reshape(-1))
            engine.backward(loss)
            engine.step()
            torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        step_time = sorted(times[2:])[len(times[2:]) // 2]
        result.update(tokens_per_s=a.micro * a.gpus * a.seq / step_time, loss=loss.item(),
                      peak_gib=torch.cuda.max_memory_allocated() / 2 ** 30)
    except Exception as e:  # reported, not raised: the benchmark goes on without it
        result["error"] = f"{type(e).__name__}: {e}"
    if rank == 0:
        print(json.dumps(result), flush=True)
    return 0 if "error" not in result else 1


def launch(gpus):
    """One process per GPU, as torchrun would start them; rank 0's line is the result."""
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(gpus))
    ranks = [subprocess.Popen([sys.executable] + sys.argv, env=dict(env, RANK=str(r), LOCAL_RANK=str(r)))
             for r in range(gpus)]
    codes = [r.wait() for r in ranks]
    return max(codes)


if __name__ == "__main__":
    sys.exit(main())
