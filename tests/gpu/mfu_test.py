"""The `mfu` metric on a GPU, through `loomctl run -o json`: a bf16 Llama trained on one GPU reports
mfu every step, and it equals tokens/s x PaLM's FLOPs per token (6N + 12·L·heads·head_dim·seq,
recomputed here from the model's config) over the GPU's datasheet peak. /metrics shows it as
loom_job_mfu_ratio (tests/oracles/metrics_test.py checks that mapping on the CPU).
scripts/gpu/build-and-test runs it (gpu-tests):

  python3 tests/gpu/mfu_test.py --bin build-gpu/bin
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "oracles"))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from loom_runs import check, exit_code  # noqa: E402
from token_file import write_token_file  # noqa: E402

SEQ, MICRO, STEPS, VOCAB = 1024, 8, 12, 32000
MODEL = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": VOCAB, "hidden_size": 1024,
         "intermediate_size": 2816, "num_hidden_layers": 8, "num_attention_heads": 16, "num_key_value_heads": 8,
         "head_dim": 64, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
         "hidden_act": "silu", "initializer_range": 0.02, "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
PEAK_BF16 = {"NVIDIA H200": 989.4e12, "NVIDIA H100": 989.4e12, "NVIDIA A100": 312e12}


def parameters(c):
    h, i, layers, v = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"], c["vocab_size"]
    q, kv = c["num_attention_heads"] * c["head_dim"], c["num_key_value_heads"] * c["head_dim"]
    per_layer = h * q + 2 * h * kv + q * h + 3 * h * i + 2 * h
    return v * h * (1 if c["tie_word_embeddings"] else 2) + layers * per_layer + h


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin", required=True)
    bin_dir = os.path.abspath(parser.parse_args().bin)
    name = torch.cuda.get_device_name(0)
    peak = next((p for prefix, p in PEAK_BF16.items() if name.startswith(prefix)), None)
    if peak is None:
        print(f"skipped: no datasheet peak for {name} here")
        return 0
    work = tempfile.mkdtemp(prefix="loom-mfu-")
    try:
        with open(os.path.join(work, "config.json"), "w") as f:
            json.dump(MODEL, f)
        tokens = np.random.default_rng(0).integers(0, VOCAB, 256 * (SEQ + 1))
        write_token_file(os.path.join(work, "random.tokens"), tokens, VOCAB, "uint32")
        spec = {"name": "mfu", "kind": "train", "resources": {"ranks": 1, "device": "cuda"},
                "model": {"config": os.path.join(work, "config.json"), "init_seed": 1},
                "data": {"train": os.path.join(work, "random.tokens"), "seq_len": SEQ, "seed": 1},
                "train": {"steps": STEPS},
                "deepspeed": {"train_batch_size": MICRO, "train_micro_batch_size_per_gpu": MICRO, "steps_per_print": 1,
                              "bf16": {"enabled": True}, "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}}}
        path = os.path.join(work, "mfu.json")
        with open(path, "w") as f:
            json.dump(spec, f)
        r = subprocess.run([os.path.join(bin_dir, "loomctl"), "run", path, "-o", "json"], capture_output=True,
                           text=True, timeout=600)
        check(r.returncode == 0, f"the job succeeds ({r.stderr.strip()[-300:]})")
        rows = [m for line in r.stdout.splitlines() for m in json.loads(line).get("metrics", [])]
        by_step = {}
        for m in rows:
            by_step.setdefault(int(m.get("step", 0)), {})[m["name"]] = m.get("value", 0.0)  # (proto JSON omits zeros)
        steps = [s for s in sorted(by_step) if "mfu" in by_step[s]]
        check(steps == list(range(1, STEPS + 1)), f"every step reports mfu ({steps})")
        flops = 6 * (parameters(MODEL) - VOCAB * MODEL["hidden_size"]) + \
            12 * MODEL["num_hidden_layers"] * MODEL["num_attention_heads"] * MODEL["head_dim"] * SEQ
        for s in steps:
            expected = by_step[s]["tokens_per_s"] * flops / peak
            check(abs(by_step[s]["mfu"] - expected) <= 1e-9 * expected,
                  f"step {s}: mfu {by_step[s]['mfu']:.4f} = tokens/s x FLOPs per token / peak ({expected:.4f})")
        last = by_step[steps[-1]]["mfu"] if steps else 0
        check(0.05 < last < 1, f"a plausible mfu on {name} ({last:.3f}: {by_step[steps[-1]]['tokens_per_s']:.0f} tokens/s)")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return exit_code()


if __name__ == "__main__":
    sys.exit(main())
