"""Checkpoints that survive damage, end to end through `loomctl run` (a real loomd, a real rank):

1. train.keep_checkpoints 2 keeps the two newest complete checkpoints (every 2 steps of 8: 6 and
   8 stay).
2. A job stopped at step 6 whose newest checkpoint has a corrupt weights file, or a truncated
   manifest, resumes from step 4, saying which file it refused (in its log and as an event of the
   job's), and ends with the uninterrupted
   run's weights; with both checkpoints damaged it fails with DATA_LOSS naming each.
3. A disk that fills (a tmpfs the size of one and a half checkpoints): the next checkpoint is
   refused before anything is written, naming the directory and the bytes it needs, and the
   previous one stays `latest` with no partial directory left (skipped, saying so, where the
   machine does not let the test mount a tmpfs).
4. A disk that fills while a checkpoint is written (a file-size limit on the rank stops the
   weights' write half way): the attempt fails naming the directory, the file and the bytes needed, and the
   previous checkpoint stays `latest` with nothing of the new one left.

  python3 tests/oracles/checkpoint_damage_test.py --bin build/bin
"""
import glob
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from loom_runs import oracle_args  # noqa: E402

import torch  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

import parity_test  # noqa: E402
from parity_test import ControlPlane, check, loom_run  # noqa: E402

SEQ = 16


def train_spec(data, model_dir, name, checkpoints, steps, keep=2):
    return {"name": name, "kind": "train", "resources": {"ranks": 1},
            "model": {"config": model_dir + "/config.json", "weights": model_dir},
            "data": {"train": data, "seq_len": SEQ, "seed": 2},
            "train": {"steps": steps, "checkpoint_dir": checkpoints, "checkpoint_every": 2, "keep_checkpoints": keep},
            "deepspeed": {"train_batch_size": 4, "gradient_clipping": 1.0, "steps_per_print": 1,
                          "optimizer": {"type": "AdamW", "params": {"lr": 2e-3, "weight_decay": 0.01}}}}


def tags(checkpoints):
    return sorted(n for n in os.listdir(checkpoints) if n.startswith("global_step") or n.startswith("."))


def corrupt(path):
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) // 2)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0xFF]))


def weights(checkpoints, step):
    return load_file(os.path.join(checkpoints, f"global_step{step}", "model.safetensors"))


def job_events(state_dir):
    """The reasons of every event the planner stored under a `loomctl run --state-dir`."""
    db = sqlite3.connect(os.path.join(state_dir, "planner", "planner.db"))
    try:
        return [row[0] for row in db.execute("SELECT reason FROM events ORDER BY seq")]
    finally:
        db.close()


def same_weights(a, b):
    return set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)


