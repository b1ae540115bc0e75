"""DeepSpeed's monitors and wall_clock_breakdown: the same DeepSpeed config (tensorboard, csv_monitor
and wandb enabled, wall_clock_breakdown on, a warm-up schedule so that the lr moves every step)
given to DeepSpeed 0.19.8's engine on CPU (wandb in offline mode) and to a Loom train job of 2 ranks.

1. csv_monitor: every file DeepSpeed writes (output_path/job_name/Train_Samples_lr.csv and the
   timers' Train_Samples_elapsed_time_ms_*.csv), Loom writes too, with the same header and the
   same samples; the lr's rows in the same text.
2. tensorboard: the `tensorboard` package's EventAccumulator reads Loom's event file: the lr
   scalars equal DeepSpeed's event file's, the loss scalars Loom's step lines; eval_loss at the
   evaluation steps.
3. wall_clock_breakdown: rank 0's log has DeepSpeed's timer lines, the same names in the same
   order, one per micro-batch and one per step.
4. wandb: wandb's own reader (its DataStore, its wandb_internal protos) reads Loom's offline run:
   the run's project and group, a history row per step with DeepSpeed's keys at DeepSpeed's steps,
   the lr equal to DeepSpeed's own offline run's, the loss to the step lines; the summary and exit
   code 0. `wandb sync --view` (wandb's CLI, no server) reads it whole.
5. A relative output_path and wandb's default dir lie under the spec's directory; a job_name with
   '/' is refused, naming the key.

  python3 tests/oracles/monitors_test.py --bin build/bin
"""
import glob
import json
import os
import subprocess
import sys
import tempfile

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from loom_runs import check, exit_code, loom_run, oracle_args, step_lines  # noqa: E402
from parity_test import licence_tokens_and_model  # noqa: E402

STEPS, SEQ = 6, 32


def ds_config(output_path):
    return {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2, "gradient_clipping": 1.0,
            "steps_per_print": 1, "wall_clock_breakdown": True,
            "optimizer": {"type": "AdamW", "params": {"lr": 2e-3, "weight_decay": 0.01, "torch_adam": True}},
            "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 2e-3,
                                                         "warmup_num_steps": 4, "warmup_type": "linear"}},
            "tensorboard": {"enabled": True, "output_path": output_path, "job_name": "monitors"},
            "csv_monitor": {"enabled": True, "output_path": output_path, "job_name": "monitors"},
            "wandb": {"enabled": True, "project": "loom-monitors", "group": "oracle"}}


