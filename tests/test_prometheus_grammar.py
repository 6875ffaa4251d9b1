"""A real Prometheus (every release the tests know) is the judge of the text format.

One Prometheus per release scrapes, once a second:
- each line of a table *directly*, in a body of its own beside a valid sample: ``up`` says
  whether Prometheus's scrape parser accepts it, so the table of what the enricher drops
  (Python reads it, Prometheus does not) and keeps (odd but valid) is checked against the
  real parser, not against assumptions the code shares;
- the real ``dcgm-enricher serve`` process in front of an upstream that serves those lines
  and a sequence of hostile bodies: ``up`` must stay 1 on every scrape, and each body's valid
  canary sample must arrive.

No GPU and no cluster here: the enricher runs with NVML and the Kubernetes source off, so
what is under test is the upstream rewrite between two real processes.
"""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devkit.http import get
from devkit.ports import free_port
from devkit.processes import Commands
from devkit.prometheus import EVERY_SECOND
from devkit.upstream import TextServer
from tests.promreleases import PromRelease, serve

# Checks a real part against what does not depend on the Python running the tests: `make test`
# runs this file in the highest Python's suite only (the marker's text in pyproject.toml).
pytestmark = pytest.mark.one_python

ROOT = Path(__file__).resolve().parent.parent

# Lines Prometheus rejects though Python's float(), isdigit(), split() or isspace() accept
# them (or the enricher once "repaired" them); each fails a whole scrape when passed through.
REJECTED = {
    "arabic-indic-digits": 'x_weird{x="1"} \u0661\u0662',
    "nbsp-in-value": 'c{x="1"} 1\u00a02',
    "em-space-separator": 'c{x="1"}\u20031',
    "nbsp-after-name": 'c\u00a0{x="1"} 1',
    "overflow": 'c{x="1"} 1e400',
    "underscore": 'c{x="1"} 1_000',
    "negative-timestamp": 'c{x="1"} 1 -5',
    "timestamp-past-int64": 'c{x="1"} 1 9223372036854775808',
    "unicode-digit-timestamp": 'c{x="1"} 1 \u0661',
    "carriage-return": 'c{x="1"} 1\r',
    "unknown-type": "# TYPE c Gauge",
    "invalid-utf8-label": 'c{x="\udcff"} 1',
}
# Odd lines Prometheus accepts: the enricher must keep their samples.
ACCEPTED = {
    "infinity": 'k{x="inf"} Infinity',
    "lower-nan": 'k{x="nan"} nan',
    "tabs": 'k{x="tab"}\t1',
    "trailing-blanks": 'k{x="trail"} 1 \t',
    "blanks-in-block": 'k{ x = "blank" , } 1',
    "leading-dot": 'k{x="dot"} .5',
    "unusual-escape-free": 'k{x="\u2028\u00a0"} 1',
    "nul-in-label": 'k{x="a\x00b"} 1',
    "nul-in-help": "# HELP k nul \x00 inside",
}
CANARY = "hostile_canary"
# A sequence of whole bodies the upstream serves in turn (each also carries the canary).
SEQUENCE = [
    "\n".join(REJECTED.values()),
    "\n".join(ACCEPTED.values()),
    '# HELP c bad \\q escape\nc{x="\\q"} 1\n# TYPE c counter\nc 1',
    "c 1\r\nd 2\r\n",
    "\n".join(f'dup{{l="{"v" * 1024}{i}"}} {i}' for i in range(3)),
    '{"utf8.name"} 1\n{__name__="q"} 1\nq{__x="1"} 1',
]


