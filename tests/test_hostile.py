"""Hostile input: property tests over the whole scrape, and the bounds on everything.

The main property drives the real :class:`enricher.pipeline.Scraper` (upstream over real HTTP, the
real ProcfsSource on a /proc tree written per example, pods through the real
``podparse.parse_pod``) with an upstream exposition and pod metadata chosen to break exposition
or PromQL: arbitrary metric and label names, label values with quotes, backslashes, newlines,
``}`` and any Unicode, very long values, NaN and +/-Inf, timestamps, comments, HELP escapes
and junk lines. prometheus_client's parser is the oracle: the output must parse, hold the
input's samples with exactly the intended pod labels, and name each pod as its metadata says,
escaped and cut to 1024 characters.

Stand-ins: NVML answers through a snapshot source and the pod watch through a fixed index
(no GPU and no cluster here); both are fed by the example.

Example counts follow the hypothesis profile (conftest.py: ``ci`` when CI is set), scaled
per test: CI runs 1500 whole scrapes and 3000 renders, about two minutes on two cores; the
developer profile a tenth of that.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import shutil
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from enricher.app import make_app, serve
from enricher.attribution import attribute
from enricher.families import RenderOptions, render_families
from enricher.labels import RewritePlan
from enricher.model import (
    CgroupRef,
    GpuDevice,
    GpuProcess,
    GpuSnapshot,
    PodIndex,
    PodInfo,
    ProcError,
    ProcInfo,
    Runtime,
)
from enricher.pipeline import MAX_IDENTITIES, Scraper
from enricher.podparse import build_index, parse_pod
from enricher.procfs import ProcfsSource
from enricher.rewrite import Rewriter
from enricher.simnode import fakeproc
from enricher.sources import ReadResult
from enricher.textformat import LABEL_NAME_RE, MAX_LABEL_VALUE_LENGTH
from enricher.upstream import UpstreamError, fetch_upstream
from tests.exposition import float_text
from tests.promcheck import check_metrics_batch
from tests.scraping import PER_SCRAPE, NoProcs

NODE = "gpu-node-h"
GPUS = (
    "GPU-0a0a0a0a-0000-4000-8000-00000000000a",
    "GPU-1b1b1b1b-0000-4000-8000-00000000001b",
)
ABSENT_GPU = "GPU-2c2c2c2c-0000-4000-8000-00000000002c"  # in the upstream, not in NVML
LIMIT = MAX_LABEL_VALUE_LENGTH
OURS = (
    "gpu_container_",
    "gpu_process_",
    "gpu_unattributed_",
    "gpu_pod_info",
    "dcgm_enricher_",
    "process_",  # prometheus_client's, about the enricher's own process and interpreter
    "python_",
)
SUFFIXES = ("_total", "_bucket", "_sum", "_count", "_created", "_info", "_gsum", "_gcount")
LABEL_KEY = "team"
ANNOTATION_KEY = "hub.jupyter.org/username"


def examples(factor: float) -> int:
    """This test's example count: the profile's (tests/conftest.py: dev 50, ci 200, deep 4000)
    times ``factor``."""
    return max(10, int(settings().max_examples * factor))


# --------------------------------------------------------------------------- strategies

# Text that breaks exposition or PromQL when written unescaped.
BREAKERS = [
    '"',
    "\\",
    "\n",
    "}",
    '"} 1\nfake_metric{pod="x"} 1',
    '\\"',
    "\\n",
    '") or vector(1) #',
    '=~".*"',
    "\r\n",
    "\u2028",
    "# HELP",
    "{",
    ",",
]
# Longer than the 1024-character cut, or just under it (escaping doubles some characters).
# No long runs of backslashes: the oracle parser is quadratic in them (the explicit example
# in test_long_backslash_run covers one).
_long = st.tuples(
    st.sampled_from(['"', "\\a", "é", "}", "a", "\n", 'x"\\}', "\U0001f600"]),
    st.integers(1000, 1100),
).map(lambda t: (t[0] * t[1])[: t[1]])
_breakers = st.lists(st.sampled_from(BREAKERS), max_size=5).map("".join)
# Any text but lone surrogates (not text: undecodable bytes are junk below).
_TEXT_CHARS = st.characters(exclude_categories=("Cs",))
_any_text = st.text(_TEXT_CHARS, max_size=24)
# one_of draws its branches about evenly: text 10 in 15, breakers 4 in 15, long 1 in 15.
hostile = st.one_of(*[_any_text] * 10, *[_breakers] * 4, _long)
hostile_nonempty = hostile.filter(bool)
_FIRST = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_"
_REST = _FIRST + "0123456789"
_RESERVED_LABELS = frozenset(
    {
        "UUID",
        "uuid",
        "GPU_I_ID",
        "pod",
        "namespace",
        "container",
        "pod_name",
        "pod_namespace",
        "container_name",
        "vgpu",
        "le",
        "quantile",
    }
)
# Names built from characters (from_regex is slow to draw from, and these run thousands of
# times); the identity labels the enricher copies are among the candidates on purpose.
label_names = st.one_of(
    st.sampled_from(["gpu", "device", "modelName", "Hostname", "hostname", "DCGM_FI_DRIVER"]),
    st.tuples(st.sampled_from(_FIRST), st.text(_REST, max_size=10)).map("".join),
).filter(lambda n: n not in _RESERVED_LABELS and not n.startswith("__"))  # "__": Prometheus's
metric_names = (
    st.tuples(st.sampled_from(_FIRST + ":"), st.text(_REST + ":", max_size=16))
    .map("".join)
    .filter(lambda n: not n.startswith(("gpu_", *OURS)) and not n.endswith(SUFFIXES))
)
values = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(2**53), max_value=2**53).map(float),
)


def esc_label(v: str) -> str:
    """The generator's own escaping, written independently of the code under test."""
    return "".join({"\\": "\\\\", '"': '\\"', "\n": "\\n"}.get(ch, ch) for ch in v)


