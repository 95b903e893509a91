"""benchmarks/refetch_bench.py: the arm that fetches a step's records again by offset writes the bytes, steps and
source offsets of the arm that holds them, at every window, reading every byte twice; a tiny run prints both arms."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks import refetch_bench as bench
from benchmarks.media_throughput_bench import write_media_data
from topics.formats.names import JobTopics
from topics.kafka.admin import delete_job_topics, ensure_job_topics
from topics.kafka.log_reader import read_to_end

REPO = Path(__file__).resolve().parent.parent
RANKS = 2


@pytest.fixture(scope="module")
def data(kafka_bootstrap: str) -> Iterator[tuple[dict, str]]:
    config = {"bootstrap.servers": kafka_bootstrap}
    job = "refetch-test-data"
    delete_job_topics(config, job)
    write_media_data(config, job, 240, [0.05], 2048, seed=3)
    yield config, job
    delete_job_topics(config, job)


def _written(config: dict, job: str) -> list[list[bytes]]:
    return [[m.value() for m in read_to_end(config, JobTopics(job).rank(r))] for r in range(RANKS)]


@pytest.mark.parametrize("window", [0, 3])
def test_fetching_again_writes_what_holding_writes(data: tuple[dict, str], window: int) -> None:
    config, job = data
    written = {}
    for refetch in (False, True):
        out = f"{job}-out-{window}-{int(refetch)}"
        ensure_job_topics(config, out, ["out"], RANKS, timeout_s=60)
        try:
            result = bench.run_arm(config, job, out, RANKS, 400_000, window, refetch)
            written[refetch] = (_written(config, out), result)
        finally:
            delete_job_topics(config, out)
    (held, held_result), (again, again_result) = written[False], written[True]
    assert held == again and len(held[0]) > window + 2
    assert all(len(value) == 200_000 for rank in held for value in rank)
    assert again_result["steps"] == held_result["steps"]
    # the second read is of every step written, whole records: at least the bytes written
    assert held_result["read_over_written"] > 1.0
    assert again_result["read_over_written"] - held_result["read_over_written"] >= 1.0


def test_a_tiny_run_prints_both_arms(data: tuple[dict, str], kafka_bootstrap: str) -> None:
    _, job = data
    command = [sys.executable, "-m", "benchmarks.refetch_bench", "--data-job", job, "--keep-data", "--step-mb", "0.4"]
    command += [
        "--ranks",
        "2",
        "--windows",
        "0,2",
        "--repeats",
        "1",
        "--markdown",
        "--bootstrap-servers",
        kafka_bootstrap,
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=240, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [re.split(r"\s*\|\s*", line)[1:-1] for line in done.stdout.splitlines() if re.match(r"\| \d", line)]
    assert [(row[0], row[1]) for row in rows] == [
        ("0", "held"),
        ("0", "re-fetched"),
        ("2", "held"),
        ("2", "re-fetched"),
    ]
    assert all(float(row[3].split()[0]) > 0 for row in rows), rows
