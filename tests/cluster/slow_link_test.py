"""A slow and lossy link: one of 2 namespace nodes 50 ms away each way with 1% of frames lost
each way (a delay line, delay_line.py, as this machine's kernel has no netem) and behind a token
bucket of 20 Mbit/s (tc tbf). A 4-rank ZeRO-2 job across the nodes trains at its pace, at the
watchdog's default timeout, and ends with the losses and weights it has on one node.

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

DELAY_MS, LOSS = 50, 0.01


def round_trip_ms(cluster, i):
    """The shortest of three TCP handshakes from node i to the planner's port, in ms."""
    host, port = cluster.planner_address.split(":")
    probe = (f"import socket, time\nbest = 1e9\nfor _ in range(3):\n    t = time.monotonic()\n"
             f"    socket.create_connection(('{host}', {port}), timeout=10).close()\n"
             f"    best = min(best, time.monotonic() - t)\nprint(best * 1000)")
    return float(run("ip", "netns", "exec", cluster.node_ns[i], sys.executable, "-c", probe).stdout)


def main():
    bin_dir = bin_dir_or_skip()
    with tempfile.TemporaryDirectory() as work:
        spec = spec_of(bin_dir, work, stage=2)
        spec["train"]["checkpoint_dir"] = os.path.join(work, "one-node")
        one_node = step_lines(loom_run(bin_dir, spec, work, "one-node"))
        with NamespaceCluster(bin_dir, os.path.join(work, "cluster"), nodes=2, slots=2,
                              links={1: (DELAY_MS, LOSS)}) as cluster:
            rtt = round_trip_ms(cluster, 1)
            check(rtt >= 2 * DELAY_MS, f"a round trip from node 1 takes at least {2 * DELAY_MS} ms ({rtt:.1f} ms)")
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
            link = cluster.link_stats(1)
            carried = sum(d["carried"] for d in link.values())
            dropped = sum(d["dropped"] for d in link.values())
            check(dropped > 0 and 0.5 * LOSS < dropped / (carried + dropped) < 2 * LOSS,
                  f"the link lost about {LOSS:.0%} of its frames ({dropped} of {carried + dropped})")
    return exit_code()


if __name__ == "__main__":
    sys.exit(main())
