"""Ports on 127.0.0.1 for servers a test or the bench starts."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for a server in a subprocess)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def closed_port() -> socket.socket:
    """A TCP socket bound to a port on 127.0.0.1 and not listening: a connection to it is
    refused for as long as the caller keeps it open, and no server started meanwhile can take
    the port (as one can a ``free_port`` number, whose socket is closed at once)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    return s
