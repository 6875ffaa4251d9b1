"""PromQL over a scraped text in Prometheus's own engine: ``promtool test rules`` with the
text's series held for some minutes, and expressions checked at a time."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from .tools import run_tool


def selector(name: str, labels: dict[str, str]) -> str:
    """``name{labels}`` as a series in a promtool test: Prometheus drops empty labels on
    ingestion; json.dumps quotes as PromQL strings do."""
    body = ",".join(f"{k}={json.dumps(v)}" for k, v in sorted(labels.items()) if v)
    return f"{name}{{{body}}}"


def held_series(text: str, minutes: int, prefixes: tuple[str, ...]) -> list[dict[str, str]]:
    """The samples of ``text`` whose names start with one of ``prefixes`` (NaN left out), each
    held at its value for ``minutes`` minutes, as a promtool test's ``input_series``."""
    out = []
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            value = float(s.value)
            if s.name.startswith(prefixes) and value == value:
                shown = str(int(value)) if value.is_integer() else repr(value)
                out.append({"series": selector(s.name, s.labels), "values": f"{shown}x{minutes}"})
    return out


def run(
    promtool: str, *args: str, cwd: Path | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """``promtool ARGS...``, its output as text (never raises on its exit status)."""
    return run_tool([promtool, *args], cwd=cwd, timeout=timeout)


def run_rule_tests(
    promtool: str,
    path: Path,
    series: list[dict[str, str]],
    checks: list[dict[str, Any]],
    *,
    rules: Sequence[Path] = (),
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    """``promtool test rules`` on one test (written to ``path``) of ``series`` at a
    one-minute interval, the ``promql_expr_test`` entries ``checks``, with ``rules``."""
    spec = {
        "rule_files": [str(r) for r in rules],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": series, "promql_expr_test": checks}],
    }
    path.write_text(json.dumps(spec, indent=1))  # JSON is YAML
    return run(promtool, "test", "rules", str(path), timeout=timeout)


def firing(
    text: str, path: Path, promtool: str, expr: str, want: list[Any], rules: Sequence[Path]
) -> str:
    """``rules`` run over ``text``'s gpu_ and DCGM_ series held for 30 minutes, ``expr``
    checked at 20m against ``want``; promtool's output (AssertionError on a mismatch)."""
    series = held_series(text, 30, ("gpu_", "DCGM_"))
    check = {"expr": expr, "eval_time": "20m", "exp_samples": want}
    res = run_rule_tests(promtool, path, series, [check], rules=rules)
    if res.returncode != 0:
        raise AssertionError(res.stdout + res.stderr)
    return res.stdout
