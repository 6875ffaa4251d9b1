"""A SIMULATED node's kubelet: its PodResources allocations, served by a real gRPC server."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..model import DeviceAllocation, DraDevice
from ..podresources import load_grpc
from .node import SimPod


def allocations(pods: Iterable[SimPod]) -> list[DeviceAllocation]:
    """The SIMULATED kubelet's allocations: every pod's device IDs and DRA devices."""
    pods = tuple(pods)
    return [
        DeviceAllocation(p.namespace, p.name, p.container, p.gpu_request or "", device)
        for p in pods
        for device in p.devices
    ] + [
        DeviceAllocation(p.namespace, p.name, p.container, c.driver, c.device, c)
        for p in pods
        for c in p.claims
    ]


def list_response(entries: Iterable[DeviceAllocation]) -> Any:
    """A PodResources ``ListPodResourcesResponse`` holding ``entries``, grouped as the kubelet
    groups them (per pod, per container, per resource)."""
    from ..proto import api_pb2

    pods: dict[tuple[str, str], dict[str, dict[str, list[str]]]] = {}
    claims: dict[tuple[str, str, str], dict[tuple[str, str], list[DraDevice]]] = {}
    for e in entries:
        by_resource = pods.setdefault((e.namespace, e.pod), {}).setdefault(e.container, {})
        if e.dra is None:
            by_resource.setdefault(e.resource, []).append(e.device_id)
        else:
            claim = (e.dra.claim_name, e.dra.claim_namespace)
            claims.setdefault((e.namespace, e.pod, e.container), {}).setdefault(claim, [])
            claims[(e.namespace, e.pod, e.container)][claim].append(e.dra)

    def dynamic(ns: str, name: str, container: str) -> list[Any]:
        return [
            api_pb2.DynamicResource(
                claim_name=claim_name,
                claim_namespace=claim_ns,
                claim_resources=[
                    api_pb2.ClaimResource(
                        cdi_devices=[api_pb2.CDIDevice(name=f"k8s.{d.driver}/device={d.device}")],
                        driver_name=d.driver,
                        pool_name=d.pool,
                        device_name=d.device,
                    )
                    for d in devices
                ],
            )
            for (claim_name, claim_ns), devices in claims.get((ns, name, container), {}).items()
        ]

    return api_pb2.ListPodResourcesResponse(
        pod_resources=[
            api_pb2.PodResources(
                namespace=ns,
                name=name,
                containers=[
                    api_pb2.ContainerResources(
                        name=container,
                        devices=[
                            api_pb2.ContainerDevices(resource_name=r, device_ids=ids)
                            for r, ids in resources.items()
                        ],
                        dynamic_resources=dynamic(ns, name, container),
                    )
                    for container, resources in containers.items()
                ],
            )
            for (ns, name), containers in pods.items()
        ]
    )


class SimulatedKubelet:
    """A real gRPC server on a unix socket speaking the kubelet's PodResources v1 API, with
    SIMULATED answers: ``respond(context)`` makes each List reply (it may also sleep, or end
    the call with ``context.abort``). Counts calls, and the most that ran at once."""

    def __init__(self, socket_path: str, respond: Callable[[Any], Any]) -> None:
        self.socket_path = socket_path
        self.respond = respond
        self.calls = 0
        self.max_concurrent = 0
        self._running = 0
        self._count_lock = threading.Lock()
        self._server: Any = None

    # Named as the gRPC method it serves.
    def List(self, _request: Any, context: Any) -> Any:
        with self._count_lock:
            self.calls += 1
            self._running += 1
            self.max_concurrent = max(self.max_concurrent, self._running)
        try:
            return self.respond(context)
        finally:
            with self._count_lock:
                self._running -= 1

    def start(self) -> None:
        from ..proto import api_pb2_grpc

        grpc = load_grpc()

        server = grpc.server(ThreadPoolExecutor(max_workers=4, thread_name_prefix="sim-kubelet"))
        api_pb2_grpc.add_PodResourcesListerServicer_to_server(self, server)  # type: ignore[no-untyped-call,unused-ignore]
        if not server.add_insecure_port("unix://" + os.path.abspath(self.socket_path)):
            raise OSError(f"cannot listen on {self.socket_path}")
        server.start()
        self._server = server

    def stop(self, grace: float | None = 0.5) -> None:
        if self._server is not None:
            self._server.stop(grace).wait()
            self._server = None
