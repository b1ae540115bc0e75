"""Loom against its references, end to end through `loomctl run` (real loomd, real ranks):

1. Model numerics: for llama (llama3 RoPE), qwen2 (tied, qkv bias), qwen3 (q/k norm) and mistral
   (sliding window 8, shorter than the sequence), Loom's eval job writes per-token logprobs of a
   random HF model's weights; Hugging Face transformers computes the same in fp32. Max difference
   <= 1e-4.
3. Optimizers and schedules DeepSpeed cannot run on a CPU here (its Adagrad and Lion need built
   ops): Adam with L2 weight decay + WarmupDecayLR, Adagrad + WarmupCosineLR and Lion, by Loom
   (1 rank) and by a plain training loop over torch.optim.Adam / Adagrad, a Lion written from
   the paper, and DeepSpeed's own scheduler classes. Losses within 1e-5 relative, weights 1e-5.
4. ZeRO: stages 1, 2, 2 with CPU optimizer offload, and 3 (evaluating between steps) on 4 ranks
   give stage 0's 1-rank losses (1e-5 relative over 30 steps) and final weights (1e-5); per-rank
   optimizer-state bytes are 1/4 of stage 0's from stage 1 on, gradient bytes 1/4 from stage 2
   on, and parameter bytes 1/4 (plus 1/4 fp32 masters) at stage 3. A stage-3 run stopped half way
   and resumed from its checkpoint ends the same; bf16 stages 2 and 3 stay within 1e-2 of bf16
   stage 0.
2. Training semantics: the same model, data, order and DeepSpeed config trained by DeepSpeed
   0.19.8 (1 rank, gradient accumulation 4) and by Loom (2 data-parallel ranks, accumulation 2):
   per-step lr equal, loss and grad norm within 1e-5 relative, final weights within 1e-5.

  python3 tests/oracles/parity_test.py --bin build/bin [--only numerics|training|optimizers|zero]
"""
import json
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from make_tiny_model import make_config  # noqa: E402
from token_file import read_token_file, sample, write_token_file  # noqa: E402
# Re-exported: the other oracles take them from here.
from loom_runs import (ControlPlane, check, exit_code, failures, free_port, loom_run, oracle_args,  # noqa: E402,F401
                       step_lines)


def refused_at_submit(bin_dir, work, name, spec, expected):
    """`loomctl validate` refuses `spec`, and its error contains `expected`."""
    path = os.path.join(work, f"refused-{name.replace(' ', '-')}.json")
    with open(path, "w") as f:
        json.dump(spec, f)
    r = subprocess.run([os.path.join(bin_dir, "loomctl"), "validate", path], capture_output=True, text=True)
    check(r.returncode != 0 and expected in r.stderr, f"refused at submit ({name}): {r.stderr.strip()[:200]}")


def save_model(family, out, tie=False, llama3=False, seed=1, sharded=False):
    torch.manual_seed(seed)
    config = make_config(family, 300, tie, llama3)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    # sharded: several model-0000i-of-0000n.safetensors files and their index, as large models ship.
    model.save_pretrained(out, safe_serialization=True, max_shard_size="40KB" if sharded else "5GB")
    return model


def licence_tokens_and_model(bin_dir, work, name, seed):
    """A token file of the GPL's text and a random llama saved as HF does: (data, model_dir)."""
    data = os.path.join(work, name + ".tokens")
    subprocess.run([os.path.join(bin_dir, "loomctl"), "data", "prepare", "/usr/share/common-licenses/GPL-3",
                    "--output", data], check=True, capture_output=True)
    model_dir = os.path.join(work, name + "-llama")
    save_model("llama", model_dir, seed=seed)
    return data, model_dir


