"""The Python range pyproject.toml declares is the one `make test` runs the suite on."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Read with regexes: tomllib is 3.11+.
PYPROJECT = (ROOT / "pyproject.toml").read_text()
MAKEFILE = (ROOT / "Makefile").read_text()


def _minor(version: str) -> int:
    major, minor = version.split(".")
    assert major == "3", version
    return int(minor)


def _make_var(name: str) -> str:
    m = re.search(rf"^{name} \?= (\S+)$", MAKEFILE, re.M)
    assert m, name
    return m.group(1)


def declared() -> tuple[int, int]:
    """The lowest and the highest 3.x minor that requires-python admits."""
    m = re.search(r'^requires-python = ">=3\.(\d+),<3\.(\d+)"$', PYPROJECT, re.M)
    assert m, "requires-python must be a closed range: >=3.X,<3.Y"
    return int(m.group(1)), int(m.group(2)) - 1


def test_make_test_runs_the_lowest_and_the_highest_declared_python() -> None:
    assert (_minor(_make_var("PY_LOWEST")), _minor(_make_var("PY_HIGHEST"))) == declared()


def test_classifiers_name_every_declared_python() -> None:
    low, high = declared()
    named = {int(v) for v in re.findall(r'"Programming Language :: Python :: 3\.(\d+)"', PYPROJECT)}
    assert named == set(range(low, high + 1))


def test_linters_target_the_lowest_python() -> None:
    low, _ = declared()
    assert f'target-version = "py3{low}"' in PYPROJECT
    assert f'python_version = "3.{low}"' in PYPROJECT


def test_every_test_runs_on_the_highest_python_and_the_lowest_runs_every_python() -> None:
    """`make test`'s suites: the lowest Python's runs the files marked every_python
    (tests/conftest.py's EVERY_PYTHON) and the lowest_only ones, the highest's every test but
    the lowest_only ones, so that every test runs at least once; both run, side by side with
    lint and types, whatever the others' result (-k). The lowest's takes the dev profile's
    Hypothesis examples. The long run (test-deep) gives the lowest everything but the image
    and the one_python files."""
    recipe = MAKEFILE.split("\ntest:", 1)[1].split("\n\n", 1)[0]
    assert re.search(
        r"-k -j3 --output-sync=target static suite-lowest suite-highest$", recipe, re.M
    )
    static = MAKEFILE.split("\nstatic:\n", 1)[1].split("\n\n", 1)[0].strip()
    assert static == "$(MAKE) --no-print-directory lint typecheck TOOLS=$(LOWEST_BIN)"
    lowest = MAKEFILE.split("\nsuite-lowest:\n", 1)[1].split("\n\n", 1)[0].strip()
    highest = MAKEFILE.split("\nsuite-highest:\n", 1)[1].split("\n\n", 1)[0].strip()
    assert lowest == 'HYPOTHESIS_PROFILE=dev $(LOWEST_BIN)/pytest -m "every_python or lowest_only"'
    assert highest == '$(HIGHEST_BIN)/pytest -m "not lowest_only"'
    deep = MAKEFILE.split("\ntest-deep:", 1)[1].split("\n\n", 1)[0]
    assert """PYTEST_ARGS='-m "not image and not one_python"'""" in deep
    for mark in ("image", "one_python", "every_python", "lowest_only", "deep"):
        assert re.search(rf'^    "{mark}: ', PYPROJECT, re.M), mark


def test_every_python_names_test_files_that_exist() -> None:
    """A misspelt name in EVERY_PYTHON would drop a file from the lowest Python's suite
    without a word."""
    from .conftest import EVERY_PYTHON

    assert sorted(n for n in EVERY_PYTHON if not (ROOT / "tests" / n).is_file()) == []
