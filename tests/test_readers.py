"""Readers on small files made in tmp_path: ids, rows, values, and bad input as dead letters."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.feather as feather
import pyarrow.parquet as pq
import pytest

from connectors.planning import split_file
from connectors.readers import (
    ArrowReader,
    Document,
    JsonlReader,
    ParquetReader,
    Reader,
    SourceNotFoundError,
    TextReader,
    make_reader,
)
from connectors.work_units import WorkUnit
from topics.errors import MixflowError
from topics.formats.dead_letter import DeadLetter


def read_source(reader: Reader, max_bytes: int = 1 << 30) -> list[Document | DeadLetter]:
    return [
        item
        for layout in reader.layouts()
        for unit in split_file(reader.source, layout, max_bytes)
        for item in reader.read(unit)
    ]


def split(items: list[Document | DeadLetter]) -> tuple[dict[str, Document], dict[str, DeadLetter]]:
    docs = {i.document_id: i for i in items if isinstance(i, Document)}
    dead = {i.location: i for i in items if isinstance(i, DeadLetter)}
    return docs, dead


def write_lines(path: Path, lines: list[bytes]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\n".join(lines) + b"\n")


def test_jsonl_ids_text_and_dead_letters(tmp_path: Path) -> None:
    bad_json = b'{"text": "unterminated'
    write_lines(
        tmp_path / "sub" / "a.jsonl",
        [
            b'{"text": "zero"}',
            bad_json,
            b'{"other": "no text"}',
            b'{"text": null}',
            b'{"text": 5}',
            b"",
            b"[1, 2]",
            b'{"text": "caf\xc3\xa9", "extra": 1}',
            b'{"text": "\xff"}',
        ],
    )
    docs, dead = split(read_source(JsonlReader("src", tmp_path)))
    assert {k: d.text for k, d in docs.items()} == {"src/sub/a.jsonl/0": "zero", "src/sub/a.jsonl/7": "café"}
    assert set(dead) == {f"sub/a.jsonl:row={r}" for r in (1, 2, 3, 4, 6, 8)}
    assert "invalid JSON" in dead["sub/a.jsonl:row=1"].reason
    assert dead["sub/a.jsonl:row=1"].payload.rstrip() == bad_json
    assert "missing or null" in dead["sub/a.jsonl:row=2"].reason
    assert "missing or null" in dead["sub/a.jsonl:row=3"].reason
    assert "not a string" in dead["sub/a.jsonl:row=4"].reason
    assert "not an object" in dead["sub/a.jsonl:row=6"].reason
    assert all(d.source == "src" for d in dead.values())


def test_jsonl_pre_tokenized(tmp_path: Path) -> None:
    write_lines(
        tmp_path / "t.jsonl",
        [b'{"ids": [1, 2, 3]}', b'{"ids": [1, "x"]}', b'{"ids": [-1]}', b'{"ids": [[1]]}', b'{"ids": []}'],
    )
    docs, dead = split(read_source(JsonlReader("tok", tmp_path, field="ids", content="tokens")))
    assert docs["tok/t.jsonl/0"].tokens.dtype == np.int32
    assert docs["tok/t.jsonl/0"].tokens.tolist() == [1, 2, 3]
    assert docs["tok/t.jsonl/4"].tokens.tolist() == []
    assert set(dead) == {"t.jsonl:row=1", "t.jsonl:row=2", "t.jsonl:row=3"}


def test_jsonl_row_ranges_cover_the_file(tmp_path: Path) -> None:
    lines = [json.dumps({"text": f"line {i} " + "x" * (i % 7)}).encode() for i in range(50)]
    (tmp_path / "r.jsonl").write_bytes(b"\n".join(lines))  # no newline after the last line
    reader = JsonlReader("src", tmp_path)
    (layout,) = reader.layouts()
    assert layout.num_rows == 50
    assert layout.row_bounds[-1] == (tmp_path / "r.jsonl").stat().st_size
    units = split_file("src", layout, max_bytes=100)
    assert len(units) > 5
    assert all(u.kind == "rows" for u in units)
    texts = [d.text for u in units for d in reader.read(u)]
    assert texts == [json.loads(line)["text"] for line in lines]
    # without a byte offset the reader skips lines to the unit's first row
    unit = units[3]
    unseekable = WorkUnit("src", "r.jsonl", "rows", unit.start, unit.stop)
    assert [d.document_id for d in reader.read(unseekable)] == [d.document_id for d in reader.read(unit)]


def test_jsonl_unit_past_end_of_file_is_reported(tmp_path: Path) -> None:
    write_lines(tmp_path / "s.jsonl", [b'{"text": "a"}', b'{"text": "b"}'])
    items = list(JsonlReader("src", tmp_path).read(WorkUnit("src", "s.jsonl", "rows", 1, 5)))
    assert [type(i) for i in items] == [Document, DeadLetter]
    assert items[1].location == "s.jsonl:row=2"


def write_parquet(path: Path, table: pa.Table, row_group_size: int = 64, **kwargs: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path, row_group_size=row_group_size, **kwargs)


def test_parquet_by_row_group(tmp_path: Path) -> None:
    texts = [f"doc {i}" for i in range(150)]
    texts[70] = None
    write_parquet(tmp_path / "p" / "f.parquet", pa.table({"text": texts, "n": list(range(150))}))
    reader = ParquetReader("code", tmp_path)
    (layout,) = reader.layouts()
    assert layout.row_groups.tolist() == [0, 64, 128, 150]
    units = split_file("code", layout, max_bytes=1)
    assert [(u.kind, u.row_group, u.start, u.stop) for u in units] == [
        ("row_group", 0, 0, 64),
        ("row_group", 1, 64, 128),
        ("row_group", 2, 128, 150),
    ]
    docs, dead = split([item for u in units for item in reader.read(u)])
    assert len(docs) == 149
    assert docs["code/p/f.parquet/149"].text == "doc 149"
    assert list(dead) == ["p/f.parquet:row=70"]
    # a row range across groups reads the groups it touches
    rows = list(reader.read(WorkUnit("code", "p/f.parquet", "rows", 60, 66)))
    assert [d.document_id.rsplit("/", 1)[1] for d in rows] == ["60", "61", "62", "63", "64", "65"]


def test_parquet_tokens_column(tmp_path: Path) -> None:
    column = pa.array([[1, 2], None, [3, 2**31], [], [4, 5, 6]], type=pa.list_(pa.int64()))
    write_parquet(tmp_path / "t.parquet", pa.table({"ids": column}), row_group_size=2)
    docs, dead = split(read_source(ParquetReader("tok", tmp_path, field="ids", content="tokens")))
    assert {k: d.tokens.tolist() for k, d in docs.items()} == {
        "tok/t.parquet/0": [1, 2],
        "tok/t.parquet/3": [],
        "tok/t.parquet/4": [4, 5, 6],
    }
    assert set(dead) == {"t.parquet:row=1", "t.parquet:row=2"}


def test_parquet_truncated_file_is_one_dead_letter(tmp_path: Path) -> None:
    write_parquet(tmp_path / "a.parquet", pa.table({"text": ["a", "b"]}))
    write_parquet(tmp_path / "b.parquet", pa.table({"text": ["c"] * 100}))
    data = (tmp_path / "b.parquet").read_bytes()
    (tmp_path / "b.parquet").write_bytes(data[: len(data) // 2])
    reader = ParquetReader("src", tmp_path)
    layouts = reader.layouts()
    assert layouts[1].problem is not None
    docs, dead = split(read_source(reader))
    assert set(docs) == {"src/a.parquet/0", "src/a.parquet/1"}
    assert list(dead) == ["b.parquet"]
    assert "Parquet" in dead["b.parquet"].reason


def test_parquet_corrupt_row_group_skips_only_that_group(tmp_path: Path) -> None:
    path = tmp_path / "c.parquet"
    write_parquet(path, pa.table({"text": [f"row {i}" for i in range(30)]}), row_group_size=10)
    chunk = pq.ParquetFile(path).metadata.row_group(1).column(0)
    data = bytearray(path.read_bytes())
    start = chunk.dictionary_page_offset or chunk.data_page_offset
    data[start : start + chunk.total_compressed_size] = b"\xff" * chunk.total_compressed_size
    path.write_bytes(bytes(data))
    docs, dead = split(read_source(ParquetReader("src", tmp_path), max_bytes=1))
    assert list(dead) == ["c.parquet:row_group=1"]
    assert sorted(int(k.rsplit("/", 1)[1]) for k in docs) == [*range(10), *range(20, 30)]


def test_parquet_missing_or_mistyped_column(tmp_path: Path) -> None:
    write_parquet(tmp_path / "a.parquet", pa.table({"body": ["x"]}))
    write_parquet(tmp_path / "b.parquet", pa.table({"text": [1, 2]}))
    _, dead = split(read_source(ParquetReader("src", tmp_path)))
    assert "no column 'text'" in dead["a.parquet"].reason
    assert "expected a string column" in dead["b.parquet:row_group=0"].reason


@pytest.mark.parametrize("form", ["file", "stream", "feather"])
def test_arrow_formats_and_row_ranges(tmp_path: Path, form: str) -> None:
    table = pa.table({"text": [f"t{i}" * (i + 1) for i in range(20)]})
    path = tmp_path / "x.arrow"
    if form == "feather":
        feather.write_feather(table, path, chunksize=7)
    else:
        new_writer = pa.ipc.new_file if form == "file" else pa.ipc.new_stream
        with pa.OSFile(str(path), "wb") as sink, new_writer(sink, table.schema) as writer:
            for batch in table.to_batches(max_chunksize=6):
                writer.write_batch(batch)
    reader = ArrowReader("arr", tmp_path)
    (layout,) = reader.layouts()
    assert np.diff(layout.row_bounds).tolist() == [2 * (i + 1) if i < 10 else 3 * (i + 1) for i in range(20)]
    units = split_file("arr", layout, max_bytes=60)
    assert len(units) > 1
    docs = [d for u in units for d in reader.read(u)]
    assert [d.document_id for d in docs] == [f"arr/x.arrow/{i}" for i in range(20)]
    assert [d.text for d in docs] == table.column("text").to_pylist()


def test_arrow_tokens_and_corrupt_file(tmp_path: Path) -> None:
    ids = pa.array([[5, 6], [7]], type=pa.list_(pa.int32()))
    feather.write_feather(pa.table({"ids": ids}), tmp_path / "good.arrow")
    (tmp_path / "bad.arrow").write_bytes(b"ARROW1 not really")
    docs, dead = split(read_source(ArrowReader("arr", tmp_path, field="ids", content="tokens")))
    assert {k: d.tokens.tolist() for k, d in docs.items()} == {"arr/good.arrow/0": [5, 6], "arr/good.arrow/1": [7]}
    assert list(dead) == ["bad.arrow"]


def test_text_files(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "one.txt").write_text("héllo\nworld", encoding="utf-8")
    (tmp_path / "d" / "two.txt").write_bytes("latin-1 \xe9t\xe9".encode("latin-1"))
    (tmp_path / "d" / "skip.md").write_text("not matched")
    reader = TextReader("txt", tmp_path, glob="d/*.txt")
    assert reader.files() == ["d/one.txt", "d/two.txt"]
    docs, dead = split(read_source(reader))
    assert {k: d.text for k, d in docs.items()} == {"txt/d/one.txt/0": "héllo\nworld"}
    assert [d.where for d in docs.values()] == ["d/one.txt"]  # a file is one document: its letters name the file
    assert list(dead) == ["d/two.txt"]
    assert "not UTF-8" in dead["d/two.txt"].reason


def test_missing_root_or_no_match_is_a_clear_error(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    with pytest.raises(SourceNotFoundError, match=str(missing)):
        JsonlReader("src", missing).files()
    with pytest.raises(MixflowError, match=r"\*\*/\*\.parquet"):
        ParquetReader("src", tmp_path).files()
    with pytest.raises(ValueError, match="not a pattern relative to"):
        ParquetReader("src", tmp_path, glob="/etc/*.parquet").files()


def test_reader_arguments_checked_at_construction(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not one of jsonl, parquet, arrow, text"):
        make_reader("csv", "src", tmp_path)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="content 'tokens'"):
        TextReader("src", tmp_path, content="tokens")
    with pytest.raises(ValueError, match="no '/'"):
        JsonlReader("a/b", tmp_path)
    assert isinstance(make_reader("parquet", "src", tmp_path, field="body"), ParquetReader)


def test_the_file_formats_are_listed_once() -> None:
    """The spec's readers, their default globs and fields, and the readers' table all come from
    ``topics.formats.file_formats``."""
    from connectors.readers import READERS, reader_class
    from pipeline.spec.sources import COLUMNAR_READERS, DEFAULT_GLOBS, ReaderKind
    from topics.formats.file_formats import FILE_FORMATS

    assert [r.value for r in ReaderKind] == list(FILE_FORMATS) == list(READERS)
    for name, file_format in FILE_FORMATS.items():
        assert reader_class(name).file_format is file_format
        assert DEFAULT_GLOBS[ReaderKind(name)] == file_format.default_glob
        assert (ReaderKind(name) in COLUMNAR_READERS) == file_format.fields
