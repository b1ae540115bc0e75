"""A node lost mid-job: a 4-rank ZeRO-2 job on 2 of 3 namespace nodes, one of its nodes killed
(every process of the namespace, then its link) after the job's first checkpoints. The attempt
fails, the planner marks the node lost after --node-timeout, and the job restarts on the two
nodes left, resumes from its latest checkpoint and ends with the final weights of the same job
run without the loss, on the same layout.

  python3 tests/cluster/node_loss_test.py --bin build/bin      (as root; exit 77: skipped)
"""
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "oracles"))

from loom_runs import check, exit_code, step_lines  # noqa: E402
from multi_node_test import final_weights, spec_of, worst_relative  # noqa: E402
from netns_cluster import NamespaceCluster, bin_dir_or_skip  # noqa: E402

# Steps enough that many are left after the first checkpoint (step 4), when the node dies.
STEPS = 40


def main():
    bin_dir = bin_dir_or_skip()
    with tempfile.TemporaryDirectory() as work, \
            NamespaceCluster(bin_dir, os.path.join(work, "cluster"), nodes=3, slots=2, node_timeout=5) as cluster:
        def spec(name):
            s = spec_of(bin_dir, work, stage=2, steps=STEPS)
            s["name"] = name
            s["train"].update({"checkpoint_dir": os.path.join(work, name + "-checkpoints"), "checkpoint_every": 4})
            s["restart"] = {"max_restarts": 2}
            return s

        whole = cluster.wait(cluster.submit(spec("whole")))
        check(whole["state"] == "SUCCEEDED", f"the job without a loss succeeds ({whole.get('reason')})")

        job = cluster.submit(spec("lossy"))
        deadline = time.time() + 300
        while True:
            ranks = cluster.job(job).get("ranks", [])
            if len(ranks) == 4 and all(r.get("node_id") for r in ranks) or time.time() > deadline:
                break
            time.sleep(0.2)
        # The node dies once the first checkpoint is whole (`latest` names it, written last): then
        # attempt 2 has a checkpoint to resume from, and most of the steps are still ahead of it.
        latest = os.path.join(work, "lossy-checkpoints", "latest")
        while not os.path.exists(latest) and time.time() < deadline:
            time.sleep(0.02)
        victim = next((r["node_id"] for r in ranks if r.get("rank", 0) == 2 and r.get("node_id")), None)
        placed = [(r.get("rank", 0), r.get("node_id")) for r in ranks]
        check(victim is not None and os.path.exists(latest),
              f"the job wrote its first checkpoint on 2 nodes ({placed})")
        cluster.kill_node(int(victim.split("-")[1]))

        final = cluster.wait(job)
        check(final["state"] == "SUCCEEDED" and final.get("attempt") == 2 and final.get("restarts") == 1,
              f"the job restarts once and succeeds ({final['state']}, attempt {final.get('attempt')}, "
              f"restarts {final.get('restarts')}: {final.get('reason')})")
        nodes = sorted({r["node_id"] for r in final.get("ranks", [])})
        check(victim not in nodes and len(nodes) == 2, f"attempt 2 ran on the two nodes left ({nodes}, lost {victim})")
        listed = {n["node_id"]: n for n in cluster.wait_for_nodes(2)}
        check(victim not in listed or listed[victim].get("state") not in ("READY", "NODE_READY"),
              f"the planner no longer counts node {victim} ({listed.get(victim, {}).get('state', 'gone')})")
        resumed = cluster.rank_log(job, attempt=2)
        check("resum" in resumed.lower() and "global_step" in resumed,
              f"attempt 2 resumed from a checkpoint ({[l for l in resumed.splitlines() if 'resum' in l.lower()][:1]})")
        lines = step_lines(resumed)
        check(max(lines, default=0) == STEPS and min(lines, default=0) > 1,
              f"attempt 2 trained the steps after its checkpoint ({sorted(lines)})")
        apart = worst_relative(final_weights(os.path.join(work, "lossy-checkpoints"), STEPS),
                               final_weights(os.path.join(work, "whole-checkpoints"), STEPS))
        check(apart == 0, f"the final weights equal the uninterrupted run's ({apart:.2e})")
    return exit_code()


if __name__ == "__main__":
    sys.exit(main())
