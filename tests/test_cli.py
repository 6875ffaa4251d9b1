"""The commands as users run them: flags and environment, demo, resolve and ps."""

from __future__ import annotations

import io
import json
import time
import urllib.request
from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from devkit.kubeapi import KubeApiStandIn
from devkit.nvmlfake import FakeNvml, FakeNvmlState
from enricher.cli import build_parser, env_name, parse_config
from enricher.commands import ps, render_ps_table, resolve
from enricher.config import Config
from enricher.fieldtable import table
from enricher.model import PodInfo
from enricher.simnode import fakeproc
from enricher.simnode.api import StaticPods, make_pod
from enricher.simnode.dialects import NEWEST

from .conftest import ROOT
from .harness import cli, demo_process

POD_UID = "0c0c0c0c-1111-4222-8333-444444444444"
CID = "ab" * 32


@pytest.mark.parametrize(
    ("flag", "env"),
    [
        pytest.param("--upstream.url", "ENRICHER_UPSTREAM_URL", id="dotted"),
        pytest.param("--web.listen-address", "ENRICHER_WEB_LISTEN_ADDRESS", id="dash"),
        pytest.param(
            "--kubelet.pod-resources-socket", "ENRICHER_KUBELET_POD_RESOURCES_SOCKET", id="long"
        ),
    ],
)
def test_env_names(flag: str, env: str) -> None:
    assert env_name(flag) == env


def test_demo_listens_on_loopback_unless_told() -> None:
    """The demo answers on 127.0.0.1 alone by default (it used to listen on every interface);
    --web.listen-address chooses, and serve keeps every interface for Prometheus."""
    assert parse_config(["demo"])[1].listen_address == "127.0.0.1:9401"
    assert parse_config(["demo", "--web.listen-address", ":9500"])[1].listen_address == ":9500"
    assert parse_config(["serve"])[1].listen_address == ":9401"


def test_defaults_and_serve_is_default() -> None:
    command, cfg, _ = parse_config([])
    assert command == "serve"
    assert cfg.listen_address == ":9401"
    assert cfg.upstream_url == "http://127.0.0.1:9400/metrics"
    assert cfg.kube_pod_annotations == ("hub.jupyter.org/username",)
    assert cfg.collector_process is False


def test_flags_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENRICHER_UPSTREAM_URL", "http://10.0.0.1:9400/metrics")
    monkeypatch.setenv("ENRICHER_COLLECTOR_PROCESS", "true")
    monkeypatch.setenv("NODE_NAME", "node-7")
    _, cfg, _ = parse_config(["--kube.pod-labels", "team, app ,", "--upstream.timeout", "2.5"])
    assert cfg.upstream_url == "http://10.0.0.1:9400/metrics"
    assert cfg.collector_process is True
    assert cfg.kube_node_name == "node-7"
    assert cfg.kube_active
    assert cfg.kube_pod_labels == ("team", "app")
    assert cfg.upstream_timeout == 2.5
    _, cfg, _ = parse_config(["serve", "--no-collector.process"])
    assert cfg.collector_process is False


