"""docs/threat-model.md against the code: each signal a tenant sets moves only what the signal
table says it moves, and the page cites real tests, real flags and the code's own figures.

Real parts, as tests/test_mps_impostors.py has them: the real aiohttp app and pipeline, pynvml
against the fake libnvidia-ml built from C (no GPU here), a /proc tree on disk read by the real
procfs source, the real kubernetes client watching the API-server stand-in (no cluster here),
the real Docker source on the Docker Engine API stand-in (no Docker engine on CI machines), and
promtool running the shipped alert rules over what the enricher served.
"""

from __future__ import annotations

import argparse
import ast
import re
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from devkit.nvmlfake import nvml_state_of
from devkit.promtool import firing
from enricher import (
    app,
    cgroups,
    docker,
    kube,
    nvml,
    nvmlcalls,
    podparse,
    podresources,
    procfs,
    resourceslices,
)
from enricher.config import Config
from enricher.labels import Owner, RewritePlan, relabel
from enricher.simnode import fakeproc
from enricher.simnode.api import pod_object
from enricher.simnode.fakeproc import write_proc_tree
from enricher.simnode.node import SimNode, SimPod, SimProc

from .conftest import assert_valid_exposition
from .dockerapi import compose_labels
from .harness import MakeStack, Stack, cid, docker_engine, series
from .test_docker_golden import BOOT as HOST_BOOT
from .test_docker_golden import BOXES, HOST_NODE, TRAIN, Box, box_proc, cgroup_v2
from .test_docker_golden import FIXTURE as HOST_FIXTURE
from .test_docker_golden import U as HOST_U
from .test_golden import BOOT, FIXTURES, GOLDEN_NODE, NODE, STATIC, STATIC_HASH, U

ROOT = Path(__file__).resolve().parent.parent
THREAT_MODEL = ROOT / "docs" / "threat-model.md"
RULES = ROOT / "rules" / "dcgm-enricher.rules.yaml"
SIGNAL_HEADING = "## Every signal, who sets it, and what it can move"
GIB = 1 << 30
GIB_MIB = 1024
USERNAME = "hub.jupyter.org/username"

# Every signal the enricher reads: each must have a row of the signal table whose first cell
# contains this text. A new source (or a new field parsed from one) adds its entry here.
SIGNALS = (
    "`/proc/<pid>/cgroup`",
    "command name",
    "start time",
    "`/proc/stat`",
    "NVML process lists",
    "NVML devices",
    "resource requests",
    "container statuses",
    "pod name",
    "label and annotation values",
    "label keys",
    "owner references",
    "`kubernetes.io/config.mirror`",
    "`spec.nodeName`",
    "PodResources",
    "DRA claims",
    "ResourceSlices",
    "Docker container name",
    "`com.docker.compose.*`",
    "upstream's series",
    "upstream pod",
    "its own process",
    "HTTP requests",
)

# --------------------------------------------------------------------------- a tenant's node

