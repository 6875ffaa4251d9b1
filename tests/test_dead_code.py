"""No dead or test-only code in the package: every top-level name a module of enricher/
defines is used somewhere in enricher/ besides its definition.

A helper only the tests call belongs in tests/, and a constant nothing reads (a second copy of
a default, a list of names nobody consults) drifts from the one in use. The check reads the
package's code tokens (names, not strings or comments): a name counts as used wherever it
appears besides its definition; ``__all__`` lists count, as they are strings.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections import Counter
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
