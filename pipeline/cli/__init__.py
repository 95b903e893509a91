"""The `mixflow` command line: one module per top-level sub-command, each describing it as a `Command`."""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import io
import logging
import os
import signal
import sys
from collections.abc import Sequence

from pipeline.cli import (
    autoscale,
    calibrate,
    chaos,
    construct,
    control,
    deploy,
    load,
    plan,
    replay,
    report_plots,
    run,
    spec,
    stack,
    top,
    topics,
)
from pipeline.cli.command import Command, add_commands
from pipeline.kafka.clients import KafkaClientStuckError
from topics.errors import MixflowError

__all__ = ["COMMANDS", "Command", "build_parser", "main"]

# In the order `mixflow --help` lists them.
COMMANDS: tuple[Command, ...] = (
    stack.COMMAND,
    plan.COMMAND,
    calibrate.COMMAND,
    load.COMMAND,
    spec.COMMAND,
    construct.COMMAND,
    control.COMMAND,
    replay.COMMAND,
    run.COMMAND,
    autoscale.COMMAND,
    top.COMMAND,
    topics.COMMAND,
    report_plots.COMMAND,
    chaos.COMMAND,
    deploy.COMMAND,
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


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _dump_stacks_on_sigusr1()
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        return int(args.run(args) or 0)
    except KafkaClientStuckError as exc:
        print(f"mixflow {args.command}: error: {exc}", file=sys.stderr, flush=True)
        os._exit(3)  # a stuck Kafka client would hang the interpreter's exit as well
    except MixflowError as exc:
        print(f"mixflow {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # output piped into `head` and the like, which stopped reading
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing more to flush at exit
        return 0
