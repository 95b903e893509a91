"""Constructor lanes: lane j of C builds the steps k with k mod C == j from partition j of every source
topic into partition j of every rank and state topic; the sink reads step k from partition k mod C.

Pure parts (step and unit partitions, the sink's order over partitions) are property tests; against the
broker: the loaders put each unit's samples in the source partition topics/FORMAT.md states; a job of 2 and
3 lanes delivers every sample exactly once and the sink yields its steps in order (and resumes anywhere);
each lane is deterministic (the same bytes into another output job); and lanes killed at random and
restarted write what an undisturbed run wrote.
"""

from __future__ import annotations

import contextlib
import itertools
import random
import re
import signal
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from hypothesis import given
from hypothesis import strategies as st

from connectors import Document, WorkUnit
from pipeline.roles.constructor import ConstructorOptions, DataConstructor
from pipeline.roles.loader.source_runtime import SourceRuntime
from pipeline.spec import SpecError, load_spec
from pipeline.tools.chaos.audit import check_samples, read_rank_topic
from pipeline.tools.replay.plan import ReplayRequest
from pipeline.tools.replay.run import replay
from tests.loader_support import (
    SOURCES,
    build_example_data,
    committed_sample_ids,
    start_constructor,
    start_loader,
    wait_all,
    write_spec,
)
from tests.sink_support import random_batch
from topics.errors import MixflowError
from topics.formats.batch import Batch
from topics.formats.batch_codec import encode_batch, encode_end_of_data, end_of_data_steps
from topics.formats.lanes import LaneOrder, first_step_at_or_after, step_lane, unit_partition
from topics.formats.names import JobTopics, TopicKind, parse_topic
from topics.formats.sample_codec import decode_sample_message
from topics.kafka.admin import ensure_job_topics, job_layout
from topics.kafka.log_reader import read_to_end
from trainer_sink import KafkaBatchDataset, ReadOptions
from trainer_sink.tensors import micro_batch_tensors

RANKS = 2
FORMAT_MD = Path(__file__).resolve().parent.parent / "topics" / "FORMAT.md"

# -- pure parts ------------------------------------------------------------------------------------


@given(st.integers(0, 10**9), st.integers(1, 64))
def test_a_step_belongs_to_one_lane_and_each_lane_s_next_step_is_found(step: int, lanes: int) -> None:
    lane = step_lane(step, lanes)
    assert 0 <= lane < lanes and (step - lane) % lanes == 0
    for other in range(min(lanes, 8)):
        first = first_step_at_or_after(step, other, lanes)
        assert step <= first < step + lanes and step_lane(first, lanes) == other


@given(
    lanes=st.integers(1, 8),
    units=st.lists(st.integers(0, 40), min_size=1, max_size=8),
    gap=st.integers(0, 3),
)
def test_units_spread_over_the_lanes_evenly_and_deterministically(lanes: int, units: list[int], gap: int) -> None:
    """``units[p]`` units on work partition ``p``, at consecutive offsets from ``gap`` (a transaction
    marker or an earlier plan before them): every lane gets its fair share of each partition's units
    within one unit, and the same unit always goes to the same lane."""
    for p, n in enumerate(units):
        places = [p + gap + offset for offset in range(n)]
        lanes_of = [unit_partition(place, lanes) for place in places]
        assert lanes_of == [unit_partition(place, lanes) for place in places]
        counts = Counter(lanes_of)
        assert all(0 <= lane < lanes for lane in counts)
        assert max(counts.values(), default=0) - min((counts.get(j, 0) for j in range(lanes)), default=0) <= 1


def documented_source_partition() -> Callable[[int, int, int], int]:
    """The source partition of a unit's samples as topics/FORMAT.md states it (the ``partition = ...`` of its
    *Source topics* rule), as a function of the work record's partition and offset and the lanes ``C``."""
    text = FORMAT_MD.read_text(encoding="utf-8")
    rule = text[text.index("- **Source topics.**") :]
    rule = rule[: rule.index("\n- **")]
    stated = re.search(r"`partition = ([^`]+)`", rule)
    assert stated is not None, "FORMAT.md's Source topics rule states no `partition = ...`"
    code = compile(stated.group(1).replace(" mod ", " % "), "FORMAT.md", "eval")
    names = ("work_partition", "work_offset", "C")
    assert set(code.co_names) <= set(names), f"FORMAT.md's rule names {code.co_names}, not only {names}"
    return lambda p, o, c: eval(code, {"__builtins__": {}}, dict(zip(names, (p, o, c), strict=True)))


