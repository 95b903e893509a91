"""Live mixture changes: `mixflow control set-mixture` publishes new shares from a step on; the constructor
applies them from that step, keeps them in its state records across restarts, and refuses a change for a
step it has written already."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from confluent_kafka import Producer
from hypothesis import given
from hypothesis import strategies as st

from pipeline.kafka.control import (
    change_answer,
    decode_mixture_change,
    encode_mixture_change,
    first_changeable_step,
    lanes_finished,
    publish_mixture_change,
    shares_from_arguments,
)
from pipeline.kafka.state_topic import read_last_state
from pipeline.planning.mixing import MixerState, MixtureChange, MixtureTimeline, Schedule, refusal
from pipeline.planning.step.state import ConstructorState
from tests.loader_support import REPO, build_example_data, load_sources, start_constructor, write_spec
from topics.errors import DecodeError, MixflowError
from topics.formats.lanes import first_step_at_or_after
from topics.formats.names import JobTopics
from topics.kafka.log_reader import read_to_end

RANKS = 2
STEP = {"ranks": RANKS, "micro_batches": 1, "tokens_per_micro_batch": 512}


# -- the pure parts ---------------------------------------------------------------------------------


def test_a_timeline_follows_the_schedule_until_a_change_and_the_latest_change_after() -> None:
    base = Schedule(["a", "b"], [0, 10], [[1, 1], [1, 3]])
    changes = [MixtureChange("x", 20, {"a": 2.0}), MixtureChange("y", 5, {"a": 1.0, "b": 4.0})]
    timeline = MixtureTimeline(base, changes)
    assert timeline.weights_at(4) == base.weights_at(4)
    assert timeline.weights_at(5) == pytest.approx({"a": 0.2, "b": 0.8})
    assert timeline.weights_at(19) == pytest.approx({"a": 0.2, "b": 0.8})  # the change overrides step 10's point
    assert timeline.weights_at(20) == {"a": 1.0, "b": 0.0}


def test_a_change_naming_only_sources_no_longer_mixed_leaves_the_schedule_in_force() -> None:
    base = Schedule(["a", "b"], [0], [[1, 1]])
    timeline = MixtureTimeline(base, [MixtureChange("x", 0, {"gone": 1.0})])
    assert timeline.weights_at(3) == base.weights_at(3)


def test_refusal_names_a_written_step_and_an_unknown_source() -> None:
    assert refusal(MixtureChange("x", 4, {"a": 1.0}), 4, ["a"]) is None
    assert "step 3 was written already" in (refusal(MixtureChange("x", 3, {"a": 1.0}), 4, ["a"]) or "")
    assert "no source b" in (refusal(MixtureChange("x", 9, {"b": 1.0}), 4, ["a"]) or "")


@pytest.mark.parametrize(
    ("pairs", "problem"),
    [
        (["a"], "give SOURCE=SHARE"),
        (["zz=1"], "no source 'zz'"),
        (["a=-1"], "finite number >= 0"),
        (["a=nan"], "finite number >= 0"),
        (["a=inf"], "finite number >= 0"),
        (["a=x"], "finite number >= 0"),
        (["a=1", "a=2"], "given twice"),
        (["a=0"], "share above 0"),
    ],
)
def test_bad_share_arguments_are_refused_naming_them(pairs: list[str], problem: str) -> None:
    with pytest.raises(MixflowError, match=problem):
        shares_from_arguments(pairs, {"a": None, "b": None})


def test_mixture_change_records_round_trip_and_bad_ones_say_why() -> None:
    rng = random.Random(3)
    for _ in range(50):
        shares = {f"s{i}": rng.choice([0.0, rng.random() * 10]) for i in range(rng.randint(1, 5))}
        shares["s0"] = 1.0 + rng.random()
        change = MixtureChange(f"id{rng.random()}", rng.randint(0, 10**9), shares)
        assert decode_mixture_change(encode_mixture_change(change)[1]) == change
    with pytest.raises(DecodeError, match="from_step"):
        decode_mixture_change(b'{"kind":"mixture-change","id":"x","from_step":-1,"shares":{"a":1}}')
    with pytest.raises(DecodeError, match="share above 0"):
        decode_mixture_change(b'{"kind":"mixture-change","id":"x","from_step":1,"shares":{"a":0}}')


@st.composite
def lanes_at(draw: st.DrawFn) -> tuple[int, list[int | None]]:
    """A lane count and each lane's last written step (None: it has written nothing yet)."""
    lanes = draw(st.integers(1, 6))
    base = draw(st.integers(0, 300))
    spread = draw(st.sampled_from([0, 3, 40]))
    last = [
        None if draw(st.integers(0, 5)) == 0 else first_step_at_or_after(base + draw(st.integers(0, spread)), j, lanes)
        for j in range(lanes)
    ]
    return lanes, last


def _lane_state(last: int | None, lanes: int, **fields: object) -> ConstructorState | None:
    """A lane's state after writing ``last``: its next step is ``last + lanes``."""
    return None if last is None else ConstructorState(MixerState(last + lanes), **fields)


