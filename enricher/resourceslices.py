"""The ResourceSlice source: which NVML device each DRA device of this node is, and the
taints its driver put on it.

The kubelet names a device given through Dynamic Resource Allocation by its driver, pool and
device names (``gpu.nvidia.com``, the node's name, ``gpu-0``), which are the driver's own
names. Only the driver's ResourceSlices say which GPU that is: NVIDIA's DRA driver publishes
each device with a ``uuid`` attribute, the GPU's (``GPU-...``) or the MIG device's
(``MIG-...``) UUID as NVML reports it, and a MIG device also with ``parentUUID`` (its GPU's)
and ``profile`` (``1g.10gb``). The device name is not used to find the GPU: the driver
derives it from the GPU's minor number, not NVML's index, and a MIG device's name from its
profile ID and placement; neither is a promise of the API, and a rename in a driver release
must not move a pod to another GPU.

A device may carry ``taints`` (``key``, optional ``value``, ``effect``, ``timeAdded``; at
most 16; under ``basic`` in resource.k8s.io/v1beta1, on the device itself in v1beta2 and
v1): NVIDIA's driver reports device health this way (``gpu.nvidia.com/xid`` with the XID as
value, ``gpu.nvidia.com/gpu-lost``, ``gpu.nvidia.com/unmonitored``). Effects are ``None``,
``NoSchedule`` and ``NoExecute``, and the API says more may come (consumers treat an unknown
one as ``None``), so the effect is kept as written.

:func:`parse_slice_list` is pure (JSON bytes in, :class:`SliceIndex` out: per
``(driver, pool, device)`` the UUID, the taints and a MIG device's attributes);
:class:`ResourceSlicesSource` does the I/O: a ``list`` of the ResourceSlices whose
``spec.nodeName`` is this node, asked only when the kubelet reports a DRA device it has not
seen yet (at most once per ``min_interval`` seconds) or when the last list is older than
``max_age``. A node without DRA allocations never calls the API, unless health watching is
on (``watch_health=True``): then it also lists whenever the last list is older than
``health_interval`` (default 60 s), DRA allocations or not, so that a taint on a device no
pod uses is seen too (still at most once per ``min_interval``).
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from .model import DeviceIdKind, DeviceTaint, MigInfo, parse_device_id
from .sources import ReadResult

SliceKey = tuple[str, str, str]  # (driver, pool, device)

# resource.k8s.io versions that serve ResourceSlices, newest first: v1 is GA from Kubernetes
# 1.34; v1beta2 (1.33) has the same device shape; v1beta1 (1.32) wraps it in ``basic``.
API_VERSIONS = ("v1", "v1beta2", "v1beta1")
MAX_LIST_BYTES = 16 << 20  # a node's slices are kilobytes; more means something is wrong
MAX_DEVICES = 16384  # device entries kept from one list
MAX_NAME_LENGTH = 256
MAX_ERROR_BYTES = 64 * 1024
MAX_TAINTS = 16  # per device: the API's DeviceTaintsMaxLength
MAX_TAINT_KEY_LENGTH = 317  # a label name: a DNS subdomain prefix (253), "/", a name (63)
MAX_TAINT_VALUE_LENGTH = 63  # a label value
MAX_EFFECT_LENGTH = 63
MAX_ATTRIBUTE_LENGTH = 64  # the API's DeviceAttributeMaxValueLength
_UUID_KINDS = (DeviceIdKind.GPU_UUID, DeviceIdKind.MIG_UUID)
_LABEL_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")
_EFFECT = re.compile(r"[A-Za-z][A-Za-z0-9]*")


@dataclass(frozen=True, slots=True)
class SliceIndex:
    """What one list said: each DRA device's NVML UUID, its taints (devices without any are
    absent from ``taints``) and, for a MIG device, its MIG attributes. Devices without a
    usable ``uuid`` attribute are absent everywhere (and so stay unmapped)."""

    uuids: Mapping[SliceKey, str] = field(default_factory=dict)
    listed_at: float = 0.0  # time.monotonic() of the list; 0: never listed
    api_version: str = ""
    # entries dropped: devices malformed, without UUID, ambiguous or past MAX_DEVICES; taints
    # malformed or past MAX_TAINTS
    skipped: int = 0
    taints: Mapping[SliceKey, tuple[DeviceTaint, ...]] = field(default_factory=dict)
    mig: Mapping[SliceKey, MigInfo] = field(default_factory=dict)


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _str(value: Any, limit: int = MAX_NAME_LENGTH) -> str:
    return value if isinstance(value, str) and len(value) <= limit else ""


def _field(device: Mapping[str, Any], name: str) -> Any:
    """A device field where each served version puts it: on the device (v1, v1beta2) or
    under ``basic`` (v1beta1)."""
    return device.get(name) or _map(device.get("basic")).get(name)


def _string_attribute(attrs: Mapping[str, Any], driver: str, name: str, limit: int) -> str:
    """A string attribute by its bare name or qualified with the driver's domain (an
    attribute name without a domain is the driver's own: ``uuid`` means
    ``<driver>/uuid``); "" when neither is a string of at most ``limit`` characters."""
    for qualified in (name, f"{driver}/{name}"):
        value = _str(_map(attrs.get(qualified)).get("string"), limit)
        if value:
            return value
    return ""


def _uuid(value: str, kinds: tuple[DeviceIdKind, ...] = _UUID_KINDS) -> str:
    ref = parse_device_id(value) if value else None
    return value if ref is not None and ref.uuid == value and ref.kind in kinds else ""


def _uuid_attribute(attrs: Mapping[str, Any], driver: str) -> str:
    """The device's ``uuid`` attribute when it is a GPU or MIG UUID, else ""."""
    for qualified in ("uuid", f"{driver}/uuid"):
        value = _uuid(_str(_map(attrs.get(qualified)).get("string")))
        if value:
            return value
    return ""


