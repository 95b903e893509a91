"""Multi-level partitioning: units split on take by measured cost (file -> row groups -> row ranges).

Pure tests of the split (coverage, sizes, the same documents and ids), of the cost and plan records and
of the split decision; against the real broker, a source with one huge row group whose units get split
while every sample arrives exactly once with the ids and tokens it has without splitting, also when the
loader is killed mid-way, and the end of a source detected exactly while its plan grows.
"""

from __future__ import annotations

import itertools
import json
import signal
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from confluent_kafka import Consumer, TopicPartition
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from connectors import Document, ParquetReader, WorkUnit
from connectors.planning import split_unit, unit_bytes
from connectors.readers import FileLayout, JsonlReader
from pipeline.kafka.control import UnitCost, read_unit_cost
from pipeline.kafka.work_plan import WorkPlan, plan_is_complete, produce_units, publish_work_plan, read_work_plan
from pipeline.roles.loader.source_runtime import SourceRuntime
from pipeline.roles.loader.unit_sizing import SPLIT_SLACK, UnitSizer
from pipeline.spec import load_spec
from tests.loader_support import start_loader, wait_all
from topics.errors import DecodeError, MixflowError
from topics.formats.names import JobTopics
from topics.formats.sample_codec import decode_sample_message
from topics.kafka.admin import ensure_job_topics
from topics.kafka.clients import transactional_producer
from topics.kafka.log_reader import read_to_end


def layout(path: str, sizes: list[int], groups: list[int] | None = None) -> FileLayout:
    bounds = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    row_groups = None if groups is None else np.concatenate([[0], np.cumsum(groups)]).astype(np.int64)
    return FileLayout(path, int(bounds[-1]), bounds, row_groups=row_groups)


