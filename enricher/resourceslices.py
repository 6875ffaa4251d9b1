"""The ResourceSlice source: which NVML device each DRA device of this node is.

The kubelet names a device given through Dynamic Resource Allocation by its driver, pool and
device names (``gpu.nvidia.com``, the node's name, ``gpu-0``), which are the driver's own
names. Only the driver's ResourceSlices say which GPU that is: NVIDIA's DRA driver publishes
each device with a ``uuid`` attribute, the GPU's (``GPU-...``) or the MIG device's
(``MIG-...``) UUID as NVML reports it. The device name is not used to find the GPU: the driver
derives it from the GPU's minor number, not NVML's index, and a MIG device's name from its
profile ID and placement; neither is a promise of the API, and a rename in a driver release
must not move a pod to another GPU.

:func:`parse_slice_list` is pure (JSON bytes in, ``(driver, pool, device) -> UUID`` out);
:class:`ResourceSliceSource` does the I/O: a ``list`` of the ResourceSlices whose
``spec.nodeName`` is this node, asked only when the kubelet reports a DRA device it has not
seen yet (at most once per ``min_interval`` seconds) or when the last list is older than
``max_age``. A node without DRA allocations never calls the API.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .model import DeviceIdKind, parse_device_id
from .sources import Reading

SliceKey = tuple[str, str, str]  # (driver, pool, device)

# resource.k8s.io versions that serve ResourceSlices, newest first: v1 is GA from Kubernetes
# 1.34; v1beta2 (1.33) has the same device shape; v1beta1 (1.32) wraps it in ``basic``.
API_VERSIONS = ("v1", "v1beta2", "v1beta1")
MAX_LIST_BYTES = 16 << 20  # a node's slices are kilobytes; more means something is wrong
MAX_DEVICES = 16384  # device entries kept from one list
MAX_NAME_LENGTH = 256
MAX_ERROR_BYTES = 64 * 1024
_UUID_KINDS = (DeviceIdKind.GPU_UUID, DeviceIdKind.MIG_UUID)


@dataclass(frozen=True, slots=True)
class SliceIndex:
    """What one list said: each DRA device's NVML UUID. Devices without a usable ``uuid``
    attribute are absent (and so stay unmapped)."""

    uuids: Mapping[SliceKey, str] = field(default_factory=dict)
    listed_at: float = 0.0  # time.monotonic() of the list; 0: never listed
    api_version: str = ""
    skipped: int = 0  # device entries dropped: malformed, no UUID, past MAX_DEVICES


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _str(value: Any) -> str:
    return value if isinstance(value, str) and len(value) <= MAX_NAME_LENGTH else ""


def _uuid_attribute(device: Mapping[str, Any], driver: str) -> str:
    """The device's ``uuid`` attribute when it is a GPU or MIG UUID, else "".

    An attribute name without a domain is the driver's own (``uuid`` means
    ``<driver>/uuid``), so both spellings are read.
    """
    attrs = _map(device.get("attributes") or _map(device.get("basic")).get("attributes"))
    for name in ("uuid", f"{driver}/uuid"):
        value = _str(_map(attrs.get(name)).get("string"))
        ref = parse_device_id(value) if value else None
        if ref is not None and ref.uuid == value and ref.kind in _UUID_KINDS:
            return value
    return ""


def parse_slice_list(
    data: bytes | str, limit: int = MAX_DEVICES
) -> tuple[dict[SliceKey, str], int]:
    """The ``(driver, pool, device) -> UUID`` map of a ResourceSliceList, and how many device
    entries were skipped. ValueError when ``data`` is not a list object.

    Only the newest generation of each pool counts: while a driver republishes a pool, slices
    of the older generation may still be listed, and their devices are out of date. A device
    two slices of the same generation name with different UUIDs is dropped (ambiguous).
    """
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise ValueError(f"not JSON: {exc}") from None
    if not isinstance(doc, Mapping) or not isinstance(doc.get("items"), list):
        raise ValueError("not a ResourceSliceList (no items)")
    newest: dict[tuple[str, str], int] = {}
    slices: list[tuple[str, str, int, list[Any]]] = []
    for item in doc["items"]:
        spec = _map(_map(item).get("spec"))
        driver, pool = _str(spec.get("driver")), _map(spec.get("pool"))
        pool_name, generation = _str(pool.get("name")), pool.get("generation", 0)
        devices = spec.get("devices")
        if not driver or not pool_name or not isinstance(devices, list):
            continue
        if not isinstance(generation, int) or isinstance(generation, bool):
            generation = 0
        slices.append((driver, pool_name, generation, devices))
        newest[(driver, pool_name)] = max(newest.get((driver, pool_name), generation), generation)
    out: dict[SliceKey, str] = {}
    ambiguous: set[SliceKey] = set()
    skipped = 0
    for driver, pool_name, generation, devices in slices:
        if generation != newest[(driver, pool_name)]:
            continue
        for device in devices:
            dev = _map(device)
            name, uuid = _str(dev.get("name")), _uuid_attribute(dev, driver)
            key: SliceKey = (driver, pool_name, name)
            if not name or not uuid or (key not in out and len(out) >= limit):
                skipped += 1
                continue
            if out.get(key, uuid) != uuid:
                ambiguous.add(key)
            out[key] = uuid
    for dropped in ambiguous:
        del out[dropped]
    return out, skipped + len(ambiguous)


# --------------------------------------------------------------------------- I/O


class ResourceSliceError(Exception):
    """The list failed; the message says why."""


Lister = Callable[[str, str, float], bytes]  # (api_version, node, timeout) -> list body


class ResourceSliceSource:
    """This node's ResourceSlices, listed when the kubelet reports a DRA device not yet known.

    :meth:`read` takes the DRA devices the kubelet reported and returns the current
    :class:`SliceIndex`. It lists again when one of them is missing from the index (at most
    once per ``min_interval`` seconds, so a device no slice describes cannot make us list on
    every scrape) or when the index is older than ``max_age``; with no DRA device it does no
    I/O. A failed list keeps the previous index and reports the error.

    ``list_slices`` does the request (``api_client_lister`` builds it from a kubernetes
    ``ApiClient``); a 404 for one API version moves on to the next older one.
    """

    name = "resourceslices"
    enabled = True

    def __init__(
        self,
        list_slices: Lister,
        node_name: str,
        *,
        timeout: float = 5.0,
        min_interval: float = 10.0,
        max_age: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not node_name:
            raise ValueError("node_name is required: the list is scoped to one node")
        self._list = list_slices
        self.node_name = node_name
        self.timeout = timeout
        self.min_interval = min_interval
        self.max_age = max_age
        self._clock = clock
        self._lock = threading.Lock()
        self._index = SliceIndex()
        self._attempted = float("-inf")
        self._version = ""  # the API version that answered last
        self.errors_total = 0

    def read(self, wanted: Iterable[SliceKey] = ()) -> Reading[SliceIndex]:
        """The index, listed again first when ``wanted`` needs it (blocking). Never raises."""
        keys = set(wanted)
        with self._lock:
            now = self._clock()
            index = self._index
            if not keys:
                return Reading(index)
            stale = index.listed_at == 0.0 or now - index.listed_at > self.max_age
            missing = not keys <= index.uuids.keys()
            if not (stale or missing) or now - self._attempted < self.min_interval:
                return Reading(index)
            self._attempted = now
            try:
                self._index = self._fetch(now)
            except Exception as exc:  # a malformed answer must never take the scrape down
                self.errors_total += 1
                said = str(exc) if isinstance(exc, ResourceSliceError) else None
                return Reading(index, False, said or f"{type(exc).__name__}: {exc}")
            return Reading(self._index)

    def _fetch(self, now: float) -> SliceIndex:
        versions = [self._version] if self._version else list(API_VERSIONS)
        last = ""
        for version in versions:
            try:
                body = self._list(version, self.node_name, self.timeout)
            except NotServedError as exc:
                last = str(exc)
                continue
            try:
                uuids, skipped = parse_slice_list(body)
            except ValueError as exc:
                raise ResourceSliceError(f"resource.k8s.io/{version}: {exc}") from None
            self._version = version
            return SliceIndex(uuids, now, version, skipped)
        self._version = ""
        raise ResourceSliceError(last or "no resource.k8s.io version serves resourceslices")

    def close(self) -> None:
        pass


class NotServedError(ResourceSliceError):
    """The API server does not serve ResourceSlices at that version (HTTP 404)."""


def api_client_lister(api_client: Any) -> Lister:
    """A :data:`Lister` over a kubernetes ``ApiClient``: ``GET
    /apis/resource.k8s.io/<version>/resourceslices?fieldSelector=spec.nodeName=<node>``,
    the body read with a size cap. Needs only ``list`` on ``resourceslices``."""

    def list_slices(version: str, node: str, timeout: float) -> bytes:
        method, url, headers, body, post = api_client.param_serialize(
            method="GET",
            resource_path=f"/apis/resource.k8s.io/{version}/resourceslices",
            query_params=[("fieldSelector", f"spec.nodeName={node}")],
            header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"],
        )
        try:
            resp = api_client.call_api(method, url, headers, body, post, _request_timeout=timeout)
        except Exception as exc:  # urllib3 and OS errors: the API server is unreachable
            raise ResourceSliceError(f"list resourceslices: {type(exc).__name__}: {exc}") from None
        raw = resp.response
        try:
            if resp.status == 404:
                raise NotServedError(f"resource.k8s.io/{version} resourceslices: 404")
            if not 200 <= resp.status <= 299:
                detail = raw.read(MAX_ERROR_BYTES).decode("utf-8", "replace")
                raise ResourceSliceError(
                    f"list resourceslices ({version}): HTTP {resp.status}: {detail[:300]}"
                )
            data: bytes = raw.read(MAX_LIST_BYTES + 1)
            if len(data) > MAX_LIST_BYTES:
                raise ResourceSliceError(f"resourceslice list over {MAX_LIST_BYTES} bytes")
            return data
        finally:
            raw.close()

    return list_slices
