"""Muon against DeepSpeed 0.19.8's own Muon, and against itself across layouts, end to end through
`loomctl run` (real loomd, real CPU ranks over UCX):

1. DeepSpeed as the oracle. Its muon_update and Loom's (loom-muon-update) on the same matrices
   (square, tall, wide, per head, GQA's KV heads; gram and standard): bit for bit the same
   update and momentum. Then DeepSpeed trains a tiny llama with Muon on 2 CPU ranks (gloo) at
   ZeRO-1 and ZeRO-2, ns_method gram and standard, per_head_muon off and on (all 8), and Loom
   trains the same model on the same samples with the same config on 2 ranks. Gram runs in fp32
   on a CPU without oneDNN fp16: losses and gradient norms (which DeepSpeed takes over the Muon
   updates) within 1e-5 relative over 20 steps, final weights within 1e-5; where oneDNN has fp16
   (AVX512-FP16, AMX) it runs in fp16 and is held to standard's bounds. Standard runs in
   bf16, where a last-bit difference in a gradient (Loom's forward is not transformers' to the
   bit) flips a rounding that the iteration spreads: losses within 2e-4, gradient norms 5e-3,
   weights 2e-2 there. DeepSpeed runs eagerly (TORCHDYNAMO_DISABLE): its muon_update is
   wrapped in torch.compile, whose fused kernels round differently from the same operations
   run one by one.
2. Layouts: ZeRO 0 and 3 with persistent matrices (whole on every rank: each rank orthogonalizes
   those dealt to it and broadcasts them), 1, 2, 3 (matrices cut into parts, gathered on the rank
   dealt each) and 2 with CPU optimizer offload on 4 ranks equal the 1-rank job (1e-5), as does gradient
   accumulation 4 (Newton-Schulz once per step, on the step's whole gradient); a ZeRO-3 job
   stopped half way resumes from its checkpoint (which carries the momentum) to the same end.
   (Gram in fp16: gradient norms within 1e-3 and weights within 2e-4 instead.)
3. Tensor parallelism: tp2 with per_head_muon (each rank's whole heads on their own) and tp2
   without it (every split matrix gathered for Newton-Schulz), alone and as tp2 x dp2 at ZeRO 0
   and 1, equal their 1-rank jobs.
4. fp16 with a static loss scale of 2^16 (ZeRO 0 and 2) and bf16 (ZeRO 0) move the weights as
   fp32 does (the Muon update keeps its size under the scale), within their precision; a dynamic scale starting at 2^22 skips its
   overflowing steps and trains on with finite norms and weights (their momentum is dropped).
5. Refusals at submit: an unknown optimizer key, an unknown ns_method, per_head_muon with no
   attention projection left to train.

  python3 tests/oracles/muon_test.py --bin build/bin [--only deepspeed|layouts|tensor|fp16|refusals]
"""
import itertools
import json
import os
import subprocess
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
from parity_test import check, refused_at_submit, loom_losses, loom_run, step_lines  # noqa: E402
from token_file import write_token_file  # noqa: E402

SEQ, STEPS, VOCAB, DATA_SEED = 16, 20, 300, 7
# DeepSpeed runs the gram iteration in fp16 where oneDNN has fp16 (CPUs with AVX512-FP16 or
# AMX-FP16: what its CPU accelerator's is_fp16_supported asks), in fp32 elsewhere, and Loom picks
# as DeepSpeed does. In fp16 a last-bit difference in a gradient (another layout's summation order,
# Loom's forward against transformers') flips roundings that the iteration spreads, as bf16 does
# for standard: the comparisons then hold to the bounds of the reduced precision.
GRAM_FP16 = bool(torch.ops.mkldnn._is_mkldnn_fp16_supported())
REDUCED = (2e-4, 5e-3, 2e-2)  # losses, gradient norms, weights vs DeepSpeed
GRAM = REDUCED if GRAM_FP16 else (1e-5, 1e-5, 1e-5)
# Gram across layouts: losses within 1e-5 all the same; gradient norms and weights within these
# (with per-head Newton-Schulz in fp16 on tp2 x dp2, the weights land up to 1.35e-4 apart).
LAYOUT = (1e-5, 1e-3, 2e-4) if GRAM_FP16 else (1e-5, 1e-5, 1e-5)


