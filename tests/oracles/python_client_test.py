"""Loom's Python client (client/python), installed with pip from the repository (its stubs generated
from proto/ by grpcio-tools as it builds), against a real control plane (`loomd --standalone`):

1. submit a spec file whose paths are relative to it, watch until SUCCEEDED, read its logs and
   every stored metric; the Plan of a train job; the jobs and nodes lists.
2. cancel another, running job: it ends CANCELLED; wait() returns it.
3. errors come back as LoomError with the server's code and words.
4. examples/scheduler/sweep.py runs a sweep of two learning rates to the end.

  python3 tests/oracles/python_client_test.py --bin build/bin
"""
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)

from loom_runs import ControlPlane, check, exit_code, oracle_args, small_llama  # noqa: E402


def install(target):
    """pip install ./client/python into `target` (this environment has grpcio-tools: no download)."""
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                        "--no-build-isolation", "--no-deps", "--target", target, os.path.join(REPO, "client", "python")],
                       capture_output=True, text=True, timeout=300)
    check(r.returncode == 0, f"pip install ./client/python ({r.stderr.strip()[-300:]})")
    stubs = sorted(f for f in os.listdir(os.path.join(target, "loom", "v1")) if f.endswith((".py", ".pyi")))
    check({"job_pb2.py", "job_pb2_grpc.py", "job_pb2.pyi", "node_pb2.py", "plan_pb2.py", "rollout_pb2.py"} <= set(stubs),
          f"the build generated the stubs ({stubs})")
    sys.path.insert(0, target)


def main():
    bin_dir = oracle_args(__doc__).bin
    with tempfile.TemporaryDirectory() as work:
        install(os.path.join(work, "site"))
        import loom

        plane = ControlPlane(bin_dir, work)
        try:
            plane.http_address()  # written once the planner serves
            with loom.Client(plane.server, token_file=plane.token_file()) as client:
                # 1. A spec file with paths relative to it.
                spec = small_llama(bin_dir, work, steps=40, name="from-python")
                jobs_dir = os.path.join(work, "jobs")
                os.makedirs(jobs_dir)
                spec["model"]["config"] = os.path.relpath(spec["model"]["config"], jobs_dir)
                spec["data"]["train"] = spec["data"]["eval"] = os.path.relpath(spec["data"]["train"], jobs_dir)
                path = os.path.join(jobs_dir, "train.json")
                with open(path, "w") as f:
                    json.dump(spec, f)
                check(client.validate(path)["model"]["config"] == os.path.join(work, "small-llama.json"),
                      "validate(path): the spec's relative paths resolved against its file")
                job = client.submit(path, request_id="python-1")
                check(client.submit(path, request_id="python-1").id == job.id, "a retried request_id returns the same job")
                states = [loom.state_name(u.job) for u in client.watch(job.id)]
                check(states[-1] == "SUCCEEDED", f"watch() follows the job to SUCCEEDED ({states[0]} ... {states[-1]})")
                lines = client.logs(job.id, ranks=[0], tail=5)
                check(len(lines) == 5 and all(isinstance(l, loom.LogLine) and l.rank == 0 for l in lines),
                      f"logs(tail=5): rank 0's last 5 lines ({lines[-1].line if lines else ''})")
                losses = client.metrics(job.id, names=["loss"], ranks=[0])
                check([m.step for m in losses] == list(range(1, 41)), f"metrics(): every step's loss ({len(losses)} rows)")
                every = client.metrics(job.id)
                check(len(every) > 200, f"metrics() pages through every stored row ({len(every)})")
                plan = client.plan(job.id)
                check(plan.training and plan.mesh.world == 2 and len(plan.parameters) > 0,
                      f"plan(): the train job's compiled Plan ({len(plan.parameters)} parameters, world {plan.mesh.world})")
                listed = [j.id for j in client.list()]
                check(job.id in listed, "list() has the job")
                check(len(client.list(states=["SUCCEEDED"])) == 1, "list(states=[SUCCEEDED]) filters")
                basic = [j for j in client.list() if j.id == job.id][0]
                full = [j for j in client.list(full=True) if j.id == job.id][0]
                check(basic.spec_json == "" and full.spec_json == client.get(job.id).spec_json,
                      "list() leaves out the spec, list(full=True) has it")
                nodes = client.nodes()
                check(len(nodes) == 1 and nodes[0].connected, "nodes(): the standalone node, connected")

                # 2. Cancel a running job.
                long_job = client.submit(small_llama(bin_dir, work, steps=100000, name="to-cancel"))
                while loom.state_name(client.get(long_job.id)) != "RUNNING":
                    time.sleep(0.05)
                client.cancel(long_job.id, reason="the client test is done")
                final = client.wait(long_job.id, timeout=120)
                check(loom.state_name(final) == "CANCELLED", f"cancel(): the job ends CANCELLED ({final.reason})")

                # 3. Errors.
                for what, call, code, words in [
                        ("get of an unknown job", lambda: client.get("no-such-job"), "NOT_FOUND", "no-such-job"),
                        ("a spec without a name", lambda: client.submit({"kind": "probe"}), "INVALID_ARGUMENT", "name"),
                        ("a missing spec file", lambda: client.submit(os.path.join(work, "nope.json")),
                         "INVALID_ARGUMENT", "nope.json"),
                        ("plan of a probe job", lambda: client.plan(client.submit(
                            {"name": "p", "kind": "probe", "resources": {"ranks": 1}}).id), "NOT_FOUND", "")]:
                    try:
                        call()
                        check(False, f"{what}: no error")
                    except loom.LoomError as e:
                        check(e.code == code and words in e.message, f"{what}: {e.code}: {e.message}")
                try:
                    loom.Client(plane.server, token="not-a-token").list()
                    check(False, "an unknown token: no error")
                except loom.LoomError as e:
                    check(e.code == "UNAUTHENTICATED", f"an unknown token: {e.code}: {e.message}")
                try:
                    loom.Client("127.0.0.1:1", timeout=2).get("x")
                    check(False, "an unreachable planner: no error")
                except loom.LoomError as e:
                    check(e.code in ("UNAVAILABLE", "DEADLINE_EXCEEDED"), f"an unreachable planner: {e.code}")

            # 4. The example scheduler.
            env = dict(os.environ, PYTHONPATH=os.path.join(work, "site"), LOOM_TOKEN_FILE=plane.token_file())
            r = subprocess.run([sys.executable, os.path.join(REPO, "examples", "scheduler", "sweep.py"), path,
                                "--lr", "1e-3", "3e-3", "--steps", "10", "--server", plane.server],
                               capture_output=True, text=True, timeout=600, env=env)
            check(r.returncode == 0 and r.stdout.count("SUCCEEDED") == 2,
                  f"examples/scheduler/sweep.py: both jobs SUCCEEDED\n{r.stdout}{r.stderr[-500:]}")
        finally:
            plane.close()
    return exit_code()


if __name__ == "__main__":
    sys.exit(main())
