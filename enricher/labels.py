"""dcgm-exporter's labels, and what the enricher writes in them (the label policy).

Which labels identify a device, which name a pod (in both of dcgm-exporter's naming schemes),
which follow the pod (``pod_uid``, the DRA claim, the pod's own labels), and what a device
series' labels become under a plan (:func:`relabel`). Pure; ``rewrite`` applies it to text.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from .textformat import unescape_label_value

GPU_I_ID = "GPU_I_ID"
IDENTITY_LABELS = frozenset(
    {
        "gpu",
        "UUID",
        "uuid",
        "GPU_I_ID",
        "GPU_I_PROFILE",
        "device",
        "modelName",
        "Hostname",
        "hostname",
    }
)
# Labels dcgm-exporter writes about the pod it names, beside the pod labels themselves:
# --kubernetes-enable-pod-uid and the DRA claim of the allocation. They follow the enricher's
# decision; the device-describing dra_* labels (driver, pool, device, a MIG device's profile
# and UUID) stay as they are.
POD_UID_LABEL = "pod_uid"
DRA_CLAIM_LABELS = frozenset({"dra_claim_name", "dra_claim_namespace"})
# (namespace, pod, container) label names per dcgm-exporter naming scheme.
CURRENT_SCHEME = ("namespace", "pod", "container")
OLD_SCHEME = ("pod_namespace", "pod_name", "container_name")
VGPU_LABEL = "vgpu"
# The node a series comes from, written by the enricher on every series it serves (its
# Kubernetes node name, or the host's name): dcgm-exporter's own label for it changed name
# (Hostname to hostname in 4.8.3) and can hold the exporter pod's name or localhost, so the
# rules and the dashboard read this one. docs/labels.md.
NODE_LABEL = "node"
# Every upstream series leaves with these labels, empty when no pod is known. Prometheus
# drops empty labels on ingestion, but with honor_labels: true an explicit empty value stops
# the scrape target's own pod/namespace/container (the enricher's pod) from being attached:
# a series about a GPU must never name the monitoring pod.
POD_GUARD_LABELS = ("container", "namespace", "pod")
# Never removed as a stale pod label, even when a pod has a label of that name.
KEPT_LABELS = (
    IDENTITY_LABELS
    | frozenset(CURRENT_SCHEME)
    | frozenset(OLD_SCHEME)
    | {POD_UID_LABEL, VGPU_LABEL, "dra_driver_name", "dra_pool_name", "dra_device_name"}
    | {"dra_mig_profile", "dra_mig_device_uuid"}
)

DeviceKey = tuple[str, str]  # (GPU UUID, GPU_I_ID or "" for a whole GPU)


@dataclass(frozen=True, slots=True)
class Owner:
    """Who a device series names. ``pod`` empty means: clear the pod labels (shared device).

    ``uid`` is the pod's UID when the pod watch knows it (``pod_uid`` on the series)."""

    namespace: str
    pod: str
    container: str
    uid: str = ""


SHARED = Owner("", "", "")


@dataclass(frozen=True, slots=True)
class RewritePlan:
    """What to write on device series: owners by device key; devices absent keep upstream labels."""

    owners: Mapping[DeviceKey, Owner] = field(default_factory=dict)
    # The label names dcgm-exporter copies from each pod it names (--kubernetes-enable-pod-
    # labels), by (namespace, pod), from the pod watch; and the names the user says it copies
    # from any pod (--upstream.pod-labels), for pods the watch does not know.
    pod_labels: Mapping[tuple[str, str], frozenset[str]] = field(default_factory=dict)
    upstream_pod_labels: frozenset[str] = frozenset()
    # Family names the enricher renders itself; upstream families with these names are dropped.
    reserved_prefixes: tuple[str, ...] = (
        "gpu_container_",
        "gpu_process_",
        "gpu_unattributed_",
        "gpu_pod_info",
        "dcgm_enricher_",
    )
    # The ``node`` label's value on every series (empty: none is written).
    node: str = ""


