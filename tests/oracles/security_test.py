"""Security over real TLS sockets on loopback: a loom-planner serving mutual TLS with a tokens
file, a loomd attached with its node certificate, and loomctl and raw gRPC calls as users would
make them.

1. Authentication: every method of every service refuses a call without credentials
   (UNAUTHENTICATED); a client trusting another CA, or holding an expired certificate, or one
   from another CA, does not get through the handshake; a revoked token is refused at once.
2. Tenants: a user of tenant team-b cannot get, watch, read the logs of, cancel, plan or read the
   metrics of team-a's job (PERMISSION_DENIED naming team-a, not the job's name), nor list it;
   an admin sees both; a client certificate names user, tenant and role. The same over the
   planner's HTTPS JSON API, whose /metrics is an admin's.
3. Roles: a node token cannot submit; a user cannot drain; a daemon with a certificate from
   another CA cannot attach; a node certificate attaches only as its own node.
4. Confined specs: a path outside the tenant's directories, through a symlink or "..", or a
   monitor's output there, is refused at submit naming the field; nothing is written or stored.
5. Quotas: a job larger than its tenant's quota is refused; one over the running-jobs quota
   waits, saying so, and runs once the tenant's other job ends.
6. Insecure is explicit: plain text beyond loopback needs --insecure (and warns); server
   reflection is off unless asked for.

  python3 tests/oracles/security_test.py --bin build/bin
"""
import http.client
import json
import os
import re
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

import grpc

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

from loom_runs import check, exit_code, free_port, oracle_args  # noqa: E402


def services():
    """(service, method, streaming kind) of every RPC in proto/loom/v1."""
    out = []
    for name in sorted(os.listdir(os.path.join(REPO, "proto", "loom", "v1"))):
        text = open(os.path.join(REPO, "proto", "loom", "v1", name)).read()
        for service, body in re.findall(r"service (\w+) \{(.*?)\n\}", text, re.S):
            for method, client_stream, server_stream in re.findall(
                    r"rpc (\w+)\s*\((stream )?[\w.]+\)\s*returns\s*\((stream )?[\w.]+\)", body):
                out.append((f"loom.v1.{service}", method, bool(client_stream), bool(server_stream)))
    return out


def call_raw(channel, service, method, client_stream, server_stream, metadata=()):
    """The status code of one call with an empty request."""
    path = f"/{service}/{method}"
    try:
        if client_stream:
            for _ in channel.stream_stream(path)(iter([b""]), metadata=metadata, timeout=10):
                pass
        elif server_stream:
            for _ in channel.unary_stream(path)(b"", metadata=metadata, timeout=10):
                pass
        else:
            channel.unary_unary(path)(b"", metadata=metadata, timeout=10)
        return grpc.StatusCode.OK, ""
    except grpc.RpcError as e:
        return e.code(), e.details() or ""


class Cluster:
    def __init__(self, bin_dir, work):
        self.bin_dir, self.work = bin_dir, work
        self.certs = os.path.join(work, "certs")
        self.other = os.path.join(work, "other-ca")
        self.tokens = os.path.join(work, "tokens")
        self.procs = []

    def loomctl(self, *args, timeout=60, credentials=()):
        return subprocess.run([os.path.join(self.bin_dir, "loomctl"), "--server", self.server, *credentials, *args],
                              capture_output=True, text=True, timeout=timeout)

    def tls(self, *more):
        return ["--ca", os.path.join(self.certs, "ca.crt"), *more]

    def token(self, user):
        return self.tls("--token-file", os.path.join(self.work, f"{user}.token"))

    def cert(self, user, certs=None):
        base = os.path.join(certs or self.certs, "clients", user)
        return self.tls("--cert", base + ".crt", "--key", base + ".key")

    def start(self, name, args):
        log = open(os.path.join(self.work, f"{name}.log"), "w")
        p = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        self.procs.append(p)
        return p

    def close(self):
        for p in reversed(self.procs):
            p.terminate()
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()


