"""The package's shape: a pure core that imports no I/O library."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# The pure core (STYLE point 3): enrichment, the text format, the label policy, the rewrite and
# the types they share.
PURE_MODULES = (
    "enricher.enrich",
    "enricher.textformat",
    "enricher.labels",
    "enricher.rewrite",
    "enricher.model",
)
# The libraries through which the sources do their I/O.
IO_LIBRARIES = ("aiohttp", "grpc", "kubernetes", "pynvml", "google.protobuf")


def loaded_after_import(modules: Iterable[str]) -> list[str]:
    """Every module a fresh interpreter holds after importing ``modules`` (and nothing else)."""
    code = (
        "import json, sys\n"
        f"sys.path.insert(0, {str(ROOT)!r})\n"
        f"for name in {list(modules)!r}:\n"
        "    __import__(name)\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    loaded: list[str] = json.loads(out.stdout)
    return loaded


def test_pure_core_imports_no_io_library() -> None:
    loaded = loaded_after_import(PURE_MODULES)
    assert set(PURE_MODULES) <= set(loaded)
    found = sorted(
        name for name in loaded for lib in IO_LIBRARIES if name == lib or name.startswith(lib + ".")
    )
    assert found == [], f"the pure core loads I/O libraries: {found}"


def test_the_check_sees_an_io_library() -> None:
    """The check above can fail: a source module that does I/O pulls its library in."""
    assert "aiohttp" in loaded_after_import(["enricher.docker"])
