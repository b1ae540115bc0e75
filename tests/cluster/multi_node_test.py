"""Training across nodes, on 2 namespace nodes of 2 ranks each (their own addresses and host names:
UCX over TCP between them, shared memory within each):

1. A 4-rank job at ZeRO 0, 1, 2 and 3 gives the losses the same job gives on one node, step by
   step, and its final weights within 1e-6 relative.
2. A 4-rank job of tensor parallel 2 (AutoTP) is placed with each tensor-parallel pair inside a
   node (the Plan's rule: ranks 0-1 on one node, 2-3 on the other) and matches one node too.
3. The probe's collective benchmark runs across the nodes, every element verified, and reports
   its bus bandwidth and the comms logger's.

  python3 tests/cluster/multi_node_test.py --bin build/bin      (as root; exit 77: skipped)
"""
import os
import sys
import tempfile

import torch
from safetensors.torch import load_file

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "oracles"))

from loom_runs import check, exit_code, loom_run, small_llama, step_lines  # noqa: E402
from netns_cluster import NamespaceCluster, bin_dir_or_skip  # noqa: E402

STEPS = 6
STAGES = (0, 1, 2, 3)


def spec_of(bin_dir, work, stage, steps=STEPS):
    spec = small_llama(bin_dir, work, steps, name=f"zero{stage}", zero_optimization={"stage": stage})
    spec["resources"]["ranks"] = 4
    spec["deepspeed"]["train_batch_size"] = 8
    spec["train"].pop("eval_every")
    spec["train"].pop("eval_batches")
    spec["data"].pop("eval")
    return spec


def final_weights(checkpoints, steps=STEPS):
    return load_file(os.path.join(checkpoints, f"global_step{steps}", "model.safetensors"))


def worst_relative(a, b):
    """The largest ||a - b|| / ||b|| over the tensors of two state dicts with the same names."""
    check(sorted(a) == sorted(b), f"the same tensors ({len(a)} and {len(b)})")
    return max((torch.linalg.vector_norm(a[k].double() - b[k].double()) /
                torch.linalg.vector_norm(b[k].double()).clamp_min(1e-30)).item() for k in b)


def main():
    bin_dir = bin_dir_or_skip()
    with tempfile.TemporaryDirectory() as work:
        one_node = {}
        for stage in STAGES:
            spec = spec_of(bin_dir, work, stage)
            spec["train"]["checkpoint_dir"] = os.path.join(work, f"zero{stage}-one-node")
            one_node[stage] = step_lines(loom_run(bin_dir, spec, work, f"zero{stage}-one-node"))
            check(len(one_node[stage]) == STEPS, f"ZeRO-{stage} on one node: {len(one_node[stage])} step lines")

        with NamespaceCluster(bin_dir, os.path.join(work, "cluster"), nodes=2, slots=2) as cluster:
            # 1. ZeRO 0-3.
            for stage in STAGES:
                spec = spec_of(bin_dir, work, stage)
                spec["train"]["checkpoint_dir"] = os.path.join(work, f"zero{stage}-two-nodes")
                job = cluster.submit(spec)
                final = cluster.wait(job)
                check(final["state"] == "SUCCEEDED",
                      f"ZeRO-{stage} on 2 nodes: the job succeeds ({final['state']}: {final.get('reason')})")
                nodes = sorted({r.get("node_id") for r in final.get("ranks", [])})
                check(nodes == ["node-0", "node-1"], f"ZeRO-{stage}: its 4 ranks ran on both nodes ({nodes})")
                two_nodes, one = step_lines(cluster.rank_log(job)), one_node[stage]
                worst = max((abs(two_nodes[s]["loss"] - one[s]["loss"]) / abs(one[s]["loss"])
                             for s in one if s in two_nodes), default=float("inf"))
                check(sorted(two_nodes) == sorted(one) and worst <= 1e-6,
                      f"ZeRO-{stage}: the losses equal one node's, as printed (worst {worst:.2e}: "
                      f"{[two_nodes[s]['loss'] for s in sorted(two_nodes)][:3]} vs {[one[s]['loss'] for s in sorted(one)][:3]})")
                apart = worst_relative(final_weights(os.path.join(work, f"zero{stage}-two-nodes")),
                                       final_weights(os.path.join(work, f"zero{stage}-one-node")))
                check(apart <= 1e-6, f"ZeRO-{stage}: the final weights equal one node's within 1e-6 relative "
                                     f"({apart:.2e})")

            # 2. Tensor parallel 2: each pair within a node.
            tp = spec_of(bin_dir, work, stage=1)
            tp["name"] = "tp2"
            tp["deepspeed"]["tensor_parallel"] = {"autotp_size": 2}
            tp_one = step_lines(loom_run(bin_dir, tp, work, "tp2-one-node"))
            job = cluster.submit(tp)
            final = cluster.wait(job)
            check(final["state"] == "SUCCEEDED", f"tp 2: the job succeeds ({final.get('reason')})")
            placed = {r.get("rank", 0): r.get("node_id") for r in final.get("ranks", [])}
            check(placed.get(0) == placed.get(1) and placed.get(2) == placed.get(3) and placed.get(0) != placed.get(2),
                  f"tp 2: each tensor-parallel pair inside a node ({placed})")
            tp_two = step_lines(cluster.rank_log(job))
            check(sorted(tp_two) == sorted(tp_one) and all(
                abs(tp_two[s]["loss"] - tp_one[s]["loss"]) <= 1e-6 * abs(tp_one[s]["loss"]) for s in tp_one),
                  f"tp 2: losses equal one node's, as printed ({[tp_two[s]['loss'] for s in sorted(tp_two)][:3]} vs "
                  f"{[tp_one[s]['loss'] for s in sorted(tp_one)][:3]})")

            # 3. The probe's collective benchmark across the nodes, every element verified, and the
            # comms logger's bandwidth.
            probe = {"name": "comm", "kind": "probe", "resources": {"ranks": 4},
                     "probe": {"ticks": 0, "collectives": {"ops": ["all_reduce", "all_gather"], "min_bytes": 1024,
                                                           "max_bytes": 4 << 20, "iterations": 5, "warmup": 1}},
                     "deepspeed": {"comms_logger": {"enabled": True}}}
            final = cluster.wait(cluster.submit(probe))
            metrics = final.get("metrics", {})
            check(final["state"] == "SUCCEEDED" and metrics.get("probe.all_reduce.busbw_GBps", 0) > 0
                  and metrics.get("comm.all_reduce.busbw_GBps", 0) > 0,
                  f"the collectives across nodes are exact, with busbw "
                  f"{metrics.get('probe.all_reduce.busbw_GBps', 0):.3f} GB/s (all_reduce of 4 MiB) and the comms "
                  f"logger's {metrics.get('comm.all_reduce.busbw_GBps', 0):.3f} GB/s ({final.get('reason')})")
    return exit_code()


if __name__ == "__main__":
    sys.exit(main())
