"""External tools the tests run: a missing one fails in CI and skips elsewhere."""

from __future__ import annotations

import os
import shutil

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
