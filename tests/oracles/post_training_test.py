"""Training on rollouts, end to end through `loomctl run` (real loomd, real ranks), against
references written from the formulas and DeepSpeed 0.19.8's own opsd.py:

  - policy gradient: one step of PPO's clipped surrogate with GRPO advantages on a fixed rollout
    batch (behaviour logprobs, rewards per sample) on 2 ranks at ZeRO 0 and at ZeRO 3, and on 1 rank
    with the CPU kernel plugin's fused logprobs, each
    against a hand-written PyTorch step of the same formula on transformers' model: the loss
    within 1e-6 and every weight after the AdamW step within 1e-6 (its large eps makes the update
    follow the gradient, so the gradients are what is compared);
  - the OPSD JSD loss with a teacher from other weights, on 1 rank and at tensor parallel 2 (the
    logits split by vocabulary): the loss against generalized_jsd_loss on transformers' logits,
    and the weights after the step;
  - bad rollout data: the job fails naming the file, the line and what is wrong.

  python3 tests/oracles/post_training_test.py --bin build/bin
"""
import json
import os
import sqlite3
import sys
import tempfile

os.environ.setdefault("DS_ACCELERATOR", "cpu")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from loom_runs import oracle_args  # noqa: E402

import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from parity_test import check, exit_code, loom_run, save_model  # noqa: E402

SEQ_LEN, LR, EPS, CLIP_LOW, CLIP_HIGH = 24, 1e-2, 1.0, 0.2, 0.28


def rollout_results(path, seed):
    """4 prompts x 2 samples: random prompts and responses, behaviour logprobs and rewards."""
    g = torch.Generator().manual_seed(seed)
    lines = []
    for p in range(4):
        prompt = torch.randint(0, 300, (int(torch.randint(2, 7, (1,), generator=g)),), generator=g).tolist()
        for s in range(2):
            n = int(torch.randint(2, 9, (1,), generator=g))
            response = torch.randint(0, 300, (n,), generator=g).tolist()
            logprobs = (-(torch.rand(n, generator=g) * 4 + 3)).tolist()  # near the tiny model's own, some clipped
            lines.append({"id": f"p{p}", "sample": s, "prompt_token_ids": prompt, "token_ids": response,
                          "logprobs": logprobs, "finish_reason": "length", "reward": float(p + 2 * s) / 4})
    with open(path, "w") as f:
        for line in lines:
            f.write(json.dumps(line) + "\n")
    return lines


def grpo_advantages(lines):
    groups = {}
    for line in lines:
        groups.setdefault(line["id"], []).append(line["reward"])
    out = []
    for line in lines:
        rewards = torch.tensor(groups[line["id"]], dtype=torch.float64)
        out.append(float((line["reward"] - rewards.mean()) / (rewards.std() + 1e-6)))
    return out


def response_logits(model, line):
    """Logits at the positions that predict the response tokens, [R, V]."""
    tokens = torch.tensor([line["prompt_token_ids"] + line["token_ids"]])
    logits = model(input_ids=tokens[:, :-1]).logits[0].float()
    return logits[len(line["prompt_token_ids"]) - 1:]


def reference_step(model_dir, lines, loss_fn):
    """The hand-written step: sum of per-token losses over every response token / their count,
    backward, torch's AdamW. Returns (loss, weights)."""
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32,
                                                              attn_implementation="eager")
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, eps=EPS, weight_decay=0.0)
    total = sum(len(line["token_ids"]) for line in lines)
    loss = sum(loss_fn(model, i, line) for i, line in enumerate(lines)) / total
    loss.backward()
    optimizer.step()
    return loss.item(), {k: v.detach() for k, v in model.named_parameters()}


def policy_gradient_terms(lines):
    advantages = grpo_advantages(lines)

    def loss_fn(model, i, line):
        logits = response_logits(model, line)
        target = torch.tensor(line["token_ids"])
        logp = torch.log_softmax(logits, -1).gather(1, target[:, None])[:, 0]
        ratio = torch.exp(logp - torch.tensor(line["logprobs"]))
        a = advantages[i]
        return torch.maximum(-a * ratio, -a * ratio.clamp(1 - CLIP_LOW, 1 + CLIP_HIGH)).sum()
    return loss_fn


def loom_train(bin_dir, work, name, ranks, stage, data, model_dir, loss, expect_failure=False, tp=1, plugin=None):
    spec = {"name": name, "kind": "train", "resources": {"ranks": ranks},
            "model": {"config": model_dir + "/config.json", "weights": model_dir},
            "data": {"train": data, "format": "rollout", "seq_len": SEQ_LEN},
            "train": {"steps": 1, "checkpoint_dir": os.path.join(work, name + "-ckpt"), "loss": loss},
            "deepspeed": {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2, "steps_per_print": 1,
                          "gradient_clipping": 0,
                          "zero_optimization": {"stage": stage}, "tensor_parallel": {"autotp_size": tp},
                          "optimizer": {"type": "AdamW", "params": {"lr": LR, "eps": EPS, "weight_decay": 0.0,
                                                                    "torch_adam": True}}}}
    if plugin:
        spec["kernels"] = {"plugins": [plugin]}
    log = loom_run(bin_dir, spec, work, name, expect_failure)
    if expect_failure:
        return log
    state = os.path.join(work, name + "-state")  # where loom_run keeps the job's state
    with sqlite3.connect(os.path.join(state, "planner", "planner.db")) as db:
        metrics = dict(db.execute("SELECT name, value FROM metrics WHERE step = 1 AND rank = 0"))
    weights = load_file(os.path.join(work, name + "-ckpt", "global_step1", "model.safetensors"))
    return metrics, weights, log