def esc_help(v: str) -> str:
    return "".join({"\\": "\\\\", "\n": "\\n"}.get(ch, ch) for ch in v)


def block(labels: Sequence[tuple[str, str]]) -> str:
    return "{" + ",".join(f'{k}="{esc_label(v)}"' for k, v in labels) + "}" if labels else ""


_UUIDS = st.sampled_from([*GPUS, ABSENT_GPU, 'GPU-"\\\n}'])
_label_dicts = st.dictionaries(label_names, hostile, max_size=2)
_one_in_5 = st.integers(0, 4)
_one_in_7 = st.integers(0, 6)
_one_in_4 = st.integers(0, 3)


@st.composite
def _label_sets(draw: st.DrawFn) -> list[tuple[str, str]]:
    labels = list(draw(_label_dicts).items())
    if draw(st.booleans()):
        labels.append(("UUID", draw(_UUIDS)))
        if draw(_one_in_5) == 0:
            labels.append(("GPU_I_ID", "1"))
        if draw(_one_in_7) == 0:
            labels.append(("vgpu", "0"))
        if draw(st.booleans()):
            # dcgm-exporter's own (possibly wrong) pod labels, some or all of them.
            for name in ("container", "namespace", "pod"):
                if draw(_one_in_4) != 0:
                    labels.append((name, draw(hostile)))
    return draw(st.permutations(labels))


label_sets = _label_sets()


# Lines that Python's float(), isdigit(), split() or isspace() accept and Prometheus's parsers
# reject (finding 1 of issue 12), and escapes Python would "repair" (finding 4). Each must be
# dropped and counted, never passed through or changed into a valid line.
PYTHON_ONLY_VALUES = [
    "\u0661\u0662",  # Arabic-Indic digits
    "1\u00a02",  # a no-break space inside the value
    "\u00a01",
    "1\u2003",
    "1\r",
    "1e400",
    "-1e309",
    "1_000",
    "0x1p3",
    "nan_",
    "+nan",
    "1 -5",  # signed timestamps: the scrape lexer takes digits only
    "1 +5",
    "1 9223372036854775808",  # past int64
    "1 \u0661",
]
PYTHON_ONLY_LINES = st.one_of(
    st.tuples(metric_names, st.sampled_from(PYTHON_ONLY_VALUES)).map(
        lambda t: f'{t[0]}{{a="1"}} {t[1]}'
    ),
    st.tuples(metric_names, st.sampled_from(PYTHON_ONLY_VALUES)).map(lambda t: f"{t[0]} {t[1]}"),
    st.tuples(
        metric_names,
        st.sampled_from(['a="\\q"', 'a="\udcff"', 'a\u00a0="1"', 'a="1"\u00a0']),
    ).map(lambda t: f"{t[0]}{{{t[1]}}} 1"),
    st.tuples(metric_names, st.sampled_from(["\u00a0", "\u2003", "\u3000", "\x0b"])).map(
        lambda t: f'{t[0]}{t[1]}{{a="1"}} 1'
    ),
    st.tuples(metric_names, st.sampled_from(["\\q", "\udcff"])).map(
        lambda t: f"# HELP {t[0]} bad {t[1]}"
    ),
    st.tuples(metric_names, st.sampled_from(["gauge\u00a0", "Gauge", "info"])).map(
        lambda t: f"# TYPE {t[0]} {t[1]}"
    ),
)
JUNK = st.one_of(
    st.just("..."),
    PYTHON_ONLY_LINES,
    st.text(max_size=20).filter(lambda t: "\n" not in t).map(lambda t: "{" + t),
    st.text(max_size=20).filter(lambda t: "\n" not in t).map(lambda t: "9" + t),
    st.tuples(metric_names, st.text(max_size=20)).map(
        lambda t: t[0] + "{" + t[1].replace("}", "").replace("\n", "") + " 1"
    ),
    st.tuples(metric_names, st.text(_FIRST, min_size=1, max_size=8))
    .filter(lambda t: not _is_number(t[1]))
    .map(lambda t: f"{t[0]} {t[1]}"),
    metric_names,
    st.text(max_size=30).filter(lambda t: "\n" not in t).map(lambda t: "# " + t),
    st.just("# TYPE"),
    st.just("# HELP"),
)


