"""The node page at ``/``: the pure view, the HTML, and the page in a real headless browser.

The browser test renders the demo node's page (the real enricher over a simulated node: there
is no GPU here) in Debian's chromium and reads the table from the DOM the browser built.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from enricher.attribution import AllocatedDevice, Attribution
from enricher.collection import PowerView
from enricher.config import Config
from enricher.fieldtable import table as field_table
from enricher.labels import RewritePlan
from enricher.landing import build_view, render_landing
from enricher.memory import MIB, DeviceMemory, device_memory
from enricher.model import (
    GpuDevice,
    GpuProcess,
    GpuSnapshot,
    MigDevice,
    PodInfo,
    ProcInfo,
    SourceStatus,
)
from enricher.readings import WATCH_NAMES, Contract, read_body, read_upstream
from enricher.rewrite import Rewriter

from .harness import demo_process

ROOT = Path(__file__).resolve().parent.parent
G0 = "GPU-00000000-0000-4000-8000-000000000000"
G1 = "GPU-11111111-1111-4111-8111-111111111111"
G2 = "GPU-22222222-2222-4222-8222-222222222222"


# --------------------------------------------------------------------------- device memory


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        pytest.param(
            f'DCGM_FI_DEV_FB_USED{{gpu="0",UUID="{G0}"}} 1000\n'
            f'DCGM_FI_DEV_FB_FREE{{gpu="0",UUID="{G0}"}} 3000\n',
            {(G0, ""): DeviceMemory(1000 * MIB, 3000 * MIB)},
            id="whole-gpu",
        ),
        pytest.param(
            f'DCGM_FI_DEV_FB_USED{{gpu="0",UUID="{G0}"}} 1000\n'
            f'DCGM_FI_DEV_FB_FREE{{gpu="0",UUID="{G0}"}} 2500\n'
            f'DCGM_FI_DEV_FB_RESERVED{{gpu="0",UUID="{G0}"}} 500\n',
            {(G0, ""): DeviceMemory(1000 * MIB, 2500 * MIB, 500 * MIB)},
            id="reserved",
        ),
        pytest.param(
            f'DCGM_FI_DEV_FB_FREE{{UUID="{G1}",GPU_I_ID="5"}} 10\n'
            f'DCGM_FI_DEV_FB_USED{{UUID="{G1}",GPU_I_ID="5"}} 30\n',
            {(G1, "5"): DeviceMemory(30 * MIB, 10 * MIB)},
            id="mig-instance",
        ),
        pytest.param(
            f'DCGM_FI_DEV_FB_USED{{uuid="{G0}"}} 1\nDCGM_FI_DEV_FB_FREE{{uuid="{G0}"}} 1\n',
            {(G0, ""): DeviceMemory(MIB, MIB)},
            id="old-scheme-uuid",
        ),
        pytest.param(
            f'DCGM_FI_DEV_FB_USED{{UUID="{G0}"}} 1000\n',
            {(G0, ""): DeviceMemory(1000 * MIB)},
            id="free-missing-no-total",
        ),
        pytest.param(
            f'DCGM_FI_DEV_FB_FREE{{UUID="{G0}"}} 1000\nDCGM_FI_DEV_FB_RESERVED{{UUID="{G0}"}} 1\n',
            {},
            id="used-missing-no-device",
        ),
        pytest.param(
            f'DCGM_FI_DEV_FB_USED{{UUID="{G0}"}} lots\nDCGM_FI_DEV_FB_FREE{{UUID="{G0}"}} 1\n',
            {},
            id="not-a-number",
        ),
        pytest.param(
            f'DCGM_FI_DEV_FB_USED{{UUID="{G0}"}} NaN\nDCGM_FI_DEV_FB_FREE{{UUID="{G0}"}} 1\n',
            {},
            id="nan",
        ),
        pytest.param(
            f'DCGM_FI_DEV_FB_USED{{UUID="{G0}",,}} 1\nDCGM_FI_DEV_FB_FREE{{UUID="{G0}"}} 1\n',
            {},
            id="broken-labels",
        ),
        pytest.param(
            'DCGM_FI_DEV_FB_USED{gpu="0"} 1\nDCGM_FI_DEV_FB_FREE{gpu="0"} 1\n', {}, id="no-uuid"
        ),
        pytest.param(
            'DCGM_FI_DEV_FB_USED{UUID="GPU-\\"q\\"\\\\"} 2\n'
            'DCGM_FI_DEV_FB_FREE{UUID="GPU-\\"q\\"\\\\"} 2\n',
            {('GPU-"q"\\', ""): DeviceMemory(2 * MIB, 2 * MIB)},
            id="escaped-uuid",
        ),
        pytest.param(
            f'DCGM_FI_DEV_FB_USED_PERCENT{{UUID="{G0}"}} 50\n'
            f'# DCGM_FI_DEV_FB_USED{{UUID="{G0}"}} 1\n'
            f'xDCGM_FI_DEV_FB_FREE{{UUID="{G0}"}} 1\n',
            {},
            id="other-lines",
        ),
    ],
)
def test_device_memory(body: str, expected: dict[Any, Any]) -> None:
    """From the lines the rewrite hands over (RewriteResult.watched), as the upstream wrote
    them: the same figures the served FB_USED, FB_FREE and FB_RESERVED series carry."""
    assert device_memory(read_body(body)) == expected
    rewritten = Rewriter(watch=WATCH_NAMES).rewrite(body, RewritePlan())
    assert device_memory(read_upstream(body, rewritten.watched)) == expected


# --------------------------------------------------------------------------- the view


def pod(name: str, ns: str = "ml", kind: str = "Job", workload: str = "train") -> PodInfo:
    return PodInfo(
        uid=f"uid-{name}", namespace=ns, name=name, workload_kind=kind, workload_name=workload
    )


def attribution(
    gpu: str,
    index: int,
    pid: int,
    mem_mib: int | None,
    util: float | None,
    owner: PodInfo | None,
    container: str = "main",
    reason: str = "",
    gi: int | None = None,
    comm: str = "python",
) -> Attribution:
    process = GpuProcess(gpu, index, gi, pid, None if mem_mib is None else mem_mib * MIB, util)
    info = ProcInfo(pid, 1, 1.0, comm, None)
    return Attribution(process, info, owner, container if owner else "", reason)


SNAPSHOT = GpuSnapshot(
    devices=(
        GpuDevice(0, G0, "NVIDIA A100-SXM4-80GB"),
        GpuDevice(1, G1, "NVIDIA A100-SXM4-80GB", mig_enabled=True),
        GpuDevice(2, G2, "NVIDIA A100-SXM4-80GB"),
    ),
    migs=(
        MigDevice(G1, 1, 5, 0, "MIG-a", "2g.20gb"),
        MigDevice(G1, 1, 1, 0, "MIG-b", "3g.40gb"),
    ),
)
TRAIN = pod("train-0")
VLLM = pod("vllm-abc", "inference", "Deployment", "vllm")
ATTRIBUTIONS = [
    attribution(G0, 0, 11, 1000, 0.5, TRAIN),
    attribution(G0, 0, 12, 500, 0.25, TRAIN, comm="pt_data_worker"),
    attribution(G0, 0, 21, 4000, 0.1, VLLM, container="vllm"),
    attribution(G0, 0, 31, 300, None, None, reason="host_process"),
    attribution(G1, 1, 41, 2000, None, pod("bert-0", "research", "StatefulSet", "bert"), gi=1),
]
FB = (
    f'DCGM_FI_DEV_FB_USED{{UUID="{G0}"}} 6000\nDCGM_FI_DEV_FB_FREE{{UUID="{G0}"}} 75920\n'
    f'DCGM_FI_DEV_FB_USED{{UUID="{G1}",GPU_I_ID="1"}} 2100\n'
    f'DCGM_FI_DEV_FB_FREE{{UUID="{G1}",GPU_I_ID="1"}} 38860\n'
).encode()
STATUSES = [SourceStatus("upstream", True, 0.01, 0), SourceStatus("nvml", False, 0.0, 3)]


@dataclass(frozen=True)
class Model:
    """A scrape's model as the page reads it (landing.ScrapeModel: the pipeline's ScrapeResult
    is one), with no served body at all."""

    attributions: Sequence[Attribution] = ()
    allocations: Sequence[AllocatedDevice] = ()
    snapshot: GpuSnapshot = field(default_factory=GpuSnapshot)
    statuses: Sequence[SourceStatus] = ()
    finished_at: float = 0.0
    power: PowerView | None = None
    memory: Mapping[Any, DeviceMemory] = field(default_factory=dict)
    last_active: Mapping[Any, float] = field(default_factory=dict)
    contract: Contract = field(default_factory=Contract)


def result(**kw: Any) -> Model:
    fields = {
        "memory": device_memory(read_body(FB.decode())),
        "attributions": ATTRIBUTIONS,
        "snapshot": SNAPSHOT,
        "statuses": STATUSES,
        "finished_at": time.time(),
    }
    fields.update(kw)
    return Model(**fields)


def test_view_lists_every_device_and_who_is_on_it() -> None:
    view = build_view(result())
    titles = [d.title for d in view.devices]
    # MIG instances in GPU-instance order; a GPU with nothing on it is still listed.
    assert titles == ["GPU 0", "GPU 1 · MIG 3g.40gb (GI 1)", "GPU 1 · MIG 2g.20gb (GI 5)", "GPU 2"]
    gpu0 = view.devices[0]
    assert (gpu0.used_bytes, gpu0.total_bytes) == (6000 * MIB, 81920 * MIB)
    rows = [(o.namespace, o.pod, o.container, o.reason) for o in gpu0.owners]
    # Biggest first, the unattributed processes last, then the memory no process lists
    # (FB_USED 6000 MiB, the processes 5800 MiB).
    assert rows == [
        ("inference", "vllm-abc", "vllm", ""),
        ("ml", "train-0", "main", ""),
        ("", "", "", "host_process"),
        ("", "", "", "not_in_process_list"),
    ]
    assert gpu0.owners[-1].memory_bytes == 200 * MIB
    assert sum(o.memory_bytes or 0 for o in gpu0.owners) == gpu0.used_bytes
    train = gpu0.owners[1]
    assert train.memory_bytes == 1500 * MIB
    assert train.util_ratio == pytest.approx(0.75)
    assert train.processes == ((11, "python"), (12, "pt_data_worker"))
    assert train.workload == "Job/train"
    assert gpu0.unattributed_bytes == 500 * MIB
    mig = view.devices[1]
    assert mig.owners[0].util_ratio is None  # NVML has no per-process data on MIG
    assert view.devices[2].owners == () and view.devices[3].owners == ()
    assert view.pods == {("ml", "train-0"), ("inference", "vllm-abc"), ("research", "bert-0")}
    assert view.unattributed_bytes == 600 * MIB  # GI 1: 2100 MiB used, 2000 MiB listed


def test_view_shows_the_reservation_and_the_remainder_as_metrics_writes_them() -> None:
    """A device's rows are its containers, each unattributed reason, the driver's
    reservation and the rest: they add up to FB_USED + FB_RESERVED, the page's "used"."""
    memory = {(G0, ""): DeviceMemory(6000 * MIB, 70000 * MIB, 500 * MIB)}
    view = build_view(result(memory=memory))
    gpu0 = view.devices[0]
    parts = {o.reason: o.memory_bytes for o in gpu0.owners if o.reason}
    assert parts == {
        "host_process": 300 * MIB,
        "driver_reserved": 500 * MIB,
        "not_in_process_list": 200 * MIB,
    }
    assert sum(o.memory_bytes or 0 for o in gpu0.owners) == gpu0.used_bytes == 6500 * MIB
    assert gpu0.total_bytes == 76500 * MIB
    page = render_landing(result(memory=memory), Config())
    assert "<code>driver_reserved</code>" in page
    assert "the driver&#x27;s reservation (FB_RESERVED)" in page
    assert "<code>not_in_process_list</code>" in page
    assert "held by no process NVML lists" in page


