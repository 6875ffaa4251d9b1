"""The kubelet PodResources source: which container was *given* each GPU.

:class:`PodResourcesSource` does the I/O: one ``v1.PodResourcesLister/List`` call over gRPC on
the kubelet's unix socket, bounded in time and never two at once. The pure helpers
(:func:`parse_list_response`, :func:`allocations_from_message`, :func:`is_gpu_resource`,
:func:`check_socket`) hold the rules and are tested alone. What a device ID names
(``model.parse_device_id``) is the pure core's question, asked against NVML's snapshot.

Devices given through Dynamic Resource Allocation (``ContainerResources.dynamic_resources``)
are kept when their driver is one of the GPU drivers (``gpu.nvidia.com`` and
``--kubelet.dra-drivers``); which NVML device each one is, the kubelet does not say: the
driver's ResourceSlices do (``enricher.resourceslices``).

The generated protobuf and gRPC modules (``enricher.proto.api_pb2*``, built from
``enricher/proto/api.proto``) and grpcio are imported on first use, so a source tree that was
never built still serves everything else: the source then reports an error.
"""

from __future__ import annotations

import os
import stat
import sys
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .model import MAX_ID_LENGTH, DeviceAllocation, DraDevice
from .sources import ReadResult

if TYPE_CHECKING:
    from .proto import api_pb2

# The NVIDIA device plugin's resources: whole or time-sliced/MPS GPUs, GPUs shared under the
# renamed resource (renameByDefault), and MIG instances of any profile (also their .shared).
GPU_RESOURCES = ("nvidia.com/gpu", "nvidia.com/gpu.shared")
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
# NVIDIA's DRA driver for GPUs (k8s-dra-driver-gpu): the driver name its ResourceSlices and
# the kubelet's ClaimResource carry.
GPU_DRA_DRIVERS = ("gpu.nvidia.com",)
# The kubelet's own server refuses messages over 16 MiB; we accept the same.
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
MAX_ALLOCATIONS = 65536  # GPU device IDs kept from one response
MAX_NAME_LENGTH = 253  # a DNS subdomain: the longest pod or namespace name Kubernetes allows
SOCKET_ABSENT = "absent"  # check_socket's answer for a path that does not exist


@dataclass(frozen=True, slots=True)
class ListResult:
    """What one List call gave. ``ok`` False with ``error`` set when it failed."""

    enabled: bool  # False: switched off (no socket configured)
    ok: bool = False
    allocations: tuple[DeviceAllocation, ...] = ()
    error: str = ""
    skipped: int = 0  # GPU entries dropped: nameless pods, oversized IDs, past MAX_ALLOCATIONS


