"""A dead letter for a whole work unit counts what it lost: the readers' letters for a unit (or the rest of one)
that could not be read carry the unit and its planned rows, so that every planned row is a document or counted
in a letter; the run's verdict takes each source's share in records, not letters (a unit whose rows the plan did
not count is estimated at the source's records per file); letters written before these fields read as one record."""

from __future__ import annotations

import json
import uuid
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.feather as feather
import pyarrow.parquet as pq
import pytest
from confluent_kafka import Producer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from connectors.planning import split_file
from connectors.readers import ArrowReader, JsonlReader, ParquetReader, Reader
from connectors.readers.jsonl import LISTING_ONLY_BYTES
from connectors.work_units import WorkUnit
from pipeline.tools.dead_letters import over_share, report_lines, tally, verdict_line
from pipeline.tools.delivery import check_sources, lost_records, records_per_file
from tests.kafka_support import create_topic
from topics.formats.dead_letter import DeadLetter, decode_dead_letter, encode_dead_letter
from topics.formats.names import JobTopics

# -- every planned row is a document or counted in a letter -------------------------------------------------


def _planned(reader: Reader, max_bytes: int) -> list[WorkUnit]:
    return [unit for layout in reader.layouts() for unit in split_file(reader.source, layout, max_bytes)]


def _accounted(reader: Reader, units: list[WorkUnit]) -> tuple[int, list[DeadLetter]]:
    """Rows given as documents or counted in letters, over ``units``; the letters."""
    items = [item for unit in units for item in reader.read(unit)]
    letters = [item for item in items if isinstance(item, DeadLetter)]
    return len(items) - len(letters) + sum(letter.records or 1 for letter in letters), letters