def test_device_memory_comes_from_the_model_never_the_body() -> None:
    """The page reads the collection's model (the framebuffer gauges as the rewrite handed
    them over), not the bytes /metrics served: a model without a body builds the page, and
    each device's memory is the model's."""
    view = build_view(result(memory={(G0, ""): DeviceMemory(1 * MIB, 1 * MIB)}))
    assert (view.devices[0].used_bytes, view.devices[0].total_bytes) == (MIB, 2 * MIB)
    page = render_landing(result(memory={(G0, ""): DeviceMemory(MIB, MIB)}), Config())
    assert "1 MiB of 2 MiB used" in page
    served = result(memory={(G2, ""): DeviceMemory(3 * MIB, MIB)})
    devices = {d.key: d for d in build_view(served).devices}
    assert devices[(G0, "")].used_bytes is None  # not in this model
    assert devices[(G2, "")].used_bytes == 3 * MIB


def test_view_never_hides_processes_on_an_unlisted_device() -> None:
    ghost = attribution("GPU-gone", 7, 99, 100, 0.0, TRAIN)
    view = build_view(result(attributions=[ghost]))
    assert [d.title for d in view.devices][-1] == "GPU-gone"
    assert view.devices[-1].owners[0].pod == "train-0"


def test_no_scrape_yet() -> None:
    assert build_view(None).devices == ()
    page = render_landing(None, Config())
    assert "no scrape yet" in page and "no GPU seen yet" in page


