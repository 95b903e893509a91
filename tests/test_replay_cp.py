"""``mixflow replay`` of context-parallel jobs on the broker: under the job's own shape the same bytes; over
another number of ranks of the data x context mesh every step holds exactly its samples, whole from their slices,
each once, planned as the constructor of the new shape plans them (``plan_cp_step`` over it); the constructor goes
on from such a replay; what the mode cannot do over the ranks asked for is refused in one line."""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from confluent_kafka import Message

from pipeline.cli import main
from pipeline.planning.scheduler.context_parallel import plan_cp_step
from pipeline.planning.scheduler.cp_plan import CPShape
from pipeline.planning.step.assemble_cp import build_cp_batches
from pipeline.spec import JobSpec, load_spec
from pipeline.tools.replay import ReplayMode, ReplayRequest, replay, verify
from tests.cp_replay_support import step_samples, values
from tests.length_families import draw_lengths
from tests.replay_support import construct, make_job, write_replay_spec
from topics.formats.batch_codec import decode_any_batch_message, end_of_data_steps
from topics.formats.cp_batch import CPBatch
from topics.formats.names import JobTopics
from topics.kafka.log_reader import read_to_end
from trainer_sink import KafkaBatchDataset

RANKS, CAPACITY = 4, 64
JOBS = {
    # mode: (its size, the length family of its samples)
    "static": (2, "bimodal"),
    "aligned": (4, "lognormal"),
    "free": (3, "uniform"),
}


def _step(mode: str, ranks: int = RANKS, micro_batches: int = 2) -> dict:
    size, _ = JOBS[mode]
    cp = {"mode": mode, "size": size}
    return {"ranks": ranks, "micro_batches": micro_batches, "tokens_per_micro_batch": CAPACITY, "context_parallel": cp}


def _lengths(family: str, longest: int, rng: np.random.Generator, n: int) -> np.ndarray:
    return draw_lengths(family, rng, n, longest)


