"""Formatting a broker's storage (``kafka-storage format``) with no secret on a command line.

A secured broker's storage is formatted with its SCRAM users (``--add-scram SCRAM-SHA-512=[name=...,password=...]``).
Every user on the machine can read a process's command line in ``/proc``; so the tool's arguments go in a java
argument file (``java @FILE``, which the launcher reads itself), the owner's only, removed once the tool has
run. The JVM runs without its performance-data file (``/tmp/hsperfdata_*``), which would name them too."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path

from pipeline.tools.stack.secure import write_private

STORAGE_TOOL = "kafka.tools.StorageTool"
ARGUMENT_FILE = "format.args"


def format_arguments(cluster_id: str, properties: Path) -> list[str]:
    """The storage tool's main class and arguments that format a node's storage, once (``--ignore-formatted``)."""
    return [STORAGE_TOOL, "format", "--ignore-formatted", "--cluster-id", cluster_id, "--config", str(properties)]


def java_argument_file(arguments: Sequence[str]) -> str:
    """``arguments`` as a java launcher's argument file (``java @FILE``): one per line, each in double quotes,
    a backslash or a double quote in it escaped. A line break cannot be in one."""
    if any("\n" in argument or "\r" in argument for argument in arguments):
        msg = "a java argument file cannot hold an argument with a line break"
        raise ValueError(msg)
    return "".join('"' + argument.replace("\\", "\\\\").replace('"', '\\"') + '"\n' for argument in arguments)


def run_with_argument_file(
    java: str, options: Sequence[str], arguments: Sequence[str], folder: Path
) -> subprocess.CompletedProcess[str]:
    """Run ``java`` with the JVM ``options`` on its command line and the main class and its ``arguments`` in an
    argument file in ``folder`` (mode 0600, removed afterwards); the finished process, its output captured."""
    argument_file = folder / ARGUMENT_FILE
    write_private(argument_file, java_argument_file(arguments))
    command = [java, *options, "-XX:-UsePerfData", f"@{argument_file}"]
    try:
        return subprocess.run(command, capture_output=True, text=True, check=False)
    finally:
        argument_file.unlink(missing_ok=True)