def numerics(bin_dir, work):
    seq, samples = 24, 8
    tokens = np.random.default_rng(5).integers(0, 300, samples * seq + 1)
    data = os.path.join(work, "numerics.tokens")
    write_token_file(data, tokens, 300, "uint16")
    cases = [("llama", dict(llama3=True)), ("qwen2", dict(tie=True)), ("qwen3", dict(sharded=True)),
             ("mistral", {})]
    for family, options in cases:
        model_dir = os.path.join(work, family)
        model = save_model(family, model_dir, **options).eval()
        if options.get("sharded"):
            check(os.path.exists(os.path.join(model_dir, "model.safetensors.index.json")), "qwen3 weights are sharded")
        out = os.path.join(work, family + "-logprobs.safetensors")
        loom_run(bin_dir, {
            "name": "numerics-" + family, "kind": "eval", "resources": {"ranks": 1},
            "model": {"config": model_dir + "/config.json", "weights": model_dir},
            "data": {"eval": data, "seq_len": seq},
            "eval": {"logprobs_output": out},
            "deepspeed": {"train_micro_batch_size_per_gpu": 4}}, work, "numerics-" + family)
        ours = load_file(out)["logprobs"]
        pairs = [sample(tokens, i, seq) for i in range(samples)]
        inputs = torch.from_numpy(np.stack([x for x, _ in pairs])).long()
        labels = torch.from_numpy(np.stack([y for _, y in pairs])).long()
        with torch.no_grad():
            logits = model(input_ids=inputs).logits.float()
        theirs = torch.log_softmax(logits, -1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
        diff = (ours - theirs).abs().max().item()
        check(ours.shape == theirs.shape and diff <= 1e-4,
              f"numerics {family} {options}: max |logprob difference| vs transformers = {diff:.2e}")


def training(bin_dir, work):
    seq, steps = 32, 10
    data, model_dir = licence_tokens_and_model(bin_dir, work, "train", seed=3)
    ds = {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2, "gradient_clipping": 0.5,
          "steps_per_print": 1,
          "optimizer": {"type": "AdamW", "params": {"lr": 2e-3, "betas": [0.9, 0.95], "eps": 1e-8,
                                                    "weight_decay": 0.01, "torch_adam": True}},
          "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 2e-3,
                                                       "warmup_num_steps": 4, "warmup_type": "linear"}}}
    ds_path = os.path.join(work, "ds.json")
    with open(ds_path, "w") as f:
        json.dump(ds, f)
    reference_out = os.path.join(work, "deepspeed.jsonl")
    reference_dir = os.path.join(work, "deepspeed-final")
    subprocess.run([sys.executable, os.path.join(HERE, "deepspeed_train.py"), "--model", model_dir, "--data", data,
                    "--seq-len", str(seq), "--data-seed", "11", "--steps", str(steps), "--ds-config", ds_path,
                    "--world", "1", "--out", reference_out, "--save-dir", reference_dir],
                   check=True, capture_output=True, timeout=300)
    reference = [json.loads(line) for line in open(reference_out)]

    checkpoints = os.path.join(work, "loom-checkpoints")
    log = loom_run(bin_dir, {
        "name": "training", "kind": "train", "resources": {"ranks": 2},
        "model": {"config": model_dir + "/config.json", "weights": model_dir},
        "data": {"train": data, "seq_len": seq, "seed": 11},
        "train": {"steps": steps, "checkpoint_dir": checkpoints},
        "deepspeed": ds}, work, "training")
    ours = step_lines(log)
    check(len(ours) == steps, f"training: Loom logged {len(ours)} of {steps} steps")
    for ref in reference:
        got = ours.get(ref["step"], {})
        rel = lambda a, b: abs(a - b) / max(abs(b), 1e-12)  # noqa: E731
        check(abs(got.get("lr", -1) - ref["lr"]) <= 1e-5 * ref["lr"],
              f"training step {ref['step']}: lr {got.get('lr')} vs DeepSpeed {ref['lr']:.6e}")
        check(rel(got.get("loss", 0), ref["loss"]) <= 1e-5,
              f"training step {ref['step']}: loss {got.get('loss')} vs DeepSpeed {ref['loss']:.6f}")
        check(rel(got.get("grad_norm", 0), ref["grad_norm"]) <= 1e-5,
              f"training step {ref['step']}: grad_norm {got.get('grad_norm')} vs DeepSpeed {ref['grad_norm']:.6f}")
    # Loom's checkpoint directory is a Hugging Face model directory.
    loaded = transformers.AutoModelForCausalLM.from_pretrained(os.path.join(checkpoints, f"global_step{steps}"),
                                                               dtype=torch.float32)
    final = {name: t.detach() for name, t in loaded.named_parameters()}
    theirs = load_file(os.path.join(reference_dir, "model.safetensors"))
    worst = max((final[name] - tensor).abs().max().item() for name, tensor in theirs.items())
    check(set(final) == set(theirs) and worst <= 1e-5,
          f"training: final weights (Loom's checkpoint loaded by transformers) vs DeepSpeed, max |difference| = "
          f"{worst:.2e}")


