"""train.resume_optimizer false (DeepSpeed's load_checkpoint(load_optimizer_states=False)): a job
that resumes another job's checkpoint without its optimizer state takes its weights, fp32 masters
and step, and starts Adam afresh. The reference is the same checkpoint with every optimizer state
tensor zeroed and Adam's step count set to 0 (what a fresh AdamW holds), resumed whole: the weights
after 4 more steps must be identical, and differ from a whole resume's. At ZeRO 0 in fp32 on 1 rank
and at ZeRO 1 in bf16 on 2 ranks (the masters then come from each rank's file, as DeepSpeed 0.19.9
keeps them).

  python3 tests/oracles/resume_optimizer_test.py --bin build/bin
"""
import json
import os
import shutil
import sys
import tempfile
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from loom_runs import oracle_args  # noqa: E402

import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

from checkpoint_damage_test import same_weights, weights  # noqa: E402
import parity_test  # noqa: E402
from parity_test import check, exit_code, loom_run  # noqa: E402


def train_spec(data, model_dir, name, checkpoints, steps, ranks, stage, bf16, resume_optimizer=True):
    ds = {"train_batch_size": 4, "gradient_clipping": 1.0, "steps_per_print": 1, "zero_optimization": {"stage": stage},
          "optimizer": {"type": "AdamW", "params": {"lr": 2e-3, "weight_decay": 0.01}}}
    if bf16:
        ds["bf16"] = {"enabled": True}
    return {"name": name, "kind": "train", "resources": {"ranks": ranks},
            "model": {"config": model_dir + "/config.json", "weights": model_dir},
            "data": {"train": data, "seq_len": 16, "seed": 2},
            "train": {"steps": steps, "checkpoint_dir": checkpoints, "resume_optimizer": resume_optimizer},
            "deepspeed": ds}


def fresh_optimizer_state(tag_dir):
    """Zeroes every optimizer state tensor of the tag's state files (the masters, frozen weights
    and RNG state stay) and sets Adam's step count to 0; the manifest follows."""
    for name in os.listdir(tag_dir):
        if not (name == "optimizer.safetensors" or name.startswith("rank_")):
            continue
        path = os.path.join(tag_dir, name)
        state = load_file(path)
        for key, t in state.items():
            if key == "step":
                state[key] = torch.zeros_like(t)
            elif not (key.startswith("master.") or key.startswith("frozen.") or key == "rng"):
                state[key] = torch.zeros_like(t)
        save_file(state, path)
    manifest_path = os.path.join(tag_dir, "manifest.json")
    manifest = json.load(open(manifest_path))
    for name in manifest["files"]:
        data = open(os.path.join(tag_dir, name), "rb").read()
        manifest["files"][name] = {"bytes": len(data), "crc32": zlib.crc32(data)}
    json.dump(manifest, open(manifest_path, "w"))


def main():
    bin_dir = oracle_args(__doc__).bin
    work = tempfile.mkdtemp(prefix="loom-resume-optimizer-")
    try:
        data, model_dir = parity_test.licence_tokens_and_model(bin_dir, work, "resume", seed=8)
        for label, ranks, stage, bf16 in (("zero0 fp32 1 rank", 1, 0, False), ("zero1 bf16 2 ranks", 2, 1, True)):
            tag = label.replace(" ", "-")

            def run(name, checkpoints, steps, **kw):
                spec = train_spec(data, model_dir, f"{tag}-{name}", checkpoints, steps, ranks, stage, bf16, **kw)
                return loom_run(bin_dir, spec, work, f"{tag}-{name}")

            first = os.path.join(work, tag + "-first")
            run("first", first, 4)
            copies = {}
            for name in ("fresh", "zeroed", "whole"):
                copies[name] = os.path.join(work, f"{tag}-{name}")
                shutil.copytree(first, copies[name])
            fresh_optimizer_state(os.path.join(copies["zeroed"], "global_step4"))
            log = run("fresh", copies["fresh"], 8, resume_optimizer=False)
            check("at step 4 with a fresh optimizer state (train.resume_optimizer is false)" in log,
                  f"{label}: the job says it resumed without the optimizer state")
            run("zeroed", copies["zeroed"], 8)
            run("whole", copies["whole"], 8)
            fresh, zeroed, whole = (weights(copies[n], 8) for n in ("fresh", "zeroed", "whole"))
            check(same_weights(fresh, zeroed),
                  f"{label}: resume_optimizer false equals resuming a zeroed optimizer state (step 0)")
            check(not same_weights(fresh, whole), f"{label}: ... and differs from a whole resume")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return exit_code()


if __name__ == "__main__":
    sys.exit(main())