@given(lanes_at(), st.integers(0, 400))
def test_set_mixture_takes_a_step_after_every_lane_s_last_and_no_lane_refuses_it(job, from_step: int) -> None:
    lanes, last = job
    states = [_lane_state(k, lanes) for k in last]
    first = first_changeable_step(states)
    written = [k for k in last if k is not None]
    assert first > max(written, default=-1)
    change = MixtureChange("c", from_step, {"code": 1.0})
    allowed = refusal(change, first, ["code"]) is None
    # What set-mixture lets through, no lane refuses when it reads it (a lane refuses a step it wrote, or
    # an earlier one: before its next step less the lanes' other steps in between).
    lanes_refusing = [
        j for j, s in enumerate(states) if s is not None and refusal(change, s.step - lanes + 1, ["code"])
    ]
    assert allowed == (not lanes_refusing)
    assert not lanes_finished(states) or all(s is not None for s in states)


@given(lanes_at(), st.data())
def test_a_change_is_answered_once_every_open_lane_accepted_it_or_one_refused_it(job, data: st.DataObject) -> None:
    lanes, last = job
    change = MixtureChange("c", 500, {"code": 1.0})
    kinds = st.sampled_from(["accepted", "refused", "unread", "finished", "accepted, finished"])
    drawn = data.draw(st.lists(kinds, min_size=lanes, max_size=lanes))
    answers = [a if k is not None else "unread" for k, a in zip(last, drawn, strict=True)]  # no state: no answer
    states = []
    for k, answer in zip(last, answers, strict=True):
        fields = {
            "accepted": {"changes": (change,)},
            "refused": {"refused": ("c",)},
            "unread": {},
            "finished": {"finished": True},
            "accepted, finished": {"changes": (change,), "finished": True},
        }[answer]
        states.append(_lane_state(k, lanes, **fields))
    open_lanes = [a for a in answers if "finished" not in a]
    expected = None
    if "refused" in answers:
        expected = "refused"
    elif any(a.startswith("accepted") for a in answers) and all(a == "accepted" for a in open_lanes):
        expected = "accepted"
    assert change_answer(states, "c") == expected
    said = [a for k, a in zip(last, answers, strict=True) if k is not None]
    assert lanes_finished(states) == (len(said) == lanes and all("finished" in a for a in said))


def test_state_records_keep_changes_and_old_records_without_them_still_decode() -> None:
    old = b'{"v":1,"mixer":{"v":1,"step":3,"credit":{"a":0.0},"long":0.0},"sources":{"a":[2,[]]},'
    old += b'"deferred":[],"exhausted":[],"finished":false}'
    state = ConstructorState.from_bytes(old)
    assert state.changes == () and state.control_offset == 0 and state.refused == ()
    change = MixtureChange("x", 7, {"a": 1.0})
    newer = ConstructorState(state.mixer, state.positions, changes=(change,), control_offset=9, refused=("y",))
    assert ConstructorState.from_bytes(newer.to_bytes()) == newer


# -- against a broker -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def loaded(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """The three example sources loaded once: (data folder, spec)."""
    folder = tmp_path_factory.mktemp("control")
    data = build_example_data(folder / "data", limit=10)
    job = f"ctl{random.randrange(16**8):08x}"
    spec = write_spec(folder, job, kafka_bootstrap, data, on_exhausted="renormalize", step=STEP)
    load_sources(spec, folder)
    return job, spec


def _set_mixture(spec: Path, job: str, from_step: int, *shares: str, wait_s: float = 0) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "pipeline.cli", "control", "set-mixture", "--spec", str(spec), "--job", job]
    command += ["--from-step", str(from_step), "--wait-s", str(wait_s), *shares]
    return subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=120)


def _construct(spec: Path, out: str, *extra: str) -> None:
    process = start_constructor(spec, out, *extra)
    _, stderr = process.communicate(timeout=240)
    assert process.returncode == 0, stderr.decode()[-3000:]


def _rank_values(bootstrap: str, job: str) -> list[list[bytes]]:
    return [
        [m.value() for m in read_to_end({"bootstrap.servers": bootstrap}, JobTopics(job).rank(r))] for r in range(RANKS)
    ]


