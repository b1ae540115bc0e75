"""Rollout jobs against transformers' generate, end to end through `loomctl run` (a real loomd and
a real CPU rank):

1. Greedy tokens equal transformers' `generate` (do_sample=False, fp32) for llama, qwen2, qwen3
   and mistral (its sliding window of 8 included) on prompts of 3 to 70 tokens, with a prefill
   budget of 32 tokens so that long prompts are computed in chunks; again with a KV cache so small
   that sequences are preempted and recomputed; each returned logprob equals log-softmax of
   transformers' logits at the chosen token within 1e-5.
2. Continuous batching: 64 requests of mixed lengths arriving 20 ms apart (arrival_s) through 8
   running sequences, greedy and
   seeded sampling (top-k, top-p, min-p, n = 2), give each request the tokens it gets in a batch
   of at most 2 sequences (its own two samples, or it and one other request), the first run with
   asynchronous scheduling (the default) and the second without.
3. Text: prompts as text through a byte-level BPE tokenizer trained in the test with the
   `tokenizers` package; the ids, the tokens and the decoded text equal transformers' (its fast
   tokenizer over the same tokenizer.json, generate, decode with skip_special_tokens); a stop
   string ends the text right before it, with finish reason stop.
4. Tensor parallelism 2 (llama, qwen2): the same greedy tokens and logprobs, with prompts in
   chunks and sequences preempted. Mixture-of-experts models (mixtral, qwen2_moe, qwen3_moe): the
   same greedy tokens.
5. Refused, naming the line or field: a prompt longer than the model's context, a KV cache too
   small for one sequence, top_p outside (0, 1], an unknown sampling key.

  python3 tests/oracles/rollout_test.py --bin build/bin [--only greedy|tensor_parallel|moe|batching|text|refusals]
"""
import json
import os
import random
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from loom_runs import oracle_args  # noqa: E402

import torch  # noqa: E402

import parity_test  # noqa: E402
from parity_test import check, loom_run, refused_at_submit  # noqa: E402

VOCAB = 300
# A tiny model's KV block of 16 tokens: 2 layers x (K, V) x 16 tokens x 2 KV heads x 16 x 4 bytes.
BLOCK_BYTES = 2 * 2 * 16 * 2 * 16 * 4


def prompts_of(lengths, seed):
    rng = random.Random(seed)
    return [[rng.randrange(3, VOCAB) for _ in range(n)] for n in lengths]


def write_prompts(path, prompts, sampling=None, arrival=None):
    with open(path, "w") as f:
        for i, p in enumerate(prompts):
            line = {"id": f"r{i}", "prompt_token_ids": p}
            if sampling:
                line["sampling"] = sampling(i)
            if arrival:
                line["arrival_s"] = arrival(i)
            f.write(json.dumps(line) + "\n")


def rollout_spec(name, model_dir, prompts_path, output, **rollout):
    spec = {"name": name, "kind": "rollout", "resources": {"ranks": 1},
            "model": {"config": os.path.join(model_dir, "config.json"), "weights": model_dir},
            "rollout": {"prompts": prompts_path, "output": output, **rollout}}
    return spec


