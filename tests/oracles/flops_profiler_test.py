"""DeepSpeed's flops profiler: the same DeepSpeed config (flops_profiler enabled at profile_step 2,
top_modules 2, detailed, an output_file) given to DeepSpeed 0.19.8's engine on CPU and to a Loom
train job, for a llama and a qwen2 with tied embeddings and q/k/v biases.

1. The reports are the same text but for what is measured: latencies, FLOPS rates and the
   samples/second (DeepSpeed's own top-level latency is not even sane: its engine re-registers the
   hooks at every forward). The step, the summary's labels and counts (world size, sizes, params,
   MACs, flops), the aggregated profile's params and MACs, and the detailed tree (every module's
   name, class, params, MACs, percentages of both, and torch's extra repr) are equal.
   For mixtral, qwen2_moe (a shared expert, a dense layer) and deepseek_v3 (latent attention) the
   tree, params and every module's MACs are DeepSpeed's but for the experts: transformers 5 runs
   them as one fused module whose grouped matmuls DeepSpeed does not count (0 MACs); Loom counts
   the routed tokens' F.linear MACs, tokens x top-k x 3 x hidden x moe_intermediate, and its
   ancestors' sums grow by as much.
2. Loom's latencies are measured: every module of the forward took time, and the forward's
   latency in the summary is at least the top module's.
3. A relative output_file lies under the spec's directory; an unknown key in flops_profiler is
   refused, naming it.

  python3 tests/oracles/flops_profiler_test.py --bin build/bin
"""
import json
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from loom_runs import check, exit_code, loom_run, oracle_args  # noqa: E402
from parity_test import save_model  # noqa: E402
from make_tiny_model import MOE_FAMILIES  # noqa: E402

SEQ = 32
MEASURED = re.compile(r"-?[\d.]+(e-?\d+)? [TGMKmu]?s = -?[\d.]+% latency, [\d.e-]+ [TGMKmu]?FLOPS")


def ds_config(output_file):
    return {"train_batch_size": 4, "train_micro_batch_size_per_gpu": 2, "steps_per_print": 100,
            "optimizer": {"type": "AdamW", "params": {"lr": 2e-3, "torch_adam": True}},
            "flops_profiler": {"enabled": True, "profile_step": 2, "module_depth": -1, "top_modules": 2,
                               "detailed": True, "output_file": output_file}}


def sections(text):
    """(step, summary {label: value}, aggregated lines, detailed tree lines)."""
    step = int(re.search(r"Profile Summary at step (\d+):", text).group(1))
    summary = {}
    for line in text.split("\n\n")[1].splitlines():
        if line.strip():
            label, value = line[:72], line[72:]
            summary[label.strip()] = value.strip()
    aggregated = text.split("Aggregated Profile per GPU -----------------------------\n")[1].split("\n\n")[0]
    tree = text[text.index("fwd latency shown above which is captured in DeepSpeed.\n\n"):].splitlines()[2:]
    return step, summary, aggregated.splitlines(), tree


def unmeasured(lines):
    """The lines with every measured value (latency, its percentage, FLOPS) blanked."""
    out = []
    for line in lines:
        if line.strip().startswith("fwd latency - "):  # which modules took longest is measured too
            line = f"    fwd latency - {line.count(':')} modules"
        out.append(MEASURED.sub("LATENCY", line))
    return out


MACS = re.compile(r"([\d.]+ [KMGT]?)MACs = [\d.]+% MACs")