def test_mps_daemon_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    _, cfg, _ = parse_config([])
    assert cfg.mps_daemon_pod_namespace == ("gpu-operator", "nvidia-device-plugin")
    monkeypatch.setenv("ENRICHER_MPS_DAEMON_POD_SELECTOR", "app=mps")
    _, cfg, _ = parse_config(["ps", "--mps.daemon-pod-namespace", "infra, gpu-system"])
    assert cfg.mps_daemon_pod_selector == "app=mps"
    assert cfg.mps_daemon_pod_namespace == ("infra", "gpu-system")
    _, cfg, _ = parse_config(["--mps.daemon-pod-selector", "", "--mps.daemon-pod-namespace", ""])
    assert (cfg.mps_daemon_pod_selector, cfg.mps_daemon_pod_namespace) == ("", ())  # host only


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(["--web.listen-address", "9401"], id="address-without-colon"),
        pytest.param(["--upstream.timeout", "0"], id="zero-timeout"),
        pytest.param(["--upstream.max-bytes", "10"], id="tiny-body-limit"),
        pytest.param(
            ["--upstream.discover-pod", "--upstream.pod-selector", "no equals"], id="bad-selector"
        ),
        pytest.param(["--log.level", "loud"], id="bad-level"),
        pytest.param(["--mps.daemon-pod-selector", "app=x;"], id="empty-mps-alternative"),
        pytest.param(["--mps.daemon-pod-namespace", "GPU_Operator"], id="bad-mps-namespace"),
    ],
)
def test_config_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        parse_config(argv)
    assert info.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_every_server_flag_documented_in_flags_doc() -> None:
    """docs/flags.md is generated from the parser (tests/test_docs.py); this reads it as a user
    would, for every serve flag."""
    doc = (ROOT / "docs" / "flags.md").read_text()
    parser = build_parser()
    sub = parser._subparsers._group_actions[0].choices["serve"]  # type: ignore[union-attr]
    for action in sub._actions:
        for opt in action.option_strings:
            if opt.startswith("--") and opt not in ("--help",) and not opt.startswith("--no-"):
                assert f"`{opt}" in doc, f"{opt} missing from docs/flags.md"


# --------------------------------------------------------------------------- demo