def save_model(out, seed):
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(make_config("llama", VOCAB, False, False),
                                                          dtype=torch.float32)
    model.save_pretrained(out, safe_serialization=True)


def muon_config(ns_method="gram", per_head=False, zero=None, micro=2, ga=1, world=2, **extra):
    params = {"lr": 0.02, "adam_lr": 3e-3, "momentum": 0.9, "weight_decay": 0.05, "ns_method": ns_method,
              "per_head_muon": per_head, "torch_adam": True}
    return {"train_micro_batch_size_per_gpu": micro, "gradient_accumulation_steps": ga,
            "train_batch_size": micro * ga * world, "gradient_clipping": 1.0, "steps_per_print": 1,
            "optimizer": {"type": "Muon", "params": params},
            "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 4, "warmup_type": "linear"}},
            "zero_optimization": zero or {"stage": 0}, **extra}


def train_spec(name, model_dir, data, ranks, ds, checkpoints, steps=STEPS):
    return {"name": name, "kind": "train", "resources": {"ranks": ranks},
            "model": {"config": model_dir + "/config.json", "weights": model_dir},
            "data": {"train": data, "seq_len": SEQ, "seed": DATA_SEED},
            "train": {"steps": steps, "checkpoint_dir": checkpoints}, "deepspeed": ds}


def final_weights(checkpoints, steps=STEPS):
    return load_file(os.path.join(checkpoints, f"global_step{steps}", "model.safetensors"))


def relative(a, b):
    return abs(a - b) / max(abs(b), 1e-12)


def compare(name, log, weights, reference_steps, reference_weights, loss_tolerance=1e-5, norm_tolerance=1e-5,
            weight_tolerance=1e-5):
    """Loom's step lines and final weights against a reference's: {step: {"loss", "grad_norm"}}."""
    ours = step_lines(log)
    worst_loss = max(relative(ours.get(s, {}).get("loss", 0), r["loss"]) for s, r in reference_steps.items())
    worst_norm = max(relative(ours.get(s, {}).get("grad_norm", 0), r["grad_norm"]) for s, r in reference_steps.items())
    check(len(ours) == len(reference_steps) and worst_loss <= loss_tolerance,
          f"{name}: {len(ours)} losses, worst relative difference {worst_loss:.2e}")
    check(worst_norm <= norm_tolerance, f"{name}: gradient norms, worst relative difference {worst_norm:.2e}")
    same = set(weights) == set(reference_weights)
    diff = max((weights[k] - reference_weights[k]).abs().max().item() for k in reference_weights) if same else 1
    check(same and diff <= weight_tolerance, f"{name}: final weights, max |difference| = {diff:.2e}")


