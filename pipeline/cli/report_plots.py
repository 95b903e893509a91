"""`mixflow report --spec SPEC --out DIR`: PNG plots and a Markdown summary of a job, from its topics."""

from __future__ import annotations

import argparse
from pathlib import Path

from pipeline.cli.arguments import job_name, output_folder


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--spec", type=Path, required=True, help="the job's YAML spec")
    parser.add_argument(
        "--out",
        type=output_folder,
        required=True,
        help="folder for the PNG plots and report.md (a folder holding another job's report is refused)",
    )
    parser.add_argument(
        "--job", type=job_name, help="report on this job instead of the spec's (as `mixflow run --job` named it)"
    )
    parser.add_argument("--bootstrap-servers", help="override the spec's and $KAFKA_BOOTSTRAP_SERVERS")


def run(args: argparse.Namespace) -> int:
    from pipeline.spec import load_spec
    from topics.errors import NotFoundError
    from topics.formats.names import JobTopics
    from topics.kafka.cluster_probe import job_on_cluster

    spec = load_spec(args.spec)
    config = spec.kafka.client_config(args.bootstrap_servers, role="observer")
    job = args.job or spec.job
    found = job_on_cluster(config, job).require()
    if JobTopics(job).state not in found.topics:
        msg = f"job {job!r} has no state topic {JobTopics(job).state} at {found.servers}: no step written"
        raise NotFoundError(msg)
    from pipeline.tools.observe.report import write_report  # matplotlib loads only for this command

    summary = write_report(config, spec, args.out, job)
    print(f"report of job {job}: {summary} and the plots beside it")
    return 0