def compare_moe(family, ds_text, loom_text, expert_macs):
    _, _, _, ds_tree = sections(ds_text)
    _, _, _, tree = sections(loom_text)
    ours, theirs = unmeasured(tree), unmeasured(ds_tree)
    no_macs = lambda line: MACS.sub("MACS", line)  # noqa: E731
    check(len(ours) == len(theirs) and all(no_macs(a) == no_macs(b) for a, b in zip(ours, theirs)),
          f"{family}: the detailed tree (names, classes, params, extra repr) is DeepSpeed's" +
          "".join(f"\n  L {a}\n  D {b}" for a, b in zip(ours, theirs) if no_macs(a) != no_macs(b))[:3000])
    # Each module's MACs: DeepSpeed's, but for the experts (0 there) and the modules above them.
    experts = [i for i, line in enumerate(theirs) if re.search(r"\(experts\): \w+Experts\(", line)]
    check(experts and all(MACS.search(theirs[i + 1]).group(1) == "0 " for i in experts),
          f"{family}: DeepSpeed counts 0 MACs in the fused experts ({len(experts)} MoE layers)")
    check(all(MACS.search(ours[i + 1]).group(1) == expert_macs for i in experts),
          f"{family}: Loom counts the routed tokens' MACs there ({expert_macs}MACs per layer: "
          f"{[MACS.search(ours[i + 1]).group(1) for i in experts]})")
    indent = lambda line: len(line) - len(line.lstrip())  # noqa: E731
    above = set()
    for i in experts:
        for j in range(i - 1, -1, -1):
            if indent(theirs[j]) < indent(theirs[i]) and "(" in theirs[j]:
                above.add(j)
                above.add(j + 1)  # a container's numbers are on its next line
    leaves = [(a, b) for i, (a, b) in enumerate(zip(ours, theirs))
              if MACS.search(b) and i not in above and not any(i in (e, e + 1) for e in experts)]
    apart = [(a, b) for a, b in leaves if MACS.search(a).group(1) != MACS.search(b).group(1)]
    check(leaves and not apart, f"{family}: every other module's MACs are DeepSpeed's ({len(leaves)} modules)" +
          "".join(f"\n  L {a}\n  D {b}" for a, b in apart)[:2000])


def compare(family, ds_text, loom_text):
    ds_step, ds_summary, ds_agg, ds_tree = sections(ds_text)
    step, summary, agg, tree = sections(loom_text)
    check(step == ds_step, f"{family}: the profile's step is DeepSpeed's ({step} vs {ds_step})")
    check(list(summary) == list(ds_summary), f"{family}: the summary's {len(summary)} lines are DeepSpeed's" +
          ("" if list(summary) == list(ds_summary) else f":\n  {list(summary)}\n  {list(ds_summary)}"))
    counted = [k for k in ds_summary if "latency" not in k and "FLOPS" not in k and "samples" not in k]
    apart = {k: (summary.get(k), ds_summary[k]) for k in counted if summary.get(k) != ds_summary[k]}
    check(not apart, f"{family}: world, batch, params, MACs and flops in the summary equal DeepSpeed's {apart}")
    check(unmeasured(agg) == unmeasured(ds_agg),
          f"{family}: the aggregated profile's params and MACs equal DeepSpeed's" +
          "".join("\n" + f"  L {a}\n  D {b}" for a, b in zip(unmeasured(agg), unmeasured(ds_agg)) if a != b))
    ours, theirs = unmeasured(tree), unmeasured(ds_tree)
    check(ours == theirs, f"{family}: the detailed tree of {len(ours)} lines (names, classes, params, MACs, extra "
          "repr) is DeepSpeed's" + "\n".join(f"  L {a}\n  D {b}" for a, b in zip(ours, theirs) if a != b)[:3000])
    # Loom's own latencies: each module of the forward measured, the forward at least the root.
    latencies = re.findall(r"([\d.]+) ([TGMKmu]?)s = [\d.]+% latency", "\n".join(tree))
    scale = {"": 1, "m": 1e-3, "u": 1e-6, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
    seconds = [float(v) * scale[u] for v, u in latencies]
    check(seconds and all(0 < s < 60 for s in seconds),
          f"{family}: every module's latency is measured and sane ({len(seconds)} modules, {min(seconds):.2g} "
          f"to {max(seconds):.2g} s)")
    fwd = re.match(r"([\d.]+) ([TGMKmu]?)s", summary["fwd latency:"])
    check(float(fwd.group(1)) * scale[fwd.group(2)] >= seconds[0] * 0.99,
          f"{family}: the step's forward latency ({summary['fwd latency:']}) holds the top module's")


def number(n):
    """DeepSpeed's number_to_string of a count: 786432 -> '786.43 K'."""
    for magnitude, units in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "K")):
        if n >= magnitude:
            return f"{round(n / magnitude, 2):g} {units}"
    return f"{n:g} "


