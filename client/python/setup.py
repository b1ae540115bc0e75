"""Builds loom-client. The gRPC stubs of Loom's API (proto/loom/v1/*.proto in the repository) are
generated here, with grpcio-tools, into the built package's loom/v1/: `pip install ./client/python`
from a checkout of the repository."""
import glob
import os

from setuptools import setup
from setuptools.command.build_py import build_py

PROTO_ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "proto"))


class BuildWithStubs(build_py):
    def run(self):
        super().run()
        import grpc_tools
        from grpc_tools import protoc

        protos = sorted(glob.glob(os.path.join(PROTO_ROOT, "loom", "v1", "*.proto")))
        if not protos:
            raise SystemExit(f"loom-client: no .proto files under {PROTO_ROOT}/loom/v1: build it from Loom's repository")
        well_known = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
        out = self.build_lib
        args = ["grpc_tools.protoc", f"-I{PROTO_ROOT}", f"-I{well_known}", f"--python_out={out}", f"--pyi_out={out}",
                f"--grpc_python_out={out}", *protos]
        if protoc.main(args) != 0:
            raise SystemExit("loom-client: grpc_tools.protoc failed on " + " ".join(protos))


setup(cmdclass={"build_py": BuildWithStubs})
