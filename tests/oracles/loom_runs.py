"""Running Loom from the oracles: `loomctl run` of a spec, a `loomd --standalone` to submit to,
rank 0's step lines, and the checks every oracle prints. Standard library only, so that the GPU
machine's tests (tests/gpu/) use it without the references' packages.
"""
import glob
import json
import os
import signal
import socket
import subprocess
import sys
import time

failures = []


def check(ok, what):
    print(("ok    " if ok else "FAIL  ") + what, flush=True)
    if not ok:
        failures.append(what)


def exit_code():
    """The script's exit status from the checks so far: 0 and PASSED, or 1 and how many failed."""
    if failures:
        print(f"FAILED: {len(failures)} checks")
        return 1
    print("PASSED")
    return 0


def step_lines(log):
    """{step: {"loss": ..., "lr": ..., "grad_norm": ..., "tokens/s": ...}} from rank 0's step lines."""
    out = {}
    for line in log.splitlines():
        if line.startswith("step ") and ": loss " in line:
            words = line.split()
            out[int(words[1].split("/")[0])] = dict(zip(words[2::2], map(float, words[3::2])))
    return out


def wait_for(what, predicate, timeout=120, interval=0.1):
    """predicate()'s first true value, asked every `interval` s; RuntimeError after `timeout` s."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise RuntimeError(f"timed out waiting for {what} ({timeout} s)")


def loom_run(bin_dir, spec, work, name, expect_failure=False, timeout=300):
    """Runs a job spec with `loomctl run`; returns rank 0's log (with expect_failure, the job must
    fail, and loomctl's output is returned)."""
    spec_path = os.path.join(work, name + ".json")
    with open(spec_path, "w") as f:
        json.dump(spec, f)
    state = os.path.join(work, name + "-state")
    r = subprocess.run([os.path.join(bin_dir, "loomctl"), "run", spec_path, "--state-dir", state],
                       capture_output=True, text=True, timeout=timeout)
    logs = sorted(glob.glob(os.path.join(state, "jobs", "*", "attempt-1", "rank-0.log")))
    log = open(logs[0]).read() if logs else ""
    if expect_failure:
        if r.returncode == 0:
            raise SystemExit(f"loomctl run {name}: succeeded, and it should have failed")
        return r.stdout + r.stderr + log
    if r.returncode != 0:
        print(r.stdout, r.stderr, log, sep="\n", file=sys.stderr)
        raise SystemExit(f"loomctl run {name}: exit {r.returncode}")
    return log


def oracle_args(doc=None, only=None):
    """An oracle's command line: --bin DIR (made absolute) and, given `only`'s choices, --only PART
    to run one part of it."""
    import argparse
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bin", required=True)
    if only:
        parser.add_argument("--only", choices=only)
    args = parser.parse_args()
    args.bin = os.path.abspath(args.bin)
    return args