def test_demo_serves_enriched_metrics(tmp_path: Path) -> None:
    """`dcgm-enricher demo` as a newcomer runs it: enriched labels on the simulated node."""
    with demo_process(tmp_path) as demo:
        with urllib.request.urlopen(demo.url + "/metrics", timeout=5) as r:
            text = r.read().decode()
        assert text, "demo did not serve /metrics"
        fams = {f.name: f for f in text_string_to_metric_families(text)}
        # The demo's exporter speaks the newest release: the field by its name there.
        naming = table().naming_of_release(NEWEST)
        util = [s.labels for s in fams[str(table().name("gpu_util", naming))].samples]
        # The Jupyter pod never requested a GPU: dcgm-exporter alone leaves it unnamed.
        assert any(lbl.get("pod") == "jupyter-alice" for lbl in util)
        # The time-sliced GPU is shared: no single pod is named on its device series.
        assert any(lbl["gpu"] == "1" and lbl.get("pod") == "" for lbl in util)
        mem = {s.labels["pod"] for s in fams["gpu_container_memory_used_bytes"].samples}
        assert {"vllm-7d9f8c6b5-k2x4p", "triton-5c6d7f8b9-p8m2n", "bert-finetune-0"} <= mem
        reasons = {s.labels["reason"] for s in fams["gpu_unattributed_memory_used_bytes"].samples}
        # The host process on a MIG instance, the MPS server (not a workload), the driver's
        # reservation and the memory no listed process holds.
        assert reasons == {"host_process", "mps_server", "driver_reserved", "not_in_process_list"}
        # Allocations come from the simulated kubelet over gRPC on a unix socket.
        up = {s.labels["source"]: s.value for s in fams["dcgm_enricher_source_up"].samples}
        assert up["podresources"] == 1
        allocated = {
            (s.labels["gpu"], s.labels.get("GPU_I_ID", ""), s.labels["pod"])
            for s in fams["gpu_container_allocated"].samples
        }
        assert {
            ("1", "", "vllm-7d9f8c6b5-k2x4p"),  # time-sliced: both replicas' holders
            ("1", "", "triton-5c6d7f8b9-p8m2n"),
            ("2", "1", "bert-finetune-0"),  # MIG: pods on three instances
            ("2", "13", "eval-harness-0"),
            ("2", "14", "dra-whisper-0"),  # a MIG device given through a DRA claim
            ("4", "", "embedder-6f7d8c9b4-q7w2e"),  # MPS
            ("5", "", "finetune-mistral-0"),  # allocated, no process
            ("6", "", "llama-eval-7xq2m"),  # allocated, memory held at zero utilization
            ("7", "", "dra-train-0"),  # given through a DRA claim, found by its ResourceSlice
        } <= allocated
        (dra,) = [
            s.labels for s in fams["gpu_container_allocated"].samples if s.labels["gpu"] == "7"
        ]
        assert (dra["resource"], dra["dra_driver_name"], dra["dra_device_name"]) == (
            "gpu.nvidia.com",
            "gpu.nvidia.com",
            "gpu-7",
        )
        assert dra["dra_claim_name"] == "dra-train-0-gpu-x7k2p"
        assert not any(name.startswith("dra_mig_") for name in dra)
        (dra_mig,) = [
            s.labels
            for s in fams["gpu_container_allocated"].samples
            if s.labels.get("GPU_I_ID") == "14"
        ]
        assert (dra_mig["resource"], dra_mig["dra_device_name"]) == (
            "gpu.nvidia.com",
            "gpu-2-mig-19-3-1",  # NVIDIA's name: profile 19 (1g.10gb) at memory slice 3, size 1
        )
        assert dra_mig["dra_mig_profile"] == "1g.10gb"
        assert dra_mig["dra_mig_device_uuid"] == "MIG-7e8f905a-6b7c-8d1e-e5f6-07182a3b4c5d"
        # The MIG instance's own series name the claim's pod.
        mig_fb = [
            lbl
            for lbl in (s.labels for s in fams[str(table().name("fb_used", naming))].samples)
            if lbl.get("GPU_I_ID") == "14"
        ]
        assert [lbl["pod"] for lbl in mig_fb] == ["dra-whisper-0"]
        assert not any(gpu == "3" for gpu, _, _ in allocated)  # Jupyter never requested one
        # The idle allocated GPU's series name its pod, which dcgm-exporter alone did not.
        assert any(lbl["gpu"] == "5" and lbl["pod"] == "finetune-mistral-0" for lbl in util)
        # The MPS GPU is shared by two clients: no single pod on its device series.
        assert any(lbl["gpu"] == "4" and lbl["pod"] == "" for lbl in util)
        assert {"embedder-6f7d8c9b4-q7w2e", "embedder-6f7d8c9b4-m3x9z"} <= mem
        idle = {
            s.labels["pod"]
            for s in fams["gpu_container_utilization_ratio"].samples
            if s.value == 0 and s.labels["gpu"] == "6"
        }
        assert idle == {"llama-eval-7xq2m"}
        assert not any(pod.startswith("nvidia-device-plugin") for pod in mem)
        info = {s.labels["pod"]: s.labels for s in fams["gpu_pod_info"].samples}
        assert info["jupyter-alice"]["annotation_hub_jupyter_org_username"] == "alice@example.com"
        assert info["jupyter-alice"]["gpu_requested"] == "false"
        with urllib.request.urlopen(demo.url + "/", timeout=5) as r:
            page = r.read().decode()
        assert "SIMULATED" in page
        assert "jupyter-alice" in page
    out = demo.printed()
    assert demo.returncode == 0, out
    assert "SIMULATED" in out
    assert demo.url + "/metrics" in out


# --------------------------------------------------------------------------- resolve and ps


@pytest.fixture
def proc_root(tmp_path: Path) -> Path:
    root = tmp_path / "proc"
    fakeproc.write_proc_stat(root, int(time.time()) - 3600)
    fakeproc.write_process(
        root, 100, comm="python", start_ticks=10, cgroup=fakeproc.cgroup_v2_systemd(POD_UID, CID)
    )
    fakeproc.write_process(root, 200, comm="sshd", start_ticks=20, cgroup=fakeproc.cgroup_host())
    fakeproc.write_process(root, 300, comm="weird", start_ticks=30, cgroup="garbage\n")
    return root


