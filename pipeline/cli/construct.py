"""`mixflow construct --spec SPEC`: run the data constructor of a job. Start it more than once for shadow
instances that take over when the active one dies."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from pipeline.cli.arguments import job_name, non_negative_int, positive_int
from pipeline.cli.command import add_metrics_port
from pipeline.roles.constructor.lease import DEFAULT_SESSION_TIMEOUT_MS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--spec", type=Path, required=True, help="the job's YAML spec")
    parser.add_argument("--bootstrap-servers", help="override the spec's and $KAFKA_BOOTSTRAP_SERVERS")
    parser.add_argument("--max-steps", type=positive_int, help="stop after writing this many steps (default: no limit)")
    parser.add_argument(
        "--output-job",
        type=job_name,
        help="write rank and state topics under this job name while reading the spec's job's sources",
    )
    parser.add_argument(
        "--lease-timeout-ms",
        type=positive_int,
        default=DEFAULT_SESSION_TIMEOUT_MS,
        help="how soon a shadow instance takes over from a dead active one (default: %(default)s)",
    )
    parser.add_argument("--instance", default="", help="this instance's name in logs (default: host-pid)")
    add_metrics_port(parser)
    parser.add_argument(
        "--lane",
        type=non_negative_int,
        default=0,
        help="the constructor lane to run, 0 <= LANE < the spec's constructor.lanes (default: %(default)s)",
    )
    parser.add_argument(
        "--transaction-timeout-ms",
        type=positive_int,
        default=60_000,
        help="how long an open transaction of a dead constructor blocks readers (default: %(default)s)",
    )


def run(args: argparse.Namespace) -> int:
    from pipeline.metrics import role_registry, serve_metrics
    from pipeline.roles.constructor import ConstructorOptions, DataConstructor
    from pipeline.roles.constructor.metrics import ConstructorMetrics, SourceBacklog
    from pipeline.spec import load_spec
    from topics.formats.names import JobTopics
    from topics.kafka.cluster_probe import require_reachable

    spec = load_spec(args.spec)
    options = ConstructorOptions(
        output_job=args.output_job,
        max_steps=args.max_steps,
        transaction_timeout_ms=args.transaction_timeout_ms,
        lease_session_timeout_ms=args.lease_timeout_ms,
        instance=args.instance,
        lane=args.lane,
    )
    config = spec.kafka.client_config(args.bootstrap_servers, role="constructor")
    require_reachable(config, JobTopics(spec.job).control)  # a secured cluster's refusal, in one line
    registry = role_registry()
    metrics = ConstructorMetrics(registry, args.output_job or spec.job, spec)
    backlog = SourceBacklog(config, JobTopics(spec.job), spec.source_names, metrics, partition=args.lane)
    registry.register(backlog)
    server = serve_metrics(registry, args.metrics_port, f"constructor {args.instance or ''}".strip())
    try:
        stats = DataConstructor(spec, config, options, metrics).run()
    finally:
        if server is not None:
            server.close()
        backlog.close()
    summary = {
        "job": args.output_job or spec.job,
        "lane": args.lane,
        "steps": stats.steps_written,
        "tokens": stats.tokens,
        "samples": stats.samples,
        "packed_steps": stats.packed_steps,
        "finished": stats.finished,
        "takeovers": stats.takeovers,
        "fenced": stats.fenced,
        "seconds": round(stats.seconds, 3),
        "max_state_bytes": stats.max_state_bytes,
    }
    print(json.dumps(summary))
    return 0
