"""No dead or test-only code in the package: every top-level name a module of enricher/
defines is used somewhere in enricher/ besides its definition, and every method, field and
attribute a class of it defines is read somewhere in enricher/.

A helper only the tests call belongs in tests/, and a constant nothing reads (a second copy of
a default, a list of names nobody consults) drifts from the one in use. The check reads the
package's code tokens (names, not strings or comments): a name counts as used wherever it
appears besides its definition; ``__all__`` lists count, as they are strings.

Outside the package, what the kit (devkit/), the bench, the tools and the tests' helper
modules define is used somewhere in the tree (a cheaper reading by words: see
``unused_in_tree``).
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "enricher"
# Generated gRPC stubs and the build step are not ours to prune.
SKIPPED_PARTS = {"proto", "_build"}
# Names kept though nothing in the package calls them: the console script's entry point, and
# the PodResources source's pure parser of the bytes the kubelet sends (the source itself gets
# the message already decoded by gRPC; the parser is how tests feed it hostile bytes).
ENTRY_POINTS = {("enricher/cli.py", "main"), ("enricher/podresources.py", "parse_list_response")}


def package_files() -> list[Path]:
    return [p for p in sorted(PACKAGE.rglob("*.py")) if not SKIPPED_PARTS & set(p.parts)]


def top_level_names(tree: ast.Module) -> list[str]:
    names: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.append(node.name)
        elif isinstance(node, ast.Assign):
            names += [t.id for t in node.targets if isinstance(t, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.append(node.target.id)
    return [n for n in names if not (n.startswith("__") and n.endswith("__"))]


def code_names(text: str) -> list[str]:
    """The names in ``text``'s code (not in its strings or comments), and the entries of an
    ``__all__`` list."""
    names: list[str] = []
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.NAME:
            names.append(tok.string)
        elif tok.type == tokenize.STRING and "f" in tok.string.split("'")[0].split('"')[0].lower():
            # Before Python 3.12 an f-string is one STRING token: its fields' names are in it.
            names += re.findall(r"\w+", tok.string)
    exported = re.search(r"^__all__ = \[([^\]]*)\]", text, re.MULTILINE)
    return names + (re.findall(r"\w+", exported.group(1)) if exported else [])


def test_every_top_level_name_of_the_package_is_used_in_it() -> None:
    texts = {p: p.read_text() for p in package_files()}
    words = Counter(w for text in texts.values() for w in code_names(text))
    unused = [
        f"{p.relative_to(PACKAGE.parent)}: {name}"
        for p, text in texts.items()
        for name in top_level_names(ast.parse(text))
        if words[name] <= 1 and (str(p.relative_to(PACKAGE.parent)), name) not in ENTRY_POINTS
    ]
    assert unused == [], "defined in the package, used nowhere in it:\n" + "\n".join(unused)


def test_the_check_finds_an_unused_name() -> None:
    """The rule itself, on a module of two names of which one is never used."""
    text = (
        'USED = 1\nUNUSED_DEFAULT = 2\n\n\ndef f() -> int:\n    """UNUSED_DEFAULT"""\n'
        "    return USED\n"
    )
    words = Counter(code_names(text))
    assert [n for n in top_level_names(ast.parse(text)) if words[n] <= 1] == [
        "UNUSED_DEFAULT",
        "f",
    ]


# Members nothing in the package reads, kept on purpose. Each is a count or a check that the
# tests (and the bench) read to see which path ran, or a name a library calls.
READ_OUTSIDE = {
    ("enricher/kube.py", "get_return_type"): "the kubernetes client's Watch calls it",
    ("enricher/docker.py", "ping"): "the Docker source's health check, for its tests",
    ("enricher/episodes.py", "episodes_total"): "how many episodes were logged (tests)",
    ("enricher/nvml.py", "reinitializations_total"): "how often NVML was set up again (tests)",
    ("enricher/podresources.py", "calls_total"): "kubelet calls made (tests: coalescing)",
    ("enricher/refresh.py", "runs"): "refreshes run (tests: the rhythm)",
    ("enricher/refresh.py", "polls"): "upstream polls made (tests: the follower's cost)",
    ("enricher/rewrite.py", "fast_rewrites"): "which rewrite path served (tests, bench)",
    ("enricher/rewrite.py", "slow_rewrites"): "which rewrite path served (tests, bench)",
    ("enricher/rewrite.py", "repeated_rewrites"): "which rewrite path served (tests, bench)",
    ("enricher/rewrite.py", "templates_built"): "templates made (tests: no rebuild storm)",
    ("enricher/simnode/kubelet.py", "calls"): "the simulated kubelet's calls (tests)",
    ("enricher/webconfig.py", "bcrypt_checks"): "bcrypt runs (tests: the credential cache)",
    ("enricher/power.py", "power_source"): "which reading a draw came from (tests)",
    ("enricher/model.py", "driver_version"): "NVML's driver version (tests; ps may show it)",
}


def loaded_names(texts: Iterable[str]) -> Counter[str]:
    """How often each name is read in ``texts``: as an attribute, as a name, or as a string
    that is one (getattr, __slots__)."""
    loads: Counter[str] = Counter()
    for text in texts:
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
                loads[node.attr] += 1
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
                loads[node.id] += 1
            elif (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and node.value.isidentifier()
            ):
                loads[node.value] += 1
    return loads


def members(tree: ast.Module) -> Iterator[str]:
    """The methods, fields and ``self.`` attributes of every class in ``tree``."""
    for node in ast.walk(tree):
        if not isinstance(node, ast.ClassDef):
            continue
        for item in node.body:
            if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                yield item.name
            elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                yield item.target.id
        for sub in ast.walk(node):
            if isinstance(sub, ast.Assign | ast.AnnAssign | ast.AugAssign):
                targets = sub.targets if isinstance(sub, ast.Assign) else [sub.target]
                for t in targets:
                    if (
                        isinstance(t, ast.Attribute)
                        and isinstance(t.value, ast.Name)
                        and t.value.id == "self"
                    ):
                        yield t.attr


def unread_members(texts: Mapping[str, str]) -> list[str]:
    loads = loaded_names(texts.values())
    return sorted(
        {
            f"{where}: {name}"
            for where, text in texts.items()
            for name in members(ast.parse(text))
            if not (name.startswith("__") and name.endswith("__"))
            and loads[name] == 0
            and (where, name) not in READ_OUTSIDE
        }
    )


def test_every_member_of_the_packages_classes_is_read_in_it() -> None:
    texts = {str(p.relative_to(PACKAGE.parent)): p.read_text() for p in package_files()}
    unread = unread_members(texts)
    assert unread == [], "defined on a class in the package, read nowhere in it:\n" + "\n".join(
        unread
    )
    defined = {(where, name) for where, text in texts.items() for name in members(ast.parse(text))}
    stale = sorted(set(READ_OUTSIDE) - defined)
    assert stale == [], f"READ_OUTSIDE names what no longer exists: {stale}"


def test_the_check_finds_an_unread_member() -> None:
    text = (
        "class A:\n    size: int\n    def __init__(self) -> None:\n        self.count = 0\n"
        "        self.kept = 1\n    def used(self) -> int:\n        return self.kept\n"
        "    def unused(self) -> None:\n        self.count += 1\n\n\nA().used()\n"
    )
    assert unread_members({"m.py": text}) == ["m.py: count", "m.py: size", "m.py: unused"]


# --------------------------------------------------------------------------- kit, bench, tools

ROOT = PACKAGE.parent
# What the rule below reads: every Python file of the tree (the scripts too: the generators
# and the mixin's build load the kit), and what it checks: the code outside the package that
# is not a test module.
TREE = ("enricher", "devkit", "bench", "tools", "tests", "rules", "grafana", "mixin", "deploy")
KIT = ("devkit", "bench", "tools")


def kit_files() -> list[Path]:
    return [p for top in KIT for p in sorted((ROOT / top).rglob("*.py"))] + [
        p for p in sorted((ROOT / "tests").glob("*.py")) if not p.name.startswith("test_")
    ]


def class_fields(tree: ast.Module) -> Iterator[str]:
    """The methods and fields of the top-level classes in ``tree`` (not their ``self.``
    attributes: walking every method costs the check more than it finds in a kit)."""
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                    yield item.name
                elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    yield item.target.id


def unused_in_tree(texts: Mapping[str, str], checked: Iterable[str]) -> list[str]:
    """The top-level names and class members defined in the ``checked`` files whose word
    appears nowhere in ``texts`` besides its definition. Words, not tokens: a name a comment
    or a string elsewhere mentions counts as used; that keeps the whole tree's check at a
    fraction of a second. pytest's hooks (``pytest_*``) are called by pytest."""
    words = Counter(re.findall(r"\w+", "\n".join(texts.values())))
    return sorted(
        {
            f"{where}: {name}"
            for where in checked
            for tree in [ast.parse(texts[where])]
            for name in [*top_level_names(tree), *class_fields(tree)]
            if words[name] <= 1
            and not name.startswith("pytest_")
            and not (name.startswith("__") and name.endswith("__"))
        }
    )