def scalars(directory):
    files = glob.glob(os.path.join(directory, "events.out.tfevents.*"))
    check(len(files) == 1, f"one TensorBoard event file in {directory} ({len(files)})")
    acc = EventAccumulator(directory)
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def wandb_run(directory):
    """The one offline run under directory/wandb, read with wandb's own DataStore and protos:
    (run record, {step: {key: value}}, summary {key: value}, exit code)."""
    from wandb.proto import wandb_internal_pb2
    from wandb.sdk.internal import datastore
    runs = glob.glob(os.path.join(directory, "wandb", "offline-run-*"))
    check(len(runs) == 1, f"one offline run in {directory}/wandb ({runs})")
    logs = glob.glob(os.path.join(runs[0], "run-*.wandb"))
    check(len(logs) == 1 and os.path.isdir(os.path.join(runs[0], "files")), f"run-ID.wandb and files/ in {runs[0]}")
    store = datastore.DataStore()
    store.open_for_scan(logs[0])
    run, rows, summary, exit_code = None, {}, {}, None
    while (data := store.scan_data()) is not None:
        record = wandb_internal_pb2.Record()
        record.ParseFromString(data)
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run = record.run
        elif kind == "history":
            row = {(item.key or "/".join(item.nested_key)): json.loads(item.value_json) for item in record.history.item}
            rows[row.pop("_step")] = {k: v for k, v in row.items() if not k.startswith("_")}
        elif kind == "summary":
            summary.update({(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in record.summary.update})
        elif kind == "exit":
            exit_code = record.exit.exit_code
    store.close()
    return runs[0], run, rows, summary, exit_code


def main():
    bin_dir = oracle_args(__doc__).bin
    with tempfile.TemporaryDirectory() as work:
        data, model_dir = licence_tokens_and_model(bin_dir, work, "monitors", seed=4)

        ds_out = os.path.join(work, "deepspeed-monitors")
        ds_path = os.path.join(work, "ds.json")
        with open(ds_path, "w") as f:
            json.dump(ds_config(ds_out), f)
        ds_run = subprocess.run([sys.executable, os.path.join(HERE, "deepspeed_train.py"), "--model", model_dir,
                                 "--data", data, "--seq-len", str(SEQ), "--data-seed", "5", "--steps", str(STEPS),
                                 "--ds-config", ds_path, "--world", "1", "--out", os.path.join(work, "deepspeed.jsonl")],
                                check=True, capture_output=True, text=True, timeout=300,
                                env=dict(os.environ, WANDB_MODE="offline", WANDB_DIR=ds_out, WANDB_SILENT="true"))

        # The spec's relative output_path: under the spec's directory (work/specs/).
        specs = os.path.join(work, "specs")
        os.makedirs(specs)
        spec = {"name": "monitors", "kind": "train", "resources": {"ranks": 2},
                "model": {"config": model_dir + "/config.json", "weights": model_dir},
                "data": {"train": data, "eval": data, "seq_len": SEQ, "seed": 5},
                "train": {"steps": STEPS, "eval_every": 3, "eval_batches": 2},
                "deepspeed": ds_config("loom-monitors")}
        log = loom_run(bin_dir, spec, specs, "monitors")
        loom_out = os.path.join(specs, "loom-monitors")

        # 1. csv_monitor, file by file.
        ds_files = sorted(os.listdir(os.path.join(ds_out, "monitors")))
        ds_csv = [f for f in ds_files if f.endswith(".csv")]
        loom_csv = sorted(f for f in os.listdir(os.path.join(loom_out, "monitors")) if f.endswith(".csv"))
        check(ds_csv and set(ds_csv) <= set(loom_csv), f"Loom writes every CSV DeepSpeed writes ({ds_csv} in {loom_csv})")
        check("Train_Samples_elapsed_time_ms_step.csv" in ds_csv, "DeepSpeed wrote its timers' files too")
        for name in ds_csv:
            theirs = open(os.path.join(ds_out, "monitors", name), "rb").read()
            ours = open(os.path.join(loom_out, "monitors", name), "rb").read()
            if "elapsed_time" in name:  # times differ; the header and the samples column do not
                column = lambda text: [row.split(b",")[0] for row in text.split(b"\r\n")]  # noqa: E731
                check(column(ours) == column(theirs) and ours.split(b"\r\n")[0] == theirs.split(b"\r\n")[0],
                      f"{name}: DeepSpeed's header and samples ({ours[:60]!r} vs {theirs[:60]!r})")
            else:
                check(ours == theirs, f"{name}: byte for byte DeepSpeed's\n  DeepSpeed: {theirs!r}\n  Loom:      {ours!r}")
        loss_csv = open(os.path.join(loom_out, "monitors", "Train_Samples_train_loss.csv"), newline="").read()
        check(loss_csv.startswith("step,train_loss\r\n"), "Train_Samples_train_loss.csv's header")

        # 2. tensorboard, through the tensorboard package.
        ds_scalars = scalars(os.path.join(ds_out, "monitors"))
        loom_scalars = scalars(os.path.join(loom_out, "monitors"))
        check(loom_scalars.get("Train/Samples/lr") == ds_scalars.get("Train/Samples/lr"),
              f"TensorBoard lr scalars equal DeepSpeed's ({loom_scalars.get('Train/Samples/lr')} vs "
              f"{ds_scalars.get('Train/Samples/lr')})")
        lines = step_lines(log)
        losses = loom_scalars.get("Train/Samples/train_loss", [])
        check([s for s, _ in losses] == [8 * step for step in range(1, STEPS + 1)],
              f"train_loss at every step's samples ({[s for s, _ in losses]})")
        check(all(abs(v - lines[s // 8]["loss"]) <= 1e-6 * abs(lines[s // 8]["loss"]) for s, v in losses),
              "train_loss scalars equal the step lines' losses (as float32)")
        evals = loom_scalars.get("Train/Samples/eval_loss", [])
        check([s for s, _ in evals] == [24, 48], f"eval_loss at the evaluations' samples ({[s for s, _ in evals]})")

        # 3. The timer lines: DeepSpeed's names in its order, per micro-batch and per step.
        def timer_lines(text):
            return [line for line in text.splitlines() if line.startswith("[Rank 0] time (ms) |")]

        def names(line):
            return [part.split(":")[0].strip() for part in line.split("|")[1:]]

        ds_lines, loom_lines = timer_lines(ds_run.stdout), timer_lines(log)
        ds_micro = [l for l in ds_lines if "fwd_microstep" in l]
        loom_micro = [l for l in loom_lines if "fwd_microstep" in l]
        check(ds_micro and [names(l) for l in loom_micro[:1]] == [names(l) for l in ds_micro[:1]],
              f"micro-batch lines with DeepSpeed's names ({loom_micro[:1]} vs {ds_micro[:1]})")
        check(len(ds_lines) - len(ds_micro) == STEPS and len(loom_lines) - len(loom_micro) == STEPS
              and names(next(l for l in loom_lines if "fwd:" in l)) == names(next(l for l in ds_lines if "fwd:" in l)),
              f"a step line per step, with DeepSpeed's names ({next((l for l in loom_lines if 'fwd:' in l), None)})")
        # 8 samples per step: 4 micro-batches of 2 for DeepSpeed's one rank, 2 per rank for Loom's two.
        check(len(ds_micro) == 4 * STEPS and len(loom_micro) == 2 * STEPS,
              f"a line per micro-batch ({len(loom_micro)} for Loom's 2 ranks, {len(ds_micro)} for DeepSpeed's 1)")

        # 4. wandb: Loom's offline run beside DeepSpeed's own, both through wandb's reader.
        ds_dir, ds_wandb, ds_rows, _, _ = wandb_run(ds_out)
        loom_dir, loom_wandb, loom_rows, loom_summary, loom_exit = wandb_run(specs)
        check(loom_wandb is not None and (loom_wandb.project, loom_wandb.run_group) == ("loom-monitors", "oracle"),
              f"the run record names the project and group ({loom_wandb and loom_wandb.project})")
        check(sorted(loom_rows) == sorted(ds_rows) == [8 * step for step in range(1, STEPS + 1)],
              f"a history row per step at the samples, as DeepSpeed's ({sorted(loom_rows)} vs {sorted(ds_rows)})")
        check(all(set(ds_rows[s]) <= set(loom_rows[s]) for s in ds_rows),
              f"every key DeepSpeed logs at each step ({sorted(ds_rows[8])} in {sorted(loom_rows.get(8, {}))})")
        check(all(loom_rows[s]["Train/Samples/lr"] == ds_rows[s]["Train/Samples/lr"] for s in ds_rows),
              "the lr rows equal DeepSpeed's run's")
        check(all(abs(loom_rows[s]["Train/Samples/train_loss"] - lines[s // 8]["loss"]) <= 1e-6 * lines[s // 8]["loss"]
                  for s in loom_rows),
              f"train_loss rows equal the step lines' losses (to their printed digits: "
              f"{[loom_rows[s]['Train/Samples/train_loss'] for s in sorted(loom_rows)][:2]} vs "
              f"{[lines[s // 8]['loss'] for s in sorted(loom_rows)][:2]})")
        check([s for s in loom_rows if "Train/Samples/eval_loss" in loom_rows[s]] == [24, 48],
              "eval_loss in the evaluations' rows")
        check(loom_exit == 0 and loom_summary.get("Train/Samples/lr") == loom_rows[8 * STEPS]["Train/Samples/lr"]
              and loom_summary.get("_step") == 8 * STEPS,
              f"the summary holds the last values; exit code 0 ({loom_exit}, {loom_summary.get('_step')})")
        # wandb's CLI prints the records of a run without a server (any key; nothing is sent).
        view = subprocess.run([os.path.join(os.path.dirname(sys.executable), "wandb"), "sync", "--view", "--verbose",
                               loom_dir], capture_output=True, text=True, timeout=120,
                              env=dict(os.environ, WANDB_API_KEY="x" * 40, WANDB_BASE_URL="http://127.0.0.1:9",
                                       WANDB_DIR=work))
        check(view.returncode == 0 and view.stdout.count("history {") == len(loom_rows) and "exit {" in view.stdout,
              f"wandb sync --view reads the whole run ({view.returncode}: {(view.stdout + view.stderr)[-200:]})")

        # 5. A job_name naming a directory inside output_path is refused.
        bad = dict(spec, name="bad-monitor")
        bad["deepspeed"] = dict(spec["deepspeed"], csv_monitor={"enabled": True, "job_name": "a/b"})
        out = loom_run(bin_dir, bad, specs, "bad-monitor", expect_failure=True)
        check("deepspeed.csv_monitor.job_name" in out, f"job_name with '/' refused, naming the key ({out.strip()[-200:]})")
    return exit_code()


if __name__ == "__main__":
    sys.exit(main())