def make_credentials(c):
    ctl = os.path.join(c.bin_dir, "loomctl")
    r = subprocess.run([ctl, "certs", "init", c.certs, "--node", "n1", "--client", "alice:team-a",
                        "--client", "bob:team-b", "--client", "root::admin"], capture_output=True, text=True)
    check(r.returncode == 0, f"loomctl certs init ({r.stderr.strip()})")
    modes = {f: oct(os.stat(os.path.join(c.certs, f)).st_mode & 0o777)
             for f in ("ca.key", "ca.crt", "planner.key", "planner.crt", "nodes/n1.key", "clients/alice.key")}
    check(modes == {"ca.key": "0o600", "ca.crt": "0o644", "planner.key": "0o600", "planner.crt": "0o644",
                    "nodes/n1.key": "0o600", "clients/alice.key": "0o600"}, f"keys are 0600, certificates 0644 {modes}")
    r = subprocess.run([ctl, "certs", "init", c.certs], capture_output=True, text=True)
    check(r.returncode != 0 and "ca.crt exists" in r.stderr, f"certs init over a CA refuses ({r.stderr.strip()})")
    r = subprocess.run([ctl, "certs", "init", c.other, "--node", "n1", "--client", "eve:team-a"],
                       capture_output=True, text=True)
    check(r.returncode == 0, "a second, unrelated CA")
    # An expired client certificate from the right CA (OpenSSL's own tool: loomctl issues none).
    expired = os.path.join(c.certs, "clients", "late")
    subprocess.run(["openssl", "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout",
                    expired + ".key", "-out", expired + ".csr", "-subj", "/O=team-a/OU=user/CN=late"],
                   check=True, capture_output=True)
    subprocess.run(["openssl", "x509", "-req", "-in", expired + ".csr", "-CA", os.path.join(c.certs, "ca.crt"),
                    "-CAkey", os.path.join(c.certs, "ca.key"), "-out", expired + ".crt", "-days", "-1"],
                   check=True, capture_output=True)
    for user, tenant, role in (("alice", "team-a", "user"), ("bob", "team-b", "user"), ("carol", "team-a", "user"),
                               ("root", "", "admin"), ("n1", "", "node")):
        args = [ctl, "token", "create", "--tokens", c.tokens, "--user", user, "--role", role]
        if tenant:
            args += ["--tenant", tenant]
        r = subprocess.run(args, capture_output=True, text=True)
        check(r.returncode == 0 and r.stdout.startswith("loom_"), f"loomctl token create {user} ({r.stderr.strip()})")
        with open(os.path.join(c.work, f"{user}.token"), "w") as f:
            f.write(r.stdout)
    r = subprocess.run([ctl, "token", "create", "--tokens", c.tokens, "--user", "dave", "--role", "user"],
                       capture_output=True, text=True)
    check(r.returncode != 0 and "a user needs a tenant" in r.stderr, f"a user without a tenant is refused "
                                                                      f"({r.stderr.strip()})")


def tenants_file(work):
    """team-a: its directory, one running job of at most 2 ranks; team-b: its directory. A link
    inside team-a's directory points out of it."""
    for d in ("team-a", "team-b", "secret"):
        os.makedirs(os.path.join(work, d), exist_ok=True)
    os.symlink(os.path.join(work, "secret"), os.path.join(work, "team-a", "escape"))
    path = os.path.join(work, "tenants.json")
    with open(path, "w") as f:
        json.dump({"team-a": {"roots": [os.path.join(work, "team-a")], "max_running_jobs": 1, "max_ranks": 2},
                   "team-b": {"roots": [os.path.join(work, "team-b")]}}, f)
    return path


def probe(name, ticks=400):
    return json.dumps({"name": name, "kind": "probe", "resources": {"ranks": 1},
                       "probe": {"ticks": ticks, "tick_ms": 50}, "restart": {"max_restarts": 0}})


