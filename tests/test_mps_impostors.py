"""A process name is not a pass (#30): only the host and the pods the MPS flags admit run the
MPS daemon; a tenant's process named ``nvidia-cuda-mps-*`` is its pod's like any other.

Real parts: the real aiohttp app and pipeline, pynvml against the fake libnvidia-ml built from
C (no GPU here), a /proc tree on disk read by the real procfs source, the real kubernetes
client watching the pods on the API-server stand-in (no cluster here), the `resolve` command,
and promtool running the shipped alert rules over what the enricher served. Before the fix
the tenant's 8 GiB below went to ``gpu_unattributed_memory_used_bytes{reason="mps_server"}``.
"""

from __future__ import annotations

import io
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from devkit.nvmlfake import nvml_state_of
from devkit.promtool import firing
from enricher.cli import parse_config
from enricher.commands import resolve
from enricher.simnode.api import pod_object
from enricher.simnode.fakeproc import write_proc_tree
from enricher.simnode.node import SimNode, SimPod, SimProc
from enricher.sourcetable import kubernetes_source_options

from .conftest import assert_valid_exposition
from .harness import MEMORY_REASONS, MakeStack, Stack, check_golden, cid, series
from .test_golden import BOOT, FIXTURES, GOLDEN_NODE, NODE, U

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "rules" / "dcgm-enricher.rules.yaml"
GIB = 1 << 30
GIB_MIB = 1024
MPS_SERVER = "nvidia-cuda-mps-server"  # /proc/<pid>/comm keeps "nvidia-cuda-mps"
MPS_CONTROL = "nvidia-cuda-mps-control"

