"""What a module of the `mixflow` command line describes: a sub-command, or a group of them."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass


def add_metrics_port(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=0,
        help="serve Prometheus metrics at http://HOST:PORT/metrics; one port per process (0: off, the default)",
    )


def no_arguments(parser: argparse.ArgumentParser) -> None:
    """For a command that takes no arguments of its own."""


@dataclass(frozen=True)
class Command:
    """One sub-command: ``run`` executes it, or ``actions`` are its own sub-commands (``mixflow spec check``),
    chosen by a positional ACTION whose name is stored as ``args.<action_dest>``."""

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None] = no_arguments
    run: Callable[[argparse.Namespace], int] | None = None
    actions: Sequence[Command] = ()
    action_dest: str = "action"

    def __post_init__(self) -> None:
        if (self.run is None) == (not self.actions):
            msg = f"command {self.name!r} needs either run or actions"
            raise ValueError(msg)


def add_commands(parser: argparse.ArgumentParser, commands: Sequence[Command], dest: str, metavar: str) -> None:
    """Give ``parser`` a required sub-command, one of ``commands``, stored as ``args.<dest>``; the chosen
    (innermost) command's ``run`` becomes ``args.run``."""
    subparsers = parser.add_subparsers(dest=dest, required=True, metavar=metavar)
    for command in commands:
        sub = subparsers.add_parser(command.name, help=command.help)
        command.add_arguments(sub)
        if command.actions:
            add_commands(sub, command.actions, command.action_dest, "ACTION")
        else:
            sub.set_defaults(run=command.run)
