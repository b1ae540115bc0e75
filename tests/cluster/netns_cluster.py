"""A cluster of Linux network namespaces on this machine, as the multi-node tests use it.

    hub:      a namespace holding the bridge, nothing else
    planner:  loom-planner on 10.N.0.1, TLS with certificates from `loomctl certs init`
    node i:   loomd on 10.N.0.(10+i), in a namespace of its own with a host name of its own (a UTS
              namespace), so that its ranks see another host: no shared memory with other nodes'
              ranks, UCX over TCP between them

Every namespace hangs off the hub's bridge by a veth pair, or, for the nodes named in `links`,
by a delay line (delay_line.py: two TAP devices and a process that delays and drops frames between
them, as netem would where the kernel has it); addresses live only inside the
namespaces the cluster makes, which it deletes on close (and which a later cluster of the same
name would replace). Needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN) and iproute2; `available()` says
why not where the machine forbids them.

    with NamespaceCluster(bin_dir, work, nodes=2, slots=2) as c:
        job = c.submit(spec)           # loomctl in the planner's namespace
        c.wait(job)
        c.partition(1); c.partition(1, cut=False)
        c.link_stats(1)                # with links={1: (50, 0.01)}: node 1's link delays and drops
        c.kill_node(1)                 # every process of the node, then its link
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time


def run(*args, check=True, **kwargs):
    return subprocess.run(list(args), check=check, capture_output=True, text=True, **kwargs)


SKIPPED = 77  # ctest's SKIP_RETURN_CODE


def bin_dir_or_skip():
    """A cluster test's --bin, made absolute; exits SKIPPED, saying why, where namespaces cannot be
    made."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin", required=True)
    bin_dir = os.path.abspath(parser.parse_args().bin)
    why = available()
    if why:
        print(f"SKIPPED: the namespace cluster cannot run here: {why}")
        sys.exit(SKIPPED)
    return bin_dir