@given(work_partition=st.integers(0, 63), work_offset=st.integers(0, 10**12), lanes=st.integers(1, 64))
def test_format_md_s_source_partition_is_the_one_the_loaders_compute(
    work_partition: int, work_offset: int, lanes: int
) -> None:
    """What a loader computes from a work record's place (``unit_partition``), for any place and lane count."""
    expected = unit_partition(work_partition + work_offset, lanes)
    assert documented_source_partition()(work_partition, work_offset, lanes) == expected


def _lane_logs(lanes: int, ends: list[int]) -> dict[int, list[tuple[str, int]]]:
    """Per partition, what a lane that stopped before ``ends[j]`` wrote: its batches, then its end record."""
    return {
        j: [("batch", k) for k in range(j, ends[j], lanes)] + [("end", ends[j])] for j in range(lanes)
    }  # fmt: skip


def _read_in_order(order: LaneOrder, logs: dict[int, list[tuple[str, int]]]) -> list[int]:
    """Steps a reader following ``order`` yields from the partitions' ``logs``."""
    position = dict.fromkeys(logs, 0)
    steps = []
    while not order.done:
        due = order.partition()
        kind, value = logs[due][position[due]]
        position[due] += 1
        problem = order.batch(due, value) if kind == "batch" else order.end(due, value)
        assert problem is None, problem
        if kind == "batch":
            steps.append(value)
    return steps


@st.composite
def lane_jobs(draw: st.DrawFn) -> tuple[int, list[int]]:
    """A lane count and each lane's end: lane j wrote j, j+C, ... below its end (lanes end close together,
    or one far behind)."""
    lanes = draw(st.integers(1, 6))
    spread = draw(st.sampled_from([1, 3, 40]))
    base = draw(st.integers(0, 30))
    ends = [first_step_at_or_after(base + draw(st.integers(0, spread)), j, lanes) for j in range(lanes)]
    return lanes, ends


@given(lane_jobs(), st.integers(0, 80))
def test_the_sink_order_yields_every_written_step_in_order_from_any_resume_point(
    job: tuple[int, list[int]], resume_at: int
) -> None:
    lanes, ends = job
    written = sorted(k for j in range(lanes) for k in range(j, ends[j], lanes))
    assert _read_in_order(LaneOrder(lanes), _lane_logs(lanes, ends)) == written
    # Resumed at a step: each partition is read from its first record of that step or later (what
    # step_index.locate_step finds), or from its end record when the lane ended before.
    logs = {
        j: [(kind, v) for kind, v in log if kind == "end" or v >= resume_at]
        for j, log in _lane_logs(lanes, ends).items()
    }
    assert _read_in_order(LaneOrder(lanes, resume_at), logs) == [k for k in written if k >= resume_at]


@given(lane_jobs(), st.data())
def test_a_missing_or_repeated_step_is_named(job: tuple[int, list[int]], data: st.DataObject) -> None:
    lanes, ends = job
    logs = _lane_logs(lanes, ends)
    batches = [(j, i) for j, log in logs.items() for i, (kind, _) in enumerate(log) if kind == "batch"]
    if not batches:
        return
    j, i = data.draw(st.sampled_from(batches))
    if data.draw(st.booleans()):
        del logs[j][i]
    else:
        logs[j].insert(i, logs[j][i])
    with pytest.raises(AssertionError, match="was due"):
        _read_in_order(LaneOrder(lanes), logs)


