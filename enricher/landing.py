"""The landing page at ``/``: this node's GPUs and who is on them, self-contained HTML."""

from __future__ import annotations

import html
import time
from typing import TYPE_CHECKING

from . import __version__
from .config import Config

if TYPE_CHECKING:
    from .app import ScrapeResult


def render_landing(last: ScrapeResult | None, config: Config) -> str:
    """A small self-contained page: links and who was on the GPUs at the last scrape."""
    rows = []
    if last is not None:
        for a in sorted(last.attributions, key=lambda a: (a.process.gpu_index, a.process.pid)):
            p = a.process
            mem = "" if p.used_memory_bytes is None else f"{p.used_memory_bytes / 2**20:.0f} MiB"
            util = "" if p.sm_util_ratio is None else f"{p.sm_util_ratio * 100:.0f}%"
            device = f"{p.gpu_index}" + (f" / GI {p.gi_id}" if p.gi_id is not None else "")
            cells = [
                device,
                str(p.pid),
                a.comm,
                mem,
                util,
                a.pod.namespace if a.pod else "",
                a.pod.name if a.pod else "",
                a.container,
                f"{a.pod.workload_kind}/{a.pod.workload_name}" if a.pod else "",
                a.reason,
            ]
            rows.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>")
    banner = (
        "<p><strong>SIMULATED NODE</strong>: this is <code>dcgm-enricher demo</code>; no GPU, "
        "process or pod here is real.</p>"
        if config.simulated
        else ""
    )
    when = (
        time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(last.finished_at))
        if last
        else "no scrape yet: open /metrics or wait for Prometheus"
    )
    head = [
        "device",
        "pid",
        "process",
        "memory",
        "SM util",
        "namespace",
        "pod",
        "container",
        "workload",
        "unattributed reason",
    ]
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>dcgm-enricher</title>"
        "<meta http-equiv='refresh' content='15'>"
        "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:.2em .5em;text-align:left}</style></head><body>"
        f"<h1>dcgm-enricher {html.escape(__version__)}</h1>{banner}"
        "<p><a href='/metrics'>/metrics</a> · <a href='/healthz'>/healthz</a></p>"
        f"<h2>GPU processes at the last scrape ({html.escape(when)})</h2>"
        "<table><tr>"
        + "".join(f"<th>{h}</th>" for h in head)
        + "</tr>"
        + "".join(rows)
        + "</table></body></html>"
    )
