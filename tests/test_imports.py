"""What the enricher imports: gRPC (grpcio and the PodResources stubs, ~10 MiB of RSS) only once
the kubelet source is on and its socket is there. In this process, without a subprocess: the
enricher's modules and gRPC are taken out of sys.modules for the test (and put back after),
and an import hook fails any import of gRPC while they are imported again and used."""

from __future__ import annotations

import importlib
import importlib.abc
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from types import ModuleType

import pytest

GRPC = ("grpc", "enricher.proto.api_pb2_grpc")


class NoGrpc(importlib.abc.MetaPathFinder):
    """Fails an import of gRPC (and records it)."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> None:
        if fullname.split(".")[0] == "grpc" or fullname in GRPC:
            self.asked.append(fullname)
            raise ImportError(f"{fullname}: imported although the kubelet source is off")
        return None


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch) -> NoGrpc:
    for name in list(sys.modules):
        if name.split(".")[0] in ("grpc", "enricher"):
            monkeypatch.delitem(sys.modules, name)
    hook = NoGrpc()
    monkeypatch.setattr(sys, "meta_path", [hook, *sys.meta_path])
    return hook


def loaded_grpc() -> list[str]:
    return sorted(n for n in sys.modules if n.split(".")[0] == "grpc" or n in GRPC)


def test_serve_with_the_kubelet_off_imports_no_grpc(fresh: NoGrpc) -> None:
    for name in ("enricher.cli", "enricher.commands", "enricher.app", "enricher.podresources"):
        importlib.import_module(name)
    from enricher.config import Config
    from enricher.sourcetable import make_podresources_source

    config = replace(Config(), kube_enabled=False, kubelet_enabled=None)
    assert not config.kubelet_active
    assert make_podresources_source(config) is None
    assert make_podresources_source(replace(config, kubelet_enabled=False)) is None
    assert fresh.asked == [] and loaded_grpc() == []


def test_kubelet_on_without_its_socket_imports_no_grpc(fresh: NoGrpc, tmp_path: Path) -> None:
    from enricher.config import Config
    from enricher.sourcetable import make_podresources_source

    config = replace(
        Config(),
        kube_enabled=False,
        kubelet_enabled=True,
        kubelet_pod_resources_socket=str(tmp_path / "kubelet.sock"),
    )
    source = make_podresources_source(config)
    assert source is not None
    result = source.fetch()  # the source is down (no socket), and gRPC stays out
    assert not result.ok and "absent" in (result.error or "")
    assert fresh.asked == [] and loaded_grpc() == []


def test_the_hook_catches_a_grpc_import(fresh: NoGrpc) -> None:
    """The test above can fail: with the hook in place, importing gRPC is caught."""
    with pytest.raises(ImportError):
        importlib.import_module("grpc")
    assert fresh.asked == ["grpc"]