def bin_and_artifacts(description):
    """(bin_dir, artifacts_dir) from --bin and --artifacts (default <bin>/../test-artifacts, made):
    where a test keeps what a person may want to look at (screenshots, pictures)."""
    import argparse
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin", required=True)
    parser.add_argument("--artifacts", help=f"where {description} is kept (default: <bin>/../test-artifacts)")
    args = parser.parse_args()
    bin_dir = os.path.abspath(args.bin)
    artifacts = os.path.abspath(args.artifacts or os.path.join(bin_dir, "..", "test-artifacts"))
    os.makedirs(artifacts, exist_ok=True)
    return bin_dir, artifacts


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ControlPlane:
    """loomd --standalone with two slots, and loomctl against it. `worker`: the rank program loomd
    starts (default: the build's loom-worker). Its web server and the node's /metrics listen on
    free ports too (http_address())."""

    def __init__(self, bin_dir, work, worker=None):
        self.bin_dir = bin_dir
        self.server = f"127.0.0.1:{free_port()}"
        self.log = open(os.path.join(work, "loomd.log"), "w")
        self.loomd = subprocess.Popen([os.path.join(bin_dir, "loomd"), "--standalone", "--listen", self.server,
                                       "--http-listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
                                       "--state-dir", os.path.join(work, "state"), "--slots", "2",
                                       "--worker", worker or os.path.join(bin_dir, "loom-worker")],
                                      stdout=self.log, stderr=subprocess.STDOUT)
        self.work = work

    def http_address(self, timeout=30, name="http.address"):
        """host:port of the planner's /metrics, JSON API and web page (once loomd has written it);
        name="metrics.address": of the node's /metrics."""
        path = os.path.join(self.work, "state", name)
        deadline = time.time() + timeout
        while not os.path.exists(path):
            if time.time() > deadline or self.loomd.poll() is not None:
                raise RuntimeError(f"loomd wrote no {path}")
            time.sleep(0.05)
        return open(path).read().strip()

    def token_file(self, timeout=30):
        """The admin's token the standalone planner generated into its state directory (mode
        0600), as a user passes it to loomctl --token-file."""
        path = os.path.join(self.work, "state", "planner", "admin.token")
        deadline = time.time() + timeout
        while not os.path.exists(path):
            if time.time() > deadline or self.loomd.poll() is not None:
                raise RuntimeError(f"loomd wrote no {path}")
            time.sleep(0.05)
        return path

    def token(self):
        """The admin's token itself (for HTTP requests)."""
        with open(self.token_file()) as f:
            return f.read().strip()

    def ctl(self, *args, timeout=180):
        return subprocess.run([os.path.join(self.bin_dir, "loomctl"), "--server", self.server,
                               "--token-file", self.token_file(), *args],
                              capture_output=True, text=True, timeout=timeout)

    def ctl_popen(self, *args):
        return subprocess.Popen([os.path.join(self.bin_dir, "loomctl"), "--server", self.server,
                                 "--token-file", self.token_file(), *args],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def submit(self, spec):
        path = os.path.join(self.work, spec["name"] + ".json")
        with open(path, "w") as f:
            json.dump(spec, f)
        for _ in range(100):
            r = self.ctl("submit", path)
            if r.returncode == 0:
                return r.stdout.strip()
            time.sleep(0.1)  # loomd still starting
        raise RuntimeError(f"submit {spec['name']}: {r.stderr}")

    def status(self, job):
        r = self.ctl("rollout", "status", job, "-o", "json", "--wait", "120")
        if r.returncode != 0:
            raise RuntimeError(f"rollout status: {r.stderr}")
        return json.loads(r.stdout)

    def close(self):
        self.loomd.send_signal(signal.SIGTERM)
        try:
            self.loomd.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.loomd.kill()
        self.log.close()


def small_llama(bin_dir, work, steps, name="small", **deepspeed):
    """A train job spec of 2 CPU ranks: a small random Llama (config only, seeded init) on the GPL's
    text, reporting every step."""
    data = os.path.join(work, "gpl.tokens")
    if not os.path.exists(data):
        subprocess.run([os.path.join(bin_dir, "loomctl"), "data", "prepare", "/usr/share/common-licenses/GPL-3",
                        "--output", data], check=True, capture_output=True)
    config = os.path.join(work, "small-llama.json")
    with open(config, "w") as f:
        json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 260,
                   "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                   "num_key_value_heads": 2, "max_position_embeddings": 128, "rms_norm_eps": 1e-5,
                   "rope_theta": 10000.0, "hidden_act": "silu", "tie_word_embeddings": True}, f)
    return {"name": name, "kind": "train", "resources": {"ranks": 2, "device": "cpu"},
            "model": {"config": config, "init_seed": 1},
            "data": {"train": data, "eval": data, "seq_len": 32, "seed": 1},
            "train": {"steps": steps, "eval_every": 10, "eval_batches": 2},
            "deepspeed": {"train_batch_size": 4, "steps_per_print": 1, "gradient_clipping": 1.0,
                          "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}, **deepspeed}}
