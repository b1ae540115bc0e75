"""What users look at, against a real control plane (`loomd --standalone`, two CPU ranks):

1. /metrics during a running train job (its ranks stopped with SIGSTOP, so that nothing moves
   between the scrape and `loomctl get`): Prometheus' own parser reads the whole text, and the
   job's step, loss, learning rate and memory per rank equal what `loomctl get` shows.
2. `loomctl plot` of a finished job draws every stored step (more rows than WatchJob's backlog of
   200): a PNG whose pixels show the curve (kept as <bin>/../test-artifacts/loomctl-plot.png),
   an SVG that parses with as many points as steps.
3. `watch -o json` and `logs -o json` print JSON Lines.
4. Errors name what is wrong: a picture of another type, an unknown job or metric, a bad query
   parameter of the JSON API, an HTTP address in use, a node daemon asked for the web page.

  python3 tests/oracles/metrics_test.py --bin build/bin
"""
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import xml.etree.ElementTree as ET
import zlib

from prometheus_client.parser import text_string_to_metric_families

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from loom_runs import ControlPlane, bin_and_artifacts, check, exit_code, small_llama, wait_for  # noqa: E402

CURVE = (47, 111, 219)  # client/plot/chart.cc's kCurve


def get(plane, job):
    r = plane.ctl("get", job, "-o", "json")
    if r.returncode != 0:
        raise RuntimeError(f"loomctl get {job}: {r.stderr}")
    return json.loads(r.stdout)


