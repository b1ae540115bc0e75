"""AutoTP against one rank, end to end through `loomctl run` (real loomd, 4 real CPU ranks over UCX):

1. Training: 20 fp32 steps of the same global batch on 4 ranks laid out tp2 x dp2 (ZeRO 0, 1, 2
   and 3) and tp4, against the same job on 1 rank: losses within 1e-5 relative at every step,
   final weights (the checkpoint's whole HF tensors) within 1e-5. Models: llama with attention
   and MLP biases (row-parallel biases whole, added once), qwen2 tied with q/k/v biases (one
   embedding shard serves as head), qwen3 (q/k norms, whole, their gradients summed), and at tp4
   every model's 2 KV heads shared by 2 ranks each.
2. Memory: at tp2 a rank holds about half of the 1-rank job's parameter, gradient and
   optimizer-state bytes.
3. Checkpoints: a tp2 x dp2 ZeRO-1 job stopped half way and resumed from its checkpoint ends with
   the weights of the uninterrupted job; resuming it at tp4 is refused, naming both layouts.
4. Eval: logprobs at tp2 and tp4 equal transformers' within 1e-5, and so do the per-token entropy
   and KL(reference || model) that eval.entropy and eval.kl_reference ask for (tp2, the losses
   computed 7 rows at a time).
5. Refusals at submit: a tensor-parallel size that does not divide the heads, and a layer spec
   that changes the layout the workers run.

  python3 tests/oracles/tensor_parallel_test.py --bin build/bin
"""
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from loom_runs import oracle_args  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

import parity_test  # noqa: E402
from make_tiny_model import make_config  # noqa: E402
from parity_test import (check, compare_with_one_rank, final_weights, refused_at_submit, loom_losses,  # noqa: E402
                         loom_run, memory_line)
from token_file import sample, write_token_file  # noqa: E402

SEQ, STEPS, VOCAB = 24, 20, 300


def save_model(family, out, seed, tie=False, biases=False):
    torch.manual_seed(seed)
    config = make_config(family, VOCAB, tie, False)
    if biases:
        config.attention_bias = True
        config.mlp_bias = True
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(out, safe_serialization=True)
    return model


def train_spec(name, model_dir, data, ranks, tp, zero, checkpoints, steps=STEPS):
    ds = {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2, "gradient_clipping": 1.0,
          "steps_per_print": 1,
          "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.01}},
          "scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": 3e-3, "warmup_num_steps": 5}},
          "zero_optimization": zero}
    if tp > 1:
        ds["tensor_parallel"] = {"autotp_size": tp}
    return {"name": name, "kind": "train", "resources": {"ranks": ranks},
            "model": {"config": model_dir + "/config.json", "weights": model_dir},
            "data": {"train": data, "seq_len": SEQ, "seed": 4},
            "train": {"steps": steps, "checkpoint_dir": checkpoints}, "deepspeed": ds}


