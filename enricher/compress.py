"""gzip for /metrics: the body of a collection compressed once, the per-scrape tail appended.

A scrape's body is the part that changes once per collection (the rewritten upstream and the
enricher's families: hundreds of KiB) followed by the self-metrics, which change on every
scrape (a few KiB). :class:`GzipHead` compresses the first part once, ending in a sync flush
so the output so far is whole bytes (DEFLATE blocks, none of them final), and keeps the CRC-32
of what it compressed. :meth:`GzipHead.finish` compresses the tail with a small compressor of
its own as a raw DEFLATE stream, whose last block is the final one, and writes the gzip
trailer (RFC 1952: the CRC-32 of the whole body, continued from the head's, and its length).
A DEFLATE stream is a sequence of blocks whose back-references reach only into the output
before them, so the tail's blocks after the head's are one valid stream: the result is one
ordinary gzip member (one header, one CRC and length over the whole body), as if the body
had been compressed at once, for the price of compressing a few KiB per scrape. No
compressor is kept between scrapes (copying the head's, about 300 KiB of state, on every
scrape, as this module did before, cost more than the tail's compression).

The compressor is zlib-ng's (the ``zlib-ng`` package, a drop-in for the standard ``zlib``
module): it writes the same DEFLATE format, readable by any gzip reader, about 3 times as fast
as zlib on exposition text (``timeit`` on ``bench.payloads.generate("mig56")``: below).
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING

from zlib_ng import zlib_ng

if TYPE_CHECKING:
    from .collection import CollectionBody, ScrapeResult
    from .worker import Worker

# mig56's 800 KiB upstream body, here: level 2 takes 0.30 ms and gives 37 KiB (zlib level 1:
# 1.0 ms, 39 KiB; zlib-ng level 1: 0.23 ms, 47 KiB; level 6: 1.3 ms, 25 KiB). Once per collection.
GZIP_LEVEL = 2
_GZIP_WBITS = 31  # 16 + 15: a gzip header and trailer, a 32 KiB window
# The tail (a few KiB of self-metrics): raw DEFLATE (negative: no header, no trailer) with a
# 4 KiB window and a small hash table, so its compressor's state is small and quick to set up.
_TAIL_WBITS = -12
_TAIL_MEMLEVEL = 4
_TRAILER = struct.Struct("<II")  # CRC-32, then the length modulo 2**32 (RFC 1952 2.3.1)
# Collection bodies up to this size are gzipped on the event loop (zlib-ng level 2: about
# 0.3 ms for mig56's 900 KiB, 2 ms at most); larger ones in the rewrite worker (zlib-ng lets go
# of the GIL while it compresses). On the loop, the compressor's buffers come from the main
# thread's heap instead of the worker thread's own malloc arena, which would keep freed memory
# resident.
GZIP_INLINE_MAX_BYTES = 4 << 20


def accepts_gzip(accept_encoding: str) -> bool:
    """Whether an ``Accept-Encoding`` header value admits gzip (pure; RFC 9110 12.5.3):
    ``gzip`` (or ``x-gzip``) with a q-value above 0, or ``*`` above 0 when gzip is not named.
    Anything unparsable counts as not accepted: the identity body is always acceptable."""
    named: float | None = None
    star: float | None = None
    for item in accept_encoding.split(","):
        coding, *params = (part.strip() for part in item.split(";"))
        q = 1.0
        for param in params:
            key, _, value = param.partition("=")
            if key.strip().lower() == "q":
                try:
                    q = float(value.strip())
                except ValueError:
                    q = 0.0
                if not 0.0 <= q <= 1.0:  # also NaN
                    q = 0.0
        coding = coding.lower()
        if coding in ("gzip", "x-gzip"):
            named = q if named is None else max(named, q)
        elif coding == "*":
            star = q
    if named is not None:
        return named > 0.0
    return star is not None and star > 0.0


class GzipHead:
    """``head`` (its chunks) compressed once; :meth:`finish` appends a tail and closes the
    stream."""

    __slots__ = ("_crc", "data", "size")

    def __init__(self, *head: bytes, level: int = GZIP_LEVEL) -> None:
        """``head``: the body's first part, in one or more chunks (compressed in turn, as if
        they were one)."""
        compressor = zlib_ng.compressobj(level, zlib_ng.DEFLATED, _GZIP_WBITS)
        out = [compressor.compress(chunk) for chunk in head]
        out.append(compressor.flush(zlib_ng.Z_SYNC_FLUSH))
        crc = 0
        for chunk in head:
            crc = zlib_ng.crc32(chunk, crc)
        self.data = b"".join(out)
        self.size = sum(len(chunk) for chunk in head)
        self._crc = crc

    def finish(self, tail: bytes) -> bytes:
        """The whole body (head, then ``tail``) as one gzip member."""
        compressor = zlib_ng.compressobj(GZIP_LEVEL, zlib_ng.DEFLATED, _TAIL_WBITS, _TAIL_MEMLEVEL)
        trailer = _TRAILER.pack(
            zlib_ng.crc32(tail, self._crc), (self.size + len(tail)) & 0xFFFFFFFF
        )
        return b"".join(
            (self.data, compressor.compress(tail), compressor.flush(zlib_ng.Z_FINISH), trailer)
        )


class GzipBodies:
    """The HTTP side's gzip of the newest collection body (``enricher.collection``): compressed
    once per body (by its number), then each scrape's tail appended. Until a scraper asks for
    gzip nothing is compressed; from then on each new collection body is compressed as soon as
    it is made (:meth:`prepare`, which the pipeline calls), before a scrape asks.
    ``worker``: where a body over ``GZIP_INLINE_MAX_BYTES`` is compressed, when it is idle."""

    def __init__(self, worker: Worker) -> None:
        self._worker = worker
        self.wanted = False
        self._newest: tuple[int, GzipHead] | None = None

    async def prepare(self, body: CollectionBody) -> None:
        if self.wanted:
            await self._compressed(body)

    async def finish(self, result: ScrapeResult) -> bytes:
        """``result``'s whole body as one gzip member."""
        self.wanted = True
        return (await self._compressed(result.shared)).finish(result.tail)

    async def _compressed(self, body: CollectionBody) -> GzipHead:
        newest = self._newest
        if newest is not None and newest[0] == body.number:
            return newest[1]
        if body.size <= GZIP_INLINE_MAX_BYTES or not self._worker.idle:
            gz = GzipHead(*body.chunks)
        else:
            gz = await self._worker.run(lambda: GzipHead(*body.chunks))
        newest = self._newest
        if newest is None or newest[0] < body.number:  # kept unless a newer one came meanwhile
            self._newest = (body.number, gz)
        return gz
