"""The culling recipes in deploy/culling (docs/culling.md), and the flag that names the pod
annotations they may read."""

from __future__ import annotations

import pytest

from enricher.cli import parse_config

USERNAME = "hub.jupyter.org/username"
SERVERNAME = "hub.jupyter.org/servername"


# --------------------------------------------------------------------------- the flag


@pytest.mark.parametrize(
    ("argv", "env", "expected"),
    [
        pytest.param([], "", (USERNAME,), id="default"),
        pytest.param(["--kube.pod-annotations", SERVERNAME], "", (USERNAME, SERVERNAME), id="adds"),
        pytest.param([], f"{SERVERNAME}, team", (USERNAME, SERVERNAME, "team"), id="env-adds"),
        pytest.param(["--kube.pod-annotations", USERNAME], "", (USERNAME,), id="no-duplicate"),
        pytest.param([f"--kube.pod-annotations=-{USERNAME}"], "", (), id="drops-the-default"),
        pytest.param([], f"-{USERNAME},team", ("team",), id="env-drops-and-adds"),
    ],
)
def test_pod_annotations_add_to_the_default(
    argv: list[str], env: str, expected: tuple[str, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Naming one more annotation keeps the JupyterHub user the rules, the dashboard and the
    recipes read; only a key with a leading - drops one."""
    if env:
        monkeypatch.setenv("ENRICHER_KUBE_POD_ANNOTATIONS", env)
    _, config, _ = parse_config(argv)
    assert config.kube_pod_annotations == expected