def _is_number(word: str) -> bool:
    try:
        float(word)
    except ValueError:
        return False
    return True


_names = st.lists(metric_names, max_size=4, unique=True)
_types = st.sampled_from(["gauge", "counter", "untyped", "histogram", None])
_samples_per_family = st.integers(0, 3)
_timestamps = st.integers(0, 2**41)
_bucket_steps = st.integers(0, 9)
_junk_lines = st.lists(JUNK, max_size=3)


@st.composite
def upstream_texts(draw: st.DrawFn) -> tuple[str, str]:
    """(the whole upstream body, its valid part alone)."""
    names = draw(_names)
    lines: list[str] = []
    for name in names:
        typ = draw(_types)
        if draw(st.booleans()):
            lines.append(f"# HELP {name} {esc_help(draw(hostile))}")
        if typ is not None:
            lines.append(f"# TYPE {name} {typ}")
        seen: set[frozenset[tuple[str, str]]] = set()
        for _ in range(draw(_samples_per_family)):
            labels = draw(label_sets)
            # One series once: as Prometheus sees it, label order and empty labels aside.
            key = frozenset((k, v) for k, v in labels if v)
            if key in seen:
                continue
            seen.add(key)
            ts = f" {draw(_timestamps)}" if draw(_one_in_4) == 0 else ""
            if typ == "histogram":
                count = 0
                for le in ("0.5", "1", "+Inf"):
                    count += draw(_bucket_steps)
                    lines.append(f"{name}_bucket{block([*labels, ('le', le)])} {count}{ts}")
                lines.append(f"{name}_sum{block(labels)} {float_text(draw(values))}{ts}")
                lines.append(f"{name}_count{block(labels)} {count}{ts}")
            else:
                lines.append(f"{name}{block(labels)} {float_text(draw(values))}{ts}")
    valid = "\n".join(lines) + "\n" if lines else ""
    mixed = list(lines)
    for junk in draw(_junk_lines):
        mixed.insert(draw(st.integers(0, len(mixed))), junk)
    return "\n".join(mixed) + "\n" if mixed else "", valid


@dataclass(frozen=True)
class PodSpec:
    uid: str
    name: str
    namespace: str
    container: str
    team: str
    user: str

    @property
    def container_id(self) -> str:
        return self.uid.replace("-", "") * 2

    def obj(self) -> dict[str, Any]:
        return {
            "metadata": {
                "uid": self.uid,
                "name": self.name,
                "namespace": self.namespace,
                "labels": {LABEL_KEY: self.team},
                "annotations": {ANNOTATION_KEY: self.user},
            },
            "spec": {"nodeName": NODE, "containers": [{"name": self.container}]},
            "status": {
                "containerStatuses": [
                    {"name": self.container, "containerID": f"containerd://{self.container_id}"}
                ]
            },
        }


@dataclass(frozen=True)
class ProcSpec:
    pid: int
    gpu: int
    owner: int  # index into the pods; -1: a host process; -2: a pod the API does not know
    memory: int | None
    util: float | None
    comm: str


def uid(i: int) -> str:
    return f"{i:08x}-abcd-4000-8000-{i:012x}"


_comms = st.text(
    alphabet=st.characters(codec="utf-8", exclude_characters="\0"),
    min_size=1,
    max_size=15,
)
_memories = st.one_of(st.none(), st.integers(0, 2**40))
_utils = st.one_of(st.none(), st.floats(0, 1))
_pod_counts = st.integers(0, 4)
_proc_counts = st.integers(0, 6)
_gpus = st.integers(0, 1)
_owners = [st.integers(-2, n - 1) for n in range(5)]


@st.composite
def nodes(draw: st.DrawFn) -> tuple[list[PodSpec], list[ProcSpec]]:
    n = draw(_pod_counts)
    pods = [
        PodSpec(
            uid(i + 1),
            draw(hostile_nonempty),
            draw(hostile_nonempty),
            draw(hostile),
            draw(hostile),
            draw(hostile),
        )
        for i in range(n)
    ]
    # Names past the 1024-character cut that collide once cut are test_cut_names_collide's.
    assume(len({(p.namespace[:LIMIT], p.name[:LIMIT]) for p in pods}) == len(pods))
    procs = [
        ProcSpec(
            1000 + i,
            draw(_gpus),
            draw(_owners[n]),
            draw(_memories),
            draw(_utils),
            draw(_comms),
        )
        for i in range(draw(_proc_counts))
    ]
    return pods, procs


# --------------------------------------------------------------------------- stand-ins


