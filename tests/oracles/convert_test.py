"""Checkpoint conversion against DeepSpeed's zero_to_fp32, end to end through `loomctl run` (a real
loomd and a convert job's rank):

1. DeepSpeed 0.19.8 trains tiny models on CPU (2 ranks, gloo) and writes its own ZeRO-2 and ZeRO-3
   checkpoints, fp32 and bf16; one of them a tied model (qwen2) with a frozen parameter. Loom's
   convert job turns each into HF safetensors equal bit for bit to what zero_to_fp32 consolidates
   (its safetensors files where it writes them; its state dict for the tied model, whose
   safetensors it refuses to write); the tied head is stored once, as HF stores it.
2. The same checkpoints become Loom checkpoints (`to: loom`, with the model's config.json): Loom
   resumes them on DeepSpeed's layout and on others (1 rank stage 0, 4 ranks stage 1) with the
   losses of DeepSpeed's own continued run over 10 steps, within 1e-5 in fp32 (bf16's resolution
   in bf16), a frozen parameter (of the tied qwen2) staying as DeepSpeed left it; a missing config
   is refused by name.
3. dtype bf16 equals the fp32 tensors rounded to bf16; shard_size cuts the output into shards
   with an index that names every tensor; 3 ranks that split the shards write the same.
4. Refusals, naming the file and the offset: a truncated rank file, a corrupted pickle, a pickle
   that names a global nothing here may call (os.system), an output that is not empty.
5. Memory: a ZeRO-3 checkpoint of a model of many mid-sized tensors (71M parameters, 24 layers,
   815 MB with its Adam state, over 3 times the bound) converts with the rank's peak RSS under
   the largest tensor + 256 MiB.
6. The fuzz driver (tests/fuzz/) reads thousands of mutations of these files, each to a value or
   an error.

  python3 tests/oracles/convert_test.py --bin build/bin
"""
import glob
import json
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from loom_runs import oracle_args  # noqa: E402
os.environ.setdefault("DS_ACCELERATOR", "cpu")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

import parity_test  # noqa: E402
from make_tiny_model import make_config  # noqa: E402
from parity_test import check, loom_run  # noqa: E402
from token_file import write_token_file  # noqa: E402

SEQ, VOCAB = 16, 300


def save_model(family, out, tie, **sizes):
    torch.manual_seed(3)
    config = make_config(family, VOCAB, tie, False)
    for key, value in sizes.items():
        setattr(config, key, value)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(out, safe_serialization=True)


