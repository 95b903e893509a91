"""The data constructor against the real broker: determinism, exactly once under SIGKILL, curriculum,
and what happens when a source runs out under each policy."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest
import yaml
from confluent_kafka import Producer

from pipeline.kafka.work_plan import publish_work_plan
from pipeline.planning.mixing import Schedule
from pipeline.spec import load_spec
from tests.kafka_support import TopicGrowth
from tests.loader_support import (
    REPO,
    SOURCES,
    build_example_data,
    committed_sample_ids,
    load_sources,
    start_constructor,
    write_spec,
)
from topics.formats.batch import Batch
from topics.formats.batch_codec import decode_batch_message, end_of_data_steps
from topics.formats.dead_letter import decode_dead_letter_message
from topics.formats.names import JobTopics
from topics.formats.sample import Sample
from topics.formats.sample_codec import encode_sample
from topics.kafka.admin import ensure_job_topics
from topics.kafka.log_reader import read_to_end

RANKS = 2
KILLS = 4


@pytest.fixture(scope="module")
def loaded_job(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """A job whose three source topics are loaded, once for the whole module: (job name, data folder)."""
    folder = tmp_path_factory.mktemp("constructor")
    data = build_example_data(folder / "data", limit=40)
    job = f"c{random.randrange(16**8):08x}"
    spec = write_spec(folder, job, kafka_bootstrap, data, on_exhausted="renormalize")
    load_sources(spec, folder)
    return job, data


@pytest.fixture(scope="module")
def reference(
    kafka_bootstrap: str, loaded_job: tuple[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, dict]:
    """The loaded job constructed once, without interruption, under the default spec (one step a
    transaction), for the tests that compare another run with it: (output job, its summary)."""
    spec = _spec(tmp_path_factory.mktemp("reference"), kafka_bootstrap, loaded_job)
    output_job = f"{loaded_job[0]}-ref"
    return output_job, _run(spec, output_job)


def _spec(tmp_path: Path, bootstrap: str, loaded: tuple[str, Path], **overrides: object) -> Path:
    job, data = loaded
    return write_spec(tmp_path, job, bootstrap, data, **{"on_exhausted": "renormalize", **overrides})


def _run(spec: Path, output_job: str, *extra: str) -> dict:
    process = start_constructor(spec, output_job, *extra)
    out, err = process.communicate(timeout=240)
    assert process.returncode == 0, err.decode()[-3000:]
    return json.loads(out.decode().strip().splitlines()[-1])


class RankRecord(NamedTuple):
    """One record of a rank topic, as the broker holds it."""

    key: bytes | None
    value: bytes
    headers: tuple[tuple[str, bytes], ...]


@dataclass(frozen=True)
class Written:
    """What a constructor wrote to a job's rank topics."""

    records: list[list[RankRecord]]  # per rank, every record in offset order, the end-of-data record included
    steps: list[list[Batch]]  # per step, per rank: the decoded batch

    def sample_ids(self) -> list[str]:
        return [i for step in self.steps for batch in step for i in batch.sample_ids]


def _written(bootstrap: str, job: str) -> Written:
    """The rank topics of ``job``: their records as bytes, and per step and rank the decoded batch."""
    topics = JobTopics(job)
    records, per_rank = [], []
    for r in range(RANKS):
        messages = read_to_end({"bootstrap.servers": bootstrap}, topics.rank(r))
        records.append([RankRecord(m.key(), m.value(), tuple(m.headers() or ())) for m in messages])
        ends = [i for i, m in enumerate(messages) if end_of_data_steps(m.headers()) is not None]
        # A finished job closes each rank topic with one end-of-data record, after its last step.
        assert ends in ([], [len(messages) - 1]), f"end-of-data records at {ends} of {len(messages)}"
        if ends:
            assert end_of_data_steps(messages[-1].headers()) == len(messages) - 1
            messages = messages[:-1]
        per_rank.append([decode_batch_message(m) for m in messages])
    assert len({len(batches) for batches in per_rank}) == 1, "ranks hold different numbers of steps"
    for batches in per_rank:
        assert [b.step for b in batches] == list(range(len(batches))), "steps missing, repeated or out of order"
    return Written(records, [list(step) for step in zip(*per_rank, strict=True)])


