"""tenantnet's build: everything is in pyproject.toml but one step, which a declarative
configuration cannot say — the gRPC stubs of tenantnet/kube/proto/*.proto, generated with
grpcio-tools (a build requirement there) before the package's modules are collected, so
that a plain `pip install .` (packaging/Containerfile's) ships them. The stubs are never
checked in.

Only missing or out-of-date stubs (older than their .proto) are generated here: `make`
generates them with the venv's own grpcio-tools after installing (Makefile, `venv`), and an
install into another environment (make's .venv-lint, an editable install) must not overwrite
those with the build environment's — the generated code requires at import a protobuf and a
grpcio at least as new as the generator that wrote it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
PROTO_DIR = "tenantnet/kube/proto"
STUBS = ("_pb2.py", "_pb2_grpc.py", "_pb2.pyi")


def stale_protos() -> list[str]:
    out = []
    for proto in sorted((ROOT / PROTO_DIR).glob("*.proto")):
        mtime = proto.stat().st_mtime
        stubs = [proto.with_name(proto.stem + s) for s in STUBS]
        if not all(s.exists() and s.stat().st_mtime >= mtime for s in stubs):
            out.append(str(proto.relative_to(ROOT)))
    return out


class BuildPyWithStubs(build_py):
    def run(self) -> None:
        protos = stale_protos()
        if protos:
            # From the repository root, as the Makefile does: the stubs import one another
            # as tenantnet.kube.proto.<name>_pb2.
            subprocess.run([sys.executable, "-m", "grpc_tools.protoc", "-I", ".", "--python_out=.",
                            "--grpc_python_out=.", "--pyi_out=.", *protos], cwd=ROOT, check=True)
        super().run()


setup(cmdclass={"build_py": BuildPyWithStubs})
