"""The trainer sink's Prometheus metrics, named as the pipeline's (``mixflow_sink_...``), defined here
because the sink imports ``topics`` only.

A rank's ``mixflow_sink_step`` subtracted from the constructor's ``mixflow_constructor_last_step`` is how
many steps the constructor is ahead of that rank."""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from topics.errors import MixflowError

if TYPE_CHECKING:
    from trainer_sink.deliveries import Delivery

# From an item already prefetched (microseconds) to a constructor that is far behind (minutes).
WAIT_BUCKETS = (0.0001, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


class SinkMetrics:
    """One data-parallel rank's sink: what it handed to the trainer, and how long the trainer waited."""

    def __init__(self, registry: CollectorRegistry, job: str, rank: int) -> None:
        self.registry = registry
        labels, values = ["job", "rank"], (job, str(rank))
        self.micro_batches = Counter(
            "mixflow_sink_micro_batches", "Micro-batches handed to the trainer", labels, registry=registry
        ).labels(*values)
        self.tokens = Counter(
            "mixflow_sink_tokens",
            "Tokens (not padding) of the micro-batches handed out",
            labels,
            registry=registry,
        ).labels(*values)
        self.step = Gauge(
            "mixflow_sink_step", "The step of the last micro-batch handed out (-1: none yet)", labels, registry=registry
        ).labels(*values)
        self.step.set(-1)
        self.wait_seconds = Histogram(
            "mixflow_sink_wait_seconds",
            "Time the trainer waited for each micro-batch (near 0 when it was prefetched)",
            labels,
            buckets=WAIT_BUCKETS,
            registry=registry,
        ).labels(*values)
        self.prefetch_bytes = Gauge(
            "mixflow_sink_prefetch_bytes",
            "Bytes of decoded micro-batches waiting in the prefetch queue",
            labels,
            registry=registry,
        ).labels(*values)
        self._tokens_due: collections.deque[int] = collections.deque()
        self._server: WSGIServer | None = None

    def measure_prefetch(self, queued_bytes: Callable[[], int]) -> None:
        self.prefetch_bytes.set_function(queued_bytes)

    def noting_tokens(self, deliveries: Iterator[Delivery]) -> Iterator[Delivery]:
        """``deliveries``, noting each one's token count while its tensors are still on the CPU (a count
        taken on the GPU would wait for the device); ``handed_out`` takes them in the same order."""
        self._tokens_due.clear()
        for delivery in deliveries:
            cu_seqlens = delivery.tensors.get("cu_seqlens")
            self._tokens_due.append(int(cu_seqlens[-1]) if cu_seqlens is not None and len(cu_seqlens) else 0)
            yield delivery

    def handed_out(self, delivery: Delivery, waited_s: float) -> None:
        self.micro_batches.inc()
        self.tokens.inc(self._tokens_due.popleft() if self._tokens_due else 0)
        self.step.set(delivery.step)
        self.wait_seconds.observe(waited_s)

    def serve(self, port: int) -> None:
        """Serve the registry at ``http://<any interface>:<port>/metrics`` (once; later calls do nothing)."""
        if self._server is not None:
            return
        if not 0 < port < 65536:
            msg = f"metrics_port {port} is not between 1 and 65535 (None: no metrics endpoint)"
            raise MixflowError(msg)
        try:
            self._server, _ = start_http_server(port, registry=self.registry)
        except OSError as exc:
            msg = f"the sink cannot serve metrics on port {port}: {exc.strerror or exc}; choose a free metrics_port"
            raise MixflowError(msg) from exc

    def close(self) -> None:
        """Stop serving, if it does."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