class SnapshotSource:
    """Stands in for NVML (no GPU here): the example's processes, listed now."""

    name = "nvml"
    enabled = True
    errors_total = 0

    def __init__(self, snapshot: GpuSnapshot) -> None:
        self.snapshot = snapshot

    def fetch(self) -> GpuSnapshot:
        return replace(self.snapshot, taken_at=time.time())

    def read(self) -> ReadResult[GpuSnapshot]:
        return ReadResult(self.fetch())

    def close(self) -> None:
        pass


class FixedPods:
    """Stands in for the pod watch (no cluster here); the pods go through podparse.parse_pod."""

    name = "kubernetes"
    enabled = True
    up = True
    errors_total = 0
    last_sync = 0.0

    def __init__(self, pods: Sequence[PodInfo]) -> None:
        self._index = build_index(pods)

    def index(self) -> PodIndex:
        return self._index

    def read(self) -> ReadResult[PodIndex]:
        return ReadResult(self._index)

    def upstream_pods(self) -> list[PodInfo]:
        return []

    def close(self) -> None:
        pass


class Upstream:
    """dcgm-exporter on loopback, in a thread, serving whatever body the example set."""

    def __init__(self) -> None:
        self.body = b""
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                body = outer.body
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                with contextlib.suppress(ConnectionError):  # the enricher stops at its limit
                    self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/metrics"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def upstream() -> Iterator[Upstream]:
    server = Upstream()
    yield server
    server.close()


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    lp = asyncio.new_event_loop()
    yield lp
    lp.close()


@pytest.fixture(scope="module")
def proc_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("hostile-proc")


# --------------------------------------------------------------------------- oracle

Sample = tuple[str, tuple[tuple[str, str], ...], str, float | None]


def parse_all(text: str) -> tuple[list[Sample], dict[str, str]]:
    """Samples and HELP texts in one pass (the oracle parser is slow on long values)."""
    out: list[Sample] = []
    docs: dict[str, str] = {}
    for fam in text_string_to_metric_families(text):
        docs[fam.name] = fam.documentation
        for s in fam.samples:
            ts = None if s.timestamp is None else float(s.timestamp)
            out.append((s.name, tuple(sorted(s.labels.items())), float_text(float(s.value)), ts))
    return out, docs


def owners(
    pods: Sequence[PodSpec], procs: Sequence[ProcSpec]
) -> dict[str, tuple[str, str, str] | None]:
    """Who each busy GPU's series must name (None: nobody). Independent of attribution.py."""
    users: dict[str, set[tuple[str, str, str] | None]] = {}
    for p in procs:
        who = None
        if p.owner >= 0:
            pod = pods[p.owner]
            who = (pod.namespace, pod.name, pod.container)
        users.setdefault(GPUS[p.gpu], set()).add(who)
    out: dict[str, tuple[str, str, str] | None] = {}
    for gpu, whos in users.items():
        named = {w for w in whos if w is not None}
        if None in whos or len({(ns, name) for ns, name, _ in named}) != 1:
            out[gpu] = None
        else:
            ns, name, _ = next(iter(named))
            containers = {c for _, _, c in named}
            out[gpu] = (ns, name, containers.pop() if len(containers) == 1 else "")
    return out


# Two series of one family that Prometheus sees as one: the second differs by an empty label
# and by a container the enricher cannot name (a host process holds the GPU).
EMPTY_LABEL_TWIN = (
    f'# TYPE a histogram\na_sum{{UUID="{GPUS[1]}"}} 0.0\n'
    f'a_sum{{gpu="",UUID="{GPUS[1]}",container="0"}} 0.0 0\n'
)
# The same with the pod label the upstream had: the enricher names no pod for a host
# process, so the two become one series.
EMPTY_LABEL_TWIN_POD = (
    f'# TYPE b gauge\nb{{UUID="{GPUS[1]}",pod="0"}} 0.0 0\nb{{gpu="",UUID="{GPUS[1]}"}} 0.0 0\n'
)


def expected_upstream(
    valid: Sequence[Sample], plan: Mapping[str, tuple[str, str, str] | None]
) -> list[Sample]:
    out: list[Sample] = []
    seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
    for name, labels, value, ts in valid:
        d = dict(labels)
        key = d.get("UUID")
        if key is not None and "GPU_I_ID" not in d and key in plan and "vgpu" not in d:
            who = plan[key] or ("", "", "")
            d.update(namespace=who[0], pod=who[1], container=who[2])
        for guard in ("pod", "namespace", "container"):
            d.setdefault(guard, "")
        d["node"] = NODE  # the enricher's, on every series (in place of one the upstream wrote)
        cut = tuple(sorted((k, v[:LIMIT]) for k, v in d.items()))
        # One series per identity Prometheus sees: an empty label is no label, so
        # `{gpu="",UUID="x"}` is the series `{UUID="x"}` (the first of them stays).
        identity = tuple((k, v) for k, v in cut if v)
        if (name, identity) not in seen:
            seen.add((name, identity))
            out.append((name, cut, value, ts))
    return out