def _write(form: str, folder: Path, rows: int, group: int) -> Reader:
    texts = [f"document {i} " * (1 + i % 5) for i in range(rows)]
    if form == "jsonl":
        (folder / "f.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
        return JsonlReader("src", folder)
    if form == "parquet":
        pq.write_table(pa.table({"text": texts}), folder / "f.parquet", row_group_size=group)
        return ParquetReader("src", folder)
    feather.write_feather(pa.table({"text": texts}), folder / "f.arrow", chunksize=group)
    return ArrowReader("src", folder)


@settings(deadline=None, max_examples=30, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    form=st.sampled_from(["jsonl", "parquet", "arrow"]),
    rows=st.integers(1, 120),
    group=st.integers(1, 40),
    max_bytes=st.integers(1, 4000),
    damage=st.sampled_from(["gone", "garbage"]),
)
def test_a_unit_that_cannot_be_read_is_one_letter_counting_its_planned_rows(
    tmp_path_factory: pytest.TempPathFactory, form: str, rows: int, group: int, max_bytes: int, damage: str
) -> None:
    folder = tmp_path_factory.mktemp(form)
    reader = _write(form, folder, rows, group)
    units = _planned(reader, max_bytes)
    assert _accounted(reader, units) == (rows, [])
    [path] = [p for p in folder.iterdir() if p.is_file()]
    if damage == "gone":
        path.unlink()
    else:
        path.write_bytes(b"PAR1 not what it was" if form != "jsonl" else b"\xff\xfe\n" * rows)
    if form == "jsonl" and damage == "garbage":  # lines that are not JSON: one letter each, as before
        return
    accounted, letters = _accounted(reader, units)
    assert accounted == rows and len(letters) == len(units)
    for unit, letter in zip(units, letters, strict=True):
        assert letter.unit == unit.unit_id and letter.records == unit.stop - unit.start


@settings(deadline=None, max_examples=30, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.integers(2, 80), cut=st.floats(0.05, 0.95), max_bytes=st.integers(50, 2000))
def test_a_file_cut_short_is_counted_from_the_row_where_it_ends(
    tmp_path_factory: pytest.TempPathFactory, rows: int, cut: float, max_bytes: int
) -> None:
    folder = tmp_path_factory.mktemp("cut")
    reader = _write("jsonl", folder, rows, 1)
    units = [u for u in _planned(reader, max_bytes) if u.kind == "rows"]
    if not units:  # one unit for the whole file: a whole-file unit reads what is there
        return
    path = folder / "f.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    kept = max(1, int(len(lines) * cut))
    path.write_bytes(b"".join(lines[:kept]))
    accounted, letters = _accounted(reader, units)
    assert accounted == sum(u.num_rows for u in units)
    assert all(letter.records and letter.unit for letter in letters)


def test_a_parquet_row_group_that_cannot_be_read_counts_its_rows(tmp_path: Path) -> None:
    path = tmp_path / "c.parquet"
    pq.write_table(pa.table({"text": [f"row {i}" for i in range(30)]}), path, row_group_size=10)
    chunk = pq.ParquetFile(path).metadata.row_group(1).column(0)
    data = bytearray(path.read_bytes())
    start = chunk.dictionary_page_offset or chunk.data_page_offset
    data[start : start + chunk.total_compressed_size] = b"\xff" * chunk.total_compressed_size
    path.write_bytes(bytes(data))
    reader = ParquetReader("src", tmp_path)
    whole = WorkUnit("src", "c.parquet", "file", 0, 30)
    rows = WorkUnit("src", "c.parquet", "rows", 5, 25)
    for unit, lost in ((whole, 10), (rows, 10)):
        accounted, [letter] = _accounted(reader, [unit])
        assert (accounted, letter.records, letter.location) == (unit.num_rows, lost, "c.parquet:row_group=1")


def test_a_small_object_planned_from_its_listing_is_a_unit_of_rows_nobody_counted(tmp_path: Path) -> None:
    reader = JsonlReader("src", tmp_path)
    listed = WorkUnit("src", "gone.jsonl", "file", 0, 1, etag="e1", object_size=LISTING_ONLY_BYTES)
    scanned = WorkUnit("src", "gone.jsonl", "file", 0, 1, etag="e2", object_size=LISTING_ONLY_BYTES + 1)
    uninspected = WorkUnit("src", "gone.jsonl", "file", 0, 0)
    [listed_letter] = reader.read(listed)
    assert (listed_letter.unit, listed_letter.records) == (listed.unit_id, None)
    [scanned_letter] = reader.read(scanned)
    assert (scanned_letter.unit, scanned_letter.records) == (scanned.unit_id, 1)
    [uninspected_letter] = reader.read(uninspected)
    assert uninspected_letter.records is None and uninspected_letter.unit == uninspected.unit_id


def test_a_letter_written_before_records_existed_reads_as_one_record() -> None:
    older = b'{"version":1,"source":"s","location":"a.jsonl","reason":"cannot read: gone","error_type":null}'
    letter = decode_dead_letter(older)
    assert (letter.records, letter.unit) == (None, None) and lost_records(letter, per_file=500.0) == 1
    _, value, _ = encode_dead_letter(letter)
    assert b"records" not in value and b"unit" not in value  # and is written as before
    assert lost_records(DeadLetter("s", "a", "r", records=40, unit="u"), per_file=500.0) == 40
    assert lost_records(DeadLetter("s", "a", "r", unit="u"), per_file=499.6) == 500
    assert lost_records(DeadLetter("s", "a", "r", unit="u"), per_file=0.2) == 1


def test_records_per_file_counts_each_file_once_per_epoch() -> None:
    ids = {f"src/d/a.jsonl/{r}" for r in range(6)} | {f"src/d/b.jsonl/{r}" for r in range(2)}
    assert records_per_file(ids) == 4.0
    assert records_per_file(ids | {f"src/d/a.jsonl/{r}@e1" for r in range(6)}) == pytest.approx(14 / 3)
    assert records_per_file(set()) == 1.0


# -- the verdict counts records --------------------------------------------------------------------------


def test_seven_whole_units_that_lost_a_tenth_of_a_source_fail_the_verdict() -> None:
    reason = "cannot read: s3://b/k: changed since planning (ETag x planned; 412 Precondition Failed)"
    letters = {("code", reason): 7}
    records = {"code": 26_697 + 3_282}
    by_letters = tally(letters, records)
    assert over_share(by_letters, 0.01) == []  # 7 of 29,979: how whole units passed before
    [counted] = tally(letters, records, {("code", reason): 3_282})
    assert counted.lost_records == 3_282 and counted.share == pytest.approx(3_282 / 29_979)
    assert over_share([counted], 0.01) == [counted]
    lines = report_lines([counted], 0.01)
    assert lines[0] == "dead letters: 7 for 3282 of 29979 records: code 3282 of 29979 records (10.9%) in 7 dead letters"
    assert lines[1] == f"  code: 7 x {reason} (3282 records)"
    assert verdict_line([counted], 0.01).startswith("each source lost at most 1.0% of its records to dead letters: NO")


@given(
    letters=st.lists(
        st.tuples(st.sampled_from(["a", "b"]), st.sampled_from(["r1", "r2 7", "r2 9", "r3"]), st.integers(1, 500)),
        max_size=20,
    ),
    documents=st.integers(0, 5000),
    allowed=st.floats(0, 0.5),
)
def test_a_sources_share_is_its_records_lost_over_its_records(
    letters: list[tuple[str, str, int]], documents: int, allowed: float
) -> None:
    count = Counter((source, reason) for source, reason, _ in letters)
    lost = Counter()
    for source, reason, records in letters:
        lost[(source, reason)] += records
    records = {s: documents + sum(n for t, _, n in letters if t == s) for s in ("a", "b")}
    for t in tally(count, records, lost):
        mine = [n for s, _, n in letters if s == t.source]
        assert (t.letters, t.lost_records) == (len(mine), sum(mine))
        assert sum(r.records for r in t.shown()) == t.lost_records and sum(r.letters for r in t.shown()) == t.letters
        assert t.share == (pytest.approx(sum(mine) / records[t.source]) if mine else 0)
        assert (t in over_share([t], allowed)) == (bool(mine) and t.share > allowed)
        assert [r.records for r in t.reasons] == sorted((r.records for r in t.reasons), reverse=True)


@pytest.mark.kafka
def test_the_run_check_counts_the_records_a_units_letter_stands_for(kafka_bootstrap: str) -> None:
    topics = JobTopics(f"t{uuid.uuid4().hex[:8]}-records")
    for topic in (topics.src("code"), topics.dlq):
        create_topic(kafka_bootstrap, topic)
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    samples = [f"code/d/{f}.jsonl/{row}" for f in range(10) for row in range(45)]  # 10 files of 45 records
    samples += [f"code/d/0.jsonl/{row}#1" for row in range(5)]  # second chunks: the same documents
    for sample in samples:
        producer.produce(topics.src("code"), key=sample.encode(), value=b"-")
    letters = [
        DeadLetter("code", "d/10.jsonl", "cannot read: changed since planning", records=45, unit="code/d/10.jsonl"),
        DeadLetter("code", "d/11.jsonl", "cannot read: changed since planning", unit="code/d/11.jsonl"),  # 45 guessed
        DeadLetter("code", "d/1.jsonl:row=3", "invalid JSON: 3"),
        DeadLetter("code", f"{topics.src('code')}[0]@0", "too long for the step"),  # the constructor's
    ]
    for letter in letters:
        key, value, headers = encode_dead_letter(letter)
        producer.produce(topics.dlq, key=key, value=value, headers=headers)
    assert producer.flush(30) == 0
    check = check_sources({"bootstrap.servers": kafka_bootstrap}, topics.job, ["code"], Counter(samples))
    [code] = check.dead_letters
    assert (code.letters, code.lost_records, code.records) == (4, 45 + 45 + 1 + 1, 450 + 45 + 45 + 1)
    assert code.share == pytest.approx(92 / 541)
    assert [r.describe() for r in code.shown()] == [
        "2 x cannot read: changed since planning (90 records)",
        "1 x invalid JSON: 3",
        "1 x too long for the step",
    ]