def main():
    bin_dir = oracle_args(__doc__).bin
    work = tempfile.mkdtemp(prefix="loom-damage-")
    mounted = plane = None
    try:
        data, model_dir = parity_test.licence_tokens_and_model(bin_dir, work, "damage", seed=4)

        def run(spec, expect_failure=False):
            return loom_run(bin_dir, spec, work, spec["name"], expect_failure=expect_failure)

        whole = os.path.join(work, "uninterrupted")
        run(train_spec(data, model_dir, "uninterrupted", whole, 8))
        check(tags(whole) == ["global_step6", "global_step8"],
              f"keep_checkpoints 2: the checkpoints left are {tags(whole)}")
        reference = weights(whole, 8)

        for damage in ("corrupt-weights", "truncated-manifest"):
            checkpoints = os.path.join(work, damage)
            run(train_spec(data, model_dir, damage + "-first", checkpoints, 6))
            newest = os.path.join(checkpoints, "global_step6")
            if damage == "corrupt-weights":
                corrupt(os.path.join(newest, "model.safetensors"))
                named = os.path.join(newest, "model.safetensors") + ": CRC-32 does not match the manifest"
            else:
                with open(os.path.join(newest, "manifest.json"), "r+") as f:
                    f.truncate(os.path.getsize(os.path.join(newest, "manifest.json")) // 2)
                named = os.path.join(newest, "manifest.json") + ": not a checkpoint manifest"
            log = run(train_spec(data, model_dir, damage + "-resumed", checkpoints, 8))
            check(f"checkpoint refused, an older one is used: {checkpoints}/global_step6: " in log and named in log,
                  f"{damage}: the refused checkpoint is named with its file")
            check(f"resumed from {checkpoints}/global_step4 at step 4" in log, f"{damage}: resumed at step 4")
            events = job_events(os.path.join(work, damage + "-resumed-state"))
            check(any(e.startswith(f"rank 0: checkpoint refused, an older one is used: {checkpoints}/global_step6: ")
                      and named in e for e in events),
                  f"{damage}: the refusal is an event of the job's too")
            check(same_weights(weights(checkpoints, 8), reference),
                  f"{damage}: the final weights equal the uninterrupted run's")

        checkpoints = os.path.join(work, "all-damaged")
        run(train_spec(data, model_dir, "all-damaged-first", checkpoints, 6))
        for step in (4, 6):
            corrupt(os.path.join(checkpoints, f"global_step{step}", "model.safetensors"))
        failed = run(train_spec(data, model_dir, "all-damaged-resumed", checkpoints, 8), expect_failure=True)
        check("DATA_LOSS" in failed and "no checkpoint is whole (2 tried)" in failed and
              "global_step4/model.safetensors" in failed and "global_step6/model.safetensors" in failed,
              "with every checkpoint damaged the job fails with DATA_LOSS naming each")

        # A disk that fills while the checkpoint is written: the check before it passes, the
        # weights' write fails half way. A file-size limit on the rank alone (a worker wrapped in
        # prlimit, under a loomd of its own) stops it there; the planner's database is not limited.
        checkpoints = os.path.join(work, "fills-while-written")
        run(train_spec(data, model_dir, "fills-first", checkpoints, 2))
        limit = os.path.getsize(os.path.join(checkpoints, "global_step2", "model.safetensors")) // 2
        limited = os.path.join(work, "limited-worker")
        with open(limited, "w") as f:
            f.write(f'#!/bin/sh\nexec prlimit --fsize={limit} -- {os.path.join(bin_dir, "loom-worker")} "$@"\n')
        os.chmod(limited, 0o755)
        plane_dir = os.path.join(work, "fills-plane")
        os.makedirs(plane_dir)
        plane = ControlPlane(bin_dir, plane_dir, worker=limited)
        job = plane.submit(train_spec(data, model_dir, "fills-resumed", checkpoints, 4))
        plane.ctl("wait", job, "--timeout", "300", timeout=320)
        reason = json.loads(plane.ctl("get", job, "-o", "json").stdout).get("reason", "")
        logs = glob.glob(os.path.join(plane_dir, "state", "jobs", job, "attempt-*", "rank-0.log"))
        failed = reason + "".join(open(log).read() for log in logs)
        check("RESOURCE_EXHAUSTED" in failed and
              f"checkpoint global_step4: {checkpoints} ran out of room while it was written" in failed and
              "model.safetensors" in failed and "the checkpoint needs about" in failed,
              "a disk that fills mid-write: the attempt fails naming the directory, the file and the bytes needed")
        latest = open(os.path.join(checkpoints, "latest")).read().strip()
        check(latest == "global_step2" and tags(checkpoints) == ["global_step2"],
              f"a disk that fills mid-write: `latest` still names {latest}, and {tags(checkpoints)} is all that is there")

        # A disk that fills: room for the first checkpoint, not for the second beside it.
        size = sum(os.path.getsize(os.path.join(whole, "global_step8", n))
                   for n in os.listdir(os.path.join(whole, "global_step8")))
        mounted = os.path.join(work, "small-disk")
        os.makedirs(mounted)
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size * 3 // 2}", "tmpfs", mounted],
                           capture_output=True, text=True)
        if r.returncode != 0:
            print(f"skipped: the disk-full case (mount -t tmpfs: {r.stderr.strip()})")
            mounted = None
        else:
            full = os.path.join(mounted, "checkpoints")
            failed = run(train_spec(data, model_dir, "disk-full", full, 4), expect_failure=True)
            check("RESOURCE_EXHAUSTED" in failed and f"checkpoint global_step4: {full} has " in failed and
                  "the checkpoint needs about" in failed,
                  "a full disk: the checkpoint is refused naming the directory and the bytes it needs")
            latest = open(os.path.join(full, "latest")).read().strip()
            check(latest == "global_step2" and tags(full) == ["global_step2"],
                  f"a full disk: `latest` still names {latest}, and {tags(full)} is all that is there")
    finally:
        if plane:
            plane.close()
        if mounted:
            subprocess.run(["umount", mounted], check=False)
        shutil.rmtree(work, ignore_errors=True)
    return parity_test.exit_code()


if __name__ == "__main__":
    sys.exit(main())