def test_resolve_without_kubernetes(proc_root: Path) -> None:
    out = io.StringIO()
    cfg = replace(Config(), procfs=str(proc_root))
    # Two PIDs did not resolve (a cgroup it cannot read, a process gone): exit status 1.
    assert resolve(cfg, [100, 200, 300, 999], out) == 1
    rows = [json.loads(line) for line in out.getvalue().splitlines()]
    assert rows[0] == {
        "pid": 100,
        "comm": "python",
        "pod_uid": POD_UID,
        "container_id": CID,
        "runtime": "containerd",
        "cgroup": rows[0]["cgroup"],
        "note": "kubernetes disabled (no node name)",
    }
    assert rows[1]["pod_uid"] is None and rows[1]["container_id"] is None
    assert rows[2]["error"] == "unknown_cgroup"
    assert rows[3] == {"pid": 999, "error": "process_exited"}


def test_resolve_exit_status_says_whether_every_pid_resolved(proc_root: Path) -> None:
    """0 only when every PID resolved: a pod UID that the node's pods do not hold is a PID
    that did not (it used to take one good PID for the exit status to be 0)."""
    cfg = replace(Config(), procfs=str(proc_root))
    assert resolve(cfg, [100, 200], io.StringIO()) == 0
    assert resolve(cfg, [100, 999], io.StringIO()) == 1
    out = io.StringIO()
    assert resolve(cfg, [100, 200], out, pods=StaticPods([])) == 1
    assert json.loads(out.getvalue().splitlines()[0])["note"] == "pod not found on this node"
    pod = PodInfo(uid=POD_UID, namespace="ml", name="train-0", containers={CID: "trainer"})
    assert resolve(cfg, [100, 200], io.StringIO(), pods=StaticPods([pod])) == 0


def test_resolve_cli_with_kubernetes(proc_root: Path, tmp_path: Path) -> None:
    """The real command line, kubeconfig and all, against the API-server stand-in."""
    with KubeApiStandIn() as api:
        api.add_pod(
            make_pod(
                "train-0", "ml", POD_UID, "node-a", containers=[("trainer", CID, "containerd")]
            )
        )
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(
            "apiVersion: v1\nkind: Config\ncurrent-context: t\n"
            f"clusters: [{{name: t, cluster: {{server: '{api.url}'}}}}]\n"
            "users: [{name: t, user: {}}]\n"
            "contexts: [{name: t, context: {cluster: t, user: t}}]\n"
        )
        res = cli(
            "resolve",
            "--path.procfs",
            str(proc_root),
            "--kube.node-name",
            "node-a",
            "--kube.kubeconfig",
            str(kubeconfig),
            "100",
            "200",
        )
    assert res.returncode == 0, res.stderr
    first, second = (json.loads(line) for line in res.stdout.splitlines())
    assert (first["namespace"], first["pod"], first["container"]) == ("ml", "train-0", "trainer")
    assert "pod" not in second


def test_ps_table(proc_root: Path, fake_nvml: FakeNvml) -> None:
    fake_nvml.write(
        FakeNvmlState()
        .gpu()
        .process(100, memory=2 << 30)
        .process(200, memory=1 << 30)
        .util(100, 10, 55)
    )
    out = io.StringIO()
    cfg = replace(Config(), procfs=str(proc_root), nvml_library=str(fake_nvml.library))
    assert ps(cfg, out) == 0
    lines = out.getvalue().splitlines()
    assert lines[0].split() == [
        "GPU",
        "GI",
        "PID",
        "PROCESS",
        "MEMORY",
        "SM",
        "NAMESPACE",
        "POD",
        "CONTAINER",
        "NOTE",
    ]
    assert lines[1].split()[:5] == ["0", "100", "python", "2048MiB", "55%"]
    assert "host_process" in lines[2]
    assert "kubernetes disabled" in out.getvalue()


def test_ps_table_is_aligned() -> None:
    assert render_ps_table([]).split() == [
        "GPU",
        "GI",
        "PID",
        "PROCESS",
        "MEMORY",
        "SM",
        "NAMESPACE",
        "POD",
        "CONTAINER",
        "NOTE",
    ]