def http_get(address, path, token=None):
    """(status, body) of GET http://address/path, with a bearer token when given."""
    request = urllib.request.Request(f"http://{address}{path}",
                                     headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def samples(text):
    """{(name, frozenset(labels)): value} of every sample, through prometheus_client's parser."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def scrape_during_run(plane):
    spec = small_llama(plane.bin_dir, plane.work, steps=100000, name="running")
    job = plane.submit(spec)
    address = plane.http_address()
    j = wait_for("5 steps", lambda: (lambda j: j if len(j.get("ranks", [])) == 2 and all(
        int(r.get("step", 0)) >= 5 for r in j["ranks"]) and "memory.peak_rss_bytes" in j["ranks"][1].get("metrics", {})
        else None)(get(plane, job)), timeout=180)
    pids = [int(r["pid"]) for r in j["ranks"]]
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(1.0)  # the reports already sent reach the planner
        status, text = http_get(address, "/metrics", plane.token())
        node_status, node_text = http_get(plane.http_address(name="metrics.address"), "/metrics")
        j = get(plane, job)
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
    check(status == 200, f"/metrics answers 200 (got {status})")
    s = samples(text)  # raises if Prometheus' parser cannot read it
    check(True, f"prometheus_client parses the planner's /metrics ({len(s)} samples)")
    label = frozenset({("job", job)})
    step = max(int(r["step"]) for r in j["ranks"])
    check(s.get(("loom_job_step", label)) == step, f"loom_job_step{{job={job}}} is {step}, as loomctl get's ranks say "
          f"(scraped {s.get(('loom_job_step', label))})")
    for series, metric in [("loom_job_loss", "loss"), ("loom_job_learning_rate", "lr"),
                           ("loom_job_grad_norm", "grad_norm"), ("loom_job_tokens_per_second", "tokens_per_s")]:
        check(s.get((series, label)) == j["metrics"][metric],
              f"{series} equals loomctl get's {metric} ({s.get((series, label))} vs {j['metrics'][metric]})")
    for rank, r in enumerate(j["ranks"]):  # (proto JSON leaves out a rank 0)
        for kind in ("parameter", "optimizer_state", "peak_rss"):
            key = ("loom_job_memory_bytes", frozenset({("job", job), ("rank", str(rank)), ("kind", kind)}))
            check(s.get(key) == r["metrics"][f"memory.{kind}_bytes"],
                  f"loom_job_memory_bytes{{rank={rank}, kind={kind}}} equals the rank's report")
    check(s.get(("loom_jobs", frozenset({("state", "RUNNING"), ("tenant", "")}))) == 1,
          "loom_jobs{state=RUNNING,tenant=\"\"} is 1 (an admin's job)")
    info = frozenset({("job", job), ("name", "running"), ("kind", "train"), ("tenant", "")})
    check(s.get(("loom_job_info", info)) == 1,
          "loom_job_info names the job's name, kind and tenant")
    check(s.get(("loom_nodes", frozenset({("state", "connected")}))) == 1, "loom_nodes{state=connected} is 1")
    check(s.get(("loom_node_slots_used", frozenset({("node", j["ranks"][0]["node_id"])}))) == 2,
          "loom_node_slots_used is 2 on the node")
    handled = [v for (name, labels), v in s.items() if name == "loom_grpc_server_handled_total"
               and ("method", "/loom.v1.JobService/GetJob") in labels and ("code", "OK") in labels]
    check(handled and handled[0] >= 1, "loom_grpc_server_handled_total counts GetJob's OK answers")
    check(s.get(("loom_job_placement_wait_seconds_count", frozenset())) >= 1,
          "loom_job_placement_wait_seconds observed the placement")
    for line in text.splitlines():
        if line.startswith("# TYPE loom_job_skipped_steps_total"):
            check(line.endswith("counter"), "loom_job_skipped_steps_total is a counter")
    check(node_status == 200, f"loomd's /metrics answers 200 (got {node_status})")
    n = samples(node_text)
    node = j["ranks"][0]["node_id"]
    check(n.get(("loom_node_rank_launches_total", frozenset({("node", node)}))) == 2, "loomd counted 2 launches")
    check(n.get(("loom_node_ranks_running", frozenset({("node", node)}))) == 2, "loomd shows 2 ranks running")
    check(n.get(("loom_node_planner_connected", frozenset({("node", node)}))) == 1, "loomd's planner link is up")
    for rank, r in enumerate(j["ranks"]):
        labels = frozenset({("job", job), ("rank", str(rank))})
        check(n.get(("loom_rank_step", labels)) == int(r["step"]), f"loomd's loom_rank_step of rank {rank} is {r['step']}")
        rss = n.get(("loom_rank_resident_memory_bytes", labels), 0)
        peak = r["metrics"]["memory.peak_rss_bytes"]
        check(0 < rss <= peak * 1.5, f"loomd reads rank {rank}'s resident memory from /proc ({rss:.0f} bytes; "
              f"the rank's own peak {peak:.0f})")
        check(n.get(("loom_rank_cpu_seconds_total", labels), 0) > 0, "and its CPU time")
    r = plane.ctl("cancel", job)
    check(r.returncode == 0, "the running job is cancelled")
    node_address = plane.http_address(name="metrics.address")
    exits = wait_for("loomd to count the exits", lambda: (lambda n: n if sum(
        v for (name, labels), v in n.items() if name == "loom_node_rank_exits_total") == 2 else None)(
        samples(http_get(node_address, "/metrics")[1])), timeout=180)
    check(sum(v for (name, labels), v in exits.items() if name == "loom_node_rank_exits_total"
              and ("outcome", "succeeded") not in labels) == 2,
          "loomd counts the cancelled ranks' exits, not as succeeded")
    return address


def png_pixels(data):
    """(width, height, rows of RGB tuples) of an 8-bit RGB PNG whose scanlines use filter 0."""
    check(data[:8] == b"\x89PNG\r\n\x1a\n", "the PNG has PNG's signature")
    pos, idat, width, height = 8, b"", 0, 0
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        crc, = struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])
        if zlib.crc32(kind + body) != crc:
            check(False, f"PNG chunk {kind} has a wrong CRC")
        if kind == b"IHDR":
            width, height = struct.unpack(">II", body[:8])
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    raw = zlib.decompress(idat)
    stride = width * 3 + 1
    rows = [[tuple(raw[y * stride + 1 + 3 * x:y * stride + 4 + 3 * x]) for x in range(width)] for y in range(height)]
    return width, height, rows


def plots(plane, work, artifacts):
    steps = 60
    job = plane.submit(small_llama(plane.bin_dir, work, steps=steps, name="finished"))
    r = plane.ctl("wait", job, timeout=600)
    check(r.returncode == 0, f"the job to plot succeeds ({r.stdout.strip()} {r.stderr.strip()})")

    png, svg = os.path.join(work, "curves.png"), os.path.join(work, "curves.svg")
    r = plane.ctl("plot", job, "-o", png)
    check(r.returncode == 0, f"loomctl plot -o curves.png ({r.stderr.strip()})")
    shutil.copy(png, os.path.join(artifacts, "loomctl-plot.png"))
    width, height, rows = png_pixels(open(png, "rb").read())
    check((width, height) == (960, 36 + 2 * 280), f"the PNG is 960 x 596: two panels, loss and eval_loss ({width} x {height})")
    curve = sum(1 for row in rows for p in row if p == CURVE)
    ink = sum(1 for row in rows for p in row if p != (255, 255, 255))
    check(curve > 500, f"the PNG shows a curve ({curve} pixels of the curve's colour)")
    check(ink < width * height // 4, f"and is not filled ({ink} of {width * height} pixels not white)")
    first_panel = sum(1 for row in rows[36:316] for p in row if p == CURVE)
    check(first_panel > 300, f"the loss panel has its curve ({first_panel} pixels)")

    r = plane.ctl("plot", job, "--metric", "loss,lr", "-o", svg)
    check(r.returncode == 0, f"loomctl plot --metric loss,lr -o curves.svg ({r.stderr.strip()})")
    root = ET.parse(svg).getroot()
    lines = root.findall("{http://www.w3.org/2000/svg}polyline")
    counts = [len(p.get("points").split()) for p in lines]
    check(counts == [steps, steps], f"the SVG has one polyline per metric with every step ({counts})")
    texts = [t.text for t in root.iter("{http://www.w3.org/2000/svg}text")]
    check("loss" in texts and "lr" in texts, "the SVG's panels are titled by their metrics")

    rows_stored = json.loads(http_get(plane.http_address(), f"/api/v1/jobs/{job}/metrics?page_size=100000",
                                      plane.token())[1])
    check(len(rows_stored["metrics"]) > 200 and not rows_stored["more"],
          f"the JSON API returns all {len(rows_stored['metrics'])} stored rows in one page")

    r = plane.ctl("plot", job, "-o", os.path.join(work, "curves.jpg"))
    check(r.returncode != 0 and "curves.jpg" in r.stderr and ".png or .svg" in r.stderr,
          f"plot -o curves.jpg is refused, naming the file ({r.stderr.strip()})")
    r = plane.ctl("plot", "no-such-job", "-o", png)
    check(r.returncode != 0 and "NOT_FOUND" in r.stderr and "no-such-job" in r.stderr,
          f"plot of an unknown job: NOT_FOUND naming it ({r.stderr.strip()})")
    r = plane.ctl("plot", job, "--metric", "perplexity", "-o", png)
    check(r.returncode != 0 and "perplexity" in r.stderr, f"plot of a metric never reported names it ({r.stderr.strip()})")
    return job


def json_lines(plane, job):
    r = plane.ctl("watch", job, "-o", "json")
    lines = r.stdout.strip().splitlines()
    updates = [json.loads(line) for line in lines]
    check(r.returncode == 0 and updates and updates[-1]["job"]["state"] == "SUCCEEDED",
          f"watch -o json: {len(updates)} JSON lines, the last one SUCCEEDED")
    r = plane.ctl("logs", job, "--tail", "3", "-o", "json")
    entries = [json.loads(line) for line in r.stdout.strip().splitlines()]
    per_rank = [sum(1 for e in entries if e["rank"] == rank) for rank in (0, 1)]
    check(r.returncode == 0 and per_rank[0] == 3 and 1 <= per_rank[1] <= 3
          and all(set(e) == {"rank", "attempt", "line"} and e["attempt"] == 1 for e in entries),
          f"logs --tail 3 -o json: JSON lines of rank, attempt and line, at most 3 per rank ({per_rank})")


def api_errors(plane, address, job):
    token = plane.token()
    for path in ("/metrics", "/api/v1/jobs", f"/api/v1/jobs/{job}", "/api/v1/nodes"):
        status, body = http_get(address, path)
        check(status == 401 and "no credentials" in json.loads(body)["error"],
              f"{path} without a token: 401 ({body[:80]})")
    status, body = http_get(address, "/api/v1/jobs", "loom_not-a-token")
    check(status == 401 and "not one this planner knows" in body, f"an unknown token: 401 ({body[:80]})")
    status, _ = http_get(address, "/")
    check(status == 200, "the page itself needs no token (it asks for one)")
    status, body = http_get(address, "/api/v1/jobs/no-such-job", token)
    check(status == 404 and "no-such-job" in json.loads(body)["error"], f"/api/v1/jobs/no-such-job: 404 naming it ({body})")
    status, body = http_get(address, f"/api/v1/jobs/{job}/metrics?page_size=-3", token)
    check(status == 400 and "page_size" in body, f"a negative page_size: 400 naming it ({body})")
    status, body = http_get(address, "/api/v1/jobs?state=DONE", token)
    check(status == 400 and "DONE" in body, f"an unknown state: 400 naming it ({body})")
    status, body = http_get(address, f"/api/v1/jobs/{job}", token)
    update = json.loads(body)
    check(status == 200 and update["job"]["id"] == job and update["events"][-1]["state"] == "SUCCEEDED",
          "/api/v1/jobs/ID: the job and its events")
    # Another planner asked for the same HTTP address fails at start, naming it.
    r = subprocess.run([os.path.join(plane.bin_dir, "loom-planner"), "--listen", "127.0.0.1:0", "--http-listen", address,
                        "--state-dir", os.path.join(plane.work, "second")], capture_output=True, text=True, timeout=60)
    check(r.returncode != 0 and address in r.stderr + r.stdout,
          f"loom-planner --http-listen on an address in use exits, naming it ({(r.stderr + r.stdout).strip()[-160:]})")
    # A node daemon serves no web page: --http-listen without --standalone is refused.
    r = subprocess.run([os.path.join(plane.bin_dir, "loomd"), "--planner", "127.0.0.1:1", "--http-listen", "127.0.0.1:0",
                        "--state-dir", os.path.join(plane.work, "node")], capture_output=True, text=True, timeout=60)
    check(r.returncode == 2 and "--standalone" in r.stderr and "--metrics-listen" in r.stderr,
          f"loomd --http-listen without --standalone is refused, saying what to use ({r.stderr.strip()})")


def main():
    bin_dir, artifacts = bin_and_artifacts("loomctl plot's PNG")
    with tempfile.TemporaryDirectory() as work:
        plane = ControlPlane(bin_dir, work)
        try:
            address = scrape_during_run(plane)
            job = plots(plane, work, artifacts)
            json_lines(plane, job)
            api_errors(plane, address, job)
        finally:
            plane.close()
    return exit_code()


if __name__ == "__main__":
    sys.exit(main())