def compare(name, metrics, weights, reference_loss, reference_weights, initial):
    diff = abs(metrics.get("loss", float("nan")) - reference_loss)
    check(diff <= 1e-6, f"{name}: loss {metrics.get('loss')} vs the reference's {reference_loss:.8f}, "
                        f"|difference| {diff:.1e}")
    # The step's update over the learning rate: with eps 1 it follows the gradient.
    worst = max(((weights[k] - initial[k]) - (reference_weights[k] - initial[k])).abs().max().item() / LR
                for k in reference_weights)
    check(set(weights) == set(reference_weights) and worst <= 1e-6,
          f"{name}: every weight's update / lr vs the reference's, max |difference| {worst:.1e}")


def policy_gradient(bin_dir, work, model_dir, initial):
    data = os.path.join(work, "rollout.jsonl")
    lines = rollout_results(data, 7)
    reference_loss, reference_weights = reference_step(model_dir, lines, policy_gradient_terms(lines))
    loss = {"type": "policy_gradient", "clip_ratio_low": CLIP_LOW, "clip_ratio_high": CLIP_HIGH, "advantage": "grpo"}
    for stage in (0, 3):
        metrics, weights, log = loom_train(bin_dir, work, f"pg-zero{stage}", 2, stage, data, model_dir, loss)
        compare(f"policy gradient, 2 ranks, ZeRO {stage}", metrics, weights, reference_loss, reference_weights, initial)
        check("rollout data: 8 samples of 4 prompts" in log and "mean reward 0.6250" in log,
              f"ZeRO {stage}: rank 0 describes the data: "
              f"{[l for l in log.splitlines() if l.startswith('rollout data')]}")
        clipped = metrics.get("pg_clip_fraction", -1)
        check(0 < clipped < 1, f"ZeRO {stage}: some tokens' ratios were clipped (pg_clip_fraction {clipped:.3f})")
    # One rank with the CPU kernel plugin, whose fused logprobs take the ignored labels' rows too.
    metrics, weights, log = loom_train(bin_dir, work, "pg-plugin", 1, 0, data, model_dir, loss, plugin="cpu")
    compare("policy gradient, 1 rank, the CPU kernel plugin's logprobs", metrics, weights, reference_loss,
            reference_weights, initial)
    check("cpu ops: loom-cpu (all)" in log, "the plugin ran the ops")


def distillation(bin_dir, work, model_dir, initial):
    from deepspeed.runtime.rollout.opsd import generalized_jsd_loss
    data = os.path.join(work, "rollout.jsonl")
    lines = [json.loads(line) for line in open(data)]
    teacher_dir = os.path.join(work, "teacher")
    teacher = save_model("llama", teacher_dir, seed=9)
    beta, temperature = 0.3, 1.5

    def loss_fn(model, i, line):
        with torch.no_grad():
            teacher_logits = response_logits(teacher, line)
        student_logits = response_logits(model, line)
        mask = torch.ones(1, len(line["token_ids"]), dtype=torch.bool)
        out = generalized_jsd_loss(student_logits[None], teacher_logits[None], mask, beta=beta,
                                   temperature=temperature)
        return out.loss_sum

    reference_loss, reference_weights = reference_step(model_dir, lines, loss_fn)
    loss = {"type": "jsd", "teacher": teacher_dir, "beta": beta, "temperature": temperature}
    metrics, weights, _ = loom_train(bin_dir, work, "jsd-1rank", 1, 0, data, model_dir, loss)
    compare("OPSD JSD against DeepSpeed's generalized_jsd_loss, 1 rank", metrics, weights, reference_loss,
            reference_weights, initial)
    # Tensor parallel 2: student and teacher split by vocabulary, the divergence vocabulary-parallel.
    metrics, weights, _ = loom_train(bin_dir, work, "jsd-tp2", 2, 0, data, model_dir, loss, tp=2)
    compare("OPSD JSD, tensor parallel 2 (vocabulary-parallel)", metrics, weights, reference_loss, reference_weights,
            initial)


def bad_data(bin_dir, work, model_dir):
    data = os.path.join(work, "too-long.jsonl")
    with open(data, "w") as f:
        f.write(json.dumps({"prompt_token_ids": [1, 2], "token_ids": [3], "reward": 1}) + "\n")
        f.write(json.dumps({"prompt_token_ids": [1] * 20, "token_ids": [3] * 10, "reward": 0}) + "\n")
    out = loom_train(bin_dir, work, "too-long", 1, 0, data, model_dir, "cross_entropy", expect_failure=True)
    check(f"data.train: {data} line 2: holds 30 tokens (prompt 20 + response 10); data.seq_len 24" in out,
          "a sample longer than seq_len fails the job, naming the file and the line")
    unscored = os.path.join(work, "unscored.jsonl")
    with open(unscored, "w") as f:
        f.write(json.dumps({"id": "a", "prompt_token_ids": [1, 2], "token_ids": [3]}) + "\n")
    out = loom_train(bin_dir, work, "unscored", 1, 0, unscored, model_dir, {"type": "policy_gradient"},
                     expect_failure=True)
    check("data.train line 1 (id \"a\" sample 0): has no reward" in out,
          "policy gradient on samples without rewards fails the job, naming the line")


def main():
    bin_dir = oracle_args(__doc__).bin
    with tempfile.TemporaryDirectory(prefix="loom-post-training-") as work:
        model_dir = os.path.join(work, "llama")
        save_model("llama", model_dir, seed=4)
        initial = load_file(os.path.join(model_dir, "model.safetensors"))
        policy_gradient(bin_dir, work, model_dir, initial)
        distillation(bin_dir, work, model_dir, initial)
        bad_data(bin_dir, work, model_dir)
    sys.exit(exit_code())


if __name__ == "__main__":
    main()