def main():
    bin_dir = oracle_args(__doc__).bin
    with tempfile.TemporaryDirectory() as work:
        c = Cluster(bin_dir, work)
        make_credentials(c)
        c.server = f"127.0.0.1:{free_port()}"
        planner = c.start("planner", [
            os.path.join(bin_dir, "loom-planner"), "--listen", c.server, "--http-listen", "127.0.0.1:0",
            "--state-dir", os.path.join(work, "planner"), "--tokens", c.tokens, "--tenants", tenants_file(work),
            "--tls-cert", os.path.join(c.certs, "planner.crt"), "--tls-key", os.path.join(c.certs, "planner.key"),
            "--client-ca", os.path.join(c.certs, "ca.crt")])
        try:
            scrape_token = os.path.join(work, "scrape.token")
            with open(scrape_token, "w") as f:
                f.write("scrape-me\n")
            c.start("n1", [os.path.join(bin_dir, "loomd"), "--planner", c.server, "--node-id", "n1", "--slots", "2",
                           "--state-dir", os.path.join(work, "n1"), "--ca", os.path.join(c.certs, "ca.crt"),
                           "--cert", os.path.join(c.certs, "nodes", "n1.crt"),
                           "--key", os.path.join(c.certs, "nodes", "n1.key"),
                           "--metrics-listen", "127.0.0.1:0", "--metrics-token-file", scrape_token,
                           "--metrics-tls-cert", os.path.join(c.certs, "nodes", "n1.crt"),
                           "--metrics-tls-key", os.path.join(c.certs, "nodes", "n1.key")])
            # The same node id with the other CA's certificate, and n1's certificate as node n2.
            c.start("impostor", [os.path.join(bin_dir, "loomd"), "--planner", c.server, "--node-id", "n1-other",
                                 "--slots", "2", "--state-dir", os.path.join(work, "impostor"),
                                 "--ca", os.path.join(c.certs, "ca.crt"),
                                 "--cert", os.path.join(c.other, "nodes", "n1.crt"),
                                 "--key", os.path.join(c.other, "nodes", "n1.key")])
            c.start("n2", [os.path.join(bin_dir, "loomd"), "--planner", c.server, "--node-id", "n2", "--slots", "2",
                           "--state-dir", os.path.join(work, "n2"), "--ca", os.path.join(c.certs, "ca.crt"),
                           "--cert", os.path.join(c.certs, "nodes", "n1.crt"),
                           "--key", os.path.join(c.certs, "nodes", "n1.key")])
            deadline = time.time() + 30
            while True:
                r = c.loomctl("nodes", "-o", "json", credentials=c.token("root"))
                nodes = [n["node_id"] for n in json.loads(r.stdout).get("nodes", [])] if r.returncode == 0 else []
                if "n1" in nodes or time.time() > deadline:
                    break
                time.sleep(0.2)
            time.sleep(2)  # the impostors' retries
            r = c.loomctl("nodes", "-o", "json", credentials=c.token("root"))
            nodes = sorted(n["node_id"] for n in json.loads(r.stdout).get("nodes", []))
            check(nodes == ["n1"], f"n1 attached with its certificate; another CA's node and n1's certificate as n2 "
                                   f"did not ({nodes})")
            n2_log = open(os.path.join(work, "n2.log")).read()
            check("the credential of node n1 may not attach as node n2" in n2_log,
                  "loomd n2 says why the planner refused it")

            # 1. Every method refuses a call without credentials.
            ca = open(os.path.join(c.certs, "ca.crt"), "rb").read()
            channel = grpc.secure_channel(c.server, grpc.ssl_channel_credentials(root_certificates=ca))
            methods = services()
            check(len(methods) >= 19, f"{len(methods)} methods in proto/loom/v1")
            unauthenticated = [f"{s}/{m}" for s, m, cs, ss in methods
                               if call_raw(channel, s, m, cs, ss)[0] == grpc.StatusCode.UNAUTHENTICATED]
            others = [f"{s}/{m}" for s, m, _, _ in methods if f"{s}/{m}" not in unauthenticated]
            check(not others, f"every method refuses a call without credentials: UNAUTHENTICATED "
                              f"({len(unauthenticated)} methods; not: {others})")
            code, details = call_raw(channel, "grpc.health.v1.Health", "Check", False, False)
            check(code == grpc.StatusCode.OK, f"the health check needs no credentials ({code})")
            code, _ = call_raw(channel, "grpc.reflection.v1alpha.ServerReflection", "ServerReflectionInfo",
                               True, True)
            check(code == grpc.StatusCode.UNIMPLEMENTED, f"server reflection is off by default ({code})")
            channel.close()

            r = c.loomctl("list", credentials=c.tls())
            check(r.returncode == 7 and "UNAUTHENTICATED" in r.stderr and "--token-file" in r.stderr,
                  f"loomctl without credentials: UNAUTHENTICATED, saying what to give ({r.stderr.strip()[:160]})")
            r = c.loomctl("list", credentials=["--ca", os.path.join(c.other, "ca.crt"), "--token-file",
                                               os.path.join(work, "root.token")])
            check(r.returncode != 0 and "certificate verify failed" in r.stderr,
                  f"a client trusting another CA does not accept the planner ({r.stderr.strip()[:120]})")
            r = c.loomctl("list", credentials=c.cert("late"))
            check(r.returncode != 0 and "UNAVAILABLE" in r.stderr,
                  f"an expired client certificate is refused in the handshake ({r.stderr.strip()[:120]})")
            r = c.loomctl("list", credentials=c.cert("eve", c.other))
            check(r.returncode != 0 and "UNAVAILABLE" in r.stderr,
                  f"a client certificate from another CA is refused ({r.stderr.strip()[:120]})")
            r = c.loomctl("list", credentials=c.token("carol"))
            check(r.returncode == 0, f"carol's token works ({r.stderr.strip()})")
            r = subprocess.run([os.path.join(bin_dir, "loomctl"), "token", "revoke", "--tokens", c.tokens, "--user",
                                "carol"], capture_output=True, text=True)
            check(r.returncode == 0, f"loomctl token revoke carol ({r.stderr.strip()})")
            r = c.loomctl("list", credentials=c.token("carol"))
            check(r.returncode == 7 and "UNAUTHENTICATED" in r.stderr and "not one this planner knows" in r.stderr,
                  f"a revoked token is refused at once ({r.stderr.strip()[:140]})")

            # 2. Tenants.
            spec = os.path.join(work, "secret-plan.json")
            with open(spec, "w") as f:
                f.write(probe("secret-plan"))
            r = c.loomctl("submit", spec, credentials=c.token("alice"))
            check(r.returncode == 0, f"alice submits ({r.stderr.strip()})")
            job = r.stdout.strip()
            for what, cmd in (("get", ["get", job]), ("watch", ["watch", job]), ("logs", ["logs", job]),
                              ("cancel", ["cancel", job]), ("plot", ["plot", job, "-o", os.path.join(work, "x.svg")])):
                r = c.loomctl(*cmd, credentials=c.token("bob"))
                check(r.returncode == 7 and "PERMISSION_DENIED" in r.stderr and "tenant team-a" in r.stderr,
                      f"bob (team-b) may not {what} alice's job: {r.stderr.strip().splitlines()[0][:150]}")
            r = c.loomctl("list", credentials=c.token("bob"))
            check(r.returncode == 0 and job not in r.stdout, "bob's list does not show team-a's job")
            r = c.loomctl("get", job, "-o", "json", credentials=c.cert("alice"))
            got = json.loads(r.stdout) if r.returncode == 0 else {}
            check(got.get("state") in ("PENDING", "LAUNCHING", "RUNNING") and got.get("tenant") == "team-a"
                  and got.get("owner") == "alice",
                  f"alice's client certificate reads her tenant's job, which names its tenant and owner ({got.get('tenant')}, "
                  f"{got.get('owner')})")
            r = c.loomctl("submit", spec, credentials=c.cert("bob"))
            bobs = r.stdout.strip()
            r = c.loomctl("list", "-o", "json", credentials=c.token("root"))
            listed = {j["id"] for j in json.loads(r.stdout).get("jobs", [])} if r.returncode == 0 else set()
            check({job, bobs} <= listed, f"the admin lists both tenants' jobs ({listed})")
            r = c.loomctl("list", "-o", "json", credentials=c.token("alice"))
            listed = {j["id"] for j in json.loads(r.stdout).get("jobs", [])} if r.returncode == 0 else set()
            check(listed == {job}, f"alice lists her tenant's job only ({listed})")

            # The web server: HTTPS with the planner's certificate, the same tokens and tenants.
            https = open(os.path.join(work, "planner", "http.address")).read().strip()
            context = ssl.create_default_context(cafile=os.path.join(c.certs, "ca.crt"))

            def get(path, user):
                token = open(os.path.join(work, f"{user}.token")).read().strip()
                request = urllib.request.Request(f"https://{https}{path}",
                                                 headers={"Authorization": f"Bearer {token}"})
                try:
                    with urllib.request.urlopen(request, context=context, timeout=30) as r:
                        return r.status, r.read().decode()
                except urllib.error.HTTPError as e:
                    return e.code, e.read().decode()

            status, body = get("/api/v1/jobs", "bob")
            check(status == 200 and job not in body, f"HTTPS: bob's /api/v1/jobs does not list team-a's job ({status})")
            status, body = get(f"/api/v1/jobs/{job}", "bob")
            check(status == 403 and "tenant team-a" in body, f"HTTPS: bob may not read alice's job: 403 ({body[:120]})")
            status, body = get(f"/api/v1/jobs/{job}/logs", "alice")
            check(status == 200, f"HTTPS: alice reads her job's log ({status})")
            status, body = get("/metrics", "alice")
            check(status == 403 and "role admin" in body, f"HTTPS: /metrics is an admin's: 403 for alice ({body[:100]})")

            # loomd's own /metrics: HTTPS with the node's certificate, whose name is "loomd" (as a
            # Prometheus scrape config's tls_config.server_name says), and only for scrapers with
            # its --metrics-token-file.
            host, port = open(os.path.join(work, "n1", "metrics.address")).read().strip().rsplit(":", 1)

            def scrape(token, tls=True):
                request = "GET /metrics HTTP/1.1\r\nHost: loomd\r\nConnection: close\r\n"
                request += f"Authorization: Bearer {token}\r\n" if token else ""
                try:
                    with socket.create_connection((host, int(port)), timeout=30) as raw:
                        conn = context.wrap_socket(raw, server_hostname="loomd") if tls else raw
                        conn.sendall((request + "\r\n").encode())
                        reply = b""
                        while chunk := conn.recv(65536):
                            reply += chunk
                except (OSError, ssl.SSLError) as e:
                    return None, str(e)
                head, _, body = reply.decode(errors="replace").partition("\r\n\r\n")
                fields = head.split(" ", 2)
                return (int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else None), body

            status, body = scrape(None)
            check(status == 401 and "--metrics-token-file" in body, f"loomd /metrics without a token: 401 ({body.strip()})")
            status, body = scrape("guess")
            check(status == 401 and "not loomd's scrape token" in body, f"loomd /metrics, a wrong token: 401 ({status})")
            status, body = scrape("scrape-me")
            check(status == 200 and 'loom_node_slots{node="n1"} 2' in body,
                  f"loomd /metrics over HTTPS with the scrape token ({status})")
            status, body = scrape("scrape-me", tls=False)
            check(status != 200, f"loomd /metrics refuses plain HTTP on its HTTPS port ({status})")
            status, body = get("/metrics", "root")
            check(status == 200 and "loom_jobs" in body, f"HTTPS: the admin reads /metrics ({status})")
            try:
                urllib.request.urlopen(f"http://{https}/api/v1/jobs", timeout=10)
                check(False, "plain HTTP to the HTTPS port: answered")
            except (urllib.error.URLError, ConnectionError, http.client.HTTPException) as e:
                check(True, f"plain HTTP to the HTTPS port gets nothing ({type(e).__name__})")

            # 3. Roles.
            r = c.loomctl("submit", spec, credentials=c.token("n1"))
            check(r.returncode == 7 and "PERMISSION_DENIED" in r.stderr and "submit jobs" in r.stderr,
                  f"a node token cannot submit ({r.stderr.strip()[:140]})")
            r = c.loomctl("drain", "n1", credentials=c.token("alice"))
            check(r.returncode == 7 and "PERMISSION_DENIED" in r.stderr and "role admin" in r.stderr,
                  f"a user cannot drain a node ({r.stderr.strip()[:140]})")
            # 4. Confined specs: every path under the tenant's directories, after symlinks and "..".
            def submit_as(user, name, patch, ranks=1):
                s = dict(json.loads(probe(name)), **patch)
                s["resources"] = {"ranks": ranks}
                path = os.path.join(work, f"{name}.json")
                with open(path, "w") as f:
                    json.dump(s, f)
                return c.loomctl("submit", path, credentials=c.token(user))

            team_a = os.path.join(work, "team-a")
            for what, patch, words in (
                    ("a path outside", {"model": {"config": "/etc/passwd"}},
                     f"model.config: /etc/passwd lies outside tenant team-a's directories ({team_a})"),
                    ("a symlink out of it", {"data": {"train": os.path.join(team_a, "escape", "x.tokens")}},
                     f"(as {os.path.join(work, 'secret', 'x.tokens')})"),
                    ("'..' out of it", {"train": {"checkpoint_dir": os.path.join(team_a, "..", "team-b", "ckpt")}},
                     "train.checkpoint_dir: "),
                    ("the monitors' output", {"deepspeed": {"tensorboard": {"enabled": True, "output_path": "/tmp"}}},
                     "deepspeed.tensorboard.output_path: /tmp lies outside")):
                r = submit_as("alice", "confined", patch)
                check(r.returncode == 7 and "PERMISSION_DENIED" in r.stderr and words in r.stderr,
                      f"{what} is refused at submit, naming the field ({r.stderr.strip()[:170]})")
            check(not os.path.exists(os.path.join(work, "team-b", "ckpt")), "... and nothing was written")
            r = c.loomctl("list", "-o", "json", credentials=c.token("root"))
            check(not any(j["id"].startswith("confined") for j in json.loads(r.stdout).get("jobs", [])),
                  "... nor stored")

            # 5. Quotas: team-a runs one job at a time, of at most 2 ranks.
            r = submit_as("alice", "too-big", {}, ranks=3)
            check(r.returncode == 1 and "FAILED_PRECONDITION" in r.stderr and "quota of 2" in r.stderr,
                  f"a job larger than the tenant's quota is refused at submit ({r.stderr.strip()[:150]})")
            r = submit_as("alice", "second", {})
            second = r.stdout.strip()
            deadline = time.time() + 20
            while True:
                got = json.loads(c.loomctl("get", second, "-o", "json", credentials=c.token("alice")).stdout)
                if "quota" in got.get("reason", "") or time.time() > deadline:
                    break
                time.sleep(0.2)
            check(got["state"] == "PENDING" and "waiting for tenant team-a's quota: 1 of its 1 running jobs" in
                  got["reason"], f"a second team-a job waits for the quota, saying so ({got.get('reason')})")
            r = c.loomctl("cancel", job, credentials=c.token("alice"))
            check(r.returncode == 0, "alice cancels her first job")
            deadline = time.time() + 60
            while time.time() < deadline:
                got = json.loads(c.loomctl("get", second, "-o", "json", credentials=c.token("alice")).stdout)
                if got["state"] == "RUNNING":
                    break
                time.sleep(0.2)
            check(got["state"] == "RUNNING", f"... then the second runs ({got['state']}: {got.get('reason')})")
            r = c.loomctl("cancel", second, credentials=c.token("alice"))
            check(r.returncode == 0, "alice cancels her second job")
            r = c.loomctl("cancel", bobs, credentials=c.token("root"))
            check(r.returncode == 0, "the admin cancels bob's job")
        finally:
            c.close()

        # 6. Plain text beyond loopback needs --insecure; reflection when asked for. loomd's
        # /metrics beyond loopback needs a scrape token, or --metrics-insecure.
        r = subprocess.run([os.path.join(bin_dir, "loomd"), "--planner", "127.0.0.1:1", "--metrics-listen", "0.0.0.0:0",
                            "--state-dir", os.path.join(work, "open-metrics")], capture_output=True, text=True,
                           timeout=30)
        check(r.returncode == 2 and "--metrics-token-file" in r.stderr and "--metrics-insecure" in r.stderr,
              f"loomd /metrics on 0.0.0.0 without a scrape token is refused ({r.stderr.strip()[-160:]})")
        state = os.path.join(work, "insecure")
        r = subprocess.run([os.path.join(bin_dir, "loom-planner"), "--listen", "0.0.0.0:0", "--http-listen", "none",
                            "--state-dir", state], capture_output=True, text=True, timeout=30)
        check(r.returncode != 0 and "--insecure" in (r.stdout + r.stderr),
              f"plain text on 0.0.0.0 without --insecure is refused ({(r.stdout + r.stderr).strip()[-140:]})")
        port = free_port()
        p = subprocess.Popen([os.path.join(bin_dir, "loom-planner"), "--listen", f"0.0.0.0:{port}", "--http-listen",
                              "none", "--state-dir", state, "--insecure", "--reflection"],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            channel = grpc.insecure_channel(f"127.0.0.1:{port}")
            grpc.channel_ready_future(channel).result(timeout=20)
            code, _ = call_raw(channel, "grpc.reflection.v1alpha.ServerReflection", "ServerReflectionInfo",
                               True, True)
            check(code != grpc.StatusCode.UNIMPLEMENTED, f"--reflection serves reflection ({code})")
            channel.close()
        finally:
            p.terminate()
            out = p.communicate(timeout=20)[0]
        check("--insecure: serving plain text" in out, "--insecure warns at start")
    return exit_code()


if __name__ == "__main__":
    sys.exit(main())
