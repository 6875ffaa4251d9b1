"""When each side of a collection is read: the upstream followed right after each of its
collections (``--upstream.follow-step``) or fetched on every scrape, the node side on its own
interval (``--collect.interval``), aligned with the upstream's collections, or on every scrape;
and scrapes that arrive while one is under way sharing its result. The pipeline
(``enricher.pipeline``) says what a collection is made of; this module says when.

Nothing here knows what an answer holds: the upstream's and the node's reads, and what to do
with a new upstream collection, are handed in.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

from .config import Config
from .nodeside import NodeView
from .refresh import Follower, Refresher
from .sources import MeasuredRead

T = TypeVar("T")
UpstreamAnswer = MeasuredRead[str | None]


class Coalescer(Generic[T]):
    """Runs ``work`` one call at a time: a call that arrives while one is under way waits for
    that one and shares its result (or its error)."""

    def __init__(self, work: Callable[[], Awaitable[T]]) -> None:
        self._work = work
        self._inflight: asyncio.Future[T] | None = None

    @property
    def busy(self) -> bool:
        return self._inflight is not None and not self._inflight.done()

    async def __call__(self) -> T:
        if self._inflight is not None and not self._inflight.done():
            return await asyncio.shield(self._inflight)
        fut: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._inflight = fut
        try:
            result = await self._work()
        except BaseException as exc:
            fut.set_exception(exc)
            fut.exception()  # mark retrieved: joiners re-raise it themselves
            raise
        fut.set_result(result)
        return result


class Schedule:
    """The reads of one enricher, on the rhythm its flags ask for.

    ``read_node`` reads the node side (``NodeSide.read``); ``fetch_upstream`` asks the upstream
    once; ``on_collection`` prepares what scrapes will serve for a new upstream collection
    (called with the answer and the node view read for it), so a scrape finds it ready.
    """

    def __init__(
        self,
        config: Config,
        *,
        read_node: Callable[[], Awaitable[NodeView]],
        fetch_upstream: Callable[[], Awaitable[UpstreamAnswer]],
        on_collection: Callable[[UpstreamAnswer, NodeView], Awaitable[None]],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._read_node = read_node
        self._fetch_upstream = fetch_upstream
        self._on_collection = on_collection
        # The upstream fetched right after each of its collections; with step 0, on every
        # scrape.
        step = config.upstream_follow_step
        self.follower: Follower[UpstreamAnswer] | None = (
            Follower(
                fetch_upstream,
                step=step,
                coarse=max(step, 1.0),
                key=lambda answer: answer.value,
                on_change=self._prepare,
                clock=clock,
                name="upstream",
            )
            if step > 0
            else None
        )
        # The node side (NVML, procfs, the kubelet, Docker): with --collect.interval, read in
        # the background every that many seconds. Without it, when following the upstream,
        # read right after each upstream collection ("aligned": both sides of a scrape are as
        # old as that collection, and gpu_container_utilization_ratio covers the same interval
        # as dcgm-exporter's own averages); a scrape reads it itself only when the last one is
        # older than the upstream's interval. Neither: on every scrape.
        self.aligned = self.follower is not None and config.collect_interval == 0
        self.node_refresh: Refresher[NodeView] | None = None
        if config.collect_interval > 0:
            self.node_refresh = Refresher(
                read_node, config.collect_interval, clock=clock, name="node"
            )
        elif self.aligned:
            # No loop of its own: each upstream collection refreshes it (see _prepare).
            self.node_refresh = Refresher(
                read_node, None, max_age=self._aligned_max_age, clock=clock, name="node"
            )

    def start(self) -> None:
        """Start the background work (following the upstream, a --collect.interval loop) in
        the running event loop; a no-op once it runs."""
        if self.node_refresh is not None:
            self.node_refresh.start()
        if self.follower is not None:
            self.follower.start()

    async def close(self) -> None:
        if self.follower is not None:
            await self.follower.close()
        if self.node_refresh is not None:
            await self.node_refresh.close()

    def _aligned_max_age(self) -> float:
        """How old the node side may be when it is read after each upstream collection: one
        learnt collection interval (with slack) plus a step and the read itself; before the
        interval is learnt, the follower's coarse poll."""
        follower, refresh = self.follower, self.node_refresh
        if follower is None or refresh is None:
            return 0.0
        interval = follower.interval
        if interval is None:
            return follower.coarse
        return interval * 1.1 + follower.step + refresh.last_duration

    async def _prepare(self, answer: UpstreamAnswer) -> None:
        """A new upstream collection: read the node side now when aligned with the upstream,
        then hand both over to be prepared."""
        if self.aligned and self.node_refresh is not None:
            node = await self.node_refresh.refresh()
        else:
            node = await self.node_view()
        await self._on_collection(answer, node)

    async def node_view(self) -> NodeView:
        """The node view a scrape reads now."""
        if self.node_refresh is not None:
            return await self.node_refresh.get()
        return await self._read_node()

    async def upstream_answer(self) -> UpstreamAnswer:
        """The upstream answer a scrape serves now."""
        if self.follower is None:
            return await self._fetch_upstream()
        answer, _polled_at = await self.follower.latest()
        if answer.value is None:
            # A failure is never served from the cache: while the upstream is down (or not
            # found yet), every scrape asks again, as without following.
            await self.follower.poll_once()
            answer, _polled_at = await self.follower.latest()
        return answer
