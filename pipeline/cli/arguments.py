"""Argument types of the `mixflow` commands: every count, step, duration, port and path is checked where it
enters, by the parser, so that a bad value is refused before anything starts (argparse says which argument
and exits 2). A folder to read that does not exist is a ``NotFoundError`` (exit 4) instead. (A spec file is
read by the command, which says what is wrong with it, missing or not.)

Nothing here creates, opens or changes a file: an output path is checked for being writable only."""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable
from pathlib import Path

from topics.errors import MixflowError, NotFoundError
from topics.formats.names import validate_job_name

MAX_PORT = 65535


def _number(text: str, kind: type[int] | type[float]) -> int | float:
    try:
        value = kind(text)
    except ValueError:
        what = "a whole number" if kind is int else "a number"
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
    if isinstance(value, float) and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


def _at_least(kind: type[int] | type[float], least: float, above: bool) -> Callable[[str], int | float]:
    def parse(text: str) -> int | float:
        value = _number(text, kind)
        if value < least or (above and value == least):
            relation = "above" if above else "at least"
            raise argparse.ArgumentTypeError(f"must be {relation} {least:g}, not {text}")
        return value

    return parse


positive_int = _at_least(int, 0, True)
"""A count that must be 1 or more (ranks, micro-batches, faults, units)."""
non_negative_int = _at_least(int, 0, False)
"""A step, an instance number, a lane, a count that may be 0."""
positive_float = _at_least(float, 0.0, True)
"""A duration or interval that must be above 0."""
non_negative_float = _at_least(float, 0.0, False)
"""A duration that may be 0 (0: do not wait)."""


def share(text: str) -> float:
    """A share from 0 to 1, given as a fraction (``0.05``) or a percentage (``5%``)."""
    percent = text.strip().endswith("%")
    value = float(_number(text.strip().removesuffix("%"), float)) / (100 if percent else 1)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"a share is 0 to 1 (or 0% to 100%), not {text}")
    return value


def port(text: str) -> int:
    """A TCP port, or 0 for none."""
    value = int(_number(text, int))
    if not 0 <= value <= MAX_PORT:
        raise argparse.ArgumentTypeError(f"a port is 0 to {MAX_PORT}, not {text}")
    return value


def job_name(text: str) -> str:
    """A job name Kafka can hold in a topic name."""
    try:
        return validate_job_name(text)
    except MixflowError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def existing_folder(text: str) -> Path:
    """A folder to read: ``NotFoundError`` when it is not there."""
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a file, not a folder")
    if not path.is_dir():
        raise NotFoundError(f"no folder {text}")
    return path


def output_folder(text: str) -> Path:
    """A folder to write into: an existing, writable folder, or one that can be made (its nearest existing
    ancestor is a writable folder). Nothing is created here."""
    path = Path(text)
    if path.exists():
        if not path.is_dir():
            raise argparse.ArgumentTypeError(f"{text} is a file, not a folder")
        _writable(path, text)
        return path
    _writable(_nearest_existing(path, text), text)
    return path


def output_file(text: str) -> Path:
    """A file to write: not a folder, in an existing, writable folder."""
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a folder; give a file name")
    folder = path.parent
    if not folder.is_dir():
        what = "is a file" if folder.exists() else "does not exist"
        raise argparse.ArgumentTypeError(f"cannot write {text}: {folder} {what}")
    if path.exists() and not os.access(path, os.W_OK):
        raise argparse.ArgumentTypeError(f"cannot write {text}: permission denied")
    _writable(folder, text)
    return path


def _nearest_existing(path: Path, text: str) -> Path:
    for ancestor in path.absolute().parents:
        if ancestor.exists():
            if not ancestor.is_dir():
                raise argparse.ArgumentTypeError(f"cannot make folder {text}: {ancestor} is a file")
            return ancestor
    raise argparse.ArgumentTypeError(f"cannot make folder {text}")  # not even the root exists


def _writable(folder: Path, text: str) -> None:
    if not os.access(folder, os.W_OK | os.X_OK):
        where = "" if str(folder) == text else f" ({folder})"
        raise argparse.ArgumentTypeError(f"cannot write in {text}{where}: permission denied")