def stale_pod_labels(plan: RewritePlan, named: tuple[str, str], owner: Owner) -> frozenset[str]:
    """The labels of a device series that describe the pod dcgm-exporter named, when the
    enricher names another one (or none): that pod's own labels and its DRA claim.

    The pod's own labels are known from the pod watch; for a pod it does not know, the names
    the user gave with --upstream.pod-labels. Device and pod identity labels are never among
    them, whatever a pod's labels are called.
    """
    if named == (owner.namespace, owner.pod) or named == ("", ""):
        return frozenset()
    names = plan.pod_labels.get(named, frozenset()) | plan.upstream_pod_labels
    return (names - KEPT_LABELS) | DRA_CLAIM_LABELS


def device_key(pairs: Sequence[tuple[str, str]]) -> DeviceKey | None:
    """The device a series is about, from its (name, raw escaped value) label pairs: its GPU
    UUID (either scheme) and ``GPU_I_ID``; None for a series that names no GPU."""
    labels = dict(pairs)
    uuid = labels.get("UUID", labels.get("uuid"))
    if uuid is None:
        return None
    return (unescape_label_value(uuid), unescape_label_value(labels.get(GPU_I_ID, "")))


def device_identity(pairs: Sequence[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    """The device-identifying labels of a series, unescaped, in the upstream's order."""
    return tuple((n, unescape_label_value(v)) for n, v in pairs if n in IDENTITY_LABELS)


def relabel(
    pairs: Sequence[tuple[str, str]], key: DeviceKey | None, plan: RewritePlan
) -> list[tuple[str, str]]:
    """The labels a series leaves with, as (name, unescaped value) pairs, from its upstream
    (name, raw escaped value) pairs and its device ``key``.

    A device the plan names gets the owner's namespace, pod and container in the scheme the
    upstream used (labels it lacked are added in dcgm-exporter's order), the owner's
    ``pod_uid``, and loses what described the pod the upstream named (``stale_pod_labels``).
    Any other series keeps its labels. Every series leaves with the ``POD_GUARD_LABELS``, and
    with the plan's ``node`` (in place of any ``node`` label the upstream wrote).
    """
    owner = plan.owners.get(key) if key is not None else None
    names = {n for n, _ in pairs}
    if owner is None or VGPU_LABEL in names:
        # Idle or unknown device, or dcgm-exporter's per-pod vGPU copies: keep as is
        # (re-rendered so escapes are normalised).
        new_pairs = [(n, unescape_label_value(v)) for n, v in pairs]
    else:
        scheme = OLD_SCHEME if ("pod_name" in names and "pod" not in names) else (CURRENT_SCHEME)
        values = dict(zip(scheme, (owner.namespace, owner.pod, owner.container), strict=True))
        labels = dict(pairs)
        named = (
            unescape_label_value(labels.get(scheme[0], "")),
            unescape_label_value(labels.get(scheme[1], "")),
        )
        drop = stale_pod_labels(plan, named, owner)
        if POD_UID_LABEL in names and (owner.uid or named != (owner.namespace, owner.pod)):
            # The owner's UID; empty with the pod (shared) or when the watch does not
            # know the owner. The upstream's stays only when it named the same pod
            # and the owner's UID is unknown.
            values[POD_UID_LABEL] = owner.uid
        new_pairs = [
            (n, values.pop(n) if n in values else unescape_label_value(v))
            for n, v in pairs
            if n not in drop
        ]
        values.pop(POD_UID_LABEL, None)
        # Labels the upstream lacked are added in dcgm-exporter's order.
        for name in (scheme[2], scheme[0], scheme[1]):
            if name in values:
                new_pairs.append((name, values[name]))
    present = {n for n, _ in new_pairs}
    new_pairs.extend((n, "") for n in POD_GUARD_LABELS if n not in present)
    if plan.node:
        if NODE_LABEL in present:
            new_pairs = [(n, plan.node if n == NODE_LABEL else v) for n, v in new_pairs]
        else:
            new_pairs.append((NODE_LABEL, plan.node))
    return new_pairs
