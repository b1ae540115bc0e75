"""Preemption, end to end on a real control plane (`loomd --standalone`, two CPU ranks):

1. SIGTERM to every rank of a train job (ZeRO 1, data parallel 2) mid-run: the ranks agree on the
   step to stop after, write its checkpoint and exit as preempted; attempt 2 resumes from that
   checkpoint without using a restart (max_restarts is 0), and the final weights equal an
   uninterrupted run's (with train.resume_optimizer false, which leaves out the optimizer state of
   other jobs' checkpoints only).
2. SIGTERM to one rank only: the other learns of it at the end of the step, both stop there.
3. restart.on_preemption false: the preemption fails the job, naming it, the checkpoint written.

  python3 tests/oracles/preemption_test.py --bin build/bin
"""
import glob
import json
import os
import shutil
import signal
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from loom_runs import oracle_args  # noqa: E402

from checkpoint_damage_test import same_weights, weights  # noqa: E402
import parity_test  # noqa: E402
from parity_test import ControlPlane, check, exit_code, loom_run  # noqa: E402

STEPS = 200


def train_spec(data, model_dir, name, checkpoints, **restart):
    return {"name": name, "kind": "train", "resources": {"ranks": 2},
            "model": {"config": model_dir + "/config.json", "weights": model_dir},
            "data": {"train": data, "seq_len": 16, "seed": 2},
            # The job's own checkpoint resumes whole even so: the weights match only with Adam's moments.
            "train": {"steps": STEPS, "checkpoint_dir": checkpoints, "checkpoint_every": 100,
                      "resume_optimizer": False},
            "restart": {"max_restarts": 0, **restart},
            "timeouts": {"grace_period_s": 60},
            "deepspeed": {"train_batch_size": 4, "gradient_clipping": 1.0, "steps_per_print": 1,
                          "zero_optimization": {"stage": 1},
                          "optimizer": {"type": "AdamW", "params": {"lr": 2e-3, "weight_decay": 0.01}}}}


def get(plane, job):
    r = plane.ctl("get", job, "-o", "json")
    if r.returncode != 0:
        raise RuntimeError(f"loomctl get {job}: {r.stderr}")
    return json.loads(r.stdout)


def preempt_when_running(plane, job, ranks, min_step=3):
    """SIGTERM to `ranks` of the job's first attempt once its ranks have reported min_step; the
    step rank 0 had reached."""
    deadline = time.time() + 120
    while time.time() < deadline:
        j = get(plane, job)
        rs = j.get("ranks", [])
        if len(rs) == 2 and all(int(r.get("step", 0)) >= min_step for r in rs):
            for r in ranks:
                os.kill(int(rs[r]["pid"]), signal.SIGTERM)
            return int(rs[0]["step"])
        time.sleep(0.02)
    raise RuntimeError(f"job {job} never reached step {min_step}")


def attempt_log(work, job, attempt):
    logs = glob.glob(os.path.join(work, "state", "jobs", job + "*", f"attempt-{attempt}", "rank-0.log"))
    return open(logs[0]).read() if logs else ""


def stopped_step(log):
    """The step after which `SIGTERM: preempted after step N; ...` says the ranks stopped."""
    for line in log.splitlines():
        if line.startswith("SIGTERM: preempted after step "):
            return int(line.split("step ")[1].split(";")[0])
    return None


def main():
    bin_dir = oracle_args(__doc__).bin
    work = tempfile.mkdtemp(prefix="loom-preemption-")
    plane = None
    try:
        data, model_dir = parity_test.licence_tokens_and_model(bin_dir, work, "preempt", seed=6)
        whole = os.path.join(work, "uninterrupted")
        loom_run(bin_dir, train_spec(data, model_dir, "uninterrupted", whole), work, "uninterrupted")
        reference = weights(whole, STEPS)

        plane = ControlPlane(bin_dir, work)
        for case, ranks in (("every rank", [0, 1]), ("one rank", [1])):
            name = "preempted-" + case.replace(" ", "-")
            checkpoints = os.path.join(work, name)
            job = plane.submit(train_spec(data, model_dir, name, checkpoints))
            seen = preempt_when_running(plane, job, ranks)
            w = plane.ctl("wait", job, "--timeout", "300", timeout=320)
            j = get(plane, job)
            check(w.returncode == 0 and j["state"] == "SUCCEEDED",
                  f"SIGTERM to {case}: the job succeeds ({j['state']}: {j['reason']})")
            first, second = attempt_log(work, job, 1), attempt_log(work, job, 2)
            step = stopped_step(first)
            check(step is not None and step >= seen and f"checkpoint {checkpoints}/global_step{step}" in first,
                  f"SIGTERM to {case} at step {seen}: the ranks stopped after step {step} and wrote its checkpoint")
            check(f"resumed from {checkpoints}/global_step{step} at step {step}" in second,
                  f"attempt 2 resumes from global_step{step}")
            check(int(j.get("attempt", 0)) == 2 and int(j.get("restarts", 0)) == 0 and
                  int(j.get("preemptions", 0)) == 1,
                  f"one preemption, no restart used (attempt {j.get('attempt')}, restarts {j.get('restarts', 0)}, "
                  f"preemptions {j.get('preemptions', 0)})")
            check(same_weights(weights(checkpoints, STEPS), reference),
                  f"SIGTERM to {case}: the final weights equal the uninterrupted run's")

        name = "preempted-no-restart"
        checkpoints = os.path.join(work, name)
        job = plane.submit(train_spec(data, model_dir, name, checkpoints, on_preemption=False))
        preempt_when_running(plane, job, [0, 1])
        plane.ctl("wait", job, "--timeout", "300", timeout=320)
        j = get(plane, job)
        step = stopped_step(attempt_log(work, job, 1))
        check(j["state"] == "FAILED" and "preempted (restart.on_preemption is false)" in j["reason"] and
              "preempted: stopped after SIGTERM" in j["reason"],
              f"restart.on_preemption false: the job fails, naming the preemption ({j['reason']})")
        check(step is not None and os.path.isdir(os.path.join(checkpoints, f"global_step{step}")),
              f"... and its checkpoint at step {step} is written")
    finally:
        if plane:
            plane.close()
        shutil.rmtree(work, ignore_errors=True)
    return exit_code()


if __name__ == "__main__":
    sys.exit(main())