def deepspeed_checkpoint(work, data, name, model_dir, stage, bf16, frozen=None, steps=3):
    """DeepSpeed's own ZeRO checkpoint after `steps` steps on 2 ranks."""
    config = {"train_batch_size": 4, "train_micro_batch_size_per_gpu": 2, "gradient_clipping": 1.0,
              "steps_per_print": 1000, "zero_optimization": {"stage": stage},
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.01, "torch_adam": True}}}
    if bf16:
        config["bf16"] = {"enabled": True}
    config_path = os.path.join(work, name + "-ds.json")
    with open(config_path, "w") as f:
        json.dump(config, f)
    out = os.path.join(work, name)
    command = [sys.executable, os.path.join(HERE, "deepspeed_train.py"), "--model", model_dir, "--data", data,
               "--seq-len", str(SEQ), "--data-seed", "1", "--steps", str(steps), "--ds-config", config_path, "--world", "2",
               "--out", out + ".jsonl", "--ds-checkpoint", out]
    if frozen:
        command += ["--frozen", frozen]
    r = subprocess.run(command, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        print(r.stdout, r.stderr, sep="\n", file=sys.stderr)
        raise SystemExit(f"deepspeed_train.py {name}: exit {r.returncode}")
    return out


def convert(bin_dir, work, name, source, expect_failure=False, ranks=1, **options):
    output = options.pop("output", os.path.join(work, name + "-hf"))
    spec = {"name": name, "kind": "convert", "resources": {"ranks": ranks},
            "convert": {"from": source, "to": "hf", "output": output, **options}}
    return output, loom_run(bin_dir, spec, work, name, expect_failure=expect_failure)


def load_dir(path):
    tensors = {}
    for f in sorted(glob.glob(os.path.join(path, "*.safetensors"))):
        tensors.update(load_file(f))
    return tensors


def same_bits(a, b):
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return torch.equal(a.view(torch.uint8), b.view(torch.uint8)) if a.dtype != torch.bool else torch.equal(a, b)


def compare(name, ours, theirs, tied=()):
    expected = {k: v for k, v in theirs.items() if k not in tied}
    names_match = set(ours) == set(expected)
    differ = [k for k in expected if k in ours and not same_bits(ours[k], expected[k])]
    check(names_match and not differ,
          f"{name}: {len(ours)} tensors equal bit for bit to zero_to_fp32's {len(expected)}"
          f"{' (tied ' + ', '.join(tied) + ' stored once)' if tied else ''}; differ: {differ[:3]}")


def conversions(bin_dir, work, data):
    from deepspeed.utils.zero_to_fp32 import (convert_zero_checkpoint_to_fp32_state_dict,
                                              get_fp32_state_dict_from_zero_checkpoint)
    llama, qwen2 = os.path.join(work, "llama"), os.path.join(work, "qwen2-tied")
    save_model("llama", llama, tie=False)
    save_model("qwen2", qwen2, tie=True)
    runs = {"z2-fp32": (llama, 2, False, None), "z2-bf16": (llama, 2, True, None),
            "z3-fp32-tied-frozen": (qwen2, 3, False, r"model\.layers\.0\.input_layernorm\.weight"),
            "z3-bf16": (llama, 3, True, None)}
    checkpoints = {}
    for name, (model_dir, stage, bf16, frozen) in runs.items():
        source = deepspeed_checkpoint(work, data, name, model_dir, stage, bf16, frozen)
        checkpoints[name] = source
        output, log = convert(bin_dir, work, "convert-" + name, source, dtype="fp32")
        check(f"ZeRO stage {stage} over 2 ranks" in log, f"{name}: the convert job reads a ZeRO-{stage} checkpoint "
              "of 2 ranks")
        ours = load_dir(output)
        if frozen:
            # zero_to_fp32's safetensors refuse tied tensors ("Some tensors share memory"): its state dict.
            theirs = get_fp32_state_dict_from_zero_checkpoint(source)
            compare(name, ours, theirs, tied=("lm_head.weight",))
        else:
            reference = os.path.join(work, name + "-zero_to_fp32")
            convert_zero_checkpoint_to_fp32_state_dict(source, reference, safe_serialization=True)
            compare(name, ours, load_dir(reference))
    # bf16 output, and shards with their index.
    source = checkpoints["z2-fp32"]
    theirs = get_fp32_state_dict_from_zero_checkpoint(source)
    output, _ = convert(bin_dir, work, "convert-bf16", source, dtype="bf16")
    compare("z2-fp32 to bf16", load_dir(output), {k: v.to(torch.bfloat16) for k, v in theirs.items()})
    output, _ = convert(bin_dir, work, "convert-shards", source, shard_size="150KB")
    with open(os.path.join(output, "model.safetensors.index.json")) as f:
        index = json.load(f)
    files = sorted(set(index["weight_map"].values()))
    check(len(files) > 1 and all(os.path.exists(os.path.join(output, f)) for f in files) and
          set(index["weight_map"]) == set(theirs),
          f"shard_size 150KB: {len(files)} shards, the index naming all {len(index['weight_map'])} tensors")
    compare("sharded", load_dir(output), theirs)
    # Three ranks split the shards; rank 0 writes the index and publishes.
    output, log = convert(bin_dir, work, "convert-3-ranks", source, ranks=3, shard_size="150KB")
    with open(os.path.join(output, "model.safetensors.index.json")) as f:
        split = json.load(f)
    check(split == index and "by 3 ranks" in log, "3 ranks: the same shards and index as 1 rank")
    compare("3 ranks", load_dir(output), theirs)
    return checkpoints


def continued_training(bin_dir, work, data, checkpoints):
    """DeepSpeed's checkpoints into Loom checkpoints (convert.to loom, with the model's config.json):
    Loom resumes them, on DeepSpeed's layout and on others, with the losses of DeepSpeed's own
    continued run (within 1e-5 in fp32, bf16's resolution in bf16) over 10 steps; a frozen
    parameter stays frozen, under train.frozen_parameters of its name."""
    llama, qwen2 = os.path.join(work, "llama"), os.path.join(work, "qwen2-tied")
    frozen = r"model\.layers\.0\.input_layernorm\.weight"  # as deepspeed_checkpoint() froze it
    checkpoints = dict(checkpoints, **{"z3-fp32": deepspeed_checkpoint(work, data, "z3-fp32", llama, 3, False)})
    more = 10
    # (checkpoint, its model, its frozen parameter, the Loom layout, tolerance)
    cases = [("z2-fp32", llama, None, {"ranks": 2}, 1e-5), ("z2-fp32", llama, None, {"ranks": 1, "zero_stage": 0}, 1e-5),
             ("z3-fp32", llama, None, {"ranks": 4, "zero_stage": 1}, 1e-5), ("z3-bf16", llama, None, {"ranks": 2}, 1e-2),
             ("z3-fp32-tied-frozen", qwen2, frozen, {"ranks": 1, "zero_stage": 2}, 1e-5)]
    theirs = {}
    for name, model_dir, frozen_regex, layout, tolerance in cases:
        source = checkpoints[name]
        with open(os.path.join(work, name + "-ds.json")) as f:
            ds_config = json.load(f)
        if name not in theirs:
            out = os.path.join(work, name + "-continued.jsonl")
            command = [sys.executable, os.path.join(HERE, "deepspeed_train.py"), "--model", model_dir, "--data", data,
                       "--seq-len", str(SEQ), "--data-seed", "1", "--steps", str(more), "--ds-config",
                       os.path.join(work, name + "-ds.json"), "--world", "2", "--out", out, "--ds-load", source]
            if frozen_regex:
                command += ["--frozen", frozen_regex]
            subprocess.run(command, check=True, capture_output=True, timeout=600)
            theirs[name] = {line["step"]: line["loss"] for line in map(json.loads, open(out))}
        stage = layout.get("zero_stage", ds_config["zero_optimization"]["stage"])
        target = f"{name}-to-loom-{layout['ranks']}ranks-zero{stage}"
        output = os.path.join(work, target)
        spec = {"name": target, "kind": "convert", "resources": {"ranks": 1},
                "convert": {"from": source, "to": "loom", "output": output, "config": model_dir + "/config.json",
                            "layout": layout}}
        loom_run(bin_dir, spec, work, target)
        ds_config.pop("train_micro_batch_size_per_gpu")  # 4 samples a step over the new ranks
        ds_config["zero_optimization"] = {"stage": stage}
        train = {"name": target + "-train", "kind": "train", "resources": {"ranks": layout["ranks"]},
                 "model": {"config": model_dir + "/config.json", "weights": model_dir},
                 "data": {"train": data, "seq_len": SEQ, "seed": 1},
                 "train": dict({"steps": 3 + more, "checkpoint_dir": output},
                               **({"frozen_parameters": [frozen_regex]} if frozen_regex else {})),
                 "deepspeed": dict(ds_config, steps_per_print=1)}
        log = loom_run(bin_dir, train, work, target + "-train")
        ours = parity_test.loom_losses(log)
        worst = max(abs(ours.get(s, 0) - l) / l for s, l in theirs[name].items())
        check("resumed from" in log and len(ours) == more and worst <= tolerance,
              f"{target}: {len(ours)} losses after resuming vs DeepSpeed's own continued run, worst relative "
              f"difference {worst:.2e}")
        if frozen_regex:
            before = load_dir(os.path.join(output, "global_step3"))
            after = load_dir(os.path.join(output, f"global_step{3 + more}"))
            key = "model.layers.0.input_layernorm.weight"
            check(torch.equal(before[key], after[key]), f"{target}: the frozen parameter is as DeepSpeed left it")
    spec = {"name": "no-config-to-loom", "kind": "convert", "resources": {"ranks": 1},
            "convert": {"from": checkpoints["z2-fp32"], "to": "loom", "output": os.path.join(work, "nc"),
                        "layout": {"ranks": 2}}}
    refused = loom_run(bin_dir, spec, work, "no-config-to-loom", expect_failure=True)
    check("convert.config: " in refused and "does not keep the model's config.json" in refused,
          "a DeepSpeed checkpoint to loom without convert.config is refused, naming the field")


def rewritten(source, target, replace):
    """A copy of the torch.save file `source` with members changed by replace(name, bytes)."""
    with zipfile.ZipFile(source) as zin, zipfile.ZipFile(target, "w", zipfile.ZIP_STORED) as zout:
        for item in zin.infolist():
            zout.writestr(item, replace(item.filename, zin.read(item.filename)))


def refusals(bin_dir, work, checkpoints):
    source = checkpoints["z3-bf16"]
    tag = os.path.join(source, open(os.path.join(source, "latest")).read().strip())

    def broken(name, change):
        copy = os.path.join(work, "broken-" + name)
        shutil.copytree(source, copy)
        change(os.path.join(copy, os.path.basename(tag)))
        return copy

    def truncate(tag_dir):
        path = glob.glob(os.path.join(tag_dir, "*zero_pp_rank_1_mp_rank_00_optim_states.pt"))[0]
        with open(path, "r+b") as f:
            f.truncate(os.path.getsize(path) // 2)

    def corrupt(tag_dir):
        path = glob.glob(os.path.join(tag_dir, "zero_pp_rank_0_mp_rank_00_model_states.pt"))[0]
        rewritten(path, path + ".new", lambda n, b: b[:40] + bytes([b[40] ^ 0xff]) + b[41:] if n.endswith("data.pkl")
                  else b)
        # Keep the original CRC: the archive says one thing, the bytes another.
        with zipfile.ZipFile(path) as z:
            crc = next(i.CRC for i in z.infolist() if i.filename.endswith("data.pkl"))
        raw = bytearray(open(path + ".new", "rb").read())
        with zipfile.ZipFile(path + ".new") as z:
            info = next(i for i in z.infolist() if i.filename.endswith("data.pkl"))
        new_crc = info.CRC.to_bytes(4, "little")
        raw = raw.replace(new_crc, crc.to_bytes(4, "little"))
        open(path, "wb").write(bytes(raw))
        os.remove(path + ".new")

    class Evil:
        def __reduce__(self):
            return os.system, ("echo this must never run",)

    def evil(tag_dir):
        path = glob.glob(os.path.join(tag_dir, "zero_pp_rank_0_mp_rank_00_model_states.pt"))[0]
        rewritten(path, path + ".new", lambda n, b: pickle.dumps({"module": Evil()}, protocol=2)
                  if n.endswith("data.pkl") else b)
        os.replace(path + ".new", path)

    cases = {
        "truncated": (truncate, ["zero_pp_rank_1_mp_rank_00_optim_states.pt: truncated", "at offsets"]),
        "corrupted": (corrupt, ["zero_pp_rank_0_mp_rank_00_model_states.pt", "is corrupt: CRC-32", "offset"]),
        "unknown global": (evil, ["zero_pp_rank_0_mp_rank_00_model_states.pt (data.pkl): offset",
                                  "global posix.system is not one that torch.save writes"]),
    }
    for name, (change, expected) in cases.items():
        _, out = convert(bin_dir, work, "refused-" + name.replace(" ", "-"), broken(name.replace(" ", "-"), change),
                         expect_failure=True)
        check(all(e in out for e in expected), f"refused ({name}): {[e for e in expected if e not in out] or 'named'}")
    occupied = os.path.join(work, "occupied")
    os.makedirs(occupied)
    open(os.path.join(occupied, "keep.txt"), "w").write("mine")
    _, out = convert(bin_dir, work, "refused-occupied", source, expect_failure=True, output=occupied)
    check("exists and is not an empty directory" in out and open(os.path.join(occupied, "keep.txt")).read() == "mine",
          "refused (an output that is not empty): named, and left as it was")


def memory(bin_dir, work, data):
    model_dir = os.path.join(work, "mid-sized")
    save_model("llama", model_dir, tie=False, hidden_size=512, intermediate_size=1408, num_hidden_layers=24,
               num_attention_heads=8, num_key_value_heads=4, head_dim=64)
    source = deepspeed_checkpoint(work, data, "mid-sized-z3", model_dir, 3, False, steps=1)
    size = sum(os.path.getsize(f) for f in glob.glob(os.path.join(source, "*", "*")))
    output, log = convert(bin_dir, work, "convert-mid-sized", source)
    line = [l for l in log.splitlines() if "peak RSS" in l][-1]
    units = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
    words = line.split("peak RSS ")[1].replace(",", "").split()
    peak, largest = float(words[0]) * units[words[1]], float(words[5]) * units[words[6]]
    bound = largest + (256 << 20)
    check(size > 3 * bound and peak <= bound,
          f"memory: a {size / 1e6:.0f} MB checkpoint converts with a peak RSS of {peak / (1 << 20):.1f} MiB, under the "
          f"largest tensor ({largest / (1 << 20):.1f} MiB) + 256 MiB")
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
    compare("mid-sized z3", load_dir(output), get_fp32_state_dict_from_zero_checkpoint(source))


def fuzz(bin_dir, work, checkpoints):
    seeds = []
    for path in sorted(glob.glob(os.path.join(checkpoints["z3-fp32-tied-frozen"], "*", "*model_states.pt")))[:1]:
        seeds.append(path)
    for path in sorted(glob.glob(os.path.join(checkpoints["z2-bf16"], "*", "*.pt"))):
        with zipfile.ZipFile(path) as z:
            member = next(n for n in z.namelist() if n.endswith("data.pkl"))
            seed = os.path.join(work, "seed-" + os.path.basename(path) + ".pkl")
            open(seed, "wb").write(z.read(member))
            seeds.append(seed)
    r = subprocess.run([os.path.join(bin_dir, "loom-fuzz-torch-pickle"), "--mutations", "3000", "--seed", "7", *seeds],
                       capture_output=True, text=True, timeout=600)
    check(r.returncode == 0 and "each to a value or an error" in r.stdout,
          f"fuzz: {r.stdout.strip() or r.stderr.strip()[-300:]}")


def main():
    bin_dir = oracle_args(__doc__).bin
    with tempfile.TemporaryDirectory(prefix="loom-convert-") as work:
        data = os.path.join(work, "data.tokens")
        write_token_file(data, np.random.default_rng(2).integers(0, VOCAB, 64 * SEQ + 1), VOCAB, "uint16")
        checkpoints = conversions(bin_dir, work, data)
        continued_training(bin_dir, work, data, checkpoints)
        refusals(bin_dir, work, checkpoints)
        memory(bin_dir, work, data)
        fuzz(bin_dir, work, checkpoints)
    if parity_test.failures:
        raise SystemExit(f"{len(parity_test.failures)} checks failed")


if __name__ == "__main__":
    main()
