"""benchmarks/refetch_bench.py: the arm that fetches a step's records again by offset writes the bytes and steps of
the arm that holds them, at several windows, reading every byte written a second time; its table's rows."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from benchmarks import refetch_bench as bench
from benchmarks.media_throughput_bench import write_media_data
from topics.formats.names import JobTopics
from topics.kafka.admin import delete_job_topics, ensure_job_topics
from topics.kafka.log_reader import read_to_end

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


def test_the_table_gives_each_arm_and_the_ratio_of_each_repeat() -> None:
    def run(mbs: float) -> dict:
        return {"steps": 9, "mbs": mbs, "cpu_step": 0.1, "max_rss": 2e9, "read_over_written": 1.0}

    held, again = [run(200.0), run(100.0), run(300.0)], [run(100.0), run(90.0), run(60.0)]
    rows = bench.rows_of(8, held, again)
    assert [row[:3] for row in rows] == [["8", "held", "9"], ["8", "re-fetched", "9"]]
    assert rows[0][3] == "200.0 [100.0-300.0]" and rows[1][3] == "90.0 [60.0-100.0]"
    assert rows[1][4] == "0.50"  # the median of 0.5, 0.9 and 0.2
    assert rows[0][6] == "2,000"
