"""`mixflow stack up|down|status`: the local single-node Kafka broker."""

from __future__ import annotations

import argparse
from pathlib import Path

from pipeline.cli.command import Command
from pipeline.stack.local_broker import DEFAULT_HOST, DEFAULT_PORT, LocalBroker, default_state_dir


def _add_state_dir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        help=f"folder for config, data and logs (default: $MIXFLOW_STATE_DIR or {default_state_dir()})",
    )


def _add_up_arguments(parser: argparse.ArgumentParser) -> None:
    _add_state_dir(parser)
    parser.add_argument("--host", default=DEFAULT_HOST, help="address to listen on (default: %(default)s)")
    parser.add_argument(
        "--port",
        type=int,
        default=DEFAULT_PORT,
        help="client port; the KRaft controller uses port + 1 (default: %(default)s)",
    )
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for the broker to answer")


def _up(args: argparse.Namespace) -> int:
    bootstrap = LocalBroker(args.state_dir, host=args.host, port=args.port).up(timeout_s=args.timeout)
    print(bootstrap)
    return 0


def _down(args: argparse.Namespace) -> int:
    stopped = LocalBroker(args.state_dir).down()
    print("stopped" if stopped else "no broker of ours was running")
    return 0


def _status(args: argparse.Namespace) -> int:
    status = LocalBroker(args.state_dir).status()
    print(f"kafka: {status.describe()}")
    return 0 if status.running and status.answering else 1


COMMAND = Command(
    name="stack",
    help="start, stop or inspect the local single-node Kafka broker (no Docker needed)",
    actions=(
        Command(
            name="up",
            help="start the broker unless it runs; print its bootstrap address last",
            add_arguments=_add_up_arguments,
            run=_up,
        ),
        Command(
            name="down",
            help="stop the broker started from this state folder",
            add_arguments=_add_state_dir,
            run=_down,
        ),
        Command(name="status", help="say what runs where", add_arguments=_add_state_dir, run=_status),
    ),
    action_dest="action",
)
