"""``constructor.max_lead_steps``: sinks report the step their trainer holds on ``<job>.progress``, and
the constructor stays at most that many steps ahead of the slowest rank."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.roles.constructor import ConstructorOptions, DataConstructor
from pipeline.roles.constructor.lead import lead_allows, slowest_rank
from pipeline.spec import load_spec
from tests.replay_support import fill_sources, steps_of, write_replay_spec
from topics.errors import DecodeError
from topics.formats.names import JobTopics
from topics.formats.progress import decode_progress, encode_progress
from topics.kafka.log_reader import read_to_end
from trainer_sink import KafkaBatchDataset, ReadOptions

# -- pure parts ------------------------------------------------------------------------------------


REPORTS = st.dictionaries(st.integers(0, 9), st.integers(-1, 50))


@given(REPORTS, st.integers(1, 10), st.integers(0, 80), st.integers(1, 8))
def test_the_lead_is_counted_from_the_slowest_rank(reported: dict[int, int], ranks: int, step: int, lead: int) -> None:
    slowest = min(reported.get(r, -1) for r in range(ranks))
    rank, reached = slowest_rank(reported, ranks)
    assert reached == slowest and reported.get(rank, -1) == slowest
    assert all(reported.get(r, -1) > slowest for r in range(rank))  # the lowest rank among equals
    assert lead_allows(step, reported, ranks, lead) == (step - slowest <= lead)


def test_progress_records_round_trip_and_bad_ones_are_refused() -> None:
    for rank, step in [(0, -1), (3, 0), (10239, 123456)]:
        key, value = encode_progress(rank, step)
        assert key == str(rank).encode() and decode_progress(value) == (rank, step)
    for bad in [None, b"", b"{", b'{"rank": 1}', b'{"rank": -1, "step": 3}', b'{"rank": "1", "step": 2}']:
        with pytest.raises(DecodeError, match="not a progress report"):
            decode_progress(bad)


# -- against the broker ----------------------------------------------------------------------------

RANKS, LEAD = 2, 3


def _job(tmp_path: Path, job: str, bootstrap: str):
    spec = load_spec(write_replay_spec(tmp_path, job, bootstrap, constructor={"max_lead_steps": LEAD}))
    lengths = lambda rng, n: np.clip(rng.lognormal(4.0, 0.8, n), 1, 256).astype(np.int64)  # noqa: E731
    fill_sources(spec, 120, lengths)
    return spec


def _steps_written(bootstrap: str, job: str) -> int:
    return len(read_to_end({"bootstrap.servers": bootstrap}, JobTopics(job).rank(0)))


@pytest.mark.kafka
def test_the_constructor_stays_within_its_lead_of_a_slow_trainer(
    kafka_bootstrap: str, unique_name: str, tmp_path: Path
) -> None:
    spec = _job(tmp_path, unique_name, kafka_bootstrap)
    violations: list[str] = []
    taken: dict[int, int] = {}

    def trainer() -> None:
        """Both ranks in lockstep, a step at a time; after each, what the constructor has written."""
        read = ReadOptions(wait_timeout_s=60)
        datasets = [KafkaBatchDataset(job=unique_name, bootstrap_servers=kafka_bootstrap, rank=r, read=read)
                    for r in range(RANKS)]  # fmt: skip
        iterators = [iter(d) for d in datasets]
        step = 0
        try:
            while True:
                for rank, (dataset, it) in enumerate(zip(datasets, iterators, strict=True)):
                    for _ in range(spec.step.micro_batches):
                        next(it)
                    taken[rank] = dataset.state_dict()["step"] - 1
                step = min(taken.values())
                # Stale reports only hold the constructor back, so it never has more than this written.
                if (written := _steps_written(kafka_bootstrap, unique_name)) - 1 > step + LEAD:
                    violations.append(f"trainer at step {step}: {written} steps written")
                time.sleep(0.05)  # a trainer's step
        except StopIteration:
            pass
        except BaseException as exc:  # reported by the test's thread
            violations.append(f"the trainer failed at step {step}: {exc!r}")

    thread = threading.Thread(target=trainer, daemon=True)
    thread.start()
    options = ConstructorOptions(transaction_timeout_ms=10_000)
    stats = DataConstructor(spec, spec.kafka.client_config(), options).run()
    thread.join(timeout=120)
    assert not thread.is_alive(), "the trainer did not reach the end of the job within 120 s"
    assert stats.finished and violations == []
    steps, end = steps_of(kafka_bootstrap, unique_name, RANKS)
    assert len(steps) == end > 3 * LEAD, "too few steps for the lead to matter"
    assert min(taken.values()) == end - 1


@pytest.mark.kafka
def test_without_reports_the_constructor_waits_after_its_lead(
    kafka_bootstrap: str, unique_name: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spec = _job(tmp_path, unique_name, kafka_bootstrap)
    constructor = DataConstructor(spec, spec.kafka.client_config(), ConstructorOptions(transaction_timeout_ms=10_000))
    seen: list[int] = []
    heard: list[bool] = []

    def watch() -> None:
        deadline = time.monotonic() + 120
        while not any("waits for the trainers" in r.getMessage() for r in caplog.records):
            if time.monotonic() > deadline:
                break
            time.sleep(0.1)  # log records from the constructor's thread: nothing to block on
        heard.append(time.monotonic() <= deadline)
        seen.append(_steps_written(kafka_bootstrap, unique_name))
        constructor.request_stop()

    watcher = threading.Thread(target=watch, daemon=True)
    with caplog.at_level(logging.INFO, logger="pipeline.roles.constructor.lead"):
        watcher.start()
        stats = constructor.run()
    watcher.join(timeout=30)
    assert not stats.finished
    assert heard == [True], "the constructor did not log that it waits for the trainers within 120 s"
    # No rank has reported (-1), so steps 0 .. LEAD - 1 are written, and no more.
    assert seen == [LEAD], f"{seen} steps written when the constructor said it waits (expected {LEAD})"
    assert _steps_written(kafka_bootstrap, unique_name) == LEAD


@pytest.mark.kafka
def test_a_resumed_trainer_reports_the_steps_its_checkpoint_holds_before_taking_another(
    kafka_bootstrap: str, unique_name: str, tmp_path: Path
) -> None:
    """The reports of a trainer killed before they were delivered are lost; the constructor, at its lead,
    waits for them. The trainer resumed from its checkpoint must report first, or both wait for ever."""
    spec = _job(tmp_path, unique_name, kafka_bootstrap)
    outcome: dict[str, object] = {}

    def trainers() -> None:
        try:
            read = ReadOptions(wait_timeout_s=60)
            lost = [KafkaBatchDataset(job=unique_name, bootstrap_servers=kafka_bootstrap, rank=r, read=read,
                                      report_progress=False) for r in range(RANKS)]  # fmt: skip
            for dataset in lost:
                iterator = iter(dataset)
                for _ in range(LEAD * spec.step.micro_batches):  # every step the constructor writes, unheard
                    next(iterator)
                iterator.close()
            outcome["checkpoints"] = checkpoints = [dataset.state_dict() for dataset in lost]
            iterators = []
            for rank, checkpoint in enumerate(checkpoints):
                resumed = KafkaBatchDataset(job=unique_name, bootstrap_servers=kafka_bootstrap, rank=rank,
                                            read=read)  # fmt: skip
                resumed.load_state_dict(checkpoint)
                iterators.append(iter(resumed))
            taken = [0] * RANKS
            with contextlib.suppress(StopIteration):  # SinkTimeoutError after 60 s if the constructor never hears
                while True:  # the ranks in lockstep, a step at a time
                    for rank, iterator in enumerate(iterators):
                        for _ in range(spec.step.micro_batches):
                            next(iterator)
                            taken[rank] += 1
            for iterator in iterators:  # the last rank ran out with the first
                taken[iterators.index(iterator)] += sum(1 for _ in iterator)
            outcome["taken"] = taken
        except BaseException as exc:  # reported by the test's thread
            outcome["error"] = exc
            constructor.request_stop()

    constructor = DataConstructor(spec, spec.kafka.client_config(), ConstructorOptions(transaction_timeout_ms=10_000))
    thread = threading.Thread(target=trainers, daemon=True)
    thread.start()
    stats = constructor.run()
    thread.join(timeout=120)
    assert "error" not in outcome, f"a trainer failed: {outcome.get('error')!r}"
    assert not thread.is_alive(), "the trainers did not reach the end within 120 s of the constructor"
    assert stats.finished
    assert [c["step"] for c in outcome["checkpoints"]] == [LEAD] * RANKS  # type: ignore[union-attr]
    steps, end = steps_of(kafka_bootstrap, unique_name, RANKS)
    assert len(steps) == end > 2 * LEAD
    assert outcome["taken"] == [(end - LEAD) * spec.step.micro_batches] * RANKS