def test_the_layout_gives_source_rank_and_state_topics_a_partition_per_lane() -> None:
    for lanes in (1, 2, 5):
        for spec in job_layout("j", ["web", "code"], 3, lanes=lanes):
            kind = parse_topic(spec.name).kind
            expected = lanes if kind in (TopicKind.SRC, TopicKind.RANK, TopicKind.STATE) else None
            assert spec.partitions == (expected or (8 if kind is TopicKind.WORK else 1)), spec
    with pytest.raises(ValueError, match="lanes"):
        job_layout("j", ["web"], 1, lanes=0)


def test_the_spec_s_lanes_default_to_one_and_a_bad_count_names_the_field(tmp_path: Path) -> None:
    data = tmp_path / "data"
    assert load_spec(write_spec(tmp_path, "j", "127.0.0.1:1", data)).constructor.lanes == 1
    assert load_spec(write_spec(tmp_path, "j", "127.0.0.1:1", data, constructor={"lanes": 3})).constructor.lanes == 3
    with pytest.raises(SpecError, match=r"constructor\.lanes"):
        load_spec(write_spec(tmp_path, "j", "127.0.0.1:1", data, constructor={"lanes": 0}))


def test_a_lane_outside_the_spec_and_a_replay_of_lanes_are_refused_with_the_reason(tmp_path: Path) -> None:
    spec = load_spec(write_spec(tmp_path, "j", "127.0.0.1:1", tmp_path / "data", constructor={"lanes": 2}))
    config = spec.kafka.client_config()
    with pytest.raises(MixflowError, match=r"lane 2 is not below the spec's constructor\.lanes \(2\)"):
        DataConstructor(spec, config, ConstructorOptions(lane=2))
    with pytest.raises(MixflowError, match=r"constructor\.lanes 2, and replay supports one lane only"):
        replay(spec, config, ReplayRequest(target="j-replayed", from_step=0))


# -- the sink over lanes, on rank topics written directly --------------------------------------------

MICRO_BATCHES, CAPACITY = 2, 256


def _write_lanes(bootstrap: str, job: str, lanes: int, ends: list[int], seed: int) -> dict[int, list[Batch]]:
    """Rank topics of ``lanes`` partitions as lane constructors write them: lane j's steps below ``ends[j]``
    in partition j, each step one transaction, lanes interleaved at random, then each lane's end record.
    Returns each rank's batches by step order."""
    ensure_job_topics(bootstrap, job, ["s0"], RANKS, lanes=lanes, timeout_s=60)
    rng = np.random.default_rng(seed)
    topics = JobTopics(job)
    producers = []
    for j in range(lanes):
        producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"{job}-lane{j}"})
        producer.init_transactions(30)
        producers.append(producer)
    pending = {j: list(range(j, ends[j], lanes)) for j in range(lanes)}  # a lane leaves once its end is written
    by_rank: dict[int, list[Batch]] = {r: [] for r in range(RANKS)}
    written: list[list[Batch]] = []
    while pending:
        j = int(rng.choice(sorted(pending)))
        producer = producers[j]
        producer.begin_transaction()
        if pending[j]:
            step = pending[j].pop(0)
            batches = [random_batch(rng, step, r, RANKS, MICRO_BATCHES, CAPACITY) for r in range(RANKS)]
            written.append(batches)
            for batch in batches:
                key, value, headers = encode_batch(batch)
                producer.produce(topics.rank(batch.rank), value, key=key, headers=headers, partition=j)
        else:
            key, value, headers = encode_end_of_data(ends[j])
            for r in range(RANKS):
                producer.produce(topics.rank(r), value, key=key, headers=headers, partition=j)
            del pending[j]
        producer.commit_transaction(30)
    for batches in sorted(written, key=lambda b: b[0].step):
        for batch in batches:
            by_rank[batch.rank].append(batch)
    return by_rank


def _fingerprint(micro_batch: dict) -> tuple:
    return (micro_batch["step"], micro_batch["micro_batch"], tuple(micro_batch["sample_ids"]))


