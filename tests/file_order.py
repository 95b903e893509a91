"""Longest test files first: pytest-xdist (``--dist loadfile``) hands a worker one file at a time in the order
of the collection (with ``--no-loadscope-reorder``), so a long file handed out last keeps one worker busy after
the others are done. ``tests/file_seconds.json`` holds each file's measured seconds (setup, call and teardown
summed); a file not in it counts as the median file. ``--record-file-seconds PATH`` writes the run's figures."""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from pathlib import Path

import pytest

SECONDS_FILE = Path(__file__).with_name("file_seconds.json")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--record-file-seconds",
        metavar="PATH",
        help="write each test file's seconds (setup, call and teardown summed) to PATH as JSON",
    )


def file_of(nodeid: str) -> str:
    """The test file's name (``test_x.py``) of a test's node id."""
    return Path(nodeid.split("::", 1)[0]).name


def longest_first(items: list[pytest.Item], seconds: dict[str, float]) -> list[pytest.Item]:
    """``items`` with the files in order of their seconds, longest first; a file's tests keep their order."""
    typical = statistics.median(seconds.values()) if seconds else 0.0
    files = list(dict.fromkeys(file_of(item.nodeid) for item in items))
    rank = {name: (-seconds.get(name, typical), position) for position, name in enumerate(files)}
    return sorted(items, key=lambda item: rank[file_of(item.nodeid)])


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    seconds = json.loads(SECONDS_FILE.read_text()) if SECONDS_FILE.exists() else {}
    items[:] = longest_first(items, seconds)


class Recorder:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.seconds: defaultdict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[file_of(report.nodeid)] += report.duration

    def pytest_sessionfinish(self) -> None:
        figures = {name: round(total) for name, total in sorted(self.seconds.items())}
        self.path.write_text(json.dumps(figures, indent=1) + "\n")


def pytest_configure(config: pytest.Config) -> None:
    # On an xdist worker the reports reach the controller too: record there only.
    if (path := config.getoption("--record-file-seconds")) and not hasattr(config, "workerinput"):
        config.pluginmanager.register(Recorder(Path(path)), "file-seconds-recorder")