def _assert_identical(got: Written, expected: Written) -> None:
    """Byte for byte: every record of every rank topic has the same key, value and headers. Sample ids
    are compared first, step by step, so that a different draw fails naming its step and rank."""
    for k, (got_step, expected_step) in enumerate(zip(got.steps, expected.steps, strict=False)):
        for r, (g, e) in enumerate(zip(got_step, expected_step, strict=True)):
            assert g.sample_ids == e.sample_ids, f"step {k} rank {r}: other samples"
    assert len(got.steps) == len(expected.steps), f"{len(got.steps)} steps written, {len(expected.steps)} expected"
    for r, (got_rank, expected_rank) in enumerate(zip(got.records, expected.records, strict=True)):
        assert len(got_rank) == len(expected_rank), f"rank {r}: {len(got_rank)} records, {len(expected_rank)} expected"
        for i, (g, e) in enumerate(zip(got_rank, expected_rank, strict=True)):
            assert g.key == e.key, f"rank {r} record {i}: key {g.key!r}, expected {e.key!r}"
            assert g.headers == e.headers, f"rank {r} record {i}: headers {g.headers}, expected {e.headers}"
            assert g.value == e.value, f"rank {r} record {i}: the value bytes differ ({len(g.value)} vs {len(e.value)})"
    assert got.records == expected.records


def test_two_constructors_over_the_same_sources_write_identical_batches(
    kafka_bootstrap: str,
    loaded_job: tuple[str, Path],
    reference: tuple[str, dict],
    tmp_path: Path,
    unique_name: str,
) -> None:
    first_job, first = reference
    spec = _spec(tmp_path, kafka_bootstrap, loaded_job)
    second = _run(spec, unique_name)
    assert first["finished"] and second["finished"]
    a, b = _written(kafka_bootstrap, first_job), _written(kafka_bootstrap, unique_name)
    assert len(a.steps) == first["steps"] > 10
    _assert_identical(a, b)


@pytest.mark.parametrize("per_transaction", [1, 3], ids=["step-per-transaction", "3-steps-per-transaction"])
def test_every_sample_is_delivered_exactly_once_while_the_constructor_is_killed(
    kafka_bootstrap: str,
    loaded_job: tuple[str, Path],
    reference: tuple[str, dict],
    tmp_path: Path,
    unique_name: str,
    per_transaction: int,
) -> None:
    # The reference is written one step a transaction.
    # Groups of steps a transaction must write the same bytes, and resume after the last committed group.
    spec = _spec(tmp_path, kafka_bootstrap, loaded_job, constructor={"steps_per_transaction": per_transaction})
    killed = f"{unique_name}-kill"
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    print(f"kill schedule seed {seed}")
    log = tmp_path / "constructor.log"
    growth = TopicGrowth(kafka_bootstrap, [JobTopics(killed).state])
    kills = 0
    process = start_constructor(spec, killed, log=log)
    try:
        while kills < KILLS and process.poll() is None:
            # Kill once the state topic has grown by a random number of records: mid-step, at a random moment.
            growth.wait_for(growth.records() + rng.randint(1, 30), lambda p=process: p.poll() is None, timeout_s=120)
            if process.poll() is not None:
                break
            process.send_signal(signal.SIGKILL)
            process.wait(timeout=30)
            kills += 1
            process = start_constructor(spec, killed, log=log)
        assert process.wait(timeout=240) == 0, log.read_text()[-3000:]
    finally:
        if process.poll() is None:
            process.kill()
        growth.close()
    assert kills >= 1, "the constructor finished before the first kill"

    # The killed and restarted constructor must have written what an uninterrupted one wrote.
    got, expected = _written(kafka_bootstrap, killed), _written(kafka_bootstrap, reference[0])
    _assert_identical(got, expected)
    delivered = Counter(got.sample_ids())
    assert max(delivered.values()) == 1, [i for i, n in delivered.items() if n > 1][:5]
    job = loaded_job[0]
    every = {i for s in SOURCES for i in committed_sample_ids(kafka_bootstrap, JobTopics(job), s)}
    assert set(delivered) == every