@pytest.mark.kafka
@pytest.mark.parametrize(("lanes", "ends"), [(2, [12, 11]), (3, [9, 4, 11])])
def test_the_sink_reads_lanes_in_step_order_and_resumes_anywhere(
    kafka_bootstrap: str, unique_name: str, lanes: int, ends: list[int]
) -> None:
    by_rank = _write_lanes(kafka_bootstrap, unique_name, lanes, ends, seed=lanes)
    rank = 1

    def dataset() -> KafkaBatchDataset:
        return KafkaBatchDataset(
            job=unique_name,
            bootstrap_servers=kafka_bootstrap,
            rank=rank,
            read=ReadOptions(wait_timeout_s=30, prefetch_bytes=2048),
        )

    expected = [_fingerprint(mb) for b in by_rank[rank] for mb in micro_batch_tensors(b)]
    reference = [_fingerprint(mb) for mb in dataset()]
    assert reference == expected
    points = sorted({0, 1, MICRO_BATCHES + 1, len(expected), *random.Random(lanes).sample(range(len(expected)), 4)})
    for point in points:
        first = dataset()
        iterator = iter(first)
        assert [_fingerprint(mb) for mb in itertools.islice(iterator, point)] == expected[:point]
        state = first.state_dict()
        iterator.close()
        resumed = dataset()
        resumed.load_state_dict(state)
        assert [_fingerprint(mb) for mb in resumed] == expected[point:], f"resumed after {point} micro-batches"


# -- whole jobs of lanes -----------------------------------------------------------------------------


@dataclass
class LoadedLanes:
    job: str
    lanes: int
    spec: Path