def _allocation(
    key: tuple[str, str], pod_name: str, resource: str = "nvidia.com/gpu"
) -> AllocatedDevice:
    return AllocatedDevice(key, "ml", pod_name, "main", resource, "GPU-x")


def test_idle_since_is_the_ledgers() -> None:
    """Each container idle on a device shows since when, as the idle stage's ledger (what
    gpu_container_last_active_timestamp_seconds writes) says: one active at this collection
    shows nothing, and an allocation with no process shows its time too."""
    now = 1_800_000_300.0
    idle = _allocation((G2, ""), "finetune-0")
    last_active = {
        ((G0, ""), "ml", "train-0", "main"): now,  # active now
        ((G0, ""), "inference", "vllm-abc", "vllm"): now - 3600.5,
        ((G2, ""), "ml", "finetune-0", "main"): now - 90_000,
    }
    last = result(
        snapshot=replace(SNAPSHOT, taken_at=now), allocations=[idle], last_active=last_active
    )
    since = {(o.pod, o.key[2]): o.idle_since for d in build_view(last).devices for o in d.owners}
    assert since[("train-0", "main")] is None
    assert since[("vllm-abc", "vllm")] == now - 3600.5
    assert since[("finetune-0", "main")] == now - 90_000
    page = render_landing(last, Config())
    rows = {
        r.split("<td class='pod'>")[1].split("<")[0]: r
        for r in page.split("<tr>")
        if "<td class='pod'>" in r
    }
    assert "idle since 2027-01-15 07:04:59 UTC" in rows["vllm-abc"], rows["vllm-abc"]
    assert "idle since 2027-01-14 07:05:00 UTC" in rows["finetune-0"]
    assert "idle since" not in rows["train-0"]


