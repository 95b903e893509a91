"""``mixflow replay``: a replay under the job's own step shape writes the same bytes (the determinism
audit); under another number of ranks every step keeps its samples; a stopped replay continues without
repeats; the constructor and the trainer sink go on from a replayed job; bad inputs are refused."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import yaml
from confluent_kafka import Producer
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.cli import main
from pipeline.kafka.state_topic import JobHistory, StateRecord, require_history
from pipeline.planning.mixing import MixerState
from pipeline.planning.scheduler import CostModel
from pipeline.planning.shape import StepShape
from pipeline.planning.step.state import ConstructorState, SourcePosition
from pipeline.spec import JobSpec, load_spec
from pipeline.tools.replay import (
    ReplayMode,
    ReplayRequest,
    ReshapeError,
    default_micro_batches,
    plan_replay,
    replay,
    reshape_step,
    verify,
)
from pipeline.tools.replay.plan import adopted
from tests.replay_support import Lengths, construct, make_job, steps_of, write_replay_spec
from tests.sink_support import random_batch
from topics.errors import MixflowError
from topics.formats.batch import Batch
from topics.formats.batch_codec import encode_batch
from topics.formats.names import JobTopics
from topics.formats.sample import Sample
from trainer_sink import KafkaBatchDataset

COST = CostModel(1.0, 100.0)


def _uniform(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.integers(1, 200, n)


def _long_tail(rng: np.random.Generator, n: int) -> np.ndarray:
    """Mostly short samples, a few close to a whole micro-batch."""
    return np.where(rng.random(n) < 0.15, rng.integers(300, 513, n), rng.integers(1, 40, n))


def _tiny(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.integers(1, 4, n)


@pytest.fixture(scope="module")
def original(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> JobSpec:
    """A finished job of 2 ranks x 2 micro-batches of 256 tokens."""
    folder = tmp_path_factory.mktemp("replay")
    job = f"rp{np.random.default_rng().integers(16**8):08x}"
    return make_job(folder, job, kafka_bootstrap, 60, _uniform)


def _config(spec: JobSpec) -> dict:
    return spec.kafka.client_config()


def _ids_and_tokens(batches: list[Batch]) -> Counter[tuple[str, bytes]]:
    return Counter((s.sample_id, s.tokens.tobytes()) for b in batches for s in b.samples())


# -- under the job's own shape: the same bytes ---------------------------------------------------------


@pytest.mark.parametrize(
    ("shape", "lengths", "samples", "from_step", "extra"),
    [
        ((2, 2, 256), _uniform, 40, 0, {}),
        ((3, 1, 512), _long_tail, 100, 4, {}),
        ((1, 4, 64), _tiny, 500, 2, {}),
        ((2, 2, 512), _long_tail, 100, 3, {"long_context": {"min_length": 300, "token_share": 0.3}}),
    ],
    ids=["uniform-2x2", "long-tail-3x1", "tiny-1x4", "long-context-2x2"],
)
def test_a_replay_under_the_same_shape_writes_the_same_bytes(
    kafka_bootstrap: str,
    tmp_path: Path,
    unique_name: str,
    shape: tuple[int, int, int],
    lengths: Lengths,
    samples: int,
    from_step: int,
    extra: dict,
) -> None:
    ranks, micro_batches, capacity = shape
    step = {"ranks": ranks, "micro_batches": micro_batches, "tokens_per_micro_batch": capacity}
    spec = make_job(tmp_path, unique_name, kafka_bootstrap, samples, lengths, step=step, **extra)
    target = f"{unique_name}-r"
    summary = replay(spec, _config(spec), ReplayRequest(target, from_step))
    original_steps, original_end = steps_of(kafka_bootstrap, spec.job, ranks)
    assert summary.mode is ReplayMode.RERUN and summary.finished
    assert list(summary.written) == list(range(from_step, len(original_steps)))
    audit = verify(_config(spec), spec.job, target, from_step)
    assert audit.mismatch is None and audit.end
    assert audit.steps == len(original_steps) - from_step > 3
    replayed, end = steps_of(kafka_bootstrap, target, ranks)
    assert end == original_end == len(original_steps)
    assert [[b.sample_ids for b in step] for step in replayed] == [
        [b.sample_ids for b in step] for step in original_steps[from_step:]
    ]


# -- under another number of ranks: the same samples per step ---------------------------------------------


@pytest.mark.parametrize("ranks", [1, 3])
def test_a_replay_to_another_rank_count_keeps_every_step_s_samples(
    kafka_bootstrap: str, original: JobSpec, unique_name: str, ranks: int
) -> None:
    summary = replay(original, _config(original), ReplayRequest(unique_name, 2, ranks=ranks))
    micro_batches = default_micro_batches(2, 2, ranks)
    assert summary.mode is ReplayMode.REPLAN and summary.finished
    assert (summary.shape.ranks, summary.shape.micro_batches) == (ranks, micro_batches)
    before, before_end = steps_of(kafka_bootstrap, original.job, 2)
    after, after_end = steps_of(kafka_bootstrap, unique_name, ranks)
    assert after_end == before_end == len(before)
    assert len(after) == len(before) - 2
    for old, new in zip(before[2:], after, strict=True):
        assert [b.step for b in new] == [old[0].step] * ranks
        assert [(b.rank, b.ranks, b.micro_batches, b.capacity) for b in new] == [
            (r, ranks, micro_batches, 256) for r in range(ranks)
        ]
        assert _ids_and_tokens(new) == _ids_and_tokens(old), f"step {old[0].step}: other samples"
        assert max(_ids_and_tokens(new).values()) == 1
        assert all(b.micro_batch_tokens().max(initial=0) <= 256 for b in new)
    audit = verify(_config(original), original.job, unique_name, 2)
    assert audit.mismatch is None and audit.steps == len(after) and audit.end


@settings(deadline=None, max_examples=60)
@given(
    seed=st.integers(0, 2**32 - 1),
    ranks=st.integers(1, 4),
    micro_batches=st.integers(1, 3),
    new_ranks=st.integers(1, 6),
    capacity=st.integers(1, 200),
)
def test_reshaping_a_step_places_every_sample_once_within_capacity(
    seed: int, ranks: int, micro_batches: int, new_ranks: int, capacity: int
) -> None:
    rng = np.random.default_rng(seed)
    batches = [random_batch(rng, 5, r, ranks, micro_batches, capacity) for r in range(ranks)]
    new_micro_batches = default_micro_batches(ranks, micro_batches, new_ranks)
    reshaped = reshape_step(batches, new_ranks, new_micro_batches, COST)
    assert [(b.step, b.rank, b.ranks, b.micro_batches, b.capacity) for b in reshaped] == [
        (5, r, new_ranks, new_micro_batches, capacity) for r in range(new_ranks)
    ]
    assert _ids_and_tokens(reshaped) == _ids_and_tokens(batches)
    assert all(b.micro_batch_tokens().max(initial=0) <= capacity for b in reshaped)
    assert reshape_step(batches, new_ranks, new_micro_batches, COST)[0].records == reshaped[0].records


def test_a_step_that_cannot_fit_names_the_step_and_the_micro_batches_to_give() -> None:
    def sample(rank: int, micro_batch: int) -> Sample:
        return Sample(f"a/file/{rank}-{micro_batch}", "a", np.full(60, rank, np.int32))

    # Four samples of 60 tokens: one per micro-batch of 100 tokens, whatever the shape.
    batches = [
        Batch.from_samples(step=9, rank=r, ranks=2, capacity=100, micro_batches=[[sample(r, 0)], [sample(r, 1)]])
        for r in range(2)
    ]
    for ranks, micro_batches in ((1, 1), (1, 3), (3, 1)):
        shape = rf"{ranks} ranks x {micro_batches} micro-batches of 100 tokens"
        with pytest.raises(
            ReshapeError, match=rf"step 9: its 4 samples \(240 tokens, .*{shape}; .*--micro-batches \(\d always fits\)"
        ):
            reshape_step(batches, ranks, micro_batches, COST)
    assert len(reshape_step(batches, 1, 4, COST)[0].micro_batch_tokens()) == 4


# -- stopping and continuing -------------------------------------------------------------------------------


@pytest.mark.parametrize("ranks", [None, 3], ids=["same-shape", "three-ranks"])
def test_a_stopped_replay_continues_without_repeats(
    kafka_bootstrap: str, original: JobSpec, unique_name: str, ranks: int | None
) -> None:
    config = _config(original)
    first = replay(original, config, ReplayRequest(unique_name, 1, to_step=6, ranks=ranks))
    assert list(first.written) == list(range(1, 7)) and not first.finished and first.steps == 7
    again = replay(original, config, ReplayRequest(unique_name, 1, to_step=6, ranks=ranks))
    assert len(again.written) == 0 and again.steps == 7  # nothing left up to step 6: nothing written twice
    rest = replay(original, config, ReplayRequest(unique_name, 1, ranks=ranks))
    before, _ = steps_of(kafka_bootstrap, original.job, 2)
    assert list(rest.written) == list(range(7, len(before))) and rest.finished
    after, end = steps_of(kafka_bootstrap, unique_name, ranks or 2)
    assert [step[0].step for step in after] == list(range(1, len(before))) and end == len(before)
    ids = Counter(i for step in after for b in step for i in b.sample_ids)
    assert max(ids.values()) == 1
    assert verify(config, original.job, unique_name, 1).mismatch is None
    done = replay(original, config, ReplayRequest(unique_name, 1, ranks=ranks))
    assert len(done.written) == 0 and done.finished


def test_the_constructor_goes_on_with_a_replayed_job_under_the_new_shape(
    kafka_bootstrap: str, original: JobSpec, unique_name: str, tmp_path: Path
) -> None:
    replay(original, _config(original), ReplayRequest(unique_name, 3, to_step=8, ranks=3))
    wider = yaml.safe_load(write_replay_spec(tmp_path, original.job, kafka_bootstrap).read_text())
    wider["step"] = {"ranks": 3, "micro_batches": 2, "tokens_per_micro_batch": 256}
    path = tmp_path / "wider.yaml"
    path.write_text(yaml.safe_dump(wider))
    stats = construct(load_spec(path), output_job=unique_name)
    assert stats.finished and stats.first_step == 9
    before, _ = steps_of(kafka_bootstrap, original.job, 2)
    after, end = steps_of(kafka_bootstrap, unique_name, 3)
    assert after[0][0].step == 3 and end == 3 + len(after)
    # Steps 0-2 of the original, then the replayed job: every sample of the sources exactly once.
    delivered = Counter(i for step in before[:3] + after for b in step for i in b.sample_ids)
    assert max(delivered.values()) == 1
    assert set(delivered) == {i for step in before for b in step for i in b.sample_ids}


# -- the trainer sink on a replayed job ----------------------------------------------------------------------


def _take(dataset: KafkaBatchDataset, n: int) -> list[dict]:
    iterator = iter(dataset)
    out = [next(iterator) for _ in range(n)]
    iterator.close()
    return out


def test_the_sink_resumes_on_a_replayed_job_at_the_step_it_checkpointed(
    kafka_bootstrap: str, original: JobSpec, unique_name: str
) -> None:
    replay(original, _config(original), ReplayRequest(unique_name, 2, ranks=3))
    sinks = {r: KafkaBatchDataset(job=original.job, bootstrap_servers=kafka_bootstrap, rank=r) for r in range(2)}
    for sink in sinks.values():
        _take(sink, 5 * 2)  # steps 0-4, two micro-batches each
    before, _ = steps_of(kafka_bootstrap, original.job, 2)
    resumed = []
    for new_rank in range(3):
        dataset = KafkaBatchDataset(job=unique_name, bootstrap_servers=kafka_bootstrap, rank=new_rank)
        dataset.load_state_dict(sinks[new_rank % 2].state_dict())  # any old rank's state will do
        resumed.append(list(dataset))
    for micro_batches in resumed:
        assert micro_batches[0]["step"] == 5 and micro_batches[0]["micro_batch"] == 0
        assert [mb["step"] for mb in micro_batches] == [s for s in range(5, len(before)) for _ in range(2)]
    got = Counter(i for micro_batches in resumed for mb in micro_batches for i in mb["sample_ids"])
    assert got == Counter(i for step in before[5:] for b in step for i in b.sample_ids)


def test_the_sink_resumes_mid_step_on_a_same_shape_replay_but_not_on_another_shape(
    kafka_bootstrap: str, original: JobSpec, unique_name: str
) -> None:
    same, wider = f"{unique_name}-same", f"{unique_name}-wide"
    replay(original, _config(original), ReplayRequest(same, 2))
    replay(original, _config(original), ReplayRequest(wider, 2, ranks=3))
    sink = KafkaBatchDataset(job=original.job, bootstrap_servers=kafka_bootstrap, rank=1)
    _take(sink, 7)  # steps 0-2 and the first micro-batch of step 3
    expected = list(KafkaBatchDataset(job=original.job, bootstrap_servers=kafka_bootstrap, rank=1))[7:]
    on_same = KafkaBatchDataset(job=same, bootstrap_servers=kafka_bootstrap, rank=1)
    on_same.load_state_dict(sink.state_dict())
    got = list(on_same)
    assert [(mb["step"], mb["micro_batch"], mb["sample_ids"]) for mb in got] == [
        (mb["step"], mb["micro_batch"], mb["sample_ids"]) for mb in expected
    ]
    assert all(g["input_ids"].equal(e["input_ids"]) for g, e in zip(got, expected, strict=True))
    on_wider = KafkaBatchDataset(job=wider, bootstrap_servers=kafka_bootstrap, rank=0)
    on_wider.load_state_dict(sink.state_dict())
    with pytest.raises(MixflowError, match=r"middle of step 3 .* 2 micro-batches on 2 ranks, here it has 2 on 3"):
        next(iter(on_wider))


# -- bad inputs ----------------------------------------------------------------------------------------------


def _cli(
    capsys: pytest.CaptureFixture[str], job: str, bootstrap: str, folder: Path, *args: str
) -> tuple[int, str, str]:
    """``mixflow replay`` with the spec ``job`` ran with (the fixture's): exit code, stdout, stderr."""
    spec = write_replay_spec(folder, job, bootstrap)
    code = main(["replay", "--spec", str(spec), *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_bad_inputs_are_refused_naming_them(
    kafka_bootstrap: str, original: JobSpec, unique_name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    steps = len(steps_of(kafka_bootstrap, original.job, 2)[0])
    cases = [
        (["--from-step", str(steps), "--to-job", unique_name], f"--from-step {steps} is not a step job {original.job}"),
        (["--from-step", "0", "--to-job", original.job], f"--to-job {original.job} is the job being replayed"),
        (["--from-step", "3", "--to-step", "2", "--to-job", unique_name], "--to-step 2 is not a step from 3"),
        (["--from-step", "0", "--to-job", "bad.name"], "job name 'bad.name' holds characters"),
        (["--from-step", "0", "--to-job", unique_name, "--ranks", "1", "--micro-batches", "1"], "give a larger"),
    ]
    for args, message in cases:
        code, _, err = _cli(capsys, original.job, kafka_bootstrap, tmp_path, *args)
        assert code == 2 and message in err, (args, err[-2000:])
    code, _, err = _cli(
        capsys, f"{unique_name}-nope", kafka_bootstrap, tmp_path, "--from-step", "0", "--to-job", unique_name
    )
    assert code == 4 and f"job '{unique_name}-nope' does not exist at" in err, err[-2000:]
    middle = steps // 2  # how many steps the job wrote depends on how full composition makes them
    code, out, err = _cli(
        capsys, original.job, kafka_bootstrap, tmp_path, "--from-step", str(middle), "--to-job", unique_name, "--verify"
    )
    assert code == 0, err[-2000:]
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["steps_replayed"] == steps - middle and summary["verify"]["mismatch"] is None


def _history(steps: int, finished: bool) -> JobHistory:
    def record(step: int, done: bool = False) -> StateRecord:
        state = ConstructorState(MixerState(step, {"a": 0.0}), {"a": SourcePosition(step * 10)}, finished=done)
        return StateRecord(state, str(max(step - 1, 0)).encode(), state.to_bytes())

    records = [record(k) for k in range(1, steps + 1)] + ([record(steps, True)] if finished else [])
    return JobHistory("orig", tuple(records), StepShape(2, 2, 256))


def test_plan_replay_continues_only_its_own_progress() -> None:
    original, shape = _history(10, True), StepShape(2, 2, 256)
    fresh = plan_replay(ReplayRequest("new", 4), original, shape, None, None)
    assert (fresh.first, fresh.last, fresh.end, fresh.done) == (4, 9, True, False)
    assert fresh.start_state == original.records[3].state  # written with step 3: the next step is 4
    partial = JobHistory("new", original.records[3:6], shape)
    assert plan_replay(ReplayRequest("new", 4), original, shape, partial, 4).first == 6
    with pytest.raises(MixflowError, match="holds a replay from step 4, not 3"):
        plan_replay(ReplayRequest("new", 3), original, shape, partial, 4)
    other = JobHistory("new", (_history(3, False).records[0], *original.records[4:6]), shape)
    assert plan_replay(ReplayRequest("new", 4), original, shape, other, 4).first == 6
    elsewhere = ConstructorState(MixerState(6, {"a": 0.0}), {"a": SourcePosition(999)})
    stranger = JobHistory("new", (StateRecord(elsewhere, b"5", elsewhere.to_bytes()),), shape)
    with pytest.raises(MixflowError, match="is not a replay of orig"):
        plan_replay(ReplayRequest("new", 4), original, shape, stranger, 4)
    ended = plan_replay(ReplayRequest("new", 4), original, shape, JobHistory("new", original.records, shape), 4)
    assert ended.done
    with pytest.raises(MixflowError, match=r"the spec's step shape \(3 ranks"):
        plan_replay(ReplayRequest("new", 4), original, StepShape(3, 2, 256), None, None)
    replan = plan_replay(ReplayRequest("new", 4, ranks=3), original, StepShape(3, 2, 256), None, None)
    assert replan.mode is ReplayMode.REPLAN and replan.shape == StepShape(3, 2, 256)
    with pytest.raises(MixflowError, match="holds steps of shape 2 ranks"):
        plan_replay(ReplayRequest("new", 4, ranks=3), original, shape, partial, 4)


def test_verify_reports_the_first_step_that_differs(
    kafka_bootstrap: str, original: JobSpec, unique_name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _config(original)
    replay(original, config, ReplayRequest(unique_name, 4, to_step=6))
    # Step 7 written by something else: other batches, with the state record the replay would have written.
    history = require_history(config, original.job)
    state = history.before(8)
    assert state is not None
    rng = np.random.default_rng(0)
    producer = Producer({**config, "transactional.id": f"{unique_name}.constructor"})
    producer.init_transactions(30)
    producer.begin_transaction()
    for rank in range(2):
        key, value, headers = encode_batch(random_batch(rng, 7, rank, 2, 2, 256))
        producer.produce(JobTopics(unique_name).rank(rank), value, key=key, headers=headers)
    producer.produce(JobTopics(unique_name).state, adopted(state.state).to_bytes(), key=state.key)
    producer.commit_transaction(30)
    code, out, err = _cli(
        capsys, original.job, kafka_bootstrap, tmp_path, "--from-step", "4", "--to-step", "7", "--to-job", unique_name,
        "--verify",
    )  # fmt: skip
    summary = json.loads(out.strip().splitlines()[-1])
    assert code == 1 and "mismatch: step 7 rank 0:" in err, err[-2000:]
    assert summary["steps_replayed"] == 0 and summary["verify"]["steps_compared"] == 3
