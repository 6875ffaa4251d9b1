"""One table owns dcgm-exporter's contract: no field name of DCGM (``DCGM_FI_...``) is written in
any source of the product but enricher/dcgm_fields.json.

The scope is every tracked file of the package, the kit, the bench, the tools, the dashboards'
source, the mixin, the rules' generator, the recipes, the chart and the manifests. Outside it:
the tests (their hand-written and captured bodies, and the promtool tests' input series), the
docs, and the generated outputs (each one's generator is checked by its own test to be
up to date with its source, which is in scope). A mention of a family of fields by its prefix
(``DCGM_FI_PROF_*``, a relabelling regex ``DCGM_FI_PROF_.*``) names no field and is allowed.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from enricher.fieldtable import FieldName, table

ROOT = Path(__file__).resolve().parent.parent
TABLE = "enricher/dcgm_fields.json"
# What the generators write from sources that are in scope (grafana/generate.py,
# rules/generate.py, mixin/build.py, the chart's and the post-renderer's copies).
GENERATED = (
    re.compile(r"grafana/[^/]+\.json"),
    re.compile(r"mixin/dashboards/[^/]+\.json"),
    re.compile(r"rules/dcgm-enricher\.rules\.yaml"),
    re.compile(r"manifests/monitoring/(prometheusrule|grafana-dashboard)\.yaml"),
    re.compile(r"charts/dcgm-enricher/files/.*"),
    re.compile(r"deploy/dcgm-enricher-post-renderer/(prometheusrule|grafana-dashboard)\.yaml"),
    re.compile(r"deploy/autoscaling/prometheus-adapter\.yaml"),  # rules/generate.py
    re.compile(r"mixin/lib/dcgm_fields\.json"),  # the table's copy for a vendored mixin
)
OUT_OF_SCOPE = (
    re.compile(r"tests/.*"),
    re.compile(r"rules/[^/]+\.tests\.yaml"),  # promtool tests: their own input series
    re.compile(r".*\.md"),
    re.compile(r"LICENSE|CHANGELOG\.md"),
)
# A whole field name: a prefix followed by `*` or `.*` is a pattern over fields, not a field.
FIELD_NAME = re.compile(r"DCGM_FI_[A-Z0-9_]*[A-Z0-9](?![A-Za-z0-9_*.])")


def tracked_files() -> list[str]:
    # git ls-files: the tracked sources, not what a run of the tests or a build left behind.
    out = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.decode()
    return [p for p in out.split("\0") if p]


def in_scope(path: str) -> bool:
    if path == TABLE:
        return False
    return not any(p.fullmatch(path) for p in GENERATED + OUT_OF_SCOPE)


def test_no_field_name_outside_the_table() -> None:
    found = []
    for path in tracked_files():
        if not in_scope(path):
            continue
        try:
            text = (ROOT / path).read_text(encoding="utf-8")
        except (UnicodeDecodeError, FileNotFoundError):
            continue
        for number, line in enumerate(text.splitlines(), 1):
            for m in FIELD_NAME.finditer(line):
                found.append(f"{path}:{number}: {m.group(0)}")
    assert found == [], (
        "DCGM field names outside enricher/dcgm_fields.json (take them from "
        "enricher.fieldtable):\n" + "\n".join(found)
    )


def test_the_check_catches_a_name_and_spares_a_pattern() -> None:
    """The check's own oracle: a field name is caught wherever it stands, a prefix pattern is
    not (so the test above can fail)."""
    caught = [m.group(0) for m in FIELD_NAME.finditer("x DCGM_FI_DEV_FB_USED{a} (DCGM_FI_X)")]
    assert caught == ["DCGM_FI_DEV_FB_USED", "DCGM_FI_X"]
    assert (
        FIELD_NAME.findall("DCGM's profiling metrics (DCGM_FI_PROF_*) regex: DCGM_FI_PROF_.*") == []
    )
    assert in_scope("enricher/memory.py") and in_scope("mixin/alerts/alerts.libsonnet")
    assert not in_scope("grafana/dcgm-enricher.json") and not in_scope(TABLE)


def rename_rows() -> list[str]:
    """docs/compatibility.md's list of names, row by row, as the table has them."""
    t = table()

    def cell(n: FieldName | None) -> str:
        return f"`{n.name}` ({n.unit})" if n else "—"

    rows = []
    for f in t.fields.values():
        n48, n49, n410 = (f.by_naming.get(n) for n in ("4.8", "4.9", "4.10"))
        c49 = cell(n49) if n49 and (n48 is None or n49.name != n48.name) else "same"
        c410 = cell(n410) if n410 and n49 and n410.name != n49.name else "same"
        rows.append(f"| `{f.field}` | {cell(n48)} | {c49} | {c410} |")
    return rows


def test_the_compatibility_page_lists_the_tables_names() -> None:
    text = (ROOT / "docs" / "compatibility.md").read_text()
    block = re.search(r"<!-- the field table's renames.*?-->\n(.*?)<!-- end", text, re.S)
    assert block is not None
    listed = [line for line in block[1].splitlines() if line.startswith("| `")]
    assert listed == rename_rows(), "docs/compatibility.md's names differ from the table"
    assert table().namings == ("4.8", "4.9", "4.10"), "a new naming: add its column"
