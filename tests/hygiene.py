"""No test writes into the checkout: a pytest plugin that fails the run when one did.

At the start of a run it notes every file of the checkout (its path, size and modification
time, so that a file rewritten with the same bytes counts too); at the end it looks again. A
file added, removed or rewritten fails the run and is named. What tools keep for themselves is
left out (``CACHES``: virtualenvs, the downloaded tools under .cache, bytecode, the caches of
pytest, mypy, ruff and Hypothesis, mutmut's copy). A test that needs to write a project file
writes a copy under ``tmp_path`` (tests/test_rules.py points rules/generate.py's outputs there).

Under pytest-xdist only the controller looks, once for the whole run.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Folder names that belong to tools, not to the project, wherever they are.
CACHES = frozenset(
    {
        ".git",
        ".cache",
        "__pycache__",
        ".pytest_cache",
        ".mypy_cache",
        ".ruff_cache",
        ".hypothesis",
        "mutants",
    }
)
# Folder-name prefixes and suffixes of the same kind (.venv, .venv-py3.10, the egg-info).
CACHE_PREFIXES = (".venv",)
CACHE_SUFFIXES = (".egg-info",)

Snapshot = dict[str, tuple[int, int]]


def _is_cache(name: str) -> bool:
    return name in CACHES or name.startswith(CACHE_PREFIXES) or name.endswith(CACHE_SUFFIXES)


def snapshot(root: Path) -> Snapshot:
    """Every file under ``root`` outside the tools' folders: relative path -> (size, mtime)."""
    found: Snapshot = {}
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if not _is_cache(d)]
        for name in files:
            path = os.path.join(folder, name)
            try:
                st = os.lstat(path)
            except FileNotFoundError:  # removed while we walked
                continue
            found[os.path.relpath(path, root)] = (st.st_size, st.st_mtime_ns)
    return found


def changes(before: Snapshot, after: Snapshot) -> list[str]:
    """What happened to the checkout between two snapshots, one line a file, sorted."""
    out = [f"added {p}" for p in after.keys() - before.keys()]
    out += [f"removed {p}" for p in before.keys() - after.keys()]
    out += [f"rewritten {p}" for p in before.keys() & after.keys() if before[p] != after[p]]
    return sorted(out)


def _report(lines: Iterable[str]) -> str:
    return "tests wrote into the checkout (write under tmp_path instead):\n  " + "\n  ".join(lines)


_KEY = pytest.StashKey[Snapshot]()


def _controller(config: pytest.Config) -> bool:
    return not hasattr(config, "workerinput")


def pytest_sessionstart(session: pytest.Session) -> None:
    if _controller(session.config):
        session.config.stash[_KEY] = snapshot(ROOT)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    before = session.config.stash.get(_KEY, None)
    if before is None:
        return
    found = changes(before, snapshot(ROOT))
    if found:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(_report(found), red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
