"""DeepSpeed on the GPU, for bench/gpu: the Llama-3.2-1B-shaped model of hf_reference.py (random
init, sdpa) trained by DeepSpeed's engine on one GPU with the config Loom's runs use (bf16 with
fp32 masters, AdamW through torch, gradient clipping 1.0, the given ZeRO stage). Prints one JSON
line; "error" instead of "tokens_per_s" when DeepSpeed does not run here.

  python3 deepspeed_reference.py --config llama-1b-config.json --stage 0 --seq 2048 --micro 8 --steps 12
"""
import argparse
import json
import logging
import os
import socket
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
    a = p.parse_args()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1",
                      LOCAL_RANK="0")
    result = {"reference": "deepspeed", "stage": a.stage, "micro": a.micro, "seq": a.seq}
    try:
        import deepspeed
        import torch
        import transformers
        deepspeed.utils.logger.setLevel(logging.WARNING)
        result["version"] = deepspeed.__version__
        deepspeed.init_distributed(dist_backend="nccl", auto_mpi_discovery=False)
        config = transformers.AutoConfig.from_pretrained(a.config)
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
        ds_config = {"train_batch_size": a.micro, "train_micro_batch_size_per_gpu": a.micro,
                     "gradient_clipping": 1.0, "bf16": {"enabled": True}, "steps_per_print": 1000,
                     "zero_optimization": {"stage": a.stage},
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
        result.update(tokens_per_s=a.micro * a.seq / step_time, loss=loss.item(),
                      peak_gib=torch.cuda.max_memory_allocated() / 2 ** 30)
    except Exception as e:  # reported, not raised: the benchmark goes on without it
        result["error"] = f"{type(e).__name__}: {e}"
    print(json.dumps(result), flush=True)
    return 0 if "error" not in result else 1


if __name__ == "__main__":
    sys.exit(main())
