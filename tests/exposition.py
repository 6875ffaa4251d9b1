"""A plain exposition writer for tests that write a body by hand (an upstream's, a fault's).

It was the demo's writer; the demo now writes each dcgm-exporter release's own dialect
(enricher.simnode.dialects), and the package's one writer is enricher.promclient.MetricWriter.
This one stays as the tests' independent second: test_promclient compares the two.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from enricher.textformat import format_value, render_labels


def float_text(value: float) -> str:
    """A sample value as a hand-written body writes it: ``NaN``, ``+Inf``, ``-Inf``, else
    Python's shortest round-trip form (``1.0``, not the ``1`` Prometheus writes)."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)


def escape_help(text: str) -> str:
    """Escape HELP text (backslash and newline)."""
    return text.replace("\\", "\\\\").replace("\n", "\\n")


@dataclass(slots=True)
class FamilyWriter:
    """Collects the enricher's own families and renders them as text exposition."""

    _families: dict[str, tuple[str, str, list[str]]] = field(default_factory=dict)

    def family(self, name: str, help_text: str, typ: str = "gauge") -> None:
        if name not in self._families:
            self._families[name] = (help_text, typ, [])

    def sample(
        self,
        name: str,
        labels: Iterable[tuple[str, str]],
        value: float,
        sample_name: str | None = None,
    ) -> None:
        self._families[name][2].append(
            f"{sample_name or name}{render_labels(labels)} {format_value(value)}"
        )

    def render(self, sort_key: Callable[[str], str] | None = None) -> str:
        out: list[str] = []
        for name, (help_text, typ, lines) in self._families.items():
            out.append(f"# HELP {name} {escape_help(help_text)}")
            out.append(f"# TYPE {name} {typ}")
            out.extend(sorted(lines, key=sort_key) if sort_key else lines)
        return "\n".join(out) + "\n" if out else ""
