"""What a module of the `mixflow` command line describes: a sub-command, or a group of them.

A top-level command names the module that implements it (``Command.module``); the module is imported
only when the command is chosen, so that ``mixflow load`` does not load the constructor, the autoscaler
or numba. Such a module defines ``add_arguments(parser)`` and either ``run(args)`` or ``ACTIONS``, its
sub-commands (and ``ACTION_DEST`` where ``args.action`` would not do). It imports at its top what its
arguments need, and inside ``run`` what running needs: ``mixflow load --help`` loads no Kafka client."""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pipeline.cli.arguments import port


def add_metrics_port(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--metrics-port",
        type=port,
        default=0,
        help="serve Prometheus metrics at http://HOST:PORT/metrics; one port per process (0: off, the default)",
    )


def no_arguments(parser: argparse.ArgumentParser) -> None:
    """For a command that takes no arguments of its own."""


@dataclass(frozen=True)
class Command:
    """One sub-command: ``run`` executes it, or ``actions`` are its own sub-commands (``mixflow spec check``),
    chosen by a positional ACTION whose name is stored as ``args.<action_dest>``; or ``module`` names the
    module that defines them (see above)."""

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None] = no_arguments
    run: Callable[[argparse.Namespace], int] | None = None
    actions: Sequence[Command] = ()
    action_dest: str = "action"
    module: str | None = None

    def __post_init__(self) -> None:
        if sum((self.run is not None, bool(self.actions), self.module is not None)) != 1:
            msg = f"command {self.name!r} needs exactly one of run, actions or module"
            raise ValueError(msg)

    def resolved(self) -> Command:
        """This command with its module's arguments and ``run`` or actions; itself when it names no module."""
        if self.module is None:
            return self
        module = importlib.import_module(self.module)
        return Command(
            name=self.name,
            help=self.help,
            add_arguments=getattr(module, "add_arguments", no_arguments),
            run=getattr(module, "run", None),
            actions=getattr(module, "ACTIONS", ()),
            action_dest=getattr(module, "ACTION_DEST", "action"),
        )


class _DeferredParser(argparse.ArgumentParser):
    """A sub-command's parser that gets its arguments when it first parses or prints its help: only the
    chosen command's module is imported."""

    def __init__(self, *args: Any, command: Command | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deferred = command

    def _complete(self) -> None:
        if self._deferred is not None:
            command, self._deferred = self._deferred.resolved(), None
            _add_command_arguments(self, command)

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        self._complete()
        return super().parse_known_args(args, namespace)

    def format_usage(self) -> str:
        self._complete()
        return super().format_usage()

    def format_help(self) -> str:
        self._complete()
        return super().format_help()


def _add_command_arguments(parser: argparse.ArgumentParser, command: Command) -> None:
    command.add_arguments(parser)
    if command.actions:
        add_commands(parser, command.actions, command.action_dest, "ACTION")
    else:
        parser.set_defaults(run=command.run)


def add_commands(parser: argparse.ArgumentParser, commands: Sequence[Command], dest: str, metavar: str) -> None:
    """Give ``parser`` a required sub-command, one of ``commands``, stored as ``args.<dest>``; the chosen
    (innermost) command's ``run`` becomes ``args.run``. A command that names its module gets its arguments
    only when chosen."""
    subparsers = parser.add_subparsers(dest=dest, required=True, metavar=metavar, parser_class=_DeferredParser)
    for command in commands:
        if command.module is not None:
            subparsers.add_parser(command.name, help=command.help, command=command)
        else:
            _add_command_arguments(subparsers.add_parser(command.name, help=command.help), command)
