"""`mixflow autoscale --spec SPEC --metrics-port P`: run the autoscaling policy on a running job and export
each source's desired loaders as Prometheus gauges, for Kubernetes (a KEDA ScaledObject scales each source's
loader Deployment on ``mixflow_autoscaler_desired_loaders``). It starts and stops nothing itself; loaders are
counted as the members of each source's loader group."""

from __future__ import annotations

import argparse
import logging
import signal
import threading
import time
from pathlib import Path
from types import FrameType

from pipeline.cli.arguments import port, positive_int

log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--spec", type=Path, required=True, help="the job's YAML spec")
    parser.add_argument("--bootstrap-servers", help="override the spec's and $KAFKA_BOOTSTRAP_SERVERS")
    parser.add_argument("--metrics-port", type=port, required=True, help="serve the gauges on this port")
    parser.add_argument(
        "--max-total-loaders", type=positive_int, help="budget of loaders of all sources together (default: the spec's)"
    )
    parser.add_argument(
        "--decisions", type=positive_int, help="stop after this many decisions (default: run until SIGTERM or SIGINT)"
    )


def run(args: argparse.Namespace) -> int:
    from confluent_kafka import KafkaException

    from pipeline.metrics import role_registry, serve_metrics
    from pipeline.roles.autoscale import Autoscaler, JobProbe, PolicySettings
    from pipeline.roles.autoscale.metrics import AutoscalerMetrics
    from pipeline.spec import load_spec
    from topics.errors import MixflowError

    spec = load_spec(args.spec)
    if not spec.autoscaling.enabled:
        log.info("autoscaling.enabled is false in %s: exporting the decisions all the same", args.spec)
    settings = PolicySettings.from_spec(spec.autoscaling, args.max_total_loaders)
    autoscaler = Autoscaler(spec, settings)
    stop = threading.Event()

    def request_stop(_signum: int, _frame: FrameType | None) -> None:
        stop.set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, request_stop)
    registry = role_registry()
    metrics = AutoscalerMetrics(registry, spec.job)
    server = serve_metrics(registry, args.metrics_port, f"autoscaler of {spec.job}")
    probe = JobProbe(spec.kafka.client_config(args.bootstrap_servers, role="observer"), spec.job, spec.source_names)
    decided = 0
    try:
        while not stop.is_set() and (args.decisions is None or decided < args.decisions):
            began = time.monotonic()
            try:
                loaders = probe.loaders()
                for d in autoscaler.tick(probe, loaders, began):
                    log.info("autoscale %s", d.line())
                    metrics.decided(d)
                decided += 1
            except (KafkaException, MixflowError, TimeoutError) as exc:  # the next interval tries again
                log.warning("autoscaler: cannot read job %s now: %s", spec.job, exc)
            stop.wait(max(spec.autoscaling.interval_s - (time.monotonic() - began), 0.0))
    finally:
        probe.close()
        if server is not None:
            server.close()
    return 0
