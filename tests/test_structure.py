"""The package's shape: a pure core that imports no I/O library, no import cycles, and no
state in a module."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "enricher"

# The pure core: attribution, the families, cgroup-path parsing, the text format, the label
# policy, the rewrite, the power split, the parsing of pod objects and of NVML's answers, and the
# types they share. The rule they keep: they take snapshots (upstream text, GPU processes, pid to
# pod, pods) and return output, with no I/O, no event loop, no globals and no mutation of their
# inputs; so none imports an I/O library.
PURE_MODULES = (
    "enricher.attribution",
    "enricher.families",
    "enricher.cgroups",
    "enricher.textformat",
    "enricher.labels",
    "enricher.rewrite",
    "enricher.model",
    "enricher.power",
    "enricher.memory",
    "enricher.selfmetrics",
    "enricher.podparse",
    "enricher.nvmlparse",
    "enricher.fieldtable",
    "enricher.readings",
    "enricher.bridge",
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


# What `dcgm-enricher serve` imports: the command line, the commands and the pipeline they wire.
SERVING_MODULES = ("enricher.cli", "enricher.commands", "enricher.app")
SIMULATION = ("enricher.simnode", "enricher.demo")


def _simulation(loaded: Iterable[str]) -> list[str]:
    return sorted(
        name for name in loaded for sim in SIMULATION if name == sim or name.startswith(sim + ".")
    )


def test_serving_imports_no_simulation() -> None:
    """The simulated node is the demo's, the tests' and the bench's: a serving enricher never
    loads it (the demo's commands import it when they run)."""
    loaded = loaded_after_import(SERVING_MODULES)
    assert set(SERVING_MODULES) <= set(loaded)
    assert _simulation(loaded) == []


def test_the_check_sees_the_simulation() -> None:
    """The check above can fail: the demo pulls the simulated node in."""
    assert "enricher.simnode.kubelet" in _simulation(loaded_after_import(["enricher.demo"]))


# --------------------------------------------------------------------------- one scheme each

# Generated gRPC stubs: protoc writes their imports.
GENERATED = ("enricher.proto",)


def absolute_package_imports(source: str, top: str = "enricher") -> list[str]:
    """The imports of ``source`` that name the package absolutely (``from enricher.x import``,
    ``import enricher.x``): inside the package every import of it is relative."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level == 0:
            names = [node.module or ""]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        found += [n for n in names if n == top or n.startswith(top + ".")]
    return found


def logger_names(source: str) -> list[str]:
    """The argument of each ``logging.getLogger(...)`` call of ``source``, as written."""
    return [
        ast.unparse(node.args[0]) if node.args else ""
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "getLogger"
    ]


def _ours() -> dict[str, str]:
    return {
        name: source
        for name, (source, _) in package_sources().items()
        if not name.startswith(GENERATED)
    }


def test_the_package_imports_itself_relatively() -> None:
    absolute = {n: found for n, s in _ours().items() if (found := absolute_package_imports(s))}
    assert absolute == {}


def test_every_logger_is_named_after_its_module() -> None:
    """``logging.getLogger(__name__)`` everywhere: a record's logger (in the log line, as
    ``%(name)s``) says which module wrote it, and ``enricher`` (what --log.level sets through
    the root) holds them all."""
    named = {n: names for n, s in _ours().items() if (names := logger_names(s)) != ["__name__"]}
    assert {n: names for n, names in named.items() if names} == {}


@pytest.mark.parametrize(
    ("source", "absolute", "loggers"),
    [
        pytest.param(
            "import logging\nfrom enricher.model import X\nlog = logging.getLogger('enricher')",
            ["enricher.model"],
            ["'enricher'"],
            id="absolute-and-fixed-name",
        ),
        pytest.param("import enricher.kube", ["enricher.kube"], [], id="import-statement"),
        pytest.param(
            "import logging\nfrom .model import X\nfrom enricherish import Y\n"
            "log = logging.getLogger(__name__)",
            [],
            ["__name__"],
            id="relative-and-module-name",
        ),
    ],
)
def test_the_scheme_checks(source: str, absolute: list[str], loggers: list[str]) -> None:
    assert absolute_package_imports(source) == absolute
    assert logger_names(source) == loggers


# A citation of the team's style guide, which lives outside the repository: a reader of a
# clone cannot follow it, so a file states the rule it keeps instead.
_STYLE_CITATION = re.compile(r"STYLE(?:\.md|\s+point)")
_NOT_OURS = {"build", "dist", "node_modules", "__pycache__"}


def test_no_file_cites_the_style_guide_outside_the_repository() -> None:
    files = []
    for folder, dirs, names in os.walk(ROOT):
        # The project's own files: not the virtual environments, caches and builds.
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in _NOT_OURS]
        files += [Path(folder, n) for n in names if n.endswith((".py", ".md", ".toml", ".yaml"))]
    assert Path(__file__) in files
    citing = [
        str(f.relative_to(ROOT))
        for f in files
        if _STYLE_CITATION.search(f.read_text(encoding="utf-8", errors="replace"))
    ]
    assert citing == []


# --------------------------------------------------------------------------- import cycles


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST, type_checking: bool = False) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement that runs, at module level or in a function; those under
    ``if TYPE_CHECKING:`` never run, so they make no cycle at run time (``type_checking``: count
    them too, as a reader and the type checker see them)."""
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If) and _is_type_checking(node.test) and not type_checking:
            stack.extend(node.orelse)
        else:
            stack.extend(ast.iter_child_nodes(node))


