"""Partitions between a node and the rest (its bridge port down: every packet dropped, no
connection reset), on 3 namespace nodes, node timeout 8 s. A job of 2 ranks runs on one node:

1. Short (3 s): its ranks keep running (they talk within the node), their reports reach the
   planner once the link is back, nothing restarts: attempt 1 succeeds with every step reported.
2. Long (past the timeout), a probe job of 2 ranks: the planner marks the node lost and fails the attempt once, the job
   restarts on another node; when the link comes back the node attaches again and ends the ranks
   the planner gave up on instead of letting them run on; the job ends with attempt 2 and one
   restart, never two.

  python3 tests/cluster/partition_test.py --bin build/bin      (as root; exit 77: skipped)
"""
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "oracles"))

from loom_runs import check, exit_code, small_llama, step_lines, wait_for  # noqa: E402
from netns_cluster import NamespaceCluster, bin_dir_or_skip, run  # noqa: E402

NODE_TIMEOUT = 8


def workers_of(cluster, node, job, attempt):
    """pids of loom-worker processes of the job's attempt in node's namespace."""
    found = []
    for pid in run("ip", "netns", "pids", cluster.node_ns[node], check=False).stdout.split():
        try:
            env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
        except OSError:
            continue
        if f"LOOM_JOB_ID={job}".encode() in env and f"LOOM_ATTEMPT={attempt}".encode() in env:
            found.append(int(pid))
    return found


def node_of_rank0(cluster, job):
    ranks = cluster.job(job).get("ranks", [])
    step = int(ranks[0].get("step", 0)) if ranks else 0
    return int(ranks[0]["node_id"].split("-")[1]) if ranks and step >= 2 else None


def main():
    bin_dir = bin_dir_or_skip()
    with tempfile.TemporaryDirectory() as work, \
            NamespaceCluster(bin_dir, os.path.join(work, "cluster"), nodes=3, slots=2,
                             node_timeout=NODE_TIMEOUT) as cluster:
        # 1. A short partition.
        steps = 40
        spec = small_llama(bin_dir, work, steps, name="steady")
        job = cluster.submit(spec)
        node = wait_for("step 2 of the first job", lambda: node_of_rank0(cluster, job))
        cluster.partition(node)
        time.sleep(3)
        cluster.partition(node, cut=False)
        final = cluster.wait(job)
        check(final["state"] == "SUCCEEDED" and final.get("attempt") == 1 and not final.get("restarts"),
              f"a 3 s partition restarts nothing ({final['state']}, attempt {final.get('attempt')}: "
              f"{final.get('reason')})")
        lines = step_lines(cluster.rank_log(job))
        reported = [int(r.get("step", 0)) for r in final.get("ranks", [])]
        check(sorted(lines) == list(range(1, steps + 1)) and reported == [steps, steps],
              f"every step ran and was reported ({len(lines)} step lines; ranks report {reported})")
        check(abs(final.get("metrics", {}).get("loss", 0) - lines[steps]["loss"]) <= 1e-6 * lines[steps]["loss"],
              "the last loss reached the planner")

        # 2. A long one.
        # A probe of 2 ranks ticking for 2 minutes: long enough to outlast the partition.
        spec = {"name": "cut", "kind": "probe", "resources": {"ranks": 2}, "probe": {"ticks": 2400, "tick_ms": 50},
                "restart": {"max_restarts": 3}}
        job = cluster.submit(spec)
        node = wait_for("step 2 of the second job", lambda: node_of_rank0(cluster, job))
        check(len(workers_of(cluster, node, job, 1)) == 2, f"the job's 2 ranks run on node-{node}")
        cluster.partition(node)
        moved = wait_for("attempt 2", lambda: (lambda j: j if j.get("attempt") == 2 and j.get("ranks") else None)(
            cluster.job(job)), timeout=NODE_TIMEOUT + 60)
        elsewhere = sorted({r["node_id"] for r in moved["ranks"]})
        check(f"node-{node}" not in elsewhere, f"attempt 2 runs elsewhere ({elsewhere}) once node-{node} is lost")
        check(len(workers_of(cluster, node, job, 1)) == 2,
              "meanwhile the cut-off node's ranks still run (nothing told them otherwise)")
        cluster.partition(node, cut=False)
        wait_for("node-{node} attached again", lambda: any(
            n["node_id"] == f"node-{node}" for n in cluster.wait_for_nodes(3)), timeout=60)
        wait_for("the given-up ranks ended", lambda: not workers_of(cluster, node, job, 1), timeout=60)
        check(True, f"node-{node} attached again and ended attempt 1's ranks")
        cluster.ctl("cancel", job)
        final = cluster.wait(job)
        check(final.get("attempt") == 2 and final.get("restarts") == 1,
              f"the attempt was failed once, never twice (attempt {final.get('attempt')}, "
              f"restarts {final.get('restarts')})")
    return exit_code()


if __name__ == "__main__":
    sys.exit(main())
