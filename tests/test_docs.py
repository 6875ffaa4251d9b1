"""README and docs/ against the code: the flags reference generated from the argument parser,
every count and list the docs state against its source of truth, the README's size and its two
commands, and every relative link.

Sources of truth: ``enricher.cli.build_parser()`` (flags), ``rules/dcgm-enricher.rules.yaml``
(alerts, recording rules), ``grafana/dcgm-enricher.json`` (dashboard), the families the real app
renders into ``tests/golden/*.out`` (metrics), ``bench/README.md``'s last run (bench verdicts),
the Makefile (the README's commands). ``pytest tests/test_docs.py --update-golden`` rewrites
docs/flags.md.
"""

from __future__ import annotations

import argparse
import re
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from devkit.dashboard import BOARDS, alerts, dashboard, records
from enricher.cli import env_name

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
FLAGS_DOC = DOCS / "flags.md"
ALERTS_DOC = DOCS / "alerts.md"
METRICS_DOC = DOCS / "metrics.md"
DASHBOARD_DOC = DOCS / "dashboard.md"
PERFORMANCE_DOC = DOCS / "performance.md"
RULES = ROOT / "rules" / "dcgm-enricher.rules.yaml"
README_MAX_BYTES = 12 * 1024
# The README's opening commands, each a Makefile target a newcomer runs on a fresh machine.
FRONT_COMMANDS = ("make demo", "make test")
# Our families the golden outputs cannot show: rendered only when a flag switches them on.
OFF_BY_DEFAULT_FAMILIES = {
    "gpu_process_memory_used_bytes": "--collector.process",
    # Written only where the enricher's cgroup has a memory limit (a container's); the golden
    # outputs are made on a machine without one (tests/test_promclient.py writes it).
    "dcgm_enricher_memory_limit_bytes": "a cgroup memory limit",
}
OWN_FAMILY = re.compile(r"^(gpu_|dcgm_enricher_)\w+$")
# prometheus_client's families about the enricher's own process and interpreter.
RUNTIME_FAMILY = re.compile(r"^(process_|python_)\w+$")
# What the docs' prose may not carry: the project's internal issue numbers.
ISSUE_NUMBER = re.compile(r"(?<![\w/&`#])#\d+\b|\bissues? \d+\b", re.I)

GENERATED_NOTE = (
    "<!-- Generated from enricher.cli.build_parser() by tests/test_docs.py: do not edit.\n"
    "     After changing a flag: pytest tests/test_docs.py --update-golden -->"
)
# Python 3.10's BooleanOptionalAction appends this to every help; 3.11 and later do not.
_PY310_BOOL_SUFFIX = " (default: %(default)s)"


# --------------------------------------------------------------------------- helpers


def doc_files() -> list[Path]:
    """README and every page under docs/."""
    return [README, *sorted(DOCS.glob("*.md"))]


def prose(text: str) -> str:
    """Markdown without its fenced code blocks (where `#` starts a comment, not a heading)."""
    return re.sub(r"^(```|~~~).*?^\1[^\n]*$", "", text, flags=re.M | re.S)


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    return {github_anchor(h) for h in re.findall(r"^#+ (.+)$", prose(text), re.M)}


def markdown_tables(text: str) -> Iterator[list[list[str]]]:
    """Every table's body rows (header and rule left out), as lists of cells."""
    for block in re.findall(r"(?:^\|.*\|\n)+", prose(text), re.M):
        rows = [
            [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
            for line in block.splitlines()
        ]
        yield rows[2:]


def dashboard_panels() -> tuple[list[str], list[str]]:
    """The dashboards' rows and their panels (those that are not rows), by title."""
    panels = [p for board in BOARDS for p in dashboard(board)["panels"]]
    rows = [p["title"] for p in panels if p["type"] == "row"]
    others = [p["title"] for p in panels if p["type"] != "row"]
    return rows, others


def golden_families(pattern: re.Pattern[str]) -> set[str]:
    """The families matching ``pattern`` that the real app writes into the golden outputs."""
    return {
        m
        for f in (ROOT / "tests" / "golden").glob("*.out")
        for m in re.findall(r"^# TYPE (\S+) ", f.read_text(), re.M)
        if pattern.match(m)
    }


def rendered_families() -> set[str]:
    """The enricher's own families, as the real app writes them into the golden outputs, plus
    those only a flag switches on."""
    return golden_families(OWN_FAMILY) | set(OFF_BY_DEFAULT_FAMILIES)


def documented_families(text: str, heading: str = "Families") -> set[str]:
    """The families in the table of metrics.md's section ``heading`` (a row may name several)."""
    section = text.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    names: set[str] = set()
    for rows in markdown_tables(section):
        for row in rows:
            names |= set(re.findall(r"`((?:gpu_|dcgm_enricher_|process_|python_)\w+)`", row[0]))
    return names


# --------------------------------------------------------------------------- flags.md


def _subparsers(parser: argparse.ArgumentParser) -> argparse._SubParsersAction:  # type: ignore[type-arg]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action
    raise AssertionError("build_parser() has no commands")


def _flag_actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if a.option_strings and a.dest != "help"]