def check_bounds(parsed: Sequence[Sample]) -> None:
    """Every label name valid, every value within the cut, no series twice."""
    seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
    for name, labels, _, _ in parsed:
        for k, v in labels:
            assert LABEL_NAME_RE.match(k), k
            assert len(v) <= LIMIT, (name, k, len(v))
        # An empty label is no label: {gpu="",UUID="x"} and {UUID="x"} are one series.
        identity = tuple((k, v) for k, v in labels if v)
        assert (name, identity) not in seen, f"{name}{dict(labels)} twice"
        seen.add((name, identity))


def ours(parsed: Sequence[Sample], name: str) -> list[dict[str, str]]:
    rows = []
    for n, labels, value, _ in parsed:
        if n == name:
            rows.append(dict(labels) | {"__value__": value})
    return rows


# --------------------------------------------------------------------------- the property


def _write_proc(root: Path, pods: Sequence[PodSpec], procs: Sequence[ProcSpec]) -> None:
    shutil.rmtree(root, ignore_errors=True)
    fakeproc.write_proc_stat(root, int(time.time()) - 86_400)
    for p in procs:
        if p.owner == -1:
            cgroup = fakeproc.cgroup_host()
        elif p.owner == -2:
            cgroup = fakeproc.cgroup_v2_systemd(uid(999), "f" * 64)
        else:
            pod = pods[p.owner]
            cgroup = fakeproc.cgroup_v2_systemd(pod.uid, pod.container_id)
        fakeproc.write_process(root, p.pid, comm=p.comm, cgroup=cgroup, start_ticks=1000)


def _snapshot(procs: Sequence[ProcSpec]) -> GpuSnapshot:
    devices = tuple(GpuDevice(i, u, "NVIDIA A100-SXM4-80GB") for i, u in enumerate(GPUS))
    return GpuSnapshot(
        devices=devices,
        processes=tuple(
            GpuProcess(GPUS[p.gpu], p.gpu, None, p.pid, p.memory, p.util) for p in procs
        ),
    )


