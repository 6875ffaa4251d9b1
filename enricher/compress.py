"""gzip for /metrics: the body of a collection compressed once, the per-scrape tail appended.

A scrape's body is the part that changes once per collection (the rewritten upstream and the
enricher's families: hundreds of KiB) followed by the self-metrics, which change on every
scrape (a few KiB). :class:`GzipHead` compresses the first part once, ending in a sync flush
so the output so far is whole bytes, and keeps the compressor; :meth:`GzipHead.finish`
continues a copy of it with the tail and closes the stream. The result is one ordinary gzip
member (one header, one CRC and length over the whole body), as if the body had been
compressed at once, for the price of compressing a few KiB per scrape.

The compressor is zlib-ng's (the ``zlib-ng`` package, a drop-in for the standard ``zlib``
module): it writes the same DEFLATE format, readable by any gzip reader, about 3 times as fast
as zlib on exposition text (``timeit`` on ``bench.payloads.generate("mig56")``: below).
"""

from __future__ import annotations

from zlib_ng import zlib_ng

# mig56's 800 KiB upstream body, here: level 2 takes 0.30 ms and gives 37 KiB (zlib level 1:
# 1.0 ms, 39 KiB; zlib-ng level 1: 0.23 ms, 47 KiB; level 6: 1.3 ms, 25 KiB). Once per collection.
GZIP_LEVEL = 2
_GZIP_WBITS = 31  # 16 + 15: a gzip header and trailer, a 32 KiB window


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

    __slots__ = ("_compressor", "data", "size")

    def __init__(self, *head: bytes, level: int = GZIP_LEVEL) -> None:
        """``head``: the body's first part, in one or more chunks (compressed in turn, as if
        they were one)."""
        compressor = zlib_ng.compressobj(level, zlib_ng.DEFLATED, _GZIP_WBITS)
        out = [compressor.compress(chunk) for chunk in head]
        out.append(compressor.flush(zlib_ng.Z_SYNC_FLUSH))
        self.data = b"".join(out)
        self.size = sum(len(chunk) for chunk in head)
        self._compressor = compressor

    def finish(self, tail: bytes) -> bytes:
        """The whole body (head, then ``tail``) as one gzip member."""
        # zlib-ng's stub leaves out copy(), which its compressor has (as zlib's does).
        compressor: zlib_ng._Compress = self._compressor.copy()  # type: ignore[attr-defined]
        return self.data + compressor.compress(tail) + compressor.flush(zlib_ng.Z_FINISH)
