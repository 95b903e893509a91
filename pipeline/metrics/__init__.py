"""What every role's Prometheus metrics share: registries, serving, the endpoints file and the dead-letter
reason classes. Each role defines its own metrics beside it (``pipeline/roles/<role>/metrics.py``;
``trainer_sink.metrics`` defines the sink's, since the sink imports ``topics`` only).

Names follow Prometheus conventions: ``mixflow_<role>_<what>_total`` counters, ``_seconds``, ``_bytes``,
``_tokens`` and ``_ratio`` in the names of what they measure, labels ``job``, ``source``, ``rank`` and
``reason`` (a fixed set of classes: ``reasons.py``), never a sample id. Each role process gets a registry
of its own (``role_registry``), served on its ``--metrics-port``; a role made without one keeps its
metrics in a private registry nobody serves, so tests and replays in one process never collide."""

from pipeline.metrics.endpoints import METRICS_FILE, Endpoint, RunMetrics, read_endpoints
from pipeline.metrics.reasons import DeadLetterReason, reason_class
from pipeline.metrics.serving import MetricsServer, role_registry, serve_metrics

__all__ = [
    "METRICS_FILE",
    "DeadLetterReason",
    "Endpoint",
    "MetricsServer",
    "RunMetrics",
    "read_endpoints",
    "reason_class",
    "role_registry",
    "serve_metrics",
]