def _expand_help(action: argparse.Action, prog: str) -> str:
    """The help text as ``--help`` prints it, but the same on every Python."""
    text = action.help or ""
    if isinstance(action, argparse.BooleanOptionalAction) and text.endswith(_PY310_BOOL_SUFFIX):
        text = text[: -len(_PY310_BOOL_SUFFIX)]
    params = {k: v for k, v in vars(action).items() if v is not argparse.SUPPRESS}
    params["prog"] = prog
    if params.get("choices") is not None:
        params["choices"] = ", ".join(str(c) for c in params["choices"])
    return text % params


def _cell(text: str) -> str:
    """One table cell of plain text: ``label_<name>`` must not become an HTML tag."""
    text = " ".join(text.split())
    for char in "\\|<>*":
        text = text.replace(char, "\\" + char)
    return text


def render_flags_doc(parser: argparse.ArgumentParser) -> str:
    """docs/flags.md from the argument parser: the commands, then every flag with its
    environment variable, grouped by the commands that take it."""
    sub = _subparsers(parser)
    helps = {a.dest: a.help or "" for a in sub._choices_actions}
    commands = list(sub.choices)
    out = [
        "# Flags",
        "",
        GENERATED_NOTE,
        "",
        "Every flag can also be set by an environment variable: `ENRICHER_` and the flag's name",
        "in capitals, with `.` and `-` written `_` (`--upstream.url` is `ENRICHER_UPSTREAM_URL`).",
        "A flag on the command line wins over its variable. A boolean flag is switched off by its",
        "`--no-` form, and its variable takes `true` or `false` (`1`, `yes` and `on` are true as",
        "well, anything else is false). `dcgm-enricher COMMAND --help` prints these descriptions.",
        "More about each command: [commands.md](commands.md).",
        "",
        "## Commands",
        "",
        "| Command | What it does |",
        "| --- | --- |",
    ]
    accepted: dict[str, list[str]] = {}
    actions: dict[str, tuple[argparse.Action, str]] = {}
    for name, p in sub.choices.items():
        positionals = " ".join(
            f"{a.metavar or a.dest}..." if a.nargs == "+" else str(a.metavar or a.dest)
            for a in p._actions
            if not a.option_strings
        )
        out.append(
            f"| `{' '.join(filter(None, [parser.prog, name, positionals]))}` | "
            f"{_cell(helps[name])} |"
        )
        for action in _flag_actions(p):
            accepted.setdefault(action.option_strings[0], []).append(name)
            actions.setdefault(action.option_strings[0], (action, p.prog))
    groups: dict[tuple[str, ...], list[str]] = {}
    for flag, names in accepted.items():
        groups.setdefault(tuple(names), []).append(flag)
    order = list(accepted)  # the order of the first command's --help
    for names, flags in sorted(groups.items(), key=lambda g: order.index(g[1][0])):
        which = (
            "every command" if list(names) == commands else " and ".join(f"`{n}`" for n in names)
        )
        out += [
            "",
            f"## Flags of {which}",
            "",
            "| Flag | Environment variable | What it sets |",
            "| --- | --- | --- |",
        ]
        for flag in flags:
            action, prog = actions[flag]
            shown = ", ".join(f"`{o}`" for o in action.option_strings)
            if action.metavar is not None and action.nargs != 0:
                shown = f"`{flag} {action.metavar}`"
            out.append(f"| {shown} | `{env_name(flag)}` | {_cell(_expand_help(action, prog))} |")
    return "\n".join(out) + "\n"


def test_flags_doc_is_generated_from_the_parser(
    parser: argparse.ArgumentParser, update_golden: bool
) -> None:
    text = render_flags_doc(parser)
    if update_golden:
        FLAGS_DOC.write_text(text)
    assert FLAGS_DOC.read_text() == text, (
        "docs/flags.md differs from build_parser(); run pytest tests/test_docs.py --update-golden"
    )