def _is_label_name(key: str) -> bool:
    prefix, slash, name = key.rpartition("/")
    if slash and not (len(prefix) <= 253 and _DNS_SUBDOMAIN.fullmatch(prefix)):
        return False
    return _LABEL_NAME.fullmatch(name) is not None


def parse_taint(item: Any) -> DeviceTaint | None:
    """One entry of a device's ``taints``, or None when it is malformed: no ``key`` that is a
    label name, a ``value`` that is not a label value, no ``effect``. ``timeAdded`` is not
    kept."""
    taint = _map(item)
    key = _str(taint.get("key"), MAX_TAINT_KEY_LENGTH)
    value = taint.get("value")
    value = "" if value is None else value  # optional: absent and null are the same
    effect = _str(taint.get("effect"), MAX_EFFECT_LENGTH)
    if not key or not _is_label_name(key) or not _EFFECT.fullmatch(effect):
        return None
    if not isinstance(value, str) or len(value) > MAX_TAINT_VALUE_LENGTH:
        return None
    if not _LABEL_VALUE.fullmatch(value):
        return None
    return DeviceTaint(key, value, effect)


def _taints(raw: Any, into: list[DeviceTaint]) -> int:
    """Adds the well-formed taints of ``raw`` not yet in ``into`` (at most MAX_TAINTS);
    returns how many entries were dropped. A ``taints`` that is not a list counts as one."""
    if raw is None:
        return 0
    if not isinstance(raw, list):
        return 1
    dropped = 0
    for item in raw:
        taint = parse_taint(item)
        if taint is None or (taint not in into and len(into) >= MAX_TAINTS):
            dropped += 1
        elif taint not in into:  # the API does not forbid repeats: keep one
            into.append(taint)
    return dropped