def muon_update_bits(bin_dir, work):
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    torch._dynamo.config.disable = True
    from deepspeed.runtime.zero.muon.original_muon import muon_update
    from safetensors.torch import save_file
    torch.manual_seed(0)
    shapes = {"square": (64, 64, 0), "tall": (128, 64, 0), "wide": (64, 160, 0), "query-heads": (64, 64, 16),
              "kv-heads": (32, 64, 16), "tall-heads": (96, 8, 32)}
    matrices = {}
    for k, (rows, cols, width) in shapes.items():
        matrices[k + ".grad"] = torch.randn(rows, cols) * 1e-2
        matrices[k + ".momentum"] = torch.randn(rows, cols) * 1e-2
        matrices[k + ".head_width"] = torch.tensor([width])
    inputs, outputs = os.path.join(work, "matrices.safetensors"), os.path.join(work, "updates.safetensors")
    save_file(matrices, inputs)
    for method in ("gram", "standard"):
        subprocess.run([os.path.join(bin_dir, "loom-muon-update"), inputs, outputs, method, "0.9"], check=True)
        ours = load_file(outputs)
        for k, (rows, cols, width) in shapes.items():
            grad, momentum = matrices[k + ".grad"].clone(), matrices[k + ".momentum"].clone()
            update = muon_update(grad, momentum, beta=0.9, ns_method=method, num_heads=rows // width if width else None)
            check(torch.equal(update, ours[k + ".update"]) and torch.equal(momentum, ours[k + ".momentum"]),
                  f"muon_update {method} {k} {rows}x{cols}: Loom's update and momentum equal DeepSpeed's bit for bit")
        # The GPU's form (GEMM epilogues) rounds once where DeepSpeed's eager code rounds twice. In
        # fp32 (Gram here) it agrees to 1e-5; in bf16 both are some 3% off the exact iteration, so
        # it is held to DeepSpeed's own distance from that iteration (DeepSpeed's code in fp32).
        subprocess.run([os.path.join(bin_dir, "loom-muon-update"), inputs, outputs, method, "0.9", "fused"], check=True)
        fused = load_file(outputs)
        for k, (rows, cols, width) in shapes.items():
            heads = rows // width if width else None
            update = muon_update(matrices[k + ".grad"].clone(), matrices[k + ".momentum"].clone(), beta=0.9,
                                 ns_method=method, num_heads=heads)
            error = ((fused[k + ".update"] - update).norm() / update.norm()).item()
            if method == "gram" and not GRAM_FP16:
                check(error <= 1e-5, f"muon_update gram {k}, fused kernels: relative difference {error:.1e}")
                continue
            exact = exact_muon_update(matrices[k + ".grad"].clone(), matrices[k + ".momentum"].clone(), heads)
            ours = ((fused[k + ".update"] - exact).norm() / exact.norm()).item()
            theirs = ((update - exact).norm() / exact.norm()).item()
            low = "fp16" if method == "gram" else "bf16"
            check(ours <= 1.25 * theirs, f"muon_update {method} {k}, fused kernels: {ours:.1e} from the fp32 "
                                         f"iteration, DeepSpeed's {low} {theirs:.1e}")


def exact_muon_update(grad, momentum, heads):
    """DeepSpeed's standard muon_update with its Newton-Schulz run in fp32."""
    from deepspeed.runtime.zero.muon import original_muon
    bf16 = original_muon.ns_compute_dtype
    original_muon.ns_compute_dtype = lambda method="gram": torch.float32
    try:
        return original_muon.muon_update(grad, momentum, beta=0.9, ns_method="standard", num_heads=heads)
    finally:
        original_muon.ns_compute_dtype = bf16


def deepspeed_oracle(bin_dir, work, data, model_dir):
    for stage, method, per_head in itertools.product((1, 2), ("gram", "standard"), (False, True)):
        name = f"zero{stage}-{method}" + ("-per-head" if per_head else "")
        ds = muon_config(method, per_head, {"stage": stage})
        ds_path = os.path.join(work, name + "-ds.json")
        with open(ds_path, "w") as f:
            json.dump(ds, f)
        out, saved = os.path.join(work, name + "-ds.jsonl"), os.path.join(work, name + "-ds-final")
        subprocess.run([sys.executable, os.path.join(HERE, "deepspeed_train.py"), "--model", model_dir, "--data", data,
                        "--seq-len", str(SEQ), "--data-seed", str(DATA_SEED), "--steps", str(STEPS),
                        "--ds-config", ds_path, "--world", "2", "--out", out, "--save-dir", saved],
                       check=True, capture_output=True, timeout=300, env={**os.environ, "TORCHDYNAMO_DISABLE": "1"})
        reference = {line["step"]: line for line in map(json.loads, open(out))}
        checkpoints = os.path.join(work, name)
        log = loom_run(bin_dir, train_spec(name, model_dir, data, 2, ds, checkpoints), work, name)
        tolerances = GRAM if method == "gram" else REDUCED
        compare(f"vs DeepSpeed {name}", log, final_weights(checkpoints), reference,
                load_file(os.path.join(saved, "model.safetensors")), *tolerances)


def layouts(bin_dir, work, data, model_dir):
    def run(name, ranks, ds, steps=STEPS, checkpoints=None):
        checkpoints = checkpoints or os.path.join(work, name)
        log = loom_run(bin_dir, train_spec(name, model_dir, data, ranks, ds, checkpoints, steps), work, name)
        return log, checkpoints

    # One 8-sample step: 1 rank x 4 micro-batches of 2 as the reference, the rest on 4 ranks.
    log, checkpoints = run("one-rank", 1, muon_config(micro=2, ga=4, world=1))
    reference_steps, reference_weights = step_lines(log), final_weights(checkpoints)
    check("optimizer state" in log, "one-rank: Muon job trained")
    cases = {
        "zero0": {"stage": 0},
        "zero1": {"stage": 1},
        "zero2": {"stage": 2, "reduce_bucket_size": 3000},
        "zero3": {"stage": 3, "stage3_param_persistence_threshold": 100},
        "zero3-whole": {"stage": 3},  # every matrix here is under the persistence threshold: whole
        "zero2-offload": {"stage": 2, "offload_optimizer": {"device": "cpu"}},
    }
    for name, zero in cases.items():
        log, checkpoints = run(name, 4, muon_config(zero=zero, world=4))
        compare(f"4 ranks {name}", log, final_weights(checkpoints), reference_steps, reference_weights, *LAYOUT)
    # The step's 8 samples as one micro-batch on 1 rank: the same step as accumulating 4 of them.
    log, checkpoints = run("one-micro-batch", 1, muon_config(micro=8, ga=1, world=1))
    compare("gradient accumulation 4 vs one micro-batch of the same samples", log, final_weights(checkpoints),
            reference_steps, reference_weights, *LAYOUT)
    # Stopped half way and resumed: the checkpoint carries the momentum.
    zero3 = muon_config(zero=cases["zero3"], world=4)
    resumed = os.path.join(work, "zero3-resumed")
    run("zero3-half", 4, zero3, steps=STEPS // 2, checkpoints=resumed)
    log, _ = run("zero3-resumed", 4, zero3, checkpoints=resumed)
    check(f"at step {STEPS // 2}" in log, f"zero3-resumed: resumed at step {STEPS // 2}")
    second_half = {s: r for s, r in reference_steps.items() if s > STEPS // 2}
    compare("4 ranks zero3 stopped and resumed", log, final_weights(resumed), second_half, reference_weights, *LAYOUT)


def tensor_parallel(bin_dir, work, data, model_dir):
    for per_head in (True, False):
        label = "per-head" if per_head else "whole-matrix"
        ds = muon_config("gram", per_head, micro=2, ga=4, world=1)
        reference = os.path.join(work, f"tp1-{label}")
        log = loom_run(bin_dir, train_spec(f"tp1-{label}", model_dir, data, 1, ds, reference), work, f"tp1-{label}")
        reference_steps, reference_weights = step_lines(log), final_weights(reference)
        runs = {"tp2": (2, muon_config("gram", per_head, micro=2, ga=4, world=1)),
                "tp2-dp2-zero0": (4, muon_config("gram", per_head, {"stage": 0}, micro=2, ga=2, world=2)),
                "tp2-dp2-zero1": (4, muon_config("gram", per_head, {"stage": 1}, micro=2, ga=2, world=2))}
        for run, (ranks, ds) in runs.items():
            ds["tensor_parallel"] = {"autotp_size": 2}
            name = f"{run}-{label}"
            checkpoints = os.path.join(work, name)
            log = loom_run(bin_dir, train_spec(name, model_dir, data, ranks, ds, checkpoints), work, name)
            compare(f"{name} vs 1 rank", log, final_weights(checkpoints), reference_steps, reference_weights, *LAYOUT)


def fp16(bin_dir, work, data, model_dir):
    """The Muon update is unscaled before Newton-Schulz and keeps its size under the loss scale:
    the weights move as they do in fp32. (Were the update divided by the scale like a gradient it
    would be 2^16 times too small, and the weights would not move at all.)"""
    initial = load_file(os.path.join(model_dir, "model.safetensors"))
    # ZeRO 0, where DeepSpeed's flat fp16 optimizer would take Muon's matrices for already
    # orthogonalized ones (plain SGD), and ZeRO 2.
    runs = {}
    for name, (zero, extra) in {"fp32": (0, {}), "fp16-zero0": (0, {"fp16": {"enabled": True, "loss_scale": 65536}}),
                                "fp16-zero2": (2, {"fp16": {"enabled": True, "loss_scale": 65536}}),
                                "bf16-zero0": (0, {"bf16": {"enabled": True}})}.items():
        checkpoints = os.path.join(work, "precision-" + name)
        log = loom_run(bin_dir, train_spec("precision-" + name, model_dir, data, 2,
                                           muon_config(zero={"stage": zero}, **extra), checkpoints), work, name)
        runs[name] = (loom_losses(log), final_weights(checkpoints))
    losses32, weights32 = runs["fp32"]
    for name in ("fp16-zero0", "fp16-zero2", "bf16-zero0"):
        losses, weights = runs[name]
        tolerance = 1e-3 if name.startswith("fp16") else 1e-2  # bf16: 8 bits of mantissa in the forward
        worst = max(relative(losses.get(s, 0), l) for s, l in losses32.items())
        check(len(losses) == STEPS and worst <= tolerance, f"{name}: losses vs fp32, worst relative {worst:.2e}")
        for key in ("model.layers.0.self_attn.q_proj.weight", "model.layers.1.mlp.down_proj.weight"):
            moved32 = weights32[key] - initial[key]
            moved = weights[key].float() - initial[key]
            error = ((moved - moved32).norm() / moved32.norm()).item()
            check(error <= 1e-1, f"{name}: {key} moved as in fp32 (relative difference {error:.2e})")
    # A dynamic scale that starts at 2^22 overflows for its first steps: those are skipped, and the
    # momentum they computed is dropped with them (it would carry inf into every later update).
    checkpoints = os.path.join(work, "precision-overflow")
    ds = muon_config(zero={"stage": 1}, fp16={"enabled": True, "initial_scale_power": 22,
                                                                  "hysteresis": 1})
    log = loom_run(bin_dir, train_spec("precision-overflow", model_dir, data, 2, ds, checkpoints), work, "overflow")
    steps = step_lines(log)
    skipped = steps.get(STEPS, {}).get("skipped", 0)
    weights = final_weights(checkpoints)
    finite = all(torch.isfinite(t.float()).all() for t in weights.values())
    first, last = steps.get(1, {}).get("loss", 0), steps.get(STEPS, {}).get("loss", float("inf"))
    # Step s was skipped when the running count of skipped steps went up at it.
    applied = [s for s in steps if steps[s].get("skipped", 0) == steps.get(s - 1, {}).get("skipped", 0)]
    norms_finite = all(np.isfinite(steps[s].get("grad_norm", np.nan)) for s in applied)
    check(1 <= skipped <= 10 and finite and norms_finite and last < first,
          f"fp16 from 2^22: {skipped:.0f} steps skipped, then finite gradient norms {norms_finite} and weights "
          f"{finite}, loss {first:.4f} -> {last:.4f}")


def refusals(bin_dir, work, data, model_dir):
    frozen = train_spec("frozen", model_dir, data, 1, muon_config("gram", True, world=1), os.path.join(work, "x"))
    frozen["train"]["frozen_parameters"] = [r".*self_attn\.[qkv]_proj\..*"]
    unknown = train_spec("unknown", model_dir, data, 1, muon_config(world=1), os.path.join(work, "x"))
    unknown["deepspeed"]["optimizer"]["params"]["nesterov"] = False
    method = train_spec("method", model_dir, data, 1, muon_config("polar", world=1), os.path.join(work, "x"))
    cases = {"unknown key": (unknown, "deepspeed.optimizer.params.nesterov: unknown key"),
             "ns_method": (method, "deepspeed.optimizer.params.ns_method: \"polar\" is not a Newton-Schulz method"),
             "per_head_muon": (frozen, "deepspeed.optimizer.params.per_head_muon: the llama model has no trainable "
                                       "attention projection")}
    for name, (spec, expected) in cases.items():
        refused_at_submit(bin_dir, work, name, spec, expected)


def main():
    a = oracle_args(__doc__, only=["deepspeed", "layouts", "tensor", "fp16", "refusals"])
    bin_dir = a.bin
    with tempfile.TemporaryDirectory(prefix="loom-muon-") as work:
        tokens = np.random.default_rng(3).integers(0, VOCAB, 64 * SEQ + 1)
        data = os.path.join(work, "muon.tokens")
        write_token_file(data, tokens, VOCAB, "uint16")
        model_dir = os.path.join(work, "llama")
        save_model(model_dir, seed=5)
        if a.only in (None, "deepspeed"):
            muon_update_bits(bin_dir, work)
            deepspeed_oracle(bin_dir, work, data, model_dir)
        if a.only in (None, "refusals"):
            refusals(bin_dir, work, data, model_dir)
        if a.only in (None, "layouts"):
            layouts(bin_dir, work, data, model_dir)
        if a.only in (None, "tensor"):
            tensor_parallel(bin_dir, work, data, model_dir)
        if a.only in (None, "fp16"):
            fp16(bin_dir, work, data, model_dir)
    if parity_test.failures:
        raise SystemExit(f"{len(parity_test.failures)} checks failed")


if __name__ == "__main__":
    main()