def _body(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


class Upstream(TextServer):
    """Serves ``/raw/<name>`` (one table line and a valid sample) and ``/seq`` (the body of
    the sequence in turn, one step per request)."""

    def __init__(self) -> None:
        self.raw = {n: _body(f"ok 1\n{line}\n") for n, line in {**REJECTED, **ACCEPTED}.items()}
        self.step = 0
        self.lock = threading.Lock()
        super().__init__(self._answer)

    def _answer(self, path: str) -> bytes:
        if path.startswith("/raw/"):
            return self.raw.get(path[5:], b"")
        with self.lock:
            k = self.step
            self.step += 1
        text = SEQUENCE[k % len(SEQUENCE)]
        return _body(f'{text}\n{CANARY}{{step="{k % len(SEQUENCE)}"}} {k}\n')


class Judge:
    def __init__(self, url: str, logs: Path) -> None:
        self.url = url
        self.logs = logs

    def query(self, promql: str) -> list[dict[str, Any]]:
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        body = json.loads(get(url))
        assert body["status"] == "success", body
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    def values(self, promql: str) -> dict[str, float]:
        """``{job or step: value}`` of an instant query."""
        out = {}
        for r in self.query(promql):
            key = r["metric"].get("step") or r["metric"].get("job", "")
            out[key] = float(r["value"][1])
        return out


@pytest.fixture(scope="module")
def judge(prom_release: PromRelease, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Judge]:
    tmp = tmp_path_factory.mktemp(f"grammar-{prom_release.version}")
    upstream = Upstream()
    stack = contextlib.ExitStack()
    try:
        commands = stack.enter_context(Commands(tmp))
        enricher_port = free_port()
        commands.start(
            "enricher",
            [
                sys.executable,
                "-m",
                "enricher",
                "serve",
                f"--web.listen-address=127.0.0.1:{enricher_port}",
                f"--upstream.url=http://127.0.0.1:{upstream.port}/seq",
                "--no-nvml.enabled",
                "--no-kube.enabled",
                "--upstream.follow-step=0",  # every scrape asks the upstream: one step each
            ],
        )
        jobs = [
            {
                "job_name": f"raw-{name}",
                "static_configs": [{"targets": [f"127.0.0.1:{upstream.port}"]}],
                "metrics_path": f"/raw/{name}",
            }
            for name in upstream.raw
        ]
        jobs.append(
            {
                "job_name": "enriched",
                "honor_labels": True,
                "static_configs": [{"targets": [f"127.0.0.1:{enricher_port}"]}],
            }
        )
        # Twice a second: the setup waits for every body of the sequence twice over (the
        # enricher answers in milliseconds; the bound leaves room on a loaded machine).
        config = {
            "global": {**EVERY_SECOND, "scrape_interval": "500ms", "scrape_timeout": "500ms"},
            "scrape_configs": jobs,
        }
        prom = stack.enter_context(serve(prom_release, config, tmp))
        built = Judge(prom.url, tmp)
        deadline = time.monotonic() + 60
        # Every body of the sequence seen twice through the enricher, and every raw target
        # scraped a few times.
        want = 2 * len(SEQUENCE)
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError, ValueError, KeyError, AssertionError):
                scrapes = built.values('count_over_time(up{job="enriched"}[5m])')
                raw = built.values('count_over_time(up{job=~"raw-.*"}[5m])')
                enough = scrapes.get("enriched", 0) >= want and len(raw) == len(upstream.raw)
                if enough and min(raw.values()) >= 3:
                    break
            time.sleep(0.5)
        else:
            pytest.fail(
                "Prometheus did not scrape enough in 60 s:\n"
                + prom.log_tail()[-2000:]
                + commands.tail("enricher")[-2000:]
            )
        yield built
    finally:
        stack.close()
        upstream.close()


def test_prometheus_rejects_what_python_accepts(judge: Judge) -> None:
    """The table's claims, judged by the real scrape parser: every REJECTED line fails its
    target's scrape, every ACCEPTED one passes."""
    up = judge.values('max_over_time(up{job=~"raw-.*"}[5m])')
    assert {n: up[f"raw-{n}"] for n in REJECTED} == dict.fromkeys(REJECTED, 0.0)
    assert {n: up[f"raw-{n}"] for n in ACCEPTED} == dict.fromkeys(ACCEPTED, 1.0)


def test_enricher_scrape_never_fails_on_hostile_bodies(judge: Judge) -> None:
    """Finding 1 of issue 12: whatever the upstream sends, up == 1 on every scrape."""
    assert judge.values('min_over_time(up{job="enriched"}[5m])') == {"enriched": 1.0}
    assert judge.values('count_over_time(up{job="enriched"}[5m])')["enriched"] >= 2 * len(SEQUENCE)
    # Every body's canary came through, so no body was served empty.
    steps = judge.values(f"count_over_time({CANARY}[5m])")
    assert set(steps) == {str(k) for k in range(len(SEQUENCE))}


def test_accepted_lines_keep_their_samples(judge: Judge) -> None:
    got = {r["metric"]["x"] for r in judge.query('last_over_time(k{job="enriched"}[5m])')}
    assert got == {"inf", "nan", "tab", "trail", "blank", "dot", "\u2028\u00a0", "a\x00b"}


def test_rejected_lines_are_counted(judge: Judge) -> None:
    counted = judge.values(
        'max_over_time(dcgm_enricher_upstream_invalid_lines{job="enriched"}[5m])'
    )
    assert counted and max(counted.values()) >= len(REJECTED)
    # Nothing of a rejected line leaked through in another form.
    assert judge.query('x_weird{job="enriched"}') == []
    assert judge.query('{job="enriched",x="1"}') == []
