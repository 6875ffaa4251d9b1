"""Prometheus's own parsers as the oracle, batched: many outputs, one ``promtool`` run.

``promtool check metrics`` reads one exposition from standard input. To judge thousands of
property-test outputs in one run, each output's metric names get a prefix of its own
(``e17_``), so the outputs concatenate into one valid exposition exactly when each of them is
valid. A parse error names a line; the batch maps it back to the output it came from.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

_PARSE_ERROR = re.compile(r"line (\d+)")


@dataclass(frozen=True)
class Rejected:
    index: int  # which output
    line: str  # the offending line of that output (unprefixed)
    message: str


def _prefixed(index: int, text: str) -> list[str]:
    """``text`` (the enricher's canonical output) with every metric name prefixed."""
    prefix = f"e{index}_"
    out = []
    for line in text.split("\n"):
        if not line:
            continue
        if line.startswith(("# HELP ", "# TYPE ")):
            out.append(line[:7] + prefix + line[7:])
        elif line.startswith("#"):
            out.append(line)
        else:
            out.append(prefix + line)
    return out


def check_metrics_batch(promtool: str, texts: Sequence[str]) -> Rejected | None:
    """The first output that ``promtool check metrics`` rejects, or None when all parse.

    Lint remarks (exit code 3: naming, missing HELP) are not parse errors and are ignored.
    """
    lines: list[str] = []
    origin: list[tuple[int, str]] = []
    for i, text in enumerate(texts):
        for plain, line in zip([x for x in text.split("\n") if x], _prefixed(i, text), strict=True):
            lines.append(line)
            origin.append((i, plain))
    if not lines:
        return None
    body = "\n".join(lines) + "\n"
    res = subprocess.run(
        [promtool, "check", "metrics"],
        input=body.encode("utf-8"),
        capture_output=True,
        timeout=300,
        check=False,
    )
    if res.returncode in (0, 3):
        return None
    message = (res.stdout + res.stderr).decode("utf-8", "replace").strip()
    m = _PARSE_ERROR.search(message)
    if m is None or not 1 <= int(m.group(1)) <= len(origin):
        return Rejected(-1, "", message)
    index, line = origin[int(m.group(1)) - 1]
    return Rejected(index, line, message)
