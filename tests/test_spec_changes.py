"""A job resumed under a changed spec, at a step boundary: sources added, removed and added back, weights
changed; nothing lost or delivered twice. A change that cannot apply (the step shape) is refused."""

from __future__ import annotations

import random
import subprocess
from collections import Counter
from pathlib import Path

import pytest
import yaml

from pipeline.planning.mixing import MixerState
from pipeline.planning.step.spec_change import carry_over
from pipeline.planning.step.state import ConstructorState, SampleRef, SourcePosition
from tests.loader_support import build_example_data, committed_sample_ids, load_sources, start_constructor, write_spec
from topics.formats.batch_codec import decode_batch_message, end_of_data_steps
from topics.formats.names import JobTopics
from topics.kafka.log_reader import read_to_end

RANKS = 2


@pytest.fixture(scope="module")
def loaded(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path, Path]:
    """The three example sources loaded once: (job, data folder, spec of all three)."""
    folder = tmp_path_factory.mktemp("spec-changes")
    data = build_example_data(folder / "data", limit=30)
    job = f"sc{random.randrange(16**8):08x}"
    spec = write_spec(folder, job, kafka_bootstrap, data, on_exhausted="renormalize")
    load_sources(spec, folder)
    return job, data, spec


def _variant(base: Path, folder: Path, name: str, weights: dict[str, float], **overrides: object) -> Path:
    """The base spec mixing only the sources in ``weights``, with those weights."""
    body = yaml.safe_load(base.read_text())
    body["sources"] = [s for s in body["sources"] if s["name"] in weights]
    body["mixture"] = {"weights": weights}
    body.update(overrides)
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    return path


def _construct(spec: Path, out: str, *extra: str) -> subprocess.CompletedProcess:
    process = start_constructor(spec, out, *extra)
    stdout, stderr = process.communicate(timeout=240)
    return subprocess.CompletedProcess(process.args, process.returncode, stdout.decode(), stderr.decode())


def _ok(done: subprocess.CompletedProcess) -> None:
    assert done.returncode == 0, done.stderr[-3000:]


def _ids_by_step(bootstrap: str, out: str) -> list[list[str]]:
    """Per step, every sample id of every rank; checks that steps are contiguous on every rank."""
    per_rank = []
    for rank in range(RANKS):
        records = read_to_end({"bootstrap.servers": bootstrap}, JobTopics(out).rank(rank))
        batches = [decode_batch_message(r) for r in records if end_of_data_steps(r.headers()) is None]
        assert [b.step for b in batches] == list(range(len(batches))), f"rank {rank}: steps not contiguous"
        per_rank.append(batches)
    assert len({len(b) for b in per_rank}) == 1
    return [[i for b in step for i in b.sample_ids] for step in zip(*per_rank, strict=True)]


def _source(sample_id: str) -> str:
    return sample_id.split("/", 1)[0]


@pytest.mark.kafka
def test_sources_added_removed_and_added_back_lose_and_repeat_nothing(
    kafka_bootstrap: str, loaded: tuple[str, Path, Path], tmp_path: Path, unique_name: str
) -> None:
    job, _, base = loaded
    two = _variant(base, tmp_path, "two", {"code": 1, "docstrings": 1})
    without_docstrings = _variant(base, tmp_path, "no-docstrings", {"code": 1, "topics": 3})
    three = _variant(base, tmp_path, "three", {"code": 2, "docstrings": 1, "topics": 1})
    _ok(_construct(two, unique_name, "--max-steps", "4"))  # code and docstrings
    _ok(_construct(without_docstrings, unique_name, "--max-steps", "4"))  # topics added, docstrings removed
    _ok(_construct(three, unique_name))  # docstrings back, new weights, to the end of every source
    steps = _ids_by_step(kafka_bootstrap, unique_name)
    delivered = Counter(i for step in steps for i in step)
    assert [i for i, n in delivered.items() if n > 1] == [], "samples delivered twice"
    topics = JobTopics(job)
    for source in ("code", "docstrings", "topics"):
        committed = set(committed_sample_ids(kafka_bootstrap, topics, source))
        got = {i for i in delivered if _source(i) == source}
        assert got == committed, f"{source}: {len(committed - got)} samples lost, {len(got - committed)} unknown"
    assert not any(_source(i) == "topics" for step in steps[:4] for i in step), "topics before it was added"
    assert any(_source(i) == "topics" for step in steps[4:8] for i in step)
    assert not any(_source(i) == "docstrings" for step in steps[4:8] for i in step), "docstrings while removed"
    assert any(_source(i) == "docstrings" for step in steps[8:] for i in step)


@pytest.mark.kafka
def test_a_changed_step_shape_is_refused_naming_the_field(
    kafka_bootstrap: str, loaded: tuple[str, Path, Path], tmp_path: Path, unique_name: str
) -> None:
    _, _, base = loaded
    _ok(_construct(base, unique_name, "--max-steps", "2"))
    wider = _variant(
        base,
        tmp_path,
        "wider",
        {"code": 1, "docstrings": 1, "topics": 1},
        step={"ranks": 4, "micro_batches": 2, "tokens_per_micro_batch": 1024},
    )
    done = _construct(wider, unique_name, "--max-steps", "2")
    assert done.returncode == 2, done.stderr[-2000:]
    assert "step.ranks is 4 in the spec but 2 in the steps written" in done.stderr
    assert len(_ids_by_step(kafka_bootstrap, unique_name)) == 2, "nothing may be written under the new shape"


def test_carry_over_keeps_removed_sources_where_they_were() -> None:
    state = ConstructorState(
        MixerState(7, {"a": 1.5, "b": -1.5}),
        {"a": SourcePosition(10, (12,)), "b": SourcePosition(4)},
        (SampleRef("b", 5), SampleRef("a", 11)),
        ("a",),
    )
    assert carry_over(state, ["a", "b"]).state is state  # unchanged: the same bytes go on being written
    carried = carry_over(state, ["a", "c"])
    assert carried.added == ("c",) and carried.removed == ("b",)
    assert carried.dormant == {"b": SourcePosition(4)}  # its deferred sample at offset 5 lies above offset 4
    assert carried.state.positions == {"a": SourcePosition(10, (12,)), "c": SourcePosition()}
    assert carried.state.deferred == (SampleRef("a", 11),)
    assert carried.state.mixer == MixerState(7, {"a": 1.5, "c": 0.0})
    assert carried.state.exhausted == ("a",)