def test_token_shares_follow_the_curriculum(
    kafka_bootstrap: str, loaded_job: tuple[str, Path], tmp_path: Path, unique_name: str
) -> None:
    schedule = {
        "interpolation": "linear",
        "schedule": [
            {"step": 0, "weights": {"code": 0.2, "docstrings": 0.6, "topics": 0.2}},
            {"step": 20, "weights": {"code": 0.6, "docstrings": 0.2, "topics": 0.2}},
        ],
    }
    spec_path = _spec(tmp_path, kafka_bootstrap, loaded_job, mixture=schedule, on_exhausted="stop")
    summary = _run(spec_path, unique_name)
    spec = load_spec(spec_path)
    steps = _written(kafka_bootstrap, unique_name).steps
    assert len(steps) == summary["steps"] >= 10
    tokens = np.zeros((len(steps), len(SOURCES)))
    for k, step in enumerate(steps):
        for batch in step:
            for sample_id, length in zip(batch.sample_ids, batch.lengths.tolist(), strict=True):
                tokens[k, SOURCES.index(sample_id.split("/")[0])] += length
    weights = Schedule.from_spec(spec.mixture, list(SOURCES)).weights_array(np.arange(len(steps)))
    want = np.cumsum(weights * tokens.sum(axis=1, keepdims=True), axis=0)
    got = np.cumsum(tokens, axis=0)
    # Cumulative shares track the schedule within about one sample per source (here <= 512 tokens) plus
    # what the scheduler deferred at the last step.
    error = np.abs(got - want).max(axis=0)
    assert (error < 2 * 1024).all(), f"cumulative token error per source {error}"


# next_epoch does not end the job: the source starts another pass (tests/test_next_epoch.py).
@pytest.mark.parametrize("policy", ["stop", "renormalize"])
def test_a_source_that_runs_out(
    kafka_bootstrap: str, loaded_job: tuple[str, Path], tmp_path: Path, unique_name: str, policy: str
) -> None:
    # topics is the smallest source; a heavy weight on it makes it run out first.
    mixture = {"weights": {"code": 1, "docstrings": 1, "topics": 3}}
    spec = _spec(tmp_path, kafka_bootstrap, loaded_job, mixture=mixture, on_exhausted=policy)
    summary = _run(spec, unique_name)
    assert summary["finished"]
    delivered = Counter(_written(kafka_bootstrap, unique_name).sample_ids())
    assert max(delivered.values()) == 1
    job = loaded_job[0]
    every = {i for s in SOURCES for i in committed_sample_ids(kafka_bootstrap, JobTopics(job), s)}
    if policy == "renormalize":
        assert set(delivered) == every, "renormalize must deliver every sample of every finite source"
        return
    # The job ends at the first step the exhausted source cannot fill: most of it is delivered, and
    # the larger sources still have samples left.
    topics_ids = {i for i in every if i.startswith("topics/")}
    assert len(topics_ids & set(delivered)) > 0.5 * len(topics_ids)
    assert {i for i in every if i.startswith("code/")} - set(delivered), f"{policy} did not end the job early"


def test_a_bad_spec_is_refused_naming_the_field(tmp_path: Path, loaded_job: tuple[str, Path]) -> None:
    bad = yaml.safe_load(_spec(tmp_path, "127.0.0.1:1", loaded_job).read_text())
    bad["step"]["ranks"] = 0
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))
    result = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "construct", "--spec", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=REPO,
    )
    assert result.returncode == 2
    assert "step.ranks" in result.stderr


def test_an_undecodable_source_record_goes_to_the_dead_letter_topic(
    kafka_bootstrap: str, tmp_path: Path, unique_name: str, loaded_job: tuple[str, Path]
) -> None:
    spec_path = write_spec(tmp_path, unique_name, kafka_bootstrap, loaded_job[1], on_exhausted="renormalize")
    spec = load_spec(spec_path)
    config = {"bootstrap.servers": kafka_bootstrap}
    topics = JobTopics(unique_name)
    ensure_job_topics(config, unique_name, spec.source_names, spec.step.ranks)
    producer = Producer(config)
    sent = []
    for s in SOURCES:
        publish_work_plan(config, topics, s, [], partitions=8)  # no units: the source is complete as written
        for row in range(20):
            sample = Sample(f"{s}/file/{row}", s, np.arange(1 + row * 7, dtype=np.int32))
            value, headers = encode_sample(sample)
            producer.produce(topics.src(s), value, headers=headers)
            sent.append(sample.sample_id)
            if s == "code" and row == 5:
                producer.produce(topics.src(s), b"\x00garbage", headers=headers)
    assert producer.flush(30) == 0

    summary = _run(spec_path, unique_name)
    assert summary["finished"]
    delivered = _written(kafka_bootstrap, unique_name).sample_ids()
    assert sorted(delivered) == sorted(sent)
    letters = [decode_dead_letter_message(m) for m in read_to_end(config, topics.dlq)]
    assert len(letters) == 1
    assert letters[0].source == "code" and letters[0].location == f"{topics.src('code')}[0]@6", letters[0]


