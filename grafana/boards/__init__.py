"""The family of dashboards grafana/generate.py builds, from the widest scope to the
narrowest, and the enricher's own."""

from __future__ import annotations

from . import cluster, enricher, namespace, node, pod
from .common import Board

BOARDS: tuple[Board, ...] = (
    cluster.BOARD,
    namespace.BOARD,
    pod.BOARD,
    node.BOARD,
    enricher.BOARD,
)
