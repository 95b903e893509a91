"""The `mixflow` command line: one module per top-level sub-command, named in `COMMANDS` and imported only
when that command runs."""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import io
import logging
import signal
import sys
from collections.abc import Sequence

from pipeline.cli.boundary import INTERRUPTED, USAGE, failure_exit, watching_sigint
from pipeline.cli.command import Command, add_commands
from topics.errors import MixflowError

__all__ = ["COMMANDS", "Command", "build_parser", "main"]

# In the order `mixflow --help` lists them; each module is imported only when its command is chosen.
COMMANDS: tuple[Command, ...] = (
    Command(
        "stack",
        "start, stop or inspect the local Kafka broker, or a local cluster of several (no Docker needed)",
        module="pipeline.cli.stack",
    ),
    Command(
        "users",
        "add, remove or list the SCRAM users of a secured cluster, as its admin (passwords from a file or variable)",
        module="pipeline.cli.users",
    ),
    Command(
        "plan",
        "plan one global step from a .npy file of int64 sample lengths (index 0 oldest)",
        module="pipeline.cli.plan",
    ),
    Command(
        "calibrate",
        "time attention and linear layers on this device and print the spec's cost section (alpha, beta, gamma)",
        module="pipeline.cli.calibrate",
    ),
    Command(
        "load", "run one source loader: work units in, tokenized samples out, exactly once", module="pipeline.cli.load"
    ),
    Command("spec", "check a job spec, or print its JSON schema", module="pipeline.cli.spec"),
    Command(
        "construct",
        "run the data constructor: mix, balance and write one batch per rank per step",
        module="pipeline.cli.construct",
    ),
    Command("control", "change a running job: its mixture from a given step on", module="pipeline.cli.control"),
    Command(
        "replay",
        "rebuild steps of a job into another job, under its step shape (an audit) or another number of ranks",
        module="pipeline.cli.replay",
    ),
    Command(
        "run",
        "run every role of a job on this machine until its sources are drained, then report",
        module="pipeline.cli.run",
    ),
    Command(
        "autoscale",
        "run the loader autoscaling policy on a running job and export its decisions as Prometheus gauges",
        module="pipeline.cli.autoscale",
    ),
    Command(
        "top",
        "a live view of a running job: sources' rates, backlog, loaders and shares; the constructor; dead letters",
        module="pipeline.cli.top",
    ),
    Command(
        "topics",
        "the jobs whose topics a cluster holds, and deleting a finished job's topics and consumer groups",
        module="pipeline.cli.topics",
    ),
    Command(
        "report",
        "write PNG plots (shares, imbalance, fill, throughput and backlog) and a Markdown summary of a job",
        module="pipeline.cli.report_plots",
    ),
    Command(
        "chaos",
        "run a whole job while killing its roles, restarting its broker and revoking rights at random, then audit it",
        module="pipeline.cli.chaos",
    ),
    Command("deploy", "Kubernetes manifests of a job", module="pipeline.cli.deploy"),
    Command(
        "objects",
        "put a folder's files into an S3-compatible bucket (the local object store or any endpoint), list a prefix",
        module="pipeline.cli.objects",
    ),
    Command(
        "acl",
        "the Kafka ACLs each role of a job needs: print them, create them or remove them",
        module="pipeline.cli.acl",
    ),
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mixflow", description="Multi-source dataloader for large-model training on Apache Kafka."
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log at debug level")
    add_commands(parser, COMMANDS, dest="command", metavar="COMMAND")
    return parser


def _dump_stacks_on_sigusr1() -> None:
    """`kill -USR1 <pid>` prints every thread's stack, to see where a role waits."""
    with contextlib.suppress(AttributeError, ValueError, io.UnsupportedOperation):  # no SIGUSR1 or no stderr fd
        faulthandler.register(signal.SIGUSR1, file=sys.stderr)


def _command_words(argv: Sequence[str]) -> tuple[str, bool]:
    """The command (for messages, before the arguments are parsed) and whether ``-v`` comes before it."""
    for i, word in enumerate(argv):
        if not word.startswith("-"):
            return word, any(option in ("-v", "--verbose") for option in argv[:i])
    return "", any(option in ("-v", "--verbose") for option in argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; its exit code (see ``pipeline.cli.boundary``). A failure a user can cause is said
    in one line on stderr, with its traceback only under ``-v``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    command, verbose = _command_words(argv)
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # argparse has said why (a usage error), or printed the help
        return 0 if exc.code is None else exc.code if isinstance(exc.code, int) else USAGE
    except MixflowError as exc:  # an argument's type found a file missing
        return failure_exit(command, exc, verbose)
    _dump_stacks_on_sigusr1()
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    with watching_sigint() as interrupted:
        try:
            code = int(args.run(args) or 0)
        except BaseException as exc:  # the boundary: whatever a user can cause becomes one line
            return failure_exit(args.command, exc, args.verbose)
    if interrupted[0] and code == 0:
        print(f"mixflow {args.command}: interrupted (it stopped after its current piece of work)", file=sys.stderr)
        return INTERRUPTED
    return code
