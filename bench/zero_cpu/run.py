"""Step time per ZeRO stage, Loom against DeepSpeed 0.19.8 (CPU accelerator, gloo), on the same
small Llama, data, sample order and DeepSpeed config, in one run.

  python3 bench/zero_cpu/run.py --bin build/bin [--ranks 2 4] [--stages 0 1 2 3] [--steps 12]
                                [--optimizers AdamW Muon]

Each configuration runs `--steps` optimizer steps; the step time is the median over the steps
after the first two (warm-up). Loom runs through `loomctl run` (real loomd, real ranks, UCX);
DeepSpeed through tests/oracles/deepspeed_train.py (torch.multiprocessing, gloo). Prints a
markdown table: Loom and DeepSpeed seconds per step, DeepSpeed / Loom, and Loom's stage / stage 0
(and, for Muon, Loom's step / its AdamW step). DeepSpeed's Muon runs eagerly (TORCHDYNAMO_DISABLE):
torch.compile on this CPU would compile its muon_update with a C++ toolchain first; at ZeRO 3 it
needs reduce_scatter off ("Muon and reduce scatter cannot be used together"), which both get.
"""
import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "oracles"))

import torch  # noqa: E402
import transformers  # noqa: E402

CONFIG = dict(vocab_size=260, hidden_size=256, intermediate_size=688, num_hidden_layers=4, num_attention_heads=8,
              num_key_value_heads=4, max_position_embeddings=512, tie_word_embeddings=False)


def deepspeed_config(stage, optimizer="AdamW"):
    zero = {"stage": stage}
    if stage == 3:
        zero["stage3_param_persistence_threshold"] = 10000
    params = {"lr": 1e-3, "weight_decay": 0.01, "torch_adam": True}
    if optimizer == "Muon":
        params.update(lr=0.02, adam_lr=1e-3)
        if stage == 3:
            zero["reduce_scatter"] = False
    return {"train_batch_size": 16, "train_micro_batch_size_per_gpu": 4, "gradient_clipping": 1.0,
            "steps_per_print": 1, "zero_optimization": zero, "optimizer": {"type": optimizer, "params": params}}


def loom(bin_dir, work, model, data, seq, steps, ranks, stage, optimizer="AdamW"):
    name = f"loom-{optimizer}-z{stage}-r{ranks}"
    spec = {"name": name, "kind": "train", "resources": {"ranks": ranks},
            "model": {"config": model + "/config.json", "weights": model},
            "data": {"train": data, "seq_len": seq, "seed": 1}, "train": {"steps": steps},
            "deepspeed": deepspeed_config(stage, optimizer)}
    path = os.path.join(work, name + ".json")
    with open(path, "w") as f:
        json.dump(spec, f)
    state = os.path.join(work, name)
    subprocess.run([os.path.join(bin_dir, "loomctl"), "run", path, "--state-dir", state], check=True,
                   capture_output=True, timeout=900)
    log = open(glob.glob(os.path.join(state, "jobs", "*", "attempt-1", "rank-0.log"))[0]).read()
    # "step 5/12: loss ... tokens/s N": the step time is tokens per step / tokens per second.
    times = []
    for line in log.splitlines():
        if line.startswith("step ") and "tokens/s" in line:
            step = int(line.split()[1].split("/")[0])
            if step > 2:
                times.append(16 * seq / float(line.split("tokens/s ")[1].split()[0]))
    return statistics.median(times)


def deepspeed(work, model, data, seq, steps, ranks, stage, optimizer="AdamW"):
    name = f"ds-{optimizer}-z{stage}-r{ranks}"
    config = os.path.join(work, name + ".json")
    with open(config, "w") as f:
        json.dump(deepspeed_config(stage, optimizer), f)
    out = os.path.join(work, name + ".jsonl")
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "oracles", "deepspeed_train.py"), "--model", model,
                        "--data", data, "--seq-len", str(seq), "--data-seed", "1", "--steps", str(steps),
                        "--ds-config", config, "--world", str(ranks), "--out", out],
                       capture_output=True, text=True, timeout=900, env={**os.environ, "TORCHDYNAMO_DISABLE": "1"})
    if r.returncode != 0:
        return None, r.stderr.strip().splitlines()[-1] if r.stderr.strip() else f"exit {r.returncode}"
    lines = [json.loads(x) for x in open(out)]
    return statistics.median(x["seconds"] for x in lines if x["step"] > 2), None


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bin", required=True)
    p.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    p.add_argument("--stages", type=int, nargs="+", default=[0, 1, 2, 3])
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--optimizers", nargs="+", default=["AdamW"], choices=["AdamW", "Muon"])
    a = p.parse_args()
    bin_dir = os.path.abspath(a.bin)
    with tempfile.TemporaryDirectory(prefix="loom-zero-bench-") as work:
        data = os.path.join(work, "train.tokens")
        subprocess.run([os.path.join(bin_dir, "loomctl"), "data", "prepare", "/usr/share/common-licenses/GPL-3",
                        "/usr/share/common-licenses/Apache-2.0", "--output", data], check=True, capture_output=True)
        model = os.path.join(work, "model")
        torch.manual_seed(0)
        transformers.AutoModelForCausalLM.from_config(transformers.LlamaConfig(**CONFIG), dtype=torch.float32) \
            .save_pretrained(model, safe_serialization=True)
        params = sum(x.numel() for x in transformers.AutoModelForCausalLM.from_pretrained(model).parameters())
        print(f"Llama {params / 1e6:.2f}M parameters, sequence {a.seq_len}, batch 16 (micro 4), fp32, "
              f"{a.steps} steps, median after 2\n")
        print("| ranks | stage | optimizer | Loom s/step | DeepSpeed s/step | DeepSpeed / Loom | Loom vs its stage 0 "
              "| Loom vs its AdamW |")
        print("|---|---|---|---|---|---|---|---|")
        for ranks in a.ranks:
            base, adamw = {}, {}
            for stage in a.stages:
                for optimizer in a.optimizers:
                    ours = loom(bin_dir, work, model, data, a.seq_len, a.steps, ranks, stage, optimizer)
                    base.setdefault(optimizer, ours if stage == 0 else None)
                    if optimizer == "AdamW":
                        adamw[stage] = ours
                    theirs, why = deepspeed(work, model, data, a.seq_len, a.steps, ranks, stage, optimizer)
                    ds = f"{theirs:.3f}" if theirs else f"failed: {why}"
                    ratio = f"{theirs / ours:.2f}x" if theirs else "-"
                    rel = f"{ours / base[optimizer]:.2f}x" if base[optimizer] else "-"
                    vs_adamw = f"{ours / adamw[stage]:.2f}x" if stage in adamw else "-"
                    print(f"| {ranks} | {stage} | {optimizer} | {ours:.3f} | {ds} | {ratio} | {rel} | {vs_adamw} |",
                          flush=True)


if __name__ == "__main__":
    main()
