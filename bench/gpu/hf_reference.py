"""The reference for bench/gpu: the same Llama-3.2-1B-shaped model trained by transformers +
PyTorch on the same GPU (bf16 autocast over fp32 weights, sdpa, fused AdamW), and the bf16 matmul
rate of an 8192^3 GEMM, in the same run. Prints JSON lines.

  python3 hf_reference.py --config llama-1b-config.json --seq 2048 --micro 8 --steps 12
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


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--config", required=True)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--micro", type=int, default=8)
    p.add_argument("--steps", type=int, default=12)
    a = p.parse_args()
    print(json.dumps({"matmul_flops": matmul_rate()}), flush=True)
    config = transformers.AutoConfig.from_pretrained(a.config)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").cuda()
    params = sum(x.numel() for x in model.parameters())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    tokens = torch.randint(0, config.vocab_size, (a.micro, a.seq + 1), device="cuda")
    times = []
    for step in range(a.steps):
        torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(input_ids=tokens[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.float().view(-1, logits.size(-1)), tokens[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    step_time = sorted(times[2:])[len(times[2:]) // 2]
    print(json.dumps({"reference": "transformers", "parameters": params, "micro": a.micro, "seq": a.seq,
                      "tokens_per_s": a.micro * a.seq / step_time, "loss": loss.item(),
                      "peak_gib": torch.cuda.max_memory_allocated() / 2 ** 30}), flush=True)


if __name__ == "__main__":
    main()
