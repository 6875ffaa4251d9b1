"""Build step: generate the Python modules of ``enricher/proto/*.proto`` (protobuf and gRPC).

pyproject.toml names :class:`BuildPy` in ``[tool.setuptools.cmdclass]``, and grpcio-tools in
``[build-system] requires``, so every build generates the stubs from the ``.proto`` files:
``pip wheel .`` into the wheel, ``pip install -e .`` next to the ``.proto`` in the source tree.
``grpc_tools.protoc`` runs in this process; nothing is spawned.

This directory has no ``__init__.py``: setuptools does not ship it, and nothing at run time
imports it.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

# Build-time only: setuptools and grpcio-tools come from [build-system] requires, untyped.
from setuptools.command.build_py import build_py  # type: ignore[import-untyped,unused-ignore]

PROTO_PACKAGE = "enricher.proto"
# Generated code is not ours to lint or type-check; these lines say so to mypy and ruff, which
# also skip the files through .gitignore.
HEADER = "# mypy: ignore-errors\n# ruff: noqa\n"
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


class StubGenerationError(RuntimeError):
    """protoc rejected a .proto file."""


def generate_stubs(root: Path, out: Path) -> list[Path]:
    """Compile every ``.proto`` of the proto package under ``root`` into ``out``.

    ``root`` holds the ``enricher`` directory; the modules land in ``out/enricher/proto`` and
    import each other as ``enricher.proto.*``. Returns the files written.
    """
    from grpc_tools import protoc  # type: ignore[import-not-found,import-untyped,unused-ignore]

    rel = Path(*PROTO_PACKAGE.split("."))
    protos = sorted((root / rel).glob("*.proto"))
    (out / rel).mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    # protoc writes into a private folder and each module takes its place in one rename, so
    # that two builds of one source tree at once (make test installs a virtualenv per Python
    # side by side) never leave a torn or doubly-headed module.
    with tempfile.TemporaryDirectory(prefix=".stubs-", dir=out / rel) as tmp:
        for proto in protos:
            args = [
                "grpc_tools.protoc",
                f"--proto_path={root}",
                f"--python_out={tmp}",
                f"--pyi_out={tmp}",
                f"--grpc_python_out={tmp}",
                str(proto),
            ]
            if protoc.main(args) != 0:
                raise StubGenerationError(f"protoc failed on {proto}")
            for suffix in GENERATED_SUFFIXES:
                made = Path(tmp, rel, proto.stem + suffix)
                made.write_text(HEADER + made.read_text(encoding="utf-8"), encoding="utf-8")
                path = out / rel / made.name
                os.replace(made, path)
                written.append(path)
    return written


class BuildPy(build_py):  # type: ignore[misc,unused-ignore]
    """setuptools' build_py, plus the generated stubs.

    A wheel gets them in its build directory; an editable install (where build_py copies
    nothing) gets them in the source tree, where the editable finder imports from.
    """

    def run(self) -> None:
        source = Path(self.get_package_dir(PROTO_PACKAGE)).resolve()
        root = source.parents[len(PROTO_PACKAGE.split(".")) - 1]
        super().run()
        editable = bool(getattr(self, "editable_mode", False))
        generate_stubs(root, root if editable else Path(self.build_lib))