def test_hostile_scrape(
    upstream: Upstream,
    loop: asyncio.AbstractEventLoop,
    proc_root: Path,
    promtools: list[str],
) -> None:
    """The whole scrape on hostile input; prometheus_client checks each output as it comes,
    and Prometheus's own parser (``promtool check metrics``, every release) all of them in
    one batch at the end."""
    outputs: list[str] = []

    @settings(
        max_examples=examples(0.75),
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
    @given(upstream_texts(), nodes())
    # Found by the CI profile: a label name Prometheus reserves ("__") is not valid exposition, so
    # its line is dropped (the valid part of this body has no sample).
    @example(
        ('# TYPE a gauge\n# TYPE a0 gauge\na0{__=""} 0.0 0\n', "# TYPE a gauge\n# TYPE a0 gauge\n"),
        ([], []),
    )
    # A series that differs from an earlier one only by an empty label and the container a
    # host process cannot name (found by the ci profile): one series for Prometheus, one out.
    @example(
        (EMPTY_LABEL_TWIN, EMPTY_LABEL_TWIN),
        ([], [ProcSpec(pid=1000, gpu=1, owner=-1, memory=None, util=None, comm="0")]),
    )
    @example(
        (EMPTY_LABEL_TWIN_POD, EMPTY_LABEL_TWIN_POD),
        ([], [ProcSpec(pid=1000, gpu=1, owner=-1, memory=None, util=None, comm="0")]),
    )
    def prop(body: tuple[str, str], node: tuple[list[PodSpec], list[ProcSpec]]) -> None:
        text, valid = body
        pods, procs = node
        # Lone surrogates in the junk stand for undecodable bytes, as upstream.decode_body reads
        # them back.
        upstream.body = text.encode("utf-8", "surrogateescape")
        _write_proc(proc_root, pods, procs)
        config = replace(
            PER_SCRAPE,
            upstream_url=upstream.url,
            kube_node_name=NODE,
            kube_pod_labels=(LABEL_KEY,),
            kube_pod_annotations=(ANNOTATION_KEY,),
            collector_process=True,
        )
        infos = [parse_pod(p.obj(), (LABEL_KEY,), (ANNOTATION_KEY,)) for p in pods]
        scraper = Scraper(
            config,
            nvml=SnapshotSource(_snapshot(procs)),
            procfs=ProcfsSource(str(proc_root)),
            kubernetes=FixedPods(infos),
        )

        async def once() -> str:
            try:
                return (await scraper.scrape()).body.decode("utf-8")
            finally:
                await scraper.close()

        scraped = loop.run_until_complete(once())
        outputs.append(scraped)
        out, out_help = parse_all(scraped)

        # 1. It parses, and is bounded.
        check_bounds(out)
        # 2. The upstream's samples, with exactly the intended pod labels.
        plan = owners(pods, procs)
        valid_samples, valid_help = parse_all(valid)
        got = [s for s in out if not s[0].startswith(OURS)]
        assert sorted(got, key=repr) == sorted(expected_upstream(valid_samples, plan), key=repr)
        # Leading Unicode whitespace of HELP text aside: test_help_keeps_leading_unicode_space.
        want_help = {k: v.lstrip() for k, v in valid_help.items() if v.lstrip()}
        assert {k: v.lstrip() for k, v in out_help.items() if k in want_help} == want_help
        # 3. Our families name each pod exactly as its metadata says (escaped, cut).
        mem: dict[tuple[str, str, str, str], int] = {}
        unattributed: dict[tuple[str, str], int] = {}
        for p in procs:
            if p.owner >= 0:
                pod = pods[p.owner]
                key = (GPUS[p.gpu], pod.namespace[:LIMIT], pod.name[:LIMIT], pod.container[:LIMIT])
                if p.memory is not None:
                    mem[key] = mem.get(key, 0) + p.memory
            else:
                reason = "host_process" if p.owner == -1 else "pod_not_found"
                unattributed[(GPUS[p.gpu], reason)] = unattributed.get((GPUS[p.gpu], reason), 0) + (
                    p.memory or 0
                )
        assert {
            (r["UUID"], r["namespace"], r["pod"], r["container"]): float(r["__value__"])
            for r in ours(out, "gpu_container_memory_used_bytes")
        } == {k: float(v) for k, v in mem.items()}
        assert {
            (r["UUID"], r["reason"]): float(r["__value__"])
            for r in ours(out, "gpu_unattributed_memory_used_bytes")
        } == {k: float(v) for k, v in unattributed.items()}
        attributed = {pods[p.owner].uid: pods[p.owner] for p in procs if p.owner >= 0}
        assert sorted(
            (
                r["pod_uid"],
                r["namespace"],
                r["pod"],
                r["workload_name"],
                r["label_team"],
                r["annotation_hub_jupyter_org_username"],
                r["node"],
            )
            for r in ours(out, "gpu_pod_info")
        ) == sorted(
            (
                pod.uid,
                pod.namespace[:LIMIT],
                pod.name[:LIMIT],
                pod.name[:LIMIT],
                pod.team[:LIMIT],
                pod.user[:LIMIT],
                NODE,
            )
            for pod in attributed.values()
        )
        names = {r["pid"]: r["process_name"] for r in ours(out, "gpu_process_memory_used_bytes")}
        assert names == {str(p.pid): p.comm for p in procs if p.memory is not None}

    prop()
    assert outputs
    for promtool in promtools:
        assert check_metrics_batch(promtool, outputs) is None


def test_promtool_batch_names_the_bad_output(promtools: list[str]) -> None:
    """The batched oracle itself: it passes valid outputs and names the one it rejects."""
    good = 'a{x="1"} 1\n'
    bad = 'a{x="1"} \u0661\n'  # Python reads it as 1
    for promtool in promtools:
        assert check_metrics_batch(promtool, [good, good]) is None
        rejected = check_metrics_batch(promtool, [good, bad, good])
        assert rejected is not None
        assert (rejected.index, rejected.line) == (1, bad.strip()), rejected


def test_hostile_lines_pass_prometheus(promtools: list[str]) -> None:
    """Lines built to slip past Python's checks, and arbitrary text: whatever the rewrite
    keeps parses in Prometheus's own parser (every release), in one promtool run."""
    outputs: list[str] = []

    @settings(max_examples=examples(1.0), deadline=None)
    @given(st.lists(st.one_of(PYTHON_ONLY_LINES, JUNK, st.text(max_size=40)), max_size=8))
    def prop(lines: list[str]) -> None:
        text = "\n".join(lines) + "\n"
        result = Rewriter().rewrite(text, RewritePlan())
        result.text.encode("utf-8")  # no lone surrogate survives
        parse_all(result.text)
        outputs.append(result.text)

    prop()
    for promtool in promtools:
        assert check_metrics_batch(promtool, outputs) is None


# --------------------------------------------------------------------------- pure property


@st.composite
def attributions_with_hostile_pods(draw: st.DrawFn) -> tuple[list[Any], list[PodInfo]]:
    n = draw(st.integers(1, 4))
    infos = [
        PodInfo(
            uid=uid(i + 1),
            namespace=draw(hostile),
            name=draw(hostile_nonempty),
            node=draw(hostile),
            workload_kind=draw(hostile),
            workload_name=draw(hostile),
            labels={LABEL_KEY: draw(hostile)},
            annotations={ANNOTATION_KEY: draw(hostile)},
            containers={f"{i:064x}": draw(hostile)},
        )
        for i in range(n)
    ]
    assume(len({(p.namespace[:LIMIT], p.name[:LIMIT]) for p in infos}) == n)
    procs = []
    proc_info: dict[int, ProcInfo | ProcError] = {}
    for j in range(draw(st.integers(1, 6))):
        pod = draw(st.sampled_from(infos))
        cid = next(iter(pod.containers))
        procs.append(GpuProcess(GPUS[j % 2], j % 2, None, 100 + j, 1 << 20, 0.1))
        proc_info[100 + j] = ProcInfo(
            100 + j, 1, 1.0, draw(hostile), CgroupRef(pod.uid, cid, Runtime.CONTAINERD, "/")
        )
    attributions = attribute(GpuSnapshot(processes=tuple(procs)), proc_info, build_index(infos))
    return attributions, infos


@settings(max_examples=examples(1.5), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(attributions_with_hostile_pods(), st.lists(hostile, max_size=3))
def test_hostile_pod_metadata_is_escaped_and_cut(
    case: tuple[list[Any], list[PodInfo]], identity_values: list[str]
) -> None:
    """render_families alone, with hostile values everywhere a pod or a device label goes."""
    attributions, infos = case
    identity = tuple(
        (name, value)
        for name, value in zip(("gpu", "modelName", "Hostname"), identity_values, strict=False)
    )
    identities = {(u, ""): (("UUID", u), *identity) for u in GPUS}
    options = RenderOptions(
        node_name=NODE,
        label_keys=(LABEL_KEY,),
        annotation_keys=(ANNOTATION_KEY,),
        process_series=True,
    )
    text = render_families(attributions, identities, options)
    out, _ = parse_all(text)
    check_bounds(out)
    by_uid = {p.uid: p for p in infos}
    for row in ours(out, "gpu_pod_info"):
        pod = by_uid[row["pod_uid"]]
        assert row["namespace"] == pod.namespace[:LIMIT]
        assert row["pod"] == pod.name[:LIMIT]
        assert row["node"] == (pod.node or NODE)[:LIMIT]
        assert row["workload_kind"] == pod.workload_kind[:LIMIT]
        assert row["annotation_hub_jupyter_org_username"] == pod.annotations[ANNOTATION_KEY][:LIMIT]
    for row in ours(out, "gpu_process_memory_used_bytes"):
        a = next(a for a in attributions if str(a.process.pid) == row["pid"])
        assert row["process_name"] == a.comm[:LIMIT]
        assert row["container"] == a.container[:LIMIT]
        for name, value in identity:
            assert row[name] == value[:LIMIT]
    # Every line is bounded: a few labels of at most 1024 characters, each escaped at most 2x.
    assert all(len(line) < 40 * 2 * LIMIT for line in text.splitlines())


def test_cut_names_collide() -> None:
    a = PodInfo(uid=uid(1), namespace="ns", name="a" * 1100 + "x", containers={"1" * 64: "c"})
    b = PodInfo(uid=uid(2), namespace="ns", name="a" * 1100 + "y", containers={"2" * 64: "c"})
    procs = tuple(GpuProcess(GPUS[0], 0, None, pid, 1 << 20, None) for pid in (1, 2))
    info: dict[int, ProcInfo | ProcError] = {
        1: ProcInfo(1, 1, 1.0, "p", CgroupRef(a.uid, "1" * 64, Runtime.CONTAINERD, "/")),
        2: ProcInfo(2, 1, 1.0, "p", CgroupRef(b.uid, "2" * 64, Runtime.CONTAINERD, "/")),
    }
    attributions = attribute(GpuSnapshot(processes=procs), info, build_index([a, b]))
    check_bounds(parse_all(render_families(attributions, {}, RenderOptions()))[0])


# --------------------------------------------------------------------------- bounds


@pytest.mark.parametrize(
    ("headers", "ok"),
    [
        pytest.param({"X-A": "a" * 900}, True, id="within-size"),
        pytest.param({"X-A": "a" * 4096}, False, id="over-size"),
        pytest.param({f"X-{i}": "a" for i in range(100)}, True, id="100-headers"),
        pytest.param({f"X-{i}": "a" for i in range(200)}, False, id="200-headers"),
        pytest.param({"X-" + "n" * 2000: "a"}, False, id="long-name"),
    ],
)
async def test_request_headers_are_bounded(headers: dict[str, str], ok: bool) -> None:
    scraper = Scraper(PER_SCRAPE, nvml=None, procfs=NoProcs(), kubernetes=None)
    runner = await serve(make_app(scraper), "127.0.0.1:0", max_header_bytes=1024)
    port = runner.addresses[0][1]
    try:
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://127.0.0.1:{port}/healthz", headers=headers) as resp,
        ):
            assert (resp.status == 200) is ok, resp.status
            if not ok:
                assert resp.status in (400, 431)
        # The server is still fine afterwards.
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://127.0.0.1:{port}/healthz") as resp,
        ):
            assert resp.status == 200
    finally:
        await runner.cleanup()


