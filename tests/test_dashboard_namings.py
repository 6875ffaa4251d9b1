"""Every dashboard query that reads one of dcgm-exporter's fields answers the same, in the same
unit, whichever naming the exporter writes: on a fleet of 4.8's names, of the newest naming's,
and of both (a fleet in the middle of an upgrade).

Real parts: the enricher's own output on the demo node (the golden body of dcgm-exporter
4.8.4), its fields renamed and their values converted to each naming's unit by the field table
(enricher/dcgm_fields.json), an hour of it written into blocks by Prometheus 3.5's promtool, one
cluster per variant, and Prometheus 3.5 answering every shipped panel query (as Grafana asks
it, variables on All but the cluster) at the end of that hour. What is compared: each
variant's answer with the 4.8 cluster's, series by series (the cluster label aside), values
within a relative 1e-9 (a MiB times 1048576 is exact; a percent over 100 is the ratio's double).
"""

from __future__ import annotations

import math
import re
import subprocess
from collections.abc import Iterator

import pytest

from devkit.dashboard import Query, interpolate, queries
from devkit.prometheus import Server
from enricher.fieldtable import table

from .conftest import GOLDEN
from .promreleases import releases, require, serve

pytestmark = pytest.mark.one_python

BODY = GOLDEN / "demo-4.8.4.out"
STEP_S = 15
SPAN_S = 3600
END = 1_800_000_000
VARIANTS = ("old", "new", "mixed")
_LINE = re.compile(r"^(\w+)(\{.*\})? (\S+)$")


def _samples(text: str) -> list[tuple[str, str, float, bool]]:
    """(name, label block, value, counter) of each sample of an exposition text."""
    counters = set()
    out = []
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            if kind == "counter":
                counters.update((name, name + "_total"))
            continue
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        assert m, line
        if m[3] == "<volatile>":  # a golden file's stand-in for a time: one of the hour's
            m = _LINE.match(f"{m[1]}{m[2] or ''} {END - SPAN_S // 2}")
            assert m
        out.append((m[1], m[2] or "{}", float(m[3]), m[1] in counters))
    return out


def _variant(name: str, labels: str, variant: str, devices: dict[str, int]) -> tuple[str, float]:
    """The name a field has in ``variant`` and the factor to its unit there (``mixed``: every
    other device in the newest naming)."""
    found = table().lookup(name)
    if found is None or variant == "old":
        return name, 1.0
    uuid = re.search(r'UUID="([^"]*)"', labels)
    device = devices.setdefault(uuid[1] if uuid else "", len(devices))
    if variant == "mixed" and device % 2 == 0:
        return name, 1.0
    new = table().field(found.field).by_naming[table().namings[-1]]
    return new.name, found.scale / new.scale


def openmetrics(body: str) -> str:
    """An hour of ``body`` every STEP_S in each variant's cluster: gauges as they are, counters
    rising by their value every step."""
    lines = []
    samples = _samples(body)
    for variant in VARIANTS:
        devices: dict[str, int] = {}
        heads = []
        for name, labels, value, counter in samples:
            new_name, factor = _variant(name, labels, variant, devices)
            block = labels[:-1] + ("," if labels != "{}" else "") + f'cluster="{variant}"}}'
            heads.append((new_name + block, value * factor, counter))
        for k, t in enumerate(range(END - SPAN_S, END + 1, STEP_S)):
            for head, value, counter in heads:
                v = value * (k + 1) if counter else value
                lines.append(f"{head} {v!r} {t}")
    return "\n".join(lines) + "\n# EOF\n"


def _field_names() -> re.Pattern[str]:
    return re.compile(r"\b(" + "|".join(map(re.escape, table().all_names())) + r")\b")


def field_queries() -> list[Query]:
    names = _field_names()
    return [q for q in queries() if names.search(q.expr)]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    release = require(releases()[-1])
    tmp = tmp_path_factory.mktemp("namings")
    (tmp / "fleet.om").write_text(openmetrics(BODY.read_text()))
    storage = tmp / "tsdb"
    subprocess.run(
        [release.promtool, "tsdb", "create-blocks-from", "openmetrics", "fleet.om", str(storage)],
        cwd=tmp,
        check=True,
        capture_output=True,
        timeout=300,
    )
    config = {"global": {"scrape_interval": "15s"}}
    with serve(release, config, tmp / "prometheus", storage=storage) as running:
        yield running


def _answer(server: Server, q: Query, cluster: str) -> dict[tuple[tuple[str, str], ...], float]:
    expr = interpolate(q.expr, cluster=cluster)
    data = server.api("query", timeout=60, query=expr, time=str(END))
    out = {}
    for s in data["result"]:
        key = tuple(sorted((k, v) for k, v in s["metric"].items() if k not in ("cluster",)))
        out[key] = float(s["value"][1])
    return out


def test_the_variants_rename_and_rescale() -> None:
    text = openmetrics(BODY.read_text())
    newest = table().namings[-1]
    used = table().name("fb_used", newest)
    old = table().name("fb_used", table().namings[0])
    assert used != old and f"{used}{{" in text and f"{old}{{" in text
    assert f"{old}{{" not in "".join(line for line in text.splitlines() if 'cluster="new"' in line)


@pytest.mark.parametrize("variant", VARIANTS[1:])
@pytest.mark.parametrize("q", field_queries(), ids=lambda q: q.id)
def test_field_query_answers_the_same_on_every_naming(
    server: Server, q: Query, variant: str
) -> None:
    """The panel query on the ``variant`` cluster gives the 4.8 cluster's series and values."""
    expected = _answer(server, q, "old")
    got = _answer(server, q, variant)
    assert got.keys() == expected.keys(), q.expr
    for key, value in expected.items():
        assert math.isclose(got[key], value, rel_tol=1e-9, abs_tol=1e-12), (key, q.expr)


def test_the_field_queries_answer(server: Server) -> None:
    """The comparison above is not of empty answers: the field panels have data (the ones the
    demo does not feed aside, as in test_dashboard.py)."""
    answered = [q.id for q in field_queries() if _answer(server, q, "old")]
    assert len(answered) >= len(field_queries()) // 2, answered


def test_every_field_read_is_compared() -> None:
    """Each field any dashboard reads is in the demo's body (so it is compared), but those the
    demo does not serve (test_dashboard.py's NEEDS)."""
    names = _field_names()
    read = {
        found.field
        for q in queries()
        for n in names.findall(q.expr)
        if (found := table().lookup(n))
    }
    fed = {
        found.field for name, *_ in _samples(BODY.read_text()) if (found := table().lookup(name))
    }
    unfed = {
        "fabric_health",
        "uncorrectable_remapped_rows",
        "correctable_remapped_rows",
        "row_remap_failure",
    }
    assert read and read - fed <= unfed, read - fed
