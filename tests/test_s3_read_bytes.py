"""What a unit of an object-store source reads: its own row groups' column chunks (Parquet, after a footer read
from the object's tail) or its own record batches (Arrow), never the rows before it nor much past it."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from connectors.planning import _piece, split_file, split_unit
from connectors.readers import Document, Reader, make_reader
from connectors.readers.base import FileLayout
from connectors.storage import storage_for
from connectors.storage.base import StoredBytes
from connectors.storage.s3 import S3Storage
from tests.s3_support import S3Server, running_server, upload

GROUPS, ROWS = 9, 300
FOOTER_GUESS = 16 << 10  # the Parquet reader's one read of an object's tail
SCHEMA_READ = 8 << 10  # the Arrow reader's read-ahead: the schema, and past a unit's last batch


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    with running_server(tmp_path_factory.mktemp("s3")) as running:
        yield running


@pytest.fixture
def bytes_read(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every ranged GET's length, as the store answered it."""
    got: list[int] = []
    read_stored = S3Storage.read_stored

    def counted(self: S3Storage, path: str, start: int, stop: int, etag: str = "") -> StoredBytes:
        stored = read_stored(self, path, start, stop, etag)
        got.append(len(stored.data))
        return stored

    monkeypatch.setattr(S3Storage, "read_stored", counted)
    return got


def table(seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    texts = ["w" * int(n) for n in rng.integers(20, 400, GROUPS * ROWS)]
    return pa.table({"text": texts, "other": [t.upper() + "!" for t in texts]})


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("file_format", ["parquet", "arrow"])
def test_each_unit_reads_its_own_rows_bytes_and_little_more(
    server: S3Server, tmp_path: Path, bytes_read: list[int], file_format: str, seed: int
) -> None:
    folder = tmp_path / "src"
    folder.mkdir()
    path = folder / f"part.{file_format}"
    data = table(seed)
    if file_format == "parquet":
        pq.write_table(data, path, row_group_size=ROWS)
    else:
        write_arrow(path, data)
    root = upload(server, folder, f"{tmp_path.name}-{file_format}")
    planner = make_reader(file_format, "web", root, storage=storage_for(root, server.settings()))
    (layout,) = planner.layouts()
    units = split_file("web", layout, max_bytes=int(layout.content_bytes / 4))
    assert len(units) >= 3
    needed = batch_bytes(path) if file_format == "arrow" else chunk_bytes(path)
    slack = FOOTER_GUESS if file_format == "parquet" else 2 * SCHEMA_READ
    texts = []
    for unit in units:
        reader = make_reader(file_format, "web", root, storage=storage_for(root, server.settings()))  # a fresh loader
        bytes_read.clear()
        texts += [d.text for d in reader.read(unit) if isinstance(d, Document)]
        groups = range(unit.start // ROWS, -(-unit.stop // ROWS))
        assert unit.start % ROWS == 0 and unit.stop % ROWS == 0, unit  # units start and end at a group
        own = sum(needed[g] for g in groups)
        assert own <= sum(bytes_read) <= own + slack, (unit.unit_id, own, bytes_read)
    assert texts == data.column("text").to_pylist()


def chunk_bytes(path: Path) -> list[int]:
    """Each row group's ``text`` column chunk, as stored."""
    meta = pq.ParquetFile(path).metadata
    return [meta.row_group(g).column(0).total_compressed_size for g in range(meta.num_row_groups)]


def batch_bytes(path: Path) -> list[int]:
    """Each record batch's message (metadata and body), as stored."""
    with pa.memory_map(str(path)) as source:
        source.seek(8)
        pa.ipc.read_message(source)  # the schema
        sizes = []
        while True:
            start = source.tell()
            try:
                pa.ipc.read_message(source)
            except EOFError:
                return sizes
            sizes.append(source.tell() - start)


@pytest.mark.parametrize("shift", [None, 1, 37])
def test_an_arrow_unit_planned_without_its_batch_offset_is_read_from_the_start(
    server: S3Server, tmp_path: Path, shift: int | None
) -> None:
    """A unit whose ``byte_offset`` is not where a record batch begins (0, or a size estimate, as planned
    before units started at batches) still reads exactly its rows."""
    data, reader, layout = arrow_source(server, tmp_path, seed=3)
    for unit in split_file("web", layout, max_bytes=int(layout.content_bytes / 4)):
        moved = dataclasses.replace(unit, byte_offset=0 if shift is None else unit.byte_offset + shift)
        texts = [d.text for d in reader.read(moved) if isinstance(d, Document)]
        assert texts == data.column("text").to_pylist()[unit.start : unit.stop], unit.unit_id


def test_an_arrow_unit_split_by_a_loader_reads_exactly_its_rows(server: S3Server, tmp_path: Path) -> None:
    """A loader's split (``split_unit``) cuts a unit at its record batches, and each piece reads exactly its rows;
    a piece made to start inside a batch (as no split does) reads from the file's start."""
    data, reader, layout = arrow_source(server, tmp_path, seed=4)
    texts = data.column("text").to_pylist()
    for unit in split_file("web", layout, max_bytes=int(layout.content_bytes / 3)):
        pieces = split_unit(unit, layout, max_bytes=int(layout.content_bytes / 40))
        assert len(pieces) > 1 and all(p.start % ROWS == 0 and p.byte_offset for p in pieces)
        read = [d.text for p in pieces for d in reader.read(p) if isinstance(d, Document)]
        assert read == texts[unit.start : unit.stop], unit.unit_id
        inside = _piece("web", layout, unit.start + 7, unit.stop, 0)
        assert inside.byte_offset == 0
        assert [d.text for d in reader.read(inside) if isinstance(d, Document)] == texts[unit.start + 7 : unit.stop]


def arrow_source(server: S3Server, tmp_path: Path, seed: int) -> tuple[pa.Table, Reader, FileLayout]:
    """An Arrow file of ``table(seed)`` in batches of ``ROWS`` rows in the bucket: the table, a reader of it and
    its layout."""
    folder = tmp_path / "src"
    folder.mkdir()
    data = table(seed)
    write_arrow(folder / "part.arrow", data)
    root = upload(server, folder, tmp_path.name)
    reader = make_reader("arrow", "web", root, storage=storage_for(root, server.settings()))
    (layout,) = reader.layouts()
    return data, reader, layout


def write_arrow(path: Path, data: pa.Table) -> None:
    with pa.ipc.new_file(path, data.schema) as writer:
        for batch in data.to_batches(max_chunksize=ROWS):
            writer.write_batch(batch)
