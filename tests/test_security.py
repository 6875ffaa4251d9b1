"""The package never spawns a process: every module of enricher/ is walked with ``ast``.

ruff's banned-api rule (pyproject.toml) catches the plain spellings at lint time; this test
also follows aliases (``import os as o; o.system``, ``from os import execv as run``), dynamic
imports by name (``__import__("subprocess")``, ``importlib.import_module``), event-loop
methods (``loop.subprocess_exec``) and process pools, and it runs with the test suite.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "enricher"

# Modules whose only purpose is to run or fork processes (or open a browser, which does).
BANNED_MODULES = frozenset({"subprocess", "pty", "multiprocessing", "webbrowser", "pexpect", "sh"})
# Qualified names that start, replace or fork a process.
BANNED_NAMES = frozenset(
    {
        "os.system",
        "os.popen",
        "os.fork",
        "os.forkpty",
        "os.posix_spawn",
        "os.posix_spawnp",
        "asyncio.create_subprocess_exec",
        "asyncio.create_subprocess_shell",
        "asyncio.subprocess",
        "concurrent.futures.ProcessPoolExecutor",
        "platform.popen",
    }
)
BANNED_PREFIXES = ("os.exec", "os.spawn")  # execv, execvpe, spawnl, spawnvp, ...
# Methods of an event loop that start processes, whatever the loop object is called.
BANNED_METHODS = frozenset({"subprocess_exec", "subprocess_shell"})
DYNAMIC_IMPORTS = frozenset({"__import__", "importlib.import_module", "importlib.__import__"})


@dataclass(frozen=True)
class Finding:
    path: str
    line: int
    what: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.what}"


def _banned_module(name: str) -> bool:
    return name.split(".")[0] in BANNED_MODULES


def _banned_name(qualified: str) -> bool:
    return (
        qualified in BANNED_NAMES
        or qualified.startswith(BANNED_PREFIXES)
        or _banned_module(qualified)
    )


class _Walker(ast.NodeVisitor):
    def __init__(self, path: str) -> None:
        self.path = path
        self.aliases: dict[str, str] = {}  # local name -> qualified name
        self.findings: list[Finding] = []

    def _add(self, node: ast.AST, what: str) -> None:
        self.findings.append(Finding(self.path, getattr(node, "lineno", 0), what))

    def _qualified(self, node: ast.expr) -> str | None:
        if isinstance(node, ast.Name):
            return self.aliases.get(node.id, node.id)
        if isinstance(node, ast.Attribute):
            base = self._qualified(node.value)
            return f"{base}.{node.attr}" if base is not None else None
        return None

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if _banned_module(alias.name):
                self._add(node, f"import {alias.name}")
            local = alias.asname or alias.name.split(".")[0]
            self.aliases[local] = alias.name if alias.asname else local
        self.generic_visit(node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        if node.level == 0 and _banned_module(module):
            self._add(node, f"from {module} import ...")
        for alias in node.names:
            qualified = f"{module}.{alias.name}" if module else alias.name
            if node.level == 0 and _banned_name(qualified):
                self._add(node, f"from {module} import {alias.name}")
            self.aliases[alias.asname or alias.name] = qualified
        self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        qualified = self._qualified(node)
        if qualified is not None and _banned_name(qualified):
            self._add(node, f"use of {qualified}")
        elif node.attr in BANNED_METHODS:
            self._add(node, f"use of .{node.attr}()")
        else:
            self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        qualified = self.aliases.get(node.id)
        if qualified is not None and qualified != node.id and _banned_name(qualified):
            self._add(node, f"use of {qualified} (as {node.id})")

    def visit_Call(self, node: ast.Call) -> None:
        func = self._qualified(node.func)
        if func in DYNAMIC_IMPORTS and node.args:
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                if _banned_module(first.value):
                    self._add(node, f"{func}({first.value!r})")
            else:
                self._add(node, f"{func}() with a computed name")
        self.generic_visit(node)


def find_spawns(source: str, path: str = "<string>") -> list[Finding]:
    """Every place in ``source`` that imports or uses a process-spawning API."""
    walker = _Walker(path)
    walker.visit(ast.parse(source, filename=path))
    return walker.findings


def test_the_package_never_spawns_processes() -> None:
    modules = sorted(PACKAGE.rglob("*.py"))
    assert len(modules) >= 10, f"expected the whole package under {PACKAGE}"
    findings: list[Finding] = []
    for module in modules:
        rel = str(module.relative_to(PACKAGE.parent))
        findings += find_spawns(module.read_text(encoding="utf-8"), rel)
    assert not findings, "the package must not spawn processes; found:\n" + "\n".join(
        map(str, findings)
    )


@pytest.mark.parametrize(
    ("source", "what"),
    [
        pytest.param("import subprocess\n", "import subprocess", id="import"),
        pytest.param(
            "import multiprocessing.pool\n", "import multiprocessing.pool", id="submodule"
        ),
        pytest.param("from subprocess import run\n", "from subprocess import", id="from-import"),
        pytest.param("import os\nos.system('x')\n", "use of os.system", id="os-system"),
        pytest.param("import os as o\no.execv('a', [])\n", "use of os.execv", id="alias"),
        pytest.param("from os import spawnv as go\ngo(0, 'a', [])\n", "os.spawnv", id="from-as"),
        pytest.param("import os\nf = os.fork\n", "use of os.fork", id="reference"),
        pytest.param("import os\nos.posix_spawn('a', [], {})\n", "os.posix_spawn", id="spawn"),
        pytest.param(
            "import asyncio\nasyncio.create_subprocess_exec('a')\n",
            "asyncio.create_subprocess_exec",
            id="asyncio",
        ),
        pytest.param("loop.subprocess_shell(p, 'x')\n", ".subprocess_shell()", id="loop-method"),
        pytest.param(
            "from concurrent.futures import ProcessPoolExecutor\n",
            "ProcessPoolExecutor",
            id="process-pool",
        ),
        pytest.param("__import__('subprocess')\n", "__import__('subprocess')", id="dunder-import"),
        pytest.param(
            "import importlib\nimportlib.import_module('pty')\n", "import_module('pty')", id="il"
        ),
        pytest.param(
            "import importlib\nimportlib.import_module(name)\n", "computed name", id="computed"
        ),
        pytest.param("import pty\n", "import pty", id="pty"),
    ],
)
def test_the_walker_finds_each_spelling(source: str, what: str) -> None:
    """The check above can fail: each way of spawning a process is reported."""
    findings = find_spawns(source)
    assert any(what in str(f) for f in findings), findings


@pytest.mark.parametrize(
    "source",
    [
        pytest.param("import os\nos.read(0, 1)\nos.path.join('a')\n", id="os-io"),
        pytest.param("import asyncio\nasyncio.create_task(x)\n", id="asyncio-task"),
        pytest.param("from concurrent.futures import ThreadPoolExecutor\n", id="thread-pool"),
        pytest.param("import importlib\nimportlib.import_module('json')\n", id="import-json"),
        pytest.param("def system(): ...\nsystem()\n", id="local-name"),
    ],
)
def test_the_walker_allows_ordinary_code(source: str) -> None:
    assert find_spawns(source) == []
