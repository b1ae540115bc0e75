"""Users' own DeepSpeed configs, as they are (examples/deepspeed/, each from the Hugging Face
Trainer's tests or DeepSpeedExamples; examples/deepspeed/README.md says where from), through
`loomctl validate` and `loomctl run --deepspeed FILE --set ...`:

1. Each config is accepted, or refused with every reason at once (the exact lines below).
2. Accepted ones train a few steps on two CPU ranks: the cifar fp16 config as it is; the HF
   Trainer's ZeRO-2 and ZeRO-3 configs with the values the Trainer would fill in (--set), ZeRO-3
   without its parameter offload.

  python3 tests/oracles/deepspeed_configs_test.py --bin build/bin
"""
import glob
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from loom_runs import oracle_args  # noqa: E402

import parity_test  # noqa: E402
from parity_test import check, exit_code, step_lines  # noqa: E402

EXAMPLES = os.path.join(HERE, "..", "..", "examples", "deepspeed")
NOT_A_KEY = "not a key of DeepSpeed 0.19.8's config"
AUTO = "give a value for deepspeed.gradient_accumulation_steps, deepspeed.optimizer.params.betas, " \
       "deepspeed.optimizer.params.eps, deepspeed.optimizer.params.lr, deepspeed.optimizer.params.weight_decay, " \
       "deepspeed.scheduler.params.warmup_max_lr, deepspeed.scheduler.params.warmup_min_lr, " \
       "deepspeed.scheduler.params.warmup_num_steps, deepspeed.train_batch_size, " \
       "deepspeed.train_micro_batch_size_per_gpu"

# What `loomctl validate` says of each config as it is: None (valid), or the lines of its refusal.
EXPECTED = {
    "cifar_ds_config_fp16.json": None,
    "hf_ds_config_zero2.json": [AUTO],
    "hf_ds_config_zero3.json": [AUTO],
    "cifar_ds_config_bf16.json": [
        "6 problems:"] + [f"deepspeed.bf16.{k}: {NOT_A_KEY}" for k in (
            "fp16_master_weights_and_grads", "hysteresis", "initial_scale_power", "loss_scale", "loss_scale_window",
            "min_loss_scale")],
    "bing_bert_lamb_seq128.json": [
        "deepspeed.sparse_attention: removed in DeepSpeed 0.19.8, which refuses it too (sparse attention)"],
}

# What the HF Trainer fills in from its TrainingArguments (their defaults; a learning rate and a
# micro batch of our choosing).
HF_FILLED = ["deepspeed.train_micro_batch_size_per_gpu=2", "deepspeed.optimizer.params.lr=1e-3",
             "deepspeed.optimizer.params.betas=[0.9,0.999]", "deepspeed.optimizer.params.eps=1e-8",
             "deepspeed.optimizer.params.weight_decay=0.0", "deepspeed.scheduler.params.warmup_min_lr=0",
             "deepspeed.scheduler.params.warmup_num_steps=2"]


def loomctl(bin_dir, *args):
    return subprocess.run([os.path.join(bin_dir, "loomctl"), *args], capture_output=True, text=True, timeout=300)


def main():
    bin_dir = oracle_args(__doc__).bin
    work = tempfile.mkdtemp(prefix="loom-ds-configs-")
    try:
        job = os.path.join(EXAMPLES, "train.json")
        configs = sorted(os.path.basename(p) for p in glob.glob(os.path.join(EXAMPLES, "*.json")))
        configs.remove("train.json")
        check(configs == sorted(EXPECTED), f"every config of examples/deepspeed is checked ({configs})")
        for name in configs:
            r = loomctl(bin_dir, "validate", job, "--deepspeed", os.path.join(EXAMPLES, name))
            expected = EXPECTED.get(name)
            if expected is None:
                check(r.returncode == 0, f"{name}: valid as it is ({r.stderr.strip()})")
                continue
            lines = [line.strip() for line in r.stderr.splitlines()]
            missing = [e for e in expected if not any(e in line for line in lines)]
            check(r.returncode == 2 and not missing and len(lines) == len(expected),
                  f"{name}: refused with every reason at once ({r.stderr.strip()[:400]}; missing {missing})")

        data, model_dir = parity_test.licence_tokens_and_model(bin_dir, work, "ds", seed=3)
        small = [f"model.config={model_dir}/config.json", f"data.train={data}", "data.seq_len=16", "train.steps=3"]
        runs = {
            "cifar_ds_config_fp16.json": [],
            "hf_ds_config_zero2.json": HF_FILLED,
            "hf_ds_config_zero3.json": HF_FILLED,
        }
        for name, sets in runs.items():
            state = os.path.join(work, name + "-state")
            args = ["run", job, "--state-dir", state, "--deepspeed", os.path.join(EXAMPLES, name)]
            for s in small + sets:
                args += ["--set", s]
            r = loomctl(bin_dir, *args)
            logs = glob.glob(os.path.join(state, "jobs", "*", "attempt-1", "rank-0.log"))
            steps = step_lines(open(logs[0]).read()) if logs else {}
            # steps_per_print is the config's: rank 0 prints the first step and the last.
            check(r.returncode == 0 and 1 in steps and 3 in steps,
                  f"{name}{' with the Trainer values' if sets else ''}: trains 3 steps on 2 ranks "
                  f"(losses {[round(s['loss'], 3) for s in steps.values()]}; {r.stderr.strip()[-300:]})")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return exit_code()


if __name__ == "__main__":
    sys.exit(main())
