"""Where the enricher's CPU goes: ``python -m bench --only cost --breakdown``.

Installed in the enricher's process of an extra, instrumented run of the cost part (never in
the run whose CPU seconds give the verdict: the accounting itself costs a little on every
event-loop callback). It counts CPU time (``time.thread_time``, the calling thread's own) in
three ways:

* by event-loop callback: each task by its coroutine, each other callback by its function,
  so the rows add up to the event loop's whole time;
* by function, for the functions in :data:`FUNCTIONS` (the scrape pipeline's parts), wherever
  they run (the node side's reads run in worker threads); these are inside the callbacks above
  or in threads, so they do not add up with them;
* the garbage collector's passes, by generation.

It changes nothing the enricher computes: each function is replaced by a wrapper that calls
it and adds the time.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import importlib
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

# (label, module, attribute path): the scrape pipeline's parts. A path that no longer exists
# fails the install (tests/test_bench.py runs it), so the list follows the code.
FUNCTIONS: tuple[tuple[str, str, str], ...] = (
    ("rewrite", "enricher.rewrite", "Rewriter.rewrite"),
    ("power split and its families", "enricher.stages", "PowerStage.write"),
    ("container families", "enricher.stages", "ContainerFamiliesStage.write"),
    ("idle ledger and last-active family", "enricher.stages", "IdleStage.write"),
    ("gzip of a collection's body", "enricher.compress", "GzipHead.__init__"),
    ("gzip of each scrape's tail", "enricher.compress", "GzipHead.finish"),
    # The pipeline calls the self-metrics writers by the names it imported: wrapped there.
    ("self-metrics of a collection", "enricher.pipeline", "collection_self_metrics"),
    ("self-metrics of each scrape", "enricher.pipeline", "scrape_self_metrics"),
    ("process_* and python_*", "enricher.selfmetrics", "RuntimeFamilies.render"),
    ("NVML read", "enricher.nvml", "NvmlSource.fetch"),
    ("procfs read", "enricher.procfs", "ProcfsSource.read_many"),
    ("attribution", "enricher.nodeside", "attribute"),
    ("rewrite plan", "enricher.nodeside", "plan_devices"),
)


class CpuBreakdown:
    """Thread CPU seconds by event-loop callback, by function and by GC generation."""

    def __init__(self) -> None:
        self.loop: defaultdict[str, float] = defaultdict(float)
        self.functions: defaultdict[str, float] = defaultdict(float)
        self.gc: defaultdict[str, float] = defaultdict(float)
        self._gc_started = 0.0

    def install(self) -> None:
        for label, module, path in FUNCTIONS:
            self._wrap(label, module, path)
        self._wrap_loop()
        gc.callbacks.append(self._on_gc)

    def clear(self) -> None:
        self.loop.clear()
        self.functions.clear()
        self.gc.clear()

    def report(self) -> dict[str, dict[str, float]]:
        """Milliseconds of CPU so far, largest first."""

        def ms(table: dict[str, float]) -> dict[str, float]:
            return {k: round(v * 1000, 2) for k, v in sorted(table.items(), key=lambda x: -x[1])}

        return {"loop": ms(self.loop), "functions": ms(self.functions), "gc": ms(self.gc)}

    def _wrap(self, label: str, module_name: str, path: str) -> None:
        owner: Any = importlib.import_module(module_name)
        *parents, name = path.split(".")
        for part in parents:
            owner = getattr(owner, part)
        original: Callable[..., Any] = getattr(owner, name)  # AttributeError: FUNCTIONS is stale
        table = self.functions

        @functools.wraps(original)
        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.thread_time()
            try:
                return original(*args, **kwargs)
            finally:
                table[label] += time.thread_time() - t0

        setattr(owner, name, timed)

    def _wrap_loop(self) -> None:
        original = asyncio.events.Handle._run
        table = self.loop

        def _run(handle: asyncio.events.Handle) -> None:
            callback = handle._callback  # type: ignore[attr-defined]
            owner = getattr(callback, "__self__", None)
            if isinstance(owner, asyncio.Task):
                coro = owner.get_coro()
                label = "task " + getattr(coro, "__qualname__", type(coro).__name__)
            else:
                label = getattr(callback, "__qualname__", type(callback).__name__)
            t0 = time.thread_time()
            try:
                original(handle)
            finally:
                table[label] += time.thread_time() - t0

        asyncio.events.Handle._run = _run  # type: ignore[method-assign]

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_started = time.thread_time()
        else:
            self.gc[f"generation {info['generation']}"] += time.thread_time() - self._gc_started