def test_every_parser_flag_is_in_flags_doc_and_back(parser: argparse.ArgumentParser) -> None:
    sub = _subparsers(parser)
    in_parser = {
        o for p in sub.choices.values() for a in _flag_actions(p) for o in a.option_strings
    }
    in_doc = {
        flag
        for rows in markdown_tables(FLAGS_DOC.read_text())
        for row in rows
        if row[0].startswith("`--")
        for flag in re.findall(r"`(--[\w.-]+)", row[0])
    }
    assert in_doc == in_parser, (in_doc - in_parser, in_parser - in_doc)
    for rows in markdown_tables(FLAGS_DOC.read_text()):
        for row in rows:
            if row[0].startswith("`--"):
                flag = re.findall(r"`(--[\w.-]+)", row[0])[0]
                assert row[1] == f"`{env_name(flag)}`", row


def test_every_flag_named_in_the_docs_exists(parser: argparse.ArgumentParser) -> None:
    """A flag the prose names (``--upstream.url``) is one the parser has; dcgm-exporter's own
    flags (``--kubernetes-enable-pod-labels``, ``--collect-interval``) and kubectl's have no dot."""
    sub = _subparsers(parser)
    known = {o for p in sub.choices.values() for a in _flag_actions(p) for o in a.option_strings}
    for path in doc_files():
        named = set(
            re.findall(r"(?<![\w-])(--(?:no-)?[a-z]+\.[a-z][\w.-]*[a-z])", path.read_text())
        )
        assert named <= known, f"{path.name}: {sorted(named - known)}"


# --------------------------------------------------------------------------- README


def test_readme_is_a_front_page() -> None:
    data = README.read_bytes()
    assert len(data) <= README_MAX_BYTES, f"README is {len(data)} bytes, at most {README_MAX_BYTES}"
    text = data.decode()
    first_block = re.search(r"^```sh\n(.*?)^```", text, re.M | re.S)
    assert first_block is not None and text.index("```sh") < text.index("\n## "), (
        "README opens with a shell block"
    )
    makefile = (ROOT / "Makefile").read_text()
    for command in FRONT_COMMANDS:
        assert re.search(rf"^{re.escape(command)}\b", first_block[1], re.M), command
        target = command.split()[1]
        assert re.search(rf"^{target}:", makefile, re.M), f"the Makefile has no {target} target"


def test_no_internal_issue_numbers() -> None:
    for path in doc_files():
        found = ISSUE_NUMBER.findall(prose(path.read_text()))
        assert not found, f"{path.name}: {found}"


# --------------------------------------------------------------------------- counts and lists


def stated_counts(text: str, noun: str) -> list[int]:
    """Every ``<n> <noun>`` in prose (``21 alerts``, ``14 recording rules``)."""
    return [int(n) for n in re.findall(rf"\b(\d+)\s+{noun}\b", prose(text).replace("\n", " "))]


def test_stated_counts_match_the_sources() -> None:
    rows, panels = dashboard_panels()
    truth = {
        "alerts": len(alerts()),
        "recording rules": len(records()),
        r"(?:metric )?families of its own": len(rendered_families()),
        "dashboard rows": len(rows),
        "panels": len(panels),
    }
    stated_somewhere = set()
    for path in doc_files():
        text = path.read_text()
        for noun, count in truth.items():
            for n in stated_counts(text, noun):
                stated_somewhere.add(noun)
                assert n == count, f"{path.name} says {n} {noun}, the source has {count}"
    assert stated_somewhere == set(truth), set(truth) - stated_somewhere


def test_alerts_doc_lists_every_alert() -> None:
    text = ALERTS_DOC.read_text()
    table = {
        re.sub(r"[\[\]`]|\(.*\)", "", row[0])
        for rows in markdown_tables(text)
        for row in rows
        if row[0].lstrip("[`").startswith("Gpu")
    }
    assert table == set(alerts())


def test_alerts_doc_names_every_recording_rule() -> None:
    named = set(re.findall(r"`([a-z_]+:[a-z_]+:[a-z_0-9]+)`", ALERTS_DOC.read_text()))
    assert named == set(records()), (named - set(records()), set(records()) - named)


def test_metrics_doc_lists_every_family() -> None:
    documented = documented_families(METRICS_DOC.read_text())
    rendered = rendered_families()
    assert documented == rendered, (documented - rendered, rendered - documented)
    enricher_source = "".join(p.read_text() for p in (ROOT / "enricher").glob("*.py"))
    for family in OFF_BY_DEFAULT_FAMILIES:
        assert f'"{family}"' in enricher_source, f"the enricher no longer renders {family}"


