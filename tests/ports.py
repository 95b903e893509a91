"""A local TCP port nobody listens on, for a test's own server (metrics endpoints, gloo rendezvous)."""

from __future__ import annotations

import socket


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
