"""`mixflow top --spec SPEC`: a live view of a running job, from its topics and its roles' metrics."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from pipeline.cli.arguments import existing_folder, job_name, positive_float


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--spec", type=Path, required=True, help="the job's YAML spec")
    parser.add_argument(
        "--job", type=job_name, help="watch this job instead of the spec's (as `mixflow run --job` named it)"
    )
    parser.add_argument("--bootstrap-servers", help="override the spec's and $KAFKA_BOOTSTRAP_SERVERS")
    parser.add_argument(
        "--run-folder",
        type=existing_folder,
        help="the folder of `mixflow run` whose metrics.json lists the roles' metrics endpoints, for the lead "
        "over the trainer (default: <state dir>/jobs/<job> when it exists)",
    )
    parser.add_argument("--once", action="store_true", help="print one frame and exit")
    parser.add_argument("--json", action="store_true", help="with --once: print the frame as JSON")
    parser.add_argument(
        "--interval", type=positive_float, default=2.0, help="seconds between frames (default: %(default)s)"
    )
    parser.add_argument(
        "--window", type=positive_float, default=10.0, help="seconds the rates are measured over (default: %(default)s)"
    )


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.live import Live

    from pipeline.spec import load_spec
    from pipeline.tools.observe.collector import JobCollector
    from pipeline.tools.observe.frame import build_frame, render_frame
    from pipeline.tools.run.folders import job_folder
    from pipeline.tools.stack.local_broker import default_state_dir
    from topics.errors import MixflowError, NotFoundError
    from topics.formats.names import JobTopics
    from topics.kafka.cluster_probe import job_on_cluster

    if args.json and not args.once:
        msg = "--json prints one frame: give --once with it"
        raise MixflowError(msg)
    spec = load_spec(args.spec)
    config = spec.kafka.client_config(args.bootstrap_servers, role="observer")
    job = args.job or spec.job
    found = job_on_cluster(config, job).require()
    if JobTopics(job).state not in found.topics:
        msg = f"job {job!r} has no state topic {JobTopics(job).state} at {found.servers}"
        raise NotFoundError(msg)
    run_folder = args.run_folder
    if run_folder is None and job_folder(default_state_dir(), job).is_dir():
        run_folder = job_folder(default_state_dir(), job)
    collector = JobCollector(config, spec, job, run_folder, window_s=args.window)
    try:
        if args.once:
            # A first look reads the rank topics from the beginning: give it the time it needs.
            frame = build_frame(collector.collect(budget_s=300.0))
            if args.json:
                print(json.dumps(frame.to_dict(), indent=1))
            else:
                Console(width=160).print(render_frame(frame))
            return 0
        with Live(render_frame(build_frame(collector.collect())), auto_refresh=False) as live:
            while True:
                time.sleep(args.interval)  # the refresh period the user asked for
                live.update(render_frame(build_frame(collector.collect())), refresh=True)
    finally:
        collector.close()
