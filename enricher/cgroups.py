"""Cgroup paths, pure: which pod UID, container ID and runtime a ``/proc/<pid>/cgroup`` names.

The procfs source reads the files; attribution reads the container chain of a path (Docker in
Docker). Handles cgroup v1 and v2, the kubelet's systemd and cgroupfs drivers, containerd,
CRI-O, Docker and Podman names. No I/O.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from .model import CgroupRef, Runtime

__all__ = ["MAX_FILE_BYTES", "MAX_LINE_CHARS", "cgroup_lines", "container_chain", "parse_cgroup"]

# The most of a cgroup file (and of any /proc file the procfs source reads) that is read.
MAX_FILE_BYTES = 64 * 1024
MAX_LINE_CHARS = 4 * 1024

_HEX64 = re.compile(r"[0-9a-f]{64}")
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_HEX32 = re.compile(r"[0-9a-f]{32}")
_HIERARCHY_ID = re.compile(r"[0-9]{1,10}")
_CONTROLLERS = re.compile(r"[A-Za-z0-9_,=.-]{0,256}")
# systemd driver: dashes separate slice levels, so the UID inside carries underscores.
# kind prefixes another level ("kubelet-kubepods-..."); Guaranteed pods have no QoS word.
_SLICE_POD = re.compile(r"(?:[a-z0-9_]+-)*kubepods(?:-[a-z]+)?-pod([0-9A-Fa-f_]+)\.slice")
_CGROUPFS_POD = re.compile(r"pod([0-9A-Fa-f-]+)")
# Segments that claim to be Kubernetes or container cgroups; when one of them is present but
# nothing valid was found, the path is not a host process, it is one we do not understand.
_SUSPECT = re.compile(
    r".*kubepods.*|pod[0-9A-Fa-f_-]+|(?:cri-containerd|crio|docker|libpod)-.*|[0-9a-f]{60,}"
)

_SCOPE_PREFIXES: tuple[tuple[str, Runtime], ...] = (
    ("cri-containerd-", Runtime.CONTAINERD),
    ("crio-", Runtime.CRIO),
    ("docker-", Runtime.DOCKER),
    ("libpod-", Runtime.UNKNOWN),  # podman outside Kubernetes: a container, not the host
)
_COLON_PREFIXES: dict[str, Runtime] = {
    "cri-containerd": Runtime.CONTAINERD,
    "crio": Runtime.CRIO,
    "docker": Runtime.DOCKER,
}
_CRIO_CONMON = "crio-conmon-"


def _normalise_uid(raw: str) -> str | None:
    uid = raw.replace("_", "-").lower()
    if _UUID.fullmatch(uid) or _HEX32.fullmatch(uid):
        return uid
    return None


def _pod_of(segment: str) -> str | None:
    """The pod UID a single path segment names, if it is a pod-level cgroup."""
    m = _SLICE_POD.fullmatch(segment)
    if m is not None:
        return _normalise_uid(m.group(1))
    m = _CGROUPFS_POD.fullmatch(segment)
    if m is not None:
        return _normalise_uid(m.group(1))
    return None


# (container id or None for CRI-O's conmon, runtime); None when the segment is no container
_Container = tuple[str | None, Runtime]


def _container_of(segment: str, parent: str) -> _Container | None:
    name = segment.removesuffix(".scope")
    if name != segment:
        if name.startswith(_CRIO_CONMON):
            # conmon monitors the container from inside the pod's cgroup; it is not the workload.
            if _HEX64.fullmatch(name[len(_CRIO_CONMON) :]):
                return None, Runtime.CRIO
            return None
        for prefix, runtime in _SCOPE_PREFIXES:
            if name.startswith(prefix) and _HEX64.fullmatch(name[len(prefix) :]):
                return name[len(prefix) :], runtime
        return None
    for prefix in ("crio-", _CRIO_CONMON):
        # CRI-O under the cgroupfs driver uses the same names without ".scope".
        rest = name[len(prefix) :]
        if name.startswith(prefix) and _HEX64.fullmatch(rest):
            return (None if prefix == _CRIO_CONMON else rest), Runtime.CRIO
    if _HEX64.fullmatch(name):
        # A bare id is what both Docker and containerd write under the cgroupfs driver; only a
        # "docker" parent settles which.
        return name, (Runtime.DOCKER if parent == "docker" else Runtime.UNKNOWN)
    return None


def _colon_form(segment: str) -> tuple[str, _Container] | None:
    """containerd's literal ``<slice>:<prefix>:<id>`` name, written when drivers disagree."""
    parts = segment.split(":")
    if len(parts) != 3:
        return None
    slice_name, prefix, cid = parts
    pod = _pod_of(slice_name)
    if pod is None:
        return None
    if prefix == "crio-conmon" and _HEX64.fullmatch(cid):
        return pod, (None, Runtime.CRIO)
    runtime = _COLON_PREFIXES.get(prefix)
    if runtime is None or not _HEX64.fullmatch(cid):
        return None
    return pod, (cid, runtime)


