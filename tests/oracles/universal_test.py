"""DeepSpeed universal checkpoints (`kind: convert`, `to: deepspeed_universal`), end to end through
`loomctl run` (a real loomd and convert ranks), against DeepSpeed 0.19.8 itself (CPU, gloo):

1. DeepSpeed trains a tiny llama 3 steps (ZeRO 2, fp32, 2 ranks) and checkpoints. Loom's convert job
   writes the universal checkpoint of it: every zero/<parameter>/*.pt holds what ds_to_universal.py
   writes from the same checkpoint, bit for bit (the fp32 master, both moments, the step count),
   and the param group and the progress agree. DeepSpeed loads it (`load_universal`) on 1 rank at
   ZeRO stage 3 and continues 10 steps with the losses of its own continued run within 1e-5.
2. Loom trains 3 steps and checkpoints (fp32 ZeRO 2 on 2 ranks with a frozen parameter and a
   WarmupLR schedule; bf16 ZeRO 3 on 2 ranks). From the universal checkpoint of each, DeepSpeed
   continues 10 steps (on 1 rank at stage 2; on 2 ranks at stage 3) with the losses of Loom's
   uninterrupted run: within 1e-5 in fp32, 1e-3 in bf16. The frozen parameter's file
   is its weight.
3. Two convert ranks split the files and write the same bytes as one.
4. Without torch_adam the step count is an int, as DeepSpeed's own Adam keeps it. Refused, naming
   what: a Muon checkpoint, an fp16 one.

  python3 tests/oracles/universal_test.py --bin build/bin
"""
import filecmp
import glob
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from loom_runs import oracle_args  # noqa: E402
os.environ.setdefault("DS_ACCELERATOR", "cpu")

import numpy as np  # noqa: E402
import torch  # noqa: E402

import parity_test  # noqa: E402
from convert_test import SEQ, VOCAB, deepspeed_checkpoint, same_bits, save_model  # noqa: E402
from parity_test import check, loom_losses, loom_run  # noqa: E402
from token_file import write_token_file  # noqa: E402

MORE = 10
FROZEN = r"model\.layers\.0\.input_layernorm\.weight"
ADAMW = {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.01, "torch_adam": True}}
WARMUP = {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 1e-3, "warmup_num_steps": 8,
                                         "warmup_type": "linear"}}


def to_universal(bin_dir, work, name, source, ranks=1, expect_failure=False):
    output = os.path.join(work, name)
    spec = {"name": name, "kind": "convert", "resources": {"ranks": ranks},
            "convert": {"from": source, "to": "deepspeed_universal", "output": output}}
    return output, loom_run(bin_dir, spec, work, name, expect_failure=expect_failure)