def available():
    """None when namespaces can be made here, else why not."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "unshare", "tc"):
        if not shutil.which(tool):
            return f"{tool} is not installed (iproute2, util-linux)"
    probe = f"loom-probe-{os.getpid()}"
    made = run("ip", "netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"ip netns add: {made.stderr.strip()}"
    run("ip", "netns", "del", probe, check=False)
    return None


class NamespaceCluster:
    PLANNER_PORT = 7450

    def __init__(self, bin_dir, work, nodes=2, slots=2, node_timeout=10, tag=None, links=None):
        """`links`: node index -> (delay in ms each way, probability of losing a frame each way)."""
        self.bin_dir, self.work = bin_dir, work
        self.links = links or {}
        self.nodes, self.slots, self.node_timeout = nodes, slots, node_timeout
        # Names of at most 15 characters (interfaces), unique per test process.
        self.tag = tag or f"{os.getpid() % 100000}"
        self.subnet = f"10.{77 + os.getpid() % 100}.0"
        self.hub = f"lh{self.tag}"
        self.planner_ns = f"lp{self.tag}"
        self.node_ns = [f"ln{self.tag}-{i}" for i in range(nodes)]
        self.planner_address = f"{self.subnet}.1:{self.PLANNER_PORT}"
        self.procs = {}  # name -> Popen
        self.certs = os.path.join(work, "certs")

    # ---- set-up --------------------------------------------------------------------------------

    def __enter__(self):
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc):
        self.close()

    def node_address(self, i):
        return f"{self.subnet}.{10 + i}"

    def start(self):
        os.makedirs(self.work, exist_ok=True)
        for ns in [self.hub, self.planner_ns, *self.node_ns]:
            run("ip", "netns", "del", ns, check=False)  # a cluster of a run that died
            run("ip", "netns", "add", ns)
            self.ip(ns, "link", "set", "lo", "up")
        self.ip(self.hub, "link", "add", "br0", "type", "bridge")
        self.ip(self.hub, "link", "set", "br0", "up")
        self.attach(self.planner_ns, "p", f"{self.subnet}.1")
        for i, ns in enumerate(self.node_ns):
            if i in self.links:
                self.attach_delayed(i, *self.links[i])
            else:
                self.attach(ns, f"n{i}", self.node_address(i))
        self.make_credentials()
        self.start_planner()
        for i in range(self.nodes):
            self.start_node(i)
        self.wait_for_nodes(self.nodes)

    def ip(self, ns, *args):
        return run("ip", "-n", ns, *args)

    def attach(self, ns, short, address):
        """A veth pair from `ns` (eth0, `address`/24) to the hub's bridge."""
        outer = f"v{self.tag}{short}"
        run("ip", "link", "add", outer, "netns", self.hub, "type", "veth", "peer", "name", "eth0", "netns", ns)
        self.ip(self.hub, "link", "set", outer, "master", "br0")
        self.ip(self.hub, "link", "set", outer, "up")
        self.ip(ns, "addr", "add", f"{address}/24", "dev", "eth0")
        self.ip(ns, "link", "set", "eth0", "up")

    def attach_delayed(self, i, delay_ms, loss):
        """Node i's eth0 and its bridge port as TAP devices, joined by a delay line."""
        outer = f"v{self.tag}n{i}"
        line = subprocess.Popen(
            [sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "delay_line.py"),
             "--near", f"{self.node_ns[i]}:eth0", "--far", f"{self.hub}:{outer}", "--delay-ms", str(delay_ms),
             "--loss", str(loss), "--stats", self.link_stats_path(i)],
            stdout=subprocess.PIPE, stderr=open(os.path.join(self.work, f"link-{i}.log"), "w"), text=True,
            start_new_session=True)
        self.procs[f"link-{i}"] = line
        if line.stdout.readline().strip() != "ready":
            raise RuntimeError(f"the delay line of node {i} did not start: see {self.work}/link-{i}.log")
        self.ip(self.hub, "link", "set", outer, "master", "br0")
        self.ip(self.hub, "link", "set", outer, "up")
        self.ip(self.node_ns[i], "addr", "add", f"{self.node_address(i)}/24", "dev", "eth0")
        self.ip(self.node_ns[i], "link", "set", "eth0", "up")

    def link_stats_path(self, i):
        return os.path.join(self.work, f"link-{i}.json")

    def link_stats(self, i):
        """What node i's delay line carried and dropped: {"out"|"in": {"carried", "dropped", ...}}."""
        with open(self.link_stats_path(i)) as f:
            return json.load(f)

    def make_credentials(self):
        if os.path.exists(os.path.join(self.certs, "ca.crt")):
            return
        ctl = os.path.join(self.bin_dir, "loomctl")
        nodes = [arg for i in range(self.nodes) for arg in ("--node", f"node-{i}")]
        run(ctl, "certs", "init", self.certs, "--planner-name", f"{self.subnet}.1", *nodes, "--client", "root::admin")

    def in_ns(self, ns, args, hostname=None, log=None):
        """A process in `ns`. With `hostname`, a host of its own as a container has: its own host
        name, System V IPC, processes and /dev/shm, so that neither Loom's shared heap nor UCX's
        shared-memory transports (posix, sysv, cma) reach another node's ranks."""
        command = ["ip", "netns", "exec", ns]
        if hostname:
            command += ["unshare", "--uts", "--ipc", "--pid", "--fork", "--mount", "--mount-proc", "--",
                        "sh", "-c", 'hostname "$0" && mount -t tmpfs -o size=2g tmpfs /dev/shm && "$@"', hostname]
        out = open(log, "w") if log else subprocess.DEVNULL
        return subprocess.Popen(command + args, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def start_planner(self):
        state = os.path.join(self.work, "planner")
        self.procs["planner"] = self.in_ns(self.planner_ns, [
            os.path.join(self.bin_dir, "loom-planner"), "--listen", self.planner_address, "--http-listen", "none",
            "--state-dir", state, "--node-timeout", str(self.node_timeout),
            "--tls-cert", os.path.join(self.certs, "planner.crt"), "--tls-key", os.path.join(self.certs, "planner.key"),
            "--client-ca", os.path.join(self.certs, "ca.crt")], log=os.path.join(self.work, "planner.log"))

    def start_node(self, i):
        name = f"node-{i}"
        self.procs[name] = self.in_ns(self.node_ns[i], [
            os.path.join(self.bin_dir, "loomd"), "--planner", self.planner_address, "--node-id", name,
            "--address", self.node_address(i), "--slots", str(self.slots), "--gpus", "none",
            "--state-dir", os.path.join(self.work, name), "--ca", os.path.join(self.certs, "ca.crt"),
            "--cert", os.path.join(self.certs, "nodes", f"{name}.crt"),
            "--key", os.path.join(self.certs, "nodes", f"{name}.key")],
            hostname=name, log=os.path.join(self.work, f"{name}.log"))

    def wait_for_nodes(self, count, timeout=60):
        deadline = time.time() + timeout
        while True:
            r = self.ctl("nodes", "-o", "json", check=False)
            nodes = json.loads(r.stdout).get("nodes", []) if r.returncode == 0 and r.stdout.strip() else []
            attached = [n for n in nodes if n.get("state", "READY") in ("READY", "NODE_READY")]
            if len(attached) >= count:
                return nodes
            if time.time() > deadline:
                logs = {name: open(os.path.join(self.work, f"{name}.log")).read()[-400:]
                        for name in ["planner", *(f"node-{i}" for i in range(self.nodes))]}
                raise RuntimeError(f"{len(attached)} of {count} nodes attached within {timeout} s: {r.stderr}\n{logs}")
            time.sleep(0.3)

    # ---- use -----------------------------------------------------------------------------------

    def ctl(self, *args, check=True, timeout=120):
        """loomctl in the planner's namespace, with the admin's certificate."""
        client = os.path.join(self.certs, "clients", "root")
        r = subprocess.run(["ip", "netns", "exec", self.planner_ns, os.path.join(self.bin_dir, "loomctl"),
                            "--server", self.planner_address, "--ca", os.path.join(self.certs, "ca.crt"),
                            "--cert", client + ".crt", "--key", client + ".key", *args],
                           capture_output=True, text=True, timeout=timeout)
        if check and r.returncode != 0:
            raise RuntimeError(f"loomctl {' '.join(args)}: exit {r.returncode}: {r.stderr.strip()}")
        return r

    def submit(self, spec, name=None):
        path = os.path.join(self.work, (name or spec["name"]) + ".json")
        with open(path, "w") as f:
            json.dump(spec, f)
        return self.ctl("submit", path).stdout.strip()

    def job(self, job_id):
        return json.loads(self.ctl("get", job_id, "-o", "json").stdout)

    def wait(self, job_id, timeout=600):
        """The job's final record."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            job = self.job(job_id)
            if job.get("state") in ("SUCCEEDED", "FAILED", "CANCELLED"):
                return job
            time.sleep(0.5)
        raise RuntimeError(f"job {job_id} did not end within {timeout} s: {self.job(job_id)}")

    def rank_log(self, job_id, rank=0, attempt=1):
        """A rank's log, from the node that ran it."""
        return self.ctl("logs", job_id, "--rank", str(rank), "--attempt", str(attempt)).stdout

    def partition(self, i, cut=True):
        """Node i cut off from every other namespace (its bridge port down: packets vanish, no
        connection is reset), or joined again. Its own ranks still reach each other."""
        self.ip(self.hub, "link", "set", f"v{self.tag}n{i}", "down" if cut else "up")

    def kill_node(self, i):
        """Node i gone: every process of its namespace killed, its link down."""
        pids = run("ip", "netns", "pids", self.node_ns[i], check=False).stdout.split()
        for pid in pids:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.ip(self.node_ns[i], "link", "set", "eth0", "down")

    def close(self):
        for i in self.links:
            line = self.procs.get(f"link-{i}")
            if line and line.poll() is None:
                line.terminate()
        for ns in [*self.node_ns, self.planner_ns]:
            for pid in run("ip", "netns", "pids", ns, check=False).stdout.split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for p in self.procs.values():
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        for ns in [*self.node_ns, self.planner_ns, self.hub]:
            run("ip", "netns", "del", ns, check=False)