@pytest.mark.kafka
def test_a_change_applies_from_its_step_across_restarts_as_a_curriculum_would(
    kafka_bootstrap: str, loaded: tuple[str, Path], tmp_path: Path, unique_name: str
) -> None:
    _, spec = loaded
    out = unique_name
    _construct(spec, out, "--max-steps", "3")
    published = _set_mixture(spec, out, 5, "code=2", "topics=1")
    assert published.returncode == 0, published.stderr
    assert json.loads(published.stdout.splitlines()[-1])["status"] == "published"  # no constructor runs
    refused = _set_mixture(spec, out, 1, "code=1")
    assert refused.returncode == 5 and "step 1 was written already" in refused.stderr, refused.stderr
    _construct(spec, out)  # resumes at step 3; the change accepted in the first run still holds

    state = read_last_state({"bootstrap.servers": kafka_bootstrap}, JobTopics(out))
    assert state is not None and state.finished
    assert [(c.from_step, dict(c.shares)) for c in state.changes] == [(5, {"code": 2.0, "topics": 1.0})]

    # The same shares as a curriculum in the spec give the same batches, byte for byte.
    body = yaml.safe_load(spec.read_text())
    body["mixture"] = {
        "schedule": [
            {"step": 0, "weights": body["mixture"]["weights"]},
            {"step": 5, "weights": {"code": 2, "docstrings": 0, "topics": 1}},
        ]
    }
    curriculum = tmp_path / "curriculum.yaml"
    curriculum.write_text(yaml.safe_dump(body, sort_keys=False))
    _construct(curriculum, f"{out}-curriculum")
    assert _rank_values(kafka_bootstrap, out) == _rank_values(kafka_bootstrap, f"{out}-curriculum")

    # A replay from a step before the change was published applies it at the same step.
    command = [sys.executable, "-m", "pipeline.cli", "replay", "--spec", str(spec), "--job", out, "--from-step", "2"]
    command += ["--to-job", f"{out}-replay", "--verify"]
    replayed = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=240)
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr[-3000:]


@pytest.mark.kafka
def test_a_change_that_reaches_the_constructor_after_its_step_is_refused_and_reported(
    kafka_bootstrap: str, loaded: tuple[str, Path], unique_name: str
) -> None:
    _, spec = loaded
    out = unique_name
    config = {"bootstrap.servers": kafka_bootstrap}
    _construct(spec, out, "--max-steps", "4")
    late = MixtureChange("late-one", 2, {"code": 1.0})  # as if published just before step 2 was written
    publish_mixture_change(config, JobTopics(out), late)
    _construct(spec, out, "--max-steps", "1")
    state = read_last_state(config, JobTopics(out))
    assert state is not None and state.step == 5
    assert state.refused == ("late-one",) and state.changes == ()

    from pipeline.cli.control import _wait_for_answer

    assert _wait_for_answer(config, JobTopics(out), "late-one", wait_s=5) == "refused"


@pytest.mark.kafka
def test_set_mixture_refuses_unknown_sources_and_a_finished_job(
    kafka_bootstrap: str, loaded: tuple[str, Path], unique_name: str
) -> None:
    _, spec = loaded
    unknown = _set_mixture(spec, unique_name, 3, "nope=1")
    assert unknown.returncode == 4 and "no source 'nope'" in unknown.stderr
    _construct(spec, unique_name)
    finished = _set_mixture(spec, unique_name, 10**6, "code=1")
    assert finished.returncode == 5 and "finished at step" in finished.stderr, finished.stderr
    missing = _set_mixture(spec, f"{unique_name}-none", 3, "code=1")
    assert missing.returncode == 4 and "does not exist" in missing.stderr, missing.stderr


BROKEN_CONTROL_RECORDS = [
    (b"spec", b"not json"),
    (b"spec", b'{"kind": "spec", "from_step": -1}'),
    (b"mixture-change", b'{"kind": "mixture-change", "from_step": "soon"}'),
]


@pytest.mark.kafka
def test_broken_control_records_are_skipped_on_resume_and_each_named_by_replay(
    kafka_bootstrap: str, loaded: tuple[str, Path], unique_name: str
) -> None:
    """Every kind of broken record at once, in one job: each is skipped (a warning names its offset) and
    named by replay, and none changes the mixture."""
    _, spec = loaded
    out = unique_name
    config = {"bootstrap.servers": kafka_bootstrap}
    _construct(spec, out, "--max-steps", "3")
    producer = Producer(config)
    for key, value in BROKEN_CONTROL_RECORDS:
        producer.produce(JobTopics(out).control, value, key=key)
        assert producer.flush(30) == 0
    records = read_to_end(config, JobTopics(out).control)
    offsets = [m.offset() for m in records if (m.key(), m.value()) in BROKEN_CONTROL_RECORDS]
    assert len(offsets) == len(BROKEN_CONTROL_RECORDS)
    process = start_constructor(spec, out)  # resumes past the records, and the job ends
    _, stderr = process.communicate(timeout=240)
    assert process.returncode == 0, stderr.decode()[-3000:]
    warnings = [line for line in stderr.decode().splitlines() if " WARNING " in line]
    for offset in offsets:
        assert any(f"{out}.control" in line and f"offset={offset}" in line for line in warnings), (offset, warnings)
    state = read_last_state(config, JobTopics(out))
    assert state is not None and state.finished and state.changes == ()

    command = [sys.executable, "-m", "pipeline.cli", "replay", "--spec", str(spec), "--job", out, "--from-step", "0"]
    command += ["--to-job", f"{out}-replay", "--verify"]
    replayed = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=240)
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr[-3000:]
    for (key, _), offset in zip(BROKEN_CONTROL_RECORDS, offsets, strict=True):
        said = f"{out}.control[0]@{offset} (key {key.decode()}) does not decode, and the job skipped it at step 3"
        assert said in replayed.stderr, replayed.stderr[-3000:]