def read_results(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def hf_greedy(model, prompt, max_new):
    out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                         do_sample=False, max_new_tokens=max_new, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def hf_logprobs(model, prompt, tokens):
    """log p(token) of each generated token under transformers' logits."""
    full = torch.tensor([prompt + tokens])
    with torch.no_grad():
        logits = model(full).logits[0].float()
    logprobs = torch.log_softmax(logits, -1)
    return [logprobs[len(prompt) - 1 + i, t].item() for i, t in enumerate(tokens)]


def greedy(bin_dir, work):
    lengths = [3, 17, 70, 1, 40, 33]
    max_new = 24
    for family in ["llama", "qwen2", "qwen3", "mistral"]:
        model_dir = os.path.join(work, family)
        model = parity_test.save_model(family, model_dir, seed=5).eval()
        prompts = prompts_of(lengths, seed=len(family))
        path = os.path.join(work, f"{family}-prompts.jsonl")
        write_prompts(path, prompts, lambda i: {"temperature": 0, "max_new_tokens": max_new})
        expected = [hf_greedy(model, p, max_new) for p in prompts]
        # "plugin": the CPU kernel plugin's norms, RoPE and SwiGLU in place of libtorch's.
        for variant, extra in [("chunked", {"max_num_batched_tokens": 32, "max_num_seqs": 8}),
                               ("preempted", {"max_num_batched_tokens": 32, "max_num_seqs": 8,
                                              "kv_cache_memory_gb": 14 * BLOCK_BYTES / 2**30}),
                               ("plugin", {"max_num_batched_tokens": 32, "max_num_seqs": 8})]:
            output = os.path.join(work, f"{family}-{variant}.jsonl")
            spec = rollout_spec(f"rollout-{family}-{variant}", model_dir, path, output, **extra)
            if variant == "plugin":
                spec["kernels"] = {"plugins": ["cpu"]}
            log = loom_run(bin_dir, spec, work, f"rollout-{family}-{variant}")
            results = read_results(output)
            got = [r["token_ids"] for r in results]
            same = got == expected
            check(same, f"{family} {variant}: greedy tokens equal transformers' generate for {len(prompts)} prompts")
            if not same:
                for i, (g, e) in enumerate(zip(got, expected)):
                    if g != e:
                        print(f"  prompt {i} ({len(prompts[i])} tokens): loom {g}\n  transformers {e}")
            if variant == "preempted":
                preemptions = int(log.split(" preemptions")[0].rsplit(" ", 1)[-1]) if " preemptions" in log else 0
                check(preemptions > 0, f"{family} preempted: {preemptions} preemptions happened")
            if variant == "chunked":
                worst = max(abs(a - b) for r, p in zip(results, prompts)
                            for a, b in zip(r["logprobs"], hf_logprobs(model, p, r["token_ids"])))
                check(worst <= 1e-5, f"{family}: logprobs equal log-softmax of transformers' logits (max diff {worst:.2e})")
                check(all(r["finish_reason"] in ("length", "eos") for r in results), f"{family}: finish reasons")


def tensor_parallel(bin_dir, work):
    """Two ranks split the model (AutoTP): rank 0 schedules and samples, both compute each step."""
    lengths = [3, 17, 70, 1, 40]
    max_new = 20
    for family in ["llama", "qwen2"]:
        model_dir = os.path.join(work, f"tp-{family}")
        model = parity_test.save_model(family, model_dir, seed=8).eval()
        prompts = prompts_of(lengths, seed=21)
        path = os.path.join(work, f"tp-{family}-prompts.jsonl")
        write_prompts(path, prompts, lambda i: {"temperature": 0, "max_new_tokens": max_new, "logprobs": 2})
        expected = [hf_greedy(model, p, max_new) for p in prompts]
        output = os.path.join(work, f"tp-{family}.jsonl")
        # Each rank holds one of the two KV heads: half a block's bytes.
        spec = rollout_spec(f"rollout-tp-{family}", model_dir, path, output, max_num_batched_tokens=32, max_num_seqs=8,
                            kv_cache_memory_gb=14 * BLOCK_BYTES / 2 / 2**30)
        spec["resources"]["ranks"] = 2
        spec["deepspeed"] = {"tensor_parallel": {"autotp_size": 2}}
        log = loom_run(bin_dir, spec, work, f"rollout-tp-{family}")
        results = read_results(output)
        got = [r["token_ids"] for r in results]
        check("tensor parallel 2" in log and got == expected,
              f"{family} tensor parallel 2: greedy tokens equal transformers' generate, prompts in chunks")
        preemptions = int(log.split(" preemptions")[0].rsplit(" ", 1)[-1]) if " preemptions" in log else 0
        check(preemptions > 0, f"{family} tensor parallel 2: {preemptions} preemptions happened (14 blocks)")
        worst = max((abs(a - b) for r, p in zip(results, prompts)
                     for a, b in zip(r["logprobs"], hf_logprobs(model, p, r["token_ids"]))), default=1)
        check(worst <= 1e-5, f"{family} tensor parallel 2: logprobs over the gathered vocabulary (max diff {worst:.2e})")


def mixture_of_experts(bin_dir, work):
    """Mixtral, Qwen2-MoE (a shared expert, a dense layer) and Qwen3-MoE: routed experts per token."""
    from make_tiny_model import make_moe_model
    prompts = prompts_of([3, 17, 40, 1], seed=2)
    max_new = 12
    for family in ["mixtral", "qwen2_moe", "qwen3_moe"]:
        model_dir = os.path.join(work, family)
        model = make_moe_model(family, VOCAB, 4).eval()
        model.save_pretrained(model_dir)
        path = os.path.join(work, f"{family}-prompts.jsonl")
        write_prompts(path, prompts, lambda i: {"temperature": 0, "max_new_tokens": max_new})
        output = os.path.join(work, f"{family}-moe.jsonl")
        loom_run(bin_dir, rollout_spec(f"rollout-{family.replace('_', '-')}", model_dir, path, output,
                                       max_num_batched_tokens=32, max_num_seqs=8), work, f"rollout-{family}")
        got = [r["token_ids"] for r in read_results(output)]
        check(got == [hf_greedy(model, p, max_new) for p in prompts],
              f"{family}: greedy tokens equal transformers' generate")


def batching(bin_dir, work):
    model_dir = os.path.join(work, "batching-llama")
    parity_test.save_model("llama", model_dir, seed=9)
    rng = random.Random(4)
    prompts = prompts_of([rng.randrange(1, 60) for _ in range(64)], seed=11)

    def sampling(i):
        if i % 4 == 0:
            return {"temperature": 0, "max_new_tokens": 1 + i % 23}
        return {"temperature": 0.8, "top_k": 40 if i % 3 else -1, "top_p": 0.9 if i % 2 else 1.0,
                "min_p": 0.05 if i % 5 == 1 else 0.0, "seed": 1000 + i, "n": 2 if i % 7 == 1 else 1,
                "max_new_tokens": 5 + i % 19, "ignore_eos": i % 3 == 0}

    runs = {}
    # Together: the requests arrive over 1.3 s, 20 ms apart, and join the running batch as they come.
    for name, extra, arrival in [("together", {"max_num_seqs": 8, "max_num_batched_tokens": 48}, lambda i: i * 0.02),
                                 ("alone", {"max_num_seqs": 2, "max_num_batched_tokens": 64, "async_scheduling": False}, None)]:
        path = os.path.join(work, f"batching-{name}-prompts.jsonl")
        write_prompts(path, prompts, sampling, arrival)
        output = os.path.join(work, f"batching-{name}.jsonl")
        loom_run(bin_dir, rollout_spec(f"rollout-batching-{name}", model_dir, path, output, **extra), work,
                 f"rollout-batching-{name}")
        runs[name] = {(r["id"], r["sample"]): r["token_ids"] for r in read_results(output)}
    samples = sum(2 if i % 7 == 1 and i % 4 else 1 for i in range(64))
    check(len(runs["together"]) == samples, f"batching: {len(runs['together'])} samples written of {samples}")
    differ = [k for k in runs["alone"] if runs["together"].get(k) != runs["alone"][k]]
    check(not differ, f"batching: 64 requests arriving over time through 8 running sequences get the tokens each gets alone "
                      f"(differ: {differ[:5]})")


def train_tokenizer(out_dir):
    """A byte-level BPE of 299 tokens (the 256 bytes, merges, one special token) for the tiny
    models' vocabulary of 300, trained on the GPL's text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=299, special_tokens=["<|end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train(["/usr/share/common-licenses/GPL-3"], trainer)
    os.makedirs(out_dir, exist_ok=True)
    tokenizer.save(os.path.join(out_dir, "tokenizer.json"))
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump({"eos_token": "<|end|>", "tokenizer_class": "PreTrainedTokenizerFast"}, f)
    return out_dir


def text(bin_dir, work):
    from transformers import PreTrainedTokenizerFast
    model_dir = os.path.join(work, "text-llama")
    model = parity_test.save_model("llama", model_dir, seed=6).eval()
    tokenizer_dir = train_tokenizer(os.path.join(work, "text-tokenizer"))
    hf_tokenizer = PreTrainedTokenizerFast(tokenizer_file=os.path.join(tokenizer_dir, "tokenizer.json"))
    texts = ["This License applies to any program", "The GNU General Public License is a free, copyleft license",
             "  You may convey verbatim copies\n\tof the Program's source code", "été — café 😀"]
    max_new = 30
    path = os.path.join(work, "text-prompts.jsonl")
    with open(path, "w") as f:
        for i, t in enumerate(texts):
            f.write(json.dumps({"id": f"t{i}", "prompt": t, "sampling": {"temperature": 0, "max_new_tokens": max_new,
                                                                         "ignore_eos": True}}) + "\n")
    output = os.path.join(work, "text-output.jsonl")
    loom_run(bin_dir, rollout_spec("rollout-text", model_dir, path, output, tokenizer=tokenizer_dir), work, "rollout-text")
    results = read_results(output)
    for r, t in zip(results, texts):
        ids = hf_tokenizer(t)["input_ids"]
        expected = hf_greedy(model, ids, max_new)
        check(r["prompt_tokens"] == len(ids), f"text {r['id']}: the prompt's {len(ids)} ids equal transformers' tokenizer's")
        check(r["token_ids"] == expected, f"text {r['id']}: greedy tokens equal transformers' generate")
        want = hf_tokenizer.decode(expected, skip_special_tokens=True)
        check(r["text"] == want, f"text {r['id']}: text equals transformers' decode ({r['text']!r})")
    # A stop string taken from the middle of the first output ends it right before the string.
    full = results[0]["text"]
    plain = [i for i in range(len(full) // 3, len(full) - 1) if full[i:i + 2].isascii() and full[i:i + 2].isprintable()]
    stop = full[plain[0]:plain[0] + 2] if plain else full[len(full) // 2:len(full) // 2 + 3]
    with open(path, "w") as f:
        f.write(json.dumps({"id": "s", "prompt": texts[0], "sampling": {"temperature": 0, "max_new_tokens": max_new,
                                                                        "ignore_eos": True, "stop": [stop]}}) + "\n")
    loom_run(bin_dir, rollout_spec("rollout-stop", model_dir, path, output, tokenizer=tokenizer_dir), work, "rollout-stop")
    stopped = read_results(output)[0]
    check(stopped["finish_reason"] == "stop" and stopped["text"] == full[:full.find(stop)],
          f"stop string {stop!r}: text {stopped['text']!r}, finish reason {stopped['finish_reason']}")
    check(stopped["token_ids"] == results[0]["token_ids"][:len(stopped["token_ids"])],
          "stop string: the tokens are the unstopped run's, up to the one that completed the string")


def refusals(bin_dir, work):
    model_dir = os.path.join(work, "refusals-llama")
    parity_test.save_model("llama", model_dir, seed=2)
    path = os.path.join(work, "refusals-prompts.jsonl")

    def fails(name, prompts_text, expected, **extra):
        with open(path, "w") as f:
            f.write(prompts_text)
        job = "refused-" + name.replace(" ", "-")
        out = loom_run(bin_dir, rollout_spec(job, model_dir, path, os.path.join(work, "x.jsonl"), **extra), work, job,
                       expect_failure=True)
        check(expected in out, f"refused ({name}): {expected}")

    long_prompt = json.dumps({"prompt_token_ids": [5] * 300}) + "\n"
    fails("prompt longer than the context", '{"prompt_token_ids": [5, 6]}\n' + long_prompt,
          "rollout.prompts: line 2: prompt: 300 tokens leave no room for output in the model's context of 256")
    fails("KV cache too small for one sequence", '{"prompt_token_ids": [5, 6, 7], "sampling": {"max_new_tokens": 100}}\n',
          "KV blocks of 16 tokens, and the KV cache holds 4", kv_cache_memory_gb=4 * BLOCK_BYTES / 2**30)
    fails("top_p in a prompt line", '{"prompt_token_ids": [5], "sampling": {"top_p": 0}}\n',
          "line 1: sampling.top_p: 0 is outside (0, 1]")
    fails("unknown sampling key", '{"prompt_token_ids": [5], "sampling": {"best_of": 2}}\n',
          "line 1: sampling.best_of: unknown key")
    fails("text without a tokenizer", '{"prompt": "hello"}\n', "line 1: prompt: a text prompt needs rollout.tokenizer")
    fails("stop strings without a tokenizer", '{"prompt_token_ids": [5], "sampling": {"stop": ["x"]}}\n',
          "line 1: sampling.stop: stop strings need rollout.tokenizer")
    fails("token outside the vocabulary", '{"prompt_token_ids": [5, 300]}\n',
          "line 1: prompt_token_ids[1]: 300 is outside the model's vocabulary of 300")
    spec = rollout_spec("refused-top-p", model_dir, path, os.path.join(work, "x.jsonl"), sampling={"top_p": 1.5})
    refused_at_submit(bin_dir, work, "rollout.sampling.top_p", spec, "rollout.sampling.top_p")


def main():
    a = oracle_args(__doc__, only=["greedy", "tensor_parallel", "moe", "batching", "text", "refusals"])
    bin_dir = a.bin
    torch.set_num_threads(2)
    with tempfile.TemporaryDirectory(prefix="loom-rollout-") as work:
        if a.only in (None, "greedy"):
            greedy(bin_dir, work)
        if a.only in (None, "tensor_parallel"):
            tensor_parallel(bin_dir, work)
        if a.only in (None, "moe"):
            mixture_of_experts(bin_dir, work)
        if a.only in (None, "batching"):
            batching(bin_dir, work)
        if a.only in (None, "text"):
            text(bin_dir, work)
        if a.only in (None, "refusals"):
            refusals(bin_dir, work)
    return parity_test.exit_code()


if __name__ == "__main__":
    sys.exit(main())
