"""ZeRO-3 with offload_param on a GPU, through `loomctl run`: a small Llama (tied embeddings, so one
parameter belongs to two blocks) trained 6 steps in bf16 with its parameters' parts in pinned host
memory, with and without the optimizer offloaded too, has the losses and gradient norms of the
same run with the parameters on the device (the arithmetic is the same; only cuBLAS's and the
embedding backward's own run-to-run differences remain), and holds less on the device.
scripts/gpu/build-and-test runs it (gpu-tests) with Loom's binaries:

  python3 tests/gpu/offload_param_test.py --bin build-gpu/bin
"""
import argparse
import json
import os
import re
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "oracles"))

import numpy as np  # noqa: E402
from loom_runs import check, exit_code, loom_run, step_lines  # noqa: E402
from token_file import write_token_file  # noqa: E402

SEQ, MICRO, STEPS, VOCAB = 256, 4, 6, 32000
MODEL = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": VOCAB, "hidden_size": 512,
         "intermediate_size": 1408, "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 4,
         "head_dim": 64, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
         "hidden_act": "silu", "initializer_range": 0.02, "tie_word_embeddings": True, "torch_dtype": "bfloat16"}


def run(bin_dir, work, name, zero, plugins):
    spec = {"name": name, "kind": "train", "resources": {"ranks": 1, "device": "cuda"},
            "model": {"config": os.path.join(work, "config.json"), "init_seed": 1},
            "data": {"train": os.path.join(work, "random.tokens"), "seq_len": SEQ, "seed": 1},
            "train": {"steps": STEPS},
            "deepspeed": {"train_batch_size": MICRO, "train_micro_batch_size_per_gpu": MICRO, "steps_per_print": 1,
                          "bf16": {"enabled": True}, "gradient_clipping": 1.0, "zero_optimization": zero,
                          "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}}
    if plugins:
        spec["kernels"] = {"plugins": plugins}
    log = loom_run(bin_dir, spec, work, name, timeout=600)
    steps = step_lines(log)
    peak = re.search(r"device peak ([\d.]+) (GiB|MiB|KiB)", log)
    scale = {"GiB": 1024, "MiB": 1, "KiB": 1 / 1024}
    return steps, float(peak.group(1)) * scale[peak.group(2)] if peak else None


def close(a, b, what):
    worst = max(abs(a[s][what] - b[s][what]) / max(abs(b[s][what]), 1e-6) for s in b)
    return worst, worst <= 5e-3


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin", required=True)
    bin_dir = os.path.abspath(parser.parse_args().bin)
    cpu_plugin = os.path.join(os.path.dirname(bin_dir), "lib", "libloom_kernels_cpu.so")
    work = tempfile.mkdtemp(prefix="loom-offload-param-")
    try:
        with open(os.path.join(work, "config.json"), "w") as f:
            json.dump(MODEL, f)
        tokens = np.random.default_rng(0).integers(0, VOCAB, 64 * (SEQ + 1))
        write_token_file(os.path.join(work, "random.tokens"), tokens, VOCAB, "uint32")
        device, device_peak = run(bin_dir, work, "z3", {"stage": 3}, [])
        offload = {"device": "cpu", "pin_memory": True}
        host, host_peak = run(bin_dir, work, "z3-offload-param", {"stage": 3, "offload_param": offload}, [])
        check(sorted(host) == sorted(device) == list(range(1, STEPS + 1)), f"both runs print every step ({sorted(host)})")
        for what, named in (("loss", "losses"), ("grad_norm", "gradient norms")):
            worst, ok = close(host, device, what)
            check(ok, f"offload_param: the {named} of the run without it (worst relative difference {worst:.2e})")
        check(host[STEPS]["loss"] < host[1]["loss"], f"offload_param: the loss falls ({host[1]['loss']:.3f} -> "
                                                       f"{host[STEPS]['loss']:.3f})")
        check(device_peak is not None and host_peak is not None and host_peak < device_peak,
              f"offload_param: the device holds less (peak {host_peak} MiB against {device_peak} MiB)")
        plugins = ["cpu"] if os.path.exists(cpu_plugin) else []
        both, _ = run(bin_dir, work, "z3-offload-both",
                      {"stage": 3, "offload_param": offload, "offload_optimizer": offload}, plugins)
        for what, named in (("loss", "losses"), ("grad_norm", "gradient norms")):
            worst, ok = close(both, device, what)
            check(ok, f"offload_param with offload_optimizer: the {named} of the run without either "
                      f"(worst relative difference {worst:.2e})")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return exit_code()


if __name__ == "__main__":
    sys.exit(main())
