"""An HTTP answer's body read within a size bound (aiohttp): the upstream's and Docker's."""

from __future__ import annotations

import aiohttp

# How much one read asks for: the bound is checked after each.
CHUNK_BYTES = 65536


async def read_body(content: aiohttp.StreamReader, max_bytes: int) -> bytes | None:
    """The body ``content`` streams (decompressed, when the answer was compressed), or None
    as soon as more than ``max_bytes`` came: the rest is never read, so a body without end or
    a gzip bomb costs at most ``max_bytes`` and one chunk. Transport errors are aiohttp's."""
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = await content.read(CHUNK_BYTES)
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > max_bytes:
            return None
        chunks.append(chunk)
