"""Rollout on a GPU in bf16, through `loomctl run` with the CUDA kernel plugin: the paths the CPU
oracle (tests/oracles/rollout_test.py) cannot reach — the paged decode kernel, prompt chunks
through flash attention's variable-length form over keys gathered from the cache, the fused
projections in bf16, q/k norms, RoPE and the cache write in one kernel, CUDA graphs of decode steps and the warm-up before the first request. The
reference is transformers' forward in fp32 on the same (bf16) weights, teacher-forced over Loom's
tokens: each token Loom chose is the reference's likeliest within bf16's error, and its logprob is
the reference's within it too. Seeded sampling (top-k, top-p, n = 2) draws only tokens the
reference's top-k admits, with the reference's logprobs, and the same tokens when run again. Prompts longer than the step's token budget are computed in
chunks beside other sequences' decodes. scripts/gpu/build-and-test runs it (gpu-tests):

  python3 tests/gpu/rollout_test.py --bin build-gpu/bin
"""
import argparse
import json
import os
import random
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "oracles"))

from loom_runs import check, exit_code, loom_run  # noqa: E402

VOCAB, MAX_NEW = 4096, 16
LENGTHS = [3, 17, 70, 1, 40, 33, 130, 5, 64, 200, 16, 90]
# bf16 against fp32 through 4 layers: logprobs agree within 0.08 (libtorch's bf16 on the CPU);
# a wrong key, position or weight moves them by about a nat (these models' logits spread so).
TOLERANCE = 0.2


def config(family):
    c = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": VOCAB, "hidden_size": 512,
         "intermediate_size": 1408, "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 4,
         "head_dim": 64, "max_position_embeddings": 1024, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
         "hidden_act": "silu", "initializer_range": 0.05, "tie_word_embeddings": False,
         "torch_dtype": "bfloat16"}
    if family == "qwen2":  # biases on q, k and v: the fused projection's bias
        c.update(architectures=["Qwen2ForCausalLM"], model_type="qwen2", use_sliding_window=False)
    if family == "qwen3":  # per-head norms of q and k, inside the fused RoPE and cache write
        c.update(architectures=["Qwen3ForCausalLM"], model_type="qwen3", use_sliding_window=False)
    if family == "mistral":  # a window shorter than the longer prompts, in both attention paths
        c.update(architectures=["MistralForCausalLM"], model_type="mistral", sliding_window=48)
    return c


