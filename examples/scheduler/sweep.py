"""A learning-rate sweep, as a scheduler would run it with Loom's Python client: one train job per
learning rate, from one spec file, submitted together; waits for all of them and prints each
one's final and lowest loss.

  pip install ./client/python
  python3 examples/scheduler/sweep.py examples/jobs/train-llama.json --lr 1e-3 3e-3 1e-2 \
      [--server 127.0.0.1:7450] [--steps 100]

The planner places the jobs as its nodes' slots allow; the others wait (their reason says why).
The credentials come from the environment, as loomctl's do: LOOM_TOKEN_FILE (a planner without
--tokens writes an admin's into STATE_DIR/admin.token), and LOOM_CA, LOOM_CERT, LOOM_KEY for TLS.
"""
import argparse
import json
import os
import sys

import loom


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("spec", help="a train job's spec file")
    parser.add_argument("--lr", type=float, nargs="+", required=True, help="the learning rates to try")
    parser.add_argument("--steps", type=int, help="train.steps of every job (default: the spec's)")
    parser.add_argument("--server", default=os.environ.get("LOOM_SERVER", "127.0.0.1:7450"))
    parser.add_argument("--timeout", type=float, default=3600, help="seconds to wait for the whole sweep")
    args = parser.parse_args()

    with open(args.spec) as f:
        base = json.load(f)
    with loom.Client(args.server) as client:
        jobs = {}
        for lr in args.lr:
            spec = json.loads(json.dumps(base))
            spec["name"] = f"{base['name']}-lr{lr:g}"
            spec.setdefault("deepspeed", {}).setdefault("optimizer", {}).setdefault("params", {})["lr"] = lr
            if args.steps:
                spec.setdefault("train", {})["steps"] = args.steps
            # Written beside the original, so that its relative paths still hold.
            path = os.path.join(os.path.dirname(os.path.abspath(args.spec)), f".sweep-{spec['name']}.json")
            with open(path, "w") as f:
                json.dump(spec, f)
            try:
                job = client.submit(path, request_id=f"sweep-{spec['name']}")
            finally:
                os.remove(path)
            jobs[lr] = job.id
            print(f"lr {lr:g}: job {job.id}", flush=True)

        failed = 0
        print(f"{'lr':>10}  {'job':<32} {'state':<10} {'final loss':>10} {'lowest':>10}")
        for lr, job_id in jobs.items():
            job = client.wait(job_id, timeout=args.timeout)
            losses = [m.value for m in client.metrics(job_id, names=["loss"], ranks=[0])]
            final = f"{losses[-1]:.4f}" if losses else "-"
            lowest = f"{min(losses):.4f}" if losses else "-"
            print(f"{lr:>10g}  {job_id:<32} {loom.state_name(job):<10} {final:>10} {lowest:>10}")
            failed += loom.state_name(job) != "SUCCEEDED"
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
