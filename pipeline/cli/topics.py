"""`mixflow topics list` and `mixflow topics delete --job JOB`: the jobs whose topics a cluster holds, and
removing a finished job's topics and consumer groups while the broker runs. On a secured cluster both see only
what the principal may describe; a job whose topics it may not is refused (exit 5), not reported missing."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from pipeline.cli.arguments import job_name
from pipeline.cli.command import Command
from pipeline.spec import BOOTSTRAP_ENV, load_spec
from topics.errors import MixflowError, RefusedError
from topics.kafka.admin import delete_groups, delete_job_topics, job_groups, list_jobs
from topics.kafka.cluster_probe import cluster_topics, job_on_cluster


def _add_cluster_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--spec", type=Path, help="take the Kafka settings (and the job, for delete) from this spec")
    parser.add_argument(
        "--bootstrap-servers", help=f"override the spec's and ${BOOTSTRAP_ENV} (needed when no spec is given)"
    )


def _client_config(args: argparse.Namespace) -> dict[str, Any]:
    """The cluster's client settings, once a broker there has answered."""
    if args.spec is not None:
        config = load_spec(args.spec).kafka.client_config(args.bootstrap_servers, role="operator")
    elif servers := args.bootstrap_servers or os.environ.get(BOOTSTRAP_ENV):
        config = {"bootstrap.servers": servers}
    else:
        msg = f"say which cluster: --spec SPEC, --bootstrap-servers HOST:PORT or ${BOOTSTRAP_ENV}"
        raise MixflowError(msg)
    cluster_topics(config)
    return config


def _list(args: argparse.Namespace) -> int:
    config = _client_config(args)
    jobs = list_jobs(config)
    if not jobs:
        print(f"no mixflow topics at {config['bootstrap.servers']}")
        return 0
    print(f"{'job':<40} {'topics':>7} {'partitions':>11}")
    for job, found in jobs.items():
        print(f"{job:<40} {len(found):>7} {sum(found.values()):>11}")
    return 0


def _add_delete_arguments(parser: argparse.ArgumentParser) -> None:
    _add_cluster_arguments(parser)
    parser.add_argument("--job", type=job_name, help="the job whose topics to delete (default: the spec's)")
    parser.add_argument("--yes", action="store_true", help="delete; without it, only say what would be deleted")
    parser.add_argument("--force", action="store_true", help="delete even while the job's consumer groups have members")


def _delete(args: argparse.Namespace) -> int:
    config = _client_config(args)
    job = args.job or (load_spec(args.spec).job if args.spec is not None else None)
    if not job:
        msg = "say which job: --job NAME or --spec SPEC"
        raise MixflowError(msg)
    servers = config["bootstrap.servers"]
    found = list_jobs(config).get(job, {})
    groups = job_groups(config, job)
    if not found and not groups:
        job_on_cluster(config, job)  # a principal refused to see the job's topics is told so (exit 5)
        print(f"job {job} has no topics or consumer groups at {servers}")
        return 0
    running = {group: members for group, members in groups.items() if members}
    if running and not args.force:
        listed = ", ".join(f"{group} ({members} members)" for group, members in running.items())
        msg = f"job {job} is running at {servers}: {listed}; stop its roles first, or give --force"
        raise RefusedError(msg)
    if not args.yes:
        print(f"would delete from {servers}: {len(found)} topics and {len(groups)} consumer groups of job {job}")
        for name in [*found, *groups]:
            print(f"  {name}")
        print("give --yes to delete them")
        return 0
    deleted = delete_job_topics(config, job)
    # A group with members cannot be deleted (only with --force does one get here); its offsets go with
    # the topics they were committed for.
    gone = delete_groups(config, [group for group in groups if group not in running])
    print(f"deleted from {servers}: {len(deleted)} topics and {len(gone)} consumer groups of job {job}")
    return 0


ACTIONS = (
    Command(
        name="list",
        help="every job with mixflow topics: topics and partitions",
        add_arguments=_add_cluster_arguments,
        run=_list,
    ),
    Command(
        name="delete",
        help="delete one job's topics and consumer groups (a dry run without --yes)",
        add_arguments=_add_delete_arguments,
        run=_delete,
    ),
)