def test_metrics_doc_lists_the_process_and_python_families() -> None:
    documented = documented_families(METRICS_DOC.read_text(), "Process and Python")
    rendered = golden_families(RUNTIME_FAMILY)
    assert rendered, "the golden outputs have no process_* or python_* family"
    assert documented == rendered, (documented - rendered, rendered - documented)


def test_dashboard_doc_names_every_row() -> None:
    rows, _ = dashboard_panels()
    # The table of the dashboards' rows (the other tables map panels to dashboards).
    section = DASHBOARD_DOC.read_text().split("### Their rows\n", 1)[1].split("\n#", 1)[0]
    table = [r[0] for t in markdown_tables(section) for r in t]
    assert set(table) == set(rows), (set(table) - set(rows), set(rows) - set(table))


def bench_verdicts() -> dict[str, bool]:
    """The target verdicts of the run bench/README.md shows: name -> met."""
    text = (ROOT / "bench" / "README.md").read_text()
    return {m[2]: m[1] == "ok" for m in re.finditer(r"^  \[(ok|MISS)\] (.+?): ", text, re.M)}


def test_performance_doc_follows_the_last_bench_run() -> None:
    verdicts = bench_verdicts()
    assert verdicts, "bench/README.md shows no Targets block"
    rows = {
        row[0].strip("`"): row[2]
        for t in markdown_tables(PERFORMANCE_DOC.read_text())
        for row in t
        if row[0].startswith("`")
    }
    assert set(rows) == set(verdicts), (set(rows) - set(verdicts), set(verdicts) - set(rows))
    for name, met in verdicts.items():
        assert rows[name].startswith("met") == met, (name, rows[name])


# --------------------------------------------------------------------------- links


def relative_links(text: str) -> Iterator[str]:
    for target in re.findall(r"\]\(([^)\s]+)\)", prose(text)):
        if not re.match(r"[a-z]+:", target):
            yield target