def test_allocated_idle_container_is_shown() -> None:
    idle = _allocation((G2, ""), "finetune-0")
    busy = _allocation((G0, ""), "train-0")
    statuses = [*STATUSES, SourceStatus("podresources", True, 0.01, 0)]
    view = build_view(result(allocations=[idle, busy], statuses=statuses))
    gpu2 = view.devices[-1]
    assert [(o.pod, o.allocated, o.processes) for o in gpu2.owners] == [
        ("finetune-0", "nvidia.com/gpu", ())
    ]
    assert view.devices[0].owners[1].allocated == "nvidia.com/gpu"
    page = render_landing(result(allocations=[idle, busy], statuses=statuses), Config())
    assert "no process: allocated, idle" in page
    # vllm-abc holds no allocation, and the kubelet was read: say so.
    assert "not allocated" in page


def test_not_allocated_only_when_the_kubelet_was_read() -> None:
    page = render_landing(result(), Config())
    assert "not allocated" not in page


# --------------------------------------------------------------------------- the HTML

HOSTILE = PodInfo(
    uid="u",
    namespace="a&b",
    name="<script>alert(1)</script>",
    workload_kind="Pod",
    workload_name="x' onmouseover='y",
)


@pytest.mark.parametrize(
    ("raw", "escaped"),
    [
        pytest.param(
            "<script>alert(1)</script>", "&lt;script&gt;alert(1)&lt;/script&gt;", id="pod"
        ),
        pytest.param("a&b", "a&amp;b", id="namespace"),
        pytest.param("x' onmouseover='y", "x&#x27; onmouseover=&#x27;y", id="workload"),
        pytest.param('"><img src=x>', "&quot;&gt;&lt;img src=x&gt;", id="command"),
    ],
)
def test_every_value_is_escaped(raw: str, escaped: str) -> None:
    hostile = [attribution(G0, 0, 5, 10, 0.5, HOSTILE, container="c", comm='"><img src=x>')]
    page = render_landing(result(attributions=hostile), Config(kube_node_name="n<1>"))
    assert raw not in page
    assert escaped in page
    assert "n&lt;1&gt;" in page


