"""`mixflow run --spec SPEC`: run a whole job here (loaders, constructor, optionally training) and report."""

from __future__ import annotations

import argparse
from pathlib import Path

from pipeline.cli.arguments import job_name, non_negative_int, output_folder, port, share
from pipeline.metrics.endpoints import METRICS_FILE
from pipeline.tools.dead_letters import DEFAULT_ALLOWED_SHARE


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--spec", type=Path, required=True, help="the job's YAML spec")
    parser.add_argument(
        "--job", type=job_name, help="run under this job name instead of the spec's (a fresh set of topics)"
    )
    parser.add_argument("--bootstrap-servers", help="override the spec's and $KAFKA_BOOTSTRAP_SERVERS")
    parser.add_argument(
        "--state-dir",
        type=output_folder,
        default=None,
        help="where the job's logs go, under jobs/<job>/ (default: $MIXFLOW_STATE_DIR or .mixflow)",
    )
    parser.add_argument(
        "--shadows",
        type=non_negative_int,
        default=0,
        help="shadow constructors to run beside the active one, ready to take over (default: %(default)s)",
    )
    parser.add_argument(
        "--trainer",
        metavar="COMMAND",
        help="a training command to run beside the pipeline, e.g. '{python} -m torch.distributed.run "
        "--nproc_per_node 2 examples/train.py --spec {spec} --out {out}'; {spec} is the job's spec and {out} "
        "the folder where its ranks write received-rank<r>.jsonl and trainer-rank<r>.json for the report",
    )
    parser.add_argument(
        "--metrics-port-base",
        type=port,
        default=0,
        help=f"serve Prometheus metrics from every process on ports from this one up: this supervisor's own "
        f"(role restarts) on it, then one per trainer rank ({{metrics_port}} in --trainer: the first, plus the local "
        f"rank), loader and constructor, listed in the job's folder as {METRICS_FILE} (0: off, the default)",
    )
    parser.add_argument(
        "--allow-dead-letters",
        type=share,
        default=DEFAULT_ALLOWED_SHARE,
        metavar="SHARE",
        help="the share of a source's records that may become dead letters (0.05 or 5%%) before the run's verdict "
        "is no and it exits 1 naming the source, its count and top reasons (default: 1%%)",
    )


def run(args: argparse.Namespace) -> int:
    from pipeline.spec import load_spec
    from pipeline.tools.run.exclusive import RunLock, refuse_if_running
    from pipeline.tools.run.job import trainer_command
    from topics.kafka.cluster_probe import cluster_topics

    spec = load_spec(args.spec)
    folder = run_folder(args, spec.job)
    if args.trainer:  # a bad template is refused before anything starts
        trainer_command(args.trainer, args.spec, folder / "train")
    config = spec.kafka.client_config(args.bootstrap_servers, role="operator")
    cluster_topics(config)  # the broker answers: said at once, before any folder or process is made
    refuse_if_running(config, args.job or spec.job)  # on any machine, by its roles' group members
    with RunLock(folder, args.job or spec.job):  # on this machine, from the start: its logs are this run's
        return _run_job(args, config, folder)


def _run_job(args: argparse.Namespace, config: dict, folder: Path) -> int:
    from pipeline.metrics import RunMetrics
    from pipeline.tools.observe.rank_topics import job_report
    from pipeline.tools.run.job import job_spec_file, run_local_job, trainer_command
    from pipeline.tools.run.progress import JobProgress
    from topics.kafka.admin import ensure_job_topics

    train_folder = folder / "train"
    spec, spec_path = job_spec_file(args.spec, args.job, folder)
    metrics = RunMetrics(folder, spec.job, args.metrics_port_base)
    metrics.serve()
    sink_port = metrics.sink_ports(spec.step.ranks) if args.trainer and "{metrics_port}" in args.trainer else 0
    trainer = trainer_command(args.trainer, spec_path, train_folder, sink_port) if args.trainer else None
    print(
        f"job {spec.job}: {len(spec.sources)} sources, {spec.step.ranks} ranks x {spec.step.micro_batches} "
        f"micro-batches x {spec.step.tokens_per_micro_batch} tokens; logs in {folder}"
    )
    if earlier := sorted(path.name for path in folder.glob("*.log")):
        print(f"job {spec.job} ran here before: its role logs are replaced ({', '.join(earlier)})")
    # Created up front (as every role would) so that the progress view can follow the state topic at once.
    ensure_job_topics(config, spec.job, spec.source_names, spec.step.ranks, lanes=spec.constructor.lanes)
    watched = (train_folder, spec.step.ranks, spec.step.micro_batches) if trainer else None
    try:
        with JobProgress(config, spec.job, watched) as progress:
            roles = run_local_job(
                spec_path, args.bootstrap_servers, folder, trainer, progress, shadows=args.shadows, metrics=metrics
            )
    finally:
        metrics.close()
    for role in roles:
        if summary := role.summary():
            print(f"{role.name}: {summary}")
    restarted = [f"{role.name} {role.restarts}" for role in roles if role.restarts]
    print(f"roles restarted after dying: {', '.join(restarted) if restarted else 'none'}")
    report = job_report(
        config, spec, trainer_folder=train_folder if trainer else None, allowed_dead_letters=args.allow_dead_letters
    )
    for line in report.lines():
        print(line)
    return 0 if report.ok else 1


def run_folder(args: argparse.Namespace, spec_job: str) -> Path:
    """Where the job's local files go: ``<state dir>/jobs/<job>/``, for the job ``--job`` names or else the
    spec's (``mixflow top`` looks there)."""
    from pipeline.tools.run.folders import job_folder
    from pipeline.tools.stack.local_broker import default_state_dir

    return job_folder(args.state_dir or default_state_dir(), args.job or spec_job)