# Alice's notebook, and Mallory's, whose annotation says it is Alice's and whose label says it
# belongs to the finance team. Neither asked for a GPU.
ALICE = SimPod(
    "jupyterhub",
    "jupyter-alice",
    "a1a1a1a1-0000-4000-8000-00000000000a",
    "notebook",
    cid(0xA1),
    None,
    None,
    annotations=((USERNAME, "alice"),),
)
MALLORY = SimPod(
    "jupyterhub",
    "jupyter-mallory",
    "b2b2b2b2-0000-4000-8000-00000000000b",
    "notebook",
    cid(0xB2),
    None,
    None,
    annotations=((USERNAME, "alice"),),
    labels=(("team", "finance"),),
)
# A pod that runs its own container runtime (a kind node, Docker in the pod) and makes a
# cgroup below its own named after the victim's pod and container.
NESTER = SimPod(
    "ml",
    "kind-in-pod-0",
    "c3c3c3c3-0000-4000-8000-00000000000c",
    "node",
    cid(0xC3),
    None,
    None,
)
VICTIM = SimPod(
    "research",
    "bert-0",
    "d4d4d4d4-0000-4000-8000-00000000000d",
    "trainer",
    cid(0xD4),
    ("Job", "bert-finetune"),
    "nvidia.com/gpu",
)
# A bare pod that writes its own owner reference (another team's StatefulSet name) and asks
# for an nvidia.com resource the node does not offer.
FAKER = SimPod(
    "ml",
    "billing-0",
    "e5e5e5e5-0000-4000-8000-00000000000e",
    "main",
    cid(0xE5),
    ("StatefulSet", "triton"),
    "nvidia.com/not-offered",
)
# A tenant's pod carrying the static pod's mirror annotations (and a Node owner), as the
# kubelet writes them on the real mirror pod: the API server accepts them from anyone.
FORGER = SimPod(
    "ml",
    "forged-mirror",
    "f6f6f6f6-0000-4000-8000-00000000000f",
    "c",
    cid(0xF6),
    None,
    None,
    mirror_of=STATIC_HASH,
)
# 15 characters, the kernel's limit: a ")" with fields after it, a quote, a brace, a newline.
HOSTILE_COMM = ') S 1 2 "}\n{ 9 '
NESTED_CGROUP = (
    fakeproc.cgroup_v2_systemd(NESTER.uid, NESTER.container_id).rstrip("\n")
    + fakeproc.cgroup_v2_systemd(VICTIM.uid, VICTIM.container_id)[len("0::") :]
)
RESTARTED_STATIC = fakeproc.cgroup_v1_cgroupfs(STATIC_HASH, cid(0x5F), qos=STATIC.qos)
PODS = (ALICE, MALLORY, NESTER, VICTIM, FAKER, STATIC, FORGER)
THREAT_NODE = SimNode(
    NODE,
    GOLDEN_NODE.gpus,
    GOLDEN_NODE.migs,
    (
        SimProc(6001, "python", 0, None, 2 * GIB_MIB, 0.0, ALICE, samples=((100, 50),)),
        SimProc(6002, HOSTILE_COMM, 1, None, 8 * GIB_MIB, 0.0, MALLORY, samples=((100, 60),)),
        SimProc(6003, "python", 3, None, 4 * GIB_MIB, 0.0, NESTER, cgroup=NESTED_CGROUP),
        SimProc(6004, "python", 3, None, GIB_MIB, 0.0, VICTIM, samples=((100, 40),)),
        SimProc(6005, "probe", 2, 1, GIB_MIB // 2, 0.0, STATIC),
        SimProc(6006, "python", 2, 2, 3 * GIB_MIB, 0.0, FAKER, samples=((100, 30),)),
        # The static pod's new container, not yet in its status: only the hash names the pod.
        SimProc(6007, "probe", 2, 3, GIB_MIB // 4, 0.0, STATIC, cgroup=RESTARTED_STATIC),
    ),
    PODS,
    first_ticks=1000,
    ticks_apart=1,
)


async def start(full_stack: MakeStack, pods: tuple[SimPod, ...] = PODS) -> Stack:
    return await full_stack(
        upstream=(FIXTURES / "node.prom").read_text(),
        nvml=nvml_state_of(THREAT_NODE),
        proc=lambda root: write_proc_tree(root, THREAT_NODE, BOOT + 86_400),
        node=NODE,
        pods=[pod_object(p, NODE) for p in pods],
        kube={"label_keys": ["team"], "annotation_keys": [USERNAME]},
        kube_pod_labels=("team",),
        kube_pod_annotations=(USERNAME,),
        collector_process=True,
    )


def memory(text: str, uuid: str) -> dict[tuple[str, str, str], float]:
    """gpu_container_memory_used_bytes of one GPU (all its MIG instances), by its owner."""
    return {
        (s["namespace"], s["pod"], s["container"]): float(s["__value__"])
        for s in series(text, "gpu_container_memory_used_bytes")
        if s["UUID"] == uuid
    }


def unattributed(text: str) -> dict[tuple[str, str], float]:
    return {
        (s["UUID"], s["reason"]): float(s["__value__"])
        for s in series(text, "gpu_unattributed_memory_used_bytes")
        if float(s["__value__"])
    }


def pod_info(text: str) -> dict[str, dict[str, str]]:
    return {s["pod"]: s for s in series(text, "gpu_pod_info")}


def named_pods(text: str) -> set[str]:
    """Every pod any series of the output names."""
    return {
        s.labels["pod"]
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.labels.get("pod")
    }


async def test_a_nested_cgroup_naming_another_pod_is_not_that_pod(full_stack: MakeStack) -> None:
    """The outermost pod segment is the one this node's kubelet made: a cgroup a pod's own
    runtime made below it, named after another pod and container, counts as the outer pod."""
    text = await (await start(full_stack)).scrape()
    assert memory(text, U[3]) == {
        ("ml", "kind-in-pod-0", "node"): 4 * GIB,
        ("research", "bert-0", "trainer"): GIB,  # its own process, nothing more
    }
    assert not any(uuid == U[3] for uuid, _ in unattributed(text))


async def test_a_hostile_process_name_moves_only_its_own_process_name(
    full_stack: MakeStack, promtools: list[str]
) -> None:
    """A name holding ")" and fields after it shifts no field of stat (the start time stays,
    so no pid_reused); it is the process's own process_name, escaped, and it names no pod."""
    text = await (await start(full_stack)).scrape()
    for promtool in promtools:
        assert_valid_exposition(promtool, text)
    (row,) = (s for s in series(text, "gpu_process_memory_used_bytes") if s["pid"] == "6002")
    assert row["process_name"] == HOSTILE_COMM
    assert (row["namespace"], row["pod"], row["container"]) == (
        "jupyterhub",
        "jupyter-mallory",
        "notebook",
    )
    assert memory(text, U[1]) == {("jupyterhub", "jupyter-mallory", "notebook"): 8 * GIB}
    assert not any(reason == "pid_reused" for _, reason in unattributed(text))


async def test_a_tenants_labels_and_annotations_describe_only_its_own_pod(
    full_stack: MakeStack,
) -> None:
    """Mallory's pod says it is Alice's and the finance team's: its own gpu_pod_info says so,
    Alice's pod and Alice's GPU use are untouched."""
    text = await (await start(full_stack)).scrape()
    info = pod_info(text)
    assert info["jupyter-mallory"]["annotation_hub_jupyter_org_username"] == "alice"
    assert info["jupyter-mallory"]["label_team"] == "finance"
    assert info["jupyter-alice"]["annotation_hub_jupyter_org_username"] == "alice"
    assert info["jupyter-alice"].get("label_team", "") == ""
    assert memory(text, U[0]) == {("jupyterhub", "jupyter-alice", "notebook"): 2 * GIB}
    assert memory(text, U[1]) == {("jupyterhub", "jupyter-mallory", "notebook"): 8 * GIB}


async def test_requests_and_owner_references_describe_only_their_own_pod(
    full_stack: MakeStack,
) -> None:
    """A bare pod's own owner reference and request: its own workload and gpu_requested, in
    its own namespace; the StatefulSet it names is not touched (none runs here)."""
    text = await (await start(full_stack)).scrape()
    faker = pod_info(text)["billing-0"]
    assert (faker["namespace"], faker["workload_kind"], faker["workload_name"]) == (
        "ml",
        "StatefulSet",
        "triton",
    )
    assert faker["gpu_requested"] == "true"  # the spec as written: the node offers no such thing
    assert memory(text, U[2])[("ml", "billing-0", "main")] == 3 * GIB
    assert pod_info(text)["jupyter-mallory"]["gpu_requested"] == "false"


async def test_a_forged_mirror_annotation_takes_no_static_pod(full_stack: MakeStack) -> None:
    """A tenant's pod claiming a static pod's hash: the static pod's container ID still names
    it; where only the hash does (a container not yet in the status), two pods claim it and
    neither is named (pod_not_found, which GpuMemoryUnattributed reports). The forger never
    shows. Without the forger the hash names the real mirror pod: the check can fail."""
    mirror = ("kube-system", STATIC.name, STATIC.container)
    text = await (await start(full_stack)).scrape()
    assert memory(text, U[2]) == {mirror: GIB / 2, ("ml", "billing-0", "main"): 3 * GIB}
    assert unattributed(text) == {(U[2], "pod_not_found"): GIB / 4}
    assert "forged-mirror" not in named_pods(text)
    assert "forged-mirror" not in pod_info(text)

    alone = await (await start(full_stack, tuple(p for p in PODS if p is not FORGER))).scrape()
    assert unattributed(alone) == {}
    assert memory(alone, U[2])[("kube-system", STATIC.name, "")] == GIB / 4


async def test_who_the_unrequested_use_alert_names(
    full_stack: MakeStack, tmp_path: Path, promtools: list[str]
) -> None:
    """GpuUsedWithoutRequest names each pod that asked for no GPU, with the user its own
    annotation gives: Mallory's alert says "alice", about Mallory's pod. The pod that asked for
    a resource the node does not offer is not alerted on: the gap the threat model states."""
    text = await (await start(full_stack)).scrape()
    expr = (
        f"count by (namespace, pod, annotation_{USERNAME.replace('.', '_').replace('/', '_')}) "
        '(ALERTS{alertname="GpuUsedWithoutRequest",alertstate="firing"})'
    )
    user = "annotation_hub_jupyter_org_username"
    want = [
        {"labels": f'{{namespace="jupyterhub", pod="jupyter-alice", {user}="alice"}}', "value": 1},
        {
            "labels": f'{{namespace="jupyterhub", pod="jupyter-mallory", {user}="alice"}}',
            "value": 1,
        },
        {"labels": '{namespace="ml", pod="kind-in-pod-0"}', "value": 1},
    ]
    for i, promtool in enumerate(promtools):
        (tmp := tmp_path / f"prom{i}").mkdir()
        assert "SUCCESS" in firing(
            text, tmp / "threat-model-test.yml", promtool, expr, want, [RULES]
        )
        with pytest.raises(AssertionError, match="FAILED"):
            firing(text, tmp / "threat-model-test.yml", promtool, expr, want[1:], [RULES])


def test_a_pods_label_keys_never_strip_device_or_pod_labels() -> None:
    """dcgm-exporter named the tenant's pod, the enricher names another: the labels named like
    the tenant pod's label keys go, but no identity label and no pod label, whatever the
    tenant called its labels."""
    keys = frozenset(
        {"gpu", "UUID", "device", "modelName", "Hostname", "GPU_I_ID", "pod_uid", "team"}
        | {"namespace", "pod", "container", "pod_namespace", "pod_name", "container_name"}
    )
    plan = RewritePlan(
        owners={(U[0], ""): Owner("research", "bert-0", "trainer", VICTIM.uid)},
        pod_labels={("ml", "tenant-0"): keys},
    )
    pairs = [
        ("gpu", "0"),
        ("UUID", U[0]),
        ("device", "nvidia0"),
        ("modelName", "NVIDIA A100-SXM4-80GB"),
        ("Hostname", NODE),
        ("container", "main"),
        ("namespace", "ml"),
        ("pod", "tenant-0"),
        ("pod_uid", "t"),
        ("team", "finance"),
    ]
    assert dict(relabel(pairs, (U[0], ""), plan)) == {
        "gpu": "0",
        "UUID": U[0],
        "device": "nvidia0",
        "modelName": "NVIDIA A100-SXM4-80GB",
        "Hostname": NODE,
        "container": "trainer",
        "namespace": "research",
        "pod": "bert-0",
        "pod_uid": VICTIM.uid,
    }


# --------------------------------------------------------------------------- a Docker host

# Any container creator can set any compose labels: this one says it is lab's train service.
LOOKALIKE = Box("lab-train-copy", "ghcr.io/someone/miner:1", compose_labels("lab", "train", 2))


async def test_compose_labels_describe_only_their_own_container(full_stack: MakeStack) -> None:
    """A container claiming another project's compose labels: its own gpu_container_info row
    says so (a compose join then counts its memory in that project), and the container it
    copies keeps its own row and its own memory."""
    host = SimNode(
        HOST_NODE.name,
        HOST_NODE.gpus,
        HOST_NODE.migs,
        (
            *HOST_NODE.procs,
            box_proc(4001, "python", 3, None, 5 * 1024, cgroup_v2(f"/docker/{LOOKALIKE.id}")),
        ),
        (),
        first_ticks=1000,
        ticks_apart=1,
    )
    boxes = [*BOXES, LOOKALIKE]
    with docker_engine((b.name, b.image, b.labels) for b in boxes) as api:
        stack = await full_stack(
            upstream=HOST_FIXTURE.read_text(),
            nvml=nvml_state_of(host),
            proc=lambda root: write_proc_tree(root, host, HOST_BOOT + 86_400),
            node="",
            docker_host=f"unix://{api.socket_path}",
            upstream_timeout=2.0,
        )
        text = await stack.scrape()
    info = {s["container_id"]: s for s in series(text, "gpu_container_info")}
    assert (info[LOOKALIKE.id]["container"], info[LOOKALIKE.id]["compose_project"]) == (
        "lab-train-copy",
        "lab",
    )
    assert (info[TRAIN.id]["container"], info[TRAIN.id]["compose_project"]) == (
        "lab-train-1",
        "lab",
    )
    used = {
        s["container"]: float(s["__value__"])
        for s in series(text, "gpu_container_memory_used_bytes")
        if s["container"] in ("lab-train-1", "lab-train-copy")
    }
    assert used == {"lab-train-1": 11 * GIB, "lab-train-copy": 5 * GIB}
    (copy,) = (s for s in series(text, "gpu_container_memory_used_bytes") if s["UUID"] == HOST_U[3])
    assert copy["container"] == "lab-train-copy"


# --------------------------------------------------------------------------- the page itself


def threat_model() -> str:
    return THREAT_MODEL.read_text()


def defined_tests(path: Path) -> set[str]:
    """The top-level test functions of a test file, by parsing it (pytest is not run)."""
    tree = ast.parse(path.read_text(), str(path))
    return {
        node.name
        for node in tree.body
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.name.startswith("test_")
    }


def test_every_test_the_threat_model_cites_exists() -> None:
    cited = re.findall(r"`(tests/[\w/]+\.py)(?:::(\w+))?`", threat_model())
    assert len(cited) > 20, "the page cites (almost) no tests"
    for path, name in cited:
        assert (ROOT / path).is_file(), path
        if name:
            assert name in defined_tests(ROOT / path), f"{path}::{name} does not exist"


def signal_rows() -> list[list[str]]:
    section = threat_model().split(f"{SIGNAL_HEADING}\n", 1)[1].split("\n## ", 1)[0]
    rows = [
        [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
        for line in section.splitlines()
        if line.startswith("|")
    ]
    assert rows[0][:4] == ["Signal", "Who sets it", "What a hostile value can move", "Test"]
    return rows[2:]


def test_every_signal_has_a_row_and_every_row_a_test() -> None:
    rows = signal_rows()
    for signal in SIGNALS:
        assert any(signal.lower() in row[0].lower() for row in rows), f"no row for {signal}"
    for row in rows:
        assert len(row) == 4, row
        assert re.search(r"`tests/[\w/]+\.py::\w+`", row[3]), f"no named test: {row[0]}"


def _defaults(parser: argparse.ArgumentParser) -> dict[str, Any]:
    """Every flag of every command, with its default."""
    found: dict[str, Any] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for command in action.choices.values():
                for a in command._actions:
                    found |= {o: a.default for o in a.option_strings}
    return found


def test_the_flags_it_names_exist_with_the_defaults_it_states(
    parser: argparse.ArgumentParser,
) -> None:
    """Every ``--flag`` of ours the page names is a flag of a command; every "`--flag`
    (default `value`)" states the parser's default."""
    text = threat_model()
    defaults = _defaults(parser)
    named = set(re.findall(r"(?<![\w-])(--(?:no-)?[a-z]+\.[a-z][\w.-]*[a-z])", text))
    assert named, "the page names no flag"
    for flag in named:
        assert flag in defaults or "--" + flag.removeprefix("--no-") in defaults, flag
    stated = re.findall(r"`(--[a-z][\w.-]*)` \(default `([^`]*)`\)", " ".join(text.split()))
    assert len(stated) >= 4, f"the page states fewer defaults than it did: {stated}"
    for flag, value in stated:
        assert str(defaults[flag]) == value, (flag, value, defaults[flag])


# (what the page says, with the figure as a group; the figure in the code)
FIGURES = [
    (r"`--upstream\.max-bytes` \((\d+) MiB\)", Config().upstream_max_bytes >> 20),
    (r"`--upstream\.timeout` \((\d+) s\)", Config().upstream_timeout),
    (r"cut to (\d+) characters", podparse.MAX_VALUE_CHARS),
    (r"holds at most (\d+) pods", kube.MAX_PODS),
    (r"a pod list is read up to (\d+) MiB", kube.MAX_LIST_BYTES >> 20),
    (r"at most (\d+) GPUs", nvml.MAX_DEVICES),
    (r"(\d+) MIG slots", nvml.MAX_MIG_SLOTS),
    (r"(\d+) processes per list", nvmlcalls.MAX_PROCESSES_PER_LIST),
    (r"cut at (\d+) KiB", cgroups.MAX_FILE_BYTES >> 10),
    (r"lines at (\d+) KiB", cgroups.MAX_LINE_CHARS >> 10),
    (r"header lines and fields at (\d+) bytes", app.MAX_REQUEST_HEADER_BYTES),
    (r"agrees with it within (\d+) s", procfs.BOOT_CLOCK_MATCH_SECONDS),
    (r"ResourceSlice lists are read up to (\d+) MiB", resourceslices.MAX_LIST_BYTES >> 20),
    (r"its answer at (\d+) MiB", podresources.MAX_MESSAGE_BYTES >> 20),
    (r"(\d+) device IDs", podresources.MAX_ALLOCATIONS),
    (r"cut at (\d+) characters", docker.MAX_VALUE_CHARS),
]


@pytest.mark.parametrize(("pattern", "truth"), FIGURES, ids=[p for p, _ in FIGURES])
def test_the_figures_it_states_are_the_codes(pattern: str, truth: float) -> None:
    found = re.findall(pattern, " ".join(threat_model().split()))
    assert found, f"the page no longer says {pattern}"
    for figure in found:
        assert float(figure) == truth, (pattern, figure, truth)
