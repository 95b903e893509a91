"""`mixflow stack object-store up|down|status|restart|pause|resume`, and the object store's part of `mixflow
stack up --object-store`, `stack down` and `stack status`: the local S3-compatible object store (Versity S3
Gateway over a folder, ``pipeline/tools/stack/object_store.py``)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from pipeline.cli.arguments import output_folder, port, positive_float
from pipeline.cli.command import Command
from pipeline.tools.stack.object_store import DEFAULT_PORT, LocalObjectStore, default_object_store_dir


def object_store_dir(stack_state_dir: Path | None) -> Path:
    """The object store's folder beside a stack: ``$MIXFLOW_OBJECT_STORE_DIR``, else ``object-store/`` in the
    stack's state folder (the default one when not named)."""
    if stack_state_dir is None or os.environ.get("MIXFLOW_OBJECT_STORE_DIR"):
        return default_object_store_dir()
    return stack_state_dir.absolute() / "object-store"


def add_object_store_port(parser: argparse.ArgumentParser, flag: str = "--object-store-port") -> None:
    parser.add_argument(
        flag,
        dest="object_store_port",
        type=port,
        default=None,
        help=f"the object store's HTTP port (default: {DEFAULT_PORT}, or what its folder recorded)",
    )


def start_line(store: LocalObjectStore, timeout_s: float | None) -> str:
    """Start the store unless it runs; say where it answers and where its keys are (never the keys)."""
    endpoint = store.start() if timeout_s is None else store.start(timeout_s)
    return f"object store: {endpoint}; credentials {store.credentials_file}; env {store.env_file}"


def stop_line(store: LocalObjectStore) -> str | None:
    """Stop the store when one of ours runs; a line saying so, or None when none ran."""
    return "object store stopped" if store.stop() else None


def _store(args: argparse.Namespace) -> LocalObjectStore:
    return LocalObjectStore(args.state_dir or default_object_store_dir(), port=getattr(args, "object_store_port", None))


def _add_state_dir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--state-dir",
        type=output_folder,
        default=None,
        help=f"the object store's folder: data, keys, logs (default: $MIXFLOW_OBJECT_STORE_DIR or "
        f"{default_object_store_dir()})",
    )


def _add_up_arguments(parser: argparse.ArgumentParser) -> None:
    _add_state_dir(parser)
    add_object_store_port(parser, "--port")
    parser.add_argument("--timeout", type=positive_float, default=None, help="seconds to wait for it to answer")


def _up(args: argparse.Namespace) -> int:
    print(start_line(_store(args), args.timeout))
    return 0


def _down(args: argparse.Namespace) -> int:
    print(stop_line(_store(args)) or "no object store of ours was running")
    return 0


def _status(args: argparse.Namespace) -> int:
    status = _store(args).status()
    print(f"object store: {status.describe()}")
    return 0 if status.running and status.answering else 1


def _restart(args: argparse.Namespace) -> int:
    store = _store(args)
    endpoint = store.restart(**({} if args.timeout is None else {"timeout_s": args.timeout}), kill=args.kill)
    print(f"object store restarted: {endpoint}")
    return 0


def _add_restart_arguments(parser: argparse.ArgumentParser) -> None:
    _add_up_arguments(parser)
    parser.add_argument("--kill", action="store_true", help="SIGKILL, as a crash would, instead of a clean stop")


def _pause(args: argparse.Namespace) -> int:
    print("object store paused (SIGSTOP)" if _store(args).pause() else "no object store of ours is running")
    return 0


def _resume(args: argparse.Namespace) -> int:
    print("object store resumed" if _store(args).resume() else "no object store of ours is running")
    return 0


OBJECT_STORE_ACTIONS = (
    Command(name="up", help="start the object store unless it runs", add_arguments=_add_up_arguments, run=_up),
    Command(name="down", help="stop the object store", add_arguments=_add_state_dir, run=_down),
    Command(name="status", help="say whether it runs and answers", add_arguments=_add_state_dir, run=_status),
    Command(
        name="restart",
        help="stop (or --kill) and start it again, same port, data and keys (a fault)",
        add_arguments=_add_restart_arguments,
        run=_restart,
    ),
    Command(
        name="pause",
        help="SIGSTOP it: requests hang and time out until `resume` (a fault)",
        add_arguments=_add_state_dir,
        run=_pause,
    ),
    Command(name="resume", help="SIGCONT a paused object store", add_arguments=_add_state_dir, run=_resume),
)

OBJECT_STORE = Command(
    name="object-store",
    help="the local S3-compatible object store alone: up, down, status, and faults (restart, pause, resume)",
    actions=OBJECT_STORE_ACTIONS,
    action_dest="object_store_action",
)
