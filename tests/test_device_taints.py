"""DRA device health: the taints NVIDIA's DRA driver puts on a node's GPU and MIG devices
(its ResourceSlices) as ``gpu_device_taint``, with the device labels of the other
device-keyed families.

Real parts: the real Scraper and aiohttp app, the real ``kubernetes`` client listing the
slices from the API stand-in devkit/kubeapi.py (each served version's shape), the kubelet's
PodResources over a real gRPC socket, pynvml against the fake libnvidia-ml, a /proc tree on
disk. The oracles: prometheus_client's parser and promtool. ``pytest --update-golden``
rewrites tests/golden/dra-taints.out. No GPU or cluster exists here: the node is SIMULATED.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from devkit.nvmlfake import nvml_state_of
from enricher.attribution import device_taints
from enricher.families import DEVICE_TAINT, RenderOptions, render_device_taints, render_families
from enricher.model import DeviceTaint, DraDevice, GpuDevice, GpuSnapshot, MigDevice
from enricher.simnode.api import DRA_DRIVER, pod_object, resource_slices
from enricher.simnode.fakeproc import write_proc_tree
from enricher.simnode.kubelet import allocations, list_response
from enricher.simnode.node import SimNode, SimPod, SimProc

from .conftest import as_prometheus_client_writes, assert_valid_exposition
from .harness import MakeStack, Stack, check_golden, cid, series

NODE = "gpu-node-d"
MODEL = "NVIDIA H100 80GB HBM3"
EXPORTER = "dcgm-exporter-t4x9z"  # the upstream's Hostname: its pod
U = [
    "GPU-d0d0d0d0-0000-4000-8000-0000000000d0",  # DRA pod train-0, an XID taint
    "GPU-d1d1d1d1-1111-4111-8111-1111111111d1",  # no pod, lost
    "GPU-d2d2d2d2-2222-4222-8222-2222222222d2",  # MIG: eval-0 on instance 1 (tainted)
    "GPU-d3d3d3d3-3333-4333-8333-3333333333d3",  # healthy, idle
]
MIG_1 = "MIG-d2d2d2d2-0001-4001-8001-0000000000e1"
MIG_2 = "MIG-d2d2d2d2-0002-4002-8002-0000000000e2"
XID = DeviceTaint("gpu.nvidia.com/xid", "43", "None")
LOST = DeviceTaint("gpu.nvidia.com/gpu-lost", "", "NoSchedule")
UNMONITORED = DeviceTaint("gpu.nvidia.com/unmonitored", "", "None")
XID_79 = DeviceTaint("gpu.nvidia.com/xid", "79", "NoExecute")
TAINTS = {U[0]: (XID, UNMONITORED), U[1]: (LOST,), MIG_1: (XID_79,)}


def claim(pod: str, device: str) -> DraDevice:
    return DraDevice(f"{pod}-gpu", "ml", DRA_DRIVER, NODE, device)


TRAIN = SimPod(
    "ml",
    "train-0",
    "d0000000-0000-4000-8000-000000000001",
    "trainer",
    cid(0xD1),
    ("Job", "train"),
    None,
    claims=(claim("train-0", "gpu-0"),),
)
EVAL = SimPod(
    "ml",
    "eval-0",
    "d0000000-0000-4000-8000-000000000002",
    "eval",
    cid(0xD2),
    ("Job", "eval"),
    None,
    claims=(claim("eval-0", "gpu-2-mig-9-0-4"),),
)
TAINT_NODE = SimNode(
    NODE,
    tuple(GpuDevice(i, u, MODEL, mig_enabled=i == 2) for i, u in enumerate(U)),
    (MigDevice(U[2], 2, 1, 0, MIG_1, "3g.40gb"), MigDevice(U[2], 2, 2, 0, MIG_2, "2g.20gb")),
    (
        SimProc(4001, "python", 0, None, 40 * 1024, 0.6, TRAIN),
        SimProc(4002, "python", 2, 1, 20 * 1024, 0.0, EVAL),
    ),
    (TRAIN, EVAL),
    first_ticks=1000,
    ticks_apart=1,
)
BOOT = 1_700_000_000


def upstream_text() -> str:
    """What dcgm-exporter serves for the node: temperature and framebuffer per GPU and MIG
    instance, with its device labels (its Hostname is its own pod's name)."""
    rows: list[tuple[int, str, str]] = []
    for g in TAINT_NODE.gpus:
        base = (
            f'gpu="{g.index}",UUID="{g.uuid}",pci_bus_id="00000000:{0x18 + g.index:02X}:00.0",'
            f'device="nvidia{g.index}",modelName="{MODEL}"'
        )
        if g.mig_enabled:
            rows += [
                (g.index, base, f'GPU_I_PROFILE="{m.profile}",GPU_I_ID="{m.gi_id}",')
                for m in TAINT_NODE.migs
                if m.gpu_uuid == g.uuid
            ]
        else:
            rows.append((g.index, base, ""))
    out = []
    for name, help_text, value in (
        ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", "41"),
        ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", "1024"),
    ):
        out += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"]
        out += [f'{name}{{{base},{mig}Hostname="{EXPORTER}"}} {value}' for _i, base, mig in rows]
    return "\n".join(out) + "\n"


def slice_items(
    taints: Mapping[str, Sequence[DeviceTaint]] | None = None, version: str = "v1"
) -> list[dict[str, Any]]:
    """The simulated driver's ResourceSlices for the node, in ``version``'s shape."""
    items: list[dict[str, Any]] = resource_slices(TAINT_NODE, taints=taints, api_version=version)[
        "items"
    ]
    return items


@pytest.fixture
def taint_node(full_stack: MakeStack) -> Callable[..., Awaitable[Stack]]:
    def make(slices: list[dict[str, Any]] | None, **options: Any) -> Awaitable[Stack]:
        """The node on the full stack; the API server holds ``slices`` (None: the ResourceSlice
        source is off)."""
        response = list_response(allocations(TAINT_NODE.pods))
        return full_stack(
            upstream=upstream_text(),
            nvml=nvml_state_of(TAINT_NODE),
            proc=lambda root: write_proc_tree(root, TAINT_NODE, BOOT + 86_400),
            node=NODE,
            pods=[pod_object(p, NODE) for p in TAINT_NODE.pods],
            podresources=True,
            kubelet=lambda _ctx: response,
            slices=slices,
            **options,
        )

    return make


def taint_rows(text: str) -> list[dict[str, str]]:
    """The gpu_device_taint samples of a body, as prometheus_client's parser reads them
    (each value checked to be 1)."""
    rows = []
    for family in text_string_to_metric_families(text):
        if family.name == DEVICE_TAINT:
            assert family.type == "gauge"
            for sample in family.samples:
                assert sample.value == 1.0, sample
                rows.append(dict(sample.labels))
    return rows


def source_up(text: str, source: str) -> float:
    (row,) = [
        s.value
        for f in text_string_to_metric_families(text)
        if f.name == "dcgm_enricher_source_up"
        for s in f.samples
        if s.labels["source"] == source
    ]
    return float(row)


def device(index: int, gi: int | None = None, profile: str = "") -> dict[str, str]:
    """The device labels the enricher's families copy from the upstream's series of GPU
    ``index`` (and MIG instance ``gi``): all but ``pci_bus_id``."""
    labels = {
        "gpu": str(index),
        "UUID": U[index],
        "device": f"nvidia{index}",
        "modelName": MODEL,
        "Hostname": EXPORTER,
        "node": NODE,  # the enricher's node label, on every series it serves
    }
    if gi is not None:
        labels |= {"GPU_I_ID": str(gi), "GPU_I_PROFILE": profile}
    return labels


def expected(*pairs: tuple[dict[str, str], DeviceTaint]) -> list[dict[str, str]]:
    no_pod = {"namespace": "", "pod": "", "container": ""}
    return [dev | no_pod | {"key": t.key, "value": t.value, "effect": t.effect} for dev, t in pairs]


def ordered(rows: list[dict[str, str]]) -> list[dict[str, str]]:
    return sorted(rows, key=lambda r: sorted(r.items()))


EXPECTED = expected(
    (device(0), UNMONITORED),
    (device(0), XID),
    (device(1), LOST),
    (device(2, 1, "3g.40gb"), XID_79),
)


# --------------------------------------------------------------------------- the whole app


async def test_device_taint_golden(
    taint_node: Callable[..., Awaitable[Stack]], update_golden: bool, promtools: list[str]
) -> None:
    """A tainted GPU a DRA pod uses, a lost GPU no pod uses, a tainted MIG instance: each
    taint one series with the device's upstream labels; the healthy devices have none."""
    node = await taint_node(slice_items(TAINTS))
    text = await node.scrape()
    check_golden("dra-taints", text, update_golden)
    for promtool in promtools:
        assert_valid_exposition(promtool, text)
    assert ordered(taint_rows(text)) == ordered(EXPECTED)
    # Written as prometheus_client writes it (its parser, then generate_latest).
    taint_text = "".join(line + "\n" for line in text.splitlines() if DEVICE_TAINT in line)
    assert taint_text == as_prometheus_client_writes(taint_text)
    assert source_up(text, "resourceslices") == 1.0
    # The DRA pod's allocation is on the same device labels, so the two join.
    (train,) = [r for r in series(text, "gpu_container_allocated") if r["pod"] == "train-0"]
    assert {k: train[k] for k in device(0)} == device(0)


@pytest.mark.parametrize("version", ["v1", "v1beta2", "v1beta1"])
async def test_each_served_version_gives_the_same_taints(
    taint_node: Callable[..., Awaitable[Stack]], version: str
) -> None:
    """v1 and v1beta2 put taints on the device, v1beta1 under ``basic``; a cluster serving
    only one of them gives the same series."""
    node = await taint_node(slice_items(TAINTS, version), slice_versions=[version])
    text = await node.scrape()
    assert ordered(taint_rows(text)) == ordered(EXPECTED)
    assert source_up(text, "resourceslices") == 1.0


async def test_slices_without_taints_give_no_series(
    taint_node: Callable[..., Awaitable[Stack]],
) -> None:
    """Healthy devices: the family is declared (the source is on), with no series."""
    node = await taint_node(slice_items())
    text = await node.scrape()
    assert f"# TYPE {DEVICE_TAINT} gauge\n" in text
    assert taint_rows(text) == []
    assert source_up(text, "resourceslices") == 1.0


async def test_a_dra_mig_device_is_its_instance_with_dcgm_exporters_labels(
    taint_node: Callable[..., Awaitable[Stack]],
) -> None:
    """The MIG device eval-0's claim names maps, through its slice's uuid and parentUUID, to
    MIG instance 1's series; its allocation carries dra_mig_profile and dra_mig_device_uuid
    as dcgm-exporter writes them."""
    node = await taint_node(slice_items())
    text = await node.scrape()
    (row,) = [r for r in series(text, "gpu_container_allocated") if r["pod"] == "eval-0"]
    assert {k: row[k] for k in device(2, 1, "3g.40gb")} == device(2, 1, "3g.40gb")
    assert (row["dra_mig_profile"], row["dra_mig_device_uuid"]) == ("3g.40gb", MIG_1)
    assert row["dra_device_name"] == "gpu-2-mig-9-0-4"
    (train,) = [r for r in series(text, "gpu_container_allocated") if r["pod"] == "train-0"]
    assert "dra_mig_profile" not in train and "dra_mig_device_uuid" not in train


async def test_the_source_switched_off_writes_no_family(
    taint_node: Callable[..., Awaitable[Stack]],
) -> None:
    node = await taint_node(None)
    text = await node.scrape()
    assert DEVICE_TAINT not in text


async def test_a_cluster_without_dra_is_not_a_failure(
    full_stack: MakeStack,
) -> None:
    """No version of resource.k8s.io serves ResourceSlices and no pod holds a DRA device:
    the source lists for taints (health watching), finds no API, and stays up."""
    node = await full_stack(
        upstream=upstream_text(),
        nvml=nvml_state_of(TAINT_NODE),
        node=NODE,
        pods=[],
        podresources=True,
        kubelet=lambda _ctx: list_response([]),
        slices=[],
        slice_versions=[],
    )
    text = await node.scrape()
    assert node.api is not None and len(node.api.requests("slices")) == 3
    assert source_up(text, "resourceslices") == 1.0
    assert taint_rows(text) == []


async def test_taints_are_listed_without_any_dra_allocation(
    full_stack: MakeStack,
) -> None:
    """A node whose pods hold no DRA device still reports its devices' taints: the source
    lists on its own (every minute), not only for the kubelet's DRA devices."""
    node = await full_stack(
        upstream=upstream_text(),
        nvml=nvml_state_of(TAINT_NODE),
        node=NODE,
        pods=[],
        podresources=True,
        kubelet=lambda _ctx: list_response([]),
        slices=slice_items({U[1]: (LOST,)}),
    )
    text = await node.scrape()
    assert taint_rows(text) == expected((device(1), LOST))


# --------------------------------------------------------------------------- pure


SNAPSHOT = GpuSnapshot(
    devices=TAINT_NODE.gpus,
    migs=(TAINT_NODE.migs[0],),  # NVML no longer lists MIG_2
)
K = {name: (DRA_DRIVER, NODE, name) for name in ("gpu-0", "gpu-1", "mig-1", "mig-2", "odd")}
UUIDS = {
    K["gpu-0"]: U[0],
    K["gpu-1"]: U[1],
    K["mig-1"]: MIG_1,
    K["mig-2"]: MIG_2,
    K["odd"]: f"{U[3]}::1",
}


@pytest.mark.parametrize(
    ("taints", "want"),
    [
        pytest.param({K["gpu-0"]: (XID,)}, {(U[0], ""): (XID,)}, id="gpu"),
        pytest.param({K["mig-1"]: (XID_79,)}, {(U[2], "1"): (XID_79,)}, id="mig-through-nvml"),
        pytest.param({K["mig-2"]: (XID_79,)}, {}, id="mig-nvml-does-not-list"),
        pytest.param({K["odd"]: (LOST,)}, {}, id="replica-is-no-device"),
        pytest.param({(DRA_DRIVER, NODE, "nameless"): (LOST,)}, {}, id="no-uuid"),
        pytest.param(
            {K["gpu-0"]: (XID, LOST), ("x.io", "p", "g"): (XID, UNMONITORED)},
            {(U[0], ""): (LOST, UNMONITORED, XID)},
            id="two-drivers-one-gpu-merged-sorted",
        ),
        pytest.param({K["gpu-1"]: ()}, {}, id="no-taints"),
    ],
)
def test_device_taints(
    taints: dict[tuple[str, str, str], tuple[DeviceTaint, ...]],
    want: dict[tuple[str, str], tuple[DeviceTaint, ...]],
) -> None:
    uuids = {**UUIDS, ("x.io", "p", "g"): U[0]}
    assert device_taints(taints, uuids, SNAPSHOT) == want


@pytest.mark.parametrize(
    "value",
    ['quote " in it', "back\\slash", "new\nline", "x" * 5000],
    ids=["quote", "backslash", "newline", "oversized"],
)
def test_every_label_value_is_escaped_and_bounded(value: str) -> None:
    """What reaches the family is checked by the parser (label names and values), but the
    device labels are the upstream's and the family escapes and bounds whatever it gets."""
    identities = {(U[0], ""): (("UUID", U[0]), ("modelName", value))}
    text = render_device_taints(
        {(U[0], ""): (DeviceTaint("example.com/k", value, "None"),)}, identities
    )
    (row,) = taint_rows(text)
    assert row["modelName"] == row["value"] == value[:1024]
    assert text == as_prometheus_client_writes(text)


def test_render_families_writes_the_family_only_when_asked_or_tainted() -> None:
    assert DEVICE_TAINT not in render_families([], {}, RenderOptions())
    declared = render_families([], {}, RenderOptions(device_taints=True))
    assert f"# TYPE {DEVICE_TAINT} gauge" in declared and taint_rows(declared) == []
    tainted = render_families([], {}, RenderOptions(), taints={(U[1], ""): (LOST,)})
    assert taint_rows(tainted) == [
        {"UUID": U[1], "namespace": "", "pod": "", "container": ""}
        | {"key": LOST.key, "value": "", "effect": "NoSchedule"}
    ]
