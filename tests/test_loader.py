"""The source loader role against the real broker: exactly once under SIGKILL, shared units, DLQ."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.spec import load_spec
from tests.loader_support import (
    SOURCES,
    build_example_data,
    committed_sample_ids,
    dead_letters,
    expected_sample_ids,
    source_topic_growth,
    start_loader,
    wait_all,
    wait_all_restarting,
    write_spec,
)
from topics.formats.names import JobTopics

LOADERS_PER_SOURCE = 2
KILLS = 4


@pytest.fixture(scope="module")
def example_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_example_data(tmp_path_factory.mktemp("example") / "data", limit=60)


def _assert_exactly_once(bootstrap: str, spec_path: Path) -> dict[str, int]:
    spec = load_spec(spec_path)
    topics = JobTopics(spec.job)
    counts = {}
    for source in SOURCES:
        got = Counter(committed_sample_ids(bootstrap, topics, source))
        duplicates = {i: n for i, n in got.items() if n > 1}
        assert not duplicates, f"{source}: {len(duplicates)} ids delivered more than once, e.g. {list(duplicates)[:3]}"
        expected = expected_sample_ids(spec, bootstrap, source)
        missing, unexpected = sorted(set(expected) - set(got)), sorted(set(got) - set(expected))
        assert not missing and not unexpected, f"{source}: missing {missing[:3]}, unexpected {unexpected[:3]}"
        counts[source] = len(got)
    return counts


def test_every_sample_arrives_exactly_once_while_loaders_are_killed(
    kafka_bootstrap: str, unique_name: str, example_data: Path, tmp_path: Path
) -> None:
    spec = write_spec(tmp_path, unique_name, kafka_bootstrap, example_data, epochs=2)
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    print(f"kill schedule seed {seed}")
    unit = ("--unit-seconds", "0.01")  # many small units, so kills land mid-source
    running = {
        (source, i): start_loader(spec, source, i, tmp_path, *unit)
        for source in SOURCES
        for i in range(LOADERS_PER_SOURCE)
    }
    topics = JobTopics(unique_name)
    growth = source_topic_growth(kafka_bootstrap, topics)
    kills = 0

    def any_running() -> bool:
        return any(p.poll() is None for p in running.values())

    while kills < KILLS and any_running():
        # Kill once the source topics have grown by a random amount: a moment mid-unit, not a fixed delay.
        # The sources hold about 2,700 records, so every kill lands before they are drained.
        growth.wait_for(growth.records() + rng.randint(1, 200), any_running, timeout_s=120)
        alive = sorted(key for key, p in running.items() if p.poll() is None)
        if not alive:
            break
        victim = alive[rng.randrange(len(alive))]
        running[victim].send_signal(signal.SIGKILL)
        running[victim].wait(timeout=30)
        kills += 1
        running[victim] = start_loader(spec, *victim, tmp_path, *unit)
    # A loader may also exit for a successor (a fatal producer error after a rebalance): started again.
    wait_all_restarting(running, lambda key: start_loader(spec, *key, tmp_path, *unit), 240, tmp_path)
    growth.close()

    assert kills >= 1, "no loader was killed: the sources finished before the first kill"
    counts = _assert_exactly_once(kafka_bootstrap, spec)
    assert all(counts.values()), counts
    code_ids = committed_sample_ids(kafka_bootstrap, topics, "code")
    assert any(i.endswith("@e1") for i in code_ids) and not any("@e2" in i for i in code_ids)


def test_loaders_of_one_source_share_its_units(
    kafka_bootstrap: str, unique_name: str, example_data: Path, tmp_path: Path
) -> None:
    spec = write_spec(tmp_path, unique_name, kafka_bootstrap, example_data)
    # The first loader leaves the group after 1 unit; the second, started once the first has left, must
    # take the rest from the group's committed offsets. (Started together, either one can finish every
    # unit before the other's join completes; the concurrent case is the kill test's, two loaders a source.)
    # Units are sized by a timed measurement of the tokenizer: the plan holds 3 to 5 of them on this data,
    # so only the first unit is sure to leave some for the second loader.
    first = start_loader(spec, "docstrings", 0, tmp_path, "--unit-seconds", "0.01", "--max-units", "1")
    wait_all([first], timeout_s=120, log_dir=tmp_path)
    second = start_loader(spec, "docstrings", 1, tmp_path)
    wait_all([second], timeout_s=120, log_dir=tmp_path)
    summaries = [json.loads(p.read_text().strip().splitlines()[-1]) for p in sorted(tmp_path.glob("loader-*.log"))]
    assert summaries[0]["units"] == 1 and summaries[1]["units"] > 0, summaries
    got = committed_sample_ids(kafka_bootstrap, JobTopics(unique_name), "docstrings")
    assert len(got) == len(set(got)) == sum(s["samples"] for s in summaries)


def test_bad_records_go_to_the_dead_letter_topic_and_the_rest_arrives(
    kafka_bootstrap: str, unique_name: str, example_data: Path, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    (data / "code").mkdir(parents=True)
    (data / "docstrings").mkdir()
    (data / "topics").mkdir()
    good = pa.table({"path": ["a.py", "b.py"], "text": ["print('a')", "print('b')"]})
    pq.write_table(good, data / "code" / "good.parquet")
    whole = (data / "code" / "good.parquet").read_bytes()
    (data / "code" / "corrupt.parquet").write_bytes(whole[: len(whole) // 2])
    (data / "docstrings" / "d.jsonl").write_text(
        '{"text": "first"}\n{not json\n{"other": "no text field"}\n{"text": "last"}\n'
    )
    (data / "topics" / "good.txt").write_text("a topic page")
    (data / "topics" / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    (data / "tokenizer.json").write_bytes((example_data / "tokenizer.json").read_bytes())
    spec = write_spec(tmp_path, unique_name, kafka_bootstrap, data)

    loaders = [start_loader(spec, source, 0, tmp_path) for source in SOURCES]
    wait_all(loaders, timeout_s=120, log_dir=tmp_path)

    topics = JobTopics(unique_name)
    code = sorted(committed_sample_ids(kafka_bootstrap, topics, "code"))
    assert code == ["code/good.parquet/0", "code/good.parquet/1"]
    docs = committed_sample_ids(kafka_bootstrap, topics, "docstrings")
    assert docs == ["docstrings/d.jsonl/0", "docstrings/d.jsonl/3"]
    assert committed_sample_ids(kafka_bootstrap, topics, "topics") == ["topics/good.txt/0"]
    letters = {(d.source, d.location): d.reason for d in dead_letters(kafka_bootstrap, topics)}
    assert set(letters) == {
        ("code", "corrupt.parquet"),
        ("docstrings", "d.jsonl:row=1"),
        ("docstrings", "d.jsonl:row=2"),
        ("topics", "latin1.txt"),
    }, letters
    assert all(reason for reason in letters.values())


def test_a_missing_source_path_is_a_clear_error_at_start_up(
    kafka_bootstrap: str, unique_name: str, example_data: Path, tmp_path: Path
) -> None:
    spec = write_spec(tmp_path, unique_name, kafka_bootstrap, tmp_path / "nowhere")
    command = [sys.executable, "-m", "pipeline.cli", "load", "--spec", str(spec), "--source", "code"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 4
    assert "nowhere" in result.stderr and "does not exist" in result.stderr


def test_sigterm_finishes_the_current_units_and_leaves_the_rest_to_others(
    kafka_bootstrap: str, unique_name: str, example_data: Path, tmp_path: Path
) -> None:
    spec = write_spec(tmp_path, unique_name, kafka_bootstrap, example_data, epochs=3)
    first = start_loader(spec, "code", 0, tmp_path, "--unit-seconds", "0.01")
    growth = source_topic_growth(kafka_bootstrap, JobTopics(unique_name))
    growth.wait_for(20, lambda: first.poll() is None, timeout_s=120)
    growth.close()
    assert first.poll() is None, "the loader finished before it could be sent SIGTERM"
    first.send_signal(signal.SIGTERM)
    assert first.wait(timeout=60) == 0, "SIGTERM did not stop the loader cleanly"
    summary = json.loads((tmp_path / "loader-code-0.log").read_text().strip().splitlines()[-1])
    assert summary["units"] > 0

    second = start_loader(spec, "code", 1, tmp_path)
    wait_all([second], timeout_s=120, log_dir=tmp_path)
    got = Counter(committed_sample_ids(kafka_bootstrap, JobTopics(unique_name), "code"))
    assert max(got.values()) == 1
    assert set(got) == set(expected_sample_ids(load_spec(spec), kafka_bootstrap, "code"))