def save_model(torch, transformers, family, out):
    torch.manual_seed(3)
    model = transformers.AutoConfig.for_model(**config(family))
    model = transformers.AutoModelForCausalLM.from_config(model, dtype=torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    # The reference: the same bf16 weights, computed in fp32.
    return model.float().cuda().eval()


def teacher_forced(torch, reference, prompt, tokens):
    """The fp32 reference's log-softmax at each of `tokens`' positions after `prompt`, [len, vocab]."""
    with torch.no_grad():
        logits = reference(torch.tensor([prompt + tokens], device="cuda")).logits[0].float()
    return torch.log_softmax(logits[len(prompt) - 1:-1], -1)


def sampled(torch, bin_dir, work, prompts, reference):
    """Seeded sampling (temperature, top-k, top-p, n = 2) on the llama model with CUDA graphs: each
    token is one the reference's top-k admits (within bf16's error of its k-th logprob), its logprob
    is the reference's (the raw distribution's, as returned), and a second run of the same job
    draws the same tokens."""
    top_k, temperature = 20, 0.8
    path = os.path.join(work, "sampled-prompts.jsonl")
    with open(path, "w") as f:
        for i, p in enumerate(prompts):
            f.write(json.dumps({"prompt_token_ids": p, "sampling": {
                "temperature": temperature, "top_k": top_k, "top_p": 0.95, "seed": 100 + i, "n": 2,
                "max_new_tokens": MAX_NEW, "ignore_eos": True}}) + "\n")
    runs = []
    for attempt in (1, 2):
        name = f"llama-sampled-{attempt}"
        output = os.path.join(work, name + ".jsonl")
        spec = {"name": f"gpu-rollout-{name}", "kind": "rollout", "resources": {"ranks": 1, "device": "cuda"},
                "kernels": {"plugins": ["cuda"]},
                "model": {"config": os.path.join(work, "llama", "config.json"), "weights": os.path.join(work, "llama")},
                "rollout": {"prompts": path, "output": output, "max_num_seqs": 8, "max_num_batched_tokens": 64,
                            "cuda_graphs": True, "kv_cache_memory_gb": 1}}
        loom_run(bin_dir, spec, work, name, timeout=600)
        with open(output) as f:
            runs.append([json.loads(line) for line in f])
    first, second = runs
    check(len(first) == 2 * len(prompts) and all(len(r["token_ids"]) == MAX_NEW for r in first),
          f"sampled: {MAX_NEW} tokens for each of 2 samples of {len(prompts)} prompts")
    check([r["token_ids"] for r in first] == [r["token_ids"] for r in second],
          "sampled: a second run with the same seeds draws the same tokens")
    distinct = sum(a["token_ids"] != b["token_ids"] for a, b in zip(first[0::2], first[1::2]))
    check(distinct >= len(prompts) // 2, f"sampled: the two samples of a prompt differ ({distinct} of {len(prompts)})")
    worst_logprob, worst_outside = 0.0, float("-inf")
    for i, result in enumerate(first):
        prompt, tokens = prompts[i // 2], result["token_ids"]
        logprobs = teacher_forced(torch, reference, prompt, tokens)
        chosen = logprobs[torch.arange(len(tokens)), torch.tensor(tokens, device="cuda")]
        worst_logprob = max(worst_logprob, (chosen - torch.tensor(result["logprobs"], device="cuda")).abs().max().item())
        kth = logprobs.topk(top_k, -1).values[:, -1]
        worst_outside = max(worst_outside, (kth - chosen).max().item())  # > 0: below the k-th
    check(worst_logprob <= TOLERANCE,
          f"sampled: logprobs equal the fp32 reference's within {worst_logprob:.3f} (at most {TOLERANCE})")
    check(worst_outside <= TOLERANCE,
          f"sampled: every token is within the reference's top {top_k} (worst {worst_outside:.3f} nats below "
          f"its k-th)")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin", required=True)
    bin_dir = os.path.abspath(parser.parse_args().bin)
    import torch
    import transformers
    if not torch.cuda.is_available():
        print("SKIPPED: no GPU")
        return 0
    work = tempfile.mkdtemp(prefix="loom-gpu-rollout-")
    try:
        rng = random.Random(11)
        prompts = [[rng.randrange(VOCAB) for _ in range(n)] for n in LENGTHS]
        prompts_path = os.path.join(work, "prompts.jsonl")
        with open(prompts_path, "w") as f:
            for p in prompts:
                f.write(json.dumps({"prompt_token_ids": p, "sampling": {"temperature": 0, "max_new_tokens": MAX_NEW,
                                                                       "ignore_eos": True}}) + "\n")
        reference_of = {}
        for family, graphs in [("llama", True), ("llama", False), ("qwen2", True), ("qwen3", True),
                               ("mistral", True)]:
            model_dir = os.path.join(work, family)
            if not os.path.exists(model_dir):
                reference_of[family] = save_model(torch, transformers, family, model_dir)
            reference = reference_of[family]
            name = f"{family}-{'graphs' if graphs else 'eager'}"
            output = os.path.join(work, name + ".jsonl")
            spec = {"name": f"gpu-rollout-{name}", "kind": "rollout", "resources": {"ranks": 1, "device": "cuda"},
                    "kernels": {"plugins": ["cuda"]},
                    "model": {"config": os.path.join(model_dir, "config.json"), "weights": model_dir},
                    "rollout": {"prompts": prompts_path, "output": output, "max_num_seqs": 8,
                                "max_num_batched_tokens": 64, "cuda_graphs": graphs, "kv_cache_memory_gb": 1}}
            log = loom_run(bin_dir, spec, work, name, timeout=600)
            check("warmed up in" in log, f"{name}: the engine warmed up before the first request")
            check(("CUDA graphs on" in log) == graphs, f"{name}: CUDA graphs {'on' if graphs else 'off'}")
            with open(output) as f:
                results = [json.loads(line) for line in f]
            worst_logprob, worst_choice = 0.0, 0.0
            for prompt, result in zip(prompts, results):
                tokens = result["token_ids"]
                logprobs = teacher_forced(torch, reference, prompt, tokens)
                chosen = logprobs[torch.arange(len(tokens)), torch.tensor(tokens, device="cuda")]
                worst_logprob = max(worst_logprob, (chosen - torch.tensor(result["logprobs"], device="cuda")).abs().max().item())
                worst_choice = max(worst_choice, (logprobs.max(-1).values - chosen).max().item())
            check(len(results) == len(prompts) and all(len(r["token_ids"]) == MAX_NEW for r in results),
                  f"{name}: {MAX_NEW} tokens for each of {len(prompts)} prompts")
            check(worst_choice <= TOLERANCE,
                  f"{name}: every greedy token is the reference's likeliest within {worst_choice:.3f} nats")
            check(worst_logprob <= TOLERANCE,
                  f"{name}: logprobs equal the fp32 reference's within {worst_logprob:.3f} (at most {TOLERANCE})")
        sampled(torch, bin_dir, work, prompts, reference_of["llama"])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return exit_code()


if __name__ == "__main__":
    sys.exit(main())
