"""A replay across a resume under a changed spec: the job records the spec in force from each step it
resumes at (``spec`` records on ``<job>.control``), and a same-shape replay rebuilds each stretch of
steps under the spec recorded for it, so it writes the original's bytes; or refuses, naming the step and
what changed. A job without spec records replays under the spec given, with a warning that it cannot check."""

from __future__ import annotations

import itertools
import logging
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.kafka.spec_record import read_spec_records
from pipeline.planning.step.spec_in_force import SpecRecord, changes, digest, mixing_part, segments, spec_for
from pipeline.spec import JobSpec, load_spec
from pipeline.tools.replay import ReplayRequest, replay, verify
from pipeline.tools.replay.specs import replay_specs
from tests.replay_support import construct, fill_sources, write_replay_spec
from topics.errors import MixflowError
from topics.formats.names import JobTopics

FOUR = {
    "sources": [{"name": s, "reader": "jsonl", "path": ".", "pretokenized": True} for s in "abcd"],
    "mixture": {"weights": {"a": 2, "b": 1, "c": 1, "d": 1}},
}


def _specs(folder: Path, job: str, bootstrap: str) -> tuple[JobSpec, JobSpec]:
    """The job's spec of three sources, and the same with a fourth source ``d`` added."""
    (folder / "four").mkdir()
    three = load_spec(write_replay_spec(folder, job, bootstrap))
    four = load_spec(write_replay_spec(folder / "four", job, bootstrap, **FOUR))
    return three, four


def _uniform(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.integers(1, 200, n)


def _resumed_job(folder: Path, job: str, bootstrap: str) -> JobSpec:
    """10 steps under three sources, then resumed with a fourth added, to the job's end."""
    three, four = _specs(folder, job, bootstrap)
    fill_sources(four, 50, _uniform)
    assert construct(three, max_steps=10).steps_written == 10
    assert construct(four).finished
    return four


@pytest.mark.kafka
def test_a_replay_across_a_resume_with_a_source_added_writes_the_same_bytes(
    kafka_bootstrap: str, tmp_path: Path, unique_name: str
) -> None:
    four = _resumed_job(tmp_path, unique_name, kafka_bootstrap)
    config = four.kafka.client_config()
    records = read_spec_records(config, JobTopics(four.job))
    assert [r.from_step for r in records] == [0, 10]
    assert [s["name"] for s in records[1].spec["sources"]] == ["a", "b", "c", "d"]
    assert changes(records[0].spec, records[1].spec)[0] == "sources added: d"

    target = f"{unique_name}-r"
    summary = replay(four, config, ReplayRequest(target, 5))
    assert summary.finished and summary.written[0] == 5
    audit = verify(config, four.job, target, 5)
    assert audit.mismatch is None and audit.end and audit.steps > 5
    # The replayed job records the same specs from the steps it wrote under them.
    assert [(r.from_step, r.digest) for r in read_spec_records(config, JobTopics(target))] == [
        (5, records[0].digest),
        (10, records[1].digest),
    ]


@pytest.mark.kafka
def test_a_job_without_spec_records_replays_under_the_spec_given_with_a_warning(
    kafka_bootstrap: str, tmp_path: Path, unique_name: str, monkeypatch: pytest.MonkeyPatch, caplog
) -> None:
    """As a job written before spec records were kept: the replay cannot tell that step 5 was written
    under three sources, so it writes other bytes from there, and says it could not check."""
    monkeypatch.setattr("pipeline.roles.constructor.role.record_spec", lambda *args: None)
    four = _resumed_job(tmp_path, unique_name, kafka_bootstrap)
    config = four.kafka.client_config()
    assert read_spec_records(config, JobTopics(four.job)) == []
    target = f"{unique_name}-r"
    with caplog.at_level(logging.WARNING, logger="pipeline.tools.replay.run"):
        replay(four, config, ReplayRequest(target, 5, to_step=8))
    assert "recorded no spec" in caplog.text and "cannot be checked" in caplog.text
    mismatch = verify(config, four.job, target, 5).mismatch
    assert mismatch is not None and mismatch.startswith("step 5")


# -- pure ---------------------------------------------------------------------------------------------------


def test_a_recorded_spec_is_put_in_force_over_the_spec_given(tmp_path: Path) -> None:
    three, four = _specs(tmp_path, "job", "127.0.0.1:9")
    rebuilt = spec_for(four, mixing_part(three))
    assert mixing_part(rebuilt) == mixing_part(three) and rebuilt.source_names == ["a", "b", "c"]
    assert rebuilt.kafka == four.kafka
    assert mixing_part(spec_for(three, mixing_part(four))) == mixing_part(four)  # d: a copy of a, renamed
    assert digest(mixing_part(three)) != digest(mixing_part(four))
    assert changes(mixing_part(three), mixing_part(four)) == ["sources added: d", "mixture.weights.d null -> 1.0"]
    seeded = spec_for(three, {**mixing_part(three), "seed": 4, "step": {**mixing_part(three)["step"], "ranks": 4}})
    assert changes(mixing_part(three), mixing_part(seeded)) == ["step.ranks 2 -> 4", "seed 3 -> 4"]


def test_a_spec_that_cannot_be_rebuilt_is_refused_naming_the_step_and_what_changed(tmp_path: Path) -> None:
    three, four = _specs(tmp_path, "job", "127.0.0.1:9")
    broken = {**mixing_part(three), "mixture": {"weights": {"z": 1}}}
    records = [SpecRecord.of(four, 0), SpecRecord(10, digest(broken), broken)]
    assert [s.spec for s in replay_specs("job", four, records, 2, 9)] == [four]
    with pytest.raises(MixflowError) as error:
        replay_specs("job", four, records, 2, 12)
    message = str(error.value)
    assert "job job wrote step 10 under another spec" in message
    assert "(sources added: d; mixture.weights.z 1 -> null" in message


def _record(from_step: int, name: str) -> SpecRecord:
    return SpecRecord(from_step, name, {})


@settings(deadline=None, max_examples=300)
@given(
    written=st.lists(st.tuples(st.integers(0, 30), st.sampled_from("xyz")), max_size=8),
    first=st.integers(0, 30),
    length=st.integers(0, 30),
)
def test_each_step_replays_under_the_last_record_written_from_it_or_before(
    written: list[tuple[int, str]], first: int, length: int
) -> None:
    records = [_record(s, d) for s, d in written]
    last = first + length
    cut = segments(records, first, last)
    assert cut[0].first == first and cut[-1].last == last
    assert all(a.last + 1 == b.first for a, b in itertools.pairwise(cut))
    for segment in cut:
        assert segment.first <= segment.last
        for step in range(segment.first, segment.last + 1):
            expected = next((r.digest for r in reversed(records) if r.from_step <= step), None)
            assert (segment.record.digest if segment.record else None) == expected