def training(bin_dir, work, data):
    cases = {
        "llama-bias": dict(family="llama", biases=True, runs={
            "tp2-zero0": (2, {"stage": 0}), "tp2-zero1": (2, {"stage": 1}),
            "tp2-zero2": (2, {"stage": 2, "reduce_bucket_size": 3000}),
            "tp2-zero3": (2, {"stage": 3, "stage3_param_persistence_threshold": 100}),
            "tp4-zero0": (4, {"stage": 0})}),
        "qwen2-tied": dict(family="qwen2", tie=True, runs={
            "tp2-zero2": (2, {"stage": 2, "overlap_comm": True}), "tp4-zero1": (4, {"stage": 1})}),
        "qwen3": dict(family="qwen3", runs={
            "tp2-zero1": (2, {"stage": 1}), "tp4-zero3": (4, {"stage": 3, "stage3_param_persistence_threshold": 100})}),
    }
    for model_name, case in cases.items():
        model_dir = os.path.join(work, model_name)
        save_model(case["family"], model_dir, seed=len(model_name), tie=case.get("tie", False),
                   biases=case.get("biases", False))
        reference_dir = os.path.join(work, model_name + "-1rank")
        log = loom_run(bin_dir, train_spec(model_name + "-1rank", model_dir, data, 1, 1, {"stage": 0}, reference_dir),
                       work, model_name + "-1rank")
        reference_log, reference_weights = log, final_weights(reference_dir, STEPS)
        reference_memory = memory_line(log)
        check(len(loom_losses(log)) == STEPS, f"{model_name}: the 1-rank job logged {len(loom_losses(log))} steps")
        for run, (tp, zero) in case["runs"].items():
            name = f"{model_name}-{run}"
            checkpoints = os.path.join(work, name)
            log = loom_run(bin_dir, train_spec(name, model_dir, data, 4, tp, zero, checkpoints), work, name)
            check(f"tp {tp}" in log, f"{name}: rank 0 reports its mesh ({tp} tensor-parallel ranks)")
            compare_with_one_rank(name, log, final_weights(checkpoints, STEPS), reference_log, reference_weights)
            if run == "tp2-zero0":
                memory = memory_line(log)
                for kind in ("parameters", "gradients", "optimizer state"):
                    ratio = memory[kind] / reference_memory[kind]
                    check(0.45 <= ratio <= 0.56, f"{name}: {kind} per rank {ratio:.3f} of the 1-rank job's")
        if model_name == "llama-bias":
            resume(bin_dir, work, data, model_dir, reference_weights)