def lion_step(params, state, lr, beta1, beta2, weight_decay):
    """Lion (Chen et al. 2023, Algorithm 2): sign of the interpolated momentum, decoupled decay."""
    with torch.no_grad():
        for p in params:
            m = state.setdefault(p, torch.zeros_like(p))
            update = (m * beta1 + p.grad * (1 - beta1)).sign()
            p.mul_(1 - lr * weight_decay)
            p.add_(update, alpha=-lr)
            m.mul_(beta2).add_(p.grad, alpha=1 - beta2)


def reference_loop(model_dir, tokens, seq, seed, steps, ds, frozen=()):
    """One process, the DeepSpeed rules: loss / GA, clip at the boundary, scheduler after the step.
    Parameters whose names match a `frozen` regex whole get no gradient and are left out of the
    optimizer."""
    from deepspeed.runtime import lr_schedules
    from token_file import SampleOrder, micro_batch_start, num_samples
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32,
                                                              attn_implementation="sdpa")
    params = []
    for name, p in model.named_parameters():
        if any(re.fullmatch(f, name) for f in frozen):
            p.requires_grad_(False)
        else:
            params.append(p)
    o = ds["optimizer"]["params"]
    kind = ds["optimizer"]["type"]
    if kind == "AdamW":
        optimizer = torch.optim.AdamW(params, lr=o["lr"], betas=o.get("betas", (0.9, 0.999)), eps=o.get("eps", 1e-8),
                                      weight_decay=o.get("weight_decay", 0.01))
    elif kind == "Adam":
        optimizer = torch.optim.Adam(params, lr=o["lr"], betas=o["betas"], eps=o["eps"], weight_decay=o["weight_decay"])
    elif kind == "Adagrad":
        optimizer = torch.optim.Adagrad(params, lr=o["lr"], eps=o["eps"], weight_decay=o["weight_decay"])
    else:
        optimizer = torch.optim.SGD(params, lr=o["lr"])  # only holds the lr for the scheduler; Lion below
    scheduler = None
    if "scheduler" in ds:
        scheduler = getattr(lr_schedules, ds["scheduler"]["type"])(optimizer, **ds["scheduler"]["params"])
    micro, tbs = ds["train_micro_batch_size_per_gpu"], ds["train_batch_size"]
    ga = tbs // micro
    order = SampleOrder(num_samples(len(tokens), seq), seed)
    lion_state, losses = {}, []
    for s in range(steps):
        total = 0.0
        for m in range(ga):
            start = micro_batch_start(s, tbs, m, micro, 0, 1)
            pairs = [sample(tokens, order.sample_at(start + k), seq) for k in range(micro)]
            inputs = torch.from_numpy(np.stack([x for x, _ in pairs])).long()
            labels = torch.from_numpy(np.stack([y for _, y in pairs])).long()
            logits = model(input_ids=inputs).logits
            loss = torch.nn.functional.cross_entropy(logits.float().view(-1, logits.size(-1)), labels.view(-1))
            (loss / ga).backward()
            total += loss.item()
        torch.nn.utils.clip_grad_norm_(params, ds["gradient_clipping"])
        if kind == "Lion":
            lion_step(params, lion_state, optimizer.param_groups[0]["lr"], o["betas"][0], o["betas"][1],
                      o["weight_decay"])
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        for p in params:
            p.grad = None
        if scheduler:
            scheduler.step()
        losses.append(total / ga)
    return losses, dict(model.named_parameters())