class PodResourcesError(Exception):
    """The List call failed; ``reason`` is a short word, the message says what happened."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


# --------------------------------------------------------------------------- pure parts


def is_gpu_resource(name: str, extra: Iterable[str] = ()) -> bool:
    """Whether a device plugin resource name is one of the GPUs we watch."""
    return name in GPU_RESOURCES or name.startswith(MIG_RESOURCE_PREFIX) or name in extra


def is_gpu_driver(name: str, extra: Iterable[str] = ()) -> bool:
    """Whether a DRA driver name is one whose devices are GPUs we watch."""
    return name in GPU_DRA_DRIVERS or name in extra


def _fits(value: str, limit: int = MAX_ID_LENGTH) -> bool:
    return 0 < len(value) <= limit


def allocations_from_message(
    response: api_pb2.ListPodResourcesResponse,
    extra_resources: Iterable[str] = (),
    limit: int = MAX_ALLOCATIONS,
    extra_drivers: Iterable[str] = (),
) -> tuple[tuple[DeviceAllocation, ...], int]:
    """The GPU allocations in a List response, and how many GPU entries were skipped.

    Only resources that :func:`is_gpu_resource` accepts are kept, and DRA devices of drivers
    that :func:`is_gpu_driver` accepts. Entries without a pod name or namespace, with an
    oversized name or ID, a DRA device without its driver, pool or device name, or past
    ``limit`` are skipped and counted, never guessed at.
    """
    extra = frozenset(extra_resources)
    drivers = frozenset(extra_drivers)
    out: list[DeviceAllocation] = []
    skipped = 0
    for pod in response.pod_resources:
        namespace, name = str(pod.namespace), str(pod.name)
        bad_pod = not (0 < len(namespace) <= MAX_NAME_LENGTH and 0 < len(name) <= MAX_NAME_LENGTH)
        for container in pod.containers:
            cname = str(container.name)
            bad = bad_pod or len(cname) > MAX_NAME_LENGTH
            for devices in container.devices:
                resource = str(devices.resource_name)
                if not is_gpu_resource(resource, extra):
                    continue
                for raw in devices.device_ids:
                    device_id = str(raw)
                    if bad or not device_id or len(device_id) > MAX_ID_LENGTH or len(out) >= limit:
                        skipped += 1
                        continue
                    out.append(DeviceAllocation(namespace, name, cname, resource, device_id))
            for claim in container.dynamic_resources:
                claim_name, claim_ns = str(claim.claim_name), str(claim.claim_namespace)
                bad_claim = bad or not _fits(claim_name, MAX_NAME_LENGTH)
                bad_claim = bad_claim or len(claim_ns) > MAX_NAME_LENGTH
                for res in claim.claim_resources:
                    driver = str(res.driver_name)
                    if not is_gpu_driver(driver, drivers):
                        continue
                    pool, device = str(res.pool_name), str(res.device_name)
                    if bad_claim or not (_fits(pool) and _fits(device)) or len(out) >= limit:
                        skipped += 1
                        continue
                    dra = DraDevice(claim_name, claim_ns or namespace, driver, pool, device)
                    out.append(DeviceAllocation(namespace, name, cname, driver, device, dra))
    return tuple(out), skipped


def parse_list_response(
    data: bytes,
    extra_resources: Iterable[str] = (),
    limit: int = MAX_ALLOCATIONS,
    extra_drivers: Iterable[str] = (),
) -> tuple[tuple[DeviceAllocation, ...], int]:
    """Decode a serialized ``ListPodResourcesResponse``; ValueError when it is not one."""
    from google.protobuf.message import DecodeError  # type: ignore[import-untyped,unused-ignore]

    from .proto import api_pb2

    try:
        response = api_pb2.ListPodResourcesResponse.FromString(data)
    except DecodeError as exc:
        raise ValueError(f"not a ListPodResourcesResponse: {exc}") from exc
    return allocations_from_message(response, extra_resources, limit, extra_drivers)


def check_socket(path: str) -> str | None:
    """None when ``path`` is a unix socket we may connect to; else why not (:data:`SOCKET_ABSENT`
    when it does not exist: no kubelet running, or the directory not mounted)."""
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return SOCKET_ABSENT
    except OSError as exc:
        return f"cannot stat {path}: {exc.strerror or exc}"
    if not stat.S_ISSOCK(st.st_mode):
        return f"{path} is not a unix socket"
    # Connecting to a unix socket needs write permission on it.
    if not os.access(path, os.R_OK | os.W_OK):
        return (
            f"permission denied on {path} (owner uid {st.st_uid}, gid {st.st_gid}, mode "
            f"{stat.S_IMODE(st.st_mode):04o}): run the enricher as root or in the socket's group"
        )
    return None


# --------------------------------------------------------------------------- I/O


def load_grpc() -> Any:
    """Import grpcio, keeping its C core's own logging to errors unless the user chose a level.

    At its default level the core prints a line to stderr for routine events such as the
    kubelet closing a connection when it restarts; our log already says what matters.
    """
    if "grpc" not in sys.modules:
        os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    import grpc  # type: ignore[import-untyped,unused-ignore]

    return grpc


class PodResourcesSource:
    """Calls the kubelet's ``PodResourcesLister.List`` once per :meth:`fetch`.

    ``socket_path`` empty switches the source off; a path that does not exist is a failure like
    any other (a kubelet that is down, or a pod without the mount: the source was asked for, so
    it is down, not off), checked on every fetch so a kubelet that comes up later is found.
    Every call has a deadline of ``timeout`` seconds, and a call never starts while another is
    still running (the second caller gets an error instead): a slow kubelet cannot pile up
    threads or connections.
    """

    name = "podresources"

    def __init__(
        self,
        socket_path: str,
        *,
        timeout: float = 2.0,
        extra_resources: Sequence[str] = (),
        extra_drivers: Sequence[str] = (),
        max_message_bytes: int = MAX_MESSAGE_BYTES,
        max_allocations: int = MAX_ALLOCATIONS,
    ) -> None:
        self.socket_path = socket_path
        self.timeout = timeout
        self.extra_resources = tuple(extra_resources)
        self.extra_drivers = tuple(extra_drivers)
        self.max_message_bytes = max_message_bytes
        self.max_allocations = max_allocations
        self.errors_total = 0
        self.calls_total = 0
        self._lock = threading.Lock()
        self._channel: Any = None
        self._stub: Any = None

    def fetch(self) -> ListResult:
        """One List call, blocking for at most ``timeout`` seconds. Never raises."""
        if not self.socket_path:
            return ListResult(enabled=False)
        if not self._lock.acquire(blocking=False):
            return self._failed("busy", "the previous List call is still running")
        try:
            problem = check_socket(self.socket_path)
            if problem == SOCKET_ABSENT:
                self._close_channel()
                return self._failed(
                    "absent",
                    f"no socket at {self.socket_path} (kubelet down, or its pod-resources "
                    "directory not mounted; --no-kubelet.enabled switches the source off)",
                )
            if problem is not None:
                return self._failed("socket", problem)
            response = self._list()
            allocations, skipped = allocations_from_message(
                response, self.extra_resources, self.max_allocations, self.extra_drivers
            )
        except PodResourcesError as exc:
            return self._failed(exc.reason, str(exc))
        except Exception as exc:  # a malformed answer must never take the scrape down
            return self._failed("invalid", f"{type(exc).__name__}: {exc}")
        finally:
            self._lock.release()
        return ListResult(enabled=True, ok=True, allocations=allocations, skipped=skipped)

    @property
    def enabled(self) -> bool:
        return bool(self.socket_path)

    def read(self) -> ReadResult[ListResult]:
        """The Source read (blocking): one :meth:`fetch`."""
        result = self.fetch()
        return ReadResult(result, result.ok, result.error)

    def close(self) -> None:
        """Close the connection; a later fetch opens a new one."""
        with self._lock:
            self._close_channel()

    def _failed(self, reason: str, message: str) -> ListResult:
        self.errors_total += 1
        return ListResult(enabled=True, ok=False, error=f"{reason}: {message}")

    def _list(self) -> api_pb2.ListPodResourcesResponse:
        try:
            grpc = load_grpc()
            from .proto import api_pb2, api_pb2_grpc
        except (ImportError, RuntimeError) as exc:  # RuntimeError: grpcio older than the stubs
            raise PodResourcesError(
                "stubs",
                f"cannot import the gRPC stubs ({exc}); build the package (pip install .) so "
                "enricher/proto/api_pb2*.py are generated",
            ) from exc
        if self._stub is None:
            self._channel = grpc.insecure_channel(
                "unix://" + os.path.abspath(self.socket_path),
                options=[
                    ("grpc.max_receive_message_length", self.max_message_bytes),
                    ("grpc.max_send_message_length", 1024),
                    ("grpc.enable_http_proxy", 0),
                    # A kubelet restart must not leave us waiting out grpc's default 2 minutes
                    # of reconnect backoff.
                    ("grpc.initial_reconnect_backoff_ms", 200),
                    ("grpc.max_reconnect_backoff_ms", 2000),
                ],
            )
            # The generated gRPC module is untyped.
            self._stub = api_pb2_grpc.PodResourcesListerStub(self._channel)  # type: ignore[no-untyped-call,unused-ignore]
        self.calls_total += 1
        try:
            response: api_pb2.ListPodResourcesResponse = self._stub.List(
                api_pb2.ListPodResourcesRequest(), timeout=self.timeout
            )
        except grpc.RpcError as exc:
            code = exc.code() if callable(getattr(exc, "code", None)) else None
            details = exc.details() if callable(getattr(exc, "details", None)) else str(exc)
            if code == grpc.StatusCode.UNAVAILABLE:
                # Start from a fresh connection next time (the kubelet may have restarted).
                self._close_channel()
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise PodResourcesError(
                    "timeout", f"List took over {self.timeout:g}s ({details})"
                ) from exc
            name = code.name.lower() if code is not None else "rpc"
            raise PodResourcesError(name, f"List failed: {details}") from exc
        return response

    def _close_channel(self) -> None:
        if self._channel is not None:
            self._channel.close()
        self._channel = None
        self._stub = None