def parse_slice_list(data: bytes | str, limit: int = MAX_DEVICES) -> SliceIndex:
    """What a ResourceSliceList says of each device: UUID, taints, MIG attributes, and how
    many entries were skipped (``listed_at`` and ``api_version`` are left unset).
    ValueError when ``data`` is not a list object.

    Only the newest generation of each pool counts: while a driver republishes a pool, slices
    of the older generation may still be listed, and their devices are out of date. A device
    two slices of the same generation name with different UUIDs is dropped (ambiguous); with
    the same UUID, it has the taints of both.
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
    uuids: dict[SliceKey, str] = {}
    taints: dict[SliceKey, list[DeviceTaint]] = {}
    mig: dict[SliceKey, MigInfo] = {}
    ambiguous: set[SliceKey] = set()
    skipped = 0
    for driver, pool_name, generation, devices in slices:
        if generation != newest[(driver, pool_name)]:
            continue
        for device in devices:
            dev = _map(device)
            attrs = _map(_field(dev, "attributes"))
            name, uuid = _str(dev.get("name")), _uuid_attribute(attrs, driver)
            key: SliceKey = (driver, pool_name, name)
            if not name or not uuid or (key not in uuids and len(uuids) >= limit):
                skipped += 1
                continue
            if uuids.get(key, uuid) != uuid:
                ambiguous.add(key)
            uuids[key] = uuid
            skipped += _taints(_field(dev, "taints"), taints.setdefault(key, []))
            if _uuid(uuid, (DeviceIdKind.MIG_UUID,)):
                parent = _string_attribute(attrs, driver, "parentUUID", MAX_ATTRIBUTE_LENGTH)
                profile = _string_attribute(attrs, driver, "profile", MAX_ATTRIBUTE_LENGTH)
                mig[key] = MigInfo(uuid, _uuid(parent, (DeviceIdKind.GPU_UUID,)), profile)
    for dropped in ambiguous:
        del uuids[dropped]
        taints.pop(dropped, None)
        mig.pop(dropped, None)
    return SliceIndex(
        uuids,
        skipped=skipped + len(ambiguous),
        taints={k: tuple(v) for k, v in taints.items() if v},
        mig=mig,
    )


# --------------------------------------------------------------------------- I/O


class ResourceSliceError(Exception):
    """The list failed; the message says why."""


Lister = Callable[[str, str, float], bytes]  # (api_version, node, timeout) -> list body


class ResourceSlicesSource:
    """This node's ResourceSlices, listed when the kubelet reports a DRA device not yet known.

    :meth:`read` takes the DRA devices the kubelet reported and returns the current
    :class:`SliceIndex`. It lists again when one of them is missing from the index (at most
    once per ``min_interval`` seconds, so a device no slice describes cannot make us list on
    every scrape) or when the index is older than ``max_age``; with no DRA device it does no
    I/O. With ``watch_health`` it also lists when the index is older than
    ``health_interval``, with or without DRA devices, so that taints stay current on every
    device. A failed list keeps the previous index (its ``listed_at`` says how old its
    taints are) and reports the error; that no version of the API serves ResourceSlices is an
    error only while a DRA device is asked about (without one, the cluster has no DRA: an
    empty index, so that health watching there never reports the source down).

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
        watch_health: bool = False,
        health_interval: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not node_name:
            raise ValueError("node_name is required: the list is scoped to one node")
        self._list = list_slices
        self.node_name = node_name
        self.timeout = timeout
        self.min_interval = min_interval
        self.max_age = max_age
        self.watch_health = watch_health
        self.health_interval = health_interval
        self._clock = clock
        self._lock = threading.Lock()
        self._index = SliceIndex()
        self._attempted = float("-inf")
        self._version = ""  # the API version that answered last
        self.errors_total = 0

    def read(self, wanted: Iterable[SliceKey] = ()) -> ReadResult[SliceIndex]:
        """The index, listed again first when ``wanted`` or health watching needs it
        (blocking). Never raises."""
        keys = set(wanted)
        with self._lock:
            now = self._clock()
            index = self._index
            never = index.listed_at == 0.0
            due = self.watch_health and (never or now - index.listed_at > self.health_interval)
            if keys and not due:
                stale = never or now - index.listed_at > self.max_age
                due = stale or not keys <= index.uuids.keys()
            if not due or now - self._attempted < self.min_interval:
                return ReadResult(index)
            self._attempted = now
            try:
                self._index = self._fetch(now)
            except NotServedError as exc:
                if keys:
                    self.errors_total += 1
                    return ReadResult(index, False, str(exc))
                # No DRA device asked about and no version of the API serves ResourceSlices
                # (a cluster without DRA): no device, so no taint; not a failure.
                self._index = SliceIndex(listed_at=now)
            except Exception as exc:  # a malformed answer must never take the scrape down
                self.errors_total += 1
                said = str(exc) if isinstance(exc, ResourceSliceError) else None
                return ReadResult(index, False, said or f"{type(exc).__name__}: {exc}")
            return ReadResult(self._index)

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
                index = parse_slice_list(body)
            except ValueError as exc:
                raise ResourceSliceError(f"resource.k8s.io/{version}: {exc}") from None
            self._version = version
            return replace(index, listed_at=now, api_version=version)
        self._version = ""
        raise NotServedError(last or "no resource.k8s.io version serves resourceslices")

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
