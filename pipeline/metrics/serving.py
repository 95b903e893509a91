"""A role's registry and its ``/metrics`` endpoint (prometheus-client's own HTTP server)."""

from __future__ import annotations

from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, ProcessCollector, start_http_server

from topics.errors import MixflowError


def role_registry() -> CollectorRegistry:
    """A registry of one role process: its metrics and the process's own (``process_cpu_seconds_total``,
    ``process_resident_memory_bytes``, ``process_start_time_seconds``, which moves when a role restarts)."""
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    return registry


class MetricsServer:
    """A running ``/metrics`` endpoint; ``close()`` stops it."""

    def __init__(self, server: WSGIServer, port: int) -> None:
        self.server = server
        self.port = port

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def serve_metrics(registry: CollectorRegistry, port: int | None, what: str) -> MetricsServer | None:
    """Serve ``registry`` at ``http://<any interface>:<port>/metrics``; port 0 or None serves nothing.
    ``what`` names the role in the error when the port cannot be had."""
    if not port:
        return None
    if not 0 < port < 65536:
        msg = f"{what}: metrics port {port} is not between 1 and 65535 (0 turns metrics off)"
        raise MixflowError(msg)
    try:
        server, _ = start_http_server(port, registry=registry)
    except OSError as exc:
        msg = f"{what}: cannot serve metrics on port {port}: {exc.strerror or exc}; choose a free port (0: off)"
        raise MixflowError(msg) from exc
    return MetricsServer(server, port)