@pytest.mark.parametrize(
    "path",
    [
        *doc_files(),
        ROOT / "bench" / "README.md",
        ROOT / "tools" / "README.md",
        ROOT / "deploy" / "compose" / "README.md",
    ],
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_relative_links_resolve(path: Path) -> None:
    for target in relative_links(path.read_text()):
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        assert dest.exists(), f"{path.name}: {target}: no such file"
        if anchor and dest.suffix == ".md":
            assert anchor in anchors(dest.read_text()), f"{path.name}: {target}: no such anchor"


# --------------------------------------------------------------------------- install commands


def shell_commands(text: str) -> list[list[str]]:
    """The commands of each ```sh block, one list per block, continuation lines joined and
    comments dropped."""
    blocks = re.findall(r"^ *```sh\n(.*?)^ *```", text, re.M | re.S)
    out = []
    for block in blocks:
        joined = re.sub(r"\\\n\s*", " ", block)
        lines = (line.split(" #", 1)[0].strip() for line in joined.splitlines())
        out.append([line for line in lines if line and not line.startswith("#")])
    return out


def chart_installs(text: str) -> list[tuple[list[str], list[str]]]:
    """Every ``helm install`` of this repository's chart as an argument list, with the
    page's commands before it."""
    found = []
    commands = [command for block in shell_commands(text) for command in block]
    for i, command in enumerate(commands):
        args = shlex.split(command)
        if args[:2] == ["helm", "install"] and "./charts/dcgm-enricher" in args:
            found.append((args, commands[:i]))
    return found


def option(args: list[str], name: str) -> str | None:
    return next((args[i + 1] for i, a in enumerate(args[:-1]) if a == name), None)


INSTALL_PAGES = [README, DOCS / "install.md"]


@pytest.mark.parametrize("path", INSTALL_PAGES, ids=lambda p: p.name)
def test_sidecar_helm_installs_label_the_namespace_first(path: Path) -> None:
    """A sidecar install's pods need the privileged Pod Security level: before every
    documented ``helm install`` of the sidecar mode the page labels its namespace (or the chart
    creates it labelled, namespace.create), and none uses ``--create-namespace``, which makes a
    namespace without the label that the pods then fail."""
    installs = chart_installs(path.read_text())
    assert installs, f"{path.name} shows no helm install of the chart"
    for args, before in installs:
        command = " ".join(args)
        if "mode=gpu-operator" in command:
            continue  # the operator's namespace admits privileged pods
        assert "--create-namespace" not in args, command
        if "namespace.create=true" in command:
            continue
        namespace = option(args, "-n")
        label = f"kubectl label namespace {namespace} pod-security.kubernetes.io/enforce=privileged"
        assert label in before, f"{path.name}: {command} without `{label}` before it"


@pytest.mark.one_python
@pytest.mark.parametrize("path", INSTALL_PAGES, ids=lambda p: p.name)
def test_documented_helm_installs_render(path: Path) -> None:
    """Each documented ``helm install`` of the chart, as written (shell expansions left out),
    renders with the real Helm 3 and 4 (``helm template`` with the same arguments)."""
    from .helmreleases import releases, require

    for args, _ in chart_installs(path.read_text()):
        # A value the shell computes (a password's hash): the values file's stands in for it.
        kept = [
            a
            for i, a in enumerate(args)
            if "$" not in a and not (a.startswith("--set") and "$" in args[i + 1])
        ]
        for release in releases():
            proc = subprocess.run(
                [require(release).helm, "template", *kept[2:]],
                capture_output=True,
                text=True,
                timeout=60,
                cwd=ROOT,
                check=False,
            )
            assert proc.returncode == 0, f"{' '.join(kept)}: {proc.stderr}"


# --------------------------------------------------------------------------- the sources


def documented_sources() -> dict[str, tuple[str, str]]:
    """docs/sources.md's table: each source's name, its module and class."""
    rows = re.findall(
        r"^\| `(\w+)` \| `enricher/(\w+)\.py`, `(\w+)` \|",
        (DOCS / "sources.md").read_text(),
        re.MULTILINE,
    )
    return {name: (module, cls) for name, module, cls in rows}


def test_every_list_of_the_sources_names_all_of_them() -> None:
    """Each source's `source` label value is the name its class gives itself, and every place
    that lists the sources names each one (resourceslices was left out of four)."""
    import importlib

    table = documented_sources()
    assert len(table) >= 7, table
    for name, (module, cls) in table.items():
        assert getattr(importlib.import_module(f"enricher.{module}"), cls).name == name
    names = set(table)
    sources_doc = importlib.import_module("enricher.sources").Source.__doc__ or ""
    listings = {
        "README.md": re.search(r"one series per enabled source \(([^)]*)\)", README.read_text()),
        "docs/metrics.md": re.search(
            r"\| `dcgm_enricher_source_up` \|[^|]*\|[^(]*\(([^)]*)\)",
            (DOCS / "metrics.md").read_text(),
        ),
        "enricher.sources.Source": re.search(r"One data source: ([^.]*)\.", sources_doc),
    }
    for where, found in listings.items():
        assert found, f"{where} no longer lists the sources where this test looks"
        assert set(re.findall(r"\w+", found.group(1))) == names, where
    # The table the Scraper derives its sources from has each, in the documented order.
    assert [e.name for e in importlib.import_module("enricher.sourcetable").SOURCES] == list(table)


def test_per_collection_values_are_not_described_per_scrape() -> None:
    """The node side is read once per collection and shared by the scrapes of it (the default
    follow mode), so no help text of ours (as the golden outputs hold them) nor docs/metrics.md
    says a per-collection value is "on this scrape"."""
    texts = {f.name: f.read_text() for f in (ROOT / "tests" / "golden").glob("*.out")}
    texts["docs/metrics.md"] = (DOCS / "metrics.md").read_text()
    assert len(texts) > 5
    for where, text in texts.items():
        for line in text.splitlines():
            if line.startswith("# HELP DCGM_") or (where.endswith(".out") and "# HELP" not in line):
                continue
            assert "on this scrape" not in line, (where, line)


# --------------------------------------------------------------------------- architecture.md

# The modules whose tests are a file of their own name: the pure core's decisions.
CENTRAL_MODULES = (
    "attribution",
    "families",
    "rewrite",
    "power",
    "procfs",
    "nvml",
    "kube",
    "podparse",
    "nvmlparse",
)


def test_architecture_lists_every_module_and_its_tests() -> None:
    text = (DOCS / "architecture.md").read_text()
    rows = re.findall(r"^\| `(enricher/[\w/]+\.py)` \| [^|]+ \| ([^|]+) \|$", text, re.MULTILINE)
    listed = [module for module, _ in rows]
    actual = sorted(
        str(p.relative_to(ROOT))
        for p in (ROOT / "enricher").rglob("*.py")
        if not {"proto", "_build"} & set(p.parts)
    )
    assert sorted(listed) == actual, "docs/architecture.md's module table is out of date"
    for module, tests in rows:
        named = re.findall(r"`(tests/[\w/]+\.py)`", tests)
        assert named, module
        for test in named:
            assert (ROOT / test).is_file(), (module, test)
    for name in CENTRAL_MODULES:
        assert (ROOT / "tests" / f"test_{name}.py").is_file(), name
        assert f"`tests/test_{name}.py`" in dict(rows)[f"enricher/{name}.py"], name