@pytest.mark.parametrize("gzipped", [False, True], ids=["plain", "gzip"])
@pytest.mark.parametrize(
    ("extra", "ok"), [(-1, True), (0, True), (1, False)], ids=["under", "at", "over"]
)
async def test_upstream_body_limit_is_exact(gzipped: bool, extra: int, ok: bool) -> None:
    limit = 64 * 1024
    line = b"m 1\n"
    body = (line * (limit // len(line) + 1))[: limit + extra]

    async def handler(_request: web.Request) -> web.Response:
        if gzipped:
            return web.Response(
                body=gzip.compress(body),
                content_type="text/plain",
                headers={"Content-Encoding": "gzip"},
            )
        return web.Response(body=body, content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}/metrics"
    try:
        async with aiohttp.ClientSession() as session:
            if ok:
                text = await fetch_upstream(session, url, timeout=5, max_bytes=limit)
                assert len(text) == len(body)
            else:
                with pytest.raises(UpstreamError) as info:
                    await fetch_upstream(session, url, timeout=5, max_bytes=limit)
                assert info.value.reason == "too_large"
    finally:
        await runner.cleanup()


async def test_series_and_remembered_devices_are_bounded(upstream: Upstream) -> None:
    """An upstream at the size limit with the smallest series it can send: every series is
    passed (the body bounds their number), and the device labels kept for outages stay
    within MAX_IDENTITIES however many devices it claims."""
    limit = 1 << 20
    lines = [f'x{{UUID="GPU-{i}"}} 1' for i in range(MAX_IDENTITIES + 5000)]
    body = ("\n".join(lines) + "\n").encode()
    assert len(body) <= limit
    upstream.body = body
    config = replace(PER_SCRAPE, upstream_url=upstream.url, upstream_max_bytes=limit)
    scraper = Scraper(config, nvml=None, procfs=NoProcs(), kubernetes=None)
    try:
        result = await scraper.scrape()
        text = result.body.decode()
        assert sum(1 for line in text.splitlines() if line.startswith("x{")) == len(lines)
        assert len(result.identities) <= MAX_IDENTITIES
        upstream.body = body + b"y 1\n" * (limit // 4)  # now over the limit
        text = (await scraper.scrape()).body.decode()
        assert 'dcgm_enricher_source_up{source="upstream"} 0' in text
        assert "x{" not in text
    finally:
        await scraper.close()


def test_long_backslash_run() -> None:
    """The one case the property's long values leave out (the oracle is slow on it)."""
    pod = PodInfo(
        uid=uid(1),
        namespace="ns",
        name="p",
        annotations={ANNOTATION_KEY: "\\" * 3000},
        containers={"1" * 64: "c"},
    )
    process = GpuProcess(GPUS[0], 0, None, 1, 1 << 20, None)
    info: dict[int, ProcInfo | ProcError] = {
        1: ProcInfo(1, 1, 1.0, "p", CgroupRef(pod.uid, "1" * 64, Runtime.CONTAINERD, "/"))
    }
    attributions = attribute(GpuSnapshot(processes=(process,)), info, build_index([pod]))
    options = RenderOptions(annotation_keys=(ANNOTATION_KEY,))
    out, _ = parse_all(render_families(attributions, {}, options))
    (row,) = ours(out, "gpu_pod_info")
    assert row["annotation_hub_jupyter_org_username"] == "\\" * LIMIT


def test_help_keeps_leading_unicode_space() -> None:
    text = "# HELP m \u2028two lines\n# TYPE m gauge\nm 1\n"
    out = Rewriter().rewrite(text, RewritePlan()).text
    assert parse_all(out)[1]["m"] == parse_all(text)[1]["m"]


def test_discovery_ignores_a_labelled_pod_in_a_tenant_namespace() -> None:
    """A fake upstream: the real kubernetes client and KubernetesSource on the API stand-in."""
    from devkit.kubeapi import KubeApiStandIn, make_api_client
    from enricher.kube import KubernetesSource
    from enricher.podparse import parse_selector
    from enricher.simnode.api import make_pod

    labels = {"app": "nvidia-dcgm-exporter"}
    with KubeApiStandIn() as api:
        api.add_pod(
            make_pod(
                "nvidia-dcgm-exporter-x7k2p",
                "gpu-operator",
                node=NODE,
                labels=labels,
                owner=("DaemonSet", "nvidia-dcgm-exporter"),
                pod_ip="10.0.0.10",
            )
        )
        api.add_pod(make_pod("fake", "a-tenant", node=NODE, labels=labels, pod_ip="10.0.0.66"))
        cache = KubernetesSource(
            make_api_client(api.url),
            NODE,
            upstream_selector=parse_selector("app=nvidia-dcgm-exporter"),
            upstream_namespace="gpu-operator",  # --upstream.pod-namespace's default
            backoff_max_seconds=0.2,
        )
        cache.start()
        try:
            assert cache.synced.wait(10)
            chosen = cache.upstream_pods()
        finally:
            cache.stop()
    assert chosen, "the operator's exporter must still be found"
    assert all(p.namespace == "gpu-operator" for p in chosen), [p.namespace for p in chosen]