def import_graph(
    sources: Mapping[str, tuple[str, bool]],
    top: str | tuple[str, ...] = "enricher",
    *,
    type_checking: bool = False,
) -> dict[str, set[str]]:
    """Edges module -> modules of the top-level package(s) ``top`` it imports, from
    ``{module: (source, is_package)}`` (``type_checking``: imports under ``if TYPE_CHECKING:``
    too).

    ``from . import x`` and ``from .m import x`` are read as Python resolves them: ``x`` is the
    submodule when there is one, otherwise a name in ``m``.
    """
    tops = (top,) if isinstance(top, str) else top
    graph: dict[str, set[str]] = {name: set() for name in sources}
    for name, (source, is_package) in sources.items():
        package = name if is_package else name.rpartition(".")[0]
        for node in _imports(ast.parse(source), type_checking):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                if node.level:
                    base = package.split(".")
                    base = base[: len(base) - (node.level - 1)]
                    mod = ".".join(base + ([node.module] if node.module else []))
                else:
                    mod = node.module or ""
                targets = [
                    f"{mod}.{a.name}" if f"{mod}.{a.name}" in sources else mod for a in node.names
                ]
            for target in targets:
                while target and target not in sources:
                    target = target.rpartition(".")[0]  # import a.b.c names a.b.c's module
                if not target or target == name or target.split(".")[0] not in tops:
                    continue
                graph[name].add(target)
                # Importing a.b.c runs a.b first: an edge to each package above the target
                # that is not already running above the importer.
                parent = target.rpartition(".")[0]
                while parent and not (name + ".").startswith(parent + "."):
                    graph[name].add(parent)
                    parent = parent.rpartition(".")[0]
    return graph


def find_cycle(graph: Mapping[str, Iterable[str]]) -> list[str] | None:
    """One import cycle as ``[a, b, ..., a]``, or None when the graph has none."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)) is not None:
                return cycle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start)) is not None:
            return cycle
    return None


def package_sources() -> dict[str, tuple[str, bool]]:
    return {module_name(p): (p.read_text(), p.name == "__init__.py") for p in PACKAGE.rglob("*.py")}


def test_package_has_no_import_cycle() -> None:
    graph = import_graph(package_sources())
    assert {"enricher.cli", "enricher.commands", "enricher.rewrite"} <= set(graph)
    assert "enricher.textformat" in graph["enricher.rewrite"]
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or ())


def test_package_has_no_import_cycle_not_even_a_type_only_one() -> None:
    """A cycle through ``if TYPE_CHECKING:`` never runs, but it is still a circle a reader
    follows (the node page once named the scrape result of the app that serves it): the
    modules form layers, each reading only those below it."""
    cycle = find_cycle(import_graph(package_sources(), type_checking=True))
    assert cycle is None, "import cycle: " + " -> ".join(cycle or ())


def test_the_type_only_check_sees_a_type_only_cycle() -> None:
    sources = {
        "enricher.a": (
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import T",
            False,
        ),
        "enricher.b": ("from .a import f", False),
    }
    assert find_cycle(import_graph(sources)) is None
    assert find_cycle(import_graph(sources, type_checking=True)) == [
        "enricher.a",
        "enricher.b",
        "enricher.a",
    ]


@pytest.mark.parametrize(
    ("sources", "cycle"),
    [
        pytest.param(
            {"enricher.a": ("from .b import x", False), "enricher.b": ("import enricher.a", False)},
            ["enricher.a", "enricher.b", "enricher.a"],
            id="module-level",
        ),
        pytest.param(
            {
                "enricher.a": ("def f():\n    from . import b", False),
                "enricher.b": ("def g():\n    from enricher.c import y", False),
                "enricher.c": ("from .a import f", False),
            },
            ["enricher.a", "enricher.b", "enricher.c", "enricher.a"],
            id="function-level",
        ),
        pytest.param(
            {
                "enricher": ("", True),
                "enricher.p": ("from .. import q", True),
                "enricher.q": ("from .p.r import z", False),
                "enricher.p.r": ("", False),
            },
            ["enricher.p", "enricher.q", "enricher.p"],
            id="relative-from-a-package",
        ),
        pytest.param(
            {
                "enricher.a": (
                    "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import T",
                    False,
                ),
                "enricher.b": ("from .a import f", False),
            },
            None,
            id="type-checking-only",
        ),
        pytest.param(
            {"enricher.a": ("import asyncio\nfrom . import b", False), "enricher.b": ("", False)},
            None,
            id="no-cycle",
        ),
    ],
)
def test_find_cycle(sources: dict[str, tuple[str, bool]], cycle: list[str] | None) -> None:
    assert find_cycle(import_graph(sources)) == cycle


# --------------------------------------------------------------------------- state has an owner

# A module-level name a function changes in place with one of these is state of the module.
_MUTATORS = frozenset(
    {
        "add",
        "append",
        "appendleft",
        "clear",
        "discard",
        "extend",
        "insert",
        "move_to_end",
        "pop",
        "popitem",
        "popleft",
        "remove",
        "setdefault",
        "update",
    }
)


def module_state(source: str) -> list[str]:
    """The module-level names of ``source`` that its functions rebind (``global``) or change in
    place (item assignment or deletion, or a mutating method): a cache or memo of the module,
    shared by every object that uses it, where it should belong to an object its owner makes
    (two Scrapers in one process must not turn or fill each other's)."""
    tree = ast.parse(source)
    names: set[str] = set()
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else []
        if isinstance(node, ast.AnnAssign):
            targets = [node.target]
        names |= {t.id for t in targets if isinstance(t, ast.Name)}
    found: set[str] = set()
    for func in ast.walk(tree):
        if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        for node in ast.walk(func):
            if isinstance(node, ast.Global):
                found |= set(node.names)
            elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
                targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else []
                if isinstance(node, (ast.AugAssign, ast.AnnAssign)):
                    targets = [node.target]
                found |= {
                    t.value.id
                    for t in targets
                    if isinstance(t, ast.Subscript)
                    and isinstance(t.value, ast.Name)
                    and t.value.id in names
                }
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in _MUTATORS
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id in names
            ):
                found.add(node.func.value.id)
    return sorted(found)