@pytest.fixture(scope="module")
def lanes_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example data of 24 modules, its Parquet source cut into row groups of 2 rows, so that every
    source has units enough for every lane."""
    data = build_example_data(tmp_path_factory.mktemp("lanes") / "data", limit=24)
    for path in (data / "code").glob("*.parquet"):
        pq.write_table(pq.read_table(path), path, row_group_size=2)
    return data


def _load(lanes: int, bootstrap: str, data: Path, folder: Path) -> LoadedLanes:
    """A job of ``lanes`` lanes whose source topics are loaded (each unit in one partition)."""
    job = f"l{uuid.uuid4().hex[:8]}"
    spec = write_spec(folder, job, bootstrap, data, on_exhausted="renormalize", constructor={"lanes": lanes})
    # Created before the roles start, with time to spare on a broker busy with other tests' topics.
    ensure_job_topics(bootstrap, job, SOURCES, RANKS, lanes=lanes, timeout_s=120)
    # Small units (a row group, a file or a few rows each), so that every lane's partitions get several however
    # fast this machine reads: a unit is sized by the seconds its work measured here takes.
    wait_all([start_loader(spec, s, 0, folder, "--unit-seconds", "0.001") for s in SOURCES], 240, folder)
    return LoadedLanes(job, lanes, spec)


@pytest.fixture(scope="module")
def two_lanes(kafka_bootstrap: str, lanes_data: Path, tmp_path_factory: pytest.TempPathFactory) -> LoadedLanes:
    return _load(2, kafka_bootstrap, lanes_data, tmp_path_factory.mktemp("lanes2"))


@pytest.fixture(scope="module")
def three_lanes(kafka_bootstrap: str, lanes_data: Path, tmp_path_factory: pytest.TempPathFactory) -> LoadedLanes:
    return _load(3, kafka_bootstrap, lanes_data, tmp_path_factory.mktemp("lanes3"))


def _run_lanes(spec: Path, output_job: str, lanes: int, log: Path) -> None:
    _create(spec, output_job, lanes)
    processes = [start_constructor(spec, output_job, "--lane", str(j), log=log) for j in range(lanes)]
    deadline = time.monotonic() + 240
    for process in processes:
        try:
            code = process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for other in processes:
                other.kill()
            raise AssertionError(f"lanes did not finish; the log ends:\n{log.read_text()[-3000:]}") from None
        assert code == 0, log.read_text()[-3000:]


def _create(spec: Path, job: str, lanes: int) -> None:
    bootstrap = load_spec(spec).kafka.bootstrap_servers
    ensure_job_topics(bootstrap, job, SOURCES, RANKS, lanes=lanes, timeout_s=120)


def _partition_records(bootstrap: str, topic: str) -> dict[int, list[tuple]]:
    """Per partition, every committed record as (key, value, headers)."""
    out: dict[int, list[tuple]] = {}
    for m in read_to_end({"bootstrap.servers": bootstrap}, topic):
        out.setdefault(m.partition(), []).append((m.key(), m.value(), tuple(m.headers() or ())))
    return out


def _check_lane_layout(bootstrap: str, job: str, lanes: int) -> list[int]:
    """Every rank topic's partition j holds lane j's steps j, j+C, ... then its end record; the ends."""
    ends = []
    for r in range(RANKS):
        records = _partition_records(bootstrap, JobTopics(job).rank(r))
        rank_ends = []
        for j in range(lanes):
            headers = [dict(h) for _, _, h in records.get(j, [])]
            assert headers and "mixflow.end" in headers[-1], f"rank {r} partition {j}: no end-of-data record last"
            steps = [int(h["mixflow.step"]) for h in headers[:-1]]
            end = end_of_data_steps(list(headers[-1].items()))
            assert steps == list(range(j, end, lanes)), f"rank {r} partition {j}: steps {steps}, end {end}"
            rank_ends.append(end)
        ends.append(rank_ends)
    assert all(e == ends[0] for e in ends), f"ranks disagree on the lanes' ends: {ends}"
    return ends[0]


def _check_job(bootstrap: str, loaded: LoadedLanes, job: str) -> None:
    """What lanes wrote into ``job`` over ``loaded``'s sources: each lane's steps in its partition, every
    source sample delivered exactly once, and each rank's sink yielding the steps in order."""
    spec = load_spec(loaded.spec)
    config = {"bootstrap.servers": bootstrap}
    ends = _check_lane_layout(bootstrap, job, loaded.lanes)
    assert max(ends) - loaded.lanes + 1 > 10, f"too few steps for a test: lanes ended at {ends}"
    problems: list[str] = []
    per_rank = [read_rank_topic(config, job, r, spec.step, problems, lanes=loaded.lanes) for r in range(RANKS)]
    assert not problems, problems
    every = {i for s in SOURCES for i in committed_sample_ids(bootstrap, JobTopics(loaded.job), s)}
    delivered = check_samples(per_rank, dict.fromkeys(every, ""), problems)
    assert [p for p in problems if "other tokens" not in p] == []  # tokens are not compared here
    assert set(delivered) == every and max(delivered.values()) == 1
    # The sink: steps in order, every written step once; below the first lane's end, no step is skipped.
    for rank in range(RANKS):
        dataset = KafkaBatchDataset(
            job=job, bootstrap_servers=bootstrap, rank=rank, read=ReadOptions(wait_timeout_s=30)
        )
        got = [mb["step"] for mb in dataset if mb["micro_batch"] == 0]
        assert got == sorted(b.step for b in per_rank[rank])
        assert got[: min(ends)] == list(range(min(ends)))


@pytest.mark.kafka
def test_a_job_of_two_lanes_delivers_every_sample_once_in_steps_the_sink_reads_in_order(
    kafka_bootstrap: str, two_lanes: LoadedLanes, tmp_path: Path, unique_name: str
) -> None:
    topics = JobTopics(two_lanes.job)
    for s in SOURCES:
        used = {m.partition() for m in read_to_end({"bootstrap.servers": kafka_bootstrap}, topics.src(s))}
        assert used == {0, 1}, f"source {s}: samples in partitions {used} only"
    _run_lanes(two_lanes.spec, unique_name, 2, tmp_path / "lanes.log")
    _check_job(kafka_bootstrap, two_lanes, unique_name)