def deepspeed_continues(work, name, model_dir, data, ds_config, load_dir, world, universal=True, frozen=None):
    """DeepSpeed's losses over MORE steps after loading the checkpoint in `load_dir` (a universal
    one, with load_universal, or its own)."""
    config_path = os.path.join(work, name + "-ds.json")
    with open(config_path, "w") as f:
        json.dump(ds_config, f)
    out = os.path.join(work, name + ".jsonl")
    command = [sys.executable, os.path.join(HERE, "deepspeed_train.py"), "--model", model_dir, "--data", data,
               "--seq-len", str(SEQ), "--data-seed", "1", "--steps", str(MORE), "--ds-config", config_path,
               "--world", str(world), "--out", out, "--ds-load", load_dir]
    if universal:
        command.append("--universal")
    if frozen:
        command += ["--frozen", frozen]
    r = subprocess.run(command, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        print(r.stdout[-3000:], r.stderr[-6000:], sep="\n", file=sys.stderr)
        raise SystemExit(f"deepspeed_train.py {name}: exit {r.returncode}")
    return {line["step"]: line["loss"] for line in map(json.loads, open(out))}


def worst_difference(ours, theirs):
    return max(abs(ours.get(s, 0) - loss) / loss for s, loss in theirs.items())


def load(path):
    return torch.load(path, weights_only=False)


def parameter_files(tag_dir):
    """{parameter: {file: what torch.load reads}} of a universal checkpoint's zero/ folder."""
    out = {}
    for folder in sorted(glob.glob(os.path.join(tag_dir, "zero", "*"))):
        if os.path.isdir(folder):
            out[os.path.basename(folder)] = {os.path.basename(f): load(f) for f in sorted(glob.glob(folder + "/*.pt"))}
    return out


def same_value(a, b):
    if torch.is_tensor(a) or torch.is_tensor(b):
        return (torch.is_tensor(a) and torch.is_tensor(b) and a.shape == b.shape and
                same_bits(a.reshape(-1), b.reshape(-1)))
    if isinstance(a, dict):
        return isinstance(b, dict) and set(a) == set(b) and all(same_value(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def from_deepspeed(bin_dir, work, data, model_dir):
    source = deepspeed_checkpoint(work, data, "ds-z2", model_dir, 2, False)
    tag = open(os.path.join(source, "latest")).read().strip()
    ours, log = to_universal(bin_dir, work, "ds-z2-universal", source)
    check("a DeepSpeed universal checkpoint of" in log and "load_universal" in log,
          "DeepSpeed ZeRO 2 -> universal: the log says what was written and how DeepSpeed loads it")
    theirs = os.path.join(work, "ds-z2-ds_to_universal", tag)
    subprocess.run([sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal", "--input_folder",
                    os.path.join(source, tag), "--output_folder", theirs, "--inject_missing_state",
                    "--num_extract_workers", "1", "--num_merge_workers", "1"],
                   check=True, capture_output=True, timeout=600)
    mine, reference = parameter_files(os.path.join(ours, tag)), parameter_files(theirs)
    names_match = set(mine) == set(reference) and all(set(mine[p]) == set(reference[p]) for p in reference)
    differ = [f"{p}/{f}" for p in reference for f in reference[p]
              if p in mine and f in mine[p] and not same_value(mine[p][f], reference[p][f])]
    check(names_match and not differ and len(reference) > 0,
          f"{len(mine)} parameters' files equal to ds_to_universal's ({len(reference)}), bit for bit; differ: "
          f"{differ[:3]}")
    our_state = load(os.path.join(ours, tag, "zero", "optimizer_state.pt"))
    their_state = load(os.path.join(theirs, "zero", "optimizer_state.pt"))
    group, their_group = our_state["param_groups"][0], their_state["param_groups"][0]
    keys = ("lr", "eps", "weight_decay")
    check(all(group[k] == their_group[k] for k in keys) and tuple(group["betas"]) == tuple(their_group["betas"])
          and our_state["clip_grad"] == their_state["clip_grad"] and our_state["ds_version"],
          f"the param group ({', '.join(keys)}, betas), clip_grad and ds_version as ds_to_universal keeps them")
    our_model = load(os.path.join(ours, tag, "mp_rank_00_model_states.pt"))
    their_model = load(os.path.join(theirs, "mp_rank_00_model_states.pt"))
    progress = ("global_steps", "global_samples", "skipped_steps", "dp_world_size")
    check(all(our_model[k] == their_model[k] for k in progress),
          f"the model states' {', '.join(progress)} as DeepSpeed's: {[our_model[k] for k in progress]}")

    with open(os.path.join(work, "ds-z2-ds.json")) as f:
        ds_config = json.load(f)
    own = deepspeed_continues(work, "ds-z2-continued", model_dir, data, ds_config, source, 2, universal=False)
    ds_config["zero_optimization"] = {"stage": 3}
    resumed = deepspeed_continues(work, "ds-z2-universal-z3-1rank", model_dir, data, ds_config, ours, 1)
    worst = worst_difference(resumed, own)
    check(len(resumed) == MORE and worst <= 1e-5,
          f"DeepSpeed resumes Loom's universal checkpoint on 1 rank at ZeRO 3: {len(resumed)} losses vs its own "
          f"continued run on 2 ranks at ZeRO 2, worst relative difference {worst:.2e}")


def loom_train(bin_dir, work, name, model_dir, data, ds_config, ranks, steps, checkpoints=None, frozen=None,
               expect_failure=False):
    train = {"steps": steps}
    if checkpoints:
        train["checkpoint_dir"] = checkpoints
    if frozen:
        train["frozen_parameters"] = [frozen]
    spec = {"name": name, "kind": "train", "resources": {"ranks": ranks},
            "model": {"config": model_dir + "/config.json", "weights": model_dir},
            "data": {"train": data, "seq_len": SEQ, "seed": 1}, "train": train,
            "deepspeed": dict(ds_config, steps_per_print=1)}
    return loom_run(bin_dir, spec, work, name, expect_failure=expect_failure)


def from_loom(bin_dir, work, data, model_dir):
    # (name, the Loom run's config, its ranks, the DeepSpeed stage and ranks that resume, tolerance, frozen)
    cases = [("loom-z2-fp32", {"zero_optimization": {"stage": 2}, "scheduler": WARMUP}, 2, 2, 1, 1e-5, FROZEN),
             ("loom-z3-bf16", {"zero_optimization": {"stage": 3}, "bf16": {"enabled": True}}, 2, 3, 2, 1e-3, None)]
    outputs = {}
    for name, settings, ranks, ds_stage, ds_world, tolerance, frozen in cases:
        ds_config = dict({"train_batch_size": 4, "train_micro_batch_size_per_gpu": 2, "gradient_clipping": 1.0,
                          "optimizer": ADAMW}, **settings)
        uninterrupted = loom_losses(loom_train(bin_dir, work, name + "-uninterrupted", model_dir, data, ds_config,
                                               ranks, 3 + MORE, frozen=frozen))
        checkpoints = os.path.join(work, name)
        loom_train(bin_dir, work, name, model_dir, data, ds_config, ranks, 3, checkpoints, frozen=frozen)
        output, _ = to_universal(bin_dir, work, name + "-universal", checkpoints)
        outputs[name] = (checkpoints, output)
        ds_config["zero_optimization"] = {"stage": ds_stage}
        resumed = deepspeed_continues(work, name + "-resumed", model_dir, data, ds_config, output, ds_world,
                                      frozen=frozen)
        expected = {s: loss for s, loss in uninterrupted.items() if s > 3}
        worst = worst_difference(resumed, expected)
        check(len(resumed) == MORE and len(expected) == MORE and worst <= tolerance,
              f"{name}: DeepSpeed resumes its universal checkpoint on {ds_world} rank(s) at ZeRO {ds_stage}: "
              f"{len(resumed)} losses vs Loom's uninterrupted run, worst relative difference {worst:.2e}")
        if frozen:
            key = "model.layers.0.input_layernorm.weight"
            from safetensors.torch import load_file
            weight = load_file(os.path.join(model_dir, "model.safetensors"))[key]
            stored = load(os.path.join(output, "global_step3", "zero", key, "fp32.pt"))
            check(set(os.listdir(os.path.join(output, "global_step3", "zero", key))) == {"fp32.pt"} and
                  torch.equal(stored["param"], weight.float()),
                  f"{name}: the frozen parameter's folder holds its weight alone")
    # Two convert ranks split the files; the bytes are the same.
    checkpoints, one = outputs["loom-z3-bf16"]
    two, log = to_universal(bin_dir, work, "loom-z3-bf16-universal-2ranks", checkpoints, ranks=2)
    files = sorted(os.path.relpath(f, one) for f in glob.glob(os.path.join(one, "**", "*"), recursive=True)
                   if os.path.isfile(f))
    same = all(filecmp.cmp(os.path.join(one, f), os.path.join(two, f), shallow=False) for f in files)
    check("by 2 ranks" in log and same and len(files) > 10,
          f"2 convert ranks write the same {len(files)} files as 1, byte for byte")


def steps_and_refusals(bin_dir, work, data, model_dir):
    base = {"train_batch_size": 4, "gradient_clipping": 1.0, "zero_optimization": {"stage": 0}}
    # DeepSpeed's own Adam (no torch_adam) keeps the step count as an int.
    plain = dict(base, optimizer={"type": "AdamW", "params": {"lr": 1e-3}})
    loom_train(bin_dir, work, "plain-adam", model_dir, data, plain, 1, 2, os.path.join(work, "plain-adam"))
    output, _ = to_universal(bin_dir, work, "plain-adam-universal", os.path.join(work, "plain-adam"))
    tag = os.path.join(output, "global_step2")
    step = load(os.path.join(tag, "zero", "lm_head.weight", "step.pt"))
    stage3 = load(os.path.join(tag, "zero", "optimizer_state.pt"))["optimizer_state_dict"]["state"][0]["step"]
    check(type(step) is int and step == 2 and type(stage3) is int and stage3 == 2,
          f"without torch_adam the step count is an int, as DeepSpeed's own Adam keeps it: {step!r}, {stage3!r}")

    muon = dict(base, optimizer={"type": "Muon", "params": {"lr": 0.02, "adam_lr": 1e-3, "momentum": 0.9}})
    fp16 = dict(base, optimizer=ADAMW, fp16={"enabled": True, "loss_scale": 1024})
    cases = {"muon": (muon, "trained with Muon: this version writes the universal checkpoints of Adam and AdamW runs"),
             "fp16": (fp16, "is an fp16 checkpoint: its dynamic loss scale is not carried over")}
    for name, (config, expected) in cases.items():
        checkpoints = os.path.join(work, name)
        loom_train(bin_dir, work, name, model_dir, data, config, 1, 1, checkpoints)
        output, refused = to_universal(bin_dir, work, name + "-universal", checkpoints, expect_failure=True)
        check(expected in refused and "convert.to: deepspeed_universal" in refused and not os.path.exists(output),
              f"refused ({name}): named, and nothing written")


def main():
    a = oracle_args(__doc__, only=["deepspeed", "loom", "refusals"])
    bin_dir = a.bin
    with tempfile.TemporaryDirectory(prefix="loom-universal-") as work:
        data = os.path.join(work, "data.tokens")
        write_token_file(data, np.random.default_rng(2).integers(0, VOCAB, 64 * SEQ + 1), VOCAB, "uint16")
        model_dir = os.path.join(work, "llama")
        save_model("llama", model_dir, tie=False)
        if a.only in (None, "deepspeed"):
            from_deepspeed(bin_dir, work, data, model_dir)
        if a.only in (None, "loom"):
            from_loom(bin_dir, work, data, model_dir)
        if a.only in (None, "refusals"):
            steps_and_refusals(bin_dir, work, data, model_dir)
    if parity_test.failures:
        raise SystemExit(f"{len(parity_test.failures)} checks failed")


if __name__ == "__main__":
    main()