def test_every_name_of_the_kit_bench_and_tools_is_used_in_the_tree() -> None:
    """What the kit, the bench, the tools and the tests' helper modules define, something uses:
    a helper nobody calls any more is deleted, not kept beside the one that replaced it."""
    paths = [p for top in TREE for p in (ROOT / top).rglob("*.py") if "fixtures" not in p.parts]
    texts = {str(p.relative_to(ROOT)): p.read_text() for p in paths}
    checked = [str(p.relative_to(ROOT)) for p in kit_files()]
    assert {"devkit/ports.py", "bench/run.py", "tools/load.py", "tests/harness.py"} <= set(checked)
    unused = unused_in_tree(texts, checked)
    assert unused == [], "defined in the kit, the bench or the tools, used nowhere:\n" + "\n".join(
        unused
    )


def test_the_tree_check_finds_an_unused_helper() -> None:
    kit = (
        "def used() -> int:\n    return 1\n\n\ndef unused() -> int:\n    return 2\n\n\n"
        "class Stand:\n    seen: int\n    forgotten: int\n\n"
        "    def pytest_configure(self) -> None: ...\n"
    )
    texts = {"devkit/k.py": kit, "tests/test_k.py": "from devkit.k import used\nused().seen\n"}
    assert unused_in_tree(texts, ["devkit/k.py"]) == [
        "devkit/k.py: Stand",
        "devkit/k.py: forgotten",
        "devkit/k.py: unused",
    ]
