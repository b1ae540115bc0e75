"""Rollout on the CPU: output tokens/s of a small Llama-shaped model, Loom's rollout job against
transformers' generate with static batching on the same model, prompts and threads, in one run.

  python3 bench/rollout_cpu/run.py --bin build/bin [--batch 32] [--prompt 64] [--new 128] [--threads 2]

The model (hidden 512, 6 layers, 8 heads / 4 KV heads, intermediate 1408, vocabulary 8192,
random init, fp32) generates greedily, end tokens ignored, exactly `new` tokens per prompt.
Loom runs `kind: rollout` through `loomctl run` (a real loomd and one rank) with max_num_seqs =
batch; its time is the rollout loop's own (the results line of its log), model load excluded.
transformers runs `generate` once to warm up, then timed. Prints a markdown table.
"""
import argparse
import glob
import json
import os
import random
import re
import subprocess
import tempfile
import time

CONFIG = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 8192, "hidden_size": 512,
          "intermediate_size": 1408, "num_hidden_layers": 6, "num_attention_heads": 8, "num_key_value_heads": 4,
          "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False,
          "bos_token_id": 1, "eos_token_id": 2}


def transformers_generate(model_dir, prompts, new, threads):
    import torch
    import transformers
    torch.set_num_threads(threads)
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = torch.tensor(prompts)
    mask = torch.ones_like(ids)

    def generate(n):
        with torch.no_grad():
            return model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=n, min_new_tokens=n,
                                  pad_token_id=0)

    generate(2)
    start = time.perf_counter()
    out = generate(new)
    seconds = time.perf_counter() - start
    return (out.shape[1] - ids.shape[1]) * ids.shape[0] / seconds, transformers.__version__


def loom_rollout(bin_dir, work, model_dir, prompts, new):
    path = os.path.join(work, "prompts.jsonl")
    with open(path, "w") as f:
        for p in prompts:
            f.write(json.dumps({"prompt_token_ids": p, "sampling": {"temperature": 0, "max_new_tokens": new,
                                                                     "ignore_eos": True}}) + "\n")
    spec = {"name": "bench-rollout-cpu", "kind": "rollout", "resources": {"ranks": 1},
            "model": {"config": os.path.join(model_dir, "config.json"), "weights": model_dir},
            "rollout": {"prompts": path, "output": os.path.join(work, "out.jsonl"), "max_num_seqs": len(prompts),
                        "max_num_batched_tokens": 4096}}
    spec_path = os.path.join(work, "loom.json")
    with open(spec_path, "w") as f:
        json.dump(spec, f)
    state = os.path.join(work, "state")
    subprocess.run([os.path.join(bin_dir, "loomctl"), "run", spec_path, "--state-dir", state], check=True,
                   capture_output=True, timeout=3600)
    log = open(glob.glob(os.path.join(state, "jobs", "*", "attempt-1", "rank-0.log"))[0]).read()
    return float(re.search(r"([\d.]+) output tokens/s", log).group(1))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bin", required=True)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--prompt", type=int, default=64)
    p.add_argument("--new", type=int, default=128)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    a = p.parse_args()
    import torch
    import transformers
    torch.manual_seed(0)
    rng = random.Random(0)
    prompts = [[rng.randrange(3, CONFIG["vocab_size"]) for _ in range(a.prompt)] for _ in range(a.batch)]
    with tempfile.TemporaryDirectory(prefix="loom-bench-rollout-cpu-") as work:
        model_dir = os.path.join(work, "model")
        config = transformers.LlamaConfig(**{k: v for k, v in CONFIG.items() if k not in ("model_type", "architectures")})
        transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(model_dir)
        hf, version = transformers_generate(model_dir, prompts, a.new, a.threads)
        loom = loom_rollout(os.path.abspath(a.bin), work, model_dir, prompts, a.new)
    print(f"{a.batch} prompts x ({a.prompt} + {a.new} new tokens), fp32, {a.threads} threads")
    print("| run | output tokens/s | vs transformers |")
    print("|---|---|---|")
    print(f"| transformers {version} generate (static batch) | {hf:,.0f} | 1.00x |")
    print(f"| Loom rollout | {loom:,.0f} | {loom / hf:.2f}x |")


if __name__ == "__main__":
    main()
