"""deploy/ rendered and validated as a cluster would take it:

1. `kubectl kustomize` of deploy/kubernetes/base and of the gpu overlay, and `helm template` of
   deploy/helm/loom (as it is, and with loomd.gpus): every object passes `kubernetes-validate
   --strict` (unknown fields refused) against Kubernetes 1.37.
2. GPU nodes request nvidia.com/gpu and run one rank per GPU; the planner serves HTTP and both
   daemons' /metrics are announced to Prometheus.
3. Security: the planner serves TLS from its Secrets, as a non-root user on a read-only root file
   system without capabilities; loomd dials with mutual TLS (a node certificate), keeps only
   the capabilities it uses on the ranks and runs them as nobody; the tenants file is JSON.
4. A broken manifest (a misspelt field, a wrong type) fails validation, naming what is wrong.

  python3 tests/deploy/manifests_test.py
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(HERE, "..", "oracles"))

from loom_runs import check, exit_code  # noqa: E402

KUBERNETES = "1.37.0"
VENV_BIN = os.path.dirname(sys.executable)


def tool(name):
    path = os.path.join(VENV_BIN, name) if os.path.exists(os.path.join(VENV_BIN, name)) else shutil.which(name)
    if not path:
        raise SystemExit(f"{name} is missing: scripts/setup installs it")
    return path


def run(*args):
    return subprocess.run(args, capture_output=True, text=True, timeout=120)


def validate(name, text, work):
    path = os.path.join(work, name + ".yaml")
    with open(path, "w") as f:
        f.write(text)
    r = run(tool("kubernetes-validate"), "--strict", "--kubernetes-version", KUBERNETES, path)
    return r.returncode, r.stdout + r.stderr


def yaml_images(text, kind):
    """The container images of every object of `kind` in a rendered manifest."""
    return [c["image"] for doc in yaml.safe_load_all(text) if doc and doc.get("kind") == kind
            for c in doc["spec"]["template"]["spec"]["containers"]]


def rendered(what, *command):
    r = run(*command)
    check(r.returncode == 0, f"{what} renders ({r.stderr.strip()[-300:]})")
    return r.stdout


def main():
    with tempfile.TemporaryDirectory() as work:
        renders = {
            "kustomize base": rendered("kubectl kustomize base", tool("kubectl"), "kustomize",
                                       os.path.join(REPO, "deploy", "kubernetes", "base")),
            "kustomize gpu": rendered("kubectl kustomize gpu", tool("kubectl"), "kustomize",
                                      os.path.join(REPO, "deploy", "kubernetes", "gpu")),
            "helm": rendered("helm template", tool("helm"), "template", "loom", os.path.join(REPO, "deploy", "helm", "loom")),
            "helm gpus": rendered("helm template --set loomd.gpus=4", tool("helm"), "template", "loom",
                                  os.path.join(REPO, "deploy", "helm", "loom"), "--set", "loomd.gpus=4",
                                  "--set-string", "loomd.nodeSelector.nvidia\\.com/gpu\\.present=true"),
        }
        for name, text in renders.items():
            code, out = validate(name.replace(" ", "-"), text, work)
            objects = out.count("passed for resource")
            check(code == 0 and objects >= 4,
                  f"{name}: {objects} objects pass kubernetes-validate --strict against {KUBERNETES}" +
                  ("" if code == 0 else "\n" + out[-1500:]))

        for name in ("kustomize gpu", "helm gpus"):
            text = renders[name]
            check("nvidia.com/gpu:" in text, f"{name}: loomd requests nvidia.com/gpu")
        loomd_images = {name: yaml_images(renders[name], "DaemonSet") for name in renders}
        check(loomd_images["kustomize gpu"] == ["loom:cuda"], f"the gpu overlay's loomd runs the CUDA image "
              f"({loomd_images['kustomize gpu']})")
        check(all(i.endswith("-cuda") for i in loomd_images["helm gpus"]) and loomd_images["helm gpus"],
              f"the chart's loomd runs the CUDA image where loomd.gpus is set ({loomd_images['helm gpus']})")
        check(not any("cuda" in i for i in loomd_images["kustomize base"] + yaml_images(renders["helm gpus"], "Deployment")),
              "CPU nodes' loomd and the planner run the CPU image")
        check("--slots=8" in renders["kustomize gpu"] and "nvidia.com/gpu: 8" in renders["kustomize gpu"],
              "the gpu overlay runs one rank per GPU requested (8)")
        check("--slots=4" in renders["helm gpus"] and "nvidia.com/gpu: 4" in renders["helm gpus"],
              "the chart's loomd.gpus sets both --slots and the GPU limit")
        for name, text in renders.items():
            check("--http-listen=0.0.0.0:7451" in text and "--metrics-listen=0.0.0.0:7452" in text
                  and text.count('prometheus.io/scrape: "true"') == 2,
                  f"{name}: the planner serves HTTP, loomd its node's /metrics, both announced to Prometheus")

        # Security: the planner serves TLS with its Secrets as a non-root user with nothing to
        # escalate to; loomd dials with the CA and a node token, keeps four capabilities and
        # runs ranks as nobody; the tenants file is JSON.
        for name, text in renders.items():
            docs = [d for d in yaml.safe_load_all(text) if d]
            planner = next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]
            loomd = next(d for d in docs if d["kind"] == "DaemonSet")["spec"]["template"]["spec"]
            args = planner["containers"][0]["args"]
            secrets = {v["secret"]["secretName"] for v in planner["volumes"] if "secret" in v}
            check(planner["securityContext"]["runAsNonRoot"] is True
                  and planner["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True
                  and planner["containers"][0]["securityContext"]["capabilities"]["drop"] == ["ALL"]
                  and {"--tls-cert=/etc/loom/tls/planner.crt", "--client-ca=/etc/loom/tls/ca.crt",
                       "--tokens=/etc/loom/tokens/tokens"} <= set(args)
                  and secrets == {"loom-planner-tls", "loom-tokens"}
                  and "tcpSocket" in planner["containers"][0]["readinessProbe"],
                  f"{name}: the planner serves TLS from its Secrets, non-root, read-only, no capabilities")
            largs = loomd["containers"][0]["args"]
            caps = loomd["containers"][0]["securityContext"]["capabilities"]
            check({"--ca=/etc/loom/node/ca.crt", "--cert=/etc/loom/node/node.crt", "--key=/etc/loom/node/node.key",
                   "--run-as=nobody"} <= set(largs)
                  and caps["drop"] == ["ALL"] and sorted(caps["add"]) == ["CHOWN", "KILL", "SETGID", "SETUID"],
                  f"{name}: loomd dials with mutual TLS, keeps 4 capabilities, runs ranks as nobody")
            check({"--metrics-tls-cert=/etc/loom/node/node.crt", "--metrics-tls-key=/etc/loom/node/node.key",
                   "--metrics-token-file=/etc/loom/node/metrics.token"} <= set(largs)
                  and "prometheus.io/scheme: https" in text,
                  f"{name}: loomd serves /metrics over HTTPS to scrapers with the scrape token")
            tenants = next(d for d in docs if d["kind"] == "ConfigMap")["data"]["tenants.json"]
            check(isinstance(json.loads(tenants), dict), f"{name}: the tenants file is a JSON object")

        # A misspelt field and a wrong type: each refused, named.
        base = renders["kustomize base"]
        for what, broken, named in [
                ("a misspelt field", base.replace("imagePullPolicy:", "imagePullPolcy:", 1), "imagePullPolcy"),
                ("replicas as text", base.replace("replicas: 1", "replicas: one", 1), "replicas")]:
            check(broken != base, f"{what}: the manifest was changed")
            code, out = validate("broken", broken, work)
            check(code != 0 and named in out, f"{what}: kubernetes-validate fails, naming it ({out.strip()[-200:]})")
    return exit_code()


if __name__ == "__main__":
    sys.exit(main())
