"""Checkpoint conversion: Loom's convert job against DeepSpeed 0.19.8's zero_to_fp32.py on the same
ZeRO-3 checkpoint, in one run: wall time, throughput and peak RSS; then the same checkpoint made
resumable on another layout, DeepSpeed's way (ds_to_universal.py, its universal checkpoint) and
Loom's (a convert job to loom, 4 ranks at ZeRO stage 1), and that Loom checkpoint resharded again
(to 2 ranks at stage 3); then the universal checkpoint written by Loom (to: deepspeed_universal)
from the DeepSpeed checkpoint and from the Loom one.

  python3 bench/convert/run.py --bin build/bin [--layers 48] [--hidden 640] [--work DIR]

DeepSpeed trains a Llama of many mid-sized tensors (hidden 640, MLP 1728, 48 layers: about 180M
parameters, a ZeRO-3 checkpoint of about 2 GB with its Adam state) for one step on 2 CPU ranks and
writes its checkpoint. Then zero_to_fp32 (convert_zero_checkpoint_to_fp32_state_dict, safetensors)
and Loom's convert job (`loomctl run`, dtype fp32) each write the consolidated fp32 safetensors;
their tensors are compared bit for bit. zero_to_fp32's peak RSS is its process's ru_maxrss; Loom's
is the convert rank's VmHWM (its log's last line), its time the conversion's own (the log) and
`loomctl run`'s whole (a control plane started and stopped around it). The checkpoint was just
written, so it is read from the page cache by both. ds_to_universal runs with its default worker
processes (4 extracting, 2 merging); its peak RSS is the largest of its own and its children's.
"""
import argparse
import glob
import json
import os
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ORACLES = os.path.join(ROOT, "tests", "oracles")
sys.path.insert(0, ORACLES)
os.environ.setdefault("DS_ACCELERATOR", "cpu")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402

from make_tiny_model import make_config  # noqa: E402
from token_file import write_token_file  # noqa: E402

DS_TO_UNIVERSAL = """
import resource, sys, time
from deepspeed.checkpoint import ds_to_universal
sys.argv = ["ds_to_universal", "--input_folder", sys.argv[1], "--output_folder", sys.argv[2]]
start = time.time()
ds_to_universal.main(ds_to_universal.parse_arguments())
rss = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
print(time.time() - start, rss * 1024)
"""

ZERO_TO_FP32 = """
import resource, sys, time
from deepspeed.utils.zero_to_fp32 import convert_zero_checkpoint_to_fp32_state_dict
start = time.time()
convert_zero_checkpoint_to_fp32_state_dict(sys.argv[1], sys.argv[2], safe_serialization=True)
print(time.time() - start, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
"""