def optimizers(bin_dir, work):
    seq, steps, seed = 32, 6, 5
    data, model_dir = licence_tokens_and_model(bin_dir, work, "optim", seed=4)
    _, tokens = read_token_file(data)
    base = {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2, "gradient_clipping": 1.0, "steps_per_print": 1}
    cases = {
        "Adam-L2": {"optimizer": {"type": "Adam", "params": {"lr": 3e-3, "betas": [0.9, 0.99], "eps": 1e-8,
                                                             "weight_decay": 0.05, "adam_w_mode": False}},
                    "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": 1e-4, "warmup_max_lr": 3e-3,
                                                                      "warmup_num_steps": 3, "total_num_steps": 8}}},
        "Adagrad": {"optimizer": {"type": "Adagrad", "params": {"lr": 3e-2, "eps": 1e-10, "weight_decay": 0.01}},
                    "scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 8, "warmup_num_steps": 2,
                                                                       "warmup_min_ratio": 0.1}}},
        "Lion": {"optimizer": {"type": "Lion", "params": {"lr": 3e-4, "betas": [0.9, 0.99], "weight_decay": 0.1}}},
    }
    for name, extra in cases.items():
        ds = dict(base, **extra)
        theirs, weights = reference_loop(model_dir, tokens, seq, seed, steps, ds)
        # Everything by libtorch, then the model's ops (rms_norm, rope, swiglu, cross entropy) and the
        # optimizer's step by the CPU kernel plugin (kernels/cpu).
        for kernels in ("libtorch", "plugin"):
            checkpoints = os.path.join(work, f"optim-{name}-{kernels}")
            job = {"name": f"optim-{name}", "kind": "train", "resources": {"ranks": 1},
                   "model": {"config": model_dir + "/config.json", "weights": model_dir},
                   "data": {"train": data, "seq_len": seq, "seed": seed},
                   "train": {"steps": steps, "checkpoint_dir": checkpoints}, "deepspeed": ds}
            if kernels == "plugin":
                job["kernels"] = {"plugins": ["cpu"]}
            log = loom_run(bin_dir, job, work, f"optim-{name}-{kernels}")
            if kernels == "plugin":
                check("libloom_kernels_cpu.so" in log and "cpu ops: loom-cpu (all)" in log,
                      f"optimizer {name}: the CPU kernel plugin is loaded and runs every op")
            ours = list(loom_losses(log).values())
            worst_loss = max(abs(a - b) / b for a, b in zip(ours, theirs)) if len(ours) == len(theirs) else float("inf")
            check(worst_loss <= 1e-5, f"optimizer {name} ({kernels}): {len(ours)} losses vs torch, worst relative "
                                      f"difference {worst_loss:.2e}")
            final = load_file(os.path.join(checkpoints, f"global_step{steps}", "model.safetensors"))
            worst = max((final[n] - t.detach()).abs().max().item() for n, t in weights.items())
            check(worst <= 1e-5, f"optimizer {name} ({kernels}): final weights vs torch, max |difference| = {worst:.2e}")


def loom_losses(log):
    return {step: values["loss"] for step, values in step_lines(log).items()}


def final_weights(checkpoints, steps):
    """The whole HF tensors of the checkpoint written at `steps`."""
    return load_file(os.path.join(checkpoints, f"global_step{steps}", "model.safetensors"))