def test_packed_steps_deliver_every_sample_once_and_resume_to_the_same_bytes(
    kafka_bootstrap: str, tmp_path: Path, unique_name: str, loaded_job: tuple[str, Path]
) -> None:
    """Lengths uniform up to a micro-batch: composition packs the micro-batches' holes and the scheduler
    starts from its packing. Every sample arrives once with its tokens, and a constructor stopped and
    resumed twice writes the same bytes as one that ran through."""
    spec_path = write_spec(tmp_path, unique_name, kafka_bootstrap, loaded_job[1], on_exhausted="renormalize")
    spec = load_spec(spec_path)
    capacity = spec.step.tokens_per_micro_batch
    config = {"bootstrap.servers": kafka_bootstrap}
    topics = JobTopics(unique_name)
    ensure_job_topics(config, unique_name, spec.source_names, spec.step.ranks)
    producer = Producer(config)
    rng = np.random.default_rng(5)
    sent: dict[str, bytes] = {}
    for s in SOURCES:
        publish_work_plan(config, topics, s, [], partitions=8)
        for row in range(70):
            tokens = rng.integers(1, 30_000, int(rng.integers(1, capacity + 1)), dtype=np.int32)
            sample = Sample(f"{s}/file/{row}", s, tokens)
            value, headers = encode_sample(sample)
            producer.produce(topics.src(s), value, headers=headers)
            sent[sample.sample_id] = tokens.tobytes()
    assert producer.flush(30) == 0

    reference = _run(spec_path, f"{unique_name}-ref")
    assert reference["finished"] and reference["packed_steps"] > 0, reference
    written = _written(kafka_bootstrap, f"{unique_name}-ref")
    got = {sample.sample_id: sample.tokens.tobytes() for step in written.steps for b in step for sample in b.samples()}
    assert len(got) == len(written.sample_ids()), "a sample was delivered twice"
    assert got == sent

    resumed = f"{unique_name}-res"
    third = max(reference["steps"] // 3, 1)
    for _ in range(2):
        assert not _run(spec_path, resumed, "--max-steps", str(third))["finished"]
    assert _run(spec_path, resumed)["finished"]
    _assert_identical(_written(kafka_bootstrap, resumed), written)


def test_resuming_at_each_of_the_last_steps_delivers_what_was_left(
    kafka_bootstrap: str,
    loaded_job: tuple[str, Path],
    reference: tuple[str, dict],
    tmp_path: Path,
    unique_name: str,
) -> None:
    """Once every source ran out, what is left goes out in final steps. A constructor that resumes between
    them must read its sources again past their low watermarks first: one that did not (its state says
    every source ran out) ended the job there and lost the rest (a lanes run in CI lost 15 samples so)."""
    spec = _spec(tmp_path, kafka_bootstrap, loaded_job)
    total = reference[1]["steps"]
    resumed = f"{unique_name}-res"
    assert not _run(spec, resumed, "--max-steps", str(max(total - 6, 1)))["finished"]
    for _ in range(12):  # one step a run: a restart before each of the last steps, the final ones among them
        if _run(spec, resumed, "--max-steps", "1")["finished"]:
            break
    else:
        pytest.fail("the resumed constructor never finished")
    got, expected = _written(kafka_bootstrap, resumed), _written(kafka_bootstrap, reference[0])
    assert len(got.steps) == total
    _assert_identical(got, expected)


def test_resuming_step_by_step_with_long_context_matches_an_uninterrupted_run(
    kafka_bootstrap: str, loaded_job: tuple[str, Path], tmp_path: Path, unique_name: str
) -> None:
    # Long-context draws take samples out of offset order, so the checkpoint must carry offsets above
    # the low watermark: stopping after every few steps and resuming exercises exactly that.
    spec = _spec(tmp_path, kafka_bootstrap, loaded_job, long_context={"min_length": 256, "token_share": 0.3})
    reference = f"{unique_name}-ref"
    summary = _run(spec, reference)
    resumed = f"{unique_name}-res"
    for _ in range(200):
        if _run(spec, resumed, "--max-steps", "25")["finished"]:
            break
    else:
        pytest.fail("the resumed constructor never finished")
    got, expected = _written(kafka_bootstrap, resumed), _written(kafka_bootstrap, reference)
    assert len(got.steps) == summary["steps"]
    _assert_identical(got, expected)
    lengths = [np.concatenate([batch.lengths for batch in step]) for step in got.steps[:10]]
    long_tokens = [int(step[step >= 256].sum()) for step in lengths]
    all_tokens = [int(step.sum()) for step in lengths]
    assert sum(long_tokens) >= 0.25 * sum(all_tokens), "the long-context share was not drawn"
