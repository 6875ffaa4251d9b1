"""A plain HTTP GET, for a server in another process or thread (Prometheus, the demo)."""

from __future__ import annotations

import urllib.request


def get(url: str, timeout: float = 5) -> bytes:
    """The body of ``GET url`` (an HTTP error status raises ``urllib.error.HTTPError``)."""
    with urllib.request.urlopen(url, timeout=timeout) as response:
        body: bytes = response.read()
        return body
