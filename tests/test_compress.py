"""gzip on /metrics: when a scraper accepts it, the body of a collection is compressed once and
only the self-metrics per scrape; identity otherwise; Vary on both.

Real parts: the aiohttp app and an aiohttp client that does not decompress (so the test sees
what went on the wire), Python's gzip module as the reader. Real Prometheus (2.42 and 3.5,
which ask for gzip) scrapes the app in tests/test_dashboard.py and tests/test_manifests.py.
"""

from __future__ import annotations

import gzip
import subprocess
import zlib
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from bench import payloads
from devkit.tools import require_tool
from enricher import compress
from enricher.compress import GzipHead, accepts_gzip

from .harness import MakeStack, Stack


@pytest.mark.parametrize(
    ("header", "ok"),
    [
        pytest.param("gzip", True, id="gzip"),
        pytest.param("gzip, deflate, br", True, id="list"),
        pytest.param("GZIP", True, id="case"),
        pytest.param("x-gzip", True, id="x-gzip"),
        pytest.param("identity", False, id="identity"),
        pytest.param("", False, id="empty"),
        pytest.param("gzip;q=0", False, id="refused"),
        pytest.param("gzip; q=0.000", False, id="refused-zeros"),
        pytest.param("gzip;q=0.5", True, id="weighted"),
        pytest.param("*", True, id="star"),
        pytest.param("*;q=0", False, id="star-refused"),
        pytest.param("gzip;q=0, *", False, id="named-beats-star"),
        pytest.param("deflate, *;q=0.1", True, id="star-weighted"),
        pytest.param("gzip;q=nan", False, id="nan"),
        pytest.param("gzip;q=2", False, id="out-of-range"),
        pytest.param("gzip;q=x", False, id="garbage-q"),
        pytest.param("gzipx", False, id="not-a-token-match"),
    ],
)
def test_accepts_gzip(header: str, ok: bool) -> None:
    assert accepts_gzip(header) == ok


@pytest.mark.parametrize("tail", [b"", b"tail 1\n", bytes(range(256)) * 40], ids=len)
def test_head_and_tail_are_one_gzip_member(tail: bytes) -> None:
    head = payloads.generate("node8").encode()
    data = GzipHead(head).finish(tail)
    assert gzip.decompress(data) == head + tail
    # One member: a reader that stops at the end of the first member gets it all.
    reader = zlib.decompressobj(31)
    assert reader.decompress(data) == head + tail and reader.eof and not reader.unused_data


def test_gnu_gzip_reads_and_checks_the_member() -> None:
    """A reader that is not zlib's: GNU gzip checks the trailer's CRC-32 and length over the
    head's blocks and the tail's, and rejects the member when either is off."""
    gnu = require_tool("gzip", "apt-get install gzip")
    head = payloads.generate("node8").encode()
    tail = b"dcgm_enricher_scrapes_total 7\n" * 300  # longer than the tail's 4 KiB window
    data = GzipHead(head).finish(tail)
    out = subprocess.run([gnu, "-dc"], input=data, capture_output=True, check=True)
    assert out.stdout == head + tail
    for at in (-8, -4):  # the CRC, then the length
        bad = bytearray(data)
        bad[at] ^= 1
        assert subprocess.run([gnu, "-t"], input=bytes(bad), capture_output=True).returncode != 0


def test_a_head_in_chunks_is_the_head_joined() -> None:
    """The Scraper hands its body over in parts (rewritten upstream, families, power): the
    stream is the same as for the parts joined."""
    parts = [payloads.generate("node8").encode(), b"", b"ours 1\n" * 100, b"power 2\n"]
    data = GzipHead(*parts).finish(b"tail\n")
    assert gzip.decompress(data) == b"".join(parts) + b"tail\n"
    assert GzipHead(*parts).size == len(b"".join(parts))


def test_finish_leaves_the_head_reusable() -> None:
    head = GzipHead(b"collection\n" * 1000)
    assert gzip.decompress(head.finish(b"a\n")) == b"collection\n" * 1000 + b"a\n"
    assert gzip.decompress(head.finish(b"b\n")) == b"collection\n" * 1000 + b"b\n"


async def node(full_stack: MakeStack, **config: Any) -> tuple[Stack, TestClient[Any, Any]]:
    stack = await full_stack(upstream=payloads.generate("node8"), **config)
    raw: TestClient[Any, Any] = TestClient(stack.client.server, auto_decompress=False)
    await raw.start_server()
    return stack, raw


async def test_gzip_when_accepted_identity_otherwise(full_stack: MakeStack) -> None:
    stack, raw = await node(full_stack)
    try:
        plain = await raw.get("/metrics", headers={"Accept-Encoding": "identity"})
        identity = await plain.read()
        assert plain.status == 200
        assert "Content-Encoding" not in plain.headers
        assert plain.headers["Vary"] == "Accept-Encoding"

        zipped = await raw.get("/metrics", headers={"Accept-Encoding": "gzip"})
        data = await zipped.read()
        assert zipped.headers["Content-Encoding"] == "gzip"
        assert zipped.headers["Vary"] == "Accept-Encoding"
        assert zipped.headers["Content-Type"] == plain.headers["Content-Type"]
        assert int(zipped.headers["Content-Length"]) == len(data)
        text = gzip.decompress(data)
        # The same collection: everything but the self-metrics' tail is the same bytes.
        head = stack.scraper.last.shared if stack.scraper.last else None
        assert head is not None
        body = b"".join(head.chunks)
        assert text.startswith(body) and identity.startswith(body)
        assert len(data) * 4 < len(text)

        refused = await raw.get("/metrics", headers={"Accept-Encoding": "gzip;q=0"})
        assert "Content-Encoding" not in refused.headers
        await refused.read()
    finally:
        await raw.close()


async def test_a_collection_body_is_compressed_once(
    full_stack: MakeStack, monkeypatch: pytest.MonkeyPatch
) -> None:
    made: list[int] = []

    class Counted(GzipHead):
        """GzipHead, counted: each collection body is compressed once (white box)."""

        def __init__(self, *chunks: bytes, **kw: Any) -> None:
            made.append(len(chunks))
            super().__init__(*chunks, **kw)

    monkeypatch.setattr(compress, "GzipHead", Counted)
    stack, raw = await node(full_stack)
    try:
        bodies = []
        for _ in range(3):
            resp = await raw.get("/metrics", headers={"Accept-Encoding": "gzip"})
            bodies.append(gzip.decompress(await resp.read()))
        # Per scrape (upstream fetched on every scrape here, the same body): one compression.
        assert len(made) == 1
        assert len({b.split(b"# HELP dcgm_enricher_")[0] for b in bodies}) == 1
        stack.upstream.body = payloads.generate("node8", 1)  # type: ignore[union-attr]
        resp = await raw.get("/metrics", headers={"Accept-Encoding": "gzip"})
        assert (
            payloads.generate("node8", 1).split("\n")[2]
            in gzip.decompress(await resp.read()).decode()
        )
        assert len(made) == 2
    finally:
        await raw.close()


async def test_head_request_has_the_headers_and_no_body(full_stack: MakeStack) -> None:
    _, raw = await node(full_stack)
    try:
        resp = await raw.head("/metrics", headers={"Accept-Encoding": "gzip"})
        assert resp.status == 200
        assert resp.headers["Content-Encoding"] == "gzip"
        assert resp.headers["Vary"] == "Accept-Encoding"
        assert await resp.read() == b""
        resp = await raw.head("/metrics", headers={"Accept-Encoding": "identity"})
        assert "Content-Encoding" not in resp.headers
    finally:
        await raw.close()
