"""A slow link: one of 2 namespace nodes behind a token bucket of 20 Mbit/s (tc tbf; this
machine's kernel has no netem, so latency and loss cannot be added here). A 4-rank ZeRO-2 job
across the nodes trains at its pace, at the watchdog's default timeout, and ends with the losses
and weights it has on one node.

  python3 tests/cluster/slow_link_test.py --bin build/bin      (as root; exit 77: skipped)
"""
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "oracles"))

from loom_runs import check, exit_code, loom_run, step_lines  # noqa: E402
from multi_node_test import final_weights, spec_of, worst_relative  # noqa: E402
from netns_cluster import NamespaceCluster, bin_dir_or_skip, run  # noqa: E402


def main():
    bin_dir = bin_dir_or_skip()
    with tempfile.TemporaryDirectory() as work:
        spec = spec_of(bin_dir, work, stage=2)
        spec["train"]["checkpoint_dir"] = os.path.join(work, "one-node")
        one_node = step_lines(loom_run(bin_dir, spec, work, "one-node"))
        with NamespaceCluster(bin_dir, os.path.join(work, "cluster"), nodes=2, slots=2) as cluster:
            run("ip", "netns", "exec", cluster.node_ns[1], "tc", "qdisc", "add", "dev", "eth0", "root", "tbf",
                "rate", "20mbit", "burst", "32kbit", "latency", "400ms")
            spec["train"]["checkpoint_dir"] = os.path.join(work, "slow-link")
            final = cluster.wait(cluster.submit(spec))
            check(final["state"] == "SUCCEEDED" and final.get("attempt") == 1,
                  f"the job succeeds on its first attempt behind a 20 Mbit/s link ({final['state']}: "
                  f"{final.get('reason')})")
            slow = step_lines(cluster.rank_log(final["id"]))
            check(sorted(slow) == sorted(one_node) and all(
                abs(slow[s]["loss"] - one_node[s]["loss"]) <= 1e-6 * abs(one_node[s]["loss"]) for s in one_node),
                  "the losses equal one node's, as printed")
            apart = worst_relative(final_weights(os.path.join(work, "slow-link")),
                                   final_weights(os.path.join(work, "one-node")))
            check(apart <= 1e-6, f"the final weights equal one node's within 1e-6 relative ({apart:.2e})")
            check("watchdog" not in cluster.rank_log(final["id"]).lower(), "no watchdog fired")
            shaped = run("ip", "netns", "exec", cluster.node_ns[1], "tc", "-s", "qdisc", "show", "dev", "eth0").stdout
            sent = int(shaped.split("Sent ")[1].split()[0]) if "Sent " in shaped else 0
            check(sent > 1 << 20, f"the job's traffic went through the token bucket ({sent / 2**20:.1f} MiB)")
    return exit_code()


if __name__ == "__main__":
    sys.exit(main())