def test_page_is_self_contained_and_refreshes() -> None:
    page = render_landing(result(), Config(simulated=True))
    lowered = page.lower()
    for external in ("<script", "<link", "src=", "http://", "https://", "url(", "@import"):
        assert external not in lowered, external
    assert "<meta http-equiv='refresh' content='10'>" in page
    assert "SIMULATED NODE" in page
    assert "SIMULATED" not in render_landing(result(), Config())
    assert "nvml: down" in page and "upstream: up" in page


# --------------------------------------------------------------------------- in a browser


class TableReader(HTMLParser):
    """Cells of the page's #gpus table, by CSS class, from the DOM the browser dumped."""

    def __init__(self) -> None:
        super().__init__()
        self.in_table = False
        self.cell_class: str | None = None
        self.cells: list[tuple[str, str]] = []
        self.devices = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "table" and a.get("id") == "gpus":
            self.in_table = True
        if self.in_table and tag in ("td", "th"):
            self.cell_class = a.get("class") or ""
            self.cells.append((self.cell_class, ""))
            if tag == "th" and "dev" in self.cell_class.split():
                self.devices += 1

    def handle_endtag(self, tag: str) -> None:
        if tag == "table":
            self.in_table = False

    def handle_data(self, data: str) -> None:
        if self.in_table and self.cells:
            cls, text = self.cells[-1]
            self.cells[-1] = (cls, text + data)

    def texts(self, css: str) -> list[str]:
        return [t.strip() for c, t in self.cells if css in c.split()]


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    if os.environ.get("CI"):
        pytest.fail("chromium is missing in CI: .ci/system-deps must install Debian's chromium")
    pytest.skip("chromium not installed (apt-get install chromium)")


# Laid out by the browser at a 1024 px wide window: the page's own widths, written into the
# DOM by a script added to a copy of the served page (the page itself has no script).
_MEASURE = (
    "<script>document.body.setAttribute('data-measured', "
    "document.documentElement.scrollWidth + ' ' + document.documentElement.clientWidth)"
    "</script></body>"
)


