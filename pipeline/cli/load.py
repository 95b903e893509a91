"""`mixflow load --spec SPEC --source NAME`: run one source loader process."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from pipeline.cli.arguments import non_negative_int, positive_float, positive_int
from pipeline.cli.command import add_metrics_port
from pipeline.roles.loader.defaults import SESSION_TIMEOUT_MS, TARGET_UNIT_SECONDS
from topics.kafka.group_membership import DEFAULT_REJOIN_AFTER_S


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--spec", type=Path, required=True, help="the job's YAML spec")
    parser.add_argument("--source", required=True, help="the source this loader reads")
    parser.add_argument(
        "--instance",
        type=non_negative_int,
        default=0,
        help="this loader's number among the source's loaders; a restart with the same number takes "
        "over at once from a dead predecessor (default: %(default)s)",
    )
    parser.add_argument(
        "--until-drained",
        action="store_true",
        help="exit once every work unit of the source is done (default: keep waiting for units, saying so while "
        "every unit is done)",
    )
    parser.add_argument("--bootstrap-servers", help="override the spec's and $KAFKA_BOOTSTRAP_SERVERS")
    add_metrics_port(parser)
    parser.add_argument(
        "--transaction-timeout-ms",
        type=positive_int,
        default=60_000,
        help="how long an open transaction of a dead loader blocks readers (default: %(default)s)",
    )
    parser.add_argument(
        "--session-timeout-ms",
        type=positive_int,
        default=SESSION_TIMEOUT_MS,
        help="how long a dead loader keeps its units from the others: its session in the source's group, above "
        "1000 and the brokers' group.min.session.timeout.ms (default: %(default)s)",
    )
    parser.add_argument(
        "--unit-seconds",
        type=positive_float,
        default=TARGET_UNIT_SECONDS,
        help="when this loader plans the source: seconds of work per unit (default: %(default)s)",
    )
    parser.add_argument(
        "--rejoin-after-s",
        type=positive_float,
        default=DEFAULT_REJOIN_AFTER_S,
        help="replace the consumer when the source's group has left this loader without an assignment this "
        "long while the brokers answer (a librdkafka consumer can fail to rejoin after a broker restart) "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--max-units",
        type=positive_int,
        help="leave the group after this many units, e.g. to scale down (default: none)",
    )


def run(args: argparse.Namespace) -> int:
    from pipeline.metrics import role_registry, serve_metrics
    from pipeline.roles.loader.metrics import LoaderMetrics, WorkUnitLag
    from pipeline.roles.loader.role import LoaderOptions, SourceLoader
    from pipeline.roles.loader.source_runtime import SourceRuntime
    from pipeline.spec import OnExhausted, load_spec
    from topics.errors import NotFoundError
    from topics.formats.names import JobTopics
    from topics.kafka.admin import ensure_loader_topics
    from topics.kafka.cluster_probe import require_reachable

    spec = load_spec(args.spec)
    if args.source not in spec.source_names:
        msg = f"no source {args.source!r} in {args.spec} (sources: {', '.join(spec.source_names)})"
        raise NotFoundError(msg)
    config = spec.kafka.client_config(args.bootstrap_servers, role="loader", source=args.source)
    runtime = SourceRuntime.from_spec(spec, args.source)
    topics = JobTopics(spec.job)
    require_reachable(config, topics.control)  # a secured cluster's refusal, in one line
    registry = role_registry()
    metrics = LoaderMetrics(registry, spec.job, args.source)
    lag = WorkUnitLag(config, topics, args.source)
    registry.register(lag)
    server = serve_metrics(registry, args.metrics_port, f"loader {args.source} {args.instance}")
    ensure_loader_topics(config, spec.job, args.source, lanes=spec.constructor.lanes)
    options = LoaderOptions(
        instance=args.instance,
        until_drained=args.until_drained,
        transaction_timeout_ms=args.transaction_timeout_ms,
        session_timeout_ms=args.session_timeout_ms,
        unit_seconds=args.unit_seconds,
        max_units=args.max_units,
        rejoin_after_s=args.rejoin_after_s,
        # Under next_epoch the job streams on: the loaders stay to plan and load the epochs asked for.
        next_epoch=spec.on_exhausted is OnExhausted.NEXT_EPOCH,
    )
    try:
        stats = SourceLoader(config, topics, runtime, spec.seed, options, metrics).run()
    finally:
        if server is not None:
            server.close()
        lag.close()
    summary = {
        "source": args.source,
        "instance": args.instance,
        "units": stats.units,
        "samples": stats.samples,
        "tokens": stats.tokens,
        "dead_letters": stats.dead_letters,
        "aborted": stats.aborted,
        "rejoins": stats.rejoins,
        "seconds": round(stats.seconds, 3),
        "busy_seconds": round(stats.busy_seconds, 3),
        "tokens_per_second": round(stats.tokens_per_second()),
    }
    print(json.dumps(summary))
    return 0