def compare_with_one_rank(name, log, weights, reference_log, reference_weights, first_step=None, norm_tolerance=1e-5):
    """A layout's run against the same job on 1 rank: losses within 1e-5 relative at every step
    (the first within `first_step` when given), gradient norms within `norm_tolerance` (the log
    prints 6 significant digits), final whole weights within 1e-5."""
    losses, reference_losses = loom_losses(log), loom_losses(reference_log)
    worst = max(abs(losses.get(s, 0) - l) / l for s, l in reference_losses.items())
    check(len(losses) == len(reference_losses) and worst <= 1e-5,
          f"{name}: {len(losses)} losses vs 1 rank, worst relative difference {worst:.2e}")
    if first_step is not None:
        first = abs(losses.get(1, 0) - reference_losses[1]) / reference_losses[1]
        check(first <= first_step, f"{name}: the first step's loss vs 1 rank, relative difference {first:.2e}")
    # The global gradient norm counts each tensor-parallel piece once and each whole parameter once.
    norms, reference_norms = step_lines(log), step_lines(reference_log)
    worst = max(abs(norms.get(s, {}).get("grad_norm", 0) - v["grad_norm"]) / v["grad_norm"]
                for s, v in reference_norms.items())
    check(worst <= norm_tolerance, f"{name}: gradient norms vs 1 rank, worst relative difference {worst:.2e}")
    same_names = set(weights) == set(reference_weights)
    diff = max((weights[k] - reference_weights[k]).abs().max().item() for k in reference_weights) if same_names else 1
    check(same_names and diff <= 1e-5, f"{name}: final whole weights vs 1 rank, max |difference| = {diff:.2e}")


def memory_line(log):
    """{"parameters": bytes, ...} from rank 0's "memory per rank" line."""
    units = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
    for line in log.splitlines():
        if line.startswith("memory per rank"):
            fields = line.split(": ", 1)[1].split(", ")
            return {f.rsplit(" ", 2)[0]: float(f.rsplit(" ", 2)[1]) * units[f.rsplit(" ", 2)[2]] for f in fields}
    return {}