def dump_dom(browser: str, url: str, profile: Path, window: int = 1280) -> str:
    """The DOM that headless ``browser`` built for ``url`` in a ``window`` px wide window."""
    proc = subprocess.run(
        [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            f"--user-data-dir={profile}",
            f"--window-size={window},900",
            "--dump-dom",
            url,
        ],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def page_widths(browser: str, page: str, tmp_path: Path, window: int = 1024) -> tuple[int, int]:
    """(scroll width, client width) of ``page`` in ``browser`` at a ``window`` px wide window."""
    copy = tmp_path / "measure.html"
    copy.write_text(page.replace("</body>", _MEASURE))
    dom = dump_dom(browser, copy.as_uri(), tmp_path / "profile-measure", window)
    found = re.search(r'data-measured="(\d+) (\d+)"', dom)
    assert found, dom[-2000:]
    return int(found.group(1)), int(found.group(2))


def test_demo_page_in_a_headless_browser(tmp_path: Path) -> None:
    browser = chromium()
    with demo_process(tmp_path) as demo:
        with urllib.request.urlopen(demo.url + "/metrics", timeout=10) as r:
            metrics = r.read().decode()
        with urllib.request.urlopen(demo.url + "/", timeout=10) as r:
            page = r.read().decode()
        dom = dump_dom(browser, demo.url + "/", tmp_path / "profile")
    table = TableReader()
    table.feed(dom)

    # Who the demo's /metrics says is on the GPUs, by process or by allocation.
    expected_pods: set[str] = set()
    reasons: set[str] = set()
    devices = set()
    for family in text_string_to_metric_families(metrics):
        for s in family.samples:
            if s.name in ("gpu_container_memory_used_bytes", "gpu_container_allocated"):
                expected_pods.add(s.labels["pod"])
            if s.name == "gpu_unattributed_memory_used_bytes":
                reasons.add(s.labels["reason"])
            if s.name in field_table().names("fb_used"):
                devices.add((s.labels["UUID"], s.labels.get("GPU_I_ID", "")))
    assert {"jupyter-alice", "train-llama-4kq9z", "bert-finetune-0"} <= expected_pods
    assert set(table.texts("pod")) == expected_pods
    shown_reasons = {t.removeprefix("unattributed:").strip() for t in table.texts("un")}
    assert reasons <= shown_reasons
    # One section per device that dcgm-exporter reports memory for (GPUs and MIG instances),
    # MIG-enabled GPUs counted by their instances.
    assert table.devices == len(devices) - sum(
        1 for uuid, gi in devices if gi == "" and any(u == uuid and g for u, g in devices)
    )
    assert "SIMULATED NODE" in dom
    # The page reads on a 1024 px screen: its table does not scroll sideways.
    scroll, client = page_widths(browser, page, tmp_path)
    assert scroll <= client, f"the page is {scroll} px wide in a {client} px window"


def test_power_column_and_idle_row() -> None:
    """Each row carries its share of the GPU's watts (enricher.power's split, as the metrics
    say); a GPU nobody holds shows its draw as the idle row; without a power reading the
    column stays empty."""
    u0, u1, u2 = (f"GPU-{i}0000000-0000-4000-8000-000000000000" for i in range(3))
    snap = GpuSnapshot(devices=tuple(GpuDevice(i, u, "A100") for i, u in enumerate((u0, u1, u2))))
    pod = PodInfo(uid="u", namespace="ns", name="p")
    atts = [
        Attribution(GpuProcess(u0, 0, None, 7, 1 << 30, 0.5), None, pod, "c", ""),
        Attribution(GpuProcess(u0, 0, None, 8, 1 << 20, 0.0), None, None, "", "host_process"),
    ]
    power = PowerView(
        {u0: 300.0, u1: 60.0},
        {((u0, ""), ("ns", "p", "c")): 300.0},
        {((u0, ""), "host_process"): 0.0, ((u1, ""), "idle"): 60.0},
    )
    last = Model(atts, (), snap, [], 0.0, power=power)
    devices = {d.key[0]: d for d in build_view(last).devices}
    assert devices[u0].power_watts == 300.0
    assert [(o.pod, o.reason, o.power_watts) for o in devices[u0].owners] == [
        ("p", "", 300.0),
        ("", "host_process", 0.0),
    ]
    assert [(o.reason, o.power_watts, o.memory_bytes) for o in devices[u1].owners] == [
        ("idle", 60.0, 0)
    ]
    assert devices[u2].power_watts is None and devices[u2].owners == ()