def run_both(bin_dir, work, data, family, model_dir):
    """DeepSpeed's and Loom's reports for 3 steps of the model, profiled at step 2: their paths."""
    ds_report = os.path.join(work, f"deepspeed-{family}.txt")
    ds_path = os.path.join(work, f"ds-{family}.json")
    with open(ds_path, "w") as f:
        json.dump(ds_config(ds_report), f)
    subprocess.run([sys.executable, os.path.join(HERE, "deepspeed_train.py"), "--model", model_dir,
                    "--data", data, "--seq-len", str(SEQ), "--data-seed", "5", "--steps", "3",
                    "--ds-config", ds_path, "--world", "1", "--out", os.path.join(work, f"ds-{family}.jsonl")],
                   check=True, capture_output=True, text=True, timeout=300)
    specs = os.path.join(work, f"specs-{family}")
    os.makedirs(specs)
    spec = {"name": f"flops-{family}", "kind": "train", "resources": {"ranks": 1},
            "model": {"config": model_dir + "/config.json", "weights": model_dir},
            "data": {"train": data, "seq_len": SEQ, "seed": 5},
            "train": {"steps": 3},
            "deepspeed": ds_config("profiles/flops.txt")}
    loom_run(bin_dir, spec, specs, f"flops-{family}")
    loom_report = os.path.join(specs, "profiles", "flops.txt")
    check(os.path.exists(loom_report), f"{family}: the relative output_file lies under the spec's directory")
    return ds_report, loom_report


def main():
    bin_dir = oracle_args(__doc__).bin
    with tempfile.TemporaryDirectory() as work:
        data = os.path.join(work, "gpl.tokens")
        subprocess.run([os.path.join(bin_dir, "loomctl"), "data", "prepare", "/usr/share/common-licenses/GPL-3",
                        "--output", data], check=True, capture_output=True)
        for family, options in [("llama", {}), ("qwen2", {"tie": True})]:
            model_dir = os.path.join(work, family)
            save_model(family, model_dir, seed=4, **options)
            ds_report, loom_report = run_both(bin_dir, work, data, family, model_dir)
            compare(family, open(ds_report).read(), open(loom_report).read())

        # MoE families: the same but for the fused experts' MACs (2 samples x 32 tokens, top-2).
        for family in ("mixtral", "qwen2_moe", "deepseek_v3"):
            model_dir = os.path.join(work, family)
            subprocess.run([sys.executable, os.path.join(HERE, "make_tiny_model.py"), "--family", family, "--out",
                            model_dir, "--seed", "4"], check=True, capture_output=True)
            with open(os.path.join(model_dir, "config.json")) as f:
                config = json.load(f)
            inner = config.get("moe_intermediate_size") or config["intermediate_size"]
            macs = 2 * SEQ * config["num_experts_per_tok"] * 3 * config["hidden_size"] * inner
            ds_report, loom_report = run_both(bin_dir, work, data, family, model_dir)
            compare_moe(family, open(ds_report).read(), open(loom_report).read(), number(macs))

        # Bad input: an unknown key of the section, named.
        spec = json.load(open(os.path.join(work, "specs-llama", "flops-llama.json")))
        spec["deepspeed"]["flops_profiler"]["profile_stpe"] = 3
        out = loom_run(bin_dir, spec, work, "flops-bad", expect_failure=True)
        check("deepspeed.flops_profiler.profile_stpe" in out,
              f"an unknown flops_profiler key is refused, naming it: {out.strip()[-300:]}")
    return exit_code()


if __name__ == "__main__":
    sys.exit(main())