# A Jupyter user who asked for no GPU and runs a training job under the MPS server's name.
MALLORY = SimPod(
    "jupyterhub",
    "jupyter-mallory",
    "66666666-aaaa-4aaa-8aaa-000000000006",
    "notebook",
    cid(0x61),
    None,
    None,
    annotations=(("hub.jupyter.org/username", "mallory"),),
)
# A tenant that got a GPU and names its process after the control daemon.
TRAINER = SimPod(
    "ml",
    "train-quiet-0",
    "77777777-bbbb-4bbb-8bbb-000000000007",
    "trainer",
    cid(0x71),
    ("Job", "train-quiet"),
    "nvidia.com/gpu",
    devices=(U[1],),
)
# A tenant's pod with the GPU Operator's MPS daemon labels, in the tenant's own namespace:
# pod labels are whoever creates the pod's to choose, the namespace is not.
LOOKALIKE = SimPod(
    "ml",
    "nvidia-device-plugin-mps-control-daemon-fake",
    "88888888-cccc-4ccc-8ccc-000000000008",
    "mps-control-daemon",
    cid(0x81),
    None,
    None,
    labels=(("app", "nvidia-device-plugin-mps-control-daemon"),),
)
# The real daemon, as NVIDIA's device plugin Helm chart deploys it.
DAEMON = SimPod(
    "nvidia-device-plugin",
    "nvdp-nvidia-device-plugin-mps-control-daemon-x2k9q",
    "99999999-dddd-4ddd-8ddd-000000000009",
    "mps-control-daemon-ctr",
    cid(0x91),
    ("DaemonSet", "nvdp-nvidia-device-plugin-mps-control-daemon"),
    None,
    labels=(
        ("app.kubernetes.io/name", "nvidia-device-plugin"),
        ("app.kubernetes.io/instance", "nvdp"),
    ),
)
PODS = (MALLORY, TRAINER, LOOKALIKE, DAEMON)
IMPOSTOR_NODE = SimNode(
    NODE,
    GOLDEN_NODE.gpus,
    GOLDEN_NODE.migs,
    (
        SimProc(5001, MPS_SERVER, 0, None, 8 * GIB_MIB, 0.0, MALLORY, samples=((100, 60),)),
        SimProc(5002, MPS_CONTROL, 1, None, 4 * GIB_MIB, 0.0, TRAINER, samples=((100, 30),)),
        SimProc(5003, MPS_SERVER, 1, None, GIB_MIB // 2, 0.0, DAEMON, samples=((100, 0),)),
        SimProc(5004, MPS_SERVER, 3, None, GIB_MIB // 4, 0.0, LOOKALIKE, samples=((100, 5),)),
        SimProc(
            5005,
            MPS_CONTROL,
            3,
            None,
            GIB_MIB // 8,
            0.0,
            None,
            host_cgroup="/system.slice/nvidia-mps.service",
            samples=((100, 0),),
        ),
    ),
    PODS,
    first_ticks=1000,
    ticks_apart=1,
)
TENANTS = {
    5001: ("jupyterhub", "jupyter-mallory", "notebook"),
    5002: ("ml", "train-quiet-0", "trainer"),
    5004: ("ml", "nvidia-device-plugin-mps-control-daemon-fake", "mps-control-daemon"),
}


async def start(full_stack: MakeStack, **config: Any) -> Stack:
    return await full_stack(
        upstream=(FIXTURES / "node.prom").read_text(),
        nvml=nvml_state_of(IMPOSTOR_NODE),
        proc=lambda root: write_proc_tree(root, IMPOSTOR_NODE, BOOT + 86_400),
        node=NODE,
        pods=[pod_object(p, NODE) for p in PODS],
        kube={"annotation_keys": ["hub.jupyter.org/username"], **config.pop("kube", {})},
        collector_process=True,
        **config,
    )


def values(text: str, name: str, *keys: str) -> dict[tuple[str, ...], float]:
    return {tuple(s.get(k, "") for k in keys): float(s["__value__"]) for s in series(text, name)}


async def test_impostors_golden(
    full_stack: MakeStack, update_golden: bool, promtools: list[str]
) -> None:
    text = await (await start(full_stack)).scrape()
    check_golden("mps-impostors", text, update_golden)
    for promtool in promtools:
        assert_valid_exposition(promtool, text)


async def test_a_tenant_named_as_the_mps_server_is_its_pods(full_stack: MakeStack) -> None:
    text = await (await start(full_stack)).scrape()
    memory = values(
        text, "gpu_container_memory_used_bytes", "UUID", "namespace", "pod", "container"
    )
    assert memory == {
        (U[0], "jupyterhub", "jupyter-mallory", "notebook"): 8 * GIB,
        (U[1], "ml", "train-quiet-0", "trainer"): 4 * GIB,
        (U[3], "ml", "nvidia-device-plugin-mps-control-daemon-fake", "mps-control-daemon"): (
            GIB / 4
        ),
    }
    # What is left is the real daemon's: its pod (admitted by the flags) and the host's.
    unattributed = values(text, "gpu_unattributed_memory_used_bytes", "UUID", "reason")
    assert {k: v for k, v in unattributed.items() if v and k[1] not in MEMORY_REASONS} == {
        (U[1], "mps_server"): GIB / 2,
        (U[3], "mps_server"): GIB / 8,
    }
    power = values(text, "gpu_container_power_watts", "UUID", "pod")
    assert power[(U[0], "jupyter-mallory")] > 0  # the only workload on GPU 0: all its draw
    assert {pod for _, pod in power} == {p for _, p, _ in TENANTS.values()}
    # The device series name the tenant that uses each GPU, never the daemon.
    owners = {(s["UUID"], s["pod"]) for s in series(text, "DCGM_FI_DEV_FB_USED")}
    assert (U[0], "jupyter-mallory") in owners and (U[1], "train-quiet-0") in owners
    assert not any("mps-control-daemon-x2k9q" in pod for _, pod in owners)
    info = {s["pod"]: s for s in series(text, "gpu_pod_info")}
    assert info["jupyter-mallory"]["gpu_requested"] == "false"
    assert info["jupyter-mallory"]["annotation_hub_jupyter_org_username"] == "mallory"


async def test_resolve_agrees_on_the_impostors(full_stack: MakeStack) -> None:
    node = await start(full_stack)
    text = await node.scrape()
    served = {
        int(s["pid"]): (s["namespace"], s["pod"], s["container"])
        for s in series(text, "gpu_process_memory_used_bytes")
    }
    assert {pid: owner for pid, owner in served.items() if owner[1]} == TENANTS
    out = io.StringIO()
    resolve(replace(node.config, procfs=str(node.proc_root)), sorted(served), out, pods=node.cache)
    said = {rec["pid"]: rec for rec in map(json.loads, out.getvalue().splitlines())}
    for pid, (namespace, pod, container) in TENANTS.items():
        assert (said[pid]["namespace"], said[pid]["pod"], said[pid]["container"]) == (
            namespace,
            pod,
            container,
        )
    assert said[5003]["reason"] == said[5005]["reason"] == "mps_server"
    assert said[5003]["mps_daemon_pod"] == f"{DAEMON.namespace}/{DAEMON.name}"
    assert "pod" not in said[5003] and "mps_daemon_pod" not in said[5005]


async def test_the_flags_choose_the_daemon_pods(full_stack: MakeStack) -> None:
    """--mps.daemon-pod-selector and --mps.daemon-pod-namespace reach the pod watch: admitting
    the namespace ml and the GPU Operator's label makes the lookalike the daemon, and the Helm
    chart's daemon pod (no longer admitted) its own pod's."""
    _, config, _ = parse_config(
        [
            "--mps.daemon-pod-selector=app=nvidia-device-plugin-mps-control-daemon",
            "--mps.daemon-pod-namespace=ml",
        ]
    )
    admitted = kubernetes_source_options(config)["mps_daemon_pods"]
    text = await (await start(full_stack, kube={"mps_daemon_pods": admitted})).scrape()
    unattributed = values(text, "gpu_unattributed_memory_used_bytes", "UUID", "reason")
    assert {k: v for k, v in unattributed.items() if v and k[1] not in MEMORY_REASONS} == {
        (U[3], "mps_server"): GIB / 4 + GIB / 8,  # the lookalike, now admitted, and the host
    }
    memory = values(text, "gpu_container_memory_used_bytes", "pod")
    assert memory[("nvdp-nvidia-device-plugin-mps-control-daemon-x2k9q",)] == GIB / 2
    assert ("jupyter-mallory",) in memory  # a Jupyter pod is never admitted by a label alone


def alerts_over(text: str, tmp_path: Path, promtool: str, alert: str, want: list[Any]) -> str:
    """promtool runs the shipped rules over ``text`` held for 30 minutes and checks which
    pods ``alert`` fires for at 20m; returns its output (raises on a mismatch)."""
    expr = f'count by (namespace, pod) (ALERTS{{alertname="{alert}",alertstate="firing"}})'
    return firing(text, tmp_path / "impostor-test.yml", promtool, expr, want, [RULES])


async def test_the_unrequested_use_alert_fires_for_the_impostor(
    full_stack: MakeStack, tmp_path: Path, promtools: list[str]
) -> None:
    text = await (await start(full_stack)).scrape()
    # The lookalike asked for no GPU either: it is a tenant's pod like the notebook.
    want = [
        {"labels": '{namespace="jupyterhub", pod="jupyter-mallory"}', "value": 1},
        {
            "labels": '{namespace="ml", pod="nvidia-device-plugin-mps-control-daemon-fake"}',
            "value": 1,
        },
    ]
    for i, promtool in enumerate(promtools):
        (tmp := tmp_path / f"prom{i}").mkdir()
        assert "SUCCESS" in alerts_over(text, tmp, promtool, "GpuUsedWithoutRequest", want)
        # The check can fail: asked for nothing, promtool says what did fire.
        with pytest.raises(AssertionError, match="FAILED"):
            alerts_over(text, tmp, promtool, "GpuUsedWithoutRequest", [])