def checkpoint(work, layers, hidden):
    config = make_config("llama", 300, False, False)
    config.hidden_size, config.intermediate_size, config.num_hidden_layers = hidden, hidden * 27 // 10, layers
    config.num_attention_heads, config.num_key_value_heads, config.head_dim = hidden // 64, hidden // 128, 64
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    parameters = sum(p.numel() for p in model.parameters())
    model_dir = os.path.join(work, "model")
    model.save_pretrained(model_dir, safe_serialization=True)
    del model
    data = os.path.join(work, "data.tokens")
    write_token_file(data, np.random.default_rng(1).integers(0, 300, 64 * 16 + 1), 300, "uint16")
    ds = os.path.join(work, "ds.json")
    with open(ds, "w") as f:
        json.dump({"train_batch_size": 4, "train_micro_batch_size_per_gpu": 2, "gradient_clipping": 1.0,
                   "steps_per_print": 1000, "zero_optimization": {"stage": 3},
                   "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}}}, f)
    out = os.path.join(work, "ckpt")
    subprocess.run([sys.executable, os.path.join(ORACLES, "deepspeed_train.py"), "--model", model_dir, "--data", data,
                    "--seq-len", "16", "--data-seed", "1", "--steps", "1", "--ds-config", ds, "--world", "2",
                    "--out", os.path.join(work, "ds.jsonl"), "--ds-checkpoint", out],
                   check=True, capture_output=True, timeout=1800)
    return out, parameters


def loom_convert(bin_dir, work, name, convert):
    """Runs a convert job: (its own seconds, its peak RSS, `loomctl run`'s whole seconds, its largest tensor)."""
    spec = {"name": name, "kind": "convert", "resources": {"ranks": 1}, "convert": convert}
    spec_path = os.path.join(work, name + ".json")
    with open(spec_path, "w") as f:
        json.dump(spec, f)
    state = os.path.join(work, name + "-state")
    started = time.time()
    subprocess.run([os.path.join(os.path.abspath(bin_dir), "loomctl"), "run", spec_path, "--state-dir", state],
                   check=True, capture_output=True)
    whole = time.time() - started
    log = open(glob.glob(os.path.join(state, "jobs", "*", "attempt-1", "rank-0.log"))[0]).read()
    m = re.search(r"written in ([\d.]+) s .*peak RSS ([\d.]+) (\w+), the largest tensor ([\d.]+) (\w+)", log)
    units = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
    return float(m.group(1)), float(m.group(2)) * units[m.group(3)], whole, float(m.group(4)) * units[m.group(5)]


def tree_bytes(path):
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, names in os.walk(path) for f in names)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bin", required=True)
    p.add_argument("--layers", type=int, default=48)
    p.add_argument("--hidden", type=int, default=640)
    p.add_argument("--work", help="keep the files here (default: a temporary directory)")
    a = p.parse_args()
    work = a.work or tempfile.mkdtemp(prefix="loom-convert-bench-")
    source, parameters = checkpoint(work, a.layers, a.hidden)
    size = sum(os.path.getsize(f) for f in glob.glob(os.path.join(source, "*", "*")))

    theirs = os.path.join(work, "zero_to_fp32")
    r = subprocess.run([sys.executable, "-c", ZERO_TO_FP32, source, theirs], check=True, capture_output=True,
                       text=True)
    their_seconds, their_rss = map(float, r.stdout.split()[-2:])

    ours = os.path.join(work, "loom")
    our_seconds, our_rss, whole, largest = loom_convert(a.bin, work, "convert-bench",
                                                        {"from": source, "to": "hf", "output": ours, "dtype": "fp32"})

    from safetensors.torch import load_file
    mine, reference = {}, {}
    for f in glob.glob(os.path.join(ours, "*.safetensors")):
        mine.update(load_file(f))
    for f in glob.glob(os.path.join(theirs, "*.safetensors")):
        reference.update(load_file(f))
    same = set(mine) == set(reference) and all(torch.equal(mine[k], reference[k]) for k in reference)
    output = sum(t.numel() * t.element_size() for t in reference.values())
    mib = 1 << 20
    print(f"checkpoint: ZeRO-3, 2 ranks, {parameters / 1e6:.0f}M parameters, {size / 1e9:.2f} GB on disk; "
          f"output {output / 1e9:.2f} GB fp32 in {len(mine)} tensors (the largest {largest / mib:.1f} MiB); "
          f"bit for bit equal: {same}")
    print("| converter | seconds | GB/s (output) | peak RSS | vs the largest tensor + 256 MiB |")
    print("|---|---|---|---|---|")
    bound = largest + 256 * mib
    print(f"| zero_to_fp32 (DeepSpeed 0.19.8) | {their_seconds:.2f} | {output / 1e9 / their_seconds:.2f} | "
          f"{their_rss / mib:.0f} MiB | {their_rss / bound:.2f}x |")
    print(f"| Loom convert job | {our_seconds:.2f} | {output / 1e9 / our_seconds:.2f} | {our_rss / mib:.0f} MiB | "
          f"{our_rss / bound:.2f}x |")
    print(f"| Loom, `loomctl run` end to end | {whole:.2f} | {output / 1e9 / whole:.2f} | | |")

    # Resumable on another layout: DeepSpeed's universal checkpoint, Loom's checkpoint for 4 ranks.
    tag = open(os.path.join(source, "latest")).read().strip()
    universal = os.path.join(work, "universal", tag + "_universal")
    r = subprocess.run([sys.executable, "-c", DS_TO_UNIVERSAL, os.path.join(source, tag), universal], check=True,
                       capture_output=True, text=True)
    universal_seconds, universal_rss = map(float, r.stdout.split()[-2:])
    loom4 = os.path.join(work, "loom-4ranks")
    to4 = loom_convert(a.bin, work, "to-loom-4ranks", {"from": source, "to": "loom", "output": loom4,
                                                          "config": os.path.join(work, "model", "config.json"),
                                                          "layout": {"ranks": 4, "zero_stage": 1}})
    loom2 = os.path.join(work, "loom-2ranks")
    to2 = loom_convert(a.bin, work, "to-loom-2ranks", {"from": loom4, "to": "loom", "output": loom2,
                                                          "layout": {"ranks": 2, "zero_stage": 3}})
    ds_universal = os.path.join(work, "loom-universal")
    to_universal = loom_convert(a.bin, work, "to-universal", {"from": source, "to": "deepspeed_universal",
                                                               "output": ds_universal})
    loom_universal = os.path.join(work, "loom-4ranks-universal")
    from_loom = loom_convert(a.bin, work, "loom-to-universal", {"from": loom4, "to": "deepspeed_universal",
                                                                 "output": loom_universal})
    print()
    print("| to another layout | seconds | written | peak RSS |")
    print("|---|---|---|---|")
    print(f"| ds_to_universal (DeepSpeed 0.19.8), its universal checkpoint | {universal_seconds:.2f} | "
          f"{tree_bytes(universal) / 1e9:.2f} GB | {universal_rss / mib:.0f} MiB |")
    print(f"| Loom, DeepSpeed ZeRO-3 x 2 to a Loom checkpoint for ZeRO-1 x 4 | {to4[0]:.2f} | "
          f"{tree_bytes(loom4) / 1e9:.2f} GB | {to4[1] / mib:.0f} MiB |")
    print(f"| Loom, that checkpoint resharded to ZeRO-3 x 2 | {to2[0]:.2f} | {tree_bytes(loom2) / 1e9:.2f} GB | "
          f"{to2[1] / mib:.0f} MiB |")
    print(f"| Loom, DeepSpeed ZeRO-3 x 2 to a DeepSpeed universal checkpoint | {to_universal[0]:.2f} | "
          f"{tree_bytes(ds_universal) / 1e9:.2f} GB | {to_universal[1] / mib:.0f} MiB |")
    print(f"| Loom, the ZeRO-1 x 4 Loom checkpoint to a DeepSpeed universal checkpoint | {from_loom[0]:.2f} | "
          f"{tree_bytes(loom_universal) / 1e9:.2f} GB | {from_loom[1] / mib:.0f} MiB |")


if __name__ == "__main__":
    main()
