"""The image's runtime stage (deploy/Dockerfile) installs every shared library Loom's binaries load.

The runtime stage is Debian 12 slim plus a list of Debian packages, the torch environment copied
from the build stage, and the binaries. For each library the binaries, libloom_torch.so and the
kernel plugins name (DT_NEEDED), as this build resolves it:
- under torch's directory or the build tree: it travels with the image's environment or binaries;
- the CUDA runtime or NCCL (the CUDA variant): torch's wheel must require the PyPI package that
  brings it, so the environment carries it;
- anything else: the Debian package that owns it must be in the runtime stage's list, in Debian's
  base (its required packages and apt), or a dependency of one of them.

Every libloom_*.so the build makes must also be one the runtime stage copies (a worker loads
them beside itself on first use, so nothing else would notice one left behind).

A library added to the build without its package in the Dockerfile, or without its COPY, fails
here, not when a cluster first pulls the image.

  python3 tests/deploy/image_test.py --build build
"""
import argparse
import fnmatch
import functools
import importlib.metadata
import importlib.util
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(HERE, "..", "oracles"))

from loom_runs import check, exit_code  # noqa: E402

# The CUDA variant's libraries that torch's own wheels provide, by the requirement that brings them.
FROM_TORCH_WHEELS = {"libcudart.so": "cuda-toolkit", "libnccl.so": "nvidia-nccl", "libcuda.so": None}


def runtime_stage(dockerfile):
    """The Dockerfile's last stage, its continuation lines joined."""
    text = open(dockerfile).read().replace("\\\n", " ")
    return text[text.rindex("\nFROM "):]


def runtime_packages(dockerfile):
    """The packages the last stage's `apt-get install` names."""
    command = re.search(r"apt-get install ([^&\n]*)", runtime_stage(dockerfile)).group(1)
    return {w for w in command.split() if not w.startswith("-")}


def runtime_copies(dockerfile):
    """The build stage's files the last stage copies (`COPY --from=build` sources, globs kept)."""
    sources = []
    for args in re.findall(r"^COPY --from=build (.*)$", runtime_stage(dockerfile), re.M):
        sources += args.split()[:-1]  # the last word is the destination
    return sources


def installed_packages():
    """name -> (dependencies, priority) over dpkg's database, with virtual names resolved."""
    out = subprocess.run(["dpkg-query", "-W", "-f", "${Package}\t${Priority}\t${Depends}, ${Pre-Depends}\t${Provides}\n"],
                         capture_output=True, text=True, check=True).stdout
    packages, provided_by = {}, {}
    for line in out.splitlines():
        name, priority, depends, provides = line.split("\t")
        names = {re.split(r"[\s(:]", alt.strip())[0] for part in depends.split(",") for alt in part.split("|")}
        packages[name] = ({n for n in names if n}, priority)
        for p in provides.split(","):
            if p.strip():
                provided_by.setdefault(re.split(r"[\s(:]", p.strip())[0], set()).add(name)
    return packages, provided_by


def closure(roots, packages, provided_by):
    seen, todo = set(), list(roots)
    while todo:
        name = todo.pop()
        for real in provided_by.get(name, set()) | ({name} if name in packages else set()):
            if real not in seen:
                seen.add(real)
                todo.extend(packages[real][0])
    return seen


def needed_libraries(path):
    """soname -> resolved path (None where the loader finds none) of the libraries `path` names."""
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]",
                        subprocess.run(["readelf", "-d", path], capture_output=True, text=True, check=True).stdout)
    resolved = dict(re.findall(r"^\s*(\S+) => (\S+)", subprocess.run(["ldd", path], capture_output=True,
                                                                       text=True).stdout, re.M))
    return {name: (os.path.realpath(resolved[name]) if resolved.get(name, "not") != "not" else None) for name in needed}


@functools.cache
def owner(path):
    r = subprocess.run(["dpkg", "-S", path], capture_output=True, text=True)
    if r.returncode != 0:  # a /lib path of a /usr/lib file (merged /usr)
        r = subprocess.run(["dpkg", "-S", path.replace("/usr/lib/", "/lib/", 1)], capture_output=True, text=True)
    return r.stdout.split(":")[0] if r.returncode == 0 else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(REPO, "build"))
    args = ap.parse_args()
    build = os.path.realpath(args.build)
    torch_dir = os.path.realpath(os.path.dirname(importlib.util.find_spec("torch").origin))
    torch_env = os.path.realpath(os.path.join(torch_dir, ".."))  # site-packages: torch and its nvidia-* wheels
    torch_requires = importlib.metadata.requires("torch") or []

    listed = runtime_packages(os.path.join(REPO, "deploy", "Dockerfile"))
    check({"libgrpc++1.51", "libucx0", "python3"} <= listed, f"the runtime stage's package list is read ({len(listed)})")
    packages, provided_by = installed_packages()
    base = {"apt"} | {n for n, (_, priority) in packages.items() if priority == "required"}
    available = closure(listed | base, packages, provided_by)

    files = [os.path.join(build, "bin", b) for b in ("loom-planner", "loomd", "loom-worker", "loomctl")]
    files += [os.path.join(build, "lib", f) for f in sorted(os.listdir(os.path.join(build, "lib")))
              if f.startswith("libloom_") and f.endswith(".so")]
    for f in files:
        check(os.path.exists(f), f"{os.path.relpath(f, build)} is built")
        if not os.path.exists(f):
            continue
        missing = []
        for soname, path in needed_libraries(f).items():
            base_name = soname.split(".so")[0] + ".so"
            if path and (path.startswith(torch_env + os.sep) or path.startswith(build + os.sep)):
                continue
            if soname.startswith("ld-linux"):
                continue  # the loader itself, libc6's
            if base_name in FROM_TORCH_WHEELS:
                wheel = FROM_TORCH_WHEELS[base_name]
                if wheel is None or any(r.startswith(wheel) for r in torch_requires):
                    continue  # the driver comes from the node; the rest from torch's wheels
                missing.append(f"{soname} (torch's wheel no longer requires {wheel})")
                continue
            package = owner(path) if path else None
            if package is None:
                missing.append(f"{soname} ({path or 'not found'}: no Debian package owns it)")
            elif package not in available:
                missing.append(f"{soname} (Debian's {package}, not in the runtime stage)")
        check(not missing, f"{os.path.relpath(f, build)}: every library it loads is in the image"
              + (f"; missing: {', '.join(missing)}" if missing else ""))

    copied = runtime_copies(os.path.join(REPO, "deploy", "Dockerfile"))
    check(any(c.endswith("/loom-worker") for c in copied), f"the runtime stage's copies are read ({len(copied)})")
    for f in files:
        if os.path.dirname(f) != os.path.join(build, "lib"):
            continue
        name = os.path.basename(f)
        check(any(fnmatch.fnmatch("/build/lib/" + name, c) for c in copied), f"lib/{name} is copied into the image")

    # The check itself must fail on a library that is not there: drop a package from the list.
    without_grpc = closure((listed - {"libgrpc++1.51"}) | base, packages, provided_by)
    check("libgrpc++1.51" not in without_grpc, "a package left out of the list is missed (libgrpc++1.51)")
    return exit_code()


if __name__ == "__main__":
    sys.exit(main())