def resume(bin_dir, work, data, model_dir, reference_weights):
    name = "llama-bias-tp2-resumed"
    checkpoints = os.path.join(work, name)
    zero = {"stage": 1}
    loom_run(bin_dir, train_spec(name, model_dir, data, 4, 2, zero, checkpoints, steps=STEPS // 2), work, name + "-1")
    log = loom_run(bin_dir, train_spec(name, model_dir, data, 4, 2, zero, checkpoints), work, name)
    check(f"at step {STEPS // 2}" in log, f"{name}: the second job resumed at step {STEPS // 2}")
    weights = final_weights(checkpoints, STEPS)
    diff = max((weights[k] - reference_weights[k]).abs().max().item() for k in reference_weights)
    check(diff <= 1e-5, f"{name}: final weights vs the uninterrupted 1-rank job, max |difference| = {diff:.2e}")
    other = train_spec(name, model_dir, data, 4, 4, zero, checkpoints, steps=STEPS + 2)
    refused = loom_run(bin_dir, other, work, name + "-tp4", expect_failure=True)
    check("tensor parallel 2 x 2 data-parallel ranks" in refused and "tensor parallel 4 x 1:" in refused and
          '"autotp_size":4' in refused, f"{name}: resuming at tp4 is refused, naming both layouts and the convert job")


def evaluation(bin_dir, work, data, tokens):
    samples = 8
    for family, tie in (("llama", False), ("qwen2", True)):
        model_dir = os.path.join(work, f"eval-{family}")
        model = save_model(family, model_dir, seed=9, tie=tie).eval()
        pairs = [sample(tokens, i, SEQ) for i in range(samples)]
        inputs = torch.from_numpy(np.stack([x for x, _ in pairs])).long()
        labels = torch.from_numpy(np.stack([y for _, y in pairs])).long()
        with torch.no_grad():
            logits = model(input_ids=inputs).logits.float()
        theirs = torch.log_softmax(logits, -1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
        for tp in (2, 4):
            out = os.path.join(work, f"eval-{family}-tp{tp}.safetensors")
            loom_run(bin_dir, {
                "name": f"eval-{family}-tp{tp}", "kind": "eval", "resources": {"ranks": 4},
                "model": {"config": model_dir + "/config.json", "weights": model_dir},
                "data": {"eval": data, "seq_len": SEQ}, "eval": {"logprobs_output": out, "max_batches": 1},
                "deepspeed": {"train_micro_batch_size_per_gpu": 2, "tensor_parallel": {"autotp_size": tp}}},
                work, f"eval-{family}-tp{tp}")
            ours = load_file(out)["logprobs"]
            rows = ours.shape[0]
            diff = (ours - theirs[:rows]).abs().max().item()
            check(rows == 4 * 2 // tp and diff <= 1e-5,
                  f"eval {family} tp{tp}: {rows} rows of logprobs vs transformers, max |difference| = {diff:.2e}")
        entropy_and_kl(bin_dir, work, data, model_dir, model, inputs, family)


def entropy_and_kl(bin_dir, work, data, model_dir, model, inputs, family):
    """eval.entropy and eval.kl_reference at tp2: the predictions' entropy and KL(reference || model)
    per token, against the same computed from transformers' logits."""
    reference_dir = os.path.join(work, f"eval-{family}-reference")
    reference = save_model(family, reference_dir, seed=10, tie=model.config.tie_word_embeddings).eval()
    with torch.no_grad():
        log_p = torch.log_softmax(model(input_ids=inputs).logits.float(), -1)
        log_r = torch.log_softmax(reference(input_ids=inputs).logits.float(), -1)
    entropy = -(log_p.exp() * log_p).sum(-1)
    kl = (log_r.exp() * (log_r - log_p)).sum(-1)
    out = os.path.join(work, f"eval-{family}-kl.safetensors")
    log = loom_run(bin_dir, {
        "name": f"eval-{family}-kl", "kind": "eval", "resources": {"ranks": 4},
        "model": {"config": model_dir + "/config.json", "weights": model_dir, "loss_block_rows": 7},
        "data": {"eval": data, "seq_len": SEQ},
        "eval": {"logprobs_output": out, "max_batches": 1, "entropy": True, "kl_reference": reference_dir},
        "deepspeed": {"train_micro_batch_size_per_gpu": 2, "tensor_parallel": {"autotp_size": 2}}},
        work, f"eval-{family}-kl")
    ours = load_file(out)
    rows = ours["logprobs"].shape[0]
    for name, theirs in (("entropy", entropy), ("kl", kl)):
        got = ours.get(name)
        diff = (got - theirs[:rows]).abs().max().item() if got is not None else float("inf")
        check(diff <= 1e-5, f"eval {family} tp2: per-token {name} vs transformers, max |difference| = {diff:.2e}")
    mean_kl = kl[:rows].mean().item()
    check("entropy " in log and "KL(reference || model)" in log and abs(ours["kl"].mean().item() - mean_kl) <= 1e-5,
          f"eval {family} tp2: the log reports the mean entropy and KL ({mean_kl:.6f})")


def refusals(bin_dir, work, data):
    model_dir = os.path.join(work, "refusals")
    save_model("llama", model_dir, seed=2)
    cases = {
        "heads": (train_spec("tp3", model_dir, data, 3, 3, {"stage": 0}, os.path.join(work, "tp3")),
                  "num_attention_heads 4 is not a multiple of it"),
        "layer-spec": (train_spec("spec", model_dir, data, 2, 2, {"stage": 0}, os.path.join(work, "spec")),
                       "self_attn.o_proj.weight is laid out column"),
    }
    cases["layer-spec"][0]["deepspeed"]["tensor_parallel"]["partition_config"] = {
        "layer_specs": [{"patterns": [".*o_proj\\.weight$"], "partition_type": "column"}]}
    for name, (spec, expected) in cases.items():
        refused_at_submit(bin_dir, work, name, spec, expected)


def main():
    a = oracle_args(__doc__, only=["training", "evaluation", "refusals"])
    bin_dir = a.bin
    with tempfile.TemporaryDirectory(prefix="loom-tp-") as work:
        tokens = np.random.default_rng(3).integers(0, VOCAB, 64 * SEQ + 1)
        data = os.path.join(work, "tp.tokens")
        write_token_file(data, tokens, VOCAB, "uint16")
        if a.only in (None, "refusals"):
            refusals(bin_dir, work, data)
        if a.only in (None, "evaluation"):
            evaluation(bin_dir, work, data, tokens)
        if a.only in (None, "training"):
            training(bin_dir, work, data)
    if parity_test.failures:
        raise SystemExit(f"{len(parity_test.failures)} checks failed")


if __name__ == "__main__":
    main()
