"""External tools the tests run: a missing one fails in CI and skips elsewhere; one way to run
them; and the repository's scripts loaded as modules."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType

import pytest


def require_tool(name: str, how: str) -> str:
    """The path of ``name``; when it is not installed, fail in CI (CI set), skip elsewhere."""
    path = shutil.which(name)
    if path is None:
        message = f"{name} is not installed: {how}"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return path


def run_tool(
    argv: Sequence[str | os.PathLike[str]],
    *,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    """``argv`` run to its end (bounded by ``timeout`` seconds), its output as text; never
    raises on its exit status: the caller asserts on it and shows the output."""
    return subprocess.run(
        list(argv), capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env, check=False
    )


def load_script(path: Path, name: str) -> ModuleType:
    """One of the repository's scripts (they are not a package: mixin/build.py, the generators)
    as the module ``name``, loaded once a process. rules/generate.py and grafana/generate.py
    load mixin/build.py as ``mixin_build`` too, so that all of them share its cached builds."""
    loaded = sys.modules.get(name)
    if loaded is not None and Path(str(loaded.__file__)).resolve() == path.resolve():
        return loaded
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module
