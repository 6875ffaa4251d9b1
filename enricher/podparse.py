"""Pure parsing of the pods the Kubernetes source watches: pod API objects (camelCase JSON)
into :class:`~enricher.model.PodInfo`, the node's index of them, pod lists, equality label
selectors and the pods admitted to run the MPS daemon. No I/O: the list and watch are
``kube.KubernetesSource``'s.

Workload decisions (``derive_workload``), all from the pod object alone, with no extra API
call and so no extra RBAC:

* ReplicaSet owner whose name is ``<deployment>-<pod-template-hash label>``: a Deployment.
  Any other ReplicaSet stays a ReplicaSet.
* Job owner: the Job. A CronJob is not derived: nothing in the pod names it (the Job's own
  owner reference is not copied to the pod) and guessing from the Job name's numeric suffix
  would attribute hand-made Jobs to CronJobs that do not exist.
* Node owner or a ``kubernetes.io/config.mirror`` annotation: ``("StaticPod", <pod name>)``.
  The Node is the mirror pod's owner only in form; the workload is the static pod itself.
* StatefulSet, DaemonSet and any other kind, CRDs included: ``(kind, name)`` as written.
* No usable owner: ``("Pod", <pod name>)``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .config import Config
from .model import PodIndex, PodInfo

__all__ = [
    "NAMESPACE_RE",
    "MpsDaemonPods",
    "build_index",
    "derive_workload",
    "labels_match",
    "object_key",
    "parse_mps_daemon_pods",
    "parse_pod",
    "parse_pod_list",
    "parse_selector",
    "strip_container_id",
]

MAX_VALUE_CHARS = 1024  # a kept label or annotation value is cut to this
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""


def strip_container_id(raw: str) -> str:
    """The bare container id from a status ``containerID`` such as ``containerd://<id>``.

    Any scheme is removed (containerd, cri-o, docker, ...); the id is lowercased because the
    cgroup side spells it in lowercase hex. Anything that is not a string gives "".
    """
    if not isinstance(raw, str):
        return ""
    _, sep, rest = raw.partition("://")
    return (rest if sep else raw).strip().lower()


def _selected(source: Any, keys: Sequence[str]) -> dict[str, str]:
    values = _map(source)
    out: dict[str, str] = {}
    for key in keys:
        value = values.get(key)
        if isinstance(value, str):
            out[key] = value[:MAX_VALUE_CHARS]
    return out


_ZERO_QUANTITY = re.compile(r"[+]?0*(\.0*)?([eE][+-]?\d+|[A-Za-z]{0,2})?")


def _is_zero(quantity: Any) -> bool:
    if isinstance(quantity, bool):
        return not quantity
    if isinstance(quantity, (int, float)):
        return quantity == 0
    text = _str(quantity).strip()
    # "0", "0.0", "0m", "0Ki": a resource named but not asked for
    return bool(text) and _ZERO_QUANTITY.fullmatch(text) is not None and "0" in text


def _wants_gpu(container: Any) -> bool:
    resources = _map(_map(container).get("resources"))
    for section in ("requests", "limits"):
        for key, quantity in _map(resources.get(section)).items():
            if isinstance(key, str) and key.startswith("nvidia.com/") and not _is_zero(quantity):
                return True
    return False


def derive_workload(obj: Mapping[str, Any]) -> tuple[str, str]:
    """The pod's workload as ``(kind, name)``, from its owner references and labels only.

    See the module docstring for each decision. Never raises on malformed input.
    """
    meta = _map(_map(obj).get("metadata"))
    pod_name = _str(meta.get("name"))
    owners = [
        o
        for o in _list(meta.get("ownerReferences"))
        if isinstance(o, Mapping) and _str(o.get("kind")) and _str(o.get("name"))
    ]
    owner = next((o for o in owners if o.get("controller") is True), owners[0] if owners else None)
    if owner is None:
        if _str(_map(meta.get("annotations")).get(MIRROR_ANNOTATION)):
            return "StaticPod", pod_name
        return "Pod", pod_name
    kind, name = _str(owner.get("kind")), _str(owner.get("name"))
    if kind == "Node":
        return "StaticPod", pod_name
    if kind == "ReplicaSet":
        template_hash = _str(_map(meta.get("labels")).get("pod-template-hash"))
        suffix = "-" + template_hash
        if template_hash and name.endswith(suffix) and len(name) > len(suffix):
            return "Deployment", name[: -len(suffix)]
    return kind, name


_NOT_LABEL_CHAR = re.compile(r"[^a-zA-Z0-9_]")


def upstream_label_name(key: str) -> str:
    """The label name dcgm-exporter gives a pod's label key (--kubernetes-enable-pod-labels):
    every character outside ``[a-zA-Z0-9_]`` replaced by ``_``, no prefix."""
    return _NOT_LABEL_CHAR.sub("_", key)


_LABEL_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_DNS_SUBDOMAIN = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
_LABEL_KEY = re.compile(rf"({_DNS_SUBDOMAIN}/)?{_LABEL_NAME}")
_LABEL_VALUE = re.compile(rf"({_LABEL_NAME})?")
# A Kubernetes namespace name: an RFC 1123 label.
NAMESPACE_RE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


def parse_selector(text: str) -> dict[str, str]:
    """An equality label selector ``"a=b,c==d"`` as a dict; "" (or blanks) selects all.

    Raises ValueError on anything else: ``!=``, set-based terms, empty terms, invalid keys
    or values, and one key given two different values.
    """
    if not isinstance(text, str):
        raise ValueError("selector must be a string")
    out: dict[str, str] = {}
    if not text.strip():
        return out
    for raw in text.split(","):
        term = raw.strip()
        if not term:
            raise ValueError(f"empty term in selector {text!r}")
        if "!=" in term:
            raise ValueError(f"only equality is supported, not {term!r}")
        key, sep, value = term.partition("==") if "==" in term else term.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or "=" in value:
            raise ValueError(f"expected key=value, got {term!r}")
        prefix, _, name = key.rpartition("/")
        if (
            not _LABEL_KEY.fullmatch(key)
            or len(name) > 63
            or len(prefix) > 253
            or not _LABEL_VALUE.fullmatch(value)
            or len(value) > 63
        ):
            raise ValueError(f"invalid label selector term {term!r}")
        if out.get(key, value) != value:
            raise ValueError(f"label {key!r} given two values in {text!r}")
        out[key] = value
    return out


@dataclass(frozen=True, slots=True)
class MpsDaemonPods:
    """Which pods may run the MPS control daemon and server: those in one of ``namespaces``
    whose labels match one of ``selectors``. The namespace is the boundary: pod labels are
    set by whoever creates the pod, so a selector alone would let any tenant qualify."""

    namespaces: frozenset[str] = frozenset()
    selectors: tuple[Mapping[str, str], ...] = ()

    def admits(self, obj: Mapping[str, Any]) -> bool:
        """Whether the pod ``obj`` (API JSON) is one of them."""
        namespace = _map(_map(obj).get("metadata")).get("namespace")
        if not isinstance(namespace, str) or namespace not in self.namespaces:
            return False
        return any(labels_match(obj, selector) for selector in self.selectors)


def parse_mps_daemon_pods(selectors: str, namespaces: Iterable[str]) -> MpsDaemonPods:
    """``--mps.daemon-pod-selector`` (equality selectors separated by ``;``: a pod matching
    any one of them qualifies) and ``--mps.daemon-pod-namespace`` as :class:`MpsDaemonPods`.

    Raises ValueError on an invalid selector, an empty alternative (it would match every pod
    of the namespaces: give ``k=v`` terms) or a namespace that is not a namespace name.
    """
    parsed: list[dict[str, str]] = []
    for alternative in selectors.split(";") if selectors.strip() else ():
        selector = parse_selector(alternative)
        if not selector:
            raise ValueError(f"empty alternative in MPS daemon pod selector {selectors!r}")
        parsed.append(selector)
    names = frozenset(namespaces)
    for name in names:
        if NAMESPACE_RE.fullmatch(name) is None:
            raise ValueError(f"{name!r} is not a namespace name")
    return MpsDaemonPods(names, tuple(parsed))


def labels_match(obj: Mapping[str, Any], selector: Mapping[str, str]) -> bool:
    """Whether the labels of the pod ``obj`` (API JSON) hold every ``key=value`` of
    ``selector`` (an empty selector matches every pod)."""
    labels = _map(_map(_map(obj).get("metadata")).get("labels"))
    return all(labels.get(k) == v for k, v in selector.items())


DEFAULT_MPS_DAEMON_PODS = parse_mps_daemon_pods(
    Config().mps_daemon_pod_selector, Config().mps_daemon_pod_namespace
)


def parse_pod(
    obj: Mapping[str, Any],
    label_keys: Sequence[str] = (),
    annotation_keys: Sequence[str] = (),
    mps_daemon_pods: MpsDaemonPods | None = DEFAULT_MPS_DAEMON_PODS,
) -> PodInfo:
    """A :class:`PodInfo` from one pod's API JSON (camelCase dict).

    Only the labels and annotations named in ``label_keys`` / ``annotation_keys`` are kept,
    values cut to 1024 characters. Missing or mistyped fields give empty values, never an
    exception; a result with ``uid == ""`` is unusable and :func:`build_index` skips it.
    ``mps_daemon`` is set when ``mps_daemon_pods`` admits the pod (None admits none; the
    default is the flags' default).
    """
    pod = _map(obj)
    meta = _map(pod.get("metadata"))
    spec = _map(pod.get("spec"))
    status = _map(pod.get("status"))

    containers: dict[str, str] = {}
    for key in ("initContainerStatuses", "containerStatuses", "ephemeralContainerStatuses"):
        for entry in _list(status.get(key)):
            entry = _map(entry)
            cid = strip_container_id(_str(entry.get("containerID")))
            name = _str(entry.get("name"))
            if cid and name:
                containers[cid] = name

    gpu = any(
        _wants_gpu(c)
        for key in ("containers", "initContainers", "ephemeralContainers")
        for c in _list(spec.get(key))
    )
    ready = any(
        _map(c).get("type") == "Ready" and _map(c).get("status") == "True"
        for c in _list(status.get("conditions"))
    )
    mirror = _str(_map(meta.get("annotations")).get(MIRROR_ANNOTATION)).strip().lower()
    if len(mirror) > 128:
        mirror = ""  # not a hash or a UID; keying the index on it could only mislead
    kind, workload = derive_workload(pod)
    return PodInfo(
        uid=_str(meta.get("uid")).strip().lower(),
        namespace=_str(meta.get("namespace")),
        name=_str(meta.get("name")),
        node=_str(spec.get("nodeName")),
        workload_kind=kind,
        workload_name=workload,
        gpu_requested=gpu,
        labels=_selected(meta.get("labels"), label_keys),
        label_names=frozenset(
            upstream_label_name(k) for k in _map(meta.get("labels")) if isinstance(k, str) and k
        ),
        annotations=_selected(meta.get("annotations"), annotation_keys),
        containers=containers,
        mirror_of=mirror,
        pod_ip=_str(status.get("podIP")),
        ready=ready,
        mps_daemon=mps_daemon_pods is not None and mps_daemon_pods.admits(pod),
    )


def build_index(pods: Iterable[PodInfo]) -> PodIndex:
    """An index by pod UID (and a mirror pod's static-pod hash) and by container id.

    A key claimed by two different pods is left out rather than guessed: a missing
    attribution is visible, a wrong one is not. A real UID always wins over a mirror hash.
    """
    by_uid: dict[str, PodInfo] = {}
    ambiguous: set[str] = set()
    for pod in pods:
        if not pod.uid:
            continue
        if pod.uid in by_uid and by_uid[pod.uid] is not pod:
            ambiguous.add(pod.uid)
        by_uid[pod.uid] = pod
    real = set(by_uid)
    # Two different objects with one UID: neither they nor their containers can be trusted.
    pods = [p for p in by_uid.values() if p.uid not in ambiguous]
    mirrors: dict[str, PodInfo] = {}
    for pod in pods:
        key = pod.mirror_of
        if not key or key in real:
            continue
        if key in mirrors and mirrors[key] is not pod:
            ambiguous.add(key)
        mirrors[key] = pod
    by_uid.update(mirrors)

    by_container: dict[str, tuple[PodInfo, str]] = {}
    for pod in pods:
        for cid, name in pod.containers.items():
            seen = by_container.get(cid)
            if seen is not None and seen[0] is not pod:
                ambiguous.add(cid)
            by_container[cid] = (pod, name)
    for key in ambiguous:
        by_uid.pop(key, None)
        by_container.pop(key, None)
    return PodIndex(by_uid=by_uid, by_container=by_container)


def object_key(obj: Mapping[str, Any]) -> tuple[str, str]:
    """``(uid, resourceVersion)`` of the object of a watch event: the UID stripped and
    lowercased, as :func:`parse_pod` keeps it; "" for either when missing or not a string."""
    meta = _map(_map(obj).get("metadata"))
    return _str(meta.get("uid")).strip().lower(), _str(meta.get("resourceVersion"))


def parse_pod_list(data: bytes | str) -> tuple[str, list[Mapping[str, Any]]]:
    """``(resourceVersion, items)`` from a PodList response body.

    Raises ValueError when the body is not a PodList: not JSON, no resourceVersion, or
    items that are not objects. A partial list must not replace a good cache.
    """
    try:
        body = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"pod list is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise ValueError("pod list is not a JSON object")
    kind = body.get("kind")
    if kind is not None and kind != "PodList":
        raise ValueError(f"expected kind PodList, got {kind!r}")
    rv = _map(body.get("metadata")).get("resourceVersion")
    if not isinstance(rv, str) or not rv:
        raise ValueError("pod list has no metadata.resourceVersion")
    items = body.get("items")
    if items is None:
        items = []
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        raise ValueError("pod list items are not objects")
    return rv, items
