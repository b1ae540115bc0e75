"""The reference for bench/gpu: the same Llama-3.2-1B-shaped model trained by transformers +
PyTorch on the same GPU (bf16 autocast over fp32 weights, sdpa, fused AdamW), and the bf16 matmul
rate of an 8192^3 GEMM, in the same run. Prints JSON lines; with --profile, one more: where a
step's GPU time goes (matmuls, attention, the vocabulary's softmax and loss, the optimizer, dtype
copies, the rest) and how much of the step the GPU is idle.

  python3 hf_reference.py --config llama-1b-config.json --seq 2048 --micro 8 --steps 12 [--profile]
"""
import argparse
import json
import time

import torch
import transformers


def matmul_rate():
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    n = 20
    start = time.perf_counter()
    for _ in range(n):
        a @ b
    torch.cuda.synchronize()
    return 2 * 8192 ** 3 * n / (time.perf_counter() - start)


# Kernel names to the part of the step they serve, first match wins.
CATEGORIES = [
    ("communication (NCCL)", ("nccl",)),
    ("attention", ("flash", "fmha", "attention", "sdpa")),
    ("softmax and loss over the vocabulary", ("softmax", "nll_loss", "cross_entropy", "crossentropy", "logprob", "vocab")),
    ("optimizer", ("multi_tensor", "adam", "foreach", "norm_kernel")),
    ("matmul", ("gemm", "cutlass", "xmma", "nvjet", "cublas", "sm90")),
    ("dtype copies", ("copy",)),
    ("copies between host and device, memsets", ("memcpy", "memset")),
]


def categorize(name):
    lower = name.lower()
    for category, keys in CATEGORIES:
        if any(k in lower for k in keys):
            return category
    return "norms, activations, rope and other elementwise"


def profile_step(run_step):
    """Device time per category over one step, and the step's wall time."""
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        run_step()
        torch.cuda.synchronize()
        wall = time.perf_counter() - start
    busy = {}
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            cat = categorize(event.name)
            busy[cat] = busy.get(cat, 0.0) + event.time_range.elapsed_us() / 1e6
    return {"profile": {k: round(v * 1e3, 2) for k, v in sorted(busy.items(), key=lambda kv: -kv[1])},
            "step_ms": round(wall * 1e3, 2), "gpu_busy_ms": round(sum(busy.values()) * 1e3, 2)}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--config", required=True)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--micro", type=int, default=8)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--profile", action="store_true", help="also report where one step's GPU time goes")
    p.add_argument("--experts", help="MoE models: transformers' experts_implementation (eager loops over the "
                   "experts; grouped_mm, its default, runs them as grouped GEMMs)")
    a = p.parse_args()
    print(json.dumps({"matmul_flops": matmul_rate()}), flush=True)
    config = transformers.AutoConfig.from_pretrained(a.config)
    torch.manual_seed(0)
    options = {"experts_implementation": a.experts} if a.experts else {}
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", **options).cuda()
    params = sum(x.numel() for x in model.parameters())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    tokens = torch.randint(0, config.vocab_size, (a.micro, a.seq + 1), device="cuda")
    def run_step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(input_ids=tokens[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.float().view(-1, logits.size(-1)), tokens[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    times = []
    for step in range(a.steps):
        torch.cuda.synchronize()
        start = time.perf_counter()
        loss = run_step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    step_time = sorted(times[2:])[len(times[2:]) // 2]
    print(json.dumps({"reference": "transformers", "experts": a.experts, "parameters": params, "micro": a.micro,
                      "seq": a.seq,
                      "tokens_per_s": a.micro * a.seq / step_time, "loss": loss.item(),
                      "peak_gib": torch.cuda.max_memory_allocated() / 2 ** 30}), flush=True)
    if a.profile:
        print(json.dumps(profile_step(run_step)), flush=True)


if __name__ == "__main__":
    main()
