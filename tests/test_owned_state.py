"""State has an owner: a cache or memo lives on an object its owner makes, never in a module, so
two Scrapers in one process (as in the tests and the bench) each keep their own. Real parts as
in tests/test_golden.py: the real app over HTTP, pynvml against the fake libnvidia-ml (no GPU
here), /proc trees on disk read by the real ProcfsSource, the kubernetes client watching pods on
the API-server stand-in (no cluster here), dcgm-exporter-shaped text served by aiohttp."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from devkit.nvmlfake import nvml_state_of
from enricher import promclient, upstreamlines
from enricher.procfs import ProcfsSource
from enricher.simnode.api import pod_object
from enricher.simnode.fakeproc import write_proc_tree
from enricher.simnode.node import SimNode

from .harness import MakeStack, Stack, cid, normalise
from .test_golden import BOOT, FIXTURES, GOLDEN_NODE, NODE, write_proc

NODE_B = "gpu-node-b"
HOSTNAME_A = 'Hostname="dcgm-exporter-7xk2p"'
HOSTNAME_B = 'Hostname="dcgm-exporter-b9q4z"'


def _other_node() -> SimNode:
    """The golden node's GPUs and PIDs (one fake NVML serves the process) with pods of other
    names, namespaces, UIDs and containers: every pod label set differs from node A's."""
    renamed = {
        p: replace(
            p,
            namespace=f"{p.namespace}-b",
            name=f"{p.name}-b",
            uid=p.uid[:-12] + "b" * 11 + p.uid[-1],
            container_id=cid(0x100 + i),
        )
        for i, p in enumerate(GOLDEN_NODE.pods)
    }
    # A process of a pod the API server no longer holds keeps it: none holds it on node B.
    procs = tuple(
        replace(proc, pod=renamed.get(proc.pod, proc.pod)) if proc.pod is not None else proc
        for proc in GOLDEN_NODE.procs
    )
    return replace(GOLDEN_NODE, name=NODE_B, pods=tuple(renamed.values()), procs=procs)


async def _start(full_stack: MakeStack, which: str, tmp_path: Path) -> Stack:
    text = (FIXTURES / "node.prom").read_text()
    assert HOSTNAME_A in text
    if which == "a":
        return await full_stack(
            upstream=text,
            nvml=nvml_state_of(GOLDEN_NODE),
            proc=write_proc,
            node=NODE,
            pods=[pod_object(p, NODE) for p in GOLDEN_NODE.pods],
            upstream_timeout=2.0,
        )
    node_b = _other_node()
    root = tmp_path / "proc-b"
    write_proc_tree(root, node_b, BOOT + 86_400)
    return await full_stack(
        upstream=text.replace(HOSTNAME_A, HOSTNAME_B),
        nvml=nvml_state_of(GOLDEN_NODE),
        procs=ProcfsSource(str(root)),
        node=NODE_B,
        pods=[pod_object(p, NODE_B) for p in node_b.pods],
        upstream_timeout=2.0,
    )


async def _body(stack: Stack) -> str:
    return normalise(await stack.scrape())


# The order of the collections (one per scrape: the per-scrape mode reads everything each time).
ORDER = "abbaab"


async def test_two_scrapers_in_one_process_keep_to_their_own(
    full_stack: MakeStack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two nodes' Scrapers, their collections interleaved: each serves what it serves when it
    runs alone, and neither turns or fills the other's memos. Node B's third collection
    follows two of node A's; its label sets and upstream line heads are the ones of its
    collection before, so it formats no label block and parses no line head again (with one
    memo per process, A's two collections had turned B's label sets out, and A's heads had
    replaced B's)."""
    alone: dict[str, list[str]] = {}
    for which in "ab":
        stack = await _start(full_stack, which, tmp_path)
        alone[which] = [await _body(stack) for _ in range(ORDER.count(which))]
        await stack.close()
    assert alone["a"][-1] != alone["b"][-1]
    assert NODE_B not in alone["a"][-1] and "-b" in alone["b"][-1]

    # What formatting a label set of our families starts with (prometheus_client's runtime
    # families, written by render_metrics on every collection, do not go through it).
    blocks: list[str] = []
    heads: list[str] = []
    written_value, series_device = promclient.written_value, upstreamlines._series_device

    def counted_block(value: str) -> str:
        blocks.append(value)
        return written_value(value)

    def counted_head(name: str, series: str) -> Any:
        heads.append(series)
        return series_device(name, series)

    monkeypatch.setattr(promclient, "written_value", counted_block)
    monkeypatch.setattr(upstreamlines, "_series_device", counted_head)
    stacks = {which: await _start(full_stack, which, tmp_path) for which in "ab"}
    together: dict[str, list[str]] = {"a": [], "b": []}
    for which in ORDER[:-1]:
        together[which].append(await _body(stacks[which]))
    blocks.clear()
    heads.clear()
    together["b"].append(await _body(stacks["b"]))
    assert (blocks, heads) == ([], [])
    assert together == alone