@pytest.fixture(scope="module")
def jobs(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], JobSpec]:
    """The finished context-parallel job of a mode, of 4 ranks x 2 micro-batches of 64 tokens: made on first use,
    once for the module."""

    @functools.cache
    def made(mode: str) -> JobSpec:
        size, family = JOBS[mode]
        folder = tmp_path_factory.mktemp(f"cp-replay-{mode}")
        name = f"cr{mode[:2]}{np.random.default_rng().integers(16**8):08x}"
        lengths = functools.partial(_lengths, family, 2 * size * (CAPACITY // 2))
        return make_job(folder, name, kafka_bootstrap, 14, lengths, step=_step(mode))

    return made


@pytest.fixture
def job(jobs: Callable[[str], JobSpec], request: pytest.FixtureRequest) -> JobSpec:
    """The job of the mode the test is parametrized with."""
    return jobs(request.param)


def _records(bootstrap: str, job: str, ranks: int) -> tuple[list[list[Message]], int | None]:
    """Per step, each rank's record; and the step count of the end-of-data record (None if none)."""
    per_rank = [read_to_end({"bootstrap.servers": bootstrap}, JobTopics(job).rank(r)) for r in range(ranks)]
    ends = {end_of_data_steps(records[-1].headers()) if records else None for records in per_rank}
    assert len(ends) == 1
    batches = [[m for m in records if end_of_data_steps(m.headers()) is None] for records in per_rank]
    return [list(step) for step in zip(*batches, strict=True)], ends.pop()


def _decoded(messages: list[Message]) -> list[CPBatch]:
    batches = [decode_any_batch_message(m) for m in messages]
    assert all(isinstance(b, CPBatch) for b in batches)
    return batches  # type: ignore[return-value]


ALL_MODES = pytest.mark.parametrize("job", list(JOBS), indirect=True)


@ALL_MODES
def test_a_replay_under_the_job_s_shape_writes_the_same_bytes(
    kafka_bootstrap: str, job: JobSpec, unique_name: str
) -> None:
    config = job.kafka.client_config()
    original, end = _records(kafka_bootstrap, job.job, RANKS)
    first = len(original) - 3
    summary = replay(job, config, ReplayRequest(unique_name, first))
    assert summary.mode is ReplayMode.RERUN and summary.finished
    assert list(summary.written) == list(range(first, len(original))) and first >= 1
    audit = verify(config, job.job, unique_name, first, summary.mode)
    assert audit.mismatch is None and audit.end and audit.steps == 3
    replayed, replayed_end = _records(kafka_bootstrap, unique_name, RANKS)
    assert replayed_end == end
    assert [[m.value() for m in step] for step in replayed] == [[m.value() for m in step] for step in original[first:]]


@pytest.mark.parametrize(
    ("job", "ranks"),
    [("static", 8), ("static", 2), ("aligned", 8), ("free", 3)],
    ids=["static-4-to-8", "static-4-to-2", "aligned-4-to-8", "free-4-to-3"],
    indirect=["job"],
)
def test_an_elastic_replay_plans_each_step_as_a_constructor_of_the_new_shape(
    kafka_bootstrap: str, job: JobSpec, unique_name: str, ranks: int
) -> None:
    mode = job.step.context_parallel.mode if job.step.context_parallel else ""
    config = job.kafka.client_config()
    summary = replay(job, config, ReplayRequest(unique_name, 0, ranks=ranks))
    shape = summary.context_parallel
    assert summary.mode is ReplayMode.REPLAN and summary.finished and isinstance(shape, CPShape)
    assert (shape.ranks, shape.mode.value, shape.capacity) == (ranks, mode, CAPACITY)
    assert shape.micro_batches == -(-RANKS * 2 // ranks)
    original, end = _records(kafka_bootstrap, job.job, RANKS)
    replayed, replayed_end = _records(kafka_bootstrap, unique_name, ranks)
    assert replayed_end == end == len(original) == len(replayed)
    cost = job.cost.context_parallel_cost()
    planned_alike = 0
    for old, new in zip(original, replayed, strict=True):
        samples = step_samples(_decoded(old))
        batches = _decoded(new)
        assert [(b.rank, b.ranks, b.mode) for b in batches] == [(r, ranks, mode) for r in range(ranks)]
        assert sorted((s.sample_id, s.tokens.tobytes()) for s in step_samples(batches)) == sorted(
            (s.sample_id, s.tokens.tobytes()) for s in samples
        )
        direct = plan_cp_step(np.array([s.length for s in samples]), shape, cost)
        if direct.placed_mask.all():
            assert [m.value() for m in new] == values(build_cp_batches(batches[0].step, direct, samples))
            planned_alike += 1
    assert planned_alike >= len(original) - 1, f"{planned_alike} of {len(original)} steps as plan_cp_step's alone"
    audit = verify(config, job.job, unique_name, 0, summary.mode)
    assert audit.mismatch is None and audit.end and audit.steps == len(original)


@pytest.mark.parametrize("job", ["aligned"], indirect=True)
def test_the_constructor_goes_on_from_a_stopped_and_continued_elastic_replay(
    kafka_bootstrap: str, job: JobSpec, unique_name: str, tmp_path: Path
) -> None:
    config = job.kafka.client_config()
    first = replay(job, config, ReplayRequest(unique_name, 1, to_step=2, ranks=8))
    more = replay(job, config, ReplayRequest(unique_name, 1, to_step=3, ranks=8))
    assert list(first.written) == [1, 2] and list(more.written) == [3] and not more.finished
    shape = more.context_parallel
    assert shape is not None
    step = _step(shape.mode.value, 8, shape.micro_batches)
    step["context_parallel"]["max_micro_batches"] = shape.max_micro_batches
    wider = load_spec(write_replay_spec(tmp_path, job.job, kafka_bootstrap, step=step))
    stats = construct(wider, output_job=unique_name)
    assert stats.finished and stats.first_step == 4
    original, _ = _records(kafka_bootstrap, job.job, RANKS)
    after, end = _records(kafka_bootstrap, unique_name, 8)
    assert _decoded(after[0])[0].step == 1 and end == 1 + len(after)
    delivered = Counter(s.sample_id for step in [original[0], *after] for s in step_samples(_decoded(step)))
    assert max(delivered.values()) == 1
    assert set(delivered) == {s.sample_id for step in original for s in step_samples(_decoded(step))}


@pytest.mark.parametrize("job", ["aligned"], indirect=True)
def test_the_sinks_of_the_new_ranks_resume_at_the_step_an_old_rank_checkpointed(
    kafka_bootstrap: str, job: JobSpec, unique_name: str
) -> None:
    replay(job, job.kafka.client_config(), ReplayRequest(unique_name, 0, ranks=8))
    old = [list(KafkaBatchDataset(job=job.job, bootstrap_servers=kafka_bootstrap, rank=r)) for r in range(RANKS)]
    sink = KafkaBatchDataset(job=job.job, bootstrap_servers=kafka_bootstrap, rank=1)
    iterator = iter(sink)
    for _ in range(sum(mb["step"] < 2 for mb in old[1])):  # rank 1's micro-batches of steps 0 and 1
        next(iterator)
    iterator.close()
    resumed = []
    for rank in range(8):
        dataset = KafkaBatchDataset(job=unique_name, bootstrap_servers=kafka_bootstrap, rank=rank)
        dataset.load_state_dict(sink.state_dict())
        resumed.append(list(dataset))
    assert all(micro_batches[0]["step"] == 2 for micro_batches in resumed)

    def firsts(micro_batches: list[dict]) -> Counter[str]:  # each sample once: on its block's first rank
        return Counter(i for mb in micro_batches if mb["cp_rank"] == 0 for i in mb["sample_ids"])

    got = sum((firsts(mbs) for mbs in resumed), Counter())
    assert got == sum((firsts([mb for mb in mbs if mb["step"] >= 2]) for mbs in old), Counter())
    assert got and max(got.values()) == 1


@pytest.mark.parametrize("job", ["static", "aligned"], indirect=True)
def test_what_the_mode_cannot_do_is_refused_in_one_line(
    kafka_bootstrap: str, job: JobSpec, unique_name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mode = job.step.context_parallel.mode if job.step.context_parallel else ""

    def cli(*args: str, **spec: object) -> tuple[int, str]:
        path = write_replay_spec(tmp_path, job.job, kafka_bootstrap, **spec)
        code = main(["replay", "--spec", str(path), "--from-step", "0", "--to-job", unique_name, *args])
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1, err
        return code, err

    code, err = cli(step={"ranks": RANKS, "micro_batches": 2, "tokens_per_micro_batch": CAPACITY})
    assert code == 2 and f"plans {mode} context parallelism per sample and the spec has no step.context_parallel" in err
    if mode == "static":
        code, err = cli("--ranks", "3", step=_step(mode))
        assert code == 2 and "--ranks 3 is not a multiple of 2: the job's static context parallelism" in err
    if mode == "aligned":  # the job's longer samples need a block of 4 ranks of 64 tokens
        code, err = cli("--ranks", "2", step=_step(mode))
        assert code == 2 and " tokens fits no block of aligned context parallelism over 2 ranks (blocks of at" in err