def _interpret_path(path: str) -> CgroupRef | None:
    segments = [s for s in path.split("/") if s and s != "."]
    if not segments or all(s == ".." for s in segments):
        # "/" inside a cgroup namespace, or an ancestor outside it: nothing says where we are.
        return None
    pod: str | None = None
    container: _Container | None = None
    for i, segment in enumerate(segments):
        if ":" in segment:
            colon = _colon_form(segment)
            if colon is None:
                continue
            if pod is None:
                pod, container = colon
                break
            if container is None and colon[0] == pod:
                container = colon[1]
            break
        parent = segments[i - 1] if i else ""
        if pod is None:
            found_pod = _pod_of(segment)
            if found_pod is not None:
                # The outermost pod is the one this node's kubelet knows; pods nested inside
                # it (a kind node run as a pod) belong to another kubelet.
                pod, container = found_pod, None
                continue
            found = _container_of(segment, parent)
            if found is not None:
                container = found  # outside a pod the innermost container wins
        elif container is None:
            container = _container_of(segment, parent)
    if pod is None and container is None:
        if any(_SUSPECT.fullmatch(s) for s in segments):
            return None
        return CgroupRef(pod_uid=None, container_id=None, runtime=Runtime.UNKNOWN, path=path)
    cid, runtime = container if container is not None else (None, Runtime.UNKNOWN)
    if pod is None and cid is None:
        return None  # a conmon outside any pod: not a layout we know
    return CgroupRef(pod_uid=pod, container_id=cid, runtime=runtime, path=path)


def container_chain(path: str) -> tuple[str, ...]:
    """Every container ID a cgroup path names, outermost first.

    ``parse_cgroup`` keeps one (outside a pod, the innermost); a path can name more: Docker in
    Docker (``/docker/<outer>/docker/<inner>``), or a kind node container around a pod. The
    inner container then belongs to a daemon running inside the outer one, and the host's
    Docker knows only the outer: a caller that asks the host daemon falls back along this
    chain. Pure; never raises.
    """
    if len(path) > MAX_LINE_CHARS:
        return ()
    segments = [s for s in path.split("/") if s and s != "."]
    chain: list[str] = []
    for i, segment in enumerate(segments):
        if ":" in segment:
            colon = _colon_form(segment)
            found = colon[1] if colon is not None else None
        else:
            found = _container_of(segment, segments[i - 1] if i else "")
        if found is not None and found[0] is not None and found[0] not in chain:
            chain.append(found[0])
    return tuple(chain)


def _line_priority(hierarchy: str, controllers: str) -> int:
    names = controllers.split(",")
    if "memory" in names:
        return 3  # the controller kubelet enforces limits with, present on every v1 node
    if hierarchy == "0" and controllers == "":
        return 2
    if "name=systemd" in names:
        return 1
    return 0


def _score(ref: CgroupRef) -> int:
    return (2 if ref.pod_uid is not None else 0) + (1 if ref.container_id is not None else 0)


def cgroup_lines(text: str) -> Iterator[tuple[str, str, str]]:
    """The well-formed lines of ``/proc/<pid>/cgroup`` text as (hierarchy ID, controllers,
    path), the path absolute and printable; the rest (and a line cut at MAX_FILE_BYTES) is
    skipped. Never raises."""
    if len(text) > MAX_FILE_BYTES:
        # A cut line could name a shorter, different path; drop it.
        text = text[:MAX_FILE_BYTES]
        text = text[: text.rfind("\n") + 1]
    for line in text.split("\n"):
        if not line or len(line) > MAX_LINE_CHARS:
            continue
        parts = line.split(":", 2)  # the path itself may hold colons
        if len(parts) != 3:
            continue
        hierarchy, controllers, path = parts
        if not _HIERARCHY_ID.fullmatch(hierarchy) or not _CONTROLLERS.fullmatch(controllers):
            continue
        if not path.startswith("/") or not path.isprintable():
            continue
        yield hierarchy, controllers, path


def parse_cgroup(text: str) -> CgroupRef | None:
    """Work out the pod and container from the content of ``/proc/<pid>/cgroup``.

    Handles cgroup v1 and v2, the kubelet's systemd and cgroupfs drivers, containerd, CRI-O and
    Docker names, prefixes above ``kubepods`` and namespace-relative paths. Returns a host
    ``CgroupRef`` (no pod, no container) for a recognised non-container path and ``None`` when
    nothing can be told. Never raises.
    """
    best: CgroupRef | None = None
    best_key = (-1, -1)
    for hierarchy, controllers, path in cgroup_lines(text):
        ref = _interpret_path(path)
        if ref is None:
            continue
        key = (_score(ref), _line_priority(hierarchy, controllers))
        if key > best_key:
            best, best_key = ref, key
    return best