def zero(bin_dir, work):
    """ZeRO stages on 4 ranks against stage 0 on 1 rank: the same losses and weights, and the
    per-rank memory that each stage promises."""
    seq, steps = 32, 30
    data, model_dir = licence_tokens_and_model(bin_dir, work, "zero", seed=6)
    base = {"train_batch_size": 16, "train_micro_batch_size_per_gpu": 2, "gradient_clipping": 1.0,
            "steps_per_print": 1,
            "optimizer": {"type": "AdamW", "params": {"lr": 2e-3, "weight_decay": 0.01}},
            "scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": 2e-3, "warmup_num_steps": 5}}}
    runs = {"stage0-1rank": (1, {"stage": 0}), "stage0": (4, {"stage": 0}), "stage1": (4, {"stage": 1}),
            "stage2": (4, {"stage": 2, "reduce_bucket_size": 20000}),
            # sub_group_size cuts the host's step into pieces (a rank's part is ~190K elements).
            "stage2-offload": (4, {"stage": 2, "overlap_comm": True, "offload_optimizer": {"device": "cpu"},
                                   "sub_group_size": 50000}),
            # Only the norms (64 elements) stay whole; evaluations run between the steps.
            "stage3": (4, {"stage": 3, "stage3_param_persistence_threshold": 1000}),
            "stage3-offload": (4, {"stage": 3, "stage3_param_persistence_threshold": 1000,
                                   "offload_optimizer": {"device": "cpu"}, "sub_group_size": 20000}),
            # Stopped at step 15 and resumed from its checkpoint (same stage, same ranks).
            "stage3-resumed": (4, {"stage": 3, "stage3_param_persistence_threshold": 1000})}
    results = {}

    def spec(name, ranks, zero_config, checkpoints, train_steps):
        return {
            "name": "zero-" + name, "kind": "train", "resources": {"ranks": ranks},
            "model": {"config": model_dir + "/config.json", "weights": model_dir},
            "data": {"train": data, "eval": data, "seq_len": seq, "seed": 2},
            "train": dict({"steps": train_steps, "checkpoint_dir": checkpoints},
                          **({"eval_every": 10, "eval_batches": 2} if zero_config["stage"] == 3 else {})),
            "deepspeed": dict(base, zero_optimization=zero_config)}

    for name, (ranks, zero_config) in runs.items():
        checkpoints = os.path.join(work, "zero-" + name)
        if name.endswith("-resumed"):
            first = loom_run(bin_dir, spec(name, ranks, zero_config, checkpoints, steps // 2), work, "zero-" + name + "-1")
            log = loom_run(bin_dir, spec(name, ranks, zero_config, checkpoints, steps), work, "zero-" + name)
            check(f"at step {steps // 2}" in log, f"ZeRO {name}: the second job resumed at step {steps // 2}")
            log = first + log
        else:
            log = loom_run(bin_dir, spec(name, ranks, zero_config, checkpoints, steps), work, "zero-" + name)
        if "offload_optimizer" in zero_config:
            # The host's optimizer step runs on the CPU plugin without the job naming it.
            check("libloom_kernels_cpu.so" in log and "cpu ops: loom-cpu (all)" in log,
                  f"ZeRO {name}: the CPU plugin, loaded for the offloaded optimizer, runs every op")
        weights = load_file(os.path.join(checkpoints, f"global_step{steps}", "model.safetensors"))
        results[name] = (loom_losses(log), weights, memory_line(log))
    ref_losses, ref_weights, ref_memory = results["stage0"]
    one_losses, one_weights, _ = results["stage0-1rank"]
    for name, (losses, weights, memory) in results.items():
        worst = max(abs(losses.get(s, 0) - one_losses[s]) / one_losses[s] for s in one_losses)
        check(len(losses) == steps and worst <= 1e-5,
              f"ZeRO {name}: {len(losses)} losses vs stage 0 on 1 rank, worst relative difference {worst:.2e}")
        diff = max((weights[k] - one_weights[k]).abs().max().item() for k in one_weights)
        check(diff <= 1e-5, f"ZeRO {name}: final weights vs stage 0 on 1 rank, max |difference| = {diff:.2e}")
        print(f"      {name}: " + ", ".join(f"{k} {v / 1024:.1f} KiB" for k, v in memory.items()), flush=True)
    # Per rank, 4 ranks: optimizer state 1/4 of stage 0's from stage 1, gradients 1/4 from stage 2.
    for name in ("stage1", "stage2", "stage2-offload", "stage3", "stage3-offload"):
        ratio = results[name][2]["optimizer state"] / ref_memory["optimizer state"]
        check(abs(ratio - 0.25) < 0.02, f"ZeRO {name}: optimizer-state bytes {ratio:.3f} of stage 0's")
    for name in ("stage2", "stage2-offload", "stage3", "stage3-offload"):
        ratio = results[name][2]["gradients"] / ref_memory["gradients"]
        check(abs(ratio - 0.25) < 0.02, f"ZeRO {name}: gradient bytes {ratio:.3f} of stage 0's")
    # bf16: stages 2 and 3 on 4 ranks against stage 0 on 1 rank, within bf16's resolution (the
    # fp32 masters agree up to summation order, but their bf16 roundings can differ by an ulp).
    bf16 = {}
    for name, (ranks, zero_config) in {"bf16-stage0-1rank": (1, {"stage": 0}), "bf16-stage2": (4, {"stage": 2}),
                                       "bf16-stage3": (4, {"stage": 3, "stage3_param_persistence_threshold": 1000})
                                       }.items():
        job = spec(name, ranks, zero_config, os.path.join(work, "zero-" + name), steps)
        job["deepspeed"]["bf16"] = {"enabled": True}
        bf16[name] = loom_losses(loom_run(bin_dir, job, work, "zero-" + name))
    for name in ("bf16-stage2", "bf16-stage3"):
        worst = max(abs(bf16[name].get(s, 0) - l) / l for s, l in bf16["bf16-stage0-1rank"].items())
        check(len(bf16[name]) == steps and worst <= 1e-2,
              f"ZeRO {name}: {len(bf16[name])} losses vs bf16 stage 0 on 1 rank, worst relative difference {worst:.2e}")
    # Stage 3 keeps a quarter of the fp32 parameters (stage 0's parameter bytes) as its model part
    # and a quarter as fp32 masters: half in all, plus the whole norms.
    ratio = results["stage3"][2]["parameters"] / ref_memory["parameters"]
    check(abs(ratio - 0.5) < 0.02, f"ZeRO stage3: parameter bytes {ratio:.3f} of stage 0's (1/4 part + 1/4 masters)")
    # Frozen parameters (train.frozen_parameters): the embedding, whose output then carries no
    # gradient into the first layer, and the first layer's MLP get no gradient at any step. Every
    # stage on 4 ranks against torch with those parameters out of the optimizer: no hang, the same
    # losses and weights, and the frozen weights exactly as loaded.
    frozen = ["model\\.embed_tokens\\.weight", "model\\.layers\\.0\\.mlp\\..*"]
    frozen_steps = 10
    _, tokens = read_token_file(data)
    theirs, their_weights = reference_loop(model_dir, tokens, seq, 2, frozen_steps, base, frozen)
    loaded = load_file(os.path.join(model_dir, "model.safetensors"))
    stage3 = {"stage": 3, "stage3_param_persistence_threshold": 1000}
    for name, zero_config in {"frozen-stage0": {"stage": 0}, "frozen-stage1": {"stage": 1},
                              "frozen-stage2": {"stage": 2, "overlap_comm": True},
                              "frozen-stage3": stage3, "frozen-stage3-resumed": stage3}.items():
        checkpoints = os.path.join(work, "zero-" + name)
        job = spec(name, 4, zero_config, checkpoints, frozen_steps)
        job["train"]["frozen_parameters"] = frozen
        if name.endswith("-resumed"):
            # Stopped half way, resumed from its ZeRO-3 checkpoint: the frozen parts come back
            # from the checkpoint's weights, not from the optimizer state (they have none).
            first = dict(job, train=dict(job["train"], steps=frozen_steps // 2))
            log = loom_run(bin_dir, first, work, "zero-" + name + "-1")
            log += loom_run(bin_dir, job, work, "zero-" + name)
            check(f"at step {frozen_steps // 2}" in log, f"ZeRO {name}: the second job resumed")
            # A different frozen set would pair the optimizer state with other parameters.
            other = dict(job, train=dict(job["train"], steps=frozen_steps + 2, frozen_parameters=frozen[:1]))
            refused = loom_run(bin_dir, other, work, "zero-" + name + "-other", expect_failure=True)
            check("written with train.frozen_parameters" in refused,
                  f"ZeRO {name}: resuming with another frozen set is refused, naming the field")
        else:
            log = loom_run(bin_dir, job, work, "zero-" + name)
        losses = loom_losses(log)
        worst = max(abs(losses.get(s + 1, 0) - l) / l for s, l in enumerate(theirs))
        check(len(losses) == frozen_steps and worst <= 1e-5,
              f"ZeRO {name}: {len(losses)} losses vs torch with the same parameters frozen, worst relative "
              f"difference {worst:.2e}")
        weights = load_file(os.path.join(checkpoints, f"global_step{frozen_steps}", "model.safetensors"))
        diff = max((weights[k] - their_weights[k].detach()).abs().max().item() for k in their_weights)
        check(diff <= 1e-5, f"ZeRO {name}: final weights vs torch, max |difference| = {diff:.2e}")
        held = [k for k in loaded if any(re.fullmatch(f, k) for f in frozen)]
        check(len(held) == 4 and all(torch.equal(weights[k], loaded[k]) for k in held),
              f"ZeRO {name}: the {len(held)} frozen tensors are exactly as loaded")


def main():
    a = oracle_args(__doc__, only=["numerics", "training", "optimizers", "zero"])
    bin_dir = a.bin
    with tempfile.TemporaryDirectory(prefix="loom-parity-") as work:
        if a.only in (None, "numerics"):
            numerics(bin_dir, work)
        if a.only in (None, "training"):
            training(bin_dir, work)
        if a.only in (None, "optimizers"):
            optimizers(bin_dir, work)
        if a.only in (None, "zero"):
            zero(bin_dir, work)
    if failures:
        raise SystemExit(f"{len(failures)} checks failed")


if __name__ == "__main__":
    main()