def test_no_module_holds_state() -> None:
    """Every cache and memo belongs to an object its owner makes (the Scraper makes its own),
    never to a module. Bounded ``functools.lru_cache`` of pure functions of strings (names and
    HELP texts escaped once) are not state of the pipeline: they give the same answer to every
    caller."""
    held = {
        name: state
        for name, (source, _) in package_sources().items()
        if (state := module_state(source))
    }
    assert held == {}


@pytest.mark.parametrize(
    ("source", "state"),
    [
        pytest.param("_memo = {}\ndef f(k):\n    _memo[k] = 1", ["_memo"], id="item-assignment"),
        pytest.param(
            "_memo = {}\ndef f(k):\n    return _memo.pop(k, None)", ["_memo"], id="method"
        ),
        pytest.param(
            "_last = {}\ndef f(d):\n    global _last\n    _last = d", ["_last"], id="global"
        ),
        pytest.param(
            "TABLE = {'a': 1}\ndef f(k):\n    memo = {}\n    memo[k] = TABLE[k]\n    return memo",
            [],
            id="constant-and-local",
        ),
        pytest.param(
            "class C:\n    def __init__(self):\n        self.memo = {}\n"
            "    def f(self, k):\n        self.memo[k] = 1",
            [],
            id="an-objects-own",
        ),
    ],
)
def test_module_state(source: str, state: list[str]) -> None:
    assert module_state(source) == state


# The house's bounds on the centre: the Scraper wires its parts and holds no more than a dozen
# attributes; no module of the product is over about 600 lines.
MAX_SCRAPER_ATTRIBUTES = 12
MAX_MODULE_LINES = 600


def instance_attributes(source: str, cls: str) -> set[str]:
    """The ``self.X`` names a class's methods assign."""
    (node,) = [n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == cls]
    return {
        target.attr
        for sub in ast.walk(node)
        if isinstance(sub, (ast.Assign, ast.AnnAssign, ast.AugAssign))
        for target in (sub.targets if isinstance(sub, ast.Assign) else [sub.target])
        if isinstance(target, ast.Attribute)
        and isinstance(target.value, ast.Name)
        and target.value.id == "self"
    }


def test_the_scraper_holds_at_most_a_dozen_attributes() -> None:
    held = instance_attributes((PACKAGE / "pipeline.py").read_text(), "Scraper")
    assert len(held) <= MAX_SCRAPER_ATTRIBUTES, sorted(held)


def test_the_attribute_count_sees_every_assignment() -> None:
    source = (
        "class C:\n"
        "    def __init__(self):\n"
        "        self.a = 1\n        self.b: int = 2\n        x = self.c = 3\n"
        "    def m(self):\n        self.d += 1\n        other.e = 4\n"
    )
    assert instance_attributes(source, "C") == {"a", "b", "c", "d"}


def test_no_module_of_the_product_is_over_600_lines() -> None:
    long = {
        str(path.relative_to(ROOT)): n
        for path in sorted(PACKAGE.rglob("*.py"))
        if "proto" not in path.parts
        and (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert long == {}