@st.composite
def files_and_units(draw: st.DrawFn) -> tuple[FileLayout, WorkUnit]:
    """A file (rows of several size distributions, with or without row groups) and a unit of it."""
    rows = draw(st.integers(1, 300))
    shape = draw(st.sampled_from(["equal", "uniform", "heavy", "one huge"]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    sizes = {
        "equal": np.full(rows, 100),
        "uniform": rng.integers(1, 500, rows),
        "heavy": np.minimum(rng.pareto(1.2, rows) * 50 + 1, 1e6).astype(np.int64),
        "one huge": np.where(np.arange(rows) == rows // 2, 50_000, rng.integers(0, 50, rows)),
    }[shape].tolist()
    groups = None
    if draw(st.booleans()):
        cuts = sorted(draw(st.sets(st.integers(1, rows - 1), max_size=min(rows - 1, 20)))) if rows > 1 else []
        edges = [0, *cuts, rows]
        groups = [b - a for a, b in itertools.pairwise(edges)]
    file = layout("d/f.parquet" if groups else "d/f.jsonl", sizes, groups)
    kind = draw(st.sampled_from(["file", "row_group", "rows"] if groups else ["file", "rows"]))
    epoch = draw(st.integers(0, 3))
    if kind == "file":
        return file, WorkUnit("s", file.path, "file", 0, rows, epoch, file.content_bytes)
    if kind == "row_group":
        index = draw(st.integers(0, len(groups) - 1))
        start, stop = int(file.row_groups[index]), int(file.row_groups[index + 1])
        size = int(file.row_bounds[stop] - file.row_bounds[start])
        return file, WorkUnit("s", file.path, "row_group", start, stop, epoch, size, row_group=index)
    start = draw(st.integers(0, rows - 1))
    stop = draw(st.integers(start + 1, rows))
    size = int(file.row_bounds[stop] - file.row_bounds[start])
    return file, WorkUnit("s", file.path, "rows", start, stop, epoch, size, byte_offset=int(file.row_bounds[start]))


@given(files_and_units(), st.integers(1, 200_000))
@settings(max_examples=300)
def test_split_units_cover_the_unit_once_in_order_each_within_the_target_when_it_can_be(
    case: tuple[FileLayout, WorkUnit], max_bytes: int
) -> None:
    file, unit = case
    children = split_unit(unit, file, max_bytes)
    bounds = file.row_bounds
    start, stop = (0, file.num_rows) if unit.kind == "file" else (unit.start, unit.stop)
    if len(children) == 1:
        assert children == [unit]
        assert unit.num_rows < 2 or int(bounds[stop] - bounds[start]) <= max_bytes
        return
    assert children[0].start == start and children[-1].stop == stop
    for before, after in itertools.pairwise(children):
        assert before.stop == after.start, "finer units must neither overlap nor leave a gap"
    for child in children:
        assert (child.source, child.path, child.epoch) == (unit.source, unit.path, unit.epoch)
        assert child.num_rows >= 1
        size = int(bounds[child.stop] - bounds[child.start])
        assert child.estimated_bytes == size
        assert size <= max_bytes or child.num_rows == 1, f"{child.unit_id} holds {size} bytes > {max_bytes}"
        if child.kind == "row_group":
            group = child.row_group
            assert (file.row_groups[group], file.row_groups[group + 1]) == (child.start, child.stop)
        else:
            assert child.kind == "rows" and child.byte_offset == int(bounds[child.start])
    assert len({c.unit_id for c in children}) == len(children)


@given(files_and_units())
def test_a_unit_within_the_target_is_not_split(case: tuple[FileLayout, WorkUnit]) -> None:
    file, unit = case
    start, stop = (0, file.num_rows) if unit.kind == "file" else (unit.start, unit.stop)
    whole = max(1, int(file.row_bounds[stop] - file.row_bounds[start]))
    assert split_unit(unit, file, whole) == [unit]


def test_a_file_goes_to_row_groups_first_and_a_group_too_big_to_row_ranges() -> None:
    file = layout("a.parquet", [10, 10, 10, 10, 60, 60, 10, 10, 10, 10], groups=[4, 2, 4])
    children = split_unit(WorkUnit("s", "a.parquet", "file", 0, 10, 0, 200), file, 45)
    assert [(c.kind, c.start, c.stop) for c in children] == [
        ("row_group", 0, 4),
        ("rows", 4, 5),
        ("rows", 5, 6),
        ("row_group", 6, 10),
    ]


def test_a_unit_whose_rows_do_not_fit_the_file_any_more_is_left_whole() -> None:
    file = layout("a.jsonl", [10] * 5)
    unit = WorkUnit("s", "a.jsonl", "rows", 0, 9, 0, 900)
    assert split_unit(unit, file, 10) == [unit]
    with pytest.raises(ValueError, match="max_bytes"):
        split_unit(unit, file, 0)


def _write_jsonl(path: Path, texts: list[str]) -> None:
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))


def _write_parquet(path: Path, texts: list[str], group_rows: int) -> None:
    pq.write_table(pa.table({"text": texts}), path, row_group_size=group_rows)


def _documents(reader, units: list[WorkUnit]) -> list[tuple[str, str | None]]:
    return [(d.document_id, d.text) for u in units for d in reader.read(u) if isinstance(d, Document)]


@given(
    rows=st.integers(2, 120),
    group_rows=st.integers(1, 50),
    fraction=st.floats(0.01, 0.9),
    text_seed=st.integers(0, 1000),
)
@settings(max_examples=25, suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)
def test_reading_the_finer_units_gives_the_documents_and_ids_of_the_whole_file(
    tmp_path: Path, rows: int, group_rows: int, fraction: float, text_seed: int
) -> None:
    rng = np.random.default_rng(text_seed)
    texts = [" ".join(["w"] * int(rng.integers(1, 40))) + f" {i} é" for i in range(rows)]
    _write_jsonl(tmp_path / "a.jsonl", texts)
    _write_parquet(tmp_path / "b.parquet", texts, group_rows)
    for reader in (JsonlReader("s", tmp_path, "*.jsonl"), ParquetReader("s", tmp_path, "*.parquet")):
        file = reader.layout(reader.files()[0])
        whole = WorkUnit("s", file.path, "file", 0, file.num_rows, 1, file.content_bytes)
        max_bytes = max(1, int(file.content_bytes * fraction))
        children = split_unit(whole, file, max_bytes)
        expected = _documents(reader, [whole])
        assert len(expected) == rows
        assert _documents(reader, children) == expected
        # and again one level down, as a loader does when a finer unit is still too big
        finer = [g for c in children for g in split_unit(c, file, max(1, max_bytes // 3))]
        assert _documents(reader, finer) == expected


def test_unit_cost_records_round_trip_and_add_up() -> None:
    a, b = UnitCost("s", 1000, 0.5, 2, "x"), UnitCost("s", 3000, 0.5, 1, "y")
    assert UnitCost.from_json(a.to_json()) == a
    assert json.loads(a.to_json())["kind"] == "unit-cost"
    assert a.plus(b).seconds_per_byte == pytest.approx(1.0 / 4000)
    assert UnitCost("s", 0, 0.0).seconds_per_byte is None
    for bad, reason in [
        (b'{"source": "s", "bytes": -1, "seconds": 1}', ">= 0"),
        (b'{"source": "s", "bytes": 1, "seconds": "x"}', "seconds"),
        (b'{"source": "s", "seconds": 1}', "bytes"),
        (b"[", "not a unit cost"),
    ]:
        with pytest.raises(DecodeError, match=reason):
            UnitCost.from_json(bad)


plans = st.builds(
    WorkPlan,
    st.just("s"),
    st.integers(0, 100),
    st.dictionaries(st.integers(0, 7), st.integers(0, 1000), max_size=8),
    st.none() | st.integers(1, 5),
)


@given(plans, plans, plans)
def test_plans_merge_to_each_partitions_greatest_end_in_any_order(a: WorkPlan, b: WorkPlan, c: WorkPlan) -> None:
    merged = a.merged(b).merged(c)
    assert merged == c.merged(a).merged(b) == a.merged(c.merged(b))
    for partition in {*a.ends, *b.ends, *c.ends}:
        assert merged.ends[partition] == max(p.ends.get(partition, 0) for p in (a, b, c))
    assert merged.units == max(a.units, b.units, c.units)
    epochs = [p.epochs for p in (a, b, c) if p.epochs is not None]
    assert merged.epochs == (max(epochs) if epochs else None)


@given(per_byte=st.floats(1e-9, 1e-3), target=st.floats(1e-3, 1.0), rows=st.integers(2, 200))
@settings(max_examples=30, suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)
def test_a_loader_splits_exactly_the_units_estimated_over_the_target(
    tmp_path: Path, per_byte: float, target: float, rows: int
) -> None:
    path = tmp_path / f"f{rows}.jsonl"
    if not path.exists():
        _write_jsonl(path, [f"row {i} " + "x" * (i % 17) for i in range(rows)])
    reader = JsonlReader("s", tmp_path, path.name)
    file = reader.layout(path.name)
    unit = WorkUnit("s", path.name, "file", 0, rows, 0, file.content_bytes)
    assert UnitSizer(reader, target, None, "t").split(unit) is None  # nothing measured yet
    sizer = UnitSizer(reader, target, UnitCost("s", 10**6, per_byte * 10**6), "t")
    children = sizer.split(unit)
    estimate = file.content_bytes * per_byte
    if estimate <= SPLIT_SLACK * target:
        assert children is None
        return
    assert children is not None and len(children) >= 2
    limit = unit_bytes(per_byte, target)
    assert all(c.estimated_bytes <= limit or c.num_rows == 1 for c in children)
    assert all(sizer.estimate_s(c) <= target * (1 + 1e-9) or c.num_rows == 1 for c in children)


def test_a_bad_unit_target_is_refused_naming_the_field(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    spec = {
        "job": "j",
        "sources": [{"name": "s", "reader": "text", "path": "d", "unit_target_s": -1}],
        "mixture": {"weights": {"s": 1}},
        "step": {"ranks": 1, "micro_batches": 1, "tokens_per_micro_batch": 64},
        "cost": {"alpha": 1.0, "beta": 100.0},
        "tokenizer": "t.json",
    }
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    with pytest.raises(MixflowError, match="unit_target_s"):
        load_spec(path)


# --- against the real broker ---------------------------------------------------------------------

BIG_ROWS = 1500


def _vocabulary_tokenizer(path: Path) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, "[EOD]": 1} | {f"w{i}": i + 2 for i in range(500)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(path))
    return path


@pytest.fixture(scope="module")
def one_huge_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Parquet source: one file that is one huge row group, one of small row groups."""
    root = tmp_path_factory.mktemp("huge")
    data = root / "data"
    data.mkdir()
    rng = np.random.default_rng(13)

    def texts(n: int) -> list[str]:
        return [" ".join(f"w{w}" for w in rng.integers(0, 500, int(rng.integers(20, 400)))) for _ in range(n)]

    _write_parquet(data / "huge.parquet", texts(BIG_ROWS), group_rows=BIG_ROWS)
    _write_parquet(data / "small.parquet", texts(200), group_rows=50)
    _vocabulary_tokenizer(root / "tokenizer.json")
    return root


def _spec(folder: Path, job: str, bootstrap: str, data: Path, unit_target_s: float) -> Path:
    source = {"name": "big", "reader": "parquet", "path": str(data / "data"), "max_sample_length": 128}
    spec = {
        "job": job,
        "kafka": {"bootstrap_servers": bootstrap},
        "tokenizer": str(data / "tokenizer.json"),
        "sources": [{**source, "eod_token_id": 1, "unit_target_s": unit_target_s}],
        "mixture": {"weights": {"big": 1}},
        "step": {"ranks": 1, "micro_batches": 1, "tokens_per_micro_batch": 256},
        "cost": {"alpha": 1.0, "beta": 100.0},
        "seed": 3,
    }
    path = folder / "spec.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    # Created here, once, rather than by two loaders starting at the same moment.
    ensure_job_topics({"bootstrap.servers": bootstrap}, job, ["big"], 1)
    return path


def _target_for(spec_path: Path, pieces: int) -> float:
    """A unit target about 1/``pieces`` of what the huge row group costs to tokenize here: so the test
    splits it on any machine, into a handful of units, not thousands."""
    runtime = SourceRuntime.from_spec(load_spec(spec_path), "big")
    huge = runtime.reader.layout("huge.parquet")
    return runtime.measure_cost() * huge.content_bytes / pieces


def _unsplit_samples(spec_path: Path) -> dict[str, bytes]:
    """Every sample of the source read file by file, without any splitting: id -> tokens."""
    runtime = SourceRuntime.from_spec(load_spec(spec_path), "big")
    samples = {}
    for file in runtime.reader.layouts():
        unit = WorkUnit("big", file.path, "file", 0, file.num_rows, 0, file.content_bytes)
        documents = [d for d in runtime.reader.read(unit) if isinstance(d, Document)]
        for sample in runtime.builder.build(documents).samples:
            samples[sample.sample_id] = sample.tokens.tobytes()
    return samples


def _assert_samples_match_the_unsplit_source(bootstrap: str, spec_path: Path, job: str) -> list[WorkUnit]:
    topics = JobTopics(job)
    config = {"bootstrap.servers": bootstrap}
    records = [decode_sample_message(m) for m in read_to_end(config, topics.src("big"))]
    counts = Counter(s.sample_id for s in records)
    duplicates = [i for i, n in counts.items() if n > 1]
    assert not duplicates, f"{len(duplicates)} samples arrived more than once, e.g. {duplicates[:3]}"
    expected = _unsplit_samples(spec_path)
    got = {s.sample_id: s.tokens.tobytes() for s in records}
    missing, unexpected = sorted(set(expected) - set(got)), sorted(set(got) - set(expected))
    assert not missing and not unexpected, f"missing {missing[:3]}, unexpected {unexpected[:3]}"
    assert got == expected, "a sample's tokens differ from the unsplit source's"
    work = read_to_end(config, topics.work("big"))
    units = [WorkUnit.from_json(m.value()) for m in work]
    plan = read_work_plan(config, topics, "big")
    assert plan is not None
    last = {}
    for message in work:
        last[message.partition()] = message.offset() + 1
    assert all(plan.ends.get(p, 0) >= end for p, end in last.items()), f"units beyond the plan {plan.ends}: {last}"
    return units


def test_units_of_a_huge_row_group_are_split_and_every_sample_arrives_once_with_unsplit_ids(
    kafka_bootstrap: str, unique_name: str, one_huge_file: Path, tmp_path: Path
) -> None:
    spec_path = _spec(tmp_path, unique_name, kafka_bootstrap, one_huge_file, unit_target_s=1.0)
    spec_path = _spec(tmp_path, unique_name, kafka_bootstrap, one_huge_file, _target_for(spec_path, pieces=8))
    loaders = [start_loader(spec_path, "big", i, tmp_path) for i in range(2)]
    wait_all(loaders, timeout_s=180, log_dir=tmp_path)

    units = _assert_samples_match_the_unsplit_source(kafka_bootstrap, spec_path, unique_name)
    huge = [u for u in units if u.path == "huge.parquet"]
    assert any(u.kind == "rows" for u in huge), f"the huge row group was not split: {[u.unit_id for u in huge]}"
    cost = read_unit_cost({"bootstrap.servers": kafka_bootstrap}, JobTopics(unique_name), "big")
    assert cost is not None and cost.units > 0 and cost.seconds_per_byte, cost


def _wait_for_a_split(config: dict, topics: JobTopics, still_running, timeout_s: float = 120) -> None:
    """Return once the source has a plan record beyond the planner's: a split committed."""
    deadline = time.monotonic() + timeout_s
    key = b"work-plan/big"
    while still_running():
        if sum(m.key() == key for m in read_to_end(config, topics.plan("big"))) > 1:
            return
        if time.monotonic() > deadline:
            msg = f"no unit of {topics.work('big')} was split within {timeout_s} s"
            raise AssertionError(msg)
    msg = "the loader exited before it split a unit"
    raise AssertionError(msg)


def test_a_loader_killed_mid_way_through_split_units_resumes_exactly_once(
    kafka_bootstrap: str, unique_name: str, one_huge_file: Path, tmp_path: Path
) -> None:
    spec_path = _spec(tmp_path, unique_name, kafka_bootstrap, one_huge_file, unit_target_s=1.0)
    spec_path = _spec(tmp_path, unique_name, kafka_bootstrap, one_huge_file, _target_for(spec_path, pieces=24))
    topics = JobTopics(unique_name)
    loader = start_loader(spec_path, "big", 0, tmp_path)
    # Killed as soon as a split is committed: its 24 finer units, published with it, are then still to
    # load or being loaded (waiting for some of their records let an idle machine finish them all first).
    _wait_for_a_split({"bootstrap.servers": kafka_bootstrap}, topics, lambda: loader.poll() is None)
    assert loader.poll() is None, "the loader finished before it could be killed"
    loader.send_signal(signal.SIGKILL)
    loader.wait(timeout=30)
    wait_all([start_loader(spec_path, "big", 0, tmp_path)], timeout_s=180, log_dir=tmp_path)
    units = _assert_samples_match_the_unsplit_source(kafka_bootstrap, spec_path, unique_name)
    assert any(u.kind == "rows" for u in units)


def test_the_end_of_a_source_waits_for_units_split_after_its_plan_was_read(
    kafka_bootstrap: str, unique_name: str
) -> None:
    config = {"bootstrap.servers": kafka_bootstrap}
    topics = JobTopics(unique_name)
    ensure_job_topics(config, unique_name, ["s"], 1)
    partitions = 8
    units = [WorkUnit("s", f"f{i}.jsonl", "file", 0, 10, 0, 100) for i in range(3)]
    first = publish_work_plan(config, topics, "s", units, partitions)
    group = f"{unique_name}.loaders.s"
    consumer = Consumer({**config, "group.id": group, "enable.auto.commit": False})
    try:
        # The group commits every unit of the first plan, the last one split: its finer units go out with
        # the commit of its offset, as a loader does it.
        producer = transactional_producer(config, f"{unique_name}.loader.s.0")
        producer.begin_transaction()
        finer = [WorkUnit("s", "f2.jsonl", "rows", r, r + 5, 0, 50) for r in (0, 5)]
        split = produce_units(producer, topics, "s", finer, partitions, first)
        offsets = [TopicPartition(topics.work("s"), p, end) for p, end in first.ends.items()]
        producer.send_offsets_to_transaction(offsets, consumer.consumer_group_metadata(), 30)
        producer.commit_transaction(30)

        done, seen = plan_is_complete(config, topics, consumer, first)
        assert not done, "the source was called done while its split units were not"
        assert seen.ends == first.merged(split).ends
        assert read_work_plan(config, topics, "s") == first.merged(split)
        # Once the finer units are committed too, it is done.
        every = [TopicPartition(topics.work("s"), p, end) for p, end in seen.ends.items()]
        consumer.commit(offsets=every, asynchronous=False)
        assert plan_is_complete(config, topics, consumer, first)[0]
    finally:
        consumer.close()
