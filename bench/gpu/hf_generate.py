"""transformers' generate with static batching, the reference of bench/gpu/rollout.sh: a random
model of the given config in bf16 (sdpa attention) on one GPU, a batch of random prompts of equal
length, greedy, exactly max_new_tokens each (min_new_tokens keeps an end token from ending one
early). Prints one JSON line: output tokens/s over the timed run (after one warm-up run of a few
tokens).

  python3 bench/gpu/hf_generate.py --config CONFIG --batch 256 --prompt 128 --new 256
"""
import argparse
import json
import time

import torch
import transformers


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--config", required=True)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--prompt", type=int, default=128)
    p.add_argument("--new", type=int, default=256)
    a = p.parse_args()
    torch.manual_seed(0)
    config = transformers.AutoConfig.from_pretrained(a.config)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16,
                                                          attn_implementation="sdpa").cuda().eval()
    prompts = torch.randint(3, config.vocab_size, (a.batch, a.prompt), device="cuda")
    mask = torch.ones_like(prompts)

    def generate(new):
        return model.generate(prompts, attention_mask=mask, do_sample=False, max_new_tokens=new, min_new_tokens=new,
                              pad_token_id=0)

    generate(4)
    torch.cuda.synchronize()
    start = time.perf_counter()
    out = generate(a.new)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    tokens = (out.shape[1] - a.prompt) * a.batch
    print(json.dumps({"reference": "transformers generate", "version": transformers.__version__, "batch": a.batch,
                      "prompt": a.prompt, "new": a.new, "seconds": seconds, "output_tokens_per_s": tokens / seconds}))


if __name__ == "__main__":
    main()