@pytest.mark.kafka
@pytest.mark.parametrize("loaded", ["two_lanes", "three_lanes"])
def test_the_loaders_put_each_unit_s_samples_where_format_md_says(
    kafka_bootstrap: str, loaded: str, request: pytest.FixtureRequest
) -> None:
    """Every committed sample of every source is in the partition FORMAT.md's rule gives its work unit's record;
    which samples a unit holds is found by reading the unit here, without Kafka."""
    job: LoadedLanes = request.getfixturevalue(loaded)
    spec = load_spec(job.spec)
    rule = documented_source_partition()
    config = {"bootstrap.servers": kafka_bootstrap}
    for source in SOURCES:
        runtime = SourceRuntime.from_spec(spec, source)
        topics = JobTopics(job.job)
        expected: dict[str, int] = {}
        for record in read_to_end(config, topics.work(source)):
            unit = WorkUnit.from_json(record.value())
            documents = [d for d in runtime.reader.read(unit) if isinstance(d, Document)]
            partition = rule(record.partition(), record.offset(), job.lanes)
            samples = runtime.builder.build(documents, epoch=unit.epoch).samples
            expected.update((s.sample_id, partition) for s in samples)
        written = {decode_sample_message(m).sample_id: m.partition() for m in read_to_end(config, topics.src(source))}
        assert written == expected, f"source {source}: samples outside the partition FORMAT.md gives their unit"
        used = set(expected.values())
        assert len(used) == job.lanes, f"source {source}: units in partitions {used} only"


class _Growth:
    """Records in all partitions of a topic so far, committed or not."""

    def __init__(self, bootstrap: str, topic: str, lanes: int) -> None:
        self.topic, self.lanes = topic, lanes
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "watermarks"})

    def records(self) -> int:
        total = 0
        for p in range(self.lanes):
            with contextlib.suppress(KafkaException):  # not created yet
                total += self.consumer.get_watermark_offsets(TopicPartition(self.topic, p), timeout=0.5)[1]
        return total


@pytest.mark.kafka
def test_three_lanes_killed_at_random_write_what_an_undisturbed_run_wrote(
    kafka_bootstrap: str, three_lanes: LoadedLanes, tmp_path: Path, unique_name: str
) -> None:
    """Determinism per lane, and exactly once under faults: lanes SIGKILLed at random moments and started
    again write byte for byte what the lanes of an undisturbed run wrote over the same source topics."""
    loaded = three_lanes
    reference, killed = f"{unique_name}-ref", f"{unique_name}-kill"
    _run_lanes(loaded.spec, reference, loaded.lanes, tmp_path / "ref.log")
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    print(f"kill schedule seed {seed}")
    log = tmp_path / "kill.log"
    _create(loaded.spec, killed, loaded.lanes)
    processes = [start_constructor(loaded.spec, killed, "--lane", str(j), log=log) for j in range(loaded.lanes)]
    growth = _Growth(kafka_bootstrap, JobTopics(killed).state, loaded.lanes)
    kills = 0
    deadline = time.monotonic() + 240
    try:
        while kills < 3 and any(p.poll() is None for p in processes):
            target = growth.records() + rng.randint(1, 20)
            while growth.records() < target and any(p.poll() is None for p in processes):
                assert time.monotonic() < deadline, f"no progress; the log ends:\n{log.read_text()[-3000:]}"
                time.sleep(0.02)  # polling watermarks: the moment to kill is defined by progress
            alive = [j for j, p in enumerate(processes) if p.poll() is None]
            if not alive:
                break
            j = rng.choice(alive)
            processes[j].send_signal(signal.SIGKILL)
            processes[j].wait(timeout=30)
            kills += 1
            processes[j] = start_constructor(loaded.spec, killed, "--lane", str(j), log=log)
        for process in processes:
            assert process.wait(timeout=max(1.0, deadline - time.monotonic())) == 0, log.read_text()[-3000:]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
        growth.consumer.close()
    assert kills >= 1, "the lanes finished before the first kill"
    for r in range(RANKS):
        got = _partition_records(kafka_bootstrap, JobTopics(killed).rank(r))
        assert got == _partition_records(kafka_bootstrap, JobTopics(reference).rank(r)), f"rank {r} differs"
    final = [state[-1][1] for state in _partition_records(kafka_bootstrap, JobTopics(killed).state).values()]
    reference_final = _partition_records(kafka_bootstrap, JobTopics(reference).state)
    assert final == [state[-1][1] for state in reference_final.values()], "the lanes' final states differ"
    _check_job(kafka_bootstrap, loaded, killed)
