"""`mixflow replay --spec SPEC --from-step K --to-job NAME`: rebuild a job's steps into another job."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pipeline.cli.arguments import job_name, non_negative_int, positive_int

MISMATCH_EXIT = 1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--spec", type=Path, required=True, help="the spec of the job to replay, as it ran")
    parser.add_argument("--from-step", type=non_negative_int, required=True, help="the first step to replay")
    parser.add_argument("--to-job", type=job_name, required=True, help="the job to write the replayed steps into")
    parser.add_argument(
        "--job",
        type=job_name,
        help="the job to replay, if not the spec's (one written with construct --output-job from its sources)",
    )
    parser.add_argument(
        "--to-step",
        type=non_negative_int,
        help="the last step to replay (default: the job's last committed step, and its end)",
    )
    parser.add_argument(
        "--ranks",
        type=positive_int,
        help="data-parallel ranks of the replay (with context parallelism: every rank of the data x context mesh; "
        "default: the job's); another number re-plans each step's samples over them",
    )
    parser.add_argument(
        "--micro-batches",
        type=positive_int,
        help="micro-batches per rank of the replay (default: the job's, or with --ranks enough that every step fits)",
    )
    parser.add_argument(
        "--verify",
        action="store_true",
        help="compare the replayed steps with the originals (byte for byte under the job's shape, sample by sample "
        "under another) and exit 1 at the first difference",
    )
    parser.add_argument("--bootstrap-servers", help="override the spec's and $KAFKA_BOOTSTRAP_SERVERS")
    parser.add_argument(
        "--transaction-timeout-ms",
        type=positive_int,
        default=60_000,
        help="how long an open transaction of a killed replay blocks readers (default: %(default)s)",
    )


def run(args: argparse.Namespace) -> int:
    from pipeline.spec import load_spec
    from pipeline.tools.replay import ReplayRequest, replay, verify
    from topics.kafka.cluster_probe import job_on_cluster

    spec = load_spec(args.spec)
    config = spec.kafka.client_config(args.bootstrap_servers, role="constructor")
    job_on_cluster(config, args.job or spec.job).require()
    request = ReplayRequest(args.to_job, args.from_step, args.to_step, args.ranks, args.micro_batches, args.job)
    done = replay(spec, config, request, args.transaction_timeout_ms)
    summary = done.to_dict()
    status = 0
    if args.verify:
        audit = verify(config, args.job or spec.job, args.to_job, args.from_step, done.mode)
        summary["verify"] = audit.to_dict()
        if audit.mismatch is not None:
            print(f"mixflow replay: mismatch: {audit.mismatch}", file=sys.stderr)
            status = MISMATCH_EXIT
    print(json.dumps(summary))
    return status
